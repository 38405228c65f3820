//! The engine's answers as the protocol's documents: domain types in, `gpushare-proto`
//! types out. No decisions are made here, only translations.

use gpushare_proto::types::{
    ComputeInstanceStatus, GpuStatus, InstanceStatus, JobOutcome, MpsLimitValues, MpsServer,
    MpsServerProcess, ProbeClient, ProbeRun, ProfileSummary, Sharing,
};
use gpushare_proto::{ServerState, Strategy};

use super::jobs::JobReport;
use crate::node::{GpuState, MpsLimits, MpsServerDetail, MpsServerState, NodeState};
use crate::probe::RunResult;
use crate::profile::StoredProfile;
use crate::sharing::mps::MpsController;

/// A profile in the list, marked active when it is `active`.
pub fn summary(stored: &StoredProfile, active: Option<&str>) -> ProfileSummary {
    ProfileSummary {
        name: stored.profile.name.clone(),
        description: stored.profile.description.clone(),
        source: stored.source.to_string(),
        active: active == Some(stored.profile.name.as_str()),
    }
}

/// A finished job as its client reads it; `error_name` is the D-Bus name of its error
/// (the service's to give).
pub fn job_outcome(report: &JobReport, error_name: Option<String>) -> JobOutcome {
    JobOutcome {
        ok: report.result.is_ok(),
        profile: report.kind.subject(),
        changed: report.changed,
        steps_done: report.steps_done,
        steps_total: report.steps_total,
        duration_seconds: report.duration.as_secs_f64(),
        error_name,
        error: report.error.as_ref().map(ToString::to_string),
        warnings: report.warnings.clone(),
        probe: report.probe.clone(),
        bench: report.bench.clone(),
        private: false,
    }
}

/// What everyone may read of a job's outcome: all of it, unless it is its caller's alone
/// (a bench), whose public part says how it ended and nothing of what it ran or printed.
pub fn public_outcome(report: &JobReport, whole: &JobOutcome) -> JobOutcome {
    if !report.kind.is_private() {
        return whole.clone();
    }
    JobOutcome {
        error: whole.error.as_ref().map(|_| {
            "the bench failed; its caller reads why (gpushare-ctl bench shows it)".to_string()
        }),
        warnings: Vec::new(),
        probe: None,
        bench: None,
        private: true,
        ..whole.clone()
    }
}

/// One probe run: its solo figures, scaling, fairness, latencies and clients.
pub fn probe_run(r: &RunResult) -> ProbeRun {
    let a = &r.solo.achieved;
    ProbeRun {
        workload: r.workload.as_str().to_string(),
        clients: u32::try_from(r.clients).unwrap_or(u32::MAX),
        solo_throughput_per_s: r.solo_throughput_per_s,
        solo_p50_ms: r.solo_p50_ms,
        solo_achieved: format!(
            "{:.1} of {:.1} {} ({:.0} %)",
            a.value,
            a.limit,
            a.unit,
            a.fraction_of_limit * 100.0
        ),
        scaling: r.scaling,
        jain_fairness: r.jain_fairness,
        p50_inflation: r.p50_inflation,
        p99_inflation: r.p99_inflation,
        per_client: r
            .per_client
            .iter()
            .map(|c| ProbeClient {
                throughput_per_s: c.throughput_per_s,
                p50_ms: c.p50_ms,
                p99_ms: c.p99_ms,
                slowdown: c.slowdown,
            })
            .collect(),
    }
}

/// What the MPS rows of a view need besides the node: where pipe directories are, how
/// often the health check put each server's limits back, and users' names.
pub struct MpsContext<'a> {
    /// The controller (pipe directories).
    pub mps: &'a MpsController,
    /// Restores of drifted limits by device UUID.
    pub restores: &'a std::collections::HashMap<String, u32>,
    /// A user's name by uid.
    pub user_name: &'a (dyn Fn(u32) -> Option<String> + Sync),
}

/// Limits as the documents carry them.
pub fn limit_values(limits: MpsLimits) -> MpsLimitValues {
    MpsLimitValues {
        active_thread_percentage: limits.active_thread_percentage,
        pinned_memory_limit_bytes: limits.pinned_memory_limit_bytes,
    }
}

/// One MPS server with its `clients`: the limits a client connecting now gets (live where
/// its control daemon was asked) with their source, the configured ones, the daemon's
/// defaults, its server processes and its mode.
pub fn mps_server(s: &MpsServerState, node: &NodeState, cx: &MpsContext<'_>) -> MpsServer {
    let state = if s.pid.is_some() { ServerState::Running } else { ServerState::Down };
    let gpu_instance_id = node.gpu(s.gpu).and_then(|g| {
        g.instances
            .iter()
            .find(|gi| gi.compute_instances.iter().any(|ci| ci.uuid == s.uuid))
            .map(|gi| gi.id)
    });
    let detail = node.mps_detail(&s.uuid);
    let now = detail.and_then(MpsServerDetail::for_new_clients);
    let limits = now.map_or(s.limits, |(limits, _)| limits);
    let live = detail.and_then(|d| d.live.as_ref());
    let server_processes = match (detail, live) {
        (Some(d), Some(live)) => live
            .servers
            .iter()
            .map(|p| {
                let made = d.override_of(p.pid);
                MpsServerProcess {
                    pid: p.pid,
                    uid: p.uid,
                    user: p.uid.and_then(cx.user_name),
                    limits: limit_values(p.limits),
                    source: d.server_source(p).as_str().into(),
                    override_by_uid: made.and_then(|o| o.by_uid),
                    override_at_unix_seconds: made.map(|o| o.at_unix_seconds),
                }
            })
            .collect(),
        _ => Vec::new(),
    };
    MpsServer {
        uuid: s.uuid.clone(),
        gpu: s.gpu,
        placement_start: s.placement_start.map(u32::from),
        gpu_instance_id,
        state: state.as_str().into(),
        pid: s.pid,
        active_thread_percentage: limits.active_thread_percentage,
        pinned_memory_limit_bytes: limits.pinned_memory_limit_bytes,
        restarts: s.restarts,
        pipe_directory: cx.mps.pipe_dir(&s.uuid).display().to_string(),
        clients: s.clients.clone(),
        limits_source: now.map(|(_, source)| source.as_str().into()),
        configured: Some(limit_values(node.mps_spec(s).limits)),
        daemon_defaults: live.map(|l| limit_values(l.defaults)),
        server_processes,
        multi_user: node.mps_spec(s).multi_user,
        limit_restores: cx.restores.get(&s.uuid).copied().unwrap_or(0),
    }
}

/// One GPU of `node` with its instances and how each is shared.
pub fn gpu_status(gpu: &GpuState, node: &NodeState, cx: &MpsContext<'_>) -> GpuStatus {
    let profile = |id: u32| gpu.model.and_then(|m| m.profile_by_id(id));
    let mps_on = |uuid: &str| {
        node.mps.iter().find(|s| s.uuid == uuid).map(|s| Sharing {
            strategy: Strategy::Mps.as_str().into(),
            interval: None,
            mps: Some(mps_server(s, node, cx)),
            replicas: None,
        })
    };
    let whole = mps_on(&gpu.uuid).unwrap_or_else(|| match node.time_sliced(gpu.index) {
        Some(interval) => Sharing {
            strategy: Strategy::TimeSlicing.as_str().into(),
            interval: Some(interval.as_str().into()),
            mps: None,
            // The applies' replicas: the status query adds them (the views keep them).
            replicas: None,
        },
        None => Sharing::exclusive(),
    });
    GpuStatus {
        index: gpu.index,
        uuid: gpu.uuid.clone(),
        model: gpu.model_name().to_string(),
        memory_total_bytes: gpu.memory_total_bytes,
        mig_enabled: gpu.mig_enabled,
        mig_pending: gpu.mig_pending,
        compute_mode: gpu.compute_mode.as_str().to_string(),
        health: Vec::new(),
        sharing: whole,
        instances: gpu
            .instances
            .iter()
            .map(|gi| {
                let ci = gi.compute_instances.first();
                InstanceStatus {
                    profile: profile(gi.profile_id).map_or_else(
                        || format!("profile-{}", gi.profile_id),
                        |p| p.name.to_string(),
                    ),
                    placement_start: u32::from(gi.placement_start),
                    placement_size: u32::from(gi.placement_size),
                    gpu_instance_id: gi.id,
                    compute_instance_id: ci.map(|c| c.id),
                    uuid: ci.map(|c| c.uuid.clone()),
                    memory_bytes: profile(gi.profile_id).map_or(0, |p| p.memory_mib << 20),
                    sharing: ci.and_then(|c| mps_on(&c.uuid)).unwrap_or_else(Sharing::exclusive),
                    compute_instances: gi
                        .compute_instances
                        .iter()
                        .map(|c| ComputeInstanceStatus {
                            compute_instance_id: c.id,
                            compute_slices: u32::from(c.slices),
                            uuid: c.uuid.clone(),
                            sharing: mps_on(&c.uuid).unwrap_or_else(Sharing::exclusive),
                        })
                        .collect(),
                }
            })
            .collect(),
        processes: gpu.processes.iter().map(|p| p.pid).collect(),
        clients: Vec::new(),
    }
}
