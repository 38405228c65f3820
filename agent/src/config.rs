//! `agent.toml`: where the agent keeps its files and what it may change on the GPUs.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize};

/// Default configuration file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/gpushare/agent.toml";
/// Default profile directory.
pub const DEFAULT_PROFILES_DIR: &str = "/etc/gpushare/profiles.d";
/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/gpushare";
/// Default MPS root (where `gpushare-mps@.service` has its paths).
pub const DEFAULT_MPS_ROOT: &str = "/run/gpushare/mps";
/// The most bytes of `agent.toml` read (real ones are under 2 KiB).
const CONFIG_MAX_BYTES: u64 = 1 << 20;
/// The file in the state directory that remembers where the last configuration that
/// read put the MPS servers and the tools (see [`Whereabouts`]).
const WHEREABOUTS_FILE: &str = "config-in-use.json";

/// The agent's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// Directory of profile files (`*.toml`).
    pub profiles_dir: PathBuf,
    /// Directory of the journal, the simulator's state and probe results.
    pub state_dir: PathBuf,
    /// Profile to apply at start-up instead of the active one (MIG instances do not
    /// survive a reboot, so the agent re-applies at every start).
    pub boot_profile: Option<String>,
    /// The host's root directory, under which the agent reads what decides whether a GPU
    /// can be reset before a plan resets one: `sys/` (`nvidia_drm`'s parameters, the PCI
    /// functions' reset methods, NVSwitches) and `proc/` (Fabric Manager). `/`; an agent
    /// in a container that sees the host's files at `/host` sets `/host`; `--simulate`
    /// left at `/` reads the simulated host beside the node's state file.
    pub host_root: PathBuf,
    /// What the agent may change.
    pub gpu: GpuPolicy,
    /// How applies run.
    pub apply: ApplySettings,
    /// Commands around applies.
    pub hooks: HookSettings,
    /// MPS control daemons.
    pub mps: MpsSettings,
    /// Time-slice intervals.
    pub timeslice: TimesliceSettings,
    /// Prometheus metrics.
    pub metrics: MetricsSettings,
    /// The CDI spec for container runtimes.
    pub cdi: CdiSettings,
    /// NVIDIA's device plugin config (Kubernetes).
    pub device_plugin: DevicePluginSettings,
    /// The node labels for NFD's local source (Kubernetes).
    pub labels: LabelsSettings,
    /// Slurm's gres.conf of this node.
    pub slurm: SlurmSettings,
    /// Benches of users' programs.
    pub bench: BenchSettings,
    /// The GPUs' health from the driver's events (issue 42).
    pub health: HealthSettings,
    /// Which of the places a real agent shares with others the file writes (not a key of
    /// the file: what [`AgentConfig::parse`] found in it).
    #[serde(skip)]
    pub written: Written,
}

/// The keys of `agent.toml` naming places that a real agent and a simulated one could
/// both take, and whether the file writes them, whatever their value: a simulated agent
/// takes such a place only when asked for it (DESIGN.md, "First hour, round 2 (issue 37):
/// a simulated agent is a sandbox").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Written {
    /// `state_dir`.
    pub state_dir: bool,
    /// `[mps] root`.
    pub mps_root: bool,
    /// `[cdi] dir`.
    pub cdi_dir: bool,
    /// `[device_plugin] path`.
    pub device_plugin_path: bool,
    /// `[labels] path`.
    pub labels_path: bool,
    /// `[slurm] gres_conf`.
    pub slurm_gres_conf: bool,
    /// `[slurm] slurmd_env`.
    pub slurm_slurmd_env: bool,
    /// `[metrics] listen`.
    pub metrics_listen: bool,
}

impl Written {
    /// The keys `text` (a TOML document that parsed) writes.
    fn found_in(text: &str) -> Written {
        let Ok(doc) = text.parse::<toml::Table>() else { return Written::default() };
        let has = |table: &str, key: &str| {
            doc.get(table).and_then(toml::Value::as_table).is_some_and(|t| t.contains_key(key))
        };
        Written {
            state_dir: doc.contains_key("state_dir"),
            mps_root: has("mps", "root"),
            cdi_dir: has("cdi", "dir"),
            device_plugin_path: has("device_plugin", "path"),
            labels_path: has("labels", "path"),
            slurm_gres_conf: has("slurm", "gres_conf"),
            slurm_slurmd_env: has("slurm", "slurmd_env"),
            metrics_listen: has("metrics", "listen"),
        }
    }
}

/// A view's place, as [`AgentConfig::views_in_state_dir`] asks whether to move it.
#[derive(Debug, Clone, Copy)]
pub struct ViewPlace {
    /// Whether the file writes it.
    pub written: bool,
    /// Whether it is the default.
    pub at_default: bool,
}

/// Benches (`gpushare-ctl bench`): how long one may hold its GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BenchSettings {
    /// The longest one bench may take, seconds (1 to 604800, a week): one that would take
    /// longer by its least estimate is refused before any setup, one that reaches it is
    /// stopped and its GPU restored.
    #[serde(deserialize_with = "bench_total")]
    pub max_total_seconds: u64,
}

/// `[bench] max_total_seconds` by default: 4 hours.
pub const BENCH_MAX_TOTAL_SECONDS: u64 = 4 * 3600;

impl Default for BenchSettings {
    fn default() -> Self {
        Self { max_total_seconds: BENCH_MAX_TOTAL_SECONDS }
    }
}

/// The CDI spec (Container Device Interface) the agent keeps of what the node shares.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CdiSettings {
    /// Whether to write it.
    pub enabled: bool,
    /// The directory container runtimes read CDI specs from (`/var/run/cdi`; under
    /// `--simulate` unless the file writes it, `<state_dir>/cdi`, so that a simulation
    /// never names devices to the host's runtimes unless asked to).
    pub dir: PathBuf,
}

impl Default for CdiSettings {
    fn default() -> Self {
        Self { enabled: true, dir: PathBuf::from("/var/run/cdi") }
    }
}

/// NVIDIA's device plugin config (its `--config-file`), kept true to the GPUs (DESIGN.md,
/// "Kubernetes (issue 40)").
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DevicePluginSettings {
    /// Whether to write it (off by default: a Kubernetes node's setting). On, an apply the
    /// plugin could not express is refused before its first step.
    pub enabled: bool,
    /// The file (`/run/gpushare/device-plugin.yaml`; under `--simulate` unless the file
    /// writes it, or without root, `<state_dir>/device-plugin.yaml`).
    pub path: PathBuf,
    /// Whether MPS may be handed out through the plugin: it mounts the MPS root's `shm`,
    /// where gpushare's servers meet their clients (the host's `/dev/shm`), into every pod
    /// it gives a share. Off (the default), an MPS profile is refused while the view is on.
    pub mps_host_shm: bool,
}

/// Where [`DevicePluginSettings::path`] is by default.
pub const DEVICE_PLUGIN_PATH: &str = "/run/gpushare/device-plugin.yaml";

impl Default for DevicePluginSettings {
    fn default() -> Self {
        Self { enabled: false, path: PathBuf::from(DEVICE_PLUGIN_PATH), mps_host_shm: false }
    }
}

/// The node labels gpushare gives NFD's local feature source (a features.d file).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LabelsSettings {
    /// Whether to write them (off by default: a Kubernetes node's setting).
    pub enabled: bool,
    /// The file (`/etc/kubernetes/node-feature-discovery/features.d/gpushare`; under
    /// `--simulate` unless the file writes it, or without root,
    /// `<state_dir>/features.d/gpushare`).
    pub path: PathBuf,
}

/// Where [`LabelsSettings::path`] is by default.
pub const LABELS_PATH: &str = "/etc/kubernetes/node-feature-discovery/features.d/gpushare";

impl Default for LabelsSettings {
    fn default() -> Self {
        Self { enabled: false, path: PathBuf::from(LABELS_PATH) }
    }
}

/// Slurm's gres.conf of this node, kept true to the GPUs, and the node taken through a
/// change of its GRES (DESIGN.md "Slurm (issue 41)").
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlurmSettings {
    /// Whether to write it (off by default: a Slurm node's setting).
    pub enabled: bool,
    /// The node-local gres.conf slurmd reads (`/etc/slurm/gres.conf`; under `--simulate`
    /// unless the file writes it, or without root, `<state_dir>/slurm/gres.conf`).
    pub gres_conf: PathBuf,
    /// Whether an apply that changes the node's GRES takes the node through it (drain,
    /// slurmd registered again with the new GRES, resume); false: gres.conf only.
    pub manage_node: bool,
    /// Slurm's name of this node; empty: the host's short name (slurmd's own default).
    pub node: String,
    /// Where `scontrol` and `squeue` are.
    pub bin_dir: PathBuf,
    /// `SLURM_CONF` for them and the slurmd commands; empty: Slurm's own default.
    pub slurm_conf: PathBuf,
    /// The file a dynamic node's slurmd reads its `Gres=` from
    /// (`GPUSHARE_SLURMD_GRES=…`, packaging/slurm/slurmd-gpushare.conf).
    pub slurmd_env: PathBuf,
    /// Stops slurmd (through `/bin/sh -c`), returning once it has stopped.
    pub stop_slurmd: String,
    /// Starts slurmd (through `/bin/sh -c`).
    pub start_slurmd: String,
    /// How long slurmd may take to register again with the new GRES, 1 to 3600 seconds.
    #[serde(deserialize_with = "register_timeout")]
    pub register_timeout_seconds: u64,
}

/// Where [`SlurmSettings::gres_conf`] is by default.
pub const SLURM_GRES_CONF: &str = "/etc/slurm/gres.conf";
/// Where [`SlurmSettings::slurmd_env`] is by default.
pub const SLURMD_ENV: &str = "/run/gpushare/slurmd.env";

impl Default for SlurmSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            gres_conf: PathBuf::from(SLURM_GRES_CONF),
            manage_node: true,
            node: String::new(),
            bin_dir: PathBuf::from("/usr/bin"),
            slurm_conf: PathBuf::new(),
            slurmd_env: PathBuf::from(SLURMD_ENV),
            stop_slurmd: "systemctl stop slurmd.service".into(),
            start_slurmd: "systemctl start slurmd.service".into(),
            register_timeout_seconds: 120,
        }
    }
}

impl SlurmSettings {
    /// Slurm's name of this node: [`SlurmSettings::node`], else the host's short name.
    pub fn node_name(&self) -> String {
        if !self.node.is_empty() {
            return self.node.clone();
        }
        let host = nix::unistd::gethostname().unwrap_or_default();
        let host = host.to_string_lossy();
        host.split('.').next().unwrap_or_default().to_string()
    }

    /// A node name Slurm could have, and that is one argument of scontrol's: letters,
    /// digits, `-`, `_` and `.`, at most 64.
    fn check_node(&self) -> Result<(), String> {
        let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if self.node.len() > 64 || !self.node.chars().all(ok) {
            return Err(format!(
                "[slurm] node: {:?} is no Slurm node name (letters, digits, '-', '_', '.'; at \
                 most 64)",
                self.node.chars().take(80).collect::<String>()
            ));
        }
        Ok(())
    }
}

fn register_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let n = u64::deserialize(d)?;
    if !(1..=3600).contains(&n) {
        return Err(serde::de::Error::custom(format!("{n} is not between 1 and 3600")));
    }
    Ok(n)
}

/// Prometheus metrics.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSettings {
    /// Whether to serve them.
    pub enabled: bool,
    /// Where (`127.0.0.1:9847`: dcgm-exporter has 9400, nvidia_gpu_exporter 9835).
    pub listen: std::net::SocketAddr,
    /// The most label sets of the series per client (1 to 4096; the rest are counted in
    /// `gpushare_client_series_dropped_total`).
    #[serde(deserialize_with = "client_series_max")]
    pub client_series_max: usize,
    /// Seconds between two refreshes of the series per client (1 to 300).
    #[serde(deserialize_with = "client_refresh")]
    pub client_refresh_seconds: u64,
}

/// `[metrics] client_series_max` by default: the most label sets of the series per client.
pub const CLIENT_SERIES_MAX: usize = 256;
/// `[metrics] client_refresh_seconds` by default.
pub const CLIENT_REFRESH_SECONDS: u64 = 5;

impl Default for MetricsSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 9847)),
            client_series_max: CLIENT_SERIES_MAX,
            client_refresh_seconds: CLIENT_REFRESH_SECONDS,
        }
    }
}

/// MPS control daemons.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MpsSettings {
    /// `nvidia-cuda-mps-control` (a bare name is looked up on `PATH`).
    pub control: PathBuf,
    /// Directory of the servers' pipe and log directories.
    pub root: PathBuf,
    /// Seconds between health checks of the servers (1 to 3600).
    #[serde(deserialize_with = "health_interval")]
    pub health_interval_seconds: u64,
}

impl Default for MpsSettings {
    fn default() -> Self {
        Self {
            control: PathBuf::from("nvidia-cuda-mps-control"),
            root: PathBuf::from(DEFAULT_MPS_ROOT),
            health_interval_seconds: 5,
        }
    }
}

/// The GPUs' health: the driver's events watched, what they do not carry polled.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthSettings {
    /// Whether the agent watches the GPUs' health at all.
    pub enabled: bool,
    /// Seconds between polls of what no event carries (a GPU lost, pending row remaps and
    /// page retirements, the recovery action) and the clean checks, 1 to 60.
    #[serde(deserialize_with = "poll_seconds")]
    pub poll_seconds: u64,
}

impl Default for HealthSettings {
    fn default() -> Self {
        Self { enabled: true, poll_seconds: 1 }
    }
}

fn poll_seconds<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    whole_number(d, 1, 60, "seconds from 1 to 60")
        .map_err(|e| serde::de::Error::custom(format!("poll_seconds: {e}")))
}

/// Time-slice intervals.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimesliceSettings {
    /// `nvidia-smi` (a bare name is looked up on `PATH`).
    pub nvidia_smi: PathBuf,
}

impl Default for TimesliceSettings {
    fn default() -> Self {
        Self { nvidia_smi: PathBuf::from("nvidia-smi") }
    }
}

/// How applies run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApplySettings {
    /// Most GPUs reconfigured at once; 0 for all.
    #[serde(deserialize_with = "gpu_count")]
    pub max_parallel_gpus: usize,
}

/// `pre_apply` / `post_apply` commands, run through `/bin/sh -c` around every apply that
/// changes the GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HookSettings {
    /// Before the first change; a failure aborts the apply.
    pub pre_apply: Vec<String>,
    /// After the apply, also when it failed.
    pub post_apply: Vec<String>,
    /// Time limit of one command in seconds (1 to 86400).
    #[serde(deserialize_with = "hook_timeout")]
    pub timeout_seconds: u64,
}

impl Default for HookSettings {
    fn default() -> Self {
        Self { pre_apply: Vec::new(), post_apply: Vec::new(), timeout_seconds: 300 }
    }
}

/// What the agent may change on the GPUs. On a shared host you do not own, set all three
/// to false: the agent then observes, plans and refuses any plan that would change MIG or
/// set a time-slice interval, and leaves compute modes and intervals alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuPolicy {
    /// MIG mode and MIG instances.
    pub manage_mig: bool,
    /// Compute modes.
    pub manage_compute_mode: bool,
    /// Time-slice intervals (`nvidia-smi compute-policy --set-timeslice`).
    pub manage_timeslice: bool,
}

impl Default for GpuPolicy {
    fn default() -> Self {
        Self { manage_mig: true, manage_compute_mode: true, manage_timeslice: true }
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            profiles_dir: PathBuf::from(DEFAULT_PROFILES_DIR),
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            boot_profile: None,
            host_root: PathBuf::from("/"),
            gpu: GpuPolicy::default(),
            apply: ApplySettings::default(),
            hooks: HookSettings::default(),
            mps: MpsSettings::default(),
            timeslice: TimesliceSettings::default(),
            cdi: CdiSettings::default(),
            device_plugin: DevicePluginSettings::default(),
            labels: LabelsSettings::default(),
            slurm: SlurmSettings::default(),
            metrics: MetricsSettings::default(),
            bench: BenchSettings::default(),
            health: HealthSettings::default(),
            written: Written::default(),
        }
    }
}

/// A whole number from `min` to `max`, refused in our words as "VALUE is not a number of
/// `what`" (the TOML library's would be `invalid value: integer -1, expected u64`, or "as
/// i128").
fn whole_number<'de, D: Deserializer<'de>>(
    d: D,
    min: u64,
    max: u64,
    what: &str,
) -> Result<u64, D::Error> {
    let value = i128::deserialize(d)?;
    u64::try_from(value)
        .ok()
        .filter(|v| (min..=max).contains(v))
        .ok_or_else(|| serde::de::Error::custom(format!("{value} is not a number of {what}")))
}

/// A number of GPUs from 0 (all) to 4096.
fn gpu_count<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let count = whole_number(d, 0, 4096, "GPUs from 0 (all) to 4096")?;
    // At most 4096: fits any usize.
    Ok(count as usize)
}

fn health_interval<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    whole_number(d, 1, 3600, "seconds from 1 to 3600")
}

fn client_series_max<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let max = whole_number(d, 1, 4096, "label sets from 1 to 4096")
        .map_err(|e| serde::de::Error::custom(format!("client_series_max: {e}")))?;
    // At most 4096: fits any usize.
    Ok(max as usize)
}

fn client_refresh<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    whole_number(d, 1, 300, "seconds from 1 to 300")
        .map_err(|e| serde::de::Error::custom(format!("client_refresh_seconds: {e}")))
}

fn bench_total<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    whole_number(d, 1, 604_800, "seconds from 1 to 604800 (a week)")
        .map_err(|e| serde::de::Error::custom(format!("max_total_seconds: {e}")))
}

fn hook_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    whole_number(d, 1, 86_400, "seconds from 1 to 86400")
}

/// Where the servers and tools of the last configuration that read are: enough to
/// observe the node correctly while a later `agent.toml` does not read (hands-off), which
/// would otherwise look for MPS servers in the default place and show running ones as
/// missing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Whereabouts {
    /// `[mps] control`.
    pub mps_control: PathBuf,
    /// `[mps] root`.
    pub mps_root: PathBuf,
    /// `[timeslice] nvidia_smi`.
    pub nvidia_smi: PathBuf,
    /// `[metrics]`.
    pub metrics_enabled: bool,
    /// `[metrics] listen`.
    pub metrics_listen: std::net::SocketAddr,
}

impl AgentConfig {
    /// Where this configuration puts the servers and tools.
    pub fn whereabouts(&self) -> Whereabouts {
        Whereabouts {
            mps_control: self.mps.control.clone(),
            mps_root: self.mps.root.clone(),
            nvidia_smi: self.timeslice.nvidia_smi.clone(),
            metrics_enabled: self.metrics.enabled,
            metrics_listen: self.metrics.listen,
        }
    }

    /// This configuration with the servers and tools where `w` says.
    pub fn with_whereabouts(mut self, w: Whereabouts) -> Self {
        self.mps.control = w.mps_control;
        self.mps.root = w.mps_root;
        self.timeslice.nvidia_smi = w.nvidia_smi;
        self.metrics.enabled = w.metrics_enabled;
        self.metrics.listen = w.metrics_listen;
        self
    }

    /// Remembers this configuration's whereabouts in `state_dir`.
    pub fn remember_whereabouts(&self, state_dir: &Path) -> std::io::Result<()> {
        let path = state_dir.join(WHEREABOUTS_FILE);
        crate::sys::files::write_json(&path, &self.whereabouts(), crate::sys::files::PRIVATE)
    }

    /// The whereabouts remembered in `state_dir` (a directory the agent may trust), if any:
    /// only from a file the agent may trust (it names programs the agent runs), made
    /// private if it was not.
    pub fn remembered_whereabouts(state_dir: &Path) -> Option<Whereabouts> {
        let path = state_dir.join(WHEREABOUTS_FILE);
        if let Err(e) = crate::sys::files::make_private(&path) {
            tracing::warn!("{}: {e}", path.display());
        }
        match crate::sys::files::read_json(&path) {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!("not read: {e}");
                None
            }
        }
    }

    /// Parses configuration text; errors name `origin:line:column`.
    pub fn parse(text: &str, origin: &str) -> Result<Self, String> {
        let mut config: Self = toml::from_str(text).map_err(|e| {
            let (line, column) = crate::profile::line_column(text, e.span().map_or(0, |s| s.start));
            format!("{origin}:{line}:{column}: {}", e.message().trim().replace('\n', " "))
        })?;
        config.written = Written::found_in(text);
        config.check_views().map_err(|why| format!("{origin}: {why}"))?;
        Ok(config)
    }

    /// Moves the views' places that `moved` picks into `state_dir` (`cdi`,
    /// `device-plugin.yaml`, `features.d/gpushare`, `slurm/gres.conf`): a simulated
    /// agent's unless the file writes them, an agent without root's where they are the
    /// defaults.
    pub fn views_in_state_dir(&mut self, state_dir: &Path, moved: impl Fn(&ViewPlace) -> bool) {
        let defaults = AgentConfig::default();
        let written = self.written;
        let places = [
            (written.cdi_dir, &mut self.cdi.dir, defaults.cdi.dir, "cdi"),
            (
                written.device_plugin_path,
                &mut self.device_plugin.path,
                defaults.device_plugin.path,
                "device-plugin.yaml",
            ),
            (
                written.labels_path,
                &mut self.labels.path,
                defaults.labels.path,
                "features.d/gpushare",
            ),
            (
                written.slurm_gres_conf,
                &mut self.slurm.gres_conf,
                defaults.slurm.gres_conf,
                "slurm/gres.conf",
            ),
            (
                written.slurm_slurmd_env,
                &mut self.slurm.slurmd_env,
                defaults.slurm.slurmd_env,
                "slurm/slurmd.env",
            ),
        ];
        for (written, path, default, in_state_dir) in places {
            if moved(&ViewPlace { written, at_default: *path == default }) {
                *path = state_dir.join(in_state_dir);
            }
        }
    }

    /// The views' places are absolute (a relative one would be the agent's working
    /// directory's), and each file is its own: two views writing one file would each
    /// overwrite the other, and a YAML file in the CDI directory would be read as a spec.
    fn check_views(&self) -> Result<(), String> {
        let files = [
            ("[device_plugin] path", &self.device_plugin.path),
            ("[labels] path", &self.labels.path),
            ("[slurm] gres_conf", &self.slurm.gres_conf),
            ("[slurm] slurmd_env", &self.slurm.slurmd_env),
        ];
        self.slurm.check_node()?;
        let dirs = [("[cdi] dir", &self.cdi.dir), ("[slurm] bin_dir", &self.slurm.bin_dir)];
        for (key, path) in files.iter().copied().chain(dirs) {
            if !path.is_absolute() {
                return Err(format!("{key}: {} is not an absolute path", path.display()));
            }
        }
        for (i, (key, path)) in files.iter().enumerate() {
            if let Some((other, _)) = files[..i].iter().find(|(_, p)| p == path) {
                return Err(format!(
                    "{other} and {key} name the same file ({}): each view needs its own",
                    path.display()
                ));
            }
            if path.parent() == Some(self.cdi.dir.as_path()) {
                return Err(format!(
                    "{key}: {} is in the CDI directory ([cdi] dir), whose files container \
                     runtimes read as CDI specs",
                    path.display()
                ));
            }
        }
        Ok(())
    }

    /// Reads `path`, a regular file of at most 1 MiB (a FIFO or a device would block or
    /// never end); a missing file gives the defaults.
    pub fn load(path: &Path) -> Result<Self, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let failed = |why: String| format!("{}: {why}", path.display());
        let file = match std::fs::File::options()
            .read(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(failed(e.to_string())),
        };
        let meta = file.metadata().map_err(|e| failed(e.to_string()))?;
        // `--config /dev/null`: no configuration, the defaults, as in any tool.
        let dev_null = {
            use std::os::unix::fs::{FileTypeExt, MetadataExt};
            meta.file_type().is_char_device() && meta.rdev() == nix::sys::stat::makedev(1, 3)
        };
        if dev_null {
            return Ok(Self::default());
        }
        if !meta.is_file() {
            return Err(failed("not a regular file".into()));
        }
        if meta.len() > CONFIG_MAX_BYTES {
            return Err(failed(format!("{} bytes; at most 1 MiB", meta.len())));
        }
        let mut text = String::new();
        file.take(CONFIG_MAX_BYTES)
            .read_to_string(&mut text)
            .map_err(|e| failed(format!("not readable as UTF-8 text: {e}")))?;
        Self::parse(&text, &path.display().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        assert_eq!(AgentConfig::parse("", "a.toml").unwrap(), AgentConfig::default());
        assert_eq!(AgentConfig::default().host_root, Path::new("/"));
        let c = AgentConfig::parse("state_dir = \"/tmp/s\"\n[gpu]\nmanage_mig = false\n", "a.toml")
            .unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/tmp/s"));
        assert_eq!(
            c.gpu,
            GpuPolicy { manage_mig: false, manage_compute_mode: true, manage_timeslice: true }
        );
    }

    #[test]
    fn errors_name_the_place() {
        let e = AgentConfig::parse("[gpu]\nmanage_mig = \"no\"\n", "agent.toml").unwrap_err();
        assert!(e.starts_with("agent.toml:2:14: "), "{e}");
        let e = AgentConfig::parse("[gpu]\nmanage_mgi = false\n", "agent.toml").unwrap_err();
        assert!(e.starts_with("agent.toml:2:1: unknown field `manage_mgi`"), "{e}");
    }

    #[test]
    fn numbers_out_of_their_range_are_refused_in_our_words() {
        let e = AgentConfig::parse("[hooks]\ntimeout_seconds = 18446744073709551615\n", "a.toml")
            .unwrap_err();
        assert_eq!(
            e,
            "a.toml:2:19: 18446744073709551615 is not a number of seconds from 1 to 86400"
        );
        let e = AgentConfig::parse("[mps]\nhealth_interval_seconds = -1\n", "a.toml").unwrap_err();
        assert_eq!(e, "a.toml:2:27: -1 is not a number of seconds from 1 to 3600");
        let e = AgentConfig::parse("[apply]\nmax_parallel_gpus = -1\n", "a.toml").unwrap_err();
        assert_eq!(e, "a.toml:2:21: -1 is not a number of GPUs from 0 (all) to 4096");
        let c = AgentConfig::parse("[hooks]\ntimeout_seconds = 60\n", "a.toml").unwrap();
        assert_eq!(c.hooks.timeout_seconds, 60);
    }

    #[test]
    fn the_client_series_settings_are_read_within_their_bounds() {
        let defaults = AgentConfig::default().metrics;
        assert_eq!((defaults.client_series_max, defaults.client_refresh_seconds), (256, 5));
        let c = AgentConfig::parse(
            "[metrics]\nclient_series_max = 6\nclient_refresh_seconds = 1\n",
            "a.toml",
        )
        .unwrap();
        assert_eq!((c.metrics.client_series_max, c.metrics.client_refresh_seconds), (6, 1));
        let c = AgentConfig::parse(
            "[metrics]\nclient_series_max = 4096\nclient_refresh_seconds = 300\n",
            "a.toml",
        )
        .unwrap();
        assert_eq!((c.metrics.client_series_max, c.metrics.client_refresh_seconds), (4096, 300));
        for (text, error) in [
            (
                "client_series_max = 0",
                "a.toml:2:21: client_series_max: 0 is not a number of label sets from 1 to 4096",
            ),
            (
                "client_series_max = 4097",
                "a.toml:2:21: client_series_max: 4097 is not a number of label sets from 1 to 4096",
            ),
            (
                "client_series_max = -1",
                "a.toml:2:21: client_series_max: -1 is not a number of label sets from 1 to 4096",
            ),
            (
                "client_refresh_seconds = 0",
                "a.toml:2:26: client_refresh_seconds: 0 is not a number of seconds from 1 to 300",
            ),
            (
                "client_refresh_seconds = 301",
                "a.toml:2:26: client_refresh_seconds: 301 is not a number of seconds from 1 to 300",
            ),
        ] {
            let e = AgentConfig::parse(&format!("[metrics]\n{text}\n"), "a.toml").unwrap_err();
            assert_eq!(e, error, "{text}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        // Not a number: the key is named by its place, in one line.
        let e = AgentConfig::parse("[metrics]\nclient_refresh_seconds = \"5s\"\n", "a.toml")
            .unwrap_err();
        assert!(e.starts_with("a.toml:2:26: client_refresh_seconds: "), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }

    #[test]
    fn the_views_places_are_absolute_and_their_own() {
        let parse = |text: &str| AgentConfig::parse(text, "a.toml");
        let e = parse("[labels]\npath = \"features.d/gpushare\"\n").unwrap_err();
        assert_eq!(e, "a.toml: [labels] path: features.d/gpushare is not an absolute path");
        let e = parse("[device_plugin]\npath = \"/x/f\"\n[labels]\npath = \"/x/f\"\n").unwrap_err();
        assert_eq!(
            e,
            "a.toml: [device_plugin] path and [labels] path name the same file (/x/f): each view \
             needs its own"
        );
        let e = parse("[slurm]\ngres_conf = \"/var/run/cdi/gres.conf\"\n").unwrap_err();
        assert!(e.starts_with("a.toml: [slurm] gres_conf: /var/run/cdi/gres.conf is in the CDI"));
        assert!(parse("[labels]\npath = \"/srv/nfd/gpushare\"\n").is_ok());
    }

    #[test]
    fn a_benchs_bound_is_read_within_its_range() {
        assert_eq!(AgentConfig::default().bench.max_total_seconds, 4 * 3600);
        let c = AgentConfig::parse("[bench]\nmax_total_seconds = 600\n", "a.toml").unwrap();
        assert_eq!(c.bench.max_total_seconds, 600);
        for (value, column) in [("0", 21), ("604801", 21), ("-5", 21)] {
            let e =
                AgentConfig::parse(&format!("[bench]\nmax_total_seconds = {value}\n"), "a.toml")
                    .unwrap_err();
            assert_eq!(
                e,
                format!(
                    "a.toml:2:{column}: max_total_seconds: {value} is not a number of seconds from 1 to 604800 (a week)"
                )
            );
        }
    }

    #[test]
    fn only_a_regular_file_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("agent.toml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = AgentConfig::load(&fifo).unwrap_err();
        assert!(e.ends_with("agent.toml: not a regular file"), "{e}");
        let e = AgentConfig::load(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e, "/dev/zero: not a regular file");
        for empty in ["none.toml", "/dev/null"] {
            assert_eq!(AgentConfig::load(&dir.path().join(empty)).unwrap(), AgentConfig::default());
        }
    }

    #[test]
    fn whereabouts_are_remembered_and_applied() {
        let dir = tempfile::tempdir().unwrap();
        let mut good = AgentConfig::default();
        good.mps.root = "/srv/mps".into();
        good.metrics.listen = std::net::SocketAddr::from(([127, 0, 0, 1], 9999));
        good.remember_whereabouts(dir.path()).unwrap();
        let w = AgentConfig::remembered_whereabouts(dir.path()).unwrap();
        let restored = AgentConfig::default().with_whereabouts(w);
        assert_eq!(restored.mps.root, PathBuf::from("/srv/mps"));
        assert_eq!(restored.metrics.listen.port(), 9999);
    }

    #[test]
    fn the_shipped_file_parses() {
        let text = include_str!("../../etc/gpushare/agent.toml");
        let shipped = AgentConfig::parse(text, "etc/gpushare/agent.toml").unwrap();
        // It writes the packaged places: a simulated agent pointed at it takes them.
        let places = Written {
            state_dir: true,
            mps_root: true,
            cdi_dir: false,
            metrics_listen: true,
            ..Written::default()
        };
        assert_eq!(shipped.written, places);
        assert_eq!(AgentConfig { written: Written::default(), ..shipped }, AgentConfig::default());
    }

    #[test]
    fn the_places_a_file_writes_are_known_whatever_their_value() {
        assert_eq!(AgentConfig::parse("", "a.toml").unwrap().written, Written::default());
        let c = AgentConfig::parse(
            "state_dir = \"/var/lib/gpushare\"\n[mps]\nroot = \"/run/gpushare/mps\"\n\
             [cdi]\ndir = \"/var/run/cdi\"\n[metrics]\nlisten = \"127.0.0.1:9847\"\n",
            "a.toml",
        )
        .unwrap();
        let all = Written {
            state_dir: true,
            mps_root: true,
            cdi_dir: true,
            metrics_listen: true,
            ..Written::default()
        };
        assert_eq!(c.written, all);
        // Other keys of those tables are not the places.
        let c = AgentConfig::parse(
            "[mps]\nhealth_interval_seconds = 1\n[metrics]\nenabled = true\n[cdi]\nenabled = false\n",
            "a.toml",
        )
        .unwrap();
        assert_eq!(c.written, Written::default());
    }
}
