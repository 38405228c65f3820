//! MPS control daemons: one `nvidia-cuda-mps-control` per shared GPU or MIG instance.
//!
//! Each server lives in `<root>/<uuid>/`: `pipe/` (the daemon's pipe directory, which
//! clients point `CUDA_MPS_PIPE_DIRECTORY` at), `log/`, and `server.json` (what the agent
//! asked for: device, limits, restarts, and the daemon it started). The pipe directory is
//! created `0700`, so that no client can reach the daemon until its limits are set *and
//! read back*; then it becomes `0755`. Daemons are started with `-d` and outlive the
//! agent: the agent finds them again at start-up from `server.json` (that is the adoption
//! mechanism), and `<root>` sits under `/run`, which a reboot empties just as it ends the
//! daemons.
//!
//! **Which process is the daemon.** The daemon's pid file is world-writable (`0666`, on a
//! real H100 too), so it is read once, while the pipe directory is still `0700` and no one
//! but root can reach it, and the pid with the process's start time goes into the
//! root-owned `server.json`. From then on the daemon is that pid *and* that start time; the
//! pid file is never read again, and a signal goes only to a process whose start time
//! still matches (through a pidfd held across the check); once read, the pid file is made
//! `0644`. A record from an agent before this (no daemon in it) is trusted only for an MPS
//! control daemon's executable of the agent's user whose environment names this pipe
//! directory.
//!
//! How a daemon is started ([`MpsLaunch`]): when the agent runs as a systemd service with
//! the packaged root, as an instance of `gpushare-mps@.service` (`systemctl start
//! gpushare-mps@<uuid>.service`), so that each daemon and its servers live in a cgroup and
//! sandbox of their own, outside the agent's: an agent restart neither kills them nor
//! finds them as left-over processes of its own unit. Anywhere else, `-d` from the agent.
//!
//! Commands go to the daemon the way NVIDIA documents: written to the stdin of a second
//! `nvidia-cuda-mps-control` run with the same pipe directory. The control tool exits 0
//! even for values it refuses (it answers the unchanged value), so every limit is read back
//! and compared.
//!
//! A daemon serves one user at a time (NVIDIA's default: a client of another user waits
//! until the running server's clients are gone, and then gets a server of its own with the
//! daemon's default limits), or, started with `-M` (a profile's `multi_user`), every user's
//! clients at once through one server running as the daemon's user.
//!
//! This module starts, stops and finds daemons; `record.rs` is the record each server
//! keeps (`server.json`) and which process is its daemon; `limits.rs` reads the limits the
//! daemon answers now (the live limits), sets a server's, and puts drifted ones back.

mod limits;
mod record;
#[cfg(test)]
mod tests;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{SharingError, SharingErrorKind as Kind};
use crate::node::mps_memory_value;
use crate::sys::command::{Command, Finished, find_program};
use crate::sys::files::{PRIVATE, write_json};
use crate::sys::procfs::alive;
use crate::sys::{trusted, unix};
pub use limits::{LiveRead, Restored};
use limits::{parse_percentage, pinned_limit_reads_back};
pub use record::{DaemonIdentity, ServerRecord};
use record::{legacy_daemon, pid_file, trusted_record, untrusted_root};

/// How long a control command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new daemon may take to write its pid file, or a stopped one to exit.
const START_STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// The control daemon's pid file in the pipe directory.
const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// The environment the `gpushare-mps@.service` instance reads, in the server directory.
const SERVICE_ENV_FILE: &str = "service.env";
/// The root `gpushare-mps@.service` has its paths under.
pub const UNIT_ROOT: &str = "/run/gpushare/mps";
/// The template unit that runs one control daemon.
const UNIT_TEMPLATE: &str = "gpushare-mps@.service";
/// Where systemd looks for the template (administrator's first, then the package's).
const UNIT_DIRS: [&str; 3] =
    ["/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system"];

/// Where the daemons live and which binary runs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsConfig {
    /// `nvidia-cuda-mps-control` (a bare name is looked up on `PATH`).
    pub control: PathBuf,
    /// Directory of the servers' directories (`/run/gpushare/mps`).
    pub root: PathBuf,
    /// How a daemon is started.
    pub launch: MpsLaunch,
}

/// The longest path a Unix socket may have (`sun_path` holds 108 bytes with the NUL).
const SOCKET_PATH_MAX: usize = 107;

/// The longest server directory name: a GPU's or MIG device's UUID (`MIG-` and 36).
const UUID_MAX: usize = 40;

/// Refuses an MPS root under which a server's control socket
/// (`<root>/<uuid>/pipe/control`, where the daemon listens) would be longer than a Unix
/// socket path may be: the daemon would fail at start with nothing that says why, so the
/// agent says it before it starts (`setting` names where the root came from).
pub fn check_root(root: &Path, setting: &str) -> Result<(), String> {
    let socket = root.as_os_str().len() + 1 + UUID_MAX + "/pipe/control".len();
    if socket <= SOCKET_PATH_MAX {
        return Ok(());
    }
    Err(format!(
        "the MPS root {} ({setting}) is {} bytes too long: a server's control socket under \
         it (<root>/<uuid>/pipe/control) would be {socket} bytes, over the {SOCKET_PATH_MAX} \
         a Unix socket path may have",
        root.display(),
        socket - SOCKET_PATH_MAX
    ))
}

/// How control daemons are started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MpsLaunch {
    /// `nvidia-cuda-mps-control -d` run by the agent: the daemon is the agent's child (and
    /// under systemd in the agent's cgroup, where `KillMode=process` keeps it alive).
    Direct,
    /// `systemctl start gpushare-mps@<uuid>.service`: the daemon in a unit of its own.
    Unit {
        /// The `systemctl` that starts the instances.
        systemctl: PathBuf,
    },
}

impl MpsLaunch {
    /// [`MpsLaunch::Unit`] when the agent runs as a systemd service (`INVOCATION_ID`, which
    /// systemd sets for a unit's processes), its MPS root is the one the template's paths
    /// name, the template is installed and `systemctl` runs; otherwise
    /// [`MpsLaunch::Direct`], with the reason for the log.
    pub fn detect(root: &Path) -> (MpsLaunch, &'static str) {
        if std::env::var_os("INVOCATION_ID").is_none() {
            return (MpsLaunch::Direct, "the agent does not run as a systemd service");
        }
        if root != Path::new(UNIT_ROOT) {
            return (
                MpsLaunch::Direct,
                "[mps] root is not /run/gpushare/mps, where gpushare-mps@.service has its paths",
            );
        }
        if !UNIT_DIRS.iter().any(|dir| Path::new(dir).join(UNIT_TEMPLATE).is_file()) {
            return (MpsLaunch::Direct, "gpushare-mps@.service is not installed");
        }
        match find_program(Path::new("systemctl")) {
            Ok(systemctl) => (MpsLaunch::Unit { systemctl }, "the template and systemctl are here"),
            Err(_) => (MpsLaunch::Direct, "systemctl is not on PATH"),
        }
    }
}

/// What became of `what` (`nvidia-cuda-mps-control -d`, `systemctl start …`), run to
/// start the daemon of `uuid` within `limit`: started, or why not, in one line.
fn start_outcome(
    uuid: &str,
    what: &str,
    done: std::io::Result<Finished>,
    limit: Duration,
) -> Result<(), SharingError> {
    let err = |kind, why: String| SharingError::new(kind, format!("MPS server for {uuid}: {why}"));
    let done = done.map_err(|e| err(Kind::CannotRun, format!("cannot run {what}: {e}")))?;
    match done.status {
        Some(status) if status.success() => Ok(()),
        Some(status) => {
            Err(err(Kind::Failed, format!("{what} failed ({status}): {}", done.first_line())))
        }
        None => Err(err(
            Kind::TimedOut,
            format!("{what} did not finish within {} s and was killed", limit.as_secs()),
        )),
    }
}

/// The `gpushare-mps@.service` instance of the daemon for `uuid`; `None` for a UUID that
/// is not a plain instance name (the real ones are `GPU-`/`MIG-` and hex digits).
pub fn unit_name(uuid: &str) -> Option<String> {
    let plain = !uuid.is_empty()
        && uuid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    plain.then(|| format!("gpushare-mps@{uuid}.service"))
}

/// `KEY="value"` lines as systemd's `EnvironmentFile=` reads them (inside double quotes a
/// backslash escapes `"`, `\`, `` ` `` and `$`); `None` if a value holds a newline.
fn environment_file(vars: &[(&str, &std::ffi::OsStr)]) -> Option<String> {
    let mut text = String::new();
    for (key, value) in vars {
        let value = value.to_str()?;
        if value.contains('\n') {
            return None;
        }
        let mut quoted = String::with_capacity(value.len() + 2);
        for c in value.chars() {
            if matches!(c, '"' | '\\' | '`' | '$') {
                quoted.push('\\');
            }
            quoted.push(c);
        }
        text.push_str(&format!("{key}=\"{quoted}\"\n"));
    }
    Some(text)
}

/// A control daemon as found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsDaemon {
    /// What the agent asked for.
    pub record: ServerRecord,
    /// The control daemon's pid, when it runs.
    pub pid: Option<u32>,
    /// The pipe directory clients use.
    pub pipe_dir: PathBuf,
}

/// Starts, stops, finds and talks to MPS control daemons.
#[derive(Debug, Clone)]
pub struct MpsController {
    config: MpsConfig,
    /// The server processes each daemon listed when last asked, by device UUID: the next
    /// read of its limits asks for theirs in the same control run.
    known_servers: Arc<Mutex<std::collections::HashMap<String, Vec<u32>>>>,
    /// The last live read of each daemon, by device UUID, and when it was made.
    live_cache: Arc<Mutex<limits::LiveCache>>,
}

impl MpsController {
    /// A controller for `config`.
    pub fn new(config: MpsConfig) -> Self {
        MpsController { config, known_servers: Arc::default(), live_cache: Arc::default() }
    }

    /// The `nvidia-cuda-mps-control` it runs.
    pub fn control_program(&self) -> &Path {
        &self.config.control
    }

    /// The directory of every server's directory.
    pub fn root(&self) -> &Path {
        &self.config.root
    }

    /// `<root>/<uuid>`.
    pub fn server_dir(&self, uuid: &str) -> PathBuf {
        self.config.root.join(uuid)
    }

    /// The pipe directory of the server of `uuid`.
    pub fn pipe_dir(&self, uuid: &str) -> PathBuf {
        self.server_dir(uuid).join("pipe")
    }

    /// The log directory of the server of `uuid`.
    pub fn log_dir(&self, uuid: &str) -> PathBuf {
        self.server_dir(uuid).join("log")
    }

    /// The control binary for the daemon of `uuid`, allowed `timeout`.
    fn control(&self, uuid: &str, timeout: Duration) -> Command {
        Command::new(&self.config.control, timeout)
            .env("CUDA_MPS_PIPE_DIRECTORY", self.pipe_dir(uuid))
            .env("CUDA_MPS_LOG_DIRECTORY", self.log_dir(uuid))
    }

    /// Starts the daemon of `record`, sets its limits, reads them back, and only then
    /// opens its pipe directory to clients. Returns the daemon's pid.
    pub fn start(&self, record: &ServerRecord) -> Result<u32, SharingError> {
        let uuid = &record.uuid;
        let err =
            |kind, what: String| SharingError::new(kind, format!("MPS server for {uuid}: {what}"));
        let pipe = self.pipe_dir(uuid);
        let log = self.log_dir(uuid);
        if let Some(DaemonIdentity { pid, .. }) = self.running_identity(uuid) {
            return Err(err(
                Kind::AlreadyRunning,
                format!("a control daemon (PID {pid}) already runs in {}", pipe.display()),
            ));
        }
        // A new daemon: no server process yet, so no override of one.
        let record = ServerRecord { daemon: None, overrides: Vec::new(), ..record.clone() };
        self.known_servers().remove(uuid);
        self.forget_live(uuid);
        // The root and the server's directory: the agent's (made 0755), written by no one
        // else, or no server at all (its record decides what the agent signals).
        trusted::make_dir(&self.server_dir(uuid), 0o755)
            .map_err(|why| err(Kind::Files, untrusted_root(why)))?;
        for (dir, mode) in [(&pipe, 0o700), (&log, 0o755)] {
            use std::os::unix::fs::DirBuilderExt;
            match std::fs::DirBuilder::new().mode(mode).create(dir) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                    return Err(err(Kind::Files, format!("{}: {e}", dir.display())));
                }
                _ => {}
            }
        }
        set_mode(&pipe, 0o700).map_err(|e| err(Kind::Files, e))?;
        let record_file = self.server_dir(uuid).join("server.json");
        write_json(&record_file, &record, PRIVATE)
            .map_err(|e| err(Kind::Files, format!("server.json: {e}")))?;

        match &self.config.launch {
            MpsLaunch::Direct => self.start_directly(uuid, record.multi_user)?,
            MpsLaunch::Unit { systemctl } => self.start_unit(uuid, record.multi_user, systemctl)?,
        }
        // Read while the pipe directory is root's alone (0700): the file is the daemon's.
        let daemon = wait_for(START_STOP_TIMEOUT, || {
            pid_file(&pipe).filter(|&pid| alive(pid)).and_then(DaemonIdentity::of)
        })
        .ok_or_else(|| {
            err(Kind::Failed, format!("the daemon wrote no pid file in {}", pipe.display()))
        })?;
        let pid = daemon.pid;
        write_json(&record_file, &ServerRecord { daemon: Some(daemon), ..record.clone() }, PRIVATE)
            .map_err(|e| err(Kind::Files, format!("server.json: {e}")))?;
        // The daemon makes its pid file writable by everyone (0666, on an H100 too): once
        // read, nobody but root writes it (another user could fill /run through it).
        let _ = set_mode(&pipe.join(PID_FILE), 0o644);

        // Both limits set and read back in one control run: the daemon answers the
        // commands in turn, the read-backs last (the thread setter echoes the value it
        // kept, the memory setter says nothing; checked on an H100, tests/device).
        let limits = record.limits;
        let threads = limits.active_thread_percentage;
        let memory = limits.pinned_memory_limit_bytes.map(|bytes| (bytes, mps_memory_value(bytes)));
        let mut batch = vec![format!("set_default_active_thread_percentage {threads}")];
        if let Some((_, value)) = &memory {
            batch.push(format!("set_default_device_pinned_mem_limit 0 {value}"));
        }
        batch.push("get_default_active_thread_percentage".into());
        if memory.is_some() {
            batch.push("get_default_device_pinned_mem_limit 0".into());
        }
        let answers = self.commands(uuid, &batch)?;
        let from_end = |k: usize| answers.len().checked_sub(k).and_then(|i| answers.get(i));
        let (threads_read, memory_read) = match memory {
            Some(_) => (from_end(2), from_end(1)),
            None => (from_end(1), None),
        };
        if threads_read.and_then(|t| parse_percentage(t)) != Some(threads) {
            return Err(err(
                Kind::NotApplied,
                format!(
                    "active thread percentage {threads} did not take: the daemon reports {:?}",
                    threads_read.map_or("", String::as_str)
                ),
            ));
        }
        if let Some((bytes, value)) = memory {
            let read = memory_read.map_or("", |m| m.as_str());
            if !pinned_limit_reads_back(bytes, read) {
                return Err(err(
                    Kind::NotApplied,
                    format!(
                        "pinned memory limit {value} did not take: the daemon reports {read:?}"
                    ),
                ));
            }
        }
        // Limits are in place and read back: a read of the new daemon's defaults taken in
        // the meantime is not kept; then clients may come.
        self.forget_live(uuid);
        set_mode(&pipe, 0o755).map_err(|e| err(Kind::Files, e))?;
        Ok(pid)
    }

    /// `nvidia-cuda-mps-control -d` (`-d -M` for a multi-user daemon), from the agent.
    fn start_directly(&self, uuid: &str, multi_user: bool) -> Result<(), SharingError> {
        let options = mode_options(multi_user);
        let done = self
            .control(uuid, START_STOP_TIMEOUT)
            .arg("-d")
            .args(options.split_whitespace())
            .env("CUDA_VISIBLE_DEVICES", uuid)
            .run();
        let what = format!("{} -d {options}", self.config.control.display());
        let what = what.trim_end();
        start_outcome(uuid, what, done, START_STOP_TIMEOUT)
    }

    /// `systemctl start gpushare-mps@<uuid>.service`, after writing the environment the
    /// instance reads: the control binary (by its full path, the unit has its own `PATH`),
    /// the device and the directories. systemctl returns once the daemon's pid file is read.
    fn start_unit(
        &self,
        uuid: &str,
        multi_user: bool,
        systemctl: &Path,
    ) -> Result<(), SharingError> {
        let err =
            |kind, what: String| SharingError::new(kind, format!("MPS server for {uuid}: {what}"));
        let unit = unit_name(uuid).ok_or_else(|| {
            err(Kind::Failed, "the UUID is not a plain systemd instance name".to_owned())
        })?;
        let control = find_program(&self.config.control).map_err(|why| {
            err(Kind::CannotRun, format!("cannot run {}: {why}", self.config.control.display()))
        })?;
        let (pipe, log) = (self.pipe_dir(uuid), self.log_dir(uuid));
        // The unit runs `${GPUSHARE_MPS_CONTROL} -d $GPUSHARE_MPS_OPTIONS`: the options
        // split at spaces (none when empty), as systemd does for an unbraced `$VAR`.
        let vars = [
            ("GPUSHARE_MPS_CONTROL", control.as_os_str()),
            ("GPUSHARE_MPS_OPTIONS", std::ffi::OsStr::new(mode_options(multi_user))),
            ("CUDA_VISIBLE_DEVICES", std::ffi::OsStr::new(uuid)),
            ("CUDA_MPS_PIPE_DIRECTORY", pipe.as_os_str()),
            ("CUDA_MPS_LOG_DIRECTORY", log.as_os_str()),
        ];
        let env = environment_file(&vars)
            .ok_or_else(|| err(Kind::Files, "a path is not UTF-8 or holds a newline".to_owned()))?;
        let env_path = self.server_dir(uuid).join(SERVICE_ENV_FILE);
        crate::sys::files::write_atomically(&env_path, env.as_bytes(), PRIVATE)
            .map_err(|e| err(Kind::Files, format!("{}: {e}", env_path.display())))?;
        // systemd's own start timeout (TimeoutStartSec=) ends a hung start first.
        let limit = START_STOP_TIMEOUT + Duration::from_secs(5);
        let done = Command::new(systemctl, limit).args(["start", "--quiet", &unit]).run();
        start_outcome(uuid, &format!("systemctl start {unit}"), done, limit)
    }

    /// Stops the server of `uuid` (`quit`, then SIGKILL if it lingers) and removes its
    /// directory.
    pub fn stop(&self, uuid: &str) -> Result<(), SharingError> {
        // A directory another user could write: nothing in it is believed, nothing removed.
        let dir = self.server_dir(uuid);
        if std::fs::symlink_metadata(&dir).is_ok()
            && let Err(why) = trusted::check_dir(&dir)
        {
            let why = format!("MPS server for {uuid}: not stopped: {}", untrusted_root(why));
            return Err(SharingError::new(Kind::Files, why));
        }
        if let Some(daemon) = self.running_identity(uuid) {
            // Opened while the daemon runs, so that its exit is seen the moment it happens
            // rather than at the next look (a switch waits on it); and it holds the process,
            // so that the pid checked below is the pid signalled.
            let exit = unix::pidfd_open(daemon.pid);
            // A daemon that does not answer is killed below.
            let _ = self.command(uuid, "quit");
            let pid = daemon.pid;
            if !wait_for_exit(
                pid,
                exit.as_ref().and_then(|fd| fd.try_clone().ok()),
                START_STOP_TIMEOUT,
            ) && daemon.runs()
            {
                match &exit {
                    Some(fd) => {
                        let _ = unix::pidfd_kill(fd);
                    }
                    None => {
                        let _ = unix::kill(pid, false);
                    }
                }
            }
        }
        self.known_servers().remove(uuid);
        self.forget_live(uuid);
        match std::fs::remove_dir_all(self.server_dir(uuid)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(SharingError::new(
                Kind::Files,
                format!("removing {}: {e}", self.server_dir(uuid).display()),
            )),
        }
    }

    /// Every server directory under the root, with its daemon's pid when it runs. Only from
    /// a root the agent may trust: records anywhere else are ignored with a warning (a
    /// forged one would name a process for the agent to signal).
    pub fn daemons(&self) -> Vec<MpsDaemon> {
        let root = &self.config.root;
        if std::fs::symlink_metadata(root).is_err() {
            return Vec::new();
        }
        if let Err(why) = trusted::check_dir(root) {
            trusted::warn_ignored(format!("MPS servers ignored: {}", untrusted_root(why)));
            return Vec::new();
        }
        let Ok(entries) = std::fs::read_dir(root) else { return Vec::new() };
        let mut servers: Vec<MpsDaemon> = entries
            .filter_map(Result::ok)
            // A server's directory is a directory of the root's own; the links the device
            // plugin's layout keeps beside them (`shm`, DESIGN.md "Kubernetes (issue 40)")
            // are not followed.
            .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|entry| {
                let dir = entry.path();
                let record = trusted_record(&dir).ok().flatten()?;
                let pipe_dir = dir.join("pipe");
                let pid = self.identity_of(&record, &pipe_dir).map(|d| d.pid);
                Some(MpsDaemon { pid, record, pipe_dir })
            })
            .collect();
        servers.sort_by(|a, b| {
            let key = |r: &ServerRecord| (r.gpu, r.placement_start, r.compute_instance);
            key(&a.record).cmp(&key(&b.record))
        });
        servers
    }

    /// Sends one command to the daemon of `uuid` and returns its answer lines.
    pub fn command(&self, uuid: &str, line: &str) -> Result<Vec<String>, SharingError> {
        self.commands(uuid, &[line])
    }

    /// Sends `lines` to the daemon of `uuid` in one control run (it answers them in
    /// turn) and returns all the answer lines; an unknown command fails them all.
    pub fn commands(
        &self,
        uuid: &str,
        lines: &[impl AsRef<str>],
    ) -> Result<Vec<String>, SharingError> {
        let lines: Vec<&str> = lines.iter().map(AsRef::as_ref).collect();
        let shown = lines.join("; ");
        let err = |kind, what: String| {
            SharingError::new(kind, format!("MPS server for {uuid}: {shown}: {what}"))
        };
        let input: String = lines.iter().map(|l| format!("{l}\n")).collect();
        let done = self.control(uuid, COMMAND_TIMEOUT).input(input).run().map_err(|e| {
            err(Kind::CannotRun, format!("cannot run {}: {e}", self.config.control.display()))
        })?;
        let Some(status) = done.status else {
            let waited = COMMAND_TIMEOUT.as_secs();
            return Err(err(Kind::TimedOut, format!("no answer within {waited} s")));
        };
        let stdout = done.stdout_text();
        let lines: Vec<String> =
            stdout.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect();
        if !status.success() {
            return Err(err(Kind::Failed, format!("{} ({status})", done.first_line())));
        }
        if let Some(unknown) = lines.iter().find(|l| l.starts_with("Unknown command")) {
            return Err(err(Kind::Failed, unknown.clone()));
        }
        Ok(lines)
    }

    /// The identity of the daemon of `uuid`'s server that runs now, if one does.
    fn running_identity(&self, uuid: &str) -> Option<DaemonIdentity> {
        match trusted_record(&self.server_dir(uuid)) {
            Ok(Some(record)) => self.identity_of(&record, &self.pipe_dir(uuid)),
            Ok(None) => legacy_daemon(&self.pipe_dir(uuid)),
            Err(()) => None,
        }
    }

    /// The daemon `record` names, while that very process runs; for a record without one
    /// (written by an agent before daemons were recorded), a daemon verified by its
    /// environment ([`legacy_daemon`]).
    fn identity_of(&self, record: &ServerRecord, pipe_dir: &Path) -> Option<DaemonIdentity> {
        match record.daemon {
            Some(daemon) => daemon.runs().then_some(daemon),
            None => legacy_daemon(pipe_dir),
        }
    }
}

/// The control daemon's options besides `-d`: `-M` for a multi-user daemon.
fn mode_options(multi_user: bool) -> &'static str {
    if multi_user { "-M" } else { "" }
}

fn set_mode(dir: &Path, mode: u32) -> Result<(), String> {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("{}: {e}", dir.display()))
}

/// Whether process `pid` exits within `timeout`: watched through `exit` (its pidfd), or
/// without one by looking every 5 ms.
fn wait_for_exit(pid: u32, exit: Option<std::os::fd::OwnedFd>, timeout: Duration) -> bool {
    use std::os::fd::AsFd;
    let Some(exit) = exit else {
        return wait_for(timeout, || (!alive(pid)).then_some(())).is_some();
    };
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match unix::poll_readable(&[exit.as_fd()], left) {
            Ok(ready) if ready.first() == Some(&true) => return true,
            // An interrupted wait reads as a timeout: look again until the deadline.
            Ok(_) if !left.is_zero() => continue,
            Ok(_) => return false,
            Err(_) => return wait_for(left, || (!alive(pid)).then_some(())).is_some(),
        }
    }
}

fn wait_for<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
