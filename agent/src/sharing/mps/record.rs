//! What the agent keeps of each MPS server (`<root>/<uuid>/server.json`, root's alone):
//! what it asked for, the daemon it started (pid and start time), the overrides `mps
//! limit` made; and how the daemon of a pipe directory is told from any other process
//! (the world-writable pid file is read only while the directory is still private).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::PID_FILE;
use crate::node::{LimitOverride, MpsLimits, MpsSpec};
use crate::sys::procfs::{self, alive};
use crate::sys::{trusted, unix};

/// What the agent asked of one server, kept in `server.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerRecord {
    /// `GPU-…` or `MIG-…` the daemon serves (its `CUDA_VISIBLE_DEVICES`).
    pub uuid: String,
    /// GPU index.
    pub gpu: u32,
    /// Placement start of the MIG instance; `None` for a whole GPU.
    pub placement_start: Option<u8>,
    /// Which compute instance of that GPU instance, by index (0 for one used whole, and in
    /// records written before compute instances could be subdivided).
    #[serde(default)]
    pub compute_instance: u8,
    /// Limits set on the daemon as its defaults: the profile's.
    pub limits: MpsLimits,
    /// Whether the daemon was started in multi-user mode (`-M`). Missing in records of
    /// agents before the mode existed: they started every daemon without it.
    #[serde(default)]
    pub multi_user: bool,
    /// How often the supervisor restarted it.
    #[serde(default)]
    pub restarts: u32,
    /// The daemon started for it, once it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon: Option<DaemonIdentity>,
    /// The overrides `gpushare-ctl mps limit` made on its server processes, the latest
    /// last; those of servers that no longer run are dropped when next written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<LimitOverride>,
}

impl ServerRecord {
    /// What the daemon is started with.
    pub fn spec(&self) -> MpsSpec {
        MpsSpec { limits: self.limits, multi_user: self.multi_user }
    }
}

/// The daemon started for a server: one process for good, as `server.json` keeps it.
pub use crate::sys::procfs::ProcessIdentity as DaemonIdentity;

/// Why the MPS root is not used, with the consequence and the setting.
pub(super) fn untrusted_root(why: String) -> String {
    format!("{why}: another user could forge the servers' records (set [mps] root in agent.toml)")
}

/// The `server.json` of server directory `dir` (`None` when there is none, or it does not
/// read); `Err` when the directory or the file is not one the agent may trust, which is
/// ignored with a warning.
pub(super) fn trusted_record(dir: &Path) -> Result<Option<ServerRecord>, ()> {
    match crate::sys::files::read_record(dir, "server.json") {
        Ok(record) => Ok(record),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            trusted::warn_ignored(format!("MPS server ignored: {}", untrusted_root(e.to_string())));
            Err(())
        }
        Err(_) => Ok(None),
    }
}

/// The pid the daemon's pid file names (whoever wrote it: the file is world-writable).
pub(super) fn pid_file(pipe_dir: &Path) -> Option<u32> {
    use std::io::Read;
    // A pid is a few digits; whatever else another user wrote there is not read.
    let mut text = String::new();
    std::fs::File::open(pipe_dir.join(PID_FILE)).ok()?.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// The daemon of a pipe directory whose record does not name it: the pid file's process,
/// only if it is this agent's user's and its environment names this pipe directory (which
/// no process of another user, nor any other root process, has).
pub(super) fn legacy_daemon(pipe_dir: &Path) -> Option<DaemonIdentity> {
    let pid = pid_file(pipe_dir).filter(|&pid| alive(pid))?;
    // One open of the process's directory for every question (a reused pid cannot mix two
    // processes), and its environment read within a bound.
    let process = procfs::Process::open(Path::new("/proc"), pid)?;
    if process.owner()?.uid != unix::effective_uid() {
        return None;
    }
    // An MPS control daemon's executable (NVIDIA's, or the simulator's under either name),
    // not any program of the agent's user that kept such an environment.
    if !process.program()?.name.ends_with("nvidia-cuda-mps-control") {
        return None;
    }
    let named = process.environment_variable("CUDA_MPS_PIPE_DIRECTORY")?;
    (Path::new(&named) == pipe_dir).then(|| DaemonIdentity::of(pid)).flatten()
}
