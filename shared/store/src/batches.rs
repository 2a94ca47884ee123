//! [`SeriesBatches`]: a selection read a batch at a time, so that a store that passes
//! series on (the fan-out, the dedup, the StoreAPI server of a stacked global) holds a few
//! batches, never the whole answer.
//!
//! Batches come in the selection's order: by labels, or, when the request names
//! [`SelectRequest::order_without`] labels, by the labels without those (ties by all
//! labels). The dedup asks for the order without its replica labels, so that the replicas
//! of a series arrive one after the other and each group is merged as soon as it is whole.

use crate::{SelectBudget, SelectRequest, SeriesChunks, StoreError};
use async_trait::async_trait;
use std::cmp::Ordering;
use strata_model::Labels;

/// A selection in batches, each in order and after the one before.
#[async_trait]
pub trait SeriesBatches: Send {
    /// The next batch (never empty); `None` at the end. After an error the stream is
    /// done.
    async fn next_batch(&mut self) -> Result<Option<Vec<SeriesChunks>>, StoreError>;
}

pub type BoxBatches = Box<dyn SeriesBatches>;

/// A selection that was gathered whole: one batch.
pub struct OneBatch(Option<Vec<SeriesChunks>>);

impl OneBatch {
    /// `series` as one batch, put in `req`'s order.
    pub fn new(mut series: Vec<SeriesChunks>, req: &SelectRequest) -> Self {
        if !req.order_without.is_empty() {
            series.sort_by(|a, b| selection_order(&a.labels, &b.labels, &req.order_without));
        }
        OneBatch(Some(series).filter(|s| !s.is_empty()))
    }
}

#[async_trait]
impl SeriesBatches for OneBatch {
    async fn next_batch(&mut self) -> Result<Option<Vec<SeriesChunks>>, StoreError> {
        Ok(self.0.take())
    }
}

/// The order of a selection that leaves out `without`: the labels without them, then all
/// labels. With `without` empty, the labels' own order.
pub fn selection_order(a: &Labels, b: &Labels, without: &[String]) -> Ordering {
    if without.is_empty() {
        return a.cmp(b);
    }
    let kept = |l: &&strata_model::Label| !without.iter().any(|w| w.as_str() == l.name.as_ref());
    a.iter().filter(kept).cmp(b.iter().filter(kept)).then_with(|| a.cmp(b))
}

/// Every batch, one after the other, as one list.
pub async fn collect_batches(mut batches: BoxBatches) -> Result<Vec<SeriesChunks>, StoreError> {
    let mut out = Vec::new();
    while let Some(b) = batches.next_batch().await? {
        out.extend(b);
    }
    Ok(out)
}

/// Every batch as one list, each series charged to `budget` as it arrives: how a store
/// that streams answers [`Store::select_within`](crate::Store::select_within).
pub async fn collect_within(
    mut batches: BoxBatches,
    budget: &mut SelectBudget,
) -> Result<Vec<SeriesChunks>, StoreError> {
    let mut out = Vec::new();
    while let Some(b) = batches.next_batch().await? {
        for s in &b {
            budget.charge_series(&s.chunks)?;
        }
        out.extend(b);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_without_replica_labels_puts_replicas_side_by_side() {
        let l = |pairs: &[(&str, &str)]| Labels::from_pairs(pairs.iter().copied());
        let mut v = [
            l(&[("__name__", "x"), ("replica", "a"), ("zone", "1")]),
            l(&[("__name__", "x"), ("replica", "a"), ("zone", "2")]),
            l(&[("__name__", "x"), ("replica", "b"), ("zone", "1")]),
            l(&[("__name__", "x"), ("replica", "b"), ("zone", "2")]),
        ];
        let without = vec!["replica".to_string()];
        v.sort_by(|a, b| selection_order(a, b, &without));
        let order: Vec<_> = v.iter().map(|x| (x.get("zone").unwrap(), x.get("replica").unwrap())).collect();
        assert_eq!(order, [("1", "a"), ("1", "b"), ("2", "a"), ("2", "b")]);
        // Without names left out, the labels' own order.
        v.sort_by(|a, b| selection_order(a, b, &[]));
        assert_eq!(v[1].get("zone"), Some("2"));
    }
}
