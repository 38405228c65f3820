//! Harness for the end-to-end tests: a private `dbus-daemon`, `gpushare-agent` on
//! simulated GPUs, and `gpushare-ctl` run as a user runs it.
//!
//! The binaries are taken from `GPUSHARE_AGENT_BIN` / `GPUSHARE_CTL_BIN` (and the simulated
//! NVIDIA tools from `GPUSHARE_SIM_NVIDIA_SMI_BIN` / `GPUSHARE_SIM_MPS_CONTROL_BIN`) when set
//! (to test installed ones), else from the cargo target directory beside the test executable
//! (`cargo test --workspace` builds them).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpushare_proto::types::{MpsServer, MpsStatus, Status};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tempfile::TempDir;

pub mod cgroup;
pub mod device_plugin;
pub mod mps_control;
pub mod nfd;
pub mod podman;
pub mod slurm;
pub mod users;
pub use cgroup::Cgroup;
pub use gpushare_test_skip::skip;
pub use podman::{Podman, validate_cdi};
pub use slurm::Slurm;
pub use users::{MEMBER, OTHER, SECRET_GROUP, directory_of, ensure_users, exists, id_of, members};

/// Instance profiles of `half-balanced`/`all-balanced` on an A100-40GB, sorted.
pub const BALANCED_A100: [&str; 4] = ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"];
/// Instance profiles of `half-balanced`/`all-balanced` on an H100-80GB, sorted.
pub const BALANCED_H100: [&str; 4] = ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"];

/// The simulated nvidia-smi's binary (crate gpushare-sim-tools).
pub const SIM_NVIDIA_SMI: &str = "gpushare-sim-nvidia-smi";
/// The variable naming another simulated nvidia-smi to run (an installed one).
pub const SIM_NVIDIA_SMI_ENV: &str = "GPUSHARE_SIM_NVIDIA_SMI_BIN";
/// The simulated nvidia-cuda-mps-control's binary (crate gpushare-sim-tools).
pub const SIM_MPS_CONTROL: &str = "gpushare-sim-nvidia-cuda-mps-control";
/// The variable naming another simulated nvidia-cuda-mps-control to run.
pub const SIM_MPS_CONTROL_ENV: &str = "GPUSHARE_SIM_MPS_CONTROL_BIN";
/// The simulated node's file in the agent's state directory.
pub const SIM_STATE_FILE: &str = "simulated-gpus.json";

/// Path of a workspace binary.
pub fn binary(name: &str, env: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env) {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/e2e-<hash> or target/<profile>/<bin> → target/<profile>/<name>
    let dir = exe.parent().expect("target directory");
    let dir = if dir.ends_with("deps") { dir.parent().expect("target directory") } else { dir };
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (cargo test --workspace builds it) or set {env}",
        path.display()
    );
    path
}

/// The simulated driver library as cargo built it (`GPUSHARE_SIM_NVML_LIB` when set): the
/// newer of the target directory's copy and `deps/`'s, since `cargo test` builds it only as
/// a dependency and leaves it in `deps/` (a clean checkout has no other).
pub fn simulated_library() -> PathBuf {
    if let Some(path) = std::env::var_os("GPUSHARE_SIM_NVML_LIB") {
        return PathBuf::from(path);
    }
    let smi = binary(SIM_NVIDIA_SMI, SIM_NVIDIA_SMI_ENV);
    let dir = smi.parent().expect("target directory");
    [dir.to_path_buf(), dir.join("deps")]
        .iter()
        .map(|d| d.join("libgpushare_sim_nvml.so"))
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p)
        .expect("cargo builds the simulated driver with the workspace")
}

/// Runs `gpushare-agent` with `args` (a read-only check: `--check-driver`,
/// `--check-catalog`, `--dump-nvml`), warnings only, and waits for it.
pub fn agent_check(args: &[&str]) -> Output {
    Command::new(binary("gpushare-agent", "GPUSHARE_AGENT_BIN"))
        .args(args)
        .env("GPUSHARE_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("gpushare-agent runs")
}

/// Path of the repository's root (`GPUSHARE_REPO_ROOT` when the tests run elsewhere).
pub fn repo_root() -> PathBuf {
    if let Some(root) = std::env::var_os("GPUSHARE_REPO_ROOT") {
        return PathBuf::from(root);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repository root").to_path_buf()
}

/// A private dbus-daemon, stopped on drop.
pub struct Bus {
    child: Child,
    address: String,
    _dir: TempDir,
}

impl Bus {
    /// Starts a system-type bus as a system bus is set up (deny by default, everyone may
    /// connect: the socket is world-writable), plus `include`, a policy file such as the
    /// package's. Without `include`, a policy that lets everything through, to show the
    /// agent's own access check.
    pub fn start_system(include: Option<&Path>) -> Bus {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temporary directory");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let permissive = if include.is_none() {
            "<policy context=\"default\"><allow own=\"*\"/><allow send_destination=\"*\"/></policy>"
        } else {
            ""
        };
        let include =
            include.map(|p| format!("<include>{}</include>", p.display())).unwrap_or_default();
        let config = format!(
            r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <auth>EXTERNAL</auth>
  <listen>unix:path={dir}/bus</listen>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Properties"/>
  </policy>
  {permissive}
  {include}
</busconfig>
"#,
            dir = dir.path().display()
        );
        let path = dir.path().join("system.conf");
        std::fs::write(&path, config).unwrap();
        let mut child = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", path.display()))
            .args(["--nofork", "--nopidfile", "--print-address=1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("dbus-daemon runs (apt-get install dbus-daemon)");
        let mut address = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut address).unwrap();
        // Other users must reach the socket.
        std::fs::set_permissions(dir.path().join("bus"), std::fs::Permissions::from_mode(0o777))
            .unwrap();
        Bus { child, address: address.trim().to_string(), _dir: dir }
    }

    /// Starts a session-type bus with the repository's test configuration.
    pub fn start() -> Bus {
        let dir = tempfile::tempdir().expect("temporary directory");
        let address = format!("unix:path={}", dir.path().join("bus").display());
        let mut child = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", repo_root().join("tests/dbus/session.conf").display()))
            .arg(format!("--address={address}"))
            .args(["--nofork", "--nopidfile", "--print-address=1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("dbus-daemon runs (apt-get install dbus-daemon)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("dbus-daemon prints its address");
        assert!(line.starts_with("unix:"), "dbus-daemon said {line:?}");
        Bus { child, address: line.trim().to_string(), _dir: dir }
    }

    /// The bus address (`unix:path=…,guid=…`).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Stops the bus daemon, as a bus restart or crash would.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How to start an agent.
#[derive(Debug, Clone, Default)]
pub struct AgentOptions {
    /// `--simulate` value; empty for real GPUs through NVML.
    pub simulate: String,
    /// Extra environment (`GPUSHARE_SIM_*`).
    pub env: Vec<(String, String)>,
    /// Profile files to put into the profile directory: (file name, text).
    pub profiles: Vec<(String, String)>,
    /// agent.toml text.
    pub config: Option<String>,
    /// A directory holding the `gpushare-agent` and `gpushare-ctl` to run, instead of
    /// those the environment or the target directory name (another build, to compare).
    pub binaries: Option<PathBuf>,
    /// A file the agent's stderr is appended to, instead of the test's stderr.
    pub stderr: Option<PathBuf>,
    /// Serve other users ([`MEMBER`], [`OTHER`]): a system-type bus with the package's
    /// policy, and the agent's directory (with a copy of `gpushare-ctl`) open to them.
    pub other_users: bool,
    /// Start the agent in a session of its own whose controlling terminal is a fresh
    /// pseudo-terminal (as an agent started from a terminal has one).
    pub terminal: bool,
}

impl AgentOptions {
    /// Simulating `spec`.
    pub fn simulate(spec: &str) -> Self {
        AgentOptions { simulate: spec.into(), ..Self::default() }
    }

    /// With an environment variable.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// With this agent.toml text.
    pub fn config(mut self, text: &str) -> Self {
        self.config = Some(text.into());
        self
    }

    /// Running the `gpushare-agent` and `gpushare-ctl` of directory `dir`.
    pub fn binaries(mut self, dir: &Path) -> Self {
        self.binaries = Some(dir.to_path_buf());
        self
    }

    /// With the agent's stderr appended to `file`.
    pub fn stderr_to(mut self, file: &Path) -> Self {
        self.stderr = Some(file.to_path_buf());
        self
    }

    /// Serving [`MEMBER`] and [`OTHER`] too (see [`AgentOptions::other_users`]).
    pub fn for_other_users(mut self) -> Self {
        self.other_users = true;
        self
    }

    /// With a controlling terminal (see [`AgentOptions::terminal`]).
    pub fn with_terminal(mut self) -> Self {
        self.terminal = true;
        self
    }

    /// With a profile file.
    pub fn profile(mut self, file: &str, text: &str) -> Self {
        self.profiles.push((file.into(), text.into()));
        self
    }
}

/// How long starting an agent waits before the test goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Until it answers `status` with no apply in progress: its re-apply at start-up, if
    /// any, is over.
    Settled,
    /// Until its bus name answers `status`, whatever it is doing (the re-apply at start-up
    /// may still run).
    Answering,
    /// Not at all: the process has been started.
    Started,
}

/// A running `gpushare-agent` on a private bus, stopped on drop. Its state directory
/// outlives restarts of the agent.
pub struct Agent {
    child: Option<Child>,
    options: AgentOptions,
    /// The controlling terminal's master side, held open while the agent runs.
    terminal: Option<std::fs::File>,
    /// The state directory.
    pub dir: TempDir,
    /// The bus it serves on.
    pub bus: Bus,
}

impl Agent {
    /// Starts a bus and an agent on it, and waits until it answers.
    pub fn start(options: AgentOptions) -> Agent {
        let dir = tempfile::tempdir().expect("temporary directory");
        std::fs::create_dir_all(dir.path().join("profiles.d")).unwrap();
        for (name, text) in &options.profiles {
            std::fs::write(dir.path().join("profiles.d").join(name), text).unwrap();
        }
        std::fs::write(dir.path().join("agent.toml"), with_sim_tools(&options, dir.path()))
            .unwrap();
        let bus = if options.other_users {
            use std::os::unix::fs::PermissionsExt;
            ensure_users();
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            copy_executable(
                &binary("gpushare-ctl", "GPUSHARE_CTL_BIN"),
                &dir.path().join("gpushare-ctl"),
            );
            Bus::start_system(Some(
                &repo_root().join("etc/dbus-1/system.d/io.gpushare.Agent1.conf"),
            ))
        } else {
            Bus::start()
        };
        let mut agent = Agent { child: None, options, terminal: None, dir, bus };
        agent.spawn(Wait::Settled);
        agent
    }

    /// Starts the agent process and waits as `wait` says; the first status it answered
    /// with, unless it was not waited for.
    fn spawn(&mut self, wait: Wait) -> Option<Status> {
        let d = self.dir.path();
        let mut command = Command::new(self.binary("gpushare-agent", "GPUSHARE_AGENT_BIN"));
        if !self.options.simulate.is_empty() {
            command.args(["--simulate", &self.options.simulate]);
        }
        let stderr = match &self.options.stderr {
            Some(file) => Stdio::from(
                std::fs::File::options()
                    .create(true)
                    .append(true)
                    .open(file)
                    .expect("the agent's stderr file opens"),
            ),
            None => Stdio::inherit(),
        };
        command
            .args(["--bus", self.bus.address()])
            .arg("--state-dir")
            .arg(d.join("state"))
            .arg("--profiles-dir")
            .arg(d.join("profiles.d"))
            .arg("--config")
            .arg(d.join("agent.toml"))
            .env("GPUSHARE_SIM_RECORD", d.join("sim-record.log"))
            // Unless the test asks for more.
            .env("GPUSHARE_LOG", "warn")
            .envs(self.options.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(stderr);
        if self.options.terminal {
            let (master, slave) = pseudo_terminal();
            command.stdin(Stdio::from(slave));
            in_session_with_terminal(&mut command);
            self.terminal = Some(master);
        }
        let child = command.spawn().expect("gpushare-agent starts");
        self.child = Some(child);
        if wait == Wait::Started {
            return None;
        }
        let first = wait_for(Duration::from_secs(20), Duration::from_millis(20), || {
            let out = self.ctl(&["status", "--json"]);
            if out.status.success() {
                // A document that does not parse counts as ready: the test's own status()
                // reports it.
                let status = serde_json::from_slice::<Status>(&out.stdout).ok();
                // Settled: done with any re-apply at start-up too.
                let ready = wait == Wait::Answering
                    || status.as_ref().is_none_or(|s| s.apply_in_progress.is_none());
                if ready {
                    return Ok(status);
                }
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("gpushare-agent exited at start-up: {status}");
            }
            Err("gpushare-agent did not answer within 20 s".into())
        });
        // Another build (`binaries`, compared against) may predate the simulated driver.
        if !self.options.simulate.is_empty() && self.options.binaries.is_none() {
            self.assert_simulated_driver_loaded();
        }
        first
    }

    /// Fails the test unless the agent runs the NVML backend on gpushare's simulated
    /// driver library: the library is mapped into the agent's process, and NVIDIA's is not.
    fn assert_simulated_driver_loaded(&self) {
        let libraries = self.mapped_files();
        assert!(
            self.simulated_driver().is_some(),
            "gpushare-agent --simulate did not load the simulated driver library: {libraries:?}"
        );
        assert!(
            !libraries.iter().any(|l| l.contains("libnvidia-ml") && !is_simulated_driver(l)),
            "gpushare-agent --simulate loaded NVIDIA's library: {libraries:?}"
        );
    }

    /// The files mapped into the running agent's process.
    fn mapped_files(&self) -> Vec<String> {
        let pid = self.pid().expect("the agent runs");
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        maps.lines().filter_map(|l| l.split_whitespace().nth(5)).map(str::to_string).collect()
    }

    /// The simulated driver library the running agent loaded, if it loaded one.
    fn simulated_driver(&self) -> Option<PathBuf> {
        self.mapped_files().into_iter().find(|l| is_simulated_driver(l)).map(PathBuf::from)
    }

    /// The path of this agent's `name` binary: from its options' directory, else as
    /// [`binary`] finds it.
    fn binary(&self, name: &str, env: &str) -> PathBuf {
        match &self.options.binaries {
            Some(dir) => dir.join(name),
            None => binary(name, env),
        }
    }

    /// Stops the agent with SIGTERM and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A PID we spawned and still own (not yet waited for).
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            let _ = child.wait();
        }
    }

    /// Kills the agent with SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the agent again on the same bus and state directory.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn(Wait::Settled);
    }

    /// Starts the agent again with this environment instead of the one it had
    /// (`GPUSHARE_SIM_*`), on the same bus and state directory.
    pub fn restart_with_env(&mut self, env: &[(&str, &str)]) {
        self.restart_waiting(env, Wait::Settled);
    }

    /// [`Agent::restart_with_env`], waiting as `wait` says; the first status the agent
    /// answered with, unless it was not waited for.
    pub fn restart_waiting(&mut self, env: &[(&str, &str)], wait: Wait) -> Option<Status> {
        self.stop();
        self.options.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.spawn(wait)
    }

    /// Starts the agent after it was killed (no SIGTERM to send).
    pub fn start_again(&mut self) {
        self.kill();
        self.spawn(Wait::Settled);
    }

    /// Waits up to `timeout` for the agent to exit by itself, and returns how it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// What the simulated NVIDIA tools were asked, one line each (`GPUSHARE_SIM_RECORD`).
    pub fn sim_record(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sim-record.log")).unwrap_or_default()
    }

    /// The simulated node's file, `<state-dir>/simulated-gpus.json`: what the agent on
    /// `--simulate` exports as `GPUSHARE_SIM_STATE` to the tools it runs.
    pub fn sim_state(&self) -> PathBuf {
        self.dir.path().join("state").join(SIM_STATE_FILE)
    }

    /// The simulated `nvidia-smi` with `args`, on this agent's simulated node, as a person
    /// at the host runs it: not recorded in [`Agent::sim_record`], no injected failures.
    pub fn nvidia_smi(&self, args: &[&str]) -> Output {
        Command::new(binary(SIM_NVIDIA_SMI, SIM_NVIDIA_SMI_ENV))
            .args(args)
            .env("GPUSHARE_SIM_STATE", self.sim_state())
            .env_remove("GPUSHARE_SIM_RECORD")
            .env_remove("GPUSHARE_SIM_FAIL")
            .stdin(Stdio::null())
            .output()
            .expect("the simulated nvidia-smi runs")
    }

    /// A Python script run as another NVML client of this agent's simulated node (through
    /// `ctypes`, as pynvml loads the library): `nvml` is the loaded simulated
    /// `libnvidia-ml.so`, initialized. What the script printed, or its error.
    pub fn nvml_client(&self, script: &str) -> Output {
        // The very library the agent loaded (cargo may have built it in two places).
        let library = self.simulated_driver().expect("the agent runs on the simulated driver");
        let prelude = "import ctypes, sys\n\
                       nvml = ctypes.CDLL(sys.argv[1])\n\
                       assert nvml.nvmlInit_v2() == 0, 'nvmlInit'\n";
        Command::new("python3")
            .arg("-c")
            .arg(format!("{prelude}{script}\nassert nvml.nvmlShutdown() == 0\n"))
            .arg(library)
            .env("GPUSHARE_SIM_NODE", &self.options.simulate)
            .env("GPUSHARE_SIM_STATE", self.sim_state())
            .env_remove("GPUSHARE_SIM_RECORD")
            .env_remove("GPUSHARE_SIM_FAIL")
            .stdin(Stdio::null())
            .output()
            .expect("python3 runs")
    }

    /// The MPS server directories' root.
    pub fn mps_root(&self) -> PathBuf {
        self.dir.path().join("mps")
    }

    /// The journal, `<state-dir>/state.json`.
    pub fn journal(&self) -> Value {
        let text = std::fs::read_to_string(self.dir.path().join("state/state.json"))
            .expect("state.json exists");
        serde_json::from_str(&text).expect("state.json is JSON")
    }

    /// The agent's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the agent process still runs.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// A `gpushare-ctl` command pointed at this agent's bus.
    pub fn ctl_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.binary("gpushare-ctl", "GPUSHARE_CTL_BIN"));
        cmd.args(args)
            .env("GPUSHARE_BUS_ADDRESS", self.bus.address())
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            // A bench's output goes here, not into the home of whoever runs the tests.
            .env("XDG_STATE_HOME", self.ctl_state())
            .stdin(Stdio::null());
        cmd
    }

    /// What `gpushare-ctl` run by [`Agent::ctl_command`] has as `XDG_STATE_HOME` (where
    /// benches keep their output, under `gpushare/bench/`).
    pub fn ctl_state(&self) -> PathBuf {
        self.dir.path().join("ctl-state")
    }

    /// `gpushare-ctl ARGS` as `user` (the copy in the agent's directory, which
    /// [`AgentOptions::for_other_users`] makes), with `groups` as its supplementary groups
    /// (`setpriv --groups`; its passwd entry's groups when `None`), `home` as its
    /// `XDG_STATE_HOME` and `cwd` as its directory.
    pub fn ctl_as(
        &self,
        user: &str,
        groups: Option<&str>,
        home: &Path,
        cwd: &Path,
        args: &[&str],
    ) -> Command {
        assert!(self.options.other_users, "the agent serves only its own user");
        let mut cmd = Command::new("setpriv");
        cmd.args([&format!("--reuid={user}"), &format!("--regid={user}")]);
        match groups {
            Some(groups) => cmd.arg(format!("--groups={groups}")),
            None => cmd.arg("--init-groups"),
        };
        cmd.arg(self.dir.path().join("gpushare-ctl"))
            .args(args)
            .env("GPUSHARE_BUS_ADDRESS", self.bus.address())
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .env("XDG_STATE_HOME", home)
            .env("HOME", home)
            .current_dir(cwd)
            .stdin(Stdio::null());
        cmd
    }

    /// `gpushare-e2e-call ADDRESS ARGS` (D-Bus calls no `gpushare-ctl` makes) as `user`
    /// (root's, or the test's own, when `None`), stdin closed, to be run or spawned.
    pub fn call_command(&self, user: Option<&str>, args: &[&str]) -> Command {
        let helper = self.dir.path().join("gpushare-e2e-call");
        if !helper.exists() {
            copy_executable(&binary("gpushare-e2e-call", "GPUSHARE_E2E_CALL_BIN"), &helper);
        }
        let mut cmd = match user {
            Some(user) => {
                let mut c = as_user(user);
                c.arg(&helper);
                c
            }
            None => Command::new(&helper),
        };
        cmd.arg(self.bus.address()).args(args).stdin(Stdio::null());
        cmd
    }

    /// [`Agent::call_command`] run: its one line of output.
    pub fn call(&self, user: Option<&str>, args: &[&str]) -> String {
        let out = self.call_command(user, args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Runs `gpushare-ctl` and returns its output.
    pub fn ctl(&self, args: &[&str]) -> Output {
        self.ctl_command(args).output().expect("gpushare-ctl runs")
    }

    /// Runs `gpushare-ctl ARGS --json`, expects success, and parses stdout as a `T`.
    pub fn ctl_doc<T: DeserializeOwned>(&self, args: &[&str]) -> T {
        let mut all = args.to_vec();
        all.push("--json");
        let out = self.ctl(&all);
        assert!(out.status.success(), "gpushare-ctl {args:?} failed: {}", text(&out));
        parse_doc(&out, &format!("gpushare-ctl {args:?} --json"))
    }

    /// `status --json`.
    pub fn status(&self) -> Status {
        self.ctl_doc(&["status"])
    }

    /// `mps status --json`.
    pub fn mps_status(&self) -> MpsStatus {
        self.ctl_doc(&["mps", "status"])
    }

    /// The MPS servers of `mps status --json`.
    pub fn mps_servers(&self) -> Vec<MpsServer> {
        self.mps_status().servers
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        // The MPS daemons it started outlive it by design; a test that ended before giving
        // its GPUs back (a failure, or on purpose) must not leave them running: a daemon
        // whose pipe directory survives the temporary directory's removal (it writes its
        // log there meanwhile) would run on.
        stop_daemons_of(self.dir.path());
    }
}

/// Stops the simulated MPS control daemons of the agent whose directory is `dir`: the
/// processes of that binary whose simulated node (`GPUSHARE_SIM_STATE`, inherited from the
/// agent) lies in `dir`. SIGTERM, then SIGKILL after 5 s.
fn stop_daemons_of(dir: &Path) {
    let prefix = format!("GPUSHARE_SIM_STATE={}/", dir.display());
    let mine = |pid: i32| {
        let is_daemon = std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(SIM_MPS_CONTROL));
        is_daemon
            && std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|e| e.split(|&b| b == 0).any(|v| v.starts_with(prefix.as_bytes())))
    };
    let Ok(entries) = std::fs::read_dir("/proc") else { return };
    let daemons: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&pid| mine(pid))
        .collect();
    for &pid in &daemons {
        // A simulated daemon of this test's agent, found just above.
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for &pid in &daemons {
        while mine(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if mine(pid) {
            // It did not end on SIGTERM.
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// The agent.toml text: the test's own, plus the simulated MPS control daemon and
/// nvidia-smi of this build (tests never run the real ones, nor installed simulated ones
/// unless `GPUSHARE_SIM_*_BIN` say so) with the server directories inside `dir`.
/// Whether a mapped file is gpushare's simulated driver: as cargo builds it, or as the
/// package installs it.
fn is_simulated_driver(path: &str) -> bool {
    path.ends_with("/libgpushare_sim_nvml.so") || path.ends_with("/gpushare/sim/libnvidia-ml.so.1")
}

fn with_sim_tools(options: &AgentOptions, dir: &Path) -> String {
    let mut config = options.config.clone().unwrap_or_default();
    if !config.contains("[mps]") {
        config.push_str(&format!(
            "\n[mps]\ncontrol = {:?}\nroot = {:?}\nhealth_interval_seconds = 1\n",
            binary(SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV),
            dir.join("mps"),
        ));
    }
    if !config.contains("[metrics]") {
        // Many agents run at once: none takes the metrics port unless a test asks.
        config.push_str("\n[metrics]\nenabled = false\n");
    }
    if !config.contains("[timeslice]") {
        config.push_str(&format!(
            "\n[timeslice]\nnvidia_smi = {:?}\n",
            binary(SIM_NVIDIA_SMI, SIM_NVIDIA_SMI_ENV)
        ));
    }
    config
}

/// Copies the executable `from` to `to` (replacing it) by `cp` into a name of its own, then
/// a rename: no descriptor of this process is ever open for writing on the copy. One would
/// be inherited by any child another test thread forks meanwhile and held until its exec,
/// and running the copy would then fail with ETXTBSY ("Text file busy"); a rename also
/// never shows a half-written copy to a thread that runs it at once.
pub fn copy_executable(from: &Path, to: &Path) {
    let tmp = to.with_file_name(format!(
        ".{}.{}.{:?}",
        to.file_name().unwrap().to_string_lossy(),
        std::process::id(),
        std::thread::current().id()
    ));
    let out = Command::new("cp").arg("--").arg(from).arg(&tmp).output().expect("cp runs");
    assert!(out.status.success(), "cp {} {}: {}", from.display(), tmp.display(), text(&out));
    std::fs::rename(&tmp, to).unwrap();
}

/// `setpriv` set to run a program as `user`, with the groups of its passwd entry: add the
/// program and its arguments.
pub fn as_user(user: &str) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args([&format!("--reuid={user}"), &format!("--regid={user}"), "--init-groups"]);
    cmd
}

/// A `sleep 600` that stands for a GPU client (its PID is what the simulated driver and
/// MPS control are told of), killed and reaped on drop.
pub struct Sleeper(Child);

impl Sleeper {
    /// As the test's user, or as `user`, with `env`.
    pub fn start(user: Option<&str>, env: &[(&str, &str)]) -> Sleeper {
        let mut command = match user {
            Some(user) => {
                let mut c = as_user(user);
                c.arg("sleep");
                c
            }
            None => Command::new("sleep"),
        };
        command.arg("600").envs(env.iter().copied()).stdin(Stdio::null());
        Sleeper(command.spawn().expect("sleep starts"))
    }

    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Ends it and reaps it: its `/proc` entry is gone.
    pub fn end(self) {}
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether the tests run as root (creating users, owning names on a system-type bus).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A fresh pseudo-terminal: its master side, and its slave side to hand out.
fn pseudo_terminal() -> (std::fs::File, std::os::fd::OwnedFd) {
    use nix::fcntl::{OFlag, open};
    use nix::pty::{grantpt, posix_openpt, ptsname_r, unlockpt};
    let flags = OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    let master = posix_openpt(flags).expect("posix_openpt");
    grantpt(&master).expect("grantpt");
    unlockpt(&master).expect("unlockpt");
    let name = ptsname_r(&master).expect("ptsname_r");
    let slave = open(name.as_str(), flags, nix::sys::stat::Mode::empty())
        .unwrap_or_else(|e| panic!("opening the terminal {name}: {e}"));
    (std::fs::File::from(std::os::fd::OwnedFd::from(master)), slave)
}

/// Starts `command` in a new session whose controlling terminal is its stdin.
fn in_session_with_terminal(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the hook makes two async-signal-safe system calls and allocates nothing;
    // TIOCSCTTY through libc, for nix wraps no ioctl.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid()?;
            if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// stdout and stderr of an output, for messages.
pub fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// stdout of an output, as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// stderr of an output, as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// How many lines of `stderr` are gpushare-ctl's own reasons (`gpushare-ctl: …`).
pub fn reason_lines(stderr: &str) -> usize {
    stderr.lines().filter(|l| l.starts_with("gpushare-ctl:")).count()
}

/// Parses the JSON document on stdout as a `T`; `what` names the command in the panic.
pub fn parse_doc<T: DeserializeOwned>(out: &Output, what: &str) -> T {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{what} printed no such JSON document ({e}): {}", text(out)))
}

/// What `gpushare-ctl --json` prints on a failure: `{"error": {"name": …, "message": …}}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CtlErrorDoc {
    /// The error.
    pub error: CtlError,
}

/// The error in a [`CtlErrorDoc`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CtlError {
    /// D-Bus error name (`io.gpushare.Agent1.Error.Infeasible`) or gpushare-ctl's own.
    pub name: String,
    /// One line.
    pub message: String,
}

/// The error object gpushare-ctl printed with `--json` (its exit status is not checked).
pub fn ctl_error(out: &Output) -> CtlError {
    parse_doc::<CtlErrorDoc>(out, "gpushare-ctl").error
}

/// A file `name` holding `contents` in a new temporary directory, removed when the
/// returned directory drops.
pub fn temp_file(name: &str, contents: impl AsRef<[u8]>) -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let file = dir.path().join(name);
    std::fs::write(&file, contents).expect("temporary file written");
    (dir, file)
}

/// Calls `probe` every `every` until it returns `Ok`, and returns that value; panics with
/// the last `Err` message once `timeout` has passed.
pub fn wait_for<T>(
    timeout: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match probe() {
            Ok(value) => return value,
            Err(message) => {
                assert!(Instant::now() < deadline, "{message}");
                std::thread::sleep(every);
            }
        }
    }
}

/// Instance profile names of GPU `index` in a status document, sorted.
pub fn instance_profiles(status: &Status, index: usize) -> Vec<String> {
    let mut names: Vec<String> =
        status.gpus[index].instances.iter().map(|i| i.profile.clone()).collect();
    names.sort();
    names
}

/// The layout part of a status (MIG mode and instances per GPU), to compare states.
pub fn layout(status: &Status) -> Vec<(bool, Vec<(String, u32)>)> {
    status
        .gpus
        .iter()
        .map(|g| {
            let instances =
                g.instances.iter().map(|i| (i.profile.clone(), i.placement_start)).collect();
            (g.mig_enabled, instances)
        })
        .collect()
}
