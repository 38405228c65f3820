//! The agent's operations, independent of any transport — status, plan, apply,
//! export, profiles, validation, MPS control, probes ([`probe`]), benches, recovery. The
//! D-Bus service holds one [`Engine`] and calls these and does nothing else. The engine
//! only composes narrow parts, each owning its state in a file of its own:
//!
//! - [`gate`]: whether a change may run now (hands-off, the apply lock and who holds it,
//!   the start-up re-apply, bench claims, moments, stopping) and the job epoch;
//! - [`core`]: the node access, the known profiles, the journal, the policy;
//! - [`transactions`]: apply, restore, recover, one at a time through one path that ends
//!   every transaction with the same after-steps (the [`views`] rendered, the epoch);
//! - [`applies`]: apply jobs from request to report, and the recovery at start-up;
//! - [`queries`]: status, drift, client environments, plans, export, MIG tables, profiles,
//!   validation; [`clients`] the client table; [`telemetry`] per-GPU telemetry;
//! - `mps`: MPS limits and the health check; [`probe`]: probes; `bench*`: benches.
//!
//! Queries answer with the protocol's documents, built in [`report`]; jobs end in a typed
//! [`JobReport`]; failures are typed [`EngineError`]s, which the service alone turns into
//! D-Bus errors. Listeners (metrics, systemd) follow the engine through [`EngineEvent`]s.

pub mod applies;
pub mod bench;
pub mod clients;
pub mod core;
pub mod error;
pub mod events;
pub mod gate;
pub mod health;
pub mod job_kind;
pub mod jobs;
pub mod mig_profiles;
mod mps;
pub mod probe;
pub mod queries;
pub mod report;
pub mod slurm;
pub mod telemetry;
pub mod transactions;
pub mod views;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;

use crate::apply::hooks::Hooks;
use crate::apply::journal::Journal;
use crate::apply::transaction::Transactions;
use crate::apply::{Executor, NodeAccess};
use crate::bench::launch::Launcher;
use crate::bench::measure::Cancel;
use crate::config::AgentConfig;
use crate::gpu::{BackendKind, GpuBackend};
use crate::node::NodeState;
use crate::plan::PlanOptions;
use crate::profile::ProfileStore;
use crate::sharing::SharingTools;
use crate::sharing::mps::{MpsConfig, MpsController, MpsLaunch};
use crate::sharing::supervisor::MpsSupervisor;
use crate::sharing::timeslice::TimesliceControl;
pub use applies::ApplyJob;
use bench::limits as bench_limits;
pub use bench::{BenchJob, BenchOptions, Caller};
use core::Core;
pub use core::ProfileRef;
pub use error::EngineError;
pub use events::EngineEvent;
use events::Events;
pub use gate::{BOOT_JOB, Gate, LOCK_WAIT};
pub use health::GpuResetJob;
pub use jobs::{BenchClaim, Claims, JobGuard, JobKind, JobReport, JobResult, RunningJob};
pub use probe::{ProbeJob, ProbeOptions};
pub use transactions::SerialTransactions;
use views::Views;

/// The agent's engine: the parts above, composed.
pub struct Engine {
    /// The node, the profiles, the journal, the policy.
    core: Core,
    /// Whether a change may run now.
    gate: Gate,
    /// Transactions, one at a time, keeping the views.
    transactions: SerialTransactions,
    events: Events,
    /// Where probe results are kept.
    probe_dir: PathBuf,
    /// Restarts MPS servers that died.
    supervisor: Arc<MpsSupervisor>,
    /// Why the re-apply at start-up failed, until an apply succeeds (see [`applies`]).
    start_up_error: Mutex<Option<String>>,
    /// What `status` remembers between calls.
    recall: queries::Recall,
    /// How bench replicas are started: transient units, or children in new sessions.
    launcher: Arc<Launcher>,
    /// The cancel of the bench running now, for SIGTERM.
    running_bench: Mutex<Option<Cancel>>,
    /// How long a bench may take, and the benches being checked as their callers.
    bench_limits: bench_limits::BenchLimits,
    /// This node in Slurm, where `[slurm]` takes it through GRES changes.
    slurm: Option<Arc<crate::slurm::SlurmNode>>,
}

impl Engine {
    /// An engine over `backend` with `profiles`, keeping its journal in `state_dir` and
    /// `views` true to the GPUs.
    pub fn new(
        backend: Arc<dyn GpuBackend>,
        profiles: ProfileStore,
        state_dir: &Path,
        config: &AgentConfig,
        views: Views,
    ) -> Result<Self, EngineError> {
        let journal = Arc::new(Journal::open(state_dir).map_err(|e| {
            EngineError::StateDirectory { dir: state_dir.to_path_buf(), message: e.to_string() }
        })?);
        let policy = PlanOptions {
            manage_mig: config.gpu.manage_mig,
            manage_compute_mode: config.gpu.manage_compute_mode,
            manage_timeslice: config.gpu.manage_timeslice,
            force: false,
        };
        let (mps_launch, why) = MpsLaunch::detect(&config.mps.root);
        match mps_launch {
            MpsLaunch::Unit { .. } => {
                tracing::info!("MPS control daemons run as gpushare-mps@<uuid>.service units")
            }
            MpsLaunch::Direct => tracing::info!("MPS control daemons run from the agent: {why}"),
        }
        let sharing = Arc::new(SharingTools {
            mps: MpsController::new(MpsConfig {
                control: config.mps.control.clone(),
                root: config.mps.root.clone(),
                launch: mps_launch,
            }),
            timeslice: TimesliceControl::new(config.timeslice.nvidia_smi.clone()),
        });
        let node = NodeAccess::new(backend, sharing).with_host_root(&config.host_root);
        let events = Events::new();
        let gate = Gate::new(events.clone());
        let transactions = Transactions {
            executor: Executor {
                node: node.clone(),
                max_parallel_gpus: config.apply.max_parallel_gpus,
            },
            journal: Arc::clone(&journal),
            hooks: Hooks {
                pre_apply: config.hooks.pre_apply.clone(),
                post_apply: config.hooks.post_apply.clone(),
                timeout: Duration::from_secs(config.hooks.timeout_seconds),
            },
            policy,
        };
        // The labels name the active profile from the start.
        views.set_profile(journal.active_profile());
        let transactions = SerialTransactions::new(
            transactions,
            views,
            Arc::clone(&gate.claims),
            gate.epoch_counter(),
        );
        Ok(Engine {
            core: Core::new(node, profiles, journal, policy),
            gate,
            transactions,
            events,
            probe_dir: state_dir.join("probe"),
            supervisor: Arc::new(MpsSupervisor::new()),
            start_up_error: Mutex::new(None),
            recall: queries::Recall::default(),
            launcher: Arc::new(Launcher::Direct),
            running_bench: Mutex::new(None),
            bench_limits: bench_limits::BenchLimits::new(&config.bench),
            slurm: (config.slurm.enabled && config.slurm.manage_node)
                .then(|| Arc::new(crate::slurm::SlurmNode::new(&config.slurm))),
        })
    }

    /// The engine with bench replicas started by `launcher` (by default the agent forks
    /// them into new sessions).
    pub fn with_launcher(mut self, launcher: Launcher) -> Self {
        self.launcher = Arc::new(launcher);
        self
    }

    /// The engine of an agent whose configuration did not read: it observes, plans and
    /// answers, but refuses every change to the GPUs (applies, MPS limits, probe
    /// comparisons, restarts of MPS servers, rollbacks), saying `why`.
    pub fn hands_off(mut self, why: String) -> Self {
        self.gate.hands_off(why);
        self
    }

    /// Replaces the known profiles (a reload of the profile directory). Jobs already
    /// planned keep the profile they planned.
    pub fn reload_profiles(&self, profiles: ProfileStore) {
        self.core.reload_profiles(profiles);
    }

    /// Which backend drives the GPUs.
    pub fn backend_kind(&self) -> BackendKind {
        self.core.node.backend.kind()
    }

    /// The profile last applied successfully.
    pub fn active_profile(&self) -> Option<String> {
        self.core.journal.active_profile()
    }

    /// The job holding the apply lock, if any.
    pub fn running_job(&self) -> Option<RunningJob> {
        self.gate.running_job()
    }

    /// The GPUs benches hold now.
    pub fn bench_claims(&self) -> Vec<BenchClaim> {
        self.gate.claims.all()
    }

    /// The job epoch: moved on when a job, or a transaction, begins and ends. Answers
    /// worked out within one epoch describe the same GPUs and journal.
    pub fn epoch(&self) -> u64 {
        self.gate.epoch()
    }

    /// A fresh observation of the GPUs, MPS servers and time-slice intervals.
    pub async fn observe(&self) -> Result<NodeState, EngineError> {
        self.core.observe().await
    }

    /// Waits for a running job (and every bench: cancel them first) to end and keeps any
    /// new one from starting: for shutdown.
    pub async fn quiesce(&self) -> OwnedMutexGuard<()> {
        self.gate.quiesce().await
    }

    /// A listener for the engine's events from now on, at its own pace.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<EngineEvent> {
        self.events.subscribe()
    }

    /// Calls `observer` with every event from now on, as the engine sends it; it must
    /// return at once and not call back into the engine (see [`events`]).
    pub fn on_event(&self, observer: impl Fn(&EngineEvent) + Send + Sync + 'static) {
        self.events.observe(observer);
    }

    /// Renders the views from the node as it is (at start-up, when no transaction did: a
    /// node without an active profile, or one the re-apply left as it was).
    pub async fn refresh_views(&self) {
        self.transactions.refresh_views().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::journal::{BenchRecord, GpuCheckpoint};
    use crate::catalog::parse_node_spec as parse_spec;
    use crate::gpu::sim::{SimBackend, SimOptions};
    use crate::{plan, profile};

    fn engine(dir: &Path) -> Engine {
        let backend =
            Arc::new(SimBackend::new(&parse_spec("a100-40gb:2").unwrap(), SimOptions::default()));
        let mut config = AgentConfig::default();
        config.mps.control = "/nonexistent/nvidia-cuda-mps-control".into();
        config.mps.root = dir.join("mps");
        config.cdi.dir = dir.join("cdi");
        config.timeslice.nvidia_smi = "/nonexistent/nvidia-smi".into();
        Engine::new(backend, ProfileStore::built_in(), dir, &config, Views::from_config(&config))
            .unwrap()
    }

    #[test]
    fn jobs_are_named_while_they_hold_the_lock_and_heard_of_when_they_end() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(dir.path());
        let mut events = engine.subscribe();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let job = engine.begin_apply(ProfileRef::Named("all-balanced"), false, "j1").await;
            let job = job.unwrap();
            let running = engine.running_job().unwrap();
            assert_eq!(running.to_string(), "j1, profile all-balanced");
            let busy = engine.begin_apply(ProfileRef::Named("all-disabled"), false, "j2").await;
            assert!(matches!(busy, Err(EngineError::Busy(Some(ref r))) if *r == running));
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            let report = engine.run_apply(&job, tx).await;
            assert_eq!(report.result, JobResult::Success, "{:?}", report.error);
            // The job is no longer named once its work is over, though it still holds the
            // lock until its outcome has been reported.
            assert_eq!(engine.running_job(), None);
            let next = engine.begin_apply(ProfileRef::Named("all-disabled"), false, "j3");
            let waited = tokio::time::timeout(Duration::from_millis(100), next).await;
            assert!(waited.is_err(), "a new job waits for the lock, it is not refused");
            drop(job);
            assert_eq!(engine.running_job(), None);
            let kind = JobKind::Apply { profile: "all-balanced".into() };
            let steps = report.steps_total;
            assert_eq!(
                events.try_recv().unwrap(),
                EngineEvent::JobStarted { kind: kind.clone(), steps }
            );
            assert!(matches!(
                events.try_recv().unwrap(),
                EngineEvent::ApplyFinished { result: JobResult::Success, .. }
            ));
            assert_eq!(events.try_recv().unwrap(), EngineEvent::JobEnded { kind });
        });
    }

    #[test]
    fn failed_applies_are_told_apart_by_kind() {
        use crate::apply::ApplyError;
        use crate::apply::transaction::TransactionError;
        use crate::gpu::{ErrorCode, GpuError};
        let step = ApplyError::Backend(GpuError::new("observe", None, ErrorCode::Unknown));
        let rolled_back = TransactionError::RolledBack {
            error: step.clone(),
            gpus: vec![0],
            steps_done: 3,
            warnings: vec![],
        };
        let settled =
            |e: &TransactionError| (JobResult::from(e.settled()), e.left_changed(), e.steps_done());
        assert_eq!(settled(&rolled_back), (JobResult::RolledBack, false, 3));
        let rollback_failed = TransactionError::RollbackFailed {
            error: step,
            rollback: "GPU 0: In use by another client".into(),
            steps_done: 2,
            warnings: vec![],
        };
        assert_eq!(settled(&rollback_failed), (JobResult::Failed, true, 2));
        assert_eq!(settled(&TransactionError::Hook("x".into())), (JobResult::Failed, false, 0));
        assert_eq!(settled(&TransactionError::Journal("x".into())), (JobResult::Failed, false, 0));
        assert!(JobResult::Success.is_ok() && JobResult::Unchanged.is_ok());
        assert!(!JobResult::RolledBack.is_ok() && !JobResult::Failed.is_ok());
    }

    #[test]
    fn an_apply_waits_for_a_health_check_instead_of_being_refused() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(dir.path());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            // The health check holds the lock with no job named, as supervise_mps does.
            let check = engine.gate.try_moment("the MPS health check").unwrap();
            let release = async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                drop(check);
            };
            let (job, ()) = tokio::join!(
                engine.begin_apply(ProfileRef::Named("all-balanced"), false, "j1"),
                release
            );
            let job = job.expect("the apply waited for the check");
            // A job holding the lock refuses the next one at once.
            let started = std::time::Instant::now();
            let busy = engine.begin_apply(ProfileRef::Named("all-disabled"), false, "j2").await;
            assert!(matches!(busy, Err(EngineError::Busy(Some(_)))), "{:?}", busy.err());
            assert!(started.elapsed() < Duration::from_secs(1));
            drop(job);
        });
    }

    #[test]
    fn jobs_wait_for_the_start_up_re_apply_and_are_never_queued_behind_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(dir.path());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let boot = engine.begin_apply(ProfileRef::Named("all-balanced"), false, BOOT_JOB);
            let boot = boot.await.unwrap();
            let status = engine.status().await.unwrap();
            assert!(status.starting_up);
            assert_eq!(status.apply_in_progress.as_deref(), Some("start-up, profile all-balanced"));
            let first = engine.begin_apply(ProfileRef::Named("all-disabled"), false, "j1");
            let second = engine.begin_apply(ProfileRef::Named("half-balanced"), false, "j2");
            let re_apply = async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
                let report = engine.run_apply(&boot, tx).await;
                assert_eq!(report.result, JobResult::Success, "{:?}", report.error);
                drop(boot);
            };
            let (first, second, ()) = tokio::join!(first, second, re_apply);
            // Both waited for the re-apply instead of being refused; whichever took the
            // lock first (the order the two wake in is not fixed) refuses the other, as any
            // running job does.
            let (winner, loser, running) = match (first, second) {
                (Ok(job), Err(e)) => (job, e, ("j1", "j1, profile all-disabled")),
                (Err(e), Ok(job)) => (job, e, ("j2", "j2, profile half-balanced")),
                (first, second) => panic!(
                    "one apply should run and the other be refused: {:?} / {:?}",
                    first.err(),
                    second.err()
                ),
            };
            assert!(
                matches!(loser, EngineError::Busy(Some(ref r)) if r.id == running.0),
                "{loser:?}"
            );
            // Planned against the GPUs as the re-apply left them: MIG on, to be changed.
            assert!(winner.plan().step_count() > 0);
            let status = engine.status().await.unwrap();
            assert!(!status.starting_up);
            assert_eq!(status.apply_in_progress.as_deref(), Some(running.1));
            drop(winner);
        });
    }

    /// Issue 27: a GPU a bench claims refuses the applies that select it (naming the
    /// bench), a probe or another bench, and MPS limits on it; an apply of the other GPU
    /// goes through; status names the bench; the claim goes when the bench finishes.
    #[test]
    fn a_claimed_gpu_refuses_what_would_touch_it_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(dir.path());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let node = engine.observe().await.unwrap();
            let record = BenchRecord {
                job: "/io/gpushare/Agent1/jobs/7".into(),
                checkpoint: GpuCheckpoint::of(&node, [0]),
                previous_profile: None,
                previous_document: None,
                uid: 4242,
                replicas: Vec::new(),
                restore_error: None,
                keeps_active: true,
            };
            engine.core.journal.begin_bench(record.clone()).unwrap();
            let lock = engine.gate.lock(None).await.unwrap();
            let running = RunningJob {
                id: record.job.clone(),
                kind: JobKind::Bench { target: node.gpus[0].uuid.clone() },
            };
            let guard = engine.bench_claim(lock, running, &record, &node).await;
            assert_eq!(engine.running_job(), None, "a bench holds no apply lock");

            let status = engine.status().await.unwrap();
            let [bench] = status.benches.as_slice() else { panic!("{status:?}") };
            assert_eq!((bench.gpu, bench.uid, bench.job.as_str()), (0, 4242, record.job.as_str()));
            assert_eq!(bench.restores, "MIG off, compute mode default, no MPS");
            assert_eq!(status.apply_in_progress, None);

            let who = "started by uid 4242";
            for profile in ["all-balanced", "half-balanced", "all-mps"] {
                let refused = engine.begin_apply(ProfileRef::Named(profile), false, "j1").await;
                let Err(e @ EngineError::Busy(Some(_))) = refused else {
                    panic!("{profile}: {:?}", refused.err())
                };
                let e = e.to_string();
                assert!(e.starts_with("a bench is running (/io/gpushare/Agent1/jobs/7, bench on GPU 0 (this profile selects it), "), "{e}");
                assert!(e.contains(who), "{e}");
            }
            // half-balanced of two GPUs: GPU 0 in MIG, GPU 1 whole. A profile of GPU 1 alone:
            let gpu1 = "name = \"gpu1\"\n[[gpu]]\nselect = 1\nmig = { \"3g\" = 2 }\n";
            let document = ProfileRef::Document { text: gpu1, origin: "gpu1.toml", config: "" };
            let job = engine.begin_apply(document, false, "j2").await.unwrap();
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            let report = engine.run_apply(&job, tx).await;
            assert_eq!(report.result, JobResult::Success, "{:?}", report.error);
            drop(job);
            assert_eq!(engine.active_profile().as_deref(), Some("gpu1"));

            // No probe or second bench meanwhile, on any GPU.
            let busy = engine.gate.lock(None).await.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(busy.contains("bench on GPU 0, started by uid 4242"), "{busy}");

            drop(guard);
            assert!(engine.status().await.unwrap().benches.is_empty());
            engine.core.journal.end_bench().unwrap();
            assert_eq!(engine.active_profile().as_deref(), Some("gpu1"));
            let job = engine.begin_apply(ProfileRef::Named("all-balanced"), false, "j3").await;
            assert!(job.is_ok(), "{:?}", job.err());
        });
    }

    /// Issue 27: an agent that stopped during a bench of GPU 0, in the middle of an apply of
    /// GPU 1, rolls the apply back (its previous profile, applied to GPU 1 during the bench,
    /// is active again), then restores GPU 0; the bench's setup never was the active profile.
    #[test]
    fn recovery_rolls_back_an_apply_of_another_gpu_then_restores_the_benched_gpu() {
        use crate::apply::journal::Transaction;
        let dir = tempfile::tempdir().unwrap();
        let backend: Arc<dyn GpuBackend> =
            Arc::new(SimBackend::new(&parse_spec("a100-40gb:2").unwrap(), SimOptions::default()));
        let mut config = AgentConfig::default();
        config.mps.root = dir.path().join("mps");
        config.cdi.dir = dir.path().join("cdi");
        let start = || {
            Engine::new(
                Arc::clone(&backend),
                ProfileStore::built_in(),
                dir.path(),
                &config,
                Views::from_config(&config),
            )
            .unwrap()
        };
        let engine = start();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let gpu1 = "name = \"gpu1\"\n[[gpu]]\nselect = 1\nmig = { \"3g\" = 2 }\n";
            let document = ProfileRef::Document { text: gpu1, origin: "gpu1.toml", config: "" };
            let job = engine.begin_apply(document, false, "j1").await.unwrap();
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            assert!(engine.run_apply(&job, tx.clone()).await.result.is_ok());
            drop(job);
            let node = engine.observe().await.unwrap();
            let record = BenchRecord {
                job: "/io/gpushare/Agent1/jobs/2".into(),
                checkpoint: GpuCheckpoint::of(&node, [0]),
                previous_profile: Some("gpu1".into()),
                previous_document: None,
                uid: 4242,
                replicas: Vec::new(),
                restore_error: None,
                keeps_active: true,
            };
            engine.core.journal.begin_bench(record).unwrap();
            // A bench setup: GPU 0 in MIG, committed, not active.
            let mig = profile::MigLayout::Enabled(vec![(profile::MigKey::Slices(3), 2)]);
            let uuid = node.gpus[0].uuid.clone();
            let setup = bench::whole_gpu("bench-mig", &uuid, mig, profile::Sharing::Exclusive);
            let plan = plan::plan(&node, &setup, &engine.core.policy).unwrap();
            engine.transactions.apply(&plan, None, &node, &tx).await.unwrap();
            assert_eq!(engine.active_profile().as_deref(), Some("gpu1"));
            // An apply of GPU 1 that the agent's end cut short.
            let node = engine.observe().await.unwrap();
            engine
                .core
                .journal
                .begin(Transaction {
                    profile: "all-disabled".into(),
                    document: None,
                    previous_profile: engine.core.journal.active_profile(),
                    previous_document: engine.core.journal.active_document(),
                    checkpoint: GpuCheckpoint::of(&node, [1]),
                    steps: vec!["GPU 1: disable MIG mode".into()],
                    completed: vec![],
                    rollback_error: None,
                })
                .unwrap();
        });
        drop(engine);
        let engine = start();
        rt.block_on(async {
            let rolled = engine.recover().await.unwrap().unwrap();
            assert!(rolled.contains("active profile gpu1"), "{rolled}");
            let restored = engine.recover_bench().await.unwrap().unwrap();
            assert!(restored.contains("GPU 0 as before the bench"), "{restored}");
            assert!(restored.contains("active profile gpu1"), "{restored}");
            let state = engine.core.journal.snapshot();
            assert_eq!((state.transaction, state.bench), (None, None));
            assert_eq!(state.active_profile.as_deref(), Some("gpu1"));
            let node = engine.observe().await.unwrap();
            assert!(!node.gpus[0].mig_enabled && node.gpus[1].mig_enabled);
        });
    }

    /// Issue 39: an apply refused after it rolled back an unfinished one (its profile
    /// cannot be planned) leaves the CDI spec naming the GPUs as the rollback left them,
    /// not the layout it undid, and its refusal says what the rollback did.
    #[test]
    fn an_apply_refused_after_rolling_back_an_unfinished_one_leaves_the_spec_true() {
        use crate::apply::journal::Transaction;
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(dir.path());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let whole = engine.observe().await.unwrap();
            assert!(!whole.gpus[0].mig_enabled);
            let job = engine.begin_apply(ProfileRef::Named("all-balanced"), false, "j1").await;
            let job = job.unwrap();
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            assert!(engine.run_apply(&job, tx).await.result.is_ok());
            drop(job);
            let seen = |r: gpushare_proto::cdi::CdiReport| {
                let mut lines: Vec<String> = r.devices.into_iter().map(|d| d.describe).collect();
                lines.extend(r.left_out);
                lines.join("\n")
            };
            let mig = seen(engine.cdi_devices());
            assert!(mig.contains("GPU 0") && mig.contains("MIG device 0:0"), "{mig}");
            // An apply back to whole GPUs that the agent's end cut short.
            engine
                .core
                .journal
                .begin(Transaction {
                    profile: "all-disabled".into(),
                    document: None,
                    previous_profile: engine.core.journal.active_profile(),
                    previous_document: engine.core.journal.active_document(),
                    checkpoint: GpuCheckpoint::of(&whole, [0, 1]),
                    steps: vec!["GPU 0: disable MIG mode".into()],
                    completed: vec![],
                    rollback_error: None,
                })
                .unwrap();
            // Planned only after the rollback, and refused: GPU 0 has 7 slices.
            let text = "name = \"too-big\"\n[[gpu]]\nselect = 0\nmig = { \"7g\" = 2 }\n";
            let document = ProfileRef::Document { text, origin: "too-big.toml", config: "" };
            let refused = engine.begin_apply(document, false, "j2").await;
            let e = refused.err().expect("a profile of 14 slices is refused").to_string();
            let node = engine.observe().await.unwrap();
            assert!(!node.gpus[0].mig_enabled, "the rollback ran");
            let now = seen(engine.cdi_devices());
            assert!(now.contains("GPU 0") && !now.contains("MIG device"), "{now}");
            assert!(e.contains("rolled back the unfinished apply of all-disabled"), "{e}");
        });
    }

    /// A rollback that worked but could not be written down: status says the journal
    /// still holds the apply, as state.json does, instead of nothing.
    #[test]
    fn status_agrees_with_a_journal_that_could_not_be_written() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let failures = vec![(crate::node::Operation::CreateGpuInstance, 2)];
        let options = SimOptions { failures, ..SimOptions::default() };
        let backend = Arc::new(SimBackend::new(&parse_spec("a100-40gb:1").unwrap(), options));
        let mut config = AgentConfig::default();
        config.mps.root = dir.path().join("mps");
        config.cdi.dir = dir.path().join("cdi");
        let engine = Engine::new(
            backend,
            ProfileStore::built_in(),
            &state,
            &config,
            Views::from_config(&config),
        )
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let job = engine.begin_apply(ProfileRef::Named("all-balanced"), false, "j1").await;
            let job = job.unwrap();
            // The disk goes away mid-apply: the journal's next writes fail.
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            let run = engine.run_apply(&job, tx);
            // A journal write on the blocking pool may add a file while it is removed.
            let remove = async {
                while let Err(e) = std::fs::remove_dir_all(&state) {
                    assert_ne!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
                    if e.kind() == std::io::ErrorKind::NotFound {
                        break;
                    }
                }
            };
            let (report, ()) = tokio::join!(run, remove);
            drop(job);
            assert_eq!(report.result, JobResult::Failed, "{:?}", report.error);
            let status = engine.status().await.unwrap();
            let error = status.rollback_error.expect("status tells of the unsettled apply");
            assert!(error.contains("unfinished apply of all-balanced"), "{error}");
            assert!(error.contains("state.json"), "names the write that failed: {error}");
        });
    }

    #[test]
    fn a_hands_off_engine_refuses_every_change_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(dir.path()).hands_off("agent.toml:1:1: bad".into());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            for name in ["all-time-sliced", "all-mps", "all-balanced", "all-disabled"] {
                let refused = engine.begin_apply(ProfileRef::Named(name), false, "j").await;
                let Err(EngineError::HandsOff(why)) = refused else {
                    panic!("{name} was not refused as hands-off")
                };
                assert_eq!(why, "agent.toml:1:1: bad");
            }
            let limit = engine.mps_limit(1, Some(50), None).await;
            assert!(matches!(limit, Err(EngineError::HandsOff(_))), "{limit:?}");
            assert!(engine.begin_boot_apply(Some("all-mps")).await.unwrap().is_err());
            let status = engine.status().await.unwrap();
            assert_eq!(status.hands_off.as_deref(), Some("agent.toml:1:1: bad"));
            // Planning still answers: what the agent would do once it may.
            assert!(engine.plan(ProfileRef::Named("all-balanced")).await.is_ok());
        });
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Whatever a D-Bus caller sends, every method answers Ok or an error; none panics.
        #[test]
        fn hostile_method_arguments_never_panic(
            name in ".{0,40}",
            text in ".{0,200}",
            origin in ".{0,30}",
            config in ".{0,20}",
            pid in proptest::prelude::any::<u32>(),
            threads in proptest::prelude::any::<u32>(),
            memory in proptest::prelude::any::<u64>(),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let engine = engine(dir.path());
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let _ = engine.plan(ProfileRef::Named(&name)).await;
                let _ = engine.plan(ProfileRef::Document { text: &text, origin: &origin, config: &config }).await;
                let _ = engine.validate(&text, &origin).await;
                let _ = engine.show_profile(&name);
                let _ = engine.client_env(&name).await;
                let _ = engine.mig_profiles(&name).await;
                let _ = engine.mps_limit(pid, Some(threads), Some(memory)).await;
                if let Ok(job) = engine.begin_apply(ProfileRef::Document { text: &text, origin: &origin, config: &config }, false, "fuzz").await {
                    drop(job);
                }
            });
        }
    }
}
