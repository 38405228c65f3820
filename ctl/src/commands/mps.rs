//! `gpushare-ctl mps [status]` and `gpushare-ctl mps limit --pid PID [--threads PCT]
//! [--memory SIZE]`.
//!
//! ```text
//! GPU  GI  UUID                                      STATE    PID   MODE        SERVER        THREADS  MEMORY  FROM       RESTARTS  CLIENTS    PIPE
//! 0    -   GPU-00000000-0000-0000-0000-000000000000  running  4100  one user    4101 (root)       50%   2 GiB  mps limit         0  4242,4243  /run/gpushare/mps/GPU-…/pipe
//! 1    9   MIG-11111111-1111-1111-1111-111111111111  down     -     multi-user  -                100%       -  -                 3  -          /run/gpushare/mps/MIG-…/pipe
//! GPU 0: server 4101 serves root's clients only: another user's client waits until they are gone (multi_user = true in the profile serves every user at once)
//! GPU 0: server 4101 has 50% threads, 2 GiB from gpushare-ctl mps limit (by uid 0, 2026-12-07 10:00:00 UTC), for its new clients; a server the daemon starts later has the daemon's defaults (25% threads, 2 GiB)
//! ```
//!
//! GI is the GPU instance id of the MIG instance a server serves (`-` for a whole GPU), as
//! `status` and `nvidia-smi` show it (`slot N` when the agent no longer finds the instance).
//! PID is the control daemon's; SERVER the MPS server process it started for the first
//! client, with the user it runs as (the one user whose clients it serves, unless MODE is
//! multi-user). THREADS and MEMORY are the limits a client connecting now gets, as the
//! control daemon answers them; FROM says where they come from: `profile`, `mps limit` (an
//! override `limit` made) or `drift` (changed outside gpushare; the health check puts the
//! profile's back). The lines under the table say what the table cannot.
//!
//! `limit` sets those of the server process that serves one client: MPS applies them to
//! that server's new clients, not to those already connected, and a server the daemon
//! starts later begins with the daemon's defaults again.

use gpushare_proto::types::{MpsLimitResult, MpsLimitValues, MpsServer, MpsStatus};

use super::ExitStatus;
use super::clients::local_time;
use super::mps_words::{device_words, serving_notes, who};
use crate::bus::Client;
use crate::cli::{MpsCommand, MpsLimitArgs};
use crate::error::CtlError;
use crate::output::{Output, exact_size, parse_document};
use crate::table::Columns;

/// Runs `mps` (`status` when no sub-verb is given).
pub async fn run(
    client: &mut Client,
    out: &Output,
    command: Option<MpsCommand>,
) -> Result<ExitStatus, CtlError> {
    match command.unwrap_or(MpsCommand::Status) {
        MpsCommand::Status => {
            let raw = client.call("MpsStatus", async |a| a.proxy.mps_status().await).await?;
            if out.json {
                out.print_document(&raw, "MpsStatus")?;
            } else {
                let status: MpsStatus = parse_document(&raw, "MpsStatus")?;
                out.print(&render_status(&status));
            }
        }
        MpsCommand::Limit(args) => {
            let MpsLimitArgs { pid, threads, memory } = args;
            // 0 leaves a limit as it is.
            let (threads, memory) = (threads.unwrap_or(0), memory.unwrap_or(0));
            let raw = client
                .call("MpsLimit", async |a| a.proxy.mps_limit(pid, threads, memory).await)
                .await?;
            if out.json {
                out.print_document(&raw, "MpsLimitResult")?;
            } else {
                let result: MpsLimitResult = parse_document(&raw, "MpsLimitResult")?;
                out.print(&render_limit(&result));
            }
        }
    }
    Ok(0)
}

/// The GI cell: the GPU instance id of a MIG server's instance, `-` for a whole GPU.
fn gi_cell(server: &MpsServer) -> String {
    match (server.gpu_instance_id, server.placement_start) {
        (Some(id), _) => id.to_string(),
        (None, Some(start)) => format!("slot {start}"),
        (None, None) => "-".into(),
    }
}

fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn clients_cell(server: &MpsServer) -> String {
    if server.clients.is_empty() {
        return "-".into();
    }
    server.clients.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// The SERVER cell: the first server process and its user.
fn server_cell(server: &MpsServer) -> String {
    match server.server_processes.first() {
        Some(p) => match p.uid {
            Some(uid) => format!("{} ({})", p.pid, who(uid, p.user.as_deref())),
            None => p.pid.to_string(),
        },
        None => "-".into(),
    }
}

/// The MODE cell.
fn mode_cell(server: &MpsServer) -> &'static str {
    if server.multi_user { "multi-user" } else { "one user" }
}

/// Where the limits a new client gets come from, in words: `profile`, `mps limit`,
/// `drift`; `-` when the daemon was not asked.
pub fn source_word(source: Option<&str>) -> &'static str {
    match source {
        Some("profile") => "profile",
        Some("mps-limit") => "mps limit",
        Some("unknown") => "drift",
        Some(_) => "?",
        None => "-",
    }
}

/// Limits in a few words: `25% threads, 2 GiB` (`no memory limit`).
pub fn limits_words(limits: &MpsLimitValues) -> String {
    let memory =
        limits.pinned_memory_limit_bytes.map_or_else(|| "no memory limit".to_owned(), exact_size);
    format!("{}% threads, {memory}", limits.active_thread_percentage)
}

/// What the table cannot say of `server` (on `device`: `GPU 0`, `GPU 1 GI 9`), one line
/// each: whom it serves, limits changed outside gpushare, overrides of `mps limit`.
pub fn notes(server: &MpsServer, device: &str) -> Vec<String> {
    let mut lines = serving_notes(server, device);
    lines.extend(limit_notes(server, device));
    lines
}

/// The lines `status` shows under its table for `server`: whom a running server process
/// serves alone (others' clients wait), and where its limits come from when not from the
/// profile. Nothing for a server that serves no one yet, or every user at once (its
/// SHARING cell says `multi-user`).
pub fn status_notes(server: &MpsServer, device: &str) -> Vec<String> {
    let serves = server.server_processes.first().is_some_and(|p| p.uid.is_some());
    let mut lines =
        if serves && !server.multi_user { serving_notes(server, device) } else { Vec::new() };
    lines.extend(limit_notes(server, device));
    lines
}

/// Limits that do not come from the profile, one line each.
fn limit_notes(server: &MpsServer, device: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let defaults = server.daemon_defaults.filter(|d| Some(*d) != server.configured);
    if let (Some(live), Some(configured)) = (defaults, server.configured) {
        lines.push(format!(
            "{device}: limits changed outside gpushare: the daemon's defaults are {} (the profile's: {}); the health check puts the profile's back",
            limits_words(&live),
            limits_words(&configured)
        ));
    }
    for p in &server.server_processes {
        match p.source.as_str() {
            "unknown" => lines.push(format!(
                "{device}: limits changed outside gpushare: server {} has {}; the health check puts back what gpushare set",
                p.pid,
                limits_words(&p.limits)
            )),
            "mps-limit" => {
                let by = p.override_by_uid.map(|uid| format!("by uid {uid}"));
                let at = p.override_at_unix_seconds.map(local_time).filter(|t| !t.is_empty());
                let when: Vec<String> = by.into_iter().chain(at).collect();
                let when =
                    if when.is_empty() { String::new() } else { format!(" ({})", when.join(", ")) };
                let later = server.daemon_defaults.or(server.configured).map_or_else(
                    String::new,
                    |d| format!(" ({})", limits_words(&d)),
                );
                lines.push(format!(
                    "{device}: server {} has {} from gpushare-ctl mps limit{when}, for its new clients; a server the daemon starts later has the daemon's defaults{later}",
                    p.pid,
                    limits_words(&p.limits)
                ));
            }
            _ => {}
        }
    }
    lines
}

/// The server table's columns.
fn server_columns() -> Columns<'static, MpsServer> {
    Columns::<MpsServer>::new()
        .left("GPU", |s| s.gpu.to_string())
        .left("GI", gi_cell)
        .left("UUID", |s| s.uuid.clone())
        .left("STATE", |s| s.state.clone())
        .left("PID", |s| or_dash(s.pid))
        .left("MODE", |s| mode_cell(s).to_owned())
        .left("SERVER", server_cell)
        .right("THREADS", |s| format!("{}%", s.active_thread_percentage))
        .right("MEMORY", |s| or_dash(s.pinned_memory_limit_bytes.map(exact_size)))
        .left("FROM", |s| source_word(s.limits_source.as_deref()).to_owned())
        .right("RESTARTS", |s| s.restarts.to_string())
        .left("CLIENTS", clients_cell)
        .left("PIPE", |s| s.pipe_directory.clone())
}

/// The server table, in the order the agent sent (by GPU and placement), and the lines
/// under it.
pub fn render_status(status: &MpsStatus) -> String {
    if status.servers.is_empty() {
        return "No MPS servers.\n".into();
    }
    let mut text = server_columns().render(&status.servers);
    for server in &status.servers {
        for line in notes(server, &device_words(server)) {
            text.push_str(&line);
            text.push('\n');
        }
    }
    text
}

/// What `mps limit` did: which server process (of which device, GPU and control daemon,
/// serving whom) got which limits, from what, and for which clients.
pub fn render_limit(result: &MpsLimitResult) -> String {
    let mut limits = Vec::new();
    if let Some(threads) = result.active_thread_percentage {
        limits.push(format!("threads {threads}%"));
    }
    if let Some(bytes) = result.pinned_memory_limit_bytes {
        limits.push(format!("pinned memory {}", exact_size(bytes)));
    }
    let on = match (result.gpu, result.daemon_pid) {
        (Some(gpu), Some(daemon)) => {
            format!("GPU {gpu} ({}, control daemon PID {daemon})", result.uuid)
        }
        (Some(gpu), None) => format!("GPU {gpu} ({})", result.uuid),
        _ => result.uuid.clone(),
    };
    let server =
        format!("MPS server PID {} on {on}, serving client {}", result.server_pid, result.pid);
    if limits.is_empty() {
        return format!("Left the limits of {server} as they were\n");
    }
    let mut text = match (result.before, result.after) {
        (before, Some(after)) => {
            let was = before.map_or_else(String::new, |b| format!("{} -> ", limits_words(&b)));
            format!("Set the limits of {server}: {was}{}\n", limits_words(&after))
        }
        _ => format!("Set the limits of {server}: {}\n", limits.join(", ")),
    };
    let whose = match (result.multi_user, result.server_uid) {
        (true, _) => " (of every user: the daemon is multi-user)".to_owned(),
        (false, Some(uid)) => format!(" (all {}'s)", who(uid, result.server_user.as_deref())),
        (false, None) => String::new(),
    };
    text.push_str(&format!(
        "They apply to the clients that connect to this server from now on{whose}; clients already connected keep the limits they started with.\n"
    ));
    let defaults =
        result.daemon_defaults.map_or_else(String::new, |d| format!(" ({})", limits_words(&d)));
    if result.multi_user {
        text.push_str(&format!(
            "A server the daemon starts later (after a restart) begins with its defaults{defaults} again.\n"
        ));
    } else {
        text.push_str(&format!(
            "The daemon serves one user at a time: a server it starts for another user (once this one's clients are gone), or after a restart, begins with its defaults{defaults} again.\n"
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_proto::types::MpsServerProcess;

    const GIB: u64 = 1 << 30;

    fn values(threads: u32, memory: Option<u64>) -> MpsLimitValues {
        MpsLimitValues { active_thread_percentage: threads, pinned_memory_limit_bytes: memory }
    }

    /// A whole-GPU server with two clients, whose server process got 50 % from `mps
    /// limit`, and a multi-user MIG server that is down.
    fn sample() -> MpsStatus {
        MpsStatus {
            servers: vec![
                MpsServer {
                    uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
                    gpu: 0,
                    placement_start: None,
                    gpu_instance_id: None,
                    state: "running".into(),
                    pid: Some(4100),
                    active_thread_percentage: 50,
                    pinned_memory_limit_bytes: Some(2 * GIB),
                    restarts: 0,
                    pipe_directory: "/run/gpushare/mps/GPU-0/pipe".into(),
                    clients: vec![4242, 4243],
                    limits_source: Some("mps-limit".into()),
                    configured: Some(values(25, Some(2 * GIB))),
                    daemon_defaults: Some(values(25, Some(2 * GIB))),
                    server_processes: vec![MpsServerProcess {
                        pid: 4101,
                        uid: Some(0),
                        user: Some("root".into()),
                        limits: values(50, Some(2 * GIB)),
                        source: "mps-limit".into(),
                        override_by_uid: Some(0),
                        override_at_unix_seconds: None,
                    }],
                    multi_user: false,
                    limit_restores: 0,
                },
                MpsServer {
                    uuid: "MIG-11111111-1111-1111-1111-111111111111".into(),
                    gpu: 1,
                    placement_start: Some(4),
                    gpu_instance_id: Some(9),
                    state: "down".into(),
                    pid: None,
                    active_thread_percentage: 100,
                    pinned_memory_limit_bytes: None,
                    restarts: 3,
                    pipe_directory: "/run/gpushare/mps/MIG-1/pipe".into(),
                    clients: vec![],
                    limits_source: None,
                    configured: Some(values(100, None)),
                    daemon_defaults: None,
                    server_processes: Vec::new(),
                    multi_user: true,
                    limit_restores: 0,
                },
            ],
        }
    }

    #[test]
    fn status_table_of_a_gpu_and_a_mig_server() {
        let text = render_status(&sample());
        let expected = "\
GPU  GI  UUID                                      STATE    PID   MODE        SERVER       THREADS  MEMORY  FROM       RESTARTS  CLIENTS    PIPE
0    -   GPU-00000000-0000-0000-0000-000000000000  running  4100  one user    4101 (root)      50%   2 GiB  mps limit         0  4242,4243  /run/gpushare/mps/GPU-0/pipe
1    9   MIG-11111111-1111-1111-1111-111111111111  down     -     multi-user  -               100%       -  -                 3  -          /run/gpushare/mps/MIG-1/pipe
GPU 0: server 4101 serves root's clients only: another user's client waits until they are gone (multi_user = true in the profile serves every user at once)
GPU 0: server 4101 has 50% threads, 2 GiB from gpushare-ctl mps limit (by uid 0), for its new clients; a server the daemon starts later has the daemon's defaults (25% threads, 2 GiB)
";
        assert_eq!(text, expected, "\n{text}");
    }

    #[test]
    fn drift_and_multi_user_are_said_under_the_table() {
        let mut status = sample();
        let gpu0 = &mut status.servers[0];
        gpu0.daemon_defaults = Some(values(90, Some(2 * GIB)));
        gpu0.server_processes[0].source = "unknown".into();
        gpu0.multi_user = true;
        gpu0.limits_source = Some("unknown".into());
        let text = render_status(&status);
        assert!(text.contains("  drift  "), "{text}");
        for line in [
            "GPU 0: multi-user: one server running as root serves every user's clients at once",
            "GPU 0: limits changed outside gpushare: the daemon's defaults are 90% threads, 2 GiB (the profile's: 25% threads, 2 GiB); the health check puts the profile's back",
            "GPU 0: limits changed outside gpushare: server 4101 has 50% threads, 2 GiB;",
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
    }

    #[test]
    fn an_instance_without_a_known_id_is_named_by_its_slot() {
        let mut status = sample();
        status.servers[1].gpu_instance_id = None;
        let text = render_status(&status);
        assert!(text.starts_with("GPU  GI      UUID"), "{text}");
        assert!(text.contains("\n1    slot 4  MIG-1111"), "{text}");
    }

    #[test]
    fn no_servers() {
        assert_eq!(render_status(&MpsStatus { servers: vec![] }), "No MPS servers.\n");
    }

    #[test]
    fn status_document_of_an_older_agent_parses() {
        let raw = r#"{"servers":[{"uuid":"GPU-0","gpu":0,"placement_start":null,"state":"running",
            "pid":7,"active_thread_percentage":50,"pinned_memory_limit_bytes":536870912,
            "restarts":1,"pipe_directory":"/run/p"}]}"#;
        let status: MpsStatus = parse_document(raw, "MpsStatus").unwrap();
        assert!(status.servers[0].clients.is_empty());
        let text = render_status(&status);
        assert!(text.lines().nth(1).unwrap().contains("50%  512 MiB  -"), "{text}");
    }

    #[test]
    fn limit_lines() {
        let mut result = MpsLimitResult {
            pid: 4242,
            server_pid: 4101,
            uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
            active_thread_percentage: Some(50),
            pinned_memory_limit_bytes: None,
            gpu: Some(1),
            daemon_pid: Some(4100),
            before: Some(values(25, Some(2 * GIB))),
            after: Some(values(50, Some(2 * GIB))),
            daemon_defaults: Some(values(25, Some(2 * GIB))),
            server_uid: Some(1000),
            server_user: Some("alice".into()),
            multi_user: false,
        };
        assert_eq!(
            render_limit(&result),
            "Set the limits of MPS server PID 4101 on GPU 1 (GPU-00000000-0000-0000-0000-000000000000, control daemon PID 4100), serving client 4242: 25% threads, 2 GiB -> 50% threads, 2 GiB\n\
             They apply to the clients that connect to this server from now on (all alice's); clients already connected keep the limits they started with.\n\
             The daemon serves one user at a time: a server it starts for another user (once this one's clients are gone), or after a restart, begins with its defaults (25% threads, 2 GiB) again.\n"
        );
        result.multi_user = true;
        let text = render_limit(&result);
        assert!(text.contains("(of every user: the daemon is multi-user)"), "{text}");
        assert!(text.contains("after a restart) begins with its defaults"), "{text}");
        // An older agent's answer: what was set.
        let old = MpsLimitResult {
            gpu: None,
            daemon_pid: None,
            before: None,
            after: None,
            daemon_defaults: None,
            server_uid: None,
            server_user: None,
            active_thread_percentage: None,
            pinned_memory_limit_bytes: Some(512 << 20),
            ..result
        };
        assert!(render_limit(&old).contains("serving client 4242: pinned memory 512 MiB\n"));
        let nothing = MpsLimitResult { pinned_memory_limit_bytes: None, ..old };
        assert!(render_limit(&nothing).starts_with("Left the limits of MPS server PID 4101"));
    }
}
