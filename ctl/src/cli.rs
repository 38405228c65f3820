//! Command-line syntax of `gpushare-ctl` (clap derive).
//!
//! Global options (`--json`, `--address`) are accepted before or after the verb. A new verb
//! is a new variant of [`Command`] plus a module under `commands/` that runs it.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::error::{ContextKind, ContextValue};
use clap::{ArgGroup, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use gpushare_proto::bench::{
    BENCH_MAX_DURATION, BENCH_MAX_REPLICAS, BENCH_MAX_TIME_LIMIT, BENCH_MIN_SECONDS, BenchStrategy,
    Objective, Slo,
};
use gpushare_proto::{
    BUS_ADDRESS_ENV, MPS_MAX_CLIENTS, MPS_THREAD_PERCENTAGE, PROBE_SECONDS, Workload,
};

/// Drives gpushare-agent: applies GPU sharing profiles (MIG, MPS, time-slicing), or NVIDIA
/// mig-parted configs as they are, and shows the GPUs' state.
// `-h` and the man page's NAME show the package description, `--help` this doc comment.
#[derive(Debug, Parser)]
#[command(name = "gpushare-ctl", version, about, long_about)]
pub struct Cli {
    /// Print exactly one JSON object on stdout (errors too); no prompts, no progress.
    #[arg(long, global = true)]
    pub json: bool,

    /// Bus of the agent: `system`, `session`, or a D-Bus address (`unix:path=/run/x`).
    ///
    /// The environment variable GPUSHARE_BUS_ADDRESS sets the same (the command line wins):
    /// `export GPUSHARE_BUS_ADDRESS=unix:path=/tmp/bus` points every later call at a private
    /// bus. Without either, ctl calls the agent on the system bus and, when nobody serves
    /// io.gpushare.Agent1 there and DBUS_SESSION_BUS_ADDRESS is set, on the session bus.
    #[arg(long, global = true, value_name = "ADDR", env = BUS_ADDRESS_ENV)]
    pub address: Option<String>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply a sharing profile to the GPUs (a journaled job, rolled back on failure).
    Apply(ApplyArgs),
    /// Show the steps applying a profile would take, changing nothing.
    Plan(PlanArgs),
    /// Check that a profile is applied: exit 0 when it is, 1 when it is not.
    #[command(after_help = ASSERT_EXIT_HELP)]
    Assert(AssertArgs),
    /// Show the GPUs, their MIG instances and sharing, and the active profile.
    Status,
    /// Print the GPUs as a profile that `apply -f` takes back as they are (MIG layout, MPS
    /// with its limits, time-slicing with its interval, compute modes), or their MIG
    /// layout alone as NVIDIA mig-parted's config file.
    #[command(after_help = EXPORT_HELP)]
    Export(ExportArgs),
    /// List the known profiles, or show one.
    Profiles(ProfilesArgs),
    /// Check a profile file and plan it against this node, changing nothing.
    Validate(ValidateArgs),
    /// Show the MPS servers the agent runs, or set the limits of one.
    Mps(MpsArgs),
    /// Show the GPUs' MIG profiles as their driver reports them (`mig profiles [GPU]`).
    Mig(MigArgs),
    /// Act on one GPU: `gpu reset N` resets an unhealthy GPU and applies the active
    /// profile to it again.
    Gpu(GpuArgs),
    /// Print the variables a client needs to use a GPU or MIG instance as it is shared.
    #[command(after_help = ENV_HELP)]
    Env(EnvArgs),
    /// List the devices of the agent's CDI spec (whole GPUs, MIG devices, MPS shares) and
    /// how a container asks for each.
    #[command(after_help = CDI_HELP)]
    Cdi(CdiArgs),
    /// Show every process using the GPUs (PID, user, unit or container, where, memory,
    /// MPS share, command line) and the MIG instances and MPS servers no one uses.
    #[command(after_help = CLIENTS_HELP, arg = json_arg(CLIENTS_JSON))]
    Clients(ClientsArgs),
    /// A live view, one screen refreshed each second: per GPU its model, MIG, sharing and
    /// readings (utilisation, memory, temperature, power), per MIG instance its sharing and
    /// memory, then the processes using it, then what no one uses.
    #[command(after_help = TOP_HELP, arg = json_arg(TOP_JSON))]
    Top(TopArgs),
    /// Measure what sharing costs: N CUDA client processes against a solo baseline, under
    /// the current sharing.
    #[command(after_help = PROBE_HELP)]
    Probe(ProbeArgs),
    /// Find the best way to share a GPU for your own program: N replicas of it under
    /// time-slicing, MPS, MPS with limits and MIG, measured against one alone.
    #[command(after_help = BENCH_HELP, override_usage = BENCH_USAGE)]
    // Boxed: the largest arguments by far.
    Bench(Box<BenchArgs>),
    /// Stop a running bench early: its replicas are stopped and its GPU restored. Root may
    /// cancel anyone's bench, a user their own.
    #[command(after_help = CANCEL_HELP)]
    Cancel(CancelArgs),
}

/// Shown under the help of `cancel`.
const CANCEL_HELP: &str = "\
`gpushare-ctl status` names each running bench with its job. After asking, cancel waits
(up to 2 minutes) for the job to end and prints how it ended. A bench's user may cancel it
from any terminal (or with Ctrl-C in the `gpushare-ctl bench` that started it), root
anyone's. An apply cannot be cancelled: it rolls back by itself when it fails.";

/// Arguments of `cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The job: its path as `status` shows it (/io/gpushare/Agent1/jobs/3) or its number (3).
    #[arg(value_name = "JOB")]
    pub job: String,
}

/// The global `--json` (of [`Cli`]) as a verb that prints more than one object documents
/// it: clap leaves the verb's own in place of the global one and hands its value up.
fn json_arg(help: &'static str) -> clap::Arg {
    clap::Arg::new("json").long("json").action(clap::ArgAction::SetTrue).help(help)
}

/// `--json` of `clients`.
const CLIENTS_JSON: &str = "Print exactly one JSON object on stdout (errors too); with --watch, one per \
interval, each on its own line (NDJSON), an error ending it as one more; no prompts, no progress";

/// `--json` of `top`.
const TOP_JSON: &str = "Print one JSON object per interval on stdout, each on its own line (NDJSON), \
an error ending it as one more; no prompts, no progress";

/// The usage line of `bench`: the command comes after `--`.
const BENCH_USAGE: &str = "\
gpushare-ctl bench [OPTIONS] -- COMMAND [ARGS]...
       gpushare-ctl bench [OPTIONS] --builtin <NAME>";

/// Shown under the help of `bench`.
const BENCH_HELP: &str = "\
Runs as a job of the agent (progress on stderr): for each strategy and replica count N, it
sets the GPU up, starts N copies of COMMAND together (your own processes: as you, with
exactly your groups, in this directory, with this environment; under systemd each in a
unit of your slice), measures them, and at the end restores the GPU's sharing as it was.
Ctrl-C cancels: the agent stops the replicas and restores the sharing (Ctrl-C again
leaves that to the agent). Their output (8 MiB a stream at most) and report.json go to
--logs DIR, or a new directory under ${XDG_STATE_HOME:-~/.local/state}/gpushare/bench
(the newest 10 are kept); what a bench ran and printed is yours and root's alone.

How the replicas are measured (one of three):
  units by line  (the default) each replica writes a line to the file descriptor named in
                 $GPUSHARE_BENCH_REPORT per unit of work done: empty, or its latency in ms;
                 throughput is units per second over a --duration window
  --histogram    each replica serves Prometheus metrics on $GPUSHARE_BENCH_METRICS_PORT; the
                 histogram NAME is scraped before and after the window
  --until-exit   each replica does a fixed amount of work and exits; its wall time counts
Replicas also see $GPUSHARE_BENCH_REPLICA (0, 1, ...), $GPUSHARE_BENCH_REPLICAS (N) and
$GPUSHARE_BENCH_STRATEGY.

Each replica is pinned to its own CPUs: the CPUs of the GPU's NUMA node (or --cpus LIST)
divided into equal, disjoint sets, the same set for replica i in every run, strategy and
repeat, the baseline on replica 0's; so a replica count needs that many CPUs. --no-pin
leaves them wherever the kernel puts them. Before measuring, the bench says what it will
run and what it leaves out, and why (replica counts beyond the CPUs, MIG off). The report
shows the pinning, each run's interval, and the host's own noise: a difference is a verdict
only when the interval of the ratio of the two runs' medians, at least the host's noise,
lies beyond it; otherwise the report says \"within the noise\". Ctrl-C keeps what was
measured: the report shows it, marked partial.

The answer: per N the strategy the --objective picks; with an --slo, how many replicas per
GPU each strategy holds to it and the GPUs a --fleet of that many replicas needs.
Durations take 500ms, 1.5s, 30s, 2m, 1h or plain seconds. Options left out are the agent's
defaults (replicas 1,3,5,7, every strategy, 30 s windows, throughput, a fleet of 100,
10 min per replica, 1 round: each run measured once and the baseline three times). Examples:
  gpushare-ctl bench -- ./serve --model small
  gpushare-ctl bench --replicas 1,2,4 --strategies mps,mig --slo p99=50ms -- python infer.py
  gpushare-ctl bench --until-exit --report bench.html -- ./train --epochs 1
  gpushare-ctl bench --cpus 0-15 --repeat 3 -- python infer.py --batch 8
  gpushare-ctl bench --builtin compute --duration 5s --json";

/// Shown under the help of `probe`.
const PROBE_HELP: &str = "\
Runs as a job of the agent (progress on stderr) and changes nothing (--compare changes the
sharing for a while and restores it). For each workload and client count, the clients run
together for one window and are compared with one client running alone: SCALING is their
summed throughput over the solo one (1 client alone = 1.00x), FAIRNESS is Jain's index of
their throughputs (1.000 = all equal), P50 and P99 are latency inflations over solo,
SLOWDOWN is solo throughput over each client's.
--compare is the built-in case of `bench`: for each workload, a bench of that workload
(`bench --builtin W --strategies time-slicing,mps,mps-limited`, the client counts as
replica counts, --seconds as the window) with bench's tables and recommendation. Options
left out are the agent's defaults. Examples:
  gpushare-ctl probe
  gpushare-ctl probe --compare --clients 1,4,7
  gpushare-ctl probe --target 1 --clients 1,2,4 --workload compute --seconds 5";

/// Shown under the help of `env`.
const ENV_HELP: &str = "\
A GPU with MIG on cannot be used whole: name one of its instances (the refusal lists them).
Prints one `export NAME='value'` line per variable and nothing else, for a shell:
  eval \"$(gpushare-ctl env 0)\"
  eval \"$(gpushare-ctl env MIG-11111111-1111-1111-1111-111111111111)\"";

/// The exit statuses of `assert`, shown under its help.
const ASSERT_EXIT_HELP: &str = "\
Exit status:
  0  the profile is applied: its plan has no steps
  1  the profile is not applied (stderr says how many steps would change which GPUs;
     with --json the assert document is printed, \"applied\": false), or the check
     failed (unknown profile, infeasible, agent not running: stderr or the --json
     error object says why)
  2  usage error";

/// Which profile a verb works on: a known profile by name, or a document read from a file.
#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("source").required(true).args(["profile", "file"])))]
pub struct ProfileSource {
    /// Profile name (see `gpushare-ctl profiles`).
    pub profile: Option<String>,
    /// Profile document instead of a name: a gpushare profile (TOML) or NVIDIA mig-parted's
    /// config.yaml (with -c; nvidia-mig-manager keeps it at
    /// /etc/nvidia-mig-manager/config.yaml); `-` reads standard input.
    #[arg(short = 'f', long, value_name = "FILE")]
    pub file: Option<String>,
    /// The mig-parted config to use, one of the file's `mig-configs` (`all-balanced`); only
    /// with -f.
    // `requires` alone is not enough: clap waives it when `file` conflicts with a present
    // argument, as it does with PROFILE through the group.
    #[arg(short = 'c', long, value_name = "NAME", requires = "file", conflicts_with = "profile")]
    pub config: Option<String>,
}

/// What `export` cannot write, after its options.
const EXPORT_HELP: &str = "\
Applying the export changes nothing, but for what a profile cannot say, which the export
lists in comment lines at its top and as warnings on stderr: a compute mode other than its
sharing gives (MPS on a whole GPU: exclusive_process, else default), MPS limits changed by
hand (drift) or by `mps limit` on one server process, a MIG mode change pending a reset,
MIG devices of one kind shared differently, a time-slice interval under MPS. MPS limits
are written as set (active_thread_percentage, pinned_memory_limit), not as the replicas
they came from; max_clients is not observable and not written. A GPU holding a MIG
instance its MIG table lacks is left out (applying leaves it alone).

--format mig-parted writes the MIG layout only: what it leaves out (MPS, time-slicing,
compute modes) is listed at its top and on stderr, and applying it with gpushare undoes it.";

/// Arguments of `export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// `toml` (a gpushare profile, sharing included), `mig-parted` (NVIDIA mig-parted's
    /// config.yaml, one config named `exported`; the MIG layout only), `device-plugin`
    /// (NVIDIA's device plugin config), `labels` (node labels for NFD's local source) or
    /// `slurm` (this node's gres.conf, with slurm.conf's GresTypes= and Gres=).
    #[arg(long, value_enum, default_value_t = ExportFormat::Toml)]
    pub format: ExportFormat,
}

/// What `export` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// A gpushare profile.
    Toml,
    /// NVIDIA mig-parted's config file.
    MigParted,
    /// NVIDIA's device plugin config (k8s-device-plugin `--config-file`).
    DevicePlugin,
    /// Node labels for NFD's local feature source (a features.d file).
    Labels,
    /// Slurm's gres.conf of this node (with slurm.conf's `GresTypes=` and `Gres=`).
    Slurm,
}

/// Arguments of `apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The profile.
    #[command(flatten)]
    pub source: ProfileSource,
    /// Print the plan instead of applying it (same as `plan`).
    #[arg(long)]
    pub dry_run: bool,
    /// Proceed although compute processes use what must change (they will lose their GPU).
    #[arg(long)]
    pub force: bool,
}

/// Arguments of `plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The profile.
    #[command(flatten)]
    pub source: ProfileSource,
}

/// Arguments of `assert`.
#[derive(Debug, Args)]
pub struct AssertArgs {
    /// The profile.
    #[command(flatten)]
    pub source: ProfileSource,
}

/// Arguments of `profiles`.
#[derive(Debug, Args)]
pub struct ProfilesArgs {
    /// `list` (the default) or `show NAME`.
    #[command(subcommand)]
    pub command: Option<ProfilesCommand>,
}

/// Sub-verbs of `profiles`.
#[derive(Debug, Subcommand)]
pub enum ProfilesCommand {
    /// List the known profiles; `*` marks the active one.
    List {
        /// Only the names, one per line (for scripts and shell completion).
        #[arg(long)]
        names: bool,
    },
    /// Show one profile's source text.
    Show {
        /// Profile name.
        name: String,
    },
}

/// Arguments of `validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Profile file (TOML) to check; `-` reads standard input.
    pub file: String,
}

/// Arguments of `mps`.
#[derive(Debug, Args)]
pub struct MpsArgs {
    /// `status` (the default) or `limit`.
    #[command(subcommand)]
    pub command: Option<MpsCommand>,
}

/// Sub-verbs of `mps`.
#[derive(Debug, Subcommand)]
pub enum MpsCommand {
    /// List the MPS servers: device, state, mode, whom each serves, the limits a client
    /// gets now (as the control daemon answers them) and where they come from, clients,
    /// pipe directory.
    Status,
    /// Set the limits of the MPS server process that serves a client; they apply to that
    /// server's new clients, and a server started later (for another user, or after a
    /// restart) begins with the profile's limits again.
    Limit(MpsLimitArgs),
}

/// Arguments of `mps limit`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("limits").required(true).multiple(true).args(["threads", "memory"])))]
pub struct MpsLimitArgs {
    /// PID of a client of the MPS server whose limits to set.
    #[arg(long, value_name = "PID", value_parser = clap::value_parser!(u32).range(1..))]
    pub pid: u32,
    /// Active thread percentage, 1-100.
    #[arg(
        long,
        value_name = "PCT",
        value_parser = clap::value_parser!(u32).range(
            i64::from(*MPS_THREAD_PERCENTAGE.start())..=i64::from(*MPS_THREAD_PERCENTAGE.end())
        )
    )]
    pub threads: Option<u32>,
    /// Pinned device memory limit: bytes, or `2GiB`, `512MiB`, `2G`, `512M`.
    #[arg(long, value_name = "SIZE", value_parser = gpushare_proto::parse_size)]
    pub memory: Option<u64>,
}

/// Arguments of `gpu`.
#[derive(Debug, Args)]
pub struct GpuArgs {
    /// `reset`.
    #[command(subcommand)]
    pub command: GpuCommand,
}

/// Sub-verbs of `gpu`.
#[derive(Debug, Subcommand)]
pub enum GpuCommand {
    /// Reset a GPU whose fault asks for it (an Xid, an ECC error, a pending row remap), then
    /// apply the active profile to it again.
    #[command(after_help = GPU_RESET_HELP)]
    Reset(GpuResetArgs),
}

/// Arguments of `gpu reset`.
#[derive(Debug, Args)]
pub struct GpuResetArgs {
    /// The GPU, by index (as `status` numbers them).
    #[arg(value_name = "N")]
    pub gpu: u32,
}

/// Shown under the help of `gpu reset`.
const GPU_RESET_HELP: &str = "\
`gpushare-ctl status` shows each fault with what it asks for. A reset is refused, with
nothing changed, when the GPU is healthy, when a process still uses it (end it first),
when its fault asks for a node reboot (a GPU fallen off the bus), or when the host keeps
the GPU from being reset. Otherwise the agent stops the GPU's MPS servers, resets it with
nvidia-smi, clears its faults and applies the active profile again, which builds the GPU's
MIG instances and MPS servers anew. A fault that asks only for the application to be
restarted needs no reset: it clears by itself once every process that was on the GPU or
instance has ended.";

/// Arguments of `mig`.
#[derive(Debug, Args)]
pub struct MigArgs {
    /// `profiles`.
    #[command(subcommand)]
    pub command: MigCommand,
}

/// Sub-verbs of `mig`.
#[derive(Debug, Subcommand)]
pub enum MigCommand {
    /// List a GPU's MIG profiles as its driver reports them (`nvidia-smi mig -lgip`'s
    /// columns and `-lgipp`'s placements), with the names gpushare profiles accept.
    #[command(after_help = MIG_PROFILES_HELP)]
    Profiles(MigProfilesArgs),
}

/// Arguments of `mig profiles`.
#[derive(Debug, Args)]
pub struct MigProfilesArgs {
    /// The GPU (index or `GPU-…` UUID); every GPU with MIG when left out.
    #[arg(value_name = "GPU")]
    pub gpu: Option<String>,
}

/// Shown under the help of `mig profiles`.
const MIG_PROFILES_HELP: &str = "\
Columns as `nvidia-smi mig -lgip` prints them: FREE/TOTAL instances (free: how many more
fit beside the GPU's instances now; `-` while MIG is off), memory in GiB (MiB/1024), SMs,
decoders, encoders, copy engines, JPEG decoders and optical flow accelerators of one
instance; then PLACEMENTS as `-lgipp` writes them ({start slots}:memory slots) and ACCEPTS,
the names a profile's `mig` table may use for it (mig-parted files take the exact name).
The header line says where the table comes from (the driver, through NVML) and how it
compares with gpushare's catalog. Examples:
  gpushare-ctl mig profiles
  gpushare-ctl mig profiles 0 --json";

const CDI_HELP: &str = "\
The agent keeps a CDI spec of what the node shares, rewritten with every apply: podman,
containerd, CRI-O and Docker 25+ read it. The first line of `gpushare-ctl cdi` says where:
/var/run/cdi/gpushare.json for the packaged agent ([cdi] dir in agent.toml), cdi/ in its
state directory for a simulated agent (/run/gpushare-sim as root) or one without root. Names: 0 or GPU-… (a whole GPU),
0:1 or MIG-… (a MIG device), 0-mps-2 (share 2 of GPU 0's MPS server, with its limits).
The spec adds the sharing, not the driver's libraries: ask for NVIDIA's device of the same
GPU too (the spec NVIDIA's container toolkit writes, nvidia-ctk), and for an MPS share
the server's IPC namespace. Examples:
  gpushare-ctl cdi
  gpushare-ctl cdi 0-mps-1
  podman run --device nvidia.com/gpu=0 --device gpushare.io/gpu=0-mps-1 --ipc=host IMAGE";

const CLIENTS_HELP: &str = "\
Lists the compute processes of every GPU and MIG instance as the driver reports them, and the
clients of every MPS server the agent runs, each with its user, its systemd unit or container
(from its cgroup), GPU memory (as the driver reports it; `-` for an MPS client the driver
shows only through its server) and, for an MPS client, its share. A command line is shown to
root and to the process's own user only.
--watch redraws the table every --interval on a terminal, under a title line with the time
(cut to its height), and prints a new table per interval into a pipe or file, under the
local time it was read (2026-11-27 11:40:05 UTC), a blank line between two; Ctrl-C ends it
(exit 0). With --json, which otherwise prints one object, watching prints a stream: one
ClientTable document per line (NDJSON), one per interval, with the time as \"time\".
--query prints the fields named, comma-separated, one line per client in CSV (RFC 4180
quoting, lines ending in LF) under a header line (`--format csv,noheader` leaves it out);
a field the agent does not know or does not show (a unit, another user's command line)
is empty. Fields: pid, user, uid, unit, container, gpu, gpu_uuid, instance (MIG-…), via
(gpu, mig or mps), mps_server, memory_bytes, share_threads (an MPS client's active thread
percentage), share_memory_bytes (its pinned memory limit), command. Examples:
  gpushare-ctl clients
  gpushare-ctl clients --json
  gpushare-ctl clients --watch --interval 2
  gpushare-ctl clients --query pid,user,memory_bytes --format csv,noheader";

const TOP_HELP: &str = "\
Shows what `status` and `clients` report, together, with the driver's readings: a line per
GPU (model, MIG on or off, sharing, utilisation, memory used/total, temperature, power, and
the GPU memory its listed processes hold), a line per MIG instance (and one per compute
instance of an instance split into several), under each instance the processes using it,
and the MIG instances and MPS servers no one uses. A reading the driver does not give is
`-` (utilisation with MIG on); from an agent without readings the line shows the memory.
On a terminal the screen is redrawn every --interval under a title line with the time (cut
to its height); into a pipe or file a new view is printed per interval, under the local
time it was read (2026-11-27 11:40:05 UTC), a blank line between two. Ctrl-C ends it (exit
0). --json prints one line per interval (NDJSON): {\"status\": …, \"clients\": …,
\"telemetry\": …, \"time\": \"2026-11-27 11:40:05 UTC\"}, the Status, ClientTable and
Telemetry documents (telemetry null from an agent that does not report it) and the local
time. Examples:
  gpushare-ctl top
  gpushare-ctl top --interval 0.5";

/// The range of `--interval`.
pub const WATCH_INTERVAL: std::ops::RangeInclusive<f64> = 0.2..=60.0;

/// `--interval`: a number of seconds from 0.2 to 60.
fn parse_interval(text: &str) -> Result<f64, String> {
    let trimmed = text.trim();
    let seconds: f64 = match trimmed.parse() {
        Ok(s) if trimmed.chars().all(|c| c.is_ascii_digit() || c == '.') => s,
        _ => return Err(format!("`{text}` is not a number of seconds")),
    };
    if !WATCH_INTERVAL.contains(&seconds) {
        let (low, high) = (WATCH_INTERVAL.start(), WATCH_INTERVAL.end());
        return Err(format!("the interval must be {low} to {high} seconds, not {text}"));
    }
    Ok(seconds)
}

/// Arguments of `clients`.
#[derive(Debug, Args)]
pub struct ClientsArgs {
    /// Refresh every --interval until Ctrl-C: redrawn on a terminal, a table per interval
    /// otherwise (with --json, one document per line).
    #[arg(long)]
    pub watch: bool,
    /// With --watch: seconds between two refreshes, 0.2-60.
    #[arg(long, value_name = "SECONDS", requires = "watch", value_parser = parse_interval)]
    pub interval: Option<f64>,
    /// Print these fields of each client as CSV, comma-separated (`pid,user,memory_bytes`;
    /// see below for the fields).
    #[arg(
        long,
        value_name = "FIELDS",
        value_delimiter = ',',
        value_parser = parse_field,
        conflicts_with = "watch"
    )]
    pub query: Vec<ClientField>,
    /// With --query: `csv`, or `csv,noheader` without the header line.
    #[arg(long, value_name = "FORMAT", requires = "query", value_parser = parse_csv_format)]
    pub format: Option<CsvFormat>,
}

/// Arguments of `top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// Seconds between two refreshes, 0.2-60.
    #[arg(long, value_name = "SECONDS", default_value = "1", value_parser = parse_interval)]
    pub interval: f64,
}

/// A field of `clients --query`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientField {
    /// Process id.
    Pid,
    /// User name.
    User,
    /// User id.
    Uid,
    /// Systemd unit.
    Unit,
    /// Container id.
    Container,
    /// GPU index.
    Gpu,
    /// `GPU-…`.
    GpuUuid,
    /// `MIG-…`.
    Instance,
    /// `gpu`, `mig` or `mps`.
    Via,
    /// The `GPU-…`/`MIG-…` of its MPS server.
    MpsServer,
    /// GPU memory held.
    MemoryBytes,
    /// An MPS client's active thread percentage.
    ShareThreads,
    /// An MPS client's pinned memory limit.
    ShareMemoryBytes,
    /// Command line.
    Command,
    /// The fault of its GPU or MIG instance, if any (issue 42).
    Unhealthy,
}

impl ClientField {
    /// Every field, in the order the help lists them.
    pub const ALL: [ClientField; 15] = [
        ClientField::Pid,
        ClientField::User,
        ClientField::Uid,
        ClientField::Unit,
        ClientField::Container,
        ClientField::Gpu,
        ClientField::GpuUuid,
        ClientField::Instance,
        ClientField::Via,
        ClientField::MpsServer,
        ClientField::MemoryBytes,
        ClientField::ShareThreads,
        ClientField::ShareMemoryBytes,
        ClientField::Command,
        ClientField::Unhealthy,
    ];

    /// Its name on the command line and in the CSV header.
    pub fn name(self) -> &'static str {
        match self {
            ClientField::Pid => "pid",
            ClientField::User => "user",
            ClientField::Uid => "uid",
            ClientField::Unit => "unit",
            ClientField::Container => "container",
            ClientField::Gpu => "gpu",
            ClientField::GpuUuid => "gpu_uuid",
            ClientField::Instance => "instance",
            ClientField::Via => "via",
            ClientField::MpsServer => "mps_server",
            ClientField::MemoryBytes => "memory_bytes",
            ClientField::ShareThreads => "share_threads",
            ClientField::ShareMemoryBytes => "share_memory_bytes",
            ClientField::Command => "command",
            ClientField::Unhealthy => "unhealthy",
        }
    }
}

/// One field of `--query`, by name (case and blanks around it do not matter).
pub fn parse_field(text: &str) -> Result<ClientField, String> {
    let name = text.trim().to_ascii_lowercase();
    ClientField::ALL.into_iter().find(|f| f.name() == name).ok_or_else(|| {
        let names: Vec<&str> = ClientField::ALL.iter().map(|f| f.name()).collect();
        format!("unknown field `{}`; the fields are {}", text.trim(), names.join(", "))
    })
}

/// `--format` of `clients --query`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CsvFormat {
    /// Whether a header line comes first.
    pub header: bool,
}

impl Default for CsvFormat {
    fn default() -> Self {
        Self { header: true }
    }
}

/// `csv`, with nvidia-smi's options `noheader` and `nounits` (sizes are plain bytes
/// anyway), comma-separated.
pub fn parse_csv_format(text: &str) -> Result<CsvFormat, String> {
    let mut csv = false;
    let mut format = CsvFormat::default();
    for option in text.split(',').map(|o| o.trim().to_ascii_lowercase()) {
        match option.as_str() {
            "csv" => csv = true,
            "noheader" => format.header = false,
            "nounits" => {}
            _ => return Err(format!("`{option}` is not a format: csv, csv,noheader")),
        }
    }
    if !csv {
        return Err(format!("`{text}`: the format is csv (csv, csv,noheader)"));
    }
    Ok(format)
}

/// Arguments of `cdi`.
#[derive(Debug, Args)]
pub struct CdiArgs {
    /// One device only (`0-mps-1` or `gpushare.io/gpu=0-mps-1`).
    #[arg(value_name = "DEVICE")]
    pub device: Option<String>,
}

/// Arguments of `env`.
#[derive(Debug, Args)]
pub struct EnvArgs {
    /// The GPU (index or `GPU-…` UUID) or MIG instance (`MIG-…` UUID).
    #[arg(value_name = "GPU|MIG-UUID")]
    pub target: String,
}

/// Whether the raw arguments ask for `--json`, for reporting usage errors before clap has
/// parsed anything.
pub fn args_request_json<I, S>(args: I) -> bool
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    args.into_iter().skip(1).take_while(|a| a.as_ref() != "--").any(|a| a.as_ref() == "--json")
}

/// The verbs users see, in the order of the help.
pub fn verbs() -> Vec<String> {
    let cmd = Cli::command();
    let names = cmd.get_subcommands().filter(|s| !s.is_hide_set()).map(|s| s.get_name().to_owned());
    names.collect()
}

/// `gpushare-ctl` and the verbs (and sub-verbs) a command line names, `gpushare-ctl mps
/// limit`, for pointing at the right `--help` (hidden verbs included: only a command line
/// that names one gets here).
pub fn verb_path<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> String {
    named_command(args).0
}

/// The sub-verbs users see of the verb a command line names (`profiles` for `gpushare-ctl
/// mig`), or the verbs when it names none.
pub fn sub_verbs<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Vec<String> {
    let cmd = named_command(args).1;
    let names = cmd.get_subcommands().filter(|s| !s.is_hide_set()).map(|s| s.get_name().to_owned());
    names.filter(|n| n != "help").collect()
}

/// The path of verbs a command line names (as [`verb_path`]) and the innermost one's
/// definition.
fn named_command<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (String, clap::Command) {
    let mut cmd = Hidden::augment_subcommands(Cli::command());
    let mut path = String::from("gpushare-ctl");
    let mut args = args.iter().skip(1).map(AsRef::as_ref);
    while let Some(arg) = args.next() {
        if arg == "--" {
            break;
        }
        if arg == "--address" {
            args.next(); // its value
            continue;
        }
        let Some(arg) = arg.to_str() else { continue };
        if let Some(sub) = cmd.find_subcommand(arg).filter(|s| s.get_name() != "help").cloned() {
            path.push(' ');
            path.push_str(sub.get_name());
            cmd = sub;
        }
    }
    if path == "gpushare-ctl" {
        // The hidden verbs are no verbs to list.
        cmd = Cli::command();
    }
    (path, cmd)
}

/// Arguments of `probe`. Whatever is left out is not sent: the agent's defaults apply.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// The GPU (index or `GPU-…` UUID) or MIG instance (`MIG-…` UUID) to probe; GPU 0 by
    /// default.
    #[arg(long, value_name = "GPU|MIG-UUID")]
    pub target: Option<String>,
    /// Client counts to run, comma-separated, each 1-48 (`1,2,4,7`).
    #[arg(
        long,
        value_name = "N,…",
        value_delimiter = ',',
        value_parser = clap::value_parser!(u32).range(1..=i64::from(MPS_MAX_CLIENTS))
    )]
    pub clients: Vec<u32>,
    /// Workloads to run, comma-separated: `launch` (tiny kernels), `compute` (fp32 math),
    /// `memory` (bandwidth).
    #[arg(long = "workload", value_name = "NAME,…", value_delimiter = ',')]
    pub workloads: Vec<ProbeWorkload>,
    /// Measurement window of each run in seconds, 0.5-60.
    #[arg(long, value_name = "S", value_parser = parse_probe_seconds)]
    pub seconds: Option<f64>,
    /// Compare sharing strategies: for each workload, a bench of the built-in workload
    /// under time-slicing, MPS and MPS with 100/N % threads (the sharing is restored
    /// afterwards; refused while another process computes on the GPU).
    #[arg(long)]
    pub compare: bool,
}

/// A workload of `probe`, with its help text; the names are the protocol's [`Workload`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProbeWorkload {
    /// Kernel launch rate: tiny kernels, one after another.
    Launch,
    /// Arithmetic throughput (fp32).
    Compute,
    /// Device memory bandwidth.
    Memory,
}

impl ProbeWorkload {
    /// The protocol's workload.
    pub fn workload(self) -> Workload {
        match self {
            ProbeWorkload::Launch => Workload::Launch,
            ProbeWorkload::Compute => Workload::Compute,
            ProbeWorkload::Memory => Workload::Memory,
        }
    }
}

/// `--seconds` of `probe`: a number from 0.5 to 60.
fn parse_probe_seconds(text: &str) -> Result<f64, String> {
    let seconds: f64 =
        text.trim().parse().map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !PROBE_SECONDS.contains(&seconds) {
        let (low, high) = (PROBE_SECONDS.start(), PROBE_SECONDS.end());
        return Err(format!("the window must be {low} to {high} seconds, not {text}"));
    }
    Ok(seconds)
}

/// Arguments of `bench`. Whatever is left out is not sent: the agent's defaults apply.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("workload").required(true).args(["builtin", "command"])))]
pub struct BenchArgs {
    /// The GPU (index or `GPU-…` UUID) or MIG instance (`MIG-…` UUID) to bench on; GPU 0 by
    /// default.
    #[arg(long, value_name = "GPU|MIG-UUID")]
    pub target: Option<String>,
    /// Replica counts to run, comma-separated, each 1-48 (`1,3,5,7`).
    #[arg(long, value_name = "N,…", value_delimiter = ',', value_parser = parse_replica_count)]
    pub replicas: Vec<u32>,
    /// Strategies to try, comma-separated: `time-slicing`, `mps`, `mps-limited` (100/N %
    /// threads and 1/N of the memory each), `mig` (N equal instances).
    #[arg(long, value_name = "NAME,…", value_delimiter = ',', value_parser = strategy_parser())]
    pub strategies: Vec<BenchStrategy>,
    /// Measurement window of each run (`30s`, `2m`), 1 s to 1 h.
    #[arg(long, value_name = "TIME", value_parser = parse_window)]
    pub duration: Option<f64>,
    /// Measure each replica's wall time to its exit instead of a window.
    #[arg(long, conflicts_with_all = ["duration", "histogram"])]
    pub until_exit: bool,
    /// What the recommendation optimizes: `latency` (smallest p99) or `throughput`.
    #[arg(long, value_name = "WHAT", value_parser = parse_objective)]
    pub objective: Option<Objective>,
    /// The service level a replica count must keep to count as capacity: `p99=50ms` or
    /// `slowdown=2` (each replica at most 2x slower than alone).
    #[arg(long, value_name = "MEASURE=LIMIT", value_parser = parse_slo)]
    pub slo: Option<SloArg>,
    /// Measure with this Prometheus histogram that each replica serves (on
    /// $GPUSHARE_BENCH_METRICS_PORT) instead of units by line.
    #[arg(long, value_name = "NAME", value_parser = parse_histogram)]
    pub histogram: Option<String>,
    /// Run a built-in CUDA workload instead of a command.
    #[arg(long, value_name = "NAME", conflicts_with = "histogram")]
    pub builtin: Option<ProbeWorkload>,
    /// Replicas the fleet needs, for the GPUs-needed and saving figures (with --slo).
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    pub fleet: Option<u32>,
    /// The longest a replica may run (`10m`), 1 s to 24 h; it is stopped then.
    #[arg(long, value_name = "TIME", value_parser = parse_time_limit)]
    pub time_limit: Option<f64>,
    /// Measure in K rounds (1-10, default 1): each round measures the baseline and every
    /// strategy at every N once, in alternating order; each run is reported as the median
    /// of its K measurements with its interval. More rounds tell smaller differences apart
    /// (the baseline is measured at least 3 times anyway).
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..=10))]
    pub repeat: Option<u32>,
    /// Pin the replicas to these CPUs (a CPU list: `0-7,16-23`), divided into equal,
    /// disjoint sets, one per replica; default: the CPUs of the GPU's NUMA node.
    #[arg(long, value_name = "LIST", value_parser = parse_cpu_list)]
    pub cpus: Option<String>,
    /// Run the replicas unpinned: wherever the kernel puts them.
    #[arg(long, conflicts_with = "cpus")]
    pub no_pin: bool,
    /// Also write the results as one self-contained HTML page (charts, tables, logs),
    /// readable by you alone (mode 0600: it holds the command line and output tails).
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
    /// Where the replicas' output and report.json go (made if missing, mode 0700; never
    /// cleaned up); default: a new bench-<time> directory under
    /// ${XDG_STATE_HOME:-~/.local/state}/gpushare/bench, of which the 10 newest are kept.
    #[arg(long, value_name = "DIR")]
    pub logs: Option<PathBuf>,
    /// The program to bench and its arguments, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// An SLO as the user wrote it, checked: the text is what is sent.
#[derive(Debug, Clone, PartialEq)]
pub struct SloArg {
    /// As written (trimmed).
    pub written: String,
    /// As parsed.
    pub slo: Slo,
}

/// `--replicas`: one count, 1 to [`BENCH_MAX_REPLICAS`].
fn parse_replica_count(text: &str) -> Result<u32, String> {
    let n: u32 = text.trim().parse().map_err(|_| format!("`{text}` is not a replica count"))?;
    if n == 0 || n > BENCH_MAX_REPLICAS {
        return Err(format!("N = {n}: a run has 1 to {BENCH_MAX_REPLICAS} replicas"));
    }
    Ok(n)
}

/// `--cpus`: a Linux CPU list, numbers and ranges joined by commas (`0-3,8,10-11`), at
/// least one CPU, each below [`CPUS_MAX`](gpushare_base::cpus::CPUS_MAX) (the agent's
/// limit too), read by [`gpushare_base::cpus`]; the text as given (trimmed) is what is sent.
pub fn parse_cpu_list(text: &str) -> Result<String, String> {
    use gpushare_base::cpus::{CPUS_MAX, CpuListError};
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err("an empty CPU list (write it like 0-3,8,10-11)".into());
    }
    gpushare_base::cpus::parse_cpu_list(trimmed).map_err(|e| match e {
        CpuListError::Beyond { number } => {
            format!("CPU {number}: CPU numbers go up to {}", CPUS_MAX - 1)
        }
        other => other.to_string(),
    })?;
    Ok(trimmed.to_owned())
}

/// `--strategies`: one strategy name, of the names shells complete.
fn strategy_parser() -> impl clap::builder::TypedValueParser<Value = BenchStrategy> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(BenchStrategy::ALL.map(BenchStrategy::as_str))
        .try_map(|name| name.parse::<BenchStrategy>())
}

/// `--objective`.
fn parse_objective(text: &str) -> Result<Objective, String> {
    text.trim().parse()
}

/// `--slo`.
fn parse_slo(text: &str) -> Result<SloArg, String> {
    let slo = text.parse()?;
    Ok(SloArg { written: text.trim().to_owned(), slo })
}

/// `--histogram`: a Prometheus metric name (letters, digits, `_` and `:`, not starting
/// with a digit).
fn parse_histogram(text: &str) -> Result<String, String> {
    let name = text.trim();
    if !gpushare_proto::bench::is_metric_name(name) {
        return Err(format!("`{text}` is not a Prometheus metric name"));
    }
    Ok(name.to_owned())
}

/// `--duration`: a duration from 1 s to 1 h.
pub fn parse_window(text: &str) -> Result<f64, String> {
    within(text, parse_duration(text)?, BENCH_MAX_DURATION, "1h")
}

/// `--time-limit`: a duration from 1 s to 24 h.
pub fn parse_time_limit(text: &str) -> Result<f64, String> {
    within(text, parse_duration(text)?, BENCH_MAX_TIME_LIMIT, "24h")
}

/// `seconds` when from 1 s to `max`, else why not.
fn within(text: &str, seconds: f64, max: f64, max_words: &str) -> Result<f64, String> {
    if !(BENCH_MIN_SECONDS..=max).contains(&seconds) {
        return Err(format!("`{text}`: from 1s to {max_words}"));
    }
    Ok(seconds)
}

/// A duration in seconds: `500ms`, `1.5s`, `30s`, `2m`, `1h`, or a plain number of
/// seconds; above zero.
pub fn parse_duration(text: &str) -> Result<f64, String> {
    let bad = || format!("`{text}` is not a duration (500ms, 1.5s, 30s, 2m, 1h or seconds)");
    let trimmed = text.trim();
    let (number, factor) = [("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)]
        .into_iter()
        .find_map(|(unit, factor)| trimmed.strip_suffix(unit).map(|n| (n, factor)))
        .unwrap_or((trimmed, 1.0));
    let number = number.trim();
    // Digits and one point only: no signs, exponents, `inf` or `NaN`.
    let digits = number.chars().all(|c| c.is_ascii_digit() || c == '.');
    let value: f64 = match number.parse() {
        Ok(v) if digits => v,
        _ => return Err(bad()),
    };
    let seconds = value * factor;
    if seconds <= 0.0 || !seconds.is_finite() {
        return Err(format!("`{text}`: a duration must be above zero"));
    }
    Ok(seconds)
}

/// Verbs kept out of [`Cli`], so that no help text, man page or completion shows them.
#[derive(Debug, Subcommand)]
pub enum Hidden {
    /// Write the man pages or the shell completions of gpushare-ctl into a directory (for
    /// packaging).
    #[command(hide = true)]
    Generate(GenerateArgs),
}

/// Arguments of the hidden `generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// What to write.
    pub what: Generated,
    /// Directory to write into; created when missing.
    pub dir: PathBuf,
}

/// What `generate` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Generated {
    /// Man pages (section 1): gpushare-ctl.1 and one page per verb.
    Man,
    /// Completions for bash, zsh and fish.
    Completions,
}

/// A parsed command line: a verb for the agent, or a hidden verb.
#[derive(Debug)]
pub enum Invocation {
    /// A documented verb.
    Run(Cli),
    /// A hidden verb.
    Hidden(Hidden),
}

/// Parses the process's command line: [`Cli`], plus the [`Hidden`] verbs.
pub fn parse() -> Result<Invocation, clap::Error> {
    parse_from(std::env::args_os())
}

/// `bench python3 x.py`: the program comes after `--`, which clap's "unexpected argument"
/// alone does not say.
fn tip_for_a_bench_command(error: &mut clap::Error, args: &[OsString]) {
    use clap::builder::StyledStr;
    use clap::error::ErrorKind;
    let unexpected = match error.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) => arg.clone(),
        _ => return,
    };
    if error.kind() != ErrorKind::UnknownArgument
        || unexpected.starts_with('-')
        || verb_path(args) != "gpushare-ctl bench"
        || args.iter().any(|a| a == "--")
    {
        return;
    }
    let at = args.iter().position(|a| a.to_str() == Some(unexpected.as_str()));
    let command: Vec<String> =
        args[at.unwrap_or(args.len())..].iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let options: Vec<String> = args[1..at.unwrap_or(args.len())]
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let tip = format!(
        "put the program to bench after `--`: gpushare-ctl {} -- {}",
        options.join(" "),
        command.join(" ")
    );
    error.insert(ContextKind::Suggested, ContextValue::StyledStrs(vec![StyledStr::from(tip)]));
}

/// Parses a command line (the program name first): [`Cli`], plus the [`Hidden`] verbs.
pub fn parse_from<I, T>(args: I) -> Result<Invocation, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    // The hidden verbs are known only to a command line that names one exactly: otherwise
    // clap would list them in errors and suggest them for typos.
    let mut error = match Cli::try_parse_from(&args) {
        Ok(cli) => return Ok(Invocation::Run(cli)),
        Err(e) => e,
    };
    tip_for_a_bench_command(&mut error, &args);
    let names_hidden = matches!(
        error.get(ContextKind::InvalidSubcommand),
        Some(ContextValue::String(name)) if Hidden::has_subcommand(name)
    );
    if !names_hidden {
        return Err(error);
    }
    let visible = Cli::command();
    // Augmenting sets the about texts from `Hidden`'s doc comment: keep the product's.
    let mut cmd = Hidden::augment_subcommands(visible.clone())
        .about(visible.get_about().cloned().unwrap_or_default())
        .long_about(visible.get_long_about().cloned().unwrap_or_default());
    let matches = cmd.try_get_matches_from_mut(args)?;
    Hidden::from_arg_matches(&matches).map(Invocation::Hidden).map_err(|e| e.format(&mut cmd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("gpushare-ctl").chain(args.iter().copied()))
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn global_options_go_before_or_after_the_verb() {
        let cli = parse(&["status", "--json"]).unwrap();
        assert!(cli.json);
        assert!(matches!(cli.command, Command::Status));
        let cli = parse(&["--json", "--address", "session", "status"]).unwrap();
        assert!(cli.json);
        assert_eq!(cli.address.as_deref(), Some("session"));
    }

    fn source_of(cli: Cli) -> ProfileSource {
        match cli.command {
            Command::Apply(a) => a.source,
            Command::Plan(a) => a.source,
            Command::Assert(a) => a.source,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn apply_flags() {
        let cli = parse(&["apply", "half-balanced", "--dry-run", "--force"]).unwrap();
        match cli.command {
            Command::Apply(a) => {
                assert_eq!(a.source.profile.as_deref(), Some("half-balanced"));
                assert_eq!(a.source.file, None);
                assert!(a.dry_run && a.force);
            }
            other => panic!("{other:?}"),
        }
        let cli = parse(&["apply", "all-mps"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Apply(ApplyArgs { dry_run: false, force: false, .. })
        ));
    }

    #[test]
    fn apply_from_a_file() {
        let cli = parse(&["apply", "-f", "config.yaml", "-c", "all-balanced"]).unwrap();
        match cli.command {
            Command::Apply(a) => {
                assert_eq!(a.source.profile, None);
                assert_eq!(a.source.file.as_deref(), Some("config.yaml"));
                assert_eq!(a.source.config.as_deref(), Some("all-balanced"));
                assert!(!a.dry_run && !a.force);
            }
            other => panic!("{other:?}"),
        }
        let cli = parse(&["apply", "--file=-", "--config", "all-1g.10gb", "--dry-run", "--force"])
            .unwrap();
        match cli.command {
            Command::Apply(a) => {
                assert_eq!(a.source.file.as_deref(), Some("-"));
                assert_eq!(a.source.config.as_deref(), Some("all-1g.10gb"));
                assert!(a.dry_run && a.force);
            }
            other => panic!("{other:?}"),
        }
        // -c is optional with -f (a TOML profile needs none).
        let source = source_of(parse(&["apply", "-f", "lab.toml"]).unwrap());
        assert_eq!(source.file.as_deref(), Some("lab.toml"));
        assert_eq!(source.config, None);
    }

    #[test]
    fn plan_and_assert_take_a_name_or_a_file() {
        for verb in ["plan", "assert"] {
            let source = source_of(parse(&[verb, "half-balanced"]).unwrap());
            assert_eq!(source.profile.as_deref(), Some("half-balanced"));
            assert_eq!((source.file, source.config), (None, None));
            let source = source_of(parse(&[verb, "-c", "all-balanced", "-f", "c.yaml"]).unwrap());
            assert_eq!(source.profile, None);
            assert_eq!(source.file.as_deref(), Some("c.yaml"));
            assert_eq!(source.config.as_deref(), Some("all-balanced"));
        }
        let cli = parse(&["assert", "all-mps", "--json"]).unwrap();
        assert!(cli.json);
        assert!(matches!(cli.command, Command::Assert(_)));
    }

    #[test]
    fn profile_and_file_are_exclusive() {
        use clap::error::ErrorKind;
        for verb in ["apply", "plan", "assert"] {
            assert_eq!(
                parse(&[verb, "half-balanced", "-f", "c.yaml"]).unwrap_err().kind(),
                ErrorKind::ArgumentConflict,
                "{verb}"
            );
            assert_eq!(
                parse(&[verb]).unwrap_err().kind(),
                ErrorKind::MissingRequiredArgument,
                "{verb}"
            );
            // -c without -f is a usage error, with or without a profile name.
            let e = parse(&[verb, "half-balanced", "-c", "all-balanced"]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ArgumentConflict, "{verb}");
            assert_eq!(e.exit_code(), 2);
            assert!(e.to_string().contains("--config <NAME>"), "{e}");
            assert_eq!(
                parse(&[verb, "-c", "all-balanced"]).unwrap_err().kind(),
                ErrorKind::MissingRequiredArgument,
                "{verb}"
            );
            assert_eq!(parse(&[verb, "-f"]).unwrap_err().kind(), ErrorKind::InvalidValue, "{verb}");
        }
    }

    #[test]
    fn export_takes_a_format_only() {
        let cli = parse(&["export", "--json"]).unwrap();
        assert!(cli.json);
        assert!(matches!(cli.command, Command::Export(ExportArgs { format: ExportFormat::Toml })));
        let cli = parse(&["export", "--format", "mig-parted"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Export(ExportArgs { format: ExportFormat::MigParted })
        ));
        assert_eq!(
            parse(&["export", "x"]).unwrap_err().kind(),
            clap::error::ErrorKind::UnknownArgument
        );
        assert_eq!(
            parse(&["export", "--format", "yaml"]).unwrap_err().kind(),
            clap::error::ErrorKind::InvalidValue
        );
    }

    #[test]
    fn help_texts() {
        let cmd = Cli::command();
        let about = |name: &str| {
            cmd.find_subcommand(name)
                .and_then(|c| c.get_about())
                .map(|a| a.to_string())
                .unwrap_or_default()
        };
        assert_eq!(
            about("apply"),
            "Apply a sharing profile to the GPUs (a journaled job, rolled back on failure)"
        );
        let mut assert_cmd = cmd.find_subcommand("assert").unwrap().clone();
        let help = assert_cmd.render_help().to_string();
        assert!(help.contains("Exit status:"), "{help}");
        assert!(help.contains("1  the profile is not applied"), "{help}");
    }

    #[test]
    fn profiles_defaults_to_list() {
        let cli = parse(&["profiles"]).unwrap();
        assert!(matches!(cli.command, Command::Profiles(ProfilesArgs { command: None })));
        let cli = parse(&["profiles", "list"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Profiles(ProfilesArgs {
                command: Some(ProfilesCommand::List { names: false })
            })
        ));
        let cli = parse(&["profiles", "show", "all-mps"]).unwrap();
        match cli.command {
            Command::Profiles(ProfilesArgs { command: Some(ProfilesCommand::Show { name }) }) => {
                assert_eq!(name, "all-mps")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn usage_errors() {
        use clap::error::ErrorKind;
        assert_eq!(parse(&["apply"]).unwrap_err().kind(), ErrorKind::MissingRequiredArgument);
        assert_eq!(parse(&["frobnicate"]).unwrap_err().kind(), ErrorKind::InvalidSubcommand);
        assert_eq!(parse(&["status", "--bogus"]).unwrap_err().kind(), ErrorKind::UnknownArgument);
        assert_eq!(parse(&["validate"]).unwrap_err().kind(), ErrorKind::MissingRequiredArgument);
        assert_eq!(
            parse(&["profiles", "show"]).unwrap_err().kind(),
            ErrorKind::MissingRequiredArgument
        );
        let e = parse(&[]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }

    fn clients_args(args: &[&str]) -> ClientsArgs {
        match parse(args).unwrap().command {
            Command::Clients(c) => c,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn clients_takes_watch_query_and_format() {
        use clap::error::ErrorKind;
        let c = clients_args(&["clients"]);
        assert!(!c.watch && c.interval.is_none() && c.query.is_empty() && c.format.is_none());
        let c = clients_args(&["clients", "--watch", "--interval", "0.2"]);
        assert!(c.watch);
        assert_eq!(c.interval, Some(0.2));
        assert_eq!(clients_args(&["clients", "--watch", "--interval=60"]).interval, Some(60.0));
        assert!(parse(&["--json", "clients", "--watch"]).unwrap().json);
        let c = clients_args(&["clients", "--query", "pid, USER,memory_bytes", "--format", "csv"]);
        assert_eq!(c.query, [ClientField::Pid, ClientField::User, ClientField::MemoryBytes]);
        assert_eq!(c.format, Some(CsvFormat { header: true }));
        let c = clients_args(&["clients", "--query=command", "--format=csv,noheader"]);
        assert_eq!(
            (c.query.as_slice(), c.format),
            (&[ClientField::Command][..], Some(CsvFormat { header: false }))
        );
        assert_eq!(clients_args(&["clients", "--query", "pid"]).format, None);
        assert_eq!(parse_csv_format("noheader,csv,nounits"), Ok(CsvFormat { header: false }));
        for name in ClientField::ALL.map(ClientField::name) {
            assert_eq!(parse_field(name).map(ClientField::name), Ok(name));
        }
        let e = parse(&["clients", "--query", "pid,gpu_util"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueValidation);
        assert!(
            e.to_string().contains("unknown field `gpu_util`; the fields are pid, user, uid, unit, container, gpu, gpu_uuid, instance, via, mps_server, memory_bytes, share_threads, share_memory_bytes, command, unhealthy"),
            "{e}"
        );
        for bad in [
            &["clients", "--interval", "2"][..],
            &["clients", "--watch", "--interval", "0.1"],
            &["clients", "--watch", "--interval", "61"],
            &["clients", "--watch", "--interval", "-1"],
            &["clients", "--watch", "--interval", "NaN"],
            &["clients", "--format", "csv"],
            &["clients", "--query", "pid", "--format", "json"],
            &["clients", "--query", "pid", "--format", "noheader"],
            &["clients", "--query", "pid", "--watch"],
            &["clients", "--query", ""],
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn top_takes_an_interval() {
        let interval = |args: &[&str]| match parse(args).unwrap().command {
            Command::Top(t) => t.interval,
            other => panic!("{other:?}"),
        };
        assert_eq!(interval(&["top"]), 1.0);
        assert_eq!(interval(&["top", "--interval", "2.5"]), 2.5);
        assert!(parse(&["top", "--interval", "0"]).is_err());
        assert!(parse(&["top", "extra"]).is_err());
    }

    #[test]
    fn top_and_clients_say_what_json_prints_when_watching() {
        // Their own `--json` stands for the global one, before or after the verb.
        for args in [
            &["top", "--json"][..],
            &["--json", "top"],
            &["clients", "--watch", "--json"],
            &["--json", "clients"],
            &["clients", "--json", "--address", "session"],
        ] {
            assert!(parse(args).unwrap().json, "{args:?}");
        }
        assert!(!parse(&["top"]).unwrap().json);
        assert!(!parse(&["clients", "--watch"]).unwrap().json);
        assert_eq!(parse(&["top", "--json", "--json"]).unwrap_err().exit_code(), 2);

        let mut cmd = Cli::command();
        cmd.build();
        let help = |name: &str| {
            let mut sub = cmd.find_subcommand(name).unwrap().clone();
            sub.render_long_help().to_string()
        };
        let top = help("top");
        assert!(top.contains("Print one JSON object per interval"), "{top}");
        assert!(top.contains("(NDJSON)") && !top.contains("exactly one JSON"), "{top}");
        assert!(
            top.contains("\"telemetry\": …, \"time\": \"2026-11-27 11:40:05 UTC\"}, the Status,"),
            "{top}"
        );
        assert!(!top.contains("not shown"), "{top}");
        let clients = help("clients");
        assert!(
            clients.contains(
                "exactly one JSON object on stdout (errors too); with --watch, one per interval"
            ),
            "{clients}"
        );
        // Other verbs keep the global text.
        assert!(help("status").contains(
            "Print exactly one JSON object on stdout (errors too); no prompts, no progress"
        ));
    }

    #[test]
    fn mps_defaults_to_status() {
        let cli = parse(&["mps"]).unwrap();
        assert!(matches!(cli.command, Command::Mps(MpsArgs { command: None })));
        let cli = parse(&["mps", "status", "--json"]).unwrap();
        assert!(cli.json);
        assert!(matches!(cli.command, Command::Mps(MpsArgs { command: Some(MpsCommand::Status) })));
    }

    fn limit_of(args: &[&str]) -> MpsLimitArgs {
        match parse(args).unwrap().command {
            Command::Mps(MpsArgs { command: Some(MpsCommand::Limit(l)) }) => l,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn mps_limit_takes_threads_or_memory_or_both() {
        let l = limit_of(&["mps", "limit", "--pid", "4242", "--threads", "25", "--memory", "2GiB"]);
        assert_eq!((l.pid, l.threads, l.memory), (4242, Some(25), Some(2 << 30)));
        let l = limit_of(&["mps", "limit", "--pid=7", "--threads=100"]);
        assert_eq!((l.pid, l.threads, l.memory), (7, Some(100), None));
        let l = limit_of(&["mps", "limit", "--memory", "512M", "--pid", "7"]);
        assert_eq!((l.threads, l.memory), (None, Some(512 << 20)));
        let l = limit_of(&["mps", "limit", "--pid", "7", "--memory", "1048576"]);
        assert_eq!(l.memory, Some(1 << 20));
    }

    #[test]
    fn mps_limit_usage_errors() {
        use clap::error::ErrorKind;
        // Neither threads nor memory.
        let e = parse(&["mps", "limit", "--pid", "4242"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--threads <PCT>"), "{e}");
        // No pid.
        let e = parse(&["mps", "limit", "--threads", "25"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        // Out of range, or not a size.
        for bad in [
            &["mps", "limit", "--pid", "1", "--threads", "0"][..],
            &["mps", "limit", "--pid", "1", "--threads", "101"],
            &["mps", "limit", "--pid", "1", "--threads", "25%"],
            &["mps", "limit", "--pid", "0", "--threads", "25"],
            &["mps", "limit", "--pid", "x", "--threads", "25"],
            &["mps", "limit", "--pid", "1", "--memory", "2 parsecs"],
            &["mps", "limit", "--pid", "1", "--memory", "0G"],
        ] {
            assert_eq!(parse(bad).unwrap_err().kind(), ErrorKind::ValueValidation, "{bad:?}");
        }
    }

    #[test]
    fn env_needs_a_target() {
        use clap::error::ErrorKind;
        for target in ["0", "GPU-00000000-0000-0000-0000-000000000000", "MIG-1111"] {
            match parse(&["env", target]).unwrap().command {
                Command::Env(EnvArgs { target: t }) => assert_eq!(t, target),
                other => panic!("{other:?}"),
            }
        }
        let cli = parse(&["--json", "env", "1"]).unwrap();
        assert!(cli.json);
        let e = parse(&["env"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        assert!(e.to_string().contains("<GPU|MIG-UUID>"), "{e}");
        assert_eq!(parse(&["env", "0", "1"]).unwrap_err().kind(), ErrorKind::UnknownArgument);
    }

    #[test]
    fn mig_profiles_takes_an_optional_gpu() {
        use clap::error::ErrorKind;
        let gpu_of = |args: &[&str]| match parse(args).unwrap().command {
            Command::Mig(MigArgs { command: MigCommand::Profiles(p) }) => p.gpu,
            other => panic!("{other:?}"),
        };
        assert_eq!(gpu_of(&["mig", "profiles"]), None);
        assert_eq!(gpu_of(&["mig", "profiles", "0"]).as_deref(), Some("0"));
        assert_eq!(gpu_of(&["mig", "profiles", "GPU-1", "--json"]).as_deref(), Some("GPU-1"));
        assert!(parse(&["--json", "mig", "profiles"]).unwrap().json);
        let e = parse(&["mig"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand);
        assert_eq!(e.exit_code(), 2);
        assert_eq!(parse(&["mig", "0"]).unwrap_err().kind(), ErrorKind::InvalidSubcommand);
        let e = parse(&["mig", "profiles", "0", "1"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownArgument);
    }

    fn invocation(args: &[&str]) -> Result<Invocation, clap::Error> {
        parse_from(std::iter::once("gpushare-ctl").chain(args.iter().copied()))
    }

    #[test]
    fn generate_is_hidden_but_parses() {
        match invocation(&["generate", "man", "out/man"]).unwrap() {
            Invocation::Hidden(Hidden::Generate(g)) => {
                assert_eq!(g.what, Generated::Man);
                assert_eq!(g.dir, PathBuf::from("out/man"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            invocation(&["generate", "completions", "d"]).unwrap(),
            Invocation::Hidden(Hidden::Generate(GenerateArgs { what: Generated::Completions, .. }))
        ));
        assert!(matches!(
            invocation(&["status", "--json"]).unwrap(),
            Invocation::Run(Cli { json: true, command: Command::Status, .. })
        ));
        use clap::error::ErrorKind;
        let kind = |args: &[&str]| invocation(args).unwrap_err().kind();
        assert_eq!(kind(&["generate", "pdf", "d"]), ErrorKind::InvalidValue);
        assert_eq!(kind(&["generate", "man"]), ErrorKind::MissingRequiredArgument);
        assert_eq!(kind(&["frobnicate"]), ErrorKind::InvalidSubcommand);
        assert_eq!(kind(&["apply"]), ErrorKind::MissingRequiredArgument);
        assert_eq!(invocation(&[]).unwrap_err().exit_code(), 2);
        // Neither the help nor the documented command knows it.
        let help = invocation(&["--help"]).unwrap_err();
        assert_eq!(help.kind(), ErrorKind::DisplayHelp);
        assert!(!help.to_string().contains("generate"), "{help}");
        assert!(help.to_string().contains("apply"), "{help}");
        assert!(Cli::command().find_subcommand("generate").is_none());
        Hidden::augment_subcommands(Cli::command()).debug_assert();
    }

    #[test]
    fn probe_workload_names_are_the_protocols() {
        for w in ProbeWorkload::value_variants() {
            let name = w.to_possible_value().expect("every workload is shown");
            assert_eq!(name.get_name(), w.workload().as_str());
        }
        assert_eq!(ProbeWorkload::value_variants().len(), Workload::ALL.len());
    }

    #[test]
    fn probe_defaults_send_nothing() {
        match parse(&["probe"]).unwrap().command {
            Command::Probe(p) => {
                assert_eq!(p.target, None);
                assert!(p.clients.is_empty());
                assert!(p.workloads.is_empty());
                assert_eq!(p.seconds, None);
                assert!(!p.compare);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn probe_takes_lists() {
        let cli = parse(&[
            "probe",
            "--target",
            "MIG-1111",
            "--clients",
            "1,2,4,7",
            "--workload",
            "launch,memory",
            "--seconds",
            "0.5",
            "--json",
        ])
        .unwrap();
        assert!(cli.json);
        match cli.command {
            Command::Probe(p) => {
                assert_eq!(p.target.as_deref(), Some("MIG-1111"));
                assert_eq!(p.clients, [1, 2, 4, 7]);
                assert_eq!(p.workloads, [ProbeWorkload::Launch, ProbeWorkload::Memory]);
                assert_eq!(
                    p.workloads.iter().map(|w| w.workload().as_str()).collect::<Vec<_>>(),
                    ["launch", "memory"]
                );
                assert_eq!(p.seconds, Some(0.5));
            }
            other => panic!("{other:?}"),
        }
        match parse(&["probe", "--clients=48", "--workload=compute", "--seconds=60"])
            .unwrap()
            .command
        {
            Command::Probe(p) => {
                assert_eq!(p.clients, [48]);
                assert_eq!(p.workloads, [ProbeWorkload::Compute]);
                assert_eq!(p.seconds, Some(60.0));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn probe_takes_compare() {
        match parse(&["probe", "--compare", "--clients", "1,4,7"]).unwrap().command {
            Command::Probe(p) => {
                assert!(p.compare);
                assert_eq!(p.clients, [1, 4, 7]);
            }
            other => panic!("{other:?}"),
        }
        let cmd = Cli::command();
        let probe = cmd.find_subcommand("probe").unwrap();
        let compare = probe.get_arguments().find(|a| a.get_id() == "compare").unwrap();
        assert_eq!(
            compare.get_help().unwrap().to_string(),
            "Compare sharing strategies: for each workload, a bench of the built-in workload under time-slicing, MPS and MPS with 100/N % threads (the sharing is restored afterwards; refused while another process computes on the GPU)"
        );
        assert!(parse(&["probe", "--compare=yes"]).is_err());
    }

    #[test]
    fn probe_usage_errors() {
        use clap::error::ErrorKind;
        for bad in [
            &["probe", "--clients", "0"][..],
            &["probe", "--clients", "49"],
            &["probe", "--clients", "1,2,x"],
            &["probe", "--clients", "1,,2"],
            &["probe", "--clients", "-1"],
            &["probe", "--seconds", "0.4"],
            &["probe", "--seconds", "61"],
            &["probe", "--seconds", "soon"],
            &["probe", "--seconds", "NaN"],
        ] {
            let e = parse(bad).unwrap_err();
            assert!(
                matches!(e.kind(), ErrorKind::ValueValidation | ErrorKind::UnknownArgument),
                "{bad:?}: {e}"
            );
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
        for bad in [&["probe", "--workload", "flops"][..], &["probe", "--workload", "launch,io"]] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidValue, "{bad:?}");
            assert!(e.to_string().contains("launch, compute, memory"), "{e}");
        }
        assert_eq!(parse(&["probe", "0"]).unwrap_err().kind(), ErrorKind::UnknownArgument);
        let cmd = Cli::command();
        let about = cmd.find_subcommand("probe").and_then(|c| c.get_about()).unwrap().to_string();
        assert_eq!(
            about,
            "Measure what sharing costs: N CUDA client processes against a solo baseline, under the current sharing"
        );
    }

    /// The command lines of every verb and sub-verb users see, with `extra` appended.
    fn every_visible_command(extra: &[&str]) -> Vec<Vec<String>> {
        fn walk(cmd: &clap::Command, path: Vec<String>, all: &mut Vec<Vec<String>>) {
            all.push(path.clone());
            // clap's own `help` takes no --help.
            for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help")
            {
                let mut next = path.clone();
                next.push(sub.get_name().to_owned());
                walk(sub, next, all);
            }
        }
        let mut all = Vec::new();
        let mut cmd = Cli::command();
        cmd.build();
        walk(&cmd, Vec::new(), &mut all);
        for path in &mut all {
            path.extend(extra.iter().map(|s| s.to_string()));
        }
        all
    }

    #[test]
    fn help_texts_are_for_users() {
        use clap::error::ErrorKind;
        // `-h` shows the package's description, `--help` the doc comment of [`Cli`].
        for (flag, about) in [
            ("-h", "Command-line client of gpushare-agent"),
            (
                "--help",
                "Drives gpushare-agent: applies GPU sharing profiles (MIG, MPS, time-slicing), or NVIDIA mig-parted configs as they are, and shows the GPUs' state.",
            ),
        ] {
            let top = invocation(&[flag]).unwrap_err();
            assert_eq!(top.kind(), ErrorKind::DisplayHelp);
            let top = top.to_string();
            assert_eq!(top.lines().next(), Some(about), "{top}");
            for args in every_visible_command(&[flag]) {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let help = invocation(&args).unwrap_err();
                assert_eq!(help.kind(), ErrorKind::DisplayHelp, "{args:?}");
                let help = help.to_string();
                // Doc comments written for developers: intra-doc links, type names.
                for leak in ["[`", "Verbs kept", "Arguments of", "Sub-verbs of", "What to do"] {
                    assert!(!help.contains(leak), "{args:?} shows {leak:?}:\n{help}");
                }
                assert!(!help.contains("generate"), "{args:?}:\n{help}");
            }
        }
    }

    #[test]
    fn usage_errors_never_name_the_hidden_verb() {
        for args in [
            &[][..],
            &["--json"],
            &["generat"],
            &["gen"],
            &["--json", "generat"],
            &["genrate", "man", "d"],
            &["help", "generat"],
            &["frobnicate"],
        ] {
            let e = invocation(args).unwrap_err();
            let text = e.render().to_string();
            assert!(!text.contains("generate"), "{args:?}:\n{text}");
        }
    }

    #[test]
    fn json_request_is_seen_in_raw_args() {
        assert!(args_request_json(["gpushare-ctl", "apply", "--json"]));
        assert!(!args_request_json(["gpushare-ctl", "apply", "--", "--json"]));
        assert!(!args_request_json(["--json"]));
    }
}
