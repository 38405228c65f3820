//! `bench`: the user's own program (or a built-in CUDA workload) as N replicas under each
//! sharing strategy (issue 12; under construction).
//!
//! So far: [`replicas`], the one runner of replicas. The agent starts every replica
//! through [`gate`] (this binary, `--bench-gate`), which holds it until all N exist and
//! then lets them exec the command together, as the calling user, each in a process group
//! of its own, with the report pipe of the units-by-line method open across the exec.
//! The statistics, the strategy orchestration (an ordinary transaction per strategy),
//! the D-Bus call, `gpushare-ctl bench` and the HTML report come next.

pub mod gate;
pub mod histogram;
pub mod measure;
pub mod replicas;
pub mod stats;
