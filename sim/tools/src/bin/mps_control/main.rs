//! `gpushare-sim-nvidia-cuda-mps-control`: the simulated `nvidia-cuda-mps-control`, part of
//! gpushare's simulator (`gpushare-agent --simulate`, the tests, hosts without a GPU; the
//! package installs it as `/usr/lib/gpushare/sim/nvidia-cuda-mps-control`). It answers as
//! NVIDIA's control daemon of driver 580 / CUDA 13 answered on an H100
//! (tests/device/results/mps-probe-h100-2026-11-22.txt and the `control.log` that probe
//! produced), and records what it was asked.
//!
//! ```text
//! gpushare-sim-nvidia-cuda-mps-control -d [-M] start the control daemon in the background
//! gpushare-sim-nvidia-cuda-mps-control -f [-M] run the control daemon in the foreground
//! gpushare-sim-nvidia-cuda-mps-control         client: commands on stdin, answers on stdout
//! gpushare-sim-nvidia-cuda-mps-control -h      help
//! gpushare-sim-nvidia-cuda-mps-control --fake-client PID [--memory SIZE]
//!                                           (simulator only) client PID connects
//! gpushare-sim-nvidia-cuda-mps-control --fake-client-exit PID  (simulator only) client PID exits
//! ```
//!
//! As the real one, it takes the pipe directory from `CUDA_MPS_PIPE_DIRECTORY` (default
//! `/tmp/nvidia-mps`) and the log directory from `CUDA_MPS_LOG_DIRECTORY` (default
//! `/var/log/nvidia-mps`). The daemon writes `nvidia-cuda-mps-control.pid` (its PID, no
//! newline, mode 0666) and the unix socket `control` (mode 0666) into the pipe directory, and
//! appends `control.log` / `server.log` lines in the real format
//! (`[2026-11-22 07:35:47.105 Control   408] Cmd:get_server_list`) to the log directory; with
//! `-f` it also prints them on stdout. `-d` returns once the socket and the PID file exist,
//! the socket first. The daemon exits on `quit` (removing its PID file and socket), on
//! SIGTERM or SIGINT (the same), and by itself within 200 ms when its pipe directory is
//! deleted or replaced, so that simulated nodes (and tests) do not leak processes.
//!
//! Who may do what (`commands.rs`), as NVIDIA's daemon of driver 580 on an H100
//! (tests/device/results/mps-privilege-h100-2026-12-06): the daemon knows the user who
//! started it (its owner) and, from the peer credentials of each connection to its socket
//! (`SO_PEERCRED`), the user who sends each command. Queries are answered to everyone;
//! settings, `terminate_client`, `shutdown_server` and `quit` are carried out for the
//! owner and root only, anyone else getting the real daemon's refusal on stdout (exit 0).
//!
//! Simulated clients: without CUDA no real client ever connects. `--fake-client PID` makes
//! the daemon act as when the CUDA client `PID` connects, as the user running the tool (run
//! it as the client's user; a user other than root declares only their own processes). A
//! server runs for one user at a time (`state.rs`): the first client starts one for its
//! user, with the default limits set at that time, and is listed as its client while its
//! process runs; a client of another user waits, unlisted, until the server's clients are
//! gone, and then the server is replaced by one for that user, with the default limits.
//! With `-M` (`--multiuser-server`) one server, the owner's, serves every user's clients.
//! `PID` must be a running process: otherwise the tool says so in one line
//! on stderr and exits 1 without asking the daemon. A client leaves when its process ends
//! (the real server drops a client whose context goes with its process): from then on no
//! answer lists or counts it (`get_client_list`, `get_device_client_list`, `ps`), the
//! server's log says `Client process PID disconnected` within 200 ms, and its node entry
//! goes. "Ends" is the simulated driver's rule (`gpushare_sim_nvml::node::pid_alive`): no
//! `/proc/PID`, or a zombie of one thread. `--fake-client-exit PID` makes the client leave
//! at once (from the client's user or root). The server stays when its last client leaves,
//! as the real one does. The server is not a process: its PID is a number only, the
//! daemon's PID + 1 for the first server, counting up for each server after it.
//!
//! The daemon also registers each client in the simulated node (`GPUSHARE_SIM_STATE`, as
//! the simulated nvidia-smi finds it) as the driver lists it: a compute process and an MPS
//! client, using `--memory SIZE` of GPU memory (`2GiB`, `1536MiB`, bytes; 512 MiB without),
//! on the GPU or the MIG device's GPU instance that the first device of its
//! `CUDA_VISIBLE_DEVICES` names (GPU 0 when unset). The entry goes when the client leaves
//! (its process ends, `--fake-client-exit`, `terminate_client`), at `quit` and when the daemon stops; the
//! driver lists it only while PID runs. Since the server is no process, the server's own
//! entry (66 MiB on the real driver) is not registered. See `node_clients.rs`.
//!
//! Record lines (appended to the file named by `GPUSHARE_SIM_RECORD`):
//!
//! ```text
//! mps-control daemon pipe=<dir> visible=<CUDA_VISIBLE_DEVICES or (unset)>
//! mps-control daemon-exit pipe=<dir> reason=<quit|signal|pipe-dir-removed>
//! mps-control pipe=<dir> cmd=<command line as sent>
//! mps-control pipe=<dir> error=no-daemon
//! mps-control pipe=<dir> fake-client=<pid>[ memory=<bytes>]
//! mps-control pipe=<dir> fake-client-exit=<pid>
//! ```
//!
//! Between client and daemon the simulator speaks its own protocol, not NVIDIA's: one
//! command per line, each answered by the answer's lines and then a line holding only U+0004.
//! A `--fake-client` event is answered by no line, or by the one line saying why the daemon
//! refused it, which the tool prints on stderr before exiting 1.
//!
//! The code: `main.rs` reads the command line and runs the mode it asks for; `state.rs` is
//! the simulated daemon's servers and clients; `commands.rs` its answers and who may give
//! each command; `limits.rs` the limit values; `daemon.rs` serves them on the control socket;
//! `client.rs` asks them; `pipe_dir.rs` owns the PID file and the socket's name;
//! `node_clients.rs` registers the clients in the simulated node; `log_line.rs` writes the
//! real log format; `protocol.rs` is the client-daemon protocol;
//! `../../common.rs` (shared with the simulated nvidia-smi) writes the record.

mod client;
mod commands;
#[path = "../../common.rs"]
mod common;
mod daemon;
mod limits;
mod log_line;
mod node_clients;
mod pipe_dir;
mod protocol;
#[cfg(test)]
mod recorded_tests;
mod state;

use std::io;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use client::{not_a_client, run_client, run_fake_client};
use daemon::{DaemonConfig, ServeError, serve};
use gpushare_sim_nvml::faults::parse_size;
use gpushare_sim_nvml::node::STATE_ENV;
use pipe_dir::{read_pid_file, running_pid};

const DEFAULT_PIPE_DIR: &str = "/tmp/nvidia-mps";
const DEFAULT_LOG_DIR: &str = "/var/log/nvidia-mps";
/// The hidden argument of the re-executed background daemon.
const SERVE_ARG: &str = "--serve";
/// Exit status of `--serve` when another daemon owns the pipe directory.
const EXIT_ALREADY_RUNNING: u8 = 3;

const ALREADY_RUNNING: &str = "An instance of this daemon is already running";

/// The real tool's `-h` (the probe's first 20 lines), then the commands this simulation knows.
const HELP: &str = "\
CUDA MPS Control for Linux/Unix/QNX.
Copyright (C) 2003 - 2025 NVIDIA Corporation.

  This program allows multiple CUDA processes to share a single GPU context. For information on how to use the CUDA MPS, see the nvidia-cuda-mps-control manual page.

nvidia-cuda-mps-control [options] [command]
OPTIONS:
  -h,--help                Print this message
  -d,--daemon              Setup the daemon in the background
  -f,--forground           Setup the daemon in the foreground
  -M,--multiuser-server    Enable multi-user mode
  -q,--ready-devices      Prepare the daemon to query devices on startup

COMMAND:
  start_server -uid <user id>
                       Start a new instance of nvidia-cuda-mps-server with the given user ID
  quit
                       Terminate the controller
  get_server_list
                       Print out a list of servers
  (simulated) also: get_server_status, get_client_list, get_device_client_list, ps,
  set_/get_default_active_thread_percentage, set_/get_active_thread_percentage,
  set_/get_default_device_pinned_mem_limit, set_/get_device_pinned_mem_limit,
  terminate_client, shutdown_server, set_/get_default_client_priority
  (simulated) settings, terminate_client, shutdown_server and quit only from the user
  who started the daemon or root; a server serves one user at a time unless -M
  (simulator only) --fake-client PID [--memory SIZE], --fake-client-exit PID
  (as the client's user)
";

/// Set by SIGTERM / SIGINT.
static TERMINATE: AtomicBool = AtomicBool::new(false);

extern "C" fn on_terminate(_signal: std::ffi::c_int) {
    TERMINATE.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    use nix::sys::signal::{SigHandler, Signal, signal};
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: `on_terminate` only stores to an atomic, which is async-signal-safe, and
        // it is a plain function that lives as long as the process.
        let _ = unsafe { signal(sig, SigHandler::Handler(on_terminate)) };
    }
}

/// The environment the tool reads.
struct Env {
    pipe_dir: PathBuf,
    log_dir: PathBuf,
    visible_devices: Option<String>,
    record: Option<PathBuf>,
    state_file: Option<PathBuf>,
}

impl Env {
    fn from_process() -> Env {
        let dir = |name: &str, default: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map_or_else(|| PathBuf::from(default), PathBuf::from)
        };
        Env {
            pipe_dir: dir("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_PIPE_DIR),
            log_dir: dir("CUDA_MPS_LOG_DIRECTORY", DEFAULT_LOG_DIR),
            visible_devices: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
            record: common::record_path_from_env(),
            state_file: std::env::var_os(STATE_ENV).filter(|v| !v.is_empty()).map(PathBuf::from),
        }
    }

    fn daemon_config(&self, echo: bool, multiuser: bool) -> DaemonConfig {
        DaemonConfig {
            pipe_dir: self.pipe_dir.clone(),
            log_dir: self.log_dir.clone(),
            pid: std::process::id(),
            visible_devices: self.visible_devices.clone(),
            record: self.record.clone(),
            echo,
            state_file: self.state_file.clone(),
            multiuser,
        }
    }
}

/// What the command line asks for; the daemon's modes say whether `-M` was given.
#[derive(Debug, PartialEq)]
enum Mode {
    Client,
    Background(bool),
    Foreground(bool),
    Serve(bool),
    Help,
    /// `--fake-client PID [--memory SIZE]` (bytes).
    FakeClient(u32, Option<u64>),
    FakeClientExit(u32),
}

fn parse_args(args: &[String]) -> Result<Mode, String> {
    let mut mode = Mode::Client;
    let mut memory = None;
    let mut multiuser = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let next = match arg.as_str() {
            "--memory" => {
                let size = it.next().ok_or("--memory needs a size (2GiB, 1536MiB, bytes)")?;
                memory = Some(parse_size(size).map_err(|e| format!("--memory: {e}"))?);
                continue;
            }
            "-M" | "--multiuser-server" => {
                multiuser = true;
                continue;
            }
            "-d" | "--daemon" => Mode::Background(false),
            "-f" | "--forground" | "--foreground" => Mode::Foreground(false),
            "-q" | "--ready-devices" => continue,
            "-h" | "--help" => Mode::Help,
            SERVE_ARG => Mode::Serve(false),
            "--fake-client" | "--fake-client-exit" => {
                let pid = it
                    .next()
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(|| format!("{arg} needs a PID"))?;
                if arg == "--fake-client" {
                    Mode::FakeClient(pid, None)
                } else {
                    Mode::FakeClientExit(pid)
                }
            }
            other => return Err(format!("Invalid option: {other}")),
        };
        if mode != Mode::Client && mode != next {
            return Err(format!("{arg} cannot be combined with the options before it"));
        }
        mode = next;
    }
    match (mode, memory) {
        (Mode::FakeClient(pid, _), memory) => Ok(Mode::FakeClient(pid, memory)),
        (_, Some(_)) => Err("--memory goes with --fake-client".into()),
        (Mode::Background(_), None) => Ok(Mode::Background(multiuser)),
        (Mode::Foreground(_), None) => Ok(Mode::Foreground(multiuser)),
        (Mode::Serve(_), None) => Ok(Mode::Serve(multiuser)),
        // As the real tool, a client ignores `-M`.
        (mode, None) => Ok(mode),
    }
}

/// Serves in this process (`-f`, or the re-executed `--serve`), with `-M` or not.
fn run_daemon(env: &Env, echo: bool, multiuser: bool, already_running_status: u8) -> u8 {
    install_signal_handlers();
    match serve(env.daemon_config(echo, multiuser), &TERMINATE) {
        Ok(_) => 0,
        Err(ServeError::AlreadyRunning(pid)) => {
            println!("{ALREADY_RUNNING}");
            eprintln!(
                "simulated nvidia-cuda-mps-control: daemon {pid} owns {}",
                env.pipe_dir.display()
            );
            already_running_status
        }
        Err(ServeError::Io(e)) => {
            eprintln!("simulated nvidia-cuda-mps-control: cannot start the daemon: {e}");
            1
        }
    }
}

/// `-d`: starts the daemon detached (re-executed with `--serve`, and `-M` when given, in a
/// new session, stdio on /dev/null) and returns once its socket and PID file exist.
fn start_background(env: &Env, multiuser: bool) -> u8 {
    if running_pid(&env.pipe_dir).is_some() {
        println!("{ALREADY_RUNNING}");
        return 1;
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("simulated nvidia-cuda-mps-control: cannot find its own binary: {e}");
            return 1;
        }
    };
    let mut command = Command::new(exe);
    command.arg(SERVE_ARG).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    if multiuser {
        command.arg("-M");
    }
    // SAFETY: the closure runs in the forked child before exec and only calls setsid(2),
    // which is async-signal-safe (nix's wrapper takes no lock and allocates nothing).
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid()?;
            Ok(())
        });
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("simulated nvidia-cuda-mps-control: cannot start the daemon: {e}");
            return 1;
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if read_pid_file(&env.pipe_dir) == Some(child.id()) {
            return 0;
        }
        if let Ok(Some(status)) = child.try_wait() {
            if status.code() == Some(i32::from(EXIT_ALREADY_RUNNING)) {
                println!("{ALREADY_RUNNING}");
            } else {
                eprintln!(
                    "simulated nvidia-cuda-mps-control: the daemon exited at start ({status})"
                );
            }
            return 1;
        }
        if Instant::now() > deadline {
            eprintln!("simulated nvidia-cuda-mps-control: the daemon did not start within 10 s");
            return 1;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let env = Env::from_process();
    let mode = match parse_args(&args) {
        Ok(mode) => mode,
        Err(message) => {
            eprintln!("{message}");
            eprint!("{HELP}");
            return ExitCode::from(1);
        }
    };
    let record = env.record.as_deref();
    let mut stdout = io::stdout().lock();
    let status = match mode {
        Mode::Help => {
            print!("{HELP}");
            0
        }
        Mode::Client => run_client(&env.pipe_dir, io::stdin().lock(), &mut stdout, record),
        Mode::FakeClient(pid, memory) => match not_a_client(pid) {
            Some(why) => {
                eprintln!("{why}");
                1
            }
            None => run_fake_client(&env.pipe_dir, pid, true, memory, &mut stdout, record),
        },
        Mode::FakeClientExit(pid) => {
            run_fake_client(&env.pipe_dir, pid, false, None, &mut stdout, record)
        }
        Mode::Background(multiuser) => start_background(&env, multiuser),
        Mode::Foreground(multiuser) => {
            drop(stdout);
            run_daemon(&env, true, multiuser, 1)
        }
        Mode::Serve(multiuser) => {
            drop(stdout);
            run_daemon(&env, false, multiuser, EXIT_ALREADY_RUNNING)
        }
    };
    ExitCode::from(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(parse_args(&args(&[])), Ok(Mode::Client));
        assert_eq!(parse_args(&args(&["-d"])), Ok(Mode::Background(false)));
        assert_eq!(parse_args(&args(&["-M", "-d"])), Ok(Mode::Background(true)));
        assert_eq!(parse_args(&args(&["-d", "--multiuser-server"])), Ok(Mode::Background(true)));
        assert_eq!(parse_args(&args(&["--forground"])), Ok(Mode::Foreground(false)));
        assert_eq!(parse_args(&args(&["-f", "-M"])), Ok(Mode::Foreground(true)));
        assert_eq!(parse_args(&args(&["--serve", "-M"])), Ok(Mode::Serve(true)));
        assert_eq!(parse_args(&args(&["-M"])), Ok(Mode::Client));
        assert_eq!(parse_args(&args(&["-q", "-d"])), Ok(Mode::Background(false)));
        assert_eq!(parse_args(&args(&["--fake-client", "12"])), Ok(Mode::FakeClient(12, None)));
        assert_eq!(
            parse_args(&args(&["--fake-client", "12", "--memory", "2GiB"])),
            Ok(Mode::FakeClient(12, Some(2 << 30)))
        );
        assert_eq!(
            parse_args(&args(&["--memory", "2485125120", "--fake-client", "12"])),
            Ok(Mode::FakeClient(12, Some(2_485_125_120)))
        );
        assert!(parse_args(&args(&["--fake-client", "12", "--memory"])).is_err());
        assert!(parse_args(&args(&["--fake-client", "12", "--memory", "2 PiB"])).is_err());
        assert!(parse_args(&args(&["--fake-client-exit", "12", "--memory", "1G"])).is_err());
        assert_eq!(parse_args(&args(&["--fake-client-exit", "12"])), Ok(Mode::FakeClientExit(12)));
        assert!(parse_args(&args(&["--fake-client"])).is_err());
        assert!(parse_args(&args(&["-x"])).is_err());
        assert!(parse_args(&args(&["-d", "-f"])).is_err());
    }
}
