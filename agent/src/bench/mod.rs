//! `bench`: the user's own program (or a built-in CUDA workload) as N replicas under each
//! sharing strategy.
//!
//! A replica is the caller's own process: [`launch`] starts its [`gate`] (this binary,
//! `--bench-gate`) as a transient systemd unit in the caller's slice, or as a child in a
//! new session; the gate becomes the caller, checks and starts the command, and holds
//! everything it starts; [`control`] is what the agent and a gate say to each other;
//! [`replicas`] runs N of them together and reads their reports with bounded buffers;
//! [`measure`] measures one run by one method (units, [`histogram`], until exit), a
//! histogram only from a replica's own listener ([`listener`]);
//! [`stats`] turns the measurements into figures and answers, [`verdict`] tests their
//! differences; [`pinning`] chooses each
//! replica's CPUs and [`host_noise`] samples the host's CPU noise over a window. The
//! engine's `bench` orchestrates a whole bench (see DESIGN.md, "Bench" and "Replicas are
//! the user's own processes").

pub mod control;
pub mod gate;
pub mod histogram;
pub mod host_noise;
pub mod launch;
pub mod listener;
pub mod measure;
pub mod pinning;
pub mod replicas;
pub mod stats;
pub mod verdict;
