//! The CUDA interference probe.
//!
//! A probe *client* is one process with its own CUDA context (the agent binary itself,
//! started as `gpushare-agent --probe-client <JSON spec>`): it runs one [`Workload`] in a
//! loop of steps (launch + synchronize) for a measurement window and prints one
//! [`ClientResult`] as JSON. A probe *run* ([`run::run`], [`run::sweep`]) starts a solo
//! client as the baseline, then N clients together (their windows open at the same
//! wall-clock instant), and compares: per client throughput, p50/p99 step latency and
//! slowdown against solo; per run aggregate scaling, Jain's fairness index and latency
//! inflation (from [`crate::bench::stats`], the one statistics module of bench and probe).
//!
//! CUDA only ever runs in the client processes: a context held by the agent itself would
//! block MIG changes. Without a GPU or a CUDA driver the client fails with a clear error;
//! no figure is ever made up.

pub mod client;
pub mod kernels;
pub mod run;

use serde::{Deserialize, Serialize};

/// What a probe client runs, step after step (the protocol's names):
/// - `launch`: a tiny kernel (a 256x256 fp32 matrix product on 64 blocks) and a
///   synchronize per step: latency-bound, like an inference server answering small
///   requests;
/// - `compute`: fp32 FMA chains over a full grid, steps of about 4 ms at the device's
///   peak: compute-bound;
/// - `memory`: a streaming device-to-device copy of 1 GiB per step: bandwidth-bound.
pub use gpushare_proto::Workload;

/// What one probe client is asked to do (`--probe-client <this, as JSON>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientSpec {
    /// The workload.
    pub workload: Workload,
    /// Length of the measurement window, in seconds.
    pub seconds: f64,
    /// Wall-clock instant (Unix milliseconds) at which the measurement window opens; all
    /// clients of a run get the same one. `None`: once ready (context, kernels, buffers,
    /// warm-up), the client prints the line `ready` on stdout and reads the instant, as a
    /// decimal number of Unix milliseconds, from a line on stdin (how [`run`] starts its
    /// clients together however long their contexts take to create). `Some(0)`: at once.
    #[serde(default)]
    pub start_at_unix_ms: Option<u64>,
    /// CUDA device ordinal (as the client's environment numbers devices).
    #[serde(default)]
    pub device: usize,
}

/// A workload's achieved rate against the device's limit, so a user can tell the probe is
/// sound (a memory workload far below the bandwidth, say, measures something else).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Achieved {
    /// The achieved rate, in `unit`.
    pub value: f64,
    /// The device's limit for this rate, in `unit`.
    pub limit: f64,
    /// `GB/s` (bytes read and written, 10^9) or `TFLOP/s` (fp32, 10^12).
    pub unit: String,
    /// `value / limit`.
    pub fraction_of_limit: f64,
    /// How the limit was derived.
    pub limit_basis: String,
}

/// The device a client ran on, as the driver reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// Device name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Compute capability, e.g. `[9, 0]`.
    pub compute_capability: (i32, i32),
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Peak SM clock, MHz.
    pub sm_clock_mhz: f64,
    /// Peak memory clock, MHz.
    pub memory_clock_mhz: f64,
    /// Memory bus width, bits.
    pub memory_bus_bits: u32,
    /// Memory bandwidth limit: memory clock x bus width x 2 (double data rate), bytes/s.
    pub memory_bandwidth_bytes_per_s: f64,
    /// fp32 peak: SMs x SM clock x fp32 FMA lanes per SM x 2, FLOP/s.
    pub fp32_peak_flops: f64,
    /// fp32 FMA lanes per SM assumed for the architecture.
    pub fp32_lanes_per_sm: u32,
}

/// What one probe client measured (printed as one line of JSON on its stdout).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientResult {
    /// The workload.
    pub workload: Workload,
    /// The client's process id.
    pub pid: u32,
    /// Steps completed in the window.
    pub steps: u64,
    /// Length of the window actually measured (to the end of the last step), seconds.
    pub seconds: f64,
    /// `steps / seconds`.
    pub throughput_per_s: f64,
    /// Median step latency (launch to synchronize returned), ms.
    pub p50_ms: f64,
    /// 99th percentile step latency, ms.
    pub p99_ms: f64,
    /// Mean step latency, ms.
    pub mean_ms: f64,
    /// Achieved bandwidth or FLOP/s over the window, with the device's limit beside it.
    pub achieved: Achieved,
    /// How late the window opened after the requested instant, ms (a large figure means
    /// the clients did not overlap as intended).
    pub late_ms: f64,
    /// Where the kernels came from: `nvrtc` or `ptx` (the shipped fallback, or a file).
    pub kernels: String,
    /// The device.
    pub device: DeviceInfo,
}

/// One client's figures within a run, against the solo baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientStats {
    /// The client's process id.
    pub pid: u32,
    /// Steps per second.
    pub throughput_per_s: f64,
    /// Median step latency, ms.
    pub p50_ms: f64,
    /// 99th percentile step latency, ms.
    pub p99_ms: f64,
    /// Solo throughput over this client's throughput (1.0: unaffected; 4.0: four times
    /// slower).
    pub slowdown: f64,
}

/// A run: N clients started together, against a solo baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// The workload.
    pub workload: Workload,
    /// How many clients ran together.
    pub clients: usize,
    /// The measurement window asked for, seconds.
    pub seconds: f64,
    /// Solo baseline: throughput, steps/s.
    pub solo_throughput_per_s: f64,
    /// Solo baseline: median step latency, ms.
    pub solo_p50_ms: f64,
    /// Solo baseline: p99 step latency, ms.
    pub solo_p99_ms: f64,
    /// Per client, in start order.
    pub per_client: Vec<ClientStats>,
    /// Sum of the clients' throughputs, steps/s.
    pub aggregate_throughput_per_s: f64,
    /// Aggregate throughput over solo throughput (N for perfect sharing, 1.0 for a
    /// GPU that was already saturated, below 1.0 when sharing costs throughput).
    pub scaling: f64,
    /// Jain's fairness index of the clients' throughputs: 1.0 all equal, 1/N one client
    /// got everything.
    pub jain_fairness: f64,
    /// Mean over clients of p50 step latency, over solo p50.
    pub p50_inflation: f64,
    /// Worst client p99 step latency over solo p99.
    pub p99_inflation: f64,
    /// Largest lateness of a client's window start, ms.
    pub max_late_ms: f64,
    /// The solo baseline's own report (with its achieved rate against the device limit).
    pub solo: ClientResult,
    /// Each client's own report.
    pub client_results: Vec<ClientResult>,
}
