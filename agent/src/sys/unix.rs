//! The system calls the standard library lacks, each behind a safe function: through
//! `nix` where it wraps the call, and the few it does not wrap (glibc's allocator knobs,
//! pidfds, capabilities, CPU masks beyond 1024 CPUs, and what a `pre_exec` hook must do
//! without allocating) as raw C library calls, each `unsafe` with its `SAFETY` and a word
//! on why not `nix`. Every `unsafe` block of the agent outside the NVML and CUDA bindings
//! is here.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::resource::{Resource, getrlimit, setrlimit};
/// Signals, as [`signal`], [`signal_group`] and systemd's `KillUnit` take them.
pub use nix::sys::signal::Signal;
use nix::unistd::{Gid, Pid, Uid};

/// The effective user id of this process.
pub fn effective_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Makes the allocator give large buffers back to the system when they are freed: glibc
/// would otherwise raise its mmap threshold to the largest buffer freed (up to 32 MiB), and
/// keep the next ones of that size in its heap for good — a client sending a few 30 MiB
/// messages (refused by their size, but read whole first) left the agent at 1.5 GB.
/// Smaller buffers stay in the heap ([`trim_heap`] gives back what is free there): a
/// threshold of 128 KiB made every 256 KiB document an mmap and its page faults, which
/// slowed everyone's calls during a flood of documents (issue 36).
pub fn return_large_buffers() {
    // glibc's own knob, which nix does not wrap.
    // SAFETY: mallopt(3) takes two integers; called before other threads allocate.
    unsafe {
        ::libc::mallopt(::libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// Gives the free memory of every heap arena back to the system (after a flood of calls:
/// a flood of 256 KiB documents otherwise left 10 MiB in the heap for good).
pub fn trim_heap() {
    // glibc's own call, which nix does not wrap.
    // SAFETY: malloc_trim(3) takes a number and has no other precondition.
    unsafe {
        ::libc::malloc_trim(0);
    }
}

/// The soft limit of open files the agent started with, once it raised its own
/// ([`raise_open_files_limit`]); `u64::MAX` before.
static OPEN_FILES_AT_START: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(u64::MAX);

/// Raises this process's soft limit of open files to its hard limit (systemd starts
/// services at 1024 soft, 524288 hard): descriptors in reserve for the agent's own work
/// whatever its clients hold. Returns the limit now in force. Children get the limit the
/// agent started with back ([`with_open_files_at_start`]).
pub fn raise_open_files_limit() -> io::Result<u64> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        OPEN_FILES_AT_START.store(soft, std::sync::atomic::Ordering::SeqCst);
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(hard.max(soft))
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    effective_uid() == 0
}

/// Takes an exclusive `flock` on `file` without waiting: `Ok(false)` when another open file
/// description holds it. The lock lasts as long as the file stays open.
pub fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    // The standard library's lock is flock(2) with LOCK_EX | LOCK_NB on Linux.
    match file.try_lock() {
        Ok(()) => Ok(true),
        Err(std::fs::TryLockError::WouldBlock) => Ok(false),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// Sends SIGKILL to process `pid`, or with `group` to its process group (whose id is the
/// pid of the process that leads it). The caller makes sure the pid still names the
/// process it means: a child not yet reaped, or a daemon's pid read from its own pid file.
pub fn kill(pid: u32, group: bool) -> io::Result<()> {
    if group { signal_group(pid, Signal::SIGKILL) } else { signal(pid, Signal::SIGKILL) }
}

/// kill(2): `signal` to `target` (a pid, or a process group's id negated).
fn send_signal(target: i32, signal: Signal) -> io::Result<()> {
    // 0 is our own process group and -1 every process we may signal: never meant here.
    if target == 0 || target == -1 {
        return Err(io::Error::other(format!("no process {target} to signal")));
    }
    Ok(nix::sys::signal::kill(Pid::from_raw(target), signal)?)
}

/// Sends SIGKILL to the process `pidfd` holds (never to another process that got its pid).
pub fn pidfd_kill(pidfd: &OwnedFd) -> io::Result<()> {
    // nix 0.30 has no pidfd calls.
    // SAFETY: pidfd_send_signal(2) with a pidfd we own, a signal number, no siginfo and no
    // flags; it touches no memory of ours.
    let rc = unsafe {
        ::libc::syscall(
            ::libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            ::libc::SIGKILL,
            std::ptr::null::<::libc::siginfo_t>(),
            0,
        )
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// A pidfd of process `pid`: readable once it has exited. `None` where the kernel has no
/// pidfds (before Linux 5.3) or a sandbox refuses the call; callers then poll.
pub fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // nix 0.30 has no pidfd calls.
    let pid = i32::try_from(pid).ok()?;
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new file descriptor or -1;
    // it touches no memory of ours.
    let fd = unsafe { ::libc::syscall(::libc::SYS_pidfd_open, pid, 0) };
    let fd = i32::try_from(fd).ok().filter(|&fd| fd >= 0)?;
    // SAFETY: `fd` was just returned by the kernel for us and is owned by nobody else.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Waits until one of `fds` can be read without blocking (data, end of file or a pidfd's
/// exit) or `timeout` passes; returns which can, in order. An interrupted wait counts as
/// a timeout.
pub fn poll_readable(fds: &[BorrowedFd<'_>], timeout: Duration) -> io::Result<Vec<bool>> {
    use nix::poll::{PollFd, PollFlags, PollTimeout};
    let mut polled: Vec<PollFd<'_>> =
        fds.iter().map(|fd| PollFd::new(*fd, PollFlags::POLLIN)).collect();
    // Rounded up, so that a wait of a few microseconds does not spin.
    let millis = timeout.as_micros().div_ceil(1000);
    let millis = PollTimeout::try_from(millis).unwrap_or(PollTimeout::MAX);
    match nix::poll::poll(&mut polled, millis) {
        Ok(_) => {}
        Err(Errno::EINTR) => return Ok(vec![false; fds.len()]),
        Err(e) => return Err(e.into()),
    }
    let ready = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
    Ok(polled.iter().map(|p| p.revents().is_some_and(|r| r.intersects(ready))).collect())
}

/// The gid of group `name`, from the system's group database (NSS included).
pub fn group_id(name: &str) -> Option<u32> {
    nix::unistd::Group::from_name(name).ok().flatten().map(|group| group.gid.as_raw())
}

/// A pipe whose two ends close on exec: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)
}

/// Asks for a pipe buffer of `bytes` (Linux `F_SETPIPE_SZ`; unprivileged up to
/// `/proc/sys/fs/pipe-max-size`, 1 MiB by default); the size granted, or why not.
pub fn set_pipe_size(fd: &OwnedFd, bytes: usize) -> io::Result<usize> {
    use nix::fcntl::{FcntlArg, fcntl};
    let wanted = i32::try_from(bytes).map_err(io::Error::other)?;
    let granted = fcntl(fd, FcntlArg::F_SETPIPE_SZ(wanted))?;
    Ok(usize::try_from(granted).unwrap_or(0))
}

/// The name of user `uid` in the password database (NSS included, so directory users
/// count), without starting a process; `None` when it has none, or a name no one could
/// mistake for text of ours.
pub fn user_name(uid: u32) -> Option<String> {
    let name = nix::unistd::User::from_uid(Uid::from_raw(uid)).ok()??.name;
    let plain = |c: char| c.is_ascii_alphanumeric() || "._-$".contains(c);
    (!name.is_empty() && name.len() <= 64 && name.chars().all(plain)).then_some(name)
}

/// [`user_name`] through a process-wide [`UserNames`] cache: `status` names the owner of
/// every GPU process on each call, and under LDAP one NSS lookup can take milliseconds.
pub fn cached_user_name(uid: u32) -> Option<String> {
    static NAMES: std::sync::LazyLock<UserNames> =
        std::sync::LazyLock::new(|| UserNames::new(Duration::from_secs(60), 1024));
    NAMES.name(uid, user_name)
}

/// User names as the password database gave them, each kept for `ttl` (a renamed or new
/// user shows within that time), at most `capacity` of them: processes can run under any
/// uid of a user's subordinate range, so the set is emptied when it is full.
pub struct UserNames {
    ttl: Duration,
    capacity: usize,
    names: std::sync::Mutex<std::collections::HashMap<u32, (std::time::Instant, Option<String>)>>,
}

impl UserNames {
    /// An empty cache.
    pub fn new(ttl: Duration, capacity: usize) -> UserNames {
        UserNames { ttl, capacity, names: std::sync::Mutex::default() }
    }

    /// The name of `uid`, from the cache or, when it has none younger than the ttl, from
    /// `lookup` (called without the lock held, so one slow lookup stalls no other caller).
    pub fn name(&self, uid: u32, lookup: impl FnOnce(u32) -> Option<String>) -> Option<String> {
        let lock = || self.names.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((at, name)) = lock().get(&uid)
            && at.elapsed() < self.ttl
        {
            return name.clone();
        }
        let name = lookup(uid);
        let mut names = lock();
        if names.len() >= self.capacity {
            names.clear();
        }
        names.insert(uid, (std::time::Instant::now(), name.clone()));
        name
    }

    /// How many names are kept.
    pub fn kept(&self) -> usize {
        self.names.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }
}

/// Who a bench replica runs as: user, primary group and supplementary groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary group ids, exactly these.
    pub groups: Vec<u32>,
}

impl Identity {
    /// The caller `uid` with the primary group of its password entry and exactly the
    /// supplementary `groups` the caller has (the bus's `UnixGroupIDs`); without them, the
    /// primary group alone.
    pub fn of_caller(uid: u32, groups: Option<&[u32]>) -> io::Result<Identity> {
        // (uid_t)-1 is no one's: setresuid(2) reads it as "leave unchanged" (the service's
        // caller whose user the bus did not say has it).
        if uid == u32::MAX {
            return Err(io::Error::other("a caller whose user is not known"));
        }
        let entry = match nix::unistd::User::from_uid(Uid::from_raw(uid)) {
            Ok(Some(entry)) => entry,
            _ => {
                return Err(io::Error::other(format!(
                    "user {uid} is not in the password database"
                )));
            }
        };
        let gid = entry.gid.as_raw();
        let groups = groups.map_or_else(|| vec![gid], <[u32]>::to_vec);
        Ok(Identity { uid, gid, groups })
    }

    /// As `--bench-user` writes it: `UID:GID:G1,G2,...` (the list may be empty).
    pub fn to_arg(&self) -> String {
        let groups: Vec<String> = self.groups.iter().map(u32::to_string).collect();
        format!("{}:{}:{}", self.uid, self.gid, groups.join(","))
    }

    /// Reads [`Identity::to_arg`]'s form.
    pub fn from_arg(text: &str) -> Result<Identity, String> {
        let bad = || format!("`{text}` is not UID:GID:GROUP,...");
        let mut parts = text.splitn(3, ':');
        let uid = parts.next().and_then(|u| u.parse().ok()).ok_or_else(bad)?;
        let gid = parts.next().and_then(|g| g.parse().ok()).ok_or_else(bad)?;
        let groups = match parts.next().ok_or_else(bad)? {
            "" => Vec::new(),
            list => {
                list.split(',').map(|g| g.parse().map_err(|_| bad())).collect::<Result<_, _>>()?
            }
        };
        Ok(Identity { uid, gid, groups })
    }
}

/// Makes this process `identity` for good: its supplementary groups exactly, then its
/// group, then its user (real, effective and saved alike), and checks that there is no
/// way back (for a user other than root). The kernel then makes the process non-dumpable:
/// the user may signal it but not trace it. Call it before any other thread exists.
pub fn become_identity(identity: &Identity) -> io::Result<()> {
    let Identity { uid, gid, groups } = identity;
    // (uid_t)-1 and (gid_t)-1 would leave the ids unchanged: never an identity to take.
    if *uid == u32::MAX || *gid == u32::MAX || groups.contains(&u32::MAX) {
        return Err(io::Error::other("uid or gid -1 is no one's identity"));
    }
    let group_ids: Vec<Gid> = groups.iter().map(|&g| Gid::from_raw(g)).collect();
    nix::unistd::setgroups(&group_ids)?;
    let gid = Gid::from_raw(*gid);
    nix::unistd::setresgid(gid, gid, gid)?;
    let user = Uid::from_raw(*uid);
    nix::unistd::setresuid(user, user, user)?;
    let ids = nix::unistd::getresuid()?;
    let (r, e, s) = (ids.real.as_raw(), ids.effective.as_raw(), ids.saved.as_raw());
    if [r, e, s] != [*uid; 3] {
        return Err(io::Error::other(format!("still uid {r}/{e}/{s}, not {uid}")));
    }
    // It must fail for a user other than root.
    if *uid != 0 && nix::unistd::setuid(Uid::from_raw(0)).is_ok() {
        return Err(io::Error::other("could become root again"));
    }
    if *uid != 0 {
        clear_capabilities()?;
    }
    Ok(())
}

/// Empties this process's capability sets. Leaving root clears the permitted, effective
/// and ambient sets but keeps the inheritable one, which a program with file capabilities
/// run later would receive: the agent may have been started with one (a container's
/// payload often is), and a user's replica must get nothing of it. Lowering is always
/// allowed, so this needs no capability itself.
fn clear_capabilities() -> io::Result<()> {
    // capset(2)'s header and data, version 3 (two 32-bit words of each set).
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    // nix 0.30 does not wrap capset(2).
    let header = Header { version: VERSION_3, pid: 0 };
    let data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
    // SAFETY: capset(2) reads the header and two data structures, all live and laid out as
    // the kernel's `__user_cap_header_struct` and `__user_cap_data_struct` (repr(C)).
    if unsafe { ::libc::syscall(::libc::SYS_capset, &header, data.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Prepares `command`'s child, between fork and exec, to have the soft limit of open files
/// the agent started with (a hook, an MPS daemon, a user's replica must not inherit the
/// agent's raised one: `select()` and loops closing every descriptor break on it).
pub fn with_open_files_at_start(command: &mut std::process::Command) {
    let at_start = OPEN_FILES_AT_START.load(std::sync::atomic::Ordering::SeqCst);
    if at_start == u64::MAX {
        return;
    }
    let hook = move || -> io::Result<()> {
        // getrlimit(2) and setrlimit(2) are async-signal-safe, and nix's wrappers
        // allocate nothing. Lowering a soft limit is always allowed.
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
        setrlimit(Resource::RLIMIT_NOFILE, at_start.min(hard), hard)?;
        Ok(())
    };
    // SAFETY: the hook makes two async-signal-safe system calls and allocates nothing.
    unsafe {
        command.pre_exec(hook);
    }
}

/// Prepares `command`'s child, between fork and exec, to start a session of its own: no
/// controlling terminal, no process group or session of this process (`setsid`).
pub fn in_new_session(command: &mut std::process::Command) {
    let hook = || -> io::Result<()> {
        // setsid(2) is async-signal-safe, and nix's wrapper allocates nothing; a fresh
        // child of a fork is never a process group leader, so it cannot fail with EPERM.
        nix::unistd::setsid()?;
        Ok(())
    };
    // SAFETY: the hook makes one async-signal-safe system call and allocates nothing.
    unsafe {
        command.pre_exec(hook);
    }
}

/// Prepares `command`'s child, between fork and exec, to have `fd` (which closes on exec
/// here) as descriptor `to` across the exec.
pub fn with_fd_as(command: &mut std::process::Command, fd: RawFd, to: RawFd) {
    let hook = move || -> io::Result<()> {
        // Raw dup2: nix's takes the target as an `OwnedFd`, and `to` need not be open
        // here (nor may the hook close it).
        // SAFETY: dup2(2) is async-signal-safe; `fd` is open in the child (inherited from
        // the parent, which keeps it open until the spawn returns) and `to` is meant to be
        // replaced. The duplicate does not close on exec.
        if unsafe { ::libc::dup2(fd, to) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the hook makes one async-signal-safe system call and allocates nothing.
    unsafe {
        command.pre_exec(hook);
    }
}

/// A duplicate of `fd` numbered `min` or above, closing on exec.
pub fn duplicate_above(fd: BorrowedFd<'_>, min: RawFd) -> io::Result<OwnedFd> {
    use nix::fcntl::{FcntlArg, fcntl};
    let new = fcntl(fd, FcntlArg::F_DUPFD_CLOEXEC(min))?;
    // SAFETY: `new` was just created for us and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// Marks every descriptor of this process from `first` on to close on exec: what it
/// inherited stays out of the programs it starts.
pub fn close_on_exec_from(first: RawFd) -> io::Result<()> {
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd >= first)
        .collect();
    for fd in fds {
        // Raw fcntl: nix's takes a borrowed descriptor, and this is only a number read
        // from `/proc/self/fd`, perhaps closed since (the listing's own was).
        // SAFETY: fcntl(2) F_SETFD on a descriptor number; one already closed (the
        // directory's own) fails with EBADF, which is fine.
        unsafe { ::libc::fcntl(fd, ::libc::F_SETFD, ::libc::FD_CLOEXEC) };
    }
    Ok(())
}

/// Puts `/dev/null` at descriptor `fd` (a standard descriptor this process no longer
/// wants a child to inherit).
pub fn null_at(fd: RawFd) -> io::Result<()> {
    let null = File::options().read(true).write(true).open("/dev/null")?;
    match fd {
        0 => nix::unistd::dup2_stdin(&null)?,
        1 => nix::unistd::dup2_stdout(&null)?,
        2 => nix::unistd::dup2_stderr(&null)?,
        _ => return Err(io::Error::other(format!("descriptor {fd} is no standard one"))),
    }
    Ok(())
}

/// Makes this process the reaper of its orphaned descendants (`PR_SET_CHILD_SUBREAPER`):
/// whatever they start and leave behind becomes its child, not init's.
pub fn become_child_subreaper() -> io::Result<()> {
    Ok(nix::sys::prctl::set_child_subreaper(true)?)
}

/// Whether this process (as its real user) may create files in directory `dir`.
pub fn may_write_dir(dir: &std::path::Path) -> io::Result<()> {
    use nix::unistd::AccessFlags;
    Ok(nix::unistd::access(dir, AccessFlags::W_OK | AccessFlags::X_OK)?)
}

/// Opens directory `path` itself, never through a symbolic link in its last component, to
/// create files in it with [`create_new_in`] (no path walked again).
pub fn open_directory(path: &std::path::Path) -> io::Result<File> {
    use nix::fcntl::OFlag;
    use std::os::unix::fs::OpenOptionsExt;
    File::options()
        .read(true)
        .custom_flags((OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW).bits())
        .open(path)
}

/// Creates file `name` (a plain name) anew in the open directory `dir`, mode `mode`:
/// whatever had that name is unlinked first, and the new file is this process's own
/// (`O_EXCL`, `O_NOFOLLOW`), never one somebody else prepared.
pub fn create_new_in(dir: &File, name: &str, mode: u32) -> io::Result<File> {
    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;
    use nix::unistd::UnlinkatFlags;
    match nix::unistd::unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(e) => return Err(e.into()),
    }
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::openat(dir, name, flags, Mode::from_bits_truncate(mode))?;
    Ok(File::from(fd))
}

/// How a process ended: its exit code, or the signal that killed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// Its pid.
    pub pid: u32,
    /// Exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
}

/// Reaps one child that has ended, without waiting: `None` when none has (or there are
/// no children).
///
/// Through libc, not nix: nix's `waitpid` turns the status into its `Signal`, which names
/// no real-time signal, so a child ended by one would be reaped by the kernel and then
/// lost as an error (its end never told, its pid signalled on after it could be reused).
pub fn reap_any() -> Option<Ended> {
    let mut status = 0;
    // SAFETY: waitpid writes the status into the int it is given, which lives on this stack.
    let pid = unsafe { ::libc::waitpid(-1, &raw mut status, ::libc::WNOHANG) };
    let pid = u32::try_from(pid).ok().filter(|&p| p > 0)?;
    let (code, signal) = if ::libc::WIFEXITED(status) {
        (Some(::libc::WEXITSTATUS(status)), None)
    } else if ::libc::WIFSIGNALED(status) {
        (None, Some(::libc::WTERMSIG(status)))
    } else {
        (None, None)
    };
    Some(Ended { pid, code, signal })
}

/// Sends `signal` to process `pid`; the caller makes sure the pid names the process it
/// means (a child not yet reaped, or one whose start time it checked).
pub fn signal(pid: u32, signal: Signal) -> io::Result<()> {
    let pid = i32::try_from(pid).map_err(|_| io::Error::other(format!("no such pid {pid}")))?;
    send_signal(pid, signal)
}

/// Makes reads of `fd` return `WouldBlock` rather than wait (`O_NONBLOCK`).
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// Sends `signal` to process group `group`.
pub fn signal_group(group: u32, signal: Signal) -> io::Result<()> {
    let group = i32::try_from(group).map_err(|_| io::Error::other("no such process group"))?;
    send_signal(-group, signal)
}

/// The most CPU numbers the affinity calls handle (the kernel's mask may be smaller; a
/// larger one is asked for when the kernel's is larger, up to this). nix's `CpuSet` is
/// glibc's fixed 1024 CPUs, so these calls stay raw.
const AFFINITY_BITS_MAX: usize = 1 << 16;

/// The CPUs this process may run on (`sched_getaffinity(0)`), in increasing order.
pub fn cpu_affinity() -> io::Result<Vec<u32>> {
    let mut words = 1024 / 64;
    loop {
        let mut mask = vec![0u64; words];
        let bytes = words * 8;
        // SAFETY: the kernel writes at most `bytes` bytes into the live buffer, which is
        // exactly that long; a cpu_set_t is a plain bit array of any length (CPU_ALLOC).
        let rc = unsafe {
            ::libc::sched_getaffinity(0, bytes, mask.as_mut_ptr().cast::<::libc::cpu_set_t>())
        };
        if rc == 0 {
            return Ok(bits_of(&mask));
        }
        let e = io::Error::last_os_error();
        // EINVAL: the kernel's mask is larger than the buffer.
        if e.raw_os_error() == Some(Errno::EINVAL as i32) && words * 64 < AFFINITY_BITS_MAX {
            words *= 2;
            continue;
        }
        return Err(e);
    }
}

/// Binds this process (its calling thread, which for a single-threaded process is the
/// process; children inherit it) to `cpus` (`sched_setaffinity(0)`). The kernel keeps only
/// those of them the process's cpuset allows, so the mask in force is read back and
/// returned: the caller compares it with `cpus`.
pub fn set_cpu_affinity(cpus: &[u32]) -> io::Result<Vec<u32>> {
    let Some(&highest) = cpus.iter().max() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no CPU"));
    };
    let highest = usize::try_from(highest).unwrap_or(usize::MAX);
    if highest >= AFFINITY_BITS_MAX {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "a CPU number beyond 65535"));
    }
    let mut mask = vec![0u64; highest / 64 + 1];
    for &cpu in cpus {
        let cpu = cpu as usize;
        mask[cpu / 64] |= 1 << (cpu % 64);
    }
    // SAFETY: the kernel reads `mask.len() * 8` bytes of the live buffer, its length.
    let rc = unsafe {
        ::libc::sched_setaffinity(0, mask.len() * 8, mask.as_ptr().cast::<::libc::cpu_set_t>())
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    cpu_affinity()
}

/// The numbers of the bits set in `mask` (bit `i` of word `w` is CPU `64 w + i`).
fn bits_of(mask: &[u64]) -> Vec<u32> {
    let mut cpus = Vec::new();
    for (w, &word) in mask.iter().enumerate() {
        let mut word = word;
        while word != 0 {
            let bit = word.trailing_zeros();
            cpus.push(u32::try_from(w * 64).unwrap_or(u32::MAX).saturating_add(bit));
            word &= word - 1;
        }
    }
    cpus
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minus_one_is_no_ones_identity() {
        assert!(Identity::of_caller(u32::MAX, None).is_err());
        let minus_one = Identity { uid: u32::MAX, gid: u32::MAX, groups: Vec::new() };
        // Refused before any system call: this test process keeps its own ids.
        assert!(become_identity(&minus_one).is_err());
    }

    #[test]
    fn user_names_come_from_the_password_database() {
        assert_eq!(user_name(0).as_deref(), Some("root"));
        assert_eq!(user_name(u32::MAX - 7), None);
    }

    #[test]
    fn user_names_are_kept_for_their_ttl_and_the_cache_stays_bounded() {
        let lookups = std::cell::Cell::new(0);
        let lookup = |uid: u32| {
            lookups.set(lookups.get() + 1);
            (uid < 10).then(|| format!("user{uid}"))
        };
        let names = UserNames::new(Duration::from_secs(60), 4);
        assert_eq!(names.name(1, lookup).as_deref(), Some("user1"));
        assert_eq!(names.name(1, lookup).as_deref(), Some("user1"));
        assert_eq!(names.name(50, lookup), None);
        assert_eq!(names.name(50, lookup), None, "a uid without a name is kept too");
        assert_eq!(lookups.get(), 2);
        for uid in 100..110 {
            names.name(uid, lookup);
            assert!(names.kept() <= 4, "{} names kept", names.kept());
        }
        let expiring = UserNames::new(Duration::ZERO, 4);
        expiring.name(1, lookup);
        expiring.name(1, lookup);
        assert_eq!(lookups.get(), 14, "a name older than the ttl is looked up again");
        assert_eq!(cached_user_name(0).as_deref(), Some("root"));
    }

    #[test]
    fn our_own_group_and_every_process_are_never_signalled() {
        assert!(kill(0, false).is_err());
        assert!(kill(0, true).is_err());
        assert!(signal_group(1, Signal::SIGKILL).is_err(), "kill(-1) reaches every process");
    }

    #[test]
    fn children_get_the_open_files_limit_the_agent_started_with() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        if hard <= 1024 {
            gpushare_test_skip::skip(format_args!("the hard limit of open files is {hard}"));
            return;
        }
        setrlimit(Resource::RLIMIT_NOFILE, 1024, hard).unwrap();
        assert_eq!(raise_open_files_limit().unwrap(), hard);
        let mut child = std::process::Command::new("/bin/sh");
        child.args(["-c", "ulimit -Sn"]);
        with_open_files_at_start(&mut child);
        let out = child.output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1024");
    }

    #[test]
    fn affinity_is_read_and_set_on_a_thread_of_its_own() {
        // A thread of its own: affinity is per thread, and the test harness's other
        // threads keep theirs.
        std::thread::spawn(|| {
            let all = cpu_affinity().unwrap();
            assert!(!all.is_empty());
            assert!(all.windows(2).all(|w| w[0] < w[1]), "{all:?}");
            let first = all[0];
            assert_eq!(set_cpu_affinity(&[first]).unwrap(), [first]);
            assert_eq!(cpu_affinity().unwrap(), [first]);
            assert!(set_cpu_affinity(&[]).is_err());
            assert!(set_cpu_affinity(&[70_000]).is_err());
            // A CPU this host lacks (beyond the kernel's mask) is refused, the mask kept.
            assert!(set_cpu_affinity(&[65_000]).is_err());
            assert_eq!(cpu_affinity().unwrap(), [first]);
        })
        .join()
        .unwrap();
        assert_eq!(bits_of(&[0b1011, 1 << 63]), [0, 1, 3, 127]);
    }

    #[test]
    fn groups_are_looked_up() {
        assert_eq!(group_id("root"), Some(0));
        assert_eq!(group_id("no-such-group-gpushare-test"), None);
        assert_eq!(group_id("bad\0name"), None);
    }

    #[test]
    fn a_pidfd_becomes_readable_when_its_process_exits() {
        use std::os::fd::AsFd;
        let mut child = std::process::Command::new("/bin/sleep").arg("0.2").spawn().unwrap();
        let Some(pidfd) = pidfd_open(child.id()) else {
            gpushare_test_skip::skip("no pidfds on this kernel");
            child.wait().unwrap();
            return;
        };
        assert_eq!(poll_readable(&[pidfd.as_fd()], Duration::ZERO).unwrap(), [false]);
        assert_eq!(poll_readable(&[pidfd.as_fd()], Duration::from_secs(10)).unwrap(), [true]);
        assert!(child.wait().unwrap().success());
    }

    #[test]
    fn a_lock_is_exclusive_between_open_files() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let first = File::open(file.path()).unwrap();
        let second = File::open(file.path()).unwrap();
        assert!(try_lock_exclusive(&first).unwrap());
        assert!(!try_lock_exclusive(&second).unwrap());
        drop(first);
        assert!(try_lock_exclusive(&second).unwrap());
    }
}
