//! `gpushare-agent`: serves the engine on D-Bus, on real GPUs through NVML or on
//! simulated ones.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;

use clap::Parser;
use gpushare_agent::access::AccessPolicy;
use gpushare_agent::config::{self, AgentConfig, GpuPolicy};
use gpushare_agent::engine::{ApplyJob, Engine};
use gpushare_agent::gpu::GpuBackend;
use gpushare_agent::gpu::nvml::{NvmlBackend, catalog_check};
use gpushare_agent::gpu::sim::{self, SimBackend, SimOptions};
use gpushare_agent::profile::ProfileStore;
use gpushare_agent::service::AgentService;
use gpushare_agent::sys::{files, unix};
use gpushare_proto::{BUS_NAME, OBJECT_PATH};
use tracing_subscriber::EnvFilter;

/// The gpushare agent: turns named sharing profiles into GPU state.
#[derive(Debug, Parser)]
#[command(name = "gpushare-agent", version, about)]
struct Args {
    /// Run on simulated GPUs instead of NVML, e.g. `a100-40gb:8` or `h100-80gb:4,a30:2`.
    #[arg(long, value_name = "MODEL:N,...")]
    simulate: Option<String>,

    /// Bus to serve on: `system`, `session` or a D-Bus address. Default: the system bus
    /// when running as root, the session bus otherwise.
    #[arg(long, value_name = "BUS")]
    bus: Option<String>,

    /// Configuration file.
    #[arg(long, value_name = "FILE", default_value = config::DEFAULT_CONFIG_PATH)]
    config: PathBuf,

    /// State directory (journal, simulator state); overrides the configuration file.
    /// Default without root: $XDG_STATE_HOME/gpushare.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,

    /// Profile directory; overrides the configuration file.
    #[arg(long, value_name = "DIR")]
    profiles_dir: Option<PathBuf>,

    /// Compare the MIG profile tables NVML reports for each GPU with the built-in
    /// catalog (read-only), print every difference, and exit: 0 when they agree.
    #[arg(long, conflicts_with = "simulate")]
    check_catalog: bool,

    /// Write the man page gpushare-agent.8 into DIR and exit (for packaging).
    #[arg(long, value_name = "DIR", hide = true)]
    generate_man: Option<PathBuf>,

    /// Run one CUDA probe client (JSON spec) in this process, print its result, and exit.
    #[arg(long, value_name = "JSON", hide = true)]
    probe_client: Option<String>,

    /// Run probe sweeps (`<workload|all> <n,n,...> <seconds>`), print JSON, and exit.
    #[arg(long, num_args = 3, value_names = ["WORKLOAD", "COUNTS", "SECONDS"], hide = true)]
    probe_run: Option<Vec<String>>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("GPUSHARE_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = Args::parse();
    if let Some(spec) = &args.probe_client {
        return gpushare_agent::probe::client::main(spec);
    }
    if let Some(run_args) = &args.probe_run {
        return gpushare_agent::probe::run::main(run_args);
    }
    if let Some(dir) = &args.generate_man {
        let page = clap_mangen::Man::new(<Args as clap::CommandFactory>::command()).section("8");
        return match page.manual("gpushare").generate_to(dir) {
            Ok(path) => {
                println!("{}", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("gpushare-agent: cannot write the man page into {}: {e}", dir.display());
                ExitCode::FAILURE
            }
        };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(64)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gpushare-agent: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.check_catalog {
        return check_catalog();
    }
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpushare-agent: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--check-catalog`: NVML's MIG profile tables against the catalog, read-only.
fn check_catalog() -> ExitCode {
    match NvmlBackend::new().and_then(|nvml| catalog_check::check(&nvml)) {
        Ok(report) => {
            for line in &report.lines {
                println!("{line}");
            }
            if report.agrees { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Err(e) => {
            eprintln!("gpushare-agent: {e}");
            ExitCode::FAILURE
        }
    }
}

fn user_state_dir() -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".local/state")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("gpushare")
}

async fn run(args: Args) -> Result<(), String> {
    let config = match AgentConfig::load(&args.config) {
        Ok(config) => config,
        Err(e) => {
            // Never act on half-read configuration: run, but change nothing on the GPUs.
            tracing::error!("{e}; running with defaults and changing nothing on the GPUs");
            AgentConfig { gpu: GpuPolicy::hands_off(), ..AgentConfig::default() }
        }
    };
    let state_dir = args.state_dir.clone().unwrap_or_else(|| {
        if unix::is_root() || config.state_dir != Path::new(config::DEFAULT_STATE_DIR) {
            config.state_dir.clone()
        } else {
            user_state_dir()
        }
    });
    let profiles_dir = args.profiles_dir.clone().unwrap_or(config.profiles_dir.clone());
    let _state_lock = files::lock_state_dir(&state_dir)
        .map_err(|e| format!("state directory {}: {e}", state_dir.display()))?;

    let backend: Arc<dyn GpuBackend> = match &args.simulate {
        Some(spec) => {
            let models = sim::parse_spec(spec)?;
            let options = SimOptions::from_env()?;
            std::fs::create_dir_all(&state_dir)
                .map_err(|e| format!("state directory {}: {e}", state_dir.display()))?;
            let backend =
                SimBackend::persistent(&models, &state_dir.join("simulated-gpus.json"), options)?;
            tracing::info!(gpus = models.len(), spec = %spec, "simulating GPUs");
            Arc::new(backend)
        }
        None => Arc::new(NvmlBackend::new().map_err(|e| {
            format!("{e}; to try gpushare without a GPU, run with --simulate a100-40gb:8")
        })?),
    };

    let profiles = ProfileStore::load(Some(&profiles_dir));
    for error in profiles.errors() {
        tracing::error!("profile left out: {error}");
    }
    let engine = Arc::new(Engine::new(backend, profiles, &state_dir, &config)?);

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

    let access = AccessPolicy::for_this_host(unix::effective_uid());
    let bus = args
        .bus
        .clone()
        .unwrap_or_else(|| if unix::is_root() { "system" } else { "session" }.into());
    let builder = match bus.as_str() {
        "system" => zbus::connection::Builder::system(),
        "session" => zbus::connection::Builder::session(),
        address => zbus::connection::Builder::address(address),
    }
    .map_err(|e| format!("bus {bus}: {e}"))?;
    let connection = builder
        .serve_at(OBJECT_PATH, AgentService::new(Arc::clone(&engine), access))
        .and_then(|b| b.name(BUS_NAME))
        .map_err(|e| format!("bus {bus}: {e}"))?
        .build()
        .await
        .map_err(|e| match e {
            zbus::Error::NameTaken => {
                format!("{BUS_NAME} is already owned on the {bus} bus: is another gpushare-agent running?")
            }
            e => format!("cannot serve on the {bus} bus: {e}"),
        })?;
    tracing::info!(
        bus = %bus,
        address = %connection.unique_name().map(|n| n.to_string()).unwrap_or_default(),
        backend = engine.backend_kind(),
        state_dir = %state_dir.display(),
        "serving {BUS_NAME}"
    );

    if config.metrics.enabled {
        match gpushare_agent::metrics::install(config.metrics.listen) {
            Ok(()) => tracing::info!(listen = %config.metrics.listen, "serving metrics"),
            Err(e) => tracing::warn!("metrics not served on {}: {e}", config.metrics.listen),
        }
    }

    // MPS servers are checked and restarted, and the metrics refreshed, in the background.
    {
        let engine = Arc::clone(&engine);
        let every = Duration::from_secs(config.mps.health_interval_seconds.max(1));
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                engine.supervise_mps().await;
                engine.refresh_metrics().await;
            }
        });
    }

    // systemd: ready once the bus name and the GPUs are up; the watchdog is pinged from a
    // task of its own that never waits on the driver.
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

    if let Some(job) = boot_job {
        let engine = Arc::clone(&engine);
        tokio::spawn(async move { boot_apply(&engine, job).await });
    }

    wait_for_termination().await;
    tracing::info!("stopping once no apply runs");
    let _ = sd_notify::notify(&[
        NotifyState::Stopping,
        NotifyState::Status("stopping once no apply runs"),
    ]);
    let _idle = engine.quiesce().await;
    drop(connection);
    Ok(())
}

/// Carries out the start-up re-apply, as a job like any other.
async fn boot_apply(engine: &Engine, job: ApplyJob) {
    let profile = job.plan().profile.clone();
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let outcome = engine.run_apply(&job, tx).await;
    drop(job);
    match outcome.error {
        None if outcome.changed => {
            tracing::info!(steps = outcome.steps_done, "re-applied {profile} at start-up")
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
