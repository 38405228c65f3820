//! A newcomer's first errors, round 2 (issue 37, item 7), and the pages that document what
//! they name (item 8): each mistake is refused in one line that says what to do, and the
//! man pages name the variables and files the errors point at. The real binaries run; only
//! facts are asserted (the variable, `--`, the name meant, the GPUs there are), never
//! another tool's wording.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use gpushare_tests::{
    Agent, AgentOptions, Bus, OTHER, as_user, binary, ctl_error, ensure_users, is_root, stderr,
    text,
};

fn ctl_bin() -> PathBuf {
    binary("gpushare-ctl", "GPUSHARE_CTL_BIN")
}

/// The one reason gpushare-ctl printed on stderr (asserting there is exactly one line).
fn one_reason(out: &Output) -> String {
    assert!(!out.status.success(), "expected a failure: {}", text(out));
    let err = stderr(out);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {}", text(out));
    assert!(lines[0].starts_with("gpushare-ctl: "), "{}", text(out));
    lines[0].to_string()
}

/// gpushare-ctl with no bus configured but `address`'s (none at all when `None`).
fn ctl_alone(args: &[&str], system_bus: &str) -> Output {
    Command::new(ctl_bin())
        .args(args)
        .env_remove("GPUSHARE_BUS_ADDRESS")
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .env("DBUS_SYSTEM_BUS_ADDRESS", system_bus)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn no_bus_and_no_agent_name_the_variable_that_points_at_one() {
    let dir = tempfile::tempdir().unwrap();
    let nowhere = format!("unix:path={}", dir.path().join("no-bus").display());
    let line = one_reason(&ctl_alone(&["status"], &nowhere));
    assert!(line.contains("GPUSHARE_BUS_ADDRESS"), "{line}");

    // A bus without an agent.
    let bus = Bus::start();
    let out = ctl_alone(&["--address", bus.address(), "status"], &nowhere);
    let line = one_reason(&out);
    assert!(line.contains("GPUSHARE_BUS_ADDRESS"), "{line}");
    assert!(line.contains("gpushare-agent --bus"), "says how to start one: {line}");
}

#[test]
fn bench_without_dashes_says_to_put_the_program_after_them() {
    let dir = tempfile::tempdir().unwrap();
    let nowhere = format!("unix:path={}", dir.path().join("no-bus").display());
    let out = ctl_alone(&["bench", "python3", "x.py"], &nowhere);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let line = one_reason(&out);
    assert!(line.contains("`--`"), "{line}");
    assert!(line.contains("gpushare-ctl bench -- python3 x.py"), "{line}");

    let out = ctl_alone(&["bench", "--replicas", "1,2", "./serve", "--batch", "8"], &nowhere);
    let line = one_reason(&out);
    assert!(line.contains("gpushare-ctl bench --replicas 1,2 -- ./serve --batch 8"), "{line}");

    // An unknown option is not a program: no such advice.
    let line = one_reason(&ctl_alone(&["bench", "--no-such-option"], &nowhere));
    assert!(!line.contains("put the program"), "{line}");
}

#[test]
fn a_mistyped_profile_gets_the_name_meant() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2"));
    for verb in ["apply", "plan", "assert"] {
        let line = one_reason(&agent.ctl(&[verb, "half-balance"]));
        assert!(line.contains("did you mean half-balanced?"), "{verb}: {line}");
        assert!(line.contains("all-mps"), "still lists the known ones: {line}");
    }
    // Nothing close: the list alone.
    let line = one_reason(&agent.ctl(&["apply", "zzz"]));
    assert!(!line.contains("did you mean"), "{line}");
}

#[test]
fn a_gpu_the_node_lacks_is_refused_one_way_naming_the_gpus_there_are() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:4"));
    let (_dir, file) = gpushare_tests::temp_file("nine.toml", "[[gpu]]\nselect = 9\n");
    let file = file.to_str().unwrap();
    // (`probe --target` goes through `env`'s lookup, on a GPU that runs CUDA.)
    let cases: [&[&str]; 5] = [
        &["env", "9"],
        &["env", "GPU-nope"],
        &["bench", "--target", "9", "--duration", "1s", "--", "true"],
        &["mig", "profiles", "9"],
        &["plan", "-f", file],
    ];
    for args in cases {
        let out = agent.ctl(args);
        let line = one_reason(&out);
        assert!(line.contains("0-3"), "{args:?} names the GPUs there are: {line}");
        let named = if args.contains(&"GPU-nope") { "GPU-nope" } else { "9" };
        assert!(line.contains(named), "{args:?} names what was asked for: {line}");
        if args[0] != "plan" {
            // Every command line's GPU the same way.
            assert!(line.contains("this node has no such GPU"), "{args:?}: {line}");
            assert!(line.contains("(by index or GPU-… UUID)"), "{args:?}: {line}");
        }
    }
}

/// A copy of gpushare-ctl any user may run.
fn ctl_for_anyone() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ctl = dir.path().join("gpushare-ctl");
    gpushare_tests::copy_executable(&ctl_bin(), &ctl);
    std::fs::set_permissions(&ctl, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, ctl)
}

/// A bus daemon, stopped on drop (also when an assertion fails).
struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A session-type bus of root's whose socket is in a directory everyone may enter (as
/// `dbus-daemon --session` makes one under /tmp): its daemon and address.
fn roots_open_bus(dir: &Path) -> (Daemon, String) {
    use std::io::BufRead;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = gpushare_tests::repo_root().join("tests/dbus/session.conf");
    let mut child = Command::new("dbus-daemon")
        .arg(format!("--config-file={}", config.display()))
        .arg(format!("--address=unix:path={}", dir.join("bus").display()))
        .args(["--nofork", "--nopidfile", "--print-address=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("dbus-daemon runs");
    let stdout = child.stdout.take().unwrap();
    let daemon = Daemon(child);
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line).unwrap();
    (daemon, line.trim().to_string())
}

#[test]
fn another_users_bus_says_whose_it_is_and_what_to_do() {
    if !is_root() {
        gpushare_tests::skip("needs root to run gpushare-ctl as another user");
        return;
    }
    ensure_users();
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2"));
    let (_bin, ctl) = ctl_for_anyone();
    let open = tempfile::tempdir().unwrap();
    let (_daemon, open_address) = roots_open_bus(open.path());
    // The agent's bus (its socket in root's private directory), and one whose socket
    // anyone may reach but whose daemon lets in only root.
    for address in [agent.bus.address().to_string(), open_address] {
        let run = |json: bool| {
            let mut cmd = as_user(OTHER);
            cmd.arg(&ctl)
                .args(if json { &["--json", "status"][..] } else { &["status"][..] })
                .env("GPUSHARE_BUS_ADDRESS", &address)
                .env_remove("DBUS_SESSION_BUS_ADDRESS")
                .current_dir("/")
                .stdin(Stdio::null());
            cmd.output().unwrap()
        };
        let line = one_reason(&run(false));
        assert!(line.contains("root (uid 0)"), "says whose bus it is: {line}");
        assert!(line.contains(OTHER), "and who was refused: {line}");
        assert!(line.contains("run gpushare-ctl as root"), "says what to do: {line}");
        assert!(line.contains("GPUSHARE_BUS_ADDRESS"), "{line}");
        assert!(!line.contains("is D-Bus running"), "{line}");
        let error = ctl_error(&run(true));
        assert_eq!(error.name, "gpushare.Ctl.Error.AccessDenied", "{error:?}");
    }
}

#[test]
fn man_pages_name_the_bus_variable_and_the_agents_files_signals_and_keys() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(ctl_bin()).args(["generate", "man"]).arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let ctl_page = std::fs::read_to_string(dir.path().join("gpushare-ctl.1")).unwrap();
    assert!(ctl_page.contains("GPUSHARE_BUS_ADDRESS"), "gpushare-ctl(1) names the variable");

    let agent = binary("gpushare-agent", "GPUSHARE_AGENT_BIN");
    let out = Command::new(agent).arg("--generate-man").arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let page = std::fs::read_to_string(dir.path().join("gpushare-agent.8")).unwrap();
    for section in ["OPTIONS", "FILES", "CONFIGURATION", "SIGNALS", "ENVIRONMENT"] {
        assert!(page.contains(&format!(".SH {section}\n")), "no {section}");
    }
    for name in ["SIGHUP", "SIGTERM", "GPUSHARE_LOG", "GPUSHARE_BUS_ADDRESS", "\\-\\-simulate"] {
        assert!(page.contains(name), "gpushare-agent(8) lacks {name}");
    }
    // Every key of the shipped agent.toml (which sets each one) is in the page.
    let shipped =
        std::fs::read_to_string(gpushare_tests::repo_root().join("etc/gpushare/agent.toml"))
            .unwrap();
    let keys: Vec<&str> = shipped
        .lines()
        .map(|l| l.trim_start_matches("# "))
        .filter_map(|l| l.split_once(" = ").map(|(k, _)| k.trim()))
        .filter(|k| k.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .collect();
    assert!(keys.len() >= 20, "{keys:?}");
    for key in keys {
        assert!(page.contains(&format!("\\fB{key} = ")), "gpushare-agent(8) lacks {key}");
    }
}

#[test]
fn the_demos_help_lists_every_model_the_agent_simulates() {
    let demo = gpushare_tests::repo_root().join("scripts/demo");
    let out = Command::new(demo).arg("--help").output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let help = String::from_utf8_lossy(&out.stdout).replace('\n', " ");
    let listed = help.split("Models: ").nth(1).expect("a Models: line");
    let listed: Vec<&str> =
        listed.trim().trim_end_matches('.').split(", ").map(str::trim).collect();
    // The agent's own list: what --simulate refuses an unknown model with.
    let agent = binary("gpushare-agent", "GPUSHARE_AGENT_BIN");
    let out =
        Command::new(agent).args(["--simulate", "no-such-model:1", "--check-driver"]).output();
    let out = out.unwrap();
    let known = String::from_utf8_lossy(&out.stderr).to_string();
    let known: Vec<&str> = known
        .trim()
        .rsplit_once(": ")
        .map(|(_, list)| list.split(", ").collect())
        .unwrap_or_default();
    assert!(known.len() >= 10, "{}", text(&out));
    let mut listed_sorted = listed.clone();
    listed_sorted.sort_unstable();
    let mut known_sorted = known.clone();
    known_sorted.sort_unstable();
    assert_eq!(listed_sorted, known_sorted, "scripts/demo --help lists {listed:?}");
}
