//! What the agent remembers across restarts, in `<state-dir>/state.json`, and the atomic
//! file write everything persistent goes through.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Writes `bytes` to `path` so that a crash leaves either the old or the new content:
/// write a temporary file beside it, fsync it, rename it over, fsync the directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other("no file name"))?;
    let tmp = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    {
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    File::open(dir)?.sync_all()
}

/// The agent's persistent state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentState {
    /// The profile last applied successfully.
    pub active_profile: Option<String>,
}

/// `state.json` in a state directory.
#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    /// The state file of `state_dir`, which is created if missing.
    pub fn open(state_dir: &Path) -> io::Result<Self> {
        fs::create_dir_all(state_dir)?;
        Ok(StateFile {
            path: state_dir.join("state.json"),
        })
    }

    /// Reads the state; a missing file is the empty state.
    pub fn load(&self) -> io::Result<AgentState> {
        match fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {e}", self.path.display()),
                )
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(AgentState::default()),
            Err(e) => Err(e),
        }
    }

    /// Replaces the state atomically.
    pub fn store(&self, state: &AgentState) -> io::Result<()> {
        let bytes = serde_json::to_vec_pretty(state).expect("agent state serializes");
        write_atomically(&self.path, &bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::open(&dir.path().join("nested")).unwrap();
        assert_eq!(file.load().unwrap(), AgentState::default());
        let state = AgentState {
            active_profile: Some("half-balanced".into()),
        };
        file.store(&state).unwrap();
        assert_eq!(file.load().unwrap(), state);
        let leftovers: Vec<_> = fs::read_dir(dir.path().join("nested")).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file left behind");
    }
}
