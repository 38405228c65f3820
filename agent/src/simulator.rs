//! Where gpushare's simulator is installed, and how `--simulate` hands it the node.
//!
//! The simulator is a driver, not a second agent: a simulated `libnvidia-ml` (crate
//! `sim/nvml`) that the ordinary NVML backend loads, plus simulated `nvidia-smi` and
//! `nvidia-cuda-mps-control` (crate `sim/tools`) that the ordinary sharing layer runs. They
//! share one node, a JSON file in the agent's state directory, which they find through
//! the environment the agent sets for itself before it starts any thread
//! ([`SimulatedNode::export`]) and its tools inherit.
//!
//! Looked for, in order: `$GPUSHARE_SIM_DIR`; the agent's own directory under cargo's
//! names (a build tree: `libgpushare_sim_nvml.so` there or in `deps/`, where `cargo test`
//! leaves it, `gpushare-sim-nvidia-smi`, `gpushare-sim-nvidia-cuda-mps-control`); `<agent dir>/../lib/gpushare/sim` and
//! `/usr/lib/gpushare/sim` under the installed names (`libnvidia-ml.so.1`, `nvidia-smi`,
//! `nvidia-cuda-mps-control`), where the .deb puts them.
//!
//! A simulated agent is a sandbox (issue 37): [`ROOT_STATE_DIR`] is its state directory as
//! root, and [`claim_state_dir`] marks a state directory with the driver of the agent that
//! uses it, so that a real agent never takes up a simulated node's journal, nor a simulated
//! one a real node's.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The node's state file in the state directory.
pub const STATE_FILE: &str = "simulated-gpus.json";
/// The variable naming the node's state file (read by the simulated library and tools).
pub const STATE_ENV: &str = "GPUSHARE_SIM_STATE";
/// The variable holding the `--simulate` spec (read by the simulated library).
pub const NODE_ENV: &str = "GPUSHARE_SIM_NODE";
/// The variable naming a directory that holds the simulator, over the default places.
pub const DIR_ENV: &str = "GPUSHARE_SIM_DIR";
/// Where the .deb installs the simulator.
pub const INSTALLED_DIR: &str = "/usr/lib/gpushare/sim";
/// The variable in which the agent says, from its start on, which driver it means to
/// drive: `simulated` under `--simulate`, `nvidia` otherwise. The simulated library refuses
/// to start in a process that says `nvidia`, before it reads a knob or touches a file
/// (issue 36); the agent's children inherit it.
pub const DRIVER_ENV: &str = "GPUSHARE_AGENT_DRIVER";

/// Says in this process's environment ([`DRIVER_ENV`]) which driver it means to drive,
/// whatever the environment it was started with said.
///
/// # Safety
///
/// No other thread may run: setting the environment races with any concurrent read of
/// it (`getenv` in libc). Call it from `main` before the async runtime starts.
pub unsafe fn declare_driver(simulated: bool) {
    let driver = if simulated { "simulated" } else { "nvidia" };
    // SAFETY: the caller guarantees that this process has a single thread.
    unsafe { std::env::set_var(DRIVER_ENV, driver) };
}

/// Where a simulated agent run as root keeps its state when neither `--state-dir` nor the
/// `agent.toml` it was given names a place: never the packaged `/var/lib/gpushare`, and gone
/// at the next boot, as a trial should be.
pub const ROOT_STATE_DIR: &str = "/run/gpushare-sim";
/// The file in a state directory that says which driver its agent drives.
pub const DRIVER_FILE: &str = "driver.json";
/// The journal's file, whose presence without [`DRIVER_FILE`] or [`STATE_FILE`] says that a
/// real agent (of a version before [`DRIVER_FILE`]) used the directory.
const JOURNAL_FILE: &str = "state.json";

/// What [`DRIVER_FILE`] holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverRecord {
    /// `simulated` or `nvidia`, as [`DRIVER_ENV`] says it.
    pub driver: String,
    /// The `--simulate` spec of a simulated node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<String>,
}

/// Which driver the agent that used `state_dir` drove: from [`DRIVER_FILE`], or for a
/// directory an agent before it wrote, from the simulated node's file (a simulated agent)
/// or the journal alone (a real one). `None` for a directory no agent used.
pub fn state_dir_driver(state_dir: &Path) -> Result<Option<DriverRecord>, String> {
    let path = state_dir.join(DRIVER_FILE);
    match crate::sys::files::read_json::<DriverRecord>(&path) {
        Ok(Some(record)) => return Ok(Some(record)),
        Ok(None) => {}
        Err(e) => return Err(format!("{}: {e}", path.display())),
    }
    let found = |name: &str| std::fs::symlink_metadata(state_dir.join(name)).is_ok();
    Ok(if found(STATE_FILE) {
        Some(DriverRecord { driver: "simulated".into(), spec: None })
    } else if found(JOURNAL_FILE) {
        Some(DriverRecord { driver: "nvidia".into(), spec: None })
    } else {
        None
    })
}

/// Takes `state_dir` (locked, trusted) for an agent on simulated GPUs (`simulate`, the
/// spec) or on NVIDIA's driver (`None`): refused in one line when an agent of the other
/// kind used it, else marked as this kind's.
pub fn claim_state_dir(state_dir: &Path, simulate: Option<&str>) -> Result<(), String> {
    let dir = state_dir.display();
    let found = state_dir_driver(state_dir)?;
    match (&found, simulate) {
        (Some(record), None) if record.driver != "nvidia" => {
            let spec =
                record.spec.as_deref().map(|s| format!(" (--simulate {s})")).unwrap_or_default();
            return Err(format!(
                "state directory {dir} was written by a simulated agent{spec}: a real agent does \
                 not take up a simulated node's profile and journal; remove it (rm -r {dir}) or \
                 give the agent another (--state-dir, or state_dir in agent.toml)"
            ));
        }
        (Some(record), Some(_)) if record.driver == "nvidia" => {
            return Err(format!(
                "state directory {dir} is a real agent's (NVIDIA driver): a simulated agent \
                 does not take it; give it another with --state-dir DIR"
            ));
        }
        _ => {}
    }
    let record = DriverRecord {
        driver: if simulate.is_some() { "simulated" } else { "nvidia" }.into(),
        spec: simulate.map(str::to_owned),
    };
    if found.as_ref() == Some(&record) {
        return Ok(());
    }
    crate::sys::files::write_json(&state_dir.join(DRIVER_FILE), &record, crate::sys::files::PRIVATE)
        .map_err(|e| format!("state directory {dir}: writing {DRIVER_FILE}: {e}"))
}

/// The simulator's three files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimulatorFiles {
    /// The simulated `libnvidia-ml`.
    pub library: PathBuf,
    /// The simulated `nvidia-smi`.
    pub nvidia_smi: PathBuf,
    /// The simulated `nvidia-cuda-mps-control`.
    pub mps_control: PathBuf,
}

impl SimulatorFiles {
    /// The files in `dir` under cargo's names, or else under the installed names; `None`
    /// when the library is under neither.
    pub fn in_dir(dir: &Path) -> Option<SimulatorFiles> {
        if let Some(library) = built_library(dir) {
            return Some(SimulatorFiles {
                library,
                nvidia_smi: dir.join("gpushare-sim-nvidia-smi"),
                mps_control: dir.join("gpushare-sim-nvidia-cuda-mps-control"),
            });
        }
        let library = dir.join("libnvidia-ml.so.1");
        library.is_file().then(|| SimulatorFiles {
            library,
            nvidia_smi: dir.join("nvidia-smi"),
            mps_control: dir.join("nvidia-cuda-mps-control"),
        })
    }

    /// The simulator, from the places in the module docs; the error names them.
    pub fn find() -> Result<SimulatorFiles, String> {
        let mut places = Vec::new();
        if let Some(dir) = std::env::var_os(DIR_ENV).filter(|d| !d.is_empty()) {
            places.push(PathBuf::from(dir));
        } else {
            if let Some(own) =
                std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf))
            {
                places.push(own.join("../lib/gpushare/sim"));
                places.push(own);
            }
            places.push(PathBuf::from(INSTALLED_DIR));
        }
        // Cargo's layout first: a build tree beside an installed package runs its own build.
        places.sort_by_key(|p| built_library(p).is_none());
        places.iter().find_map(|dir| SimulatorFiles::in_dir(dir)).ok_or_else(|| {
            // A place there but out of reach (a directory above it this user may not
            // search, as a clone in root's 0700 home is for everyone else) says why.
            let shown: Vec<String> = places
                .iter()
                .map(|p| match std::fs::metadata(p) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        format!("{} (cannot be reached: {e})", p.display())
                    }
                    _ => p.display().to_string(),
                })
                .collect();
            format!(
                "--simulate: gpushare's simulated driver is not installed (looked in {}; set {DIR_ENV} \
                 to the directory holding it)",
                shown.join(", ")
            )
        })
    }
}

/// The simulated library in a cargo build directory: `cargo build` puts it in the directory
/// itself, while `cargo test`, which builds it only as a dependency, leaves it in `deps/`
/// and the copy above goes stale; the newer of the two is the one built from this tree.
fn built_library(dir: &Path) -> Option<PathBuf> {
    [dir.to_path_buf(), dir.join("deps")]
        .into_iter()
        .map(|d| d.join("libgpushare_sim_nvml.so"))
        .filter_map(|library| {
            let meta = std::fs::metadata(&library).ok()?;
            meta.is_file().then_some((meta.modified().ok()?, library))
        })
        .max_by_key(|(modified, _)| *modified)
        .map(|(_, library)| library)
}

/// A simulated node: its spec and its state file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimulatedNode {
    /// The `--simulate` spec (`a100-40gb:8`), already checked.
    pub spec: String,
    /// The node's state file.
    pub state: PathBuf,
}

impl SimulatedNode {
    /// The node of `spec` kept in `state_dir`.
    pub fn new(spec: &str, state_dir: &Path) -> SimulatedNode {
        SimulatedNode { spec: spec.to_owned(), state: state_dir.join(STATE_FILE) }
    }

    /// The simulated host beside the state file, `<state>.host`: the files the simulated
    /// driver writes for what decides whether a GPU can be reset (`sys/`, `run/`,
    /// `proc/`), read by the agent as it reads `/` on a real host (agent.toml `host_root`).
    pub fn host_root(&self) -> PathBuf {
        let mut root = self.state.clone().into_os_string();
        root.push(".host");
        PathBuf::from(root)
    }

    /// A private directory holding a copy of the node's state file in `state_dir` (none
    /// when there is none yet), for a run that must leave the node as it is.
    pub fn scratch_copy(spec: &str, state_dir: &Path) -> Result<tempfile::TempDir, String> {
        let scratch = tempfile::Builder::new()
            .prefix("gpushare-check-")
            .tempdir()
            .map_err(|e| format!("a scratch directory for the simulated node: {e}"))?;
        let kept = state_dir.join(STATE_FILE);
        match std::fs::copy(&kept, scratch.path().join(STATE_FILE)) {
            Ok(_) => Ok(scratch),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(scratch),
            Err(e) => Err(format!("--simulate {spec}: reading {}: {e}", kept.display())),
        }
    }

    /// Puts the node into this process's environment, for the simulated library and the
    /// tools the agent runs.
    ///
    /// # Safety
    ///
    /// No other thread may run: setting the environment races with any concurrent read of
    /// it (`getenv` in libc). Call it from `main` before the async runtime starts.
    pub unsafe fn export(&self) {
        // SAFETY: the caller guarantees that this process has a single thread.
        unsafe {
            std::env::set_var(NODE_ENV, &self.spec);
            std::env::set_var(STATE_ENV, &self.state);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_layouts_are_found_and_the_build_tree_wins() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(SimulatorFiles::in_dir(dir.path()), None);
        std::fs::write(dir.path().join("libnvidia-ml.so.1"), b"").unwrap();
        let installed = SimulatorFiles::in_dir(dir.path()).unwrap();
        assert_eq!(installed.nvidia_smi, dir.path().join("nvidia-smi"));
        assert_eq!(installed.mps_control, dir.path().join("nvidia-cuda-mps-control"));
        std::fs::write(dir.path().join("libgpushare_sim_nvml.so"), b"").unwrap();
        let built = SimulatorFiles::in_dir(dir.path()).unwrap();
        assert_eq!(built.library, dir.path().join("libgpushare_sim_nvml.so"));
        assert_eq!(built.nvidia_smi, dir.path().join("gpushare-sim-nvidia-smi"));
    }

    #[test]
    fn a_library_cargo_test_left_in_deps_is_found() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("deps")).unwrap();
        std::fs::write(dir.path().join("deps/libgpushare_sim_nvml.so"), b"").unwrap();
        let built = SimulatorFiles::in_dir(dir.path()).unwrap();
        assert_eq!(built.library, dir.path().join("deps/libgpushare_sim_nvml.so"));
        assert_eq!(built.mps_control, dir.path().join("gpushare-sim-nvidia-cuda-mps-control"));

        // A copy from an older `cargo build` beside it loses to the newer one in deps/.
        let stale = dir.path().join("libgpushare_sim_nvml.so");
        std::fs::write(&stale, b"").unwrap();
        let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&stale)
            .unwrap()
            .set_modified(an_hour_ago)
            .unwrap();
        assert_eq!(SimulatorFiles::in_dir(dir.path()).unwrap().library, built.library);
        std::fs::File::options()
            .write(true)
            .open(&stale)
            .unwrap()
            .set_modified(an_hour_ago + std::time::Duration::from_secs(7200))
            .unwrap();
        assert_eq!(SimulatorFiles::in_dir(dir.path()).unwrap().library, stale);
    }

    #[test]
    fn a_state_directory_is_one_drivers() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        // Unused: taken and marked, by either kind.
        assert_eq!(state_dir_driver(state).unwrap(), None);
        claim_state_dir(state, Some("a100-40gb:8")).unwrap();
        let marked = state_dir_driver(state).unwrap().unwrap();
        assert_eq!(
            (marked.driver.as_str(), marked.spec.as_deref()),
            ("simulated", Some("a100-40gb:8"))
        );
        // Another spec is the same kind; a real agent is refused in one line.
        claim_state_dir(state, Some("h100-80gb:1")).unwrap();
        let e = claim_state_dir(state, None).unwrap_err();
        assert!(e.contains("was written by a simulated agent (--simulate h100-80gb:1)"), "{e}");
        assert!(e.contains("--state-dir"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");

        // A real agent's directory is refused to a simulated one.
        let real = tempfile::tempdir().unwrap();
        claim_state_dir(real.path(), None).unwrap();
        let e = claim_state_dir(real.path(), Some("a100-40gb:1")).unwrap_err();
        assert!(e.contains("is a real agent's") && e.contains("--state-dir"), "{e}");

        // Directories of agents before the mark: told apart by their files.
        let old_sim = tempfile::tempdir().unwrap();
        std::fs::write(old_sim.path().join(STATE_FILE), b"{}").unwrap();
        std::fs::write(old_sim.path().join(JOURNAL_FILE), b"{}").unwrap();
        assert!(claim_state_dir(old_sim.path(), None).is_err());
        let old_real = tempfile::tempdir().unwrap();
        std::fs::write(old_real.path().join(JOURNAL_FILE), b"{}").unwrap();
        assert!(claim_state_dir(old_real.path(), Some("a100-40gb:1")).is_err());
        claim_state_dir(old_real.path(), None).unwrap();
    }

    #[test]
    fn the_node_lives_in_the_state_directory() {
        let node = SimulatedNode::new("a100-40gb:2", Path::new("/var/lib/gpushare"));
        assert_eq!(node.state, Path::new("/var/lib/gpushare/simulated-gpus.json"));
        // Where the simulated driver writes the host's files.
        assert_eq!(node.host_root(), gpushare_sim_nvml::host::root_of(&node.state));
    }
}
