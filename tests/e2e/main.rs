//! End-to-end: the real `gpushare-agent` on simulated GPUs behind a real `dbus-daemon`,
//! driven by the real `gpushare-ctl`.

use std::time::{Duration, Instant};

mod access;
mod metrics;
mod sharing;
mod transactions;

use gpushare_tests::{Agent, AgentOptions, instance_profiles, layout, text};

const BALANCED_A100: [&str; 4] = ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"];
const BALANCED_H100: [&str; 4] = ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"];

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn half_balanced_on_a_dgx_a100() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:8"));
    let out = agent.ctl(&["apply", "half-balanced"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(stdout(&out).contains("half-balanced"), "{}", text(&out));

    let status = agent.status();
    assert_eq!(status["active_profile"], "half-balanced");
    assert_eq!(status["gpus"].as_array().unwrap().len(), 8);
    for i in 0..4 {
        let gpu = &status["gpus"][i];
        assert_eq!(gpu["index"], i);
        assert_eq!(gpu["model"], "A100-SXM4-40GB");
        assert_eq!(gpu["mig_enabled"], true);
        assert_eq!(gpu["compute_mode"], "default");
        assert_eq!(gpu["sharing"]["strategy"], "exclusive");
        assert!(gpu["uuid"].as_str().unwrap().starts_with("GPU-"));
        assert_eq!(instance_profiles(&status, i), BALANCED_A100);
        for inst in gpu["instances"].as_array().unwrap() {
            assert!(inst["uuid"].as_str().unwrap().starts_with("MIG-"));
            assert!(inst["placement_start"].is_u64());
            assert_eq!(inst["sharing"]["strategy"], "exclusive");
        }
    }
    for i in 4..8 {
        assert_eq!(status["gpus"][i]["mig_enabled"], false);
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
    let outcome = agent.ctl_json(&["apply", "half-balanced"]);
    assert_eq!(outcome["ok"], true);
    let status = agent.status();
    assert_eq!(instance_profiles(&status, 0), BALANCED_H100);
    assert_eq!(status["gpus"][1]["mig_enabled"], false);
    assert!(instance_profiles(&status, 1).is_empty());
}

#[test]
fn applying_the_applied_profile_changes_nothing_and_says_so() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:8"));
    assert_eq!(agent.ctl_json(&["apply", "half-balanced"])["changed"], true);
    let before = agent.status();
    let outcome = agent.ctl_json(&["apply", "half-balanced"]);
    assert_eq!(outcome["ok"], true);
    assert_eq!(outcome["changed"], false);
    assert_eq!(outcome["steps_total"], 0);
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
    let report = agent.ctl_json(&["plan", "half-balanced"]);
    assert_eq!(report["changes"], true);
    // Per MIG GPU: enable, reset (A100s keep the mode pending), four instances × 2 calls.
    assert_eq!(report["steps"].as_array().unwrap().len(), 40);
    let dry = agent.ctl_json(&["apply", "--dry-run", "half-balanced"]);
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

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broken.toml");
    std::fs::write(&file, malformed).unwrap();
    let out = agent.ctl(&["validate", file.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(&format!("{}:4:7: mig: the count of 1g", file.display())), "{err}");

    let json = agent.ctl(&["validate", file.to_str().unwrap(), "--json"]);
    assert!(!json.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(doc["error"]["message"].as_str().unwrap().contains(":4:7:"), "{doc}");

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
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sevens.toml");
    std::fs::write(&file, "[[gpu]]\nselect = \"0\"\nmig = { \"1g\" = 7 }\n").unwrap();
    let doc = agent.ctl_json(&["validate", file.to_str().unwrap()]);
    assert_eq!(doc["name"], "sevens");
    assert_eq!(doc["plan"]["changes"], true);
    assert_eq!(agent.status()["gpus"][0]["mig_enabled"], false);
}

#[test]
fn profiles_list_and_show() {
    let agent = Agent::start(
        AgentOptions::simulate("a30:2")
            .profile("mine.toml", "description = \"a test\"\n[[gpu]]\nselect = \"all\"\n")
            .profile("bad.toml", "[[gpu]]\nselect = \n"),
    );
    let list = agent.ctl_json(&["profiles", "list"]);
    let names: Vec<&str> =
        list["profiles"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"half-balanced") && names.contains(&"mine"), "{names:?}");
    assert!(list["errors"][0].as_str().unwrap().contains("bad.toml:2:"), "{list}");
    let show = agent.ctl_json(&["profiles", "show", "half-balanced"]);
    assert_eq!(show["source"], "built-in");
    assert!(show["text"].as_str().unwrap().contains("first-half"));
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
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = agent.status();
        if status["active_profile"] == "half-balanced" {
            assert_eq!(instance_profiles(&status, 3), BALANCED_A100);
            break;
        }
        assert!(Instant::now() < deadline, "the apply never finished: {status}");
        std::thread::sleep(Duration::from_millis(50));
    }
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
    assert_eq!(status["active_profile"], "half-balanced");
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
    assert_eq!(after["active_profile"], "all-balanced");
    assert_eq!(layout(&after), layout(&before));
}

#[test]
fn an_injected_driver_failure_is_reported_with_the_step() {
    let agent = Agent::start(
        AgentOptions::simulate("a100-40gb:8").env("GPUSHARE_SIM_FAIL", "create_gpu_instance:3"),
    );
    let out = agent.ctl(&["apply", "half-balanced"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("create_gpu_instance on GPU")
            && err.contains(
                "Insufficient Resources (injected by GPUSHARE_SIM_FAIL=create_gpu_instance:3)"
            )
            && err.contains("rolled back: GPU 0, 1, 2, 3 as before"),
        "{err}"
    );
    let reasons = err.lines().filter(|l| l.starts_with("gpushare-ctl:")).count();
    assert_eq!(reasons, 1, "{err}");
    let status = agent.status();
    assert_eq!(status["active_profile"], serde_json::Value::Null);
    assert!(status["gpus"].as_array().unwrap().iter().all(|g| g["mig_enabled"] == false));
}

#[test]
fn json_errors_are_one_object() {
    let agent = Agent::start(AgentOptions::simulate("l40s:1"));
    let out = agent.ctl(&["apply", "all-balanced", "--json"]);
    assert!(!out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["error"]["name"], "io.gpushare.Agent1.Error.Infeasible");
    assert!(doc["error"]["message"].as_str().unwrap().contains("GPU 0 (L40S): has no MIG"));
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
    assert_eq!(status["gpus"].as_array().unwrap().len(), 2);
    let list = agent.ctl_json(&["profiles"]);
    assert!(list["errors"][0].as_str().unwrap().contains("broken.toml:1:"), "{list}");
    // ...but changes nothing on the GPUs: it never acts on half-read configuration.
    let out = agent.ctl(&["apply", "all-balanced"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("manage_mig = false"), "{}", text(&out));
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
    let reasons = err.lines().filter(|l| l.starts_with("gpushare-ctl:")).count();
    assert_eq!(reasons, 1, "{err}");
    assert!(err.contains("the probe measures real GPUs with CUDA"), "{err}");
    let out = agent.ctl(&["probe", "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["error"]["message"].as_str().unwrap().contains("simulates"), "{doc}");
}
