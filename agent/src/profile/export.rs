//! The observed state of the GPUs written as a profile (`gpushare-ctl export`): applying
//! it changes nothing.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::node::{GpuState, NodeState};

/// A GPU's MIG layout as instance counts by profile name; `None` with MIG off.
type Layout = Option<BTreeMap<String, u32>>;

/// What a GPU looks like, for grouping GPUs that look alike into one rule.
fn layout(gpu: &GpuState) -> Layout {
    gpu.mig_enabled.then(|| {
        let mut counts = BTreeMap::new();
        for gi in &gpu.instances {
            let profile = gpu.model.and_then(|m| m.profile_by_id(gi.profile_id));
            let name = profile
                .map_or_else(|| format!("profile-id-{}", gi.profile_id), |p| p.name.to_string());
            let whole = profile.map(|p| p.compute_slices);
            // A subdivided instance counts its compute instances (`1c.3g.40gb`); one
            // used whole (or without compute instances: applying makes its one) counts 1.
            let sizes = gi.compute_layout();
            if sizes.is_empty() || sizes.iter().all(|&c| Some(c) == whole) {
                *counts.entry(name).or_insert(0) += 1;
                continue;
            }
            for c in sizes {
                *counts.entry(format!("{c}c.{name}")).or_insert(0) += 1;
            }
        }
        counts
    })
}

/// The GPUs grouped by layout, in the order of their first GPU.
fn groups(node: &NodeState) -> Vec<(Layout, Vec<u32>)> {
    let mut groups: Vec<(Layout, Vec<u32>)> = Vec::new();
    for gpu in &node.gpus {
        let l = layout(gpu);
        match groups.iter_mut().find(|(g, _)| *g == l) {
            Some((_, gpus)) => gpus.push(gpu.index),
            None => groups.push((l, vec![gpu.index])),
        }
    }
    groups
}

/// A profile named `exported` with one rule per group of GPUs of the same layout. Exact
/// profile names are used, subdivided instances as their compute instances
/// (`"1c.3g.40gb" = 3`); placements are not written, and the planner keeps instances
/// where they are, so applying the profile changes nothing (unless one GPU instance holds
/// compute instances of different sizes, or fewer than it could while another of its
/// profile holds more: a profile packs them as mig-parted does).
pub fn profile_text(node: &NodeState) -> String {
    let groups = groups(node);
    let mut text = String::from(
        "name = \"exported\"\ndescription = \"The GPUs as gpushare-ctl export found them\"\n",
    );
    for (layout, gpus) in groups {
        let select = crate::node::index_ranges(&gpus);
        let _ = write!(text, "\n[[gpu]]\nselect = \"{select}\"\n");
        match layout {
            None => text.push_str("mig = \"disabled\"\n"),
            Some(counts) => {
                let items: Vec<String> =
                    counts.iter().map(|(name, n)| format!("\"{name}\" = {n}")).collect();
                let _ = writeln!(text, "mig = {{ {} }}", items.join(", "));
            }
        }
    }
    text
}

/// The MIG layout as NVIDIA mig-parted's config file: one config, `exported`, with one
/// entry per group of GPUs of the same layout (exact profile names, GPUs by index). The
/// groups select disjoint GPUs, so mig-parted's every-matching-entry and gpushare's
/// first-rule readings agree; `apply -f FILE -c exported` changes nothing. MIG names and
/// indices need no YAML quoting but are quoted anyway, as mig-parted's own files do.
pub fn mig_parted_text(node: &NodeState) -> String {
    let mut text = String::from(
        "# The GPUs as gpushare-ctl export found them (NVIDIA mig-parted's format)\n\
         version: v1\nmig-configs:\n  exported:\n",
    );
    for (layout, gpus) in groups(node) {
        let devices: Vec<String> = gpus.iter().map(u32::to_string).collect();
        let _ = writeln!(text, "    - devices: [{}]", devices.join(", "));
        match layout {
            None => text.push_str("      mig-enabled: false\n"),
            Some(counts) if counts.is_empty() => {
                text.push_str("      mig-enabled: true\n      mig-devices: {}\n");
            }
            Some(counts) => {
                text.push_str("      mig-enabled: true\n      mig-devices:\n");
                for (name, n) in counts {
                    let _ = writeln!(text, "        \"{name}\": {n}");
                }
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::catalog::parse_node_spec as parse_spec;
    use crate::gpu::GpuBackend;
    use crate::gpu::sim::{SimBackend, SimOptions};
    use crate::plan::{PlanOptions, plan};
    use crate::profile::{ProfileStore, parse_document, parse_profile};

    #[test]
    fn ranges_compress() {
        assert_eq!(crate::node::index_ranges(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
        assert_eq!(crate::node::index_ranges(&[5]), "5");
    }

    /// A simulated node of `spec` after `profile` was applied to it.
    fn applied(spec: &str, profile: &crate::profile::Profile) -> NodeState {
        let sim = Arc::new(SimBackend::new(&parse_spec(spec).unwrap(), SimOptions::default()));
        let p = plan(&NodeState::of_gpus(sim.observe().unwrap()), profile, &PlanOptions::default())
            .unwrap();
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

    #[test]
    fn an_exported_node_plans_to_nothing() {
        let half = ProfileStore::built_in().get("half-balanced").unwrap().profile.clone();
        let node = applied("a100-40gb:8", &half);
        let text = profile_text(&node);
        assert!(
            text.contains(
                "select = \"0-3\"\nmig = { \"1g.5gb\" = 2, \"2g.10gb\" = 1, \"3g.20gb\" = 1 }"
            ),
            "{text}"
        );
        assert!(text.contains("select = \"4-7\"\nmig = \"disabled\""), "{text}");
        let exported = parse_profile(&text, "exported.toml", None).unwrap();
        assert!(plan(&node, &exported, &PlanOptions::default()).unwrap().is_empty());

        let yaml = mig_parted_text(&node);
        assert!(
            yaml.contains(
                "  exported:\n    - devices: [0, 1, 2, 3]\n      mig-enabled: true\n      mig-devices:\n        \"1g.5gb\": 2\n        \"2g.10gb\": 1\n        \"3g.20gb\": 1\n    - devices: [4, 5, 6, 7]\n      mig-enabled: false\n"
            ),
            "{yaml}"
        );
        let exported = parse_document(&yaml, "exported.yaml", "exported").unwrap();
        assert!(plan(&node, &exported, &PlanOptions::default()).unwrap().is_empty());
    }

    #[test]
    fn subdivided_instances_export_as_their_compute_instances() {
        let text = "name = \"c\"\n[[gpu]]\nselect = 0\nmig = { \"1c.3g\" = 4, \"3g\" = 0 }\n";
        let node = applied("h100-80gb:2", &parse_profile(text, "c.toml", None).unwrap());
        let text = profile_text(&node);
        assert!(text.contains("select = \"0\"\nmig = { \"1c.3g.40gb\" = 4 }"), "{text}");
        let exported = parse_profile(&text, "exported.toml", None).unwrap();
        assert!(plan(&node, &exported, &PlanOptions::default()).unwrap().is_empty());
        let yaml = mig_parted_text(&node);
        assert!(yaml.contains("      mig-devices:\n        \"1c.3g.40gb\": 4\n"), "{yaml}");
        let exported = parse_document(&yaml, "exported.yaml", "exported").unwrap();
        assert!(plan(&node, &exported, &PlanOptions::default()).unwrap().is_empty());
    }
}
