//! The one statistics module of bench and probe: pure functions, no I/O.
//!
//! - Samples: [`percentile`] (of a sample put in order by [`sort_samples`]),
//!   [`jain_index`], [`scaling`], [`slowdown`], [`inflation`].
//! - Prometheus histograms: [`histogram_quantile`], [`merge_buckets`]; [`Latencies`] holds
//!   a replica's latencies in either form.
//! - Bench: [`summarize_run`] makes a run's figures from what the orchestrator measured of
//!   each replica ([`ReplicaMeasure`]); [`recommend`] picks a strategy per replica count
//!   for an objective; [`capacity`] finds the replicas per GPU that keep an SLO, and the
//!   GPUs a fleet saves.
//! - Probe: its run summary builds the probe's own types, so it lives with them
//!   (`probe::run::summarize`) and uses these.
//!
//! Failed replicas are reported, never averaged into a figure; a figure that cannot be
//! known is `None`, never made up.

use std::cmp::Ordering;
use std::collections::BTreeSet;

use gpushare_proto::bench::{
    BenchCapacity, BenchMeasurement, BenchNoise, BenchRecommendation, BenchReplica, BenchRun,
    BenchStrategy, BenchStrategyRuns, Objective, Slo,
};
use gpushare_proto::plural;

use super::verdict;

/// The `p`-th percentile (0..=100) of `sorted` (ascending), by linear interpolation
/// between closest ranks. `None` for an empty slice.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let p = p.clamp(0.0, 100.0);
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

/// Sorts a sample ascending (NaNs last) so that [`percentile`] can read it.
pub fn sort_samples(samples: &mut [f64]) {
    samples.sort_by(|a, b| a.total_cmp(b));
}

/// Jain's fairness index `(Σx)² / (n·Σx²)`: 1.0 when all are equal, 1/n when one gets
/// everything. 1.0 for an empty or all-zero sample (nobody was treated worse).
pub fn jain_index(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let sum_sq: f64 = xs.iter().map(|x| x * x).sum();
    if xs.is_empty() || sum_sq == 0.0 {
        return 1.0;
    }
    sum * sum / (xs.len() as f64 * sum_sq)
}

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

/// Resamples of a bootstrap interval.
pub const BOOTSTRAP_RESAMPLES: usize = 2000;
/// The smallest difference ever told apart from noise (2 %): below it even a quiet host's
/// repeats differ.
pub const MIN_NOISE_FLOOR: f64 = verdict::MIN_DIFFERENCE;

/// The median of a sample (the mean of the two middle values of an even count).
fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sort_samples(&mut sorted);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// The 95 % percentile-bootstrap interval of the median of `values`
/// ([`BOOTSTRAP_RESAMPLES`] resamples, drawn by a generator seeded from the values
/// themselves, so the same measurements always give the same interval); `None` with fewer
/// than two. With 5 values or fewer it comes out as their range (a resample's median is
/// one of its smallest value more than 2.5 % of the time), which holds the median with
/// less than 95 % confidence: 75 % for 3, 88 % for 4, 94 % for 5 (the report says so).
pub fn median_interval(values: &[f64]) -> Option<[f64; 2]> {
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.len() < 2 || finite.len() != values.len() {
        return None;
    }
    let low = finite.iter().copied().fold(f64::INFINITY, f64::min);
    let high = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if finite.len() <= 3 {
        return Some([low, high]);
    }
    let mut next = verdict::seeded(&finite, &[]);
    let n = finite.len();
    let mut medians: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
        .map(|_| {
            let resample: Vec<f64> = (0..n).map(|_| finite[(next() % n as u64) as usize]).collect();
            median(&resample).unwrap_or(low)
        })
        .collect();
    sort_samples(&mut medians);
    Some([percentile(&medians, 2.5)?, percentile(&medians, 97.5)?])
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

/// The host's noise, as the verdicts ([`verdict`]) use it: one measurement's relative
/// spread ([`verdict::relative_scale`] of the baseline's measurements), for throughputs and
/// for p99s. A scale, not a range: it does not grow with the rounds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct NoiseFloor {
    /// For throughputs.
    pub throughput: f64,
    /// For p99s.
    pub p99: f64,
}

/// Largest over smallest, minus one, of at least two positive figures.
fn spread(values: &[f64]) -> Option<f64> {
    let low = values.iter().copied().fold(f64::INFINITY, f64::min);
    let high = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (values.len() > 1 && low > 0.0 && high.is_finite()).then(|| high / low - 1.0)
}

/// The host's noise as the baseline shows it (`baseline` is every measurement of one
/// replica alone): the scale of its throughputs and p99s ([`NoiseFloor`]), and for the
/// report their spread (largest over smallest), the least difference two runs measured
/// `per_run` times each can show ([`verdict::least_told`]), the replicas' CPUs' steal and
/// clock over the windows, and what it means in one sentence.
pub fn noise(
    baseline: &[BenchMeasurement],
    steal_percent: Option<f64>,
    frequency_mhz: &[f64],
    per_run: u32,
) -> (NoiseFloor, BenchNoise) {
    let ok: Vec<&BenchMeasurement> = baseline.iter().filter(|m| !m.failed).collect();
    let throughputs: Vec<f64> = ok.iter().map(|m| m.throughput_per_s).collect();
    let p99s: Option<Vec<f64>> = ok.iter().map(|m| m.p99_ms).collect();
    let baseline_spread = spread(&throughputs);
    let baseline_p99_spread = p99s.as_deref().and_then(spread);
    let scale = verdict::relative_scale(&throughputs);
    let floor = NoiseFloor {
        throughput: scale.unwrap_or(0.0),
        p99: p99s.as_deref().and_then(verdict::relative_scale).unwrap_or(0.0),
    };
    let per_run = per_run.max(1) as usize;
    let least = verdict::least_told(floor.throughput, per_run);
    let each = if per_run == 1 { "once".to_owned() } else { format!("{per_run} times") };
    let mut meaning = match scale {
        Some(s) => format!(
            "one replica alone varied {:.1} % a measurement (over {}); between runs measured \
             {each} each, differences under {} are within the noise",
            s * 100.0,
            plural(ok.len() as u32, "measurement"),
            percent_text(least),
        ),
        None => format!(
            "the baseline was measured fewer than twice, so the host's noise is unknown; \
             differences under {} are within the noise",
            percent_text(least)
        ),
    };
    if let Some(steal) = steal_percent.filter(|s| *s >= 1.0) {
        meaning.push_str(&format!("; the hypervisor took {steal:.1} % of the replicas' CPU time"));
    }
    let mut mhz: Vec<f64> = frequency_mhz.iter().copied().filter(|f| *f > 0.0).collect();
    sort_samples(&mut mhz);
    let frequency_mhz = match (mhz.first(), percentile(&mhz, 50.0), mhz.last()) {
        (Some(&low), Some(mid), Some(&high)) => Some([low, mid, high]),
        _ => None,
    };
    let noise = BenchNoise {
        baseline_spread,
        baseline_p99_spread,
        baseline_scale: scale,
        floor: least,
        steal_percent,
        frequency_mhz,
        meaning,
    };
    (floor, noise)
}

/// `0.123` as `12 %`, `0.02` as `2 %`.
fn percent_text(fraction: f64) -> String {
    format!("{:.0} %", fraction * 100.0)
}

/// Every measurement of `run`'s throughput (the one figure when it was measured once).
fn throughputs(run: &BenchRun) -> Vec<f64> {
    if run.repeat_throughputs_per_s.is_empty() {
        vec![run.throughput_per_s]
    } else {
        run.repeat_throughputs_per_s.clone()
    }
}

/// Every measurement of `run`'s pooled p99; empty without one.
fn p99s_of(run: &BenchRun) -> Vec<f64> {
    match run.p99_ms {
        _ if !run.repeat_p99s_ms.is_empty() => run.repeat_p99s_ms.clone(),
        Some(p99) => vec![p99],
        None => Vec::new(),
    }
}

/// The difference of `a` over `b` on `measure`'s figure ([`verdict::difference`]);
/// `None` where either has no usable figure.
fn difference_on(
    measure: Objective,
    a: &BenchRun,
    b: &BenchRun,
    floor: NoiseFloor,
) -> Option<verdict::Difference> {
    match measure {
        Objective::Throughput => {
            verdict::difference(&throughputs(a), &throughputs(b), floor.throughput)
        }
        Objective::Latency => verdict::difference(&p99s_of(a), &p99s_of(b), floor.p99),
    }
}

/// Whether `a` and `b` differ beyond the noise on `objective`'s figure. Runs without a
/// p99 are never alike on latency (they cannot be compared).
fn apart_on(objective: Objective, a: &BenchRun, b: &BenchRun, floor: NoiseFloor) -> bool {
    match difference_on(objective, a, b, floor) {
        Some(d) => d.apart(),
        None => objective == Objective::Latency || a.throughput_per_s != b.throughput_per_s,
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
fn beyond_n(run: &BenchRun) -> bool {
    run.scaling_warning.as_deref().is_some_and(|w| w.contains(MEASUREMENT_PROBLEM))
}

/// Aggregate scaling: the sum of the clients' throughputs over the solo throughput.
pub fn scaling(client_throughputs: &[f64], solo_throughput: f64) -> f64 {
    ratio(client_throughputs.iter().sum(), solo_throughput)
}

/// A client's slowdown: solo throughput over its own (1.0 unaffected, larger is slower).
pub fn slowdown(solo_throughput: f64, client_throughput: f64) -> f64 {
    ratio(solo_throughput, client_throughput)
}

/// Latency inflation: a latency under sharing over the solo one.
pub fn inflation(shared_ms: f64, solo_ms: f64) -> f64 {
    ratio(shared_ms, solo_ms)
}

fn ratio(num: f64, den: f64) -> f64 {
    if den > 0.0 { num / den } else { f64::INFINITY }
}

/// `num / den` when `den` is a usable divisor (finite, above zero); `None` otherwise.
fn ratio_of(num: f64, den: f64) -> Option<f64> {
    (den.is_finite() && den > 0.0).then(|| num / den)
}

/// Whether `buckets` is a cumulative Prometheus histogram: at least one bucket, upper
/// bounds strictly ascending (no NaN), the last `+Inf`, counts never decreasing. The
/// error says what is wrong, in one line.
pub fn check_buckets(buckets: &[(f64, u64)]) -> Result<(), String> {
    let Some(&(last, _)) = buckets.last() else {
        return Err("no buckets".into());
    };
    if let Some(&(le, _)) = buckets.iter().find(|(le, _)| le.is_nan()) {
        return Err(format!("a bucket's bound is {le}"));
    }
    if last != f64::INFINITY {
        return Err(format!("the last bound is le={}, not +Inf", le_text(last)));
    }
    for pair in buckets.windows(2) {
        let ((le_a, count_a), (le_b, count_b)) = (pair[0], pair[1]);
        if le_a.total_cmp(&le_b).is_ge() {
            return Err(format!(
                "bounds not ascending: le={} then le={}",
                le_text(le_a),
                le_text(le_b)
            ));
        }
        if count_b < count_a {
            return Err(format!(
                "cumulative counts decrease: {count_a} at le={} then {count_b} at le={}",
                le_text(le_a),
                le_text(le_b)
            ));
        }
    }
    Ok(())
}

/// A bound as Prometheus writes it (`+Inf` for infinity).
fn le_text(le: f64) -> String {
    if le == f64::INFINITY { "+Inf".into() } else { le.to_string() }
}

/// The `q`-quantile (0..=1) of a cumulative histogram, as Prometheus' `histogram_quantile`
/// computes it: rank = q × total; the first bucket whose cumulative count reaches the rank;
/// linear interpolation between its lower bound (the previous bucket's `le`, 0 for the
/// first bucket when its `le` is above 0) and its upper bound. A rank in the `+Inf` bucket
/// gives the largest finite bound. Where Prometheus divides 0 by 0 (q = 0 and empty lowest
/// buckets) this takes the lowest bucket that holds an observation: q = 0 is its lower
/// bound. `None` when q is outside 0..=1, there is no observation, no finite bound, or the
/// buckets are not a histogram ([`check_buckets`]).
pub fn histogram_quantile(buckets: &[(f64, u64)], q: f64) -> Option<f64> {
    if !(0.0..=1.0).contains(&q) || check_buckets(buckets).is_err() {
        return None;
    }
    let (&(_, total), finite) = buckets.split_last()?;
    if total == 0 || finite.is_empty() {
        return None;
    }
    let rank = q * total as f64;
    let Some(b) = finite.iter().position(|&(_, count)| count > 0 && count as f64 >= rank) else {
        return finite.last().map(|&(le, _)| le);
    };
    let (upper, count) = finite[b];
    if b == 0 && upper <= 0.0 {
        return Some(upper);
    }
    let (lower, below) = if b == 0 { (0.0, 0) } else { finite[b - 1] };
    // `count > below`: the bucket reaches the rank, the one before does not (or is empty).
    let in_bucket = (count - below) as f64;
    Some(lower + (upper - lower) * ((rank - below as f64) / in_bucket))
}

/// One histogram of several with the same bounds: their cumulative counts summed. An
/// error (one line) when a set is not a histogram, when bounds differ (naming the first
/// difference) or when a count overflows. No sets: no buckets.
pub fn merge_buckets(sets: &[&[(f64, u64)]]) -> Result<Vec<(f64, u64)>, String> {
    let Some((first, rest)) = sets.split_first() else {
        return Ok(Vec::new());
    };
    for (i, set) in sets.iter().enumerate() {
        check_buckets(set).map_err(|e| format!("histogram {}: {e}", i + 1))?;
    }
    let mut merged = first.to_vec();
    for (i, set) in rest.iter().enumerate() {
        let number = i + 2;
        for (k, (&(le_1, _), &(le_n, _))) in first.iter().zip(set.iter()).enumerate() {
            if le_1.total_cmp(&le_n).is_ne() {
                return Err(format!(
                    "histograms have different buckets: bucket {} is le={} in histogram 1, \
                     le={} in histogram {number}",
                    k + 1,
                    le_text(le_1),
                    le_text(le_n)
                ));
            }
        }
        if set.len() != first.len() {
            return Err(format!(
                "histograms have different buckets: {} in histogram 1, {} in histogram {number}",
                first.len(),
                set.len()
            ));
        }
        for (sum, &(le, count)) in merged.iter_mut().zip(set.iter()) {
            sum.1 = sum
                .1
                .checked_add(count)
                .ok_or_else(|| format!("bucket le={}: the summed count overflows", le_text(le)))?;
        }
    }
    Ok(merged)
}

/// A replica's latencies over a measurement window, as its method observed them.
#[derive(Debug, Clone, PartialEq)]
pub enum Latencies {
    /// One latency per unit, ms (units by line; wall times with `--until-exit`).
    Samples(Vec<f64>),
    /// A Prometheus histogram's bucket deltas over the window: (upper bound `le` in ms,
    /// cumulative count), ascending, the last bound `+Inf` (`f64::INFINITY`).
    Buckets(Vec<(f64, u64)>),
    /// Nothing was observed.
    None,
}

impl Latencies {
    /// The `p`-th percentile (0..=100), ms: of the samples ([`percentile`]), or of the
    /// buckets ([`histogram_quantile`] of `p / 100`). `None` when nothing was observed,
    /// `p` is outside 0..=100, or the buckets are not a histogram.
    pub fn percentile(&self, p: f64) -> Option<f64> {
        if !(0.0..=100.0).contains(&p) {
            return None;
        }
        match self {
            Latencies::Samples(samples) => {
                let mut sorted = samples.clone();
                sort_samples(&mut sorted);
                percentile(&sorted, p)
            }
            Latencies::Buckets(buckets) => histogram_quantile(buckets, p / 100.0),
            Latencies::None => None,
        }
    }

    /// Several replicas' latencies as one: samples concatenated, buckets merged
    /// ([`merge_buckets`]); `None` (nothing observed) adds nothing. An error when samples
    /// meet buckets, or when the buckets cannot be merged.
    pub fn pooled(all: &[&Latencies]) -> Result<Latencies, String> {
        let mut samples: Option<Vec<f64>> = None;
        let mut bucket_sets: Vec<&[(f64, u64)]> = Vec::new();
        for latencies in all {
            match latencies {
                Latencies::Samples(s) => samples.get_or_insert_with(Vec::new).extend_from_slice(s),
                Latencies::Buckets(b) => bucket_sets.push(b),
                Latencies::None => {}
            }
        }
        match (samples, bucket_sets.is_empty()) {
            (Some(_), false) => {
                Err("cannot pool per-unit latency samples with histogram buckets".into())
            }
            (Some(samples), true) => Ok(Latencies::Samples(samples)),
            (None, false) => merge_buckets(&bucket_sets).map(Latencies::Buckets),
            (None, true) => Ok(Latencies::None),
        }
    }
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

/// The largest of some finite figures.
fn largest(xs: impl Iterator<Item = f64>) -> Option<f64> {
    xs.filter(|x| x.is_finite()).max_by(f64::total_cmp)
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

/// Orders `a` before `b` when `objective` prefers it: latency, the smaller p99 (a run
/// without one last), then the larger throughput; throughput, the larger throughput, then
/// the smaller p99.
fn preference(objective: Objective, a: &BenchRun, b: &BenchRun) -> Ordering {
    let by_p99 = match (a.p99_ms, b.p99_ms) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    };
    let by_throughput = b.throughput_per_s.total_cmp(&a.throughput_per_s);
    match objective {
        Objective::Latency => by_p99.then(by_throughput),
        Objective::Throughput => by_throughput.then(by_p99),
    }
}

/// The objective that is not `objective`.
fn other(objective: Objective) -> Objective {
    match objective {
        Objective::Latency => Objective::Throughput,
        Objective::Throughput => Objective::Latency,
    }
}

/// `hi / lo` with one decimal and `x` (`3.4x`), `∞x` when `lo` is 0.
fn times(hi: f64, lo: f64) -> String {
    match ratio_of(hi, lo) {
        Some(r) if r.is_finite() => format!("{r:.1}x"),
        _ => "∞x".into(),
    }
}

/// `a`'s throughput against `b`'s: `3.4x the throughput of b`, `3.4x less throughput than
/// b`, `the same throughput as b`; without `b`'s name, the comparison alone.
fn throughput_against(a: f64, b: f64, b_name: Option<&str>) -> String {
    let (text, joint) = match a.total_cmp(&b) {
        Ordering::Greater => (format!("{} the throughput", times(a, b)), "of"),
        Ordering::Less => (format!("{} less throughput", times(b, a)), "than"),
        Ordering::Equal => ("the same throughput".to_string(), "as"),
    };
    match b_name {
        Some(name) => format!("{text} {joint} {name}"),
        None => text,
    }
}

/// `a`'s p99 against `b`'s: `p99 2.1x lower than b` / `p99 2.1x higher than b` with `b`'s
/// name, `p99 2.1x better` / `p99 2.1x worse` without; `the same p99`.
fn p99_against(a: Option<f64>, b: Option<f64>, b_name: Option<&str>) -> String {
    let (Some(a), Some(b)) = (a, b) else {
        return match b_name {
            Some(name) => format!("no p99 to compare with {name}"),
            None => "no p99 to compare".into(),
        };
    };
    match (a.total_cmp(&b), b_name) {
        (Ordering::Less, Some(name)) => format!("p99 {} lower than {name}", times(b, a)),
        (Ordering::Less, None) => format!("p99 {} better", times(b, a)),
        (Ordering::Greater, Some(name)) => format!("p99 {} higher than {name}", times(a, b)),
        (Ordering::Greater, None) => format!("p99 {} worse", times(a, b)),
        (Ordering::Equal, Some(name)) => format!("the same p99 as {name}"),
        (Ordering::Equal, None) => "the same p99".into(),
    }
}

/// `a`'s figure on `measure` against `b`'s: as [`throughput_against`] or [`p99_against`]
/// where they differ beyond the noise, else `throughput within the noise of b` /
/// `p99 within the noise`.
fn against(
    measure: Objective,
    a: &BenchRun,
    b: &BenchRun,
    b_name: Option<&str>,
    floor: NoiseFloor,
) -> String {
    if measure == Objective::Throughput && (beyond_n(a) || beyond_n(b)) {
        let who = if beyond_n(a) { "its" } else { "the other's" };
        return match b_name {
            Some(name) => format!(
                "throughput not compared with {name}: {who} scaling is above N, a measurement \
                 problem, not a gain"
            ),
            None => format!("throughput not compared: {who} scaling is above N"),
        };
    }
    if !apart_on(measure, a, b, floor) && (measure == Objective::Throughput || a.p99_ms.is_some()) {
        let what = match measure {
            Objective::Throughput => "throughput",
            Objective::Latency => "p99",
        };
        return match b_name {
            Some(name) => format!("{what} within the noise of {name}"),
            None => format!("{what} within the noise"),
        };
    }
    match measure {
        Objective::Throughput => throughput_against(a.throughput_per_s, b.throughput_per_s, b_name),
        Objective::Latency => p99_against(a.p99_ms, b.p99_ms, b_name),
    }
}

/// `a` against `b` (named `b_name`), the objective's measure first:
/// `3.4x the throughput of b, p99 2.1x worse` or `p99 2.1x lower than b, 3.4x less
/// throughput`; a difference within the noise is said to be.
fn contrast(
    objective: Objective,
    a: &BenchRun,
    b_name: &str,
    b: &BenchRun,
    floor: NoiseFloor,
) -> String {
    format!(
        "{}, {}",
        against(objective, a, b, Some(b_name), floor),
        against(other(objective), a, b, None, floor)
    )
}

/// Text on one line: runs of whitespace (newlines included) as one space.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// How well a strategy isolates its replicas from each other, most first: the order the
/// recommendation picks by among strategies the measurements cannot tell apart.
const ISOLATION: [BenchStrategy; 4] =
    [BenchStrategy::Mig, BenchStrategy::MpsLimited, BenchStrategy::Mps, BenchStrategy::TimeSlicing];

/// A strategy's place in [`ISOLATION`] (unknown names last).
fn isolation_rank(name: &str) -> usize {
    name.parse::<BenchStrategy>()
        .ok()
        .and_then(|s| ISOLATION.iter().position(|i| *i == s))
        .unwrap_or(ISOLATION.len())
}

/// A run's figure on `measure` for people, with its interval where it has one:
/// `181-205 units/s`, `183.2 units/s`, `p99 4.1-4.6 ms`.
fn figure_text(measure: Objective, run: &BenchRun, rate: &str) -> String {
    match (measure, run.throughput_interval, run.p99_ms, run.p99_interval_ms) {
        (Objective::Throughput, Some([low, high]), _, _) => format!("{low:.1}-{high:.1} {rate}"),
        (Objective::Throughput, None, _, _) => format!("{:.1} {rate}", run.throughput_per_s),
        (Objective::Latency, _, _, Some([low, high])) => format!("p99 {low:.2}-{high:.2} ms"),
        (Objective::Latency, _, Some(p99), None) => format!("p99 {p99:.2} ms"),
        (Objective::Latency, _, None, None) => "no p99".into(),
    }
}

/// Per replica count (ascending), the strategy `objective` picks among the runs with no
/// error and no failed replica (skipped strategies aside), and why, in one line.
///
/// The best run on the objective's figure is compared with every other: those it cannot
/// be told apart from ([`verdict::difference`]: the interval of the ratio of their medians,
/// at least the host's noise band, reaches within 2 % of equal) are **within the noise**
/// of it (`indistinguishable`), and among them the pick is
/// the best isolated ([`ISOLATION`]), said so, with the figures. Otherwise the pick is
/// the best, with the other side's cost against the strategy the other objective picks,
/// or, when both pick the same, against the runner-up. Strategies left out are named
/// with the reason. With no candidate the strategy is `none`. Throughputs are given in
/// `rate` (`units/s`).
pub fn recommend(
    strategies: &[BenchStrategyRuns],
    objective: Objective,
    rate: &str,
    floor: NoiseFloor,
) -> Vec<BenchRecommendation> {
    let counts: BTreeSet<u32> =
        strategies.iter().flat_map(|s| s.runs.iter().map(|r| r.replicas)).collect();
    counts.into_iter().map(|n| recommend_at(strategies, objective, n, rate, floor)).collect()
}

/// [`recommend`] at `n` replicas.
fn recommend_at(
    strategies: &[BenchStrategyRuns],
    objective: Objective,
    n: u32,
    rate: &str,
    floor: NoiseFloor,
) -> BenchRecommendation {
    let mut candidates: Vec<(&str, &BenchRun)> = Vec::new();
    let mut left_out: Vec<String> = Vec::new();
    for s in strategies.iter().filter(|s| s.skipped.is_none()) {
        let name = s.strategy.as_str();
        match s.runs.iter().find(|r| r.replicas == n) {
            None => left_out.push(format!("{name} left out: no run with {}", plural(n, "replica"))),
            Some(run) => match &run.error {
                Some(e) => left_out.push(format!("{name} left out: {}", one_line(e))),
                None if run.failed > 0 => left_out.push(format!(
                    "{name} left out: {} of {} failed",
                    run.failed,
                    plural(run.replicas, "replica")
                )),
                None => candidates.push((name, run)),
            },
        }
    }
    let best = |objective: Objective, except: &dyn Fn(usize) -> bool| {
        candidates
            .iter()
            .enumerate()
            .filter(|(i, _)| !except(*i))
            .min_by(|(_, a), (_, b)| preference(objective, a.1, b.1))
            .map(|(i, &(name, run))| (i, name, run))
    };
    let top = best(objective, &|_| false);
    // Those the measurements cannot tell from the best on the objective's figure.
    let alike: Vec<usize> = match top {
        Some((i, _, top_run)) => (0..candidates.len())
            .filter(|&j| j == i || !apart_on(objective, top_run, candidates[j].1, floor))
            .collect(),
        None => Vec::new(),
    };
    let mut indistinguishable = Vec::new();
    let (strategy, mut reason) = match (top, best(other(objective), &|_| false)) {
        (Some(_), _) if alike.len() > 1 => {
            let mut tied: Vec<usize> = alike.clone();
            tied.sort_by_key(|&j| isolation_rank(candidates[j].0));
            let (pick_name, pick_run) = candidates[tied[0]];
            indistinguishable = tied.iter().map(|&j| candidates[j].0.to_string()).collect();
            let figures: Vec<String> = tied
                .iter()
                .map(|&j| {
                    format!("{} {}", candidates[j].0, figure_text(objective, candidates[j].1, rate))
                })
                .collect();
            let mut text = format!(
                "within the noise of each other: {}; picked by isolation (MIG, then \
                 MPS-limited, MPS, time-slicing)",
                figures.join(", "),
            );
            if let Some((_, o_name, o_run)) = best(objective, &|j| alike.contains(&j)) {
                text.push_str(&format!(
                    "; {}",
                    contrast(objective, pick_run, o_name, o_run, floor)
                ));
            }
            (pick_name, text)
        }
        (Some((i, name, run)), Some((j, other_name, other_run))) if candidates.len() > 1 => {
            if i != j {
                (name, contrast(objective, run, other_name, other_run, floor))
            } else {
                let runner_up = best(objective, &|k| k == i);
                let against = runner_up.map_or(String::new(), |(_, r_name, r_run)| {
                    format!(
                        "; against the runner-up, {}",
                        contrast(objective, run, r_name, r_run, floor)
                    )
                });
                (name, format!("best on both throughput and p99{against}"))
            }
        }
        (Some((_, name, run)), _) => {
            let p99 = run.p99_ms.map_or("no p99".into(), |p| format!("p99 {p:.1} ms"));
            // The only one asked for is not "the only one that ran" (issue 27's wording).
            let only = if left_out.is_empty() {
                "the only strategy benched".to_owned()
            } else {
                format!("the only strategy that ran {} without failures", plural(n, "replica"))
            };
            (name, format!("{only} ({:.1} {rate}, {p99})", run.throughput_per_s))
        }
        _ => ("none", format!("no strategy ran {} without failures", plural(n, "replica"))),
    };
    for why in left_out {
        reason.push_str("; ");
        reason.push_str(&why);
    }
    BenchRecommendation { replicas: n, strategy: strategy.into(), reason, indistinguishable }
}

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

#[cfg(test)]
mod known_data;

#[cfg(test)]
mod tests {
    use super::*;

    const INF: f64 = f64::INFINITY;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    fn close_some(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| close(a, b))
    }

    // --- samples ---

    #[test]
    fn percentiles_interpolate_between_ranks() {
        let mut xs: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        sort_samples(&mut xs);
        assert_eq!(percentile(&xs, 0.0), Some(1.0));
        assert_eq!(percentile(&xs, 100.0), Some(100.0));
        assert!(close(percentile(&xs, 50.0).unwrap(), 50.5));
        assert!(close(percentile(&xs, 99.0).unwrap(), 99.01));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[1.0, 3.0], 150.0), Some(3.0));
    }

    #[test]
    fn jain_is_one_when_equal_and_one_over_n_when_one_takes_all() {
        assert!(close(jain_index(&[5.0, 5.0, 5.0, 5.0]), 1.0));
        assert!(close(jain_index(&[9.0, 0.0, 0.0]), 1.0 / 3.0));
        assert!(close(jain_index(&[1.0, 3.0]), 16.0 / 20.0));
        assert!(close(jain_index(&[]), 1.0));
        assert!(close(jain_index(&[0.0, 0.0]), 1.0));
    }

    #[test]
    fn scaling_slowdown_and_inflation() {
        assert!(close(scaling(&[25.0, 25.0, 25.0, 25.0], 100.0), 1.0));
        assert!(close(scaling(&[90.0; 4], 100.0), 3.6));
        assert!(close(slowdown(100.0, 25.0), 4.0));
        assert!(close(inflation(1.0, 0.04), 25.0));
        assert!(scaling(&[1.0], 0.0).is_infinite());
    }

    // --- histograms ---

    /// 10 observations: 2 up to 1 ms, 4 in (1, 2], 2 in (2, 4], 2 above 4.
    fn histogram() -> Vec<(f64, u64)> {
        vec![(1.0, 2), (2.0, 6), (4.0, 8), (INF, 10)]
    }

    #[test]
    fn histogram_quantiles_interpolate_within_the_bucket_like_prometheus() {
        let h = histogram();
        // Rank 5: bucket (1, 2] holds ranks 2..6, 3 of its 4 in: 1 + 0.75.
        assert!(close_some(histogram_quantile(&h, 0.5), 1.75));
        // Rank 1: the first bucket, from 0: half of it.
        assert!(close_some(histogram_quantile(&h, 0.1), 0.5));
        // Rank 8: exactly the top of (2, 4].
        assert!(close_some(histogram_quantile(&h, 0.8), 4.0));
        // Ranks in the +Inf bucket: the largest finite bound.
        assert_eq!(histogram_quantile(&h, 0.9), Some(4.0));
        assert_eq!(histogram_quantile(&h, 1.0), Some(4.0));
        // q = 0: the lower bound of the lowest bucket holding an observation.
        assert_eq!(histogram_quantile(&h, 0.0), Some(0.0));
        assert_eq!(histogram_quantile(&[(1.0, 0), (2.0, 3), (INF, 3)], 0.0), Some(1.0));
        // A first bound at or below 0 is the answer for ranks in the first bucket.
        assert_eq!(histogram_quantile(&[(-1.0, 2), (1.0, 4), (INF, 4)], 0.25), Some(-1.0));
    }

    #[test]
    fn histogram_quantiles_have_no_answer_without_observations_or_a_histogram() {
        let h = histogram();
        assert_eq!(histogram_quantile(&[(1.0, 0), (INF, 0)], 0.5), None);
        assert_eq!(histogram_quantile(&[(INF, 5)], 0.5), None);
        assert_eq!(histogram_quantile(&[], 0.5), None);
        for q in [-0.1, 1.1, f64::NAN] {
            assert_eq!(histogram_quantile(&h, q), None, "q = {q}");
        }
        // Not a histogram: no +Inf, bounds out of order, counts decreasing, a NaN bound.
        assert_eq!(histogram_quantile(&[(1.0, 2), (2.0, 6)], 0.5), None);
        assert_eq!(histogram_quantile(&[(2.0, 2), (1.0, 6), (INF, 6)], 0.5), None);
        assert_eq!(histogram_quantile(&[(1.0, 6), (2.0, 2), (INF, 6)], 0.5), None);
        assert_eq!(histogram_quantile(&[(f64::NAN, 6), (INF, 6)], 0.5), None);
    }

    #[test]
    fn buckets_are_checked_with_a_reason() {
        assert_eq!(check_buckets(&histogram()), Ok(()));
        assert_eq!(check_buckets(&[]).unwrap_err(), "no buckets");
        assert_eq!(check_buckets(&[(1.0, 2)]).unwrap_err(), "the last bound is le=1, not +Inf");
        assert_eq!(
            check_buckets(&[(1.0, 2), (1.0, 3), (INF, 3)]).unwrap_err(),
            "bounds not ascending: le=1 then le=1"
        );
        assert_eq!(
            check_buckets(&[(1.0, 4), (INF, 3)]).unwrap_err(),
            "cumulative counts decrease: 4 at le=1 then 3 at le=+Inf"
        );
    }

    #[test]
    fn histograms_with_the_same_bounds_merge_by_summing_counts() {
        let a = [(1.0, 1), (2.0, 3), (INF, 4)];
        let b = [(1.0, 2), (2.0, 2), (INF, 5)];
        assert_eq!(merge_buckets(&[&a, &b]), Ok(vec![(1.0, 3), (2.0, 5), (INF, 9)]));
        assert_eq!(merge_buckets(&[&a]), Ok(a.to_vec()));
        assert_eq!(merge_buckets(&[]), Ok(Vec::new()));
    }

    #[test]
    fn histograms_with_different_bounds_do_not_merge() {
        let a = [(1.0, 1), (2.0, 3), (INF, 4)];
        let moved = [(1.0, 1), (2.5, 3), (INF, 4)];
        assert_eq!(
            merge_buckets(&[&a, &a, &moved]).unwrap_err(),
            "histograms have different buckets: bucket 2 is le=2 in histogram 1, le=2.5 in \
             histogram 3"
        );
        let fewer = [(1.0, 1), (INF, 4)];
        assert_eq!(
            merge_buckets(&[&a, &fewer]).unwrap_err(),
            "histograms have different buckets: bucket 2 is le=2 in histogram 1, le=+Inf in \
             histogram 2"
        );
        let broken = [(1.0, 1)];
        assert_eq!(
            merge_buckets(&[&a, &broken]).unwrap_err(),
            "histogram 2: the last bound is le=1, not +Inf"
        );
        let full = [(1.0, u64::MAX), (INF, u64::MAX)];
        let one = [(1.0, 1), (INF, 1)];
        assert_eq!(
            merge_buckets(&[&full, &one]).unwrap_err(),
            "bucket le=1: the summed count overflows"
        );
    }

    // --- Latencies ---

    #[test]
    fn latencies_give_percentiles_of_samples_and_of_buckets() {
        let samples = Latencies::Samples(vec![4.0, 1.0, 3.0, 2.0]);
        assert!(close_some(samples.percentile(50.0), 2.5));
        assert_eq!(samples.percentile(100.0), Some(4.0));
        assert_eq!(samples.percentile(0.0), Some(1.0));
        assert_eq!(samples.percentile(100.5), None);
        assert_eq!(Latencies::Samples(Vec::new()).percentile(50.0), None);
        let buckets = Latencies::Buckets(histogram());
        assert!(close_some(buckets.percentile(50.0), 1.75));
        assert_eq!(buckets.percentile(99.0), Some(4.0));
        assert_eq!(buckets.percentile(-1.0), None);
        assert_eq!(Latencies::None.percentile(50.0), None);
    }

    #[test]
    fn latencies_pool_by_kind_and_refuse_to_mix() {
        let a = Latencies::Samples(vec![1.0, 2.0]);
        let b = Latencies::Samples(vec![3.0]);
        assert_eq!(
            Latencies::pooled(&[&a, &Latencies::None, &b]),
            Ok(Latencies::Samples(vec![1.0, 2.0, 3.0]))
        );
        let h = Latencies::Buckets(histogram());
        assert_eq!(
            Latencies::pooled(&[&h, &h]),
            Ok(Latencies::Buckets(vec![(1.0, 4), (2.0, 12), (4.0, 16), (INF, 20)]))
        );
        assert_eq!(Latencies::pooled(&[&Latencies::None]), Ok(Latencies::None));
        assert_eq!(Latencies::pooled(&[]), Ok(Latencies::None));
        assert_eq!(
            Latencies::pooled(&[&a, &h]).unwrap_err(),
            "cannot pool per-unit latency samples with histogram buckets"
        );
        let other = Latencies::Buckets(vec![(5.0, 1), (INF, 1)]);
        assert!(Latencies::pooled(&[&h, &other]).unwrap_err().contains("different buckets"));
    }

    // --- summarize_run ---

    fn replica(index: u32, failed: bool) -> BenchReplica {
        BenchReplica {
            index,
            pid: 1000 + index,
            device: "0".into(),
            outcome: if failed { "exit 3".into() } else { "stopped".into() },
            failed,
            seconds: 10.0,
            units: 0,
            throughput_per_s: 0.0,
            p50_ms: None,
            p99_ms: None,
            slowdown: None,
            gpu_memory_bytes: Some(1 << 30),
            malformed_lines: 0,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
            output_dropped_bytes: 0,
        }
    }

    fn measure(
        index: u32,
        failed: bool,
        units: u64,
        seconds: f64,
        latencies: Latencies,
    ) -> ReplicaMeasure {
        ReplicaMeasure { replica: replica(index, failed), units, seconds, latencies }
    }

    /// One replica alone: 10 units/s, p50 2 ms, p99 4 ms.
    fn baseline() -> BenchRun {
        let mut run = summarize_run(
            1,
            "alone".into(),
            vec![measure(0, false, 100, 10.0, Latencies::Samples(vec![2.0; 5]))],
            None,
        );
        run.p99_ms = Some(4.0);
        run
    }

    #[test]
    fn the_baseline_is_a_run_of_one_without_comparisons() {
        let run = baseline();
        assert!(close(run.throughput_per_s, 10.0));
        assert_eq!((run.units, run.seconds, run.failed), (100, 10.0, 0));
        assert_eq!(run.per_replica[0].units, 100);
        assert!(close(run.per_replica[0].throughput_per_s, 10.0));
        assert_eq!(run.per_replica[0].slowdown, None);
        assert_eq!((run.scaling, run.p50_inflation, run.max_slowdown), (None, None, None));
        assert_eq!(run.jain_fairness, Some(1.0));
    }

    #[test]
    fn a_run_is_summarized_over_the_replicas_that_did_not_fail() {
        let base = baseline();
        let measures = vec![
            // Out of order on purpose: the report lists replicas by index.
            measure(2, true, 3, 4.0, Latencies::Samples(vec![100.0])),
            measure(0, false, 50, 10.0, Latencies::Samples(vec![3.0, 1.0, 2.0])),
            measure(1, false, 20, 10.0, Latencies::Samples(vec![5.0])),
        ];
        let run = summarize_run(3, "MPS".into(), measures, Some(&base));
        assert_eq!((run.replicas, run.setup.as_str(), run.error.as_deref()), (3, "MPS", None));
        let indexes: Vec<u32> = run.per_replica.iter().map(|r| r.index).collect();
        assert_eq!(indexes, [0, 1, 2]);

        let [r0, r1, r2] = &run.per_replica[..] else { panic!("three replicas") };
        assert_eq!(r0.units, 50);
        assert!(close(r0.throughput_per_s, 5.0));
        assert!(close_some(r0.p50_ms, 2.0));
        assert!(close_some(r0.p99_ms, 2.98));
        assert!(close_some(r0.slowdown, 2.0));
        assert!(close(r1.throughput_per_s, 2.0));
        assert_eq!((r1.p50_ms, r1.p99_ms), (Some(5.0), Some(5.0)));
        assert!(close_some(r1.slowdown, 5.0));
        // The failed one is reported with its figures, never compared.
        assert!(r2.failed);
        assert_eq!(r2.units, 3);
        assert!(close(r2.throughput_per_s, 0.75));
        assert_eq!(r2.p50_ms, Some(100.0));
        assert_eq!(r2.slowdown, None);
        assert_eq!(r2.outcome, "exit 3");
        assert_eq!(r2.gpu_memory_bytes, Some(1 << 30));

        // The run: replicas 0 and 1 only.
        assert_eq!(run.failed, 1);
        assert_eq!(run.units, 70);
        assert_eq!(run.seconds, 10.0);
        assert!(close(run.throughput_per_s, 7.0));
        assert!(close_some(run.scaling, 0.7));
        // Pooled [1, 2, 3, 5]: p50 at rank 1.5, p99 at rank 2.97.
        assert!(close_some(run.p50_ms, 2.5));
        assert!(close_some(run.p99_ms, 4.94));
        assert!(close_some(run.p50_inflation, 1.25));
        assert!(close_some(run.p99_inflation, 1.235));
        assert!(close_some(run.jain_fairness, 49.0 / 58.0));
        assert!(close_some(run.max_slowdown, 5.0));
    }

    #[test]
    fn a_run_where_every_replica_failed_has_no_figures() {
        let base = baseline();
        let measures = vec![
            measure(0, true, 5, 3.0, Latencies::Samples(vec![1.0])),
            measure(1, true, 0, 4.0, Latencies::None),
        ];
        let run = summarize_run(2, "time-slicing".into(), measures, Some(&base));
        assert_eq!(run.failed, 2);
        assert_eq!(run.units, 0);
        assert_eq!(run.throughput_per_s, 0.0);
        assert_eq!(run.seconds, 4.0);
        assert_eq!((run.scaling, run.p50_ms, run.p99_ms), (None, None, None));
        assert_eq!((run.p50_inflation, run.p99_inflation), (None, None));
        assert_eq!((run.jain_fairness, run.max_slowdown), (None, None));
        assert!(run.per_replica.iter().all(|r| r.slowdown.is_none()));
    }

    #[test]
    fn without_a_baseline_or_a_window_there_is_nothing_to_compare() {
        let measures = vec![
            measure(0, false, 10, 2.0, Latencies::Samples(vec![1.0])),
            measure(1, false, 10, 2.0, Latencies::Samples(vec![1.0])),
        ];
        let run = summarize_run(2, "mps".into(), measures, None);
        assert!(close(run.throughput_per_s, 10.0));
        assert_eq!((run.scaling, run.max_slowdown, run.p50_inflation), (None, None, None));
        assert_eq!(run.jain_fairness, Some(1.0));
        assert!(run.per_replica.iter().all(|r| r.slowdown.is_none()));

        // A replica measured over no time has no throughput, so no slowdown, and the
        // slowest replica's slowdown is not known.
        let base = baseline();
        let measures = vec![
            measure(0, false, 10, 2.0, Latencies::Samples(vec![1.0])),
            measure(1, false, 10, 0.0, Latencies::Samples(vec![1.0])),
        ];
        let run = summarize_run(2, "mps".into(), measures, Some(&base));
        assert_eq!(run.per_replica[1].throughput_per_s, 0.0);
        assert_eq!(run.per_replica[1].slowdown, None);
        assert!(close_some(run.per_replica[0].slowdown, 2.0));
        assert_eq!(run.max_slowdown, None);
    }

    #[test]
    fn until_exit_runs_count_one_unit_per_replica_and_its_wall_time() {
        let base = summarize_run(
            1,
            "alone".into(),
            vec![measure(0, false, 1, 2.0, Latencies::Samples(vec![2000.0]))],
            None,
        );
        let measures = vec![
            measure(0, false, 1, 4.0, Latencies::Samples(vec![4000.0])),
            measure(1, false, 1, 5.0, Latencies::Samples(vec![5000.0])),
        ];
        let run = summarize_run(2, "mps".into(), measures, Some(&base));
        assert_eq!((run.units, run.seconds), (2, 5.0));
        assert!(close(run.throughput_per_s, 0.25 + 0.2));
        assert!(close_some(run.scaling, 0.9));
        assert!(close_some(run.max_slowdown, 2.5));
        assert!(close_some(run.p50_ms, 4500.0));
        assert!(close_some(run.p50_inflation, 2.25));
    }

    #[test]
    fn histogram_runs_pool_their_buckets() {
        let measures = vec![
            measure(0, false, 10, 1.0, Latencies::Buckets(histogram())),
            measure(1, false, 10, 1.0, Latencies::Buckets(histogram())),
        ];
        let run = summarize_run(2, "mps".into(), measures, None);
        assert!(close_some(run.per_replica[0].p50_ms, 1.75));
        assert!(close_some(run.p50_ms, 1.75));
        assert_eq!(run.p99_ms, Some(4.0));

        // Bounds that differ cannot be pooled: no run latency, each replica keeps its own.
        let measures = vec![
            measure(0, false, 10, 1.0, Latencies::Buckets(histogram())),
            measure(1, false, 10, 1.0, Latencies::Buckets(vec![(8.0, 10), (INF, 10)])),
        ];
        let run = summarize_run(2, "mps".into(), measures, None);
        assert_eq!((run.p50_ms, run.p99_ms), (None, None));
        assert!(close_some(run.per_replica[1].p50_ms, 4.0));
    }

    // --- recommend ---

    fn run(replicas: u32, throughput: f64, p99: Option<f64>) -> BenchRun {
        BenchRun {
            replicas,
            setup: String::new(),
            seconds: 30.0,
            units: 0,
            throughput_per_s: throughput,
            scaling: None,
            p50_ms: None,
            p99_ms: p99,
            p50_inflation: None,
            p99_inflation: None,
            jain_fairness: None,
            max_slowdown: None,
            failed: 0,
            error: None,
            agent_cpu_percent: None,
            setup_ms: None,
            repeat_throughputs_per_s: Vec::new(),
            repeat_p99s_ms: Vec::new(),
            throughput_interval: None,
            p99_interval_ms: None,
            scaling_warning: None,
            per_replica: Vec::new(),
        }
    }

    fn failed(mut run: BenchRun, failed: u32) -> BenchRun {
        run.failed = failed;
        run
    }

    fn broken(mut run: BenchRun, error: &str) -> BenchRun {
        run.error = Some(error.into());
        run
    }

    fn strategy(name: &str, runs: Vec<BenchRun>) -> BenchStrategyRuns {
        BenchStrategyRuns { strategy: name.into(), skipped: None, runs }
    }

    fn skipped(name: &str, why: &str) -> BenchStrategyRuns {
        BenchStrategyRuns { strategy: name.into(), skipped: Some(why.into()), runs: Vec::new() }
    }

    /// A host without noise: every difference is real.
    const QUIET: NoiseFloor = NoiseFloor { throughput: 0.0, p99: 0.0 };

    fn only(strategies: &[BenchStrategyRuns], objective: Objective) -> BenchRecommendation {
        let mut all = recommend(strategies, objective, "units/s", QUIET);
        assert_eq!(all.len(), 1, "{all:?}");
        all.remove(0)
    }

    #[test]
    fn each_objective_shows_its_cost_against_the_other_objectives_pick() {
        let strategies = [
            strategy("time-slicing", vec![run(3, 10.0, Some(2.0))]),
            strategy("mps", vec![run(3, 34.0, Some(4.2))]),
            skipped("mig", "not MIG-capable"),
        ];
        let t = only(&strategies, Objective::Throughput);
        assert_eq!((t.replicas, t.strategy.as_str()), (3, "mps"));
        assert_eq!(t.reason, "3.4x the throughput of time-slicing, p99 2.1x worse");
        let l = only(&strategies, Objective::Latency);
        assert_eq!(l.strategy, "time-slicing");
        assert_eq!(l.reason, "p99 2.1x lower than mps, 3.4x less throughput");
    }

    #[test]
    fn a_strategy_best_on_both_is_compared_with_the_runner_up() {
        let strategies = [
            strategy("time-slicing", vec![run(3, 10.0, Some(3.0))]),
            strategy("mps", vec![run(3, 34.0, Some(1.0))]),
            strategy("mps-limited", vec![run(3, 17.0, Some(2.0))]),
        ];
        let t = only(&strategies, Objective::Throughput);
        assert_eq!(
            t.reason,
            "best on both throughput and p99; against the runner-up, 2.0x the throughput \
             of mps-limited, p99 2.0x better"
        );
        let l = only(&strategies, Objective::Latency);
        assert_eq!(l.strategy, "mps");
        assert_eq!(
            l.reason,
            "best on both throughput and p99; against the runner-up, p99 2.0x lower than \
             mps-limited, 2.0x the throughput"
        );
    }

    #[test]
    fn equal_figures_are_indistinguishable_and_isolation_picks() {
        // Same throughput: nothing tells them apart on the objective's figure.
        let strategies = [
            strategy("time-slicing", vec![run(3, 10.0, Some(3.0))]),
            strategy("mps", vec![run(3, 10.0, Some(2.0))]),
        ];
        let r = only(&strategies, Objective::Throughput);
        assert_eq!(r.strategy, "mps");
        assert_eq!(r.indistinguishable, ["mps", "time-slicing"]);
        assert_eq!(
            r.reason,
            "within the noise of each other: mps 10.0 units/s, time-slicing 10.0 units/s; \
             picked by isolation (MIG, then MPS-limited, MPS, time-slicing)"
        );
        // On latency the p99s differ: mps is simply better.
        let r = only(&strategies, Objective::Latency);
        assert_eq!(r.strategy, "mps");
        assert!(r.indistinguishable.is_empty());
        assert!(r.reason.starts_with("best on both throughput and p99"), "{}", r.reason);
    }

    /// A run measured several times: its median throughput and the interval of it.
    fn repeated(n: u32, throughputs: &[f64], p99: f64) -> BenchRun {
        let runs = throughputs.iter().map(|&t| run(n, t, Some(p99))).collect();
        cell_run(runs).unwrap()
    }

    #[test]
    fn a_difference_inside_the_hosts_noise_is_never_a_verdict() {
        // issue 27: at N=1 time-slicing "gave 1.2x the throughput of mps-limited"; the
        // baseline alone varied 25 %.
        let strategies = [
            strategy("time-slicing", vec![run(1, 240.0, Some(5.0))]),
            strategy("mps-limited", vec![run(1, 200.0, Some(5.5))]),
        ];
        let noisy = NoiseFloor { throughput: 0.25, p99: 0.25 };
        let r = recommend(&strategies, Objective::Throughput, "units/s", noisy).remove(0);
        assert_eq!(r.strategy, "mps-limited");
        assert_eq!(r.indistinguishable, ["mps-limited", "time-slicing"]);
        assert!(
            r.reason.starts_with(
                "within the noise of each other: mps-limited 200.0 units/s, time-slicing 240.0 \
                 units/s; picked by isolation"
            ),
            "{}",
            r.reason
        );
        assert!(!r.reason.contains("1.2x"), "{}", r.reason);
        // The same figures on a quiet host are a difference.
        let r = recommend(&strategies, Objective::Throughput, "units/s", QUIET).remove(0);
        assert_eq!(r.strategy, "time-slicing");
        assert!(r.reason.contains("1.2x the throughput of mps-limited"), "{}", r.reason);
    }

    #[test]
    fn overlapping_intervals_are_indistinguishable_and_apart_ones_are_not() {
        let floor = NoiseFloor { throughput: 0.05, p99: 0.05 };
        let strategies = [
            strategy("time-slicing", vec![repeated(3, &[180.0, 230.0, 205.0], 4.0)]),
            strategy("mps", vec![repeated(3, &[190.0, 215.0, 240.0], 4.0)]),
            strategy("mps-limited", vec![repeated(3, &[400.0, 420.0, 410.0], 3.0)]),
        ];
        let r = recommend(&strategies, Objective::Throughput, "units/s", floor).remove(0);
        // mps-limited's interval is apart from both: a real difference, said with its ratio.
        assert_eq!(r.strategy, "mps-limited");
        assert!(r.indistinguishable.is_empty());
        assert!(r.reason.contains("1.9x the throughput of mps"), "{}", r.reason);
        // Without it, mps and time-slicing overlap (180-230 and 190-240).
        let r = recommend(&strategies[..2], Objective::Throughput, "units/s", floor).remove(0);
        assert_eq!((r.strategy.as_str(), r.indistinguishable.len()), ("mps", 2));
        assert!(
            r.reason.contains("mps 190.0-240.0 units/s, time-slicing 180.0-230.0 units/s"),
            "{}",
            r.reason
        );
        assert!(!r.reason.contains("x the throughput"), "{}", r.reason);
        // A runner-up outside the tie is compared with the pick.
        let strategies = [
            strategy("time-slicing", vec![repeated(3, &[100.0, 101.0, 102.0], 4.0)]),
            strategy("mps", vec![repeated(3, &[300.0, 305.0, 310.0], 4.0)]),
            strategy("mig", vec![repeated(3, &[299.0, 303.0, 306.0], 4.0)]),
        ];
        let r = recommend(&strategies, Objective::Throughput, "units/s", floor).remove(0);
        assert_eq!(r.strategy, "mig");
        assert!(
            r.reason.ends_with("; 3.0x the throughput of time-slicing, p99 within the noise"),
            "{}",
            r.reason
        );
    }

    #[test]
    fn median_intervals_are_bootstrapped_and_repeatable() {
        assert_eq!(median_interval(&[5.0]), None);
        assert_eq!(median_interval(&[5.0, 3.0]), Some([3.0, 5.0]));
        assert_eq!(median_interval(&[5.0, 3.0, 4.0]), Some([3.0, 5.0]));
        assert_eq!(median_interval(&[5.0, f64::NAN, 4.0]), None);
        let values = [10.0, 11.0, 9.5, 10.2, 30.0, 10.1, 9.9, 10.4, 10.0];
        let [low, high] = median_interval(&values).unwrap();
        assert!(low >= 9.5 && high <= 11.0 && low < high, "{low} {high}");
        // The same measurements give the same interval, every time.
        assert_eq!(median_interval(&values), Some([low, high]));
        let cell = cell_run(vec![run(2, 10.0, Some(1.0)), run(2, 12.0, Some(3.0))]).unwrap();
        assert_eq!(cell.throughput_interval, Some([10.0, 12.0]));
        assert_eq!(cell.p99_interval_ms, Some([1.0, 3.0]));
        // A failed measurement is reported, and no interval is made around it.
        let cell = cell_run(vec![run(2, 10.0, None), failed(run(2, 12.0, None), 1)]).unwrap();
        assert_eq!((cell.failed, cell.throughput_interval), (1, None));
    }

    #[test]
    fn a_scaling_above_n_is_flagged_not_reported_as_a_gain() {
        // The host's noise: 2 % a measurement; one baseline and one run, measured once each.
        let floor = NoiseFloor { throughput: 0.02, p99: 0.02 };
        let alone = run(1, 10.0, None);
        let mut r = run(2, 21.0, None);
        r.scaling = Some(2.10);
        check_scaling(&mut r, &alone, floor);
        assert_eq!(
            r.scaling_warning.as_deref(),
            Some("scaling 2.10x is above 2, within the noise: read it as 2x")
        );
        let mut r = run(2, 26.0, None);
        r.scaling = Some(2.6);
        check_scaling(&mut r, &alone, floor);
        assert!(beyond_n(&r), "{:?}", r.scaling_warning);
        assert!(r.scaling_warning.as_deref().unwrap().contains("a measurement problem"));
        // The recommendation never calls it a gain (issue 37: "1.3x the throughput" in the
        // recommendation, "a measurement problem, not a gain" under the table).
        let strategies = [
            strategy("time-slicing", vec![run(2, 20.0, Some(2.0))]),
            strategy("mig", vec![r.clone()]),
        ];
        let rec = recommend(&strategies, Objective::Throughput, "units/s", floor).remove(0);
        assert!(!rec.reason.contains("1.3x"), "{}", rec.reason);
        assert!(rec.reason.contains("not a gain"), "{}", rec.reason);
        let mut r = run(2, 19.0, None);
        r.scaling = Some(1.9);
        check_scaling(&mut r, &alone, floor);
        assert_eq!(r.scaling_warning, None);
    }

    fn measurement(throughput: f64, p99: f64) -> BenchMeasurement {
        BenchMeasurement {
            round: 1,
            strategy: "baseline".into(),
            replicas: 1,
            at_seconds: 0.0,
            throughput_per_s: throughput,
            p99_ms: Some(p99),
            worst_p99_ms: Some(p99),
            failed: false,
        }
    }

    #[test]
    fn the_noise_is_the_baselines_scale() {
        let baseline = [measurement(100.0, 2.0), measurement(112.0, 2.2), measurement(105.0, 2.0)];
        let (floor, found) = noise(&baseline, Some(3.5), &[2400.0, 3100.0, 2900.0], 1);
        // Three measurements: their standard deviation over their mean.
        let near = |a: f64, b: f64| (a - b).abs() < 1e-3;
        assert!(near(floor.throughput, 0.0570) && near(floor.p99, 0.0559), "{floor:?}");
        assert!(close_some(found.baseline_spread, 0.12));
        assert_eq!(found.frequency_mhz, Some([2400.0, 2900.0, 3100.0]));
        assert_eq!(
            found.meaning,
            "one replica alone varied 5.7 % a measurement (over 3 measurements); between runs \
             measured once each, differences under 19 % are within the noise; the hypervisor \
             took 3.5 % of the replicas' CPU time"
        );
        // More rounds: a smaller least difference from the same host.
        let (_, six) = noise(&baseline, None, &[], 6);
        assert!(six.floor < found.floor / 2.0, "{} {}", six.floor, found.floor);
        // A quiet host still has a least difference.
        let (_, quiet) = noise(&[measurement(100.0, 2.0), measurement(100.0, 2.0)], None, &[], 1);
        assert!(near(quiet.floor, MIN_NOISE_FLOOR), "{}", quiet.floor);
        assert_eq!((quiet.steal_percent, quiet.frequency_mhz), (None, None));
    }

    #[test]
    fn comparisons_with_the_baseline_are_made_again_from_its_median() {
        let mut r = run(2, 30.0, Some(4.0));
        r.per_replica = vec![
            BenchReplica { throughput_per_s: 10.0, ..replica(0, false) },
            BenchReplica { throughput_per_s: 20.0, ..replica(1, false) },
        ];
        let base = run(1, 20.0, Some(2.0));
        against_baseline(&mut r, &base);
        assert!(close_some(r.scaling, 1.5) && close_some(r.p99_inflation, 2.0));
        assert!(close_some(r.max_slowdown, 2.0));
        assert!(close_some(r.per_replica[1].slowdown, 1.0));
    }

    #[test]
    fn comparisons_word_every_direction_right() {
        assert_eq!(throughput_against(34.0, 10.0, Some("ts")), "3.4x the throughput of ts");
        assert_eq!(throughput_against(10.0, 34.0, Some("mps")), "3.4x less throughput than mps");
        assert_eq!(throughput_against(10.0, 10.0, Some("mps")), "the same throughput as mps");
        assert_eq!(throughput_against(34.0, 10.0, None), "3.4x the throughput");
        assert_eq!(throughput_against(10.0, 34.0, None), "3.4x less throughput");
        assert_eq!(throughput_against(10.0, 10.0, None), "the same throughput");
        assert_eq!(throughput_against(3.0, 0.0, Some("ts")), "∞x the throughput of ts");
        assert_eq!(p99_against(Some(4.2), Some(2.0), None), "p99 2.1x worse");
        assert_eq!(p99_against(Some(2.0), Some(4.2), None), "p99 2.1x better");
        assert_eq!(p99_against(Some(2.0), Some(2.0), None), "the same p99");
        assert_eq!(p99_against(Some(4.2), Some(2.0), Some("ts")), "p99 2.1x higher than ts");
        assert_eq!(p99_against(Some(2.0), Some(4.2), Some("mps")), "p99 2.1x lower than mps");
        assert_eq!(p99_against(Some(2.0), Some(2.0), Some("mps")), "the same p99 as mps");
        assert_eq!(p99_against(None, Some(2.0), None), "no p99 to compare");
        assert_eq!(p99_against(Some(2.0), None, Some("mps")), "no p99 to compare with mps");
        assert_eq!(p99_against(Some(0.0), Some(2.0), None), "p99 ∞x better");
    }

    #[test]
    fn strategies_with_failures_are_left_out_and_named() {
        let strategies = [
            strategy("time-slicing", vec![run(5, 10.0, Some(2.0))]),
            strategy("mps", vec![failed(run(5, 34.0, Some(4.2)), 1)]),
            strategy("mig", vec![broken(run(5, 0.0, None), "5 instances do not fit\nat all")]),
        ];
        let r = only(&strategies, Objective::Throughput);
        assert_eq!(r.strategy, "time-slicing");
        assert_eq!(
            r.reason,
            "the only strategy that ran 5 replicas without failures \
             (10.0 units/s, p99 2.0 ms); mps left out: 1 of 5 replicas failed; mig left out: 5 \
             instances do not fit at all"
        );
    }

    #[test]
    fn with_no_candidate_the_recommendation_is_none() {
        let strategies = [
            strategy("time-slicing", vec![failed(run(5, 10.0, Some(2.0)), 2)]),
            strategy("mig", vec![broken(run(5, 0.0, None), "not enough slices")]),
            skipped("mps", "no MPS"),
        ];
        let r = only(&strategies, Objective::Latency);
        assert_eq!((r.replicas, r.strategy.as_str()), (5, "none"));
        assert_eq!(
            r.reason,
            "no strategy ran 5 replicas without failures; time-slicing left out: 2 of 5 \
             replicas failed; mig left out: not enough slices"
        );
    }

    #[test]
    fn recommendations_come_per_replica_count_ascending() {
        let strategies = [
            strategy(
                "time-slicing",
                vec![run(5, 10.0, Some(9.0)), run(1, 10.0, Some(1.0)), run(3, 10.0, Some(3.0))],
            ),
            strategy("mps", vec![run(1, 10.0, Some(1.0)), run(3, 30.0, Some(3.5))]),
        ];
        let all = recommend(&strategies, Objective::Throughput, "units/s", QUIET);
        let picks: Vec<(u32, &str)> =
            all.iter().map(|r| (r.replicas, r.strategy.as_str())).collect();
        assert_eq!(picks, [(1, "mps"), (3, "mps"), (5, "time-slicing")]);
        assert_eq!(
            all[2].reason,
            "the only strategy that ran 5 replicas without failures \
             (10.0 units/s, p99 9.0 ms); mps left out: no run with 5 replicas"
        );
        assert!(recommend(&[], Objective::Latency, "units/s", QUIET).is_empty());
    }

    #[test]
    fn a_strategy_benched_alone_is_not_called_the_only_one_that_ran() {
        let strategies = [strategy("mig", vec![run(1, 10.0, Some(1.0))])];
        let all = recommend(&strategies, Objective::Throughput, "units/s", QUIET);
        assert_eq!(all[0].strategy, "mig");
        // The strategy is its own field: the reason does not repeat it ("mig - mig: …").
        assert_eq!(all[0].reason, "the only strategy benched (10.0 units/s, p99 1.0 ms)");
    }

    #[test]
    fn latency_ranks_runs_without_a_p99_last() {
        let strategies = [
            strategy("time-slicing", vec![run(3, 50.0, None)]),
            strategy("mps", vec![run(3, 10.0, Some(2.0))]),
        ];
        let r = only(&strategies, Objective::Latency);
        assert_eq!(r.strategy, "mps");
        assert_eq!(r.reason, "no p99 to compare with time-slicing, 5.0x less throughput");
    }

    // --- capacity ---

    /// A run whose replicas' p99s are `p99s` and whose slowest replica is `slowdown`
    /// times slower than alone.
    fn measured(p99s: &[Option<f64>], slowdown: Option<f64>) -> BenchRun {
        let mut r = run(p99s.len() as u32, 10.0, None);
        r.per_replica = p99s
            .iter()
            .enumerate()
            .map(|(i, p99)| BenchReplica { p99_ms: *p99, ..replica(i as u32, false) })
            .collect();
        r.max_slowdown = slowdown;
        r
    }

    fn p99s(values: &[f64]) -> Vec<Option<f64>> {
        values.iter().copied().map(Some).collect()
    }

    #[test]
    fn capacity_is_the_largest_count_keeping_the_p99() {
        let strategies = [strategy(
            "mps",
            vec![
                measured(&p99s(&[10.0]), None),
                measured(&p99s(&[20.0, 30.0, 25.0]), None),
                measured(&p99s(&[41.2, 40.0, 12.0, 30.0, 3.0]), None),
                measured(&p99s(&[63.0, 30.0, 1.0, 1.0, 1.0, 1.0, 1.0]), None),
            ],
        )];
        let c = capacity(&strategies, Slo::P99Ms(50.0), 100, QUIET, &[]);
        assert_eq!(c.len(), 1);
        let c = &c[0];
        assert_eq!((c.strategy.as_str(), c.replicas_per_gpu, c.gpus_needed), ("mps", 5, 20));
        assert!(close(c.saving, 0.8));
        assert_eq!(
            c.reason,
            "5 per GPU: worst replica's p99 41.2 ms ≤ 50 ms; at 7 worst replica's p99 63.0 ms; 100 replicas on 20 GPUs instead \
             of 100: 80 % fewer"
        );
    }

    #[test]
    fn a_count_within_the_noise_of_the_slo_does_not_keep_it() {
        let strategies = [strategy(
            "mps",
            vec![measured(&p99s(&[10.0]), None), measured(&p99s(&[30.0, 48.0]), None)],
        )];
        let worst = |p99| BenchMeasurement {
            strategy: "mps".into(),
            replicas: 2,
            worst_p99_ms: Some(p99),
            ..measurement(1.0, p99)
        };
        // Measured three times at N=2: worst p99 44-53 ms straddles 50 ms.
        let sequence = [worst(48.0), worst(44.0), worst(53.0)];
        let c = &capacity(&strategies, Slo::P99Ms(50.0), 100, QUIET, &sequence)[0];
        assert_eq!(c.replicas_per_gpu, 1);
        assert!(
            c.reason
                .contains("; at 2 within the noise of 50 ms: worst replica's p99 44.0-53.0 ms;"),
            "{}",
            c.reason
        );
        // A noisy host (10 % a measurement) alone does the same for a run measured once.
        let noisy = NoiseFloor { throughput: 0.1, p99: 0.1 };
        let c = &capacity(&strategies, Slo::P99Ms(50.0), 100, noisy, &[])[0];
        assert_eq!(c.replicas_per_gpu, 1);
        assert!(
            c.reason.contains("at 2 within the noise of 50 ms: worst replica's p99 39.5-58.4 ms"),
            "{}",
            c.reason
        );
        // Clearly under it: kept.
        let c = &capacity(&strategies, Slo::P99Ms(60.0), 100, noisy, &sequence)[0];
        assert_eq!(c.replicas_per_gpu, 2);
    }

    #[test]
    fn the_median_measurement_is_reported_with_every_throughput() {
        let three = vec![run(1, 300.0, None), run(1, 100.0, None), run(1, 200.0, None)];
        let median = median_run(three).unwrap();
        assert_eq!(median.throughput_per_s, 200.0);
        assert_eq!(median.repeat_throughputs_per_s, [300.0, 100.0, 200.0]);
        assert!((median.repeat_spread().unwrap() - 2.0).abs() < 1e-12);
        // An even count reports the lower middle one.
        let two = median_run(vec![run(1, 300.0, None), run(1, 100.0, None)]).unwrap();
        assert_eq!(two.throughput_per_s, 100.0);
        // Once: as measured, no list.
        let once = median_run(vec![run(1, 300.0, None)]).unwrap();
        assert!(once.repeat_throughputs_per_s.is_empty());
        assert_eq!(once.repeat_spread(), None);
        assert!(median_run(Vec::new()).is_none());
    }

    #[test]
    fn a_failed_measurement_is_reported_not_outvoted() {
        let runs = vec![run(3, 300.0, None), failed(run(3, 200.0, None), 1), run(3, 250.0, None)];
        let reported = median_run(runs).unwrap();
        assert_eq!((reported.failed, reported.throughput_per_s), (1, 200.0));
        let runs = vec![run(3, 300.0, None), broken(run(3, 0.0, None), "cancelled")];
        assert_eq!(median_run(runs).unwrap().error.as_deref(), Some("cancelled"));
    }

    #[test]
    fn four_per_gpu_put_a_fleet_of_100_on_25_gpus() {
        let strategies = [strategy(
            "mps-limited",
            vec![
                measured(&p99s(&[1.0; 4]), Some(1.5)),
                measured(&p99s(&[1.0; 2]), Some(1.2)),
                measured(&p99s(&[1.0]), Some(1.0)),
            ],
        )];
        let c = &capacity(&strategies, Slo::Slowdown(2.0), 100, QUIET, &[])[0];
        assert_eq!((c.replicas_per_gpu, c.gpus_needed), (4, 25));
        assert!(close(c.saving, 0.75));
        assert_eq!(
            c.reason,
            "4 per GPU: max slowdown 1.5x ≤ 2x; the most measured; 100 replicas on 25 GPUs \
             instead of 100: 75 % fewer"
        );
        // A fleet that does not divide evenly needs one GPU more.
        let c = &capacity(&strategies, Slo::Slowdown(2.0), 10, QUIET, &[])[0];
        assert_eq!(c.gpus_needed, 3);
        assert!(close(c.saving, 0.7));
        let c = &capacity(&strategies, Slo::Slowdown(2.0), 0, QUIET, &[])[0];
        assert_eq!((c.gpus_needed, c.saving), (0, 0.0));
    }

    #[test]
    fn a_smaller_count_that_breaks_the_slo_ends_the_search() {
        let strategies = [
            strategy(
                "time-slicing",
                vec![
                    measured(&p99s(&[1.0]), Some(1.0)),
                    failed(measured(&p99s(&[1.0; 3]), Some(1.0)), 1),
                    measured(&p99s(&[1.0; 5]), Some(1.0)),
                ],
            ),
            strategy(
                "mps",
                vec![
                    measured(&p99s(&[1.0]), Some(1.0)),
                    broken(measured(&p99s(&[1.0; 3]), Some(1.0)), "MPS did not start"),
                ],
            ),
            strategy(
                "mps-limited",
                vec![measured(&p99s(&[1.0]), Some(1.0)), measured(&p99s(&[1.0; 3]), None)],
            ),
            skipped("mig", "not MIG-capable"),
        ];
        let all = capacity(&strategies, Slo::Slowdown(2.0), 100, QUIET, &[]);
        let per_gpu: Vec<(&str, u32)> =
            all.iter().map(|c| (c.strategy.as_str(), c.replicas_per_gpu)).collect();
        assert_eq!(per_gpu, [("time-slicing", 1), ("mps", 1), ("mps-limited", 1)]);
        assert!(all[0].reason.contains("; at 3 1 of 3 replicas failed;"), "{}", all[0].reason);
        assert!(all[1].reason.contains("; at 3: MPS did not start;"), "{}", all[1].reason);
        assert!(all[2].reason.contains("; at 3 no slowdown was measured;"), "{}", all[2].reason);
        assert_eq!(all[0].gpus_needed, 100);
        assert_eq!(all[0].saving, 0.0);
    }

    #[test]
    fn a_replica_without_a_p99_does_not_keep_it() {
        let strategies = [strategy(
            "mps",
            vec![measured(&p99s(&[1.0]), None), measured(&[Some(1.0), None], None)],
        )];
        let c = &capacity(&strategies, Slo::P99Ms(50.0), 100, QUIET, &[])[0];
        assert_eq!(c.replicas_per_gpu, 1);
        assert!(c.reason.contains("; at 2 replica 1 has no p99;"), "{}", c.reason);
    }

    #[test]
    fn a_strategy_that_never_keeps_the_slo_has_no_capacity() {
        let strategies = [
            strategy("mps", vec![measured(&p99s(&[63.0]), None), measured(&p99s(&[1.0; 3]), None)]),
            strategy("mig", Vec::new()),
        ];
        let all = capacity(&strategies, Slo::P99Ms(50.0), 100, QUIET, &[]);
        assert_eq!((all[0].replicas_per_gpu, all[0].gpus_needed, all[0].saving), (0, 0, 0.0));
        assert_eq!(
            all[0].reason,
            "no replica count kept p99=50ms: at 1 worst replica's p99 63.0 ms"
        );
        assert_eq!(all[1].reason, "no replica count kept p99=50ms: no run was measured");
    }
}
