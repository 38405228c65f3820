//! Slurm's GRES of this node as a view ([`super::View`]): a node-local `gres.conf`,
//! rendered from the GPUs as they are. Owns how gpushare's shares read as Slurm's
//! generic resources (DESIGN.md "Slurm (issue 41)"): a whole GPU is `Name=gpu
//! Type=<model> File=/dev/nvidiaN`; each MIG device `Name=gpu Type=<profile>` with its
//! `MultipleFiles` (the GPU's node and the instance's capability nodes, found as the CDI
//! spec finds them); an MPS server on a whole GPU `Name=mps Count=100` on that GPU's file
//! (Slurm shares out the percentage); a time-sliced GPU's replicas `Name=shard`. The file
//! also says, as comments, the `GresTypes=` and the node's `Gres=` slurm.conf needs for
//! them (slurm.conf is the controller's, not the node's).

use std::path::{Path, PathBuf};

use super::kept::Kept;
use super::{Observation, View};
use crate::node::{GpuState, NodeState};
use crate::sys::place::Place;

/// One GRES line and what it counts.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Line {
    /// `gpu`, `mps` or `shard`.
    name: &'static str,
    /// The `Type=`, for `gpu`.
    kind: Option<String>,
    /// `Count=`: 1 for a GPU, 100 for MPS, the replicas for shards.
    count: u32,
    /// The device files (`File=` for one, `MultipleFiles=` for several).
    files: Vec<String>,
}

impl Line {
    fn text(&self) -> String {
        let mut out = format!("Name={}", self.name);
        if let Some(kind) = &self.kind {
            out.push_str(&format!(" Type={kind}"));
        }
        if self.name != "gpu" {
            out.push_str(&format!(" Count={}", self.count));
        }
        match self.files.as_slice() {
            [one] => out.push_str(&format!(" File={one}")),
            many => out.push_str(&format!(" MultipleFiles={}", many.join(","))),
        }
        out
    }
}

/// A GRES type name: the characters Slurm's names take (`+` of a MIG profile as `.`, as
/// NVIDIA's device plugin names its resources), lower case.
fn type_name(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            c if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') => {
                c.to_ascii_lowercase()
            }
            _ => '.',
        })
        .collect()
}

/// The device files of a GPU and of its MIG devices, under the host's root.
pub trait Files {
    /// `/dev/nvidia<minor>` of GPU `gpu`; with `mig` its GPU and compute instance's
    /// capability nodes after it.
    fn files(&self, gpu: u32, mig: Option<(u32, u32)>) -> Result<Vec<String>, String>;
}

/// The files as the observation finds them (the GPUs' minor numbers, the host's root).
struct Seen<'a>(&'a Observation<'a>);

impl Files for Seen<'_> {
    fn files(&self, gpu: u32, mig: Option<(u32, u32)>) -> Result<Vec<String>, String> {
        let nodes = self.0.device_nodes(gpu, mig)?;
        // The GPU's own node and the MIG device's capability nodes: nvidiactl and uvm
        // (after the GPU's node) are every GPU's, not a GRES's.
        let own = nodes
            .iter()
            .take(1)
            .chain(nodes.iter().skip(1).filter(|n| n.path.starts_with("/dev/nvidia-caps/")));
        Ok(own.map(|n| n.host_path.display().to_string()).collect())
    }
}

/// The GRES lines of `gpu`, and what is left out (one line each).
fn lines_of(
    gpu: &GpuState,
    node: &NodeState,
    replicas: &super::shape::Replicas,
    files: &dyn Files,
) -> Result<(Vec<Line>, Vec<String>), String> {
    let at = |why: String| format!("GPU {}: {why}", gpu.index);
    let served = |uuid: &str| node.mps.iter().any(|s| s.uuid == uuid && s.pid.is_some());
    let mut lines = Vec::new();
    let mut left_out = Vec::new();
    if gpu.mig_enabled {
        for gi in &gpu.instances {
            for ci in &gi.compute_instances {
                let (kind, _) = super::shape::mig_kind(gpu, gi, ci);
                let files = files.files(gpu.index, Some((gi.id, ci.id))).map_err(at)?;
                lines.push(Line { name: "gpu", kind: Some(type_name(&kind)), count: 1, files });
                if served(&ci.uuid) {
                    left_out.push(format!(
                        "GPU {}: the MPS server of MIG device {} ({kind}): Slurm's mps GRES \
                         counts whole GPUs",
                        gpu.index, ci.uuid
                    ));
                }
            }
        }
        return Ok((lines, left_out));
    }
    let file = files.files(gpu.index, None).map_err(at)?;
    let model = type_name(gpu.model_name());
    lines.push(Line { name: "gpu", kind: Some(model), count: 1, files: file.clone() });
    if served(&gpu.uuid) {
        lines.push(Line { name: "mps", kind: None, count: 100, files: file.clone() });
    } else if node.time_sliced(gpu.index).is_some() {
        match replicas.get(&gpu.index).copied().flatten() {
            Some(r) => lines.push(Line { name: "shard", kind: None, count: r, files: file }),
            None => left_out.push(format!(
                "GPU {}: time-sliced without replicas, so no shards (give the profile's \
                 sharing.time-slicing replicas)",
                gpu.index
            )),
        }
    }
    Ok((lines, left_out))
}

/// The node's `Gres=` for `lines`: `gpu:<type>:<n>` per type in order, then
/// `mps:<n>` and `shard:<n>` (their counts summed).
fn node_gres(lines: &[Line]) -> String {
    let mut parts: Vec<(String, u32)> = Vec::new();
    for l in lines {
        let key = match &l.kind {
            Some(kind) => format!("{}:{kind}", l.name),
            None => l.name.to_string(),
        };
        match parts.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += l.count,
            None => parts.push((key, l.count)),
        }
    }
    parts.iter().map(|(k, n)| format!("{k}:{n}")).collect::<Vec<_>>().join(",")
}

/// The gres.conf text for `node` (time-sliced GPUs' `replicas`), the device files from
/// `files`; or why it cannot be made.
pub fn text(
    node: &NodeState,
    replicas: &super::shape::Replicas,
    files: &dyn Files,
) -> Result<String, String> {
    let mut lines = Vec::new();
    let mut left_out = Vec::new();
    for gpu in &node.gpus {
        let (l, o) = lines_of(gpu, node, replicas, files)?;
        lines.extend(l);
        left_out.extend(o);
    }
    let mut types: Vec<&str> = Vec::new();
    for l in &lines {
        if !types.contains(&l.name) {
            types.push(l.name);
        }
    }
    let mut out = String::from(
        "# Slurm gres.conf of this node, written by gpushare-agent from the GPUs as they are\n\
         # after every change; do not edit.\n",
    );
    out.push_str(&format!("# slurm.conf: GresTypes={}\n", types.join(",")));
    out.push_str(&format!("# slurm.conf, this node's NodeName line: Gres={}\n", node_gres(&lines)));
    for why in &left_out {
        out.push_str(&format!("# left out: {why}\n"));
    }
    out.push_str("AutoDetect=off\n");
    for l in &lines {
        out.push_str(&l.text());
        out.push('\n');
    }
    Ok(out)
}

/// The view: its file.
pub struct GresView {
    file: Kept,
}

impl GresView {
    /// The view writing at `path` (kept when `enabled`).
    pub fn new(path: PathBuf, enabled: bool) -> Self {
        let file = Kept::new(Place {
            words: format!("Slurm gres.conf {}", path.display()),
            path,
            enabled,
            setting: "[slurm] gres_conf",
            noun: "the GRES",
        });
        GresView { file }
    }

    /// Why the last render wrote nothing, if it did not.
    pub fn error(&self) -> Option<String> {
        self.file.error()
    }

    /// Where the file goes.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The gres.conf text as `seen` gives it.
    pub fn render_text(seen: &Observation<'_>) -> Result<String, String> {
        text(seen.node, seen.replicas, &Seen(seen))
    }
}

impl View for GresView {
    fn name(&self) -> &'static str {
        "Slurm gres.conf"
    }

    fn enabled(&self) -> bool {
        self.file.enabled()
    }

    fn check(&self, _ahead: &super::Ahead<'_>) -> Result<(), String> {
        self.file.check()
    }

    fn render(&self, seen: Result<&Observation<'_>, &str>) {
        let made = seen.map_err(str::to_string).and_then(|seen| {
            GresView::render_text(seen)
                .map(String::into_bytes)
                .map_err(|why| format!("not rewritten: {why}"))
        });
        self.file.keep(self.name(), made);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;
    use crate::catalog::parse_node_spec;
    use crate::gpu::GpuBackend;
    use crate::gpu::sim::{SimBackend, SimOptions};
    use crate::node::{MpsLimits, MpsServerState, TimeSliceInterval};

    /// Device files named after what they are (`/d/nvidia<gpu>`, `/d/gi<g>ci<c>`).
    struct Named;

    impl Files for Named {
        fn files(&self, gpu: u32, mig: Option<(u32, u32)>) -> Result<Vec<String>, String> {
            let mut files = vec![format!("/d/nvidia{gpu}")];
            if let Some((gi, ci)) = mig {
                files.push(format!("/d/gi{gi}ci{ci}"));
            }
            Ok(files)
        }
    }

    fn node(spec: &str) -> (Arc<SimBackend>, NodeState) {
        let sim = Arc::new(SimBackend::new(&parse_node_spec(spec).unwrap(), SimOptions::default()));
        let state = NodeState::of_gpus(sim.observe().unwrap());
        (sim, state)
    }

    #[test]
    fn whole_gpus_mps_and_shards_read_as_slurms_gres() {
        let (_, mut state) = node("h100-80gb:3");
        let uuid = state.gpus[1].uuid.clone();
        state.mps.push(MpsServerState {
            uuid,
            gpu: 1,
            placement_start: None,
            compute_instance: 0,
            limits: MpsLimits { active_thread_percentage: 25, pinned_memory_limit_bytes: None },
            pid: Some(1),
            restarts: 0,
            clients: vec![],
            clients_read: false,
        });
        state.timeslices.insert(2, TimeSliceInterval::Short);
        let replicas = BTreeMap::from([(2, Some(3))]);
        let text = text(&state, &replicas, &Named).unwrap();
        let body: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            body,
            [
                "AutoDetect=off",
                "Name=gpu Type=h100-80gb-hbm3 File=/d/nvidia0",
                "Name=gpu Type=h100-80gb-hbm3 File=/d/nvidia1",
                "Name=mps Count=100 File=/d/nvidia1",
                "Name=gpu Type=h100-80gb-hbm3 File=/d/nvidia2",
                "Name=shard Count=3 File=/d/nvidia2",
            ]
        );
        assert!(text.contains("# slurm.conf: GresTypes=gpu,mps,shard\n"), "{text}");
        assert!(text.contains("Gres=gpu:h100-80gb-hbm3:3,mps:100,shard:3\n"), "{text}");
        // Time-sliced with no replicas known: no shards, and the file says why.
        let text = super::text(&state, &BTreeMap::new(), &Named).unwrap();
        assert!(!text.contains("Name=shard") && text.contains("# left out: GPU 2"), "{text}");
    }

    #[test]
    fn mig_devices_are_typed_by_profile_with_their_capability_files() {
        let (sim, _) = node("h100-80gb:1");
        let store = crate::profile::ProfileStore::built_in();
        let profile = store.get("all-balanced").unwrap();
        let observed = NodeState::of_gpus(sim.observe().unwrap());
        let plan = crate::plan::plan(&observed, &profile.profile, &Default::default()).unwrap();
        let backend: Arc<dyn GpuBackend> = sim.clone();
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let executor = crate::apply::Executor::for_tests(backend);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(executor.execute(&plan, &tx, Arc::new(crate::apply::NoLog))).unwrap();
        let state = NodeState::of_gpus(sim.observe().unwrap());
        let text = text(&state, &BTreeMap::new(), &Named).unwrap();
        let gpu: Vec<&str> = text.lines().filter(|l| l.starts_with("Name=gpu")).collect();
        assert_eq!(gpu.len(), 4, "{text}");
        assert!(gpu.iter().all(|l| l.contains(" MultipleFiles=/d/nvidia0,/d/gi")), "{text}");
        assert!(!text.contains("Type=h100"), "a MIG GPU is no gpu GRES of its own: {text}");
        assert!(text.contains("Gres=gpu:"), "{text}");
        for kind in ["1g.10gb:2", "2g.20gb:1", "3g.40gb:1"] {
            assert!(text.contains(&format!("gpu:{kind}")), "{kind}: {text}");
        }
    }

    #[test]
    fn type_names_take_only_slurms_characters() {
        assert_eq!(type_name("1g.24gb+gfx"), "1g.24gb.gfx");
        assert_eq!(type_name("H100 80GB HBM3"), "h100.80gb.hbm3");
    }
}
