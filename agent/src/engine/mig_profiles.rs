//! `MigProfiles`: each MIG GPU's profile table as the agent plans with it — the driver's,
//! read through NVML (see `gpu::nvml::driver_table`) — with the columns of `nvidia-smi
//! mig -lgip`, the placements of `-lgipp`, how many more instances of each profile fit
//! now, how the table compares with gpushare's catalog, and which names a profile file
//! may use for each profile.

use gpushare_proto::types::{
    CatalogComparison, ComputeInstanceSize, GpuMigProfiles, MigEngines, MigProfileInfo, MigProfiles,
};

use super::EngineError;
use crate::catalog::{self, GpuModel, MigProfile};
use crate::gpu::nvml::catalog_check::{compare_with_catalog, table_of};
use crate::node::{GpuState, NodeState};
use crate::profile::{MigKey, MigLayout};

/// The MIG profiles of the GPU `gpu` names (its index or `GPU-…` UUID, any case), or of
/// every GPU with MIG when `gpu` is empty. A GPU the node lacks, or one without MIG, is
/// refused in one line naming the argument and the GPUs that would do.
pub fn mig_profiles(node: &NodeState, gpu: &str) -> Result<MigProfiles, EngineError> {
    let with_mig: Vec<(&GpuState, &'static GpuModel)> =
        node.gpus.iter().filter_map(|g| mig_model(g).map(|m| (g, m))).collect();
    let chosen = if gpu.is_empty() {
        if with_mig.is_empty() {
            let gpus: Vec<String> = node.gpus.iter().map(GpuState::label).collect();
            let gpus = if gpus.is_empty() { "no GPUs".to_owned() } else { gpus.join(", ") };
            return Err(EngineError::InvalidArgument(format!(
                "no GPU of this node has MIG ({gpus})"
            )));
        }
        with_mig
    } else {
        let found = match gpu.parse::<u32>() {
            Ok(index) => node.gpu(index),
            Err(_) => node.gpus.iter().find(|g| g.uuid.eq_ignore_ascii_case(gpu)),
        };
        let would_do = || {
            let indices: Vec<u32> = with_mig.iter().map(|(g, _)| g.index).collect();
            match indices.len() {
                0 => "no GPU of this node has MIG".to_owned(),
                1 => format!("the GPU with MIG is {} (by index or GPU-… UUID)", indices[0]),
                _ => format!(
                    "the GPUs with MIG are {} (by index or GPU-… UUID)",
                    crate::node::index_ranges(&indices)
                ),
            }
        };
        match found {
            None => {
                return Err(EngineError::InvalidArgument(format!(
                    "GPU {gpu:?}: this node has no such GPU; {}",
                    would_do()
                )));
            }
            Some(g) => match mig_model(g) {
                Some(model) => vec![(g, model)],
                None => {
                    return Err(EngineError::InvalidArgument(format!(
                        "GPU {gpu:?}: {} has no MIG; {}",
                        g.label(),
                        would_do()
                    )));
                }
            },
        }
    };
    Ok(MigProfiles { gpus: chosen.into_iter().map(|(g, m)| gpu_profiles(g, m)).collect() })
}

/// The model of a GPU with MIG profiles.
fn mig_model(gpu: &GpuState) -> Option<&'static GpuModel> {
    gpu.model.filter(|m| m.supports_mig())
}

/// One GPU's table.
fn gpu_profiles(gpu: &GpuState, model: &'static GpuModel) -> GpuMigProfiles {
    // The catalog's model of this GPU, as the driver's table is checked against it.
    let catalog_model = catalog::model_by_pci_id(gpu.pci_device_id)
        .or_else(|| catalog::model_by_nvml_name(&gpu.name));
    // A model that is none of gpushare's model files was built from the driver's table.
    let from_driver = !catalog::simulated_models().iter().any(|m| std::ptr::eq(m, model));
    let mut profiles: Vec<&'static MigProfile> = model.mig_profiles.iter().collect();
    // nvidia-smi's order: by size, the plain profile before its variants.
    profiles.sort_by_key(|p| (p.compute_slices, p.memory_mib, p.nvml_enum));
    GpuMigProfiles {
        index: gpu.index,
        uuid: gpu.uuid.clone(),
        model: gpu.model_name().to_owned(),
        source: model.source.clone(),
        from_driver,
        mig_enabled: gpu.mig_enabled,
        memory_slots: u32::from(model.memory_slots),
        compute_slices: u32::from(model.compute_slices),
        catalog: catalog_model.map(|c| CatalogComparison {
            key: c.key.clone(),
            differences: compare_with_catalog(&table_of(model), c),
        }),
        profiles: profiles
            .into_iter()
            .map(|p| MigProfileInfo {
                name: p.name.clone(),
                id: p.id,
                nvml_enum: p.nvml_enum,
                instances_free: gpu.mig_enabled.then(|| instances_free(gpu, model, p)),
                instances_total: u32::from(p.max_count),
                memory_mib: p.memory_mib,
                sms: p.sms,
                compute_slices: u32::from(p.compute_slices),
                memory_slices: u32::from(p.memory_slices),
                engines: MigEngines {
                    copy: u32::from(p.engines.copy),
                    decoders: u32::from(p.engines.decoders),
                    encoders: u32::from(p.engines.encoders),
                    jpeg: u32::from(p.engines.jpeg),
                    ofa: u32::from(p.engines.ofa),
                },
                placements: {
                    let mut starts: Vec<u32> = p.placements.iter().map(|&s| u32::from(s)).collect();
                    starts.sort_unstable();
                    starts
                },
                accepts: accepts(model, p),
                compute_instances: crate::profile::compute_instance_sizes(model, p)
                    .into_iter()
                    .map(|(s, n)| ComputeInstanceSize {
                        compute_slices: u32::from(s),
                        count: u32::from(n),
                    })
                    .collect(),
                compute_from_driver: !p.compute_profiles.is_empty(),
            })
            .collect(),
    }
}

/// How many more instances of `profile` fit beside the GPU's instances, counted as the
/// driver counts them (`nvmlDeviceGetGpuInstanceRemainingCapacity`, nvidia-smi's Free):
/// placed greedily on its placements in ascending order, each on memory slots no instance
/// holds, within the profile's maximum count and the compute slices left.
fn instances_free(gpu: &GpuState, model: &GpuModel, profile: &MigProfile) -> u32 {
    // (start, size, profile id) of every instance, the ones counted in as they fit.
    let mut taken: Vec<(u32, u32, u32)> = gpu
        .instances
        .iter()
        .map(|gi| (u32::from(gi.placement_start), u32::from(gi.placement_size), gi.profile_id))
        .collect();
    let mut starts: Vec<u32> = profile.placements.iter().map(|&s| u32::from(s)).collect();
    starts.sort_unstable();
    let size = u32::from(profile.memory_slices);
    let mut free = 0;
    for start in starts {
        let overlaps = taken.iter().any(|&(s, n, _)| start < s + n && s < start + size);
        let same = taken.iter().filter(|&&(_, _, id)| id == profile.id).count();
        let compute: u32 = taken
            .iter()
            .filter_map(|&(_, _, id)| model.profile_by_id(id))
            .map(|p| u32::from(p.compute_slices))
            .sum();
        let mut with: Vec<&MigProfile> =
            taken.iter().filter_map(|&(_, _, id)| model.profile_by_id(id)).collect();
        with.push(profile);
        if !overlaps
            && same < usize::from(profile.max_count)
            && compute + u32::from(profile.compute_slices) <= u32::from(model.compute_slices)
            && crate::plan::placement::engines_fit(model, &with)
        {
            taken.push((start, size, profile.id));
            free += 1;
        }
    }
    free
}

/// The names a profile file may give `profile` on `model`: its exact name (mig-parted's
/// `mig-devices` take it too), and its slice count (`1g`) where that stands for it (the
/// smallest plain profile of that size). Each name is read by the profile parser itself
/// and resolved as planning resolves it, so that the list cannot drift from what an apply
/// takes.
fn accepts(model: &'static GpuModel, profile: &'static MigProfile) -> Vec<String> {
    [profile.name.clone(), format!("{}g", profile.compute_slices)]
        .into_iter()
        .filter(|name| {
            mig_key(name)
                .and_then(|key| key.resolve(model))
                .is_some_and(|resolved| std::ptr::eq(resolved, profile))
        })
        .collect()
}

/// The MIG key a profile file's `mig = { "NAME" = 1 }` reads `name` as, if it reads.
fn mig_key(name: &str) -> Option<MigKey> {
    // Names drivers print are made of these; anything else could not be written unquoted
    // into the TOML below (and no parser rule takes it).
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || ".+-_".contains(c)) {
        return None;
    }
    let text = format!("[[gpu]]\nselect = \"all\"\nmig = {{ \"{name}\" = 1 }}\n");
    let profile = crate::profile::parse_profile(&text, "mig profiles", Some("accepts")).ok()?;
    match &profile.rules.first()?.mig {
        MigLayout::Enabled(keys) => keys.first().map(|(key, _)| key.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::parse_node_spec;
    use crate::gpu::GpuBackend;
    use crate::gpu::sim::{SimBackend, SimOptions};
    use crate::node::{ComputeInstance, GpuInstance};

    fn node(spec: &str) -> NodeState {
        let backend = SimBackend::new(&parse_node_spec(spec).unwrap(), SimOptions::default());
        NodeState::of_gpus(backend.observe().unwrap())
    }

    fn error(node: &NodeState, gpu: &str) -> String {
        mig_profiles(node, gpu).unwrap_err().to_string()
    }

    fn profile<'a>(gpu: &'a GpuMigProfiles, name: &str) -> &'a MigProfileInfo {
        gpu.profiles.iter().find(|p| p.name == name).unwrap_or_else(|| panic!("no {name}"))
    }

    /// A GPU instance of `profile` at `start` (with one compute instance).
    fn instance(model: &GpuModel, name: &str, start: u8, id: u32) -> GpuInstance {
        let p = model.profile_by_name(name).unwrap();
        GpuInstance {
            id,
            profile_id: p.id,
            placement_start: start,
            placement_size: p.memory_slices,
            compute_instances: vec![ComputeInstance {
                id: 0,
                uuid: format!("MIG-{id}"),
                slices: p.compute_slices,
            }],
        }
    }

    #[test]
    fn the_h100_table_in_nvidia_smi_order_with_the_names_gpushare_takes() {
        let node = node("h100-80gb:2");
        let doc = mig_profiles(&node, "").unwrap();
        assert_eq!(doc.gpus.len(), 2);
        let gpu = &doc.gpus[0];
        assert_eq!((gpu.index, gpu.model.as_str()), (0, "H100-80GB-HBM3"));
        assert_eq!((gpu.memory_slots, gpu.compute_slices), (8, 7));
        let names: Vec<&str> = gpu.profiles.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
        );
        let one = profile(gpu, "1g.10gb");
        assert_eq!((one.id, one.nvml_enum, one.memory_mib, one.sms), (19, 0, 9984, 16));
        assert_eq!(one.placements, [0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(one.accepts, ["1g.10gb", "1g"]);
        assert_eq!(one.engines, MigEngines { copy: 1, decoders: 1, encoders: 0, jpeg: 1, ofa: 0 });
        assert_eq!(profile(gpu, "1g.20gb").accepts, ["1g.20gb"]);
        assert_eq!(profile(gpu, "1g.10gb+me").accepts, ["1g.10gb+me"]);
        assert_eq!(profile(gpu, "3g.40gb").accepts, ["3g.40gb", "3g"]);
        let seven = profile(gpu, "7g.80gb");
        assert_eq!((seven.memory_slices, seven.placements.clone()), (8, vec![0]));
        // The unit tests' double hands out the catalog's own model: no driver here.
        assert!(!gpu.from_driver);
        let catalog = gpu.catalog.as_ref().unwrap();
        assert_eq!((catalog.key.as_str(), catalog.differences.len()), ("h100-80gb", 0));
        // MIG off: the driver counts no free instances.
        assert!(gpu.profiles.iter().all(|p| p.instances_free.is_none()));
    }

    #[test]
    fn gpus_are_picked_by_index_or_uuid() {
        let node = node("h100-80gb:2");
        let uuid = node.gpus[1].uuid.clone();
        for arg in ["1".to_owned(), uuid.clone(), uuid.to_lowercase()] {
            let doc = mig_profiles(&node, &arg).unwrap();
            assert_eq!(doc.gpus.len(), 1, "{arg}");
            assert_eq!((doc.gpus[0].index, &doc.gpus[0].uuid), (1, &uuid));
        }
    }

    #[test]
    fn bad_gpu_arguments_are_refused_in_one_line_naming_what_would_do() {
        let node = node("h100-80gb:2");
        assert_eq!(
            error(&node, "9"),
            "GPU \"9\": this node has no such GPU; the GPUs with MIG are 0-1 (by index or GPU-… UUID)"
        );
        assert!(error(&node, "GPU-nope").starts_with("GPU \"GPU-nope\": this node has no such"));
        assert!(error(&node, "MIG-1").contains("no such GPU"));
        let mixed = self::node("l40s:1,a30:1");
        assert_eq!(
            error(&mixed, "0"),
            "GPU \"0\": GPU 0 (L40S) has no MIG; the GPU with MIG is 1 (by index or GPU-… UUID)"
        );
        assert_eq!(mig_profiles(&mixed, "").unwrap().gpus[0].index, 1);
        let none = self::node("l40s:2");
        assert_eq!(
            error(&none, "1"),
            "GPU \"1\": GPU 1 (L40S) has no MIG; no GPU of this node has MIG"
        );
        assert_eq!(error(&none, ""), "no GPU of this node has MIG (GPU 0 (L40S), GPU 1 (L40S))");
        for e in [error(&node, "9"), error(&none, "")] {
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn free_instances_are_counted_as_the_driver_counts_them() {
        let mut node = node("h100-80gb:1");
        let model = node.gpus[0].model.unwrap();
        node.gpus[0].mig_enabled = true;
        let free = |node: &NodeState| -> Vec<(String, Option<u32>)> {
            let doc = mig_profiles(node, "0").unwrap();
            doc.gpus[0].profiles.iter().map(|p| (p.name.clone(), p.instances_free)).collect()
        };
        let empty = free(&node);
        let totals: Vec<u32> = mig_profiles(&node, "0").unwrap().gpus[0]
            .profiles
            .iter()
            .map(|p| p.instances_total)
            .collect();
        // An empty GPU: every profile at its maximum, as nvidia-smi's 7/7, 1/1, 4/4, ...
        assert_eq!(empty.iter().map(|(_, f)| f.unwrap()).collect::<Vec<_>>(), totals, "{empty:?}");
        assert_eq!(totals, [7, 1, 4, 3, 2, 1, 1]);
        // A 3g.40gb at 4 and a 1g.10gb at 0: slots 1-3 left, 3 compute slices.
        node.gpus[0].instances =
            vec![instance(model, "1g.10gb", 0, 9), instance(model, "3g.40gb", 4, 2)];
        let now: Vec<(String, Option<u32>)> = free(&node);
        let expect = [
            ("1g.10gb", 3),
            ("1g.10gb+me", 1),
            ("1g.20gb", 1), // only at 2: 0 is taken, 4 and 6 are the 3g's
            ("2g.20gb", 1), // at 2
            ("3g.40gb", 0), // 0 overlaps the 1g; the other 3g is at 4
            ("4g.40gb", 0),
            ("7g.80gb", 0),
        ];
        let expect: Vec<(String, Option<u32>)> =
            expect.iter().map(|&(n, f)| (n.to_owned(), Some(f))).collect();
        assert_eq!(now, expect);
        // Seven 1g.10gb: the count is reached, every slot a profile starts on is taken and
        // no compute slice is left.
        node.gpus[0].instances =
            (0..7).map(|s| instance(model, "1g.10gb", s, 7 + u32::from(s))).collect();
        assert!(free(&node).iter().all(|(_, f)| *f == Some(0)), "{:?}", free(&node));
    }

    #[test]
    fn free_counts_keep_to_the_engines_the_gpu_has() {
        let mut node = node("rtx-pro-6000-bse:1");
        let model = node.gpus[0].model.unwrap();
        node.gpus[0].mig_enabled = true;
        node.gpus[0].instances = vec![instance(model, "1g.24gb", 0, 3)];
        let doc = mig_profiles(&node, "0").unwrap();
        let free = |name: &str| {
            doc.gpus[0].profiles.iter().find(|p| p.name == name).unwrap().instances_free
        };
        // A 1g.24gb holds a decoder: nothing with every media engine fits beside it.
        assert_eq!(free("1g.24gb+me.all"), Some(0));
        assert_eq!(free("1g.24gb-me"), Some(3));
        assert_eq!(free("1g.24gb"), Some(3));
    }

    #[test]
    fn a_driver_table_that_differs_is_listed_with_its_differences() {
        let mut node = node("h100-80gb:1");
        let catalog_model = node.gpus[0].model.unwrap();
        let mut driver = catalog_model.clone();
        driver.source = "read from the driver (590.1) through NVML".into();
        driver.mig_profiles[0].sms = 14;
        node.gpus[0].model = Some(catalog::intern(driver));
        let doc = mig_profiles(&node, "0").unwrap();
        let gpu = &doc.gpus[0];
        assert!(gpu.from_driver);
        assert_eq!(gpu.source, "read from the driver (590.1) through NVML");
        assert_eq!(profile(gpu, "1g.10gb").sms, 14, "the driver's figure");
        assert_eq!(
            gpu.catalog.as_ref().unwrap().differences,
            ["h100-80gb 1g.10gb (enum 0): SMs: NVML 14, catalog 16"]
        );
    }

    #[test]
    fn the_a30s_four_slots() {
        let doc = mig_profiles(&node("a30:1"), "0").unwrap();
        let gpu = &doc.gpus[0];
        assert_eq!((gpu.memory_slots, gpu.compute_slices), (4, 4));
        let one = gpu.profiles.iter().find(|p| p.accepts.iter().any(|a| a == "1g")).unwrap();
        assert_eq!(one.name, "1g.6gb");
        for p in &gpu.profiles {
            assert!(p.accepts.first() == Some(&p.name), "{p:?}");
        }
    }

    #[test]
    fn keys_are_read_by_the_profile_parser() {
        assert_eq!(mig_key("1g"), Some(MigKey::Slices(1)));
        assert_eq!(mig_key("1g.24gb+me.all"), Some(MigKey::Name("1g.24gb+me.all".into())));
        assert_eq!(mig_key("1g.10gb.x"), None);
        assert_eq!(mig_key("a\"b"), None);
        assert_eq!(mig_key(""), None);
    }
}
