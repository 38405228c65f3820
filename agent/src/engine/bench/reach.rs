//! Everything of the engine the bench reaches beyond its public methods, in this one file:
//! the engine's state a bench reads and writes ([`Parts`]: journal, node access, policy,
//! transactions, the replicas' launcher, the bench's limits, claims, named moments; the
//! cancel of the running bench and the stopping flag) and the engine's own steps a bench
//! takes (the gate's "may this change the GPUs", the apply lock, the GPU's claim, a plan's
//! host check, a GPU's client environment). The rest of `engine/bench/` goes through
//! here, so that a change of the engine's layout is a change of this file alone.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use tokio::sync::OwnedMutexGuard;

use super::limits::BenchLimits;
use crate::apply::NodeAccess;
use crate::apply::journal::{BenchRecord, Journal};
use crate::bench::launch::Launcher;
use crate::bench::measure::Cancel;
use crate::engine::jobs::{BenchClaim, Claims, JobGuard, Moments, RunningJob};
/// How long a job waits for the apply lock at most; the re-apply at start-up's job.
pub(super) use crate::engine::{BOOT_JOB, LOCK_WAIT};
use crate::engine::{Engine, EngineError, SerialTransactions};
use crate::node::NodeState;
use crate::plan::{Plan, PlanOptions};
use gpushare_proto::types::ClientEnv;

/// The engine's state a bench uses, borrowed for a moment.
pub(super) struct Parts<'a> {
    /// The journal: the bench's record, its replicas, the active profile.
    pub(super) journal: &'a Arc<Journal>,
    /// The node as observed (GPUs, MPS servers), and where the host's files are.
    pub(super) node: &'a NodeAccess,
    /// What a plan may do on this host (`manage_mig`).
    pub(super) policy: &'a PlanOptions,
    /// The transactions, one at a time: a bench's setups and its restore.
    pub(super) transactions: &'a SerialTransactions,
    /// How replicas are started and stopped.
    pub(super) launcher: &'a Arc<Launcher>,
    /// How long a bench may take, and the checks as callers running now.
    pub(super) limits: &'a BenchLimits,
    /// The GPUs benches hold.
    pub(super) claims: &'a Claims,
    /// What holds the apply lock for a moment without a job.
    pub(super) moments: &'a Moments,
}

/// The apply lock, as a bench holds it while it is checked.
pub(super) type ApplyLock = OwnedMutexGuard<()>;

impl Engine {
    /// The engine's state a bench uses.
    pub(super) fn bench_parts(&self) -> Parts<'_> {
        Parts {
            journal: &self.core.journal,
            node: &self.core.node,
            policy: &self.core.policy,
            transactions: &self.transactions,
            launcher: &self.launcher,
            limits: &self.bench_limits,
            claims: &self.gate.claims,
            moments: &self.gate.moments,
        }
    }

    /// Whether the agent is stopping (SIGTERM): a bench that begins now is cancelled.
    pub(super) fn bench_stopping(&self) -> bool {
        self.gate.stopping.load(Ordering::SeqCst)
    }

    /// The agent stops: a bench that begins from now on is cancelled at once.
    pub(super) fn set_bench_stopping(&self) {
        self.gate.stopping.store(true, Ordering::SeqCst);
    }

    /// Records the cancel of the bench running now (`None`: none runs), for SIGTERM.
    pub(super) fn set_running_bench(&self, cancel: Option<Cancel>) {
        *self.running_bench.lock().unwrap_or_else(PoisonError::into_inner) = cancel;
    }

    /// The cancel of the bench running now, if one runs.
    pub(super) fn running_bench(&self) -> Option<Cancel> {
        self.running_bench.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Refused while the agent may change nothing (hands off).
    pub(super) fn bench_may_change(&self) -> Result<(), EngineError> {
        self.gate.may_change()
    }

    /// The apply lock, waiting until `deadline` at most; `None`: no job is named yet.
    pub(super) async fn bench_lock(
        &self,
        deadline: tokio::time::Instant,
    ) -> Result<ApplyLock, EngineError> {
        self.gate.lock_by(None, deadline).await
    }

    /// Whether the host can carry `plan` out (its tools, its permissions).
    pub(super) async fn bench_check_host(
        &self,
        plan: &Plan,
        node: &NodeState,
    ) -> Result<(), EngineError> {
        self.core.check_host(plan, node).await
    }

    /// Claims the GPU of the bench's `record` for `running` and lets `lock` (the apply
    /// lock, held while the bench was checked and its record written) go: from now on an
    /// apply whose profile leaves the GPU out runs beside the bench. The claim goes when the
    /// bench finishes (the guard).
    pub(in crate::engine) async fn bench_claim(
        &self,
        lock: ApplyLock,
        running: RunningJob,
        record: &BenchRecord,
        node: &NodeState,
    ) -> JobGuard {
        let uid = record.uid;
        let user = tokio::task::spawn_blocking(move || crate::sys::unix::user_name(uid))
            .await
            .ok()
            .flatten();
        let (gpu, uuid, restores) = match record.checkpoint.first() {
            Some(cp) => (cp.gpu, cp.uuid.clone(), super::restore::layout_words(cp, node)),
            None => (u32::MAX, String::new(), String::new()),
        };
        let claim = BenchClaim {
            job: running.id.clone(),
            gpu,
            uuid,
            uid,
            user,
            since: std::time::SystemTime::now(),
            profile_before: record.previous_profile.clone(),
            restores,
        };
        self.gate.claim(lock, claim, running.kind)
    }

    /// The variables a client of the GPU `uuid` gets, as it is shared now.
    pub(super) fn bench_client_env(
        &self,
        node: &NodeState,
        uuid: &str,
    ) -> Result<ClientEnv, EngineError> {
        self.env_for(node, uuid).map(|(env, _)| env)
    }
}
