//! What `gpushare-ctl` prints for people and scripts: usage errors in one line, progress
//! counted once per step, one name for a MIG instance, one way of writing sizes.

use gpushare_proto::types::PlanReport;
use gpushare_tests::{Agent, AgentOptions, binary, ctl_error, stderr, stdout, text};

/// Runs `gpushare-ctl ARGS` with no agent to talk to (usage errors need none).
fn ctl_alone(args: &[&str]) -> std::process::Output {
    std::process::Command::new(binary("gpushare-ctl", "GPUSHARE_CTL_BIN"))
        .args(args)
        .env("GPUSHARE_BUS_ADDRESS", "unix:path=/nonexistent/gpushare-test-bus")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("gpushare-ctl runs")
}

/// Command lines clap refuses, of every kind of refusal.
const USAGE_ERRORS: &[&[&str]] = &[
    &[],
    &["bogus"],
    &["stauts"],
    &["generat"],
    &["apply"],
    &["apply", "x", "-c", "y"],
    &["status", "--bogus"],
    &["status", "extra"],
    &["mps", "limit", "--pid", "1"],
    &["mps", "bogus"],
    &["probe", "--workload", "flops"],
    &["probe", "--clients", "0"],
    &["profiles", "show"],
    &["help", "bogus"],
    &["--address"],
];

#[test]
fn usage_errors_are_one_line_with_exit_status_2() {
    for args in USAGE_ERRORS {
        let out = ctl_alone(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out));
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{args:?}: {}", text(&out));
        assert!(err.starts_with("gpushare-ctl: ") && err.ends_with('\n'), "{args:?}: {err}");
        assert!(!err.contains("generate"), "{args:?}: {err}");

        let mut json = args.to_vec();
        json.push("--json");
        let out = ctl_alone(&json);
        assert_eq!(out.status.code(), Some(2), "{json:?}: {}", text(&out));
        assert!(out.stderr.is_empty(), "{json:?}: {}", text(&out));
        assert_eq!(stdout(&out).lines().count(), 1, "{json:?}: {}", text(&out));
        let error = ctl_error(&out);
        assert_eq!(error.name, "gpushare.Ctl.Error.Usage", "{json:?}");
        assert!(!error.message.contains("generate"), "{json:?}: {error:?}");
    }
    // The reason, the tip, and where to read more.
    let err = stderr(&ctl_alone(&["stauts"]));
    assert_eq!(
        err,
        "gpushare-ctl: unrecognized subcommand 'stauts'; a similar subcommand exists: 'status'; see 'gpushare-ctl --help'\n"
    );
    let err = stderr(&ctl_alone(&["mps", "limit", "--pid", "1"]));
    assert_eq!(
        err,
        "gpushare-ctl: the following required arguments were not provided: <--threads <PCT>|--memory <SIZE>>; see 'gpushare-ctl mps limit --help'\n"
    );
    // Help and version are no errors: stdout, exit 0.
    for flag in ["--help", "--version"] {
        let out = ctl_alone(&[flag]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert!(out.stderr.is_empty() && !out.stdout.is_empty(), "{}", text(&out));
    }
}

/// The `(n, N)` of each `[n/N 1m05s] …` line of an apply's stderr (the time since the
/// job started after the count), and the other lines.
fn progress_lines(stderr: &str) -> (Vec<(u32, u32)>, Vec<String>) {
    let mut counted = Vec::new();
    let mut other = Vec::new();
    for line in stderr.lines() {
        let count = line
            .strip_prefix('[')
            .and_then(|rest| rest.split_once(']'))
            .and_then(|(count, _)| count.split_once(' '))
            .filter(|(_, elapsed)| elapsed.ends_with('s') || elapsed.ends_with('m'))
            .and_then(|(count, _)| count.split_once('/'))
            .and_then(|(n, total)| Some((n.parse().ok()?, total.parse().ok()?)));
        match count {
            Some(count) => counted.push(count),
            None => other.push(line.to_owned()),
        }
    }
    (counted, other)
}

#[test]
fn progress_counts_every_step_once_in_order_across_parallel_gpus() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:8"));
    let total = agent.ctl_doc::<PlanReport>(&["plan", "all-balanced"]).steps.len() as u32;
    assert!(total > 8, "{total}");
    // Not a terminal: plain lines on stderr.
    let out = agent.ctl(&["apply", "all-balanced"]);
    assert!(out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    let (counted, other) = progress_lines(&err);
    let expected: Vec<(u32, u32)> = (1..=total).map(|n| (n, total)).collect();
    assert_eq!(counted, expected, "{err}");
    // Verification has a line of its own, after the last step, without a count.
    assert_eq!(other, ["verifying"], "{err}");
    assert!(err.ends_with("verifying\n"), "{err}");
}

/// Issue 13's case (point 11): four GPUs reconfigured at once (half-balanced to
/// all-balanced, 40 steps), each call of the simulated driver slowed so that the GPUs'
/// steps overlap, stdout and stderr not terminals: each step's `[n/N]` line once, in
/// order (an agent that numbered steps by those finished printed `[1/40]` four times and
/// skipped numbers), then `verifying`, and the result alone on stdout.
#[test]
fn progress_lines_stay_in_order_while_the_steps_of_gpus_overlap() {
    let agent =
        Agent::start(AgentOptions::simulate("a100-40gb:8").env("GPUSHARE_SIM_DELAY_MS", "5"));
    for round in 0..3 {
        for profile in ["all-disabled", "half-balanced"] {
            let out = agent.ctl(&["apply", profile]);
            assert!(out.status.success(), "{}", text(&out));
        }
        let total = agent.ctl_doc::<PlanReport>(&["plan", "all-balanced"]).steps.len() as u32;
        assert_eq!(total, 40, "the GPUs of the second half change");
        let out = agent.ctl(&["apply", "all-balanced"]);
        assert!(out.status.success(), "{}", text(&out));
        let err = stderr(&out);
        let (counted, other) = progress_lines(&err);
        let expected: Vec<(u32, u32)> = (1..=total).map(|n| (n, total)).collect();
        assert_eq!(counted, expected, "round {round}: {err}");
        assert_eq!(other, ["verifying"], "round {round}: {err}");
        let result = stdout(&out);
        assert!(result.starts_with("Applied all-balanced: 40 steps in "), "{result}");
        assert_eq!(result.lines().count(), 1, "{result}");
    }
}

#[test]
fn a_rollback_is_told_apart_from_the_apply() {
    let agent = Agent::start(
        AgentOptions::simulate("a100-40gb:8")
            .env("GPUSHARE_SIM_FAIL", "nvmlDeviceCreateGpuInstanceWithPlacement:9"),
    );
    let total = agent.ctl_doc::<PlanReport>(&["plan", "all-balanced"]).steps.len() as u32;
    let out = agent.ctl(&["apply", "all-balanced"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    assert!(!err.contains("[0/0]"), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    let first_rollback = lines
        .iter()
        .position(|l| l.starts_with("rolling back"))
        .unwrap_or_else(|| panic!("no rollback line: {err}"));
    // Before it, the apply's steps, counted from 1 without gaps or repeats...
    let (counted, other) = progress_lines(&lines[..first_rollback].join("\n"));
    assert!(other.is_empty(), "{err}");
    let expected: Vec<(u32, u32)> = (1..=counted.len() as u32).map(|n| (n, total)).collect();
    assert_eq!(counted, expected, "{err}");
    assert!(counted.len() < total as usize, "{err}");
    // ...after it, the rollback's lines, none counted as the apply's, then the reason.
    let (last, rollback) = lines[first_rollback..].split_last().unwrap();
    assert!(rollback.len() > 2, "{err}");
    for line in rollback {
        assert!(line.starts_with("rolling back"), "{line:?} in\n{err}");
    }
    assert!(rollback.iter().any(|l| l.starts_with("rolling back: GPU ")), "{err}");
    assert_eq!(rollback.last(), Some(&"rolling back: verifying"), "{err}");
    // The failed step by its number in the plan (as `gpushare-ctl plan` shows it), which
    // need not be the number its progress line had.
    assert!(last.starts_with("gpushare-ctl: applying all-balanced: plan step "), "{err}");
    assert!(last.contains("rolled back: GPU 0, 1, 2, 3, 4, 5, 6, 7 as before"), "{err}");
}

/// MIG on GPU 0 with an MPS server on its 2g instance (GPU instance 1, at slot 0), and one
/// on the whole GPU 1.
const MPS_IN_MIG: &str = "name = \"mps-in-mig\"\n\
                          [[gpu]]\nselect = 0\nmig = { \"1g\" = 2, \"2g\" = 1, \"3g\" = 1 }\n\
                          instance_sharing.\"2g\".mps = { replicas = 2 }\n\
                          [[gpu]]\nselect = 1\nsharing.mps = { replicas = 4 }\n";

/// The cells of a table's rows under `column` of its header, keyed by the row's UUID cell.
fn column_by_uuid(table: &str, column: &str) -> Vec<(String, String)> {
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    let at = header.iter().position(|h| *h == column).unwrap_or_else(|| panic!("{table}"));
    let uuid = header.iter().position(|h| *h == "UUID").unwrap();
    lines
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .map(|cells| (cells[uuid].to_owned(), cells[at].to_owned()))
        .collect()
}

#[test]
fn a_mig_instance_has_one_name_in_status_and_mps_status() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2").profile("m.toml", MPS_IN_MIG));
    let out = agent.ctl(&["apply", "mps-in-mig"]);
    assert!(out.status.success(), "{}", text(&out));
    let status = agent.status();
    let two_g = status.gpus[0].instances.iter().find(|i| i.profile == "2g.10gb").unwrap();
    assert_ne!(two_g.gpu_instance_id, two_g.placement_start, "the test needs them apart");
    let mig_uuid = two_g.uuid.clone().unwrap();

    let out = agent.ctl(&["mps", "status"]);
    assert!(out.status.success(), "{}", text(&out));
    let table = stdout(&out);
    let gi = column_by_uuid(&table, "GI");
    assert!(gi.contains(&(mig_uuid.clone(), two_g.gpu_instance_id.to_string())), "{table}");
    assert!(gi.contains(&(status.gpus[1].uuid.clone(), "-".into())), "{table}");
    // status names it by the same id, in its GI/CI column.
    let human = stdout(&agent.ctl(&["status"]));
    let line = human.lines().find(|l| l.contains(&mig_uuid)).unwrap();
    assert!(line.contains(&format!(" {}/0 ", two_g.gpu_instance_id)), "{human}");
    // The document is as it was: the placement, by its name.
    let doc = agent.mps_status();
    let server = doc.servers.iter().find(|s| s.uuid == mig_uuid).unwrap();
    assert_eq!(server.placement_start, Some(two_g.placement_start));
}

/// Sizes written without a space or in other units than GiB, MiB, KiB (`2G`, `512M`,
/// `10GB`, `3GiB`) among the words of `text`.
fn odd_sizes(text: &str) -> Vec<String> {
    let units = ["G", "M", "K", "GB", "MB", "KB", "GiB", "MiB", "KiB", "B"];
    text.split_whitespace()
        .map(|w| w.trim_matches(|c: char| ",;:()[]".contains(c)))
        .filter(|w| {
            let digits = w.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
            digits.len() < w.len() && units.contains(&digits)
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn sizes_are_written_one_way_in_every_human_output() {
    let agent =
        Agent::start(AgentOptions::simulate("a100-40gb:3").profile("m.toml", MPS_IN_MIG).profile(
            "limits.toml",
            "[[gpu]]\nselect = 2\nsharing.mps = { pinned_memory_limit = \"3GiB\" }\n",
        ));
    let mut outputs = Vec::new();
    for args in [
        &["plan", "mps-in-mig"][..],
        &["apply", "mps-in-mig"],
        &["plan", "limits"],
        &["apply", "limits"],
        &["status"],
        &["mps", "status"],
        &["plan", "all-mps"],
    ] {
        let out = agent.ctl(args);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        outputs.push((args, stdout(&out) + &stderr(&out)));
    }
    for (args, printed) in &outputs {
        assert!(odd_sizes(printed).is_empty(), "{args:?}: {:?} in\n{printed}", odd_sizes(printed));
    }
    let all: String = outputs.iter().map(|(_, p)| p.as_str()).collect();
    // The 2g instance's server for 2 clients (4928 MiB each), GPU 1's for 4 (10 GiB), GPU 2's 3 GiB.
    for size in ["4928 MiB", "10 GiB", "3 GiB"] {
        assert!(all.contains(&format!("pinned memory {size}")), "{size} in\n{all}");
        assert!(
            all.contains(&format!("% {size}")) || all.contains(&format!("  {size}")),
            "{size} in\n{all}"
        );
    }
    // The check itself.
    assert_eq!(
        odd_sizes("2G 512M, (10GB) 3GiB 2g.10gb 40.0 GiB x4"),
        ["2G", "512M", "10GB", "3GiB"]
    );
}

#[test]
fn env_of_a_gpu_with_mig_on_names_its_instances_instead() {
    let agent = Agent::start(
        AgentOptions::simulate("a100-40gb:3")
            .profile("empty.toml", "[[gpu]]\nselect = 2\nmig = {}\n[[gpu]]\nselect = \"0-1\"\n"),
    );
    assert!(agent.ctl(&["apply", "half-balanced"]).status.success());
    let status = agent.status();
    let gpu0 = &status.gpus[0];
    let migs: Vec<String> = gpu0.instances.iter().map(|i| i.uuid.clone().unwrap()).collect();
    assert_eq!(migs.len(), 4);
    let expected = format!("GPU 0 has MIG on: pick an instance: {}", migs.join(", "));
    for target in ["0", gpu0.uuid.as_str()] {
        let out = agent.ctl(&["env", target]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(out.stdout.is_empty(), "nothing for eval: {}", text(&out));
        assert_eq!(stderr(&out), format!("gpushare-ctl: {expected}\n"));
        let error = ctl_error(&agent.ctl(&["env", target, "--json"]));
        assert_eq!(error.message, expected);
    }
    // An instance, and a GPU with MIG off, are what a client can use.
    let out = agent.ctl(&["env", &migs[1]]);
    assert_eq!(stdout(&out), format!("export CUDA_VISIBLE_DEVICES='{}'\n", migs[1]));
    let out = agent.ctl(&["env", "1"]);
    assert_eq!(stdout(&out), format!("export CUDA_VISIBLE_DEVICES='{}'\n", status.gpus[1].uuid));
    // MIG on without instances: nothing to pick.
    assert!(agent.ctl(&["apply", "empty"]).status.success());
    let out = agent.ctl(&["env", "2"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(
        stderr(&out),
        "gpushare-ctl: GPU 2 has MIG on and no MIG instances, so no client can use it (see gpushare-ctl status)\n"
    );
}

#[test]
fn a_failed_step_is_named_with_sizes_written_as_everywhere_else() {
    let root = tempfile::tempdir().unwrap();
    // A control program that runs but fails: the step fails (a missing one is refused
    // before any step, see sharing.rs).
    let config = format!("[mps]\ncontrol = \"/bin/false\"\nroot = {:?}\n", root.path());
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:1").config(&config));
    let out = agent.ctl(&["apply", "all-mps"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    let reason = err.lines().last().unwrap();
    assert!(reason.contains("(threads 25%, pinned memory 10 GiB)) failed: start_mps"), "{err}");
    assert!(odd_sizes(&err).is_empty(), "{err}");
}
