//! The node labels as a view ([`super::View`]): a features file for NFD's local feature
//! source (`features.d`, plain `key=value` lines), rendered from the GPUs as they are and
//! what the agent knows besides (the active profile, how the last apply went). Owns the
//! label names (`gpushare.io/…`, DESIGN.md "Kubernetes (issue 40)") and NFD's rules for
//! them: a name of at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at both ends,
//! under a prefix outside `kubernetes.io`; a value the same, or empty. Never a label of
//! NVIDIA's (`nvidia.com/mps.capable` starts NVIDIA's MPS daemon set).

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::kept::Kept;
use super::shape::{self, GpuShape, Mps, Shared};
use super::{ApplyState, Intent, Observation, View};
use crate::sys::place::Place;

/// The labels' prefix.
pub const PREFIX: &str = "gpushare.io/";

/// The most characters of a label's name (after the prefix) and of its value.
const MOST: usize = 63;

/// Whether `text` is a label name or a non-empty value as Kubernetes takes them.
pub fn valid(text: &str) -> bool {
    let ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    !text.is_empty()
        && text.len() <= MOST
        && ends(text.chars().next())
        && ends(text.chars().last())
        && text.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// `text` as a label value: other characters as `-`, cut to 63, trimmed to alphanumeric
/// ends; `None` when nothing is left.
fn value_of(text: &str) -> Option<String> {
    let mapped: String = text
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '-' })
        .take(MOST)
        .collect();
    let trimmed = mapped.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    valid(trimmed).then(|| trimmed.to_string())
}

/// A MIG device kind in a label name: `+` becomes `.` (`1g.24gb+gfx` → `1g.24gb.gfx`), as
/// NVIDIA's device plugin names its resources.
fn kind_name(kind: &str) -> String {
    kind.replace('+', ".")
}

/// The labels' lines for `gpus` and `intent`, in order.
pub fn lines(gpus: &[GpuShape], intent: &Intent) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut put = |name: String, value: String| {
        if valid(&name) && (value.is_empty() || valid(&value)) {
            out.push((format!("{PREFIX}{name}"), value));
        } else {
            tracing::warn!("label {PREFIX}{name}={value} left out: not a valid label");
        }
    };
    if let Some(profile) = intent.profile.as_deref().and_then(value_of) {
        put("profile".into(), profile);
    }
    let state = match &intent.state {
        ApplyState::None => None,
        ApplyState::Pending => Some("pending"),
        ApplyState::Success => Some("success"),
        ApplyState::Failed(_) => Some("failed"),
    };
    if let Some(state) = state {
        put("state".into(), state.into());
    }
    for gpu in gpus {
        let g = format!("gpu-{}", gpu.index);
        put(format!("{g}.sharing"), gpu.sharing().into());
        match (&gpu.mig, &gpu.whole) {
            (Some(devices), _) => {
                // Per kind, in the order first seen: the count, and MPS where it serves.
                let mut kinds: BTreeMap<&str, Vec<Option<Mps>>> = BTreeMap::new();
                for d in devices {
                    kinds.entry(&d.kind).or_default().push(d.mps);
                }
                for (kind, served) in kinds {
                    let k = format!("{g}.mig.{}", kind_name(kind));
                    put(k.clone(), served.len().to_string());
                    let servers: Vec<Mps> = served.iter().flatten().copied().collect();
                    if servers.is_empty() {
                        continue;
                    }
                    put(format!("{k}.mps.servers"), servers.len().to_string());
                    if servers.iter().all(|m| *m == servers[0]) {
                        mps_lines(&mut put, &k, &servers[0]);
                    }
                }
            }
            (None, Shared::Mps(m)) => mps_lines(&mut put, &g, m),
            (None, Shared::TimeSliced { interval, replicas }) => {
                put(format!("{g}.time-slicing.interval"), (*interval).into());
                if let Some(r) = replicas {
                    put(format!("{g}.time-slicing.replicas"), r.to_string());
                }
            }
            (None, Shared::Exclusive) => {}
        }
    }
    out
}

/// The labels of an MPS server's shares under `at` (`gpu-1`, `gpu-0.mig.1g.10gb`).
fn mps_lines(put: &mut impl FnMut(String, String), at: &str, m: &Mps) {
    put(format!("{at}.mps.replicas"), m.replicas.to_string());
    put(format!("{at}.mps.thread-percentage"), m.thread_percentage.to_string());
    if let Some(bytes) = m.memory_limit_bytes {
        put(format!("{at}.mps.memory-limit-mib"), (bytes >> 20).to_string());
    }
}

/// The features file's text.
pub fn text(gpus: &[GpuShape], intent: &Intent) -> String {
    let mut out = String::from(
        "# Node labels for NFD's local feature source, written by gpushare-agent from the\n\
         # GPUs as they are after every change; do not edit.\n",
    );
    for (key, value) in lines(gpus, intent) {
        out.push_str(&format!("{key}={value}\n"));
    }
    out
}

/// The view: its file.
pub struct LabelsView {
    file: Kept,
}

impl LabelsView {
    /// The view writing at `path` (kept when `enabled`).
    pub fn new(path: PathBuf, enabled: bool) -> Self {
        let file = Kept::new(Place {
            words: format!("labels file {}", path.display()),
            path,
            enabled,
            setting: "[labels] path",
            noun: "the labels",
        });
        LabelsView { file }
    }
}

impl View for LabelsView {
    fn name(&self) -> &'static str {
        "labels"
    }

    fn enabled(&self) -> bool {
        self.file.enabled()
    }

    fn check(&self, _ahead: &super::Ahead<'_>) -> Result<(), String> {
        self.file.check()
    }

    fn render(&self, seen: Result<&Observation<'_>, &str>) {
        let made = seen
            .map(|seen| text(&shape::observed(seen), seen.intent).into_bytes())
            .map_err(str::to_string);
        self.file.keep(self.name(), made);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::views::shape::MigDevice;

    fn device(kind: &str, mps: Option<Mps>) -> MigDevice {
        MigDevice { kind: kind.into(), subdivided: kind.contains("c."), mps }
    }

    #[test]
    fn every_label_is_one_nfd_takes() {
        let m = Mps { replicas: 4, thread_percentage: 25, memory_limit_bytes: Some(20389 << 20) };
        let gpus = [
            GpuShape {
                index: 0,
                uuid: "GPU-0".into(),
                model: "H100".into(),
                mig: Some(vec![
                    device("1g.24gb+gfx", None),
                    device("1c.3g.40gb", Some(m)),
                    device("1c.3g.40gb", Some(m)),
                ]),
                whole: Shared::Exclusive,
            },
            GpuShape {
                index: 1,
                uuid: "GPU-1".into(),
                model: "H100".into(),
                mig: None,
                whole: Shared::Mps(m),
            },
            GpuShape {
                index: 2,
                uuid: "GPU-2".into(),
                model: "H100".into(),
                mig: None,
                whole: Shared::TimeSliced { interval: "long", replicas: Some(3) },
            },
        ];
        let intent = Intent {
            profile: Some("My profile: v2 (test)".into()),
            state: ApplyState::Failed("why".into()),
            ..Intent::default()
        };
        let lines = lines(&gpus, &intent);
        let got: Vec<String> = lines.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(
            got,
            [
                "gpushare.io/profile=My-profile--v2--test",
                "gpushare.io/state=failed",
                "gpushare.io/gpu-0.sharing=mig",
                "gpushare.io/gpu-0.mig.1c.3g.40gb=2",
                "gpushare.io/gpu-0.mig.1c.3g.40gb.mps.servers=2",
                "gpushare.io/gpu-0.mig.1c.3g.40gb.mps.replicas=4",
                "gpushare.io/gpu-0.mig.1c.3g.40gb.mps.thread-percentage=25",
                "gpushare.io/gpu-0.mig.1c.3g.40gb.mps.memory-limit-mib=20389",
                "gpushare.io/gpu-0.mig.1g.24gb.gfx=1",
                "gpushare.io/gpu-1.sharing=mps",
                "gpushare.io/gpu-1.mps.replicas=4",
                "gpushare.io/gpu-1.mps.thread-percentage=25",
                "gpushare.io/gpu-1.mps.memory-limit-mib=20389",
                "gpushare.io/gpu-2.sharing=time-slicing",
                "gpushare.io/gpu-2.time-slicing.interval=long",
                "gpushare.io/gpu-2.time-slicing.replicas=3",
            ]
        );
        for (key, value) in &lines {
            let name = key.strip_prefix(PREFIX).unwrap();
            assert!(valid(name) && valid(value), "{key}={value}");
        }
    }

    #[test]
    fn a_name_nfd_would_refuse_is_never_written() {
        assert!(valid("gpu-0.sharing") && valid("a") && valid("1g.10gb"));
        for bad in ["", "-a", "a-", "a b", "a/b", "é", &"a".repeat(64)] {
            assert!(!valid(bad), "{bad}");
        }
        assert_eq!(value_of("---"), None);
        assert_eq!(value_of(&"x".repeat(80)).unwrap().len(), 63);
        // No profile, no state: no label for them.
        let lines = lines(&[], &Intent::default());
        assert!(lines.is_empty(), "{lines:?}");
    }
}
