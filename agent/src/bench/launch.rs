//! How a replica's gate ([`super::gate`]) is started, and how the agent holds it: as a
//! transient systemd service in the caller's slice (the agent runs as root under
//! systemd), or as a child forked into a session of its own (anywhere else). The gate's
//! descriptors are the same either way: 0 its control socket, 1 the report pipe. See
//! DESIGN.md, "Replicas are the user's own processes".

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::apply::journal::ReplicaHandle;
use crate::sys::procfs;
use crate::sys::systemd::{Systemd, TransientService};
use crate::sys::unix::{self, Identity};

/// The units a bench starts: `gpushare-bench-<agent pid>-<job>-<n>.service` (the agent's
/// pid keeps a new agent's names apart from units an earlier one left).
pub const UNIT_PATTERN: &str = "gpushare-bench-*.service";
/// Where the cgroup2 hierarchy is mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// How gates are started.
#[derive(Debug)]
pub enum Launcher {
    /// Forked by the agent into a new session (`setsid`).
    Direct,
    /// Transient services of the system's systemd.
    Systemd(SystemdLauncher),
}

/// Transient units through systemd's D-Bus API, called from the bench's blocking threads.
#[derive(Debug)]
pub struct SystemdLauncher {
    systemd: Systemd,
    runtime: tokio::runtime::Handle,
    next: AtomicU64,
}

/// What a gate is started with.
#[derive(Debug)]
pub struct GateStart<'a> {
    /// The gate's program: this binary.
    pub program: &'a Path,
    /// Whom it becomes; `None`: it stays the agent's user.
    pub identity: Option<&'a Identity>,
    /// Its descriptor 0, the control socket.
    pub control: OwnedFd,
    /// Its descriptor 1, the report pipe's write end.
    pub report: OwnedFd,
    /// Names the unit (`7` → `gpushare-bench-<agent pid>-7-<n>.service`): the job's number.
    pub label: &'a str,
    /// For `systemctl status`.
    pub description: String,
    /// The longest the unit may live.
    pub runtime_max: Duration,
}

/// A gate the launcher started.
#[derive(Debug)]
pub enum Gate {
    /// A child of the agent, which leads its own session; reaped by [`Launcher::reap`].
    Child(Child),
    /// A transient unit.
    Unit {
        /// Its name.
        name: String,
        /// Its cgroup (`/user.slice/user-1000.slice/<name>`), known from its slice and name:
        /// systemd realizes it only when the start job runs, so asking right after the
        /// start may find none yet.
        cgroup: String,
    },
}

impl Launcher {
    /// Systemd's launcher when the agent runs as root under systemd and systemd answers on
    /// the system bus, else [`Launcher::Direct`]; with the reason, for the log. Call it
    /// from the runtime the bench's threads will use.
    pub async fn detect() -> (Launcher, String) {
        if std::env::var_os("INVOCATION_ID").is_none() {
            return (Launcher::Direct, "the agent does not run as a systemd service".into());
        }
        if !unix::is_root() {
            return (Launcher::Direct, "the agent does not run as root".into());
        }
        if !Path::new("/run/systemd/system").is_dir() {
            return (Launcher::Direct, "systemd is not the service manager".into());
        }
        match Systemd::connect().await {
            Ok(systemd) => (
                Launcher::Systemd(SystemdLauncher {
                    systemd,
                    runtime: tokio::runtime::Handle::current(),
                    next: AtomicU64::new(1),
                }),
                "transient units of systemd in the caller's slice".into(),
            ),
            Err(e) => (Launcher::Direct, format!("systemd does not answer on the system bus: {e}")),
        }
    }

    /// Starts a gate. Blocking (call it from a blocking thread).
    pub fn start(&self, start: GateStart<'_>) -> Result<Gate, String> {
        match self {
            Launcher::Direct => start_child(start),
            Launcher::Systemd(launcher) => launcher.start(start),
        }
    }

    /// The processes of `gate` now (its unit's cgroup, or its session's processes of
    /// user `uid`).
    pub fn processes(&self, gate: &Gate, uid: u32) -> Vec<u32> {
        match gate {
            Gate::Child(child) => procfs::session_members(child.id(), uid),
            Gate::Unit { cgroup, .. } => cgroup_processes(cgroup),
        }
    }

    /// The last resort when a gate does not stop its replica: SIGKILL to everything of it
    /// (its unit's cgroup; or what runs below the gate, its session's processes of user
    /// `uid` and the gate).
    pub fn kill(&self, gate: &Gate, uid: u32) {
        match (self, gate) {
            (_, Gate::Child(child)) => kill_tree(child.id(), uid),
            (Launcher::Systemd(launcher), Gate::Unit { name, .. }) => {
                let killed =
                    launcher.runtime.block_on(launcher.systemd.kill_all(name, libc::SIGKILL));
                if let Err(e) = killed {
                    tracing::debug!(unit = %name, "SIGKILL to the replica's unit: {e}");
                }
            }
            (Launcher::Direct, Gate::Unit { .. }) => {}
        }
    }

    /// Reaps a gate the agent forked, after a last sweep of its session (a gate its user
    /// killed leaves its command there): until now its zombie kept the session id from
    /// being reused.
    pub fn reap(&self, gate: Gate, uid: u32) {
        if let Gate::Child(mut child) = gate {
            kill_tree(child.id(), uid);
            let _ = child.wait();
        }
    }

    /// How the journal keeps `gate`.
    pub fn handle(gate: &Gate) -> Option<ReplicaHandle> {
        match gate {
            Gate::Child(child) => Some(ReplicaHandle::Session {
                pid: child.id(),
                start_time: procfs::start_time(child.id())?,
            }),
            Gate::Unit { name, .. } => Some(ReplicaHandle::Unit { name: name.clone() }),
        }
    }

    /// Stops replicas an earlier agent left running: those of `handles` (user `uid`), and
    /// under systemd every bench unit still loaded. Returns how many it stopped.
    pub fn stop_left_over(&self, handles: &[ReplicaHandle], uid: u32) -> usize {
        let mut stopped = 0;
        for handle in handles {
            if let ReplicaHandle::Session { pid, start_time } = handle {
                // While a process of the gate's pid exists, the session of that id is the
                // gate's only if that process is the gate (same start). Once no process
                // has the pid, no new session can have its id, so the processes left in
                // the session are the replica's (of that user).
                match procfs::start_time(*pid) {
                    Some(started) if started != *start_time => continue,
                    _ => {}
                }
                if !procfs::session_members(*pid, uid).is_empty() || procfs::alive(*pid) {
                    kill_tree(*pid, uid);
                    stopped += 1;
                }
            }
        }
        if let Launcher::Systemd(launcher) = self {
            stopped += launcher.stop_all();
        }
        stopped
    }
}

impl SystemdLauncher {
    fn start(&self, start: GateStart<'_>) -> Result<Gate, String> {
        let plain = |s: &str| s.chars().all(|c| c.is_ascii_alphanumeric());
        if !plain(start.label) {
            return Err(format!("`{}` cannot name a unit", start.label));
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("gpushare-bench-{}-{}-{n}.service", std::process::id(), start.label);
        let uid = start.identity.map_or(0, |i| i.uid);
        let slice = format!("user-{uid}.slice");
        // Systemd's slice names are paths: `user-1000.slice` lies below `user.slice`.
        let cgroup = format!("/user.slice/{slice}/{name}");
        let program = start.program.to_str().ok_or("the agent's path is not UTF-8")?;
        let service = TransientService {
            name: name.clone(),
            description: start.description,
            slice,
            argv: gate_arguments(program, start.identity),
            stdin: start.control,
            stdout: start.report,
            runtime_max: start.runtime_max,
        };
        self.runtime
            .block_on(self.systemd.start_service(service))
            .map_err(|e| format!("starting the unit {name}: {e}"))?;
        Ok(Gate::Unit { name, cgroup })
    }

    /// Stops every bench unit still loaded; how many there were.
    fn stop_all(&self) -> usize {
        let units = match self.runtime.block_on(self.systemd.units_matching(UNIT_PATTERN)) {
            Ok(units) => units,
            Err(e) => {
                tracing::warn!("listing bench units left over: {e}");
                return 0;
            }
        };
        for unit in &units {
            tracing::warn!(unit = %unit, "stopping a replica left over from an earlier agent");
            let _ = self.runtime.block_on(self.systemd.kill_all(unit, libc::SIGKILL));
            let _ = self.runtime.block_on(self.systemd.stop(unit));
        }
        units.len()
    }
}

/// `gpushare-agent --bench-gate [--bench-user UID:GID:G,...]`.
fn gate_arguments(program: &str, identity: Option<&Identity>) -> Vec<String> {
    let mut argv = vec![program.to_string(), "--bench-gate".to_string()];
    if let Some(identity) = identity {
        argv.push("--bench-user".into());
        argv.push(identity.to_arg());
    }
    argv
}

/// Forks the gate into a new session: no controlling terminal, nothing of the agent's
/// environment, its stderr discarded (what it has to say goes over the socket).
fn start_child(start: GateStart<'_>) -> Result<Gate, String> {
    let program = start.program.to_str().ok_or("the agent's path is not UTF-8")?;
    let argv = gate_arguments(program, start.identity);
    let mut command = Command::new(start.program);
    command
        .args(&argv[1..])
        .env_clear()
        .stdin(Stdio::from(start.control))
        .stdout(Stdio::from(start.report))
        .stderr(Stdio::null());
    unix::in_new_session(&mut command);
    unix::with_open_files_at_start(&mut command);
    command.spawn().map(Gate::Child).map_err(|e| format!("starting {program}: {e}"))
}

/// SIGKILL to what runs below gate `gate` (first: they are its to reap, a subreaper's,
/// and would go to init once it died), then to every process of its session `gate` that
/// runs as `uid`, the gate among them.
fn kill_tree(gate: u32, uid: u32) {
    for pid in procfs::descendants(gate) {
        if procfs::real_user(pid) == Some(uid) {
            let _ = unix::signal(pid, libc::SIGKILL);
        }
    }
    for pid in procfs::session_members(gate, uid) {
        let _ = unix::signal(pid, libc::SIGKILL);
    }
}

/// The processes of cgroup `cgroup` (as systemd names it, from the hierarchy's root).
fn cgroup_processes(cgroup: &str) -> Vec<u32> {
    let file: PathBuf =
        [CGROUP_ROOT, cgroup.trim_start_matches('/'), "cgroup.procs"].iter().collect();
    std::fs::read_to_string(file)
        .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}
