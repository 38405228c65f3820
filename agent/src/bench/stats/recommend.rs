//! The recommendation of a bench ([`recommend`]): per replica count, the strategy an
//! objective picks, told apart from the others beyond the host's noise or picked by
//! isolation among those within it, and why in one line.

use std::cmp::Ordering;
use std::collections::BTreeSet;

use gpushare_proto::bench::{
    BenchRecommendation, BenchRun, BenchStrategy, BenchStrategyRuns, Objective,
};
use gpushare_proto::plural;

use super::noise::NoiseFloor;
use super::runs::{beyond_n, p99s_of, throughputs};
use super::samples::ratio_of;
use crate::bench::verdict;

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
pub(super) fn throughput_against(a: f64, b: f64, b_name: Option<&str>) -> String {
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
pub(super) fn p99_against(a: Option<f64>, b: Option<f64>, b_name: Option<&str>) -> String {
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
pub(super) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// How well a strategy isolates its replicas from each other, most first (0): the order
/// the recommendation picks by among strategies the measurements cannot tell apart. A
/// match, so that a new strategy does not compile until it has its place.
fn isolation(strategy: BenchStrategy) -> usize {
    match strategy {
        BenchStrategy::Mig => 0,
        BenchStrategy::MpsLimited => 1,
        BenchStrategy::Mps => 2,
        BenchStrategy::TimeSlicing => 3,
    }
}

/// A strategy's place in the [`isolation`] order (unknown names last).
fn isolation_rank(name: &str) -> usize {
    name.parse::<BenchStrategy>().map_or(usize::MAX, isolation)
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
/// the best isolated ([`isolation`]), said so, with the figures. Otherwise the pick is
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
