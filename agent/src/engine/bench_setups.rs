//! How a bench sets each strategy up on its whole GPU ([`Setup`]): time-slicing, MPS,
//! MPS with limits, MIG instances of the size of which N fit, each as a profile of that
//! GPU alone ([`whole_gpu`]) applied by an ordinary transaction.

use std::collections::HashMap;

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

/// How `strategy` is set up for `n` replicas on a GPU with `memory` bytes.
pub(super) fn setup(
    strategy: BenchStrategy,
    n: u32,
    memory: u64,
    mig_sizes: &HashMap<u32, Result<(u8, String), String>>,
) -> Result<Setup, String> {
    Ok(match strategy {
        BenchStrategy::TimeSlicing => time_slicing(),
        BenchStrategy::Mps => Setup {
            strategy,
            mig: MigLayout::Disabled,
            sharing: ProfileSharing::Mps(profile::MpsSettings {
                active_thread_percentage: Some(100),
                ..Default::default()
            }),
            describe: "MPS, no limits".into(),
        },
        BenchStrategy::MpsLimited => {
            let threads = (100 / n).max(1);
            // Whole MiB, as MPS takes its memory limits.
            let each = (memory / u64::from(n)) & !((1 << 20) - 1);
            Setup {
                strategy,
                mig: MigLayout::Disabled,
                sharing: ProfileSharing::Mps(profile::MpsSettings {
                    active_thread_percentage: Some(threads),
                    pinned_memory_limit_bytes: Some(each),
                    ..Default::default()
                }),
                describe: format!("MPS, {threads} % threads, {} each", readable_size(each)),
            }
        }
        BenchStrategy::Mig => {
            let (slices, name) = match mig_sizes.get(&n) {
                Some(Ok(size)) => size.clone(),
                Some(Err(why)) => return Err(why.clone()),
                None => return Err("no MIG size worked out".into()),
            };
            Setup {
                strategy,
                mig: MigLayout::Enabled(vec![(MigKey::Slices(slices), n)]),
                sharing: ProfileSharing::Exclusive,
                describe: format!("{n} × {name}"),
            }
        }
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
pub(super) fn whole_gpu(
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
        let s = setup(BenchStrategy::MpsLimited, 3, 80 << 30, &HashMap::new()).unwrap();
        let ProfileSharing::Mps(m) = &s.sharing else { panic!("{s:?}") };
        assert_eq!(m.active_thread_percentage, Some(33));
        assert_eq!(m.pinned_memory_limit_bytes, Some(27306 << 20));
        assert_eq!(s.describe, "MPS, 33 % threads, 26.7 GiB each");
        let s = setup(BenchStrategy::MpsLimited, 2, 80 << 30, &HashMap::new()).unwrap();
        assert_eq!(s.describe, "MPS, 50 % threads, 40 GiB each");
    }
}
