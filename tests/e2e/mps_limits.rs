//! MPS servers the operator can reason about (issue 36, finding 2; issue 37, item 5): the
//! limits each control daemon applies now (its live limits) in every view with where they
//! come from, drift when they were changed behind the agent's back (put back by the health
//! check), `mps limit` naming the right server and showing its effect, and whom a server
//! serves: one user at a time, or everyone at once with a profile's `multi_user`. On the
//! simulated control daemon, which obeys NVIDIA's ownership rule and serves one user at a
//! time unless `-M`, as driver 580's did on an H100.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpushare_proto::clients::ClientTable;
use gpushare_proto::types::{MpsLimitResult, MpsServer};
use gpushare_tests::{
    Agent, AgentOptions, MEMBER, SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV, Sleeper, binary, id_of,
    is_root, stdout, text, wait_for,
};

use crate::metrics::{free_port, scrape};

/// agent.toml: the simulated control daemon under the agent's directory, a health check
/// every `health` seconds, metrics on `port`.
fn config(dir: &Path, health: u64, port: u16) -> String {
    format!(
        "[mps]\ncontrol = {:?}\nroot = {:?}\nhealth_interval_seconds = {health}\n\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n",
        binary(SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV),
        dir.join("mps"),
    )
}

/// An agent on `spec` with [`config`], its stderr in `log` (inside `logs`).
fn agent_with(spec: &str, health: u64, port: u16, logs: &Path, other_users: bool) -> Agent {
    let root = logs.join("agent");
    std::fs::create_dir_all(&root).unwrap();
    let mut options = AgentOptions::simulate(spec)
        .config(&config(&root, health, port))
        .stderr_to(&logs.join("agent.log"));
    if other_users {
        options = options.for_other_users();
    }
    Agent::start(options)
}

/// A client process of `user` (root when `None`), declared to the daemon of `pipe` as that
/// user once it runs as them.
fn client_of(agent: &Agent, user: Option<&str>, pipe: &Path) -> Sleeper {
    let client = Sleeper::start(user, &[]);
    let uid = user.map_or(0, |u| id_of("passwd", u));
    wait_for(Duration::from_secs(10), Duration::from_millis(20), || {
        match process_uid(client.pid()) {
            Some(found) if found == uid => Ok(()),
            other => Err(format!("the client runs as {other:?}, not {uid}")),
        }
    });
    let out = agent.mps_control(user, pipe, &["--fake-client", &client.pid().to_string()], "");
    assert!(out.status.success(), "{}", text(&out));
    client
}

fn process_uid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Uid:")?.split_whitespace().next()?.parse().ok())
}

/// The server of GPU `gpu` in `mps status --json`.
fn server_of(agent: &Agent, gpu: u32) -> MpsServer {
    let servers = agent.mps_servers();
    servers.into_iter().find(|s| s.gpu == gpu).expect("an MPS server on the GPU")
}

/// The value of series `name` whose labels include `gpu="GPU"`, in `body`.
fn series(body: &str, name: &str, gpu: u32) -> Option<f64> {
    let wanted = format!("gpu=\"{gpu}\"");
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(&wanted))
        .find_map(|l| l.rsplit_once(' ')?.1.parse().ok())
}

/// The value of series `name` without labels, in `body`.
fn plain(body: &str, name: &str) -> Option<f64> {
    body.lines().find_map(|l| l.strip_prefix(&format!("{name} "))?.parse().ok())
}

/// Waits until the agent's log (`log`) has a line containing `what`.
fn wait_for_log(log: &Path, what: &str) {
    wait_for(Duration::from_secs(30), Duration::from_millis(50), || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(what) { Ok(()) } else { Err(format!("no {what:?} in the log:\n{text}")) }
    });
}

/// Root changes a daemon's default thread percentage by hand: `status` and `mps status`
/// show the live value as drift (`assert` fails), the health check logs it and the
/// metrics show it, then the next health check puts the profile's back and says so; the
/// views show the profile's again and the metrics count the restore.
#[test]
fn limits_changed_behind_the_agents_back_are_drift_until_the_health_check_puts_them_back() {
    let logs = tempfile::tempdir().unwrap();
    let port = free_port();
    // Three seconds between checks: the drift stays at least that long before its restore.
    let agent = agent_with("h100-80gb:1", 3, port, logs.path(), false);
    let log = logs.path().join("agent.log");
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "{}", text(&out));
    let pipe = PathBuf::from(server_of(&agent, 0).pipe_directory);
    assert_eq!(agent.mps_ask(&pipe, "set_default_active_thread_percentage 90"), ["90.0"]);

    // `status` reads the daemon (at most a second after another read): 90 %, changed
    // outside gpushare.
    let status = wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
        let status = agent.status();
        match &status.gpus[0].sharing.mps {
            Some(mps) if mps.active_thread_percentage == 90 => Ok(status),
            other => Err(format!("status shows {other:?}")),
        }
    });
    let mps = status.gpus[0].sharing.mps.clone().unwrap();
    assert_eq!(mps.limits_source.as_deref(), Some("unknown"));
    let drift = status.drift.expect("drift");
    assert!(drift.contains("set the MPS limits of"), "{drift}");
    let out = agent.ctl(&["status"]);
    let said = stdout(&out);
    assert!(said.contains("mps 90% ") && said.contains(" (drift)"), "{said}");
    let server = server_of(&agent, 0);
    assert_eq!(server.daemon_defaults.map(|d| d.active_thread_percentage), Some(90));
    assert_eq!(server.configured.map(|d| d.active_thread_percentage), Some(25));
    let out = agent.ctl(&["mps"]);
    assert!(
        stdout(&out).contains(
            "GPU 0: limits changed outside gpushare: the daemon's defaults are 90% threads"
        ),
        "{}",
        stdout(&out)
    );
    assert_eq!(agent.ctl(&["assert", "all-mps"]).status.code(), Some(1));

    // The health check's look for drift logs it; the metrics follow the check.
    wait_for_log(&log, "set the MPS limits of");
    wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
        let body = scrape(port);
        let seen = (
            series(&body, "gpushare_mps_active_thread_ratio", 0),
            series(&body, "gpushare_mps_limits_drift", 0),
            plain(&body, "gpushare_profile_drift"),
        );
        if seen == (Some(0.9), Some(1.0), Some(1.0)) {
            Ok(())
        } else {
            Err(format!("metrics show {seen:?}"))
        }
    });

    // The next check puts the profile's back and says so.
    wait_for_log(&log, "limits changed outside gpushare put back");
    assert_eq!(agent.mps_ask(&pipe, "get_default_active_thread_percentage"), ["25.0"]);
    let status = agent.status();
    assert_eq!(status.drift, None);
    let mps = status.gpus[0].sharing.mps.clone().unwrap();
    assert_eq!((mps.active_thread_percentage, mps.limits_source.as_deref()), (25, Some("profile")));
    assert_eq!(server_of(&agent, 0).limit_restores, 1);
    assert!(agent.ctl(&["assert", "all-mps"]).status.success());
    wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
        let body = scrape(port);
        let seen = (
            series(&body, "gpushare_mps_active_thread_ratio", 0),
            series(&body, "gpushare_mps_limits_drift", 0),
            series(&body, "gpushare_mps_limit_restores_total", 0),
        );
        if seen == (Some(0.25), Some(0.0), Some(1.0)) {
            Ok(())
        } else {
            Err(format!("metrics show {seen:?}"))
        }
    });
}

/// `mps limit` on a client of GPU 1's server (two GPUs with MPS): the answer names that
/// server, its GPU and daemon, before and after; `mps`, `status`, `clients`, the CDI shares
/// and the metrics show the new limit as coming from `mps limit`; the health check keeps
/// it (no drift), and the other GPU's server is as it was.
#[test]
fn mps_limit_names_the_right_server_and_every_view_shows_its_effect() {
    let logs = tempfile::tempdir().unwrap();
    let port = free_port();
    let agent = agent_with("h100-80gb:2", 1, port, logs.path(), false);
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "{}", text(&out));
    let gpu1 = server_of(&agent, 1);
    let pipe = PathBuf::from(&gpu1.pipe_directory);
    let client = client_of(&agent, None, &pipe);
    let pid = client.pid().to_string();
    let server: u32 = agent.mps_ask(&pipe, "get_server_list")[0].parse().unwrap();

    let out = agent.ctl(&["mps", "limit", "--pid", &pid, "--threads", "60"]);
    let said = stdout(&out);
    assert!(said.contains(&format!("MPS server PID {server} on GPU 1 ({}", gpu1.uuid)), "{said}");
    assert!(said.contains("25% threads, 20389 MiB -> 60% threads, 20389 MiB"), "{said}");
    assert!(said.contains("begins with its defaults (25% threads, 20389 MiB) again"), "{said}");
    let result: MpsLimitResult = agent.ctl_doc(&["mps", "limit", "--pid", &pid, "--threads", "50"]);
    assert_eq!(
        (result.server_pid, result.gpu, result.uuid.as_str()),
        (server, Some(1), gpu1.uuid.as_str())
    );
    assert_eq!(result.daemon_pid, gpu1.pid);
    assert_eq!(result.before.map(|b| b.active_thread_percentage), Some(60));
    assert_eq!(result.after.map(|a| a.active_thread_percentage), Some(50));
    assert_eq!(result.server_uid, Some(0));

    let shown = server_of(&agent, 1);
    assert_eq!(shown.active_thread_percentage, 50);
    assert_eq!(shown.limits_source.as_deref(), Some("mps-limit"));
    let process = &shown.server_processes[0];
    assert_eq!((process.pid, process.source.as_str()), (server, "mps-limit"));
    let other = server_of(&agent, 0);
    assert_eq!(
        (other.active_thread_percentage, other.limits_source.as_deref()),
        (25, Some("profile"))
    );
    let status = agent.status();
    assert_eq!(status.drift, None);
    let mps = status.gpus[1].sharing.mps.clone().unwrap();
    assert_eq!(
        (mps.active_thread_percentage, mps.limits_source.as_deref()),
        (50, Some("mps-limit"))
    );
    let table: ClientTable = agent.ctl_doc(&["clients"]);
    let share = table.clients.iter().find(|c| c.pid == client.pid()).and_then(|c| c.share.clone());
    assert_eq!(share.map(|s| s.active_thread_percentage), Some(50), "{table:?}");
    let cdi = agent.ctl(&["cdi", "1-mps-0"]);
    assert!(
        stdout(&cdi).contains("50 % threads") && stdout(&cdi).contains("mps limit"),
        "{}",
        text(&cdi)
    );
    wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
        let body = scrape(port);
        match series(&body, "gpushare_mps_active_thread_ratio", 1) {
            Some(0.5) => Ok(()),
            other => Err(format!("GPU 1's ratio is {other:?}")),
        }
    });

    // Health checks (1 s apart) keep what mps limit set: it is no drift.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(agent.mps_ask(&pipe, &format!("get_active_thread_percentage {server}")), ["50.0"]);
    assert_eq!(server_of(&agent, 1).limits_source.as_deref(), Some("mps-limit"));
    assert_eq!(agent.status().drift, None);
    client.end();
}

/// A profile's `multi_user = true`: the daemon runs with `-M`, a member's client and
/// root's are served at once by one server (the simulated daemon's log names both as the
/// server's user's), and the views say multi-user.
#[test]
fn a_multi_user_daemon_serves_two_users_at_once_and_the_views_say_so() {
    if !is_root() {
        gpushare_tests::skip("needs root to create test users");
        return;
    }
    let logs = tempfile::tempdir().unwrap();
    let agent = agent_with("h100-80gb:1", 1, free_port(), logs.path(), true);
    let (_dir, file) = gpushare_tests::temp_file(
        "shared.toml",
        "[[gpu]]\nselect = \"all\"\nsharing = { mps = { replicas = 4, multi_user = true } }\n",
    );
    let out = agent.ctl(&["apply", "-f", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let server = server_of(&agent, 0);
    assert!(server.multi_user);
    let daemon = server.pid.unwrap();
    let cmdline = std::fs::read(format!("/proc/{daemon}/cmdline")).unwrap();
    assert!(cmdline.split(|&b| b == 0).any(|a| a == b"-M"), "{cmdline:?}");

    let pipe = PathBuf::from(&server.pipe_directory);
    let member = client_of(&agent, Some(MEMBER), &pipe);
    let root = client_of(&agent, None, &pipe);
    let mut both = vec![member.pid(), root.pid()];
    both.sort_unstable();
    let mut served = server_of(&agent, 0).clients;
    served.sort_unstable();
    assert_eq!(served, both, "one server serves both users' clients at once");
    let log_dir = Path::new(&server.pipe_directory).with_file_name("log");
    let control_log = std::fs::read_to_string(log_dir.join("control.log")).unwrap();
    assert!(
        control_log
            .contains(&format!("NEW CLIENT {} from user 0: Server already exists", member.pid())),
        "{control_log}"
    );
    let shown = server_of(&agent, 0);
    assert_eq!(shown.server_processes[0].uid, Some(0), "{shown:?}");
    let status = stdout(&agent.ctl(&["status"]));
    assert!(status.contains("multi-user"), "{status}");
    let mps = stdout(&agent.ctl(&["mps"]));
    assert!(
        mps.contains(
            "GPU 0: multi-user: one server running as root serves every user's clients at once"
        ),
        "{mps}"
    );
    let clients = stdout(&agent.ctl(&["clients"]));
    assert!(clients.contains("MPS server of GPU 0: multi-user"), "{clients}");
    let cdi = stdout(&agent.ctl(&["cdi", "0-mps-0"]));
    assert!(cdi.contains("multi-user"), "{cdi}");
    // Back to one user at a time: a mode change restarts the server, which its clients
    // would not survive, so it is refused while they run.
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(!out.status.success(), "{}", text(&out));
    member.end();
    root.end();
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!server_of(&agent, 0).multi_user);
}

/// Without `multi_user`, a member's client declared while root's client is served waits,
/// unlisted, and the views say whom the server serves; once root's client is gone the
/// daemon serves the member with a server of their own, and the views say so.
#[test]
fn one_user_at_a_time_another_users_client_waits_and_the_views_say_whom_the_server_serves() {
    if !is_root() {
        gpushare_tests::skip("needs root to create test users");
        return;
    }
    let logs = tempfile::tempdir().unwrap();
    let agent = agent_with("h100-80gb:1", 1, free_port(), logs.path(), true);
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "{}", text(&out));
    let pipe = PathBuf::from(server_of(&agent, 0).pipe_directory);
    let root = client_of(&agent, None, &pipe);
    let member = client_of(&agent, Some(MEMBER), &pipe);
    let server = server_of(&agent, 0);
    assert!(!server.multi_user);
    assert_eq!(server.clients, [root.pid()], "the member's client waits, unlisted");
    assert_eq!(server.server_processes[0].uid, Some(0), "{server:?}");
    let line = "GPU 0: server";
    let serves_root = "serves root's clients only: another user's client waits until they are gone";
    for (view, args) in [("mps", vec!["mps"]), ("status", vec!["status"])] {
        let said = stdout(&agent.ctl(&args));
        assert!(said.contains(line) && said.contains(serves_root), "{view}:\n{said}");
    }
    let clients = stdout(&agent.ctl(&["clients"]));
    assert!(clients.contains(serves_root), "{clients}");
    assert!(!clients.contains(&member.pid().to_string()), "{clients}");
    let cdi = stdout(&agent.ctl(&["cdi", "0-mps-0"]));
    assert!(cdi.contains("one user at a time"), "{cdi}");

    // Root's client ends: the member's gets a server of the member's own.
    root.end();
    let member_uid = id_of("passwd", MEMBER);
    wait_for(Duration::from_secs(30), Duration::from_millis(100), || {
        let server = server_of(&agent, 0);
        match server.server_processes.first().and_then(|p| p.uid) {
            Some(uid) if uid == member_uid && server.clients == [member.pid()] => Ok(()),
            _ => Err(format!("not yet the member's server: {server:?}")),
        }
    });
    let said = stdout(&agent.ctl(&["mps"]));
    assert!(said.contains(&format!("serves {MEMBER}'s clients only")), "{said}");
    member.end();
}
