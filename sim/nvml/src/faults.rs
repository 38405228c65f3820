//! The simulator's knobs, read from the environment at the first `nvmlInit` of a process.
//!
//! - `GPUSHARE_SIM_FAIL="<name>:<n>[=<NVML_ERROR_X>][,...]"`: the n-th call (1-based,
//!   counted per process) of that exported NVML function fails, with the code the real
//!   driver gives for causes outside the caller's control ([`default_code`]) unless
//!   `=NVML_ERROR_X` names one. `<name>` may also be a tool action ([`TOOL_ACTIONS`]),
//!   counted by the simulated nvidia-smi in the node file.
//! - `GPUSHARE_SIM_DELAY_MS=<ms>`: every mutating call sleeps this long first.
//! - `GPUSHARE_SIM_PROCESSES="<gpu>[/<gpu instance id>]:<pid>,..."`: compute processes.
//! - `GPUSHARE_SIM_REBOOT=1|0`: start as after a reboot.

use std::time::Duration;

use crate::abi::types::{nvmlReturn_t, ret};
use crate::node::Process;

/// `GPUSHARE_SIM_FAIL`.
pub const FAIL_ENV: &str = "GPUSHARE_SIM_FAIL";
/// `GPUSHARE_SIM_DELAY_MS`.
pub const DELAY_ENV: &str = "GPUSHARE_SIM_DELAY_MS";
/// `GPUSHARE_SIM_PROCESSES`.
pub const PROCESSES_ENV: &str = "GPUSHARE_SIM_PROCESSES";
/// `GPUSHARE_SIM_REBOOT`.
pub const REBOOT_ENV: &str = "GPUSHARE_SIM_REBOOT";

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

/// Parses `GPUSHARE_SIM_PROCESSES`'s value: `<gpu>[/<gpu instance id>]:<pid>[,...]`.
pub fn parse_processes(text: &str) -> Result<Vec<Process>, String> {
    let bad = |part: &str| format!("{PROCESSES_ENV}: {part:?}: write <gpu>[/<gi>]:<pid>");
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|part| {
            let (place, pid) = part.split_once(':').ok_or_else(|| bad(part))?;
            let (gpu, gi) = match place.split_once('/') {
                Some((g, i)) => (g, Some(i.trim().parse().map_err(|_| bad(part))?)),
                None => (place, None),
            };
            Ok(Process {
                gpu: gpu.trim().parse().map_err(|_| bad(part))?,
                gpu_instance: gi,
                pid: pid.trim().parse().map_err(|_| bad(part))?,
            })
        })
        .collect()
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
    fn processes_parse() {
        assert_eq!(
            parse_processes("0:1234, 2/1:99").unwrap(),
            vec![
                Process { gpu: 0, gpu_instance: None, pid: 1234 },
                Process { gpu: 2, gpu_instance: Some(1), pid: 99 }
            ]
        );
        assert!(parse_processes("x:1").unwrap_err().starts_with("GPUSHARE_SIM_PROCESSES: "));
    }
}
