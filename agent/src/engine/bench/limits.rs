//! What bounds a bench before and while it runs (issue 36): its check as the caller runs
//! before the apply lock is taken, one at a time per user, within
//! [`replicas::CHECK_WITHIN`], and is cancelled when the agent stops or the caller's
//! request is dropped; and a bench may take at most `[bench] max_total_seconds` of
//! agent.toml: one whose least length is longer is refused before any setup, one that
//! reaches it is stopped (its GPU restored). The bench itself is [`super`].

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::bench::control::Logs;
use crate::bench::launch::Launcher;
use crate::bench::measure::Cancel;
use crate::bench::replicas::{self, Launch, ReplicaSpec};
use crate::config::BenchSettings;
use crate::engine::EngineError;
use crate::sys::unix::Identity;

/// The most bench checks that run at once on the agent, all users together (each is one
/// process of its caller's and one blocking thread of the agent's, for seconds at most).
const CHECKS_AT_ONCE: usize = 16;

/// How long a bench may take, and the checks running now.
#[derive(Debug)]
pub struct BenchLimits {
    /// `[bench] max_total_seconds`.
    pub max_total: Duration,
    /// The checks as the caller running now: the caller's uid, the job, its cancel.
    checks: Arc<Mutex<Vec<(u32, String, Cancel)>>>,
}

impl BenchLimits {
    /// The limits agent.toml's `[bench]` sets.
    pub fn new(settings: &BenchSettings) -> Self {
        BenchLimits {
            max_total: Duration::from_secs(settings.max_total_seconds),
            checks: Arc::default(),
        }
    }

    /// Cancels every check running now (the agent stops).
    pub fn cancel_checks(&self) {
        for (_, _, cancel) in self.checks.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            cancel.cancel();
        }
    }

    /// Registers the check of `job` for user `uid`: refused while another check of the
    /// same user runs (one at a time per user, so that a user's stopped or slow checks
    /// cost that user alone), or while [`CHECKS_AT_ONCE`] run. Gone with the guard.
    fn register(&self, uid: u32, job: &str) -> Result<CheckGuard, EngineError> {
        let mut checks = self.checks.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, other, _)) = checks.iter().find(|(u, _, _)| *u == uid) {
            return Err(EngineError::NotPossible(format!(
                "your bench {other} is still being checked (one check at a time per user); try again in a moment"
            )));
        }
        if checks.len() >= CHECKS_AT_ONCE {
            return Err(EngineError::NotPossible(format!(
                "{CHECKS_AT_ONCE} benches are being checked now; try again in a moment"
            )));
        }
        let cancel = Cancel::default();
        checks.push((uid, job.to_string(), cancel.clone()));
        Ok(CheckGuard { checks: Arc::clone(&self.checks), job: job.to_string(), cancel })
    }

    /// Runs one gate in check mode as the caller (`spec`, for user `uid` as `identity`):
    /// the directory, the command and the log directory as the caller sees them; the
    /// refusal is the caller's own view of it. Before the apply lock, within
    /// [`replicas::CHECK_WITHIN`]; cancelled by [`BenchLimits::cancel_checks`] and when
    /// this future is dropped (its caller's request given up), the gate killed either way.
    pub async fn check_as_caller(
        &self,
        launcher: &Arc<Launcher>,
        spec: ReplicaSpec,
        identity: Option<&Identity>,
        (uid, job, label): (u32, &str, &str),
        program: std::path::PathBuf,
        stopping: bool,
    ) -> Result<(), EngineError> {
        let guard = self.register(uid, job)?;
        if stopping {
            return Err(EngineError::NotPossible("the agent is stopping".into()));
        }
        let launcher = Arc::clone(launcher);
        let identity = identity.cloned();
        let label = label.to_string();
        let cancel = guard.cancel.clone();
        let checked = tokio::task::spawn_blocking(move || {
            let launch = Launch {
                launcher: &launcher,
                program: &program,
                identity: identity.as_ref(),
                label: &label,
                runtime_max: replicas::CHECK_WITHIN + Duration::from_secs(60),
                cancel: Some(&cancel),
            };
            replicas::check(&launch, spec)
        })
        .await
        .map_err(|e| {
            EngineError::Internal(format!(
                "the bench's check failed: {}",
                crate::sys::task_failed(&e)
            ))
        })?;
        match checked {
            Ok(()) => Ok(()),
            Err(_) if guard.cancel.is_cancelled() => {
                Err(EngineError::NotPossible("the agent is stopping".into()))
            }
            Err(why) => Err(EngineError::InvalidArgument(why)),
        }
    }
}

/// A check registered in [`BenchLimits`]: cancelled and removed when dropped, which a
/// dropped request does too.
#[derive(Debug)]
struct CheckGuard {
    checks: Arc<Mutex<Vec<(u32, String, Cancel)>>>,
    job: String,
    cancel: Cancel,
}

impl Drop for CheckGuard {
    fn drop(&mut self) {
        // A check that ended has nothing left to cancel; one whose request went stops now.
        self.cancel.cancel();
        self.checks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(_, j, _)| *j != self.job);
    }
}

/// The caller as messages name them: `ada (uid 1000)`, or `uid 1000` for a user the
/// password database does not know.
pub async fn caller_words(uid: u32) -> String {
    let name =
        tokio::task::spawn_blocking(move || crate::sys::unix::user_name(uid)).await.ok().flatten();
    match name {
        Some(name) => format!("{name} (uid {uid})"),
        None => format!("uid {uid}"),
    }
}

/// What the check gate is sent: the command, its environment and directory, and the log
/// directory to check (no CPUs: those are planned later, against the GPU, and each
/// replica's gate checks its own).
pub fn check_spec(
    command: Vec<String>,
    env: Vec<(String, String)>,
    cwd: String,
    logs: Option<String>,
) -> ReplicaSpec {
    ReplicaSpec {
        command,
        env,
        cwd,
        logs: logs.map(|dir| Logs { dir, run: "check".into(), index: 0, cap_bytes: 0 }),
        cpus: None,
    }
}

/// The least a bench of `measurements` measurements takes: each window's length (start-ups,
/// setups and the restore taken as nothing); `None` without a window (`--until-exit`),
/// whose length nothing tells before it runs.
pub fn least_seconds(measurements: usize, window: Option<f64>) -> Option<f64> {
    window.map(|w| w * measurements as f64)
}

/// The refusal of a bench whose least length is over the bound, in one line.
pub fn too_long(least: f64, measurements: usize, window: f64, bound: Duration) -> EngineError {
    EngineError::InvalidArgument(format!(
        "this bench takes at least {} ({measurements} measurements of {} windows), more than the {} a bench may take here ([bench] max_total_seconds in agent.toml); give fewer --replicas, --strategies or --repeat, or a shorter --duration",
        super::rounds::duration_text(least),
        gpushare_proto::bench::seconds_text(window),
        super::rounds::duration_text(bound.as_secs_f64()),
    ))
}

/// Why a running bench is stopped at its bound.
pub fn reached(bound: Duration) -> String {
    format!(
        "stopped at {}, the most a bench may take here ([bench] max_total_seconds in agent.toml)",
        super::rounds::duration_text(bound.as_secs_f64())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bench_longer_than_the_bound_is_said_in_one_line() {
        assert_eq!(least_seconds(14, Some(30.0)), Some(420.0));
        assert_eq!(least_seconds(14, None), None);
        let e = too_long(7200.0, 120, 60.0, Duration::from_secs(3600)).to_string();
        assert_eq!(
            e,
            "this bench takes at least 2h 00m (120 measurements of 60 s windows), more than the 1h 00m a bench may take here ([bench] max_total_seconds in agent.toml); give fewer --replicas, --strategies or --repeat, or a shorter --duration"
        );
        assert_eq!(e.lines().count(), 1);
        assert!(reached(Duration::from_secs(20)).starts_with("stopped at 20 s, the most"));
    }

    #[test]
    fn one_check_at_a_time_per_user_and_a_dropped_one_is_cancelled() {
        let limits = BenchLimits::new(&BenchSettings::default());
        let first = limits.register(1000, "/jobs/1").unwrap();
        let e = limits.register(1000, "/jobs/2").unwrap_err().to_string();
        assert!(e.starts_with("your bench /jobs/1 is still being checked"), "{e}");
        // Dropped (its request given up): cancelled, and the user may check again.
        let cancel = first.cancel.clone();
        drop(first);
        assert!(cancel.is_cancelled());
        let again = limits.register(1000, "/jobs/4").unwrap();
        let other = limits.register(1001, "/jobs/3").unwrap();
        assert!(!again.cancel.is_cancelled() && !other.cancel.is_cancelled());
        // The agent stops: every check is cancelled.
        limits.cancel_checks();
        assert!(again.cancel.is_cancelled() && other.cancel.is_cancelled());
    }
}
