//! Issue 36, findings 1, 5 and 7: one local user's flood of calls (sent without waiting
//! for the answers, on new connections or on a few, or pipelined) costs that user alone:
//! the agent's memory stays bounded and comes back, another user's `status` keeps close to
//! what it took before the flood, root's `apply` goes through, and calls over the bounds
//! are refused with the bus's own `LimitsExceeded`. Each flood runs as a real unprivileged
//! user against the agent as root; times are compared with a baseline taken in the same
//! test, on the same agent, never with a fixed number.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gpushare_tests::{Agent, AgentOptions, MEMBER, OTHER, is_root, text};

fn agent_for_other_users() -> Option<Agent> {
    if !is_root() {
        gpushare_tests::skip("needs root to create test users and own the bus name");
        return None;
    }
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2").for_other_users());
    assert!(agent.ctl(&["apply", "all-mps"]).status.success());
    Some(agent)
}

fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap().to_string();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() << 10
}

/// (p50, p99) of MEMBER's `status` over `count` calls 20 ms apart.
fn member_status(agent: &Agent, count: usize) -> (f64, f64) {
    let line = agent.call(Some(MEMBER), &["latency", &count.to_string()]);
    let words: Vec<&str> = line.split_whitespace().collect();
    let value = |i: usize| words.get(i).and_then(|w| w.parse::<f64>().ok());
    match (value(1), value(3)) {
        (Some(p50), Some(p99)) => (p50, p99),
        _ => panic!("{MEMBER}'s status failed: {line}"),
    }
}

/// The agent's resident memory, sampled every 50 ms until dropped: its peak.
struct Peak {
    peak: Arc<AtomicU64>,
    running: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Peak {
    fn watch(pid: u32) -> Peak {
        let peak = Arc::new(AtomicU64::new(rss(pid)));
        let running = Arc::new(AtomicBool::new(true));
        let thread = {
            let (peak, running) = (Arc::clone(&peak), Arc::clone(&running));
            std::thread::spawn(move || {
                while running.load(Ordering::Relaxed) {
                    peak.fetch_max(rss(pid), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        Peak { peak, running, thread: Some(thread) }
    }

    fn end(mut self) -> u64 {
        self.running.store(false, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        self.peak.load(Ordering::Relaxed)
    }
}

/// Runs the flood `args` as OTHER while MEMBER's status is timed; returns MEMBER's (p50,
/// p99) during the flood, the agent's peak memory, and the flood's own line.
fn during_flood(agent: &Agent, args: &[&str]) -> ((f64, f64), u64, String) {
    let pid = agent.pid().unwrap();
    let peak = Peak::watch(pid);
    let flood = agent
        .call_command(Some(OTHER), args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let during = member_status(agent, 60);
    let flooded = flood.wait_with_output().unwrap();
    let flooded = String::from_utf8_lossy(&flooded.stdout).trim().to_string();
    (during, peak.end(), flooded)
}

/// Waits up to a minute for the agent's memory to come back within `margin` of `base`.
fn memory_comes_back(agent: &Agent, base: u64, margin: u64) -> u64 {
    let pid = agent.pid().unwrap();
    let started = Instant::now();
    let mut now = rss(pid);
    while now > base + margin && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(500));
        now = rss(pid);
    }
    now
}

/// Finding 1: calls sent without reading the answers, on many connections, grew the agent
/// from 12 MB to 1.56 GB in 7 s and held everyone's calls for seconds.
#[test]
fn unanswered_floods_cost_the_agent_bounded_memory_and_others_little_time() {
    let Some(agent) = agent_for_other_users() else { return };
    let pid = agent.pid().unwrap();
    member_status(&agent, 10);
    let before = member_status(&agent, 60);
    let base = rss(pid);
    for flood in [
        ["unread", "64", "2000", "Introspect", "5"],
        ["forget", "16", "50", "Status", "5"],
        ["unread", "64", "500", "Status", "5"],
    ] {
        let (during, peak, flooded) = during_flood(&agent, &flood);
        eprintln!(
            "{flood:?}: {MEMBER}'s status p50/p99 {during:?} ms (before {before:?}); RSS {} → {} MiB; {flooded}",
            base >> 20,
            peak >> 20
        );
        assert!(flooded.starts_with("sent "), "the flood did not run: {flooded}");
        assert!(
            peak <= base + (64 << 20),
            "{flood:?} grew the agent from {} to {} MiB",
            base >> 20,
            peak >> 20
        );
        assert!(
            during.0 <= 10.0 * before.0.max(2.0),
            "{MEMBER}'s status took a median {} ms during {flood:?}, {} ms before",
            during.0,
            before.0
        );
        let after = memory_comes_back(&agent, base, 16 << 20);
        assert!(after <= base + (16 << 20), "the agent kept {} MiB after {flood:?}", after >> 20);
        // Root's apply goes through right after.
        let out = agent.ctl(&["apply", "all-time-sliced"]);
        assert!(out.status.success(), "{}", text(&out));
        assert!(agent.ctl(&["apply", "all-mps"]).status.success());
    }
}

/// Finding 5: one user's steady, pipelined floods of cheap reads pushed another user's
/// `status` p99 to 78-530 ms: admission bounded concurrency per user, not its share.
#[test]
fn steady_floods_of_cheap_reads_leave_another_users_status_near_its_own_time() {
    let Some(agent) = agent_for_other_users() else { return };
    member_status(&agent, 10);
    let before = member_status(&agent, 60);
    let base = rss(agent.pid().unwrap());
    for kind in ["CdiDevices", "ListProfiles", "ShowProfile", "Telemetry", "Clients", "Validate"] {
        let depth = if kind == "Validate" { "8" } else { "32" };
        let (during, peak, flooded) = during_flood(&agent, &["pipeline", "8", depth, kind, "4"]);
        eprintln!(
            "{kind}: {MEMBER}'s status p50/p99 {during:?} ms (before {before:?}); RSS {} → {} MiB; {flooded}",
            base >> 20,
            peak >> 20
        );
        assert!(flooded.starts_with("answered "), "the flood did not run: {flooded}");
        assert!(
            during.1 <= 10.0 * before.1.max(5.0),
            "{MEMBER}'s status p99 was {} ms during a flood of {kind}, {} ms before",
            during.1,
            before.1
        );
        assert!(peak <= base + (64 << 20), "{kind}: {} → {} MiB", base >> 20, peak >> 20);
    }
}

/// Finding 7: a call over the bounds reaches its caller as
/// `org.freedesktop.DBus.Error.LimitsExceeded`, not as zbus's own error name.
#[test]
fn calls_over_the_bounds_are_refused_with_limits_exceeded() {
    let Some(agent) = agent_for_other_users() else { return };
    // 300 calls in flight on one connection: more than a connection may have counted.
    let flooded = agent.call(Some(OTHER), &["pipeline", "1", "300", "Ping", "1"]);
    assert!(flooded.contains("org.freedesktop.DBus.Error.LimitsExceeded"), "{flooded}");
    assert!(!flooded.contains("org.freedesktop.zbus.Error"), "{flooded}");
    // The user's calls after the flood are answered.
    member_status(&agent, 3);
    let line = agent.call(Some(OTHER), &["latency", "3"]);
    assert!(line.starts_with("p50"), "{line}");
}
