//! Compute-instance subdivision on simulated nodes: the layouts a rule's compute
//! instances get, refusals that name the rule, instances kept and recomputed, MPS servers
//! on compute instances (moved out of `plan/tests.rs`, which had grown past 800 lines).

use super::*;

/// The compute layouts of the GPU instances the target of `text` gives GPU 0 of `spec`:
/// `3g.40gb@0 [1, 1, 1]`.
fn target_layouts(sim: &SimBackend, text: &str) -> Vec<String> {
    let p = plan_on(sim, &profile(text)).unwrap();
    p.gpus[0]
        .target
        .instances
        .iter()
        .map(|i| format!("{}@{} {:?}", i.profile.name, i.start, i.compute.sizes()))
        .collect()
}

#[test]
fn compute_instances_are_packed_as_mig_parted_packs_them() {
    let sim = node("h100-80gb:1");
    let rule = |mig: &str| format!("name = \"c\"\n[[gpu]]\nselect = 0\nmig = {{ {mig} }}\n");
    // Three 1c fill one 3g; two leave a slice unused; four take a second 3g.
    assert_eq!(target_layouts(&sim, &rule("\"1c.3g\" = 3")), ["3g.40gb@0 [1, 1, 1]"]);
    assert_eq!(target_layouts(&sim, &rule("\"1c.3g\" = 2")), ["3g.40gb@0 [1, 1]"]);
    assert_eq!(
        target_layouts(&sim, &rule("\"1c.3g\" = 4")),
        ["3g.40gb@0 [1, 1, 1]", "3g.40gb@4 [1]"]
    );
    // Beside a whole 3g, and in mig-parted's spelling; `3c.3g` is `3g`.
    assert_eq!(
        target_layouts(&sim, &rule("\"1c.3g.40gb\" = 3, \"3g\" = 1")),
        ["3g.40gb@0 [1, 1, 1]", "3g.40gb@4 [3]"]
    );
    assert_eq!(target_layouts(&sim, &rule("\"3c.3g\" = 1")), ["3g.40gb@0 [3]"]);
    // In a 7g: 2c ×3 (one slice left), 3c ×2.
    assert_eq!(target_layouts(&sim, &rule("\"2c.7g\" = 3")), ["7g.80gb@0 [2, 2, 2]"]);
    assert_eq!(target_layouts(&sim, &rule("\"3c.7g\" = 2")), ["7g.80gb@0 [3, 3]"]);
    // Compute instances of different sizes share a GPU instance, as in mig-parted
    // (issue 38): larger first, each where the driver puts it.
    assert_eq!(target_layouts(&sim, &rule("\"1c.3g\" = 1, \"2c.3g\" = 1")), ["3g.40gb@0 [2, 1]"]);
}

#[test]
fn a_subdivision_that_does_not_fit_names_the_rule_and_what_would() {
    let sim = node("h100-80gb:1");
    let text = "name = \"c\"\n[[gpu]]\nselect = 0\nmig = { \"4c.3g\" = 1 }\n";
    let e = plan_on(&sim, &profile(text)).unwrap_err().to_string();
    assert_eq!(
        e,
        "GPU 0 (H100-80GB-HBM3): 4c.3g does not fit (the rule at test.toml:2:1): a 3g.40gb \
         instance holds 1c ×3, 2c ×1 or 3c ×1"
    );
    assert!(!e.contains('\n'));
    // More compute instances than GPU instances of the profile can hold.
    let text = "name = \"c\"\n[[gpu]]\nselect = 0\nmig = { \"1c.3g\" = 7 }\n";
    let e = plan_on(&sim, &profile(text)).unwrap_err().to_string();
    assert_eq!(
        e,
        "GPU 0 (H100-80GB-HBM3): compute instances 1c ×7 of 3g.40gb need 3 GPU instances of it as mig-parted packs them ([1c ×3] [1c ×3] [1c ×1]; a 3g.40gb has 3 compute slices), and 3g.40gb ×3 exceeds the maximum of 2 per GPU (the rule at test.toml:2:1)"
    );
}

#[test]
fn subdivided_instances_are_created_kept_and_recomputed() {
    let sim = node("h100-80gb:1");
    let subdivided = profile(
        "name = \"c\"\n[[gpu]]\nselect = 0\nmig = { \"1c.3g\" = 3, \"3g\" = 1 }\n\
         instance_sharing.\"1c.3g\" = { mps = { replicas = 2 } }\n",
    );
    let p = plan_on(&sim, &subdivided).unwrap();
    let created: Vec<(u8, u8, bool)> = p
        .steps()
        .filter_map(|s| match s {
            Step::CreateComputeInstance { start, slices, whole, .. } => {
                Some((*start, *slices, *whole))
            }
            _ => None,
        })
        .collect();
    assert_eq!(created, [(0, 1, false), (0, 1, false), (0, 1, false), (4, 3, true)]);
    // One MPS server per compute instance of the subdivision, none on the whole 3g.
    let target = &p.gpus[0].target;
    let starts: Vec<(u8, u8)> = target.instance_mps.iter().map(|&(s, i, _)| (s, i)).collect();
    assert_eq!(starts, [(0, 0), (0, 1), (0, 2)]);
    // Each gets half of its compute instance's third of the 40 GB instance.
    let share = ((40448u64 << 20) / 3 / 2) & !((1 << 20) - 1);
    assert!(
        target.instance_mps.iter().all(|(_, _, spec)| spec.limits.active_thread_percentage == 50
            && spec.limits.pinned_memory_limit_bytes == Some(share)),
        "{:?}",
        target.instance_mps
    );
    let texts: Vec<String> = p
        .steps()
        .filter(|s| matches!(s, Step::StartMps { .. } | Step::CreateComputeInstance { .. }))
        .map(ToString::to_string)
        .collect();
    assert!(texts.contains(
        &"GPU 0: create a 1c compute instance (1c.3g.40gb) in 3g.40gb at slot 0".to_string()
    ));
    assert!(
        texts.iter().any(|t| t.starts_with(
            "GPU 0: start an MPS server on compute instance 2 (1c.3g.40gb) of 3g.40gb at slot 0"
        )),
        "{texts:?}"
    );

    // Carried out without MPS (the unit tests have none): the 3g at 0 holds three 1c.
    let mig_only =
        profile("name = \"c\"\n[[gpu]]\nselect = 0\nmig = { \"1c.3g\" = 3, \"3g\" = 1 }\n");
    apply(&sim, &plan_on(&sim, &mig_only).unwrap());
    let state = observed(&sim);
    let layouts: Vec<Vec<u8>> =
        state.gpus[0].instances.iter().map(|gi| gi.compute_layout()).collect();
    assert_eq!(layouts, [vec![1, 1, 1], vec![3]]);
    let again = plan_on(&sim, &mig_only).unwrap();
    assert!(again.is_empty(), "{:?}", again.steps().map(ToString::to_string).collect::<Vec<_>>());
    verify(&again, &state).unwrap();

    // Another subdivision of the same instance: its compute instances go, it stays.
    let two = profile("name = \"c\"\n[[gpu]]\nselect = 0\nmig = { \"1c.3g\" = 2, \"3g\" = 1 }\n");
    let p = plan_on(&sim, &two).unwrap();
    let ops: Vec<Operation> = p.steps().map(Step::operation).collect();
    assert_eq!(
        ops,
        [
            Operation::DestroyComputeInstance,
            Operation::DestroyComputeInstance,
            Operation::DestroyComputeInstance,
            Operation::CreateComputeInstance,
            Operation::CreateComputeInstance,
        ],
        "{:?}",
        p.steps().map(ToString::to_string).collect::<Vec<_>>()
    );
    // Verification sees the compute instances: before the change they differ.
    let e = verify(&p, &observed(&sim)).unwrap_err();
    assert!(e.contains("the MIG instances differ from the plan"), "{e}");
    apply(&sim, &p);
    verify(&p, &observed(&sim)).unwrap();

    // Back to whole: the 3g at 0 keeps its place, with one full-size compute instance.
    let whole = profile("name = \"c\"\n[[gpu]]\nselect = 0\nmig = { \"3g\" = 2 }\n");
    let p = plan_on(&sim, &whole).unwrap();
    assert!(!p.steps().any(|s| matches!(s, Step::DestroyGpuInstance { .. })));
    apply(&sim, &p);
    let layouts: Vec<Vec<u8>> =
        observed(&sim).gpus[0].instances.iter().map(|gi| gi.compute_layout()).collect();
    assert_eq!(layouts, [vec![3], vec![3]]);
}

#[test]
fn subdivisions_plan_on_both_simulated_mig_generations() {
    for (spec, name) in [("a100-40gb:1", "3g.20gb"), ("h100-80gb:1", "3g.40gb")] {
        let sim = node(spec);
        let text = format!(
            "name = \"c\"\n[[gpu]]\nselect = 0\nmig = {{ \"1c.{name}\" = 3, \"1c.1g\" = 1, \"2c.2g\" = 1 }}\n"
        );
        let p = plan_on(&sim, &profile(&text)).unwrap();
        apply(&sim, &p);
        verify(&p, &observed(&sim)).unwrap();
        assert!(plan_on(&sim, &profile(&text)).unwrap().is_empty(), "{spec}");
    }
}
