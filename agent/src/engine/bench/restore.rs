//! What a bench puts back: at its end, and at the agent's start after one that was
//! interrupted, its replicas are stopped and its GPU returned to the checkpoint the
//! journal's record holds ([`Engine::recover_bench`]); a restore that fails is kept in the
//! record, shown by `status` and never replayed.

use tokio::sync::mpsc::UnboundedSender;

use crate::apply::journal::BenchRecord;
use crate::apply::{Progress, Purpose};
use crate::engine::{Engine, EngineError};

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
