//! The figures of a bench's report from its measurements: the baseline (the median of
//! its measurements, against itself), the host's noise over the windows ([`HostTotals`]),
//! each cell against the baseline and flagged where its scaling is above N, the
//! recommendations and capacity ([`crate::bench::stats`] computes them), and how the
//! intervals were found ([`intervals_text`]).

use gpushare_proto::bench::{BenchMeasurement, BenchReport, BenchRun, BenchStrategyRuns};

use super::BenchJob;
use super::rounds::Cell;
use super::setups::time_slicing;
use super::strategies;
use crate::bench::host_noise::HostNoise;
use crate::bench::stats;

/// The report's figures from the measurements: the baseline (the median of its),
/// the host's noise, each cell against the baseline, flagged where its scaling is
/// above N, and how the intervals were found.
pub(super) fn figures(
    job: &BenchJob,
    report: &mut BenchReport,
    baseline_runs: Vec<BenchRun>,
    cells: Vec<Cell>,
    setup0_ms: f64,
    host: &HostTotals,
) {
    let Some(mut baseline) = stats::cell_run(baseline_runs) else {
        return;
    };
    baseline.setup_ms = Some(setup0_ms);
    against_itself(&mut baseline);
    let measured_alone: Vec<BenchMeasurement> =
        report.sequence.iter().filter(|m| m.strategy == "baseline").cloned().collect();
    let (floor, noise) =
        stats::noise(&measured_alone, host.steal(), &host.frequency_mhz, job.options.repeat);
    report.noise = Some(noise);
    report.baseline = Some(baseline.clone());
    let mut cells = cells;
    for &strategy in &job.options.strategies {
        let entry = strategies::of(strategy);
        let mut runs = BenchStrategyRuns {
            strategy: strategy.as_str().into(),
            skipped: job.skipped.get(&strategy).cloned(),
            runs: Vec::new(),
        };
        if runs.skipped.is_none() {
            for &n in &job.options.replicas {
                if !entry.is_cell(n) {
                    // The baseline is exactly this run.
                    let describe = time_slicing().describe;
                    runs.runs.push(BenchRun {
                        setup: describe,
                        setup_ms: None,
                        ..baseline.clone()
                    });
                    continue;
                }
                let Some(cell) = cells.iter_mut().find(|c| c.strategy == strategy && c.n == n)
                else {
                    continue;
                };
                let measured = std::mem::take(&mut cell.runs);
                if let Some(mut run) = stats::cell_run(measured) {
                    if run.error.is_none() {
                        stats::against_baseline(&mut run, &baseline);
                        stats::check_scaling(&mut run, &baseline, floor);
                    }
                    run.setup_ms = cell.setup_ms;
                    runs.runs.push(run);
                }
            }
        }
        report.strategies.push(runs);
    }
    report.intervals = intervals_text(job.options.repeat, baseline.repeat_throughputs_per_s.len());
    report.recommendations =
        stats::recommend(&report.strategies, job.options.objective, report.rate_unit(), floor);
    if let Some(slo) = job.options.slo {
        report.capacity =
            stats::capacity(&report.strategies, slo, job.options.fleet, floor, &report.sequence);
    }
}

/// The baseline's ratios, each against itself (1 where the figure exists), so that its
/// row reads like the others.
fn against_itself(run: &mut BenchRun) {
    let same = |x: Option<f64>| x.filter(|&v| v > 0.0).map(|v| stats::inflation(v, v));
    run.scaling = same(Some(run.throughput_per_s));
    run.p50_inflation = same(run.p50_ms);
    run.p99_inflation = same(run.p99_ms);
    for r in &mut run.per_replica {
        r.slowdown = same(Some(r.throughput_per_s).filter(|_| !r.failed));
    }
    run.max_slowdown = run.per_replica.iter().filter_map(|r| r.slowdown).reduce(f64::max);
}

/// The replicas' CPUs over every window: steal and clock.
#[derive(Default)]
pub(super) struct HostTotals {
    steal: Vec<f64>,
    pub(super) frequency_mhz: Vec<f64>,
}

impl HostTotals {
    pub(super) fn add(&mut self, noise: Option<HostNoise>) {
        if let Some(noise) = noise {
            self.steal.extend(noise.steal_percent);
            self.frequency_mhz.extend(noise.frequency_mhz);
        }
    }

    /// The mean steal over the windows (of equal length).
    pub(super) fn steal(&self) -> Option<f64> {
        super::rounds::Timing::mean(&self.steal)
    }
}

/// The worst replica's p99 of a run, ms.
pub(super) fn worst_p99(run: &BenchRun) -> Option<f64> {
    run.per_replica.iter().filter(|r| !r.failed).filter_map(|r| r.p99_ms).reduce(f64::max)
}

/// How sure the range of `n` measurements is to hold their median (distribution-free:
/// it misses only when all fall on one side), percent: 75 for 3, 88 for 4, 94 for 5.
pub(super) fn range_coverage(n: u32) -> f64 {
    100.0 * (1.0 - 0.5f64.powi(i32::try_from(n).unwrap_or(i32::MAX).saturating_sub(1)))
}

/// How the runs' intervals were found, for the report.
pub(super) fn intervals_text(repeat: u32, baseline_measurements: usize) -> String {
    let base_n = u32::try_from(baseline_measurements).unwrap_or(u32::MAX);
    let baseline = format!(
        "the baseline's is the range of its {baseline_measurements} measurements, which holds its median with {:.0} % confidence",
        range_coverage(base_n)
    );
    match repeat {
        1 => format!(
            "runs measured once have no interval ({baseline}); verdicts compare them through the host's noise alone. --repeat 6 or more gives each run a 95 % interval of its median"
        ),
        k @ 2..=5 => format!(
            "percentile bootstrap of the median over each run's {k} measurements, one per round ({} resamples): with {k} it is their range, which holds the median with {:.0} % confidence ({baseline}); verdicts test the ratio of two runs' medians against the host's noise; --repeat 6 or more gives 95 %",
            stats::BOOTSTRAP_RESAMPLES,
            range_coverage(k)
        ),
        k => format!(
            "95 % percentile-bootstrap interval of the median over each run's {k} measurements, one per round ({} resamples); verdicts bootstrap the ratio of two runs' medians the same way, at least the host's noise",
            stats::BOOTSTRAP_RESAMPLES
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_say_how_sure_they_are() {
        assert_eq!(range_coverage(3).round(), 75.0);
        assert_eq!(range_coverage(5).round(), 94.0);
        let three = intervals_text(3, 3);
        assert!(
            three.contains("with 3 it is their range, which holds the median with 75 % confidence"),
            "{three}"
        );
        assert!(intervals_text(8, 8).starts_with("95 % percentile-bootstrap"));
        assert!(intervals_text(1, 3).starts_with("runs measured once have no interval"));
    }
}
