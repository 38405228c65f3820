//! The composition root of the agent as a service — configuration → GPU
//! backend → engine → metrics → crash recovery → D-Bus service → background tasks (MPS
//! supervision, the systemd watchdog and status, the start-up re-apply) — and the orderly
//! stop on SIGTERM. Everything here wires layers together; none of it decides
//! anything about GPUs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpushare_proto::{BUS_NAME, OBJECT_PATH};
use sd_notify::NotifyState;
use tokio::sync::broadcast::Receiver;
use tokio::sync::broadcast::error::RecvError;

use crate::access::AccessPolicy;
use crate::config::{self, AgentConfig};
use crate::engine::{ApplyJob, Engine, EngineEvent, JobKind};
use crate::gpu::GpuBackend;
use crate::gpu::nvml::NvmlBackend;
use crate::gpu::sim::{SimBackend, SimOptions};
use crate::profile::ProfileStore;
use crate::service::AgentService;
use crate::sys::{files, unix};

/// How the agent was asked to run (its command line).
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Simulated GPUs (`a100-40gb:8`) instead of NVML.
    pub simulate: Option<String>,
    /// `system`, `session` or a D-Bus address; by default the system bus for root.
    pub bus: Option<String>,
    /// The configuration file.
    pub config: PathBuf,
    /// The state directory, over the configuration's.
    pub state_dir: Option<PathBuf>,
    /// The profile directory, over the configuration's.
    pub profiles_dir: Option<PathBuf>,
}

/// Runs the agent until SIGTERM or SIGINT, then waits for a running job and stops. The
/// error says, in one line, why it could not start.
pub async fn run(settings: Settings) -> Result<(), String> {
    // Never act on half-read configuration: run and answer (status says why), but change
    // nothing on the GPUs, of any kind, until the file is fixed and the agent restarted.
    let (config, hands_off) = match AgentConfig::load(&settings.config) {
        Ok(config) => (config, None),
        Err(e) => {
            let why = format!("{e}; fix it and restart gpushare-agent");
            tracing::error!("changing nothing on the GPUs: {why}");
            (AgentConfig::default(), Some(why))
        }
    };
    let state_dir = settings.state_dir.clone().unwrap_or_else(|| {
        if unix::is_root() || config.state_dir != Path::new(config::DEFAULT_STATE_DIR) {
            config.state_dir.clone()
        } else {
            user_state_dir()
        }
    });
    let profiles_dir = settings.profiles_dir.clone().unwrap_or(config.profiles_dir.clone());
    let _state_lock = files::lock_state_dir(&state_dir)
        .map_err(|e| format!("state directory {}: {e}", state_dir.display()))?;

    let backend = backend(settings.simulate.as_deref(), &state_dir)?;
    let profiles = load_profiles(&profiles_dir);
    let mut engine =
        Engine::new(backend, profiles, &state_dir, &config).map_err(|e| e.to_string())?;
    if let Some(why) = hands_off {
        engine = engine.hands_off(why);
    }
    let engine = Arc::new(engine);

    // Metrics and systemd's status follow the engine before it does anything, so that no
    // job goes unheard of (the start-up re-apply included).
    let systemd_events = engine.subscribe();
    if config.metrics.enabled {
        match crate::metrics::install(config.metrics.listen) {
            Ok(()) => {
                tracing::info!(listen = %config.metrics.listen, "serving metrics");
                crate::metrics::follow(Arc::clone(&engine));
            }
            Err(e) => tracing::warn!("metrics not served on {}: {e}", config.metrics.listen),
        }
    }

    // Never serve with a GPU between two layouts: an interrupted apply is rolled back first.
    match engine.recover().await {
        Ok(Some(report)) => tracing::warn!("{report}"),
        Ok(None) => {}
        Err(e) => return Err(format!("{e}; not starting (fix the cause and start again)")),
    }
    // MIG instances do not survive a reboot: the GPUs go back to the active profile (or
    // boot_profile). The job takes the apply lock before the agent serves, so status
    // shows it from the first call and no apply slips in before it.
    let boot_job = match engine.begin_boot_apply(config.boot_profile.as_deref()).await {
        None => None,
        Some(Ok(job)) => Some(job),
        Some(Err(e)) => {
            tracing::error!("re-applying at start-up: {e}");
            None
        }
    };

    let bus = settings
        .bus
        .clone()
        .unwrap_or_else(|| if unix::is_root() { "system" } else { "session" }.into());
    let access = AccessPolicy::for_this_host(unix::effective_uid());
    let connection = serve(&bus, AgentService::new(Arc::clone(&engine), access)).await?;
    tracing::info!(
        bus = %bus,
        address = %connection.unique_name().map(|n| n.to_string()).unwrap_or_default(),
        backend = engine.backend_kind().as_str(),
        state_dir = %state_dir.display(),
        "serving {BUS_NAME}"
    );

    supervise(&engine, Duration::from_secs(config.mps.health_interval_seconds.max(1)));
    notify_systemd(&engine, systemd_events);

    if let Some(job) = boot_job {
        let engine = Arc::clone(&engine);
        tokio::spawn(async move { boot_apply(&engine, job).await });
    }

    reload_profiles_on_sighup(&engine, profiles_dir);
    let lost = tokio::select! {
        () = wait_for_termination() => None,
        why = name_lost(&connection) => Some(why),
    };
    if let Some(why) = &lost {
        tracing::error!("{why}: stopping once no apply runs");
    } else {
        tracing::info!("stopping once no apply runs");
    }
    let _ = sd_notify::notify(&[
        NotifyState::Stopping,
        NotifyState::Status("stopping once no apply runs"),
    ]);
    let _idle = engine.quiesce().await;
    drop(connection);
    match lost {
        Some(why) => Err(format!("{why} (another agent, or a bus restart?)")),
        None => Ok(()),
    }
}

/// `$XDG_STATE_HOME/gpushare` (or `~/.local/state/gpushare`): where an agent run by a
/// user keeps its state.
fn user_state_dir() -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".local/state")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("gpushare")
}

/// The simulated GPUs of `simulate` (state kept in `state_dir`), or the real ones.
fn backend(simulate: Option<&str>, state_dir: &Path) -> Result<Arc<dyn GpuBackend>, String> {
    let Some(spec) = simulate else {
        return Ok(Arc::new(NvmlBackend::new().map_err(|e| {
            format!("{e}; to try gpushare without a GPU, run with --simulate a100-40gb:8")
        })?));
    };
    let models = crate::catalog::parse_node_spec(spec)?;
    let options = SimOptions::from_env()?;
    std::fs::create_dir_all(state_dir)
        .map_err(|e| format!("state directory {}: {e}", state_dir.display()))?;
    let backend = SimBackend::persistent(&models, &state_dir.join("simulated-gpus.json"), options)?;
    tracing::info!(gpus = models.len(), spec = %spec, "simulating GPUs");
    Ok(Arc::new(backend))
}

/// Serves `service` at the agent's object path and owns the agent's name on `bus`.
async fn serve(bus: &str, service: AgentService) -> Result<zbus::Connection, String> {
    let builder = match bus {
        "system" => zbus::connection::Builder::system(),
        "session" => zbus::connection::Builder::session(),
        address => zbus::connection::Builder::address(address),
    }
    .map_err(|e| format!("bus {bus}: {e}"))?;
    // One agent per bus: the name is neither taken from another owner nor given up to one
    // (zbus's default would allow both), and no one queues for it.
    builder
        .serve_at(OBJECT_PATH, service)
        .and_then(|b| b.name(BUS_NAME))
        .map_err(|e| format!("bus {bus}: {e}"))?
        .allow_name_replacements(false)
        .replace_existing_names(false)
        .build()
        .await
        .map_err(|e| match e {
            zbus::Error::NameTaken => {
                format!("{BUS_NAME} is already owned on the {bus} bus: is another gpushare-agent running?")
            }
            e => format!("cannot serve on the {bus} bus: {e}"),
        })
}

/// Resolves when the agent no longer owns its name: the bus took it away or went away.
/// An agent that nobody can reach must not go on changing GPUs unseen.
async fn name_lost(connection: &zbus::Connection) -> String {
    use futures_util::StreamExt;
    let lost = match zbus::fdo::DBusProxy::new(connection).await {
        Ok(dbus) => dbus.receive_name_lost_with_args(&[(0, BUS_NAME)]).await,
        Err(e) => Err(e),
    };
    let mut lost = match lost {
        Ok(stream) => stream,
        Err(e) => return format!("cannot watch the ownership of {BUS_NAME}: {e}"),
    };
    match lost.next().await {
        Some(_) => format!("lost the bus name {BUS_NAME}"),
        None => format!("the bus connection closed; {BUS_NAME} is no longer owned"),
    }
}

/// The profiles of `dir` and the built-in ones; files that do not read are logged.
fn load_profiles(dir: &Path) -> ProfileStore {
    let profiles = ProfileStore::load(Some(dir));
    for error in profiles.errors() {
        tracing::error!("profile left out: {error}");
    }
    profiles
}

/// Reads the profile directory again on SIGHUP (`systemctl reload gpushare-agent`).
fn reload_profiles_on_sighup(engine: &Arc<Engine>, dir: PathBuf) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        tracing::warn!("SIGHUP cannot be handled: profiles are read at start only");
        return;
    };
    let engine = Arc::clone(engine);
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            let profiles = load_profiles(&dir);
            let count = profiles.iter().count();
            engine.reload_profiles(profiles);
            tracing::info!(dir = %dir.display(), profiles = count, "profiles reloaded");
        }
    });
}

/// Checks the MPS servers every `interval` (restarting those that died).
fn supervise(engine: &Arc<Engine>, interval: Duration) {
    let engine = Arc::clone(engine);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            engine.supervise_mps().await;
        }
    });
}

/// systemd: ready once the bus name and the GPUs are up; `STATUS=` around jobs (from
/// `events`); the watchdog pinged from a task of its own that never waits on the driver.
fn notify_systemd(engine: &Engine, mut events: Receiver<EngineEvent>) {
    let status = format!("serving {BUS_NAME}: {} GPU backend", engine.backend_kind());
    let _ = sd_notify::notify(&[NotifyState::Ready, NotifyState::Status(&status)]);
    if let Some(timeout) = sd_notify::watchdog_enabled() {
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(timeout / 2);
            loop {
                ticks.tick().await;
                let _ = sd_notify::notify(&[NotifyState::Watchdog]);
            }
        });
    }
    tokio::spawn(async move {
        loop {
            let status = match events.recv().await {
                Ok(EngineEvent::JobStarted { kind: JobKind::Apply { profile }, steps }) => {
                    format!("applying {profile} ({steps} steps)")
                }
                Ok(EngineEvent::ApplyFinished { profile, result, .. }) => {
                    format!("{} {profile}", if result.is_ok() { "done:" } else { "failed:" })
                }
                Ok(EngineEvent::ProbeFinished { target, report }) => {
                    format!(
                        "{} probe of {target}",
                        if report.is_some() { "done:" } else { "failed:" }
                    )
                }
                Ok(_) | Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => return,
            };
            let _ = sd_notify::notify(&[NotifyState::Status(&status)]);
        }
    });
}

/// Carries out the start-up re-apply, as a job like any other.
async fn boot_apply(engine: &Engine, job: ApplyJob) {
    let profile = job.plan().profile.clone();
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let report = engine.run_apply(&job, tx).await;
    drop(job);
    match report.error {
        None if report.changed => {
            tracing::info!(steps = report.steps_done, "re-applied {profile} at start-up")
        }
        None => tracing::info!("the GPUs match {profile}"),
        Some(e) => tracing::error!("re-applying at start-up: {e}"),
    }
}

async fn wait_for_termination() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
