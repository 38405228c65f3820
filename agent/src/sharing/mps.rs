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

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{SharingError, SharingErrorKind as Kind};
use crate::node::{MpsLimits, mps_memory_value};
use crate::sys::command::{Command, Finished, find_program};
use crate::sys::files::{PRIVATE, write_json};
use crate::sys::procfs::{self, alive};
use crate::sys::{trusted, unix};

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
    /// Limits set on the daemon.
    pub limits: MpsLimits,
    /// How often the supervisor restarted it.
    #[serde(default)]
    pub restarts: u32,
    /// The daemon started for it, once it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon: Option<DaemonIdentity>,
}

/// One process for good: its pid and when it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonIdentity {
    /// Its pid.
    pub pid: u32,
    /// Its start time (clock ticks after boot, `/proc/PID/stat`).
    pub start_time: u64,
}

impl DaemonIdentity {
    /// `pid` as it runs now.
    fn of(pid: u32) -> Option<DaemonIdentity> {
        procfs::start_time(pid).map(|start_time| DaemonIdentity { pid, start_time })
    }

    /// Whether this process still runs (the pid names the same process).
    fn runs(&self) -> bool {
        alive(self.pid) && procfs::start_time(self.pid) == Some(self.start_time)
    }
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
}

impl MpsController {
    /// A controller for `config`.
    pub fn new(config: MpsConfig) -> Self {
        MpsController { config }
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
        let record = ServerRecord { daemon: None, ..record.clone() };
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
            MpsLaunch::Direct => self.start_directly(uuid)?,
            MpsLaunch::Unit { systemctl } => self.start_unit(uuid, systemctl)?,
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
        // Limits are in place and read back: clients may come.
        set_mode(&pipe, 0o755).map_err(|e| err(Kind::Files, e))?;
        Ok(pid)
    }

    /// `nvidia-cuda-mps-control -d`, from the agent.
    fn start_directly(&self, uuid: &str) -> Result<(), SharingError> {
        let done = self
            .control(uuid, START_STOP_TIMEOUT)
            .arg("-d")
            .env("CUDA_VISIBLE_DEVICES", uuid)
            .run();
        let what = format!("{} -d", self.config.control.display());
        start_outcome(uuid, &what, done, START_STOP_TIMEOUT)
    }

    /// `systemctl start gpushare-mps@<uuid>.service`, after writing the environment the
    /// instance reads: the control binary (by its full path, the unit has its own `PATH`),
    /// the device and the directories. systemctl returns once the daemon's pid file is read.
    fn start_unit(&self, uuid: &str, systemctl: &Path) -> Result<(), SharingError> {
        let err =
            |kind, what: String| SharingError::new(kind, format!("MPS server for {uuid}: {what}"));
        let unit = unit_name(uuid).ok_or_else(|| {
            err(Kind::Failed, "the UUID is not a plain systemd instance name".to_owned())
        })?;
        let control = find_program(&self.config.control).map_err(|why| {
            err(Kind::CannotRun, format!("cannot run {}: {why}", self.config.control.display()))
        })?;
        let (pipe, log) = (self.pipe_dir(uuid), self.log_dir(uuid));
        let vars = [
            ("GPUSHARE_MPS_CONTROL", control.as_os_str()),
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

    /// Whether the daemon of `server` runs and answers.
    pub fn healthy(&self, server: &MpsDaemon) -> bool {
        server.pid.is_some_and(alive)
            && self.command(&server.record.uuid, "get_default_active_thread_percentage").is_ok()
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

    /// The MPS server processes of a daemon with their client pids.
    pub fn clients(&self, uuid: &str) -> Result<Vec<(u32, Vec<u32>)>, SharingError> {
        let mut out = Vec::new();
        for server in self.command(uuid, "get_server_list")? {
            let Ok(server) = server.parse::<u32>() else { continue };
            let clients = self
                .command(uuid, &format!("get_client_list {server}"))?
                .iter()
                .filter_map(|l| l.parse().ok())
                .collect();
            out.push((server, clients));
        }
        Ok(out)
    }
}

/// Whether the daemon's answer to `get_default_device_pinned_mem_limit` shows `set` bytes.
/// The real daemon shows a limit of a gibibyte or more in whole `G`, rounded down (an
/// H100 answered `79G` for `81559M`, `19G` for `20389M`), smaller ones in `M`: the answer
/// must be the set limit rounded down to its unit.
fn pinned_limit_reads_back(set: u64, answer: &str) -> bool {
    let (digits, unit) = match (answer.strip_suffix('G'), answer.strip_suffix('M')) {
        (Some(d), _) => (d, 1u64 << 30),
        (None, Some(d)) => (d, 1u64 << 20),
        (None, None) => return false,
    };
    digits.parse::<u64>().ok().and_then(|n| n.checked_mul(unit)) == Some(set / unit * unit)
}

impl MpsController {
    /// The client PIDs of a daemon's servers, from one `ps` (the first column of its
    /// rows); a control tool without `ps` is asked server by server instead.
    pub fn client_pids(&self, uuid: &str) -> Result<Vec<u32>, SharingError> {
        let mut pids: Vec<u32> = match self.command(uuid, "ps") {
            Ok(lines) => ps_client_pids(&lines),
            Err(e) if e.message.contains("Unknown command") => {
                self.clients(uuid)?.into_iter().flat_map(|(_, clients)| clients).collect()
            }
            Err(e) => return Err(e),
        };
        // In the order the daemon lists them (connection order); a plan sorts its own.
        let mut seen = std::collections::HashSet::new();
        pids.retain(|pid| seen.insert(*pid));
        Ok(pids)
    }

    /// The server record of the daemon whose MPS server process serves client `pid`, and
    /// that server process.
    pub fn server_of_client(&self, pid: u32) -> Result<(ServerRecord, u32), SharingError> {
        let found = self.daemons().into_iter().filter(|s| s.pid.is_some()).find_map(|s| {
            let clients = self.clients(&s.record.uuid).ok()?;
            let server = clients.iter().find(|(_, c)| c.contains(&pid)).map(|(srv, _)| *srv)?;
            Some((s.record, server))
        });
        found.ok_or_else(|| {
            SharingError::new(
                Kind::NotAClient,
                format!("PID {pid} is not a client of an MPS server gpushare runs"),
            )
        })
    }

    /// Sets the limits of MPS server process `server` of the daemon of `uuid` (MPS applies
    /// them to that server's new clients); the thread percentage is read back.
    pub fn limit_server(
        &self,
        uuid: &str,
        server: u32,
        threads: Option<u32>,
        memory_bytes: Option<u64>,
    ) -> Result<(), SharingError> {
        if let Some(t) = threads {
            self.command(uuid, &format!("set_active_thread_percentage {server} {t}"))?;
            let read = self.command(uuid, &format!("get_active_thread_percentage {server}"))?;
            if read.first().and_then(|v| v.parse::<f64>().ok()) != Some(f64::from(t)) {
                return Err(SharingError::new(
                    Kind::NotApplied,
                    format!(
                        "the MPS server {server} reports thread percentage {:?} after setting {t}",
                        read.join(" ")
                    ),
                ));
            }
        }
        if let Some(bytes) = memory_bytes {
            let value = mps_memory_value(bytes);
            self.command(uuid, &format!("set_device_pinned_mem_limit {server} 0 {value}"))?;
        }
        Ok(())
    }
}

/// The client PIDs of `ps`'s rows (`PID ID SERVER DEVICE NAMESPACE COMMAND`, after a
/// header; nothing at all without clients).
fn ps_client_pids(lines: &[String]) -> Vec<u32> {
    lines.iter().filter_map(|l| l.split_whitespace().next()?.parse().ok()).collect()
}

/// `25.0` → 25.
fn parse_percentage(answer: &str) -> Option<u32> {
    let value: f64 = answer.trim().parse().ok()?;
    (value.fract() == 0.0).then_some(value as u32)
}

fn set_mode(dir: &Path, mode: u32) -> Result<(), String> {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("{}: {e}", dir.display()))
}

/// Why the MPS root is not used, with the consequence and the setting.
fn untrusted_root(why: String) -> String {
    format!("{why}: another user could forge the servers' records (set [mps] root in agent.toml)")
}

/// The `server.json` of server directory `dir` (`None` when there is none, or it does not
/// read); `Err` when the directory or the file is not one the agent may trust, which is
/// ignored with a warning.
fn trusted_record(dir: &Path) -> Result<Option<ServerRecord>, ()> {
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
fn pid_file(pipe_dir: &Path) -> Option<u32> {
    use std::io::Read;
    // A pid is a few digits; whatever else another user wrote there is not read.
    let mut text = String::new();
    std::fs::File::open(pipe_dir.join(PID_FILE)).ok()?.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// The daemon of a pipe directory whose record does not name it: the pid file's process,
/// only if it is this agent's user's and its environment names this pipe directory (which
/// no process of another user, nor any other root process, has).
fn legacy_daemon(pipe_dir: &Path) -> Option<DaemonIdentity> {
    let pid = pid_file(pipe_dir).filter(|&pid| alive(pid))?;
    if procfs::real_user(pid) != Some(unix::effective_uid()) {
        return None;
    }
    // An MPS control daemon's executable (NVIDIA's, or the simulator's under either name),
    // not any program of the agent's user that kept such an environment.
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    if !exe.file_name()?.to_str()?.ends_with("nvidia-cuda-mps-control") {
        return None;
    }
    let wanted = format!("CUDA_MPS_PIPE_DIRECTORY={}", pipe_dir.display());
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ
        .split(|&b| b == 0)
        .any(|entry| entry == wanted.as_bytes())
        .then(|| DaemonIdentity::of(pid))
        .flatten()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_limits_read_back_as_the_daemon_rounds_them() {
        assert!(pinned_limit_reads_back(2 << 30, "2G"));
        assert!(pinned_limit_reads_back(512 << 20, "512M"));
        // Answers of the real daemon on an H100 (tests/device/results, issue 12).
        assert!(pinned_limit_reads_back(81559 << 20, "79G"));
        assert!(pinned_limit_reads_back(20389 << 20, "19G"));
        assert!(!pinned_limit_reads_back(20389 << 20, "20G"));
        assert!(!pinned_limit_reads_back(2 << 30, "1G"));
        assert!(!pinned_limit_reads_back(2 << 30, ""));
        assert!(!pinned_limit_reads_back(2 << 30, "No default pinned memory limit set"));
    }

    #[test]
    fn percentages_read_back_as_the_daemon_prints_them() {
        assert_eq!(parse_percentage("25.0"), Some(25));
        assert_eq!(parse_percentage("100.0"), Some(100));
        assert_eq!(parse_percentage("12.5"), None);
        assert_eq!(parse_percentage(""), None);
    }

    #[test]
    fn an_exit_is_seen_when_it_happens_and_a_timeout_is_kept() {
        let mut quick = std::process::Command::new("sleep").arg("0.1").spawn().unwrap();
        let started = Instant::now();
        assert!(wait_for_exit(quick.id(), unix::pidfd_open(quick.id()), Duration::from_secs(5)));
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        quick.wait().unwrap();
        let mut slow = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let started = Instant::now();
        let pidfd = unix::pidfd_open(slow.id());
        assert!(!wait_for_exit(slow.id(), pidfd, Duration::from_millis(100)));
        assert!(started.elapsed() >= Duration::from_millis(100));
        slow.kill().unwrap();
        slow.wait().unwrap();
    }

    #[test]
    fn units_are_named_by_the_uuid_and_odd_ones_refused() {
        assert_eq!(
            unit_name("GPU-cc30f0e5-9f43-576f-a1b2-0123456789ab").as_deref(),
            Some("gpushare-mps@GPU-cc30f0e5-9f43-576f-a1b2-0123456789ab.service")
        );
        assert_eq!(unit_name(""), None);
        assert_eq!(unit_name("GPU-a/b"), None);
        assert_eq!(unit_name("GPU a"), None);
    }

    #[test]
    fn the_environment_file_quotes_as_systemd_reads_it() {
        use std::ffi::OsStr;
        let text = environment_file(&[
            ("GPUSHARE_MPS_CONTROL", OsStr::new("/usr/bin/nvidia-cuda-mps-control")),
            ("ODD", OsStr::new(r#"a "b" \ $c `d`"#)),
        ])
        .unwrap();
        assert_eq!(
            text,
            "GPUSHARE_MPS_CONTROL=\"/usr/bin/nvidia-cuda-mps-control\"\n\
             ODD=\"a \\\"b\\\" \\\\ \\$c \\`d\\`\"\n"
        );
        assert_eq!(environment_file(&[("A", OsStr::new("x\ny"))]), None);
    }

    #[test]
    fn the_unit_launch_needs_a_systemd_service_and_the_packaged_root() {
        // Tests do not run as a systemd service with /run/gpushare/mps as their root.
        let (launch, why) = MpsLaunch::detect(Path::new("/tmp/elsewhere"));
        assert_eq!(launch, MpsLaunch::Direct);
        assert!(!why.is_empty());
    }

    #[test]
    fn clients_are_read_from_ps_as_the_real_h100_printed_it() {
        let lines = [
            "PID       ID        SERVER         DEVICE                    NAMESPACE      COMMAND",
            "438       1         441            GPU-cc30f0e5-9f43-576f    4026531836     python3",
            "512       2         441            GPU-cc30f0e5-9f43-576f    4026531836     python3",
        ]
        .map(String::from);
        assert_eq!(ps_client_pids(&lines), [438, 512]);
        assert!(ps_client_pids(&[]).is_empty());
    }

    #[test]
    fn servers_are_found_from_their_records() {
        let dir = tempfile::tempdir().unwrap();
        let mps = MpsController::new(MpsConfig {
            control: PathBuf::from("/nonexistent/nvidia-cuda-mps-control"),
            root: dir.path().to_path_buf(),
            launch: MpsLaunch::Direct,
        });
        let record = ServerRecord {
            uuid: "GPU-abc".into(),
            gpu: 1,
            placement_start: None,
            compute_instance: 0,
            limits: MpsLimits { active_thread_percentage: 25, pinned_memory_limit_bytes: None },
            restarts: 0,
            // This test process stands for the daemon the agent started.
            daemon: DaemonIdentity::of(std::process::id()),
        };
        std::fs::create_dir_all(mps.pipe_dir("GPU-abc")).unwrap();
        write_json(&mps.server_dir("GPU-abc").join("server.json"), &record, PRIVATE).unwrap();
        // Whatever the world-writable pid file says is not read.
        std::fs::write(mps.pipe_dir("GPU-abc").join(PID_FILE), "1").unwrap();
        let found = mps.daemons();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].record, record);
        assert_eq!(found[0].pid, Some(std::process::id()));
        let e = mps.start(&record).unwrap_err();
        assert!(e.to_string().contains("already runs"), "{e}");
        let e = mps.command("GPU-abc", "get_server_list").unwrap_err();
        assert!(e.to_string().contains("cannot run /nonexistent/nvidia-cuda-mps-control"), "{e}");
        // A record whose daemon is gone (another process now has its pid, or none does)
        // has no daemon, whatever the pid file says.
        let gone = ServerRecord {
            daemon: Some(DaemonIdentity { pid: std::process::id(), start_time: 1 }),
            ..record.clone()
        };
        write_json(&mps.server_dir("GPU-abc").join("server.json"), &gone, PRIVATE).unwrap();
        std::fs::write(mps.pipe_dir("GPU-abc").join(PID_FILE), std::process::id().to_string())
            .unwrap();
        assert_eq!(mps.daemons()[0].pid, None);
    }

    #[test]
    fn records_under_a_root_others_may_write_are_ignored_and_never_acted_on() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("mps");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
        let mps = MpsController::new(MpsConfig {
            control: PathBuf::from("/nonexistent/nvidia-cuda-mps-control"),
            root: root.clone(),
            launch: MpsLaunch::Direct,
        });
        // A record someone forged there, naming a process that is not a daemon.
        let mut victim = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let record = ServerRecord {
            uuid: "GPU-abc".into(),
            gpu: 0,
            placement_start: None,
            compute_instance: 0,
            limits: MpsLimits { active_thread_percentage: 25, pinned_memory_limit_bytes: None },
            restarts: 0,
            daemon: DaemonIdentity::of(victim.id()),
        };
        std::fs::create_dir_all(mps.pipe_dir("GPU-abc")).unwrap();
        let file = mps.server_dir("GPU-abc").join("server.json");
        std::fs::write(&file, serde_json::to_vec(&record).unwrap()).unwrap();
        assert!(mps.daemons().is_empty());
        assert_eq!(mps.running_identity("GPU-abc"), None);
        let e = mps.stop("GPU-abc").unwrap_err().to_string();
        assert!(e.contains("writable by others") && e.contains("[mps] root"), "{e}");
        let e = mps.start(&record).unwrap_err().to_string();
        assert!(e.contains("writable by others") && e.contains("[mps] root"), "{e}");
        assert!(file.exists(), "another user's files were removed");
        assert!(victim.try_wait().unwrap().is_none(), "the process the record named was signalled");
        victim.kill().unwrap();
        victim.wait().unwrap();
    }

    #[test]
    fn a_pid_file_alone_names_only_a_process_of_this_pipe_directory() {
        let dir = tempfile::tempdir().unwrap();
        let pipe = dir.path().join("pipe");
        std::fs::create_dir(&pipe).unwrap();
        // A "daemon" of this user started for that pipe directory; the same program not
        // started for it; another program started for it.
        let daemon = dir.path().join("nvidia-cuda-mps-control");
        let sleep = find_program(Path::new("sleep")).unwrap();
        std::fs::copy(&sleep, &daemon).unwrap();
        let spawn = |program: &Path, env: bool| {
            let mut cmd = std::process::Command::new(program);
            if env {
                cmd.env("CUDA_MPS_PIPE_DIRECTORY", &pipe);
            }
            cmd.arg("30");
            // A copy just written may be open for writing in a child another test forks
            // meanwhile (ETXTBSY) for a moment.
            loop {
                match cmd.spawn() {
                    Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    started => break started.unwrap(),
                }
            }
        };
        let mut ours = spawn(&daemon, true);
        let mut other = spawn(&daemon, false);
        let mut not_a_daemon = spawn(&sleep, true);
        for stranger in [&other, &not_a_daemon] {
            std::fs::write(pipe.join(PID_FILE), stranger.id().to_string()).unwrap();
            assert_eq!(legacy_daemon(&pipe), None);
        }
        std::fs::write(pipe.join(PID_FILE), ours.id().to_string()).unwrap();
        assert_eq!(legacy_daemon(&pipe).map(|d| d.pid), Some(ours.id()));
        for child in [&mut ours, &mut other, &mut not_a_daemon] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}
