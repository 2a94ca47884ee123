//! The fan-out's selection as a stream: each store's batches come through a channel of
//! two, and a k-way merge hands on series in the request's order, equal series merged,
//! so the fan-out holds a few batches per store, never every store's whole answer.

use crate::{classify, Failure, StoreTarget};
use async_trait::async_trait;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_chunk::merge::merge_sources_within;
use strata_model::MetricType;
use strata_store::{selection_order, QueryScope, SelectBudget, SelectRequest, SeriesBatches, SeriesChunks, StoreError};
use tokio::sync::mpsc;

/// Series per merged batch.
const BATCH_SERIES: usize = 1024;

/// What a store's reader task sends.
enum Message {
    Batch(Vec<SeriesChunks>),
    Failed(Failure),
}

/// One store's side of the merge.
struct Source {
    name: String,
    /// What its `Info` said, to tell whether a replica covers its failure.
    target: StoreTarget,
    failed: bool,
    rx: mpsc::Receiver<Message>,
    head: VecDeque<SeriesChunks>,
    done: bool,
}

pub struct MergedBatches {
    sources: Vec<Source>,
    order_without: Vec<String>,
    budget: SelectBudget,
    scope: QueryScope,
    /// The stores that refused the request as invalid, and whether any series came.
    refused: Vec<StoreError>,
    delivered: bool,
    replica_labels: Arc<Vec<String>>,
    /// Stores that failed earlier in the request, not asked again.
    earlier: Vec<StoreTarget>,
    /// The request's range.
    start: i64,
    end: i64,
}

impl MergedBatches {
    /// Starts a reader per store, in the request's scope (each store gets `timeout` of its
    /// own time for its whole answer).
    pub fn start(
        targets: &[&StoreTarget],
        earlier: Vec<StoreTarget>,
        req: &SelectRequest,
        timeout: Duration,
        replica_labels: Arc<Vec<String>>,
    ) -> Self {
        let scope = QueryScope::current();
        let sources = targets
            .iter()
            .map(|t| {
                let (tx, rx) = mpsc::channel(2);
                tokio::spawn(scope.clone().run(read_store(t.store.clone(), req.clone(), timeout, tx)));
                Source {
                    name: t.name.clone(),
                    target: StoreTarget::clone(t),
                    failed: false,
                    rx,
                    head: VecDeque::new(),
                    done: false,
                }
            })
            .collect();
        MergedBatches {
            sources,
            order_without: req.order_without.clone(),
            budget: SelectBudget::new(req.limits, req.start, req.end),
            scope,
            refused: Vec::new(),
            delivered: false,
            replica_labels,
            earlier,
            start: req.start,
            end: req.end,
        }
    }

    /// Makes sure every store still sending has a series waiting, settling failures:
    /// warnings under partial response, else one error naming every store that failed.
    async fn fill(&mut self) -> Result<(), StoreError> {
        let mut failed = Vec::new();
        for i in 0..self.sources.len() {
            while !self.sources[i].done && self.sources[i].head.is_empty() {
                let failure = match self.sources[i].rx.recv().await {
                    Some(Message::Batch(b)) => {
                        self.sources[i].head.extend(b);
                        continue;
                    }
                    None => {
                        self.sources[i].done = true;
                        continue;
                    }
                    Some(Message::Failed(f)) => f,
                };
                self.sources[i].done = true;
                self.sources[i].failed = true;
                match failure {
                    Failure::Request(e) => return Err(e),
                    Failure::Store(reason) => failed.push((i, reason)),
                    Failure::Refused(reason, e) => {
                        failed.push((i, reason));
                        self.refused.push(e);
                    }
                }
            }
        }
        if !self.delivered && !self.refused.is_empty() && self.refused.len() == self.sources.len() {
            // Every store refused it: the request is what is wrong.
            return Err(self.refused.swap_remove(0));
        }
        let named = |(i, reason): &(usize, String)| format!("store {}: {reason}", self.sources[*i].name);
        if !self.scope.partial_response && (!failed.is_empty() || !self.earlier.is_empty()) {
            // A store that failed is forgiven while a replica of it is still answering;
            // should that one fail too, its own failure finds no cover and fails the request.
            let alive: Vec<&StoreTarget> = self.sources.iter().filter(|s| !s.failed).map(|s| &s.target).collect();
            let now = failed.iter().map(|(i, r)| (&self.sources[*i].target, r.as_str()));
            let all = now.chain(self.earlier.iter().map(|t| (t, crate::replicas::FAILED_EARLIER)));
            let named = crate::replicas::uncovered(all, &alive, &self.replica_labels, self.scope.dedup, self.start);
            if !named.is_empty() {
                return Err(StoreError::Unavailable(format!("{} (partial_response=false)", named.join("; "))));
            }
        }
        for f in &failed {
            tracing::debug!(warning = %named(f), "partial response");
            self.scope.warn(named(f));
            self.scope.store_failed(&self.sources[f.0].name);
        }
        Ok(())
    }

    /// The store whose waiting series comes first.
    fn first(&self) -> Option<usize> {
        let mut best: Option<usize> = None;
        for (i, s) in self.sources.iter().enumerate() {
            let Some(h) = s.head.front() else { continue };
            let better = match best.and_then(|b| self.sources[b].head.front()) {
                None => true,
                Some(b) => selection_order(&h.labels, &b.labels, &self.order_without).is_lt(),
            };
            if better {
                best = Some(i);
            }
        }
        best
    }
}

#[async_trait]
impl SeriesBatches for MergedBatches {
    async fn next_batch(&mut self) -> Result<Option<Vec<SeriesChunks>>, StoreError> {
        let mut out: Vec<SeriesChunks> = Vec::new();
        while out.len() < BATCH_SERIES {
            self.fill().await?;
            let Some(i) = self.first() else { break };
            let Some(mut s) = self.sources[i].head.pop_front() else { break };
            // The same series from other stores (globals stacked over shared stores).
            for j in 0..self.sources.len() {
                while j != i && self.sources[j].head.front().is_some_and(|x| x.labels == s.labels) {
                    let Some(other) = self.sources[j].head.pop_front() else { break };
                    let sources = vec![std::mem::take(&mut s.chunks), other.chunks];
                    let merged = merge_sources_within(sources, self.start, self.end)
                        .map_err(|e| StoreError::Corrupt { series: s.labels.to_string(), reason: e.to_string() })?;
                    if merged.conflicts > 0 {
                        self.scope.warn(format!(
                            "series {}: stores {} and {} hold different values at {} timestamps; {}'s are used",
                            s.labels,
                            self.sources[i].name,
                            self.sources[j].name,
                            merged.conflicts,
                            self.sources[i].name
                        ));
                    }
                    s.chunks = merged.chunks;
                    if s.metric_type == MetricType::Unknown {
                        s.metric_type = other.metric_type;
                    }
                    if self.sources[j].head.is_empty() {
                        self.fill().await?;
                    }
                }
            }
            self.budget.charge_series(&s.chunks)?;
            self.delivered = true;
            out.push(s);
        }
        Ok(if out.is_empty() { None } else { Some(out) })
    }
}

/// Reads one store's batches into `tx` until the end, a failure or the timeout. The timeout
/// is the store's own time: waiting for the merge to take a batch (a slow consumer) does
/// not count against it.
async fn read_store(
    store: Arc<dyn strata_store::Store>,
    req: SelectRequest,
    timeout: Duration,
    tx: mpsc::Sender<Message>,
) {
    let mut left = timeout;
    let failure = 'read: {
        let started = Instant::now();
        let opened = tokio::time::timeout(left, store.select_batches(&req)).await;
        left = left.saturating_sub(started.elapsed());
        let mut batches = match opened {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => break 'read classify(e, &req.limits),
            Err(_) => break 'read Failure::Store(format!("no answer within {timeout:?}")),
        };
        loop {
            let started = Instant::now();
            let next = tokio::time::timeout(left, batches.next_batch()).await;
            left = left.saturating_sub(started.elapsed());
            match next {
                Ok(Ok(Some(b))) => {
                    if tx.send(Message::Batch(b)).await.is_err() {
                        return; // the merge was dropped
                    }
                }
                Ok(Ok(None)) => return,
                Ok(Err(e)) => break 'read classify(e, &req.limits),
                Err(_) => break 'read Failure::Store(format!("no answer within {timeout:?}")),
            }
        }
    };
    let _ = tx.send(Message::Failed(failure)).await;
}
