//! Probes as jobs of the engine: a probe of one GPU or MIG instance under its current
//! sharing, changing nothing. Comparing strategies is a bench of the built-in workloads
//! ([`super::bench`], `gpushare-ctl bench --builtin`, and `probe --compare` in ctl). The
//! CUDA side (client processes, kernels) is [`crate::probe`].

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use gpushare_proto::types::{ClientEnv, ProbeReport};
use gpushare_proto::{MPS_MAX_CLIENTS, PROBE_SECONDS};
use tokio::sync::mpsc::UnboundedSender;

use super::events::EngineEvent;
use super::jobs::{JobGuard, JobKind, JobReport, JobResult, RunningJob};
use super::{Engine, EngineError, report};
use crate::apply::{Progress, Reads};
use crate::gpu::BackendKind;
use crate::probe::Workload;

/// What a probe runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeOptions {
    /// GPU index, `GPU-…` or `MIG-…`; GPU 0 when absent.
    pub target: Option<String>,
    /// Workloads, in order.
    pub workloads: Vec<Workload>,
    /// Client counts, in order.
    pub clients: Vec<usize>,
    /// Measurement window of each run, seconds.
    pub seconds: f64,
    /// The comparison of strategies the protocol once ran here: refused, naming the bench
    /// that does it now.
    pub compare: bool,
}

impl ProbeOptions {
    /// The steps the probe reports progress in: a workload each.
    fn steps(&self) -> u32 {
        u32::try_from(self.workloads.len()).unwrap_or(u32::MAX)
    }
}

/// A probe that holds the apply lock, with its target's client environment.
pub struct ProbeJob {
    options: ProbeOptions,
    env: ClientEnv,
    gpu: u32,
    _guard: JobGuard,
}

impl Engine {
    /// Takes the apply lock (a probe and an apply never overlap) and resolves the probe's
    /// target and its client environment under the current sharing.
    pub async fn begin_probe(
        &self,
        options: ProbeOptions,
        job: &str,
    ) -> Result<ProbeJob, EngineError> {
        if self.backend_kind() == BackendKind::Simulated {
            // CUDA would see the real GPUs (or none), not the simulated ones.
            return Err(EngineError::NotPossible(
                "the probe measures real GPUs with CUDA; this agent simulates its GPUs".into(),
            ));
        }
        if options.workloads.is_empty() || options.clients.is_empty() {
            return Err(EngineError::InvalidArgument(
                "a probe needs a workload and a client count".into(),
            ));
        }
        let most = MPS_MAX_CLIENTS as usize;
        if let Some(n) = options.clients.iter().find(|n| !(1..=most).contains(*n)) {
            return Err(EngineError::InvalidArgument(format!(
                "{n} clients: from 1 to {most} (MPS's limit)"
            )));
        }
        if options.compare {
            return Err(EngineError::InvalidArgument(
                "compare: comparing strategies is a bench of the built-in workload now (Bench with builtin; gpushare-ctl bench --builtin WORKLOAD, or gpushare-ctl probe --compare)".into(),
            ));
        }
        if !PROBE_SECONDS.contains(&options.seconds) {
            return Err(EngineError::InvalidArgument(format!(
                "probe windows are from {} to {} seconds",
                PROBE_SECONDS.start(),
                PROBE_SECONDS.end()
            )));
        }
        // The lock first, so that the sharing observed stays as it is; the job is named
        // (for status and Busy) once its target is known.
        let lock = self.gate.lock(None).await?;
        let node = self.core.node.observe(Reads::FOR_PLANNING).await?;
        let target = options.target.clone().unwrap_or_else(|| "0".into());
        let (env, gpu) = self.env_for(&node, &target)?;
        let running =
            RunningJob { id: job.to_string(), kind: JobKind::Probe { target: env.uuid.clone() } };
        let mut guard = self.gate.job_guard(lock, running);
        guard.start(options.steps());
        Ok(ProbeJob { options, env, gpu, _guard: guard })
    }

    /// Runs a probe job: for each workload a solo baseline, then each client count, as
    /// separate client processes (this binary in its `--probe-client` mode).
    pub async fn run_probe(
        &self,
        job: &ProbeJob,
        progress: UnboundedSender<Progress>,
    ) -> JobReport {
        let started = Instant::now();
        let target = job.env.uuid.clone();
        let mut outcome = JobReport {
            kind: JobKind::Probe { target: target.clone() },
            result: JobResult::Failed,
            changed: false,
            steps_done: 0,
            steps_total: job.options.steps(),
            duration: std::time::Duration::ZERO,
            error: None,
            warnings: Vec::new(),
            probe: None,
            bench: None,
        };
        let measured = self.probe_runs(job, &progress, &mut outcome).await;
        outcome.duration = started.elapsed();
        match measured {
            Ok(mut results) => {
                results.wall_seconds = outcome.duration.as_secs_f64();
                let stamp =
                    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
                let file = self.probe_dir.join(format!("probe-{stamp}.json"));
                results.saved_to = file.display().to_string();
                let saved = std::fs::create_dir_all(&self.probe_dir).and_then(|()| {
                    use crate::sys::files::{PUBLIC, write_json};
                    write_json(&file, &results, PUBLIC)
                });
                if let Err(e) = saved {
                    outcome
                        .warnings
                        .push(format!("probe results not saved to {}: {e}", file.display()));
                    results.saved_to.clear();
                }
                outcome.result = JobResult::Success;
                outcome.probe = Some(results);
            }
            Err(message) => {
                outcome.error = Some(EngineError::Probe { target: target.clone(), message });
            }
        }
        self.events.emit(EngineEvent::ProbeFinished {
            target,
            report: outcome.probe.clone().map(Box::new),
        });
        job._guard.finish();
        outcome
    }

    async fn probe_runs(
        &self,
        job: &ProbeJob,
        progress: &UnboundedSender<Progress>,
        outcome: &mut JobReport,
    ) -> Result<ProbeReport, String> {
        let exe = crate::sys::agent_binary()?;
        let env = job.env.variables.clone();
        let total = outcome.steps_total;
        let mut runs = Vec::new();
        let mut device = String::new();
        for (i, &workload) in job.options.workloads.iter().enumerate() {
            let counts: Vec<String> = job.options.clients.iter().map(usize::to_string).collect();
            let _ = progress.send(Progress {
                done: i as u32,
                total,
                step: format!("{}: solo, then {} clients", workload.as_str(), counts.join(", ")),
            });
            let (exe, env, counts, seconds) =
                (exe.clone(), env.clone(), job.options.clients.clone(), job.options.seconds);
            let results = tokio::task::spawn_blocking(move || {
                crate::probe::run::sweep(&exe, workload, &counts, seconds, &env)
            })
            .await
            .map_err(|e| crate::sys::task_failed(&e))??;
            for r in results {
                device = r.solo.device.name.clone();
                runs.push(report::probe_run(&r));
            }
            outcome.steps_done += 1;
        }
        Ok(ProbeReport {
            target: job.env.uuid.clone(),
            gpu: job.gpu,
            strategy: job.env.strategy.clone(),
            device,
            seconds: job.options.seconds,
            wall_seconds: 0.0,
            runs,
            saved_to: String::new(),
            comparison: Vec::new(),
            recommendations: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_counts_a_step_per_workload() {
        let options = ProbeOptions {
            target: None,
            workloads: Workload::ALL.to_vec(),
            clients: vec![1, 2, 4, 7],
            seconds: 3.0,
            compare: false,
        };
        assert_eq!(options.steps(), 3);
    }
}
