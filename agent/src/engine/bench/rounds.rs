//! The schedule of a bench: its cells (each strategy at each replica count, [`cells`]),
//! the order of its measurements (rounds of cells, [`round_order`]), how long it takes
//! ([`Timing`]: the estimate as the first window opens, what is left at each step, the
//! bench stopped when the estimate is over its bound) and the words for both (the plan
//! said before measuring, [`plan_lines`]; a partial report's note, [`partial_text`];
//! lengths, [`duration_text`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gpushare_proto::bench::{BENCH_BASELINE_RUNS, BenchRun, BenchStrategy};
use tokio::sync::mpsc::UnboundedSender;

use super::options::BenchOptions;
use super::setups::{GpuFacts, Setup, time_slicing};
use super::strategies;
use crate::apply::Progress;
use crate::bench::measure::Cancel;

/// One cell of a bench: a strategy at a replica count, measured once a round.
pub(super) struct Cell {
    pub(super) strategy: BenchStrategy,
    pub(super) n: u32,
    /// How it is set up; an error is the cell's figure (`8 instances do not fit`).
    pub(super) setup: Result<Setup, String>,
    /// Its measurements, in order.
    pub(super) runs: Vec<BenchRun>,
    /// How long its first setup took, ms.
    pub(super) setup_ms: Option<f64>,
    /// Measured no more: a measurement failed, and that failure is what is reported.
    pub(super) done: bool,
}

/// What a bench measures next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Item {
    /// One replica alone on the whole GPU without MPS.
    Baseline,
    /// The cell of this index ([`cells`]).
    Cell(usize),
}

/// Every cell of a bench (a strategy at a replica count), in the order of a round
/// ([`round_order`]): replica counts ascending as given, the strategies in turn at each;
/// a strategy left out (`skipped`) has none, and neither has the baseline's own run
/// (time-slicing at 1). A cell whose setup cannot be made has its reason as its setup.
pub(super) fn cells(
    options: &BenchOptions,
    skipped: &HashMap<BenchStrategy, String>,
    gpu: &GpuFacts,
) -> Vec<Cell> {
    let mut cells = Vec::new();
    for &n in &options.replicas {
        for &strategy in &options.strategies {
            let entry = strategies::of(strategy);
            if skipped.contains_key(&strategy) || !entry.is_cell(n) {
                continue;
            }
            cells.push(Cell {
                strategy,
                n,
                setup: entry.set_up(n, gpu),
                runs: Vec::new(),
                setup_ms: None,
                done: false,
            });
        }
    }
    cells
}

/// How many measurements a bench of `cells` takes over `repeat` rounds (a cell that
/// cannot be set up is never measured).
pub(super) fn measurements(repeat: u32, cells: &[Cell]) -> usize {
    (1..=repeat)
        .map(|round| {
            round_order(round, repeat, cells.len())
                .iter()
                .filter(|item| match item {
                    Item::Baseline => true,
                    Item::Cell(i) => cells[*i].setup.is_ok(),
                })
                .count()
        })
        .sum()
}

/// The measurements of round `round` (1-based) of `repeat`, of a bench of `cells` cells:
/// the baseline first, then every cell once, forward in odd rounds and backward in even
/// ones, so that a drift over the bench falls on every cell alike (round-robin over
/// strategies and replica counts, never one strategy's repeats back to back). The first
/// round measures the baseline more than once when there are fewer rounds than
/// [`BENCH_BASELINE_RUNS`], so that it is always measured at least that often: every
/// ratio divides by it, and its spread is the host's noise.
pub(super) fn round_order(round: u32, repeat: u32, cells: usize) -> Vec<Item> {
    let baselines =
        if round == 1 { (BENCH_BASELINE_RUNS + 1).saturating_sub(repeat).max(1) } else { 1 };
    let mut order = vec![Item::Baseline; baselines as usize];
    if round % 2 == 1 {
        order.extend((0..cells).map(Item::Cell));
    } else {
        order.extend((0..cells).rev().map(Item::Cell));
    }
    order
}

/// How long a bench has taken and will take: the estimate said as the first window
/// opens, and what is left as each measurement starts.
pub(super) struct Timing {
    started: Instant,
    /// Measurements and setups not yet begun.
    measurements_left: u32,
    setups_left: u32,
    /// How long measurements and setups took so far, seconds.
    measurement_seconds: Vec<f64>,
    setup_seconds: Vec<f64>,
    /// When the measurement under way began.
    measuring_since: Option<Instant>,
    /// The estimate of the bench's whole length, made as the first window opened.
    pub(super) first_estimate: Option<f64>,
    /// Shared with the window hook, which makes the first estimate.
    shared: std::sync::Arc<std::sync::Mutex<Option<f64>>>,
}

/// What a replica's stop and reaping take after its window, a guess until measured.
const STOP_GUESS: f64 = 0.1;

impl Timing {
    pub(super) fn new(
        started: Instant,
        orders: &[Vec<Item>],
        cells: &[Cell],
        first_setup_seconds_ms: f64,
    ) -> Timing {
        let all: Vec<Item> = orders.iter().flatten().copied().collect();
        let usable = |item: &Item| match item {
            Item::Baseline => true,
            Item::Cell(i) => cells[*i].setup.is_ok(),
        };
        let setup_of = |item: &Item| match item {
            Item::Baseline => Some(time_slicing()),
            Item::Cell(i) => cells[*i].setup.clone().ok(),
        };
        let mut setups = 1; // the restore
        let mut current = Some(time_slicing());
        for item in all.iter().filter(|i| usable(i)) {
            let next = setup_of(item);
            if next != current {
                setups += 1;
                current = next;
            }
        }
        Timing {
            started,
            measurements_left: u32::try_from(all.iter().filter(|i| usable(i)).count())
                .unwrap_or(u32::MAX),
            setups_left: setups,
            measurement_seconds: Vec::new(),
            setup_seconds: vec![first_setup_seconds_ms / 1000.0],
            measuring_since: None,
            first_estimate: None,
            shared: std::sync::Arc::default(),
        }
    }

    pub(super) fn mean(values: &[f64]) -> Option<f64> {
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    }

    /// A setup took `seconds`.
    pub(super) fn set_up(&mut self, seconds: f64) {
        self.setup_seconds.push(seconds);
        self.setups_left = self.setups_left.saturating_sub(1);
    }

    /// A planned measurement is not taken (its cell failed or could not be set up).
    pub(super) fn skipped(&mut self) {
        self.measurements_left = self.measurements_left.saturating_sub(1);
    }

    /// A measurement is over.
    pub(super) fn measured(&mut self, _run: &BenchRun) {
        if let Some(since) = self.measuring_since.take() {
            self.measurement_seconds.push(since.elapsed().as_secs_f64());
        }
        if self.first_estimate.is_none() {
            self.first_estimate =
                *self.shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// What is left, from what measurements and setups took so far: `, about 3m 10s
    /// left`; empty before the first measurement ends.
    pub(super) fn left_text(&mut self) -> String {
        self.measuring_since = Some(Instant::now());
        let before = self.measurements_left;
        self.measurements_left = before.saturating_sub(1);
        let Some(each) = Self::mean(&self.measurement_seconds) else { return String::new() };
        let setup = Self::mean(&self.setup_seconds).unwrap_or(0.0);
        let left = f64::from(before) * each + f64::from(self.setups_left) * setup;
        format!(
            " ({} so far, about {} left)",
            duration_text(self.started.elapsed().as_secs_f64()),
            duration_text(left)
        )
    }

    /// The hook of the measurement starting now: as its window opens it says so, and
    /// the first time, the whole bench's estimated length (its start-up measured, each
    /// later measurement taken to be as long, each setup as long as the first).
    /// A first estimate over `bound`'s length cancels the bench at once, saying so.
    pub(super) fn window_hook(
        &self,
        progress: &UnboundedSender<Progress>,
        window: Option<f64>,
        bound: (Duration, Cancel),
    ) -> Box<dyn FnMut() + Send> {
        let progress = progress.clone();
        let shared = std::sync::Arc::clone(&self.shared);
        let first = self.first_estimate.is_none() && self.measurement_seconds.is_empty();
        let since = self.measuring_since.unwrap_or_else(Instant::now);
        let started = self.started;
        let after = f64::from(self.measurements_left);
        let setups = f64::from(self.setups_left);
        let setup = Self::mean(&self.setup_seconds).unwrap_or(0.0);
        Box::new(move || {
            let Some(length) = window else { return };
            let mut step = format!("  measuring for {}", duration_text(length));
            if first {
                let start_up = since.elapsed().as_secs_f64();
                let estimate = started.elapsed().as_secs_f64()
                    + length
                    + STOP_GUESS
                    + after * (start_up + length + STOP_GUESS)
                    + setups * setup;
                *shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(estimate);
                if estimate > bound.0.as_secs_f64() {
                    bound.1.cancel_because(estimated_over(estimate, bound.0));
                }
                tracing::debug!(
                    "bench estimate {estimate:.1} s: {:.1} s so far, start-up {start_up:.2} s, {after} measurements and {setups} setups of {setup:.2} s to come",
                    started.elapsed().as_secs_f64()
                );
                step.push_str(&format!(
                    "; the whole bench takes about {} (estimated)",
                    duration_text(estimate)
                ));
            }
            let _ = progress.send(Progress { done: 0, total: 0, step });
        })
    }
}

/// Why a running bench is stopped once its estimate (made as its first window opened) is
/// over the bound.
pub(super) fn estimated_over(estimate: f64, bound: Duration) -> String {
    format!(
        "stopped: it would take about {}, more than the {} a bench may take here ([bench] max_total_seconds in agent.toml)",
        duration_text(estimate),
        duration_text(bound.as_secs_f64())
    )
}

/// How long something takes, as the agent's progress and plan say it (`42 s`, `6m 05s`).
pub(super) use gpushare_base::duration::spaced as duration_text;

/// What a report that ended early says (issue 37): why, how far it got, and that its
/// figures are those of the measurements finished before.
pub(super) fn partial_text(
    why: &str,
    rounds_done: u32,
    repeat: u32,
    measurements: usize,
) -> String {
    let why = why.split(';').next().unwrap_or(why).trim();
    format!(
        "{why} in round {} of {repeat}, after {}: the figures below are of those alone",
        (rounds_done + 1).min(repeat),
        gpushare_proto::plural(u32::try_from(measurements).unwrap_or(u32::MAX), "measurement")
    )
}

/// What a bench says before it measures anything (issue 37), one line each: what it will
/// measure (`Will measure: the baseline 3 times, then mps at 1, 3; mig at 1, 3 in 1 round
/// of 30 s windows: 7 measurements`), then each thing left out and why (replica counts for
/// want of CPUs, `capped`; a strategy `skipped`; a cell whose setup cannot be made).
pub(super) fn plan_lines(
    repeat: u32,
    cells: &[Cell],
    skipped: &[(BenchStrategy, String)],
    capped: &str,
    window: Option<f64>,
) -> Vec<String> {
    let mut by_strategy: Vec<(BenchStrategy, Vec<String>)> = Vec::new();
    let mut left_out = Vec::new();
    for cell in cells {
        match &cell.setup {
            Ok(_) => match by_strategy.iter_mut().find(|(s, _)| *s == cell.strategy) {
                Some((_, counts)) => counts.push(cell.n.to_string()),
                None => by_strategy.push((cell.strategy, vec![cell.n.to_string()])),
            },
            Err(why) => left_out.push(format!("{} at {}: {why}", cell.strategy, cell.n)),
        }
    }
    let runnable = cells.iter().filter(|c| c.setup.is_ok()).count();
    let measurements = measurements(repeat, cells);
    let baselines = measurements - runnable * repeat as usize;
    let strategies: Vec<String> =
        by_strategy.iter().map(|(s, counts)| format!("{s} at {}", counts.join(", "))).collect();
    let then = if strategies.is_empty() {
        String::new()
    } else {
        format!(", then {}", strategies.join("; "))
    };
    let rounds = if repeat == 1 { "1 round".to_owned() } else { format!("{repeat} rounds") };
    let windows = window.map_or(String::new(), |w| format!(" of {w} s windows"));
    let mut lines = vec![format!(
        "Will measure: the baseline (1 replica alone) {}{then} in {rounds}{windows}: {measurements} measurements",
        gpushare_proto::plural(u32::try_from(baselines).unwrap_or(u32::MAX), "time")
    )];
    if !capped.is_empty() {
        // `3, 5, 7 replicas left out: 2 CPUs to pin …` as `Left out: 3, 5, 7 replicas: …`.
        lines
            .push(format!("Left out: {}", capped.replacen(" replicas left out:", " replicas:", 1)));
    }
    for (strategy, why) in skipped {
        lines.push(format!("Left out: {strategy}: {why}"));
    }
    for why in left_out {
        lines.push(format!("Left out: {why}"));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_interleave_every_cell_and_measure_the_baseline_at_least_three_times() {
        use Item::{Baseline as B, Cell as C};
        // Once: the baseline three times, then each cell.
        assert_eq!(round_order(1, 1, 3), [B, B, B, C(0), C(1), C(2)]);
        // Twice: twice then once; the second round backwards.
        assert_eq!(round_order(1, 2, 3), [B, B, C(0), C(1), C(2)]);
        assert_eq!(round_order(2, 2, 3), [B, C(2), C(1), C(0)]);
        // Three or more: once a round, forward and backward in turn.
        assert_eq!(round_order(1, 3, 2), [B, C(0), C(1)]);
        assert_eq!(round_order(2, 3, 2), [B, C(1), C(0)]);
        assert_eq!(round_order(3, 3, 2), [B, C(0), C(1)]);
        assert_eq!(round_order(4, 10, 0), [B]);
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(duration_text(44.6), "45 s");
        assert_eq!(duration_text(365.0), "6m 05s");
        assert_eq!(duration_text(3720.0), "1h 02m");
        assert_eq!(duration_text(-1.0), "0 s");
    }

    #[test]
    fn the_plan_says_what_runs_and_what_is_left_out_and_why() {
        let cell = |strategy, n, setup: Result<Setup, String>| Cell {
            strategy,
            n,
            setup,
            runs: Vec::new(),
            setup_ms: None,
            done: false,
        };
        let cells = [
            cell(BenchStrategy::Mps, 1, Ok(time_slicing())),
            cell(BenchStrategy::MpsLimited, 1, Ok(time_slicing())),
            cell(BenchStrategy::Mps, 2, Ok(time_slicing())),
            cell(BenchStrategy::Mig, 2, Err("2 instances do not fit".into())),
        ];
        let skipped = [(BenchStrategy::TimeSlicing, "not asked for".to_owned())];
        let capped = "3, 5, 7 replicas left out: 2 CPUs to pin one replica each (0-1, the agent's CPUs); --no-pin runs them unpinned";
        let lines = plan_lines(2, &cells, &skipped, capped, Some(30.0));
        assert_eq!(
            lines,
            [
                "Will measure: the baseline (1 replica alone) 3 times, then mps at 1, 2; \
                 mps-limited at 1 in 2 rounds of 30 s windows: 9 measurements",
                "Left out: 3, 5, 7 replicas: 2 CPUs to pin one replica each (0-1, the agent's \
                 CPUs); --no-pin runs them unpinned",
                "Left out: time-slicing: not asked for",
                "Left out: mig at 2: 2 instances do not fit",
            ]
        );
    }
}
