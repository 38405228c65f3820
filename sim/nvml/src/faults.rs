//! The simulator's knobs, read from the environment at the first `nvmlInit` of a process.
//!
//! - `GPUSHARE_SIM_FAIL="<name>:<n>[=<NVML_ERROR_X>][,...]"`: the n-th call (1-based,
//!   counted per process) of that exported NVML function fails, with the code the real
//!   driver gives for causes outside the caller's control ([`default_code`]) unless
//!   `=NVML_ERROR_X` names one. `<name>` may also be a tool action ([`TOOL_ACTIONS`]),
//!   counted by the simulated nvidia-smi in the node file.
//! - `GPUSHARE_SIM_DELAY_MS=<ms>`: every mutating call sleeps this long first.
//! - `GPUSHARE_SIM_PROCESSES="<gpu>[/<gpu instance id>]:<pid>[=<size>],..."`: compute
//!   processes ([`parse_processes`]), each using `<size>` of GPU memory ([`parse_size`]:
//!   bytes, or a number with `K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB`: `1536MiB`,
//!   `2GiB`), 512 MiB without. A PID that runs in the declaring process's PID namespace
//!   is listed while it runs, as the real driver drops an ended process; one that does
//!   not stands for a process of another PID namespace (a container's, which the host's
//!   driver lists by its host PID) and is listed until the knob changes. Set, even empty, it
//!   replaces the processes it declared before; those the simulated MPS control daemon
//!   registered stay (while their PID lives). Each entry must be a state the real driver
//!   can have ([`check_processes`]), on the node as the session finds it (after
//!   `GPUSHARE_SIM_REBOOT`, which leaves no GPU instances): the GPU exists; on a GPU in
//!   MIG mode the process runs in one of its existing GPU instances (`<gpu>/<gi>`), on a
//!   GPU without MIG in none (`<gpu>`). An entry that breaks this fails `nvmlInit` as any
//!   malformed knob does (NVML_ERROR_UNKNOWN, the entry and the reason on stderr and in
//!   `gpushare_sim_last_error`), and nothing of the session is applied.
//! - `GPUSHARE_SIM_REBOOT=1|0`: start as after a reboot.
//! - `GPUSHARE_SIM_HOST="<fact>[,...]"`: the host around the GPUs, as far as GPU resets
//!   care ([`parse_host`]): `passthrough[=<gpus>]` and `vgpu[=<gpus>]` (NVML's
//!   virtualization mode), `no-flr[=<gpus>]` (PCI functions without function-level
//!   reset), `nvidia-drm.modeset=1|0` (`nvidia_drm` loaded, with or without modesetting),
//!   `nvswitches=<n>` and `fabric-manager=running|stopped`; and, for a bench's pinning,
//!   `numa:<gpus>=<cpus>`: the host has several NUMA nodes and those GPUs sit on one
//!   whose CPUs are `<cpus>`, a CPU list with `+` for its commas (`numa:0=0-3+8`; see
//!   [`crate::host`] for the files). `<gpus>`: indexes joined by `+` (`0+2`); without,
//!   every GPU. Set, even empty, it replaces what the node's host was (bare metal, FLR on
//!   every GPU, no `nvidia_drm`, no NVSwitch, Fabric Manager running where there are
//!   NVSwitches, one NUMA node); unset, the node keeps it.

use std::time::Duration;

use crate::codes::{nvmlReturn_t, ret};
use crate::node::{FabricManager, Host, Node, NvidiaDrm, Process, VirtualizationMode};

/// `GPUSHARE_SIM_FAIL`.
pub const FAIL_ENV: &str = "GPUSHARE_SIM_FAIL";
/// `GPUSHARE_SIM_DELAY_MS`.
pub const DELAY_ENV: &str = "GPUSHARE_SIM_DELAY_MS";
/// `GPUSHARE_SIM_PROCESSES`.
pub const PROCESSES_ENV: &str = "GPUSHARE_SIM_PROCESSES";
/// `GPUSHARE_SIM_REBOOT`.
pub const REBOOT_ENV: &str = "GPUSHARE_SIM_REBOOT";
/// `GPUSHARE_SIM_HOST`.
pub const HOST_ENV: &str = "GPUSHARE_SIM_HOST";

/// Tool actions that `GPUSHARE_SIM_FAIL` may name; the simulated nvidia-smi counts them.
pub const TOOL_ACTIONS: &[&str] = &["gpu-reset", "set-timeslice"];

/// Every function of nvml.h the library exports (the list its stubs are generated from):
/// each one, modelled or not, counts its calls and may be failed.
const NVML_FUNCTIONS: &str = include_str!("../abi/nvml-functions.txt");

/// Whether `name` is a function of nvml.h.
pub fn is_nvml_function(name: &str) -> bool {
    NVML_FUNCTIONS.lines().any(|l| l.trim() == name)
}

/// One injected failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The exported NVML function or tool action.
    pub name: String,
    /// Which call fails, 1-based.
    pub nth: u32,
    /// The code it fails with; `None`: [`default_code`].
    pub code: Option<u32>,
}

impl Failure {
    /// The code this failure answers.
    pub fn code(&self) -> nvmlReturn_t {
        self.code.unwrap_or_else(|| default_code(&self.name))
    }
}

/// The code the real driver gives when this call fails for reasons outside the caller's
/// control: creations run out of resources, destroys and MIG mode changes find the GPU in
/// use, mode setters lack permission, anything else is an unknown error.
pub fn default_code(name: &str) -> nvmlReturn_t {
    match name {
        "nvmlDeviceCreateGpuInstanceWithPlacement" | "nvmlGpuInstanceCreateComputeInstance" => {
            ret::INSUFFICIENT_RESOURCES
        }
        "nvmlGpuInstanceDestroy" | "nvmlComputeInstanceDestroy" | "nvmlDeviceSetMigMode" => {
            ret::IN_USE
        }
        "nvmlDeviceSetComputeMode" | "nvmlDeviceSetPersistenceMode" => ret::NO_PERMISSION,
        "gpu-reset" => ret::IN_USE,
        "set-timeslice" => ret::NO_PERMISSION,
        _ => ret::UNKNOWN,
    }
}

/// The code of the failure injected for the `n`-th call of `name`, if any.
pub fn fires(failures: &[Failure], name: &str, n: u32) -> Option<nvmlReturn_t> {
    failures.iter().find(|f| f.nth == n && f.name == name).map(Failure::code)
}

/// Parses `GPUSHARE_SIM_FAIL`'s value.
pub fn parse(text: &str) -> Result<Vec<Failure>, String> {
    text.split(',').map(str::trim).filter(|p| !p.is_empty()).map(parse_one).collect()
}

fn parse_one(part: &str) -> Result<Failure, String> {
    let (spec, code) = match part.split_once('=') {
        Some((spec, code)) => (spec.trim(), Some(code.trim())),
        None => (part, None),
    };
    let (name, nth) = spec
        .split_once(':')
        .ok_or_else(|| format!("{FAIL_ENV}: {part:?}: write <function>:<n>[=<NVML_ERROR_X>]"))?;
    let name = name.trim();
    if !is_nvml_function(name) && !TOOL_ACTIONS.contains(&name) {
        return Err(format!(
            "{FAIL_ENV}: {part:?}: unknown function {name:?}: name a function of nvml.h (nvmlDeviceSetMigMode) or a tool action ({})",
            TOOL_ACTIONS.join(", ")
        ));
    }
    let nth = match nth.trim().parse::<u32>() {
        Ok(n) if n >= 1 => n,
        _ => return Err(format!("{FAIL_ENV}: {part:?}: n must be a number from 1")),
    };
    let code = match code {
        None => None,
        Some(c) => match ret::by_name(c) {
            Some(ret::SUCCESS) | None => {
                return Err(format!(
                    "{FAIL_ENV}: {part:?}: unknown return code {c:?}: write an nvml.h name such as NVML_ERROR_GPU_IS_LOST"
                ));
            }
            Some(code) => Some(code),
        },
    };
    Ok(Failure { name: name.to_string(), nth, code })
}

/// Reads `GPUSHARE_SIM_FAIL` (none when unset or empty).
pub fn from_env() -> Result<Vec<Failure>, String> {
    match var(FAIL_ENV) {
        Some(v) => parse(&v),
        None => Ok(Vec::new()),
    }
}

/// Parses `GPUSHARE_SIM_PROCESSES`'s value: `<gpu>[/<gpu instance id>]:<pid>[=<size>][,...]`
/// (`<size>` as [`parse_size`] reads it; 512 MiB without). Whether the entries fit the
/// node (its GPUs, their MIG mode and GPU instances) is [`check_processes`]'s to say.
pub fn parse_processes(text: &str) -> Result<Vec<Process>, String> {
    let bad = |part: &str| format!("{PROCESSES_ENV}: {part:?}: write <gpu>[/<gi>]:<pid>[=<size>]");
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|part| {
            let (place, rest) = part.split_once(':').ok_or_else(|| bad(part))?;
            let (gpu, gi) = match place.split_once('/') {
                Some((g, i)) => (g, Some(i.trim().parse().map_err(|_| bad(part))?)),
                None => (place, None),
            };
            let (pid, size) = match rest.split_once('=') {
                Some((pid, size)) => (pid, Some(size)),
                None => (rest, None),
            };
            let mut process = Process::new(
                gpu.trim().parse().map_err(|_| bad(part))?,
                gi,
                pid.trim().parse().map_err(|_| bad(part))?,
            );
            if let Some(size) = size {
                process.memory =
                    parse_size(size).map_err(|e| format!("{PROCESSES_ENV}: {part:?}: {e}"))?;
            }
            Ok(process)
        })
        .collect()
}

/// Checks `GPUSHARE_SIM_PROCESSES`'s processes against the node they are declared on, as
/// the real driver could have them: the GPU exists; on a GPU in MIG mode every compute
/// process runs in one of its GPU instances (`<gpu>/<gi>`), and on one without MIG none
/// does (`<gpu>`). The first entry that breaks this is a one-line error naming it and why.
pub fn check_processes(processes: &[Process], node: &Node) -> Result<(), String> {
    let count = node.gpus.len();
    if let Some(p) = processes.iter().find(|p| p.gpu as usize >= count) {
        return Err(format!(
            "{PROCESSES_ENV}: GPU {} does not exist (the node has {count})",
            p.gpu
        ));
    }
    for p in processes {
        let gpu = &node.gpus[p.gpu as usize];
        let (index, pid) = (p.gpu, p.pid);
        let ids: Vec<String> = gpu.instances.iter().map(|gi| gi.id.to_string()).collect();
        let ids = if ids.is_empty() { "none".to_string() } else { ids.join(", ") };
        let why = match p.gpu_instance {
            None if gpu.mig_enabled => format!(
                "GPU {index} is in MIG mode, where every compute process runs in a GPU \
                 instance: write {index}/<gi>:{pid} (its GPU instances: {ids})"
            ),
            Some(_) if !gpu.mig_enabled => format!(
                "GPU {index} is not in MIG mode, so it has no GPU instances: write {index}:{pid}"
            ),
            Some(gi) if !gpu.instances.iter().any(|i| i.id == gi) => {
                format!("GPU {index} has no GPU instance {gi} (its GPU instances: {ids})")
            }
            _ => continue,
        };
        let entry = match p.gpu_instance {
            Some(gi) => format!("{index}/{gi}:{pid}"),
            None => format!("{index}:{pid}"),
        };
        return Err(format!("{PROCESSES_ENV}: {entry:?}: {why}"));
    }
    Ok(())
}

/// A byte size as the simulator's knobs and tools take it: a number of bytes, or a number
/// with a binary unit `B`, `K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB` (`1536MiB`, `2GiB`,
/// `2485125120`), as gpushare's profiles write sizes. Zero is refused.
pub fn parse_size(text: &str) -> Result<u64, String> {
    use gpushare_base::size::SizeError;
    let text = text.trim();
    gpushare_base::size::parse_size(text).map_err(|e| match e {
        SizeError::NotASize | SizeError::UnknownUnit(_) => format!(
            "{text:?} is not a size: write bytes or a number with B, KiB, MiB, GiB or TiB (1536MiB)"
        ),
        SizeError::Zero => "a size must be above zero".into(),
        SizeError::TooLarge => format!("the size {text:?} is too large"),
    })
}

/// One fact of `GPUSHARE_SIM_HOST`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostFact {
    /// `passthrough[=<gpus>]`, `vgpu[=<gpus>]`: NVML's virtualization mode of those GPUs
    /// (`None`: every GPU).
    Virtualization(VirtualizationMode, Option<Vec<u32>>),
    /// `no-flr[=<gpus>]`: those GPUs' PCI functions offer no function-level reset.
    NoFlr(Option<Vec<u32>>),
    /// `nvidia-drm.modeset=1|0`: `nvidia_drm` is loaded, with or without modesetting.
    NvidiaDrm(NvidiaDrm),
    /// `nvswitches=<n>`: NVSwitch PCI functions.
    NvSwitches(u8),
    /// `fabric-manager=running|stopped`.
    FabricManager(FabricManager),
    /// `numa:<gpus>=<cpus>`: those GPUs' local CPUs (a CPU list, canonical commas).
    Numa(Vec<u32>, String),
}

/// Parses `GPUSHARE_SIM_HOST`'s value (see the module docs).
pub fn parse_host(text: &str) -> Result<Vec<HostFact>, String> {
    text.split(',').map(str::trim).filter(|p| !p.is_empty()).map(parse_host_fact).collect()
}

fn parse_host_fact(part: &str) -> Result<HostFact, String> {
    let bad = |why: &str| format!("{HOST_ENV}: {part:?}: {why}");
    let (name, value) = match part.split_once('=') {
        Some((name, value)) => (name.trim(), Some(value.trim())),
        None => (part, None),
    };
    let gpus = |value: Option<&str>| -> Result<Option<Vec<u32>>, String> {
        value
            .map(|v| {
                v.split('+')
                    .map(|g| {
                        g.trim().parse::<u32>().map_err(|_| bad("write GPU indexes joined by +"))
                    })
                    .collect()
            })
            .transpose()
    };
    let required = || value.ok_or_else(|| bad("needs a value after ="));
    if let Some(listed) = name.strip_prefix("numa:") {
        let gpus = gpus(Some(listed))?.unwrap_or_default();
        let cpus = cpu_list(required()?).ok_or_else(|| {
            bad("write numa:<gpus>=<cpus>, the CPUs as numbers and ranges joined by + (0-3+8)")
        })?;
        return Ok(HostFact::Numa(gpus, cpus));
    }
    Ok(match name {
        "passthrough" => HostFact::Virtualization(VirtualizationMode::Passthrough, gpus(value)?),
        "vgpu" => HostFact::Virtualization(VirtualizationMode::Vgpu, gpus(value)?),
        "no-flr" => HostFact::NoFlr(gpus(value)?),
        "nvidia-drm.modeset" => HostFact::NvidiaDrm(NvidiaDrm {
            modeset: match required()? {
                "1" | "Y" | "y" => true,
                "0" | "N" | "n" => false,
                _ => return Err(bad("write 1 or 0")),
            },
        }),
        "nvswitches" => {
            HostFact::NvSwitches(required()?.parse().map_err(|_| bad("write a number to 255"))?)
        }
        "fabric-manager" => HostFact::FabricManager(match required()? {
            "running" => FabricManager::Running,
            "stopped" => FabricManager::Stopped,
            _ => return Err(bad("write running or stopped")),
        }),
        _ => {
            return Err(bad(
                "unknown fact: passthrough, vgpu, no-flr, nvidia-drm.modeset, nvswitches, fabric-manager or numa:<gpus>",
            ));
        }
    })
}

/// A CPU list written with `+` for its commas (`0-3+8`), as sysfs writes it (`0-3,8`);
/// `None` unless every part is a CPU number below 4096 or a range of them.
fn cpu_list(text: &str) -> Option<String> {
    let parts: Option<Vec<String>> = text
        .split('+')
        .map(|part| match gpushare_base::cpus::parse_part(part).ok()? {
            (a, b) if part.contains('-') => Some(format!("{a}-{b}")),
            (n, _) => Some(n.to_string()),
        })
        .collect();
    parts.filter(|p| !p.is_empty()).map(|p| p.join(","))
}

/// Makes `node`'s host what `facts` say over a bare-metal host; a GPU index the node lacks
/// is a one-line error and changes nothing.
pub fn apply_host(facts: &[HostFact], node: &mut Node) -> Result<(), String> {
    let count = node.gpus.len();
    let listed = facts.iter().flat_map(|f| match f {
        HostFact::Virtualization(_, Some(g)) | HostFact::NoFlr(Some(g)) => g.as_slice(),
        HostFact::Numa(g, _) => g.as_slice(),
        _ => &[],
    });
    if let Some(g) = listed.clone().find(|&&g| g as usize >= count) {
        return Err(format!("{HOST_ENV}: GPU {g} does not exist (the node has {count})"));
    }
    node.host = Host::default();
    for gpu in &mut node.gpus {
        gpu.virtualization_mode = VirtualizationMode::None;
        gpu.flr = true;
    }
    let chosen =
        |gpus: &Option<Vec<u32>>, i: usize| gpus.as_ref().is_none_or(|g| g.contains(&(i as u32)));
    for fact in facts {
        match fact {
            HostFact::Virtualization(mode, gpus) => {
                for (i, gpu) in node.gpus.iter_mut().enumerate() {
                    if chosen(gpus, i) {
                        gpu.virtualization_mode = *mode;
                    }
                }
            }
            HostFact::NoFlr(gpus) => {
                for (i, gpu) in node.gpus.iter_mut().enumerate() {
                    if chosen(gpus, i) {
                        gpu.flr = false;
                    }
                }
            }
            HostFact::NvidiaDrm(drm) => node.host.nvidia_drm = Some(*drm),
            HostFact::NvSwitches(n) => node.host.nvswitches = *n,
            HostFact::FabricManager(fm) => node.host.fabric_manager = *fm,
            HostFact::Numa(gpus, cpus) => {
                for &gpu in gpus {
                    node.host.numa.insert(gpu, cpus.clone());
                }
            }
        }
    }
    Ok(())
}

/// All knobs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Knobs {
    /// `GPUSHARE_SIM_FAIL`.
    pub failures: Vec<Failure>,
    /// `GPUSHARE_SIM_DELAY_MS`.
    pub delay: Duration,
    /// `GPUSHARE_SIM_PROCESSES`, when set (empty: no processes).
    pub processes: Option<Vec<Process>>,
    /// `GPUSHARE_SIM_REBOOT`.
    pub reboot: bool,
    /// `GPUSHARE_SIM_HOST`, when set (empty: a bare-metal host).
    pub host: Option<Vec<HostFact>>,
}

impl Knobs {
    /// Reads every knob; a malformed one is a one-line error naming it.
    pub fn from_env() -> Result<Knobs, String> {
        let mut knobs = Knobs { failures: from_env()?, ..Knobs::default() };
        if let Some(v) = var(DELAY_ENV) {
            let ms: u64 = v
                .trim()
                .parse()
                .map_err(|_| format!("{DELAY_ENV}: {v:?} is not a number of milliseconds"))?;
            knobs.delay = Duration::from_millis(ms);
        }
        // Set, even empty, it says what runs; unset, the node keeps what it has (another
        // NVML client, a pynvml script, must not clear the agent's processes).
        if let Some(v) = std::env::var_os(PROCESSES_ENV) {
            let v = v.to_str().ok_or_else(|| format!("{PROCESSES_ENV} is not UTF-8"))?;
            knobs.processes =
                Some(if v.trim().is_empty() { Vec::new() } else { parse_processes(v)? });
        }
        if let Some(v) = var(REBOOT_ENV) {
            knobs.reboot = match v.trim() {
                "1" | "true" | "yes" => true,
                "0" | "false" | "no" => false,
                other => return Err(format!("{REBOOT_ENV}: {other:?}: write 1 or 0")),
            };
        }
        // As GPUSHARE_SIM_PROCESSES: set, even empty, it says what the host is.
        if let Some(v) = std::env::var_os(HOST_ENV) {
            let v = v.to_str().ok_or_else(|| format!("{HOST_ENV} is not UTF-8"))?;
            knobs.host = Some(parse_host(v)?);
        }
        Ok(knobs)
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_parse_with_default_and_explicit_codes() {
        let f = parse(
            "nvmlDeviceCreateGpuInstanceWithPlacement:3, nvmlDeviceSetMigMode:1=NVML_ERROR_GPU_IS_LOST,gpu-reset:2",
        )
        .unwrap();
        assert_eq!(f.len(), 3);
        assert_eq!((f[0].nth, f[0].code(), f[0].code), (3, ret::INSUFFICIENT_RESOURCES, None));
        assert_eq!(f[1].code(), ret::GPU_IS_LOST);
        assert_eq!(f[2].name, "gpu-reset");
        assert_eq!(fires(&f, "nvmlDeviceSetMigMode", 1), Some(ret::GPU_IS_LOST));
        assert_eq!(fires(&f, "nvmlDeviceSetMigMode", 2), None);
        assert_eq!(default_code("nvmlGpuInstanceDestroy"), ret::IN_USE);
        assert_eq!(default_code("nvmlDeviceSetPersistenceMode"), ret::NO_PERMISSION);
        assert_eq!(default_code("nvmlDeviceGetUUID"), ret::UNKNOWN);
    }

    #[test]
    fn bad_failures_are_one_line_errors_naming_the_knob_and_part() {
        for (text, needle) in [
            ("reset:1", "unknown function \"reset\""),
            ("nvmlDeviceSetMigMode:0", "n must be a number from 1"),
            ("nvmlDeviceSetMigMode", "write <function>:<n>"),
            ("nvmlDeviceSetMigMode:1=GPU_LOST", "unknown return code \"GPU_LOST\""),
            ("nvmlDeviceSetMigMode:1=NVML_SUCCESS", "unknown return code"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.starts_with("GPUSHARE_SIM_FAIL: "), "{e}");
            assert!(e.contains(needle), "{e}");
            assert!(!e.contains('\n'));
        }
        assert!(parse("").unwrap().is_empty());
    }

    #[test]
    fn host_facts_parse_and_apply_over_bare_metal() {
        use gpushare_catalog::parse_node_spec;
        let facts = parse_host(
            "passthrough, no-flr=1, nvidia-drm.modeset=1, nvswitches=6, fabric-manager=stopped",
        )
        .unwrap();
        assert_eq!(facts.len(), 5);
        let mut node = Node::new(&parse_node_spec("a100-40gb:2").unwrap());
        node.gpus[0].flr = false;
        apply_host(&facts, &mut node).unwrap();
        assert!(node.gpus.iter().all(|g| g.virtualization_mode == VirtualizationMode::Passthrough));
        assert!(node.gpus[0].flr && !node.gpus[1].flr, "reset to bare metal first");
        assert_eq!(node.host.nvidia_drm, Some(NvidiaDrm { modeset: true }));
        assert_eq!((node.host.nvswitches, node.host.fabric_manager), (6, FabricManager::Stopped));

        apply_host(&parse_host("vgpu=0+1, nvidia-drm.modeset=0").unwrap(), &mut node).unwrap();
        assert!(
            node.gpus.iter().all(|g| g.virtualization_mode == VirtualizationMode::Vgpu && g.flr)
        );
        assert_eq!(node.host.nvidia_drm, Some(NvidiaDrm { modeset: false }));
        assert_eq!((node.host.nvswitches, node.host.fabric_manager), (0, FabricManager::Running));

        apply_host(&[], &mut node).unwrap();
        assert_eq!(node, Node::new(&parse_node_spec("a100-40gb:2").unwrap()));

        let e = apply_host(&parse_host("no-flr=2").unwrap(), &mut node).unwrap_err();
        assert_eq!(e, "GPUSHARE_SIM_HOST: GPU 2 does not exist (the node has 2)");
        let e = apply_host(&parse_host("numa:0+2=1").unwrap(), &mut node).unwrap_err();
        assert_eq!(e, "GPUSHARE_SIM_HOST: GPU 2 does not exist (the node has 2)");

        let facts = parse_host("numa:1=1, numa:0=0-3+8 , no-flr=0").unwrap();
        assert_eq!(facts[0], HostFact::Numa(vec![1], "1".into()));
        assert_eq!(facts[1], HostFact::Numa(vec![0], "0-3,8".into()));
        apply_host(&facts, &mut node).unwrap();
        assert_eq!(node.host.numa.get(&0).map(String::as_str), Some("0-3,8"));
        assert_eq!(node.host.numa.get(&1).map(String::as_str), Some("1"));
        apply_host(&parse_host("numa:0+1=4-7").unwrap(), &mut node).unwrap();
        assert_eq!(node.host.numa.values().collect::<Vec<_>>(), ["4-7", "4-7"]);
        apply_host(&[], &mut node).unwrap();
        assert!(node.host.numa.is_empty(), "one node again");
        for (text, needle) in [
            ("flr", "unknown fact"),
            ("passthrough=a", "GPU indexes joined by +"),
            ("nvidia-drm.modeset", "needs a value"),
            ("nvidia-drm.modeset=yes", "write 1 or 0"),
            ("nvswitches=300", "a number to 255"),
            ("fabric-manager=off", "running or stopped"),
            ("numa:1", "needs a value"),
            ("numa:x=1", "GPU indexes joined by +"),
            ("numa:=1", "GPU indexes joined by +"),
            ("numa:0=3-1", "write numa:<gpus>=<cpus>"),
            ("numa:0=a", "write numa:<gpus>=<cpus>"),
            ("numa:0=4096", "write numa:<gpus>=<cpus>"),
            ("numa:0=", "write numa:<gpus>=<cpus>"),
            ("numa=0", "unknown fact"),
        ] {
            let e = parse_host(text).unwrap_err();
            assert!(e.starts_with("GPUSHARE_SIM_HOST: "), "{e}");
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn processes_parse() {
        assert_eq!(
            parse_processes("0:1234, 2/1:99").unwrap(),
            vec![Process::new(0, None, 1234), Process::new(2, Some(1), 99)]
        );
        assert_eq!(Process::new(0, None, 1).memory, 512 << 20);
        let sized = parse_processes("0:3609=3682MiB,0/2:7=2GiB, 1:8 = 69206016 ,1:9=4K").unwrap();
        let memory: Vec<(u32, u64)> = sized.iter().map(|p| (p.pid, p.memory)).collect();
        assert_eq!(memory, [(3609, 3_860_856_832), (7, 2 << 30), (8, 69_206_016), (9, 4096)]);
        assert_eq!(sized[1].gpu_instance, Some(2));
        assert!(sized.iter().all(|p| !p.mps && !p.registered));
        for (text, needle) in [
            ("x:1", "write <gpu>[/<gi>]:<pid>[=<size>]"),
            ("0:1=", "is not a size"),
            ("0:1=2PiB", "is not a size"),
            ("0:1=MiB", "is not a size"),
            ("0:1=0", "above zero"),
            ("0:1=99999999999T", "too large"),
            ("0:x=1G", "write <gpu>"),
        ] {
            let e = parse_processes(text).unwrap_err();
            assert!(e.starts_with("GPUSHARE_SIM_PROCESSES: "), "{e}");
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn processes_must_fit_the_gpus_mig_mode() {
        use crate::node::GpuInstance;
        let mut node = Node::new(&gpushare_catalog::parse_node_spec("a100-40gb:3").unwrap());
        node.gpus[1].mig_enabled = true;
        node.gpus[2].mig_enabled = true;
        for id in [1, 5] {
            node.gpus[1].instances.push(GpuInstance {
                id,
                profile_id: 0,
                start: 0,
                size: 1,
                serial: u64::from(id),
                compute_instances: Vec::new(),
            });
        }
        let check =
            |text: &str, node: &Node| check_processes(&parse_processes(text).unwrap(), node);
        assert_eq!(check("0:10=2GiB, 1/1:11, 1/5:12", &node), Ok(()));
        assert_eq!(check("", &node), Ok(()));
        for (text, error) in [
            ("3:77", "GPUSHARE_SIM_PROCESSES: GPU 3 does not exist (the node has 3)"),
            (
                "0:10,1:77=1GiB",
                "GPUSHARE_SIM_PROCESSES: \"1:77\": GPU 1 is in MIG mode, where every compute \
                 process runs in a GPU instance: write 1/<gi>:77 (its GPU instances: 1, 5)",
            ),
            (
                "2:78",
                "GPUSHARE_SIM_PROCESSES: \"2:78\": GPU 2 is in MIG mode, where every compute \
                 process runs in a GPU instance: write 2/<gi>:78 (its GPU instances: none)",
            ),
            (
                "0/1:79",
                "GPUSHARE_SIM_PROCESSES: \"0/1:79\": GPU 0 is not in MIG mode, so it has no GPU \
                 instances: write 0:79",
            ),
            (
                "1/2:80",
                "GPUSHARE_SIM_PROCESSES: \"1/2:80\": GPU 1 has no GPU instance 2 (its GPU \
                 instances: 1, 5)",
            ),
            (
                "2/1:81",
                "GPUSHARE_SIM_PROCESSES: \"2/1:81\": GPU 2 has no GPU instance 1 (its GPU \
                 instances: none)",
            ),
        ] {
            assert_eq!(check(text, &node).unwrap_err(), error, "{text}");
        }
        // MIG mode pending (after the next reset) does not count: the processes run now.
        node.gpus[0].mig_pending = Some(true);
        assert_eq!(check("0:10", &node), Ok(()));
    }
}
