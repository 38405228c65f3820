//! Verification: a fresh observation checked against what a plan aimed at.

use super::Plan;
use crate::node::{MpsServerState, MpsSpec, NodeState, TimeSliceInterval};

/// Checks a fresh observation against what the plan aimed at; the error names every GPU
/// that differs.
pub fn verify(plan: &Plan, node: &NodeState) -> Result<(), String> {
    let mut problems = Vec::new();
    for target in &plan.gpus {
        let Some(gpu) = node.gpu(target.gpu) else {
            problems.push(format!("GPU {} is gone", target.gpu));
            continue;
        };
        let want = &target.target;
        if gpu.mig_enabled != want.mig_enabled {
            problems.push(format!(
                "{}: MIG is {} instead of {}",
                gpu.label(),
                on_off(gpu.mig_enabled),
                on_off(want.mig_enabled)
            ));
        }
        // Each GPU instance with its compute instances' sizes.
        let mut have: Vec<(u32, u8, Vec<u8>)> = gpu
            .instances
            .iter()
            .map(|gi| (gi.profile_id, gi.placement_start, gi.compute_layout()))
            .collect();
        let mut expect: Vec<(u32, u8, Vec<u8>)> = want
            .instances
            .iter()
            .map(|p| (p.profile.id, p.start, p.compute.sizes().to_vec()))
            .collect();
        have.sort_unstable();
        expect.sort_unstable();
        if have != expect {
            problems.push(format!("{}: the MIG instances differ from the plan", gpu.label()));
        }
        let servers: Vec<&MpsServerState> =
            node.mps.iter().filter(|s| s.gpu == gpu.index && s.pid.is_some()).collect();
        let mut expected: Vec<(Option<u8>, u8, MpsSpec)> =
            want.mps.iter().map(|&spec| (None, 0, spec)).collect();
        expected.extend(want.instance_mps.iter().map(|&(start, i, spec)| (Some(start), i, spec)));
        let mut running: Vec<(Option<u8>, u8, MpsSpec)> = servers
            .iter()
            .map(|s| (s.placement_start, s.compute_instance, node.mps_spec(s)))
            .collect();
        let key = |e: &(Option<u8>, u8, MpsSpec)| {
            (e.0, e.1, e.2.limits.active_thread_percentage, e.2.multi_user)
        };
        expected.sort_by_key(key);
        running.sort_by_key(key);
        if expected != running {
            problems.push(format!("{}: the MPS servers differ from the plan", gpu.label()));
        }
        if let (Some(want), Some(have)) = (want.timeslice, node.timeslice(gpu.index))
            && want != have
            // A MIG GPU's interval is left as it is.
            && !(want == TimeSliceInterval::Default && gpu.mig_enabled)
        {
            problems.push(format!(
                "{}: the time-slice interval is {} instead of {}",
                gpu.label(),
                have.as_str(),
                want.as_str()
            ));
        }
        if let Some(mode) = want.compute_mode
            && gpu.compute_mode != mode
        {
            problems.push(format!(
                "{}: compute mode is {} instead of {}",
                gpu.label(),
                gpu.compute_mode.as_str(),
                mode.as_str()
            ));
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
}

fn on_off(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}
