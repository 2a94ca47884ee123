//! The archiver and the compactor killed at every write to the bucket: mid-upload (a part
//! of a multipart upload, an object of a block), after a block's data before its meta,
//! mid-compaction (the day block up, its hours not marked) and mid-deletion (some marks
//! or files gone). After a restart on the same bucket the archive is whole: every sample
//! read back bit for bit, every range held by one block of each resolution, no block
//! damaged, and the compactor does not halt.
//!
//! A process killed at a write either got that write in or not: both are tried. The
//! store below counts writes and, from the one it dies at on, fails everything (a dead
//! process reads nothing either).

use crate::archiver::{Archiver, ArchiverOptions, Coverage};
use crate::compactor::{Compactor, CompactorOptions};
use crate::{list_blocks, ArchiveStore, ArchiveStoreOptions, BlockWriter, WriteOptions};
use async_trait::async_trait;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, UploadPart,
};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_model::{Labels, MatchOp, Matcher, Metadata, MetricType, Sample};
use strata_store::memory::MemoryStore;
use strata_store::{SelectRequest, Store};

const T0: i64 = 1_764_547_200_000; // a UTC midnight
const HOUR: i64 = 3_600_000;
const HOURS: i64 = 30;

/// Writes that land until the process dies; `landed`: whether the write it dies at gets
/// in before it does.
#[derive(Debug)]
struct Dies {
    inner: Arc<dyn ObjectStore>,
    left: Arc<AtomicI64>,
    landed: bool,
}

impl std::fmt::Display for Dies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Dies({})", self.inner)
    }
}

fn dead() -> object_store::Error {
    object_store::Error::Generic { store: "dies", source: "the process was killed".into() }
}

impl Dies {
    fn alive(&self) -> object_store::Result<()> {
        match self.left.load(Ordering::SeqCst) >= 0 {
            true => Ok(()),
            false => Err(dead()),
        }
    }

    /// Runs `write` if the process lives through it.
    async fn write<T>(
        &self,
        write: impl std::future::Future<Output = object_store::Result<T>>,
    ) -> object_store::Result<T> {
        self.alive()?;
        if self.left.fetch_sub(1, Ordering::SeqCst) > 0 {
            return write.await;
        }
        if self.landed {
            write.await?;
        }
        Err(dead())
    }
}

#[derive(Debug)]
struct DiesUpload {
    inner: Box<dyn MultipartUpload>,
    left: Arc<AtomicI64>,
    landed: bool,
}

#[async_trait]
impl MultipartUpload for DiesUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let part = self.inner.put_part(data);
        let (left, landed) = (self.left.clone(), self.landed);
        Box::pin(async move {
            if left.load(Ordering::SeqCst) < 0 {
                return Err(dead());
            }
            if left.fetch_sub(1, Ordering::SeqCst) > 0 {
                return part.await;
            }
            if landed {
                part.await?;
            }
            Err(dead())
        })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        if self.left.load(Ordering::SeqCst) < 0 {
            return Err(dead());
        }
        if self.left.fetch_sub(1, Ordering::SeqCst) > 0 {
            return self.inner.complete().await;
        }
        if self.landed {
            self.inner.complete().await?;
        }
        Err(dead())
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.inner.abort().await
    }
}

#[async_trait]
impl ObjectStore for Dies {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.write(self.inner.put_opts(location, payload, opts)).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.alive()?;
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(DiesUpload { inner, left: self.left.clone(), landed: self.landed }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        self.alive()?;
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        // One location at a time, each a write.
        let (inner, left, landed) = (self.inner.clone(), self.left.clone(), self.landed);
        locations
            .then(move |location| {
                let (inner, left) = (inner.clone(), left.clone());
                async move {
                    let location = location?;
                    let me = Dies { inner: inner.clone(), left, landed };
                    let one = futures_util::stream::once(futures_util::future::ready(Ok(location.clone())));
                    me.write(async move {
                        let mut gone = inner.delete_stream(one.boxed());
                        match gone.next().await {
                            Some(r) => r,
                            None => Ok(location),
                        }
                    })
                    .await
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        match self.alive() {
            Ok(()) => self.inner.list(prefix),
            Err(e) => futures_util::stream::once(futures_util::future::ready(Err(e))).boxed(),
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.alive()?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        self.write(self.inner.copy_opts(from, to, options)).await
    }
}

/// Two series every 15 s over 30 hours: five 6-hour ranges, the first day's four compacted.
fn fleet() -> Arc<MemoryStore> {
    let mut m = MemoryStore::default();
    m.set_metadata("gpu_temp", Metadata { metric_type: MetricType::Gauge, ..Default::default() });
    for gpu in ["0", "1"] {
        let labels = Labels::from_pairs([("__name__", "gpu_temp"), ("gpu", gpu)]);
        let samples = (0..HOURS * 240).map(|k| Sample { t: T0 + k * 15_000 + 3, v: (k % 91) as f64 / 4.0 });
        m.add(labels, MetricType::Gauge, samples);
    }
    Arc::new(m)
}

/// A life of the process over `objects`: the archiver's rounds until it is done, a
/// compaction round, and one after the deletion delay. The first error ends it.
async fn life(objects: Arc<dyn ObjectStore>, fleet: &Arc<MemoryStore>, now: i64) -> Result<(), String> {
    let coverage =
        Coverage { min_time: Some(T0), complete_until: T0 + HOURS * HOUR + 1, missing: Vec::new(), behind: None };
    let opts = ArchiverOptions {
        block: Duration::from_secs(6 * 3600),
        settle: Duration::from_secs(600),
        owner: "global-0".into(),
        ..Default::default()
    };
    // Small files go up in parts too: a death mid multipart upload.
    let write = WriteOptions { multipart_over: 4096, ..Default::default() };
    let writer = BlockWriter::new(objects.clone(), write.clone());
    let archiver = Archiver::new(objects.clone(), writer, fleet.clone(), Arc::new(move || coverage.clone()), opts);
    loop {
        let round = archiver.round(now).await.map_err(|e| e.to_string())?;
        if round.written.is_empty() {
            break;
        }
    }
    let opts = CompactorOptions { owner: "global-0".into(), ..Default::default() };
    let delay = i64::try_from(opts.delete_delay.as_millis()).unwrap();
    let compactor = Compactor::new(objects.clone(), BlockWriter::new(objects.clone(), write), opts);
    for at in [now, now + delay + 60_000] {
        let r = compactor.round(at).await.map_err(|e| e.to_string())?;
        if !r.halted.is_empty() {
            return Err(format!("halted: {:?}", r.halted));
        }
    }
    Ok(())
}

async fn everything(objects: &Arc<dyn ObjectStore>) -> Vec<(Labels, Vec<(i64, u64)>)> {
    let opts = ArchiveStoreOptions { refresh: Duration::ZERO, ..Default::default() };
    let store = ArchiveStore::new(objects.clone(), "t", opts);
    let all = Matcher::new(MatchOp::Regex, "__name__", ".+").unwrap();
    let scope = strata_store::QueryScope::new(false, true);
    let got = scope.run(async { store.select(&SelectRequest::new(vec![all], T0, T0 + HOURS * HOUR)).await }).await;
    got.expect("the archive answers whole")
        .iter()
        .map(|s| {
            let pts = s.samples(i64::MIN, i64::MAX).unwrap().iter().map(|p| (p.t, p.v.to_bits())).collect();
            (s.labels.clone(), pts)
        })
        .collect()
}

/// Every range of each resolution held by exactly one block, every block whole.
async fn whole(objects: &Arc<dyn ObjectStore>, case: &str) {
    let blocks = list_blocks(objects.as_ref()).await.unwrap();
    for resolution in [0, 300_000, 3_600_000] {
        let mut ranges: Vec<(i64, i64)> = blocks
            .iter()
            .map(|(d, m)| m.as_ref().unwrap_or_else(|e| panic!("{case}: block {d} damaged: {e}")))
            .filter(|m| m.resolution_ms == resolution)
            .map(|m| (m.min_time, m.max_time))
            .collect();
        ranges.sort();
        assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "{case}: {resolution} ms blocks overlap: {ranges:?}");
        let covered: i64 = ranges.iter().map(|(lo, hi)| hi - lo).sum();
        assert_eq!(covered, HOURS * HOUR, "{case}: {resolution} ms blocks cover {ranges:?}");
    }
    for (dir, _) in &blocks {
        let reader = crate::BlockReader::open(objects.clone(), dir.clone()).await.unwrap();
        reader.verify().await.unwrap_or_else(|e| panic!("{case}: {dir}: {e}"));
    }
}

#[tokio::test]
async fn killed_at_any_write_the_archive_is_whole_after_a_restart() {
    let fleet = fleet();
    let now = T0 + HOURS * HOUR + 11 * 60_000;
    // The writes of a life that is not cut short.
    let dir = tempfile::tempdir().unwrap();
    let local: Arc<dyn ObjectStore> =
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let left = Arc::new(AtomicI64::new(i64::MAX));
    let counting = Arc::new(Dies { inner: local.clone(), left: left.clone(), landed: true });
    life(counting, &fleet, now).await.unwrap();
    let writes = i64::MAX - left.load(Ordering::SeqCst);
    let want = everything(&local).await;
    assert_eq!(want.len(), 2);
    assert_eq!(want.iter().map(|(_, s)| s.len()).sum::<usize>(), 2 * HOURS as usize * 240);
    whole(&local, "uninterrupted").await;
    assert!(writes > 50, "{writes} writes");
    let started = std::time::Instant::now();

    let mut killed = 0;
    for landed in [false, true] {
        for at in 0..writes {
            let dir = tempfile::tempdir().unwrap();
            let local: Arc<dyn ObjectStore> =
                Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
            let dies = Arc::new(Dies { inner: local.clone(), left: Arc::new(AtomicI64::new(at)), landed });
            if life(dies, &fleet, now).await.is_err() {
                killed += 1;
            }
            // The restart: the same global, later (its claims and lease have run out).
            let case = format!("killed at write {at} of {writes} (landed: {landed})");
            let later = now + 2 * HOUR;
            life(local.clone(), &fleet, later).await.unwrap_or_else(|e| panic!("{case}: after the restart: {e}"));
            assert_eq!(everything(&local).await, want, "{case}");
            whole(&local, &case).await;
            let until = crate::archiver::read_progress(local.as_ref()).await.unwrap();
            assert_eq!(until, Some(T0 + HOURS * HOUR), "{case}");
        }
    }
    assert_eq!(killed, 2 * writes, "every cut life failed");
    eprintln!("{writes} writes, each a death twice, in {:.1} s", started.elapsed().as_secs_f64());
}
