//! `gpushare-agent`: the command line, dispatched to its modes — the service
//! ([`gpushare_agent::daemon`]), `--check-catalog`, and the hidden modes for packaging and
//! for the probe's client processes.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use gpushare_agent::config;
use gpushare_agent::daemon::{self, Settings};
use gpushare_agent::gpu::GpuBackend;
use gpushare_agent::gpu::nvml::{Driver, NvmlBackend, catalog_check};
use gpushare_agent::sys::log::{self, Destination};

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

    /// Configuration file. Default: /etc/gpushare/agent.toml, which --simulate reads only
    /// when named here (its places and hooks are the real agent's).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,

    /// State directory (journal, simulator state); overrides the configuration file.
    /// Default without root: $XDG_STATE_HOME/gpushare; with --simulate as root:
    /// /run/gpushare-sim (never the real agent's /var/lib/gpushare unless named).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,

    /// Profile directory; overrides the configuration file.
    #[arg(long, value_name = "DIR")]
    profiles_dir: Option<PathBuf>,

    /// Compare the MIG profile tables NVML reports for each GPU with the built-in
    /// catalog (read-only), print every difference, and exit: 0 when they agree.
    /// With --simulate, the simulated driver's tables are compared.
    #[arg(long)]
    check_catalog: bool,

    /// Check that the NVIDIA driver (with --simulate, gpushare's simulated one) loads and
    /// lists the GPUs, and exit: 0 when it does, else 1 with one line saying why. The
    /// unit runs it as its ExecCondition=, so that a host without a driver neither starts
    /// nor restarts the agent.
    #[arg(long)]
    check_driver: bool,

    /// Stop every MPS control daemon under the configured MPS root, each through its own
    /// control binary, and exit (the package's removal runs it once the unit stopped).
    #[arg(long, hide = true)]
    stop_mps: bool,

    /// Print what NVML answers about every GPU as JSON, read-only, and exit (to compare a
    /// real driver's answers with the simulated driver's).
    #[arg(long, hide = true)]
    dump_nvml: bool,

    /// Write the man page gpushare-agent.8 into DIR and exit (for packaging).
    #[arg(long, value_name = "DIR", hide = true)]
    generate_man: Option<PathBuf>,

    /// Run one CUDA probe client (JSON spec) in this process, print its result, and exit.
    #[arg(long, value_name = "JSON", hide = true)]
    probe_client: Option<String>,

    /// Run a bench replica's gate: descriptor 0 is its control socket to the agent, 1 the
    /// replica's report pipe (see DESIGN.md, "Replicas are the user's own processes").
    #[arg(long, hide = true)]
    bench_gate: bool,

    /// Whom the gate becomes first: UID:GID:GROUP,... (exactly these groups).
    #[arg(long, value_name = "UID:GID:GROUPS", hide = true, requires = "bench_gate")]
    bench_user: Option<String>,

    /// Run a built-in workload as a bench replica (units on GPUSHARE_BENCH_REPORT).
    #[arg(long, value_name = "WORKLOAD", hide = true)]
    bench_builtin: Option<gpushare_proto::Workload>,

    /// Run probe sweeps (`<workload|all> <n,n,...> <seconds>`), print JSON, and exit.
    #[arg(long, num_args = 3, value_names = ["WORKLOAD", "COUNTS", "SECONDS"], hide = true)]
    probe_run: Option<Vec<String>>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.bench_gate {
        // Before anything else (no logging, no thread): it first becomes the caller.
        return gpushare_agent::bench::gate::main(args.bench_user.as_deref());
    }
    // The journal under systemd, else stderr (DESIGN.md, "Logging"); a simulated agent's
    // terminal gets warnings and errors only.
    let logging = log::init(args.simulate.is_some());
    if let Some(workload) = args.bench_builtin {
        return gpushare_agent::probe::client::bench_replica(workload);
    }
    if let Some(spec) = &args.probe_client {
        return gpushare_agent::probe::client::main(spec);
    }
    if let Some(run_args) = &args.probe_run {
        return gpushare_agent::probe::run::main(run_args);
    }
    if let Some(dir) = &args.generate_man {
        return match gpushare_agent::man::write(<Args as clap::CommandFactory>::command(), dir) {
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
    if args.stop_mps {
        let config = args.config.clone().unwrap_or_else(|| config::DEFAULT_CONFIG_PATH.into());
        return stop_mps(&config);
    }
    let settings = Settings {
        simulate: args.simulate,
        bus: args.bus,
        config: args.config,
        state_dir: args.state_dir,
        profiles_dir: args.profiles_dir,
        read_only: args.check_driver || args.check_catalog || args.dump_nvml,
    };
    // Before any driver is loaded: the simulated one refuses to start in an agent that
    // means NVIDIA's (found as libnvidia-ml by mistake), so that it reads and makes nothing.
    // SAFETY: no other thread runs yet: the async runtime starts below.
    unsafe { gpushare_agent::simulator::declare_driver(settings.simulate.is_some()) };
    if settings.simulate.is_none() {
        if args.check_driver {
            // The host's files are where agent.toml says (a container: the host's root).
            let path = settings.config_path().unwrap_or_default();
            let config = gpushare_agent::config::AgentConfig::load(&path);
            let host_root = config.map(|c| c.host_root).unwrap_or_else(|_| "/".into());
            return check_driver(logging, Driver::Nvidia, &host_root);
        }
        if args.check_catalog {
            return check_catalog(Driver::Nvidia);
        }
        if args.dump_nvml {
            return dump_nvml(Driver::Nvidia);
        }
    }
    // What clients make the agent allocate goes back to the system once freed.
    gpushare_agent::sys::unix::return_large_buffers();
    // SAFETY: no other thread runs yet: the async runtime starts below.
    let prepared = match unsafe { daemon::prepare(&settings) } {
        Ok(prepared) => prepared,
        Err(e) => return fail(logging, &e),
    };
    if args.check_driver {
        return check_driver(logging, prepared.driver().clone(), prepared.host_root());
    }
    if args.check_catalog {
        return check_catalog(prepared.driver().clone());
    }
    if args.dump_nvml {
        return dump_nvml(prepared.driver().clone());
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(64)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(logging, &format!("cannot start the async runtime: {e}")),
    };
    match runtime.block_on(daemon::run(settings, prepared)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(logging, &e),
    }
}

/// `--check-driver`: whether the driver loads and lists the GPUs, read-only; one line
/// (under systemd's ExecCondition= a warning in the journal when it does not), then one
/// per GPU whose reset (for an Ampere MIG mode change) something on this host would block.
fn check_driver(log: Destination, driver: Driver, host_root: &std::path::Path) -> ExitCode {
    let opened = NvmlBackend::open(driver);
    match opened.as_ref().map_err(Clone::clone).and_then(|nvml| nvml.observe()) {
        Ok(gpus) => {
            println!("gpushare-agent: the NVIDIA driver answers: {} GPUs", gpus.len());
            if let Ok(nvml) = &opened {
                for gpu in &gpus {
                    if let Some(blocker) = nvml.reset_blocker(gpu.index, host_root) {
                        println!(
                            "gpushare-agent: {} cannot be reset here: {}",
                            gpu.label(),
                            blocker.cause(false)
                        );
                    }
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            let why = format!("not starting, the NVIDIA driver does not answer: {e}");
            match log {
                Destination::Journal => tracing::warn!("{why}"),
                Destination::Stderr => eprintln!("gpushare-agent: {why}"),
            }
            ExitCode::FAILURE
        }
    }
}

/// Why the service could not start or run: an error entry in the journal (where
/// `journalctl -p err` finds it), or the line on stderr it always was.
fn fail(log: Destination, why: &str) -> ExitCode {
    match log {
        Destination::Journal => tracing::error!("{why}"),
        Destination::Stderr => eprintln!("gpushare-agent: {why}"),
    }
    ExitCode::FAILURE
}

/// `--stop-mps`: quits every MPS control daemon with a record under the MPS root, through
/// the daemon's own executable (`/proc/PID/exe`: NVIDIA's control binary, or the
/// simulator's for an agent that ran `--simulate`), and removes its directory.
fn stop_mps(config: &std::path::Path) -> ExitCode {
    use gpushare_agent::sharing::mps::{MpsConfig, MpsController, MpsLaunch};
    // A configuration that does not read still has the default root.
    let mps = gpushare_agent::config::AgentConfig::load(config).unwrap_or_default().mps;
    let found = MpsController::new(MpsConfig {
        control: mps.control.clone(),
        root: mps.root.clone(),
        launch: MpsLaunch::Direct,
    });
    let mut failed = false;
    for daemon in found.daemons() {
        let control = daemon
            .pid
            .and_then(|pid| std::fs::read_link(format!("/proc/{pid}/exe")).ok())
            .unwrap_or_else(|| mps.control.clone());
        let owner = MpsController::new(MpsConfig {
            control,
            root: mps.root.clone(),
            launch: MpsLaunch::Direct,
        });
        if let Err(e) = owner.stop(&daemon.record.uuid) {
            eprintln!("gpushare-agent: {e}");
            failed = true;
        }
    }
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

/// `--check-catalog`: NVML's MIG profile tables against the catalog, read-only.
fn check_catalog(driver: Driver) -> ExitCode {
    match NvmlBackend::open(driver)
        .and_then(|nvml| catalog_check::check(&nvml, |l| println!("{l}")))
    {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("gpushare-agent: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--dump-nvml`: what NVML answers about every GPU, as JSON, read-only.
fn dump_nvml(driver: Driver) -> ExitCode {
    match NvmlBackend::open(driver).and_then(|nvml| catalog_check::dump(&nvml)) {
        Ok(doc) => {
            println!("{doc:#}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gpushare-agent: {e}");
            ExitCode::FAILURE
        }
    }
}
