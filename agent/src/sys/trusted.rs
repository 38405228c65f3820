//! Which directories and files the agent may trust: a root daemon that reads back its
//! records (the journal, `server.json`, …) and writes files where another user can make
//! or swap a path would act on what that user forged, or write through that user's
//! symbolic link. One rule, checked here and nowhere else:
//!
//! - **A trusted directory**: every component from `/` down is a directory owned by root or
//!   by the agent's own user, and writable by no one else (no group or other write bit). A
//!   directory with the sticky bit (`/tmp`) may be writable by others when it is an
//!   *ancestor*: its entries can then be renamed or removed only by their owners, and the
//!   next component's owner is checked in turn. The directory itself never may.
//! - **Symbolic links** on the way are followed only when they are owned by root or the
//!   agent's user (their parent, already checked, keeps anyone else from replacing them):
//!   `/var/run -> /run` is fine, a link another user planted is refused.
//! - **A trusted file** is opened `O_NOFOLLOW` and, on the open descriptor, must be a plain
//!   file owned by root or the agent's user that no one else may write.
//!
//! Reasons are one line naming the component at fault; callers add the place and the
//! setting that points at it. What the agent finds and ignores as untrusted is warned
//! about once ([`warn_ignored`]).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::{self, File, Metadata};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::OFlag;

use super::unix::effective_uid;

/// How many symbolic links a path may go through (the kernel's own limit).
const MAX_LINKS: usize = 40;
/// Write permission for the group and for others.
const OTHERS_WRITE: u32 = 0o022;
/// The sticky bit: entries removable only by their owners.
const STICKY: u32 = 0o1000;

/// Whether `uid` is root or the agent's own user.
fn trusted_owner(uid: u32) -> bool {
    uid == 0 || uid == effective_uid()
}

/// What to do with a component that is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Missing {
    /// Fail: the directory must be there.
    Fail,
    /// Make it: intermediate directories 0755, the last one this mode.
    Make(u32),
    /// Stop there: what exists so far is checked as the ancestors of what the agent will
    /// make (see [`check_creatable`]).
    Stop,
}

/// Checks that `dir` is a directory the agent may trust (see the module docs); returns the
/// path with every symbolic link resolved.
pub fn check_dir(dir: &Path) -> Result<PathBuf, String> {
    walk(dir, Missing::Fail)
}

/// Makes `dir` unless it is there (missing parents 0755, `dir` itself `mode`, made by this
/// process and so owned by root or the agent), then checks it as [`check_dir`] does: a
/// path another user made first, or made a link, is refused. Returns the resolved path.
pub fn make_dir(dir: &Path, mode: u32) -> Result<PathBuf, String> {
    walk(dir, Missing::Make(mode))
}

/// Checks a directory the agent will make later (an MPS root before the first server):
/// when it exists, as [`check_dir`]; else its existing ancestors as ancestors (a sticky
/// `/tmp` among them is fine: [`make_dir`] checks what it made). Returns the deepest
/// existing directory, resolved.
pub fn check_creatable(dir: &Path) -> Result<PathBuf, String> {
    walk(dir, Missing::Stop)
}

/// Opens `path` to read a record the agent wrote: never through a symbolic link in its
/// last component (`O_NOFOLLOW`, `O_NONBLOCK`: no FIFO holds the agent), and only a plain
/// file owned by root or the agent that no one else may write. `None` when it is missing.
/// The directory it is in is the caller's to have checked.
pub fn open_file(path: &Path) -> io::Result<Option<File>> {
    let opened = File::options()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits())
        .open(path);
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ELOOP as i32) => {
            return Err(untrusted(format!("{} is a symbolic link", path.display())));
        }
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(untrusted(format!("{} is not a plain file", path.display())));
    }
    check_owner_and_mode(path, &meta, false).map_err(untrusted)?;
    Ok(Some(file))
}

/// Logs `line`, what the agent ignores as untrusted, as a warning the first time it comes
/// (the same path is looked at again every health check).
pub fn warn_ignored(line: String) {
    static WARNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut warned = WARNED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !warned.contains(&line) {
        tracing::warn!("{line}");
        if warned.len() >= 64 {
            warned.clear();
        }
        warned.push(line);
    }
}

/// An error saying why a path is not trusted.
fn untrusted(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, why)
}

/// Owned by root or the agent, and writable by no one else (unless `ancestor` and sticky).
fn check_owner_and_mode(path: &Path, meta: &Metadata, ancestor: bool) -> Result<(), String> {
    if !trusted_owner(meta.uid()) {
        return Err(format!(
            "{} is owned by uid {}, not root or the agent (uid {})",
            path.display(),
            meta.uid(),
            effective_uid()
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & OTHERS_WRITE != 0 && !(ancestor && mode & STICKY != 0) {
        return Err(format!("{} is writable by others (mode {mode:04o})", path.display()));
    }
    Ok(())
}

/// Walks `dir` from `/` (a relative path from the current directory, which `getcwd` gives
/// resolved), resolving symbolic links as the kernel would, checking each component.
fn walk(dir: &Path, missing: Missing) -> Result<PathBuf, String> {
    let absolute = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        let cwd = std::env::current_dir().map_err(|e| format!("the current directory: {e}"))?;
        cwd.join(dir)
    };
    let mut todo: VecDeque<OsString> = names(&absolute);
    let mut resolved = PathBuf::from("/");
    let root = fs::symlink_metadata(&resolved).map_err(|e| format!("/: {e}"))?;
    check_owner_and_mode(&resolved, &root, true)?;
    let mut links = 0;
    let mut stopped = false;
    while let Some(name) = todo.pop_front() {
        if name == ".." {
            resolved.pop();
            continue;
        }
        let next = resolved.join(&name);
        let meta = match fs::symlink_metadata(&next) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => match missing {
                Missing::Fail => return Err(format!("{} does not exist", next.display())),
                Missing::Stop => {
                    stopped = true;
                    break;
                }
                Missing::Make(mode) => {
                    let mode = if todo.is_empty() { mode } else { 0o755 };
                    match fs::DirBuilder::new().mode(mode).create(&next) {
                        Ok(()) => {}
                        // Someone else's, perhaps: looked at below like any other.
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(format!("{} cannot be made: {e}", next.display())),
                    }
                    fs::symlink_metadata(&next).map_err(|e| format!("{}: {e}", next.display()))?
                }
            },
            Err(e) => return Err(format!("{}: {e}", next.display())),
        };
        if meta.file_type().is_symlink() {
            if !trusted_owner(meta.uid()) {
                return Err(format!(
                    "{} is a symbolic link owned by uid {}, not root or the agent (uid {})",
                    next.display(),
                    meta.uid(),
                    effective_uid()
                ));
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(format!("{}: more than {MAX_LINKS} symbolic links", dir.display()));
            }
            let target = fs::read_link(&next).map_err(|e| format!("{}: {e}", next.display()))?;
            if target.is_absolute() {
                resolved = PathBuf::from("/");
            }
            for name in names(&target).into_iter().rev() {
                todo.push_front(name);
            }
            continue;
        }
        if !meta.is_dir() {
            return Err(format!("{} is not a directory", next.display()));
        }
        check_owner_and_mode(&next, &meta, true)?;
        resolved = next;
    }
    // The directory itself is no mere ancestor: no one else may write it, sticky or not.
    // (Where the walk stopped short, what the agent makes there is checked when it does.)
    let meta =
        fs::symlink_metadata(&resolved).map_err(|e| format!("{}: {e}", resolved.display()))?;
    check_owner_and_mode(&resolved, &meta, stopped)?;
    Ok(resolved)
}

/// The names of `path`'s components, `..` kept (resolved against the real directories as
/// the walk goes), `.` and `/` left out.
fn names(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn chmod(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_private_directory_under_tmp_is_trusted_and_made_with_its_mode() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(check_dir(tmp.path()).unwrap(), fs::canonicalize(tmp.path()).unwrap());
        let made = tmp.path().join("a/b/state");
        make_dir(&made, 0o700).unwrap();
        assert_eq!(fs::metadata(&made).unwrap().mode() & 0o7777, 0o700);
        assert_eq!(fs::metadata(tmp.path().join("a")).unwrap().mode() & 0o022, 0);
        // Made already: checked again, not made again.
        make_dir(&made, 0o755).unwrap();
        assert_eq!(fs::metadata(&made).unwrap().mode() & 0o7777, 0o700);
        // `..` resolves against real directories.
        assert_eq!(
            check_dir(&tmp.path().join("a/b/../b/state")).unwrap(),
            fs::canonicalize(&made).unwrap()
        );
    }

    #[test]
    fn a_directory_others_may_write_is_refused_unless_a_sticky_ancestor() {
        let tmp = tempfile::tempdir().unwrap();
        let open = tmp.path().join("open");
        fs::create_dir(&open).unwrap();
        chmod(&open, 0o777);
        let e = check_dir(&open).unwrap_err();
        assert!(
            e.contains(&format!("{} is writable by others (mode 0777)", open.display())),
            "{e}"
        );
        fs::create_dir(open.join("inner")).unwrap();
        assert!(check_dir(&open.join("inner")).unwrap_err().contains("writable by others"));
        // Sticky, like /tmp: fine above the directory, never the directory itself.
        chmod(&open, 0o1777);
        check_dir(&open.join("inner")).unwrap();
        assert!(check_dir(&open).unwrap_err().contains("mode 1777"));
        // What the agent will make under a sticky directory: checked once made.
        check_creatable(&open.join("not-yet/mps")).unwrap();
        check_creatable(&open.join("inner/not-yet/mps")).unwrap();
        chmod(&open, 0o777);
        assert!(check_creatable(&open.join("not-yet/mps")).unwrap_err().contains("mode 0777"));
        chmod(&open, 0o1777);
        // Group write is write by others too.
        chmod(&open.join("inner"), 0o775);
        assert!(check_dir(&open.join("inner")).unwrap_err().contains("mode 0775"));
    }

    #[test]
    fn links_are_followed_only_when_root_or_the_agent_made_them() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, tmp.path().join("link")).unwrap();
        std::os::unix::fs::symlink("real", tmp.path().join("relative")).unwrap();
        let real = fs::canonicalize(&real).unwrap();
        assert_eq!(check_dir(&tmp.path().join("link")).unwrap(), real);
        assert_eq!(check_dir(&tmp.path().join("relative")).unwrap(), real);
        std::os::unix::fs::symlink("loop", tmp.path().join("loop")).unwrap();
        assert!(check_dir(&tmp.path().join("loop")).unwrap_err().contains("symbolic links"));
        // A link to something that is not a directory, or to nothing.
        fs::write(tmp.path().join("file"), "").unwrap();
        std::os::unix::fs::symlink("file", tmp.path().join("to-file")).unwrap();
        assert!(check_dir(&tmp.path().join("to-file")).unwrap_err().contains("not a directory"));
        std::os::unix::fs::symlink("gone", tmp.path().join("dangling")).unwrap();
        assert!(check_dir(&tmp.path().join("dangling")).unwrap_err().contains("does not exist"));
    }

    #[test]
    fn paths_of_another_user_are_refused() {
        if effective_uid() != 0 {
            gpushare_test_skip::skip("needs root to make files of another user");
            return;
        }
        let nobody = 65534;
        let tmp = tempfile::tempdir().unwrap();
        let theirs = tmp.path().join("theirs");
        fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(nobody), Some(nobody)).unwrap();
        let e = check_dir(&theirs).unwrap_err();
        assert!(e.contains(&format!("{} is owned by uid {nobody}", theirs.display())), "{e}");
        // Made by them before the agent came: refused, not taken over.
        assert!(make_dir(&theirs, 0o755).is_err());
        assert!(make_dir(&theirs.join("state"), 0o755).unwrap_err().contains("uid 65534"));
        assert!(!theirs.join("state").exists());
        // Their link to a root directory.
        let root_dir = tmp.path().join("root-dir");
        fs::create_dir(&root_dir).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&root_dir, &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(nobody), Some(nobody)).unwrap();
        let e = check_dir(&link).unwrap_err();
        assert!(e.contains("is a symbolic link owned by uid 65534"), "{e}");
        // Their file.
        let file = tmp.path().join("record.json");
        fs::write(&file, "{}").unwrap();
        std::os::unix::fs::chown(&file, Some(nobody), Some(nobody)).unwrap();
        let e = open_file(&file).unwrap_err();
        assert!(e.to_string().contains("owned by uid 65534"), "{e}");
    }

    #[test]
    fn a_record_is_a_plain_file_nobody_else_writes_never_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("state.json");
        assert!(open_file(&file).unwrap().is_none());
        fs::write(&file, "{}").unwrap();
        chmod(&file, 0o644);
        assert!(open_file(&file).unwrap().is_some());
        chmod(&file, 0o666);
        assert!(open_file(&file).unwrap_err().to_string().contains("mode 0666"));
        chmod(&file, 0o600);
        let link = tmp.path().join("link.json");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(open_file(&link).unwrap_err().to_string().contains("is a symbolic link"));
        assert!(open_file(tmp.path()).unwrap_err().to_string().contains("not a plain file"));
    }
}
