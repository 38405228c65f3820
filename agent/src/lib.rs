//! gpushare-agent: turns a named sharing profile into GPU state.
//!
//! The layers, in order; each uses only layers listed before it (tests aside), which
//! `tests/layers.rs` checks against this very list:
//!
//! 1. [`sys`] — the operating system, written once: the one runner of external programs,
//!    atomic files, `/proc`, the raw C library calls.
//! 2. [`catalog`] — GPU models and their MIG profile tables (data; crate `gpushare-catalog`).
//! 3. [`node`] — the model of a node as observed (GPUs, MIG instances, processes, MPS
//!    servers, time-slice intervals) and the operations that change it.
//! 4. [`profile`] — the profile format: parsing, validation, built-ins, mig-parted import,
//!    export of a node as a profile.
//! 5. [`config`] — `agent.toml`.
//! 6. [`plan`] — pure planning: node + profile → steps; placements; verification.
//! 7. [`gpu`] — the hardware seam: [`gpu::GpuBackend`] and NVML, on NVIDIA's driver or the
//!    simulated one.
//! 8. [`health`] — the GPUs' faults from the driver's events and readings (Xids, ECC,
//!    a GPU lost, row remaps, the recovery action), one registry every view reads.
//! 9. [`sharing`] — MPS control daemons, time-slice intervals, supervision.
//! 10. [`cdi`] — the CDI spec of what the node shares (whole GPUs, MIG devices, MPS
//!     shares) for container runtimes, and where it is written.
//! 11. [`apply`] — carrying out plans: observation, parallel execution, journal,
//!     transactions with rollback, hooks.
//! 12. [`bench`] — replicas of the user's program started together and measured (the
//!     runner so far; issue 12), and the one statistics module of bench and probe.
//! 13. [`probe`] — the CUDA side of the interference probe (client processes, kernels);
//!     its statistics are bench's.
//! 14. [`access`] — who may change the GPUs.
//! 15. [`slurm`] — Slurm as this node sees it: its GRES, drains, its jobs, slurmd's
//!     restart (scontrol, squeue and the site's commands).
//! 16. [`engine`] — the agent's operations for any transport: typed jobs, results,
//!     errors and events.
//! 17. [`metrics`] — Prometheus series, following the engine's events.
//! 18. [`service`] — the D-Bus interface: transport only, and the one place errors become
//!     D-Bus errors.
//! 19. [`simulator`] — where gpushare's simulated driver and tools are installed, and the
//!     environment that hands them the node (`--simulate`).
//! 20. [`daemon`] — the composition root: configuration → backend → engine → metrics →
//!     bus → background tasks.
//! 21. [`man`] — the man page gpushare-agent(8): options, files and `agent.toml`'s keys,
//!     signals, environment.

pub mod access;
pub mod apply;
pub mod bench;
pub use gpushare_catalog as catalog;
pub mod cdi;
pub mod config;
pub mod daemon;
pub mod engine;
pub mod gpu;
pub mod health;
pub mod man;
pub mod metrics;
pub mod node;
pub mod plan;
pub mod probe;
pub mod profile;
pub mod service;
pub mod sharing;
pub mod simulator;
pub mod slurm;
pub mod sys;
