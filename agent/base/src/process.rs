//! The one reader of `/proc/<pid>/stat` and the one rule of whether a process still runs,
//! for the agent, `gpushare-ctl` and the simulator alike (DESIGN.md, "Clients": gone means
//! a zombie with one thread).
//!
//! Why not the `procfs` crate: these callers need five fields of one file, the simulated
//! driver asks on every NVML call that lists processes, and the crate would bring its
//! parsing of every field and its own dependencies into a shared library loaded by other
//! programs (`libnvidia-ml.so`), for a format that proc(5) fixes. One small reader here.

use std::path::Path;

/// What `/proc/<pid>/stat` says of a process (the fields gpushare reads, numbered as
/// proc(5) numbers them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// (2) The command name, between the first `(` and the last `)`: it may itself hold
    /// spaces and parentheses, and the process chooses it.
    pub comm: String,
    /// (3) The state letter: `R`, `S`, `D`, `Z` (zombie), `X`/`x` (dead), ...
    pub state: char,
    /// (4) The parent's pid.
    pub parent: u32,
    /// (5) The process group.
    pub group: u32,
    /// (6) The session (the pid of the process that called `setsid`).
    pub session: u32,
    /// (20) How many threads it has.
    pub threads: u32,
    /// (22) When it started, in clock ticks after boot: with the pid, what names one
    /// process for good (a reused pid has a later start).
    pub start_time: u64,
}

impl Stat {
    /// Parses the text of a `stat` file; `None` when it is not one.
    pub fn parse(text: &str) -> Option<Stat> {
        let (open, close) = (text.find('(')?, text.rfind(')')?);
        let comm = text.get(open + 1..close)?.to_string();
        // After the name: the state is field 3.
        let fields: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3).copied();
        Some(Stat {
            comm,
            state: field(3)?.chars().next()?,
            parent: field(4)?.parse().ok()?,
            group: field(5)?.parse().ok()?,
            session: field(6)?.parse().ok()?,
            threads: field(20)?.parse().ok()?,
            start_time: field(22)?.parse().ok()?,
        })
    }

    /// Reads `/proc/<pid>/stat`; `None` when the process has gone (or its file cannot be
    /// read).
    pub fn of(pid: u32) -> Option<Stat> {
        Stat::read(&format!("/proc/{pid}/stat"))
    }

    /// Reads this process's own (`/proc/self/stat`).
    pub fn of_self() -> Option<Stat> {
        Stat::read("/proc/self/stat")
    }

    fn read(path: &str) -> Option<Stat> {
        Stat::parse(&std::fs::read_to_string(Path::new(path)).ok()?)
    }

    /// Whether the process has ended, every thread of it, and only awaits its parent: a
    /// zombie (`Z`) or dead (`X`) with one thread. A main thread that ended with
    /// `pthread_exit` leaves a zombie whose other threads run on (and hold the GPU): that
    /// process has not ended.
    pub fn ended(&self) -> bool {
        has_ended(self.state, self.threads)
    }
}

/// The rule itself, for a reader of another file that shows the same two facts
/// (`/proc/PID/status`'s `State:` and `Threads:`): a zombie (`Z`) or dead (`X`/`x`)
/// process of at most one thread has ended.
pub fn has_ended(state: char, threads: u32) -> bool {
    matches!(state, 'Z' | 'X' | 'x') && threads <= 1
}

/// Whether process `pid` still runs: gpushare's one rule. It runs unless its `stat` shows
/// it ended ([`Stat::ended`]); where `stat` cannot be read (the process has gone, or
/// `hidepid` hides another user's), `kill(pid, 0)` tells whether the pid exists (allowed
/// or not to signal it). Pid 0 and pids beyond `pid_t` name no process.
pub fn alive(pid: u32) -> bool {
    use nix::errno::Errno;
    use nix::sys::signal::kill;
    use nix::unistd::Pid;
    let Ok(raw) = i32::try_from(pid) else { return false };
    if raw <= 0 {
        return false;
    }
    match Stat::of(pid) {
        Some(stat) => !stat.ended(),
        // Signal 0 sends nothing: it only asks whether `pid` (> 0: one process, never a
        // group) exists.
        None => matches!(kill(Pid::from_raw(raw), None), Ok(()) | Err(Errno::EPERM)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_stat_line_is_read_after_the_name_whatever_it_holds() {
        let line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 \
                    987654 1000 100 18446744073709551615\n";
        let stat = Stat::parse(line).unwrap();
        assert_eq!(stat.comm, "a (b) c");
        assert_eq!((stat.state, stat.parent, stat.group, stat.session), ('S', 1, 4242, 4242));
        assert_eq!((stat.threads, stat.start_time), (3, 987654));
        assert!(!stat.ended());
        assert_eq!(Stat::parse("4242 (x) S 1"), None);
        assert_eq!(Stat::parse("garbage"), None);
    }

    #[test]
    fn only_a_zombie_of_one_thread_has_ended() {
        let with = |state: char, threads: u32| Stat {
            comm: "x".into(),
            state,
            parent: 1,
            group: 1,
            session: 1,
            threads,
            start_time: 1,
        };
        assert!(with('Z', 1).ended());
        assert!(with('X', 1).ended());
        assert!(with('x', 0).ended());
        assert!(!with('Z', 2).ended(), "a zombie leader whose threads run on");
        assert!(!with('R', 1).ended());
        assert!(!with('D', 1).ended());
    }

    #[test]
    fn this_process_lives_and_an_exited_child_does_not() {
        let own = Stat::of_self().unwrap();
        assert!(!own.comm.is_empty() && own.start_time > 0 && !own.ended());
        assert_eq!(Stat::of(std::process::id()).map(|s| s.start_time), Some(own.start_time));
        assert!(alive(std::process::id()));
        assert!(!alive(0));
        assert!(!alive(u32::MAX));
        assert!(alive(1), "init exists, whether or not it may be signalled");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        // Unreaped, it is a zombie of one thread: no longer running.
        while alive(pid) {
            assert!(Instant::now() < deadline, "an exited `true` still counts as running");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(Stat::of(pid).map(|s| s.state), Some('Z'));
        child.wait().unwrap();
        assert!(!alive(pid));
    }

    /// A zombie leader whose other thread runs on is alive (the agent's rule, which the
    /// agent's `alive` and the MPS simulator's did not share before: they said ended).
    #[test]
    fn a_leader_gone_with_pthread_exit_lives_while_its_threads_do() {
        // A shell cannot pthread_exit its main thread; perl or python can. Use python3.
        let script = "import threading,time,ctypes,sys\n\
                      t=threading.Thread(target=lambda: time.sleep(30));t.start()\n\
                      print('ready',flush=True)\n\
                      ctypes.CDLL(None).pthread_exit(None)\n";
        let Ok(mut child) = std::process::Command::new("python3")
            .args(["-c", script])
            .stdout(std::process::Stdio::piped())
            .spawn()
        else {
            gpushare_test_skip::skip("no python3 to end a main thread with pthread_exit");
            return;
        };
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        let zombie_leader = loop {
            match Stat::of(pid) {
                Some(s) if s.state == 'Z' && s.threads > 1 => break true,
                _ if Instant::now() > deadline => break false,
                _ => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        let lives = alive(pid);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(zombie_leader, "python3's main thread did not end as a zombie leader");
        assert!(lives, "a zombie leader with a running thread counts as ended");
    }
}
