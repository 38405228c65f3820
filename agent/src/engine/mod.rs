//! The agent's operations, independent of any transport — status, plan, apply,
//! export, profiles, validation, MPS control, probes ([`probe`]), recovery. The D-Bus
//! service calls these and does nothing else. Queries answer with the protocol's documents,
//! built in [`report`]; jobs end in a typed [`JobReport`]; failures are typed
//! [`EngineError`]s, which the service alone turns into D-Bus errors.
//!
//! One apply or probe runs at a time: [`Engine::begin_apply`] and [`Engine::begin_probe`]
//! take the apply lock or fail with [`EngineError::Busy`] at once — unless what holds it is
//! the re-apply at start-up or a holder without a name (the MPS health check), which they
//! wait for a while (see [`LOCK_WAIT`]); the lock travels with the job ([`ApplyJob`],
//! [`ProbeJob`]) until it is dropped. A bench takes the apply lock only while it is checked,
//! then claims its GPU for its whole length ([`BenchClaim`]): an apply whose profile selects
//! another GPU goes through meanwhile. Transactions (an apply's, a bench's setups and its
//! restore, a rollback) run one at a time ([`SerialTransactions`]). Listeners (metrics,
//! systemd) follow the engine through [`EngineEvent`]s.

pub mod bench;
pub mod cdi;
pub mod clients;
pub mod error;
pub mod events;
pub mod jobs;
pub mod mig_profiles;
mod mps;
pub mod probe;
pub mod report;
pub mod telemetry;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use gpushare_proto::Strategy;
use gpushare_proto::types::{
    ClientEnv, Export, MigProfiles, ProfileDetail, ProfileList, Status, Validation,
};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::{Mutex as AsyncMutex, Notify, OwnedMutexGuard};

use crate::apply::hooks::Hooks;
use crate::apply::journal::{BenchRecord, GpuCheckpoint, Journal, ProfileDocument};
use crate::apply::transaction::{Applied, Recovered, TransactionError, Transactions};
use crate::apply::{Executor, NodeAccess, Progress, Purpose, Reads};
use crate::bench::launch::Launcher;
use crate::bench::measure::Cancel;
use crate::config::AgentConfig;
use crate::gpu::{BackendKind, GpuBackend};
use crate::node::NodeState;
use crate::plan::{self, Plan, PlanOptions};
use crate::profile::{self, Profile, ProfileStore};
use crate::sharing::SharingTools;
use crate::sharing::mps::{MpsConfig, MpsController, MpsLaunch};
use crate::sharing::supervisor::MpsSupervisor;
use crate::sharing::timeslice::TimesliceControl;
use bench::limits as bench_limits;
pub use bench::{BenchJob, BenchOptions, Caller};
pub use error::EngineError;
pub use events::EngineEvent;
use events::Events;
pub use jobs::{BenchClaim, Claims, JobGuard, JobKind, JobReport, JobResult, RunningJob};
pub use probe::{ProbeJob, ProbeOptions};

/// The error of a profile the store does not have: unknown, or its file does not load
/// (then the file's own error, which is what the user must fix).
fn missing_profile(missing: profile::Missing) -> EngineError {
    match missing {
        profile::Missing::Unknown(why) => EngineError::UnknownProfile(why),
        profile::Missing::Broken(why) => EngineError::BrokenProfile(why),
    }
}

/// The name of the job that re-applies the active profile at start-up.
pub const BOOT_JOB: &str = "start-up";
/// How long, in all, a job waits for the apply lock while the re-apply at start-up holds
/// it, or a holder without a name (the MPS health check, for a moment; a job letting go)
/// does, before it is refused as busy. Below the 25 s after which D-Bus clients (libdbus,
/// busctl, gpushare-ctl) stop waiting for a reply, so that no job starts for a caller that
/// has given up; gpushare-ctl calls again while the start-up re-apply runs.
const LOCK_WAIT: Duration = Duration::from_secs(20);
/// How long `status` waits for its client table (a few milliseconds when nothing stalls).
const STATUS_CLIENTS_DEADLINE: Duration = Duration::from_secs(1);
/// How often a job waiting for the lock looks again while its holder has no name; a job's
/// release wakes it at once.
const LOCK_POLL: Duration = Duration::from_millis(20);

/// The agent's engine: the node, the known profiles, the journal, the apply lock.
pub struct Engine {
    node: NodeAccess,
    /// Where probe results are kept.
    probe_dir: PathBuf,
    /// Restarts MPS servers that died.
    supervisor: Arc<MpsSupervisor>,
    /// Replaced whole on a reload (SIGHUP); each operation works on one version.
    profiles: RwLock<Arc<ProfileStore>>,
    journal: Arc<Journal>,
    transactions: SerialTransactions,
    policy: PlanOptions,
    /// Held by an apply or probe for its whole length, and by a bench while it is checked
    /// and claims its GPU.
    apply_lock: Arc<AsyncMutex<()>>,
    /// The GPUs benches hold (added under the apply lock).
    claims: Arc<Claims>,
    /// The job holding the apply lock, changed together with taking the lock (under this
    /// mutex), so that a caller finding the lock held also finds who holds it.
    running: Arc<Mutex<Option<RunningJob>>>,
    /// Told when a job releases the apply lock: wakes the calls waiting for it.
    released: Arc<Notify>,
    /// What holds the apply lock for a moment without a job (the health check, a bench
    /// being checked), named to a caller whose wait runs out.
    moments: jobs::Moments,
    events: Events,
    /// Why the agent changes nothing on this node (its configuration did not read), if so.
    hands_off: Option<String>,
    /// Parsing and planning callers' documents: one at a time, so that however many
    /// arrive at once, they hold one core and the agent's other tasks (another client's
    /// `status`) keep the rest.
    document_work: Arc<tokio::sync::Semaphore>,
    /// Why the re-apply at start-up failed, until an apply succeeds.
    start_up_error: Mutex<Option<String>>,
    /// Whether the active profile time-slices, for the document it was last worked out
    /// from (a profile applied from a file is parsed once, not at every `status`).
    active_parsed: Mutex<Option<(ActiveProfile, Option<Arc<Profile>>)>>,
    /// The drift last logged, so that a change is logged once.
    drift_logged: Mutex<Option<String>>,
    /// Moved on when a job begins and when it ends: an observation is shared only within
    /// one epoch, and drift is judged only from an observation no job began or ended
    /// during (the journal and the GPUs then tell of the same moment).
    job_epoch: Arc<std::sync::atomic::AtomicU64>,
    /// How bench replicas are started: transient units, or children in new sessions.
    launcher: Arc<Launcher>,
    /// The cancel of the bench running now, for SIGTERM.
    running_bench: Mutex<Option<Cancel>>,
    /// Set by SIGTERM: a bench that begins now is cancelled at once.
    stopping: std::sync::atomic::AtomicBool,
    /// How long a bench may take, and the benches being checked as their callers.
    bench_limits: bench_limits::BenchLimits,
}

/// The active profile as the journal records it: a name, and the document it was applied
/// from (`apply -f`) if any.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ActiveProfile {
    name: String,
    document: Option<ProfileDocument>,
}

/// The engine's transactions, one at a time: an apply's, a bench's setups and its restore,
/// the rollback of an unfinished apply. The journal records one transaction in flight, and a
/// transaction is planned against GPUs no other one changes meanwhile; the turn is held only
/// while one executes (seconds), never for a bench's length, so an apply of another GPU
/// waits at most for one setup of a bench. A setup of a bench that changes nothing is no
/// apply of a profile and is not recorded (see [`SerialTransactions::apply`]).
pub struct SerialTransactions {
    inner: Transactions,
    /// The CDI spec, rebuilt after each transaction, in its turn.
    cdi: cdi::CdiKeeper,
    turn: Arc<AsyncMutex<()>>,
    claims: Arc<Claims>,
    /// Moved on when a transaction begins and ends (see `Engine::job_epoch`).
    epoch: Arc<std::sync::atomic::AtomicU64>,
}

/// The turn to run a transaction; the job epoch moves on when it is taken and when it goes.
struct Turn<'a> {
    _held: tokio::sync::MutexGuard<'a, ()>,
    epoch: &'a std::sync::atomic::AtomicU64,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl SerialTransactions {
    /// Waits for the turn.
    async fn turn(&self) -> Turn<'_> {
        let held = self.turn.lock().await;
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Turn { _held: held, epoch: &self.epoch }
    }

    /// The turn if no transaction runs now.
    fn try_turn(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        self.turn.try_lock().ok()
    }

    /// [`Transactions::apply`] in turn. A plan of benched GPUs alone is a bench's own setup
    /// (no apply that selects a benched GPU gets this far): when it changes nothing, there
    /// is nothing to record, and its profile (`bench-mps`) never becomes the active one.
    pub async fn apply(
        &self,
        plan: &Plan,
        document: Option<ProfileDocument>,
        before: &NodeState,
        progress: &UnboundedSender<Progress>,
    ) -> Result<Applied, TransactionError> {
        let setup = !plan.gpus.is_empty() && plan.gpus.iter().all(|g| self.claims.holds(g.gpu));
        if setup && plan.is_empty() {
            return Ok(Applied { steps_done: 0, warnings: Vec::new() });
        }
        let _turn = self.turn().await;
        let applied = self.inner.apply(plan, document, before, progress).await;
        // Committed or rolled back, the spec names what is there now.
        self.cdi.refresh().await;
        applied
    }

    /// [`Transactions::restore`] in turn.
    pub async fn restore(
        &self,
        checkpoint: &[GpuCheckpoint],
        purpose: Purpose,
        progress: &UnboundedSender<Progress>,
    ) -> Result<u32, String> {
        let _turn = self.turn().await;
        let restored = self.inner.restore(checkpoint, purpose, progress).await;
        self.cdi.refresh().await;
        restored
    }

    /// [`Transactions::recover`] in turn.
    pub async fn recover(&self) -> Result<Option<Recovered>, String> {
        let _turn = self.turn().await;
        let recovered = self.inner.recover().await;
        if matches!(recovered, Ok(Some(_))) {
            self.cdi.refresh().await;
        }
        recovered
    }
}

/// An apply that holds the apply lock and has its plan. The lock is released when the
/// job is dropped: keep it until the outcome has been reported.
pub struct ApplyJob {
    plan: Plan,
    document: Option<ProfileDocument>,
    before: NodeState,
    /// What the rollback of an earlier unfinished apply repaired before this one.
    repaired: Option<Recovered>,
    /// Whether this is the re-apply at start-up.
    boot: bool,
    _guard: JobGuard,
}

impl ApplyJob {
    /// The plan the job carries out.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }
}

/// A profile given by name or as a document (`apply -f`).
#[derive(Debug, Clone, Copy)]
pub enum ProfileRef<'a> {
    /// A known profile.
    Named(&'a str),
    /// A gpushare profile (TOML) or a mig-parted config file with the config to use.
    Document {
        /// The document.
        text: &'a str,
        /// Its name in messages (a path).
        origin: &'a str,
        /// The mig-parted config; empty for TOML.
        config: &'a str,
    },
}

impl<'a> ProfileRef<'a> {
    /// The profile of a journaled document.
    fn of_document(d: &'a ProfileDocument) -> Self {
        ProfileRef::Document { text: &d.text, origin: &d.origin, config: &d.config }
    }
}

impl Engine {
    /// An engine over `backend` with `profiles`, keeping its journal in `state_dir`.
    pub fn new(
        backend: Arc<dyn GpuBackend>,
        profiles: ProfileStore,
        state_dir: &Path,
        config: &AgentConfig,
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
        let claims = Arc::new(Claims::default());
        let job_epoch = Arc::new(std::sync::atomic::AtomicU64::new(0));
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
        let writer =
            crate::cdi::writer::Writer { dir: config.cdi.dir.clone(), enabled: config.cdi.enabled };
        let transactions = SerialTransactions {
            cdi: cdi::CdiKeeper::new(writer, node.clone()),
            inner: transactions,
            turn: Arc::new(AsyncMutex::new(())),
            claims: Arc::clone(&claims),
            epoch: Arc::clone(&job_epoch),
        };
        Ok(Engine {
            node,
            probe_dir: state_dir.join("probe"),
            supervisor: Arc::new(MpsSupervisor::new()),
            profiles: RwLock::new(Arc::new(profiles)),
            journal,
            transactions,
            policy,
            apply_lock: Arc::new(AsyncMutex::new(())),
            claims,
            running: Arc::new(Mutex::new(None)),
            released: Arc::new(Notify::new()),
            moments: jobs::Moments::default(),
            events: Events::new(),
            hands_off: None,
            document_work: Arc::new(tokio::sync::Semaphore::new(1)),
            start_up_error: Mutex::new(None),
            active_parsed: Mutex::new(None),
            drift_logged: Mutex::new(None),
            job_epoch,
            launcher: Arc::new(Launcher::Direct),
            running_bench: Mutex::new(None),
            stopping: std::sync::atomic::AtomicBool::new(false),
            bench_limits: bench_limits::BenchLimits::new(&config.bench),
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
        self.hands_off = Some(why);
        self
    }

    /// Refuses a change when the agent is hands-off.
    fn may_change(&self) -> Result<(), EngineError> {
        match &self.hands_off {
            Some(why) => Err(EngineError::HandsOff(why.clone())),
            None => Ok(()),
        }
    }

    /// The known profiles, as of now.
    fn profiles(&self) -> Arc<ProfileStore> {
        Arc::clone(&self.profiles.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Replaces the known profiles (a reload of the profile directory). Jobs already
    /// planned keep the profile they planned.
    pub fn reload_profiles(&self, profiles: ProfileStore) {
        *self.profiles.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(profiles);
    }

    /// Which backend drives the GPUs.
    pub fn backend_kind(&self) -> BackendKind {
        self.node.backend.kind()
    }

    /// The profile last applied successfully.
    pub fn active_profile(&self) -> Option<String> {
        self.journal.active_profile()
    }

    /// The job holding the apply lock, if any.
    pub fn running_job(&self) -> Option<RunningJob> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The GPUs benches hold now.
    pub fn bench_claims(&self) -> Vec<BenchClaim> {
        self.claims.all()
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

    /// Rolls back an apply that the journal shows interrupted (run before serving).
    /// Returns what was done, for the log.
    pub async fn recover(&self) -> Result<Option<String>, EngineError> {
        let _lock = self.apply_lock.lock().await;
        let _named = self.moments.hold("the recovery at start-up".into());
        if let Some(why) = &self.hands_off {
            let pending = self.journal.snapshot().transaction;
            return Ok(pending.map(|t| {
                format!("the unfinished apply of {} is left as it is: {why}", t.profile)
            }));
        }
        let recovered = self.transactions.recover().await.map_err(EngineError::Recovery)?;
        Ok(recovered.map(|r| r.message))
    }

    /// A fresh observation of the GPUs, MPS servers and time-slice intervals.
    pub async fn observe(&self) -> Result<NodeState, EngineError> {
        Ok(self.node.observe(Reads::FOR_PLANNING).await?)
    }

    /// The observed GPUs with their clients, the active profile and the job in progress.
    /// Time-slice intervals cost an nvidia-smi run, so they are read only when the active
    /// profile time-slices.
    pub async fn status(&self) -> Result<Status, EngineError> {
        self.status_with(true).await
    }

    /// [`Engine::status`] without the clients (no `/proc` read): what the metrics'
    /// refresh reads every few seconds, which has series of its own for clients.
    pub async fn status_without_clients(&self) -> Result<Status, EngineError> {
        self.status_with(false).await
    }

    async fn status_with(&self, with_clients: bool) -> Result<Status, EngineError> {
        let epoch = self.epoch();
        // Whether the journal's transaction is settled: none runs now (a bench's setup runs
        // with no job named). Read while no transaction can begin.
        let (journal, settled) = match self.transactions.try_turn() {
            Some(_idle) => (self.journal.snapshot(), true),
            None => (self.journal.snapshot(), false),
        };
        let running = self.running_job();
        let benches = self.claims.all();
        let time_slices = self.active_time_slices(&journal);
        let reads = Reads { timeslices: time_slices, mps_clients: time_slices };
        let mut node = self.node.observe_shared(reads, epoch).await?;
        // The limits each control daemon applies now, in one control run per daemon (none
        // when the observation read them with the clients); on a GPU whose driver does not
        // name MPS clients (no MPS process list) the same run asks the daemon for them, so
        // that the clients are attributed.
        node = self.with_live_limits(node, with_clients).await?;
        let drift = (self.epoch() == epoch).then(|| self.drift_of(&node, &journal)).flatten();
        let profiles = self.profiles();
        let active_source = journal.active_profile.as_deref().map(|name| {
            match (&journal.active_document, profiles.get(name)) {
                // Sanitized as it entered; a journal of an older agent may hold anything.
                (Some(document), _) => crate::sys::text::printable(&document.origin, 4096),
                (None, Ok(stored)) => stored.source.to_string(),
                (None, Err(missing @ profile::Missing::Broken(_))) => missing.to_string(),
                (None, Err(_)) => "no longer known".to_string(),
            }
        });
        // A transaction the journal still holds while none runs was not settled: its
        // rollback failed, or its end could not be written. The next apply rolls it back.
        let rollback_error = journal.transaction.filter(|_| settled).map(|t| {
            t.rollback_error.unwrap_or_else(|| {
                let why = self.journal.write_error().map(|e| format!(" ({e})")).unwrap_or_default();
                format!(
                    "the journal still records the unfinished apply of {}{why}; the next apply rolls it back first",
                    t.profile
                )
            })
        });
        // A bench whose restore failed: the GPU is as the failure left it until an apply.
        let rollback_error = rollback_error.or_else(|| {
            let bench = journal.bench.as_ref()?;
            let error = bench.restore_error.as_ref()?;
            Some(format!(
                "restoring the GPU after the bench {} failed: {error}; the next apply settles it",
                bench.job
            ))
        });
        let restores = self.supervisor.restores();
        let cx = self.mps_context(&restores);
        let mut gpus: Vec<_> =
            node.gpus.iter().map(|g| report::gpu_status(g, &node, &cx)).collect();
        let clients = if with_clients { self.status_clients(&node).await } else { Vec::new() };
        for client in clients {
            if let Some(gpu) = gpus.iter_mut().find(|g| g.index == client.gpu) {
                gpu.clients.push(client);
            }
        }
        Ok(Status {
            active_profile: journal.active_profile,
            active_source,
            backend: self.backend_kind().as_str().to_string(),
            starting_up: running.as_ref().is_some_and(|job| job.id == BOOT_JOB),
            apply_in_progress: running.map(|job| job.to_string()),
            rollback_error,
            hands_off: self.hands_off.clone(),
            drift,
            start_up_error: self
                .start_up_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            benches: benches.iter().map(bench_status).collect(),
            gpus,
        })
    }

    /// The clients `status` shows: the observation's, as `Clients` shows them to anyone
    /// (`clients::Viewer::Anyone`: every caller shares one `Status`, so no command line, no
    /// share from a client's environment, and under `hidepid` no user, unit or container
    /// of anyone's). The driver names the MPS clients
    /// among its processes, so no MPS control daemon is asked. Read in `/proc` off the
    /// async threads; nothing to read when no process uses a GPU.
    /// Best-effort: a failure is logged and shows no client, never fails `status`.
    async fn status_clients(
        &self,
        node: &crate::node::NodeState,
    ) -> Vec<gpushare_proto::clients::GpuClient> {
        let anyone = node.gpus.iter().any(|g| !g.processes.is_empty())
            || node.mps.iter().any(|s| !s.clients.is_empty());
        if !anyone {
            return Vec::new();
        }
        // A read of another process's memory (`environ`, `cmdline`) waits on that
        // process's memory lock. `status` reads neither since issue 36, but the deadline
        // stays for whatever else in /proc might wait: one stalled past it leaves status
        // without clients, and later calls do not pile up more reads behind it until every
        // stalled one has ended.
        use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering::SeqCst};
        static STALLED: AtomicUsize = AtomicUsize::new(0);
        const RUNNING: u8 = 0;
        const DONE: u8 = 1;
        const LATE: u8 = 2;
        if STALLED.load(SeqCst) > 0 {
            tracing::debug!("status without clients: an earlier read in /proc has not ended");
            return Vec::new();
        }
        // The shares shown are those the servers give their clients now.
        let node = node.with_live_limits();
        // RUNNING, then DONE if the read ends first, LATE if the deadline passes first;
        // a LATE read counts in STALLED until it ends.
        let state = Arc::new(AtomicU8::new(RUNNING));
        let read_state = Arc::clone(&state);
        let read = tokio::task::spawn_blocking(move || {
            let proc_root = std::path::Path::new("/proc");
            // Every caller shares one Status: each client as anyone may see it.
            let (anyone, mounts) = (clients::Viewer::Anyone, crate::sys::mounts::Mounts::read());
            let user_name = &crate::sys::unix::cached_user_name;
            let table = clients::table(&node, proc_root, &anyone, &mounts, user_name);
            if read_state.swap(DONE, SeqCst) == LATE {
                STALLED.fetch_sub(1, SeqCst);
            }
            table
        });
        match tokio::time::timeout(STATUS_CLIENTS_DEADLINE, read).await {
            Ok(Ok(table)) => {
                if table.left_out > 0 {
                    tracing::debug!(left_out = table.left_out, "status lists the first clients");
                }
                table.clients
            }
            Ok(Err(e)) => {
                tracing::warn!("status without clients: {}", crate::sys::task_failed(&e));
                Vec::new()
            }
            Err(_) => {
                // Counted only if it has not ended in between (else nothing is stalled);
                // the increment comes first so that its end's decrement never underflows.
                STALLED.fetch_add(1, SeqCst);
                if state.compare_exchange(RUNNING, LATE, SeqCst, SeqCst).is_err() {
                    STALLED.fetch_sub(1, SeqCst);
                }
                let after = STATUS_CLIENTS_DEADLINE.as_millis();
                tracing::warn!(
                    "status without clients: reading them in /proc took over {after} ms"
                );
                Vec::new()
            }
        }
    }

    /// Whether the active profile time-slices a whole GPU, whether it was applied by
    /// name or from a document: only then is an nvidia-smi run worth it for `status`.
    fn active_time_slices(&self, journal: &crate::apply::journal::AgentState) -> bool {
        if journal.active_profile.is_none() {
            return false;
        }
        // A profile that cannot be read any more: read the intervals rather than guess.
        self.active_profile_parsed(journal).is_none_or(|p| {
            p.rules.iter().any(|r| matches!(r.sharing, profile::Sharing::TimeSlicing { .. }))
        })
    }

    /// The active profile as parsed, for the document or profile store it was last worked
    /// out from (a profile applied from a file is parsed once, not at every `status`).
    fn active_profile_parsed(
        &self,
        journal: &crate::apply::journal::AgentState,
    ) -> Option<Arc<Profile>> {
        let name = journal.active_profile.as_ref()?;
        let mut cached = self.active_parsed.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((key, parsed)) = cached.as_ref()
            && key.name == *name
            && key.document == journal.active_document
        {
            return parsed.clone();
        }
        let active =
            ActiveProfile { name: name.clone(), document: journal.active_document.clone() };
        let profile = match &active.document {
            Some(d) => self.resolve(ProfileRef::of_document(d)).ok(),
            None => self.profiles().get(&active.name).ok().map(|p| p.profile.clone()),
        }
        .map(Arc::new);
        *cached = Some((active, profile.clone()));
        profile
    }

    /// How `node` differs from the active profile: the steps that would apply it again, in
    /// one line; `None` when it matches, when none is active, or while a job runs (its
    /// changes are the agent's own). A benched GPU is left out: its sharing is the bench's
    /// until the bench puts it back. MPS limits a control daemon answers otherwise than the
    /// agent set them (where `node` has them read) plan a step that puts them back.
    fn drift_of(
        &self,
        node: &NodeState,
        journal: &crate::apply::journal::AgentState,
    ) -> Option<String> {
        if self.running_job().is_some() || journal.transaction.is_some() {
            return None;
        }
        let name = journal.active_profile.as_ref()?;
        let profile = self.active_profile_parsed(journal)?;
        let options = PlanOptions { force: true, ..self.policy };
        match plan::plan(node, &profile, &options) {
            Ok(plan) => {
                // An interval that was not read (nvidia-smi is run only where one matters)
                // is no evidence of drift.
                let steps: Vec<&plan::Step> = plan
                    .gpus
                    .iter()
                    .filter(|g| !self.claims.holds(g.gpu))
                    .flat_map(|g| &g.steps)
                    .filter(|s| match s {
                        plan::Step::SetTimeslice { gpu, .. } => node.timeslice(*gpu).is_some(),
                        _ => true,
                    })
                    .collect();
                if steps.is_empty() {
                    return None;
                }
                let shown: Vec<String> = steps.iter().take(3).map(ToString::to_string).collect();
                let more = steps.len() - shown.len();
                let more = if more > 0 { format!(", and {more} more") } else { String::new() };
                let count = steps.len();
                let noun = if count == 1 { "step" } else { "steps" };
                Some(format!(
                    "the GPUs no longer match the active profile {name} (changed outside gpushare?): applying it again would take {count} {noun} ({}{more}); see `gpushare-ctl plan {name}`",
                    shown.join("; ")
                ))
            }
            // A benched GPU may be what the plan fails on.
            Err(_) if !self.claims.is_empty() => None,
            Err(e) => Some(format!(
                "the GPUs no longer match the active profile {name}, which cannot be applied to them as they are: {e}"
            )),
        }
    }

    /// Logs drift from the active profile once when it appears, and once when it is gone
    /// (called by the health check: something else changed the GPUs behind the agent).
    pub async fn log_drift(&self) {
        if self.hands_off.is_some() {
            return;
        }
        // Not while a job or a transaction changes the GPUs: its changes are no drift.
        let Ok(_lock) = Arc::clone(&self.apply_lock).try_lock_owned() else { return };
        let _named = self.moments.hold("the health check's look for drift".into());
        let Some(_turn) = self.transactions.try_turn() else { return };
        let Ok(node) = self.node.observe_shared(Reads::GPUS_AND_SERVERS, self.epoch()).await else {
            return;
        };
        // Limits changed behind the agent's back are drift too (read as the health check
        // just read them: one control run per daemon at most).
        let Ok(node) = self.node.read_live_limits(node, |_| false).await else { return };
        let journal = self.journal.snapshot();
        let drift = self.drift_of(&node, &journal);
        let mut logged = self.drift_logged.lock().unwrap_or_else(PoisonError::into_inner);
        if *logged != drift {
            match &drift {
                Some(how) => tracing::warn!("{how}"),
                None if logged.is_some() => {
                    tracing::info!("the GPUs match the active profile again")
                }
                None => {}
            }
            *logged = drift;
        }
    }

    /// The job epoch: moved on when a job, or a transaction, begins and ends. Answers
    /// worked out within one epoch describe the same GPUs and journal.
    pub fn epoch(&self) -> u64 {
        self.job_epoch.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The variables a client needs for `target`: a GPU index or `GPU-…`, or `MIG-…`.
    pub async fn client_env(&self, target: &str) -> Result<ClientEnv, EngineError> {
        let node = self.node.observe_shared(Reads::GPUS_AND_SERVERS, self.epoch()).await?;
        self.env_for(&node, target).map(|(env, _)| env)
    }

    /// The client environment of `target` in `node`, and the GPU index it belongs to.
    fn env_for(&self, node: &NodeState, target: &str) -> Result<(ClientEnv, u32), EngineError> {
        let found = if let Ok(index) = target.parse::<u32>() {
            node.gpu(index).map(|g| (g.uuid.clone(), g.index))
        } else {
            node.gpus.iter().find_map(|g| {
                if g.uuid.eq_ignore_ascii_case(target) {
                    return Some((g.uuid.clone(), g.index));
                }
                g.instances
                    .iter()
                    .flat_map(|gi| &gi.compute_instances)
                    .find(|ci| ci.uuid.eq_ignore_ascii_case(target))
                    .map(|ci| (ci.uuid.clone(), g.index))
            })
        };
        let (uuid, gpu) = found.ok_or_else(|| {
            EngineError::InvalidArgument(crate::plan::no_such_gpu(node, target, true))
        })?;
        // CUDA sees no device through a MIG GPU's own UUID: only its instances can be used.
        if let Some(g) = node.gpu(gpu).filter(|g| g.mig_enabled && g.uuid == uuid) {
            let instances: Vec<&str> = g
                .instances
                .iter()
                .flat_map(|gi| &gi.compute_instances)
                .map(|ci| ci.uuid.as_str())
                .collect();
            return Err(EngineError::InvalidArgument(if instances.is_empty() {
                format!(
                    "GPU {gpu} has MIG on and no MIG instances, so no client can use it (see gpushare-ctl status)"
                )
            } else {
                format!("GPU {gpu} has MIG on: pick an instance: {}", instances.join(", "))
            }));
        }
        let mut variables = vec![("CUDA_VISIBLE_DEVICES".to_string(), uuid.clone())];
        let served = node.mps.iter().any(|s| s.uuid == uuid && s.pid.is_some());
        if served {
            variables.push((
                "CUDA_MPS_PIPE_DIRECTORY".to_string(),
                self.node.sharing.mps.pipe_dir(&uuid).display().to_string(),
            ));
        }
        let strategy = match (served, node.time_sliced(gpu)) {
            (true, _) => Strategy::Mps,
            (false, Some(_)) => Strategy::TimeSlicing,
            (false, None) => Strategy::Exclusive,
        };
        Ok((ClientEnv { uuid, strategy: strategy.as_str().into(), variables }, gpu))
    }

    fn resolve(&self, profile: ProfileRef<'_>) -> Result<Profile, EngineError> {
        match profile {
            ProfileRef::Named(name) => {
                self.profiles().get(name).map(|p| p.profile.clone()).map_err(missing_profile)
            }
            ProfileRef::Document { text, origin, config } => {
                Ok(profile::parse_document(text, origin, config)?)
            }
        }
    }

    /// [`Engine::resolve`] for a request: a document is parsed on the blocking pool, so
    /// that no caller's document holds up the tasks that answer other callers.
    async fn resolve_request(&self, profile: ProfileRef<'_>) -> Result<Profile, EngineError> {
        let ProfileRef::Document { text, origin, config } = profile else {
            return self.resolve(profile);
        };
        let (text, origin, config) = (text.to_string(), origin.to_string(), config.to_string());
        let _turn = self.document_turn().await?;
        tokio::task::spawn_blocking(move || profile::parse_document(&text, &origin, &config))
            .await
            .map_err(|e| EngineError::Internal(crate::sys::task_failed(&e)))?
            .map_err(EngineError::from)
    }

    /// Waits for the turn to parse or plan a document (see `document_work`).
    async fn document_turn(&self) -> Result<tokio::sync::OwnedSemaphorePermit, EngineError> {
        Arc::clone(&self.document_work)
            .acquire_owned()
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))
    }

    /// Plans `profile` against `node` on the blocking pool, in turn (see
    /// [`Engine::resolve_request`]).
    async fn plan_request(
        &self,
        node: NodeState,
        profile: Profile,
        options: PlanOptions,
    ) -> Result<(Plan, NodeState, Profile), EngineError> {
        let _turn = self.document_turn().await?;
        tokio::task::spawn_blocking(move || {
            let plan = plan::plan(&node, &profile, &options)?;
            Ok((plan, node, profile))
        })
        .await
        .map_err(|e| EngineError::Internal(crate::sys::task_failed(&e)))?
    }

    /// Plans a profile against a fresh observation.
    pub async fn plan(&self, profile: ProfileRef<'_>) -> Result<Plan, EngineError> {
        let profile = self.resolve_request(profile).await?;
        let node = self.node.observe_shared(Reads::FOR_PLANNING, self.epoch()).await?;
        let (plan, node, _) = self.plan_request(node, profile, self.policy).await?;
        self.check_host(&plan, &node).await?;
        Ok(plan)
    }

    /// Refuses a plan that needs a program this host cannot run, or a GPU reset it cannot
    /// do (see [`NodeAccess::missing_tool`], [`NodeAccess::reset_blocked`]).
    async fn check_host(&self, plan: &Plan, node: &NodeState) -> Result<(), EngineError> {
        if let Some(why) = self.node.missing_tool(plan) {
            return Err(EngineError::NotPossible(why));
        }
        match self.node.reset_blocked(plan, node).await {
            Some(why) => Err(EngineError::NotPossible(why)),
            None => Ok(()),
        }
    }

    /// Takes the apply lock and plans the profile; fails at once when another job runs
    /// or the profile cannot be planned. `job` names the job in Busy messages and status.
    pub async fn begin_apply(
        &self,
        source: ProfileRef<'_>,
        force: bool,
        job: &str,
    ) -> Result<ApplyJob, EngineError> {
        self.may_change()?;
        let deadline = tokio::time::Instant::now() + LOCK_WAIT;
        let profile = self.resolve_request(source).await?;
        let kind = JobKind::Apply { profile: profile.name.clone() };
        let mut guard = self.lock_for(job, kind).await?;
        let repaired = self.settle_unfinished(deadline).await?;
        let before = self.observe().await?;
        // A benched GPU is the bench's until it ends; refused before any plan is made (a
        // plan would describe the bench's setup, and the bench's restore would undo it).
        self.refuse_benched(&profile, &before)?;
        let options = PlanOptions { force, ..self.policy };
        let (plan, before, _) = self.plan_request(before, profile, options).await?;
        self.check_host(&plan, &before).await?;
        // The spec is rewritten at commit: a place it cannot go is refused now.
        self.transactions.cdi.check().map_err(EngineError::NotPossible)?;
        let document = match source {
            ProfileRef::Named(_) => None,
            ProfileRef::Document { text, origin, config } => Some(ProfileDocument {
                text: text.to_string(),
                origin: origin.to_string(),
                config: config.to_string(),
            }),
        };
        guard.start(u32::try_from(plan.step_count()).unwrap_or(u32::MAX));
        let boot = job == BOOT_JOB;
        Ok(ApplyJob { plan, document, before, repaired, boot, _guard: guard })
    }

    /// An apply whose rollback failed (or whose end could not be written) leaves its GPUs
    /// between layouts: it is rolled back first (again), or the new apply is refused,
    /// rather than its record overwritten. What that repairs is part of the new apply's
    /// report. A transaction the journal holds may also be running now (a bench's setup or
    /// its restore): it is waited for, up to `deadline`; an unsettled setup of a running
    /// bench is the bench's to settle (its restore does).
    async fn settle_unfinished(
        &self,
        deadline: tokio::time::Instant,
    ) -> Result<Option<Recovered>, EngineError> {
        if self.journal.snapshot().transaction.is_none() {
            return Ok(None);
        }
        let busy = || EngineError::Busy(self.claims.all().first().map(BenchClaim::holder));
        let turn = tokio::time::timeout_at(deadline, self.transactions.turn())
            .await
            .map_err(|_| busy())?;
        let Some(pending) = self.journal.snapshot().transaction else { return Ok(None) };
        if let Some(claim) = pending.checkpoint.iter().find_map(|c| self.claims.of_gpu(c.gpu)) {
            return Err(EngineError::Busy(Some(claim.holder())));
        }
        let recovered = self.transactions.inner.recover().await;
        drop(turn);
        recovered.map_err(|e| {
            EngineError::Recovery(format!("{e}; no new apply until that rollback succeeds"))
        })
    }

    /// Refuses a profile that selects a GPU a bench holds, naming the bench.
    fn refuse_benched(&self, profile: &Profile, node: &NodeState) -> Result<(), EngineError> {
        let count = u32::try_from(node.gpus.len()).unwrap_or(u32::MAX);
        for claim in self.claims.all() {
            let Some(g) = node.gpu(claim.gpu) else { continue };
            let gpu = profile::GpuRef {
                index: g.index,
                count,
                uuid: &g.uuid,
                pci_device_id: g.pci_device_id,
                model: g.model,
            };
            if profile.rules.iter().any(|r| r.selects(&gpu)) {
                let mut holder = claim.holder();
                holder.kind = JobKind::Bench {
                    target: format!(
                        "GPU {} (this profile selects it), started by {}",
                        claim.gpu,
                        claim.who()
                    ),
                };
                return Err(EngineError::Busy(Some(holder)));
            }
        }
        Ok(())
    }

    /// Carries out an apply job as a transaction, sending progress.
    pub async fn run_apply(
        &self,
        job: &ApplyJob,
        progress: UnboundedSender<Progress>,
    ) -> JobReport {
        let started = Instant::now();
        let plan = &job.plan;
        let total = u32::try_from(plan.step_count()).unwrap_or(u32::MAX);
        let outcome =
            self.transactions.apply(plan, job.document.clone(), &job.before, &progress).await;
        drop(progress);
        let repaired = job.repaired.as_ref().filter(|r| r.steps > 0);
        let changed = total > 0 || repaired.is_some();
        let mut report = JobReport {
            kind: JobKind::Apply { profile: plan.profile.clone() },
            result: if changed { JobResult::Success } else { JobResult::Unchanged },
            changed,
            steps_done: 0,
            steps_total: total,
            duration: Duration::ZERO,
            error: None,
            warnings: Vec::new(),
            probe: None,
            bench: None,
        };
        if let Some(repaired) = &job.repaired {
            report.warnings.push(format!("before this apply: {}", repaired.message));
        }
        match outcome {
            Ok(applied) => {
                report.steps_done = applied.steps_done;
                report.warnings.extend(applied.warnings);
            }
            Err(error) => {
                report.result = error.settled().into();
                report.changed = error.left_changed() || repaired.is_some();
                report.steps_done = error.steps_done();
                let profile = plan.profile.clone();
                report.error = Some(EngineError::Apply { profile, error: Box::new(error) });
            }
        }
        report.duration = started.elapsed();
        self.settle_start_up_error(job.boot, report.error.as_ref());
        self.events.emit(EngineEvent::ApplyFinished {
            profile: plan.profile.clone(),
            result: report.result,
            duration: report.duration,
        });
        job._guard.finish();
        report
    }

    /// At start-up, the apply that brings the GPUs back to `boot_profile`, or else to the
    /// active profile (from its document when it was applied from one); `None` when
    /// there is nothing to re-apply.
    pub async fn begin_boot_apply(
        &self,
        boot_profile: Option<&str>,
    ) -> Option<Result<ApplyJob, EngineError>> {
        let begun = if let Some(name) = boot_profile {
            self.begin_apply(ProfileRef::Named(name), false, BOOT_JOB).await
        } else {
            let active = self.journal.active_profile()?;
            match self.journal.active_document() {
                Some(d) => self.begin_apply(ProfileRef::of_document(&d), false, BOOT_JOB).await,
                None => self.begin_apply(ProfileRef::Named(&active), false, BOOT_JOB).await,
            }
        };
        if let Err(e) = &begun {
            self.settle_start_up_error(true, Some(e));
        }
        Some(begun)
    }

    /// Keeps why the start-up re-apply failed for `status`, until an apply succeeds.
    fn settle_start_up_error(&self, boot: bool, error: Option<&EngineError>) {
        let mut kept = self.start_up_error.lock().unwrap_or_else(PoisonError::into_inner);
        match error {
            Some(e) if boot => *kept = Some(e.to_string()),
            Some(_) => {}
            None => *kept = None,
        }
    }

    /// Takes the apply lock for job `id` doing `kind`, or says what holds it. Applies and
    /// probes share it: neither may overlap the other.
    async fn lock_for(&self, id: &str, kind: JobKind) -> Result<JobGuard, EngineError> {
        let job = RunningJob { id: id.to_string(), kind };
        let lock = self.lock(Some(&job)).await?;
        Ok(self.job_guard(lock, job))
    }

    /// The guard of `job`, holding `lock`.
    fn job_guard(&self, lock: OwnedMutexGuard<()>, job: RunningJob) -> JobGuard {
        let (running, released) = (Arc::clone(&self.running), Arc::clone(&self.released));
        let epoch = Arc::clone(&self.job_epoch);
        JobGuard::new(lock, job, running, released, self.events.clone(), epoch)
    }

    /// Takes the apply lock for a job, and names it `job` (when given) in the same moment.
    /// Another job holding the lock refuses this one at once (applies are never queued),
    /// except the re-apply at start-up: a caller that arrives while the agent is still
    /// bringing its GPUs back to the active profile (a boot script, right after `systemctl
    /// restart` without waiting for systemd, a D-Bus activation) did not choose to race
    /// it, so it waits for it, and then plans against the GPUs as that left them. A holder
    /// without a name (the MPS health check, a job letting go) is waited for too. Either
    /// wait lasts up to [`LOCK_WAIT`] in all, then the call is refused as busy naming the
    /// holder. A caller without a job yet (a probe or a bench, named once its target is
    /// known) is a measurement: refused while a bench runs, naming it (one measurement at a
    /// time on a node: they would share its CPUs, and a bench's replicas are pinned to them).
    async fn lock(&self, job: Option<&RunningJob>) -> Result<OwnedMutexGuard<()>, EngineError> {
        self.lock_by(job, tokio::time::Instant::now() + LOCK_WAIT).await
    }

    /// [`Engine::lock`] waiting until `deadline` at most (a bench counts the time its
    /// check took against its [`LOCK_WAIT`]).
    async fn lock_by(
        &self,
        job: Option<&RunningJob>,
        deadline: tokio::time::Instant,
    ) -> Result<OwnedMutexGuard<()>, EngineError> {
        let mut told = false;
        loop {
            // Listening before looking: a release in between is not missed.
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let holder = {
                let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
                if let Ok(lock) = Arc::clone(&self.apply_lock).try_lock_owned() {
                    // Claims are added under the lock: none appears while it is held.
                    if job.is_none()
                        && let Some(claim) = self.claims.all().first()
                    {
                        return Err(EngineError::Busy(Some(claim.holder())));
                    }
                    if let Some(job) = job {
                        *running = Some(job.clone());
                    }
                    return Ok(lock);
                }
                running.clone()
            };
            let now = tokio::time::Instant::now();
            let look_again = match &holder {
                Some(held) if held.id != BOOT_JOB => return Err(EngineError::Busy(holder)),
                // A holder without a job may have said what it is.
                _ if now >= deadline => {
                    return Err(EngineError::Busy(holder.or_else(|| self.moments.now())));
                }
                // A job's release wakes this one; nothing else is worth looking at.
                Some(held) => {
                    if !told {
                        tracing::info!("waiting for the re-apply at start-up ({held})");
                        told = true;
                    }
                    deadline
                }
                None => (now + LOCK_POLL).min(deadline),
            };
            tokio::select! {
                () = &mut released => {}
                () = tokio::time::sleep_until(look_again) => {}
            }
        }
    }

    /// Waits for a running job (and every bench: cancel them first) to end and keeps any
    /// new one from starting: for shutdown.
    pub async fn quiesce(&self) -> OwnedMutexGuard<()> {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let lock = Arc::clone(&self.apply_lock).lock_owned().await;
            // Claims are added under the lock: with none now, none comes. A bench whose
            // claim went may still be telling its client how it ended: waited for too.
            if self.claims.all_reported() {
                // Held until the agent exits: named as what it is.
                self.moments.name("the agent's shutdown".into());
                return lock;
            }
            drop(lock);
            released.await;
        }
    }

    /// Claims the GPU of a bench's `record` for the bench `job` and lets `lock` (the apply
    /// lock, held while the bench was checked and its record written) go: from now on an
    /// apply whose profile leaves the GPU out runs beside the bench. The claim goes when the
    /// bench finishes (the guard).
    pub(super) async fn claim_for_bench(
        &self,
        lock: OwnedMutexGuard<()>,
        job: RunningJob,
        record: &BenchRecord,
        node: &NodeState,
    ) -> JobGuard {
        let uid = record.uid;
        let user = tokio::task::spawn_blocking(move || crate::sys::unix::user_name(uid))
            .await
            .ok()
            .flatten();
        let (gpu, uuid, restores) = match record.checkpoint.first() {
            Some(cp) => (cp.gpu, cp.uuid.clone(), layout_words(cp, node)),
            None => (u32::MAX, String::new(), String::new()),
        };
        let claim = BenchClaim {
            job: job.id.clone(),
            gpu,
            uuid,
            uid,
            user,
            since: std::time::SystemTime::now(),
            profile_before: record.previous_profile.clone(),
            restores,
        };
        self.claims.add(claim.clone());
        let guard = JobGuard::claiming(
            &claim,
            job.kind,
            Arc::clone(&self.claims),
            Arc::clone(&self.released),
            self.events.clone(),
            Arc::clone(&self.job_epoch),
        );
        drop(lock);
        guard
    }

    /// The GPUs as they are, as a profile (sharing included) and as a mig-parted file; the
    /// profile is planned against the node it came from, and any step left is a note.
    pub async fn export(&self) -> Result<Export, EngineError> {
        let node = self.node.observe_shared(Reads::FOR_PLANNING, self.epoch()).await?;
        let mut exported = profile::export::export(&node);
        // The proof: the export planned against the node it came from, with this agent's
        // settings; any step left is said, whatever the writer missed.
        let text = exported.text();
        let left = profile::parse_profile(&text, "exported.toml", None)
            .map_err(|e| e.to_string())
            .and_then(|p| plan::plan(&node, &p, &self.policy).map_err(|e| e.to_string()));
        match left {
            Ok(plan) if plan.is_empty() => {}
            Ok(plan) => {
                let mut steps: Vec<String> = plan.steps().take(8).map(|s| s.to_string()).collect();
                if plan.step_count() > steps.len() {
                    steps.push(format!("and {} more", plan.step_count() - steps.len()));
                }
                exported.notes.push(format!("applying this here takes: {}", steps.join("; ")));
            }
            Err(e) => exported.notes.push(format!("applying this here fails: {e}")),
        }
        Ok(Export {
            text: exported.text(),
            mig_parted: exported.mig_parted,
            notes: exported.notes,
            mig_parted_left_out: exported.left_out,
        })
    }

    /// The MIG profiles of the GPU `gpu` names (index or `GPU-…`), or of every MIG GPU
    /// for `""`: see [`mig_profiles`].
    pub async fn mig_profiles(&self, gpu: &str) -> Result<MigProfiles, EngineError> {
        let node = self.node.observe_shared(Reads::GPUS_AND_SERVERS, self.epoch()).await?;
        mig_profiles::mig_profiles(&node, gpu)
    }

    /// The devices of the CDI spec as last built.
    pub fn cdi_devices(&self) -> gpushare_proto::cdi::CdiReport {
        self.transactions.cdi.report()
    }

    /// Rebuilds the CDI spec from the node as it is (at start-up, when no transaction
    /// did: a node without an active profile, or one the re-apply left as it was).
    pub async fn refresh_cdi(&self) {
        self.transactions.cdi.refresh().await;
    }

    /// Every known profile.
    pub fn list_profiles(&self) -> ProfileList {
        let active = self.active_by_name();
        let profiles = self.profiles();
        ProfileList {
            profiles: profiles.iter().map(|p| report::summary(p, active.as_deref())).collect(),
            errors: profiles.errors().to_vec(),
        }
    }

    /// One profile with its text.
    pub fn show_profile(&self, name: &str) -> Result<ProfileDetail, EngineError> {
        let profiles = self.profiles();
        let stored = profiles.get(name).map_err(missing_profile)?;
        Ok(ProfileDetail {
            summary: report::summary(stored, self.active_by_name().as_deref()),
            text: stored.text.clone(),
        })
    }

    /// The active profile when it was applied by name: one applied from a file is not
    /// the known profile of the same name, whatever the file calls it.
    fn active_by_name(&self) -> Option<String> {
        let journal = self.journal.snapshot();
        journal.active_profile.filter(|_| journal.active_document.is_none())
    }

    /// Parses profile text and plans it against this node, changing nothing.
    pub async fn validate(&self, text: &str, origin: &str) -> Result<Validation, EngineError> {
        let profile =
            self.resolve_request(ProfileRef::Document { text, origin, config: "" }).await?;
        let node = self.observe().await?;
        let (plan, _, profile) = self.plan_request(node, profile, self.policy).await?;
        Ok(Validation { name: profile.name, plan: plan.report() })
    }
}

/// A bench as `status` shows it.
fn bench_status(claim: &BenchClaim) -> gpushare_proto::types::BenchStatus {
    let since = claim.since.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let running = claim.since.elapsed().unwrap_or_default();
    gpushare_proto::types::BenchStatus {
        job: claim.job.clone(),
        gpu: claim.gpu,
        uuid: claim.uuid.clone(),
        uid: claim.uid,
        user: claim.user.clone(),
        started_unix_seconds: since.as_secs(),
        running_seconds: running.as_secs(),
        profile_before: claim.profile_before.clone(),
        restores: claim.restores.clone(),
    }
}

/// A GPU's layout at a checkpoint, in words: `MIG off, compute mode default, MPS at 100 %
/// threads`; `MIG on: 3g.20gb, 2g.10gb, 1g.5gb ×2, compute mode default, no MPS`.
fn layout_words(cp: &GpuCheckpoint, node: &NodeState) -> String {
    let mut words = Vec::new();
    if cp.mig_enabled {
        let model = node.gpu(cp.gpu).and_then(|g| g.model);
        let mut names: Vec<(String, u32)> = Vec::new();
        for &(id, _) in &cp.instances {
            let name = model
                .and_then(|m| m.profile_by_id(id))
                .map_or_else(|| format!("profile {id}"), |p| p.name.to_string());
            match names.iter_mut().find(|(n, _)| *n == name) {
                Some((_, count)) => *count += 1,
                None => names.push((name, 1)),
            }
        }
        let listed: Vec<String> =
            names.into_iter().map(|(n, c)| if c > 1 { format!("{n} ×{c}") } else { n }).collect();
        words.push(match listed.as_slice() {
            [] => "MIG on, no instances".to_string(),
            _ => format!("MIG on: {}", listed.join(", ")),
        });
    } else {
        words.push("MIG off".to_string());
    }
    words.push(format!("compute mode {}", cp.compute_mode.as_str()));
    let whole = cp.mps.iter().find(|(start, _)| start.is_none()).map(|(_, l)| l);
    let served = cp.mps.iter().filter(|(start, _)| start.is_some()).count();
    match (whole, served) {
        (Some(l), _) => {
            let memory = l.pinned_memory_limit_bytes.map_or_else(String::new, |b| {
                format!(", {} pinned memory", gpushare_proto::exact_size(b))
            });
            words.push(format!("MPS at {} % threads{memory}", l.active_thread_percentage));
        }
        (None, 0) => words.push("no MPS".to_string()),
        (None, n) => words.push(format!("MPS on {}", gpushare_proto::plural(n as u64, "instance"))),
    }
    if let Some(interval) = cp.timeslice {
        words.push(format!("time-slice {}", interval.as_str()));
    }
    words.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::parse_node_spec as parse_spec;
    use crate::gpu::sim::{SimBackend, SimOptions};

    fn engine(dir: &Path) -> Engine {
        let backend =
            Arc::new(SimBackend::new(&parse_spec("a100-40gb:2").unwrap(), SimOptions::default()));
        let mut config = AgentConfig::default();
        config.mps.control = "/nonexistent/nvidia-cuda-mps-control".into();
        config.mps.root = dir.join("mps");
        config.cdi.dir = dir.join("cdi");
        config.timeslice.nvidia_smi = "/nonexistent/nvidia-smi".into();
        Engine::new(backend, ProfileStore::built_in(), dir, &config).unwrap()
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
            let check = Arc::clone(&engine.apply_lock).try_lock_owned().unwrap();
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
            engine.journal.begin_bench(record.clone()).unwrap();
            let lock = engine.lock(None).await.unwrap();
            let running = RunningJob {
                id: record.job.clone(),
                kind: JobKind::Bench { target: node.gpus[0].uuid.clone() },
            };
            let guard = engine.claim_for_bench(lock, running, &record, &node).await;
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
            let busy = engine.lock(None).await.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(busy.contains("bench on GPU 0, started by uid 4242"), "{busy}");

            drop(guard);
            assert!(engine.status().await.unwrap().benches.is_empty());
            engine.journal.end_bench().unwrap();
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
            Engine::new(Arc::clone(&backend), ProfileStore::built_in(), dir.path(), &config)
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
            engine.journal.begin_bench(record).unwrap();
            // A bench setup: GPU 0 in MIG, committed, not active.
            let mig = profile::MigLayout::Enabled(vec![(profile::MigKey::Slices(3), 2)]);
            let uuid = node.gpus[0].uuid.clone();
            let setup = bench::whole_gpu("bench-mig", &uuid, mig, profile::Sharing::Exclusive);
            let plan = plan::plan(&node, &setup, &engine.policy).unwrap();
            engine.transactions.apply(&plan, None, &node, &tx).await.unwrap();
            assert_eq!(engine.active_profile().as_deref(), Some("gpu1"));
            // An apply of GPU 1 that the agent's end cut short.
            let node = engine.observe().await.unwrap();
            engine
                .journal
                .begin(Transaction {
                    profile: "all-disabled".into(),
                    document: None,
                    previous_profile: engine.journal.active_profile(),
                    previous_document: engine.journal.active_document(),
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
            let state = engine.journal.snapshot();
            assert_eq!((state.transaction, state.bench), (None, None));
            assert_eq!(state.active_profile.as_deref(), Some("gpu1"));
            let node = engine.observe().await.unwrap();
            assert!(!node.gpus[0].mig_enabled && node.gpus[1].mig_enabled);
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
        let engine = Engine::new(backend, ProfileStore::built_in(), &state, &config).unwrap();
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
