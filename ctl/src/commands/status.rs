//! `gpushare-ctl status`: the GPUs, their MIG instances and sharing, the active profile.
//!
//! ```text
//! Active profile: half-balanced  (backend: nvml (simulated driver))
//! Apply in progress: /io/gpushare/Agent1/jobs/3, profile all-mps
//! Bench running on GPU 1 for 2 min 5 s, started by ada (uid 1000): /io/gpushare/Agent1/jobs/4
//!   At its end GPU 1 goes back to: MIG off, compute mode default, no MPS (profile active when it began: half-balanced)
//! GPU  MODEL           MIG                    COMPUTE MODE       SHARING                 MEMORY  PROCS  PLACEMENT  GI/CI  UUID
//! 0    A100-SXM4-40GB  on                     default            exclusive             40.0 GiB      0
//!      |- 3g.20gb                                                exclusive             19.5 GiB         4:4        1/0    MIG-1111…
//!      `- 1g.5gb                                                 mps 25% 2 GiB          4.8 GiB         0:1        9/0    MIG-2222…
//! 1    A100-SXM4-40GB  off -> on after reset  exclusive_process  time-slicing (short)  40.0 GiB      2
//! ```
//!
//! The `Apply in progress` line appears only while an apply runs, the two `Bench` lines
//! only while a bench holds a GPU (never its command). The PLACEMENT, GI/CI and
//! UUID columns appear only when some GPU has MIG instances. SHARING is the strategy, with
//! the thread percentage and pinned memory limit a client connecting to the MPS server now
//! gets under `mps` (as the control daemon answers them), marked `(mps limit)` when an
//! override of `gpushare-ctl mps limit` gives them, `(drift)` when they were changed outside
//! gpushare, and `multi-user` for a daemon serving every user at once; and the
//! time-slice interval under `time-slicing` when the agent reports one. Lines under the
//! table say whom each MPS server serves (one user at a time, unless multi-user) and what
//! the markers stand for (`gpushare-ctl mps` has them all).
//!
//! A GPU or MIG instance with a fault (issue 42) has a line under its row for each fault,
//! saying it is unhealthy, what the driver reported and what it asks for (`! unhealthy:
//! Xid 79 (GPU has fallen off the bus): reboot the node`); a fault of an instance the table
//! does not list goes under its GPU, naming the instance. When the driver's events are not
//! watched, a `Health:` line above the table says why. A healthy node shows none of these.
//!
//! The GPU table is a list of columns ([`gpu_columns`]: header, alignment, the cell of each
//! kind of row, and what `top`'s GPU line shows of it): a new column is one entry there.

use gpushare_proto::Strategy;
use gpushare_proto::health::HealthFault;
use gpushare_proto::types::{
    BenchStatus, ComputeInstanceStatus, GpuStatus, InstanceStatus, Sharing, Status,
};

use super::ExitStatus;
use crate::bus::Client;
use crate::error::CtlError;
use crate::output::{Glyphs, Output, exact_size, parse_document, printable};
use crate::table::{self, Align, Column};

/// Runs `status`.
pub async fn run(client: &mut Client, out: &Output) -> Result<ExitStatus, CtlError> {
    let raw = client.call("Status", async |a| a.proxy.status().await).await?;
    if out.json {
        out.print_document(&raw, "Status")?;
    } else {
        let status: Status = parse_document(&raw, "Status")?;
        out.print(&render_status(&status, out.glyphs()));
    }
    Ok(0)
}

/// Bytes as GiB with one decimal: `40.0 GiB`.
pub fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn on_off(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}

/// The MIG cell: `on`, `off`, or `off → on after reset` when a change waits for a reset.
pub fn mig_cell(enabled: bool, pending: Option<bool>, glyphs: Glyphs) -> String {
    match pending {
        Some(p) if p != enabled => {
            format!("{} {} {} after reset", on_off(enabled), glyphs.arrow, on_off(p))
        }
        _ => on_off(enabled).to_owned(),
    }
}

/// The SHARING cell: `exclusive`, `mps 25% 2 GiB` (threads and pinned memory limit a client
/// of the MPS server gets now, when known, with where they come from unless the profile:
/// `(mps limit)`, `(drift)`; `multi-user` for a daemon serving every user at once),
/// `time-slicing (short, 4 replicas)` (with the interval, when known, and the replicas the
/// profile meant it for, when it gave them).
pub fn sharing_cell(sharing: &Sharing) -> String {
    let mut cell = sharing.strategy.clone();
    match Strategy::from_name(&sharing.strategy) {
        Some(Strategy::Mps) => {
            if let Some(mps) = &sharing.mps {
                cell.push_str(&format!(" {}%", mps.active_thread_percentage));
                if let Some(bytes) = mps.pinned_memory_limit_bytes {
                    cell.push_str(&format!(" {}", exact_size(bytes)));
                }
                match mps.limits_source.as_deref() {
                    Some("mps-limit") => cell.push_str(" (mps limit)"),
                    Some("unknown") => cell.push_str(" (drift)"),
                    _ => {}
                }
                if mps.multi_user {
                    cell.push_str(" multi-user");
                }
            }
        }
        Some(Strategy::TimeSlicing) => match (&sharing.interval, sharing.replicas) {
            (Some(interval), Some(r)) => cell.push_str(&format!(" ({interval}, {r} replicas)")),
            (Some(interval), None) => cell.push_str(&format!(" ({interval})")),
            (None, Some(r)) => cell.push_str(&format!(" ({r} replicas)")),
            (None, None) => {}
        },
        _ => {}
    }
    cell
}

/// Whether a GPU instance is subdivided: more than one compute instance, or one smaller
/// than the instance (a 3g holding only a 2c). Such an instance lists its compute
/// instances, each a MIG device of its own.
pub(crate) fn subdivided(inst: &gpushare_proto::types::InstanceStatus) -> bool {
    let gi_slices = inst.profile.split_once('g').and_then(|(n, _)| n.parse::<u32>().ok());
    match inst.compute_instances.as_slice() {
        [] => false,
        [only] => gi_slices.is_some_and(|g| only.compute_slices != g),
        _ => true,
    }
}

/// Every MPS server `status` shows (of whole GPUs, MIG instances and compute instances).
fn mps_servers(status: &Status) -> impl Iterator<Item = &gpushare_proto::types::MpsServer> {
    status.gpus.iter().flat_map(|g| {
        let instances = g.instances.iter().flat_map(|i| {
            let cis = i.compute_instances.iter().filter_map(|c| c.sharing.mps.as_ref());
            // An instance used whole shows its one compute instance's server as its own.
            let whole = (!subdivided(i)).then_some(i.sharing.mps.as_ref()).flatten();
            whole.into_iter().chain(cis.filter(move |_| subdivided(i)))
        });
        g.sharing.mps.as_ref().into_iter().chain(instances)
    })
}

/// A running bench for people: on which GPU, for how long, whose, and what its GPU goes
/// back to.
fn bench_lines(bench: &BenchStatus) -> String {
    let who = match &bench.user {
        Some(name) => format!("{name} (uid {})", bench.uid),
        None => format!("uid {}", bench.uid),
    };
    format!(
        "Bench running on GPU {gpu} for {}, started by {who}: {}\n  At its end GPU {gpu} goes back to: {} (profile active when it began: {})\n  To stop it now (its user or root): gpushare-ctl cancel {}\n",
        gpushare_base::duration::worded(bench.running_seconds),
        bench.job,
        bench.restores,
        bench.profile_before.as_deref().unwrap_or("(none)"),
        job_number(&bench.job),
        gpu = bench.gpu,
    )
}

/// A job's number (`3` of `/io/gpushare/Agent1/jobs/3`), or its path as it is.
fn job_number(job: &str) -> &str {
    job.rsplit_once('/')
        .map(|(_, n)| n)
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .unwrap_or(job)
}

/// A row of the GPU table: a GPU, a MIG instance, one of the compute instances of a
/// subdivided instance, or the line saying a MIG GPU has no instances.
#[derive(Clone, Copy)]
pub enum Line<'a> {
    Gpu(&'a GpuStatus),
    NoInstances,
    Instance(&'a InstanceStatus),
    ComputeInstance(&'a InstanceStatus, &'a ComputeInstanceStatus),
}

/// A [`Line`] with the tree drawn before its name (`|-`, `|  `- `) and the glyphs.
pub struct GpuRow<'a> {
    pub line: Line<'a>,
    pub tree: String,
    pub glyphs: Glyphs,
}

impl<'a> GpuRow<'a> {
    /// A GPU's row.
    pub fn gpu(gpu: &'a GpuStatus, glyphs: Glyphs) -> Self {
        GpuRow { line: Line::Gpu(gpu), tree: String::new(), glyphs }
    }
}

/// Where `top`'s GPU line (`GPU 0  A100-SXM4-40GB  MIG on  exclusive  util …  GPU-…`)
/// shows a column of the GPU table.
pub enum OnTop {
    /// Not on it.
    No,
    /// The GPU row's cell, after a label (`GPU `, `MIG `, or none).
    Cell(&'static str),
    /// What only the line shows of the GPU (its UUID: the table's is the MIG devices').
    Own(fn(&GpuStatus) -> String),
    /// Top's readings of the GPU (utilisation, memory, temperature, power, what its
    /// processes hold), or its memory from an agent without them.
    Readings,
}

/// A column of the GPU table (`status`), and where `top`'s GPU line shows it.
pub struct GpuColumn<'a> {
    pub column: Column<'static, GpuRow<'a>>,
    /// Shown only when some GPU has MIG instances.
    pub with_instances_only: bool,
    pub top: OnTop,
}

impl<'a> GpuColumn<'a> {
    fn new(
        header: &'static str,
        align: Align,
        top: OnTop,
        cell: impl Fn(&GpuRow<'a>) -> String + 'static,
    ) -> Self {
        let column = Column { align, ..Column::left(header, cell) };
        GpuColumn { column, with_instances_only: false, top }
    }

    /// The same, shown only when some GPU has MIG instances.
    fn with_instances_only(self) -> Self {
        GpuColumn { with_instances_only: true, ..self }
    }
}

/// The GPU table's columns, in order: a new column of `status` (and of `top`'s GPU line)
/// is one entry here.
pub fn gpu_columns<'a>() -> Vec<GpuColumn<'a>> {
    use Align::{Left, Right};
    vec![
        GpuColumn::new("GPU", Left, OnTop::Cell("GPU "), |r| match r.line {
            Line::Gpu(g) => g.index.to_string(),
            _ => String::new(),
        }),
        GpuColumn::new("MODEL", Left, OnTop::Cell(""), |r| match r.line {
            Line::Gpu(g) => g.model.clone(),
            Line::NoInstances => format!("{} (no instances)", r.tree),
            Line::Instance(i) => format!("{} {}", r.tree, i.profile),
            Line::ComputeInstance(i, ci) => {
                format!("{} {}c.{}", r.tree, ci.compute_slices, i.profile)
            }
        }),
        GpuColumn::new("MIG", Left, OnTop::Cell("MIG "), |r| match r.line {
            Line::Gpu(g) => mig_cell(g.mig_enabled, g.mig_pending, r.glyphs),
            _ => String::new(),
        }),
        GpuColumn::new("COMPUTE MODE", Left, OnTop::No, |r| match r.line {
            Line::Gpu(g) => g.compute_mode.clone(),
            _ => String::new(),
        }),
        GpuColumn::new("SHARING", Left, OnTop::Cell(""), |r| match r.line {
            Line::Gpu(g) => sharing_cell(&g.sharing),
            Line::NoInstances => String::new(),
            Line::Instance(i) => sharing_cell(&i.sharing),
            Line::ComputeInstance(_, ci) => sharing_cell(&ci.sharing),
        }),
        GpuColumn::new("MEMORY", Right, OnTop::Readings, |r| match r.line {
            Line::Gpu(g) => gib(g.memory_total_bytes),
            Line::Instance(i) => gib(i.memory_bytes),
            _ => String::new(),
        }),
        GpuColumn::new("PROCS", Right, OnTop::No, |r| match r.line {
            Line::Gpu(g) => g.processes.len().to_string(),
            _ => String::new(),
        }),
        GpuColumn::new("PLACEMENT", Left, OnTop::No, |r| match r.line {
            Line::Instance(i) => format!("{}:{}", i.placement_start, i.placement_size),
            _ => String::new(),
        })
        .with_instances_only(),
        GpuColumn::new("GI/CI", Left, OnTop::No, |r| match r.line {
            Line::Instance(i) => format!(
                "{}/{}",
                i.gpu_instance_id,
                i.compute_instance_id.map_or_else(|| "-".to_owned(), |c| c.to_string())
            ),
            Line::ComputeInstance(i, ci) => {
                format!("{}/{}", i.gpu_instance_id, ci.compute_instance_id)
            }
            _ => String::new(),
        })
        .with_instances_only(),
        GpuColumn::new("UUID", Left, OnTop::Own(|g| g.uuid.clone()), |r| match r.line {
            Line::Instance(i) => i.uuid.as_deref().unwrap_or("-").to_owned(),
            Line::ComputeInstance(_, ci) => ci.uuid.clone(),
            _ => String::new(),
        })
        .with_instances_only(),
    ]
}

/// The GPU table's rows: each GPU, then its MIG instances as a tree, a subdivided
/// instance's compute instances under it.
fn gpu_rows(status: &Status, glyphs: Glyphs) -> Vec<GpuRow<'_>> {
    let mut rows = Vec::new();
    let row = |line, tree: String| GpuRow { line, tree, glyphs };
    for gpu in &status.gpus {
        rows.push(GpuRow::gpu(gpu, glyphs));
        if gpu.mig_enabled && gpu.instances.is_empty() {
            rows.push(row(Line::NoInstances, glyphs.tree_last.to_owned()));
        }
        let last = gpu.instances.len().saturating_sub(1);
        for (i, inst) in gpu.instances.iter().enumerate() {
            let branch = if i == last { glyphs.tree_last } else { glyphs.tree_mid };
            rows.push(row(Line::Instance(inst), branch.to_owned()));
            // A subdivided instance: one row per compute instance, each its own MIG device.
            if subdivided(inst) {
                let trunk = if i == last { " " } else { glyphs.tree_trunk };
                let ci_last = inst.compute_instances.len() - 1;
                for (j, ci) in inst.compute_instances.iter().enumerate() {
                    let twig = if j == ci_last { glyphs.tree_last } else { glyphs.tree_mid };
                    rows.push(row(Line::ComputeInstance(inst, ci), format!("{trunk}  {twig}")));
                }
            }
        }
    }
    rows
}

/// What says a fault in a line of its own: `! unhealthy: Xid 79 (…): reboot the node`.
const UNHEALTHY: &str = "! unhealthy: ";

/// The fault lines of `gpu`'s own row (without indent): its faults on the whole GPU, and
/// those of MIG instances it does not list, each naming its instance.
pub fn gpu_fault_lines(gpu: &GpuStatus) -> Vec<String> {
    let listed = |gi: u32| gpu.instances.iter().any(|i| i.gpu_instance_id == gi);
    gpu.health
        .iter()
        .filter(|f| f.gpu_instance_id.is_none_or(|gi| !listed(gi)))
        .map(fault_line)
        .collect()
}

/// The fault lines of the MIG instance `gi` of `gpu` (without indent).
pub fn instance_fault_lines(gpu: &GpuStatus, gi: u32) -> Vec<String> {
    gpu.health.iter().filter(|f| f.gpu_instance_id == Some(gi)).map(fault_line).collect()
}

/// One fault's line: `! unhealthy: DETAIL`, naming its instance where it has one
/// (`MIG instance 3/0: `); what the agent says is shown without control characters.
fn fault_line(fault: &HealthFault) -> String {
    let place = match (fault.gpu_instance_id, fault.compute_instance_id) {
        (Some(gi), Some(ci)) => format!("MIG instance {gi}/{ci}: "),
        (Some(gi), None) => format!("MIG instance {gi}: "),
        _ => String::new(),
    };
    format!("{UNHEALTHY}{place}{}", printable(&fault.detail))
}

/// The rendered GPU table with each row's fault lines under it, in the MODEL column's
/// place, a MIG instance's after the tree's trunk.
fn with_fault_lines(table: &str, rows: &[GpuRow<'_>], glyphs: Glyphs) -> String {
    let mut lines = table.lines();
    let header = lines.next().unwrap_or_default();
    let indent = " ".repeat(header.find("MODEL").unwrap_or(0));
    let mut out = format!("{header}\n");
    // The GPU the rows are under.
    let mut gpu = None;
    for (row, line) in rows.iter().zip(lines) {
        out.push_str(line);
        out.push('\n');
        let (faults, trunk) = match (row.line, gpu) {
            (Line::Gpu(g), _) => {
                gpu = Some(g);
                (gpu_fault_lines(g), String::new())
            }
            (Line::Instance(i), Some(g)) => {
                let trunk = if row.tree == glyphs.tree_mid { glyphs.tree_trunk } else { " " };
                (instance_fault_lines(g, i.gpu_instance_id), format!("{trunk}  "))
            }
            _ => (Vec::new(), String::new()),
        };
        for fault in faults {
            out.push_str(&format!("{indent}{trunk}{fault}\n"));
        }
    }
    out
}

/// `top`'s line of `gpu`, from the GPU table's columns: `GPU 0  A100-SXM4-40GB  MIG on
/// exclusive  {readings}  GPU-…`.
pub fn gpu_line(gpu: &GpuStatus, readings: &str, glyphs: Glyphs) -> String {
    let row = GpuRow::gpu(gpu, glyphs);
    let parts: Vec<String> = gpu_columns()
        .iter()
        .filter_map(|c| match c.top {
            OnTop::No => None,
            OnTop::Cell(label) => Some(format!("{label}{}", (c.column.cell)(&row))),
            OnTop::Own(part) => Some(part(gpu)),
            OnTop::Readings => Some(readings.to_owned()),
        })
        .collect();
    parts.join("  ")
}

/// Renders a status document for people.
pub fn render_status(status: &Status, glyphs: Glyphs) -> String {
    // A profile applied from a file says so: it is not the known profile of that name.
    let source = match (&status.active_profile, status.active_source.as_deref()) {
        (Some(_), Some(source)) if source != "built-in" => format!(", from {source}"),
        _ => String::new(),
    };
    // Both drive NVML; `simulated` is the NVML backend on gpushare's simulated driver.
    let backend = match status.backend.as_str() {
        "simulated" => "nvml (simulated driver)",
        other => other,
    };
    let mut out = format!(
        "Active profile: {}{source}  (backend: {backend})\n",
        status.active_profile.as_deref().unwrap_or("(none)"),
    );
    if let Some(why) = &status.hands_off {
        out.push_str(&format!("Hands-off (no GPU changes): {why}\n"));
    }
    if let Some(error) = &status.start_up_error {
        out.push_str(&format!("Start-up re-apply failed: {error}\n"));
    }
    // The start-up re-apply's failure is said once, above.
    if let Some(error) =
        status.apply_error.as_ref().filter(|e| status.start_up_error.as_ref() != Some(*e))
    {
        out.push_str(&format!("Last apply failed: {error}\n"));
    }
    if let Some(drift) = &status.drift {
        out.push_str(&format!("Drift: {drift}\n"));
    }
    if let Some(note) = &status.health_events {
        out.push_str(&format!("Health: {}\n", printable(note)));
    }
    if let Some(apply) = &status.apply_in_progress {
        out.push_str(&format!("Apply in progress: {apply}\n"));
    }
    for bench in &status.benches {
        out.push_str(&bench_lines(bench));
    }
    if let Some(error) = &status.rollback_error {
        out.push_str(&format!("Rollback failed (the GPUs may be between layouts): {error}\n"));
    }
    if status.gpus.is_empty() {
        out.push_str("No GPUs found.\n");
        return out;
    }
    let with_instances = status.gpus.iter().any(|g| g.mig_enabled || !g.instances.is_empty());
    let columns = gpu_columns();
    let shown = columns.iter().filter(|c| with_instances || !c.with_instances_only);
    let rows = gpu_rows(status, glyphs);
    let rendered = table::render(shown.map(|c| &c.column), &rows);
    out.push_str(&with_fault_lines(&rendered, &rows, glyphs));
    let mps_lines: Vec<String> = mps_servers(status)
        .flat_map(|server| {
            super::mps::status_notes(server, &super::mps_words::device_words(server))
        })
        .collect();
    if !mps_lines.is_empty() {
        out.push_str("MPS (gpushare-ctl mps):\n");
        for line in mps_lines {
            out.push_str(&format!("  {line}\n"));
        }
    }
    let clients: Vec<_> = status.gpus.iter().flat_map(|g| &g.clients).collect();
    if !clients.is_empty() {
        out.push_str("\nClients (command lines: gpushare-ctl clients):\n");
        let rows = super::clients::client_rows_without_command(clients.iter().copied());
        out.extend(rows.lines().map(|l| format!("  {l}\n")));
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use gpushare_proto::types::{
        ComputeInstanceStatus, GpuStatus, InstanceStatus, MpsServer, Sharing,
    };

    const GIB: u64 = 1 << 30;

    /// MPS with a running server and the given default limits of clients.
    fn mps_sharing(threads: u32, pinned: Option<u64>) -> Sharing {
        Sharing {
            strategy: "mps".into(),
            interval: None,
            mps: Some(MpsServer {
                uuid: "MIG-22222222-2222-2222-2222-222222222222".into(),
                gpu: 0,
                placement_start: Some(0),
                gpu_instance_id: Some(2),
                state: "running".into(),
                pid: Some(4100),
                active_thread_percentage: threads,
                pinned_memory_limit_bytes: pinned,
                restarts: 0,
                pipe_directory: "/run/gpushare/mps/MIG-22222222-2222-2222-2222-222222222222/pipe"
                    .into(),
                clients: vec![],
                limits_source: None,
                configured: None,
                daemon_defaults: None,
                server_processes: Vec::new(),
                multi_user: false,
                limit_restores: 0,
            }),
            replicas: None,
        }
    }

    /// Two A100s: GPU 0 in MIG with two instances (one under MPS), GPU 1 whole with
    /// time-slicing, two processes and MIG pending on.
    pub(crate) fn sample_status() -> Status {
        Status {
            health_events: None,
            active_profile: Some("half-balanced".into()),
            active_source: Some("built-in".into()),
            backend: "simulated".into(),
            apply_in_progress: None,
            starting_up: false,
            rollback_error: None,
            apply_error: None,
            hands_off: None,
            drift: None,
            start_up_error: None,
            benches: vec![],
            gpus: vec![
                GpuStatus {
                    health: Vec::new(),
                    index: 0,
                    uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
                    model: "A100-SXM4-40GB".into(),
                    memory_total_bytes: 40 * GIB,
                    mig_enabled: true,
                    mig_pending: None,
                    compute_mode: "default".into(),
                    sharing: Sharing::exclusive(),
                    instances: vec![
                        InstanceStatus {
                            profile: "3g.20gb".into(),
                            placement_start: 4,
                            placement_size: 4,
                            gpu_instance_id: 1,
                            compute_instance_id: Some(0),
                            uuid: Some("MIG-11111111-1111-1111-1111-111111111111".into()),
                            memory_bytes: 19968 * (1 << 20),
                            sharing: Sharing::exclusive(),
                            compute_instances: vec![],
                        },
                        InstanceStatus {
                            profile: "1g.5gb".into(),
                            placement_start: 0,
                            placement_size: 1,
                            gpu_instance_id: 9,
                            compute_instance_id: None,
                            uuid: None,
                            memory_bytes: 4864 * (1 << 20),
                            sharing: mps_sharing(25, Some(2 * GIB)),
                            compute_instances: vec![],
                        },
                    ],
                    processes: vec![],
                    clients: Vec::new(),
                },
                GpuStatus {
                    health: Vec::new(),
                    index: 1,
                    uuid: "GPU-11111111-0000-0000-0000-000000000000".into(),
                    model: "A100-SXM4-40GB".into(),
                    memory_total_bytes: 40 * GIB,
                    mig_enabled: false,
                    mig_pending: Some(true),
                    compute_mode: "exclusive_process".into(),
                    sharing: Sharing {
                        strategy: "time-slicing".into(),
                        interval: Some("short".into()),
                        mps: None,
                        replicas: None,
                    },
                    instances: vec![],
                    processes: vec![4242, 4243],
                    clients: Vec::new(),
                },
            ],
        }
    }

    #[test]
    fn tops_gpu_line_is_made_of_the_gpu_tables_columns() {
        let status = sample_status();
        assert_eq!(
            gpu_line(&status.gpus[1], "READINGS", Glyphs::ASCII),
            "GPU 1  A100-SXM4-40GB  MIG off -> on after reset  time-slicing (short)  READINGS  GPU-11111111-0000-0000-0000-000000000000"
        );
    }

    #[test]
    fn status_with_mig_instances() {
        let text = render_status(&sample_status(), Glyphs::ASCII);
        let expected = "\
Active profile: half-balanced  (backend: nvml (simulated driver))
GPU  MODEL           MIG                    COMPUTE MODE       SHARING                 MEMORY  PROCS  PLACEMENT  GI/CI  UUID
0    A100-SXM4-40GB  on                     default            exclusive             40.0 GiB      0
     |- 3g.20gb                                                exclusive             19.5 GiB         4:4        1/0    MIG-11111111-1111-1111-1111-111111111111
     `- 1g.5gb                                                 mps 25% 2 GiB          4.8 GiB         0:1        9/-    -
1    A100-SXM4-40GB  off -> on after reset  exclusive_process  time-slicing (short)  40.0 GiB      2
";
        assert_eq!(text, expected, "\n{text}");
    }

    #[test]
    fn a_subdivided_instance_lists_its_compute_instances() {
        let mut status = sample_status();
        let ci = |id: u32, sharing: Sharing| ComputeInstanceStatus {
            compute_instance_id: id,
            compute_slices: 1,
            uuid: format!("MIG-3333333{id}-3333-3333-3333-333333333333"),
            sharing,
        };
        status.gpus[0].instances[0].compute_instances = vec![
            ci(0, mps_sharing(50, None)),
            ci(1, mps_sharing(50, None)),
            ci(2, Sharing::exclusive()),
        ];
        let text = render_status(&status, Glyphs::ASCII);
        let rows: Vec<&str> = text.lines().filter(|l| l.contains("1c.3g.20gb")).collect();
        assert_eq!(rows.len(), 3, "{text}");
        assert!(rows[0].contains("|  |- 1c.3g.20gb") && rows[0].contains("mps 50%"), "{text}");
        assert!(rows[0].contains("1/0") && rows[0].contains("MIG-33333330-"), "{text}");
        assert!(rows[2].contains("|  `- 1c.3g.20gb") && rows[2].contains("exclusive"), "{text}");
        assert!(rows[2].contains("1/2"), "{text}");
        // One smaller compute instance is listed too: the instance is subdivided.
        status.gpus[0].instances[0].compute_instances.truncate(1);
        let text = render_status(&status, Glyphs::ASCII);
        let rows: Vec<&str> = text.lines().filter(|l| l.contains("1c.3g.20gb")).collect();
        assert_eq!(rows.len(), 1, "{text}");
        assert!(rows[0].contains("`- 1c.3g.20gb") && rows[0].contains("MIG-33333330-"), "{text}");
        // One full-size compute instance adds no rows.
        status.gpus[0].instances[0].compute_instances[0].compute_slices = 3;
        assert!(!render_status(&status, Glyphs::ASCII).contains("c.3g"));
    }

    #[test]
    fn status_unicode_glyphs() {
        let text = render_status(&sample_status(), Glyphs::UNICODE);
        assert!(text.contains("├─ 3g.20gb"), "{text}");
        assert!(text.contains("└─ 1g.5gb"), "{text}");
        assert!(text.contains("off → on after reset"), "{text}");
    }

    #[test]
    fn clients_follow_the_gpus_without_command_lines() {
        let mut status = sample_status();
        assert!(!render_status(&status, Glyphs::ASCII).contains("Clients"));
        let uuid = status.gpus[1].uuid.clone();
        status.gpus[1].clients.push(gpushare_proto::clients::GpuClient {
            pid: 4242,
            uid: Some(1000),
            user: Some("alice".into()),
            command: None,
            unit: Some("train.service".into()),
            container: None,
            gpu: 1,
            gpu_uuid: uuid.clone(),
            instance: None,
            gpu_instance_id: None,
            via: "mps".into(),
            mps_server: Some(uuid),
            memory_bytes: Some(2485125120),
            share: Some(gpushare_proto::clients::ClientShare {
                active_thread_percentage: 50,
                pinned_memory_bytes: None,
                from: "server".into(),
            }),
            unhealthy: None,
        });
        let text = render_status(&status, Glyphs::ASCII);
        let section = text.split_once("\nClients (command lines: gpushare-ctl clients):\n");
        let (_, rows) = section.unwrap_or_else(|| panic!("{text}"));
        let rows: Vec<&str> = rows.lines().collect();
        assert_eq!(rows.len(), 2, "{text}");
        assert!(rows[0].starts_with("  PID") && !rows[0].contains("COMMAND"), "{text}");
        for part in ["4242", "alice", "train.service", "GPU 1 MPS", "2.3 GiB", "50 % threads"] {
            assert!(rows[1].contains(part), "{part}: {text}");
        }
    }

    fn fault(gi: Option<u32>, detail: &str) -> HealthFault {
        HealthFault {
            class: "xid".into(),
            xid: Some(94),
            action: "restart-application".into(),
            gpu_instance_id: gi,
            compute_instance_id: gi.map(|_| 0),
            since_unix_seconds: 1_700_000_000,
            detail: detail.into(),
            clients: Some(vec![4242]),
        }
    }

    /// Issue 42: a faulted GPU and a faulted MIG instance each have a line under their row
    /// saying they are unhealthy, what happened and what it asks for; a fault of an
    /// instance the table does not list goes under its GPU, naming it; the note on the
    /// driver's events is a line of its own. The table itself is unchanged.
    #[test]
    fn a_faulted_gpu_and_instance_say_so_under_their_rows() {
        let mut status = sample_status();
        status.gpus[0].health = vec![
            fault(Some(1), "Xid 94 (Contained ECC error): restart the application"),
            fault(Some(7), "Xid 95 (Uncontained ECC error): reset the GPU"),
        ];
        status.gpus[1].health = vec![HealthFault {
            class: "gpu-lost".into(),
            xid: None,
            action: "reboot-node".into(),
            gpu_instance_id: None,
            compute_instance_id: None,
            detail: "GPU lost: reboot the node".into(),
            ..fault(None, "")
        }];
        status.health_events = Some("events not watched on GPU 1: not supported".into());
        let text = render_status(&status, Glyphs::ASCII);
        let expected = "\
Active profile: half-balanced  (backend: nvml (simulated driver))
Health: events not watched on GPU 1: not supported
GPU  MODEL           MIG                    COMPUTE MODE       SHARING                 MEMORY  PROCS  PLACEMENT  GI/CI  UUID
0    A100-SXM4-40GB  on                     default            exclusive             40.0 GiB      0
     ! unhealthy: MIG instance 7/0: Xid 95 (Uncontained ECC error): reset the GPU
     |- 3g.20gb                                                exclusive             19.5 GiB         4:4        1/0    MIG-11111111-1111-1111-1111-111111111111
     |  ! unhealthy: MIG instance 1/0: Xid 94 (Contained ECC error): restart the application
     `- 1g.5gb                                                 mps 25% 2 GiB          4.8 GiB         0:1        9/-    -
1    A100-SXM4-40GB  off -> on after reset  exclusive_process  time-slicing (short)  40.0 GiB      2
     ! unhealthy: GPU lost: reboot the node
";
        assert_eq!(text, expected, "\n{text}");
        // Under the last instance the trunk ends; the detail is shown without control
        // characters.
        status.gpus[0].health = vec![fault(Some(9), "Xid 94\x1b[2J: restart the application")];
        let text = render_status(&status, Glyphs::UNICODE);
        assert!(
            text.contains("\n     └─ 1g.5gb")
                && text.contains(
                    "\n        ! unhealthy: MIG instance 9/0: Xid 94?[2J: restart the application\n"
                ),
            "{text}"
        );
        // The document of an agent before health was shown reads as healthy.
        let mut raw: serde_json::Value = serde_json::to_value(sample_status()).unwrap();
        raw["gpus"][0].as_object_mut().unwrap().remove("health");
        raw.as_object_mut().unwrap().remove("health_events");
        let parsed: Status = parse_document(&raw.to_string(), "Status").unwrap();
        assert!(parsed.gpus[0].health.is_empty() && parsed.health_events.is_none());
    }

    #[test]
    fn status_without_mig_has_no_instance_columns() {
        let mut status = sample_status();
        status.gpus.remove(0);
        status.active_profile = None;
        status.backend = "nvml".into();
        let text = render_status(&status, Glyphs::ASCII);
        let expected = "\
Active profile: (none)  (backend: nvml)
GPU  MODEL           MIG                    COMPUTE MODE       SHARING                 MEMORY  PROCS
1    A100-SXM4-40GB  off -> on after reset  exclusive_process  time-slicing (short)  40.0 GiB      2
";
        assert_eq!(text, expected, "\n{text}");
    }

    #[test]
    fn status_of_empty_mig_gpu_and_no_gpus() {
        let mut status = sample_status();
        status.gpus[0].instances.clear();
        let text = render_status(&status, Glyphs::ASCII);
        assert!(text.contains("\n     `- (no instances)\n"), "{text}");
        status.gpus.clear();
        assert_eq!(
            render_status(&status, Glyphs::ASCII),
            "Active profile: half-balanced  (backend: nvml (simulated driver))\nNo GPUs found.\n"
        );
    }

    #[test]
    fn a_hands_off_agent_a_failed_start_up_and_a_profile_from_a_file_are_shown() {
        let mut status = sample_status();
        status.gpus.clear();
        status.active_source = Some("/tmp/half-balanced.toml".into());
        status.hands_off = Some("/etc/gpushare/agent.toml:2:21: bad value".into());
        status.start_up_error = Some("unknown profile \"custom\"".into());
        assert_eq!(
            render_status(&status, Glyphs::ASCII),
            "Active profile: half-balanced, from /tmp/half-balanced.toml  (backend: nvml (simulated driver))\n\
             Hands-off (no GPU changes): /etc/gpushare/agent.toml:2:21: bad value\n\
             Start-up re-apply failed: unknown profile \"custom\"\n\
             No GPUs found.\n"
        );
    }

    #[test]
    fn apply_in_progress_follows_the_active_profile() {
        let mut status = sample_status();
        status.apply_in_progress = Some("/io/gpushare/Agent1/jobs/3, profile half-balanced".into());
        let text = render_status(&status, Glyphs::ASCII);
        assert!(
            text.starts_with(
                "Active profile: half-balanced  (backend: nvml (simulated driver))\nApply in progress: /io/gpushare/Agent1/jobs/3, profile half-balanced\nGPU  MODEL"
            ),
            "{text}"
        );
        status.gpus.clear();
        assert_eq!(
            render_status(&status, Glyphs::ASCII),
            "Active profile: half-balanced  (backend: nvml (simulated driver))\nApply in progress: /io/gpushare/Agent1/jobs/3, profile half-balanced\nNo GPUs found.\n"
        );
    }

    #[test]
    fn a_running_bench_says_where_whose_and_what_comes_back() {
        let mut status = sample_status();
        status.benches.push(BenchStatus {
            job: "/io/gpushare/Agent1/jobs/4".into(),
            gpu: 1,
            uuid: "GPU-11111111-0000-0000-0000-000000000000".into(),
            uid: 1000,
            user: Some("ada".into()),
            started_unix_seconds: 1_700_000_000,
            running_seconds: 125,
            profile_before: Some("half-balanced".into()),
            restores: "MIG off, compute mode default, no MPS".into(),
        });
        let text = render_status(&status, Glyphs::ASCII);
        assert!(
            text.starts_with(
                "Active profile: half-balanced  (backend: nvml (simulated driver))\n\
                 Bench running on GPU 1 for 2 min 5 s, started by ada (uid 1000): /io/gpushare/Agent1/jobs/4\n  \
                 At its end GPU 1 goes back to: MIG off, compute mode default, no MPS (profile active when it began: half-balanced)\n  \
                 To stop it now (its user or root): gpushare-ctl cancel 4\n\
                 GPU  MODEL"
            ),
            "{text}"
        );
        status.benches[0].user = None;
        status.benches[0].profile_before = None;
        status.benches[0].running_seconds = 3725;
        let text = render_status(&status, Glyphs::ASCII);
        assert!(text.contains("for 1 h 2 min, started by uid 1000: "), "{text}");
        assert!(text.contains("(profile active when it began: (none))"), "{text}");
        // A document of an agent before benches were shown reads as none running.
        let mut raw: serde_json::Value = serde_json::to_value(sample_status()).unwrap();
        raw.as_object_mut().unwrap().remove("benches");
        let parsed: Status = parse_document(&raw.to_string(), "Status").unwrap();
        assert!(parsed.benches.is_empty());
    }

    #[test]
    fn status_document_round_trips_through_json() {
        let raw = serde_json::to_string(&sample_status()).unwrap();
        let parsed: Status = parse_document(&raw, "Status").unwrap();
        assert_eq!(parsed, sample_status());
    }

    #[test]
    fn sharing_cells() {
        assert_eq!(sharing_cell(&Sharing::exclusive()), "exclusive");
        assert_eq!(sharing_cell(&mps_sharing(25, Some(2 * GIB))), "mps 25% 2 GiB");
        assert_eq!(sharing_cell(&mps_sharing(50, Some(512 << 20))), "mps 50% 512 MiB");
        assert_eq!(sharing_cell(&mps_sharing(100, None)), "mps 100%");
        let mut marked = mps_sharing(50, Some(2 * GIB));
        let server = marked.mps.as_mut().unwrap();
        server.limits_source = Some("mps-limit".into());
        server.multi_user = true;
        assert_eq!(sharing_cell(&marked), "mps 50% 2 GiB (mps limit) multi-user");
        marked.mps.as_mut().unwrap().limits_source = Some("unknown".into());
        assert_eq!(sharing_cell(&marked), "mps 50% 2 GiB (drift) multi-user");
        let bare = |strategy: &str| Sharing {
            strategy: strategy.into(),
            interval: None,
            mps: None,
            replicas: None,
        };
        assert_eq!(sharing_cell(&bare("mps")), "mps");
        assert_eq!(sharing_cell(&bare("time-slicing")), "time-slicing");
        let timed = Sharing { interval: Some("default".into()), ..bare("time-slicing") };
        assert_eq!(sharing_cell(&timed), "time-slicing (default)");
    }

    #[test]
    fn sharing_details_are_optional_in_the_document() {
        let raw = r#"{"strategy":"mps"}"#;
        let sharing: Sharing = serde_json::from_str(raw).unwrap();
        assert_eq!(
            sharing,
            Sharing { strategy: "mps".into(), interval: None, mps: None, replicas: None }
        );
        assert_eq!(
            serde_json::to_string(&Sharing::exclusive()).unwrap(),
            r#"{"strategy":"exclusive"}"#
        );
    }

    #[test]
    fn memory_and_mig_cells() {
        assert_eq!(gib(40 * GIB), "40.0 GiB");
        assert_eq!(gib(81920 * (1 << 20)), "80.0 GiB");
        assert_eq!(gib(0), "0.0 GiB");
        assert_eq!(mig_cell(true, Some(true), Glyphs::ASCII), "on");
        assert_eq!(mig_cell(true, Some(false), Glyphs::ASCII), "on -> off after reset");
    }
}
