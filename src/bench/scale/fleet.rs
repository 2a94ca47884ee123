//! The simulated fleet `bench scale` writes: DCGM-like series (dcgm-exporter's fields and
//! ten labels per series) whose values move as DCGM's do: integer gauges that mostly hold
//! still, counters that only grow. Deterministic, so Strata and Prometheus get the same data.

use strata_model::{Labels, MetricType};
use strata_simulator::fields::{Kind, FIELDS};

/// xorshift64*: values need to look like DCGM's, not to be good randomness.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

pub struct SimFleet {
    pub counter: Vec<bool>,
    pub values: Vec<f64>,
    rng: Rng,
}

impl SimFleet {
    /// A fleet of `series` series; their labels are made on demand ([`labels`](Self::labels)),
    /// so that the bench holds no copy of what the database stores.
    pub fn new(series: usize) -> SimFleet {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let counter: Vec<bool> = (0..series).map(|i| FIELDS[i % FIELDS.len()].kind == Kind::Counter).collect();
        let values = (0..series).map(|_| (rng.next() % 60) as f64 + 20.0).collect();
        SimFleet { counter, values, rng }
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// The labels of series `i`: field `i % 25` of GPU `i / 25`, eight GPUs a node.
    pub fn labels(i: usize) -> Labels {
        let (gpu, f) = (i / FIELDS.len(), &FIELDS[i % FIELDS.len()]);
        let (node, dev) = (gpu / 8, gpu % 8);
        let uuid = Rng((gpu as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1).next() as u32;
        Labels::from_pairs([
            ("__name__", f.name.to_string()),
            ("gpu", dev.to_string()),
            ("UUID", format!("GPU-{uuid:08x}-{:04x}-{dev:04x}", node % 65536)),
            ("device", format!("nvidia{dev}")),
            ("modelName", "NVIDIA H100 80GB HBM3".to_string()),
            ("Hostname", format!("gpu-node-{node:05}")),
            ("DCGM_FI_DRIVER_VERSION", "550.54.15".to_string()),
            ("cluster", format!("c{}", node / 2000)),
            ("instance", format!("10.{}.{}.{}:9400", node / 65536, (node / 256) % 256, node % 256)),
            ("job", "dcgm".to_string()),
        ])
    }

    /// Moves every series one scrape on.
    pub fn step(&mut self) {
        for (v, &c) in self.values.iter_mut().zip(&self.counter) {
            let r = self.rng.next();
            *v = if c {
                *v + (r % 400) as f64
            } else if r.is_multiple_of(4) {
                (*v + ((r >> 8) % 5) as f64 - 2.0).clamp(0.0, 100.0)
            } else {
                *v
            };
        }
    }

    /// (family, type, help) of every field.
    pub fn metadata() -> impl Iterator<Item = (&'static str, MetricType, &'static str)> {
        FIELDS.iter().map(|f| {
            let t = if f.kind == Kind::Counter { MetricType::Counter } else { MetricType::Gauge };
            (f.name, t, f.help)
        })
    }
}
