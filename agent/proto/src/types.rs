//! JSON documents exchanged over D-Bus and printed by `gpushare-ctl --json`.
//!
//! Stable: fields may be added, none renamed or removed. Optional fields are `null` when
//! unknown rather than missing.

use serde::{Deserialize, Serialize};

/// What `Status` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The profile last applied successfully, if any.
    pub active_profile: Option<String>,
    /// Where the active profile came from: `built-in`, its file in the profile directory,
    /// or the document it was applied from (`apply -f`); `no longer known` when it is gone.
    #[serde(default)]
    pub active_source: Option<String>,
    /// What the agent drives: `nvml` (NVIDIA's driver) or `simulated` (the NVML backend on
    /// gpushare's simulated driver library, `--simulate`).
    pub backend: String,
    /// The apply changing the GPUs right now (job and profile), if any.
    pub apply_in_progress: Option<String>,
    /// Whether that apply is the agent's re-apply of its profile at start-up (the job
    /// `start-up`). Applies, probes and benches that arrive meanwhile wait for it rather
    /// than be refused as busy (each call up to 20 s; gpushare-ctl calls again).
    #[serde(default)]
    pub starting_up: bool,
    /// Set when an apply failed and so did its rollback, or its end could not be written
    /// to the journal: the GPUs may be between layouts until the next apply rolls it back.
    #[serde(default)]
    pub rollback_error: Option<String>,
    /// Why the last apply failed (it was rolled back, or could not be), until an apply
    /// succeeds; the node labels say `gpushare.io/state=failed` meanwhile.
    #[serde(default)]
    pub apply_error: Option<String>,
    /// Why the agent changes nothing on the GPUs (its configuration did not read), if so.
    #[serde(default)]
    pub hands_off: Option<String>,
    /// How the GPUs differ from the active profile, when something else changed them (no
    /// job of the agent's runs): the steps that would apply it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<String>,
    /// Why the re-apply of the active profile at start-up failed, until an apply succeeds.
    #[serde(default)]
    pub start_up_error: Option<String>,
    /// The benches running now, each holding one GPU until it ends (issue 27; one at a
    /// time on a node for now). Empty when none runs.
    #[serde(default)]
    pub benches: Vec<BenchStatus>,
    /// Whether the agent watches the driver's events (issue 42): `null` when it does,
    /// else why not (the events are polled then, as far as the driver answers).
    #[serde(default)]
    pub health_events: Option<String>,
    /// Every GPU, by index.
    pub gpus: Vec<GpuStatus>,
}

/// A bench running on a GPU, as [`Status`] shows it to everyone: the job, the GPU, who
/// started it, since when, and what the GPU goes back to at its end. Never the command,
/// its directory or its output, which are the caller's and root's alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BenchStatus {
    /// The bench's job (`/io/gpushare/Agent1/jobs/3`).
    pub job: String,
    /// The GPU it holds, by index.
    pub gpu: u32,
    /// That GPU's `GPU-…`.
    pub uuid: String,
    /// Who started it.
    pub uid: u32,
    /// Their user name, when the password database knows it.
    pub user: Option<String>,
    /// When it began, seconds since the Unix epoch.
    pub started_unix_seconds: u64,
    /// How long it has run, seconds.
    pub running_seconds: u64,
    /// The profile active when it began (`null`: none). Its setups never become the active
    /// profile; an apply of another GPU during the bench does, and stays so after it.
    pub profile_before: Option<String>,
    /// The GPU's sharing as it was when the bench began, which the bench puts back at its
    /// end, in words: `MIG off, compute mode default, MPS at 100 % threads`.
    pub restores: String,
}

/// One GPU in [`Status`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuStatus {
    /// NVML index.
    pub index: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// Model as the catalog names it (`A100-SXM4-40GB`), else NVML's name.
    pub model: String,
    /// Total device memory in bytes.
    pub memory_total_bytes: u64,
    /// Whether MIG mode is on now.
    pub mig_enabled: bool,
    /// The MIG mode that takes effect at the next GPU reset, when it differs.
    pub mig_pending: Option<bool>,
    /// `default`, `exclusive_process` or `prohibited`.
    pub compute_mode: String,
    /// How the whole GPU is shared (meaningful when MIG is off).
    pub sharing: Sharing,
    /// MIG instances, by placement.
    pub instances: Vec<InstanceStatus>,
    /// PIDs of compute processes on the GPU or its instances.
    pub processes: Vec<u32>,
    /// Who uses the GPU (issue 29): its clients as `Clients` attributes them, never with a
    /// command line (`command` is `null`: `gpushare-ctl clients` shows it to those who may
    /// see it). Empty from an agent older than this field.
    #[serde(default)]
    pub clients: Vec<crate::clients::GpuClient>,
    /// Its faults (issue 42), on the whole GPU or on one of its MIG instances: empty when
    /// healthy. New shares are not handed out where a fault lies until it clears.
    #[serde(default)]
    pub health: Vec<crate::health::HealthFault>,
}

/// One MIG instance (a GPU instance with its compute instance) in [`GpuStatus`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceStatus {
    /// Profile name (`1g.5gb`).
    pub profile: String,
    /// First memory slot.
    pub placement_start: u32,
    /// Memory slots occupied.
    pub placement_size: u32,
    /// NVML GPU instance id.
    pub gpu_instance_id: u32,
    /// NVML compute instance id, if one exists.
    pub compute_instance_id: Option<u32>,
    /// `MIG-…` of the compute instance, if one exists.
    pub uuid: Option<String>,
    /// Instance memory in bytes.
    pub memory_bytes: u64,
    /// How the instance is shared (its first compute instance's sharing).
    pub sharing: Sharing,
    /// Its compute instances, each a MIG device of its own (one, full-size, unless the
    /// instance is subdivided: `"1c.3g" = 3`). Empty from an agent older than this field.
    #[serde(default)]
    pub compute_instances: Vec<ComputeInstanceStatus>,
}

/// One compute instance of an [`InstanceStatus`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComputeInstanceStatus {
    /// NVML compute instance id.
    pub compute_instance_id: u32,
    /// Compute slices (the `1c` of `1c.3g.40gb`).
    pub compute_slices: u32,
    /// `MIG-…` of the MIG device it is.
    pub uuid: String,
    /// How it is shared: its own MPS server, or exclusive.
    pub sharing: Sharing,
}

/// Sharing state of a GPU or MIG instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sharing {
    /// `exclusive`, `time-slicing` or `mps`.
    pub strategy: String,
    /// Time-slice interval (`default`, `short`, `medium`, `long`) under time-slicing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    /// The MPS server, under MPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsServer>,
    /// Under time-slicing, the clients the applied profile meant the GPU for (its
    /// `replicas`, which nothing on the GPU records: what NVIDIA's device plugin config and
    /// the node labels advertise); absent when the profile gave none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
}

impl Sharing {
    /// No sharing set up by gpushare.
    pub fn exclusive() -> Self {
        Self {
            strategy: crate::Strategy::Exclusive.as_str().into(),
            interval: None,
            mps: None,
            replicas: None,
        }
    }
}

/// One MPS server (control daemon) the agent runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MpsServer {
    /// `GPU-…` or `MIG-…` it serves.
    pub uuid: String,
    /// GPU index.
    pub gpu: u32,
    /// Placement start of the MIG instance; `null` for a whole GPU.
    pub placement_start: Option<u32>,
    /// GPU instance id of the MIG instance, as `status` and nvidia-smi name it; `null` for
    /// a whole GPU or an instance no longer there.
    #[serde(default)]
    pub gpu_instance_id: Option<u32>,
    /// `running` or `down` (the supervisor restarts it).
    pub state: String,
    /// Control daemon pid.
    pub pid: Option<u32>,
    /// The active thread percentage a client connecting now gets: the running server
    /// process's as its control daemon answers it, else the daemon's default (the first
    /// client starts a server with it). The configured one when the daemon was not asked
    /// (`limits_source` `null`; agents before live limits always showed the configured one).
    pub active_thread_percentage: u32,
    /// The pinned device memory limit in bytes a client connecting now gets, as
    /// `active_thread_percentage`; `null` for none.
    pub pinned_memory_limit_bytes: Option<u64>,
    /// Restarts by the supervisor.
    pub restarts: u32,
    /// The pipe directory clients use (`CUDA_MPS_PIPE_DIRECTORY`).
    pub pipe_directory: String,
    /// Client pids (empty when not asked or none).
    #[serde(default)]
    pub clients: Vec<u32>,
    /// Where the two limits above come from: `profile` (as the profile set them),
    /// `mps-limit` (an override `gpushare-ctl mps limit` made on the running server
    /// process) or `unknown` (changed through the control daemon outside gpushare: drift,
    /// which the health check puts back); `null` when the daemon was not asked.
    #[serde(default)]
    pub limits_source: Option<String>,
    /// The limits the profile set as the daemon's defaults. `null` from older agents.
    #[serde(default)]
    pub configured: Option<MpsLimitValues>,
    /// The daemon's default limits as it answers them now (what a server it starts from now
    /// on gets); `null` when it was not asked.
    #[serde(default)]
    pub daemon_defaults: Option<MpsLimitValues>,
    /// The running MPS server processes (one at a time: the daemon starts one with the first
    /// client), as the daemon answers for them; empty when none runs or it was not asked.
    #[serde(default)]
    pub server_processes: Vec<MpsServerProcess>,
    /// Whether the daemon serves every user's clients at once through one server running
    /// as root (multi-user, `-M`: the profile's `multi_user`), or one user's at a time
    /// (NVIDIA's default: a client of another user waits until the server's clients are
    /// gone).
    #[serde(default)]
    pub multi_user: bool,
    /// Drifted limits the health check put back since the agent started.
    #[serde(default)]
    pub limit_restores: u32,
}

/// An MPS server's two limits of clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsLimitValues {
    /// Active thread percentage.
    pub active_thread_percentage: u32,
    /// Pinned device memory limit in bytes; `null` for none.
    pub pinned_memory_limit_bytes: Option<u64>,
}

/// One MPS server process of a control daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsServerProcess {
    /// Its pid (`get_server_list`).
    pub pid: u32,
    /// The user it runs as: the one user whose clients it serves (for a multi-user daemon,
    /// the daemon's user, serving all); `null` when it could not be told.
    pub uid: Option<u32>,
    /// That user's name, when the password database has one.
    pub user: Option<String>,
    /// Its limits for new clients, as the daemon answers them.
    pub limits: MpsLimitValues,
    /// Where they come from: `profile`, `mps-limit` or `unknown` (see
    /// [`MpsServer::limits_source`]).
    pub source: String,
    /// The `mps limit` override recorded for it: who asked (uid, when the transport
    /// said) and when (seconds since the Unix epoch).
    #[serde(default)]
    pub override_by_uid: Option<u32>,
    /// When that override was made.
    #[serde(default)]
    pub override_at_unix_seconds: Option<u64>,
}

/// What `MpsStatus` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MpsStatus {
    /// Every server, by GPU and placement.
    pub servers: Vec<MpsServer>,
}

/// What `MpsLimit` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MpsLimitResult {
    /// The client.
    pub pid: u32,
    /// The MPS server process serving it, whose limits were set.
    pub server_pid: u32,
    /// The device it runs on.
    pub uuid: String,
    /// Active thread percentage set, if any.
    pub active_thread_percentage: Option<u32>,
    /// Pinned memory limit set, if any.
    pub pinned_memory_limit_bytes: Option<u64>,
    /// The GPU of that device, by index. `null` from older agents.
    #[serde(default)]
    pub gpu: Option<u32>,
    /// The control daemon of that device (the PID `gpushare-ctl mps` shows).
    #[serde(default)]
    pub daemon_pid: Option<u32>,
    /// The server process's limits before, as its control daemon answered them.
    #[serde(default)]
    pub before: Option<MpsLimitValues>,
    /// Its limits after, read back.
    #[serde(default)]
    pub after: Option<MpsLimitValues>,
    /// The daemon's default limits, which a server started later gets (for another user,
    /// or after a restart): the override does not carry over.
    #[serde(default)]
    pub daemon_defaults: Option<MpsLimitValues>,
    /// The user the server process runs as, whose clients it serves.
    #[serde(default)]
    pub server_uid: Option<u32>,
    /// That user's name.
    #[serde(default)]
    pub server_user: Option<String>,
    /// Whether the daemon serves every user at once (multi-user).
    #[serde(default)]
    pub multi_user: bool,
}

/// What `Env` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientEnv {
    /// The device the variables lead to.
    pub uuid: String,
    /// How it is shared.
    pub strategy: String,
    /// Variables, in order.
    pub variables: Vec<(String, String)>,
}

/// What `Plan` returns and `apply --dry-run` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanReport {
    /// Profile planned.
    pub profile: String,
    /// Whether anything would change.
    pub changes: bool,
    /// Steps in the order they run.
    pub steps: Vec<PlanStep>,
    /// The GPUs the profile selects and what each becomes.
    pub targets: Vec<GpuTarget>,
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanStep {
    /// GPU index.
    pub gpu: u32,
    /// Backend operation: `set_mig_mode`, `create_gpu_instance`, `create_compute_instance`,
    /// `destroy_compute_instance`, `destroy_gpu_instance` or `set_compute_mode`.
    pub operation: String,
    /// One line for people, naming the GPU (`GPU 0: enable MIG mode`).
    pub description: String,
}

/// The end state of one GPU that a plan aims at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuTarget {
    /// GPU index.
    pub gpu: u32,
    /// Model display name.
    pub model: String,
    /// MIG on or off.
    pub mig_enabled: bool,
    /// Instances as `(profile, placement_start)`, by placement.
    pub instances: Vec<TargetInstance>,
    /// Whether this GPU already matches.
    pub unchanged: bool,
}

/// A MIG instance a plan aims at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetInstance {
    /// Profile name.
    pub profile: String,
    /// First memory slot.
    pub placement_start: u32,
}

/// Outcome of a job: the `Outcome` property and the `Finished` signal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobOutcome {
    /// Whether the job succeeded.
    pub ok: bool,
    /// Profile the job applied.
    pub profile: String,
    /// Whether the GPUs changed (false for an apply of the profile already in place).
    pub changed: bool,
    /// Steps carried out.
    pub steps_done: u32,
    /// Steps planned.
    pub steps_total: u32,
    /// Wall time of the job in seconds.
    pub duration_seconds: f64,
    /// D-Bus error name when failed (`io.gpushare.Agent1.Error.Backend`).
    pub error_name: Option<String>,
    /// One-line reason when failed.
    pub error: Option<String>,
    /// Problems that did not fail the job (a failing `post_apply` hook).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// A probe job's results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeReport>,
    /// A bench job's results (also when it failed part-way: what was measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bench: Option<crate::bench::BenchReport>,
    /// This is the public outcome of a job whose whole outcome is its caller's (a bench:
    /// its command, report and the replicas' output): `Job1.GetOutcome()` answers that
    /// to the caller's user and root.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub private: bool,
}

/// What a probe job measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeReport {
    /// `GPU-…` or `MIG-…` probed.
    pub target: String,
    /// The GPU's index.
    pub gpu: u32,
    /// How the target was shared while probed: `exclusive` (the driver's time-slicing),
    /// `time-slicing` or `mps`.
    pub strategy: String,
    /// The device as the clients saw it.
    pub device: String,
    /// Measurement window of each run, seconds.
    pub seconds: f64,
    /// Wall time of the whole probe, seconds.
    pub wall_seconds: f64,
    /// One entry per workload and client count.
    pub runs: Vec<ProbeRun>,
    /// Where the agent keeps the full results.
    pub saved_to: String,
    /// With `compare`: the same runs under each sharing strategy tried.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub comparison: Vec<StrategyRuns>,
    /// With `compare`: the strategy recommended for each workload, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recommendations: Vec<Recommendation>,
}

/// The runs under one sharing strategy of a comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StrategyRuns {
    /// `time-slicing`, `mps` or `mps-limited` (MPS with 100/N % threads per client).
    pub strategy: String,
    /// As in [`ProbeReport::runs`]; scaling is against the solo run without limits.
    pub runs: Vec<ProbeRun>,
}

/// The strategy recommended for a workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recommendation {
    /// The workload.
    pub workload: String,
    /// The strategy: `time-slicing`, `mps` or `mps-limited`.
    pub strategy: String,
    /// The numbers behind it, one line.
    pub reason: String,
}

/// N clients of one workload started together, against a solo baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeRun {
    /// `launch`, `compute` or `memory`.
    pub workload: String,
    /// Clients run together.
    pub clients: u32,
    /// Solo steps per second.
    pub solo_throughput_per_s: f64,
    /// Solo median step latency, ms.
    pub solo_p50_ms: f64,
    /// What the solo client achieved against the device's limit, e.g.
    /// `63.6 of 66.9 TFLOP/s fp32 (95 %)`.
    pub solo_achieved: String,
    /// Sum of the clients' throughputs over solo throughput.
    pub scaling: f64,
    /// Jain's fairness index of the clients' throughputs (1 = all equal).
    pub jain_fairness: f64,
    /// Mean client p50 latency over solo p50.
    pub p50_inflation: f64,
    /// Worst client p99 latency over solo p99.
    pub p99_inflation: f64,
    /// Each client.
    pub per_client: Vec<ProbeClient>,
}

/// One client of a probe run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeClient {
    /// Steps per second.
    pub throughput_per_s: f64,
    /// Median step latency, ms.
    pub p50_ms: f64,
    /// 99th percentile step latency, ms.
    pub p99_ms: f64,
    /// Solo throughput over this client's.
    pub slowdown: f64,
}

/// What `ListProfiles` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileList {
    /// Profiles by name.
    pub profiles: Vec<ProfileSummary>,
    /// Profile files that failed to load, with the reason (file, line, column).
    pub errors: Vec<String>,
}

/// One entry of [`ProfileList`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileSummary {
    /// Name used with `apply`.
    pub name: String,
    /// One line.
    pub description: String,
    /// `built-in` or the file it came from.
    pub source: String,
    /// Whether this is the profile last applied.
    pub active: bool,
}

/// What `ShowProfile` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileDetail {
    /// Name, description, source.
    #[serde(flatten)]
    pub summary: ProfileSummary,
    /// The profile's TOML text.
    pub text: String,
}

/// What `ValidateProfile` returns for a valid profile (an invalid one is an error).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Validation {
    /// Name of the profile in the text.
    pub name: String,
    /// The plan against this node.
    pub plan: PlanReport,
}

/// What `Export` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Export {
    /// A profile (TOML) that describes the GPUs as they are, sharing included; applying
    /// it changes nothing but what `notes` says.
    pub text: String,
    /// The same MIG layout as an NVIDIA mig-parted file (`version: v1`) with one config,
    /// `exported`: `apply -f FILE -c exported` changes the MIG layout in nothing (and
    /// undoes what `mig_parted_left_out` lists). Empty from an agent older than this field.
    #[serde(default)]
    pub mig_parted: String,
    /// What `text` cannot say, one line each saying what applying it does there (also its
    /// leading comment lines). Empty when applying `text` changes nothing.
    #[serde(default)]
    pub notes: Vec<String>,
    /// What `mig_parted` leaves out (sharing, compute modes), one line each (also its
    /// leading comment lines).
    #[serde(default)]
    pub mig_parted_left_out: Vec<String>,
    /// NVIDIA's device plugin config (k8s-device-plugin `version: v1`) the GPUs give now,
    /// as `[device_plugin]` writes it; empty when the plugin could not express them (then
    /// `device_plugin_refused`) or from an agent older than this field.
    #[serde(default)]
    pub device_plugin: String,
    /// The plugin's rule the GPUs break, in one line, when it could not express them.
    #[serde(default)]
    pub device_plugin_refused: Option<String>,
    /// The node labels (NFD's local source, `key=value` lines) the GPUs give now, as
    /// `[labels]` writes them; empty from an agent older than this field.
    #[serde(default)]
    pub labels: String,
    /// Slurm's gres.conf of this node as the GPUs give it now, as `[slurm]` writes it (the
    /// slurm.conf `GresTypes=` and node `Gres=` in its comments); empty when it could not
    /// be made (then `slurm_refused`) or from an agent older than this field.
    #[serde(default)]
    pub slurm: String,
    /// Why the gres.conf could not be made (a device file missing), in one line.
    #[serde(default)]
    pub slurm_refused: Option<String>,
}

/// What `MigProfiles` returns: the MIG profiles of GPUs as their driver reports them, the
/// columns of `nvidia-smi mig -lgip` with the placements of `-lgipp` and the names
/// gpushare accepts for each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigProfiles {
    /// The GPUs asked for (every MIG-capable GPU when none was named), by index.
    pub gpus: Vec<GpuMigProfiles>,
}

/// One GPU of [`MigProfiles`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuMigProfiles {
    /// NVML index.
    pub index: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// Model display name, as `status` shows it.
    pub model: String,
    /// Where the table comes from: `read from the driver (580.159.04) through NVML`, or
    /// the catalog file's source when the driver's table could not be used.
    pub source: String,
    /// Whether the table is the driver's (true) or the catalog's (false).
    pub from_driver: bool,
    /// Whether MIG mode is on now (only then are `instances_free` known).
    pub mig_enabled: bool,
    /// Memory slots MIG places instances on (8, or 4 on the A30).
    pub memory_slots: u32,
    /// Compute slices of the whole GPU (7, or 4 on the A30).
    pub compute_slices: u32,
    /// The driver's table against gpushare's catalog; `null` when the catalog does not
    /// know the GPU.
    pub catalog: Option<CatalogComparison>,
    /// The profiles, in `nvidia-smi mig -lgip` order (compute slices, memory, enum).
    pub profiles: Vec<MigProfileInfo>,
}

/// How a GPU's MIG table compares with the catalog's model of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CatalogComparison {
    /// The catalog model (`h100-80gb`).
    pub key: String,
    /// One line per difference (`h100-80gb 1g.10gb (enum 0): SMs: NVML 14, catalog 16`);
    /// empty when they agree. Where they differ, the driver's figures are used.
    pub differences: Vec<String>,
}

/// One GPU-instance profile of [`GpuMigProfiles`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigProfileInfo {
    /// The driver's name (`1g.10gb`, `1g.10gb+me`).
    pub name: String,
    /// Profile id (nvidia-smi's ID column, NVML's `ProfileInfo.id`).
    pub id: u32,
    /// NVML's `NVML_GPU_INSTANCE_PROFILE_*` enum value.
    pub nvml_enum: u32,
    /// How many more instances of this profile fit beside the GPU's instances, as the
    /// driver counts them (nvidia-smi's Free); `null` while MIG is off.
    pub instances_free: Option<u32>,
    /// Most instances of this profile on the GPU (nvidia-smi's Total).
    pub instances_total: u32,
    /// Memory of one instance in MiB (nvidia-smi prints it as GiB, MiB/1024).
    pub memory_mib: u64,
    /// Streaming multiprocessors of one instance.
    pub sms: u32,
    /// Compute slices (the `Ng` of the name).
    pub compute_slices: u32,
    /// Memory slots one instance takes (the placement size).
    pub memory_slices: u32,
    /// Copy and media engines of one instance.
    pub engines: MigEngines,
    /// Start slots an instance may be placed at (`-lgipp`'s `{0,2,4}`), ascending.
    pub placements: Vec<u32>,
    /// The names a gpushare profile (or a mig-parted file) may use for it: the exact name,
    /// and the slice count (`1g`) where it stands for this profile on this GPU.
    pub accepts: Vec<String>,
    /// The compute instances one instance of it can be split into (`"1c.3g" = 3`): each
    /// size with how many fit, smallest first. Empty from an older agent.
    #[serde(default)]
    pub compute_instances: Vec<ComputeInstanceSize>,
    /// Whether those sizes are the driver's (NVML reports them only for a GPU instance
    /// that exists; the agent keeps what it read) rather than the MIG guide's rule.
    #[serde(default)]
    pub compute_from_driver: bool,
}

/// One compute-instance size of a [`MigProfileInfo`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeInstanceSize {
    /// Compute slices (the `1c` of `1c.3g.40gb`).
    pub compute_slices: u32,
    /// How many of this size one GPU instance holds.
    pub count: u32,
}

/// The engines of one MIG instance: `nvidia-smi mig -lgip`'s CE, DEC, ENC, JPEG and OFA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigEngines {
    /// Copy engines (CE).
    pub copy: u32,
    /// Video decoders (DEC).
    pub decoders: u32,
    /// Video encoders (ENC).
    pub encoders: u32,
    /// JPEG decoders (JPEG).
    pub jpeg: u32,
    /// Optical flow accelerators (OFA).
    pub ofa: u32,
}
