//! The global tier (not built yet): a querier that fans out over the stores of edges,
//! regionals and the archive, deduplicates HA replicas by their external labels, plans
//! resolutions and answers PromQL; an archiver that writes Parquet blocks to object storage;
//! and an archive reader that serves them back as one more `strata_store::Store`.
//! Only the wiring and loops of that tier belong here.
