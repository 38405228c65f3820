//! The capacity of each strategy under an SLO ([`capacity`]): the most replicas per GPU
//! that kept it beyond the host's noise, and the GPUs a fleet then needs.

use gpushare_proto::bench::{BenchCapacity, BenchMeasurement, BenchRun, BenchStrategyRuns, Slo};
use gpushare_proto::plural;

use super::noise::{MIN_NOISE_FLOOR, NoiseFloor};
use super::recommend::one_line;
use super::samples::median_interval;
use crate::bench::verdict;

/// How a run fares against an SLO.
enum Verdict {
    /// Kept beyond the noise, with the figure that kept it.
    Kept(String),
    /// Broken, or too close to tell, with why.
    NotKept(String),
}

/// The band a figure of `n` measurements may lie in: its interval over them where there
/// is one, widened to at least the host's noise band for `n` (`scale`: one measurement's
/// relative spread; `exp(±1.96 · scale / √n)`), and to [`MIN_NOISE_FLOOR`], either side of
/// `value`.
fn band(value: f64, interval: Option<[f64; 2]>, scale: f64, n: usize) -> [f64; 2] {
    let [low, high] = interval.unwrap_or([value, value]);
    let half = (verdict::Z95 * scale.max(0.0) / (n.max(1) as f64).sqrt()).exp();
    let wide = half.max(1.0 + MIN_NOISE_FLOOR);
    [low.min(value / wide), high.max(value * wide)]
}

/// Whether `run` kept `slo` with no error and no failed replica, beyond the host's noise
/// (`floor`, and the spread of the cell's `measurements`): [`Verdict::Kept`] with the
/// figure that kept it (`worst replica's p99 41.2 ms ≤ 50 ms`: the SLO holds for each
/// replica, so unlike the runs table's pooled p99 it is the worst replica's), or
/// [`Verdict::NotKept`] with what broke it (`at 7 worst replica's p99 63.0 ms`) or why it
/// is too close to call (`at 7 within the noise of 50 ms: worst replica's p99 46.0-55.1
/// ms`).
fn keeps(
    run: &BenchRun,
    slo: Slo,
    floor: NoiseFloor,
    measurements: &[&BenchMeasurement],
) -> Verdict {
    let n = run.replicas;
    if let Some(e) = &run.error {
        return Verdict::NotKept(format!("at {n}: {}", one_line(e)));
    }
    if run.failed > 0 {
        return Verdict::NotKept(format!(
            "at {n} {} of {} failed",
            run.failed,
            plural(n, "replica")
        ));
    }
    match slo {
        Slo::P99Ms(limit) => {
            if run.per_replica.is_empty() {
                return Verdict::NotKept(format!("at {n} no replica was measured"));
            }
            let mut worst = f64::NEG_INFINITY;
            for replica in &run.per_replica {
                match replica.p99_ms {
                    Some(p99) if !p99.is_nan() => worst = worst.max(p99),
                    _ => {
                        return Verdict::NotKept(format!(
                            "at {n} replica {} has no p99",
                            replica.index
                        ));
                    }
                }
            }
            let worsts: Option<Vec<f64>> = measurements.iter().map(|m| m.worst_p99_ms).collect();
            let interval = worsts.as_deref().and_then(median_interval);
            let [low, high] = band(worst, interval, floor.p99, measurements.len());
            if high <= limit {
                Verdict::Kept(format!("worst replica's p99 {worst:.1} ms ≤ {limit} ms"))
            } else if low > limit {
                Verdict::NotKept(format!("at {n} worst replica's p99 {worst:.1} ms"))
            } else {
                Verdict::NotKept(format!(
                    "at {n} within the noise of {limit} ms: worst replica's p99 {low:.1}-{high:.1} ms"
                ))
            }
        }
        Slo::Slowdown(limit) => match run.max_slowdown {
            Some(x) => {
                let [low, high] = band(x, None, floor.throughput, measurements.len());
                if high <= limit {
                    Verdict::Kept(format!("max slowdown {x:.1}x ≤ {limit}x"))
                } else if low > limit {
                    Verdict::NotKept(format!("at {n} max slowdown {x:.1}x"))
                } else {
                    Verdict::NotKept(format!(
                        "at {n} within the noise of {limit}x: max slowdown {low:.2}-{high:.2}x"
                    ))
                }
            }
            None => Verdict::NotKept(format!("at {n} no slowdown was measured")),
        },
    }
}

/// Per strategy (skipped ones aside), the most replicas per GPU such that it and every
/// smaller replica count measured kept `slo` beyond the noise ([`keeps`]) with no error
/// and no failed replica (`Slo::P99Ms`: every replica's p99, one without p99 breaks it;
/// `Slo::Slowdown`: the largest slowdown), and what that means for a fleet of `fleet`
/// replicas: GPUs needed, and the share saved against one GPU per replica. `sequence`
/// holds every measurement, for the spread of each cell's.
pub fn capacity(
    strategies: &[BenchStrategyRuns],
    slo: Slo,
    fleet: u32,
    floor: NoiseFloor,
    sequence: &[BenchMeasurement],
) -> Vec<BenchCapacity> {
    strategies
        .iter()
        .filter(|s| s.skipped.is_none())
        .map(|s| capacity_of(s, slo, fleet, floor, sequence))
        .collect()
}

/// [`capacity`] of one strategy.
fn capacity_of(
    strategy: &BenchStrategyRuns,
    slo: Slo,
    fleet: u32,
    floor: NoiseFloor,
    sequence: &[BenchMeasurement],
) -> BenchCapacity {
    let mut runs: Vec<&BenchRun> = strategy.runs.iter().collect();
    runs.sort_by_key(|r| r.replicas);
    let mut kept: Option<(u32, String)> = None;
    let mut broken: Option<String> = None;
    for run in runs {
        let measurements: Vec<&BenchMeasurement> = sequence
            .iter()
            .filter(|m| m.strategy == strategy.strategy && m.replicas == run.replicas && !m.failed)
            .collect();
        match keeps(run, slo, floor, &measurements) {
            Verdict::Kept(figure) => kept = Some((run.replicas, figure)),
            Verdict::NotKept(why) => {
                broken = Some(why);
                break;
            }
        }
    }
    let name = strategy.strategy.clone();
    let Some((per_gpu, figure)) = kept.filter(|(n, _)| *n > 0) else {
        let why = broken.unwrap_or_else(|| "no run was measured".into());
        return BenchCapacity {
            strategy: name,
            replicas_per_gpu: 0,
            gpus_needed: 0,
            saving: 0.0,
            reason: format!("no replica count kept {slo}: {why}"),
        };
    };
    let gpus_needed = fleet.div_ceil(per_gpu);
    let saving = if fleet > 0 { 1.0 - f64::from(gpus_needed) / f64::from(fleet) } else { 0.0 };
    let next = broken.unwrap_or_else(|| "the most measured".into());
    let reason = format!(
        "{per_gpu} per GPU: {figure}; {next}; {} on {} instead of {fleet}: {:.0} % fewer",
        plural(fleet, "replica"),
        plural(gpus_needed, "GPU"),
        saving * 100.0
    );
    BenchCapacity { strategy: name, replicas_per_gpu: per_gpu, gpus_needed, saving, reason }
}
