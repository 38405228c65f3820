//! `gpushare-bench --floods` (issue 36): one user floods the agent, one flood at a time,
//! each on a fresh agent, and what everyone else gets meanwhile is measured side by side
//! with a baseline taken on the same agent just before: another user's `status` over
//! D-Bus (p50 / p99 of 100 calls 20 ms apart), root's `apply` through `gpushare-ctl`, and
//! the agent's resident memory (its peak during the flood, and how long after the flood it
//! takes to come back within 8 MiB of where it was, up to a minute).

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gpushare_tests::{Agent, AgentOptions, MEMBER, OTHER, text};

/// The floods: how they are sent, what is called, for how long.
pub const FLOODS: [(&str, &str, &str); 16] = [
    ("forget", "Introspect", "new connections, 50 calls each, none read"),
    ("unread", "Introspect", "64 connections × 2000 calls, no answer read"),
    ("unread", "Status", "64 connections × 500 calls, no answer read"),
    ("forget", "Status", "new connections, 50 calls each"),
    ("pipeline", "Introspect", "8 connections × 32 in flight"),
    ("pipeline", "Ping", "8 connections × 32 in flight"),
    ("pipeline", "GetAll", "8 connections × 32 in flight"),
    ("pipeline", "Status", "8 connections × 32 in flight"),
    ("pipeline", "CdiDevices", "8 connections × 32 in flight"),
    ("pipeline", "ListProfiles", "8 connections × 32 in flight"),
    ("pipeline", "ShowProfile", "8 connections × 32 in flight"),
    ("pipeline", "Telemetry", "8 connections × 32 in flight"),
    ("pipeline", "Clients", "8 connections × 32 in flight"),
    ("pipeline", "Export", "8 connections × 32 in flight"),
    ("pipeline", "Validate", "4 connections × 8 in flight, 256 KiB texts"),
    ("forget", "Validate", "new connections, 8 calls each, 256 KiB texts"),
];

/// The flood helper's arguments for one flood of `seconds`.
fn arguments(shape: &str, kind: &str, seconds: u64) -> Vec<String> {
    let (connections, calls) = match (shape, kind) {
        ("forget", "Validate") => (8, 8),
        ("forget", _) => (16, 50),
        ("unread", "Introspect") => (64, 2000),
        ("unread", _) => (64, 500),
        ("pipeline", "Validate") => (4, 8),
        _ => (8, 32),
    };
    [shape, &connections.to_string(), &calls.to_string(), kind, &seconds.to_string()]
        .map(str::to_string)
        .to_vec()
}

fn rss(pid: u32) -> u64 {
    super::rss_kib(pid, "VmRSS:")
}

/// `p50 A p99 B max C` of the helper's `latency`: (p50, p99).
fn latency(line: &str) -> Option<(f64, f64)> {
    let words: Vec<&str> = line.split_whitespace().collect();
    Some((words.get(1)?.parse().ok()?, words.get(3)?.parse().ok()?))
}

/// Milliseconds of one `gpushare-ctl apply PROFILE` as root; `None` when it failed.
fn apply(agent: &Agent, profile: &str) -> Option<f64> {
    let started = Instant::now();
    let out = agent.ctl(&["apply", profile]);
    let took = started.elapsed().as_secs_f64() * 1e3;
    if !out.status.success() {
        eprintln!("apply {profile} failed: {}", text(&out));
    }
    out.status.success().then_some(took)
}

/// The median of two applies (to `all-time-sliced`, back to `all-mps`).
fn applies(agent: &Agent) -> String {
    let mut times: Vec<f64> =
        ["all-time-sliced", "all-mps"].iter().filter_map(|p| apply(agent, p)).collect();
    times.sort_by(f64::total_cmp);
    match times.len() {
        2 => format!("{:.0}", (times[0] + times[1]) / 2.0),
        _ => "failed".into(),
    }
}

/// One flood on a fresh agent; its row.
fn one(spec: &str, dir: Option<&std::path::Path>, shape: &str, kind: &str, what: &str) -> String {
    let mut options = AgentOptions::simulate(spec).for_other_users();
    if let Some(dir) = dir {
        options = options.binaries(dir);
    }
    let agent = Agent::start(options);
    let pid = agent.pid().expect("agent pid");
    assert!(agent.ctl(&["apply", "all-mps"]).status.success());
    // Warm: the first calls read the profiles and the GPUs.
    agent.call(Some(MEMBER), &["latency", "10"]);
    let base_latency = agent.call(Some(MEMBER), &["latency", "100"]);
    let base_apply = applies(&agent);
    let base_rss = rss(pid);

    let peak = Arc::new(AtomicU64::new(base_rss));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (Arc::clone(&peak), Arc::clone(&sampling));
        std::thread::spawn(move || {
            while sampling.load(Ordering::Relaxed) {
                if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status"))
                    && let Some(kib) = status
                        .lines()
                        .find_map(|l| l.strip_prefix("VmRSS:"))
                        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                {
                    peak.fetch_max(kib, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let args = arguments(shape, kind, 8);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let flood = agent
        .call_command(Some(OTHER), &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the flood");
    std::thread::sleep(Duration::from_millis(1000));
    let during_latency = agent.call(Some(MEMBER), &["latency", "100"]);
    let during_apply = applies(&agent);
    let flooded = flood.wait_with_output().expect("the flood ends");
    let flooded = String::from_utf8_lossy(&flooded.stdout).trim().to_string();
    sampling.store(false, Ordering::Relaxed);
    sampler.join().unwrap();
    let ended = Instant::now();
    let mut after = rss(pid);
    while after > base_rss + 8 * 1024 && ended.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(500));
        after = rss(pid);
    }
    let back = if after <= base_rss + 8 * 1024 {
        format!("{:.1} s", ended.elapsed().as_secs_f64())
    } else {
        "not in 60 s".into()
    };
    let mib = |kib: u64| kib as f64 / 1024.0;
    let shown = |line: &str| match latency(line) {
        Some((p50, p99)) => format!("{p50:.1} / {p99:.1}"),
        None => format!("failed ({line})"),
    };
    format!(
        "| {what} `{kind}` | {} ({}) | {during_apply} ({base_apply}) | {:.0} → {:.0} | {:.0} ({back}) | {flooded} |",
        shown(&during_latency),
        shown(&base_latency),
        mib(base_rss),
        mib(peak.load(Ordering::Relaxed)),
        mib(after),
    )
}

/// Every flood of [`FLOODS`] (or those whose kind is in `only`), with this build and then
/// the one in `against`.
pub fn floods(spec: &str, against: Option<&std::path::Path>, only: Option<&str>) {
    assert!(gpushare_tests::is_root(), "--floods needs root: the floods run as {OTHER}");
    println!(
        "Backend: simulated {spec}; each flood from {OTHER} for 8 s on a fresh agent; {MEMBER}'s status and root's applies measured 1 s in, and before the flood on the same agent\n"
    );
    let builds = std::iter::once(None).chain(against.map(Some));
    for dir in builds {
        let label = dir.map_or("this build".to_string(), |d| format!("`{}`", d.display()));
        println!("{label}:\n");
        println!(
            "| flood | {MEMBER}'s `status` p50 / p99 ms during (before) | root's apply ms during (before) | RSS MiB before → peak | RSS after (back within 8 MiB) | the flood |"
        );
        println!("|---|---|---|---|---|---|");
        for (shape, kind, what) in FLOODS {
            if only.is_some_and(|o| !o.split(',').any(|k| k == kind || k == shape)) {
                continue;
            }
            println!("{}", one(spec, dir, shape, kind, what));
        }
        println!();
    }
}
