//! What keeps a GPU from being reset on this host, found before a plan's first step without
//! changing anything (issue 26, point 5): a plan that resets a GPU to change its MIG mode
//! (Ampere) is refused when the reset cannot work, rather than leave the mode pending.
//!
//! Each rule, and what it rests on:
//!
//! - **A vGPU guest** (NVML virtualization mode `VGPU`): the vGPU profile on the hypervisor
//!   sets MIG mode, which a guest cannot change (NVIDIA's DRA driver skips such GPUs: "a
//!   guest cannot dynamically repartition a vGPU", NVIDIA/k8s-dra-driver-gpu
//!   `isDynamicMIGCapable`; mig-parted#9: "If you are using vGPU, MIG configuration changes
//!   need to be done through VMware").
//! - **A GPU passed through to a VM that offers no function-level reset** (virtualization
//!   mode `PASSTHROUGH`, and the PCI function the guest sees lacks FLR: sysfs
//!   `reset_method` without `flr`, or, on kernels before 5.15, the FLR bit (28) of its PCI
//!   Express Device Capabilities). Pass-through alone is no blocker: a cloud H100 VM
//!   reports "Pass-Through", offers FLR (`reset_method: flr`, DevCap 0x10008021) and
//!   `nvidia-smi -r` reset it. nvidia-smi resets by FLR unless told `-r bus`
//!   (nvidia-smi(1)); the driver's FLR goes through the kernel's `pcie_reset_flr`, which
//!   refuses a function without the capability (open-gpu-kernel-modules
//!   `os_pci_trigger_flr`); NVIDIA's MIG user guide says that "in some cases, GPU reset is
//!   not allowed via the hypervisor" for an A100 in passthrough, where `nvidia-smi
//!   --gpu-reset` answers "Resetting GPU 00000000:00:03.0 is not supported." and only a
//!   reboot of the VM makes the mode take effect; NVIDIA's DRA driver hit this on GCP
//!   a2-highgpu (A100) VMs, leaving GPUs in "GPU requires reset"
//!   (kubernetes-sigs/dra-driver-nvidia-gpu#883). On bare metal a GPU without FLR is
//!   reset another way (a bus reset), so the rule is for pass-through only.
//! - **`nvidia_drm` loaded with `modeset=Y`** (`/sys/module/nvidia_drm/parameters/modeset`):
//!   with modesetting, nvidia-drm allocates an NVKMS device on every GPU when it loads
//!   and keeps it (open-gpu-kernel-modules `nv_drm_load`; without modesetting it returns
//!   before), so `nvidia-smi -r` finds every GPU "In use by another client"
//!   (NVIDIA/mig-parted#181, documented as a known issue in mig-parted's README;
//!   ComputeCanada/puppet-magic_castle#387). Drivers from 560 load it with `modeset=Y` by
//!   default.
//! - **An Ampere GPU on an NVSwitch system without Fabric Manager**: "On Ampere NVSwitch
//!   systems, Fabric Manager is required to facilitate reset"; without it every GPU
//!   NVLink-connected to the one reset must be reset in the same command, and a reset of
//!   one GPU (`-i N`, as the agent runs it) is refused (nvidia-smi(1), `-r`; Hopper and
//!   later no longer need it). NVSwitches are the NVIDIA PCI functions of class `0x0680`
//!   ("Bridge: other"; the nvidia driver claims every such device as an NVSwitch); Fabric
//!   Manager runs when a process named `nv-fabricmanager` does (`comm`, cut to 15 bytes),
//!   wherever it was started from (a systemd unit, the GPU Operator's driver container).
//!
//! The host's files are read under a root directory, `/` on a real host, the simulated
//! host beside the node's state file under `--simulate` (agent.toml `host_root`). What
//! cannot be read is not a blocker: the reset then runs and reports its own failure.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use nvml_wrapper::enum_wrappers::device::GpuVirtualizationMode;
use nvml_wrapper::enums::device::DeviceArchitecture;

use super::NvmlBackend;

/// The call name of the blocker query's errors.
const CALL: &str = "reset_blocker";
/// NVIDIA's PCI vendor id, as sysfs writes it.
const NVIDIA_VENDOR: &str = "0x10de";
/// PCI class "Bridge: other", which the nvidia driver claims as NVSwitch (sysfs writes the
/// class as `0x068000`).
const NVSWITCH_CLASS: &str = "0x0680";
/// Fabric Manager's command name as the kernel keeps it (15 bytes of `nv-fabricmanager`).
const FABRIC_MANAGER_COMM: &str = "nv-fabricmanage";

/// Why a GPU cannot be reset on this host; see the module docs for each rule's sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetBlocker {
    /// A vGPU inside a VM: the hypervisor's vGPU profile sets MIG mode.
    VgpuGuest,
    /// Passed through to a VM whose PCI function offers no function-level reset.
    PassthroughWithoutFlr {
        /// What showed it (`reset methods: bus`, `no FLR in its PCIe capabilities`).
        evidence: String,
    },
    /// `nvidia_drm` is loaded with `modeset=Y`.
    NvidiaDrmModeset,
    /// An Ampere GPU among NVSwitches whose Fabric Manager does not run.
    NoFabricManager {
        /// NVSwitches found.
        nvswitches: usize,
    },
}

impl ResetBlocker {
    /// Why, in a clause of its own about one GPU or, `many`, several ("it"/"they").
    pub fn cause(&self, many: bool) -> String {
        let (it, is, them) = if many { ("they", "are", "them") } else { ("it", "is", "it") };
        match self {
            ResetBlocker::VgpuGuest => format!(
                "{it} {is} {} in a virtual machine, whose MIG mode the vGPU profile on the \
                 hypervisor sets",
                if many { "vGPUs" } else { "a vGPU" }
            ),
            ResetBlocker::PassthroughWithoutFlr { evidence } => format!(
                "{it} {is} passed through to a virtual machine that does not let {them} be reset \
                 (no function-level reset: {evidence})"
            ),
            ResetBlocker::NvidiaDrmModeset => format!("nvidia_drm holds {them} with modeset=Y"),
            ResetBlocker::NoFabricManager { nvswitches } => format!(
                "on this NVSwitch system ({nvswitches} NVSwitches) an Ampere GPU is reset alone \
                 only through NVIDIA Fabric Manager, which is not running"
            ),
        }
    }

    /// What to do, for the GPUs `gpus` (indexes, as nvidia-smi's `-i` takes them) whose
    /// MIG mode the plan sets to `mig_mode` (`None`: a mode already pending).
    pub fn remedy(&self, gpus: &[u32], mig_mode: Option<bool>) -> String {
        match self {
            ResetBlocker::VgpuGuest => {
                "choose a vGPU profile with the MIG layout wanted on the hypervisor".to_owned()
            }
            ResetBlocker::PassthroughWithoutFlr { .. } => {
                let ids: Vec<String> = gpus.iter().map(u32::to_string).collect();
                match mig_mode {
                    Some(on) => format!(
                        "set the mode with nvidia-smi -i {} -mig {} and reboot the VM, which \
                         makes it take effect, then apply again",
                        ids.join(","),
                        u8::from(on)
                    ),
                    None => "reboot the VM, which makes the pending MIG mode take effect, then \
                             apply again"
                        .to_owned(),
                }
            }
            ResetBlocker::NvidiaDrmModeset => {
                "stop the display manager and run modprobe -r nvidia_drm, or boot with \
                 nvidia-drm.modeset=0, then apply again"
                    .to_owned()
            }
            ResetBlocker::NoFabricManager { .. } => {
                "start it with systemctl start nvidia-fabricmanager, then apply again".to_owned()
            }
        }
    }
}

/// What NVML says of a GPU that the rules need.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GpuFacts {
    /// NVML's virtualization mode, when it answered.
    virtualization: Option<GpuVirtualizationMode>,
    /// Whether it is an Ampere GPU.
    ampere: bool,
    /// Its PCI bus id as NVML gives it (`00000000:1B:00.0`).
    bus_id: String,
}

impl NvmlBackend {
    /// [`crate::gpu::GpuBackend::reset_blocker`]: NVML's facts of the GPU, then the host's
    /// files under `host_root`. An NVML error is logged and blocks nothing.
    pub(super) fn find_reset_blocker(&self, gpu: u32, host_root: &Path) -> Option<ResetBlocker> {
        let facts = self.with_session(CALL, Some(gpu), |s| {
            let device = s.device(CALL, gpu)?;
            let bus_id = device
                .pci_info()
                .map_err(|e| {
                    super::errors::wrapper_error(CALL, Some(gpu), "nvmlDeviceGetPciInfo_v3", e)
                })?
                .bus_id;
            // Answered NOT_SUPPORTED by drivers and GPUs that predate it: bare metal.
            let virtualization = device.virtualization_mode().ok();
            let ampere = matches!(device.architecture(), Ok(DeviceArchitecture::Ampere));
            Ok(GpuFacts { virtualization, ampere, bus_id })
        });
        match facts {
            Ok(facts) => blocker_of(&facts, &Host::new(host_root)),
            Err(e) => {
                tracing::warn!(gpu, "cannot tell whether the GPU can be reset: {e}");
                None
            }
        }
    }
}

/// The rules of the module docs, in their order.
fn blocker_of(gpu: &GpuFacts, host: &Host) -> Option<ResetBlocker> {
    match gpu.virtualization {
        Some(GpuVirtualizationMode::Vgpu) => return Some(ResetBlocker::VgpuGuest),
        Some(GpuVirtualizationMode::PassThrough) => {
            if let Some(Flr::Absent(evidence)) = host.flr(&gpu.bus_id) {
                return Some(ResetBlocker::PassthroughWithoutFlr { evidence });
            }
        }
        _ => {}
    }
    if host.nvidia_drm_modeset() == Some(true) {
        return Some(ResetBlocker::NvidiaDrmModeset);
    }
    if gpu.ampere {
        let nvswitches = host.nvswitches();
        if nvswitches > 0 && host.fabric_manager_running() == Some(false) {
            return Some(ResetBlocker::NoFabricManager { nvswitches });
        }
    }
    None
}

/// Whether a PCI function offers a function-level reset.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Flr {
    /// It does.
    Offered,
    /// It does not; what showed it.
    Absent(String),
}

/// The host's files under a root directory (`/` on a real host).
#[derive(Debug, Clone)]
struct Host {
    root: PathBuf,
}

impl Host {
    fn new(root: &Path) -> Host {
        Host { root: root.to_path_buf() }
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }

    /// `nvidia_drm`'s `modeset` parameter: `None` when the module is not loaded (or the
    /// parameter cannot be read).
    fn nvidia_drm_modeset(&self) -> Option<bool> {
        let text =
            fs::read_to_string(self.path("sys/module/nvidia_drm/parameters/modeset")).ok()?;
        match text.trim() {
            "Y" | "y" | "1" => Some(true),
            "N" | "n" | "0" => Some(false),
            _ => None,
        }
    }

    /// The sysfs directory of the PCI function NVML names `bus_id` (`00000000:1B:00.0` is
    /// `0000:1b:00.0` there; sysfs writes the domain with at least 4 digits).
    fn pci_dir(&self, bus_id: &str) -> Option<PathBuf> {
        let (domain, rest) = bus_id.trim().split_once(':')?;
        let domain = u32::from_str_radix(domain, 16).ok()?;
        let name = format!("{domain:04x}:{}", rest.to_ascii_lowercase());
        Some(self.path("sys/bus/pci/devices").join(name))
    }

    /// Whether the PCI function `bus_id` offers FLR: its `reset_method` (Linux 5.15 and
    /// later) lists `flr`, or else its PCI Express capability has the FLR bit. `None` when
    /// neither can be read (configuration space past 64 bytes needs root).
    fn flr(&self, bus_id: &str) -> Option<Flr> {
        let dir = self.pci_dir(bus_id)?;
        match fs::read_to_string(dir.join("reset_method")) {
            Ok(methods) => {
                let methods = methods.trim();
                return Some(if methods.split_whitespace().any(|m| m == "flr") {
                    Flr::Offered
                } else if methods.is_empty() {
                    Flr::Absent("no reset method".to_owned())
                } else {
                    Flr::Absent(format!("reset methods {methods}"))
                });
            }
            // Without a reset method at all, Linux shows no reset_method either.
            Err(_)
                if dir.exists() && !dir.join("reset").exists() && self.has_reset_method_files() =>
            {
                return Some(Flr::Absent("no reset method".to_owned()));
            }
            Err(_) => {}
        }
        let config = fs::read(dir.join("config")).ok()?;
        devcap_flr(&config).map(|offered| {
            if offered {
                Flr::Offered
            } else {
                Flr::Absent("no FLR in its PCI Express capabilities".to_owned())
            }
        })
    }

    /// Whether this kernel shows `reset_method` (some PCI function has one): only then
    /// does a missing one mean that its function has no reset method.
    fn has_reset_method_files(&self) -> bool {
        let Ok(entries) = fs::read_dir(self.path("sys/bus/pci/devices")) else { return false };
        entries.flatten().any(|e| e.path().join("reset_method").exists())
    }

    /// The NVSwitches: NVIDIA PCI functions of class "Bridge: other".
    fn nvswitches(&self) -> usize {
        let Ok(entries) = fs::read_dir(self.path("sys/bus/pci/devices")) else { return 0 };
        let read = |dir: &Path, name: &str| {
            fs::read_to_string(dir.join(name)).map(|s| s.trim().to_ascii_lowercase())
        };
        entries
            .flatten()
            .filter(|e| {
                let dir = e.path();
                read(&dir, "vendor").is_ok_and(|v| v == NVIDIA_VENDOR)
                    && read(&dir, "class").is_ok_and(|c| c.starts_with(NVSWITCH_CLASS))
            })
            .count()
    }

    /// Whether a process named `nv-fabricmanager` runs; `None` when `proc/` cannot be
    /// read.
    fn fabric_manager_running(&self) -> Option<bool> {
        let entries = fs::read_dir(self.path("proc")).ok()?;
        Some(entries.flatten().any(|e| {
            let pid = e.file_name();
            pid.to_str().is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()))
                && fs::read_to_string(e.path().join("comm"))
                    .is_ok_and(|comm| comm.trim_end() == FABRIC_MANAGER_COMM)
        }))
    }
}

/// The FLR bit of the PCI Express capability in a function's configuration space: walks
/// the capability list from 0x34; `None` when it is cut short (read without root) or has
/// no PCI Express capability.
fn devcap_flr(config: &[u8]) -> Option<bool> {
    const CAP_POINTER: usize = 0x34;
    const CAP_PCI_EXPRESS: u8 = 0x10;
    const DEVCAP_FLR: u32 = 1 << 28;
    let mut at = usize::from(*config.get(CAP_POINTER)?) & !3;
    // At most 48 capabilities fit in 256 bytes: no loop outlasts a malformed list.
    for _ in 0..48 {
        if at < 0x40 {
            return None;
        }
        let (id, next) = (*config.get(at)?, *config.get(at + 1)?);
        if id == CAP_PCI_EXPRESS {
            let devcap = u32::from_le_bytes(config.get(at + 4..at + 8)?.try_into().ok()?);
            return Some(devcap & DEVCAP_FLR != 0);
        }
        at = usize::from(next) & !3;
    }
    None
}

/// The GPUs of one refusal line: `GPU 0 (A100-SXM4-40GB) and GPU 1 (A100-SXM4-40GB)`.
pub fn join_labels(labels: &[String]) -> String {
    match labels {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => {
            let mut s = init.join(", ");
            let _ = write!(s, " and {last}");
            s
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A100: &str = "00000000:1B:00.0";

    fn gpu(virtualization: Option<GpuVirtualizationMode>, ampere: bool) -> GpuFacts {
        GpuFacts { virtualization, ampere, bus_id: A100.to_owned() }
    }

    /// A host directory with `files` (path, content).
    fn host(files: &[(&str, &[u8])]) -> (tempfile::TempDir, Host) {
        let dir = tempfile::tempdir().unwrap();
        for (path, content) in files {
            let path = dir.path().join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, content).unwrap();
        }
        let host = Host::new(dir.path());
        (dir, host)
    }

    /// 256 bytes of configuration space with a PCI Express capability at 0x60 (after one
    /// power-management capability at 0x40) whose DevCap is `devcap`.
    fn config(devcap: u32) -> Vec<u8> {
        let mut c = vec![0u8; 256];
        c[0x34] = 0x40;
        c[0x40] = 0x01;
        c[0x41] = 0x60;
        c[0x60] = 0x10;
        c[0x64..0x68].copy_from_slice(&devcap.to_le_bytes());
        c
    }

    #[test]
    fn pass_through_blocks_only_without_flr() {
        let passthrough = gpu(Some(GpuVirtualizationMode::PassThrough), true);
        // The cloud H100 VM: reset_method "flr", DevCap 0x10008021.
        let (_d, h) = host(&[("sys/bus/pci/devices/0000:1b:00.0/reset_method", b"flr\n")]);
        assert_eq!(blocker_of(&passthrough, &h), None);
        let (_d, h) = host(&[("sys/bus/pci/devices/0000:1b:00.0/reset_method", b"bus\n")]);
        assert_eq!(
            blocker_of(&passthrough, &h),
            Some(ResetBlocker::PassthroughWithoutFlr { evidence: "reset methods bus".into() })
        );
        // Bare metal without FLR is reset another way.
        assert_eq!(blocker_of(&gpu(Some(GpuVirtualizationMode::Bare), true), &h), None);
        assert_eq!(blocker_of(&gpu(None, true), &h), None);
        // A kernel before 5.15: the capability itself.
        let (_d, h) = host(&[("sys/bus/pci/devices/0000:1b:00.0/config", &config(0x0000_8021))]);
        assert_eq!(
            blocker_of(&passthrough, &h),
            Some(ResetBlocker::PassthroughWithoutFlr {
                evidence: "no FLR in its PCI Express capabilities".into()
            })
        );
        let (_d, h) = host(&[("sys/bus/pci/devices/0000:1b:00.0/config", &config(0x1000_8021))]);
        assert_eq!(blocker_of(&passthrough, &h), None);
        // Read without root, the configuration space stops at 64 bytes: unknown, no blocker.
        let (_d, h) = host(&[("sys/bus/pci/devices/0000:1b:00.0/config", &config(0)[..64])]);
        assert_eq!(blocker_of(&passthrough, &h), None);
        // A kernel that shows reset_method for other functions but none for this one: no
        // reset method at all.
        let (_d, h) = host(&[
            ("sys/bus/pci/devices/0000:1b:00.0/config", &config(0x1000_8021)),
            ("sys/bus/pci/devices/0000:00:01.0/reset_method", b"pm\n"),
        ]);
        assert_eq!(
            blocker_of(&passthrough, &h),
            Some(ResetBlocker::PassthroughWithoutFlr { evidence: "no reset method".into() })
        );
        // Nothing readable: no blocker.
        let (_d, h) = host(&[]);
        assert_eq!(blocker_of(&passthrough, &h), None);
    }

    #[test]
    fn a_vgpu_guest_is_always_blocked() {
        let (_d, h) = host(&[]);
        assert_eq!(
            blocker_of(&gpu(Some(GpuVirtualizationMode::Vgpu), false), &h),
            Some(ResetBlocker::VgpuGuest)
        );
        // A vGPU host is not a guest.
        assert_eq!(blocker_of(&gpu(Some(GpuVirtualizationMode::HostVgpu), true), &h), None);
    }

    #[test]
    fn nvidia_drm_blocks_with_modesetting_only() {
        let bare = gpu(Some(GpuVirtualizationMode::Bare), false);
        let modeset = "sys/module/nvidia_drm/parameters/modeset";
        for (value, blocked) in [(&b"Y\n"[..], true), (b"N\n", false), (b"1", true), (b"0", false)]
        {
            let (_d, h) = host(&[(modeset, value)]);
            let expected = blocked.then_some(ResetBlocker::NvidiaDrmModeset);
            assert_eq!(blocker_of(&bare, &h), expected, "{value:?}");
        }
        let (_d, h) = host(&[("sys/module/nvidia/parameters/x", b"1")]);
        assert_eq!(blocker_of(&bare, &h), None, "not loaded");
    }

    #[test]
    fn ampere_among_nvswitches_needs_fabric_manager() {
        let switch: [(&str, &[u8]); 2] = [
            ("sys/bus/pci/devices/0000:c4:00.0/vendor", b"0x10de\n"),
            ("sys/bus/pci/devices/0000:c4:00.0/class", b"0x068000\n"),
        ];
        let gpu_dir: [(&str, &[u8]); 2] = [
            ("sys/bus/pci/devices/0000:1b:00.0/vendor", b"0x10de\n"),
            ("sys/bus/pci/devices/0000:1b:00.0/class", b"0x030200\n"),
        ];
        let fm: (&str, &[u8]) = ("proc/4127/comm", b"nv-fabricmanage\n");
        let other: (&str, &[u8]) = ("proc/1/comm", b"systemd\n");
        let a100 = gpu(Some(GpuVirtualizationMode::Bare), true);
        let h100 = gpu(Some(GpuVirtualizationMode::Bare), false);

        let (_d, h) = host(&[switch[0], switch[1], gpu_dir[0], gpu_dir[1], other]);
        assert_eq!(h.nvswitches(), 1);
        assert_eq!(blocker_of(&a100, &h), Some(ResetBlocker::NoFabricManager { nvswitches: 1 }));
        assert_eq!(blocker_of(&h100, &h), None, "Hopper resets without Fabric Manager");
        let (_d, h) = host(&[switch[0], switch[1], other, fm]);
        assert_eq!(blocker_of(&a100, &h), None);
        // No NVSwitch: Fabric Manager is not needed.
        let (_d, h) = host(&[gpu_dir[0], gpu_dir[1], other]);
        assert_eq!(blocker_of(&a100, &h), None);
        // proc/ unreadable: unknown, no blocker.
        let (_d, h) = host(&[switch[0], switch[1]]);
        assert_eq!(blocker_of(&a100, &h), None);
    }

    #[test]
    fn the_simulated_host_reads_as_a_real_one() {
        use gpushare_sim_nvml::node::{FabricManager, Node, NvidiaDrm};
        let dir = tempfile::tempdir().unwrap();
        let mut node = Node::new(&crate::catalog::parse_node_spec("a100-40gb:2").unwrap());
        node.gpus[1].flr = false;
        node.host.nvidia_drm = Some(NvidiaDrm { modeset: false });
        node.host.nvswitches = 6;
        gpushare_sim_nvml::host::render(dir.path(), &node).unwrap();
        let h = Host::new(dir.path());
        assert_eq!(h.flr("00000000:1B:00.0"), Some(Flr::Offered));
        assert_eq!(h.flr("00000000:1C:00.0"), Some(Flr::Absent("reset methods bus".into())));
        assert_eq!(h.nvidia_drm_modeset(), Some(false));
        assert_eq!((h.nvswitches(), h.fabric_manager_running()), (6, Some(true)));
        node.host.fabric_manager = FabricManager::Stopped;
        gpushare_sim_nvml::host::render(dir.path(), &node).unwrap();
        assert_eq!(h.fabric_manager_running(), Some(false));
        // The configuration space says the same as reset_method.
        let config = fs::read(dir.path().join("sys/bus/pci/devices/0000:1c:00.0/config")).unwrap();
        assert_eq!(devcap_flr(&config), Some(false));
    }

    #[test]
    fn capability_lists_are_walked_safely() {
        assert_eq!(devcap_flr(&config(1 << 28)), Some(true));
        assert_eq!(devcap_flr(&[]), None);
        let mut looped = config(0);
        looped[0x60] = 0x05;
        looped[0x61] = 0x40;
        assert_eq!(devcap_flr(&looped), None, "a cycle ends");
    }

    #[test]
    fn refusal_clauses_name_the_remedy() {
        let drm = ResetBlocker::NvidiaDrmModeset;
        assert_eq!(drm.cause(false), "nvidia_drm holds it with modeset=Y");
        assert_eq!(drm.cause(true), "nvidia_drm holds them with modeset=Y");
        assert!(drm.remedy(&[0], Some(true)).contains("nvidia-drm.modeset=0"));
        let vm = ResetBlocker::PassthroughWithoutFlr { evidence: "reset methods bus".into() };
        assert_eq!(
            vm.remedy(&[0, 1], Some(true)),
            "set the mode with nvidia-smi -i 0,1 -mig 1 and reboot the VM, which makes it take \
             effect, then apply again"
        );
        assert!(vm.remedy(&[0], None).starts_with("reboot the VM"));
        assert_eq!(join_labels(&["a".into(), "b".into(), "c".into()]), "a, b and c");
    }
}
