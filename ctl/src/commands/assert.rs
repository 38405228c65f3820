//! `gpushare-ctl assert PROFILE | -f FILE [-c NAME]`: whether a profile is applied, as the
//! exit status, for scripts and health checks.
//!
//! A profile is applied exactly when its plan has no steps (`changes == false`). Applied:
//! one line on stdout, exit 0. Not applied: the reason on stderr as a failure, exit 1:
//!
//! ```text
//! half-balanced is applied
//! gpushare-ctl: half-balanced is not applied: 12 steps would change GPU 4, 5, 6, 7
//! ```
//!
//! Any other failure (unknown profile, infeasible, agent not running) also exits 1, with
//! its own message. With `--json` both outcomes print an [`AssertReport`] (exit 0 or 1), and
//! failures the usual error object, so the two stay apart.

use std::collections::BTreeSet;

use gpushare_proto::types::PlanReport;
use serde::Serialize;

use super::ExitStatus;
use super::source::{self, Source};
use crate::bus::Client;
use crate::cli::AssertArgs;
use crate::error::{CtlError, Kind};
use crate::output::{Output, parse_document, plural};

/// What `assert --json` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AssertReport {
    /// The profile checked, as the plan names it.
    pub profile: String,
    /// Whether it is applied (its plan has no steps).
    pub applied: bool,
    /// Steps applying it would take.
    pub steps: usize,
    /// The GPUs those steps would change, by index.
    pub gpus: Vec<u32>,
}

impl AssertReport {
    /// Reads a plan.
    pub fn from_plan(report: &PlanReport) -> Self {
        let gpus: BTreeSet<u32> = report.steps.iter().map(|s| s.gpu).collect();
        Self {
            profile: report.profile.clone(),
            applied: !report.changes,
            steps: report.steps.len(),
            gpus: gpus.into_iter().collect(),
        }
    }
}

/// Runs `assert`.
pub async fn run(
    client: &mut Client,
    out: &Output,
    args: &AssertArgs,
) -> Result<ExitStatus, CtlError> {
    let source = Source::from_args(&args.source)?;
    let raw = source::plan(client, &source).await?;
    let report: PlanReport = parse_document(&raw, "PlanReport")?;
    let assessed = AssertReport::from_plan(&report);
    if out.json {
        let doc = serde_json::to_string(&assessed).map_err(|e| {
            CtlError::ctl(Kind::Failed, format!("cannot write the assert document: {e}"))
        })?;
        out.print(&doc);
        return Ok(if assessed.applied { 0 } else { 1 });
    }
    let line = render_assert(&assessed);
    if assessed.applied {
        out.print(&line);
        Ok(0)
    } else {
        Err(CtlError::ctl(Kind::NotApplied, line))
    }
}

/// `NAME is applied`, or `NAME is not applied: 12 steps would change GPU 4, 5, 6, 7`.
pub fn render_assert(report: &AssertReport) -> String {
    if report.applied {
        return format!("{} is applied", report.profile);
    }
    if report.steps == 0 {
        return format!("{} is not applied", report.profile);
    }
    let gpus: Vec<String> = report.gpus.iter().map(u32::to_string).collect();
    format!(
        "{} is not applied: {} would change GPU {}",
        report.profile,
        plural(report.steps, "step"),
        gpus.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::plan::tests::sample_plan;
    use gpushare_proto::types::PlanStep;

    fn step(gpu: u32) -> PlanStep {
        PlanStep {
            gpu,
            operation: "create_gpu_instance".into(),
            description: "create GPU instance 1g.10gb at slot 0".into(),
        }
    }

    #[test]
    fn applied() {
        let report = AssertReport::from_plan(&sample_plan(0));
        assert_eq!(
            report,
            AssertReport { profile: "half-balanced".into(), applied: true, steps: 0, gpus: vec![] }
        );
        assert_eq!(render_assert(&report), "half-balanced is applied");
        assert_eq!(
            serde_json::to_string(&report).unwrap(),
            r#"{"profile":"half-balanced","applied":true,"steps":0,"gpus":[]}"#
        );
    }

    #[test]
    fn not_applied_names_steps_and_gpus_in_order() {
        let mut plan = sample_plan(0);
        plan.changes = true;
        plan.steps = [7, 4, 5, 4, 6, 7, 5, 4, 6, 7, 5, 6].into_iter().map(step).collect();
        let report = AssertReport::from_plan(&plan);
        assert!(!report.applied);
        assert_eq!(report.gpus, vec![4, 5, 6, 7]);
        assert_eq!(
            render_assert(&report),
            "half-balanced is not applied: 12 steps would change GPU 4, 5, 6, 7"
        );
        assert_eq!(
            serde_json::to_string(&report).unwrap(),
            r#"{"profile":"half-balanced","applied":false,"steps":12,"gpus":[4,5,6,7]}"#
        );
    }

    #[test]
    fn not_applied_singular_and_without_steps() {
        let report = AssertReport::from_plan(&sample_plan(1));
        assert_eq!(
            render_assert(&report),
            "half-balanced is not applied: 1 step would change GPU 0"
        );
        let report = AssertReport { profile: "lab".into(), applied: false, steps: 0, gpus: vec![] };
        assert_eq!(render_assert(&report), "lab is not applied");
    }

    #[test]
    fn not_applied_is_a_failure_on_stderr() {
        // What `run` returns for people: main prints it as `gpushare-ctl: <message>`, exit 1.
        let report = AssertReport::from_plan(&sample_plan(1));
        let e = CtlError::ctl(Kind::NotApplied, render_assert(&report));
        assert_eq!(e.exit_code, 1);
        assert_eq!(e.name, "gpushare.Ctl.Error.NotApplied");
    }
}
