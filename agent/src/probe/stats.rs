//! Pure statistics of the probe: percentiles, Jain's fairness index, scaling, slowdown,
//! latency inflation, the summary of a run from its clients' reports, and the strategy a
//! comparison recommends.

use gpushare_proto::Strategy;
use gpushare_proto::types::{Recommendation, StrategyRuns};

use super::{ClientResult, ClientStats, RunResult};

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

/// A run's summary from the solo baseline and the clients that ran together.
pub fn summarize(solo: &ClientResult, clients: Vec<ClientResult>, seconds: f64) -> RunResult {
    let throughputs: Vec<f64> = clients.iter().map(|c| c.throughput_per_s).collect();
    let per_client = clients
        .iter()
        .map(|c| ClientStats {
            pid: c.pid,
            throughput_per_s: c.throughput_per_s,
            p50_ms: c.p50_ms,
            p99_ms: c.p99_ms,
            slowdown: slowdown(solo.throughput_per_s, c.throughput_per_s),
        })
        .collect();
    let n = clients.len().max(1) as f64;
    let mean_p50 = clients.iter().map(|c| c.p50_ms).sum::<f64>() / n;
    let worst_p99 = clients.iter().map(|c| c.p99_ms).fold(0.0, f64::max);
    RunResult {
        workload: solo.workload,
        clients: clients.len(),
        seconds,
        solo_throughput_per_s: solo.throughput_per_s,
        solo_p50_ms: solo.p50_ms,
        solo_p99_ms: solo.p99_ms,
        per_client,
        aggregate_throughput_per_s: throughputs.iter().sum(),
        scaling: scaling(&throughputs, solo.throughput_per_s),
        jain_fairness: jain_index(&throughputs),
        p50_inflation: inflation(mean_p50, solo.p50_ms),
        p99_inflation: inflation(worst_p99, solo.p99_ms),
        max_late_ms: clients.iter().map(|c| c.late_ms).fold(0.0, f64::max),
        solo: solo.clone(),
        client_results: clients,
    }
}

/// The least gain over time-slicing that makes a recommendation of MPS.
pub const MEANINGFUL_GAIN: f64 = 1.25;

/// The strategy with the best aggregate scaling at `clients` for `workload`; time-slicing
/// unless another does at least a quarter more work: below that the gain is within what
/// runs vary by, and not worth MPS's weaker fault isolation.
pub fn recommend(workload: &str, clients: usize, comparison: &[StrategyRuns]) -> Recommendation {
    let scaling = |strategy: &StrategyRuns| {
        strategy
            .runs
            .iter()
            .find(|r| r.workload == workload && r.clients as usize == clients)
            .map(|r| r.scaling)
    };
    let figures: Vec<(&str, f64)> =
        comparison.iter().filter_map(|s| scaling(s).map(|v| (s.strategy.as_str(), v))).collect();
    let listed: Vec<String> = figures.iter().map(|(s, v)| format!("{s} {v:.2}x")).collect();
    let time_slicing = Strategy::TimeSlicing.as_str();
    let ts = figures.iter().find(|(s, _)| *s == time_slicing).map_or(0.0, |f| f.1);
    let best =
        figures.iter().copied().fold((time_slicing, ts), |a, b| if b.1 > a.1 { b } else { a });
    let (strategy, reason) = if best.0 != time_slicing && best.1 >= ts * MEANINGFUL_GAIN {
        (
            best.0,
            format!(
                "{:.1}x the work of time-slicing with {clients} clients ({})",
                best.1 / ts.max(f64::MIN_POSITIVE),
                listed.join(", ")
            ),
        )
    } else {
        (
            time_slicing,
            format!(
                "no meaningful gain from MPS with {clients} clients (less than 25 % more work: {})",
                listed.join(", ")
            ),
        )
    };
    Recommendation { workload: workload.into(), strategy: strategy.into(), reason }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::{Achieved, DeviceInfo, Workload};

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

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

    fn client(pid: u32, tput: f64, p50: f64, p99: f64) -> ClientResult {
        ClientResult {
            workload: Workload::Launch,
            pid,
            steps: (tput * 3.0) as u64,
            seconds: 3.0,
            throughput_per_s: tput,
            p50_ms: p50,
            p99_ms: p99,
            mean_ms: p50,
            achieved: Achieved {
                value: 1.0,
                limit: 2.0,
                unit: "TFLOP/s".into(),
                fraction_of_limit: 0.5,
                limit_basis: String::new(),
            },
            late_ms: f64::from(pid) / 10.0,
            kernels: "nvrtc".into(),
            device: DeviceInfo {
                name: "test".into(),
                compute_capability: (9, 0),
                sm_count: 132,
                sm_clock_mhz: 1980.0,
                memory_clock_mhz: 2619.0,
                memory_bus_bits: 5120,
                memory_bandwidth_bytes_per_s: 3.35e12,
                fp32_peak_flops: 66.9e12,
                fp32_lanes_per_sm: 128,
            },
        }
    }

    #[test]
    fn a_run_is_summarized_against_its_solo_baseline() {
        let solo = client(1, 1000.0, 1.0, 2.0);
        let run =
            summarize(&solo, vec![client(2, 500.0, 2.0, 3.0), client(3, 250.0, 4.0, 8.0)], 3.0);
        assert_eq!(run.clients, 2);
        assert!(close(run.aggregate_throughput_per_s, 750.0));
        assert!(close(run.scaling, 0.75));
        assert!(close(run.per_client[0].slowdown, 2.0));
        assert!(close(run.per_client[1].slowdown, 4.0));
        assert!(close(run.jain_fairness, 750.0 * 750.0 / (2.0 * (250_000.0 + 62_500.0))));
        assert!(close(run.p50_inflation, 3.0));
        assert!(close(run.p99_inflation, 4.0));
        assert!(close(run.max_late_ms, 0.3));
        // The JSON form round-trips.
        let json = serde_json::to_string(&run).unwrap();
        assert_eq!(serde_json::from_str::<RunResult>(&json).unwrap(), run);
    }

    fn run(workload: &str, clients: u32, scaling: f64) -> gpushare_proto::types::ProbeRun {
        gpushare_proto::types::ProbeRun {
            workload: workload.into(),
            clients,
            solo_throughput_per_s: 1.0,
            solo_p50_ms: 1.0,
            solo_achieved: String::new(),
            scaling,
            jain_fairness: 1.0,
            p50_inflation: 1.0,
            p99_inflation: 1.0,
            per_client: Vec::new(),
        }
    }

    #[test]
    fn recommendations_need_a_quarter_more_work_than_time_slicing() {
        let comparison = vec![
            StrategyRuns {
                strategy: "time-slicing".into(),
                runs: vec![run("launch", 7, 0.25), run("compute", 7, 0.89)],
            },
            StrategyRuns {
                strategy: "mps".into(),
                runs: vec![run("launch", 7, 5.55), run("compute", 7, 1.01)],
            },
            StrategyRuns {
                strategy: "mps-limited".into(),
                runs: vec![run("launch", 7, 4.8), run("compute", 7, 0.97)],
            },
        ];
        let launch = recommend("launch", 7, &comparison);
        assert_eq!(launch.strategy, "mps");
        assert!(
            launch.reason.starts_with("22.2x the work of time-slicing with 7 clients"),
            "{}",
            launch.reason
        );
        let compute = recommend("compute", 7, &comparison);
        assert_eq!(compute.strategy, "time-slicing");
        assert!(compute.reason.starts_with("no meaningful gain"), "{}", compute.reason);
    }
}
