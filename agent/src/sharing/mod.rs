//! The sharing gpushare sets up on GPUs and MIG instances besides the hardware's
//! own state: MPS control daemons ([`mps`]), time-slice intervals ([`timeslice`]), and the
//! supervision that restarts daemons that died ([`supervisor`]). The tools run as external
//! programs (`nvidia-cuda-mps-control`, `nvidia-smi`) through [`crate::sys::command`].

pub mod mps;
pub mod supervisor;
pub mod timeslice;

use std::collections::BTreeMap;

use crate::node::{MpsServerState, TimeSliceInterval};
use mps::MpsController;
use timeslice::TimesliceControl;

/// The sharing tools an apply drives besides the GPU backend.
#[derive(Debug, Clone)]
pub struct SharingTools {
    /// MPS control daemons.
    pub mps: MpsController,
    /// Time-slice intervals.
    pub timeslice: TimesliceControl,
}

impl SharingTools {
    /// The MPS servers on disk, as observed state.
    pub fn mps_servers(&self) -> Vec<MpsServerState> {
        self.mps
            .daemons()
            .into_iter()
            .map(|s| MpsServerState {
                uuid: s.record.uuid,
                gpu: s.record.gpu,
                placement_start: s.record.placement_start,
                compute_instance: s.record.compute_instance,
                limits: s.record.limits,
                pid: s.pid,
                restarts: s.record.restarts,
                clients: Vec::new(),
                clients_read: false,
            })
            .collect()
    }

    /// Fills in the clients of the running `servers`: one control query each, run side by
    /// side. A server that does not answer is left with none (it serves no one either).
    pub fn read_mps_clients(&self, servers: &mut [MpsServerState]) {
        self.read_mps_clients_where(servers, |_| true);
    }

    /// [`Self::read_mps_clients`] for the running servers that `wanted` picks only.
    pub fn read_mps_clients_where(
        &self,
        servers: &mut [MpsServerState],
        wanted: impl Fn(&MpsServerState) -> bool,
    ) {
        std::thread::scope(|scope| {
            for server in servers.iter_mut().filter(|s| s.pid.is_some() && wanted(s)) {
                scope.spawn(move || match self.mps.client_pids(&server.uuid) {
                    Ok(pids) => {
                        server.clients = pids;
                        server.clients_read = true;
                    }
                    Err(e) => tracing::debug!("MPS clients of {} unknown: {e}", server.uuid),
                });
            }
        });
    }

    /// The time-slice interval of every GPU, by index (one nvidia-smi run).
    pub fn timeslices(&self) -> Result<BTreeMap<u32, TimeSliceInterval>, SharingError> {
        Ok(self.timeslice.read_all()?.into_iter().collect())
    }
}

/// What kind of failure a [`SharingError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharingErrorKind {
    /// The tool could not be started (missing, not executable).
    CannotRun,
    /// The tool ran past its time limit and was killed.
    TimedOut,
    /// The tool failed or answered with an error.
    Failed,
    /// A limit did not take: the daemon reports another value than the one set.
    NotApplied,
    /// A server's files could not be written or removed.
    Files,
    /// A control daemon already runs where a new one was to start.
    AlreadyRunning,
    /// The process is no client of an MPS server gpushare runs.
    NotAClient,
    /// The device a server was to serve does not exist (yet).
    NoDevice,
}

/// An MPS or time-slicing failure: its kind, and one line for people.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SharingError {
    /// What kind of failure.
    pub kind: SharingErrorKind,
    /// What happened, naming the device and the tool.
    pub message: String,
}

impl SharingError {
    /// A failure of `kind`, told by `message`.
    pub fn new(kind: SharingErrorKind, message: impl Into<String>) -> Self {
        SharingError { kind, message: message.into() }
    }
}
