//! What the agent knows of each of its MPS servers beyond [`super::MpsServerState`]: the
//! limits it configured, the daemon's mode, the overrides `gpushare-ctl mps limit` made,
//! and the limits the control daemon answers now (the *live* limits), with the rule that
//! tells where a live limit comes from and whether it is drift. Plain data, no I/O: the
//! sharing layer fills it in, the planner, the engine and the views read it.

use serde::{Deserialize, Serialize};

use super::MpsLimits;

/// What an MPS control daemon is started with: its clients' default limits, and whether
/// it serves every user's clients at once (`-M`, NVIDIA's multi-user mode) or one user's
/// at a time (NVIDIA's default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MpsSpec {
    /// The daemon's default limits of clients.
    pub limits: MpsLimits,
    /// `nvidia-cuda-mps-control -d -M`.
    pub multi_user: bool,
}

impl MpsSpec {
    /// A single-user daemon with `limits` (what a record without a mode means).
    pub fn single_user(limits: MpsLimits) -> MpsSpec {
        MpsSpec { limits, multi_user: false }
    }
}

/// Where a limit that a server gives its clients comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitSource {
    /// The profile: the limits the agent set when it started the daemon.
    Profile,
    /// An override `gpushare-ctl mps limit` made on the running server process, as the
    /// agent recorded it.
    MpsLimit,
    /// Neither: someone changed it through the control daemon behind the agent's back
    /// (root, or the daemon's own user). Drift.
    Unknown,
}

impl LimitSource {
    /// `profile`, `mps-limit`, `unknown`: the word the documents use.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitSource::Profile => "profile",
            LimitSource::MpsLimit => "mps-limit",
            LimitSource::Unknown => "unknown",
        }
    }
}

/// An override `gpushare-ctl mps limit` made on one MPS server process, kept in the
/// server's record: MPS applies it to that server's new clients, and a server started
/// later (for another user, or after a restart) begins with the daemon's defaults again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitOverride {
    /// The MPS server process it was made on.
    pub server_pid: u32,
    /// The active thread percentage set, if it was.
    #[serde(default)]
    pub active_thread_percentage: Option<u32>,
    /// The pinned memory limit set, if it was.
    #[serde(default)]
    pub pinned_memory_limit_bytes: Option<u64>,
    /// Who asked (the caller's uid), when the transport said.
    #[serde(default)]
    pub by_uid: Option<u32>,
    /// When, in seconds since the Unix epoch.
    pub at_unix_seconds: u64,
}

impl LimitOverride {
    /// `limits` with this override's settings over them.
    pub fn over(&self, limits: MpsLimits) -> MpsLimits {
        MpsLimits {
            active_thread_percentage: self
                .active_thread_percentage
                .unwrap_or(limits.active_thread_percentage),
            pinned_memory_limit_bytes: self
                .pinned_memory_limit_bytes
                .or(limits.pinned_memory_limit_bytes),
        }
    }
}

/// One MPS server process as its control daemon answers for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveServer {
    /// Its pid (`get_server_list`).
    pub pid: u32,
    /// The user it runs as, which is the user whose clients it serves (all users' with
    /// `-M`); `None` when it could not be told.
    pub uid: Option<u32>,
    /// Its limits for new clients (`get_active_thread_percentage PID`,
    /// `get_device_pinned_mem_limit PID 0`; `None`: no memory limit).
    pub limits: MpsLimits,
}

/// What a control daemon answered for its limits, in one observation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveLimits {
    /// The daemon's default limits, which every server it starts from now on gets
    /// (`get_default_active_thread_percentage`, `get_default_device_pinned_mem_limit 0`).
    pub defaults: MpsLimits,
    /// Its server processes (none until a first client came; one at a time, in practice).
    pub servers: Vec<LiveServer>,
}

/// What the agent knows of one MPS server besides its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsServerDetail {
    /// The limits the agent set as the daemon's defaults: the profile's.
    pub configured: MpsLimits,
    /// Whether the daemon was started in multi-user mode.
    pub multi_user: bool,
    /// The overrides `mps limit` made on the server processes that still run (older ones
    /// are forgotten when seen gone).
    pub overrides: Vec<LimitOverride>,
    /// The control daemon's answers, where it was asked.
    pub live: Option<LiveLimits>,
}

/// How a server's live limits differ from what the agent set: the drift of one daemon.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LimitDrift {
    /// The daemon's defaults, when they are not the configured ones: (live, configured).
    pub defaults: Option<(MpsLimits, MpsLimits)>,
    /// Server processes whose limits are neither the configured ones nor the agent's
    /// recorded override: (pid, live, what the agent set).
    pub servers: Vec<(u32, MpsLimits, MpsLimits)>,
}

impl LimitDrift {
    /// Whether nothing drifted.
    pub fn is_empty(&self) -> bool {
        self.defaults.is_none() && self.servers.is_empty()
    }

    /// Whether putting it back means removing a memory limit, which MPS cannot do to a
    /// running daemon or server (only a restart does).
    pub fn removes_memory_limit(&self) -> bool {
        let removes = |live: &MpsLimits, want: &MpsLimits| {
            live.pinned_memory_limit_bytes.is_some() && want.pinned_memory_limit_bytes.is_none()
        };
        self.defaults.is_some_and(|(live, want)| removes(&live, &want))
            || self.servers.iter().any(|(_, live, want)| removes(live, want))
    }
}

impl MpsServerDetail {
    /// A detail with nothing read live.
    pub fn configured(spec: MpsSpec, overrides: Vec<LimitOverride>) -> MpsServerDetail {
        MpsServerDetail {
            configured: spec.limits,
            multi_user: spec.multi_user,
            overrides,
            live: None,
        }
    }

    /// The spec the daemon was started with.
    pub fn spec(&self) -> MpsSpec {
        MpsSpec { limits: self.configured, multi_user: self.multi_user }
    }

    /// The override recorded for server process `pid`, if any.
    pub fn override_of(&self, pid: u32) -> Option<&LimitOverride> {
        self.overrides.iter().rev().find(|o| o.server_pid == pid)
    }

    /// What server process `pid` should give its new clients: the configured limits, with
    /// the override the agent recorded for it over them.
    pub fn expected(&self, pid: u32) -> MpsLimits {
        self.override_of(pid).map_or(self.configured, |o| o.over(self.configured))
    }

    /// Where the daemon's live defaults come from; `None` when they were not read.
    pub fn defaults_source(&self) -> Option<LimitSource> {
        let live = self.live.as_ref()?;
        Some(if live.defaults == self.configured {
            LimitSource::Profile
        } else {
            LimitSource::Unknown
        })
    }

    /// Where the live limits of `server` come from.
    pub fn server_source(&self, server: &LiveServer) -> LimitSource {
        if server.limits != self.expected(server.pid) {
            LimitSource::Unknown
        } else if self.override_of(server.pid).is_some() {
            LimitSource::MpsLimit
        } else {
            LimitSource::Profile
        }
    }

    /// The limits a client connecting now gets, with where they come from: the running
    /// server process's (the first, should there be several), else the daemon's defaults
    /// (the first client starts a server with them); `None` when nothing was read.
    pub fn for_new_clients(&self) -> Option<(MpsLimits, LimitSource)> {
        let live = self.live.as_ref()?;
        Some(match live.servers.first() {
            Some(server) => (server.limits, self.server_source(server)),
            None => (live.defaults, self.defaults_source().unwrap_or(LimitSource::Unknown)),
        })
    }

    /// How the live limits differ from what the agent set (nothing when not read).
    pub fn drift(&self) -> LimitDrift {
        let Some(live) = &self.live else { return LimitDrift::default() };
        LimitDrift {
            defaults: (live.defaults != self.configured)
                .then_some((live.defaults, self.configured)),
            servers: live
                .servers
                .iter()
                .filter(|s| self.server_source(s) == LimitSource::Unknown)
                .map(|s| (s.pid, s.limits, self.expected(s.pid)))
                .collect(),
        }
    }
}

/// Limits in a few words: `25% threads, 10 GiB`, `100% threads, no memory limit`.
pub fn limits_text(limits: MpsLimits) -> String {
    let memory = limits
        .pinned_memory_limit_bytes
        .map_or_else(|| "no memory limit".to_string(), gpushare_proto::exact_size);
    format!("{}% threads, {memory}", limits.active_thread_percentage)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn limits(threads: u32, gib: Option<u64>) -> MpsLimits {
        MpsLimits {
            active_thread_percentage: threads,
            pinned_memory_limit_bytes: gib.map(|g| g * GIB),
        }
    }

    fn detail(live: Option<LiveLimits>, overrides: Vec<LimitOverride>) -> MpsServerDetail {
        MpsServerDetail { configured: limits(25, Some(10)), multi_user: false, overrides, live }
    }

    fn server(pid: u32, threads: u32, gib: Option<u64>) -> LiveServer {
        LiveServer { pid, uid: Some(1000), limits: limits(threads, gib) }
    }

    fn by_mps_limit(server_pid: u32, threads: u32) -> LimitOverride {
        LimitOverride {
            server_pid,
            active_thread_percentage: Some(threads),
            pinned_memory_limit_bytes: None,
            by_uid: Some(0),
            at_unix_seconds: 1,
        }
    }

    #[test]
    fn live_limits_as_configured_are_the_profiles() {
        let d = detail(
            Some(LiveLimits {
                defaults: limits(25, Some(10)),
                servers: vec![server(7, 25, Some(10))],
            }),
            Vec::new(),
        );
        assert_eq!(d.defaults_source(), Some(LimitSource::Profile));
        assert_eq!(d.for_new_clients(), Some((limits(25, Some(10)), LimitSource::Profile)));
        assert!(d.drift().is_empty());
    }

    #[test]
    fn a_recorded_override_is_no_drift_and_anything_else_is() {
        // `mps limit --threads 50` on server 7: its 50 % comes from mps limit.
        let d = detail(
            Some(LiveLimits {
                defaults: limits(25, Some(10)),
                servers: vec![server(7, 50, Some(10))],
            }),
            vec![by_mps_limit(7, 50)],
        );
        assert_eq!(d.for_new_clients(), Some((limits(50, Some(10)), LimitSource::MpsLimit)));
        assert!(d.drift().is_empty(), "{:?}", d.drift());
        // The same 50 % on another server (the override was made on 7, now gone): drift.
        let replaced = detail(
            Some(LiveLimits {
                defaults: limits(25, Some(10)),
                servers: vec![server(8, 50, Some(10))],
            }),
            vec![by_mps_limit(7, 50)],
        );
        assert_eq!(replaced.drift().servers, [(8, limits(50, Some(10)), limits(25, Some(10)))]);
        // Defaults changed by hand: drift, and a client connecting now (no server yet)
        // gets them.
        let defaults = detail(
            Some(LiveLimits { defaults: limits(90, Some(10)), servers: Vec::new() }),
            Vec::new(),
        );
        assert_eq!(defaults.drift().defaults, Some((limits(90, Some(10)), limits(25, Some(10)))));
        assert_eq!(defaults.for_new_clients(), Some((limits(90, Some(10)), LimitSource::Unknown)));
        // Not read: nothing known, no drift.
        let unread = detail(None, Vec::new());
        assert_eq!(unread.for_new_clients(), None);
        assert!(unread.drift().is_empty());
    }

    #[test]
    fn an_override_sets_only_what_it_names() {
        let memory = LimitOverride {
            pinned_memory_limit_bytes: Some(4 * GIB),
            active_thread_percentage: None,
            ..by_mps_limit(7, 0)
        };
        assert_eq!(memory.over(limits(25, Some(10))), limits(25, Some(4)));
        assert_eq!(by_mps_limit(7, 60).over(limits(25, None)), limits(60, None));
        assert_eq!(limits_text(limits(25, Some(10))), "25% threads, 10 GiB");
        assert_eq!(limits_text(limits(100, None)), "100% threads, no memory limit");
    }
}
