//! The sharing-profile format: parsing, validation, built-in profiles and the profile
//! store.
//!
//! A profile is a TOML document with a list of `[[gpu]]` rules. Each rule selects GPUs
//! and says what they become: MIG off or a MIG layout, and how the whole GPU or each
//! instance is shared. A GPU takes the first rule that selects it; GPUs no rule selects
//! are left as they are. Everything that can be checked without knowing the node is
//! checked here, with errors naming `file:line:column`; what depends on the GPUs
//! (profile names per model, whether a layout fits) is the planner's.

pub mod export;
pub mod migparted;
mod parse;
pub(crate) mod store;
pub(crate) mod suggest;

pub use parse::{line_column, parse_pci_device_id, parse_profile};
pub use store::{Missing, ProfileSource, ProfileStore, StoredProfile};

use std::fmt;

use gpushare_proto::PROFILE_MAX_BYTES;

use crate::catalog::{GpuModel, MigProfile};
use crate::node::TimeSliceInterval;

/// Most `[[gpu]]` rules a profile may have, and entries a mig-parted config may have.
pub const MAX_RULES: usize = 256;
/// Most MIG instances one rule may ask for, all kinds together: no GPU holds more than 7.
pub const MAX_MIG_INSTANCES: u64 = 8;
/// Most items in one list: GPU indices (`select`, `devices`), PCI device ids.
pub const MAX_LIST_ITEMS: usize = 256;
/// Most configs a mig-parted file may have (NVIDIA's own has 81).
pub const MAX_MIG_PARTED_CONFIGS: usize = 1024;

/// Parses a profile document: NVIDIA mig-parted's `config.yaml` (when `origin` ends in
/// `.yaml`/`.yml` or the text has a top-level `mig-configs:`), with `config` naming the
/// config to use, or else a gpushare profile (TOML), whose name defaults to the file stem
/// made a valid name (`<stdin>` → `stdin`).
pub fn parse_document(text: &str, origin: &str, config: &str) -> Result<Profile, ProfileError> {
    check_size(text, origin)?;
    let yaml = origin.ends_with(".yaml")
        || origin.ends_with(".yml")
        || text.lines().any(|l| l.starts_with("mig-configs:"));
    if yaml {
        return migparted::parse_mig_parted(text, origin, config);
    }
    if !config.is_empty() {
        return Err(ProfileError {
            location: Location { origin: origin.to_string(), line: 1, column: 1 },
            message: format!(
                "a config name ({config:?}) is for mig-parted files; this is a gpushare profile"
            ),
        });
    }
    let stem = std::path::Path::new(origin).file_stem().and_then(|s| s.to_str());
    parse_profile(text, origin, Some(stem.unwrap_or_default()))
}

/// The name most like `typed`, when one is close enough to be a typo of it (as clap
/// suggests subcommands, by Jaro similarity; above 0.8 here, as the names share prefixes):
/// a mistyped mig-parted config or profile. MIG profile names go by what the profile is
/// ([`suggest::mig_profile`]).
pub(crate) fn closest<'a>(typed: &str, names: &[&'a str]) -> Option<&'a str> {
    names
        .iter()
        .map(|n| (strsim::jaro(typed, n), *n))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, n)| n)
}

/// Refuses a text over [`PROFILE_MAX_BYTES`], before anything reads it.
pub(crate) fn check_size(text: &str, origin: &str) -> Result<(), ProfileError> {
    if text.len() <= PROFILE_MAX_BYTES {
        return Ok(());
    }
    Err(ProfileError {
        location: Location { origin: origin.to_string(), line: 1, column: 1 },
        message: gpushare_proto::profile_too_large(),
    })
}

/// A parsed, validated profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Name used with `apply`.
    pub name: String,
    /// One line for people.
    pub description: String,
    /// Rules in file order; a GPU takes the first rule that selects it.
    pub rules: Vec<GpuRule>,
}

impl Profile {
    /// The first rule that selects `gpu`.
    pub fn rule_for(&self, gpu: &GpuRef<'_>) -> Option<&GpuRule> {
        self.rules.iter().find(|r| r.selects(gpu))
    }

    /// Whether any rule asks for MPS or time-slicing.
    pub fn uses_sharing(&self) -> bool {
        self.rules.iter().any(|r| {
            !r.sharing.is_exclusive() || r.instance_sharing.iter().any(|(_, s)| !s.is_exclusive())
        })
    }
}

/// What selectors look at: one GPU of a node of `count` GPUs.
#[derive(Debug, Clone, Copy)]
pub struct GpuRef<'a> {
    /// NVML index.
    pub index: u32,
    /// GPUs on the node.
    pub count: u32,
    /// `GPU-…`.
    pub uuid: &'a str,
    /// PCI device id (`0x20B010DE`).
    pub pci_device_id: u32,
    /// Catalog model, when known.
    pub model: Option<&'a GpuModel>,
}

/// One `[[gpu]]` rule.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuRule {
    /// Which GPUs the rule applies to.
    pub select: Selector,
    /// PCI device ids the GPU must have (mig-parted's `device-filter`); empty for any.
    pub device_filter: Vec<u32>,
    /// Where the rule starts, for messages (`profiles.d/x.toml:7:1`).
    pub location: Location,
    /// MIG off, or MIG on with these instances.
    pub mig: MigLayout,
    /// Sharing of the whole GPU (MIG off) or of every instance (MIG on).
    pub sharing: Sharing,
    /// Per-instance-kind sharing that overrides `sharing` under MIG.
    pub instance_sharing: Vec<(MigKey, Sharing)>,
}

impl GpuRule {
    /// Whether the rule applies to `gpu`.
    pub fn selects(&self, gpu: &GpuRef<'_>) -> bool {
        self.select.matches(gpu)
            && (self.device_filter.is_empty() || self.device_filter.contains(&gpu.pci_device_id))
    }

    /// The sharing of an instance of `profile` used whole (`compute` `None`), or of each
    /// compute instance of `compute` slices in a subdivided one, per `instance_sharing`
    /// then `sharing`.
    pub fn sharing_for(&self, profile: &MigProfile, compute: Option<u8>) -> &Sharing {
        self.instance_sharing
            .iter()
            .find(|(key, _)| key.compute_slices() == compute && key.matches(profile))
            .map(|(_, s)| s)
            .unwrap_or(&self.sharing)
    }
}

/// A place in a profile's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// File path, or `built-in:<name>`.
    pub origin: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.origin, self.line, self.column)
    }
}

/// Which GPUs a rule applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// Every GPU.
    All,
    /// Indices below half the GPU count (rounded down): GPUs 0-3 of 8, none of 1.
    FirstHalf,
    /// The other indices: GPUs 4-7 of 8, GPU 0 of 1.
    SecondHalf,
    /// Listed indices and inclusive ranges.
    Indices(Vec<(u32, u32)>),
    /// GPUs of one catalog model (its key).
    Model(&'static str),
    /// One GPU by UUID (`GPU-…`).
    Uuid(String),
}

impl Selector {
    /// Whether the selector picks this GPU.
    pub fn matches(&self, gpu: &GpuRef<'_>) -> bool {
        match self {
            Selector::All => true,
            Selector::FirstHalf => gpu.index < gpu.count / 2,
            Selector::SecondHalf => gpu.index >= gpu.count / 2,
            Selector::Indices(ranges) => {
                ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&gpu.index))
            }
            Selector::Model(key) => gpu.model.is_some_and(|m| m.key == *key),
            Selector::Uuid(u) => u.eq_ignore_ascii_case(gpu.uuid),
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selector::All => f.write_str("all"),
            Selector::FirstHalf => f.write_str("first-half"),
            Selector::SecondHalf => f.write_str("second-half"),
            Selector::Indices(ranges) => {
                let parts: Vec<String> = ranges
                    .iter()
                    .map(|&(lo, hi)| if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") })
                    .collect();
                f.write_str(&parts.join(","))
            }
            Selector::Model(key) => f.write_str(key),
            Selector::Uuid(u) => f.write_str(u),
        }
    }
}

/// The MIG part of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigLayout {
    /// MIG mode off: the GPU is used whole.
    Disabled,
    /// MIG mode on with these instances (possibly none).
    Enabled(Vec<(MigKey, u32)>),
    /// MIG mode on in NVIDIA's balanced layout for whatever GPU it is (`mig =
    /// "balanced"`), from the GPU's own table: see [`balanced_layout`].
    Balanced,
}

impl MigLayout {
    /// Whether the layout turns MIG on.
    pub fn is_enabled(&self) -> bool {
        !matches!(self, MigLayout::Disabled)
    }

    /// The instances this layout asks of `model`: its own list, or the balanced layout.
    pub fn requests(&self, model: &GpuModel) -> Vec<(MigKey, u32)> {
        match self {
            MigLayout::Disabled => Vec::new(),
            MigLayout::Enabled(requests) => requests.clone(),
            MigLayout::Balanced => balanced_layout(model),
        }
    }
}

/// NVIDIA's balanced MIG layout, generalized from mig-parted's `all-balanced` entries
/// (1g ×2, 2g ×1, 3g ×1 on every 7-slice GPU; 1g ×2, 2g ×1 on the A30 and the RTX PRO
/// 6000): two of the smallest plain profile, then one of each next size while the
/// compute slices last. A 2-slice GPU gets 1g ×2.
pub fn balanced_layout(model: &GpuModel) -> Vec<(MigKey, u32)> {
    let mut sizes: Vec<u8> =
        model.mig_profiles.iter().filter(|p| p.is_plain()).map(|p| p.compute_slices).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut layout = Vec::new();
    let mut used = 0u32;
    for (i, &size) in sizes.iter().enumerate() {
        let count = if i == 0 { 2 } else { 1 };
        let needs = u32::from(size) * count;
        if used + needs > u32::from(model.compute_slices) {
            break;
        }
        used += needs;
        layout.push((MigKey::Slices(size), count));
    }
    layout
}

/// How a profile names a MIG instance kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigKey {
    /// By compute slices (`3g`), resolved per model.
    Slices(u8),
    /// By exact profile name (`3g.20gb`, `1g.5gb+me`).
    Name(String),
    /// Compute instances of `compute` slices inside GPU instances of `instance` (`1c.3g`,
    /// mig-parted's `1c.3g.40gb`): the count is of compute instances. `instance` is a
    /// [`MigKey::Slices`] or [`MigKey::Name`], and `compute` is fewer slices than it has
    /// (`3c.3g` is `3g`: see [`MigKey::compute`]).
    Compute {
        /// Compute slices of each compute instance.
        compute: u8,
        /// The GPU instances' kind.
        instance: Box<MigKey>,
    },
}

impl MigKey {
    /// Compute instances of `compute` slices in GPU instances of `instance`; the GPU
    /// instance itself when `compute` is all of its slices (`3c.3g` is `3g`).
    pub fn compute(compute: u8, instance: MigKey) -> MigKey {
        if instance.instance_slices() == Some(compute) {
            return instance;
        }
        MigKey::Compute { compute, instance: Box::new(instance) }
    }

    /// The GPU instances' kind: the key itself, or a subdivision's GPU instances.
    pub fn instance(&self) -> &MigKey {
        match self {
            MigKey::Compute { instance, .. } => instance,
            other => other,
        }
    }

    /// The compute slices of each compute instance of a subdivision; `None` for GPU
    /// instances used whole.
    pub fn compute_slices(&self) -> Option<u8> {
        match self {
            MigKey::Compute { compute, .. } => Some(*compute),
            _ => None,
        }
    }

    /// The compute slices of the GPU instances the key names, as written (`3` of `3g`
    /// and of `3g.40gb`).
    fn instance_slices(&self) -> Option<u8> {
        match self.instance() {
            MigKey::Slices(n) => Some(*n),
            MigKey::Name(name) => name.split_once('g').and_then(|(n, _)| n.parse().ok()),
            MigKey::Compute { .. } => None,
        }
    }

    /// The GPU-instance profile this key stands for on `model` (of a subdivision: its
    /// GPU instances').
    pub fn resolve(&self, model: &'static GpuModel) -> Option<&'static MigProfile> {
        match self {
            MigKey::Slices(n) => model.profile_by_compute_slices(*n),
            MigKey::Name(name) => model.profile_by_name(name),
            MigKey::Compute { instance, .. } => instance.resolve(model),
        }
    }

    /// Whether an instance of `profile` is what this key names (of a subdivision: its GPU
    /// instances).
    pub fn matches(&self, profile: &MigProfile) -> bool {
        match self {
            MigKey::Slices(n) => profile.compute_slices == *n && profile.is_plain(),
            MigKey::Name(name) => profile.name == *name,
            MigKey::Compute { instance, .. } => instance.matches(profile),
        }
    }
}

impl fmt::Display for MigKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MigKey::Slices(n) => write!(f, "{n}g"),
            MigKey::Name(name) => f.write_str(name),
            MigKey::Compute { compute, instance } => write!(f, "{compute}c.{instance}"),
        }
    }
}

/// The compute-instance sizes (in compute slices) a GPU instance of `profile` offers on
/// `model`, each with how many of it fit in one such instance, smallest first: those the
/// driver reported for the profile (`MigProfile::compute_profiles`), else the
/// standard sizes (1, 2, 3, 4 and 7 slices) up to the instance's own, where the model has
/// a GPU-instance profile of that many slices, as many as fit at starts aligned to the
/// power of two at or above the size (as NVML places them: in a 3g instance 1c ×3, 2c ×1,
/// 3c ×1; in a 7g instance 1c ×7, 2c ×3, 3c ×2, 4c ×1, 7c ×1). The simulated driver
/// (`sim/nvml/src/rules.rs`, `ci_profiles` and `ci_placements`) follows the same rule.
pub fn compute_instance_sizes(model: &GpuModel, profile: &MigProfile) -> Vec<(u8, u8)> {
    // What the driver said, where it was asked (a GPU instance of the profile existed).
    if !profile.compute_profiles.is_empty() {
        return profile.compute_profiles.iter().map(|&[s, n]| (s, n)).collect();
    }
    let gi_slices = profile.compute_slices;
    let mut sizes = Vec::new();
    for c in [1u8, 2, 3, 4, 7] {
        if c > gi_slices || model.profile_by_compute_slices(c).is_none() {
            continue;
        }
        let align = c.next_power_of_two();
        let fits = (0..gi_slices).step_by(usize::from(align)).filter(|&s| s + c <= gi_slices);
        let count = u8::try_from(fits.count()).unwrap_or(u8::MAX).min(gi_slices / c);
        if count > 0 {
            sizes.push((c, count));
        }
    }
    if !sizes.iter().any(|&(c, _)| c == gi_slices) {
        // The full-size compute instance, whatever its size.
        sizes.push((gi_slices, 1));
    }
    sizes
}

/// How a GPU or MIG instance is shared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sharing {
    /// No sharing set up: the driver's default behaviour for whoever opens it.
    Exclusive,
    /// Time-slicing with a scheduler interval.
    TimeSlicing {
        /// Scheduler time slice.
        interval: TimeSliceInterval,
        /// Clients the GPU or instance is meant to serve.
        replicas: Option<u32>,
    },
    /// An MPS server with limits.
    Mps(MpsSettings),
}

impl Sharing {
    /// Whether no sharing is asked for.
    pub fn is_exclusive(&self) -> bool {
        matches!(self, Sharing::Exclusive)
    }

    /// `exclusive`, `time-slicing` or `mps`.
    pub fn strategy(&self) -> &'static str {
        match self {
            Sharing::Exclusive => "exclusive",
            Sharing::TimeSlicing { .. } => "time-slicing",
            Sharing::Mps(_) => "mps",
        }
    }
}

/// MPS settings as written; limits not given derive from `replicas` when carried out.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MpsSettings {
    /// Clients the GPU or instance is meant to serve.
    pub replicas: Option<u32>,
    /// Default active thread percentage of clients (1-100).
    pub active_thread_percentage: Option<u32>,
    /// Default pinned device memory limit of clients, in bytes.
    pub pinned_memory_limit_bytes: Option<u64>,
    /// Most clients the server accepts.
    pub max_clients: Option<u32>,
    /// Whether the control daemon serves every user's clients at once through one server
    /// running as root (`nvidia-cuda-mps-control -d -M`), rather than one user's at a time
    /// (NVIDIA's default): less isolation between users, see DESIGN.md.
    pub multi_user: bool,
}

/// A profile that failed to parse or validate: where, and why, in one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{location}: {message}")]
pub struct ProfileError {
    /// Where.
    pub location: Location,
    /// Why.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn balanced_is_nvidias_layout_on_every_model_and_places() {
        let layout = |key: &str| {
            let model = crate::catalog::simulated_model_by_key(key).unwrap();
            balanced_layout(model).iter().map(|(k, n)| format!("{k}x{n}")).collect::<Vec<_>>()
        };
        assert_eq!(layout("a100-40gb"), ["1gx2", "2gx1", "3gx1"]);
        assert_eq!(layout("h100-80gb"), ["1gx2", "2gx1", "3gx1"]);
        assert_eq!(layout("a30"), ["1gx2", "2gx1"]);
        assert!(layout("l40s").is_empty());
        for model in crate::catalog::simulated_models().iter().filter(|m| m.supports_mig()) {
            let wanted: Vec<&MigProfile> = balanced_layout(model)
                .iter()
                .flat_map(|(k, n)| std::iter::repeat_n(k.resolve(model).unwrap(), *n as usize))
                .collect();
            assert!(wanted.len() >= 2, "{}", model.key);
            crate::plan::placement::solve(model, &wanted, &[])
                .unwrap_or_else(|e| panic!("{}: {e}", model.key));
        }
    }

    /// A profile of `rules` rules, each followed by `pad` empty lines: many lines, and
    /// every rule far into the text.
    fn padded(rules: usize, pad: usize) -> String {
        let mut text = String::from("name = \"big\"\n");
        for _ in 0..rules {
            text.push_str("[[gpu]]\nselect = \"all\"\n");
            text.extend(std::iter::repeat_n('\n', pad));
        }
        text
    }

    fn median_parse_time(text: &str, runs: usize) -> Duration {
        let mut times: Vec<Duration> = (0..runs)
            .map(|_| {
                let start = Instant::now();
                parse_document(text, "big.toml", "").unwrap();
                start.elapsed()
            })
            .collect();
        times.sort();
        times[runs / 2]
    }

    #[test]
    fn the_largest_allowed_profile_parses_fast_and_time_grows_linearly() {
        let pad = PROFILE_MAX_BYTES / MAX_RULES - 30;
        let large = padded(MAX_RULES, pad);
        assert!((PROFILE_MAX_BYTES - 8 * 1024..=PROFILE_MAX_BYTES).contains(&large.len()));
        assert_eq!(parse_document(&large, "big.toml", "").unwrap().rules.len(), MAX_RULES);
        let small = padded(MAX_RULES / 8, pad);
        // Interleaved, so that a load on the machine weighs on both alike.
        let (mut small_time, mut large_time) = (Duration::MAX, Duration::MAX);
        for _ in 0..3 {
            small_time = small_time.min(median_parse_time(&small, 3));
            large_time = large_time.min(median_parse_time(&large, 3));
        }
        // Some 0.5 s unoptimized on a busy machine; the bound leaves room for more load.
        assert!(large_time < Duration::from_secs(5), "{large_time:?}");
        assert!(
            large_time < small_time * 30,
            "8 times the text took {large_time:?}, against {small_time:?}"
        );
    }

    #[test]
    fn oversized_documents_are_refused_before_any_parsing() {
        let mut text = "[[gpu]]\nselect = \"all\"\n".to_string();
        text.extend(std::iter::repeat_n('#', PROFILE_MAX_BYTES - text.len()));
        assert!(parse_document(&text, "x.toml", "").is_ok());
        // One byte more, and even a syntax error is not looked at.
        for (extra, origin, config) in
            [("#", "x.toml", ""), ("[", "x.toml", ""), ("#", "x.yaml", "c"), ("[", "-", "")]
        {
            let e = parse_document(&format!("{text}{extra}"), origin, config).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("{origin}:1:1: larger than 256 KiB, the most a profile may be")
            );
        }
        let yaml = format!(
            "version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: false\n{}",
            "#".repeat(PROFILE_MAX_BYTES)
        );
        let e = migparted::parse_mig_parted(&yaml, "x.yaml", "c").unwrap_err();
        assert_eq!(e.message, "larger than 256 KiB, the most a profile may be");
        let e = parse_profile(&format!("{text}#"), "x.toml", None).unwrap_err();
        assert_eq!(e.message, "larger than 256 KiB, the most a profile may be");
    }

    /// Hostile gpushare profiles: what follows `[[gpu]]` (or the whole text, when it starts
    /// with `!`).
    const HOSTILE_TOML: &[&str] = &[
        "select = 0\nsharing = { mps = {}, time-slicing = {} }",
        "select = 0\nsharing = \"mps\"",
        "select = 0\nsharing = \"time-slicing\"",
        "select = 0\nsharing = \"mpss\"",
        "select = 0\nsharing = 5",
        "select = 0\nsharing = {}",
        "select = 0\nsharing = []",
        "select = 0\nsharing = [\"mps\"]",
        "select = 0\nsharing = { mps = 5 }",
        "select = 0\nsharing = { mps = \"on\" }",
        "select = 0\nsharing = { exclusive = {} }",
        "select = 0\nsharing = { exclusive = true }",
        "select = 0\nsharing = { mps = {}, exclusive = {} }",
        "select = 0\nsharing = { shared = {} }",
        "select = 0\nsharing = { mps = { replicas = \"four\" } }",
        "select = 0\nsharing = { mps = { replicas = -1 } }",
        "select = 0\nsharing = { mps = { replicas = 99999999999999999999 } }",
        "select = 0\nsharing = { mps = { replicas = 1.5 } }",
        "select = 0\nsharing = { mps = { replicas = true } }",
        "select = 0\nsharing = { mps = { bogus = 1 } }",
        "select = 0\nsharing = { mps = { pinned_memory_limit = true } }",
        "select = 0\nsharing = { mps = { pinned_memory_limit = -5 } }",
        "select = 0\nsharing = { mps = { pinned_memory_limit = 99999999999999999999 } }",
        "select = 0\nsharing = { mps = { max_clients = [] } }",
        "select = 0\nsharing = { time-slicing = { interval = 5 } }",
        "select = 0\nsharing = { time-slicing = { replicas = 1.5 } }",
        "select = 0\nsharing = { time-slicing = { slice = 1 } }",
        "select = 0\nsharing = { time-slicing = [] }",
        "select = 0\nsharing.mps.replicas = 4\nsharing.time-slicing = {}",
        "select = 0\nmig = { \"1g\" = 99999999999999999999 }",
        "select = 0\nmig = { \"1g\" = -99999999999999999999 }",
        "select = 0\nmig = { \"1g\" = 2.0 }",
        "select = 0\nmig = { \"1g\" = \"2\" }",
        "select = 0\nmig = 5",
        "select = 0\nmig = [1]",
        "select = 0\nmig = true",
        "select = 0\nmig = \"enabled\"",
        "select = 99999999999999999999",
        "select = -1",
        "select = true",
        "select = 1.5",
        "select = { a = 1 }",
        "select = [1, \"a\"]",
        "select = []",
        "select = [[1]]",
        "select = 1979-05-27T07:32:00Z",
        "select = 0x10",
        "select = inf",
        "mig = false",
        "select = 0\ninstance_sharing = 5",
        "select = 0\ninstance_sharing = [5]",
        "select = 0\nmig = { \"3g\" = 1 }\ninstance_sharing.\"3g\" = 5",
        "select = 0\nmig = { \"3g\" = 1 }\ninstance_sharing.\"3g\" = \"mps\"",
        "select = 0\nmig = { \"3g\" = 1 }\ninstance_sharing.\"3g\" = { mps = { replicas = \"x\" } }",
        "select = 0\ndevice_filter = 5",
        "select = 0\ndevice_filter = [1]",
        "select = 0\ndevice_filter = { a = 1 }",
        "select = 0\nselect = 1",
        "select = 0\nmigg = false",
        "select = 0\n\"\\u001b[31m\\n\" = false",
        "select = \"\\u001b[31m\\n\"",
        "select = 0\nmig = { \"\\u001b[31m\\n\" = 1 }",
        "select = 0\nsharing = \"\\u001b[31m\\n\"",
        "select = 0\n[gpu.mig]\n\"1g\" = 1\n[gpu.mig]\n\"2g\" = 1",
        "!name = \"a\"\n[gpu]\nselect = 0\n",
        "!name = \"a\"\ngpu = 5\n",
        "!name = \"a\"\ngpu = [1, 2]\n",
        "!name = \"a\"\ngpu = []\n",
        "!name = \"a\"\ngpu = [[]]\n",
        "!name = \"a\"\ngpu = \"all\"\n",
        "!name = 5\n[[gpu]]\nselect = 0\n",
        "!name = [\"a\"]\n[[gpu]]\nselect = 0\n",
        "!name = { a = 1 }\n[[gpu]]\nselect = 0\n",
        "!description = 5\n[[gpu]]\nselect = 0\n",
        "!description = { a = 1 }\n[[gpu]]\nselect = 0\n",
        "!bogus = 1\n[[gpu]]\nselect = 0\n",
        "![bogus]\n",
        "![[bogus]]\n",
        "!name = \"a\"\nname = \"b\"\n",
        "!",
        "!\u{0}",
        "!\u{feff}[[gpu]]\nselect = 0\n",
        "![[gpu]\n",
        "![[gpu]]\nselect = \n",
        "![[gpu]]\nselect = \"unterminated\n",
        "!= 1\n",
        "!a.b = 1\na = 2\n",
        "![[gpu]]\nselect = 0\n[gpu]\n",
        "![[gpu]]\nselect = 0x\n",
        "![[gpu]]\nselect = 1__0\n",
        "![[gpu]]\nselect = nan\n",
        "![[gpu]]\nselect = { a = 1,\n b = 2 }\n",
        "![[gpu]]\nselect = '''\n",
        "![[gpu]]\nselect = 0 0\n",
        "![[gpu]]\nselect = 0\n\u{1b}[31m = 1\n",
    ];

    /// Hostile mig-parted files: entry keys after a `devices: all` entry's first line (or
    /// the whole text, when it starts with `!`).
    const HOSTILE_YAML: &[&str] = &[
        "mig-enabled: \"yes\"",
        "mig-enabled: yes",
        "mig-enabled: \"true\"",
        "mig-enabled: 1",
        "mig-enabled: on",
        "mig-enabled: null",
        "mig-enabled: [true]",
        "mig-enabled: {a: 1}",
        "mig-enabled: false\n      bogus: 1",
        "mig-enabled: true\n      mig-devices: [1]",
        "mig-enabled: true\n      mig-devices: 5",
        "mig-enabled: true\n      mig-devices: {\"1g.5gb\": \"two\"}",
        "mig-enabled: true\n      mig-devices: {\"1g.5gb\": 99999999999999999999}",
        "mig-enabled: true\n      mig-devices: {\"1g.5gb\": 1.5}",
        "mig-enabled: true\n      mig-devices: {\"1g.5gb\": null}",
        "mig-enabled: true\n      mig-devices: {\"1g.5gb\": true}",
        "mig-enabled: true\n      mig-devices: {\"1g.5gb\": [1]}",
        "mig-enabled: true\n      mig-devices: {1: 1}",
        "mig-enabled: true\n      mig-devices: {[a]: 1}",
        "mig-enabled: true\n      mig-devices: {? {a: 1} : 1}",
        "mig-enabled: true\n      mig-devices: {\"1g.5gb\": 1, \"1g.5gb\": 2}",
        "mig-enabled: true\n      mig-devices: {\"1g.\\e[31m\\n\": x}",
        "mig-enabled: false\n      \"\\e[31m\\n\": x",
        "mig-enabled: false\n      device-filter: 5.5",
        "mig-enabled: false\n      device-filter: true",
        "mig-enabled: false\n      device-filter: {a: 1}",
        "mig-enabled: false\n      device-filter: [[1]]",
        "mig-enabled: false\n      device-filter: [1]",
        "mig-enabled: false\n      device-filter: null",
        "mig-enabled: false\n      device-filter: 99999999999999999999",
        "mig-enabled: false\n      devices: all",
        "!version: v1\nmig-configs:\n  c:\n    - devices: 5\n      mig-enabled: false\n",
        "!version: v1\nmig-configs:\n  c:\n    - devices: {a: 1}\n      mig-enabled: false\n",
        "!version: v1\nmig-configs:\n  c:\n    - devices: [a]\n      mig-enabled: false\n",
        "!version: v1\nmig-configs:\n  c:\n    - devices: [1.5]\n      mig-enabled: false\n",
        "!version: v1\nmig-configs:\n  c:\n    - devices: [99999999999999999999]\n      mig-enabled: false\n",
        "!version: v1\nmig-configs:\n  c:\n    - devices: null\n      mig-enabled: false\n",
        "!version: v1\nmig-configs:\n  c:\n    - devices: [[0]]\n      mig-enabled: false\n",
        "!version: v1\nmig-configs:\n  c:\n    - devices: true\n      mig-enabled: false\n",
        "!version: v1\nmig-configs:\n  c:\n    - 5\n",
        "!version: v1\nmig-configs:\n  c:\n    - [devices, all]\n",
        "!version: v1\nmig-configs:\n  c:\n    devices: all\n    mig-enabled: false\n",
        "!version: v1\nmig-configs:\n  c: 5\n",
        "!version: v1\nmig-configs:\n  c: null\n",
        "!version: v1\nmig-configs:\n  [c]: []\n",
        "!version: v1\nmig-configs:\n  5: [{devices: all, mig-enabled: false}]\n",
        "!version: v1\nmig-configs: []\n",
        "!version: v1\nmig-configs: 5\n",
        "!version: v1\nmig-configs:\n",
        "!version: v1\nmig-configs: {}\n",
        "!version: 1\nmig-configs:\n  c: [{devices: all, mig-enabled: false}]\n",
        "!version: [v1]\nmig-configs:\n  c: [{devices: all, mig-enabled: false}]\n",
        "!version: null\nmig-configs:\n  c: [{devices: all, mig-enabled: false}]\n",
        "!version: v1\nbogus: 1\nmig-configs:\n  c: [{devices: all, mig-enabled: false}]\n",
        "!version: v1\nversion: v1\nmig-configs:\n  c: [{devices: all, mig-enabled: false}]\n",
        "!version: v1\nmig-configs:\n  c: [{devices: all, mig-enabled: false}]\n---\nversion: v1\n",
        "!---\n---\n",
        "!",
        "!# only a comment\n",
        "![]\n",
        "!5\n",
        "!\"v1\"\n",
        "!version: v1\nmig-configs:\n  c: [\n",
        "!version: v1\nmig-configs:\n\tc: []\n",
        "!version: v1\nmig-configs: : :\n",
        "!version: v1\nmig-configs:\n  c: *nowhere\n",
        "!version: &v v1\nmig-configs:\n  c: [{devices: all, mig-enabled: *v}]\n",
        "!version: !!binary djE=\nmig-configs:\n  c: [{devices: all, mig-enabled: false}]\n",
        "!version: !custom v1\nmig-configs:\n  c: [{devices: all, mig-enabled: false}]\n",
        "!version: v1\nmig-configs:\n  c: [{devices: all, mig-enabled: false, <<: {a: 1}}]\n",
        "!version: v1\u{0}\n",
        "!version: v1\nmig-configs:\n  c: [{devices: all, mig-enabled: false}]\n  c: []\n",
        "!version: v1\nmig-configs:\n  c: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n",
    ];

    /// Words of serde, toml and YAML libraries and of Rust, not of profiles.
    const LIBRARY_WORDS: &[&str] = &[
        "variant",
        "i128",
        "i64",
        "u64",
        "u32",
        "u8",
        "usize",
        "f64",
        "from_str",
        "newtype",
        "element",
        "sequence",
        "struct",
        "invalid type",
        "invalid value",
        "any valid",
        "deserializ",
        "serde",
        "option",
        "unit",
        "tuple",
        "enum",
        "field",
        "identifier",
        "scalar",
        "raw",
        "budget",
        "duplicatekeypolicy",
        "toml value",
    ];

    #[test]
    fn hostile_documents_fail_in_the_profiles_words_in_one_line_naming_the_place() {
        let yaml_head = "version: v1\nmig-configs:\n  c:\n    - devices: all\n      ";
        let cases = HOSTILE_TOML
            .iter()
            .map(|t| match t.strip_prefix('!') {
                Some(whole) => (whole.to_string(), "h.toml", ""),
                None => (format!("name = \"h\"\n[[gpu]]\n{t}\n"), "h.toml", ""),
            })
            .chain(HOSTILE_YAML.iter().map(|t| match t.strip_prefix('!') {
                Some(whole) => (whole.to_string(), "h.yaml", "c"),
                None => (format!("{yaml_head}{t}\n"), "h.yaml", "c"),
            }));
        // Nested as deep as the parsers allow, and deeper.
        let deep = |n| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let deep_toml =
            [70, 100, 10_000].map(|n| (format!("[[gpu]]\nselect = {}\n", deep(n)), "h.toml", ""));
        let deep_yaml = [6, 12, 10_000]
            .map(|n| (format!("version: v1\nmig-configs:\n  c: {}\n", deep(n)), "h.yaml", "c"));
        let cases = cases.chain(deep_toml).chain(deep_yaml);
        let mut bad = Vec::new();
        for (text, origin, config) in cases {
            // Some are fine (`sharing = "mps"`, a byte-order mark): only messages count.
            let Err(e) = parse_document(&text, origin, config) else { continue };
            let message = e.to_string();
            let lower = message.to_lowercase();
            let words: Vec<&str> = lower
                .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                .filter(|w| *w == "map")
                .chain(LIBRARY_WORDS.iter().copied().filter(|w| lower.contains(w)))
                .collect();
            let place = message
                .strip_prefix(origin)
                .and_then(|m| m.strip_prefix(':'))
                .and_then(|m| m.split_once(": "))
                .is_some_and(|(at, _)| {
                    let mut parts = at.split(':');
                    parts.next().is_some_and(|l| l.parse::<u32>().is_ok_and(|l| l > 0))
                        && parts.next().is_some_and(|c| c.parse::<u32>().is_ok_and(|c| c > 0))
                        && parts.next().is_none()
                });
            println!("{:?}\n    → {message}", text.get(..200).unwrap_or(&text));
            // One line, and nothing a terminal would act on.
            if !words.is_empty() || !place || message.chars().any(char::is_control) {
                let text = text.get(..200).unwrap_or(&text);
                bad.push(format!("{text:?}\n    → {message}\n    ({words:?}, place {place})"));
            }
        }
        assert!(bad.is_empty(), "{} messages:\n{}", bad.len(), bad.join("\n"));
    }

    #[test]
    fn the_library_worded_cases_of_issue_10_speak_the_profiles_words() {
        let rule = |body: &str| format!("name = \"h\"\n[[gpu]]\nselect = 0\n{body}\n");
        let toml = |body: &str| parse_document(&rule(body), "h.toml", "");
        let e = toml("sharing = { mps = {}, time-slicing = {} }").unwrap_err();
        assert_eq!(
            e.to_string(),
            "h.toml:4:11: MPS and time-slicing cannot be mixed on one GPU (MPS needs compute mode \
             EXCLUSIVE_PROCESS, time-slicing DEFAULT)"
        );
        // A strategy's bare name takes its defaults.
        let p = toml("sharing = \"mps\"").unwrap();
        assert_eq!(p.rules[0].sharing, Sharing::Mps(MpsSettings::default()));
        let p = toml("sharing = \"time-slicing\"").unwrap();
        let default = TimeSliceInterval::Default;
        assert_eq!(p.rules[0].sharing, Sharing::TimeSlicing { interval: default, replicas: None });
        let e = toml("mig = { \"1g\" = 99999999999999999999 }").unwrap_err();
        assert_eq!(
            e.to_string(),
            "h.toml:4:7: mig: the count of 1g must be a whole number from 0 to 8, not \
             99999999999999999999"
        );

        let entry = "version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: ";
        let yaml = |rest: &str| parse_document(&format!("{entry}{rest}\n"), "h.yaml", "c");
        let e = yaml("false\n---\nversion: v1").unwrap_err();
        assert_eq!(
            e.to_string(),
            "h.yaml:7:1: a second YAML document starts here: a mig-parted file is one document"
        );
        for (value, found) in [("\"yes\"", "\"yes\""), ("yes", "\"yes\""), ("\"true\"", "\"true\"")]
        {
            let e = yaml(&format!("{value}\n      mig-devices: {{}}")).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("h.yaml:5:20: mig-enabled: expected true or false, found {found}")
            );
        }
        for value in ["true", "True", "TRUE"] {
            let p = yaml(&format!("{value}\n      mig-devices: {{}}")).unwrap();
            assert_eq!(p.rules[0].mig, MigLayout::Enabled(vec![]), "{value}");
        }
    }
}
