//! Who uses the GPUs (issue 29): the clients of one observation, attributed. The driver's
//! compute processes of each GPU and MIG instance, and the clients each running MPS
//! server's control daemon lists (the driver shows an MPS client only through its server),
//! each read once in `/proc`: its user, command line, unit or container (its cgroup), and
//! for an MPS client the share it runs under. A process gone by the time `/proc` is read
//! is left out; so are gpushare's own MPS servers. Nothing here asks the driver: the
//! observation already has it.
//!
//! What a table shows of each process depends on who it is for ([`Viewer`], issue 36):
//! the kernel's rules for `/proc` (`hidepid`, the private `environ`) as they apply to that
//! viewer, and the command-line rule.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use gpushare_proto::clients::{
    CLIENTS_MAX, ClientShare, ClientTable, GpuClient, IdleDevice, UnseenProcess,
};

use crate::health::Health;
use crate::node::{GpuState, MpsServerState, NodeState};
use crate::sys::mounts::{Mounts, ProcMount};
use crate::sys::procfs;

/// The most bytes of a command line shown.
const COMMAND_MAX_BYTES: usize = 256;
/// How the programs of MPS's own processes begin (`nvidia-cuda-mps-control`,
/// `nvidia-cuda-mps-server`): told by the program (`/proc/PID/exe`), never by the name,
/// which any process may give itself (see [`is_mps`] and `table`).
const MPS_PROGRAM: &str = "nvidia-cuda-mps";
/// The variable an MPS client lowers its own thread percentage with.
const THREADS_VARIABLE: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";

/// A process the observation shows using a GPU, before `/proc` is read.
struct Found<'a> {
    pid: u32,
    gpu: &'a GpuState,
    /// Its GPU instance, under MIG.
    gpu_instance: Option<u32>,
    /// Its MIG device.
    instance: Option<String>,
    /// The running MPS server it is a client of.
    server: Option<&'a MpsServerState>,
    /// Whether it reaches the GPU through MPS (a server of gpushare's or another).
    mps_client: bool,
    memory: Option<u64>,
}

/// Whom a client table is for, and so what it shows of each process (DESIGN.md, "Clients",
/// "Who sees what").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Viewer {
    /// Root: everything.
    Root,
    /// A user other than root, with their groups as the bus gave them (`None`: not known,
    /// so no `hidepid` `gid=` exemption).
    User {
        /// Their user id.
        uid: u32,
        /// Their groups.
        groups: Option<Vec<u32>>,
    },
    /// Anyone at all (`Status`, whose answer every caller shares): no command line and
    /// nothing of an environment; under `hidepid` nothing of a process but what the
    /// driver shows everyone (PID, GPU, memory).
    Anyone,
    /// The agent itself, for its journal: every process attributed, no command line nor
    /// environment read.
    Agent,
}

impl From<Option<u32>> for Viewer {
    /// The caller with this user id (groups not known); `None`: anyone.
    fn from(uid: Option<u32>) -> Viewer {
        match uid {
            Some(0) => Viewer::Root,
            Some(uid) => Viewer::User { uid, groups: None },
            None => Viewer::Anyone,
        }
    }
}

impl From<&super::Caller> for Viewer {
    /// A bus caller, with their groups.
    fn from(caller: &super::Caller) -> Viewer {
        match caller.uid {
            0 => Viewer::Root,
            uid => Viewer::User { uid, groups: caller.groups.clone() },
        }
    }
}

/// What a viewer may see of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sight {
    /// Its user, unit and container.
    attributed: bool,
    /// Its command line.
    command: bool,
    /// Its environment (`environ`: what ptrace's read check allows).
    environment: bool,
}

impl Viewer {
    /// What this viewer sees of `process` (whose status is `owner`) under `proc`.
    fn sight(&self, proc: &ProcMount, process: &procfs::Process, owner: &procfs::Owner) -> Sight {
        match self {
            Viewer::Root => Sight { attributed: true, command: true, environment: true },
            Viewer::Agent => Sight { attributed: true, command: false, environment: false },
            Viewer::Anyone => Sight {
                attributed: !proc.hides_others_from(None),
                command: false,
                environment: false,
            },
            Viewer::User { uid, groups } => {
                let own = process.readable_by(owner, *uid);
                let attributed = own || !proc.hides_others_from(groups.as_deref());
                Sight { attributed, command: attributed && owner.uid == *uid, environment: own }
            }
        }
    }
}

/// `table` as anyone sees it under `proc` (the metrics endpoint answers whoever connects):
/// a table made for [`Viewer::Agent`] with, under `hidepid`, every client's user, unit and
/// container taken out.
pub fn for_anyone(table: &ClientTable, proc: &ProcMount) -> ClientTable {
    let mut table = table.clone();
    if proc.hides_others_from(None) {
        for c in &mut table.clients {
            (c.uid, c.user, c.command, c.unit, c.container) = (None, None, None, None, None);
        }
    }
    table
}

/// The client table of `node`, reading processes under `proc_root` (a `/proc`), for
/// `viewer` (see [`Viewer`]) on a host whose mounts are `mounts` (its `/proc`'s `hidepid`,
/// and who named which cgroups); `user_name` names a user id (each asked once).
pub fn table(
    node: &NodeState,
    proc_root: &Path,
    viewer: &Viewer,
    mounts: &Mounts,
    user_name: &dyn Fn(u32) -> Option<String>,
) -> ClientTable {
    let running = || node.mps.iter().filter(|s| s.pid.is_some());
    // gpushare's MPS servers among the driver's processes (the real driver lists each as a
    // compute process of its own): MPS's program, started by one of gpushare's control
    // daemons (its parent), are no clients. Another process running MPS's program is
    // someone's own MPS: the devices where one runs are marked, and it stays in the table
    // as a process like any other, since what runs in it is not proven by its program
    // file (`LD_PRELOAD` loads anything into it) and nothing may hide there.
    let daemons: HashSet<u32> = running().filter_map(|s| s.pid).collect();
    let agent = crate::sys::unix::effective_uid();
    let mut mps_servers: HashSet<u32> = HashSet::new();
    let mut foreign: HashSet<(u32, Option<u32>)> = HashSet::new();
    for g in &node.gpus {
        for p in g.processes.iter().filter(|p| !p.mps_client) {
            let Some(process) = procfs::Process::open(proc_root, p.pid) else { continue };
            if process.program().is_some_and(|p| is_mps(&p, agent)) {
                let parent = process.owner().and_then(|o| o.parent);
                if parent.is_some_and(|pp| daemons.contains(&pp)) {
                    mps_servers.insert(p.pid);
                } else {
                    foreign.insert((g.index, p.gpu_instance_id.filter(|_| g.mig_enabled)));
                }
            }
        }
    }
    let mut found: Vec<Found<'_>> = Vec::new();
    for g in &node.gpus {
        for p in g.processes.iter().filter(|p| !mps_servers.contains(&p.pid)) {
            let gpu_instance = p.gpu_instance_id.filter(|_| g.mig_enabled);
            // The control daemon's list where it was read. Else the driver's word that the
            // process is an MPS client: of gpushare's server of its GPU or GPU instance,
            // when that is the one server there (not a subdivided instance's), its daemon
            // was not asked (asked, it would have named it), and no other MPS runs there.
            let server =
                running().find(|s| s.gpu == g.index && s.clients.contains(&p.pid)).or_else(|| {
                    if !p.mps_client || foreign.contains(&(g.index, gpu_instance)) {
                        return None;
                    }
                    let mut serving = running()
                        .filter(|s| s.gpu == g.index && served_instance(g, s).0 == gpu_instance);
                    let only = serving.next()?;
                    (serving.next().is_none() && !only.clients_read).then_some(only)
                });
            let instance = gpu_instance
                .and_then(|id| sole_compute_instance(g, id))
                .or_else(|| server.and_then(|s| served_instance(g, s).1));
            found.push(Found {
                pid: p.pid,
                gpu: g,
                gpu_instance,
                instance,
                server,
                mps_client: p.mps_client || server.is_some(),
                memory: p.used_memory_bytes,
            });
        }
    }
    let listed: HashSet<(u32, u32)> = found.iter().map(|f| (f.pid, f.gpu.index)).collect();
    for s in running() {
        let Some(g) = node.gpu(s.gpu) else { continue };
        for &pid in &s.clients {
            if listed.contains(&(pid, s.gpu)) {
                continue;
            }
            let (gpu_instance, instance) = served_instance(g, s);
            found.push(Found {
                pid,
                gpu: g,
                gpu_instance,
                instance,
                server: Some(s),
                mps_client: true,
                memory: None,
            });
        }
    }
    found.sort_by(|a, b| {
        let key =
            |f: &Found<'_>| (f.gpu.index, f.gpu_instance, f.server.map(|s| s.uuid.clone()), f.pid);
        key(a).cmp(&key(b))
    });

    let mut names: HashMap<u32, Option<String>> = HashMap::new();
    let mut clients: Vec<GpuClient> = Vec::new();
    let mut left_out = 0u32;
    let mut unseen: Vec<UnseenProcess> = Vec::new();
    // What is in use, counting the clients beyond the cap too.
    let mut used_instances: HashSet<(u32, u32)> = HashSet::new();
    let mut used_servers: HashSet<&str> = HashSet::new();
    for f in &found {
        if clients.len() + unseen.len() >= CLIENTS_MAX {
            left_out = left_out.saturating_add(1);
            mark_used(f, &mut used_instances, &mut used_servers);
            continue;
        }
        let Some(process) = procfs::Process::open(proc_root, f.pid) else {
            // The driver lists it, this /proc does not: said, so that the GPU's memory
            // adds up (an MPS client only its control daemon named is just gone).
            if f.memory.is_some() {
                mark_used(f, &mut used_instances, &mut used_servers);
                unseen.push(UnseenProcess {
                    pid: f.pid,
                    gpu: f.gpu.index,
                    gpu_instance_id: f.gpu_instance,
                    memory_bytes: f.memory,
                });
            }
            continue;
        };
        // Gone but for its exit status: no GPU context.
        let Some(owner) = process.owner().filter(|o| !o.exited) else { continue };
        mark_used(f, &mut used_instances, &mut used_servers);
        let sight = viewer.sight(&mounts.proc, &process, &owner);
        // What the viewer may not read in /proc is neither read for them nor shown.
        let (uid, user, (unit, container)) = match sight.attributed {
            true => (
                Some(owner.uid),
                names.entry(owner.uid).or_insert_with(|| user_name(owner.uid)).clone(),
                process.placement(proc_root, &mounts.cgroups),
            ),
            false => (None, None, (None, None)),
        };
        let command = sight.command.then(|| {
            process.command_line(COMMAND_MAX_BYTES).unwrap_or_else(|| format!("[{}]", owner.name))
        });
        let via = match (f.mps_client, f.gpu_instance) {
            (true, _) => "mps",
            (false, Some(_)) => "mig",
            (false, None) => "gpu",
        };
        // A client's own lower share is read from its environment only for a viewer who
        // may read that: others see the server's limits, which are the agent's own.
        let share = f.server.map(|s| {
            share_of(s, sight.environment.then(|| process.environment_variable(THREADS_VARIABLE)))
        });
        clients.push(GpuClient {
            pid: f.pid,
            uid,
            user,
            command,
            unit,
            container,
            gpu: f.gpu.index,
            gpu_uuid: f.gpu.uuid.clone(),
            instance: f.instance.clone(),
            gpu_instance_id: f.gpu_instance,
            via: via.to_string(),
            mps_server: f.server.map(|s| s.uuid.clone()),
            memory_bytes: f.memory,
            share,
            unhealthy: None,
        });
    }

    let mut idle = Vec::new();
    for g in node.gpus.iter().filter(|g| g.mig_enabled) {
        for gi in g.instances.iter().filter(|gi| !used_instances.contains(&(g.index, gi.id))) {
            for ci in &gi.compute_instances {
                // An instance an MPS server serves shows as that server.
                if running().any(|s| s.uuid == ci.uuid) {
                    continue;
                }
                idle.push(IdleDevice {
                    gpu: g.index,
                    uuid: ci.uuid.clone(),
                    what: "mig".into(),
                    describe: format!(
                        "{} (GI {}, CI {}): no process",
                        mig_device(g, gi.id),
                        gi.id,
                        ci.id
                    ),
                });
            }
        }
    }
    for s in running().filter(|s| !used_servers.contains(s.uuid.as_str())) {
        let Some(g) = node.gpu(s.gpu) else { continue };
        let device = match served_instance(g, s).0 {
            // A subdivided GPU instance has a server per compute instance: which one.
            Some(gi) if g.instances.iter().any(|i| i.id == gi && i.compute_instances.len() > 1) => {
                format!("{} (GI {gi}, CI {})", mig_device(g, gi), s.compute_instance)
            }
            Some(gi) => format!("{} (GI {gi})", mig_device(g, gi)),
            None => g.label(),
        };
        let pinned = s
            .limits
            .pinned_memory_limit_bytes
            .map(|b| format!(", pinned memory {}", gpushare_proto::exact_size(b)))
            .unwrap_or_default();
        idle.push(IdleDevice {
            gpu: s.gpu,
            uuid: s.uuid.clone(),
            what: "mps-server".into(),
            describe: format!(
                "MPS server of {device} ({} % threads{pinned}): no client",
                s.limits.active_thread_percentage
            ),
        });
    }
    ClientTable { clients, idle, left_out, unseen }
}

/// Records that `f`'s GPU instance and MPS server are in use (not idle).
fn mark_used<'a>(
    f: &Found<'a>,
    instances: &mut HashSet<(u32, u32)>,
    servers: &mut HashSet<&'a str>,
) {
    if let Some(gi) = f.gpu_instance {
        instances.insert((f.gpu.index, gi));
    }
    if let Some(s) = f.server {
        servers.insert(s.uuid.as_str());
    }
}

/// The share an MPS client of `server` runs under: the server's limits, or the thread
/// percentage of its own environment (`threads`, when read: `Some(None)` is an
/// environment without it) when it set a lower one.
fn share_of(server: &MpsServerState, threads: Option<Option<String>>) -> ClientShare {
    let limits = server.limits;
    let own = threads
        .flatten()
        .and_then(|t| t.trim().parse::<u32>().ok())
        .filter(|&t| (1..limits.active_thread_percentage).contains(&t));
    ClientShare {
        active_thread_percentage: own.unwrap_or(limits.active_thread_percentage),
        pinned_memory_bytes: limits.pinned_memory_limit_bytes,
        from: if own.is_some() { "client" } else { "server" }.into(),
    }
}

/// The `MIG-…` of GPU instance `gi` of `gpu` when it has one compute instance (the driver
/// names a process's GPU instance, not its compute instance).
fn sole_compute_instance(gpu: &GpuState, gi: u32) -> Option<String> {
    match gpu.instances.iter().find(|i| i.id == gi)?.compute_instances.as_slice() {
        [ci] => Some(ci.uuid.clone()),
        _ => None,
    }
}

/// The GPU instance and `MIG-…` an MPS server serves; `(None, None)` for a whole GPU.
fn served_instance(gpu: &GpuState, server: &MpsServerState) -> (Option<u32>, Option<String>) {
    gpu.instances
        .iter()
        .find(|gi| gi.compute_instances.iter().any(|ci| ci.uuid == server.uuid))
        .map_or((None, None), |gi| (Some(gi.id), Some(server.uuid.clone())))
}

/// `GPU 0 (A100-SXM4-40GB) MIG 3g.20gb`: GPU instance `gi` of `gpu`.
fn mig_device(gpu: &GpuState, gi: u32) -> String {
    let profile = gpu
        .instances
        .iter()
        .find(|i| i.id == gi)
        .and_then(|i| gpu.model?.profile_by_id(i.profile_id))
        .map_or_else(|| "instance".to_string(), |p| p.name.to_string());
    format!("{} MIG {profile}", gpu.label())
}

/// Whether `program` is MPS's own (`nvidia-cuda-mps-server`): its name says so and only
/// root, or the agent's own user, could have put it there and can change it. Anyone can
/// name a copy of python `nvidia-cuda-mps-x`: that one is a client like any other.
fn is_mps(program: &procfs::Program, agent: u32) -> bool {
    program.name.starts_with(MPS_PROGRAM)
        && (program.uid == 0 || program.uid == agent)
        && !program.writable_by_others
}

/// Whether the driver's process lists name the MPS clients of `server`: it serves a whole
/// GPU whose driver answered the MPS process list (driver 580 on the H200 did, with every
/// client in it).
fn driver_names_clients(node: &NodeState, server: &MpsServerState) -> bool {
    server.placement_start.is_none() && node.gpu(server.gpu).is_some_and(|g| g.mps_clients_named)
}

/// Why [`table_within`] gave no table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Unanswered {
    /// An earlier read, past its deadline, has not ended: none is started behind it.
    Stalled,
    /// The read failed, or took longer than its deadline (said in words).
    Failed(String),
}

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unanswered::Stalled => f.write_str("an earlier read in /proc has not ended"),
            Unanswered::Failed(why) => f.write_str(why),
        }
    }
}

/// The client table of `node` as `viewer` may see it ([`table`]), read in `/proc` off
/// the async threads within `deadline`. A read of another process's memory waits on that
/// process's memory lock, and whatever else in /proc might wait: one stalled past its
/// deadline goes on in the background, and until every stalled one has ended no caller
/// (`status`, the health journal, a reset's check) starts another, so they never pile up.
pub(super) async fn table_within(
    node: NodeState,
    viewer: Viewer,
    deadline: std::time::Duration,
) -> Result<ClientTable, Unanswered> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering::SeqCst};
    static STALLED: AtomicUsize = AtomicUsize::new(0);
    const RUNNING: u8 = 0;
    const DONE: u8 = 1;
    const LATE: u8 = 2;
    if STALLED.load(SeqCst) > 0 {
        return Err(Unanswered::Stalled);
    }
    // RUNNING, then DONE if the read ends first, LATE if the deadline passes first; a LATE
    // read counts in STALLED until it ends.
    let state = Arc::new(AtomicU8::new(RUNNING));
    let read_state = Arc::clone(&state);
    let read = tokio::task::spawn_blocking(move || {
        let mounts = Mounts::read();
        let user_name = &crate::sys::unix::cached_user_name;
        let table = table(&node, Path::new("/proc"), &viewer, &mounts, user_name);
        if read_state.swap(DONE, SeqCst) == LATE {
            STALLED.fetch_sub(1, SeqCst);
        }
        table
    });
    match tokio::time::timeout(deadline, read).await {
        Ok(Ok(table)) => Ok(table),
        Ok(Err(e)) => Err(Unanswered::Failed(crate::sys::task_failed(&e))),
        Err(_) => {
            // Counted only if it has not ended in between (else nothing is stalled); the
            // increment comes first so that its end's decrement never underflows.
            STALLED.fetch_add(1, SeqCst);
            if state.compare_exchange(RUNNING, LATE, SeqCst, SeqCst).is_err() {
                STALLED.fetch_sub(1, SeqCst);
            }
            let after = deadline.as_millis();
            Err(Unanswered::Failed(format!("reading them in /proc took over {after} ms")))
        }
    }
}

/// A running MPS server whose clients are not known: neither its control daemon listed
/// them (it did not answer) nor does the driver name them (see [`unread_clients`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Unread {
    pub gpu: u32,
    /// The GPU instance it serves; `None`: the whole GPU.
    pub gpu_instance: Option<u32>,
    /// In words, naming the server.
    pub why: String,
}

/// The running MPS servers of `node` whose clients are not known: a table made from
/// `node` could miss their clients, which must never pass for "no client" (a fault's
/// clean check, a reset).
pub(super) fn unread_clients(node: &NodeState) -> Vec<Unread> {
    node.mps
        .iter()
        .filter(|s| s.pid.is_some() && !s.clients_read && !driver_names_clients(node, s))
        .map(|s| Unread {
            gpu: s.gpu,
            gpu_instance: s
                .placement_start
                .and_then(|start| node.gpu(s.gpu)?.instance_at(start))
                .map(|i| i.id),
            why: format!("the MPS control daemon of {} did not list its clients", s.uuid),
        })
        .collect()
}

/// An MPS server as a client refresh sees it: what tells that its clients went with a
/// fault (the supervisor restarted it, or its control daemon is down).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerHealth {
    /// `GPU-…` or `MIG-…` it serves (a client's `mps_server`).
    pub uuid: String,
    /// Restarts by the supervisor.
    pub restarts: u32,
    /// Whether its control daemon runs.
    pub running: bool,
}

/// Marks each client whose GPU or MIG instance has a fault with that fault's detail (the
/// first that covers it, as [`Health::blocking`] finds it), issue 42.
pub(super) fn mark_unhealthy(table: &mut ClientTable, health: &Health) {
    let faults = health.faults();
    for client in &mut table.clients {
        let fault = faults.iter().find(|f| f.covers(client.gpu, client.gpu_instance_id));
        client.unhealthy = fault.map(crate::health::Fault::describe_cause);
    }
}

/// One refresh of the clients for the metrics ([`super::Engine::clients_and_servers`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ClientsRefresh {
    /// Every client attributed ([`Viewer::Agent`]), for the journal's lines.
    pub table: ClientTable,
    /// The same as anyone may see it ([`for_anyone`]): what the series export, since the
    /// endpoint answers whoever connects.
    pub public: ClientTable,
    /// The MPS servers' health.
    pub servers: Vec<ServerHealth>,
}

impl super::Engine {
    /// Every process using the GPUs, attributed, and the capacity no one uses (see
    /// [`table`]), as `viewer` may see them: a caller's user id (`Some(uid)`), a bus
    /// [`super::Caller`] with their groups, or a [`Viewer`].
    pub async fn clients(
        &self,
        viewer: impl Into<Viewer>,
    ) -> Result<ClientTable, super::EngineError> {
        let viewer = viewer.into();
        let reads = crate::apply::Reads { timeslices: false, mps_clients: true };
        let node = self.core.node.observe_shared(reads, self.epoch()).await?.with_live_limits();
        let mut clients = tokio::task::spawn_blocking(move || {
            let mounts = Mounts::read();
            let user_name = &crate::sys::unix::cached_user_name;
            table(&node, Path::new("/proc"), &viewer, &mounts, user_name)
        })
        .await
        .map_err(|e| super::EngineError::Internal(crate::sys::task_failed(&e)))?;
        mark_unhealthy(&mut clients, self.health());
        Ok(clients)
    }

    /// The client table for the journal ([`Viewer::Agent`]: no command line or environment
    /// read), the same as anyone may see it, and the MPS servers' health, from one shared
    /// observation: what the metrics' background refresh reads every few seconds. The
    /// control daemons are asked for their clients only where the driver does not name
    /// them: a server of a GPU whose driver did not answer its MPS process list, or of a
    /// MIG instance (where the driver's list was not seen on hardware); otherwise the
    /// refresh starts no process.
    pub async fn clients_and_servers(&self) -> Result<ClientsRefresh, super::EngineError> {
        let driver_only = crate::apply::Reads { timeslices: false, mps_clients: false };
        let mut node = self.core.node.observe_shared(driver_only, self.epoch()).await?;
        let sharing = std::sync::Arc::clone(&self.core.node.sharing);
        tokio::task::spawn_blocking(move || {
            let unnamed: Vec<String> = (node.mps.iter())
                .filter(|s| !driver_names_clients(&node, s))
                .map(|s| s.uuid.clone())
                .collect();
            sharing.read_mps_clients_where(&mut node.mps, |s| unnamed.contains(&s.uuid));
            let servers = node
                .mps
                .iter()
                .map(|s| ServerHealth {
                    uuid: s.uuid.clone(),
                    restarts: s.restarts,
                    running: s.pid.is_some(),
                })
                .collect();
            let mounts = Mounts::read();
            let user_name = &crate::sys::unix::cached_user_name;
            let table = table(&node, Path::new("/proc"), &Viewer::Agent, &mounts, user_name);
            let public = for_anyone(&table, &mounts.proc);
            ClientsRefresh { table, public, servers }
        })
        .await
        .map_err(|e| super::EngineError::Internal(crate::sys::task_failed(&e)))
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::node::{ComputeInstance, ComputeMode, ComputeProcess, GpuInstance, MpsLimits};
    use crate::sys::mounts::{CgroupMounts, HidePid};

    /// The test's own user, who owns the fake `/proc`'s directories: their processes are
    /// "alice"'s, readable by her as the kernel decides.
    fn alice() -> u32 {
        crate::sys::unix::effective_uid()
    }

    /// Other users.
    fn bob() -> u32 {
        alice().wrapping_add(1)
    }

    fn carol() -> u32 {
        alice().wrapping_add(2)
    }

    /// Issue 42: a running server whose daemon did not list its clients, on a MIG instance
    /// or on a GPU whose driver does not name MPS clients, makes its clients unknown (with
    /// the instance it serves); the driver's list of a whole GPU, a stopped server, or a
    /// daemon that answered do not.
    #[test]
    fn clients_a_daemon_did_not_list_are_unknown_unless_the_driver_names_them() {
        let unread =
            |uuid, gpu| MpsServerState { clients_read: false, ..server(uuid, gpu, 50, Vec::new()) };
        let mut node = NodeState {
            gpus: vec![gpu(0, Vec::new(), Vec::new()), gpu(1, vec![instance(3, "MIG-a")], vec![])],
            mps: vec![server("GPU-0", 0, 50, vec![40]), server("MIG-a", 1, 50, vec![])],
            ..NodeState::default()
        };
        node.mps[1].placement_start = Some(3);
        assert_eq!(unread_clients(&node), []);
        node.mps[1] = MpsServerState { placement_start: Some(3), ..unread("MIG-a", 1) };
        let [one] = unread_clients(&node).try_into().expect("one unknown");
        assert_eq!((one.gpu, one.gpu_instance), (1, Some(3)));
        assert!(one.why.contains("MIG-a"), "{one:?}");
        node.mps[1].pid = None;
        assert_eq!(unread_clients(&node), [], "a stopped server serves no one");
        node.mps[0] = unread("GPU-0", 0);
        let [one] = unread_clients(&node).try_into().expect("one unknown");
        assert_eq!((one.gpu, one.gpu_instance), (0, None));
        node.gpus[0].mps_clients_named = true;
        assert_eq!(unread_clients(&node), [], "the driver names a whole GPU's clients");
        // The driver's list does not cover a MIG instance's server.
        node.gpus[1].mps_clients_named = true;
        node.mps[1].pid = Some(901);
        assert_eq!(unread_clients(&node).len(), 1);
    }

    fn as_alice() -> Viewer {
        Viewer::User { uid: alice(), groups: None }
    }

    /// The mounts of a host whose `/proc` is `proc` and whose unified cgroup hierarchy is
    /// `<root>/cgroup`, every directory of it named by the test's user (standing for root).
    fn mounts(root: &Path, proc: ProcMount) -> Mounts {
        Mounts { proc, cgroups: CgroupMounts::for_tests(&root.join("cgroup"), alice()) }
    }

    /// A host without `hidepid`.
    fn plain(root: &Path) -> Mounts {
        mounts(root, ProcMount::PLAIN)
    }

    fn gpu(index: u32, instances: Vec<GpuInstance>, processes: Vec<ComputeProcess>) -> GpuState {
        GpuState {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA A100-SXM4-40GB".into(),
            pci_device_id: 0x20B0_10DE,
            model: None,
            memory_total_bytes: 40 << 30,
            mig_enabled: !instances.is_empty(),
            mig_pending: None,
            compute_mode: ComputeMode::Default,
            instances,
            processes,
            mps_clients_named: false,
        }
    }

    fn instance(id: u32, uuid: &str) -> GpuInstance {
        GpuInstance {
            id,
            profile_id: 19,
            placement_start: u8::try_from(id).unwrap(),
            placement_size: 1,
            compute_instances: vec![ComputeInstance { id: 0, uuid: uuid.into(), slices: 1 }],
        }
    }

    fn process(pid: u32, gi: Option<u32>, memory: Option<u64>) -> ComputeProcess {
        ComputeProcess { pid, gpu_instance_id: gi, used_memory_bytes: memory, mps_client: false }
    }

    fn server(uuid: &str, gpu: u32, threads: u32, clients: Vec<u32>) -> MpsServerState {
        MpsServerState {
            uuid: uuid.into(),
            gpu,
            placement_start: uuid.starts_with("MIG-").then_some(0),
            compute_instance: 0,
            limits: MpsLimits {
                active_thread_percentage: threads,
                pinned_memory_limit_bytes: Some(4 << 30),
            },
            pid: Some(900),
            restarts: 0,
            clients_read: true,
            clients,
        }
    }

    /// A fake `/proc/PID`, its program the command line's first word, its parent 1.
    fn fake(root: &Path, pid: u32, name: &str, uid: u32, cmdline: &str, cgroup: &str, env: &str) {
        let dir = root.join(pid.to_string());
        fs::create_dir_all(&dir).unwrap();
        let status =
            format!("Name:\t{name}\nState:\tS\nPPid:\t1\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n");
        fs::write(dir.join("status"), status).unwrap();
        fs::write(dir.join("cmdline"), cmdline.replace(' ', "\0")).unwrap();
        fs::write(dir.join("cgroup"), cgroup).unwrap();
        // Its unified cgroup, named by root (the test's user) in the fake hierarchy.
        for path in cgroup.lines().filter_map(|l| l.strip_prefix("0::")) {
            fs::create_dir_all(root.join("cgroup").join(path.trim_start_matches('/'))).unwrap();
        }
        fs::write(dir.join("environ"), env.replace(' ', "\0")).unwrap();
        let program = root.join("bin").join(cmdline.split(' ').next().unwrap());
        fs::create_dir_all(root.join("bin")).unwrap();
        fs::write(&program, "").unwrap();
        fs::set_permissions(&program, fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(program, dir.join("exe")).unwrap();
    }

    /// Rewrites a fake process's status line `key`.
    fn fake_status(root: &Path, pid: u32, key: &str, value: &str) {
        let path = root.join(pid.to_string()).join("status");
        let status = fs::read_to_string(&path).unwrap();
        let status: String = status
            .lines()
            .map(
                |l| if l.starts_with(key) { format!("{key}\t{value}\n") } else { format!("{l}\n") },
            )
            .collect();
        fs::write(path, status).unwrap();
    }

    #[test]
    fn every_client_is_attributed_and_unused_capacity_shows() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let id = "ab".repeat(32);
        fake(
            root,
            10,
            "python3",
            alice(),
            "python3 serve.py",
            "0::/system.slice/serve.service\n",
            "",
        );
        fake(root, 11, "nvidia-cuda-mps", 0, "nvidia-cuda-mps-server", "0::/\n", "");
        fake_status(root, 11, "PPid:", "900");
        fake(root, 12, "python3", bob(), "python3 a.py", "0::/user.slice/run-r2.scope\n", "");
        fake(
            root,
            20,
            "train",
            carol(),
            "train --secret=x",
            &format!("0::/docker-{id}.scope\n"),
            "",
        );
        let env = format!("A=1 {THREADS_VARIABLE}=10");
        fake(root, 30, "infer", alice(), "infer", "0::/\n", &env);
        // 31 has gone.
        let node = NodeState {
            gpus: vec![
                gpu(
                    0,
                    Vec::new(),
                    vec![
                        process(10, None, Some(1 << 30)),
                        process(11, None, Some(300 << 20)),
                        process(12, None, Some(2 << 30)),
                    ],
                ),
                gpu(
                    1,
                    vec![instance(1, "MIG-a"), instance(2, "MIG-b"), instance(3, "MIG-c")],
                    vec![process(20, Some(1), Some(512 << 20))],
                ),
            ],
            mps: vec![server("GPU-0", 0, 50, vec![12]), server("MIG-c", 1, 100, vec![30, 31])],
            ..NodeState::default()
        };
        let name = |uid: u32| (uid == alice()).then(|| "alice".to_string());
        let table = table(&node, root, &as_alice(), &plain(root), &name);
        let pids: Vec<u32> = table.clients.iter().map(|c| c.pid).collect();
        assert_eq!(pids, [10, 12, 20, 30], "{table:#?}");
        let [whole, mps, mig, own] = table.clients.as_slice() else { unreachable!() };

        assert_eq!((whole.via.as_str(), whole.gpu, whole.instance.as_deref()), ("gpu", 0, None));
        assert_eq!((whole.uid, whole.user.as_deref()), (Some(alice()), Some("alice")));
        assert_eq!(whole.command.as_deref(), Some("python3 serve.py"), "the caller's own");
        assert_eq!(whole.unit.as_deref(), Some("serve.service"));
        assert_eq!((whole.memory_bytes, whole.share.as_ref()), (Some(1 << 30), None));

        assert_eq!((mps.via.as_str(), mps.mps_server.as_deref()), ("mps", Some("GPU-0")));
        assert_eq!(mps.memory_bytes, Some(2 << 30), "the driver's figure");
        assert_eq!(mps.command, None, "another user's");
        assert_eq!(mps.unit.as_deref(), Some("run-r2.scope"));
        let share = mps.share.as_ref().unwrap();
        assert_eq!((share.active_thread_percentage, share.from.as_str()), (50, "server"));
        assert_eq!(share.pinned_memory_bytes, Some(4 << 30));

        assert_eq!((mig.via.as_str(), mig.instance.as_deref()), ("mig", Some("MIG-a")));
        assert_eq!(
            (mig.gpu_instance_id, mig.user.as_deref(), mig.command.as_deref()),
            (Some(1), None, None)
        );
        assert_eq!((mig.container.as_deref(), mig.unit.as_deref()), (Some("abababababab"), None));

        assert_eq!((own.via.as_str(), own.instance.as_deref()), ("mps", Some("MIG-c")));
        assert_eq!((own.gpu_instance_id, own.memory_bytes), (Some(3), None));
        let share = own.share.as_ref().unwrap();
        assert_eq!((share.active_thread_percentage, share.from.as_str()), (10, "client"));

        let idle: Vec<(&str, &str)> =
            table.idle.iter().map(|d| (d.what.as_str(), d.uuid.as_str())).collect();
        assert_eq!(idle, [("mig", "MIG-b")], "MIG-c is served, and its server has a client");
        assert!(table.idle[0].describe.contains("(GI 2, CI 0): no process"), "{table:?}");
        assert_eq!(table.left_out, 0);

        // Root sees every command line; the server's clients gone, it is idle.
        let node = NodeState { mps: vec![server("MIG-c", 1, 100, vec![31])], ..node };
        let table = super::table(&node, root, &Viewer::Root, &plain(root), &name);
        assert_eq!(table.clients[2].command.as_deref(), Some("train --secret=x"));
        let idle: Vec<(&str, &str)> =
            table.idle.iter().map(|d| (d.what.as_str(), d.uuid.as_str())).collect();
        assert_eq!(idle, [("mig", "MIG-b"), ("mps-server", "MIG-c")]);
        assert!(table.idle[1].describe.contains("(100 % threads, pinned memory 4 GiB): no client"));
        // An unknown caller sees none.
        let table = super::table(&node, root, &Viewer::Anyone, &plain(root), &name);
        assert!(table.clients.iter().all(|c| c.command.is_none()));
    }

    /// The driver names MPS clients among its processes (driver 580): without the control
    /// daemons' lists (`status` reads none), each is the client of the server of its GPU
    /// or instance, with the driver's memory; one of an MPS server gpushare does not run is
    /// still `mps`, with no server or share.
    #[test]
    fn the_driver_names_mps_clients_without_the_control_daemon() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        fake(root, 40, "python3", alice(), "python3 a.py", "0::/\n", "");
        fake(root, 41, "python3", alice(), "python3 b.py", "0::/\n", "");
        fake(root, 42, "python3", alice(), "python3 c.py", "0::/\n", "");
        let mps = |pid, gi, bytes| ComputeProcess { mps_client: true, ..process(pid, gi, bytes) };
        // `status` asks no control daemon.
        let unasked = |uuid, gpu, threads| MpsServerState {
            clients_read: false,
            ..server(uuid, gpu, threads, Vec::new())
        };
        let node = NodeState {
            gpus: vec![
                gpu(0, Vec::new(), vec![mps(40, None, Some(2_485_125_120))]),
                gpu(
                    1,
                    vec![instance(1, "MIG-a"), instance(2, "MIG-b")],
                    vec![mps(41, Some(2), Some(1 << 30)), mps(42, Some(1), Some(1 << 30))],
                ),
            ],
            mps: vec![unasked("GPU-0", 0, 50), unasked("MIG-b", 1, 25)],
            ..NodeState::default()
        };
        let table = table(&node, root, &Viewer::Anyone, &plain(root), &|_| None);
        let [whole, unserved, served] = table.clients.as_slice() else { panic!("{table:#?}") };
        assert_eq!((whole.via.as_str(), whole.mps_server.as_deref()), ("mps", Some("GPU-0")));
        assert_eq!(whole.memory_bytes, Some(2_485_125_120));
        assert_eq!(whole.share.as_ref().map(|s| s.active_thread_percentage), Some(50));
        assert_eq!((unserved.pid, unserved.mps_server.as_deref()), (42, None), "{table:#?}");
        assert_eq!((unserved.via.as_str(), unserved.share.as_ref()), ("mps", None));
        assert_eq!((served.pid, served.mps_server.as_deref()), (41, Some("MIG-b")));
        assert_eq!(served.instance.as_deref(), Some("MIG-b"));
        assert_eq!(served.share.as_ref().map(|s| s.active_thread_percentage), Some(25));
        assert!(table.idle.iter().all(|d| d.what != "mps-server"), "{table:#?}");

        // Its control daemon asked and not naming it, a client is another MPS's.
        let asked = NodeState {
            mps: vec![server("GPU-0", 0, 50, vec![]), node.mps[1].clone()],
            ..node.clone()
        };
        let table = super::table(&asked, root, &Viewer::Anyone, &plain(root), &|_| None);
        assert_eq!((table.clients[0].pid, table.clients[0].mps_server.as_deref()), (40, None));
        // Another MPS server on the GPU (a server no daemon of gpushare's started): the
        // driver's word does not say whose client it is. That server is listed itself:
        // MPS's program proves nothing of what runs in it (LD_PRELOAD), nothing hides.
        fake(root, 50, "nvidia-cuda-mps", bob(), "nvidia-cuda-mps-server", "0::/\n", "");
        let mut other = node.clone();
        other.gpus[0].processes.push(process(50, None, Some(66 << 20)));
        let table = super::table(&other, root, &Viewer::Anyone, &plain(root), &|_| None);
        let pids: Vec<u32> = table.clients.iter().map(|c| c.pid).collect();
        assert_eq!(pids, [40, 50, 42, 41], "someone's own server is listed: {table:#?}");
        assert_eq!(table.clients[0].mps_server, None, "{table:#?}");
        // gpushare's own server (its parent the control daemon, 900) is no client either,
        // and does not hide whose clients run there.
        fake_status(root, 50, "PPid:", "900");
        let table = super::table(&other, root, &Viewer::Anyone, &plain(root), &|_| None);
        assert_eq!(table.clients[0].mps_server.as_deref(), Some("GPU-0"), "{table:#?}");
        assert!(table.clients.iter().all(|c| c.pid != 50), "{table:#?}");
        // A process naming itself like MPS is still a client; a zombie is none.
        fake(root, 51, "nvidia-cuda-mps", bob(), "python3 hide.py", "0::/\n", "");
        fake(root, 52, "python3", bob(), "python3 gone.py", "0::/\n", "");
        fake_status(root, 52, "State:", "Z (zombie)");
        other.gpus[0].processes.extend([process(51, None, None), process(52, None, None)]);
        let table = super::table(&other, root, &Viewer::Anyone, &plain(root), &|_| None);
        let pids: Vec<u32> = table.clients.iter().map(|c| c.pid).collect();
        assert_eq!(pids, [51, 40, 42, 41], "{table:#?}");
        // A main thread gone (pthread_exit) while another thread holds the GPU: a zombie
        // still in use, and listed. A copy of a program that a user named like MPS's (a
        // file others may change, or someone else's): a client like any other.
        let b = bob();
        let status =
            format!("Name:\tpython3\nState:\tZ (zombie)\nThreads:\t3\nUid:\t{b}\t{b}\t{b}\t{b}\n");
        fs::write(root.join("52/status"), status).unwrap();
        fake(root, 53, "python3", bob(), "nvidia-cuda-mps-x train.py", "0::/\n", "");
        fs::set_permissions(root.join("bin/nvidia-cuda-mps-x"), fs::Permissions::from_mode(0o775))
            .unwrap();
        other.gpus[0].processes.push(process(53, None, None));
        let table = super::table(&other, root, &Viewer::Anyone, &plain(root), &|_| None);
        let pids: HashSet<u32> = table.clients.iter().map(|c| c.pid).collect();
        assert!(pids.is_superset(&HashSet::from([51, 52, 53])), "{table:#?}");
        assert_eq!(table.clients.len(), 6, "{table:#?}");
        // A GPU instance subdivided, a server on each compute instance: the driver names
        // the GPU instance only, so which server is not said.
        let mut split = node.clone();
        split.gpus[1].instances[1].compute_instances.push(ComputeInstance {
            id: 1,
            uuid: "MIG-b2".into(),
            slices: 1,
        });
        split.mps.push(MpsServerState { compute_instance: 1, ..unasked("MIG-b2", 1, 10) });
        let table = super::table(&split, root, &Viewer::Anyone, &plain(root), &|_| None);
        let c = table.clients.iter().find(|c| c.pid == 41).unwrap();
        assert_eq!(
            (c.via.as_str(), c.mps_server.as_deref(), c.instance.as_deref()),
            ("mps", None, None)
        );
        // Its idle servers say which compute instance each serves.
        let idle: Vec<&str> = table.idle.iter().map(|d| d.describe.as_str()).collect();
        assert!(idle.iter().any(|d| d.contains("(GI 2, CI 0) (25 % threads")), "{idle:#?}");
        assert!(idle.iter().any(|d| d.contains("(GI 2, CI 1) (10 % threads")), "{idle:#?}");

        // The metrics' refresh asks the control daemon only where the driver's lists may
        // not tell: a GPU without the MPS list, or a MIG instance.
        assert!(!driver_names_clients(&node, &node.mps[0]), "the GPU did not answer");
        let mut named = node.clone();
        for g in &mut named.gpus {
            g.mps_clients_named = true;
        }
        assert!(driver_names_clients(&named, &named.mps[0]), "a whole GPU that answered");
        assert!(!driver_names_clients(&named, &named.mps[1]), "a MIG instance");
    }

    /// Issue 36, finding 6: under `hidepid` a user sees another's process as the driver
    /// shows it to everyone (its PID, GPU and memory), not whose it is, where it runs or
    /// what it runs; only root and the process's own user get what its environment says.
    #[test]
    fn each_viewer_sees_what_it_may_read_in_proc() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let env = format!("SECRET=hunter2 {THREADS_VARIABLE}=10");
        let (infer, train) =
            ("0::/system.slice/infer.service\n", "0::/system.slice/train.service\n");
        fake(root, 60, "infer", alice(), "infer --token=t0k", infer, &env);
        fake(root, 61, "train", bob(), "train", train, "");
        let mps = ComputeProcess { mps_client: true, ..process(60, None, Some(1 << 30)) };
        let node = NodeState {
            gpus: vec![gpu(0, Vec::new(), vec![mps, process(61, None, Some(2 << 30))])],
            mps: vec![server("GPU-0", 0, 50, vec![60])],
            ..NodeState::default()
        };
        let hidepid = ProcMount { hidepid: HidePid::Invisible, gid: Some(27), subset_pid: false };
        let name = |uid: u32| Some(format!("user{uid}"));
        let view = |viewer: &Viewer, proc: &ProcMount| {
            let mut table = table(&node, root, viewer, &mounts(root, proc.clone()), &name);
            // Alice's first.
            table.clients.sort_by_key(|c| c.pid);
            assert_eq!(table.clients.iter().map(|c| c.pid).collect::<Vec<_>>(), [60, 61]);
            table
        };
        // (uid, unit, command, threads and whence) of a client.
        let seen = |c: &GpuClient| {
            let share = c.share.as_ref().map(|s| (s.active_thread_percentage, s.from.clone()));
            (c.uid, c.unit.clone(), c.command.clone(), share)
        };
        let hidden = |c: &GpuClient, threads: Option<(u32, String)>| {
            assert_eq!(seen(c), (None, None, None, threads), "{c:#?}");
            assert_eq!((c.user.as_ref(), c.container.as_ref()), (None, None), "{c:#?}");
        };
        let server_share = Some((50, "server".to_string()));
        let own_share = Some((10, "client".to_string()));
        let unit = |u: &str| Some(u.to_string());

        // Bob, hidepid on: alice's client is its PID, GPU, way in and memory, no more.
        let bobs = Viewer::User { uid: bob(), groups: Some(vec![4, 5]) };
        let table = view(&bobs, &hidepid);
        let c = &table.clients[0];
        hidden(c, server_share.clone());
        assert_eq!((c.pid, c.gpu, c.via.as_str(), c.memory_bytes), (60, 0, "mps", Some(1 << 30)));
        assert_eq!(c.mps_server.as_deref(), Some("GPU-0"));
        // Alice sees hers whole, the share her environment sets included; not bob's.
        let table = view(&as_alice(), &hidepid);
        let own = (Some(alice()), unit("infer.service"), unit("infer --token=t0k"), own_share);
        assert_eq!(seen(&table.clients[0]), own);
        hidden(&table.clients[1], None);
        // The gid= group sees whose and where, never another's command or environment.
        let exempt = Viewer::User { uid: bob(), groups: Some(vec![27]) };
        let table = view(&exempt, &hidepid);
        let attributed = (Some(alice()), unit("infer.service"), None, server_share.clone());
        assert_eq!(seen(&table.clients[0]), attributed);
        // Not under ptraceable, which exempts no one.
        let ptraceable = ProcMount { hidepid: HidePid::Ptraceable, ..hidepid.clone() };
        hidden(&view(&exempt, &ptraceable).clients[0], server_share.clone());
        // Without hidepid, bob sees whose and where, but still not her environment's word.
        assert_eq!(seen(&view(&bobs, &ProcMount::PLAIN).clients[0]), attributed);
        // Anyone (status), under hidepid: nobody's; root: everything.
        let table = view(&Viewer::Anyone, &hidepid);
        hidden(&table.clients[0], server_share.clone());
        hidden(&table.clients[1], None);
        let table = view(&Viewer::Root, &hidepid);
        assert_eq!(seen(&table.clients[0]).3, Some((10, "client".to_string())));
        assert_eq!(table.clients[1].command.as_deref(), Some("train"));
        // The agent's own refresh: everyone attributed for its journal, no command line or
        // environment; the metrics show what anyone may see.
        let table = view(&Viewer::Agent, &hidepid);
        assert_eq!(seen(&table.clients[0]), attributed);
        let mut public = for_anyone(&table, &hidepid);
        public.clients.sort_by_key(|c| c.pid);
        hidden(&public.clients[0], server_share);
        assert_eq!(for_anyone(&table, &ProcMount::PLAIN), table);
        // A caller known by uid only (the bus gave no groups), and root by uid.
        assert_eq!(Viewer::from(Some(bob())), Viewer::User { uid: bob(), groups: None });
        assert_eq!((Viewer::from(Some(0)), Viewer::from(None)), (Viewer::Root, Viewer::Anyone));
        let caller = crate::engine::Caller { uid: bob(), groups: Some(vec![27]) };
        assert_eq!(Viewer::from(&caller), exempt);
    }

    #[test]
    fn processes_the_driver_lists_and_proc_lacks_are_said() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        fake(root, 40, "python3", alice(), "python3 a.py", "0::/\n", "");
        let mut mig = gpu(1, vec![instance(1, "MIG-a"), instance(2, "MIG-b")], Vec::new());
        mig.mig_enabled = true;
        // 41 in another PID namespace (the driver's memory), 42 an MPS client only a
        // control daemon named and that has ended (no memory of its own: just gone).
        mig.processes =
            vec![process(40, Some(1), Some(1 << 30)), process(41, Some(2), Some(512 << 20))];
        let node = NodeState {
            gpus: vec![mig],
            mps: vec![server("MIG-a", 1, 50, vec![42]), server("MIG-b", 1, 50, vec![41])],
            ..NodeState::default()
        };
        let table = table(&node, root, &Viewer::Anyone, &plain(root), &|_| None);
        assert_eq!(table.clients.iter().map(|c| c.pid).collect::<Vec<_>>(), [40], "{table:#?}");
        assert_eq!(
            table.unseen,
            [UnseenProcess {
                pid: 41,
                gpu: 1,
                gpu_instance_id: Some(2),
                memory_bytes: Some(512 << 20)
            }]
        );
        // Its GPU instance and the MPS server it is a client of are in use, not idle.
        assert!(table.idle.iter().all(|d| d.uuid != "MIG-b"), "{table:#?}");
        assert!(table.idle.iter().any(|d| d.uuid == "MIG-a"), "42 is gone: {table:#?}");
    }

    #[test]
    fn the_table_is_capped_and_says_how_many_were_left_out() {
        let me = std::process::id();
        let processes = (0..CLIENTS_MAX as u32 + 5).map(|_| process(me, None, None)).collect();
        let node = NodeState { gpus: vec![gpu(0, Vec::new(), processes)], ..NodeState::default() };
        let table = table(&node, Path::new("/proc"), &Viewer::Root, &Mounts::read(), &|_| None);
        assert_eq!((table.clients.len(), table.left_out), (CLIENTS_MAX, 5));
    }

    /// Issue 42: a client on a GPU or MIG instance with a fault carries the fault's detail;
    /// a client beside it (another GPU, another instance) stays healthy (`null`).
    #[test]
    fn clients_on_a_faulted_gpu_or_instance_are_marked() {
        let me = std::process::id();
        let node = NodeState {
            gpus: vec![
                gpu(0, Vec::new(), vec![process(me, None, None)]),
                gpu(
                    1,
                    vec![instance(2, "MIG-a"), instance(3, "MIG-b")],
                    vec![process(me, Some(2), None), process(me, Some(3), None)],
                ),
            ],
            ..NodeState::default()
        };
        let mut table = table(&node, Path::new("/proc"), &Viewer::Root, &Mounts::read(), &|_| None);
        let health = Health::default();
        let marks = |table: &ClientTable| -> Vec<(u32, Option<u32>, Option<String>)> {
            table.clients.iter().map(|c| (c.gpu, c.gpu_instance_id, c.unhealthy.clone())).collect()
        };
        mark_unhealthy(&mut table, &health);
        assert_eq!(marks(&table), [(0, None, None), (1, Some(2), None), (1, Some(3), None)]);
        let instance_fault = "Xid 94 (Contained ECC error): restart the application".to_string();
        use crate::health::{Action, Cause, Report};
        let xid = Report::on_gpu(
            1,
            Cause::Xid(94),
            Action::RestartApplication,
            "Xid 94 (Contained ECC error)",
        );
        health.raise(xid.within(Some((3, Some(0)))));
        mark_unhealthy(&mut table, &health);
        assert_eq!(
            marks(&table),
            [(0, None, None), (1, Some(2), None), (1, Some(3), Some(instance_fault.clone()))]
        );
        // A fault on the whole GPU covers every instance of it; serialised, healthy is null.
        health.raise(Report::on_gpu(0, Cause::Lost, Action::RebootNode, "GPU lost"));
        mark_unhealthy(&mut table, &health);
        assert_eq!(table.clients[0].unhealthy.as_deref(), Some("GPU lost: reboot the node"));
        let json = serde_json::to_value(&table).unwrap();
        assert_eq!(json["clients"][1]["unhealthy"], serde_json::Value::Null);
        assert_eq!(json["clients"][2]["unhealthy"], instance_fault.as_str());
    }
}
