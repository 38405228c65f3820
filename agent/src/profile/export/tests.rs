//! Tests of the export: every built-in profile, the README's `inference-split` and mixed
//! layouts export to themselves (they parse and plan to nothing), and what a profile cannot
//! say is noted.

use std::sync::Arc;

use super::*;
use crate::catalog::parse_node_spec as parse_spec;
use crate::gpu::GpuBackend;
use crate::gpu::sim::{SimBackend, SimOptions};
use crate::node::{LimitOverride, LiveLimits, LiveServer, MpsLimits, MpsServerDetail};
use crate::plan::{PlanOptions, mps_limits, plan};
use crate::profile::{Profile, ProfileStore, Sharing, parse_document, parse_profile};

#[test]
fn ranges_compress() {
    assert_eq!(crate::node::index_ranges(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
    assert_eq!(crate::node::index_ranges(&[5]), "5");
}

/// A simulated node of `spec` after the MIG part of `profile` was applied to it.
fn applied(spec: &str, profile: &Profile) -> NodeState {
    let sim = Arc::new(SimBackend::new(&parse_spec(spec).unwrap(), SimOptions::default()));
    let mut mig_only = profile.clone();
    for rule in &mut mig_only.rules {
        rule.sharing = Sharing::Exclusive;
        rule.instance_sharing.clear();
    }
    let options = PlanOptions { manage_compute_mode: false, ..PlanOptions::default() };
    let p = plan(&NodeState::of_gpus(sim.observe().unwrap()), &mig_only, &options).unwrap();
    let backend: Arc<dyn GpuBackend> = sim.clone();
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let executor = crate::apply::Executor::for_tests(backend);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(executor.execute(&p, &tx, Arc::new(crate::apply::NoLog)))
        .unwrap();
    NodeState::of_gpus(sim.observe().unwrap())
}

/// `node` with the sharing of `profile` set up as the agent sets it: a server per
/// whole GPU or MIG device its plan starts (with the plan's limits and mode), the
/// compute modes and the intervals it sets, every interval read.
fn shared(mut node: NodeState, profile: &Profile) -> NodeState {
    let p = plan(&node, profile, &PlanOptions::default()).unwrap();
    for target in &p.gpus {
        let gpu = node.gpus.iter_mut().find(|g| g.index == target.gpu).unwrap();
        if let Some(mode) = target.target.compute_mode {
            gpu.compute_mode = mode;
        }
        let gpu = gpu.clone();
        let mut servers: Vec<(Option<u8>, u8, String, MpsSpec)> = Vec::new();
        if let Some(spec) = target.target.mps {
            servers.push((None, 0, gpu.uuid.clone(), spec));
        }
        for &(start, index, spec) in &target.target.instance_mps {
            let gi = gpu.instances.iter().find(|gi| gi.placement_start == start).unwrap();
            let uuid = gi.compute_instances[usize::from(index)].uuid.clone();
            servers.push((Some(start), index, uuid, spec));
        }
        for (placement_start, compute_instance, uuid, spec) in servers {
            node.mps_details.insert(uuid.clone(), MpsServerDetail::configured(spec, vec![]));
            node.mps.push(MpsServerState {
                uuid,
                gpu: gpu.index,
                placement_start,
                compute_instance,
                limits: spec.limits,
                pid: Some(1000 + node.mps.len() as u32),
                restarts: 0,
                clients: Vec::new(),
                clients_read: true,
            });
        }
        let interval = target.target.timeslice.unwrap_or(TimeSliceInterval::Default);
        node.timeslices.insert(gpu.index, interval);
    }
    for gpu in &node.gpus {
        node.timeslices.entry(gpu.index).or_insert(TimeSliceInterval::Default);
    }
    node
}

/// `profile` applied to a simulated node of `spec`, sharing included.
fn node_of(spec: &str, profile: &Profile) -> NodeState {
    shared(applied(spec, profile), profile)
}

/// Exports `node`, and checks that the export parses, plans to nothing and says
/// nothing it could not write.
fn round_trip(node: &NodeState) -> Exported {
    let exported = export(node);
    let text = exported.text();
    assert!(exported.notes.is_empty(), "{text}");
    let profile =
        parse_profile(&text, "exported.toml", None).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let p = plan(node, &profile, &PlanOptions::default()).unwrap();
    let steps: Vec<String> = p.steps().map(ToString::to_string).collect();
    assert!(steps.is_empty(), "{steps:?}\n{text}");
    exported
}

#[test]
fn every_built_in_profile_exports_to_itself() {
    for stored in ProfileStore::built_in().iter() {
        for spec in ["a100-40gb:8", "h100-80gb:2"] {
            round_trip(&node_of(spec, &stored.profile));
        }
    }
    let mps = ProfileStore::built_in().get("all-mps").unwrap().profile.clone();
    let text = round_trip(&node_of("a100-40gb:8", &mps)).text();
    assert!(
        text.contains(
            "select = \"0-7\"\nmig = \"disabled\"\nsharing = { mps = { active_thread_percentage = 25, pinned_memory_limit = \"10GiB\" } }\n"
        ),
        "{text}"
    );
    let sliced = ProfileStore::built_in().get("all-time-sliced").unwrap().profile.clone();
    let text = round_trip(&node_of("h100-80gb:2", &sliced)).text();
    assert!(
        text.contains("select = \"0-1\"\nmig = \"disabled\"\nsharing = { time-slicing = { interval = \"medium\" } }\n"),
        "{text}"
    );
}

/// The README's `inference-split`.
const INFERENCE_SPLIT: &str = r#"name = "inference-split"
[[gpu]]
select = "0-1"
mig = { "1g" = 7 }

[[gpu]]
select = 2
mig = { "1g.5gb" = 2, "2g" = 1, "3g" = 1 }
sharing = "exclusive"
instance_sharing."3g" = { mps = { replicas = 4, pinned_memory_limit = "2GiB" } }

[[gpu]]
select = "all"
mig = "disabled"
"#;

#[test]
fn the_readmes_inference_split_exports_to_itself() {
    let profile = parse_profile(INFERENCE_SPLIT, "inference-split.toml", None).unwrap();
    let node = node_of("a100-40gb:8", &profile);
    let text = round_trip(&node).text();
    assert!(
        text.contains(
            "select = \"2\"\nmig = { \"1g.5gb\" = 2, \"2g.10gb\" = 1, \"3g.20gb\" = 1 }\ninstance_sharing.\"3g.20gb\" = { mps = { active_thread_percentage = 25, pinned_memory_limit = \"2GiB\" } }\n"
        ),
        "{text}"
    );
    assert!(text.contains("select = \"3-7\"\nmig = \"disabled\"\nsharing = \"exclusive\"\n"));
}

#[test]
fn mixed_layouts_export_to_themselves() {
    // H100: MPS on 1c compute instances of a 3g and (multi-user, explicit limits) on
    // a 2g; one GPU time-sliced short; one MPS whole; MIG on with every device
    // shared alike.
    let text = r#"name = "mixed"
[[gpu]]
select = 0
mig = { "1c.3g" = 3, "2g" = 1, "1g" = 2 }
instance_sharing."1c.3g" = { mps = { replicas = 2 } }
instance_sharing."2g" = { mps = { active_thread_percentage = 40, multi_user = true } }
[[gpu]]
select = 1
sharing.time-slicing = { interval = "short", replicas = 3 }
[[gpu]]
select = 2
sharing.mps = { replicas = 3 }
[[gpu]]
select = 3
mig = { "3g" = 2 }
sharing = "mps"
"#;
    let profile = parse_profile(text, "mixed.toml", None).unwrap();
    let node = node_of("h100-80gb:4", &profile);
    assert_eq!(node.mps.len(), 3 + 1 + 1 + 2);
    let exported = round_trip(&node);
    let text = exported.text();
    assert!(
        text.contains("instance_sharing.\"1c.3g.40gb\" = { mps = { active_thread_percentage = 50, pinned_memory_limit = \"6741MiB\" } }"),
        "{text}"
    );
    assert!(
        text.contains("instance_sharing.\"2g.20gb\" = { mps = { active_thread_percentage = 40, multi_user = true } }"),
        "{text}"
    );
    assert!(!text.contains("instance_sharing.\"1g"), "{text}");
    assert!(text.contains("sharing = { time-slicing = { interval = \"short\" } }"), "{text}");
    assert!(
        text.contains("select = \"3\"\nmig = { \"3g.40gb\" = 2 }\nsharing = { mps = { active_thread_percentage = 100 } }\n"),
        "{text}"
    );
    // mig-parted keeps the layout and says what it leaves out.
    assert!(
        exported
            .mig_parted
            .contains("#   GPU 2: MPS (33% threads, 27186 MiB), compute mode exclusive_process\n"),
        "{}",
        exported.mig_parted
    );
    assert_eq!(exported.left_out.len(), 4, "{:?}", exported.left_out);
    // GPUs 1 and 2, whole both, are one entry.
    let yaml = parse_document(&exported.mig_parted, "exported.yaml", "exported").unwrap();
    assert_eq!(yaml.rules.len(), 3);
    let mig_only = plan(&node, &yaml, &PlanOptions::default()).unwrap();
    assert!(mig_only.steps().all(|s| !s.to_string().contains("instance")), "MIG kept");
}

#[test]
fn what_a_profile_cannot_say_is_noted() {
    let mps = ProfileStore::built_in().get("all-mps").unwrap().profile.clone();
    let mut node = node_of("a100-40gb:4", &mps);
    // GPU 3: its server gone, and the GPU put in compute mode prohibited by hand.
    let gone = node.mps.iter().position(|s| s.gpu == 3).unwrap();
    let uuid = node.mps.remove(gone).uuid;
    node.mps_details.remove(&uuid);
    node.gpus[3].compute_mode = ComputeMode::Prohibited;
    // GPU 0: defaults changed through the daemon (drift); GPU 1: a server process
    // with `mps limit`'s 50 %.
    let configured = mps_limits(
        &crate::profile::MpsSettings { replicas: Some(4), ..Default::default() },
        node.gpus[0].memory_total_bytes,
    );
    let live = |defaults: MpsLimits, servers: Vec<LiveServer>| LiveLimits { defaults, servers };
    let drifted = MpsLimits { active_thread_percentage: 90, ..configured };
    let uuid0 = node.gpus[0].uuid.clone();
    node.mps_details.get_mut(&uuid0).unwrap().live = Some(live(drifted, Vec::new()));
    let fifty = MpsLimits { active_thread_percentage: 50, ..configured };
    let uuid1 = node.gpus[1].uuid.clone();
    let detail = node.mps_details.get_mut(&uuid1).unwrap();
    detail.overrides.push(LimitOverride {
        server_pid: 77,
        active_thread_percentage: Some(50),
        pinned_memory_limit_bytes: None,
        by_uid: Some(0),
        at_unix_seconds: 1,
    });
    detail.live =
        Some(live(configured, vec![LiveServer { pid: 77, uid: Some(1000), limits: fifty }]));
    let exported = export(&node);
    let text = exported.text();
    assert!(text.starts_with("# Not written"), "{text}");
    let notes = exported.notes.join("\n");
    for said in [
        "GPU 0 (A100-SXM4-40GB): the MPS daemon's defaults are 90% threads, 10 GiB",
        "GPU 1 (A100-SXM4-40GB): MPS server process 77 gives 50% threads, 10 GiB by `mps limit`",
        "GPU 3 (A100-SXM4-40GB): compute mode prohibited with no sharing; a profile gives it default",
    ] {
        assert!(notes.contains(said), "{said}\n{notes}");
    }
    assert_eq!(exported.notes.len(), 3, "{notes}");
    // Every note is one comment line, and the text still parses.
    let comments = text.lines().take_while(|l| l.starts_with('#')).count();
    assert_eq!(comments, 1 + exported.notes.len(), "{text}");
    let profile = parse_profile(&text, "exported.toml", None).unwrap();
    let p = plan(&node, &profile, &PlanOptions::default()).unwrap();
    let steps: Vec<String> = p.steps().map(ToString::to_string).collect();
    // The drift is put back, GPU 3's compute mode reset; GPU 1's override stays.
    assert_eq!(steps.len(), 2, "{steps:?}");
    assert!(steps.iter().all(|s| s.starts_with("GPU 0") || s.starts_with("GPU 3")), "{steps:?}");
}

#[test]
fn instances_of_one_kind_shared_differently_and_unknown_instances_are_noted() {
    let text = "name = \"m\"\n[[gpu]]\nselect = \"all\"\nmig = { \"3g\" = 2 }\nsharing = \"mps\"\n";
    let mut node = node_of("a100-40gb:2", &parse_profile(text, "m.toml", None).unwrap());
    // GPU 0: the server of its second 3g gone; GPU 1: an instance of a profile id its
    // MIG table lacks.
    let second = node.gpus[0].instances[1].compute_instances[0].uuid.clone();
    node.mps.retain(|s| s.uuid != second);
    node.gpus[1].instances[0].profile_id = 999;
    let exported = export(&node);
    let notes = exported.notes.join("\n");
    assert_eq!(exported.notes.len(), 2, "{notes}");
    assert!(notes.contains("GPU 0 (A100-SXM4-40GB): 3g.20gb at slot 4: no sharing where another 3g.20gb has MPS (100% threads, no memory limit)"), "{notes}");
    assert!(notes.contains("GPU 1 (A100-SXM4-40GB): left out: GPU instance"), "{notes}");
    let text = exported.text();
    assert!(!text.contains("select = \"1\"") && !text.contains("0-1"), "{text}");
    assert!(
        text.contains("select = \"0\"\nmig = { \"3g.20gb\" = 2 }\nsharing = { mps = { active_thread_percentage = 100 } }\n"),
        "{text}"
    );
    // Applying it starts the missing server, and leaves GPU 1 alone.
    let profile = parse_profile(&text, "exported.toml", None).unwrap();
    let p = plan(&node, &profile, &PlanOptions::default()).unwrap();
    let steps: Vec<String> = p.steps().map(ToString::to_string).collect();
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert!(steps[0].starts_with("GPU 0: start"), "{steps:?}");
}

#[test]
fn an_exported_node_plans_to_nothing() {
    let half = ProfileStore::built_in().get("half-balanced").unwrap().profile.clone();
    let node = node_of("a100-40gb:8", &half);
    let exported = round_trip(&node);
    let text = exported.text();
    assert!(
        text.contains(
            "select = \"0-3\"\nmig = { \"1g.5gb\" = 2, \"2g.10gb\" = 1, \"3g.20gb\" = 1 }"
        ),
        "{text}"
    );
    assert!(text.contains("select = \"4-7\"\nmig = \"disabled\""), "{text}");

    let yaml = &exported.mig_parted;
    assert!(
        yaml.contains(
            "  exported:\n    - devices: [0, 1, 2, 3]\n      mig-enabled: true\n      mig-devices:\n        \"1g.5gb\": 2\n        \"2g.10gb\": 1\n        \"3g.20gb\": 1\n    - devices: [4, 5, 6, 7]\n      mig-enabled: false\n"
        ),
        "{yaml}"
    );
    assert!(exported.left_out.is_empty() && !yaml.contains("MIG only"), "{yaml}");
    let exported = parse_document(yaml, "exported.yaml", "exported").unwrap();
    assert!(plan(&node, &exported, &PlanOptions::default()).unwrap().is_empty());
}

#[test]
fn subdivided_instances_export_as_their_compute_instances() {
    let text = "name = \"c\"\n[[gpu]]\nselect = 0\nmig = { \"1c.3g\" = 4, \"3g\" = 0 }\n";
    let node = node_of("h100-80gb:2", &parse_profile(text, "c.toml", None).unwrap());
    let exported = round_trip(&node);
    let text = exported.text();
    assert!(text.contains("select = \"0\"\nmig = { \"1c.3g.40gb\" = 4 }"), "{text}");
    let yaml = &exported.mig_parted;
    assert!(yaml.contains("      mig-devices:\n        \"1c.3g.40gb\": 4\n"), "{yaml}");
    let exported = parse_document(yaml, "exported.yaml", "exported").unwrap();
    assert!(plan(&node, &exported, &PlanOptions::default()).unwrap().is_empty());
}
