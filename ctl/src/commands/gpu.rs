//! `gpushare-ctl gpu reset N`: starts the reset of an unhealthy GPU (issue 42) and follows
//! it; the agent checks it first (a fault that asks for a reset, no client on the GPU,
//! nothing on the host in the way) and refuses in one line with nothing changed. The
//! result is one line on stdout:
//!
//! ```text
//! GPU 1 reset; the active profile applied again: 6 steps in 1.20 s
//! GPU 1 reset in 0.31 s
//! ```
//! `--json` prints the job's [`JobOutcome`].

use gpushare_proto::types::JobOutcome;

use super::ExitStatus;
use crate::bus::{Agent, Client};
use crate::cli::GpuCommand;
use crate::error::CtlError;
use crate::output::{Output, plural};

/// Runs a `gpu` sub-verb.
pub async fn run(
    client: &mut Client,
    out: &Output,
    command: GpuCommand,
) -> Result<ExitStatus, CtlError> {
    match command {
        GpuCommand::Reset(args) => {
            let gpu = args.gpu;
            let start = async |a: &Agent| a.proxy.reset_gpu(gpu).await;
            let render = |outcome: &JobOutcome| render(gpu, outcome);
            super::apply::run_job(client, out, "ResetGpu", "GPU reset", start, render).await
        }
    }
}

/// The result line of a finished reset, or its failure.
fn render(gpu: u32, outcome: &JobOutcome) -> Result<String, CtlError> {
    if !outcome.ok {
        return Err(super::apply::outcome_error(outcome, || format!("resetting GPU {gpu} failed")));
    }
    // The reset is one step; the re-apply's steps follow it.
    let applied = outcome.steps_done.saturating_sub(1) as usize;
    Ok(if outcome.steps_total > 1 {
        format!(
            "GPU {gpu} reset; the active profile applied again: {} in {:.2} s",
            plural(applied, "step"),
            outcome.duration_seconds
        )
    } else {
        format!("GPU {gpu} reset in {:.2} s", outcome.duration_seconds)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(ok: bool, steps_done: u32, steps_total: u32) -> JobOutcome {
        JobOutcome {
            ok,
            profile: "reset of GPU 1".into(),
            changed: true,
            steps_done,
            steps_total,
            duration_seconds: 1.204,
            error_name: (!ok).then(|| "io.gpushare.Agent1.Error.NotPossible".into()),
            error: (!ok).then(|| "resetting GPU 1: GPU is lost".into()),
            warnings: vec![],
            probe: None,
            bench: None,
            private: false,
        }
    }

    #[test]
    fn result_lines() {
        assert_eq!(
            render(1, &outcome(true, 7, 7)).unwrap(),
            "GPU 1 reset; the active profile applied again: 6 steps in 1.20 s"
        );
        assert_eq!(render(1, &outcome(true, 1, 1)).unwrap(), "GPU 1 reset in 1.20 s");
        let error = render(1, &outcome(false, 0, 1)).unwrap_err();
        assert!(error.to_string().contains("GPU is lost"), "{error}");
    }
}
