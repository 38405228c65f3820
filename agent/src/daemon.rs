//! The composition root of the agent as a service — configuration → GPU
//! backend → engine → metrics → crash recovery → D-Bus service → background tasks (MPS
//! supervision, the systemd watchdog and status, the start-up re-apply) — and the orderly
//! stop on SIGTERM. Everything here wires layers together; none of it decides
//! anything about GPUs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpushare_proto::BUS_NAME;
use sd_notify::NotifyState;
use tokio::sync::broadcast::Receiver;
use tokio::sync::broadcast::error::RecvError;
use tracing::Instrument;

use crate::access::AccessPolicy;
use crate::bench::launch::Launcher;
use crate::config::{self, AgentConfig};
use crate::engine::{ApplyJob, BOOT_JOB, Engine, EngineEvent, JobKind};
use crate::gpu::GpuBackend;
use crate::gpu::nvml::{Driver, NvmlBackend};
use crate::profile::ProfileStore;
use crate::service;
use crate::simulator::{SimulatedNode, SimulatorFiles};
use crate::sys::{files, log, trusted, unix};

/// How the agent was asked to run (its command line).
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Simulated GPUs (`a100-40gb:8`) instead of NVML.
    pub simulate: Option<String>,
    /// `system`, `session` or a D-Bus address; by default the system bus for root.
    pub bus: Option<String>,
    /// The configuration file; by default the packaged one, which a simulated agent reads
    /// only when named (it is the real agent's: its places and hooks).
    pub config: Option<PathBuf>,
    /// The state directory, over the configuration's.
    pub state_dir: Option<PathBuf>,
    /// The profile directory, over the configuration's.
    pub profiles_dir: Option<PathBuf>,
    /// A check (`--check-driver` and the like): the agent only reads, so it writes
    /// nothing, takes no state directory, and runs a simulated node on a private copy.
    pub read_only: bool,
}

impl Settings {
    /// The configuration file to read, if any.
    pub fn config_path(&self) -> Option<PathBuf> {
        match (&self.config, &self.simulate) {
            (Some(path), _) => Some(path.clone()),
            (None, Some(_)) => None,
            (None, None) => Some(PathBuf::from(config::DEFAULT_CONFIG_PATH)),
        }
    }

    /// The bus the agent serves on.
    pub fn bus(&self) -> String {
        self.bus
            .clone()
            .unwrap_or_else(|| if unix::is_root() { "system" } else { "session" }.into())
    }
}

/// What the agent settles before it starts any thread: its configuration, state
/// directory (locked), profile directory and the driver it loads.
#[derive(Debug)]
pub struct Prepared {
    config: AgentConfig,
    /// Why the agent must change nothing (its configuration did not read), if so.
    hands_off: Option<String>,
    state_dir: PathBuf,
    profiles_dir: PathBuf,
    driver: Driver,
    /// Held while the agent runs: one agent per state directory (none for a check).
    _state_lock: Option<std::fs::File>,
    /// A check's copy of the simulated node, removed when it ends.
    _scratch: Option<tempfile::TempDir>,
}

impl Prepared {
    /// The driver the agent loads.
    pub fn driver(&self) -> &Driver {
        &self.driver
    }

    /// Where the host's files are read (`/`, or the simulated host under `--simulate`).
    pub fn host_root(&self) -> &std::path::Path {
        &self.config.host_root
    }
}

/// Reads the configuration, locks the state directory and, for `--simulate`, finds the
/// simulator and puts the node into the environment (see [`crate::simulator`]).
///
/// # Safety
///
/// No other thread may run (see [`SimulatedNode::export`]): call it from `main` before
/// the async runtime starts.
pub unsafe fn prepare(settings: &Settings) -> Result<Prepared, String> {
    // Never act on half-read configuration: run and answer (status says why), but change
    // nothing on the GPUs, of any kind, until the file is fixed and the agent restarted.
    let loaded =
        settings.config_path().map_or(Ok(AgentConfig::default()), |p| AgentConfig::load(&p));
    let (mut config, hands_off) = match loaded {
        Ok(config) => (config, None),
        Err(e) => {
            let why = format!("{e}; fix it and restart gpushare-agent");
            tracing::error!("changing nothing on the GPUs: {why}");
            (AgentConfig::default(), Some(why))
        }
    };
    let simulated = settings.simulate.is_some();
    // What the command line asks for is checked before anything else: a spec that does not
    // read, or a simulator that is not installed, is said before the bus is asked.
    let simulation = match &settings.simulate {
        Some(spec) => Some((crate::catalog::parse_node_spec(spec)?, SimulatorFiles::find()?, spec)),
        None => None,
    };
    // A simulated agent is a sandbox: the places a real agent takes (its state directory,
    // MPS root, CDI directory, metrics port) only where the command line or the agent.toml
    // it was given names them (DESIGN.md, "First hour, round 2 (issue 37)").
    let state_dir = match &settings.state_dir {
        Some(dir) => dir.clone(),
        None if simulated && config.written.state_dir => config.state_dir.clone(),
        None if simulated && unix::is_root() => PathBuf::from(crate::simulator::ROOT_STATE_DIR),
        None if simulated => user_state_dir(),
        None if unix::is_root() || config.state_dir != Path::new(config::DEFAULT_STATE_DIR) => {
            config.state_dir.clone()
        }
        None => user_state_dir(),
    };
    let profiles_dir = settings.profiles_dir.clone().unwrap_or(config.profiles_dir.clone());
    // Everything the agent reads back from there (its journal, where the MPS servers and
    // tools are, the simulated node) is trusted only from a directory nobody else can
    // write; a check reads it only when it is there, and makes nothing.
    let refused = |why: String| {
        format!(
            "state directory {}: {why}: another user could change what the agent reads back \
             there; use a directory only root or the agent's user can write (--state-dir, or \
             state_dir in agent.toml)",
            state_dir.display()
        )
    };
    // A root where the MPS daemons' sockets would not fit is said before anything is made.
    if !settings.read_only {
        let (root, setting) = mps_root(&config, simulated, &state_dir);
        crate::sharing::mps::check_root(&root, setting)?;
    }
    match settings.read_only {
        true if !state_dir.exists() => {}
        true => _ = trusted::check_dir(&state_dir).map_err(refused)?,
        false => {
            // Checked before anything is made, then a bus that is not there stops the start
            // before anything is written (issue 37), then made.
            trusted::check_creatable(&state_dir).map_err(refused)?;
            probe_bus(&settings.bus())?;
            trusted::make_dir(&state_dir, 0o755).map_err(refused)?;
        }
    }
    let state_lock = match settings.read_only {
        true => None,
        false => Some(files::lock_state_dir(&state_dir).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock if simulated => format!(
                "{e}: one agent per state directory; give this one its own with --state-dir DIR"
            ),
            std::io::ErrorKind::WouldBlock => format!(
                "{e}: one agent per state directory and GPUs; stop that one first (systemctl \
                 stop gpushare-agent), or give this one another with --state-dir DIR"
            ),
            _ => format!("state directory {}: {e}", state_dir.display()),
        })?),
    };
    // Never a real node's journal under a simulated agent, nor the other way round.
    if !settings.read_only {
        crate::simulator::claim_state_dir(&state_dir, settings.simulate.as_deref())?;
    }
    let mut scratch = None;
    // The MPS servers and tools are where the last configuration that read put them: a
    // hands-off agent must still see them (a read of its own; it changes nothing).
    if hands_off.is_some()
        && let Some(whereabouts) = AgentConfig::remembered_whereabouts(&state_dir)
    {
        tracing::warn!(
            mps_root = %whereabouts.mps_root.display(),
            "observing with the MPS root and tools of the last agent.toml that read"
        );
        config = config.with_whereabouts(whereabouts);
    }

    let driver = match simulation {
        None => Driver::Nvidia,
        Some((models, simulator, spec)) => {
            let node = if settings.read_only {
                // The simulated driver takes up (or replaces) its state file at the first
                // nvmlInit: a check looks at a copy of it instead.
                let copy = SimulatedNode::scratch_copy(spec, &state_dir)?;
                let node = SimulatedNode::new(spec, copy.path());
                scratch = Some(copy);
                node
            } else {
                SimulatedNode::new(spec, &state_dir)
            };
            // SAFETY: the caller guarantees a single thread.
            unsafe { node.export() };
            // The simulated node brings its own tools, unless agent.toml names others (its
            // MPS root: below).
            let defaults = AgentConfig::default();
            if config.mps.control == defaults.mps.control {
                config.mps.control = simulator.mps_control.clone();
            }
            if config.timeslice.nvidia_smi == defaults.timeslice.nvidia_smi {
                config.timeslice.nvidia_smi = simulator.nvidia_smi.clone();
            }
            if config.host_root == defaults.host_root {
                config.host_root = node.host_root();
            }
            config.views_in_state_dir(&state_dir, |place| !place.written);
            if !config.written.metrics_listen {
                if config.metrics.enabled {
                    tracing::info!(
                        "metrics not served: a simulated agent serves them where the agent.toml \
                         it is given writes [metrics] listen"
                    );
                }
                config.metrics.enabled = false;
            }
            tracing::info!(
                gpus = models.len(),
                spec = %spec,
                library = %simulator.library.display(),
                "simulating GPUs with gpushare's simulated driver"
            );
            Driver::Simulated(simulator.library)
        }
    };
    config.mps.root = mps_root(&config, simulated, &state_dir).0;
    // An agent without root cannot write /var/run/cdi, nor the other views' default
    // places: its views live with its state.
    if !unix::is_root() {
        config.views_in_state_dir(&state_dir, |place| place.at_default);
    }
    if hands_off.is_none()
        && !settings.read_only
        && let Err(e) = config.remember_whereabouts(&state_dir)
    {
        tracing::warn!("remembering where the MPS servers are: {e}");
    }
    Ok(Prepared {
        config,
        hands_off,
        state_dir,
        profiles_dir,
        driver,
        _state_lock: state_lock,
        _scratch: scratch,
    })
}

/// Where the MPS servers live, and the setting that put them there. With the agent's
/// state, unless agent.toml names their root: for an agent without root (it cannot write
/// the default under /run), and for a simulated node unless its agent.toml writes the root
/// (simulated GPUs have the same UUIDs on every node, so two simulated agents must not
/// share a root; the packaged agent's gpushare-mps@ units have their paths under the
/// default root).
fn mps_root(config: &AgentConfig, simulated: bool, state_dir: &Path) -> (PathBuf, &'static str) {
    if config.mps.root == AgentConfig::default().mps.root
        && (!unix::is_root() || (simulated && !config.written.mps_root))
    {
        (state_dir.join("mps"), "the state directory's mps/")
    } else {
        (config.mps.root.clone(), "[mps] root in agent.toml")
    }
}

/// Runs the agent until SIGTERM or SIGINT, then waits for a running job and stops. The
/// error says, in one line, why it could not start.
pub async fn run(settings: Settings, prepared: Prepared) -> Result<(), String> {
    let Prepared { config, hands_off, state_dir, profiles_dir, driver, _state_lock, _scratch } =
        prepared;
    // Descriptors in reserve: clients (metrics connections, bus peers) never take the
    // agent's last ones.
    if let Err(e) = unix::raise_open_files_limit() {
        tracing::warn!("cannot raise the limit of open files: {e}");
    }
    let backend = backend(driver, &config)?;
    let profiles = load_profiles(&profiles_dir);
    // The files kept true to the GPUs, built once from the configuration.
    let views = crate::engine::views::Views::from_config(&config);
    let health_backend = Arc::clone(&backend);
    let mut engine =
        Engine::new(backend, profiles, &state_dir, &config, views).map_err(|e| e.to_string())?;
    if let Some(why) = hands_off {
        engine = engine.hands_off(why);
    }
    let (launcher, how) = Launcher::detect().await;
    tracing::info!("bench replicas start as {how}");
    let engine = Arc::new(engine.with_launcher(launcher));

    // Metrics and systemd's status follow the engine before it does anything, so that no
    // job goes unheard of (the start-up re-apply included).
    let systemd_events = engine.subscribe();
    if config.metrics.enabled {
        match crate::metrics::install(config.metrics.listen) {
            Ok(()) => {
                tracing::info!(listen = %config.metrics.listen, "serving metrics");
                crate::metrics::follow(Arc::clone(&engine));
                crate::metrics::clients::watch(
                    Arc::clone(&engine),
                    Duration::from_secs(config.metrics.client_refresh_seconds),
                    config.metrics.client_series_max,
                );
            }
            Err(e) => tracing::warn!("metrics not served on {}: {e}", config.metrics.listen),
        }
    }

    // The GPUs' health before anything is planned (issue 42): the first readings taken and
    // the events registered for, so that a recovery or the start-up re-apply leaves a
    // faulted GPU alone, and no Xid raised once the agent serves goes unseen. Held until
    // the agent stops: dropping it stops the watcher's thread.
    let _watcher = watch_health(&engine, health_backend, &config, !settings.read_only).await;

    // Never serve with a GPU between two layouts: an interrupted apply is rolled back first.
    match engine.recover().await {
        Ok(Some(report)) => tracing::warn!("{report}"),
        Ok(None) => {}
        Err(e) => return Err(format!("{e}; not starting (fix the cause and start again)")),
    }
    // A bench the agent did not finish: its replicas stopped, the GPU as it found it.
    match engine.recover_bench().await {
        Ok(Some(report)) => tracing::warn!("{report}"),
        Ok(None) => {}
        Err(e) => return Err(format!("{e}; not starting (fix the cause and start again)")),
    }
    // What the active profile meant that the GPUs do not record (time-slicing replicas),
    // for the views, whatever the re-apply below does.
    engine.prime_views().await;
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
    // The views (the CDI spec) name what is there from the start (a re-apply rewrites
    // them itself).
    if boot_job.is_none() && !settings.read_only {
        engine.refresh_views().await;
    }

    let bus = settings.bus();
    let access = AccessPolicy::for_this_host(unix::effective_uid());
    let connection = service::serve(&bus, Arc::clone(&engine), access).await?;
    tracing::info!(
        bus = %bus,
        address = %connection.unique_name().map(|n| n.to_string()).unwrap_or_default(),
        backend = engine.backend_kind().as_str(),
        state_dir = %state_dir.display(),
        "serving {BUS_NAME}"
    );

    supervise(&engine, Duration::from_secs(config.mps.health_interval_seconds.max(1)));
    notify_systemd(&engine, systemd_events, boot_job.is_some());

    // Started, for systemd, once the GPUs are in their profile: units ordered after the
    // agent (and nvidia-gpu-reset.target, which DCGM and nvsm wait for) never see MIG on
    // with its instances still missing, and `systemctl restart gpushare-agent && gpushare-ctl
    // apply …` never finds the re-apply running. Clients that do not wait for systemd (a
    // D-Bus activation, an agent started by hand) are served meanwhile: their applies wait
    // for the re-apply (Gate::lock) instead of being refused.
    match boot_job {
        Some(job) => {
            let engine = Arc::clone(&engine);
            tokio::spawn(async move {
                boot_apply(&engine, job).await;
                notify_ready(&engine);
            });
        }
        None => notify_ready(&engine),
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
    // A bench would run on for minutes: it stops its replicas and restores the GPU now.
    engine.cancel_bench();
    let _idle = engine.quiesce().await;
    drop(connection);
    match lost {
        Some(why) => Err(why),
        None => Ok(()),
    }
}

/// Whether `bus` (`system`, `session` or an address) can be reached, as far as a connect
/// to its socket tells (a `unix:path=` address; others are left to the bus connection):
/// the one-line reason otherwise. Before anything is written, so that an agent started
/// where there is no such bus leaves nothing behind.
fn probe_bus(bus: &str) -> Result<(), String> {
    let address = match bus {
        "system" => std::env::var("DBUS_SYSTEM_BUS_ADDRESS")
            .unwrap_or_else(|_| gpushare_proto::SYSTEM_BUS_DEFAULT.into()),
        "session" => std::env::var("DBUS_SESSION_BUS_ADDRESS").unwrap_or_default(),
        address => address.to_owned(),
    };
    let paths = gpushare_proto::unix_socket_paths(&address);
    // Another kind of address among them: the connection itself will tell.
    if paths.is_empty() || paths.len() < address.split(';').filter(|a| !a.is_empty()).count() {
        return Ok(());
    }
    let mut why = String::new();
    for path in &paths {
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => return Ok(()),
            Err(e) => why = format!("{}: {e}", path.display()),
        }
    }
    let hint = if bus == "system" {
        "; to try gpushare without one, start a private bus and give its address with --bus \
         (README, \"Trying it by hand\")"
    } else {
        ""
    };
    let named = match bus {
        "system" | "session" => format!("the {bus} bus"),
        address => format!("the bus {address}"),
    };
    Err(format!("cannot connect to {named} ({why}): not starting, nothing written{hint}"))
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

/// The NVML backend on `driver`, resetting GPUs with the configured nvidia-smi.
fn backend(driver: Driver, config: &AgentConfig) -> Result<Arc<dyn GpuBackend>, String> {
    let simulated = driver.is_simulated();
    let backend = NvmlBackend::open(driver).map_err(|e| {
        if simulated {
            e.to_string()
        } else {
            format!("{e}; to try gpushare without a GPU, run with --simulate a100-40gb:8")
        }
    })?;
    Ok(Arc::new(backend.with_nvidia_smi(&config.timeslice.nvidia_smi)))
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
    // The bus says no more than this; its own log has why it dropped a connection (a
    // message over its size limit, a full queue, the bus itself stopping).
    match lost.next().await {
        Some(_) => format!("the bus took the name {BUS_NAME} away"),
        None => format!(
            "the bus closed the agent's connection, and with it {BUS_NAME} (the bus's log says why)"
        ),
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

/// Checks the MPS servers every `interval` (restarting those that died), and logs drift
/// from the active profile when something else changed the GPUs.
fn supervise(engine: &Arc<Engine>, interval: Duration) {
    let engine = Arc::clone(engine);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            engine.supervise_mps().await;
            engine.log_drift().await;
        }
    });
}

/// Starts the health watcher over every GPU (issue 42) and the engine's following of the
/// faults (rendering the views at each change unless `views` is false); `None` when
/// `[health] enabled` is false or the thread cannot start.
async fn watch_health(
    engine: &Arc<Engine>,
    backend: Arc<dyn crate::gpu::GpuBackend>,
    config: &AgentConfig,
    views: bool,
) -> Option<crate::health::watcher::Watcher> {
    if !config.health.enabled {
        engine.health().set_events_note(Some(
            "[health] enabled = false: the GPUs' health is not watched".into(),
        ));
        return None;
    }
    // The GPUs alone, from the driver (no MPS control daemon or nvidia-smi asked).
    let observer = Arc::clone(&backend);
    let observed = tokio::task::spawn_blocking(move || observer.observe()).await;
    let gpus = match observed {
        Ok(Ok(gpus)) => gpus.iter().map(|g| g.index).collect(),
        Ok(Err(e)) => {
            tracing::warn!("the GPUs' health is watched without a first observation: {e}");
            Vec::new()
        }
        Err(e) => {
            let e = crate::sys::task_failed(&e);
            tracing::warn!("the GPUs' health is watched without a first observation: {e}");
            Vec::new()
        }
    };
    let settings = crate::health::watcher::WatchSettings {
        gpus,
        poll: Duration::from_secs(config.health.poll_seconds),
    };
    let health = Arc::clone(engine.health());
    let started = tokio::task::spawn_blocking(move || {
        crate::health::watcher::spawn(backend, health, settings)
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(crate::sys::task_failed(&e))));
    let watcher = match started {
        Ok(watcher) => watcher,
        Err(e) => {
            tracing::error!("the GPUs' health is not watched: cannot start its thread: {e}");
            engine
                .health()
                .set_events_note(Some(format!("not watched: cannot start its thread: {e}")));
            return None;
        }
    };
    tokio::spawn(Arc::clone(engine).follow_health(views));
    Some(watcher)
}

/// systemd: `STATUS=` around jobs (from `events`; the first apply is the re-apply at
/// start-up when `re_applying`, the agent not yet ready); the watchdog pinged from a task
/// of its own that never waits on the driver. READY comes from [`notify_ready`].
fn notify_systemd(engine: &Engine, mut events: Receiver<EngineEvent>, mut re_applying: bool) {
    let status = format!("serving {BUS_NAME}: {} GPU backend", engine.backend_kind());
    let _ = sd_notify::notify(&[NotifyState::Status(&status)]);
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
                Ok(EngineEvent::JobStarted { kind: JobKind::Apply { profile }, steps })
                    if std::mem::take(&mut re_applying) =>
                {
                    format!("re-applying {profile} at start-up ({steps} steps); ready once done")
                }
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

/// Tells systemd that the agent has started.
fn notify_ready(engine: &Engine) {
    let status = format!("serving {BUS_NAME}: {} GPU backend", engine.backend_kind());
    let _ = sd_notify::notify(&[NotifyState::Ready, NotifyState::Status(&status)]);
}

/// Carries out the start-up re-apply, as a job like any other (its lines with the job
/// [`BOOT_JOB`] and the profile in the journal).
async fn boot_apply(engine: &Engine, job: ApplyJob) {
    let profile = job.plan().profile.clone();
    let span = log::apply_span(BOOT_JOB, &profile);
    async {
        let steps = job.plan().step_count();
        if steps > 0 {
            tracing::info!(steps, "re-applying {profile} at start-up");
        }
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
    .instrument(span)
    .await;
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
