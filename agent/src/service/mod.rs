//! The D-Bus transport: the agent's connection and name ([`serve`]), the door every call
//! enters by ([`door`], counted and scheduled by [`admission`]), calls read into typed
//! [`Call`]s ([`calls`]), and here the one place each call is carried out: the access
//! policy where a call changes the GPUs, the [`Engine`], and the answer as JSON (or its
//! error as a D-Bus error: [`errors`]). Applies, probes and benches become job objects
//! ([`job`]); introspection is rendered from the interface tables ([`introspect`]).

mod admission;
mod calls;
mod departures;
mod door;
mod errors;
mod introspect;
mod job;
mod options;
mod shared;

use std::collections::HashMap;
use std::sync::Arc;

use gpushare_proto::{BUS_NAME, OBJECT_PATH};
use serde::Serialize;
use zbus::Connection;
use zbus::message::Header;
use zbus::zvariant::{OwnedObjectPath, Value};

use crate::access::AccessPolicy;
use crate::engine::{Caller, Engine, ProfileRef};
use crate::sys::log;
use calls::{AGENT1, Call, JOB1, Object};
use errors::{Failure, access_denied};
use job::{Jobs, Ownership};

fn json(value: &impl Serialize) -> String {
    serde_json::to_string(value).expect("protocol documents serialize")
}

/// What a call answers.
enum Answer {
    /// A JSON document (`s`).
    Json(String),
    /// Any other string (`s`): introspection data, the machine id.
    Text(String),
    /// A job object's path (`o`).
    Path(OwnedObjectPath),
    /// Nothing.
    Unit,
    /// A property's value (`v`).
    Value(Value<'static>),
    /// An interface's properties (`a{sv}`).
    Properties(HashMap<String, Value<'static>>),
}

impl Answer {
    async fn send(self, connection: &Connection, call: &Header<'_>) -> zbus::Result<()> {
        match self {
            Answer::Json(s) | Answer::Text(s) => connection.reply(call, &s).await,
            Answer::Path(path) => connection.reply(call, &path).await,
            Answer::Unit => connection.reply(call, &()).await,
            Answer::Value(value) => connection.reply(call, &value).await,
            Answer::Properties(all) => connection.reply(call, &all).await,
        }
    }
}

/// The agent's calls, carried out.
pub struct Service {
    engine: Arc<Engine>,
    access: AccessPolicy,
    jobs: Jobs,
    connection: Connection,
    machine_id: Option<String>,
    /// Callers that leave the bus (told by the door).
    departures: Arc<departures::Departures>,
    /// `Status`, `Telemetry` and each user's `Clients` in progress, joined by callers
    /// asking meanwhile.
    status: shared::Coalesced<(), String>,
    telemetry: shared::Coalesced<(), String>,
    clients: shared::Coalesced<(u32, Option<Vec<u32>>), String>,
}

/// Connects to `bus` (`system`, `session` or an address), opens the door for calls to
/// `engine`, then owns the agent's name. One agent per bus: the name is neither taken from
/// another owner nor given up to one, and no one queues for it.
pub async fn serve(
    bus: &str,
    engine: Arc<Engine>,
    access: AccessPolicy,
) -> Result<Connection, String> {
    let builder = match bus {
        "system" => zbus::connection::Builder::system(),
        "session" => zbus::connection::Builder::session(),
        address => zbus::connection::Builder::address(address),
    }
    .map_err(|e| format!("bus {bus}: {e}"))?;
    let connection = builder
        // The agent's own calls on it (asking the bus whose a call is) end rather than
        // hold a lookup for ever when the bus drops their answer (its queue to us full).
        .method_timeout(std::time::Duration::from_secs(5))
        .build()
        .await
        .map_err(|e| format!("cannot connect to the {bus} bus: {e}"))?;
    let service = Arc::new(Service {
        engine,
        access,
        jobs: Jobs::default(),
        connection: connection.clone(),
        machine_id: machine_id(),
        departures: Arc::default(),
        status: Default::default(),
        telemetry: Default::default(),
        clients: Default::default(),
    });
    door::open(&connection, service).await.map_err(|e| format!("bus {bus}: {e}"))?;
    use zbus::fdo::{RequestNameFlags, RequestNameReply};
    let dbus =
        zbus::fdo::DBusProxy::new(&connection).await.map_err(|e| format!("bus {bus}: {e}"))?;
    let name = zbus::names::WellKnownName::from_static_str(BUS_NAME).expect("a valid name");
    match dbus.request_name(name, RequestNameFlags::DoNotQueue.into()).await {
        Ok(RequestNameReply::PrimaryOwner | RequestNameReply::AlreadyOwner) => Ok(connection),
        Ok(_) => Err(format!(
            "{BUS_NAME} is already owned on the {bus} bus: is another gpushare-agent running?"
        )),
        Err(e) => Err(format!("cannot own {BUS_NAME} on the {bus} bus: {e}")),
    }
}

/// The host's D-Bus machine id (`Peer.GetMachineId`).
fn machine_id() -> Option<String> {
    ["/etc/machine-id", "/var/lib/dbus/machine-id"].iter().find_map(|p| {
        let id = std::fs::read_to_string(p).ok()?;
        let id = id.trim();
        (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_owned())
    })
}

impl Service {
    /// Carries out `call` of connection `sender`, whose user and groups are `caller`'s.
    async fn handle(&self, call: Call, caller: &Caller, sender: &str) -> Result<Answer, Failure> {
        if call.changes() {
            self.authorize(caller, sender, call.method())?;
        }
        let engine = &self.engine;
        Ok(match call {
            Call::Status => {
                let engine = Arc::clone(engine);
                let work = || async move { Ok(json(&engine.status().await?)) };
                Answer::Json(self.status.join((), self.engine.epoch(), work).await?)
            }
            Call::Plan { profile } => self.plan(ProfileRef::Named(&profile)).await?,
            Call::PlanDocument { text, origin, config } => {
                self.plan(ProfileRef::Document { text: &text, origin: &origin, config: &config })
                    .await?
            }
            Call::Apply { profile, options } => {
                self.apply(ProfileRef::Named(&profile), options).await?
            }
            Call::ApplyDocument { text, origin, config, options } => {
                let document =
                    ProfileRef::Document { text: &text, origin: &origin, config: &config };
                self.apply(document, options).await?
            }
            Call::Export => Answer::Json(json(&engine.export().await?)),
            Call::Probe { options } => self.probe(options).await?,
            Call::Bench { options } => self.bench(*options, caller, sender).await?,
            Call::ResetGpu { gpu } => self.reset_gpu(gpu).await?,
            Call::MpsStatus => Answer::Json(json(&engine.mps_status().await?)),
            Call::MpsLimit { pid, threads, memory_bytes } => {
                let threads = (threads != 0).then_some(threads);
                let memory = (memory_bytes != 0).then_some(memory_bytes);
                let set = engine.mps_limit_as(Some(caller.uid), pid, threads, memory).await?;
                Answer::Json(json(&set))
            }
            Call::Env { target } => Answer::Json(json(&engine.client_env(&target).await?)),
            Call::MigProfiles { gpu } => Answer::Json(json(&engine.mig_profiles(&gpu).await?)),
            Call::CdiDevices => Answer::Json(json(&engine.cdi_devices())),
            Call::Clients => {
                // What a caller may see depends on who they are (their groups too: hidepid's
                // `gid=`), so callers share an answer only with the same user and groups.
                let (engine, who) = (Arc::clone(engine), caller.clone());
                let key = (caller.uid, caller.groups.clone());
                let work = || async move { Ok(json(&engine.clients(&who).await?)) };
                Answer::Json(self.clients.join(key, self.engine.epoch(), work).await?)
            }
            Call::Telemetry => {
                let engine = Arc::clone(engine);
                let work = || async move { Ok(json(&engine.telemetry().await?)) };
                Answer::Json(self.telemetry.join((), self.engine.epoch(), work).await?)
            }
            Call::ListProfiles => Answer::Json(json(&engine.list_profiles())),
            Call::ShowProfile { name } => Answer::Json(json(&engine.show_profile(&name)?)),
            Call::ValidateProfile { text, origin } => {
                Answer::Json(json(&engine.validate(&text, &origin).await?))
            }
            Call::Cancel { job } => {
                self.job(job)?.cancel(sender, caller)?;
                Answer::Unit
            }
            Call::GetOutcome { job } => Answer::Json(self.job(job)?.get_outcome(caller)?),
            Call::Introspect { object } => {
                let xml = introspect::xml(object, &self.jobs.numbers());
                Answer::Text(xml.ok_or_else(|| no_object(object))?)
            }
            Call::Get { object, interface, property } => {
                let mut all = self.properties(object, &interface)?;
                Answer::Value(all.remove(&property).ok_or_else(|| {
                    Failure::fdo(zbus::fdo::Error::UnknownProperty(format!(
                        "no property {property} on {interface}"
                    )))
                })?)
            }
            Call::GetAll { object, interface } => {
                Answer::Properties(self.properties(object, &interface)?)
            }
            Call::Ping => Answer::Unit,
            Call::GetMachineId => Answer::Text(self.machine_id.clone().ok_or_else(|| {
                Failure::fdo(zbus::fdo::Error::Failed("this host has no machine id".into()))
            })?),
        })
    }

    /// Refuses a call that changes the GPUs from a caller the access policy does not allow,
    /// whatever the bus policy let through; the refusal is logged.
    fn authorize(&self, caller: &Caller, sender: &str, method: &str) -> Result<(), Failure> {
        let groups = caller.groups.as_deref().unwrap_or_default();
        self.access.may_change(Some(caller.uid), groups).map_err(|why| {
            tracing::warn!(method, caller = %sender, uid = caller.uid, "refused: {why}");
            Failure::agent(access_denied(method, why))
        })
    }

    fn job(&self, number: u64) -> Result<Arc<job::Job>, Failure> {
        self.jobs.get(number).ok_or_else(|| no_object(Object::Job(number)))
    }

    /// The properties of `interface` on `object`.
    fn properties(
        &self,
        object: Object,
        interface: &str,
    ) -> Result<HashMap<String, Value<'static>>, Failure> {
        match (object, interface) {
            (Object::Agent, AGENT1) => Ok(HashMap::from([(
                "Version".to_string(),
                Value::from(env!("CARGO_PKG_VERSION").to_string()),
            )])),
            (Object::Job(n), JOB1) => Ok(self.job(n)?.properties()),
            (Object::Job(n), _) if self.jobs.get(n).is_none() => Err(no_object(object)),
            _ => Err(Failure::fdo(zbus::fdo::Error::UnknownInterface(format!(
                "no interface {interface} here"
            )))),
        }
    }

    async fn plan(&self, profile: ProfileRef<'_>) -> Result<Answer, Failure> {
        Ok(Answer::Json(json(&self.engine.plan(profile).await?.report())))
    }

    async fn apply(
        &self,
        profile: ProfileRef<'_>,
        options: options::ApplyOptions,
    ) -> Result<Answer, Failure> {
        let number = self.jobs.next_number();
        let path = job::path_of(number);
        let job = self.engine.begin_apply(profile, options.force, path.as_str()).await?;
        let profile = &job.plan().profile;
        tracing::info!(job = %path.as_str(), profile = %profile, steps = job.plan().step_count(), "apply started");
        let span = log::apply_span(path.as_str(), profile);
        let engine = Arc::clone(&self.engine);
        Ok(self.spawn(number, span, Ownership::default(), async move |tx| {
            let report = engine.run_apply(&job, tx).await;
            (report, Box::new(job) as Box<dyn std::any::Any + Send>)
        }))
    }

    /// Starts the reset of an unhealthy GPU (issue 42), checked before the job begins.
    async fn reset_gpu(&self, gpu: u32) -> Result<Answer, Failure> {
        let number = self.jobs.next_number();
        let path = job::path_of(number);
        let job = self.engine.begin_gpu_reset(gpu, path.as_str()).await?;
        tracing::info!(job = %path.as_str(), gpu, "GPU reset started");
        let span = log::job_span(path.as_str());
        let engine = Arc::clone(&self.engine);
        Ok(self.spawn(number, span, Ownership::default(), async move |tx| {
            let report = engine.run_gpu_reset(job, tx).await;
            (report, Box::new(()) as Box<dyn std::any::Any + Send>)
        }))
    }

    async fn probe(&self, options: crate::engine::ProbeOptions) -> Result<Answer, Failure> {
        let number = self.jobs.next_number();
        let path = job::path_of(number);
        let job = self.engine.begin_probe(options, path.as_str()).await?;
        let engine = Arc::clone(&self.engine);
        let span = log::job_span(path.as_str());
        Ok(self.spawn(number, span, Ownership::default(), async move |tx| {
            let report = engine.run_probe(&job, tx).await;
            (report, Box::new(job) as Box<dyn std::any::Any + Send>)
        }))
    }

    /// Starts a bench of `command` (run as the caller); it is cancelled when its caller
    /// leaves the bus (Ctrl-C, a killed client).
    async fn bench(
        &self,
        options: crate::engine::BenchOptions,
        caller: &Caller,
        sender: &str,
    ) -> Result<Answer, Failure> {
        let Ok(starter) = zbus::names::UniqueName::try_from(sender.to_owned()) else {
            return Err(Failure::agent(access_denied("Bench", "the caller is unknown")));
        };
        let number = self.jobs.next_number();
        let path = job::path_of(number);
        // A caller that leaves while its bench is checked (as the caller, before any lock)
        // ends the check: dropping it kills the check's gate.
        let leaving = self.departures.watch(starter.as_str());
        let job = tokio::select! {
            job = self.engine.begin_bench(options, caller.clone(), path.as_str()) => job?,
            _ = leaving => {
                tracing::warn!(caller = %sender, "the bench's client left the bus while it was checked");
                return Err(Failure::agent(gpushare_proto::AgentError::Failed(
                    "the caller left the bus before the bench began".into(),
                )));
            }
        };
        tracing::info!(job = %path.as_str(), uid = caller.uid, "bench started");
        let cancel = job.canceller();
        let watcher =
            job::cancel_when_gone(self.departures.watch(starter.as_str()), starter, cancel.clone());
        let ownership = Ownership::cancellable(cancel, sender.to_owned(), caller.uid);
        let engine = Arc::clone(&self.engine);
        let span = log::job_span(path.as_str());
        Ok(self.spawn(number, span, ownership, async move |tx| {
            let report = engine.run_bench(&job, tx).await;
            watcher.abort();
            (report, Box::new(job) as Box<dyn std::any::Any + Send>)
        }))
    }

    /// Publishes job `number` running `work` (see [`Jobs::spawn`]); its path is the answer.
    fn spawn<F, Fut>(
        &self,
        number: u64,
        span: tracing::Span,
        ownership: Ownership,
        work: F,
    ) -> Answer
    where
        F: FnOnce(tokio::sync::mpsc::UnboundedSender<crate::apply::Progress>) -> Fut
            + Send
            + 'static,
        Fut: std::future::Future<Output = (crate::engine::JobReport, Box<dyn std::any::Any + Send>)>
            + Send,
    {
        Answer::Path(self.jobs.spawn(&self.connection, number, span, ownership, work))
    }
}

fn no_object(object: Object) -> Failure {
    let what = match object {
        Object::Job(n) => format!("no job {n} (the agent keeps its last 16 jobs)"),
        _ => format!("no such object under {OBJECT_PATH}"),
    };
    Failure::fdo(zbus::fdo::Error::UnknownObject(what))
}
