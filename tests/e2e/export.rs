//! `export` writes the whole profile (issue 37, item 2): on every built-in profile, the
//! README's `inference-split` and mixed layouts (MIG with compute instances, MPS inside
//! instances, time-slicing on some GPUs, compute modes), the export plans to nothing,
//! `assert -f` passes, and applying it to a node made plain brings back the same GPUs;
//! what a profile cannot say is in the export and on stderr, and `--format mig-parted`
//! says what it leaves out.

use gpushare_proto::types::{Export, GpuStatus, PlanReport, ProfileList, Sharing, Status};
use std::path::Path;

use gpushare_tests::{
    Agent, AgentOptions, SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV, Sleeper, binary, repo_root, stderr,
    stdout, temp_file, text,
};

/// Every GPU as `status` shows it, but for what changes when instances are made anew
/// (ids, UUIDs, pids): MIG layout by place, compute instances, sharing with live limits,
/// compute mode.
fn described(status: &Status) -> Vec<String> {
    fn sharing(s: &Sharing) -> String {
        let mps = s.mps.as_ref().map(|m| {
            format!(
                " {}%/{:?} multi_user={:?}",
                m.active_thread_percentage, m.pinned_memory_limit_bytes, m.multi_user
            )
        });
        format!("{}{}{}", s.strategy, s.interval.as_deref().unwrap_or(""), mps.unwrap_or_default())
    }
    let gpu = |g: &GpuStatus| {
        let instances: Vec<String> = g
            .instances
            .iter()
            .map(|i| {
                let cis: Vec<String> = i
                    .compute_instances
                    .iter()
                    .map(|c| format!("{}c {}", c.compute_slices, sharing(&c.sharing)))
                    .collect();
                format!("{}@{} [{}]", i.profile, i.placement_start, cis.join(", "))
            })
            .collect();
        format!(
            "GPU {}: mig={} mode={} {} {}",
            g.index,
            g.mig_enabled,
            g.compute_mode,
            sharing(&g.sharing),
            instances.join("; ")
        )
    };
    status.gpus.iter().map(gpu).collect()
}

/// Exports the node, checks that the export says nothing it could not write, plans to
/// nothing and passes `assert -f`; then makes the node plain, applies the export and
/// checks that the GPUs are back as they were. `what` names the case in failures.
fn round_trip(agent: &Agent, what: &str) {
    let before = described(&agent.status());
    let doc: Export = agent.ctl_doc(&["export"]);
    assert!(doc.notes.is_empty(), "{what}: {:?}\n{}", doc.notes, doc.text);
    let out = agent.ctl(&["export"]);
    assert!(out.status.success(), "{what}: {}", text(&out));
    assert_eq!(stderr(&out), "", "{what}: nothing to warn of");
    let exported = stdout(&out);
    assert_eq!(exported.trim_end(), doc.text.trim_end());
    let (_dir, file) = temp_file("exported.toml", &exported);
    let file = file.to_str().unwrap();
    let plan: PlanReport = agent.ctl_doc(&["plan", "-f", file]);
    assert!(!plan.changes && plan.steps.is_empty(), "{what}: {plan:?}\n{exported}");
    let out = agent.ctl(&["assert", "-f", file]);
    assert!(out.status.success(), "{what}: {}\n{exported}", text(&out));

    // A backup: the GPUs come back from it.
    let out = agent.ctl(&["apply", "all-disabled"]);
    assert!(out.status.success(), "{what}: {}", text(&out));
    let out = agent.ctl(&["apply", "-f", file]);
    assert!(out.status.success(), "{what}: {}", text(&out));
    assert_eq!(described(&agent.status()), before, "{what}\n{exported}");
    let again: PlanReport = agent.ctl_doc(&["plan", "-f", file]);
    assert!(!again.changes, "{what}: {again:?}");
}

/// Applies `profile` (a name, or `-f FILE`), expecting success.
fn apply(agent: &Agent, profile: &[&str]) {
    let mut args = vec!["apply"];
    args.extend(profile);
    let out = agent.ctl(&args);
    assert!(out.status.success(), "{profile:?}: {}", text(&out));
}

#[test]
fn every_built_in_profile_exports_to_itself_on_an_a100_and_an_h100_node() {
    for spec in ["a100-40gb:8", "h100-80gb:4"] {
        let agent = Agent::start(AgentOptions::simulate(spec));
        let list: ProfileList = agent.ctl_doc(&["profiles"]);
        let built_in: Vec<&str> = list
            .profiles
            .iter()
            .filter(|p| p.source == "built-in")
            .map(|p| p.name.as_str())
            .collect();
        assert!(built_in.len() >= 5 && built_in.contains(&"all-mps"), "{built_in:?}");
        for name in built_in {
            apply(&agent, &[name]);
            round_trip(&agent, &format!("{spec} {name}"));
        }
    }
}

/// The README's `inference-split`, as the README writes it.
fn readme_inference_split() -> String {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let at = readme.find("name = \"inference-split\"").expect("the README's inference-split");
    let end = readme[at..].find("```").expect("its block ends");
    readme[at..at + end].to_string()
}

#[test]
fn the_readmes_inference_split_exports_to_itself() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:8"));
    let (_dir, file) = temp_file("inference-split.toml", readme_inference_split());
    apply(&agent, &["-f", file.to_str().unwrap()]);
    let servers = agent.mps_servers();
    assert_eq!(servers.len(), 1, "MPS on the 3g of GPU 2: {servers:?}");
    let doc: Export = agent.ctl_doc(&["export"]);
    assert!(doc.text.contains("instance_sharing.\"3g.20gb\" = { mps = {"), "{}", doc.text);
    round_trip(&agent, "inference-split");
}

#[test]
fn mixed_layouts_export_to_themselves() {
    let agent = Agent::start(AgentOptions::simulate("h100-80gb:4"));
    // GPU 0: MIG with compute instances, MPS on each 1c and (multi-user, explicit
    // limits) on the 2g; GPU 1: time-sliced; GPU 2: MPS whole (exclusive_process);
    // GPU 3: MIG, every instance with MPS.
    let mixed = r#"name = "mixed"
[[gpu]]
select = 0
mig = { "1c.3g" = 3, "2g" = 1, "1g" = 2 }
instance_sharing."1c.3g" = { mps = { replicas = 2 } }
instance_sharing."2g" = { mps = { active_thread_percentage = 40, pinned_memory_limit = "4GiB", multi_user = true } }
[[gpu]]
select = 1
sharing.time-slicing = { interval = "long", replicas = 3 }
[[gpu]]
select = 2
sharing.mps = { replicas = 3 }
[[gpu]]
select = 3
mig = { "3g" = 2 }
sharing = "mps"
"#;
    let (_dir, file) = temp_file("mixed.toml", mixed);
    apply(&agent, &["-f", file.to_str().unwrap()]);
    assert_eq!(agent.mps_servers().len(), 3 + 1 + 1 + 2);
    round_trip(&agent, "mixed");
    // And the export of a GPU with an export applied: the same text.
    let first: Export = agent.ctl_doc(&["export"]);
    round_trip(&agent, "mixed, again");
    let second: Export = agent.ctl_doc(&["export"]);
    assert_eq!(first.text, second.text);
}

#[test]
fn what_a_profile_cannot_say_is_in_the_export_and_on_stderr() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2"));
    apply(&agent, &["all-time-sliced"]);
    // GPU 1 put in compute mode PROHIBITED by another NVML client: no profile gives that.
    let out = agent.nvml_client(
        "dev = ctypes.c_void_p()\n\
         assert nvml.nvmlDeviceGetHandleByIndex_v2(1, ctypes.byref(dev)) == 0\n\
         assert nvml.nvmlDeviceSetComputeMode(dev, 2) == 0\n",
    );
    assert!(out.status.success(), "{}", text(&out));
    let doc: Export = agent.ctl_doc(&["export"]);
    assert_eq!(doc.notes.len(), 2, "the cause, and the step applying takes: {:?}", doc.notes);
    assert!(doc.notes.iter().all(|n| n.contains("GPU 1")), "{:?}", doc.notes);
    let out = agent.ctl(&["export"]);
    assert!(out.status.success(), "{}", text(&out));
    let exported = stdout(&out);
    let comments: Vec<&str> = exported.lines().take_while(|l| l.starts_with('#')).collect();
    assert_eq!(comments.len(), 3, "a heading and a line per note:\n{exported}");
    let warned: Vec<String> = stderr(&out).lines().map(str::to_string).collect();
    assert_eq!(warned.len(), 2, "a line per note: {warned:?}");
    assert!(warned.iter().all(|w| w.contains("GPU 1")), "{warned:?}");
    // The rest is written: applying the export resets GPU 1's mode, and nothing else.
    let (_dir, file) = temp_file("exported.toml", &exported);
    let plan: PlanReport = agent.ctl_doc(&["plan", "-f", file.to_str().unwrap()]);
    assert_eq!(plan.steps.len(), 1, "{plan:?}");
    assert_eq!((plan.steps[0].gpu, plan.steps[0].operation.as_str()), (1, "set_compute_mode"));
}

#[test]
fn a_mig_parted_export_says_what_it_leaves_out() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2"));
    apply(&agent, &["all-mps"]);
    let doc: Export = agent.ctl_doc(&["export"]);
    assert_eq!(doc.mig_parted_left_out.len(), 1, "{:?}", doc.mig_parted_left_out);
    let line = &doc.mig_parted_left_out[0];
    assert!(line.starts_with("GPUs 0-1: MPS") && line.contains("exclusive_process"), "{line}");
    let out = agent.ctl(&["export", "--format", "mig-parted"]);
    assert!(out.status.success(), "{}", text(&out));
    let yaml = stdout(&out);
    assert!(yaml.contains(&format!("#   {line}\n")), "listed at the top:\n{yaml}");
    let warned = stderr(&out);
    assert_eq!(warned.lines().count(), 1, "{warned}");
    assert!(warned.contains(line.as_str()), "{warned}");
    // Still mig-parted's file: it plans, and applying it stops the servers it leaves out.
    let (_dir, file) = temp_file("node.yaml", &yaml);
    let plan: PlanReport = agent.ctl_doc(&["plan", "-f", file.to_str().unwrap()]);
    assert!(plan.steps.iter().any(|s| s.operation == "stop_mps"), "{plan:?}");

    // Nothing left out, nothing said.
    apply(&agent, &["half-balanced"]);
    let out = agent.ctl(&["export", "--format", "mig-parted"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(stderr(&out), "");
    assert!(!stdout(&out).contains("MIG only"), "{}", stdout(&out));
}

/// Live limits: a server process's limits set by `mps limit` are no drift, so the export
/// writes the profile's limits, says the override is there and applying keeps it; the
/// daemon's defaults changed by root behind the agent's back are drift, noted, and
/// applying the export puts the profile's back.
#[test]
fn live_limits_are_written_as_the_profile_set_them_and_the_rest_is_noted() {
    let dir = tempfile::tempdir().unwrap();
    // No health check during the test: it would put the drift back itself.
    let config = format!(
        "[mps]\ncontrol = {:?}\nroot = {:?}\nhealth_interval_seconds = 3600\n",
        binary(SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV),
        dir.path().join("mps")
    );
    let agent = Agent::start(AgentOptions::simulate("h100-80gb:2").config(&config));
    apply(&agent, &["all-mps"]);
    let servers = agent.mps_servers();
    let pipe = |gpu: u32| servers.iter().find(|s| s.gpu == gpu).unwrap().pipe_directory.clone();
    assert!(Path::new(&pipe(1)).is_dir());

    // GPU 1: a client, and its server process's threads set to 50 % by mps limit.
    let client = Sleeper::start(None, &[]);
    let pid = client.pid().to_string();
    let out = agent.mps_control(None, Path::new(&pipe(1)), &["--fake-client", &pid], "");
    assert!(out.status.success(), "{}", text(&out));
    let out = agent.ctl(&["mps", "limit", "--pid", &pid, "--threads", "50"]);
    assert!(out.status.success(), "{}", text(&out));
    let doc: Export = agent.ctl_doc(&["export"]);
    assert_eq!(doc.notes.len(), 1, "{:?}", doc.notes);
    assert!(doc.notes[0].starts_with("GPU 1 ") && doc.notes[0].contains("50%"), "{:?}", doc.notes);
    assert!(doc.text.contains("select = \"0-1\"\nmig = \"disabled\"\nsharing = { mps = { active_thread_percentage = 25,"), "{}", doc.text);
    let (_dir, file) = temp_file("exported.toml", &doc.text);
    let file = file.to_str().unwrap();
    let plan: PlanReport = agent.ctl_doc(&["plan", "-f", file]);
    assert!(!plan.changes, "the override stays: {plan:?}");

    // GPU 0: the daemon's default threads set to 90 % by root, behind the agent's back.
    agent.mps_ask(Path::new(&pipe(0)), "set_default_active_thread_percentage 90");
    let doc: Export = agent.ctl_doc(&["export"]);
    assert_eq!(doc.notes.len(), 3, "the drift, the override, the step: {:?}", doc.notes);
    assert!(doc.notes[0].starts_with("GPU 0 ") && doc.notes[0].contains("90%"), "{:?}", doc.notes);
    assert!(doc.notes[1].starts_with("GPU 1 "), "{:?}", doc.notes);
    assert!(doc.notes[2].contains("GPU 0") && !doc.notes[2].contains("GPU 1"), "{:?}", doc.notes);
    let (_dir, file) = temp_file("exported.toml", &doc.text);
    let plan: PlanReport = agent.ctl_doc(&["plan", "-f", file.to_str().unwrap()]);
    assert_eq!(plan.steps.len(), 1, "{plan:?}");
    assert_eq!(plan.steps[0].gpu, 0, "{plan:?}");
    apply(&agent, &["-f", file.to_str().unwrap()]);
    let limits = |gpu: u32| {
        let s = agent.mps_servers().into_iter().find(|s| s.gpu == gpu).unwrap();
        (s.active_thread_percentage, s.limits_source)
    };
    assert_eq!(limits(0), (25, Some("profile".to_string())));
    assert_eq!(limits(1), (50, Some("mps-limit".to_string())));
    client.end();
}
