use crate::merge::merge_blocks;
use crate::{BlockError, BlockReader, BlockWriter};
use std::path::Path;
use strata_chunk::{Chunk, ChunkAppender};
use strata_model::matcher::{MatchOp, Matcher};
use strata_model::{Labels, Metadata, MetricType, Sample};

fn chunk(samples: impl IntoIterator<Item = (i64, f64)>) -> Chunk {
    let mut a = ChunkAppender::new();
    for (t, v) in samples {
        a.append(t, v);
    }
    a.seal().compact()
}

fn labels(gpu: usize, name: &str) -> Labels {
    Labels::from_pairs([("__name__", name.to_string()), ("gpu", gpu.to_string()), ("node", "n0".to_string())])
}

/// A block over `[lo, hi)` with `util` and `temp` for 4 GPUs, a sample every 15 s.
fn write(parent: &Path, lo: i64, hi: i64) -> crate::BlockMeta {
    let mut w = BlockWriter::create(parent, lo, hi, 1, vec![]).unwrap();
    let mut all: Vec<Labels> = (0..4).flat_map(|g| [labels(g, "util"), labels(g, "temp")]).collect();
    all.sort();
    for l in &all {
        let g: f64 = l.get("gpu").unwrap().parse().unwrap();
        let c = chunk((lo..hi).step_by(15_000).map(|t| (t, g * 10.0 + (t / 15_000 % 7) as f64)));
        w.add_series(l, &[c]).unwrap();
    }
    w.set_metadata(vec![(
        "util".into(),
        Metadata { metric_type: MetricType::Gauge, help: "h".into(), unit: "".into() },
    )]);
    w.finish().unwrap()
}

fn all_samples(r: &BlockReader, matchers: &[Matcher]) -> Vec<(Labels, Vec<Sample>)> {
    r.select::<BlockError>(matchers, i64::MIN, i64::MAX, |_| Ok(()))
        .unwrap()
        .into_iter()
        .map(|s| (s.labels, s.chunks.iter().flat_map(|c| c.decode().unwrap()).collect()))
        .collect()
}

#[test]
fn a_block_reads_back_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let meta = write(dir.path(), 0, 7_200_000);
    assert_eq!(meta.stats.series, 8);
    assert_eq!(meta.stats.samples, 8 * 480);
    let r = BlockReader::open(&dir.path().join(&meta.id)).unwrap();
    assert_eq!(r.meta(), &meta);
    let util = Matcher::eq("__name__", "util");
    let got = all_samples(&r, std::slice::from_ref(&util));
    assert_eq!(got.len(), 4);
    assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "sorted by labels");
    assert_eq!(got[2].1.len(), 480);
    assert_eq!(got[2].1[3], Sample::new(45_000, 23.0));
    // Matchers that accept the empty value subtract; regexes union.
    let not_gpu0 = Matcher::new(MatchOp::NotEqual, "gpu", "0").unwrap();
    assert_eq!(all_samples(&r, &[util.clone(), not_gpu0]).len(), 3);
    let re = Matcher::new(MatchOp::Regex, "gpu", "1|3").unwrap();
    assert_eq!(all_samples(&r, &[re]).len(), 4);
    assert_eq!(all_samples(&r, &[Matcher::eq("gpu", "9")]).len(), 0);
    assert_eq!(r.label_names(), ["__name__", "gpu", "node"]);
    assert_eq!(r.label_values("gpu"), ["0", "1", "2", "3"]);
    assert_eq!(r.metadata()[0].1.metric_type, MetricType::Gauge);
    // A range outside the block's data selects nothing.
    assert!(r.select::<BlockError>(&[util], 8_000_000, 9_000_000, |_| Ok(())).unwrap().is_empty());
}

#[test]
fn the_writer_refuses_disorder_and_samples_outside_its_range() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = BlockWriter::create(dir.path(), 0, 1000, 1, vec![]).unwrap();
    w.add_series(&labels(1, "a"), &[chunk([(0, 1.0)])]).unwrap();
    assert!(w.add_series(&labels(0, "a"), &[chunk([(0, 1.0)])]).is_err());
    assert!(w.add_series(&labels(2, "a"), &[chunk([(1000, 1.0)])]).is_err());
    w.abort();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "an aborted block leaves nothing");
}

#[test]
fn damage_is_reported_by_block_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let meta = write(dir.path(), 0, 7_200_000);
    let block = dir.path().join(&meta.id);
    // A flipped byte in the chunks: found when read, and the block is then marked damaged.
    let path = block.join("chunks");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[100] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let r = BlockReader::open(&block).unwrap();
    let err = r.select::<BlockError>(&[Matcher::eq("node", "n0")], 0, i64::MAX, |_| Ok(())).unwrap_err();
    assert!(matches!(&err, BlockError::Corrupt { block, .. } if *block == meta.id), "{err}");
    assert!(r.is_damaged());
    // A damaged index or meta: refused at open, naming the block.
    let path = block.join("index");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[20] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let err = BlockReader::open(&block).err().unwrap();
    assert!(err.to_string().contains(&meta.id), "{err}");
    std::fs::write(block.join("meta.json"), b"{").unwrap();
    assert!(BlockReader::open(&block).is_err());
    // Truncated files and random bytes never panic.
    for n in [0usize, 8, 64, 200] {
        let meta = write(dir.path(), 0, 7_200_000);
        let b = dir.path().join(&meta.id);
        let idx = std::fs::read(b.join("index")).unwrap();
        std::fs::write(b.join("index"), &idx[..n.min(idx.len())]).unwrap();
        assert!(BlockReader::open(&b).is_err());
    }
}

#[test]
fn merging_blocks_keeps_every_sample_once_and_joins_part_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(dir.path(), 0, 7_200_000);
    let b = write(dir.path(), 7_200_000, 14_400_000);
    let (ra, rb) =
        (BlockReader::open(&dir.path().join(&a.id)).unwrap(), BlockReader::open(&dir.path().join(&b.id)).unwrap());
    let mut w = BlockWriter::create(dir.path(), 0, 14_400_000, 2, vec![a.id.clone(), b.id.clone()]).unwrap();
    assert_eq!(merge_blocks(&[&ra, &rb], &mut w).unwrap().series, 8);
    let m = w.finish().unwrap();
    assert_eq!(m.stats.samples, a.stats.samples + b.stats.samples);
    assert_eq!(m.stats.chunks, 8, "two 480-sample chunks per series became one");
    // Full chunks are kept as they are; part-filled ones are re-flowed into full ones.
    let full = chunk((0..960).map(|i| (i * 1000, 1.0)));
    let part = chunk((960..1440).map(|i| (i * 1000, 2.0)));
    let flowed = crate::merge::rechunk(&labels(0, "a"), vec![full.clone(), part.clone(), full.clone()]).unwrap();
    assert_eq!(flowed.len(), 3, "2400 samples need three chunks either way");
    let parts =
        vec![part.clone(), chunk((1440..1920).map(|i| (i * 1000, 3.0))), chunk((1920..2400).map(|i| (i * 1000, 4.0)))];
    let flowed = crate::merge::rechunk(&labels(0, "a"), parts.clone()).unwrap();
    assert_eq!(flowed.iter().map(|c| c.n).collect::<Vec<_>>(), [960, 480]);
    let before: Vec<Sample> = parts.iter().flat_map(|c| c.decode().unwrap()).collect();
    let after: Vec<Sample> = flowed.iter().flat_map(|c| c.decode().unwrap()).collect();
    assert_eq!(before, after);
    assert_eq!(m.sources, [a.id.clone(), b.id.clone()]);
    let merged = BlockReader::open(&dir.path().join(&m.id)).unwrap();
    let all = Matcher::new(MatchOp::Regex, "__name__", ".+").unwrap();
    let want: Vec<_> = all_samples(&ra, std::slice::from_ref(&all))
        .into_iter()
        .zip(all_samples(&rb, std::slice::from_ref(&all)))
        .map(|((l, mut x), (_, y))| {
            x.extend(y);
            (l, x)
        })
        .collect();
    assert_eq!(all_samples(&merged, &[all]), want);
}

/// Blocks of format version 1 (the index stored as it is) still read, alike.
#[test]
fn a_version_1_block_with_its_index_stored_whole_reads_alike() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let meta = write(dir.path(), 0, 7_200_000);
    let block = dir.path().join(&meta.id);
    let all = Matcher::new(MatchOp::Regex, "__name__", ".+").unwrap();
    let want = all_samples(&BlockReader::open(&block).unwrap(), std::slice::from_ref(&all));
    let stored = std::fs::read(block.join("index")).unwrap();
    let mut raw = Vec::new();
    flate2::read::DeflateDecoder::new(&stored[..]).read_to_end(&mut raw).unwrap();
    assert!(stored.len() < raw.len(), "the index is deflated: {} bytes of {}", stored.len(), raw.len());
    std::fs::write(block.join("index"), &raw).unwrap();
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(block.join("meta.json")).unwrap()).unwrap();
    m["version"] = 1.into();
    for f in m["files"].as_array_mut().unwrap() {
        if f["name"] == "index" {
            f["bytes"] = raw.len().into();
            f["crc32"] = crc32fast::hash(&raw).into();
            f.as_object_mut().unwrap().remove("raw_bytes");
        }
    }
    std::fs::write(block.join("meta.json"), serde_json::to_vec(&m).unwrap()).unwrap();
    assert_eq!(all_samples(&BlockReader::open(&block).unwrap(), &[all]), want);
}
