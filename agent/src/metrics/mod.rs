//! Prometheus metrics: what the agent did (applies, probes) and what the GPUs
//! are now (sharing, MIG instances, MPS servers).
//!
//! The engine knows nothing of metrics: [`follow`] listens to its events, counts finished
//! jobs from them, and after every job, every health check and every change of the GPUs'
//! faults reads the same documents the D-Bus interface returns ([`Status`],
//! [`MpsStatus`]) and turns them into series; the fault counters come from the registry's
//! totals ([`crate::health::Health::totals`]).
//! [`install`] serves them over HTTP ([`endpoint`]: `/metrics`, by default on
//! `127.0.0.1:9847`, connections capped and timed out).
//!
//! # Names
//!
//! Every name starts with `gpushare_`, values are in base units (`_seconds`, `_bytes`,
//! ratios 0-1), counters end in `_total`, metadata series end in `_info` and are always 1.
//! States are 0/1 gauges with one series per possible value (the current one 1, the others
//! 0), so a change of state changes values, never which series exist.
//!
//! | name | type | labels | value |
//! |---|---|---|---|
//! | `gpushare_build_info` | gauge | `version` | 1 |
//! | `gpushare_applies_total` | counter | `profile`, `result` | finished applies; `result` is `success` (GPUs changed), `unchanged` (already in place), `rolled_back` (failed and restored), `failed` (anything else: refused by a hook, journal not written, rollback failed) |
//! | `gpushare_apply_duration_seconds` | histogram | `result` | wall time of finished applies |
//! | `gpushare_rollbacks_total` | counter | | applies that failed and were rolled back |
//! | `gpushare_apply_failures_total` | counter | | applies that did not succeed (`failed` + `rolled_back`) |
//! | `gpushare_apply_in_progress` | gauge | | 1 while an apply changes the GPUs (not while a probe runs) |
//! | `gpushare_rollback_failed` | gauge | | 1 while the GPUs may be between layouts (an apply failed and so did its rollback) |
//! | `gpushare_profile_drift` | gauge | | 1 while the GPUs no longer match the active profile (something else changed them) |
//! | `gpushare_active_profile_info` | gauge | `profile` | 1 for the profile last applied, 0 for one that was before |
//! | `gpushare_gpu_info` | gauge | `gpu`, `UUID`, `model_name` | 1 |
//! | `gpushare_gpu_mig_enabled` | gauge | `gpu`, `UUID` | 1 when MIG mode is on |
//! | `gpushare_gpu_mig_reset_pending` | gauge | `gpu`, `UUID` | 1 when a MIG mode change waits for a GPU reset |
//! | `gpushare_gpu_compute_mode` | gauge | `gpu`, `UUID`, `mode` | 1 for the current mode (`default`, `exclusive_process`, `prohibited`) |
//! | `gpushare_gpu_sharing` | gauge | `gpu`, `UUID`, `strategy` | 1 for how the whole GPU is shared (`exclusive`, `time-slicing`, `mps`); all 0 while MIG is on (instances are shared instead) |
//! | `gpushare_gpu_instances` | gauge | `gpu`, `UUID` | MIG instances on the GPU |
//! | `gpushare_mig_instance_sharing` | gauge | `gpu`, `UUID`, `GPU_I_PROFILE`, `GPU_I_ID`, `strategy` | 1 for how the instance is shared |
//! | `gpushare_mps_server_up` | gauge | `gpu`, `UUID`, `GPU_I_ID` | 1 while the MPS control daemon runs |
//! | `gpushare_mps_server_restarts_total` | counter | `gpu`, `UUID`, `GPU_I_ID` | restarts by the supervisor |
//! | `gpushare_mps_clients` | gauge | `gpu`, `UUID`, `GPU_I_ID` | client processes of the server |
//! | `gpushare_mps_active_thread_ratio` | gauge | `gpu`, `UUID`, `GPU_I_ID` | the active thread share (0-1) a client connecting now gets, as the control daemon answers it (live: a `mps limit` override or a change behind the agent's back shows) |
//! | `gpushare_mps_pinned_memory_limit_bytes` | gauge | `gpu`, `UUID`, `GPU_I_ID` | the pinned device memory limit a client connecting now gets, live as above; absent when none |
//! | `gpushare_mps_limits_drift` | gauge | `gpu`, `UUID`, `GPU_I_ID` | 1 while the control daemon applies other limits than the agent set (neither the profile's nor a recorded `mps limit` override): changed outside gpushare |
//! | `gpushare_mps_limit_restores_total` | counter | `gpu`, `UUID`, `GPU_I_ID` | drifted limits the health check put back |
//! | `gpushare_mps_multi_user` | gauge | `gpu`, `UUID`, `GPU_I_ID` | 1 when the daemon serves every user's clients at once (multi-user), 0 when one user's at a time |
//! | `gpushare_probe_scaling_ratio` | gauge | `gpu`, `UUID`, `workload`, `clients`, `strategy` | the last probe's work done by N clients together over one alone |
//! | `gpushare_probe_fairness_ratio` | gauge | `gpu`, `UUID`, `workload`, `clients`, `strategy` | Jain's fairness index of the clients' throughputs (1 = all equal) |
//! | `gpushare_probe_p50_latency_inflation_ratio` | gauge | `gpu`, `UUID`, `workload`, `clients`, `strategy` | the clients' median step latency over the solo one |
//! | `gpushare_gpu_healthy` | gauge | `gpu` | 1 while no fault covers the GPU or one of its MIG instances, 0 otherwise (issue 42) |
//! | `gpushare_gpu_faults` | gauge | `gpu`, `class` | the GPU's active faults (its instances' included) per class (`xid`, `double-bit-ecc`, `gpu-lost`, `row-remap-pending`, `row-remap-failure`, `retired-pages-pending`, `recovery-action`, `mps-server-died`); every class at 0 from the GPU's first refresh |
//! | `gpushare_health_faults_total` | counter | `class` | faults raised since the agent started, per class (every event of an Xid, ECC or dead MPS server; a reading's fault once per onset) |
//! | `gpushare_health_informational_total` | counter | | driver events kept as informational since the agent started (an Xid the table does not know, a single-bit ECC error) |
//! | `gpushare_client_gpu_memory_bytes` | gauge | `gpu`, `UUID`, `GPU_I_ID`, `via`, `user`, `unit` | GPU memory of the clients with these labels, summed ([`clients`]) |
//! | `gpushare_client_mps_active_thread_ratio` | gauge | `gpu`, `UUID`, `GPU_I_ID`, `via`, `user`, `unit` | the highest active thread share (0-1) of those MPS clients |
//! | `gpushare_client_series_dropped_total` | counter | | client label sets left out by the cap (`[metrics] client_series_max`, 256), counted at each refresh |
//!
//! # Labels
//!
//! GPU labels are dcgm-exporter's, so that series join with its own: `gpu` is the NVML
//! index, `UUID` the GPU's `GPU-…` (for MIG instances and their MPS servers too: the parent
//! GPU's, as dcgm-exporter does), `GPU_I_PROFILE` and `GPU_I_ID` the MIG instance's
//! profile name and NVML GPU instance id. The model is `model_name`, not dcgm-exporter's
//! `modelName`: `promtool check metrics` rejects camelCase label names, and the model is
//! metadata, not a join key. `GPU_I_ID` is empty for an MPS
//! server of a whole GPU. Every label is bounded by the hardware, the profile names or a
//! fixed set of values: no pids, job ids or error texts.
//!
//! # Series that go away
//!
//! The exporter cannot remove a series, so a series that a new state no longer has (a
//! destroyed MIG instance, a stopped MPS server, the profile applied before) is kept at a
//! neutral value: 0 for states and counts, NaN (no value) for limits and ratios. Series
//! thus stay few and stable: instances come and go with MIG layouts, which are few. The
//! client series ([`clients`]) are the exception: rendered beside the recorder's, they go
//! with their last client, and a cap bounds them.

pub mod clients;
pub mod endpoint;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use gpushare_proto::types::{GpuStatus, InstanceStatus, MpsServer, MpsStatus, ProbeReport, Status};
use gpushare_proto::{ServerState, Strategy};
use metrics::{
    Label, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tokio::sync::broadcast::error::RecvError;

use crate::engine::{Engine, EngineEvent, JobKind, JobResult};
use crate::health::CLASSES;

const BUILD_INFO: &str = "gpushare_build_info";
const APPLIES: &str = "gpushare_applies_total";
const APPLY_DURATION: &str = "gpushare_apply_duration_seconds";
const ROLLBACKS: &str = "gpushare_rollbacks_total";
const APPLY_FAILURES: &str = "gpushare_apply_failures_total";
const APPLY_IN_PROGRESS: &str = "gpushare_apply_in_progress";
const ROLLBACK_FAILED: &str = "gpushare_rollback_failed";
const PROFILE_DRIFT: &str = "gpushare_profile_drift";
const ACTIVE_PROFILE: &str = "gpushare_active_profile_info";
const GPU_INFO: &str = "gpushare_gpu_info";
const GPU_MIG_ENABLED: &str = "gpushare_gpu_mig_enabled";
const GPU_MIG_RESET_PENDING: &str = "gpushare_gpu_mig_reset_pending";
const GPU_COMPUTE_MODE: &str = "gpushare_gpu_compute_mode";
const GPU_SHARING: &str = "gpushare_gpu_sharing";
const GPU_INSTANCES: &str = "gpushare_gpu_instances";
const INSTANCE_SHARING: &str = "gpushare_mig_instance_sharing";
const MPS_UP: &str = "gpushare_mps_server_up";
const MPS_RESTARTS: &str = "gpushare_mps_server_restarts_total";
const MPS_CLIENTS: &str = "gpushare_mps_clients";
const MPS_THREADS: &str = "gpushare_mps_active_thread_ratio";
const MPS_PINNED: &str = "gpushare_mps_pinned_memory_limit_bytes";
const MPS_LIMITS_DRIFT: &str = "gpushare_mps_limits_drift";
const MPS_LIMIT_RESTORES: &str = "gpushare_mps_limit_restores_total";
const MPS_MULTI_USER: &str = "gpushare_mps_multi_user";
const PROBE_SCALING: &str = "gpushare_probe_scaling_ratio";
const PROBE_FAIRNESS: &str = "gpushare_probe_fairness_ratio";
const PROBE_P50_INFLATION: &str = "gpushare_probe_p50_latency_inflation_ratio";
const GPU_HEALTHY: &str = "gpushare_gpu_healthy";
const GPU_FAULTS: &str = "gpushare_gpu_faults";
const HEALTH_FAULTS: &str = "gpushare_health_faults_total";
const HEALTH_INFORMATIONAL: &str = "gpushare_health_informational_total";

/// Upper bounds of the apply duration buckets: an unchanged apply takes milliseconds, a
/// MIG layout change on several GPUs minutes.
const APPLY_BUCKETS: &[f64] =
    &[0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];

/// Compute modes, as [`GpuStatus::compute_mode`] names them.
const COMPUTE_MODES: [&str; 3] = ["default", "exclusive_process", "prohibited"];

/// Installs the global recorder, serves it on `listen` ([`endpoint`]) and describes every
/// metric.
///
/// Call it once, from within the agent's tokio runtime: the endpoint and the upkeep run as
/// tasks on it. The address is bound here, so an address in use is an error now, not
/// later.
pub fn install(listen: SocketAddr) -> Result<(), String> {
    let failed = |e: &dyn std::fmt::Display| format!("serving metrics on {listen}: {e}");
    let listener = std::net::TcpListener::bind(listen)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .and_then(tokio::net::TcpListener::from_std)
        .map_err(|e| failed(&e))?;
    let handle = builder().install_recorder().map_err(|e| failed(&e))?;
    // Histograms and expiry are kept up between scrapes, as the exporter's own listener did.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(UPKEEP_EVERY).await;
            upkeep.run_upkeep();
        }
    });
    tokio::spawn(endpoint::serve(listener, handle));
    register();
    Ok(())
}

/// How often the recorder's upkeep runs.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The exporter's configuration, shared by [`install`] and the tests.
fn builder() -> PrometheusBuilder {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(APPLY_DURATION.to_string()), APPLY_BUCKETS)
        .expect("the bucket list is not empty")
}

/// Describes every metric to the current recorder and creates the series that must exist
/// before the first event (so that `increase()` over them works from the start).
fn register() {
    describe_gauge!(BUILD_INFO, "The agent's version; always 1.");
    describe_counter!(
        APPLIES,
        Unit::Count,
        "Finished applies, by profile and result (success, unchanged, rolled_back, failed)."
    );
    describe_histogram!(APPLY_DURATION, Unit::Seconds, "Wall time of finished applies, by result.");
    describe_counter!(
        ROLLBACKS,
        Unit::Count,
        "Applies that failed and whose changes were rolled back."
    );
    describe_counter!(
        APPLY_FAILURES,
        Unit::Count,
        "Applies that did not succeed (failed or rolled back)."
    );
    describe_gauge!(APPLY_IN_PROGRESS, "1 while an apply is changing the GPUs.");
    describe_gauge!(
        ROLLBACK_FAILED,
        "1 when an apply failed and so did its rollback: the GPUs may be between layouts (see gpushare-ctl status)."
    );
    describe_gauge!(
        PROFILE_DRIFT,
        "1 while the GPUs no longer match the active profile: something else changed them (see gpushare-ctl status)."
    );
    describe_gauge!(
        ACTIVE_PROFILE,
        "1 for the profile last applied successfully; 0 for one active before."
    );
    describe_gauge!(GPU_INFO, "GPU metadata; always 1.");
    describe_gauge!(GPU_MIG_ENABLED, "1 when MIG mode is on.");
    describe_gauge!(
        GPU_MIG_RESET_PENDING,
        "1 when a MIG mode change takes effect only at the next GPU reset."
    );
    describe_gauge!(GPU_COMPUTE_MODE, "1 for the GPU's current compute mode, 0 for the others.");
    describe_gauge!(
        GPU_SHARING,
        "1 for how the whole GPU is shared (exclusive, time-slicing, mps), 0 for the others; all 0 while MIG is on."
    );
    describe_gauge!(GPU_INSTANCES, Unit::Count, "MIG instances on the GPU.");
    describe_gauge!(
        INSTANCE_SHARING,
        "1 for how the MIG instance is shared (exclusive, time-slicing, mps), 0 for the others."
    );
    describe_gauge!(MPS_UP, "1 while the MPS control daemon of the GPU or MIG instance runs.");
    describe_counter!(
        MPS_RESTARTS,
        Unit::Count,
        "Restarts of the MPS control daemon by the supervisor."
    );
    describe_gauge!(MPS_CLIENTS, Unit::Count, "Client processes of the MPS server.");
    describe_gauge!(
        MPS_THREADS,
        "Active thread share (0-1) an MPS client connecting now gets, as the control daemon answers it."
    );
    describe_gauge!(
        MPS_PINNED,
        Unit::Bytes,
        "Pinned device memory limit an MPS client connecting now gets, as the control daemon answers it; absent when there is none."
    );
    describe_gauge!(
        MPS_LIMITS_DRIFT,
        "1 while the MPS control daemon applies other limits than gpushare set (changed outside gpushare)."
    );
    describe_counter!(
        MPS_LIMIT_RESTORES,
        Unit::Count,
        "MPS limits changed outside gpushare that the health check put back."
    );
    describe_gauge!(
        MPS_MULTI_USER,
        "1 when the MPS control daemon serves every user's clients at once (multi-user), 0 when one user's at a time."
    );
    describe_gauge!(
        PROBE_SCALING,
        "Last probe: work done by N clients together over one client alone."
    );
    describe_gauge!(
        PROBE_FAIRNESS,
        "Last probe: Jain's fairness index of the clients' throughputs (1 = all equal)."
    );
    describe_gauge!(
        PROBE_P50_INFLATION,
        "Last probe: the clients' median step latency over the solo client's."
    );
    describe_gauge!(
        GPU_HEALTHY,
        "1 while no fault covers the GPU or one of its MIG instances, 0 otherwise (see gpushare-ctl status)."
    );
    describe_gauge!(
        GPU_FAULTS,
        Unit::Count,
        "Active faults on the GPU and its MIG instances, by class."
    );
    describe_counter!(
        HEALTH_FAULTS,
        Unit::Count,
        "Faults the driver raised since the agent started, by class."
    );
    describe_counter!(
        HEALTH_INFORMATIONAL,
        Unit::Count,
        "Driver events kept as informational since the agent started (an unknown Xid, a single-bit ECC error)."
    );

    clients::register();
    gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    counter!(ROLLBACKS).increment(0);
    counter!(APPLY_FAILURES).increment(0);
    gauge!(APPLY_IN_PROGRESS).set(0.0);
    gauge!(ROLLBACK_FAILED).set(0.0);
    gauge!(PROFILE_DRIFT).set(0.0);
    record_health_totals(&BTreeMap::new(), 0);
}

/// Follows the engine's events: counts finished applies and probes and marks an apply in
/// progress the moment the engine reports it (on the engine's own task, not whenever a
/// background task gets to it), and refreshes the state series after every job and every
/// health check. Listening starts before this returns, so no later event is missed.
pub fn follow(engine: Arc<Engine>) -> tokio::task::JoinHandle<()> {
    engine.on_event(record_event);
    let mut events = engine.subscribe();
    tokio::spawn(async move {
        loop {
            match events.recv().await {
                // A missed event may have been one of these: refresh to be sure.
                Ok(
                    EngineEvent::JobEnded { .. }
                    | EngineEvent::HealthChecked
                    | EngineEvent::HealthChanged
                    | EngineEvent::MpsChanged,
                )
                | Err(RecvError::Lagged(_)) => refresh(&engine).await,
                Ok(_) => {}
                Err(RecvError::Closed) => return,
            }
        }
    })
}

/// What an event changes at once: an apply in progress, the job counters, probe results.
fn record_event(event: &EngineEvent) {
    match event {
        EngineEvent::JobStarted { kind: JobKind::Apply { .. }, .. } => {
            gauge!(APPLY_IN_PROGRESS).set(1.0);
        }
        EngineEvent::JobEnded { kind: JobKind::Apply { .. } } => {
            gauge!(APPLY_IN_PROGRESS).set(0.0);
        }
        EngineEvent::ApplyFinished { profile, result, duration } => {
            record_apply(profile, *result, *duration);
        }
        EngineEvent::ProbeFinished { report: Some(report), .. } => record_probe(report),
        _ => {}
    }
}

/// Brings the state series up to date with a fresh status. The MPS servers first: their
/// read of each control daemon (limits and clients) answers the status's right after it.
async fn refresh(engine: &Engine) {
    let (totals, informational) = engine.health().totals();
    record_health_totals(&totals, informational);
    let mps = engine.mps_status().await;
    match (engine.status_without_clients().await, mps) {
        (Ok(status), Ok(mps)) => update_state(&status, &mps),
        (Err(e), _) | (_, Err(e)) => tracing::debug!("metrics not refreshed: {e}"),
    }
}

/// Sets the fault counters to the registry's totals since the agent started
/// ([`crate::health::Health::totals`]): every class of [`CLASSES`] has its series, 0
/// before its first fault. The totals only grow, so the counters are set to them.
fn record_health_totals(totals: &BTreeMap<&'static str, u64>, informational: u64) {
    for class in CLASSES {
        let total = totals.get(class).copied().unwrap_or(0);
        counter!(HEALTH_FAULTS, "class" => *class).absolute(total);
    }
    counter!(HEALTH_INFORMATIONAL).absolute(informational);
}

/// Records a probe's results: per workload, client count and sharing strategy, the
/// aggregate scaling, Jain's fairness index and the p50 latency inflation of the last run.
pub fn record_probe(report: &ProbeReport) {
    for run in &report.runs {
        let labels = [
            ("gpu", report.gpu.to_string()),
            ("UUID", report.target.clone()),
            ("workload", run.workload.clone()),
            ("clients", run.clients.to_string()),
            ("strategy", report.strategy.clone()),
        ];
        gauge!(PROBE_SCALING, &labels).set(run.scaling);
        gauge!(PROBE_FAIRNESS, &labels).set(run.jain_fairness);
        gauge!(PROBE_P50_INFLATION, &labels).set(run.p50_inflation);
    }
}

/// Counts a finished apply (the boot re-apply included): `gpushare_applies_total`,
/// `gpushare_apply_duration_seconds`, and `gpushare_rollbacks_total` /
/// `gpushare_apply_failures_total` when it did not succeed.
pub fn record_apply(profile: &str, result: JobResult, duration: Duration) {
    counter!(APPLIES, "profile" => profile.to_string(), "result" => result.as_str()).increment(1);
    histogram!(APPLY_DURATION, "result" => result.as_str()).record(duration.as_secs_f64());
    match result {
        JobResult::Success | JobResult::Unchanged => {}
        JobResult::RolledBack => {
            counter!(ROLLBACKS).increment(1);
            counter!(APPLY_FAILURES).increment(1);
        }
        JobResult::Failed => counter!(APPLY_FAILURES).increment(1),
    }
}

/// Sets the state gauges from a fresh [`Status`] and [`MpsStatus`]: the active profile,
/// the GPUs, their MIG instances and the MPS servers. Call it whenever either may have
/// changed (after an apply, after an MPS server starts, stops or restarts) or on every
/// health interval; series the new state no longer has are neutralised (see the module
/// documentation). Whether an apply is in progress comes from the engine's events instead.
pub fn update_state(status: &Status, mps: &MpsStatus) {
    TRACKER.lock().unwrap_or_else(PoisonError::into_inner).update(status, mps);
}

/// Label pairs of one series, in the order they are rendered.
type Labels = Vec<(&'static str, String)>;
/// A gauge series: name and labels.
type Series = (&'static str, Labels);

/// What [`update_state`] emitted last, to neutralise what the next state lacks.
static TRACKER: Mutex<Tracker> = Mutex::new(Tracker::new());

/// The state series emitted last and the MPS restart counts seen last.
#[derive(Debug, Default)]
struct Tracker {
    /// Gauge series set by the last update.
    gauges: BTreeSet<Series>,
    /// Restarts reported last, per MPS server labels.
    restarts: BTreeMap<Labels, u32>,
    /// Limit restores reported last, per MPS server labels.
    restores: BTreeMap<Labels, u32>,
}

impl Tracker {
    const fn new() -> Self {
        Self { gauges: BTreeSet::new(), restarts: BTreeMap::new(), restores: BTreeMap::new() }
    }

    fn update(&mut self, status: &Status, mps: &MpsStatus) {
        let current = state_gauges(status, mps);
        let keys: BTreeSet<Series> = current.iter().map(|(s, _)| s.clone()).collect();
        for (name, labels) in self.gauges.difference(&keys) {
            gauge!(*name, to_labels(labels)).set(stale_value(name));
        }
        for ((name, labels), value) in current {
            gauge!(name, to_labels(&labels)).set(value);
        }
        self.gauges = keys;

        // A counter per server. The supervisor's count starts at 0 again for a server
        // created anew (after a layout change), which `absolute()` (a maximum) would hide
        // until it exceeded the old count: add what is new instead, so the counter stays
        // monotonic and counts every restart.
        let mut seen = BTreeMap::new();
        let mut restored = BTreeMap::new();
        for server in &mps.servers {
            let labels = server_labels(status, server);
            let added = |last: Option<&u32>, now: u32| {
                let last = last.copied().unwrap_or(0);
                u64::from(if now >= last { now - last } else { now })
            };
            let restarts = added(self.restarts.get(&labels), server.restarts);
            counter!(MPS_RESTARTS, to_labels(&labels)).increment(restarts);
            let restores = added(self.restores.get(&labels), server.limit_restores);
            counter!(MPS_LIMIT_RESTORES, to_labels(&labels)).increment(restores);
            seen.insert(labels.clone(), server.restarts);
            restored.insert(labels, server.limit_restores);
        }
        // A server that is gone and comes back later starts again from its new count.
        self.restarts = seen;
        self.restores = restored;
    }
}

/// The value a series takes once the state no longer has it.
fn stale_value(name: &str) -> f64 {
    match name {
        MPS_THREADS | MPS_PINNED => f64::NAN,
        _ => 0.0,
    }
}

fn to_labels(labels: &[(&'static str, String)]) -> Vec<Label> {
    labels.iter().map(|(k, v)| Label::new(*k, v.clone())).collect()
}

fn flag(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

fn gpu_labels(gpu: &GpuStatus) -> Labels {
    vec![("gpu", gpu.index.to_string()), ("UUID", gpu.uuid.clone())]
}

fn with(mut labels: Labels, key: &'static str, value: &str) -> Labels {
    labels.push((key, value.to_string()));
    labels
}

/// One series per known value (and the current one, should it be unknown): 1 for the
/// current, 0 for the others.
fn one_of(
    out: &mut Vec<(Series, f64)>,
    name: &'static str,
    labels: &Labels,
    key: &'static str,
    known: &[&str],
    current: Option<&str>,
) {
    for value in known {
        out.push(((name, with(labels.clone(), key, value)), flag(current == Some(*value))));
    }
    if let Some(other) = current.filter(|c| !known.contains(c)) {
        out.push(((name, with(labels.clone(), key, other)), 1.0));
    }
}

/// Every state gauge with its value.
fn state_gauges(status: &Status, mps: &MpsStatus) -> Vec<(Series, f64)> {
    let strategies = Strategy::SHARING.map(Strategy::as_str);
    let mut out = Vec::new();
    if let Some(profile) = &status.active_profile {
        out.push(((ACTIVE_PROFILE, vec![("profile", profile.clone())]), 1.0));
    }
    out.push(((ROLLBACK_FAILED, Vec::new()), flag(status.rollback_error.is_some())));
    out.push(((PROFILE_DRIFT, Vec::new()), flag(status.drift.is_some())));

    for gpu in &status.gpus {
        let labels = gpu_labels(gpu);
        out.push(((GPU_INFO, with(labels.clone(), "model_name", &gpu.model)), 1.0));
        out.push(((GPU_MIG_ENABLED, labels.clone()), flag(gpu.mig_enabled)));
        out.push(((GPU_MIG_RESET_PENDING, labels.clone()), flag(gpu.mig_pending.is_some())));
        one_of(
            &mut out,
            GPU_COMPUTE_MODE,
            &labels,
            "mode",
            &COMPUTE_MODES,
            Some(&gpu.compute_mode),
        );
        let whole = (!gpu.mig_enabled).then_some(gpu.sharing.strategy.as_str());
        one_of(&mut out, GPU_SHARING, &labels, "strategy", &strategies, whole);
        out.push(((GPU_INSTANCES, labels.clone()), gpu.instances.len() as f64));
        for instance in &gpu.instances {
            let labels = instance_labels(gpu, instance);
            let strategy = Some(instance.sharing.strategy.as_str());
            one_of(&mut out, INSTANCE_SHARING, &labels, "strategy", &strategies, strategy);
        }
        health_gauges(&mut out, gpu);
    }

    for server in &mps.servers {
        let labels = server_labels(status, server);
        out.push(((MPS_UP, labels.clone()), flag(server.state == ServerState::Running.as_str())));
        out.push(((MPS_CLIENTS, labels.clone()), server.clients.len() as f64));
        let ratio = f64::from(server.active_thread_percentage) / 100.0;
        out.push(((MPS_THREADS, labels.clone()), ratio));
        out.push(((MPS_LIMITS_DRIFT, labels.clone()), flag(limits_drift(server))));
        out.push(((MPS_MULTI_USER, labels.clone()), flag(server.multi_user)));
        if let Some(bytes) = server.pinned_memory_limit_bytes {
            out.push(((MPS_PINNED, labels), bytes as f64));
        }
    }
    out
}

/// The GPU's health: `gpushare_gpu_healthy` and its active faults per class, every class
/// of [`CLASSES`] present (at 0) so that the series exist before any fault. The labels are
/// the GPU index and the class only: never an Xid number or a UUID, so the series stay as
/// many as the GPUs times the classes.
fn health_gauges(out: &mut Vec<(Series, f64)>, gpu: &GpuStatus) {
    let index = gpu.index.to_string();
    out.push(((GPU_HEALTHY, vec![("gpu", index.clone())]), flag(gpu.health.is_empty())));
    for class in CLASSES {
        let active = gpu.health.iter().filter(|f| f.class == *class).count();
        let labels = vec![("gpu", index.clone()), ("class", (*class).to_string())];
        out.push(((GPU_FAULTS, labels), active as f64));
    }
}

/// Whether `server`'s control daemon applies other limits than the agent set: its defaults
/// differ from the configured ones, or a server process's limits come from no one known.
fn limits_drift(server: &MpsServer) -> bool {
    let defaults = server.daemon_defaults.is_some() && server.daemon_defaults != server.configured;
    defaults || server.server_processes.iter().any(|p| p.source == "unknown")
}

fn instance_labels(gpu: &GpuStatus, instance: &InstanceStatus) -> Labels {
    let labels = with(gpu_labels(gpu), "GPU_I_PROFILE", &instance.profile);
    with(labels, "GPU_I_ID", &instance.gpu_instance_id.to_string())
}

/// `gpu`, `UUID` (the parent GPU's) and `GPU_I_ID` (empty for a whole GPU) of an MPS
/// server. Its instance is the one with the server's `MIG-…` UUID, else the one at its
/// placement on its GPU.
fn server_labels(status: &Status, server: &MpsServer) -> Labels {
    let by_uuid = status.gpus.iter().find_map(|g| {
        g.instances.iter().find(|i| i.uuid.as_deref() == Some(server.uuid.as_str())).map(|i| (g, i))
    });
    let gpu =
        by_uuid.map(|(g, _)| g).or_else(|| status.gpus.iter().find(|g| g.index == server.gpu));
    let instance = by_uuid.map(|(_, i)| i).or_else(|| {
        let start = server.placement_start?;
        gpu?.instances.iter().find(|i| i.placement_start == start)
    });
    vec![
        ("gpu", server.gpu.to_string()),
        ("UUID", gpu.map_or_else(|| server.uuid.clone(), |g| g.uuid.clone())),
        ("GPU_I_ID", instance.map(|i| i.gpu_instance_id.to_string()).unwrap_or_default()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_proto::health::HealthFault;
    use gpushare_proto::types::Sharing;
    use metrics_exporter_prometheus::PrometheusRecorder;
    use std::io::Write;
    use std::process::{Command, Stdio};

    const GPU0: &str = "GPU-00000000-0000-0000-0000-000000000000";
    const GPU1: &str = "GPU-11111111-1111-1111-1111-111111111111";
    const MIG_A: &str = "MIG-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa";
    const MIG_B: &str = "MIG-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb";

    fn recorder() -> PrometheusRecorder {
        builder().build_recorder()
    }

    fn server(uuid: &str, gpu: u32, placement_start: Option<u32>) -> MpsServer {
        MpsServer {
            uuid: uuid.into(),
            gpu,
            placement_start,
            gpu_instance_id: placement_start.map(|_| 1),
            state: "running".into(),
            pid: Some(4242),
            active_thread_percentage: 50,
            pinned_memory_limit_bytes: Some(8 << 30),
            restarts: 2,
            pipe_directory: format!("/run/gpushare/mps/{uuid}/pipe"),
            clients: vec![100, 101, 102],
            limits_source: None,
            configured: None,
            daemon_defaults: None,
            server_processes: Vec::new(),
            multi_user: false,
            limit_restores: 0,
        }
    }

    fn instance(
        profile: &str,
        start: u32,
        id: u32,
        uuid: &str,
        sharing: Sharing,
    ) -> InstanceStatus {
        InstanceStatus {
            profile: profile.into(),
            placement_start: start,
            placement_size: 4,
            gpu_instance_id: id,
            compute_instance_id: Some(0),
            uuid: Some(uuid.into()),
            memory_bytes: 20 << 30,
            sharing,
            compute_instances: Vec::new(),
        }
    }

    fn time_slicing() -> Sharing {
        Sharing {
            strategy: "time-slicing".into(),
            interval: Some("short".into()),
            mps: None,
            replicas: None,
        }
    }

    /// GPU 0: A100 in MIG mode with a 3g.20gb (exclusive) and a 2g.10gb (time-sliced);
    /// GPU 1: an L40S, whole, under MPS with one server.
    fn status_and_mps() -> (Status, MpsStatus) {
        let mps_server = server(GPU1, 1, None);
        let status = Status {
            health_events: None,
            active_profile: Some("half-balanced".into()),
            active_source: Some("built-in".into()),
            backend: "simulated".into(),
            apply_in_progress: None,
            starting_up: false,
            rollback_error: None,
            apply_error: None,
            hands_off: None,
            drift: None,
            start_up_error: None,
            benches: vec![],
            gpus: vec![
                GpuStatus {
                    health: Vec::new(),
                    index: 0,
                    uuid: GPU0.into(),
                    model: "A100-SXM4-40GB".into(),
                    memory_total_bytes: 40 << 30,
                    mig_enabled: true,
                    mig_pending: None,
                    compute_mode: "default".into(),
                    sharing: Sharing::exclusive(),
                    instances: vec![
                        instance("3g.20gb", 0, 2, MIG_A, Sharing::exclusive()),
                        instance("2g.10gb", 4, 5, MIG_B, time_slicing()),
                    ],
                    processes: vec![7, 8],
                    clients: Vec::new(),
                },
                GpuStatus {
                    health: Vec::new(),
                    index: 1,
                    uuid: GPU1.into(),
                    model: "L40S".into(),
                    memory_total_bytes: 48 << 30,
                    mig_enabled: false,
                    mig_pending: None,
                    compute_mode: "exclusive_process".into(),
                    sharing: Sharing {
                        strategy: "mps".into(),
                        interval: None,
                        mps: Some(mps_server.clone()),
                        replicas: None,
                    },
                    instances: Vec::new(),
                    processes: vec![100, 101, 102],
                    clients: Vec::new(),
                },
            ],
        };
        (status, MpsStatus { servers: vec![mps_server] })
    }

    /// Records one finished apply of `half-balanced` taking 1.5 s.
    fn apply(result: JobResult) {
        record_apply("half-balanced", result, Duration::from_millis(1500));
    }

    /// One apply of each result.
    fn apply_each_result() {
        for result in
            [JobResult::Success, JobResult::Unchanged, JobResult::RolledBack, JobResult::Failed]
        {
            apply(result);
        }
    }

    /// Parses the exposition text into `(name, labels, value)` samples.
    fn samples(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
        let mut out = Vec::new();
        for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let (series, value) = line.rsplit_once(' ').expect("a sample line has a value");
            let value: f64 = value.parse().expect("a number");
            let (name, labels) = match series.split_once('{') {
                None => (series, BTreeMap::new()),
                Some((name, rest)) => {
                    let mut labels = BTreeMap::new();
                    let mut rest = rest.strip_suffix('}').expect("closing brace");
                    while !rest.is_empty() {
                        let (key, after) = rest.split_once("=\"").expect("key=\"");
                        let end = after.find('"').expect("closing quote");
                        labels.insert(key.to_string(), after[..end].to_string());
                        rest = after[end + 1..].trim_start_matches(',');
                    }
                    (name, labels)
                }
            };
            out.push((name.to_string(), labels, value));
        }
        out
    }

    /// The value of the one sample with exactly these labels.
    fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> =
            labels.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect();
        let found: Vec<f64> = samples(text)
            .into_iter()
            .filter(|(n, l, _)| n == name && *l == want)
            .map(|(_, _, v)| v)
            .collect();
        assert!(found.len() <= 1, "{name} {labels:?} appears {} times", found.len());
        found.first().copied()
    }

    fn series_count(text: &str, name: &str) -> usize {
        samples(text).iter().filter(|(n, _, _)| n == name).count()
    }

    #[track_caller]
    fn assert_value(text: &str, name: &str, labels: &[(&str, &str)], expected: f64) {
        match value(text, name, labels) {
            Some(v) if v == expected || (v.is_nan() && expected.is_nan()) => {}
            other => panic!("{name} {labels:?}: expected {expected}, got {other:?}\n{text}"),
        }
    }

    /// Everything the agent emits after one update and one apply of each result.
    fn render_all() -> String {
        let recorder = recorder();
        let handle = recorder.handle();
        let (status, mps) = status_and_mps();
        metrics::with_local_recorder(&recorder, || {
            register();
            Tracker::new().update(&status, &mps);
            apply_each_result();
        });
        handle.render()
    }

    #[test]
    fn metrics_record_apply() {
        let text = render_all();
        for result in ["success", "unchanged", "rolled_back", "failed"] {
            assert_value(&text, APPLIES, &[("profile", "half-balanced"), ("result", result)], 1.0);
            let count = format!("{APPLY_DURATION}_count");
            assert_value(&text, &count, &[("result", result)], 1.0);
            let sum = format!("{APPLY_DURATION}_sum");
            assert_value(&text, &sum, &[("result", result)], 1.5);
        }
        let bucket = format!("{APPLY_DURATION}_bucket");
        assert_value(&text, &bucket, &[("result", "success"), ("le", "1")], 0.0);
        assert_value(&text, &bucket, &[("result", "success"), ("le", "2.5")], 1.0);
        assert_value(&text, &bucket, &[("result", "success"), ("le", "+Inf")], 1.0);
        assert!(text.contains(&format!("# TYPE {APPLY_DURATION} histogram")), "{text}");
        assert_value(&text, ROLLBACKS, &[], 1.0);
        assert_value(&text, APPLY_FAILURES, &[], 2.0);
        assert_value(&text, BUILD_INFO, &[("version", env!("CARGO_PKG_VERSION"))], 1.0);
    }

    #[test]
    fn every_series_is_in_the_table_of_names() {
        let source = include_str!("mod.rs");
        let (doc, code) =
            source.split_once("\nuse ").expect("the module documentation comes first");
        let names: Vec<&str> = code
            .lines()
            .filter(|l| l.starts_with("const ") && l.contains("= \"gpushare_"))
            .filter_map(|l| l.split('"').nth(1))
            .collect();
        assert!(names.len() >= 23, "{names:?}");
        for name in names {
            assert!(doc.contains(&format!("| `{name}` |")), "{name} is not in the table of names");
        }
    }

    #[test]
    fn metrics_record_probe() {
        let recorder = recorder();
        let handle = recorder.handle();
        let run = gpushare_proto::types::ProbeRun {
            workload: "launch".into(),
            clients: 4,
            solo_throughput_per_s: 100.0,
            solo_p50_ms: 1.0,
            solo_achieved: String::new(),
            scaling: 3.5,
            jain_fairness: 0.99,
            p50_inflation: 1.1,
            p99_inflation: 1.3,
            per_client: Vec::new(),
        };
        let report = ProbeReport {
            target: GPU1.into(),
            gpu: 1,
            strategy: "mps".into(),
            device: "NVIDIA H100 80GB HBM3".into(),
            seconds: 3.0,
            wall_seconds: 10.0,
            runs: vec![run],
            saved_to: String::new(),
            comparison: Vec::new(),
            recommendations: Vec::new(),
        };
        metrics::with_local_recorder(&recorder, || {
            register();
            record_probe(&report);
        });
        let text = handle.render();
        let labels = [
            ("gpu", "1"),
            ("UUID", GPU1),
            ("workload", "launch"),
            ("clients", "4"),
            ("strategy", "mps"),
        ];
        assert_value(&text, PROBE_SCALING, &labels, 3.5);
        assert_value(&text, PROBE_FAIRNESS, &labels, 0.99);
        assert_value(&text, PROBE_P50_INFLATION, &labels, 1.1);
        for name in [PROBE_SCALING, PROBE_FAIRNESS, PROBE_P50_INFLATION] {
            assert!(text.contains(&format!("# HELP {name} ")), "no help for {name}\n{text}");
        }
    }

    #[test]
    fn metrics_apply_in_progress_follows_applies_not_probes() {
        let recorder = recorder();
        let handle = recorder.handle();
        let apply = JobKind::Apply { profile: "half-balanced".into() };
        let probe = JobKind::Probe { target: GPU1.into() };
        let at = |event: EngineEvent| {
            metrics::with_local_recorder(&recorder, || record_event(&event));
            value(&handle.render(), APPLY_IN_PROGRESS, &[])
        };
        metrics::with_local_recorder(&recorder, register);
        assert_eq!(at(EngineEvent::JobStarted { kind: probe.clone(), steps: 3 }), Some(0.0));
        assert_eq!(at(EngineEvent::JobEnded { kind: probe }), Some(0.0));
        assert_eq!(at(EngineEvent::JobStarted { kind: apply.clone(), steps: 24 }), Some(1.0));
        assert_eq!(at(EngineEvent::HealthChecked), Some(1.0));
        assert_eq!(at(EngineEvent::JobEnded { kind: apply }), Some(0.0));
    }

    #[test]
    fn metrics_failure_counters_exist_before_any_failure() {
        let recorder = recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            register();
            apply(JobResult::Success);
        });
        let text = handle.render();
        assert_value(&text, ROLLBACKS, &[], 0.0);
        assert_value(&text, APPLY_FAILURES, &[], 0.0);
    }

    #[test]
    fn metrics_show_drift_while_status_reports_it() {
        let recorder = recorder();
        let handle = recorder.handle();
        let (mut status, mps) = status_and_mps();
        status.drift = Some("the GPUs no longer match the active profile half-balanced".into());
        metrics::with_local_recorder(&recorder, || {
            register();
            let mut tracker = Tracker::new();
            tracker.update(&status, &mps);
            assert_value(&handle.render(), PROFILE_DRIFT, &[], 1.0);
            status.drift = None;
            tracker.update(&status, &mps);
        });
        assert_value(&handle.render(), PROFILE_DRIFT, &[], 0.0);
    }

    #[test]
    fn metrics_update_state() {
        let text = render_all();
        assert_value(&text, ACTIVE_PROFILE, &[("profile", "half-balanced")], 1.0);
        assert_value(&text, APPLY_IN_PROGRESS, &[], 0.0);
        assert_value(&text, ROLLBACK_FAILED, &[], 0.0);
        assert_value(&text, PROFILE_DRIFT, &[], 0.0);

        let g0 = [("gpu", "0"), ("UUID", GPU0)];
        let g1 = [("gpu", "1"), ("UUID", GPU1)];
        let plus = |base: &[(&'static str, &'static str)],
                    more: &[(&'static str, &'static str)]| {
            base.iter().chain(more).copied().collect::<Vec<_>>()
        };
        assert_value(&text, GPU_INFO, &plus(&g0, &[("model_name", "A100-SXM4-40GB")]), 1.0);
        assert_value(&text, GPU_INFO, &plus(&g1, &[("model_name", "L40S")]), 1.0);
        assert_value(&text, GPU_MIG_ENABLED, &g0, 1.0);
        assert_value(&text, GPU_MIG_ENABLED, &g1, 0.0);
        assert_value(&text, GPU_MIG_RESET_PENDING, &g0, 0.0);
        assert_value(&text, GPU_INSTANCES, &g0, 2.0);
        assert_value(&text, GPU_INSTANCES, &g1, 0.0);
        assert_value(&text, GPU_COMPUTE_MODE, &plus(&g0, &[("mode", "default")]), 1.0);
        assert_value(&text, GPU_COMPUTE_MODE, &plus(&g1, &[("mode", "default")]), 0.0);
        assert_value(&text, GPU_COMPUTE_MODE, &plus(&g1, &[("mode", "exclusive_process")]), 1.0);
        assert_eq!(series_count(&text, GPU_COMPUTE_MODE), 6);

        // The MIG GPU's own sharing is all 0: its instances are shared instead.
        for strategy in Strategy::SHARING.map(Strategy::as_str) {
            assert_value(&text, GPU_SHARING, &plus(&g0, &[("strategy", strategy)]), 0.0);
            let expected = flag(strategy == "mps");
            assert_value(&text, GPU_SHARING, &plus(&g1, &[("strategy", strategy)]), expected);
        }
        for (profile, id, current) in
            [("3g.20gb", "2", "exclusive"), ("2g.10gb", "5", "time-slicing")]
        {
            for strategy in Strategy::SHARING.map(Strategy::as_str) {
                let labels = plus(
                    &g0,
                    &[("GPU_I_PROFILE", profile), ("GPU_I_ID", id), ("strategy", strategy)],
                );
                assert_value(&text, INSTANCE_SHARING, &labels, flag(strategy == current));
            }
        }
        assert_eq!(series_count(&text, INSTANCE_SHARING), 6);

        let s1 = plus(&g1, &[("GPU_I_ID", "")]);
        assert_value(&text, MPS_UP, &s1, 1.0);
        assert_value(&text, MPS_RESTARTS, &s1, 2.0);
        assert_value(&text, MPS_CLIENTS, &s1, 3.0);
        assert_value(&text, MPS_THREADS, &s1, 0.5);
        assert_value(&text, MPS_PINNED, &s1, 8.0 * 1024.0 * 1024.0 * 1024.0);
        assert_eq!(series_count(&text, MPS_UP), 1);

        // Healthy GPUs: 1, and every class of fault at 0.
        assert_value(&text, GPU_HEALTHY, &[("gpu", "0")], 1.0);
        assert_value(&text, GPU_HEALTHY, &[("gpu", "1")], 1.0);
        assert_value(&text, GPU_FAULTS, &[("gpu", "1"), ("class", "gpu-lost")], 0.0);
        assert_eq!(series_count(&text, GPU_FAULTS), 2 * CLASSES.len());
        assert_value(&text, HEALTH_FAULTS, &[("class", "xid")], 0.0);
        assert_value(&text, HEALTH_INFORMATIONAL, &[], 0.0);

        // Bounded labels: no pids, no pipe paths.
        for (_, labels, _) in samples(&text) {
            for key in labels.keys() {
                assert!(!key.contains("pid") && !key.contains("pipe"), "label {key}");
            }
        }
        assert!(!text.contains("4242") && !text.contains("/run/gpushare"), "{text}");
        // Every metric has its help and type.
        for name in [
            ACTIVE_PROFILE,
            GPU_INFO,
            GPU_SHARING,
            INSTANCE_SHARING,
            MPS_UP,
            MPS_RESTARTS,
            MPS_PINNED,
            GPU_HEALTHY,
            GPU_FAULTS,
            HEALTH_FAULTS,
            HEALTH_INFORMATIONAL,
        ] {
            assert!(text.contains(&format!("# HELP {name} ")), "no help for {name}\n{text}");
        }
        assert!(text.contains(&format!("# TYPE {MPS_RESTARTS} counter")), "{text}");
        assert!(text.contains(&format!("# TYPE {MPS_UP} gauge")), "{text}");
    }

    fn fault(class: &str, xid: Option<u64>, gpu_instance: Option<u32>) -> HealthFault {
        HealthFault {
            class: class.into(),
            xid,
            action: "reset-gpu".into(),
            gpu_instance_id: gpu_instance,
            compute_instance_id: gpu_instance.map(|_| 0),
            since_unix_seconds: 1_700_000_000,
            detail: format!("{class}: reset the GPU"),
            clients: Some(vec![4242]),
        }
    }

    /// Issue 42: a GPU is unhealthy while any fault covers it or one of its MIG instances,
    /// its faults are counted per class, and it is healthy again once they clear; labels
    /// are the GPU index and the class, never an Xid number, a UUID or a pid.
    #[test]
    fn metrics_follow_the_gpus_health() {
        let recorder = recorder();
        let handle = recorder.handle();
        let (mut status, mps) = status_and_mps();
        let mut tracker = Tracker::new();
        let g0 = [("gpu", "0")];
        let g1 = [("gpu", "1")];
        let faults = |gpu: &'static str, class: &'static str| [("gpu", gpu), ("class", class)];
        metrics::with_local_recorder(&recorder, || tracker.update(&status, &mps));
        assert_value(&handle.render(), GPU_HEALTHY, &g0, 1.0);

        // An Xid on one MIG instance of GPU 0; GPU 1 lost and an Xid on it.
        status.gpus[0].health = vec![fault("xid", Some(94), Some(2))];
        status.gpus[1].health = vec![fault("gpu-lost", None, None), fault("xid", Some(79), None)];
        metrics::with_local_recorder(&recorder, || tracker.update(&status, &mps));
        let text = handle.render();
        assert_value(&text, GPU_HEALTHY, &g0, 0.0);
        assert_value(&text, GPU_HEALTHY, &g1, 0.0);
        assert_value(&text, GPU_FAULTS, &faults("0", "xid"), 1.0);
        assert_value(&text, GPU_FAULTS, &faults("0", "gpu-lost"), 0.0);
        assert_value(&text, GPU_FAULTS, &faults("1", "xid"), 1.0);
        assert_value(&text, GPU_FAULTS, &faults("1", "gpu-lost"), 1.0);
        assert_eq!(series_count(&text, GPU_FAULTS), 2 * CLASSES.len());
        for (name, labels, _) in samples(&text) {
            if name == GPU_HEALTHY || name == GPU_FAULTS {
                let keys: Vec<&str> = labels.keys().map(String::as_str).collect();
                assert!(keys == ["gpu"] || keys == ["class", "gpu"], "{name} {labels:?}");
                assert!(
                    labels.values().all(|v| v.parse::<u32>().map_or(true, |n| n < 2)),
                    "{name} {labels:?}"
                );
            }
        }

        // Cleared (a reset): healthy again, every class back at 0.
        status.gpus[0].health.clear();
        status.gpus[1].health.clear();
        metrics::with_local_recorder(&recorder, || tracker.update(&status, &mps));
        let text = handle.render();
        assert_value(&text, GPU_HEALTHY, &g0, 1.0);
        assert_value(&text, GPU_HEALTHY, &g1, 1.0);
        for (name, labels, v) in samples(&text).into_iter().filter(|(n, _, _)| n == GPU_FAULTS) {
            assert_eq!(v, 0.0, "{name} {labels:?}");
        }
    }

    /// The fault counters are the registry's totals: every class present from the start,
    /// set to what the registry counted (which only grows), never counted twice.
    #[test]
    fn metrics_count_faults_per_class_from_the_registrys_totals() {
        let recorder = recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, register);
        let text = handle.render();
        for class in CLASSES {
            assert_value(&text, HEALTH_FAULTS, &[("class", class)], 0.0);
        }
        assert!(text.contains(&format!("# TYPE {HEALTH_FAULTS} counter")), "{text}");
        assert!(text.contains(&format!("# TYPE {HEALTH_INFORMATIONAL} counter")), "{text}");

        let totals = BTreeMap::from([("xid", 3), ("gpu-lost", 1)]);
        let at = |totals: &BTreeMap<&'static str, u64>, informational: u64| {
            metrics::with_local_recorder(&recorder, || record_health_totals(totals, informational));
            handle.render()
        };
        let text = at(&totals, 2);
        assert_value(&text, HEALTH_FAULTS, &[("class", "xid")], 3.0);
        assert_value(&text, HEALTH_FAULTS, &[("class", "gpu-lost")], 1.0);
        assert_value(&text, HEALTH_FAULTS, &[("class", "double-bit-ecc")], 0.0);
        assert_value(&text, HEALTH_INFORMATIONAL, &[], 2.0);
        // The same totals again (a refresh with nothing new) change nothing.
        let text = at(&totals, 2);
        assert_value(&text, HEALTH_FAULTS, &[("class", "xid")], 3.0);
        assert_value(&text, HEALTH_INFORMATIONAL, &[], 2.0);
        assert_eq!(series_count(&text, HEALTH_FAULTS), CLASSES.len());
        let text = at(&BTreeMap::from([("xid", 5), ("gpu-lost", 1)]), 2);
        assert_value(&text, HEALTH_FAULTS, &[("class", "xid")], 5.0);
    }

    #[test]
    fn metrics_mps_server_on_mig_instance() {
        let (mut status, _) = status_and_mps();
        status.gpus[0].instances[1].sharing =
            Sharing { strategy: "mps".into(), interval: None, mps: None, replicas: None };
        // Matched by UUID, whatever the placement says.
        let by_uuid = server(MIG_B, 0, Some(99));
        // No UUID match: matched by placement on its GPU.
        let by_placement = server("MIG-unknown", 0, Some(0));
        let mps = MpsStatus { servers: vec![by_uuid, by_placement] };
        let recorder = recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || Tracker::new().update(&status, &mps));
        let text = handle.render();
        assert_value(&text, MPS_UP, &[("gpu", "0"), ("UUID", GPU0), ("GPU_I_ID", "5")], 1.0);
        assert_value(&text, MPS_UP, &[("gpu", "0"), ("UUID", GPU0), ("GPU_I_ID", "2")], 1.0);
        let labels = [
            ("gpu", "0"),
            ("UUID", GPU0),
            ("GPU_I_PROFILE", "2g.10gb"),
            ("GPU_I_ID", "5"),
            ("strategy", "mps"),
        ];
        assert_value(&text, INSTANCE_SHARING, &labels, 1.0);
    }

    #[test]
    fn metrics_stale_series_are_neutralised() {
        let recorder = recorder();
        let handle = recorder.handle();
        let (status, mps) = status_and_mps();
        let mut tracker = Tracker::new();
        metrics::with_local_recorder(&recorder, || tracker.update(&status, &mps));

        // Another profile: MIG off on GPU 0, no MPS server, an apply running.
        let mut next = status.clone();
        next.active_profile = Some("all-disabled".into());
        next.apply_in_progress = Some("/io/gpushare/Agent1/jobs/2 (all-disabled)".into());
        next.gpus[0].mig_enabled = false;
        next.gpus[0].instances.clear();
        next.gpus[1].sharing = Sharing::exclusive();
        let none = MpsStatus { servers: Vec::new() };
        metrics::with_local_recorder(&recorder, || {
            record_event(&EngineEvent::JobStarted {
                kind: JobKind::Apply { profile: "all-disabled".into() },
                steps: 8,
            });
            tracker.update(&next, &none);
        });
        let text = handle.render();

        assert_value(&text, ACTIVE_PROFILE, &[("profile", "half-balanced")], 0.0);
        assert_value(&text, ACTIVE_PROFILE, &[("profile", "all-disabled")], 1.0);
        assert_value(&text, APPLY_IN_PROGRESS, &[], 1.0);
        assert_value(&text, GPU_INSTANCES, &[("gpu", "0"), ("UUID", GPU0)], 0.0);
        assert_eq!(series_count(&text, INSTANCE_SHARING), 6);
        for (_, labels, v) in samples(&text).into_iter().filter(|(n, _, _)| n == INSTANCE_SHARING) {
            assert_eq!(v, 0.0, "{labels:?}");
        }
        let g0_exclusive = [("gpu", "0"), ("UUID", GPU0), ("strategy", "exclusive")];
        assert_value(&text, GPU_SHARING, &g0_exclusive, 1.0);
        let s1 = [("gpu", "1"), ("UUID", GPU1), ("GPU_I_ID", "")];
        assert_value(&text, MPS_UP, &s1, 0.0);
        assert_value(&text, MPS_CLIENTS, &s1, 0.0);
        assert_value(&text, MPS_THREADS, &s1, f64::NAN);
        assert_value(&text, MPS_PINNED, &s1, f64::NAN);
        assert_value(&text, MPS_RESTARTS, &s1, 2.0);
    }

    #[test]
    fn metrics_mps_restarts_stay_monotonic() {
        let recorder = recorder();
        let handle = recorder.handle();
        let (status, mut mps) = status_and_mps();
        let mut tracker = Tracker::new();
        let labels = [("gpu", "1"), ("UUID", GPU1), ("GPU_I_ID", "")];
        let mut at = |restarts: u32| {
            mps.servers[0].restarts = restarts;
            metrics::with_local_recorder(&recorder, || tracker.update(&status, &mps));
            value(&handle.render(), MPS_RESTARTS, &labels)
        };
        assert_eq!(at(2), Some(2.0));
        assert_eq!(at(2), Some(2.0));
        assert_eq!(at(5), Some(5.0));
        // The server was created anew: its count starts over, the counter goes on.
        assert_eq!(at(0), Some(5.0));
        assert_eq!(at(1), Some(6.0));
    }

    #[test]
    fn metrics_promtool_accepts_the_exposition() {
        let promtool = std::path::Path::new("/usr/bin/promtool");
        if !promtool.exists() {
            gpushare_test_skip::skip(format_args!(
                "{} is not installed (Debian: apt-get install prometheus)",
                promtool.display()
            ));
            return;
        }
        // Every kind of series, stale ones (NaN) included.
        let recorder = recorder();
        let handle = recorder.handle();
        let (status, mps) = status_and_mps();
        let mut gone = status.clone();
        gone.gpus[0].instances.pop();
        gone.gpus[1].health = vec![fault("gpu-lost", None, None)];
        metrics::with_local_recorder(&recorder, || {
            register();
            let mut tracker = Tracker::new();
            tracker.update(&status, &mps);
            tracker.update(&gone, &MpsStatus { servers: Vec::new() });
            apply_each_result();
        });
        let text = handle.render() + &clients::tests::sample().render();
        assert!(text.contains("NaN"), "{text}");
        assert!(text.contains("gpushare_client_mps_active_thread_ratio{"), "{text}");

        let mut child = Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("promtool starts");
        child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write");
        let output = child.wait_with_output().expect("promtool runs");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            output.status.success() && said.trim().is_empty(),
            "promtool check metrics: {}\n{said}\n--- exposition ---\n{text}",
            output.status
        );
    }
}
