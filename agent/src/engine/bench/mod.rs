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
//! This file owns the job: [`BenchJob`] and its beginning ([`Engine::begin_bench`], every
//! check before the first change) and its cancel. Beside it: [`options`] (the request,
//! checked, and the CPUs), [`strategies`] (one entry per strategy: whether a GPU can hold
//! it, its setup, its replicas' devices), [`setups`] (each strategy as a profile of the
//! GPU), [`rounds`] (the cells, the order of the measurements, the estimate), [`limits`]
//! (the check before the lock, the bound on a bench's length), [`running`] (setups,
//! replicas, measurements, the restore at the end), [`figures`] (the measurements turned
//! into the report), [`restore`] (the GPU put back, also after an interrupted bench) and
//! [`reach`] (the one place the bench reaches into the engine's own state).

mod figures;
pub mod limits;
mod options;
mod reach;
mod restore;
mod rounds;
mod running;
mod setups;
mod strategies;

use std::collections::HashMap;

use gpushare_proto::bench::BenchStrategy;

use crate::apply::Reads;
use crate::apply::journal::{BenchRecord, GpuCheckpoint};
use crate::bench::measure::Cancel;
use crate::bench::pinning::Pinning;
use crate::engine::jobs::{JobGuard, JobKind, RunningJob};
use crate::engine::{Engine, EngineError};
use crate::gpu::BackendKind;
use crate::node::{GpuState, NodeState};
use crate::plan;
use crate::sys::unix::{self, Identity};
pub use options::{BenchOptions, Caller};
use rounds::{Cell, measurements, plan_lines, round_order};
pub(super) use setups::whole_gpu;
use setups::{GpuFacts, time_slicing};

/// A bench that holds the apply lock, with everything checked.
pub struct BenchJob {
    options: BenchOptions,
    uuid: String,
    gpu: u32,
    device: String,
    /// What its setups depend on of the GPU (its memory, its model).
    gpu_facts: GpuFacts,
    /// Whom the replicas run as; `None`: as the agent (not root), which the caller is.
    identity: Option<Identity>,
    /// The job's number, which names the replicas' units.
    label: String,
    /// Per strategy, why it is left out, if it is.
    skipped: HashMap<BenchStrategy, String>,
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

    /// Every cell of the bench, in the order of a round ([`rounds::cells`]).
    fn cells(&self) -> Vec<Cell> {
        rounds::cells(&self.options, &self.skipped, &self.gpu_facts)
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
        self.bench_may_change()?;
        options.validate()?;
        let parts = self.bench_parts();
        if options.builtin.is_some() && self.backend_kind() == BackendKind::Simulated {
            // CUDA would see the real GPUs (or none), not the simulated ones.
            return Err(EngineError::NotPossible(
                "the built-in workloads measure real GPUs with CUDA; this agent simulates its GPUs (bench a command instead)".into(),
            ));
        }
        if let Some(record) = parts.journal.snapshot().bench.filter(|b| b.restore_error.is_some()) {
            return Err(EngineError::NotPossible(format!(
                "restoring the GPU after the bench {} failed ({}); apply a profile first",
                record.job,
                record.restore_error.unwrap_or_default()
            )));
        }
        let asked = tokio::time::Instant::now();
        // A bench that runs (one measurement at a time on a node), or a job holding the
        // lock that no one waits for, says so first, before the caller's check.
        if let Some(claim) = parts.claims.all().first() {
            return Err(EngineError::Busy(Some(claim.holder())));
        }
        if let Some(running) = self.running_job().filter(|j| j.id != reach::BOOT_JOB) {
            return Err(EngineError::Busy(Some(running)));
        }
        let identity = replica_identity(&caller)?;
        let label = job.rsplit('/').next().filter(|l| l.chars().all(|c| c.is_ascii_alphanumeric()));
        let label = label.unwrap_or("0").to_string();
        // The directory, the command and the log directory, as the caller sees them,
        // before the apply lock: a check that is stopped or slow costs its caller alone.
        let program = crate::sys::agent_binary().map_err(EngineError::Internal)?;
        let spec = limits::check_spec(
            options.replica_command(&program).map_err(EngineError::Internal)?,
            options.base_environment(),
            options.cwd_text(),
            options.logs_text(),
        );
        let stopping = self.bench_stopping();
        let who = limits::caller_words(caller.uid).await;
        parts
            .limits
            .check_as_caller(
                parts.launcher,
                spec,
                identity.as_ref(),
                (caller.uid, job, &label),
                program,
                stopping,
            )
            .await?;
        // Then the apply lock, briefly (named, for a caller whose wait for it runs out),
        // within what is left of the wait every job has.
        let lock = self.bench_lock(asked + reach::LOCK_WAIT).await?;
        let _named = parts.moments.hold(format!("a bench being checked ({job}, started by {who})"));
        let node = parts.node.observe(Reads::FOR_PLANNING).await?;
        let target = options.target.clone().unwrap_or_else(|| "0".into());
        let g = whole_gpu_target(&node, &target)?;
        let (uuid, gpu) = (g.uuid.clone(), g.index);
        // A faulted GPU measures nothing worth having, and a bench would hand it out.
        if let Some(fault) = self.health().faults_on(gpu).first() {
            return Err(EngineError::NotPossible(format!(
                "{} is unhealthy ({}): no bench runs there until it clears",
                fault.place(),
                fault.describe_cause()
            )));
        }
        // The CPUs: N above them is refused here, before any setup.
        let (pinning, capped) = self.bench_pinning(&mut options, gpu).await?;

        let gpu_facts = GpuFacts { memory_total: g.memory_total_bytes, model: g.model };
        // A strategy this GPU cannot hold at all is left out, and said so.
        let skipped: HashMap<BenchStrategy, String> = options
            .strategies
            .iter()
            .filter_map(|&s| (strategies::of(s).unavailable)(g, parts.policy).map(|why| (s, why)))
            .collect();
        // Every setup planned against the GPU as it is: anything infeasible or missing
        // (an MPS control binary, a permission) is refused now, before the first change.
        let mut setups = vec![time_slicing()];
        for &strategy in options.strategies.iter().filter(|s| !skipped.contains_key(s)) {
            let entry = strategies::of(strategy);
            for &n in &options.replicas {
                match entry.set_up(n, &gpu_facts) {
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
            let plan = plan::plan(&node, &profile, parts.policy)
                .map_err(|e| EngineError::NotPossible(format!("{}: {e}", s.strategy)))?;
            self.bench_check_host(&plan, &node).await?;
        }
        // Its least length against the bound, before any setup.
        let measurements =
            measurements(options.repeat, &rounds::cells(&options, &skipped, &gpu_facts));
        let bound = parts.limits.max_total;
        if let (Some(least), Some(window)) =
            (limits::least_seconds(measurements, options.duration), options.duration)
            && least > bound.as_secs_f64()
        {
            return Err(limits::too_long(least, measurements, window, bound));
        }

        let before = parts.journal.snapshot();
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
        parts
            .journal
            .begin_bench(record.clone())
            .map_err(|e| EngineError::Internal(format!("writing the journal: {e}")))?;
        let running =
            RunningJob { id: job.to_string(), kind: JobKind::Bench { target: uuid.clone() } };
        // The GPU is the bench's from now to its end; the apply lock goes.
        let guard = self.bench_claim(lock, running, &record, &node).await;
        let mut job = BenchJob {
            options,
            uuid,
            gpu,
            device: g.name.clone(),
            gpu_facts,
            identity,
            label,
            skipped,
            pinning,
            capped,
            cancel: Cancel::default(),
            _guard: guard,
        };
        // SIGTERM to the agent cancels it (Engine::cancel_bench), also one that came while
        // it was being checked.
        self.set_running_bench(Some(job.cancel.clone()));
        if self.bench_stopping() {
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
        self.set_bench_stopping();
        self.bench_parts().limits.cancel_checks();
        if let Some(cancel) = self.running_bench() {
            tracing::warn!(
                "cancelling the running bench: stopping its replicas and restoring the GPU"
            );
            cancel.cancel();
        }
    }
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
