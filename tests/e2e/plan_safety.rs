//! What a plan must refuse or undo, end to end (issue 10): sharing left behind by the
//! previous profile, MPS clients under a server that would stop, limits larger than the
//! device, selectors naming GPUs this node does not have.

use gpushare_proto::Strategy;
use gpushare_proto::types::PlanReport;
use gpushare_tests::{
    Agent, AgentOptions, SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV, Sleeper, binary, ctl_error,
    reason_lines, stderr, stdout, text,
};

/// The time-slice intervals the simulated nvidia-smi reads from the agent's simulated node
/// (`compute-policy -l`), one word per GPU (`Default`, …).
fn intervals(agent: &Agent) -> Vec<String> {
    let smi = agent.nvidia_smi(&["compute-policy", "-l"]);
    assert!(smi.status.success(), "{}", text(&smi));
    stdout(&smi)
        .lines()
        .filter(|l| l.contains("Timeslice"))
        .filter_map(|l| l.split_whitespace().nth(3).map(String::from))
        .collect()
}

#[test]
fn mps_after_time_slicing_returns_the_interval_to_default() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2"));
    let out = agent.ctl(&["apply", "all-time-sliced"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(intervals(&agent), ["Medium", "Medium"]);
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(intervals(&agent), ["Default", "Default"], "{}", agent.sim_record());
    for gpu in agent.status().gpus {
        assert_eq!(gpu.sharing.strategy, Strategy::Mps.as_str(), "{gpu:?}");
        assert_eq!(gpu.sharing.interval, None, "{gpu:?}");
    }
    let out = agent.ctl(&["assert", "all-mps"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!agent.ctl_doc::<PlanReport>(&["plan", "all-mps"]).changes);
    let out = agent.ctl(&["assert", "all-time-sliced"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // The interval set by hand under MPS is noticed and undone too.
    let smi = agent.nvidia_smi(&["compute-policy", "-i", "1", "--set-timeslice", "3"]);
    assert!(smi.status.success(), "{}", text(&smi));
    let out = agent.ctl(&["assert", "all-mps"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let plan: PlanReport = agent.ctl_doc(&["plan", "all-mps"]);
    let steps: Vec<&str> = plan.steps.iter().map(|s| s.description.as_str()).collect();
    assert_eq!(steps, ["GPU 1: set the time-slice interval to default"]);
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(intervals(&agent), ["Default", "Default"]);
}

/// Connects the simulated CUDA client `pid` to the MPS server of pipe directory `pipe`.
fn connect_client(pipe: &str, pid: u32) {
    let client = std::process::Command::new(binary(SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV))
        .args(["--fake-client", &pid.to_string()])
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
        .output()
        .unwrap();
    assert!(client.status.success(), "{}", text(&client));
}

/// Asserts an apply was refused because of MPS clients, naming them, with nothing changed.
fn assert_refused_for_clients(agent: &Agent, args: &[&str], pids: &str) {
    let servers = agent.mps_servers();
    let status = agent.status();
    let out = agent.ctl(args);
    assert!(!out.status.success(), "{args:?}: {}", text(&out));
    let err = stderr(&out);
    assert_eq!(reason_lines(&err), 1, "{err}");
    assert!(err.contains(&format!("MPS clients (PID {pids})")), "{args:?}: {err}");
    assert!(err.contains("--force"), "{err}");
    let mut json = args.to_vec();
    json.push("--json");
    assert_eq!(ctl_error(&agent.ctl(&json)).name, "io.gpushare.Agent1.Error.GpuBusy");
    assert_eq!(agent.mps_servers(), servers, "the servers must be untouched");
    assert_eq!(agent.status(), status, "the GPUs must be untouched");
    assert!(!agent.sim_record().contains("cmd=quit"), "{}", agent.sim_record());
}

#[test]
fn mps_servers_with_clients_are_not_stopped_unless_forced() {
    let fewer =
        "name = \"fewer\"\n[[gpu]]\nselect = \"all\"\nsharing = { mps = { replicas = 2 } }\n";
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2").profile("fewer.toml", fewer));
    assert!(agent.ctl(&["apply", "all-mps"]).status.success());
    let servers = agent.mps_servers();
    let (one, two) = (Sleeper::start(None, &[]), Sleeper::start(None, &[]));
    connect_client(&servers[1].pipe_directory, one.pid());
    connect_client(&servers[1].pipe_directory, two.pid());
    assert_eq!(agent.mps_servers()[1].clients, [one.pid(), two.pid()]);
    // Stopping the server, and restarting it with other limits, both end its clients.
    let pids = format!("{}, {}", one.pid().min(two.pid()), one.pid().max(two.pid()));
    assert_refused_for_clients(&agent, &["apply", "all-disabled"], &pids);
    assert_refused_for_clients(&agent, &["apply", "fewer"], &pids);
    assert_refused_for_clients(&agent, &["apply", "all-balanced"], &pids);
    // A plan that keeps the server is fine, and so is one forced.
    assert!(!agent.ctl_doc::<PlanReport>(&["plan", "all-mps"]).changes);
    let out = agent.ctl(&["apply", "all-disabled", "--force"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(agent.mps_servers().is_empty());
}

#[test]
fn mps_clients_of_a_mig_instance_keep_it_from_being_destroyed() {
    let layered = "name = \"layered\"\n[[gpu]]\nselect = \"all\"\n\
                   mig = { \"1g\" = 2, \"2g\" = 1, \"3g\" = 1 }\n\
                   instance_sharing.\"3g\".mps = { replicas = 2 }\n";
    let sevens = "name = \"sevens\"\n[[gpu]]\nselect = \"all\"\nmig = { \"1g\" = 7 }\n";
    let agent = Agent::start(
        AgentOptions::simulate("h100-80gb:1")
            .profile("layered.toml", layered)
            .profile("sevens.toml", sevens),
    );
    assert!(agent.ctl(&["apply", "layered"]).status.success());
    let server = agent.mps_servers()[0].clone();
    assert!(server.uuid.starts_with("MIG-"), "{server:?}");
    let client = Sleeper::start(None, &[]);
    connect_client(&server.pipe_directory, client.pid());
    // The 3g instance goes: with it, its server and the server's client.
    let pid = client.pid().to_string();
    assert_refused_for_clients(&agent, &["apply", "sevens"], &pid);
    assert_refused_for_clients(&agent, &["apply", "all-disabled"], &pid);
    let out = agent.ctl(&["apply", "sevens", "--force"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(agent.mps_servers().is_empty());
}

/// Asserts `args` fail with one line containing every one of `parts`, and change nothing.
fn assert_refused(agent: &Agent, args: &[&str], parts: &[&str]) {
    let before = agent.status();
    let out = agent.ctl(args);
    assert!(!out.status.success(), "{args:?}: {}", text(&out));
    let err = stderr(&out);
    assert_eq!(reason_lines(&err), 1, "{args:?}: {err}");
    for part in parts {
        assert!(err.contains(part), "{args:?}: {part:?} not in {err}");
    }
    assert_eq!(agent.status(), before, "{args:?} changed the GPUs");
}

#[test]
fn memory_limits_larger_than_the_device_are_refused() {
    let whole = "name = \"huge\"\n[[gpu]]\nselect = \"all\"\n\
                 sharing = { mps = { pinned_memory_limit = \"999TiB\" } }\n";
    let instance = "name = \"huge-1g\"\n[[gpu]]\nselect = \"all\"\nmig = { \"1g\" = 7 }\n\
                    instance_sharing.\"1g\".mps = { pinned_memory_limit = \"5GiB\" }\n";
    let agent = Agent::start(
        AgentOptions::simulate("a100-40gb:2")
            .profile("huge.toml", whole)
            .profile("huge-1g.toml", instance),
    );
    for verb in ["plan", "apply"] {
        assert_refused(
            &agent,
            &[verb, "huge"],
            &[
                "GPU 0 (A100-SXM4-40GB): mps pinned_memory_limit 999 TiB (rule at ",
                "huge.toml:2:1) exceeds the GPU's 40 GiB",
            ],
        );
        assert_refused(
            &agent,
            &[verb, "huge-1g"],
            &[
                "GPU 0 (A100-SXM4-40GB): mps pinned_memory_limit 5 GiB (rule at ",
                "huge-1g.toml:2:1) exceeds the 1g.5gb instance's 4.75 GiB",
            ],
        );
    }
    assert!(agent.mps_servers().is_empty());

    // The same bound for the limits of a running server.
    assert!(agent.ctl(&["apply", "all-mps"]).status.success());
    let pipe = agent.mps_servers()[0].pipe_directory.clone();
    let client = Sleeper::start(None, &[]);
    connect_client(&pipe, client.pid());
    let pid = client.pid().to_string();
    assert_refused(
        &agent,
        &["mps", "limit", "--pid", &pid, "--memory", "999TiB"],
        &["999 TiB", "40 GiB", "GPU 0 (A100-SXM4-40GB)"],
    );
    assert!(!agent.sim_record().contains("set_device_pinned_mem_limit"), "{}", agent.sim_record());
    let out = agent.ctl(&["mps", "limit", "--pid", &pid, "--memory", "40GiB"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(agent.sim_record().contains("0 40G"), "{}", agent.sim_record());
}

#[test]
fn selectors_naming_gpus_this_node_lacks_are_refused() {
    let agent = Agent::start(
        AgentOptions::simulate("a100-40gb:8")
            .profile(
                "nine.toml",
                "name = \"nine\"\n[[gpu]]\nselect = \"9\"\nmig = { \"7g\" = 1 }\n",
            )
            .profile("range.toml", "name = \"range\"\n[[gpu]]\nselect = \"6-9\"\n")
            .profile("list.toml", "name = \"list\"\n[[gpu]]\nselect = [0, 99]\n")
            .profile(
                "uuid.toml",
                "name = \"uuid\"\n[[gpu]]\nselect = \"GPU-00000000-0000-0000-0000-000000000000\"\n",
            )
            .profile(
                "h100.toml",
                "name = \"h100\"\n[[gpu]]\nselect = \"h100-80gb\"\nmig = { \"7g\" = 1 }\n",
            )
            .profile(
                "filtered.toml",
                "name = \"filtered\"\n[[gpu]]\nselect = \"all\"\ndevice_filter = \"0x233010DE\"\n",
            )
            .profile(
                "fleet.toml",
                "name = \"fleet\"\n[[gpu]]\nselect = \"h100-80gb\"\nmig = { \"7g\" = 1 }\n\
                 [[gpu]]\nselect = \"a100-40gb\"\nmig = { \"7g\" = 1 }\n",
            ),
    );
    let uuids: Vec<String> = agent.status().gpus.iter().map(|g| g.uuid.clone()).collect();
    for verb in ["plan", "apply", "assert"] {
        for (profile, parts) in [
            ("nine", vec!["nine.toml:2:1: select = \"9\": this node has GPUs 0-7"]),
            ("range", vec!["range.toml:2:1: select = \"6-9\": this node has GPUs 0-7"]),
            ("list", vec!["list.toml:2:1: select = \"0,99\": this node has GPUs 0-7"]),
            (
                "uuid",
                vec![
                    "uuid.toml:2:1: select = \"GPU-00000000-0000-0000-0000-000000000000\": no GPU of this node has that UUID",
                    &uuids[0],
                    &uuids[7],
                ],
            ),
            (
                "h100",
                vec![
                    "profile h100 selects no GPU of this node",
                    "A100-SXM4-40GB",
                    "h100.toml:2:1 (select = \"h100-80gb\")",
                ],
            ),
            (
                "filtered",
                vec![
                    "profile filtered selects no GPU of this node",
                    "0x20B010DE",
                    "filtered.toml:2:1 (select = \"all\", device_filter = [\"0x233010DE\"])",
                ],
            ),
        ] {
            let out = agent.ctl(&[verb, profile]);
            assert!(!out.status.success(), "{verb} {profile}: {}", text(&out));
            assert!(!stdout(&out).contains("already applied"), "{verb} {profile}: {}", text(&out));
            assert_refused(&agent, &[verb, profile], &parts);
        }
    }
    // One rule per model, for a fleet: the rule for other models matches nothing here.
    let out = agent.ctl(&["apply", "fleet"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(agent.status().gpus.iter().all(|g| g.mig_enabled));
}

#[test]
fn mig_parted_entries_naming_gpus_this_node_lacks_are_refused() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:8"));
    let yaml = "version: v1\nmig-configs:\n  wide:\n    - devices: [0, 99]\n      mig-enabled: false\n\
                \x20 other-model:\n    - device-filter: [\"0x233010DE\"]\n      devices: all\n      mig-enabled: false\n";
    let (_dir, file) = gpushare_tests::temp_file("fleet.yaml", yaml);
    let file = file.to_str().unwrap();
    assert_refused(
        &agent,
        &["apply", "-f", file, "-c", "wide"],
        &["fleet.yaml:4:7: devices: [0, 99]: this node has GPUs 0-7"],
    );
    assert_refused(
        &agent,
        &["plan", "-f", file, "-c", "other-model"],
        &[
            "profile other-model selects no GPU of this node",
            "devices: all, device-filter: [0x233010DE]",
        ],
    );
    // NVIDIA's own file, with its entries per model, still plans here.
    let nvidia = gpushare_tests::repo_root().join("tests/data/mig-parted-config-default.yaml");
    let out = agent.ctl(&["plan", "-f", nvidia.to_str().unwrap(), "-c", "all-balanced"]);
    assert!(out.status.success(), "{}", text(&out));
}

/// Hopper's 1g.20gb GPU instance offers two one-slice compute-instance profiles: 1_SLICE
/// (16 SMs) and 1_SLICE_REV1 (all 26). The agent must create the one that spans the GPU
/// instance, as the simulated driver records it (issue 11, item 2).
#[test]
fn a_hopper_1g_20gb_instance_gets_all_its_sms() {
    let profile = "name = \"wide-1g\"\n[[gpu]]\nselect = \"all\"\nmig = { \"1g.20gb\" = 2 }\n";
    let agent =
        Agent::start(AgentOptions::simulate("h100-80gb:1").profile("wide-1g.toml", profile));
    let out = agent.ctl(&["apply", "wide-1g"]);
    assert!(out.status.success(), "{}", gpushare_tests::text(&out));
    let node: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(agent.dir.path().join("state/simulated-gpus.json")).unwrap(),
    )
    .unwrap();
    let cis: Vec<u64> = node["gpus"][0]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|gi| gi["compute_instances"].as_array().unwrap().clone())
        .map(|ci| ci["profile_id"].as_u64().unwrap())
        .collect();
    // NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1 = 7 (nvml.h); 1_SLICE would be 0.
    assert_eq!(cis, vec![7, 7], "{node:#}");
}
