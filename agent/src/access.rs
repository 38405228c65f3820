//! Who may change the GPUs: root, members of the `gpushare` group, and the user the agent
//! itself runs as (an agent run by a user on simulated GPUs serves that user).
//!
//! The bus policy says the same, but the policy file can be missing or edited, so the
//! service checks every mutating call again from the caller's credentials as the bus
//! reports them (uid and supplementary groups). Reading is open to everyone.

/// The group whose members may change the GPUs.
pub const GROUP: &str = "gpushare";

/// The rule, resolved once at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessPolicy {
    agent_uid: u32,
    group_gid: Option<u32>,
}

impl AccessPolicy {
    /// The policy for an agent running as `agent_uid`, with the `gpushare` group looked up
    /// in the system's group database (`None` when it does not exist).
    pub fn for_this_host(agent_uid: u32) -> Self {
        AccessPolicy { agent_uid, group_gid: crate::sys::unix::group_id(GROUP) }
    }

    /// A policy with a known group id, for tests.
    pub fn new(agent_uid: u32, group_gid: Option<u32>) -> Self {
        AccessPolicy { agent_uid, group_gid }
    }

    /// Whether a caller with `uid` and `groups` may change the GPUs; the error says what
    /// is missing, in one line.
    pub fn may_change(&self, uid: Option<u32>, groups: &[u32]) -> Result<(), String> {
        let Some(uid) = uid else {
            return Err("the bus did not say who the caller is; changing the GPUs needs root or the gpushare group".into());
        };
        if uid == 0 || uid == self.agent_uid {
            return Ok(());
        }
        match self.group_gid {
            Some(gid) if groups.contains(&gid) => Ok(()),
            Some(_) => Err(format!(
                "changing the GPUs needs root or membership in the {GROUP} group; uid {uid} has neither"
            )),
            None => Err(format!(
                "changing the GPUs needs root or membership in the {GROUP} group, which does not exist on this host; uid {uid} is not root"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_members_and_the_agents_own_user_may_change() {
        let policy = AccessPolicy::new(0, Some(998));
        assert!(policy.may_change(Some(0), &[]).is_ok());
        assert!(policy.may_change(Some(1000), &[100, 998]).is_ok());
        let e = policy.may_change(Some(1000), &[100]).unwrap_err();
        assert_eq!(
            e,
            "changing the GPUs needs root or membership in the gpushare group; uid 1000 has neither"
        );
        assert!(policy.may_change(None, &[998]).is_err());
        // An agent a user runs on simulated GPUs serves that user.
        assert!(AccessPolicy::new(1000, None).may_change(Some(1000), &[]).is_ok());
        let e = AccessPolicy::new(0, None).may_change(Some(1000), &[]).unwrap_err();
        assert!(e.contains("does not exist on this host"), "{e}");
    }
}
