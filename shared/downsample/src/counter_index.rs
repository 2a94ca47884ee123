//! [`CounterIndex`]: a counter's windows indexed so that `rate` and `increase` over a run
//! of many of them cost about as much as over one.
//!
//! A `[1h]` range at a 5 m step combines twelve windows per step, and consecutive steps
//! share eleven of them. What a run's increase needs is its sample count (a difference of
//! running totals), its first and last samples, and its reset corrections, which are
//! nonzero only where the counter was reset: those are kept as a short list of events.
//! Adding a zero to a compensated sum changes neither of its terms (its running sum never
//! becomes −0), so summing the events alone gives the sum over every window bit for bit.

use crate::columns::WindowRun;
use crate::range::RangeFn;
use std::ops::Range;
use strata_model::arith::{extrapolate, KahanSum};

/// Running sample counts and the reset events of one series' windows.
#[derive(Debug, Default)]
pub struct CounterIndex {
    /// The samples in the windows before each index (one more entry than windows).
    before: Vec<u64>,
    /// The non-empty windows that add to a run's corrections after its first: a drop at
    /// their start, or a reset inside them; in window order.
    events: Vec<Event>,
}

#[derive(Debug, Clone, Copy)]
struct Event {
    window: usize,
    /// The previous non-empty window's last value, when this window starts below it.
    drop: Option<f64>,
    /// The window's own reset correction.
    correction: f64,
}

impl CounterIndex {
    pub fn new<W: WindowRun + ?Sized>(windows: &W) -> Self {
        let n = windows.len();
        let mut before = Vec::with_capacity(n.saturating_add(1));
        let mut events = Vec::new();
        let (mut total, mut last) = (0u64, None::<f64>);
        before.push(0);
        for w in 0..n {
            let count = windows.count(w);
            total = total.saturating_add(u64::from(count));
            before.push(total);
            if count == 0 {
                continue;
            }
            // The comparison `counter_increase` makes between neighbours (false for NaN).
            let drop = last.filter(|&l| windows.first(w).v < l);
            let correction = windows.correction(w);
            if drop.is_some() || correction != 0.0 {
                events.push(Event { window: w, drop, correction });
            }
            last = Some(windows.last(w).v);
        }
        CounterIndex { before, events }
    }

    /// `rate` or `increase` over the windows `inside` (of the windows indexed), for the
    /// range `(lo, e]`: `None` with fewer than two samples.
    pub fn increase<W: WindowRun + ?Sized>(
        &self,
        windows: &W,
        inside: Range<usize>,
        function: RangeFn,
        (lo, e): (i64, i64),
    ) -> Option<f64> {
        let count = self.before.get(inside.end)?.checked_sub(*self.before.get(inside.start)?)?;
        if count < 2 {
            return None;
        }
        let first = inside.clone().find(|&w| windows.count(w) > 0)?;
        let last = inside.clone().rev().find(|&w| windows.count(w) > 0)?;
        let mut corrections = KahanSum::default();
        corrections.add(windows.correction(first));
        let from = self.events.partition_point(|ev| ev.window <= first);
        for ev in self.events[from..].iter().take_while(|ev| ev.window <= last) {
            if let Some(drop) = ev.drop {
                corrections.add(drop);
            }
            corrections.add(ev.correction);
        }
        let (first, last) = (windows.first(first), windows.last(last));
        let increase = last.v - first.v + corrections.value();
        Some(extrapolate(first, last, count, increase, (lo, e), true, function == RangeFn::Rate))
    }
}
