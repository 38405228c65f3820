//! `gpushare-ctl cancel JOB`: asks the agent to stop a running bench early
//! (`io.gpushare.Job1.Cancel`): its replicas are stopped and its GPU restored before it
//! ends. Root may cancel anyone's bench, a user their own (the agent checks the caller:
//! root, or the user who started the bench); an apply cannot be cancelled, and the agent
//! says so. JOB is the job's object path
//! as `status` shows it (`/io/gpushare/Agent1/jobs/3`) or its number (`3`). ctl then waits
//! for the job to end (up to [`WAIT_FOR_END`]) and prints how it ended: with `--json` the
//! [`Cancelled`] document.

use std::time::{Duration, Instant};

use gpushare_proto::types::JobOutcome;
use gpushare_proto::{AgentError, JOB_PATH_PREFIX, JobProxy, JobState};
use serde::Serialize;
use zbus::proxy::CacheProperties;

use super::ExitStatus;
use crate::bus::{Agent, Client};
use crate::error::{self, CtlError, Kind};
use crate::output::Output;

/// How long ctl waits for a cancelled job to end (a bench stops its replicas within
/// seconds, then restores its GPU).
const WAIT_FOR_END: Duration = Duration::from_secs(120);
/// How often ctl looks at the job's state meanwhile.
const LOOK: Duration = Duration::from_millis(100);
/// The error the bus gives for a path no object has.
const DBUS_UNKNOWN_OBJECT: &str = "org.freedesktop.DBus.Error.UnknownObject";

/// What `cancel --json` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cancelled {
    /// The job's object path.
    pub job: String,
    /// Its state once ctl stopped waiting: `failed` (cancelled), `succeeded` (it ended
    /// before the cancel reached it), or `running` (still stopping after the wait).
    pub state: String,
    /// Whether the job was still running when the cancel came.
    pub was_running: bool,
    /// How it ended, in one line (its error), when it has and ctl may read it.
    pub ended: Option<String>,
}

/// The object path JOB names: a path under [`JOB_PATH_PREFIX`] or a job's number.
pub fn job_path(job: &str) -> Result<String, CtlError> {
    let job = job.trim();
    let number = job.strip_prefix(JOB_PATH_PREFIX).and_then(|n| n.strip_prefix('/')).unwrap_or(job);
    if !number.is_empty() && number.len() <= 20 && number.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(format!("{JOB_PATH_PREFIX}/{number}"));
    }
    Err(CtlError::ctl(
        Kind::Usage,
        format!(
            "JOB `{}`: give a job's path ({JOB_PATH_PREFIX}/3, as `gpushare-ctl status` shows it) or its number (3)",
            gpushare_proto::byte_prefix(job, 80)
        ),
    )
    .with_exit_code(2))
}

/// Runs `cancel`.
pub async fn run(client: &mut Client, out: &Output, job: &str) -> Result<ExitStatus, CtlError> {
    let path = job_path(job)?;
    let asked = client
        .call("Cancel", async |a| {
            let proxy = job_proxy(a, &path).await?;
            let before = match proxy.state().await {
                Ok(state) => state,
                Err(e) => return gone_or(e.into(), &path),
            };
            match proxy.cancel().await {
                Ok(()) => Ok(Ok(before == JobState::Running.as_str())),
                Err(e) => gone_or(e, &path),
            }
        })
        .await?;
    let was_running = asked?;
    let state = wait_for_end(client, &path).await?;
    let ended = if state == JobState::Running.as_str() { None } else { ended(client, &path).await };
    let done = Cancelled { job: path, state, was_running, ended };
    if out.json {
        let json = serde_json::to_string(&done).map_err(|e| {
            CtlError::ctl(Kind::Failed, format!("cannot write the cancel document: {e}"))
        })?;
        out.print(&json);
    } else {
        out.print(&render(&done));
    }
    Ok(0)
}

/// The job's proxy on `a`'s connection.
async fn job_proxy(a: &Agent, path: &str) -> Result<JobProxy<'static>, AgentError> {
    Ok(JobProxy::builder(&a.conn)
        .path(path.to_string())?
        .cache_properties(CacheProperties::No)
        .build()
        .await?)
}

/// A job the agent no longer has (it ended long ago, or never was) is ctl's own one-line
/// error; anything else goes back to the caller of [`Client::call`] to explain.
fn gone_or<T>(e: AgentError, path: &str) -> Result<Result<T, CtlError>, AgentError> {
    if error::agent_error_name(&e).as_deref() == Some(DBUS_UNKNOWN_OBJECT) {
        return Ok(Err(CtlError::ctl(
            Kind::Failed,
            format!(
                "no job {path} on the agent (it ended a while ago, or never was); `gpushare-ctl status` names the running ones"
            ),
        )));
    }
    Err(e)
}

/// Waits until the job is no longer running, or [`WAIT_FOR_END`] passed; its state then.
async fn wait_for_end(client: &mut Client, path: &str) -> Result<String, CtlError> {
    let until = Instant::now() + WAIT_FOR_END;
    loop {
        let state = client
            .call("Cancel", async |a| job_proxy(a, path).await?.state().await.map_err(Into::into))
            .await?;
        if state != JobState::Running.as_str() || Instant::now() >= until {
            return Ok(state);
        }
        tokio::time::sleep(LOOK).await;
    }
}

/// How the job ended, in one line, when ctl may read it (a bench's whole outcome is its
/// caller's and root's; the public one says only that it failed).
async fn ended(client: &mut Client, path: &str) -> Option<String> {
    let raw = client
        .call("Cancel", async |a| {
            let proxy = job_proxy(a, path).await?;
            match proxy.get_outcome().await {
                Ok(whole) => Ok(whole),
                Err(_) => proxy.outcome().await.map_err(Into::into),
            }
        })
        .await
        .ok()?;
    let outcome: JobOutcome = serde_json::from_str(&raw).ok()?;
    Some(match outcome.error {
        Some(error) => error,
        None if outcome.ok => "it finished before the cancel reached it".into(),
        None => "it failed".into(),
    })
}

/// The result for people, one line.
pub fn render(done: &Cancelled) -> String {
    match (done.was_running, done.state.as_str(), &done.ended) {
        (false, _, Some(how)) => format!("{} had already ended: {how}", done.job),
        (false, state, None) => format!("{} had already ended ({state})", done.job),
        (true, "running", _) => format!(
            "Asked {} to stop; it is still stopping after {} s (`gpushare-ctl status` shows when it has)",
            done.job,
            WAIT_FOR_END.as_secs()
        ),
        (true, _, Some(how)) => format!("Cancelled {}: {how}", done.job),
        (true, state, None) => format!("Cancelled {} ({state})", done.job),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_named_by_its_path_or_its_number() {
        assert_eq!(job_path("3").unwrap(), "/io/gpushare/Agent1/jobs/3");
        assert_eq!(job_path("/io/gpushare/Agent1/jobs/12").unwrap(), "/io/gpushare/Agent1/jobs/12");
        for bad in ["", "x", "/io/gpushare/Agent1/jobs/", "/io/gpushare/Agent1/jobs/3/4", "-1"] {
            let e = job_path(bad).unwrap_err();
            assert!(e.is(Kind::Usage), "{bad}: {e:?}");
            assert!(e.message.contains("give a job's path"), "{}", e.message);
            assert_eq!(e.exit_code, 2);
        }
    }

    #[test]
    fn the_result_reads_as_one_line() {
        let done = Cancelled {
            job: "/io/gpushare/Agent1/jobs/3".into(),
            state: "failed".into(),
            was_running: true,
            ended: Some("bench on GPU-1: cancelled; the sharing was restored".into()),
        };
        assert_eq!(
            render(&done),
            "Cancelled /io/gpushare/Agent1/jobs/3: bench on GPU-1: cancelled; the sharing was restored"
        );
        let late = Cancelled { was_running: false, ended: None, state: "succeeded".into(), ..done };
        assert_eq!(render(&late), "/io/gpushare/Agent1/jobs/3 had already ended (succeeded)");
    }
}
