//! What an exposition page or a remote-write request says about a metric family.

/// Metric type, as in the exposition formats' `# TYPE` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
    GaugeHistogram,
    Summary,
    Info,
    StateSet,
    #[default]
    Unknown,
}

impl MetricType {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "counter" => MetricType::Counter,
            "gauge" => MetricType::Gauge,
            "histogram" => MetricType::Histogram,
            "gaugehistogram" => MetricType::GaugeHistogram,
            "summary" => MetricType::Summary,
            "info" => MetricType::Info,
            "stateset" => MetricType::StateSet,
            "unknown" | "untyped" => MetricType::Unknown,
            _ => return None,
        })
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
            MetricType::GaugeHistogram => "gaugehistogram",
            MetricType::Summary => "summary",
            MetricType::Info => "info",
            MetricType::StateSet => "stateset",
            MetricType::Unknown => "unknown",
        }
    }

    pub fn to_u8(self) -> u8 {
        self as u8
    }

    pub fn from_u8(b: u8) -> Self {
        match b {
            0 => MetricType::Counter,
            1 => MetricType::Gauge,
            2 => MetricType::Histogram,
            3 => MetricType::GaugeHistogram,
            4 => MetricType::Summary,
            5 => MetricType::Info,
            6 => MetricType::StateSet,
            _ => MetricType::Unknown,
        }
    }
}

/// What a scrape page or a remote-write request said about a metric family.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct Metadata {
    #[serde(rename = "type")]
    pub metric_type: MetricType,
    pub help: String,
    pub unit: String,
}
