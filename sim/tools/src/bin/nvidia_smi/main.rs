//! `gpushare-sim-nvidia-smi`: the simulated `nvidia-smi`, part of gpushare's simulator
//! (`gpushare-agent --simulate`, the tests, hosts without a GPU; the package installs it as
//! `/usr/lib/gpushare/sim/nvidia-smi`). It reads and changes the same simulated node as the
//! simulated NVML library (`gpushare_sim_nvml::node`, the JSON file named by
//! `GPUSHARE_SIM_STATE`, which the agent sets for itself and the tools it runs), under the
//! node's lock, through the driver's own rules (`gpushare_sim_nvml::rules`), and answers as
//! nvidia-smi of driver 580 does, and records every invocation.
//!
//! ```text
//! gpushare-sim-nvidia-smi [-i IDS]                 (the summary table)
//! gpushare-sim-nvidia-smi -L | --list-gpus
//! gpushare-sim-nvidia-smi -q | --query [-i IDS] [-d TYPES]
//! gpushare-sim-nvidia-smi --query-gpu=FIELDS [--format=csv[,noheader][,nounits]] [-i IDS]
//! gpushare-sim-nvidia-smi --query-compute-apps=FIELDS [--format=csv[,noheader][,nounits]] [-i IDS]
//! gpushare-sim-nvidia-smi -pm | --persistence-mode 0|1 [-i IDS]
//! gpushare-sim-nvidia-smi -mig | --multi-instance-gpu 0|1 [-i IDS]
//! gpushare-sim-nvidia-smi -r | --gpu-reset [-i IDS]
//! gpushare-sim-nvidia-smi mig [-i IDS] -lgip | -lgipp | -lgi | -lci | -lcip   [-gi IDS] [-ci IDS]
//! gpushare-sim-nvidia-smi mig [-i IDS] -cgi LIST [-C] | -cci [LIST] | -dgi | -dci   [-gi IDS] [-ci IDS]
//! gpushare-sim-nvidia-smi compute-policy [-i IDS] -l | --set-timeslice N
//! gpushare-sim-nvidia-smi [mig | compute-policy] -h | --help
//! ```
//!
//! IDS: comma-separated GPU indexes, UUIDs or PCI bus IDs in any form the real tool takes
//! (`00000000:1B:00.0`, `0000:1b:00.0` as sysfs and mig-parted write it, `1B:00.0`); an ID
//! that names no GPU answers "No devices were found", exit 6. Without `-i` a command
//! applies to every GPU (`mig` changes: every MIG-enabled GPU). Options take their value as
//! the next argument, long ones also after `=`.
//!
//! # Where each answer comes from
//!
//! Recorded on a real H100 80GB HBM3, driver 580.159.04
//! (tests/device/results/nvidia-tools-2026-11-27/nvidia-smi, each compared in
//! sim/tools/tests/nvidia_smi_recorded.rs): `-L`; `--query-gpu` (header, units, `[N/A]`,
//! `noheader`, `nounits`, no `--format` answering as csv, an unknown field: `Field "x" is
//! not a valid field to query.`, exit 2); `-q`'s layout and the lines it prints; `-i` in
//! every form and its misses; `-L -i` ("Option -i is not valid for this command", exit
//! 2); an unknown option (exit 255) and a missing value (exit 0, as recorded);
//! `mig -lgip`, `mig -lgipp` (free = total while MIG is off), `mig -lgi/-lci/-lcip` with
//! MIG off ("No MIG-enabled devices found.", exit 0), `mig` alone and `mig -cgi` without
//! a value; `compute-policy -l`.
//!
//! From published outputs of the real tool (NVIDIA's MIG user guide, and operators'
//! transcripts of drivers 510 to 580), not recorded here: the `-lgi`, `-lci` and `-lcip`
//! tables with MIG on (their 580 widths), their order (by GPU, profile in `-lgip` order,
//! instance id), "No GPU instances found: Not Found" and "No compute instances found: Not
//! Found"; the `-cgi`/`-C`/`-cci` "Successfully created …" lines, `-dgi`/`-dci`'s
//! "Successfully destroyed …", and their failures ("Unable to create a GPU instance on
//! GPU  0 using profile 9: Insufficient Resources" then "Failed to create GPU instances:
//! …"; "Unable to destroy GPU instance ID  1 from GPU  0: In use by another client");
//! `-mig`'s "Enabled MIG Mode for GPU …", the pending warnings, the warning when
//! persistence mode is off, "Unable to disable MIG Mode for GPU …: In use by another
//! client" and "Terminating early due to previous errors."; `-pm`'s "Enabled Legacy
//! persistence mode for GPU ….", "Disabled persistence mode for GPU ….", "Persistence mode
//! is already …"; `-r`'s answers; `-q`'s "MIG Devices" and "Processes" entries (their
//! fields and order as published `nvidia-smi -q -x` output shows them; the text labels
//! are not verified). Where the driver places a `-cgi` instance follows the user guide's
//! examples (`gpushare_sim_nvml::rules::driver_placement`); the default compute instance
//! (`-C`, the `*` of `-lcip`) is the one with all of the GPU instance's slices and SMs (an H100 1g.20gb's is profile 7, as
//! published).
//!
//! Ours, not seen from the real tool: the exit statuses of `mig` failures (the manual's
//! mapping of NVML codes: 2 invalid argument, 3 not supported, 6 not found, 255 in use or
//! out of resources) and of "No GPU instances found" (6); "Unable to create a compute
//! instance …" / "Failed to destroy compute instances: …" (modelled on the GPU-instance
//! lines); "No MIG-supported devices found."; an invalid `-pm`/`-mig`/`--format`/`-d`
//! value ("Invalid combination of input arguments…", exit 2); `-h` and `mig -h` past the
//! recorded first lines of the latter.
//!
//! Without a command (and with only `-i`) the summary table (`summary`): its header, GPU
//! box and Processes box as the real tool printed them on an H200 with driver 580.159.04
//! (tests/device/results/clients-h200-2026-11-27/smi.txt, compared in
//! sim/tools/tests/nvidia_smi_summary.rs); the MIG devices box, the ids of a process in a
//! MIG device and the pending MIG mode from published transcripts (drivers 515 to 590; see
//! `summary`'s documentation for which and for what the table shows that is not modelled).
//!
//! # What is modelled
//!
//! - `-q` prints the header (Timestamp, Driver Version, CUDA Version, Attached GPUs) and
//!   per GPU: Product Name/Brand/Architecture, Persistence Mode, MIG Mode, MIG Devices (MIG
//!   on), Serial Number, GPU UUID, Minor Number, Board ID, PCI (Bus, Device, Domain, Device
//!   Id, Bus Id, Sub System Id), GPU Recovery Action, FB Memory Usage, Compute Mode, ECC
//!   Mode, ECC Errors, Retired Pages (N/A, as on the H100), Remapped Rows, Processes: the
//!   health lines (issue 42) follow the GPU's faults (`gpushare-sim-fault`), laid out as
//!   the real H100's. The rest of the real log (display, clocks, power, BAR1,
//!   temperatures, utilization, …) is left out, as are a process's name and a MIG
//!   device's ECC and BAR1 lines. `-d` takes the real tool's types; MEMORY, COMPUTE, ECC,
//!   PAGE_RETIREMENT, ROW_REMAPPER and PIDS print theirs. A GPU off the bus prints
//!   "Unable to determine the device handle for GPU…: GPU is lost.  Reboot the system to
//!   recover this GPU" in place of its entry (operators' transcripts' wording, not
//!   recorded) and the command exits 15; the summary table prints that line alone (exit 15).
//!   `-L`, `--query-gpu` and the `mig` listings still show a lost GPU (not modelled).
//! - Serial numbers, board ids, PCI subsystem ids, the 480 MiB the driver reserves and the
//!   memory each compute process uses (its own, 512 MiB unless the knob or the simulated
//!   MPS control daemon says otherwise) are derived as the simulated driver derives them
//!   for NVML (`device`); `vbios_version` and `gom.*` answer `[N/A]`. A process's type is
//!   `C`, `M+C` for an MPS client, as driver 580 showed on an H200
//!   (tests/device/results/clients-h200-2026-11-27/smi.txt).
//! - `--query-compute-apps` lists every compute process of the chosen GPUs (MPS clients
//!   included) in NVML's order: `pid`, `process_name` (`name`: the process's argv[0],
//!   else its `comm`, `[Not Found]` when unreadable; the summary's Process name too),
//!   `used_memory` (header `used_gpu_memory [MiB]`, as recorded), `gpu_uuid`, `gpu_name`,
//!   `gpu_bus_id`, `gpu_serial`, `timestamp`.
//! - `-pm`, `-mig` and `mig` changes use `rules::set_persistence_mode`, `set_mig_mode`
//!   (Ampere keeps a change pending while persistence mode or processes hold the GPU),
//!   `create_gpu_instance`, `create_compute_instance`, `destroy_*`: what they refuse is
//!   refused here with their NVML code. `-lgip`'s free counts are
//!   `rules::remaining_capacity`; `-lcip`'s are counted by creating on a copy of the node.
//! - `-r` is [`Node::reset_gpu_among`] of the chosen GPUs together: a pending MIG mode
//!   takes effect, instances are gone, compute mode and time-slice return to default, a
//!   pending row remap takes effect, the volatile ECC counts and the recovery action are
//!   cleared. A GPU off the bus is not reset: "Unable to reset GPU …: GPU is lost", exit 15.
//!   Refused while compute processes hold the GPU, while persistence mode is on (the real
//!   tool then finds nvidia-persistenced holding it) or while `nvidia_drm` is loaded with
//!   modesetting: "The following GPUs could not be reset: … In use by another client",
//!   NVIDIA's explanatory paragraph, exit 255; on a vGPU guest or a VM without
//!   function-level reset: "Resetting GPU … is not supported.", exit 3; an Ampere GPU on
//!   an NVSwitch fabric without Fabric Manager only with all its NVLink peers (see
//!   `modes::gpu_reset`). Nothing is reset when any chosen GPU is refused.
//! - `compute-policy --set-timeslice` / `-l` store and read [`Gpu::timeslice`] (the table
//!   as recorded; the help as the real one prints it).
//! - `GPUSHARE_SIM_FAIL` (`gpushare_sim_nvml::faults`) may name the tool actions
//!   `gpu-reset:<n>` and `set-timeslice:<n>`: the n-th invocation of that action fails as
//!   the real tool does for a cause outside the caller (a reset: the in-use answer, exit
//!   255; a time-slice: "Unable to set timeslice for GPU …: Insufficient Permissions",
//!   exit 4 — modelled on the real tool's other setters, no real answer was recorded), or
//!   with the NVML code the entry names (`gpu-reset:1=NVML_ERROR_GPU_IS_LOST`), and one
//!   stderr line says it was injected. Calls are counted in the node
//!   ([`Node::count_tool_call`], in the same update), so every nvidia-smi of one agent
//!   session counts together; the driver clears the counts when a session starts.
//! - Without `GPUSHARE_SIM_STATE`, or without its file, the answer is a host's without a
//!   driver: "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.
//!   …", exit 9, and one stderr line naming `GPUSHARE_SIM_STATE`. A node file that cannot
//!   be read or written: exit 255 and the reason on stderr.
//!
//! Record (`GPUSHARE_SIM_RECORD`): one line per invocation, `nvidia-smi` and its arguments
//! joined by spaces, e.g. `nvidia-smi compute-policy -i GPU-xxx --set-timeslice 2`.

#[path = "../../common.rs"]
mod common;
mod device;
mod ids;
mod mig;
mod modes;
mod policy;
mod q;
mod query;
mod summary;
#[cfg(test)]
mod tests;

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use gpushare_sim_nvml::abi::types::{nvmlReturn_t, ret};
use gpushare_sim_nvml::faults::{self, Failure};
use gpushare_sim_nvml::node::{Gpu, Node, STATE_ENV};
use gpushare_sim_nvml::rules;
use gpushare_sim_nvml::state_file::NodeFile;

/// The tool actions `GPUSHARE_SIM_FAIL` may name ([`faults::TOOL_ACTIONS`]).
const GPU_RESET: &str = "gpu-reset";
const SET_TIMESLICE: &str = "set-timeslice";

const HELP_HINT: &str = "Please run 'nvidia-smi -h' for help.";
const INVALID_COMBINATION: &str =
    "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.";
const NO_DEVICES: &str = "No devices were found";
/// What nvidia-smi answers on a host whose driver is not loaded.
const NO_DRIVER: &str = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.";

/// Exit statuses from nvidia-smi's manual.
const EXIT_INVALID_ARGUMENT: u8 = 2;
const EXIT_NOT_FOUND: u8 = 6;
const EXIT_DRIVER_NOT_LOADED: u8 = 9;
const EXIT_OTHER: u8 = 255;

const HELP: &str = "\
simulated nvidia-smi (gpushare's simulator): the options an operator of MIG and gpushare uses.

    -L, --list-gpus              List the GPUs (and MIG devices) with their UUIDs.
    -q, --query                  The query log (the sections gpushare models).
    -d, --display=TYPES          With -q: MEMORY, COMPUTE, PIDS.
    --query-gpu=FIELDS           CSV of index, name, uuid, serial, pci.bus_id, pci.device_id,
                                 pci.sub_device_id, driver_version, persistence_mode,
                                 compute_mode, mig.mode.current, mig.mode.pending,
                                 memory.total/reserved/used/free, count, ...
    --query-compute-apps=FIELDS  CSV of the compute processes (MPS clients too): pid,
                                 process_name, used_memory (used_gpu_memory), gpu_uuid,
                                 gpu_name, gpu_bus_id, gpu_serial, timestamp.
    --format=csv[,noheader][,nounits]
    -i, --id=ID                  Target GPU(s): index, UUID or PCI bus ID, comma separated.
    -pm, --persistence-mode=0|1  Set persistence mode.
    -mig, --multi-instance-gpu=0|1
                                 Enable or disable MIG mode.
    -r, --gpu-reset              Reset the GPU(s).
    -h, --help                   Print this help.
    mig                          MIG instances (mig -h).
    compute-policy               Control and list compute policies (compute-policy -h).

Node: $GPUSHARE_SIM_STATE; injected failures: $GPUSHARE_SIM_FAIL (gpu-reset:N,
set-timeslice:N); record: $GPUSHARE_SIM_RECORD.
";

/// What the environment gives one invocation.
struct Env {
    /// `GPUSHARE_SIM_STATE`: the node's file, when set.
    state: Option<PathBuf>,
    /// `GPUSHARE_SIM_RECORD`: the record file, when set.
    record: Option<PathBuf>,
    /// `GPUSHARE_SIM_FAIL`, parsed (or why it does not parse).
    failures: Result<Vec<Failure>, String>,
}

impl Env {
    fn from_env() -> Env {
        Env {
            state: NodeFile::from_env().ok().map(|f| f.path().to_path_buf()),
            record: common::record_path_from_env(),
            failures: faults::from_env(),
        }
    }
}

/// Where an invocation writes: stdout (the real tool's answers, errors included) and
/// stderr (the simulator's own notes).
struct Out<'a> {
    out: &'a mut dyn Write,
    err: &'a mut dyn Write,
}

/// The node's file, or the exit status of a host without a driver (after saying so).
fn node_file(env: &Env, out: &mut Out<'_>) -> Result<NodeFile, u8> {
    let no_driver = |out: &mut Out<'_>, why: String| {
        let _ = writeln!(out.out, "{NO_DRIVER}");
        let _ = writeln!(out.err, "gpushare-sim-nvidia-smi: {why}");
        Err(EXIT_DRIVER_NOT_LOADED)
    };
    let Some(path) = env.state.as_deref() else {
        return no_driver(
            out,
            format!(
                "{STATE_ENV} is not set: it names the simulated node's file (gpushare-agent --simulate sets it)"
            ),
        );
    };
    let file = NodeFile::new(path);
    if !path.exists() {
        return no_driver(
            out,
            format!(
                "no simulated node at {STATE_ENV}={} (gpushare-agent --simulate writes it)",
                path.display()
            ),
        );
    }
    Ok(file)
}

/// The injected failures, or `EXIT_OTHER` when `GPUSHARE_SIM_FAIL` does not parse.
fn failures<'e>(env: &'e Env, out: &mut Out<'_>) -> Result<&'e [Failure], u8> {
    env.failures.as_deref().map_err(|e| {
        let _ = writeln!(out.err, "gpushare-sim-nvidia-smi: {e}");
        EXIT_OTHER
    })
}

/// Reads the node for a command that changes nothing.
fn read_node(file: &NodeFile, out: &mut Out<'_>) -> Result<Node, u8> {
    file.read().map_err(|e| {
        let _ = writeln!(out.err, "gpushare-sim-nvidia-smi: {e}");
        EXIT_OTHER
    })
}

/// Runs `f` on the node under its lock, writing the node back when `f` changed it; the
/// exit status is `f`'s, or `EXIT_OTHER` when the node cannot be read or written.
fn update_node(
    file: &NodeFile,
    out: &mut Out<'_>,
    f: impl FnOnce(&mut Node, &mut Out<'_>) -> u8,
) -> u8 {
    // Answers are buffered so that a failed write of the node is not preceded by them.
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let updated = file.update(|node| f(node, &mut Out { out: &mut stdout, err: &mut stderr }));
    match updated {
        Ok(status) => {
            let _ = out.out.write_all(&stdout);
            let _ = out.err.write_all(&stderr);
            status
        }
        Err(e) => {
            let _ = writeln!(out.err, "gpushare-sim-nvidia-smi: {e}");
            EXIT_OTHER
        }
    }
}

/// nvidia-smi's exit status for an NVML return code (its manual's RETURN VALUE).
fn exit_status(code: nvmlReturn_t) -> u8 {
    match code {
        ret::INVALID_ARGUMENT => 2,
        ret::NOT_SUPPORTED => 3,
        ret::NO_PERMISSION => 4,
        ret::NOT_FOUND => 6,
        ret::INSUFFICIENT_POWER => 8,
        ret::DRIVER_NOT_LOADED => 9,
        ret::IRQ_ISSUE => 10,
        ret::LIBRARY_NOT_FOUND => 12,
        ret::FUNCTION_NOT_FOUND => 13,
        ret::CORRUPTED_INFOROM => 14,
        ret::GPU_IS_LOST => 15,
        _ => EXIT_OTHER,
    }
}

/// Counts one invocation of `action` in the node and returns the failure
/// `GPUSHARE_SIM_FAIL` injects into it, if any (saying so on stderr).
fn injected(
    node: &mut Node,
    failures: &[Failure],
    action: &str,
    out: &mut Out<'_>,
) -> Option<nvmlReturn_t> {
    let n = node.count_tool_call(action);
    let code = faults::fires(failures, action, n)?;
    let _ = writeln!(
        out.err,
        "gpushare-sim-nvidia-smi: failure injected by {}: call {n} of {action} fails with {}",
        faults::FAIL_ENV,
        ret::name(code)
    );
    Some(code)
}

fn no_devices(out: &mut Out<'_>) -> u8 {
    let _ = writeln!(out.out, "{NO_DEVICES}");
    EXIT_NOT_FOUND
}

/// An option's value: inline (`--id=3`) or the next argument.
fn value_of<'a>(
    inline: Option<&'a str>,
    rest: &mut impl Iterator<Item = &'a String>,
) -> Option<String> {
    inline.map(str::to_string).or_else(|| rest.next().cloned())
}

/// `--name=value` → (`--name`, `value`); anything else unchanged.
fn split_inline(arg: &str) -> (&str, Option<&str>) {
    match arg.split_once('=') {
        Some((name, value)) if name.starts_with("--") => (name, Some(value)),
        _ => (arg, None),
    }
}

/// An option the top level does not know: the real tool's words and exit status.
fn unrecognized(out: &mut Out<'_>, arg: &str) -> u8 {
    let _ =
        writeln!(out.out, "ERROR: Option {arg} is not recognized. Please run 'nvidia-smi -h'.\n");
    EXIT_OTHER
}

/// An option without its value: the real tool's words, and its exit status 0.
fn missing_top(out: &mut Out<'_>, arg: &str) -> u8 {
    let _ = writeln!(out.out, "ERROR: Option {arg} is missing its value. {HELP_HINT}\n");
    0
}

fn invalid_combination(out: &mut Out<'_>) -> u8 {
    let _ = writeln!(out.out, "{INVALID_COMBINATION}");
    EXIT_INVALID_ARGUMENT
}

/// How nvidia-smi words an NVML error: `nvmlErrorString`'s text (the simulated library
/// words every code as driver 580 does).
fn smi_message(code: nvmlReturn_t) -> String {
    ret::message(code).to_string_lossy().into_owned()
}

/// Runs one invocation: records it, then does what `args` ask; returns the exit status.
fn run(args: &[String], env: &Env, out: &mut Out<'_>) -> u8 {
    let mut line = String::from("nvidia-smi");
    for arg in args {
        line.push(' ');
        line.push_str(arg);
    }
    common::record(env.record.as_deref(), &line);
    let status = match args.first().map(String::as_str) {
        Some("compute-policy") => policy::run(&args[1..], env, out),
        Some("mig") => mig::run(&args[1..], env, out),
        _ => top_level(args, env, out),
    };
    let _ = out.out.flush();
    let _ = out.err.flush();
    status
}

/// The top-level options.
#[derive(Default)]
struct TopArgs {
    ids: Option<String>,
    list: bool,
    reset: bool,
    help: bool,
    query: bool,
    display: Option<String>,
    query_gpu: Option<String>,
    query_apps: Option<String>,
    format: Option<String>,
    persistence: Option<String>,
    mig: Option<String>,
}

/// `nvidia-smi [-L | -q | --query-gpu | -pm | -mig | -r] [-i IDS]`.
fn top_level(args: &[String], env: &Env, out: &mut Out<'_>) -> u8 {
    let mut a = TopArgs::default();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let (name, inline) = split_inline(arg);
        let slot = match (name, inline) {
            ("-L" | "--list-gpus", None) => {
                a.list = true;
                continue;
            }
            ("-r" | "--gpu-reset", None) => {
                a.reset = true;
                continue;
            }
            ("-h" | "--help", None) => {
                a.help = true;
                continue;
            }
            ("-q" | "--query", None) => {
                a.query = true;
                continue;
            }
            ("-i" | "--id", _) => &mut a.ids,
            ("-d" | "--display", _) => &mut a.display,
            ("--query-gpu", _) => &mut a.query_gpu,
            ("--query-compute-apps", _) => &mut a.query_apps,
            ("--format", _) => &mut a.format,
            ("-pm" | "--persistence-mode", _) => &mut a.persistence,
            ("-mig" | "--multi-instance-gpu", _) => &mut a.mig,
            _ => return unrecognized(out, arg),
        };
        match value_of(inline, &mut rest) {
            Some(value) => *slot = Some(value),
            None => return missing_top(out, arg),
        }
    }
    if a.help {
        let _ = write!(out.out, "{HELP}");
        return 0;
    }
    if a.list && a.ids.is_some() {
        let _ = writeln!(out.out, "ERROR: Option -i is not valid for this command. {HELP_HINT}\n");
        return EXIT_INVALID_ARGUMENT;
    }
    let actions = [a.list, a.reset, a.query, a.query_gpu.is_some()]
        .into_iter()
        .chain([a.query_apps.is_some(), a.persistence.is_some(), a.mig.is_some()])
        .filter(|&on| on)
        .count();
    if actions > 1
        || (a.display.is_some() && !a.query)
        || (a.format.is_some() && a.query_gpu.is_none() && a.query_apps.is_none())
    {
        return invalid_combination(out);
    }
    // Everything about the arguments is checked before the driver is asked.
    let display = q::Display::parse(a.display.as_deref());
    // At most one of the two queries is given (checked above).
    let gpu_fields = a.query_gpu.as_deref().map(query::Fields::parse).transpose();
    let app_fields = a.query_apps.as_deref().map(query::AppFields::parse).transpose();
    let (csv, apps) = match (gpu_fields, app_fields) {
        (Ok(gpu), Ok(app)) => {
            let format = || query::Format::parse(a.format.as_deref());
            (gpu.map(|f| (f, format())), app.map(|f| (f, format())))
        }
        (Err(line), _) | (_, Err(line)) => {
            let _ = writeln!(out.out, "{line}\n");
            return EXIT_INVALID_ARGUMENT;
        }
    };
    let switch = |value: &Option<String>| value.as_deref().map(modes::parse_switch);
    let (persistence, mig) = (switch(&a.persistence), switch(&a.mig));
    if display.is_none()
        || matches!(&csv, Some((_, None)))
        || matches!(&apps, Some((_, None)))
        || matches!(persistence, Some(None))
        || matches!(mig, Some(None))
    {
        return invalid_combination(out);
    }
    let file = match node_file(env, out) {
        Ok(file) => file,
        Err(status) => return status,
    };
    let ids = a.ids.as_deref();
    if a.reset {
        let failures = match failures(env, out) {
            Ok(failures) => failures,
            Err(status) => return status,
        };
        return update_node(&file, out, |node, out| modes::gpu_reset(node, ids, failures, out));
    }
    if let Some(Some(on)) = persistence {
        return update_node(&file, out, |node, out| modes::persistence_mode(node, ids, on, out));
    }
    if let Some(Some(on)) = mig {
        return update_node(&file, out, |node, out| modes::mig_mode(node, ids, on, out));
    }
    let node = match read_node(&file, out) {
        Ok(node) => node,
        Err(status) => return status,
    };
    let Some(chosen) = ids::select(&node, ids) else { return no_devices(out) };
    let indexes: Vec<usize> = chosen.into_iter().map(|(i, _)| i).collect();
    let lost: Vec<&Gpu> =
        indexes.iter().map(|&i| &node.gpus[i]).filter(|g| g.health.lost).collect();
    let summary = !a.list && !a.query && csv.is_none() && apps.is_none();
    if summary && !lost.is_empty() {
        // The table is not printed: the lost GPU's line alone, as operators' transcripts
        // show it.
        for g in lost {
            let _ = writeln!(out.out, "{}", q::lost_line(g));
        }
        return exit_status(ret::GPU_IS_LOST);
    }
    let text = match (csv, display) {
        (Some((fields, Some(format))), _) => query::render(&node, &indexes, &fields, format),
        _ if apps.is_some() => match apps {
            Some((fields, Some(format))) => query::render_apps(&node, &indexes, &fields, format),
            _ => String::new(),
        },
        (_, Some(display)) if a.query => q::render(&node, &indexes, &display),
        _ if a.list => indexes.iter().map(|&i| list_gpu(&node.gpus[i], i)).collect(),
        // No command (with or without `-i`): the summary table.
        _ => summary::render(&node, &indexes),
    };
    let _ = write!(out.out, "{text}");
    // `-q` of a GPU off the bus printed why in its place (`q::lost_line`).
    if a.query && indexes.iter().any(|&i| node.gpus[i].health.lost) {
        return exit_status(ret::GPU_IS_LOST);
    }
    0
}

/// `-L`'s lines for one GPU: the GPU, then its MIG devices in NVML's device order (one
/// per compute instance), named by their profile as nvidia-smi names them (`1g.10gb`, or
/// `1c.3g.40gb` for a compute instance smaller than its GPU instance).
fn list_gpu(gpu: &Gpu, index: usize) -> String {
    let mut text = format!("GPU {index}: {} (UUID: {})\n", gpu.name(), gpu.uuid);
    for (device, (gi_id, ci_id, _)) in rules::mig_devices(gpu).into_iter().enumerate() {
        let Some(gi) = gpu.instance(gi_id) else { continue };
        let Some(ci) = gi.compute_instances.iter().find(|ci| ci.id == ci_id) else { continue };
        let name = match gpu.model().profile_by_id(gi.profile_id) {
            Some(p) if ci.size == 0 || ci.size >= p.compute_slices => p.name.to_string(),
            Some(p) => format!("{}c.{}", ci.size, p.name),
            None => format!("profile {}", gi.profile_id),
        };
        text.push_str(&format!("  MIG {name:<12}Device {device:>2}: (UUID: {})\n", ci.uuid));
    }
    text
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut stdout, mut stderr) = (io::stdout().lock(), io::stderr().lock());
    let mut out = Out { out: &mut stdout, err: &mut stderr };
    ExitCode::from(run(&args, &Env::from_env(), &mut out))
}
