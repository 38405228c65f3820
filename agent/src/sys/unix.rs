//! The few calls into the C library that the standard library lacks, each behind a safe
//! function. Every `unsafe` block of the agent outside the NVML and CUDA bindings is here.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

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

/// A pidfd of process `pid`: readable once it has exited. `None` where the kernel has no
/// pidfds (before Linux 5.3) or a sandbox refuses the call; callers then poll.
pub fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    let pid = ::libc::pid_t::try_from(pid).ok()?;
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
    let mut polled: Vec<::libc::pollfd> = fds
        .iter()
        .map(|fd| ::libc::pollfd { fd: fd.as_raw_fd(), events: ::libc::POLLIN, revents: 0 })
        .collect();
    // Rounded up, so that a wait of a few microseconds does not spin.
    let millis = timeout.as_micros().div_ceil(1000);
    let millis = ::libc::c_int::try_from(millis).unwrap_or(::libc::c_int::MAX);
    let count = ::libc::nfds_t::try_from(polled.len()).map_err(io::Error::other)?;
    // SAFETY: `polled` is a live, writable array of `count` pollfd structs for the call;
    // the descriptors are borrowed from their owners for its duration.
    let rc = unsafe { ::libc::poll(polled.as_mut_ptr(), count, millis) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(e);
    }
    let ready = ::libc::POLLIN | ::libc::POLLHUP | ::libc::POLLERR;
    Ok(polled.iter().map(|p| p.revents & ready != 0).collect())
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
    fn a_pidfd_becomes_readable_when_its_process_exits() {
        use std::os::fd::AsFd;
        let mut child = std::process::Command::new("/bin/sleep").arg("0.2").spawn().unwrap();
        let Some(pidfd) = pidfd_open(child.id()) else {
            eprintln!("skipped: no pidfds on this kernel");
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
