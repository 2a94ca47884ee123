//! [`FrameBuilder`]: series into `Series` frames, each bounded in series and bytes and
//! carrying the symbol table its series' labels point into.

use crate::convert::{aggregate_chunk_to_pb, chunk_to_pb, metric_type_to_pb, SymbolTable};
use crate::{pb, FRAME_BYTES, FRAME_SERIES};
use strata_model::Labels;
use strata_store::{AggregateSeries, SeriesChunks};

#[derive(Default)]
pub struct FrameBuilder {
    series: Vec<pb::Series>,
    /// Chunk bytes and label references so far (the symbols are counted apart).
    bytes: usize,
    symbols: SymbolTable,
}

impl FrameBuilder {
    /// Adds a series (`data` is `None` for labels only). Returns the frame so far when
    /// this series would not fit in it; the series then starts the next frame.
    pub fn push(&mut self, labels: &Labels, data: Option<&SeriesChunks>, unit: String) -> Option<pb::SeriesResponse> {
        let size = data.map_or(0, |d| d.chunks.iter().map(|c| c.data.len() + 32).sum::<usize>()) + labels.len() * 4;
        let done = self.room_for(size);
        let label_refs = self.symbols.refs(labels);
        self.series.push(match data {
            None => pb::Series { label_refs, ..Default::default() },
            Some(d) => pb::Series {
                label_refs,
                r#type: metric_type_to_pb(d.metric_type) as i32,
                unit,
                chunks: d.chunks.iter().map(chunk_to_pb).collect(),
                labels: vec![],
            },
        });
        self.bytes += size;
        done
    }

    /// Adds a series' windows (`labels`: as the stream carries them), as [`push`](Self::push).
    pub fn push_aggregates(
        &mut self,
        labels: &Labels,
        a: &AggregateSeries,
        unit: String,
    ) -> Option<pb::SeriesResponse> {
        let size = a.chunks.iter().map(|c| c.data.len() + 32).sum::<usize>() + labels.len() * 4;
        let done = self.room_for(size);
        let label_refs = self.symbols.refs(labels);
        self.series.push(pb::Series {
            label_refs,
            r#type: metric_type_to_pb(a.metric_type) as i32,
            unit,
            chunks: a.chunks.iter().map(|c| aggregate_chunk_to_pb(c, a.resolution)).collect(),
            labels: vec![],
        });
        self.bytes += size;
        done
    }

    /// The frame so far when a series of `size` bytes would not fit in it.
    fn room_for(&mut self, size: usize) -> Option<pb::SeriesResponse> {
        let full = !self.series.is_empty()
            && (self.series.len() >= FRAME_SERIES || self.bytes + self.symbols.bytes() + size > FRAME_BYTES);
        if full {
            self.finish()
        } else {
            None
        }
    }

    /// The frame so far, if it holds any series; the builder starts afresh.
    pub fn finish(&mut self) -> Option<pb::SeriesResponse> {
        if self.series.is_empty() {
            return None;
        }
        self.bytes = 0;
        Some(pb::SeriesResponse {
            series: std::mem::take(&mut self.series),
            warnings: vec![],
            symbols: self.symbols.take(),
        })
    }
}
