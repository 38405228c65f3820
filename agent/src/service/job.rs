//! Job objects (`io.gpushare.Job1` at `/io/gpushare/Agent1/jobs/<n>`): an apply or probe
//! runs in the background; its progress goes out as signals and its outcome as a property
//! and a `Finished` signal. The last [`JOBS_KEPT`] jobs stay on the bus.

use std::any::Any;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use gpushare_proto::{AgentError, JOB_PATH_PREFIX, JobState};
use tokio::sync::Mutex as AsyncMutex;
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
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
    /// outcome is reported (the job holding the apply lock).
    pub async fn spawn<F, Fut>(
        &self,
        server: &ObjectServer,
        connection: &Connection,
        path: OwnedObjectPath,
        work: F,
    ) -> Result<OwnedObjectPath, AgentError>
    where
        F: FnOnce(UnboundedSender<Progress>) -> Fut + Send + 'static,
        Fut: Future<Output = (JobReport, Box<dyn Any + Send>)> + Send,
    {
        server.at(&path, JobObject::default()).await?;
        self.remember(server, path.clone()).await;
        let connection = connection.clone();
        let job_path = path.clone();
        tokio::spawn(async move {
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
                Some(e) => tracing::error!(job = %job_path.as_str(), "{e}"),
            }
            let outcome =
                report::job_outcome(&job_report, job_report.error.as_ref().map(error_name));
            let text = json(&outcome);
            let server = connection.object_server();
            if let Ok(iface) = server.interface::<_, JobObject>(&job_path).await {
                let mut job = iface.get_mut().await;
                let state = if outcome.ok { JobState::Succeeded } else { JobState::Failed };
                job.state = state.as_str().into();
                job.outcome = text.clone();
                let _ = job.state_changed(iface.signal_emitter()).await;
                let _ = job.outcome_changed(iface.signal_emitter()).await;
            }
            let _ = JobObject::finished(&emitter, &text).await;
            // Only now may another job start, or the agent stop.
            drop(keep_until_reported);
        });
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

/// The job objects; the interface macro generates undocumented `*_changed` methods.
#[allow(missing_docs)]
mod object {
    use gpushare_proto::JobState;
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
            JobObject { state: JobState::Running.as_str().into(), outcome: String::new() }
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
