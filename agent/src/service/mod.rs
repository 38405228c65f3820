//! The D-Bus interface, transport only. Each method checks the caller where it
//! changes the GPUs, reads its arguments into a typed request ([`options`]), calls the
//! [`Engine`], and turns the answer into JSON, or its error into a D-Bus error
//! ([`errors`], the one place that happens). Applies and probes become job objects
//! ([`job`]).

mod admission;
mod errors;
mod job;
mod options;

use std::collections::HashMap;
use std::sync::Arc;

use gpushare_proto::{AgentError, NAME_MAX_BYTES, ORIGIN_MAX_BYTES};
use serde::Serialize;
use zbus::message::Header;
use zbus::zvariant::{OwnedObjectPath, OwnedValue};
use zbus::{Connection, ObjectServer, interface};

use crate::access::AccessPolicy;
use crate::engine::{Caller, Engine, EngineError, ProfileRef};
use crate::sys::log;
use errors::access_denied;
use job::{JobObject, Jobs};

fn json(value: &impl Serialize) -> String {
    serde_json::to_string(value).expect("protocol documents serialize")
}

/// The `io.gpushare.Agent1` object.
pub struct AgentService {
    engine: Arc<Engine>,
    access: AccessPolicy,
    jobs: Jobs,
    /// Turns for read-only calls (fair between callers, root first).
    admission: admission::Admission,
}

impl AgentService {
    /// The service over `engine`, letting callers change the GPUs as `access` says.
    pub fn new(engine: Arc<Engine>, access: AccessPolicy) -> Self {
        AgentService { engine, access, jobs: Jobs::default(), admission: Default::default() }
    }

    /// Refuses a mutating call from a caller the access policy does not allow, whatever
    /// the bus policy let through; the refusal is logged. Returns the caller's user id and
    /// supplementary groups, as far as the bus knows them.
    async fn authorize(
        &self,
        header: &Header<'_>,
        connection: &Connection,
        method: &str,
    ) -> Result<(Option<u32>, Option<Vec<u32>>), AgentError> {
        let Some(sender) = header.sender() else {
            return Err(access_denied(method, "the caller is unknown"));
        };
        let dbus = zbus::fdo::DBusProxy::new(connection).await?;
        let credentials = dbus
            .get_connection_credentials(zbus::names::BusName::Unique(sender.to_owned()))
            .await
            .map_err(|e| {
                access_denied(method, format!("the caller's credentials are unknown: {e}"))
            })?;
        let groups = credentials.unix_group_ids().map(|g| g.to_vec());
        let uid = credentials.unix_user_id();
        self.access.may_change(uid, groups.as_deref().unwrap_or_default()).map_err(|why| {
            tracing::warn!(method, caller = %sender, uid = ?uid, "refused: {why}");
            access_denied(method, why)
        })?;
        Ok((uid, groups))
    }
}

#[interface(name = "io.gpushare.Agent1")]
impl AgentService {
    /// Observed GPUs and the active profile (JSON `Status`).
    async fn status(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<String, AgentError> {
        let _turn = self.admission.turn(&header, connection, 0).await?;
        Ok(json(&self.engine.status().await?))
    }

    /// What applying a profile would do (JSON `PlanReport`).
    async fn plan(
        &self,
        profile: &str,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<String, AgentError> {
        let bytes = profile.len();
        let profile = named(profile)?;
        let _turn = self.admission.turn(&header, connection, bytes).await?;
        self.plan_ref(profile).await
    }

    /// `Plan` for a profile document or a mig-parted config (JSON `PlanReport`).
    async fn plan_document(
        &self,
        text: &str,
        origin: &str,
        config: &str,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<String, AgentError> {
        let document = document(text, origin, config)?;
        let bytes = text.len() + origin.len() + config.len();
        let _turn = self.admission.turn(&header, connection, bytes).await?;
        self.plan_ref(document).await
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
        self.start_apply(named(profile)?, &options, server, connection).await
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
        self.start_apply(document(text, origin, config)?, &options, server, connection).await
    }

    /// The GPUs as they are, as a profile (JSON `Export`).
    async fn export(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<String, AgentError> {
        let _turn = self.admission.turn(&header, connection, 0).await?;
        Ok(json(&self.engine.export().await?))
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
        let options = options::probe_options(&options)?;
        let path = self.jobs.next_path();
        let job = self.engine.begin_probe(options, path.as_str()).await?;
        let engine = Arc::clone(&self.engine);
        let span = log::job_span(path.as_str());
        self.jobs
            .spawn(server, connection, path, span, JobObject::default(), async move |tx| {
                let report = engine.run_probe(&job, tx).await;
                (report, Box::new(job) as Box<dyn std::any::Any + Send>)
            })
            .await
    }

    /// Starts a bench of `command` (run as the caller) and returns its job object. The
    /// job is cancelled when its caller leaves the bus (Ctrl-C, a killed client).
    async fn bench(
        &self,
        command: Vec<String>,
        options: HashMap<String, OwnedValue>,
        #[zbus(header)] header: Header<'_>,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<OwnedObjectPath, AgentError> {
        let (uid, groups) = self.authorize(&header, connection, "Bench").await?;
        let (Some(uid), Some(sender)) = (uid, header.sender()) else {
            return Err(access_denied("Bench", "the caller's user is unknown"));
        };
        let options = options::bench_options(command, &options)?;
        let path = self.jobs.next_path();
        let caller = Caller { uid, groups };
        let job = self.engine.begin_bench(options, caller, path.as_str()).await?;
        tracing::info!(job = %path.as_str(), uid, "bench started");
        let cancel = job.canceller();
        let watcher = job::cancel_when_gone(connection, sender.to_owned(), cancel.clone()).await;
        let object = JobObject::cancellable(cancel, sender.to_string(), uid);
        let engine = Arc::clone(&self.engine);
        let span = log::job_span(path.as_str());
        self.jobs
            .spawn(server, connection, path, span, object, async move |tx| {
                let report = engine.run_bench(&job, tx).await;
                watcher.abort();
                (report, Box::new(job) as Box<dyn std::any::Any + Send>)
            })
            .await
    }

    /// The MPS servers with their limits and clients (JSON `MpsStatus`).
    async fn mps_status(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<String, AgentError> {
        let _turn = self.admission.turn(&header, connection, 0).await?;
        Ok(json(&self.engine.mps_status().await?))
    }

    /// Every process using the GPUs, attributed (JSON `ClientTable`). Open to all; a
    /// command line is shown to root and to the process's own user only.
    async fn clients(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<String, AgentError> {
        let _turn = self.admission.turn(&header, connection, 0).await?;
        let caller = caller_uid(&header, connection).await;
        Ok(json(&self.engine.clients(caller).await?))
    }

    /// What each GPU is doing now (JSON `Telemetry`). Open to all.
    async fn telemetry(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<String, AgentError> {
        let _turn = self.admission.turn(&header, connection, 0).await?;
        Ok(json(&self.engine.telemetry().await?))
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
        Ok(json(&self.engine.mps_limit(pid, threads, memory).await?))
    }

    /// The variables a client needs for a GPU or MIG instance (JSON `ClientEnv`).
    async fn env(
        &self,
        target: &str,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<String, AgentError> {
        let target = options::bounded("target", target, NAME_MAX_BYTES)?;
        let _turn = self.admission.turn(&header, connection, target.len()).await?;
        Ok(json(&self.engine.client_env(target).await?))
    }

    /// The MIG profiles of a GPU, or of every MIG GPU for `""` (JSON `MigProfiles`).
    async fn mig_profiles(
        &self,
        gpu: &str,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<String, AgentError> {
        let gpu = options::bounded("GPU", gpu, NAME_MAX_BYTES)?;
        let _turn = self.admission.turn(&header, connection, gpu.len()).await?;
        Ok(json(&self.engine.mig_profiles(gpu).await?))
    }

    /// The devices of the agent's CDI spec (JSON `CdiReport`).
    async fn cdi_devices(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<String, AgentError> {
        let _turn = self.admission.turn(&header, connection, 0).await?;
        Ok(json(&self.engine.cdi_devices()))
    }

    /// Every known profile (JSON `ProfileList`).
    async fn list_profiles(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<String, AgentError> {
        let _turn = self.admission.turn(&header, connection, 0).await?;
        Ok(json(&self.engine.list_profiles()))
    }

    /// One profile with its text (JSON `ProfileDetail`).
    async fn show_profile(
        &self,
        name: &str,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<String, AgentError> {
        let name = options::bounded("profile name", name, NAME_MAX_BYTES)?;
        let _turn = self.admission.turn(&header, connection, name.len()).await?;
        Ok(json(&self.engine.show_profile(name)?))
    }

    /// Validates profile text and plans it here (JSON `Validation`).
    async fn validate_profile(
        &self,
        text: &str,
        origin: &str,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<String, AgentError> {
        let origin = options::bounded("origin", origin, ORIGIN_MAX_BYTES)?;
        let text = profile_text(text, origin)?;
        let _turn = self.admission.turn(&header, connection, text.len() + origin.len()).await?;
        Ok(json(&self.engine.validate(text, origin).await?))
    }

    /// The agent's version.
    #[zbus(property)]
    async fn version(&self) -> String {
        env!("CARGO_PKG_VERSION").to_string()
    }
}

/// The user of the connection that sent `header`'s message, as the bus knows it.
async fn caller_uid(header: &Header<'_>, connection: &Connection) -> Option<u32> {
    let sender = header.sender()?;
    let dbus = zbus::fdo::DBusProxy::new(connection).await.ok()?;
    dbus.get_connection_unix_user(zbus::names::BusName::Unique(sender.to_owned())).await.ok()
}

/// A profile named by a caller, its name bounded.
fn named(profile: &str) -> Result<ProfileRef<'_>, AgentError> {
    Ok(ProfileRef::Named(options::bounded("profile name", profile, NAME_MAX_BYTES)?))
}

/// A document a caller sent, its origin and config name bounded (the text is bounded where
/// it is parsed: `PROFILE_MAX_BYTES`).
fn document<'a>(
    text: &'a str,
    origin: &'a str,
    config: &'a str,
) -> Result<ProfileRef<'a>, AgentError> {
    let origin = options::bounded("origin", origin, ORIGIN_MAX_BYTES)?;
    Ok(ProfileRef::Document {
        text: profile_text(text, origin)?,
        origin,
        config: options::bounded("config", config, NAME_MAX_BYTES)?,
    })
}

/// A profile text a caller sent, refused over `PROFILE_MAX_BYTES` as the parser would,
/// before the call waits for a turn or anything copies it.
fn profile_text<'a>(text: &'a str, origin: &str) -> Result<&'a str, AgentError> {
    crate::profile::check_size(text, origin).map_err(EngineError::from)?;
    Ok(text)
}

impl AgentService {
    async fn plan_ref(&self, profile: ProfileRef<'_>) -> Result<String, AgentError> {
        Ok(json(&self.engine.plan(profile).await?.report()))
    }

    async fn start_apply(
        &self,
        profile: ProfileRef<'_>,
        options: &HashMap<String, OwnedValue>,
        server: &ObjectServer,
        connection: &Connection,
    ) -> Result<OwnedObjectPath, AgentError> {
        let options = options::apply_options(options)?;
        let path = self.jobs.next_path();
        let job = self.engine.begin_apply(profile, options.force, path.as_str()).await?;
        let profile = &job.plan().profile;
        tracing::info!(job = %path.as_str(), profile = %profile, steps = job.plan().step_count(), "apply started");
        let span = log::apply_span(path.as_str(), profile);
        let engine = Arc::clone(&self.engine);
        self.jobs
            .spawn(server, connection, path, span, JobObject::default(), async move |tx| {
                let report = engine.run_apply(&job, tx).await;
                (report, Box::new(job) as Box<dyn std::any::Any + Send>)
            })
            .await
    }
}
