//! The start barrier of a replica, run as
//! `gpushare-agent --bench-gate GATE_FD REPORT_FD [--bench-cwd DIR] -- COMMAND...`: already as the calling
//! user and in the replica's process group, it waits for one byte on GATE_FD (the agent
//! writes one per replica when all N exist), moves the report pipe from REPORT_FD to
//! descriptor [`REPORT_FD`] (3: shells such as dash take single-digit descriptors only,
//! `echo 12.5 >&3`), enters DIR (as the user: a directory the user may not enter is
//! refused as it would be for them), then replaces itself with COMMAND. End of file instead of a byte
//! means the agent went away or gave up before the start: the command never runs.

use std::ffi::OsString;
use std::os::fd::{BorrowedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::ExitCode;

use crate::sys::unix;

/// Exit status of a gate whose agent went away before the start (as `timeout` uses 125
/// for its own failures).
pub const ABANDONED: u8 = 125;
/// Exit status of a gate that could not run the command (as a shell's 127).
pub const NOT_RUN: u8 = 127;

/// The descriptor a replica reports units on, as `GPUSHARE_BENCH_REPORT` says.
pub const REPORT_FD: RawFd = 3;

/// `--bench-gate GATE_FD REPORT_FD [--bench-cwd DIR] -- COMMAND...`.
pub fn main(fd: RawFd, report: RawFd, cwd: Option<&Path>, command: &[OsString]) -> ExitCode {
    let Some((program, args)) = command.split_first() else {
        eprintln!("gpushare-agent --bench-gate: no command after --");
        return ExitCode::from(NOT_RUN);
    };
    if fd < 0 || report < 0 || fd == report {
        eprintln!("gpushare-agent --bench-gate: bad descriptors {fd} {report}");
        return ExitCode::from(NOT_RUN);
    }
    // SAFETY: the agent opened FD for this process (kept across the exec that started
    // it) and nothing else here uses or closes it before the exec below.
    let gate = unsafe { BorrowedFd::borrow_raw(fd) };
    match unix::read_one_byte(gate) {
        Ok(true) => {}
        Ok(false) => return ExitCode::from(ABANDONED),
        Err(e) => {
            eprintln!("gpushare-agent --bench-gate: reading descriptor {fd}: {e}");
            return ExitCode::from(ABANDONED);
        }
    }
    // The command gets the report pipe, not the gate.
    let moved = unix::close_on_exec(gate).and_then(|()| unix::move_fd(report, REPORT_FD));
    if let Err(e) = moved {
        eprintln!("gpushare-agent --bench-gate: descriptors {fd} {report}: {e}");
        return ExitCode::from(NOT_RUN);
    }
    let mut replica = std::process::Command::new(program);
    replica.args(args).env(super::replicas::REPORT_ENV, REPORT_FD.to_string());
    if let Some(dir) = cwd
        && let Err(e) = std::env::set_current_dir(dir)
    {
        eprintln!("gpushare-agent --bench-gate: cannot enter {}: {e}", dir.display());
        return ExitCode::from(NOT_RUN);
    }
    let error = replica.exec();
    eprintln!("gpushare-agent --bench-gate: cannot run {}: {error}", program.to_string_lossy());
    ExitCode::from(NOT_RUN)
}
