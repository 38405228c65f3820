//! Why an operation of the engine failed: one variant per kind of failure, each one line.
//! The service maps the kinds to D-Bus errors in one place ([`crate::service`]).

use std::path::PathBuf;

use super::job_kind::{JobKind, RunningJob};
use crate::apply::transaction::TransactionError;
use crate::gpu::GpuError;
use crate::plan::PlanError;
use crate::profile::ProfileError;
use crate::sharing::SharingError;

/// Why an operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// No profile of that name; the message lists the known ones.
    #[error("{0}")]
    UnknownProfile(String),
    /// Profile text that does not parse or validate.
    #[error("{0}")]
    InvalidProfile(#[from] ProfileError),
    /// A profile asked for by name whose file does not load: the file's error.
    #[error("{0}")]
    BrokenProfile(String),
    /// The profile cannot be planned here.
    #[error("{0}")]
    Plan(#[from] PlanError),
    /// Another job holds the apply lock, or work of the agent's own does for a moment
    /// ([`JobKind::Moment`]); `None`: a job starting or ending (the lock is taken
    /// before the job is named, and let go after its name went).
    #[error("{}", busy_text(.0))]
    Busy(Option<RunningJob>),
    /// The GPU backend failed.
    #[error("{0}")]
    Backend(#[from] GpuError),
    /// An MPS or time-slicing tool failed.
    #[error("{0}")]
    Sharing(#[from] SharingError),
    /// A request's argument is out of range or names nothing here.
    #[error("{0}")]
    InvalidArgument(String),
    /// What was asked cannot be done on this node as it is (a probe of simulated GPUs, a
    /// comparison on a GPU in use).
    #[error("{0}")]
    NotPossible(String),
    /// Slurm refused or failed an apply's passage through it (`[slurm]`).
    #[error("{0}")]
    Slurm(String),
    /// An apply ran and failed.
    #[error("applying {profile}: {error}")]
    Apply {
        /// The profile applied.
        profile: String,
        /// How it failed.
        error: Box<TransactionError>,
    },
    /// A probe ran and failed.
    #[error("probing {target}: {message}")]
    Probe {
        /// The device probed.
        target: String,
        /// What went wrong.
        message: String,
    },
    /// A bench ran and failed (or was cancelled).
    #[error("bench on {target}: {message}")]
    Bench {
        /// The GPU benched.
        target: String,
        /// What went wrong.
        message: String,
    },
    /// The agent changes nothing on the GPUs: its configuration did not read.
    #[error("the agent changes nothing on the GPUs: {0}")]
    HandsOff(String),
    /// An interrupted apply could not be rolled back.
    #[error("{0}")]
    Recovery(String),
    /// The state directory cannot be used.
    #[error("state directory {}: {message}", .dir.display())]
    StateDirectory {
        /// The directory.
        dir: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A task of the agent itself failed (a panic on the blocking pool).
    #[error("{0}")]
    Internal(String),
    /// An apply refused after it rolled back an unfinished one (see
    /// `Engine::settle_unfinished`): the refusal, and what the rollback did to the GPUs.
    #[error("{error}; before this refusal: {repaired}")]
    AfterRollback {
        /// What the rollback did, in one line.
        repaired: String,
        /// Why the apply was refused.
        error: Box<EngineError>,
    },
}

/// `a probe is running (/io/gpushare/Agent1/jobs/9, probe of GPU-1); try again when it has
/// finished`, or for a moment's holder `the MPS health check holds the apply lock; try
/// again in a moment`.
fn busy_text(running: &Option<RunningJob>) -> String {
    let Some(job) = running else {
        return "another job is starting or ending; try again in a moment".into();
    };
    let what = match &job.kind {
        JobKind::Moment { what } => {
            return format!("{what} holds the apply lock; try again in a moment");
        }
        JobKind::Probe { .. } => "a probe",
        JobKind::Bench { .. } => "a bench",
        JobKind::Apply { .. } => "another apply",
    };
    format!("{what} is running ({job}); try again when it has finished")
}
