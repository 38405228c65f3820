//! `agent.toml`: where the agent keeps its files and what it may change on the GPUs.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Default configuration file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/gpushare/agent.toml";
/// Default profile directory.
pub const DEFAULT_PROFILES_DIR: &str = "/etc/gpushare/profiles.d";
/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/gpushare";

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
}

/// Prometheus metrics.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSettings {
    /// Whether to serve them.
    pub enabled: bool,
    /// Where (`127.0.0.1:9847`: dcgm-exporter has 9400, nvidia_gpu_exporter 9835).
    pub listen: std::net::SocketAddr,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        Self { enabled: true, listen: std::net::SocketAddr::from(([127, 0, 0, 1], 9847)) }
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
    /// Seconds between health checks of the servers.
    pub health_interval_seconds: u64,
}

impl Default for MpsSettings {
    fn default() -> Self {
        Self {
            control: PathBuf::from("nvidia-cuda-mps-control"),
            root: PathBuf::from("/run/gpushare/mps"),
            health_interval_seconds: 5,
        }
    }
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
    /// Time limit of one command in seconds.
    pub timeout_seconds: u64,
}

impl Default for HookSettings {
    fn default() -> Self {
        Self { pre_apply: Vec::new(), post_apply: Vec::new(), timeout_seconds: 300 }
    }
}

/// What the agent may change on the GPUs. On a shared host you do not own, set both to
/// false: the agent then observes, plans and refuses any plan that would change MIG, and
/// leaves compute modes alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuPolicy {
    /// MIG mode and MIG instances.
    pub manage_mig: bool,
    /// Compute modes.
    pub manage_compute_mode: bool,
}

impl Default for GpuPolicy {
    fn default() -> Self {
        Self { manage_mig: true, manage_compute_mode: true }
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            profiles_dir: PathBuf::from(DEFAULT_PROFILES_DIR),
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            boot_profile: None,
            gpu: GpuPolicy::default(),
            apply: ApplySettings::default(),
            hooks: HookSettings::default(),
            mps: MpsSettings::default(),
            timeslice: TimesliceSettings::default(),
            metrics: MetricsSettings::default(),
        }
    }
}

impl AgentConfig {
    /// Parses configuration text; errors name `origin:line:column`.
    pub fn parse(text: &str, origin: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| {
            let (line, column) = crate::profile::line_column(text, e.span().map_or(0, |s| s.start));
            format!("{origin}:{line}:{column}: {}", e.message().trim().replace('\n', " "))
        })
    }

    /// Reads `path`; a missing file gives the defaults.
    pub fn load(path: &Path) -> Result<Self, String> {
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(&text, &path.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        assert_eq!(AgentConfig::parse("", "a.toml").unwrap(), AgentConfig::default());
        let c = AgentConfig::parse("state_dir = \"/tmp/s\"\n[gpu]\nmanage_mig = false\n", "a.toml")
            .unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/tmp/s"));
        assert_eq!(c.gpu, GpuPolicy { manage_mig: false, manage_compute_mode: true });
    }

    #[test]
    fn errors_name_the_place() {
        let e = AgentConfig::parse("[gpu]\nmanage_mig = \"no\"\n", "agent.toml").unwrap_err();
        assert!(e.starts_with("agent.toml:2:14: "), "{e}");
        let e = AgentConfig::parse("[gpu]\nmanage_mgi = false\n", "agent.toml").unwrap_err();
        assert!(e.starts_with("agent.toml:2:1: unknown field `manage_mgi`"), "{e}");
    }

    #[test]
    fn the_shipped_file_parses() {
        let text = include_str!("../../etc/gpushare/agent.toml");
        assert_eq!(
            AgentConfig::parse(text, "etc/gpushare/agent.toml").unwrap(),
            AgentConfig::default()
        );
    }
}
