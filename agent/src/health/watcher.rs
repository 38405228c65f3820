//! The health watcher (issue 42): one thread of its own that waits on the driver's events
//! in slices and, every poll interval, reads what no event carries (a GPU lost, pending
//! row remaps and page retirements, the recovery-action field) and runs the clean check.
//! Whatever the driver does, it never spins: a failing wait is logged once per distinct
//! error and retried after a backoff of 1 s doubling to 30 s, the polls going on meanwhile;
//! a driver that delivers no events at all leaves the watcher polling only.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::xid::{self, Reach};
use super::{Action, Cause, Health, Raised, Report};
use crate::gpu::{ErrorCode, GpuBackend, GpuEvent, GpuEventKind, HealthReading};
use crate::sys::procfs::ProcessIdentity;

/// The longest one wait on the driver's events lasts: how long a GPU reset (which frees
/// the event set) or the agent's stop waits for the watcher at most.
pub const WAIT_SLICE: Duration = Duration::from_millis(500);
/// The first wait after a failing event wait.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait after failing event waits.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The watcher's settings.
#[derive(Debug, Clone)]
pub struct WatchSettings {
    /// The GPUs to poll, by NVML index.
    pub gpus: Vec<u32>,
    /// How often the readings are polled and the clean check runs.
    pub poll: Duration,
}

/// A running watcher; stops (and joins its thread) when dropped.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Starts the watcher over `backend`, raising faults in `health`. Blocks for the first
/// round (the readings taken, the events registered for and what waits taken in), so that
/// what the driver says at start is known before the caller plans anything.
pub fn spawn(
    backend: Arc<dyn GpuBackend>,
    health: Arc<Health>,
    settings: WatchSettings,
) -> std::io::Result<Watcher> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let mut watch = Watch {
        backend,
        health,
        settings,
        stop: flag,
        events: true,
        backoff: None,
        retry_at: None,
        last_error: None,
    };
    watch.poll();
    watch.wait_once(Duration::ZERO);
    let thread =
        std::thread::Builder::new().name("gpushare-health".into()).spawn(move || watch.run())?;
    Ok(Watcher { stop, thread: Some(thread) })
}

struct Watch {
    backend: Arc<dyn GpuBackend>,
    health: Arc<Health>,
    settings: WatchSettings,
    stop: Arc<AtomicBool>,
    /// Whether the driver delivers events: false once it says it delivers none (polled
    /// only), true again when a GPU left out of the registration is back.
    events: bool,
    /// The wait after the last failing event wait, while they fail.
    backoff: Option<Duration>,
    /// When the next event wait may run, while they fail (the polls go on meanwhile).
    retry_at: Option<Instant>,
    /// The last failing wait's error, logged once.
    last_error: Option<String>,
}

impl Watch {
    fn run(mut self) {
        // The first poll ran in `spawn`.
        let mut last_poll = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            let due = self.retry_at.is_none_or(|at| Instant::now() >= at);
            if self.events && due {
                self.wait_once(WAIT_SLICE);
            } else {
                self.sleep(WAIT_SLICE);
            }
            if last_poll.elapsed() >= self.settings.poll {
                self.poll();
                last_poll = Instant::now();
            }
        }
    }

    /// Sleeps `d`, in slices, so that a stop is seen soon.
    fn sleep(&self, d: Duration) {
        let until = Instant::now() + d;
        while !self.stop.load(Ordering::Relaxed) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(WAIT_SLICE));
        }
    }

    /// One wait on the events, up to `slice`; [`Watch::events`] false when the driver
    /// delivers none. A failing wait sets when the next may run ([`Watch::retry_at`]); it
    /// never sleeps.
    fn wait_once(&mut self, slice: Duration) {
        match self.backend.wait_event(slice) {
            Ok(event) => {
                self.retry_at = None;
                if self.backoff.take().is_some() {
                    tracing::info!("the driver's events are watched again");
                    self.last_error = None;
                }
                self.health.set_events_note(self.unwatched_note());
                if let Some(event) = event {
                    self.on_event(&event);
                }
            }
            Err(e) if e.code == ErrorCode::NotSupported => {
                let note = format!(
                    "the driver delivers no events ({e}): polled every {} s",
                    self.settings.poll.as_secs_f64()
                );
                tracing::warn!("{note}");
                self.health.set_events_note(Some(note));
                self.events = false;
            }
            Err(e) => {
                let delay = self.backoff.map_or(FIRST_BACKOFF, |d| (d * 2).min(MAX_BACKOFF));
                self.backoff = Some(delay);
                self.retry_at = Some(Instant::now() + delay);
                let text = e.to_string();
                if self.last_error.as_deref() != Some(&text) {
                    tracing::warn!(
                        "waiting on the driver's events failed: {text}; trying again (every {} s at most)",
                        MAX_BACKOFF.as_secs()
                    );
                    self.last_error = Some(text.clone());
                }
                self.health
                    .set_events_note(Some(format!("waiting on the driver's events fails: {text}")));
            }
        }
    }

    /// What `status` says when some GPUs are not watched.
    fn unwatched_note(&self) -> Option<String> {
        let unwatched = self.backend.unwatched_gpus();
        (!unwatched.is_empty()).then(|| {
            let list: Vec<_> =
                unwatched.iter().map(|(gpu, why)| format!("GPU {gpu}: {why}")).collect();
            format!("events not watched on {}", list.join("; "))
        })
    }

    fn on_event(&self, event: &GpuEvent) {
        let gpu = event.gpu;
        let instance = event.gpu_instance.map(|gi| (gi, event.compute_instance));
        let (cause, action, what, instance) = match event.kind {
            GpuEventKind::Xid(number) => {
                let class = xid::classify(number);
                let Some(entry) = class.entry else {
                    // The table lacks it (a newer driver's): the operator hears of it.
                    self.health.informational();
                    tracing::warn!(
                        gpu,
                        xid = number,
                        "Xid {number} on GPU {gpu} is not in the Xid table: kept as informational"
                    );
                    return;
                };
                let name = entry.name;
                if class.action == Action::None {
                    self.health.informational();
                    tracing::info!(
                        gpu,
                        xid = number,
                        "Xid {number} on GPU {gpu} ({name}) asks for nothing: kept as informational"
                    );
                    return;
                }
                let what = format!("Xid {number} ({name})");
                let instance = if class.reach == Reach::Instance { instance } else { None };
                (Cause::Xid(number), class.action, what, instance)
            }
            GpuEventKind::DoubleBitEcc => (
                Cause::DoubleBitEcc,
                xid::ecc_action(true),
                "a double-bit ECC error".to_string(),
                None,
            ),
            GpuEventKind::SingleBitEcc => {
                self.health.informational();
                tracing::debug!(gpu, "a single-bit ECC error on GPU {gpu} (corrected)");
                return;
            }
            GpuEventKind::GpuUnavailable => {
                (Cause::Lost, Action::RebootNode, "the GPU is unavailable".to_string(), None)
            }
            GpuEventKind::RecoveryAction(value) => {
                self.recovery_action(gpu, value);
                return;
            }
            GpuEventKind::Other { event_type, data } => {
                self.health.informational();
                tracing::info!(
                    gpu,
                    "event {event_type:#x} (data {data}) on GPU {gpu}: kept as informational"
                );
                return;
            }
        };
        self.raise(Report::on_gpu(gpu, cause, action, what).within(instance));
    }

    fn raise(&self, report: Report) {
        let (gpu, what) = (report.gpu, report.what.clone());
        if self.health.raise(report) == Raised::Full {
            tracing::warn!(
                gpu,
                "{what} on GPU {gpu}: counted, not kept (the GPU has too many faults listed)"
            );
        }
    }

    /// The recovery-action field's value, from an event or a reading.
    fn recovery_action(&self, gpu: u32, value: u64) {
        match Action::from_recovery_field(value) {
            Some(Action::None) => {
                self.health.clear_level(gpu, Cause::RecoveryAction(0));
            }
            Some(action) => self.raise(Report::on_gpu(
                gpu,
                Cause::RecoveryAction(value),
                action,
                format!("the driver's recovery action {value}"),
            )),
            None => {
                self.health.informational();
                tracing::info!(
                    gpu,
                    "recovery action {value} on GPU {gpu} is not one nvml.h defines: kept as informational"
                );
            }
        }
    }

    fn poll(&mut self) {
        let mut back = false;
        for &gpu in &self.settings.gpus {
            let reading = self.backend.health_reading(gpu);
            back |= self.reading(gpu, &reading);
        }
        if back {
            // Waited on even where no GPU could be registered before (the next wait says
            // if there is still none).
            self.events = true;
        }
        for fault in self.health.clean_check(ProcessIdentity::runs) {
            tracing::info!(
                gpu = fault.gpu,
                "{}: cleared, every process that was on it has ended",
                fault.describe()
            );
        }
    }

    /// Raises or clears `gpu`'s level faults by its reading; true when the GPU is back on
    /// the bus and its events are registered for again.
    fn reading(&self, gpu: u32, r: &HealthReading) -> bool {
        let level = |on: Option<bool>, cause: Cause, action: Action, what: &str| match on {
            Some(true) => self.raise(Report::on_gpu(gpu, cause, action, what)),
            Some(false) => {
                self.health.clear_level(gpu, cause);
            }
            None => {}
        };
        if r.lost {
            let what = "the GPU is lost (fallen off the bus)";
            self.raise(Report::on_gpu(gpu, Cause::Lost, Action::RebootNode, what));
            return false;
        }
        let back = !self.health.clear_level(gpu, Cause::Lost).is_empty()
            && self.backend.unwatched_gpus().iter().any(|(g, _)| *g == gpu);
        if back {
            // Back on the bus: its events are registered for again.
            self.backend.watch_again();
        }
        level(
            r.row_remap_pending,
            Cause::RowRemapPending,
            Action::ResetGpu,
            "a row remap is pending",
        );
        level(
            r.row_remap_failure,
            Cause::RowRemapFailure,
            Action::DrainAndReset,
            "a row remap failed",
        );
        level(
            r.retired_pages_pending,
            Cause::RetiredPagesPending,
            Action::ResetGpu,
            "pages are pending retirement",
        );
        if let Some(value) = r.recovery_action {
            self.recovery_action(gpu, value);
        }
        back
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::catalog::MigProfile;
    use crate::gpu::{BackendKind, GpuError, MigModeActivation};
    use crate::node::{ComputeMode, GpuState};

    /// A driver whose every event wait fails; it logs its waits and readings in order.
    #[derive(Default)]
    struct FailingWaits {
        log: Mutex<Vec<&'static str>>,
    }

    impl FailingWaits {
        fn log(&self) -> Vec<&'static str> {
            self.log.lock().unwrap().clone()
        }
    }

    fn unused<T>() -> Result<T, GpuError> {
        Err(GpuError::new("unused", None, ErrorCode::NotSupported))
    }

    impl GpuBackend for FailingWaits {
        fn kind(&self) -> BackendKind {
            BackendKind::Simulated
        }
        fn observe(&self) -> Result<Vec<GpuState>, GpuError> {
            unused()
        }
        fn set_mig_mode(&self, _: u32, _: bool) -> Result<MigModeActivation, GpuError> {
            unused()
        }
        fn create_gpu_instance(&self, _: u32, _: &MigProfile, _: u8) -> Result<u32, GpuError> {
            unused()
        }
        fn create_compute_instance(&self, _: u32, _: u32, _: u8) -> Result<u32, GpuError> {
            unused()
        }
        fn destroy_compute_instance(&self, _: u32, _: u32, _: u32) -> Result<(), GpuError> {
            unused()
        }
        fn destroy_gpu_instance(&self, _: u32, _: u32) -> Result<(), GpuError> {
            unused()
        }
        fn set_compute_mode(&self, _: u32, _: ComputeMode) -> Result<(), GpuError> {
            unused()
        }
        fn reset_gpu(&self, _: u32) -> Result<(), GpuError> {
            unused()
        }
        fn wait_event(&self, _: Duration) -> Result<Option<GpuEvent>, GpuError> {
            self.log.lock().unwrap().push("wait");
            Err(GpuError::new("wait_event", None, ErrorCode::Unknown))
        }
        fn health_reading(&self, _: u32) -> HealthReading {
            self.log.lock().unwrap().push("poll");
            HealthReading::default()
        }
    }

    #[test]
    fn a_failing_wait_does_not_stop_the_polls() {
        let backend = Arc::new(FailingWaits::default());
        let settings = WatchSettings { gpus: vec![0], poll: Duration::from_millis(1) };
        let watcher = spawn(backend.clone(), Arc::new(Health::default()), settings).unwrap();
        // The first wait (in `spawn`) failed; the second comes after its backoff.
        while backend.log().iter().filter(|&&l| l == "wait").count() < 2 {
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(watcher);
        let log = backend.log();
        let waits: Vec<usize> = (0..log.len()).filter(|&i| log[i] == "wait").collect();
        let between = &log[waits[0] + 1..waits[1]];
        assert!(between.contains(&"poll"), "no poll while the wait backed off: {log:?}");
    }
}
