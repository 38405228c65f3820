//! `nvidia-smi` without a command (and with only `-i IDS`): the summary table, its GPU
//! box, the MIG devices box (when a chosen GPU has MIG on) and the Processes box.
//!
//! # Sources
//!
//! - The header, the GPU box and the Processes box (MIG off, with an MPS server, an MPS
//!   client `M+C` and a direct client) follow the real tool of driver 580.159.04 on an
//!   H200, recorded in tests/device/results/clients-h200-2026-11-27/smi.txt, column for
//!   column: 89 characters between the outer bars, the GPU box's cells 41, 24 and 22
//!   wide, the date line with its trailing spaces, an empty line between boxes.
//! - Not in that recording, taken from published transcripts of drivers of the same
//!   layout (the search index's copies of operators' notes): the MIG devices box (its
//!   cells 18, 34, 11 and 23 wide, `Shared Memory-Usage` / `Shared BAR1-Usage`), the
//!   Processes box's GI and CI ids of a process in a MIG device, `On` in the ECC column
//!   and `N/A` as GPU-Util of a GPU with MIG on, and "No running processes found", from
//!   an A100-SXM4-40GB on driver 580.126.09 and on 590.48.01; a pending MIG mode as the
//!   pending value and `*` (`Enabled*`, `Disabled*`), `E. Process` and `Prohibited` as
//!   compute modes, a long GPU name cut to 24 characters and `...` (`NVIDIA RTX 6000 Ada
//!   Gene...`), a long process name cut to `...` and its last 29 characters, from
//!   transcripts of drivers 515 to 580; "No MIG devices found" (MIG on, no instance) as
//!   drivers 470 and 515 printed it, here at 580's width. The older 79-column MIG
//!   devices box of XuehaiPan/nvitop pull request #8 (an A100) has the same columns.
//!
//! # What the simulator does not model
//!
//! Fan (`N/A`, as on the passively cooled data-centre boards), performance state (`P0`,
//! as the real H100 and H200 showed under persistence mode), display (`Off`), ECC errors
//! (`0`; a MIG device's `Unc` column too), BAR1 memory (a MIG device's BAR1 line shows
//! `N/A / N/A`: the simulator has no BAR1 aperture), the driver's own memory beside the
//! processes' (the real H200 showed 6134 MiB used for 6118 MiB of processes: the summary
//! shows `-q`'s `Used`, the processes' memory only, never the reserve), and the power
//! limit of models no real output was seen for (`N/A`, see [`device::power_cap_w`]).
//! Temperature, power draw and GPU-Util are the simulated driver's readings
//! ([`device::readings`]), which rise with the number of processes, not with their work.

use std::fmt::Write;

use gpushare_sim_nvml::abi::types::NO_INSTANCE;
use gpushare_sim_nvml::node::{ComputeMode, Gpu, Node};
use gpushare_sim_nvml::rules;

use crate::device;

/// Characters between a full-width box's bars.
const WIDTH: usize = 89;

const HEADER: &str = "\
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
";
const GPU_RULE: &str =
    "+-----------------------------------------+------------------------+----------------------+\n";

const MIG_HEADER: &str = "\
| MIG devices:                                                                            |
+------------------+----------------------------------+-----------+-----------------------+
| GPU  GI  CI  MIG |              Shared Memory-Usage |        Vol|        Shared         |
|      ID  ID  Dev |                Shared BAR1-Usage | SM     Unc| CE ENC  DEC  OFA  JPG |
|                  |                                  |        ECC|                       |
|==================+==================================+===========+=======================|
";
const MIG_RULE: &str =
    "+------------------+----------------------------------+-----------+-----------------------+\n";

const PROCESSES_HEADER: &str = "\
| Processes:                                                                              |
|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
";

/// A full-width rule.
fn rule() -> String {
    format!("+{}+\n", "-".repeat(WIDTH))
}

/// A full-width line: `text` left-aligned between the bars.
fn line(text: &str) -> String {
    format!("|{text:<WIDTH$}|\n")
}

/// The summary of the GPUs at `indexes` (all of the node's without `-i`).
pub fn render(node: &Node, indexes: &[usize]) -> String {
    let mut text = String::new();
    let (date, _) = device::local_time("%a %b %e %H:%M:%S %Y");
    let _ = writeln!(text, "{date}       ");
    text.push_str(&rule());
    text.push_str(&line(&format!(
        " NVIDIA-SMI {:<23}Driver Version: {:<15}CUDA Version: {:<9}",
        device::DRIVER_VERSION,
        device::DRIVER_VERSION,
        device::CUDA_VERSION
    )));
    text.push_str(HEADER);
    for &index in indexes {
        gpu_box(&mut text, node, index);
        text.push_str(GPU_RULE);
    }
    if indexes.iter().any(|&i| node.gpus[i].mig_enabled) {
        text.push('\n');
        mig_box(&mut text, node, indexes);
    }
    text.push('\n');
    processes_box(&mut text, node, indexes);
    text
}

/// The compute mode as the summary abbreviates it.
fn compute_mode(mode: ComputeMode) -> &'static str {
    match mode {
        ComputeMode::Default => "Default",
        ComputeMode::ExclusiveProcess => "E. Process",
        ComputeMode::Prohibited => "Prohibited",
    }
}

/// The GPU name, cut to 24 characters and `...` when it does not fit the 27 the real tool
/// leaves it.
fn short_name(name: &str) -> String {
    if name.chars().count() <= 27 {
        name.to_string()
    } else {
        format!("{}...", name.chars().take(24).collect::<String>())
    }
}

/// `MIG M.`: the pending mode, with `*` while it differs from the current one; `N/A`
/// without MIG.
fn mig_mode(g: &Gpu) -> String {
    match device::mig_modes(g) {
        None => "N/A".into(),
        Some((current, pending)) if current != pending => format!("{pending}*"),
        Some((current, _)) => current.into(),
    }
}

/// One GPU's three lines.
fn gpu_box(text: &mut String, node: &Node, index: usize) {
    let g = &node.gpus[index];
    let readings = device::readings(node, index);
    let memory = device::memory(node, index);
    let persistence = if g.persistence_mode { "On" } else { "Off" };
    // Volatile uncorrected ECC errors: none (not modelled); `On` with MIG on, where they
    // are counted per MIG device.
    let ecc = if g.mig_enabled { "On" } else { "0" };
    let _ = writeln!(
        text,
        "|{index:>4}  {name:<31}{persistence:<4}|{bus:>19} {disp:>3} |{ecc:>21} |",
        name = short_name(g.name()),
        bus = g.pci_bus_id,
        disp = "Off",
    );
    let power = format!("{}W", readings.power_mw / 1000);
    let cap = device::power_cap_w(g).map_or_else(|| "N/A".to_string(), |w| format!("{w}W"));
    let used = format!("{}MiB", memory.used);
    let total = format!("{}MiB", memory.total);
    let util = readings.gpu_util.map_or_else(|| "N/A".to_string(), |u| format!("{u}%"));
    let _ = writeln!(
        text,
        "|{fan:>4}{temp:>5}C{perf:>6}{power:>16} / {cap:>5} |{used:>11} / {total:>9} |{util:>8}{mode:>13} |",
        fan = "N/A",
        temp = readings.temperature_c,
        perf = "P0",
        mode = compute_mode(g.compute_mode),
    );
    let _ = writeln!(text, "|{:41}|{:24}|{:>21} |", "", "", mig_mode(g));
}

/// The MIG devices box: two lines per MIG device of the chosen GPUs with MIG on, in NVML's
/// device order; "No MIG devices found" when they have none.
fn mig_box(text: &mut String, node: &Node, indexes: &[usize]) {
    text.push_str(&rule());
    text.push_str(MIG_HEADER);
    let mut any = false;
    for &index in indexes {
        let g = &node.gpus[index];
        for (device_index, (gi_id, ci_id, _)) in rules::mig_devices(g).into_iter().enumerate() {
            let Some(gi) = g.instance(gi_id) else { continue };
            any = true;
            let profile = rules::profile_of(g, gi);
            // The compute instance's SMs; the engines its GPU instance shares.
            let sms = device::mig_device_sms(g, gi, ci_id);
            let e = profile.engines;
            let memory = device::mig_memory(node, index, gi_id, ci_id);
            let usage = format!("{:>16}MiB / {:>5}MiB", memory.used, memory.total);
            // BAR1: not modelled.
            let bar1 = format!("{:>19} / {:>8}", "N/A", "N/A");
            let _ = writeln!(
                text,
                "|{index:>3}{gi_id:>5}{ci_id:>4}{device_index:>4}  |{usage:<34}| {sms:<3}{unc:>6} |{:>3}{:>4}{:>5}{:>5}{:>5} |",
                e.copy,
                e.encoders,
                e.decoders,
                e.ofa,
                e.jpeg,
                unc = 0,
            );
            let _ = writeln!(text, "|{:18}|{bar1:<34}|{:11}|{:23}|", "", "", "");
            text.push_str(MIG_RULE);
        }
    }
    if !any {
        text.push_str(&line("  No MIG devices found"));
        text.push_str(&rule());
    }
}

/// The Processes box: each compute process of the chosen GPUs (MPS clients included), in
/// NVML's order, or "No running processes found".
fn processes_box(text: &mut String, node: &Node, indexes: &[usize]) {
    text.push_str(&rule());
    text.push_str(PROCESSES_HEADER);
    let mut any = false;
    for &index in indexes {
        for p in rules::processes(node, index as u32, None).unwrap_or_default() {
            any = true;
            let ids = if p.gpu_instance == NO_INSTANCE {
                format!("{index:>5}   N/A  N/A{:>16}", p.pid)
            } else {
                let ci = if p.compute_instance == NO_INSTANCE {
                    "N/A".to_string()
                } else {
                    p.compute_instance.to_string()
                };
                format!("{index:>5}{:>5}{ci:>5}{:>17}", p.gpu_instance, p.pid)
            };
            let memory = format!("{}MiB", device::process_mib(&p));
            let _ = writeln!(
                text,
                "|{ids}{kind:>7}   {name:<32}{memory:>14} |",
                kind = device::process_type(&p),
                name = process_name(&device::process_name(p.pid)),
            );
        }
    }
    if !any {
        text.push_str(&line("  No running processes found"));
    }
    text.push_str(&rule());
}

/// A process name as the column holds it: cut to `...` and its last 29 characters when
/// longer than 32.
fn process_name(name: &str) -> String {
    let n = name.chars().count();
    if n <= 32 {
        name.to_string()
    } else {
        format!("...{}", name.chars().skip(n - 29).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use gpushare_catalog::parse_node_spec;

    use super::*;

    #[test]
    fn long_names_are_cut_as_the_real_tool_cuts_them() {
        // As published: `NVIDIA RTX 6000 Ada Gene...`, `...s\Python\Python311\python.exe`.
        assert_eq!(short_name("NVIDIA RTX 6000 Ada Generation"), "NVIDIA RTX 6000 Ada Gene...");
        assert_eq!(short_name("NVIDIA H200"), "NVIDIA H200");
        assert_eq!(
            process_name(r"C:\Users\Programs\Python\Python311\python.exe"),
            r"...s\Python\Python311\python.exe"
        );
        assert_eq!(process_name("python3"), "python3");

        let node = Node::new(&parse_node_spec("rtx-pro-6000-bse:1").unwrap());
        let text = render(&node, &[0]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[8].starts_with("|   0  NVIDIA RTX PRO 6000 Blac...    On  |"), "{text}");
        // No power limit known for the model: N/A, in the limit's column.
        assert!(lines[9].starts_with("| N/A   35C    P0             73W /   N/A |"), "{text}");
        assert!(lines[1..].iter().all(|l| l.is_empty() || l.chars().count() == 91), "{text}");
    }
}
