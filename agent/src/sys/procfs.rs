//! What `/proc` tells about processes: whether one is alive, its parent, process group,
//! session, start time and user, the descendants of a process, and which hold a file open.

use std::fs;
use std::path::Path;

/// Whether a process exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Field `n` (numbered from 1 as proc(5) does: 4 the parent, 5 the process group, 6 the
/// session, 22 the start time) of `/proc/PID/stat`, read after the command name in
/// parentheses, which may itself hold spaces and parentheses.
fn stat_field<T: std::str::FromStr>(pid: u32, n: usize) -> Option<T> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    // The state, field 3, is the first after the name.
    rest.split_whitespace().nth(n.checked_sub(3)?)?.parse().ok()
}

/// The parent of `pid`.
pub fn parent(pid: u32) -> Option<u32> {
    stat_field(pid, 4)
}

/// The session of `pid` (the pid of the process that called `setsid`).
pub fn session(pid: u32) -> Option<u32> {
    stat_field(pid, 6)
}

/// When `pid` started, in clock ticks after boot: with the pid, what names one process
/// for good (a reused pid has a later start).
pub fn start_time(pid: u32) -> Option<u64> {
    stat_field(pid, 22)
}

/// Every process id `/proc` shows now.
pub fn pids() -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
}

/// The processes below `root` (its children, theirs, ...), as `/proc` shows them now;
/// `root` itself is not among them.
pub fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> =
        pids().into_iter().filter_map(|pid| Some((pid, parent(pid)?))).collect();
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(pid, _) in parents.iter().filter(|&&(pid, ppid)| ppid == p && pid != root) {
            if !found.contains(&pid) {
                found.push(pid);
                frontier.push(pid);
            }
        }
    }
    found
}

/// The live processes of session `sid` whose real user is `uid`.
pub fn session_members(sid: u32, uid: u32) -> Vec<u32> {
    pids()
        .into_iter()
        .filter(|&pid| session(pid) == Some(sid) && real_user(pid) == Some(uid) && alive(pid))
        .collect()
}

/// The real user of `pid` (the first `Uid:` of `/proc/PID/status`).
pub fn real_user(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().next()?.parse().ok()
}

/// The processes under `proc_root` (a `/proc`) with a file descriptor open on
/// `device_path`, as `(pid, comm)` sorted by pid, leaving out `exclude_pid`. Processes
/// whose descriptors cannot be read (other users', when not root) are not seen.
pub fn holders_of(proc_root: &Path, device_path: &str, exclude_pid: u32) -> Vec<(u32, String)> {
    let Ok(entries) = fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let mut holders: Vec<(u32, String)> = entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            if pid == exclude_pid || !holds(&entry.path(), device_path) {
                return None;
            }
            let comm = fs::read_to_string(entry.path().join("comm"))
                .map(|c| c.trim_end().to_owned())
                .unwrap_or_else(|_| "?".to_owned());
            Some((pid, comm))
        })
        .collect();
    holders.sort_unstable();
    holders
}

/// Whether the process at `pid_dir` (`/proc/<pid>`) has `device_path` open.
fn holds(pid_dir: &Path, device_path: &str) -> bool {
    let Ok(fds) = fs::read_dir(pid_dir.join("fd")) else {
        return false;
    };
    fds.flatten()
        .any(|fd| fs::read_link(fd.path()).is_ok_and(|target| target == Path::new(device_path)))
}

/// What holds `device_path`, for an error's detail: `/dev/nvidia0 is open in PID 4242
/// (python3), …`, or that no other process has it open. `own_pid` is left out: the caller
/// knows what it holds itself (a reset closes the agent's NVML session first).
pub fn holders_sentence(proc_root: &Path, device_path: &str, own_pid: u32) -> String {
    let holders = holders_of(proc_root, device_path, own_pid);
    if holders.is_empty() {
        return format!("no other process has {device_path} open");
    }
    let list: Vec<String> =
        holders.iter().map(|(pid, comm)| format!("PID {pid} ({comm})")).collect();
    format!("{device_path} is open in {}", list.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_and_users_come_from_proc() {
        let me = std::process::id();
        // SAFETY: getsid and getuid have no preconditions.
        let (session, uid) = unsafe { (libc::getsid(0), libc::getuid()) };
        assert_eq!(super::session(me), u32::try_from(session).ok());
        assert_eq!(real_user(me), Some(uid));
        assert_eq!((super::session(u32::MAX), real_user(u32::MAX)), (None, None));
    }

    #[test]
    fn liveness_comes_from_proc() {
        assert!(alive(std::process::id()));
        assert!(!alive(u32::MAX - 1));
    }

    /// A fake `/proc` entry: `fd/<n>` links to each target, and `comm` when given.
    fn fake_process(proc_root: &Path, pid: u32, comm: Option<&str>, fds: &[&Path]) {
        let dir = proc_root.join(pid.to_string());
        fs::create_dir_all(dir.join("fd")).unwrap();
        for (n, target) in fds.iter().enumerate() {
            std::os::unix::fs::symlink(target, dir.join("fd").join(n.to_string())).unwrap();
        }
        if let Some(comm) = comm {
            fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
        }
    }

    #[test]
    fn holders_are_found_on_a_fake_proc_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let proc_root = tmp.path().join("proc");
        let dev = tmp.path().join("dev");
        let node = |n: &str| dev.join(n);
        let gpu0 = node("nvidia0");
        fake_process(&proc_root, 100, Some("python3"), &[Path::new("/dev/null"), &gpu0]);
        // No comm file: the name is unknown.
        fake_process(&proc_root, 42, None, &[&gpu0, &gpu0]);
        // Other device nodes, including one that gpu0's path is a prefix of.
        fake_process(&proc_root, 200, Some("other"), &[&node("nvidia1"), &node("nvidia01")]);
        fake_process(&proc_root, 201, Some("ctl"), &[&node("nvidiactl")]);
        // The agent itself.
        fake_process(&proc_root, 300, Some("gpushare-agent"), &[&gpu0, &node("nvidia2")]);
        // Not processes, or processes without readable descriptors.
        fs::create_dir_all(proc_root.join("500")).unwrap();
        fs::create_dir_all(proc_root.join("self/fd")).unwrap();
        std::os::unix::fs::symlink(&gpu0, proc_root.join("self/fd/3")).unwrap();
        fs::write(proc_root.join("cpuinfo"), "").unwrap();

        let gpu0 = gpu0.to_str().unwrap();
        assert_eq!(
            holders_of(&proc_root, gpu0, 300),
            vec![(42, "?".to_owned()), (100, "python3".to_owned())]
        );
        assert_eq!(
            holders_of(&proc_root, gpu0, 42),
            vec![(100, "python3".to_owned()), (300, "gpushare-agent".to_owned())]
        );
        assert_eq!(
            holders_of(&proc_root, node("nvidia1").to_str().unwrap(), 300),
            vec![(200, "other".to_owned())]
        );
        assert_eq!(
            holders_sentence(&proc_root, gpu0, 300),
            format!("{gpu0} is open in PID 42 (?), PID 100 (python3)")
        );
        let gpu2 = node("nvidia2");
        let gpu2 = gpu2.to_str().unwrap();
        // The agent itself is not named (it closed its NVML session for the reset).
        assert_eq!(
            holders_sentence(&proc_root, gpu2, 300),
            format!("no other process has {gpu2} open")
        );
        let gpu3 = node("nvidia3");
        let gpu3 = gpu3.to_str().unwrap();
        assert_eq!(
            holders_sentence(&proc_root, gpu3, 300),
            format!("no other process has {gpu3} open")
        );
        assert!(holders_of(&tmp.path().join("no-proc"), gpu0, 0).is_empty());
    }

    #[test]
    fn holders_are_found_in_the_real_proc() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let path = file.path().to_str().unwrap();
        let me = std::process::id();
        assert!(holders_of(Path::new("/proc"), path, 0).iter().any(|(pid, _)| *pid == me));
        assert!(!holders_of(Path::new("/proc"), path, me).iter().any(|(pid, _)| *pid == me));
    }
}
