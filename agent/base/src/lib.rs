//! What gpushare's crates share below the D-Bus interface: the agent, `gpushare-proto`,
//! `gpushare-ctl` and the simulator (`sim/nvml`, `sim/tools`) all link this crate, which
//! pulls in no zbus. It holds the text rules that must read and write alike everywhere —
//! byte sizes ([`size`]), Linux CPU lists ([`cpus`]), lengths of time for people
//! ([`duration`]), the local time ([`local_time`]) — and the one reader of
//! `/proc/<pid>/stat` with the one rule of whether a process still runs ([`process`]).

pub mod cpus;
pub mod duration;
pub mod local_time;
pub mod process;
pub mod size;
