//! How a bench sets each strategy up on its whole GPU ([`Setup`]): time-slicing, MPS,
//! MPS with limits, MIG instances of the size of which N fit, each as a profile of that
//! GPU alone ([`whole_gpu`]) applied by an ordinary transaction. Which strategy uses which
//! setup is the table in [`super::strategies`].

use gpushare_proto::bench::BenchStrategy;
use gpushare_proto::readable_size;

use crate::profile::{self, MigKey, MigLayout, Profile, Sharing as ProfileSharing};

/// How one strategy is set up for N replicas.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Setup {
    pub(super) strategy: BenchStrategy,
    pub(super) mig: MigLayout,
    pub(super) sharing: ProfileSharing,
    /// For people: `MPS, 33 % threads, 26 GiB each`.
    pub(super) describe: String,
}

/// The whole GPU without MPS: the driver's time-slicing between the replicas.
pub(super) fn time_slicing() -> Setup {
    Setup {
        strategy: BenchStrategy::TimeSlicing,
        mig: MigLayout::Disabled,
        sharing: ProfileSharing::Exclusive,
        describe: "whole GPU, no MPS".into(),
    }
}

/// What a setup depends on of the benched GPU.
#[derive(Debug, Clone, Copy)]
pub(super) struct GpuFacts {
    /// Its memory, bytes.
    pub(super) memory_total: u64,
    /// Its model, where the catalog has it (MIG sizes).
    pub(super) model: Option<&'static gpushare_catalog::GpuModel>,
}

/// MPS without limits: one server, every replica at 100 % threads.
pub(super) fn mps(_n: u32, _gpu: &GpuFacts) -> Result<Setup, String> {
    Ok(Setup {
        strategy: BenchStrategy::Mps,
        mig: MigLayout::Disabled,
        sharing: ProfileSharing::Mps(profile::MpsSettings {
            active_thread_percentage: Some(100),
            ..Default::default()
        }),
        describe: "MPS, no limits".into(),
    })
}

/// MPS with limits: `100/n` % threads (at least 1) and `memory/n` (whole MiB) each.
pub(super) fn mps_limited(n: u32, gpu: &GpuFacts) -> Result<Setup, String> {
    let threads = (100 / n).max(1);
    // Whole MiB, as MPS takes its memory limits.
    let each = (gpu.memory_total / u64::from(n)) & !((1 << 20) - 1);
    Ok(Setup {
        strategy: BenchStrategy::MpsLimited,
        mig: MigLayout::Disabled,
        sharing: ProfileSharing::Mps(profile::MpsSettings {
            active_thread_percentage: Some(threads),
            pinned_memory_limit_bytes: Some(each),
            ..Default::default()
        }),
        describe: format!("MPS, {threads} % threads, {} each", readable_size(each)),
    })
}

/// `n` MIG instances of the largest size of which `n` fit ([`mig_size`]).
pub(super) fn mig(n: u32, gpu: &GpuFacts) -> Result<Setup, String> {
    let (slices, name) = match gpu.model {
        Some(model) => mig_size(model, n)?,
        None => return Err("no MIG size worked out".into()),
    };
    Ok(Setup {
        strategy: BenchStrategy::Mig,
        mig: MigLayout::Enabled(vec![(MigKey::Slices(slices), n)]),
        sharing: ProfileSharing::Exclusive,
        describe: format!("{n} × {name}"),
    })
}

/// The largest MIG instance of which `n` fit on `model` (7×1g, 3×2g, 2×3g, 1×7g on an
/// A100 or H100: `n` = 5 gets five 1g instances).
pub(super) fn mig_size(model: &gpushare_catalog::GpuModel, n: u32) -> Result<(u8, String), String> {
    model
        .mig_profiles
        .iter()
        .filter(|p| p.is_plain() && u32::from(p.max_count) >= n)
        .filter(|p| model.profile_by_compute_slices(p.compute_slices).map(|q| q.id) == Some(p.id))
        .max_by_key(|p| (p.compute_slices, std::cmp::Reverse(p.memory_mib)))
        .map(|p| (p.compute_slices, p.name.to_string()))
        .ok_or_else(|| {
            let most = model.mig_profiles.iter().map(|p| p.max_count).max().unwrap_or(0);
            format!("no MIG layout with {n} instances on {} (at most {most})", model.display_name)
        })
}

/// A profile that sets one whole GPU's MIG layout and sharing and leaves every other GPU
/// alone.
pub(in crate::engine) fn whole_gpu(
    name: &str,
    uuid: &str,
    mig: MigLayout,
    sharing: ProfileSharing,
) -> Profile {
    Profile {
        name: name.into(),
        description: "set up by a bench or probe comparison".into(),
        rules: vec![profile::GpuRule {
            select: profile::Selector::Uuid(uuid.into()),
            device_filter: Vec::new(),
            location: profile::Location { origin: "bench".into(), line: 1, column: 1 },
            mig,
            sharing,
            instance_sharing: Vec::new(),
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_sizes_follow_the_model() {
        let h100 = gpushare_catalog::model_by_key("h100-80gb").unwrap();
        let names: Vec<String> =
            (1..=7).map(|n| mig_size(h100, n).map(|(_, name)| name).unwrap()).collect();
        assert_eq!(
            names,
            ["7g.80gb", "3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"]
        );
        assert!(mig_size(h100, 8).unwrap_err().contains("at most 7"));
    }

    #[test]
    fn mps_limited_splits_threads_and_memory() {
        let setup = |n| mps_limited(n, &GpuFacts { memory_total: 80 << 30, model: None });
        let s = setup(3).unwrap();
        let ProfileSharing::Mps(m) = &s.sharing else { panic!("{s:?}") };
        assert_eq!(m.active_thread_percentage, Some(33));
        assert_eq!(m.pinned_memory_limit_bytes, Some(27306 << 20));
        assert_eq!(s.describe, "MPS, 33 % threads, 26.7 GiB each");
        let s = setup(2).unwrap();
        assert_eq!(s.describe, "MPS, 50 % threads, 40 GiB each");
    }
}
