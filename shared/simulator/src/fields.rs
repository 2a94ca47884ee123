//! The fields of dcgm-exporter's `dcp-metrics-included.csv`, built in so the simulator
//! runs anywhere. `DCGM_FI_DRIVER_VERSION` is an attribute label there, not a metric.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
}

pub struct Field {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

macro_rules! f {
    ($n:literal, gauge, $h:literal) => {
        Field { name: $n, kind: Kind::Gauge, help: $h }
    };
    ($n:literal, counter, $h:literal) => {
        Field { name: $n, kind: Kind::Counter, help: $h }
    };
}

pub const FIELDS: &[Field] = &[
    f!("DCGM_FI_DEV_SM_CLOCK", gauge, "SM clock frequency (in MHz)."),
    f!("DCGM_FI_DEV_MEM_CLOCK", gauge, "Memory clock frequency (in MHz)."),
    f!("DCGM_FI_DEV_MEMORY_TEMP", gauge, "Memory temperature (in C)."),
    f!("DCGM_FI_DEV_GPU_TEMP", gauge, "GPU temperature (in C)."),
    f!("DCGM_FI_DEV_POWER_USAGE", gauge, "Power draw (in W)."),
    f!("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", counter, "Total energy consumption since boot (in mJ)."),
    f!("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", counter, "Total number of PCIe retries."),
    f!("DCGM_FI_DEV_GPU_UTIL", gauge, "GPU utilization (in %)."),
    f!("DCGM_FI_DEV_MEM_COPY_UTIL", gauge, "Memory utilization (in %)."),
    f!("DCGM_FI_DEV_ENC_UTIL", gauge, "Encoder utilization (in %)."),
    f!("DCGM_FI_DEV_DEC_UTIL", gauge, "Decoder utilization (in %)."),
    f!("DCGM_FI_DEV_XID_ERRORS", gauge, "Value of the last XID error encountered."),
    f!("DCGM_FI_DEV_FB_FREE", gauge, "Framebuffer memory free (in MiB)."),
    f!("DCGM_FI_DEV_FB_USED", gauge, "Framebuffer memory used (in MiB)."),
    f!("DCGM_FI_DEV_FB_RESERVED", gauge, "Framebuffer memory reserved (in MiB)."),
    f!("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", counter, "Total number of NVLink bandwidth counters for all lanes."),
    f!("DCGM_FI_DEV_VGPU_LICENSE_STATUS", gauge, "vGPU License status"),
    f!("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", counter, "Number of remapped rows for uncorrectable errors"),
    f!("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", counter, "Number of remapped rows for correctable errors"),
    f!("DCGM_FI_DEV_ROW_REMAP_FAILURE", gauge, "Whether remapping of rows has failed"),
    f!("DCGM_FI_PROF_GR_ENGINE_ACTIVE", gauge, "Ratio of time the graphics engine is active."),
    f!("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gauge, "Ratio of cycles the tensor (HMMA) pipe is active."),
    f!("DCGM_FI_PROF_DRAM_ACTIVE", gauge, "Ratio of cycles the device memory interface is active sending or receiving data."),
    f!(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        gauge,
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second."
    ),
    f!(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        gauge,
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second."
    ),
];

pub const DRIVER_VERSION: &str = "550.54.15";
/// What DCGM prints for a field the device does not support.
pub const UNSUPPORTED: &str = "9223372036854775794";
