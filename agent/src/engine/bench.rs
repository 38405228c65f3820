//! Bench as a job of the engine: the caller's command (or a built-in workload) as N
//! replicas under each sharing strategy of one whole GPU. Each strategy is set up by an
//! ordinary transaction (journal, rollback); the replicas run and are measured by
//! [`crate::bench::measure`]; the figures and answers come from [`crate::bench::stats`];
//! at the end the GPU goes back to the layout it had, and the profile that was active is
//! active again, also after a failure or a cancel. The journal's bench record lets an
//! agent that stopped mid-bench do the same at its next start ([`Engine::recover_bench`]).
//!
//! Everything the bench will need is checked before the first change: the options, the
//! caller's identity, the command and working directory *as the caller* (a check gate,
//! [`crate::bench::replicas::check`]), the target, every strategy's plan and its tools.
//! Replicas are the caller's own processes ([`crate::bench::launch`]); the agent keeps no
//! file of a bench.
//!
//! Beside it: [`super::bench_options`] (the request, checked), [`super::bench_limits`] (the
//! check before the lock, the bound on a bench's length), `bench_setups` (each strategy as
//! a profile of the GPU), `bench_rounds` (the order of the measurements and the
//! estimate) and `bench_restore` (the GPU put back, also after an interrupted bench).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpushare_proto::bench::{
    BenchMeasurement, BenchReport, BenchRun, BenchStrategy, BenchStrategyRuns, ENV_STRATEGY,
};
use gpushare_proto::plural;
use tokio::sync::mpsc::UnboundedSender;

pub use super::bench_options::{BenchOptions, Caller};
use super::bench_rounds::{
    Cell, HostTotals, Item, Timing, intervals_text, partial_text, plan_lines, round_order,
    worst_p99,
};
pub(super) use super::bench_setups::whole_gpu;
use super::bench_setups::{Setup, mig_size, setup, time_slicing};
use super::jobs::{JobGuard, JobKind, JobReport, JobResult, RunningJob};
use super::{Engine, EngineError, bench_limits};
use crate::apply::journal::{BenchRecord, GpuCheckpoint};
use crate::apply::{Progress, Reads};
use crate::bench::host_noise::HostNoise;
use crate::bench::measure::{self, Cancel, RunSpec};
use crate::bench::pinning::Pinning;
use crate::bench::replicas::Launch;
use crate::bench::stats::{self, ReplicaMeasure};
use crate::gpu::BackendKind;
use crate::node::{GpuState, NodeState};
use crate::plan;
use crate::profile::Profile;
use crate::sys::unix::{self, Identity};

/// How long a replica's unit may outlive its time limit (starting, stopping).
const UNIT_SLACK: Duration = Duration::from_secs(300);

/// A bench that holds the apply lock, with everything checked.
pub struct BenchJob {
    options: BenchOptions,
    uuid: String,
    gpu: u32,
    device: String,
    memory_total: u64,
    /// Whom the replicas run as; `None`: as the agent (not root), which the caller is.
    identity: Option<Identity>,
    /// The job's number, which names the replicas' units.
    label: String,
    /// Per strategy, why it is left out, if it is.
    skipped: HashMap<BenchStrategy, String>,
    /// MIG instance size per replica count, where the model has one.
    mig_sizes: HashMap<u32, Result<(u8, String), String>>,
    /// The CPUs of each replica; `None`: unpinned.
    pinning: Option<Pinning>,
    /// The default replica counts left out for want of CPUs, and why; empty if none.
    capped: String,
    cancel: Cancel,
    _guard: JobGuard,
}

impl BenchJob {
    /// Asks the bench to stop early; it restores the sharing before it finishes.
    pub fn canceller(&self) -> Cancel {
        self.cancel.clone()
    }

    /// Every cell of the bench (a strategy at a replica count), in the order of a round
    /// ([`round_order`]): replica counts ascending as given, the strategies in turn at
    /// each; time-slicing at 1 is the baseline, not a cell.
    fn cells(&self) -> Vec<Cell> {
        let mut cells = Vec::new();
        for &n in &self.options.replicas {
            for &strategy in &self.options.strategies {
                if self.skipped.contains_key(&strategy)
                    || (strategy == BenchStrategy::TimeSlicing && n == 1)
                {
                    continue;
                }
                cells.push(Cell {
                    strategy,
                    n,
                    setup: setup(strategy, n, self.memory_total, &self.mig_sizes),
                    runs: Vec::new(),
                    setup_ms: None,
                    done: false,
                });
            }
        }
        cells
    }

    /// What the bench will measure and leave out, said before it measures ([`plan_lines`]).
    fn plan(&self) -> Vec<String> {
        let mut skipped: Vec<(BenchStrategy, String)> =
            self.skipped.iter().map(|(s, why)| (*s, why.clone())).collect();
        skipped.sort_by_key(|(s, _)| self.options.strategies.iter().position(|o| o == s));
        plan_lines(
            self.options.repeat,
            &self.cells(),
            &skipped,
            &self.capped,
            self.options.duration,
        )
    }

    /// A step per measurement (see [`round_order`]) and one for the restore.
    fn steps(&self) -> u32 {
        let cells = self.cells().len();
        let measurements: usize = (1..=self.options.repeat)
            .map(|round| round_order(round, self.options.repeat, cells).len())
            .sum();
        u32::try_from(measurements + 1).unwrap_or(u32::MAX)
    }
}

impl Engine {
    /// Checks a bench through, takes the apply lock and records the bench in the journal;
    /// nothing on the GPU has changed yet when this returns.
    pub async fn begin_bench(
        &self,
        mut options: BenchOptions,
        caller: Caller,
        job: &str,
    ) -> Result<BenchJob, EngineError> {
        self.may_change()?;
        options.validate()?;
        if options.builtin.is_some() && self.backend_kind() == BackendKind::Simulated {
            // CUDA would see the real GPUs (or none), not the simulated ones.
            return Err(EngineError::NotPossible(
                "the built-in workloads measure real GPUs with CUDA; this agent simulates its GPUs (bench a command instead)".into(),
            ));
        }
        if let Some(record) =
            self.core.journal.snapshot().bench.filter(|b| b.restore_error.is_some())
        {
            return Err(EngineError::NotPossible(format!(
                "restoring the GPU after the bench {} failed ({}); apply a profile first",
                record.job,
                record.restore_error.unwrap_or_default()
            )));
        }
        let asked = tokio::time::Instant::now();
        // A bench that runs (one measurement at a time on a node), or a job holding the
        // lock that no one waits for, says so first, before the caller's check.
        if let Some(claim) = self.gate.claims.all().first() {
            return Err(EngineError::Busy(Some(claim.holder())));
        }
        if let Some(running) = self.running_job().filter(|j| j.id != super::BOOT_JOB) {
            return Err(EngineError::Busy(Some(running)));
        }
        let identity = replica_identity(&caller)?;
        let label = job.rsplit('/').next().filter(|l| l.chars().all(|c| c.is_ascii_alphanumeric()));
        let label = label.unwrap_or("0").to_string();
        // The directory, the command and the log directory, as the caller sees them,
        // before the apply lock: a check that is stopped or slow costs its caller alone.
        let program = agent_binary().map_err(EngineError::Internal)?;
        let spec = bench_limits::check_spec(
            options.replica_command(&program).map_err(EngineError::Internal)?,
            options.base_environment(),
            options.cwd_text(),
            options.logs_text(),
        );
        let stopping = self.gate.stopping.load(std::sync::atomic::Ordering::SeqCst);
        let who = bench_limits::caller_words(caller.uid).await;
        self.bench_limits
            .check_as_caller(
                &self.launcher,
                spec,
                identity.as_ref(),
                (caller.uid, job, &label),
                program,
                stopping,
            )
            .await?;
        // Then the apply lock, briefly (named, for a caller whose wait for it runs out),
        // within what is left of the wait every job has.
        let lock = self.lock_by(None, asked + super::LOCK_WAIT).await?;
        let _named =
            self.gate.moments.hold(format!("a bench being checked ({job}, started by {who})"));
        let node = self.core.node.observe(Reads::FOR_PLANNING).await?;
        let target = options.target.clone().unwrap_or_else(|| "0".into());
        let g = whole_gpu_target(&node, &target)?;
        let (uuid, gpu) = (g.uuid.clone(), g.index);
        // The CPUs: N above them is refused here, before any setup.
        let (pinning, capped) = self.bench_pinning(&mut options, gpu).await?;

        let mut skipped = HashMap::new();
        let mut mig_sizes = HashMap::new();
        if options.strategies.contains(&BenchStrategy::Mig) {
            match g.model.filter(|m| !m.mig_profiles.is_empty()) {
                None => {
                    skipped.insert(
                        BenchStrategy::Mig,
                        format!("{} is not MIG-capable", g.model_name()),
                    );
                }
                Some(_) if !self.core.policy.manage_mig => {
                    skipped.insert(
                        BenchStrategy::Mig,
                        "not measured: agent.toml [gpu] manage_mig = false (a host whose MIG mode the agent may not change)".into(),
                    );
                }
                Some(model) => {
                    for &n in &options.replicas {
                        mig_sizes.insert(n, mig_size(model, n));
                    }
                }
            }
        }
        // Every setup planned against the GPU as it is: anything infeasible or missing
        // (an MPS control binary, a permission) is refused now, before the first change.
        let mut setups = vec![time_slicing()];
        for &strategy in options.strategies.iter().filter(|s| !skipped.contains_key(s)) {
            for &n in &options.replicas {
                match setup(strategy, n, g.memory_total_bytes, &mig_sizes) {
                    Ok(s) => setups.push(s),
                    Err(_) => continue, // reported as that run's error
                }
            }
        }
        for s in &setups {
            let profile = whole_gpu(
                &format!("bench-{}", s.strategy),
                &uuid,
                s.mig.clone(),
                s.sharing.clone(),
            );
            let plan = plan::plan(&node, &profile, &self.core.policy)
                .map_err(|e| EngineError::NotPossible(format!("{}: {e}", s.strategy)))?;
            self.check_host(&plan, &node).await?;
        }
        // Its least length against the bound, before any setup.
        let cells = options
            .replicas
            .iter()
            .flat_map(|&n| options.strategies.iter().map(move |&s| (s, n)))
            // Time-slicing at 1 is the baseline, not a cell.
            .filter(|&(s, n)| {
                !(skipped.contains_key(&s) || s == BenchStrategy::TimeSlicing && n == 1)
            })
            .filter(|&(s, n)| setup(s, n, g.memory_total_bytes, &mig_sizes).is_ok())
            .count();
        let measurements: usize =
            (1..=options.repeat).map(|r| round_order(r, options.repeat, cells).len()).sum();
        let bound = self.bench_limits.max_total;
        if let (Some(least), Some(window)) =
            (bench_limits::least_seconds(measurements, options.duration), options.duration)
            && least > bound.as_secs_f64()
        {
            return Err(bench_limits::too_long(least, measurements, window, bound));
        }

        let before = self.core.journal.snapshot();
        let record = BenchRecord {
            job: job.to_string(),
            checkpoint: GpuCheckpoint::of(&node, [gpu]),
            previous_profile: before.active_profile.clone(),
            previous_document: before.active_document.clone(),
            uid: caller.uid,
            replicas: Vec::new(),
            restore_error: None,
            keeps_active: true,
        };
        self.core
            .journal
            .begin_bench(record.clone())
            .map_err(|e| EngineError::Internal(format!("writing the journal: {e}")))?;
        let running =
            RunningJob { id: job.to_string(), kind: JobKind::Bench { target: uuid.clone() } };
        // The GPU is the bench's from now to its end; the apply lock goes.
        let guard = self.claim_for_bench(lock, running, &record, &node).await;
        let mut job = BenchJob {
            options,
            uuid,
            gpu,
            device: g.name.clone(),
            memory_total: g.memory_total_bytes,
            identity,
            label,
            skipped,
            mig_sizes,
            pinning,
            capped,
            cancel: Cancel::default(),
            _guard: guard,
        };
        // SIGTERM to the agent cancels it (Engine::cancel_bench), also one that came while
        // it was being checked.
        *self.running_bench.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(job.cancel.clone());
        if self.gate.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            job.cancel.cancel();
        }
        let steps = job.steps();
        job._guard.start(steps);
        Ok(job)
    }

    /// Asks the bench running now, if one does, to stop early (SIGTERM to the agent): it
    /// stops its replicas and restores the GPU, then ends; a bench that begins from now on
    /// is cancelled at once.
    pub fn cancel_bench(&self) {
        self.gate.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        self.bench_limits.cancel_checks();
        let running = self.running_bench.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(cancel) = running.as_ref() {
            tracing::warn!(
                "cancelling the running bench: stopping its replicas and restoring the GPU"
            );
            cancel.cancel();
        }
    }

    /// Runs a bench job: the baseline, every strategy at every replica count, then the
    /// GPU restored. The report carries what was measured even when the bench failed or
    /// was cancelled part-way.
    pub async fn run_bench(
        &self,
        job: &BenchJob,
        progress: UnboundedSender<Progress>,
    ) -> JobReport {
        let started = Instant::now();
        let mut outcome = JobReport {
            kind: JobKind::Bench { target: job.uuid.clone() },
            result: JobResult::Failed,
            changed: true,
            steps_done: 0,
            steps_total: job.steps(),
            duration: Duration::ZERO,
            error: None,
            warnings: Vec::new(),
            probe: None,
            bench: None,
        };
        let mut report = BenchReport {
            target: job.uuid.clone(),
            gpu: job.gpu,
            device: job.device.clone(),
            command: job.options.described_command(),
            method: job.options.method().name().as_str().into(),
            histogram: job.options.histogram.clone(),
            objective: job.options.objective.as_str().into(),
            window_seconds: job.options.duration,
            repeat: job.options.repeat,
            slo: job.options.slo.map(|s| s.to_string()),
            fleet: job.options.fleet,
            wall_seconds: 0.0,
            baseline: None,
            strategies: Vec::new(),
            recommendations: Vec::new(),
            capacity: Vec::new(),
            restored: String::new(),
            saved_to: String::new(),
            logs_dir: job.options.logs_text().unwrap_or_default(),
            pinning: None,
            intervals: String::new(),
            noise: None,
            estimate_seconds: None,
            capped: String::new(),
            sequence: Vec::new(),
            partial: String::new(),
            plan: job.plan(),
        };
        // Said before anything is measured: what will run, what is left out and why.
        for line in &report.plan {
            let _ = progress.send(Progress { done: 0, total: 0, step: line.clone() });
        }
        report.pinning = job.pinning.as_ref().map(Pinning::to_proto);
        report.capped = job.capped.clone();
        // At its bound the bench is stopped, and restores its GPU as at any cancel.
        let bound = self.bench_limits.max_total;
        let cancel = job.cancel.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(bound).await;
            cancel.cancel_because(bench_limits::reached(bound));
        });
        let measured = self.bench_runs(job, &progress, &mut outcome, &mut report, started).await;
        timer.abort();
        let _ = progress.send(Progress {
            done: outcome.steps_total.saturating_sub(1),
            total: outcome.steps_total,
            step: "restoring the GPU's sharing".into(),
        });
        let restored = match self.core.journal.snapshot().bench {
            Some(record) => self.restore_bench(&record, &quiet(&progress)).await,
            None => Err("the journal lost the bench record".into()),
        };
        outcome.steps_done = outcome.steps_total;
        outcome.duration = started.elapsed();
        report.wall_seconds = outcome.duration.as_secs_f64();
        report.restored = match &restored {
            Ok(what) => what.clone(),
            Err(e) => format!("NOT restored: {e}"),
        };
        let error = match (measured, restored) {
            (Ok(()), Ok(_)) => None,
            (Ok(()), Err(e)) => Some(format!("restoring the sharing after the bench failed: {e}")),
            (Err(e), Ok(_)) => Some(format!("{e}; the sharing was restored")),
            (Err(e), Err(r)) => Some(format!("{e}; restoring the sharing failed too: {r}")),
        };
        match error {
            None => outcome.result = JobResult::Success,
            Some(message) => {
                outcome.error = Some(EngineError::Bench { target: job.uuid.clone(), message });
            }
        }
        outcome.bench = Some(report);
        *self.running_bench.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        job._guard.finish();
        outcome
    }

    /// The rounds: each measures the baseline and every cell once, in [`round_order`];
    /// then each cell's figures from its measurements, against the baseline's median,
    /// and the host's noise. What was measured is in the report also when the bench
    /// failed or was cancelled part-way.
    async fn bench_runs(
        &self,
        job: &BenchJob,
        progress: &UnboundedSender<Progress>,
        outcome: &mut JobReport,
        report: &mut BenchReport,
        started: Instant,
    ) -> Result<(), String> {
        let total = outcome.steps_total;
        let repeat = job.options.repeat;
        let setup0 = time_slicing();
        let _ = progress.send(Progress {
            done: 0,
            total,
            step: "setting the GPU up for the baseline: the whole GPU, without MPS".into(),
        });
        // The first setup reads the time-slice interval (and resets one a profile left);
        // from then on the bench, holding the GPU, knows it is the default.
        let setup0_ms = self.bench_setup(job, &setup0, Reads::FOR_PLANNING, progress).await?;
        let mut current = Some(setup0.clone());
        let mut cells = job.cells();
        let orders: Vec<Vec<Item>> =
            (1..=repeat).map(|round| round_order(round, repeat, cells.len())).collect();
        let mut timing = Timing::new(started, &orders, &cells, setup0_ms);
        let mut baseline_runs: Vec<BenchRun> = Vec::new();
        let mut host = HostTotals::default();
        let mut result = Ok(());
        let mut rounds_done = 0;
        'rounds: for (round, order) in (1..=repeat).zip(&orders) {
            for &item in order {
                if job.cancel.is_cancelled() {
                    result = Err(job.cancel.reason());
                    break 'rounds;
                }
                let (setup, n, name) = match item {
                    Item::Baseline => (setup0.clone(), 1, "baseline"),
                    Item::Cell(i) => match (&cells[i].setup, cells[i].done) {
                        (Ok(s), false) => (s.clone(), cells[i].n, cells[i].strategy.as_str()),
                        (setup, _) => {
                            outcome.steps_done += 1;
                            if setup.is_ok() {
                                timing.skipped();
                            }
                            continue;
                        }
                    },
                };
                let what = match item {
                    Item::Baseline => {
                        "baseline: one replica alone on the whole GPU, without MPS".to_owned()
                    }
                    Item::Cell(_) => {
                        format!("{name}: {} ({})", plural(n, "replica"), setup.describe)
                    }
                };
                let rounds =
                    if repeat > 1 { format!("round {round} of {repeat}: ") } else { String::new() };
                let _ = progress.send(Progress {
                    done: outcome.steps_done,
                    total,
                    step: format!("{rounds}{what}{}", timing.left_text()),
                });
                if current.as_ref() != Some(&setup) {
                    let began = Instant::now();
                    let set_up = self.bench_setup(job, &setup, BENCH_SETUP_READS, progress).await;
                    timing.set_up(began.elapsed().as_secs_f64());
                    match (set_up, item) {
                        (Ok(ms), Item::Cell(i)) => {
                            cells[i].setup_ms.get_or_insert(ms);
                            current = Some(setup.clone());
                        }
                        (Ok(_), Item::Baseline) => current = Some(setup.clone()),
                        (Err(e), Item::Baseline) => {
                            result = Err(format!("setting the baseline up again failed: {e}"));
                            break 'rounds;
                        }
                        (Err(e), Item::Cell(i)) => {
                            current = None;
                            cells[i].runs.push(error_run(n, setup.describe.clone(), e));
                            cells[i].done = true;
                            outcome.steps_done += 1;
                            continue;
                        }
                    }
                }
                let logs = match item {
                    Item::Baseline => format!("time-slicing-1-{}", baseline_runs.len() + 1),
                    Item::Cell(_) if repeat == 1 => format!("{name}-{n}"),
                    Item::Cell(_) => format!("{name}-{n}-{round}"),
                };
                let at_seconds = started.elapsed().as_secs_f64();
                let bound = (self.bench_limits.max_total, job.cancel.clone());
                let opened = timing.window_hook(progress, job.options.duration, bound);
                let (run, noise) = match self.bench_run(job, &setup, n, logs, opened).await {
                    Ok(measured) => measured,
                    // Cancelled while its replicas started: nothing of it was measured.
                    Err(_) if job.cancel.is_cancelled() => {
                        result = Err(job.cancel.reason());
                        break 'rounds;
                    }
                    Err(e) => {
                        result = Err(e);
                        break 'rounds;
                    }
                };
                // A measurement a cancel cut short is no measurement: the bench keeps those
                // finished before it (issue 37), and ends.
                if run.error.as_deref() == Some("cancelled") {
                    result = Err(job.cancel.reason());
                    break 'rounds;
                }
                timing.measured(&run);
                host.add(noise);
                let broken = run.error.is_some() || run.failed > 0;
                report.sequence.push(BenchMeasurement {
                    round,
                    strategy: name.to_owned(),
                    replicas: n,
                    at_seconds,
                    throughput_per_s: run.throughput_per_s,
                    p99_ms: run.p99_ms,
                    worst_p99_ms: worst_p99(&run),
                    failed: broken,
                });
                outcome.steps_done += 1;
                match item {
                    Item::Baseline => {
                        if broken {
                            // Its output is in the report, the caller's alone; not in this
                            // message, which the agent's log has too.
                            let why = run.error.clone().unwrap_or_else(|| {
                                let r = run.per_replica.first();
                                format!(
                                    "the replica failed ({}; its output is in the report)",
                                    r.map_or("", |r| r.outcome.as_str())
                                )
                            });
                            baseline_runs.push(run);
                            result = Err(format!("the baseline run failed: {why}"));
                            break 'rounds;
                        }
                        baseline_runs.push(run);
                    }
                    Item::Cell(i) => {
                        cells[i].runs.push(run);
                        cells[i].done |= broken;
                    }
                }
            }
            rounds_done = round;
        }
        if let Err(why) = &result {
            report.partial = partial_text(why, rounds_done, repeat, report.sequence.len());
        }
        report.estimate_seconds = timing.first_estimate;
        self.bench_figures(job, report, baseline_runs, cells, setup0_ms, &host);
        result
    }

    /// The report's figures from the measurements: the baseline (the median of its),
    /// the host's noise, each cell against the baseline, flagged where its scaling is
    /// above N, and how the intervals were found.
    fn bench_figures(
        &self,
        job: &BenchJob,
        report: &mut BenchReport,
        baseline_runs: Vec<BenchRun>,
        cells: Vec<Cell>,
        setup0_ms: f64,
        host: &HostTotals,
    ) {
        let Some(mut baseline) = stats::cell_run(baseline_runs) else {
            return;
        };
        baseline.setup_ms = Some(setup0_ms);
        against_itself(&mut baseline);
        let measured_alone: Vec<BenchMeasurement> =
            report.sequence.iter().filter(|m| m.strategy == "baseline").cloned().collect();
        let (floor, noise) =
            stats::noise(&measured_alone, host.steal(), &host.frequency_mhz, job.options.repeat);
        report.noise = Some(noise);
        report.baseline = Some(baseline.clone());
        let mut cells = cells;
        for &strategy in &job.options.strategies {
            let mut runs = BenchStrategyRuns {
                strategy: strategy.as_str().into(),
                skipped: job.skipped.get(&strategy).cloned(),
                runs: Vec::new(),
            };
            if runs.skipped.is_none() {
                for &n in &job.options.replicas {
                    if strategy == BenchStrategy::TimeSlicing && n == 1 {
                        // The baseline is exactly this run.
                        let describe = time_slicing().describe;
                        runs.runs.push(BenchRun {
                            setup: describe,
                            setup_ms: None,
                            ..baseline.clone()
                        });
                        continue;
                    }
                    let Some(cell) = cells.iter_mut().find(|c| c.strategy == strategy && c.n == n)
                    else {
                        continue;
                    };
                    let measured = std::mem::take(&mut cell.runs);
                    if let Some(mut run) = stats::cell_run(measured) {
                        if run.error.is_none() {
                            stats::against_baseline(&mut run, &baseline);
                            stats::check_scaling(&mut run, &baseline, floor);
                        }
                        run.setup_ms = cell.setup_ms;
                        runs.runs.push(run);
                    }
                }
            }
            report.strategies.push(runs);
        }
        report.intervals =
            intervals_text(job.options.repeat, baseline.repeat_throughputs_per_s.len());
        report.recommendations =
            stats::recommend(&report.strategies, job.options.objective, report.rate_unit(), floor);
        if let Some(slo) = job.options.slo {
            report.capacity = stats::capacity(
                &report.strategies,
                slo,
                job.options.fleet,
                floor,
                &report.sequence,
            );
        }
    }

    /// Sets one strategy up by an ordinary transaction, planned from an observation
    /// with `reads`; how long it took, ms.
    async fn bench_setup(
        &self,
        job: &BenchJob,
        setup: &Setup,
        reads: Reads,
        progress: &UnboundedSender<Progress>,
    ) -> Result<f64, String> {
        let started = Instant::now();
        let profile = whole_gpu(
            &format!("bench-{}", setup.strategy),
            &job.uuid,
            setup.mig.clone(),
            setup.sharing.clone(),
        );
        self.apply_unlocked(profile, reads, &quiet(progress)).await?;
        Ok(started.elapsed().as_secs_f64() * 1000.0)
    }

    /// Plans `profile` from an observation with `reads` and applies it while the caller
    /// holds the apply lock (a bench's own steps): the same planner, journal and rollback
    /// as any apply.
    async fn apply_unlocked(
        &self,
        profile: Profile,
        reads: Reads,
        progress: &UnboundedSender<Progress>,
    ) -> Result<(), String> {
        let before = self.core.node.observe(reads).await.map_err(|e| e.to_string())?;
        let plan = plan::plan(&before, &profile, &self.core.policy).map_err(|e| e.to_string())?;
        self.transactions
            .apply(&plan, None, &before, progress)
            .await
            .map(|_| ())
            .map_err(|e| format!("setting up {}: {e}", profile.name))
    }

    /// Runs N replicas under the strategy just set up and summarizes them; the replicas'
    /// output goes to the run's directory `run` (`mps-3`) in the caller's log directory.
    /// Its comparisons with the baseline are made at the end ([`stats::against_baseline`]);
    /// `opened` is called as its window opens.
    async fn bench_run(
        &self,
        job: &BenchJob,
        setup: &Setup,
        n: u32,
        run: String,
        opened: Box<dyn FnMut() + Send>,
    ) -> Result<(BenchRun, Option<HostNoise>), String> {
        let node =
            self.core.node.observe(Reads::GPUS_AND_SERVERS).await.map_err(|e| e.to_string())?;
        let devices = match self.replica_devices(&node, job, setup, n) {
            Ok(d) => d,
            Err(e) => return Ok((error_run(n, setup.describe.clone(), e), None)),
        };
        let cpus = job
            .pinning
            .as_ref()
            .map(|p| (0..n as usize).map(|i| p.replica(i).unwrap_or_default().to_vec()).collect());
        let program = agent_binary()?;
        let time_limit = Duration::from_secs_f64(job.options.time_limit);
        let spec = RunSpec {
            command: job.options.replica_command(&program)?,
            env: job.options.base_environment(),
            devices,
            cwd: job.options.cwd_text(),
            logs: job.options.logs_text().map(|dir| (dir, run)),
            method: job.options.method(),
            time_limit,
            cpus,
        };
        let mut opened = opened;
        let launcher = std::sync::Arc::clone(&self.launcher);
        let identity = job.identity.clone();
        let label = job.label.clone();
        let journal = std::sync::Arc::clone(&self.core.journal);
        let cancel = job.cancel.clone();
        let node_access = self.core.node.clone();
        let gpu = job.gpu;
        let handle = tokio::runtime::Handle::current();
        let outcome = tokio::task::spawn_blocking(move || {
            let launch = Launch {
                launcher: &launcher,
                program: &program,
                identity: identity.as_ref(),
                label: &label,
                runtime_max: time_limit + UNIT_SLACK,
                cancel: Some(&cancel),
            };
            let mut started = |handles| {
                if let Err(e) = journal.bench_replicas(handles) {
                    tracing::warn!("recording the bench's replicas in the journal: {e}");
                }
            };
            let mut memory = || {
                handle
                    .block_on(node_access.observe(Reads::GPUS_AND_SERVERS))
                    .ok()
                    .and_then(|node| node.gpu(gpu).map(process_memory))
                    .unwrap_or_default()
            };
            let result =
                measure::run(&spec, &launch, &cancel, &mut started, &mut memory, &mut *opened);
            let _ = journal.bench_replicas(Vec::new());
            result
        })
        .await
        .map_err(|e| format!("the bench runner failed: {e}"))??;
        let mut run = stats::summarize_run(n, setup.describe.clone(), outcome.measures, None);
        run.error = outcome.error;
        run.agent_cpu_percent = outcome.agent_cpu_percent;
        Ok((run, outcome.host))
    }

    /// Per replica, the variables of its device under the strategy set up now.
    fn replica_devices(
        &self,
        node: &NodeState,
        job: &BenchJob,
        setup: &Setup,
        n: u32,
    ) -> Result<Vec<Vec<(String, String)>>, String> {
        let strategy = (ENV_STRATEGY.to_string(), setup.strategy.as_str().to_string());
        let devices: Vec<Vec<(String, String)>> = if setup.strategy == BenchStrategy::Mig {
            let g = node.gpu(job.gpu).ok_or("the GPU is gone")?;
            let instances: Vec<String> = g
                .instances
                .iter()
                .filter_map(|gi| gi.compute_instances.first().map(|ci| ci.uuid.clone()))
                .collect();
            if instances.len() < n as usize {
                return Err(format!("{} MIG instances set up, {n} needed", instances.len()));
            }
            instances
                .into_iter()
                .take(n as usize)
                .map(|uuid| vec![("CUDA_VISIBLE_DEVICES".to_string(), uuid), strategy.clone()])
                .collect()
        } else {
            let (env, _) = self.env_for(node, &job.uuid).map_err(|e| e.to_string())?;
            (0..n)
                .map(|_| {
                    let mut v = env.variables.clone();
                    v.push(strategy.clone());
                    v
                })
                .collect()
        };
        Ok(devices)
    }
}

/// This binary: the replicas' gate, and the built-in workloads.
fn agent_binary() -> Result<PathBuf, String> {
    std::env::current_exe().map_err(|e| format!("cannot find the agent binary: {e}"))
}

/// Whom the replicas of `caller` run as: exactly the caller (uid, the passwd entry's
/// primary group, the bus's supplementary groups), when the agent is root; an agent that
/// is not root starts them as itself, which only its own user may ask for.
fn replica_identity(caller: &Caller) -> Result<Option<Identity>, EngineError> {
    let own = unix::effective_uid();
    if own != 0 {
        if caller.uid != own {
            return Err(EngineError::NotPossible(format!(
                "this agent runs as uid {own}, not as root: it starts replicas as uid {own} only, and the caller is uid {}",
                caller.uid
            )));
        }
        return Ok(None);
    }
    Identity::of_caller(caller.uid, caller.groups.as_deref()).map(Some).map_err(|e| {
        EngineError::NotPossible(format!("the replicas' user (uid {}): {e}", caller.uid))
    })
}

/// A whole GPU without MIG, idle: what a bench may change the sharing of.
fn whole_gpu_target<'a>(node: &'a NodeState, target: &str) -> Result<&'a GpuState, EngineError> {
    let g = if let Ok(index) = target.parse::<u32>() {
        node.gpu(index)
    } else {
        node.gpus.iter().find(|g| g.uuid.eq_ignore_ascii_case(target))
    };
    let Some(g) = g else {
        let is_mig = target.to_ascii_uppercase().starts_with("MIG-");
        return Err(EngineError::InvalidArgument(if is_mig {
            format!(
                "target {target}: bench changes the sharing of a whole GPU; name the GPU (index or GPU-…), not a MIG instance"
            )
        } else {
            crate::plan::no_such_gpu(node, target, false)
        }));
    };
    if g.mig_enabled {
        // A GPU of this node the bench could take as it is, if there is one.
        let whole: Vec<String> = node
            .gpus
            .iter()
            .filter(|o| !o.mig_enabled && o.processes.is_empty())
            .map(|o| o.index.to_string())
            .collect();
        let instead = match whole.as_slice() {
            [] => String::new(),
            [one] => format!("--target {one} (without MIG), or "),
            [first, ..] => format!("--target {first} (GPU {} have no MIG), or ", whole.join(", ")),
        };
        return Err(EngineError::NotPossible(format!(
            "{} has MIG on: bench starts from a whole GPU; give {instead}apply a profile without MIG on it first",
            g.label()
        )));
    }
    if !g.processes.is_empty() {
        let pids: Vec<String> = g.processes.iter().map(|p| p.pid.to_string()).collect();
        return Err(EngineError::NotPossible(format!(
            "bench would change the sharing under compute processes on {} (PID {}); run it when the GPU is idle",
            g.label(),
            pids.join(", ")
        )));
    }
    Ok(g)
}

/// The baseline's ratios, each against itself (1 where the figure exists), so that its
/// row reads like the others.
fn against_itself(run: &mut BenchRun) {
    let same = |x: Option<f64>| x.filter(|&v| v > 0.0).map(|v| stats::inflation(v, v));
    run.scaling = same(Some(run.throughput_per_s));
    run.p50_inflation = same(run.p50_ms);
    run.p99_inflation = same(run.p99_ms);
    for r in &mut run.per_replica {
        r.slowdown = same(Some(r.throughput_per_s).filter(|_| !r.failed));
    }
    run.max_slowdown = run.per_replica.iter().filter_map(|r| r.slowdown).reduce(f64::max);
}

/// What the setups after the first are planned from: every strategy of a bench runs at
/// the default time-slice interval, which the first setup saw to, and the bench holds the
/// apply lock throughout; so the interval is not read again (an nvidia-smi run, the largest
/// part of a switch otherwise). MPS clients are: a plan must not stop a server in use.
const BENCH_SETUP_READS: Reads = Reads { timeslices: false, mps_clients: true };

/// A run without figures (set up as `setup` says, if it got that far), and why.
fn error_run(n: u32, setup: String, why: String) -> BenchRun {
    let mut run = stats::summarize_run(n, setup, Vec::<ReplicaMeasure>::new(), None);
    run.error = Some(why);
    run
}

/// A progress sink for a bench's own transactions: their steps go out as lines without
/// a count, under the bench's step.
fn quiet(progress: &UnboundedSender<Progress>) -> UnboundedSender<Progress> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Progress>();
    let out = progress.clone();
    tokio::spawn(async move {
        while let Some(p) = rx.recv().await {
            let _ = out.send(Progress { done: 0, total: 0, step: format!("  {}", p.step) });
        }
    });
    tx
}

/// GPU memory per process, as NVML lists the GPU's compute processes.
fn process_memory(g: &GpuState) -> HashMap<u32, u64> {
    g.processes.iter().filter_map(|p| p.used_memory_bytes.map(|b| (p.pid, b))).collect()
}
