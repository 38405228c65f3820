//! The daemon's PID file and socket in its pipe directory, and whether that daemon still runs.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The PID file the real daemon writes into its pipe directory.
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// The control socket in the pipe directory.
pub const SOCKET_NAME: &str = "control";

/// The PID in the pipe directory's PID file, if any.
pub fn read_pid_file(pipe_dir: &Path) -> Option<u32> {
    fs::read_to_string(pipe_dir.join(PID_FILE)).ok()?.trim().parse().ok()
}

/// Whether process `pid` runs: gpushare's one rule, [`gpushare_base::process::alive`] (a
/// daemon that exited but that no one has reaped yet is not running).
pub use gpushare_base::process::alive;

/// The PID of a live daemon owning `pipe_dir`, going by its PID file.
pub fn running_pid(pipe_dir: &Path) -> Option<u32> {
    read_pid_file(pipe_dir).filter(|&pid| alive(pid))
}

/// Writes the PID file as the real daemon does: the PID without a newline, mode 0666.
/// Written to a temporary file and renamed, so a reader never sees it half written.
pub fn write_pid_file(pipe_dir: &Path, pid: u32) -> io::Result<()> {
    let tmp = pipe_dir.join(format!(".{PID_FILE}.{pid}.tmp"));
    let mut file =
        OpenOptions::new().create(true).write(true).truncate(true).mode(0o666).open(&tmp)?;
    file.write_all(pid.to_string().as_bytes())?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o666))?;
    fs::rename(&tmp, pipe_dir.join(PID_FILE))
}

/// Removes the socket and the PID file, when the PID file is this daemon's.
pub fn remove_own_files(pipe_dir: &Path, pid: u32) {
    if read_pid_file(pipe_dir) == Some(pid) {
        let _ = fs::remove_file(pipe_dir.join(SOCKET_NAME));
        let _ = fs::remove_file(pipe_dir.join(PID_FILE));
    }
}

/// Device and inode of a directory: tells a deleted or replaced pipe directory.
pub fn dir_identity(dir: &Path) -> Option<(u64, u64)> {
    fs::metadata(dir).ok().filter(|m| m.is_dir()).map(|m| (m.dev(), m.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::{Duration, Instant};

    #[test]
    fn zombies_are_not_running() {
        assert!(alive(std::process::id()));
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(pid) {
            assert!(Instant::now() < deadline, "exited `true` still counts as running");
            std::thread::sleep(Duration::from_millis(5));
        }
        child.wait().unwrap();
        assert!(!alive(0));
    }
}
