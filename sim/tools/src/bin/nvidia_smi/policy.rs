//! `nvidia-smi compute-policy`: the time-slice setting per GPU ([`Gpu::timeslice`]).

use gpushare_sim_nvml::abi::types::ret;
use gpushare_sim_nvml::node::Gpu;

use crate::{
    EXIT_INVALID_ARGUMENT, Env, HELP_HINT, INVALID_COMBINATION, Out, SET_TIMESLICE, exit_status,
    failures, ids, injected, no_devices, node_file, read_node, split_inline, update_node, value_of,
};

/// `--set-timeslice` values 0-3 and how `compute-policy -l` shows them.
pub const TIMESLICES: [&str; 4] = ["Default", "Short", "Medium", "Long"];

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

/// An option `compute-policy` does not know (the manual's wording; the real tool's
/// subcommand answer was not recorded).
fn unrecognized(out: &mut Out<'_>, arg: &str) -> u8 {
    let _ = writeln!(out.out, "ERROR: Option {arg} is not recognized. {HELP_HINT}");
    EXIT_INVALID_ARGUMENT
}

/// An option without its value (the manual's wording; the real tool's subcommand answer
/// was not recorded).
fn missing_value(out: &mut Out<'_>, arg: &str) -> u8 {
    let _ = writeln!(out.out, "ERROR: Option {arg} is missing its value. {HELP_HINT}");
    EXIT_INVALID_ARGUMENT
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
pub fn run(args: &[String], env: &Env, out: &mut Out<'_>) -> u8 {
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
        let Some(chosen) = ids::select(&node, ids.as_deref()) else { return no_devices(out) };
        let gpus: Vec<(usize, &Gpu)> = chosen.iter().map(|(i, _)| (*i, &node.gpus[*i])).collect();
        let _ = write!(out.out, "{}", policy_table(&gpus));
        return 0;
    };
    let failures = match failures(env, out) {
        Ok(failures) => failures,
        Err(status) => return status,
    };
    update_node(&file, out, |node, out| {
        let Some(chosen) = ids::select(node, ids.as_deref()) else { return no_devices(out) };
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
