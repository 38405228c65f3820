//! The node's JSON state file ([`NodeFile`]): reading it, writing it atomically under an
//! exclusive `flock` of `<state>.lock` ([`NodeLock`]), the generation counter in that lock
//! file ([`Generation`]), and rendering the host's files beside it after every write
//! ([`crate::host::render`]). What the file holds is [`crate::node`]'s.
//!
//! Shared by the simulated driver (this crate's C ABI) and the simulated tools
//! (`sim/tools`: `nvidia-smi`, the MPS control daemon), which are separate processes
//! changing the same node. Every change happens under the lock and is written atomically
//! (temporary file + rename), see [`NodeFile::update`].
//!
//! Every write also bumps the node's generation, a counter in the first 8 bytes of
//! `<state>.lock`. Readers map it ([`Generation`]) and re-read the JSON only when it moved:
//! one memory load per NVML call instead of a `stat` (which was half of the agent's time
//! on `gpushare-ctl status`). An edit of the JSON by hand, which bumps nothing, is seen at
//! the next first `nvmlInit` (an agent restart, or the re-initialization after a reset).

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::num::NonZeroUsize;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};

use crate::node::{Node, STATE_ENV};

/// The node's state file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFile {
    path: PathBuf,
}

/// An exclusive `flock` of `<state>.lock` (std's `File::lock`), released when the file is
/// closed on drop. Not nix's `Flock`: it unlocks on drop and panics if that fails, inside a
/// library other programs load.
#[derive(Debug)]
pub struct NodeLock {
    file: File,
}

/// Bytes of `<state>.lock` holding the generation (native-endian `u64` at offset 0).
const GENERATION_BYTES: usize = std::mem::size_of::<u64>();

impl NodeLock {
    /// Bumps the generation; readers that see the new value re-read the state file.
    fn bump_generation(&self) -> std::io::Result<()> {
        let mut bytes = [0; GENERATION_BYTES];
        // A lock file shorter than 8 bytes (new, or from an older build) reads as 0.
        let read = self.file.read_at(&mut bytes, 0)?;
        bytes[read..].fill(0);
        let next = u64::from_ne_bytes(bytes).wrapping_add(1);
        self.file.write_all_at(&next.to_ne_bytes(), 0)
    }
}

/// The node's generation, mapped shared from `<state>.lock`: it moves whenever any process
/// writes the node, so an unchanged value means the node read at that value is current.
#[derive(Debug)]
pub struct Generation {
    counter: NonNull<AtomicU64>,
    _file: File,
}

// SAFETY: the mapping is only ever accessed through an `AtomicU64`, which is `Sync`, and it
// stays valid until `drop`, wherever that runs.
unsafe impl Send for Generation {}
// SAFETY: as above: shared access is atomic loads only.
unsafe impl Sync for Generation {}

impl Generation {
    /// Maps the generation of the node in `file`, creating `<state>.lock` if needed.
    pub fn open(file: &NodeFile) -> Result<Generation, String> {
        let lock_path = file.lock_path();
        let failed = |e: std::io::Error| format!("{}: {e}", lock_path.display());
        let lock = open_lock(&lock_path).map_err(failed)?;
        // Extending is harmless when another process does it at once: it never shortens.
        if lock.metadata().map_err(failed)?.len() < GENERATION_BYTES as u64 {
            lock.set_len(GENERATION_BYTES as u64).map_err(failed)?;
        }
        let len = NonZeroUsize::new(GENERATION_BYTES).expect("a u64 has bytes");
        // SAFETY: a fresh shared mapping of the first 8 bytes of an open file at least that
        // long; the kernel chooses the (page-aligned) address, so it does not alias memory
        // Rust owns, and it is unmapped only in `drop`.
        let addr = unsafe { mmap(None, len, ProtFlags::PROT_READ, MapFlags::MAP_SHARED, &lock, 0) }
            .map_err(|e| format!("{}: mmap: {}", lock_path.display(), std::io::Error::from(e)))?;
        let counter = addr.cast::<AtomicU64>();
        Ok(Generation { counter, _file: lock })
    }

    /// The current generation.
    pub fn current(&self) -> u64 {
        // SAFETY: the page-aligned mapping lives as long as `self` and holds 8 readable
        // bytes; other processes change them only by whole writes under the node's lock.
        unsafe { self.counter.as_ref() }.load(Ordering::Acquire)
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, of that length, unmapped once.
        let _ = unsafe { munmap(self.counter.cast(), GENERATION_BYTES) };
    }
}

impl NodeFile {
    /// The state file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        NodeFile { path: path.into() }
    }

    /// The state file named by `GPUSHARE_SIM_STATE`.
    pub fn from_env() -> Result<Self, String> {
        match std::env::var_os(STATE_ENV) {
            Some(v) if !v.is_empty() => Ok(NodeFile::new(v)),
            _ => Err(format!(
                "{STATE_ENV} is not set: it names the simulated node's state file (gpushare-agent --simulate sets it)"
            )),
        }
    }

    /// The state file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `<state>.lock`.
    pub fn lock_path(&self) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(".lock");
        PathBuf::from(p)
    }

    /// Takes the exclusive lock, waiting for it.
    pub fn lock(&self) -> Result<NodeLock, String> {
        let lock_path = self.lock_path();
        let file = open_lock(&lock_path).map_err(|e| format!("{}: {e}", lock_path.display()))?;
        loop {
            match file.lock() {
                Ok(()) => return Ok(NodeLock { file }),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("{}: flock: {e}", lock_path.display())),
            }
        }
    }

    /// Reads the node (without the lock: the file is only ever replaced whole).
    pub fn read(&self) -> Result<Node, String> {
        self.read_optional()?.ok_or_else(|| {
            format!(
                "no simulated node at {}: start gpushare-agent --simulate first",
                self.path.display()
            )
        })
    }

    /// Reads the node; `None` when the file does not exist.
    pub fn read_optional(&self) -> Result<Option<Node>, String> {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", self.path.display())),
        };
        let node: Node = serde_json::from_slice(&bytes).map_err(|e| {
            format!("{}: unreadable simulated node state: {e}", self.path.display())
        })?;
        node.validate().map_err(|e| {
            format!("{}: unreadable simulated node state: {e}", self.path.display())
        })?;
        Ok(Some(node))
    }

    /// Writes the node atomically (a temporary file in the same directory, then a rename)
    /// under `lock`, bumps its generation, and renders its host's files beside it
    /// ([`crate::host::render`] into `<state>.host/`), so that they follow every change
    /// (MIG capabilities appear and go with their instances).
    pub fn write(&self, lock: &NodeLock, node: &Node) -> Result<(), String> {
        let bytes = serde_json::to_vec_pretty(node).expect("the simulated node serializes");
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(format!(".tmp.{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let mut f = create_temporary(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        let result = (|| {
            f.write_all(&bytes)?;
            f.write_all(b"\n")?;
            std::fs::rename(&tmp, &self.path)?;
            lock.bump_generation()
        })();
        result.map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("{}: {e}", self.path.display())
        })?;
        // A node of unknown models (only tests write one, and reading refuses it) has no
        // host to show.
        if node.validate().is_err() {
            return Ok(());
        }
        crate::host::render(&crate::host::root_of(&self.path), node)
            .map_err(|e| format!("the simulated host: {e}"))
    }

    /// Under the exclusive lock: reads the node, runs `f`, and writes the node atomically
    /// when `f` changed it. Errors when there is no node yet.
    pub fn update<T>(&self, f: impl FnOnce(&mut Node) -> T) -> Result<T, String> {
        let lock = self.lock()?;
        let mut node = self.read()?;
        let before = node.clone();
        let out = f(&mut node);
        if node != before {
            self.write(&lock, &node)?;
        }
        Ok(out)
    }
}

/// Creates the temporary file `tmp` anew (`O_EXCL`: a link planted there is not followed).
/// One in the way is removed first only when it is a regular file of this user's (left by a
/// writer of the same pid that died); anything else is an error, left where it is.
fn create_temporary(tmp: &Path) -> std::io::Result<File> {
    let create = || OpenOptions::new().write(true).create_new(true).open(tmp);
    match create() {
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            let meta = std::fs::symlink_metadata(tmp)?;
            if !meta.file_type().is_file() || meta.uid() != nix::unistd::geteuid().as_raw() {
                return Err(std::io::Error::new(
                    ErrorKind::AlreadyExists,
                    "in the way and not a regular file of this user's: remove it",
                ));
            }
            std::fs::remove_file(tmp)?;
            create()
        }
        created => created,
    }
}

/// Opens (creating it if needed) the lock file `path`, never through a symbolic link: a
/// link planted there (in a shared directory such as /tmp) would have the generation's
/// bytes written into its target.
fn open_lock(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_catalog::parse_node_spec;

    fn a100(n: usize) -> Node {
        Node::new(&parse_node_spec(&format!("a100-40gb:{n}")).unwrap())
    }

    #[test]
    fn the_file_round_trips_under_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let file = NodeFile::new(dir.path().join("node.json"));
        let err = file.read().unwrap_err();
        assert!(err.starts_with("no simulated node at ") && err.ends_with("--simulate first"));
        assert!(file.update(|_| ()).is_err());
        let generation = Generation::open(&file).unwrap();
        assert_eq!(generation.current(), 0);
        file.write(&file.lock().unwrap(), &a100(2)).unwrap();
        assert_eq!(generation.current(), 1);
        assert_eq!(file.update(|n| n.count_tool_call("gpu-reset")).unwrap(), 1);
        assert_eq!(file.update(|n| n.count_tool_call("gpu-reset")).unwrap(), 2);
        assert_eq!(generation.current(), 3);
        // An update that changes nothing does not write.
        file.update(|n| n.gpus.len()).unwrap();
        assert_eq!(generation.current(), 3);
        // Another mapping (another process) sees the same counter.
        assert_eq!(Generation::open(&file).unwrap().current(), 3);
        let node = file.read().unwrap();
        assert_eq!(node.tool_calls["gpu-reset"], 2);
        assert!(file.lock_path().exists());
    }

    #[test]
    fn unknown_models_in_the_file_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = NodeFile::new(dir.path().join("node.json"));
        let mut node = a100(1);
        node.gpus[0].model = "v100".into();
        file.write(&file.lock().unwrap(), &node).unwrap();
        assert!(file.read().unwrap_err().contains("unknown model \"v100\""));
    }

    /// `<state>.tmp.<pid>`, this process's temporary file.
    fn temp_of(file: &NodeFile) -> PathBuf {
        PathBuf::from(format!("{}.tmp.{}", file.path().display(), std::process::id()))
    }

    #[test]
    fn a_link_planted_at_the_temporary_path_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let file = NodeFile::new(dir.path().join("node.json"));
        let target = dir.path().join("precious");
        std::fs::write(&target, "precious\n").unwrap();
        std::os::unix::fs::symlink(&target, temp_of(&file)).unwrap();
        let written = file.write(&file.lock().unwrap(), &a100(1));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious\n");
        let err = written.unwrap_err();
        assert!(err.starts_with(&temp_of(&file).display().to_string()), "{err}");
        assert!(file.read_optional().unwrap().is_none(), "nothing written");
        assert!(temp_of(&file).is_symlink(), "a link not ours is left where it is");
    }

    #[test]
    fn a_link_planted_at_the_lock_path_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let file = NodeFile::new(dir.path().join("node.json"));
        let target = dir.path().join("precious");
        std::fs::write(&target, "pre").unwrap();
        std::os::unix::fs::symlink(&target, file.lock_path()).unwrap();
        let lock = file.lock().map(|_| ()).unwrap_err();
        assert!(lock.starts_with(&file.lock_path().display().to_string()), "{lock}");
        assert!(Generation::open(&file).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "pre", "the target is untouched");
    }

    #[test]
    fn a_stale_temporary_file_of_ours_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let file = NodeFile::new(dir.path().join("node.json"));
        std::fs::write(temp_of(&file), "left by a crash").unwrap();
        file.write(&file.lock().unwrap(), &a100(1)).unwrap();
        assert_eq!(file.read().unwrap(), a100(1));
        assert!(!temp_of(&file).exists());
    }
}
