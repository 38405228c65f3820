//! A simulated agent is a sandbox (issue 37, items 1 and 7): a real agent refuses a state
//! directory a simulated one wrote, a second agent on a state directory is told about
//! `--state-dir`, and an agent whose bus is not there writes nothing; each in one line.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use gpushare_tests::{Agent, AgentOptions, binary, is_root, stderr, text};

/// Every file under `dir` with its contents, but `agent.lock` (which holds the pid of
/// whoever took the lock last).
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut found = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files(&path));
        } else if !path.ends_with("agent.lock") {
            found.insert(path.display().to_string(), std::fs::read(&path).unwrap_or_default());
        }
    }
    found
}

/// The paths that differ between two [`files`].
fn changed(before: &BTreeMap<String, Vec<u8>>, after: &BTreeMap<String, Vec<u8>>) -> Vec<String> {
    let paths: std::collections::BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    paths.into_iter().filter(|p| before.get(*p) != after.get(*p)).cloned().collect()
}

/// `gpushare-agent ARGS` with `env`, to its end.
fn agent(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(binary("gpushare-agent", "GPUSHARE_AGENT_BIN"))
        .args(args)
        .envs(env.iter().copied())
        .env("GPUSHARE_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("gpushare-agent runs")
}

/// The agent refused to start with exactly one line on stderr, which it returns.
fn one_line_refusal(out: &Output) -> String {
    assert!(!out.status.success(), "{}", text(out));
    let said = stderr(out);
    assert_eq!(said.trim_end().lines().count(), 1, "{}", text(out));
    said.trim_end().to_string()
}

/// A real agent (no `--simulate`) given a state directory a simulated agent used refuses
/// it before it reads or writes there: a simulated node's active profile is never applied
/// to real GPUs. Directories of agents before the mark (the node's file tells) too.
#[test]
fn a_real_agent_refuses_a_state_directory_a_simulated_one_wrote() {
    let mut sim = Agent::start(AgentOptions::simulate("a100-40gb:2"));
    assert!(sim.ctl(&["apply", "all-balanced"]).status.success());
    sim.stop();
    let state = sim.dir.path().join("state");
    let state_arg = state.to_str().unwrap();
    let config = sim.dir.path().join("agent.toml");
    let real = ["--bus", sim.bus.address(), "--state-dir", state_arg, "--config"];
    let real: Vec<&str> = real.into_iter().chain([config.to_str().unwrap()]).collect();

    for marked in [true, false] {
        if !marked {
            // As a simulated agent before this one left it: no mark, the node's file.
            std::fs::remove_file(state.join("driver.json")).unwrap();
        }
        let before = files(&state);
        let said = one_line_refusal(&agent(&real, &[]));
        assert!(
            said.contains(&format!("state directory {state_arg} was written by a simulated agent")),
            "{said}"
        );
        if marked {
            assert!(said.contains("(--simulate a100-40gb:2)"), "{said}");
        }
        assert!(said.contains("--state-dir"), "{said}");
        let changed = changed(&before, &files(&state));
        assert!(changed.is_empty(), "the real agent changed the state directory: {changed:?}");
    }
}

/// A second agent on a state directory in use says which agent holds it and how to give
/// this one its own (before: "another gpushare-agent uses DIR", nothing about
/// `--state-dir`). As root without `--state-dir`, two by-hand simulated agents meet so.
#[test]
fn a_second_agent_on_a_state_directory_is_told_about_state_dir() {
    let first = Agent::start(AgentOptions::simulate("a100-40gb:1"));
    let state = first.dir.path().join("state");
    let config = first.dir.path().join("agent.toml");
    let out = agent(
        &[
            "--simulate",
            "a100-40gb:1",
            "--bus",
            first.bus.address(),
            "--state-dir",
            state.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ],
        &[],
    );
    let said = one_line_refusal(&out);
    let pid = first.pid().expect("the first agent runs");
    assert!(said.contains(&format!("another gpushare-agent (pid {pid}) uses")), "{said}");
    assert!(said.contains("--state-dir DIR"), "{said}");
    assert_eq!(first.status().gpus.len(), 1, "the first agent still serves");
}

/// An agent whose bus is not there (a root agent on a host without a system bus) stops
/// in one line naming the bus before it writes anything: no state directory, no journal,
/// no CDI spec. Before, it wrote all three and then failed.
#[test]
fn an_agent_without_its_bus_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let no_bus = format!("unix:path={}", dir.path().join("no-bus").display());
    let env = [("DBUS_SYSTEM_BUS_ADDRESS", no_bus.as_str())];
    let args = ["--simulate", "a100-40gb:2", "--bus", "system", "--config", "/dev/null"];
    let mut with_state: Vec<&str> = args.to_vec();
    with_state.extend(["--state-dir", state.to_str().unwrap()]);
    let said = one_line_refusal(&agent(&with_state, &env));
    assert!(said.contains("cannot connect to the system bus"), "{said}");
    assert!(said.contains("nothing written") && said.contains("--bus"), "{said}");
    assert!(!state.exists(), "{} was made", state.display());

    // A bus address given that leads nowhere: the same.
    let out = agent(
        &["--simulate", "a100-40gb:2", "--bus", &no_bus, "--state-dir", state.to_str().unwrap()],
        &[],
    );
    assert!(one_line_refusal(&out).contains(&format!("cannot connect to the bus {no_bus}")));
    assert!(!state.exists(), "{} was made", state.display());

    // As root with no --state-dir: the simulated agent's own place is not made either.
    let _one = crate::first_hour::ROOT_SANDBOX.lock();
    let sandbox = Path::new("/run/gpushare-sim");
    if is_root() && !sandbox.exists() {
        // Removed however the test ends, were the agent to make it.
        let _made = crate::first_hour::MadeHere(sandbox);
        let mut root = args.to_vec();
        root.retain(|a| *a != "--config" && *a != "/dev/null");
        let said = one_line_refusal(&agent(&root, &env));
        assert!(said.contains("cannot connect to the system bus"), "{said}");
        assert!(!sandbox.exists(), "{} was made", sandbox.display());
    } else {
        gpushare_tests::skip(format_args!(
            "the root part: needs root and no {} (a simulated agent's by hand)",
            sandbox.display()
        ));
    }
}
