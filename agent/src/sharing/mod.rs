//! The sharing gpushare sets up on GPUs and MIG instances besides the hardware's
//! own state: MPS control daemons ([`mps`]), time-slice intervals ([`timeslice`]), and the
//! supervision that restarts daemons that died ([`supervisor`]). The tools run as external
//! programs (`nvidia-cuda-mps-control`, `nvidia-smi`) through [`crate::sys::command`].

pub mod mps;
pub mod supervisor;
pub mod timeslice;

use std::collections::BTreeMap;

use crate::node::{
    LiveLimits, LiveServer, MpsServerDetail, MpsServerState, NodeState, TimeSliceInterval,
};
use crate::sys::procfs;
use mps::{LiveRead, MpsController};
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
    /// The MPS servers on disk, as observed state, and what their records say besides
    /// (configured limits, mode, overrides), by device UUID; nothing read live.
    pub fn mps_observed(&self) -> (Vec<MpsServerState>, BTreeMap<String, MpsServerDetail>) {
        let mut details = BTreeMap::new();
        let servers = self
            .mps
            .daemons()
            .into_iter()
            .map(|s| {
                let detail = MpsServerDetail::configured(s.record.spec(), s.record.overrides);
                details.insert(s.record.uuid.clone(), detail);
                MpsServerState {
                    uuid: s.record.uuid,
                    gpu: s.record.gpu,
                    placement_start: s.record.placement_start,
                    compute_instance: s.record.compute_instance,
                    limits: s.record.limits,
                    pid: s.pid,
                    restarts: s.record.restarts,
                    clients: Vec::new(),
                    clients_read: false,
                }
            })
            .collect();
        (servers, details)
    }

    /// Fills in the clients of the running `servers` that `wanted` picks: one control
    /// query each, run side by side. A server that does not answer is left with none (it
    /// serves no one either).
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

    /// Reads the live limits of every running server of `node` (and the clients of those
    /// `with_clients` picks) from its control daemon: one control run each, side by side; a
    /// server whose limits were read already and whose clients are not wanted (or read) is
    /// not asked again. Each server process's user is told too ([`server_user`]). A daemon
    /// that does not answer is left as observed (nothing live; no clients read).
    pub fn read_mps_live(
        &self,
        node: &mut NodeState,
        with_clients: impl Fn(&MpsServerState) -> bool + Sync,
    ) {
        let details = &node.mps_details;
        let wanted = |s: &MpsServerState| with_clients(s) && !s.clients_read;
        // What a fresh read answers needs no thread: only the others ask their daemons
        // (and, the cache just looked at, ask them now).
        let mut fresh = Vec::new();
        let mut asked: Vec<(usize, &MpsServerState, &MpsServerDetail)> = Vec::new();
        for (i, server) in node.mps.iter().enumerate().filter(|(_, s)| s.pid.is_some()) {
            let Some(detail) = details.get(&server.uuid) else { continue };
            if detail.live.is_some() && !wanted(server) {
                continue;
            }
            match (!wanted(server)).then(|| self.mps.fresh_read(&server.uuid)).flatten() {
                Some(read) => fresh.push((i, false, Ok(read))),
                None => asked.push((i, server, detail)),
            }
        }
        let mut reads: Vec<(usize, bool, Result<LiveRead, SharingError>)> =
            std::thread::scope(|scope| {
                let handles: Vec<_> = asked
                    .into_iter()
                    .map(|(i, server, detail)| {
                        let clients = wanted(server);
                        let read = scope
                            .spawn(move || self.mps.read_live_now(&server.uuid, detail, clients));
                        (i, clients, read)
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|(i, clients, handle)| {
                        let read = handle.join().unwrap_or_else(|_| {
                            Err(SharingError::new(SharingErrorKind::Failed, "the read panicked"))
                        });
                        (i, clients, read)
                    })
                    .collect()
            });
        reads.extend(fresh);
        for (i, with_clients, read) in reads {
            let server = &node.mps[i];
            let read = match read {
                Ok(read) => read,
                Err(e) => {
                    tracing::debug!("MPS limits of {} unknown: {e}", server.uuid);
                    // A control tool that does not answer the limit queries may still
                    // list clients.
                    if with_clients && let Ok(pids) = self.mps.client_pids(&server.uuid) {
                        let server = &mut node.mps[i];
                        server.clients = pids;
                        server.clients_read = true;
                    }
                    continue;
                }
            };
            let daemon = server.pid;
            let multi_user = node.mps_details.get(&server.uuid).is_some_and(|d| d.multi_user);
            let served_by = |pid: u32| {
                server_user(pid, daemon)
                    .or_else(|| multi_user.then(|| daemon.and_then(procfs::real_user)).flatten())
            };
            let servers: Vec<LiveServer> = read
                .servers
                .iter()
                .map(|&(pid, limits)| LiveServer { pid, uid: served_by(pid), limits })
                .collect();
            let live = LiveLimits { defaults: read.defaults, servers };
            let uuid = server.uuid.clone();
            if let Some(pids) = read.clients.filter(|_| with_clients) {
                let server = &mut node.mps[i];
                server.clients = pids;
                server.clients_read = true;
            }
            if let Some(detail) = node.mps_details.get_mut(&uuid) {
                detail.live = Some(live);
            }
        }
        fill_users_from_clients(node);
    }

    /// The time-slice interval of every GPU, by index (one nvidia-smi run).
    pub fn timeslices(&self) -> Result<BTreeMap<u32, TimeSliceInterval>, SharingError> {
        Ok(self.timeslice.read_all()?.into_iter().collect())
    }
}

/// The user MPS server process `pid` runs as, when it is one: a process whose program
/// (`/proc/PID/exe`, which only the kernel sets) is `nvidia-cuda-mps-server` and whose
/// parent is the control daemon `daemon`. The simulated daemon's servers are no processes:
/// their users are told from their clients ([`fill_users_from_clients`]).
fn server_user(pid: u32, daemon: Option<u32>) -> Option<u32> {
    // One open of the process's directory for all three: a pid reused in between cannot
    // lend another process's answers.
    let process = procfs::Process::open(std::path::Path::new("/proc"), pid)?;
    let server = process.program()?.name.starts_with("nvidia-cuda-mps-server");
    let owner = process.owner()?;
    (server && daemon.is_some() && owner.parent == daemon).then_some(owner.uid)
}

/// The user of each live server process of a single-user daemon whose user is not known
/// yet, told from its clients: such a server serves one user's clients only, so when they
/// all run as one user, that is the server's. The clients are the control daemon's `ps`
/// where it was asked, else those the driver names MPS clients on the server's GPU, or
/// its GPU instance when one server serves it.
fn fill_users_from_clients(node: &mut NodeState) {
    let mut found = Vec::new();
    for server in node.mps.iter().filter(|s| s.pid.is_some()) {
        let Some(detail) = node.mps_details.get(&server.uuid) else { continue };
        if detail.multi_user
            || detail.live.as_ref().is_none_or(|l| l.servers.iter().all(|s| s.uid.is_some()))
        {
            continue;
        }
        let pids: Vec<u32> = if server.clients_read {
            server.clients.clone()
        } else {
            driver_named_clients(node, server)
        };
        let mut users: Vec<u32> = pids.iter().filter_map(|&pid| procfs::real_user(pid)).collect();
        users.sort_unstable();
        users.dedup();
        if let [uid] = users.as_slice() {
            found.push((server.uuid.clone(), *uid));
        }
    }
    for (uuid, uid) in found {
        let live = node.mps_details.get_mut(&uuid).and_then(|d| d.live.as_mut());
        for s in live.into_iter().flat_map(|l| l.servers.iter_mut()).filter(|s| s.uid.is_none()) {
            s.uid = Some(uid);
        }
    }
}

/// The processes the driver names MPS clients where `server` serves: its whole GPU, or
/// its GPU instance when no other server of the agent serves that instance.
fn driver_named_clients(node: &NodeState, server: &MpsServerState) -> Vec<u32> {
    let Some(gpu) = node.gpu(server.gpu).filter(|g| g.mps_clients_named) else {
        return Vec::new();
    };
    let instance = match server.placement_start {
        None => None,
        Some(start) => {
            let shared = node.mps.iter().filter(|s| {
                s.gpu == server.gpu && s.placement_start == Some(start) && s.pid.is_some()
            });
            if shared.count() > 1 {
                return Vec::new();
            }
            match gpu.instances.iter().find(|gi| gi.placement_start == start) {
                Some(gi) => Some(gi.id),
                None => return Vec::new(),
            }
        }
    };
    gpu.processes
        .iter()
        .filter(|p| p.mps_client && p.gpu_instance_id == instance)
        .map(|p| p.pid)
        .collect()
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
    /// The control daemon refused a setting (it takes them only from the user who started
    /// it and root).
    Refused,
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
