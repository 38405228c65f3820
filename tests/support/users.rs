//! Owns the users and groups the tests make, and their removal (issue 37, item 3): the
//! suite's own ([`ensure_users`]: the `gpushare` group, [`SECRET_GROUP`], [`MEMBER`] in
//! both, [`OTHER`] in neither) or any other [`Accounts`] set.
//!
//! What the suite made is removed when the last test process using it exits, and only
//! that: a user or group that existed before is kept, and a membership the suite added to
//! one is taken back. Test processes may run side by side (several checkouts on one
//! machine), so each set is recorded under `/tmp/gpushare-e2e-accounts/<set>/` (root's,
//! mode 0700): `made`, one line per account or membership the suite added (`group G`,
//! `user U`, `member U G`), and `holders/<pid>`, one file per process using the set. At
//! exit (an `atexit` handler) a process removes its holder file and those of processes
//! that are gone; the last one undoes `made`, newest first, under an exclusive lock of
//! `/tmp/gpushare-e2e-accounts/lock`. What cannot be removed (a process of the user still
//! runs) is said on stderr and stays in `made` for the next run. A test process killed
//! before its exit leaves the set to the next one.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use tempfile::TempDir;

/// A member of the `gpushare` group made for the tests (also in [`SECRET_GROUP`] by its
/// passwd entry).
pub const MEMBER: &str = "gpushare-e2e-member";
/// A user in no group of gpushare's.
pub const OTHER: &str = "gpushare-e2e-other";
/// A group [`MEMBER`]'s passwd entry lists, which a caller may have dropped.
pub const SECRET_GROUP: &str = "gpushare-e2e-secret";
/// The group the package makes, whose members may use the agent.
pub const GPUSHARE_GROUP: &str = "gpushare";

/// Where the sets are recorded (root's: only root makes users).
const REGISTRY: &str = "/tmp/gpushare-e2e-accounts";

/// Users and groups a test needs: made when missing, recorded under `set`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accounts {
    /// The record's name: a plain file name.
    pub set: String,
    /// Groups, made with `groupadd --system` when missing.
    pub groups: Vec<String>,
    /// System users (no home, no login shell), made with `useradd --system` when missing,
    /// each with the supplementary groups listed (added when it is not in them).
    pub users: Vec<(String, Vec<String>)>,
}

impl Accounts {
    /// The suite's accounts: see [`ensure_users`].
    pub fn suite() -> Accounts {
        Accounts {
            set: "suite".into(),
            groups: vec![GPUSHARE_GROUP.into(), SECRET_GROUP.into()],
            users: vec![
                (MEMBER.into(), vec![GPUSHARE_GROUP.into(), SECRET_GROUP.into()]),
                (OTHER.into(), Vec::new()),
            ],
        }
    }
}

/// The gpushare group, [`SECRET_GROUP`] and the users [`MEMBER`] (in both) and [`OTHER`]
/// (in neither), made once per test process when missing and removed at its exit (see
/// the module); needs root.
pub fn ensure_users() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| ensure(&Accounts::suite()));
}

/// The sets this process holds, released at its exit.
static HELD: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Makes what `accounts` lists and is missing, records it, and holds the set until
/// [`release`] or this process's exit; needs root. Panics with the command's output when
/// one fails.
pub fn ensure(accounts: &Accounts) {
    assert!(crate::is_root(), "creating test users needs root");
    let set = &accounts.set;
    assert!(
        !set.is_empty() && !set.contains('/') && !set.starts_with('.'),
        "an account set's name: {set:?}"
    );
    let _lock = Lock::take();
    let dir = Path::new(REGISTRY).join(set);
    std::fs::create_dir_all(dir.join("holders")).unwrap();
    let mut made = Vec::new();
    for group in &accounts.groups {
        if !exists("group", group) {
            run_ok(Command::new("groupadd").args(["--system", group]));
            made.push(format!("group {group}"));
        }
    }
    for (user, groups) in &accounts.users {
        if !exists("passwd", user) {
            run_ok(Command::new("useradd").args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                user,
            ]));
            made.push(format!("user {user}"));
        }
        for group in groups {
            if !members(group).iter().any(|m| m == user) {
                run_ok(Command::new("usermod").args(["--append", "--groups", group, user]));
                made.push(format!("member {user} {group}"));
            }
        }
    }
    let mut file =
        std::fs::OpenOptions::new().create(true).append(true).open(dir.join("made")).unwrap();
    for line in &made {
        writeln!(file, "{line}").unwrap();
    }
    std::fs::write(dir.join("holders").join(std::process::id().to_string()), "").unwrap();
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    if held.is_empty() {
        // atexit through libc, for nix does not wrap it.
        // SAFETY: atexit only stores the pointer to a function that takes no arguments and
        // lives as long as the program; it does not unwind (failures are printed).
        let registered = unsafe { libc::atexit(release_at_exit) } == 0;
        assert!(registered, "atexit failed: the test users could not be removed at exit");
    }
    if !held.contains(set) {
        held.push(set.clone());
    }
}

/// Stops holding `set`; when no live process holds it any more, removes what the suite
/// made of it (see the module). Said on stderr: what could not be removed.
pub fn release(set: &str) {
    HELD.lock().unwrap_or_else(|e| e.into_inner()).retain(|s| s != set);
    release_set(set);
}

extern "C" fn release_at_exit() {
    let sets = match HELD.try_lock() {
        Ok(mut held) => std::mem::take(&mut *held),
        Err(_) => return,
    };
    for set in sets {
        // Nothing may unwind out of an atexit handler.
        let _ = std::panic::catch_unwind(|| release_set(&set));
    }
}

fn release_set(set: &str) {
    let _lock = Lock::take();
    let dir = Path::new(REGISTRY).join(set);
    let holders = dir.join("holders");
    let _ = std::fs::remove_file(holders.join(std::process::id().to_string()));
    let mut live = 0;
    for entry in std::fs::read_dir(&holders).into_iter().flatten().flatten() {
        let pid = entry.file_name();
        if Path::new("/proc").join(&pid).exists() {
            live += 1;
        } else {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    if live > 0 {
        return;
    }
    let made = std::fs::read_to_string(dir.join("made")).unwrap_or_default();
    let mut kept = Vec::new();
    for line in made.lines().rev() {
        if let Err(why) = undo(line) {
            eprintln!("gpushare-tests: {why}");
            kept.push(line);
        }
    }
    if kept.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        kept.reverse();
        let _ = std::fs::write(dir.join("made"), kept.join("\n") + "\n");
    }
}

/// Undoes one line of `made`; `Err` says what is left and why.
fn undo(line: &str) -> Result<(), String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let (command, args): (&str, Vec<&str>) = match words[..] {
        ["member", user, group] if exists("passwd", user) && exists("group", group) => {
            ("gpasswd", vec!["--delete", user, group])
        }
        ["member", ..] => return Ok(()),
        ["user", user] if exists("passwd", user) => ("userdel", vec![user]),
        ["group", group] if exists("group", group) => ("groupdel", vec![group]),
        ["user" | "group", _] => return Ok(()),
        _ => return Err(format!("{REGISTRY}: not understood: {line:?}")),
    };
    let out = Command::new(command)
        .args(&args)
        .output()
        .map_err(|e| format!("{command} {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "{command} {} failed, left as it is: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    // useradd made a group of the user's name (USERGROUPS_ENAB), which userdel leaves
    // when another user is in it.
    if let ["user", user] = words[..]
        && exists("group", user)
    {
        let _ = Command::new("groupdel").arg(user).output();
    }
    Ok(())
}

/// An exclusive lock of the registry, held until dropped.
struct Lock(std::fs::File);

impl Lock {
    fn take() -> Lock {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        let registry = Path::new(REGISTRY);
        let _ = std::fs::DirBuilder::new().mode(0o700).create(registry);
        // /tmp is anyone's: the record must be root's own directory, not a link to one.
        let meta = std::fs::symlink_metadata(registry).unwrap();
        assert!(
            meta.is_dir() && meta.uid() == 0 && meta.permissions().mode() & 0o022 == 0,
            "{REGISTRY} is not a directory root alone may write: remove it"
        );
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(registry.join("lock"))
            .unwrap();
        file.lock().unwrap();
        Lock(file)
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {}", crate::text(&out));
}

/// Whether user (`passwd`) or group (`group`) `name` exists.
pub fn exists(kind: &str, name: &str) -> bool {
    Command::new("getent").args([kind, name]).output().is_ok_and(|o| o.status.success())
}

/// The users listed as members of `group` (its `getent group` entry); none when it does
/// not exist.
pub fn members(group: &str) -> Vec<String> {
    let out = Command::new("getent").args(["group", group]).output().unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    let list = line.trim_end().rsplit(':').next().unwrap_or("");
    list.split(',').filter(|m| !m.is_empty()).map(str::to_string).collect()
}

/// The id of group or user `name` (`getent group|passwd`).
pub fn id_of(kind: &str, name: &str) -> u32 {
    let out = Command::new("getent").args([kind, name]).output().unwrap();
    let line = String::from_utf8(out.stdout).unwrap();
    line.split(':')
        .nth(2)
        .and_then(|id| id.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// A new directory owned by `user`, mode 0755 (its cwd, its state home).
pub fn directory_of(user: &str) -> TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (uid, gid) = (id_of("passwd", user), id_of("group", user));
    std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
    dir
}

/// Where set `set` is recorded (for tests of this module).
pub fn record_of(set: &str) -> PathBuf {
    Path::new(REGISTRY).join(set)
}
