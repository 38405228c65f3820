//! An apply's passage through Slurm (DESIGN.md "Slurm (issue 41): a GRES change, node by
//! node"): where `[slurm]` is kept and managed, an apply that changes the GRES Slurm
//! lists for this node is checked before its first step (slurmctld answers, knows the
//! node, the node is dynamic, no job holds GRES on it), drains the node, runs, and then
//! has slurmd register again with the new GRES and gives the node back; a failure leaves
//! the node drained with the error as the reason. An apply that does not change the GRES
//! leaves Slurm alone. [`crate::slurm`] does the talking.

use std::sync::Arc;

use super::Engine;
use super::error::EngineError;
use crate::node::NodeState;
use crate::plan::Plan;
use crate::slurm::{Gres, SlurmNode, reason_text};

/// What an apply must do in Slurm, found before its first step.
#[derive(Debug, Clone)]
pub struct SlurmPass {
    node: Arc<SlurmNode>,
    /// The GRES Slurm lists now.
    have: Gres,
    /// The GRES it must list after the apply.
    want: Gres,
    /// A drain the site set before: kept, with its reason.
    site_drain: Option<String>,
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

/// The jobs `ids` as words: `jobs 12, 13`.
fn jobs_text(ids: &[u64]) -> String {
    let list: Vec<String> = ids.iter().map(u64::to_string).collect();
    format!("{} {}", if ids.len() == 1 { "job" } else { "jobs" }, list.join(", "))
}

impl Engine {
    /// Before an apply's first step: what it must do in Slurm (`None`: nothing, Slurm not
    /// managed or its GRES unchanged), or why it is refused, in one line naming the
    /// setting or the jobs.
    pub(super) async fn slurm_prepare(
        &self,
        plan: &Plan,
        before: &NodeState,
    ) -> Result<Option<SlurmPass>, EngineError> {
        let Some(node) = &self.slurm else { return Ok(None) };
        let Some(want) = self.transactions.views().slurm_gres(plan, before) else {
            return Ok(None);
        };
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
        if info.gres == want {
            return Ok(None);
        }
        let change = format!("Gres={} to Gres={want}", info.gres);
        if !info.dynamic() {
            return Err(EngineError::Slurm(format!(
                "[slurm] node {name}: this apply changes its GRES ({change}), and it is no \
                 dynamic node (slurmd -Z): its GRES are slurm.conf's; make it dynamic (README \
                 \"Slurm\") or set [slurm] manage_node = false and change slurm.conf by hand"
            )));
        }
        let jobs =
            blocking(node, SlurmNode::jobs_holding_gres).await.map_err(EngineError::Slurm)?;
        if !jobs.is_empty() {
            return Err(refused_over(name, &jobs, &change));
        }
        let site_drain = info.site_drain();
        Ok(Some(SlurmPass { node: Arc::clone(node), have: info.gres, want, site_drain }))
    }

    /// Drains the node before the first step (a site's drain is kept); refused, the node
    /// as it was, when a job took GRES there since [`Engine::slurm_prepare`] looked.
    pub(super) async fn slurm_drain(
        &self,
        pass: &SlurmPass,
        profile: &str,
    ) -> Result<(), EngineError> {
        let ours = pass.site_drain.is_none();
        let reason = reason_text(&format!("applying {profile}"));
        if ours {
            let drain = reason.clone();
            blocking(&pass.node, move |n| n.drain(&drain)).await.map_err(EngineError::Slurm)?;
        }
        let jobs = blocking(&pass.node, SlurmNode::jobs_holding_gres).await;
        let refusal = match jobs {
            Ok(jobs) if jobs.is_empty() => return Ok(()),
            Ok(jobs) => {
                let change = format!("Gres={} to Gres={}", pass.have, pass.want);
                refused_over(pass.node.name(), &jobs, &change)
            }
            Err(why) => EngineError::Slurm(why),
        };
        if ours && let Err(why) = blocking(&pass.node, SlurmNode::resume).await {
            tracing::error!("Slurm node {} left drained: {why}", pass.node.name());
        }
        Err(refusal)
    }

    /// After the transaction: `outcome` `Ok`, slurmd registers again with the new GRES
    /// and the node is given back (a site's drain set again); failed (or failing here),
    /// the node is left drained with the error as the reason. The error, in one line.
    pub(super) async fn slurm_finish(
        &self,
        pass: &SlurmPass,
        profile: &str,
        outcome: Result<(), String>,
    ) -> Result<(), String> {
        let name = pass.node.name().to_string();
        let failed = match outcome {
            Err(why) => format!("apply {profile} failed: {why}"),
            Ok(()) => {
                let want = pass.want.clone();
                let registered = blocking(&pass.node, move |n| n.register_again(&want)).await;
                let given_back = match registered {
                    Ok(info) => {
                        let site = pass.site_drain.clone();
                        blocking(&pass.node, move |n| match site {
                            Some(reason) => n.drain(&reason),
                            None if info.drained() => n.resume(),
                            None => Ok(()),
                        })
                        .await
                    }
                    Err(why) => Err(why),
                };
                match given_back {
                    Ok(()) => {
                        tracing::info!(node = name, gres = %pass.want, "Slurm took the new GRES");
                        return Ok(());
                    }
                    Err(why) => format!("applied {profile}, but Slurm did not take it: {why}"),
                }
            }
        };
        let reason = match &pass.site_drain {
            Some(site) => format!("{site}; {}", reason_text(&failed)),
            None => reason_text(&failed),
        };
        if let Err(why) = blocking(&pass.node, move |n| n.drain(&reason)).await {
            tracing::error!("Slurm node {name} could not be left drained: {why}");
        }
        Err(format!("Slurm node {name} left drained: {failed}"))
    }
}

/// The refusal of a GRES change while `jobs` hold GRES on node `name`.
fn refused_over(name: &str, jobs: &[u64], change: &str) -> EngineError {
    EngineError::Slurm(format!(
        "[slurm] node {name}: {} hold GRES there, and this apply changes them ({change}): \
         refused, so that no job is ended; apply again once they are done (drain the node \
         first so that no new one starts)",
        jobs_text(jobs)
    ))
}
