//! What the engine tells whoever listens (the metrics exporter, the systemd notifier):
//! typed events, so that the engine needs to know none of them. A listener either
//! subscribes to a broadcast channel (and may do I/O at its own pace), or observes events
//! as they are sent, on the engine's own task, for what must keep the engine's order
//! (counting an apply before anyone can see its profile active) and takes no time.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use gpushare_proto::types::ProbeReport;
use tokio::sync::broadcast;

use super::job_kind::{JobKind, JobResult};

/// Events a slow listener may fall behind by before it misses some (it is then told how
/// many it missed and can refresh from the engine).
const CAPACITY: usize = 256;

/// Something that happened in the engine.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    /// A job took the apply lock, was planned, and begins its steps.
    JobStarted {
        /// What it does.
        kind: JobKind,
        /// Steps planned.
        steps: u32,
    },
    /// An apply ended.
    ApplyFinished {
        /// The profile.
        profile: String,
        /// How it ended.
        result: JobResult,
        /// Its wall time.
        duration: Duration,
    },
    /// A probe ended.
    ProbeFinished {
        /// The device probed.
        target: String,
        /// What it measured; `None` when it failed.
        report: Option<Box<ProbeReport>>,
    },
    /// A job released the apply lock: the GPUs may have changed.
    JobEnded {
        /// What it did.
        kind: JobKind,
    },
    /// The periodic health check of the MPS servers ran (or was skipped while a job ran).
    HealthChecked,
    /// An MPS server's limits were changed on request (`mps limit`).
    MpsChanged,
    /// The GPUs' faults changed (issue 42): one was raised or cleared.
    HealthChanged,
}

/// A function called with every event as it is sent.
type Observer = Box<dyn Fn(&EngineEvent) + Send + Sync>;

/// The sending side of the engine's events; clones send to the same listeners.
#[derive(Clone)]
pub struct Events {
    sender: broadcast::Sender<EngineEvent>,
    observers: Arc<RwLock<Vec<Observer>>>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").field("subscribers", &self.sender.receiver_count()).finish()
    }
}

impl Events {
    /// Events nobody listens to yet.
    pub fn new() -> Self {
        Events { sender: broadcast::channel(CAPACITY).0, observers: Arc::default() }
    }

    /// Sends `event` to every observer, then to every subscriber; with none, it is
    /// dropped.
    pub fn emit(&self, event: EngineEvent) {
        for observe in self.observers.read().unwrap_or_else(PoisonError::into_inner).iter() {
            observe(&event);
        }
        let _ = self.sender.send(event);
    }

    /// Calls `observer` with every event from now on, as it is sent. It runs on the
    /// engine's task, inside the engine's own locks: it must return at once (no I/O, no
    /// locks held for long) and must not call back into the engine or its events.
    pub fn observe(&self, observer: impl Fn(&EngineEvent) + Send + Sync + 'static) {
        self.observers.write().unwrap_or_else(PoisonError::into_inner).push(Box::new(observer));
    }

    /// A new listener, which receives every event sent from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<EngineEvent> {
        self.sender.subscribe()
    }
}

impl Default for Events {
    fn default() -> Self {
        Self::new()
    }
}
