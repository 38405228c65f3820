//! What a bench runs, as the transport read it ([`BenchOptions`]) and who asks for it
//! ([`Caller`]): checked here for everything that needs no node (counts, strategies,
//! durations, paths), each refusal one line naming the option; and what the replicas get
//! of it (their command, environment, directories, the CPUs each is pinned to). The
//! bench itself is [`super`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpushare_proto::bench::{
    BENCH_MAX_DURATION, BENCH_MAX_REPEAT, BENCH_MAX_REPLICAS, BENCH_MAX_TIME_LIMIT,
    BENCH_MIN_SECONDS, BenchStrategy, Objective, Slo, seconds_text,
};

use gpushare_proto::plural;

use crate::bench::measure::Method;
use crate::bench::pinning::{self, CpuList, Pinning};
use crate::engine::{Engine, EngineError};
use crate::probe::Workload;
use crate::sys::unix;

/// Variables of the caller's environment the bench sets itself for each replica.
const OWN_VARIABLES: [&str; 4] = [
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
    "GPUSHARE_BENCH_",
];

/// What a bench runs, as the transport read it.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchOptions {
    /// GPU index or `GPU-…`; GPU 0 when absent.
    pub target: Option<String>,
    /// The command each replica runs; empty with `builtin`.
    pub command: Vec<String>,
    /// A built-in CUDA workload instead of a command (the probe's, reporting each step
    /// as a unit).
    pub builtin: Option<Workload>,
    /// Replica counts, in order.
    pub replicas: Vec<u32>,
    /// Strategies, in order.
    pub strategies: Vec<BenchStrategy>,
    /// The window of each run; `None`: until each replica exits.
    pub duration: Option<f64>,
    /// What the recommendation optimizes.
    pub objective: Objective,
    /// The service level capacity is sized for.
    pub slo: Option<Slo>,
    /// The histogram each replica serves (histogram method).
    pub histogram: Option<String>,
    /// Replicas a fleet needs, for the cost figures.
    pub fleet: u32,
    /// Longest a replica may run, seconds.
    pub time_limit: f64,
    /// How often each run is measured (the baseline at least [`BENCH_BASELINE_RUNS`]
    /// times); the median measurement is reported.
    pub repeat: u32,
    /// The replicas' working directory (absolute).
    pub cwd: PathBuf,
    /// The replicas' environment (the caller's).
    pub environment: Vec<(String, String)>,
    /// The caller's directory for the replicas' output (absolute); `None`: not kept.
    pub logs: Option<PathBuf>,
    /// The CPUs to divide among the replicas, as a CPU list; `None`: the agent's on the
    /// GPU's NUMA node.
    pub cpus: Option<String>,
    /// Whether the replicas are pinned to CPUs (`--no-pin`: false).
    pub pin: bool,
    /// Whether the replica counts were given (the defaults are capped by the CPUs there
    /// are to pin them; given ones are refused above it).
    pub replicas_given: bool,
}

/// Who asks for a bench, as the bus knows the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The caller's user.
    pub uid: u32,
    /// The caller's supplementary groups (`UnixGroupIDs`), when the bus knows them.
    pub groups: Option<Vec<u32>>,
}

impl BenchOptions {
    /// How the runs are measured: to exit without a window, else by the histogram when
    /// one is named, else by units.
    pub(super) fn method(&self) -> Method {
        match (&self.histogram, self.duration) {
            (_, None) => Method::UntilExit,
            (None, Some(d)) => Method::Units(Duration::from_secs_f64(d)),
            (Some(name), Some(d)) => {
                Method::Histogram { name: name.clone(), window: Duration::from_secs_f64(d) }
            }
        }
    }

    /// Checks what needs no node: counts, strategies, durations, the command, the
    /// directory. Each refusal is one line naming the option.
    pub(super) fn validate(&self) -> Result<(), EngineError> {
        let bad = |m: String| Err(EngineError::InvalidArgument(m));
        if self.replicas.is_empty() {
            return bad("replicas: give at least one replica count".into());
        }
        if let Some(n) = self.replicas.iter().find(|n| !(1..=BENCH_MAX_REPLICAS).contains(*n)) {
            return bad(format!("replicas: {n} is not from 1 to {BENCH_MAX_REPLICAS}"));
        }
        if self.strategies.is_empty() {
            return bad("strategies: give at least one strategy".into());
        }
        if let Some(d) =
            self.duration.filter(|d| !(BENCH_MIN_SECONDS..=BENCH_MAX_DURATION).contains(d))
        {
            return bad(format!("duration: {} is not from 1 s to 1 hour", seconds_text(d)));
        }
        if !(BENCH_MIN_SECONDS..=BENCH_MAX_TIME_LIMIT).contains(&self.time_limit) {
            let limit = seconds_text(self.time_limit);
            return bad(format!("time_limit: {limit} is not from 1 s to 24 hours"));
        }
        if self.duration.is_some_and(|d| d >= self.time_limit) {
            return bad("duration: the window must be shorter than the time limit".into());
        }
        if self.histogram.is_some() && self.duration.is_none() {
            return bad("histogram: the histogram method needs a window, not until_exit".into());
        }
        if self.fleet == 0 {
            return bad("fleet: a fleet has at least one replica".into());
        }
        if !(1..=BENCH_MAX_REPEAT).contains(&self.repeat) {
            return bad(format!("repeat: {} is not from 1 to {BENCH_MAX_REPEAT}", self.repeat));
        }
        if let Some(cpus) = &self.cpus {
            if !self.pin {
                return bad("cpus: the replicas are not pinned (pin = false)".into());
            }
            CpuList::parse(cpus).map_err(EngineError::InvalidArgument)?;
        }
        // Whether they exist, and what the caller may do there, the check gate finds out
        // as the caller: the agent never looks at a caller's paths itself.
        if !self.cwd.is_absolute() || self.cwd.to_str().is_none() {
            return bad(format!("cwd: {} is not an absolute path", self.cwd.display()));
        }
        if let Some(logs) = self.logs.as_ref().filter(|l| !l.is_absolute() || l.to_str().is_none())
        {
            return bad(format!("logs: {} is not an absolute path", logs.display()));
        }
        match (self.command.first(), self.builtin) {
            (Some(_), Some(_)) => bad("give a command or a built-in workload, not both".into()),
            (None, None) => bad("give the command the replicas run".into()),
            _ => Ok(()),
        }
    }

    /// What each replica runs: the command, or this binary running the built-in workload.
    pub(super) fn replica_command(&self, program: &Path) -> Result<Vec<String>, String> {
        match self.builtin {
            Some(w) => {
                let exe = program.to_str().ok_or("the agent's path is not UTF-8")?;
                Ok(vec![exe.into(), "--bench-builtin".into(), w.as_str().into()])
            }
            None => Ok(self.command.clone()),
        }
    }

    /// The working directory as the replicas get it.
    pub(super) fn cwd_text(&self) -> String {
        self.cwd.to_string_lossy().into_owned()
    }

    /// The log directory as the replicas get it.
    pub(super) fn logs_text(&self) -> Option<String> {
        self.logs.as_ref().map(|l| l.to_string_lossy().into_owned())
    }

    /// The command as the report names it.
    pub(super) fn described_command(&self) -> Vec<String> {
        match self.builtin {
            Some(w) => vec![format!("builtin:{w}")],
            None => self.command.clone(),
        }
    }

    /// The caller's environment without what the bench sets itself.
    pub(super) fn base_environment(&self) -> Vec<(String, String)> {
        self.environment
            .iter()
            .filter(|(k, _)| !OWN_VARIABLES.iter().any(|own| k.starts_with(own)))
            .cloned()
            .collect()
    }
}

impl Engine {
    /// The CPUs each replica is pinned to (`None` with `pin = false`), and the default
    /// replica counts left out for want of CPUs: a count above the CPUs there are is
    /// refused when given, left out (and said so) when it is a default.
    pub(super) async fn bench_pinning(
        &self,
        options: &mut BenchOptions,
        gpu: u32,
    ) -> Result<(Option<Pinning>, String), EngineError> {
        if !options.pin {
            return Ok((None, String::new()));
        }
        let (cpus, from) = match &options.cpus {
            None => {
                let node = self.bench_parts().node;
                let bus_id = node.pci_bus_id(gpu).await;
                let root = node.host_root.clone();
                tokio::task::spawn_blocking(move || pinning::available(&root, bus_id.as_deref()))
                    .await
                    .map_err(|e| {
                        EngineError::Internal(format!(
                            "finding the CPUs: {}",
                            crate::sys::task_failed(&e)
                        ))
                    })?
                    .map_err(EngineError::Internal)?
            }
            Some(text) => {
                let list = CpuList::parse(text).map_err(EngineError::InvalidArgument)?;
                let own = unix::cpu_affinity()
                    .map_err(|e| EngineError::Internal(format!("the agent's CPUs: {e}")))?;
                let outside: Vec<u32> =
                    list.cpus().iter().copied().filter(|c| !own.contains(c)).collect();
                if !outside.is_empty() {
                    return Err(EngineError::InvalidArgument(format!(
                        "cpus: CPU {} is not among the agent's CPUs ({})",
                        pinning::format_cpus(&outside),
                        pinning::format_cpus(&own)
                    )));
                }
                let topology = pinning::Topology::read(Path::new("/"), list.cpus());
                (topology.sibling_order(list.cpus()), "--cpus".to_owned())
            }
        };
        let most = u32::try_from(cpus.len()).unwrap_or(u32::MAX);
        let mut capped = String::new();
        if !options.replicas_given && options.replicas.iter().any(|&n| n > most) {
            let (kept, left): (Vec<u32>, Vec<u32>) =
                options.replicas.iter().partition(|&&n| n <= most);
            let left: Vec<String> = left.iter().map(u32::to_string).collect();
            capped = format!(
                "{} replicas left out: {} to pin one replica each ({}, {from}); --no-pin runs them unpinned",
                left.join(", "),
                plural(most, "CPU"),
                pinning::format_cpus(&cpus)
            );
            options.replicas = kept;
        }
        let max = options.replicas.iter().copied().max().unwrap_or(1);
        let plan = pinning::plan(&cpus, &from, max).map_err(EngineError::InvalidArgument)?;
        Ok((Some(plan), capped))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_cuda_variables_never_reach_a_replica() {
        let options = BenchOptions {
            target: None,
            command: vec!["sh".into()],
            builtin: None,
            replicas: vec![1],
            strategies: vec![BenchStrategy::Mps],
            duration: Some(5.0),
            objective: Objective::Throughput,
            slo: None,
            histogram: None,
            fleet: 100,
            time_limit: 60.0,
            repeat: 1,
            cwd: "/".into(),
            logs: None,
            cpus: None,
            pin: true,
            replicas_given: true,
            environment: vec![
                ("PATH".into(), "/bin".into()),
                ("CUDA_VISIBLE_DEVICES".into(), "3".into()),
                ("CUDA_MPS_PIPE_DIRECTORY".into(), "/tmp/x".into()),
                ("GPUSHARE_BENCH_REPLICA".into(), "9".into()),
            ],
        };
        assert_eq!(options.base_environment(), vec![("PATH".to_string(), "/bin".to_string())]);
        assert!(options.validate().is_ok());
        let zero = BenchOptions { replicas: vec![1, 0], ..options.clone() };
        assert_eq!(zero.validate().unwrap_err().to_string(), "replicas: 0 is not from 1 to 48");
        let never = BenchOptions { repeat: 0, ..options.clone() };
        assert_eq!(never.validate().unwrap_err().to_string(), "repeat: 0 is not from 1 to 10");
    }
}
