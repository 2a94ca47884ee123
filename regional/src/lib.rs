//! The regional tier (not built yet). It will receive each edge's WAL as an acknowledged
//! stream resuming from a cursor (`strata_tsdb::wal::WalReader`), keep a short raw
//! retention, evaluate Prometheus recording rules, downsample to 5 m and 1 h aggregates
//! (count, sum, min, max, counter, last), and serve the `strata_store::Store` trait
//! to the global tier. Only the wiring and loops of that tier belong here.
