//! A real single-node Slurm cluster for the Slurm end-to-end tests (issue 41).
//!
//! Debian 12's Slurm 22.05 (`slurmctld`, `slurmd`, `slurm-client`) and munge 0.5.15, as
//! root, everything private to one temporary directory: a `munged` with a key of its own
//! and its own socket (`AuthInfo=socket=…`), `slurmctld` and `slurmd` in the foreground
//! (`-D`, children of the test), a private `SLURM_CONF` with its state, spool, pid and log
//! files beside it, and ports chosen free when the cluster starts. The node is named after
//! `hostname -s` (the agent's default), addressed as 127.0.0.1; its `NodeName=` line lives
//! in a file of its own that `slurm.conf` includes ([`NODE_CONF`]), as a node's GRES
//! owner would keep it. `gres.conf` is `AutoDetect=off` and the test's lines.
//!
//! [`Slurm::start`] returns once the node has registered (idle, or drained when the
//! configuration disagrees with what slurmd found). Dropping the cluster cancels its jobs,
//! waits for them to go, stops slurmd, slurmctld and munged, and removes the directory:
//! nothing is left outside it. Without root or the packages the tests skip with a line
//! saying what is missing; `GPUSHARE_REQUIRE_PODMAN=1` (set by `.ci/run`) makes them fail.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::sys::stat::{Mode, SFlag, makedev, mknod};
use nix::unistd::Pid;
use tempfile::TempDir;

/// The file `slurm.conf` includes, holding the node's whole `NodeName=` line: Slurm 22.05
/// refuses a second line for a node ("Duplicated NodeHostName", both daemons exit), so a
/// GRES owner keeps the whole line, not just its `Gres=`.
pub const NODE_CONF: &str = "node.conf";
/// How long a daemon may take to answer before the harness gives up (a hang, not a timing).
const PATIENCE: Duration = Duration::from_secs(60);
/// The programs the harness runs, and the Debian package of each.
const TOOLS: [(&str, &str); 9] = [
    ("munged", "munge"),
    ("munge", "munge"),
    ("slurmctld", "slurmctld"),
    ("slurmd", "slurmd"),
    ("scontrol", "slurm-client"),
    ("srun", "slurm-client"),
    ("sbatch", "slurm-client"),
    ("squeue", "slurm-client"),
    ("sdiag", "slurm-client"),
];

fn required() -> bool {
    std::env::var_os(crate::podman::REQUIRE_ENV).is_some_and(|v| v == "1")
}

/// Fails the test with `reason` under `GPUSHARE_REQUIRE_PODMAN=1`, else prints it as a skip.
fn skip(reason: &str) {
    assert!(!required(), "{}=1: {reason}", crate::podman::REQUIRE_ENV);
    crate::skip(reason);
}

/// Where `tool` is: on `PATH`, else in /usr/sbin or /sbin (the daemons are there, and a
/// test's `PATH` may lack them).
fn find(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// What the cluster is started with: the node's GRES and the lines around it.
#[derive(Clone, Debug, Default)]
pub struct Setup {
    /// `GresTypes=` (empty: no such line).
    pub gres_types: String,
    /// The node line's `Gres=` (empty: none).
    pub node_gres: String,
    /// gres.conf after `AutoDetect=off`.
    pub gres_conf: String,
    /// More slurm.conf lines (`TaskProlog=…`).
    pub lines: Vec<String>,
    /// A dynamic node (`slurmd -Z --conf "… Gres=<node_gres>"`, Slurm 22.05+): no
    /// `NodeName=` line in slurm.conf, the node brings its own when slurmd registers.
    pub dynamic: bool,
    /// A dynamic node whose gres.conf and `Gres=` are gpushare-agent's, in this directory
    /// ([`Setup::agent_driven`]).
    pub agent_dir: Option<PathBuf>,
}

impl Setup {
    /// A setup with these GRES types, node `Gres=` and gres.conf lines.
    pub fn gres(gres_types: &str, node_gres: &str, gres_conf: &str) -> Setup {
        Setup {
            gres_types: gres_types.into(),
            node_gres: node_gres.into(),
            gres_conf: gres_conf.into(),
            lines: Vec::new(),
            dynamic: false,
            agent_dir: None,
        }
    }

    /// A dynamic node driven by gpushare-agent as on a real host: gres.conf is the agent's
    /// `<dir>/gres.conf` (linked beside slurm.conf), slurmd reads its `Gres=` from the
    /// agent's `<dir>/slurmd.env` each time it starts, and the agent stops and starts it
    /// through [`agent_commands`] (a supervisor, standing in for systemd, keeps slurmd
    /// running unless `<dir>/slurmd.stopped` exists). `<dir>/slurm.conf` is linked to
    /// the cluster's, for the agent's `[slurm] slurm_conf`.
    pub fn agent_driven(mut self, dir: &Path) -> Setup {
        self.dynamic = true;
        self.agent_dir = Some(dir.to_path_buf());
        self
    }

    /// The same setup as a dynamic node.
    pub fn dynamic(mut self) -> Setup {
        self.dynamic = true;
        self
    }

    /// The same setup with one more slurm.conf line.
    pub fn line(mut self, line: &str) -> Setup {
        self.lines.push(line.into());
        self
    }
}

/// A running private cluster of one node (see the module's notes).
pub struct Slurm {
    dir: TempDir,
    node: String,
    /// A dynamic node's `Gres=` for its next slurmd start (`None`: a node of slurm.conf).
    dynamic_gres: Option<String>,
    /// Where gpushare-agent keeps gres.conf and slurmd.env ([`Setup::agent_driven`]).
    agent_dir: Option<PathBuf>,
    /// slurmctld's count of node registrations before slurmd last started (a registration
    /// the harness waits for must come after it).
    registered_before: Option<u64>,
    munged: Option<Child>,
    slurmctld: Option<Child>,
    slurmd: Option<Child>,
}

impl Slurm {
    /// Whether a cluster can start here: root, and munge's and Slurm's programs; prints a
    /// skip line (fails under `GPUSHARE_REQUIRE_PODMAN=1`) when not.
    pub fn available() -> bool {
        if !crate::is_root() {
            skip("Slurm tests need root (slurmd runs jobs as their users)");
            return false;
        }
        let missing: Vec<&str> = TOOLS
            .iter()
            .filter(|(tool, _)| find(tool).is_none())
            .map(|(_, package)| *package)
            .collect();
        if !missing.is_empty() {
            let mut packages = missing;
            packages.dedup();
            skip(&format!("no Slurm here (apt-get install {})", packages.join(" ")));
            return false;
        }
        true
    }

    /// Starts munged, slurmctld and slurmd with `setup`, and waits for the node to
    /// register; `None` (after a skip line) when [`Slurm::available`] says no.
    pub fn start(setup: &Setup) -> Option<Slurm> {
        if !Slurm::available() {
            return None;
        }
        let dir = tempfile::Builder::new().prefix("gpushare-slurm-").tempdir().expect("temp dir");
        // munged wants its socket's directory searchable by all, its key readable by it alone.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        for sub in ["munge", "sock", "state", "spool", "log", "dev"] {
            std::fs::create_dir(dir.path().join(sub)).expect("mkdir");
        }
        std::fs::set_permissions(dir.path().join("munge"), std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        let key = dir.path().join("munge/munge.key");
        let mut bytes = vec![0u8; 1024];
        File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
            .expect("/dev/urandom");
        std::fs::write(&key, &bytes).expect("munge key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).expect("chmod");
        let node = short_hostname();
        let mut slurm = Slurm {
            dir,
            node,
            dynamic_gres: None,
            agent_dir: setup.agent_dir.clone(),
            registered_before: None,
            munged: None,
            slurmctld: None,
            slurmd: None,
        };
        if setup.dynamic {
            slurm.dynamic_gres = Some(setup.node_gres.clone());
        }
        slurm.write_conf(setup);
        slurm.munged = Some(slurm.spawn_munged());
        slurm.start_slurmctld();
        slurm.start_slurmd();
        slurm.wait_registered();
        Some(slurm)
    }

    /// The cluster's directory (slurm.conf, gres.conf, logs under `log/`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The node's name (`hostname -s`).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The private slurm.conf (`SLURM_CONF` of every command the harness runs).
    pub fn slurm_conf(&self) -> PathBuf {
        self.dir().join("slurm.conf")
    }

    /// gres.conf, beside slurm.conf, where slurmd reads it.
    pub fn gres_conf(&self) -> PathBuf {
        self.dir().join("gres.conf")
    }

    /// The file slurm.conf includes with the node's line ([`NODE_CONF`]).
    pub fn node_conf(&self) -> PathBuf {
        self.dir().join(NODE_CONF)
    }

    fn munge_socket(&self) -> PathBuf {
        self.dir().join("sock/munge.socket")
    }

    /// The node's whole line with this `Gres=` (empty: none).
    pub fn node_line(&self, gres: &str) -> String {
        let gres = if gres.is_empty() { String::new() } else { format!(" Gres={gres}") };
        format!("NodeName={} NodeAddr=127.0.0.1 {}{gres} State=UNKNOWN\n", self.node, HARDWARE)
    }

    fn write_conf(&self, setup: &Setup) {
        let d = self.dir().display();
        // Both listeners held until both ports are known, so that they differ.
        let listeners = [free_port(), free_port()];
        let [ctld, slurmd] = listeners.each_ref().map(|l| l.local_addr().expect("address").port());
        drop(listeners);
        let mut conf = format!(
            "ClusterName=gpushare\nSlurmctldHost=localhost\nSlurmctldPort={ctld}\n\
             SlurmdPort={slurmd}\nSlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\n\
             CredType=cred/munge\nAuthInfo=socket={}\nStateSaveLocation={d}/state\n\
             SlurmdSpoolDir={d}/spool\nSlurmctldPidFile={d}/slurmctld.pid\n\
             SlurmdPidFile={d}/slurmd.pid\nSlurmctldLogFile={d}/log/slurmctld.log\n\
             SlurmdLogFile={d}/log/slurmd.log\nSelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\nProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n\
             AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n\
             MpiDefault=none\nMailProg=/bin/true\nReturnToService=2\n\
             SchedulerType=sched/builtin\nSlurmdTimeout=30\nInactiveLimit=0\nKillWait=1\n\
             MinJobAge=2\nSlurmdParameters=config_overrides\n",
            self.munge_socket().display()
        );
        if !setup.gres_types.is_empty() {
            conf.push_str(&format!("GresTypes={}\n", setup.gres_types));
        }
        for line in &setup.lines {
            conf.push_str(line);
            conf.push('\n');
        }
        if setup.dynamic {
            conf.push_str("MaxNodeCount=4\n");
        }
        conf.push_str(&format!(
            "Include {}\nPartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n",
            self.node_conf().display()
        ));
        std::fs::write(self.slurm_conf(), conf).expect("slurm.conf");
        if setup.dynamic {
            std::fs::write(self.node_conf(), "").expect("node.conf");
        } else {
            self.set_node_gres(&setup.node_gres);
        }
        match &setup.agent_dir {
            Some(agent) => {
                std::os::unix::fs::symlink(agent.join("gres.conf"), self.gres_conf())
                    .expect("gres.conf link");
                let link = agent.join("slurm.conf");
                let _ = std::fs::remove_file(&link);
                std::os::unix::fs::symlink(self.slurm_conf(), link).expect("slurm.conf link");
            }
            None => self.set_gres_conf(&setup.gres_conf),
        }
    }

    /// Rewrites the node's line ([`NODE_CONF`]) with this `Gres=`; Slurm reads it when told.
    pub fn set_node_gres(&self, gres: &str) {
        std::fs::write(self.node_conf(), self.node_line(gres)).expect("node.conf");
    }

    /// Rewrites gres.conf as `AutoDetect=off` and `lines`; slurmd reads it when told.
    pub fn set_gres_conf(&self, lines: &str) {
        std::fs::write(self.gres_conf(), format!("AutoDetect=off\n{lines}\n")).expect("gres.conf");
    }

    /// A Slurm command with this cluster's `SLURM_CONF`.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(find(program).unwrap_or_else(|| program.into()));
        cmd.env("SLURM_CONF", self.slurm_conf()).stdin(Stdio::null());
        for var in ["SLURM_JOB_ID", "SLURM_JOBID", "SLURM_NODELIST", "SLURM_STEP_ID"] {
            cmd.env_remove(var);
        }
        cmd
    }

    /// A Slurm command run as `user` (setpriv, as [`crate::as_user`]), with this cluster's
    /// `SLURM_CONF`; its jobs are that user's.
    pub fn command_as(&self, user: &str, program: &str) -> Command {
        let mut cmd = crate::as_user(user);
        cmd.arg(find(program).unwrap_or_else(|| program.into()));
        cmd.env("SLURM_CONF", self.slurm_conf()).stdin(Stdio::null());
        cmd
    }

    /// The variables a job given `gres` printed with `env` (a TaskProlog's included);
    /// panics when srun failed.
    pub fn job_env(&self, gres: &str) -> BTreeMap<String, String> {
        let out = self.srun(&[&format!("--gres={gres}"), "env"]);
        assert!(
            out.status.success(),
            "srun --gres={gres} env: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
            .collect()
    }

    /// Waits until job `id` is in `state`; its fields then.
    pub fn wait_job(&self, id: &str, state: &str) -> BTreeMap<String, String> {
        let start = Instant::now();
        loop {
            let info = self.job_info(id);
            if info.get("JobState").is_some_and(|s| s == state) {
                return info;
            }
            assert!(start.elapsed() < PATIENCE, "job {id} not {state}: {info:?}\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `program args` with this cluster's `SLURM_CONF` and waits for it.
    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        self.command(program).args(args).output().unwrap_or_else(|e| panic!("{program}: {e}"))
    }

    /// `scontrol args`.
    pub fn scontrol(&self, args: &[&str]) -> Output {
        self.run("scontrol", args)
    }

    /// `srun args` on the node (waits for the job).
    pub fn srun(&self, args: &[&str]) -> Output {
        self.run("srun", args)
    }

    /// Submits `sbatch args` (output to /dev/null) and returns the job id.
    pub fn sbatch(&self, args: &[&str]) -> String {
        let out =
            self.command("sbatch").args(["--parsable", "-o", "/dev/null"]).args(args).output();
        let out = out.expect("sbatch runs");
        assert!(out.status.success(), "sbatch {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().split(';').next().unwrap_or("").to_string()
    }

    /// `scontrol -o show node`'s fields of the node (`State`, `Gres`, `Reason`…); empty
    /// while slurmctld does not answer.
    pub fn node_info(&self) -> BTreeMap<String, String> {
        let out = self.scontrol(&["-o", "show", "node", &self.node]);
        fields(&String::from_utf8_lossy(&out.stdout))
    }

    /// `scontrol -o -d show job ID`'s fields; a job's per-node allocation is under
    /// `GRES` (`gpu:h100:1(IDX:0)`), last of its `Nodes=` group.
    pub fn job_info(&self, id: &str) -> BTreeMap<String, String> {
        let out = self.scontrol(&["-o", "-d", "show", "job", id]);
        fields(&String::from_utf8_lossy(&out.stdout))
    }

    /// Waits until the node's `State` satisfies `ready`, and returns its fields.
    pub fn wait_node(&self, what: &str, ready: impl Fn(&str) -> bool) -> BTreeMap<String, String> {
        self.wait_node_where(what, |info| info.get("State").is_some_and(|s| ready(s)))
    }

    /// Waits until the node's fields satisfy `ready` (its state and GRES after a
    /// restart), and returns them.
    pub fn wait_node_where(
        &self,
        what: &str,
        ready: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> BTreeMap<String, String> {
        let start = Instant::now();
        loop {
            let info = self.node_info();
            if ready(&info) {
                return info;
            }
            if start.elapsed() > PATIENCE {
                panic!("the node is not {what}: {info:?}\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the node has registered since its slurmd (re)started: idle, allocated,
    /// or drained/invalid when its configuration disagrees.
    pub fn wait_registered(&self) -> BTreeMap<String, String> {
        let before = self.registered_before;
        let start = Instant::now();
        loop {
            let info = self.node_info();
            let state = info.get("State").map_or("", String::as_str);
            let registered = !state.is_empty()
                && !state.contains("NOT_RESPONDING")
                && (!state.starts_with("UNKNOWN") || state.contains("INVALID"))
                && before.is_none_or(|n| self.registrations().is_some_and(|now| now > n));
            if registered {
                return info;
            }
            if start.elapsed() > PATIENCE {
                panic!("the node has not registered: {info:?}\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `scontrol reconfigure` (slurmctld re-reads slurm.conf and tells slurmd, which
    /// re-reads gres.conf and registers again); panics when it fails.
    /// Waits for slurmd's registration that follows (its answer to the reconfigure).
    pub fn reconfigure(&mut self) {
        self.registered_before = self.registrations();
        let out = self.scontrol(&["reconfigure"]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "scontrol reconfigure: {said}");
        self.wait_registered();
    }

    /// How many node registrations slurmctld has handled since it started (`sdiag`'s count
    /// of `MESSAGE_NODE_REGISTRATION_STATUS`); `None` when it does not answer.
    pub fn registrations(&self) -> Option<u64> {
        let out = self.run("sdiag", &[]);
        if !out.status.success() {
            return None;
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = text.lines().find(|l| l.contains("MESSAGE_NODE_REGISTRATION_STATUS"));
        let count = line.and_then(|l| l.split_once("count:")).map(|(_, rest)| rest);
        Some(count.and_then(|c| c.split_whitespace().next()?.parse().ok()).unwrap_or(0))
    }

    /// Stops slurmctld (SIGTERM, waits) and starts it again on the same state (saved node
    /// states and jobs); returns once it listens. The node registers again on its own,
    /// and `sdiag`'s counts start from zero: poll [`Slurm::node_info`] for what you expect.
    pub fn restart_slurmctld(&mut self) {
        stop(self.slurmctld.take());
        self.start_slurmctld();
    }

    /// Stops slurmd (SIGTERM, waits) and starts it again; waits for it to register.
    pub fn restart_slurmd(&mut self) -> BTreeMap<String, String> {
        stop(self.slurmd.take());
        self.start_slurmd();
        self.wait_registered()
    }

    /// Stops slurmctld; the cluster's other daemons keep running.
    pub fn stop_slurmctld(&mut self) {
        stop(self.slurmctld.take());
    }

    /// Starts slurmctld on the current files and state (`-i`: a missing state is no
    /// error); returns once it listens, or once it has exited (a configuration it
    /// refused: [`Slurm::slurmctld_status`], [`Slurm::wait_slurmctld_exit`]).
    pub fn start_slurmctld(&mut self) {
        let child = self.spawn("slurmctld", &["-D", "-i"], "slurmctld.out");
        self.slurmctld = Some(child);
        self.wait_listening();
    }

    /// slurmctld's exit status once it has exited (`None` while it runs).
    pub fn slurmctld_status(&mut self) -> Option<std::process::ExitStatus> {
        self.slurmctld.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// Waits for slurmctld to exit (a configuration it refused), its status.
    pub fn wait_slurmctld_exit(&mut self) -> std::process::ExitStatus {
        let status = self.wait_exit(|s| &mut s.slurmctld, "slurmctld");
        self.slurmctld = None;
        status
    }

    /// Stops slurmd (SIGTERM, waits); the node stays in slurmctld's table.
    pub fn stop_slurmd(&mut self) {
        stop(self.slurmd.take());
    }

    /// Starts slurmd on the current files; returns at once (see [`Slurm::wait_registered`]).
    pub fn start_slurmd(&mut self) {
        self.registered_before = self.registrations();
        let node = self.node.clone();
        let child = match &self.dynamic_gres {
            _ if self.agent_dir.is_some() => self.spawn_supervisor(),
            None => self.spawn("slurmd", &["-D", "-N", &node], "slurmd.out"),
            Some(gres) => {
                let line = self.node_line(gres);
                let conf = line
                    .trim()
                    .split(' ')
                    .filter(|w| !w.starts_with("NodeName=") && !w.starts_with("State="));
                let conf = conf.collect::<Vec<_>>().join(" ");
                self.spawn("slurmd", &["-D", "-N", &node, "-Z", "--conf", &conf], "slurmd.out")
            }
        };
        self.slurmd = Some(child);
    }

    /// A dynamic node's `Gres=` for its next slurmd start ([`Setup::dynamic`]).
    pub fn set_dynamic_gres(&mut self, gres: &str) {
        assert!(self.agent_dir.is_none(), "the agent's slurmd.env says it");
        assert!(self.dynamic_gres.is_some(), "not a dynamic node");
        self.dynamic_gres = Some(gres.into());
    }

    /// Waits for slurmd to exit (a configuration it refused), its status.
    pub fn wait_slurmd_exit(&mut self) -> std::process::ExitStatus {
        let status = self.wait_exit(|s| &mut s.slurmd, "slurmd");
        self.slurmd = None;
        status
    }

    fn wait_exit(
        &mut self,
        child: impl Fn(&mut Slurm) -> &mut Option<Child>,
        name: &str,
    ) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            let exited = child(self).as_mut().map(|c| c.try_wait().ok().flatten());
            match exited {
                None => panic!("{name} is not running"),
                Some(Some(status)) => return status,
                Some(None) => {}
            }
            assert!(start.elapsed() < PATIENCE, "{name} still runs\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn spawn(&self, program: &str, args: &[&str], out: &str) -> Child {
        let log = File::create(self.dir().join("log").join(out)).expect("log file");
        self.command(program)
            .args(args)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{program}: {e}"))
    }

    /// The supervisor of an agent-driven slurmd ([`Setup::agent_driven`]).
    fn spawn_supervisor(&self) -> Child {
        let agent = self.agent_dir.clone().expect("agent-driven");
        let slurmd = find("slurmd").expect("slurmd");
        let line = self.node_line("");
        let conf = line
            .trim()
            .split(' ')
            .filter(|w| !w.starts_with("NodeName=") && !w.starts_with("State="))
            .collect::<Vec<_>>()
            .join(" ");
        let script = self.dir().join("slurmd-supervisor");
        write_script(
            &script,
            &format!(
                "#!/bin/sh\n\
                 A={a}\n\
                 pid=\n\
                 trap '[ -n \"$pid\" ] && kill $pid && wait $pid; rm -f $A/slurmd.pid; exit 0' TERM\n\
                 while :; do\n\
                 \tif [ ! -e $A/slurmd.stopped ]; then\n\
                 \t\t. $A/slurmd.env\n\
                 \t\t{slurmd} -D -N {node} -Z --conf \"{conf} Gres=$GPUSHARE_SLURMD_GRES\" &\n\
                 \t\tpid=$!\n\
                 \t\techo $pid > $A/slurmd.pid\n\
                 \t\twait $pid\n\
                 \t\tpid=\n\
                 \t\trm -f $A/slurmd.pid\n\
                 \tfi\n\
                 \tsleep 0.1\n\
                 done\n",
                a = agent.display(),
                slurmd = slurmd.display(),
                node = self.node,
            ),
        );
        let script = script.display().to_string();
        self.spawn("/bin/sh", &[&script], "slurmd.out")
    }

    fn spawn_munged(&self) -> Child {
        let d = self.dir();
        let m = |f: &str| d.join("munge").join(f).display().to_string();
        let child = self.spawn(
            "munged",
            &[
                "--foreground",
                &format!("--socket={}", self.munge_socket().display()),
                &format!("--key-file={}", m("munge.key")),
                &format!("--log-file={}", m("munged.log")),
                &format!("--pid-file={}", m("munged.pid")),
                &format!("--seed-file={}", m("munged.seed")),
            ],
            "munged.out",
        );
        let start = Instant::now();
        while !self.munge_socket().exists() {
            assert!(start.elapsed() < PATIENCE, "munged made no socket\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(10));
        }
        child
    }

    /// Waits until slurmctld accepts connections (so that slurmd registers at its first try).
    fn wait_listening(&mut self) {
        let port: u16 = std::fs::read_to_string(self.slurm_conf())
            .expect("slurm.conf")
            .lines()
            .find_map(|l| l.strip_prefix("SlurmctldPort=")?.trim().parse().ok())
            .expect("SlurmctldPort");
        let start = Instant::now();
        while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
            if self.slurmctld_status().is_some() {
                return; // it refused its configuration: the caller asks why
            }
            assert!(start.elapsed() < PATIENCE, "slurmctld does not listen\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The last lines of each daemon's output, for a failure's message.
    pub fn logs(&self) -> String {
        let mut said = String::new();
        for name in ["munged.out", "slurmctld.out", "slurmd.out"] {
            let text =
                std::fs::read_to_string(self.dir().join("log").join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(15)..];
            said.push_str(&format!("--- {name}\n{}\n", tail.join("\n")));
        }
        said
    }

    /// Cancels every job and waits until none is left (their steps and processes gone).
    fn cancel_all(&self) {
        if self.slurmctld.is_none() {
            return;
        }
        let start = Instant::now();
        while start.elapsed() < PATIENCE {
            let out = self.run("squeue", &["-h", "-o", "%i"]);
            let listed = String::from_utf8_lossy(&out.stdout).into_owned();
            let ids: Vec<&str> = listed.split_whitespace().collect();
            if !out.status.success() || ids.is_empty() {
                break;
            }
            let _ = self.command("scancel").arg("--full").args(&ids).output();
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        // Jobs first: their slurmstepd processes outlive slurmd, and would outlive the test.
        if self.slurmd.is_some() {
            self.cancel_all();
        }
        stop(self.slurmd.take());
        stop(self.slurmctld.take());
        stop(self.munged.take());
    }
}

/// The `[slurm]` lines of agent.toml for a node [`Setup::agent_driven`] by `dir`: its
/// gres.conf, slurmd.env and slurm.conf there, and the commands that stop slurmd (and
/// wait until it has) and start it.
pub fn agent_commands(dir: &Path) -> String {
    let d = dir.display();
    let stop = format!(
        "touch {d}/slurmd.stopped; p=$(cat {d}/slurmd.pid 2>/dev/null) && kill $p; \
         while [ -e {d}/slurmd.pid ]; do sleep 0.05; done"
    );
    format!(
        "[slurm]\nenabled = true\ngres_conf = \"{d}/gres.conf\"\nslurmd_env = \"{d}/slurmd.env\"\n\
         slurm_conf = \"{d}/slurm.conf\"\nbin_dir = \"{bin}\"\nstop_slurmd = {stop:?}\n\
         start_slurmd = \"rm -f {d}/slurmd.stopped\"\nregister_timeout_seconds = 120\n",
        bin = find("scontrol")
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or_default()
            .display(),
    )
}

/// SIGTERM, then SIGKILL after a while, and reap.
fn stop(child: Option<Child>) {
    let Some(mut child) = child else { return };
    let pid = Pid::from_raw(child.id() as i32);
    if child.try_wait().ok().flatten().is_some() {
        return;
    }
    let _ = kill(pid, Signal::SIGTERM);
    let start = Instant::now();
    while start.elapsed() < PATIENCE / 4 {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// `key=value` fields of one `scontrol -o` line (values may hold spaces only in `Reason`,
/// which runs to the next ` Key=`).
pub fn fields(line: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let mut key: Option<String> = None;
    let mut value = String::new();
    for word in line.trim().split(' ') {
        let starts_field = word.split_once('=').is_some_and(|(k, _)| {
            !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
        if starts_field {
            if let Some(k) = key.take() {
                map.insert(k, std::mem::take(&mut value));
            }
            let (k, v) = word.split_once('=').expect("a field");
            key = Some(k.to_string());
            value = v.to_string();
        } else if key.is_some() {
            value.push(' ');
            value.push_str(word);
        }
    }
    if let Some(k) = key {
        map.insert(k, value);
    }
    map
}

/// A listener on a TCP port free now on 127.0.0.1 (the kernel's pick), to be dropped for
/// the daemon to take the port.
fn free_port() -> TcpListener {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind")
}

fn short_hostname() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    name.trim().split('.').next().unwrap_or("localhost").to_string()
}

/// The node's CPUs: 8 whatever the machine has (`SlurmdParameters=config_overrides`), so
/// that a test's jobs run side by side on CI's 2 cores (each job takes one CPU).
const HARDWARE: &str = "CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1";

/// Writes `text` to `path` executable (a TaskProlog, say).
pub fn write_script(path: &Path, text: &str) {
    let mut f = File::create(path).expect("script");
    f.write_all(text.as_bytes()).expect("script");
    drop(f);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// Makes the character device `path` (major, minor), 0600, and its directories: a
/// stand-in for `/dev/nvidia0` or `/dev/nvidia-caps/nvidia-cap21` (root only).
pub fn make_device(path: &Path, major: u64, minor: u64) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    mknod(path, SFlag::S_IFCHR, Mode::from_bits_truncate(0o600), makedev(major, minor))
        .unwrap_or_else(|e| panic!("mknod {}: {e}", path.display()));
}
