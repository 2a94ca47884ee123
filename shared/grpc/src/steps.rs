//! The `Steps` call (pushdown) on the wire: requests, summaries and step values to and
//! from protobuf, each checked on the way in. Values travel as a presence bitmap and the
//! present values, so a sparse answer costs what it holds.

use crate::convert::*;
use crate::pb;
use std::collections::HashSet;
use std::sync::Arc;
use strata_model::Labels;
use strata_store::{AggregateSpec, Coverage, SelectLimits, SeriesSummary, StepValues, StepsRequest, StepsSeries};
use tonic::Status;

/// The most steps a grid may have: Prometheus refuses range queries over 11,000 points
/// per series; this leaves room for instant-vector subgrids and still bounds a request.
pub const MAX_STEPS: usize = 1_000_000;

pub fn request_to_pb(r: &StepsRequest) -> pb::StepsRequest {
    let (function, range) = r.function.clone().unwrap_or_default();
    pb::StepsRequest {
        partial_response_disabled: !strata_store::QueryScope::current().partial_response,
        matchers: r.matchers.iter().map(matcher_to_pb).collect(),
        start: r.start,
        end: r.end,
        step: r.step,
        offset: r.offset,
        lookback: r.lookback,
        function,
        range,
        max_series: r.limits.max_series as u64,
        max_samples: r.limits.max_samples,
        values: r.values,
        has_only: r.only.is_some(),
        only: r.only.as_ref().map(|o| o.iter().copied().collect()).unwrap_or_default(),
        aggregate: r.aggregate.as_ref().map(|a| pb::AggregateSpec {
            op: a.op.clone(),
            has_param: a.param.is_some(),
            param: a.param.unwrap_or_default(),
            without: a.without,
            labels: a.labels.clone(),
            filter_op: a.filter.as_ref().map(|f| f.0.clone()).unwrap_or_default(),
            filter_value: a.filter.as_ref().map_or(0.0, |f| f.1),
        }),
        resolution_ms: r.resolution,
    }
}

/// A request as the server takes it: the grid indexable, the limits within `cap`.
pub fn request_from_pb(r: pb::StepsRequest, cap: SelectLimits) -> Result<StepsRequest, Status> {
    let limit = |asked: u64, max: u64| if asked == 0 { max } else { asked.min(max) };
    let limits = SelectLimits {
        max_series: limit(r.max_series, cap.max_series as u64) as usize,
        max_samples: limit(r.max_samples, cap.max_samples),
    };
    if r.only.len() > limits.max_series {
        return Err(Status::invalid_argument(format!("more than {} series hashes", limits.max_series)));
    }
    let req = StepsRequest {
        matchers: matchers_from_pb(&r.matchers)?,
        start: r.start,
        end: r.end,
        step: r.step,
        offset: r.offset,
        lookback: r.lookback.max(0),
        function: (!r.function.is_empty()).then_some((r.function, r.range)),
        limits,
        values: r.values,
        only: r.has_only.then(|| Arc::new(r.only.into_iter().collect::<HashSet<u64>>())),
        // Checked where it is spelled out (`strata_promql::pushdown`).
        aggregate: r.aggregate.map(|a| AggregateSpec {
            op: a.op,
            param: a.has_param.then_some(a.param),
            without: a.without,
            labels: a.labels,
            filter: (!a.filter_op.is_empty()).then_some((a.filter_op, a.filter_value)),
        }),
        resolution: r.resolution_ms.max(0),
    };
    match req.steps() {
        Some(n) if n <= MAX_STEPS => Ok(req),
        _ => Err(Status::invalid_argument(format!("the grid must have 1 to {MAX_STEPS} steps"))),
    }
}

fn coverage_to_pb(c: &Option<Coverage>) -> Option<pb::Coverage> {
    c.map(|c| pb::Coverage { first: c.first, last: c.last, step: c.step, max_step: c.max_step, stale: c.stale })
}

/// A peer's coverage; one without a positive step says nothing (an older peer's fields, or
/// damage), so no replica is taken for whole on its word.
fn coverage_from_pb(c: Option<pb::Coverage>) -> Option<Coverage> {
    c.filter(|c| c.step > 0 && c.max_step >= 0).map(|c| Coverage {
        first: c.first,
        last: c.last,
        step: c.step,
        max_step: c.max_step,
        stale: c.stale,
    })
}

/// A series for a frame, its labels as references into the frame's `symbols`.
pub fn series_to_pb(s: &StepsSeries, symbols: &mut SymbolTable) -> pb::StepSeries {
    // A series without a value travels without a bitmap.
    let (present, values) = if s.values.is_empty() {
        (Vec::new(), Vec::new())
    } else {
        (s.values.present_bytes(), s.values.values().to_vec())
    };
    let m = &s.summary;
    pb::StepSeries {
        labels: Vec::new(),
        label_refs: symbols.refs(&s.labels),
        r#type: metric_type_to_pb(s.metric_type) as i32,
        summary: Some(pb::SeriesSummary {
            samples: m.samples,
            has_span: m.span.is_some(),
            span_start: m.span.map_or(0, |s| s.0),
            span_end: m.span.map_or(0, |s| s.1),
            by_headers: coverage_to_pb(&m.by_headers),
            by_samples: coverage_to_pb(&m.by_samples),
        }),
        present,
        values,
        name_dropped: s.name_dropped,
    }
}

/// A series as the client takes it: labels valid, `steps` values when values were asked
/// for (and none otherwise), the bitmap and the values agreeing.
pub fn series_from_pb(
    mut s: pb::StepSeries,
    steps: usize,
    values: bool,
    symbols: &FrameSymbols,
    pool: &mut StringPool,
) -> Result<StepsSeries, String> {
    let labels: Labels = if s.label_refs.is_empty() {
        labels_from_pb(std::mem::take(&mut s.labels), pool)?
    } else {
        symbols.labels(&s.label_refs)?
    };
    let m = s.summary.unwrap_or_default();
    let summary = SeriesSummary {
        samples: m.samples,
        span: m.has_span.then_some((m.span_start, m.span_end)),
        by_headers: coverage_from_pb(m.by_headers),
        by_samples: coverage_from_pb(m.by_samples),
    };
    // A series the leaf gives no value has no bitmap.
    let out = if values && !s.present.is_empty() {
        StepValues::from_wire(steps, &s.present, s.values).map_err(|e| format!("series {labels}: {e}"))?
    } else if !s.values.is_empty() {
        return Err(format!("series {labels}: values without steps"));
    } else {
        StepValues::default()
    };
    Ok(StepsSeries {
        labels,
        metric_type: metric_type_from_pb(s.r#type),
        summary,
        values: out,
        name_dropped: s.name_dropped,
    })
}

/// A leaf's answer as `Steps` frames, encoded as they are taken: each frame up to
/// [`FRAME_BYTES`](crate::FRAME_BYTES) of values or [`FRAME_SERIES`](crate::FRAME_SERIES)
/// series; the last carries the totals and annotations.
pub fn frames(answer: strata_store::Steps) -> impl Iterator<Item = pb::StepsResponse> + Send {
    let mut series = answer.series.into_iter().peekable();
    let mut tail = Some((answer.samples, answer.warnings, answer.infos, answer.groups));
    std::iter::from_fn(move || {
        let tail_left = tail.is_some();
        if !tail_left {
            return None;
        }
        let mut frame = pb::StepsResponse::default();
        let mut symbols = SymbolTable::default();
        let mut bytes = 0usize;
        while bytes + symbols.bytes() < crate::FRAME_BYTES && frame.series.len() < crate::FRAME_SERIES {
            let Some(s) = series.next() else { break };
            let p = series_to_pb(&s, &mut symbols);
            bytes += p.values.len() * 8 + p.present.len() + p.label_refs.len() * 2 + 48;
            frame.series.push(p);
        }
        if series.peek().is_none() {
            if let Some((samples, warnings, infos, groups)) = tail.take() {
                frame.samples = samples;
                frame.promql_warnings = warnings;
                frame.promql_infos = infos;
                // An aggregation's groups are few: they go with the totals.
                frame.groups = groups.iter().map(|g| series_to_pb(g, &mut symbols)).collect();
            }
        }
        frame.symbols = symbols.take();
        Some(frame)
    })
}
