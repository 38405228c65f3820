//! `gpushare-agent --check-catalog`: the MIG profile tables NVML reports, compared with the
//! catalog's, read-only. This is how the catalog's rows were checked against a real H100.

use super::NvmlBackend;
use crate::catalog::{self, Engines, GpuModel};
use crate::gpu::{GpuBackend, GpuError};

/// Compares every GPU's MIG profile table, as NVML reports it, with the catalog's, handing
/// `say` one line per GPU and one per difference as it goes. Returns whether every table
/// agrees; an NVML failure stops the comparison, after the lines said so far.
pub fn check(nvml: &NvmlBackend, mut say: impl FnMut(String)) -> Result<bool, GpuError> {
    let mut agrees = true;
    for gpu in &nvml.observe()? {
        // The catalog's model, not the GPU's: that one is built from the driver's table.
        let catalog_model = catalog::model_by_pci_id(gpu.pci_device_id)
            .or_else(|| catalog::model_by_nvml_name(&gpu.name));
        let Some(model) = catalog_model else {
            say(format!(
                "{}: not in the catalog (PCI id {:#010X})",
                gpu.label(),
                gpu.pci_device_id
            ));
            agrees = false;
            continue;
        };
        let table = nvml.profile_table(gpu.index)?;
        let differences = compare_with_catalog(&table, model);
        say(format!(
            "{}: {} MIG profiles from NVML, {} differences from the catalog ({})",
            gpu.label(),
            table.len(),
            differences.len(),
            model.key
        ));
        for d in &differences {
            say(format!("  {d}"));
        }
        agrees &= differences.is_empty();
    }
    Ok(agrees)
}

/// What NVML answers about every GPU, read-only, as one JSON document: what the agent
/// observes, the profile table with placements, the answer for each profile enum index
/// up to 32, persistence mode and the device node. `gpushare-agent --dump-nvml` prints it,
/// on a real host and on the simulated driver, so the two can be compared field by field
/// (tests/device/compare-nvml.py).
pub fn dump(nvml: &NvmlBackend) -> Result<serde_json::Value, GpuError> {
    let mut gpus = Vec::new();
    for gpu in &nvml.observe()? {
        let table = nvml.profile_table(gpu.index).ok();
        let answers: Vec<serde_json::Value> = nvml
            .profile_enum_answers(gpu.index, 32)?
            .into_iter()
            .map(|(e, answer)| serde_json::json!({"enum": e, "answer": answer}))
            .collect();
        let (persistence, node) = nvml.persistence_and_node(gpu.index)?;
        gpus.push(serde_json::json!({
            "index": gpu.index,
            "uuid": gpu.uuid,
            "name": gpu.name,
            "pci_device_id": format!("{:#010X}", gpu.pci_device_id),
            "model": gpu.model.map(|m| &m.key),
            "memory_total_bytes": gpu.memory_total_bytes,
            "mig_enabled": gpu.mig_enabled,
            "mig_pending": gpu.mig_pending,
            "compute_mode": gpu.compute_mode,
            "persistence_mode": persistence,
            "device_node": node.ok(),
            "instances": gpu.instances.len(),
            "processes": gpu.processes.len(),
            "profiles": table,
            "profile_enum_answers": answers,
        }));
    }
    Ok(serde_json::json!({ "gpus": gpus }))
}

/// One GPU-instance profile as NVML reports it (`nvidia-smi mig -lgip` and `-lgipp`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NvmlProfileInfo {
    /// The `NVML_GPU_INSTANCE_PROFILE_*` enum index it was queried with.
    pub nvml_enum: u32,
    /// The profile id (`ProfileInfo.id`, nvidia-smi's profile id).
    pub id: u32,
    /// NVML's name without the `MIG ` prefix (`1g.10gb`); empty when the driver only
    /// answers the unversioned query, which has no name.
    pub name: String,
    /// Compute slices (`sliceCount`).
    pub slice_count: u32,
    /// Most instances of the profile on the GPU (`instanceCount`).
    pub instance_count: u32,
    /// Streaming multiprocessors of one instance.
    pub sms: u32,
    /// Memory of one instance (`memorySizeMB`, MiB).
    pub memory_mib: u64,
    /// Copy, decoder, encoder, JPEG and OFA engines of one instance.
    #[serde(serialize_with = "engines_json")]
    pub engines: Engines,
    /// Possible placements as `(start, size)` in memory slots, sorted.
    pub placements: Vec<(u32, u32)>,
}

/// Every difference between the profiles NVML reports and a catalog model's table, one
/// line each: id, slices, instance count, SMs, memory, name, placements, and profiles
/// missing on either side. Empty when they agree. Profiles are matched by enum index.
pub fn compare_with_catalog(info: &[NvmlProfileInfo], model: &GpuModel) -> Vec<String> {
    let mut out = Vec::new();
    for p in &model.mig_profiles {
        let label = format!("{} {} (enum {})", model.key, p.name, p.nvml_enum);
        let Some(n) = info.iter().find(|n| n.nvml_enum == p.nvml_enum) else {
            out.push(format!("{label}: in the catalog, not reported by NVML"));
            continue;
        };
        let mut differ = |what: &str, nvml: String, catalog: String| {
            if nvml != catalog {
                out.push(format!("{label}: {what}: NVML {nvml}, catalog {catalog}"));
            }
        };
        differ("id", n.id.to_string(), p.id.to_string());
        if !n.name.is_empty() {
            differ("name", n.name.clone(), p.name.to_owned());
        }
        differ("compute slices", n.slice_count.to_string(), p.compute_slices.to_string());
        differ("instance count", n.instance_count.to_string(), p.max_count.to_string());
        differ("SMs", n.sms.to_string(), p.sms.to_string());
        differ("memory MiB", n.memory_mib.to_string(), p.memory_mib.to_string());
        differ("engines (CE/DEC/ENC/JPEG/OFA)", engines_text(n.engines), engines_text(p.engines));
        let mut catalog_placements: Vec<(u32, u32)> = p
            .placements
            .iter()
            .map(|&start| (u32::from(start), u32::from(p.memory_slices)))
            .collect();
        catalog_placements.sort_unstable();
        let mut nvml_placements = n.placements.clone();
        nvml_placements.sort_unstable();
        differ(
            "placements",
            format_placements(&nvml_placements),
            format_placements(&catalog_placements),
        );
    }
    for n in info {
        if !model.mig_profiles.iter().any(|p| p.nvml_enum == n.nvml_enum) {
            let name = if n.name.is_empty() { "unnamed" } else { n.name.as_str() };
            out.push(format!(
                "{} {name} (enum {}): reported by NVML (id {}, {} SMs, {} MiB), not in the catalog",
                model.key, n.nvml_enum, n.id, n.sms, n.memory_mib
            ));
        }
    }
    out
}

/// The table NVML would report for `model` if the driver agreed with it exactly (profiles
/// in the model's order, placements ascending): how a model, a driver-read one included,
/// is compared with another by [`compare_with_catalog`].
pub(crate) fn table_of(model: &GpuModel) -> Vec<NvmlProfileInfo> {
    model
        .mig_profiles
        .iter()
        .map(|p| NvmlProfileInfo {
            nvml_enum: p.nvml_enum,
            id: p.id,
            name: p.name.clone(),
            slice_count: u32::from(p.compute_slices),
            instance_count: u32::from(p.max_count),
            sms: p.sms,
            memory_mib: p.memory_mib,
            engines: p.engines,
            placements: p
                .placements
                .iter()
                .map(|&s| (u32::from(s), u32::from(p.memory_slices)))
                .collect(),
        })
        .collect()
}

/// `1/1/0/1/0`: copy engines, decoders, encoders, JPEG decoders and OFAs, as
/// `nvidia-smi mig -lgip` groups them.
pub fn engines_text(e: Engines) -> String {
    format!("{}/{}/{}/{}/{}", e.copy, e.decoders, e.encoders, e.jpeg, e.ofa)
}

fn engines_json<S: serde::Serializer>(e: &Engines, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct;
    let mut out = s.serialize_struct("Engines", 5)?;
    out.serialize_field("copy", &e.copy)?;
    out.serialize_field("decoders", &e.decoders)?;
    out.serialize_field("encoders", &e.encoders)?;
    out.serialize_field("jpeg", &e.jpeg)?;
    out.serialize_field("ofa", &e.ofa)?;
    out.end()
}

/// `{0,2,4}:2` when every placement has one size, else `0:1,2:2`; `none` when empty.
fn format_placements(placements: &[(u32, u32)]) -> String {
    match placements.first() {
        None => "none".to_owned(),
        Some(&(_, size)) if placements.iter().all(|&(_, s)| s == size) => {
            let starts: Vec<String> =
                placements.iter().map(|(start, _)| start.to_string()).collect();
            format!("{{{}}}:{size}", starts.join(","))
        }
        Some(_) => placements
            .iter()
            .map(|(start, size)| format!("{start}:{size}"))
            .collect::<Vec<_>>()
            .join(","),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> &'static GpuModel {
        catalog::model_by_key("h100-80gb").expect("H100 in the catalog")
    }

    #[test]
    fn the_catalog_agrees_with_itself() {
        for model in catalog::models() {
            assert_eq!(
                compare_with_catalog(&table_of(model), model),
                Vec::<String>::new(),
                "{}",
                model.key
            );
            // In whatever order the driver lists the placements.
            let mut reversed = table_of(model);
            for p in &mut reversed {
                p.placements.reverse();
            }
            assert_eq!(compare_with_catalog(&reversed, model), Vec::<String>::new());
        }
    }

    #[test]
    fn the_h100_catalog_matches_what_nvml_reported() {
        // (enum, id, name, slices, max, SMs, memorySizeMB) from the read-only NVML run.
        let reported = [
            (0, 19, "1g.10gb", 1, 7, 16, 9984),
            (1, 14, "2g.20gb", 2, 3, 32, 20096),
            (2, 9, "3g.40gb", 3, 2, 60, 40448),
            (3, 5, "4g.40gb", 4, 1, 64, 40448),
            (4, 0, "7g.80gb", 7, 1, 132, 81152),
            (7, 20, "1g.10gb+me", 1, 1, 16, 9984),
            (9, 15, "1g.20gb", 1, 4, 26, 20096),
        ];
        let placements = |e: u32| -> Vec<(u32, u32)> {
            match e {
                0 | 7 => (0..7).map(|s| (s, 1)).collect(),
                9 => vec![(0, 2), (2, 2), (4, 2), (6, 2)],
                1 => vec![(0, 2), (2, 2), (4, 2)],
                2 => vec![(0, 4), (4, 4)],
                3 => vec![(0, 4)],
                _ => vec![(0, 8)],
            }
        };
        // CE/DEC/ENC/JPEG/OFA as the same run's ProfileInfo gave them.
        let engines = |e: u32| {
            let (copy, media, ofa) = match e {
                0 | 9 => (1, 1, 0),
                7 => (1, 1, 1),
                1 => (2, 2, 0),
                2 => (3, 3, 0),
                3 => (4, 4, 0),
                _ => (8, 7, 1),
            };
            Engines { copy, decoders: media, encoders: 0, jpeg: media, ofa }
        };
        let info: Vec<NvmlProfileInfo> = reported
            .iter()
            .map(|&(e, id, name, slices, max, sms, mib)| NvmlProfileInfo {
                nvml_enum: e,
                id,
                name: name.to_owned(),
                slice_count: slices,
                instance_count: max,
                sms,
                memory_mib: mib,
                engines: engines(e),
                placements: placements(e),
            })
            .collect();
        assert_eq!(compare_with_catalog(&info, h100()), Vec::<String>::new());
    }

    #[test]
    fn every_mismatch_gets_one_line() {
        let model = h100();
        let mut info = table_of(model);
        let one_g = info.iter_mut().find(|p| p.nvml_enum == 0).unwrap();
        one_g.sms = 14;
        assert_eq!(
            compare_with_catalog(&info, model),
            vec!["h100-80gb 1g.10gb (enum 0): SMs: NVML 14, catalog 16".to_owned()]
        );

        let mut info = table_of(model);
        let half = info.iter_mut().find(|p| p.nvml_enum == 2).unwrap();
        half.id = 10;
        half.memory_mib = 40000;
        half.placements = vec![(0, 4)];
        half.instance_count = 1;
        assert_eq!(
            compare_with_catalog(&info, model),
            vec![
                "h100-80gb 3g.40gb (enum 2): id: NVML 10, catalog 9".to_owned(),
                "h100-80gb 3g.40gb (enum 2): instance count: NVML 1, catalog 2".to_owned(),
                "h100-80gb 3g.40gb (enum 2): memory MiB: NVML 40000, catalog 40448".to_owned(),
                "h100-80gb 3g.40gb (enum 2): placements: NVML {0}:4, catalog {0,4}:4".to_owned(),
            ]
        );

        let mut info = table_of(model);
        info.retain(|p| p.nvml_enum != 9);
        info.push(NvmlProfileInfo {
            nvml_enum: 13,
            id: 21,
            name: "1g.10gb-me".to_owned(),
            slice_count: 1,
            instance_count: 7,
            sms: 16,
            memory_mib: 9984,
            engines: Engines { copy: 1, ..Engines::default() },
            placements: vec![(0, 1)],
        });
        info[0].name = "1g.10gb.x".to_owned();
        info[1].slice_count = 5;
        assert_eq!(
            compare_with_catalog(&info, model),
            vec![
                "h100-80gb 1g.10gb (enum 0): name: NVML 1g.10gb.x, catalog 1g.10gb".to_owned(),
                "h100-80gb 1g.10gb+me (enum 7): compute slices: NVML 5, catalog 1".to_owned(),
                "h100-80gb 1g.20gb (enum 9): in the catalog, not reported by NVML".to_owned(),
                "h100-80gb 1g.10gb-me (enum 13): reported by NVML (id 21, 16 SMs, 9984 MiB), not in the catalog"
                    .to_owned(),
            ]
        );
    }

    #[test]
    fn an_unnamed_profile_is_not_a_name_mismatch() {
        let model = h100();
        let mut info = table_of(model);
        for p in &mut info {
            p.name.clear();
        }
        assert!(compare_with_catalog(&info, model).is_empty());
    }

    #[test]
    fn placements_format_compactly() {
        assert_eq!(format_placements(&[]), "none");
        assert_eq!(format_placements(&[(0, 2), (2, 2), (4, 2)]), "{0,2,4}:2");
        assert_eq!(format_placements(&[(0, 1), (2, 2)]), "0:1,2:2");
    }
}
