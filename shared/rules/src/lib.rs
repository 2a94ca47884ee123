//! Prometheus' recording and alerting rules, over any `Store`.
//!
//! A rule file loads into groups ([`file`]) validated as Prometheus validates them, every
//! error naming the file, line and rule. A group evaluates its rules in order at one
//! timestamp ([`group`]) with the PromQL engine over whatever store it is given (the
//! regional's deduplicated view, or a global's fan-out): recording rules yield samples
//! under their new names, alerting rules move their alerts through pending, firing and
//! resolved ([`alert`]) and expand their label and annotation templates ([`template`]).
//! What a group yields (samples, staleness markers, `ALERTS` and `ALERTS_FOR_STATE`) is
//! handed back to the caller to store, so the same evaluation serves a regional's loop and
//! `strata test rules` ([`unittest`]), which runs Prometheus' rule unit-test files.
//! A regional serves its rules and alerts over gRPC (`remote`, feature `grpc`) and a global
//! merges those of every regional ([`merge`]). How a tier starts, stores and reloads its
//! rules is `tier` (feature `tsdb`), shared by the regional and a global that runs rules.

pub mod alert;
pub mod api;
pub mod file;
pub mod group;
#[cfg(test)]
mod group_tests;
pub mod manager;
pub mod merge;
pub mod metrics;
pub mod notifier;
#[cfg(feature = "grpc")]
pub mod remote;
pub mod restore;
pub mod template;
#[cfg(feature = "tsdb")]
pub mod tier;
pub mod unittest;

use strata_model::Labels;

/// `l` with the external labels it lacks (a label it has wins), as Prometheus adds its
/// external labels to what leaves it: alerts, and here also what rules store.
pub fn with_external(l: &Labels, external: &Labels) -> Labels {
    if external.is_empty() {
        return l.clone();
    }
    let mut b = l.to_builder();
    for x in external.iter() {
        if b.get(&x.name).is_none() {
            b.set_shared(x.name.clone(), x.value.clone());
        }
    }
    b.build()
}
