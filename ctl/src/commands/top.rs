//! `gpushare-ctl top`: `status` and `clients` together, one screen refreshed every
//! `--interval` (see [`super::clients::watch`]):
//!
//! ```text
//! Active profile: mixed  (backend: nvml (simulated driver))
//! GPU 0  A100-SXM4-40GB  MIG on  exclusive  util 30 %  mem 0.5/40 GiB  38 C  124 W  memory 40.0 GiB, processes hold 512 MiB  GPU-0000…
//!   |- 3g.20gb (GI 1, CI 0)  exclusive  memory 19.5 GiB, processes hold 512 MiB  MIG-1111…
//!       PID   USER   UNIT/CONTAINER  WHERE       MEMORY   SHARE  COMMAND
//!       4242  alice  -               GPU 0/GI 1  512 MiB  -      python3 serve.py
//!   `- 1g.5gb (GI 9, CI 0)  mps 25% 2 GiB  memory 4.8 GiB  MIG-2222…
//!       no process
//!   idle: GPU 0 (A100-SXM4-40GB) MIG 1g.5gb (GI 9, CI 0): no process
//! ```
//!
//! Utilisation, memory used, temperature and power come from `Telemetry` (NVML's answers;
//! `-` where the driver gives none, and no such cell from an agent without `Telemetry`).
//! `--json` prints one line per interval: `{"status": …, "clients": …, "telemetry": …}`
//! (`telemetry` null from an agent without it).

use gpushare_proto::clients::{ClientTable, GpuClient};
use gpushare_proto::readable_size;
use gpushare_proto::telemetry::{GpuTelemetryDoc, Telemetry};
use gpushare_proto::types::{GpuStatus, Status};

use super::ExitStatus;
use super::clients::{client_rows, watch};
use super::status::{gib, mig_cell, sharing_cell};
use crate::bus::Client;
use crate::error::CtlError;
use crate::output::{Glyphs, Output, parse_document};

/// Runs `top`.
pub async fn run(client: &mut Client, out: &Output, interval: f64) -> Result<ExitStatus, CtlError> {
    watch(out, interval, "gpushare-ctl top", async || {
        let status = client.call("Status", async |a| a.proxy.status().await).await?;
        let clients = client.call("Clients", async |a| a.proxy.clients().await).await?;
        // An agent without `Telemetry` (older) leaves the readings out; nothing else fails.
        let telemetry = client.call("Telemetry", async |a| a.proxy.telemetry().await).await.ok();
        if out.json {
            let status: serde_json::Value = parse_document(&status, "Status")?;
            let clients: serde_json::Value = parse_document(&clients, "ClientTable")?;
            let telemetry: serde_json::Value = match &telemetry {
                Some(t) => parse_document(t, "Telemetry")?,
                None => serde_json::Value::Null,
            };
            let line = serde_json::json!({
                "status": status, "clients": clients, "telemetry": telemetry
            });
            return Ok(line.to_string());
        }
        let status: Status = parse_document(&status, "Status")?;
        let table: ClientTable = parse_document(&clients, "ClientTable")?;
        let telemetry: Option<Telemetry> =
            telemetry.map(|t| parse_document(&t, "Telemetry")).transpose()?;
        Ok(render(&status, &table, telemetry.as_ref(), out.glyphs()))
    })
    .await
}

/// GPU memory the listed processes hold: `, processes hold 1 GiB`, or nothing when none
/// reports any.
fn held<'a>(clients: impl Iterator<Item = &'a GpuClient>) -> String {
    let bytes: Vec<u64> = clients.filter_map(|c| c.memory_bytes).collect();
    if bytes.is_empty() {
        return String::new();
    }
    format!(", processes hold {}", readable_size(bytes.iter().sum()))
}

/// The processes' table indented by `indent`, or `no process`.
fn rows_or_none(clients: &[&GpuClient], indent: &str) -> String {
    if clients.is_empty() {
        return format!("{indent}no process\n");
    }
    client_rows(clients.iter().copied()).lines().map(|l| format!("{indent}{l}\n")).collect()
}

/// A GPU's readings for its line: `util 37 %  mem 12.1/80 GiB  41 C  182 W  `, each
/// missing value `-`.
pub fn telemetry_cell(t: &GpuTelemetryDoc) -> String {
    fn or_dash<T>(v: Option<T>, f: impl FnOnce(T) -> String) -> String {
        v.map_or_else(|| "-".to_owned(), f)
    }
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    let used = or_dash(t.memory_used_bytes, |b| format!("{:.1}", gib(b)));
    let total = or_dash(t.memory_total_bytes, |b| format!("{:.0}", gib(b)));
    format!(
        "util {} %  mem {used}/{total} GiB  {} C  {} W  ",
        or_dash(t.utilization_percent, |u| u.to_string()),
        or_dash(t.temperature_c, |c| c.to_string()),
        or_dash(t.power_watts, |w| format!("{w:.0}")),
    )
}

/// One view: the active profile, then per GPU its line, its processes on the whole GPU,
/// a line per MIG instance with its processes, and what no one uses on it.
pub fn render(
    status: &Status,
    table: &ClientTable,
    telemetry: Option<&Telemetry>,
    glyphs: Glyphs,
) -> String {
    let backend = match status.backend.as_str() {
        "simulated" => "nvml (simulated driver)",
        other => other,
    };
    let mut text = format!(
        "Active profile: {}  (backend: {backend})\n",
        status.active_profile.as_deref().unwrap_or("(none)")
    );
    if let Some(apply) = &status.apply_in_progress {
        text.push_str(&format!("Apply in progress: {apply}\n"));
    }
    if status.gpus.is_empty() {
        text.push_str("No GPUs found.\n");
    }
    for gpu in &status.gpus {
        let readings = telemetry.and_then(|t| t.gpus.iter().find(|g| g.index == gpu.index));
        text.push_str(&render_gpu(gpu, table, readings, glyphs));
    }
    // Clients of a GPU the status did not list (it changed between the two calls).
    let known = |c: &&GpuClient| status.gpus.iter().any(|g| g.index == c.gpu);
    let strays: Vec<&GpuClient> = table.clients.iter().filter(|c| !known(c)).collect();
    if !strays.is_empty() {
        text.push_str("Other GPUs:\n");
        text.push_str(&rows_or_none(&strays, "    "));
    }
    if table.left_out > 0 {
        text.push_str(&format!("{} more clients not listed by the agent\n", table.left_out));
    }
    text
}

fn render_gpu(
    gpu: &GpuStatus,
    table: &ClientTable,
    readings: Option<&GpuTelemetryDoc>,
    glyphs: Glyphs,
) -> String {
    let on_gpu: Vec<&GpuClient> = table.clients.iter().filter(|c| c.gpu == gpu.index).collect();
    let mut text = format!(
        "GPU {}  {}  MIG {}  {}  {}memory {}{}  {}\n",
        gpu.index,
        gpu.model,
        mig_cell(gpu.mig_enabled, gpu.mig_pending, glyphs),
        sharing_cell(&gpu.sharing),
        readings.map(telemetry_cell).unwrap_or_default(),
        gib(gpu.memory_total_bytes),
        held(on_gpu.iter().copied()),
        gpu.uuid,
    );
    // Processes of no instance that status lists are the whole GPU's.
    let in_instance = |c: &GpuClient, gi: u32| c.gpu_instance_id == Some(gi);
    let whole: Vec<&GpuClient> = on_gpu
        .iter()
        .copied()
        .filter(|c| !gpu.instances.iter().any(|i| in_instance(c, i.gpu_instance_id)))
        .collect();
    if !gpu.mig_enabled || !whole.is_empty() {
        text.push_str(&rows_or_none(&whole, "    "));
    }
    if gpu.mig_enabled && gpu.instances.is_empty() {
        text.push_str(&format!("  {} (no instances)\n", glyphs.tree_last));
    }
    let last = gpu.instances.len().saturating_sub(1);
    for (i, inst) in gpu.instances.iter().enumerate() {
        let branch = if i == last { glyphs.tree_last } else { glyphs.tree_mid };
        let mine: Vec<&GpuClient> =
            on_gpu.iter().copied().filter(|c| in_instance(c, inst.gpu_instance_id)).collect();
        let ci = inst.compute_instance_id.map_or_else(|| "-".to_owned(), |c| c.to_string());
        text.push_str(&format!(
            "  {branch} {} (GI {}, CI {ci})  {}  memory {}{}  {}\n",
            inst.profile,
            inst.gpu_instance_id,
            sharing_cell(&inst.sharing),
            gib(inst.memory_bytes),
            held(mine.iter().copied()),
            inst.uuid.as_deref().unwrap_or("-"),
        ));
        text.push_str(&rows_or_none(&mine, "      "));
    }
    for idle in table.idle.iter().filter(|d| d.gpu == gpu.index) {
        text.push_str(&format!("  idle: {}\n", idle.describe));
    }
    text
}

#[cfg(test)]
mod tests {
    use gpushare_proto::clients::IdleDevice;

    use super::*;
    use crate::commands::status::tests::sample_status;

    fn client(pid: u32, gpu: u32, gi: Option<u32>, memory: Option<u64>) -> GpuClient {
        GpuClient {
            pid,
            uid: Some(1000),
            user: Some("alice".into()),
            command: Some("python3 serve.py".into()),
            unit: None,
            container: None,
            gpu,
            gpu_uuid: format!("GPU-{gpu}"),
            instance: gi.map(|gi| format!("MIG-{gi}")),
            gpu_instance_id: gi,
            via: if gi.is_some() { "mig" } else { "gpu" }.into(),
            mps_server: None,
            memory_bytes: memory,
            share: None,
        }
    }

    #[test]
    fn each_gpu_and_instance_heads_its_processes() {
        let table = ClientTable {
            clients: vec![
                client(4242, 0, Some(1), Some(512 << 20)),
                client(4243, 1, None, Some(1 << 30)),
                client(4244, 1, None, None),
            ],
            idle: vec![IdleDevice {
                gpu: 0,
                uuid: "MIG-2222".into(),
                what: "mig".into(),
                describe: "GPU 0 (A100-SXM4-40GB) MIG 1g.5gb (GI 9, CI 0): no process".into(),
            }],
            left_out: 3,
        };
        let text = render(&sample_status(), &table, None, Glyphs::ASCII);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "Active profile: half-balanced  (backend: nvml (simulated driver))");
        assert_eq!(
            lines[1],
            "GPU 0  A100-SXM4-40GB  MIG on  exclusive  memory 40.0 GiB, processes hold 512 MiB  GPU-00000000-0000-0000-0000-000000000000"
        );
        assert_eq!(
            lines[2],
            "  |- 3g.20gb (GI 1, CI 0)  exclusive  memory 19.5 GiB, processes hold 512 MiB  MIG-11111111-1111-1111-1111-111111111111"
        );
        assert!(lines[3].starts_with("      PID "), "{text}");
        assert!(lines[4].starts_with("      4242 ") && lines[4].contains("GPU 0/GI 1"), "{text}");
        assert_eq!(lines[5], "  `- 1g.5gb (GI 9, CI -)  mps 25% 2 GiB  memory 4.8 GiB  -");
        assert_eq!(lines[6], "      no process");
        assert_eq!(lines[7], "  idle: GPU 0 (A100-SXM4-40GB) MIG 1g.5gb (GI 9, CI 0): no process");
        assert!(lines[8].starts_with("GPU 1  A100-SXM4-40GB  MIG off -> on after reset"), "{text}");
        assert!(lines[8].contains("time-slicing (short)  memory 40.0 GiB, processes hold 1 GiB"));
        assert!(lines[9].starts_with("    PID "), "{text}");
        assert!(lines[10].starts_with("    4243 ") && lines[11].starts_with("    4244 "), "{text}");
        assert_eq!(lines[12], "3 more clients not listed by the agent");
        assert_eq!(lines.len(), 13, "{text}");
    }

    #[test]
    fn a_gpu_without_processes_says_so() {
        let text = render(&sample_status(), &ClientTable::default(), None, Glyphs::ASCII);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[1].ends_with("memory 40.0 GiB  GPU-00000000-0000-0000-0000-000000000000"));
        assert_eq!(lines.iter().filter(|l| l.trim() == "no process").count(), 3, "{text}");
        let empty = Status { gpus: vec![], ..sample_status() };
        assert!(
            render(&empty, &ClientTable::default(), None, Glyphs::ASCII)
                .ends_with("No GPUs found.\n")
        );
    }

    #[test]
    fn the_gpu_line_has_the_readings_and_a_dash_for_each_missing_one() {
        let telemetry = Telemetry {
            gpus: vec![
                GpuTelemetryDoc {
                    index: 0,
                    uuid: "GPU-0".into(),
                    utilization_percent: Some(37),
                    memory_utilization_percent: Some(10),
                    memory_used_bytes: Some(13_000_000_000),
                    memory_total_bytes: Some(85_899_345_920),
                    temperature_c: Some(41),
                    power_watts: Some(181.6),
                    mig_devices: vec![],
                },
                GpuTelemetryDoc { index: 1, uuid: "GPU-1".into(), ..GpuTelemetryDoc::default() },
            ],
        };
        let text =
            render(&sample_status(), &ClientTable::default(), Some(&telemetry), Glyphs::ASCII);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1],
            "GPU 0  A100-SXM4-40GB  MIG on  exclusive  util 37 %  mem 12.1/80 GiB  41 C  182 W  memory 40.0 GiB  GPU-00000000-0000-0000-0000-000000000000"
        );
        let gpu1 = lines.iter().find(|l| l.starts_with("GPU 1 ")).unwrap();
        assert!(
            gpu1.contains("(short)  util - %  mem -/- GiB  - C  - W  memory 40.0 GiB"),
            "{text}"
        );
        // No readings (an agent without Telemetry): the line as before.
        let plain = render(&sample_status(), &ClientTable::default(), None, Glyphs::ASCII);
        assert!(
            plain
                .lines()
                .nth(1)
                .unwrap()
                .ends_with("exclusive  memory 40.0 GiB  GPU-00000000-0000-0000-0000-000000000000")
        );
    }
}
