//! `gpushare-ctl clients`: every process using the GPUs, attributed, one line each,
//! grouped by GPU and instance, then the MIG instances and MPS servers no one uses:
//!
//! ```text
//! PID   USER   UNIT/CONTAINER       WHERE       MEMORY   SHARE                          COMMAND
//! 4242  alice  serve.service        GPU 0       1 GiB    -                              python3 serve.py
//! 4250  bob    container 0123abcd…  GPU 1/GI 3  -        25 % threads, 8 GiB pinned     -
//! Idle:
//!   MIG-…  GPU 1 (A100-SXM4-40GB) MIG 1g.5gb (GI 9, CI 0): no process
//! ```
//!
//! A command line is shown to root and to the process's own user only (`-` otherwise).
//! `--json` prints the [`ClientTable`] document.

use gpushare_proto::clients::{ClientTable, GpuClient};
use gpushare_proto::readable_size;

use super::ExitStatus;
use crate::bus::Client;
use crate::error::CtlError;
use crate::output::{Output, parse_document, plain_table, render_table};

/// Runs `clients`.
pub async fn run(client: &mut Client, out: &Output) -> Result<ExitStatus, CtlError> {
    let raw = client.call("Clients", async |a| a.proxy.clients().await).await?;
    if out.json {
        out.print_document(&raw, "ClientTable")?;
        return Ok(0);
    }
    let table: ClientTable = parse_document(&raw, "ClientTable")?;
    out.print(&render(&table));
    if table.left_out > 0 {
        out.warn(&format!(
            "{} more clients were left out (the agent lists at most {})",
            table.left_out,
            table.clients.len()
        ));
    }
    Ok(0)
}

/// The table for people.
pub fn render(table: &ClientTable) -> String {
    let mut text = String::new();
    if table.clients.is_empty() {
        text.push_str("No process uses the GPUs.\n");
    } else {
        let mut rows =
            plain_table(["PID", "USER", "UNIT/CONTAINER", "WHERE", "MEMORY", "SHARE", "COMMAND"]);
        for c in &table.clients {
            rows.add_row([
                c.pid.to_string(),
                user(c),
                placement(c),
                place(c),
                c.memory_bytes.map_or_else(|| "-".to_string(), readable_size),
                share(c),
                c.command.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        text.push_str(&render_table(&rows));
    }
    if !table.idle.is_empty() {
        text.push_str("Idle:\n");
        for d in &table.idle {
            text.push_str(&format!("  {}  {}\n", d.uuid, d.describe));
        }
    }
    text
}

/// Its user's name, else its uid.
fn user(c: &GpuClient) -> String {
    match (&c.user, c.uid) {
        (Some(name), _) => name.clone(),
        (None, Some(uid)) => uid.to_string(),
        (None, None) => "?".into(),
    }
}

/// `container 0123456789ab`, the unit, or `-`.
fn placement(c: &GpuClient) -> String {
    match (&c.container, &c.unit) {
        (Some(id), _) => format!("container {id}"),
        (None, Some(unit)) => unit.clone(),
        (None, None) => "-".into(),
    }
}

/// `GPU 0`, `GPU 1/GI 3`, `GPU 0 MPS`, `GPU 1/GI 3 MPS`.
fn place(c: &GpuClient) -> String {
    let device = match c.gpu_instance_id {
        Some(gi) => format!("GPU {}/GI {gi}", c.gpu),
        None => format!("GPU {}", c.gpu),
    };
    if c.via == "mps" { format!("{device} MPS") } else { device }
}

/// `25 % threads, 8 GiB pinned` (`own` when the client lowered its percentage), or `-`.
fn share(c: &GpuClient) -> String {
    let Some(s) = &c.share else { return "-".into() };
    let own = if s.from == "client" { " (own)" } else { "" };
    let pinned =
        s.pinned_memory_bytes.map(|b| format!(", {} pinned", readable_size(b))).unwrap_or_default();
    format!("{} % threads{own}{pinned}", s.active_thread_percentage)
}

#[cfg(test)]
mod tests {
    use gpushare_proto::clients::{ClientShare, IdleDevice};

    use super::*;

    fn client(pid: u32, via: &str) -> GpuClient {
        GpuClient {
            pid,
            uid: Some(1000),
            user: Some("alice".into()),
            command: None,
            unit: None,
            container: None,
            gpu: 0,
            gpu_uuid: "GPU-0".into(),
            instance: None,
            gpu_instance_id: None,
            via: via.into(),
            mps_server: None,
            memory_bytes: None,
            share: None,
        }
    }

    #[test]
    fn clients_are_listed_one_line_each_then_idle_capacity() {
        let whole = GpuClient {
            command: Some("python3 serve.py".into()),
            unit: Some("serve.service".into()),
            memory_bytes: Some(1 << 30),
            ..client(4242, "gpu")
        };
        let mps = GpuClient {
            user: None,
            container: Some("0123456789ab".into()),
            unit: Some("docker-x.scope".into()),
            gpu: 1,
            gpu_instance_id: Some(3),
            instance: Some("MIG-c".into()),
            mps_server: Some("MIG-c".into()),
            share: Some(ClientShare {
                active_thread_percentage: 10,
                pinned_memory_bytes: Some(8 << 30),
                from: "client".into(),
            }),
            ..client(4250, "mps")
        };
        let table = ClientTable {
            clients: vec![whole, mps],
            idle: vec![IdleDevice {
                gpu: 1,
                uuid: "MIG-b".into(),
                what: "mig".into(),
                describe: "GPU 1 (A100-SXM4-40GB) MIG 1g.5gb (GI 9, CI 0): no process".into(),
            }],
            left_out: 0,
        };
        let text = render(&table);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        let cols = |line: &str| line.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(
            cols(lines[0]),
            ["PID", "USER", "UNIT/CONTAINER", "WHERE", "MEMORY", "SHARE", "COMMAND"]
        );
        assert!(lines[1].starts_with("4242"), "{text}");
        for word in ["alice", "serve.service", "GPU 0 ", "1 GiB", "python3 serve.py"] {
            assert!(lines[1].contains(word), "{word}: {text}");
        }
        for word in
            ["1000", "container 0123456789ab", "GPU 1/GI 3 MPS", "10 % threads (own), 8 GiB pinned"]
        {
            assert!(lines[2].contains(word), "{word}: {text}");
        }
        assert!(lines[2].trim_end().ends_with('-'), "no command shown: {text}");
        assert_eq!(lines[3], "Idle:");
        assert_eq!(lines[4], "  MIG-b  GPU 1 (A100-SXM4-40GB) MIG 1g.5gb (GI 9, CI 0): no process");

        let empty = ClientTable::default();
        assert_eq!(render(&empty), "No process uses the GPUs.\n");
    }
}
