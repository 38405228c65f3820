//! The few calls into the C library that the standard library lacks, each behind a safe
//! function. Every `unsafe` block of the agent outside the NVML and CUDA bindings is here.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// The effective user id of this process.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { ::libc::geteuid() }
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    effective_uid() == 0
}

/// Takes an exclusive `flock` on `file` without waiting: `Ok(false)` when another open file
/// description holds it. The lock lasts as long as the file stays open.
pub fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    // SAFETY: flock on a file descriptor the caller owns and keeps open; no memory is
    // shared with the kernel.
    let taken = unsafe { ::libc::flock(file.as_raw_fd(), ::libc::LOCK_EX | ::libc::LOCK_NB) };
    if taken == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.kind() == io::ErrorKind::WouldBlock { Ok(false) } else { Err(e) }
}

/// Sends SIGKILL to process `pid`, or with `group` to its process group (whose id is the
/// pid of the process that leads it). The caller makes sure the pid still names the
/// process it means: a child not yet reaped, or a daemon's pid read from its own pid file.
pub fn kill(pid: u32, group: bool) -> io::Result<()> {
    let pid = i32::try_from(pid).map_err(|_| io::Error::other(format!("no such pid {pid}")))?;
    let target = if group { -pid } else { pid };
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    if unsafe { ::libc::kill(target, ::libc::SIGKILL) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Blocks until child `pid` has exited, leaving it unreaped (`waitid` with `WNOWAIT`): its
/// pid stays reserved until the owner of the `Child` waits for it, so that a timeout may
/// still kill it by pid without hitting another process.
pub fn wait_for_exit_unreaped(pid: u32) -> io::Result<()> {
    let id = ::libc::id_t::from(pid);
    loop {
        // SAFETY: an all-zero siginfo_t is a valid value for waitid to overwrite.
        let mut info: ::libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a live, writable siginfo_t for the duration of the call.
        let rc = unsafe {
            ::libc::waitid(::libc::P_PID, id, &mut info, ::libc::WEXITED | ::libc::WNOWAIT)
        };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The gid of group `name`, from the system's group database (NSS included).
pub fn group_id(name: &str) -> Option<u32> {
    let name = CString::new(name).ok()?;
    let mut buffer = vec![0u8; 16 * 1024];
    // SAFETY: `libc::group` is plain old data; an all-zero value is valid and is only
    // read after getgrnam_r has filled it.
    let mut group: ::libc::group = unsafe { std::mem::zeroed() };
    let mut found: *mut ::libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call: the name is NUL-terminated, the buffer
    // and its length match, and `group`/`found` outlive it. getgrnam_r is thread-safe.
    let rc = unsafe {
        ::libc::getgrnam_r(
            name.as_ptr(),
            &mut group,
            buffer.as_mut_ptr().cast(),
            buffer.len(),
            &mut found,
        )
    };
    (rc == 0 && !found.is_null()).then_some(group.gr_gid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_looked_up() {
        assert_eq!(group_id("root"), Some(0));
        assert_eq!(group_id("no-such-group-gpushare-test"), None);
        assert_eq!(group_id("bad\0name"), None);
    }

    #[test]
    fn an_exited_child_stays_unreaped_until_waited_for() {
        let mut child = std::process::Command::new("/bin/true").spawn().unwrap();
        wait_for_exit_unreaped(child.id()).unwrap();
        // Still a zombie of ours: its pid is not free for another process yet.
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
        assert!(stat.rsplit(')').next().unwrap().trim_start().starts_with('Z'), "{stat}");
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
