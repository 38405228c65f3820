//! Issue 27: a bench holds its GPU, not the node. While a bench runs on GPU 0 of two
//! simulated A100s, an apply of a profile of GPU 1 alone goes through, one that selects
//! GPU 0 is refused in one line naming the bench, `status` says who benches which GPU and
//! what comes back, and after the bench GPU 0 is as it was while the profile applied to
//! GPU 1 stays the active one — also when the agent dies mid-bench.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gpushare_proto::types::{BenchStatus, Status};
use gpushare_tests::{
    Agent, AgentOptions, ctl_error, layout, reason_lines, stderr, text, wait_for,
};
use tempfile::TempDir;

/// A replica that reports one unit (the window may open), five more 1 s later, and idles
/// until stopped (as `bench.rs`'s units replica, without its records).
const REPLICA: &str = "#!/bin/sh\necho >&3\nsleep 1\nfor ms in 10 20 30 40 50; do echo $ms >&3; done\nexec sleep 600\n";

/// GPU 1 alone, under MPS for two clients.
const GPU1_MPS: &str = "name = \"gpu1-mps\"\n[[gpu]]\nselect = 1\nmig = \"disabled\"\nsharing.mps = { replicas = 2 }\n";

/// Two A100s with the GPU-1 profile known, both GPUs under `all-mps` (4 clients each).
fn agent() -> Agent {
    let agent =
        Agent::start(AgentOptions::simulate("a100-40gb:2").profile("gpu1-mps.toml", GPU1_MPS));
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "{}", text(&out));
    agent
}

/// `gpushare-ctl bench ARGS -- /bin/sh replica.sh` on GPU 0, started in the background.
fn bench(agent: &Agent, dir: &TempDir, args: &[&str]) -> Child {
    std::fs::write(dir.path().join("replica.sh"), REPLICA).unwrap();
    let mut all = vec!["bench", "--target", "0", "--replicas", "1", "--strategies", "mps-limited"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--", "/bin/sh", "replica.sh"]);
    agent
        .ctl_command(&all)
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until the bench shows in `status` and its replica runs (the journal records it).
fn bench_running(agent: &Agent) -> BenchStatus {
    wait_for(Duration::from_secs(30), Duration::from_millis(20), || {
        let status = agent.status();
        let replicas = agent.journal()["bench"]["replicas"].as_array().map_or(0, Vec::len);
        match status.benches.first() {
            Some(b) if replicas > 0 => Ok(b.clone()),
            _ => Err(format!("the bench's replica did not start: {status:?}")),
        }
    })
}

/// GPU `index`'s sharing as `status` shows it: MIG layout, strategy and MPS limits.
fn shape(status: &Status, index: usize) -> String {
    let g = &status.gpus[index];
    let mps =
        g.sharing.mps.as_ref().map(|m| (m.active_thread_percentage, m.pinned_memory_limit_bytes));
    format!("{:?} {} {} {mps:?}", layout(status)[index], g.compute_mode, g.sharing.strategy)
}

/// How the agent names the user running the tests: `ada (uid 1000)`, or `uid 1000` when
/// the password database has no name for it.
fn me() -> (u32, String) {
    let id = Command::new("id").arg("-u").output().unwrap();
    let uid: u32 = String::from_utf8_lossy(&id.stdout).trim().parse().unwrap();
    let entry = Command::new("getent").args(["passwd", &uid.to_string()]).output();
    let name = entry
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8_lossy(&o.stdout).split(':').next().map(str::to_string))
        .filter(|n| !n.is_empty());
    let who = match name {
        Some(name) => format!("{name} (uid {uid})"),
        None => format!("uid {uid}"),
    };
    (uid, who)
}

#[test]
fn a_bench_holds_its_gpu_and_an_apply_of_the_other_gpu_runs_beside_it() {
    let agent = agent();
    let before = agent.status();
    let gpu0_before = shape(&before, 0);
    let dir = tempfile::tempdir().unwrap();
    // 4 s windows: the baseline alone is measured three times (about 15 s in all).
    let ctl = bench(&agent, &dir, &["--duration", "4s"]);
    let shown = bench_running(&agent);
    let (uid, who) = me();

    // status --json: the bench, who, since when, and what comes back; not the command.
    let status = agent.status();
    assert_eq!(status.benches.len(), 1, "{status:?}");
    assert_eq!((shown.gpu, shown.uuid.as_str(), shown.uid), (0, before.gpus[0].uuid.as_str(), uid));
    assert!(shown.job.starts_with("/io/gpushare/Agent1/jobs/"), "{shown:?}");
    assert!(who.starts_with(shown.user.as_deref().unwrap_or("uid")), "{shown:?} / {who}");
    assert_eq!(shown.profile_before.as_deref(), Some("all-mps"));
    assert!(shown.restores.starts_with("MIG off, compute mode "), "{shown:?}");
    assert!(shown.restores.contains("MPS at 25 % threads"), "{shown:?}");
    assert!(shown.started_unix_seconds > 1_600_000_000, "{shown:?}");
    // A bench's setup is never the active profile, and it is no apply in progress.
    assert_eq!(status.active_profile.as_deref(), Some("all-mps"));
    assert_eq!(status.active_source.as_deref(), Some("built-in"));
    assert_eq!(status.apply_in_progress, None);
    assert_eq!(status.drift, None, "the benched GPU is no drift: {status:?}");
    let raw = agent.ctl(&["status", "--json"]);
    assert!(!String::from_utf8_lossy(&raw.stdout).contains("replica.sh"), "{}", text(&raw));

    // status for people.
    let out = agent.ctl(&["status"]);
    assert!(out.status.success(), "{}", text(&out));
    let human = String::from_utf8_lossy(&out.stdout);
    assert!(human.starts_with("Active profile: all-mps  (backend:"), "{human}");
    assert!(human.contains("Bench running on GPU 0 for "), "{human}");
    assert!(human.contains(&format!(", started by {who}: {}\n", shown.job)), "{human}");
    assert!(
        human.contains(&format!(
            "  At its end GPU 0 goes back to: {} (profile active when it began: all-mps)\n",
            shown.restores
        )),
        "{human}"
    );
    assert!(!human.contains("replica.sh") && !human.contains("no longer known"), "{human}");

    // An apply of GPU 1 alone goes through while the bench runs.
    let out = agent.ctl(&["apply", "gpu1-mps"]);
    assert!(out.status.success(), "{}", text(&out));
    let during = agent.status();
    assert_eq!(during.benches.len(), 1, "the bench still runs: {during:?}");
    assert_eq!(during.active_profile.as_deref(), Some("gpu1-mps"));
    let threads = during.gpus[1].sharing.mps.as_ref().map(|m| m.active_thread_percentage);
    assert_eq!(threads, Some(50), "{during:?}");

    // One that selects GPU 0 is refused in one line naming the bench, and changes nothing.
    let out = agent.ctl(&["apply", "all-time-sliced"]);
    assert!(!out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    assert_eq!(reason_lines(&err), 1, "{err}");
    assert!(
        err.contains(&format!(
            "a bench is running ({}, bench on GPU 0 (this profile selects it), started by {who})",
            shown.job
        )),
        "{err}"
    );
    let error = ctl_error(&agent.ctl(&["apply", "all-time-sliced", "--json"]));
    assert_eq!(error.name, "io.gpushare.Agent1.Error.Busy", "{error:?}");
    // So is a second bench, of the other GPU too: one measurement at a time.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("replica.sh"), REPLICA).unwrap();
    let out = agent
        .ctl_command(&["bench", "--target", "1", "--replicas", "1", "--", "/bin/sh", "replica.sh"])
        .current_dir(other.path())
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(stderr(&out).contains(&format!("a bench is running ({}", shown.job)), "{}", text(&out));
    let now = agent.status();
    assert_eq!(now.benches.len(), 1, "the bench still runs: {now:?}");
    assert_eq!(shape(&now, 1), shape(&during, 1));

    // The bench ends well; GPU 0 is back, GPU 1 keeps its profile, which stays active.
    let out = ctl.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let after = agent.status();
    assert!(after.benches.is_empty(), "{after:?}");
    assert_eq!(shape(&after, 0), gpu0_before);
    assert_eq!(shape(&after, 1), shape(&during, 1));
    assert_eq!(after.active_profile.as_deref(), Some("gpu1-mps"));
    assert_eq!((after.rollback_error, after.drift), (None, None));
    assert!(agent.journal().get("bench").is_none(), "{}", agent.journal());
    // And the GPU is anyone's again.
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn an_agent_that_dies_mid_bench_restores_the_gpu_and_keeps_the_other_gpus_profile() {
    let mut agent = agent();
    let gpu0_before = shape(&agent.status(), 0);
    let dir = tempfile::tempdir().unwrap();
    let mut ctl = bench(&agent, &dir, &["--duration", "30s"]);
    bench_running(&agent);
    let out = agent.ctl(&["apply", "gpu1-mps"]);
    assert!(out.status.success(), "{}", text(&out));
    let gpu1 = shape(&agent.status(), 1);
    agent.start_again(); // SIGKILL, then a new agent on the same state
    let _ = ctl.kill();
    let _ = ctl.wait();
    let after = agent.status();
    assert!(after.benches.is_empty(), "{after:?}");
    assert_eq!(shape(&after, 0), gpu0_before);
    assert_eq!(shape(&after, 1), gpu1);
    assert_eq!(after.active_profile.as_deref(), Some("gpu1-mps"));
    assert_eq!(after.rollback_error, None);
    assert!(agent.journal().get("bench").is_none(), "{}", agent.journal());
}
