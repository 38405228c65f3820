//! Issue 41 on a real Slurm: the gres.conf gpushare-agent keeps ([slurm]) given to a
//! private Slurm 22.05 cluster (`tests/support/slurm.rs`), with the node line its comments
//! say and the package's TaskProlog: `scontrol show node` lists the GRES `status` shows,
//! `srun --gres=gpu:<profile>:1` gets the MIG device's UUID and `srun --gres=mps:25` the
//! MPS server's pipe directory and 25 %. One cluster per layout: on 22.05 a change of a
//! node's GPU GRES takes a slurmctld restart (DESIGN.md, "what Slurm 22.05 takes").

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use gpushare_tests::slurm::{Setup, Slurm, write_script};
use gpushare_tests::{Agent, AgentOptions, repo_root};
use serde_json::Value;

fn status_of(agent: &Agent) -> Value {
    let out = agent.ctl(&["status", "--json"]);
    assert!(out.status.success(), "status: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("status JSON")
}

fn apply(agent: &Agent, profile: &str) {
    let out = agent.ctl(&["apply", profile]);
    assert!(out.status.success(), "apply {profile}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The cluster the agent's gres.conf at `gres` describes: GresTypes and the node's Gres=
/// from its comments, its lines, and the package's TaskProlog reading it.
fn cluster(gres: &Path, prolog_dir: &Path) -> Option<Slurm> {
    let text = std::fs::read_to_string(gres).expect("the agent's gres.conf");
    let comment = |prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in:\n{text}"))
            .to_string()
    };
    let types = comment("# slurm.conf: GresTypes=");
    let node = comment("# slurm.conf, this node's NodeName line: Gres=");
    let lines: Vec<&str> =
        text.lines().filter(|l| !l.starts_with('#') && !l.starts_with("AutoDetect=")).collect();
    let prolog = prolog_dir.join("task-prolog");
    write_script(
        &prolog,
        &format!(
            "#!/bin/sh\nGPUSHARE_GRES_CONF={} exec /bin/sh {}\n",
            gres.display(),
            repo_root().join("packaging/slurm/gpushare-task-prolog").display()
        ),
    );
    let setup = Setup::gres(&types, &node, &lines.join("\n"))
        .line(&format!("TaskProlog={}", prolog.display()));
    Slurm::start(&setup)
}

/// The node's GRES as Slurm lists them, as a set of `name:type:count` (`mps:h100:200`:
/// Slurm adds the GPU's type to a shared GRES).
fn node_gres(slurm: &Slurm) -> BTreeSet<String> {
    let info = slurm.node_info();
    info["Gres"].split(',').map(String::from).collect()
}

#[test]
fn slurm_jobs_reach_the_mig_devices_and_mps_shares_gpushare_made() {
    if !Slurm::available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let gres = dir.path().join("gres.conf");
    let config = format!(
        "[slurm]\nenabled = true\nmanage_node = false\ngres_conf = {:?}\nslurmd_env = {:?}\n",
        gres.display().to_string(),
        dir.path().join("slurmd.env").display().to_string()
    );
    let agent = Agent::start(AgentOptions::simulate("h100-80gb:2").config(&config));

    // half-balanced: GPU 0's MIG devices and GPU 1 whole.
    apply(&agent, "half-balanced");
    let status = status_of(&agent);
    let Some(slurm) = cluster(&gres, dir.path()) else { return };
    half_balanced_in_slurm(&slurm, &status["gpus"]);
    let whole = slurm.job_env("gpu:h100-80gb-hbm3:1");
    assert_eq!(whole["CUDA_VISIBLE_DEVICES"], status["gpus"][1]["uuid"].as_str().unwrap());
    drop(slurm);

    // all-mps: each GPU's MPS server, a job of 25 % reaching it.
    apply(&agent, "all-mps");
    let status = status_of(&agent);
    let Some(slurm) = cluster(&gres, dir.path()) else { return };
    let gres_now = node_gres(&slurm);
    assert!(gres_now.contains("gpu:h100-80gb-hbm3:2"), "{gres_now:?}");
    assert!(gres_now.iter().any(|g| g.starts_with("mps:") && g.ends_with(":200")), "{gres_now:?}");
    let job = slurm.job_env("mps:25");
    assert_eq!(job["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25", "{job:?}");
    let gpu = status["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["uuid"].as_str() == Some(&job["CUDA_VISIBLE_DEVICES"]))
        .unwrap_or_else(|| panic!("the job's device is no GPU of status: {job:?}"));
    assert_eq!(
        job["CUDA_MPS_PIPE_DIRECTORY"],
        gpu["sharing"]["mps"]["pipe_directory"].as_str().unwrap(),
        "{job:?}"
    );
}

/// half-balanced as Slurm must list it and a job must see it: `scontrol show node` lists
/// GPU 0's MIG devices by profile and GPU 1 whole, as status's `gpus` say, and a job given
/// a `1g.10gb` device gets the UUID of one of GPU 0's.
pub(crate) fn half_balanced_in_slurm(slurm: &Slurm, gpus: &Value) {
    let mut want: BTreeMap<String, u32> = BTreeMap::new();
    for i in gpus[0]["instances"].as_array().unwrap() {
        *want.entry(format!("gpu:{}", i["profile"].as_str().unwrap())).or_default() += 1;
    }
    *want.entry("gpu:h100-80gb-hbm3".into()).or_default() += 1;
    let want: BTreeSet<String> = want.iter().map(|(k, n)| format!("{k}:{n}")).collect();
    assert_eq!(node_gres(slurm), want, "scontrol show node vs status {gpus:#}");
    let job = slurm.job_env("gpu:1g.10gb:1");
    let one_g: Vec<&str> = gpus[0]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["profile"] == "1g.10gb")
        .map(|i| i["uuid"].as_str().unwrap())
        .collect();
    assert!(one_g.contains(&job["CUDA_VISIBLE_DEVICES"].as_str()), "{job:?} vs {one_g:?}");
}
