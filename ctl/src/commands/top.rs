//! `gpushare-ctl top`: `status` and `clients` together, one screen refreshed every
//! `--interval` (see [`super::clients::watch`]):
//!
//! ```text
//! Active profile: mixed  (backend: nvml (simulated driver))
//! GPU 0  A100-SXM4-40GB  MIG on  exclusive  util -  mem 1.5/40 GiB  38 C  124 W  processes hold 1.5 GiB  GPU-0000…
//!   |- 3g.20gb (GI 1, CI 0)  exclusive  memory 19.5 GiB, processes hold 512 MiB  MIG-1111…
//!       PID   USER   UNIT/CONTAINER  WHERE       MEMORY   SHARE  COMMAND
//!       4242  alice  -               GPU 0/GI 1  512 MiB  -      python3 serve.py
//!   |- 3g.20gb (GI 2)  memory 19.5 GiB, processes hold 1 GiB
//!   |  |- 1c.3g.20gb (CI 0)  mps 50%  MIG-3330…
//!   |  |- 1c.3g.20gb (CI 1)  mps 50%  MIG-3331…
//!   |  `- 1c.3g.20gb (CI 2)  exclusive  MIG-3332…
//!       PID   USER   UNIT/CONTAINER  WHERE       MEMORY   SHARE  COMMAND
//!       4250  bob    -               GPU 0/GI 2  1 GiB    -      ./train
//!   `- 1g.5gb (GI 9, CI 0)  mps 25% 2 GiB  memory 4.8 GiB  MIG-2222…
//!       no process
//!   idle: GPU 0 (A100-SXM4-40GB) MIG 1g.5gb (GI 9, CI 0): no process
//! ```
//!
//! A GPU or MIG instance with a fault (issue 42) has a line under its own for each fault,
//! as `status` shows it (`  ! unhealthy: Xid 79 (GPU has fallen off the bus): reboot the
//! node`), and its processes say `(unhealthy)` after their place; the note on the
//! driver's events, when there is one, is a `Health:` line at the top.
//!
//! The GPU line is made from `status`'s GPU table columns, each of which says whether and
//! how the line shows it ([`super::status::gpu_columns`]): a column added there reaches
//! both.
//!
//! A GPU instance split into several compute instances (`"1c.3g" = 3`) has a line of its
//! own, then a line per compute instance (each a MIG device, with its sharing and UUID),
//! then the instance's processes: the driver names the GPU instance of a process, never
//! its compute instance.
//!
//! Utilisation, memory used and total, temperature and power come from `Telemetry`
//! (NVML's answers; `-` where the driver gives none, as utilisation with MIG on). From an
//! agent without `Telemetry` there are no such cells and the line says `memory 40.0 GiB`
//! instead. `--json` prints one line per interval: `{"status": …, "clients": …,
//! "telemetry": …, "time": …}` (`telemetry` null from an agent without it; `time` added by
//! [`watch`]).

use gpushare_proto::clients::{ClientTable, GpuClient};
use gpushare_proto::readable_size;
use gpushare_proto::telemetry::{GpuTelemetryDoc, Telemetry};
use gpushare_proto::types::{GpuStatus, Status};

use super::ExitStatus;
use super::clients::{client_rows, watch};
use super::status::{gib, gpu_fault_lines, gpu_line, instance_fault_lines, sharing_cell};
use crate::bus::Client;
use crate::error::CtlError;
use crate::output::{Glyphs, Output, parse_document, printable};

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

/// GPU memory the listed processes hold: `processes hold 1 GiB`, or nothing when none
/// reports any.
fn processes_hold<'a>(clients: impl Iterator<Item = &'a GpuClient>) -> Option<String> {
    let bytes: Vec<u64> = clients.filter_map(|c| c.memory_bytes).collect();
    if bytes.is_empty() {
        return None;
    }
    Some(format!("processes hold {}", readable_size(bytes.iter().sum())))
}

/// The same after a memory size: `, processes hold 1 GiB`, or nothing.
fn held<'a>(clients: impl Iterator<Item = &'a GpuClient>) -> String {
    processes_hold(clients).map(|h| format!(", {h}")).unwrap_or_default()
}

/// The processes' table indented by `indent`, or `no process`.
fn rows_or_none(clients: &[&GpuClient], indent: &str) -> String {
    if clients.is_empty() {
        return format!("{indent}no process\n");
    }
    client_rows(clients.iter().copied()).lines().map(|l| format!("{indent}{l}\n")).collect()
}

/// A GPU's readings for its line: `util 37 %  mem 12.1/80 GiB  41 C  182 W`, each
/// missing value `-` (`util -`); the total memory is `status`'s (`total`) where the
/// readings have none.
pub fn telemetry_cell(t: &GpuTelemetryDoc, total: u64) -> String {
    fn or_dash<T>(v: Option<T>, f: impl FnOnce(T) -> String) -> String {
        v.map_or_else(|| "-".to_owned(), f)
    }
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    let used = or_dash(t.memory_used_bytes, |b| format!("{:.1}", gib(b)));
    let total = format!("{:.0}", gib(t.memory_total_bytes.unwrap_or(total)));
    format!(
        "util {}  mem {used}/{total} GiB  {} C  {} W",
        or_dash(t.utilization_percent, |u| format!("{u} %")),
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
    if let Some(note) = &status.health_events {
        text.push_str(&format!("Health: {}\n", printable(note)));
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
    // With readings the total memory is in their `mem used/total`, as nvidia-smi shows it;
    // without, the line says it alone.
    let memory = match readings {
        Some(t) => {
            let cells = [
                Some(telemetry_cell(t, gpu.memory_total_bytes)),
                processes_hold(on_gpu.iter().copied()),
            ];
            cells.into_iter().flatten().collect::<Vec<_>>().join("  ")
        }
        None => format!("memory {}{}", gib(gpu.memory_total_bytes), held(on_gpu.iter().copied())),
    };
    // The line has the GPU table's columns that `status` says `top` shows.
    let mut text = format!("{}\n", gpu_line(gpu, &memory, glyphs));
    for fault in gpu_fault_lines(gpu) {
        text.push_str(&format!("  {fault}\n"));
    }
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
        let trunk = if i == last { " " } else { glyphs.tree_trunk };
        let faults: String = instance_fault_lines(gpu, inst.gpu_instance_id)
            .iter()
            .map(|fault| format!("  {trunk}  {fault}\n"))
            .collect();
        if super::status::subdivided(inst) {
            // Subdivided: the GPU instance (no sharing or UUID of its own), then each
            // compute instance, a MIG device of its own, as `status` lists them.
            text.push_str(&format!(
                "  {branch} {} (GI {})  memory {}{}\n",
                inst.profile,
                inst.gpu_instance_id,
                gib(inst.memory_bytes),
                held(mine.iter().copied()),
            ));
            text.push_str(&faults);
            let ci_last = inst.compute_instances.len() - 1;
            for (j, ci) in inst.compute_instances.iter().enumerate() {
                let twig = if j == ci_last { glyphs.tree_last } else { glyphs.tree_mid };
                text.push_str(&format!(
                    "  {trunk}  {twig} {}c.{} (CI {})  {}  {}\n",
                    ci.compute_slices,
                    inst.profile,
                    ci.compute_instance_id,
                    sharing_cell(&ci.sharing),
                    ci.uuid,
                ));
            }
        } else {
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
            text.push_str(&faults);
        }
        // The driver names a process's GPU instance, not its compute instance: the
        // processes are the instance's, after its compute instances.
        text.push_str(&rows_or_none(&mine, "      "));
    }
    // Processes the driver lists that the agent's /proc lacks (another PID namespace).
    for u in table.unseen.iter().filter(|u| u.gpu == gpu.index) {
        let place = u.gpu_instance_id.map(|gi| format!(" in GI {gi}")).unwrap_or_default();
        let memory = u.memory_bytes.map_or_else(|| "-".to_owned(), readable_size);
        text.push_str(&format!(
            "  unseen: PID {}{place}, {memory} (listed by the driver, not in the agent's /proc)\n",
            u.pid
        ));
    }
    for idle in table.idle.iter().filter(|d| d.gpu == gpu.index) {
        text.push_str(&format!("  idle: {}\n", idle.describe));
    }
    text
}

#[cfg(test)]
mod tests {
    use gpushare_proto::clients::IdleDevice;

    use gpushare_proto::types::{ComputeInstanceStatus, Sharing};

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
            unhealthy: None,
        }
    }

    /// Issue 42: the faulted GPU and instance lines are followed by their faults, their
    /// processes marked; a healthy GPU's lines are as before.
    #[test]
    fn a_faulted_gpu_and_instance_show_their_faults() {
        use gpushare_proto::health::HealthFault;
        let fault = |gi: Option<u32>, detail: &str| HealthFault {
            class: "xid".into(),
            xid: Some(79),
            action: "reboot-node".into(),
            gpu_instance_id: gi,
            compute_instance_id: None,
            since_unix_seconds: 1_700_000_000,
            detail: detail.into(),
            clients: Some(Vec::new()),
        };
        let mut status = sample_status();
        let healthy = ClientTable {
            clients: vec![client(4242, 0, Some(1), None), client(4243, 1, None, None)],
            ..ClientTable::default()
        };
        let before = render(&status, &healthy, None, Glyphs::ASCII);
        assert!(!before.contains("unhealthy") && !before.contains("Health:"), "{before}");

        status.gpus[0].health = vec![fault(Some(1), "Xid 94 (Contained ECC error): restart")];
        status.gpus[1].health = vec![fault(None, "Xid 79 (fallen off the bus): reboot the node")];
        status.health_events = Some("events not watched on GPU 1: not supported".into());
        let mut table = healthy.clone();
        table.clients[0].unhealthy = Some("Xid 94 (Contained ECC error): restart".into());
        table.clients[1].unhealthy = Some("Xid 79 (fallen off the bus): reboot the node".into());
        let text = render(&status, &table, None, Glyphs::ASCII);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "Health: events not watched on GPU 1: not supported", "{text}");
        let at = |start: &str| {
            lines.iter().position(|l| l.starts_with(start)).unwrap_or_else(|| panic!("{text}"))
        };
        let instance = at("  |- 3g.20gb (GI 1, CI 0)");
        assert_eq!(
            lines[instance + 1],
            "  |  ! unhealthy: MIG instance 1: Xid 94 (Contained ECC error): restart"
        );
        assert!(lines[instance + 3].contains("GPU 0/GI 1 (unhealthy)"), "{text}");
        let gpu1 = at("GPU 1 ");
        assert_eq!(lines[gpu1 + 1], "  ! unhealthy: Xid 79 (fallen off the bus): reboot the node");
        assert!(lines[gpu1 + 3].contains("GPU 1 (unhealthy)"), "{text}");
        // The healthy instance has no fault line.
        let other = at("  `- 1g.5gb");
        assert!(!lines[other + 1].contains("unhealthy"), "{text}");
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
            unseen: Vec::new(),
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
    fn processes_the_agent_cannot_see_are_said_under_their_gpu() {
        let status = sample_status();
        let unseen = gpushare_proto::clients::UnseenProcess {
            pid: 999_999,
            gpu: status.gpus[0].index,
            gpu_instance_id: Some(2),
            memory_bytes: Some(512 << 20),
        };
        let table = ClientTable { unseen: vec![unseen], ..ClientTable::default() };
        let text = render(&status, &table, None, Glyphs::ASCII);
        let line = "  unseen: PID 999999 in GI 2, 512 MiB (listed by the driver, not in the agent's /proc)";
        assert!(text.lines().any(|l| l == line), "{text}");
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
        let table = ClientTable {
            clients: vec![client(4243, 1, None, Some(1 << 30))],
            ..ClientTable::default()
        };
        let text = render(&sample_status(), &table, Some(&telemetry), Glyphs::ASCII);
        let lines: Vec<&str> = text.lines().collect();
        // The total memory once, in `mem used/total` (the readings' own total).
        assert_eq!(
            lines[1],
            "GPU 0  A100-SXM4-40GB  MIG on  exclusive  util 37 %  mem 12.1/80 GiB  41 C  182 W  GPU-00000000-0000-0000-0000-000000000000"
        );
        // Unknown readings are `-`, utilisation without its unit; the total is status's
        // where the readings have none.
        let gpu1 = lines.iter().find(|l| l.starts_with("GPU 1 ")).unwrap();
        assert_eq!(
            *gpu1,
            "GPU 1  A100-SXM4-40GB  MIG off -> on after reset  time-slicing (short)  util -  mem -/40 GiB  - C  - W  processes hold 1 GiB  GPU-11111111-0000-0000-0000-000000000000",
            "{text}"
        );
        assert!(!text.contains("memory 40.0 GiB") && !text.contains(" - %"), "{text}");
        // The instances keep their memory.
        assert!(lines[2].contains("  exclusive  memory 19.5 GiB  MIG-1111"), "{text}");
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

    /// GPU 0's first instance (GI 1) split into three 1c compute instances, two under
    /// MPS, and a process the driver places in GI 1 only.
    fn subdivided() -> (Status, ClientTable) {
        let mut status = sample_status();
        let mps = status.gpus[0].instances[1].sharing.clone();
        let ci = |id: u32, sharing: Sharing| ComputeInstanceStatus {
            compute_instance_id: id,
            compute_slices: 1,
            uuid: format!("MIG-3333333{id}-3333-3333-3333-333333333333"),
            sharing,
        };
        status.gpus[0].instances[0].compute_instances =
            vec![ci(0, mps.clone()), ci(1, mps), ci(2, Sharing::exclusive())];
        let mut process = client(4250, 0, Some(1), Some(1 << 30));
        process.instance = None;
        let table = ClientTable { clients: vec![process], ..ClientTable::default() };
        (status, table)
    }

    #[test]
    fn a_subdivided_instance_lists_its_compute_instances_and_then_its_processes() {
        let (status, table) = subdivided();
        let text = render(&status, &table, None, Glyphs::ASCII);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1],
            "GPU 0  A100-SXM4-40GB  MIG on  exclusive  memory 40.0 GiB, processes hold 1 GiB  GPU-00000000-0000-0000-0000-000000000000"
        );
        // The GPU instance: no sharing or UUID of its own (not its first compute
        // instance's), then each compute instance as `status` names it.
        assert_eq!(lines[2], "  |- 3g.20gb (GI 1)  memory 19.5 GiB, processes hold 1 GiB");
        assert_eq!(
            lines[3],
            "  |  |- 1c.3g.20gb (CI 0)  mps 25% 2 GiB  MIG-33333330-3333-3333-3333-333333333333"
        );
        assert_eq!(
            lines[4],
            "  |  |- 1c.3g.20gb (CI 1)  mps 25% 2 GiB  MIG-33333331-3333-3333-3333-333333333333"
        );
        assert_eq!(
            lines[5],
            "  |  `- 1c.3g.20gb (CI 2)  exclusive  MIG-33333332-3333-3333-3333-333333333333"
        );
        // The processes are the GPU instance's, after all its compute instances.
        assert!(lines[6].starts_with("      PID "), "{text}");
        assert!(lines[7].starts_with("      4250 ") && lines[7].contains("GPU 0/GI 1"), "{text}");
        // The next instance (one compute instance) as before.
        assert_eq!(lines[8], "  `- 1g.5gb (GI 9, CI -)  mps 25% 2 GiB  memory 4.8 GiB  -");
        assert_eq!(lines[9], "      no process");
        assert!(lines[10].starts_with("GPU 1 "), "{text}");
        assert_eq!(text.matches("1c.3g.20gb").count(), 3, "{text}");
        assert_eq!(text.matches("4250").count(), 1, "{text}");

        // As the last instance: no trunk left of its compute instances.
        let mut last = status.clone();
        last.gpus[0].instances.swap(0, 1);
        let text = render(&last, &ClientTable::default(), None, Glyphs::UNICODE);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[4], "  └─ 3g.20gb (GI 1)  memory 19.5 GiB");
        assert!(lines[5].starts_with("     ├─ 1c.3g.20gb (CI 0)  mps 25%"), "{text}");
        assert!(lines[7].starts_with("     └─ 1c.3g.20gb (CI 2)  exclusive  MIG-3"), "{text}");
        assert_eq!(lines[8], "      no process");
    }

    #[test]
    fn one_smaller_compute_instance_is_listed_as_a_subdivision() {
        let (mut status, table) = subdivided();
        status.gpus[0].instances[0].compute_instances.truncate(1);
        let text = render(&status, &table, None, Glyphs::ASCII);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[2], "  |- 3g.20gb (GI 1)  memory 19.5 GiB, processes hold 1 GiB");
        assert!(lines[3].starts_with("  |  `- 1c.3g.20gb (CI 0)  mps 25%"), "{text}");
    }

    #[test]
    fn one_compute_instance_keeps_the_instance_on_one_line() {
        let (mut status, table) = subdivided();
        status.gpus[0].instances[0].compute_instances.truncate(1);
        status.gpus[0].instances[0].compute_instances[0].compute_slices = 3;
        let text = render(&status, &table, None, Glyphs::ASCII);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[2],
            "  |- 3g.20gb (GI 1, CI 0)  exclusive  memory 19.5 GiB, processes hold 1 GiB  MIG-11111111-1111-1111-1111-111111111111"
        );
        assert!(lines[3].starts_with("      PID ") && lines[4].starts_with("      4250 "));
        assert!(!text.contains("c.3g"), "{text}");
    }
}
