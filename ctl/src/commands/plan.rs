//! `gpushare-ctl plan PROFILE | -f FILE [-c NAME]` (and `apply --dry-run`): the steps
//! applying a profile would take, changing nothing.
//!
//! ```text
//!   1. GPU 0: enable MIG mode
//!   2. GPU 0: create GPU instance 3g.20gb at slot 4
//! 2 steps on 1 GPU; nothing has been changed
//! ```
//!
//! or `Profile all-mps is already applied: nothing to do`.

use std::collections::BTreeSet;

use gpushare_proto::types::PlanReport;

use super::ExitStatus;
use super::source::{self, Source};
use crate::bus::Client;
use crate::error::CtlError;
use crate::output::{Output, parse_document, plural};

/// Runs `plan` (`Plan` for a name, `PlanDocument` for a file).
pub async fn run(
    client: &mut Client,
    out: &Output,
    source: &Source,
) -> Result<ExitStatus, CtlError> {
    let raw = source::plan(client, source).await?;
    if out.json {
        out.print_document(&raw, "PlanReport")?;
    } else {
        let report: PlanReport = parse_document(&raw, "PlanReport")?;
        out.print(&render_plan(&report));
    }
    Ok(0)
}

/// Renders a plan: the numbered steps, then a summary line.
pub fn render_plan(report: &PlanReport) -> String {
    if !report.changes || report.steps.is_empty() {
        return format!("Profile {} is already applied: nothing to do\n", report.profile);
    }
    let width = report.steps.len().to_string().len();
    let mut out = String::new();
    for (i, step) in report.steps.iter().enumerate() {
        // The agent's description names the GPU already ("GPU 0: enable MIG mode").
        out.push_str(&format!("  {:>width$}. {}\n", i + 1, step.description));
    }
    let gpus: BTreeSet<u32> = report.steps.iter().map(|s| s.gpu).collect();
    out.push_str(&format!(
        "{} on {}; nothing has been changed\n",
        plural(report.steps.len(), "step"),
        plural(gpus.len(), "GPU")
    ));
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use gpushare_proto::types::{GpuTarget, PlanStep, TargetInstance};

    fn step(gpu: u32, operation: &str, description: &str) -> PlanStep {
        PlanStep {
            gpu,
            operation: operation.into(),
            description: format!("GPU {gpu}: {description}"),
        }
    }

    pub(crate) fn sample_plan(steps: usize) -> PlanReport {
        let all = [
            step(0, "set_mig_mode", "enable MIG mode"),
            step(0, "create_gpu_instance", "create GPU instance 3g.20gb at slot 4"),
            step(0, "create_compute_instance", "create compute instance on 3g.20gb at slot 4"),
            step(1, "set_compute_mode", "set compute mode exclusive_process"),
        ];
        PlanReport {
            profile: "half-balanced".into(),
            changes: steps > 0,
            steps: all.iter().cycle().take(steps).cloned().collect(),
            targets: vec![GpuTarget {
                gpu: 0,
                model: "A100-SXM4-40GB".into(),
                mig_enabled: true,
                instances: vec![TargetInstance { profile: "3g.20gb".into(), placement_start: 4 }],
                unchanged: steps == 0,
            }],
        }
    }

    #[test]
    fn numbered_steps_and_summary() {
        let text = render_plan(&sample_plan(4));
        let expected = "  1. GPU 0: enable MIG mode
  2. GPU 0: create GPU instance 3g.20gb at slot 4
  3. GPU 0: create compute instance on 3g.20gb at slot 4
  4. GPU 1: set compute mode exclusive_process
4 steps on 2 GPUs; nothing has been changed
";
        assert_eq!(text, expected, "\n{text}");
    }

    #[test]
    fn numbers_are_right_aligned_and_singular_is_singular() {
        let text = render_plan(&sample_plan(10));
        assert!(text.starts_with("   1. GPU 0: enable MIG mode\n"), "{text}");
        assert!(text.contains("\n  10. GPU 0: create GPU instance"), "{text}");
        let text = render_plan(&sample_plan(1));
        assert!(text.ends_with("\n1 step on 1 GPU; nothing has been changed\n"), "{text}");
    }

    #[test]
    fn nothing_to_do() {
        assert_eq!(
            render_plan(&sample_plan(0)),
            "Profile half-balanced is already applied: nothing to do\n"
        );
    }
}
