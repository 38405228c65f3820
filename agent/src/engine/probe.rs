//! Probes as jobs of the engine: a probe of one GPU or MIG instance under its current
//! sharing, or with `compare` the same sweep under time-slicing, MPS and MPS with 100/N %
//! threads, each set up by an ordinary transaction, the sharing restored afterwards. The
//! CUDA side (client processes, kernels, statistics) is [`crate::probe`].

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use gpushare_proto::types::{ClientEnv, ProbeReport, ProbeRun, StrategyRuns};
use gpushare_proto::{MPS_MAX_CLIENTS, PROBE_SECONDS, Strategy};
use tokio::sync::mpsc::UnboundedSender;

use super::events::EngineEvent;
use super::jobs::{JobGuard, JobKind, JobReport, JobResult, RunningJob};
use super::{Engine, EngineError, ProfileRef, report};
use crate::apply::Progress;
use crate::gpu::BackendKind;
use crate::plan;
use crate::probe::Workload;
use crate::profile::{self, Profile, Sharing as ProfileSharing};

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
    /// Run the sweep under time-slicing, MPS and MPS with per-client limits, and
    /// recommend a strategy per workload.
    pub compare: bool,
}

impl ProbeOptions {
    /// The steps the probe reports progress in: a workload each, or with `compare` one per
    /// strategy and client count set up.
    fn steps(&self) -> u32 {
        let steps = if self.compare {
            2 + self.clients.iter().filter(|&&n| n > 1).count()
        } else {
            self.workloads.len()
        };
        u32::try_from(steps).unwrap_or(u32::MAX)
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
            // A comparison sets up time-slicing and MPS on the GPU: a change.
            self.may_change()?;
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
        let lock = self.lock().await?;
        let node = self.node.observe(true).await?;
        let target = options.target.clone().unwrap_or_else(|| "0".into());
        let (env, gpu) = self.env_for(&node, &target)?;
        if options.compare {
            let g = node.gpu(gpu).expect("env_for found this GPU");
            if g.mig_enabled || g.uuid != env.uuid {
                return Err(EngineError::NotPossible(format!(
                    "--compare changes the sharing of a whole GPU: {} has MIG on; probe a MIG instance without --compare",
                    g.label()
                )));
            }
            if !g.processes.is_empty() {
                let pids: Vec<String> = g.processes.iter().map(|p| p.pid.to_string()).collect();
                return Err(EngineError::NotPossible(format!(
                    "--compare would change the sharing under compute processes on {} (PID {}); run it when the GPU is idle",
                    g.label(),
                    pids.join(", ")
                )));
            }
        }
        let running =
            RunningJob { id: job.to_string(), kind: JobKind::Probe { target: env.uuid.clone() } };
        let mut guard = JobGuard::new(lock, running, self.running.clone(), self.events.clone());
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
        let measured = if job.options.compare {
            self.probe_compare(job, &progress, &mut outcome).await
        } else {
            self.probe_runs(job, &progress, &mut outcome).await
        };
        outcome.duration = started.elapsed();
        match measured {
            Ok(mut results) => {
                results.wall_seconds = outcome.duration.as_secs_f64();
                let stamp =
                    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
                let file = self.probe_dir.join(format!("probe-{stamp}.json"));
                results.saved_to = file.display().to_string();
                let saved = std::fs::create_dir_all(&self.probe_dir)
                    .and_then(|()| crate::sys::files::write_json(&file, &results));
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

    /// The sweep under time-slicing, MPS and MPS with 100/N % threads, each set up by a
    /// transaction like any apply, then the sharing the GPU had (or its profile) restored,
    /// also after a failure.
    async fn probe_compare(
        &self,
        job: &ProbeJob,
        progress: &UnboundedSender<Progress>,
        outcome: &mut JobReport,
    ) -> Result<ProbeReport, String> {
        let before = self.journal.snapshot();
        let initial = self.observe().await.map_err(|e| e.to_string())?;
        let initial_mps = initial
            .mps
            .iter()
            .find(|s| s.uuid == job.env.uuid && s.pid.is_some())
            .map(|s| s.limits);
        let result = self.compare_runs(job, progress, outcome).await;
        // Back to how it was: the active profile, or else the GPU's own sharing.
        let restored = match (&before.active_profile, &before.active_document) {
            (_, Some(d)) => {
                let profile =
                    self.resolve(ProfileRef::of_document(d)).map_err(|e| e.to_string())?;
                self.apply_unlocked(profile, progress).await
            }
            (Some(name), None) => {
                let profile = self.resolve(ProfileRef::Named(name)).map_err(|e| e.to_string())?;
                self.apply_unlocked(profile, progress).await
            }
            (None, None) => {
                let sharing = match initial_mps {
                    Some(l) => ProfileSharing::Mps(profile::MpsSettings {
                        active_thread_percentage: Some(l.active_thread_percentage),
                        pinned_memory_limit_bytes: l.pinned_memory_limit_bytes,
                        ..Default::default()
                    }),
                    None => ProfileSharing::Exclusive,
                };
                let restored = self
                    .apply_unlocked(whole_gpu("probe-restore", &job.env.uuid, sharing), progress)
                    .await;
                restored
                    .and_then(|()| self.journal.set_active(None, None).map_err(|e| e.to_string()))
            }
        };
        match (result, restored) {
            (Ok(report), Ok(())) => Ok(report),
            (Ok(_), Err(e)) => {
                Err(format!("restoring the sharing after the comparison failed: {e}"))
            }
            (Err(e), Ok(())) => Err(format!("{e}; the sharing was restored")),
            (Err(e), Err(r)) => Err(format!("{e}; restoring the sharing failed too: {r}")),
        }
    }

    async fn compare_runs(
        &self,
        job: &ProbeJob,
        progress: &UnboundedSender<Progress>,
        outcome: &mut JobReport,
    ) -> Result<ProbeReport, String> {
        use crate::probe::run::{run_clients, summarize};
        let exe = agent_binary()?;
        let uuid = job.env.uuid.clone();
        let mps_dir = self.node.sharing.mps.pipe_dir(&uuid).display().to_string();
        let counts = job.options.clients.clone();
        let seconds = job.options.seconds;
        let limited: Vec<usize> = counts.iter().copied().filter(|&n| n > 1).collect();
        let say = |done: u32, step: String| {
            let _ = progress.send(Progress { done, total: outcome.steps_total, step });
        };
        let env_with = |mps: bool| {
            let mut env = vec![("CUDA_VISIBLE_DEVICES".to_string(), uuid.clone())];
            if mps {
                env.push(("CUDA_MPS_PIPE_DIRECTORY".to_string(), mps_dir.clone()));
            }
            env
        };
        let sweep_all = |env: Vec<(String, String)>| {
            let (exe, workloads, counts) =
                (exe.clone(), job.options.workloads.clone(), counts.clone());
            tokio::task::spawn_blocking(move || {
                let mut all = Vec::new();
                for w in workloads {
                    all.push(crate::probe::run::sweep(&exe, w, &counts, seconds, &env)?);
                }
                Ok::<_, String>(all)
            })
        };

        say(0, "time-slicing: the GPU without MPS".into());
        self.apply_unlocked(
            whole_gpu("probe-time-slicing", &uuid, ProfileSharing::Exclusive),
            progress,
        )
        .await?;
        let ts = sweep_all(env_with(false)).await.map_err(|e| e.to_string())??;
        outcome.steps_done += 1;

        say(1, "mps: one MPS server, no limits".into());
        let unlimited =
            profile::MpsSettings { active_thread_percentage: Some(100), ..Default::default() };
        self.apply_unlocked(
            whole_gpu("probe-mps", &uuid, ProfileSharing::Mps(unlimited)),
            progress,
        )
        .await?;
        let mps = sweep_all(env_with(true)).await.map_err(|e| e.to_string())??;
        outcome.steps_done += 1;

        // MPS with 100/N % threads: N clients against the solo run without limits.
        let mut limited_runs: Vec<Vec<crate::probe::RunResult>> =
            vec![Vec::new(); job.options.workloads.len()];
        for (k, &n) in limited.iter().enumerate() {
            let pct = u32::try_from(100 / n).unwrap_or(1).max(1);
            say(2 + k as u32, format!("mps-limited: {n} clients at {pct} % threads"));
            let settings =
                profile::MpsSettings { active_thread_percentage: Some(pct), ..Default::default() };
            self.apply_unlocked(
                whole_gpu("probe-mps-limited", &uuid, ProfileSharing::Mps(settings)),
                progress,
            )
            .await?;
            for (w, workload) in job.options.workloads.iter().copied().enumerate() {
                let solo = mps[w][0].solo.clone();
                // The same work per step as the unlimited solo run (see the probe client).
                let mut env = env_with(true);
                env.push(("GPUSHARE_PROBE_GRID_SMS".to_string(), solo.device.sm_count.to_string()));
                let exe = exe.clone();
                let clients = tokio::task::spawn_blocking(move || {
                    run_clients(&exe, workload, n, seconds, &env)
                })
                .await
                .map_err(|e| e.to_string())??;
                limited_runs[w].push(summarize(&solo, clients, seconds));
            }
            outcome.steps_done += 1;
        }

        let mut comparison = Vec::new();
        let mut device = String::new();
        for (strategy, per_workload) in [
            (Strategy::TimeSlicing, &ts),
            (Strategy::Mps, &mps),
            (Strategy::MpsLimited, &limited_runs),
        ] {
            let runs: Vec<ProbeRun> =
                per_workload.iter().flatten().map(report::probe_run).collect();
            if let Some(r) = per_workload.iter().flatten().next() {
                device = r.solo.device.name.clone();
            }
            comparison.push(StrategyRuns { strategy: strategy.as_str().into(), runs });
        }
        let largest = counts.iter().copied().max().unwrap_or(1);
        let recommendations = job
            .options
            .workloads
            .iter()
            .map(|w| crate::bench::stats::recommend_probe(w.as_str(), largest, &comparison))
            .collect();
        Ok(ProbeReport {
            target: uuid.clone(),
            gpu: job.gpu,
            strategy: Strategy::Compare.as_str().into(),
            device,
            seconds,
            wall_seconds: 0.0,
            runs: Vec::new(),
            saved_to: String::new(),
            comparison,
            recommendations,
        })
    }

    /// Plans and applies `profile` while the caller holds the apply lock (a probe's own
    /// steps): the same planner, journal and rollback as any apply.
    pub(super) async fn apply_unlocked(
        &self,
        profile: Profile,
        progress: &UnboundedSender<Progress>,
    ) -> Result<(), String> {
        let before = self.observe().await.map_err(|e| e.to_string())?;
        let plan = plan::plan(&before, &profile, &self.policy).map_err(|e| e.to_string())?;
        self.transactions
            .apply(&plan, None, &before, progress)
            .await
            .map(|_| ())
            .map_err(|e| format!("setting up {}: {e}", profile.name))
    }

    async fn probe_runs(
        &self,
        job: &ProbeJob,
        progress: &UnboundedSender<Progress>,
        outcome: &mut JobReport,
    ) -> Result<ProbeReport, String> {
        let exe = agent_binary()?;
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
            .map_err(|e| e.to_string())??;
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

/// This binary, which probe clients run as (`--probe-client`).
fn agent_binary() -> Result<std::path::PathBuf, String> {
    std::env::current_exe().map_err(|e| format!("cannot find the agent binary: {e}"))
}

/// A profile that sets one whole GPU's sharing (MIG off) and leaves every other GPU alone.
fn whole_gpu(name: &str, uuid: &str, sharing: ProfileSharing) -> Profile {
    super::bench::whole_gpu(name, uuid, profile::MigLayout::Disabled, sharing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparison_profiles_touch_one_whole_gpu() {
        let p = whole_gpu("probe-mps", "GPU-x", ProfileSharing::Exclusive);
        assert_eq!(p.rules.len(), 1);
        assert_eq!(p.rules[0].select, profile::Selector::Uuid("GPU-x".into()));
        assert_eq!(p.rules[0].mig, profile::MigLayout::Disabled);
    }

    #[test]
    fn progress_counts_a_step_per_workload_or_per_strategy_set_up() {
        let options = ProbeOptions {
            target: None,
            workloads: Workload::ALL.to_vec(),
            clients: vec![1, 2, 4, 7],
            seconds: 3.0,
            compare: false,
        };
        assert_eq!(options.steps(), 3);
        assert_eq!(ProbeOptions { compare: true, ..options }.steps(), 5);
    }
}
