//! cgroup-v2 leaves standing for systemd units, for tests of client attribution (issue
//! 29): the agent reads a process's unit as the last `.service`/`.scope` component of its
//! unified-hierarchy path in `/proc/PID/cgroup`.
//!
//! [`Cgroup::new`] makes `<cgroup2 mount>/gpushare-e2e.slice/<name>-<test pid>.service`
//! (the test process's id in the name: test processes may run side by side), and
//! [`Cgroup::add`] moves a process into it (`cgroup.procs`). On drop the leaf is removed
//! once its processes have exited (after 5 s, those still there are moved to the mount's
//! root cgroup first), and the slice with it when no other leaf is left in it. Leaves of
//! test processes that are gone are removed by the next [`Cgroup::new`].
//!
//! It needs root and a writable cgroup2 hierarchy (a pure cgroup-v2 host, or the
//! `unified` mount of a hybrid one). Without them [`Cgroup::new`] prints why and returns
//! `None`; `GPUSHARE_REQUIRE_CGROUP=1` (set by CI) makes it panic instead.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Set to 1, a missing or read-only cgroup2 hierarchy fails the tests instead of skipping.
pub const REQUIRE_ENV: &str = "GPUSHARE_REQUIRE_CGROUP";
/// The slice every leaf is made in, directly under the cgroup2 mount.
pub const SLICE: &str = "gpushare-e2e.slice";
/// How long a dropped leaf waits for its processes to exit before moving them out.
const EXIT_WAIT: Duration = Duration::from_secs(5);

fn required() -> bool {
    std::env::var_os(REQUIRE_ENV).is_some_and(|v| v == "1")
}

/// Fails the test with `reason` under [`REQUIRE_ENV`], else prints it as a skip.
fn skip(reason: &str) {
    assert!(!required(), "{REQUIRE_ENV}=1: {reason}");
    crate::skip(reason);
}

/// A cgroup-v2 leaf named like a systemd service, removed on drop.
#[derive(Debug)]
pub struct Cgroup {
    mount: PathBuf,
    dir: PathBuf,
    unit: String,
}

impl Cgroup {
    /// The leaf `<name>-<test pid>.service` in [`SLICE`], or `None` after printing why
    /// not (not root, no cgroup2 mount, the hierarchy not writable). Panics instead of
    /// returning `None` when `GPUSHARE_REQUIRE_CGROUP=1`. `name` is a plain file name.
    pub fn new(name: &str) -> Option<Cgroup> {
        assert!(
            !name.is_empty() && !name.contains('/') && !name.starts_with('.'),
            "a cgroup leaf's name: {name:?}"
        );
        if !crate::is_root() {
            skip("cgroup leaves need root");
            return None;
        }
        let Some(mount) = cgroup2_mount() else {
            skip("no cgroup2 hierarchy mounted (/proc/self/mountinfo has no cgroup2)");
            return None;
        };
        let slice = mount.join(SLICE);
        remove_stale_leaves(&slice);
        let unit = format!("{name}-{}.service", std::process::id());
        let dir = slice.join(&unit);
        // Another test process may remove the slice between the two mkdirs: try again.
        let mut made = Err(std::io::Error::other("not tried"));
        for _ in 0..5 {
            made = std::fs::create_dir_all(&dir);
            if made.is_ok() {
                break;
            }
        }
        if let Err(e) = made {
            skip(&format!("cgroup2 hierarchy not writable: mkdir {}: {e}", dir.display()));
            return None;
        }
        Some(Cgroup { mount, dir, unit })
    }

    /// The unit the agent reports for a process in this leaf (`<name>-<pid>.service`).
    pub fn unit(&self) -> &str {
        &self.unit
    }

    /// The leaf's directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Moves process `pid` into the leaf, and checks that `/proc/PID/cgroup` says so.
    pub fn add(&self, pid: u32) {
        let procs = self.dir.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", procs.display()));
        let path = unified_path(pid).unwrap_or_default();
        assert!(
            path.ends_with(&format!("/{SLICE}/{}", self.unit)),
            "process {pid} is in {path:?}, not in {}",
            self.dir.display()
        );
    }

    /// The processes in the leaf.
    pub fn pids(&self) -> Vec<u32> {
        pids_in(&self.dir)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let deadline = Instant::now() + EXIT_WAIT;
        while !pids_in(&self.dir).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        // Those still running go back to the root cgroup: the leaf must go.
        for pid in pids_in(&self.dir) {
            let _ = std::fs::write(self.mount.join("cgroup.procs"), pid.to_string());
        }
        remove_leaf(&self.dir);
        // The slice too, unless another test process has a leaf in it.
        let _ = std::fs::remove_dir(self.mount.join(SLICE));
    }
}

/// The first cgroup2 mount point in `/proc/self/mountinfo`.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|line| {
        // ID PARENT MAJ:MIN ROOT MOUNT-POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
        let (before, after) = line.split_once(" - ")?;
        if after.split(' ').next()? != "cgroup2" {
            return None;
        }
        let point = before.split(' ').nth(4)?;
        // Spaces and the like are octal escapes (\040) in mountinfo.
        Some(PathBuf::from(unescape_mountinfo(point)))
    })
}

fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The unified hierarchy's path of `pid` (the `0::` line of `/proc/PID/cgroup`).
pub fn unified_path(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|l| l.strip_prefix("0::")).map(str::to_string)
}

fn pids_in(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// rmdir of a leaf, tried for a moment: a process that just exited may still be counted.
fn remove_leaf(dir: &Path) {
    for _ in 0..50 {
        match std::fs::remove_dir(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => return,
        }
    }
    eprintln!("cgroup leaf {} left behind: it still has processes", dir.display());
}

/// Removes the leaves of test processes that are gone and have no process left.
fn remove_stale_leaves(slice: &Path) {
    let Ok(entries) = std::fs::read_dir(slice) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(owner) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".service"))
            .and_then(|n| n.rsplit_once('-'))
            .and_then(|(_, pid)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(owner.to_string()).exists() && pids_in(&entry.path()).is_empty()
        {
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_unescaped() {
        assert_eq!(unescape_mountinfo("/sys/fs/cgroup"), "/sys/fs/cgroup");
        assert_eq!(unescape_mountinfo("/mnt/a\\040b\\011c"), "/mnt/a b\tc");
        assert_eq!(unescape_mountinfo("/a\\9b\\"), "/a\\9b\\");
    }

    #[test]
    fn the_unified_path_of_this_process_is_read() {
        if cgroup2_mount().is_some() {
            let path = unified_path(std::process::id()).expect("a 0:: line");
            assert!(path.starts_with('/'), "{path}");
        }
    }
}
