//! Request validation and select limits, applied once for every [`Store`](crate::Store):
//! the trait's entry points validate, and implementations charge what they collect to a
//! [`SelectBudget`], so every store refuses the same requests with the same errors and
//! stops collecting at the limit rather than after it.

use crate::{SelectLimits, StoreError};
use strata_chunk::Chunk;
use strata_model::Matcher;

/// As Prometheus: at least one matcher must not match the empty string, or a selection
/// would match every series there is.
pub fn require_matchers(matchers: &[Matcher]) -> Result<(), StoreError> {
    if matchers.iter().all(|m| m.matches("")) {
        return Err(StoreError::InvalidRequest(
            "match[] must contain at least one matcher that does not match the empty string".into(),
        ));
    }
    Ok(())
}

/// What one selection has collected so far, against its limits.
#[derive(Debug, Clone)]
pub struct SelectBudget {
    limits: SelectLimits,
    start: i64,
    end: i64,
    series: usize,
    samples: u64,
}

impl SelectBudget {
    pub fn new(limits: SelectLimits, start: i64, end: i64) -> Self {
        SelectBudget { limits, start, end, series: 0, samples: 0 }
    }

    /// Refuses up front when `candidates` series are already more than the limit allows.
    pub fn check_series_count(&self, candidates: usize) -> Result<(), StoreError> {
        if self.series.saturating_add(candidates) > self.limits.max_series {
            return Err(self.series_exceeded());
        }
        Ok(())
    }

    /// Counts one series without samples.
    pub fn charge_labels(&mut self) -> Result<(), StoreError> {
        self.series += 1;
        if self.series > self.limits.max_series {
            return Err(self.series_exceeded());
        }
        Ok(())
    }

    /// Counts one series and the samples its chunks hold within the selected range.
    pub fn charge_series(&mut self, chunks: &[Chunk]) -> Result<(), StoreError> {
        self.charge_labels()?;
        self.charge_samples(chunks)
    }

    /// Charges only the samples: for more chunks of a series already charged (a store that
    /// reads one series from several places, such as blocks and the head).
    pub fn charge_samples(&mut self, chunks: &[Chunk]) -> Result<(), StoreError> {
        let (start, end) = (self.start, self.end);
        self.samples = chunks.iter().fold(self.samples, |acc, c| acc.saturating_add(c.samples_within(start, end)));
        if self.samples > self.limits.max_samples {
            return Err(StoreError::LimitExceeded { what: "samples", limit: self.limits.max_samples });
        }
        Ok(())
    }

    fn series_exceeded(&self) -> StoreError {
        StoreError::LimitExceeded { what: "series", limit: u64::try_from(self.limits.max_series).unwrap_or(u64::MAX) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_chunk::ChunkAppender;
    use strata_model::MatchOp;

    fn chunk(ts: impl IntoIterator<Item = i64>) -> Chunk {
        let mut a = ChunkAppender::new();
        for t in ts {
            a.append(t, 1.0);
        }
        a.seal()
    }

    #[test]
    fn matchers_that_match_everything_are_refused() {
        let any = Matcher::new(MatchOp::Regex, "job", ".*").unwrap();
        assert!(matches!(require_matchers(std::slice::from_ref(&any)), Err(StoreError::InvalidRequest(_))));
        assert!(require_matchers(&[any, Matcher::eq("job", "x")]).is_ok());
    }

    #[test]
    fn budget_stops_at_the_first_series_or_sample_too_many() {
        let mut b = SelectBudget::new(SelectLimits { max_series: 2, max_samples: 15 }, 0, 100);
        b.charge_series(&[chunk(0..10)]).unwrap();
        assert!(matches!(
            b.charge_series(&[chunk(0..10)]),
            Err(StoreError::LimitExceeded { what: "samples", limit: 15 })
        ));
        let mut b = SelectBudget::new(SelectLimits { max_series: 2, max_samples: 1000 }, 0, 100);
        assert!(b.check_series_count(2).is_ok());
        assert!(b.check_series_count(3).is_err());
        b.charge_labels().unwrap();
        b.charge_labels().unwrap();
        assert!(matches!(b.charge_labels(), Err(StoreError::LimitExceeded { what: "series", limit: 2 })));
    }

    #[test]
    fn only_samples_in_range_are_charged() {
        let mut b = SelectBudget::new(SelectLimits { max_series: 10, max_samples: 5 }, 1000, 2000);
        b.charge_series(&[chunk((0..900).step_by(10))]).unwrap();
        b.charge_series(&[chunk((3000..4000).step_by(10))]).unwrap();
    }
}
