//! `gpushare-ctl apply PROFILE | -f FILE [-c NAME] [--dry-run] [--force]`: starts an apply
//! job (`Apply` for a name, `ApplyDocument` for a file) and follows it.
//!
//! Both calls start the same kind of job and share [`run_job`], which follows it with
//! [`crate::job::start_and_follow`] (as `probe` does); the result is one line on stdout:
//!
//! ```text
//! Applied half-balanced: 24 steps in 0.41 s
//! half-balanced is already applied: nothing changed
//! ```

use std::collections::HashMap;

use gpushare_proto::types::JobOutcome;
use gpushare_proto::{AgentError, OPTION_FORCE};
use zbus::zvariant::{OwnedObjectPath, Value};

use super::ExitStatus;
use super::source::Source;
use crate::bus::{Agent, Client};
use crate::cli::ApplyArgs;
use crate::error::{CtlError, Kind};
use crate::job::start_and_follow;
use crate::output::{Output, parse_document, plural};

/// Runs `apply`.
pub async fn run(
    client: &mut Client,
    out: &Output,
    args: &ApplyArgs,
) -> Result<ExitStatus, CtlError> {
    let source = Source::from_args(&args.source)?;
    if args.dry_run {
        return super::plan::run(client, out, &source).await;
    }
    let force = args.force;
    let options = || HashMap::from([(OPTION_FORCE, Value::from(force))]);
    match &source {
        Source::Named(profile) => {
            let start = async |a: &Agent| a.proxy.apply(profile, options()).await;
            run_job(client, out, "Apply", "apply", start, render_outcome).await
        }
        Source::Document { text, origin, config } => {
            let start =
                async |a: &Agent| a.proxy.apply_document(text, origin, config, options()).await;
            run_job(client, out, "ApplyDocument", "apply", start, render_outcome).await
        }
    }
}

/// Starts a job that changes the GPUs with `start` (the call `method`: `Apply`,
/// `ApplyDocument`, `ResetGpu`; `what` in progress and errors), follows it to the end and
/// prints the outcome: with `--json` the [`JobOutcome`] (exit 1 when it failed), else its
/// warnings and the line `render` makes of it.
pub(super) async fn run_job(
    client: &mut Client,
    out: &Output,
    method: &str,
    what: &str,
    start: impl AsyncFn(&Agent) -> Result<OwnedObjectPath, AgentError>,
    render: impl Fn(&JobOutcome) -> Result<String, CtlError>,
) -> Result<ExitStatus, CtlError> {
    let raw = start_and_follow(client, out, method, what, start).await?;

    if out.json {
        out.print_document(&raw, "JobOutcome")?;
        let outcome: JobOutcome = parse_document(&raw, "JobOutcome")?;
        return Ok(if outcome.ok { 0 } else { 1 });
    }
    let outcome: JobOutcome = parse_document(&raw, "JobOutcome")?;
    // A post_apply hook that failed does not fail the apply, but the operator must know.
    for warning in &outcome.warnings {
        out.warn(warning);
    }
    out.print(&render(&outcome)?);
    Ok(0)
}

/// The result line of a finished job, or its failure.
pub fn render_outcome(outcome: &JobOutcome) -> Result<String, CtlError> {
    if !outcome.ok {
        return Err(outcome_error(outcome, || format!("applying {} failed", outcome.profile)));
    }
    if !outcome.changed {
        return Ok(format!("{} is already applied: nothing changed", outcome.profile));
    }
    if outcome.steps_total == 0 {
        // Only the rollback of an earlier unfinished apply (a warning above) changed them.
        return Ok(format!(
            "Applied {}: the GPUs needed no step once the earlier apply was rolled back",
            outcome.profile
        ));
    }
    Ok(format!(
        "Applied {}: {} in {:.2} s",
        outcome.profile,
        plural(outcome.steps_done as usize, "step"),
        outcome.duration_seconds
    ))
}

/// The error of a job that failed: its own name and message, or `fallback` without one.
pub fn outcome_error(outcome: &JobOutcome, fallback: impl FnOnce() -> String) -> CtlError {
    let message = outcome.error.clone().unwrap_or_else(fallback);
    match &outcome.error_name {
        Some(name) => CtlError::new(name.clone(), message),
        None => CtlError::ctl(Kind::Failed, message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(ok: bool, changed: bool) -> JobOutcome {
        JobOutcome {
            ok,
            profile: "half-balanced".into(),
            changed,
            steps_done: if ok { 24 } else { 3 },
            steps_total: 24,
            duration_seconds: 0.4127,
            error_name: (!ok).then(|| "io.gpushare.Agent1.Error.Backend".into()),
            error: (!ok).then(|| {
                "GPU 1: create GPU instance 3g.20gb at slot 4 failed: Insufficient Resources; rolled back to the previous state".into()
            }),
            warnings: vec![],
            probe: None,
            bench: None,
            private: false,
        }
    }

    #[test]
    fn result_lines() {
        assert_eq!(
            render_outcome(&outcome(true, true)).unwrap(),
            "Applied half-balanced: 24 steps in 0.41 s"
        );
        assert_eq!(
            render_outcome(&outcome(true, false)).unwrap(),
            "half-balanced is already applied: nothing changed"
        );
        let repaired = JobOutcome { steps_done: 0, steps_total: 0, ..outcome(true, true) };
        assert_eq!(
            render_outcome(&repaired).unwrap(),
            "Applied half-balanced: the GPUs needed no step once the earlier apply was rolled back"
        );
        let e = render_outcome(&outcome(false, true)).unwrap_err();
        assert_eq!(e.name, "io.gpushare.Agent1.Error.Backend");
        assert!(e.message.starts_with("GPU 1: create GPU instance"), "{}", e.message);
        let mut o = outcome(false, false);
        o.error = None;
        o.error_name = None;
        let e = render_outcome(&o).unwrap_err();
        assert!(e.is(Kind::Failed));
        assert_eq!(e.message, "applying half-balanced failed");
    }
}
