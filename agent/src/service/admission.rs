//! Fair turns for read-only calls: any local user may call `Status`, `Export`, `Plan`...,
//! and zbus starts a task for every call as it arrives, each holding its message, so a
//! user pipelining thousands of them would put every later call, root's `status`
//! included, behind all of theirs (issue 23: 3.2 s) and hold their messages meanwhile.
//!
//! Turns are per user, whatever the number of their connections: each user other than
//! root has [`PER_USER`] calls served at a time and all of them [`FOR_OTHERS`] together;
//! up to [`WAITING_PER_USER`] more, holding at most [`WAITING_BYTES_PER_USER`] of strings,
//! wait, parked (costing no CPU), in arrival order, and calls beyond that are refused at
//! once (`LimitsExceeded`), so that what a user's waiting calls hold is bounded (each
//! call's strings are bounded before it waits). Root's calls never wait for a turn.
//!
//! The caller's user is asked of the bus once per connection and remembered (a lookup
//! that fails is not remembered; the call counts as an unknown user's). The tables are
//! bounded ([`ENTRIES_KEPT`] each): connections and users with no call in progress are
//! forgotten.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use gpushare_proto::AgentError;
use tokio::sync::{OnceCell, OwnedSemaphorePermit, Semaphore};
use zbus::Connection;
use zbus::message::Header;

/// Calls of one user served at a time.
pub const PER_USER: usize = 4;
/// Calls of all users other than root served at a time.
pub const FOR_OTHERS: usize = 16;
/// Calls of one user that wait for a turn; more are refused at once.
pub const WAITING_PER_USER: usize = 8192;
/// Bytes of strings the waiting calls of one user may hold (each call's strings are
/// bounded: a profile text at most 256 KiB); a call that would pass it is refused at once.
pub const WAITING_BYTES_PER_USER: usize = 16 << 20;
/// What a call is counted as holding besides its strings (its message's header, its task).
const CALL_OVERHEAD: usize = 1024;
/// Connections whose user is remembered, and users whose turns are kept; beyond it,
/// those with no call in progress are forgotten.
const ENTRIES_KEPT: usize = 4096;
/// The user a call counts as when the bus did not say whose it is.
const UNKNOWN_USER: u32 = u32::MAX;

/// Turns for read-only calls.
pub struct Admission {
    connections: Mutex<HashMap<String, Arc<OnceCell<u32>>>>,
    users: Mutex<HashMap<u32, Arc<User>>>,
    others: Arc<Semaphore>,
}

/// One user's turns and the calls waiting for one.
struct User {
    turns: Arc<Semaphore>,
    waiting: AtomicUsize,
    waiting_bytes: AtomicUsize,
}

/// A call's turn: held while the call is served.
pub struct Turn {
    _own: Option<OwnedSemaphorePermit>,
    _shared: Option<OwnedSemaphorePermit>,
}

/// Counts a call (and its bytes) as waiting until it has its turn or is dropped.
struct Waiting<'a> {
    user: &'a User,
    bytes: usize,
}

impl<'a> Waiting<'a> {
    /// Counts a call of `bytes` as waiting, unless `user` has as many waiting as allowed.
    fn enter(user: &'a User, bytes: usize) -> Option<Self> {
        let waiting = Waiting { user, bytes };
        let calls = user.waiting.fetch_add(1, Ordering::SeqCst);
        let held = user.waiting_bytes.fetch_add(bytes, Ordering::SeqCst);
        // Dropped when refused: the counts go back down.
        (calls < WAITING_PER_USER && held + bytes <= WAITING_BYTES_PER_USER).then_some(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.user.waiting.fetch_sub(1, Ordering::SeqCst);
        self.user.waiting_bytes.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            connections: Mutex::new(HashMap::new()),
            users: Mutex::new(HashMap::new()),
            others: Arc::new(Semaphore::new(FOR_OTHERS)),
        }
    }
}

impl Admission {
    /// Waits for the turn of the call `header` belongs to (none for root's), whose strings
    /// take `bytes`; refused at once when its user's waiting calls are as many or hold as
    /// much as allowed ([`WAITING_PER_USER`], [`WAITING_BYTES_PER_USER`]).
    pub async fn turn(
        &self,
        header: &Header<'_>,
        connection: &Connection,
        bytes: usize,
    ) -> Result<Turn, AgentError> {
        let Some(sender) = header.sender() else {
            return Ok(Turn { _own: None, _shared: None });
        };
        let uid = self.uid_of(sender, connection).await;
        if uid == 0 {
            return Ok(Turn { _own: None, _shared: None });
        }
        let user = self.user(uid);
        let Some(waiting) = Waiting::enter(&user, bytes + CALL_OVERHEAD) else {
            return Err(AgentError::ZBus(zbus::Error::FDO(Box::new(
                zbus::fdo::Error::LimitsExceeded(
                    "too many calls of this user are waiting for an answer; wait for them".into(),
                ),
            ))));
        };
        let own = Arc::clone(&user.turns).acquire_owned().await.ok();
        let shared = Arc::clone(&self.others).acquire_owned().await.ok();
        drop(waiting);
        Ok(Turn { _own: own, _shared: shared })
    }

    /// The user of connection `sender`, asked of the bus once (the agent's connection has a
    /// method timeout, so a bus that does not answer does not hold the call for ever).
    async fn uid_of(&self, sender: &zbus::names::UniqueName<'_>, connection: &Connection) -> u32 {
        let cell = {
            let mut connections = self.connections.lock().unwrap_or_else(PoisonError::into_inner);
            if !connections.contains_key(sender.as_str()) && connections.len() >= ENTRIES_KEPT {
                connections.retain(|_, cell| Arc::strong_count(cell) > 1);
            }
            Arc::clone(connections.entry(sender.to_string()).or_default())
        };
        let asked = cell
            .get_or_try_init(|| async {
                let dbus = zbus::fdo::DBusProxy::new(connection).await?;
                dbus.get_connection_unix_user(zbus::names::BusName::Unique(sender.to_owned())).await
            })
            .await;
        asked.map_or(UNKNOWN_USER, |uid| *uid)
    }

    /// The turns of user `uid` (a table of the users with calls in progress, and a few
    /// more).
    fn user(&self, uid: u32) -> Arc<User> {
        let mut users = self.users.lock().unwrap_or_else(PoisonError::into_inner);
        if !users.contains_key(&uid) && users.len() >= ENTRIES_KEPT {
            users.retain(|_, user| Arc::strong_count(user) > 1);
        }
        Arc::clone(users.entry(uid).or_insert_with(|| {
            Arc::new(User {
                turns: Arc::new(Semaphore::new(PER_USER)),
                waiting: AtomicUsize::new(0),
                waiting_bytes: AtomicUsize::new(0),
            })
        }))
    }
}
