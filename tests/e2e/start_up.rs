//! The agent's start with an active profile to re-apply (issue 13, point 9): what a boot
//! or upgrade script does, `systemctl restart gpushare-agent && gpushare-ctl apply P`,
//! must work every time. systemd hears READY only once the re-apply is over; a client
//! that does not wait for systemd has its apply wait for the re-apply instead of being
//! refused as busy.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use gpushare_tests::{
    Agent, AgentOptions, BALANCED_A100, Wait, instance_profiles, stderr, text, wait_for,
};

/// Every mutating call of the simulated driver takes this long, so that the re-apply at
/// start-up (ten steps a GPU after a reboot) is still running when a client calls.
const SLOW_DRIVER_MS: &str = "100";

/// The profile a round applies, and so the one the next round's start re-applies.
fn profile_of_round(round: usize) -> &'static str {
    if round.is_multiple_of(2) { "half-balanced" } else { "all-balanced" }
}

/// Checks that the GPUs of an `a100-40gb:8` node are laid out as `profile` says.
fn assert_laid_out_as(agent: &Agent, profile: &str) {
    let status = agent.status();
    assert_eq!(status.active_profile.as_deref(), Some(profile));
    assert_eq!(status.apply_in_progress, None);
    assert!(!status.starting_up);
    // half-balanced leaves the second half of the GPUs whole.
    let balanced = if profile == "half-balanced" { 4 } else { 8 };
    for gpu in 0..8 {
        let expected: Vec<&str> = if gpu < balanced { BALANCED_A100.to_vec() } else { vec![] };
        assert_eq!(instance_profiles(&status, gpu), expected, "GPU {gpu} under {profile}");
    }
}

/// An agent restarted after a (simulated) reboot re-applies its active profile; an apply
/// of another profile sent as soon as the agent's bus name answers — while that re-apply
/// still runs — waits for it and succeeds, planned against the GPUs as the re-apply left
/// them. Before, it was refused: "another apply is running (start-up, …)".
#[test]
fn an_apply_sent_as_soon_as_the_agent_answers_waits_for_the_start_up_re_apply() {
    let mut agent = Agent::start(AgentOptions::simulate("a100-40gb:8"));
    let out = agent.ctl(&["apply", "all-balanced"]);
    assert!(out.status.success(), "{}", text(&out));
    for round in 0..4 {
        let active = if round == 0 { "all-balanced" } else { profile_of_round(round - 1) };
        let profile = profile_of_round(round);
        let env = [("GPUSHARE_SIM_REBOOT", "1"), ("GPUSHARE_SIM_DELAY_MS", SLOW_DRIVER_MS)];
        let first = agent.restart_waiting(&env, Wait::Answering).expect("a status document");
        // The race this test is about: the agent answered with its re-apply running.
        assert!(first.starting_up, "round {round}: the re-apply was over already: {first:?}");
        assert_eq!(
            first.apply_in_progress.as_deref(),
            Some(format!("start-up, profile {active}").as_str())
        );
        let out = agent.ctl(&["apply", profile]);
        assert!(out.status.success(), "round {round}: {}", text(&out));
        assert!(!stderr(&out).contains("another apply is running"), "{}", text(&out));
        assert_laid_out_as(&agent, profile);
    }
}

/// The datagrams an agent sends to `NOTIFY_SOCKET`, up to and including `READY=1`.
fn notifications_until_ready(socket: &UnixDatagram) -> Vec<String> {
    let mut seen = Vec::new();
    let mut buffer = vec![0u8; 4096];
    wait_for(Duration::from_secs(30), Duration::ZERO, || {
        let n = socket.recv(&mut buffer).map_err(|e| format!("no READY=1 ({e}): {seen:?}"))?;
        let message = String::from_utf8_lossy(&buffer[..n]).into_owned();
        let ready = message.lines().any(|l| l == "READY=1");
        seen.push(message);
        if ready { Ok(()) } else { Err(format!("no READY=1 yet: {seen:?}")) }
    });
    seen
}

/// As under systemd (`Type=notify`): `systemctl restart` returns when the agent sends
/// READY=1, which it does only once its re-apply at start-up is over (saying so in
/// STATUS= meanwhile), so an apply sent right then never meets it.
#[test]
fn systemd_hears_ready_only_once_the_start_up_re_apply_is_over() {
    let mut agent = Agent::start(AgentOptions::simulate("a100-40gb:8"));
    let out = agent.ctl(&["apply", "all-balanced"]);
    assert!(out.status.success(), "{}", text(&out));
    for round in 0..3 {
        let active = if round == 0 { "all-balanced" } else { profile_of_round(round - 1) };
        let profile = profile_of_round(round);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let path = path.to_str().unwrap();
        let env = [
            ("GPUSHARE_SIM_REBOOT", "1"),
            ("GPUSHARE_SIM_DELAY_MS", SLOW_DRIVER_MS),
            ("NOTIFY_SOCKET", path),
        ];
        agent.restart_waiting(&env, Wait::Started);
        let seen = notifications_until_ready(&socket);
        // Started: the GPUs are in the active profile again (what units ordered after the
        // agent rely on), and nothing runs.
        assert_laid_out_as(&agent, active);
        // `systemctl restart gpushare-agent && gpushare-ctl apply PROFILE`
        let out = agent.ctl(&["apply", profile]);
        assert!(out.status.success(), "round {round}: {}\nnotified: {seen:?}", text(&out));
        let re_applying = format!("STATUS=re-applying {active} at start-up (");
        assert!(
            seen[..seen.len() - 1].iter().any(|m| m.starts_with(&re_applying)),
            "no {re_applying:?} before READY=1: {seen:?}"
        );
        assert_laid_out_as(&agent, profile);
    }
}
