//! `pre_apply` and `post_apply` hooks: commands from agent.toml run around an apply that
//! changes the GPUs (to stop and start dcgm-exporter, say).
//!
//! Each command runs through `/bin/sh -c` with the profile, the affected GPUs and the
//! phase in its environment (`GPUSHARE_PROFILE`, `GPUSHARE_GPUS` as `0,1,2`,
//! `GPUSHARE_HOOK`, and for `post_apply` `GPUSHARE_RESULT`: `success`, `rolled-back` or
//! `failed`). A command that exits non-zero or outlives the timeout fails the hook.

use std::time::Duration;

use crate::sys::command::Command;
use crate::sys::log;

/// The hook commands and their time limit.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hooks {
    /// Run before the first change; a failure aborts the apply with nothing changed.
    pub pre_apply: Vec<String>,
    /// Run after the apply ends, whatever the outcome.
    pub post_apply: Vec<String>,
    /// Time limit of one command.
    pub timeout: Duration,
}

/// How an apply ended, as `post_apply` hooks read it in `GPUSHARE_RESULT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The GPUs are as the profile asks.
    Success,
    /// The apply failed and the GPUs are as they were.
    RolledBack,
    /// The apply failed otherwise (refused by `pre_apply`, rollback failed).
    Failed,
}

impl Settled {
    /// `success`, `rolled-back` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Settled::Success => "success",
            Settled::RolledBack => "rolled-back",
            Settled::Failed => "failed",
        }
    }
}

/// The phase a hook runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Before the apply.
    PreApply,
    /// After it, with how it ended.
    PostApply(Settled),
}

impl Hooks {
    /// Runs the commands of `phase` in order; stops at the first failure and returns it
    /// in one line.
    pub async fn run(&self, phase: Phase, profile: &str, gpus: &[u32]) -> Result<(), String> {
        let (name, commands, result) = match phase {
            Phase::PreApply => ("pre_apply", &self.pre_apply, None),
            Phase::PostApply(settled) => ("post_apply", &self.post_apply, Some(settled.as_str())),
        };
        let gpu_list: Vec<String> = gpus.iter().map(u32::to_string).collect();
        for command in commands {
            let mut cmd = Command::new("/bin/sh", self.timeout)
                .arg("-c")
                .arg(command)
                .env("GPUSHARE_PROFILE", profile)
                .env("GPUSHARE_GPUS", gpu_list.join(","))
                .env("GPUSHARE_HOOK", name)
                .discard_stdout()
                // Its own process group, so that a timeout ends what it started too.
                .own_process_group();
            if let Some(result) = result {
                cmd = cmd.env("GPUSHARE_RESULT", result);
            }
            let failed = |e: &dyn std::fmt::Display| format!("{name} hook `{command}`: {e}");
            let done = tokio::task::spawn_blocking(log::in_current_span(move || cmd.run()))
                .await
                .map_err(|e| failed(&crate::sys::task_failed(&e)))?
                .map_err(|e| failed(&e))?;
            let Some(status) = done.status else {
                return Err(format!(
                    "{name} hook `{command}` did not finish within {} s and was killed",
                    self.timeout.as_secs()
                ));
            };
            tracing::info!(hook = name, command, %status, "hook ran");
            if !status.success() {
                let stderr = done.stderr_text();
                let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
                return Err(format!(
                    "{name} hook `{command}` failed ({status}){}",
                    if last.is_empty() { String::new() } else { format!(": {}", last.trim()) }
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hooks(pre: &[&str], post: &[&str]) -> Hooks {
        Hooks {
            pre_apply: pre.iter().map(|s| s.to_string()).collect(),
            post_apply: post.iter().map(|s| s.to_string()).collect(),
            timeout: Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn hooks_see_profile_gpus_phase_and_result() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("env");
        let record = format!(
            "echo \"$GPUSHARE_HOOK $GPUSHARE_PROFILE $GPUSHARE_GPUS ${{GPUSHARE_RESULT:-}}\" >> {}",
            out.display()
        );
        let h = hooks(&[&record], &[&record]);
        h.run(Phase::PreApply, "half-balanced", &[4, 5]).await.unwrap();
        h.run(Phase::PostApply(Settled::RolledBack), "half-balanced", &[4, 5]).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            "pre_apply half-balanced 4,5 \npost_apply half-balanced 4,5 rolled-back\n"
        );
    }

    #[tokio::test]
    async fn a_failing_command_stops_the_hook_with_its_last_words() {
        let h = hooks(
            &[
                "echo starting >&2; echo 'dcgm-exporter will not stop' >&2; exit 3",
                "touch /nonexistent/never",
            ],
            &[],
        );
        let e = h.run(Phase::PreApply, "p", &[0]).await.unwrap_err();
        assert!(e.starts_with("pre_apply hook `echo starting"), "{e}");
        assert!(e.ends_with(": dcgm-exporter will not stop"), "{e}");
        assert!(e.contains("exit status: 3"), "{e}");
    }

    #[tokio::test]
    async fn a_hook_that_leaves_a_process_behind_does_not_hang() {
        let h = hooks(&["sleep 30 & exit 0"], &["(sleep 30 &) ; echo done >&2; exit 4"]);
        let started = std::time::Instant::now();
        h.run(Phase::PreApply, "p", &[0]).await.unwrap();
        let e = h.run(Phase::PostApply(Settled::Success), "p", &[0]).await.unwrap_err();
        assert!(e.ends_with(": done"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn a_hanging_command_is_killed_at_the_timeout() {
        let h = Hooks { timeout: Duration::from_millis(200), ..hooks(&[], &["sleep 30"]) };
        let started = std::time::Instant::now();
        let e = h.run(Phase::PostApply(Settled::Success), "p", &[0]).await.unwrap_err();
        assert!(e.contains("did not finish"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
