//! A test double of the GPU backend for the agent's unit tests: an in-process node that
//! follows the driver's rules and answers with the driver's error codes, with injected
//! faults, delays and processes ([`SimOptions`]), persisted to a JSON file when asked.
//!
//! Not what `--simulate` runs: that is the NVML backend on gpushare's simulated driver
//! library (crate `sim/nvml`), so that every end-to-end test runs the production code down
//! to the FFI. This double keeps unit tests of planning and applying in process and fast.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use gpushare_sim_nvml::node::uuid_like;
use serde::{Deserialize, Serialize};

use super::{BackendKind, ErrorCode, GpuBackend, GpuError, MigModeActivation};
use crate::catalog::{self, GpuModel, MigProfile};
use crate::node::{ComputeInstance, ComputeMode, ComputeProcess, GpuInstance, GpuState, Operation};
use crate::sys::files::write_atomically;

/// Fault injection and observation knobs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimOptions {
    /// `(operation, n)`: the n-th call (1-based) of that operation fails.
    pub failures: Vec<(Operation, u32)>,
    /// Delay before every mutating call.
    pub delay: Duration,
    /// Compute processes shown: `(gpu index, gpu instance id, pid)`.
    pub processes: Vec<(u32, Option<u32>, u32)>,
    /// Start as after a reboot: MIG instances gone, pending MIG modes in effect, compute
    /// modes back to default.
    pub reboot: bool,
}

/// The persisted state of the simulated node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SimNode {
    gpus: Vec<SimGpu>,
    /// Bumped for every compute instance created, so MIG UUIDs change like real ones.
    generation: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SimGpu {
    model: String,
    uuid: String,
    mig_enabled: bool,
    /// The MIG mode that takes effect at the next reset (Ampere), when it differs.
    #[serde(default)]
    mig_pending: Option<bool>,
    compute_mode: ComputeMode,
    instances: Vec<SimInstance>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SimInstance {
    id: u32,
    profile_id: u32,
    start: u8,
    size: u8,
    /// (id, `MIG-…`, compute slices).
    compute_instances: Vec<(u32, String, u8)>,
}

impl SimNode {
    fn new(models: &[&'static GpuModel]) -> Self {
        let gpus = models
            .iter()
            .enumerate()
            .map(|(i, m)| SimGpu {
                model: m.key.to_string(),
                uuid: format!("GPU-{}", uuid_like(&[m.key.as_bytes(), &(i as u64).to_le_bytes()])),
                mig_enabled: false,
                mig_pending: None,
                compute_mode: ComputeMode::Default,
                instances: Vec::new(),
            })
            .collect();
        SimNode { gpus, generation: 0 }
    }

    fn models(&self) -> Vec<&str> {
        self.gpus.iter().map(|g| g.model.as_str()).collect()
    }

    /// What a reboot does to MIG: instances never survive it; the MIG mode does, and a
    /// pending one takes effect; compute modes return to default.
    fn reboot(&mut self) {
        for gpu in &mut self.gpus {
            if let Some(mode) = gpu.mig_pending.take() {
                gpu.mig_enabled = mode;
            }
            gpu.instances.clear();
            gpu.compute_mode = ComputeMode::Default;
        }
    }
}

/// A simulated node.
#[derive(Debug)]
pub struct SimBackend {
    node: Mutex<SimNode>,
    path: Option<PathBuf>,
    options: SimOptions,
    /// The injected processes still alive: a forced destroy of their instance ends them.
    processes: Mutex<Vec<(u32, Option<u32>, u32)>>,
    calls: Mutex<HashMap<Operation, u32>>,
}

impl SimBackend {
    /// A node of these GPUs, kept in memory only.
    pub fn new(models: &[&'static GpuModel], options: SimOptions) -> Self {
        SimBackend {
            node: Mutex::new(SimNode::new(models)),
            path: None,
            processes: Mutex::new(options.processes.clone()),
            options,
            calls: Mutex::new(HashMap::new()),
        }
    }

    /// A node of these GPUs persisted at `path`: the state found there is taken up when it
    /// holds the same models; otherwise the node starts fresh (MIG off everywhere).
    pub fn persistent(
        models: &[&'static GpuModel],
        path: &Path,
        options: SimOptions,
    ) -> Result<Self, String> {
        let fresh = SimNode::new(models);
        let mut node = match std::fs::read(path) {
            Ok(bytes) => match serde_json::from_slice::<SimNode>(&bytes) {
                Ok(saved) if saved.models() == fresh.models() => saved,
                Ok(_) => {
                    tracing::warn!(path = %path.display(), "simulated GPUs differ from the saved ones: starting fresh");
                    fresh
                }
                Err(e) => {
                    return Err(format!("{}: unreadable simulator state: {e}", path.display()));
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => fresh,
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        if options.reboot {
            node.reboot();
        }
        let backend = SimBackend {
            node: Mutex::new(node),
            path: Some(path.to_path_buf()),
            processes: Mutex::new(options.processes.clone()),
            options,
            calls: Mutex::new(HashMap::new()),
        };
        backend.save(&backend.node.lock().expect("sim lock")).map_err(|e| e.to_string())?;
        Ok(backend)
    }

    /// Delay, count the call, and fail it when injected; then run `change` on the node and
    /// persist it.
    fn mutate<T>(
        &self,
        op: Operation,
        gpu: u32,
        change: impl FnOnce(&mut SimGpu, &mut u64) -> Result<T, GpuError>,
    ) -> Result<T, GpuError> {
        if !self.options.delay.is_zero() {
            std::thread::sleep(self.options.delay);
        }
        let n = {
            let mut calls = self.calls.lock().expect("sim calls lock");
            let n = calls.entry(op).or_insert(0);
            *n += 1;
            *n
        };
        if self.options.failures.contains(&(op, n)) {
            return Err(GpuError::new(op.as_str(), Some(gpu), injected_code(op))
                .with_detail(format!("injected by GPUSHARE_SIM_FAIL={}:{n}", op.as_str())));
        }
        let mut node = self.node.lock().expect("sim lock");
        let mut draft = node.clone();
        let SimNode { gpus, generation } = &mut draft;
        let sim_gpu = gpus
            .get_mut(gpu as usize)
            .ok_or_else(|| GpuError::new(op.as_str(), Some(gpu), ErrorCode::InvalidArgument))?;
        let out = change(sim_gpu, generation)?;
        self.save(&draft)?;
        *node = draft;
        Ok(out)
    }

    fn save(&self, node: &SimNode) -> Result<(), GpuError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let bytes = serde_json::to_vec_pretty(node).expect("simulator state serializes");
        write_atomically(path, &bytes, crate::sys::files::PUBLIC).map_err(|e| {
            GpuError::new("save", None, ErrorCode::Unknown)
                .with_detail(format!("{}: {e}", path.display()))
        })
    }
}

/// The error the real driver gives when such a call fails for reasons outside the
/// agent's control (something else holds the GPU, resources ran out).
fn injected_code(op: Operation) -> ErrorCode {
    match op {
        Operation::SetMigMode
        | Operation::ResetGpu
        | Operation::DestroyGpuInstance
        | Operation::DestroyComputeInstance => ErrorCode::InUse,
        Operation::CreateGpuInstance | Operation::CreateComputeInstance => {
            ErrorCode::InsufficientResources
        }
        Operation::SetComputeMode => ErrorCode::NoPermission,
        // Not backend calls: the simulator never sees them.
        Operation::StartMps
        | Operation::StopMps
        | Operation::SetMpsLimits
        | Operation::SetTimeslice => ErrorCode::Unknown,
    }
}

fn model_of(gpu: &SimGpu) -> &'static GpuModel {
    catalog::model_by_key(&gpu.model).expect("simulated models come from the catalog")
}

impl GpuBackend for SimBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Simulated
    }

    fn observe(&self) -> Result<Vec<GpuState>, GpuError> {
        let node = self.node.lock().expect("sim lock");
        let processes = self.processes.lock().expect("sim processes lock").clone();
        let gpus = node
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let model = model_of(g);
                let index = i as u32;
                let mut instances: Vec<GpuInstance> = g
                    .instances
                    .iter()
                    .map(|gi| GpuInstance {
                        id: gi.id,
                        profile_id: gi.profile_id,
                        placement_start: gi.start,
                        placement_size: gi.size,
                        compute_instances: gi
                            .compute_instances
                            .iter()
                            .map(|(id, uuid, slices)| ComputeInstance {
                                id: *id,
                                uuid: uuid.clone(),
                                slices: *slices,
                            })
                            .collect(),
                    })
                    .collect();
                instances.sort_by_key(|gi| gi.placement_start);
                GpuState {
                    index,
                    uuid: g.uuid.clone(),
                    name: model.nvml_name.to_string(),
                    pci_device_id: model.pci_device_ids[0],
                    model: Some(model),
                    memory_total_bytes: model.memory_mib << 20,
                    mig_enabled: g.mig_enabled,
                    mig_pending: g.mig_pending,
                    compute_mode: g.compute_mode,
                    instances,
                    processes: processes
                        .iter()
                        .filter(|(gpu, _, _)| *gpu == index)
                        .map(|&(_, gi, pid)| ComputeProcess {
                            pid,
                            gpu_instance_id: gi,
                            used_memory_bytes: None,
                            mps_client: false,
                        })
                        .collect(),
                    // The in-process simulator models no MPS process list.
                    mps_clients_named: false,
                }
            })
            .collect();
        Ok(gpus)
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<MigModeActivation, GpuError> {
        let op = Operation::SetMigMode;
        self.mutate(op, gpu, |g, _| {
            if !model_of(g).supports_mig() {
                return Err(GpuError::new(op.as_str(), Some(gpu), ErrorCode::NotSupported));
            }
            if !enabled && !g.instances.is_empty() {
                return Err(GpuError::new(op.as_str(), Some(gpu), ErrorCode::InUse)
                    .with_detail("GPU instances exist"));
            }
            if enabled == g.mig_enabled {
                g.mig_pending = None;
                return Ok(MigModeActivation::Activated);
            }
            if model_of(g).mode_change_may_need_reset() {
                // Ampere keeps the new mode pending until the GPU is reset.
                g.mig_pending = Some(enabled);
                return Ok(MigModeActivation::PendingReset);
            }
            g.mig_enabled = enabled;
            Ok(MigModeActivation::Activated)
        })
    }

    fn create_gpu_instance(
        &self,
        gpu: u32,
        profile: &MigProfile,
        start: u8,
    ) -> Result<u32, GpuError> {
        let op = Operation::CreateGpuInstance;
        let err = |code| GpuError::new(op.as_str(), Some(gpu), code);
        self.mutate(op, gpu, |g, _| {
            let model = model_of(g);
            if !g.mig_enabled {
                return Err(err(ErrorCode::NotSupported).with_detail("MIG mode is off"));
            }
            let known =
                model.profile_by_id(profile.id).filter(|p| p.nvml_enum == profile.nvml_enum);
            let Some(known) = known else {
                return Err(err(ErrorCode::InvalidArgument).with_detail(format!(
                    "{} has no profile id {}",
                    model.display_name, profile.id
                )));
            };
            if !known.placements.contains(&start) {
                return Err(err(ErrorCode::InvalidArgument)
                    .with_detail(format!("{} cannot start at slot {start}", known.name)));
            }
            let end = start + known.memory_slices;
            let overlaps = g.instances.iter().any(|i| start < i.start + i.size && i.start < end);
            let same = g.instances.iter().filter(|i| i.profile_id == known.id).count();
            let compute: u8 = g
                .instances
                .iter()
                .filter_map(|i| model.profile_by_id(i.profile_id))
                .map(|p| p.compute_slices)
                .sum();
            if overlaps
                || same >= usize::from(known.max_count)
                || compute + known.compute_slices > model.compute_slices
            {
                return Err(err(ErrorCode::InsufficientResources));
            }
            let id = (1..).find(|id| g.instances.iter().all(|i| i.id != *id)).expect("free id");
            g.instances.push(SimInstance {
                id,
                profile_id: known.id,
                start,
                size: known.memory_slices,
                compute_instances: Vec::new(),
            });
            Ok(id)
        })
    }

    fn create_compute_instance(
        &self,
        gpu: u32,
        gpu_instance: u32,
        slices: u8,
    ) -> Result<u32, GpuError> {
        let op = Operation::CreateComputeInstance;
        self.mutate(op, gpu, |g, generation| {
            let uuid_seed = g.uuid.clone();
            let model = model_of(g);
            let gi = g
                .instances
                .iter_mut()
                .find(|i| i.id == gpu_instance)
                .ok_or_else(|| GpuError::new(op.as_str(), Some(gpu), ErrorCode::NotFound))?;
            let profile = model
                .profile_by_id(gi.profile_id)
                .ok_or_else(|| GpuError::new(op.as_str(), Some(gpu), ErrorCode::NotFound))?;
            // As the driver: sizes the GPU instance offers, as many as fit.
            let Some((_, most)) = crate::profile::compute_instance_sizes(model, profile)
                .into_iter()
                .find(|&(c, _)| c == slices)
            else {
                return Err(GpuError::new(op.as_str(), Some(gpu), ErrorCode::NotSupported));
            };
            let used: u8 = gi.compute_instances.iter().map(|ci| ci.2).sum();
            let same = gi.compute_instances.iter().filter(|ci| ci.2 == slices).count();
            if used + slices > profile.compute_slices || same >= usize::from(most) {
                return Err(GpuError::new(
                    op.as_str(),
                    Some(gpu),
                    ErrorCode::InsufficientResources,
                )
                .with_detail("no room for the compute instance"));
            }
            *generation += 1;
            let uuid = format!(
                "MIG-{}",
                uuid_like(&[uuid_seed.as_bytes(), &gi.id.to_le_bytes(), &generation.to_le_bytes()])
            );
            let id =
                (0..).find(|id| gi.compute_instances.iter().all(|ci| ci.0 != *id)).expect("an id");
            gi.compute_instances.push((id, uuid, slices));
            gi.compute_instances.sort_by_key(|ci| ci.0);
            Ok(id)
        })
    }

    fn destroy_compute_instance(
        &self,
        gpu: u32,
        gpu_instance: u32,
        compute_instance: u32,
    ) -> Result<(), GpuError> {
        let op = Operation::DestroyComputeInstance;
        self.mutate(op, gpu, |g, _| {
            let gi = g.instances.iter_mut().find(|i| i.id == gpu_instance);
            let cis = gi
                .map(|gi| &mut gi.compute_instances)
                .filter(|cis| cis.iter().any(|(id, ..)| *id == compute_instance))
                .ok_or_else(|| GpuError::new(op.as_str(), Some(gpu), ErrorCode::NotFound))?;
            cis.retain(|(id, ..)| *id != compute_instance);
            Ok(())
        })
    }

    fn destroy_gpu_instance(&self, gpu: u32, gpu_instance: u32) -> Result<(), GpuError> {
        let op = Operation::DestroyGpuInstance;
        self.mutate(op, gpu, |g, _| {
            let pos = g
                .instances
                .iter()
                .position(|i| i.id == gpu_instance)
                .ok_or_else(|| GpuError::new(op.as_str(), Some(gpu), ErrorCode::NotFound))?;
            if !g.instances[pos].compute_instances.is_empty() {
                return Err(GpuError::new(op.as_str(), Some(gpu), ErrorCode::InUse)
                    .with_detail("compute instances exist"));
            }
            g.instances.remove(pos);
            Ok(())
        })?;
        // The processes that ran in the instance lost their GPU.
        self.processes
            .lock()
            .expect("sim processes lock")
            .retain(|&(g, gi, _)| !(g == gpu && gi == Some(gpu_instance)));
        Ok(())
    }

    fn set_compute_mode(&self, gpu: u32, mode: ComputeMode) -> Result<(), GpuError> {
        self.mutate(Operation::SetComputeMode, gpu, |g, _| {
            g.compute_mode = mode;
            Ok(())
        })
    }

    fn reset_gpu(&self, gpu: u32) -> Result<(), GpuError> {
        let op = Operation::ResetGpu;
        let holders: Vec<String> = self
            .processes
            .lock()
            .expect("sim processes lock")
            .iter()
            .filter(|(g, _, _)| *g == gpu)
            .map(|(_, _, pid)| pid.to_string())
            .collect();
        self.mutate(op, gpu, |g, _| {
            if !holders.is_empty() {
                return Err(GpuError::new(op.as_str(), Some(gpu), ErrorCode::InUse)
                    .with_detail(format!("held by PID {}", holders.join(", "))));
            }
            if let Some(mode) = g.mig_pending.take() {
                g.mig_enabled = mode;
            }
            g.compute_mode = ComputeMode::Default;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::parse_node_spec as parse_spec;

    fn a100(n: usize) -> Vec<&'static GpuModel> {
        parse_spec(&format!("a100-40gb:{n}")).unwrap()
    }

    #[test]
    fn follows_the_drivers_rules() {
        let sim = SimBackend::new(&a100(1), SimOptions::default());
        let p3g = catalog::model_by_key("a100-40gb").unwrap().profile_by_name("3g.20gb").unwrap();
        let p7g = catalog::model_by_key("a100-40gb").unwrap().profile_by_name("7g.40gb").unwrap();
        let code = |r: Result<u32, GpuError>| r.unwrap_err().code;
        assert_eq!(code(sim.create_gpu_instance(0, p3g, 0)), ErrorCode::NotSupported);
        // Ampere: the mode waits for a reset, and instances wait for the mode.
        assert_eq!(sim.set_mig_mode(0, true).unwrap(), MigModeActivation::PendingReset);
        assert_eq!(sim.observe().unwrap()[0].mig_pending, Some(true));
        assert_eq!(code(sim.create_gpu_instance(0, p3g, 4)), ErrorCode::NotSupported);
        sim.reset_gpu(0).unwrap();
        assert!(sim.observe().unwrap()[0].mig_enabled);
        assert_eq!(code(sim.create_gpu_instance(0, p3g, 2)), ErrorCode::InvalidArgument);
        let gi = sim.create_gpu_instance(0, p3g, 4).unwrap();
        assert_eq!(code(sim.create_gpu_instance(0, p7g, 0)), ErrorCode::InsufficientResources);
        let ci = sim.create_compute_instance(0, gi, 3).unwrap();
        assert_eq!(sim.destroy_gpu_instance(0, gi).unwrap_err().code, ErrorCode::InUse);
        assert_eq!(sim.set_mig_mode(0, false).unwrap_err().code, ErrorCode::InUse);
        let seen = sim.observe().unwrap();
        let inst = &seen[0].instances[0];
        assert_eq!((inst.profile_id, inst.placement_start, inst.placement_size), (9, 4, 4));
        assert!(inst.compute_instances[0].uuid.starts_with("MIG-"));
        sim.destroy_compute_instance(0, gi, ci).unwrap();
        sim.destroy_gpu_instance(0, gi).unwrap();
        sim.set_mig_mode(0, false).unwrap();
        let l40s = SimBackend::new(&parse_spec("l40s").unwrap(), SimOptions::default());
        assert_eq!(l40s.set_mig_mode(0, true).unwrap_err().code, ErrorCode::NotSupported);
    }

    #[test]
    fn injected_failures_hit_the_nth_call_and_change_nothing() {
        let options =
            SimOptions { failures: vec![(Operation::SetComputeMode, 2)], ..SimOptions::default() };
        let sim = SimBackend::new(&a100(2), options);
        sim.set_compute_mode(0, ComputeMode::Prohibited).unwrap();
        let e = sim.set_compute_mode(1, ComputeMode::Prohibited).unwrap_err();
        assert_eq!(e.code, ErrorCode::NoPermission);
        assert_eq!(
            e.to_string(),
            "set_compute_mode on GPU 1: Insufficient Permissions (injected by GPUSHARE_SIM_FAIL=set_compute_mode:2)"
        );
        assert_eq!(sim.observe().unwrap()[1].compute_mode, ComputeMode::Default);
        sim.set_compute_mode(1, ComputeMode::Prohibited).unwrap();
    }

    #[test]
    fn state_persists_across_instances_of_the_backend() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim.json");
        let first = SimBackend::persistent(&a100(2), &path, SimOptions::default()).unwrap();
        first.set_mig_mode(1, true).unwrap();
        first.reset_gpu(1).unwrap();
        let uuid = first.observe().unwrap()[1].uuid.clone();
        drop(first);
        let again = SimBackend::persistent(&a100(2), &path, SimOptions::default()).unwrap();
        let seen = again.observe().unwrap();
        assert!(seen[1].mig_enabled);
        assert_eq!(seen[1].uuid, uuid);
        let other = SimBackend::persistent(&a100(3), &path, SimOptions::default()).unwrap();
        assert!(!other.observe().unwrap()[1].mig_enabled);
    }

    #[test]
    fn hopper_switches_at_once_and_resets_fail_while_held() {
        let sim = SimBackend::new(&parse_spec("h100-80gb:1").unwrap(), SimOptions::default());
        assert_eq!(sim.set_mig_mode(0, true).unwrap(), MigModeActivation::Activated);
        let held = SimOptions { processes: vec![(0, None, 77)], ..SimOptions::default() };
        let sim = SimBackend::new(&a100(1), held);
        sim.set_mig_mode(0, true).unwrap();
        let e = sim.reset_gpu(0).unwrap_err();
        assert_eq!(e.to_string(), "reset_gpu on GPU 0: In use by another client (held by PID 77)");
        assert_eq!(sim.observe().unwrap()[0].mig_pending, Some(true));
    }

    #[test]
    fn a_reboot_drops_instances_and_settles_pending_modes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim.json");
        let sim = SimBackend::persistent(&a100(2), &path, SimOptions::default()).unwrap();
        let p1g = catalog::model_by_key("a100-40gb").unwrap().profile_by_name("1g.5gb").unwrap();
        sim.set_mig_mode(0, true).unwrap();
        sim.reset_gpu(0).unwrap();
        sim.create_gpu_instance(0, p1g, 0).unwrap();
        sim.set_mig_mode(1, true).unwrap();
        sim.set_compute_mode(1, ComputeMode::Prohibited).unwrap();
        drop(sim);
        let rebooted = SimOptions { reboot: true, ..SimOptions::default() };
        let seen = SimBackend::persistent(&a100(2), &path, rebooted).unwrap().observe().unwrap();
        assert!(seen[0].mig_enabled && seen[0].instances.is_empty());
        assert!(seen[1].mig_enabled && seen[1].mig_pending.is_none());
        assert_eq!(seen[1].compute_mode, ComputeMode::Default);
    }

    #[test]
    fn processes_are_shown_where_injected() {
        let options = SimOptions { processes: vec![(1, Some(2), 4242)], ..SimOptions::default() };
        let sim = SimBackend::new(&a100(2), options);
        let seen = sim.observe().unwrap();
        assert!(seen[0].processes.is_empty());
        assert_eq!(
            seen[1].processes,
            vec![ComputeProcess {
                pid: 4242,
                gpu_instance_id: Some(2),
                used_memory_bytes: None,
                mps_client: false,
            }]
        );
    }
}
