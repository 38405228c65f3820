//! The driver's Xids, classified: for every Xid that NVIDIA's Xid catalogue gives an
//! immediate action, what that action asks of the operator and where the fault lies
//! (the whole GPU, or the MIG instance the event names), each entry with its source.
//! Pure data and lookups on std alone; the health watcher and every view read it.
//!
//! Written from the catalogue's "Xids" sheet
//! (<https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html>, rows 1 to 172),
//! column "Resolution Bucket (Immediate Action)", and its "Guidance Classes" sheet for
//! what each bucket means. DESIGN.md, "Health (issue 42): the Xid table", gives the rules
//! and the entries that are gpushare's reading rather than the catalogue's word.

/// What the driver's catalogue asks the operator to do. Ordered by what it takes to get
/// the GPU back, so the larger of two wins when faults add up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    /// Nothing: informational (the catalogue's IGNORE), or an Xid the table does not know.
    None,
    /// The application that hit the fault must restart; the GPU and every other tenant
    /// are unaffected (RESTART_APP).
    RestartApplication,
    /// Every process on the GPU must stop and the GPU be reset (RESET_GPU).
    ResetGpu,
    /// No new work on the GPU; running work may finish, then the GPU is reset (the
    /// recovery field's DRAIN_AND_RESET, and link-fatal NVLink errors).
    DrainAndReset,
    /// The node must be rebooted: a GPU reset is not enough (RESTART_BM).
    RebootNode,
}

impl Action {
    /// Every action, in order.
    pub const ALL: [Action; 5] = [
        Action::None,
        Action::RestartApplication,
        Action::ResetGpu,
        Action::DrainAndReset,
        Action::RebootNode,
    ];

    /// The stable name: metrics labels and `--json` carry it.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::None => "none",
            Action::RestartApplication => "restart-application",
            Action::ResetGpu => "reset-gpu",
            Action::DrainAndReset => "drain-and-reset",
            Action::RebootNode => "reboot-node",
        }
    }

    /// A short phrase for people.
    pub fn describe(self) -> &'static str {
        match self {
            Action::None => "nothing to do",
            Action::RestartApplication => "restart the application",
            Action::ResetGpu => "reset the GPU",
            Action::DrainAndReset => "let the GPU's work drain, then reset it",
            Action::RebootNode => "reboot the node",
        }
    }

    /// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`'s value as an action: nvml.h's
    /// `nvmlDeviceGpuRecoveryAction_t` is 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P,
    /// 4 drain P2P and reset, 5 recover IMEX domain. `None` for any other value, and for 5:
    /// an IMEX domain spans nodes and is recovered by the fabric's tools, not by anything
    /// done to this node's GPU; the caller logs the value it could not place.
    pub fn from_recovery_field(value: u64) -> Option<Action> {
        match value {
            0 => Some(Action::None),
            1 => Some(Action::ResetGpu),
            2 => Some(Action::RebootNode),
            // DRAIN_P2P is the first half of drain-and-reset: the catalogue's NVLink decode
            // sheet says a link-fatal error puts the GPU in a "drain and reset recommended"
            // state until its jobs drain, then in "reset required". Running work may
            // finish, new work must not start, and a reset follows, so it is the same
            // action as 4 for an operator.
            3 | 4 => Some(Action::DrainAndReset),
            _ => None,
        }
    }
}

/// Where an Xid's fault lies when the event names a MIG instance. An event that names no
/// instance (both ids 0xFFFFFFFF) is the whole GPU's whatever the entry says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// The whole GPU, every instance on it, whatever the event names: the remedy is a
    /// GPU reset or more, or the fault is the GPU's own (memory, links, firmware).
    Gpu,
    /// Contained to the GPU/compute instance the event names: one application's fault
    /// (nvml.h sets the instance ids when the Xid is attributable to an instance).
    Instance,
}

impl Reach {
    /// The stable name: `gpu` or `instance`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reach::Gpu => "gpu",
            Reach::Instance => "instance",
        }
    }
}

/// One Xid of the catalogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidEntry {
    /// The Xid number.
    pub xid: u32,
    /// The catalogue's short description ("unused (MNEMONIC)" where the catalogue says
    /// only "Unused": deprecated, or V100 and older).
    pub name: &'static str,
    /// The catalogue's immediate action, as one of the five.
    pub action: Action,
    /// The whole GPU, or the instance the event names.
    pub reach: Reach,
    /// One of the six Xids NVIDIA's device plugin and DRA driver ignore as the
    /// application's (13, 31, 43, 45, 68, 109); informative only, the action is the
    /// catalogue's.
    pub application: bool,
    /// Where this entry's action comes from: the catalogue's bucket, and gpushare's
    /// reading of it where the bucket is not one of the five actions.
    pub source: &'static str,
}

/// The Xids NVIDIA's k8s-device-plugin (`internal/rm/health.go`) and DRA driver
/// (`cmd/gpu-kubelet-plugin/device_health.go`) skip as application errors.
pub const APPLICATION_XIDS: [u32; 6] = [13, 31, 43, 45, 68, 109];

macro_rules! catalogue {
    ($bucket:literal) => {
        concat!(
            "Xid catalogue (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html): ",
            $bucket
        )
    };
}

const RESTART_APP: &str = catalogue!("RESTART_APP");
const IGNORE: &str = catalogue!("IGNORE");
const RESET_GPU: &str = catalogue!("RESET_GPU");
const RESTART_BM: &str = catalogue!("RESTART_BM (restart bare metal)");
// No automated action: the GPU leaves service until the operator has looked at it, and a
// reset is gpushare's way back in. These are mostly rows the catalogue marks "Unused" on
// A100 and newer; NVIDIA's NVSentinel also counts them fatal.
const CONTACT_SUPPORT: &str = catalogue!("CONTACT_SUPPORT; gpushare: reset the GPU");
// Solo: restart Fabric Manager; not solo: IGNORE, follow the other Xid. The application
// is already gone and gpushare does not run Fabric Manager.
const WORKFLOW_XID_45: &str = catalogue!("WORKFLOW_XID_45, not solo: IGNORE");
// Solo: RESET_GPU; with Xid 63 or 64: DRAIN_AND_RESET (those carry their own entries).
const WORKFLOW_XID_48: &str = catalogue!("WORKFLOW_XID_48, solo: RESET_GPU");
// The row's trigger text: "A GPU reset or node reboot is needed to clear this error".
const WORKFLOW_NVLINK_ERR: &str = catalogue!("WORKFLOW_NVLINK_ERR; trigger text: GPU reset");
// The action depends on the subcode and error status in the kernel log's message, which
// the NVML event does not carry; the fatal rows ask for RESET_GPU and link-fatal puts the
// GPU in "drain and reset". Xid 154 and the recovery field then say what the driver wants.
const WORKFLOW_NVLINK5_ERR: &str = catalogue!("WORKFLOW_NVLINK5_ERR; gpushare: drain and reset");
// Reseating a board or its power connectors needs the node powered off.
const CHECK_MECHANICALS: &str = catalogue!("CHECK_MECHANICALS; gpushare: reboot the node");
// A guest/host driver mismatch for vGPU: a software update, nothing a GPU reset fixes.
const UPDATE_SWFW: &str = catalogue!("UPDATE_SWFW; gpushare: nothing on the GPU");
// Confidential computing runs the agent in the VM that owns the GPU: restarting the VM is
// rebooting this node.
const RESTART_VM: &str = catalogue!("RESTART_VM; gpushare: reboot the node");
// "Follow XID 154 reported guidance": the recovery-action field carries it.
const XID_154: &str = catalogue!("XID_154; the recovery-action field says what");
// "If UVM/vGPU is being utilized, RESET_GPU; otherwise IGNORE": CUDA's managed memory is
// UVM, and the agent cannot tell whether a tenant uses it.
const CHECK_UVM: &str = catalogue!("CHECK_UVM; gpushare: reset the GPU");

const fn e(
    xid: u32,
    name: &'static str,
    action: Action,
    reach: Reach,
    source: &'static str,
) -> XidEntry {
    let mut application = false;
    let mut i = 0;
    while i < APPLICATION_XIDS.len() {
        application |= APPLICATION_XIDS[i] == xid;
        i += 1;
    }
    XidEntry { xid, name, action, reach, application, source }
}

const fn restart_app(xid: u32, name: &'static str) -> XidEntry {
    e(xid, name, Action::RestartApplication, Reach::Instance, RESTART_APP)
}

const fn reset_gpu(xid: u32, name: &'static str) -> XidEntry {
    e(xid, name, Action::ResetGpu, Reach::Gpu, RESET_GPU)
}

const fn contact_support(xid: u32, name: &'static str) -> XidEntry {
    e(xid, name, Action::ResetGpu, Reach::Gpu, CONTACT_SUPPORT)
}

/// IGNORE for one application's fault: reported against the instance it ran in.
const fn ignore_app(xid: u32, name: &'static str) -> XidEntry {
    e(xid, name, Action::None, Reach::Instance, IGNORE)
}

/// IGNORE for the GPU's own news (memory remapping, ECC rates, test messages).
const fn ignore_gpu(xid: u32, name: &'static str) -> XidEntry {
    e(xid, name, Action::None, Reach::Gpu, IGNORE)
}

use Action as A;
use Reach as R;

/// Every Xid the catalogue gives an immediate action, sorted by Xid. Rows 162 to 172 (power
/// smoothing, confidential-computing links, PCIe fatal timeout, WPR errors, SEC2 halt, the
/// DRAM/SRAM details of Xid 48) have none and are left to the unknown-Xid rule.
///
/// Where the catalogue differs from NVIDIA's device plugin, the catalogue wins: 109 (the
/// plugin ignores it) asks for a GPU reset; 94, a contained ECC error the plugin counts
/// fatal, asks only for the application's restart (the catalogue adds: reset the GPU when
/// convenient; the row-remap poll sees what is pending); every IGNORE and RESTART_APP
/// row outside the plugin's six (8, 32, 63, 92, ...) is fatal to the plugin and not here.
pub const TABLE: &[XidEntry] = &[
    contact_support(1, "unused (ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD)"),
    contact_support(2, "unused (ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD)"),
    contact_support(3, "unused (ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD)"),
    contact_support(4, "unused (ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY)"),
    contact_support(5, "unused (ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW)"),
    contact_support(6, "unused (ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR)"),
    contact_support(7, "unused (ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR)"),
    restart_app(8, "GPU stopped processing"),
    contact_support(9, "unused (ROBUST_CHANNEL_GR_ERROR_INSTANCE)"),
    contact_support(10, "unused (ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP)"),
    restart_app(11, "Invalid or corrupted push buffer stream"),
    contact_support(12, "unused (ROBUST_CHANNEL_GR_ERROR_SW_METHOD)"),
    restart_app(13, "Graphics Engine Exception"),
    ignore_app(14, "unused (ROBUST_CHANNEL_FAKE_ERROR)"),
    contact_support(15, "unused (ROBUST_CHANNEL_SCANLINE_TIMEOUT)"),
    contact_support(16, "unused (ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT)"),
    contact_support(17, "unused (ROBUST_CHANNEL_PARAMETER_ERROR)"),
    contact_support(18, "unused (ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR)"),
    contact_support(19, "unused (ROBUST_CHANNEL_DISP_MISSED_NOTIFIER)"),
    contact_support(20, "unused (ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD)"),
    contact_support(21, "unused (ROBUST_CHANNEL_ME_ERROR_SW_METHOD)"),
    contact_support(22, "unused (ROBUST_CHANNEL_VP_ERROR_SW_METHOD)"),
    contact_support(23, "unused (ROBUST_CHANNEL_RC_LOGGING_ENABLED)"),
    contact_support(24, "unused (ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT)"),
    restart_app(25, "Invalid or illegal push buffer stream"),
    contact_support(26, "unused (ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT)"),
    contact_support(27, "unused (ROBUST_CHANNEL_VP_ERROR)"),
    contact_support(28, "unused (ROBUST_CHANNEL_VP2_ERROR)"),
    contact_support(29, "unused (ROBUST_CHANNEL_BSP_ERROR)"),
    contact_support(30, "unused (ROBUST_CHANNEL_BAD_ADDR_ACCESS)"),
    restart_app(31, "GPU memory page fault"),
    restart_app(32, "Invalid or corrupted push buffer stream"),
    contact_support(33, "unused (ROBUST_CHANNEL_SEC_ERROR)"),
    contact_support(34, "unused (ROBUST_CHANNEL_MSVLD_ERROR)"),
    contact_support(35, "unused (ROBUST_CHANNEL_MSPDEC_ERROR)"),
    contact_support(36, "unused (ROBUST_CHANNEL_MSPPP_ERROR)"),
    ignore_app(37, "Driver firmware error"),
    ignore_app(38, "Driver firmware error"),
    restart_app(39, "Copy Engine Exception"),
    restart_app(40, "Copy Engine Exception"),
    restart_app(41, "Copy Engine Exception"),
    contact_support(42, "unused (ROBUST_CHANNEL_VIC_ERROR)"),
    ignore_app(43, "GPU stopped processing"),
    ignore_app(44, "Graphics Engine fault during context switch"),
    e(45, "Preemptive cleanup, due to previous errors", A::None, R::Instance, WORKFLOW_XID_45),
    reset_gpu(46, "GPU stopped processing"),
    contact_support(47, "unused (ROBUST_CHANNEL_NVENC0_ERROR)"),
    e(48, "Double Bit ECC Error", A::ResetGpu, R::Gpu, WORKFLOW_XID_48),
    contact_support(49, "unused (SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY)"),
    contact_support(50, "unused (SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR)"),
    contact_support(51, "unused (SILENT_RUNNING_STRESS_TEST_FAILURE)"),
    contact_support(52, "unused (SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE)"),
    contact_support(53, "unused (SILENT_RUNNING_TEMP_REDUCED_CLOCKING)"),
    e(
        54,
        "Auxiliary power is not connected to the GPU board",
        A::RebootNode,
        R::Gpu,
        CHECK_MECHANICALS,
    ),
    contact_support(55, "unused (SILENT_RUNNING_TEMPERATURE_READ_ERROR)"),
    contact_support(56, "unused (DISPLAY_CHANNEL_EXCEPTION)"),
    contact_support(57, "unused (FB_LINK_TRAINING_FAILURE_ERROR)"),
    contact_support(58, "unused (FB_MEMORY_ERROR)"),
    contact_support(59, "unused (PMU_ERROR)"),
    restart_app(60, "Video processor exception"),
    contact_support(61, "unused (PMU_BREAKPOINT)"),
    reset_gpu(62, "Internal micro-controller halt"),
    ignore_gpu(63, "GPU memory remapping event"),
    reset_gpu(64, "GPU memory remapping failure"),
    contact_support(65, "unused (ROBUST_CHANNEL_NVENC1_ERROR)"),
    ignore_app(66, "Illegal access by driver"),
    ignore_app(67, "Illegal access by driver"),
    restart_app(68, "NVDEC0 Exception"),
    restart_app(69, "Graphics Engine class error"),
    restart_app(70, "CE3: Unknown Error"),
    restart_app(71, "CE4: Unknown Error"),
    restart_app(72, "CE5: Unknown Error"),
    contact_support(73, "unused (ROBUST_CHANNEL_NVENC2_ERROR)"),
    e(74, "NVLINK Error", A::ResetGpu, R::Gpu, WORKFLOW_NVLINK_ERR),
    restart_app(75, "CE6: Unknown Error"),
    restart_app(76, "CE7: Unknown Error"),
    restart_app(77, "CE8: Unknown Error"),
    e(78, "vGPU Start Error", A::None, R::Gpu, UPDATE_SWFW),
    e(79, "GPU has fallen off the bus", A::RebootNode, R::Gpu, RESTART_BM),
    restart_app(80, "Corrupted data sent to GPU"),
    contact_support(81, "unused (ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR)"),
    restart_app(82, "NVJPG0 Error"),
    restart_app(83, "NVDEC1 Error"),
    restart_app(84, "NVDEC2 Error"),
    restart_app(85, "CE9: Unknown Error"),
    restart_app(86, "OFA Exception"),
    contact_support(87, "unused (NVTELEMETRY_DRIVER_REPORT)"),
    restart_app(88, "NVDEC3 Error"),
    restart_app(89, "NVDEC4 Error"),
    contact_support(90, "unused (LTC_ERROR)"),
    contact_support(91, "unused (RESERVED_XID)"),
    ignore_gpu(92, "High single-bit ECC error rate"),
    ignore_gpu(93, "Non-fatal violation of provisioned InfoROM wear limit"),
    restart_app(94, "Contained memory error"),
    reset_gpu(95, "Uncontained memory error"),
    restart_app(96, "NVDEC5 Error"),
    restart_app(97, "NVDEC6 Error"),
    restart_app(98, "NVDEC7 Error"),
    restart_app(99, "NVJPG1 Error"),
    restart_app(100, "NVJPG2 Error"),
    restart_app(101, "NVJPG3 Error"),
    restart_app(102, "NVJPG4 Error"),
    restart_app(103, "NVJPG5 Error"),
    restart_app(104, "NVJPG6 Error"),
    restart_app(105, "NVJPG7 Error"),
    ignore_gpu(106, "SMBPBI Test Message"),
    ignore_gpu(107, "SMBPBI Test Message Silent"),
    ignore_app(108, "unused (NVLINK_REMOTE_TRANSLATION_ERROR)"),
    reset_gpu(109, "Context Switch Timeout Error"),
    reset_gpu(110, "Security Fault Error"),
    contact_support(111, "unused (BUNDLE_ERROR_EVENT)"),
    contact_support(112, "unused (DISP_SUPERVISOR_ERROR)"),
    contact_support(113, "unused (DP_LT_FAILURE)"),
    contact_support(114, "unused (HEAD_RG_UNDERFLOW)"),
    contact_support(115, "unused (CORE_CHANNEL_REGS)"),
    contact_support(116, "unused (WINDOW_CHANNEL_REGS)"),
    contact_support(117, "unused (CURSOR_CHANNEL_REGS)"),
    contact_support(118, "unused (HEAD_REGS)"),
    reset_gpu(119, "GSP RPC Timeout"),
    reset_gpu(120, "GSP Error"),
    ignore_gpu(121, "C2C Error"),
    contact_support(122, "unused (SPI_PMU_RPC_READ_FAIL)"),
    contact_support(123, "unused (SPI_PMU_RPC_WRITE_FAIL)"),
    contact_support(124, "unused (SPI_PMU_RPC_ERASE_FAIL)"),
    contact_support(125, "unused (INFOROM_FS_ERROR)"),
    restart_app(126, "CE10: Unknown Error"),
    restart_app(127, "CE11: Unknown Error"),
    restart_app(128, "CE12: Unknown Error"),
    restart_app(129, "CE13: Unknown Error"),
    restart_app(130, "CE14: Unknown Error"),
    restart_app(131, "CE15: Unknown Error"),
    restart_app(132, "CE16: Unknown Error"),
    restart_app(133, "CE17: Unknown Error"),
    restart_app(134, "CE18: Unknown Error"),
    restart_app(135, "CE19: Unknown Error"),
    reset_gpu(136, "Link Training Failed"),
    ignore_app(137, "NVLink Privilege Error"),
    contact_support(138, "unused (ROBUST_CHANNEL_DLA_ERROR)"),
    restart_app(139, "OFA1 Error"),
    reset_gpu(140, "ECC Unrecovered Error"),
    ignore_app(141, "CUDA Fast Path Error"),
    contact_support(142, "NVENC3 Error"),
    reset_gpu(143, "GPU Initialization Error"),
    e(144, "NVLINK: SAW Error", A::DrainAndReset, R::Gpu, WORKFLOW_NVLINK5_ERR),
    e(145, "NVLINK: RLW Error", A::DrainAndReset, R::Gpu, WORKFLOW_NVLINK5_ERR),
    e(146, "NVLINK: TLW Error", A::DrainAndReset, R::Gpu, WORKFLOW_NVLINK5_ERR),
    e(147, "NVLINK: TREX Error", A::DrainAndReset, R::Gpu, WORKFLOW_NVLINK5_ERR),
    e(148, "NVLINK: NVLPW_CTRL Error", A::DrainAndReset, R::Gpu, WORKFLOW_NVLINK5_ERR),
    e(149, "NVLINK: NETIR Error", A::DrainAndReset, R::Gpu, WORKFLOW_NVLINK5_ERR),
    e(150, "NVLINK: MSE Error", A::DrainAndReset, R::Gpu, WORKFLOW_NVLINK5_ERR),
    e(151, "Key rotation Error", A::RebootNode, R::Gpu, RESTART_VM),
    ignore_app(152, "DLA SMMU Error"),
    ignore_app(153, "DLA timeout Error"),
    e(154, "GPU Recovery Action Changed", A::None, R::Gpu, XID_154),
    reset_gpu(155, "NVLINK: SW Defined Error"),
    reset_gpu(156, "Resource Retirement Event"),
    ignore_gpu(157, "Resource Retirement Failure"),
    reset_gpu(158, "GPU Fatal Timeout"),
    e(159, "CHI Non-Data Error", A::ResetGpu, R::Gpu, CHECK_UVM),
    ignore_gpu(160, "Channel Retirement Event"),
    ignore_gpu(161, "Channel Retirement Failure"),
];

/// The entry of an Xid; `None` for an Xid the table does not know (nvml.h's event data is
/// 999 for an Xid the driver itself cannot name).
pub fn entry(xid: u64) -> Option<&'static XidEntry> {
    let xid = u32::try_from(xid).ok()?;
    TABLE.binary_search_by_key(&xid, |e| e.xid).ok().map(|i| &TABLE[i])
}

/// How an Xid is classified: a known Xid gets its entry's action and reach; an unknown one
/// gets [`Action::None`] and [`Reach::Gpu`] and is kept as informational (the caller logs
/// it). The recovery-action field, polled, still catches a fault behind an unknown Xid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classification {
    /// The Xid as the event carried it.
    pub xid: u64,
    /// Its entry; `None` for an Xid the table does not know.
    pub entry: Option<&'static XidEntry>,
    /// The entry's action, or [`Action::None`].
    pub action: Action,
    /// The entry's reach, or [`Reach::Gpu`].
    pub reach: Reach,
}

impl Classification {
    /// Whether the table knows this Xid.
    pub fn is_known(&self) -> bool {
        self.entry.is_some()
    }
}

/// Classifies an Xid from an `nvmlEventTypeXidCriticalError` event's data.
pub fn classify(xid: u64) -> Classification {
    match entry(xid) {
        Some(e) => Classification { xid, entry: Some(e), action: e.action, reach: e.reach },
        None => Classification { xid, entry: None, action: Action::None, reach: Reach::Gpu },
    }
}

/// The action for an ECC event that comes without an Xid. A double-bit (uncorrectable)
/// error is the fault Xid 48 reports, whose solo action is a GPU reset (its trigger text:
/// "A GPU reset or node reboot is needed to clear this error"); the volatile DBE count
/// clears with the reset. A single-bit error was corrected: nothing to do.
pub fn ecc_action(double_bit: bool) -> Action {
    if double_bit { Action::ResetGpu } else { Action::None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_sorted_without_duplicates() {
        for pair in TABLE.windows(2) {
            assert!(pair[0].xid < pair[1].xid, "Xid {} then {}", pair[0].xid, pair[1].xid);
        }
    }

    #[test]
    fn every_entry_names_itself_and_its_source() {
        for e in TABLE {
            assert!(!e.name.trim().is_empty(), "Xid {} has no name", e.xid);
            assert!(e.source.starts_with("Xid catalogue ("), "Xid {}: {}", e.xid, e.source);
        }
    }

    #[test]
    fn the_six_application_xids_and_no_other_are_flagged() {
        let flagged: Vec<u32> = TABLE.iter().filter(|e| e.application).map(|e| e.xid).collect();
        assert_eq!(flagged, APPLICATION_XIDS);
    }

    #[test]
    fn the_catalogue_s_word_where_the_device_plugin_differs() {
        let at = |xid| entry(xid).unwrap_or_else(|| panic!("Xid {xid} missing"));
        assert_eq!((at(79).action, at(79).reach), (Action::RebootNode, Reach::Gpu));
        assert_eq!((at(94).action, at(94).reach), (Action::RestartApplication, Reach::Instance));
        assert_eq!((at(95).action, at(95).reach), (Action::ResetGpu, Reach::Gpu));
        assert_eq!((at(109).action, at(109).application), (Action::ResetGpu, true));
        assert_eq!(at(48).action, Action::ResetGpu);
        assert_eq!(at(13).action, Action::RestartApplication);
        assert_eq!(at(43).action, Action::None);
        assert_eq!(at(63).action, Action::None);
        assert_eq!(at(64).action, Action::ResetGpu);
        assert_eq!(at(74).action, Action::ResetGpu);
        assert!((144..=150).all(|x| at(x).action == Action::DrainAndReset));
    }

    #[test]
    fn the_datacenter_xids_of_the_brief_are_all_there() {
        let wanted = [13, 31, 32, 38, 43, 44, 45, 48, 56, 57, 58, 61, 62, 63, 64, 68, 69, 74, 79];
        let more = [92, 94, 95, 109, 110, 119, 120, 121, 122, 123, 124, 136, 140, 143, 154, 158];
        for xid in wanted.into_iter().chain(more).chain(144..=150) {
            assert!(entry(xid).is_some(), "Xid {xid} missing");
        }
    }

    #[test]
    fn a_reset_or_more_reaches_the_whole_gpu_and_an_application_s_fault_its_instance() {
        for e in TABLE {
            if e.action >= Action::ResetGpu {
                assert_eq!(e.reach, Reach::Gpu, "Xid {}", e.xid);
            }
            if e.action == Action::RestartApplication {
                assert_eq!(e.reach, Reach::Instance, "Xid {}", e.xid);
            }
        }
    }

    #[test]
    fn an_unknown_xid_is_informational_on_the_whole_gpu() {
        for xid in [0, 162, 172, 999, u64::from(u32::MAX), u64::from(u32::MAX) + 13, u64::MAX] {
            let c = classify(xid);
            assert_eq!((c.xid, c.entry, c.action, c.reach), (xid, None, Action::None, Reach::Gpu));
            assert!(!c.is_known());
        }
        let known = classify(79);
        assert!(known.is_known());
        assert_eq!((known.action, known.reach), (Action::RebootNode, Reach::Gpu));
    }

    #[test]
    fn the_recovery_field_s_values() {
        assert_eq!(Action::from_recovery_field(0), Some(Action::None));
        assert_eq!(Action::from_recovery_field(1), Some(Action::ResetGpu));
        assert_eq!(Action::from_recovery_field(2), Some(Action::RebootNode));
        assert_eq!(Action::from_recovery_field(3), Some(Action::DrainAndReset));
        assert_eq!(Action::from_recovery_field(4), Some(Action::DrainAndReset));
        for value in [5, 6, 7, 0xFFFF_FFFF, u64::MAX] {
            assert_eq!(Action::from_recovery_field(value), None, "value {value}");
        }
    }

    #[test]
    fn ecc_events_without_an_xid() {
        assert_eq!(ecc_action(true), entry(48).unwrap().action);
        assert_eq!(ecc_action(false), Action::None);
    }

    #[test]
    fn action_names_are_stable_and_distinct() {
        let names: Vec<&str> = Action::ALL.iter().map(|a| a.as_str()).collect();
        assert_eq!(
            names,
            ["none", "restart-application", "reset-gpu", "drain-and-reset", "reboot-node"]
        );
        assert!(Action::ALL.windows(2).all(|w| w[0] < w[1]));
        assert!(Action::ALL.iter().all(|a| !a.describe().is_empty()));
        assert_eq!(Action::RestartApplication.describe(), "restart the application");
        assert_eq!((Reach::Gpu.as_str(), Reach::Instance.as_str()), ("gpu", "instance"));
    }
}
