//! A run's figures: summarized from what was measured of each replica
//! ([`summarize_run`]), the median of several measurements of one cell and its interval
//! ([`cell_run`]), and its comparisons with the baseline (scaling, slowdown, inflation; a
//! scaling above N flagged, [`check_scaling`]).

use std::cmp::Ordering;

use gpushare_proto::bench::{BenchReplica, BenchRun};

use super::buckets::Latencies;
use super::noise::NoiseFloor;
use super::samples::{jain_index, largest, median_interval, ratio_of};
use crate::bench::verdict;

/// The run to report of several measurements of one run: the first that failed or has
/// no figures (a failure is reported, never outvoted by the others), else the one with
/// the median aggregate throughput (the lower middle one of an even count). With more than
/// one, it carries every measurement's throughput, in the order taken. `None` for none.
pub fn median_run(mut runs: Vec<BenchRun>) -> Option<BenchRun> {
    let all: Vec<f64> = runs.iter().map(|r| r.throughput_per_s).collect();
    let p99s: Option<Vec<f64>> = runs.iter().map(|r| r.p99_ms).collect();
    let pick = match runs.iter().position(|r| r.error.is_some() || r.failed > 0) {
        Some(broken) => broken,
        None => {
            let mut order: Vec<usize> = (0..runs.len()).collect();
            order.sort_by(|&a, &b| all[a].total_cmp(&all[b]));
            *order.get(runs.len().checked_sub(1)? / 2)?
        }
    };
    let mut run = runs.swap_remove(pick);
    if all.len() > 1 {
        run.repeat_throughputs_per_s = all;
        run.repeat_p99s_ms = p99s.unwrap_or_default();
    }
    Some(run)
}

/// The run to report of all measurements of one cell (strategy × N): [`median_run`],
/// with the interval of its median throughput and p99 ([`median_interval`]) when every
/// measurement succeeded and there are at least two.
pub fn cell_run(runs: Vec<BenchRun>) -> Option<BenchRun> {
    let ok = runs.iter().all(|r| r.error.is_none() && r.failed == 0);
    let throughputs: Vec<f64> = runs.iter().map(|r| r.throughput_per_s).collect();
    let p99s: Option<Vec<f64>> = runs.iter().map(|r| r.p99_ms).collect();
    let mut run = median_run(runs)?;
    if ok {
        run.throughput_interval = median_interval(&throughputs);
        run.p99_interval_ms = p99s.as_deref().and_then(median_interval);
    }
    Some(run)
}

/// Every measurement of `run`'s throughput (the one figure when it was measured once).
pub(super) fn throughputs(run: &BenchRun) -> Vec<f64> {
    if run.repeat_throughputs_per_s.is_empty() {
        vec![run.throughput_per_s]
    } else {
        run.repeat_throughputs_per_s.clone()
    }
}

/// Every measurement of `run`'s pooled p99; empty without one.
pub(super) fn p99s_of(run: &BenchRun) -> Vec<f64> {
    match run.p99_ms {
        _ if !run.repeat_p99s_ms.is_empty() => run.repeat_p99s_ms.clone(),
        Some(p99) => vec![p99],
        None => Vec::new(),
    }
}

/// Sets `run`'s comparisons with the baseline anew (the baseline's figures are its
/// median over every round, known only at the end): scaling, p50/p99 inflation, each
/// replica's slowdown and the largest.
pub fn against_baseline(run: &mut BenchRun, baseline: &BenchRun) {
    let base = Some(baseline.throughput_per_s).filter(|t| t.is_finite() && *t > 0.0);
    for replica in &mut run.per_replica {
        replica.slowdown = match base {
            Some(base) if !replica.failed => ratio_of(base, replica.throughput_per_s),
            _ => None,
        };
    }
    let counted: Vec<&BenchReplica> = run.per_replica.iter().filter(|r| !r.failed).collect();
    let any = !counted.is_empty();
    run.scaling = base.filter(|_| any).and_then(|base| ratio_of(run.throughput_per_s, base));
    run.p50_inflation = run.p50_ms.zip(baseline.p50_ms).and_then(|(own, b)| ratio_of(own, b));
    run.p99_inflation = run.p99_ms.zip(baseline.p99_ms).and_then(|(own, b)| ratio_of(own, b));
    run.max_slowdown = if any {
        counted
            .iter()
            .map(|r| r.slowdown)
            .collect::<Option<Vec<f64>>>()
            .and_then(|all| largest(all.into_iter()))
    } else {
        None
    };
}

/// The words of a scaling above N told apart from N: no sharing makes N replicas do more
/// than N alone, so it is never a gain.
const MEASUREMENT_PROBLEM: &str = "a measurement problem (a noisy baseline, or replicas that \
                                   do less work together), not a gain";

/// Flags a scaling above N: replicas sharing a GPU never do more than N alone would. The
/// same test as every verdict ([`verdict::difference`] of the run's throughputs against N
/// times the baseline's): within the noise it reads as N; beyond it, a measurement
/// problem, never a gain.
pub fn check_scaling(run: &mut BenchRun, baseline: &BenchRun, floor: NoiseFloor) {
    let n = f64::from(run.replicas);
    let alone: Vec<f64> = throughputs(baseline).iter().map(|t| t * n).collect();
    let told = verdict::difference(&throughputs(run), &alone, floor.throughput)
        .is_some_and(|d| d.tells() == Ordering::Greater);
    // Above N as the report shows it (two decimals), not by a rounding error.
    let above = |s: f64| s.is_finite() && s >= n + 0.005;
    run.scaling_warning = match run.scaling {
        Some(s) if above(s) && !told => Some(format!(
            "scaling {s:.2}x is above {}, within the noise: read it as {}x",
            run.replicas, run.replicas
        )),
        Some(s) if above(s) => {
            Some(format!("scaling {s:.2}x is above {}: {MEASUREMENT_PROBLEM}", run.replicas))
        }
        _ => None,
    };
}

/// Whether `run`'s scaling is above N beyond the noise ([`check_scaling`]): its
/// throughput is no figure to claim a gain with.
pub(super) fn beyond_n(run: &BenchRun) -> bool {
    run.scaling_warning.as_deref().is_some_and(|w| w.contains(MEASUREMENT_PROBLEM))
}

/// What the orchestrator measured of one replica.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaMeasure {
    /// Identity, outcome, `failed`, wall time, device, tails, malformed lines and GPU
    /// memory filled in; its figures (units, throughput, p50, p99, slowdown) are
    /// [`summarize_run`]'s to fill.
    pub replica: BenchReplica,
    /// Units it completed in the window (1 with `--until-exit`).
    pub units: u64,
    /// Length of the window it was measured over, seconds (its wall time with
    /// `--until-exit`).
    pub seconds: f64,
    /// Its latencies, ms (its wall time as the one sample with `--until-exit`).
    pub latencies: Latencies,
}

/// Units per second; 0 without a usable length.
fn per_second(units: u64, seconds: f64) -> f64 {
    ratio_of(units as f64, seconds).unwrap_or(0.0)
}

/// A run of `replicas` replicas under one strategy (set up as `setup`), from what was
/// measured of each, against `baseline` (one replica alone on the whole GPU).
///
/// Each replica gets its units, throughput (units over its window), p50 and p99 of its
/// latencies, and its slowdown (baseline throughput over its own; `None` without a
/// baseline, without throughput of its own, or when it failed). The run's figures are
/// over the replicas that did not fail: throughputs and units summed; latencies pooled
/// (`None` when they cannot be); scaling, inflation and Jain's index against the baseline;
/// the largest slowdown (`None` if one of them has none). `seconds` is the longest window
/// among them (among all replicas when every one failed). When every replica failed the
/// throughput is 0 and every optional figure `None`.
pub fn summarize_run(
    replicas: u32,
    setup: String,
    measures: Vec<ReplicaMeasure>,
    baseline: Option<&BenchRun>,
) -> BenchRun {
    let mut measures = measures;
    measures.sort_by_key(|m| m.replica.index);
    for m in &mut measures {
        let replica = &mut m.replica;
        replica.units = m.units;
        replica.throughput_per_s = per_second(m.units, m.seconds);
        replica.p50_ms = m.latencies.percentile(50.0);
        replica.p99_ms = m.latencies.percentile(99.0);
        replica.slowdown = None;
    }
    let counted: Vec<&ReplicaMeasure> = measures.iter().filter(|m| !m.replica.failed).collect();
    let failed = u32::try_from(measures.len() - counted.len()).unwrap_or(u32::MAX);
    let seconds = largest(counted.iter().map(|m| m.seconds))
        .or_else(|| largest(measures.iter().map(|m| m.seconds)))
        .unwrap_or(0.0);
    let throughputs: Vec<f64> = counted.iter().map(|m| m.replica.throughput_per_s).collect();
    // Summed from +0.0: an empty f64 sum is -0.0, which JSON would show as such.
    let throughput: f64 = throughputs.iter().fold(0.0, |sum, x| sum + x);
    let units = counted.iter().fold(0u64, |sum, m| sum.saturating_add(m.units));
    let latencies: Vec<&Latencies> = counted.iter().map(|m| &m.latencies).collect();
    let pooled = Latencies::pooled(&latencies).ok();
    let any = !counted.is_empty();
    let mut run = BenchRun {
        replicas,
        setup,
        seconds,
        units,
        throughput_per_s: throughput,
        scaling: None,
        p50_ms: pooled.as_ref().and_then(|l| l.percentile(50.0)),
        p99_ms: pooled.as_ref().and_then(|l| l.percentile(99.0)),
        p50_inflation: None,
        p99_inflation: None,
        jain_fairness: any.then(|| jain_index(&throughputs)),
        max_slowdown: None,
        failed,
        error: None,
        agent_cpu_percent: None,
        setup_ms: None,
        repeat_throughputs_per_s: Vec::new(),
        repeat_p99s_ms: Vec::new(),
        throughput_interval: None,
        p99_interval_ms: None,
        scaling_warning: None,
        per_replica: measures.into_iter().map(|m| m.replica).collect(),
    };
    if let Some(baseline) = baseline {
        against_baseline(&mut run, baseline);
    }
    run
}
