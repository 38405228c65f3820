//! Where the spec goes: `<dir>/gpushare.json`, written atomically (a temporary file of a
//! random name beside it, renamed over), only into a directory the agent may trust
//! ([`crate::sys::trusted`]: a link another user planted is not followed), and only when
//! its bytes change. [`Writer::check`] is what an apply checks before its first step.

use std::path::PathBuf;

use super::FILE_NAME;
use crate::sys::place::Place;

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

    /// The spec as a kept file.
    fn place(&self) -> Place {
        Place {
            path: self.path(),
            enabled: self.enabled,
            words: format!("CDI spec directory {}", self.dir.display()),
            setting: "[cdi] dir",
            noun: "the spec",
        }
    }

    /// Whether the spec can be written (see [`Place::check`]): one line naming the
    /// directory and what to do when not.
    pub fn check(&self) -> Result<(), String> {
        self.place().check()
    }

    /// The spec as it is on disk, if there is one the agent may trust.
    pub fn read(&self) -> Option<Vec<u8>> {
        self.place().read()
    }

    /// Writes `bytes` as the spec (mode 0644: container runtimes read it) when they differ
    /// from what is there; `None` removes the spec (a node with no device to name: CDI
    /// wants at least one). Whether it changed.
    pub fn write(&self, bytes: Option<&[u8]>) -> std::io::Result<bool> {
        self.place().write(bytes)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
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
