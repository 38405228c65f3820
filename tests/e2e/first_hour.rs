//! A newcomer's first hour (issues 24 and 37): the README's "Trying it by hand" blocks run
//! as written by a user without root and by root (outside the real agent's places, and
//! quietly), checks change nothing, and what the agent needs is refused before the first
//! step when it is missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use gpushare_tests::{
    Agent, AgentOptions, MEMBER, SIM_MPS_CONTROL, SIM_NVIDIA_SMI, agent_check, as_user,
    copy_executable, directory_of, ensure_users, is_root, repo_root, simulated_library, text,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The ```` ```lang ```` blocks of the README section under heading `section`, in order.
fn readme_blocks(section: &str, lang: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let start = readme.find(section).unwrap_or_else(|| panic!("README has no `{section}`"));
    let rest = &readme[start + section.len()..];
    let body = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    let fence = format!("```{lang}\n");
    let mut blocks = Vec::new();
    let mut rest = body;
    while let Some(open) = rest.find(&fence) {
        let after = &rest[open + fence.len()..];
        let close = after.find("```").expect("a closed block");
        blocks.push(after[..close].to_string());
        rest = &after[close + 3..];
    }
    blocks
}

/// The directory the README's `target/debug/...` paths are relative to: where cargo built
/// the binaries these tests run.
fn build_tree() -> PathBuf {
    let agent = gpushare_tests::binary("gpushare-agent", "GPUSHARE_AGENT_BIN");
    let dir = agent.parent().and_then(Path::parent).and_then(Path::parent).unwrap();
    assert!(
        dir.join("target/debug/gpushare-agent").exists(),
        "the README's paths need a debug build in {}/target",
        dir.display()
    );
    dir.to_path_buf()
}

/// The processes whose environment holds `needle` (every process the script started
/// inherits its HOME, the MPS servers theirs through the agent).
fn processes_with_in_environment(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.parse::<u32>().is_err() {
            continue;
        }
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
        if String::from_utf8_lossy(&environ).contains(needle) {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            found.push(format!("{name}: {}", String::from_utf8_lossy(&cmdline).replace('\0', " ")));
        }
    }
    found
}

/// Kills, when dropped, what the README's script left running (its environment holds
/// the script's own HOME): a script that stopped at a failing line never reached its
/// teardown, and its bus and agent must not outlive the test.
struct KillLeft(String);

impl Drop for KillLeft {
    fn drop(&mut self) {
        for found in processes_with_in_environment(&self.0) {
            let Some(Ok(pid)) = found.split(':').next().map(str::parse::<i32>) else { continue };
            // A process the test's script started (it carries the script's HOME).
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Runs `script` with bash (`-euo pipefail`, each command echoed) as the group member
/// (or as root, `user` `None`), from `cwd`, with nothing of this process's environment but
/// `PATH` and a `HOME` of its own.
fn run_as(user: Option<&str>, script: &str, cwd: &Path, home: &Path) -> Output {
    let mut command = match user {
        Some(user) => as_user(user),
        None => Command::new("/usr/bin/env"),
    };
    if user.is_some() {
        command.arg("env");
    }
    command
        .args(["-i", "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"])
        .arg(format!("HOME={}", home.display()))
        .args(["bash", "-euxo", "pipefail", "-c", script])
        .current_dir(cwd)
        .stdin(Stdio::null());
    command.output().expect("bash runs")
}

/// Acceptance: both blocks, as the README writes them, with `apply all-mps`, the README's
/// `inference-split` example and a one-replica bench between them, as a user without root;
/// the teardown leaves no process behind. Before, `plan` failed 3 times of 3 ("not
/// running": the agent needs some 66 ms to take its name).
#[test]
fn the_readme_by_hand_blocks_run_as_written_by_a_user_without_root() {
    if !is_root() {
        gpushare_tests::skip("needs root to run the README as another user");
        return;
    }
    ensure_users();
    let blocks = readme_blocks("## Trying it by hand", "sh");
    assert_eq!(blocks.len(), 2, "the section has a start block and a teardown block");
    let example = readme_blocks("## Profiles", "toml")
        .into_iter()
        .find(|b| b.contains("name = \"inference-split\""))
        .expect("README's inference-split example");
    let home = directory_of(MEMBER);
    let profile = home.path().join("inference-split.toml");
    std::fs::write(&profile, &example).unwrap();
    let replica = home.path().join("replica.sh");
    // One unit a line on the report descriptor, a few hundred a second.
    std::fs::write(
        &replica,
        "#!/bin/sh\nwhile :; do echo 0.2 >&\"$GPUSHARE_BENCH_REPORT\"; sleep 0.005; done\n",
    )
    .unwrap();
    std::fs::set_permissions(&replica, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .unwrap();

    let script = format!(
        "{start}\n\
         target/debug/gpushare-ctl apply all-mps\n\
         target/debug/gpushare-ctl apply -f {profile}\n\
         target/debug/gpushare-ctl status\n\
         {sockets}\n\
         target/debug/gpushare-ctl bench --target 3 --replicas 1 --strategies time-slicing,mps --duration 1s -- {replica}\n\
         {teardown}",
        start = blocks[0],
        teardown = blocks[1],
        profile = profile.display(),
        replica = replica.display(),
        sockets = SOCKETS,
    );
    let tree = build_tree();
    let copy = reachable_tree(MEMBER, &tree);
    let cwd = copy.as_ref().map_or(tree.as_path(), |c| c.path());
    let _kill_left = KillLeft(home.path().to_string_lossy().into_owned());
    let out = run_as(Some(MEMBER), &script, cwd, home.path());
    // What is left a moment after the teardown (a killed bus exits on its own time).
    let needle = home.path().to_string_lossy().into_owned();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut left = processes_with_in_environment(&needle);
    while !left.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        left = processes_with_in_environment(&needle);
    }
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    for expected in [
        "Applied half-balanced",
        "Applied all-mps",
        "Applied inference-split",
        "Applied all-disabled",
        "Recommendation",
    ] {
        assert!(said.contains(expected), "`{expected}` missing:\n{said}");
    }
    // Point 7's wording, where this bench produced it.
    for expected in ["baseline: one replica alone on the whole GPU, without MPS", "restoring: "] {
        assert!(said.contains(expected), "`{expected}` missing:\n{said}");
    }
    assert!(!said.contains("1 replicas") && !said.contains("rolling back"), "{said}");
    assert!(left.is_empty(), "left behind after the teardown: {left:#?}");
    assert_quiet(&said, false);
    assert_eq!(listening(home.path()), Vec::<u16>::new(), "the agent listens on TCP ports");
}

/// Where `user` runs the README's `target/debug/...` lines: from `tree` itself, or, where
/// `user` cannot reach it by its absolute path (a clone in root's 0700 home, as in a fresh
/// container), from a directory of its own holding a copy of what they run (`None` then
/// means `tree`). A user whose working directory lies under a directory it cannot search
/// starts the agent by its relative path, but the agent looks for its simulator beside its
/// absolute one and cannot: "not installed" in a fresh Debian 12 container (issue 37), a
/// situation no user without root has in a clone of its own.
fn reachable_tree(user: &str, tree: &Path) -> Option<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    let built = tree.join("target/debug");
    let reached = as_user(user)
        .args(["test", "-x"])
        .arg(built.join("gpushare-agent"))
        .status()
        .expect("test runs");
    if reached.success() {
        return None;
    }
    let copy = tempfile::tempdir().unwrap();
    let debug = copy.path().join("target/debug");
    std::fs::create_dir_all(&debug).unwrap();
    for dir in [copy.path(), &copy.path().join("target"), &debug] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for name in ["gpushare-agent", "gpushare-ctl", SIM_NVIDIA_SMI, SIM_MPS_CONTROL] {
        copy_executable(&built.join(name), &debug.join(name));
    }
    copy_executable(&simulated_library(), &debug.join("libgpushare_sim_nvml.so"));
    eprintln!(
        "note: {user} cannot reach {} (a directory above it it may not search): the README's \
         blocks run from a copy of it in {}",
        built.display(),
        debug.display()
    );
    Some(copy)
}

/// An agent that its user reaches only through its working directory (a clone under a
/// directory the user may not search) says why it finds no simulator beside itself. Before,
/// "not installed (looked in …/target/debug, …)" with no reason read as a missing build,
/// and sent a fresh container's first_hour failure after the wrong cause (issue 37).
#[test]
fn an_agent_out_of_its_users_reach_says_why_it_finds_no_simulator() {
    use std::os::unix::fs::PermissionsExt;
    if !is_root() {
        gpushare_tests::skip("needs root to run the agent as another user");
        return;
    }
    if Path::new("/usr/lib/gpushare/sim").exists() {
        gpushare_tests::skip("an installed simulator in /usr/lib/gpushare/sim would be found");
        return;
    }
    ensure_users();
    let closed = tempfile::tempdir().unwrap();
    std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let clone = closed.path().join("clone");
    let debug = clone.join("target/debug");
    std::fs::create_dir_all(&debug).unwrap();
    for dir in [&clone, &clone.join("target"), &debug] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let agent = gpushare_tests::binary("gpushare-agent", "GPUSHARE_AGENT_BIN");
    copy_executable(&agent, &debug.join("gpushare-agent"));
    copy_executable(&simulated_library(), &debug.join("libgpushare_sim_nvml.so"));
    let home = directory_of(MEMBER);
    let check = "target/debug/gpushare-agent --simulate a100-40gb:1 --check-driver";
    let out = run_as(Some(MEMBER), check, &clone, home.path());
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    let place = format!("{} (cannot be reached", debug.display());
    assert!(said.contains(&place), "`{place}` missing:\n{said}");
}

/// Script lines, run while the README's agent (`$agent`) runs, that keep what
/// [`listening`] reads: the agent's descriptors and the host's TCP sockets.
const SOCKETS: &str = "ls -l /proc/$agent/fd > \"$HOME/agent-fds\"; \
                       cat /proc/net/tcp /proc/net/tcp6 > \"$HOME/tcp\"";

/// The TCP ports the agent listened on when [`SOCKETS`] ran in `home` (a simulated agent
/// serves no metrics unless its agent.toml says where: never the packaged 9847).
fn listening(home: &Path) -> Vec<u16> {
    let fds = std::fs::read_to_string(home.join("agent-fds")).expect("the agent's descriptors");
    let sockets: Vec<&str> =
        fds.split("socket:[").skip(1).filter_map(|rest| rest.split(']').next()).collect();
    assert!(!sockets.is_empty(), "the agent has no socket at all: {fds}");
    let tcp = std::fs::read_to_string(home.join("tcp")).expect("the host's TCP sockets");
    tcp.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
            let port = u16::from_str_radix(local.rsplit_once(':')?.1, 16).ok()?;
            (*state == "0A" && sockets.contains(inode)).then_some(port)
        })
        .collect()
}

/// Issue 37, item 6: what the README's agent says in its terminal is warnings and errors
/// only, and a repeated reason once (before: some 60 INFO lines, and as a plain user 8
/// CDI "left out" warnings at start and 20 after every apply). `nodes`: whether the
/// simulator makes device nodes (as root); without, their absence is said once.
fn assert_quiet(said: &str, nodes: bool) {
    let info: Vec<&str> = said.lines().filter(|l| l.contains(" INFO ")).collect();
    assert!(info.is_empty(), "the agent's INFO lines in the terminal: {info:#?}");
    let left_out = said.lines().filter(|l| l.contains("CDI spec: left out")).count();
    let expected = if nodes { 0..=1 } else { 1..=1 };
    assert!(expected.contains(&left_out), "{left_out} CDI left-out warnings:\n{said}");
}

/// Snapshot of the places a real agent takes (issue 37, item 1): each path there with its
/// mode and a hash of its contents.
fn real_agents_places() -> Vec<(PathBuf, u32, u64)> {
    use std::hash::{Hash, Hasher};
    [
        "/var/lib/gpushare",
        "/run/gpushare",
        "/var/run/cdi/gpushare.json",
        "/etc/kubernetes/node-feature-discovery/features.d/gpushare",
        "/etc/slurm/gres.conf",
    ]
    .into_iter()
    .flat_map(|p| tree(Path::new(p)).unwrap_or_default())
    .map(|(path, mode, bytes)| {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        bytes.hash(&mut hasher);
        (path, mode, hasher.finish())
    })
    .collect()
}

/// Held by the tests that look at `/run/gpushare-sim` (a root simulated agent's default
/// place) while one of them may make it.
pub(crate) static ROOT_SANDBOX: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Removes the simulated agent's place as root on drop, when the test made it.
pub(crate) struct MadeHere(pub(crate) &'static Path);

impl Drop for MadeHere {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0);
    }
}

/// Issue 37, item 1, acceptance: the README's blocks as written, run by root, leave the
/// real agent's places (`/var/lib/gpushare`, `/run/gpushare`, the CDI spec in
/// `/var/run/cdi`) as they were and listen on no port (the packaged 9847 neither): the
/// simulated agent keeps to `/run/gpushare-sim`, marked as a simulated node's. Before, it
/// wrote an active profile into /var/lib/gpushare, its MPS servers under /run/gpushare and
/// bound 127.0.0.1:9847.
#[test]
fn the_readme_by_hand_blocks_run_as_root_keep_out_of_the_real_agents_places() {
    if !is_root() {
        gpushare_tests::skip("needs root (the README's blocks run by root)");
        return;
    }
    let _one = ROOT_SANDBOX.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let sandbox = Path::new("/run/gpushare-sim");
    if sandbox.exists() {
        gpushare_tests::skip(format_args!(
            "{} exists (a simulated agent's by hand): left as it is",
            sandbox.display()
        ));
        return;
    }
    let _made = MadeHere(sandbox);
    let blocks = readme_blocks("## Trying it by hand", "sh");
    let home = tempfile::tempdir().unwrap();
    let script = format!(
        "{start}\n\
         target/debug/gpushare-ctl apply all-mps\n\
         target/debug/gpushare-ctl status\n\
         {SOCKETS}\n\
         {teardown}",
        start = blocks[0],
        teardown = blocks[1],
    );
    let before = real_agents_places();
    let _kill_left = KillLeft(home.path().to_string_lossy().into_owned());
    let out = run_as(None, &script, &build_tree(), home.path());
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    for expected in ["Applied half-balanced", "Applied all-mps", "Applied all-disabled"] {
        assert!(said.contains(expected), "`{expected}` missing:\n{said}");
    }
    assert_eq!(real_agents_places(), before, "a real agent's place changed");
    assert_eq!(listening(home.path()), Vec::<u16>::new(), "the agent listens on TCP ports");
    assert_quiet(&said, true);
    let driver = std::fs::read_to_string(sandbox.join("driver.json")).unwrap_or_default();
    assert!(driver.contains("\"simulated\"") && driver.contains("a100-40gb:8"), "{driver}");
}

/// Snapshot of a directory tree: each path with its kind, mode and contents.
fn tree(dir: &Path) -> Option<Vec<(PathBuf, u32, Vec<u8>)>> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(dir).ok()?;
    let mut entries = vec![(dir.to_path_buf(), meta.mode(), Vec::new())];
    if meta.is_dir() {
        let mut children: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
        children.sort_by_key(|e| e.file_name());
        for child in children {
            entries.extend(tree(&child.path()).unwrap_or_default());
        }
    } else if meta.is_file() {
        entries[0].2 = std::fs::read(dir).unwrap_or_default();
    }
    Some(entries)
}

/// Point 5: `--check-driver` (and the other read-only checks) on a simulated node leave
/// the state directory as it was: not made, not locked, the node's file not replaced by
/// one of another spec. Before, as root, it created /var/lib/gpushare and replaced
/// `simulated-gpus.json`.
#[test]
fn checks_change_nothing_in_the_state_directory() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let state_arg = state.to_str().unwrap();
    for check in ["--check-driver", "--check-catalog"] {
        let out = agent_check(&["--simulate", "h100-80gb:2", "--state-dir", state_arg, check]);
        assert!(out.status.success(), "{check}: {}", text(&out));
        assert!(!state.exists(), "{check} made {}", state.display());
    }
    let out =
        agent_check(&["--simulate", "h100-80gb:2", "--state-dir", state_arg, "--check-driver"]);
    assert!(text(&out).contains("the NVIDIA driver answers: 2 GPUs"), "{}", text(&out));

    // A node kept there by an agent of another spec is left as it is.
    let mut agent = Agent::start(AgentOptions::simulate("a100-40gb:1"));
    assert!(agent.ctl(&["apply", "all-balanced"]).status.success());
    agent.stop();
    let kept = agent.dir.path().join("state");
    let before = tree(&kept);
    let kept_arg = kept.to_str().unwrap();
    let out =
        agent_check(&["--simulate", "a100-40gb:3", "--state-dir", kept_arg, "--check-driver"]);
    assert!(text(&out).contains("answers: 3 GPUs"), "{}", text(&out));
    assert_eq!(tree(&kept), before, "the state directory changed");

    // As root without --state-dir: neither the packaged agent's directory nor the
    // simulated agent's own (issue 37).
    if is_root() {
        let _one = ROOT_SANDBOX.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let places = [Path::new("/var/lib/gpushare"), Path::new("/run/gpushare-sim")];
        let before: Vec<_> = places.iter().map(|p| tree(p)).collect();
        let out = agent_check(&["--simulate", "a100-40gb:2", "--check-driver"]);
        assert!(out.status.success(), "{}", text(&out));
        let after: Vec<_> = places.iter().map(|p| tree(p)).collect();
        assert_eq!(after, before, "--check-driver changed {places:?}");
    }
}

/// Point 2: an MPS root the agent cannot write in is refused before the first step, with
/// the setting to change; the GPUs stay as they were.
#[test]
fn an_mps_root_the_agent_cannot_write_is_refused_before_anything_changes() {
    let config = "[mps]\nroot = \"/etc/hostname/mps\"\n";
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2").config(config));
    let before = agent.status();
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.contains("all-mps starts MPS servers, whose directories go under /etc/hostname/mps")
            && said.contains("/etc/hostname is not a directory")
            && said.contains("[mps] root")
            && said.contains("nothing was changed"),
        "{said}"
    );
    assert_eq!(agent.status().gpus, before.gpus);
}

/// Point 4: the usual A100 course (MIG mode set, pending until the plan's reset) is no
/// warning: an apply on a healthy simulated node logs nothing at `warn`.
#[test]
fn a_healthy_apply_logs_no_warning() {
    let log = tempfile::NamedTempFile::new().unwrap();
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:4").stderr_to(log.path()));
    for profile in ["half-balanced", "all-mps", "all-time-sliced", "all-disabled"] {
        let out = agent.ctl(&["apply", profile]);
        assert!(out.status.success(), "{profile}: {}", text(&out));
    }
    let logged = std::fs::read_to_string(log.path()).unwrap();
    assert!(!logged.contains("WARN") && !logged.contains("ERROR"), "{logged}");
}

/// Point 4: `scripts/demo --help` prints its usage, not a line of its code.
#[test]
fn the_demo_prints_its_usage() {
    let out = Command::new(repo_root().join("scripts/demo")).arg("--help").output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let usage = String::from_utf8_lossy(&out.stdout);
    assert!(usage.starts_with("Runs the main job on simulated GPUs"), "{usage}");
    assert!(usage.contains("scripts/demo [PROFILE] [--simulate MODEL:N,...]"), "{usage}");
    assert!(!usage.contains("set -euo") && !usage.contains("# "), "{usage}");
}

/// Point 6: a node's layout goes back to mig-parted users: `export --format mig-parted`
/// is a mig-parted file whose `exported` config `apply -f … -c` takes back to the same
/// layout (nothing to do right after the export).
#[test]
fn a_mig_parted_export_round_trips_through_apply() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:4,h100-80gb:2"));
    let mixed = "name = \"mixed\"\n\
                 [[gpu]]\nselect = 0\nmig = { \"1g\" = 7 }\n\
                 [[gpu]]\nselect = \"1,4\"\nmig = { \"3g\" = 2 }\n\
                 [[gpu]]\nselect = 5\nmig = {}\n\
                 [[gpu]]\nselect = \"all\"\nmig = \"disabled\"\n";
    let (_dir, file) = gpushare_tests::temp_file("mixed.toml", mixed);
    let out = agent.ctl(&["apply", "-f", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let before = gpushare_tests::layout(&agent.status());

    let out = agent.ctl(&["export", "--format", "mig-parted"]);
    assert!(out.status.success(), "{}", text(&out));
    let yaml = gpushare_tests::stdout(&out);
    assert!(yaml.contains("version: v1\nmig-configs:\n  exported:\n"), "{yaml}");
    let (_dir, exported) = gpushare_tests::temp_file("node.yaml", &yaml);
    let exported = exported.to_str().unwrap();
    let out = agent.ctl(&["plan", "-f", exported, "-c", "exported"]);
    assert!(text(&out).contains("nothing to do"), "{}", text(&out));

    assert!(agent.ctl(&["apply", "all-disabled"]).status.success());
    assert_ne!(gpushare_tests::layout(&agent.status()), before);
    let out = agent.ctl(&["apply", "-f", exported, "-c", "exported"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(gpushare_tests::layout(&agent.status()), before, "{yaml}");

    // A file of one config needs no -c; one of several says which there are.
    let out = agent.ctl(&["plan", "-f", exported]);
    assert!(text(&out).contains("nothing to do"), "{}", text(&out));
    let two = format!("{yaml}  again:\n    - devices: all\n      mig-enabled: false\n");
    let (_dir, two_file) = gpushare_tests::temp_file("two.yaml", &two);
    let out = agent.ctl(&["plan", "-f", two_file.to_str().unwrap()]);
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.contains(
            "a mig-parted file holds 2 configs: choose one with -c NAME (exported, again)"
        ),
        "{said}"
    );
}

/// Point 7: a bench's words. On a MIG GPU it names a GPU it could take instead; run to
/// completion it counts runs, not units, and its noise note does not suggest --duration.
#[test]
fn a_benchs_words_fit_what_it_did() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:4"));
    assert!(agent.ctl(&["apply", "half-balanced"]).status.success());
    let out = agent.ctl(&["bench", "--target", "1", "--", "true"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains(
            "GPU 1 (A100-SXM4-40GB) has MIG on: bench starts from a whole GPU; give --target 2 (GPU 2, 3 have no MIG), or apply a profile without MIG on it first"
        ),
        "{}",
        text(&out)
    );

    let out = agent.ctl(&[
        "bench",
        "--target",
        "3",
        "--replicas",
        "1",
        "--strategies",
        "time-slicing",
        "--until-exit",
        "--",
        "sleep",
        "0.1",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let said = gpushare_tests::stdout(&out);
    assert!(said.contains("Baseline: 1 replica alone: ") && said.contains(" runs/s"), "{said}");
    assert!(said.contains("N  RUNS/S") && !said.contains("units/s"), "{said}");
    assert!(!said.contains("--duration"), "{said}");
}
