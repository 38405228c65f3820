//! Who has left the bus: the door hears every connection that leaves (the bus's
//! `NameOwnerChanged`) and tells this table, and a call that must end with its caller (a
//! bench being checked, a bench running) waits on [`Departures::watch`]. One place hears
//! it, instead of a subscription of the agent's own per bench.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Mutex, PoisonError};

use tokio::sync::oneshot;

/// Connections that have left, remembered so that a watch begun after the leaving still
/// ends at once.
const REMEMBERED: usize = 4096;

/// The connections watched, and those that have left lately.
#[derive(Default)]
pub struct Departures {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    watchers: HashMap<String, Vec<oneshot::Sender<()>>>,
    left: HashSet<String>,
    order: VecDeque<String>,
}

impl Departures {
    /// Connection `name` has left the bus: its watchers are told.
    pub fn left(&self, name: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        for tx in inner.watchers.remove(name).unwrap_or_default() {
            let _ = tx.send(());
        }
        if inner.left.insert(name.to_owned()) {
            inner.order.push_back(name.to_owned());
        }
        while inner.order.len() > REMEMBERED {
            if let Some(old) = inner.order.pop_front() {
                inner.left.remove(&old);
            }
        }
    }

    /// Resolves when connection `name` leaves the bus (at once when it already has).
    pub fn watch(&self, name: &str) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.left.contains(name) {
            let _ = tx.send(());
            return rx;
        }
        // Watches nobody waits on any more are dropped as new ones come.
        inner.watchers.retain(|_, txs| {
            txs.retain(|t| !t.is_closed());
            !txs.is_empty()
        });
        inner.watchers.entry(name.to_owned()).or_default().push(tx);
        rx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watch_ends_when_its_connection_leaves_even_if_it_left_first() {
        let d = Departures::default();
        let mut watch = d.watch(":1.5");
        assert!(watch.try_recv().is_err());
        d.left(":1.4");
        assert!(watch.try_recv().is_err());
        d.left(":1.5");
        assert!(watch.await.is_ok());
        assert!(d.watch(":1.5").await.is_ok());
        drop(d.watch(":1.6"));
        let _kept = d.watch(":1.7");
        assert_eq!(d.inner.lock().unwrap().watchers.len(), 1);
    }
}
