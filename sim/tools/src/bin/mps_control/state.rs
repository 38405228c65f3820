//! The simulated control daemon's state, and [`answer`]: each command answered as the real one.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use gpushare_sim_nvml::node::pid_alive;

use crate::log_line::{LogFile, LogLine};

const INVALID_PERCENTAGE: &str = "Invalid percentage, expected between (0.0, 100.0]";
const NO_DEFAULT_PINNED_LIMIT: &str = "No default pinned memory limit set for the device!";
/// What `get_device_client_list` shows for the device (the probe's H100).
const DEVICE_LINE: &str = "[0] 00:00.0, NVIDIA H100 80GB HBM3";
/// The device `ps` shows when `CUDA_VISIBLE_DEVICES` names no UUID.
const DEFAULT_DEVICE_UUID: &str = "GPU-00000000-0000-0000-0000-000000000000";
pub const BINARY_VERSION: u32 = 13000;

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
#[derive(Debug, Clone)]
pub struct State {
    control_pid: u32,
    /// The user a simulated client runs as (the daemon's).
    uid: u32,
    /// The control socket's path, as the server log names it.
    socket: String,
    /// What `ps` shows as the device.
    device_uuid: String,
    default_percentage: Option<f64>,
    default_pinned: BTreeMap<String, String>,
    default_priority: u32,
    server: Option<Server>,
    /// Whether a client's process still runs ([`pid_alive`], as the simulated driver
    /// decides it; unit tests of the answers swap it).
    running: fn(u32) -> bool,
}

/// What one command gets: the lines for the client, the log lines, whether the daemon quits.
#[derive(Debug, Default, PartialEq)]
pub struct Answer {
    pub reply: Vec<String>,
    pub log: Vec<LogLine>,
    pub quit: bool,
}

impl State {
    pub fn new(control_pid: u32, uid: u32, socket: &Path, visible_devices: Option<&str>) -> State {
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
            running: pid_alive,
        }
    }

    pub fn control(&self, text: impl Into<String>) -> LogLine {
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

    /// Drops the clients whose process no longer runs, as the real server does when a
    /// client ends (its CUDA context, and so its connection, goes with it), whether or not
    /// `--fake-client-exit` said so; returns the server's log lines of their leaving.
    /// Every answer that lists or counts clients prunes first.
    pub fn prune_exited(&mut self) -> Vec<LogLine> {
        let running = self.running;
        let Some(server) = self.server.as_mut() else { return Vec::new() };
        let (kept, gone): (Vec<u32>, Vec<u32>) =
            server.clients.iter().partition(|&&pid| running(pid));
        server.clients = kept;
        gone.into_iter().map(|pid| server.disconnected(pid)).collect()
    }

    /// The CUDA client `pid` connects (what `--fake-client PID` asks for).
    pub fn connect_client(&mut self, pid: u32) -> Vec<LogLine> {
        let uid = self.uid;
        let mut log = self.prune_exited();
        log.extend([
            self.control("User did not send valid credentials"),
            self.control("Accepting connection..."),
        ]);
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
    pub fn client_exit(&mut self, pid: u32) -> Vec<LogLine> {
        let mut log = self.prune_exited();
        let Some(server) = self.server.as_mut() else { return log };
        let before = server.clients.len();
        server.clients.retain(|&c| c != pid);
        if server.clients.len() < before {
            log.push(server.disconnected(pid));
        }
        log
    }

    /// The running server's clients as last pruned ([`State::prune_exited`]; none without
    /// a server).
    pub fn clients(&self) -> Vec<u32> {
        self.server.as_ref().map(|s| s.clients.clone()).unwrap_or_default()
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

impl Server {
    /// The server's log line of client `pid` leaving.
    fn disconnected(&self, pid: u32) -> LogLine {
        LogLine {
            file: LogFile::Server,
            tag: "Server",
            pid: self.pid,
            text: format!("Client process {pid} disconnected"),
        }
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
/// A pinned memory limit as the real daemon shows it: a gibibyte or more in whole `G`,
/// rounded down (an H100 answered `79G` for `81559M` and `19G` for `20389M`), less in `M`.
fn shown_limit(value: &str) -> String {
    match mem_limit_bytes(value) {
        Some(bytes) if bytes >= 1 << 30 => format!("{}G", bytes >> 30),
        _ => value.to_string(),
    }
}

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
/// then any remarks, then the answer's lines (the real daemon logs its answers too). Clients
/// whose process has ended are dropped first ([`State::prune_exited`]): no answer lists them.
pub fn answer(state: &mut State, line: &str) -> Answer {
    let line = line.trim();
    let words: Vec<&str> = line.split_whitespace().collect();
    if words.is_empty() {
        return Answer::default();
    }
    let gone = state.prune_exited();
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
                Some(value) => reply.push(shown_limit(value)),
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
    let mut log = gone;
    log.push(state.control(format!("Cmd:{line}")));
    log.extend(notes);
    log.extend(reply.iter().map(|r| state.control(r.clone())));
    Answer { reply, log, quit }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A daemon whose clients are made-up PIDs, each taken to run.
    fn state() -> State {
        State { running: |_| true, ..State::new(408, 0, Path::new("/tmp/x/pipe/control"), None) }
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
        // As the H100's daemon answered: whole G, rounded down.
        answer(&mut s, "set_default_device_pinned_mem_limit 1 81559M");
        assert_eq!(answer(&mut s, "get_default_device_pinned_mem_limit 1").reply, ["79G"]);
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

    fn server_texts(log: &[LogLine]) -> Vec<&str> {
        log.iter().filter(|l| l.file == LogFile::Server).map(|l| l.text.as_str()).collect()
    }

    /// Waits (5 s at most) for `pid`, killed, to have ended.
    fn wait_ended(pid: u32) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while pid_alive(pid) {
            assert!(std::time::Instant::now() < deadline, "killed {pid} still runs");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// A client whose process ends leaves every list without `--fake-client-exit`, as a
    /// real client's context (and so its connection) goes with its process: reaped, or a
    /// zombie its parent has not reaped yet.
    #[test]
    fn a_client_whose_process_ended_is_listed_no_more() {
        let mut s = State::new(7, 0, Path::new("/p/control"), None);
        let mut reaped = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let mut zombie = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let (a, b) = (reaped.id(), zombie.id());
        s.connect_client(a);
        s.connect_client(b);
        assert_eq!(answer(&mut s, "get_client_list 8").reply, [a.to_string(), b.to_string()]);
        assert_eq!(answer(&mut s, "ps").reply.len(), 3);

        reaped.kill().unwrap();
        reaped.wait().unwrap();
        let listed = answer(&mut s, "get_client_list 8");
        assert_eq!(listed.reply, [b.to_string()]);
        let gone = format!("Client process {a} disconnected");
        assert_eq!(server_texts(&listed.log), [gone.as_str()]);
        assert_eq!(control_texts(&listed.log), ["Cmd:get_client_list 8", &b.to_string()]);
        assert_eq!(s.clients(), [b], "pruned from the state");
        assert!(answer(&mut s, "get_client_list 8").log.iter().all(|l| l.file == LogFile::Control));
        assert_eq!(
            answer(&mut s, "get_device_client_list").reply,
            ["[0] 00:00.0, NVIDIA H100 80GB HBM3".to_string(), format!("{b}.1")]
        );
        assert_eq!(answer(&mut s, "ps").reply.len(), 2);

        // Killed but not reaped: a zombie of one thread has ended too.
        zombie.kill().unwrap();
        wait_ended(b);
        assert!(Path::new(&format!("/proc/{b}")).exists(), "the zombie awaits its parent");
        assert!(answer(&mut s, "get_device_client_list 8").reply.is_empty());
        assert!(answer(&mut s, "get_client_list 8").reply.is_empty());
        assert!(answer(&mut s, "ps").reply.is_empty());
        assert!(s.clients().is_empty());
        // Its leaving was logged once; `--fake-client-exit` afterwards finds nothing to do.
        assert!(s.client_exit(b).is_empty());
        // The server outlives its clients, as the real one does.
        assert_eq!(answer(&mut s, "get_server_list").reply, ["8"]);
        zombie.wait().unwrap();

        // A client that ended before a command that lists none is dropped all the same,
        // and a new client finds the server with only the live ones.
        let mut c = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        s.connect_client(c.id());
        c.kill().unwrap();
        c.wait().unwrap();
        let me = std::process::id();
        let log = s.connect_client(me);
        assert!(
            server_texts(&log)
                .contains(&format!("Client process {} disconnected", c.id()).as_str())
        );
        assert_eq!(s.clients(), [me]);
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
}
