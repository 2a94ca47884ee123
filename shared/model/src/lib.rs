//! Strata's data model, shared by every crate: label sets, samples and the staleness
//! marker, metric metadata, label matchers, durations and timestamps as Prometheus writes
//! them, and values as its API prints them.
//!
//! This crate sits at the bottom of the dependency graph and stays light (no async runtime,
//! no I/O): everything a codec, a store or a parser needs to agree on lives here once, so
//! two crates never hold their own copy of a rule such as "what is a valid label name".

pub mod arith;
pub mod duration;
pub mod labels;
pub mod matcher;
pub mod metadata;
pub mod parallel;
pub mod sample;
pub mod size;
pub mod time;
pub mod value;

pub use labels::{is_valid_label_name, Fnv64, Label, Labels, LabelsBuilder, METRIC_NAME};
pub use matcher::{MatchOp, Matcher};
pub use metadata::{Metadata, MetricType};
pub use sample::{is_stale, stale_nan, Sample, STALE_NAN_BITS};
