//! A simulated NVIDIA driver library. Built as `libgpushare_sim_nvml.so`, it exports the C
//! ABI of the NVML functions gpushare-agent calls, so that `gpushare-agent --simulate`
//! loads it through nvml-wrapper (`Nvml::builder().lib_path(..)`) and runs the real
//! `NvmlBackend`, down to the FFI. `gpushare_sim_driver()` (a marker string) tells the
//! agent it loaded the simulator, never the real driver; `gpushare_sim_last_error()`
//! says in one line why the last `nvmlInit` failed.
//!
//! Modules, dependencies pointing one way (each uses only those listed before it, and
//! nvml.h's constants in the leaf [`abi::types`]):
//! [`codes`] (NVML's return codes), [`node`] (the simulated node as its JSON state file
//! holds it, shared with the simulated tools in `sim/tools`), [`rules`] (the driver's MIG
//! and compute rules, pure), [`device`] (per-GPU facts the library and the tools both
//! report), [`faults`] (the knobs), [`host`] (the host's files beside the state file),
//! [`health`] (the GPUs' faults and raised events, a leaf [`node`] holds),
//! [`state_file`] (reading and writing the state file: lock, generation, atomic writes),
//! [`abi`] (nvml.h layouts, handles, exports).
//!
//! # In a production agent: nothing
//! gpushare-agent says in its environment which driver it means
//! ([`abi::AGENT_DRIVER_ENV`], `GPUSHARE_AGENT_DRIVER`: `nvidia`, or `simulated` under
//! `--simulate`). Where it says anything but `simulated`, every `nvmlInit` answers
//! NVML_ERROR_DRIVER_NOT_LOADED, the reason in `gpushare_sim_last_error`, before it reads
//! a knob or touches a file: such an agent found this library as `libnvidia-ml.so.1` by
//! mistake (issue 36).
//!
//! # Configuration (read at the first `nvmlInit` after a full shutdown)
//! - `GPUSHARE_SIM_NODE`: the GPUs, `MODEL[:N],...` (`a100-40gb:8`).
//! - `GPUSHARE_SIM_STATE`: the node's state file. Taken up when it holds the same models,
//!   else the node starts fresh (MIG off, persistence mode on, compute mode default).
//! - `GPUSHARE_SIM_FAIL="<name>:<n>[=<NVML_ERROR_X>][,...]"`: the n-th call (1-based,
//!   counted per process, across shutdowns and reloads) of that exported function fails
//!   with the code the real driver gives for outside causes (create GI/CI
//!   INSUFFICIENT_RESOURCES; destroys and SetMigMode IN_USE; SetComputeMode and
//!   SetPersistenceMode NO_PERMISSION; anything else UNKNOWN) or the one named. `gpu-reset`
//!   and `set-timeslice` are accepted too: the simulated nvidia-smi counts those.
//!   A firing prints one line on stderr.
//! - `GPUSHARE_SIM_DELAY_MS`: every mutating call sleeps first.
//! - `GPUSHARE_SIM_PROCESSES="<gpu>[/<gpu instance id>]:<pid>[=<size>],..."`: compute
//!   processes, each using `<size>` of GPU memory (`1536MiB`, `2GiB`, bytes; 512 MiB
//!   without). A PID running in the declaring process's PID namespace is listed while it
//!   runs (and stays ended when declared again); one that does not stands for another
//!   namespace's process and is listed until the knob changes. As on the real driver, a
//!   process on a GPU in MIG mode runs in one of its GPU instances (`<gpu>/<gi>`, an
//!   existing one) and one on a GPU without MIG in none (`<gpu>`); an entry otherwise (or
//!   on a GPU the node lacks) is a malformed knob ([`faults::check_processes`]).
//!
//! # Processes
//! `nvmlDeviceGetComputeRunningProcesses` (v1, v2, v3; on a GPU or a MIG device) lists
//! every process, each with its own memory; `nvmlDeviceGetMPSComputeRunningProcesses`
//! (v1, v2, v3) only the MPS clients, with the same memory, as driver 580 did on an H200
//! (tests/device/results/clients-h200-2026-11-27); the graphics lists are empty. Besides
//! the knob's processes, the simulated MPS control daemon (`sim/tools`) registers each
//! client it is told of (`--fake-client PID [--memory SIZE]`) on the GPU or GPU instance
//! its server serves, as an MPS client ([`node::Process`]); such a registered process is
//! listed only while its PID runs ([`node::pid_alive`]: `/proc/<pid>` exists and is no
//! zombie of one thread), as the real driver drops an exited process.
//! - `GPUSHARE_SIM_REBOOT=1`: start as after a reboot.
//! - `GPUSHARE_SIM_HOST="<fact>[,...]"`: the host around the GPUs as far as GPU resets
//!   care: `passthrough[=<gpus>]`, `vgpu[=<gpus>]`, `no-flr[=<gpus>]`,
//!   `nvidia-drm.modeset=1|0`, `nvswitches=<n>`, `fabric-manager=running|stopped`, and
//!   `numa:<gpus>=<cpus>` (several NUMA nodes; those GPUs' local CPUs, `0-3+8`) (see
//!   [`faults`]; `<gpus>` like `0+2`). Kept in the node (`host`, each GPU's
//!   `virtualization_mode` and `flr`) and shown as files under `<state>.host/` ([`host`]),
//!   beside the driver's device nodes (as root only, each 0600) and MIG capability files,
//!   rendered again at every write of the node.
//!
//! A malformed knob fails `nvmlInit` with NVML_ERROR_UNKNOWN, the reason on stderr and in
//! `gpushare_sim_last_error`.
//!
//! # Sessions
//! The first successful `nvmlInit` of a process applies that process's knobs, and only
//! those it sets: `GPUSHARE_SIM_REBOOT` reboots the node, `GPUSHARE_SIM_PROCESSES` (set,
//! even empty) replaces the processes it declared (those the MPS control daemon
//! registered stay while they run), `GPUSHARE_SIM_HOST` (set, even empty) its host,
//! `GPUSHARE_SIM_FAIL` restarts the tool-call counters;
//! a process that sets any of them records its pid as the session's. Every other NVML
//! client (a pynvml script, mig-parted, the simulated tools) sees the node as it is.
//! Later inits in the same process (the agent shuts NVML down around a GPU reset) apply
//! nothing again. The library pins itself (`RTLD_NODELETE`) so that this and
//! the call counters survive nvml-wrapper's `dlclose`.
//!
//! # Handles
//! Tagged integers, never pointers: kind, init epoch, GPU index, instance serial (see
//! [`abi::handles`]). A handle of a destroyed instance, or from before the last
//! `nvmlShutdown`, answers NVML_ERROR_INVALID_ARGUMENT.
//!
//! # What NVIDIA's other clients ask
//! GPU Feature Discovery, the device plugin and go-nvml's examples (issue 38): a MIG
//! device's attributes, fabric info, addressing mode, the v1 entry points
//! ([`abi::features`], which also lists the answers recorded on a real driver and those
//! derived).
//!
//! # Faults (issue 42)
//! [`health`] keeps each GPU's faults and the node's raised events, which the simulated
//! tool `gpushare-sim-fault` (sim/tools) raises: Xids on a GPU or a MIG instance, a GPU off
//! the bus (every call on it answers NVML_ERROR_GPU_IS_LOST), ECC errors, row remaps, the
//! recovery-action field. The library delivers the events to every client's event sets
//! ([`abi::events`]) and answers the polled calls from them ([`abi::health`]); the
//! simulated nvidia-smi shows them in `-q` and clears what a reset clears.
//!
//! # Not modelled
//! `isP2pSupported` (0: the catalog has none), capability bits (0), PCI subsystem id (0),
//! reserved/used memory (0), utilization, clocks, retired pages (NOT_SUPPORTED, as on
//! every GPU since Ampere), vGPU; compute-instance profile ids equal their enum values;
//! compute-instance ids are the lowest free one (GPU-instance ids are the driver's
//! per-placement ones: DESIGN.md, "Ids and placements as the driver gives them"); the
//! compute mode of a MIG-enabled GPU may still be changed; privilege checks (every caller
//! is treated as root); `nvmlInitWithFlags` flags.

pub mod abi;
pub mod codes;
pub mod device;
pub mod faults;
pub mod health;
pub mod host;
pub mod node;
pub mod rules;
pub mod state_file;
