//! The man page `gpushare-agent(8)`: the options as clap renders them (`clap_mangen`), then
//! what `--help` cannot hold — the files and every `agent.toml` key, the signals, the
//! environment. Keys and variables are written here once; the tests check them against
//! the configuration parser and the code that reads the environment.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::config::{self, AgentConfig};

/// One `agent.toml` key: its table (`""` for the top level), name, default and meaning.
struct Key {
    table: &'static str,
    name: &'static str,
    default: String,
    meaning: &'static str,
}

/// Every key `agent.toml` takes, in the order of the shipped file.
fn keys() -> Vec<Key> {
    let d = AgentConfig::default();
    let path = |p: &Path| format!("\"{}\"", p.display());
    let key = |table, name, default: String, meaning| Key { table, name, default, meaning };
    vec![
        key(
            "",
            "profiles_dir",
            path(&d.profiles_dir),
            "Directory of profile files (*.toml); a file may replace a built-in profile of the same name. --profiles-dir overrides it.",
        ),
        key(
            "",
            "state_dir",
            path(&d.state_dir),
            "The journal, the active profile, the simulator's state and probe results. --state-dir overrides it; without root, and left at its default, it is $XDG_STATE_HOME/gpushare; under --simulate as root, /run/gpushare-sim.",
        ),
        key(
            "",
            "boot_profile",
            "unset".into(),
            "Profile applied at start-up instead of the active one (MIG instances do not survive a reboot, so the agent re-applies at every start).",
        ),
        key(
            "",
            "host_root",
            path(&d.host_root),
            "Where the host's /sys and /proc are read, to find what would block a GPU reset; the host's root when the agent runs in a container.",
        ),
        key(
            "gpu",
            "manage_mig",
            d.gpu.manage_mig.to_string(),
            "Whether the agent may change MIG modes and instances.",
        ),
        key(
            "gpu",
            "manage_compute_mode",
            d.gpu.manage_compute_mode.to_string(),
            "Whether the agent may change compute modes.",
        ),
        key(
            "gpu",
            "manage_timeslice",
            d.gpu.manage_timeslice.to_string(),
            "Whether the agent may set time-slice intervals. With all three false the agent observes and plans, and refuses plans that would change MIG or intervals.",
        ),
        key(
            "apply",
            "max_parallel_gpus",
            d.apply.max_parallel_gpus.to_string(),
            "Most GPUs reconfigured at once; 0 for all of a plan's GPUs.",
        ),
        key(
            "hooks",
            "pre_apply",
            "[]".into(),
            "Commands run through /bin/sh -c before the first change of an apply; a failing one aborts the apply.",
        ),
        key(
            "hooks",
            "post_apply",
            "[]".into(),
            "Commands run after an apply, also when it failed.",
        ),
        key(
            "hooks",
            "timeout_seconds",
            d.hooks.timeout_seconds.to_string(),
            "Time limit of one hook command, 1 to 86400.",
        ),
        key(
            "mps",
            "control",
            path(&d.mps.control),
            "nvidia-cuda-mps-control (a bare name is looked up on PATH).",
        ),
        key(
            "mps",
            "root",
            path(&d.mps.root),
            "Directory of the MPS servers' pipe and log directories, <root>/<UUID>/. Left at its default without root, or under --simulate unless the file named by --config sets it, it is <state_dir>/mps.",
        ),
        key(
            "mps",
            "health_interval_seconds",
            d.mps.health_interval_seconds.to_string(),
            "Seconds between health checks of the MPS servers, 1 to 3600.",
        ),
        key(
            "timeslice",
            "nvidia_smi",
            path(&d.timeslice.nvidia_smi),
            "nvidia-smi, for time-slice intervals (a bare name is looked up on PATH).",
        ),
        key(
            "metrics",
            "enabled",
            d.metrics.enabled.to_string(),
            "Whether to serve Prometheus metrics.",
        ),
        key(
            "metrics",
            "listen",
            format!("\"{}\"", d.metrics.listen),
            "Address and port of the metrics endpoint. Under --simulate, metrics are served only when the file named by --config sets this key.",
        ),
        key(
            "metrics",
            "client_series_max",
            d.metrics.client_series_max.to_string(),
            "Most label sets of the series per client, 1 to 4096.",
        ),
        key(
            "metrics",
            "client_refresh_seconds",
            d.metrics.client_refresh_seconds.to_string(),
            "Seconds between refreshes of the series per client, 1 to 300.",
        ),
        key(
            "cdi",
            "enabled",
            d.cdi.enabled.to_string(),
            "Whether to write the CDI spec of what the node shares.",
        ),
        key(
            "cdi",
            "dir",
            path(&d.cdi.dir),
            "Directory container runtimes read CDI specs from; the spec is gpushare.json there. Left at its default without root, or under --simulate unless the file named by --config sets it, it is <state_dir>/cdi.",
        ),
        key(
            "device_plugin",
            "enabled",
            d.device_plugin.enabled.to_string(),
            "Whether to write NVIDIA's device plugin config from the GPUs; an apply the plugin cannot express is then refused.",
        ),
        key(
            "device_plugin",
            "path",
            path(&d.device_plugin.path),
            "The device plugin config (its --config-file). Left at its default without root, or under --simulate unless the file named by --config sets it, it is <state_dir>/device-plugin.yaml.",
        ),
        key(
            "device_plugin",
            "mps_host_shm",
            d.device_plugin.mps_host_shm.to_string(),
            "Whether MPS may be handed out through the plugin, whose pods then get the host's /dev/shm (where the MPS servers meet their clients); off, an MPS profile is refused while the view is on.",
        ),
        key(
            "labels",
            "enabled",
            d.labels.enabled.to_string(),
            "Whether to write the node labels for NFD's local feature source.",
        ),
        key(
            "labels",
            "path",
            path(&d.labels.path),
            "The labels file (NFD's features.d). Left at its default without root, or under --simulate unless the file named by --config sets it, it is <state_dir>/features.d/gpushare.",
        ),
        key(
            "slurm",
            "enabled",
            d.slurm.enabled.to_string(),
            "Whether to write this node's Slurm gres.conf from the GPUs.",
        ),
        key(
            "slurm",
            "gres_conf",
            path(&d.slurm.gres_conf),
            "The node-local gres.conf slurmd reads. Left at its default without root, or under --simulate unless the file named by --config sets it, it is <state_dir>/slurm/gres.conf.",
        ),
        key(
            "slurm",
            "manage_node",
            d.slurm.manage_node.to_string(),
            "Whether an apply that changes the node's GRES takes the node through it: checked first (slurmctld answers, knows the node, no job is on it, a change of its GRES only on a dynamic node), drained, slurmd registered again with the new GRES, resumed; a failure leaves it drained with the error as the reason. False: gres.conf only.",
        ),
        key(
            "slurm",
            "node",
            "\"\"".into(),
            "Slurm's name of this node; empty: the host's short name (slurmd's default).",
        ),
        key(
            "slurm",
            "bin_dir",
            path(&d.slurm.bin_dir),
            "Where scontrol and squeue are (root's files in a directory no one else may write).",
        ),
        key(
            "slurm",
            "slurm_conf",
            "\"\"".into(),
            "SLURM_CONF for scontrol, squeue and the slurmd commands; empty: Slurm's default.",
        ),
        key(
            "slurm",
            "slurmd_env",
            path(&d.slurm.slurmd_env),
            "The file a dynamic node's slurmd reads its Gres= from (GPUSHARE_SLURMD_GRES=, /usr/share/doc/gpushare/examples/slurmd-gpushare.conf). Left at its default without root, or under --simulate unless the file named by --config sets it, it is <state_dir>/slurm/slurmd.env.",
        ),
        key(
            "slurm",
            "stop_slurmd",
            format!("{:?}", d.slurm.stop_slurmd),
            "Stops slurmd (through /bin/sh -c), returning once it has stopped.",
        ),
        key(
            "slurm",
            "start_slurmd",
            format!("{:?}", d.slurm.start_slurmd),
            "Starts slurmd (through /bin/sh -c).",
        ),
        key(
            "slurm",
            "register_timeout_seconds",
            d.slurm.register_timeout_seconds.to_string(),
            "How long slurmd may take to register again with the new GRES, 1 to 3600 seconds.",
        ),
        key(
            "bench",
            "max_total_seconds",
            d.bench.max_total_seconds.to_string(),
            "The longest one bench may hold its GPU, 1 to 604800 seconds.",
        ),
        key(
            "health",
            "enabled",
            d.health.enabled.to_string(),
            "Whether the agent watches the GPUs' health: the driver's events (Xids, ECC errors, a GPU gone, recovery actions) and, polled, pending row remaps and page retirements, the recovery-action field and a GPU lost. A fault marks the GPU or MIG instance unhealthy everywhere (status, clients, metrics, the journal, the CDI spec and the other views) and refuses applies that would build there.",
        ),
        key(
            "health",
            "poll_seconds",
            d.health.poll_seconds.to_string(),
            "Seconds between polls of what no event carries, and of the clean check that clears a fault asking only for an application restart once its processes have ended, 1 to 60.",
        ),
    ]
}

/// The variables the agent reads (or hands on), each with what it does.
const ENVIRONMENT: &[(&str, &str)] = &[
    (
        "GPUSHARE_LOG",
        "Log filter (tracing's directives: warn, info, gpushare_agent=debug); default info, and warn on the terminal under --simulate (the journal still gets info).",
    ),
    (
        "GPUSHARE_BUS_ADDRESS",
        "Read by gpushare-ctl, not the agent: the address of the bus the agent serves (the agent takes it as --bus).",
    ),
    ("DBUS_SYSTEM_BUS_ADDRESS", "The system bus (--bus system; by default as root)."),
    ("DBUS_SESSION_BUS_ADDRESS", "The session bus (--bus session; by default without root)."),
    ("XDG_STATE_HOME", "Without root, the state directory is $XDG_STATE_HOME/gpushare."),
    (
        "HOME",
        "Without root and without XDG_STATE_HOME, the state directory is ~/.local/state/gpushare.",
    ),
    ("PATH", "Where a bare [mps] control or [timeslice] nvidia_smi is looked up."),
    ("NOTIFY_SOCKET", "Set by systemd: readiness, STATUS= lines and watchdog pings go there."),
    ("WATCHDOG_USEC", "Set by systemd: how often the watchdog wants a ping."),
    (
        "JOURNAL_STREAM",
        "Set by systemd: when stderr is the journal, entries go to journald with fields.",
    ),
    (
        "INVOCATION_ID",
        "Set by systemd: under a unit, MPS servers and bench replicas get units of their own.",
    ),
    (
        "GPUSHARE_SIM_DIR",
        "--simulate: the directory holding gpushare's simulated driver and tools.",
    ),
    ("GPUSHARE_SIM_FAIL", "--simulate: NVML calls or tool runs that fail (for tests)."),
    ("GPUSHARE_SIM_DELAY_MS", "--simulate: every changing NVML call first sleeps this long."),
    ("GPUSHARE_SIM_PROCESSES", "--simulate: compute processes on the simulated GPUs."),
    ("GPUSHARE_SIM_REBOOT", "--simulate: start as after a reboot."),
    ("GPUSHARE_SIM_RECORD", "--simulate: a file the simulated tools log their invocations to."),
    ("GPUSHARE_SIM_HOST", "--simulate: the host around the GPUs (reset blockers, NUMA)."),
    ("GPUSHARE_SIM_NODE", "Set by the agent for its simulated driver: the node's models."),
    ("GPUSHARE_SIM_STATE", "Set by the agent for its simulated driver: the node's state file."),
    (
        "GPUSHARE_AGENT_DRIVER",
        "Set by the agent: nvidia or simulated, so that the simulated library refuses an agent that means NVIDIA's.",
    ),
    ("GPUSHARE_JOURNAL_SOCKET", "For tests: another journald socket to send entries to."),
    (
        "GPUSHARE_PROFILE, GPUSHARE_GPUS, GPUSHARE_HOOK, GPUSHARE_RESULT",
        "Set for hooks: the profile, its GPUs (0,1,2), pre_apply or post_apply, and after, success, rolled-back or failed.",
    ),
    (
        "GPUSHARE_BENCH_REPLICA, GPUSHARE_BENCH_REPLICAS, GPUSHARE_BENCH_STRATEGY, GPUSHARE_BENCH_REPORT",
        "Set for bench replicas: which replica, how many, the strategy, and the descriptor to report units on.",
    ),
    (
        "GPUSHARE_PROBE_KERNELS, GPUSHARE_PROBE_LAUNCH_BLOCKS, GPUSHARE_PROBE_GRID_SMS",
        "Read by the probe's client processes: which kernels, and their launch geometry.",
    ),
];

/// The page, written into `dir` as `gpushare-agent.8`; its path.
pub fn write(cmd: clap::Command, dir: &Path) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("gpushare-agent.8");
    let mut file = std::fs::File::create(&path)?;
    file.write_all(render(cmd)?.as_bytes())?;
    Ok(path)
}

/// The page as roff.
pub fn render(cmd: clap::Command) -> io::Result<String> {
    let versioned = cmd.get_version().is_some();
    let man = clap_mangen::Man::new(cmd).section("8").manual("gpushare");
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;
    let mut page = String::from_utf8_lossy(&out).into_owned();
    page.push_str(&files());
    page.push_str(&configuration());
    page.push_str(&signals());
    page.push_str(&environment());
    page.push_str(&see_also());
    if versioned {
        let mut out = Vec::new();
        man.render_version_section(&mut out)?;
        page.push_str(&String::from_utf8_lossy(&out));
    }
    Ok(page)
}

fn files() -> String {
    let mut s = section("FILES");
    let d = AgentConfig::default();
    tagged(
        &mut s,
        config::DEFAULT_CONFIG_PATH,
        "The configuration (see CONFIGURATION); --config names another. Read at start only: a file that does not read leaves the agent running hands-off (it changes nothing, and status says why) until it is fixed and the agent restarted.",
    );
    tagged(
        &mut s,
        &format!("{}/*.toml", d.profiles_dir.display()),
        "Profile files, read at start and again on SIGHUP; a file that does not read is left out and listed by gpushare-ctl profiles.",
    );
    tagged(
        &mut s,
        &d.state_dir.display().to_string(),
        "The state directory (without root $XDG_STATE_HOME/gpushare; under --simulate as root /run/gpushare-sim): state.json (the journal and the active profile), agent.lock (one agent per directory), config-in-use.json (where the MPS servers and tools are), probe/, driver.json (whether a real or a simulated agent wrote the directory: each refuses the other's), and under --simulate simulated-gpus.json and the simulated host beside it.",
    );
    tagged(
        &mut s,
        &d.mps.root.display().to_string(),
        "The MPS root: one directory per served GPU or MIG device, <UUID>/pipe and <UUID>/log ([mps] root).",
    );
    tagged(
        &mut s,
        &d.cdi.dir.join(crate::cdi::FILE_NAME).display().to_string(),
        "The CDI spec of what the node shares ([cdi] dir).",
    );
    s
}

fn configuration() -> String {
    let mut s = section("CONFIGURATION");
    paragraph(
        &mut s,
        &format!(
            "{} is TOML; every key is optional, and a key the agent does not know is refused with its file, line and column. The keys, with their defaults:",
            config::DEFAULT_CONFIG_PATH
        ),
    );
    let mut table = None;
    for k in keys() {
        if table != Some(k.table) && !k.table.is_empty() {
            paragraph(&mut s, &format!("[{}]", k.table));
        }
        table = Some(k.table);
        tagged(&mut s, &format!("{} = {}", k.name, k.default), k.meaning);
    }
    s
}

fn signals() -> String {
    let mut s = section("SIGNALS");
    tagged(
        &mut s,
        "SIGHUP",
        "Read the profile directory again (systemctl reload gpushare-agent). agent.toml is read at start only.",
    );
    tagged(
        &mut s,
        "SIGTERM, SIGINT",
        "Stop: a running apply is finished (or rolled back) first, a running bench is cancelled and its GPU restored. MPS servers keep serving; the next agent adopts them.",
    );
    s
}

fn environment() -> String {
    let mut s = section("ENVIRONMENT");
    for (name, meaning) in ENVIRONMENT {
        tagged(&mut s, name, meaning);
    }
    s
}

fn see_also() -> String {
    let mut s = section("SEE ALSO");
    paragraph(
        &mut s,
        "gpushare-ctl(1), nvidia-smi(1), systemctl(1); README.md and DESIGN.md in /usr/share/doc/gpushare.",
    );
    s
}

/// `.SH TITLE`.
fn section(title: &str) -> String {
    format!(".SH {}\n", escape(title))
}

/// A paragraph.
fn paragraph(s: &mut String, text: &str) {
    s.push_str(&format!(".PP\n{}\n", escape(text)));
}

/// A term in bold and its text indented below it.
fn tagged(s: &mut String, term: &str, text: &str) {
    s.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", escape(term), escape(text)));
}

/// Text as roff prints it literally: backslashes escaped, hyphens as hyphens, and no line
/// that begins with a control character.
fn escape(text: &str) -> String {
    let text = text.replace('\\', "\\e").replace('-', "\\-");
    match text.chars().next() {
        Some('.' | '\'') => format!("\\&{text}"),
        _ => text,
    }
}

#[cfg(test)]
mod tests;
