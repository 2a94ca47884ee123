//! [`QueryScope`]: what one API request asks of the stores below it beyond the trait's
//! arguments (partial response, replica dedup) and the warnings they send back up (a store
//! that failed under partial response, a limit that cut an answer).
//!
//! It travels as a task-local value rather than through every `Store` method, so that the
//! engine and the stores that ignore it stay as they are: the HTTP API runs a request
//! inside [`QueryScope::run`], the engine awaits its selections in that same task, and a
//! wrapper such as the fan-out reads [`QueryScope::current`] before it spawns its calls.
//! Outside any scope (tests, benchmarks) the defaults apply: partial response and dedup
//! on, warnings dropped.
//!
//! A scope also remembers the stores that failed during the request, so that a fan-out
//! asks a store that timed out only once per request, however many selections follow
//! (each selector of a binary expression is a selection of its own).

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};

/// Warnings one request keeps at most, and the longest kept whole: the stores below are
/// peers, and a hostile one must not grow a request's memory with messages.
pub const MAX_WARNINGS: usize = 100;
pub const MAX_WARNING_BYTES: usize = 4096;

/// The warnings of a request: each once, in order, bounded.
#[derive(Debug, Default)]
struct Warnings {
    list: Vec<String>,
    seen: HashSet<String>,
    omitted: usize,
}

tokio::task_local! {
    static SCOPE: QueryScope;
}

#[derive(Debug, Clone)]
pub struct QueryScope {
    /// A failing store becomes a warning (`true`, the default, as Thanos) or fails the
    /// request (`partial_response=false`).
    pub partial_response: bool,
    /// HA replicas are merged into one series (`dedup=false` shows each).
    pub dedup: bool,
    /// Thanos' `max_source_resolution`: the coarsest aggregates (window width, ms) a
    /// leaf may be answered from; `None` (`auto`): any that is exact; `Some(0)`: raw only.
    pub max_source_resolution: Option<i64>,
    warnings: Arc<Mutex<Warnings>>,
    infos: Arc<Mutex<Warnings>>,
    /// What resolution answered which steps of which leaf (`stats`).
    resolutions: Arc<Mutex<Vec<ResolutionUsed>>>,
    failed_stores: Arc<Mutex<Vec<String>>>,
}

/// One slice of a leaf's grid and the resolution that answered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolutionUsed {
    /// The leaf, as PromQL (`avg_over_time(x[5m])`).
    pub leaf: String,
    /// Window width, ms; 0: raw samples.
    pub resolution: i64,
    /// The first and last step answered so (ms).
    pub start: i64,
    pub end: i64,
}

impl Default for QueryScope {
    fn default() -> Self {
        QueryScope::new(true, true)
    }
}

impl QueryScope {
    /// A scope with these options and no warnings yet.
    pub fn new(partial_response: bool, dedup: bool) -> Self {
        QueryScope {
            partial_response,
            dedup,
            max_source_resolution: None,
            warnings: Arc::default(),
            infos: Arc::default(),
            resolutions: Arc::default(),
            failed_stores: Arc::default(),
        }
    }

    /// Runs `f` with this scope as the current one.
    pub async fn run<F: Future>(self, f: F) -> F::Output {
        SCOPE.scope(self, f).await
    }

    /// The scope of the running request, or the defaults outside one.
    pub fn current() -> QueryScope {
        SCOPE.try_with(|s| s.clone()).unwrap_or_default()
    }

    /// Adds a warning for the response (see [`add_bounded`]).
    pub fn warn(&self, message: impl Into<String>) {
        add_bounded(&self.warnings, message.into());
    }

    /// Adds an info annotation (bounded as warnings are): an answer that is complete but
    /// not quite what was asked (aggregates where no finer data was left).
    pub fn info(&self, message: impl Into<String>) {
        add_bounded(&self.infos, message.into());
    }

    pub fn infos(&self) -> Vec<String> {
        self.infos.lock().map(|w| w.list.clone()).unwrap_or_default()
    }

    /// Records which resolution answered a slice of a leaf (at most a thousand kept).
    pub fn used_resolution(&self, r: ResolutionUsed) {
        if let Ok(mut v) = self.resolutions.lock() {
            if v.len() < 1000 && !v.contains(&r) {
                v.push(r);
            }
        }
    }

    pub fn resolutions(&self) -> Vec<ResolutionUsed> {
        self.resolutions.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

/// Adds a message to a bounded list: repeats kept once, past [`MAX_WARNINGS`] counted, a
/// message cut at [`MAX_WARNING_BYTES`].
fn add_bounded(list: &Mutex<Warnings>, mut message: String) {
    {
        if message.len() > MAX_WARNING_BYTES {
            let mut cut = MAX_WARNING_BYTES;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push_str(" [cut]");
        }
        if let Ok(mut w) = list.lock() {
            if w.seen.contains(&message) {
                return;
            }
            if w.list.len() >= MAX_WARNINGS {
                w.omitted += 1;
                return;
            }
            w.seen.insert(message.clone());
            w.list.push(message);
        }
    }
}

impl QueryScope {
    /// The warnings added so far, in order, and how many more were left out.
    pub fn warnings(&self) -> Vec<String> {
        let Ok(w) = self.warnings.lock() else { return Vec::new() };
        let mut out = w.list.clone();
        if w.omitted > 0 {
            out.push(format!("{} more warnings omitted", w.omitted));
        }
        out
    }

    /// Notes that the store named `name` failed (its warning is added separately).
    pub fn store_failed(&self, name: &str) {
        if let Ok(mut f) = self.failed_stores.lock() {
            if !f.iter().any(|x| x == name) {
                f.push(name.to_string());
            }
        }
    }

    /// Whether the store named `name` has failed during this request.
    pub fn has_failed(&self, name: &str) -> bool {
        self.failed_stores.lock().map(|f| f.iter().any(|x| x == name)).unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_scope_is_seen_inside_and_collects_warnings_once() {
        assert!(QueryScope::current().partial_response, "defaults outside a scope");
        let scope = QueryScope::new(false, true);
        scope
            .clone()
            .run(async {
                let s = QueryScope::current();
                assert!(!s.partial_response);
                s.warn("store a: down");
                s.warn("store a: down");
            })
            .await;
        assert_eq!(scope.warnings(), ["store a: down"]);
    }

    #[test]
    fn warnings_are_bounded_in_count_and_size() {
        let scope = QueryScope::default();
        for i in 0..10_000 {
            scope.warn(format!("store {i}: down"));
        }
        scope.warn("x".repeat(100_000));
        let w = scope.warnings();
        assert_eq!(w.len(), MAX_WARNINGS + 1);
        assert_eq!(w.last().map(String::as_str), Some("9901 more warnings omitted"));
        let scope = QueryScope::default();
        scope.warn("é".repeat(10_000));
        assert!(scope.warnings()[0].len() <= MAX_WARNING_BYTES + 8);
    }

    #[tokio::test]
    async fn a_scope_remembers_failed_stores_once_each() {
        let scope = QueryScope::default();
        scope.clone().run(async { QueryScope::current().store_failed("a") }).await;
        scope.store_failed("a");
        assert!(scope.has_failed("a") && !scope.has_failed("b"));
        assert_eq!(scope.failed_stores.lock().unwrap().len(), 1, "each store once");
        assert!(!QueryScope::current().has_failed("a"), "outside any scope nothing is remembered");
    }
}
