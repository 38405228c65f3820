//! Prometheus histograms as figures: whether bucket counts are a cumulative histogram,
//! their quantiles as `histogram_quantile` computes them, several merged into one, and a
//! replica's latencies in either form ([`Latencies`]).

use super::samples::{percentile, sort_samples};

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
