//! A file the agent keeps for other programs to read (the CDI spec, NVIDIA's device
//! plugin config, the node labels): its place checked before anything depends on it,
//! written atomically (a dot-file of a random name beside it, renamed over: readers that
//! skip dot-files, as NFD does, never see half a file) and only when its bytes change, and
//! only into a directory the agent may trust ([`super::trusted`]: a link another user
//! planted is not followed).

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::files::{PUBLIC, write_atomically};
use super::trusted;

/// A kept file's place, or none (its view is off).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The file.
    pub path: PathBuf,
    /// Whether it is kept at all.
    pub enabled: bool,
    /// How a refusal names the place (`CDI spec directory /var/run/cdi`).
    pub words: String,
    /// The agent.toml key that moves it (`[cdi] dir`).
    pub setting: &'static str,
    /// What the file is, in a refusal (`the spec`).
    pub noun: &'static str,
}

impl Place {
    /// The file's directory.
    fn dir(&self) -> &Path {
        self.path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
    }

    /// Whether the file can be written: its directory is one the agent may trust (made,
    /// 0755, if missing; see [`trusted::check_dir`]), the agent may write it, and the file
    /// if there is one is a plain file. One line naming the place and what to do when not.
    pub fn check(&self) -> Result<(), String> {
        if !self.enabled {
            return Ok(());
        }
        let place = |why: String| {
            format!(
                "{}: {why}; fix it, or set {} (or enabled = false) in agent.toml",
                self.words, self.setting
            )
        };
        let resolved = trusted::make_dir(self.dir(), 0o755)
            .map_err(|why| place(format!("{why}: another user could change {}", self.noun)))?;
        let own = super::unix::effective_uid();
        if let Err(e) = super::unix::may_write_dir(&resolved) {
            return Err(place(format!("not writable by the agent (uid {own}): {e}")));
        }
        let file = resolved.join(self.path.file_name().unwrap_or_default());
        match fs::symlink_metadata(&file) {
            Ok(m) if !m.file_type().is_file() => {
                Err(place(format!("{} is not a plain file", file.display())))
            }
            _ => Ok(()),
        }
    }

    /// The file as it is on disk, if there is one the agent may trust.
    pub fn read(&self) -> Option<Vec<u8>> {
        let mut file = trusted::open_file(&self.path).ok().flatten()?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).ok()?;
        Some(bytes)
    }

    /// Writes `bytes` (mode 0644: others read it) when they differ from what is there;
    /// `None` removes the file. Whether it changed.
    pub fn write(&self, bytes: Option<&[u8]>) -> io::Result<bool> {
        if !self.enabled {
            return Ok(false);
        }
        match bytes {
            None => {
                if fs::symlink_metadata(&self.path).is_err() {
                    return Ok(false);
                }
                self.check().map_err(io::Error::other)?;
                match fs::remove_file(&self.path) {
                    Ok(()) => Ok(true),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
                    Err(e) => Err(e),
                }
            }
            Some(bytes) if self.read().as_deref() == Some(bytes) => Ok(false),
            Some(bytes) => {
                self.check().map_err(io::Error::other)?;
                write_atomically(&self.path, bytes, PUBLIC)?;
                Ok(true)
            }
        }
    }
}
