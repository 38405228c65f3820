//! Files the agent keeps: every one it writes is written atomically, so that a crash leaves
//! either the old or the new content; and the lock that keeps one agent per state
//! directory.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Writes `bytes` to `path`: a temporary file beside it, fsync, rename over, fsync the
/// directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| io::Error::other("no file name"))?;
    let tmp = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    {
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    File::open(dir)?.sync_all()
}

/// Takes `<dir>/agent.lock` exclusively for as long as the returned file is open, so that
/// two agents never share a state directory (one would roll back the other's apply).
pub fn lock_state_dir(dir: &Path) -> io::Result<File> {
    fs::create_dir_all(dir)?;
    let file =
        File::options().create(true).truncate(false).write(true).open(dir.join("agent.lock"))?;
    if !super::unix::try_lock_exclusive(&file)? {
        return Err(io::Error::other(format!("another gpushare-agent uses {}", dir.display())));
    }
    Ok(file)
}

/// Reads a JSON file; a missing file is `None`.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> io::Result<Option<T>> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display()))
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes a JSON file atomically.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    write_atomically(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_agent_per_state_directory() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock_state_dir(dir.path()).unwrap();
        let e = lock_state_dir(dir.path()).unwrap_err();
        assert!(e.to_string().starts_with("another gpushare-agent uses "), "{e}");
        drop(held);
        lock_state_dir(dir.path()).unwrap();
    }

    #[test]
    fn round_trips_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.json");
        assert_eq!(read_json::<Vec<u32>>(&path).unwrap(), None);
        write_json(&path, &vec![1u32, 2]).unwrap();
        write_json(&path, &vec![3u32]).unwrap();
        assert_eq!(read_json::<Vec<u32>>(&path).unwrap(), Some(vec![3]));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        fs::write(&path, "{").unwrap();
        assert!(read_json::<Vec<u32>>(&path).is_err());
    }
}
