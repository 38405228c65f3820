//! The simulated nvidia-cuda-mps-control between users, as processes: root's daemon and
//! commands and clients of other real users (`nobody`, 65534, and a uid without a name,
//! 4321, as on the H100: tests/device/results/mps-privilege-h100-2026-12-06), run through
//! `setpriv`. Needs root; skipped (said on stderr) otherwise. Makes no user, and leaves no
//! process: each daemon quits, each client is killed.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpushare_catalog::parse_node_spec;
use gpushare_sim_nvml::node::Node;
use gpushare_sim_nvml::state_file::NodeFile;

const MPS_CONTROL: &str = env!("CARGO_BIN_EXE_gpushare-sim-nvidia-cuda-mps-control");
const NOBODY: u32 = 65534;
const SECOND: u32 = 4321;

fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Whether the test can run: root, with `setpriv`; else says why on stderr.
fn can_run() -> bool {
    if !is_root() {
        gpushare_test_skip::skip("needs root to run commands as other users");
        return false;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        gpushare_test_skip::skip("needs setpriv (util-linux) to run commands as other users");
        return false;
    }
    true
}

/// `program` as user `uid` (root's: as is), no supplementary groups.
fn as_uid(uid: u32, program: &str) -> Command {
    if uid == 0 {
        return Command::new(program);
    }
    let mut command = Command::new("setpriv");
    command.args([&format!("--reuid={uid}"), &format!("--regid={uid}"), "--clear-groups", program]);
    command
}

/// A `sleep` standing for a CUDA client of user `uid`, killed and reaped on drop.
struct Sleeper(Child);

impl Sleeper {
    /// Returns once the process is `sleep` (so `setpriv` has made it `uid`'s).
    fn start(uid: u32) -> Sleeper {
        let sleeper =
            Sleeper(as_uid(uid, "sleep").arg("120").stdin(Stdio::null()).spawn().unwrap());
        let comm = format!("/proc/{}/comm", sleeper.pid());
        wait_until("sleep did not start", || {
            std::fs::read_to_string(&comm).is_ok_and(|c| c.trim() == "sleep")
        });
        sleeper
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    fn end(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        self.end();
    }
}

/// A root control daemon on a pipe directory of its own (open to other users, as the
/// agent's are once its limits are set), registering clients in a simulated H100 node;
/// quit on drop.
struct Daemon {
    dir: tempfile::TempDir,
}

impl Daemon {
    fn start(args: &[&str]) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let daemon = Daemon { dir };
        let file = daemon.node_file();
        file.write(&file.lock().unwrap(), &Node::new(&parse_node_spec("h100-80gb:1").unwrap()))
            .unwrap();
        let out = daemon.run(0, args, "");
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        daemon
    }

    fn pipe(&self) -> PathBuf {
        self.dir.path().join("pipe")
    }

    fn node_file(&self) -> NodeFile {
        NodeFile::new(self.dir.path().join("node.json"))
    }

    /// The MPS clients the simulated node lists.
    fn node_clients(&self) -> Vec<u32> {
        let node = self.node_file().read().unwrap();
        node.listed_processes().filter(|p| p.mps).map(|p| p.pid).collect()
    }

    fn pid(&self) -> u32 {
        let text = std::fs::read_to_string(self.pipe().join("nvidia-cuda-mps-control.pid"));
        text.unwrap().parse().unwrap()
    }

    fn control_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log/control.log")).unwrap()
    }

    /// The tool as user `uid` with `args` and `input` on stdin.
    fn run(&self, uid: u32, args: &[&str], input: &str) -> Output {
        let mut child = as_uid(uid, MPS_CONTROL)
            .args(args)
            .env("CUDA_MPS_PIPE_DIRECTORY", self.pipe())
            .env("CUDA_MPS_LOG_DIRECTORY", self.dir.path().join("log"))
            .env("GPUSHARE_SIM_STATE", self.dir.path().join("node.json"))
            .env_remove("GPUSHARE_SIM_RECORD")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    }

    /// `line` as user `uid`: its stdout lines (the tool exits 0).
    fn ask(&self, uid: u32, line: &str) -> Vec<String> {
        let out = self.run(uid, &[], &format!("{line}\n"));
        assert_eq!(out.status.code(), Some(0), "{line} as {uid}: {out:?}");
        String::from_utf8(out.stdout).unwrap().lines().map(String::from).collect()
    }

    /// `--fake-client PID` (or `--fake-client-exit PID`) as user `uid`.
    fn declare(&self, uid: u32, flag: &str, pid: u32) -> Output {
        self.run(uid, &[flag, &pid.to_string()], "")
    }

    /// The one server's PID.
    fn server(&self) -> String {
        let servers = self.ask(0, "get_server_list");
        assert_eq!(servers.len(), 1, "{servers:?}");
        servers[0].clone()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.run(0, &[], "quit\n");
    }
}

/// Whether process `pid` runs.
fn runs(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn refusal(uid: u32) -> String {
    format!(
        "Insufficient privileges for UID {uid}. Control deamon settings can only be modified by \
         the user who started it or by the root user."
    )
}

/// Another user's settings, `terminate_client` and `quit` against root's daemon change
/// nothing, and are answered in the H100's words with exit 0; their queries are answered
/// as root's; they neither declare root's process a client of theirs nor end root's client.
#[test]
fn another_user_cannot_change_or_stop_roots_daemon() {
    if !can_run() {
        return;
    }
    let daemon = Daemon::start(&["-d"]);
    let pid = daemon.pid();
    daemon.ask(0, "set_default_active_thread_percentage 40");
    daemon.ask(0, "set_default_device_pinned_mem_limit 0 8G");
    let client = Sleeper::start(0);
    assert!(daemon.declare(0, "--fake-client", client.pid()).status.success());
    let server = daemon.server();
    let queries = [
        "get_server_list".to_string(),
        format!("get_client_list {server}"),
        "get_default_active_thread_percentage".into(),
        format!("get_active_thread_percentage {server}"),
        "get_default_device_pinned_mem_limit 0".into(),
        format!("get_device_pinned_mem_limit {server} 0"),
        "ps".into(),
    ];
    let before: Vec<Vec<String>> = queries.iter().map(|q| daemon.ask(0, q)).collect();
    assert_eq!(before[1], [client.pid().to_string()]);

    for uid in [NOBODY, SECOND] {
        for (query, answer) in queries.iter().zip(&before) {
            assert_eq!(&daemon.ask(uid, query), answer, "{query} as {uid}");
        }
        let refused = refusal(uid);
        for line in [
            format!("set_active_thread_percentage {server} 90"),
            "set_default_active_thread_percentage 90".into(),
            "set_default_device_pinned_mem_limit 0 30G".into(),
            format!("set_device_pinned_mem_limit {server} 0 30G"),
        ] {
            assert_eq!(daemon.ask(uid, &line), std::slice::from_ref(&refused), "{line} as {uid}");
        }
        let terminate = format!("terminate_client {server} {}", client.pid());
        assert_eq!(daemon.ask(uid, &terminate), [refused.clone(), "800".into()]);
        assert_eq!(daemon.ask(uid, "quit"), ["Not enough privilege to execute quit command"]);
        assert!(runs(pid), "{uid} stopped root's daemon");
        assert_eq!(daemon.pid(), pid);

        // The simulator's own events: refused on stderr, exit 1.
        for flag in ["--fake-client", "--fake-client-exit"] {
            let out = daemon.declare(uid, flag, client.pid());
            assert_eq!(out.status.code(), Some(1), "{flag} as {uid}: {out:?}");
            assert!(out.stdout.is_empty(), "{out:?}");
            assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1, "{out:?}");
        }
        let after: Vec<Vec<String>> = queries.iter().map(|q| daemon.ask(0, q)).collect();
        assert_eq!(after, before, "{uid} changed root's daemon");
        assert_eq!(daemon.node_clients(), [client.pid()]);
    }
    let log = daemon.control_log();
    for line in [
        format!("Cmd:set_active_thread_percentage {server} 90\n"),
        format!("] {}\n", refusal(NOBODY)),
        format!("] {}\n", refusal(SECOND)),
        "] Not enough privilege to execute quit command\n".into(),
    ] {
        assert!(log.contains(&line), "{line:?} in {log}");
    }
}

/// Waits (10 s at most) until `done` holds.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Without `-M` a client of another user waits, unlisted and not in the node, while
/// root's server serves root's client; once that client ends the server is replaced by
/// one for the other user, with the default limits, serving the waiting client.
#[test]
fn another_users_client_waits_for_roots_clients_then_gets_its_own_server() {
    if !can_run() {
        return;
    }
    let daemon = Daemon::start(&["-d"]);
    daemon.ask(0, "set_default_active_thread_percentage 40");
    let mut roots = Sleeper::start(0);
    assert!(daemon.declare(0, "--fake-client", roots.pid()).status.success());
    let first = daemon.server();
    assert_eq!(daemon.ask(0, &format!("set_active_thread_percentage {first} 30")), ["30.0"]);

    let theirs = Sleeper::start(SECOND);
    let out = daemon.declare(SECOND, "--fake-client", theirs.pid());
    assert!(out.status.success(), "{out:?}");
    assert_eq!(daemon.server(), first);
    assert_eq!(daemon.ask(0, &format!("get_client_list {first}")), [roots.pid().to_string()]);
    assert_eq!(daemon.ask(0, "ps").len(), 2, "header and root's client");
    assert_eq!(daemon.node_clients(), [roots.pid()]);

    roots.end();
    wait_until("the server was not replaced", || daemon.server() != first);
    let second = daemon.server();
    assert_eq!(daemon.ask(0, &format!("get_client_list {second}")), [theirs.pid().to_string()]);
    assert_eq!(daemon.ask(0, &format!("get_active_thread_percentage {second}")), ["40.0"]);
    assert_eq!(daemon.node_clients(), [theirs.pid()]);
    let log = daemon.control_log();
    for line in [
        format!(
            "] NEW CLIENT {} from user {SECOND}: Server is not ready, push client to pending list\n",
            theirs.pid()
        ),
        format!("] Server {first} exited with status 0\n"),
        format!("] Starting new server {second} for user {SECOND}\n"),
    ] {
        assert!(log.contains(&line), "{line:?} in {log}");
    }
    // The client's own user ends it.
    assert!(daemon.declare(SECOND, "--fake-client-exit", theirs.pid()).status.success());
    assert!(daemon.ask(0, &format!("get_client_list {second}")).is_empty());
}

/// With `-M` one root server serves root's and another user's clients at once, and that
/// user still may not change or stop the daemon.
#[test]
fn with_m_one_server_serves_both_users() {
    if !can_run() {
        return;
    }
    let daemon = Daemon::start(&["-d", "-M"]);
    let roots = Sleeper::start(0);
    let theirs = Sleeper::start(SECOND);
    assert!(daemon.declare(SECOND, "--fake-client", theirs.pid()).status.success());
    assert!(daemon.declare(0, "--fake-client", roots.pid()).status.success());
    let server = daemon.server();
    let both = [theirs.pid().to_string(), roots.pid().to_string()];
    assert_eq!(daemon.ask(0, &format!("get_client_list {server}")), both);
    assert_eq!(daemon.node_clients(), [theirs.pid(), roots.pid()]);
    let terminate = format!("terminate_client {server} {}", roots.pid());
    assert_eq!(daemon.ask(SECOND, &terminate), [refusal(SECOND), "800".into()]);
    assert_eq!(daemon.ask(SECOND, "quit"), ["Not enough privilege to execute quit command"]);
    assert_eq!(daemon.ask(SECOND, &format!("get_client_list {server}")), both);
    let log = daemon.control_log();
    let from_root = format!("] NEW CLIENT {} from user 0: Server is not ready", theirs.pid());
    assert!(log.contains(&from_root), "{log}");
    assert!(log.contains("] Starting new server ") && log.contains(" for user 0\n"), "{log}");
}
