//! The engine's transactions, one at a time, through one path: an apply's, a bench's
//! setups and its restore, the rollback of an unfinished apply (at start-up, or before the
//! next apply). Owns the turn (who may change the GPUs now), the consumer views
//! ([`super::views`]) and the job epoch's moves around a transaction. Every transaction
//! ends in [`SerialTransactions::run`], whose after-steps (the views rendered, the epoch
//! moved on as the turn goes) no caller can skip.
//!
//! The journal records one transaction in flight, and a transaction is planned against
//! GPUs no other one changes meanwhile; the turn is held only while one executes
//! (seconds), never for a bench's length, so an apply of another GPU waits at most for
//! one setup of a bench. A setup of a bench that changes nothing is no apply of a profile
//! and is not recorded (see [`SerialTransactions::apply`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::Mutex as AsyncMutex;
use tokio::sync::mpsc::UnboundedSender;

use super::jobs::Claims;
use super::views::Views;
use crate::apply::journal::{GpuCheckpoint, ProfileDocument};
use crate::apply::transaction::{Applied, Recovered, TransactionError, Transactions};
use crate::apply::{Progress, Purpose};
use crate::node::NodeState;
use crate::plan::Plan;

/// The engine's transactions, one at a time, each ending with the views rendered.
pub struct SerialTransactions {
    inner: Transactions,
    /// The files kept true to the GPUs, rendered after each transaction, in its turn.
    views: Views,
    turn: Arc<AsyncMutex<()>>,
    claims: Arc<Claims>,
    /// Moved on when a transaction begins and ends (see `Engine::epoch`).
    epoch: Arc<AtomicU64>,
}

/// The turn to run a transaction; the job epoch moves on when it is taken and when it goes.
pub struct Turn<'a> {
    _held: tokio::sync::MutexGuard<'a, ()>,
    epoch: &'a AtomicU64,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }
}

impl SerialTransactions {
    /// Transactions run by `inner`, one at a time, keeping `views`; a plan of GPUs in
    /// `claims` alone is a bench's setup; `epoch` moves on around each.
    pub fn new(
        inner: Transactions,
        views: Views,
        claims: Arc<Claims>,
        epoch: Arc<AtomicU64>,
    ) -> Self {
        SerialTransactions { inner, views, turn: Arc::new(AsyncMutex::new(())), claims, epoch }
    }

    /// The views kept (their checks and reports).
    pub fn views(&self) -> &Views {
        &self.views
    }

    /// Renders the views from the node as it is, outside any transaction (at start-up,
    /// when no transaction did; after a change of MPS limits), in the turn: a render that
    /// observed before a transaction's could otherwise write after it. The epoch does not
    /// move (nothing on the GPUs changes).
    pub async fn refresh_views(&self) {
        let _held = self.turn.lock().await;
        self.views.refresh(&self.inner.executor.node, self.during_bench()).await;
    }

    /// Whether a bench holds a GPU now: the views schedulers read wait for its end (see
    /// `View::follows_benches`); its restore renders them all.
    fn during_bench(&self) -> bool {
        !self.claims.is_empty()
    }

    /// Waits for the turn.
    pub async fn turn(&self) -> Turn<'_> {
        let held = self.turn.lock().await;
        self.epoch.fetch_add(1, Ordering::SeqCst);
        Turn { _held: held, epoch: &self.epoch }
    }

    /// The turn if no transaction runs now.
    pub fn try_turn(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        self.turn.try_lock().ok()
    }

    /// The one path every transaction ends through: runs `work` in `turn`, then the
    /// after-steps (the views rendered from the GPUs as it left them, where `touched` says
    /// it may have changed them: `Some(during_bench)`, see [`Views::refresh`]; the epoch
    /// moves on as the turn goes), committed, rolled back or failed alike.
    async fn run<T>(
        &self,
        turn: Turn<'_>,
        work: impl Future<Output = T>,
        touched: impl FnOnce(&T) -> Option<bool>,
    ) -> T {
        let outcome = work.await;
        // The profile the views name is the journal's, whatever the transaction did to it
        // (a commit, a rollback, a rollback that failed and left none active).
        self.views.set_profile(self.inner.journal.active_profile());
        if let Some(during_bench) = touched(&outcome) {
            self.views.refresh(&self.inner.executor.node, during_bench).await;
        }
        drop(turn);
        outcome
    }

    /// [`Transactions::apply`] in turn. A plan of benched GPUs alone is a bench's own setup
    /// (no apply that selects a benched GPU gets this far): when it changes nothing, there
    /// is nothing to record, and its profile (`bench-mps`) never becomes the active one.
    pub async fn apply(
        &self,
        plan: &Plan,
        document: Option<ProfileDocument>,
        before: &NodeState,
        progress: &UnboundedSender<Progress>,
    ) -> Result<Applied, TransactionError> {
        let setup = !plan.gpus.is_empty() && plan.gpus.iter().all(|g| self.claims.holds(g.gpu));
        if setup && plan.is_empty() {
            return Ok(Applied { steps_done: 0, warnings: Vec::new() });
        }
        let turn = self.turn().await;
        // An apply of a profile (not a bench's setup) is what the labels' state tells of:
        // pending from before its first step, then success, or failed where it left the
        // GPUs changed (a rolled-back one leaves the labels as they were).
        let of_profile = !setup;
        if of_profile {
            self.views.begin(&self.inner.executor.node, self.during_bench()).await;
        }
        // Committed or rolled back, the views name what is there now, before post_apply
        // runs (a hook that restarts NVIDIA's device plugin finds its new config).
        let ran = AtomicBool::new(false);
        let settle = async |outcome: Result<(), &TransactionError>| {
            ran.store(true, Ordering::SeqCst);
            self.settled(of_profile, plan, outcome).await;
        };
        let work = async {
            let outcome = self.inner.apply(plan, document, before, progress, settle).await;
            // Ended before it settled anything (nothing to change, the journal refused
            // to begin): the views follow all the same.
            if !ran.load(Ordering::SeqCst) {
                self.settled(of_profile, plan, outcome.as_ref().map(|_| ())).await;
            }
            outcome
        };
        self.run(turn, work, |_| None).await
    }

    /// An apply's outcome, for the views: its state (an apply of a profile), the profile
    /// the journal now names, and the views rendered from the GPUs as it left them.
    async fn settled(&self, of_profile: bool, plan: &Plan, outcome: Result<(), &TransactionError>) {
        if of_profile {
            self.views.end(outcome.map(|_| plan).map_err(|e| (e.to_string(), e.left_changed())));
        }
        self.views.set_profile(self.inner.journal.active_profile());
        self.views.refresh(&self.inner.executor.node, self.during_bench()).await;
    }

    /// [`Transactions::restore`] in turn.
    pub async fn restore(
        &self,
        checkpoint: &[GpuCheckpoint],
        purpose: Purpose,
        progress: &UnboundedSender<Progress>,
    ) -> Result<u32, String> {
        let turn = self.turn().await;
        // A bench's restore is its end: every view follows again.
        let during_bench = purpose != Purpose::Restore && self.during_bench();
        let work = self.inner.restore(checkpoint, purpose, progress);
        self.run(turn, work, |_| Some(during_bench)).await
    }

    /// [`Transactions::recover`] in turn.
    pub async fn recover(&self) -> Result<Option<Recovered>, String> {
        let turn = self.turn().await;
        self.recover_in(turn).await
    }

    /// [`Transactions::recover`] in `turn`, taken already (by a caller that looked at the
    /// journal in it).
    pub async fn recover_in(&self, turn: Turn<'_>) -> Result<Option<Recovered>, String> {
        // A recovery that found nothing to roll back changed nothing; one that failed
        // may have changed some of the GPUs.
        let during_bench = self.during_bench();
        self.run(turn, self.inner.recover(), |r| (!matches!(r, Ok(None))).then_some(during_bench))
            .await
    }
}
