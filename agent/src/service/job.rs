//! Job objects (`io.gpushare.Job1` at `/io/gpushare/Agent1/jobs/<n>`): an apply, probe or
//! bench runs in the background; its progress goes out as signals and its outcome as the
//! properties `State` and `Outcome` and a `Finished` signal. The last [`JOBS_KEPT`] jobs
//! stay on the bus (the table below is what the door answers for them). A bench's outcome
//! is its caller's: the property and the broadcast signal carry its public part, and
//! `GetOutcome` answers the whole to the caller's user and root.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use gpushare_proto::{AgentError, JOB_PATH_PREFIX, JobState};
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tracing::{Instrument, Span};
use zbus::Connection;
use zbus::zvariant::{OwnedObjectPath, Value};

use super::calls::JOB1;
use super::errors::error_name;
use super::json;
use crate::apply::Progress;
use crate::bench::measure::Cancel;
use crate::engine::{Caller, JobReport, report};

/// Job objects kept for late readers; older ones are removed from the bus.
const JOBS_KEPT: usize = 16;

/// One job object.
#[derive(Debug)]
pub struct Job {
    number: u64,
    fields: Mutex<Fields>,
}

#[derive(Debug)]
struct Fields {
    state: JobState,
    /// What everyone may read of the outcome (`Outcome`, `Finished`).
    outcome: String,
    /// The whole outcome (`GetOutcome`).
    whole_outcome: String,
    /// A bench's cancel, and the unique bus name of the client that started it.
    cancel: Option<(Cancel, String)>,
    /// The user whose job's whole outcome is theirs alone (and root's), if it is.
    owner_uid: Option<u32>,
}

/// How a job may be cancelled and whose its outcome is: a bench's (cancellable by its
/// starter or root, its whole outcome its caller's), or anything else's.
#[derive(Debug, Default)]
pub struct Ownership {
    cancel: Option<(Cancel, String)>,
    owner_uid: Option<u32>,
}

impl Ownership {
    /// A job its starter (`owner`, a unique bus name) or root may cancel, whose whole
    /// outcome is user `uid`'s (and root's).
    pub fn cancellable(cancel: Cancel, owner: String, uid: u32) -> Self {
        Ownership { cancel: Some((cancel, owner)), owner_uid: Some(uid) }
    }
}

impl Job {
    fn fields(&self) -> std::sync::MutexGuard<'_, Fields> {
        self.fields.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The properties of `io.gpushare.Job1`.
    pub fn properties(&self) -> HashMap<String, Value<'static>> {
        let f = self.fields();
        HashMap::from([
            ("State".to_string(), Value::from(f.state.as_str().to_string())),
            ("Outcome".to_string(), Value::from(f.outcome.clone())),
        ])
    }

    /// `Cancel`, asked by connection `sender` of `caller`.
    pub fn cancel(&self, sender: &str, caller: &Caller) -> Result<(), AgentError> {
        let f = self.fields();
        let Some((cancel, owner)) = &f.cancel else {
            return Err(AgentError::Failed(
                "only a bench can be cancelled; an apply rolls back by itself when it fails".into(),
            ));
        };
        // The starter's connection, another of the same user's (a second terminal), root.
        if sender != owner && caller.uid != 0 && Some(caller.uid) != f.owner_uid {
            return Err(AgentError::AccessDenied(
                "Cancel: only the user who started the bench, or root, may cancel it".into(),
            ));
        }
        if f.state == JobState::Running {
            tracing::warn!(caller = %sender, uid = caller.uid, "bench cancelled");
            cancel.cancel();
        }
        Ok(())
    }

    /// `GetOutcome`, asked by `caller`.
    pub fn get_outcome(&self, caller: &Caller) -> Result<String, AgentError> {
        let f = self.fields();
        if let Some(owner) = f.owner_uid
            && caller.uid != owner
            && caller.uid != 0
        {
            return Err(AgentError::AccessDenied(
                "GetOutcome: a bench's outcome is its caller's and root's alone".into(),
            ));
        }
        Ok(f.whole_outcome.clone())
    }
}

/// The jobs the service has published.
#[derive(Debug)]
pub struct Jobs {
    next: AtomicU64,
    kept: Mutex<VecDeque<Arc<Job>>>,
}

impl Default for Jobs {
    fn default() -> Self {
        Jobs { next: AtomicU64::new(1), kept: Mutex::default() }
    }
}

/// The object path of job `number`.
pub fn path_of(number: u64) -> OwnedObjectPath {
    OwnedObjectPath::try_from(format!("{JOB_PATH_PREFIX}/{number}"))
        .expect("job paths are valid object paths")
}

impl Jobs {
    /// The number of the next job (its path is [`path_of`] it).
    pub fn next_number(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Job `number`, while it is kept.
    pub fn get(&self, number: u64) -> Option<Arc<Job>> {
        self.kept().iter().find(|j| j.number == number).cloned()
    }

    /// The numbers of the jobs kept, oldest first.
    pub fn numbers(&self) -> Vec<u64> {
        self.kept().iter().map(|j| j.number).collect()
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, VecDeque<Arc<Job>>> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Publishes job `number` and runs `work` in the background, forwarding its progress
    /// as signals; `work` returns the report and what must live until the outcome is
    /// reported (the job holding the apply lock). The job's lines, its outcome's included,
    /// are logged inside `span` (the job's fields in the journal).
    pub fn spawn<F, Fut>(
        &self,
        connection: &Connection,
        number: u64,
        span: Span,
        ownership: Ownership,
        work: F,
    ) -> OwnedObjectPath
    where
        F: FnOnce(UnboundedSender<Progress>) -> Fut + Send + 'static,
        Fut: Future<Output = (JobReport, Box<dyn Any + Send>)> + Send,
    {
        let job = Arc::new(Job {
            number,
            fields: Mutex::new(Fields {
                state: JobState::Running,
                outcome: String::new(),
                whole_outcome: String::new(),
                cancel: ownership.cancel,
                owner_uid: ownership.owner_uid,
            }),
        });
        {
            let mut kept = self.kept();
            kept.push_back(Arc::clone(&job));
            while kept.len() > JOBS_KEPT {
                kept.pop_front();
            }
        }
        let path = path_of(number);
        let connection = connection.clone();
        let job_path = path.clone();
        let task = async move {
            let (tx, mut rx) = unbounded_channel::<Progress>();
            let forward = async {
                while let Some(p) = rx.recv().await {
                    let body = (p.done, p.total, p.step.as_str());
                    let _ = signal(&connection, None, &job_path, JOB1, "Progress", &body).await;
                }
            };
            let ((job_report, keep_until_reported), ()) = tokio::join!(work(tx), forward);
            log_end(&job_path, &job_report);
            let outcome =
                report::job_outcome(&job_report, job_report.error.as_ref().map(error_name));
            let public = json(&report::public_outcome(&job_report, &outcome));
            let whole = json(&outcome);
            let starter = {
                let mut f = job.fields();
                f.state = if outcome.ok { JobState::Succeeded } else { JobState::Failed };
                f.outcome = public.clone();
                f.whole_outcome = whole.clone();
                f.cancel
                    .as_ref()
                    .filter(|_| job_report.kind.is_private())
                    .map(|(_, starter)| starter.clone())
            };
            let changed = job.properties();
            let none: Vec<&str> = Vec::new();
            let _ = signal(
                &connection,
                None,
                &job_path,
                "org.freedesktop.DBus.Properties",
                "PropertiesChanged",
                &(JOB1, changed, none),
            )
            .await;
            // A private outcome goes whole to its starter alone (a unicast signal, which the
            // bus delivers to that connection only), before the public one to everyone: the
            // starter reads it even when the agent stops right after (`systemctl stop`).
            if let Some(name) = starter {
                let _ =
                    signal(&connection, Some(&name), &job_path, JOB1, "Finished", &(&whole,)).await;
            }
            let _ = signal(&connection, None, &job_path, JOB1, "Finished", &(&public,)).await;
            // Only now may another job start, or the agent stop.
            drop(keep_until_reported);
        };
        tokio::spawn(task.instrument(span));
        path
    }
}

/// Emits a signal of the job at `path` (to `destination` alone when given).
async fn signal<B>(
    connection: &Connection,
    destination: Option<&str>,
    path: &OwnedObjectPath,
    interface: &str,
    name: &str,
    body: &B,
) -> zbus::Result<()>
where
    B: serde::Serialize + zbus::zvariant::DynamicType,
{
    connection.emit_signal(destination, path.as_str(), interface, name, body).await
}

/// The job's end in the agent's log.
fn log_end(path: &OwnedObjectPath, report: &JobReport) {
    match &report.error {
        None => tracing::info!(
            job = %path.as_str(),
            what = %report.kind.subject(),
            steps = report.steps_done,
            "job succeeded"
        ),
        // A bench's reasons may quote the caller's command or paths: its caller's.
        Some(e) if report.kind.is_private() => tracing::error!(
            job = %path.as_str(),
            error = %error_name(e),
            "{} failed (its caller has the reason)",
            report.kind.subject()
        ),
        Some(e) => tracing::error!(job = %path.as_str(), "{e}"),
    }
}

/// Cancels a bench when the client that started it leaves the bus (Ctrl-C twice, a
/// killed `gpushare-ctl`): nobody would see its outcome, and the GPU should not stay
/// shared the bench's way for the rest of its runs. `leaving` is the door's watch of that
/// client; abort the task when the job ends first.
pub fn cancel_when_gone(
    leaving: tokio::sync::oneshot::Receiver<()>,
    caller: zbus::names::UniqueName<'static>,
    cancel: Cancel,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if leaving.await.is_ok() {
            tracing::warn!(caller = %caller, "the bench's client left the bus: cancelling");
            cancel.cancel();
        }
    })
}
