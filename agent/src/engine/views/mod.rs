//! Consumer views: the files the agent keeps true to the GPUs, for the programs that
//! hand them out: the CDI spec ([`cdi`]), NVIDIA's device plugin config
//! ([`device_plugin`]), the node labels for NFD ([`labels`]) and Slurm's gres.conf
//! ([`gres`]). Owns the set of views,
//! the one observation they render from, and what they know besides the GPUs
//! ([`Intent`]: the active profile, how the last apply went, the time-slicing replicas it
//! meant). Each view is a [`View`]: it checks its place, and what an apply will make,
//! before the apply's first step ([`Views::check`]), renders from one [`Observation`] of
//! the node, and is written after every transaction by the one transaction path
//! (`engine::transactions`: commit, rollback, a bench's setup and restore, recovery), when
//! an apply begins ([`Views::begin`]) and at start-up ([`Views::refresh`]). The set is
//! built once from the configuration ([`Views::from_config`], by the daemon) and handed to
//! the engine.
//!
//! Adding a view: a module here implementing [`View`], its section in `agent.toml`
//! (`config.rs`), and its line in [`Views::from_config`].

pub mod cdi;
pub mod device_plugin;
pub mod gres;
pub mod kept;
pub mod labels;
pub mod shape;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::apply::{NodeAccess, Reads};
use crate::config::AgentConfig;
use crate::health::Health;
use crate::node::NodeState;
use crate::plan::Plan;

/// How the last apply of a profile went, as the labels say it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ApplyState {
    /// No apply since the agent started.
    #[default]
    None,
    /// One is changing the GPUs now.
    Pending,
    /// The GPUs are as the active profile says: the last apply committed (or failed and
    /// was rolled back: the labels are then as before it, byte for byte).
    Success,
    /// The last apply failed and left the GPUs changed (its rollback failed too): why.
    Failed(String),
}

/// What the views know besides the GPUs.
#[derive(Debug, Clone, Default)]
pub struct Intent {
    /// The active profile (the one last applied successfully).
    pub profile: Option<String>,
    /// How the last apply went.
    pub state: ApplyState,
    /// The state before the apply now pending, which a rollback puts back.
    before: ApplyState,
    /// Why the last apply failed (rolled back or not), until one succeeds: `status`'s
    /// `apply_error`.
    pub error: Option<String>,
    /// The time-slicing replicas the applies meant for each GPU (see
    /// [`crate::plan::GpuTarget::replicas`]).
    pub replicas: shape::Replicas,
}

/// What an apply will make, for the views to judge before its first step.
pub struct Ahead<'a> {
    /// The GPUs as the plan was made against them.
    pub before: &'a NodeState,
    /// The plan.
    pub plan: &'a Plan,
    /// The time-slicing replicas of GPUs the plan leaves alone.
    pub replicas: &'a shape::Replicas,
}

/// The node as every view renders it, observed once per refresh.
pub struct Observation<'a> {
    /// The GPUs and MPS servers, with the limits each server gives its clients now.
    pub node: &'a NodeState,
    /// Each GPU's device minor number (`/dev/nvidia<minor>`), where the driver says it.
    pub minors: &'a HashMap<u32, Option<u32>>,
    /// Where the host keeps what the views name: device nodes under its root, MPS
    /// directories.
    pub access: &'a NodeAccess,
    /// What the views know besides the GPUs.
    pub intent: &'a Intent,
}

impl Observation<'_> {
    /// The device nodes of GPU `gpu` as NVIDIA's toolkit finds them (found through its
    /// minor number, under the host's root), with `mig`'s (GPU instance, compute
    /// instance) capability nodes after them.
    pub fn device_nodes(
        &self,
        gpu: u32,
        mig: Option<(u32, u32)>,
    ) -> Result<Vec<crate::gpu::device_nodes::DeviceNode>, String> {
        use crate::gpu::device_nodes;
        let minor = self
            .minors
            .get(&gpu)
            .copied()
            .flatten()
            .ok_or("the driver did not say its device minor number")?;
        let root = &self.access.host_root;
        let mut nodes = device_nodes::gpu_nodes(root, minor)?;
        if let Some((gi, ci)) = mig {
            nodes.extend(device_nodes::mig_nodes(root, minor, gi, ci)?);
        }
        Ok(nodes)
    }
}

/// A file the agent keeps true to the GPUs.
pub trait View: Send + Sync {
    /// Its name in logs (`CDI spec`).
    fn name(&self) -> &'static str;
    /// Whether it is kept at all (its configuration section may turn it off).
    fn enabled(&self) -> bool;
    /// Whether its place can be written, and what `ahead` makes expressed in it: checked
    /// before an apply's first step, so that a place it cannot go, or a node it cannot
    /// say, refuses the apply rather than leaving the view stale after it. One line naming
    /// the place or the rule, and the setting that moves it.
    fn check(&self, ahead: &Ahead<'_>) -> Result<(), String>;
    /// Whether it can say what `ahead` makes, its place aside (part of [`View::check`],
    /// and all `plan`, `validate` and `apply --dry-run` ask, touching no place): the
    /// consumer's rule it breaks, in one line. Anything, by default.
    fn check_expressed(&self, _ahead: &Ahead<'_>) -> Result<(), String> {
        Ok(())
    }
    /// Whether it says a GPU is time-sliced (the interval is an nvidia-smi run, read for
    /// the views only where one of them says it).
    fn reads_intervals(&self) -> bool {
        true
    }
    /// Whether it follows a bench's setups (the CDI spec: a bench's replicas may be
    /// containers), or waits for the bench's end: the files schedulers read (the device
    /// plugin's config, the labels, gres.conf) do not show a GPU a bench holds for a while
    /// (review of issue 40: a user's bench relabelled the node).
    fn follows_benches(&self) -> bool {
        false
    }
    /// Renders from `seen` and writes the file when it changed; `Err` says why the node
    /// could not be observed. A failure is the view's to log and keep for its report: the
    /// GPUs are as the transaction left them either way (the view follows them).
    fn render(&self, seen: Result<&Observation<'_>, &str>);
}

/// The views of this agent, built once.
pub struct Views {
    /// The CDI spec, also answering `gpushare-ctl cdi`.
    cdi: Arc<cdi::CdiView>,
    /// NVIDIA's device plugin config, also answering `export --format device-plugin`.
    device_plugin: Arc<device_plugin::DevicePluginView>,
    /// The node labels, also written when an apply begins.
    labels: Arc<labels::LabelsView>,
    /// Slurm's gres.conf, also telling what an apply makes of the node's GRES.
    gres: Arc<gres::GresView>,
    /// Every view, the CDI spec first.
    all: Vec<Arc<dyn View>>,
    /// What they know besides the GPUs.
    intent: Mutex<Intent>,
    /// The GPUs' faults: what lies on a faulted GPU or MIG instance is left out of every
    /// view until it clears (issue 42).
    health: Arc<Health>,
}

impl Views {
    /// The views `config` asks for.
    pub fn from_config(config: &AgentConfig) -> Self {
        let cdi = Arc::new(cdi::CdiView::new(crate::cdi::writer::Writer {
            dir: config.cdi.dir.clone(),
            enabled: config.cdi.enabled,
        }));
        let device_plugin = Arc::new(device_plugin::DevicePluginView::new(
            config.device_plugin.path.clone(),
            config.device_plugin.enabled,
            config.mps.root.clone(),
            config.device_plugin.mps_host_shm,
        ));
        let labels =
            Arc::new(labels::LabelsView::new(config.labels.path.clone(), config.labels.enabled));
        let gres = Arc::new(gres::GresView::new(
            config.slurm.gres_conf.clone(),
            config.slurm.slurmd_env.clone(),
            config.slurm.enabled,
        ));
        let all: Vec<Arc<dyn View>> =
            vec![cdi.clone(), device_plugin.clone(), labels.clone(), gres.clone()];
        Views {
            cdi,
            device_plugin,
            labels,
            gres,
            all,
            intent: Mutex::default(),
            health: Arc::default(),
        }
    }

    /// The GPUs' faults the views leave out (the engine's registry).
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// The CDI spec's view.
    pub fn cdi(&self) -> &cdi::CdiView {
        &self.cdi
    }

    /// What the views know besides the GPUs, now.
    pub fn intent(&self) -> Intent {
        self.intent.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Sets the active profile, the journal's (at start-up, and after every transaction).
    pub fn set_profile(&self, profile: Option<String>) {
        self.intent.lock().unwrap_or_else(PoisonError::into_inner).profile = profile;
    }

    /// Whether every view kept can be written and can say what `plan` (made against
    /// `before`) makes (before an apply's first step); the first that cannot, in one line.
    pub fn check(&self, plan: &Plan, before: &NodeState) -> Result<(), String> {
        let replicas = self.intent().replicas;
        let ahead = Ahead { before, plan, replicas: &replicas };
        self.all.iter().filter(|v| v.enabled()).try_for_each(|v| v.check(&ahead))
    }

    /// Whether the views kept can say what `plan` (made against `before`) makes, without
    /// touching their places (`plan`, `validate`, `apply --dry-run`): what an apply of it
    /// would be refused for by [`Views::check`] besides a place.
    pub fn expressible(&self, plan: &Plan, before: &NodeState) -> Result<(), String> {
        let replicas = self.intent().replicas;
        let ahead = Ahead { before, plan, replicas: &replicas };
        self.all.iter().filter(|v| v.enabled()).try_for_each(|v| v.check_expressed(&ahead))
    }

    /// The node's `Gres=` after `plan` (made against `before`), where gres.conf is kept.
    pub fn slurm_gres(&self, plan: &Plan, before: &NodeState) -> Option<String> {
        let replicas = self.intent().replicas;
        let ahead = Ahead { before, plan, replicas: &replicas };
        self.gres.enabled().then(|| gres::node_gres_of(&shape::planned(&ahead)))
    }

    /// The GRES records of the gres.conf kept now, where it is kept (see
    /// [`gres::GresView::records`]).
    pub fn slurm_records(&self) -> Option<String> {
        self.gres.enabled().then(|| self.gres.records()).flatten()
    }

    /// The `Gres=` slurmd's environment file gives it now, where gres.conf is kept (see
    /// [`gres::GresView::slurmd_gres`]).
    pub fn slurmd_gres(&self) -> Result<String, String> {
        self.gres.slurmd_gres()
    }

    /// Learns the time-slicing replicas of the active profile from `plan` (the active
    /// profile planned against the node at start-up).
    pub fn prime(&self, plan: &Plan) {
        let mut intent = self.intent.lock().unwrap_or_else(PoisonError::into_inner);
        intent.replicas = shape::replicas_after(&shape::Replicas::new(), &plan.gpus);
    }

    /// An apply of a profile begins: the labels say so (`pending`) before its first step
    /// (unless a bench runs: see [`View::follows_benches`]).
    pub async fn begin(&self, access: &NodeAccess, during_bench: bool) {
        {
            let mut intent = self.intent.lock().unwrap_or_else(PoisonError::into_inner);
            intent.before = std::mem::replace(&mut intent.state, ApplyState::Pending);
        }
        if self.labels.enabled() && !during_bench {
            self.render(access, &[self.labels.clone() as Arc<dyn View>]).await;
        }
    }

    /// An apply of a profile ended: committed (`Ok` with its plan: its time-slicing
    /// replicas are those the views advertise), or failed, why,
    /// and whether it left the GPUs changed (else the state before it is back). The views
    /// are rendered after it by the transaction path.
    pub fn end(&self, outcome: Result<&Plan, (String, bool)>) {
        let mut intent = self.intent.lock().unwrap_or_else(PoisonError::into_inner);
        let before = std::mem::take(&mut intent.before);
        match outcome {
            Ok(plan) => {
                intent.replicas = shape::replicas_after(&intent.replicas, &plan.gpus);
                intent.state = ApplyState::Success;
                intent.error = None;
            }
            Err((why, left_changed)) => {
                intent.state = if left_changed { ApplyState::Failed(why.clone()) } else { before };
                intent.error = Some(why);
            }
        }
    }

    /// The device plugin config and the labels `node` gives now (whether the views are
    /// kept or not): `gpushare-ctl export --format device-plugin|labels`.
    pub fn texts(&self, node: &NodeState) -> (Result<String, String>, String) {
        let intent = self.intent();
        let gpus: Vec<shape::GpuShape> =
            node.gpus.iter().map(|g| shape::of_gpu(g, node, &intent.replicas)).collect();
        (self.device_plugin.render_text(&gpus), labels::text(&gpus, &intent))
    }

    /// Slurm's gres.conf `node` gives now (kept or not): `export --format slurm`; the
    /// device files are found through `access`.
    pub async fn slurm_text(
        &self,
        access: &NodeAccess,
        node: &NodeState,
    ) -> Result<String, String> {
        let intent = self.intent();
        let minors = minors(access, node).await;
        let seen = Observation { node, minors: &minors, access, intent: &intent };
        gres::GresView::render_text(&seen)
    }

    /// Renders every view kept from one fresh observation of `access`'s node; during a
    /// bench, those that follow benches only.
    pub async fn refresh(&self, access: &NodeAccess, during_bench: bool) {
        let kept: Vec<Arc<dyn View>> = self
            .all
            .iter()
            .filter(|v| v.enabled() && (!during_bench || v.follows_benches()))
            .cloned()
            .collect();
        self.render(access, &kept).await;
    }

    /// Renders `kept` from one fresh observation of `access`'s node.
    async fn render(&self, access: &NodeAccess, kept: &[Arc<dyn View>]) {
        if kept.is_empty() {
            return;
        }
        let intent = self.intent();
        // Intervals cost an nvidia-smi run: read where an apply time-sliced a GPU (as
        // `status` reads them where the active profile time-slices) and a view says so.
        let timeslices = !intent.replicas.is_empty() && kept.iter().any(|v| v.reads_intervals());
        let reads = Reads { timeslices, ..Reads::GPUS_AND_SERVERS };
        // The shares' limits are those the servers give their clients now.
        let observed = match access.observe(reads).await {
            Ok(node) => access.read_live_limits(node, |_| false).await,
            Err(e) => Err(e),
        };
        match observed {
            Ok(node) => {
                let node = healthy_part(node, &self.health);
                let minors = minors(access, &node).await;
                let seen = Observation { node: &node, minors: &minors, access, intent: &intent };
                kept.iter().for_each(|v| v.render(Ok(&seen)));
            }
            Err(e) => {
                let why = format!("observing the node: {e}");
                for v in kept {
                    tracing::error!("{} not rebuilt: {why}", v.name());
                    v.render(Err(&why));
                }
            }
        }
    }
}

/// Each GPU's device minor number (`/dev/nvidia<minor>`), where the driver says it.
async fn minors(access: &NodeAccess, node: &NodeState) -> HashMap<u32, Option<u32>> {
    let mut minors = HashMap::new();
    for g in &node.gpus {
        minors.insert(g.index, access.minor_number(g.index).await);
    }
    minors
}

/// `node` without what lies on a faulted GPU or MIG instance: a GPU with a fault of its
/// own goes whole (its MPS server with it), a faulted instance with the MPS servers that
/// serve it. What the views render: a device that cannot be used is handed to no one.
fn healthy_part(mut node: NodeState, health: &Health) -> NodeState {
    let faults = health.faults();
    if faults.is_empty() {
        return node;
    }
    let whole = |gpu: u32| faults.iter().any(|f| f.gpu == gpu && f.gpu_instance.is_none());
    node.gpus.retain(|g| !whole(g.index));
    // The placement starts of the faulted instances, by GPU.
    let mut starts: Vec<(u32, u8)> = Vec::new();
    for g in &mut node.gpus {
        g.instances.retain(|i| {
            let faulted = faults.iter().any(|f| f.gpu == g.index && f.gpu_instance == Some(i.id));
            if faulted {
                starts.push((g.index, i.placement_start));
            }
            !faulted
        });
    }
    node.mps.retain(|s| {
        !whole(s.gpu) && !s.placement_start.is_some_and(|p| starts.contains(&(s.gpu, p)))
    });
    node
}
