//! The bench's test of a difference: whether two runs' figures differ beyond what the
//! host's noise and their own measurements allow (issue 37). Pure functions, no I/O;
//! [`super::stats`] words the verdicts.
//!
//! - The host's noise is a *scale*, [`relative_scale`]: one measurement's relative standard
//!   deviation, from the baseline's measurements (from 6 on robustly: 1.4826 × their
//!   median absolute deviation over their median). Unlike their range, it does not grow
//!   with the number of measurements.
//! - A difference is the ratio of the two runs' medians with an interval
//!   ([`difference`]): the band `exp(±1.96 · s · √(1/n_a + 1/n_b))`, `s` the larger of the
//!   host's scale and the two runs' own spread (a run measured once has none of its own),
//!   and from 6 measurements a side at least the seeded percentile bootstrap interval of
//!   the ratio of medians ([`ratio_interval`]: the same measurements always give the same
//!   interval).
//! - Two figures are told apart ([`Difference::tells`]) only when that interval lies
//!   wholly beyond [`MIN_DIFFERENCE`] either way. Every part narrows as rounds are added:
//!   more rounds never make the bench less able to tell.

use std::cmp::Ordering;

/// The normal quantile of a two-sided 95 % interval.
pub const Z95: f64 = 1.96;
/// Resamples of a bootstrap interval.
pub const RESAMPLES: usize = 2000;
/// The smallest difference ever told apart (2 %): below it even a quiet host's repeats
/// differ, and nobody picks a strategy for it.
pub const MIN_DIFFERENCE: f64 = 0.02;
/// From how many measurements the scale is the robust one (MAD-based).
pub const ROBUST_FROM: usize = 6;
/// Median absolute deviation to standard deviation, for normally spread measurements.
const MAD_TO_SD: f64 = 1.4826;

/// The median of finite values (the mean of the two middle ones of an even count).
fn median(values: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// One measurement's relative spread: of at least [`ROBUST_FROM`] positive figures,
/// robustly, 1.4826 × MAD / median (one odd measurement does not make it); of fewer, their
/// standard deviation over their mean (a MAD of 3 is one of their deviations, mostly far
/// below the spread); `None` for fewer than two, or any that is not positive and finite.
pub fn relative_scale(values: &[f64]) -> Option<f64> {
    if values.len() < 2 || values.iter().any(|v| !v.is_finite() || *v <= 0.0) {
        return None;
    }
    if values.len() < ROBUST_FROM {
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
        return Some(variance.sqrt() / mean);
    }
    let mid = median(values)?;
    let deviations: Vec<f64> = values.iter().map(|v| (v - mid).abs()).collect();
    Some(MAD_TO_SD * median(&deviations)? / mid)
}

/// The half-width, in log-ratio units, of the band the host's noise (`scale`, one
/// measurement's relative spread) alone gives the ratio of two runs measured `n_a` and
/// `n_b` times: `1.96 · scale · √(1/n_a + 1/n_b)`.
pub fn noise_half_width(scale: f64, n_a: usize, n_b: usize) -> f64 {
    let (a, b) = (n_a.max(1) as f64, n_b.max(1) as f64);
    Z95 * scale.max(0.0) * (1.0 / a + 1.0 / b).sqrt()
}

/// The smallest relative difference two runs measured `n` times each can show on a host
/// of noise `scale`: the noise band's edge, at least [`MIN_DIFFERENCE`].
pub fn least_told(scale: f64, n: usize) -> f64 {
    ((1.0 + MIN_DIFFERENCE) * noise_half_width(scale, n, n).exp()) - 1.0
}

/// A generator seeded from the measurements themselves (splitmix64): the same values, the
/// same stream (the bootstrap intervals of medians and of ratios).
pub(super) fn seeded(a: &[f64], b: &[f64]) -> impl FnMut() -> u64 + use<> {
    let mut state = a
        .iter()
        .chain(b)
        .fold(0x9E37_79B9_7F4A_7C15_u64, |h, v| (h ^ v.to_bits()).wrapping_mul(0x100_0000_01B3));
    move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The 95 % percentile-bootstrap interval of `median(a) / median(b)`: each side resampled
/// on its own, [`RESAMPLES`] times, by a generator seeded from the values (the same
/// measurements always give the same interval). Both measured once: the ratio itself.
/// `None` when either side is empty or holds a figure that is not positive and finite.
pub fn ratio_interval(a: &[f64], b: &[f64]) -> Option<[f64; 2]> {
    let usable = |v: &[f64]| !v.is_empty() && v.iter().all(|x| x.is_finite() && *x > 0.0);
    if !usable(a) || !usable(b) {
        return None;
    }
    if a.len() == 1 && b.len() == 1 {
        let r = a[0] / b[0];
        return Some([r, r]);
    }
    let mut next = seeded(a, b);
    let mut resample = |v: &[f64], buffer: &mut Vec<f64>| {
        buffer.clear();
        buffer.extend((0..v.len()).map(|_| v[(next() % v.len() as u64) as usize]));
        median(buffer).unwrap_or(f64::NAN)
    };
    let (mut ba, mut bb) = (Vec::with_capacity(a.len()), Vec::with_capacity(b.len()));
    let mut ratios: Vec<f64> =
        (0..RESAMPLES).map(|_| resample(a, &mut ba) / resample(b, &mut bb)).collect();
    ratios.sort_by(f64::total_cmp);
    let at = |p: f64| {
        let rank = p * (ratios.len() - 1) as f64;
        let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
        ratios[lo] + (ratios[hi] - ratios[lo]) * (rank - lo as f64)
    };
    Some([at(0.025), at(0.975)])
}

/// The difference between two runs' figures: the ratio of their medians and its interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Difference {
    /// `median(a) / median(b)`.
    pub ratio: f64,
    /// Where the ratio may lie: the bootstrap interval widened to the host's noise band.
    pub interval: [f64; 2],
}

impl Difference {
    /// `Greater` when `a` is told above `b` (the interval wholly above `1 +
    /// MIN_DIFFERENCE`), `Less` when told below, `Equal` when the measurements cannot tell.
    pub fn tells(&self) -> Ordering {
        let [low, high] = self.interval;
        if low > 1.0 + MIN_DIFFERENCE {
            Ordering::Greater
        } else if high < 1.0 / (1.0 + MIN_DIFFERENCE) {
            Ordering::Less
        } else {
            Ordering::Equal
        }
    }

    /// Whether the two are told apart either way.
    pub fn apart(&self) -> bool {
        self.tells() != Ordering::Equal
    }
}

/// The two runs' own relative spread, pooled (each [`relative_scale`], weighed by its
/// measurements less one); `None` where neither was measured twice.
fn pooled_scale(a: &[f64], b: &[f64]) -> Option<f64> {
    let parts: Vec<(f64, f64)> =
        [a, b].iter().filter_map(|v| Some((relative_scale(v)?, v.len() as f64 - 1.0))).collect();
    let weight: f64 = parts.iter().map(|(_, w)| w).sum();
    (weight > 0.0).then(|| (parts.iter().map(|(s, w)| s * s * w).sum::<f64>() / weight).sqrt())
}

/// `a` (every measurement of one run's figure) against `b`, on a host of noise `scale`
/// ([`relative_scale`] of the baseline). The ratio's interval is the band the host's noise
/// gives it ([`noise_half_width`]); from [`ROBUST_FROM`] measurements on each side, the
/// band of the larger of the host's scale and the two runs' own, widened to the bootstrap
/// interval of the ratio ([`ratio_interval`]). Fewer measurements tell too little of
/// their own spread: a percentile bootstrap of them is about their range, whose
/// confidence grows with the count (75 % of 3, 94 % of 5), and a spread of 2 or 3 swings
/// widely; either would let a difference told at 2 rounds go untold at 3. `None` when
/// either side has no usable measurement.
pub fn difference(a: &[f64], b: &[f64], scale: f64) -> Option<Difference> {
    let [low, high] = ratio_interval(a, b)?;
    let ratio = median(a)? / median(b)?;
    let robust = a.len().min(b.len()) >= ROBUST_FROM;
    let own = if robust { pooled_scale(a, b).unwrap_or(0.0) } else { 0.0 };
    let band = noise_half_width(own.max(scale), a.len(), b.len()).exp();
    let mut interval = [ratio / band, ratio * band];
    if robust {
        interval = [interval[0].min(low), interval[1].max(high)];
    }
    Some(Difference { ratio, interval })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic normal sample (Box-Muller over splitmix64).
    pub(crate) fn normal(seed: u64) -> impl FnMut() -> f64 {
        let mut next = seeded(&[seed as f64 + 0.5], &[]);
        move || {
            let u = |x: u64| ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            let (u1, u2) = (u(next()), u(next()));
            (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
        }
    }

    #[test]
    fn the_scale_is_robust_and_does_not_grow_with_the_count() {
        // One odd measurement among quiet ones: the range says 48 %, the scale a few.
        let quiet = [118.0, 150.0, 155.0, 158.0, 160.0, 175.0];
        let s = relative_scale(&quiet).unwrap();
        assert!(s < 0.06, "{s}");
        // Many draws of 5 % noise: the scale stays near 5 % however many there are.
        let mut z = normal(7);
        let draws: Vec<f64> = (0..400).map(|_| 100.0 * (1.0 + 0.05 * z())).collect();
        for n in [10, 50, 100, 400] {
            let s = relative_scale(&draws[..n]).unwrap();
            assert!((0.03..0.07).contains(&s), "n {n}: {s}");
        }
        assert_eq!(relative_scale(&[1.0]), None);
        assert_eq!(relative_scale(&[1.0, -1.0, 2.0]), None);
    }

    #[test]
    fn ratio_intervals_are_repeatable_and_hold_the_ratio() {
        let a = [600.0, 560.0, 650.0, 500.0, 718.0, 614.0];
        let b = [463.0, 447.0, 489.0, 452.0, 475.0, 466.0];
        let one = ratio_interval(&a, &b).unwrap();
        assert_eq!(one, ratio_interval(&a, &b).unwrap());
        let d = difference(&a, &b, 0.0).unwrap();
        assert!(one[0] < d.ratio && d.ratio < one[1], "{one:?} {d:?}");
        assert_eq!(ratio_interval(&[2.0], &[1.0]), Some([2.0, 2.0]));
        assert_eq!(ratio_interval(&[], &[1.0]), None);
        assert_eq!(ratio_interval(&[0.0], &[1.0]), None);
    }

    #[test]
    fn runs_measured_once_are_told_apart_only_beyond_the_hosts_noise() {
        // 5 % noise a measurement: the ratio of two single ones varies ±14 % (95 %).
        let d = difference(&[110.0], &[100.0], 0.05).unwrap();
        assert_eq!(d.tells(), Ordering::Equal, "{d:?}");
        let d = difference(&[125.0], &[100.0], 0.05).unwrap();
        assert_eq!(d.tells(), Ordering::Greater, "{d:?}");
        let d = difference(&[100.0], &[125.0], 0.05).unwrap();
        assert_eq!(d.tells(), Ordering::Less, "{d:?}");
        // Below the least difference ever told, a silent host does not make one.
        let d = difference(&[101.5], &[100.0], 0.0).unwrap();
        assert!(!d.apart(), "{d:?}");
    }

    #[test]
    fn the_least_difference_told_shrinks_with_the_rounds() {
        let mut last = f64::INFINITY;
        for n in 1..=10 {
            let least = least_told(0.05, n);
            assert!(least < last && least >= MIN_DIFFERENCE, "n {n}: {least}");
            last = least;
        }
    }
}
