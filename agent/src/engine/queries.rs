//! Status and queries: what the agent answers without changing anything. Owns what
//! `status` remembers between calls ([`Recall`]: the active profile as last parsed, the
//! drift last logged) and answers `status`, drift (logged by the health check), client
//! environments, plans, export, MIG tables, the CDI devices, profiles and validation.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use gpushare_proto::Strategy;
use gpushare_proto::types::{
    ClientEnv, Export, MigProfiles, ProfileDetail, ProfileList, Status, Validation,
};

use super::core::{self, ProfileRef};
use super::error::EngineError;
use super::gate::BOOT_JOB;
use super::health::Scope;
use super::jobs::BenchClaim;
use super::{Engine, clients, mig_profiles, report};
use crate::apply::Reads;
use crate::apply::journal::ProfileDocument;
use crate::node::NodeState;
use crate::plan::{self, Plan, PlanOptions};
use crate::profile::{self, Profile};

/// How long `status` waits for its client table (a few milliseconds when nothing stalls).
const STATUS_CLIENTS_DEADLINE: Duration = Duration::from_secs(1);

/// What `status` remembers between calls.
#[derive(Default)]
pub struct Recall {
    /// Whether the active profile time-slices, for the document it was last worked out
    /// from (a profile applied from a file is parsed once, not at every `status`).
    active_parsed: Mutex<Option<(ActiveProfile, Option<Arc<Profile>>)>>,
    /// The drift last logged, so that a change is logged once.
    drift_logged: Mutex<Option<String>>,
}

/// The active profile as the journal records it: a name, and the document it was applied
/// from (`apply -f`) if any.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ActiveProfile {
    name: String,
    document: Option<ProfileDocument>,
}

/// A bench as `status` shows it.
fn bench_status(claim: &BenchClaim) -> gpushare_proto::types::BenchStatus {
    let since = claim.since.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let running = claim.since.elapsed().unwrap_or_default();
    gpushare_proto::types::BenchStatus {
        job: claim.job.clone(),
        gpu: claim.gpu,
        uuid: claim.uuid.clone(),
        uid: claim.uid,
        user: claim.user.clone(),
        started_unix_seconds: since.as_secs(),
        running_seconds: running.as_secs(),
        profile_before: claim.profile_before.clone(),
        restores: claim.restores.clone(),
    }
}

impl Engine {
    /// The observed GPUs with their clients, the active profile and the job in progress.
    /// Time-slice intervals cost an nvidia-smi run, so they are read only when the active
    /// profile time-slices.
    pub async fn status(&self) -> Result<Status, EngineError> {
        self.status_with(true).await
    }

    /// [`Engine::status`] without the clients (no `/proc` read): what the metrics'
    /// refresh reads every few seconds, which has series of its own for clients.
    pub async fn status_without_clients(&self) -> Result<Status, EngineError> {
        self.status_with(false).await
    }

    async fn status_with(&self, with_clients: bool) -> Result<Status, EngineError> {
        let epoch = self.epoch();
        // Whether the journal's transaction is settled: none runs now (a bench's setup runs
        // with no job named). Read while no transaction can begin.
        let (journal, settled) = match self.transactions.try_turn() {
            Some(_idle) => (self.core.journal.snapshot(), true),
            None => (self.core.journal.snapshot(), false),
        };
        let running = self.running_job();
        let benches = self.gate.claims.all();
        let time_slices = self.active_time_slices(&journal);
        let reads = Reads { timeslices: time_slices, mps_clients: time_slices };
        let mut node = self.core.node.observe_shared(reads, epoch).await?;
        // The limits each control daemon applies now, in one control run per daemon (none
        // when the observation read them with the clients); on a GPU whose driver does not
        // name MPS clients (no MPS process list) the same run asks the daemon for them, so
        // that the clients are attributed.
        node = self.with_live_limits(node, with_clients).await?;
        let drift = (self.epoch() == epoch).then(|| self.drift_of(&node, &journal)).flatten();
        let profiles = self.core.profiles();
        let active_source = journal.active_profile.as_deref().map(|name| {
            match (&journal.active_document, profiles.get(name)) {
                // Sanitized as it entered; a journal of an older agent may hold anything.
                (Some(document), _) => crate::sys::text::printable(&document.origin, 4096),
                (None, Ok(stored)) => stored.source.to_string(),
                (None, Err(missing @ profile::Missing::Broken(_))) => missing.to_string(),
                (None, Err(_)) => "no longer known".to_string(),
            }
        });
        // A transaction the journal still holds while none runs was not settled: its
        // rollback failed, or its end could not be written. The next apply rolls it back.
        let rollback_error = journal.transaction.filter(|_| settled).map(|t| {
            t.rollback_error.unwrap_or_else(|| {
                let why = self.core.journal.write_error().map(|e| format!(" ({e})")).unwrap_or_default();
                format!(
                    "the journal still records the unfinished apply of {}{why}; the next apply rolls it back first",
                    t.profile
                )
            })
        });
        // A bench whose restore failed: the GPU is as the failure left it until an apply.
        let rollback_error = rollback_error.or_else(|| {
            let bench = journal.bench.as_ref()?;
            let error = bench.restore_error.as_ref()?;
            Some(format!(
                "restoring the GPU after the bench {} failed: {error}; the next apply settles it",
                bench.job
            ))
        });
        let restores = self.supervisor.restores();
        let cx = self.mps_context(&restores);
        let mut gpus: Vec<_> =
            node.gpus.iter().map(|g| report::gpu_status(g, &node, &cx)).collect();
        // A time-sliced GPU's replicas, as the views advertise them.
        let intent = self.transactions.views().intent();
        for g in gpus.iter_mut().filter(|g| g.sharing.interval.is_some()) {
            g.sharing.replicas = intent.replicas.get(&g.index).copied().flatten();
        }
        for g in &mut gpus {
            g.health = self.health_documents(g.index);
        }
        let clients = if with_clients { self.status_clients(&node).await } else { Vec::new() };
        for client in clients {
            if let Some(gpu) = gpus.iter_mut().find(|g| g.index == client.gpu) {
                gpu.clients.push(client);
            }
        }
        Ok(Status {
            active_profile: journal.active_profile,
            active_source,
            backend: self.backend_kind().as_str().to_string(),
            starting_up: running.as_ref().is_some_and(|job| job.id == BOOT_JOB),
            apply_in_progress: running.map(|job| job.to_string()),
            rollback_error,
            apply_error: intent.error,
            hands_off: self.gate.hands_off_reason().map(str::to_string),
            drift,
            start_up_error: self
                .start_up_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            benches: benches.iter().map(bench_status).collect(),
            health_events: self.health().events_note(),
            gpus,
        })
    }

    /// The clients `status` shows: the observation's, as `Clients` shows them to anyone
    /// (`clients::Viewer::Anyone`: every caller shares one `Status`, so no command line, no
    /// share from a client's environment, and under `hidepid` no user, unit or container
    /// of anyone's). The driver names the MPS clients
    /// among its processes, so no MPS control daemon is asked. Read in `/proc` off the
    /// async threads; nothing to read when no process uses a GPU.
    /// Best-effort: a failure is logged and shows no client, never fails `status`.
    async fn status_clients(
        &self,
        node: &crate::node::NodeState,
    ) -> Vec<gpushare_proto::clients::GpuClient> {
        let anyone = node.gpus.iter().any(|g| !g.processes.is_empty())
            || node.mps.iter().any(|s| !s.clients.is_empty());
        if !anyone {
            return Vec::new();
        }
        // The shares shown are those the servers give their clients now. Every caller
        // shares one Status: each client as anyone may see it. A stalled read in /proc
        // leaves status without clients (`status` reads no process's memory since issue
        // 36, but the deadline stays for whatever else in /proc might wait).
        let node = node.with_live_limits();
        match clients::table_within(node, clients::Viewer::Anyone, STATUS_CLIENTS_DEADLINE).await {
            Ok(table) => {
                if table.left_out > 0 {
                    tracing::debug!(left_out = table.left_out, "status lists the first clients");
                }
                table.clients
            }
            Err(why @ clients::Unanswered::Stalled) => {
                tracing::debug!("status without clients: {why}");
                Vec::new()
            }
            Err(why) => {
                tracing::warn!("status without clients: {why}");
                Vec::new()
            }
        }
    }

    /// Whether the active profile time-slices a whole GPU, whether it was applied by
    /// name or from a document: only then is an nvidia-smi run worth it for `status`.
    fn active_time_slices(&self, journal: &crate::apply::journal::AgentState) -> bool {
        if journal.active_profile.is_none() {
            return false;
        }
        // A profile that cannot be read any more: read the intervals rather than guess.
        self.active_profile_parsed(journal).is_none_or(|p| {
            p.rules.iter().any(|r| matches!(r.sharing, profile::Sharing::TimeSlicing { .. }))
        })
    }

    /// The active profile as parsed, for the document or profile store it was last worked
    /// out from (a profile applied from a file is parsed once, not at every `status`).
    fn active_profile_parsed(
        &self,
        journal: &crate::apply::journal::AgentState,
    ) -> Option<Arc<Profile>> {
        let name = journal.active_profile.as_ref()?;
        let mut cached = self.recall.active_parsed.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((key, parsed)) = cached.as_ref()
            && key.name == *name
            && key.document == journal.active_document
        {
            return parsed.clone();
        }
        let active =
            ActiveProfile { name: name.clone(), document: journal.active_document.clone() };
        let profile = match &active.document {
            Some(d) => self.core.resolve(ProfileRef::of_document(d)).ok(),
            None => self.core.profiles().get(&active.name).ok().map(|p| p.profile.clone()),
        }
        .map(Arc::new);
        *cached = Some((active, profile.clone()));
        profile
    }

    /// How `node` differs from the active profile: the steps that would apply it again, in
    /// one line; `None` when it matches, when none is active, or while a job runs (its
    /// changes are the agent's own). A benched GPU is left out: its sharing is the bench's
    /// until the bench puts it back. MPS limits a control daemon answers otherwise than the
    /// agent set them (where `node` has them read) plan a step that puts them back.
    fn drift_of(
        &self,
        node: &NodeState,
        journal: &crate::apply::journal::AgentState,
    ) -> Option<String> {
        if self.running_job().is_some() || journal.transaction.is_some() {
            return None;
        }
        let name = journal.active_profile.as_ref()?;
        let profile = self.active_profile_parsed(journal)?;
        let options = PlanOptions { force: true, ..self.core.policy };
        match plan::plan(node, &profile, &options) {
            Ok(plan) => {
                // An interval that was not read (nvidia-smi is run only where one matters)
                // is no evidence of drift.
                let steps: Vec<&plan::Step> = plan
                    .gpus
                    .iter()
                    .filter(|g| !self.gate.claims.holds(g.gpu))
                    .flat_map(|g| &g.steps)
                    .filter(|s| match s {
                        plan::Step::SetTimeslice { gpu, .. } => node.timeslice(*gpu).is_some(),
                        _ => true,
                    })
                    .collect();
                if steps.is_empty() {
                    return None;
                }
                let shown: Vec<String> = steps.iter().take(3).map(ToString::to_string).collect();
                let more = steps.len() - shown.len();
                let more = if more > 0 { format!(", and {more} more") } else { String::new() };
                let count = steps.len();
                let noun = if count == 1 { "step" } else { "steps" };
                Some(format!(
                    "the GPUs no longer match the active profile {name} (changed outside gpushare?): applying it again would take {count} {noun} ({}{more}); see `gpushare-ctl plan {name}`",
                    shown.join("; ")
                ))
            }
            // A benched GPU may be what the plan fails on.
            Err(_) if !self.gate.claims.is_empty() => None,
            Err(e) => Some(format!(
                "the GPUs no longer match the active profile {name}, which cannot be applied to them as they are: {e}"
            )),
        }
    }

    /// Logs drift from the active profile once when it appears, and once when it is gone
    /// (called by the health check: something else changed the GPUs behind the agent).
    pub async fn log_drift(&self) {
        // Not while a job or a transaction changes the GPUs: its changes are no drift.
        let Some(_moment) = self.gate.try_moment("the health check's look for drift") else {
            return;
        };
        let Some(_turn) = self.transactions.try_turn() else { return };
        let Ok(node) = self.core.node.observe_shared(Reads::GPUS_AND_SERVERS, self.epoch()).await
        else {
            return;
        };
        // Limits changed behind the agent's back are drift too (read as the health check
        // just read them: one control run per daemon at most).
        let Ok(node) = self.core.node.read_live_limits(node, |_| false).await else { return };
        let journal = self.core.journal.snapshot();
        let drift = self.drift_of(&node, &journal);
        let mut logged = self.recall.drift_logged.lock().unwrap_or_else(PoisonError::into_inner);
        if *logged != drift {
            match &drift {
                Some(how) => tracing::warn!("{how}"),
                None if logged.is_some() => {
                    tracing::info!("the GPUs match the active profile again")
                }
                None => {}
            }
            *logged = drift;
        }
    }

    /// The variables a client needs for `target`: a GPU index or `GPU-…`, or `MIG-…`.
    pub async fn client_env(&self, target: &str) -> Result<ClientEnv, EngineError> {
        let node = self.core.node.observe_shared(Reads::GPUS_AND_SERVERS, self.epoch()).await?;
        self.env_for(&node, target).map(|(env, _)| env)
    }

    /// The client environment of `target` in `node`, and the GPU index it belongs to.
    pub(super) fn env_for(
        &self,
        node: &NodeState,
        target: &str,
    ) -> Result<(ClientEnv, u32), EngineError> {
        let found = if let Ok(index) = target.parse::<u32>() {
            node.gpu(index).map(|g| (g.uuid.clone(), g.index))
        } else {
            node.gpus.iter().find_map(|g| {
                if g.uuid.eq_ignore_ascii_case(target) {
                    return Some((g.uuid.clone(), g.index));
                }
                g.instances
                    .iter()
                    .flat_map(|gi| &gi.compute_instances)
                    .find(|ci| ci.uuid.eq_ignore_ascii_case(target))
                    .map(|ci| (ci.uuid.clone(), g.index))
            })
        };
        let (uuid, gpu) = found.ok_or_else(|| {
            EngineError::InvalidArgument(crate::plan::no_such_gpu(node, target, true))
        })?;
        // CUDA sees no device through a MIG GPU's own UUID: only its instances can be used.
        if let Some(g) = node.gpu(gpu).filter(|g| g.mig_enabled && g.uuid == uuid) {
            let instances: Vec<&str> = g
                .instances
                .iter()
                .flat_map(|gi| &gi.compute_instances)
                .map(|ci| ci.uuid.as_str())
                .collect();
            return Err(EngineError::InvalidArgument(if instances.is_empty() {
                format!(
                    "GPU {gpu} has MIG on and no MIG instances, so no client can use it (see gpushare-ctl status)"
                )
            } else {
                format!("GPU {gpu} has MIG on: pick an instance: {}", instances.join(", "))
            }));
        }
        let mut variables = vec![("CUDA_VISIBLE_DEVICES".to_string(), uuid.clone())];
        let served = node.mps.iter().any(|s| s.uuid == uuid && s.pid.is_some());
        if served {
            variables.push((
                "CUDA_MPS_PIPE_DIRECTORY".to_string(),
                self.core.node.sharing.mps.pipe_dir(&uuid).display().to_string(),
            ));
        }
        let strategy = match (served, node.time_sliced(gpu)) {
            (true, _) => Strategy::Mps,
            (false, Some(_)) => Strategy::TimeSlicing,
            (false, None) => Strategy::Exclusive,
        };
        Ok((ClientEnv { uuid, strategy: strategy.as_str().into(), variables }, gpu))
    }

    /// The GPUs as they are, as a profile (sharing included) and as a mig-parted file; the
    /// profile is planned against the node it came from, and any step left is a note.
    pub async fn export(&self) -> Result<Export, EngineError> {
        let node = self.core.node.observe_shared(Reads::FOR_PLANNING, self.epoch()).await?;
        let mut exported = profile::export::export(&node);
        // The proof: the export planned against the node it came from, with this agent's
        // settings; any step left is said, whatever the writer missed.
        let text = exported.text();
        let left = profile::parse_profile(&text, "exported.toml", None)
            .map_err(|e| e.to_string())
            .and_then(|p| plan::plan(&node, &p, &self.core.policy).map_err(|e| e.to_string()));
        match left {
            Ok(plan) if plan.is_empty() => {}
            Ok(plan) => {
                let mut steps: Vec<String> = plan.steps().take(8).map(|s| s.to_string()).collect();
                if plan.step_count() > steps.len() {
                    steps.push(format!("and {} more", plan.step_count() - steps.len()));
                }
                exported.notes.push(format!("applying this here takes: {}", steps.join("; ")));
            }
            Err(e) => exported.notes.push(format!("applying this here fails: {e}")),
        }
        // What NVIDIA's device plugin and NFD are given, as the GPUs are now: what the kept
        // views write, but for faults (issue 42): a kept view leaves a faulted GPU or
        // instance out until it clears, an export describes the layout whole.
        let views = self.transactions.views();
        let (device_plugin, labels) = views.texts(&node);
        let (device_plugin, device_plugin_refused) = match device_plugin {
            Ok(text) => (text, None),
            Err(why) => (String::new(), Some(why)),
        };
        let (slurm, slurm_refused) = match views.slurm_text(&self.core.node, &node).await {
            Ok(text) => (text, None),
            Err(why) => (String::new(), Some(why)),
        };
        Ok(Export {
            text: exported.text(),
            mig_parted: exported.mig_parted,
            notes: exported.notes,
            mig_parted_left_out: exported.left_out,
            device_plugin,
            device_plugin_refused,
            labels,
            slurm,
            slurm_refused,
        })
    }

    /// The MIG profiles of the GPU `gpu` names (index or `GPU-…`), or of every MIG GPU
    /// for `""`: see [`mig_profiles`].
    pub async fn mig_profiles(&self, gpu: &str) -> Result<MigProfiles, EngineError> {
        let node = self.core.node.observe_shared(Reads::GPUS_AND_SERVERS, self.epoch()).await?;
        mig_profiles::mig_profiles(&node, gpu)
    }

    /// The devices of the CDI spec as last built.
    pub fn cdi_devices(&self) -> gpushare_proto::cdi::CdiReport {
        self.transactions.views().cdi().report()
    }

    /// Every known profile.
    pub fn list_profiles(&self) -> ProfileList {
        let active = self.active_by_name();
        let profiles = self.core.profiles();
        ProfileList {
            profiles: profiles.iter().map(|p| report::summary(p, active.as_deref())).collect(),
            errors: profiles.errors().to_vec(),
        }
    }

    /// One profile with its text.
    pub fn show_profile(&self, name: &str) -> Result<ProfileDetail, EngineError> {
        let profiles = self.core.profiles();
        let stored = profiles.get(name).map_err(core::missing_profile)?;
        Ok(ProfileDetail {
            summary: report::summary(stored, self.active_by_name().as_deref()),
            text: stored.text.clone(),
        })
    }

    /// The active profile when it was applied by name: one applied from a file is not
    /// the known profile of the same name, whatever the file calls it.
    fn active_by_name(&self) -> Option<String> {
        let journal = self.core.journal.snapshot();
        journal.active_profile.filter(|_| journal.active_document.is_none())
    }

    /// Parses profile text and plans it against this node, changing nothing.
    pub async fn validate(&self, text: &str, origin: &str) -> Result<Validation, EngineError> {
        let profile =
            self.core.resolve_request(ProfileRef::Document { text, origin, config: "" }).await?;
        let node = self.observe().await?;
        let (plan, node, profile) = self.core.plan_request(node, profile, self.core.policy).await?;
        self.transactions.views().expressible(&plan, &node).map_err(EngineError::NotPossible)?;
        Ok(Validation { name: profile.name, plan: plan.report() })
    }

    /// Plans a profile against a fresh observation; refused where an apply of it would be
    /// refused before its first step (a fault on a GPU it would build on, the host).
    pub async fn plan(&self, profile: ProfileRef<'_>) -> Result<Plan, EngineError> {
        let profile = self.core.resolve_request(profile).await?;
        let node = self.core.node.observe_shared(Reads::FOR_PLANNING, self.epoch()).await?;
        let (plan, node, _) = (self.core.plan_request(node, profile, self.core.policy).await)
            .map_err(|e| self.lost_first(e))?;
        let plan = self.unhealthy_scope(plan, &node, Scope::Whole)?;
        self.core.check_host(&plan, &node).await?;
        self.transactions.views().expressible(&plan, &node).map_err(EngineError::NotPossible)?;
        Ok(plan)
    }
}
