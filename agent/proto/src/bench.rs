//! The words and documents of `Bench`: the user's own program (or a built-in CUDA
//! workload) as N replicas under each sharing strategy. Both sides parse what a user types
//! through these (ctl to refuse bad input before calling, the agent because any client
//! may call it), so a strategy, an objective or an SLO means the same everywhere.

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Option of `Bench` (s): the GPU index, `GPU-…` or `MIG-…` to bench on (GPU 0 if absent).
pub const BENCH_TARGET: &str = "target";
/// Option of `Bench` (au): the replica counts, in order.
pub const BENCH_REPLICAS: &str = "replicas";
/// Option of `Bench` (as): the strategies, by [`BenchStrategy`] name.
pub const BENCH_STRATEGIES: &str = "strategies";
/// Option of `Bench` (d): the measurement window of each run, in seconds.
pub const BENCH_DURATION: &str = "duration";
/// Option of `Bench` (b): measure each replica's wall time to its exit instead of a window.
pub const BENCH_UNTIL_EXIT: &str = "until_exit";
/// Option of `Bench` (s): [`Objective`] name.
pub const BENCH_OBJECTIVE: &str = "objective";
/// Option of `Bench` (s): an [`Slo`] as the user wrote it (`p99=50ms`, `slowdown=2`).
pub const BENCH_SLO: &str = "slo";
/// Option of `Bench` (s): the Prometheus histogram each replica serves (the histogram
/// method); absent: units by line.
pub const BENCH_HISTOGRAM: &str = "histogram";
/// Option of `Bench` (s): a built-in workload (`launch`, `compute`, `memory`) instead of a
/// command.
pub const BENCH_BUILTIN: &str = "builtin";
/// Option of `Bench` (u): the replicas a fleet needs, for the cost answer.
pub const BENCH_FLEET: &str = "fleet";
/// Option of `Bench` (s): the working directory of the replicas (the caller's).
pub const BENCH_CWD: &str = "cwd";
/// Option of `Bench` (as): the replicas' environment as `NAME=value` (the caller's); the
/// agent adds its own variables over it.
pub const BENCH_ENVIRONMENT: &str = "environment";
/// Option of `Bench` (d): the longest a replica may run, seconds; it is stopped then.
pub const BENCH_TIME_LIMIT: &str = "time_limit";
/// Option of `Bench` (u): how often each run is measured, back to back under the same
/// setup; the run reported is the median one.
pub const BENCH_REPEAT: &str = "repeat";
/// Option of `Bench` (s): an absolute directory of the caller's where the replicas write
/// their stdout and stderr (as the caller, `<strategy>-<N>/replica-<i>.{out,err}`); absent:
/// their output is counted and its ends reported, not kept.
pub const BENCH_LOGS: &str = "logs";
/// Option of `Bench` (s): the CPUs the replicas are pinned to, as a Linux CPU list
/// (`0-7,16-23`), divided into equal disjoint sets, one per replica; absent: the CPUs of
/// the GPU's NUMA node (all of the agent's where the host has one node).
pub const BENCH_CPUS: &str = "cpus";
/// Option of `Bench` (b): `false` runs the replicas unpinned (`--no-pin`); pinned when absent.
pub const BENCH_PIN: &str = "pin";

/// Replica counts when none are given.
pub const BENCH_DEFAULT_REPLICAS: [u32; 4] = [1, 3, 5, 7];
/// Measurement window when none is given, seconds.
pub const BENCH_DEFAULT_DURATION: f64 = 30.0;
/// The replicas a fleet has when none are given, for the cost answer.
pub const BENCH_DEFAULT_FLEET: u32 = 100;
/// Longest run of one replica when none is given, seconds (`--until-exit` included).
pub const BENCH_DEFAULT_TIME_LIMIT: f64 = 600.0;
/// How often each run is measured when not said.
pub const BENCH_DEFAULT_REPEAT: u32 = 1;
/// The shortest window and time limit, seconds.
pub const BENCH_MIN_SECONDS: f64 = 1.0;
/// The longest window, seconds (an hour).
pub const BENCH_MAX_DURATION: f64 = 3600.0;
/// The longest time limit of a replica, seconds (a day).
pub const BENCH_MAX_TIME_LIMIT: f64 = 86_400.0;
/// Most bytes of a bench's command line (its arguments together), as `execve` would take
/// them (each at most 128 KiB there).
pub const BENCH_MAX_COMMAND_BYTES: usize = 128 << 10;
/// Most arguments of a bench's command.
pub const BENCH_MAX_ARGUMENTS: usize = 4096;
/// Most bytes of the replicas' environment (`NAME=value` strings together).
pub const BENCH_MAX_ENVIRONMENT_BYTES: usize = 256 << 10;
/// Most variables of the replicas' environment.
pub const BENCH_MAX_VARIABLES: usize = 4096;
/// Most bytes of a path option (`cwd`, `logs`), as `PATH_MAX`.
pub const BENCH_MAX_PATH_BYTES: usize = 4096;
/// Most bytes of a short text option (target, histogram name, SLO, ...).
pub const BENCH_MAX_NAME_BYTES: usize = 256;
/// Most measurements of one run.
pub const BENCH_MAX_REPEAT: u32 = 10;
/// The fewest measurements of the baseline, whatever the repeat: every scaling, slowdown
/// and inflation divides by it, and one replica alone is the run that varies most on a
/// shared host (a latency-bound loop alone ran 22,418 to 34,465 units/s in one bench on
/// the H100).
pub const BENCH_BASELINE_RUNS: u32 = 3;
/// Most replicas a run may have (MPS's client limit).
pub const BENCH_MAX_REPLICAS: u32 = crate::MPS_MAX_CLIENTS;

/// The replica's environment variable naming the descriptor it reports units on (`3`).
pub const ENV_REPORT: &str = "GPUSHARE_BENCH_REPORT";
/// The replica's environment variable with its index, from 0.
pub const ENV_REPLICA: &str = "GPUSHARE_BENCH_REPLICA";
/// The replica's environment variable with the number of replicas in its run.
pub const ENV_REPLICAS: &str = "GPUSHARE_BENCH_REPLICAS";
/// The replica's environment variable with the TCP port it should serve metrics on
/// (histogram method; a different one per replica).
pub const ENV_METRICS_PORT: &str = "GPUSHARE_BENCH_METRICS_PORT";
/// The replica's environment variable with the strategy it runs under.
pub const ENV_STRATEGY: &str = "GPUSHARE_BENCH_STRATEGY";

/// A sharing strategy a bench tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BenchStrategy {
    /// The whole GPU without MPS: the driver's time-slicing between the replicas.
    TimeSlicing,
    /// One MPS server without limits.
    Mps,
    /// One MPS server, 100/N % threads and memory/N per replica.
    MpsLimited,
    /// N equal MIG instances, one replica each.
    Mig,
}

impl BenchStrategy {
    /// Every strategy, in the order a bench runs and reports them.
    pub const ALL: [BenchStrategy; 4] = [
        BenchStrategy::TimeSlicing,
        BenchStrategy::Mps,
        BenchStrategy::MpsLimited,
        BenchStrategy::Mig,
    ];

    /// The name on the command line, in options and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            BenchStrategy::TimeSlicing => "time-slicing",
            BenchStrategy::Mps => "mps",
            BenchStrategy::MpsLimited => "mps-limited",
            BenchStrategy::Mig => "mig",
        }
    }
}

impl fmt::Display for BenchStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BenchStrategy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BenchStrategy::ALL.into_iter().find(|w| w.as_str() == s).ok_or_else(|| {
            let names: Vec<&str> = BenchStrategy::ALL.iter().map(|w| w.as_str()).collect();
            format!("unknown strategy {s:?} ({})", names.join(", "))
        })
    }
}

/// What the recommendation optimizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Objective {
    /// The smallest p99 at each replica count.
    Latency,
    /// The largest aggregate throughput at each replica count.
    #[default]
    Throughput,
}

impl Objective {
    /// `latency` or `throughput`.
    pub fn as_str(self) -> &'static str {
        match self {
            Objective::Latency => "latency",
            Objective::Throughput => "throughput",
        }
    }
}

impl fmt::Display for Objective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Objective {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "latency" => Ok(Objective::Latency),
            "throughput" => Ok(Objective::Throughput),
            _ => Err(format!("unknown objective {s:?} (latency, throughput)")),
        }
    }
}

/// A service level a replica count must keep to count as capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Slo {
    /// Every replica's p99 latency at most this many milliseconds (`p99=50ms`).
    P99Ms(f64),
    /// Every replica at most this many times slower than alone (`slowdown=2`).
    Slowdown(f64),
}

impl fmt::Display for Slo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Slo::P99Ms(ms) => write!(f, "p99={ms}ms"),
            Slo::Slowdown(x) => write!(f, "slowdown={x}"),
        }
    }
}

impl FromStr for Slo {
    type Err = String;

    /// `p99=50ms`, `p99=0.2s`, `p99=50` (ms), `slowdown=2`, `slowdown=1.5x`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| format!("SLO {text:?}: {why} (p99=50ms or slowdown=2)");
        let (key, value) = text.split_once('=').ok_or_else(|| bad("no `=`"))?;
        let value = value.trim();
        let number = |digits: &str| -> Result<f64, String> {
            match digits.trim().parse::<f64>() {
                Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
                _ => Err(bad("not a number above zero")),
            }
        };
        match key.trim() {
            "p99" => {
                let ms = if let Some(ms) = value.strip_suffix("ms") {
                    number(ms)?
                } else if let Some(s) = value.strip_suffix('s') {
                    number(s)? * 1000.0
                } else {
                    number(value)?
                };
                Ok(Slo::P99Ms(ms))
            }
            "slowdown" => {
                let x = number(value.strip_suffix('x').unwrap_or(value))?;
                if x < 1.0 {
                    return Err(bad("a slowdown is 1 or more"));
                }
                Ok(Slo::Slowdown(x))
            }
            other => Err(bad(&format!("unknown measure `{other}`"))),
        }
    }
}

/// How a bench measured its replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Each replica's wall time from the start to its exit (`--until-exit`).
    UntilExit,
    /// Units of work reported by line on `GPUSHARE_BENCH_REPORT` during a window.
    Units,
    /// A Prometheus histogram each replica serves, scraped before and after a window.
    Histogram,
}

impl Method {
    /// `until-exit`, `units` or `histogram`.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::UntilExit => "until-exit",
            Method::Units => "units",
            Method::Histogram => "histogram",
        }
    }
}

impl BenchReport {
    /// What its throughputs count a second: `runs/s` when each replica ran once to its
    /// exit (`--until-exit`), else `units/s`.
    pub fn rate_unit(&self) -> &'static str {
        if self.method == Method::UntilExit.as_str() { "runs/s" } else { "units/s" }
    }
}

/// What a bench job measured: `JobOutcome::bench`, and what `gpushare-ctl bench --json`
/// prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// The `GPU-…` UUID benched.
    pub target: String,
    /// Its index.
    pub gpu: u32,
    /// Its name, as the driver reports it.
    pub device: String,
    /// The command each replica ran, or `builtin:<workload>`.
    pub command: Vec<String>,
    /// [`Method`] name.
    pub method: String,
    /// The histogram scraped (histogram method).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub histogram: Option<String>,
    /// `latency` or `throughput`.
    pub objective: String,
    /// The measurement window, seconds; `None` with `until-exit`.
    pub window_seconds: Option<f64>,
    /// How often each run was measured (the baseline at least [`BENCH_BASELINE_RUNS`]
    /// times); each run reports its median measurement.
    #[serde(default = "one")]
    pub repeat: u32,
    /// The SLO as given, normalized (`p99=50ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo: Option<String>,
    /// Replicas a fleet needs, for [`BenchCapacity`]'s cost figures.
    pub fleet: u32,
    /// Wall time of the whole bench, seconds.
    pub wall_seconds: f64,
    /// One replica alone on the whole GPU without MPS: what scaling, slowdown and
    /// inflation compare against.
    pub baseline: Option<BenchRun>,
    /// Per strategy, in the order run.
    pub strategies: Vec<BenchStrategyRuns>,
    /// Per replica count, the strategy the objective picks, and the other side's cost.
    pub recommendations: Vec<BenchRecommendation>,
    /// With an SLO: per strategy, the most replicas per GPU that keep it, and the cost.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capacity: Vec<BenchCapacity>,
    /// What the GPU's sharing was restored to afterwards.
    pub restored: String,
    /// Where this report is kept: `report.json` in [`BenchReport::logs_dir`], written by
    /// the client as the caller (`gpushare-ctl` does); empty when nobody kept it.
    pub saved_to: String,
    /// The caller's directory the replicas wrote their output to (the `logs` option);
    /// empty when their output was not kept.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub logs_dir: String,
    /// The CPUs each replica was pinned to, the same in every run; `None`: unpinned
    /// (`--no-pin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinning: Option<BenchPinning>,
    /// How the intervals of the runs were found, one line (`95 % bootstrap interval of the
    /// median over 3 repeats`); empty in a report of an older agent.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub intervals: String,
    /// What the host's own noise is, and what it means for the verdicts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise: Option<BenchNoise>,
    /// The bench's length as estimated before the first window, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate_seconds: Option<f64>,
    /// Replica counts of the default list left out because the host has too few CPUs to
    /// pin them, with why; empty when none were.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub capped: String,
    /// Every measurement in the order taken (rounds interleave strategies and replica
    /// counts; see DESIGN.md "Interleaved repeats").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sequence: Vec<BenchMeasurement>,
    /// Why the bench ended before measuring everything it planned (cancelled, a failure),
    /// with how far it got (`cancelled in round 2 of 3: …`); the figures are those of the
    /// measurements finished before. Empty for a whole bench.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub partial: String,
    /// What the bench said, before measuring, it would run and leave out, one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plan: Vec<String>,
}

/// How the replicas were pinned to CPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchPinning {
    /// The CPUs divided among the replicas, as a CPU list (`0-15`).
    pub cpus: String,
    /// Where that set comes from: `--cpus`, `NUMA node 1 of the GPU`, `the agent's CPUs`.
    pub from: String,
    /// CPUs each replica gets.
    pub cpus_per_replica: u32,
    /// Replica i's CPUs (its index in this list), as CPU lists; the baseline runs on
    /// replica 0's.
    pub replicas: Vec<String>,
}

/// The host's noise over the bench.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchNoise {
    /// The baseline's spread over its measurements: the largest throughput over the
    /// smallest, minus one.
    pub baseline_spread: Option<f64>,
    /// The same of the baseline's p99s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_p99_spread: Option<f64>,
    /// One measurement's relative spread on this host, robustly: 1.4826 × the median
    /// absolute deviation of the baseline's throughputs over their median (issue 37: it
    /// does not grow with the rounds, as the spread does); `None` from fewer than two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_scale: Option<f64>,
    /// The least difference in throughput two runs measured as often as this bench's
    /// (`repeat` times each) can be told apart by: the host's noise band for them, at
    /// least 2 %. More rounds make it smaller.
    pub floor: f64,
    /// Time the replicas' CPUs were stolen by the hypervisor over the windows, percent
    /// (`/proc/stat`); `None` where the kernel does not count it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steal_percent: Option<f64>,
    /// The replicas' CPUs' clock over the windows, MHz: lowest, median and highest
    /// sample; `None` where the host does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_mhz: Option<[f64; 3]>,
    /// What it means, one sentence (`differences under 12 % on this host are noise`).
    pub meaning: String,
}

/// One measurement of one run, in the bench's order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchMeasurement {
    /// The round (1-based); every round measures every run once.
    pub round: u32,
    /// [`BenchStrategy`] name; the baseline is `baseline`.
    pub strategy: String,
    /// Replicas run together.
    pub replicas: u32,
    /// When its replicas started, seconds from the bench's start.
    pub at_seconds: f64,
    /// Its aggregate throughput (0 when it failed).
    pub throughput_per_s: f64,
    /// Its pooled p99, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_ms: Option<f64>,
    /// Its worst replica's p99, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst_p99_ms: Option<f64>,
    /// Whether a replica failed or the run had an error.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub failed: bool,
}

fn one() -> u32 {
    1
}

/// The runs under one strategy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchStrategyRuns {
    /// [`BenchStrategy`] name.
    pub strategy: String,
    /// Why this strategy has no figures (`manage_mig = false`, not MIG-capable), if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// One per replica count, in order.
    pub runs: Vec<BenchRun>,
}

/// N replicas run together under one strategy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRun {
    /// Replicas run together.
    pub replicas: u32,
    /// How the strategy was set up for them (`MPS, 33 % threads, 26 GiB each`, `3 × 2g.20gb`).
    pub setup: String,
    /// Length of the measurement (the window, or the longest replica's wall time), seconds.
    pub seconds: f64,
    /// Units counted over all replicas (histogram observations, or 1 per replica that
    /// exited with `until-exit`).
    pub units: u64,
    /// Units per second over all replicas that did not fail.
    pub throughput_per_s: f64,
    /// Aggregate throughput over the baseline's (N for perfect sharing).
    pub scaling: Option<f64>,
    /// Median latency over all replicas' units (wall times with `until-exit`), ms.
    pub p50_ms: Option<f64>,
    /// 99th percentile latency over all replicas' units, ms.
    pub p99_ms: Option<f64>,
    /// `p50_ms` over the baseline's.
    pub p50_inflation: Option<f64>,
    /// `p99_ms` over the baseline's.
    pub p99_inflation: Option<f64>,
    /// Jain's fairness index of the replicas' throughputs (1 = all equal).
    pub jain_fairness: Option<f64>,
    /// The slowest replica's slowdown against the baseline.
    pub max_slowdown: Option<f64>,
    /// Replicas that failed (exited non-zero, were killed, or reported nothing).
    pub failed: u32,
    /// Why the run has no figures (its strategy could not be set up for N), if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The agent's own CPU time over the window, in percent of one core: what measuring
    /// cost (reading the replicas' reports, scraping, sampling NVML).
    #[serde(default)]
    pub agent_cpu_percent: Option<f64>,
    /// How long setting the strategy up for this run took, ms: from the observation the
    /// plan was made from to the sharing verified (for MPS: the server started with its
    /// limits set and read back). `None` when the run kept the previous run's setup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup_ms: Option<f64>,
    /// When the run was measured more than once (`repeat`, and always the baseline): each
    /// measurement's aggregate throughput, in the order taken. The figures of the run are
    /// those of the median measurement (of one that failed, if any did).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repeat_throughputs_per_s: Vec<f64>,
    /// Each measurement's pooled p99, ms, in the order taken, when measured more than once
    /// and every measurement has one (what latency verdicts test).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repeat_p99s_ms: Vec<f64>,
    /// The interval of the median throughput: low and high (see [`BenchReport::intervals`]);
    /// `None` when measured fewer than 2 times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput_interval: Option<[f64; 2]>,
    /// The interval of the median pooled p99, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_interval_ms: Option<[f64; 2]>,
    /// Why its scaling cannot be read as measured (above N: no sharing makes replicas
    /// faster than alone), if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling_warning: Option<String>,
    /// Each replica, by index.
    pub per_replica: Vec<BenchReplica>,
}

impl BenchRun {
    /// The smallest and the largest throughput of its measurements; `None` when measured
    /// once.
    pub fn repeat_bounds(&self) -> Option<(f64, f64)> {
        let all = &self.repeat_throughputs_per_s;
        let low = all.iter().copied().fold(f64::INFINITY, f64::min);
        let high = all.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (all.len() > 1).then_some((low, high))
    }

    /// How far its measurements spread: the largest throughput over the smallest, minus
    /// one (0.54 for 22,418 and 34,465 units/s); `None` when measured once.
    pub fn repeat_spread(&self) -> Option<f64> {
        let (low, high) = self.repeat_bounds()?;
        (low > 0.0 && high.is_finite()).then(|| high / low - 1.0)
    }
}

/// One replica of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReplica {
    /// Index, from 0 (`GPUSHARE_BENCH_REPLICA`).
    pub index: u32,
    /// Process id of its command (which leads its process group).
    pub pid: u32,
    /// Its `CUDA_VISIBLE_DEVICES`.
    pub device: String,
    /// `ok`, `exit 3`, `signal 9`, `stopped` (at the window's end), `time limit`.
    pub outcome: String,
    /// Whether it counts as failed (reported, never averaged away).
    pub failed: bool,
    /// Its wall time from the start to its exit or stop, seconds.
    pub seconds: f64,
    /// Units it completed in the window.
    pub units: u64,
    /// Its units per second.
    pub throughput_per_s: f64,
    /// Its median latency, ms.
    pub p50_ms: Option<f64>,
    /// Its 99th percentile latency, ms.
    pub p99_ms: Option<f64>,
    /// Baseline throughput over its own (1 = unaffected).
    pub slowdown: Option<f64>,
    /// GPU memory its processes held near the window's end (NVML), bytes.
    pub gpu_memory_bytes: Option<u64>,
    /// Lines on the report descriptor that were neither empty nor a number.
    pub malformed_lines: u64,
    /// The end of its standard output.
    pub stdout_tail: String,
    /// The end of its standard error.
    pub stderr_tail: String,
    /// Bytes of its output beyond the cap of its log files, dropped.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub output_dropped_bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The strategy an objective picks at one replica count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRecommendation {
    /// The replica count.
    pub replicas: u32,
    /// [`BenchStrategy`] name.
    pub strategy: String,
    /// The figures behind it and the other side's cost, one line (`mps: 3.4x the
    /// throughput of time-slicing, p99 2.1x worse`).
    pub reason: String,
    /// The strategies the measurements cannot tell apart from the one picked on the
    /// objective's figure (itself included), when more than one: the pick is then by
    /// isolation (MIG, MPS-limited, MPS, time-slicing), not by the figures.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub indistinguishable: Vec<String>,
}

/// With an SLO: how many replicas per GPU a strategy keeps it for, and what that saves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchCapacity {
    /// [`BenchStrategy`] name.
    pub strategy: String,
    /// The most replicas per GPU measured that kept the SLO with none failing; 0 if none.
    pub replicas_per_gpu: u32,
    /// GPUs a fleet of [`BenchReport::fleet`] replicas needs at that density (0 if none).
    pub gpus_needed: u32,
    /// `1 - gpus_needed / fleet`: the share of GPUs saved against one GPU per replica.
    pub saving: f64,
    /// The figures behind it, one line.
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two enums, two meanings (DESIGN.md, "Rooms (issue 39): the design card's crates"):
    /// the strategies both know are spelt alike on the wire.
    #[test]
    fn bench_strategies_are_spelt_as_sharing_strategies() {
        for strategy in BenchStrategy::ALL {
            match crate::Strategy::from_name(strategy.as_str()) {
                Some(sharing) => assert_eq!(sharing.as_str(), strategy.as_str()),
                None => assert_eq!(strategy, BenchStrategy::Mig, "{strategy}"),
            }
        }
    }

    #[test]
    fn slos_parse_with_their_units() {
        assert_eq!("p99=50ms".parse(), Ok(Slo::P99Ms(50.0)));
        assert_eq!("p99=0.2s".parse(), Ok(Slo::P99Ms(200.0)));
        assert_eq!("p99=12.5".parse(), Ok(Slo::P99Ms(12.5)));
        assert_eq!("slowdown=2".parse(), Ok(Slo::Slowdown(2.0)));
        assert_eq!("slowdown=1.5x".parse(), Ok(Slo::Slowdown(1.5)));
        assert_eq!(Slo::P99Ms(50.0).to_string(), "p99=50ms");
        for bad in ["p99", "p99=", "p99=-1ms", "p99=fast", "p50=3ms", "slowdown=0.5", "p99=NaN"] {
            let e = bad.parse::<Slo>().unwrap_err();
            assert!(e.starts_with(&format!("SLO {bad:?}")), "{e}");
        }
    }

    #[test]
    fn strategies_and_objectives_have_one_name_each() {
        for s in BenchStrategy::ALL {
            assert_eq!(s.as_str().parse(), Ok(s));
        }
        assert_eq!(
            "fast".parse::<BenchStrategy>().unwrap_err(),
            "unknown strategy \"fast\" (time-slicing, mps, mps-limited, mig)"
        );
        assert_eq!("latency".parse(), Ok(Objective::Latency));
        assert!("speed".parse::<Objective>().is_err());
    }
}

/// Why a bench COMMAND's program is not one a shell would run: ctl refuses it before
/// calling, the agent again for any client, with the same words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandLookup {
    /// The program's name is empty.
    Empty,
    /// A name with a `/` in it: nothing there.
    Missing {
        /// The directory it was taken relative to.
        cwd: PathBuf,
    },
    /// A name with a `/` in it that cannot be looked at.
    Unreadable(String),
    /// A name with a `/` in it that is a directory.
    Directory,
    /// A name with a `/` in it that is a file without an execute bit.
    NotExecutable {
        /// Its permission bits.
        mode: u32,
    },
    /// A bare name, and no PATH to look in.
    NoPath,
    /// A bare name found as an executable file in no directory of PATH.
    NotOnPath {
        /// The PATH looked in, as given.
        path: String,
    },
}

impl fmt::Display for CommandLookup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("an empty program name"),
            Self::Missing { cwd } => write!(f, "not found (in {})", cwd.display()),
            Self::Unreadable(why) => write!(f, "cannot be read: {why}"),
            Self::Directory => f.write_str("is a directory"),
            Self::NotExecutable { mode } => write!(
                f,
                "not executable (mode {mode:o}): chmod +x it, or name its interpreter first"
            ),
            Self::NoPath => f.write_str("not found (PATH is not set)"),
            Self::NotOnPath { path } => write!(f, "not found (PATH={path})"),
        }
    }
}

pub use gpushare_base::duration::seconds_text;

/// Whether `name` is a Prometheus metric name (letters, digits, `_` and `:`, not empty,
/// not starting with a digit): what `--histogram` takes.
pub fn is_metric_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().enumerate().all(|(i, c)| {
            c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
        })
}

/// The file a shell would run for `program` from `cwd` with `path` as its PATH: a name
/// with a `/` relative to `cwd`, a bare name in the first PATH directory holding an
/// executable file of that name (an empty entry, or a relative one, from `cwd`).
pub fn find_command(
    program: &str,
    path: Option<&OsStr>,
    cwd: &Path,
) -> Result<PathBuf, CommandLookup> {
    if program.is_empty() {
        return Err(CommandLookup::Empty);
    }
    if program.contains('/') {
        let candidate = cwd.join(program);
        return match std::fs::metadata(&candidate) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(CommandLookup::Missing { cwd: cwd.to_path_buf() })
            }
            Err(e) => Err(CommandLookup::Unreadable(e.to_string())),
            Ok(m) if m.is_dir() => Err(CommandLookup::Directory),
            Ok(m) if m.permissions().mode() & 0o111 == 0 => {
                Err(CommandLookup::NotExecutable { mode: m.permissions().mode() & 0o7777 })
            }
            Ok(_) => Ok(candidate),
        };
    }
    let path = path.ok_or(CommandLookup::NoPath)?;
    std::env::split_paths(path)
        .map(|dir| if dir.as_os_str().is_empty() { cwd.to_path_buf() } else { cwd.join(dir) })
        .map(|dir| dir.join(program))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .ok_or_else(|| CommandLookup::NotOnPath { path: path.to_string_lossy().into_owned() })
}
