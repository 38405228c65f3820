//! A hostile local user against the agent's MPS control daemons (issue 36). NVIDIA's
//! daemon answers every user's queries but carries out settings, `terminate_client` and
//! `quit` only for the user who started it and root (recorded on an H100:
//! tests/device/results/mps-privilege-h100-2026-12-06); the simulated one now does the
//! same, so these tests meet the rule the agent meets on real GPUs: another user's commands
//! against the agent's daemon change nothing the agent set up.

use std::path::PathBuf;
use std::time::Duration;

use gpushare_tests::{Agent, AgentOptions, MEMBER, OTHER, Sleeper, id_of, is_root, text, wait_for};

/// An agent that serves [`OTHER`] too; `None` (the test skipped) without root, which
/// creating users needs.
fn agent_for_other_users() -> Option<Agent> {
    if !is_root() {
        gpushare_tests::skip("needs root to create test users and own the bus name");
        return None;
    }
    Some(Agent::start(AgentOptions::simulate("h100-80gb:1").for_other_users()))
}

/// The real user id of process `pid`.
fn process_uid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Uid:")?.split_whitespace().next()?.parse().ok())
}

/// Whether process `pid` runs (not a zombie).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rfind(')').is_some_and(|i| !stat[i + 1..].trim_start().starts_with('Z'))
    })
}

/// After `apply all-mps`, [`OTHER`]'s `set_active_thread_percentage`,
/// `set_default_device_pinned_mem_limit`, `terminate_client` of a [`MEMBER`]'s client,
/// `--fake-client-exit` of it and `quit` against the agent's daemon change nothing: the
/// daemon is the same process, `mps status` shows the same servers, limits and clients,
/// the daemon's own answers are the same; and the agent, as root, still stops it.
#[test]
fn another_user_can_neither_stop_nor_change_the_agents_mps_daemon() {
    let Some(agent) = agent_for_other_users() else { return };
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "{}", text(&out));
    let first = agent.mps_servers().remove(0);
    let daemon = first.pid.expect("the daemon runs");
    let pipe = PathBuf::from(&first.pipe_directory);

    // A member's client, declared as that member (once `setpriv` has made it theirs).
    let client = Sleeper::start(Some(MEMBER), &[]);
    let pid = client.pid().to_string();
    let member = id_of("passwd", MEMBER);
    wait_for(Duration::from_secs(10), Duration::from_millis(20), || {
        match process_uid(client.pid()) {
            Some(uid) if uid == member => Ok(()),
            other => Err(format!("{MEMBER}'s client runs as {other:?}")),
        }
    });
    let out = agent.mps_control(Some(MEMBER), &pipe, &["--fake-client", &pid], "");
    assert!(out.status.success(), "{}", text(&out));
    let servers = agent.mps_ask(&pipe, "get_server_list");
    assert_eq!(servers.len(), 1, "{servers:?}");
    let server = &servers[0];
    // Root (the agent) may set the limits of another user's server.
    let out = agent.ctl(&["mps", "limit", "--pid", &pid, "--threads", "30", "--memory", "2GiB"]);
    assert!(out.status.success(), "{}", text(&out));

    let queries = [
        "get_server_list".to_string(),
        format!("get_client_list {server}"),
        "get_default_active_thread_percentage".into(),
        "get_default_device_pinned_mem_limit 0".into(),
        format!("get_active_thread_percentage {server}"),
        format!("get_device_pinned_mem_limit {server} 0"),
    ];
    let answers =
        |agent: &Agent| queries.iter().map(|q| agent.mps_ask(&pipe, q)).collect::<Vec<_>>();
    let before = answers(&agent);
    assert_eq!(before[1], std::slice::from_ref(&pid));
    assert_eq!(before[4], ["30.0"]);
    let status = agent.mps_servers();
    assert_eq!(status[0].clients, [client.pid()]);

    for line in [
        format!("set_active_thread_percentage {server} 100"),
        "set_default_active_thread_percentage 100".into(),
        "set_default_device_pinned_mem_limit 0 79G".into(),
        format!("set_device_pinned_mem_limit {server} 0 79G"),
        format!("terminate_client {server} {pid}"),
        "quit".into(),
    ] {
        let out = agent.mps_control(Some(OTHER), &pipe, &[], &format!("{line}\n"));
        // The real tool answers a refusal on stdout and exits 0.
        assert!(out.status.success(), "{OTHER}'s {line}: {}", text(&out));
    }
    let out = agent.mps_control(Some(OTHER), &pipe, &["--fake-client-exit", &pid], "");
    assert!(!out.status.success(), "{OTHER} ended {MEMBER}'s client: {}", text(&out));

    // Two health checks (1 s apart in the tests) would have restarted a stopped daemon.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(running(daemon), "{OTHER} stopped the agent's MPS daemon");
    assert_eq!(agent.mps_servers(), status, "what the agent shows changed");
    assert_eq!(answers(&agent), before, "{OTHER} changed the daemon");

    // The agent, as root, still stops it (once the client is gone).
    client.end();
    let out = agent.ctl(&["apply", "all-disabled"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(agent.mps_servers().is_empty());
    wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
        if running(daemon) {
            Err("the agent's quit left the daemon running".into())
        } else {
            Ok(())
        }
    });
}
