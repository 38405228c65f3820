//! The GPUs' health (issue 42): the faults the driver reports, kept in one registry that
//! every view reads (`status`, the clients, the metrics, the CDI spec and the other views,
//! the planner's refusals). [`watcher`] fills it from the driver's events and readings,
//! [`xid`] is the one table that says what each Xid asks for. A fault lies on a whole GPU
//! or on one MIG instance; every share there is unhealthy until it clears:
//!
//! - a *level* fault (a GPU lost, a pending row remap or page retirement, a remap failure,
//!   the driver's recovery action) lasts while the driver's reading says so;
//! - an *event* fault (an Xid, a double-bit ECC error, an MPS server that died) lasts until
//!   a GPU reset ([`Health::clear_after_reset`]) or, when it asks for nothing but an
//!   application restart, until the clean check: every process that was on the GPU or
//!   instance when it happened has ended ([`Health::clean_check`]);
//! - an Xid the table does not know, and a single-bit ECC error, are informational: logged
//!   and counted, never a fault.

pub mod watcher;
pub mod xid;

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use gpushare_proto::health::{FAULTS_PER_GPU_MAX, HealthFault};

use crate::sys::procfs::ProcessIdentity;
pub use xid::Action;

/// How many kinds of level fault there are (a GPU has at most one of each).
const LEVEL_KINDS: usize = 5;

/// What the driver reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// An Xid the table classifies.
    Xid(u64),
    /// A double-bit (uncorrectable) ECC error event.
    DoubleBitEcc,
    /// The GPU fell off the bus (NVML_ERROR_GPU_IS_LOST, or a GPU-unavailable event).
    Lost,
    /// A row remap waits for a GPU reset.
    RowRemapPending,
    /// A row remap failed.
    RowRemapFailure,
    /// Pages wait for retirement at a GPU reset.
    RetiredPagesPending,
    /// The driver's recovery-action field asks for something (its value).
    RecoveryAction(u64),
    /// An MPS server died, and its clients with it.
    MpsServerDied,
}

/// Every class, as the metrics label them (bounded: the label set is this list and the
/// GPU index).
pub const CLASSES: &[&str] = &[
    "xid",
    "double-bit-ecc",
    "gpu-lost",
    "row-remap-pending",
    "row-remap-failure",
    "retired-pages-pending",
    "recovery-action",
    "mps-server-died",
];

impl Cause {
    /// Its class, a stable label ([`CLASSES`]).
    pub fn class(self) -> &'static str {
        match self {
            Cause::Xid(_) => "xid",
            Cause::DoubleBitEcc => "double-bit-ecc",
            Cause::Lost => "gpu-lost",
            Cause::RowRemapPending => "row-remap-pending",
            Cause::RowRemapFailure => "row-remap-failure",
            Cause::RetiredPagesPending => "retired-pages-pending",
            Cause::RecoveryAction(_) => "recovery-action",
            Cause::MpsServerDied => "mps-server-died",
        }
    }

    /// Whether it lasts while a reading says so (rather than until a reset or the clean
    /// check).
    pub fn is_level(self) -> bool {
        matches!(
            self,
            Cause::Lost
                | Cause::RowRemapPending
                | Cause::RowRemapFailure
                | Cause::RetiredPagesPending
                | Cause::RecoveryAction(_)
        )
    }

    /// The same kind of cause (two Xids of different numbers are different faults; two
    /// recovery actions are one).
    fn same(self, other: Cause) -> bool {
        match (self, other) {
            (Cause::RecoveryAction(_), Cause::RecoveryAction(_)) => true,
            (a, b) => a == b,
        }
    }
}

/// One fault on a GPU or MIG instance.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// Its number, unique in this agent's run.
    pub id: u64,
    /// The GPU.
    pub gpu: u32,
    /// The GPU instance it is confined to; `None`: the whole GPU.
    pub gpu_instance: Option<u32>,
    /// The compute instance, with `gpu_instance`.
    pub compute_instance: Option<u32>,
    /// What the driver reported.
    pub cause: Cause,
    /// What it asks for.
    pub action: Action,
    /// In words, without the GPU: `Xid 79 (GPU has fallen off the bus)`.
    pub what: String,
    /// When the agent saw it.
    pub since: SystemTime,
    /// The processes that were on the GPU or instance, once the engine named them (the
    /// clean check waits for them); `None` until then.
    pub clients: Option<Vec<u32>>,
    /// Each named client as it ran when named: a process that takes a PID later is not the
    /// client. A client with no start time to read had ended already and is left out.
    starts: Vec<ProcessIdentity>,
}

impl Fault {
    /// Where it lies, for messages: `GPU 1`, `GPU 1 instance 3/0`.
    pub fn place(&self) -> String {
        match (self.gpu_instance, self.compute_instance) {
            (Some(gi), Some(ci)) => format!("GPU {} MIG instance {gi}/{ci}", self.gpu),
            (Some(gi), None) => format!("GPU {} MIG instance {gi}", self.gpu),
            _ => format!("GPU {}", self.gpu),
        }
    }

    /// One line for people: `GPU 1: Xid 79 (GPU has fallen off the bus): reboot the node`.
    pub fn describe(&self) -> String {
        format!("{}: {}", self.place(), self.describe_cause())
    }

    /// What happened and what it asks for, without the place: `Xid 79 (…): reboot the node`.
    pub fn describe_cause(&self) -> String {
        format!("{}: {}", self.what, self.action.describe())
    }

    /// Whether it makes a share on `gpu` (in `gpu_instance`, for a MIG device) unhealthy:
    /// a fault on the whole GPU makes every share on it so, one on an instance that
    /// instance's.
    pub fn covers(&self, gpu: u32, gpu_instance: Option<u32>) -> bool {
        self.gpu == gpu
            && match self.gpu_instance {
                None => true,
                Some(gi) => gpu_instance == Some(gi),
            }
    }

    /// The document `status` shows.
    pub fn document(&self) -> HealthFault {
        HealthFault {
            class: self.cause.class().to_string(),
            xid: match self.cause {
                Cause::Xid(xid) => Some(xid),
                _ => None,
            },
            action: self.action.as_str().to_string(),
            gpu_instance_id: self.gpu_instance,
            compute_instance_id: self.compute_instance,
            since_unix_seconds: self.since.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            detail: self.describe_cause(),
            clients: self.clients.clone(),
        }
    }
}

/// A fault as the watcher (or the engine) reports it, before the registry keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The GPU.
    pub gpu: u32,
    /// The GPU instance and compute instance it is confined to; `None`: the whole GPU.
    pub instance: Option<(u32, Option<u32>)>,
    /// What the driver reported.
    pub cause: Cause,
    /// What it asks for.
    pub action: Action,
    /// In words, without the GPU.
    pub what: String,
}

impl Report {
    /// A fault on the whole of `gpu`.
    pub fn on_gpu(gpu: u32, cause: Cause, action: Action, what: impl Into<String>) -> Self {
        Report { gpu, instance: None, cause, action, what: what.into() }
    }

    /// The same fault, confined to a MIG instance (`None`: the whole GPU).
    pub fn within(self, instance: Option<(u32, Option<u32>)>) -> Self {
        Report { instance, ..self }
    }
}

/// What raising a fault did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Raised {
    /// A new fault (its id).
    New(u64),
    /// The same fault was already there.
    Known,
    /// The GPU has [`FAULTS_PER_GPU_MAX`] faults: counted, not kept.
    Full,
}

/// The registry of faults, and the counts per class since the agent started.
#[derive(Debug)]
pub struct Health {
    inner: Mutex<Inner>,
    /// The generation after every change, for whoever follows the faults (the engine's
    /// views and journal lines); a watch channel keeps only the latest value, so it never
    /// grows.
    changed: tokio::sync::watch::Sender<u64>,
}

impl Default for Health {
    fn default() -> Self {
        Self { inner: Mutex::default(), changed: tokio::sync::watch::Sender::new(0) }
    }
}

#[derive(Debug, Default)]
struct Inner {
    faults: Vec<Fault>,
    next_id: u64,
    /// Faults raised, by class (every occurrence of an event; a level fault once per
    /// onset).
    totals: BTreeMap<&'static str, u64>,
    /// Events kept as informational (unknown Xids, single-bit ECC errors).
    informational: u64,
    /// Bumped at every change of `faults`: the views compare it.
    generation: u64,
    /// Why the driver's events are not watched, if they are not.
    events_note: Option<String>,
}

impl Health {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Follows the changes of the faults.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Tells the followers (after the lock is released).
    fn announce(&self, generation: u64) {
        self.changed.send_replace(generation);
    }

    /// Raises a fault (or counts the same one again).
    pub fn raise(&self, report: Report) -> Raised {
        let mut inner = self.lock();
        let before = inner.generation;
        let raised = Self::raise_locked(&mut inner, report);
        let generation = inner.generation;
        drop(inner);
        if generation != before {
            self.announce(generation);
        }
        raised
    }

    /// [`Health::raise`] under the lock; the caller announces.
    fn raise_locked(inner: &mut Inner, report: Report) -> Raised {
        let Report { gpu, instance, cause, action, what } = report;
        let (gpu_instance, compute_instance) = match instance {
            Some((gi, ci)) => (Some(gi), ci),
            None => (None, None),
        };
        let known = inner.faults.iter_mut().find(|f| {
            f.gpu == gpu
                && f.gpu_instance == gpu_instance
                && f.compute_instance == compute_instance
                && f.cause.same(cause)
        });
        if let Some(fault) = known {
            if fault.cause == cause {
                if !cause.is_level() {
                    *inner.totals.entry(cause.class()).or_default() += 1;
                }
                return Raised::Known;
            }
            // A recovery action that changed: the new one replaces it.
            fault.cause = cause;
            fault.action = action;
            fault.what = what;
            *inner.totals.entry(cause.class()).or_default() += 1;
            inner.generation += 1;
            return Raised::Known;
        }
        *inner.totals.entry(cause.class()).or_default() += 1;
        // Level faults are a handful per GPU at most (one per kind) and always kept; events
        // beyond the bound are counted.
        let events = inner.faults.iter().filter(|f| f.gpu == gpu && !f.cause.is_level()).count();
        if !cause.is_level() && events >= FAULTS_PER_GPU_MAX - LEVEL_KINDS {
            return Raised::Full;
        }
        inner.next_id += 1;
        let id = inner.next_id;
        inner.faults.push(Fault {
            id,
            gpu,
            gpu_instance,
            compute_instance,
            cause,
            action,
            what,
            since: SystemTime::now(),
            clients: None,
            starts: Vec::new(),
        });
        inner.generation += 1;
        Raised::New(id)
    }

    /// [`Health::raise`] with the processes it hit already known (a dead MPS server's
    /// clients, as the check before saw them): named before anyone reads the fault.
    pub fn raise_with_clients(&self, report: Report, pids: Vec<u32>) -> Raised {
        let starts: Vec<_> = pids.iter().copied().filter_map(ProcessIdentity::of).collect();
        let mut inner = self.lock();
        let before = inner.generation;
        let raised = Self::raise_locked(&mut inner, report);
        if let Raised::New(id) = raised
            && let Some(fault) = inner.faults.iter_mut().find(|f| f.id == id)
        {
            fault.clients = Some(pids);
            fault.starts = starts;
        }
        let generation = inner.generation;
        drop(inner);
        if generation != before {
            self.announce(generation);
        }
        raised
    }

    /// Counts an informational event.
    pub fn informational(&self) {
        self.lock().informational += 1;
    }

    /// Ends the level fault of `cause`'s kind on `gpu`, if any (its reading cleared).
    pub fn clear_level(&self, gpu: u32, cause: Cause) -> Vec<Fault> {
        self.remove(|f| f.gpu == gpu && f.cause.is_level() && f.cause.same(cause))
    }

    /// Ends what a reset of `gpu` repairs: every event fault on it, and its level faults
    /// but a lost GPU (the next reading raises again what is still there).
    pub fn clear_after_reset(&self, gpu: u32) -> Vec<Fault> {
        self.remove(|f| f.gpu == gpu && f.cause != Cause::Lost)
    }

    /// The clean check: ends the faults that ask only for an application restart once
    /// every process named on them has ended (`runs` says whether one still runs). `runs`
    /// reads `/proc`: it is asked outside the registry's lock.
    pub fn clean_check(&self, runs: impl Fn(&ProcessIdentity) -> bool) -> Vec<Fault> {
        let named: Vec<(u64, Vec<ProcessIdentity>)> = self
            .lock()
            .faults
            .iter()
            .filter(|f| f.action == Action::RestartApplication && f.clients.is_some())
            .map(|f| (f.id, f.starts.clone()))
            .collect();
        let ended: Vec<_> =
            named.into_iter().filter(|(_, starts)| !starts.iter().any(&runs)).collect();
        if ended.is_empty() {
            return Vec::new();
        }
        // Those named again meanwhile are checked at the next round.
        self.remove(|f| ended.iter().any(|(id, starts)| f.id == *id && f.starts == *starts))
    }

    fn remove(&self, which: impl Fn(&Fault) -> bool) -> Vec<Fault> {
        let mut inner = self.lock();
        let gone: Vec<_> = inner.faults.extract_if(.., |f| which(f)).collect();
        if !gone.is_empty() {
            inner.generation += 1;
            let generation = inner.generation;
            drop(inner);
            self.announce(generation);
        }
        gone
    }

    /// Names the processes that were on a fault's GPU or instance (what the clean check
    /// waits for).
    pub fn name_clients(&self, id: u64, pids: Vec<u32>) {
        let starts = pids.iter().copied().filter_map(ProcessIdentity::of).collect();
        let mut inner = self.lock();
        if let Some(fault) = inner.faults.iter_mut().find(|f| f.id == id) {
            fault.clients = Some(pids);
            fault.starts = starts;
        }
    }

    /// Every fault, oldest first.
    pub fn faults(&self) -> Vec<Fault> {
        self.lock().faults.clone()
    }

    /// The faults on `gpu` (the whole GPU's and its instances').
    pub fn faults_on(&self, gpu: u32) -> Vec<Fault> {
        self.lock().faults.iter().filter(|f| f.gpu == gpu).cloned().collect()
    }

    /// The first fault that makes a share on `gpu` (in `gpu_instance`) unhealthy.
    pub fn blocking(&self, gpu: u32, gpu_instance: Option<u32>) -> Option<Fault> {
        self.lock().faults.iter().find(|f| f.covers(gpu, gpu_instance)).cloned()
    }

    /// Faults raised per class since the agent started, and the informational events.
    pub fn totals(&self) -> (BTreeMap<&'static str, u64>, u64) {
        let inner = self.lock();
        (inner.totals.clone(), inner.informational)
    }

    /// Bumped at every change of the faults.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Says why the driver's events are not watched (`None`: they are).
    pub fn set_events_note(&self, note: Option<String>) {
        self.lock().events_note = note;
    }

    /// Why the driver's events are not watched, if so.
    pub fn events_note(&self) -> Option<String> {
        self.lock().events_note.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn application_fault(health: &Health, gpu: u32) -> u64 {
        let report = Report::on_gpu(gpu, Cause::Xid(13), Action::RestartApplication, "Xid 13");
        let Raised::New(id) = health.raise(report) else { panic!("not raised") };
        id
    }

    #[test]
    fn the_clean_check_reads_the_processes_outside_the_lock() {
        let health = Health::default();
        let id = application_fault(&health, 0);
        health.name_clients(id, vec![std::process::id()]);
        let before = health.generation();
        let runs = |_: &ProcessIdentity| {
            assert!(health.inner.try_lock().is_ok(), "asked under the registry's lock");
            true
        };
        assert!(health.clean_check(runs).is_empty(), "its client runs");
        let gone = health.clean_check(|_| false);
        assert_eq!(gone.iter().map(|f| f.id).collect::<Vec<_>>(), vec![id]);
        assert!(health.faults().is_empty());
        assert_eq!(health.generation(), before + 1);
    }

    #[test]
    fn a_fault_raised_again_with_its_clients_tells_no_follower() {
        let health = Health::default();
        let report = Report::on_gpu(0, Cause::MpsServerDied, Action::RestartApplication, "died");
        let pids = vec![std::process::id()];
        assert!(matches!(health.raise_with_clients(report.clone(), pids.clone()), Raised::New(_)));
        let mut follower = health.subscribe();
        follower.mark_unchanged();
        assert_eq!(health.raise_with_clients(report, pids), Raised::Known);
        assert!(!follower.has_changed().unwrap(), "told of a change that did not happen");
    }

    #[test]
    fn a_fault_reads_the_same_in_a_line_and_in_status() {
        let health = Health::default();
        let report = Report::on_gpu(1, Cause::Xid(79), Action::RebootNode, "Xid 79 (lost)");
        health.raise(report.within(Some((3, Some(0)))));
        let fault = &health.faults()[0];
        assert_eq!(
            fault.describe(),
            format!("GPU 1 MIG instance 3/0: {}", fault.document().detail)
        );
        assert_eq!(
            fault.document().detail,
            format!("Xid 79 (lost): {}", Action::RebootNode.describe())
        );
    }

    #[test]
    fn nothing_removed_leaves_the_faults_and_the_generation_as_they_were() {
        let health = Health::default();
        let id = application_fault(&health, 0);
        let before = (health.faults(), health.generation());
        assert!(health.clear_level(0, Cause::Lost).is_empty());
        assert!(health.clear_after_reset(1).is_empty());
        // Not named yet: the clean check waits.
        assert!(health.clean_check(|_| false).is_empty());
        assert_eq!((health.faults(), health.generation()), before);
        assert_eq!(health.clear_after_reset(0).iter().map(|f| f.id).collect::<Vec<_>>(), vec![id]);
    }
}
