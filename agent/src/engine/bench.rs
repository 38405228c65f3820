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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpushare_proto::bench::{
    BENCH_BASELINE_RUNS, BENCH_MAX_DURATION, BENCH_MAX_REPEAT, BENCH_MAX_REPLICAS,
    BENCH_MAX_TIME_LIMIT, BENCH_MIN_SECONDS, BenchMeasurement, BenchReport, BenchRun,
    BenchStrategy, BenchStrategyRuns, ENV_STRATEGY, Objective, Slo, seconds_text,
};
use gpushare_proto::{plural, readable_size};
use tokio::sync::mpsc::UnboundedSender;

use super::jobs::{JobGuard, JobKind, JobReport, JobResult, RunningJob};
use super::{Engine, EngineError, bench_limits};
use crate::apply::journal::{BenchRecord, GpuCheckpoint};
use crate::apply::{Progress, Purpose, Reads};
use crate::bench::host_noise::HostNoise;
use crate::bench::measure::{self, Cancel, Method, RunSpec};
use crate::bench::pinning::{self, CpuList, Pinning};
use crate::bench::replicas::Launch;
use crate::bench::stats::{self, ReplicaMeasure};
use crate::gpu::BackendKind;
use crate::node::{GpuState, NodeState};
use crate::plan;
use crate::probe::Workload;
use crate::profile::{self, MigKey, MigLayout, Profile, Sharing as ProfileSharing};
use crate::sys::unix::{self, Identity};

/// How long a replica's unit may outlive its time limit (starting, stopping).
const UNIT_SLACK: Duration = Duration::from_secs(300);

/// Variables of the caller's environment the bench sets itself for each replica.
const OWN_VARIABLES: [&str; 4] = [
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
    "GPUSHARE_BENCH_",
];

/// What a bench runs, as the transport read it.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchOptions {
    /// GPU index or `GPU-…`; GPU 0 when absent.
    pub target: Option<String>,
    /// The command each replica runs; empty with `builtin`.
    pub command: Vec<String>,
    /// A built-in CUDA workload instead of a command (the probe's, reporting each step
    /// as a unit).
    pub builtin: Option<Workload>,
    /// Replica counts, in order.
    pub replicas: Vec<u32>,
    /// Strategies, in order.
    pub strategies: Vec<BenchStrategy>,
    /// The window of each run; `None`: until each replica exits.
    pub duration: Option<f64>,
    /// What the recommendation optimizes.
    pub objective: Objective,
    /// The service level capacity is sized for.
    pub slo: Option<Slo>,
    /// The histogram each replica serves (histogram method).
    pub histogram: Option<String>,
    /// Replicas a fleet needs, for the cost figures.
    pub fleet: u32,
    /// Longest a replica may run, seconds.
    pub time_limit: f64,
    /// How often each run is measured (the baseline at least [`BENCH_BASELINE_RUNS`]
    /// times); the median measurement is reported.
    pub repeat: u32,
    /// The replicas' working directory (absolute).
    pub cwd: PathBuf,
    /// The replicas' environment (the caller's).
    pub environment: Vec<(String, String)>,
    /// The caller's directory for the replicas' output (absolute); `None`: not kept.
    pub logs: Option<PathBuf>,
    /// The CPUs to divide among the replicas, as a CPU list; `None`: the agent's on the
    /// GPU's NUMA node.
    pub cpus: Option<String>,
    /// Whether the replicas are pinned to CPUs (`--no-pin`: false).
    pub pin: bool,
    /// Whether the replica counts were given (the defaults are capped by the CPUs there
    /// are to pin them; given ones are refused above it).
    pub replicas_given: bool,
}

/// Who asks for a bench, as the bus knows the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The caller's user.
    pub uid: u32,
    /// The caller's supplementary groups (`UnixGroupIDs`), when the bus knows them.
    pub groups: Option<Vec<u32>>,
}

impl BenchOptions {
    /// How the runs are measured: to exit without a window, else by the histogram when
    /// one is named, else by units.
    fn method(&self) -> Method {
        match (&self.histogram, self.duration) {
            (_, None) => Method::UntilExit,
            (None, Some(d)) => Method::Units(Duration::from_secs_f64(d)),
            (Some(name), Some(d)) => {
                Method::Histogram { name: name.clone(), window: Duration::from_secs_f64(d) }
            }
        }
    }

    /// Checks what needs no node: counts, strategies, durations, the command, the
    /// directory. Each refusal is one line naming the option.
    fn validate(&self) -> Result<(), EngineError> {
        let bad = |m: String| Err(EngineError::InvalidArgument(m));
        if self.replicas.is_empty() {
            return bad("replicas: give at least one replica count".into());
        }
        if let Some(n) = self.replicas.iter().find(|n| !(1..=BENCH_MAX_REPLICAS).contains(*n)) {
            return bad(format!("replicas: {n} is not from 1 to {BENCH_MAX_REPLICAS}"));
        }
        if self.strategies.is_empty() {
            return bad("strategies: give at least one strategy".into());
        }
        if let Some(d) =
            self.duration.filter(|d| !(BENCH_MIN_SECONDS..=BENCH_MAX_DURATION).contains(d))
        {
            return bad(format!("duration: {} is not from 1 s to 1 hour", seconds_text(d)));
        }
        if !(BENCH_MIN_SECONDS..=BENCH_MAX_TIME_LIMIT).contains(&self.time_limit) {
            let limit = seconds_text(self.time_limit);
            return bad(format!("time_limit: {limit} is not from 1 s to 24 hours"));
        }
        if self.duration.is_some_and(|d| d >= self.time_limit) {
            return bad("duration: the window must be shorter than the time limit".into());
        }
        if self.histogram.is_some() && self.duration.is_none() {
            return bad("histogram: the histogram method needs a window, not until_exit".into());
        }
        if self.fleet == 0 {
            return bad("fleet: a fleet has at least one replica".into());
        }
        if !(1..=BENCH_MAX_REPEAT).contains(&self.repeat) {
            return bad(format!("repeat: {} is not from 1 to {BENCH_MAX_REPEAT}", self.repeat));
        }
        if let Some(cpus) = &self.cpus {
            if !self.pin {
                return bad("cpus: the replicas are not pinned (pin = false)".into());
            }
            CpuList::parse(cpus).map_err(EngineError::InvalidArgument)?;
        }
        // Whether they exist, and what the caller may do there, the check gate finds out
        // as the caller: the agent never looks at a caller's paths itself.
        if !self.cwd.is_absolute() || self.cwd.to_str().is_none() {
            return bad(format!("cwd: {} is not an absolute path", self.cwd.display()));
        }
        if let Some(logs) = self.logs.as_ref().filter(|l| !l.is_absolute() || l.to_str().is_none())
        {
            return bad(format!("logs: {} is not an absolute path", logs.display()));
        }
        match (self.command.first(), self.builtin) {
            (Some(_), Some(_)) => bad("give a command or a built-in workload, not both".into()),
            (None, None) => bad("give the command the replicas run".into()),
            _ => Ok(()),
        }
    }

    /// What each replica runs: the command, or this binary running the built-in workload.
    fn replica_command(&self, program: &Path) -> Result<Vec<String>, String> {
        match self.builtin {
            Some(w) => {
                let exe = program.to_str().ok_or("the agent's path is not UTF-8")?;
                Ok(vec![exe.into(), "--bench-builtin".into(), w.as_str().into()])
            }
            None => Ok(self.command.clone()),
        }
    }

    /// The working directory as the replicas get it.
    fn cwd_text(&self) -> String {
        self.cwd.to_string_lossy().into_owned()
    }

    /// The log directory as the replicas get it.
    fn logs_text(&self) -> Option<String> {
        self.logs.as_ref().map(|l| l.to_string_lossy().into_owned())
    }

    /// The command as the report names it.
    fn described_command(&self) -> Vec<String> {
        match self.builtin {
            Some(w) => vec![format!("builtin:{w}")],
            None => self.command.clone(),
        }
    }

    /// The caller's environment without what the bench sets itself.
    fn base_environment(&self) -> Vec<(String, String)> {
        self.environment
            .iter()
            .filter(|(k, _)| !OWN_VARIABLES.iter().any(|own| k.starts_with(own)))
            .cloned()
            .collect()
    }
}

/// How one strategy is set up for N replicas.
#[derive(Debug, Clone, PartialEq)]
struct Setup {
    strategy: BenchStrategy,
    mig: MigLayout,
    sharing: ProfileSharing,
    /// For people: `MPS, 33 % threads, 26 GiB each`.
    describe: String,
}

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
        if let Some(record) = self.journal.snapshot().bench.filter(|b| b.restore_error.is_some()) {
            return Err(EngineError::NotPossible(format!(
                "restoring the GPU after the bench {} failed ({}); apply a profile first",
                record.job,
                record.restore_error.unwrap_or_default()
            )));
        }
        let asked = tokio::time::Instant::now();
        // A bench that runs (one measurement at a time on a node), or a job holding the
        // lock that no one waits for, says so first, before the caller's check.
        if let Some(claim) = self.claims.all().first() {
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
        let stopping = self.stopping.load(std::sync::atomic::Ordering::SeqCst);
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
        let _named = self.moments.hold(format!("a bench being checked ({job}, started by {who})"));
        let node = self.node.observe(Reads::FOR_PLANNING).await?;
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
                Some(_) if !self.policy.manage_mig => {
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
            let plan = plan::plan(&node, &profile, &self.policy)
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

        let before = self.journal.snapshot();
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
        self.journal
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
        if self.stopping.load(std::sync::atomic::Ordering::SeqCst) {
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
        self.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
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
        };
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
        let restored = match self.journal.snapshot().bench {
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
                let (run, noise) = self.bench_run(job, &setup, n, logs, opened).await?;
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
                let cancelled = run.error.as_deref() == Some("cancelled");
                match item {
                    Item::Baseline => {
                        if broken && !cancelled {
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
                if cancelled {
                    result = Err(job.cancel.reason());
                    break 'rounds;
                }
            }
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
        let (floor, noise) = stats::noise(&measured_alone, host.steal(), &host.frequency_mhz);
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
                            stats::check_scaling(&mut run, floor);
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

    /// The CPUs each replica is pinned to (`None` with `pin = false`), and the default
    /// replica counts left out for want of CPUs: a count above the CPUs there are is
    /// refused when given, left out (and said so) when it is a default.
    async fn bench_pinning(
        &self,
        options: &mut BenchOptions,
        gpu: u32,
    ) -> Result<(Option<Pinning>, String), EngineError> {
        if !options.pin {
            return Ok((None, String::new()));
        }
        let (cpus, from) = match &options.cpus {
            None => {
                let bus_id = self.node.pci_bus_id(gpu).await;
                let root = self.node.host_root.clone();
                tokio::task::spawn_blocking(move || pinning::available(&root, bus_id.as_deref()))
                    .await
                    .map_err(|e| {
                        EngineError::Internal(format!(
                            "finding the CPUs: {}",
                            crate::sys::task_failed(&e)
                        ))
                    })?
                    .map_err(EngineError::Internal)?
            }
            Some(text) => {
                let list = CpuList::parse(text).map_err(EngineError::InvalidArgument)?;
                let own = unix::cpu_affinity()
                    .map_err(|e| EngineError::Internal(format!("the agent's CPUs: {e}")))?;
                let outside: Vec<u32> =
                    list.cpus().iter().copied().filter(|c| !own.contains(c)).collect();
                if !outside.is_empty() {
                    return Err(EngineError::InvalidArgument(format!(
                        "cpus: CPU {} is not among the agent's CPUs ({})",
                        pinning::format_cpus(&outside),
                        pinning::format_cpus(&own)
                    )));
                }
                let topology = pinning::Topology::read(Path::new("/"), list.cpus());
                (topology.sibling_order(list.cpus()), "--cpus".to_owned())
            }
        };
        let most = u32::try_from(cpus.len()).unwrap_or(u32::MAX);
        let mut capped = String::new();
        if !options.replicas_given && options.replicas.iter().any(|&n| n > most) {
            let (kept, left): (Vec<u32>, Vec<u32>) =
                options.replicas.iter().partition(|&&n| n <= most);
            let left: Vec<String> = left.iter().map(u32::to_string).collect();
            capped = format!(
                "{} replicas left out: {} to pin one replica each ({}, {from}); --no-pin runs them unpinned",
                left.join(", "),
                plural(most, "CPU"),
                pinning::format_cpus(&cpus)
            );
            options.replicas = kept;
        }
        let max = options.replicas.iter().copied().max().unwrap_or(1);
        let plan = pinning::plan(&cpus, &from, max).map_err(EngineError::InvalidArgument)?;
        Ok((Some(plan), capped))
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
        let before = self.node.observe(reads).await.map_err(|e| e.to_string())?;
        let plan = plan::plan(&before, &profile, &self.policy).map_err(|e| e.to_string())?;
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
        let node = self.node.observe(Reads::GPUS_AND_SERVERS).await.map_err(|e| e.to_string())?;
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
        let journal = std::sync::Arc::clone(&self.journal);
        let cancel = job.cancel.clone();
        let node_access = self.node.clone();
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

    /// Puts back what a bench found: stops replicas left behind and returns the GPU to its
    /// checkpoint (in turn with other transactions); the active profile stays the one
    /// committed last. Returns what it restored, for the report. A failure is kept in the journal's record (shown by
    /// `status`, never replayed).
    async fn restore_bench(
        &self,
        record: &BenchRecord,
        progress: &UnboundedSender<Progress>,
    ) -> Result<String, String> {
        self.stop_left_over(record.replicas.clone(), record.uid).await;
        let restore = self.transactions.restore(&record.checkpoint, Purpose::Restore, progress);
        let restored = match restore.await {
            Ok(steps) => self
                .journal
                .end_bench()
                .map(|()| steps)
                .map_err(|e| format!("writing the journal: {e}")),
            Err(e) => Err(e),
        };
        match restored {
            Ok(steps) => {
                // The profile committed last: the one before the bench, or one applied to
                // another GPU during it (a bench's setups are never active).
                let profile = self.journal.active_profile().unwrap_or_else(|| "none".into());
                let gpus: Vec<String> =
                    record.checkpoint.iter().map(|c| c.gpu.to_string()).collect();
                Ok(format!(
                    "GPU {} as before the bench ({steps} steps); active profile {profile}",
                    gpus.join(", ")
                ))
            }
            Err(e) => {
                if let Err(w) = self.journal.bench_restore_failed(&e) {
                    tracing::error!("recording the bench's failed restore in the journal: {w}");
                }
                Err(e)
            }
        }
    }

    /// Stops replicas an agent before this one (or this bench) left running.
    async fn stop_left_over(&self, handles: Vec<crate::apply::journal::ReplicaHandle>, uid: u32) {
        let launcher = std::sync::Arc::clone(&self.launcher);
        let stopped =
            tokio::task::spawn_blocking(move || launcher.stop_left_over(&handles, uid)).await;
        if let Ok(n) = stopped
            && n > 0
        {
            tracing::warn!("stopped {n} bench replica(s) left running");
        }
    }

    /// At start-up: a bench the journal shows in flight was interrupted (the agent
    /// stopped or died): its replicas are stopped and the GPU restored, before the agent
    /// serves. A bench whose restore failed earlier is not tried again (an apply may have
    /// come since; the next one settles it). Returns what was done, for the log.
    pub async fn recover_bench(&self) -> Result<Option<String>, EngineError> {
        let Some(record) = self.journal.snapshot().bench else {
            // Under systemd: units of a bench the journal no longer knows of.
            self.stop_left_over(Vec::new(), 0).await;
            return Ok(None);
        };
        if let Some(error) = &record.restore_error {
            self.stop_left_over(record.replicas.clone(), record.uid).await;
            return Ok(Some(format!(
                "restoring the GPU after the bench {} failed earlier ({error}); not tried again: the next apply settles it",
                record.job
            )));
        }
        self.may_change()?;
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        Ok(Some(match self.restore_bench(&record, &tx).await {
            Ok(restored) => format!("the bench {} was interrupted: {restored}", record.job),
            Err(e) => format!(
                "the bench {} was interrupted, and restoring the GPU failed: {e} (status shows it; the next apply settles it)",
                record.job
            ),
        }))
    }
}

/// One cell of a bench: a strategy at a replica count, measured once a round.
struct Cell {
    strategy: BenchStrategy,
    n: u32,
    /// How it is set up; an error is the cell's figure (`8 instances do not fit`).
    setup: Result<Setup, String>,
    /// Its measurements, in order.
    runs: Vec<BenchRun>,
    /// How long its first setup took, ms.
    setup_ms: Option<f64>,
    /// Measured no more: a measurement failed, and that failure is what is reported.
    done: bool,
}

/// What a bench measures next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    /// One replica alone on the whole GPU without MPS.
    Baseline,
    /// The cell of this index ([`BenchJob::cells`]).
    Cell(usize),
}

/// The measurements of round `round` (1-based) of `repeat`, of a bench of `cells` cells:
/// the baseline first, then every cell once, forward in odd rounds and backward in even
/// ones, so that a drift over the bench falls on every cell alike (round-robin over
/// strategies and replica counts, never one strategy's repeats back to back). The first
/// round measures the baseline more than once when there are fewer rounds than
/// [`BENCH_BASELINE_RUNS`], so that it is always measured at least that often: every
/// ratio divides by it, and its spread is the host's noise.
fn round_order(round: u32, repeat: u32, cells: usize) -> Vec<Item> {
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
struct Timing {
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
    first_estimate: Option<f64>,
    /// Shared with the window hook, which makes the first estimate.
    shared: std::sync::Arc<std::sync::Mutex<Option<f64>>>,
}

/// What a replica's stop and reaping take after its window, a guess until measured.
const STOP_GUESS: f64 = 0.1;

impl Timing {
    fn new(
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

    fn mean(values: &[f64]) -> Option<f64> {
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    }

    /// A setup took `seconds`.
    fn set_up(&mut self, seconds: f64) {
        self.setup_seconds.push(seconds);
        self.setups_left = self.setups_left.saturating_sub(1);
    }

    /// A planned measurement is not taken (its cell failed or could not be set up).
    fn skipped(&mut self) {
        self.measurements_left = self.measurements_left.saturating_sub(1);
    }

    /// A measurement is over.
    fn measured(&mut self, _run: &BenchRun) {
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
    fn left_text(&mut self) -> String {
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
    fn window_hook(
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
                    bound.1.cancel_because(bench_limits::estimated_over(estimate, bound.0));
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

/// `45 s`, `6m 05s`, `1h 02m`.
pub(super) fn duration_text(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
    }
}

/// The replicas' CPUs over every window: steal and clock.
#[derive(Default)]
struct HostTotals {
    steal: Vec<f64>,
    frequency_mhz: Vec<f64>,
}

impl HostTotals {
    fn add(&mut self, noise: Option<HostNoise>) {
        if let Some(noise) = noise {
            self.steal.extend(noise.steal_percent);
            self.frequency_mhz.extend(noise.frequency_mhz);
        }
    }

    /// The mean steal over the windows (of equal length).
    fn steal(&self) -> Option<f64> {
        Timing::mean(&self.steal)
    }
}

/// The worst replica's p99 of a run, ms.
fn worst_p99(run: &BenchRun) -> Option<f64> {
    run.per_replica.iter().filter(|r| !r.failed).filter_map(|r| r.p99_ms).reduce(f64::max)
}

/// How the runs' intervals were found, for the report.
/// How sure the range of `n` measurements is to hold their median (distribution-free:
/// it misses only when all fall on one side), percent: 75 for 3, 88 for 4, 94 for 5.
fn range_coverage(n: u32) -> f64 {
    100.0 * (1.0 - 0.5f64.powi(i32::try_from(n).unwrap_or(i32::MAX).saturating_sub(1)))
}

fn intervals_text(repeat: u32, baseline_measurements: usize) -> String {
    let base_n = u32::try_from(baseline_measurements).unwrap_or(u32::MAX);
    let baseline = format!(
        "the baseline's is the range of its {baseline_measurements} measurements, which holds its median with {:.0} % confidence",
        range_coverage(base_n)
    );
    match repeat {
        1 => format!(
            "runs measured once have no interval ({baseline}); they are compared through the host's noise floor. --repeat 5 or more gives each run a 94 % interval of its median"
        ),
        k @ 2..=5 => format!(
            "percentile bootstrap of the median over each run's {k} measurements, one per round ({} resamples): with {k} it is their range, which holds the median with {:.0} % confidence ({baseline}); --repeat 6 or more gives 95 %",
            stats::BOOTSTRAP_RESAMPLES,
            range_coverage(k)
        ),
        k => format!(
            "95 % percentile-bootstrap interval of the median over each run's {k} measurements, one per round ({} resamples)",
            stats::BOOTSTRAP_RESAMPLES
        ),
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
            format!("target {target}: no such GPU on this node (see gpushare-ctl status)")
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

/// The whole GPU without MPS: the driver's time-slicing between the replicas.
fn time_slicing() -> Setup {
    Setup {
        strategy: BenchStrategy::TimeSlicing,
        mig: MigLayout::Disabled,
        sharing: ProfileSharing::Exclusive,
        describe: "whole GPU, no MPS".into(),
    }
}

/// How `strategy` is set up for `n` replicas on a GPU with `memory` bytes.
fn setup(
    strategy: BenchStrategy,
    n: u32,
    memory: u64,
    mig_sizes: &HashMap<u32, Result<(u8, String), String>>,
) -> Result<Setup, String> {
    Ok(match strategy {
        BenchStrategy::TimeSlicing => time_slicing(),
        BenchStrategy::Mps => Setup {
            strategy,
            mig: MigLayout::Disabled,
            sharing: ProfileSharing::Mps(profile::MpsSettings {
                active_thread_percentage: Some(100),
                ..Default::default()
            }),
            describe: "MPS, no limits".into(),
        },
        BenchStrategy::MpsLimited => {
            let threads = (100 / n).max(1);
            // Whole MiB, as MPS takes its memory limits.
            let each = (memory / u64::from(n)) & !((1 << 20) - 1);
            Setup {
                strategy,
                mig: MigLayout::Disabled,
                sharing: ProfileSharing::Mps(profile::MpsSettings {
                    active_thread_percentage: Some(threads),
                    pinned_memory_limit_bytes: Some(each),
                    ..Default::default()
                }),
                describe: format!("MPS, {threads} % threads, {} each", readable_size(each)),
            }
        }
        BenchStrategy::Mig => {
            let (slices, name) = match mig_sizes.get(&n) {
                Some(Ok(size)) => size.clone(),
                Some(Err(why)) => return Err(why.clone()),
                None => return Err("no MIG size worked out".into()),
            };
            Setup {
                strategy,
                mig: MigLayout::Enabled(vec![(MigKey::Slices(slices), n)]),
                sharing: ProfileSharing::Exclusive,
                describe: format!("{n} × {name}"),
            }
        }
    })
}

/// The largest MIG instance of which `n` fit on `model` (7×1g, 3×2g, 2×3g, 1×7g on an
/// A100 or H100: `n` = 5 gets five 1g instances).
fn mig_size(model: &gpushare_catalog::GpuModel, n: u32) -> Result<(u8, String), String> {
    model
        .mig_profiles
        .iter()
        .filter(|p| p.is_plain() && u32::from(p.max_count) >= n)
        .filter(|p| model.profile_by_compute_slices(p.compute_slices).map(|q| q.id) == Some(p.id))
        .max_by_key(|p| (p.compute_slices, std::cmp::Reverse(p.memory_mib)))
        .map(|p| (p.compute_slices, p.name.to_string()))
        .ok_or_else(|| {
            let most = model.mig_profiles.iter().map(|p| p.max_count).max().unwrap_or(0);
            format!("no MIG layout with {n} instances on {} (at most {most})", model.display_name)
        })
}

/// A profile that sets one whole GPU's MIG layout and sharing and leaves every other GPU
/// alone.
pub(super) fn whole_gpu(
    name: &str,
    uuid: &str,
    mig: MigLayout,
    sharing: ProfileSharing,
) -> Profile {
    Profile {
        name: name.into(),
        description: "set up by a bench or probe comparison".into(),
        rules: vec![profile::GpuRule {
            select: profile::Selector::Uuid(uuid.into()),
            device_filter: Vec::new(),
            location: profile::Location { origin: "bench".into(), line: 1, column: 1 },
            mig,
            sharing,
            instance_sharing: Vec::new(),
        }],
    }
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
    fn intervals_say_how_sure_they_are() {
        assert_eq!(range_coverage(3).round(), 75.0);
        assert_eq!(range_coverage(5).round(), 94.0);
        let three = intervals_text(3, 3);
        assert!(
            three.contains("with 3 it is their range, which holds the median with 75 % confidence"),
            "{three}"
        );
        assert!(intervals_text(8, 8).starts_with("95 % percentile-bootstrap"));
        assert!(intervals_text(1, 3).starts_with("runs measured once have no interval"));
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(duration_text(44.6), "45 s");
        assert_eq!(duration_text(365.0), "6m 05s");
        assert_eq!(duration_text(3720.0), "1h 02m");
        assert_eq!(duration_text(-1.0), "0 s");
    }

    #[test]
    fn mig_sizes_follow_the_model() {
        let h100 = gpushare_catalog::model_by_key("h100-80gb").unwrap();
        let names: Vec<String> =
            (1..=7).map(|n| mig_size(h100, n).map(|(_, name)| name).unwrap()).collect();
        assert_eq!(
            names,
            ["7g.80gb", "3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"]
        );
        assert!(mig_size(h100, 8).unwrap_err().contains("at most 7"));
    }

    #[test]
    fn mps_limited_splits_threads_and_memory() {
        let s = setup(BenchStrategy::MpsLimited, 3, 80 << 30, &HashMap::new()).unwrap();
        let ProfileSharing::Mps(m) = &s.sharing else { panic!("{s:?}") };
        assert_eq!(m.active_thread_percentage, Some(33));
        assert_eq!(m.pinned_memory_limit_bytes, Some(27306 << 20));
        assert_eq!(s.describe, "MPS, 33 % threads, 26.7 GiB each");
        let s = setup(BenchStrategy::MpsLimited, 2, 80 << 30, &HashMap::new()).unwrap();
        assert_eq!(s.describe, "MPS, 50 % threads, 40 GiB each");
    }

    #[test]
    fn the_callers_cuda_variables_never_reach_a_replica() {
        let options = BenchOptions {
            target: None,
            command: vec!["sh".into()],
            builtin: None,
            replicas: vec![1],
            strategies: vec![BenchStrategy::Mps],
            duration: Some(5.0),
            objective: Objective::Throughput,
            slo: None,
            histogram: None,
            fleet: 100,
            time_limit: 60.0,
            repeat: 1,
            cwd: "/".into(),
            logs: None,
            cpus: None,
            pin: true,
            replicas_given: true,
            environment: vec![
                ("PATH".into(), "/bin".into()),
                ("CUDA_VISIBLE_DEVICES".into(), "3".into()),
                ("CUDA_MPS_PIPE_DIRECTORY".into(), "/tmp/x".into()),
                ("GPUSHARE_BENCH_REPLICA".into(), "9".into()),
            ],
        };
        assert_eq!(options.base_environment(), vec![("PATH".to_string(), "/bin".to_string())]);
        assert!(options.validate().is_ok());
        let zero = BenchOptions { replicas: vec![1, 0], ..options.clone() };
        assert_eq!(zero.validate().unwrap_err().to_string(), "replicas: 0 is not from 1 to 48");
        let never = BenchOptions { repeat: 0, ..options.clone() };
        assert_eq!(never.validate().unwrap_err().to_string(), "repeat: 0 is not from 1 to 10");
    }
}
