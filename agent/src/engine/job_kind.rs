//! What a job is and how it ended, in words every part of the engine shares (errors,
//! events, the job guards): [`JobKind`], [`RunningJob`], [`JobResult`]. A leaf: it uses
//! no other module of the engine.

use std::fmt;

use crate::apply::hooks::Settled;

/// What a job does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobKind {
    /// Applies a profile.
    Apply {
        /// The profile.
        profile: String,
    },
    /// Probes a GPU or MIG instance.
    Probe {
        /// `GPU-…` or `MIG-…`.
        target: String,
    },
    /// Benches a command (or a built-in workload) under each strategy on a GPU.
    Bench {
        /// `GPU-…`.
        target: String,
    },
    /// Work of the agent's own that holds the apply lock for a moment and is no job (the
    /// MPS health check, a bench being checked, recovery at start-up, shutdown): waited
    /// for, never shown as an apply in progress, and named when a wait for it runs out.
    Moment {
        /// What it is, for people: `the MPS health check`.
        what: String,
    },
}

impl JobKind {
    /// What the job works on, for people: the profile, or `probe of <device>`.
    pub fn subject(&self) -> String {
        match self {
            JobKind::Apply { profile } => profile.clone(),
            JobKind::Probe { target } => format!("probe of {target}"),
            JobKind::Bench { target } => format!("bench on {target}"),
            JobKind::Moment { what } => what.clone(),
        }
    }

    /// Whether its whole outcome is its caller's alone (a bench: the caller's command,
    /// the report and what the replicas printed).
    pub fn is_private(&self) -> bool {
        matches!(self, JobKind::Bench { .. })
    }
}

/// The job holding the apply lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningJob {
    /// Its name: the job object's path, or `start-up`.
    pub id: String,
    /// What it does.
    pub kind: JobKind,
}

impl RunningJob {
    /// Whether the job is a probe.
    pub fn is_probe(&self) -> bool {
        matches!(self.kind, JobKind::Probe { .. })
    }

    /// Whether the job is an apply.
    pub fn is_apply(&self) -> bool {
        matches!(self.kind, JobKind::Apply { .. })
    }
}

/// `/io/gpushare/Agent1/jobs/3, profile half-balanced`, as `status` shows it.
impl fmt::Display for RunningJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            JobKind::Apply { profile } => write!(f, "{}, profile {profile}", self.id),
            JobKind::Probe { target } => write!(f, "{}, probe of {target}", self.id),
            JobKind::Bench { target } => write!(f, "{}, bench on {target}", self.id),
            JobKind::Moment { what } => write!(f, "{what}"),
        }
    }
}

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobResult {
    /// It changed the GPUs (or probed them) as asked.
    Success,
    /// The GPUs were already as asked: nothing changed.
    Unchanged,
    /// It failed, and what it had changed was rolled back.
    RolledBack,
    /// It failed otherwise: refused by a hook, journal not written, rollback failed, a
    /// probe that could not measure.
    Failed,
}

impl JobResult {
    /// Whether the job did what was asked.
    pub fn is_ok(self) -> bool {
        matches!(self, JobResult::Success | JobResult::Unchanged)
    }

    /// `success`, `unchanged`, `rolled_back` or `failed` (the metrics' `result` label).
    pub fn as_str(self) -> &'static str {
        match self {
            JobResult::Success => "success",
            JobResult::Unchanged => "unchanged",
            JobResult::RolledBack => "rolled_back",
            JobResult::Failed => "failed",
        }
    }
}

impl From<Settled> for JobResult {
    fn from(settled: Settled) -> Self {
        match settled {
            Settled::Success => JobResult::Success,
            Settled::RolledBack => JobResult::RolledBack,
            Settled::Failed => JobResult::Failed,
        }
    }
}
