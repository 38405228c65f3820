//! `nvidia-smi mig`: the GPU- and compute-instance tables and profiles, and creating and
//! destroying instances, on the node under its lock through the driver's rules
//! ([`gpushare_sim_nvml::rules`]), so that NVML sees what nvidia-smi made and the reverse.

use std::fmt::Write as _;

use gpushare_catalog::MigProfile;
use gpushare_sim_nvml::abi::types::{nvmlReturn_t, ret};
use gpushare_sim_nvml::node::{Gpu, GpuInstance, Node};
use gpushare_sim_nvml::rules::{self, CiProfile};

use crate::{
    EXIT_INVALID_ARGUMENT, EXIT_NOT_FOUND, Env, INVALID_COMBINATION, Out, exit_status, ids,
    node_file, read_node, smi_message, split_inline, unrecognized, update_node,
};

/// `nvidia-smi mig` without a command: the real tool's first lines, then our list.
const MIG_HELP: &str = "
    mig -- Multi Instance GPU management.

    Usage: nvidia-smi mig [options]

    Options include (as simulated by gpushare):
    [-i | --id]: GPU device IDs (index, UUID or PCI bus ID), comma separated
    [-gi | --gpu-instance-id]: GPU instance IDs, comma separated
    [-ci | --compute-instance-id]: compute instance IDs, comma separated
    [-lgi | --list-gpu-instances]: list GPU instances
    [-lgip | --list-gpu-instance-profiles]: list GPU instance profiles
    [-lgipp | --list-gpu-instance-possible-placements]: list their placements
    [-lci | --list-compute-instances]: list compute instances
    [-lcip | --list-compute-instance-profiles]: list compute instance profiles
    [-cgi | --create-gpu-instance] LIST: create GPU instances of these profiles
                                         (IDs or names, e.g. 9,3g.20gb,MIG 1g.5gb)
    [-C | --default-compute-instance]: with -cgi, also create each one's default
                                       compute instance
    [-cci | --create-compute-instance] [LIST]: create compute instances (the
                                               default one without LIST)
    [-dgi | --destroy-gpu-instance]: destroy GPU instances
    [-dci | --destroy-compute-instance]: destroy compute instances
    [-h | --help]: Display help information

";

const NO_MIG_DEVICES: &str = "No MIG-enabled devices found.";
const NO_MIG_SUPPORT: &str = "No MIG-supported devices found.";
const NO_GPU_INSTANCES: &str = "No GPU instances found: Not Found";
const NO_COMPUTE_INSTANCES: &str = "No compute instances found: Not Found";

/// The one thing a `mig` invocation does.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Command {
    ListGi,
    ListGiProfiles,
    ListGiPlacements,
    ListCi,
    ListCiProfiles,
    CreateGi(String),
    CreateCi(Option<String>),
    DestroyGi,
    DestroyCi,
}

#[derive(Default)]
struct Args {
    ids: Option<String>,
    gi: Option<String>,
    ci: Option<String>,
    default_ci: bool,
    help: bool,
    commands: Vec<Command>,
}

/// Instance ids of `-gi` / `-ci`: `None` when not given.
type Filter = Option<Vec<u32>>;

fn parse_filter(text: Option<&str>) -> Result<Filter, ()> {
    text.map(|t| t.split(',').map(|id| id.trim().parse::<u32>().map_err(|_| ())).collect())
        .transpose()
}

fn admits(filter: &Filter, id: u32) -> bool {
    filter.as_ref().is_none_or(|ids| ids.contains(&id))
}

/// The ids of `g`'s GPU instances that `filter` admits, ascending.
fn gpu_instance_ids(g: &Gpu, filter: &Filter) -> Vec<u32> {
    let mut ids: Vec<u32> =
        g.instances.iter().map(|gi| gi.id).filter(|&id| admits(filter, id)).collect();
    ids.sort_unstable();
    ids
}

/// `nvidia-smi mig ...`.
pub fn run(args: &[String], env: &Env, out: &mut Out<'_>) -> u8 {
    let mut parsed = Args::default();
    let mut rest = args.iter().peekable();
    while let Some(arg) = rest.next() {
        let (name, inline) = split_inline(arg);
        let value = |rest: &mut std::iter::Peekable<std::slice::Iter<'_, String>>| {
            inline.map(str::to_string).or_else(|| rest.next().cloned())
        };
        let missing = |out: &mut Out<'_>| {
            // The real tool's words, and its exit status 0.
            let _ = writeln!(out.out, "Option \"{name}\" is missing its value.");
            0
        };
        match name {
            "-i" | "--id" => match value(&mut rest) {
                Some(v) => parsed.ids = Some(v),
                None => return missing(out),
            },
            "-gi" | "--gpu-instance-id" => match value(&mut rest) {
                Some(v) => parsed.gi = Some(v),
                None => return missing(out),
            },
            "-ci" | "--compute-instance-id" => match value(&mut rest) {
                Some(v) => parsed.ci = Some(v),
                None => return missing(out),
            },
            "-cgi" | "--create-gpu-instance" => match value(&mut rest) {
                Some(v) => parsed.commands.push(Command::CreateGi(v)),
                None => return missing(out),
            },
            "-cci" | "--create-compute-instance" => {
                // The list is optional: without one, each GPU instance's default.
                let list = inline
                    .map(str::to_string)
                    .or_else(|| rest.next_if(|next| !next.starts_with('-')).cloned());
                parsed.commands.push(Command::CreateCi(list));
            }
            _ if inline.is_some() => return unrecognized(out, arg),
            "-lgi" | "--list-gpu-instances" => parsed.commands.push(Command::ListGi),
            "-lgip" | "--list-gpu-instance-profiles" => {
                parsed.commands.push(Command::ListGiProfiles)
            }
            "-lgipp" | "--list-gpu-instance-possible-placements" => {
                parsed.commands.push(Command::ListGiPlacements)
            }
            "-lci" | "--list-compute-instances" => parsed.commands.push(Command::ListCi),
            "-lcip" | "--list-compute-instance-profiles" => {
                parsed.commands.push(Command::ListCiProfiles)
            }
            "-dgi" | "--destroy-gpu-instance" => parsed.commands.push(Command::DestroyGi),
            "-dci" | "--destroy-compute-instance" => parsed.commands.push(Command::DestroyCi),
            "-C" | "--default-compute-instance" => parsed.default_ci = true,
            "-h" | "--help" => parsed.help = true,
            _ => return unrecognized(out, arg),
        }
    }
    if parsed.help || parsed.commands.is_empty() && !parsed.default_ci {
        let _ = write!(out.out, "{MIG_HELP}");
        return 0;
    }
    let invalid = |out: &mut Out<'_>| {
        let _ = writeln!(out.out, "{INVALID_COMBINATION}");
        EXIT_INVALID_ARGUMENT
    };
    let [command] = &parsed.commands[..] else { return invalid(out) };
    if parsed.default_ci && !matches!(command, Command::CreateGi(_)) {
        return invalid(out);
    }
    let (Ok(gi), Ok(ci)) = (parse_filter(parsed.gi.as_deref()), parse_filter(parsed.ci.as_deref()))
    else {
        return invalid(out);
    };
    let file = match node_file(env, out) {
        Ok(file) => file,
        Err(status) => return status,
    };
    let ids = parsed.ids.as_deref();
    let listing = |out: &mut Out<'_>, list: fn(&Node, &[usize], &Filter, &Filter) -> Listed| {
        let node = match read_node(&file, out) {
            Ok(node) => node,
            Err(status) => return status,
        };
        let Some(chosen) = ids::select(&node, ids) else { return crate::no_devices(out) };
        let indexes: Vec<usize> = chosen.into_iter().map(|(i, _)| i).collect();
        let (text, status) = list(&node, &indexes, &gi, &ci);
        let _ = write!(out.out, "{text}");
        status
    };
    match command {
        Command::ListGiProfiles => listing(out, |n, i, _, _| gi_profiles(n, i)),
        Command::ListGiPlacements => listing(out, |n, i, _, _| gi_placements(n, i)),
        Command::ListGi => listing(out, gpu_instances),
        Command::ListCi => listing(out, compute_instances),
        Command::ListCiProfiles => listing(out, |n, i, gi, _| ci_profiles(n, i, gi)),
        Command::CreateGi(list) => update_node(&file, out, |node, out| {
            let Some(targets) = targets(node, ids) else { return crate::no_devices(out) };
            create_gpu_instances(node, &targets, list, parsed.default_ci, out)
        }),
        Command::CreateCi(list) => update_node(&file, out, |node, out| {
            let Some(targets) = targets(node, ids) else { return crate::no_devices(out) };
            create_compute_instances(node, &targets, &gi, list.as_deref(), out)
        }),
        Command::DestroyGi => update_node(&file, out, |node, out| {
            let Some(targets) = targets(node, ids) else { return crate::no_devices(out) };
            destroy_gpu_instances(node, &targets, &gi, out)
        }),
        Command::DestroyCi => update_node(&file, out, |node, out| {
            let Some(targets) = targets(node, ids) else { return crate::no_devices(out) };
            destroy_compute_instances(node, &targets, &gi, &ci, out)
        }),
    }
}

/// A listing's text and exit status.
type Listed = (String, u8);

/// The GPUs a command acts on: those `-i` names, or every MIG-enabled GPU without `-i`.
/// `None` when `-i` names no GPU.
fn targets(node: &Node, ids: Option<&str>) -> Option<Vec<usize>> {
    let chosen = ids::select(node, ids)?;
    Some(
        chosen
            .into_iter()
            .map(|(i, _)| i)
            .filter(|&i| ids.is_some() || node.gpus[i].mig_enabled)
            .collect(),
    )
}

/// The GPUs among `indexes` with MIG on.
fn mig_enabled(node: &Node, indexes: &[usize]) -> Vec<usize> {
    indexes.iter().copied().filter(|&i| node.gpus[i].mig_enabled).collect()
}

/// A GPU's instances as nvidia-smi lists them: by profile (in `-lgip`'s order), then id.
fn listed_instances(g: &Gpu) -> Vec<&GpuInstance> {
    let order = |id: u32| g.model().mig_profiles.iter().position(|p| p.id == id);
    let mut gis: Vec<&GpuInstance> = g.instances.iter().collect();
    gis.sort_by_key(|gi| (order(gi.profile_id), gi.id));
    gis
}

/// A compute-instance profile's name in a GPU instance of `gi`: the GPU instance's own
/// name when it takes all of its compute slices, else `<n>c.<gi>` (`1c.3g.20gb`).
fn ci_name(gi: &MigProfile, ci: &CiProfile) -> String {
    if ci.slices >= gi.compute_slices {
        format!("MIG {}", gi.name)
    } else {
        format!("MIG {}c.{}", ci.slices, gi.name)
    }
}

/// The compute-instance profile `-C` and a bare `-cci` create: all of the GPU instance,
/// with all its SMs (marked `*` in `-lcip`).
fn default_ci(gi: &MigProfile, profiles: &[CiProfile]) -> Option<CiProfile> {
    profiles
        .iter()
        .copied()
        .find(|p| p.slices == gi.compute_slices && p.sms == gi.sms)
        .or_else(|| profiles.iter().copied().max_by_key(|p| (p.slices, p.sms)))
}

// ---------------------------------------------------------------------------------------
// Listings

const LGIP_HEAD: &str = "\
+-------------------------------------------------------------------------------+
| GPU instance profiles:                                                        |
| GPU   Name               ID    Instances   Memory     P2P    SM    DEC   ENC  |
|                                Free/Total   GiB              CE    JPEG  OFA  |
|===============================================================================|
";
const LGIP_BORDER: &str =
    "+-------------------------------------------------------------------------------+\n";

/// `-lgip`: every profile of every MIG-capable GPU, free as the driver counts it (all of
/// them while MIG is off, as the real H100 showed).
fn gi_profiles(node: &Node, indexes: &[usize]) -> Listed {
    let capable: Vec<usize> =
        indexes.iter().copied().filter(|&i| node.gpus[i].model().supports_mig()).collect();
    if capable.is_empty() {
        return (format!("{NO_MIG_SUPPORT}\n"), 0);
    }
    let mut text = String::from(LGIP_HEAD);
    for index in capable {
        let g = &node.gpus[index];
        for p in &g.model().mig_profiles {
            let free = if g.mig_enabled {
                rules::remaining_capacity(g, p.id).unwrap_or(0)
            } else {
                u32::from(p.max_count)
            };
            let e = p.engines;
            let name = format!("MIG {}", p.name);
            let memory = format!("{:.2}", p.memory_mib as f64 / 1024.0);
            let _ = writeln!(
                text,
                "|{index:>4}  {name:<18}{:>4}{free:>6}/{:<9}{memory:<11}{:<7}{:<7}{:<6}{:<4}|",
                p.id, p.max_count, "No", p.sms, e.decoders, e.encoders
            );
            let _ = writeln!(text, "|{:62}{:>2}{:5}{:<6}{:<4}|", "", e.copy, "", e.jpeg, e.ofa);
            text.push_str(LGIP_BORDER);
        }
    }
    (text, 0)
}

/// `-lgipp`: each profile's possible starts and its size in memory slots.
fn gi_placements(node: &Node, indexes: &[usize]) -> Listed {
    let mut text = String::new();
    for &index in indexes {
        for p in &node.gpus[index].model().mig_profiles {
            let starts: Vec<String> = p.placements.iter().map(u8::to_string).collect();
            let label = if starts.len() == 1 { "Placement " } else { "Placements" };
            let _ = writeln!(
                text,
                "GPU {index:>2} Profile ID {:>2} {label}: {{{}}}:{}",
                p.id,
                starts.join(","),
                p.memory_slices
            );
        }
    }
    if text.is_empty() {
        return (format!("{NO_MIG_SUPPORT}\n"), 0);
    }
    (text, 0)
}

const LGI_HEAD: &str = "\
+---------------------------------------------------------+
| GPU instances:                                          |
| GPU   Name               Profile  Instance   Placement  |
|                            ID       ID       Start:Size |
|=========================================================|
";
const LGI_BORDER: &str = "+---------------------------------------------------------+\n";

/// `-lgi [-gi IDS]`.
fn gpu_instances(node: &Node, indexes: &[usize], gi_filter: &Filter, _: &Filter) -> Listed {
    let enabled = mig_enabled(node, indexes);
    if enabled.is_empty() {
        return (format!("{NO_MIG_DEVICES}\n"), 0);
    }
    let mut text = String::from(LGI_HEAD);
    let mut rows = 0;
    for index in enabled {
        let g = &node.gpus[index];
        for gi in listed_instances(g).into_iter().filter(|gi| admits(gi_filter, gi.id)) {
            let name = format!("MIG {}", rules::profile_of(g, gi).name);
            let _ = writeln!(
                text,
                "|{index:>4}  {name:<20}{:>4}{:>9}{:>11}:{:<5} |",
                gi.profile_id, gi.id, gi.start, gi.size
            );
            text.push_str(LGI_BORDER);
            rows += 1;
        }
    }
    if rows == 0 {
        return (format!("{NO_GPU_INSTANCES}\n"), EXIT_NOT_FOUND);
    }
    (text, 0)
}

const LCI_HEAD: &str = "\
+--------------------------------------------------------------------+
| Compute instances:                                                 |
| GPU     GPU       Name             Profile   Instance   Placement  |
|       Instance                       ID        ID       Start:Size |
|         ID                                                         |
|====================================================================|
";
const LCI_BORDER: &str = "+--------------------------------------------------------------------+\n";

/// `-lci [-gi IDS] [-ci IDS]`.
fn compute_instances(node: &Node, indexes: &[usize], gi_filter: &Filter, ci: &Filter) -> Listed {
    let enabled = mig_enabled(node, indexes);
    if enabled.is_empty() {
        return (format!("{NO_MIG_DEVICES}\n"), 0);
    }
    let mut text = String::from(LCI_HEAD);
    let (mut gis, mut rows) = (0, 0);
    for index in enabled {
        let g = &node.gpus[index];
        for gi in listed_instances(g).into_iter().filter(|gi| admits(gi_filter, gi.id)) {
            gis += 1;
            let gi_profile = rules::profile_of(g, gi);
            let mut cis: Vec<_> =
                gi.compute_instances.iter().filter(|c| admits(ci, c.id)).collect();
            cis.sort_by_key(|c| c.id);
            for c in cis {
                let name = match rules::ci_profile(g, gi, c.profile_id) {
                    Ok(p) => ci_name(gi_profile, &p),
                    Err(_) => format!("MIG {}", gi_profile.name),
                };
                let _ = writeln!(
                    text,
                    "|{index:>4}{:>7}{:7}{name:<17}{:>5}{:>10}{:>11}:{:<5} |",
                    gi.id, "", c.profile_id, c.id, c.start, c.size
                );
                text.push_str(LCI_BORDER);
                rows += 1;
            }
        }
    }
    match (gis, rows) {
        (0, _) => (format!("{NO_GPU_INSTANCES}\n"), EXIT_NOT_FOUND),
        (_, 0) => (format!("{NO_COMPUTE_INSTANCES}\n"), EXIT_NOT_FOUND),
        _ => (text, 0),
    }
}

const LCIP_HEAD: &str = "\
+--------------------------------------------------------------------------------------+
| Compute instance profiles:                                                           |
| GPU     GPU       Name             Profile  Instances   Exclusive       Shared       |
|       Instance                       ID     Free/Total     SM       DEC   ENC   OFA  |
|         ID                                                          CE    JPEG       |
|======================================================================================|
";
const LCIP_BORDER: &str =
    "+--------------------------------------------------------------------------------------+\n";

/// How many more compute instances of `profile` the GPU instance takes: tried on a copy
/// of the node, so the count is the driver's own.
fn ci_free(node: &Node, index: usize, gi: u32, profile: &CiProfile) -> u32 {
    let mut trial = node.clone();
    let mut free = 0;
    while free < profile.instance_count
        && rules::create_compute_instance(&mut trial, index as u32, gi, profile.nvml_enum).is_ok()
    {
        free += 1;
    }
    free
}

/// `-lcip [-gi IDS]`: each GPU instance's compute-instance profiles, the default one
/// marked `*`; the shared engines are the GPU instance's.
fn ci_profiles(node: &Node, indexes: &[usize], gi_filter: &Filter) -> Listed {
    let enabled = mig_enabled(node, indexes);
    if enabled.is_empty() {
        return (format!("{NO_MIG_DEVICES}\n"), 0);
    }
    let mut text = String::from(LCIP_HEAD);
    let mut rows = 0;
    for index in enabled {
        let g = &node.gpus[index];
        for gi in listed_instances(g).into_iter().filter(|gi| admits(gi_filter, gi.id)) {
            let gi_profile = rules::profile_of(g, gi);
            let profiles = rules::ci_profiles(g.model(), gi_profile);
            let default = default_ci(gi_profile, &profiles);
            let e = gi_profile.engines;
            for p in &profiles {
                let star = if Some(*p) == default { "*" } else { " " };
                let free = ci_free(node, index, gi.id, p);
                let _ = writeln!(
                    text,
                    "|{index:>4}{:>7}{:7}{:<17}{:>5}{star}{free:>6}/{:<12}{:<10}{:<6}{:<6}{:<4}|",
                    gi.id,
                    "",
                    ci_name(gi_profile, p),
                    p.nvml_enum,
                    p.instance_count,
                    p.sms,
                    e.decoders,
                    e.encoders,
                    e.ofa
                );
                let _ = writeln!(text, "|{:70}{:<6}{:<6}{:4}|", "", e.copy, e.jpeg, "");
                text.push_str(LCIP_BORDER);
                rows += 1;
            }
        }
    }
    if rows == 0 {
        return (format!("{NO_GPU_INSTANCES}\n"), EXIT_NOT_FOUND);
    }
    (text, 0)
}

// ---------------------------------------------------------------------------------------
// Changes

/// Says why an operation failed as nvidia-smi does ("Unable to …", then "Failed to …") and
/// returns its exit status.
fn failed(out: &mut Out<'_>, unable: String, what: &str, code: nvmlReturn_t) -> u8 {
    let message = smi_message(code);
    let _ = writeln!(out.out, "{unable}: {message}");
    let _ = writeln!(out.out, "Failed to {what}: {message}");
    exit_status(code)
}

/// A GPU-instance profile named as `-cgi` takes it: its id, its name, or `MIG <name>`.
fn gi_profile_named(g: &Gpu, token: &str) -> Option<&'static MigProfile> {
    let model = g.model();
    match token.parse::<u32>() {
        Ok(id) => model.profile_by_id(id),
        Err(_) => model.profile_by_name(token.strip_prefix("MIG ").unwrap_or(token).trim()),
    }
}

/// Creates the default compute instance of a new GPU instance (`-C`), saying so.
fn create_default_ci(node: &mut Node, index: usize, gi_id: u32, out: &mut Out<'_>) -> u8 {
    let g = &node.gpus[index];
    let Some(gi) = g.instance(gi_id) else { return exit_status(ret::INVALID_ARGUMENT) };
    let gi_profile = rules::profile_of(g, gi);
    let Some(profile) = default_ci(gi_profile, &rules::ci_profiles(g.model(), gi_profile)) else {
        return exit_status(ret::NOT_SUPPORTED);
    };
    create_ci(node, index, gi_id, gi_profile, profile, &profile.nvml_enum.to_string(), out)
}

/// Creates one compute instance, saying so or why not.
fn create_ci(
    node: &mut Node,
    index: usize,
    gi_id: u32,
    gi_profile: &MigProfile,
    profile: CiProfile,
    token: &str,
    out: &mut Out<'_>,
) -> u8 {
    match rules::create_compute_instance(node, index as u32, gi_id, profile.nvml_enum) {
        Ok(ci) => {
            let _ = writeln!(
                out.out,
                "Successfully created compute instance ID {ci:>2} on GPU {index:>2} GPU instance \
                 ID {gi_id:>2} using profile {} (ID {:>2})",
                ci_name(gi_profile, &profile),
                profile.nvml_enum
            );
            0
        }
        Err(code) => failed(
            out,
            format!(
                "Unable to create a compute instance on GPU {index:>2} GPU instance ID \
                 {gi_id:>2} using profile {token}"
            ),
            "create compute instances",
            code,
        ),
    }
}

/// `-cgi LIST [-C]`: on each target GPU, each profile of the list in turn, where the
/// driver would place it ([`rules::driver_placement`]); stops at the first failure.
fn create_gpu_instances(
    node: &mut Node,
    targets: &[usize],
    list: &str,
    default_ci: bool,
    out: &mut Out<'_>,
) -> u8 {
    if targets.is_empty() {
        let _ = writeln!(out.out, "{NO_MIG_DEVICES}");
        return EXIT_NOT_FOUND;
    }
    let tokens: Vec<&str> = list.split(',').map(str::trim).collect();
    for &index in targets {
        for &token in &tokens {
            let g = &node.gpus[index];
            let created = match gi_profile_named(g, token) {
                // A GPU without MIG answers so before any profile is looked at.
                _ if !g.model().supports_mig() => Err(ret::NOT_SUPPORTED),
                None => Err(ret::INVALID_ARGUMENT),
                Some(profile) => rules::driver_placement(g, profile.id).and_then(|start| {
                    rules::create_gpu_instance(
                        node,
                        index as u32,
                        profile.id,
                        u32::from(start),
                        u32::from(profile.memory_slices),
                    )
                    .map(|id| (id, profile))
                }),
            };
            let (gi_id, profile) = match created {
                Ok(created) => created,
                Err(code) => {
                    let unable = format!(
                        "Unable to create a GPU instance on GPU {index:>2} using profile {token}"
                    );
                    return failed(out, unable, "create GPU instances", code);
                }
            };
            let _ = writeln!(
                out.out,
                "Successfully created GPU instance ID {gi_id:>2} on GPU {index:>2} using profile \
                 MIG {} (ID {:>2})",
                profile.name, profile.id
            );
            if default_ci {
                let status = create_default_ci(node, index, gi_id, out);
                if status != 0 {
                    return status;
                }
            }
        }
    }
    0
}

/// `-cci [LIST] [-gi IDS]`: in each GPU instance named (all without `-gi`), the compute
/// instances of the list (profile ids or names), or the default one.
fn create_compute_instances(
    node: &mut Node,
    targets: &[usize],
    gi_filter: &Filter,
    list: Option<&str>,
    out: &mut Out<'_>,
) -> u8 {
    let mut found = false;
    for &index in targets {
        let gi_ids = gpu_instance_ids(&node.gpus[index], gi_filter);
        for gi_id in gi_ids {
            found = true;
            let g = &node.gpus[index];
            let Some(gi) = g.instance(gi_id) else { continue };
            let gi_profile = rules::profile_of(g, gi);
            let profiles = rules::ci_profiles(g.model(), gi_profile);
            let Some(list) = list else {
                let status = create_default_ci(node, index, gi_id, out);
                if status != 0 {
                    return status;
                }
                continue;
            };
            for token in list.split(',').map(str::trim) {
                let named = match token.parse::<u32>() {
                    Ok(id) => {
                        let g = &node.gpus[index];
                        g.instance(gi_id)
                            .ok_or(ret::INVALID_ARGUMENT)
                            .and_then(|gi| rules::ci_profile(g, gi, id))
                    }
                    Err(_) => {
                        let name = if token.starts_with("MIG ") {
                            token.to_string()
                        } else {
                            format!("MIG {token}")
                        };
                        profiles
                            .iter()
                            .copied()
                            .find(|p| ci_name(gi_profile, p) == name)
                            .ok_or(ret::INVALID_ARGUMENT)
                    }
                };
                let status = match named {
                    Ok(profile) => create_ci(node, index, gi_id, gi_profile, profile, token, out),
                    Err(code) => failed(
                        out,
                        format!(
                            "Unable to create a compute instance on GPU {index:>2} GPU instance \
                             ID {gi_id:>2} using profile {token}"
                        ),
                        "create compute instances",
                        code,
                    ),
                };
                if status != 0 {
                    return status;
                }
            }
        }
    }
    if !found {
        let _ = writeln!(out.out, "{NO_GPU_INSTANCES}");
        return EXIT_NOT_FOUND;
    }
    0
}

/// `-dgi [-gi IDS]`: by id, stopping at the first the driver refuses.
fn destroy_gpu_instances(
    node: &mut Node,
    targets: &[usize],
    gi_filter: &Filter,
    out: &mut Out<'_>,
) -> u8 {
    let mut found = false;
    for &index in targets {
        let gi_ids = gpu_instance_ids(&node.gpus[index], gi_filter);
        for gi_id in gi_ids {
            found = true;
            if let Err(code) = rules::destroy_gpu_instance(node, index as u32, gi_id) {
                let unable =
                    format!("Unable to destroy GPU instance ID {gi_id:>2} from GPU {index:>2}");
                return failed(out, unable, "destroy GPU instances", code);
            }
            let _ = writeln!(
                out.out,
                "Successfully destroyed GPU instance ID {gi_id:>2} from GPU {index:>2}"
            );
        }
    }
    if !found {
        let _ = writeln!(out.out, "{NO_GPU_INSTANCES}");
        return EXIT_NOT_FOUND;
    }
    0
}

/// `-dci [-gi IDS] [-ci IDS]`: by GPU instance id, then compute instance id, stopping at
/// the first the driver refuses.
fn destroy_compute_instances(
    node: &mut Node,
    targets: &[usize],
    gi_filter: &Filter,
    ci_filter: &Filter,
    out: &mut Out<'_>,
) -> u8 {
    let (mut gis, mut cis) = (0, 0);
    for &index in targets {
        let mut pairs: Vec<(u32, u32)> = node.gpus[index]
            .instances
            .iter()
            .filter(|gi| admits(gi_filter, gi.id))
            .inspect(|_| gis += 1)
            .flat_map(|gi| {
                gi.compute_instances
                    .iter()
                    .filter(|ci| admits(ci_filter, ci.id))
                    .map(move |ci| (gi.id, ci.id))
            })
            .collect();
        pairs.sort_unstable();
        for (gi_id, ci_id) in pairs {
            cis += 1;
            if let Err(code) = rules::destroy_compute_instance(node, index as u32, gi_id, ci_id) {
                let unable = format!(
                    "Unable to destroy compute instance ID {ci_id:>2} from GPU {index:>2} GPU \
                     instance ID {gi_id:>2}"
                );
                return failed(out, unable, "destroy compute instances", code);
            }
            let _ = writeln!(
                out.out,
                "Successfully destroyed compute instance ID {ci_id:>2} from GPU {index:>2} GPU \
                 instance ID {gi_id:>2}"
            );
        }
    }
    let none = match (gis, cis) {
        (0, _) => NO_GPU_INSTANCES,
        (_, 0) => NO_COMPUTE_INSTANCES,
        _ => return 0,
    };
    let _ = writeln!(out.out, "{none}");
    EXIT_NOT_FOUND
}
