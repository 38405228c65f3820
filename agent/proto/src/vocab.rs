//! The words of the interface: option keys, probe workloads, sharing strategies, job and
//! server states, and the limits both sides check. The JSON documents keep these as plain
//! strings (so that an older client still reads a newer agent's answers); these types are
//! where the strings are written, once, for the agent and its clients alike.

use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Option of `Apply` and `ApplyDocument` (b): proceed although compute processes use what
/// must change.
pub const OPTION_FORCE: &str = "force";
/// Option of `Probe` (s): the GPU index, `GPU-…` or `MIG-…` to probe.
pub const OPTION_TARGET: &str = "target";
/// Option of `Probe` (as): the workloads, by [`Workload`] name.
pub const OPTION_WORKLOADS: &str = "workloads";
/// Option of `Probe` (au): the client counts.
pub const OPTION_CLIENTS: &str = "clients";
/// Option of `Probe` (d): the measurement window of each run, in seconds.
pub const OPTION_SECONDS: &str = "seconds";
/// Option of `Probe` (b): run the sweep under each sharing strategy and recommend one.
pub const OPTION_COMPARE: &str = "compare";

/// Most clients an MPS server takes (Volta and later): the most a profile's `replicas` or
/// `max_clients` may say, and the most clients a probe run starts.
pub const MPS_MAX_CLIENTS: u32 = 48;
/// The measurement windows a probe accepts, in seconds.
pub const PROBE_SECONDS: RangeInclusive<f64> = 0.5..=60.0;
/// The client counts a probe runs when none are given.
pub const PROBE_DEFAULT_CLIENTS: [u32; 4] = [1, 2, 4, 7];
/// The measurement window a probe uses when none is given, in seconds.
pub const PROBE_DEFAULT_SECONDS: f64 = 3.0;
/// The active thread percentages MPS accepts.
pub const MPS_THREAD_PERCENTAGE: RangeInclusive<u32> = 1..=100;
/// Most bytes a profile document may have (a gpushare profile or a mig-parted file):
/// real ones are under 10 KiB; the bound keeps a hostile one from costing the agent or
/// ctl time and memory. ctl reads at most one byte more, the agent parses none of a
/// longer text.
pub const PROFILE_MAX_BYTES: usize = 256 * 1024;

/// The most bytes of a name a caller sends: a profile, a GPU or MIG target, a mig-parted
/// config (profile names themselves have at most 64 characters).
pub const NAME_MAX_BYTES: usize = 256;
/// The most bytes of a document's origin (a path, as `PATH_MAX`).
pub const ORIGIN_MAX_BYTES: usize = 4096;

/// The longest start of `text` of at most `max` bytes that ends on a character boundary:
/// how a string over one of these bounds is cut where it is kept or shown at all.
pub fn byte_prefix(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The one-line refusal of a profile document over [`PROFILE_MAX_BYTES`], after its origin.
pub fn profile_too_large() -> String {
    format!("larger than {} KiB, the most a profile may be", PROFILE_MAX_BYTES / 1024)
}

/// What a probe client runs, step after step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Tiny kernels, one after another: latency-bound.
    Launch,
    /// fp32 arithmetic over a full grid: compute-bound.
    Compute,
    /// Device-to-device copies: bandwidth-bound.
    Memory,
}

impl Workload {
    /// All workloads, in the order a full sweep runs them.
    pub const ALL: [Workload; 3] = [Workload::Launch, Workload::Compute, Workload::Memory];

    /// The name used on the command line, in options and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Workload::Launch => "launch",
            Workload::Compute => "compute",
            Workload::Memory => "memory",
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Workload {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Workload::ALL.into_iter().find(|w| w.as_str() == s).ok_or_else(|| {
            let names: Vec<&str> = Workload::ALL.iter().map(|w| w.as_str()).collect();
            format!("unknown probe workload {s:?} ({})", names.join(", "))
        })
    }
}

/// How a GPU or MIG instance is shared, as `Status`, `Env` and probe reports name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// No sharing set up by gpushare: the driver's own time-slicing between whoever opens
    /// the device.
    Exclusive,
    /// Time-slicing with a scheduler interval set by gpushare.
    TimeSlicing,
    /// An MPS server.
    Mps,
    /// An MPS server with 100/N % threads per client (a probe comparison's strategy).
    MpsLimited,
    /// A probe report comparing the strategies above.
    Compare,
}

impl Strategy {
    /// The strategies a GPU or MIG instance can be in, in the order reports list them.
    pub const SHARING: [Strategy; 3] = [Strategy::Exclusive, Strategy::TimeSlicing, Strategy::Mps];

    /// The name in JSON documents and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Exclusive => "exclusive",
            Strategy::TimeSlicing => "time-slicing",
            Strategy::Mps => "mps",
            Strategy::MpsLimited => "mps-limited",
            Strategy::Compare => "compare",
        }
    }

    /// The strategy of this name.
    pub fn from_name(name: &str) -> Option<Strategy> {
        [
            Strategy::Exclusive,
            Strategy::TimeSlicing,
            Strategy::Mps,
            Strategy::MpsLimited,
            Strategy::Compare,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `State` property of a job object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Still running.
    Running,
    /// Ended well.
    Succeeded,
    /// Ended in a failure; the outcome says why.
    Failed,
}

impl JobState {
    /// `running`, `succeeded` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
        }
    }
}

/// Whether an MPS server's control daemon runs ([`crate::types::MpsServer::state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerState {
    /// The daemon runs.
    Running,
    /// The daemon is gone; the agent's supervisor restarts it.
    Down,
}

impl ServerState {
    /// `running` or `down`.
    pub fn as_str(self) -> &'static str {
        match self {
            ServerState::Running => "running",
            ServerState::Down => "down",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_round_trip_by_name_and_in_json() {
        for w in Workload::ALL {
            assert_eq!(w.as_str().parse::<Workload>(), Ok(w));
            assert_eq!(serde_json::to_string(&w).unwrap(), format!("\"{w}\""));
        }
        assert_eq!(
            "flops".parse::<Workload>(),
            Err("unknown probe workload \"flops\" (launch, compute, memory)".to_string())
        );
    }

    #[test]
    fn strategies_round_trip_by_name() {
        for s in [
            Strategy::Exclusive,
            Strategy::TimeSlicing,
            Strategy::Mps,
            Strategy::MpsLimited,
            Strategy::Compare,
        ] {
            assert_eq!(Strategy::from_name(s.as_str()), Some(s));
        }
        assert_eq!(Strategy::from_name("mig"), None);
    }
}
