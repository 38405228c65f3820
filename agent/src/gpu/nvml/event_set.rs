//! The state of the health watcher's NVML event set, held by the backend's session
//! ([`super::session::NvmlBackend`]) and used by [`super::events`]: the set itself, whether a
//! reset suspends it, the GPUs left out and the registered handles' indexes.

use std::sync::{Mutex, MutexGuard, PoisonError};

use nvml_wrapper_sys::bindings::nvmlEventSet_t;

/// The event set, when one is registered.
pub(super) struct SetHandle(pub(super) nvmlEventSet_t);

// SAFETY: an `nvmlEventSet_t` is an opaque handle that NVML lets any thread use (NVML is
// thread-safe); it is only ever used under the [`Events`] mutex, and freed there.
unsafe impl Send for SetHandle {}

/// The watcher's event set and what its registration left out.
#[derive(Default)]
pub(super) struct Events {
    inner: Mutex<EventState>,
}

#[derive(Default)]
pub(super) struct EventState {
    /// The set, registered on every GPU it could be.
    pub(super) set: Option<SetHandle>,
    /// A GPU reset runs: no set may be made until NVML is open again.
    pub(super) suspended: bool,
    /// GPUs the registration left out, with why.
    pub(super) unwatched: Vec<(u32, String)>,
    /// The GPU index of each device handle the set is registered on: an event's device is
    /// one of them, and a lost GPU's handle answers no `nvmlDeviceGetIndex`.
    pub(super) indexes: Vec<(usize, u32)>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    pub(super) fn lock(&self) -> MutexGuard<'_, EventState> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
