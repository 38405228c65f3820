//! `gpushare-ctl mps [status]` and `gpushare-ctl mps limit --pid PID [--threads PCT]
//! [--memory SIZE]`.
//!
//! ```text
//! GPU  GI  UUID                                      STATE    PID   THREADS  MEMORY  RESTARTS  CLIENTS    PIPE
//! 0    -   GPU-00000000-0000-0000-0000-000000000000  running  4100      25%   2 GiB         0  4242,4243  /run/gpushare/mps/GPU-…/pipe
//! 1    9   MIG-11111111-1111-1111-1111-111111111111  down     -        100%       -         3  -          /run/gpushare/mps/MIG-…/pipe
//! ```
//!
//! GI is the GPU instance id of the MIG instance a server serves (`-` for a whole GPU), as
//! `status` and `nvidia-smi` show it (`slot N` when the agent no longer finds the instance).
//! THREADS and MEMORY
//! are the server's default active thread percentage and pinned memory limit of its
//! clients. `limit` sets those of the server that serves one client:
//! MPS applies them to the server's new clients, not to those already connected.

use comfy_table::CellAlignment;
use gpushare_proto::types::{MpsLimitResult, MpsServer, MpsStatus};

use super::ExitStatus;
use crate::bus::Client;
use crate::cli::{MpsCommand, MpsLimitArgs};
use crate::error::CtlError;
use crate::output::{Output, exact_size, parse_document, plain_table, render_table};

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

/// The server table, in the order the agent sent (by GPU and placement).
pub fn render_status(status: &MpsStatus) -> String {
    if status.servers.is_empty() {
        return "No MPS servers.\n".into();
    }
    let mut table = plain_table([
        "GPU", "GI", "UUID", "STATE", "PID", "THREADS", "MEMORY", "RESTARTS", "CLIENTS", "PIPE",
    ]);
    for column in [5, 6, 7] {
        if let Some(c) = table.column_mut(column) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    for server in &status.servers {
        table.add_row(vec![
            server.gpu.to_string(),
            gi_cell(server),
            server.uuid.clone(),
            server.state.clone(),
            or_dash(server.pid),
            format!("{}%", server.active_thread_percentage),
            or_dash(server.pinned_memory_limit_bytes.map(exact_size)),
            server.restarts.to_string(),
            clients_cell(server),
            server.pipe_directory.clone(),
        ]);
    }
    render_table(&table)
}

/// One line: which server got which limits, and that they apply to its new clients.
pub fn render_limit(result: &MpsLimitResult) -> String {
    let mut limits = Vec::new();
    if let Some(threads) = result.active_thread_percentage {
        limits.push(format!("threads {threads}%"));
    }
    if let Some(bytes) = result.pinned_memory_limit_bytes {
        limits.push(format!("pinned memory {}", exact_size(bytes)));
    }
    let server = format!(
        "MPS server PID {} on {} (serving client {})",
        result.server_pid, result.uuid, result.pid
    );
    if limits.is_empty() {
        return format!("Left the limits of {server} as they were\n");
    }
    format!(
        "Set the limits of {server}: {}; they apply to the server's new clients\n",
        limits.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// A whole-GPU server with two clients and limits, and a MIG server that is down.
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
                    active_thread_percentage: 25,
                    pinned_memory_limit_bytes: Some(2 * GIB),
                    restarts: 0,
                    pipe_directory: "/run/gpushare/mps/GPU-0/pipe".into(),
                    clients: vec![4242, 4243],
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
                },
            ],
        }
    }

    #[test]
    fn status_table_of_a_gpu_and_a_mig_server() {
        let text = render_status(&sample());
        let expected = "\
GPU  GI  UUID                                      STATE    PID   THREADS  MEMORY  RESTARTS  CLIENTS    PIPE
0    -   GPU-00000000-0000-0000-0000-000000000000  running  4100      25%   2 GiB         0  4242,4243  /run/gpushare/mps/GPU-0/pipe
1    9   MIG-11111111-1111-1111-1111-111111111111  down     -        100%       -         3  -          /run/gpushare/mps/MIG-1/pipe
";
        assert_eq!(text, expected, "\n{text}");
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
    fn status_document_parses_without_clients() {
        let raw = r#"{"servers":[{"uuid":"GPU-0","gpu":0,"placement_start":null,"state":"running",
            "pid":7,"active_thread_percentage":50,"pinned_memory_limit_bytes":536870912,
            "restarts":1,"pipe_directory":"/run/p"}]}"#;
        let status: MpsStatus = parse_document(raw, "MpsStatus").unwrap();
        assert!(status.servers[0].clients.is_empty());
        let text = render_status(&status);
        assert!(text.lines().nth(1).unwrap().contains("50%  512 MiB"), "{text}");
    }

    #[test]
    fn limit_lines() {
        let mut result = MpsLimitResult {
            pid: 4242,
            server_pid: 4100,
            uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
            active_thread_percentage: Some(25),
            pinned_memory_limit_bytes: Some(2 * GIB),
        };
        assert_eq!(
            render_limit(&result),
            "Set the limits of MPS server PID 4100 on GPU-00000000-0000-0000-0000-000000000000 (serving client 4242): threads 25%, pinned memory 2 GiB; they apply to the server's new clients\n"
        );
        result.active_thread_percentage = None;
        result.pinned_memory_limit_bytes = Some(512 << 20);
        assert!(render_limit(&result).contains("(serving client 4242): pinned memory 512 MiB; "));
        result.active_thread_percentage = Some(10);
        result.pinned_memory_limit_bytes = None;
        assert!(render_limit(&result).contains("(serving client 4242): threads 10%; "));
        result.active_thread_percentage = None;
        assert!(render_limit(&result).starts_with("Left the limits of MPS server PID 4100"));
    }
}
