//! Access control on a system-like bus: Debian's dbus-daemon with a system bus's default
//! policy and the package's policy file, the agent as root, gpushare-ctl as root, as a
//! member of the `gpushare` group and as another user. Needs root (to create the test
//! users and to own the name); skipped otherwise.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use gpushare_proto::types::Status;
use gpushare_tests::{
    Bus, CtlError, MEMBER, OTHER, binary, ctl_error, ensure_users, is_root, parse_doc, repo_root,
    text, wait_for,
};

struct Running {
    _bus: Bus,
    agent: Child,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.agent.kill();
        let _ = self.agent.wait();
    }
}

fn start(dir: &Path, include: Option<&Path>) -> (Running, String, PathBuf) {
    let bus = Bus::start_system(include);
    let address = bus.address().to_string();
    let agent = Command::new(binary("gpushare-agent", "GPUSHARE_AGENT_BIN"))
        .args(["--simulate", "a100-40gb:2", "--bus", &address, "--config", "/dev/null"])
        .arg("--state-dir")
        .arg(dir.join("state"))
        .env("GPUSHARE_LOG", "warn")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // gpushare-ctl where every user may run it.
    let ctl = dir.join("gpushare-ctl");
    gpushare_tests::copy_executable(&binary("gpushare-ctl", "GPUSHARE_CTL_BIN"), &ctl);
    let running = Running { _bus: bus, agent };
    wait_for(Duration::from_secs(20), Duration::from_millis(50), || {
        if ctl_as(&ctl, &address, None, &["status"]).status.success() {
            Ok(())
        } else {
            Err("the agent did not come up".into())
        }
    });
    (running, address, ctl)
}

fn ctl_as(ctl: &Path, address: &str, user: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = match user {
        None => Command::new(ctl),
        Some(user) => {
            let mut c = gpushare_tests::as_user(user);
            c.arg(ctl);
            c
        }
    };
    cmd.args(args).env("GPUSHARE_BUS_ADDRESS", address).stdin(Stdio::null());
    // The copy was just written: a child forked meanwhile by another test thread may still
    // hold its write descriptor for a moment (ETXTBSY), so try again briefly.
    for _ in 0..100 {
        match cmd.output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(Duration::from_millis(20));
            }
            result => return result.unwrap(),
        }
    }
    panic!("{ctl:?} stayed busy");
}

/// Every mutating method, as `gpushare-ctl` arguments (a profile file any user can read
/// is written into `dir`).
fn mutating_calls(dir: &Path) -> Vec<Vec<String>> {
    let file = dir.join("p.toml");
    std::fs::write(&file, "[[gpu]]\nselect = 0\nmig = { \"7g\" = 1 }\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let file = file.to_str().unwrap().to_string();
    [
        vec!["apply", "half-balanced"],
        vec!["apply", "-f", &file],
        vec!["mps", "limit", "--pid", "1", "--threads", "10"],
    ]
    .into_iter()
    .map(|args| args.into_iter().map(String::from).collect())
    .collect()
}

/// The JSON error of a call `user` is refused, and its name.
fn refused(ctl: &Path, address: &str, user: &str, args: &[String]) -> CtlError {
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.push("--json");
    let out = ctl_as(ctl, address, Some(user), &args);
    assert!(!out.status.success(), "{args:?}: {}", text(&out));
    ctl_error(&out)
}

fn tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[test]
fn only_root_and_the_gpushare_group_change_the_gpus() {
    if !is_root() {
        gpushare_tests::skip("needs root to create test users and own the bus name");
        return;
    }
    ensure_users();
    let policy = repo_root().join("etc/dbus-1/system.d/io.gpushare.Agent1.conf");

    let dir = tempdir();
    let (_running, address, ctl) = start(dir.path(), Some(&policy));
    let as_user = |user: Option<&str>, args: &[&str]| ctl_as(&ctl, &address, user, args);

    let out = as_user(None, &["apply", "all-balanced"]);
    assert!(out.status.success(), "root: {}", text(&out));
    let out = as_user(Some(MEMBER), &["apply", "all-disabled"]);
    assert!(out.status.success(), "member: {}", text(&out));

    // Another user reads, but every mutating method is refused by the bus policy.
    assert!(as_user(Some(OTHER), &["status"]).status.success());
    assert!(as_user(Some(OTHER), &["plan", "half-balanced"]).status.success());
    assert!(as_user(Some(OTHER), &["profiles"]).status.success());
    for call in mutating_calls(dir.path()) {
        let error = refused(&ctl, &address, OTHER, &call);
        assert_eq!(error.name, "org.freedesktop.DBus.Error.AccessDenied", "{call:?}: {error:?}");
    }
    let status: Status = parse_doc(&as_user(Some(OTHER), &["status", "--json"]), "status --json");
    assert_eq!(status.active_profile.as_deref(), Some("all-disabled"), "nothing changed");
}

#[test]
fn the_agent_refuses_by_itself_when_the_policy_is_missing() {
    if !is_root() {
        gpushare_tests::skip("needs root to create test users and own the bus name");
        return;
    }
    ensure_users();
    let dir = tempdir();
    let (_running, address, ctl) = start(dir.path(), None);
    let as_user = |user: Option<&str>, args: &[&str]| ctl_as(&ctl, &address, user, args);
    for call in mutating_calls(dir.path()) {
        let error = refused(&ctl, &address, OTHER, &call);
        assert_eq!(error.name, "io.gpushare.Agent1.Error.AccessDenied", "{call:?}: {error:?}");
        assert!(
            error.message.contains("needs root or membership in the gpushare group"),
            "{error:?}"
        );
    }
    assert!(as_user(Some(OTHER), &["status"]).status.success());
    let out = as_user(Some(MEMBER), &["apply", "half-balanced"]);
    assert!(out.status.success(), "member: {}", text(&out));
}
