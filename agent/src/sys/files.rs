//! Files the agent keeps: every one it writes is written atomically, so that a crash leaves
//! either the old or the new content, under a temporary name nobody can guess or plant,
//! and only into a directory it may trust ([`super::trusted`]); every record it reads back
//! is read only from a file it may trust; and the lock that keeps one agent per state
//! directory.

use std::fs::{self, File};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::OFlag;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::trusted;

/// The mode of the agent's own records (the journal holds the text of applied documents):
/// root's (or the agent's user's) alone.
pub const PRIVATE: u32 = 0o600;
/// The mode of files others read (the CDI spec, probe results).
pub const PUBLIC: u32 = 0o644;

/// How many temporary names are tried before giving up (each is random: a clash means
/// someone guessed, or is flooding the directory).
const TEMPORARY_TRIES: usize = 16;

/// Writes `bytes` to `path` with mode `mode`: into a new file of a random name beside it
/// (`O_CREAT|O_EXCL|O_NOFOLLOW`: never a file or link that was there, the mode set on the
/// descriptor before a byte is written), fsynced, renamed over `path` (which replaces a link
/// there rather than follow it), the directory fsynced. The directory must be one the agent
/// may trust; a failure removes the temporary file.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| io::Error::other("no file name"))?;
    let dir = trusted::check_dir(dir)
        .map_err(|why| io::Error::new(io::ErrorKind::PermissionDenied, why))?;
    let target = dir.join(name);
    let (tmp, mut file) = create_temporary(&dir, &name.to_string_lossy(), mode)?;
    let written = (|| {
        // The mode asked for, whatever the umask took away at creation.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, &target)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    File::options()
        .read(true)
        .custom_flags((OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW).bits())
        .open(&dir)?
        .sync_all()
}

/// A new file `.<name>.<random>.tmp` in `dir`, made by this call (`O_EXCL`, `O_NOFOLLOW`).
fn create_temporary(dir: &Path, name: &str, mode: u32) -> io::Result<(std::path::PathBuf, File)> {
    let mut last = None;
    for _ in 0..TEMPORARY_TRIES {
        let tmp = dir.join(format!(".{name}.{:016x}.tmp", random()));
        match File::options()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(OFlag::O_NOFOLLOW.bits())
            .open(&tmp)
        {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no temporary name")))
}

/// 64 bits nobody else can predict: std's hasher keys come from the system's random source
/// (once per thread), and a counter keeps two calls of one thread apart.
fn random() -> u64 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::hash::RandomState::new().build_hasher();
    hasher.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// Takes `<dir>/agent.lock` exclusively for as long as the returned file is open, so that
/// two agents never share a state directory (one would roll back the other's apply). The
/// directory must be one the agent may trust (made, 0755, if missing).
pub fn lock_state_dir(dir: &Path) -> io::Result<File> {
    let resolved = trusted::make_dir(dir, 0o755)
        .map_err(|why| io::Error::new(io::ErrorKind::PermissionDenied, why))?;
    let file = File::options()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(PRIVATE)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(resolved.join("agent.lock"))?;
    if !super::unix::try_lock_exclusive(&file)? {
        // The holder wrote its process id there (a file root or the agent alone writes).
        let mut holder = String::new();
        let _ = (&file).take(16).read_to_string(&mut holder);
        let pid = holder.trim().parse::<u32>().map(|p| format!(" (pid {p})")).unwrap_or_default();
        return Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!("another gpushare-agent{pid} uses {}", dir.display()),
        ));
    }
    keep_private(&file)?;
    file.set_len(0)?;
    (&file).write_all(format!("{}\n", std::process::id()).as_bytes())?;
    Ok(file)
}

/// Takes group and other permissions off `path` (a record written before records were
/// private), when it is there and a file the agent may trust.
pub fn make_private(path: &Path) -> io::Result<()> {
    match trusted::open_file(path)? {
        Some(file) => keep_private(&file),
        None => Ok(()),
    }
}

fn keep_private(file: &File) -> io::Result<()> {
    let mode = file.metadata()?.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        file.set_permissions(fs::Permissions::from_mode(mode & 0o700))?;
    }
    Ok(())
}

/// Reads a JSON record the agent wrote; a missing file is `None`. The file must be one the
/// agent may trust ([`trusted::open_file`]: no link, root's or the agent's, written by no
/// one else); its directory is the caller's to have checked.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> io::Result<Option<T>> {
    let Some(mut file) = trusted::open_file(path)? else { return Ok(None) };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))
}

/// JSON record `name` in directory `dir`, when both are ones the agent may trust
/// ([`trusted::check_dir`], [`read_json`]); `None` when the directory (or the file) is not
/// there, or `dir` is no directory. Untrusted: an error of kind `PermissionDenied` saying
/// why.
pub fn read_record<T: DeserializeOwned>(dir: &Path, name: &str) -> io::Result<Option<T>> {
    match fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        // Not a directory of records (a file, or a link, in a directory the caller checked).
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    }
    trusted::check_dir(dir).map_err(|why| io::Error::new(io::ErrorKind::PermissionDenied, why))?;
    read_json(&dir.join(name))
}

/// Writes a JSON file atomically with mode `mode` ([`PRIVATE`] for the agent's records).
pub fn write_json<T: Serialize>(path: &Path, value: &T, mode: u32) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    write_atomically(path, &bytes, mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_agent_per_state_directory() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock_state_dir(dir.path()).unwrap();
        let e = lock_state_dir(dir.path()).unwrap_err();
        // The holder named by its process id (written into the lock file).
        let holder = format!("another gpushare-agent (pid {}) uses ", std::process::id());
        assert!(e.to_string().starts_with(&holder), "{e}");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        drop(held);
        lock_state_dir(dir.path()).unwrap();
    }

    #[test]
    fn round_trips_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.json");
        assert_eq!(read_json::<Vec<u32>>(&path).unwrap(), None);
        write_json(&path, &vec![1u32, 2], PRIVATE).unwrap();
        write_json(&path, &vec![3u32], PRIVATE).unwrap();
        assert_eq!(read_json::<Vec<u32>>(&path).unwrap(), Some(vec![3]));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        fs::write(&path, "{").unwrap();
        assert!(read_json::<Vec<u32>>(&path).is_err());
    }

    #[test]
    fn a_planted_link_is_never_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let victim = elsewhere.path().join("secret");
        fs::write(&victim, "root's").unwrap();
        fs::set_permissions(&victim, fs::Permissions::from_mode(0o600)).unwrap();
        // The name the temporary file had before, and guesses at the new ones.
        for guess in [".x.json.tmp", ".x.json.0000000000000000.tmp", ".x.json.tmp.0"] {
            std::os::unix::fs::symlink(&victim, dir.path().join(guess)).unwrap();
        }
        let path = dir.path().join("x.json");
        write_atomically(&path, b"new", PRIVATE).unwrap();
        // The file itself a link: replaced by the new file, not followed.
        let linked = dir.path().join("y.json");
        std::os::unix::fs::symlink(&victim, &linked).unwrap();
        write_atomically(&linked, b"y", PUBLIC).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "root's");
        assert_eq!(fs::metadata(&victim).unwrap().permissions().mode() & 0o7777, 0o600);
        for (file, mode) in [(&path, PRIVATE), (&linked, PUBLIC)] {
            let meta = fs::symlink_metadata(file).unwrap();
            assert!(meta.file_type().is_file(), "{file:?}");
            assert_eq!(meta.permissions().mode() & 0o7777, mode, "{file:?}");
        }
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        // Nothing left behind but the two files and the planted links.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 5);
    }

    #[test]
    fn nothing_is_written_into_a_directory_others_may_write_and_a_failure_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let e = write_atomically(&open.join("x.json"), b"x", PRIVATE).unwrap_err();
        assert!(e.to_string().contains("writable by others"), "{e}");
        assert_eq!(fs::read_dir(&open).unwrap().count(), 0);
        let e = lock_state_dir(&open).unwrap_err();
        assert!(e.to_string().contains("writable by others"), "{e}");
        assert_eq!(fs::read_dir(&open).unwrap().count(), 0);
        // A rename that fails (a directory has the name) removes the temporary file.
        fs::create_dir(dir.path().join("taken")).unwrap();
        assert!(write_atomically(&dir.path().join("taken"), b"x", PRIVATE).is_err());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn records_written_before_are_made_private() {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("state.json");
        fs::write(&record, "{}").unwrap();
        fs::write(dir.path().join("agent.lock"), "").unwrap();
        for file in [&record, &dir.path().join("agent.lock")] {
            fs::set_permissions(file, fs::Permissions::from_mode(0o644)).unwrap();
        }
        make_private(&record).unwrap();
        make_private(&dir.path().join("missing.json")).unwrap();
        let _lock = lock_state_dir(dir.path()).unwrap();
        for file in ["state.json", "agent.lock"] {
            let mode = fs::metadata(dir.path().join(file)).unwrap().permissions().mode();
            assert_eq!(mode & 0o7777, 0o600, "{file}");
        }
    }
}
