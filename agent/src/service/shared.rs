//! Answers concurrent readers share: a `Status`, `Telemetry` or `Clients` answer being
//! worked out is joined by every caller that asks for the same one meanwhile, instead of
//! each starting its own observation of the node (the driver answers one caller at a
//! time). Only within one job epoch (see `Engine::epoch`): a caller never gets an answer
//! begun before a job began or ended. The work runs on a task of its own, so a caller that
//! leaves does not cancel it for the others.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};

use crate::engine::EngineError;

type InFlight<V> = Shared<BoxFuture<'static, Result<V, EngineError>>>;

/// Answers in progress, by key.
pub struct Coalesced<K, V> {
    current: Mutex<HashMap<K, (u64, InFlight<V>)>>,
}

impl<K, V> Default for Coalesced<K, V> {
    fn default() -> Self {
        Coalesced { current: Mutex::new(HashMap::new()) }
    }
}

impl<K, V> Coalesced<K, V>
where
    K: Hash + Eq + Clone,
    V: Clone + Send + Sync + 'static,
{
    /// The answer for `key` in progress, if it began in `epoch` and has not ended; else the
    /// one `work` starts, which later callers join.
    pub async fn join<F>(
        &self,
        key: K,
        epoch: u64,
        work: impl FnOnce() -> F,
    ) -> Result<V, EngineError>
    where
        F: Future<Output = Result<V, EngineError>> + Send + 'static,
    {
        let in_flight = {
            let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
            // Ended answers are not kept: the table holds at most the keys being answered.
            current.retain(|_, (_, running)| running.peek().is_none());
            match current.get(&key) {
                Some((began, running)) if *began == epoch => running.clone(),
                _ => {
                    let task = tokio::spawn(work());
                    let running = async move {
                        task.await.unwrap_or_else(|e| {
                            Err(EngineError::Internal(crate::sys::task_failed(&e)))
                        })
                    }
                    .boxed()
                    .shared();
                    current.insert(key, (epoch, running.clone()));
                    running
                }
            }
        };
        in_flight.await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn callers_at_once_share_one_answer_within_an_epoch() {
        let shared = Arc::new(Coalesced::<(), usize>::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Notify::new());
        let ask = |epoch: u64| {
            let (shared, runs, gate) = (Arc::clone(&shared), Arc::clone(&runs), Arc::clone(&gate));
            tokio::spawn(async move {
                shared
                    .join((), epoch, move || async move {
                        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                        gate.notified().await;
                        Ok(n)
                    })
                    .await
            })
        };
        let (a, b) = (ask(1), ask(1));
        tokio::task::yield_now().await;
        // Another epoch: its own answer.
        let c = ask(2);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        gate.notify_waiters();
        let (a, b, c) =
            (a.await.unwrap().unwrap(), b.await.unwrap().unwrap(), c.await.unwrap().unwrap());
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        // Once ended, the next caller gets a new answer.
        let d = ask(2);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        gate.notify_waiters();
        assert_eq!(d.await.unwrap().unwrap(), 3);
    }
}
