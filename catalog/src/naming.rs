//! NVIDIA's naming rule for MIG profiles: how mig-parted, GPU Feature Discovery and the
//! device plugin name a profile from the driver's numbers, and how they read a name back.
//!
//! The rule is go-nvlib's (`pkg/nvlib/device/mig_profile.go`, v0.12.0, vendored alike by
//! mig-parted and k8s-device-plugin): `<G>g.<GB>gb` from the GPU-instance profile's enum
//! (slices and variant) and its memory against the device's total memory, `<C>c.` in front
//! for a compute instance smaller than its GPU instance. The GB figure is not the
//! profile's GiB rounded: its share of the total is rounded *up* to eighths, and that
//! fraction of the total in whole GiB (rounded up) is rounded to the nearest GiB. A model
//! file whose memory and names disagree under this rule makes the two tools name one
//! profile two ways, which is why every model is checked against it (see the tests).

/// The compute slices of an `NVML_GPU_INSTANCE_PROFILE_*` enum, as go-nvlib reads them
/// (`None` for an enum go-nvlib refuses, such as `_3_SLICE_GFX`).
pub fn enum_slices(nvml_enum: u32) -> Option<u8> {
    Some(match nvml_enum {
        0 | 7 | 9 | 10 | 13 | 15 => 1,
        1 | 8 | 11 | 14 | 16 => 2,
        2 => 3,
        3 | 12 => 4,
        6 => 6,
        4 => 7,
        5 => 8,
        _ => return None,
    })
}

/// The name suffix of an `NVML_GPU_INSTANCE_PROFILE_*` enum: `_REV1` is `+me`, `_ALL_ME`
/// `+me.all`, `_GFX` `+gfx`, `_NO_ME` `-me`, every other `""`.
pub fn enum_suffix(nvml_enum: u32) -> &'static str {
    match nvml_enum {
        7 | 8 => "+me",
        15 | 16 => "+me.all",
        10..=12 => "+gfx",
        13 | 14 => "-me",
        _ => "",
    }
}

/// The `GB` of a profile's name: go-nvlib's `getMigMemorySizeGB`, float for float.
pub fn memory_gb(total_bytes: u64, memory_mib: u64) -> u64 {
    const EIGHTHS: f64 = 8.0;
    const MIB: f64 = 1024.0 * 1024.0;
    const GIB: u64 = 1024 * 1024 * 1024;
    let fraction = (memory_mib as f64 * MIB) / total_bytes as f64;
    let fraction = (fraction * EIGHTHS).ceil() / EIGHTHS;
    let total_gb = total_bytes.div_ceil(GIB) as f64;
    // Go's math.Round and Rust's f64::round both round half away from zero.
    (fraction * total_gb).round() as u64
}

/// The name NVIDIA's tools give a GPU-instance profile of this enum and memory on a device
/// of `total_bytes` (`nvmlDeviceGetMemoryInfo`'s total), e.g. `1g.10gb+me`; `None` for an
/// enum go-nvlib refuses.
pub fn gpu_instance_name(nvml_enum: u32, memory_mib: u64, total_bytes: u64) -> Option<String> {
    let slices = enum_slices(nvml_enum)?;
    let gb = memory_gb(total_bytes, memory_mib);
    Some(format!("{slices}g.{gb}gb{}", enum_suffix(nvml_enum)))
}

/// The name of a compute instance of `compute` slices in a GPU instance named
/// `gpu_instance` (`1c.3g.40gb`); the GPU instance's own name when it takes all of it.
pub fn compute_instance_name(compute: u8, gpu_instance: &str) -> String {
    match parse_name(gpu_instance) {
        Some(name) if name.gpu_slices == compute => gpu_instance.to_owned(),
        _ => format!("{compute}c.{gpu_instance}"),
    }
}

/// A MIG profile name as go-nvlib parses it: `[<C>c.]<G>g.<GB>gb[+attrs|-attrs]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedName<'a> {
    /// Compute slices (`C`; `G` where the name has no `<C>c.`).
    pub compute_slices: u32,
    /// GPU-instance compute slices (`G`).
    pub gpu_slices: u8,
    /// The memory figure (`GB`).
    pub gb: u64,
    /// The suffix as written (`""`, `+me`, `-me`, `+me.all`, `+gfx`).
    pub variant: &'a str,
}

/// Reads `text` as a MIG profile name the way go-nvlib's `parseMigProfile` does (decimal
/// numbers, `+` or `-` attributes, never both); `None` where it would refuse it.
pub fn parse_name(text: &str) -> Option<ParsedName<'_>> {
    if text.contains('+') && text.contains('-') {
        return None;
    }
    let at = text.find(['+', '-']).unwrap_or(text.len());
    let (fields, variant) = text.split_at(at);
    if !variant.is_empty() && !attributes_ok(&variant[1..]) {
        return None;
    }
    let number = |field: &str, unit: &str| -> Option<u64> {
        let digits = field.strip_suffix(unit)?;
        (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
            .then(|| digits.parse().ok())?
    };
    let parts: Vec<&str> = fields.splitn(3, '.').collect();
    let (compute, gpu, gb) = match parts[..] {
        [c, g, gb] => (Some(number(c, "c")?), number(g, "g")?, number(gb, "gb")?),
        [g, gb] => (None, number(g, "g")?, number(gb, "gb")?),
        _ => return None,
    };
    let gpu_slices = u8::try_from(gpu).ok()?;
    let compute_slices = u32::try_from(compute.unwrap_or(gpu)).ok()?;
    Some(ParsedName { compute_slices, gpu_slices, gb, variant })
}

/// go-nvlib's attribute rules: comma-separated, unique, none empty, each alphanumeric or
/// dots, not starting with a digit, not starting or ending with a dot.
fn attributes_ok(list: &str) -> bool {
    let attrs: Vec<&str> = list.split(',').collect();
    let mut seen = std::collections::HashSet::new();
    attrs.iter().all(|a| {
        seen.insert(*a)
            && !a.is_empty()
            && !a.starts_with(|c: char| c.is_ascii_digit() || c == '.')
            && !a.ends_with('.')
            && a.chars().all(|c| c.is_ascii_alphanumeric() || c == '.')
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulated_models;

    /// The total a simulated GPU reports (`nvmlDeviceGetMemoryInfo`'s and
    /// `…_v2`'s `total`): `sim/nvml` gives the model's `memory_mib` in bytes.
    fn reported_total_bytes(model: &crate::GpuModel) -> u64 {
        model.memory_mib << 20
    }

    #[test]
    fn every_models_names_are_what_nvidias_rule_makes_of_its_memory() {
        let mut wrong = Vec::new();
        for model in simulated_models() {
            for p in &model.mig_profiles {
                let total = reported_total_bytes(model);
                let derived = gpu_instance_name(p.nvml_enum, p.memory_mib, total);
                if derived.as_deref() != Some(p.name.as_str()) {
                    wrong.push(format!(
                        "{} {} ({} MiB of {} MiB, enum {}): NVIDIA's tools name it {derived:?}",
                        model.key, p.name, p.memory_mib, model.memory_mib, p.nvml_enum
                    ));
                }
                assert_eq!(enum_slices(p.nvml_enum), Some(p.compute_slices), "{}", p.name);
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn the_rule_rounds_shares_up_to_eighths_and_the_total_up_to_a_gib() {
        // The H100 80GB read on the real GPU: 81559 MiB, 1g 9984 MiB (just under 1/8).
        assert_eq!(memory_gb(85520809984, 9984), 10);
        assert_eq!(memory_gb(85520809984, 40448), 40);
        // The early GB200's driver names: 20 GiB of a 189 GiB total is 1/8, 23.6 → 24;
        // 91 GiB is 4/8, 94.5 → 95 (half away from zero). Of a 186 GiB total: 23, 93.
        let early = 189 << 30;
        assert_eq!((memory_gb(early, 20480), memory_gb(early, 93184)), (24, 95));
        let production = 186 << 30;
        assert_eq!((memory_gb(production, 20480), memory_gb(production, 93184)), (23, 93));
        assert_eq!(gpu_instance_name(14, 46 * 1024, 186 << 30).unwrap(), "2g.47gb-me");
        assert_eq!(gpu_instance_name(15, 23 * 1024, 186 << 30).unwrap(), "1g.23gb+me.all");
        assert_eq!(gpu_instance_name(17, 1024, 186 << 30), None, "_3_SLICE_GFX");
    }

    #[test]
    fn the_rule_agrees_with_go_nvlib_at_its_edges() {
        // (total bytes, MiB, GB) as go-nvlib's getMigMemorySizeGB answered them under Go
        // 1.27.3 (a sweep of every MiB on every simulated total, 1.8 million inputs, agreed).
        let gib80 = 80u64 << 30;
        for (total, mib, gb) in [
            (gib80, 0, 0),          // nothing is 0, not an eighth
            (gib80, 1, 10),         // a tiny profile is a whole eighth
            (gib80, 10240, 10),     // exactly 1/8
            (gib80, 10241, 20),     // past it: 2/8
            (gib80, 81920, 80),     // all of it
            (gib80, 81921, 90),     // more than all: 9/8
            (gib80 + 1, 81920, 81), // one byte past 80 GiB is 81 GiB
            (gib80 + 1, 10240, 10),
            (1 << 20, 1, 1), // a 1 MiB device: 1 GiB rounded up
            (85520809984, 10194, 10),
            (85520809984, 10195, 20),
            (85520809984, 81559, 80),
        ] {
            assert_eq!(memory_gb(total, mib), gb, "{mib} MiB of {total} bytes");
        }
    }

    #[test]
    fn compute_instances_are_named_in_front_of_their_gpu_instance() {
        assert_eq!(compute_instance_name(1, "3g.40gb"), "1c.3g.40gb");
        assert_eq!(compute_instance_name(3, "3g.40gb"), "3g.40gb");
        assert_eq!(compute_instance_name(2, "4g.96gb+gfx"), "2c.4g.96gb+gfx");
    }

    #[test]
    fn names_are_read_as_go_nvlib_reads_them() {
        let p = parse_name("1c.3g.40gb").unwrap();
        assert_eq!((p.compute_slices, p.gpu_slices, p.gb, p.variant), (1, 3, 40, ""));
        let p = parse_name("1g.24gb+me.all").unwrap();
        assert_eq!((p.compute_slices, p.gpu_slices, p.gb, p.variant), (1, 1, 24, "+me.all"));
        assert_eq!(parse_name("2g.48gb-me").unwrap().variant, "-me");
        for bad in ["", "3g", "3g.40", "g.40gb", "3g.gb", "3g.40gb+", "3g.40gb+me,me", "3g.40gb+1x"]
        {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
        assert_eq!(parse_name("3g.40gb+me-x"), None, "both + and -");
        assert_eq!(parse_name("all-balanced"), None);
    }
}
