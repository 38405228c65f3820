//! Consumer views: the files the agent keeps true to the GPUs, for the programs that
//! hand them out (the CDI spec, [`cdi`], today; a Slurm GRES file or a device plugin's
//! config would be the next). Owns the set of views and the one observation they render
//! from. Each view is a [`View`]: it checks its place before an apply ([`Views::check`]),
//! renders from one [`Observation`] of the node, and is written after every transaction
//! by the one transaction path (`engine::transactions`: commit, rollback, a bench's setup
//! and restore, recovery) and at start-up ([`Views::refresh`]). The set is built once from
//! the configuration ([`Views::from_config`], by the daemon) and handed to the engine.
//!
//! Adding a view: a module here implementing [`View`], its section in `agent.toml`
//! (`config.rs`), and its line in [`Views::from_config`].

pub mod cdi;

use std::collections::HashMap;
use std::sync::Arc;

use crate::apply::{NodeAccess, Reads};
use crate::config::AgentConfig;
use crate::node::NodeState;

/// The node as every view renders it, observed once per refresh.
pub struct Observation<'a> {
    /// The GPUs and MPS servers, with the limits each server gives its clients now.
    pub node: &'a NodeState,
    /// Each GPU's device minor number (`/dev/nvidia<minor>`), where the driver says it.
    pub minors: &'a HashMap<u32, Option<u32>>,
    /// Where the host keeps what the views name: device nodes under its root, MPS
    /// directories.
    pub access: &'a NodeAccess,
}

/// A file the agent keeps true to the GPUs.
pub trait View: Send + Sync {
    /// Its name in logs (`CDI spec`).
    fn name(&self) -> &'static str;
    /// Whether it is kept at all (its configuration section may turn it off).
    fn enabled(&self) -> bool;
    /// Whether its place can be written: checked before an apply's first step, so that a
    /// place it cannot go refuses the apply rather than leaving the view stale after it.
    /// One line naming the place and the setting that moves it.
    fn check(&self) -> Result<(), String>;
    /// Renders from `seen` and writes the file when it changed; `Err` says why the node
    /// could not be observed. A failure is the view's to log and keep for its report: the
    /// GPUs are as the transaction left them either way (the view follows them).
    fn render(&self, seen: Result<&Observation<'_>, &str>);
}

/// The views of this agent, built once.
pub struct Views {
    /// The CDI spec, also answering `gpushare-ctl cdi`.
    cdi: Arc<cdi::CdiView>,
    /// Every view, the CDI spec first.
    all: Vec<Arc<dyn View>>,
}

impl Views {
    /// The views `config` asks for.
    pub fn from_config(config: &AgentConfig) -> Self {
        let cdi = Arc::new(cdi::CdiView::new(crate::cdi::writer::Writer {
            dir: config.cdi.dir.clone(),
            enabled: config.cdi.enabled,
        }));
        let all: Vec<Arc<dyn View>> = vec![cdi.clone()];
        Views { cdi, all }
    }

    /// The CDI spec's view.
    pub fn cdi(&self) -> &cdi::CdiView {
        &self.cdi
    }

    /// Whether every view kept can be written (before an apply's first step); the first
    /// that cannot, in one line.
    pub fn check(&self) -> Result<(), String> {
        self.all.iter().filter(|v| v.enabled()).try_for_each(|v| v.check())
    }

    /// Renders every view kept from one fresh observation of `access`'s node.
    pub async fn refresh(&self, access: &NodeAccess) {
        let kept: Vec<&Arc<dyn View>> = self.all.iter().filter(|v| v.enabled()).collect();
        if kept.is_empty() {
            return;
        }
        // The shares' limits are those the servers give their clients now.
        let observed = match access.observe(Reads::GPUS_AND_SERVERS).await {
            Ok(node) => access.read_live_limits(node, |_| false).await,
            Err(e) => Err(e),
        };
        match observed {
            Ok(node) => {
                let mut minors = HashMap::new();
                for g in &node.gpus {
                    minors.insert(g.index, access.minor_number(g.index).await);
                }
                let seen = Observation { node: &node, minors: &minors, access };
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
