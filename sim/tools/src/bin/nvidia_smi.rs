//! `gpushare-sim-nvidia-smi`: the simulated `nvidia-smi`, part of gpushare's simulator
//! (`gpushare-agent --simulate`, the tests, hosts without a GPU; the package installs it as
//! `/usr/lib/gpushare/sim/nvidia-smi`). It reads and changes the same simulated node as the
//! simulated NVML library (`gpushare_sim_nvml::node`, the JSON file named by
//! `GPUSHARE_SIM_STATE`, which the agent sets for itself and the tools it runs), knows what
//! the agent uses, answers as the real one of driver 580 does where that was seen (the
//! `compute-policy -l` table in tests/device/results/mps-probe-h100-2026-11-22.txt, the
//! `compute-policy` help, the reset outputs the agent's reset.rs classifies, the error lines
//! and exit statuses of nvidia-smi's manual), and records every invocation.
//!
//! ```text
//! gpushare-sim-nvidia-smi -L | --list-gpus [-i ID[,ID…]]
//! gpushare-sim-nvidia-smi -r | --gpu-reset [-i ID[,ID…]]
//! gpushare-sim-nvidia-smi compute-policy -l | --list [-i ID[,ID…]]
//! gpushare-sim-nvidia-smi compute-policy [-i ID[,ID…]] --set-timeslice N   (N: 0-3; also --set-timeslice=N)
//! gpushare-sim-nvidia-smi [compute-policy] -h | --help
//! ```
//!
//! An ID is a GPU index (its NVML index: its place in the node), UUID or PCI bus ID
//! (`00000000:1B:00.0`), as the node holds them; without `-i` a command applies to every
//! GPU. Output, for what is supported:
//!
//! ```text
//! GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-…)                      (-L; the NVML name)
//!   MIG 1g.10gb     Device  0: (UUID: MIG-…)                      (-L, each compute instance)
//! GPU 00000000:1B:00.0 was successfully reset.                    (-r, then "All done.")
//! Set timeslice to 2 for GPU GPU-…                                (the ID as given)
//! ```
//!
//! On the node:
//!
//! - `-r` is [`Node::reset_gpu`] under the node's lock ([`NodeFile::update`]): a pending MIG
//!   mode takes effect, instances are gone, compute mode and time-slice return to default.
//!   Refused while compute processes hold the GPU or while persistence mode is on (the real
//!   tool then finds nvidia-persistenced holding it): "The following GPUs could not be
//!   reset: … In use by another client", NVIDIA's explanatory paragraph, exit 255.
//! - `compute-policy --set-timeslice` / `-l` store and read [`Gpu::timeslice`].
//! - `GPUSHARE_SIM_FAIL` (`gpushare_sim_nvml::faults`) may name the tool actions
//!   `gpu-reset:<n>` and `set-timeslice:<n>`: the n-th invocation of that action fails as the
//!   real tool does for a cause outside the caller (a reset: the in-use answer, exit 255; a
//!   time-slice: "Unable to set timeslice for GPU …: Insufficient Permissions", exit 4 —
//!   modelled on the real tool's other setters, no real answer was recorded), or with the
//!   NVML code the entry names (`gpu-reset:1=NVML_ERROR_GPU_IS_LOST`), and one stderr line
//!   says it was injected. Calls are counted in the node ([`Node::count_tool_call`], in the
//!   same update), so every nvidia-smi of one agent session counts together; the driver
//!   clears the counts when a session starts.
//! - Without `GPUSHARE_SIM_STATE`, or without its file, the answer is a host's without a
//!   driver: "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.
//!   …", exit 9, and one stderr line naming `GPUSHARE_SIM_STATE`.
//!
//! Exit statuses as the real tool's: 0; 2 for an unknown option or invalid value ("ERROR:
//! Option X is not recognized. Please run 'nvidia-smi -h' for help." / "Invalid combination
//! of input arguments. …"); 4 for missing permissions; 6 when an ID matches no GPU ("No
//! devices were found"); 9 without a driver; 255 for a GPU in use and when the node's file
//! cannot be read or written. Without arguments it prints the `-L` lines (not the real
//! summary table).
//!
//! Record (`GPUSHARE_SIM_RECORD`): one line per invocation, `nvidia-smi` and its arguments
//! joined by spaces, e.g. `nvidia-smi compute-policy -i GPU-xxx --set-timeslice 2`.

#[path = "../common.rs"]
mod common;

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use gpushare_sim_nvml::abi::types::{nvmlReturn_t, ret};
use gpushare_sim_nvml::faults::{self, Failure};
use gpushare_sim_nvml::node::{Gpu, Node, NodeFile, ResetRefused, STATE_ENV};

/// `--set-timeslice` values 0-3 and how `compute-policy -l` shows them.
const TIMESLICES: [&str; 4] = ["Default", "Short", "Medium", "Long"];

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

const POLICY_TABLE_TOP: &str = "\
+-------------------------------------+
| GPU compute policies:               |
| GPU     Name           Value        |
|=====================================|
";
const POLICY_TABLE_BOTTOM: &str = "+-------------------------------------+\n";

/// The real `nvidia-smi compute-policy -h`.
const COMPUTE_POLICY_HELP: &str = "
    Compute Policy -- Control and list compute policies.

    Usage: nvidia-smi compute-policy [options]

    Options include:
    [-i | --id]: GPU device ID's. Provide comma
                 separated values for more than one device

    [-l | --list]: List all compute policies

    [ | --set-timeslice]: Set timeslice config for a GPU:
                          0=DEFAULT, 1=SHORT, 2=MEDIUM, 3=LONG

    [-h | --help]: Display help information

";

const HELP: &str = "\
simulated nvidia-smi (gpushare's simulator): the options gpushare uses.

    -L, --list-gpus         List the GPUs with their UUIDs.
    -i, --id=ID             Target GPU(s): index, UUID or PCI bus ID, comma separated.
    -r, --gpu-reset         Reset the GPU(s).
    -h, --help              Print this help.
    compute-policy          Control and list compute policies (compute-policy -h).

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

/// Whether `id` (index, UUID or PCI bus ID) names the GPU at `index`.
fn matches(gpu: &Gpu, index: usize, id: &str) -> bool {
    id == index.to_string()
        || id.eq_ignore_ascii_case(&gpu.uuid)
        || id.eq_ignore_ascii_case(&gpu.pci_bus_id)
}

/// The GPUs `ids` names (comma separated; all when `None`), each as (index, the ID as
/// given, its index when all). `None` when an ID matches no GPU or none is given.
fn select(node: &Node, ids: Option<&str>) -> Option<Vec<(usize, String)>> {
    let Some(ids) = ids else {
        return Some((0..node.gpus.len()).map(|i| (i, i.to_string())).collect());
    };
    let mut chosen = Vec::new();
    for id in ids.split(',').map(str::trim).filter(|id| !id.is_empty()) {
        let index = node.gpus.iter().enumerate().position(|(i, g)| matches(g, i, id))?;
        chosen.push((index, id.to_string()));
    }
    (!chosen.is_empty()).then_some(chosen)
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

fn unrecognized(out: &mut Out<'_>, arg: &str) -> u8 {
    let _ = writeln!(out.out, "ERROR: Option {arg} is not recognized. {HELP_HINT}");
    EXIT_INVALID_ARGUMENT
}

fn missing_value(out: &mut Out<'_>, arg: &str) -> u8 {
    let _ = writeln!(out.out, "ERROR: Option {arg} is missing its value. {HELP_HINT}");
    EXIT_INVALID_ARGUMENT
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

/// Runs one invocation: records it, then does what `args` ask; returns the exit status.
fn run(args: &[String], env: &Env, out: &mut Out<'_>) -> u8 {
    let mut line = String::from("nvidia-smi");
    for arg in args {
        line.push(' ');
        line.push_str(arg);
    }
    common::record(env.record.as_deref(), &line);
    let status = match args.first().map(String::as_str) {
        Some("compute-policy") => compute_policy(&args[1..], env, out),
        _ => top_level(args, env, out),
    };
    let _ = out.out.flush();
    let _ = out.err.flush();
    status
}

/// `nvidia-smi [-L] [-r] [-i IDS]`.
fn top_level(args: &[String], env: &Env, out: &mut Out<'_>) -> u8 {
    let (mut ids, mut list, mut reset, mut help) = (None, false, false, false);
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match split_inline(arg) {
            ("-L" | "--list-gpus", None) => list = true,
            ("-r" | "--gpu-reset", None) => reset = true,
            ("-h" | "--help", None) => help = true,
            ("-i" | "--id", inline) => match value_of(inline, &mut rest) {
                Some(value) => ids = Some(value),
                None => return missing_value(out, arg),
            },
            _ => return unrecognized(out, arg),
        }
    }
    if help {
        let _ = write!(out.out, "{HELP}");
        return 0;
    }
    if list && reset {
        let _ = writeln!(out.out, "{INVALID_COMBINATION}");
        return EXIT_INVALID_ARGUMENT;
    }
    let file = match node_file(env, out) {
        Ok(file) => file,
        Err(status) => return status,
    };
    if reset {
        let failures = match failures(env, out) {
            Ok(failures) => failures,
            Err(status) => return status,
        };
        return update_node(&file, out, |node, out| gpu_reset(node, ids.as_deref(), failures, out));
    }
    // `-L`, and for now also the summary without arguments.
    let node = match read_node(&file, out) {
        Ok(node) => node,
        Err(status) => return status,
    };
    let Some(chosen) = select(&node, ids.as_deref()) else { return no_devices(out) };
    for (index, _) in chosen {
        list_gpu(&node.gpus[index], index, out);
    }
    0
}

/// `-L`'s lines for one GPU: the GPU, then its MIG devices (one per compute instance, in
/// the order the node holds them), named by their GPU instance's profile as nvidia-smi
/// names them (`1g.10gb`, or `1c.3g.40gb` for a compute instance smaller than its GPU
/// instance).
fn list_gpu(gpu: &Gpu, index: usize, out: &mut Out<'_>) {
    let _ = writeln!(out.out, "GPU {index}: {} (UUID: {})", gpu.name(), gpu.uuid);
    if !gpu.mig_enabled {
        return;
    }
    let model = gpu.model();
    let mut device = 0;
    for gi in &gpu.instances {
        let profile = model.profile_by_id(gi.profile_id);
        for ci in &gi.compute_instances {
            let name = match profile {
                Some(p) if ci.size == 0 || ci.size >= p.compute_slices => p.name.to_string(),
                Some(p) => format!("{}c.{}", ci.size, p.name),
                None => format!("profile {}", gi.profile_id),
            };
            let _ = writeln!(out.out, "  MIG {name:<12}Device {device:>2}: (UUID: {})", ci.uuid);
            device += 1;
        }
    }
}

/// `--gpu-reset` on the node (under its lock).
fn gpu_reset(node: &mut Node, ids: Option<&str>, failures: &[Failure], out: &mut Out<'_>) -> u8 {
    let Some(chosen) = select(node, ids) else { return no_devices(out) };
    let in_use_block = |out: &mut Out<'_>, pcis: &[String]| {
        let _ = writeln!(out.out, "The following GPUs could not be reset:");
        for pci in pcis {
            let _ = writeln!(out.out, "  GPU {pci}: In use by another client");
        }
        let (count, these) = match pcis.len() {
            1 => ("1 device is".to_string(), "this device"),
            n => (format!("{n} devices are"), "these devices"),
        };
        let _ = writeln!(
            out.out,
            "\n{count} currently being used by one or more other processes (e.g., Fabric \
             Manager, CUDA application, graphics application such as an X server, or a \
             monitoring application such as another instance of nvidia-smi). Please first \
             kill all processes using {these} and all compute applications running in the \
             system."
        );
        EXIT_OTHER
    };
    let pcis: Vec<String> = chosen.iter().map(|(i, _)| node.gpus[*i].pci_bus_id.clone()).collect();
    if let Some(code) = injected(node, failures, GPU_RESET, out) {
        if code == ret::IN_USE {
            return in_use_block(out, &pcis);
        }
        for pci in &pcis {
            let _ = writeln!(
                out.out,
                "Unable to reset GPU {pci}: {}",
                ret::message(code).to_string_lossy()
            );
        }
        return exit_status(code);
    }
    let mut refused = Vec::new();
    for ((index, _), pci) in chosen.iter().zip(&pcis) {
        match node.reset_gpu(*index) {
            Ok(()) => {
                let _ = writeln!(out.out, "GPU {pci} was successfully reset.");
            }
            Err(ResetRefused::InUse { .. } | ResetRefused::PersistenceMode) => {
                refused.push(pci.clone());
            }
            Err(ResetRefused::NoSuchGpu) => return no_devices(out),
        }
    }
    if !refused.is_empty() {
        return in_use_block(out, &refused);
    }
    let _ = writeln!(out.out, "All done.");
    0
}

/// The `compute-policy -l` table, one row per (index, GPU).
fn policy_table(gpus: &[(usize, &Gpu)]) -> String {
    let mut table = String::from(POLICY_TABLE_TOP);
    for (index, gpu) in gpus {
        let value = TIMESLICES[usize::from(gpu.timeslice.min(3))];
        table.push_str(&format!("| {index:>3}   {:<16}{value:<14}|\n", "Timeslice"));
    }
    table.push_str(POLICY_TABLE_BOTTOM);
    table
}

/// `nvidia-smi compute-policy …`.
fn compute_policy(args: &[String], env: &Env, out: &mut Out<'_>) -> u8 {
    let (mut ids, mut list, mut set, mut help) = (None, false, None, false);
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match split_inline(arg) {
            ("-l" | "--list", None) => list = true,
            ("-h" | "--help", None) => help = true,
            ("-i" | "--id", inline) => match value_of(inline, &mut rest) {
                Some(value) => ids = Some(value),
                None => return missing_value(out, arg),
            },
            ("--set-timeslice", inline) => match value_of(inline, &mut rest) {
                Some(value) => set = Some(value),
                None => return missing_value(out, arg),
            },
            _ => return unrecognized(out, arg),
        }
    }
    if help || (!list && set.is_none()) {
        let _ = write!(out.out, "{COMPUTE_POLICY_HELP}");
        return 0;
    }
    let timeslice = match set.as_deref().map(str::parse::<u8>) {
        None => None,
        Some(Ok(value)) if usize::from(value) < TIMESLICES.len() => Some(value),
        Some(_) => {
            let _ = writeln!(out.out, "{INVALID_COMBINATION}");
            return EXIT_INVALID_ARGUMENT;
        }
    };
    let file = match node_file(env, out) {
        Ok(file) => file,
        Err(status) => return status,
    };
    let Some(value) = timeslice else {
        let node = match read_node(&file, out) {
            Ok(node) => node,
            Err(status) => return status,
        };
        let Some(chosen) = select(&node, ids.as_deref()) else { return no_devices(out) };
        let gpus: Vec<(usize, &Gpu)> = chosen.iter().map(|(i, _)| (*i, &node.gpus[*i])).collect();
        let _ = write!(out.out, "{}", policy_table(&gpus));
        return 0;
    };
    let failures = match failures(env, out) {
        Ok(failures) => failures,
        Err(status) => return status,
    };
    update_node(&file, out, |node, out| {
        let Some(chosen) = select(node, ids.as_deref()) else { return no_devices(out) };
        if let Some(code) = injected(node, failures, SET_TIMESLICE, out) {
            for (index, _) in &chosen {
                let pci = &node.gpus[*index].pci_bus_id;
                let _ = writeln!(
                    out.out,
                    "Unable to set timeslice for GPU {pci}: {}",
                    ret::message(code).to_string_lossy()
                );
            }
            return exit_status(code);
        }
        for (index, id) in &chosen {
            node.gpus[*index].timeslice = value;
            let _ = writeln!(out.out, "Set timeslice to {value} for GPU {id}");
        }
        if list {
            let gpus: Vec<(usize, &Gpu)> =
                chosen.iter().map(|(i, _)| (*i, &node.gpus[*i])).collect();
            let _ = write!(out.out, "{}", policy_table(&gpus));
        }
        0
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut stdout, mut stderr) = (io::stdout().lock(), io::stderr().lock());
    let mut out = Out { out: &mut stdout, err: &mut stderr };
    ExitCode::from(run(&args, &Env::from_env(), &mut out))
}

#[cfg(test)]
mod tests {
    use std::fs;

    use gpushare_catalog::parse_node_spec;
    use gpushare_sim_nvml::node::{ComputeInstance, ComputeMode, Generation, GpuInstance, Process};

    use super::*;

    /// A temporary directory with a node file of `spec`'s GPUs and a record file.
    struct Fixture {
        dir: tempfile::TempDir,
        /// `GPUSHARE_SIM_FAIL`'s value.
        fail: String,
    }

    impl Fixture {
        fn new(spec: &str) -> Fixture {
            let f = Fixture { dir: tempfile::tempdir().unwrap(), fail: String::new() };
            let file = f.file();
            file.write(&file.lock().unwrap(), &Node::new(&parse_node_spec(spec).unwrap())).unwrap();
            f
        }
        fn state(&self) -> PathBuf {
            self.dir.path().join("simulated-gpus.json")
        }
        fn file(&self) -> NodeFile {
            NodeFile::new(self.state())
        }
        fn node(&self) -> Node {
            self.file().read().unwrap()
        }
        fn change(&self, f: impl FnOnce(&mut Node)) {
            self.file().update(f).unwrap();
        }
        fn record(&self) -> PathBuf {
            self.dir.path().join("record")
        }
        fn env(&self) -> Env {
            Env {
                state: Some(self.state()),
                record: Some(self.record()),
                failures: faults::parse(&self.fail),
            }
        }
        /// Runs one invocation: (exit status, stdout, stderr).
        fn run_with(&self, env: &Env, args: &[&str]) -> (u8, String, String) {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
            let status = run(&args, env, &mut Out { out: &mut stdout, err: &mut stderr });
            (status, String::from_utf8(stdout).unwrap(), String::from_utf8(stderr).unwrap())
        }
        /// Runs one invocation: (exit status, stdout); stderr must be empty.
        fn run(&self, args: &[&str]) -> (u8, String) {
            let (status, out, err) = self.run_with(&self.env(), args);
            assert_eq!(err, "", "{args:?}");
            (status, out)
        }
    }

    fn in_use(pci: &str) -> String {
        format!(
            "The following GPUs could not be reset:\n  GPU {pci}: In use by another client\n\n\
             1 device is currently being used by one or more other processes (e.g., Fabric \
             Manager, CUDA application, graphics application such as an X server, or a \
             monitoring application such as another instance of nvidia-smi). Please first kill \
             all processes using this device and all compute applications running in the \
             system.\n"
        )
    }

    #[test]
    fn lists_the_nodes_gpus_with_their_nvml_names() {
        let f = Fixture::new("h100-80gb:2,a30:1");
        let node = f.node();
        let (status, out) = f.run(&["-L"]);
        assert_eq!(status, 0);
        assert_eq!(
            out,
            format!(
                "GPU 0: NVIDIA H100 80GB HBM3 (UUID: {})\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: {})\n\
                 GPU 2: {} (UUID: {})\n",
                node.gpus[0].uuid,
                node.gpus[1].uuid,
                node.gpus[2].name(),
                node.gpus[2].uuid
            )
        );
        // An ID is the index, the UUID or the PCI bus ID, in any case.
        for id in ["2", node.gpus[2].uuid.as_str(), "00000000:1d:00.0"] {
            let (status, out) = f.run(&["-L", "-i", id]);
            assert_eq!(status, 0, "{id}");
            assert!(out.starts_with("GPU 2: ") && out.lines().count() == 1, "{id}: {out}");
        }
        let (status, out) = f.run(&["--list-gpus", "--id=1,0"]);
        assert_eq!(status, 0);
        assert!(out.starts_with("GPU 1: ") && out.contains("\nGPU 0: "), "{out}");
        assert_eq!(f.run(&["-L", "-i", "3"]), (6, "No devices were found\n".into()));
        assert_eq!(f.node(), node, "listing changes nothing");
    }

    #[test]
    fn lists_mig_devices_under_their_gpu() {
        let f = Fixture::new("h100-80gb:1");
        f.change(|node| {
            let gpu = &mut node.gpus[0];
            gpu.mig_enabled = true;
            let ci = |id, size, uuid: &str| ComputeInstance {
                id,
                profile_id: 0,
                start: 0,
                size,
                uuid: uuid.into(),
                serial: 0,
            };
            // 3g.40gb is profile 9, 1g.10gb profile 19 on an H100-80GB.
            gpu.instances = vec![
                GpuInstance {
                    id: 2,
                    profile_id: 9,
                    start: 4,
                    size: 4,
                    serial: 1,
                    compute_instances: vec![ci(0, 3, "MIG-aaaa")],
                },
                GpuInstance {
                    id: 9,
                    profile_id: 19,
                    start: 0,
                    size: 1,
                    serial: 2,
                    compute_instances: vec![ci(0, 1, "MIG-bbbb")],
                },
            ];
        });
        let (status, out) = f.run(&["-L"]);
        assert_eq!(status, 0);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[1..],
            [
                "  MIG 3g.40gb     Device  0: (UUID: MIG-aaaa)",
                "  MIG 1g.10gb     Device  1: (UUID: MIG-bbbb)"
            ]
        );
    }

    #[test]
    fn lists_compute_policies_as_the_probe_shows() {
        let f = Fixture::new("h100-80gb:1");
        let generation = Generation::open(&f.file()).unwrap();
        let before = generation.current();
        let (status, out) = f.run(&["compute-policy", "-l"]);
        assert_eq!(status, 0);
        assert_eq!(
            out,
            "\
+-------------------------------------+
| GPU compute policies:               |
| GPU     Name           Value        |
|=====================================|
|   0   Timeslice       Default       |
+-------------------------------------+
"
        );
        assert_eq!(generation.current(), before, "listing does not rewrite the node");
    }

    #[test]
    fn sets_timeslices_on_the_node() {
        let f = Fixture::new("h100-80gb:8");
        let uuid = f.node().gpus[0].uuid.clone();
        let (status, out) = f.run(&["compute-policy", "-i", &uuid, "--set-timeslice", "2"]);
        assert_eq!((status, out), (0, format!("Set timeslice to 2 for GPU {uuid}\n")));
        assert_eq!(f.node().gpus[0].timeslice, 2);
        let (_, out) = f.run(&["compute-policy", "-l"]);
        assert!(out.contains("|   0   Timeslice       Medium        |\n"), "{out}");

        let (status, out) = f.run(&["compute-policy", "--id=0", "--set-timeslice=3", "-l"]);
        assert_eq!(status, 0);
        assert!(out.starts_with("Set timeslice to 3 for GPU 0\n+---"), "{out}");
        assert!(out.contains("Long"), "{out}");
        let (_, out) =
            f.run(&["compute-policy", "-i", "1,00000000:22:00.0", "--set-timeslice", "1"]);
        assert_eq!(
            out,
            "Set timeslice to 1 for GPU 1\nSet timeslice to 1 for GPU 00000000:22:00.0\n"
        );
        let (_, out) = f.run(&["compute-policy", "-l"]);
        let rows: Vec<&str> = out.lines().filter(|l| l.contains("Timeslice")).collect();
        assert_eq!(rows.len(), 8);
        assert_eq!(rows[1], "|   1   Timeslice       Short         |");
        assert_eq!(rows[2], "|   2   Timeslice       Default       |");
        assert_eq!(rows[7], "|   7   Timeslice       Short         |");
        let timeslices: Vec<u8> = f.node().gpus.iter().map(|g| g.timeslice).collect();
        assert_eq!(timeslices, [3, 1, 0, 0, 0, 0, 0, 1]);
        let record = fs::read_to_string(f.record()).unwrap();
        assert_eq!(
            record.lines().take(3).collect::<Vec<_>>(),
            [
                format!("nvidia-smi compute-policy -i {uuid} --set-timeslice 2"),
                "nvidia-smi compute-policy -l".into(),
                "nvidia-smi compute-policy --id=0 --set-timeslice=3 -l".into(),
            ]
        );
        assert_eq!(f.node().tool_calls["set-timeslice"], 3);
    }

    #[test]
    fn a_reset_is_refused_while_persistence_mode_is_on() {
        let f = Fixture::new("a100-40gb:2");
        assert!(f.node().gpus[1].persistence_mode, "on by default, as nvidia-persistenced");
        let (status, out) = f.run(&["--gpu-reset", "-i", "1"]);
        assert_eq!((status, out), (255, in_use("00000000:1C:00.0")));
        assert_eq!(f.node().gpus[1].reset_count, 0);
    }

    #[test]
    fn a_reset_is_refused_while_processes_hold_the_gpu() {
        let f = Fixture::new("a100-40gb:2");
        f.change(|node| {
            node.gpus[0].persistence_mode = false;
            node.processes.push(Process { gpu: 0, gpu_instance: None, pid: 4242 });
        });
        let (status, out) = f.run(&["-r", "-i", "0"]);
        assert_eq!((status, out), (255, in_use("00000000:1B:00.0")));
        // Both GPUs: one in use, the other (persistence mode on) too.
        let (status, out) = f.run(&["-r"]);
        assert_eq!(status, 255);
        assert!(
            out.starts_with(
                "The following GPUs could not be reset:\n  GPU 00000000:1B:00.0: In use by another client\n  \
                 GPU 00000000:1C:00.0: In use by another client\n\n2 devices are currently being used"
            ),
            "{out}"
        );
        assert!(out.contains("using these devices"), "{out}");
        assert_eq!(f.node().gpus[0].reset_count, 0);
    }

    #[test]
    fn a_reset_settles_a_pending_mig_mode_and_restores_defaults() {
        let f = Fixture::new("a100-40gb:2");
        f.change(|node| {
            let gpu = &mut node.gpus[1];
            gpu.persistence_mode = false;
            gpu.mig_pending = Some(true);
            gpu.compute_mode = ComputeMode::ExclusiveProcess;
            gpu.timeslice = 2;
        });
        let (status, out) = f.run(&["--gpu-reset", "-i", "1"]);
        assert_eq!(
            (status, out.as_str()),
            (0, "GPU 00000000:1C:00.0 was successfully reset.\nAll done.\n")
        );
        let node = f.node();
        let gpu = &node.gpus[1];
        assert!(gpu.mig_enabled && gpu.mig_pending.is_none());
        assert_eq!(
            (gpu.compute_mode, gpu.timeslice, gpu.reset_count),
            (ComputeMode::Default, 0, 1)
        );
        assert_eq!(node.gpus[0].reset_count, 0);
        assert_eq!(node.tool_calls["gpu-reset"], 1);
    }

    #[test]
    fn the_second_reset_fails_when_injected_counted_across_invocations() {
        let mut f = Fixture::new("h100-80gb:1");
        f.change(|node| node.gpus[0].persistence_mode = false);
        f.fail = "gpu-reset:2".into();
        let ok = "GPU 00000000:1B:00.0 was successfully reset.\nAll done.\n";
        assert_eq!(f.run(&["-r", "-i", "0"]), (0, ok.into()));
        let (status, out, err) = f.run_with(&f.env(), &["-r", "-i", "0"]);
        assert_eq!((status, out), (255, in_use("00000000:1B:00.0")));
        assert_eq!(
            err,
            "gpushare-sim-nvidia-smi: failure injected by GPUSHARE_SIM_FAIL: call 2 of gpu-reset \
             fails with NVML_ERROR_IN_USE\n"
        );
        assert_eq!(f.node().gpus[0].reset_count, 1);
        assert_eq!(f.run(&["-r", "-i", "0"]), (0, ok.into()));
        assert_eq!(f.node().tool_calls["gpu-reset"], 3);
        // Another code when the entry names one.
        f.fail = "gpu-reset:4=NVML_ERROR_GPU_IS_LOST".into();
        let (status, out, err) = f.run_with(&f.env(), &["-r", "-i", "0"]);
        assert_eq!(
            (status, out.as_str()),
            (15, "Unable to reset GPU 00000000:1B:00.0: GPU is lost\n")
        );
        assert!(err.contains("NVML_ERROR_GPU_IS_LOST"), "{err}");
    }

    #[test]
    fn an_injected_timeslice_failure_lacks_permissions() {
        let mut f = Fixture::new("h100-80gb:2");
        f.fail = "set-timeslice:1".into();
        let (status, out, err) =
            f.run_with(&f.env(), &["compute-policy", "-i", "1", "--set-timeslice", "2"]);
        assert_eq!(
            (status, out.as_str()),
            (4, "Unable to set timeslice for GPU 00000000:1C:00.0: Insufficient Permissions\n")
        );
        assert!(err.contains("call 1 of set-timeslice"), "{err}");
        assert_eq!(f.node().gpus[1].timeslice, 0);
        let (status, _) = f.run(&["compute-policy", "-i", "1", "--set-timeslice", "2"]);
        assert_eq!(status, 0);
        assert_eq!(f.node().gpus[1].timeslice, 2);
        // A GPUSHARE_SIM_FAIL that does not parse stops a change.
        f.fail = "set-timeslice".into();
        let (status, out, err) =
            f.run_with(&f.env(), &["compute-policy", "-i", "1", "--set-timeslice", "0"]);
        assert_eq!((status, out.as_str()), (255, ""));
        assert!(err.starts_with("gpushare-sim-nvidia-smi: GPUSHARE_SIM_FAIL: "), "{err}");
        assert_eq!(f.node().gpus[1].timeslice, 2);
    }

    #[test]
    fn without_a_node_it_answers_as_a_host_without_a_driver() {
        let f = Fixture::new("h100-80gb:1");
        let driver = format!("{NO_DRIVER}\n");
        let unset = Env { state: None, record: Some(f.record()), failures: Ok(Vec::new()) };
        for args in [&["-L"][..], &["-r", "-i", "0"], &["compute-policy", "-l"]] {
            let (status, out, err) = f.run_with(&unset, args);
            assert_eq!((status, &out), (9, &driver), "{args:?}");
            assert!(err.contains("GPUSHARE_SIM_STATE is not set"), "{err}");
            assert_eq!(err.lines().count(), 1);
        }
        let missing = Env { state: Some(f.dir.path().join("none.json")), ..f.env() };
        let (status, out, err) = f.run_with(&missing, &["compute-policy", "--set-timeslice", "1"]);
        assert_eq!((status, out), (9, driver));
        assert!(err.contains("no simulated node at GPUSHARE_SIM_STATE="), "{err}");
        // The help needs no driver.
        assert_eq!(f.run_with(&unset, &["compute-policy", "-h"]).0, 0);
        assert_eq!(fs::read_to_string(f.record()).unwrap().lines().count(), 5);
    }

    #[test]
    fn errors_as_the_real_tool() {
        let f = Fixture::new("h100-80gb:1");
        let (status, out) = f.run(&["--bogus"]);
        assert_eq!(status, 2);
        assert_eq!(
            out,
            "ERROR: Option --bogus is not recognized. Please run 'nvidia-smi -h' for help.\n"
        );
        let (status, out) = f.run(&["compute-policy", "--set-timeslice", "4"]);
        assert_eq!((status, out), (2, format!("{INVALID_COMBINATION}\n")));
        let (status, _) = f.run(&["compute-policy", "--set-timeslice", "x"]);
        assert_eq!(status, 2);
        let (status, out) = f.run(&["compute-policy", "-i"]);
        assert_eq!(status, 2);
        assert_eq!(
            out,
            "ERROR: Option -i is missing its value. Please run 'nvidia-smi -h' for help.\n"
        );
        let (status, out) = f.run(&["compute-policy", "-i", "GPU-nope", "--set-timeslice", "1"]);
        assert_eq!((status, out.as_str()), (6, "No devices were found\n"));
        let (status, _) = f.run(&["-i", "9", "-r"]);
        assert_eq!(status, 6);
        let (status, _) = f.run(&["-L", "-r"]);
        assert_eq!(status, 2);
        let (status, out) = f.run(&["compute-policy"]);
        assert_eq!(status, 0);
        assert!(out.contains("[ | --set-timeslice]: Set timeslice config for a GPU:"));
        fs::write(f.state(), "{ not json").unwrap();
        let (status, out, err) = f.run_with(&f.env(), &["-L"]);
        assert_eq!((status, out.as_str()), (255, ""));
        assert!(err.contains("unreadable simulated node state"), "{err}");
        // Every invocation is recorded, failed ones too.
        assert_eq!(fs::read_to_string(f.record()).unwrap().lines().count(), 9);
    }
}
