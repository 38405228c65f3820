//! The one statistics module of bench and probe: pure functions, no I/O. Its parts, each
//! a file of `stats/`, are re-exported here, so callers name `stats::…` alone.
//!
//! - Samples (`samples.rs`): [`percentile`] (of a sample put in order by
//!   [`sort_samples`]), [`median_interval`], [`jain_index`], [`scaling`], [`slowdown`],
//!   [`inflation`].
//! - Prometheus histograms (`buckets.rs`): [`histogram_quantile`], [`merge_buckets`];
//!   [`Latencies`] holds a replica's latencies in either form.
//! - The host's noise (`noise.rs`): [`noise`], [`NoiseFloor`].
//! - A run (`runs.rs`): [`summarize_run`] makes a run's figures from what the orchestrator
//!   measured of each replica ([`ReplicaMeasure`]); [`cell_run`] the median of a cell's
//!   measurements; [`against_baseline`], [`check_scaling`].
//! - Answers: [`recommend`] (`recommend.rs`) picks a strategy per replica count for an
//!   objective; [`capacity`] (`capacity.rs`) finds the replicas per GPU that keep an SLO,
//!   and the GPUs a fleet saves.
//! - Probe: its run summary builds the probe's own types, so it lives with them
//!   (`probe::run::summarize`) and uses these.
//!
//! Failed replicas are reported, never averaged into a figure; a figure that cannot be
//! known is `None`, never made up.

mod buckets;
mod capacity;
mod noise;
mod recommend;
mod runs;
mod samples;

pub use buckets::{Latencies, check_buckets, histogram_quantile, merge_buckets};
pub use capacity::capacity;
pub use noise::{MIN_NOISE_FLOOR, NoiseFloor, noise};
pub use recommend::recommend;
pub use runs::{
    ReplicaMeasure, against_baseline, cell_run, check_scaling, median_run, summarize_run,
};
pub use samples::{
    BOOTSTRAP_RESAMPLES, inflation, jain_index, median_interval, percentile, scaling, slowdown,
    sort_samples,
};

#[cfg(test)]
mod known_data;

#[cfg(test)]
mod tests {
    use super::recommend::{p99_against, throughput_against};
    use super::runs::beyond_n;
    use super::*;
    use gpushare_proto::bench::{
        BenchMeasurement, BenchRecommendation, BenchReplica, BenchRun, BenchStrategyRuns,
        Objective, Slo,
    };

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
