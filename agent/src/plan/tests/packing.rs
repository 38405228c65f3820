//! Compute instances of mixed sizes packed into GPU instances as NVIDIA's mig-parted
//! packs them (issue 38), from mig-parted files and from gpushare profiles.

use super::*;
use crate::profile::migparted::parse_mig_parted;

/// The mig-parted config `c` of one entry for all GPUs with these `mig-devices`.
fn mig_parted(devices: &str) -> Profile {
    let text = format!(
        "version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {{{devices}}}\n"
    );
    parse_mig_parted(&text, "c.yaml", "c").unwrap()
}

/// Each GPU instance of GPU 0 as the sim has it: `3g.40gb [2, 1]`, by start.
fn made(sim: &SimBackend) -> Vec<String> {
    let state = observed(sim);
    let g = state.gpu(0).unwrap();
    let mut gis: Vec<_> = g.instances.iter().collect();
    gis.sort_by_key(|gi| gi.placement_start);
    gis.iter()
        .map(|gi| {
            let name = &g.model.unwrap().profile_by_id(gi.profile_id).unwrap().name;
            format!("{name} {:?}", gi.compute_layout())
        })
        .collect()
}

/// Plans `p` on `sim`, applies it, checks it and that planning again changes nothing.
fn apply_and_assert(sim: &Arc<SimBackend>, p: &Profile) {
    let plan = plan_on(sim, p).unwrap();
    apply(sim, &plan);
    verify(&plan, &observed(sim)).unwrap();
    let again = plan_on(sim, p).unwrap();
    assert!(again.is_empty(), "{:?}", again.steps().map(ToString::to_string).collect::<Vec<_>>());
}

#[test]
fn two_sizes_in_one_3g_instance_on_h100_and_a100_80gb() {
    for spec in ["h100-80gb:1", "a100-80gb:1"] {
        let sim = node(spec);
        let p = mig_parted("\"2c.3g.40gb\": 1, \"1c.3g.40gb\": 1");
        apply_and_assert(&sim, &p);
        assert_eq!(made(&sim), ["3g.40gb [2, 1]"], "{spec}");
        // gpushare's own spelling says the same.
        let own = profile(
            "name = \"c\"\n[[gpu]]\nselect = \"all\"\nmig = { \"1c.3g\" = 1, \"2c.3g\" = 1 }\n",
        );
        assert!(plan_on(&sim, &own).unwrap().is_empty(), "{spec}");
    }
}

#[test]
fn four_and_three_slices_share_the_one_7g_instance() {
    let sim = node("h100-80gb:1");
    let p = mig_parted("\"4c.7g.80gb\": 1, \"3c.7g.80gb\": 1");
    apply_and_assert(&sim, &p);
    assert_eq!(made(&sim), ["7g.80gb [4, 3]"]);
}

#[test]
fn a_mixed_set_that_does_not_fit_says_it_is_about_compute_instances() {
    let sim = node("h100-80gb:1");
    let p = mig_parted("\"4c.7g.80gb\": 1, \"3c.7g.80gb\": 1, \"2c.7g.80gb\": 1");
    let e = plan_on(&sim, &p).unwrap_err().to_string();
    assert_eq!(
        e,
        "GPU 0 (H100-80GB-HBM3): compute instances 4c ×1 + 3c ×1 + 2c ×1 of 7g.80gb need 2 GPU \
         instances of it as mig-parted packs them ([4c ×1 + 3c ×1] [2c ×1]; a 7g.80gb has 7 \
         compute slices), and 7g.80gb ×2 exceeds the maximum of 1 per GPU (the rule at c.yaml:4:7)"
    );
    assert!(!e.contains('\n'));
    // GPU instances used whole are refused as before.
    let e = plan_on(&sim, &mig_parted("\"7g.80gb\": 2")).unwrap_err().to_string();
    assert_eq!(
        e,
        "GPU 0 (H100-80GB-HBM3): 7g.80gb ×2 exceeds the maximum of 1 per GPU (the rule at c.yaml:4:7)"
    );
}

#[test]
fn what_is_left_over_opens_the_next_instance_and_whole_ones_stay_whole() {
    let sim = node("h100-80gb:1");
    // Largest first: 2c + 1c fill a 3g, the next two 1c open a second.
    apply_and_assert(&sim, &mig_parted("\"2c.3g.40gb\": 1, \"1c.3g.40gb\": 3"));
    let mut got = made(&sim);
    got.sort();
    assert_eq!(got, ["3g.40gb [1, 1]", "3g.40gb [2, 1]"]);
    // A whole 3g is made first and holds nothing else.
    let sim = node("h100-80gb:1");
    apply_and_assert(&sim, &mig_parted("\"3g.40gb\": 1, \"1c.3g.40gb\": 1, \"2c.3g.40gb\": 1"));
    let mut got = made(&sim);
    got.sort();
    assert_eq!(got, ["3g.40gb [2, 1]", "3g.40gb [3]"]);
}

#[test]
fn an_order_that_does_not_fit_gives_way_to_the_next_as_in_mig_parted() {
    // In the first order (2c, 2c, 1c, 1c) the second 2c and a 1c share an instance and
    // the last 1c needs a third 3g, one more than an H100 holds; mig-parted then tries
    // 2c, 1c, 2c, 1c: two 3g of 2c + 1c each.
    let sim = node("h100-80gb:1");
    apply_and_assert(&sim, &mig_parted("\"2c.3g.40gb\": 2, \"1c.3g.40gb\": 2"));
    assert_eq!(made(&sim), ["3g.40gb [2, 1]", "3g.40gb [2, 1]"]);
}

#[test]
fn compute_instances_packed_otherwise_are_kept_when_they_are_the_ones_asked_for() {
    // Two 3g, one with a 2c and one with a 1c, as nvidia-smi or an older gpushare makes
    // them: mig-parted's assert counts the same compute instances, and so does gpushare.
    let sim = node("h100-80gb:1");
    let state = observed(&sim);
    let h100 = state.gpus[0].model.unwrap();
    let three = h100.profile_by_name("3g.40gb").unwrap();
    let target = GpuTarget {
        mig_enabled: true,
        instances: vec![
            Placed { profile: three, start: 0, compute: ComputeLayout::of(&[2]) },
            Placed { profile: three, start: 4, compute: ComputeLayout::of(&[1]) },
        ],
        compute_mode: Some(ComputeMode::Default),
        mps: None,
        instance_mps: vec![],
        timeslice: Some(TimeSliceInterval::Default),
        replicas: None,
    };
    apply(&sim, &plan_to(&state, "by-hand", vec![(0, target)], &PlanOptions::default()).unwrap());
    assert_eq!(made(&sim), ["3g.40gb [2]", "3g.40gb [1]"]);
    let p = mig_parted("\"2c.3g.40gb\": 1, \"1c.3g.40gb\": 1");
    let again = plan_on(&sim, &p).unwrap();
    assert!(again.is_empty(), "{:?}", again.steps().map(ToString::to_string).collect::<Vec<_>>());
    // Other compute instances are packed anew.
    let p = mig_parted("\"2c.3g.40gb\": 1, \"1c.3g.40gb\": 2");
    apply_and_assert(&sim, &p);
    let mut got = made(&sim);
    got.sort();
    assert_eq!(got, ["3g.40gb [1]", "3g.40gb [2, 1]"]);
}

#[test]
fn eight_different_compute_instances_that_fit_no_order_are_refused() {
    // Every order of eight distinct entries (40,320) is tried before the refusal.
    let sim = node("h100-80gb:1");
    let p = mig_parted(
        "\"1c.7g.80gb\": 1, \"2c.7g.80gb\": 1, \"3c.7g.80gb\": 1, \"4c.7g.80gb\": 1, \
         \"1c.4g.40gb\": 1, \"2c.4g.40gb\": 1, \"1c.3g.40gb\": 1, \"2c.3g.40gb\": 1",
    );
    let e = plan_on(&sim, &p).unwrap_err().to_string();
    assert!(
        e.contains(
            "compute instances 4c ×1 + 3c ×1 + 2c ×1 + 1c ×1 of 7g.80gb need 2 GPU instances of \
             it as mig-parted packs them ([4c ×1 + 3c ×1] [2c ×1 + 1c ×1]; a 7g.80gb has 7"
        ),
        "{e}"
    );
}

#[test]
fn compute_instances_of_mixed_sizes_share_memory_by_their_slices() {
    // A 3g of 2c + 1c: MPS limits derived from `replicas` divide each compute instance's
    // share of the 40 GB instance, two thirds and one third (was half each).
    let sim = node("h100-80gb:1");
    let p = profile(
        "name = \"c\"\n[[gpu]]\nselect = 0\nmig = { \"2c.3g\" = 1, \"1c.3g\" = 1 }\n\
         instance_sharing.\"2c.3g\" = { mps = { replicas = 2 } }\n\
         instance_sharing.\"1c.3g\" = { mps = { replicas = 2 } }\n",
    );
    let plan = plan_on(&sim, &p).unwrap();
    let target = &plan.gpus[0].target;
    assert_eq!(target.instances.len(), 1);
    assert_eq!(target.instances[0].compute.sizes(), [2, 1]);
    let mib = |bytes: u64| bytes & !((1 << 20) - 1);
    let memory = 40448u64 << 20;
    let limits: Vec<(u8, Option<u64>)> = target
        .instance_mps
        .iter()
        .map(|(_, index, spec)| (*index, spec.limits.pinned_memory_limit_bytes))
        .collect();
    assert_eq!(limits, [(0, Some(mib(memory * 2 / 3 / 2))), (1, Some(mib(memory / 3 / 2)))]);
    // Compute instances of one size still split it evenly.
    let p = profile(
        "name = \"c\"\n[[gpu]]\nselect = 0\nmig = { \"1c.3g\" = 2 }\n\
         instance_sharing.\"1c.3g\" = { mps = { replicas = 2 } }\n",
    );
    let plan = plan_on(&sim, &p).unwrap();
    let limits: Vec<Option<u64>> = plan.gpus[0]
        .target
        .instance_mps
        .iter()
        .map(|(_, _, spec)| spec.limits.pinned_memory_limit_bytes)
        .collect();
    assert_eq!(limits, [Some(mib(memory / 2 / 2)); 2]);
}

#[test]
fn orders_are_tried_as_mig_parted_iterates_them_and_counted() {
    // mig-parted's iteratePermutationsUntilSuccess, traced by hand: swaps in place, equal
    // entries (one profile name) never swapped.
    let sim = node("h100-80gb:1");
    let state = observed(&sim);
    let h100 = state.gpus[0].model.unwrap();
    let three = h100.profile_by_name("3g.40gb").unwrap();
    let entry = |compute, request| crate::plan::packing::Entry { profile: three, compute, request };
    let (a, b, c) = (entry(2, 0), entry(1, 1), entry(3, 2));
    let name = |e: &crate::plan::packing::Entry| match e.request {
        0 => 'a',
        1 => 'b',
        _ => 'c',
    };
    let tried = |order: &mut [crate::plan::packing::Entry]| {
        let mut seen: Vec<String> = Vec::new();
        let found = crate::plan::packing::permutations(order, 0, &mut |o| {
            seen.push(o.iter().map(name).collect());
            false
        });
        assert!(!found);
        seen
    };
    assert_eq!(tried(&mut [a, b, c]), ["abc", "acb", "bac", "bca", "cba", "cab"]);
    assert_eq!(tried(&mut [a, a, b]), ["aab", "aba", "baa"]);
    // The first order that succeeds ends the search.
    let mut calls = 0;
    assert!(crate::plan::packing::permutations(&mut [a, b, c], 0, &mut |o| {
        calls += 1;
        name(&o[0]) == 'b'
    }));
    assert_eq!(calls, 3);
    // The most a rule can ask: eight entries (profile::MAX_MIG_INSTANCES), all different,
    // are 8! = 40,320 orders, each visited once; repeated entries make fewer.
    assert_eq!(crate::profile::MAX_MIG_INSTANCES, 8);
    let eight: Vec<crate::plan::packing::Entry> = (0..8).map(|r| entry(1, r)).collect();
    let mut count = 0u32;
    crate::plan::packing::permutations(&mut eight.clone(), 0, &mut |_| {
        count += 1;
        false
    });
    assert_eq!(count, 40_320);
    let repeated: Vec<crate::plan::packing::Entry> = (0..8).map(|r| entry(1, r % 2)).collect();
    let mut count = 0u32;
    crate::plan::packing::permutations(&mut repeated.clone(), 0, &mut |_| {
        count += 1;
        false
    });
    assert_eq!(count, 70); // 8! / (4! 4!)
}

#[test]
fn a_refusal_blames_compute_instances_only_where_no_order_packs_them_tighter() {
    // mig-parted's first order (3c, 2c, 2c) needs a second 7g, but its second (2c, 3c,
    // 2c) packs all three into one: what stands in the way is the 1g beside a 7g, not
    // the compute instances.
    let sim = node("a100-40gb:1");
    let p = mig_parted("\"3c.7g.40gb\": 1, \"2c.7g.40gb\": 2, \"1g.5gb\": 1");
    let e = plan_on(&sim, &p).unwrap_err().to_string();
    assert!(!e.contains("compute instances"), "{e}");
    assert!(!e.contains("7g.40gb ×2"), "{e}");
    assert!(e.contains("7g.40gb ×1") && e.contains("1g.5gb ×1"), "{e}");
    assert!(e.ends_with("(the rule at c.yaml:4:7)") && !e.contains('\n'), "{e}");
    // Without the 1g the second order is made: one 7g of all three.
    let sim = node("a100-40gb:1");
    apply_and_assert(&sim, &mig_parted("\"3c.7g.40gb\": 1, \"2c.7g.40gb\": 2"));
    assert_eq!(made(&sim), ["7g.40gb [3, 2, 2]"]);
}
