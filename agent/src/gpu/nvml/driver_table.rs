//! The MIG table a GPU's driver reports, as the model the agent plans with.
//!
//! On a real host the driver knows its GPU's profiles, placements, memory, SM and engine
//! counts exactly, and drivers rename and resize profiles (GB200's `1g.24gb` became
//! `1g.23gb`; the H200's `1g.35gb` is 32.25 GiB on one driver, 32.5 on another). So each
//! MIG-capable GPU's model is built from NVML's answers: read once per GPU and driver
//! version, kept in [`DriverTables`], compared with the catalog (a difference is a
//! warning, never a refusal) and handed out through [`catalog::intern`] so that the rest
//! of the agent keeps its `&'static GpuModel`. A GPU the catalog has never heard of is
//! as usable as one it knows.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::catalog_check::{NvmlProfileInfo, compare_with_catalog};
use crate::catalog::{self, Architecture, GpuModel, MigProfile};

/// What identifies a GPU to its table: NVML's facts besides the profiles.
#[derive(Debug, Clone)]
pub(super) struct DeviceFacts<'a> {
    /// `GPU-…`.
    pub uuid: &'a str,
    /// NVML index, for messages.
    pub index: u32,
    /// `nvmlDeviceGetName`.
    pub name: &'a str,
    /// `pciDeviceId`.
    pub pci_device_id: u32,
    /// Total memory in bytes.
    pub memory_total_bytes: u64,
    /// `nvmlDeviceGetArchitecture`, when it answered.
    pub architecture: Option<Architecture>,
    /// `nvmlSystemGetDriverVersion`.
    pub driver_version: &'a str,
}

/// Driver-read models by GPU UUID, each with the driver version it was read under, so
/// that a driver update (the agent survives a module reload) reads the table again.
#[derive(Debug, Default)]
pub(super) struct DriverTables {
    by_gpu: Mutex<HashMap<String, (String, &'static GpuModel)>>,
    /// GPUs whose table could not be used, with the driver version and when: read again
    /// once [`RETRY_AFTER`] has passed (a transient NVML error must not pin the catalog's
    /// table until the next driver update), not at every observation.
    fell_back: Mutex<HashMap<String, (String, Instant)>>,
}

/// How long a GPU whose table could not be used runs on the catalog's before the driver is
/// asked again.
const RETRY_AFTER: Duration = Duration::from_secs(60);

impl DriverTables {
    /// The model of the GPU `facts` describes: the one read before under the same
    /// driver, else `read()`'s table made into a model (warning about every difference
    /// from the catalog). Falls back to the catalog's model, with a warning, when the
    /// table cannot be read or makes no usable model.
    pub(super) fn model(
        &self,
        facts: &DeviceFacts<'_>,
        read: impl FnOnce() -> Result<Vec<NvmlProfileInfo>, crate::gpu::GpuError>,
    ) -> Option<&'static GpuModel> {
        let catalog_model = catalog::model_by_pci_id(facts.pci_device_id)
            .or_else(|| catalog::model_by_nvml_name(facts.name));
        let mut known = self.by_gpu.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((driver, model)) = known.get(facts.uuid)
            && driver == facts.driver_version
        {
            return Some(model);
        }
        let mut fell_back = self.fell_back.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((driver, when)) = fell_back.get(facts.uuid)
            && driver == facts.driver_version
            && when.elapsed() < RETRY_AFTER
        {
            return catalog_model;
        }
        let label = format!("GPU {}", facts.index);
        let model = match read() {
            Ok(table) if !table.is_empty() => match model_from_driver(facts, catalog_model, &table)
            {
                Ok(model) => {
                    if let Some(cat) = catalog_model {
                        for d in compare_with_catalog(&table, cat) {
                            tracing::warn!(
                                "{label}: the driver's MIG table differs from the catalog: {d}; using the driver's"
                            );
                        }
                    } else {
                        tracing::info!(
                            "{label} ({}, PCI id {:#010X}) is not in gpushare's catalog: its MIG profiles come from the driver alone ({} profiles)",
                            facts.name,
                            facts.pci_device_id,
                            model.mig_profiles.len()
                        );
                    }
                    Some(catalog::intern(model))
                }
                Err(why) => {
                    tracing::warn!(
                        "{label}: the driver's MIG table makes no usable model ({why}); using the catalog's"
                    );
                    None
                }
            },
            Ok(_) => {
                tracing::warn!(
                    "{label}: the driver offers no MIG profile although MIG is supported; using the catalog's table"
                );
                None
            }
            Err(e) => {
                tracing::warn!(
                    "{label}: the driver's MIG table could not be read ({e}); using the catalog's"
                );
                None
            }
        };
        match model {
            Some(model) => {
                fell_back.remove(facts.uuid);
                known.insert(facts.uuid.to_owned(), (facts.driver_version.to_owned(), model));
                Some(model)
            }
            None => {
                let when = (facts.driver_version.to_owned(), Instant::now());
                fell_back.insert(facts.uuid.to_owned(), when);
                catalog_model
            }
        }
    }
}

/// Compute-instance sizes read from the driver, by GPU-instance profile id: `[compute
/// slices, how many fit]`, smallest first.
pub(super) type ComputeProfilesLearned = BTreeMap<u32, Vec<[u8; 2]>>;

/// `[slices, count]` of each compute-instance profile a GPU instance offers (one entry per
/// size: a size offered under two enums, such as a `_REV1` variant, counts its larger
/// count), smallest first.
pub(super) fn compute_sizes(
    offered: &[(u32, nvml_wrapper_sys::bindings::nvmlComputeInstanceProfileInfo_t)],
) -> Vec<[u8; 2]> {
    let mut sizes: BTreeMap<u8, u8> = BTreeMap::new();
    for (_, info) in offered {
        let (Ok(slices), Ok(count)) =
            (u8::try_from(info.sliceCount), u8::try_from(info.instanceCount))
        else {
            continue;
        };
        let most = sizes.entry(slices).or_insert(0);
        *most = (*most).max(count);
    }
    sizes.into_iter().filter(|&(s, n)| s > 0 && n > 0).map(|(s, n)| [s, n]).collect()
}

impl DriverTables {
    /// `model` with the compute-instance sizes `learned` for its profiles (read once: NVML
    /// answers them only for a GPU instance that exists), kept for the GPU `uuid` like the
    /// rest of its table. Where the driver's sizes differ from the MIG guide's rule the
    /// planner would otherwise use, a warning; the driver's are used.
    pub(super) fn learn_compute_profiles(
        &self,
        uuid: &str,
        index: u32,
        model: &'static GpuModel,
        learned: ComputeProfilesLearned,
    ) -> &'static GpuModel {
        let mut updated = model.clone();
        let mut changed = false;
        for (id, sizes) in learned {
            let Some(profile) = updated.mig_profiles.iter_mut().find(|p| p.id == id) else {
                continue;
            };
            if sizes.is_empty() || !profile.compute_profiles.is_empty() {
                continue;
            }
            if let Some(&[s, n]) =
                sizes.iter().find(|&&[s, n]| !catalog::compute_size_fits(profile, s, n))
            {
                tracing::warn!(
                    "GPU {index}: the driver offers {s}c ×{n} compute instances in a {} instance, which cannot fit in it; keeping the MIG guide's rule",
                    profile.name
                );
                continue;
            }
            let rule: Vec<[u8; 2]> = crate::profile::compute_instance_sizes(model, profile)
                .into_iter()
                .map(|(s, n)| [s, n])
                .collect();
            if rule != sizes {
                tracing::warn!(
                    "GPU {index}: the driver's compute-instance sizes in a {} instance ({}) differ from the MIG guide's rule ({}); using the driver's",
                    profile.name,
                    sizes_text(&sizes),
                    sizes_text(&rule)
                );
            }
            profile.compute_profiles = sizes;
            changed = true;
        }
        if !changed {
            return model;
        }
        let updated = catalog::intern(updated);
        let mut known = self.by_gpu.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, kept)) = known.get_mut(uuid)
            && std::ptr::eq(*kept, model)
        {
            *kept = updated;
        }
        updated
    }
}

/// `1c ×3, 2c ×1, 3c ×1`.
fn sizes_text(sizes: &[[u8; 2]]) -> String {
    sizes.iter().map(|[s, n]| format!("{s}c ×{n}")).collect::<Vec<_>>().join(", ")
}

/// The model a driver's MIG table describes. Identity (key, names, PCI ids) comes from
/// the catalog where it knows the GPU, else from NVML's name; every MIG figure comes from
/// the driver. Refused (with why) when the table breaks a rule no real table breaks.
pub(super) fn model_from_driver(
    facts: &DeviceFacts<'_>,
    catalog_model: Option<&GpuModel>,
    table: &[NvmlProfileInfo],
) -> Result<GpuModel, String> {
    let mut profiles = Vec::with_capacity(table.len());
    for info in table {
        let catalog_profile = catalog_model
            .and_then(|m| m.mig_profiles.iter().find(|p| p.nvml_enum == info.nvml_enum));
        let name = if !info.name.is_empty() {
            info.name.clone()
        } else if let Some(p) = catalog_profile {
            // The unversioned query has no name: the catalog's, for the same enum.
            p.name.clone()
        } else {
            fallback_name(info, facts.memory_total_bytes)
        };
        let Some(&(_, size)) = info.placements.first() else {
            // No placement (the query needs privileges some drivers enforce): unplaceable.
            tracing::debug!("GPU {}: MIG profile {name} has no placements; left out", facts.index);
            continue;
        };
        if info.placements.iter().any(|&(_, s)| s != size) {
            return Err(format!("{name} has placements of different sizes"));
        }
        let small = |what: &str, v: u32| {
            u8::try_from(v).map_err(|_| format!("{name}: {what} {v} is out of range"))
        };
        let placements = info
            .placements
            .iter()
            .map(|&(start, _)| small("placement start", start))
            .collect::<Result<Vec<u8>, _>>()?;
        profiles.push(MigProfile {
            id: info.id,
            nvml_enum: info.nvml_enum,
            compute_slices: small("slice count", info.slice_count)?,
            memory_slices: small("placement size", size)?,
            memory_mib: info.memory_mib,
            sms: info.sms,
            max_count: small("instance count", info.instance_count)?,
            placements,
            engines: info.engines,
            compute_profiles: Vec::new(),
            name,
        });
    }
    if profiles.is_empty() {
        return Err("no profile has a placement".into());
    }
    let memory_slots = profiles
        .iter()
        .flat_map(|p| p.placements.iter().map(move |&s| u32::from(s) + u32::from(p.memory_slices)))
        .max()
        .unwrap_or(0);
    let compute_slices = profiles.iter().map(|p| p.compute_slices).max().unwrap_or(0);
    let whole_gpu_sms = profiles.iter().map(|p| p.sms).max().unwrap_or(0);
    let display = facts.name.strip_prefix("NVIDIA ").unwrap_or(facts.name).to_owned();
    let source = format!("read from the driver ({}) through NVML", facts.driver_version);
    let model = GpuModel {
        key: catalog_model.map_or_else(|| key_of(facts.name), |m| m.key.clone()),
        source,
        aliases: catalog_model.map(|m| m.aliases.clone()).unwrap_or_default(),
        display_name: catalog_model.map_or(display, |m| m.display_name.clone()),
        nvml_name: facts.name.to_owned(),
        pci_device_ids: vec![facts.pci_device_id],
        architecture: facts
            .architecture
            .or(catalog_model.map(|m| m.architecture))
            .unwrap_or(Architecture::Other),
        compute_capability: catalog_model.and_then(|m| m.compute_capability),
        memory_mib: facts.memory_total_bytes >> 20,
        sms: catalog_model.map_or(whole_gpu_sms, |m| m.sms),
        memory_slots: u8::try_from(memory_slots).map_err(|_| "too many memory slots".to_owned())?,
        compute_slices,
        mig_profiles: profiles,
    };
    catalog::check_model(&model)?;
    Ok(model)
}

/// `1g.24gb` from a profile's enum and memory, for a driver that gives no name and a GPU
/// the catalog lacks: NVIDIA's naming rule ([`catalog::naming`]), so that mig-parted, GFD
/// and the device plugin call the profile what gpushare calls it. An enum that rule does
/// not know (a future one) is named from its slices and its memory rounded to GiB.
fn fallback_name(info: &NvmlProfileInfo, total_bytes: u64) -> String {
    catalog::naming::gpu_instance_name(info.nvml_enum, info.memory_mib, total_bytes).unwrap_or_else(
        || {
            let gb = (info.memory_mib as f64 / 1024.0).round() as u64;
            format!("{}g.{gb}gb{}", info.slice_count, catalog::naming::enum_suffix(info.nvml_enum))
        },
    )
}

/// A model key from NVML's name: `NVIDIA RTX PRO 5000 Blackwell` → `rtx-pro-5000-blackwell`.
fn key_of(nvml_name: &str) -> String {
    let name = nvml_name.strip_prefix("NVIDIA ").unwrap_or(nvml_name);
    let mut key = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            key.push(c.to_ascii_lowercase());
        } else if !key.is_empty() && !key.ends_with('-') {
            key.push('-');
        }
    }
    key.trim_end_matches('-').to_owned()
}

#[cfg(test)]
mod tests {
    use super::super::catalog_check::table_of;
    use super::*;

    fn facts<'a>(name: &'a str, pci: u32) -> DeviceFacts<'a> {
        DeviceFacts {
            uuid: "GPU-1",
            index: 0,
            name,
            pci_device_id: pci,
            memory_total_bytes: 81559 << 20,
            architecture: Some(Architecture::Hopper),
            driver_version: "580.159.04",
        }
    }

    #[test]
    fn a_driver_that_agrees_gives_the_catalog_model_back() {
        for known in catalog::models().iter().filter(|m| m.supports_mig()) {
            let pci = known.pci_device_ids[0];
            let mut f = facts(&known.nvml_name, pci);
            f.architecture = Some(known.architecture);
            f.memory_total_bytes = known.memory_mib << 20;
            let from_driver = model_from_driver(&f, Some(known), &table_of(known)).unwrap();
            assert_eq!(from_driver.mig_profiles, known.mig_profiles, "{}", known.key);
            assert_eq!(
                (from_driver.memory_slots, from_driver.compute_slices, &from_driver.key),
                (known.memory_slots, known.compute_slices, &known.key)
            );
        }
    }

    #[test]
    fn the_driver_wins_where_it_differs() {
        let h100 = catalog::model_by_key("h100").unwrap();
        let mut table = table_of(h100);
        table[0].name = "1g.9gb".into();
        table[0].memory_mib = 9000;
        let model =
            model_from_driver(&facts(&h100.nvml_name, 0x2330_10DE), Some(h100), &table).unwrap();
        assert_eq!(model.mig_profiles[0].name, "1g.9gb");
        assert_eq!(model.mig_profiles[0].memory_mib, 9000);
        assert_eq!(model.key, "h100-80gb", "still the catalog's GPU");
        assert!(!compare_with_catalog(&table, h100).is_empty());
    }

    #[test]
    fn a_gpu_no_catalog_knows_gets_a_model_from_its_name_and_table() {
        let h100 = catalog::model_by_key("h100").unwrap();
        let mut table = table_of(h100);
        for row in &mut table {
            row.name.clear(); // a driver answering only the unversioned query
        }
        let f = facts("NVIDIA RTX PRO 5000 Blackwell", 0x2BB4_10DE);
        let model = model_from_driver(&f, None, &table).unwrap();
        assert_eq!(model.key, "rtx-pro-5000-blackwell");
        assert_eq!(model.display_name, "RTX PRO 5000 Blackwell");
        assert_eq!(model.memory_slots, 8);
        assert_eq!(model.compute_slices, 7);
        let names: Vec<&str> = model.mig_profiles.iter().map(|p| p.name.as_str()).collect();
        assert!(names.contains(&"1g.10gb") && names.contains(&"1g.10gb+me"), "{names:?}");
        // NVIDIA's naming rule, not the GiB rounded (81152 MiB would be `7g.79gb`): with
        // the H100's table and total, every name is the one the H100's driver gives.
        let h100_names: Vec<&str> = h100.mig_profiles.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, h100_names);
        assert_eq!(model.profile_by_compute_slices(1).unwrap().name, "1g.10gb");
    }

    #[test]
    fn a_table_that_breaks_the_rules_is_not_used() {
        let h100 = catalog::model_by_key("h100").unwrap();
        let mut table = table_of(h100);
        table[1].id = table[0].id;
        let f = facts(&h100.nvml_name, 0x2330_10DE);
        assert!(model_from_driver(&f, Some(h100), &table).unwrap_err().contains("two profiles"));
        let mut mixed = table_of(h100);
        mixed[2].placements.push((1, 1));
        assert!(model_from_driver(&f, Some(h100), &mixed).unwrap_err().contains("different sizes"));
    }

    #[test]
    fn compute_instance_sizes_the_driver_reports_are_kept_and_used() {
        let tables = DriverTables::default();
        let h100 = catalog::model_by_key("h100").unwrap();
        let f = facts(&h100.nvml_name, 0x2330_10DE);
        let model = tables.model(&f, || Ok(table_of(h100))).unwrap();
        let three = model.profile_by_name("3g.40gb").unwrap();
        assert!(three.compute_profiles.is_empty());
        // The driver offers 1c ×3 and 3c ×1 in a 3g (unlike the rule's 2c ×1 besides).
        let learned = ComputeProfilesLearned::from([(three.id, vec![[1, 3], [3, 1]])]);
        let updated = tables.learn_compute_profiles(f.uuid, 0, model, learned);
        let three = updated.profile_by_name("3g.40gb").unwrap();
        assert_eq!(three.compute_profiles, [[1, 3], [3, 1]]);
        assert_eq!(crate::profile::compute_instance_sizes(updated, three), [(1, 3), (3, 1)]);
        // Sizes that cannot fit in the instance are not taken (the rule stays).
        let bad = ComputeProfilesLearned::from([(
            model.profile_by_name("2g.20gb").unwrap().id,
            vec![[2, 2]],
        )]);
        let same = tables.learn_compute_profiles(f.uuid, 0, updated, bad);
        assert!(std::ptr::eq(same, updated));
        // Kept: the next observation's model has them without asking again.
        let again = tables.model(&f, || panic!("read again"));
        assert!(std::ptr::eq(again.unwrap(), updated));
        // Nothing new: the same model back.
        assert!(std::ptr::eq(
            tables.learn_compute_profiles(f.uuid, 0, updated, ComputeProfilesLearned::new()),
            updated
        ));
    }

    #[test]
    fn tables_are_read_once_per_driver_version() {
        let tables = DriverTables::default();
        let h100 = catalog::model_by_key("h100").unwrap();
        let mut reads = 0;
        let mut f = facts(&h100.nvml_name, 0x2330_10DE);
        for _ in 0..3 {
            tables.model(&f, || {
                reads += 1;
                Ok(table_of(h100))
            });
        }
        assert_eq!(reads, 1);
        f.driver_version = "590.1";
        let model = tables.model(&f, || {
            reads += 1;
            Ok(table_of(h100))
        });
        assert_eq!(reads, 2);
        assert_eq!(model.unwrap().mig_profiles, h100.mig_profiles);
        // An unreadable table falls back to the catalog's, and is not read again at once.
        f.uuid = "GPU-2";
        let model = tables.model(&f, || {
            Err(crate::gpu::GpuError::new(
                "profile_table",
                Some(0),
                crate::gpu::ErrorCode::NoPermission,
            ))
        });
        assert!(std::ptr::eq(model.unwrap(), h100));
        let model = tables.model(&f, || panic!("asked again at once"));
        assert!(std::ptr::eq(model.unwrap(), h100));
        // After a while (or under another driver) it is asked again, and then kept.
        f.driver_version = "590.2";
        let model = tables.model(&f, || Ok(table_of(h100))).unwrap();
        assert_eq!(model.source, "read from the driver (590.2) through NVML");
    }
}
