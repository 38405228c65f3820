//! The simulated control daemon's servers and clients: which user's server runs, whom it
//! serves, who waits for a server of their own user, and how a server is replaced once its
//! clients are gone, as NVIDIA's daemon of driver 580 did on an H100
//! (tests/device/results/mps-privilege-h100-2026-12-06: `control.log` and `server.log`).
//!
//! Without `-M` a server serves the clients of one user. A client of another user waits
//! ("push client to pending list"); the daemon asks the server to shut down ("backoff is
//! disabled"), which it refuses while it has clients, and asks again after 200 ms, doubling
//! the wait each time ("backoff is enabled"). Once the server has no clients it exits, and
//! a server for the first user waiting starts, with the *default* limits (a per-server
//! override is not carried over); the waiting clients of that user connect to it. Accepted
//! `start_server -uid UID` requests wait in the same line, in the order they came (the
//! H100's daemon started nobody's requested server, shut it down at once as it had no
//! clients, then started the waiting client's). With `-M` one server, the owner's, serves
//! every user's clients at once, and the log names each client as the server's user.
//!
//! Not recorded, so chosen here: a client already being served, or of the server's user,
//! joins a server that is waiting to shut down; the retries stop when no one waits any more
//! (the waiting clients ended) unless `shutdown_server` asked for them; the wait stops
//! doubling at 51.2 s.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use gpushare_sim_nvml::node::pid_alive;

use crate::limits::{mem_limit_bytes, percent};
use crate::log_line::{LogFile, LogLine};

/// The device `ps` shows when `CUDA_VISIBLE_DEVICES` names no UUID.
const DEFAULT_DEVICE_UUID: &str = "GPU-00000000-0000-0000-0000-000000000000";
pub const BINARY_VERSION: u32 = 13000;
/// The first wait before the daemon asks a server with clients to shut down again; it
/// doubles at each refusal (200 ms, 400 ms, … 12800 ms on the H100).
const FIRST_BACKOFF_MS: u64 = 200;
/// Where the doubling stops (not recorded).
const LAST_BACKOFF_MS: u64 = 51_200;
/// The server's worker threads per client: a CUDA client holds two contexts with its
/// server (`Context ID: 0` and `1` in the server log), and the control log counted "2
/// active worker threads" for one client.
const THREADS_PER_CLIENT: usize = 2;

/// A client: its process, the user it runs as, and the GPU memory the node lists for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Client {
    pub pid: u32,
    pub uid: u32,
    pub memory: u64,
}

/// The one MPS server (never a process here).
#[derive(Debug, Clone, PartialEq)]
pub struct Server {
    pub pid: u32,
    /// The user it runs as and serves (with `-M`, the daemon's owner, serving everyone).
    pub uid: u32,
    pub percentage: f64,
    pub pinned: BTreeMap<String, String>,
    pub clients: Vec<Client>,
}

/// What waits for a server of its user: an accepted `start_server -uid`, or a client.
#[derive(Debug, Clone, PartialEq)]
enum Want {
    Server(u32),
    Client(Client),
}

impl Want {
    fn uid(&self) -> u32 {
        match self {
            Want::Server(uid) => *uid,
            Want::Client(client) => client.uid,
        }
    }
}

/// The daemon asks `server` to shut down again at `due`.
#[derive(Debug, Clone, Copy)]
struct Shutdown {
    server: u32,
    due: Instant,
    backoff_ms: u64,
    /// `shutdown_server` asked for it: it goes on whether anyone waits or not.
    asked: bool,
}

/// What the control daemon knows.
#[derive(Debug, Clone)]
pub struct State {
    control_pid: u32,
    /// The user who started the daemon: with root, the only one who may change it.
    pub owner: u32,
    /// `-M` (`--multiuser-server`): one server serves every user.
    pub multiuser: bool,
    /// The control socket's path, as the server log names it.
    socket: String,
    /// What `ps` shows as the device.
    device_uuid: String,
    pub default_percentage: Option<f64>,
    pub default_pinned: BTreeMap<String, String>,
    pub default_priority: u32,
    pub server: Option<Server>,
    /// The next server's PID: the daemon's + 1 for the first, then counting up.
    next_server_pid: u32,
    /// In the order they came.
    wants: Vec<Want>,
    shutdown: Option<Shutdown>,
    /// Whether a client's process still runs ([`pid_alive`], as the simulated driver
    /// decides it; unit tests swap it).
    running: fn(u32) -> bool,
}

/// A line of the server's log.
fn server_line(pid: u32, tag: &'static str, text: impl Into<String>) -> LogLine {
    LogLine { file: LogFile::Server, tag, pid, text: text.into() }
}

impl State {
    pub fn new(
        control_pid: u32,
        owner: u32,
        multiuser: bool,
        socket: &Path,
        visible_devices: Option<&str>,
    ) -> State {
        let first = visible_devices.and_then(|v| v.split(',').next()).map(str::trim);
        let device_uuid = match first {
            Some(d) if d.starts_with("GPU-") || d.starts_with("MIG-") => d.to_string(),
            _ => DEFAULT_DEVICE_UUID.to_string(),
        };
        State {
            control_pid,
            owner,
            multiuser,
            socket: socket.display().to_string(),
            device_uuid,
            default_percentage: None,
            default_pinned: BTreeMap::new(),
            default_priority: 0,
            server: None,
            next_server_pid: control_pid.wrapping_add(1),
            wants: Vec::new(),
            shutdown: None,
            running: pid_alive,
        }
    }

    /// The same state, deciding whether a client runs with `running` (unit tests).
    #[cfg(test)]
    pub fn with_running(self, running: fn(u32) -> bool) -> State {
        State { running, ..self }
    }

    pub fn control(&self, text: impl Into<String>) -> LogLine {
        LogLine { file: LogFile::Control, tag: "Control", pid: self.control_pid, text: text.into() }
    }

    pub fn default_percentage(&self) -> f64 {
        self.default_percentage.unwrap_or(100.0)
    }

    /// The server whose PID is `pid` (a decimal string).
    pub fn server_mut(&mut self, pid: &str) -> Option<&mut Server> {
        let pid: u32 = pid.parse().ok()?;
        self.server.as_mut().filter(|s| s.pid == pid)
    }

    pub fn server_ref(&self, pid: &str) -> Option<&Server> {
        let pid: u32 = pid.parse().ok()?;
        self.server.as_ref().filter(|s| s.pid == pid)
    }

    /// The user whose server serves `uid`'s clients: `uid`'s own, or with `-M` the owner's.
    fn served_by(&self, uid: u32) -> u32 {
        if self.multiuser { self.owner } else { uid }
    }

    /// The running server's user.
    fn serving(&self) -> Option<u32> {
        self.server.as_ref().map(|s| s.uid)
    }

    /// Starts a server for `uid` with the current defaults.
    fn start_server(&mut self, uid: u32) -> Vec<LogLine> {
        let pid = self.next_server_pid;
        self.next_server_pid = pid.wrapping_add(1);
        let percentage = self.default_percentage();
        let pinned = self.default_pinned.clone();
        let mut log = vec![
            // The real log names the new server's PID in this one control line.
            LogLine {
                file: LogFile::Control,
                tag: "Control",
                pid,
                text: format!("Starting new server {pid} for user {uid}"),
            },
            server_line(pid, "Other", "Startup"),
            server_line(
                pid,
                "Other",
                format!("Connecting to control daemon on socket: {}", self.socket),
            ),
            server_line(pid, "Other", "Initializing server process"),
            server_line(
                pid,
                "Server",
                format!("CUDA MPS Server for Linux/Unix. Binary version: {BINARY_VERSION}"),
            ),
        ];
        if self.default_percentage.is_some() {
            log.push(server_line(
                pid,
                "Server",
                format!("Active Threads Percentage set to {}", percent(percentage)),
            ));
        }
        for (device, limit) in &pinned {
            let bytes = mem_limit_bytes(limit).unwrap_or(0);
            log.push(server_line(
                pid,
                "Server",
                format!("Device pinned memory limit for device {device} set to {bytes:#x} bytes"),
            ));
        }
        log.push(server_line(
            pid,
            "Server",
            format!("Server Priority set to {}", self.default_priority),
        ));
        log.push(server_line(pid, "Server", "Server has started"));
        log.push(self.control("Accepting connection..."));
        log.push(self.control(format!("NEW SERVER {pid}: Ready")));
        self.server = Some(Server { pid, uid, percentage, pinned, clients: Vec::new() });
        log
    }

    /// Adds `client` to the running server (a client it serves already keeps its place
    /// and user, with the new memory).
    fn attach(&mut self, client: Client) -> Vec<LogLine> {
        let Some(server) = self.server.as_mut() else { return Vec::new() };
        let pid = client.pid;
        match server.clients.iter_mut().find(|c| c.pid == pid) {
            Some(known) => known.memory = client.memory,
            None => server.clients.push(client),
        }
        vec![server_line(
            server.pid,
            "Server",
            format!("Client {{PID: {pid}, Context ID: 1}} connected"),
        )]
    }

    /// Drops the clients whose process no longer runs, as the real server does when a
    /// client ends (its CUDA context, and so its connection, goes with it), whether or not
    /// `--fake-client-exit` said so; returns the server's log lines of their leaving.
    /// Waiting clients that ended stop waiting. Every answer that lists or counts clients
    /// prunes first.
    pub fn prune_exited(&mut self) -> Vec<LogLine> {
        let running = self.running;
        self.wants.retain(|w| !matches!(w, Want::Client(c) if !running(c.pid)));
        let Some(server) = self.server.as_mut() else { return Vec::new() };
        let (kept, gone): (Vec<Client>, Vec<Client>) =
            server.clients.drain(..).partition(|c| running(c.pid));
        server.clients = kept;
        gone.into_iter().map(|c| server.disconnected(c.pid)).collect()
    }

    /// The CUDA client `pid` of user `uid` connects (what `--fake-client PID` asks for):
    /// served at once by a server of its user, else waiting for one.
    pub fn connect_client(
        &mut self,
        pid: u32,
        uid: u32,
        memory: u64,
        now: Instant,
    ) -> Vec<LogLine> {
        let mut log = self.prune_exited();
        log.extend([
            self.control("User did not send valid credentials"),
            self.control("Accepting connection..."),
        ]);
        let client = Client { pid, uid, memory };
        let served = self.server.as_ref().is_some_and(|s| s.clients.iter().any(|c| c.pid == pid));
        let shown = self.served_by(uid);
        if served || self.serving() == Some(shown) {
            let server_uid = self.serving().unwrap_or(shown);
            log.push(self.control(format!(
                "NEW CLIENT {pid} from user {server_uid}: Server already exists"
            )));
            log.extend(self.attach(client));
            return log;
        }
        log.push(self.control(format!(
            "NEW CLIENT {pid} from user {shown}: Server is not ready, push client to pending list"
        )));
        match self.wants.iter_mut().find(|w| matches!(w, Want::Client(c) if c.pid == pid)) {
            Some(Want::Client(known)) => known.memory = memory,
            _ => self.wants.push(Want::Client(client)),
        }
        log.extend(self.make_way(now));
        log
    }

    /// The CUDA client `pid` exits (what `--fake-client-exit PID` asks for).
    pub fn client_exit(&mut self, pid: u32) -> Vec<LogLine> {
        let mut log = self.prune_exited();
        self.wants.retain(|w| !matches!(w, Want::Client(c) if c.pid == pid));
        let Some(server) = self.server.as_mut() else { return log };
        let before = server.clients.len();
        server.clients.retain(|c| c.pid != pid);
        if server.clients.len() < before {
            log.push(server.disconnected(pid));
        }
        log
    }

    /// The user of client `pid`, served or waiting.
    pub fn client_uid(&self, pid: u32) -> Option<u32> {
        let served = self.server.iter().flat_map(|s| &s.clients);
        let waiting = self.wants.iter().filter_map(|w| match w {
            Want::Client(c) => Some(c),
            Want::Server(_) => None,
        });
        served.chain(waiting).find(|c| c.pid == pid).map(|c| c.uid)
    }

    /// The running server's clients as last pruned ([`State::prune_exited`]; none without
    /// a server). Waiting clients are no server's.
    pub fn clients(&self) -> Vec<u32> {
        self.server.iter().flat_map(|s| &s.clients).map(|c| c.pid).collect()
    }

    /// The GPU memory of served client `pid`.
    pub fn memory_of(&self, pid: u32) -> Option<u64> {
        self.server.iter().flat_map(|s| &s.clients).find(|c| c.pid == pid).map(|c| c.memory)
    }

    /// `start_server -uid UID`, accepted: a server for `uid` (with `-M`, the owner's),
    /// at once when none runs, else once the running one's clients are gone.
    pub fn request_server(&mut self, uid: u32, now: Instant) -> Vec<LogLine> {
        if self.serving() == Some(self.served_by(uid)) {
            return Vec::new();
        }
        if !self.wants.contains(&Want::Server(uid)) {
            self.wants.push(Want::Server(uid));
        }
        self.make_way(now)
    }

    /// `shutdown_server PID [-f]` from its owner: the server exits once it has no clients
    /// (at once with `-f`, its clients dropped), tried as for a replacement.
    pub fn shutdown_server(&mut self, pid: u32, force: bool, now: Instant) -> Vec<LogLine> {
        let Some(server) = self.server.as_mut().filter(|s| s.pid == pid) else {
            return Vec::new();
        };
        let mut log = Vec::new();
        if force {
            let gone: Vec<Client> = server.clients.drain(..).collect();
            log.extend(gone.iter().map(|c| server.disconnected(c.pid)));
        }
        log.extend(self.try_shutdown(now, false, true));
        if self.server.is_none() {
            log.extend(self.make_way(now));
        }
        log
    }

    /// What the daemon does by itself at `now`: drops ended clients, and asks a server
    /// that must make way to shut down again when that is due.
    pub fn tick(&mut self, now: Instant) -> Vec<LogLine> {
        let mut log = self.prune_exited();
        let Some(shutdown) = self.shutdown else { return log };
        if now < shutdown.due {
            return log;
        }
        let same = self.server.as_ref().is_some_and(|s| s.pid == shutdown.server);
        if !same || !(shutdown.asked || self.someone_waits()) {
            self.shutdown = None;
            return log;
        }
        log.extend(self.try_shutdown(now, true, shutdown.asked));
        if self.server.is_none() {
            log.extend(self.make_way(now));
        }
        log
    }

    /// Whether a client or a request waits for a server of another user than the running
    /// one's.
    fn someone_waits(&self) -> bool {
        self.wants.iter().any(|w| Some(self.served_by(w.uid())) != self.serving())
    }

    /// Serves what waits, in order: starts a server for the first user waiting when none
    /// runs, connects the clients of the running server's user, and asks a server that
    /// stands in the way to shut down (unless that is asked already).
    fn make_way(&mut self, now: Instant) -> Vec<LogLine> {
        let mut log = Vec::new();
        while let Some(next) = self.wants.first().map(|w| self.served_by(w.uid())) {
            match self.serving() {
                None => log.extend(self.start_server(next)),
                Some(uid) if uid == next => {}
                Some(_) => {
                    if self.shutdown.is_some() {
                        break;
                    }
                    log.extend(self.try_shutdown(now, false, false));
                    if self.server.is_some() {
                        break;
                    }
                    continue;
                }
            }
            log.extend(self.serve_waiting());
        }
        log
    }

    /// Connects the waiting clients of the running server's user and forgets the requests
    /// for it.
    fn serve_waiting(&mut self) -> Vec<LogLine> {
        let Some(uid) = self.serving() else { return Vec::new() };
        let wants = std::mem::take(&mut self.wants);
        let (now_served, still): (Vec<Want>, Vec<Want>) =
            wants.into_iter().partition(|w| self.served_by(w.uid()) == uid);
        self.wants = still;
        let mut log = Vec::new();
        for want in now_served {
            if let Want::Client(client) = want {
                log.push(self.control("Accepting connection..."));
                log.push(self.control(format!(
                    "NEW CLIENT {} from user {uid}: Server already exists",
                    client.pid
                )));
                log.extend(self.attach(client));
            }
        }
        log
    }

    /// Asks the running server to shut down: it exits without clients, else refuses and
    /// is asked again later (`backoff`: this is such a later try, the wait doubles).
    fn try_shutdown(&mut self, now: Instant, backoff: bool, asked: bool) -> Vec<LogLine> {
        let Some(server) = self.server.as_ref() else { return Vec::new() };
        let pid = server.pid;
        let threads = server.clients.len() * THREADS_PER_CLIENT;
        let how = if backoff { "enabled" } else { "disabled" };
        let mut log = vec![
            self.control(format!("Try shutting down server {pid}, backoff is {how}")),
            server_line(pid, "Server", "Server has been notified to shutdown"),
        ];
        if threads == 0 {
            log.extend([
                server_line(pid, "Server", "Waiting for current clients to finish"),
                server_line(pid, "Server", "Exiting"),
                self.control(format!("Server {pid} exited with status 0")),
            ]);
            self.server = None;
            self.shutdown = None;
            return log;
        }
        let earlier = self.shutdown.filter(|s| s.server == pid);
        let backoff_ms = match earlier {
            Some(s) if backoff => (s.backoff_ms * 2).min(LAST_BACKOFF_MS),
            _ => FIRST_BACKOFF_MS,
        };
        log.extend([
            server_line(
                pid,
                "Server",
                format!("Server was unable to shutdown due to {threads} active clients"),
            ),
            self.control(format!(
                "Server {pid} has {threads} active worker threads. Server will not shutdown."
            )),
            self.control(format!(
                "Control will try shutting down server {pid} again in at most {backoff_ms}ms"
            )),
        ]);
        self.shutdown = Some(Shutdown {
            server: pid,
            due: now + Duration::from_millis(backoff_ms),
            backoff_ms,
            asked: asked || earlier.is_some_and(|s| s.asked),
        });
        log
    }

    /// What `ps` prints: nothing without clients, else a header and one row per client.
    pub fn ps(&self) -> Vec<String> {
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
                &client.pid.to_string(),
                &(i + 1).to_string(),
                &server.pid.to_string(),
                &device,
                &pid_namespace(client.pid),
                &command_name(client.pid),
            ]));
        }
        lines
    }

    /// Stops the server and forgets what waits, as `quit` does.
    pub fn quit(&mut self) -> Vec<LogLine> {
        let mut log = Vec::new();
        self.wants.clear();
        self.shutdown = None;
        if let Some(server) = self.server.take() {
            let pid = server.pid;
            log.extend([
                self.control(format!("Try shutting down server {pid}, backoff is disabled")),
                server_line(pid, "Server", "Server has been notified to shutdown"),
                server_line(pid, "Server", "Waiting for current clients to finish"),
                server_line(pid, "Server", "Exiting"),
                self.control(format!("Server {pid} exited with status 0")),
            ]);
        }
        log.push(self.control("Exit with status 0"));
        log
    }
}

impl Server {
    /// The server's log line of client `pid` leaving.
    pub fn disconnected(&self, pid: u32) -> LogLine {
        server_line(self.pid, "Server", format!("Client process {pid} disconnected"))
    }
}

/// The PID namespace inode of a process, as `ps` shows it ("-" when it cannot be read).
pub fn pid_namespace(pid: u32) -> String {
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

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
