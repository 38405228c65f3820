//! Figures of plain samples: percentiles, medians and the bootstrap interval of a median,
//! Jain's index, and the ratios every comparison is made of (scaling, slowdown,
//! inflation).

use crate::bench::verdict;

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

/// Resamples of a bootstrap interval.
pub const BOOTSTRAP_RESAMPLES: usize = 2000;

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
pub(super) fn ratio_of(num: f64, den: f64) -> Option<f64> {
    (den.is_finite() && den > 0.0).then(|| num / den)
}

/// The largest of some finite figures.
pub(super) fn largest(xs: impl Iterator<Item = f64>) -> Option<f64> {
    xs.filter(|x| x.is_finite()).max_by(f64::total_cmp)
}
