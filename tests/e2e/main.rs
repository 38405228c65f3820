//! End-to-end: the real `gpushare-agent` on simulated GPUs behind a real `dbus-daemon`,
//! driven by the real `gpushare-ctl`.

use std::time::Duration;

mod access;
mod agent_state;
mod bench;
mod bench_isolation;
mod bench_locking;
mod bench_partial;
mod bench_trust;
mod cdi;
mod cdi_harness;
mod cli_output;
mod client_churn;
mod client_metrics;
mod clients;
mod clients_watch;
mod compute_instances;
mod device_nodes;
mod export;
mod first_errors;
mod first_hour;
mod health;
mod hostile_bench;
mod hostile_flood;
mod hostile_host;
mod hostile_load;
mod hostile_mps;
mod hostile_paths;
mod hostile_views;
mod journal;
mod kubernetes;
mod kubernetes_harness;
mod metrics;
mod mig_models;
mod mig_profiles;
mod mixed_compute;
mod mps_limits;
mod nvidia_clients;
mod plan_safety;
mod profile_input;
mod reset_blockers;
mod sandbox;
mod sharing;
mod slurm;
mod slurm_apply;
mod slurm_clients;
mod slurm_views;
mod start_up;
mod suite_accounts;
mod telemetry;
mod top_mig;
mod transactions;
mod wire;

use gpushare_proto::Strategy;

/// The name `GPUSHARE_SIM_FAIL` takes to fail a plan operation where the simulated driver
/// answers (the NVML function the step calls, or the simulated nvidia-smi's reset), and
/// the driver's answer the agent then reports.
pub(crate) fn injected_at_the_c_abi(operation: &str) -> (&'static str, &'static str) {
    match operation {
        "create_gpu_instance" => (
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            "nvmlDeviceCreateGpuInstanceWithPlacement returned NVML_ERROR_INSUFFICIENT_RESOURCES",
        ),
        "create_compute_instance" => (
            "nvmlGpuInstanceCreateComputeInstance",
            "nvmlGpuInstanceCreateComputeInstance returned NVML_ERROR_INSUFFICIENT_RESOURCES",
        ),
        "destroy_compute_instance" => {
            ("nvmlComputeInstanceDestroy", "nvmlComputeInstanceDestroy returned NVML_ERROR_IN_USE")
        }
        "destroy_gpu_instance" => {
            ("nvmlGpuInstanceDestroy", "nvmlGpuInstanceDestroy returned NVML_ERROR_IN_USE")
        }
        "set_mig_mode" => {
            ("nvmlDeviceSetMigMode", "nvmlDeviceSetMigMode returned NVML_ERROR_IN_USE")
        }
        "set_compute_mode" => (
            "nvmlDeviceSetComputeMode",
            "nvmlDeviceSetComputeMode returned NVML_ERROR_NO_PERMISSION",
        ),
        "reset_gpu" => ("gpu-reset", "In use by another client"),
        other => panic!("no simulated driver call for operation {other}"),
    }
}
use gpushare_proto::types::{JobOutcome, PlanReport, ProfileDetail, ProfileList, Validation};
use gpushare_tests::{
    Agent, AgentOptions, BALANCED_A100, BALANCED_H100, ctl_error, instance_profiles, layout,
    reason_lines, stderr, stdout, temp_file, text, wait_for,
};

#[test]
fn half_balanced_on_a_dgx_a100() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:8"));
    let out = agent.ctl(&["apply", "half-balanced"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(stdout(&out).contains("half-balanced"), "{}", text(&out));

    let status = agent.status();
    assert_eq!(status.active_profile.as_deref(), Some("half-balanced"));
    assert_eq!(status.gpus.len(), 8);
    for i in 0..4 {
        let gpu = &status.gpus[i];
        assert_eq!(gpu.index as usize, i);
        assert_eq!(gpu.model, "A100-SXM4-40GB");
        assert!(gpu.mig_enabled);
        assert_eq!(gpu.compute_mode, "default");
        assert_eq!(gpu.sharing.strategy, Strategy::Exclusive.as_str());
        assert!(gpu.uuid.starts_with("GPU-"));
        assert_eq!(instance_profiles(&status, i), BALANCED_A100);
        for inst in &gpu.instances {
            assert!(inst.uuid.as_deref().expect("instance uuid").starts_with("MIG-"));
            // placement_start is an unsigned number: InstanceStatus reads it as one.
            assert_eq!(inst.sharing.strategy, Strategy::Exclusive.as_str());
        }
    }
    for i in 4..8 {
        assert!(!status.gpus[i].mig_enabled);
        assert!(instance_profiles(&status, i).is_empty());
    }

    // The human status names every GPU and instance.
    let human = agent.ctl(&["status"]);
    assert!(human.status.success());
    let human = stdout(&human);
    assert!(human.contains("half-balanced") && human.contains("3g.20gb"), "{human}");
}

#[test]
fn half_balanced_on_two_h100s() {
    let agent = Agent::start(AgentOptions::simulate("h100-80gb:2"));
    let outcome: JobOutcome = agent.ctl_doc(&["apply", "half-balanced"]);
    assert!(outcome.ok, "{outcome:?}");
    let status = agent.status();
    assert_eq!(instance_profiles(&status, 0), BALANCED_H100);
    assert!(!status.gpus[1].mig_enabled);
    assert!(instance_profiles(&status, 1).is_empty());
}

#[test]
fn applying_the_applied_profile_changes_nothing_and_says_so() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:8"));
    assert!(agent.ctl_doc::<JobOutcome>(&["apply", "half-balanced"]).changed);
    let before = agent.status();
    let outcome: JobOutcome = agent.ctl_doc(&["apply", "half-balanced"]);
    assert!(outcome.ok, "{outcome:?}");
    assert!(!outcome.changed, "{outcome:?}");
    assert_eq!(outcome.steps_total, 0);
    let out = agent.ctl(&["apply", "half-balanced"]);
    assert!(out.status.success());
    assert!(stdout(&out).contains("already applied"), "{}", text(&out));
    // Same instances, same UUIDs: nothing was recreated.
    assert_eq!(agent.status(), before);
}

#[test]
fn plan_prints_the_steps_and_changes_nothing() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:8"));
    let before = agent.status();
    let out = agent.ctl(&["plan", "half-balanced"]);
    assert!(out.status.success(), "{}", text(&out));
    let printed = stdout(&out);
    assert!(printed.contains("GPU 0: enable MIG mode"), "{printed}");
    assert!(printed.contains("GPU 3: create 3g.20gb at slot 4"), "{printed}");
    let report: PlanReport = agent.ctl_doc(&["plan", "half-balanced"]);
    assert!(report.changes, "{report:?}");
    // Per MIG GPU: enable, reset (A100s keep the mode pending), four instances × 2 calls.
    assert_eq!(report.steps.len(), 40);
    let dry: PlanReport = agent.ctl_doc(&["apply", "--dry-run", "half-balanced"]);
    assert_eq!(dry, report);
    assert_eq!(agent.status(), before);
}

#[test]
fn bad_profiles_fail_with_one_line_naming_the_place_and_change_nothing() {
    let infeasible = "name = \"too-big\"\n[[gpu]]\nselect = 2\nmig = { \"3g\" = 3 }\n";
    let malformed = "name = \"broken\"\n[[gpu]]\nselect = \"all\"\nmig = { \"1g\" = \"two\" }\n";
    let agent =
        Agent::start(AgentOptions::simulate("a100-40gb:8").profile("too-big.toml", infeasible));
    assert!(agent.ctl(&["apply", "all-balanced"]).status.success());
    let before = agent.status();

    let out = agent.ctl(&["apply", "too-big"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("GPU 2 (A100-SXM4-40GB): 3g.20gb ×3"), "{err}");

    let (_dir, file) = temp_file("broken.toml", malformed);
    let out = agent.ctl(&["validate", file.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(&format!("{}:4:7: mig: the count of 1g", file.display())), "{err}");

    let json = agent.ctl(&["validate", file.to_str().unwrap(), "--json"]);
    assert!(!json.status.success());
    let error = ctl_error(&json);
    assert!(error.message.contains(":4:7:"), "{error:?}");

    let out = agent.ctl(&["apply", "no-such-profile"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("known profiles: all-balanced, all-disabled"), "{err}");
    assert!(err.contains("too-big"), "{err}");

    assert_eq!(agent.status(), before, "the GPUs must be unchanged");
}

#[test]
fn validate_accepts_a_good_file_and_plans_it_here() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2"));
    let (_dir, file) = temp_file("sevens.toml", "[[gpu]]\nselect = \"0\"\nmig = { \"1g\" = 7 }\n");
    let doc: Validation = agent.ctl_doc(&["validate", file.to_str().unwrap()]);
    assert_eq!(doc.name, "sevens");
    assert!(doc.plan.changes, "{doc:?}");
    assert!(!agent.status().gpus[0].mig_enabled);
}

#[test]
fn profiles_list_and_show() {
    let agent = Agent::start(
        AgentOptions::simulate("a30:2")
            .profile("mine.toml", "description = \"a test\"\n[[gpu]]\nselect = \"all\"\n")
            .profile("bad.toml", "[[gpu]]\nselect = \n"),
    );
    let list: ProfileList = agent.ctl_doc(&["profiles", "list"]);
    let names: Vec<&str> = list.profiles.iter().map(|p| p.name.as_str()).collect();
    assert!(names.contains(&"half-balanced") && names.contains(&"mine"), "{names:?}");
    assert!(list.errors[0].contains("bad.toml:2:"), "{list:?}");
    let show: ProfileDetail = agent.ctl_doc(&["profiles", "show", "half-balanced"]);
    assert_eq!(show.summary.source, "built-in");
    assert!(show.text.contains("first-half"));
    let out = agent.ctl(&["profiles"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(stdout(&out).contains("mine"), "{}", text(&out));
}

#[test]
fn the_agent_survives_a_ctl_that_disconnects_mid_apply() {
    let mut agent =
        Agent::start(AgentOptions::simulate("a100-40gb:8").env("GPUSHARE_SIM_DELAY_MS", "15"));
    let mut ctl = agent.ctl_command(&["apply", "half-balanced"]).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(150));
    ctl.kill().unwrap();
    ctl.wait().unwrap();
    // The job goes on without its client and finishes.
    wait_for(Duration::from_secs(30), Duration::from_millis(50), || {
        let status = agent.status();
        if status.active_profile.as_deref() == Some("half-balanced") {
            assert_eq!(instance_profiles(&status, 3), BALANCED_A100);
            return Ok(());
        }
        Err(format!("the apply never finished: {status:?}"))
    });
    assert!(agent.is_running());
}

#[test]
fn a_second_apply_while_one_runs_is_refused() {
    let agent =
        Agent::start(AgentOptions::simulate("a100-40gb:8").env("GPUSHARE_SIM_DELAY_MS", "10"));
    let first = agent.ctl_command(&["apply", "half-balanced", "--json"]).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let second = agent.ctl(&["apply", "all-disabled"]);
    assert!(!second.status.success(), "{}", text(&second));
    assert!(stderr(&second).contains("another apply is running"), "{}", text(&second));
    let first = first.wait_with_output().unwrap();
    assert!(first.status.success(), "{}", text(&first));
    let status = agent.status();
    assert_eq!(status.active_profile.as_deref(), Some("half-balanced"));
    for i in 0..4 {
        assert_eq!(instance_profiles(&status, i), BALANCED_A100);
    }
}

#[test]
fn state_survives_an_agent_restart() {
    let mut agent = Agent::start(AgentOptions::simulate("h100-80gb:2"));
    assert!(agent.ctl(&["apply", "all-balanced"]).status.success());
    let before = agent.status();
    agent.restart();
    let after = agent.status();
    assert_eq!(after.active_profile.as_deref(), Some("all-balanced"));
    assert_eq!(layout(&after), layout(&before));
}

#[test]
fn an_injected_driver_failure_is_reported_with_the_step() {
    let agent = Agent::start(
        AgentOptions::simulate("a100-40gb:8")
            .env("GPUSHARE_SIM_FAIL", "nvmlDeviceCreateGpuInstanceWithPlacement:3"),
    );
    let out = agent.ctl(&["apply", "half-balanced"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("create_gpu_instance on GPU")
            && err.contains("Insufficient Resources (profile ")
            && err.contains(
                "nvmlDeviceCreateGpuInstanceWithPlacement returned NVML_ERROR_INSUFFICIENT_RESOURCES"
            )
            && err.contains("rolled back: GPU 0, 1, 2, 3 as before"),
        "{err}"
    );
    assert_eq!(reason_lines(&err), 1, "{err}");
    let status = agent.status();
    assert_eq!(status.active_profile, None);
    assert!(status.gpus.iter().all(|g| !g.mig_enabled));
}

#[test]
fn json_errors_are_one_object() {
    let agent = Agent::start(AgentOptions::simulate("l40s:1"));
    let out = agent.ctl(&["apply", "all-balanced", "--json"]);
    assert!(!out.status.success());
    let error = ctl_error(&out);
    assert_eq!(error.name, "io.gpushare.Agent1.Error.Infeasible");
    assert!(error.message.contains("GPU 0 (L40S): has no MIG"));
    // MPS on a GPU without MIG: a first-class citizen.
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn ctl_without_an_agent_says_so_in_one_line() {
    let bus = gpushare_tests::Bus::start();
    let out =
        std::process::Command::new(gpushare_tests::binary("gpushare-ctl", "GPUSHARE_CTL_BIN"))
            .args(["status"])
            .env("GPUSHARE_BUS_ADDRESS", bus.address())
            .output()
            .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("not running"), "{err}");
}

#[test]
fn a_malformed_configuration_keeps_the_agent_up_but_hands_off() {
    let agent = Agent::start(AgentOptions {
        config: Some("[gpu]\nmanage_mig = maybe\n".into()),
        ..AgentOptions::simulate("a100-40gb:2").profile("broken.toml", "[[gpu]\nselect = 0\n")
    });
    // It serves status and the built-in profiles...
    let status = agent.status();
    assert_eq!(status.gpus.len(), 2);
    let list: ProfileList = agent.ctl_doc(&["profiles"]);
    assert!(list.errors[0].contains("broken.toml:1:"), "{list:?}");
    // ...but changes nothing on the GPUs: it never acts on half-read configuration.
    let out = agent.ctl(&["apply", "all-balanced"]);
    assert!(!out.status.success());
    // The refusal names the file's error, not a setting the file never made.
    let err = stderr(&out);
    assert!(err.contains("changes nothing on the GPUs") && err.contains("agent.toml:2:"), "{err}");
    // The same profile error, from validate.
    let file = agent.dir.path().join("profiles.d/broken.toml");
    let out = agent.ctl(&["validate", file.to_str().unwrap()]);
    assert!(stderr(&out).contains("broken.toml:1:"), "{}", text(&out));
}

#[test]
fn the_probe_refuses_simulated_gpus_with_one_line() {
    let agent = Agent::start(AgentOptions::simulate("h100-80gb:1"));
    let out = agent.ctl(&["probe", "--workload", "launch", "--clients", "1,4", "--seconds", "1"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    assert_eq!(reason_lines(&err), 1, "{err}");
    assert!(err.contains("the probe measures real GPUs with CUDA"), "{err}");
    let out = agent.ctl(&["probe", "--json"]);
    let error = ctl_error(&out);
    assert!(error.message.contains("simulates"), "{error:?}");
}
