//! The root agent trusts no path another user can create or write (issue 36, findings 4
//! and 6): its state directory, `[mps] root` and `[cdi] dir` set under a directory anyone
//! may create paths in (a root-owned 1777 directory the test makes, like `/tmp`), and
//! another user, [`OTHER`], planting links, directories and records there. Each test runs
//! the real agent as root and [`OTHER`] as a real unprivileged user.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use gpushare_tests::{
    Agent, AgentOptions, OTHER, SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV, SIM_NVIDIA_SMI,
    SIM_NVIDIA_SMI_ENV, Sleeper, binary, ensure_users, is_root, stderr, temp_file, text, wait_for,
};

/// Whether the test can run: creating users needs root. Says why not on stderr.
fn can_run() -> bool {
    if !is_root() {
        gpushare_tests::skip("needs root to create the test users and run a root agent");
        return false;
    }
    ensure_users();
    true
}

/// A root-owned directory anyone may create paths in, sticky like `/tmp` (1777).
fn open_place() -> tempfile::TempDir {
    let place = tempfile::tempdir().unwrap();
    std::fs::set_permissions(place.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    place
}

/// Runs `sh -c SCRIPT` as [`OTHER`], with `args` as `$1`…; it must succeed.
fn as_other(script: &str, args: &[&Path]) {
    let out = gpushare_tests::as_user(OTHER)
        .args(["sh", "-c", script, "sh"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "as {OTHER}: {script}: {}", text(&out));
}

/// Whether process `pid` runs (a zombie not yet reaped does not).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rfind(')').is_some_and(|i| !stat[i + 1..].trim_start().starts_with('Z'))
    })
}

/// Process `pid`'s start time (`/proc/PID/stat`, field 22), as the agent records it.
fn start_time(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split_whitespace().nth(19).unwrap().parse().unwrap()
}

/// A root-only file standing for one of root's secrets (a 0600 file in a 0700 directory).
struct RootFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

const ROOT_TEXT: &str = "root's alone\n";

impl RootFile {
    fn new() -> RootFile {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("root-only");
        std::fs::write(&path, ROOT_TEXT).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        RootFile { _dir: dir, path }
    }

    fn assert_unchanged(&self) {
        assert_eq!(std::fs::read_to_string(&self.path).unwrap(), ROOT_TEXT, "root's file changed");
        let meta = std::fs::metadata(&self.path).unwrap();
        assert_eq!((meta.mode() & 0o7777, meta.uid()), (0o600, 0), "root's file changed");
    }
}

/// Starts the agent as root with `--state-dir state` on simulated GPUs and a bus that is not
/// there (so that an agent that does start stops at the bus), and waits for it to end.
fn start_agent_with_state_dir(state: &Path) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[mps]\ncontrol = {:?}\nroot = {:?}\n[timeslice]\nnvidia_smi = {:?}\n[metrics]\nenabled = false\n",
        binary(SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV),
        dir.path().join("mps"),
        binary(SIM_NVIDIA_SMI, SIM_NVIDIA_SMI_ENV),
    );
    std::fs::write(dir.path().join("agent.toml"), config).unwrap();
    std::fs::create_dir(dir.path().join("profiles.d")).unwrap();
    Command::new(binary("gpushare-agent", "GPUSHARE_AGENT_BIN"))
        .args(["--simulate", "a100-40gb:1", "--bus"])
        .arg(format!("unix:path={}", dir.path().join("no-bus").display()))
        .arg("--state-dir")
        .arg(state)
        .arg("--config")
        .arg(dir.path().join("agent.toml"))
        .arg("--profiles-dir")
        .arg(dir.path().join("profiles.d"))
        .env("GPUSHARE_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The agent refused `state` at start in one line naming it and `--state-dir`.
fn assert_refused_at_start(out: &Output, state: &Path) {
    assert!(!out.status.success(), "{}", text(out));
    let err = stderr(out);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("gpushare-agent:")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains(&format!("state directory {}", state.display()))
            && lines[0].contains("--state-dir"),
        "{err}"
    );
}

/// The names in `dir`.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Finding 4: links planted where the agent's temporary files went (`.state.json.tmp`,
/// `.config-in-use.json.tmp`: root followed them and overwrote a 0600 root file) in a
/// state directory others may write are never written through: such a directory is
/// refused at start, and the root file is as it was.
#[test]
fn links_planted_for_the_temporary_files_are_never_written_through() {
    if !can_run() {
        return;
    }
    let place = open_place();
    let secret = RootFile::new();
    // A careless operator's state directory: root's, but writable by everyone.
    let state = place.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    as_other(
        r#"for name in .state.json.tmp .config-in-use.json.tmp .agent.lock.tmp; do
               ln -s "$2" "$1/$name" || exit 1
           done"#,
        &[&state, &secret.path],
    );
    let planted = names_in(&state);

    let out = start_agent_with_state_dir(&state);
    secret.assert_unchanged();
    assert_eq!(names_in(&state), planted, "the agent wrote into the directory");
    assert_refused_at_start(&out, &state);
    assert!(stderr(&out).contains("writable by others"), "{}", text(&out));
}

/// Finding 4: a state directory another user made before the agent (its path was free
/// for anyone to create) is refused at start in one line, and nothing is made in it.
#[test]
fn a_state_directory_another_user_made_is_refused_at_start() {
    if !can_run() {
        return;
    }
    let place = open_place();
    let state = place.path().join("state");
    as_other(r#"mkdir -m 0755 "$1""#, &[&state]);

    let out = start_agent_with_state_dir(&state);
    assert!(names_in(&state).is_empty(), "the agent made {:?} in it", names_in(&state));
    assert_refused_at_start(&out, &state);
    let uid = gpushare_tests::id_of("passwd", OTHER);
    assert!(stderr(&out).contains(&format!("uid {uid}")), "{}", text(&out));
    // The same directory made by root, 0755, under the same 1777 place: trusted.
    std::fs::remove_dir(&state).unwrap();
    std::fs::create_dir(&state).unwrap();
    let out = start_agent_with_state_dir(&state);
    assert!(!stderr(&out).contains("--state-dir"), "{}", text(&out));
    // Trusted, it went on to its bus, which is not there, and so wrote nothing there
    // (issue 37); the records' modes: `applied_documents_are_readable_by_root_only`.
    assert!(stderr(&out).contains("cannot connect to the bus"), "{}", text(&out));
    assert!(names_in(&state).is_empty(), "the agent made {:?} in it", names_in(&state));
}

/// Finding 4: a `server.json` another user forged in an MPS root they could create, naming
/// a process of theirs, makes the agent signal nothing (its health check killed the process
/// after the forged daemon did not answer): the root is ignored with a warning naming it and
/// `[mps] root`, and an apply that would start servers there is refused in one line.
#[test]
fn a_forged_server_record_makes_the_agent_signal_nothing() {
    if !can_run() {
        return;
    }
    let place = open_place();
    let root = place.path().join("mps");
    let log = tempfile::NamedTempFile::new().unwrap();
    let config = format!(
        "[mps]\ncontrol = {:?}\nroot = {:?}\nhealth_interval_seconds = 1\n",
        binary(SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV),
        root
    );
    let agent =
        Agent::start(AgentOptions::simulate("a100-40gb:1").config(&config).stderr_to(log.path()));
    let uuid = agent.status().gpus[0].uuid.clone();
    let victim = Sleeper::start(Some(OTHER), &[]);
    let forged = serde_json::json!({
        "uuid": uuid,
        "gpu": 0,
        "placement_start": null,
        "compute_instance": 0,
        "limits": { "active_thread_percentage": 25, "pinned_memory_limit_bytes": null },
        "restarts": 0,
        "daemon": { "pid": victim.pid(), "start_time": start_time(victim.pid()) },
    });
    let record = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(record.path(), forged.to_string()).unwrap();
    std::fs::set_permissions(record.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let server = root.join(&uuid);
    as_other(
        r#"mkdir -p "$1/pipe" && cp "$2" "$1/server.json" && chmod 0644 "$1/server.json""#,
        &[&server, record.path()],
    );

    // The health check (every second) sees the record: the warning, never the signal.
    wait_for(Duration::from_secs(30), Duration::from_millis(100), || {
        assert!(running(victim.pid()), "the agent killed the process a forged record named");
        let said = std::fs::read_to_string(log.path()).unwrap_or_default();
        match said.lines().find(|l| l.contains(&root.display().to_string())) {
            Some(line) if line.contains("[mps] root") => Ok(()),
            _ => Err(format!("no warning about {}: {said}", root.display())),
        }
    });
    assert!(agent.mps_servers().is_empty(), "the forged server is listed");

    let before = agent.status();
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(!out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    assert_eq!(gpushare_tests::reason_lines(&err), 1, "{err}");
    assert!(
        err.contains(&format!("whose directories go under {}", root.display()))
            && err.contains("[mps] root")
            && err.contains("nothing was changed"),
        "{err}"
    );
    assert_eq!(agent.status().gpus, before.gpus);
    assert!(agent.ctl(&["apply", "all-disabled"]).status.success());
    // Three more health checks.
    std::thread::sleep(Duration::from_millis(3500));
    assert!(running(victim.pid()), "the agent killed the process a forged record named");
    assert!(server.join("server.json").exists(), "the agent removed another user's files");
}

/// Finding 4: a `[cdi] dir` that another user made a link to a root directory (think
/// `/etc/cni/net.d`) is refused in one line naming it and `[cdi] dir`, and nothing is
/// written where the link points.
#[test]
fn a_cdi_directory_linked_to_a_root_directory_is_refused() {
    if !can_run() {
        return;
    }
    let place = open_place();
    let root_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let theirs = place.path().join("theirs");
    let cdi = theirs.join("cdi");
    as_other(r#"mkdir "$1" && ln -s "$2" "$1/cdi""#, &[&theirs, root_dir.path()]);
    let config = format!("[cdi]\ndir = {cdi:?}\n");
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:1").config(&config));
    let before = agent.status();
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(!out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    assert_eq!(gpushare_tests::reason_lines(&err), 1, "{err}");
    assert!(
        err.contains(&format!("CDI spec directory {}", cdi.display())) && err.contains("[cdi] dir"),
        "{err}"
    );
    assert_eq!(agent.status().gpus, before.gpus, "nothing applied");
    assert!(names_in(root_dir.path()).is_empty(), "written there: {:?}", names_in(root_dir.path()));
}

/// Finding 6: the text of an `apply -f` document (from a private file) is kept in
/// `state.json`, which only root reads; a `state.json` an older agent left readable is
/// made private at start.
#[test]
fn applied_documents_are_readable_by_root_only() {
    if !can_run() {
        return;
    }
    let mut agent = Agent::start(AgentOptions::simulate("a100-40gb:1").for_other_users());
    let marker = "# a private note in the document";
    let (_dir, file) = temp_file("private.toml", format!("{marker}\n[[gpu]]\nselect = \"all\"\n"));
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = agent.ctl(&["apply", "-f", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let state = agent.dir.path().join("state");
    let journal = state.join("state.json");
    assert!(std::fs::read_to_string(&journal).unwrap().contains(marker));
    let peek = |path: &Path| {
        gpushare_tests::as_user(OTHER).arg("cat").arg(path).stdin(Stdio::null()).output().unwrap()
    };
    for record in ["state.json", "config-in-use.json", "agent.lock"] {
        let path = state.join(record);
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o077, 0, "{record}");
        assert!(!peek(&path).status.success(), "{OTHER} read {record}");
    }

    // Left readable (as an agent before this one wrote it): private again at start.
    agent.stop();
    std::fs::set_permissions(&journal, std::fs::Permissions::from_mode(0o644)).unwrap();
    agent.start_again();
    assert_eq!(agent.status().active_profile.as_deref(), Some("private"));
    assert_eq!(std::fs::metadata(&journal).unwrap().mode() & 0o7777, 0o600);
    assert!(!peek(&journal).status.success(), "{OTHER} read state.json");
}
