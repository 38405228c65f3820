//! Slurm's GRES of this node as a view ([`super::View`]): a node-local `gres.conf`,
//! rendered from the GPUs as they are. Owns how gpushare's shares read as Slurm's
//! generic resources (DESIGN.md "Slurm (issue 41)"): a whole GPU is `Name=gpu
//! Type=<model> File=/dev/nvidiaN`; each MIG device `Name=gpu Type=<profile>` with its
//! `MultipleFiles` (the GPU's node and the instance's capability nodes, found as the CDI
//! spec finds them); an MPS server on a whole GPU `Name=mps Count=100` on that GPU's file
//! (Slurm shares out the percentage); a time-sliced GPU's replicas `Name=shard`. The file
//! also says, as comments, the `GresTypes=` and the node's `Gres=` slurm.conf needs for
//! them (slurm.conf is the controller's, not the node's), and a second file, slurmd's
//! environment (`GPUSHARE_SLURMD_GRES=`), gives a dynamic node's slurmd the same `Gres=`
//! (packaging/slurm/slurmd-gpushare.conf).

use std::path::PathBuf;

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
    /// For a `gpu` line, the device a job gets (`GPU-…` or `MIG-…`) and the pipe directory
    /// of its MPS server, if one serves it: what the TaskProlog hands the job.
    device: Option<(String, Option<String>)>,
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

/// The host as gres.conf names it: device files, MPS pipe directories.
pub trait Files {
    /// `/dev/nvidia<minor>` of GPU `gpu`; with `mig` its GPU and compute instance's
    /// capability nodes after it.
    fn files(&self, gpu: u32, mig: Option<(u32, u32)>) -> Result<Vec<String>, String>;
    /// The pipe directory of the MPS server of `uuid`.
    fn pipe_dir(&self, uuid: &str) -> String;
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

    fn pipe_dir(&self, uuid: &str) -> String {
        self.0.access.sharing.mps.pipe_dir(uuid).display().to_string()
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
                let device = Some((ci.uuid.clone(), None));
                let f = files.files(gpu.index, Some((gi.id, ci.id))).map_err(at)?;
                let typed = Some(type_name(&kind));
                lines.push(Line { name: "gpu", kind: typed, count: 1, files: f, device });
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
    let pipe = served(&gpu.uuid).then(|| files.pipe_dir(&gpu.uuid));
    let device = Some((gpu.uuid.clone(), pipe.clone()));
    lines.push(Line { name: "gpu", kind: Some(model), count: 1, files: file.clone(), device });
    if pipe.is_some() {
        lines.push(Line { name: "mps", kind: None, count: 100, files: file, device: None });
    } else if node.time_sliced(gpu.index).is_some() {
        match replicas.get(&gpu.index).copied().flatten() {
            Some(r) => {
                lines.push(Line { name: "shard", kind: None, count: r, files: file, device: None })
            }
            None => left_out.push(format!(
                "GPU {}: time-sliced without replicas, so no shards (give the profile's \
                 sharing.time-slicing replicas)",
                gpu.index
            )),
        }
    }
    Ok((lines, left_out))
}

/// The number ending `path`'s name (`/dev/nvidia12` → 12), as Slurm numbers a GPU by
/// its first file; none sorts first.
fn trailing_number(path: &str) -> Option<u64> {
    let name = path.rsplit('/').next().unwrap_or(path);
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    name[name.len() - digits..].parse().ok()
}

/// What Slurm 22.05 (Debian 12's) can hand out of one node's GPUs, or why not: MIG devices
/// beside MPS or shards, and MPS beside shards, break its GRES (DESIGN.md "Slurm (issue
/// 41): what Slurm 22.05 takes").
pub fn expressible(gpus: &[super::shape::GpuShape]) -> Result<(), String> {
    use super::shape::Shared;
    let mig = gpus.iter().find(|g| g.mig.as_ref().is_some_and(|d| !d.is_empty()));
    let mps = gpus.iter().find(|g| g.mig.is_none() && matches!(g.whole, Shared::Mps(_)));
    let shard = gpus.iter().find(|g| {
        g.mig.is_none() && matches!(g.whole, Shared::TimeSliced { replicas: Some(_), .. })
    });
    let clash = match (mig, mps, shard) {
        (Some(m), Some(o), _) | (Some(m), None, Some(o)) => Some((m, "MIG devices", o)),
        (None, Some(m), Some(o)) => Some((m, "MPS", o)),
        _ => None,
    };
    match clash {
        Some((a, what, b)) => Err(format!(
            "GPU {} ({what}) and GPU {} ({}) on one node: Slurm 22.05 hands out a node's GPU \
             GRES wrong beside {} (its gres/mps and gres/shard split MultipleFiles= and lose \
             devices)",
            a.index,
            b.index,
            b.sharing(),
            if what == "MPS" { "shards" } else { "MPS or shards" }
        )),
        None => Ok(()),
    }
}

/// How the file gpushare writes begins: a gres.conf that does not is the site's, and is
/// never written over.
const HEADER: &str = "# Slurm gres.conf of this node, written by gpushare-agent";

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

/// The node's `Gres=` a layout gives, as [`text`] would count its lines (without the
/// device files, which only an observation finds): what Slurm should list after an apply.
pub fn node_gres_of(gpus: &[super::shape::GpuShape]) -> String {
    use super::shape::Shared;
    let mut lines = Vec::new();
    let line = |name: &'static str, kind: Option<String>, count: u32| Line {
        name,
        kind,
        count,
        files: Vec::new(),
        device: None,
    };
    for g in gpus {
        if let Some(devices) = &g.mig {
            lines.extend(devices.iter().map(|d| line("gpu", Some(type_name(&d.kind)), 1)));
            continue;
        }
        lines.push(line("gpu", Some(type_name(&g.model)), 1));
        match g.whole {
            Shared::Mps(_) => lines.push(line("mps", None, 100)),
            Shared::TimeSliced { replicas: Some(r), .. } => lines.push(line("shard", None, r)),
            _ => {}
        }
    }
    node_gres(&lines)
}

/// How slurmd's environment file begins.
const ENV_HEADER: &str = "# slurmd's Gres= on this dynamic node, written by gpushare-agent";

/// The variable of slurmd's environment file that holds its `Gres=`.
const ENV_VARIABLE: &str = "GPUSHARE_SLURMD_GRES=";

/// slurmd's environment file giving it the node's `Gres=` `gres`.
fn env_text(gres: &str) -> String {
    format!(
        "{ENV_HEADER}\n# (packaging/slurm/slurmd-gpushare.conf); do not edit.\n{ENV_VARIABLE}{gres}\n"
    )
}

/// The gres.conf text for `node` (time-sliced GPUs' `replicas`), the device files from
/// `files`; or why it cannot be made.
pub fn text(
    node: &NodeState,
    replicas: &super::shape::Replicas,
    files: &dyn Files,
) -> Result<String, String> {
    document(node, replicas, files).map(|(text, _)| text)
}

/// [`text`], with the node's `Gres=` it says (for slurmd's environment).
fn document(
    node: &NodeState,
    replicas: &super::shape::Replicas,
    files: &dyn Files,
) -> Result<(String, String), String> {
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
    let gres = node_gres(&lines);
    let mut out =
        format!("{HEADER} from the GPUs as they are\n# after every change; do not edit.\n");
    out.push_str(&format!("# slurm.conf: GresTypes={}\n", types.join(",")));
    out.push_str(&format!("# slurm.conf, this node's NodeName line: Gres={gres}\n"));
    for why in &left_out {
        out.push_str(&format!("# left out: {why}\n"));
    }
    // Slurm hands a job its GPUs' indices in its own order (by the number ending each
    // gpu line's first file, then this file's order), never a UUID: the TaskProlog
    // (packaging/slurm/gpushare-task-prolog) turns them into these devices.
    let mut gpus: Vec<&Line> = lines.iter().filter(|l| l.device.is_some()).collect();
    gpus.sort_by_key(|l| trailing_number(l.files.first().map_or("", String::as_str)));
    for (index, l) in gpus.iter().enumerate() {
        if let Some((uuid, pipe)) = &l.device {
            let pipe = pipe.as_deref().unwrap_or("-");
            out.push_str(&format!("# gpushare index {index} {uuid} {pipe}\n"));
        }
    }
    out.push_str("AutoDetect=off\n");
    for l in &lines {
        out.push_str(&l.text());
        out.push('\n');
    }
    Ok((out, gres))
}

/// The view: its files.
pub struct GresView {
    file: Kept,
    /// slurmd's environment, its `Gres=` (see [`env_text`]).
    env: Kept,
}

impl GresView {
    /// The view writing gres.conf at `path` and slurmd's environment at `env` (kept when
    /// `enabled`).
    pub fn new(path: PathBuf, env: PathBuf, enabled: bool) -> Self {
        let file = Kept::new(Place {
            words: format!("Slurm gres.conf {}", path.display()),
            path,
            enabled,
            setting: "[slurm] gres_conf",
            noun: "the GRES",
        });
        let env = Kept::new(Place {
            words: format!("slurmd's environment {}", env.display()),
            path: env,
            enabled,
            setting: "[slurm] slurmd_env",
            noun: "slurmd's GRES",
        });
        GresView { file, env }
    }

    /// Whether the file there, if any, is one gpushare wrote: a site's hand-written
    /// gres.conf is never written over (turning `[slurm]` on with the default path would
    /// otherwise lose it).
    fn ours(&self) -> Result<(), String> {
        match self.file.read() {
            Some(bytes) if !bytes.starts_with(HEADER.as_bytes()) => Err(format!(
                "Slurm gres.conf {}: there already, and not written by gpushare-agent; move it \
                 away (gpushare writes the node's GPU lines) or set [slurm] gres_conf in \
                 agent.toml",
                self.file.path().display()
            )),
            _ => Ok(()),
        }
    }

    /// The GRES records of the gres.conf kept now (its lines but comments): what slurmd
    /// reads of it.
    pub fn records(&self) -> Option<String> {
        let text = self.file.read()?;
        let text = String::from_utf8_lossy(&text);
        Some(text.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n"))
    }

    /// The `Gres=` slurmd's environment file gives it now, read as the agent reads its own
    /// records; or why it gives none.
    pub fn slurmd_gres(&self) -> Result<String, String> {
        let at = format!("[slurm] slurmd_env: {}", self.env.path().display());
        let text = self.env.read().ok_or_else(|| format!("{at}: not there"))?;
        let text = String::from_utf8_lossy(&text);
        let gres = text.lines().find_map(|l| l.strip_prefix(ENV_VARIABLE));
        gres.map(str::to_string).ok_or_else(|| format!("{at}: no {ENV_VARIABLE}"))
    }

    /// The gres.conf text as `seen` gives it.
    pub fn render_text(seen: &Observation<'_>) -> Result<String, String> {
        text(seen.node, &seen.intent.replicas, &Seen(seen))
    }
}

impl View for GresView {
    fn name(&self) -> &'static str {
        "Slurm gres.conf"
    }

    fn enabled(&self) -> bool {
        self.file.enabled()
    }

    fn check(&self, ahead: &super::Ahead<'_>) -> Result<(), String> {
        self.file.check()?;
        self.env.check()?;
        self.ours()?;
        self.check_expressed(ahead)
    }

    fn check_expressed(&self, ahead: &super::Ahead<'_>) -> Result<(), String> {
        expressible(&super::shape::planned(ahead)).map_err(|why| {
            format!(
                "{why}: refused, as agent.toml keeps this node's gres.conf ([slurm] enabled = true)"
            )
        })
    }

    fn render(&self, seen: Result<&Observation<'_>, &str>) {
        let made = seen.map_err(str::to_string).and_then(|seen| {
            self.ours()?;
            expressible(&super::shape::observed(seen))
                .map_err(|why| format!("not rewritten (Slurm could not hand it out): {why}"))?;
            document(seen.node, &seen.intent.replicas, &Seen(seen))
                .map_err(|why| format!("not rewritten: {why}"))
        });
        let (made, gres) = match made {
            Ok((text, gres)) => (Ok(text.into_bytes()), Some(gres)),
            Err(why) => (Err(why), None),
        };
        if let Some(gres) = gres {
            self.env.keep("slurmd's environment", Ok(env_text(&gres).into_bytes()));
        }
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

        fn pipe_dir(&self, uuid: &str) -> String {
            format!("/mps/{uuid}/pipe")
        }
    }

    /// A running MPS server of whole GPU `gpu` (`uuid`) at 25 % threads.
    fn server_on(uuid: &str, gpu: u32) -> MpsServerState {
        MpsServerState {
            uuid: uuid.to_string(),
            gpu,
            placement_start: None,
            compute_instance: 0,
            limits: MpsLimits { active_thread_percentage: 25, pinned_memory_limit_bytes: None },
            pid: Some(1),
            restarts: 0,
            clients: vec![],
            clients_read: false,
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
        state.mps.push(server_on(&uuid, 1));
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
    fn the_index_map_follows_slurms_order_of_gpus() {
        let (_, mut state) = node("h100-80gb:2");
        let uuid = state.gpus[1].uuid.clone();
        state.mps.push(server_on(&uuid, 1));
        let text = text(&state, &BTreeMap::new(), &Named).unwrap();
        let map: Vec<&str> = text.lines().filter(|l| l.starts_with("# gpushare index")).collect();
        assert_eq!(
            map,
            [
                format!("# gpushare index 0 {} -", state.gpus[0].uuid),
                format!("# gpushare index 1 {uuid} /mps/{uuid}/pipe"),
            ]
        );
        assert_eq!(trailing_number("/x/dev/nvidia12"), Some(12));
        assert_eq!(trailing_number("/x/dev/nvidiactl"), None);
    }

    #[test]
    fn slurm_22_05_takes_mig_mps_and_shards_only_apart() {
        use crate::engine::views::shape::{GpuShape, MigDevice, Mps, Shared};
        let gpu = |index: u32, mig: bool, whole: Shared| GpuShape {
            index,
            uuid: format!("GPU-{index}"),
            model: "H100".into(),
            mig: mig
                .then(|| vec![MigDevice { kind: "1g.10gb".into(), subdivided: false, mps: None }]),
            whole,
        };
        let mps = Shared::Mps(Mps { replicas: 4, thread_percentage: 25, memory_limit_bytes: None });
        let sliced = Shared::TimeSliced { interval: "short", replicas: Some(4) };
        assert!(
            expressible(&[gpu(0, true, Shared::Exclusive), gpu(1, false, Shared::Exclusive)])
                .is_ok()
        );
        assert!(expressible(&[gpu(0, false, mps.clone()), gpu(1, false, mps.clone())]).is_ok());
        assert!(
            expressible(&[gpu(0, false, sliced.clone()), gpu(1, false, Shared::Exclusive)]).is_ok()
        );
        let e = expressible(&[gpu(0, true, Shared::Exclusive), gpu(1, false, mps.clone())])
            .unwrap_err();
        assert!(e.starts_with("GPU 0 (MIG devices) and GPU 1 (mps) on one node"), "{e}");
        let e = expressible(&[gpu(0, true, Shared::Exclusive), gpu(1, false, sliced.clone())])
            .unwrap_err();
        assert!(e.starts_with("GPU 0 (MIG devices) and GPU 1 (time-slicing)"), "{e}");
        let e = expressible(&[gpu(0, false, mps), gpu(1, false, sliced)]).unwrap_err();
        assert!(e.starts_with("GPU 0 (MPS) and GPU 1 (time-slicing)"), "{e}");
    }

    #[test]
    fn a_sites_own_gres_conf_is_never_written_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gres.conf");
        std::fs::write(&path, "Name=gpu File=/dev/nvidia0\n").unwrap();
        let view = GresView::new(path.clone(), path.with_extension("env"), true);
        let e = view.ours().unwrap_err();
        assert!(
            e.contains("not written by gpushare-agent") && e.contains("[slurm] gres_conf"),
            "{e}"
        );
        std::fs::write(&path, format!("{HEADER} from the GPUs\nAutoDetect=off\n")).unwrap();
        assert!(view.ours().is_ok());
        std::fs::remove_file(&path).unwrap();
        assert!(view.ours().is_ok(), "no file: gpushare's to write");
    }

    #[test]
    fn type_names_take_only_slurms_characters() {
        assert_eq!(type_name("1g.24gb+gfx"), "1g.24gb.gfx");
        assert_eq!(type_name("H100 80GB HBM3"), "h100.80gb.hbm3");
    }
}
