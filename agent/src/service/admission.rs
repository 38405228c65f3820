//! Who is served when: every call the agent receives is counted here the moment it
//! arrives, before anything waits, against its connection and then against its user, and
//! is started, kept waiting its turn, or refused. Pure bookkeeping, no I/O: the door
//! ([`super::door`]) asks the bus who a connection's user is and carries out each [`Step`].
//!
//! The rules (DESIGN.md, "Calls enter through one door"):
//! - **Per connection**: at most [`Limits::per_connection`] calls counted (waiting for the
//!   bus to say whose they are, waiting their turn, or running); a connection whose user
//!   is not known yet holds at most [`Limits::unidentified_per_connection`] of them, and all
//!   such calls together at most [`Limits::unidentified_bytes`].
//! - **Per user**, whatever their number of connections: root's calls start at once; every
//!   other user has at most [`Limits::running_per_user`] calls running, all of them
//!   together [`Limits::running_for_others`]; up to [`Limits::waiting_per_user`] more,
//!   holding at most [`Limits::waiting_bytes_per_user`], wait in arrival order.
//! - **Fair turns**: when a turn frees, the users with calls waiting are served in
//!   rotation, one call each, so one user's backlog delays another user's call by at most
//!   the calls already running.
//! - **A share of time**: each user other than root has a budget of the agent's time that
//!   fills at [`Limits::share`] seconds a second, up to [`Limits::burst`]; each call costs
//!   its time, counted from [`Limits::min_cost`] to [`Limits::max_cost`] (a call that waits
//!   for a lock costs no more than one that works). A user whose budget is spent waits
//!   until it fills again: a steady flood of cheap calls is served at a bounded rate, so
//!   it neither takes the cores nor, pipelined, the bus from everyone else. Every call is
//!   charged, those that change the GPUs too (a refused `Apply` is as cheap as a read).
//! - **Refused at once** beyond those bounds (`LimitsExceeded`), so that what a user can
//!   make the agent hold is bounded; **dropped** without an answer once the caller has
//!   left the bus: a sender that has gone costs nothing more.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The bounds (see the module's rules).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub per_connection: usize,
    pub root_per_connection: usize,
    pub unidentified_per_connection: usize,
    pub unidentified_bytes: usize,
    pub running_per_user: usize,
    pub running_for_others: usize,
    pub waiting_per_user: usize,
    pub waiting_bytes_per_user: usize,
    /// Connections remembered (their users), and gone senders remembered.
    pub connections_kept: usize,
    /// Seconds of calls a user's budget gains a second.
    pub share: f64,
    /// The most a user's budget holds.
    pub burst: Duration,
    /// What a call costs at least, and at most.
    pub min_cost: Duration,
    pub max_cost: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            per_connection: 64,
            root_per_connection: 256,
            unidentified_per_connection: 64,
            unidentified_bytes: 16 << 20,
            running_per_user: 2,
            running_for_others: 16,
            waiting_per_user: 1024,
            waiting_bytes_per_user: 16 << 20,
            connections_kept: 4096,
            share: 0.25,
            burst: Duration::from_secs(1),
            min_cost: Duration::from_millis(1),
            max_cost: Duration::from_millis(100),
        }
    }
}

/// Who a connection belongs to, as the bus told: its user and supplementary groups.
pub use crate::engine::Caller;

/// Why the bus did not say whose a connection is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unknown {
    /// The connection has left the bus.
    Gone,
    /// Anything else (the bus did not answer in time, its queue to the agent full): the
    /// calls go on as an unknown user's ([`UNKNOWN_USER`], no groups: nothing that changes
    /// the GPUs is allowed), and the connection's next call asks again.
    Failed(String),
}

/// The user a call counts as when the bus did not say whose it is.
pub const UNKNOWN_USER: u32 = u32::MAX;

/// What the door does next.
#[derive(Debug, PartialEq)]
pub enum Step<T> {
    /// Start the call now, as `caller`.
    Run { item: T, caller: Arc<Caller> },
    /// Ask the bus whose connection `sender` is, then tell [`Admission::identified`].
    Ask(String),
    /// Answer the call with `LimitsExceeded` (or the lookup's failure).
    Refuse { item: T, why: String },
    /// Forget the call: its sender has left the bus.
    Drop(T),
}

struct Entry<T> {
    sender: Arc<str>,
    bytes: usize,
    item: T,
}

enum Identity {
    /// A lookup is in flight: calls wait for it.
    Asking,
    Known(Arc<Caller>),
    /// Not asked yet, or asked and the bus did not say: the next call asks.
    Unknown,
}

struct Connection<T> {
    name: Arc<str>,
    identity: Identity,
    /// Calls of this connection counted: unidentified, waiting or running.
    counted: usize,
    unidentified: VecDeque<Entry<T>>,
}

struct User<T> {
    running: usize,
    waiting: VecDeque<(Entry<T>, Arc<Caller>)>,
    waiting_bytes: usize,
    in_rotation: bool,
    /// Seconds of the agent's time the user may still use (negative: owed).
    budget: f64,
    /// When `budget` was last filled.
    filled: Instant,
}

impl<T> User<T> {
    fn new(limits: &Limits, now: Instant) -> Self {
        User {
            running: 0,
            waiting: VecDeque::new(),
            waiting_bytes: 0,
            in_rotation: false,
            budget: limits.burst.as_secs_f64(),
            filled: now,
        }
    }

    /// Fills the budget for the time since it was last filled.
    fn fill(&mut self, limits: &Limits, now: Instant) {
        let gained = now.saturating_duration_since(self.filled).as_secs_f64() * limits.share;
        self.budget = (self.budget + gained).min(limits.burst.as_secs_f64());
        self.filled = now;
    }

    /// When the budget is positive again (now, when it is).
    fn ready_at(&self, limits: &Limits) -> Instant {
        if self.budget > 0.0 {
            return self.filled;
        }
        self.filled + Duration::from_secs_f64((-self.budget + 1e-6) / limits.share)
    }
}

/// The counts of every connection and user with calls in the agent.
pub struct Admission<T> {
    limits: Limits,
    connections: HashMap<Arc<str>, Connection<T>>,
    users: HashMap<u32, User<T>>,
    /// Users with calls waiting and a turn of their own free, in the order they are served.
    rotation: VecDeque<u32>,
    running_for_others: usize,
    unidentified_bytes: usize,
    gone: HashSet<Arc<str>>,
    gone_order: VecDeque<Arc<str>>,
}

impl<T> Admission<T> {
    /// No calls yet, under `limits`.
    pub fn new(limits: Limits) -> Self {
        Admission {
            limits,
            connections: HashMap::new(),
            users: HashMap::new(),
            rotation: VecDeque::new(),
            running_for_others: 0,
            unidentified_bytes: 0,
            gone: HashSet::new(),
            gone_order: VecDeque::new(),
        }
    }

    /// A call of `bytes` from connection `sender` arrived at `now`.
    pub fn arrive(&mut self, sender: &str, bytes: usize, item: T, now: Instant) -> Vec<Step<T>> {
        if self.gone.contains(sender) {
            return vec![Step::Drop(item)];
        }
        if !self.connections.contains_key(sender) {
            if self.connections.len() >= self.limits.connections_kept {
                self.connections.retain(|_, c| c.counted > 0);
            }
            if self.connections.len() >= self.limits.connections_kept {
                return vec![refuse(item, "the agent is serving as many connections as it may")];
            }
            let name: Arc<str> = Arc::from(sender);
            let connection = Connection {
                name: Arc::clone(&name),
                identity: Identity::Unknown,
                counted: 0,
                unidentified: VecDeque::new(),
            };
            self.connections.insert(name, connection);
        }
        let caller = match &self.connections[sender].identity {
            Identity::Asking => return self.unidentified(sender, bytes, item),
            Identity::Known(caller) => Arc::clone(caller),
            // Not asked yet, or asked without an answer: this call asks. A refused call asks
            // nothing, and the connection's next call asks again.
            Identity::Unknown => {
                let steps = self.unidentified(sender, bytes, item);
                if matches!(steps.first(), Some(Step::Refuse { .. })) {
                    return steps;
                }
                let connection = self.connections.get_mut(sender).expect("known connection");
                connection.identity = Identity::Asking;
                return vec![Step::Ask(sender.to_owned())];
            }
        };
        self.known(sender, bytes, item, caller, now)
    }

    /// The bus said whose connection `sender` is (or why not): its calls go on.
    pub fn identified(
        &mut self,
        sender: &str,
        who: Result<Caller, Unknown>,
        now: Instant,
    ) -> Vec<Step<T>> {
        let (caller, identity) = match who {
            Ok(caller) => {
                let caller = Arc::new(caller);
                (Arc::clone(&caller), Identity::Known(caller))
            }
            Err(Unknown::Gone) => return self.gone(sender),
            // Not remembered: the connection's next call asks again.
            Err(Unknown::Failed(_)) => {
                (Arc::new(Caller { uid: UNKNOWN_USER, groups: None }), Identity::Unknown)
            }
        };
        let Some(connection) = self.connections.get_mut(sender) else { return Vec::new() };
        connection.identity = identity;
        let waiting = std::mem::take(&mut connection.unidentified);
        connection.counted -= waiting.len();
        let mut steps = Vec::new();
        for e in waiting {
            self.unidentified_bytes -= e.bytes;
            steps.extend(self.known(sender, e.bytes, e.item, Arc::clone(&caller), now));
        }
        steps
    }

    /// A call of connection `sender`, run as user `uid`, has been answered at `now`, after
    /// `took` (charged to the user's budget).
    pub fn finished(
        &mut self,
        sender: &str,
        uid: u32,
        took: Duration,
        now: Instant,
    ) -> Vec<Step<T>> {
        if let Some(connection) = self.connections.get_mut(sender) {
            connection.counted = connection.counted.saturating_sub(1);
        }
        if uid == 0 {
            return Vec::new();
        }
        self.running_for_others = self.running_for_others.saturating_sub(1);
        let limits = self.limits;
        if let Some(user) = self.users.get_mut(&uid) {
            user.running = user.running.saturating_sub(1);
            user.fill(&limits, now);
            user.budget -= took.clamp(limits.min_cost, limits.max_cost).as_secs_f64();
            if !user.waiting.is_empty() && !user.in_rotation {
                user.in_rotation = true;
                self.rotation.push_back(uid);
            }
        }
        let steps = self.next_turns(now);
        self.forget_idle_users();
        steps
    }

    /// Time has passed: users whose budget has filled again are served.
    pub fn tick(&mut self, now: Instant) -> Vec<Step<T>> {
        self.next_turns(now)
    }

    /// When a waiting call can be started next, if one can while turns are free: the
    /// soonest that a user in rotation has their budget filled (at once when it already is).
    pub fn next_wake(&self) -> Option<Instant> {
        if self.running_for_others >= self.limits.running_for_others {
            return None; // The next turn comes with a call's end.
        }
        self.rotation
            .iter()
            .filter_map(|uid| self.users.get(uid))
            .filter(|u| u.running < self.limits.running_per_user && !u.waiting.is_empty())
            .map(|u| u.ready_at(&self.limits))
            .min()
    }

    /// Connection `sender` has left the bus: its calls that have not started are dropped,
    /// and calls it still sends are dropped as they arrive.
    pub fn gone(&mut self, sender: &str) -> Vec<Step<T>> {
        let name: Arc<str> = match self.connections.remove(sender) {
            Some(connection) => {
                let mut steps = Vec::new();
                for e in connection.unidentified {
                    self.unidentified_bytes -= e.bytes;
                    steps.push(Step::Drop(e.item));
                }
                if let Identity::Known(caller) = &connection.identity
                    && let Some(user) = self.users.get_mut(&caller.uid)
                {
                    let (left, theirs): (VecDeque<_>, VecDeque<_>) =
                        std::mem::take(&mut user.waiting)
                            .into_iter()
                            .partition(|(e, _)| *e.sender != *sender);
                    user.waiting = left;
                    for (e, _) in theirs {
                        user.waiting_bytes -= e.bytes;
                        steps.push(Step::Drop(e.item));
                    }
                }
                self.remember_gone(connection.name);
                self.forget_idle_users();
                return steps;
            }
            None => Arc::from(sender),
        };
        self.remember_gone(name);
        Vec::new()
    }

    /// The counts, for the agent's trace log.
    pub fn describe(&self) -> String {
        let users: Vec<String> = self
            .users
            .iter()
            .map(|(uid, u)| {
                format!(
                    "{uid}: running {} waiting {} budget {:.3} rotation {}",
                    u.running,
                    u.waiting.len(),
                    u.budget,
                    u.in_rotation
                )
            })
            .collect();
        format!(
            "others running {}, rotation {:?}, users [{}]",
            self.running_for_others,
            self.rotation,
            users.join("; ")
        )
    }

    /// Calls waiting for their turn.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.users.values().map(|u| u.waiting.len()).sum::<usize>()
            + self.connections.values().map(|c| c.unidentified.len()).sum::<usize>()
    }

    fn unidentified(&mut self, sender: &str, bytes: usize, item: T) -> Vec<Step<T>> {
        let limits = self.limits;
        let connection = self.connections.get_mut(sender).expect("known connection");
        if connection.unidentified.len() >= limits.unidentified_per_connection
            || self.unidentified_bytes + bytes > limits.unidentified_bytes
        {
            return vec![refuse(item, "too many calls wait for the bus to say whose they are")];
        }
        connection.counted += 1;
        self.unidentified_bytes += bytes;
        connection.unidentified.push_back(Entry {
            sender: Arc::clone(&connection.name),
            bytes,
            item,
        });
        Vec::new()
    }

    fn known(
        &mut self,
        sender: &str,
        bytes: usize,
        item: T,
        caller: Arc<Caller>,
        now: Instant,
    ) -> Vec<Step<T>> {
        let limits = self.limits;
        let connection = self.connections.get_mut(sender).expect("known connection");
        let bound =
            if caller.uid == 0 { limits.root_per_connection } else { limits.per_connection };
        if connection.counted >= bound {
            return vec![refuse(
                item,
                "too many calls of this connection are waiting for an answer; wait for them",
            )];
        }
        if caller.uid == 0 {
            connection.counted += 1;
            return vec![Step::Run { item, caller }];
        }
        let name = Arc::clone(&connection.name);
        let user = self.users.entry(caller.uid).or_insert_with(|| User::new(&limits, now));
        user.fill(&limits, now);
        let free = user.running < limits.running_per_user
            && self.running_for_others < limits.running_for_others
            && user.budget > 0.0;
        if free && user.waiting.is_empty() {
            connection.counted += 1;
            user.running += 1;
            self.running_for_others += 1;
            return vec![Step::Run { item, caller }];
        }
        if user.waiting.len() >= limits.waiting_per_user
            || user.waiting_bytes + bytes > limits.waiting_bytes_per_user
        {
            return vec![refuse(
                item,
                "too many calls of this user are waiting for an answer; wait for them",
            )];
        }
        connection.counted += 1;
        user.waiting_bytes += bytes;
        let uid = caller.uid;
        user.waiting.push_back((Entry { sender: name, bytes, item }, caller));
        if user.running < limits.running_per_user && !user.in_rotation {
            user.in_rotation = true;
            self.rotation.push_back(uid);
        }
        self.next_turns(now)
    }

    /// Starts waiting calls while turns are free, one per user in rotation; a user whose
    /// budget is spent keeps their place until it fills ([`Admission::next_wake`]).
    fn next_turns(&mut self, now: Instant) -> Vec<Step<T>> {
        let limits = self.limits;
        let mut steps = Vec::new();
        let mut spent = Vec::new();
        while self.running_for_others < limits.running_for_others {
            let Some(uid) = self.rotation.pop_front() else { break };
            let Some(user) = self.users.get_mut(&uid) else { continue };
            if user.running >= limits.running_per_user {
                user.in_rotation = false;
                continue;
            }
            user.fill(&limits, now);
            if user.budget <= 0.0 {
                spent.push(uid);
                continue;
            }
            let Some((entry, caller)) = user.waiting.pop_front() else {
                user.in_rotation = false;
                continue;
            };
            user.waiting_bytes -= entry.bytes;
            user.running += 1;
            self.running_for_others += 1;
            if !user.waiting.is_empty() && user.running < self.limits.running_per_user {
                self.rotation.push_back(uid);
            } else {
                user.in_rotation = false;
            }
            steps.push(Step::Run { item: entry.item, caller });
        }
        // Still in rotation, behind the others, for when their budget has filled.
        self.rotation.extend(spent);
        steps
    }

    fn remember_gone(&mut self, name: Arc<str>) {
        if self.gone.insert(Arc::clone(&name)) {
            self.gone_order.push_back(name);
        }
        while self.gone_order.len() > self.limits.connections_kept {
            if let Some(old) = self.gone_order.pop_front() {
                self.gone.remove(&old);
            }
        }
    }

    fn forget_idle_users(&mut self) {
        if self.users.len() > self.limits.connections_kept {
            self.users.retain(|_, u| u.running > 0 || !u.waiting.is_empty());
        }
    }
}

fn refuse<T>(item: T, why: &str) -> Step<T> {
    Step::Refuse { item, why: why.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One moment for the tests that do not look at time.
    fn t0() -> Instant {
        static T: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *T.get_or_init(Instant::now)
    }

    fn small() -> Limits {
        Limits {
            per_connection: 4,
            root_per_connection: 8,
            unidentified_per_connection: 2,
            unidentified_bytes: 100,
            running_per_user: 1,
            running_for_others: 2,
            waiting_per_user: 3,
            waiting_bytes_per_user: 50,
            connections_kept: 8,
            ..Limits::default()
        }
    }

    fn user(uid: u32) -> Result<Caller, Unknown> {
        Ok(Caller { uid, groups: None })
    }

    fn runs(steps: &[Step<u32>]) -> Vec<u32> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::Run { item, .. } => Some(*item),
                _ => None,
            })
            .collect()
    }

    fn refused(steps: &[Step<u32>]) -> usize {
        steps.iter().filter(|s| matches!(s, Step::Refuse { .. })).count()
    }

    #[test]
    fn a_new_connection_is_asked_about_once_and_its_calls_wait_for_the_answer() {
        let mut a = Admission::new(small());
        assert_eq!(a.arrive(":1.1", 10, 1, t0()), vec![Step::Ask(":1.1".into())]);
        assert_eq!(a.arrive(":1.1", 10, 2, t0()), vec![]);
        // A third unidentified call is over the connection's bound.
        assert_eq!(refused(&a.arrive(":1.1", 10, 3, t0())), 1);
        let steps = a.identified(":1.1", user(1000), t0());
        // One turn for the user: the first runs, the second waits.
        assert_eq!(runs(&steps), vec![1]);
        assert_eq!(a.waiting(), 1);
        assert_eq!(runs(&a.finished(":1.1", 1000, Duration::ZERO, t0())), vec![2]);
        assert_eq!(runs(&a.finished(":1.1", 1000, Duration::ZERO, t0())), Vec::<u32>::new());
        assert_eq!(a.waiting(), 0);
    }

    #[test]
    fn root_is_never_kept_waiting_by_others() {
        let mut a = Admission::new(small());
        a.arrive(":1.1", 1, 1, t0());
        a.identified(":1.1", user(1000), t0());
        for i in 0..3 {
            a.arrive(":1.1", 1, 10 + i, t0());
        }
        a.arrive(":1.9", 1, 99, t0());
        let steps = a.identified(":1.9", user(0), t0());
        assert_eq!(runs(&steps), vec![99]);
    }

    #[test]
    fn waiting_users_are_served_in_rotation() {
        let mut a =
            Admission::new(Limits { running_for_others: 1, waiting_per_user: 10, ..small() });
        a.arrive(":a", 1, 100, t0());
        assert_eq!(runs(&a.identified(":a", user(1), t0())), vec![100]);
        for i in 1..=5 {
            a.arrive(":a", 1, 100 + i, t0()); // three wait: per_connection 4 counts the running one
        }
        a.arrive(":b", 1, 200, t0());
        a.identified(":b", user(2), t0());
        a.arrive(":b", 1, 201, t0());
        // User 1's backlog of 3 does not put user 2's calls behind it.
        let mut order: Vec<u32> = Vec::new();
        let mut last = (":a", 1);
        for _ in 0..6 {
            let steps = a.finished(last.0, last.1, Duration::ZERO, t0());
            let next = runs(&steps);
            if next.is_empty() {
                break;
            }
            order.extend(&next);
            last = if next[0] >= 200 { (":b", 2) } else { (":a", 1) };
        }
        assert_eq!(order, vec![200, 101, 201, 102, 103]);
    }

    #[test]
    fn a_users_waiting_calls_and_bytes_are_bounded_across_connections() {
        let mut a = Admission::new(small());
        let mut refusals = 0;
        for c in 0..4 {
            let name = format!(":c{c}");
            a.arrive(&name, 1, c, t0());
            refusals += refused(&a.identified(&name, user(7), t0()));
            for i in 0..3 {
                refusals += refused(&a.arrive(&name, 1, 10 * c + i, t0()));
            }
        }
        // One running and three waiting for user 7, whatever the number of connections.
        assert_eq!(a.waiting(), 3);
        assert_eq!(refusals, 16 - 4);
        // Bytes: 50 per user.
        let mut b = Admission::new(Limits { running_per_user: 1, ..small() });
        b.arrive(":x", 1, 0, t0());
        b.identified(":x", user(8), t0());
        assert_eq!(refused(&b.arrive(":x", 30, 1, t0())), 0);
        assert_eq!(refused(&b.arrive(":x", 30, 2, t0())), 1);
    }

    #[test]
    fn a_sender_that_has_gone_costs_nothing_more() {
        let mut a = Admission::new(small());
        a.arrive(":g", 1, 1, t0());
        a.arrive(":g", 1, 2, t0());
        let steps = a.identified(":g", Err(Unknown::Gone), t0());
        assert_eq!(steps, vec![Step::Drop(1), Step::Drop(2)]);
        assert_eq!(a.arrive(":g", 1, 3, t0()), vec![Step::Drop(3)]);
        // Gone while its calls wait their turn: they are dropped, the running one ends.
        a.arrive(":h", 1, 10, t0());
        a.identified(":h", user(5), t0());
        a.arrive(":h", 1, 11, t0());
        a.arrive(":h", 1, 12, t0());
        assert_eq!(a.gone(":h"), vec![Step::Drop(11), Step::Drop(12)]);
        assert_eq!(a.waiting(), 0);
        assert!(a.finished(":h", 5, Duration::ZERO, t0()).is_empty());
    }

    #[test]
    fn after_a_failed_lookup_the_calls_are_an_unknown_users_and_the_next_one_asks_again() {
        let mut a = Admission::new(small());
        a.arrive(":f", 1, 1, t0());
        let steps = a.identified(":f", Err(Unknown::Failed("no answer".into())), t0());
        match &steps[..] {
            [Step::Run { item: 1, caller }] => assert_eq!(caller.uid, UNKNOWN_USER),
            other => panic!("{other:?}"),
        }
        assert_eq!(a.arrive(":f", 1, 2, t0()), vec![Step::Ask(":f".into())]);
        // The answer this time: the call goes on as that user's.
        assert_eq!(runs(&a.identified(":f", user(0), t0())), vec![2]);
    }

    #[test]
    fn a_connection_whose_first_call_was_refused_asks_with_its_next() {
        let mut a = Admission::new(small());
        assert_eq!(refused(&a.arrive(":1", 60, 1, t0())), 0);
        // Over the bytes of all unidentified calls: refused, and nothing asked.
        assert_eq!(
            a.arrive(":2", 60, 2, t0()),
            vec![Step::Refuse {
                item: 2,
                why: "too many calls wait for the bus to say whose they are".into()
            }]
        );
        a.identified(":1", user(3), t0());
        // Room again: the second connection's next call asks.
        assert_eq!(a.arrive(":2", 10, 3, t0()), vec![Step::Ask(":2".into())]);
        assert_eq!(runs(&a.identified(":2", user(4), t0())), vec![3]);
    }

    #[test]
    fn unidentified_bytes_are_bounded_over_all_connections() {
        let mut a = Admission::new(small());
        assert_eq!(refused(&a.arrive(":1", 60, 1, t0())), 0);
        assert_eq!(refused(&a.arrive(":2", 60, 2, t0())), 1);
        a.identified(":1", user(3), t0());
        assert_eq!(refused(&a.arrive(":2", 60, 3, t0())), 0);
    }

    #[test]
    fn a_user_whose_share_of_time_is_spent_waits_for_it_and_no_one_else_does() {
        let limits = Limits {
            running_per_user: 1,
            share: 0.25,
            burst: Duration::from_millis(10),
            min_cost: Duration::from_millis(1),
            max_cost: Duration::from_millis(100),
            ..small()
        };
        let mut a = Admission::new(limits);
        let t = t0();
        a.arrive(":a", 1, 1, t);
        assert_eq!(runs(&a.identified(":a", user(1), t)), vec![1]);
        a.arrive(":a", 1, 2, t);
        // The first call took 50 ms: 40 ms more than the budget held.
        assert!(runs(&a.finished(":a", 1, Duration::from_millis(50), t)).is_empty());
        let wake = a.next_wake().expect("user 1 waits for their budget");
        assert!(wake > t + Duration::from_millis(150) && wake < t + Duration::from_millis(170));
        // Another user is served meanwhile.
        a.arrive(":b", 1, 10, t);
        assert_eq!(runs(&a.identified(":b", user(2), t)), vec![10]);
        assert!(runs(&a.tick(t + Duration::from_millis(100))).is_empty());
        assert_eq!(runs(&a.tick(wake)), vec![2]);
        // What a call costs is bounded: a lock wait of a minute costs 100 ms.
        assert!(runs(&a.finished(":a", 1, Duration::from_secs(60), wake)).is_empty());
        a.arrive(":a", 1, 3, wake);
        let next = a.next_wake().unwrap();
        assert!(next <= wake + Duration::from_millis(401), "{:?}", next - wake);
    }
}

#[cfg(test)]
mod drain {
    use super::*;

    /// A user's backlog of calls each costing the most drains at the rate of their share,
    /// also while their calls over the bounds keep arriving (each refusal reads the budget).
    #[test]
    fn a_throttled_backlog_drains_at_its_share() {
        let limits = Limits::default();
        let mut a = Admission::new(limits);
        let mut now = Instant::now();
        a.arrive(":o", 1, 0u32, now);
        let mut running: Vec<u32> = Vec::new();
        for s in a.identified(":o", Ok(Caller { uid: 9, groups: None }), now) {
            if let Step::Run { item, .. } = s {
                running.push(item);
            }
        }
        for i in 1..64 {
            for s in a.arrive(":o", 1, i, now) {
                if let Step::Run { item, .. } = s {
                    running.push(item);
                }
            }
        }
        // The same user's second connection (its first call waits its turn too), whose
        // later calls are over the bounds.
        a.arrive(":p", 1, 1000, now);
        a.identified(":p", Ok(Caller { uid: 9, groups: None }), now);
        let start = now;
        let mut done = 0;
        while done < 65 && now < start + Duration::from_secs(120) {
            // Each running call takes 100 ms.
            now += Duration::from_millis(100);
            let finishing = std::mem::take(&mut running);
            for _ in &finishing {
                done += 1;
                for s in a.finished(":o", 9, Duration::from_millis(100), now) {
                    if let Step::Run { item, .. } = s {
                        running.push(item);
                    }
                }
            }
            // Nothing running: time passes a millisecond at a time, a call over the bounds
            // arriving each time (as a flooding client's does), and the door ticks when
            // the admission says.
            while running.is_empty() && done < 65 && now < start + Duration::from_secs(120) {
                now += Duration::from_millis(1);
                let refused = a.arrive(":p", 20 << 20, 999, now);
                assert!(matches!(refused[..], [Step::Refuse { .. }]));
                if a.next_wake().is_some_and(|wake| wake <= now) {
                    for s in a.tick(now) {
                        if let Step::Run { item, .. } = s {
                            running.push(item);
                        }
                    }
                }
            }
        }
        let took = now - start;
        assert_eq!(done, 65, "stalled after {took:?}");
        assert!(took < Duration::from_secs(40), "{took:?}");
    }
}
