//! The simulated host: the files of a Linux host that decide whether a GPU can be reset,
//! under a directory that stands for `/`, beside the node's state file (`<state>.host/`).
//! `gpushare-agent --simulate` reads them there (its `host_root` setting) with the very
//! code that reads `/` on a real host.
//!
//! Written from the node ([`Node::host`], each GPU's `flr` and MIG instances) whenever the
//! node is written (every first `nvmlInit` of a process, and every change: instances
//! created or destroyed by the library or the simulated nvidia-smi), under the node's lock
//! ([`render`], from [`NodeFile::write`]); a file that already holds what it should is left
//! alone, and one the node no longer explains is removed. What is there:
//!
//! - `sys/module/nvidia_drm/parameters/{modeset,fbdev}`: `Y` or `N`, while `nvidia_drm`
//!   is loaded (the kernel prints a bool parameter so; `fbdev` follows `modeset`, as
//!   driver 570 made it the default);
//! - `sys/bus/pci/devices/<bdf>/{vendor,device,class,reset_method,config}` for each GPU
//!   (a 3D controller, class `0x030200`) and each NVSwitch (class `0x068000`, "Bridge:
//!   other", which the nvidia driver claims as an NVSwitch; device `0x1af1`, the HGX A100's
//!   NVSwitch), at the GPU's own bus id and from bus `0xc4` on for the NVSwitches as on a
//!   DGX A100. `reset_method` lists `flr` when the GPU offers a function-level reset and
//!   `bus` otherwise, as Linux 5.15 and later show it; `config` is the first 256 bytes of
//!   PCI configuration space with a PCI Express capability whose Device Capabilities
//!   carry the FLR bit (28) likewise;
//! - with NVSwitches and Fabric Manager running, `run/nvidia-fabricmanager/nv-fabricmanager.pid`
//!   (Fabric Manager's default `PID_FILE_PATH`) naming [`FABRIC_MANAGER_PID`], and
//!   `proc/<that pid>/comm` holding `nv-fabricmanage` (a command name cut to 15 bytes,
//!   as the kernel keeps it); `proc/1/comm` (`systemd`) is always there, so that `proc/`
//!   reads as a host's process list;
//! - with NUMA (`GPUSHARE_SIM_HOST`'s `numa:<gpus>=<cpus>`, [`Host::numa`]):
//!   `sys/devices/system/node/online` (`0-<n-1>`: a node for each distinct CPU list, at
//!   least two, numbered in the order of the lowest GPU on each) and, for each GPU named,
//!   `numa_node` and `local_cpulist` in its PCI directory. Without, none of them: a host
//!   of one node (what sysfs of a kernel without NUMA shows too);
//! - the driver's MIG capabilities (issue 28: a CDI spec's MIG devices need them):
//!   `proc/driver/nvidia-caps/mig-minors`, the driver's whole table of capability minors
//!   (`config 1`, `monitor 2`, then `gpu<G>/gi<I>/access` and `gpu<G>/gi<I>/ci<C>/access`
//!   for every GPU minor below 32, GPU instance id below 15 and compute instance id below
//!   8: see [`gpu_instance_minor`]); `proc/driver/nvidia/capabilities/mig/{config,monitor}`;
//!   and for each GPU instance and compute instance that exists,
//!   `proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<id>/access` and
//!   `…/gi<id>/ci<id>/access` (`DeviceFileMinor: <N>`, `DeviceFileMode: 292`,
//!   `DeviceFileModify: 1`, as the driver writes them), gone with the instance;
//! - device nodes, real character devices (`mknod`), only when the library runs as root
//!   (with `CAP_MKNOD`): `dev/nvidia<minor>` for each GPU and `dev/nvidiactl` (major 195,
//!   the driver's; `nvidiactl` minor 255), `dev/nvidia-uvm` and `dev/nvidia-uvm-tools`
//!   (major [`UVM_MAJOR`], minors 0 and 1), and `dev/nvidia-caps/nvidia-cap<N>` for
//!   `config`, `monitor` and each live instance's capabilities (major [`CAPS_MAJOR`]); the
//!   real `nvidia-uvm` and `nvidia-caps` majors are dynamic, so made-up ones stand in. Each
//!   is [`NODE_MODE`], 0600, whatever the real driver's modes (issue 36): on a host with a
//!   real NVIDIA driver major 195 *is* its GPUs, and 510 or 511 may be another driver's, so
//!   a node others could open would hand them that device. Container runtimes, which bind
//!   them as root, need no more;
//! - `gpushare-simulated-host` at the root ([`MARKER`]): says that this is a simulated
//!   host, and `device nodes: made`, or `device nodes: none: <why>` when the library could
//!   not make them, which the agent repeats when a node is missing.
//!
//! [`Host::numa`]: crate::node::Host::numa
//! [`NodeFile::write`]: crate::state_file::NodeFile::write

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{ErrorKind, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::sys::stat::{Mode, SFlag, makedev, mknod};
use nix::unistd::geteuid;

use crate::device::{self, PciAddress};
use crate::node::{FabricManager, Node};

/// The pid the simulated Fabric Manager runs as (in the simulated `proc/` only).
pub const FABRIC_MANAGER_PID: u32 = 4127;
/// The PCI bus of the first simulated NVSwitch (a DGX A100's are at `c4:00.0` to `c9:00.0`).
const FIRST_NVSWITCH_BUS: u8 = 0xc4;
/// Where the PCI Express capability sits in the rendered configuration space.
const PCIE_CAPABILITY: usize = 0x60;

/// The major number of `/dev/nvidia<N>` and `/dev/nvidiactl` (the driver's
/// `NV_MAJOR_DEVICE_NUMBER`).
pub const NVIDIA_MAJOR: u32 = 195;
/// The minor number of `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: u32 = 255;
/// The simulated `nvidia-uvm` major (the real one is dynamic, from `/proc/devices`).
pub const UVM_MAJOR: u32 = 510;
/// The simulated `nvidia-caps` major (the real one is dynamic, from `/proc/devices`).
pub const CAPS_MAJOR: u32 = 511;
/// The file at the simulated host's root that says it is one, and whether it has device
/// nodes (`gpushare_agent::gpu::device_nodes` reads it when a node is missing).
pub const MARKER: &str = "gpushare-simulated-host";
/// What the marker says when the library is not root.
pub const NOT_ROOT: &str = "the simulator makes device nodes only as root";

/// GPU minors, GPU instance ids and compute instance ids the driver's MIG capability table
/// covers (`gpu31/gi14/ci7/access 4322` is its last line).
const TABLE_GPUS: u32 = 32;
const TABLE_GPU_INSTANCES: u32 = 15;
const TABLE_COMPUTE_INSTANCES: u32 = 8;
/// Minors per GPU instance in the table: its own and one per compute instance.
const MINORS_PER_GI: u32 = 1 + TABLE_COMPUTE_INSTANCES;
/// The first GPU instance minor (`config` is 1, `monitor` 2).
const FIRST_GI_MINOR: u32 = 3;

/// The minor of capability `gpu<gpu_minor>/gi<gpu_instance>/access` in the driver's
/// `/proc/driver/nvidia-caps/mig-minors`: the table is fixed at module load and lists
/// every GPU minor below 32 and GPU instance id below 15, each GPU instance followed by
/// its 8 compute instances (the MIG user guide's excerpt ends `gpu31/gi14/ci7/access
/// 4322`; NVIDIA's k8s-dra-driver quotes `gpu3/gi3/ci3/access 439` and
/// `gpu6/gi11/ci7/access 920`): `3 + 135 * gpu + 9 * gi`. `None` outside the table.
pub fn gpu_instance_minor(gpu_minor: u32, gpu_instance: u32) -> Option<u32> {
    (gpu_minor < TABLE_GPUS && gpu_instance < TABLE_GPU_INSTANCES).then(|| {
        FIRST_GI_MINOR
            + gpu_minor * TABLE_GPU_INSTANCES * MINORS_PER_GI
            + gpu_instance * MINORS_PER_GI
    })
}

/// The minor of capability `gpu<gpu_minor>/gi<gpu_instance>/ci<compute_instance>/access`:
/// its GPU instance's plus one plus the compute instance id ([`gpu_instance_minor`]).
pub fn compute_instance_minor(
    gpu_minor: u32,
    gpu_instance: u32,
    compute_instance: u32,
) -> Option<u32> {
    if compute_instance >= TABLE_COMPUTE_INSTANCES {
        return None;
    }
    Some(gpu_instance_minor(gpu_minor, gpu_instance)? + 1 + compute_instance)
}

/// The driver's `/proc/driver/nvidia-caps/mig-minors`: `<capability> <minor>` lines,
/// `config 1`, `monitor 2`, then every GPU instance and compute instance capability.
pub fn mig_minors_table() -> String {
    let mut table = String::from("config 1\nmonitor 2\n");
    for gpu in 0..TABLE_GPUS {
        for gi in 0..TABLE_GPU_INSTANCES {
            let minor = gpu_instance_minor(gpu, gi).expect("inside the table");
            table.push_str(&format!("gpu{gpu}/gi{gi}/access {minor}\n"));
            for ci in 0..TABLE_COMPUTE_INSTANCES {
                table.push_str(&format!("gpu{gpu}/gi{gi}/ci{ci}/access {}\n", minor + 1 + ci));
            }
        }
    }
    table
}

/// A capability file under `/proc/driver/nvidia/capabilities/`, as the driver writes it.
fn capability_file(minor: u32, mode: u32) -> Vec<u8> {
    format!("DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n").into_bytes()
}

/// The permission bits of every device node the simulator makes: its owner's (root's)
/// alone.
pub const NODE_MODE: u32 = 0o600;

/// A character device the simulated host has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CharDevice {
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
    /// Permission bits ([`NODE_MODE`]).
    pub mode: u32,
}

/// `DeviceFileMode` of `mig/config` (0400: root only), and of `mig/monitor` and every
/// instance's `access` (0444).
const CONFIG_MODE: u32 = 0o400;
const ACCESS_MODE: u32 = 0o444;

/// The MIG capabilities the host shows: (`proc` file under `capabilities/`, minor, mode),
/// `config` and `monitor` first, then each existing GPU instance and compute instance.
fn capabilities(node: &Node) -> Vec<(String, u32, u32)> {
    let mut caps = vec![
        ("mig/config".to_string(), 1, CONFIG_MODE),
        ("mig/monitor".to_string(), 2, ACCESS_MODE),
    ];
    for gpu in &node.gpus {
        let g = gpu.minor_number;
        for gi in &gpu.instances {
            let Some(minor) = gpu_instance_minor(g, gi.id) else { continue };
            caps.push((format!("gpu{g}/mig/gi{}/access", gi.id), minor, ACCESS_MODE));
            for ci in &gi.compute_instances {
                let Some(minor) = compute_instance_minor(g, gi.id, ci.id) else { continue };
                caps.push((
                    format!("gpu{g}/mig/gi{}/ci{}/access", gi.id, ci.id),
                    minor,
                    ACCESS_MODE,
                ));
            }
        }
    }
    caps
}

/// Every device node the node's host has (made only as root, see [`render`]), by path
/// under the root.
pub fn devices(node: &Node) -> BTreeMap<PathBuf, CharDevice> {
    let mut devices = BTreeMap::new();
    let mut add = |path: String, major: u32, minor: u32| {
        devices.insert(PathBuf::from(path), CharDevice { major, minor, mode: NODE_MODE });
    };
    for gpu in &node.gpus {
        add(format!("dev/nvidia{}", gpu.minor_number), NVIDIA_MAJOR, gpu.minor_number);
    }
    add("dev/nvidiactl".into(), NVIDIA_MAJOR, NVIDIACTL_MINOR);
    add("dev/nvidia-uvm".into(), UVM_MAJOR, 0);
    add("dev/nvidia-uvm-tools".into(), UVM_MAJOR, 1);
    // The capability files say the driver's modes (DeviceFileMode); the nodes are root's.
    for (_, minor, _) in capabilities(node) {
        add(format!("dev/nvidia-caps/nvidia-cap{minor}"), CAPS_MAJOR, minor);
    }
    devices
}

/// The simulated host of the node in `state`: `<state>.host`.
pub fn root_of(state: &Path) -> PathBuf {
    let mut p = state.as_os_str().to_owned();
    p.push(".host");
    PathBuf::from(p)
}

/// The PCI bus ids of the node's NVSwitches, in sysfs's form (`0000:c4:00.0`).
pub fn nvswitch_bus_ids(node: &Node) -> Vec<String> {
    (0..node.host.nvswitches)
        .map(|i| format!("0000:{:02x}:00.0", FIRST_NVSWITCH_BUS.wrapping_add(i)))
        .collect()
}

/// A GPU's or NVSwitch's first 256 bytes of PCI configuration space: ids, class, a
/// capability list holding one PCI Express capability, FLR bit as given.
fn config_space(vendor: u16, device: u16, class: u32, flr: bool) -> Vec<u8> {
    let mut c = vec![0u8; 256];
    c[0..2].copy_from_slice(&vendor.to_le_bytes());
    c[2..4].copy_from_slice(&device.to_le_bytes());
    // Status: capabilities list.
    c[6] = 0x10;
    // Revision 0xa1, then the class code (3 bytes, little-endian: prog-if, sub, base).
    c[8] = 0xa1;
    c[9..12].copy_from_slice(&class.to_le_bytes()[..3]);
    c[0x34] = PCIE_CAPABILITY as u8;
    let cap = PCIE_CAPABILITY;
    c[cap] = 0x10; // PCI Express
    c[cap + 1] = 0x00; // last capability
    c[cap + 2] = 0x02; // version 2, endpoint
    let devcap: u32 = 0x0000_8021 | if flr { 1 << 28 } else { 0 };
    c[cap + 4..cap + 8].copy_from_slice(&devcap.to_le_bytes());
    c
}

/// Every file the node's host shows, by path under the root.
pub fn files(node: &Node) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let yes_no = |on: bool| if on { b"Y\n".to_vec() } else { b"N\n".to_vec() };
    if let Some(drm) = node.host.nvidia_drm {
        let params = Path::new("sys/module/nvidia_drm/parameters");
        files.insert(params.join("modeset"), yes_no(drm.modeset));
        files.insert(params.join("fbdev"), yes_no(drm.modeset));
    }
    let devices = Path::new("sys/bus/pci/devices");
    let mut pci = |bdf: String, device: u16, class: u32, flr: bool| {
        let dir = devices.join(bdf);
        files.insert(dir.join("vendor"), b"0x10de\n".to_vec());
        files.insert(dir.join("device"), format!("0x{device:04x}\n").into_bytes());
        files.insert(dir.join("class"), format!("0x{class:06x}\n").into_bytes());
        let methods: &[u8] = if flr { b"flr bus\n" } else { b"bus\n" };
        files.insert(dir.join("reset_method"), methods.to_vec());
        files.insert(dir.join("config"), config_space(0x10de, device, class, flr));
    };
    for gpu in &node.gpus {
        let bdf = sysfs_bus_id(&device::pci(gpu));
        pci(bdf, (device::device_id(gpu) >> 16) as u16, 0x030200, gpu.flr);
    }
    for bdf in nvswitch_bus_ids(node) {
        pci(bdf, 0x1af1, 0x068000, true);
    }
    if !node.host.numa.is_empty() {
        // A node per distinct CPU list, in the order of the lowest GPU on each.
        let mut lists: Vec<&String> = Vec::new();
        for (&index, cpus) in &node.host.numa {
            let number = match lists.iter().position(|l| *l == cpus) {
                Some(n) => n,
                None => {
                    lists.push(cpus);
                    lists.len() - 1
                }
            };
            let Some(gpu) = node.gpus.get(index as usize) else { continue };
            let dir = devices.join(sysfs_bus_id(&device::pci(gpu)));
            files.insert(dir.join("numa_node"), format!("{number}\n").into_bytes());
            files.insert(dir.join("local_cpulist"), format!("{cpus}\n").into_bytes());
        }
        let last = lists.len().max(2) - 1;
        files.insert(
            PathBuf::from("sys/devices/system/node/online"),
            format!("0-{last}\n").into_bytes(),
        );
    }
    // The driver's MIG capabilities (issue 28).
    // The table is fixed: made once per process.
    static TABLE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| mig_minors_table().into_bytes());
    files.insert(PathBuf::from("proc/driver/nvidia-caps/mig-minors"), table.clone());
    let caps = Path::new("proc/driver/nvidia/capabilities");
    for (file, minor, mode) in capabilities(node) {
        files.insert(caps.join(file), capability_file(minor, mode));
    }
    // Init, so that proc/ reads as a host's process list whatever else runs.
    files.insert(PathBuf::from("proc/1/comm"), b"systemd\n".to_vec());
    if node.host.nvswitches > 0 && node.host.fabric_manager == FabricManager::Running {
        files.insert(
            PathBuf::from("run/nvidia-fabricmanager/nv-fabricmanager.pid"),
            format!("{FABRIC_MANAGER_PID}\n").into_bytes(),
        );
        files.insert(
            PathBuf::from(format!("proc/{FABRIC_MANAGER_PID}/comm")),
            b"nv-fabricmanage\n".to_vec(),
        );
    }
    files
}

/// A bus id as sysfs names the device's directory: `0000:1b:00.0`.
pub fn sysfs_bus_id(pci: &PciAddress) -> String {
    pci.legacy_bus_id().to_ascii_lowercase()
}

/// Makes the directory `root` show the node's host: writes each file of [`files`] whose
/// content differs (atomically: a temporary file, then a rename), makes each device node
/// of [`devices`] that is not already that device (as root only: [`MARKER`] says whether
/// it could), and removes every other file and node under `root`'s `sys/`, `run/`,
/// `proc/` and `dev/` and the directories left empty.
pub fn render(root: &Path, node: &Node) -> Result<(), String> {
    let failed = |path: &Path, e: std::io::Error| format!("{}: {e}", path.display());
    let mut wanted = files(node);
    let devices = devices(node);
    let made = make_devices(root, &devices)?;
    let nodes = match &made {
        Ok(()) => "device nodes: made".to_string(),
        Err(why) => format!("device nodes: none: {why}"),
    };
    wanted.insert(
        PathBuf::from(MARKER),
        format!(
            "A simulated host: gpushare's simulated NVIDIA driver writes this directory, which stands for /.\n{nodes}\n"
        )
        .into_bytes(),
    );
    for (relative, content) in &wanted {
        let path = root.join(relative);
        match fs::read(&path) {
            Ok(old) if old == *content => continue,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(failed(&path, e)),
        }
        let dir = path.parent().expect("a file under the root");
        fs::create_dir_all(dir).map_err(|e| failed(dir, e))?;
        let tmp = temporary(&path);
        let written = fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(content))
            .and_then(|()| fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(failed(&path, e));
        }
    }
    let mut keep: BTreeSet<PathBuf> = wanted.into_keys().collect();
    if made.is_ok() {
        keep.extend(devices.into_keys());
    }
    for top in ["sys", "run", "proc", "dev"] {
        prune(root, &root.join(top), &keep).map_err(|(p, e)| failed(&p, e))?;
    }
    Ok(())
}

/// `<path>.tmp.<pid>`.
fn temporary(path: &Path) -> PathBuf {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    PathBuf::from(tmp)
}

/// Makes each of `devices` under `root` that is not already that character device with
/// that mode (a node made under a temporary name, then renamed over). `Ok(Err(why))`
/// when this process may not make device nodes (not root, or no `CAP_MKNOD`): none made.
fn make_devices(
    root: &Path,
    devices: &BTreeMap<PathBuf, CharDevice>,
) -> Result<Result<(), String>, String> {
    if !geteuid().is_root() {
        return Ok(Err(NOT_ROOT.to_string()));
    }
    let failed = |path: &Path, e: std::io::Error| format!("{}: {e}", path.display());
    for (relative, device) in devices {
        let path = root.join(relative);
        let rdev = makedev(u64::from(device.major), u64::from(device.minor));
        match fs::symlink_metadata(&path) {
            Ok(m)
                if m.file_type().is_char_device()
                    && m.rdev() == rdev
                    && m.mode() & 0o7777 == device.mode =>
            {
                continue;
            }
            Ok(m) if m.is_dir() => fs::remove_dir_all(&path).map_err(|e| failed(&path, e))?,
            Ok(_) => fs::remove_file(&path).map_err(|e| failed(&path, e))?,
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(failed(&path, e)),
        }
        let dir = path.parent().expect("a node under the root");
        fs::create_dir_all(dir).map_err(|e| failed(dir, e))?;
        let tmp = temporary(&path);
        let _ = fs::remove_file(&tmp);
        if tmp.as_os_str().as_bytes().contains(&0) {
            return Err(format!("{}: a NUL in the path", tmp.display()));
        }
        let mode = Mode::from_bits_truncate(device.mode);
        if let Err(errno) = mknod(&tmp, SFlag::S_IFCHR, mode, rdev) {
            let e = std::io::Error::from(errno);
            if e.kind() == ErrorKind::PermissionDenied {
                // Root in a user namespace, or without CAP_MKNOD: as if not root.
                return Ok(Err(format!("{NOT_ROOT} with CAP_MKNOD (mknod: {e})")));
            }
            return Err(failed(&tmp, e));
        }
        // mknod's mode is cut by the umask.
        let placed = fs::set_permissions(&tmp, fs::Permissions::from_mode(device.mode))
            .and_then(|()| fs::rename(&tmp, &path));
        if let Err(e) = placed {
            let _ = fs::remove_file(&tmp);
            return Err(failed(&path, e));
        }
    }
    Ok(Ok(()))
}

/// Removes the files under `dir` that `wanted` lacks, then `dir` itself when empty;
/// whether `dir` is gone.
fn prune(
    root: &Path,
    dir: &Path,
    wanted: &BTreeSet<PathBuf>,
) -> Result<bool, (PathBuf, std::io::Error)> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err((dir.to_path_buf(), e)),
    };
    let mut empty = true;
    for entry in entries {
        let path = entry.map_err(|e| (dir.to_path_buf(), e))?.path();
        let is_dir = path.symlink_metadata().map_err(|e| (path.clone(), e))?.is_dir();
        let gone = if is_dir {
            prune(root, &path, wanted)?
        } else if path.strip_prefix(root).is_ok_and(|r| wanted.contains(r)) {
            false
        } else {
            fs::remove_file(&path).map_err(|e| (path.clone(), e))?;
            true
        };
        empty &= gone;
    }
    if empty {
        match fs::remove_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err((dir.to_path_buf(), e)),
        }
    }
    Ok(empty)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::NvidiaDrm;
    use gpushare_catalog::parse_node_spec;
    use nix::sys::stat::{major, minor};

    fn read(root: &Path, relative: &str) -> Option<String> {
        fs::read_to_string(root.join(relative)).ok()
    }

    #[test]
    fn the_host_sits_beside_the_state_file() {
        assert_eq!(
            root_of(Path::new("/var/lib/gpushare/simulated-gpus.json")),
            Path::new("/var/lib/gpushare/simulated-gpus.json.host")
        );
    }

    #[test]
    fn a_plain_node_shows_its_gpus_with_flr_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let node = Node::new(&parse_node_spec("a100-40gb:2").unwrap());
        render(dir.path(), &node).unwrap();
        let gpu = "sys/bus/pci/devices/0000:1c:00.0";
        assert_eq!(read(dir.path(), &format!("{gpu}/vendor")).as_deref(), Some("0x10de\n"));
        assert_eq!(read(dir.path(), &format!("{gpu}/device")).as_deref(), Some("0x20b0\n"));
        assert_eq!(read(dir.path(), &format!("{gpu}/class")).as_deref(), Some("0x030200\n"));
        assert_eq!(read(dir.path(), &format!("{gpu}/reset_method")).as_deref(), Some("flr bus\n"));
        let config = fs::read(dir.path().join(gpu).join("config")).unwrap();
        assert_eq!(config.len(), 256);
        let devcap = u32::from_le_bytes(config[0x64..0x68].try_into().unwrap());
        assert_eq!(devcap >> 28 & 1, 1);
        assert!(!dir.path().join("sys/module").exists());
        assert!(!dir.path().join("run").exists());
        assert!(!dir.path().join("sys/devices").exists(), "one NUMA node: no node files");
        assert!(!dir.path().join(gpu).join("local_cpulist").exists());
        assert_eq!(read(dir.path(), "proc/1/comm").as_deref(), Some("systemd\n"));
    }

    #[test]
    fn rendering_follows_the_node_and_removes_what_it_no_longer_explains() {
        let dir = tempfile::tempdir().unwrap();
        let mut node = Node::new(&parse_node_spec("a100-40gb:2").unwrap());
        node.host.nvidia_drm = Some(NvidiaDrm { modeset: true });
        node.host.nvswitches = 6;
        node.gpus[1].flr = false;
        render(dir.path(), &node).unwrap();
        let root = dir.path();
        assert_eq!(read(root, "sys/module/nvidia_drm/parameters/modeset").as_deref(), Some("Y\n"));
        assert_eq!(
            read(root, "sys/bus/pci/devices/0000:1c:00.0/reset_method").as_deref(),
            Some("bus\n")
        );
        assert_eq!(
            read(root, "sys/bus/pci/devices/0000:c9:00.0/class").as_deref(),
            Some("0x068000\n")
        );
        assert_eq!(
            read(root, "run/nvidia-fabricmanager/nv-fabricmanager.pid").as_deref(),
            Some("4127\n")
        );
        assert_eq!(read(root, "proc/4127/comm").as_deref(), Some("nv-fabricmanage\n"));

        node.host.nvidia_drm = None;
        node.host.nvswitches = 1;
        node.host.fabric_manager = FabricManager::Stopped;
        render(root, &node).unwrap();
        assert!(!root.join("sys/module").exists());
        assert!(root.join("sys/bus/pci/devices/0000:c4:00.0").exists());
        assert!(!root.join("sys/bus/pci/devices/0000:c5:00.0").exists());
        assert!(!root.join("run").exists() && !root.join("proc/4127").exists());
        // Unchanged files are not rewritten.
        let before = fs::metadata(root.join("sys/bus/pci/devices/0000:1b:00.0/config"))
            .unwrap()
            .modified()
            .unwrap();
        render(root, &node).unwrap();
        let after = fs::metadata(root.join("sys/bus/pci/devices/0000:1b:00.0/config"))
            .unwrap()
            .modified()
            .unwrap();
        assert_eq!(before, after);
    }

    #[test]
    fn numa_shows_the_nodes_and_each_named_gpus_cpus() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let mut node = Node::new(&parse_node_spec("a100-40gb:3").unwrap());
        node.host.numa.insert(1, "1".into());
        render(root, &node).unwrap();
        assert_eq!(read(root, "sys/devices/system/node/online").as_deref(), Some("0-1\n"));
        let gpu =
            |i: usize| format!("sys/bus/pci/devices/{}", sysfs_bus_id(&device::pci(&node.gpus[i])));
        assert_eq!(read(root, &format!("{}/local_cpulist", gpu(1))).as_deref(), Some("1\n"));
        assert_eq!(read(root, &format!("{}/numa_node", gpu(1))).as_deref(), Some("0\n"));
        assert_eq!(read(root, &format!("{}/local_cpulist", gpu(0))), None, "not named");
        node.host.numa.insert(0, "0-3,8".into());
        node.host.numa.insert(2, "1".into());
        render(root, &node).unwrap();
        assert_eq!(read(root, &format!("{}/numa_node", gpu(0))).as_deref(), Some("0\n"));
        assert_eq!(read(root, &format!("{}/numa_node", gpu(1))).as_deref(), Some("1\n"));
        assert_eq!(read(root, &format!("{}/numa_node", gpu(2))).as_deref(), Some("1\n"));
        assert_eq!(read(root, &format!("{}/local_cpulist", gpu(0))).as_deref(), Some("0-3,8\n"));
        node.host.numa.insert(2, "9-10".into());
        render(root, &node).unwrap();
        assert_eq!(read(root, "sys/devices/system/node/online").as_deref(), Some("0-2\n"));
        node.host.numa.clear();
        render(root, &node).unwrap();
        assert!(!root.join("sys/devices").exists());
        assert!(!root.join(gpu(0)).join("numa_node").exists());
        assert!(root.join(gpu(0)).join("config").exists());
    }

    #[test]
    fn capability_minors_follow_the_drivers_table() {
        // The points published from real tables (see gpu_instance_minor).
        assert_eq!(gpu_instance_minor(0, 0), Some(3));
        assert_eq!(compute_instance_minor(0, 0, 0), Some(4));
        assert_eq!(compute_instance_minor(0, 0, 2), Some(6));
        assert_eq!(compute_instance_minor(3, 3, 3), Some(439));
        assert_eq!(compute_instance_minor(6, 11, 7), Some(920));
        assert_eq!(compute_instance_minor(31, 14, 7), Some(4322));
        assert_eq!(gpu_instance_minor(32, 0), None);
        assert_eq!(gpu_instance_minor(0, 15), None);
        assert_eq!(compute_instance_minor(0, 1, 8), None);
        let table = mig_minors_table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2 + 32 * 15 * 9);
        assert_eq!(
            &lines[..5],
            [
                "config 1",
                "monitor 2",
                "gpu0/gi0/access 3",
                "gpu0/gi0/ci0/access 4",
                "gpu0/gi0/ci1/access 5"
            ]
        );
        assert_eq!(lines.last(), Some(&"gpu31/gi14/ci7/access 4322"));
        // Every minor once, from 1 up.
        let minors: Vec<u32> =
            lines.iter().map(|l| l.rsplit_once(' ').unwrap().1.parse().unwrap()).collect();
        assert_eq!(minors, (1..=4322).collect::<Vec<_>>());
    }

    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    #[test]
    fn mig_capabilities_and_device_nodes_follow_the_instances() {
        use crate::rules;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let mut node = Node::new(&parse_node_spec("a100-40gb:2").unwrap());
        render(root, &node).unwrap();
        let caps = "proc/driver/nvidia/capabilities";
        assert_eq!(
            read(root, &format!("{caps}/mig/config")).as_deref(),
            Some("DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
        );
        assert_eq!(
            read(root, &format!("{caps}/mig/monitor")).as_deref(),
            Some("DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
        );
        assert!(!root.join(caps).join("gpu1").exists());
        assert_eq!(read(root, "proc/driver/nvidia-caps/mig-minors"), Some(mig_minors_table()));

        node.gpus[1].mig_enabled = true;
        // A 3g.20gb at slot 4 (GI 2) split in two 1c, and a 1g.5gb at slot 0 (GI 7).
        let gi = rules::create_gpu_instance(&mut node, 1, 9, 4, 4).unwrap();
        assert_eq!(gi, 2);
        let ci0 = rules::create_compute_instance(&mut node, 1, gi, 0).unwrap();
        let ci1 = rules::create_compute_instance(&mut node, 1, gi, 0).unwrap();
        assert_eq!((ci0, ci1), (0, 1));
        let small = rules::create_gpu_instance(&mut node, 1, 19, 0, 1).unwrap();
        rules::create_compute_instance(&mut node, 1, small, 0).unwrap();
        render(root, &node).unwrap();
        // GPU minor 1: 3 + 135 = 138; GI 2: + 18 = 156; its CIs 157, 158; GI 7: 201, CI 202.
        let access = |path: &str| read(root, &format!("{caps}/gpu1/mig/{path}"));
        let file = |minor: u32| {
            format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
        };
        assert_eq!(access("gi2/access"), Some(file(156)));
        assert_eq!(access("gi2/ci0/access"), Some(file(157)));
        assert_eq!(access("gi2/ci1/access"), Some(file(158)));
        assert_eq!(access(&format!("gi{small}/access")), Some(file(3 + 135 + 9 * small)));
        assert_eq!(access(&format!("gi{small}/ci0/access")), Some(file(4 + 135 + 9 * small)));
        assert!(!root.join(caps).join("gpu0").exists());
        let marker = read(root, MARKER).unwrap();
        if is_root() && marker.contains("device nodes: made") {
            let dev = |path: &str| {
                let m = fs::symlink_metadata(root.join(path)).unwrap();
                assert!(m.file_type().is_char_device(), "{path}");
                let id = |n: u64| u32::try_from(n).unwrap();
                (id(major(m.rdev())), id(minor(m.rdev())), m.mode() & 0o7777)
            };
            // Root's alone (issue 36): major 195 is the real driver's GPUs where one runs.
            assert_eq!(dev("dev/nvidia0"), (195, 0, 0o600));
            assert_eq!(dev("dev/nvidia1"), (195, 1, 0o600));
            assert_eq!(dev("dev/nvidiactl"), (195, 255, 0o600));
            assert_eq!(dev("dev/nvidia-uvm"), (UVM_MAJOR, 0, 0o600));
            assert_eq!(dev("dev/nvidia-uvm-tools"), (UVM_MAJOR, 1, 0o600));
            assert_eq!(dev("dev/nvidia-caps/nvidia-cap1"), (CAPS_MAJOR, 1, 0o600));
            assert_eq!(dev("dev/nvidia-caps/nvidia-cap2"), (CAPS_MAJOR, 2, 0o600));
            for minor in [156, 157, 158] {
                assert_eq!(
                    dev(&format!("dev/nvidia-caps/nvidia-cap{minor}")),
                    (CAPS_MAJOR, minor, 0o600)
                );
            }
            assert!(
                fs::read_dir(root.join("dev"))
                    .unwrap()
                    .chain(fs::read_dir(root.join("dev/nvidia-caps")).unwrap())
                    .flatten()
                    .all(|e| e.metadata().unwrap().mode() & 0o077 == 0 || e.path().is_dir()),
                "no node others may open"
            );
            // A node of an older simulator's (0666) is made again, root's alone.
            fs::set_permissions(root.join("dev/nvidia0"), fs::Permissions::from_mode(0o666))
                .unwrap();
            render(root, &node).unwrap();
            assert_eq!(dev("dev/nvidia0"), (195, 0, 0o600));
            // A file planted in a node's place is replaced by the node.
            fs::remove_file(root.join("dev/nvidia0")).unwrap();
            fs::write(root.join("dev/nvidia0"), "planted").unwrap();
            render(root, &node).unwrap();
            assert_eq!(dev("dev/nvidia0"), (195, 0, 0o600));
        } else {
            assert!(
                marker
                    .contains("device nodes: none: the simulator makes device nodes only as root"),
                "{marker}"
            );
            assert!(!root.join("dev").exists());
        }

        // Destroyed instances take their files and nodes with them.
        rules::destroy_compute_instance(&mut node, 1, gi, ci1).unwrap();
        render(root, &node).unwrap();
        assert!(access("gi2/ci0/access").is_some());
        assert!(access("gi2/ci1/access").is_none());
        assert!(!root.join("dev/nvidia-caps/nvidia-cap158").exists());
        rules::destroy_compute_instance(&mut node, 1, gi, ci0).unwrap();
        rules::destroy_gpu_instance(&mut node, 1, gi).unwrap();
        rules::destroy_compute_instance(&mut node, 1, small, 0).unwrap();
        rules::destroy_gpu_instance(&mut node, 1, small).unwrap();
        render(root, &node).unwrap();
        assert!(!root.join(caps).join("gpu1").exists());
        assert!(root.join(caps).join("mig/monitor").exists());
        assert!(!root.join("dev/nvidia-caps/nvidia-cap156").exists());
        assert_eq!(root.join("dev/nvidia1").exists(), marker.contains("made"));
    }

    #[test]
    fn writing_the_node_renders_its_host() {
        let dir = tempfile::tempdir().unwrap();
        let file = crate::state_file::NodeFile::new(dir.path().join("node.json"));
        let mut node = Node::new(&parse_node_spec("a100-40gb:1").unwrap());
        file.write(&file.lock().unwrap(), &node).unwrap();
        let root = root_of(file.path());
        assert!(root.join(MARKER).exists());
        node.gpus[0].mig_enabled = true;
        crate::rules::create_gpu_instance(&mut node, 0, 0, 0, 8).unwrap();
        file.write(&file.lock().unwrap(), &node).unwrap();
        assert_eq!(
            read(&root, "proc/driver/nvidia/capabilities/gpu0/mig/gi0/access").as_deref(),
            Some("DeviceFileMinor: 3\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
        );
        crate::rules::destroy_gpu_instance(&mut node, 0, 0).unwrap();
        file.write(&file.lock().unwrap(), &node).unwrap();
        assert!(!root.join("proc/driver/nvidia/capabilities/gpu0").exists());
    }
}
