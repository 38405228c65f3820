//! The C ABI: nvml.h's types ([`types`], the return codes re-exported from
//! [`crate::codes`]), the handle scheme ([`handles`]), the helpers the entry points share
//! (`shared`: pointer checks, string copies, handle lookups), the exported functions
//! ([`exports`]: library and devices, [`device_info`], [`instances`], [`mig`],
//! [`processes`], [`features`], [`events`] and [`health`] (issue 42's faults), and `stubs`
//! for the rest of nvml.h) and the library's
//! process-wide state (here: init, shutdown, sessions, `read`/`mutate`). The entry-point
//! files use `shared`, `handles` and `types`; none of those uses an entry-point file.
//!
//! Every export runs inside `guarded` (a panic answers `NVML_ERROR_UNKNOWN`, never
//! unwinds into C) and through `read` or `mutate`: refused with
//! `NVML_ERROR_UNINITIALIZED` before `nvmlInit` or after the last `nvmlShutdown`, counted
//! for `GPUSHARE_SIM_FAIL`, then run on the node.
//!
//! Reads run on a cached node, reloaded when the node's generation (a counter every
//! writer bumps, mapped from `<state>.lock`: see [`crate::state_file`]) moved since it was read:
//! one memory load per call, and a reset made by the simulated nvidia-smi (another
//! process) is seen at once. Changes run under the file's exclusive lock, on the cached
//! node when the generation says it is current and on a fresh read otherwise, and are
//! written atomically before the call returns.

pub mod device_info;
pub mod events;
pub mod exports;
pub mod features;
pub mod handles;
pub mod health;
pub mod instances;
pub mod mig;
pub mod processes;
mod shared;
mod stubs;
pub mod types;

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::os::raw::{c_char, c_uint};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use gpushare_catalog::parse_node_spec;

use crate::codes::Code;
use crate::faults::{self, Knobs};
use crate::node::{NODE_ENV, Node};
use crate::state_file::{Generation, NodeFile};
use shared::put_str;
use types::{nvmlReturn_t, ret};

/// The library's process-wide state.
struct Lib {
    /// `nvmlInit` calls not yet matched by `nvmlShutdown`.
    refcount: u32,
    /// Bumped at every first `nvmlInit` after a full shutdown; handles carry it.
    epoch: u32,
    /// Whether this process's session started (reboot and process knobs applied).
    session_started: bool,
    /// Whether the library pinned itself in memory.
    pinned: bool,
    /// The knobs read at the last first `nvmlInit`.
    knobs: Knobs,
    /// Calls per exported function in this process, for `GPUSHARE_SIM_FAIL`.
    calls: BTreeMap<&'static str, u32>,
    /// The state file and its generation, once initialized.
    file: Option<(NodeFile, Generation)>,
    /// The node as last read or written, with its generation then.
    cache: Option<(u64, Node)>,
    /// Why the last `nvmlInit` failed (empty after a success).
    last_error: String,
    /// This process's event sets, by id ([`events`]); gone at the last `nvmlShutdown`.
    event_sets: BTreeMap<u32, events::EventSet>,
    /// The last event-set id handed out.
    last_event_set: u32,
}

static LIB: Mutex<Lib> = Mutex::new(Lib {
    refcount: 0,
    epoch: 0,
    session_started: false,
    pinned: false,
    knobs: Knobs {
        failures: Vec::new(),
        delay: Duration::ZERO,
        processes: None,
        reboot: false,
        host: None,
    },
    calls: BTreeMap::new(),
    file: None,
    cache: None,
    last_error: String::new(),
    event_sets: BTreeMap::new(),
    last_event_set: 0,
});

fn lib() -> MutexGuard<'static, Lib> {
    // A panic inside a call is answered NVML_ERROR_UNKNOWN; the state stays usable.
    LIB.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f`, answering `NVML_ERROR_UNKNOWN` if it panics.
pub(crate) fn guarded(f: impl FnOnce() -> nvmlReturn_t) -> nvmlReturn_t {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(ret::UNKNOWN)
}

fn code(r: Result<(), Code>) -> nvmlReturn_t {
    r.err().unwrap_or(ret::SUCCESS)
}

impl Lib {
    /// Counts a call and answers the injected failure, if any.
    fn count(&mut self, name: &'static str) -> Result<(), Code> {
        let n = self.calls.entry(name).or_insert(0);
        *n += 1;
        let n = *n;
        match faults::fires(&self.knobs.failures, name, n) {
            Some(code) => {
                eprintln!(
                    "gpushare simulated NVML: {name} call {n} fails with {} (GPUSHARE_SIM_FAIL)",
                    ret::name(code)
                );
                Err(code)
            }
            None => Ok(()),
        }
    }

    /// The checks every call but `nvmlInit` starts with.
    fn enter(&mut self, name: &'static str) -> Result<(), Code> {
        if self.refcount == 0 {
            return Err(ret::UNINITIALIZED);
        }
        self.count(name)
    }

    fn file(&self) -> Result<&(NodeFile, Generation), Code> {
        self.file.as_ref().ok_or(ret::UNINITIALIZED)
    }

    /// The node as of `generation`: the cached one when it is that recent, else read
    /// afresh (and cached). Read the generation before calling: a write racing with the
    /// read then shows as a newer generation at the next call.
    fn node_at(&mut self, generation: u64) -> Result<&Node, Code> {
        let current = self.cache.as_ref().is_some_and(|(g, _)| *g == generation);
        if !current {
            let (file, _) = self.file()?;
            match file.read_optional() {
                Ok(Some(node)) => self.cache = Some((generation, node)),
                // The file is gone (a test's clean-up racing the agent): keep what we had.
                Ok(None) => {}
                Err(e) => return Err(report(e)),
            }
        }
        self.cache.as_ref().map(|(_, n)| n).ok_or(ret::UNKNOWN)
    }

    /// The node, reloaded when another call or process changed it.
    fn refresh(&mut self) -> Result<&Node, Code> {
        let generation = self.file()?.1.current();
        self.node_at(generation)
    }
}

/// A read-only call: `f` sees the node (reloaded if the file changed) and the epoch.
pub(crate) fn read(
    name: &'static str,
    f: impl FnOnce(&Node, u32) -> Result<(), Code>,
) -> nvmlReturn_t {
    guarded(|| {
        let mut lib = lib();
        if let Err(c) = lib.enter(name) {
            return c;
        }
        let epoch = lib.epoch;
        match lib.refresh() {
            Ok(node) => code(f(node, epoch)),
            Err(c) => c,
        }
    })
}

/// A mutating call: after `GPUSHARE_SIM_DELAY_MS`, `f` runs under the state file's lock
/// on the node freshly read; when it succeeds and changed the node, the node is written.
pub(crate) fn mutate(
    name: &'static str,
    f: impl FnOnce(&mut Node, u32) -> Result<(), Code>,
) -> nvmlReturn_t {
    guarded(|| {
        let delay = {
            let lib = lib();
            if lib.refcount == 0 {
                return ret::UNINITIALIZED;
            }
            lib.knobs.delay
        };
        if !delay.is_zero() {
            // Outside the library's lock, so calls on other GPUs proceed meanwhile.
            std::thread::sleep(delay);
        }
        let mut lib = lib();
        if let Err(c) = lib.enter(name) {
            return c;
        }
        let result = (|| {
            let (file, generation) = lib.file()?;
            let file = file.clone();
            let lock = file.lock().map_err(report)?;
            let at = generation.current();
            let mut node = lib.node_at(at)?.clone();
            let before = node.clone();
            let result = f(&mut node, lib.epoch);
            if result.is_ok() && node != before {
                file.write(&lock, &node).map_err(report)?;
                // Under the lock, so nobody else wrote in between.
                lib.cache = Some((at.wrapping_add(1), node));
            }
            result
        })();
        code(result)
    })
}

fn report(e: String) -> Code {
    eprintln!("gpushare simulated NVML: {e}");
    ret::UNKNOWN
}

/// The variable in which gpushare-agent says, from its start, which driver it means to
/// drive: `simulated` under `--simulate`, `nvidia` otherwise.
pub const AGENT_DRIVER_ENV: &str = "GPUSHARE_AGENT_DRIVER";

/// Why this process must not run the simulated driver: it is a gpushare-agent that means
/// to drive NVIDIA's (it loaded this library as `libnvidia-ml` by mistake). Asked before
/// anything else, so that such an agent reads no `GPUSHARE_SIM_*` knob and touches no file
/// (no state file, no host directory, no device node) before it refuses the library.
fn refusal() -> Option<String> {
    let declared = std::env::var_os(AGENT_DRIVER_ENV)?;
    (declared != "simulated").then(|| {
        format!(
            "gpushare's simulated driver refuses to run in a gpushare-agent that drives NVIDIA's \
             driver ({AGENT_DRIVER_ENV}={}): it was loaded as libnvidia-ml by mistake (check \
             LD_LIBRARY_PATH and /etc/ld.so.conf.d); nothing was read or written",
            declared.to_string_lossy()
        )
    })
}

/// `nvmlInit_v2` and `nvmlInitWithFlags`.
pub(crate) fn init(name: &'static str) -> nvmlReturn_t {
    guarded(|| {
        let mut lib = lib();
        // Pinned (no file touched: the mapping already there) so that the refusal's reason
        // outlives the caller's dlclose for gpushare_sim_last_error.
        if !lib.pinned {
            pin_library();
            lib.pinned = true;
        }
        if let Some(why) = refusal() {
            eprintln!("gpushare simulated NVML: {name} failed: {why}");
            lib.last_error = why;
            return ret::DRIVER_NOT_LOADED;
        }
        if lib.refcount > 0 {
            if let Err(c) = lib.count(name) {
                return c;
            }
            lib.refcount += 1;
            return ret::SUCCESS;
        }
        match start(&mut lib, name) {
            Ok(()) => {
                lib.refcount = 1;
                lib.epoch = lib.epoch.wrapping_add(1);
                lib.last_error.clear();
                ret::SUCCESS
            }
            Err((c, why)) => {
                if !why.is_empty() {
                    eprintln!("gpushare simulated NVML: {name} failed: {why}");
                    lib.last_error = why;
                }
                c
            }
        }
    })
}

/// The first `nvmlInit` after a full shutdown: reads the knobs and the node; the first
/// one of the process also starts its session.
fn start(lib: &mut Lib, name: &'static str) -> Result<(), (Code, String)> {
    let unknown = |why: String| (ret::UNKNOWN, why);
    lib.knobs = Knobs::from_env().map_err(unknown)?;
    lib.count(name)
        .map_err(|c| (c, format!("injected by GPUSHARE_SIM_FAIL ({})", ret::name(c))))?;
    let spec = std::env::var(NODE_ENV).ok().filter(|s| !s.trim().is_empty()).ok_or_else(|| {
        unknown(format!(
            "{NODE_ENV} is not set: it holds the simulated GPUs, e.g. a100-40gb:8 (gpushare-agent --simulate sets it)"
        ))
    })?;
    let models = parse_node_spec(&spec).map_err(|e| unknown(format!("{NODE_ENV}: {e}")))?;
    let file = NodeFile::from_env().map_err(unknown)?;
    let generation = Generation::open(&file).map_err(unknown)?;
    let lock = file.lock().map_err(unknown)?;
    let mut node = match file.read_optional().map_err(unknown)? {
        Some(mut saved) if saved.has_models(&models) => {
            crate::rules::renumber_instances(&mut saved);
            saved
        }
        Some(_) => {
            eprintln!(
                "gpushare simulated NVML: {} holds other GPUs than {NODE_ENV}={spec}: starting fresh",
                file.path().display()
            );
            Node::new(&models)
        }
        None => Node::new(&models),
    };
    if !lib.session_started {
        // Every NVML client of the node (the agent, a pynvml script, mig-parted, the
        // simulated tools) sees the same node: a process changes only what its knobs say.
        if lib.knobs.reboot {
            node.reboot();
        }
        if let Some(processes) = &lib.knobs.processes {
            // Against the node as the knobs leave it (after a reboot, no GPU instances):
            // nothing is written when they do not fit.
            faults::check_processes(processes, &node).map_err(unknown)?;
            // The knob's processes replace those declared before; the ones the simulated
            // MPS control daemon registered stay while they run.
            // A PID declared again keeps whether it ran here: one that ran here and has
            // ended stays ended (not taken for another namespace's).
            let ran_here: std::collections::HashSet<(u32, u32)> = (node.processes.iter())
                .filter(|p| !p.registered && p.runs_here)
                .map(|p| (p.gpu, p.pid))
                .collect();
            node.processes.retain(|p| p.registered);
            node.processes.extend(processes.iter().map(|p| crate::node::Process {
                runs_here: ran_here.contains(&(p.gpu, p.pid)) || crate::node::pid_alive(p.pid),
                ..p.clone()
            }));
        }
        if let Some(host) = &lib.knobs.host {
            faults::apply_host(host, &mut node).map_err(unknown)?;
        }
        if !lib.knobs.failures.is_empty() {
            // The tools' calls count from this session on (GPUSHARE_SIM_FAIL's n-th).
            node.tool_calls.clear();
        }
        if lib.knobs.reboot
            || lib.knobs.processes.is_some()
            || lib.knobs.host.is_some()
            || !lib.knobs.failures.is_empty()
        {
            node.session_pid = Some(std::process::id());
        }
    }
    node.prune_exited();
    // With the host's files, under the node's lock (see crate::host).
    file.write(&lock, &node).map_err(unknown)?;
    lib.session_started = true;
    lib.cache = Some((generation.current(), node));
    lib.file = Some((file, generation));
    Ok(())
}

/// `nvmlShutdown`.
pub(crate) fn shutdown() -> nvmlReturn_t {
    guarded(|| {
        let mut lib = lib();
        if let Err(c) = lib.enter("nvmlShutdown") {
            return c;
        }
        lib.refcount -= 1;
        if lib.refcount == 0 {
            lib.cache = None;
            lib.event_sets.clear();
        }
        ret::SUCCESS
    })
}

/// Copies the last init error into `buf`.
pub(crate) fn last_error(buf: *mut c_char, len: c_uint) -> nvmlReturn_t {
    guarded(|| {
        let why = lib().last_error.clone();
        // SAFETY: the caller passes a buffer of `len` writable bytes, or null (refused).
        code(unsafe { put_str(buf, len, &why) })
    })
}

/// Pins this library in memory for the life of the process.
///
/// nvml-wrapper `dlclose`s the library when its `Nvml` drops, and the agent drops it
/// around every GPU reset and loads the library again. Unloaded, the library would lose
/// its statics: the per-process call counters of `GPUSHARE_SIM_FAIL` would restart, and
/// the next `nvmlInit` would start a second session (applying `GPUSHARE_SIM_REBOOT` and
/// the process list again). So the first `nvmlInit` finds its own file with `dladdr` and
/// `dlopen`s it again with `RTLD_NODELETE` (`RTLD_NOLOAD`: only the mapping already
/// there), which keeps it mapped after the last `dlclose`. In-process (the rlib in
/// tests) this names the executable, which is never unloaded anyway.
///
/// Through `libc`: `nix` wraps neither `dladdr` nor `dlopen`.
fn pin_library() {
    // SAFETY: all-zero bytes are a valid `Dl_info` (null pointers), which dladdr fills.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let addr = pin_library as fn() as *const c_void;
    // SAFETY: dladdr only inspects the address (a function of this library) and writes
    // `info`, a live local.
    let rc = unsafe { libc::dladdr(addr, &mut info) };
    if rc == 0 || info.dli_fname.is_null() {
        eprintln!("gpushare simulated NVML: dladdr failed; the library is not pinned");
        return;
    }
    // SAFETY: `dli_fname` is the loader's NUL-terminated path of the object holding
    // `addr`, valid while it is loaded (it is: this code runs from it). With RTLD_NOLOAD
    // dlopen loads nothing new; the handle is deliberately never closed.
    let handle = unsafe {
        libc::dlopen(info.dli_fname, libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_NODELETE)
    };
    if handle.is_null() {
        eprintln!(
            "gpushare simulated NVML: dlopen(RTLD_NODELETE) failed; the library is not pinned"
        );
    }
}

/// Tests only: forgets the process's session, call counters and any open init, as a
/// fresh process would start.
#[cfg(test)]
pub(crate) fn reset_process_for_tests() {
    let mut lib = lib();
    lib.refcount = 0;
    lib.session_started = false;
    lib.calls.clear();
    lib.file = None;
    lib.cache = None;
    lib.last_error.clear();
    lib.event_sets.clear();
}

#[cfg(test)]
mod events_tests;
#[cfg(test)]
mod features_tests;
#[cfg(test)]
mod tests;
