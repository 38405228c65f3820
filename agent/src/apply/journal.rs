//! The journal: `<state-dir>/state.json`, the agent's durable memory of the active
//! profile and of the transaction in flight.
//!
//! An apply that changes anything begins a transaction holding the checkpoint (the
//! observed layout of every GPU the plan touches) and the steps; each completed step is
//! recorded; the transaction ends in a commit (the profile becomes active) or a rollback
//! (the previous profile stays active). Every change is written atomically before the
//! agent goes on, so a transaction found at start-up was interrupted.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::node::{
    ComputeMode, GpuInstance, MpsLimits, MpsServerState, NodeState, TimeSliceInterval,
};
use crate::sys::files::{PRIVATE, make_private, read_json, write_json};

/// A profile applied from a document (`apply -f`), kept so that it can be re-applied at
/// start-up: it is in no profile directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileDocument {
    /// The document.
    pub text: String,
    /// Where it came from (a path, as the client gave it).
    pub origin: String,
    /// The mig-parted config; empty for a gpushare profile.
    pub config: String,
}

/// What `state.json` holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentState {
    /// The profile last applied successfully.
    pub active_profile: Option<String>,
    /// Its document, when it was applied from one.
    #[serde(default)]
    pub active_document: Option<ProfileDocument>,
    /// The transaction in flight, or one that was interrupted or could not be rolled back.
    #[serde(default)]
    pub transaction: Option<Transaction>,
    /// A bench in flight: what to put back if the agent stops before the bench ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bench: Option<BenchRecord>,
}

impl AgentState {
    /// Cuts the origins and config names of the documents kept to the bounds a caller's
    /// are held to now (an agent before them kept whatever came: a 33 MB origin made every
    /// `status` reply too large for the bus).
    fn bound_documents(&mut self) {
        let (document, previous) = match self.transaction.as_mut() {
            Some(t) => (t.document.as_mut(), t.previous_document.as_mut()),
            None => (None, None),
        };
        let documents = [
            self.active_document.as_mut(),
            document,
            previous,
            self.bench.as_mut().and_then(|b| b.previous_document.as_mut()),
        ];
        for document in documents.into_iter().flatten() {
            cut(&mut document.origin, gpushare_proto::ORIGIN_MAX_BYTES);
            cut(&mut document.config, gpushare_proto::NAME_MAX_BYTES);
        }
    }
}

/// Cuts `text` to at most `max` bytes, at a character boundary.
fn cut(text: &mut String, max: usize) {
    let end = gpushare_proto::byte_prefix(text, max).len();
    text.truncate(end);
}

/// A bench in flight. Its strategies are set up by ordinary transactions on its GPU, which
/// leave the active profile as it is (a bench's setup is never the node's profile); this
/// record is what the bench restores when it ends, and what the agent restores at start-up
/// when it did not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRecord {
    /// The job, for the log.
    pub job: String,
    /// The benched GPU's layout before the bench.
    pub checkpoint: Vec<GpuCheckpoint>,
    /// The profile active before the bench.
    pub previous_profile: Option<String>,
    /// Its document, when it came as one.
    #[serde(default)]
    pub previous_document: Option<ProfileDocument>,
    /// The user the replicas run as.
    pub uid: u32,
    /// The replicas running now.
    #[serde(default)]
    pub replicas: Vec<ReplicaHandle>,
    /// Why restoring the GPU after the bench failed, when it did: the record then stays
    /// only to say so (`status`), is never replayed, and goes with the next apply that
    /// commits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_error: Option<String>,
    /// Whether the bench's setups leave the active profile alone. An agent before issue 27
    /// made each setup the active profile and put `previous_profile` back at the end; its
    /// records lack the field and are ended that way.
    #[serde(default)]
    pub keeps_active: bool,
}

impl BenchRecord {
    /// Whether `transaction` is one of this bench's own setups: the bench runs (its restore
    /// has not failed) and the transaction touches its GPUs only. No other transaction
    /// touches them while it runs (the engine refuses applies that select them).
    fn sets_up(&self, transaction: &Transaction) -> bool {
        self.keeps_active
            && self.restore_error.is_none()
            && !transaction.checkpoint.is_empty()
            && transaction
                .checkpoint
                .iter()
                .all(|t| self.checkpoint.iter().any(|c| c.gpu == t.gpu && c.uuid == t.uuid))
    }
}

/// A running replica as the journal keeps it, so that an agent started after one that
/// died can stop it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaHandle {
    /// A transient systemd unit (`gpushare-bench-7-3.service`).
    Unit {
        /// The unit's name.
        name: String,
    },
    /// A gate the agent forked into a session of its own: its pid, which names the
    /// session, and its start time, which tells it from a later process of that pid.
    Session {
        /// The gate's pid.
        pid: u32,
        /// Its start time (clock ticks after boot).
        start_time: u64,
    },
}

/// An apply in flight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transaction {
    /// Profile being applied.
    pub profile: String,
    /// The document of the profile being applied, when it came as one.
    #[serde(default)]
    pub document: Option<ProfileDocument>,
    /// Profile active before; active again after a rollback.
    pub previous_profile: Option<String>,
    /// Its document, when it came as one.
    #[serde(default)]
    pub previous_document: Option<ProfileDocument>,
    /// The layout of every GPU the plan touches, observed before the first change.
    pub checkpoint: Vec<GpuCheckpoint>,
    /// The plan's steps, for people.
    pub steps: Vec<String>,
    /// Indices of the steps carried out, in completion order.
    pub completed: Vec<usize>,
    /// Set when a rollback failed: what went wrong.
    #[serde(default)]
    pub rollback_error: Option<String>,
}

/// The layout of one GPU at a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuCheckpoint {
    /// GPU index.
    pub gpu: u32,
    /// GPU UUID, to notice a GPU that changed places.
    pub uuid: String,
    /// MIG mode (the current one).
    pub mig_enabled: bool,
    /// GPU instances as (profile id, placement start).
    pub instances: Vec<(u32, u8)>,
    /// The compute slices of each GPU instance's compute instances, largest first, in the
    /// order of `instances`. Missing (a journal written before compute instances could be
    /// subdivided) or empty: the instance is used whole.
    #[serde(default)]
    pub compute: Vec<Vec<u8>>,
    /// Compute mode.
    pub compute_mode: ComputeMode,
    /// MPS servers as (placement start, limits); no start for the whole GPU.
    #[serde(default)]
    pub mps: Vec<(Option<u8>, MpsLimits)>,
    /// The compute instance each server of `mps` serves in its GPU instance, by index, in
    /// the order of `mps`; missing: 0.
    #[serde(default)]
    pub mps_compute: Vec<u8>,
    /// Whether each server of `mps` served every user at once (multi-user mode), in the
    /// order of `mps`; missing: not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mps_multi_user: Vec<bool>,
    /// Time-slice interval, when it was known.
    #[serde(default)]
    pub timeslice: Option<TimeSliceInterval>,
}

impl GpuCheckpoint {
    /// The checkpoints of `gpus` in `node`.
    pub fn of(node: &NodeState, gpus: impl IntoIterator<Item = u32>) -> Vec<GpuCheckpoint> {
        gpus.into_iter()
            .filter_map(|index| node.gpu(index))
            .map(|g| GpuCheckpoint {
                gpu: g.index,
                uuid: g.uuid.clone(),
                mig_enabled: g.mig_enabled,
                instances: g.instances.iter().map(|i| (i.profile_id, i.placement_start)).collect(),
                compute: g.instances.iter().map(GpuInstance::compute_layout).collect(),
                compute_mode: g.compute_mode,
                mps: running(node, g.index).map(|s| (s.placement_start, s.limits)).collect(),
                mps_compute: running(node, g.index).map(|s| s.compute_instance).collect(),
                mps_multi_user: running(node, g.index)
                    .map(|s| node.mps_spec(s).multi_user)
                    .collect(),
                timeslice: node.timeslice(g.index),
            })
            .collect()
    }
}

/// The running MPS servers of GPU `gpu`.
fn running(node: &NodeState, gpu: u32) -> impl Iterator<Item = &MpsServerState> {
    node.mps.iter().filter(move |s| s.gpu == gpu && s.pid.is_some())
}

/// The journal file and its content in memory.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    state: Mutex<AgentState>,
    /// Why the last write failed, until one succeeds: the file then lags behind what
    /// the agent did, and `status` says so.
    write_error: Mutex<Option<String>>,
}

impl Journal {
    /// Opens the journal of `state_dir`, creating the directory. The directory must be one
    /// the agent may trust and `state.json` a file only it writes (it names processes to
    /// stop and GPUs to roll back); it is made private (it holds applied documents).
    pub fn open(state_dir: &Path) -> io::Result<Journal> {
        crate::sys::trusted::make_dir(state_dir, 0o755)
            .map_err(|why| io::Error::new(io::ErrorKind::PermissionDenied, why))?;
        let path = state_dir.join("state.json");
        make_private(&path)?;
        let mut state: AgentState = read_json(&path)?.unwrap_or_default();
        state.bound_documents();
        Ok(Journal { path, state: Mutex::new(state), write_error: Mutex::new(None) })
    }

    /// A copy of the journal's content.
    pub fn snapshot(&self) -> AgentState {
        self.state.lock().expect("journal lock").clone()
    }

    /// The profile last applied successfully.
    pub fn active_profile(&self) -> Option<String> {
        self.state.lock().expect("journal lock").active_profile.clone()
    }

    fn update(&self, change: impl FnOnce(&mut AgentState)) -> io::Result<()> {
        let mut state = self.state.lock().expect("journal lock");
        let mut next = state.clone();
        change(&mut next);
        if next != *state {
            let written = write_json(&self.path, &next, PRIVATE);
            let mut write_error = self.write_error.lock().expect("journal lock");
            *write_error =
                written.as_ref().err().map(|e| format!("writing {}: {e}", self.path.display()));
            written?;
            *state = next;
        }
        Ok(())
    }

    /// Why the last write of the journal failed, if it did (and none succeeded since).
    pub fn write_error(&self) -> Option<String> {
        self.write_error.lock().expect("journal lock").clone()
    }

    /// The active profile's document, when it was applied from one.
    pub fn active_document(&self) -> Option<ProfileDocument> {
        self.state.lock().expect("journal lock").active_document.clone()
    }

    /// Records the active profile outside a transaction (an apply that changed nothing:
    /// the GPUs match it, which settles a bench whose restore failed, as a commit does).
    pub fn set_active(
        &self,
        profile: Option<String>,
        document: Option<ProfileDocument>,
    ) -> io::Result<()> {
        self.update(|s| {
            s.active_profile = profile;
            s.active_document = document;
            settle_failed_bench(s);
        })
    }

    /// Begins a transaction.
    pub fn begin(&self, transaction: Transaction) -> io::Result<()> {
        self.update(|s| s.transaction = Some(transaction))
    }

    /// Records a completed step of the transaction.
    pub fn step_done(&self, index: usize) -> io::Result<()> {
        self.update(|s| {
            if let Some(t) = &mut s.transaction {
                t.completed.push(index);
            }
        })
    }

    /// Ends the transaction: its profile is active, unless it was a running bench's setup,
    /// which leaves the active profile as it is. A bench whose restore failed is settled by
    /// it: the newer apply wins.
    pub fn commit(&self) -> io::Result<()> {
        self.update(|s| {
            if let Some(t) = s.transaction.take()
                && !bench_setup(s, &t)
            {
                s.active_profile = Some(t.profile);
                s.active_document = t.document;
            }
            settle_failed_bench(s);
        })
    }

    /// Ends the transaction after a successful rollback: the previous profile is active
    /// (a bench's setup changed none).
    pub fn rolled_back(&self) -> io::Result<()> {
        self.update(|s| {
            if let Some(t) = s.transaction.take()
                && !bench_setup(s, &t)
            {
                s.active_profile = t.previous_profile;
                s.active_document = t.previous_document;
            }
        })
    }

    /// Records a bench in flight (before its first change).
    pub fn begin_bench(&self, record: BenchRecord) -> io::Result<()> {
        self.update(|s| s.bench = Some(record))
    }

    /// Records the bench's replicas running now.
    pub fn bench_replicas(&self, replicas: Vec<ReplicaHandle>) -> io::Result<()> {
        self.update(|s| {
            if let Some(b) = &mut s.bench {
                b.replicas = replicas;
            }
        })
    }

    /// Keeps the bench record, marked with its restore's failure. The active profile is
    /// the one committed last (a record of an agent before issue 27: the profile active
    /// before the bench, which its setups replaced); what the next start re-applies is
    /// never a bench's own setup.
    pub fn bench_restore_failed(&self, error: &str) -> io::Result<()> {
        self.update(|s| {
            if let Some(b) = &mut s.bench {
                b.restore_error = Some(error.to_string());
                if !b.keeps_active {
                    s.active_profile = b.previous_profile.clone();
                    s.active_document = b.previous_document.clone();
                }
            }
        })
    }

    /// Ends the bench, its GPU restored. The active profile stays the one committed last:
    /// an apply of another GPU that committed during the bench stays active (a record of
    /// an agent before issue 27: the profile it found active is active again). A setup of
    /// the bench whose rollback failed is settled by the restore and leaves the journal.
    pub fn end_bench(&self) -> io::Result<()> {
        self.update(|s| {
            let Some(b) = s.bench.take() else { return };
            if let Some(t) = &s.transaction
                && b.sets_up(t)
            {
                s.transaction = None;
            }
            if !b.keeps_active {
                s.active_profile = b.previous_profile;
                s.active_document = b.previous_document;
            }
        })
    }

    /// Keeps the transaction, marked with the rollback's failure; no profile is active
    /// (a running bench's setup leaves it: the bench restores its GPU at its end).
    pub fn rollback_failed(&self, error: &str) -> io::Result<()> {
        self.update(|s| {
            let setup = s.transaction.as_ref().is_some_and(|t| bench_setup(s, t));
            if !setup {
                s.active_profile = None;
                s.active_document = None;
            }
            if let Some(t) = &mut s.transaction {
                t.rollback_error = Some(error.to_string());
            }
        })
    }
}

/// Whether `transaction` is a setup of the bench `state` records as running.
fn bench_setup(state: &AgentState, transaction: &Transaction) -> bool {
    state.bench.as_ref().is_some_and(|b| b.sets_up(transaction))
}

/// Forgets a bench whose restore failed: an apply since has settled the GPUs.
fn settle_failed_bench(state: &mut AgentState) {
    if state.bench.as_ref().is_some_and(|b| b.restore_error.is_some()) {
        state.bench = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transaction() -> Transaction {
        Transaction {
            profile: "half-balanced".into(),
            document: None,
            previous_profile: Some("all-balanced".into()),
            previous_document: None,
            checkpoint: vec![],
            steps: vec!["GPU 4: disable MIG mode".into()],
            completed: vec![],
            rollback_error: None,
        }
    }

    #[test]
    fn commit_and_rollback_settle_the_active_profile_durably() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        journal.set_active(Some("all-balanced".into()), None).unwrap();
        journal.begin(transaction()).unwrap();
        journal.step_done(0).unwrap();
        let reopened = Journal::open(dir.path()).unwrap().snapshot();
        assert_eq!(reopened.transaction.as_ref().unwrap().completed, vec![0]);
        assert_eq!(reopened.active_profile.as_deref(), Some("all-balanced"));
        journal.commit().unwrap();
        assert_eq!(
            Journal::open(dir.path()).unwrap().snapshot(),
            AgentState {
                active_profile: Some("half-balanced".into()),
                active_document: None,
                transaction: None,
                bench: None
            }
        );
        journal
            .begin(Transaction { previous_profile: Some("half-balanced".into()), ..transaction() })
            .unwrap();
        journal.rolled_back().unwrap();
        assert_eq!(journal.active_profile().as_deref(), Some("half-balanced"));
        journal.begin(transaction()).unwrap();
        journal.rollback_failed("boom").unwrap();
        let state = Journal::open(dir.path()).unwrap().snapshot();
        assert_eq!(state.active_profile, None);
        assert_eq!(state.transaction.unwrap().rollback_error.as_deref(), Some("boom"));
    }

    #[test]
    fn a_failed_bench_restore_is_kept_until_an_apply_and_a_running_bench_is_not_settled() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        journal.set_active(Some("all-mps".into()), None).unwrap();
        let record = BenchRecord {
            job: "/io/gpushare/Agent1/jobs/3".into(),
            checkpoint: vec![],
            previous_profile: Some("all-mps".into()),
            previous_document: None,
            uid: 1000,
            replicas: vec![ReplicaHandle::Unit { name: "gpushare-bench-3-1.service".into() }],
            restore_error: None,
            // As an agent before issue 27 wrote it.
            keeps_active: false,
        };
        journal.begin_bench(record).unwrap();
        // The bench's own setups commit: the bench record stays.
        journal.begin(Transaction { profile: "bench-mps".into(), ..transaction() }).unwrap();
        journal.commit().unwrap();
        assert!(journal.snapshot().bench.is_some());
        journal.bench_restore_failed("boom").unwrap();
        let state = Journal::open(dir.path()).unwrap().snapshot();
        assert_eq!(state.active_profile.as_deref(), Some("all-mps"), "never a bench setup");
        let bench = state.bench.unwrap();
        assert_eq!(bench.restore_error.as_deref(), Some("boom"));
        assert_eq!(bench.replicas.len(), 1, "kept: an agent started later stops them");
        // The next apply, changing something or not, settles it.
        journal.set_active(Some("all-disabled".into()), None).unwrap();
        assert_eq!(Journal::open(dir.path()).unwrap().snapshot().bench, None);
    }

    fn checkpoint(gpu: u32) -> GpuCheckpoint {
        GpuCheckpoint {
            gpu,
            uuid: format!("GPU-{gpu}"),
            mig_enabled: false,
            instances: vec![],
            compute: vec![],
            compute_mode: ComputeMode::Default,
            mps: vec![],
            mps_compute: vec![],
            mps_multi_user: vec![],
            timeslice: None,
        }
    }

    /// Issue 27: a bench's setups are never the active profile, an apply of another GPU
    /// that commits during the bench stays active after it, and a setup whose rollback
    /// failed neither clears the active profile nor outlives the bench's restore.
    #[test]
    fn a_benchs_setups_leave_the_active_profile_to_the_applies_of_other_gpus() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        journal.set_active(Some("all-mps".into()), None).unwrap();
        let record = BenchRecord {
            job: "/io/gpushare/Agent1/jobs/3".into(),
            checkpoint: vec![checkpoint(0)],
            previous_profile: Some("all-mps".into()),
            previous_document: None,
            uid: 1000,
            replicas: vec![],
            restore_error: None,
            keeps_active: true,
        };
        journal.begin_bench(record.clone()).unwrap();
        let on = |gpu: u32, profile: &str| Transaction {
            profile: profile.into(),
            previous_profile: journal.active_profile(),
            checkpoint: vec![checkpoint(gpu)],
            ..transaction()
        };
        journal.begin(on(0, "bench-mps")).unwrap();
        journal.commit().unwrap();
        assert_eq!(journal.active_profile().as_deref(), Some("all-mps"), "a setup is no profile");
        journal.begin(on(0, "bench-mig")).unwrap();
        journal.rolled_back().unwrap();
        assert_eq!(journal.active_profile().as_deref(), Some("all-mps"));
        // Another GPU's apply, during the bench.
        journal.begin(on(1, "gpu1-mps")).unwrap();
        journal.commit().unwrap();
        assert_eq!(journal.active_profile().as_deref(), Some("gpu1-mps"));
        // A setup whose rollback fails: the active profile stays; the restore settles it.
        journal.begin(on(0, "bench-mps-limited")).unwrap();
        journal.rollback_failed("boom").unwrap();
        assert_eq!(journal.active_profile().as_deref(), Some("gpu1-mps"));
        journal.end_bench().unwrap();
        let state = Journal::open(dir.path()).unwrap().snapshot();
        assert_eq!(state.active_profile.as_deref(), Some("gpu1-mps"), "not the one before");
        assert_eq!((state.bench, state.transaction), (None, None));

        // An apply's own unsettled transaction is not the bench's to settle.
        journal.begin_bench(record.clone()).unwrap();
        journal.begin(on(1, "gpu1-exclusive")).unwrap();
        journal.rollback_failed("boom").unwrap();
        assert_eq!(journal.active_profile(), None);
        journal.end_bench().unwrap();
        assert!(journal.snapshot().transaction.is_some());

        // Once its restore failed, the bench's GPU is an apply's again: a commit sets the
        // active profile and settles the record.
        journal.rolled_back().unwrap();
        journal.begin_bench(record).unwrap();
        journal.bench_restore_failed("no").unwrap();
        journal.begin(on(0, "all-disabled")).unwrap();
        journal.commit().unwrap();
        let state = journal.snapshot();
        assert_eq!(state.active_profile.as_deref(), Some("all-disabled"));
        assert_eq!(state.bench, None);
    }

    #[test]
    fn an_unreadable_journal_is_an_error_not_a_fresh_start() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("state.json"), "{\"active_profile\": 3").unwrap();
        assert!(Journal::open(dir.path()).is_err());
    }
}
