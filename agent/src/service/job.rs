//! Job objects (`io.gpushare.Job1` at `/io/gpushare/Agent1/jobs/<n>`): an apply or probe
//! runs in the background; its progress goes out as signals and its outcome as a property
//! and a `Finished` signal. The last [`JOBS_KEPT`] jobs stay on the bus. A bench's outcome
//! is its caller's: the property and the signal carry its public part, and `GetOutcome`
//! answers the whole to the caller's user and root.

use std::any::Any;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use gpushare_proto::{AgentError, JOB_PATH_PREFIX, JobState};
use tokio::sync::Mutex as AsyncMutex;
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tracing::{Instrument, Span};
use zbus::object_server::SignalEmitter;
use zbus::zvariant::OwnedObjectPath;
use zbus::{Connection, ObjectServer};

use super::errors::error_name;
use super::json;
use crate::apply::Progress;
use crate::engine::{JobReport, report};

/// Job objects kept for late readers; older ones are removed from the bus.
const JOBS_KEPT: usize = 16;

/// The jobs the service has published.
#[derive(Debug)]
pub struct Jobs {
    next: AtomicU64,
    kept: AsyncMutex<VecDeque<OwnedObjectPath>>,
}

impl Default for Jobs {
    fn default() -> Self {
        Jobs { next: AtomicU64::new(1), kept: AsyncMutex::default() }
    }
}

impl Jobs {
    /// The object path of the next job.
    pub fn next_path(&self) -> OwnedObjectPath {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        OwnedObjectPath::try_from(format!("{JOB_PATH_PREFIX}/{number}"))
            .expect("job paths are valid object paths")
    }

    /// Publishes the job object at `path` and runs `work` in the background, forwarding
    /// its progress as signals; `work` returns the report and what must live until the
    /// outcome is reported (the job holding the apply lock). The job's lines, its outcome's
    /// included, are logged inside `span` (the job's fields in the journal).
    pub async fn spawn<F, Fut>(
        &self,
        server: &ObjectServer,
        connection: &Connection,
        path: OwnedObjectPath,
        span: Span,
        object: JobObject,
        work: F,
    ) -> Result<OwnedObjectPath, AgentError>
    where
        F: FnOnce(UnboundedSender<Progress>) -> Fut + Send + 'static,
        Fut: Future<Output = (JobReport, Box<dyn Any + Send>)> + Send,
    {
        server.at(&path, object).await?;
        self.remember(server, path.clone()).await;
        let connection = connection.clone();
        let job_path = path.clone();
        let task = async move {
            let (tx, mut rx) = unbounded_channel::<Progress>();
            let emitter = SignalEmitter::new(&connection, job_path.clone())
                .expect("job paths are valid")
                .into_owned();
            let forward = async {
                while let Some(p) = rx.recv().await {
                    let _ = JobObject::progress(&emitter, p.done, p.total, &p.step).await;
                }
            };
            let ((job_report, keep_until_reported), ()) = tokio::join!(work(tx), forward);
            match &job_report.error {
                None => tracing::info!(
                    job = %job_path.as_str(),
                    what = %job_report.kind.subject(),
                    steps = job_report.steps_done,
                    "job succeeded"
                ),
                // A bench's reasons may quote the caller's command or paths: its caller's.
                Some(e) if job_report.kind.is_private() => tracing::error!(
                    job = %job_path.as_str(),
                    error = %error_name(e),
                    "{} failed (its caller has the reason)",
                    job_report.kind.subject()
                ),
                Some(e) => tracing::error!(job = %job_path.as_str(), "{e}"),
            }
            let outcome =
                report::job_outcome(&job_report, job_report.error.as_ref().map(error_name));
            let public = json(&report::public_outcome(&job_report, &outcome));
            let whole = json(&outcome);
            let server = connection.object_server();
            let mut starter = None;
            if let Ok(iface) = server.interface::<_, JobObject>(&job_path).await {
                let mut job = iface.get_mut().await;
                let state = if outcome.ok { JobState::Succeeded } else { JobState::Failed };
                job.state = state.as_str().into();
                job.outcome = public.clone();
                job.whole_outcome = whole.clone();
                starter = job.starter().filter(|_| job_report.kind.is_private()).map(str::to_owned);
                let _ = job.state_changed(iface.signal_emitter()).await;
                let _ = job.outcome_changed(iface.signal_emitter()).await;
            }
            // A private outcome goes whole to its starter alone (a unicast signal, which the
            // bus delivers to that connection only), before the public one to everyone: the
            // starter reads it even when the agent stops right after (`systemctl stop`).
            if let Some(name) =
                starter.as_deref().and_then(|n| zbus::names::UniqueName::try_from(n).ok())
            {
                let to_starter =
                    emitter.clone().set_destination(zbus::names::BusName::Unique(name));
                let _ = JobObject::finished(&to_starter, &whole).await;
            }
            let _ = JobObject::finished(&emitter, &public).await;
            // Only now may another job start, or the agent stop.
            drop(keep_until_reported);
        };
        tokio::spawn(task.instrument(span));
        Ok(path)
    }

    async fn remember(&self, server: &ObjectServer, path: OwnedObjectPath) {
        let mut kept = self.kept.lock().await;
        kept.push_back(path);
        while kept.len() > JOBS_KEPT {
            if let Some(old) = kept.pop_front() {
                let _ = server.remove::<JobObject, _>(&old).await;
            }
        }
    }
}

pub use object::JobObject;

/// Cancels a bench when the client that started it leaves the bus (Ctrl-C twice, a
/// killed `gpushare-ctl`): nobody would see its outcome, and the GPU should not stay
/// shared the bench's way for the rest of its runs. The task ends when the name goes;
/// abort it when the job ends first.
pub async fn cancel_when_gone(
    connection: &Connection,
    caller: zbus::names::UniqueName<'static>,
    cancel: crate::bench::measure::Cancel,
) -> tokio::task::JoinHandle<()> {
    use futures_util::StreamExt;
    let connection = connection.clone();
    tokio::spawn(async move {
        let Ok(dbus) = zbus::fdo::DBusProxy::new(&connection).await else { return };
        let Ok(mut changes) =
            dbus.receive_name_owner_changed_with_args(&[(0, caller.as_str())]).await
        else {
            return;
        };
        // Gone before the watch began?
        let bus_name = zbus::names::BusName::Unique(caller.clone());
        if !dbus.name_has_owner(bus_name).await.unwrap_or(true) {
            tracing::warn!(caller = %caller, "the bench's client left the bus: cancelling");
            cancel.cancel();
            return;
        }
        while let Some(change) = changes.next().await {
            if change.args().is_ok_and(|a| a.new_owner.is_none()) {
                tracing::warn!(caller = %caller, "the bench's client left the bus: cancelling");
                cancel.cancel();
                return;
            }
        }
    })
}

/// The job objects; the interface macro generates undocumented `*_changed` methods.
#[allow(missing_docs)]
mod object {
    use gpushare_proto::{AgentError, JobState};
    use zbus::message::Header;
    use zbus::{Connection, interface};

    use crate::bench::measure::Cancel;
    use zbus::object_server::SignalEmitter;

    /// An `io.gpushare.Job1` object.
    #[derive(Debug)]
    pub struct JobObject {
        pub state: String,
        /// What everyone may read of the outcome (`Outcome`, `Finished`).
        pub outcome: String,
        /// The whole outcome (`GetOutcome`).
        pub whole_outcome: String,
        /// A bench's cancel, and the unique bus name of the client that started it.
        cancel: Option<(Cancel, String)>,
        /// The user whose job's whole outcome is theirs alone (and root's), if it is.
        owner_uid: Option<u32>,
    }

    impl Default for JobObject {
        fn default() -> Self {
            JobObject {
                state: JobState::Running.as_str().into(),
                outcome: String::new(),
                whole_outcome: String::new(),
                cancel: None,
                owner_uid: None,
            }
        }
    }

    impl JobObject {
        /// The object of a job its starter (`owner`, a unique bus name) or root may cancel,
        /// whose whole outcome is user `uid`'s (and root's).
        pub fn cancellable(cancel: Cancel, owner: String, uid: u32) -> Self {
            JobObject {
                cancel: Some((cancel, owner)),
                owner_uid: Some(uid),
                ..JobObject::default()
            }
        }
    }

    impl JobObject {
        /// The unique bus name of the client that started the job, when it is kept.
        pub fn starter(&self) -> Option<&str> {
            self.cancel.as_ref().map(|(_, owner)| owner.as_str())
        }
    }

    /// The user of the connection that sent `header`'s message.
    async fn sender_uid(header: &Header<'_>, connection: &Connection) -> Option<u32> {
        let sender = header.sender()?;
        let dbus = zbus::fdo::DBusProxy::new(connection).await.ok()?;
        dbus.get_connection_unix_user(zbus::names::BusName::Unique(sender.to_owned())).await.ok()
    }

    #[interface(name = "io.gpushare.Job1")]
    impl JobObject {
        /// Asks a bench to stop early; it restores the sharing, then finishes.
        async fn cancel(
            &self,
            #[zbus(header)] header: Header<'_>,
            #[zbus(connection)] connection: &Connection,
        ) -> Result<(), AgentError> {
            let Some((cancel, owner)) = &self.cancel else {
                return Err(AgentError::Failed(
                    "only a bench can be cancelled; an apply rolls back by itself when it fails"
                        .into(),
                ));
            };
            let sender = header.sender().map(ToString::to_string).unwrap_or_default();
            if &sender != owner && sender_uid(&header, connection).await != Some(0) {
                return Err(AgentError::AccessDenied(
                    "Cancel: only the client that started the bench, or root, may cancel it".into(),
                ));
            }
            if self.state == JobState::Running.as_str() {
                tracing::warn!(caller = %sender, "bench cancelled by its client");
                cancel.cancel();
            }
            Ok(())
        }

        /// `running`, `succeeded` or `failed`.
        #[zbus(property)]
        async fn state(&self) -> String {
            self.state.clone()
        }

        /// The JSON `JobOutcome` everyone may read (a bench's public part); empty while
        /// running.
        #[zbus(property)]
        async fn outcome(&self) -> String {
            self.outcome.clone()
        }

        /// The whole JSON `JobOutcome`: a bench's to its caller's user and root only.
        async fn get_outcome(
            &self,
            #[zbus(header)] header: Header<'_>,
            #[zbus(connection)] connection: &Connection,
        ) -> Result<String, AgentError> {
            if let Some(owner) = self.owner_uid {
                let uid = sender_uid(&header, connection).await;
                if uid != Some(owner) && uid != Some(0) {
                    return Err(AgentError::AccessDenied(
                        "GetOutcome: a bench's outcome is its caller's and root's alone".into(),
                    ));
                }
            }
            Ok(self.whole_outcome.clone())
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
