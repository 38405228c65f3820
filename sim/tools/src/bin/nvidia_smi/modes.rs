//! The device modifications: `-pm` (persistence mode), `-mig` (MIG mode) and `-r` (GPU
//! reset), on the node under its lock.

use gpushare_sim_nvml::abi::types::ret;
use gpushare_sim_nvml::faults::Failure;
use gpushare_sim_nvml::node::{Node, ResetRefused};
use gpushare_sim_nvml::rules;

use crate::{EXIT_OTHER, GPU_RESET, Out, exit_status, ids, injected, no_devices, smi_message};

/// A `-pm` / `-mig` value: `0`/`DISABLED` or `1`/`ENABLED` (any case).
pub fn parse_switch(value: &str) -> Option<bool> {
    match value.trim().to_ascii_uppercase().as_str() {
        "0" | "DISABLED" => Some(false),
        "1" | "ENABLED" => Some(true),
        _ => None,
    }
}

/// `-pm 0|1`: the wording of nvidia-smi's manual and of the real tool's published output
/// ("Legacy" persistence mode: the one nvidia-smi sets, not nvidia-persistenced's).
pub fn persistence_mode(node: &mut Node, ids: Option<&str>, on: bool, out: &mut Out<'_>) -> u8 {
    let Some(chosen) = ids::select(node, ids) else { return no_devices(out) };
    for (index, _) in chosen {
        let gpu = &node.gpus[index];
        let pci = gpu.pci_bus_id.clone();
        if gpu.persistence_mode == on {
            let state = if on { "Enabled" } else { "Disabled" };
            let _ = writeln!(out.out, "Persistence mode is already {state} for GPU {pci}.");
            continue;
        }
        if let Err(code) = rules::set_persistence_mode(node, index as u32, on) {
            let _ = writeln!(
                out.out,
                "Unable to set persistence mode for GPU {pci}: {}",
                smi_message(code)
            );
            return exit_status(code);
        }
        let done = if on { "Enabled Legacy persistence mode" } else { "Disabled persistence mode" };
        let _ = writeln!(out.out, "{done} for GPU {pci}.");
    }
    let _ = writeln!(out.out, "All done.");
    0
}

/// `-mig 0|1`, as the driver's [`rules::set_mig_mode`] answers: done (with the real tool's
/// warning when persistence mode is off), pending until a reset (the MIG user guide's
/// warnings), or refused, which stops the command ("Terminating early due to previous
/// errors.").
pub fn mig_mode(node: &mut Node, ids: Option<&str>, on: bool, out: &mut Out<'_>) -> u8 {
    let Some(chosen) = ids::select(node, ids) else { return no_devices(out) };
    let (verb, state) = if on { ("enable", "Enabled") } else { ("disable", "Disabled") };
    for (index, _) in chosen {
        let pci = node.gpus[index].pci_bus_id.clone();
        match rules::set_mig_mode(node, index as u32, on) {
            Ok(ret::SUCCESS) => {
                let _ = writeln!(out.out, "{state} MIG Mode for GPU {pci}");
                if !node.gpus[index].persistence_mode {
                    let _ = writeln!(
                        out.out,
                        "\nWarning: persistence mode is disabled on device {pci}. See the Known \
                         Issues section of the nvidia-smi(1) man page for more information. Run \
                         with [--help | -h] switch to get more information on how to enable \
                         persistence mode."
                    );
                }
            }
            Ok(ret::IN_USE) => {
                let _ = writeln!(
                    out.out,
                    "Warning: MIG mode is in pending {verb} state for GPU {pci}:In use by another \
                     client\n{pci} is currently being used by one or more other processes (e.g. \
                     CUDA application or a monitoring application such as another instance of \
                     nvidia-smi). Please first kill all processes using the device and retry the \
                     command or reboot the system to make MIG mode effective."
                );
            }
            Ok(pending) => {
                let _ = writeln!(
                    out.out,
                    "Warning: MIG mode is in pending {verb} state for GPU {pci}:{}\nReboot the \
                     system or try nvidia-smi --gpu-reset to make MIG mode effective on GPU {pci}",
                    smi_message(pending)
                );
            }
            Err(code) => {
                let _ = writeln!(
                    out.out,
                    "Unable to {verb} MIG Mode for GPU {pci}: {}\nTerminating early due to \
                     previous errors.",
                    smi_message(code)
                );
                return exit_status(code);
            }
        }
    }
    let _ = writeln!(out.out, "All done.");
    0
}

/// `--gpu-reset` on the node (under its lock): [`Node::reset_gpu_among`] of every chosen
/// GPU together, or none of them when any is refused ([`Node::reset_refusal`]), answered
/// as the real tool answers:
/// - a GPU off the bus: "Unable to reset GPU …: GPU is lost", exit 15 (nvidia-smi's
///   status for a lost GPU; the wording is the tool's other "Unable to reset" lines');
/// - a GPU that cannot be reset here (a vGPU guest, a VM without function-level reset):
///   "Resetting GPU … is not supported.", exit 3 (NVIDIA's MIG user guide, "GPU Reset on
///   NVIDIA Ampere Architecture GPUs", on an A100 passed through to a VM; 3 is nvidia-smi's
///   "not available on target device");
/// - an Ampere GPU on an NVSwitch fabric without Fabric Manager, reset without its NVLink
///   peers: a line naming the peers that must be reset in the same command, exit 255
///   (nvidia-smi(1) says the tool "will issue an error identifying the additional GPUs";
///   its wording is ours, not recorded);
/// - held by processes, persistence mode or `nvidia_drm` with modesetting: "The following
///   GPUs could not be reset: … In use by another client" and NVIDIA's explanatory
///   paragraph, exit 255 (NVIDIA/mig-parted#181 for `nvidia_drm`).
pub fn gpu_reset(
    node: &mut Node,
    ids: Option<&str>,
    failures: &[Failure],
    out: &mut Out<'_>,
) -> u8 {
    let Some(chosen) = ids::select(node, ids) else { return no_devices(out) };
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
    let together: Vec<usize> = chosen.iter().map(|(i, _)| *i).collect();
    let refusals: Vec<(String, ResetRefused)> = together
        .iter()
        .zip(&pcis)
        .filter_map(|(&i, pci)| node.reset_refusal(i, &together).map(|r| (pci.clone(), r)))
        .collect();
    if refusals.iter().any(|(_, r)| *r == ResetRefused::NoSuchGpu) {
        return no_devices(out);
    }
    let lost: Vec<&String> =
        refusals.iter().filter(|(_, r)| *r == ResetRefused::Lost).map(|(pci, _)| pci).collect();
    if !lost.is_empty() {
        for pci in lost {
            let _ =
                writeln!(out.out, "Unable to reset GPU {pci}: {}", smi_message(ret::GPU_IS_LOST));
        }
        return exit_status(ret::GPU_IS_LOST);
    }
    let not_supported: Vec<&String> = refusals
        .iter()
        .filter(|(_, r)| *r == ResetRefused::NotSupported)
        .map(|(pci, _)| pci)
        .collect();
    if !not_supported.is_empty() {
        for pci in not_supported {
            let _ = writeln!(out.out, "Resetting GPU {pci} is not supported.");
        }
        return exit_status(ret::NOT_SUPPORTED);
    }
    if let Some((pci, ResetRefused::NvLinkPeers { missing })) =
        refusals.iter().find(|(_, r)| matches!(r, ResetRefused::NvLinkPeers { .. }))
    {
        let peers: Vec<&str> = missing.iter().map(|&i| node.gpus[i].pci_bus_id.as_str()).collect();
        let _ = writeln!(
            out.out,
            "Unable to reset GPU {pci}: Fabric Manager is not running, so the GPUs connected \
             to it by NVLink must be reset in the same command: {}",
            peers.join(", ")
        );
        return EXIT_OTHER;
    }
    if !refusals.is_empty() {
        let held: Vec<String> = refusals.into_iter().map(|(pci, _)| pci).collect();
        return in_use_block(out, &held);
    }
    for (&index, pci) in together.iter().zip(&pcis) {
        if node.reset_gpu_among(index, &together).is_ok() {
            let _ = writeln!(out.out, "GPU {pci} was successfully reset.");
        }
    }
    let _ = writeln!(out.out, "All done.");
    0
}
