//! `--query-gpu=FIELDS` and `--query-compute-apps=FIELDS`, `--format=csv[,noheader][,nounits]`.

use gpushare_sim_nvml::node::Node;
use gpushare_sim_nvml::rules::{self, ProcessView};

use crate::device::{self, NOT_AVAILABLE};

/// One queryable field: its name (as the header shows it), other names nvidia-smi takes
/// for it, its unit, and its value for (node, GPU index).
struct Field {
    name: &'static str,
    aliases: &'static [&'static str],
    unit: Option<&'static str>,
    value: fn(&Node, usize) -> String,
}

const MIB: Option<&str> = Some("MiB");

const FIELDS: &[Field] = &[
    Field {
        name: "timestamp",
        aliases: &[],
        unit: None,
        value: |_, _| {
            let (time, ms) = device::local_time("%Y/%m/%d %H:%M:%S");
            format!("{time}.{ms:03}")
        },
    },
    Field {
        name: "driver_version",
        aliases: &[],
        unit: None,
        value: |_, _| device::DRIVER_VERSION.to_string(),
    },
    Field { name: "count", aliases: &[], unit: None, value: |n, _| n.gpus.len().to_string() },
    Field { name: "index", aliases: &[], unit: None, value: |_, i| i.to_string() },
    Field {
        name: "name",
        aliases: &["gpu_name"],
        unit: None,
        value: |n, i| n.gpus[i].name().to_string(),
    },
    Field {
        name: "serial",
        aliases: &["gpu_serial"],
        unit: None,
        value: |n, i| device::serial(&n.gpus[i]),
    },
    Field {
        name: "uuid",
        aliases: &["gpu_uuid"],
        unit: None,
        value: |n, i| n.gpus[i].uuid.clone(),
    },
    Field {
        name: "pci.bus_id",
        aliases: &["gpu_bus_id"],
        unit: None,
        value: |n, i| n.gpus[i].pci_bus_id.clone(),
    },
    Field {
        name: "pci.domain",
        aliases: &[],
        unit: None,
        value: |n, i| format!("0x{:04X}", device::pci(&n.gpus[i]).domain),
    },
    Field {
        name: "pci.bus",
        aliases: &[],
        unit: None,
        value: |n, i| format!("0x{:02X}", device::pci(&n.gpus[i]).bus),
    },
    Field {
        name: "pci.device",
        aliases: &[],
        unit: None,
        value: |n, i| format!("0x{:02X}", device::pci(&n.gpus[i]).device),
    },
    Field {
        name: "pci.device_id",
        aliases: &[],
        unit: None,
        value: |n, i| format!("0x{:08X}", device::device_id(&n.gpus[i])),
    },
    Field {
        name: "pci.sub_device_id",
        aliases: &[],
        unit: None,
        value: |n, i| format!("0x{:08X}", device::subsystem_id(&n.gpus[i])),
    },
    Field {
        name: "vbios_version",
        aliases: &[],
        unit: None,
        // The simulator has no VBIOS to read.
        value: |_, _| NOT_AVAILABLE.to_string(),
    },
    Field {
        name: "persistence_mode",
        aliases: &[],
        unit: None,
        value: |n, i| device::enabled(n.gpus[i].persistence_mode).to_string(),
    },
    Field {
        name: "compute_mode",
        aliases: &[],
        unit: None,
        value: |n, i| device::compute_mode(n.gpus[i].compute_mode).to_string(),
    },
    Field {
        name: "mig.mode.current",
        aliases: &[],
        unit: None,
        value: |n, i| device::mig_modes(&n.gpus[i]).map_or(NOT_AVAILABLE, |m| m.0).to_string(),
    },
    Field {
        name: "mig.mode.pending",
        aliases: &[],
        unit: None,
        value: |n, i| device::mig_modes(&n.gpus[i]).map_or(NOT_AVAILABLE, |m| m.1).to_string(),
    },
    // GPU operation modes exist on Kepler-era boards only; the H100 answered N/A.
    Field {
        name: "gom.current",
        aliases: &["gpu_operation_mode.current"],
        unit: None,
        value: |_, _| NOT_AVAILABLE.to_string(),
    },
    Field {
        name: "gom.pending",
        aliases: &["gpu_operation_mode.pending"],
        unit: None,
        value: |_, _| NOT_AVAILABLE.to_string(),
    },
    Field {
        name: "memory.total",
        aliases: &[],
        unit: MIB,
        value: |n, i| device::memory(n, i).total.to_string(),
    },
    Field {
        name: "memory.reserved",
        aliases: &[],
        unit: MIB,
        value: |n, i| device::memory(n, i).reserved.to_string(),
    },
    Field {
        name: "memory.used",
        aliases: &[],
        unit: MIB,
        value: |n, i| device::memory(n, i).used.to_string(),
    },
    Field {
        name: "memory.free",
        aliases: &[],
        unit: MIB,
        value: |n, i| device::memory(n, i).free().to_string(),
    },
];

/// The fields of `table` a query's comma-separated `list` names, by name or alias (`names`
/// gives a field's); the error is the real tool's line for the first it does not know.
fn find_all<T>(
    table: &'static [T],
    list: &str,
    names: impl Fn(&T) -> (&'static str, &'static [&'static str]),
) -> Result<Vec<&'static T>, String> {
    list.split(',')
        .map(|name| {
            let name = name.trim();
            table
                .iter()
                .find(|f| {
                    let (own, aliases) = names(f);
                    own == name || aliases.contains(&name)
                })
                .ok_or_else(|| format!("Field \"{name}\" is not a valid field to query."))
        })
        .collect()
}

/// The fields of a `--query-gpu` list.
pub struct Fields(Vec<&'static Field>);

impl Fields {
    /// Parses `index,name,...`; the error is the real tool's line for the first field it
    /// does not know.
    pub fn parse(list: &str) -> Result<Fields, String> {
        find_all(FIELDS, list, |f| (f.name, f.aliases)).map(Fields)
    }
}

/// `--format`'s options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    header: bool,
    units: bool,
}

impl Format {
    /// Parses `csv[,noheader][,nounits]`; no `--format` at all answers as `csv` (the real
    /// tool did, though its help calls csv mandatory). `None` for an option it lacks.
    pub fn parse(text: Option<&str>) -> Option<Format> {
        let mut format = Format { header: true, units: true };
        for option in text.unwrap_or("csv").split(',').map(str::trim) {
            match option {
                "csv" => {}
                "noheader" => format.header = false,
                "nounits" => format.units = false,
                _ => return None,
            }
        }
        Some(format)
    }
}

/// A query's header line: each field's name, its unit in brackets (even with `nounits`).
fn header<'a>(fields: impl Iterator<Item = (&'a str, Option<&'a str>)>) -> String {
    let names: Vec<String> = fields
        .map(|(name, unit)| match unit {
            Some(unit) => format!("{name} [{unit}]"),
            None => name.to_string(),
        })
        .collect();
    format!("{}\n", names.join(", "))
}

/// The CSV lines for the GPUs at `indexes`: the header (names, units in brackets even with
/// `nounits`), then one line per GPU; values `, `-separated, a unit after each value that
/// has one unless `nounits`.
pub fn render(node: &Node, indexes: &[usize], fields: &Fields, format: Format) -> String {
    let mut text = String::new();
    if format.header {
        text.push_str(&header(fields.0.iter().map(|f| (f.name, f.unit))));
    }
    for &index in indexes {
        let values: Vec<String> = fields
            .0
            .iter()
            .map(|f| {
                let value = (f.value)(node, index);
                match f.unit {
                    Some(unit) if format.units && value != NOT_AVAILABLE => {
                        format!("{value} {unit}")
                    }
                    _ => value,
                }
            })
            .collect();
        text.push_str(&values.join(", "));
        text.push('\n');
    }
    text
}

/// One `--query-compute-apps` field: its name as the header shows it, other names the
/// tool takes, its unit, and its value for (node, GPU index, process).
struct AppField {
    name: &'static str,
    aliases: &'static [&'static str],
    unit: Option<&'static str>,
    value: fn(&Node, usize, &ProcessView) -> String,
}

/// `--query-compute-apps`'s fields (nvidia-smi(1)'s list). The recorded driver 580 on an
/// H200 answered `pid,process_name,used_memory` with the header `pid, process_name,
/// used_gpu_memory [MiB]` (tests/device/results/clients-h200-2026-11-27/smi.txt).
const APP_FIELDS: &[AppField] = &[
    AppField {
        name: "timestamp",
        aliases: &[],
        unit: None,
        value: |_, _, _| {
            let (time, ms) = device::local_time("%Y/%m/%d %H:%M:%S");
            format!("{time}.{ms:03}")
        },
    },
    AppField {
        name: "gpu_name",
        aliases: &[],
        unit: None,
        value: |n, i, _| n.gpus[i].name().into(),
    },
    AppField {
        name: "gpu_bus_id",
        aliases: &[],
        unit: None,
        value: |n, i, _| n.gpus[i].pci_bus_id.clone(),
    },
    AppField {
        name: "gpu_serial",
        aliases: &[],
        unit: None,
        value: |n, i, _| device::serial(&n.gpus[i]),
    },
    AppField {
        name: "gpu_uuid",
        aliases: &[],
        unit: None,
        value: |n, i, _| n.gpus[i].uuid.clone(),
    },
    AppField { name: "pid", aliases: &[], unit: None, value: |_, _, p| p.pid.to_string() },
    AppField {
        name: "process_name",
        aliases: &["name"],
        unit: None,
        value: |_, _, p| device::process_name(p.pid),
    },
    AppField {
        name: "used_gpu_memory",
        aliases: &["used_memory"],
        unit: MIB,
        value: |_, _, p| device::process_mib(p).to_string(),
    },
];

/// The fields of a `--query-compute-apps` list.
pub struct AppFields(Vec<&'static AppField>);

impl AppFields {
    /// Parses `pid,process_name,...`; the error is the real tool's line for the first
    /// field it does not know (as `--query-gpu`'s).
    pub fn parse(list: &str) -> Result<AppFields, String> {
        find_all(APP_FIELDS, list, |f| (f.name, f.aliases)).map(AppFields)
    }
}

/// `--query-compute-apps`'s CSV: the header, then one line per compute process of the GPUs
/// at `indexes` (MPS clients included, each with its own memory), in NVML's order.
pub fn render_apps(node: &Node, indexes: &[usize], fields: &AppFields, format: Format) -> String {
    let mut text = String::new();
    if format.header {
        text.push_str(&header(fields.0.iter().map(|f| (f.name, f.unit))));
    }
    for &index in indexes {
        for process in rules::processes(node, index as u32, None).unwrap_or_default() {
            let values: Vec<String> = fields
                .0
                .iter()
                .map(|f| {
                    let value = (f.value)(node, index, &process);
                    match f.unit {
                        Some(unit) if format.units => format!("{value} {unit}"),
                        _ => value,
                    }
                })
                .collect();
            text.push_str(&values.join(", "));
            text.push('\n');
        }
    }
    text
}
