//! Issue 41: an apply takes a real Slurm 22.05 node through a change of its GRES
//! (DESIGN.md "Slurm (issue 41): a GRES change, node by node"). The node is dynamic and
//! driven by gpushare-agent as on a real host (`Setup::agent_driven`): its gres.conf and
//! `Gres=` are the agent's files, and the agent stops and starts slurmd through its
//! `[slurm]` commands. No hand restart anywhere: each test only applies and looks.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use gpushare_tests::slurm::{Setup, Slurm, agent_commands, write_script};
use gpushare_tests::{Agent, AgentOptions, repo_root, text, wait_for};
use serde_json::Value;

/// Each GPU's layout and sharing as `status` says them (without the processes' ids: a
/// rollback starts MPS servers again).
fn layout(agent: &Agent) -> Vec<String> {
    let gpus = status_gpus(agent);
    let each = |g: &Value| {
        let instances: Vec<&Value> =
            g["instances"].as_array().into_iter().flatten().map(|i| &i["profile"]).collect();
        let mps = &g["sharing"]["mps"]["configured"];
        format!(
            "{} {} {instances:?} {} {mps}",
            g["index"], g["mig_enabled"], g["sharing"]["strategy"]
        )
    };
    gpus.as_array().unwrap().iter().map(each).collect()
}

fn status_gpus(agent: &Agent) -> Value {
    let out = agent.ctl(&["status", "--json"]);
    assert!(out.status.success(), "status: {}", text(&out));
    let status: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    status["gpus"].clone()
}

/// An agent on two simulated H100s keeping a Slurm node's GRES in `dir`, with `more`
/// agent.toml lines after the `[slurm]` table's.
fn start_agent(dir: &Path, more: &str) -> Agent {
    start_agent_with(dir, more, AgentOptions::simulate("h100-80gb:2"))
}

/// [`start_agent`] with these options.
fn start_agent_with(dir: &Path, more: &str, options: AgentOptions) -> Agent {
    let config = format!("{}{more}", agent_commands(dir));
    let agent = Agent::start(options.config(&config));
    let env = dir.join("slurmd.env");
    wait_for(Duration::from_secs(30), Duration::from_millis(50), || match env.exists() {
        true => Ok(()),
        false => Err(format!("the agent wrote no {} at start", env.display())),
    });
    agent
}

/// The agent-driven cluster of `dir` with these `GresTypes` and the package's TaskProlog.
fn cluster(dir: &Path, gres_types: &str) -> Option<Slurm> {
    let prolog = dir.join("task-prolog");
    write_script(
        &prolog,
        &format!(
            "#!/bin/sh\nGPUSHARE_GRES_CONF={} exec /bin/sh {}\n",
            dir.join("gres.conf").display(),
            repo_root().join("packaging/slurm/gpushare-task-prolog").display()
        ),
    );
    let setup = Setup::gres(gres_types, "", "")
        .agent_driven(dir)
        .line(&format!("TaskProlog={}", prolog.display()));
    Slurm::start(&setup)
}

fn node_gres(slurm: &Slurm) -> BTreeSet<String> {
    slurm.node_info()["Gres"].split(',').map(String::from).collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

const H100: &str = "h100-80gb-hbm3";

/// Whether a node's fields say no job is on it, not even one ending.
fn idle(node: &BTreeMap<String, String>) -> bool {
    node.get("State").is_some_and(|s| s.starts_with("IDLE") && !s.contains("COMPLETING"))
}

#[test]
fn apply_all_mps_changes_the_node_s_gres_and_a_failed_apply_leaves_it_drained() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(dir.path(), "");
    let Some(slurm) = cluster(dir.path(), "gpu,mps") else { return };
    assert_eq!(node_gres(&slurm), set(&[&format!("gpu:{H100}:2")]));

    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "apply all-mps: {}", text(&out));
    assert_eq!(node_gres(&slurm), set(&[&format!("gpu:{H100}:2"), &format!("mps:{H100}:200")]));
    let state = &slurm.node_info()["State"];
    assert!(state.starts_with("IDLE") && !state.contains("DRAIN"), "{state}");
    let job = slurm.job_env("mps:25");
    assert_eq!(job["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25", "{job:?}");
    let gpus = status_gpus(&agent);
    let gpu = gpus
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["uuid"].as_str() == Some(&job["CUDA_VISIBLE_DEVICES"]))
        .unwrap_or_else(|| panic!("the job's device is no GPU of status: {job:?}"));
    assert_eq!(job["CUDA_MPS_PIPE_DIRECTORY"], gpu["sharing"]["mps"]["pipe_directory"]);

    // A failed apply (a GPU instance the driver refuses): rolled back, the node drained
    // with the error as the reason.
    agent.restart_with_env(&[("GPUSHARE_SIM_FAIL", "nvmlDeviceCreateGpuInstanceWithPlacement:2")]);
    let before = layout(&agent);
    let out = agent.ctl(&["apply", "half-balanced"]);
    assert!(!out.status.success(), "the apply the driver fails succeeded");
    assert_eq!(layout(&agent), before, "the rollback left the GPUs changed");
    let node = slurm.node_info();
    assert!(node["State"].contains("DRAIN"), "{node:?}");
    assert!(node["Reason"].starts_with("gpushare: apply half-balanced failed"), "{node:?}");
    assert_eq!(node_gres(&slurm), set(&[&format!("gpu:{H100}:2"), &format!("mps:{H100}:200")]));

    // An apply that changes nothing gives back the node gpushare's failure drained.
    agent.restart_with_env(&[]);
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "apply all-mps again: {}", text(&out));
    let node = slurm.node_info();
    assert!(!node["State"].contains("DRAIN"), "{node:?}");

    // The next apply that changes the GRES takes the node through it and gives it back.
    let out = agent.ctl(&["apply", "all-disabled"]);
    assert!(out.status.success(), "apply all-disabled: {}", text(&out));
    assert_eq!(node_gres(&slurm), set(&[&format!("gpu:{H100}:2")]));
    let node = slurm.node_info();
    assert!(!node["State"].contains("DRAIN"), "{node:?}");
}

#[test]
fn a_gres_change_while_a_job_holds_a_mig_device_is_refused_naming_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(dir.path(), "");
    let Some(slurm) = cluster(dir.path(), "gpu") else { return };

    let out = agent.ctl(&["apply", "half-balanced"]);
    assert!(out.status.success(), "apply half-balanced: {}", text(&out));
    let gpus = status_gpus(&agent);
    super::slurm_views::half_balanced_in_slurm(&slurm, &gpus);
    let want = node_gres(&slurm);

    // A job holds a MIG device: an apply that would change the GRES is refused, naming
    // it; the job runs on, the GPUs and the node are as they were.
    let held = slurm.sbatch(&["--gres=gpu:1g.10gb:1", "--wrap", "sleep 600"]);
    slurm.wait_job(&held, "RUNNING");
    let out = agent.ctl(&["apply", "all-balanced"]);
    assert!(!out.status.success(), "an apply over a running MIG job succeeded");
    let said = text(&out);
    assert!(said.contains(&format!("job {held} ")), "{said}");
    assert!(said.contains("[slurm]"), "{said}");
    let info = slurm.wait_job(&held, "RUNNING");
    assert_eq!(info["Restarts"], "0", "{info:?}");
    assert_eq!(status_gpus(&agent), gpus, "the refused apply changed the GPUs");
    assert_eq!(node_gres(&slurm), want);
    let node = slurm.node_info();
    assert!(!node["State"].contains("DRAIN"), "{node:?}");

    // Stopped by its user (SIGSTOP through Slurm), it still holds its device.
    assert!(slurm.run("scancel", &["--signal=STOP", &held]).status.success());
    slurm.wait_job(&held, "STOPPED");
    let out = agent.ctl(&["apply", "all-balanced"]);
    assert!(text(&out).contains(&format!("job {held} ")), "{}", text(&out));
    assert_eq!(status_gpus(&agent), gpus, "the refused apply changed the GPUs");
    assert!(slurm.run("scancel", &[&held]).status.success());
    slurm.wait_node_where("no job left", idle);

    // A job without GPUs is on the node too: slurmctld deletes no busy node, so that is
    // refused as well (rather than found out after the GPUs changed).
    let cpu = slurm.sbatch(&["--wrap", "sleep 600"]);
    slurm.wait_job(&cpu, "RUNNING");
    let out = agent.ctl(&["apply", "all-balanced"]);
    assert!(text(&out).contains(&format!("job {cpu} ")), "{}", text(&out));
    assert_eq!(status_gpus(&agent), gpus, "the refused apply changed the GPUs");

    // Once they are done, the same apply goes through.
    assert!(slurm.run("scancel", &[&cpu]).status.success());
    slurm.wait_node_where("no job left", idle);
    let out = agent.ctl(&["apply", "all-balanced"]);
    assert!(out.status.success(), "apply all-balanced: {}", text(&out));
    assert!(node_gres(&slurm).iter().all(|g| !g.starts_with(&format!("gpu:{H100}"))));
}

/// Refused before the first step, one line naming the setting, GPUs unchanged.
fn refused(agent: &Agent, setting: &str) {
    let before = status_gpus(agent);
    let out = agent.ctl(&["apply", "half-balanced"]);
    assert!(!out.status.success(), "applied with a bad [slurm]: {}", text(&out));
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(said.contains(setting), "{setting} not named: {said}");
    assert_eq!(said.trim().lines().count(), 1, "{said}");
    assert_eq!(status_gpus(agent), before, "a refused apply changed the GPUs");
}

#[test]
fn bad_slurm_settings_are_refused_before_the_first_step() {
    // scontrol missing: no Slurm needed.
    let dir = tempfile::tempdir().unwrap();
    let empty = tempfile::tempdir().unwrap();
    let bin = format!("bin_dir = {:?}\n", empty.path().display().to_string());
    let config = agent_commands(dir.path()).replace("bin_dir", "# bin_dir") + &bin;
    let agent = Agent::start(AgentOptions::simulate("h100-80gb:2").config(&config));
    refused(&agent, "[slurm] bin_dir");
    drop(agent);

    // An unwritable GRES file: its directory is anyone's to write.
    let open = tempfile::tempdir().unwrap();
    std::fs::set_permissions(open.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .unwrap();
    let gres = format!("gres_conf = {:?}\n", open.path().join("gres.conf").display().to_string());
    let config = agent_commands(dir.path()).replace("gres_conf", "# gres_conf") + &gres;
    let agent = Agent::start(AgentOptions::simulate("h100-80gb:2").config(&config));
    refused(&agent, "[slurm] gres_conf");
    drop(agent);

    let dir = tempfile::tempdir().unwrap();
    let agent_ok = start_agent(dir.path(), "");
    let Some(mut slurm) = cluster(dir.path(), "gpu") else { return };
    drop(agent_ok);
    // A node name Slurm does not know.
    let other = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(slurm.slurm_conf(), other.path().join("slurm.conf")).unwrap();
    let config = agent_commands(other.path()) + "node = \"nosuchnode\"\n";
    let agent = Agent::start(AgentOptions::simulate("h100-80gb:2").config(&config));
    refused(&agent, "[slurm] node");
    drop(agent);
    // Slurm configured but slurmctld not running.
    let agent =
        Agent::start(AgentOptions::simulate("h100-80gb:2").config(&agent_commands(other.path())));
    slurm.stop_slurmctld();
    refused(&agent, "[slurm] enabled");
}

#[test]
fn time_slicing_replicas_become_shards_and_go_again() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(dir.path(), "");
    let Some(slurm) = cluster(dir.path(), "gpu,shard") else { return };

    let out = agent.ctl(&["apply", "all-time-sliced"]);
    assert!(out.status.success(), "apply all-time-sliced: {}", text(&out));
    // Four replicas on each of the two GPUs.
    assert_eq!(node_gres(&slurm), set(&[&format!("gpu:{H100}:2"), &format!("shard:{H100}:8")]));
    let job = slurm.job_env("shard:2");
    let gpus = status_gpus(&agent);
    let uuids: Vec<&str> =
        gpus.as_array().unwrap().iter().filter_map(|g| g["uuid"].as_str()).collect();
    assert!(uuids.contains(&job["CUDA_VISIBLE_DEVICES"].as_str()), "{job:?} vs {uuids:?}");

    // A drain of the site's (its own reason) is kept across the change.
    let name = slurm.node().to_string();
    let drain = ["update", &format!("NodeName={name}"), "State=DRAIN", "Reason=fan check"];
    assert!(slurm.scontrol(&drain).status.success());
    let out = agent.ctl(&["apply", "all-disabled"]);
    assert!(out.status.success(), "apply all-disabled: {}", text(&out));
    assert_eq!(node_gres(&slurm), set(&[&format!("gpu:{H100}:2")]));
    let node = slurm.node_info();
    assert!(node["State"].contains("DRAIN"), "{node:?}");
    assert!(node["Reason"].starts_with("fan check"), "{node:?}");
}

#[test]
fn a_node_of_slurm_conf_is_refused_a_gres_change_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(dir.path(), "");
    // The node line and gres.conf of slurm.conf's own (static) node, as the agent's file
    // says them now.
    let gres = std::fs::read_to_string(dir.path().join("gres.conf")).unwrap();
    let lines: Vec<&str> =
        gres.lines().filter(|l| !l.starts_with('#') && !l.starts_with("AutoDetect=")).collect();
    let setup = Setup::gres("gpu", &format!("gpu:{H100}:2"), &lines.join("\n"));
    let Some(slurm) = Slurm::start(&setup) else { return };
    std::os::unix::fs::symlink(slurm.slurm_conf(), dir.path().join("slurm.conf")).unwrap();
    assert!(!slurm.node_info()["State"].contains("DYNAMIC"));

    let before = layout(&agent);
    let out = agent.ctl(&["apply", "half-balanced"]);
    assert!(!out.status.success(), "a static node's GRES changed: {}", text(&out));
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(said.contains("manage_node"), "{said}");
    assert_eq!(layout(&agent), before);
    let node = slurm.node_info();
    assert!(node["State"].starts_with("IDLE") && !node["State"].contains("DRAIN"), "{node:?}");
    // An apply that leaves the GRES as they are goes through, Slurm left alone.
    let out = agent.ctl(&["apply", "all-disabled"]);
    assert!(out.status.success(), "apply all-disabled: {}", text(&out));
}

/// MPS on one GPU, the other whole: `mps-on-<n>`.
fn mps_on(n: u32) -> String {
    let other = 1 - n;
    format!(
        "name = \"mps-on-{n}\"\n[[gpu]]\nselect = {n}\nmig = \"disabled\"\n\
         sharing.mps = {{ replicas = 4 }}\n[[gpu]]\nselect = {other}\nmig = \"disabled\"\n"
    )
}

#[test]
fn an_mps_server_that_moves_to_another_gpu_moves_in_slurm_too() {
    // The node's GRES count the same before and after (gpu:2, mps:100): only gres.conf's
    // files say which GPU serves MPS, and slurmd reads them again.
    let dir = tempfile::tempdir().unwrap();
    let options = AgentOptions::simulate("h100-80gb:2")
        .profile("mps-on-0.toml", &mps_on(0))
        .profile("mps-on-1.toml", &mps_on(1));
    let agent = start_agent_with(dir.path(), "", options);
    let Some(slurm) = cluster(dir.path(), "gpu,mps") else { return };
    let gpus = status_gpus(&agent);
    let uuid = |i: usize| gpus[i]["uuid"].as_str().unwrap().to_string();
    for n in [0, 1] {
        let out = agent.ctl(&["apply", &format!("mps-on-{n}")]);
        assert!(out.status.success(), "apply mps-on-{n}: {}", text(&out));
        assert_eq!(node_gres(&slurm), set(&[&format!("gpu:{H100}:2"), &format!("mps:{H100}:100")]));
        let job = slurm.job_env("mps:25");
        assert_eq!(job["CUDA_VISIBLE_DEVICES"], uuid(n as usize), "{job:?}");
        assert_eq!(job["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25", "{job:?}");
    }
}

#[test]
fn an_agent_restarted_on_a_busy_node_changes_no_gpu_under_its_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(dir.path(), "");
    let Some(slurm) = cluster(dir.path(), "gpu,mps") else { return };
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "apply all-mps: {}", text(&out));
    let job = slurm.sbatch(&["--wrap", "sleep 600"]);
    slurm.wait_job(&job, "RUNNING");

    // Restarted (say, by a package upgrade) with another profile to re-apply at start-up,
    // while slurmd runs and a job is on the node: the start-up re-apply is refused as an
    // apply would be, naming the job.
    let before = layout(&agent);
    let config = agent.dir.path().join("agent.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("boot_profile = \"all-disabled\"\n{text}")).unwrap();
    agent.restart();
    assert_eq!(layout(&agent), before, "the start-up re-apply changed the GPUs under a job");
    let out = agent.ctl(&["status", "--json"]);
    let status: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    let why = status["start_up_error"].as_str().unwrap_or_default();
    assert!(why.contains(&format!("job {job} ")), "{status:#}");
    assert_eq!(slurm.wait_job(&job, "RUNNING")["Restarts"], "0");
}
