//! The D-Bus interface: transport only. Each method calls the [`Engine`] and turns its
//! answer into JSON or a D-Bus error; apply jobs become objects that emit progress.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use gpushare_proto::{AgentError, JOB_PATH_PREFIX, OPTION_FORCE};
use serde::Serialize;
use tokio::sync::Mutex as AsyncMutex;
use zbus::message::Header;
use zbus::object_server::SignalEmitter;
use zbus::zvariant::{OwnedObjectPath, OwnedValue};
use zbus::{Connection, ObjectServer, interface};

use crate::access::AccessPolicy;

use crate::engine::{Engine, EngineError, ProbeOptions, ProfileRef};
use gpushare_proto::types::JobOutcome;

/// Job objects kept for late readers; older ones are removed from the bus.
const JOBS_KEPT: usize = 16;

fn to_dbus(e: EngineError) -> AgentError {
    let message = e.to_string();
    match e {
        EngineError::UnknownProfile(_) => AgentError::UnknownProfile(message),
        EngineError::InvalidProfile(_) => AgentError::InvalidProfile(message),
        EngineError::Plan(crate::plan::PlanError::GpuBusy(_)) => AgentError::GpuBusy(message),
        EngineError::Plan(_) => AgentError::Infeasible(message),
        EngineError::Busy(_) => AgentError::Busy(message),
        EngineError::Backend(_) => AgentError::Backend(message),
        EngineError::Failed(_) => AgentError::Failed(message),
    }
}

/// Reads `Probe`'s options: `target` (s), `workloads` (as), `clients` (au), `seconds` (d),
/// `compare` (b).
fn probe_options(options: &HashMap<String, OwnedValue>) -> Result<ProbeOptions, AgentError> {
    let bad = |key: &str, what: &str| AgentError::Failed(format!("option {key:?} must be {what}"));
    let mut probe = ProbeOptions {
        target: None,
        workloads: crate::probe::Workload::ALL.to_vec(),
        clients: vec![1, 2, 4, 7],
        seconds: 3.0,
        compare: false,
    };
    for (key, value) in options {
        let value = value.try_clone().map_err(|_| bad(key, "a plain value"))?;
        match key.as_str() {
            "target" => {
                probe.target = Some(String::try_from(value).map_err(|_| bad(key, "a string"))?);
            }
            "workloads" => {
                let names: Vec<String> =
                    value.try_into().map_err(|_| bad(key, "an array of strings"))?;
                probe.workloads = names
                    .iter()
                    .map(|n| n.parse().map_err(|e: String| AgentError::Failed(e)))
                    .collect::<Result<_, _>>()?;
            }
            "clients" => {
                let counts: Vec<u32> =
                    value.try_into().map_err(|_| bad(key, "an array of numbers"))?;
                probe.clients = counts.into_iter().map(|c| c as usize).collect();
            }
            "seconds" => probe.seconds = f64::try_from(value).map_err(|_| bad(key, "a number"))?,
            "compare" => {
                probe.compare = bool::try_from(value).map_err(|_| bad(key, "a boolean"))?
            }
            other => return Err(AgentError::Failed(format!("unknown option {other:?}"))),
        }
    }
    Ok(probe)
}

fn json(value: &impl Serialize) -> String {
    serde_json::to_string(value).expect("protocol documents serialize")
}

/// The `io.gpushare.Agent1` object.
pub struct AgentService {
    engine: Arc<Engine>,
    access: AccessPolicy,
    next_job: AtomicU64,
    jobs: Arc<AsyncMutex<VecDeque<OwnedObjectPath>>>,
}

impl AgentService {
    /// The service over `engine`, letting callers change the GPUs as `access` says.
    pub fn new(engine: Arc<Engine>, access: AccessPolicy) -> Self {
        AgentService { engine, access, next_job: AtomicU64::new(1), jobs: Arc::default() }
    }

    /// Refuses a mutating call from a caller the access policy does not allow, whatever
    /// the bus policy let through; the refusal is logged.
    async fn authorize(
        &self,
        header: &Header<'_>,
        connection: &Connection,
        method: &str,
    ) -> Result<(), AgentError> {
        let Some(sender) = header.sender() else {
            return Err(AgentError::AccessDenied(format!("{method}: the caller is unknown")));
        };
        let dbus = zbus::fdo::DBusProxy::new(connection).await?;
        let credentials = dbus
            .get_connection_credentials(zbus::names::BusName::Unique(sender.to_owned()))
            .await
            .map_err(|e| {
                AgentError::AccessDenied(format!(
                    "{method}: the caller's credentials are unknown: {e}"
                ))
            })?;
        let groups = credentials.unix_group_ids().map(|g| g.to_vec()).unwrap_or_default();
        let uid = credentials.unix_user_id();
        self.access.may_change(uid, &groups).map_err(|why| {
            tracing::warn!(method, caller = %sender, uid = ?uid, "refused: {why}");
            AgentError::AccessDenied(format!("{method}: {why}"))
        })
    }
}

#[interface(name = "io.gpushare.Agent1")]
impl AgentService {
    /// Observed GPUs and the active profile (JSON `Status`).
    async fn status(&self) -> Result<String, AgentError> {
        self.engine.status().await.map(|s| json(&s)).map_err(to_dbus)
    }

    /// What applying a profile would do (JSON `PlanReport`).
    async fn plan(&self, profile: &str) -> Result<String, AgentError> {
        self.plan_ref(ProfileRef::Named(profile)).await
    }

    /// `Plan` for a profile document or a mig-parted config (JSON `PlanReport`).
    async fn plan_document(
        &self,
        text: &str,
        origin: &str,
        config: &str,
    ) -> Result<String, AgentError> {
        self.plan_ref(ProfileRef::Document { text, origin, config }).await
    }

    /// Starts an apply and returns its job object.
    async fn apply(
        &self,
        profile: &str,
        options: HashMap<String, OwnedValue>,
        #[zbus(header)] header: Header<'_>,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<OwnedObjectPath, AgentError> {
        self.authorize(&header, connection, "Apply").await?;
        self.start_apply(ProfileRef::Named(profile), &options, server, connection).await
    }

    /// `Apply` for a profile document or a mig-parted config.
    // The D-Bus signature and zbus's injected arguments make the count.
    #[allow(clippy::too_many_arguments)]
    async fn apply_document(
        &self,
        text: &str,
        origin: &str,
        config: &str,
        options: HashMap<String, OwnedValue>,
        #[zbus(header)] header: Header<'_>,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<OwnedObjectPath, AgentError> {
        self.authorize(&header, connection, "ApplyDocument").await?;
        let profile = ProfileRef::Document { text, origin, config };
        self.start_apply(profile, &options, server, connection).await
    }

    /// The GPUs as they are, as a profile (JSON `Export`).
    async fn export(&self) -> Result<String, AgentError> {
        self.engine.export().await.map(|e| json(&e)).map_err(to_dbus)
    }

    /// Starts a probe run and returns its job object.
    async fn probe(
        &self,
        options: HashMap<String, OwnedValue>,
        #[zbus(header)] header: Header<'_>,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<OwnedObjectPath, AgentError> {
        self.authorize(&header, connection, "Probe").await?;
        let options = probe_options(&options)?;
        let number = self.next_job.fetch_add(1, Ordering::Relaxed);
        let path = OwnedObjectPath::try_from(format!("{JOB_PATH_PREFIX}/{number}"))
            .expect("job paths are valid object paths");
        let job = self.engine.begin_probe(options, path.as_str()).await.map_err(to_dbus)?;
        let engine = Arc::clone(&self.engine);
        self.spawn_job(server, connection, path, async move |tx| {
            let outcome = engine.run_probe(&job, tx).await;
            (outcome, Box::new(job) as Box<dyn std::any::Any + Send>)
        })
        .await
    }

    /// The MPS servers with their limits and clients (JSON `MpsStatus`).
    async fn mps_status(&self) -> Result<String, AgentError> {
        self.engine.mps_status().await.map(|s| json(&s)).map_err(to_dbus)
    }

    /// Sets the limits of the MPS server of client `pid` (JSON `MpsLimitResult`).
    async fn mps_limit(
        &self,
        pid: u32,
        threads: u32,
        memory_bytes: u64,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<String, AgentError> {
        self.authorize(&header, connection, "MpsLimit").await?;
        let threads = (threads != 0).then_some(threads);
        let memory = (memory_bytes != 0).then_some(memory_bytes);
        self.engine.mps_limit(pid, threads, memory).await.map(|r| json(&r)).map_err(to_dbus)
    }

    /// The variables a client needs for a GPU or MIG instance (JSON `ClientEnv`).
    async fn env(&self, target: &str) -> Result<String, AgentError> {
        self.engine.client_env(target).await.map(|e| json(&e)).map_err(to_dbus)
    }

    /// Every known profile (JSON `ProfileList`).
    async fn list_profiles(&self) -> String {
        json(&self.engine.list_profiles())
    }

    /// One profile with its text (JSON `ProfileDetail`).
    async fn show_profile(&self, name: &str) -> Result<String, AgentError> {
        self.engine.show_profile(name).map(|p| json(&p)).map_err(to_dbus)
    }

    /// Validates profile text and plans it here (JSON `Validation`).
    async fn validate_profile(&self, text: &str, origin: &str) -> Result<String, AgentError> {
        self.engine.validate(text, origin).await.map(|v| json(&v)).map_err(to_dbus)
    }

    /// The agent's version.
    #[zbus(property)]
    async fn version(&self) -> String {
        env!("CARGO_PKG_VERSION").to_string()
    }
}

impl AgentService {
    async fn plan_ref(&self, profile: ProfileRef<'_>) -> Result<String, AgentError> {
        self.engine.plan(profile).await.map(|p| json(&p.report())).map_err(to_dbus)
    }

    async fn start_apply(
        &self,
        profile: ProfileRef<'_>,
        options: &HashMap<String, OwnedValue>,
        server: &ObjectServer,
        connection: &Connection,
    ) -> Result<OwnedObjectPath, AgentError> {
        let force = match options.get(OPTION_FORCE) {
            None => false,
            Some(v) => bool::try_from(v).map_err(|_| {
                AgentError::Failed(format!("option {OPTION_FORCE:?} must be a boolean"))
            })?,
        };
        if let Some(key) = options.keys().find(|k| k.as_str() != OPTION_FORCE) {
            return Err(AgentError::Failed(format!("unknown option {key:?}")));
        }
        let number = self.next_job.fetch_add(1, Ordering::Relaxed);
        let path = OwnedObjectPath::try_from(format!("{JOB_PATH_PREFIX}/{number}"))
            .expect("job paths are valid object paths");
        let job = self.engine.begin_apply(profile, force, path.as_str()).await.map_err(to_dbus)?;
        tracing::info!(job = %path.as_str(), profile = %job.plan().profile, steps = job.plan().step_count(), "apply started");
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(&format!(
            "applying {} ({} steps)",
            job.plan().profile,
            job.plan().step_count()
        ))]);
        let engine = Arc::clone(&self.engine);
        self.spawn_job(server, connection, path, async move |tx| {
            let outcome = engine.run_apply(&job, tx).await;
            (outcome, Box::new(job) as Box<dyn std::any::Any + Send>)
        })
        .await
    }

    /// Publishes the job object at `path` and runs `work` in the background, forwarding
    /// its progress as signals; `work` returns the outcome and what must live until the
    /// outcome is reported (the job holding the apply lock).
    async fn spawn_job<F, Fut>(
        &self,
        server: &ObjectServer,
        connection: &Connection,
        path: OwnedObjectPath,
        work: F,
    ) -> Result<OwnedObjectPath, AgentError>
    where
        F: FnOnce(tokio::sync::mpsc::UnboundedSender<crate::apply::Progress>) -> Fut
            + Send
            + 'static,
        Fut: std::future::Future<Output = (JobOutcome, Box<dyn std::any::Any + Send>)> + Send,
    {
        server.at(&path, JobObject::default()).await?;
        self.remember(server, path.clone()).await;
        let engine = Arc::clone(&self.engine);
        let connection = connection.clone();
        let job_path = path.clone();
        tokio::spawn(async move {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<crate::apply::Progress>();
            let emitter = SignalEmitter::new(&connection, job_path.clone())
                .expect("job paths are valid")
                .into_owned();
            let forward = async {
                while let Some(p) = rx.recv().await {
                    let _ = JobObject::progress(&emitter, p.done, p.total, &p.step).await;
                }
            };
            let ((outcome, keep_until_reported), ()) = tokio::join!(work(tx), forward);
            match &outcome.error {
                None => {
                    tracing::info!(job = %job_path.as_str(), what = %outcome.profile, steps = outcome.steps_done, "job succeeded")
                }
                Some(e) => tracing::error!(job = %job_path.as_str(), "{e}"),
            }
            let text = json(&outcome);
            let server = connection.object_server();
            if let Ok(iface) = server.interface::<_, JobObject>(&job_path).await {
                let mut job = iface.get_mut().await;
                job.state = if outcome.ok { "succeeded" } else { "failed" }.into();
                job.outcome = text.clone();
                let _ = job.state_changed(iface.signal_emitter()).await;
                let _ = job.outcome_changed(iface.signal_emitter()).await;
            }
            let _ = JobObject::finished(&emitter, &text).await;
            // Only now may another apply start, or the agent stop.
            drop(keep_until_reported);
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(&format!(
                "{} {}",
                if outcome.ok { "done:" } else { "failed:" },
                outcome.profile
            ))]);
            engine.refresh_metrics().await;
        });
        Ok(path)
    }

    async fn remember(&self, server: &ObjectServer, path: OwnedObjectPath) {
        let mut jobs = self.jobs.lock().await;
        jobs.push_back(path);
        while jobs.len() > JOBS_KEPT {
            if let Some(old) = jobs.pop_front() {
                let _ = server.remove::<JobObject, _>(&old).await;
            }
        }
    }
}

use job::JobObject;

/// The job objects; the interface macro generates undocumented `*_changed` methods.
#[allow(missing_docs)]
mod job {
    use zbus::interface;
    use zbus::object_server::SignalEmitter;

    /// An `io.gpushare.Job1` object.
    #[derive(Debug)]
    pub struct JobObject {
        pub state: String,
        pub outcome: String,
    }

    impl Default for JobObject {
        fn default() -> Self {
            JobObject { state: "running".into(), outcome: String::new() }
        }
    }

    #[interface(name = "io.gpushare.Job1")]
    impl JobObject {
        /// `running`, `succeeded` or `failed`.
        #[zbus(property)]
        async fn state(&self) -> String {
            self.state.clone()
        }

        /// The JSON `JobOutcome`; empty while running.
        #[zbus(property)]
        async fn outcome(&self) -> String {
            self.outcome.clone()
        }

        /// Before each step.
        #[zbus(signal)]
        pub async fn progress(
            emitter: &SignalEmitter<'_>,
            done: u32,
            total: u32,
            step: &str,
        ) -> zbus::Result<()>;

        /// Once, at the end.
        #[zbus(signal)]
        pub async fn finished(emitter: &SignalEmitter<'_>, outcome: &str) -> zbus::Result<()>;
    }
}
