//! An apply's passage through Slurm (DESIGN.md "Slurm (issue 41): a GRES change, node by
//! node"): where `[slurm]` is kept and managed, an apply that changes the GPUs, or finds
//! Slurm's GRES for this node other than the GPUs give, is checked before its first step
//! (slurmctld answers and knows the node; no job is on it; a GRES change needs a dynamic
//! node), drains the node, runs, has slurmd register again where gres.conf or the GRES
//! changed, and gives the node back; a failure leaves the node drained with the error as
//! the reason. An apply that changes nothing leaves Slurm alone, but for giving back a
//! node an earlier failure left drained. [`crate::slurm`] does the talking.

use std::sync::Arc;

use super::Engine;
use super::error::EngineError;
use crate::node::NodeState;
use crate::plan::Plan;
use crate::slurm::{Gres, NodeInfo, REASON_PREFIX, SlurmNode, reason_text};

/// What an apply must do in Slurm, found before its first step.
#[derive(Debug, Clone)]
pub struct SlurmPass {
    node: Arc<SlurmNode>,
    /// The node as slurmctld had it then.
    before: NodeInfo,
    /// The GRES it must list after the apply.
    want: Gres,
    /// gres.conf's records then (what slurmd reads of it).
    records: Option<String>,
    /// Whether the apply changes anything, on the GPUs or in Slurm: else it only gives
    /// back a node an earlier failure of gpushare's left drained.
    takes: bool,
}

/// Runs `work` on `node` on the blocking pool.
async fn blocking<T: Send + 'static>(
    node: &Arc<SlurmNode>,
    work: impl FnOnce(&SlurmNode) -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let node = Arc::clone(node);
    let task = crate::sys::log::in_current_span(move || work(&node));
    tokio::task::spawn_blocking(task).await.map_err(|e| crate::sys::task_failed(&e))?
}

/// A site's reason, less what a failure of gpushare's added to it (`…; gpushare: …`).
fn site_part(reason: &str) -> &str {
    reason.split_once(&format!("; {REASON_PREFIX}")).map_or(reason, |(site, _)| site)
}

impl Engine {
    /// Before an apply's first step: what it must do in Slurm (`None`: nothing, Slurm not
    /// managed, the node not registered yet, or nothing changes), or why it is refused, in
    /// one line naming the setting or the jobs. The re-apply at start-up (`boot`) asks
    /// Slurm only where slurmd runs already: at boot the agent starts before slurmd, but an
    /// agent restarted on a running node (a crash, an upgrade) must not change GPUs under
    /// its jobs.
    pub(super) async fn slurm_prepare(
        &self,
        plan: &Plan,
        before: &NodeState,
        boot: bool,
    ) -> Result<Option<SlurmPass>, EngineError> {
        let Some(node) = &self.slurm else { return Ok(None) };
        if boot && !crate::sys::procfs::root_runs("slurmd") {
            return Ok(None);
        }
        let views = self.transactions.views();
        let Some(want) = views.slurm_gres(plan, before) else { return Ok(None) };
        let want = Gres::parse(&want);
        let name = node.name();
        let info = blocking(node, SlurmNode::node).await.map_err(EngineError::Slurm)?;
        let Some(info) = info else {
            // Not yet registered (a node bootstrap applies before slurmd's first start): no
            // slurmd here, nothing in Slurm to take through; slurmd reads the GRES when it
            // starts. A slurmd that runs registered under another name.
            if crate::sys::procfs::root_runs("slurmd") {
                return Err(EngineError::Slurm(format!(
                    "[slurm] node: Slurm does not know node {name:?}, though slurmd runs here \
                     (set [slurm] node to the name it registered as: `scontrol show node`)"
                )));
            }
            tracing::info!(
                "Slurm does not know node {name} and no slurmd runs here: its GRES are \
                 slurmd's when it starts"
            );
            return Ok(None);
        };
        let differ = info.gres != want;
        let takes = plan.step_count() > 0 || differ;
        if !takes {
            let pass =
                SlurmPass { node: Arc::clone(node), before: info, want, records: None, takes };
            return Ok(pass.before.drained_by_gpushare().then_some(pass));
        }
        if differ && !info.dynamic() {
            return Err(EngineError::Slurm(format!(
                "[slurm] node {name}: this apply changes its GRES (Gres={} to Gres={want}), and \
                 it is no dynamic node (slurmd -Z): its GRES are slurm.conf's; make it dynamic \
                 (README \"Slurm\") or set [slurm] manage_node = false and change slurm.conf by \
                 hand",
                info.gres
            )));
        }
        let jobs = blocking(node, SlurmNode::jobs_on_node).await.map_err(EngineError::Slurm)?;
        if !jobs.is_empty() || info.busy() {
            return Err(refused_over(name, &jobs, &info.state));
        }
        let records = views.slurm_records();
        Ok(Some(SlurmPass { node: Arc::clone(node), before: info, want, records, takes }))
    }

    /// Drains the node before the first step (a drained node keeps its drain and reason);
    /// refused, the node as it was, when a job came since [`Engine::slurm_prepare`] looked.
    pub(super) async fn slurm_drain(
        &self,
        pass: &SlurmPass,
        profile: &str,
    ) -> Result<(), EngineError> {
        if !pass.takes {
            return Ok(());
        }
        let ours = !pass.before.drained();
        if ours {
            let reason = reason_text(&format!("applying {profile}"));
            blocking(&pass.node, move |n| n.drain(&reason)).await.map_err(EngineError::Slurm)?;
        }
        let looked = blocking(&pass.node, |n| Ok((n.jobs_on_node()?, n.node()?))).await;
        let refusal = match looked {
            Ok((jobs, Some(now))) if jobs.is_empty() && !now.busy() => return Ok(()),
            Ok((jobs, now)) => {
                let state = now.map(|n| n.state).unwrap_or_default();
                refused_over(pass.node.name(), &jobs, &state)
            }
            Err(why) => EngineError::Slurm(why),
        };
        if ours && let Err(why) = blocking(&pass.node, SlurmNode::resume).await {
            tracing::error!("Slurm node {} left drained: {why}", pass.node.name());
        }
        Err(refusal)
    }

    /// After the transaction: `outcome` `Ok`, slurmd registers again where gres.conf or the
    /// GRES changed, and the node is given back (a drain of the site's kept); failed (or
    /// failing here), the node is left drained with the error as the reason. The error,
    /// in one line.
    pub(super) async fn slurm_finish(
        &self,
        pass: &SlurmPass,
        profile: &str,
        outcome: Result<(), String>,
    ) -> Result<(), String> {
        let name = pass.node.name().to_string();
        let failed = match outcome {
            Err(why) => format!("apply {profile} failed: {why}"),
            Ok(()) => match self.slurm_take(pass, profile).await {
                Ok(()) => return Ok(()),
                Err(why) => format!("applied {profile}, but Slurm did not take it: {why}"),
            },
        };
        let now = blocking(&pass.node, SlurmNode::node).await.ok().flatten();
        let site = now.as_ref().and_then(NodeInfo::site_drain).or(pass.before.site_drain());
        let reason = match site {
            Some(site) => format!("{}; {}", site_part(&site), reason_text(&failed)),
            None => reason_text(&failed),
        };
        if let Err(why) = blocking(&pass.node, move |n| n.drain(&reason)).await {
            tracing::error!("Slurm node {name} could not be left drained: {why}");
        }
        Err(format!("Slurm node {name} left drained: {failed}"))
    }

    /// A committed apply's part in Slurm: slurmd registered again where needed, the node
    /// given back (resumed where gpushare drained it; a site's drain kept, set again if
    /// the registration lost it).
    async fn slurm_take(&self, pass: &SlurmPass, profile: &str) -> Result<(), String> {
        let records = self.transactions.views().slurm_records();
        // A drain the site set during the apply is the site's too.
        let now = blocking(&pass.node, SlurmNode::node).await?;
        let site = now.as_ref().and_then(NodeInfo::site_drain).or(pass.before.site_drain());
        let site = site.map(|s| site_part(&s).to_string());
        let register = pass.takes && (records != pass.records || pass.before.gres != pass.want);
        if register {
            if !pass.before.dynamic() {
                return Err(format!(
                    "gres.conf's devices changed, and slurmd of a node of slurm.conf reads them \
                     only when told (scontrol reconfigure); [slurm] node {} is no dynamic node",
                    pass.node.name()
                ));
            }
            // slurmd must start with the new GRES: the view wrote its environment (or
            // logged why not).
            let says = self.transactions.views().slurmd_gres()?;
            if Gres::parse(&says) != pass.want {
                return Err(format!(
                    "[slurm] slurmd_env says Gres={says}, not Gres={} (the log says why it was \
                     not written); slurmd not restarted",
                    pass.want
                ));
            }
            let want = pass.want.clone();
            let hold = site.clone().unwrap_or_else(|| reason_text(&format!("applying {profile}")));
            blocking(&pass.node, move |n| n.register_again(&want, &hold)).await?;
        }
        let now = blocking(&pass.node, SlurmNode::node).await?.ok_or("the node is gone")?;
        match site {
            Some(site) if now.site_drain().as_deref() != Some(site.as_str()) => {
                blocking(&pass.node, move |n| n.drain(&site)).await?
            }
            Some(_) => {}
            None if now.drained_by_gpushare() => blocking(&pass.node, SlurmNode::resume).await?,
            None => {}
        }
        tracing::info!(node = pass.node.name(), gres = %pass.want, "Slurm has the node's GRES");
        Ok(())
    }
}

/// The refusal of an apply while `jobs` are on node `name` (whose state is `state`).
fn refused_over(name: &str, jobs: &[String], state: &str) -> EngineError {
    let held = match jobs {
        [] => format!("slurmctld says it is busy (State={state})"),
        [one] => format!("job {one} is on it"),
        many => format!("jobs {} are on it", many.join(", ")),
    };
    EngineError::Slurm(format!(
        "[slurm] node {name}: {held}, and this apply changes its GPUs or GRES: refused, so that \
         no job is ended; to wait for them, drain the node with a reason beginning \
         \"{REASON_PREFIX}\" (the apply gives it back) and apply again once they are done"
    ))
}
