//! Byte sizes as Prometheus writes them in flags and files (`512MB`, `20GB`).

use serde::Deserialize;

/// A byte size as Prometheus writes it: `10MB`, `512KB`, `1GB`, `0` (base 1024).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ByteSize(pub u64);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ByteSizeError {
    #[error("invalid size {0:?}")]
    Invalid(String),
    #[error("invalid size unit {unit:?} in {size:?}")]
    Unit { unit: String, size: String },
    #[error("size {0:?} out of range")]
    OutOfRange(String),
}

pub fn parse_bytes(s: &str) -> Result<u64, ByteSizeError> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n: u64 = s[..split].parse().map_err(|_| ByteSizeError::Invalid(s.to_string()))?;
    let mult: u64 = match s[split..].trim() {
        "" | "B" => 1,
        "KB" | "KiB" => 1 << 10,
        "MB" | "MiB" => 1 << 20,
        "GB" | "GiB" => 1 << 30,
        "TB" | "TiB" => 1 << 40,
        other => return Err(ByteSizeError::Unit { unit: other.to_string(), size: s.to_string() }),
    };
    n.checked_mul(mult).ok_or_else(|| ByteSizeError::OutOfRange(s.to_string()))
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => parse_bytes(&s).map(ByteSize).map_err(serde::de::Error::custom),
        }
    }
}
