//! The core: the node and what the agent knows of it. Owns the access to the GPUs and
//! the sharing tools ([`NodeAccess`]), the known profiles (replaced whole on a reload),
//! the journal, the agent's policy (what it may change), and the turn to parse or plan a
//! caller's document. Resolves a [`ProfileRef`] to a profile and plans it; changes
//! nothing itself (transactions do, `super::transactions`).

use std::sync::{Arc, PoisonError, RwLock};

use crate::apply::journal::{Journal, ProfileDocument};
use crate::apply::{NodeAccess, Reads};
use crate::node::NodeState;
use crate::plan::{self, Plan, PlanOptions};
use crate::profile::{self, Profile, ProfileStore};

use super::error::EngineError;

/// The node, the known profiles, the journal and the policy.
pub struct Core {
    /// The GPUs and the sharing tools.
    pub node: NodeAccess,
    /// Replaced whole on a reload (SIGHUP); each operation works on one version.
    profiles: RwLock<Arc<ProfileStore>>,
    /// What was applied, and the transaction or bench in flight.
    pub journal: Arc<Journal>,
    /// What the agent may change.
    pub policy: PlanOptions,
    /// Parsing and planning callers' documents: one at a time, so that however many
    /// arrive at once, they hold one core and the agent's other tasks (another client's
    /// `status`) keep the rest.
    document_work: Arc<tokio::sync::Semaphore>,
}

/// The error of a profile the store does not have: unknown, or its file does not load
/// (then the file's own error, which is what the user must fix).
pub fn missing_profile(missing: profile::Missing) -> EngineError {
    match missing {
        profile::Missing::Unknown(why) => EngineError::UnknownProfile(why),
        profile::Missing::Broken(why) => EngineError::BrokenProfile(why),
    }
}

/// A profile given by name or as a document (`apply -f`).
#[derive(Debug, Clone, Copy)]
pub enum ProfileRef<'a> {
    /// A known profile.
    Named(&'a str),
    /// A gpushare profile (TOML) or a mig-parted config file with the config to use.
    Document {
        /// The document.
        text: &'a str,
        /// Its name in messages (a path).
        origin: &'a str,
        /// The mig-parted config; empty for TOML.
        config: &'a str,
    },
}

impl<'a> ProfileRef<'a> {
    /// The profile of a journaled document.
    pub fn of_document(d: &'a ProfileDocument) -> Self {
        ProfileRef::Document { text: &d.text, origin: &d.origin, config: &d.config }
    }
}

impl Core {
    /// The core over `node` with `profiles`, `journal` and `policy`.
    pub fn new(
        node: NodeAccess,
        profiles: ProfileStore,
        journal: Arc<Journal>,
        policy: PlanOptions,
    ) -> Self {
        Core {
            node,
            profiles: RwLock::new(Arc::new(profiles)),
            journal,
            policy,
            document_work: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }

    /// The known profiles, as of now.
    pub fn profiles(&self) -> Arc<ProfileStore> {
        Arc::clone(&self.profiles.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Replaces the known profiles (a reload of the profile directory). Jobs already
    /// planned keep the profile they planned.
    pub fn reload_profiles(&self, profiles: ProfileStore) {
        *self.profiles.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(profiles);
    }

    /// A fresh observation of the GPUs, MPS servers and time-slice intervals.
    pub async fn observe(&self) -> Result<NodeState, EngineError> {
        Ok(self.node.observe(Reads::FOR_PLANNING).await?)
    }

    /// The profile `profile` names: a known one, or its document parsed.
    pub fn resolve(&self, profile: ProfileRef<'_>) -> Result<Profile, EngineError> {
        match profile {
            ProfileRef::Named(name) => {
                self.profiles().get(name).map(|p| p.profile.clone()).map_err(missing_profile)
            }
            ProfileRef::Document { text, origin, config } => {
                Ok(profile::parse_document(text, origin, config)?)
            }
        }
    }

    /// [`Core::resolve`] for a request: a document is parsed on the blocking pool, so
    /// that no caller's document holds up the tasks that answer other callers.
    pub async fn resolve_request(&self, profile: ProfileRef<'_>) -> Result<Profile, EngineError> {
        let ProfileRef::Document { text, origin, config } = profile else {
            return self.resolve(profile);
        };
        let (text, origin, config) = (text.to_string(), origin.to_string(), config.to_string());
        let _turn = self.document_turn().await?;
        tokio::task::spawn_blocking(move || profile::parse_document(&text, &origin, &config))
            .await
            .map_err(|e| EngineError::Internal(crate::sys::task_failed(&e)))?
            .map_err(EngineError::from)
    }

    /// Waits for the turn to parse or plan a document (see `document_work`).
    pub async fn document_turn(&self) -> Result<tokio::sync::OwnedSemaphorePermit, EngineError> {
        Arc::clone(&self.document_work)
            .acquire_owned()
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))
    }

    /// Plans `profile` against `node` on the blocking pool, in turn (see
    /// [`Core::resolve_request`]).
    pub async fn plan_request(
        &self,
        node: NodeState,
        profile: Profile,
        options: PlanOptions,
    ) -> Result<(Plan, NodeState, Profile), EngineError> {
        let _turn = self.document_turn().await?;
        tokio::task::spawn_blocking(move || {
            let plan = plan::plan(&node, &profile, &options)?;
            Ok((plan, node, profile))
        })
        .await
        .map_err(|e| EngineError::Internal(crate::sys::task_failed(&e)))?
    }

    /// Refuses a plan that needs a program this host cannot run, or a GPU reset it cannot
    /// do (see [`NodeAccess::missing_tool`], [`NodeAccess::reset_blocked`]).
    pub async fn check_host(&self, plan: &Plan, node: &NodeState) -> Result<(), EngineError> {
        if let Some(why) = self.node.missing_tool(plan) {
            return Err(EngineError::NotPossible(why));
        }
        match self.node.reset_blocked(plan, node).await {
            Some(why) => Err(EngineError::NotPossible(why)),
            None => Ok(()),
        }
    }
}
