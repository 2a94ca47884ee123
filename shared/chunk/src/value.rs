//! Value prediction shared by the encoder and the decoder: FLAC's fixed predictors over
//! scaled decimals, with Gorilla's XOR as the fallback.

use crate::rice::{zigzag, Mean};
use crate::scale::{MAX_EXACT, MAX_SCALE};

/// Prediction orders of the decimal path: previous value, linear, quadratic extrapolation
/// (FLAC's fixed predictors 1–3). The order with the smallest running residual is used.
pub(crate) const ORDERS: usize = 3;

/// State shared by the encoder and the decoder: both derive it from the values they see,
/// so the decoder replays exactly the encoder's choices.
#[derive(Debug, Clone, Default)]
pub(crate) struct ValueState {
    pub(crate) prev_bits: u64,
    /// Last scaled values, newest first; `hist_len` of them are valid.
    pub(crate) hist: [i64; ORDERS],
    pub(crate) means: [Mean; ORDERS],
    pub(crate) seen: [u8; ORDERS],
    pub(crate) scale: u32,
    pub(crate) hist_len: u8,
    pub(crate) leading: u8,
    pub(crate) trailing: u8,
    pub(crate) xor_window_set: bool,
}

impl ValueState {
    /// The predictions of every order (those at or above `hist_len` are meaningless).
    #[inline(always)]
    pub(crate) fn predictions(&self) -> [i64; ORDERS] {
        let h = &self.hist;
        [
            h[0],
            h[0].wrapping_mul(2).wrapping_sub(h[1]),
            h[0].wrapping_mul(3).wrapping_sub(h[1].wrapping_mul(3)).wrapping_add(h[2]),
        ]
    }

    #[inline(always)]
    pub(crate) fn prediction(&self, order: usize) -> i64 {
        self.predictions()[order.min(ORDERS - 1)]
    }

    /// The order to use next: the available one with the smallest running residual (the
    /// lowest order on a tie).
    #[inline(always)]
    pub(crate) fn best_order(&self) -> usize {
        let avail = (self.hist_len as usize).min(ORDERS);
        let mut best = 0;
        for o in 1..ORDERS {
            if o < avail && self.means[o].0 < self.means[best].0 {
                best = o;
            }
        }
        best
    }

    /// Moves the decimal path to a finer scale, multiplying the history exactly. False
    /// (and nothing changed) when the history would no longer be exact.
    pub(crate) fn rescale(&mut self, to: u32) -> bool {
        if to <= self.scale || to > MAX_SCALE {
            return false;
        }
        let f = 10i64.pow(to - self.scale);
        let mut hist = self.hist;
        for h in hist.iter_mut().take(self.hist_len as usize) {
            match h.checked_mul(f) {
                Some(x) if (x as f64).abs() < MAX_EXACT => *h = x,
                _ => return false,
            }
        }
        self.hist = hist;
        for m in &mut self.means {
            m.0 = m.0.saturating_mul(f as u64).min(u64::MAX >> 8);
        }
        self.scale = to;
        true
    }

    #[inline(always)]
    pub(crate) fn after(&mut self, v: f64, scaled: Option<i64>) {
        match scaled {
            Some(s) => {
                let p = self.predictions();
                #[allow(clippy::needless_range_loop)]
                for o in 0..(self.hist_len as usize).min(ORDERS) {
                    let z = zigzag(s.wrapping_sub(p[o]));
                    self.means[o].update(z, &mut self.seen[o]);
                }
                self.hist = [s, self.hist[0], self.hist[1]];
                self.hist_len = (self.hist_len + 1).min(ORDERS as u8);
            }
            None => self.hist_len = 0,
        }
        self.prev_bits = v.to_bits();
    }
}
