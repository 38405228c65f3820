//! Where calls enter: the one task that reads every method call sent to the agent, on
//! every interface it serves, reads it into a typed [`Call`] ([`calls::parse`]), counts it
//! against its connection and user ([`Admission`]) and starts it, keeps it waiting, or
//! refuses it, all before anything awaits. Nothing else reads the agent's method calls:
//! zbus's object server is not used, so no call becomes a task, or holds memory, that the
//! door did not count.
//!
//! The door's loop awaits only its inputs: the calls, the bus's `NameOwnerChanged` (a
//! caller that left costs nothing more) and its own events (a lookup of whose a
//! connection is, a call answered). Answers it gives at once (refusals, malformed calls)
//! are built on the spot, the call's message dropped, and sent by one task from a bounded
//! queue; while that queue is full the door waits for room before it reads the next call
//! (the flood is held back in the bus, every caller's answer is kept).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::mpsc;
use zbus::message::Type;
use zbus::{Connection, MatchRule, Message, MessageStream};

use super::Service;
use super::admission::{Admission, Caller, Limits, Step, Unknown};
use super::calls::{self, Call};
use super::departures::Departures;
use super::errors::Failure;

/// Method calls zbus may hold for the door before its socket reader waits (the door
/// takes each at once: this is a buffer, not a queue of work; at most this many messages
/// of up to the bus's size limit are held in it).
const CALLS_QUEUED: usize = 64;
/// Answers given at once waiting to be written; while it is full, the door waits.
const ANSWERS_QUEUED: usize = 16384;
/// How often the door logs what it refused, at most.
const REPORT_EVERY: Duration = Duration::from_secs(60);
/// Bytes of calls read since the heap was last trimmed after which, once calls have been
/// quiet for [`TRIM_AFTER`], the free memory of the heap is given back.
const TRIM_BYTES: usize = 32 << 20;
const TRIM_AFTER: Duration = Duration::from_secs(1);

/// A counted call.
struct Pending {
    msg: Message,
    call: Call,
}

enum Event {
    Identified(String, Result<Caller, Unknown>),
    /// A call of the connection, run as the user, ended after the time given.
    Finished {
        sender: String,
        uid: u32,
        took: Duration,
    },
}

/// Starts reading the calls sent to `connection`'s owner and serving them with `service`.
/// Call before the agent's name is requested, so that no call finds nobody reading.
/// Connections that leave the bus are told to the service's departures.
pub async fn open(connection: &Connection, service: Arc<Service>) -> zbus::Result<()> {
    let mut rule = MatchRule::builder().msg_type(Type::MethodCall);
    if let Some(name) = connection.unique_name() {
        rule = rule.destination(name.as_str())?;
    }
    let calls = MessageStream::for_match_rule(rule.build(), connection, Some(CALLS_QUEUED)).await?;
    let left = MatchRule::builder()
        .msg_type(Type::Signal)
        .sender("org.freedesktop.DBus")?
        .interface("org.freedesktop.DBus")?
        .member("NameOwnerChanged")?
        .arg(2, "")?
        .build();
    let left = MessageStream::for_match_rule(left, connection, Some(CALLS_QUEUED)).await?;
    let (answers, queued) = mpsc::channel::<Message>(ANSWERS_QUEUED);
    tokio::spawn(send_answers(connection.clone(), queued));
    let (events, happened) = mpsc::unbounded_channel();
    let door = Door {
        connection: connection.clone(),
        departures: Arc::clone(&service.departures),
        service,
        admission: Admission::new(Limits::default()),
        events,
        answers,
        outbox: Vec::new(),
        refused: 0,
        reported: Instant::now(),
        read_since_trim: 0,
        last_call: Instant::now(),
    };
    tokio::spawn(door.run(calls, left, happened));
    Ok(())
}

struct Door {
    connection: Connection,
    service: Arc<Service>,
    departures: Arc<Departures>,
    admission: Admission<Pending>,
    events: mpsc::UnboundedSender<Event>,
    answers: mpsc::Sender<Message>,
    /// Immediate answers of this turn of the loop, queued at its end.
    outbox: Vec<Message>,
    refused: u64,
    reported: Instant,
    /// Bytes of calls read since the heap was last trimmed, and when the last came.
    read_since_trim: usize,
    last_call: Instant,
}

impl Door {
    async fn run(
        mut self,
        mut calls: MessageStream,
        mut left: MessageStream,
        mut happened: mpsc::UnboundedReceiver<Event>,
    ) {
        loop {
            // A user whose share of time is spent is served again when it has filled; after
            // a flood, the heap is trimmed once calls are quiet.
            let trim = (self.read_since_trim >= TRIM_BYTES).then(|| self.last_call + TRIM_AFTER);
            let wake = match (self.admission.next_wake(), trim) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
            .map(tokio::time::Instant::from_std);
            tokio::select! {
                biased;
                Some(event) = happened.recv() => {
                    let now = Instant::now();
                    let steps = match event {
                        Event::Identified(sender, who) => {
                            if let Err(Unknown::Failed(why)) = &who {
                                tracing::debug!(caller = %sender, "served as an unknown user: {why}");
                            }
                            self.admission.identified(&sender, who, now)
                        }
                        Event::Finished { sender, uid, took } => {
                            self.admission.finished(&sender, uid, took, now)
                        }
                    };
                    self.carry_out(steps);
                }
                () = sleep_until(wake) => {
                    let now = Instant::now();
                    if self.read_since_trim >= TRIM_BYTES && now >= self.last_call + TRIM_AFTER {
                        self.read_since_trim = 0;
                        tokio::task::spawn_blocking(crate::sys::unix::trim_heap);
                    }
                    let steps = self.admission.tick(now);
                    self.carry_out(steps);
                }
                Some(signal) = left.next() => {
                    // The bus's own signal only (the match rule says so; checked here too).
                    if let Ok(signal) = signal
                        && signal.header().sender().is_some_and(|s| s.as_str() == "org.freedesktop.DBus")
                        && let Ok((name, _old, new)) = signal.body().deserialize::<(&str, &str, &str)>()
                        && new.is_empty()
                        && name.starts_with(':')
                    {
                        self.departures.left(name);
                        let steps = self.admission.gone(name);
                        self.carry_out(steps);
                    }
                }
                call = calls.next() => match call {
                    Some(Ok(msg)) => self.arrive(msg),
                    Some(Err(e)) => tracing::debug!("unreadable call: {e}"),
                    None => break,
                },
            }
            for answer in self.outbox.drain(..) {
                if self.answers.send(answer).await.is_err() {
                    return;
                }
            }
            self.report();
        }
    }

    /// A call arrived: read, counted, and started, kept or refused.
    fn arrive(&mut self, msg: Message) {
        self.read_since_trim += msg.data().len();
        self.last_call = Instant::now();
        let header = msg.header();
        let Some(sender) = header.sender().map(|s| s.to_string()) else {
            return; // Only a peer-to-peer connection has none; the agent serves a bus.
        };
        let call = match calls::parse(&msg) {
            Ok(call) => call,
            Err(why) => {
                if !calls::no_reply_expected(&msg) {
                    self.answer_now(&msg, &why);
                }
                return;
            }
        };
        // A call nobody waits for that does nothing but answer has nothing to do.
        if calls::no_reply_expected(&msg) && !call.acts() {
            return;
        }
        // The message, and the copy of its strings in the call.
        let bytes = 2 * msg.data().len() + std::mem::size_of::<Pending>();
        let steps = self.admission.arrive(&sender, bytes, Pending { msg, call }, Instant::now());
        self.carry_out(steps);
    }

    fn carry_out(&mut self, steps: Vec<Step<Pending>>) {
        for step in steps {
            match step {
                Step::Run { item, caller } => self.start(item, caller),
                Step::Ask(sender) => self.ask(sender),
                Step::Refuse { item, why } => {
                    self.refused += 1;
                    if !calls::no_reply_expected(&item.msg) {
                        self.answer_now(&item.msg, &Failure::limits(why));
                    }
                }
                Step::Drop(_) => {}
            }
        }
    }

    /// Answers `msg` with `failure` from the queue of immediate answers (the call's own
    /// message is dropped once the answer is built).
    fn answer_now(&mut self, msg: &Message, failure: &Failure) {
        match failure.reply(&msg.header()) {
            Ok(answer) => self.outbox.push(answer),
            Err(e) => tracing::debug!("cannot build an answer: {e}"),
        }
    }

    /// Asks the bus whose connection `sender` is; the answer comes back as an event.
    fn ask(&self, sender: String) {
        let connection = self.connection.clone();
        let events = self.events.clone();
        tokio::spawn(async move {
            let who = credentials(&connection, &sender).await;
            let _ = events.send(Event::Identified(sender, who));
        });
    }

    /// Runs a counted call; its end is told to the door however the task ends.
    fn start(&self, pending: Pending, caller: Arc<Caller>) {
        let service = Arc::clone(&self.service);
        let connection = self.connection.clone();
        let sender = pending.msg.header().sender().map(|s| s.to_string()).unwrap_or_default();
        let done =
            Done { events: self.events.clone(), sender, uid: caller.uid, started: Instant::now() };
        tokio::spawn(async move {
            let Pending { msg, call } = pending;
            let quiet = calls::no_reply_expected(&msg);
            let answer = service.handle(call, &caller, &done.sender).await;
            if !quiet {
                let header = msg.header();
                let sent = match answer {
                    Ok(answer) => answer.send(&connection, &header).await,
                    Err(failure) => match failure.reply(&header) {
                        Ok(reply) => connection.send(&reply).await,
                        Err(e) => Err(e),
                    },
                };
                if let Err(e) = sent {
                    tracing::debug!("answer not sent: {e}");
                }
            }
            drop(done);
        });
    }

    /// Logs, at most once a minute, how many calls were refused.
    fn report(&mut self) {
        if self.refused == 0 || self.reported.elapsed() < REPORT_EVERY {
            return;
        }
        tracing::warn!(
            refused = self.refused,
            "calls over their bounds were refused (too many at once from one connection or user); now {}",
            self.admission.describe()
        );
        self.refused = 0;
        self.reported = Instant::now();
    }
}

/// Tells the door that a call has been answered, when dropped (also by a panic).
struct Done {
    events: mpsc::UnboundedSender<Event>,
    sender: String,
    uid: u32,
    started: Instant,
}

impl Drop for Done {
    fn drop(&mut self) {
        let _ = self.events.send(Event::Finished {
            sender: std::mem::take(&mut self.sender),
            uid: self.uid,
            took: self.started.elapsed(),
        });
    }
}

/// Resolves at `wake`; never when there is none.
async fn sleep_until(wake: Option<tokio::time::Instant>) {
    match wake {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Writes the immediate answers, one after another.
async fn send_answers(connection: Connection, mut queued: mpsc::Receiver<Message>) {
    while let Some(answer) = queued.recv().await {
        if let Err(e) = connection.send(&answer).await {
            tracing::debug!("answer not sent: {e}");
        }
    }
}

/// Whose connection `sender` is, as the bus says (`GetConnectionCredentials`). The agent's
/// connection has a method timeout, so a bus that does not answer fails the lookup.
async fn credentials(connection: &Connection, sender: &str) -> Result<Caller, Unknown> {
    let Ok(name) = zbus::names::UniqueName::try_from(sender) else {
        return Err(Unknown::Failed(format!("{sender:?} is no unique bus name")));
    };
    let asked = async {
        let dbus = zbus::fdo::DBusProxy::new(connection).await?;
        dbus.get_connection_credentials(zbus::names::BusName::Unique(name)).await
    };
    match asked.await {
        Ok(credentials) => match credentials.unix_user_id() {
            Some(uid) => {
                Ok(Caller { uid, groups: credentials.unix_group_ids().map(|g| g.to_vec()) })
            }
            None => Err(Unknown::Failed("the bus did not say which user is calling".into())),
        },
        Err(zbus::fdo::Error::NameHasNoOwner(_)) => Err(Unknown::Gone),
        Err(e) => Err(Unknown::Failed(format!(
            "the bus did not say which user is calling ({e}); try again"
        ))),
    }
}
