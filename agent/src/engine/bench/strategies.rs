//! The strategies a bench compares, one entry each ([`Strategy`], looked up by [`of`]):
//! whether a GPU can hold it at all, how it is set up for N replicas (a profile of the
//! GPU, [`super::setups`]), which devices its replicas are given, and whether its run at
//! one replica is the baseline itself. The tools a setup needs (an MPS control binary,
//! MIG rights) follow from its plan, checked for every setup before a bench changes
//! anything. Adding a strategy is its name in `gpushare_proto::bench::BenchStrategy`
//! (which makes [`of`] and `bench::stats`' isolation order fail to compile until they
//! have it), its entry here and its setup.

use gpushare_proto::bench::BenchStrategy;

use super::setups::{self, GpuFacts, Setup};
use crate::node::GpuState;
use crate::plan::PlanOptions;

/// One strategy of a bench: everything in which strategies differ.
pub(super) struct Strategy {
    /// Its name (`mps-limited`).
    pub(super) name: BenchStrategy,
    /// Why it cannot be measured on this GPU under this policy at all (`None`: it can);
    /// said in the plan and the report, never an error.
    pub(super) unavailable: fn(&GpuState, &PlanOptions) -> Option<String>,
    /// How it is set up for N replicas ([`Strategy::set_up`]); an error is that cell's
    /// figure.
    pub(super) setup: fn(u32, &GpuFacts) -> Result<Setup, String>,
    /// Which device each replica is given once it is set up.
    pub(super) devices: Devices,
    /// Its run at one replica is the baseline's own setup: measured once, as the baseline,
    /// and reported under both.
    pub(super) alone_is_baseline: bool,
}

/// Which device each replica of a strategy is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Devices {
    /// The whole GPU, as any client of it gets it now (with MPS: its server's pipe).
    WholeGpu,
    /// A MIG instance of its own (`CUDA_VISIBLE_DEVICES=MIG-…`), one per replica.
    MigInstances,
}

/// The entry of `name`.
pub(super) fn of(name: BenchStrategy) -> Strategy {
    match name {
        BenchStrategy::TimeSlicing => Strategy {
            name,
            unavailable: always_available,
            setup: |_, _| Ok(setups::time_slicing()),
            devices: Devices::WholeGpu,
            alone_is_baseline: true,
        },
        BenchStrategy::Mps => Strategy {
            name,
            unavailable: always_available,
            setup: setups::mps,
            devices: Devices::WholeGpu,
            alone_is_baseline: false,
        },
        BenchStrategy::MpsLimited => Strategy {
            name,
            unavailable: always_available,
            setup: setups::mps_limited,
            devices: Devices::WholeGpu,
            alone_is_baseline: false,
        },
        BenchStrategy::Mig => Strategy {
            name,
            unavailable: mig_unavailable,
            setup: setups::mig,
            devices: Devices::MigInstances,
            alone_is_baseline: false,
        },
    }
}

impl Strategy {
    /// How it is set up for `n` replicas on `gpu`, named as this entry is.
    pub(super) fn set_up(&self, n: u32, gpu: &GpuFacts) -> Result<Setup, String> {
        (self.setup)(n, gpu).map(|setup| Setup { strategy: self.name, ..setup })
    }

    /// Whether `n` replicas of it are a cell of the bench: not the baseline's own run.
    pub(super) fn is_cell(&self, n: u32) -> bool {
        !(self.alone_is_baseline && n == 1)
    }
}

/// A strategy every whole GPU can hold.
fn always_available(_: &GpuState, _: &PlanOptions) -> Option<String> {
    None
}

/// MIG needs a MIG-capable model and an agent that may change MIG mode.
fn mig_unavailable(g: &GpuState, policy: &PlanOptions) -> Option<String> {
    if g.model.is_none_or(|m| m.mig_profiles.is_empty()) {
        return Some(format!("{} is not MIG-capable", g.model_name()));
    }
    if !policy.manage_mig {
        return Some(
            "not measured: agent.toml [gpu] manage_mig = false (a host whose MIG mode the agent may not change)".into(),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_strategy_has_one_entry_that_sets_it_up() {
        let h100 = gpushare_catalog::model_by_key("h100-80gb").unwrap();
        let gpu = GpuFacts { memory_total: 80 << 30, model: Some(h100) };
        for name in BenchStrategy::ALL {
            let entry = of(name);
            assert_eq!(entry.name, name);
            for n in 1..=7 {
                let setup = (entry.setup)(n, &gpu).unwrap();
                assert_eq!(setup.strategy, name, "{name} at {n}");
                assert_eq!(entry.set_up(n, &gpu), Ok(setup));
            }
        }
        // The baseline is one replica alone under exactly one strategy's setup.
        let alone: Vec<BenchStrategy> =
            BenchStrategy::ALL.into_iter().filter(|s| of(*s).alone_is_baseline).collect();
        assert_eq!(alone, [BenchStrategy::TimeSlicing]);
        assert_eq!((of(alone[0]).setup)(1, &gpu).unwrap(), setups::time_slicing());
        assert!(!of(BenchStrategy::TimeSlicing).is_cell(1));
        assert!(of(BenchStrategy::TimeSlicing).is_cell(2) && of(BenchStrategy::Mps).is_cell(1));
    }
}
