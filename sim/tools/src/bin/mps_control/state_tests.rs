//! Servers and clients over time: one user at a time without `-M`, the replacement of a
//! server once its clients are gone, every user at once with `-M`.

use std::path::Path;
use std::time::{Duration, Instant};

use super::*;

const MIB_512: u64 = 512 << 20;

/// A root daemon (PID 408: its first server is 409) whose clients are made-up PIDs, each
/// taken to run; `-M` when `multiuser`.
fn daemon(multiuser: bool) -> State {
    State::new(408, 0, multiuser, Path::new("/p/control"), None).with_running(|_| true)
}

fn control_texts(log: &[LogLine]) -> Vec<&str> {
    log.iter().filter(|l| l.file == LogFile::Control).map(|l| l.text.as_str()).collect()
}

fn server_texts(log: &[LogLine]) -> Vec<&str> {
    log.iter().filter(|l| l.file == LogFile::Server).map(|l| l.text.as_str()).collect()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Root's daemon with defaults 40 % and 8G, a per-server override (30 %, 6G) and root's
/// client 563: the H100's recorded starting point.
fn roots_server_with_a_client(t0: Instant) -> State {
    let mut s = daemon(false);
    s.default_percentage = Some(40.0);
    s.default_pinned.insert("0".into(), "8G".into());
    s.connect_client(563, 0, MIB_512, t0);
    let server = s.server.as_mut().unwrap();
    server.percentage = 30.0;
    server.pinned.insert("0".into(), "6G".into());
    s
}

#[test]
fn a_client_of_another_user_waits_until_the_servers_clients_are_gone() {
    let t0 = Instant::now();
    let mut s = roots_server_with_a_client(t0);
    let log = s.connect_client(1010, 4321, 2 << 30, t0);
    assert_eq!(
        control_texts(&log),
        [
            "User did not send valid credentials",
            "Accepting connection...",
            "NEW CLIENT 1010 from user 4321: Server is not ready, push client to pending list",
            "Try shutting down server 409, backoff is disabled",
            "Server 409 has 2 active worker threads. Server will not shutdown.",
            "Control will try shutting down server 409 again in at most 200ms",
        ]
    );
    assert_eq!(
        server_texts(&log),
        [
            "Server has been notified to shutdown",
            "Server was unable to shutdown due to 2 active clients"
        ]
    );
    // Waiting: no server's client, nowhere listed, its user known.
    assert_eq!(s.clients(), [563]);
    assert_eq!((s.client_uid(1010), s.memory_of(1010)), (Some(4321), None));
    assert!(s.ps().iter().all(|row| !row.starts_with("1010 ")));

    assert!(s.tick(t0 + ms(199)).is_empty(), "not due yet");
    let log = s.tick(t0 + ms(200));
    assert_eq!(
        control_texts(&log),
        [
            "Try shutting down server 409, backoff is enabled",
            "Server 409 has 2 active worker threads. Server will not shutdown.",
            "Control will try shutting down server 409 again in at most 400ms",
        ]
    );
    // Root's client ends: at the next try, the server exits and one for user 4321 starts
    // with the default limits, serving the waiting client.
    assert_eq!(server_texts(&s.client_exit(563)), ["Client process 563 disconnected"]);
    assert!(s.tick(t0 + ms(599)).is_empty());
    let log = s.tick(t0 + ms(600));
    assert_eq!(
        control_texts(&log),
        [
            "Try shutting down server 409, backoff is enabled",
            "Server 409 exited with status 0",
            "Starting new server 410 for user 4321",
            "Accepting connection...",
            "NEW SERVER 410: Ready",
            "Accepting connection...",
            "NEW CLIENT 1010 from user 4321: Server already exists",
        ]
    );
    let server = s.server.as_ref().unwrap();
    assert_eq!((server.pid, server.uid, server.percentage), (410, 4321, 40.0));
    assert_eq!(server.pinned.get("0").map(String::as_str), Some("8G"), "the default, not 6G");
    assert_eq!(s.clients(), [1010]);
    assert_eq!(s.memory_of(1010), Some(2 << 30));
    let server_log = server_texts(&log);
    for line in [
        "Waiting for current clients to finish",
        "Exiting",
        "Active Threads Percentage set to 40.0",
        "Device pinned memory limit for device 0 set to 0x200000000 bytes",
        "Client {PID: 1010, Context ID: 1} connected",
    ] {
        assert!(server_log.contains(&line), "{line:?} in {server_log:?}");
    }
    assert!(s.tick(t0 + ms(60_000)).is_empty(), "nothing more to do");
}

/// The wait between two tries doubles from 200 ms, as the H100's did up to 12800 ms; it
/// stops doubling at 51.2 s (not recorded).
#[test]
fn the_wait_between_tries_doubles() {
    let t0 = Instant::now();
    let mut s = roots_server_with_a_client(t0);
    s.connect_client(1010, 4321, MIB_512, t0);
    let mut now = t0;
    let mut waits = vec![200];
    for _ in 0..10 {
        now += ms(*waits.last().unwrap());
        let log = s.tick(now);
        let last = *control_texts(&log).last().unwrap();
        let wait = last
            .strip_prefix("Control will try shutting down server 409 again in at most ")
            .and_then(|w| w.strip_suffix("ms"))
            .unwrap_or_else(|| panic!("{last}"));
        waits.push(wait.parse().unwrap());
    }
    assert_eq!(waits, [200, 400, 800, 1600, 3200, 6400, 12800, 25600, 51200, 51200, 51200]);
}

/// Requests and waiting clients are served in the order they came; a server started for
/// a request whose user has no client makes way at once for the next (the H100's log).
#[test]
fn requests_and_clients_are_served_in_the_order_they_came() {
    let t0 = Instant::now();
    let mut s = roots_server_with_a_client(t0);
    assert_eq!(control_texts(&s.request_server(65534, t0)).len(), 3, "tried once, refused");
    assert!(s.request_server(4321, t0).is_empty(), "a try is under way");
    assert!(s.request_server(0, t0).is_empty(), "root's server runs");
    s.connect_client(1010, 4321, MIB_512, t0);
    s.client_exit(563);
    let log = s.tick(t0 + ms(200));
    assert_eq!(
        control_texts(&log),
        [
            "Try shutting down server 409, backoff is enabled",
            "Server 409 exited with status 0",
            "Starting new server 410 for user 65534",
            "Accepting connection...",
            "NEW SERVER 410: Ready",
            "Try shutting down server 410, backoff is disabled",
            "Server 410 exited with status 0",
            "Starting new server 411 for user 4321",
            "Accepting connection...",
            "NEW SERVER 411: Ready",
            "Accepting connection...",
            "NEW CLIENT 1010 from user 4321: Server already exists",
        ]
    );
    assert_eq!(s.server.as_ref().map(|v| (v.pid, v.uid)), Some((411, 4321)));
}

/// A server without clients makes way at once for a client of another user.
#[test]
fn a_server_without_clients_makes_way_at_once() {
    let t0 = Instant::now();
    let mut s = roots_server_with_a_client(t0);
    s.client_exit(563);
    let log = s.connect_client(1010, 4321, MIB_512, t0);
    let texts = control_texts(&log);
    assert_eq!(
        texts[2..],
        [
            "NEW CLIENT 1010 from user 4321: Server is not ready, push client to pending list",
            "Try shutting down server 409, backoff is disabled",
            "Server 409 exited with status 0",
            "Starting new server 410 for user 4321",
            "Accepting connection...",
            "NEW SERVER 410: Ready",
            "Accepting connection...",
            "NEW CLIENT 1010 from user 4321: Server already exists",
        ]
    );
    assert_eq!(s.clients(), [1010]);
}

/// A waiting client that ends stops waiting, and then the tries stop: the server stays.
/// A client of the server's user still joins while a try is under way (derived).
#[test]
fn tries_stop_when_no_one_waits() {
    let t0 = Instant::now();
    let mut s = roots_server_with_a_client(t0);
    s.connect_client(1010, 4321, MIB_512, t0);
    let log = s.connect_client(564, 0, MIB_512, t0);
    assert!(control_texts(&log).contains(&"NEW CLIENT 564 from user 0: Server already exists"));
    assert_eq!(s.clients(), [563, 564]);
    assert!(s.client_exit(1010).is_empty(), "a waiting client leaves no server");
    assert_eq!(s.client_uid(1010), None);
    assert!(s.tick(t0 + ms(200)).is_empty());
    assert!(s.tick(t0 + ms(60_000)).is_empty());
    assert_eq!(s.server.as_ref().map(|v| v.pid), Some(409));
}

/// With `-M` one server, the owner's, serves every user's clients at once; the log names
/// each client as the server's user (the H100's log: "from user 0" for user 4321's).
#[test]
fn with_m_one_server_serves_every_user() {
    let t0 = Instant::now();
    let mut s = daemon(true);
    let log = s.connect_client(1103, 4321, MIB_512, t0);
    assert_eq!(
        control_texts(&log)[2..4],
        [
            "NEW CLIENT 1103 from user 0: Server is not ready, push client to pending list",
            "Starting new server 409 for user 0",
        ]
    );
    let log = s.connect_client(1098, 0, MIB_512, t0);
    assert_eq!(control_texts(&log)[2], "NEW CLIENT 1098 from user 0: Server already exists");
    assert_eq!(s.clients(), [1103, 1098]);
    assert_eq!((s.client_uid(1103), s.client_uid(1098)), (Some(4321), Some(0)));
    assert!(s.request_server(4321, t0).is_empty(), "the one server serves 4321 already");
    assert!(s.tick(t0 + ms(60_000)).is_empty());
    assert_eq!(s.server.as_ref().map(|v| (v.pid, v.uid)), Some((409, 0)));
}

/// A client declared again keeps its place and user, with the new memory, served or
/// waiting.
#[test]
fn a_client_declared_again_takes_the_new_memory() {
    let t0 = Instant::now();
    let mut s = roots_server_with_a_client(t0);
    s.connect_client(563, 0, 2 << 30, t0);
    s.connect_client(1010, 4321, MIB_512, t0);
    s.connect_client(1010, 4321, 1 << 30, t0);
    assert_eq!((s.clients(), s.memory_of(563)), (vec![563], Some(2 << 30)));
    s.client_exit(563);
    s.tick(t0 + ms(200));
    assert_eq!((s.clients(), s.memory_of(1010)), (vec![1010], Some(1 << 30)));
}

/// `quit` stops the server and forgets what waits.
#[test]
fn quit_forgets_what_waits() {
    let t0 = Instant::now();
    let mut s = roots_server_with_a_client(t0);
    s.connect_client(1010, 4321, MIB_512, t0);
    let log = s.quit();
    assert_eq!(control_texts(&log).last(), Some(&"Exit with status 0"));
    assert!(s.server.is_none() && s.client_uid(1010).is_none());
    assert!(s.tick(t0 + ms(200)).is_empty());
}

/// Ended clients, served or waiting, are dropped at every tick.
#[test]
fn ticks_drop_ended_clients() {
    let t0 = Instant::now();
    let mut s = State::new(7, 0, false, Path::new("/p/control"), None);
    let mut served = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let mut waiting = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    s.connect_client(served.id(), 0, MIB_512, t0);
    s.connect_client(waiting.id(), 4321, MIB_512, t0);
    for child in [&mut served, &mut waiting] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let log = s.tick(t0);
    assert_eq!(server_texts(&log), [format!("Client process {} disconnected", served.id())]);
    assert!(s.clients().is_empty() && s.client_uid(waiting.id()).is_none());
}
