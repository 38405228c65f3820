//! `gpushare-sim-fault`: the simulator's knob that raises a GPU's faults the way the driver
//! reports them (issue 42). It changes the simulated node named by `GPUSHARE_SIM_STATE`
//! (as the simulated nvidia-smi finds it), under the node's lock, and every NVML client
//! of the node sees the change at its next call: the events in every event set's next
//! `nvmlEventSetWait`, the rest in the polled answers (`gpushare_sim_nvml::abi::health`)
//! and in the simulated `nvidia-smi -q`.
//!
//! ```text
//! gpushare-sim-fault xid <gpu>[/<gi>/<ci>] <xid>   an Xid event (XidCriticalError, eventData = the Xid),
//!                                                  on the whole GPU or one MIG instance (which must exist)
//! gpushare-sim-fault lost <gpu>                    the GPU falls off the bus: every NVML call on it answers
//!                                                  GPU_IS_LOST; a GpuUnavailableError event
//! gpushare-sim-fault ecc <gpu> [--sbe N] [--dbe N] N more corrected / uncorrected ECC errors (volatile and
//!                                                  aggregate), each option one SingleBitEccError /
//!                                                  DoubleBitEccError event
//! gpushare-sim-fault remap <gpu> pending|failure   a pending row remap (one more uncorrectable row) or a
//!                                                  remapping failure
//! gpushare-sim-fault recovery <gpu> none|gpu-reset|node-reboot|drain-p2p|drain-and-reset
//!                                                  field 230; a GpuRecoveryAction event (eventData = the
//!                                                  action's value) unless none
//! gpushare-sim-fault clear <gpu>                   healthy again, as after a reboot (aggregate ECC counts
//!                                                  and remapped rows stay)
//! ```
//!
//! Bad input (an unknown command or option, a GPU the node lacks, a GPU or compute
//! instance that does not exist, a number that is not one) is one line on stderr naming
//! the argument, exit 2, and the node unchanged. No node (`GPUSHARE_SIM_STATE` unset, or
//! no file there) or one that cannot be read or written: one line, exit 1. Success prints
//! nothing, exit 0.

use std::process::ExitCode;

use gpushare_sim_nvml::health::{
    EVENT_DBE, EVENT_GPU_UNAVAILABLE, EVENT_RECOVERY_ACTION, EVENT_SBE, EVENT_XID, RecoveryAction,
};
use gpushare_sim_nvml::node::Node;
use gpushare_sim_nvml::state_file::NodeFile;

const USAGE: &str = "usage: gpushare-sim-fault xid <gpu>[/<gi>/<ci>] <xid> | lost <gpu> | ecc <gpu> [--sbe N] [--dbe N] | remap <gpu> pending|failure | recovery <gpu> none|gpu-reset|node-reboot|drain-p2p|drain-and-reset | clear <gpu>";

const EXIT_BAD_INPUT: u8 = 2;
const EXIT_NO_NODE: u8 = 1;

/// One fault to raise.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fault {
    /// An Xid on a GPU, or on one of its MIG instances (GPU instance, compute instance).
    Xid { gpu: u32, instance: Option<(u32, u32)>, xid: u64 },
    /// Off the bus.
    Lost { gpu: u32 },
    /// More ECC errors.
    Ecc { gpu: u32, sbe: u64, dbe: u64 },
    /// A pending row remap.
    RemapPending { gpu: u32 },
    /// A row-remapping failure.
    RemapFailure { gpu: u32 },
    /// Field 230.
    Recovery { gpu: u32, action: RecoveryAction },
    /// Healthy again.
    Clear { gpu: u32 },
}

impl Fault {
    fn gpu(&self) -> u32 {
        match *self {
            Fault::Xid { gpu, .. }
            | Fault::Lost { gpu }
            | Fault::Ecc { gpu, .. }
            | Fault::RemapPending { gpu }
            | Fault::RemapFailure { gpu }
            | Fault::Recovery { gpu, .. }
            | Fault::Clear { gpu } => gpu,
        }
    }
}

/// `text` as a number, or a line naming the argument.
fn number<T: std::str::FromStr>(what: &str, text: &str) -> Result<T, String> {
    text.parse().map_err(|_| format!("{what} {text:?}: not a number"))
}

fn gpu_arg(text: Option<&String>) -> Result<u32, String> {
    let text = text.ok_or("<gpu>: missing")?;
    number("<gpu>", text)
}

fn no_more(rest: &[String]) -> Result<(), String> {
    match rest.first() {
        Some(extra) => Err(format!("{extra:?}: unexpected argument")),
        None => Ok(()),
    }
}

/// Parses the arguments (after the program's name).
fn parse(args: &[String]) -> Result<Fault, String> {
    let (command, rest) = args.split_first().ok_or("missing command")?;
    match command.as_str() {
        "xid" => {
            let target = rest.first().ok_or("<gpu>[/<gi>/<ci>]: missing")?;
            let parts: Vec<&str> = target.split('/').collect();
            let (gpu, instance) = match parts.as_slice() {
                [gpu] => (number("<gpu>", gpu)?, None),
                [gpu, gi, ci] => {
                    (number("<gpu>", gpu)?, Some((number("<gi>", gi)?, number("<ci>", ci)?)))
                }
                _ => return Err(format!("{target:?}: write <gpu> or <gpu>/<gi>/<ci>")),
            };
            let xid_text = rest.get(1).ok_or("<xid>: missing")?;
            let xid: u64 = number("<xid>", xid_text)?;
            if xid == 0 {
                return Err("<xid> \"0\": Xids are numbered from 1".into());
            }
            no_more(&rest[2..])?;
            Ok(Fault::Xid { gpu, instance, xid })
        }
        "lost" | "clear" => {
            let gpu = gpu_arg(rest.first())?;
            no_more(&rest[1..])?;
            Ok(if command == "lost" { Fault::Lost { gpu } } else { Fault::Clear { gpu } })
        }
        "ecc" => {
            let gpu = gpu_arg(rest.first())?;
            let (mut sbe, mut dbe) = (0, 0);
            let mut options = rest[1..].iter();
            while let Some(option) = options.next() {
                let slot = match option.as_str() {
                    "--sbe" => &mut sbe,
                    "--dbe" => &mut dbe,
                    other => return Err(format!("{other:?}: unknown option (--sbe N, --dbe N)")),
                };
                let value = options.next().ok_or_else(|| format!("{option}: missing N"))?;
                *slot = number(option, value)?;
                if *slot == 0 {
                    return Err(format!("{option} \"0\": write a number from 1"));
                }
            }
            if sbe == 0 && dbe == 0 {
                return Err("ecc: give --sbe N, --dbe N or both".into());
            }
            Ok(Fault::Ecc { gpu, sbe, dbe })
        }
        "remap" => {
            let gpu = gpu_arg(rest.first())?;
            let kind = rest.get(1).ok_or("pending|failure: missing")?;
            no_more(&rest[2..])?;
            match kind.as_str() {
                "pending" => Ok(Fault::RemapPending { gpu }),
                "failure" => Ok(Fault::RemapFailure { gpu }),
                other => Err(format!("{other:?}: write pending or failure")),
            }
        }
        "recovery" => {
            let gpu = gpu_arg(rest.first())?;
            let name = rest.get(1).ok_or("<action>: missing")?;
            no_more(&rest[2..])?;
            let action = RecoveryAction::from_name(name).ok_or_else(|| {
                format!(
                    "{name:?}: write none, gpu-reset, node-reboot, drain-p2p or drain-and-reset"
                )
            })?;
            Ok(Fault::Recovery { gpu, action })
        }
        other => Err(format!("{other:?}: unknown command")),
    }
}

/// Raises `fault` on `node`; an error (a GPU or instance the node lacks) changes nothing.
fn apply(node: &mut Node, fault: &Fault) -> Result<(), String> {
    let gpu = fault.gpu();
    let count = node.gpus.len();
    let g = node
        .gpus
        .get_mut(gpu as usize)
        .ok_or_else(|| format!("<gpu> {gpu}: the node has no such GPU (it has {count})"))?;
    let h = &mut g.health;
    let events = &mut node.events;
    match *fault {
        Fault::Xid { instance, xid, .. } => {
            if let Some((gi, ci)) = instance {
                let place = format!("{gpu}/{gi}/{ci}");
                if !g.mig_enabled {
                    return Err(format!("{place:?}: GPU {gpu} is not in MIG mode"));
                }
                let instance = g.instance(gi).ok_or_else(|| {
                    let gi_ids: Vec<String> =
                        g.instances.iter().map(|i| i.id.to_string()).collect();
                    format!(
                        "{place:?}: GPU {gpu} has no GPU instance {gi} (its GPU instances: {})",
                        if gi_ids.is_empty() { "none".to_string() } else { gi_ids.join(", ") }
                    )
                })?;
                if instance.compute_instance(ci).is_none() {
                    return Err(format!(
                        "{place:?}: GPU instance {gi} has no compute instance {ci}"
                    ));
                }
            }
            events.raise(gpu, EVENT_XID, xid, instance);
        }
        Fault::Lost { .. } => {
            if !h.lost {
                h.lost = true;
                events.raise(gpu, EVENT_GPU_UNAVAILABLE, 0, None);
            }
        }
        Fault::Ecc { sbe, dbe, .. } => {
            let e = &mut h.ecc;
            if sbe > 0 {
                e.corrected_volatile = e.corrected_volatile.saturating_add(sbe);
                e.corrected_aggregate = e.corrected_aggregate.saturating_add(sbe);
                events.raise(gpu, EVENT_SBE, 0, None);
            }
            if dbe > 0 {
                e.uncorrected_volatile = e.uncorrected_volatile.saturating_add(dbe);
                e.uncorrected_aggregate = e.uncorrected_aggregate.saturating_add(dbe);
                events.raise(gpu, EVENT_DBE, 0, None);
            }
        }
        Fault::RemapPending { .. } => {
            h.remap.uncorrectable = h.remap.uncorrectable.saturating_add(1);
            h.remap.pending = true;
        }
        Fault::RemapFailure { .. } => h.remap.failure = true,
        Fault::Recovery { action, .. } => {
            h.recovery_action = action;
            if action != RecoveryAction::None {
                events.raise(gpu, EVENT_RECOVERY_ACTION, u64::from(action.nvml_value()), None);
            }
        }
        Fault::Clear { .. } => h.after_reboot(),
    }
    Ok(())
}

/// Runs one invocation on the node in `file` (or the error finding it): the exit status, and
/// the line to print on stderr if any.
fn run(args: &[String], file: Result<NodeFile, String>) -> (u8, Option<String>) {
    let fault = match parse(args) {
        Ok(fault) => fault,
        Err(e) => return (EXIT_BAD_INPUT, Some(format!("gpushare-sim-fault: {e}; {USAGE}"))),
    };
    // `apply` errs before it changes anything, and `update` writes only a changed node.
    let applied = file.and_then(|file| file.update(|node| apply(node, &fault)));
    match applied {
        Ok(Ok(())) => (0, None),
        Ok(Err(e)) => (EXIT_BAD_INPUT, Some(format!("gpushare-sim-fault: {e}"))),
        Err(e) => (EXIT_NO_NODE, Some(format!("gpushare-sim-fault: {e}"))),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (status, line) = run(&args, NodeFile::from_env());
    if let Some(line) = line {
        eprintln!("{line}");
    }
    ExitCode::from(status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_catalog::parse_node_spec;
    use gpushare_sim_nvml::health::WHOLE_GPU;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    fn node() -> Node {
        let mut node = Node::new(&parse_node_spec("h100-80gb:2").unwrap());
        node.gpus[1].mig_enabled = true;
        let gi = gpushare_sim_nvml::rules::create_gpu_instance(&mut node, 1, 19, 0, 1).unwrap();
        gpushare_sim_nvml::rules::create_compute_instance(&mut node, 1, gi, 0).unwrap();
        node
    }

    fn raised(text: &str, node: &mut Node) -> Result<(), String> {
        apply(node, &parse(&args(text))?)
    }

    #[test]
    fn each_fault_changes_the_state_and_raises_its_event() {
        let mut n = node();
        let gi = n.gpus[1].instances[0].id;
        raised("xid 0 79", &mut n).unwrap();
        raised(&format!("xid 1/{gi}/0 43"), &mut n).unwrap();
        raised("lost 0", &mut n).unwrap();
        raised("lost 0", &mut n).unwrap();
        raised("ecc 1 --sbe 3 --dbe 2", &mut n).unwrap();
        raised("ecc 1 --dbe 1", &mut n).unwrap();
        raised("remap 1 pending", &mut n).unwrap();
        raised("remap 1 failure", &mut n).unwrap();
        raised("recovery 1 drain-and-reset", &mut n).unwrap();
        raised("recovery 1 none", &mut n).unwrap();
        let got: Vec<(u64, u32, u64, u64, u32, u32)> = (n.events.events.iter())
            .map(|e| (e.seq, e.gpu, e.event_type, e.event_data, e.gpu_instance, e.compute_instance))
            .collect();
        let w = WHOLE_GPU;
        assert_eq!(
            got,
            [
                (1, 0, EVENT_XID, 79, w, w),
                (2, 1, EVENT_XID, 43, gi, 0),
                (3, 0, EVENT_GPU_UNAVAILABLE, 0, w, w),
                (4, 1, EVENT_SBE, 0, w, w),
                (5, 1, EVENT_DBE, 0, w, w),
                (6, 1, EVENT_DBE, 0, w, w),
                (7, 1, EVENT_RECOVERY_ACTION, 4, w, w),
            ]
        );
        assert!(n.gpus[0].health.lost);
        let h = n.gpus[1].health;
        assert_eq!((h.ecc.corrected_aggregate, h.ecc.uncorrected_volatile), (3, 3));
        assert!(h.remap.pending && h.remap.failure && h.remap.uncorrectable == 1);
        assert_eq!(h.recovery_action, RecoveryAction::None);
        raised("clear 0", &mut n).unwrap();
        raised("clear 1", &mut n).unwrap();
        assert!(n.gpus[0].health.is_healthy());
        let h = n.gpus[1].health;
        assert!(!h.remap.pending && h.remap.failure, "the failure stays recorded");
        assert_eq!((h.ecc.uncorrected_volatile, h.ecc.uncorrected_aggregate), (0, 3));
    }

    #[test]
    fn bad_input_names_the_argument_and_changes_nothing() {
        let before = node();
        let no_ci = format!("xid 1/{}/7 79", before.gpus[1].instances[0].id);
        for (text, needle) in [
            ("", "missing command"),
            ("reboot 0", "\"reboot\": unknown command"),
            ("xid", "<gpu>[/<gi>/<ci>]: missing"),
            ("xid 0", "<xid>: missing"),
            ("xid x 79", "<gpu> \"x\": not a number"),
            ("xid 0 0", "numbered from 1"),
            ("xid 0 79 extra", "\"extra\": unexpected argument"),
            ("xid 0/1 79", "write <gpu> or <gpu>/<gi>/<ci>"),
            ("xid 2 79", "<gpu> 2: the node has no such GPU (it has 2)"),
            ("xid 0/1/0 79", "GPU 0 is not in MIG mode"),
            ("xid 1/9/0 79", "GPU 1 has no GPU instance 9"),
            (no_ci.as_str(), "no compute instance 7"),
            ("lost", "<gpu>: missing"),
            ("lost 5", "no such GPU"),
            ("ecc 0", "give --sbe N, --dbe N or both"),
            ("ecc 0 --sbe", "--sbe: missing N"),
            ("ecc 0 --sbe 0", "from 1"),
            ("ecc 0 --tbe 1", "\"--tbe\": unknown option"),
            ("remap 0 done", "write pending or failure"),
            ("recovery 0 reboot", "write none, gpu-reset"),
            ("clear 0 1", "unexpected argument"),
        ] {
            let mut n = before.clone();
            let e = raised(text, &mut n).unwrap_err();
            assert!(e.contains(needle), "{text}: {e}");
            assert!(!e.contains('\n'));
            assert_eq!(n, before, "{text}");
        }
    }
}
