//! The simulated GPUs' faults (issue 42), as the node's JSON state file holds them: each
//! GPU's health ([`GpuHealth`]: off the bus, ECC counters, row remaps, the recovery-action
//! field) and the node's log of raised driver events ([`EventLog`]), with what a GPU reset
//! and a reboot do to them. A leaf: it uses nothing else of the crate; [`crate::node`]
//! holds these in the node, `gpushare-sim-fault` (sim/tools) raises them, the library
//! answers them (`abi::events`, `abi::health`).
//!
//! The serde field names are the file format: add fields with `#[serde(default)]`, never
//! rename one. A healthy GPU and an empty log are not written at all, so that the file of
//! a node that never saw a fault is what it was before issue 42.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// `nvmlEventTypeSingleBitEccError`.
pub const EVENT_SBE: u64 = 0x1;
/// `nvmlEventTypeDoubleBitEccError`.
pub const EVENT_DBE: u64 = 0x2;
/// `nvmlEventTypeXidCriticalError`.
pub const EVENT_XID: u64 = 0x8;
/// `nvmlEventTypeGpuUnavailableError`.
pub const EVENT_GPU_UNAVAILABLE: u64 = 0x4000;
/// `nvmlEventTypeGpuRecoveryAction`.
pub const EVENT_RECOVERY_ACTION: u64 = 0x8000;
/// What `nvmlDeviceGetSupportedEventTypes` answers on every simulated GPU: what an H100
/// with driver 580 answered (0xFF9F, tests/device/results/health-h100-2026-12-07): every
/// type up to the recovery action but the two it leaves out (0x20 and 0x40). The simulator
/// raises the ECC, Xid, GPU-unavailable and recovery-action events; the others are
/// accepted at registration and never raised.
pub const SUPPORTED_EVENTS: u64 = 0xFF9F;

/// The GPU- or compute-instance id of an event that concerns the whole GPU.
pub const WHOLE_GPU: u32 = 0xFFFF_FFFF;
/// How many raised events the node keeps (the oldest go first).
pub const EVENT_LOG_LEN: usize = 256;
/// Row-remapper banks of a healthy GPU (`Bank Remap Availability Histogram`'s `Max`, as
/// the real H100 showed it).
pub const REMAP_BANKS: u32 = 2560;

/// `nvmlDeviceGpuRecoveryAction_t`: the value of field `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`
/// (230).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryAction {
    /// `NVML_GPU_RECOVERY_ACTION_NONE` (0).
    #[default]
    None,
    /// `NVML_GPU_RECOVERY_ACTION_GPU_RESET` (1).
    GpuReset,
    /// `NVML_GPU_RECOVERY_ACTION_NODE_REBOOT` (2).
    NodeReboot,
    /// `NVML_GPU_RECOVERY_ACTION_DRAIN_P2P` (3).
    DrainP2p,
    /// `NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET` (4).
    DrainAndReset,
}

impl RecoveryAction {
    /// Every action, in value order.
    pub const ALL: [RecoveryAction; 5] = [
        RecoveryAction::None,
        RecoveryAction::GpuReset,
        RecoveryAction::NodeReboot,
        RecoveryAction::DrainP2p,
        RecoveryAction::DrainAndReset,
    ];

    /// The nvml.h value.
    pub fn nvml_value(self) -> u32 {
        self as u32
    }

    /// The name `gpushare-sim-fault recovery` takes.
    pub fn name(self) -> &'static str {
        match self {
            RecoveryAction::None => "none",
            RecoveryAction::GpuReset => "gpu-reset",
            RecoveryAction::NodeReboot => "node-reboot",
            RecoveryAction::DrainP2p => "drain-p2p",
            RecoveryAction::DrainAndReset => "drain-and-reset",
        }
    }

    /// How `nvidia-smi -q` shows it (`GPU Recovery Action`; the real H100 showed `None`,
    /// the other words are ours).
    pub fn smi_text(self) -> &'static str {
        match self {
            RecoveryAction::None => "None",
            RecoveryAction::GpuReset => "GPU Reset",
            RecoveryAction::NodeReboot => "Node Reboot",
            RecoveryAction::DrainP2p => "Drain P2P",
            RecoveryAction::DrainAndReset => "Drain and Reset",
        }
    }

    /// The action `gpushare-sim-fault` names so.
    pub fn from_name(name: &str) -> Option<RecoveryAction> {
        RecoveryAction::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// ECC error counts of one GPU's device memory (DRAM), as `nvmlDeviceGetTotalEccErrors`
/// answers them: volatile since the last reset or reboot, aggregate over the GPU's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EccCounters {
    /// Corrected (single-bit) errors since the last reset.
    #[serde(default)]
    pub corrected_volatile: u64,
    /// Corrected errors ever.
    #[serde(default)]
    pub corrected_aggregate: u64,
    /// Uncorrected (double-bit) errors since the last reset.
    #[serde(default)]
    pub uncorrected_volatile: u64,
    /// Uncorrected errors ever.
    #[serde(default)]
    pub uncorrected_aggregate: u64,
}

/// Row remapping (`nvmlDeviceGetRemappedRows`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowRemaps {
    /// Rows remapped for correctable errors.
    #[serde(default)]
    pub correctable: u32,
    /// Rows remapped for uncorrectable errors.
    #[serde(default)]
    pub uncorrectable: u32,
    /// A remapping waits for the next reset.
    #[serde(default)]
    pub pending: bool,
    /// A remapping ever failed.
    #[serde(default)]
    pub failure: bool,
}

/// One GPU's health; the default is healthy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuHealth {
    /// The GPU fell off the bus: every NVML call on it answers `NVML_ERROR_GPU_IS_LOST`
    /// until a reboot (or `gpushare-sim-fault clear`); nvidia-smi cannot reset it.
    #[serde(default)]
    pub lost: bool,
    /// ECC error counts.
    #[serde(default)]
    pub ecc: EccCounters,
    /// Row remapping.
    #[serde(default)]
    pub remap: RowRemaps,
    /// Field 230.
    #[serde(default)]
    pub recovery_action: RecoveryAction,
}

impl GpuHealth {
    /// Whether nothing is wrong (nothing is written then).
    pub fn is_healthy(&self) -> bool {
        *self == GpuHealth::default()
    }

    /// What a GPU reset does (`nvidia-smi -r`): a pending row remap takes effect (the
    /// remapped rows stay counted), the volatile ECC counts restart, the recovery action
    /// is done. A lost GPU is not reset (the caller refuses it).
    pub fn after_reset(&mut self) {
        self.remap.pending = false;
        self.ecc.corrected_volatile = 0;
        self.ecc.uncorrected_volatile = 0;
        self.recovery_action = RecoveryAction::None;
    }

    /// What a reboot does: as a reset, and the GPU is back on the bus.
    pub fn after_reboot(&mut self) {
        self.after_reset();
        self.lost = false;
    }

    /// `Bank Remap Availability Histogram` (`nvmlDeviceGetRowRemapperHistogram`): every
    /// bank at `Max` on a healthy GPU; each remapped row moves one bank from `Max` to
    /// `High` (a simple model: the real distribution is the memory's).
    pub fn remap_histogram(&self) -> [u32; 5] {
        let used =
            (self.remap.correctable.saturating_add(self.remap.uncorrectable)).min(REMAP_BANKS);
        [REMAP_BANKS - used, used, 0, 0, 0]
    }
}

/// One raised driver event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Node-wide, increasing from 1.
    pub seq: u64,
    /// The GPU's index.
    pub gpu: u32,
    /// One `nvmlEventType*` bit.
    pub event_type: u64,
    /// The Xid for an Xid event, the action for a recovery-action event, else 0.
    pub event_data: u64,
    /// The GPU instance it concerns, [`WHOLE_GPU`] for the whole GPU.
    pub gpu_instance: u32,
    /// The compute instance it concerns, [`WHOLE_GPU`] for the whole GPU.
    pub compute_instance: u32,
}

/// The node's raised events, the last [`EVENT_LOG_LEN`] of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventLog {
    /// The sequence number of the last event raised (0: none yet).
    #[serde(default)]
    pub last_seq: u64,
    /// The events kept, oldest first.
    #[serde(default)]
    pub events: VecDeque<Event>,
}

impl EventLog {
    /// Whether no event was ever raised (nothing is written then).
    pub fn is_empty(&self) -> bool {
        self.last_seq == 0 && self.events.is_empty()
    }

    /// Raises an event on `gpu` and returns its sequence number; the oldest event goes
    /// when the log is full.
    pub fn raise(
        &mut self,
        gpu: u32,
        event_type: u64,
        event_data: u64,
        instance: Option<(u32, u32)>,
    ) -> u64 {
        self.last_seq += 1;
        let (gpu_instance, compute_instance) = instance.unwrap_or((WHOLE_GPU, WHOLE_GPU));
        self.events.push_back(Event {
            seq: self.last_seq,
            gpu,
            event_type,
            event_data,
            gpu_instance,
            compute_instance,
        });
        while self.events.len() > EVENT_LOG_LEN {
            self.events.pop_front();
        }
        self.last_seq
    }

    /// The events raised after `seq`, oldest first.
    pub fn after(&self, seq: u64) -> impl Iterator<Item = &Event> {
        self.events.iter().filter(move |e| e.seq > seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_keeps_the_last_events_with_increasing_numbers() {
        let mut log = EventLog::default();
        assert!(log.is_empty());
        for i in 0..300u64 {
            assert_eq!(log.raise(1, EVENT_XID, i, None), i + 1);
        }
        assert_eq!(log.events.len(), EVENT_LOG_LEN);
        assert_eq!(log.events.front().unwrap().seq, 300 - EVENT_LOG_LEN as u64 + 1);
        assert_eq!(log.after(298).map(|e| e.event_data).collect::<Vec<_>>(), [298, 299]);
        let e = log.raise(0, EVENT_XID, 43, Some((2, 0)));
        let last = log.events.back().unwrap();
        assert_eq!((e, last.gpu_instance, last.compute_instance), (301, 2, 0));
        assert_eq!(log.events[0].gpu_instance, WHOLE_GPU);
    }

    #[test]
    fn a_reset_settles_what_a_reset_settles_and_a_reboot_the_rest() {
        let mut h = GpuHealth {
            lost: true,
            ecc: EccCounters {
                corrected_volatile: 3,
                corrected_aggregate: 5,
                uncorrected_volatile: 1,
                uncorrected_aggregate: 2,
            },
            remap: RowRemaps { correctable: 0, uncorrectable: 1, pending: true, failure: true },
            recovery_action: RecoveryAction::GpuReset,
        };
        assert_eq!(h.remap_histogram(), [REMAP_BANKS - 1, 1, 0, 0, 0]);
        h.after_reset();
        assert!(h.lost && !h.remap.pending && h.remap.failure);
        assert_eq!((h.remap.uncorrectable, h.ecc.corrected_aggregate), (1, 5));
        assert_eq!((h.ecc.corrected_volatile, h.ecc.uncorrected_volatile), (0, 0));
        assert_eq!(h.recovery_action, RecoveryAction::None);
        h.after_reboot();
        assert!(!h.lost);
        assert!(GpuHealth::default().is_healthy() && !h.is_healthy());
        for a in RecoveryAction::ALL {
            assert_eq!(RecoveryAction::from_name(a.name()), Some(a));
        }
        assert_eq!(RecoveryAction::DrainAndReset.nvml_value(), 4);
        assert_eq!(serde_json::to_string(&RecoveryAction::DrainP2p).unwrap(), "\"drain_p2p\"");
    }
}
