//! Where the spec goes: `<dir>/gpushare.json`, written atomically (a temporary file of a
//! random name beside it, renamed over), only into a directory the agent may trust
//! ([`crate::sys::trusted`]: a link another user planted is not followed), and only when
//! its bytes change. [`Writer::check`] is what an apply checks before its first step.

use std::fs;
use std::io::{self, Read};
use std::path::PathBuf;

use super::FILE_NAME;
use crate::sys::files::{PUBLIC, write_atomically};
use crate::sys::trusted;

/// The spec's place, or none (`[cdi] enabled = false`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writer {
    /// The CDI directory (`/var/run/cdi`).
    pub dir: PathBuf,
    /// Whether the agent writes a spec at all.
    pub enabled: bool,
}

impl Writer {
    /// `<dir>/gpushare.json`.
    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    /// Whether the spec can be written: the directory is one the agent may trust (made,
    /// 0755, if missing; see [`trusted::check_dir`]), the agent may write it, and an
    /// existing spec is a plain file. One line naming the place and what to do when not.
    pub fn check(&self) -> Result<(), String> {
        if !self.enabled {
            return Ok(());
        }
        let dir = &self.dir;
        let place = |why: String| {
            format!(
                "CDI spec directory {}: {why}; fix it, or set [cdi] dir (or enabled = false) in agent.toml",
                dir.display()
            )
        };
        let resolved = trusted::make_dir(dir, 0o755)
            .map_err(|why| place(format!("{why}: another user could change the spec")))?;
        let own = crate::sys::unix::effective_uid();
        if let Err(e) = crate::sys::unix::may_write_dir(&resolved) {
            return Err(place(format!("not writable by the agent (uid {own}): {e}")));
        }
        let spec = resolved.join(FILE_NAME);
        match fs::symlink_metadata(&spec) {
            Ok(m) if !m.file_type().is_file() => {
                Err(place(format!("{} is not a plain file", spec.display())))
            }
            _ => Ok(()),
        }
    }

    /// The spec as it is on disk, if there is one the agent may trust.
    pub fn read(&self) -> Option<Vec<u8>> {
        let mut file = trusted::open_file(&self.path()).ok().flatten()?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).ok()?;
        Some(bytes)
    }

    /// Writes `bytes` as the spec (mode 0644: container runtimes read it) when they differ
    /// from what is there; `None` removes the spec (a node with no device to name: CDI
    /// wants at least one). Whether it changed.
    pub fn write(&self, bytes: Option<&[u8]>) -> io::Result<bool> {
        if !self.enabled {
            return Ok(false);
        }
        let path = self.path();
        match bytes {
            None => {
                if fs::symlink_metadata(&path).is_err() {
                    return Ok(false);
                }
                self.check().map_err(io::Error::other)?;
                match fs::remove_file(&path) {
                    Ok(()) => Ok(true),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
                    Err(e) => Err(e),
                }
            }
            Some(bytes) if self.read().as_deref() == Some(bytes) => Ok(false),
            Some(bytes) => {
                self.check().map_err(io::Error::other)?;
                write_atomically(&path, bytes, PUBLIC)?;
                Ok(true)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use super::*;

    fn writer(dir: &Path) -> Writer {
        Writer { dir: dir.join("cdi"), enabled: true }
    }

    #[test]
    fn the_spec_is_written_once_per_change_and_removed_when_empty() {
        let tmp = tempfile::tempdir().unwrap();
        let w = writer(tmp.path());
        w.check().unwrap();
        assert_eq!(fs::metadata(&w.dir).unwrap().permissions().mode() & 0o777, 0o755);
        assert!(w.write(Some(b"{}\n")).unwrap());
        assert!(!w.write(Some(b"{}\n")).unwrap(), "the same bytes are not written again");
        assert_eq!(fs::metadata(w.path()).unwrap().permissions().mode() & 0o777, 0o644);
        assert!(w.write(None).unwrap());
        assert!(!w.path().exists());
        assert!(!w.write(None).unwrap());
    }

    #[test]
    fn a_directory_others_may_write_or_that_is_none_is_refused_in_one_line() {
        let tmp = tempfile::tempdir().unwrap();
        let w = writer(tmp.path());
        fs::create_dir(&w.dir).unwrap();
        fs::set_permissions(&w.dir, fs::Permissions::from_mode(0o777)).unwrap();
        let e = w.check().unwrap_err();
        assert!(e.contains("writable by others (mode 0777)") && e.contains("[cdi] dir"), "{e}");
        assert!(w.write(Some(b"x")).is_err());
        fs::set_permissions(&w.dir, fs::Permissions::from_mode(0o755)).unwrap();
        fs::create_dir(w.path()).unwrap();
        assert!(w.check().unwrap_err().contains("is not a plain file"));
        let file = tmp.path().join("file");
        fs::write(&file, "").unwrap();
        let under_a_file = Writer { dir: file.join("cdi"), enabled: true };
        let e = under_a_file.check().unwrap_err();
        assert!(
            e.starts_with(&format!("CDI spec directory {}", file.join("cdi").display())),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1);
        // Off: nothing checked, nothing written.
        let off = Writer { enabled: false, ..under_a_file };
        assert!(off.check().is_ok() && !off.write(Some(b"x")).unwrap());
    }

    #[test]
    fn a_directory_that_is_a_link_of_another_user_is_refused_and_nothing_written_there() {
        if crate::sys::unix::effective_uid() != 0 {
            gpushare_test_skip::skip("needs root to make a link of another user");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("net.d");
        fs::create_dir(&target).unwrap();
        let w = writer(tmp.path());
        std::os::unix::fs::symlink(&target, &w.dir).unwrap();
        std::os::unix::fs::lchown(&w.dir, Some(65534), Some(65534)).unwrap();
        let e = w.check().unwrap_err();
        assert!(e.contains("is a symbolic link owned by uid 65534"), "{e}");
        assert_eq!(e.lines().count(), 1);
        assert!(w.write(Some(b"{}")).is_err());
        assert_eq!(fs::read_dir(&target).unwrap().count(), 0);
        // Root's own link (as /var/run -> /run) is followed.
        fs::remove_file(&w.dir).unwrap();
        std::os::unix::fs::symlink(&target, &w.dir).unwrap();
        assert!(w.write(Some(b"{}")).unwrap());
        assert!(target.join(FILE_NAME).is_file());
    }
}
