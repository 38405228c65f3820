//! Fair turns for read-only calls: any local user may call `Status`, `Export`, `Plan`...,
//! and zbus starts a task for every call as it arrives, so a user pipelining thousands of
//! them would put every later call, root's `status` included, behind all of theirs (issue
//! 23: 3.2 s). Each connection has [`PER_CONNECTION`] calls served at a time, and all
//! connections of users other than root [`FOR_OTHERS`] together; the rest wait, parked
//! (costing no CPU), in arrival order. Root's calls never wait for a turn.
//!
//! The caller's user is asked of the bus once per connection and remembered; the table of
//! connections is bounded ([`CONNECTIONS_KEPT`]: entries not in use go first).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OnceCell, OwnedSemaphorePermit, Semaphore};
use zbus::Connection;
use zbus::message::Header;

/// Calls of one connection served at a time.
pub const PER_CONNECTION: usize = 4;
/// Calls of all connections of users other than root served at a time.
pub const FOR_OTHERS: usize = 16;
/// Connections remembered; beyond it, those with no call in progress are forgotten.
const CONNECTIONS_KEPT: usize = 4096;

/// Turns for read-only calls.
pub struct Admission {
    connections: Mutex<HashMap<String, Arc<Caller>>>,
    others: Arc<Semaphore>,
}

/// One connection: its user, once asked, and its turns.
struct Caller {
    uid: OnceCell<Option<u32>>,
    turns: Arc<Semaphore>,
}

/// A call's turn: held while the call is served.
pub struct Turn {
    _own: Option<OwnedSemaphorePermit>,
    _shared: Option<OwnedSemaphorePermit>,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            connections: Mutex::new(HashMap::new()),
            others: Arc::new(Semaphore::new(FOR_OTHERS)),
        }
    }
}

impl Admission {
    /// Waits for the turn of the call `header` belongs to (none for root's).
    pub async fn turn(&self, header: &Header<'_>, connection: &Connection) -> Turn {
        let Some(sender) = header.sender() else {
            return Turn { _own: None, _shared: None };
        };
        let caller = self.caller(sender.as_str());
        let uid = *caller
            .uid
            .get_or_init(|| async {
                let dbus = zbus::fdo::DBusProxy::new(connection).await.ok()?;
                dbus.get_connection_unix_user(zbus::names::BusName::Unique(sender.to_owned()))
                    .await
                    .ok()
            })
            .await;
        if uid == Some(0) {
            return Turn { _own: None, _shared: None };
        }
        let own = Arc::clone(&caller.turns).acquire_owned().await.ok();
        let shared = Arc::clone(&self.others).acquire_owned().await.ok();
        Turn { _own: own, _shared: shared }
    }

    /// The connection named `sender`, remembered (a bounded table).
    fn caller(&self, sender: &str) -> Arc<Caller> {
        let mut connections = self.connections.lock().unwrap_or_else(PoisonError::into_inner);
        if !connections.contains_key(sender) && connections.len() >= CONNECTIONS_KEPT {
            connections.retain(|_, caller| Arc::strong_count(caller) > 1);
        }
        Arc::clone(connections.entry(sender.to_string()).or_insert_with(|| {
            Arc::new(Caller {
                uid: OnceCell::new(),
                turns: Arc::new(Semaphore::new(PER_CONNECTION)),
            })
        }))
    }
}
