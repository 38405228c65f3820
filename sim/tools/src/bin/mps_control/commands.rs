//! [`answer`]: each control command answered as NVIDIA's daemon answers it, and who may
//! give it. Queries are answered to everyone alike; settings, `terminate_client`,
//! `shutdown_server` and `quit` only to the user who started the daemon and root, as driver
//! 580's daemon did on an H100 with and without `-M`
//! (tests/device/results/mps-privilege-h100-2026-12-06). Anyone else gets the real
//! daemon's words on stdout (the client still exits 0), and nothing changes:
//!
//! ```text
//! Insufficient privileges for UID <uid>. Control deamon settings can only be modified by the user who started it or by the root user.
//! ```
//!
//! (sic), followed by a line `800` for `terminate_client`; `quit` answers `Not enough
//! privilege to execute quit command`. `start_server -uid <their own uid>` is accepted
//! silently (recorded: see `state.rs` for what follows). Derived, not recorded: the answer
//! to `start_server -uid <another uid>` from such a user (the privilege line), that a
//! `start_server` without a readable `-uid` asks for the caller's own, and that a refused
//! command's arguments are not checked (only `set_default_device_pinned_mem_limit` echoes a
//! well-formed value first, as recorded).

use std::time::Instant;

use crate::limits::{mem_limit_bytes, parse_percentage, percent, shown_limit};
use crate::log_line::LogLine;
use crate::state::State;

const INVALID_PERCENTAGE: &str = "Invalid percentage, expected between (0.0, 100.0]";
const NO_DEFAULT_PINNED_LIMIT: &str = "No default pinned memory limit set for the device!";
/// What `get_device_client_list` shows for the device (the probe's H100).
const DEVICE_LINE: &str = "[0] 00:00.0, NVIDIA H100 80GB HBM3";
/// `quit`'s answer to a user who may not.
pub const QUIT_REFUSED: &str = "Not enough privilege to execute quit command";
/// `terminate_client`'s second line to a user who may not (CUDA's
/// `cudaErrorNotPermitted` is 800).
pub const NOT_PERMITTED: &str = "800";

/// The line that refuses a setting to user `uid`, word for word ("deamon" included).
pub fn insufficient_privileges(uid: u32) -> String {
    format!(
        "Insufficient privileges for UID {uid}. Control deamon settings can only be modified \
         by the user who started it or by the root user."
    )
}

/// Whether user `caller` may change a daemon that user `owner` started.
pub fn may_change(caller: u32, owner: u32) -> bool {
    caller == 0 || caller == owner
}

/// What one command gets: the lines for the client, the log lines, whether the daemon quits.
#[derive(Debug, Default, PartialEq)]
pub struct Answer {
    pub reply: Vec<String>,
    pub log: Vec<LogLine>,
    pub quit: bool,
}

/// The user `start_server` asks a server for: `-uid UID`, else the caller.
fn requested_uid(rest: &[&str], caller: u32) -> u32 {
    match rest {
        ["-uid", uid, ..] => uid.parse().unwrap_or(caller),
        _ => caller,
    }
}

/// What a user who may not change the daemon gets for `words`, when it is a command that
/// changes it: remarks for the log, and the answer.
fn refusal(state: &State, words: &[&str], caller: u32) -> Option<(Vec<LogLine>, Vec<String>)> {
    let refused = insufficient_privileges(caller);
    Some(match words {
        ["quit", ..] => (Vec::new(), vec![QUIT_REFUSED.to_string()]),
        ["terminate_client", ..] => (Vec::new(), vec![refused, NOT_PERMITTED.to_string()]),
        ["set_default_device_pinned_mem_limit", device, value, ..]
            if mem_limit_bytes(value).is_some() =>
        {
            let echo = format!("set_default_device_pinned_mem_limit {device} {value}.");
            (vec![state.control(echo)], vec![refused])
        }
        [
            "set_default_active_thread_percentage"
            | "set_active_thread_percentage"
            | "set_default_device_pinned_mem_limit"
            | "set_device_pinned_mem_limit"
            | "set_default_client_priority"
            | "shutdown_server",
            ..,
        ] => (Vec::new(), vec![refused]),
        ["start_server", rest @ ..] if requested_uid(rest, caller) != caller => {
            (Vec::new(), vec![refused])
        }
        _ => return None,
    })
}

/// The daemon's answer at `now` to one command line from user `caller`, and what it logs:
/// `Cmd:<line>`, then any remarks, then the answer's lines (the real daemon logs its
/// answers too). Clients whose process has ended are dropped first
/// ([`State::prune_exited`]): no answer lists them.
pub fn answer(state: &mut State, line: &str, caller: u32, now: Instant) -> Answer {
    let line = line.trim();
    let words: Vec<&str> = line.split_whitespace().collect();
    if words.is_empty() {
        return Answer::default();
    }
    let gone = state.prune_exited();
    let refused =
        if may_change(caller, state.owner) { None } else { refusal(state, &words, caller) };
    let (notes, reply, quit) = match refused {
        Some((notes, reply)) => (notes, reply, false),
        None => carry_out(state, &words, caller, now),
    };
    let mut log = gone;
    log.push(state.control(format!("Cmd:{line}")));
    log.extend(notes);
    log.extend(reply.iter().map(|r| state.control(r.clone())));
    Answer { reply, log, quit }
}

/// A command the caller may give: its remarks for the log, its answer, whether to quit.
fn carry_out(
    state: &mut State,
    words: &[&str],
    caller: u32,
    now: Instant,
) -> (Vec<LogLine>, Vec<String>, bool) {
    let mut notes: Vec<LogLine> = Vec::new();
    let mut reply: Vec<String> = Vec::new();
    let mut quit = false;
    match words {
        [] => {}
        ["get_server_list", ..] => reply.extend(state.server.as_ref().map(|s| s.pid.to_string())),
        ["start_server", rest @ ..] => {
            notes.extend(state.request_server(requested_uid(rest, caller), now));
        }
        ["shutdown_server", pid, rest @ ..] => {
            if let Ok(pid) = pid.parse() {
                notes.extend(state.shutdown_server(pid, rest.first() == Some(&"-f"), now));
            }
        }
        ["get_server_status", pid, ..] => {
            reply.extend(state.server_ref(pid).map(|_| "ACTIVE".to_string()));
        }
        ["get_client_list", pid, ..] => {
            if let Some(server) = state.server_ref(pid) {
                reply.extend(server.clients.iter().map(|c| c.pid.to_string()));
            }
        }
        ["get_device_client_list", rest @ ..] => {
            let server = match rest.first() {
                Some(pid) => state.server_ref(pid),
                None => state.server.as_ref(),
            };
            if let Some(server) = server.filter(|s| !s.clients.is_empty()) {
                reply.push(DEVICE_LINE.to_string());
                reply.extend(server.clients.iter().map(|c| format!("{}.1", c.pid)));
            }
        }
        ["set_default_active_thread_percentage", rest @ ..] => {
            match parse_percentage(rest.first()) {
                Some(value) => state.default_percentage = Some(value),
                None => notes.push(state.control(INVALID_PERCENTAGE)),
            }
            reply.push(percent(state.default_percentage()));
        }
        ["get_default_active_thread_percentage", ..] => {
            reply.push(percent(state.default_percentage()));
        }
        ["set_active_thread_percentage", pid, rest @ ..] => {
            let value = parse_percentage(rest.first());
            let invalid = state.control(INVALID_PERCENTAGE);
            if let Some(server) = state.server_mut(pid) {
                match value {
                    Some(value) => server.percentage = value,
                    None => notes.push(invalid),
                }
                reply.push(percent(server.percentage));
            }
        }
        ["get_active_thread_percentage", pid, ..] => {
            reply.extend(state.server_ref(pid).map(|s| percent(s.percentage)));
        }
        ["set_default_device_pinned_mem_limit", device, value, ..]
            if mem_limit_bytes(value).is_some() =>
        {
            state.default_pinned.insert(device.to_string(), value.to_string());
            notes.push(
                state.control(format!("set_default_device_pinned_mem_limit {device} {value}.")),
            );
        }
        ["get_default_device_pinned_mem_limit", device, ..] => {
            match state.default_pinned.get(*device) {
                Some(value) => reply.push(shown_limit(value)),
                None => notes.push(state.control(NO_DEFAULT_PINNED_LIMIT)),
            }
        }
        // Answered with nothing, logged with nothing but the command (the H100, 2026-12-06).
        ["set_device_pinned_mem_limit", pid, device, value, ..]
            if mem_limit_bytes(value).is_some() =>
        {
            if let Some(server) = state.server_mut(pid) {
                server.pinned.insert(device.to_string(), value.to_string());
            }
        }
        ["get_device_pinned_mem_limit", pid, device, ..] => {
            let value = state.server_ref(pid).map(|s| s.pinned.get(*device).cloned());
            match value {
                Some(Some(value)) => reply.push(value),
                Some(None) => {
                    notes.push(state.control("No pinned memory limit set for the device!"))
                }
                None => {}
            }
        }
        ["set_default_device_pinned_mem_limit" | "set_device_pinned_mem_limit", ..] => {
            notes.push(state.control("Invalid memory limit, expected <n>G or <n>M"));
        }
        ["terminate_client", server, client, ..] => {
            let client: Option<u32> = client.parse().ok();
            if let (Some(server), Some(client)) = (state.server_mut(server), client) {
                server.clients.retain(|c| c.pid != client);
            }
        }
        ["ps", ..] => reply = state.ps(),
        ["set_default_client_priority", priority @ ("0" | "1"), ..] => {
            state.default_priority = priority.parse().unwrap_or(0);
        }
        ["get_default_client_priority", ..] => reply.push(state.default_priority.to_string()),
        ["quit", ..] => {
            quit = true;
            notes.extend(state.quit());
        }
        [command, ..] => reply.push(format!("Unknown command \"{command}\"")),
    }
    (notes, reply, quit)
}

#[cfg(test)]
#[path = "commands_tests.rs"]
mod tests;
