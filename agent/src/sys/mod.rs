//! What the agent needs from the operating system, written once: running external
//! programs ([`command`]), files written atomically ([`files`]), which directories and
//! files it may trust ([`trusted`]), what `/proc` says about processes ([`procfs`]), what the
//! agent's mounts say of `/proc`'s `hidepid` and of who named a cgroup ([`mounts`]), what
//! names a Slurm job among processes ([`slurmstepd`]), the few raw C library calls
//! ([`unix`]), and where log lines go: stderr or the systemd journal ([`log`]), and
//! transient units of systemd ([`systemd`]).

pub mod command;
pub mod files;
pub mod log;
pub mod mounts;
pub mod place;
pub mod procfs;
pub mod slurmstepd;
pub mod systemd;
pub mod text;
pub mod trusted;
pub mod unix;

/// This binary, which the agent runs for its own helpers: a bench's replica gates and
/// built-in workloads (`--bench-gate`, `--bench-builtin`) and the probe's clients
/// (`--probe-client`). The one copy of what `engine/bench.rs` and `engine/probe.rs` each
/// wrote (issue 39).
pub fn agent_binary() -> Result<std::path::PathBuf, String> {
    std::env::current_exe().map_err(|e| format!("cannot find the agent binary: {e}"))
}

/// What a task on tokio's pools that did not finish says to a caller: never the panic's
/// own text (an internal detail, perhaps quoting input), which the panic hook has already
/// put in the agent's log.
pub fn task_failed(e: &tokio::task::JoinError) -> String {
    if e.is_panic() {
        "an internal error in gpushare-agent (a bug: its log has the details)".to_owned()
    } else {
        "the agent's work was cancelled (the agent is stopping)".to_owned()
    }
}
