//! Each command's answer and log, for root, the daemon's owner and everyone else.

use std::path::Path;
use std::time::Instant;

use gpushare_sim_nvml::node::pid_alive;

use super::*;
use crate::log_line::LogFile;
use crate::state::{State, pid_namespace};

const MIB_512: u64 = 512 << 20;

/// A daemon of `owner` whose clients are made-up PIDs, each taken to run.
fn daemon_of(owner: u32) -> State {
    State::new(408, owner, false, Path::new("/tmp/x/pipe/control"), None).with_running(|_| true)
}

/// A root daemon whose clients are made-up PIDs, each taken to run.
fn state() -> State {
    daemon_of(0)
}

/// `line` from root, now.
fn ask(state: &mut State, line: &str) -> Answer {
    answer(state, line, 0, Instant::now())
}

/// `line` from user `caller`, now.
fn ask_as(state: &mut State, caller: u32, line: &str) -> Answer {
    answer(state, line, caller, Instant::now())
}

/// Client `pid` of root connects.
fn connect(state: &mut State, pid: u32) -> Vec<LogLine> {
    state.connect_client(pid, 0, MIB_512, Instant::now())
}

fn control_texts(log: &[LogLine]) -> Vec<&str> {
    log.iter().filter(|l| l.file == LogFile::Control).map(|l| l.text.as_str()).collect()
}

fn server_texts(log: &[LogLine]) -> Vec<&str> {
    log.iter().filter(|l| l.file == LogFile::Server).map(|l| l.text.as_str()).collect()
}

/// Sends `line` as `caller`, checks the answer's lines and its control.log lines.
fn check_as(state: &mut State, caller: u32, line: &str, reply: &[&str], log: &[&str]) {
    let answer = ask_as(state, caller, line);
    assert_eq!(answer.reply, reply, "answer to {line:?} from {caller}");
    assert_eq!(control_texts(&answer.log), log, "log of {line:?} from {caller}");
    assert!(answer.log.iter().all(|l| l.file == LogFile::Server || l.pid == 408));
}

/// Sends `line` as root, checks the answer's lines and its control.log lines.
fn check(state: &mut State, line: &str, reply: &[&str], log: &[&str]) {
    check_as(state, 0, line, reply, log)
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

    // A client connects: the daemon starts its server with the defaults set above, and
    // the client connects again to it (the H100's log, 2026-12-06).
    let log = connect(&mut s, 438);
    assert_eq!(
        control_texts(&log),
        [
            "User did not send valid credentials",
            "Accepting connection...",
            "NEW CLIENT 438 from user 0: Server is not ready, push client to pending list",
            "Starting new server 409 for user 0",
            "Accepting connection...",
            "NEW SERVER 409: Ready",
            "Accepting connection...",
            "NEW CLIENT 438 from user 0: Server already exists",
        ]
    );
    let starting = log.iter().find(|l| l.text.starts_with("Starting new server")).unwrap();
    assert_eq!(starting.pid, 409, "the real log names the server's PID here");
    let server_log = server_texts(&log);
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
    let ps = ask(&mut s, "ps").reply;
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

    let quit = ask(&mut s, "quit");
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
        assert_eq!(ask(&mut s, &line).reply, ["100.0"], "{line}");
    }
    assert_eq!(ask(&mut s, "set_default_active_thread_percentage 100").reply, ["100.0"]);
    assert_eq!(ask(&mut s, "set_default_active_thread_percentage 12.5").reply, ["12.5"]);
    assert_eq!(ask(&mut s, "set_default_active_thread_percentage 33.333").reply, ["33.3"]);

    check(
        &mut s,
        "set_default_device_pinned_mem_limit 1 512M",
        &[],
        &[
            "Cmd:set_default_device_pinned_mem_limit 1 512M",
            "set_default_device_pinned_mem_limit 1 512M.",
        ],
    );
    assert_eq!(ask(&mut s, "get_default_device_pinned_mem_limit 1").reply, ["512M"]);
    // As the H100's daemon answered: whole G, rounded down.
    ask(&mut s, "set_default_device_pinned_mem_limit 1 81559M");
    assert_eq!(ask(&mut s, "get_default_device_pinned_mem_limit 1").reply, ["79G"]);
    for bad in ["2T", "G", "1.5G", "2g", "-1G"] {
        let line = format!("set_default_device_pinned_mem_limit 0 {bad}");
        assert!(ask(&mut s, &line).reply.is_empty());
        assert!(ask(&mut s, "get_default_device_pinned_mem_limit 0").reply.is_empty(), "{bad}");
    }

    assert_eq!(ask(&mut s, "bogus 1 2").reply, ["Unknown command \"bogus\""]);
    assert_eq!(ask(&mut s, "   "), Answer::default());
    assert!(ask(&mut s, "ps").reply.is_empty());
    assert!(ask(&mut s, "get_device_client_list").reply.is_empty());
    assert!(ask(&mut s, "get_client_list 409").reply.is_empty());
    assert!(ask(&mut s, "get_active_thread_percentage 409").reply.is_empty());
}

#[test]
fn per_server_settings_and_clients() {
    let mut s = state();
    ask(&mut s, "set_default_active_thread_percentage 50");
    ask(&mut s, "start_server -uid 1000");
    assert_eq!(s.server.as_ref().map(|v| (v.pid, v.uid)), Some((409, 1000)));
    assert_eq!(ask(&mut s, "get_server_status 409").reply, ["ACTIVE"]);
    // Defaults set after the server started do not change it.
    ask(&mut s, "set_default_active_thread_percentage 10");
    assert_eq!(ask(&mut s, "get_active_thread_percentage 409").reply, ["50.0"]);
    assert_eq!(ask(&mut s, "set_active_thread_percentage 409 20").reply, ["20.0"]);
    assert_eq!(ask(&mut s, "set_active_thread_percentage 409 0").reply, ["20.0"]);
    assert_eq!(ask(&mut s, "get_active_thread_percentage 409").reply, ["20.0"]);
    assert!(ask(&mut s, "set_active_thread_percentage 999 20").reply.is_empty());

    // Answered and logged with nothing but the command, as on the H100.
    check(
        &mut s,
        "set_device_pinned_mem_limit 409 0 1G",
        &[],
        &["Cmd:set_device_pinned_mem_limit 409 0 1G"],
    );
    assert_eq!(ask(&mut s, "get_device_pinned_mem_limit 409 0").reply, ["1G"]);
    assert!(ask(&mut s, "get_device_pinned_mem_limit 409 1").reply.is_empty());

    // Clients of user 1000, the server's.
    let now = Instant::now();
    s.connect_client(100, 1000, MIB_512, now);
    let log = s.connect_client(101, 1000, MIB_512, now);
    assert!(control_texts(&log).contains(&"NEW CLIENT 101 from user 1000: Server already exists"));
    assert_eq!(ask(&mut s, "get_client_list 409").reply, ["100", "101"]);
    assert_eq!(ask(&mut s, "ps").reply.len(), 3);
    let log = s.client_exit(100);
    assert_eq!(log[0].text, "Client process 100 disconnected");
    assert!(s.client_exit(100).is_empty());
    assert_eq!(ask(&mut s, "get_client_list 409").reply, ["101"]);
    ask(&mut s, "terminate_client 409 101");
    assert!(ask(&mut s, "get_client_list 409").reply.is_empty());
    // The server outlives its clients.
    assert_eq!(ask(&mut s, "get_server_list").reply, ["409"]);
}

/// Everything a root daemon with a root client knows, as its queries answer it.
const QUERIES: [&str; 11] = [
    "get_server_list",
    "get_server_status 409",
    "get_client_list 409",
    "get_device_client_list",
    "get_device_client_list 409",
    "ps",
    "get_default_active_thread_percentage",
    "get_active_thread_percentage 409",
    "get_default_device_pinned_mem_limit 0",
    "get_device_pinned_mem_limit 409 0",
    "get_default_client_priority",
];

/// The answers to [`QUERIES`] from root.
fn everything(s: &mut State) -> Vec<Vec<String>> {
    QUERIES.iter().map(|q| ask(s, q).reply).collect()
}

/// A root daemon as the H100 was recorded: limits 40 % and 8G, a root client 563.
fn recorded_daemon() -> State {
    let mut s = state();
    ask(&mut s, "set_default_active_thread_percentage 40");
    ask(&mut s, "set_default_device_pinned_mem_limit 0 8G");
    connect(&mut s, 563);
    s
}

/// Another user is answered every query as root is, and refused every setting,
/// `terminate_client`, `shutdown_server` and `quit` in the real daemon's words, changing
/// nothing: nobody (65534) and a second user (4321) as recorded on the H100.
#[test]
fn another_user_is_answered_queries_and_refused_settings_as_the_h100_answered() {
    for uid in [65534, 4321] {
        let mut s = recorded_daemon();
        let before = everything(&mut s);
        assert_eq!(before[0], ["409"]);
        assert_eq!(before[2], ["563"]);
        for (query, root_answer) in QUERIES.iter().zip(&before) {
            assert_eq!(&ask_as(&mut s, uid, query).reply, root_answer, "{query} from {uid}");
        }

        let refused = format!(
            "Insufficient privileges for UID {uid}. Control deamon settings can only be \
             modified by the user who started it or by the root user."
        );
        for line in [
            "set_default_active_thread_percentage 90",
            "set_active_thread_percentage 409 90",
            "set_device_pinned_mem_limit 409 0 30G",
            "set_default_client_priority 1",
            "shutdown_server 409",
            "shutdown_server 409 -f",
            // Arguments are not looked at (derived).
            "set_active_thread_percentage",
            "set_default_device_pinned_mem_limit 0 lots",
            // Another user's server (derived: not recorded).
            "start_server -uid 0",
        ] {
            check_as(&mut s, uid, line, &[&refused], &[&format!("Cmd:{line}"), &refused]);
        }
        // The echo of a well-formed value comes first, as in the H100's log.
        check_as(
            &mut s,
            uid,
            "set_default_device_pinned_mem_limit 0 30G",
            &[&refused],
            &[
                "Cmd:set_default_device_pinned_mem_limit 0 30G",
                "set_default_device_pinned_mem_limit 0 30G.",
                &refused,
            ],
        );
        check_as(
            &mut s,
            uid,
            "terminate_client 409 563",
            &[&refused, "800"],
            &["Cmd:terminate_client 409 563", &refused, "800"],
        );
        check_as(
            &mut s,
            uid,
            "no_such_command",
            &["Unknown command \"no_such_command\""],
            &["Cmd:no_such_command", "Unknown command \"no_such_command\""],
        );
        let quit = ask_as(&mut s, uid, "quit");
        assert!(!quit.quit, "{uid} stopped root's daemon");
        assert_eq!(quit.reply, ["Not enough privilege to execute quit command"]);
        assert_eq!(
            control_texts(&quit.log),
            ["Cmd:quit", "Not enough privilege to execute quit command"]
        );
        assert_eq!(everything(&mut s), before, "{uid} changed root's daemon");
        assert!(s.server.is_some());
    }
}

/// Root and the user who started the daemon may change it; a third user may not, and
/// root's own daemon refuses that owner too.
#[test]
fn the_owner_and_root_may_change_the_daemon() {
    for (owner, caller) in [(1000, 1000), (1000, 0), (0, 0)] {
        let mut s = daemon_of(owner);
        let a = ask_as(&mut s, caller, "set_default_active_thread_percentage 30");
        assert_eq!(a.reply, ["30.0"], "{caller} on {owner}'s daemon");
        assert!(
            ask_as(&mut s, caller, "set_default_device_pinned_mem_limit 0 2G").reply.is_empty()
        );
        assert_eq!(ask(&mut s, "get_default_device_pinned_mem_limit 0").reply, ["2G"]);
        s.connect_client(77, owner, MIB_512, Instant::now());
        assert_eq!(ask_as(&mut s, caller, "set_active_thread_percentage 409 20").reply, ["20.0"]);
        assert!(ask_as(&mut s, caller, "terminate_client 409 77").reply.is_empty());
        assert!(s.clients().is_empty(), "{caller} terminated the client");
        assert!(ask_as(&mut s, caller, "quit").quit);
    }
    for (owner, caller) in [(1000, 2000), (0, 1000)] {
        let mut s = daemon_of(owner);
        let a = ask_as(&mut s, caller, "set_default_active_thread_percentage 30");
        assert_eq!(a.reply, [insufficient_privileges(caller)]);
        assert_eq!(ask(&mut s, "get_default_active_thread_percentage").reply, ["100.0"]);
        assert!(!ask_as(&mut s, caller, "quit").quit);
    }
    assert!(may_change(0, 1000) && may_change(1000, 1000) && !may_change(1000, 0));
}

/// `start_server -uid <their own uid>` from another user is accepted silently: the
/// daemon asks root's server, which has a client, to shut down (the H100's log), and
/// asks nothing more of it for a second such request.
#[test]
fn another_users_own_start_server_is_accepted_and_waits_for_roots_clients() {
    let mut s = recorded_daemon();
    check_as(
        &mut s,
        65534,
        "start_server -uid 65534",
        &[],
        &[
            "Cmd:start_server -uid 65534",
            "Try shutting down server 409, backoff is disabled",
            "Server 409 has 2 active worker threads. Server will not shutdown.",
            "Control will try shutting down server 409 again in at most 200ms",
        ],
    );
    check_as(&mut s, 4321, "start_server -uid 4321", &[], &["Cmd:start_server -uid 4321"]);
    // Without `-uid`, the caller's own (derived).
    check_as(&mut s, 4321, "start_server", &[], &["Cmd:start_server"]);
    assert_eq!(s.server.as_ref().map(|v| (v.pid, v.uid)), Some((409, 0)));
    assert_eq!(ask(&mut s, "get_client_list 409").reply, ["563"]);
}

/// The owner's `shutdown_server`: a server with clients is asked again later, one without
/// them exits; `-f` drops the clients and exits at once.
#[test]
fn the_owners_shutdown_server() {
    let mut s = recorded_daemon();
    let a = ask(&mut s, "shutdown_server 409");
    assert!(
        control_texts(&a.log)
            .contains(&"Server 409 has 2 active worker threads. Server will not shutdown.")
    );
    assert_eq!(ask(&mut s, "get_server_list").reply, ["409"]);
    let a = ask(&mut s, "shutdown_server 409 -f");
    assert_eq!(server_texts(&a.log)[0], "Client process 563 disconnected");
    assert!(control_texts(&a.log).contains(&"Server 409 exited with status 0"));
    assert!(ask(&mut s, "get_server_list").reply.is_empty());
    assert!(ask(&mut s, "shutdown_server 409").log.len() == 1, "no such server: nothing");
}

/// A client whose process ends leaves every list without `--fake-client-exit`, as a
/// real client's context (and so its connection) goes with its process: reaped, or a
/// zombie its parent has not reaped yet.
#[test]
fn a_client_whose_process_ended_is_listed_no_more() {
    let mut s = State::new(7, 0, false, Path::new("/p/control"), None);
    let mut reaped = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let mut zombie = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let (a, b) = (reaped.id(), zombie.id());
    connect(&mut s, a);
    connect(&mut s, b);
    assert_eq!(ask(&mut s, "get_client_list 8").reply, [a.to_string(), b.to_string()]);
    assert_eq!(ask(&mut s, "ps").reply.len(), 3);

    reaped.kill().unwrap();
    reaped.wait().unwrap();
    let listed = ask(&mut s, "get_client_list 8");
    assert_eq!(listed.reply, [b.to_string()]);
    let gone = format!("Client process {a} disconnected");
    assert_eq!(server_texts(&listed.log), [gone.as_str()]);
    assert_eq!(control_texts(&listed.log), ["Cmd:get_client_list 8", &b.to_string()]);
    assert_eq!(s.clients(), [b], "pruned from the state");
    assert!(ask(&mut s, "get_client_list 8").log.iter().all(|l| l.file == LogFile::Control));
    assert_eq!(
        ask(&mut s, "get_device_client_list").reply,
        ["[0] 00:00.0, NVIDIA H100 80GB HBM3".to_string(), format!("{b}.1")]
    );
    assert_eq!(ask(&mut s, "ps").reply.len(), 2);

    // Killed but not reaped: a zombie of one thread has ended too.
    zombie.kill().unwrap();
    wait_ended(b);
    assert!(Path::new(&format!("/proc/{b}")).exists(), "the zombie awaits its parent");
    assert!(ask(&mut s, "get_device_client_list 8").reply.is_empty());
    assert!(ask(&mut s, "get_client_list 8").reply.is_empty());
    assert!(ask(&mut s, "ps").reply.is_empty());
    assert!(s.clients().is_empty());
    // Its leaving was logged once; `--fake-client-exit` afterwards finds nothing to do.
    assert!(s.client_exit(b).is_empty());
    // The server outlives its clients, as the real one does.
    assert_eq!(ask(&mut s, "get_server_list").reply, ["8"]);
    zombie.wait().unwrap();

    // A client that ended before a command that lists none is dropped all the same,
    // and a new client finds the server with only the live ones.
    let mut c = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    connect(&mut s, c.id());
    c.kill().unwrap();
    c.wait().unwrap();
    let me = std::process::id();
    let log = connect(&mut s, me);
    assert!(
        server_texts(&log).contains(&format!("Client process {} disconnected", c.id()).as_str())
    );
    assert_eq!(s.clients(), [me]);
}

/// Waits (5 s at most) for `pid`, killed, to have ended.
fn wait_ended(pid: u32) {
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    while pid_alive(pid) {
        assert!(Instant::now() < deadline, "killed {pid} still runs");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn ps_shows_the_visible_device_and_the_process() {
    let me = std::process::id();
    let mut s = State::new(
        7,
        0,
        false,
        Path::new("/p/control"),
        Some("GPU-cc30f0e5-9f43-576f-21d0-04eb0bb6e180,GPU-2"),
    );
    connect(&mut s, me);
    let ps = s.ps();
    let cols: Vec<&str> = ps[1].split_whitespace().collect();
    assert_eq!(cols[..4], [me.to_string().as_str(), "1", "8", "GPU-cc30f0e5-9f43-576f"]);
    assert_eq!(cols[4], pid_namespace(me));
    assert!(cols[4].bytes().all(|b| b.is_ascii_digit()), "{}", cols[4]);
    assert_eq!(cols[5], std::fs::read_to_string("/proc/self/comm").unwrap().trim());
}
