//! How a replica's gate ([`super::gate`]) is started, and how the agent holds it: as a
//! transient systemd service in the caller's slice (the agent runs as root under
//! systemd), or as a child forked into a session of its own (anywhere else), with a
//! service's default limit of open files rather than the agent's and, where the agent's
//! cgroup (v2) is writable, in a cgroup of its own below it. The gate's descriptors are the
//! same either way: 0 its control socket, 1 the report pipe. See DESIGN.md, "Replicas are
//! the user's own processes".

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::apply::journal::ReplicaHandle;
use crate::sys::procfs;
use crate::sys::systemd::{Systemd, TransientService};
use crate::sys::unix::{self, Identity, Signal};

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
    /// A child of the agent, which leads its own session, and the cgroup of its own it
    /// was moved into where the agent could make one; reaped by [`Launcher::reap`].
    Child(Child, Option<PathBuf>),
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
            Gate::Child(child, None) => procfs::session_members(child.id(), uid),
            Gate::Child(_, Some(dir)) => cgroup_dir_processes(dir),
            Gate::Unit { cgroup, .. } => cgroup_processes(cgroup),
        }
    }

    /// The last resort when a gate does not stop its replica: SIGKILL to everything of it
    /// (its unit's cgroup; or what runs below the gate, its session's processes of user
    /// `uid` and the gate).
    pub fn kill(&self, gate: &Gate, uid: u32) {
        match (self, gate) {
            (_, Gate::Child(child, cgroup)) => {
                kill_tree(child.id(), uid);
                // The gate itself, whoever it is by now: a child not yet reaped, so its pid
                // is still its own.
                let _ = unix::kill(child.id(), false);
                if let Some(dir) = cgroup {
                    kill_cgroup(dir);
                }
            }
            (Launcher::Systemd(launcher), Gate::Unit { name, .. }) => {
                let killed =
                    launcher.runtime.block_on(launcher.systemd.kill_all(name, Signal::SIGKILL));
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
        if let Gate::Child(mut child, cgroup) = gate {
            kill_tree(child.id(), uid);
            // Never waited for while it could still run (one stopped before it became the
            // caller is not the caller's to sweep): a child not yet reaped keeps its pid.
            let _ = child.kill();
            let _ = child.wait();
            if let Some(dir) = cgroup {
                remove_cgroup(&dir);
            }
        }
    }

    /// How the journal keeps `gate`.
    pub fn handle(gate: &Gate) -> Option<ReplicaHandle> {
        match gate {
            Gate::Child(child, _) => Some(ReplicaHandle::Session {
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
        match self {
            Launcher::Systemd(launcher) => stopped += launcher.stop_all(),
            Launcher::Direct => stopped += stop_left_cgroups(),
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
            let _ = self.runtime.block_on(self.systemd.kill_all(unit, Signal::SIGKILL));
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
    with_service_limits(&mut command);
    let child = command.spawn().map_err(|e| format!("starting {program}: {e}"))?;
    // The gate waits for its spec, which is sent once this returns: it has started
    // nothing yet when it is moved.
    let cgroup = own_cgroup(child.id(), start.label);
    Ok(Gate::Child(child, cgroup))
}

/// A service's default limit of open files, as systemd gives one
/// (`DefaultLimitNOFILE=1024:524288`), never more than the agent's hard limit: a replica
/// without systemd gets neither the agent's raised soft limit nor root's hard one. The
/// other limits are the agent's (see DESIGN.md: the caller's own cannot be known).
fn with_service_limits(command: &mut Command) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let hook = || -> std::io::Result<()> {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
        let hard = hard.min(SERVICE_NOFILE_HARD);
        setrlimit(Resource::RLIMIT_NOFILE, SERVICE_NOFILE_SOFT.min(hard), hard)?;
        Ok(())
    };
    // SAFETY: the hook makes two async-signal-safe system calls (getrlimit, setrlimit) and
    // allocates nothing; lowering limits is always allowed.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(command, hook);
    }
}

/// systemd's `DefaultLimitNOFILE=1024:524288` (since v240).
const SERVICE_NOFILE_SOFT: u64 = 1024;
const SERVICE_NOFILE_HARD: u64 = 524_288;
/// The name every gate's own cgroup starts with (`gpushare-bench-<agent pid>-<job>-<n>`).
const CGROUP_PREFIX: &str = "gpushare-bench-";

/// The agent's own cgroup directory, when it is in a cgroup v2 hierarchy it may write
/// (root in a container with its own cgroup namespace, or a delegated subtree): where the
/// gates' cgroups go. Found once; `None` (said once in the log) where there is none.
fn cgroup_parent() -> Option<&'static Path> {
    static PARENT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    PARENT
        .get_or_init(|| {
            let found = agent_cgroup();
            match &found {
                Ok(dir) => tracing::info!(
                    "bench replicas without systemd run in cgroups of their own under {}",
                    dir.display()
                ),
                Err(why) => tracing::info!(
                    "bench replicas without systemd stay in the agent's cgroup: {why}"
                ),
            }
            found.ok()
        })
        .as_deref()
}

/// The agent's cgroup v2 directory, if it may make cgroups in it.
fn agent_cgroup() -> Result<PathBuf, String> {
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("/proc/self/cgroup: {e}"))?;
    let path = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or("the agent is in no cgroup v2 hierarchy")?;
    let mount = cgroup2_mount().ok_or("no cgroup v2 hierarchy is mounted")?;
    let dir = mount.join(path.trim().trim_start_matches('/'));
    if !dir.join("cgroup.procs").is_file() {
        return Err(format!("{} is no cgroup v2 directory", dir.display()));
    }
    unix::may_write_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or its `unified` mount on
/// a hybrid host), from `/proc/self/mountinfo`.
fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|line| {
        let (fields, rest) = line.split_once(" - ")?;
        (rest.split_whitespace().next()? == "cgroup2")
            .then(|| fields.split_whitespace().nth(4).map(PathBuf::from))?
    })
}

/// Moves process `pid` (a gate that has started nothing yet) into a new cgroup of its own
/// under the agent's; the cgroup, or `None` where that cannot be done (said in the log).
fn own_cgroup(pid: u32, label: &str) -> Option<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let parent = cgroup_parent()?;
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = parent.join(format!("{CGROUP_PREFIX}{}-{label}-{n}", std::process::id()));
    let moved = std::fs::create_dir(&dir)
        .and_then(|()| std::fs::write(dir.join("cgroup.procs"), pid.to_string()));
    match moved {
        Ok(()) => Some(dir),
        Err(e) => {
            tracing::warn!(
                "a bench replica stays in the agent's cgroup: moving it to {}: {e}",
                dir.display()
            );
            let _ = std::fs::remove_dir(&dir);
            None
        }
    }
}

/// SIGKILL to everything in a gate's cgroup: at once through `cgroup.kill` (Linux 5.14),
/// else each process (only the gate and what it started can be there: no user may move
/// a process into a cgroup of root's).
fn kill_cgroup(dir: &Path) {
    if std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    for pid in cgroup_dir_processes(dir) {
        if let Some(fd) = unix::pidfd_open(pid) {
            let _ = unix::pidfd_kill(&fd);
        }
    }
}

/// Removes a gate's cgroup once it is empty (what was killed in it may take a moment to
/// be gone).
fn remove_cgroup(dir: &Path) {
    for _ in 0..50 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => {
                kill_cgroup(dir);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    tracing::warn!("the bench replica's cgroup {} is not empty; left as it is", dir.display());
}

/// Kills and removes the gates' cgroups an agent that is gone left (the names carry the
/// agent's pid: those of an agent that runs, this one or another beside it, are left
/// alone); how many there were.
fn stop_left_cgroups() -> usize {
    let Some(parent) = cgroup_parent() else { return 0 };
    let Ok(entries) = std::fs::read_dir(parent) else { return 0 };
    let mut stopped = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let agent = name
            .strip_prefix(CGROUP_PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        if agent.is_some_and(|pid| !procfs::alive(pid)) {
            tracing::warn!("stopping a replica's cgroup left over from an earlier agent: {name}");
            kill_cgroup(&entry.path());
            remove_cgroup(&entry.path());
            stopped += 1;
        }
    }
    stopped
}

/// SIGKILL to what runs below gate `gate` (first: they are its to reap, a subreaper's,
/// and would go to init once it died), then to every process of its session `gate` that
/// runs as `uid`, the gate among them.
fn kill_tree(gate: u32, uid: u32) {
    for pid in procfs::descendants(gate) {
        kill_if_of(pid, uid);
    }
    for pid in procfs::session_members(gate, uid) {
        kill_if_of(pid, uid);
    }
}

/// SIGKILL to process `pid` if it runs as `uid`, through a pidfd opened before the check:
/// the process checked is the process signalled (by a pid alone, one that ended between
/// the check and the kill could have been replaced by another user's of the same pid; a
/// pidfd of a process that ended signals nothing). Where the kernel has no pidfds
/// (before Linux 5.3), by pid as before.
fn kill_if_of(pid: u32, uid: u32) {
    let pidfd = unix::pidfd_open(pid);
    if procfs::real_user(pid) != Some(uid) {
        return;
    }
    let _ = match &pidfd {
        Some(fd) => unix::pidfd_kill(fd),
        None => unix::signal(pid, Signal::SIGKILL),
    };
}

/// The processes of cgroup `cgroup` (as systemd names it, from the hierarchy's root).
fn cgroup_processes(cgroup: &str) -> Vec<u32> {
    let dir: PathBuf = [CGROUP_ROOT, cgroup.trim_start_matches('/')].iter().collect();
    cgroup_dir_processes(&dir)
}

/// The processes of the cgroup directory `dir`.
fn cgroup_dir_processes(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_is_killed_only_where_it_runs_as_its_user() {
        let own = unix::effective_uid();
        let mut command = Command::new("sleep");
        command.arg("60");
        unix::in_new_session(&mut command);
        let mut child = command.spawn().unwrap();
        // Another user's: nothing is signalled.
        kill_tree(child.id(), own.wrapping_add(1));
        std::thread::sleep(Duration::from_millis(50));
        assert!(child.try_wait().unwrap().is_none(), "a process of another user was killed");
        kill_tree(child.id(), own);
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(Signal::SIGKILL as i32));
    }
}
