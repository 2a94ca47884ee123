//! Reading a data file by byte ranges, every range checked. Parquet's page checksums are
//! optional and the Rust writer writes none, so the meta records a CRC-32 for each row
//! group's bytes and for the file's tail (page indexes and footer). A reader fetches the
//! tail once, then only the row groups a query needs, each checked before it is decoded:
//! a flipped bit is an error naming the object, never a wrong sample, and no whole file
//! is held in memory.

use crate::meta::Segment;
use bytes::Bytes;
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaDataReader;
use parquet::file::reader::{ChunkReader, Length};

/// The segments of a complete Parquet file: its tail (from the end of the last row group,
/// or of the header, to the end) and each row group's contiguous column chunks.
pub(crate) fn segments_of(file: &Bytes) -> Result<(Segment, Vec<Segment>), ParquetError> {
    let md = ParquetMetaDataReader::new().parse_and_finish(file)?;
    let mut groups = Vec::new();
    let mut end_of_groups = 4u64; // the leading magic
    for g in md.row_groups() {
        let (mut lo, mut hi) = (u64::MAX, 0u64);
        for c in g.columns() {
            let (start, len) = c.byte_range();
            lo = lo.min(start);
            hi = hi.max(start.saturating_add(len));
        }
        if lo > hi {
            return Err(ParquetError::General("a row group without columns".into()));
        }
        groups.push(segment(file, lo, hi)?);
        end_of_groups = end_of_groups.max(hi);
    }
    let tail = segment(file, end_of_groups, file.len() as u64)?;
    Ok((tail, groups))
}

fn segment(file: &Bytes, lo: u64, hi: u64) -> Result<Segment, ParquetError> {
    let bytes = usize::try_from(lo)
        .ok()
        .zip(usize::try_from(hi).ok())
        .and_then(|(lo, hi)| file.get(lo..hi))
        .ok_or_else(|| ParquetError::General(format!("bytes {lo}..{hi} outside the file")))?;
    Ok(Segment { offset: lo, bytes: hi - lo, crc32: crc32fast::hash(bytes) })
}

/// A file of which only some checked ranges are in memory: the tail and the row groups
/// being read. Parquet's reader asks only for those; any other range is an error.
pub(crate) struct SparseFile {
    len: u64,
    parts: Vec<(u64, Bytes)>,
}

impl SparseFile {
    pub(crate) fn new(len: u64) -> Self {
        SparseFile { len, parts: Vec::new() }
    }

    pub(crate) fn with(mut self, offset: u64, bytes: Bytes) -> Self {
        self.parts.push((offset, bytes));
        self
    }

    fn part(&self, start: u64, length: usize) -> Result<Bytes, ParquetError> {
        let end = start.checked_add(length as u64).ok_or_else(|| ParquetError::EOF("range overflows".into()))?;
        for (offset, bytes) in &self.parts {
            if start >= *offset && end <= offset + bytes.len() as u64 {
                let from = (start - offset) as usize;
                return Ok(bytes.slice(from..from + length));
            }
        }
        Err(ParquetError::General(format!("bytes {start}..{end} were not fetched (outside the row groups read)")))
    }
}

impl Length for SparseFile {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for SparseFile {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> Result<Self::T, ParquetError> {
        use bytes::Buf;
        for (offset, bytes) in &self.parts {
            if start >= *offset && start < offset + bytes.len() as u64 {
                return Ok(bytes.slice((start - offset) as usize..).reader());
            }
        }
        Err(ParquetError::General(format!("offset {start} was not fetched")))
    }

    fn get_bytes(&self, start: u64, length: usize) -> Result<Bytes, ParquetError> {
        self.part(start, length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparse_file_serves_only_what_it_holds() {
        let f = SparseFile::new(100).with(10, Bytes::from_static(b"abcdef")).with(90, Bytes::from(vec![7u8; 10]));
        assert_eq!(f.get_bytes(11, 3).unwrap(), Bytes::from_static(b"bcd"));
        assert_eq!(f.get_bytes(90, 10).unwrap().len(), 10);
        assert!(f.get_bytes(14, 4).is_err(), "past a part's end");
        assert!(f.get_bytes(0, 2).is_err());
        assert!(f.get_bytes(u64::MAX, 2).is_err());
        assert!(f.get_read(50).is_err());
        use std::io::Read;
        let mut s = String::new();
        f.get_read(13).unwrap().read_to_string(&mut s).unwrap();
        assert_eq!(s, "def");
    }
}
