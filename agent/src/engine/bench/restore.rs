//! What a bench puts back: at its end, and at the agent's start after one that was
//! interrupted, its replicas are stopped and its GPU returned to the checkpoint the
//! journal's record holds ([`Engine::recover_bench`]); a restore that fails is kept in the
//! record, shown by `status` and never replayed.

use tokio::sync::mpsc::UnboundedSender;

use crate::apply::journal::{BenchRecord, GpuCheckpoint};
use crate::apply::{Progress, Purpose};
use crate::engine::{Engine, EngineError};
use crate::node::NodeState;

impl Engine {
    /// Puts back what a bench found: stops replicas left behind and returns the GPU to its
    /// checkpoint (in turn with other transactions); the active profile stays the one
    /// committed last. Returns what it restored, for the report. A failure is kept in the journal's record (shown by
    /// `status`, never replayed).
    pub(super) async fn restore_bench(
        &self,
        record: &BenchRecord,
        progress: &UnboundedSender<Progress>,
    ) -> Result<String, String> {
        let parts = self.bench_parts();
        self.stop_left_over(record.replicas.clone(), record.uid).await;
        let restore = parts.transactions.restore(&record.checkpoint, Purpose::Restore, progress);
        let restored = match restore.await {
            Ok(steps) => parts
                .journal
                .end_bench()
                .map(|()| steps)
                .map_err(|e| format!("writing the journal: {e}")),
            Err(e) => Err(e),
        };
        match restored {
            Ok(steps) => {
                // The profile committed last: the one before the bench, or one applied to
                // another GPU during it (a bench's setups are never active).
                let profile = parts.journal.active_profile().unwrap_or_else(|| "none".into());
                let gpus: Vec<String> =
                    record.checkpoint.iter().map(|c| c.gpu.to_string()).collect();
                Ok(format!(
                    "GPU {} as before the bench ({steps} steps); active profile {profile}",
                    gpus.join(", ")
                ))
            }
            Err(e) => {
                if let Err(w) = parts.journal.bench_restore_failed(&e) {
                    tracing::error!("recording the bench's failed restore in the journal: {w}");
                }
                Err(e)
            }
        }
    }

    /// Stops replicas an agent before this one (or this bench) left running.
    pub(super) async fn stop_left_over(
        &self,
        handles: Vec<crate::apply::journal::ReplicaHandle>,
        uid: u32,
    ) {
        let launcher = std::sync::Arc::clone(self.bench_parts().launcher);
        let stopped =
            tokio::task::spawn_blocking(move || launcher.stop_left_over(&handles, uid)).await;
        if let Ok(n) = stopped
            && n > 0
        {
            tracing::warn!("stopped {n} bench replica(s) left running");
        }
    }

    /// At start-up: a bench the journal shows in flight was interrupted (the agent
    /// stopped or died): its replicas are stopped and the GPU restored, before the agent
    /// serves. A bench whose restore failed earlier is not tried again (an apply may have
    /// come since; the next one settles it). Returns what was done, for the log.
    pub async fn recover_bench(&self) -> Result<Option<String>, EngineError> {
        let Some(record) = self.bench_parts().journal.snapshot().bench else {
            // Under systemd: units of a bench the journal no longer knows of.
            self.stop_left_over(Vec::new(), 0).await;
            return Ok(None);
        };
        if let Some(error) = &record.restore_error {
            self.stop_left_over(record.replicas.clone(), record.uid).await;
            return Ok(Some(format!(
                "restoring the GPU after the bench {} failed earlier ({error}); not tried again: the next apply settles it",
                record.job
            )));
        }
        self.bench_may_change()?;
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        Ok(Some(match self.restore_bench(&record, &tx).await {
            Ok(restored) => format!("the bench {} was interrupted: {restored}", record.job),
            Err(e) => format!(
                "the bench {} was interrupted, and restoring the GPU failed: {e} (status shows it; the next apply settles it)",
                record.job
            ),
        }))
    }
}

/// A GPU's layout at a checkpoint, in words: `MIG off, compute mode default, MPS at 100 %
/// threads`; `MIG on: 3g.20gb, 2g.10gb, 1g.5gb ×2, compute mode default, no MPS`.
pub(super) fn layout_words(cp: &GpuCheckpoint, node: &NodeState) -> String {
    let mut words = Vec::new();
    if cp.mig_enabled {
        let model = node.gpu(cp.gpu).and_then(|g| g.model);
        let mut names: Vec<(String, u32)> = Vec::new();
        for &(id, _) in &cp.instances {
            let name = model
                .and_then(|m| m.profile_by_id(id))
                .map_or_else(|| format!("profile {id}"), |p| p.name.to_string());
            match names.iter_mut().find(|(n, _)| *n == name) {
                Some((_, count)) => *count += 1,
                None => names.push((name, 1)),
            }
        }
        let listed: Vec<String> =
            names.into_iter().map(|(n, c)| if c > 1 { format!("{n} ×{c}") } else { n }).collect();
        words.push(match listed.as_slice() {
            [] => "MIG on, no instances".to_string(),
            _ => format!("MIG on: {}", listed.join(", ")),
        });
    } else {
        words.push("MIG off".to_string());
    }
    words.push(format!("compute mode {}", cp.compute_mode.as_str()));
    let whole = cp.mps.iter().find(|(start, _)| start.is_none()).map(|(_, l)| l);
    let served = cp.mps.iter().filter(|(start, _)| start.is_some()).count();
    match (whole, served) {
        (Some(l), _) => {
            let memory = l.pinned_memory_limit_bytes.map_or_else(String::new, |b| {
                format!(", {} pinned memory", gpushare_proto::exact_size(b))
            });
            words.push(format!("MPS at {} % threads{memory}", l.active_thread_percentage));
        }
        (None, 0) => words.push("no MPS".to_string()),
        (None, n) => words.push(format!("MPS on {}", gpushare_proto::plural(n as u64, "instance"))),
    }
    if let Some(interval) = cp.timeslice {
        words.push(format!("time-slice {}", interval.as_str()));
    }
    words.join(", ")
}
