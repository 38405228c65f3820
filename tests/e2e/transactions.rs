//! The MIG engine's promises, end to end: no GPU is ever left half-configured.

use std::collections::BTreeMap;
use std::time::Duration;

use gpushare_proto::types::{JobOutcome, PlanReport};
use gpushare_tests::{
    Agent, AgentOptions, BALANCED_A100, instance_profiles, layout, reason_lines, stderr, stdout,
    temp_file, text,
};
use serde_json::Value;

/// An 8 × A100 node with `all-balanced` applied.
fn balanced_node(options: AgentOptions) -> Agent {
    let agent = Agent::start(options);
    let out = agent.ctl(&["apply", "all-balanced"]);
    assert!(out.status.success(), "{}", text(&out));
    agent
}

/// Asserts the journal has no transaction and agrees with status on the active profile.
fn assert_journal_settled(agent: &Agent, active: &str) {
    let journal = agent.journal();
    assert_eq!(journal["transaction"], Value::Null, "{journal}");
    assert_eq!(journal["active_profile"], active, "{journal}");
    assert_eq!(agent.status().active_profile.as_deref(), Some(active));
}

#[test]
fn a_failure_at_any_step_leaves_every_gpu_as_it_was() {
    let mut agent = balanced_node(AgentOptions::simulate("a100-40gb:8"));
    let before = layout(&agent.status());
    let plan: PlanReport = agent.ctl_doc(&["plan", "half-balanced"]);
    let mut calls: BTreeMap<String, u32> = BTreeMap::new();
    for step in &plan.steps {
        *calls.entry(step.operation.clone()).or_default() += 1;
    }
    // GPUs 4-7 lose their four instances and MIG: every kind of destroy, the mode change
    // and the reset the A100 needs.
    assert_eq!(
        calls,
        BTreeMap::from([
            ("destroy_compute_instance".to_string(), 16),
            ("destroy_gpu_instance".to_string(), 16),
            ("reset_gpu".to_string(), 4),
            ("set_mig_mode".to_string(), 4),
        ])
    );
    let mut cases = 0;
    for (operation, count) in &calls {
        for n in 1..=*count {
            // Injected where the driver answers: the n-th call of the NVML function (or
            // of the simulated nvidia-smi's reset) that the step makes.
            let (function, answer) = crate::injected_at_the_c_abi(operation);
            let fail = format!("{function}:{n}");
            agent.restart_with_env(&[("GPUSHARE_SIM_FAIL", &fail)]);
            let out = agent.ctl(&["apply", "half-balanced"]);
            assert!(!out.status.success(), "{fail}: {}", text(&out));
            let err = stderr(&out);
            assert_eq!(reason_lines(&err), 1, "{fail}: {err}");
            assert!(
                err.contains(&format!("failed: {operation} on GPU"))
                    && err.contains(answer)
                    && err.contains("rolled back: GPU 4, 5, 6, 7 as before"),
                "{fail}: {err}"
            );
            assert!(err.contains("(GPU "), "the failed step is named: {err}");
            assert_eq!(layout(&agent.status()), before, "{fail}: the GPUs are as before");
            assert_journal_settled(&agent, "all-balanced");
            cases += 1;
        }
    }
    assert_eq!(cases, 40);
}

#[test]
fn failures_while_creating_are_rolled_back_too() {
    let mut agent = Agent::start(AgentOptions::simulate("a100-40gb:2,h100-80gb:2"));
    let before = layout(&agent.status());
    for fail in [
        "nvmlDeviceCreateGpuInstanceWithPlacement:5",
        "nvmlGpuInstanceCreateComputeInstance:7",
        "nvmlDeviceSetMigMode:3",
        "gpu-reset:2",
    ] {
        agent.restart_with_env(&[("GPUSHARE_SIM_FAIL", fail)]);
        let out = agent.ctl(&["apply", "all-balanced"]);
        assert!(!out.status.success(), "{fail}: {}", text(&out));
        assert!(stderr(&out).contains("rolled back: GPU 0, 1, 2, 3 as before"), "{}", text(&out));
        assert_eq!(layout(&agent.status()), before, "{fail}");
        assert_eq!(agent.journal()["transaction"], Value::Null);
    }
}

/// Kill delays in milliseconds, spread over an apply that takes about 100 ms.
fn kill_points() -> Vec<u64> {
    // A fixed linear congruential sequence: "random" points that reproduce.
    let mut x: u64 = 0x2545_F491;
    (0..10)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (x >> 33) % 120
        })
        .collect()
}

#[test]
fn sigkill_during_an_apply_leaves_the_old_or_the_new_layout() {
    let delay = [("GPUSHARE_SIM_DELAY_MS", "8")];
    let mut outcomes = BTreeMap::new();
    let mut interrupted = 0;
    for (i, kill_after) in kill_points().into_iter().enumerate() {
        // The first point in the journal's time is 0 ms: a kill with the transaction open.
        let mid_apply = i % 2 == 1;
        let kill_after = if i == 1 { 0 } else { kill_after };
        let mut agent = balanced_node(AgentOptions::simulate("a100-40gb:8"));
        let old = layout(&agent.status());
        agent.restart_with_env(&delay);
        let mut ctl = agent.ctl_command(&["apply", "half-balanced", "--json"]).spawn().unwrap();
        // Every other point counts from the moment the journal holds the transaction, so
        // that some kills land mid-apply however slow the machine is; the others from the
        // call, some of them before the transaction began.
        let waiting = std::time::Instant::now();
        while mid_apply
            && !agent.journal()["transaction"].is_object()
            && ctl.try_wait().unwrap().is_none()
            && waiting.elapsed() < Duration::from_secs(60)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(kill_after));
        agent.kill();
        let _ = ctl.wait();
        if agent.journal()["transaction"].is_object() {
            interrupted += 1;
        }

        agent.restart_with_env(&[]);
        let status = agent.status();
        let now = layout(&status);
        let new: Vec<_> =
            (0..8).map(|i| if i < 4 { old[i].clone() } else { (false, vec![]) }).collect();
        let active = status.active_profile.clone().expect("an active profile");
        if now == old {
            assert_eq!(active, "all-balanced", "killed at {kill_after} ms");
        } else {
            assert_eq!(now, new, "killed at {kill_after} ms: neither the old nor the new layout");
            assert_eq!(active, "half-balanced", "killed at {kill_after} ms");
        }
        for (i, gpu) in status.gpus.iter().enumerate() {
            assert_eq!(gpu.mig_pending, None, "GPU {i} left with a pending mode");
        }
        assert_journal_settled(&agent, &active);
        *outcomes.entry(active).or_insert(0) += 1;
    }
    // The points reach into the apply: some kills land with a transaction in flight,
    // which the next start rolls back.
    assert!(interrupted > 0, "no kill landed mid-apply: {outcomes:?}");
}

#[test]
fn instances_in_use_are_refused_with_their_pids_unless_forced() {
    let mut agent = balanced_node(AgentOptions::simulate("a100-40gb:8"));
    let before = agent.status();
    // A process runs in GPU 4's first instance (its id follows its placement).
    let gi = before.gpus[4].instances[0].gpu_instance_id;
    agent.restart_with_env(&[("GPUSHARE_SIM_PROCESSES", &format!("4/{gi}:4242"))]);
    let sevens = "name = \"sevens\"\n[[gpu]]\nselect = 4\nmig = { \"1g\" = 7 }\n";
    let (_dir, file) = temp_file("sevens.toml", sevens);
    let file = file.to_str().unwrap();

    let out = agent.ctl(&["apply", "-f", file]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("PID 4242"), "{}", text(&out));
    assert!(stderr(&out).contains("--force"), "{}", text(&out));
    assert_eq!(layout(&agent.status()), layout(&before), "nothing changed");

    // Forced, the agent goes ahead, but the driver refuses to destroy an instance that a
    // process runs in, as a real one does: rolled back, naming the call and the answer.
    let out = agent.ctl(&["apply", "-f", file, "--force"]);
    assert!(!out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    // The compute instance goes first: its destroy is the one refused.
    assert!(err.contains("nvmlComputeInstanceDestroy returned NVML_ERROR_IN_USE"), "{err}");
    assert!(err.contains("rolled back"), "{err}");
    assert_eq!(layout(&agent.status()), layout(&before), "rolled back");

    // Once the process has gone, the apply goes through. (Unset, the variable would leave
    // the node's processes as they are: other NVML clients share them.)
    agent.restart_with_env(&[("GPUSHARE_SIM_PROCESSES", "")]);
    let out = agent.ctl(&["apply", "-f", file]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(instance_profiles(&agent.status(), 4), vec!["1g.5gb"; 7]);
    // A profile applied from a file is re-applied from the journal at start-up.
    agent.restart_with_env(&[("GPUSHARE_SIM_REBOOT", "1")]);
    assert_eq!(agent.status().active_profile.as_deref(), Some("sevens"));
    assert_eq!(instance_profiles(&agent.status(), 4), vec!["1g.5gb"; 7]);

    // A GPU that must be reset is reported with what holds it, and rolled back: GPU 5
    // with MIG off and a process on it (as a real driver can have it: a GPU in MIG mode
    // runs processes only in its GPU instances), and a profile that turns MIG on there.
    let out = agent.ctl(&["apply", "half-balanced"]);
    assert!(out.status.success(), "{}", text(&out));
    agent.restart_with_env(&[("GPUSHARE_SIM_PROCESSES", "5:999")]);
    let before = layout(&agent.status());
    assert!(!before[5].0, "MIG off on GPU 5: {before:?}");
    let out = agent.ctl(&["apply", "all-balanced"]);
    assert!(stderr(&out).contains("PID 999"), "{}", text(&out));
    let out = agent.ctl(&["apply", "all-balanced", "--force"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    // The simulated nvidia-smi refuses as the real one does ("In use by another
    // client"); the agent adds what holds the GPU's device node.
    assert!(err.contains("reset_gpu on GPU 5: In use by another client ("), "{err}");
    assert!(err.contains("--gpu-reset -i 5 exited with status 255"), "{err}");
    assert!(err.contains("rolled back"), "{err}");
    assert_eq!(layout(&agent.status()), before);
}

/// The GPUs of a plan are reconfigured side by side: the steps begin in the order the
/// executor numbers them (`[n/N]`, counted as they begin on any GPU), so the first eight
/// steps of eight GPUs begun together belong to many GPUs, where one GPU at a time would
/// begin all of GPU 0's first. Each mutating driver call is slowed (100 ms) so that no GPU
/// gets through a step before the others have begun theirs; no time is compared.
#[test]
fn gpus_are_reconfigured_concurrently() {
    let agent =
        Agent::start(AgentOptions::simulate("a100-40gb:8").env("GPUSHARE_SIM_DELAY_MS", "100"));
    let out = agent.ctl(&["apply", "all-balanced"]);
    assert!(out.status.success(), "{}", text(&out));
    // Progress lines go to stderr when it is no terminal, as `[n/N TIME] GPU g: step`.
    let gpus: Vec<String> = stderr(&out)
        .lines()
        .filter(|l| l.starts_with('[') && !l.contains("verifying"))
        .filter_map(|l| l.split("] GPU ").nth(1)?.split(':').next().map(str::to_string))
        .take(8)
        .collect();
    let distinct: std::collections::BTreeSet<&String> = gpus.iter().collect();
    assert!(distinct.len() >= 6, "the first steps began on GPUs {gpus:?}: one at a time");
}

#[test]
fn hooks_run_around_applies_that_change_something() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("hooks.log");
    let record = |phase: &str| {
        format!(
            "echo \"{phase} $GPUSHARE_PROFILE $GPUSHARE_GPUS ${{GPUSHARE_RESULT:-}}\" >> {}",
            log.display()
        )
    };
    let config = format!(
        "[hooks]\npre_apply = [{:?}]\npost_apply = [{:?}]\n",
        record("pre"),
        record("post")
    );
    let mut agent = Agent::start(AgentOptions {
        config: Some(config.clone()),
        ..AgentOptions::simulate("h100-80gb:2")
    });
    assert!(agent.ctl(&["apply", "half-balanced"]).status.success());
    assert!(agent.ctl(&["apply", "half-balanced"]).status.success());
    agent.restart_with_env(&[("GPUSHARE_SIM_FAIL", "nvmlGpuInstanceCreateComputeInstance:2")]);
    assert!(!agent.ctl(&["apply", "all-balanced"]).status.success());
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "pre half-balanced 0 \npost half-balanced 0 success\n\
         pre all-balanced 1 \npost all-balanced 1 rolled-back\n",
        "no hooks for an apply that changes nothing"
    );

    // A failing pre_apply aborts before any change; post_apply still runs.
    let failing = format!(
        "[hooks]\npre_apply = [\"echo cannot stop dcgm-exporter >&2; exit 1\"]\npost_apply = [{:?}]\n",
        record("post")
    );
    let agent = Agent::start(AgentOptions {
        config: Some(failing),
        ..AgentOptions::simulate("h100-80gb:2")
    });
    let before = layout(&agent.status());
    let out = agent.ctl(&["apply", "all-balanced"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("pre_apply hook")
            && err.contains("cannot stop dcgm-exporter")
            && err.contains("nothing was changed"),
        "{err}"
    );
    assert_eq!(layout(&agent.status()), before);
    assert!(std::fs::read_to_string(&log).unwrap().ends_with("post all-balanced 0,1 failed\n"));
}

#[test]
fn the_active_profile_is_reapplied_after_a_reboot() {
    let mut agent = Agent::start(AgentOptions::simulate("a100-40gb:8"));
    assert!(agent.ctl(&["apply", "half-balanced"]).status.success());
    let applied = layout(&agent.status());
    agent.restart_with_env(&[("GPUSHARE_SIM_REBOOT", "1")]);
    let status = agent.status();
    assert_eq!(status.active_profile.as_deref(), Some("half-balanced"));
    assert_eq!(layout(&status), applied);
    for i in 0..4 {
        assert_eq!(instance_profiles(&status, i), BALANCED_A100);
    }

    // boot_profile wins over the active profile.
    let mut agent = Agent::start(AgentOptions {
        config: Some("boot_profile = \"all-balanced\"\n".into()),
        ..AgentOptions::simulate("a100-40gb:4")
    });
    assert!(agent.ctl(&["apply", "all-disabled"]).status.success());
    agent.restart_with_env(&[("GPUSHARE_SIM_REBOOT", "1")]);
    let status = agent.status();
    assert_eq!(status.active_profile.as_deref(), Some("all-balanced"));
    assert_eq!(instance_profiles(&status, 3), BALANCED_A100);
}

#[test]
fn mig_parted_configs_apply_as_they_are_and_export_round_trips() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:8"));
    let yaml = gpushare_tests::repo_root().join("tests/data/mig-parted-config-default.yaml");
    let yaml = yaml.to_str().unwrap();
    let out = agent.ctl(&["apply", "-f", yaml, "-c", "all-balanced"]);
    assert!(out.status.success(), "{}", text(&out));
    let status = agent.status();
    assert_eq!(status.active_profile.as_deref(), Some("all-balanced"));
    for i in 0..8 {
        assert_eq!(instance_profiles(&status, i), BALANCED_A100);
    }
    let out = agent.ctl(&["apply", "-f", yaml, "-c", "all-balancd"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("all-balanced"), "names the known configs: {}", text(&out));

    assert!(agent.ctl(&["assert", "-f", yaml, "-c", "all-balanced"]).status.success());
    assert!(agent.ctl(&["assert", "all-balanced"]).status.success());
    let out = agent.ctl(&["assert", "half-balanced"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));

    let exported = agent.ctl(&["export"]);
    assert!(exported.status.success());
    let (_dir, file) = temp_file("exported.toml", &exported.stdout);
    let file = file.to_str().unwrap();
    assert!(agent.ctl(&["assert", "-f", file]).status.success());
    let outcome: JobOutcome = agent.ctl_doc(&["apply", "-f", file]);
    assert!(!outcome.changed, "{outcome:?}");
    assert_eq!(agent.status().active_profile.as_deref(), Some("exported"));

    assert!(agent.ctl(&["apply", "-f", yaml, "-c", "all-1g.5gb"]).status.success());
    assert_eq!(instance_profiles(&agent.status(), 7), vec!["1g.5gb"; 7]);
}

#[test]
fn a_failed_rollback_is_reported_and_finished_at_the_next_start() {
    let mut agent = balanced_node(AgentOptions::simulate("a100-40gb:8"));
    let before = layout(&agent.status());
    // The apply fails at its third destroy; the rollback fails at its first create.
    agent.restart_with_env(&[(
        "GPUSHARE_SIM_FAIL",
        "nvmlGpuInstanceDestroy:3,nvmlDeviceCreateGpuInstanceWithPlacement:1",
    )]);
    let out = agent.ctl(&["apply", "half-balanced"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("the rollback failed too"), "{err}");
    let status = agent.status();
    assert_eq!(status.active_profile, None);
    assert!(status.rollback_error.is_some(), "{status:?}");
    let human = agent.ctl(&["status"]);
    assert!(stdout(&human).contains("Rollback failed"), "{}", text(&human));
    assert!(agent.journal()["transaction"]["rollback_error"].is_string());

    // At the next start the agent finishes the rollback before it serves.
    agent.restart_with_env(&[]);
    assert_eq!(layout(&agent.status()), before);
    assert_journal_settled(&agent, "all-balanced");
    assert_eq!(agent.status().rollback_error, None);
}
