//! Planner tests on simulated nodes.

use std::sync::Arc;

use super::*;
use crate::catalog::parse_node_spec as parse_spec;
use crate::gpu::GpuBackend;
use crate::gpu::sim::{SimBackend, SimOptions};
use crate::node::{MpsLimits, MpsServerState, Operation};
use crate::profile::{ProfileStore, parse_profile};

mod compute;
mod packing;

fn node(spec: &str) -> Arc<SimBackend> {
    Arc::new(SimBackend::new(&parse_spec(spec).unwrap(), SimOptions::default()))
}

fn built_in(name: &str) -> Profile {
    ProfileStore::built_in().get(name).unwrap().profile.clone()
}

fn profile(text: &str) -> Profile {
    parse_profile(text, "test.toml", Some("test")).unwrap()
}

/// The simulated node as observed, without sharing.
fn observed(sim: &SimBackend) -> NodeState {
    NodeState::of_gpus(sim.observe().unwrap())
}

fn plan_on(sim: &SimBackend, profile: &Profile) -> Result<Plan, PlanError> {
    plan(&observed(sim), profile, &PlanOptions::default())
}

fn apply(sim: &Arc<SimBackend>, plan: &Plan) {
    let backend: Arc<dyn GpuBackend> = sim.clone();
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let executor = crate::apply::Executor::for_tests(backend);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(executor.execute(plan, &tx, Arc::new(crate::apply::NoLog))).unwrap();
}

fn layout(sim: &SimBackend, gpu: u32) -> Vec<(String, u8)> {
    let state = observed(sim);
    let g = state.gpu(gpu).unwrap();
    g.instances
        .iter()
        .map(|gi| {
            (
                g.model.unwrap().profile_by_id(gi.profile_id).unwrap().name.to_string(),
                gi.placement_start,
            )
        })
        .collect()
}

fn names(layout: &[(String, u8)]) -> Vec<&str> {
    let mut names: Vec<&str> = layout.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    names
}

#[test]
fn half_balanced_on_eight_a100s() {
    let sim = node("a100-40gb:8");
    let p = plan_on(&sim, &built_in("half-balanced")).unwrap();
    assert_eq!(p.gpus.len(), 8);
    // Per MIG GPU: enable MIG, reset (an A100 keeps the mode pending), then four
    // instances of two calls each.
    assert_eq!(p.step_count(), 4 * 10);
    assert!(p.gpus[4..].iter().all(|g| g.steps.is_empty() && !g.target.mig_enabled));
    apply(&sim, &p);
    let state = observed(&sim);
    for gpu in 0..4 {
        assert!(state.gpus[gpu].mig_enabled);
        assert_eq!(names(&layout(&sim, gpu as u32)), ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]);
    }
    for gpu in 4..8 {
        assert!(!state.gpus[gpu].mig_enabled);
        assert!(state.gpus[gpu].instances.is_empty());
    }
    let again = plan_on(&sim, &built_in("half-balanced")).unwrap();
    assert!(again.is_empty(), "{:?}", again.steps().collect::<Vec<_>>());
}

#[test]
fn half_balanced_on_two_h100s_uses_h100_names() {
    let sim = node("h100-80gb:2");
    let p = plan_on(&sim, &built_in("half-balanced")).unwrap();
    apply(&sim, &p);
    assert_eq!(names(&layout(&sim, 0)), ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]);
    assert!(!observed(&sim).gpus[1].mig_enabled);
}

#[test]
fn all_balanced_fits_each_model_and_all_disabled_undoes_it() {
    let sim = node("a100-40gb:1,a30:1,h200:1,a100-80gb:1");
    let p = plan_on(&sim, &built_in("all-balanced")).unwrap();
    apply(&sim, &p);
    assert_eq!(names(&layout(&sim, 1)), ["1g.6gb", "1g.6gb", "2g.12gb"]);
    assert_eq!(names(&layout(&sim, 2)), ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"]);
    assert_eq!(names(&layout(&sim, 3)), ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]);
    let undo = plan_on(&sim, &built_in("all-disabled")).unwrap();
    // Destroys come before the mode change on each GPU.
    let ops: Vec<Operation> = undo.gpus[0].steps.iter().map(Step::operation).collect();
    assert_eq!(ops[ops.len() - 2..], [Operation::SetMigMode, Operation::ResetGpu]);
    // Hopper switches without a reset.
    let ops: Vec<Operation> = undo.gpus[2].steps.iter().map(Step::operation).collect();
    assert_eq!(ops.last(), Some(&Operation::SetMigMode));
    apply(&sim, &undo);
    assert!(observed(&sim).gpus.iter().all(|g| !g.mig_enabled && g.instances.is_empty()));
}

#[test]
fn infeasible_layouts_name_gpu_model_and_reason() {
    let sim = node("a100-40gb:3");
    let p = profile("[[gpu]]\nselect = 2\nmig = { \"3g\" = 3 }\n");
    let e = plan_on(&sim, &p).unwrap_err().to_string();
    assert!(e.starts_with("GPU 2 (A100-SXM4-40GB): 3g.20gb ×3"), "{e}");
    let p = profile("[[gpu]]\nselect = \"all\"\nmig = { \"3g\" = 2, \"2g\" = 1 }\n");
    let e = plan_on(&sim, &p).unwrap_err().to_string();
    assert!(
        e.starts_with("GPU 0 (A100-SXM4-40GB): ") && e.contains("needs 10 of 8 memory slices"),
        "{e}"
    );
    let a30 = node("a30:1");
    let p = profile("[[gpu]]\nselect = \"all\"\nmig = { \"3g\" = 1 }\n");
    let e = plan_on(&a30, &p).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "GPU 0 (A30-24GB): no MIG profile 3g (the rule at test.toml:1:1); A30-24GB has 1g.6gb"
        ),
        "{e}"
    );
    // A name a driver renamed (GB200's 1g.24gb became 1g.23gb) is refused naming its heir,
    // never taken as nothing to do; a variant the model lacks too.
    let h100 = node("h100-80gb:1");
    let p = profile("[[gpu]]\nselect = \"all\"\nmig = { \"1g.21gb\" = 1 }\n");
    let e = plan_on(&h100, &p).unwrap_err().to_string();
    assert!(
        e.starts_with("GPU 0 (H100-80GB-HBM3): no MIG profile 1g.21gb (the rule at test.toml:1:1); did you mean 1g.20gb? H100-80GB-HBM3 has 1g.10gb, "),
        "{e}"
    );
    let p = profile("[[gpu]]\nselect = \"all\"\nmig = { \"1g.10gb+gfx\" = 1 }\n");
    let e = plan_on(&h100, &p).unwrap_err().to_string();
    assert!(e.contains("no MIG profile 1g.10gb+gfx") && e.contains("did you mean 1g.10gb"), "{e}");
    // Suggested by what the profile is (slices, memory, variant), not by spelling
    // (issue 38): spelling picked 7g.40gb, 1g.20gb and 1g.10gb+me.
    let mut wrong = Vec::new();
    for (spec, typed, meant) in [
        ("a100-40gb:1", "3g.40gb", "3g.20gb"),
        ("h100-80gb:1", "1g.5gb", "1g.10gb"),
        ("h100-80gb:1", "1g.10gb-me", "1g.10gb"),
    ] {
        let p = profile(&format!("[[gpu]]\nselect = \"all\"\nmig = {{ \"{typed}\" = 1 }}\n"));
        let e = plan_on(&node(spec), &p).unwrap_err().to_string();
        let said =
            format!("no MIG profile {typed} (the rule at test.toml:1:1); did you mean {meant}? ");
        if !e.contains(&said) {
            wrong.push(e);
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let l40s = node("l40s:1");
    let e = plan_on(&l40s, &built_in("all-balanced")).unwrap_err().to_string();
    assert!(e.starts_with("GPU 0 (L40S): has no MIG"), "{e}");
}

#[test]
fn gpus_without_mig_are_first_class_for_whole_gpu_profiles() {
    let sim = node("l40s:2");
    let p = plan_on(&sim, &built_in("all-disabled")).unwrap();
    assert_eq!(p.gpus.len(), 2);
    assert!(p.is_empty());
}

#[test]
fn instances_that_fit_the_new_layout_stay() {
    let sim = node("a100-40gb:1");
    apply(&sim, &plan_on(&sim, &built_in("all-balanced")).unwrap());
    let before = layout(&sim, 0);
    let three_g = before.iter().find(|(n, _)| n == "3g.20gb").unwrap().clone();
    let p = profile("[[gpu]]\nselect = 0\nmig = { \"3g\" = 1, \"1g\" = 4 }\n");
    let p = plan_on(&sim, &p).unwrap();
    assert!(
        !p.steps().any(|s| matches!(s, Step::DestroyGpuInstance { profile: "3g.20gb", .. })),
        "{:?}",
        p.steps().map(ToString::to_string).collect::<Vec<_>>()
    );
    assert!(!p.steps().any(|s| matches!(s, Step::SetMigMode { .. })));
    apply(&sim, &p);
    assert!(layout(&sim, 0).contains(&three_g));
}

#[test]
fn busy_instances_are_refused_with_their_pids_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sim.json");
    let models = parse_spec("a100-40gb:1").unwrap();
    let sim = Arc::new(SimBackend::persistent(&models, &path, SimOptions::default()).unwrap());
    apply(&sim, &plan_on(&sim, &built_in("all-balanced")).unwrap());
    let gi = observed(&sim).gpus[0].instances[0].id;
    drop(sim);
    // The same GPUs, now with two processes on the first instance.
    let options = SimOptions {
        processes: vec![(0, Some(gi), 4242), (0, Some(gi), 17)],
        ..SimOptions::default()
    };
    let busy = Arc::new(SimBackend::persistent(&models, &path, options).unwrap());
    let e = plan_on(&busy, &built_in("all-disabled")).unwrap_err();
    assert!(matches!(e, PlanError::GpuBusy(_)));
    assert!(e.to_string().contains("PID 17, 4242"), "{e}");
    let forced = PlanOptions { force: true, ..PlanOptions::default() };
    assert!(plan(&observed(&busy), &built_in("all-disabled"), &forced).is_ok());
    // A change that leaves the busy instance in place is not refused.
    let keep = profile("[[gpu]]\nselect = 0\nmig = { \"2g\" = 1, \"1g\" = 2, \"3g\" = 1 }\n");
    assert!(plan_on(&busy, &keep).unwrap().is_empty());
}

#[test]
fn the_agent_configuration_can_forbid_changes() {
    let sim = node("h100-80gb:1");
    let hands_off = PlanOptions {
        manage_mig: false,
        manage_compute_mode: false,
        manage_timeslice: false,
        force: false,
    };
    let e = plan(&observed(&sim), &built_in("all-balanced"), &hands_off).unwrap_err();
    assert!(matches!(e, PlanError::Forbidden(_)), "{e}");
    let p = plan(&observed(&sim), &built_in("all-disabled"), &hands_off).unwrap();
    assert!(p.is_empty());
    assert_eq!(p.gpus[0].target.compute_mode, None);
    // An interval someone set stays, also under a profile that would reset it.
    let mut state = observed(&sim);
    state.timeslices.insert(0, TimeSliceInterval::Medium);
    let p = plan(&state, &built_in("all-mps"), &hands_off).unwrap();
    assert_eq!(p.gpus[0].target.timeslice, None);
    assert!(!p.steps().any(|s| matches!(s, Step::SetTimeslice { .. })), "{:?}", p.gpus[0].steps);
    // A profile that needs one set is refused, naming the setting.
    let sliced =
        profile("[[gpu]]\nselect = 0\nsharing = { time-slicing = { interval = \"short\" } }\n");
    let e = plan(&state, &sliced, &hands_off).unwrap_err();
    assert!(matches!(e, PlanError::Forbidden(_)), "{e}");
    assert!(e.to_string().contains("manage_timeslice = false"), "{e}");
}

#[test]
fn compute_modes_return_to_default() {
    let sim = node("a100-40gb:2");
    sim.set_compute_mode(1, ComputeMode::ExclusiveProcess).unwrap();
    let p = plan_on(&sim, &built_in("all-disabled")).unwrap();
    assert_eq!(
        p.steps().map(ToString::to_string).collect::<Vec<_>>(),
        ["GPU 1: set compute mode default"]
    );
}

#[test]
fn sharing_plans_mps_and_time_slicing_steps() {
    let sim = node("a100-40gb:2");
    let p = plan_on(&sim, &built_in("all-mps")).unwrap();
    let steps: Vec<String> = p.steps().map(ToString::to_string).collect();
    // all-mps: 4 replicas → 25 % threads and a quarter of the 40 GiB each.
    assert_eq!(
        steps,
        [
            "GPU 0: set compute mode exclusive_process",
            "GPU 0: start an MPS server on the GPU (threads 25%, pinned memory 10 GiB)",
            "GPU 1: set compute mode exclusive_process",
            "GPU 1: start an MPS server on the GPU (threads 25%, pinned memory 10 GiB)",
        ]
    );
    let p = plan_on(&sim, &built_in("all-time-sliced")).unwrap();
    let steps: Vec<String> = p.steps().map(ToString::to_string).collect();
    assert_eq!(
        steps,
        [
            "GPU 0: set the time-slice interval to medium",
            "GPU 1: set the time-slice interval to medium"
        ]
    );
    let layered = profile(
        "[[gpu]]\nselect = 0\nmig = { \"1g\" = 2, \"2g\" = 1, \"3g\" = 1 }\ninstance_sharing.\"3g\".mps = { active_thread_percentage = 50 }\n",
    );
    let p = plan_on(&sim, &layered).unwrap();
    let last = p.steps().last().unwrap().to_string();
    assert_eq!(last, "GPU 0: start an MPS server on 3g.20gb at slot 4 (threads 50%)");
    assert_eq!(p.gpus[0].target.compute_mode, Some(ComputeMode::Default));
}

#[test]
fn gpus_take_the_first_rule_that_selects_them() {
    let sim = node("a100-40gb:3");
    let p = profile(
        "[[gpu]]\nselect = 1\nmig = { \"7g\" = 1 }\n[[gpu]]\nselect = \"all\"\nmig = \"disabled\"\n",
    );
    let p = plan_on(&sim, &p).unwrap();
    assert!(p.gpus[1].target.mig_enabled);
    assert!(!p.gpus[0].target.mig_enabled && !p.gpus[2].target.mig_enabled);
}

#[test]
fn planning_is_deterministic_and_reports_in_protocol_shape() {
    let sim = node("a100-40gb:8");
    let a = plan_on(&sim, &built_in("half-balanced")).unwrap();
    let b = plan_on(&sim, &built_in("half-balanced")).unwrap();
    assert_eq!(a, b);
    let report = a.report();
    assert!(report.changes);
    assert_eq!(report.steps.len(), 40);
    assert_eq!(report.steps[0].operation, "set_mig_mode");
    assert_eq!(report.targets.len(), 8);
    assert_eq!(report.targets[0].instances.len(), 4);
}

#[test]
fn verify_names_what_differs() {
    let sim = node("a100-40gb:1");
    let p = plan_on(&sim, &built_in("all-balanced")).unwrap();
    let e = verify(&p, &observed(&sim)).unwrap_err();
    assert!(e.contains("GPU 0 (A100-SXM4-40GB): MIG is off instead of on"), "{e}");
    apply(&sim, &p);
    verify(&p, &observed(&sim)).unwrap();
}

#[test]
fn pending_modes_are_finished_or_cancelled() {
    let sim = node("a100-40gb:2");
    sim.set_mig_mode(0, true).unwrap();
    sim.set_mig_mode(1, true).unwrap();
    let state = observed(&sim);
    assert_eq!(state.gpus[0].mig_pending, Some(true));
    let p = profile("[[gpu]]\nselect = 0\nmig = {}\n[[gpu]]\nselect = 1\nmig = \"disabled\"\n");
    let p = plan(&state, &p, &PlanOptions::default()).unwrap();
    let steps: Vec<String> = p.steps().map(ToString::to_string).collect();
    assert_eq!(
        steps,
        ["GPU 0: reset the GPU (a MIG mode change is pending)", "GPU 1: disable MIG mode"]
    );
    apply(&sim, &p);
    let state = observed(&sim);
    assert!(state.gpus[0].mig_enabled && state.gpus[0].mig_pending.is_none());
    assert!(!state.gpus[1].mig_enabled && state.gpus[1].mig_pending.is_none());
}

#[test]
fn targets_that_do_not_time_slice_a_whole_gpu_return_the_interval_to_default() {
    let sim = node("a100-40gb:3");
    let mut state = observed(&sim);
    state.timeslices = (0..3).map(|i| (i, TimeSliceInterval::Medium)).collect();
    // MPS, exclusive and MIG: none time-slices the whole GPU.
    let p = profile(
        "[[gpu]]\nselect = 0\nsharing = { mps = { replicas = 2 } }\n\
         [[gpu]]\nselect = 1\nsharing = \"exclusive\"\n\
         [[gpu]]\nselect = 2\nmig = { \"7g\" = 1 }\n",
    );
    let p = plan(&state, &p, &PlanOptions::default()).unwrap();
    for g in &p.gpus {
        assert_eq!(g.target.timeslice, Some(TimeSliceInterval::Default), "GPU {}", g.gpu);
        // Back to default first, while the GPU is still whole.
        assert_eq!(
            g.steps.first(),
            Some(&Step::SetTimeslice { gpu: g.gpu, interval: TimeSliceInterval::Default }),
            "GPU {}: {:?}",
            g.gpu,
            g.steps
        );
    }
    // Verification and `assert` see an interval left behind.
    let mut after = state.clone();
    after.timeslices.insert(0, TimeSliceInterval::Medium);
    let mps_only = profile("[[gpu]]\nselect = 0\nsharing = { mps = { replicas = 2 } }\n");
    let p = plan(&after, &mps_only, &PlanOptions::default()).unwrap();
    let e = verify(&p, &after).unwrap_err();
    assert!(
        e.contains("GPU 0 (A100-SXM4-40GB): the time-slice interval is medium instead of default"),
        "{e}"
    );
}

/// A running MPS server on `gpu` (on the instance at `start`) with `clients`.
fn server(
    node: &NodeState,
    gpu: u32,
    start: Option<u8>,
    limits: MpsLimits,
    clients: &[u32],
) -> MpsServerState {
    let g = node.gpu(gpu).unwrap();
    let uuid = match start {
        None => g.uuid.clone(),
        Some(start) => {
            let gi = g.instances.iter().find(|gi| gi.placement_start == start).unwrap();
            gi.compute_instances[0].uuid.clone()
        }
    };
    MpsServerState {
        uuid,
        gpu,
        placement_start: start,
        compute_instance: 0,
        limits,
        pid: Some(1000 + gpu),
        restarts: 0,
        clients: clients.to_vec(),
        clients_read: true,
    }
}

#[test]
fn mps_servers_with_clients_are_stopped_only_when_forced() {
    let sim = node("a100-40gb:2");
    for gpu in 0..2 {
        sim.set_compute_mode(gpu, ComputeMode::ExclusiveProcess).unwrap();
    }
    let mut state = observed(&sim);
    let quarter =
        MpsLimits { active_thread_percentage: 25, pinned_memory_limit_bytes: Some(10 << 30) };
    state.mps =
        vec![server(&state, 0, None, quarter, &[]), server(&state, 1, None, quarter, &[4242, 17])];
    let forced = PlanOptions { force: true, ..PlanOptions::default() };
    let halves = profile("[[gpu]]\nselect = \"all\"\nsharing = { mps = { replicas = 2 } }\n");
    // Stopped, restarted with other limits, or stopped for MIG: each ends the clients.
    for p in [built_in("all-disabled"), halves, built_in("all-balanced")] {
        let e = plan(&state, &p, &PlanOptions::default()).unwrap_err();
        assert!(matches!(e, PlanError::GpuBusy(_)), "{}: {e}", p.name);
        let uuid = &state.mps[1].uuid;
        assert_eq!(
            e.to_string(),
            format!(
                "GPU 1 (A100-SXM4-40GB): MPS clients (PID 17, 4242) use the MPS server of {uuid} that the plan stops; stop them, or apply with --force"
            ),
            "{}",
            p.name
        );
        assert!(plan(&state, &p, &forced).is_ok(), "{}", p.name);
    }
    // Kept as it is: nothing to refuse.
    assert!(plan(&state, &built_in("all-mps"), &PlanOptions::default()).unwrap().is_empty());
    // GPU 0's server has no clients: stopping it alone is fine.
    let only_0 = profile("[[gpu]]\nselect = 0\n");
    assert!(plan(&state, &only_0, &PlanOptions::default()).is_ok());
}

#[test]
fn mps_clients_keep_the_instance_their_server_serves() {
    let sim = node("a100-40gb:1");
    apply(&sim, &plan_on(&sim, &built_in("all-balanced")).unwrap());
    let mut state = observed(&sim);
    let limits = MpsLimits { active_thread_percentage: 50, pinned_memory_limit_bytes: None };
    state.mps = vec![server(&state, 0, Some(4), limits, &[99])];
    let layered = profile(
        "[[gpu]]\nselect = 0\nmig = { \"1g\" = 2, \"2g\" = 1, \"3g\" = 1 }\ninstance_sharing.\"3g\".mps = { active_thread_percentage = 50 }\n",
    );
    assert!(plan(&state, &layered, &PlanOptions::default()).unwrap().is_empty());
    // The 3g instance goes, and with it the server: refused, naming the client.
    let sevens = profile("[[gpu]]\nselect = 0\nmig = { \"1g\" = 7 }\n");
    let e = plan(&state, &sevens, &PlanOptions::default()).unwrap_err().to_string();
    assert!(
        e.starts_with("GPU 0 (A100-SXM4-40GB): MPS clients (PID 99) use the MPS server of MIG-"),
        "{e}"
    );
}

#[test]
fn pinned_memory_limits_larger_than_the_device_are_refused() {
    let sim = node("a100-40gb:1");
    let whole = |size: &str| {
        profile(&format!(
            "name = \"x\"\n[[gpu]]\nselect = 0\nsharing = {{ mps = {{ pinned_memory_limit = \"{size}\" }} }}\n"
        ))
    };
    let e = plan_on(&sim, &whole("999TiB")).unwrap_err();
    assert!(matches!(e, PlanError::Infeasible(_)), "{e}");
    assert_eq!(
        e.to_string(),
        "GPU 0 (A100-SXM4-40GB): mps pinned_memory_limit 999 TiB (rule at test.toml:2:1) exceeds the GPU's 40 GiB"
    );
    // The whole GPU's memory is a limit it can have.
    assert!(plan_on(&sim, &whole("40GiB")).is_ok());
    assert!(plan_on(&sim, &whole("40961MiB")).is_err());
    // An instance's limit is bounded by the instance: 3g.20gb has 19968 MiB.
    let instance = |size: &str| {
        profile(&format!(
            "[[gpu]]\nselect = 0\nmig = {{ \"3g\" = 2 }}\n\
             instance_sharing.\"3g\".mps = {{ pinned_memory_limit = \"{size}\" }}\n"
        ))
    };
    let e = plan_on(&sim, &instance("20GiB")).unwrap_err().to_string();
    assert_eq!(
        e,
        "GPU 0 (A100-SXM4-40GB): mps pinned_memory_limit 20 GiB (rule at test.toml:1:1) exceeds the 3g.20gb instance's 19.5 GiB"
    );
    assert!(plan_on(&sim, &instance("19968MiB")).is_ok());
}

#[test]
fn indices_and_uuids_this_node_lacks_are_refused() {
    let sim = node("a100-40gb:8");
    let e = |text: &str| plan_on(&sim, &profile(text)).unwrap_err().to_string();
    assert_eq!(
        e("name = \"x\"\n\n[[gpu]]\nselect = \"9\"\n"),
        "rule at test.toml:3:1: select = \"9\": this node has GPUs 0-7"
    );
    assert_eq!(
        e("[[gpu]]\nselect = \"all\"\n[[gpu]]\nselect = \"7-4294967295\"\n"),
        "rule at test.toml:3:1: select = \"7-4294967295\": this node has GPUs 0-7"
    );
    let uuid = e("[[gpu]]\nselect = \"GPU-feed\"\n");
    let first = &observed(&sim).gpus[0].uuid;
    assert!(
        uuid.starts_with(&format!(
            "rule at test.toml:1:1: select = \"GPU-feed\": no GPU of this node has that UUID (GPU 0: {first}, GPU 1: "
        )),
        "{uuid}"
    );
    // Even when another rule selects GPUs: the index names a GPU that is not here.
    assert!(e("[[gpu]]\nselect = [0, 8]\n").contains("select = \"0,8\": this node has GPUs 0-7"));
    let one = node("h100-80gb:1");
    let e = plan_on(&one, &profile("[[gpu]]\nselect = 1\n")).unwrap_err().to_string();
    assert!(e.ends_with("select = \"1\": this node has GPU 0"), "{e}");
    // A UUID is matched in any case, as NVML's tools do.
    let upper = observed(&sim).gpus[3].uuid.to_uppercase();
    let p = plan_on(&sim, &profile(&format!("[[gpu]]\nselect = \"{upper}\"\n"))).unwrap();
    assert_eq!(p.gpus.iter().map(|g| g.gpu).collect::<Vec<_>>(), [3]);
}

#[test]
fn a_profile_must_select_some_gpu_of_the_node() {
    let sim = node("a100-40gb:2");
    let e = plan_on(&sim, &profile("[[gpu]]\nselect = \"h100-80gb\"\n")).unwrap_err();
    assert!(matches!(e, PlanError::Infeasible(_)), "{e}");
    assert_eq!(
        e.to_string(),
        "profile test selects no GPU of this node (GPUs 0-1: 2 × A100-SXM4-40GB (0x20B010DE)); its rules: test.toml:1:1 (select = \"h100-80gb\")"
    );
    let filtered = profile(
        "[[gpu]]\nselect = \"all\"\ndevice_filter = [\"0x233010DE\", \"0x20B710DE\"]\n[[gpu]]\nselect = \"a30\"\n",
    );
    let e = plan_on(&sim, &filtered).unwrap_err().to_string();
    assert!(
        e.ends_with(
            "its rules: test.toml:1:1 (select = \"all\", device_filter = [\"0x233010DE\", \"0x20B710DE\"]), test.toml:4:1 (select = \"a30-24gb\")"
        ),
        "{e}"
    );
    // One rule per model, for a fleet: fine where one of them selects.
    let fleet = profile(
        "[[gpu]]\nselect = \"h100-80gb\"\nmig = { \"7g\" = 1 }\n[[gpu]]\nselect = \"a100-40gb\"\n",
    );
    assert_eq!(plan_on(&sim, &fleet).unwrap().gpus.len(), 2);
    // first-half selects nothing on one GPU: alone refused, with second-half fine.
    let one = node("a100-40gb:1");
    let e = plan_on(&one, &profile("[[gpu]]\nselect = \"first-half\"\n")).unwrap_err();
    assert!(e.to_string().contains("selects no GPU of this node (GPU 0: 1 × A100"), "{e}");
    assert_eq!(plan_on(&one, &built_in("half-balanced")).unwrap().gpus.len(), 1);
}

#[test]
fn every_built_in_profile_plans_on_every_catalog_model() {
    for model in crate::catalog::models() {
        for count in [1, 2, 8] {
            let sim = node(&format!("{}:{count}", model.key));
            for stored in ProfileStore::built_in().iter() {
                let p = &stored.profile;
                // Each selects some GPU everywhere; a layout a model cannot take (no MIG, or
                // no 3g on the A30) is another refusal.
                match plan_on(&sim, p) {
                    Ok(plan) => {
                        assert!(!plan.gpus.is_empty(), "{} on {}:{count}", p.name, model.key)
                    }
                    Err(e) => assert!(
                        e.to_string().starts_with("GPU ") && !e.to_string().contains("select"),
                        "{} on {}:{count}: {e}",
                        p.name,
                        model.key
                    ),
                }
            }
        }
    }
}

/// `node` with a server on each GPU as `all-mps` left it (25 %, 10 GiB), of mode
/// `multi_user`, its control daemon answering `live` defaults and `servers`, with
/// `overrides` recorded.
fn with_mps_detail(
    state: &mut NodeState,
    gpu: u32,
    multi_user: bool,
    live: Option<(MpsLimits, Vec<(u32, MpsLimits)>)>,
    overrides: Vec<crate::node::LimitOverride>,
) {
    use crate::node::{LiveLimits, LiveServer, MpsServerDetail, MpsSpec};
    let uuid = state.gpu(gpu).unwrap().uuid.clone();
    let configured = state.mps.iter().find(|s| s.uuid == uuid).unwrap().limits;
    let mut detail =
        MpsServerDetail::configured(MpsSpec { limits: configured, multi_user }, overrides);
    detail.live = live.map(|(defaults, servers)| LiveLimits {
        defaults,
        servers: servers
            .into_iter()
            .map(|(pid, limits)| LiveServer { pid, uid: Some(0), limits })
            .collect(),
    });
    state.mps_details.insert(uuid, detail);
}

fn quarter() -> MpsLimits {
    MpsLimits { active_thread_percentage: 25, pinned_memory_limit_bytes: Some(10 << 30) }
}

/// An A100 node with `all-mps`'s servers (as observed), GPU 1's with `clients`.
fn all_mps_node(clients: &[u32]) -> NodeState {
    let sim = node("a100-40gb:2");
    for gpu in 0..2 {
        sim.set_compute_mode(gpu, ComputeMode::ExclusiveProcess).unwrap();
    }
    let mut state = observed(&sim);
    state.mps =
        vec![server(&state, 0, None, quarter(), &[]), server(&state, 1, None, quarter(), clients)];
    state
}

#[test]
fn a_server_of_another_mode_is_restarted_and_refused_while_it_has_clients() {
    let mut state = all_mps_node(&[4242]);
    with_mps_detail(&mut state, 0, true, None, Vec::new());
    with_mps_detail(&mut state, 1, true, None, Vec::new());
    // all-mps serves one user at a time: both multi-user servers restart.
    let e = plan(&state, &built_in("all-mps"), &PlanOptions::default()).unwrap_err();
    assert!(matches!(e, PlanError::GpuBusy(_)), "{e}");
    assert!(e.to_string().contains("MPS clients (PID 4242)"), "{e}");
    let forced = PlanOptions { force: true, ..PlanOptions::default() };
    let p = plan(&state, &built_in("all-mps"), &forced).unwrap();
    let ops: Vec<Operation> = p.steps().map(Step::operation).collect();
    assert_eq!(
        ops,
        [Operation::StopMps, Operation::StartMps, Operation::StopMps, Operation::StartMps]
    );
    assert!(p.steps().all(|s| !matches!(s, Step::StartMps { multi_user: true, .. })));
    // The same servers, asked for as multi-user: nothing to do.
    let shared = profile(
        "[[gpu]]\nselect = \"all\"\nsharing = { mps = { replicas = 4, multi_user = true } }\n",
    );
    assert!(plan(&state, &shared, &PlanOptions::default()).unwrap().is_empty());
    // And from one user at a time to multi-user: started with -M.
    let plain = all_mps_node(&[]);
    let p = plan(&plain, &shared, &PlanOptions::default()).unwrap();
    let starts: Vec<String> = p
        .steps()
        .filter(|s| matches!(s, Step::StartMps { multi_user: true, .. }))
        .map(ToString::to_string)
        .collect();
    assert_eq!(starts.len(), 2, "{p:?}");
    assert!(starts[0].ends_with("(threads 25%, pinned memory 10 GiB, multi-user)"), "{starts:?}");
}

#[test]
fn live_limits_changed_outside_gpushare_are_put_back_in_place() {
    let raised = MpsLimits { active_thread_percentage: 90, ..quarter() };
    let mut state = all_mps_node(&[4242]);
    // GPU 0's daemon has 90 % as its default; GPU 1's server 7 got 50 % by mps limit
    // (recorded), which is no drift.
    with_mps_detail(&mut state, 0, false, Some((raised, Vec::new())), Vec::new());
    let by_mps_limit = crate::node::LimitOverride {
        server_pid: 7,
        active_thread_percentage: Some(50),
        pinned_memory_limit_bytes: None,
        by_uid: Some(0),
        at_unix_seconds: 1,
    };
    let half = MpsLimits { active_thread_percentage: 50, ..quarter() };
    with_mps_detail(&mut state, 1, false, Some((quarter(), vec![(7, half)])), vec![by_mps_limit]);
    let p = plan(&state, &built_in("all-mps"), &PlanOptions::default()).unwrap();
    let steps: Vec<&Step> = p.steps().collect();
    assert_eq!(steps.len(), 1, "{steps:?}");
    let Step::SetMpsLimits { gpu: 0, drift, .. } = steps[0] else { panic!("{steps:?}") };
    assert_eq!(drift.defaults, Some((raised, quarter())));
    assert!(
        steps[0].to_string().contains(
            "set the MPS limits of GPU-", 
        ) && steps[0].to_string().contains(
            "(its defaults 90% threads, 10 GiB -> 25% threads, 10 GiB; changed outside gpushare)"
        ),
        "{}",
        steps[0]
    );
    // GPU 1's server without the record of the override: its 50 % is drift, put back to
    // what the profile set, and no server with clients is stopped for it.
    with_mps_detail(&mut state, 1, false, Some((quarter(), vec![(7, half)])), Vec::new());
    let p = plan(&state, &built_in("all-mps"), &PlanOptions::default()).unwrap();
    let servers: Vec<_> = p
        .steps()
        .filter_map(|s| match s {
            Step::SetMpsLimits { gpu: 1, drift, .. } => Some(drift.servers.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(servers, [vec![(7, half, quarter())]]);
    assert!(p.steps().all(|s| !matches!(s, Step::StopMps { .. })));
}

#[test]
fn a_memory_limit_mps_cannot_remove_restarts_its_daemon() {
    // The profile sets no memory limit; someone set one: only a new daemon has none.
    let free = MpsLimits { active_thread_percentage: 100, pinned_memory_limit_bytes: None };
    let sim = node("a100-40gb:1");
    sim.set_compute_mode(0, ComputeMode::ExclusiveProcess).unwrap();
    let mut state = observed(&sim);
    state.mps = vec![server(&state, 0, None, free, &[])];
    with_mps_detail(&mut state, 0, false, Some((quarter(), Vec::new())), Vec::new());
    let whole = profile("[[gpu]]\nselect = 0\nsharing = \"mps\"\n");
    let ops: Vec<Operation> = plan(&state, &whole, &PlanOptions::default())
        .unwrap()
        .steps()
        .map(Step::operation)
        .collect();
    assert_eq!(ops, [Operation::StopMps, Operation::StartMps]);
}
