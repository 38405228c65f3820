//! GPU models and their MIG profile tables, and the `--simulate` node spec. A crate of its
//! own because the agent and the simulated driver (`sim/nvml`) read the same tables.
//!
//! Data, not code: every figure here comes from `shared/reference/mig-profiles.md`
//! (the H100-80GB rows were read off a real H100 through NVML). Placements are start
//! slots in memory-slice units: an instance of placement size `s` at start `p` occupies
//! memory slots `p..p+s`. Two instances on one GPU never share a memory slot.

use std::fmt;

/// NVIDIA architecture families, as far as they change how MIG behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// A MIG mode change may stay pending until the GPU is reset.
    Ampere,
    /// A MIG mode change takes effect at once.
    Hopper,
    /// Workstation and inference cards without MIG.
    AdaLovelace,
}

/// One MIG GPU-instance profile of one GPU model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigProfile {
    /// nvidia-smi's name, e.g. `1g.5gb` or `1g.10gb+me`.
    pub name: &'static str,
    /// nvidia-smi's profile id (`nvidia-smi mig -lgip`), also `ProfileInfo.id` in NVML.
    pub id: u32,
    /// NVML's `NVML_GPU_INSTANCE_PROFILE_*` enum value, which `nvmlDeviceGetGpuInstanceProfileInfo` takes.
    pub nvml_enum: u32,
    /// Compute slices (the `Ng` of the name).
    pub compute_slices: u8,
    /// Memory slices, i.e. the placement size.
    pub memory_slices: u8,
    /// Memory of one instance in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors of one instance.
    pub sms: u32,
    /// Most instances of this profile on one GPU.
    pub max_count: u8,
    /// Allowed start slots.
    pub placements: &'static [u8],
    /// Whether the profile carries the media extensions (`+me`).
    pub media_extensions: bool,
    /// The engines an instance gets, as NVML's `ProfileInfo` counts them.
    pub engines: Engines,
}

/// The copy and media engines of one MIG instance (`nvidia-smi mig -lgip`'s CE, DEC,
/// ENC, JPEG and OFA columns; NVML's `copyEngineCount` … `ofaCount`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

impl Engines {
    /// `copy` copy engines, `decoders` NVDECs, `jpeg` NVJPGs, `ofa` OFAs, no encoder (none
    /// of the MIG GPUs modelled has one in an instance).
    pub const fn new(copy: u8, decoders: u8, jpeg: u8, ofa: u8) -> Engines {
        Engines { copy, decoders, encoders: 0, jpeg, ofa }
    }
}

/// A GPU model the agent knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuModel {
    /// Short key used on the command line and in profiles, e.g. `a100-40gb`.
    pub key: &'static str,
    /// Other keys accepted for this model, e.g. `a30` for `a30-24gb`.
    pub aliases: &'static [&'static str],
    /// Display name in status output, e.g. `A100-SXM4-40GB`.
    pub display_name: &'static str,
    /// The marketing name NVML reports (`nvmlDeviceGetName`), used by the simulator.
    pub nvml_name: &'static str,
    /// PCI device ids in mig-parted's `device-filter` notation (`0x20B010DE`).
    pub pci_device_ids: &'static [u32],
    /// Architecture family.
    pub architecture: Architecture,
    /// Total device memory in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors of the whole GPU.
    pub sms: u32,
    /// Memory slots a MIG layout is placed on (8, or 4 on the A30); 0 without MIG.
    pub memory_slots: u8,
    /// Compute slices of the whole GPU (7, or 4 on the A30); 0 without MIG.
    pub compute_slices: u8,
    /// The MIG profiles; empty for a GPU without MIG.
    pub mig_profiles: &'static [MigProfile],
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
    pub fn profile_by_name(&self, name: &str) -> Option<&'static MigProfile> {
        self.mig_profiles.iter().find(|p| p.name == name)
    }

    /// The profile with this nvidia-smi/NVML profile id.
    pub fn profile_by_id(&self, id: u32) -> Option<&'static MigProfile> {
        self.mig_profiles.iter().find(|p| p.id == id)
    }

    /// The profile a slice count (`3g`) stands for: the smallest-memory profile with
    /// that many compute slices and without media extensions (`1g` is `1g.5gb`, not
    /// `1g.10gb`, on an A100-40GB).
    pub fn profile_by_compute_slices(&self, slices: u8) -> Option<&'static MigProfile> {
        self.mig_profiles
            .iter()
            .filter(|p| p.compute_slices == slices && !p.media_extensions)
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
}

impl fmt::Display for GpuModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.display_name)
    }
}

/// All known models.
pub fn models() -> &'static [GpuModel] {
    MODELS
}

/// The model with this key or alias.
pub fn model_by_key(key: &str) -> Option<&'static GpuModel> {
    MODELS.iter().find(|m| m.is_named(key))
}

/// The model with this PCI device id (as NVML's `pciDeviceId`, e.g. `0x233010DE`).
pub fn model_by_pci_id(pci_device_id: u32) -> Option<&'static GpuModel> {
    MODELS.iter().find(|m| m.matches_pci_id(pci_device_id))
}

/// The model whose NVML name matches, for GPUs whose PCI id the catalog lacks.
pub fn model_by_nvml_name(name: &str) -> Option<&'static GpuModel> {
    MODELS.iter().find(|m| m.nvml_name == name)
}

/// Parses `MODEL[:N|xN],...` (`a100-40gb:8`, `h100-80gbx2,a30:2`) into one model per GPU.
pub fn parse_node_spec(spec: &str) -> Result<Vec<&'static GpuModel>, String> {
    let mut gpus = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, count) = split_count(part)
            .ok_or_else(|| format!("--simulate: bad GPU count in {part:?}: write MODEL:N"))?;
        let model = model_by_key(name).ok_or_else(|| {
            let keys: Vec<&str> = models().iter().map(|m| m.key).collect();
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
        && model_by_key(name).is_some()
    {
        return Some((name, n.parse().ok()?));
    }
    Some((part, 1))
}

const ALL_SEVEN: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
const EVEN_FOUR: &[u8] = &[0, 2, 4, 6];
const EVEN_THREE: &[u8] = &[0, 2, 4];
const HALVES: &[u8] = &[0, 4];
const FIRST: &[u8] = &[0];

// NVML enum values (nvml.h): 1_SLICE=0, 2_SLICE=1, 3_SLICE=2, 4_SLICE=3, 7_SLICE=4,
// 1_SLICE_REV1 (+me)=7, 2_SLICE_REV1=8, 1_SLICE_REV2=9.
const E_1G: u32 = 0;
const E_2G: u32 = 1;
const E_3G: u32 = 2;
const E_4G: u32 = 3;
const E_7G: u32 = 4;
const E_1G_ME: u32 = 7;
const E_1G_2X: u32 = 9;

/// The seven-slice table shared by A100, H100 and H200; only names, memory and SMs differ.
#[allow(clippy::too_many_arguments)]
const fn seven_slice(
    names: [&'static str; 7],
    memory_mib: [u64; 7],
    sms: [u32; 7],
    engines: [Engines; 7],
) -> [MigProfile; 7] {
    [
        MigProfile {
            name: names[0],
            id: 19,
            nvml_enum: E_1G,
            compute_slices: 1,
            memory_slices: 1,
            memory_mib: memory_mib[0],
            sms: sms[0],
            max_count: 7,
            placements: ALL_SEVEN,
            media_extensions: false,
            engines: engines[0],
        },
        MigProfile {
            name: names[1],
            id: 20,
            nvml_enum: E_1G_ME,
            compute_slices: 1,
            memory_slices: 1,
            memory_mib: memory_mib[1],
            sms: sms[1],
            max_count: 1,
            placements: ALL_SEVEN,
            media_extensions: true,
            engines: engines[1],
        },
        MigProfile {
            name: names[2],
            id: 15,
            nvml_enum: E_1G_2X,
            compute_slices: 1,
            memory_slices: 2,
            memory_mib: memory_mib[2],
            sms: sms[2],
            max_count: 4,
            placements: EVEN_FOUR,
            media_extensions: false,
            engines: engines[2],
        },
        MigProfile {
            name: names[3],
            id: 14,
            nvml_enum: E_2G,
            compute_slices: 2,
            memory_slices: 2,
            memory_mib: memory_mib[3],
            sms: sms[3],
            max_count: 3,
            placements: EVEN_THREE,
            media_extensions: false,
            engines: engines[3],
        },
        MigProfile {
            name: names[4],
            id: 9,
            nvml_enum: E_3G,
            compute_slices: 3,
            memory_slices: 4,
            memory_mib: memory_mib[4],
            sms: sms[4],
            max_count: 2,
            placements: HALVES,
            media_extensions: false,
            engines: engines[4],
        },
        MigProfile {
            name: names[5],
            id: 5,
            nvml_enum: E_4G,
            compute_slices: 4,
            memory_slices: 4,
            memory_mib: memory_mib[5],
            sms: sms[5],
            max_count: 1,
            placements: FIRST,
            media_extensions: false,
            engines: engines[5],
        },
        MigProfile {
            name: names[6],
            id: 0,
            nvml_enum: E_7G,
            compute_slices: 7,
            memory_slices: 8,
            memory_mib: memory_mib[6],
            sms: sms[6],
            max_count: 1,
            placements: FIRST,
            media_extensions: false,
            engines: engines[6],
        },
    ]
}

/// An A100's instances' engines, 1g … 7g as [`seven_slice`] orders them: NVIDIA's MIG
/// user guide (supported profiles: NVDECs / JPEG / OFA, copy engines).
const AMPERE_ENGINES: [Engines; 7] = [
    Engines::new(1, 0, 0, 0),
    Engines::new(1, 1, 1, 1),
    Engines::new(1, 1, 0, 0),
    Engines::new(2, 1, 0, 0),
    Engines::new(3, 2, 0, 0),
    Engines::new(4, 2, 0, 0),
    Engines::new(7, 5, 1, 1),
];

/// An H100's (and H200's) instances' engines, as `nvidia-smi mig -lgip` and NVML's
/// `ProfileInfo` showed them on a real H100 80GB HBM3 (driver 580.159.04, 2026-11-27).
const HOPPER_ENGINES: [Engines; 7] = [
    Engines::new(1, 1, 1, 0),
    Engines::new(1, 1, 1, 1),
    Engines::new(1, 1, 1, 0),
    Engines::new(2, 2, 2, 0),
    Engines::new(3, 3, 3, 0),
    Engines::new(4, 4, 4, 0),
    Engines::new(8, 7, 7, 1),
];

static A100_40GB: [MigProfile; 7] = seven_slice(
    ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
    [4864, 4864, 9856, 9856, 19968, 19968, 40192],
    [14, 14, 14, 28, 42, 56, 98],
    AMPERE_ENGINES,
);

static A100_80GB: [MigProfile; 7] = seven_slice(
    ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    [9856, 9856, 19968, 19968, 40192, 40192, 80384],
    [14, 14, 14, 28, 42, 56, 98],
    AMPERE_ENGINES,
);

// memorySizeMB as NVML reported it on a real H100 80GB HBM3 (driver 580.159.04).
static H100_80GB: [MigProfile; 7] = seven_slice(
    ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    [9984, 9984, 20096, 20096, 40448, 40448, 81152],
    [16, 16, 26, 32, 60, 64, 132],
    HOPPER_ENGINES,
);

// 1g.35gb, 2g.35gb, 3g.71gb and 4g.71gb as NVML reports them on a read-only H200 (33280
// and 71424 MiB, issue 11); the others from GiB figures with two decimals (16.00, about 140).
static H200_141GB: [MigProfile; 7] = seven_slice(
    ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
    [16384, 16384, 33280, 33280, 71424, 71424, 143360],
    [16, 16, 26, 32, 60, 64, 132],
    HOPPER_ENGINES,
);

// A30: four memory slots, four compute slices. Memory from GiB with two decimals; engines
// from NVIDIA's MIG user guide (supported profiles, A30).
static A30_24GB: [MigProfile; 4] = [
    MigProfile {
        name: "1g.6gb",
        id: 14,
        nvml_enum: E_1G,
        compute_slices: 1,
        memory_slices: 1,
        memory_mib: 5949,
        sms: 14,
        max_count: 4,
        placements: &[0, 1, 2, 3],
        media_extensions: false,
        engines: Engines::new(1, 0, 0, 0),
    },
    MigProfile {
        name: "1g.6gb+me",
        id: 21,
        nvml_enum: E_1G_ME,
        compute_slices: 1,
        memory_slices: 1,
        memory_mib: 5949,
        sms: 14,
        max_count: 1,
        placements: &[0, 1, 2, 3],
        media_extensions: true,
        engines: Engines::new(1, 1, 1, 1),
    },
    MigProfile {
        name: "2g.12gb",
        id: 5,
        nvml_enum: E_2G,
        compute_slices: 2,
        memory_slices: 2,
        memory_mib: 11971,
        sms: 28,
        max_count: 2,
        placements: &[0, 2],
        media_extensions: false,
        engines: Engines::new(2, 2, 0, 0),
    },
    MigProfile {
        name: "4g.24gb",
        id: 0,
        nvml_enum: E_4G,
        compute_slices: 4,
        memory_slices: 4,
        memory_mib: 24064,
        sms: 56,
        max_count: 1,
        placements: &[0],
        media_extensions: false,
        engines: Engines::new(4, 4, 1, 1),
    },
];

static MODELS: &[GpuModel] = &[
    GpuModel {
        key: "a100-40gb",
        aliases: &["a100"],
        display_name: "A100-SXM4-40GB",
        nvml_name: "NVIDIA A100-SXM4-40GB",
        pci_device_ids: &[0x20B0_10DE, 0x20B1_10DE, 0x20F1_10DE, 0x20F6_10DE],
        architecture: Architecture::Ampere,
        memory_mib: 40960,
        sms: 108,
        memory_slots: 8,
        compute_slices: 7,
        mig_profiles: &A100_40GB,
    },
    GpuModel {
        key: "a100-80gb",
        aliases: &[],
        display_name: "A100-SXM4-80GB",
        nvml_name: "NVIDIA A100-SXM4-80GB",
        pci_device_ids: &[0x20B2_10DE, 0x20B5_10DE, 0x20F3_10DE, 0x20F5_10DE],
        architecture: Architecture::Ampere,
        memory_mib: 81920,
        sms: 108,
        memory_slots: 8,
        compute_slices: 7,
        mig_profiles: &A100_80GB,
    },
    GpuModel {
        key: "h100-80gb",
        aliases: &["h100"],
        display_name: "H100-80GB-HBM3",
        nvml_name: "NVIDIA H100 80GB HBM3",
        pci_device_ids: &[0x2330_10DE, 0x2331_10DE, 0x2322_10DE, 0x2324_10DE],
        architecture: Architecture::Hopper,
        // 85520809984 bytes as NVML reported on the real H100.
        memory_mib: 81559,
        sms: 132,
        memory_slots: 8,
        compute_slices: 7,
        mig_profiles: &H100_80GB,
    },
    GpuModel {
        key: "h200-141gb",
        aliases: &["h200"],
        display_name: "H200-141GB",
        nvml_name: "NVIDIA H200",
        pci_device_ids: &[0x2335_10DE, 0x233B_10DE],
        architecture: Architecture::Hopper,
        memory_mib: 143771,
        sms: 132,
        memory_slots: 8,
        compute_slices: 7,
        mig_profiles: &H200_141GB,
    },
    GpuModel {
        key: "a30-24gb",
        aliases: &["a30"],
        display_name: "A30-24GB",
        nvml_name: "NVIDIA A30",
        pci_device_ids: &[0x20B7_10DE],
        architecture: Architecture::Ampere,
        memory_mib: 24576,
        sms: 56,
        memory_slots: 4,
        compute_slices: 4,
        mig_profiles: &A30_24GB,
    },
    GpuModel {
        key: "rtx-4090",
        aliases: &["4090"],
        display_name: "RTX-4090",
        nvml_name: "NVIDIA GeForce RTX 4090",
        pci_device_ids: &[0x2684_10DE],
        architecture: Architecture::AdaLovelace,
        memory_mib: 24564,
        sms: 128,
        memory_slots: 0,
        compute_slices: 0,
        mig_profiles: &[],
    },
    GpuModel {
        key: "l40s",
        aliases: &[],
        display_name: "L40S",
        nvml_name: "NVIDIA L40S",
        pci_device_ids: &[0x26B9_10DE],
        architecture: Architecture::AdaLovelace,
        memory_mib: 46068,
        sms: 142,
        memory_slots: 0,
        compute_slices: 0,
        mig_profiles: &[],
    },
];

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
    fn every_placement_fits_inside_the_memory_slots() {
        for model in models() {
            for p in model.mig_profiles {
                for &start in p.placements {
                    assert!(
                        start + p.memory_slices <= model.memory_slots,
                        "{} {} at {start}",
                        model.key,
                        p.name
                    );
                    assert_eq!(
                        start % p.memory_slices.min(4),
                        0,
                        "{} {} aligned",
                        model.key,
                        p.name
                    );
                }
                assert!(p.compute_slices <= model.compute_slices);
                assert!(p.max_count as usize <= p.placements.len());
            }
        }
    }

    #[test]
    fn profile_ids_and_names_are_unique_per_model() {
        for model in models() {
            let mut ids: Vec<u32> = model.mig_profiles.iter().map(|p| p.id).collect();
            let mut names: Vec<&str> = model.mig_profiles.iter().map(|p| p.name).collect();
            let mut enums: Vec<u32> = model.mig_profiles.iter().map(|p| p.nvml_enum).collect();
            for v in [&mut ids, &mut enums] {
                v.sort();
                v.dedup();
            }
            names.sort();
            names.dedup();
            assert_eq!(ids.len(), model.mig_profiles.len(), "{}", model.key);
            assert_eq!(enums.len(), model.mig_profiles.len(), "{}", model.key);
            assert_eq!(names.len(), model.mig_profiles.len(), "{}", model.key);
        }
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
        for (a, b) in small.mig_profiles.iter().zip(big.mig_profiles) {
            assert_eq!((a.id, a.placements, a.sms), (b.id, b.placements, b.sms));
        }
    }
}
