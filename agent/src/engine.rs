//! The agent's operations, independent of any transport: status, plan, apply, export,
//! profiles, validation, recovery. The D-Bus service calls these and does nothing else.
//!
//! One apply runs at a time: [`Engine::begin_apply`] takes the apply lock or fails with
//! [`EngineError::Busy`] at once; the lock travels with the [`ApplyJob`] until it ends.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpushare_proto::ERROR_PREFIX;
use gpushare_proto::types::{
    ClientEnv, Export, GpuStatus, InstanceStatus, JobOutcome, MpsLimitResult, MpsServer, MpsStatus,
    ProbeClient, ProbeReport, ProbeRun, ProfileDetail, ProfileList, ProfileSummary, Sharing,
    Status, StrategyRuns, Validation,
};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use crate::apply::hooks::Hooks;
use crate::apply::journal::{Journal, ProfileDocument};
use crate::apply::transaction::{TransactionError, Transactions};
use crate::apply::{Executor, NodeAccess, Progress};
use crate::config::AgentConfig;
use crate::gpu::{BackendKind, GpuBackend, GpuError};
use crate::node::{GpuState, MpsServerState, NodeState, TimeSliceInterval};
use crate::plan::{self, Plan, PlanError, PlanOptions};
use crate::profile::{self, Profile, ProfileStore, Sharing as ProfileSharing, StoredProfile};
use crate::sharing::SharingTools;
use crate::sharing::mps::{MpsConfig, MpsController};
use crate::sharing::supervisor::MpsSupervisor;
use crate::sharing::timeslice::TimesliceControl;

/// Why an operation failed, one line each. The service maps each kind to a D-Bus error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// No profile of that name.
    #[error("{0}")]
    UnknownProfile(String),
    /// Profile text that does not parse or validate.
    #[error("{0}")]
    InvalidProfile(String),
    /// The profile cannot be planned here.
    #[error("{0}")]
    Plan(#[from] PlanError),
    /// Another apply is running.
    #[error("{0}")]
    Busy(String),
    /// The backend failed.
    #[error("{0}")]
    Backend(#[from] GpuError),
    /// Anything else (state files).
    #[error("{0}")]
    Failed(String),
}

/// The agent's engine: one backend, the known profiles, the journal.
pub struct Engine {
    node: NodeAccess,
    backend: Arc<dyn GpuBackend>,
    /// Where probe results are kept.
    probe_dir: std::path::PathBuf,
    sharing: Arc<SharingTools>,
    /// Restarts MPS servers that died.
    supervisor: Arc<MpsSupervisor>,
    profiles: ProfileStore,
    journal: Arc<Journal>,
    transactions: Transactions,
    policy: PlanOptions,
    apply_lock: Arc<AsyncMutex<()>>,
    running: Arc<Mutex<Option<String>>>,
}

/// An apply that holds the apply lock and has its plan. The lock is released when the
/// job is dropped: keep it until the outcome has been reported.
pub struct ApplyJob {
    plan: Plan,
    document: Option<ProfileDocument>,
    before: NodeState,
    _guard: RunningGuard,
}

/// Holds the apply lock and clears the running job's name when dropped.
struct RunningGuard {
    _lock: OwnedMutexGuard<()>,
    running: Arc<Mutex<Option<String>>>,
}

impl ApplyJob {
    /// The plan the job carries out.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        *self.running.lock().expect("running lock") = None;
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

impl Engine {
    /// An engine over `backend` with `profiles`, keeping its journal in `state_dir`.
    pub fn new(
        backend: Arc<dyn GpuBackend>,
        profiles: ProfileStore,
        state_dir: &Path,
        config: &AgentConfig,
    ) -> Result<Self, String> {
        let journal = Arc::new(
            Journal::open(state_dir)
                .map_err(|e| format!("state directory {}: {e}", state_dir.display()))?,
        );
        let policy = PlanOptions {
            manage_mig: config.gpu.manage_mig,
            manage_compute_mode: config.gpu.manage_compute_mode,
            force: false,
        };
        let sharing = Arc::new(SharingTools {
            mps: MpsController::new(MpsConfig {
                control: config.mps.control.clone(),
                root: config.mps.root.clone(),
            }),
            timeslice: TimesliceControl::new(config.timeslice.nvidia_smi.clone()),
        });
        let node = NodeAccess { backend: Arc::clone(&backend), sharing: Arc::clone(&sharing) };
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
        Ok(Engine {
            probe_dir: state_dir.join("probe"),
            node,
            backend,
            sharing,
            supervisor: Arc::new(MpsSupervisor::new()),
            profiles,
            journal,
            transactions,
            policy,
            apply_lock: Arc::new(AsyncMutex::new(())),
            running: Arc::new(Mutex::new(None)),
        })
    }

    /// The backend's kind (`nvml`, `simulated`).
    pub fn backend_kind(&self) -> &'static str {
        self.backend.kind().as_str()
    }

    /// The profiles the engine knows.
    pub fn profiles(&self) -> &ProfileStore {
        &self.profiles
    }

    /// The profile last applied successfully.
    pub fn active_profile(&self) -> Option<String> {
        self.journal.active_profile()
    }

    /// Rolls back an apply that the journal shows interrupted (run before serving).
    pub async fn recover(&self) -> Result<Option<String>, String> {
        let _lock = self.apply_lock.lock().await;
        self.transactions.recover().await
    }

    /// A fresh observation of the GPUs, MPS servers and time-slice intervals.
    pub async fn observe(&self) -> Result<NodeState, EngineError> {
        Ok(self.node.observe(true).await?)
    }

    /// The observed GPUs, the active profile and the apply in progress. Time-slice
    /// intervals cost an nvidia-smi run, so they are read only when the active profile
    /// time-slices.
    pub async fn status(&self) -> Result<Status, EngineError> {
        let journal = self.journal.snapshot();
        let time_sliced = journal
            .active_profile
            .as_deref()
            .and_then(|name| self.profiles.get(name).ok())
            .is_some_and(|p| {
                p.profile
                    .rules
                    .iter()
                    .any(|r| matches!(r.sharing, profile::Sharing::TimeSlicing { .. }))
            });
        let node = self.node.observe(time_sliced).await?;
        Ok(Status {
            active_profile: journal.active_profile,
            backend: self.backend.kind().as_str().to_string(),
            apply_in_progress: self.running.lock().expect("running lock").clone(),
            rollback_error: journal.transaction.and_then(|t| t.rollback_error),
            gpus: node.gpus.iter().map(|g| gpu_status(g, &node, &self.sharing)).collect(),
        })
    }

    /// The MPS servers with their clients.
    pub async fn mps_status(&self) -> Result<MpsStatus, EngineError> {
        let sharing = Arc::clone(&self.sharing);
        let servers = tokio::task::spawn_blocking(move || {
            sharing
                .mps_servers()
                .iter()
                .map(|s| {
                    let clients = s
                        .pid
                        .and_then(|_| sharing.mps.clients(&s.uuid).ok())
                        .map(|c| c.into_iter().flat_map(|(_, clients)| clients).collect())
                        .unwrap_or_default();
                    mps_server_status(s, &sharing, clients)
                })
                .collect()
        })
        .await
        .map_err(|e| EngineError::Failed(e.to_string()))?;
        Ok(MpsStatus { servers })
    }

    /// Sets the limits of the MPS server serving client `pid` (for its new clients).
    pub async fn mps_limit(
        &self,
        pid: u32,
        threads: Option<u32>,
        memory_bytes: Option<u64>,
    ) -> Result<MpsLimitResult, EngineError> {
        if let Some(t) = threads
            && !(1..=100).contains(&t)
        {
            return Err(EngineError::Failed(format!("threads must be from 1 to 100, not {t}")));
        }
        let sharing = Arc::clone(&self.sharing);
        tokio::task::spawn_blocking(move || {
            let (uuid, server) = sharing
                .mps
                .limit_client(pid, threads, memory_bytes)
                .map_err(|e| EngineError::Failed(e.to_string()))?;
            Ok(MpsLimitResult {
                pid,
                server_pid: server,
                uuid,
                active_thread_percentage: threads,
                pinned_memory_limit_bytes: memory_bytes,
            })
        })
        .await
        .map_err(|e| EngineError::Failed(e.to_string()))?
    }

    /// The variables a client needs for `target`: a GPU index or `GPU-…`, or `MIG-…`.
    pub async fn client_env(&self, target: &str) -> Result<ClientEnv, EngineError> {
        let node = self.node.observe(false).await?;
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
            EngineError::Failed(format!(
                "no GPU or MIG instance {target:?} on this node (see gpushare-ctl status)"
            ))
        })?;
        let mut variables = vec![("CUDA_VISIBLE_DEVICES".to_string(), uuid.clone())];
        let server = node.mps.iter().find(|s| s.uuid == uuid && s.pid.is_some());
        if server.is_some() {
            variables.push((
                "CUDA_MPS_PIPE_DIRECTORY".to_string(),
                self.sharing.mps.pipe_dir(&uuid).display().to_string(),
            ));
        }
        let strategy = if server.is_some() {
            "mps"
        } else {
            match node.timeslice(gpu) {
                Some(interval) if interval != TimeSliceInterval::Default => "time-slicing",
                _ => "exclusive",
            }
        };
        Ok((ClientEnv { uuid, strategy: strategy.into(), variables }, gpu))
    }

    /// Takes the apply lock (a probe and an apply never overlap) and resolves the probe's
    /// target and its client environment under the current sharing.
    pub async fn begin_probe(
        &self,
        options: ProbeOptions,
        job: &str,
    ) -> Result<ProbeJob, EngineError> {
        if self.backend.kind() == BackendKind::Simulated {
            // CUDA would see the real GPUs (or none), not the simulated ones.
            return Err(EngineError::Failed(
                "the probe measures real GPUs with CUDA; this agent simulates its GPUs".into(),
            ));
        }
        if options.workloads.is_empty() || options.clients.is_empty() {
            return Err(EngineError::Failed("a probe needs a workload and a client count".into()));
        }
        if let Some(n) = options.clients.iter().find(|n| !(1..=48).contains(*n)) {
            return Err(EngineError::Failed(format!("{n} clients: from 1 to 48 (MPS's limit)")));
        }
        if !(0.5..=60.0).contains(&options.seconds) {
            return Err(EngineError::Failed("probe windows are from 0.5 to 60 seconds".into()));
        }
        let lock = self.try_lock()?;
        let node = self.node.observe(true).await?;
        let target = options.target.clone().unwrap_or_else(|| "0".into());
        let (env, gpu) = self.env_for(&node, &target)?;
        if options.compare {
            let g = node.gpu(gpu).expect("env_for found this GPU");
            if g.mig_enabled || g.uuid != env.uuid {
                return Err(EngineError::Failed(format!(
                    "--compare changes the sharing of a whole GPU: {} has MIG on; probe a MIG instance without --compare",
                    g.label()
                )));
            }
            if !g.processes.is_empty() {
                let pids: Vec<String> = g.processes.iter().map(|p| p.pid.to_string()).collect();
                return Err(EngineError::Failed(format!(
                    "--compare would change the sharing under compute processes on {} (PID {}); run it when the GPU is idle",
                    g.label(),
                    pids.join(", ")
                )));
            }
        }
        *self.running.lock().expect("running lock") = Some(format!("{job}, probe of {}", env.uuid));
        let guard = RunningGuard { _lock: lock, running: Arc::clone(&self.running) };
        Ok(ProbeJob { options, env, gpu, _guard: guard })
    }

    /// Runs a probe job: for each workload a solo baseline, then each client count, as
    /// separate client processes (this binary in its `--probe-client` mode).
    pub async fn run_probe(
        &self,
        job: &ProbeJob,
        progress: UnboundedSender<Progress>,
    ) -> JobOutcome {
        let started = Instant::now();
        let mut outcome = JobOutcome {
            ok: false,
            profile: format!("probe of {}", job.env.uuid),
            changed: false,
            steps_done: 0,
            steps_total: u32::try_from(job.options.workloads.len()).unwrap_or(u32::MAX),
            duration_seconds: 0.0,
            error_name: None,
            error: None,
            warnings: Vec::new(),
            probe: None,
        };
        let result = if job.options.compare {
            self.probe_compare(job, &progress, &mut outcome).await
        } else {
            self.probe_runs(job, &progress, &mut outcome).await
        };
        outcome.duration_seconds = started.elapsed().as_secs_f64();
        match result {
            Ok(mut report) => {
                report.wall_seconds = outcome.duration_seconds;
                let file = self.probe_dir.join(format!(
                    "probe-{}.json",
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis())
                ));
                report.saved_to = file.display().to_string();
                let saved = std::fs::create_dir_all(&self.probe_dir)
                    .and_then(|()| crate::sys::files::write_json(&file, &report));
                if let Err(e) = saved {
                    outcome
                        .warnings
                        .push(format!("probe results not saved to {}: {e}", file.display()));
                    report.saved_to.clear();
                }
                outcome.ok = true;
                crate::metrics::record_probe(&report);
                outcome.probe = Some(report);
            }
            Err(e) => {
                outcome.error_name = Some(format!("{ERROR_PREFIX}.Failed"));
                outcome.error = Some(format!("probing {}: {e}", job.env.uuid));
            }
        }
        outcome
    }

    /// The sweep under time-slicing, MPS and MPS with 100/N % threads, each set up by a
    /// transaction like any apply, then the sharing the GPU had (or its profile) restored,
    /// also after a failure.
    async fn probe_compare(
        &self,
        job: &ProbeJob,
        progress: &UnboundedSender<Progress>,
        outcome: &mut JobOutcome,
    ) -> Result<ProbeReport, String> {
        let before = self.journal.snapshot();
        let initial = self.observe().await.map_err(|e| e.to_string())?;
        let initial_mps = initial
            .mps
            .iter()
            .find(|s| s.uuid == job.env.uuid && s.pid.is_some())
            .map(|s| s.limits);
        let result = self.compare_runs(job, progress, outcome).await;
        // Back to how it was: the active profile, or else the GPU's own sharing.
        let restored = match (&before.active_profile, &before.active_document) {
            (_, Some(d)) => {
                let source =
                    ProfileRef::Document { text: &d.text, origin: &d.origin, config: &d.config };
                self.apply_unlocked(self.resolve(source).map_err(|e| e.to_string())?, progress)
                    .await
            }
            (Some(name), None) => {
                let profile = self.resolve(ProfileRef::Named(name)).map_err(|e| e.to_string())?;
                self.apply_unlocked(profile, progress).await
            }
            (None, None) => {
                let sharing = match initial_mps {
                    Some(l) => ProfileSharing::Mps(profile::MpsSettings {
                        active_thread_percentage: Some(l.active_thread_percentage),
                        pinned_memory_limit_bytes: l.pinned_memory_limit_bytes,
                        ..Default::default()
                    }),
                    None => ProfileSharing::Exclusive,
                };
                let restored = self
                    .apply_unlocked(whole_gpu("probe-restore", &job.env.uuid, sharing), progress)
                    .await;
                restored
                    .and_then(|()| self.journal.set_active(None, None).map_err(|e| e.to_string()))
            }
        };
        match (result, restored) {
            (Ok(report), Ok(())) => Ok(report),
            (Ok(_), Err(e)) => {
                Err(format!("restoring the sharing after the comparison failed: {e}"))
            }
            (Err(e), Ok(())) => Err(format!("{e}; the sharing was restored")),
            (Err(e), Err(r)) => Err(format!("{e}; restoring the sharing failed too: {r}")),
        }
    }

    async fn compare_runs(
        &self,
        job: &ProbeJob,
        progress: &UnboundedSender<Progress>,
        outcome: &mut JobOutcome,
    ) -> Result<ProbeReport, String> {
        use crate::probe::{Workload, run::run_clients, stats::summarize};
        let exe =
            std::env::current_exe().map_err(|e| format!("cannot find the agent binary: {e}"))?;
        let uuid = job.env.uuid.clone();
        let mps_dir = self.sharing.mps.pipe_dir(&uuid).display().to_string();
        let counts = job.options.clients.clone();
        let seconds = job.options.seconds;
        let limited: Vec<usize> = counts.iter().copied().filter(|&n| n > 1).collect();
        outcome.steps_total = u32::try_from(2 + limited.len()).unwrap_or(u32::MAX);
        let say = |done: u32, step: String| {
            let _ = progress.send(Progress { done, total: outcome.steps_total, step });
        };
        let env_with = |mps: bool| {
            let mut env = vec![("CUDA_VISIBLE_DEVICES".to_string(), uuid.clone())];
            if mps {
                env.push(("CUDA_MPS_PIPE_DIRECTORY".to_string(), mps_dir.clone()));
            }
            env
        };
        let sweep_all = |env: Vec<(String, String)>| {
            let (exe, workloads, counts) =
                (exe.clone(), job.options.workloads.clone(), counts.clone());
            tokio::task::spawn_blocking(move || {
                let mut all = Vec::new();
                for w in workloads {
                    all.push(crate::probe::run::sweep(&exe, w, &counts, seconds, &env)?);
                }
                Ok::<_, String>(all)
            })
        };

        say(0, "time-slicing: the GPU without MPS".into());
        self.apply_unlocked(
            whole_gpu("probe-time-slicing", &uuid, ProfileSharing::Exclusive),
            progress,
        )
        .await?;
        let ts = sweep_all(env_with(false)).await.map_err(|e| e.to_string())??;
        outcome.steps_done += 1;

        say(1, "mps: one MPS server, no limits".into());
        let unlimited =
            profile::MpsSettings { active_thread_percentage: Some(100), ..Default::default() };
        self.apply_unlocked(
            whole_gpu("probe-mps", &uuid, ProfileSharing::Mps(unlimited)),
            progress,
        )
        .await?;
        let mps = sweep_all(env_with(true)).await.map_err(|e| e.to_string())??;
        outcome.steps_done += 1;

        // MPS with 100/N % threads: N clients against the solo run without limits.
        let mut limited_runs: Vec<Vec<crate::probe::RunResult>> =
            vec![Vec::new(); job.options.workloads.len()];
        for (k, &n) in limited.iter().enumerate() {
            let pct = u32::try_from(100 / n).unwrap_or(1).max(1);
            say(2 + k as u32, format!("mps-limited: {n} clients at {pct} % threads"));
            let settings =
                profile::MpsSettings { active_thread_percentage: Some(pct), ..Default::default() };
            self.apply_unlocked(
                whole_gpu("probe-mps-limited", &uuid, ProfileSharing::Mps(settings)),
                progress,
            )
            .await?;
            for (w, workload) in job.options.workloads.iter().copied().enumerate() {
                let solo = mps[w][0].solo.clone();
                // The same work per step as the unlimited solo run (see the probe client).
                let mut env = env_with(true);
                env.push(("GPUSHARE_PROBE_GRID_SMS".to_string(), solo.device.sm_count.to_string()));
                let exe = exe.clone();
                let clients = tokio::task::spawn_blocking(move || {
                    run_clients(&exe, workload, n, seconds, &env)
                })
                .await
                .map_err(|e| e.to_string())??;
                limited_runs[w].push(summarize(&solo, clients, seconds));
            }
            outcome.steps_done += 1;
        }

        let mut comparison = Vec::new();
        let mut device = String::new();
        for (strategy, per_workload) in
            [("time-slicing", &ts), ("mps", &mps), ("mps-limited", &limited_runs)]
        {
            let runs: Vec<ProbeRun> = per_workload.iter().flatten().map(probe_run_report).collect();
            if let Some(r) = per_workload.iter().flatten().next() {
                device = r.solo.device.name.clone();
            }
            comparison.push(StrategyRuns { strategy: strategy.into(), runs });
        }
        let largest = counts.iter().copied().max().unwrap_or(1);
        let recommendations = job
            .options
            .workloads
            .iter()
            .map(|w: &Workload| crate::probe::stats::recommend(w.name(), largest, &comparison))
            .collect();
        Ok(ProbeReport {
            target: uuid.clone(),
            gpu: job.gpu,
            strategy: "compare".into(),
            device,
            seconds,
            wall_seconds: 0.0,
            runs: Vec::new(),
            saved_to: String::new(),
            comparison,
            recommendations,
        })
    }

    /// Plans and applies `profile` while the caller holds the apply lock (a probe's own
    /// steps): the same planner, journal and rollback as any apply.
    async fn apply_unlocked(
        &self,
        profile: Profile,
        progress: &UnboundedSender<Progress>,
    ) -> Result<(), String> {
        let before = self.observe().await.map_err(|e| e.to_string())?;
        let plan = plan::plan(&before, &profile, &self.policy).map_err(|e| e.to_string())?;
        self.transactions
            .apply(&plan, None, &before, progress)
            .await
            .map(|_| ())
            .map_err(|e| format!("setting up {}: {e}", profile.name))
    }

    async fn probe_runs(
        &self,
        job: &ProbeJob,
        progress: &UnboundedSender<Progress>,
        outcome: &mut JobOutcome,
    ) -> Result<ProbeReport, String> {
        let exe =
            std::env::current_exe().map_err(|e| format!("cannot find the agent binary: {e}"))?;
        let env = job.env.variables.clone();
        let total = outcome.steps_total;
        let mut runs = Vec::new();
        let mut device = String::new();
        for (i, &workload) in job.options.workloads.iter().enumerate() {
            let counts: Vec<String> = job.options.clients.iter().map(usize::to_string).collect();
            let _ = progress.send(Progress {
                done: i as u32,
                total,
                step: format!("{}: solo, then {} clients", workload.name(), counts.join(", ")),
            });
            let (exe, env, counts, seconds) =
                (exe.clone(), env.clone(), job.options.clients.clone(), job.options.seconds);
            let results = tokio::task::spawn_blocking(move || {
                crate::probe::run::sweep(&exe, workload, &counts, seconds, &env)
            })
            .await
            .map_err(|e| e.to_string())??;
            for r in results {
                device = r.solo.device.name.clone();
                runs.push(probe_run_report(&r));
            }
            outcome.steps_done += 1;
        }
        Ok(ProbeReport {
            target: job.env.uuid.clone(),
            gpu: job.gpu,
            strategy: job.env.strategy.clone(),
            device,
            seconds: job.options.seconds,
            wall_seconds: 0.0,
            runs,
            saved_to: String::new(),
            comparison: Vec::new(),
            recommendations: Vec::new(),
        })
    }

    /// One health check of the MPS servers: a server that does not run or answer is
    /// restarted with its limits, with a backoff (1 s doubling to 60 s) between attempts.
    /// Skipped while an apply runs. Returns what it did, one line per server.
    pub async fn supervise_mps(&self) -> Vec<String> {
        let Ok(_lock) = Arc::clone(&self.apply_lock).try_lock_owned() else { return Vec::new() };
        let (supervisor, sharing) = (Arc::clone(&self.supervisor), Arc::clone(&self.sharing));
        tokio::task::spawn_blocking(move || supervisor.check(&sharing.mps))
            .await
            .unwrap_or_default()
    }

    fn resolve(&self, profile: ProfileRef<'_>) -> Result<Profile, EngineError> {
        match profile {
            ProfileRef::Named(name) => self
                .profiles
                .get(name)
                .map(|p| p.profile.clone())
                .map_err(EngineError::UnknownProfile),
            ProfileRef::Document { text, origin, config } => {
                profile::parse_document(text, origin, config)
                    .map_err(|e| EngineError::InvalidProfile(e.to_string()))
            }
        }
    }

    /// Plans a profile against a fresh observation.
    pub async fn plan(&self, profile: ProfileRef<'_>) -> Result<Plan, EngineError> {
        let profile = self.resolve(profile)?;
        let node = self.observe().await?;
        Ok(plan::plan(&node, &profile, &self.policy)?)
    }

    /// Takes the apply lock and plans the profile; fails at once when another apply runs
    /// or the profile cannot be planned. `job` names the job in Busy messages and status.
    pub async fn begin_apply(
        &self,
        source: ProfileRef<'_>,
        force: bool,
        job: &str,
    ) -> Result<ApplyJob, EngineError> {
        let profile = self.resolve(source)?;
        let lock = self.try_lock()?;
        *self.running.lock().expect("running lock") =
            Some(format!("{job}, profile {}", profile.name));
        let guard = RunningGuard { _lock: lock, running: Arc::clone(&self.running) };
        // An apply whose rollback failed leaves its GPUs between layouts: roll it back
        // first (again), or refuse, rather than overwrite its record.
        if self.journal.snapshot().transaction.is_some() {
            self.transactions.recover().await.map_err(|e| {
                EngineError::Failed(format!("{e}; no new apply until that rollback succeeds"))
            })?;
        }
        let before = self.observe().await?;
        let plan = plan::plan(&before, &profile, &PlanOptions { force, ..self.policy })?;
        let document = match source {
            ProfileRef::Named(_) => None,
            ProfileRef::Document { text, origin, config } => Some(ProfileDocument {
                text: text.to_string(),
                origin: origin.to_string(),
                config: config.to_string(),
            }),
        };
        Ok(ApplyJob { plan, document, before, _guard: guard })
    }

    /// Carries out an apply job as a transaction, sending progress.
    pub async fn run_apply(
        &self,
        job: &ApplyJob,
        progress: UnboundedSender<Progress>,
    ) -> JobOutcome {
        let started = Instant::now();
        let plan = &job.plan;
        let total = u32::try_from(plan.step_count()).unwrap_or(u32::MAX);
        let result =
            self.transactions.apply(plan, job.document.clone(), &job.before, &progress).await;
        drop(progress);
        let mut outcome = JobOutcome {
            ok: result.is_ok(),
            profile: plan.profile.clone(),
            changed: total > 0,
            steps_done: 0,
            steps_total: total,
            duration_seconds: 0.0,
            error_name: None,
            error: None,
            warnings: Vec::new(),
            probe: None,
        };
        match result {
            Ok(applied) => {
                outcome.steps_done = applied.steps_done;
                outcome.warnings = applied.warnings;
            }
            Err(e) => {
                let (name, steps_done) = match &e {
                    TransactionError::Hook(_) | TransactionError::Journal(_) => ("Failed", 0),
                    TransactionError::RolledBack { steps_done, .. }
                    | TransactionError::RollbackFailed { steps_done, .. } => {
                        ("Backend", *steps_done)
                    }
                };
                outcome.changed = matches!(e, TransactionError::RollbackFailed { .. });
                outcome.steps_done = steps_done;
                outcome.error_name = Some(format!("{ERROR_PREFIX}.{name}"));
                outcome.error = Some(format!("applying {}: {e}", plan.profile));
            }
        }
        outcome.duration_seconds = started.elapsed().as_secs_f64();
        crate::metrics::record_apply(&outcome);
        outcome
    }

    /// At start-up, the apply that brings the GPUs back to `boot_profile`, or else to the
    /// active profile (from its document when it was applied from one); `None` when
    /// there is nothing to re-apply.
    pub async fn begin_boot_apply(
        &self,
        boot_profile: Option<&str>,
    ) -> Option<Result<ApplyJob, EngineError>> {
        let job = "start-up";
        if let Some(name) = boot_profile {
            return Some(self.begin_apply(ProfileRef::Named(name), false, job).await);
        }
        let active = self.journal.active_profile()?;
        Some(match self.journal.active_document() {
            Some(d) => {
                let source =
                    ProfileRef::Document { text: &d.text, origin: &d.origin, config: &d.config };
                self.begin_apply(source, false, job).await
            }
            None => self.begin_apply(ProfileRef::Named(&active), false, job).await,
        })
    }

    /// Brings the exported metrics up to date with a fresh status.
    pub async fn refresh_metrics(&self) {
        match (self.status().await, self.mps_status().await) {
            (Ok(status), Ok(mps)) => crate::metrics::update_state(&status, &mps),
            (Err(e), _) | (_, Err(e)) => tracing::debug!("metrics not refreshed: {e}"),
        }
    }

    /// Takes the apply lock at once, or says what holds it. Applies and probes share it:
    /// neither may overlap the other.
    fn try_lock(&self) -> Result<OwnedMutexGuard<()>, EngineError> {
        Arc::clone(&self.apply_lock).try_lock_owned().map_err(|_| {
            let running = self.running.lock().expect("running lock").clone();
            let what = match &running {
                Some(job) if job.contains(", probe of ") => "a probe",
                _ => "another apply",
            };
            EngineError::Busy(format!(
                "{what} is running ({}); try again when it has finished",
                running.unwrap_or_else(|| "recovery at start-up".into())
            ))
        })
    }

    /// Waits for a running apply to end and keeps any new one from starting: for shutdown.
    pub async fn quiesce(&self) -> OwnedMutexGuard<()> {
        Arc::clone(&self.apply_lock).lock_owned().await
    }

    /// The GPUs as they are, as a profile.
    pub async fn export(&self) -> Result<Export, EngineError> {
        let node = self.observe().await?;
        Ok(Export { text: profile::export::profile_text(&node) })
    }

    /// Every known profile.
    pub fn list_profiles(&self) -> ProfileList {
        let active = self.active_profile();
        ProfileList {
            profiles: self.profiles.iter().map(|p| summary(p, active.as_deref())).collect(),
            errors: self.profiles.errors().to_vec(),
        }
    }

    /// One profile with its text.
    pub fn show_profile(&self, name: &str) -> Result<ProfileDetail, EngineError> {
        let stored = self.profiles.get(name).map_err(EngineError::UnknownProfile)?;
        Ok(ProfileDetail {
            summary: summary(stored, self.active_profile().as_deref()),
            text: stored.text.clone(),
        })
    }

    /// Parses profile text and plans it against this node, changing nothing.
    pub async fn validate(&self, text: &str, origin: &str) -> Result<Validation, EngineError> {
        let profile = self.resolve(ProfileRef::Document { text, origin, config: "" })?;
        let node = self.observe().await?;
        let plan = plan::plan(&node, &profile, &self.policy)?;
        Ok(Validation { name: profile.name, plan: plan.report() })
    }
}

fn summary(stored: &StoredProfile, active: Option<&str>) -> ProfileSummary {
    ProfileSummary {
        name: stored.profile.name.clone(),
        description: stored.profile.description.clone(),
        source: stored.source.to_string(),
        active: active == Some(stored.profile.name.as_str()),
    }
}

/// What a probe runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeOptions {
    /// GPU index, `GPU-…` or `MIG-…`; GPU 0 when absent.
    pub target: Option<String>,
    /// Workloads, in order.
    pub workloads: Vec<crate::probe::Workload>,
    /// Client counts, in order.
    pub clients: Vec<usize>,
    /// Measurement window of each run, seconds.
    pub seconds: f64,
    /// Run the sweep under time-slicing, MPS and MPS with per-client limits, and
    /// recommend a strategy per workload.
    pub compare: bool,
}

/// A probe that holds the apply lock, with its target's client environment.
pub struct ProbeJob {
    options: ProbeOptions,
    env: ClientEnv,
    gpu: u32,
    _guard: RunningGuard,
}

/// A profile that sets one whole GPU's sharing and leaves every other GPU alone.
fn whole_gpu(name: &str, uuid: &str, sharing: ProfileSharing) -> Profile {
    Profile {
        name: name.into(),
        description: "set up by a probe comparison".into(),
        rules: vec![profile::GpuRule {
            select: profile::Selector::Uuid(uuid.into()),
            device_filter: Vec::new(),
            location: profile::Location { origin: "probe".into(), line: 1, column: 1 },
            mig: profile::MigLayout::Disabled,
            sharing,
            instance_sharing: Vec::new(),
        }],
    }
}

fn probe_run_report(r: &crate::probe::RunResult) -> ProbeRun {
    let a = &r.solo.achieved;
    ProbeRun {
        workload: r.workload.name().to_string(),
        clients: u32::try_from(r.clients).unwrap_or(u32::MAX),
        solo_throughput_per_s: r.solo_throughput_per_s,
        solo_p50_ms: r.solo_p50_ms,
        solo_achieved: format!(
            "{:.1} of {:.1} {} ({:.0} %)",
            a.value,
            a.limit,
            a.unit,
            a.fraction_of_limit * 100.0
        ),
        scaling: r.scaling,
        jain_fairness: r.jain_fairness,
        p50_inflation: r.p50_inflation,
        p99_inflation: r.p99_inflation,
        per_client: r
            .per_client
            .iter()
            .map(|c| ProbeClient {
                throughput_per_s: c.throughput_per_s,
                p50_ms: c.p50_ms,
                p99_ms: c.p99_ms,
                slowdown: c.slowdown,
            })
            .collect(),
    }
}

fn mps_server_status(s: &MpsServerState, sharing: &SharingTools, clients: Vec<u32>) -> MpsServer {
    MpsServer {
        uuid: s.uuid.clone(),
        gpu: s.gpu,
        placement_start: s.placement_start.map(u32::from),
        state: if s.pid.is_some() { "running" } else { "down" }.into(),
        pid: s.pid,
        active_thread_percentage: s.limits.active_thread_percentage,
        pinned_memory_limit_bytes: s.limits.pinned_memory_limit_bytes,
        restarts: s.restarts,
        pipe_directory: sharing.mps.pipe_dir(&s.uuid).display().to_string(),
        clients,
    }
}

fn gpu_status(gpu: &GpuState, node: &NodeState, sharing: &SharingTools) -> GpuStatus {
    let servers = &node.mps;
    let profile = |id: u32| gpu.model.and_then(|m| m.profile_by_id(id));
    let mps_on = |uuid: &str| {
        servers.iter().find(|s| s.uuid == uuid).map(|s| Sharing {
            strategy: "mps".into(),
            interval: None,
            mps: Some(mps_server_status(s, sharing, Vec::new())),
        })
    };
    let whole = mps_on(&gpu.uuid).unwrap_or_else(|| match node.timeslice(gpu.index) {
        Some(interval) if interval != TimeSliceInterval::Default => Sharing {
            strategy: "time-slicing".into(),
            interval: Some(interval.as_str().into()),
            mps: None,
        },
        _ => Sharing::exclusive(),
    });
    GpuStatus {
        index: gpu.index,
        uuid: gpu.uuid.clone(),
        model: gpu.model_name().to_string(),
        memory_total_bytes: gpu.memory_total_bytes,
        mig_enabled: gpu.mig_enabled,
        mig_pending: gpu.mig_pending,
        compute_mode: gpu.compute_mode.as_str().to_string(),
        sharing: whole,
        instances: gpu
            .instances
            .iter()
            .map(|gi| {
                let ci = gi.compute_instances.first();
                InstanceStatus {
                    profile: profile(gi.profile_id).map_or_else(
                        || format!("profile-{}", gi.profile_id),
                        |p| p.name.to_string(),
                    ),
                    placement_start: u32::from(gi.placement_start),
                    placement_size: u32::from(gi.placement_size),
                    gpu_instance_id: gi.id,
                    compute_instance_id: ci.map(|c| c.id),
                    uuid: ci.map(|c| c.uuid.clone()),
                    memory_bytes: profile(gi.profile_id).map_or(0, |p| p.memory_mib << 20),
                    sharing: ci.and_then(|c| mps_on(&c.uuid)).unwrap_or_else(Sharing::exclusive),
                }
            })
            .collect(),
        processes: gpu.processes.iter().map(|p| p.pid).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::sim::{SimBackend, SimOptions, parse_spec};

    fn engine(dir: &Path) -> Engine {
        let backend =
            Arc::new(SimBackend::new(&parse_spec("a100-40gb:2").unwrap(), SimOptions::default()));
        let mut config = AgentConfig::default();
        config.mps.control = "/nonexistent/nvidia-cuda-mps-control".into();
        config.mps.root = dir.join("mps");
        config.timeslice.nvidia_smi = "/nonexistent/nvidia-smi".into();
        Engine::new(backend, ProfileStore::built_in(), dir, &config).unwrap()
    }

    #[test]
    fn comparison_profiles_touch_one_whole_gpu() {
        let p = whole_gpu("probe-mps", "GPU-x", ProfileSharing::Exclusive);
        assert_eq!(p.rules.len(), 1);
        assert_eq!(p.rules[0].select, profile::Selector::Uuid("GPU-x".into()));
        assert_eq!(p.rules[0].mig, profile::MigLayout::Disabled);
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
                let _ = engine.mps_limit(pid, Some(threads), Some(memory)).await;
                if let Ok(job) = engine.begin_apply(ProfileRef::Document { text: &text, origin: &origin, config: &config }, false, "fuzz").await {
                    drop(job);
                }
            });
        }
    }
}
