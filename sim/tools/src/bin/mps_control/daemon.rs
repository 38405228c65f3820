//! The control daemon: socket server (each connection's user from its peer credentials), PID
//! file, logs; stops on quit, signal or pipe dir gone.

use std::fs::{self, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use gpushare_sim_nvml::device::PROCESS_MEMORY;

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

use crate::commands::answer;
use crate::common;
use crate::log_line::{LogFile, LogLine, timestamp};
use crate::node_clients::NodeClients;
use crate::pipe_dir::{SOCKET_NAME, dir_identity, remove_own_files, running_pid, write_pid_file};
use crate::protocol::{END_OF_ANSWER, FAKE_CONNECT, FAKE_EXIT, fake_client_arg};
use crate::state::{BINARY_VERSION, State};

/// How often the daemon checks that its pipe directory still exists and that its clients'
/// processes still run.
const PIPE_DIR_CHECK: Duration = Duration::from_millis(200);

/// Where and how a control daemon runs.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub pipe_dir: PathBuf,
    pub log_dir: PathBuf,
    /// The PID it writes and logs (the process's own, except in unit tests).
    pub pid: u32,
    /// `CUDA_VISIBLE_DEVICES` as the daemon was started with it.
    pub visible_devices: Option<String>,
    pub record: Option<PathBuf>,
    /// Also print the log lines on stdout (`-f`).
    pub echo: bool,
    /// The simulated node's state file (`GPUSHARE_SIM_STATE`), where clients are
    /// registered as the driver's compute processes ([`NodeClients`]).
    pub state_file: Option<PathBuf>,
    /// `-M`: one server serves every user's clients.
    pub multiuser: bool,
}

/// Why the daemon stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReason {
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
pub enum ServeError {
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
    /// Taken only while holding `state`.
    node: Mutex<NodeClients>,
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

    /// Brings the node's registrations in line with a change of the server's clients from
    /// `before` (callers hold the state lock): clients gone are removed, clients the
    /// server serves now registered with their memory, and so is `declared` again (a fake
    /// client declared once more, perhaps with another memory) if the server serves it.
    /// Waiting clients are registered once served. A failure is said on stderr (the
    /// daemon answers as before).
    fn sync_node(&self, state: &State, before: &[u32], declared: Option<u32>) {
        let after = state.clients();
        let gone: Vec<u32> = before.iter().copied().filter(|p| !after.contains(p)).collect();
        let mut node = self.node.lock().unwrap_or_else(PoisonError::into_inner);
        let mut result = node.unregister(&gone);
        for pid in after.iter().filter(|p| !before.contains(p) || declared == Some(**p)) {
            if let Some(memory) = state.memory_of(*pid) {
                result = result.and(node.register(*pid, memory));
            }
        }
        if let Err(e) = result {
            eprintln!("simulated nvidia-cuda-mps-control: {e}");
        }
    }

    /// What the daemon does between commands ([`State::tick`]): drops the clients whose
    /// process has ended, as the real server notices at once (their connection closes
    /// with their context), and asks a server that must make way for another user's to
    /// shut down again when due; logged, and the node brought in step.
    fn housekeeping(&self) {
        let mut state = self.state();
        let before = state.clients();
        let log = state.tick(Instant::now());
        if !log.is_empty() {
            self.sync_node(&state, &before, None);
            self.write_log(&log);
        }
    }
}

/// The user at the other end of a connection to the control socket (`SO_PEERCRED`), as
/// the real daemon learns it.
fn caller_of(stream: &UnixStream) -> Option<u32> {
    getsockopt(stream, PeerCredentials).ok().map(|credentials| credentials.uid())
}

/// The real user id of process `pid` (`/proc/PID/status`).
fn process_uid(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Uid:")?.split_whitespace().next()?.parse().ok())
}

/// Why user `caller` may not declare process `pid` a client, if not: only root declares
/// another user's process (which then is a client of root's: a client's user is that of
/// the connection declaring it).
fn not_callers_process(pid: u32, caller: u32) -> Option<String> {
    let owner = process_uid(pid);
    (caller != 0 && owner != Some(caller)).then(|| {
        format!(
            "simulated nvidia-cuda-mps-control: process {pid} is not user {caller}'s: a user \
             declares only their own processes as MPS clients"
        )
    })
}

/// Waits up to `timeout_ms` for `fd` to be readable.
fn wait_readable(fd: BorrowedFd<'_>, timeout_ms: u16) -> bool {
    use nix::poll::{PollFd, PollFlags, poll};
    let mut pfd = [PollFd::new(fd, PollFlags::POLLIN)];
    poll(&mut pfd, timeout_ms).is_ok_and(|ready| ready > 0)
}

/// Runs a control daemon until `quit`, `terminate` turning true, or the pipe directory
/// going away. Creates the pipe and log directories when missing; fails when another live
/// daemon's PID file is in the pipe directory.
pub fn serve(cfg: DaemonConfig, terminate: &AtomicBool) -> Result<ExitReason, ServeError> {
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

    let uid = nix::unistd::getuid().as_raw();
    let state = State::new(cfg.pid, uid, cfg.multiuser, &socket, cfg.visible_devices.as_deref());
    let pipe = cfg.pipe_dir.display().to_string();
    let record = cfg.record.clone();
    let node = NodeClients::new(cfg.state_file.clone(), cfg.visible_devices.as_deref());
    let daemon = Arc::new(Daemon {
        cfg,
        state: Mutex::new(state),
        node: Mutex::new(node),
        quit: AtomicBool::new(false),
    });
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
            daemon.housekeeping();
        }
        if !wait_readable(listener.as_fd(), 50) {
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
    {
        // The server ends with the daemon: its clients leave the node.
        let _state = daemon.state();
        let mut node = daemon.node.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(e) = node.unregister_all() {
            eprintln!("simulated nvidia-cuda-mps-control: {e}");
        }
    }
    if reason != ExitReason::PipeDirRemoved {
        remove_own_files(&daemon.cfg.pipe_dir, daemon.cfg.pid);
    }
    common::record(
        record.as_deref(),
        &format!("mps-control daemon-exit pipe={pipe} reason={}", reason.name()),
    );
    Ok(reason)
}

/// Serves one client connection from the user its peer credentials name: one command per
/// line, each answered and then ended by [`END_OF_ANSWER`]. A connection without
/// credentials is logged as the real daemon logs it and closed.
fn handle_connection(stream: UnixStream, daemon: &Daemon) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let caller = caller_of(&stream);
    {
        let state = daemon.state();
        daemon.write_log(&[state.control("Accepting connection...")]);
        if caller.is_none() {
            daemon.write_log(&[state.control("User did not send valid credentials")]);
        }
    }
    let Some(caller) = caller else { return };
    let Ok(read_half) = stream.try_clone() else { return };
    let mut writer = stream;
    let mut ui = false;
    for line in BufReader::new(read_half).lines() {
        let Ok(line) = line else { break };
        let line = line.trim();
        let (reply, quit) = {
            let mut state = daemon.state();
            let now = Instant::now();
            let mut log = Vec::new();
            let mut reply = Vec::new();
            let mut quit = false;
            let before = state.clients();
            let mut declared = None;
            if let Some((pid, memory)) = fake_client_arg(line, FAKE_CONNECT) {
                match not_callers_process(pid, caller) {
                    Some(why) => reply.push(why),
                    None => {
                        let memory = memory.unwrap_or(PROCESS_MEMORY);
                        log = state.connect_client(pid, caller, memory, now);
                        declared = Some(pid);
                    }
                }
            } else if let Some((pid, _)) = fake_client_arg(line, FAKE_EXIT) {
                match state.client_uid(pid) {
                    Some(uid) if caller != 0 && caller != uid => reply.push(format!(
                        "simulated nvidia-cuda-mps-control: client {pid} is user {uid}'s: only \
                         that user or root ends it"
                    )),
                    _ => log = state.client_exit(pid),
                }
            } else if !line.is_empty() {
                if !ui {
                    ui = true;
                    log.push(state.control("NEW UI"));
                }
                let answer = answer(&mut state, line, caller, now);
                log.extend(answer.log);
                reply = answer.reply;
                quit = answer.quit;
            }
            daemon.sync_node(&state, &before, declared);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{run_client, run_fake_client};
    use crate::pipe_dir::{PID_FILE, read_pid_file};
    use std::path::Path;

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
        start_in(tempfile::tempdir().unwrap(), pid, "GPU-abc", None)
    }

    /// As [`start`], in `dir`, serving `visible`, registering clients in `state_file`.
    /// A simulated node of `spec`, changed by `change`, in `dir`'s `node.json`: its path
    /// (for the daemon's `GPUSHARE_SIM_STATE`) and its file.
    fn node_in(
        dir: &Path,
        spec: &str,
        change: impl FnOnce(&mut gpushare_sim_nvml::node::Node),
    ) -> (std::path::PathBuf, gpushare_sim_nvml::state_file::NodeFile) {
        use gpushare_sim_nvml::node::Node;
        use gpushare_sim_nvml::state_file::NodeFile;
        let state = dir.join("node.json");
        let file = NodeFile::new(&state);
        let mut node = Node::new(&gpushare_catalog::parse_node_spec(spec).unwrap());
        change(&mut node);
        file.write(&file.lock().unwrap(), &node).unwrap();
        (state, file)
    }

    fn start_in(
        dir: tempfile::TempDir,
        pid: u32,
        visible: &str,
        state_file: Option<PathBuf>,
    ) -> Running {
        let cfg = DaemonConfig {
            pipe_dir: dir.path().join("pipe"),
            log_dir: dir.path().join("log"),
            pid,
            visible_devices: Some(visible.into()),
            record: Some(dir.path().join("record")),
            echo: false,
            state_file,
            multiuser: false,
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
        // A client is listed while its process runs: a real one.
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let client = child.id();
        assert_eq!(
            run_fake_client(&pipe, client, true, None, &mut sink, Some(&daemon.record())),
            0
        );
        assert!(sink.is_empty());
        let server = (pid + 1).to_string();
        let (_, out) = daemon.ask(&format!("get_server_list\nget_client_list {server}\n"));
        assert_eq!(out, format!("{server}\n{client}\n"));
        assert_eq!(
            run_fake_client(&pipe, client, false, None, &mut sink, Some(&daemon.record())),
            0
        );
        child.kill().unwrap();
        child.wait().unwrap();
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
            format!("mps-control pipe={p} fake-client={client}"),
            format!("mps-control pipe={p} cmd=get_server_list"),
            format!("mps-control pipe={p} cmd=get_client_list {server}"),
            format!("mps-control pipe={p} fake-client-exit={client}"),
            format!("mps-control pipe={p} cmd=get_client_list {server}"),
            format!("mps-control pipe={p} cmd=ps"),
            format!("mps-control pipe={p} cmd=quit"),
        ];
        let mut lines: Vec<&str> = record.lines().collect();
        // The daemon records its start while the first client records its command: those
        // two lines come in either order (a loaded CI machine saw both).
        let mut expected = expected.to_vec();
        expected[..2].sort_unstable();
        lines[..2].sort_unstable();
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
        let new_client = format!("] NEW CLIENT {client} from user");
        for text in [
            "] NEW UI",
            "] Cmd:set_default_active_thread_percentage 25",
            "] UI closed",
            &new_client,
            "] Cmd:quit",
            "] Exit with status 0",
        ] {
            assert!(log.contains(text), "{text:?} in\n{log}");
        }
        assert!(dir.path().join("log/server.log").exists());
    }

    /// The daemon's clients are the driver's compute processes and MPS clients on the
    /// device it serves, each with its memory, until they leave, the server ends or the
    /// daemon stops; other processes of the node are left alone.
    #[test]
    fn clients_are_registered_in_the_simulated_node() {
        use gpushare_sim_nvml::node::Process;
        let dir = tempfile::tempdir().unwrap();
        let (state, file) =
            node_in(dir.path(), "h100-80gb:2", |n| n.processes.push(Process::new(1, None, 4242)));
        let gpu1 = file.read().unwrap().gpus[1].uuid.clone();
        let daemon = start_in(dir, 4_000_006, &gpu1, Some(state));
        let pipe = daemon.pipe();
        let record = daemon.record();
        let mut sink = Vec::new();
        let me = std::process::id();
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let other = child.id();
        let listed = || {
            file.read()
                .unwrap()
                .processes
                .iter()
                .map(|p| (p.gpu, p.pid, p.memory, p.mps, p.registered))
                .collect::<Vec<_>>()
        };
        assert_eq!(run_fake_client(&pipe, me, true, Some(2 << 30), &mut sink, Some(&record)), 0);
        assert_eq!(run_fake_client(&pipe, other, true, None, &mut sink, Some(&record)), 0);
        assert_eq!(
            listed(),
            [
                (1, 4242, 512 << 20, false, false),
                (1, me, 2 << 30, true, true),
                (1, other, 512 << 20, true, true)
            ]
        );
        // The driver lists a registered client only while it runs.
        child.kill().unwrap();
        child.wait().unwrap();
        let pids: Vec<u32> = file.read().unwrap().listed_processes().map(|p| p.pid).collect();
        assert_eq!(pids, [4242, me]);
        let server = (4_000_006 + 1).to_string();
        daemon.ask(&format!(
            "terminate_client {server} {other}
"
        ));
        assert_eq!(listed(), [(1, 4242, 512 << 20, false, false), (1, me, 2 << 30, true, true)]);
        assert_eq!(run_fake_client(&pipe, me, false, None, &mut sink, Some(&record)), 0);
        assert_eq!(listed(), [(1, 4242, 512 << 20, false, false)]);
        // The server ends at `quit`: its clients go.
        assert_eq!(run_fake_client(&pipe, me, true, None, &mut sink, Some(&record)), 0);
        assert_eq!(listed().len(), 2);
        daemon.ask(
            "quit
",
        );
        assert_eq!(listed(), [(1, 4242, 512 << 20, false, false)]);
        let (reason, _dir) = daemon.join();
        assert_eq!(reason, ExitReason::Quit);
        let record = fs::read_to_string(record).unwrap();
        assert!(record.contains(&format!("fake-client={me} memory={}\n", 2u64 << 30)), "{record}");
        assert!(record.contains(&format!("fake-client={other}\n")), "{record}");
    }

    /// A client whose process is killed leaves the server's lists and the node without
    /// `--fake-client-exit`: the daemon notices within its check interval (the server's
    /// log says so, the node's entry goes), and no answer names it.
    #[test]
    fn a_killed_client_leaves_without_being_told() {
        let dir = tempfile::tempdir().unwrap();
        let (state, file) = node_in(dir.path(), "h100-80gb:1", |_| {});
        let daemon = start_in(dir, 4_000_008, "0", Some(state));
        let pipe = daemon.pipe();
        let server = 4_000_009;
        let mut sink = Vec::new();
        let me = std::process::id();
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let killed = child.id();
        assert_eq!(run_fake_client(&pipe, killed, true, None, &mut sink, None), 0);
        assert_eq!(run_fake_client(&pipe, me, true, None, &mut sink, None), 0);
        let (_, out) = daemon.ask(&format!("get_client_list {server}\n"));
        assert_eq!(out, format!("{killed}\n{me}\n"));
        let registered = || {
            let node = file.read().unwrap();
            node.processes.iter().filter(|p| p.mps).map(|p| p.pid).collect::<Vec<_>>()
        };
        assert_eq!(registered(), [killed, me]);

        // Killed, not reaped (a zombie), then reaped: neither is a client.
        child.kill().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while registered() != [me] {
            assert!(Instant::now() < deadline, "the daemon kept {killed}'s entry in the node");
            std::thread::sleep(Duration::from_millis(20));
        }
        let (_, out) = daemon
            .ask(&format!("get_client_list {server}\nget_device_client_list\nget_server_list\n"));
        assert_eq!(out, format!("{me}\n[0] 00:00.0, NVIDIA H100 80GB HBM3\n{me}.1\n{server}\n"));
        child.wait().unwrap();
        let (_, out) = daemon.ask("ps\n");
        assert_eq!(out.lines().count(), 2, "{out}");
        assert!(!out.contains(&format!("\n{killed} ")), "{out}");
        let server_log = daemon.dir.path().join("log/server.log");
        let server_log = fs::read_to_string(server_log).unwrap();
        let gone = format!("Client process {killed} disconnected");
        assert_eq!(server_log.matches(&gone).count(), 1, "{server_log}");

        daemon.terminate.store(true, Ordering::SeqCst);
        let (reason, _dir) = daemon.join();
        assert_eq!(reason, ExitReason::Signal);
    }

    #[test]
    fn a_stopped_daemon_takes_its_clients_out_of_the_node() {
        let dir = tempfile::tempdir().unwrap();
        let (state, file) = node_in(dir.path(), "a100-40gb:1", |_| {});
        // An index names the GPU too.
        let daemon = start_in(dir, 4_000_007, "0", Some(state));
        let mut sink = Vec::new();
        let me = std::process::id();
        assert_eq!(run_fake_client(&daemon.pipe(), me, true, None, &mut sink, None), 0);
        assert_eq!(file.read().unwrap().pids_on(0), [me]);
        daemon.terminate.store(true, Ordering::SeqCst);
        let (reason, _dir) = daemon.join();
        assert_eq!(reason, ExitReason::Signal);
        assert!(file.read().unwrap().processes.is_empty());
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
            state_file: None,
            multiuser: false,
        };
        let result = serve(cfg.clone(), &AtomicBool::new(false));
        assert!(matches!(result, Err(ServeError::AlreadyRunning(p)) if p == std::process::id()));
        assert!(!pipe.join(SOCKET_NAME).exists());
        // A stale PID file (no such process) is taken over.
        fs::write(pipe.join(PID_FILE), "4000005").unwrap();
        let result = serve(cfg, &AtomicBool::new(true));
        assert_eq!(result.unwrap(), ExitReason::Signal);
    }
}
