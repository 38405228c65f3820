//! What `/proc` tells about processes: whether one is alive, its parent, process group,
//! session, start time and user, the descendants of a process, and which hold a file open;
//! a process's owner, whether a user may read it as the kernel decides (`hidepid`,
//! `environ`), its command line, cgroup placement (unit, container: only from the cgroups
//! root named, see [`super::mounts`]; a Slurm job's processes: from root's cgroup names or
//! a root-owned step daemon among their ancestors, see [`super::slurmstepd`]) and
//! environment.

use std::fs;
use std::path::{Path, PathBuf};

use gpushare_base::process::Stat;

use super::mounts::CgroupMounts;
use super::slurmstepd;

/// Whether a process still runs: gpushare's one rule, [`gpushare_base::process::alive`]
/// (gone, or a zombie whose every thread has exited, has ended).
pub use gpushare_base::process::alive;

/// The parent of `pid`.
pub fn parent(pid: u32) -> Option<u32> {
    Stat::of(pid).map(|s| s.parent)
}

/// The session of `pid` (the pid of the process that called `setsid`).
pub fn session(pid: u32) -> Option<u32> {
    Stat::of(pid).map(|s| s.session)
}

/// When `pid` started, in clock ticks after boot: with the pid, what names one process
/// for good (a reused pid has a later start).
pub fn start_time(pid: u32) -> Option<u64> {
    Stat::of(pid).map(|s| s.start_time)
}

/// Every process id `/proc` shows now.
pub fn pids() -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
}

/// Whether root runs the program `name` now (a daemon, `slurmd`): a live process whose
/// real and effective user are root and whose name is `name` (the name it was started by:
/// Debian's `slurmd` is a link to `slurmd-wlm`), running a file root owns and no one else
/// may write. No other user can make such a process.
pub fn root_runs(name: &str) -> bool {
    let proc_root = Path::new("/proc");
    pids().into_iter().any(|pid| {
        let Some(process) = Process::open(proc_root, pid) else { return false };
        let runs = process.owner().is_some_and(|o| o.roots_named(name) && !o.exited);
        runs && process.program().is_some_and(|p| p.uid == 0 && !p.writable_by_others)
    })
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

/// The live processes of session `sid` whose real user is `uid` (each `stat` read once).
pub fn session_members(sid: u32, uid: u32) -> Vec<u32> {
    pids()
        .into_iter()
        .filter(|&pid| {
            Stat::of(pid).is_some_and(|s| s.session == sid && !s.ended())
                && real_user(pid) == Some(uid)
        })
        .collect()
}

/// Whether `pid` still runs and is the process that started at `start_time` (its `stat`
/// read once): a pid reused by another process does not count.
pub fn runs_since(pid: u32, start_time: u64) -> bool {
    Stat::of(pid).is_some_and(|s| !s.ended() && s.start_time == start_time)
}

/// One process for good: its pid and when it started (a process that takes the pid later
/// is another). Kept in records as `{"pid": …, "start_time": …}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcessIdentity {
    /// Its pid.
    pub pid: u32,
    /// Its start time (clock ticks after boot, `/proc/PID/stat`).
    pub start_time: u64,
}

impl ProcessIdentity {
    /// `pid` as it runs now; `None` when it has no start time to read (it has ended).
    pub fn of(pid: u32) -> Option<ProcessIdentity> {
        start_time(pid).map(|start_time| ProcessIdentity { pid, start_time })
    }

    /// Whether this process still runs (the pid names the same process).
    pub fn runs(&self) -> bool {
        runs_since(self.pid, self.start_time)
    }
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

/// At most `max` bytes of the file at `path` (a `/proc` file may be of any size).
fn read_bounded(path: &Path, max: u64) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    fs::File::open(path).ok()?.take(max).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// One process's `/proc/PID` directory, held open: every file read through it is that
/// process's. Should the process end and its PID be taken by another between two reads,
/// the kernel answers the later ones with an error instead of the newcomer's files, so a
/// client's user, command line, unit and environment are never two processes' mixed.
#[derive(Debug)]
pub struct Process {
    /// The open directory; `files` reaches through it.
    _dir: fs::File,
    /// `/proc/self/fd/N`: the open directory, by its descriptor.
    files: PathBuf,
}

impl Process {
    /// `pid` under `proc_root` (a `/proc`); `None` when it has gone.
    pub fn open(proc_root: &Path, pid: u32) -> Option<Process> {
        use std::os::fd::AsRawFd;
        let dir = fs::File::open(proc_root.join(pid.to_string())).ok()?;
        let files = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
        Some(Process { _dir: dir, files })
    }

    fn file(&self, name: &str) -> PathBuf {
        self.files.join(name)
    }
}

/// A process as `/proc/PID/status` names it: its command name (`comm`, at most 15 bytes)
/// and real user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// `Name:` (which the process may set itself: never proof of what it runs), control
    /// characters as `?` (the kernel passes ESC through).
    pub name: String,
    /// The first `Uid:`.
    pub uid: u32,
    /// `PPid:`.
    pub parent: Option<u32>,
    /// The four of `Uid:`: real, effective, saved and filesystem.
    pub uids: [u32; 4],
    /// Whether it has exited, every thread of it, and only awaits its parent: `State: Z`
    /// with one thread. A main thread that ended with `pthread_exit` leaves the process a
    /// zombie too, but its other threads still run (and hold the GPU).
    pub exited: bool,
}

impl Owner {
    /// Whether it runs as root (real and effective user) under the name `name`: what no
    /// other user can make (a user names their own processes as they like).
    pub fn roots_named(&self, name: &str) -> bool {
        self.uids[..2] == [0, 0] && self.name == name
    }
}

/// The program a process runs, as `/proc/PID/exe` shows it: only the kernel sets that
/// link, but the file's name is whatever its owner named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// The file's name (without the ` (deleted)` of one replaced on disk).
    pub name: String,
    /// The file's owner.
    pub uid: u32,
    /// Whether its group or anyone may write it.
    pub writable_by_others: bool,
}

impl Process {
    /// Its name, real user, parent and state; `None` when it has gone.
    pub fn owner(&self) -> Option<Owner> {
        let status = read_bounded(&self.file("status"), 16 * 1024)?;
        let status = String::from_utf8_lossy(&status);
        let field = |key: &str| status.lines().find_map(|l| l.strip_prefix(key)).map(str::trim);
        let ids: Vec<u32> =
            field("Uid:")?.split_whitespace().map(str::parse).collect::<Result<_, _>>().ok()?;
        let uid = *ids.first()?;
        let uids = [0, 1, 2, 3].map(|i| ids.get(i).copied().unwrap_or(uid));
        // `status` rather than `stat` (read by pid): through the directory held open, so
        // that the state is this process's; the rule is the one of every reader.
        let state = field("State:").and_then(|s| s.chars().next()).unwrap_or('R');
        let threads: u32 = field("Threads:").and_then(|t| t.parse().ok()).unwrap_or(1);
        Some(Owner {
            name: printable(field("Name:").unwrap_or_default()),
            uid,
            parent: field("PPid:").and_then(|p| p.parse().ok()),
            uids,
            exited: gpushare_base::process::has_ended(state, threads),
        })
    }

    /// Whether user `uid` (not root) may read this process's `/proc` files as the kernel
    /// decides for `hidepid` and for `environ` (ptrace's read check): its real, effective
    /// and saved users are `uid`, and its directory is `uid`'s (the kernel gives the
    /// directory to root when the process may not be dumped: a setuid program, one that
    /// said `PR_SET_DUMPABLE` 0). The kernel also compares the groups, which the agent
    /// does not know of a caller: a process of the caller's running setgid is taken as
    /// theirs.
    pub fn readable_by(&self, owner: &Owner, uid: u32) -> bool {
        use std::os::unix::fs::MetadataExt;
        owner.uids[..3].iter().all(|&u| u == uid)
            && self._dir.metadata().is_ok_and(|m| m.uid() == uid)
    }

    /// The program it runs; `None` when that cannot be read.
    pub fn program(&self) -> Option<Program> {
        use std::os::unix::fs::MetadataExt;
        let exe = self.file("exe");
        let target = fs::read_link(&exe).ok()?;
        let name = target.file_name()?.to_string_lossy();
        // The running file itself, also when it was replaced or removed on disk.
        let file = fs::metadata(&exe).ok()?;
        Some(Program {
            name: name.strip_suffix(" (deleted)").unwrap_or(&name).to_string(),
            uid: file.uid(),
            writable_by_others: file.mode() & 0o022 != 0,
        })
    }

    /// Its command line: the arguments joined by spaces, control characters as spaces, cut
    /// to at most `max` bytes (on a character boundary, ending in `…` when cut); `None`
    /// when it cannot be read or is empty (a kernel thread, a zombie).
    pub fn command_line(&self, max: usize) -> Option<String> {
        let bytes = read_bounded(
            &self.file("cmdline"),
            u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1),
        )?;
        let cut = bytes.len() > max;
        let bytes = &bytes[..bytes.len().min(max)];
        let text = String::from_utf8_lossy(bytes);
        let mut line: String = text
            .chars()
            .map(|c| if c == '\0' || super::text::misleading(c) { ' ' } else { c })
            .collect();
        if cut {
            // A lossy character may have grown the text: cut it on a boundary.
            while line.len() > max.saturating_sub('…'.len_utf8()) {
                line.pop();
            }
            line.push('…');
        }
        let line = line.trim_end().to_string();
        (!line.is_empty()).then_some(line)
    }

    /// The unit and the container (the first 12 hex digits of its id) it runs in, from its
    /// cgroup path, believing only the cgroups root named in `cgroups`
    /// ([`placement_of_cgroup`]). The unit of a Slurm job's process is the job's
    /// ([`slurmstepd::unit`]): from a job's cgroup that root named ([`slurm_job_of_cgroup`]),
    /// else from its ancestors under `proc_root` ([`Process::slurm_job`]); else the systemd
    /// unit.
    pub fn placement(
        &self,
        proc_root: &Path,
        cgroups: &CgroupMounts,
    ) -> (Option<String>, Option<String>) {
        let text = read_bounded(&self.file("cgroup"), 16 * 1024)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default();
        let named_by_root = |c: &str, p: &str| cgroups.named_by_root(c, p);
        let (unit, container) = placement_of_cgroup(&text, &named_by_root);
        let job = slurm_job_of_cgroup(&text, &named_by_root).or_else(|| self.slurm_job(proc_root));
        (job.map(slurmstepd::unit).or(unit), container)
    }

    /// When it started, in clock ticks after boot (its `stat`, through the directory held).
    fn start_time(&self) -> Option<u64> {
        let stat = read_bounded(&self.file("stat"), 4096)?;
        Stat::parse(&String::from_utf8_lossy(&stat)).map(|s| s.start_time)
    }

    /// Its first argument (up to the first NUL, at most 256 bytes); `None` when unreadable.
    fn first_argument(&self) -> Option<String> {
        let bytes = read_bounded(&self.file("cmdline"), 256)?;
        let first = bytes.split(|&b| b == 0).next()?;
        Some(String::from_utf8_lossy(first).into_owned())
    }

    /// The Slurm job it runs in, as its ancestors under `proc_root` say (the nearest
    /// [`ANCESTORS_MAX`], read-only): the nearest that runs as root (real and effective
    /// user 0) under the name `slurmstepd` decides, by its command line
    /// ([`slurmstepd::job_of_command_line`]). Only root makes such a process, and only
    /// root may rename it; a user's own processes (this one, its parents of theirs) may
    /// take any name and any environment (`SLURM_JOB_ID`), so neither is asked. An
    /// ancestor that started after the process below it is a newcomer on a PID reused:
    /// nothing is believed past it.
    pub fn slurm_job(&self, proc_root: &Path) -> Option<u32> {
        let mut parent = self.owner()?.parent;
        let mut started = self.start_time()?;
        for _ in 0..ANCESTORS_MAX {
            let ancestor = Process::open(proc_root, parent.filter(|&p| p != 0)?)?;
            let (owner, since) = (ancestor.owner()?, ancestor.start_time()?);
            if since > started {
                return None;
            }
            if owner.roots_named(slurmstepd::COMM) {
                return slurmstepd::job_of_command_line(&ancestor.first_argument()?);
            }
            (parent, started) = (owner.parent, since);
        }
        None
    }

    /// The value of variable `name` in the environment it started with (its first 64 KiB;
    /// readable by root and the process's own user only).
    pub fn environment_variable(&self, name: &str) -> Option<String> {
        let environ = read_bounded(&self.file("environ"), 64 * 1024)?;
        environ.split(|&b| b == 0).find_map(|entry| {
            let value = entry.strip_prefix(name.as_bytes())?.strip_prefix(b"=")?;
            Some(String::from_utf8_lossy(value).into_owned())
        })
    }
}

/// The most ancestors of a process looked at for a Slurm step daemon
/// ([`Process::slurm_job`]).
const ANCESTORS_MAX: usize = 64;

/// The lines of a `/proc/PID/cgroup` text, one a hierarchy: `(controllers, path)`.
fn hierarchies(text: &str) -> Vec<(&str, &str)> {
    // ID:CONTROLLERS:PATH; the unified hierarchy's has no controllers.
    text.lines()
        .filter_map(|l| {
            let mut fields = l.splitn(3, ':');
            fields.next()?;
            Some((fields.next()?, fields.next()?))
        })
        .collect()
}

/// The leading components of the cgroup `path` of hierarchy `controllers` that root named
/// (see [`placement_of_cgroup`]).
fn believed(
    (controllers, path): (&str, &str),
    named_by_root: &dyn Fn(&str, &str) -> usize,
) -> Vec<String> {
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    // Nothing to ask of a cgroup at the root.
    let named = if components.is_empty() { 0 } else { named_by_root(controllers, path) };
    components[..named.min(components.len())].iter().map(|c| c.to_string()).collect()
}

/// The Slurm job of a `/proc/PID/cgroup` text (`proctrack/cgroup`): a job's cgroup
/// ([`slurmstepd::job_of_cgroup`]) in any hierarchy, among the names root gave alone. A
/// user may name cgroups below a delegation (v1 Slurm hands a job's user its `uid_<uid>`
/// directory), and a `job_99` there is theirs: not believed.
pub fn slurm_job_of_cgroup(text: &str, named_by_root: &dyn Fn(&str, &str) -> usize) -> Option<u32> {
    hierarchies(text)
        .into_iter()
        .find_map(|line| slurmstepd::job_of_cgroup(&believed(line, named_by_root)))
}

/// [`Process::placement`] of a `/proc/PID/cgroup` text, where `named_by_root(controllers,
/// path)` says how many leading components of a hierarchy's path root named (see
/// [`CgroupMounts::named_by_root`]): only those are believed. Below a delegation
/// (`user@UID.service`, a service with `Delegate=` and `User=`) the names are the
/// delegate's: the unit shown is the delegated one, and no container is found there. The
/// unit comes from systemd's own hierarchy where there is one besides the unified one
/// (`name=systemd`, a hybrid or v1 host), else from the unified one (`0::`): the last
/// believed component ending in `.service` or `.scope` that is not a container's own
/// scope. A container is a believed component holding 64 hex digits (`docker-<id>.scope`,
/// `libpod-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`, or the id alone
/// under cgroupfs drivers), looked for in that path first, then in every other
/// hierarchy's: Docker's cgroupfs driver on a hybrid host puts a container in the v1
/// hierarchies only, and leaves it in containerd's unit in the unified one.
pub fn placement_of_cgroup(
    text: &str,
    named_by_root: &dyn Fn(&str, &str) -> usize,
) -> (Option<String>, Option<String>) {
    let lines = hierarchies(text);
    let unified = lines.iter().find(|(c, _)| c.is_empty());
    let systemd = lines.iter().find(|(c, p)| *c == "name=systemd" && *p != "/");
    let main: Vec<String> =
        systemd.or(unified).map(|&l| believed(l, named_by_root)).unwrap_or_default();
    let container = std::iter::once(main.clone())
        .chain(lines.iter().map(|&l| believed(l, named_by_root)))
        .find_map(|components: Vec<String>| components.iter().rev().find_map(|c| container_id(c)));
    let unit = main
        .iter()
        .rev()
        .find(|c| container_id(c).is_none() && (c.ends_with(".service") || c.ends_with(".scope")))
        .map(|c| printable(c));
    (unit, container)
}

/// The most characters of a unit name shown (the kernel's limit for a cgroup name).
const UNIT_MAX_CHARS: usize = 255;

/// A cgroup name as it may be shown: a user names its own cgroups (systemd delegates
/// `user@UID.service`), and the kernel refuses only `/` and newlines in them, so control
/// characters (a terminal's escape sequences) become `?` and the name is cut at 255.
fn printable(name: &str) -> String {
    super::text::printable(name, UNIT_MAX_CHARS)
}

/// The first 12 hex digits of the 64-digit container id in a cgroup path component.
fn container_id(component: &str) -> Option<String> {
    let stem = component.strip_suffix(".scope").unwrap_or(component);
    let id = stem.rsplit('-').next().unwrap_or(stem);
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id[..12].to_string())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn a_process_identity_is_this_process_until_it_ends_and_reads_as_records_keep_it() {
        let me = ProcessIdentity::of(std::process::id()).expect("this process's start time");
        assert!(me.runs());
        assert!(!ProcessIdentity { start_time: me.start_time + 1, ..me }.runs(), "another");
        let json = serde_json::to_value(me).unwrap();
        assert_eq!(json, serde_json::json!({"pid": me.pid, "start_time": me.start_time}));
        assert_eq!(serde_json::from_value::<ProcessIdentity>(json).unwrap(), me);
    }

    #[test]
    fn sessions_and_users_come_from_proc() {
        let me = std::process::id();
        let session = nix::unistd::getsid(None).unwrap().as_raw();
        assert_eq!(super::session(me), u32::try_from(session).ok());
        assert_eq!(real_user(me), Some(nix::unistd::getuid().as_raw()));
        assert_eq!((super::session(u32::MAX), real_user(u32::MAX)), (None, None));
    }

    #[test]
    fn a_daemon_runs_where_root_runs_its_own_file() {
        assert!(!root_runs("no-such-daemon"));
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: a root-owned process needs root");
            return;
        }
        // A copy of sleep under another name, root's: found while it runs, not after.
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("gpushare-d");
        fs::copy("/bin/sleep", &copy).unwrap();
        let mut child = std::process::Command::new(&copy).arg("30").spawn().unwrap();
        let seen = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            root_runs("gpushare-d")
        });
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(seen);
        assert!(!root_runs("gpushare-d"));
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

    #[test]
    fn units_and_containers_come_from_the_cgroup_path() {
        let id = "0123456789abcdef".repeat(4);
        let cases = [
            ("0::/system.slice/ollama.service\n", Some("ollama.service"), None),
            (
                "0::/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope\n",
                Some("run-r1.scope"),
                None,
            ),
            (&*format!("0::/system.slice/docker-{id}.scope\n"), None, Some("0123456789ab")),
            (
                &*format!("0::/machine.slice/libpod-{id}.scope/container\n"),
                None,
                Some("0123456789ab"),
            ),
            (
                &*format!("0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{id}.scope\n"),
                None,
                Some("0123456789ab"),
            ),
            (
                &*format!("12:cpu:/docker/{id}\n1:name=systemd:/docker/{id}\n"),
                None,
                Some("0123456789ab"),
            ),
            ("0::/\n", None, None),
            ("", None, None),
            // Hybrid hosts: systemd's own hierarchy names the unit; Docker's cgroupfs
            // driver names the container in the v1 hierarchies only.
            (
                "12:cpu:/h.slice/train-job.service\n1:name=systemd:/h.slice/train-job.service\n0::/\n",
                Some("train-job.service"),
                None,
            ),
            (
                &*format!("9:name=systemd:/docker/{id}\n0::/system.slice/containerd.service\n"),
                None,
                Some("0123456789ab"),
            ),
            (
                &*format!(
                    "4:memory:/docker/{id}\n1:name=systemd:/system.slice/containerd.service\n0::/system.slice/containerd.service\n"
                ),
                Some("containerd.service"),
                Some("0123456789ab"),
            ),
            // A user's own cgroup names reach a root's terminal: no escape sequences.
            (
                "0::/user.slice/user@1000.service/\u{1b}]0;owned\u{7}x.scope\n",
                Some("?]0;owned?x.scope"),
                None,
            ),
            // Nor text turned around to read as someone else's.
            (
                "0::/user.slice/user@1000.service/\u{202E}ecivres.allo\u{200B}.scope\n",
                Some("?ecivres.allo?.scope"),
                None,
            ),
        ];
        // Every name believed (root named them all).
        for (text, unit, container) in cases {
            let (u, c) = placement_of_cgroup(text, &|_, _| usize::MAX);
            assert_eq!((u.as_deref(), c.as_deref()), (unit, container), "{text}");
        }
    }

    /// Below a delegated cgroup (its directory another user's) the names are that user's:
    /// a `docker-<id>.scope` or `sshd.service` of theirs is neither a container nor a
    /// system unit; the unit shown is the delegated one.
    #[test]
    fn names_below_a_delegation_are_not_believed() {
        let id = "0123456789abcdef".repeat(4);
        let delegated = "/user.slice/user-1000.slice/user@1000.service";
        // Root named the components down to user@1000.service (3), its owner the rest.
        let user_named = |_: &str, path: &str| {
            if path.starts_with(delegated) { 3 } else { usize::MAX }
        };
        for (below, unit) in [
            (format!("/docker-{id}.scope"), "user@1000.service"),
            ("/sshd.service".to_string(), "user@1000.service"),
            (format!("/app.slice/libpod-{id}.scope/container"), "user@1000.service"),
            ("/app.slice/run-r1.scope".to_string(), "user@1000.service"),
        ] {
            let text = format!("0::{delegated}{below}\n");
            let (u, c) = placement_of_cgroup(&text, &user_named);
            assert_eq!((u.as_deref(), c.as_deref()), (Some(unit), None), "{text}");
        }
        // A v1 hierarchy's path is judged on its own: a user's there is not believed either.
        let text = format!("4:memory:{delegated}/docker/{id}\n0::/system.slice/sshd.service\n");
        let (u, c) = placement_of_cgroup(&text, &user_named);
        assert_eq!((u.as_deref(), c.as_deref()), (Some("sshd.service"), None));
        // Root's own (a system container, a session scope) are believed.
        let text = format!("0::/system.slice/docker-{id}.scope\n");
        let (_, c) = placement_of_cgroup(&text, &user_named);
        assert_eq!(c.as_deref(), Some("0123456789ab"));
        // Nothing believed (the hierarchy not mounted here): nothing shown.
        let (u, c) = placement_of_cgroup(&text, &|_, _| 0);
        assert_eq!((u, c), (None, None));
        // A real cgroup tree: a directory another user owns is a delegation.
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir_all(tmp.path().join("system.slice/sshd.service")).unwrap();
        let me = super::super::unix::effective_uid();
        let text = "0::/system.slice/sshd.service\n";
        let mine = CgroupMounts::for_tests(tmp.path(), me);
        let (u, _) = placement_of_cgroup(text, &|c, p| mine.named_by_root(c, p));
        assert_eq!(u.as_deref(), Some("sshd.service"));
        let theirs = CgroupMounts::for_tests(tmp.path(), me.wrapping_add(1));
        let (u, _) = placement_of_cgroup(text, &|c, p| theirs.named_by_root(c, p));
        assert_eq!(u, None, "the mount's root named by another: nothing believed");
    }

    /// A fake `/proc/PID` for the Slurm tests: its status (name, parent, the four users),
    /// its stat (start time), its command line and its cgroup.
    fn fake_slurm_process(
        proc_root: &Path,
        pid: u32,
        (name, parent, uids): (&str, u32, [u32; 4]),
        start: u64,
        cmdline: &[u8],
        cgroup: &str,
    ) {
        let dir = proc_root.join(pid.to_string());
        fs::create_dir_all(&dir).unwrap();
        let [r, e, s, f] = uids;
        let status =
            format!("Name:\t{name}\nState:\tS\nPPid:\t{parent}\nUid:\t{r}\t{e}\t{s}\t{f}\n");
        fs::write(dir.join("status"), status).unwrap();
        let stat = format!(
            "{pid} ({name}) S {parent} {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start}"
        );
        fs::write(dir.join("stat"), stat).unwrap();
        fs::write(dir.join("cmdline"), cmdline).unwrap();
        fs::write(dir.join("cgroup"), cgroup).unwrap();
    }

    /// Issue 41: a client below a root-owned `slurmstepd: [JOB.STEP]` runs in that job; a
    /// process that only takes the name (a user's own, or a setuid program's, whose real
    /// user is the caller) makes no job, nor does a PID reused by a later process, nor a
    /// chain of parents past the bound.
    #[test]
    fn a_slurm_job_is_a_root_step_daemon_among_the_ancestors() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let user = [1000; 4];
        let job_of = |stepd: (&str, [u32; 4]), stepd_start: u64, cmdline: &[u8]| {
            let _ = fs::remove_dir_all(root);
            fake_slurm_process(root, 1, ("systemd", 0, [0; 4]), 1, b"/sbin/init\0", "0::/\n");
            fake_slurm_process(root, 20, (stepd.0, 1, stepd.1), stepd_start, cmdline, "0::/\n");
            // The task: a shell, then the client (user-named to look like anything).
            fake_slurm_process(root, 21, ("sh", 20, user), 60, b"sh\0", "0::/\n");
            let fake = b"slurmstepd: [99.0]\0";
            fake_slurm_process(root, 22, ("slurmstepd", 21, user), 61, fake, "0::/\n");
            Process::open(root, 22).unwrap().slurm_job(root)
        };
        let real = ("slurmstepd", [0; 4]);
        assert_eq!(job_of(real, 50, b"slurmstepd: [12.0]\0\0\0"), Some(12));
        assert_eq!(job_of(real, 50, b"slurmstepd: [12.batch]\0"), Some(12));
        assert_eq!(job_of(real, 50, b"slurmstepd: [12.extern]\0-x\0"), Some(12));
        // A step daemon not yet renamed, or another title: no job (and no looking further).
        assert_eq!(job_of(real, 50, b"/usr/sbin/slurmstepd\0"), None);
        assert_eq!(job_of(real, 50, b"slurmstepd: [12.0] x\0"), None);
        // Only a user's: the name and command line are theirs to choose.
        assert_eq!(job_of(("slurmstepd", user), 50, b"slurmstepd: [12.0]\0"), None);
        // A setuid program's: effective root, real user the caller's.
        assert_eq!(job_of(("slurmstepd", [1000, 0, 0, 0]), 50, b"slurmstepd: [12.0]\0"), None);
        // Root's, by another name.
        assert_eq!(job_of(("sshd", [0; 4]), 50, b"slurmstepd: [12.0]\0"), None);
        // The parent's PID taken by a later step daemon: not the task's parent.
        assert_eq!(job_of(real, 70, b"slurmstepd: [12.0]\0"), None);

        // A chain of parents: found within the bound, not past it, nor round a loop.
        let _ = fs::remove_dir_all(root);
        let stepd = ("slurmstepd", 0, [0; 4]);
        fake_slurm_process(root, 1000, stepd, 1, b"slurmstepd: [7.0]\0", "0::/\n");
        for pid in 1001..1100 {
            fake_slurm_process(root, pid, ("sh", pid - 1, user), 2, b"sh\0", "0::/\n");
        }
        let job = |pid: u32| Process::open(root, pid).unwrap().slurm_job(root);
        assert_eq!(job(1001 + ANCESTORS_MAX as u32 - 1), Some(7));
        assert_eq!(job(1001 + ANCESTORS_MAX as u32), None);
        fake_slurm_process(root, 5, ("sh", 5, user), 2, b"sh\0", "0::/\n");
        assert_eq!(job(5), None);
    }

    /// Issue 41: the unit of a job's process is the job's: from a cgroup of Slurm's that
    /// root named first (`proctrack/cgroup`), else from the ancestors; a `job_99` a user
    /// named below a delegation is not believed.
    #[test]
    fn a_slurm_jobs_unit_comes_from_roots_cgroup_then_the_ancestors() {
        let tmp = tempfile::tempdir().unwrap();
        let (proc_root, cgroups) = (tmp.path().join("proc"), tmp.path().join("cgroup"));
        let step = "system.slice/slurmstepd.scope/job_12/step_0/user/task_0";
        fs::create_dir_all(cgroups.join(step)).unwrap();
        fs::create_dir_all(cgroups.join("system.slice/slurmd.service")).unwrap();
        let me = super::super::unix::effective_uid();
        let mounts = CgroupMounts::for_tests(&cgroups, me);
        let stepd = ("slurmstepd", 1, [0; 4]);
        fake_slurm_process(&proc_root, 1, ("systemd", 0, [0; 4]), 1, b"init\0", "0::/\n");
        fake_slurm_process(&proc_root, 20, stepd, 5, b"slurmstepd: [7.0]\0", "0::/\n");
        let client = |parent: u32, cgroup: &str| {
            let name = ("python3", parent, [1000; 4]);
            fake_slurm_process(&proc_root, 30, name, 9, b"python3\0", &format!("0::/{cgroup}\n"));
            Process::open(&proc_root, 30).unwrap().placement(&proc_root, &mounts).0
        };
        let unit = |u: &str| Some(u.to_string());
        // proctrack/cgroup: the cgroup says so, whoever the parents are.
        assert_eq!(client(1, step), unit("slurm-job-12"));
        assert_eq!(client(20, step), unit("slurm-job-12"));
        // proctrack/linuxproc: slurmd's cgroup, and the step daemon among the parents.
        assert_eq!(client(20, "system.slice/slurmd.service"), unit("slurm-job-7"));
        assert_eq!(client(1, "system.slice/slurmd.service"), unit("slurmd.service"));
        // A user's own cgroups named like a job's (below a delegation): not believed.
        let delegated = CgroupMounts::for_tests(&cgroups, me.wrapping_add(1));
        let by_user = |c: &str, p: &str| match p.starts_with("/user.slice/user@1000.service") {
            true => 2,
            false => mounts.named_by_root(c, p),
        };
        let text = "0::/user.slice/user@1000.service/slurmstepd.scope/job_99\n";
        assert_eq!(slurm_job_of_cgroup(text, &by_user), None);
        assert_eq!(slurm_job_of_cgroup(&format!("0::/{step}\n"), &by_user), Some(12));
        assert_eq!(slurm_job_of_cgroup(&format!("0::/{step}\n"), &|_, _| 0), None);
        let name = ("python3", 20, [1000; 4]);
        fake_slurm_process(&proc_root, 31, name, 9, b"x\0", &format!("0::/{step}\n"));
        let placed = Process::open(&proc_root, 31).unwrap().placement(&proc_root, &delegated);
        assert_eq!(placed.0, unit("slurm-job-7"), "the cgroup root's not root's: the parents");
    }

    #[test]
    fn owners_command_lines_and_environments_are_read_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("7");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("status"), "Name:\tpython3\nState:\tS\nUid:\t1000\t1000\t1000\t1000\n")
            .unwrap();
        fs::write(dir.join("cmdline"), b"python3\0train.py\0--lr\0").unwrap();
        fs::write(dir.join("environ"), b"A=1\0CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20\0").unwrap();
        let process = Process::open(tmp.path(), 7).unwrap();
        let uids = [1000; 4];
        let owner = Owner { name: "python3".into(), uid: 1000, parent: None, uids, exited: false };
        assert_eq!(process.owner(), Some(owner));
        fs::write(dir.join("status"), "Name:\tx\nState:\tZ (zombie)\nPPid:\t1\nUid:\t0\t0\t0\t0\n")
            .unwrap();
        let zombie =
            Owner { name: "x".into(), uid: 0, parent: Some(1), uids: [0; 4], exited: true };
        assert_eq!(process.owner(), Some(zombie));
        // A main thread gone with pthread_exit while another runs on: a zombie, not exited.
        let status = "Name:\t\x1b]0;pwned\x07\nState:\tZ (zombie)\nThreads:\t2\nUid:\t0\t0\t0\t0\n";
        fs::write(dir.join("status"), status).unwrap();
        let running =
            Owner { name: "?]0;pwned?".into(), uid: 0, parent: None, uids: [0; 4], exited: false };
        assert_eq!(process.owner(), Some(running));
        fs::write(dir.join("status"), "Name:\tpython3\nState:\tS\nUid:\t1000\t1000\t1000\t1000\n")
            .unwrap();
        // A setuid program's effective user is not the caller's: not readable by them.
        fs::write(dir.join("status"), "Name:\tsu\nState:\tS\nUid:\t1000\t0\t1000\t1000\n").unwrap();
        let setuid = process.owner().unwrap();
        assert_eq!((setuid.uid, setuid.uids), (1000, [1000, 0, 1000, 1000]));
        let dir_owner = fs::metadata(&dir).unwrap().uid();
        assert!(!process.readable_by(&setuid, 1000) && !process.readable_by(&setuid, dir_owner));
        fs::write(dir.join("status"), "Name:\tpython3\nState:\tS\nUid:\t1000\t1000\t1000\t1000\n")
            .unwrap();
        let me = std::process::id();
        let myself = Process::open(Path::new("/proc"), me).unwrap();
        let my_owner = myself.owner().unwrap();
        let uid = super::super::unix::effective_uid();
        assert!(myself.readable_by(&my_owner, uid), "{my_owner:?}");
        assert!(!myself.readable_by(&my_owner, uid.wrapping_add(1)));
        let mine = myself.program().unwrap();
        assert_eq!(mine.uid, fs::metadata(std::env::current_exe().unwrap()).unwrap().uid());
        assert_eq!(process.program(), None);
        assert_eq!(process.command_line(256).as_deref(), Some("python3 train.py --lr"));
        assert_eq!(process.command_line(10).as_deref(), Some("python3…"));
        let var = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
        assert_eq!(process.environment_variable(var).as_deref(), Some("20"));
        assert_eq!(process.environment_variable("CUDA"), None);
        assert!(Process::open(tmp.path(), 8).is_none());
        let proc_root = Path::new("/proc");
        let myself = Process::open(proc_root, me).unwrap();
        assert_eq!(myself.owner().map(|o| o.uid), real_user(me));
        assert!(myself.command_line(256).is_some());
    }

    #[test]
    fn a_process_handle_reads_that_process_only() {
        // The directory replaced under the same name (a PID taken by another process):
        // the handle still reads the first one's files, never the newcomer's.
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("7");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("cmdline"), b"first\0").unwrap();
        let process = Process::open(tmp.path(), 7).unwrap();
        fs::rename(&dir, tmp.path().join("gone")).unwrap();
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("cmdline"), b"newcomer\0").unwrap();
        assert_eq!(process.command_line(64).as_deref(), Some("first"));
        // A real process that ends: its handle reads nothing more.
        let mut child = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        let process = Process::open(Path::new("/proc"), child.id()).unwrap();
        // spawn returns once exec has begun, before the new program's arguments are in place.
        let started = std::time::Instant::now();
        while process.command_line(64).is_none() && started.elapsed().as_secs() < 10 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(process.command_line(64).as_deref(), Some("sleep 60"));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!((process.owner(), process.command_line(64)), (None, None));
    }

    /// Issue 39: one liveness rule. A process whose main thread ended with `pthread_exit`
    /// is a zombie leader whose other threads run on (and may hold a GPU): `alive` said it
    /// had ended, while the client table (`Owner::exited`) and the simulated driver said it
    /// runs. Every reader now says it runs.
    #[test]
    fn a_zombie_leader_whose_thread_runs_on_is_alive_for_every_reader() {
        let script = "import threading,time,ctypes\n\
                      threading.Thread(target=lambda: time.sleep(30)).start()\n\
                      ctypes.CDLL(None).pthread_exit(None)\n";
        let Ok(mut child) = std::process::Command::new("python3").args(["-c", script]).spawn()
        else {
            gpushare_test_skip::skip("no python3 to end a main thread with pthread_exit");
            return;
        };
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let zombie_leader = loop {
            match Stat::of(pid) {
                Some(s) if s.state == 'Z' && s.threads > 1 => break true,
                _ if std::time::Instant::now() > deadline => break false,
                _ => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
        };
        let lives = alive(pid);
        let exited =
            Process::open(Path::new("/proc"), pid).and_then(|p| p.owner()).map(|o| o.exited);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(zombie_leader, "python3's main thread did not end as a zombie leader");
        assert_eq!((lives, exited), (true, Some(false)));
    }
}
