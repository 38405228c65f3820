//! The host's noise as a bench's baseline shows it: the scale the verdicts use
//! ([`NoiseFloor`]) and the report's account of it (spread, steal, clock, what it means).

use gpushare_proto::bench::{BenchMeasurement, BenchNoise};
use gpushare_proto::plural;

use super::samples::{percentile, sort_samples};
use crate::bench::verdict;

/// The smallest difference ever told apart from noise (2 %): below it even a quiet host's
/// repeats differ.
pub const MIN_NOISE_FLOOR: f64 = verdict::MIN_DIFFERENCE;

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
