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

/// Which of a [`WindowColumns`]' fields it holds besides the ends and counts: a cache
/// keeps those the queries read (an `avg_over_time` reads 20 of a window's 160 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fields {
    pub first: bool,
    pub last: bool,
    pub penult: bool,
    pub stale: bool,
    pub sum: bool,
    pub min: bool,
    pub max: bool,
    pub nan: bool,
    pub m2n: bool,
    pub changes: bool,
    pub resets: bool,
    pub correction: bool,
    pub least_squares: bool,
    pub extreme_times: bool,
}

impl Fields {
    pub const ALL: Fields = Fields {
        first: true,
        last: true,
        penult: true,
        stale: true,
        sum: true,
        min: true,
        max: true,
        nan: true,
        m2n: true,
        changes: true,
        resets: true,
        correction: true,
        least_squares: true,
        extreme_times: true,
    };
}

/// Windows kept field by field: about the bytes of the windows themselves, or less when
/// only some fields are held ([`Fields`]). A field not held reads as a window without it
/// (NaN, zero, none): the caller holds what its leaf reads.
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
    min_t: Box<[i64]>,
    max_t: Box<[i64]>,
}

/// Field `f` of window `i`, or `none` when the field is not held.
#[inline]
fn at<T: Copy>(column: &[T], i: usize, none: T) -> T {
    column.get(i).copied().unwrap_or(none)
}

impl WindowColumns {
    pub fn new(w: &[Window]) -> Self {
        Self::with_fields(w, Fields::ALL)
    }

    /// The ends, counts and `fields` of `w`.
    pub fn with_fields(w: &[Window], fields: Fields) -> Self {
        fn column<T>(w: &[Window], held: bool, f: impl Fn(&Window) -> T) -> Box<[T]> {
            match held {
                true => w.iter().map(f).collect(),
                false => Box::default(),
            }
        }
        let f = fields;
        WindowColumns {
            end: column(w, true, |x| x.end),
            count: column(w, true, |x| x.count),
            first: column(w, f.first, |x| x.first),
            last: column(w, f.last, |x| x.last),
            penult: column(w, f.penult, |x| x.penult),
            stale: column(w, f.stale, |x| x.stale),
            sum: column(w, f.sum, |x| x.sum),
            min: column(w, f.min, |x| x.min),
            max: column(w, f.max, |x| x.max),
            nan: column(w, f.nan, |x| x.nan),
            m2n: column(w, f.m2n, |x| x.m2n),
            changes: column(w, f.changes, |x| x.changes),
            resets: column(w, f.resets, |x| x.resets),
            correction: column(w, f.correction, |x| x.correction),
            sx: column(w, f.least_squares, |x| x.sx),
            sxx: column(w, f.least_squares, |x| x.sxx),
            sxy: column(w, f.least_squares, |x| x.sxy),
            min_t: column(w, f.extreme_times, |x| x.min_t),
            max_t: column(w, f.extreme_times, |x| x.max_t),
        }
    }

    /// The fields every part holds, their windows in `parts`' order: a series' windows
    /// from several blocks in a row, copied field by field (no window is built).
    pub fn concat(parts: &[(&WindowColumns, Range<usize>)]) -> WindowColumns {
        fn column<T: Copy>(parts: &[(&WindowColumns, Range<usize>)], f: impl Fn(&WindowColumns) -> &[T]) -> Box<[T]> {
            if !parts.iter().all(|(c, _)| f(c).len() == c.end.len()) {
                return Box::default();
            }
            let mut out = Vec::with_capacity(parts.iter().map(|(_, r)| r.len()).sum());
            for (c, r) in parts {
                out.extend_from_slice(&f(c)[r.clone()]);
            }
            out.into_boxed_slice()
        }
        WindowColumns {
            end: column(parts, |c| &c.end),
            count: column(parts, |c| &c.count),
            first: column(parts, |c| &c.first),
            last: column(parts, |c| &c.last),
            penult: column(parts, |c| &c.penult),
            stale: column(parts, |c| &c.stale),
            sum: column(parts, |c| &c.sum),
            min: column(parts, |c| &c.min),
            max: column(parts, |c| &c.max),
            nan: column(parts, |c| &c.nan),
            m2n: column(parts, |c| &c.m2n),
            changes: column(parts, |c| &c.changes),
            resets: column(parts, |c| &c.resets),
            correction: column(parts, |c| &c.correction),
            sx: column(parts, |c| &c.sx),
            sxx: column(parts, |c| &c.sxx),
            sxy: column(parts, |c| &c.sxy),
            min_t: column(parts, |c| &c.min_t),
            max_t: column(parts, |c| &c.max_t),
        }
    }

    /// Window `i` whole (the fields not held as a window without them).
    pub fn window(&self, i: usize) -> Window {
        let nothing = Sample { t: self.end[i], v: f64::NAN };
        Window {
            end: self.end[i],
            count: self.count[i],
            first: at(&self.first, i, nothing),
            last: at(&self.last, i, nothing),
            penult: at(&self.penult, i, None),
            stale: at(&self.stale, i, None),
            sum: at(&self.sum, i, f64::NAN),
            min: at(&self.min, i, f64::NAN),
            max: at(&self.max, i, f64::NAN),
            min_t: at(&self.min_t, i, self.end[i]),
            max_t: at(&self.max_t, i, self.end[i]),
            nan: at(&self.nan, i, false),
            m2n: at(&self.m2n, i, f64::NAN),
            changes: at(&self.changes, i, 0),
            resets: at(&self.resets, i, 0),
            correction: at(&self.correction, i, f64::NAN),
            sx: at(&self.sx, i, f64::NAN),
            sxx: at(&self.sxx, i, f64::NAN),
            sxy: at(&self.sxy, i, f64::NAN),
        }
    }

    /// The windows' ends, in order (a search by time touches these alone).
    pub fn ends(&self) -> &[i64] {
        &self.end
    }

    /// The bytes it holds, for a cache's budget: its columns, itself, and what each
    /// column held costs the allocator (a series with a window or two in a block is
    /// mostly that).
    pub fn bytes(&self) -> usize {
        fn size<T>(c: &[T]) -> usize {
            match c.len() {
                0 => 0,
                _ => std::mem::size_of_val(c) + 32,
            }
        }
        let columns = size(&self.end)
            + size(&self.count)
            + size(&self.first)
            + size(&self.last)
            + size(&self.penult)
            + size(&self.stale)
            + size(&self.sum)
            + size(&self.min)
            + size(&self.max)
            + size(&self.nan)
            + size(&self.m2n)
            + size(&self.changes)
            + size(&self.resets)
            + size(&self.correction)
            + size(&self.sx)
            + size(&self.sxx)
            + size(&self.sxy)
            + size(&self.min_t)
            + size(&self.max_t);
        columns.saturating_add(std::mem::size_of::<WindowColumns>())
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
        at(&self.sum, i, f64::NAN)
    }
    #[inline]
    fn min(&self, i: usize) -> f64 {
        at(&self.min, i, f64::NAN)
    }
    #[inline]
    fn max(&self, i: usize) -> f64 {
        at(&self.max, i, f64::NAN)
    }
    #[inline]
    fn first(&self, i: usize) -> Sample {
        at(&self.first, i, Sample { t: self.end[i], v: f64::NAN })
    }
    #[inline]
    fn last(&self, i: usize) -> Sample {
        at(&self.last, i, Sample { t: self.end[i], v: f64::NAN })
    }
    #[inline]
    fn correction(&self, i: usize) -> f64 {
        at(&self.correction, i, f64::NAN)
    }
    #[inline]
    fn changes(&self, i: usize) -> u32 {
        at(&self.changes, i, 0)
    }
    #[inline]
    fn resets(&self, i: usize) -> u32 {
        at(&self.resets, i, 0)
    }
    #[inline]
    fn newest(&self, i: usize) -> (i64, bool) {
        // As `Window::newest`, from the two fields it reads.
        let last = self.last(i).t;
        match at(&self.stale, i, None) {
            Some(t) if self.count[i] == 0 || t > last => (t, true),
            _ => (last, false),
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
