//! [`WindowRun`]: what evaluating a leaf reads of a series' windows, one field at a time,
//! and [`WindowColumns`], the windows kept field by field.
//!
//! A step of `avg_over_time(x[5m])` reads three fields of one window: its end, count and
//! sum. A [`Window`] is 160 bytes, so a day of a fleet's 5 m windows at step 5 m (2,304
//! series × 288 windows) moves 106 MB through the memory bus for 14 MB of fields it uses,
//! and the machine's bandwidth sets the query's time. A cache that keeps windows for many
//! queries keeps them as columns instead, in about the same bytes: the fast paths read only
//! their fields, and the functions that combine most fields (`stddev_over_time`, `deriv`,
//! …) rebuild the windows they read.

use crate::window::Window;
use std::borrow::Cow;
use std::ops::Range;
use strata_model::Sample;

/// A series' windows in time order, read by index.
pub trait WindowRun {
    fn len(&self) -> usize;
    fn end(&self, i: usize) -> i64;
    fn count(&self, i: usize) -> u32;
    fn sum(&self, i: usize) -> f64;
    fn min(&self, i: usize) -> f64;
    fn max(&self, i: usize) -> f64;
    fn first(&self, i: usize) -> Sample;
    fn last(&self, i: usize) -> Sample;
    fn correction(&self, i: usize) -> f64;
    fn changes(&self, i: usize) -> u32;
    fn resets(&self, i: usize) -> u32;
    /// [`Window::newest`].
    fn newest(&self, i: usize) -> (i64, bool);
    /// The windows of `range` whole (built from columns: for the functions that read
    /// most fields, which are slower anyway).
    fn whole(&self, range: Range<usize>) -> Cow<'_, [Window]>;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl WindowRun for [Window] {
    #[inline]
    fn len(&self) -> usize {
        <[Window]>::len(self)
    }
    #[inline]
    fn end(&self, i: usize) -> i64 {
        self[i].end
    }
    #[inline]
    fn count(&self, i: usize) -> u32 {
        self[i].count
    }
    #[inline]
    fn sum(&self, i: usize) -> f64 {
        self[i].sum
    }
    #[inline]
    fn min(&self, i: usize) -> f64 {
        self[i].min
    }
    #[inline]
    fn max(&self, i: usize) -> f64 {
        self[i].max
    }
    #[inline]
    fn first(&self, i: usize) -> Sample {
        self[i].first
    }
    #[inline]
    fn last(&self, i: usize) -> Sample {
        self[i].last
    }
    #[inline]
    fn correction(&self, i: usize) -> f64 {
        self[i].correction
    }
    #[inline]
    fn changes(&self, i: usize) -> u32 {
        self[i].changes
    }
    #[inline]
    fn resets(&self, i: usize) -> u32 {
        self[i].resets
    }
    #[inline]
    fn newest(&self, i: usize) -> (i64, bool) {
        self[i].newest()
    }
    #[inline]
    fn whole(&self, range: Range<usize>) -> Cow<'_, [Window]> {
        Cow::Borrowed(&self[range])
    }
}

/// Windows kept field by field: about the bytes of the windows themselves.
#[derive(Debug, Default)]
pub struct WindowColumns {
    end: Box<[i64]>,
    count: Box<[u32]>,
    first: Box<[Sample]>,
    last: Box<[Sample]>,
    penult: Box<[Option<Sample>]>,
    stale: Box<[Option<i64>]>,
    sum: Box<[f64]>,
    min: Box<[f64]>,
    max: Box<[f64]>,
    nan: Box<[bool]>,
    m2n: Box<[f64]>,
    changes: Box<[u32]>,
    resets: Box<[u32]>,
    correction: Box<[f64]>,
    sx: Box<[f64]>,
    sxx: Box<[f64]>,
    sxy: Box<[f64]>,
}

impl WindowColumns {
    pub fn new(w: &[Window]) -> Self {
        fn column<T>(w: &[Window], f: impl Fn(&Window) -> T) -> Box<[T]> {
            w.iter().map(f).collect()
        }
        WindowColumns {
            end: column(w, |x| x.end),
            count: column(w, |x| x.count),
            first: column(w, |x| x.first),
            last: column(w, |x| x.last),
            penult: column(w, |x| x.penult),
            stale: column(w, |x| x.stale),
            sum: column(w, |x| x.sum),
            min: column(w, |x| x.min),
            max: column(w, |x| x.max),
            nan: column(w, |x| x.nan),
            m2n: column(w, |x| x.m2n),
            changes: column(w, |x| x.changes),
            resets: column(w, |x| x.resets),
            correction: column(w, |x| x.correction),
            sx: column(w, |x| x.sx),
            sxx: column(w, |x| x.sxx),
            sxy: column(w, |x| x.sxy),
        }
    }

    /// Window `i` whole.
    pub fn window(&self, i: usize) -> Window {
        Window {
            end: self.end[i],
            count: self.count[i],
            first: self.first[i],
            last: self.last[i],
            penult: self.penult[i],
            stale: self.stale[i],
            sum: self.sum[i],
            min: self.min[i],
            max: self.max[i],
            nan: self.nan[i],
            m2n: self.m2n[i],
            changes: self.changes[i],
            resets: self.resets[i],
            correction: self.correction[i],
            sx: self.sx[i],
            sxx: self.sxx[i],
            sxy: self.sxy[i],
        }
    }

    /// The windows' ends, in order (a search by time touches these alone).
    pub fn ends(&self) -> &[i64] {
        &self.end
    }

    /// The bytes it holds, for a cache's budget: its columns, itself, and what each of
    /// its 17 allocations costs the allocator (a series with a window or two in a block
    /// is mostly that).
    pub fn bytes(&self) -> usize {
        const PER_WINDOW: usize = 8 * 9
            + 4 * 3
            + 1
            + 2 * std::mem::size_of::<Sample>()
            + std::mem::size_of::<Option<Sample>>()
            + std::mem::size_of::<Option<i64>>();
        const FIXED: usize = std::mem::size_of::<WindowColumns>() + 17 * 32;
        self.end.len().saturating_mul(PER_WINDOW).saturating_add(FIXED)
    }
}

impl WindowRun for WindowColumns {
    #[inline]
    fn len(&self) -> usize {
        self.end.len()
    }
    #[inline]
    fn end(&self, i: usize) -> i64 {
        self.end[i]
    }
    #[inline]
    fn count(&self, i: usize) -> u32 {
        self.count[i]
    }
    #[inline]
    fn sum(&self, i: usize) -> f64 {
        self.sum[i]
    }
    #[inline]
    fn min(&self, i: usize) -> f64 {
        self.min[i]
    }
    #[inline]
    fn max(&self, i: usize) -> f64 {
        self.max[i]
    }
    #[inline]
    fn first(&self, i: usize) -> Sample {
        self.first[i]
    }
    #[inline]
    fn last(&self, i: usize) -> Sample {
        self.last[i]
    }
    #[inline]
    fn correction(&self, i: usize) -> f64 {
        self.correction[i]
    }
    #[inline]
    fn changes(&self, i: usize) -> u32 {
        self.changes[i]
    }
    #[inline]
    fn resets(&self, i: usize) -> u32 {
        self.resets[i]
    }
    #[inline]
    fn newest(&self, i: usize) -> (i64, bool) {
        // As `Window::newest`, from the two fields it reads.
        match self.stale[i] {
            Some(t) if self.count[i] == 0 || t > self.last[i].t => (t, true),
            _ => (self.last[i].t, false),
        }
    }
    #[inline]
    fn whole(&self, range: Range<usize>) -> Cow<'_, [Window]> {
        Cow::Owned(range.map(|i| self.window(i)).collect())
    }
}

/// A run of another's windows: `range` of them, indexed from its start.
pub struct Part<'a, W: WindowRun + ?Sized> {
    pub of: &'a W,
    pub range: Range<usize>,
}

impl<W: WindowRun + ?Sized> WindowRun for Part<'_, W> {
    #[inline]
    fn len(&self) -> usize {
        self.range.len()
    }
    #[inline]
    fn end(&self, i: usize) -> i64 {
        self.of.end(self.range.start + i)
    }
    #[inline]
    fn count(&self, i: usize) -> u32 {
        self.of.count(self.range.start + i)
    }
    #[inline]
    fn sum(&self, i: usize) -> f64 {
        self.of.sum(self.range.start + i)
    }
    #[inline]
    fn min(&self, i: usize) -> f64 {
        self.of.min(self.range.start + i)
    }
    #[inline]
    fn max(&self, i: usize) -> f64 {
        self.of.max(self.range.start + i)
    }
    #[inline]
    fn first(&self, i: usize) -> Sample {
        self.of.first(self.range.start + i)
    }
    #[inline]
    fn last(&self, i: usize) -> Sample {
        self.of.last(self.range.start + i)
    }
    #[inline]
    fn correction(&self, i: usize) -> f64 {
        self.of.correction(self.range.start + i)
    }
    #[inline]
    fn changes(&self, i: usize) -> u32 {
        self.of.changes(self.range.start + i)
    }
    #[inline]
    fn resets(&self, i: usize) -> u32 {
        self.of.resets(self.range.start + i)
    }
    #[inline]
    fn newest(&self, i: usize) -> (i64, bool) {
        self.of.newest(self.range.start + i)
    }
    #[inline]
    fn whole(&self, range: Range<usize>) -> Cow<'_, [Window]> {
        self.of.whole(self.range.start + range.start..self.range.start + range.end)
    }
}
