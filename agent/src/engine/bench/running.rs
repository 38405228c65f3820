//! Running a bench ([`Engine::run_bench`]): the baseline's setup, then the rounds of
//! measurements in their order ([`super::rounds`]), each strategy set up by an ordinary
//! transaction as its cell comes, its replicas started as the caller and measured
//! ([`crate::bench::measure`]) with the devices its strategy gives them
//! ([`super::strategies`]); at the end, or at a failure, a cancel or the bench's bound,
//! the GPU restored ([`super::restore`]) and the report's figures made
//! ([`super::figures`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gpushare_proto::bench::{BenchMeasurement, BenchReport, BenchRun, ENV_STRATEGY};
use gpushare_proto::plural;
use tokio::sync::mpsc::UnboundedSender;

use super::BenchJob;
use super::figures::{self, HostTotals, worst_p99};
use super::limits;
use super::rounds::{Item, Timing, partial_text, round_order};
use super::setups::{Setup, time_slicing, whole_gpu};
use super::strategies::{self, Devices};
use crate::apply::{Progress, Reads};
use crate::bench::host_noise::HostNoise;
use crate::bench::measure::{self, RunSpec};
use crate::bench::pinning::Pinning;
use crate::bench::replicas::Launch;
use crate::bench::stats::{self, ReplicaMeasure};
use crate::engine::jobs::{JobKind, JobReport, JobResult};
use crate::engine::{Engine, EngineError};
use crate::node::{GpuState, NodeState};
use crate::plan;
use crate::profile::Profile;

/// How long a replica's unit may outlive its time limit (starting, stopping).
const UNIT_SLACK: Duration = Duration::from_secs(300);

impl Engine {
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
        let bound = self.bench_parts().limits.max_total;
        let cancel = job.cancel.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(bound).await;
            cancel.cancel_because(limits::reached(bound));
        });
        let measured = self.bench_runs(job, &progress, &mut outcome, &mut report, started).await;
        timer.abort();
        let _ = progress.send(Progress {
            done: outcome.steps_total.saturating_sub(1),
            total: outcome.steps_total,
            step: "restoring the GPU's sharing".into(),
        });
        let restored = match self.bench_parts().journal.snapshot().bench {
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
        self.set_running_bench(None);
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
                let bound = (self.bench_parts().limits.max_total, job.cancel.clone());
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
        figures::figures(job, report, baseline_runs, cells, setup0_ms, &host);
        result
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
        let parts = self.bench_parts();
        let before = parts.node.observe(reads).await.map_err(|e| e.to_string())?;
        let plan = plan::plan(&before, &profile, parts.policy).map_err(|e| e.to_string())?;
        parts
            .transactions
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
        let parts = self.bench_parts();
        let node = parts.node.observe(Reads::GPUS_AND_SERVERS).await.map_err(|e| e.to_string())?;
        let devices = match self.replica_devices(&node, job, setup, n) {
            Ok(d) => d,
            Err(e) => return Ok((error_run(n, setup.describe.clone(), e), None)),
        };
        let cpus = job
            .pinning
            .as_ref()
            .map(|p| (0..n as usize).map(|i| p.replica(i).unwrap_or_default().to_vec()).collect());
        let program = crate::sys::agent_binary()?;
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
        let launcher = std::sync::Arc::clone(parts.launcher);
        let identity = job.identity.clone();
        let label = job.label.clone();
        let journal = std::sync::Arc::clone(parts.journal);
        let cancel = job.cancel.clone();
        let node_access = parts.node.clone();
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
        let devices: Vec<Vec<(String, String)>> = match strategies::of(setup.strategy).devices {
            Devices::MigInstances => {
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
            }
            Devices::WholeGpu => {
                let env = self.bench_client_env(node, &job.uuid).map_err(|e| e.to_string())?;
                (0..n)
                    .map(|_| {
                        let mut v = env.variables.clone();
                        v.push(strategy.clone());
                        v
                    })
                    .collect()
            }
        };
        Ok(devices)
    }
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
