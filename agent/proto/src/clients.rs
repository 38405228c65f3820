//! Who uses the GPUs: every compute process on a GPU, a MIG instance or through an MPS
//! server, attributed to its user, unit or container (issue 29). `Clients`'s answer, and
//! what `gpushare-ctl clients --json` prints.

use serde::{Deserialize, Serialize};

/// The most clients one answer lists; the rest are counted in [`ClientTable::left_out`].
pub const CLIENTS_MAX: usize = 4096;

/// Every client of the node's GPUs, and the capacity no one uses.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClientTable {
    /// The clients, by GPU, instance, MPS server and PID.
    pub clients: Vec<GpuClient>,
    /// MIG instances without a process and running MPS servers without a client.
    pub idle: Vec<IdleDevice>,
    /// Clients beyond [`CLIENTS_MAX`], not listed.
    #[serde(default)]
    pub left_out: u32,
    /// Processes the driver lists with no `/proc` entry the agent can read: in another PID
    /// namespace than the agent's, or ended between the two reads. At most
    /// [`CLIENTS_MAX`], counted with the clients.
    #[serde(default)]
    pub unseen: Vec<UnseenProcess>,
}

/// A process the driver lists on a GPU that the agent cannot find in its `/proc`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnseenProcess {
    /// The process id the driver gives.
    pub pid: u32,
    /// GPU index.
    pub gpu: u32,
    /// The MIG GPU instance it runs in, on a GPU in MIG mode.
    pub gpu_instance_id: Option<u32>,
    /// GPU memory it uses, as the driver reports it.
    pub memory_bytes: Option<u64>,
}

/// One process using a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuClient {
    /// Its process id, as the host sees it.
    pub pid: u32,
    /// Its real user id (`/proc/PID/status`).
    pub uid: Option<u32>,
    /// That user's name, when the password database has one.
    pub user: Option<String>,
    /// Its command line (arguments joined by spaces, at most 256 bytes); `null` when the
    /// caller may not see it: shown to root and to the process's own user only.
    pub command: Option<String>,
    /// The systemd unit it runs in (`foo.service`, `session-3.scope`), from its cgroup, or
    /// the Slurm job (`slurm-job-12`), from Slurm's cgroup or the root-owned `slurmstepd` it
    /// runs under.
    pub unit: Option<String>,
    /// The container it runs in (12 hex digits of its id), from its cgroup.
    pub container: Option<String>,
    /// GPU index.
    pub gpu: u32,
    /// `GPU-…` of that GPU.
    pub gpu_uuid: String,
    /// `MIG-…` of the MIG device it runs on; `null` on a whole GPU (or a GPU instance
    /// split into several compute instances, which the driver does not tell apart).
    pub instance: Option<String>,
    /// GPU instance id of that MIG device, as `status` and nvidia-smi name it.
    #[serde(default)]
    pub gpu_instance_id: Option<u32>,
    /// How it reaches the GPU: `gpu` (a whole GPU), `mig` (a MIG device) or `mps`
    /// (through an MPS server).
    pub via: String,
    /// The `GPU-…` or `MIG-…` the MPS server it is a client of serves.
    pub mps_server: Option<String>,
    /// GPU memory it holds, as the driver reports it; `null` where the driver does not
    /// list the process (an MPS client the driver shows only through its server).
    pub memory_bytes: Option<u64>,
    /// The share an MPS client runs under.
    pub share: Option<ClientShare>,
    /// `null` while its GPU and MIG instance are healthy; else the fault that makes them
    /// unhealthy, in words (its `detail` in `status`: `Xid 79 (GPU has fallen off the
    /// bus): reboot the node`), issue 42.
    #[serde(default)]
    pub unhealthy: Option<String>,
}

/// The share of an MPS client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientShare {
    /// Its active thread percentage (1-100).
    pub active_thread_percentage: u32,
    /// Its pinned device memory limit in bytes (the server's); `null` for none.
    pub pinned_memory_bytes: Option<u64>,
    /// Where the percentage comes from: `server` (the server's default) or `client` (the
    /// client's own `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, lower than the server's).
    pub from: String,
}

/// A MIG device or MPS server that no process uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdleDevice {
    /// GPU index.
    pub gpu: u32,
    /// `MIG-…` (a MIG device), or the `GPU-…`/`MIG-…` an MPS server serves.
    pub uuid: String,
    /// `mig` or `mps-server`.
    pub what: String,
    /// What it is, one line.
    pub describe: String,
}
