//! The MPS side of a plan: what a profile's settings make of a server (its limits and
//! mode), which servers stop and start (a server whose limits or mode differ is
//! restarted), which drifted live limits are put back in place, and the refusal to stop a
//! server whose clients would lose their contexts.

use crate::node::{GpuState, LimitDrift, MpsLimits, MpsServerState, MpsSpec, NodeState, size_text};
use crate::profile::{GpuRule, MpsSettings};

use super::{Fate, GpuTarget, MpsDevice, PlanError, Step, instance_fate};

/// The limits of an MPS server for `settings` on a device of `memory_bytes`: what the
/// profile says, else derived from `replicas` (threads 100/replicas %, memory
/// total/replicas), else no limit.
pub fn mps_limits(settings: &MpsSettings, memory_bytes: u64) -> MpsLimits {
    let replicas = settings.replicas.unwrap_or(1).max(1);
    MpsLimits {
        active_thread_percentage: settings
            .active_thread_percentage
            .unwrap_or(100 / replicas)
            .max(1),
        pinned_memory_limit_bytes: settings.pinned_memory_limit_bytes.or_else(|| {
            settings.replicas.map(|r| (memory_bytes / u64::from(r.max(1))) & !((1 << 20) - 1))
        }),
    }
}

/// What a server for `settings` on a device of `memory_bytes` (`device` names it: "the
/// GPU's") is started with, refusing a pinned memory limit larger than the device: MPS
/// would take it and limit nothing.
pub(super) fn device_mps_spec(
    gpu: &GpuState,
    rule: &GpuRule,
    settings: &MpsSettings,
    memory_bytes: u64,
    device: &str,
) -> Result<MpsSpec, PlanError> {
    if let Some(limit) = settings.pinned_memory_limit_bytes
        && limit > memory_bytes
    {
        return Err(PlanError::Infeasible(format!(
            "{}: mps pinned_memory_limit {} (rule at {}) exceeds {device} {}",
            gpu.label(),
            size_text(limit),
            rule.location,
            size_text(memory_bytes)
        )));
    }
    Ok(MpsSpec { limits: mps_limits(settings, memory_bytes), multi_user: settings.multi_user })
}

/// The MPS steps of `gpu` for `target`: servers to stop, and servers to start with the
/// limits of drifted servers put back. A server stays only when it runs, is wanted on the
/// same device with the same limits and mode, and its instance stays; one that stays but
/// whose control daemon answers other limits than the agent set has them put back in
/// place (no restart), unless that means removing a memory limit, which MPS cannot do to
/// a running daemon: that one is restarted.
pub(super) fn mps_steps(
    gpu: &GpuState,
    node: &NodeState,
    target: &GpuTarget,
) -> (Vec<Step>, Vec<Step>) {
    let instance_stays = |start: u8| {
        gpu.instances
            .iter()
            .any(|gi| gi.placement_start == start && instance_fate(gpu, gi, target) == Fate::Stays)
    };
    let wanted = |server: &MpsServerState| -> bool {
        let spec = node.mps_spec(server);
        server.pid.is_some()
            && !drift_of(node, server).removes_memory_limit()
            && match server.placement_start {
                None => !target.mig_enabled && server.uuid == gpu.uuid && target.mps == Some(spec),
                Some(start) => {
                    let index = server.compute_instance;
                    instance_stays(start)
                        && target
                            .instance_mps
                            .iter()
                            .any(|&(s, i, want)| s == start && i == index && want == spec)
                        && gpu.instances.iter().any(|gi| {
                            gi.placement_start == start
                                && gi
                                    .compute_instances
                                    .get(usize::from(index))
                                    .is_some_and(|ci| ci.uuid == server.uuid)
                        })
                }
            }
    };
    let mine: Vec<&MpsServerState> = node.mps.iter().filter(|s| s.gpu == gpu.index).collect();
    let stops = mine
        .iter()
        .filter(|s| !wanted(s))
        .map(|s| Step::StopMps { gpu: gpu.index, uuid: s.uuid.clone() })
        .collect();
    let kept = |start: Option<u8>, index: u8| {
        mine.iter().any(|s| s.placement_start == start && s.compute_instance == index && wanted(s))
    };
    let mut starts = Vec::new();
    // Drifted limits of servers that stay are put back first: nothing else waits on them.
    for server in mine.iter().filter(|s| wanted(s)) {
        let drift = drift_of(node, server);
        if !drift.is_empty() {
            starts.push(Step::SetMpsLimits { gpu: gpu.index, uuid: server.uuid.clone(), drift });
        }
    }
    if let Some(spec) = target.mps
        && !kept(None, 0)
    {
        let device = MpsDevice::Gpu { uuid: gpu.uuid.clone() };
        starts.push(start_step(gpu.index, device, spec));
    }
    for &(start, index, spec) in &target.instance_mps {
        if !kept(Some(start), index) {
            let placed = target.instances.iter().find(|p| p.start == start);
            let profile = placed.map_or("MIG instance", |p| &p.profile.name);
            let compute_instance = placed
                .filter(|p| p.is_subdivided())
                .map(|p| (index, p.compute.sizes().get(usize::from(index)).copied().unwrap_or(0)));
            let device = MpsDevice::Instance { start, profile, compute_instance };
            starts.push(start_step(gpu.index, device, spec));
        }
    }
    (stops, starts)
}

fn start_step(gpu: u32, device: MpsDevice, spec: MpsSpec) -> Step {
    Step::StartMps { gpu, device, limits: spec.limits, multi_user: spec.multi_user }
}

/// How `server`'s live limits differ from what the agent set (nothing where they were
/// not read).
fn drift_of(node: &NodeState, server: &MpsServerState) -> LimitDrift {
    node.mps_detail(&server.uuid).map(|d| d.drift()).unwrap_or_default()
}

/// Refuses to stop MPS servers that have clients: a stop, a restart with other limits or
/// another mode and the end of the instance a server serves all end the clients' CUDA
/// contexts.
pub(super) fn check_no_mps_clients(
    gpu: &GpuState,
    servers: &[MpsServerState],
    stops: &[Step],
) -> Result<(), PlanError> {
    let busy: Vec<&MpsServerState> = stops
        .iter()
        .filter_map(|step| match step {
            Step::StopMps { uuid, .. } => servers.iter().find(|s| &s.uuid == uuid),
            _ => None,
        })
        .filter(|s| !s.clients.is_empty())
        .collect();
    if busy.is_empty() {
        return Ok(());
    }
    let mut pids: Vec<u32> = busy.iter().flat_map(|s| s.clients.iter().copied()).collect();
    pids.sort_unstable();
    pids.dedup();
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    let devices: Vec<&str> = busy.iter().map(|s| s.uuid.as_str()).collect();
    let servers = if devices.len() == 1 { "server" } else { "servers" };
    Err(PlanError::GpuBusy(format!(
        "{}: MPS clients (PID {}) use the MPS {servers} of {} that the plan stops; stop them, or apply with --force",
        gpu.label(),
        list.join(", "),
        devices.join(", ")
    )))
}
