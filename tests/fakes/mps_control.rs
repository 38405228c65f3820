//! `fake-nvidia-cuda-mps-control`: a stand-in for NVIDIA's `nvidia-cuda-mps-control` in the
//! tests, which run without a GPU. It answers as the real control daemon of driver 580 / CUDA
//! 13 answered on an H100 (tests/device/results/mps-probe-h100-2026-11-22.txt and the
//! `control.log` that probe produced), and records what it was asked.
//!
//! ```text
//! fake-nvidia-cuda-mps-control -d      start the control daemon in the background
//! fake-nvidia-cuda-mps-control -f      run the control daemon in the foreground
//! fake-nvidia-cuda-mps-control         client: commands on stdin, answers on stdout
//! fake-nvidia-cuda-mps-control -h      help
//! fake-nvidia-cuda-mps-control --fake-client PID       (test only) client PID connects
//! fake-nvidia-cuda-mps-control --fake-client-exit PID  (test only) client PID exits
//! ```
//!
//! As the real one, it takes the pipe directory from `CUDA_MPS_PIPE_DIRECTORY` (default
//! `/tmp/nvidia-mps`) and the log directory from `CUDA_MPS_LOG_DIRECTORY` (default
//! `/var/log/nvidia-mps`). The daemon writes `nvidia-cuda-mps-control.pid` (its PID, no
//! newline, mode 0666) and the unix socket `control` (mode 0666) into the pipe directory, and
//! appends `control.log` / `server.log` lines in the real format
//! (`[2026-11-22 07:35:47.105 Control   408] Cmd:get_server_list`) to the log directory; with
//! `-f` it also prints them on stdout. `-d` returns once the socket and the PID file exist,
//! the socket first. The daemon exits on `quit` (removing its PID file and socket), on
//! SIGTERM or SIGINT (the same), and by itself within 200 ms when its pipe directory is
//! deleted or replaced, so tests do not leak processes.
//!
//! Fake clients: CI has no CUDA, so no real client ever connects. `--fake-client PID` makes
//! the daemon act as when the CUDA client `PID` connects: it starts its one MPS server, with
//! the default limits set at that time, and lists `PID` as that server's client;
//! `--fake-client-exit PID` makes the client leave (the server stays, as the real one does).
//! The server is not a process: its PID is the daemon's PID + 1, a number only.
//!
//! Record lines (appended to the file named by `GPUSHARE_FAKE_RECORD`):
//!
//! ```text
//! mps-control daemon pipe=<dir> visible=<CUDA_VISIBLE_DEVICES or (unset)>
//! mps-control daemon-exit pipe=<dir> reason=<quit|signal|pipe-dir-removed>
//! mps-control pipe=<dir> cmd=<command line as sent>
//! mps-control pipe=<dir> error=no-daemon
//! mps-control pipe=<dir> fake-client=<pid>
//! mps-control pipe=<dir> fake-client-exit=<pid>
//! ```
//!
//! Between client and daemon the fake speaks its own protocol, not NVIDIA's: one command per
//! line, each answered by the answer's lines and then a line holding only U+0004.

mod common;

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The PID file the real daemon writes into its pipe directory.
const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// The control socket in the pipe directory.
const SOCKET_NAME: &str = "control";
const DEFAULT_PIPE_DIR: &str = "/tmp/nvidia-mps";
const DEFAULT_LOG_DIR: &str = "/var/log/nvidia-mps";
/// Ends each answer on the socket.
const END_OF_ANSWER: &str = "\u{4}";
/// Socket commands behind `--fake-client` / `--fake-client-exit`.
const FAKE_CONNECT: &str = "__fake_client_connect";
const FAKE_EXIT: &str = "__fake_client_exit";
/// The hidden argument of the re-executed background daemon.
const SERVE_ARG: &str = "--serve";
/// Exit status of `--serve` when another daemon owns the pipe directory.
const EXIT_ALREADY_RUNNING: u8 = 3;

const NO_DAEMON: &str = "Cannot find MPS control daemon process";
const ALREADY_RUNNING: &str = "An instance of this daemon is already running";
const INVALID_PERCENTAGE: &str = "Invalid percentage, expected between (0.0, 100.0]";
const NO_DEFAULT_PINNED_LIMIT: &str = "No default pinned memory limit set for the device!";
/// What `get_device_client_list` shows for the device (the probe's H100).
const DEVICE_LINE: &str = "[0] 00:00.0, NVIDIA H100 80GB HBM3";
/// The device `ps` shows when `CUDA_VISIBLE_DEVICES` names no UUID.
const DEFAULT_DEVICE_UUID: &str = "GPU-00000000-0000-0000-0000-000000000000";
const BINARY_VERSION: u32 = 13000;
/// How often the daemon checks that its pipe directory still exists.
const PIPE_DIR_CHECK: Duration = Duration::from_millis(200);

/// The real tool's `-h` (the probe's first 20 lines), then the commands this fake knows.
const HELP: &str = "\
CUDA MPS Control for Linux/Unix/QNX.
Copyright (C) 2003 - 2025 NVIDIA Corporation.

  This program allows multiple CUDA processes to share a single GPU context. For information on how to use the CUDA MPS, see the nvidia-cuda-mps-control manual page.

nvidia-cuda-mps-control [options] [command]
OPTIONS:
  -h,--help                Print this message
  -d,--daemon              Setup the daemon in the background
  -f,--forground           Setup the daemon in the foreground
  -M,--multiuser-server    Enable multi-user mode
  -q,--ready-devices      Prepare the daemon to query devices on startup

COMMAND:
  start_server -uid <user id>
                       Start a new instance of nvidia-cuda-mps-server with the given user ID
  quit
                       Terminate the controller
  get_server_list
                       Print out a list of servers
  (fake) also: get_server_status, get_client_list, get_device_client_list, ps,
  set_/get_default_active_thread_percentage, set_/get_active_thread_percentage,
  set_/get_default_device_pinned_mem_limit, set_/get_device_pinned_mem_limit,
  terminate_client, set_/get_default_client_priority
  (fake, test only) --fake-client PID, --fake-client-exit PID
";

// ---------------------------------------------------------------------------------------
// The daemon's state and its answers
// ---------------------------------------------------------------------------------------

/// Which log file a line goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogFile {
    /// `control.log`.
    Control,
    /// `server.log`.
    Server,
}

/// One log line before its timestamp: `[<time> <tag> <pid>] <text>`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LogLine {
    file: LogFile,
    /// `Control`, `Server` or `Other`, as in the real logs.
    tag: &'static str,
    pid: u32,
    text: String,
}

impl LogLine {
    /// The line as the real daemon writes it.
    fn render(&self, timestamp: &str) -> String {
        format!("[{timestamp} {} {:>5}] {}", self.tag, self.pid, self.text)
    }
}

/// The one MPS server (never a process here).
#[derive(Debug, Clone, PartialEq)]
struct Server {
    pid: u32,
    uid: u32,
    percentage: f64,
    pinned: BTreeMap<String, String>,
    clients: Vec<u32>,
}

/// What the control daemon knows.
#[derive(Debug, Clone, PartialEq)]
struct State {
    control_pid: u32,
    /// The user a fake client runs as (the daemon's).
    uid: u32,
    /// The control socket's path, as the server log names it.
    socket: String,
    /// What `ps` shows as the device.
    device_uuid: String,
    default_percentage: Option<f64>,
    default_pinned: BTreeMap<String, String>,
    default_priority: u32,
    server: Option<Server>,
}

/// What one command gets: the lines for the client, the log lines, whether the daemon quits.
#[derive(Debug, Default, PartialEq)]
struct Answer {
    reply: Vec<String>,
    log: Vec<LogLine>,
    quit: bool,
}

impl State {
    fn new(control_pid: u32, uid: u32, socket: &Path, visible_devices: Option<&str>) -> State {
        let first = visible_devices.and_then(|v| v.split(',').next()).map(str::trim);
        let device_uuid = match first {
            Some(d) if d.starts_with("GPU-") || d.starts_with("MIG-") => d.to_string(),
            _ => DEFAULT_DEVICE_UUID.to_string(),
        };
        State {
            control_pid,
            uid,
            socket: socket.display().to_string(),
            device_uuid,
            default_percentage: None,
            default_pinned: BTreeMap::new(),
            default_priority: 0,
            server: None,
        }
    }

    fn control(&self, text: impl Into<String>) -> LogLine {
        LogLine { file: LogFile::Control, tag: "Control", pid: self.control_pid, text: text.into() }
    }

    fn default_percentage(&self) -> f64 {
        self.default_percentage.unwrap_or(100.0)
    }

    /// The server whose PID is `pid` (a decimal string).
    fn server_mut(&mut self, pid: &str) -> Option<&mut Server> {
        let pid: u32 = pid.parse().ok()?;
        self.server.as_mut().filter(|s| s.pid == pid)
    }

    fn server_ref(&self, pid: &str) -> Option<&Server> {
        let pid: u32 = pid.parse().ok()?;
        self.server.as_ref().filter(|s| s.pid == pid)
    }

    /// Starts the one server (PID = daemon PID + 1) with the current defaults.
    fn start_server(&mut self, uid: u32) -> Vec<LogLine> {
        let pid = self.control_pid.wrapping_add(1);
        let percentage = self.default_percentage();
        let pinned = self.default_pinned.clone();
        let server_line =
            |tag: &'static str, text: String| LogLine { file: LogFile::Server, tag, pid, text };
        let mut log = vec![
            LogLine {
                file: LogFile::Control,
                tag: "Control",
                pid,
                text: format!("Starting new server {pid} for user {uid}"),
            },
            server_line("Other", "Startup".into()),
            server_line(
                "Other",
                format!("Connecting to control daemon on socket: {}", self.socket),
            ),
            server_line("Other", "Initializing server process".into()),
            server_line(
                "Server",
                format!("CUDA MPS Server for Linux/Unix. Binary version: {BINARY_VERSION}"),
            ),
        ];
        if self.default_percentage.is_some() {
            log.push(server_line(
                "Server",
                format!("Active Threads Percentage set to {}", percent(percentage)),
            ));
        }
        for (device, limit) in &pinned {
            let bytes = mem_limit_bytes(limit).unwrap_or(0);
            log.push(server_line(
                "Server",
                format!("Device pinned memory limit for device {device} set to {bytes:#x} bytes"),
            ));
        }
        log.push(server_line(
            "Server",
            format!("Server Priority set to {}", self.default_priority),
        ));
        log.push(server_line("Server", "Server has started".into()));
        log.push(self.control(format!("NEW SERVER {pid}: Ready")));
        self.server = Some(Server { pid, uid, percentage, pinned, clients: Vec::new() });
        log
    }

    /// The CUDA client `pid` connects (what `--fake-client PID` asks for).
    fn connect_client(&mut self, pid: u32) -> Vec<LogLine> {
        let uid = self.uid;
        let mut log = vec![
            self.control("User did not send valid credentials"),
            self.control("Accepting connection..."),
        ];
        if self.server.is_none() {
            log.push(self.control(format!(
                "NEW CLIENT {pid} from user {uid}: Server is not ready, push client to pending list"
            )));
            log.extend(self.start_server(uid));
        } else {
            log.push(
                self.control(format!("NEW CLIENT {pid} from user {uid}: Server already exists")),
            );
        }
        if let Some(server) = self.server.as_mut() {
            if !server.clients.contains(&pid) {
                server.clients.push(pid);
            }
            log.push(LogLine {
                file: LogFile::Server,
                tag: "Server",
                pid: server.pid,
                text: format!("Client {{PID: {pid}, Context ID: 1}} connected"),
            });
        }
        log
    }

    /// The CUDA client `pid` exits (what `--fake-client-exit PID` asks for).
    fn client_exit(&mut self, pid: u32) -> Vec<LogLine> {
        let Some(server) = self.server.as_mut() else { return Vec::new() };
        let before = server.clients.len();
        server.clients.retain(|&c| c != pid);
        if server.clients.len() == before {
            return Vec::new();
        }
        vec![LogLine {
            file: LogFile::Server,
            tag: "Server",
            pid: server.pid,
            text: format!("Client process {pid} disconnected"),
        }]
    }

    /// What `ps` prints: nothing without clients, else a header and one row per client.
    fn ps(&self) -> Vec<String> {
        let Some(server) = self.server.as_ref().filter(|s| !s.clients.is_empty()) else {
            return Vec::new();
        };
        let row = |cols: [&str; 6]| {
            format!(
                "{:<10}{:<10}{:<15}{:<26}{:<15}{:<15}",
                cols[0], cols[1], cols[2], cols[3], cols[4], cols[5]
            )
        };
        let device: String = self.device_uuid.chars().take(22).collect();
        let mut lines = vec![row(["PID", "ID", "SERVER", "DEVICE", "NAMESPACE", "COMMAND"])];
        for (i, client) in server.clients.iter().enumerate() {
            lines.push(row([
                &client.to_string(),
                &(i + 1).to_string(),
                &server.pid.to_string(),
                &device,
                &pid_namespace(*client),
                &command_name(*client),
            ]));
        }
        lines
    }

    /// Stops the server, as `quit` does.
    fn shutdown(&mut self) -> Vec<LogLine> {
        let mut log = Vec::new();
        if let Some(server) = self.server.take() {
            log.push(
                self.control(format!(
                    "Try shutting down server {}, backoff is disabled",
                    server.pid
                )),
            );
            log.push(self.control(format!("Server {} exited with status 0", server.pid)));
        }
        log.push(self.control("Exit with status 0"));
        log
    }
}

/// A percentage as the daemon prints it: one decimal.
fn percent(value: f64) -> String {
    format!("{value:.1}")
}

/// A valid active thread percentage: a number in (0, 100].
fn parse_percentage(text: Option<&&str>) -> Option<f64> {
    let value: f64 = text?.parse().ok()?;
    (value > 0.0 && value <= 100.0).then_some(value)
}

/// Bytes of a pinned memory limit written `<n>G` or `<n>M`.
fn mem_limit_bytes(text: &str) -> Option<u64> {
    let (digits, shift) =
        if let Some(d) = text.strip_suffix('G') { (d, 30) } else { (text.strip_suffix('M')?, 20) };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// The PID namespace inode of a process, as `ps` shows it ("-" when it cannot be read).
fn pid_namespace(pid: u32) -> String {
    fs::read_link(format!("/proc/{pid}/ns/pid"))
        .ok()
        .and_then(|target| {
            let text = target.to_string_lossy().into_owned();
            let inode = text.strip_prefix("pid:[")?.strip_suffix(']')?.to_string();
            Some(inode)
        })
        .unwrap_or_else(|| "-".into())
}

/// The command name of a process, as `ps` shows it ("-" when it cannot be read).
fn command_name(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_string())
        .ok()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "-".into())
}

/// The daemon's answer to one command line from a client, and what it logs: `Cmd:<line>`,
/// then any remarks, then the answer's lines (the real daemon logs its answers too).
fn answer(state: &mut State, line: &str) -> Answer {
    let line = line.trim();
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut notes: Vec<LogLine> = Vec::new();
    let mut reply: Vec<String> = Vec::new();
    let mut quit = false;
    match words.as_slice() {
        [] => return Answer::default(),
        ["get_server_list", ..] => reply.extend(state.server.as_ref().map(|s| s.pid.to_string())),
        ["start_server", rest @ ..] => {
            let uid = match rest {
                ["-uid", uid, ..] => uid.parse().ok(),
                _ => None,
            };
            if state.server.is_none() {
                let uid = uid.unwrap_or(state.uid);
                notes.extend(state.start_server(uid));
            }
        }
        ["get_server_status", pid, ..] => {
            reply.extend(state.server_ref(pid).map(|_| "ACTIVE".to_string()));
        }
        ["get_client_list", pid, ..] => {
            if let Some(server) = state.server_ref(pid) {
                reply.extend(server.clients.iter().map(u32::to_string));
            }
        }
        ["get_device_client_list", rest @ ..] => {
            let server = match rest.first() {
                Some(pid) => state.server_ref(pid),
                None => state.server.as_ref(),
            };
            if let Some(server) = server.filter(|s| !s.clients.is_empty()) {
                reply.push(DEVICE_LINE.to_string());
                reply.extend(server.clients.iter().map(|c| format!("{c}.1")));
            }
        }
        ["set_default_active_thread_percentage", rest @ ..] => {
            match parse_percentage(rest.first()) {
                Some(value) => state.default_percentage = Some(value),
                None => notes.push(state.control(INVALID_PERCENTAGE)),
            }
            reply.push(percent(state.default_percentage()));
        }
        ["get_default_active_thread_percentage", ..] => {
            reply.push(percent(state.default_percentage()));
        }
        ["set_active_thread_percentage", pid, rest @ ..] => {
            let value = parse_percentage(rest.first());
            let invalid = state.control(INVALID_PERCENTAGE);
            if let Some(server) = state.server_mut(pid) {
                match value {
                    Some(value) => server.percentage = value,
                    None => notes.push(invalid),
                }
                reply.push(percent(server.percentage));
            }
        }
        ["get_active_thread_percentage", pid, ..] => {
            reply.extend(state.server_ref(pid).map(|s| percent(s.percentage)));
        }
        ["set_default_device_pinned_mem_limit", device, value, ..]
            if mem_limit_bytes(value).is_some() =>
        {
            state.default_pinned.insert(device.to_string(), value.to_string());
            notes.push(
                state.control(format!("set_default_device_pinned_mem_limit {device} {value}.")),
            );
        }
        ["get_default_device_pinned_mem_limit", device, ..] => {
            match state.default_pinned.get(*device) {
                Some(value) => reply.push(value.clone()),
                None => notes.push(state.control(NO_DEFAULT_PINNED_LIMIT)),
            }
        }
        ["set_device_pinned_mem_limit", pid, device, value, ..]
            if mem_limit_bytes(value).is_some() =>
        {
            let note =
                state.control(format!("set_device_pinned_mem_limit {pid} {device} {value}."));
            if let Some(server) = state.server_mut(pid) {
                server.pinned.insert(device.to_string(), value.to_string());
                notes.push(note);
            }
        }
        ["get_device_pinned_mem_limit", pid, device, ..] => {
            let value = state.server_ref(pid).map(|s| s.pinned.get(*device).cloned());
            match value {
                Some(Some(value)) => reply.push(value),
                Some(None) => {
                    notes.push(state.control("No pinned memory limit set for the device!"))
                }
                None => {}
            }
        }
        ["set_default_device_pinned_mem_limit" | "set_device_pinned_mem_limit", ..] => {
            notes.push(state.control("Invalid memory limit, expected <n>G or <n>M"));
        }
        ["terminate_client", server, client, ..] => {
            let client: Option<u32> = client.parse().ok();
            if let (Some(server), Some(client)) = (state.server_mut(server), client) {
                server.clients.retain(|&c| c != client);
            }
        }
        ["ps", ..] => reply = state.ps(),
        ["set_default_client_priority", priority @ ("0" | "1"), ..] => {
            state.default_priority = priority.parse().unwrap_or(0);
        }
        ["get_default_client_priority", ..] => reply.push(state.default_priority.to_string()),
        ["quit", ..] => {
            quit = true;
            notes.extend(state.shutdown());
        }
        [command, ..] => reply.push(format!("Unknown command \"{command}\"")),
    }
    let mut log = vec![state.control(format!("Cmd:{line}"))];
    log.extend(notes);
    log.extend(reply.iter().map(|r| state.control(r.clone())));
    Answer { reply, log, quit }
}

// ---------------------------------------------------------------------------------------
// The daemon process
// ---------------------------------------------------------------------------------------

/// Where and how a control daemon runs.
#[derive(Debug, Clone)]
struct DaemonConfig {
    pipe_dir: PathBuf,
    log_dir: PathBuf,
    /// The PID it writes and logs (the process's own, except in unit tests).
    pid: u32,
    /// `CUDA_VISIBLE_DEVICES` as the daemon was started with it.
    visible_devices: Option<String>,
    record: Option<PathBuf>,
    /// Also print the log lines on stdout (`-f`).
    echo: bool,
}

/// Why the daemon stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExitReason {
    Quit,
    Signal,
    PipeDirRemoved,
}

impl ExitReason {
    fn name(self) -> &'static str {
        match self {
            ExitReason::Quit => "quit",
            ExitReason::Signal => "signal",
            ExitReason::PipeDirRemoved => "pipe-dir-removed",
        }
    }
}

/// Why the daemon did not start.
#[derive(Debug)]
enum ServeError {
    /// The daemon with this PID owns the pipe directory.
    AlreadyRunning(u32),
    Io(io::Error),
}

impl From<io::Error> for ServeError {
    fn from(e: io::Error) -> Self {
        ServeError::Io(e)
    }
}

/// What the accepting loop and the connection threads share.
struct Daemon {
    cfg: DaemonConfig,
    state: Mutex<State>,
    quit: AtomicBool,
}

impl Daemon {
    /// Appends log lines (callers hold the state lock, which keeps the lines in order).
    fn write_log(&self, lines: &[LogLine]) {
        if lines.is_empty() {
            return;
        }
        let timestamp = timestamp();
        for (file, name) in [(LogFile::Control, "control.log"), (LogFile::Server, "server.log")] {
            let text: String = lines
                .iter()
                .filter(|l| l.file == file)
                .map(|l| l.render(&timestamp) + "\n")
                .collect();
            if text.is_empty() {
                continue;
            }
            if self.cfg.echo {
                print!("{text}");
                let _ = io::stdout().flush();
            }
            let _ = OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.cfg.log_dir.join(name))
                .and_then(|mut f| f.write_all(text.as_bytes()));
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Local time as the real logs show it: `2026-11-22 07:35:47.100`.
fn timestamp() -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = libc::time_t::try_from(now.as_secs()).unwrap_or(0);
    let mut tm = MaybeUninit::<libc::tm>::zeroed();
    // SAFETY: `secs` and `tm` are valid for the call; localtime_r is the thread-safe variant
    // and writes only into `tm`.
    let converted = unsafe { !libc::localtime_r(&secs, tm.as_mut_ptr()).is_null() };
    // SAFETY: `tm` was zero-initialised, a valid `libc::tm` (integers and a nullable pointer),
    // and localtime_r only stores valid values into it.
    let tm = unsafe { tm.assume_init() };
    if !converted {
        return format!("{}.{:03}", now.as_secs(), now.subsec_millis());
    }
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        now.subsec_millis()
    )
}

/// The PID in the pipe directory's PID file, if any.
fn read_pid_file(pipe_dir: &Path) -> Option<u32> {
    fs::read_to_string(pipe_dir.join(PID_FILE)).ok()?.trim().parse().ok()
}

/// Whether process `pid` exists and is not a zombie (a daemon that exited but that no one
/// has reaped yet is not running).
fn alive(pid: u32) -> bool {
    if let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat"))
        && let Some((_, after_name)) = stat.rsplit_once(')')
        && after_name.trim_start().starts_with(['Z', 'X'])
    {
        return false;
    }
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 sends nothing; it only checks that `pid` (> 0, so one
    // process, never a group) exists.
    let result = unsafe { libc::kill(pid, 0) };
    result == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The PID of a live daemon owning `pipe_dir`, going by its PID file.
fn running_pid(pipe_dir: &Path) -> Option<u32> {
    read_pid_file(pipe_dir).filter(|&pid| alive(pid))
}

/// Writes the PID file as the real daemon does: the PID without a newline, mode 0666.
/// Written to a temporary file and renamed, so a reader never sees it half written.
fn write_pid_file(pipe_dir: &Path, pid: u32) -> io::Result<()> {
    let tmp = pipe_dir.join(format!(".{PID_FILE}.{pid}.tmp"));
    let mut file =
        OpenOptions::new().create(true).write(true).truncate(true).mode(0o666).open(&tmp)?;
    file.write_all(pid.to_string().as_bytes())?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o666))?;
    fs::rename(&tmp, pipe_dir.join(PID_FILE))
}

/// Removes the socket and the PID file, when the PID file is this daemon's.
fn remove_own_files(pipe_dir: &Path, pid: u32) {
    if read_pid_file(pipe_dir) == Some(pid) {
        let _ = fs::remove_file(pipe_dir.join(SOCKET_NAME));
        let _ = fs::remove_file(pipe_dir.join(PID_FILE));
    }
}

/// Device and inode of a directory: tells a deleted or replaced pipe directory.
fn dir_identity(dir: &Path) -> Option<(u64, u64)> {
    fs::metadata(dir).ok().filter(|m| m.is_dir()).map(|m| (m.dev(), m.ino()))
}

/// Waits up to `timeout_ms` for `fd` to be readable.
fn wait_readable(fd: RawFd, timeout_ms: i32) -> bool {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: `pfd` is one valid, initialised pollfd that outlives the call, and the count
    // passed is 1.
    let ready = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    ready > 0
}

/// Runs a control daemon until `quit`, `terminate` turning true, or the pipe directory
/// going away. Creates the pipe and log directories when missing; fails when another live
/// daemon's PID file is in the pipe directory.
fn serve(cfg: DaemonConfig, terminate: &AtomicBool) -> Result<ExitReason, ServeError> {
    fs::create_dir_all(&cfg.pipe_dir)?;
    let _ = fs::create_dir_all(&cfg.log_dir);
    if let Some(pid) = running_pid(&cfg.pipe_dir)
        && pid != cfg.pid
    {
        return Err(ServeError::AlreadyRunning(pid));
    }
    let socket = cfg.pipe_dir.join(SOCKET_NAME);
    match fs::remove_file(&socket) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    // The socket first, then the PID file: whoever sees the PID file can connect.
    let listener = UnixListener::bind(&socket)?;
    fs::set_permissions(&socket, fs::Permissions::from_mode(0o666))?;
    listener.set_nonblocking(true)?;
    let dir_id = dir_identity(&cfg.pipe_dir);
    write_pid_file(&cfg.pipe_dir, cfg.pid)?;

    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let state = State::new(cfg.pid, uid, &socket, cfg.visible_devices.as_deref());
    let pipe = cfg.pipe_dir.display().to_string();
    let record = cfg.record.clone();
    let daemon = Arc::new(Daemon { cfg, state: Mutex::new(state), quit: AtomicBool::new(false) });
    let _ =
        OpenOptions::new().create(true).append(true).open(daemon.cfg.log_dir.join("server.log"));
    {
        let state = daemon.state();
        daemon.write_log(&[
            state.control(format!("Starting control daemon using socket {}", socket.display())),
            state.control(format!(
                "To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={pipe}"
            )),
            state.control(format!("CUDA MPS Control binary version: {BINARY_VERSION}")),
        ]);
    }
    let visible = daemon.cfg.visible_devices.as_deref().unwrap_or("(unset)");
    common::record(record.as_deref(), &format!("mps-control daemon pipe={pipe} visible={visible}"));

    let mut last_check = Instant::now();
    let reason = loop {
        if daemon.quit.load(Ordering::SeqCst) {
            break ExitReason::Quit;
        }
        if terminate.load(Ordering::SeqCst) {
            break ExitReason::Signal;
        }
        if last_check.elapsed() >= PIPE_DIR_CHECK {
            last_check = Instant::now();
            if dir_identity(&daemon.cfg.pipe_dir) != dir_id {
                break ExitReason::PipeDirRemoved;
            }
        }
        if !wait_readable(listener.as_raw_fd(), 50) {
            continue;
        }
        match listener.accept() {
            Ok((stream, _)) => {
                let daemon = Arc::clone(&daemon);
                std::thread::spawn(move || handle_connection(stream, &daemon));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    drop(listener);
    if reason != ExitReason::PipeDirRemoved {
        remove_own_files(&daemon.cfg.pipe_dir, daemon.cfg.pid);
    }
    common::record(
        record.as_deref(),
        &format!("mps-control daemon-exit pipe={pipe} reason={}", reason.name()),
    );
    Ok(reason)
}

/// The PID after `<command> ` on a fake-client line.
fn fake_client_arg(line: &str, command: &str) -> Option<u32> {
    line.strip_prefix(command)?.trim().parse().ok()
}

/// Serves one client connection: one command per line, each answered and then ended by
/// [`END_OF_ANSWER`].
fn handle_connection(stream: UnixStream, daemon: &Daemon) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(read_half) = stream.try_clone() else { return };
    let mut writer = stream;
    {
        let state = daemon.state();
        daemon.write_log(&[state.control("Accepting connection...")]);
    }
    let mut ui = false;
    for line in BufReader::new(read_half).lines() {
        let Ok(line) = line else { break };
        let line = line.trim();
        let (reply, quit) = {
            let mut state = daemon.state();
            let mut log = Vec::new();
            let mut reply = Vec::new();
            let mut quit = false;
            if let Some(pid) = fake_client_arg(line, FAKE_CONNECT) {
                log = state.connect_client(pid);
            } else if let Some(pid) = fake_client_arg(line, FAKE_EXIT) {
                log = state.client_exit(pid);
            } else if !line.is_empty() {
                if !ui {
                    ui = true;
                    log.push(state.control("NEW UI"));
                }
                let answer = answer(&mut state, line);
                log.extend(answer.log);
                reply = answer.reply;
                quit = answer.quit;
            }
            if quit {
                remove_own_files(&daemon.cfg.pipe_dir, daemon.cfg.pid);
            }
            daemon.write_log(&log);
            (reply, quit)
        };
        let mut text: String = reply.iter().map(|r| format!("{r}\n")).collect();
        text.push_str(END_OF_ANSWER);
        text.push('\n');
        let sent = writer.write_all(text.as_bytes()).and_then(|()| writer.flush());
        if quit {
            daemon.quit.store(true, Ordering::SeqCst);
            return;
        }
        if sent.is_err() {
            break;
        }
    }
    if ui {
        let state = daemon.state();
        daemon.write_log(&[state.control("UI closed")]);
    }
}

// ---------------------------------------------------------------------------------------
// Client side
// ---------------------------------------------------------------------------------------

/// Sends `lines` to the daemon of `pipe_dir`, one at a time, and prints the answers on
/// `out`; `describe` gives each line's record entry. Exit status: 0, or 1 when no daemon
/// answers on the socket.
fn converse(
    pipe_dir: &Path,
    lines: impl Iterator<Item = String>,
    out: &mut impl Write,
    record: Option<&Path>,
    describe: impl Fn(&str) -> String,
) -> u8 {
    let pipe = pipe_dir.display();
    let stream = match UnixStream::connect(pipe_dir.join(SOCKET_NAME)) {
        Ok(stream) => stream,
        Err(_) => {
            common::record(record, &format!("mps-control pipe={pipe} error=no-daemon"));
            let _ = writeln!(out, "{NO_DAEMON}");
            return 1;
        }
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(read_half) = stream.try_clone() else { return 1 };
    let mut reader = BufReader::new(read_half);
    let mut writer = stream;
    for line in lines {
        common::record(record, &format!("mps-control pipe={pipe} {}", describe(&line)));
        if writeln!(writer, "{line}").and_then(|()| writer.flush()).is_err() {
            return 0;
        }
        loop {
            let mut answer = String::new();
            match reader.read_line(&mut answer) {
                // The daemon is gone (after `quit`): nothing more to ask.
                Ok(0) => return 0,
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return 0,
                Ok(_) => {}
                Err(e) => {
                    let _ = writeln!(out, "fake nvidia-cuda-mps-control: no answer: {e}");
                    return 1;
                }
            }
            let answer = answer.trim_end_matches(['\n', '\r']);
            if answer == END_OF_ANSWER {
                break;
            }
            let _ = writeln!(out, "{answer}");
        }
    }
    let _ = out.flush();
    0
}

/// Client mode: commands from `input`, one per line (blank lines skipped), answers on `out`.
fn run_client(
    pipe_dir: &Path,
    input: impl BufRead,
    out: &mut impl Write,
    record: Option<&Path>,
) -> u8 {
    let lines = input.lines().map_while(Result::ok).map(|l| l.trim().to_string());
    converse(pipe_dir, lines.filter(|l| !l.is_empty()), out, record, |l| format!("cmd={l}"))
}

/// `--fake-client PID` (`connect`) or `--fake-client-exit PID`.
fn run_fake_client(
    pipe_dir: &Path,
    pid: u32,
    connect: bool,
    out: &mut impl Write,
    record: Option<&Path>,
) -> u8 {
    let (command, key) =
        if connect { (FAKE_CONNECT, "fake-client") } else { (FAKE_EXIT, "fake-client-exit") };
    let line = format!("{command} {pid}");
    converse(pipe_dir, std::iter::once(line), out, record, |_| format!("{key}={pid}"))
}

// ---------------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------------

/// Set by SIGTERM / SIGINT.
static TERMINATE: AtomicBool = AtomicBool::new(false);

extern "C" fn on_terminate(_signal: libc::c_int) {
    TERMINATE.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    let handler = on_terminate as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: `on_terminate` only stores to an atomic, which is async-signal-safe, and
        // it is a plain function that lives as long as the process.
        unsafe { libc::signal(signal, handler) };
    }
}

/// The environment the tool reads.
struct Env {
    pipe_dir: PathBuf,
    log_dir: PathBuf,
    visible_devices: Option<String>,
    record: Option<PathBuf>,
}

impl Env {
    fn from_process() -> Env {
        let dir = |name: &str, default: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map_or_else(|| PathBuf::from(default), PathBuf::from)
        };
        Env {
            pipe_dir: dir("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_PIPE_DIR),
            log_dir: dir("CUDA_MPS_LOG_DIRECTORY", DEFAULT_LOG_DIR),
            visible_devices: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
            record: common::record_path_from_env(),
        }
    }

    fn daemon_config(&self, echo: bool) -> DaemonConfig {
        DaemonConfig {
            pipe_dir: self.pipe_dir.clone(),
            log_dir: self.log_dir.clone(),
            pid: std::process::id(),
            visible_devices: self.visible_devices.clone(),
            record: self.record.clone(),
            echo,
        }
    }
}

/// What the command line asks for.
#[derive(Debug, PartialEq)]
enum Mode {
    Client,
    Background,
    Foreground,
    Serve,
    Help,
    FakeClient(u32),
    FakeClientExit(u32),
}

fn parse_args(args: &[String]) -> Result<Mode, String> {
    let mut mode = Mode::Client;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let next = match arg.as_str() {
            "-d" | "--daemon" => Mode::Background,
            "-f" | "--forground" | "--foreground" => Mode::Foreground,
            "-M" | "--multiuser-server" | "-q" | "--ready-devices" => continue,
            "-h" | "--help" => Mode::Help,
            SERVE_ARG => Mode::Serve,
            "--fake-client" | "--fake-client-exit" => {
                let pid = it
                    .next()
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(|| format!("{arg} needs a PID"))?;
                if arg == "--fake-client" {
                    Mode::FakeClient(pid)
                } else {
                    Mode::FakeClientExit(pid)
                }
            }
            other => return Err(format!("Invalid option: {other}")),
        };
        if mode != Mode::Client && mode != next {
            return Err(format!("{arg} cannot be combined with the options before it"));
        }
        mode = next;
    }
    Ok(mode)
}

/// Serves in this process (`-f`, or the re-executed `--serve`).
fn run_daemon(env: &Env, echo: bool, already_running_status: u8) -> u8 {
    install_signal_handlers();
    match serve(env.daemon_config(echo), &TERMINATE) {
        Ok(_) => 0,
        Err(ServeError::AlreadyRunning(pid)) => {
            println!("{ALREADY_RUNNING}");
            eprintln!("fake nvidia-cuda-mps-control: daemon {pid} owns {}", env.pipe_dir.display());
            already_running_status
        }
        Err(ServeError::Io(e)) => {
            eprintln!("fake nvidia-cuda-mps-control: cannot start the daemon: {e}");
            1
        }
    }
}

/// `-d`: starts the daemon detached (re-executed with `--serve` in a new session, stdio on
/// /dev/null) and returns once its socket and PID file exist.
fn start_background(env: &Env) -> u8 {
    if running_pid(&env.pipe_dir).is_some() {
        println!("{ALREADY_RUNNING}");
        return 1;
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("fake nvidia-cuda-mps-control: cannot find its own binary: {e}");
            return 1;
        }
    };
    let mut command = Command::new(exe);
    command.arg(SERVE_ARG).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    // SAFETY: the closure runs in the forked child before exec and only calls setsid(2),
    // which is async-signal-safe; it takes no lock and allocates nothing.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() == -1 { Err(io::Error::last_os_error()) } else { Ok(()) }
        });
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("fake nvidia-cuda-mps-control: cannot start the daemon: {e}");
            return 1;
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if read_pid_file(&env.pipe_dir) == Some(child.id()) {
            return 0;
        }
        if let Ok(Some(status)) = child.try_wait() {
            if status.code() == Some(i32::from(EXIT_ALREADY_RUNNING)) {
                println!("{ALREADY_RUNNING}");
            } else {
                eprintln!("fake nvidia-cuda-mps-control: the daemon exited at start ({status})");
            }
            return 1;
        }
        if Instant::now() > deadline {
            eprintln!("fake nvidia-cuda-mps-control: the daemon did not start within 10 s");
            return 1;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let env = Env::from_process();
    let mode = match parse_args(&args) {
        Ok(mode) => mode,
        Err(message) => {
            eprintln!("{message}");
            eprint!("{HELP}");
            return ExitCode::from(1);
        }
    };
    let record = env.record.as_deref();
    let mut stdout = io::stdout().lock();
    let status = match mode {
        Mode::Help => {
            print!("{HELP}");
            0
        }
        Mode::Client => run_client(&env.pipe_dir, io::stdin().lock(), &mut stdout, record),
        Mode::FakeClient(pid) => run_fake_client(&env.pipe_dir, pid, true, &mut stdout, record),
        Mode::FakeClientExit(pid) => {
            run_fake_client(&env.pipe_dir, pid, false, &mut stdout, record)
        }
        Mode::Background => start_background(&env),
        Mode::Foreground => {
            drop(stdout);
            run_daemon(&env, true, 1)
        }
        Mode::Serve => {
            drop(stdout);
            run_daemon(&env, false, EXIT_ALREADY_RUNNING)
        }
    };
    ExitCode::from(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        State::new(408, 0, Path::new("/tmp/x/pipe/control"), None)
    }

    fn control_texts(log: &[LogLine]) -> Vec<&str> {
        log.iter().filter(|l| l.file == LogFile::Control).map(|l| l.text.as_str()).collect()
    }

    /// Sends `line`, checks the answer's lines and its control.log lines.
    fn check(state: &mut State, line: &str, reply: &[&str], log: &[&str]) {
        let answer = answer(state, line);
        assert_eq!(answer.reply, reply, "answer to {line:?}");
        assert_eq!(control_texts(&answer.log), log, "log of {line:?}");
        assert!(answer.log.iter().all(|l| l.file == LogFile::Server || l.pid == 408));
    }

    #[test]
    fn answers_as_the_probe_shows() {
        let mut s = state();
        check(&mut s, "get_server_list", &[], &["Cmd:get_server_list"]);
        check(
            &mut s,
            "set_default_active_thread_percentage 25",
            &["25.0"],
            &["Cmd:set_default_active_thread_percentage 25", "25.0"],
        );
        check(
            &mut s,
            "get_default_active_thread_percentage",
            &["25.0"],
            &["Cmd:get_default_active_thread_percentage", "25.0"],
        );
        check(
            &mut s,
            "set_default_device_pinned_mem_limit 0 2G",
            &[],
            &[
                "Cmd:set_default_device_pinned_mem_limit 0 2G",
                "set_default_device_pinned_mem_limit 0 2G.",
            ],
        );
        check(
            &mut s,
            "get_default_device_pinned_mem_limit 0",
            &["2G"],
            &["Cmd:get_default_device_pinned_mem_limit 0", "2G"],
        );
        check(
            &mut s,
            "get_default_device_pinned_mem_limit 1",
            &[],
            &[
                "Cmd:get_default_device_pinned_mem_limit 1",
                "No default pinned memory limit set for the device!",
            ],
        );
        check(
            &mut s,
            "set_default_active_thread_percentage 250",
            &["25.0"],
            &[
                "Cmd:set_default_active_thread_percentage 250",
                "Invalid percentage, expected between (0.0, 100.0]",
                "25.0",
            ],
        );
        check(
            &mut s,
            "bogus_command",
            &["Unknown command \"bogus_command\""],
            &["Cmd:bogus_command", "Unknown command \"bogus_command\""],
        );

        // A client connects: the daemon starts its server with the defaults set above.
        let log = s.connect_client(438);
        assert_eq!(
            control_texts(&log),
            [
                "User did not send valid credentials",
                "Accepting connection...",
                "NEW CLIENT 438 from user 0: Server is not ready, push client to pending list",
                "Starting new server 409 for user 0",
                "NEW SERVER 409: Ready",
            ]
        );
        let starting = log.iter().find(|l| l.text.starts_with("Starting new server")).unwrap();
        assert_eq!(starting.pid, 409, "the real log names the server's PID here");
        let server_log: Vec<&str> =
            log.iter().filter(|l| l.file == LogFile::Server).map(|l| l.text.as_str()).collect();
        for line in [
            "Active Threads Percentage set to 25.0",
            "Device pinned memory limit for device 0 set to 0x80000000 bytes",
            "Server has started",
            "Client {PID: 438, Context ID: 1} connected",
        ] {
            assert!(server_log.contains(&line), "{line:?} in {server_log:?}");
        }

        check(&mut s, "get_server_list", &["409"], &["Cmd:get_server_list", "409"]);
        check(&mut s, "get_client_list 409", &["438"], &["Cmd:get_client_list 409", "438"]);
        check(
            &mut s,
            "get_device_client_list",
            &["[0] 00:00.0, NVIDIA H100 80GB HBM3", "438.1"],
            &["Cmd:get_device_client_list", "[0] 00:00.0, NVIDIA H100 80GB HBM3", "438.1"],
        );
        check(
            &mut s,
            "get_active_thread_percentage 409",
            &["25.0"],
            &["Cmd:get_active_thread_percentage 409", "25.0"],
        );
        let ps = answer(&mut s, "ps").reply;
        assert_eq!(ps.len(), 2);
        assert_eq!(
            ps[0],
            "PID       ID        SERVER         DEVICE                    NAMESPACE      COMMAND        "
        );
        assert!(
            ps[1].starts_with("438       1         409            GPU-00000000-0000-0000    "),
            "{:?}",
            ps[1]
        );

        let quit = answer(&mut s, "quit");
        assert!(quit.quit);
        assert!(quit.reply.is_empty());
        assert_eq!(
            control_texts(&quit.log),
            [
                "Cmd:quit",
                "Try shutting down server 409, backoff is disabled",
                "Server 409 exited with status 0",
                "Exit with status 0",
            ]
        );
    }

    #[test]
    fn log_lines_render_as_the_real_ones() {
        let line =
            LogLine { file: LogFile::Control, tag: "Control", pid: 408, text: "NEW UI".into() };
        assert_eq!(
            line.render("2026-11-22 07:35:47.103"),
            "[2026-11-22 07:35:47.103 Control   408] NEW UI"
        );
        let line =
            LogLine { file: LogFile::Server, tag: "Other", pid: 441, text: "Startup".into() };
        assert_eq!(
            line.render("2026-11-22 07:35:47.205"),
            "[2026-11-22 07:35:47.205 Other   441] Startup"
        );
        let line = LogLine { file: LogFile::Control, tag: "Control", pid: 11107, text: "x".into() };
        assert_eq!(line.render("t"), "[t Control 11107] x");
        let ts = timestamp();
        assert_eq!(ts.len(), "2026-11-22 07:35:47.103".len(), "{ts}");
    }

    #[test]
    fn defaults_and_validation() {
        let mut s = state();
        check(
            &mut s,
            "get_default_active_thread_percentage",
            &["100.0"],
            &["Cmd:get_default_active_thread_percentage", "100.0"],
        );
        for bad in ["0", "-5", "100.1", "abc", "nan", ""] {
            let line = format!("set_default_active_thread_percentage {bad}");
            assert_eq!(answer(&mut s, &line).reply, ["100.0"], "{line}");
        }
        assert_eq!(answer(&mut s, "set_default_active_thread_percentage 100").reply, ["100.0"]);
        assert_eq!(answer(&mut s, "set_default_active_thread_percentage 12.5").reply, ["12.5"]);
        assert_eq!(answer(&mut s, "set_default_active_thread_percentage 33.333").reply, ["33.3"]);

        check(
            &mut s,
            "set_default_device_pinned_mem_limit 1 512M",
            &[],
            &[
                "Cmd:set_default_device_pinned_mem_limit 1 512M",
                "set_default_device_pinned_mem_limit 1 512M.",
            ],
        );
        assert_eq!(answer(&mut s, "get_default_device_pinned_mem_limit 1").reply, ["512M"]);
        for bad in ["2T", "G", "1.5G", "2g", "-1G"] {
            let line = format!("set_default_device_pinned_mem_limit 0 {bad}");
            assert!(answer(&mut s, &line).reply.is_empty());
            assert!(
                answer(&mut s, "get_default_device_pinned_mem_limit 0").reply.is_empty(),
                "{bad}"
            );
        }
        assert_eq!(mem_limit_bytes("2G"), Some(0x8000_0000));
        assert_eq!(mem_limit_bytes("512M"), Some(512 << 20));

        assert_eq!(answer(&mut s, "bogus 1 2").reply, ["Unknown command \"bogus\""]);
        assert_eq!(answer(&mut s, "   "), Answer::default());
        assert!(answer(&mut s, "ps").reply.is_empty());
        assert!(answer(&mut s, "get_device_client_list").reply.is_empty());
        assert!(answer(&mut s, "get_client_list 409").reply.is_empty());
        assert!(answer(&mut s, "get_active_thread_percentage 409").reply.is_empty());
    }

    #[test]
    fn per_server_settings_and_clients() {
        let mut s = state();
        answer(&mut s, "set_default_active_thread_percentage 50");
        answer(&mut s, "start_server -uid 1000");
        assert_eq!(s.server.as_ref().map(|v| (v.pid, v.uid)), Some((409, 1000)));
        assert_eq!(answer(&mut s, "get_server_status 409").reply, ["ACTIVE"]);
        // Defaults set after the server started do not change it.
        answer(&mut s, "set_default_active_thread_percentage 10");
        assert_eq!(answer(&mut s, "get_active_thread_percentage 409").reply, ["50.0"]);
        assert_eq!(answer(&mut s, "set_active_thread_percentage 409 20").reply, ["20.0"]);
        assert_eq!(answer(&mut s, "set_active_thread_percentage 409 0").reply, ["20.0"]);
        assert_eq!(answer(&mut s, "get_active_thread_percentage 409").reply, ["20.0"]);
        assert!(answer(&mut s, "set_active_thread_percentage 999 20").reply.is_empty());

        assert!(answer(&mut s, "set_device_pinned_mem_limit 409 0 1G").reply.is_empty());
        assert_eq!(answer(&mut s, "get_device_pinned_mem_limit 409 0").reply, ["1G"]);
        assert!(answer(&mut s, "get_device_pinned_mem_limit 409 1").reply.is_empty());

        s.connect_client(100);
        let log = s.connect_client(101);
        assert!(control_texts(&log).contains(&"NEW CLIENT 101 from user 0: Server already exists"));
        assert_eq!(answer(&mut s, "get_client_list 409").reply, ["100", "101"]);
        assert_eq!(answer(&mut s, "ps").reply.len(), 3);
        let log = s.client_exit(100);
        assert_eq!(log[0].text, "Client process 100 disconnected");
        assert!(s.client_exit(100).is_empty());
        assert_eq!(answer(&mut s, "get_client_list 409").reply, ["101"]);
        answer(&mut s, "terminate_client 409 101");
        assert!(answer(&mut s, "get_client_list 409").reply.is_empty());
        // The server outlives its clients.
        assert_eq!(answer(&mut s, "get_server_list").reply, ["409"]);
    }

    #[test]
    fn ps_shows_the_visible_device_and_the_process() {
        let me = std::process::id();
        let mut s = State::new(
            7,
            0,
            Path::new("/p/control"),
            Some("GPU-cc30f0e5-9f43-576f-21d0-04eb0bb6e180,GPU-2"),
        );
        s.connect_client(me);
        let ps = s.ps();
        let cols: Vec<&str> = ps[1].split_whitespace().collect();
        assert_eq!(cols[..4], [me.to_string().as_str(), "1", "8", "GPU-cc30f0e5-9f43-576f"]);
        assert_eq!(cols[4], pid_namespace(me));
        assert!(cols[4].bytes().all(|b| b.is_ascii_digit()), "{}", cols[4]);
        assert_eq!(cols[5], fs::read_to_string("/proc/self/comm").unwrap().trim());
    }

    #[test]
    fn command_line() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(parse_args(&args(&[])), Ok(Mode::Client));
        assert_eq!(parse_args(&args(&["-d"])), Ok(Mode::Background));
        assert_eq!(parse_args(&args(&["-M", "-d"])), Ok(Mode::Background));
        assert_eq!(parse_args(&args(&["--forground"])), Ok(Mode::Foreground));
        assert_eq!(parse_args(&args(&["--fake-client", "12"])), Ok(Mode::FakeClient(12)));
        assert_eq!(parse_args(&args(&["--fake-client-exit", "12"])), Ok(Mode::FakeClientExit(12)));
        assert!(parse_args(&args(&["--fake-client"])).is_err());
        assert!(parse_args(&args(&["-x"])).is_err());
        assert!(parse_args(&args(&["-d", "-f"])).is_err());
    }

    struct Running {
        dir: tempfile::TempDir,
        terminate: Arc<AtomicBool>,
        thread: std::thread::JoinHandle<Result<ExitReason, ServeError>>,
    }

    impl Running {
        fn pipe(&self) -> PathBuf {
            self.dir.path().join("pipe")
        }
        fn record(&self) -> PathBuf {
            self.dir.path().join("record")
        }
        fn ask(&self, input: &str) -> (u8, String) {
            let mut out = Vec::new();
            let status = run_client(&self.pipe(), input.as_bytes(), &mut out, Some(&self.record()));
            (status, String::from_utf8(out).unwrap())
        }
        /// Waits for the daemon to stop; returns why, and the directory (kept until dropped).
        fn join(self) -> (ExitReason, tempfile::TempDir) {
            let deadline = Instant::now() + Duration::from_secs(5);
            while !self.thread.is_finished() {
                assert!(Instant::now() < deadline, "the daemon did not stop");
                std::thread::sleep(Duration::from_millis(10));
            }
            (self.thread.join().unwrap().unwrap(), self.dir)
        }
    }

    /// Starts `serve` in a thread on a fresh temporary pipe directory; waits for its PID file.
    fn start(pid: u32) -> Running {
        let dir = tempfile::tempdir().unwrap();
        let cfg = DaemonConfig {
            pipe_dir: dir.path().join("pipe"),
            log_dir: dir.path().join("log"),
            pid,
            visible_devices: Some("GPU-abc".into()),
            record: Some(dir.path().join("record")),
            echo: false,
        };
        let terminate = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&terminate);
        let thread = std::thread::spawn(move || serve(cfg, &flag));
        let pipe = dir.path().join("pipe");
        let deadline = Instant::now() + Duration::from_secs(5);
        while read_pid_file(&pipe) != Some(pid) {
            assert!(Instant::now() < deadline, "no PID file");
            std::thread::sleep(Duration::from_millis(5));
        }
        Running { dir, terminate, thread }
    }

    #[test]
    fn daemon_end_to_end() {
        let pid = 4_000_001;
        let daemon = start(pid);
        let pipe = daemon.pipe();
        let pid_file = fs::read(pipe.join(PID_FILE)).unwrap();
        assert_eq!(pid_file, pid.to_string().as_bytes(), "no newline, as the real one");
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&pipe.join(PID_FILE)), 0o666);
        assert_eq!(mode(&pipe.join(SOCKET_NAME)), 0o666);

        let (status, out) = daemon.ask(
            "get_server_list\nset_default_active_thread_percentage 25\n\n\
             set_default_device_pinned_mem_limit 0 2G\nget_default_device_pinned_mem_limit 0\n\
             get_default_device_pinned_mem_limit 1\nbogus_command\n",
        );
        assert_eq!(status, 0);
        assert_eq!(out, "25.0\n2G\nUnknown command \"bogus_command\"\n");

        let mut sink = Vec::new();
        assert_eq!(run_fake_client(&pipe, 438, true, &mut sink, Some(&daemon.record())), 0);
        assert!(sink.is_empty());
        let server = (pid + 1).to_string();
        let (_, out) = daemon.ask(&format!("get_server_list\nget_client_list {server}\n"));
        assert_eq!(out, format!("{server}\n438\n"));
        assert_eq!(run_fake_client(&pipe, 438, false, &mut sink, Some(&daemon.record())), 0);
        let (_, out) = daemon.ask(&format!("get_client_list {server}\nps\n"));
        assert_eq!(out, "");

        let (status, out) = daemon.ask("quit\nget_server_list\n");
        assert_eq!((status, out.as_str()), (0, ""));
        // Files are gone by the time `quit` is answered.
        assert!(!pipe.join(PID_FILE).exists());
        assert!(!pipe.join(SOCKET_NAME).exists());
        let record_path = daemon.record();
        let (reason, dir) = daemon.join();
        assert_eq!(reason, ExitReason::Quit);

        let p = pipe.display();
        let record = fs::read_to_string(&record_path).unwrap();
        let expected = [
            format!("mps-control daemon pipe={p} visible=GPU-abc"),
            format!("mps-control pipe={p} cmd=get_server_list"),
            format!("mps-control pipe={p} cmd=set_default_active_thread_percentage 25"),
            format!("mps-control pipe={p} cmd=set_default_device_pinned_mem_limit 0 2G"),
            format!("mps-control pipe={p} cmd=get_default_device_pinned_mem_limit 0"),
            format!("mps-control pipe={p} cmd=get_default_device_pinned_mem_limit 1"),
            format!("mps-control pipe={p} cmd=bogus_command"),
            format!("mps-control pipe={p} fake-client=438"),
            format!("mps-control pipe={p} cmd=get_server_list"),
            format!("mps-control pipe={p} cmd=get_client_list {server}"),
            format!("mps-control pipe={p} fake-client-exit=438"),
            format!("mps-control pipe={p} cmd=get_client_list {server}"),
            format!("mps-control pipe={p} cmd=ps"),
            format!("mps-control pipe={p} cmd=quit"),
        ];
        let mut lines: Vec<&str> = record.lines().collect();
        assert_eq!(lines[..expected.len()], expected);
        // Then, in either order: the line asked after `quit` (recorded though no daemon
        // answered it) and the daemon's exit.
        let mut last = lines.split_off(expected.len());
        last.sort_unstable();
        assert_eq!(
            last,
            [
                format!("mps-control daemon-exit pipe={p} reason=quit"),
                format!("mps-control pipe={p} cmd=get_server_list"),
            ]
        );

        let log = fs::read_to_string(dir.path().join("log/control.log")).unwrap();
        let first = log.lines().next().unwrap();
        assert!(
            first.ends_with(&format!(
                "Control {pid}] Starting control daemon using socket {p}/control"
            )),
            "{first}"
        );
        for text in [
            "] NEW UI",
            "] Cmd:set_default_active_thread_percentage 25",
            "] UI closed",
            "] NEW CLIENT 438 from user",
            "] Cmd:quit",
            "] Exit with status 0",
        ] {
            assert!(log.contains(text), "{text:?} in\n{log}");
        }
        assert!(dir.path().join("log/server.log").exists());
    }

    #[test]
    fn daemon_stops_when_its_pipe_directory_goes() {
        let daemon = start(4_000_002);
        fs::remove_dir_all(daemon.pipe()).unwrap();
        let started = Instant::now();
        let record = daemon.record();
        let (reason, _dir) = daemon.join();
        assert_eq!(reason, ExitReason::PipeDirRemoved);
        assert!(started.elapsed() < Duration::from_secs(2));
        let record = fs::read_to_string(record).unwrap();
        assert!(record.ends_with("reason=pipe-dir-removed\n"), "{record}");
    }

    #[test]
    fn daemon_stops_on_terminate_and_cleans_up() {
        let daemon = start(4_000_003);
        let pipe = daemon.pipe();
        daemon.terminate.store(true, Ordering::SeqCst);
        let (reason, _dir) = daemon.join();
        assert_eq!(reason, ExitReason::Signal);
        assert!(pipe.exists());
        assert!(!pipe.join(PID_FILE).exists());
        assert!(!pipe.join(SOCKET_NAME).exists());
    }

    #[test]
    fn second_daemon_on_the_same_pipe_directory_fails() {
        let dir = tempfile::tempdir().unwrap();
        let pipe = dir.path().join("pipe");
        fs::create_dir_all(&pipe).unwrap();
        // A live process's PID in the PID file: this test process.
        fs::write(pipe.join(PID_FILE), std::process::id().to_string()).unwrap();
        let cfg = DaemonConfig {
            pipe_dir: pipe.clone(),
            log_dir: dir.path().join("log"),
            pid: 4_000_004,
            visible_devices: None,
            record: None,
            echo: false,
        };
        let result = serve(cfg.clone(), &AtomicBool::new(false));
        assert!(matches!(result, Err(ServeError::AlreadyRunning(p)) if p == std::process::id()));
        assert!(!pipe.join(SOCKET_NAME).exists());
        // A stale PID file (no such process) is taken over.
        fs::write(pipe.join(PID_FILE), "4000005").unwrap();
        let result = serve(cfg, &AtomicBool::new(true));
        assert_eq!(result.unwrap(), ExitReason::Signal);
    }

    #[test]
    fn zombies_are_not_running() {
        assert!(alive(std::process::id()));
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(pid) {
            assert!(Instant::now() < deadline, "exited `true` still counts as running");
            std::thread::sleep(Duration::from_millis(5));
        }
        child.wait().unwrap();
        assert!(!alive(0));
    }

    #[test]
    fn client_without_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("record");
        let mut out = Vec::new();
        let status =
            run_client(dir.path(), "get_server_list\n".as_bytes(), &mut out, Some(&record));
        assert_eq!(status, 1);
        assert_eq!(String::from_utf8(out).unwrap(), "Cannot find MPS control daemon process\n");
        let record = fs::read_to_string(record).unwrap();
        assert_eq!(record, format!("mps-control pipe={} error=no-daemon\n", dir.path().display()));
    }
}
