//! GPU models and their MIG profile tables, and the `--simulate` node spec. A crate of its
//! own because the agent and the simulated driver (`sim/nvml`) read the same tables.
//!
//! Data, not code: one TOML file per model under `catalog/models/`, each naming where its
//! figures come from (`source`), embedded at build time (`build.rs` lists the folder).
//! Placements are start slots in memory-slot units: an instance of placement size `s` at
//! start `p` occupies memory slots `p..p+s`. Two instances on one GPU never share a slot.
//!
//! On a real GPU the driver's own table is the truth (the agent reads it through NVML and
//! builds a model with [`intern`]); this catalog serves simulation, planning against a
//! model without a GPU, and a cross-check of what the driver says.
//!
//! `catalog/models/simulator-only/` holds models the simulated driver can play but the
//! agent's catalog does not know ([`models`] and the lookups skip them): a MIG GPU no
//! catalog has heard of, and drivers whose tables differ from the catalog's.

pub mod naming;

use std::fmt;
use std::sync::{Mutex, OnceLock};

use serde::{Deserialize, Deserializer};

/// NVIDIA architecture families, as far as they change how MIG behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Architecture {
    /// A MIG mode change may stay pending until the GPU is reset.
    Ampere,
    /// A MIG mode change takes effect at once.
    Hopper,
    /// A MIG mode change takes effect at once; MIG also on workstation cards.
    Blackwell,
    /// Workstation and inference cards without MIG.
    AdaLovelace,
    /// An architecture the catalog does not tell apart (a driver-read model's, from an
    /// NVML value we do not list).
    Other,
}

impl Architecture {
    /// NVML's `nvmlDeviceArchitecture_t` value (`NVML_DEVICE_ARCH_*`).
    pub fn nvml_value(self) -> u32 {
        match self {
            Architecture::Ampere => 7,
            Architecture::AdaLovelace => 8,
            Architecture::Hopper => 9,
            Architecture::Blackwell => 10,
            Architecture::Other => 0xFFFF_FFFF,
        }
    }

    /// The architecture of an `nvmlDeviceArchitecture_t` value.
    pub fn from_nvml(value: u32) -> Architecture {
        match value {
            7 => Architecture::Ampere,
            8 => Architecture::AdaLovelace,
            9 => Architecture::Hopper,
            10 => Architecture::Blackwell,
            _ => Architecture::Other,
        }
    }
}

/// One MIG GPU-instance profile of one GPU model.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigProfile {
    /// nvidia-smi's name, e.g. `1g.5gb`, `1g.10gb+me`, `1g.24gb+gfx` or `1g.24gb-me`.
    pub name: String,
    /// nvidia-smi's profile id (`nvidia-smi mig -lgip`), also `ProfileInfo.id` in NVML.
    pub id: u32,
    /// NVML's `NVML_GPU_INSTANCE_PROFILE_*` enum value, which `nvmlDeviceGetGpuInstanceProfileInfo` takes.
    pub nvml_enum: u32,
    /// Compute slices (the `Ng` of the name).
    pub compute_slices: u8,
    /// Memory slots one instance takes, i.e. the placement size.
    pub memory_slices: u8,
    /// Memory of one instance in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors of one instance.
    pub sms: u32,
    /// Most instances of this profile on one GPU.
    pub max_count: u8,
    /// Allowed start slots.
    pub placements: Vec<u8>,
    /// The engines an instance gets, as NVML's `ProfileInfo` counts them.
    pub engines: Engines,
    /// The compute-instance sizes an instance of this profile offers, as `[compute
    /// slices, how many fit]`, smallest first, where a driver reported them (NVML answers
    /// only for a GPU instance that exists); empty where none did, and the MIG guide's
    /// rule applies (the agent's `compute_instance_sizes`).
    #[serde(default)]
    pub compute_profiles: Vec<[u8; 2]>,
}

impl MigProfile {
    /// The variant suffix of the name: `""`, `+me`, `+me.all`, `-me` or `+gfx`.
    pub fn variant(&self) -> &str {
        variant_of(&self.name)
    }

    /// Whether this is the plain profile of its size (no `+me`, `-me`, `+gfx`, …): what a
    /// slice count such as `1g` stands for.
    pub fn is_plain(&self) -> bool {
        self.variant().is_empty()
    }
}

/// The variant suffix of a profile name (`1g.24gb+me.all` → `+me.all`).
pub fn variant_of(name: &str) -> &str {
    name.find(['+', '-']).map_or("", |at| &name[at..])
}

/// The copy and media engines of one MIG instance (`nvidia-smi mig -lgip`'s CE, DEC,
/// ENC, JPEG and OFA columns; NVML's `copyEngineCount` … `ofaCount`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Engines {
    /// Copy engines.
    pub copy: u8,
    /// Video decoders (NVDEC).
    pub decoders: u8,
    /// Video encoders (NVENC).
    pub encoders: u8,
    /// JPEG decoders (NVJPG).
    pub jpeg: u8,
    /// Optical flow accelerators.
    pub ofa: u8,
}

/// A GPU model the agent knows.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuModel {
    /// Short key used on the command line and in profiles, e.g. `a100-40gb`.
    pub key: String,
    /// Where the figures come from (a listing, a document, a read-only NVML run); for a
    /// model read from a driver, which driver.
    pub source: String,
    /// Other keys accepted for this model, e.g. `a30` for `a30-24gb`.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Display name in status output, e.g. `A100-SXM4-40GB`.
    pub display_name: String,
    /// The marketing name NVML reports (`nvmlDeviceGetName`), used by the simulator.
    pub nvml_name: String,
    /// PCI device ids in mig-parted's `device-filter` notation (`0x20B010DE`).
    #[serde(deserialize_with = "pci_ids")]
    pub pci_device_ids: Vec<u32>,
    /// Architecture family.
    pub architecture: Architecture,
    /// CUDA compute capability (`[major, minor]`), where the architecture's usual one is
    /// not this chip's (Blackwell: 10.0 for B200, 12.0 for RTX PRO 6000).
    #[serde(default)]
    pub compute_capability: Option<[u32; 2]>,
    /// Total device memory in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors of the whole GPU.
    pub sms: u32,
    /// Memory slots a MIG layout is placed on (8, or 4 on the A30); 0 without MIG.
    pub memory_slots: u8,
    /// Compute slices of the whole GPU (7, or 4 on the A30); 0 without MIG.
    pub compute_slices: u8,
    /// The MIG profiles; empty for a GPU without MIG.
    #[serde(default, rename = "mig_profile")]
    pub mig_profiles: Vec<MigProfile>,
}

fn pci_ids<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
    let texts = Vec::<String>::deserialize(d)?;
    texts
        .iter()
        .map(|t| {
            t.strip_prefix("0x").and_then(|hex| u32::from_str_radix(hex, 16).ok()).ok_or_else(
                || serde::de::Error::custom(format!("bad PCI id {t:?}: write 0x20B010DE")),
            )
        })
        .collect()
}

impl GpuModel {
    /// Whether the model supports MIG at all.
    pub fn supports_mig(&self) -> bool {
        !self.mig_profiles.is_empty()
    }

    /// Whether a MIG mode change can stay pending until a GPU reset.
    pub fn mode_change_may_need_reset(&self) -> bool {
        self.architecture == Architecture::Ampere
    }

    /// The profile with exactly this name (`3g.20gb`, `1g.5gb+me`).
    pub fn profile_by_name(&self, name: &str) -> Option<&MigProfile> {
        self.mig_profiles.iter().find(|p| p.name == name)
    }

    /// The profile with this nvidia-smi/NVML profile id.
    pub fn profile_by_id(&self, id: u32) -> Option<&MigProfile> {
        self.mig_profiles.iter().find(|p| p.id == id)
    }

    /// The profile a slice count (`3g`) stands for: the smallest-memory plain profile
    /// with that many compute slices (`1g` is `1g.5gb`, not `1g.10gb` or `1g.5gb+me`, on
    /// an A100-40GB).
    pub fn profile_by_compute_slices(&self, slices: u8) -> Option<&MigProfile> {
        self.mig_profiles
            .iter()
            .filter(|p| p.compute_slices == slices && p.is_plain())
            .min_by_key(|p| p.memory_mib)
    }

    /// Whether a PCI device id belongs to this model.
    pub fn matches_pci_id(&self, pci_device_id: u32) -> bool {
        self.pci_device_ids.contains(&pci_device_id)
    }

    /// Whether `key` names this model (its key or an alias, any case).
    pub fn is_named(&self, key: &str) -> bool {
        self.key.eq_ignore_ascii_case(key)
            || self.aliases.iter().any(|a| a.eq_ignore_ascii_case(key))
    }

    /// The CUDA compute capability: the model's own, else its architecture's usual one.
    pub fn cuda_capability(&self) -> [u32; 2] {
        self.compute_capability.unwrap_or(match self.architecture {
            Architecture::Ampere => [8, 0],
            Architecture::AdaLovelace => [8, 9],
            Architecture::Hopper => [9, 0],
            Architecture::Blackwell => [10, 0],
            Architecture::Other => [0, 0],
        })
    }
}

impl fmt::Display for GpuModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display_name)
    }
}

/// The embedded model files, `(path under catalog/models, text)`, as `build.rs` found them.
static FILES: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/model_files.rs"));

struct Loaded {
    /// Catalog models first, then simulator-only ones.
    all: Vec<GpuModel>,
    catalog: usize,
}

fn loaded() -> &'static Loaded {
    static LOADED: OnceLock<Loaded> = OnceLock::new();
    LOADED.get_or_init(|| {
        let parse = |(path, text): &(&str, &str)| {
            parse_model_file(text).unwrap_or_else(|e| panic!("catalog/models/{path}: {e}"))
        };
        let (catalog, simulator): (Vec<_>, Vec<_>) =
            FILES.iter().partition(|(path, _)| !path.starts_with("simulator-only/"));
        let mut all: Vec<GpuModel> = catalog.iter().map(parse).collect();
        let catalog = all.len();
        all.extend(simulator.iter().map(parse));
        Loaded { all, catalog }
    })
}

/// Parses and checks one model file.
pub fn parse_model_file(text: &str) -> Result<GpuModel, String> {
    let model: GpuModel = toml::from_str(text).map_err(|e| e.to_string())?;
    check_model(&model)?;
    Ok(model)
}

/// The rules every model, from a file or from a driver, keeps: placements inside the
/// memory slots, unique ids, enums and names, counts no larger than the placements allow.
pub fn check_model(model: &GpuModel) -> Result<(), String> {
    let key = &model.key;
    let mut seen = std::collections::HashSet::new();
    for p in &model.mig_profiles {
        let name = &p.name;
        for &start in &p.placements {
            if u32::from(start) + u32::from(p.memory_slices) > u32::from(model.memory_slots) {
                return Err(format!(
                    "{key} {name}: placement at {start} runs past the {} memory slots",
                    model.memory_slots
                ));
            }
        }
        if p.compute_slices > model.compute_slices {
            return Err(format!("{key} {name}: more compute slices than the GPU has"));
        }
        if usize::from(p.max_count) > p.placements.len() {
            return Err(format!("{key} {name}: max_count above the number of placements"));
        }
        if p.memory_slices == 0 || p.compute_slices == 0 {
            return Err(format!("{key} {name}: zero memory or compute slices"));
        }
        if let Some(bad) = p.compute_profiles.iter().find(|&&[s, n]| !compute_size_fits(p, s, n)) {
            return Err(format!(
                "{key} {name}: {}c ×{} compute instances do not fit in it",
                bad[0], bad[1]
            ));
        }
        for (what, value) in
            [("id", p.id.to_string()), ("enum", p.nvml_enum.to_string()), ("name", p.name.clone())]
        {
            if !seen.insert((what, value.clone())) {
                return Err(format!("{key}: two profiles with {what} {value}"));
            }
        }
    }
    Ok(())
}

/// Whether `count` compute instances of `slices` can be in one instance of `profile`: none
/// empty, none larger than it, and no more slices in all than it has.
pub fn compute_size_fits(profile: &MigProfile, slices: u8, count: u8) -> bool {
    slices > 0
        && count > 0
        && slices <= profile.compute_slices
        && u32::from(slices) * u32::from(count) <= u32::from(profile.compute_slices)
}

/// All known models: the catalog the agent plans with.
pub fn models() -> &'static [GpuModel] {
    let loaded = loaded();
    &loaded.all[..loaded.catalog]
}

/// Every model the simulated driver can play: the catalog's, then the simulator-only ones.
pub fn simulated_models() -> &'static [GpuModel] {
    &loaded().all
}

/// The model with this key or alias.
pub fn model_by_key(key: &str) -> Option<&'static GpuModel> {
    models().iter().find(|m| m.is_named(key))
}

/// The catalog or simulator-only model with this key or alias.
pub fn simulated_model_by_key(key: &str) -> Option<&'static GpuModel> {
    simulated_models().iter().find(|m| m.is_named(key))
}

/// The model with this PCI device id (as NVML's `pciDeviceId`, e.g. `0x233010DE`).
pub fn model_by_pci_id(pci_device_id: u32) -> Option<&'static GpuModel> {
    models().iter().find(|m| m.matches_pci_id(pci_device_id))
}

/// The model whose NVML name matches, for GPUs whose PCI id the catalog lacks.
pub fn model_by_nvml_name(name: &str) -> Option<&'static GpuModel> {
    models().iter().find(|m| m.nvml_name == name)
}

/// A model that lives as long as the process, for one built at run time (the table a
/// driver reported). Equal models share one allocation, so reading the same driver's
/// table again allocates nothing; a new allocation happens only for a table not seen
/// before (a new GPU model or a driver update), which keeps the leak bounded by what the
/// host's drivers can report.
pub fn intern(model: GpuModel) -> &'static GpuModel {
    static SEEN: Mutex<Vec<&'static GpuModel>> = Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(known) = seen.iter().find(|m| ***m == model) {
        return known;
    }
    let leaked: &'static GpuModel = Box::leak(Box::new(model));
    seen.push(leaked);
    leaked
}

/// Parses `MODEL[:N|xN],...` (`a100-40gb:8`, `h100-80gbx2,a30:2`) into one model per GPU.
/// Simulator-only models are accepted: this is the simulated node's spec.
pub fn parse_node_spec(spec: &str) -> Result<Vec<&'static GpuModel>, String> {
    let mut gpus = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, count) = split_count(part)
            .ok_or_else(|| format!("--simulate: bad GPU count in {part:?}: write MODEL:N"))?;
        let model = simulated_model_by_key(name).ok_or_else(|| {
            let keys: Vec<&str> = simulated_models().iter().map(|m| m.key.as_str()).collect();
            format!("--simulate: unknown GPU model {name:?}; known models: {}", keys.join(", "))
        })?;
        if count == 0 || count > 64 {
            return Err(format!("--simulate: {part:?}: the count must be from 1 to 64"));
        }
        gpus.extend(std::iter::repeat_n(model, count));
    }
    if gpus.is_empty() {
        return Err("--simulate: no GPUs given: write MODEL:N, e.g. a100-40gb:8".into());
    }
    if gpus.len() > 64 {
        return Err("--simulate: at most 64 GPUs".into());
    }
    Ok(gpus)
}

fn split_count(part: &str) -> Option<(&str, usize)> {
    if let Some((name, n)) = part.split_once(':') {
        return Some((name, n.parse().ok()?));
    }
    if let Some((name, n)) = part.rsplit_once('x')
        && simulated_model_by_key(name).is_some()
    {
        return Some((name, n.parse().ok()?));
    }
    Some((part, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        assert_eq!(parse_node_spec("a100-40gb:8").unwrap().len(), 8);
        let mixed = parse_node_spec("h100-80gbx4,a30:2").unwrap();
        assert_eq!(mixed.len(), 6);
        assert_eq!(mixed[5].key, "a30-24gb");
        assert_eq!(parse_node_spec("l40s").unwrap().len(), 1);
        assert!(parse_node_spec("v100:2").unwrap_err().contains("unknown GPU model \"v100\""));
        assert!(parse_node_spec("a100-40gb:0").is_err());
        assert!(parse_node_spec("").is_err());
    }

    #[test]
    fn every_model_file_parses_and_keeps_the_rules() {
        // Parsing checks each file (`check_model`); this forces every one, simulator-only too.
        assert!(simulated_models().len() > models().len() || simulated_models() == models());
        for model in simulated_models() {
            assert!(!model.source.trim().is_empty(), "{} names no source", model.key);
            for p in &model.mig_profiles {
                // Aligned to the placement's own size: the RTX PRO 6000's 6-slot 2g's start
                // at 0 and 6 (published), so not to a power of two.
                for &start in &p.placements {
                    assert_eq!(start % p.memory_slices, 0, "{} {} aligned", model.key, p.name);
                }
            }
        }
        let keys: Vec<&str> = simulated_models().iter().map(|m| m.key.as_str()).collect();
        let mut unique = keys.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), keys.len(), "model keys are unique: {keys:?}");
    }

    #[test]
    fn a_bad_model_file_is_refused_naming_the_profile() {
        let h100 = include_str!("../models/h100-80gb.toml");
        let at = h100.rfind("placements = [0]").unwrap();
        let past_the_end = format!("{}placements = [4]{}", &h100[..at], &h100[at + 16..]);
        let err = parse_model_file(&past_the_end).unwrap_err();
        assert!(
            err.contains("h100-80gb 7g.80gb: placement at 4 runs past the 8 memory slots"),
            "{err}"
        );
        let twice = h100.replacen("id = 14\n", "id = 19\n", 1);
        assert!(parse_model_file(&twice).unwrap_err().contains("two profiles with id 19"));
        let bad_pci = h100.replacen("\"0x233010DE\"", "\"233010DE\"", 1);
        assert!(parse_model_file(&bad_pci).unwrap_err().contains("bad PCI id"));
        let unknown = format!("{h100}\nmemory_gib = 80\n");
        assert!(parse_model_file(&unknown).is_err());
    }

    #[test]
    fn variants_are_read_off_the_name() {
        assert_eq!(variant_of("1g.24gb"), "");
        assert_eq!(variant_of("1g.24gb+me.all"), "+me.all");
        assert_eq!(variant_of("1g.24gb-me"), "-me");
        assert_eq!(variant_of("2g.48gb+gfx"), "+gfx");
    }

    #[test]
    fn interning_equal_models_shares_one_allocation() {
        let mut copy = model_by_key("h100").unwrap().clone();
        copy.source = "driver 580.159.04".into();
        let a = intern(copy.clone());
        let b = intern(copy.clone());
        assert!(std::ptr::eq(a, b));
        copy.mig_profiles[0].memory_mib += 1;
        assert!(!std::ptr::eq(a, intern(copy)));
    }

    #[test]
    fn h100_table_is_what_nvml_reported_on_the_real_gpu() {
        let h100 = model_by_key("h100-80gb").unwrap();
        // (enum, id, name, slices, max, SMs, memorySizeMB), from the read-only NVML run.
        let nvml = [
            (0, 19, "1g.10gb", 1, 7, 16, 9984),
            (1, 14, "2g.20gb", 2, 3, 32, 20096),
            (2, 9, "3g.40gb", 3, 2, 60, 40448),
            (3, 5, "4g.40gb", 4, 1, 64, 40448),
            (4, 0, "7g.80gb", 7, 1, 132, 81152),
            (7, 20, "1g.10gb+me", 1, 1, 16, 9984),
            (9, 15, "1g.20gb", 1, 4, 26, 20096),
        ];
        assert_eq!(h100.mig_profiles.len(), nvml.len());
        for (e, id, name, slices, max, sms, mib) in nvml {
            let p = h100.profile_by_name(name).unwrap();
            assert_eq!(
                (p.nvml_enum, p.id, p.compute_slices, p.max_count, p.sms, p.memory_mib),
                (e, id, slices, max, sms, mib),
                "{name}"
            );
        }
        assert!(h100.matches_pci_id(0x2330_10DE));
        assert!(!h100.mode_change_may_need_reset());
    }

    #[test]
    fn slice_counts_resolve_to_each_models_names() {
        let a100 = model_by_key("a100-40gb").unwrap();
        let h100 = model_by_key("h100").unwrap();
        let a30 = model_by_key("a30").unwrap();
        assert_eq!(a100.profile_by_compute_slices(1).unwrap().name, "1g.5gb");
        assert_eq!(a100.profile_by_compute_slices(3).unwrap().name, "3g.20gb");
        assert_eq!(h100.profile_by_compute_slices(1).unwrap().name, "1g.10gb");
        assert_eq!(h100.profile_by_compute_slices(2).unwrap().name, "2g.20gb");
        assert_eq!(a30.profile_by_compute_slices(2).unwrap().name, "2g.12gb");
        assert!(a30.profile_by_compute_slices(3).is_none());
        assert!(model_by_key("l40s").unwrap().profile_by_compute_slices(1).is_none());
    }

    #[test]
    fn a100_80gb_shares_ids_and_placements_with_a100_40gb() {
        let small = model_by_key("a100-40gb").unwrap();
        let big = model_by_key("a100-80gb").unwrap();
        for (a, b) in small.mig_profiles.iter().zip(&big.mig_profiles) {
            assert_eq!((a.id, &a.placements, a.sms), (b.id, &b.placements, b.sms));
        }
    }

    /// A `-lgip` row as published: (name, id, max, GiB as printed, SMs, CE/DEC/ENC/JPEG/OFA).
    type Row = (&'static str, u32, u8, f64, u32, [u8; 5]);

    /// Checks `rows` against `model`'s profiles; memory is the printed GiB times 1024,
    /// rounded.
    fn assert_rows(model: &GpuModel, rows: &[Row]) {
        for &(name, id, max, gib, sms, [copy, decoders, encoders, jpeg, ofa]) in rows {
            let p = model
                .profile_by_name(name)
                .unwrap_or_else(|| panic!("{} has no {name}", model.key));
            assert_eq!(
                (p.id, p.max_count, p.memory_mib, p.sms),
                (id, max, (gib * 1024.0).round() as u64, sms),
                "{} {name}",
                model.key
            );
            assert_eq!(
                p.engines,
                Engines { copy, decoders, encoders, jpeg, ofa },
                "{} {name}",
                model.key
            );
        }
    }

    /// `(name, max count)` of every profile, in file order.
    fn names_and_counts(model: &GpuModel) -> Vec<(&str, u8)> {
        model.mig_profiles.iter().map(|p| (p.name.as_str(), p.max_count)).collect()
    }

    #[test]
    fn keys_and_aliases_name_one_model_each() {
        let mut names: Vec<String> = simulated_models()
            .iter()
            .flat_map(|m| std::iter::once(&m.key).chain(&m.aliases))
            .map(|n| n.to_ascii_lowercase())
            .collect();
        let all = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all, "{names:?}");
        for model in simulated_models() {
            assert_eq!(simulated_model_by_key(&model.key).unwrap().key, model.key);
        }
    }

    #[test]
    fn every_profile_enum_is_one_nvml_names_for_its_variant() {
        // nvml.h: 1/2/3/4/7_SLICE 0-4, 1_SLICE_REV1 7 (+me), 2_SLICE_REV1 8, 1_SLICE_REV2
        // 9, 1/2/4_SLICE_GFX 10-12, 1/2_SLICE_NO_ME 13-14, 1/2_SLICE_ALL_ME 15-16.
        for model in simulated_models() {
            for p in &model.mig_profiles {
                let allowed: &[u32] = match (p.variant(), p.compute_slices) {
                    ("", 1) => &[0, 9],
                    ("", 2) => &[1],
                    ("", 3) => &[2],
                    ("", 4) => &[3],
                    ("", 7) => &[4],
                    ("+me", 1) => &[7],
                    ("+me", 2) => &[8],
                    ("+gfx", 1) => &[10],
                    ("+gfx", 2) => &[11],
                    ("+gfx", 4) => &[12],
                    ("-me", 1) => &[13],
                    ("-me", 2) => &[14],
                    ("+me.all", 1) => &[15],
                    ("+me.all", 2) => &[16],
                    _ => &[],
                };
                assert!(
                    allowed.contains(&p.nvml_enum),
                    "{} {}: {}",
                    model.key,
                    p.name,
                    p.nvml_enum
                );
            }
        }
    }

    #[test]
    fn simulator_only_models_stay_out_of_the_agents_catalog() {
        // The RTX PRO 5000 is in no catalog: no key, PCI id or name finds it.
        let pro5000 = simulated_model_by_key("rtx-pro-5000").unwrap();
        assert!(model_by_key("rtx-pro-5000").is_none());
        assert!(model_by_pci_id(pro5000.pci_device_ids[0]).is_none());
        assert!(model_by_nvml_name(&pro5000.nvml_name).is_none());
        assert!(simulated_models().iter().all(|m| m.key == pro5000.key
            || !m.pci_device_ids.iter().any(|id| pro5000.pci_device_ids.contains(id))));
        assert_eq!(parse_node_spec("rtx-pro-5000:2").unwrap()[1].key, "rtx-pro-5000");
        // The early GB200 looks like the production one to the catalog, whose names differ.
        let early = simulated_model_by_key("gb200-early").unwrap();
        assert!(model_by_key("gb200-early").is_none());
        let production = model_by_pci_id(early.pci_device_ids[0]).unwrap();
        assert_eq!(production.key, "gb200");
        assert_eq!(model_by_nvml_name(&early.nvml_name).unwrap().key, "gb200");
        assert!(production.profile_by_name("1g.24gb").is_none());
        assert!(early.profile_by_name("1g.23gb").is_none());
        assert_eq!(
            early.mig_profiles.iter().map(|p| p.id).collect::<Vec<_>>(),
            production.mig_profiles.iter().map(|p| p.id).collect::<Vec<_>>()
        );
        // Every other model, catalog or not, is found by its PCI id as itself.
        for model in models() {
            for &id in &model.pci_device_ids {
                assert_eq!(model_by_pci_id(id).unwrap().key, model.key);
            }
        }
    }

    #[test]
    fn b200_carries_the_published_rows() {
        let b200 = model_by_key("b200").unwrap();
        // I187 (Mar 2025): 20.50 GiB for the 1g rows (I166, Jan 2025, printed 22.00).
        assert_rows(
            b200,
            &[
                ("1g.23gb", 19, 7, 20.50, 18, [2, 1, 0, 1, 0]),
                ("1g.23gb+me", 20, 1, 20.50, 18, [2, 1, 0, 1, 1]),
                ("1g.45gb", 15, 4, 44.25, 30, [2, 1, 0, 1, 0]),
                ("2g.45gb", 14, 3, 44.25, 36, [4, 2, 0, 2, 0]),
            ],
        );
        let counts = names_and_counts(b200);
        assert_eq!(counts[4..], [("3g.90gb", 2), ("4g.90gb", 1), ("7g.180gb", 1)]);
        let ce: Vec<u8> = b200.mig_profiles[4..].iter().map(|p| p.engines.copy).collect();
        assert_eq!(ce, [6, 8, 16], "G1's copy engines");
        assert!(b200.matches_pci_id(0x2901_10DE));
        assert_eq!(
            (b200.nvml_name.as_str(), b200.memory_mib, b200.sms),
            ("NVIDIA B200", 183359, 148)
        );
        assert_eq!(b200.cuda_capability(), [10, 0]);
    }

    #[test]
    fn gb200_has_the_production_names() {
        let gb200 = model_by_key("gb200").unwrap();
        assert_rows(
            gb200,
            &[
                ("1g.23gb", 19, 7, 22.00, 18, [2, 1, 0, 1, 0]),
                ("1g.23gb+me", 20, 1, 22.00, 18, [2, 1, 0, 1, 1]),
                ("1g.47gb", 15, 4, 45.50, 32, [2, 1, 0, 1, 0]),
            ],
        );
        let two = gb200.profile_by_name("2g.47gb").unwrap();
        assert_eq!((two.id, two.max_count, two.sms, two.engines.decoders), (14, 3, 38, 2));
        assert_eq!(names_and_counts(gb200)[4..], [("3g.93gb", 2), ("4g.93gb", 1), ("7g.186gb", 1)]);
        assert!(gb200.matches_pci_id(0x2941_10DE));
        let early = simulated_model_by_key("gb200-early").unwrap();
        assert_rows(
            early,
            &[
                ("1g.24gb", 19, 7, 20.00, 18, [2, 1, 0, 1, 0]),
                ("1g.24gb+me", 20, 1, 20.00, 18, [2, 1, 0, 1, 1]),
                ("1g.47gb", 15, 4, 45.50, 32, [2, 1, 0, 1, 0]),
                ("2g.47gb", 14, 3, 45.50, 38, [4, 2, 0, 2, 0]),
            ],
        );
        let names: Vec<&str> = early.mig_profiles[4..].iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["3g.95gb", "4g.95gb", "7g.189gb"]);
    }

    #[test]
    fn b300_has_mig_parteds_names_and_counts() {
        let b300 = model_by_key("b300").unwrap();
        assert_eq!(
            names_and_counts(b300),
            [
                ("1g.34gb", 7),
                ("1g.34gb+me", 1),
                ("1g.67gb", 4),
                ("2g.67gb", 3),
                ("3g.135gb", 2),
                ("4g.135gb", 1),
                ("7g.269gb", 1)
            ]
        );
        assert!(b300.matches_pci_id(0x3182_10DE));
        assert_eq!(b300.cuda_capability(), [10, 3]);
        assert!(b300.source.contains("DERIVED"));
    }

    #[test]
    fn gh200_144gb_carries_the_published_rows() {
        let gh200 = model_by_key("gh200-144gb").unwrap();
        assert_rows(
            gh200,
            &[
                ("1g.18gb", 19, 7, 17.50, 16, [1, 1, 0, 1, 0]),
                ("1g.18gb+me", 20, 1, 17.50, 16, [1, 1, 0, 1, 1]),
                ("1g.36gb", 15, 4, 35.25, 26, [1, 1, 0, 1, 0]),
                ("2g.36gb", 14, 3, 35.25, 32, [2, 2, 0, 2, 0]),
            ],
        );
        assert_eq!(names_and_counts(gh200)[4..], [("3g.72gb", 2), ("4g.72gb", 1), ("7g.144gb", 1)]);
        assert!(gh200.matches_pci_id(0x2348_10DE));
    }

    #[test]
    fn h100_nvl_carries_the_published_rows_and_placements() {
        let nvl = model_by_key("h100-nvl").unwrap();
        assert_rows(
            nvl,
            &[
                ("1g.12gb", 19, 7, 10.75, 16, [1, 1, 0, 1, 0]),
                ("1g.12gb+me", 20, 1, 10.75, 16, [1, 1, 0, 1, 1]),
                ("1g.24gb", 15, 4, 21.62, 26, [1, 1, 0, 1, 0]),
            ],
        );
        assert_eq!(nvl.profile_by_name("3g.47gb").unwrap().memory_mib, 47493, "I101's 46.38");
        // CFX's -lgipp.
        let placements: Vec<(u32, Vec<u8>, u8)> = nvl
            .mig_profiles
            .iter()
            .map(|p| (p.id, p.placements.clone(), p.memory_slices))
            .collect();
        assert_eq!(
            placements,
            [
                (19, vec![0, 1, 2, 3, 4, 5, 6], 1),
                (20, vec![0, 1, 2, 3, 4, 5, 6], 1),
                (15, vec![0, 2, 4, 6], 2),
                (14, vec![0, 2, 4], 2),
                (9, vec![0, 4], 4),
                (5, vec![0], 4),
                (0, vec![0], 8)
            ]
        );
        let engines: Vec<[u8; 2]> =
            nvl.mig_profiles[3..].iter().map(|p| [p.engines.copy, p.engines.decoders]).collect();
        assert_eq!(engines, [[2, 2], [3, 3], [4, 4], [8, 7]], "G1");
        assert!(nvl.matches_pci_id(0x2321_10DE) && nvl.matches_pci_id(0x233A_10DE));
        assert_eq!((nvl.nvml_name.as_str(), nvl.memory_mib), ("NVIDIA H100 NVL", 95830));
    }

    #[test]
    fn h100_96gb_has_the_guides_table() {
        let h = model_by_key("gh200-96gb").unwrap();
        assert_eq!(h.key, "h100-96gb");
        assert_eq!(
            names_and_counts(h),
            [
                ("1g.12gb", 7),
                ("1g.12gb+me", 1),
                ("1g.24gb", 4),
                ("2g.24gb", 3),
                ("3g.48gb", 2),
                ("4g.48gb", 1),
                ("7g.96gb", 1)
            ]
        );
        // G1: CE and NVDEC/JPEG/OFA.
        let engines: Vec<[u8; 4]> = h
            .mig_profiles
            .iter()
            .map(|p| [p.engines.copy, p.engines.decoders, p.engines.jpeg, p.engines.ofa])
            .collect();
        assert_eq!(
            engines,
            [
                [1, 1, 1, 0],
                [1, 1, 1, 1],
                [1, 1, 1, 0],
                [2, 2, 2, 0],
                [3, 3, 3, 0],
                [4, 4, 4, 0],
                [8, 7, 7, 1]
            ]
        );
        // Memory: the guide's fractions (1/8, 1/4, 2/8, 4/8, 4/8, full) of 96 GiB.
        let mib: Vec<u64> = h.mig_profiles.iter().map(|p| p.memory_mib).collect();
        assert_eq!(mib, [12288, 12288, 24576, 24576, 49152, 49152, 98304]);
        for id in [0x2342_10DE, 0x233D_10DE, 0x20B6_10DE, 0x2329_10DE] {
            assert!(h.matches_pci_id(id));
        }
    }

    #[test]
    fn rtx_pro_6000_is_kubesimplifys_listing_in_full() {
        let rtx = model_by_key("rtx-pro-6000").unwrap();
        assert_eq!(rtx.key, "rtx-pro-6000-bse");
        assert_eq!(
            (rtx.memory_slots, rtx.compute_slices, rtx.sms, rtx.memory_mib),
            (12, 4, 188, 97887)
        );
        assert_eq!(rtx.cuda_capability(), [12, 0]);
        assert_eq!(rtx.nvml_name, "NVIDIA RTX PRO 6000 Blackwell Server Edition");
        assert!(rtx.matches_pci_id(0x2BB5_10DE));
        let rows: [Row; 11] = [
            ("1g.24gb", 14, 4, 23.62, 46, [1, 1, 1, 1, 0]),
            ("1g.24gb+me", 21, 1, 23.62, 46, [1, 1, 1, 1, 1]),
            ("1g.24gb+gfx", 47, 4, 23.62, 46, [1, 1, 1, 1, 0]),
            ("1g.24gb+me.all", 65, 1, 23.62, 46, [1, 4, 4, 4, 1]),
            ("1g.24gb-me", 67, 4, 23.62, 46, [1, 0, 0, 0, 0]),
            ("2g.48gb", 5, 2, 47.38, 94, [2, 2, 2, 2, 0]),
            ("2g.48gb+gfx", 35, 2, 47.38, 94, [2, 2, 2, 2, 0]),
            ("2g.48gb+me.all", 64, 1, 47.38, 94, [2, 4, 4, 4, 1]),
            ("2g.48gb-me", 66, 2, 47.38, 94, [2, 0, 0, 0, 0]),
            ("4g.96gb", 0, 1, 95.12, 188, [4, 4, 4, 4, 1]),
            ("4g.96gb+gfx", 32, 1, 95.12, 188, [4, 4, 4, 4, 1]),
        ];
        assert_rows(rtx, &rows);
        assert_eq!(rtx.mig_profiles.len(), rows.len());
        for p in &rtx.mig_profiles {
            let (starts, size): (&[u8], u8) = match p.compute_slices {
                1 => (&[0, 3, 6, 9], 3),
                2 => (&[0, 6], 6),
                _ => (&[0], 12),
            };
            assert_eq!((p.placements.as_slice(), p.memory_slices), (starts, size), "{}", p.name);
        }
        // The assumed enums, by nvml.h's names.
        let enums: Vec<(&str, u32)> =
            rtx.mig_profiles.iter().map(|p| (p.name.as_str(), p.nvml_enum)).collect();
        assert_eq!(
            enums,
            [
                ("1g.24gb", 0),
                ("1g.24gb+me", 7),
                ("1g.24gb+gfx", 10),
                ("1g.24gb+me.all", 15),
                ("1g.24gb-me", 13),
                ("2g.48gb", 1),
                ("2g.48gb+gfx", 11),
                ("2g.48gb+me.all", 16),
                ("2g.48gb-me", 14),
                ("4g.96gb", 3),
                ("4g.96gb+gfx", 12)
            ]
        );
        assert_eq!(rtx.profile_by_compute_slices(1).unwrap().name, "1g.24gb");
        assert!(rtx.profile_by_compute_slices(3).is_none());
    }

    #[test]
    fn rtx_pro_5000_has_the_newer_guides_table() {
        let pro = simulated_model_by_key("rtx-pro-5000").unwrap();
        assert_eq!(
            names_and_counts(pro),
            [
                ("1g.24gb", 2),
                ("1g.24gb+me", 1),
                ("1g.24gb+gfx", 2),
                ("1g.24gb+me.all", 1),
                ("1g.24gb-me", 2),
                ("2g.48gb", 1),
                ("2g.48gb+gfx", 1)
            ]
        );
        // G1: NVDEC/NVENC/JPEG/OFA, CE.
        let engines: Vec<[u8; 5]> = pro
            .mig_profiles
            .iter()
            .map(|p| {
                let e = p.engines;
                [e.decoders, e.encoders, e.jpeg, e.ofa, e.copy]
            })
            .collect();
        assert_eq!(
            engines,
            [
                [1, 1, 0, 0, 1],
                [1, 1, 1, 1, 1],
                [1, 1, 0, 0, 1],
                [3, 3, 1, 1, 1],
                [0, 0, 0, 0, 1],
                [3, 3, 1, 1, 4],
                [3, 3, 1, 1, 4]
            ]
        );
        assert!(pro.source.contains("PLACEHOLDER"));
        assert_eq!((pro.memory_slots, pro.compute_slices), (6, 2));
    }

    #[test]
    fn a30_has_the_2g_12gb_me_of_the_published_listing() {
        let a30 = model_by_key("a30").unwrap();
        assert_rows(a30, &[("2g.12gb+me", 6, 1, 11.69, 28, [2, 2, 0, 1, 1])]);
        let p = a30.profile_by_name("2g.12gb+me").unwrap();
        assert_eq!((p.nvml_enum, p.placements.as_slice(), p.memory_slices), (8, &[0, 2][..], 2));
        let ids: Vec<u32> = a30.mig_profiles.iter().map(|p| p.id).collect();
        assert_eq!(ids, [14, 21, 5, 6, 0], "-lgipp's order");
    }

    #[test]
    fn derived_memory_never_exceeds_the_gpu() {
        for model in simulated_models() {
            for p in &model.mig_profiles {
                assert!(p.memory_mib <= model.memory_mib, "{} {}", model.key, p.name);
                assert!(p.sms <= model.sms, "{} {}", model.key, p.name);
            }
        }
    }
}
