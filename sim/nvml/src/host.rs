//! The simulated host: the files of a Linux host that decide whether a GPU can be reset,
//! under a directory that stands for `/`, beside the node's state file (`<state>.host/`).
//! `gpushare-agent --simulate` reads them there (its `host_root` setting) with the very
//! code that reads `/` on a real host.
//!
//! Written from the node ([`Node::host`] and each GPU's `flr`) at every first `nvmlInit`
//! of a process, under the node's lock ([`render`]); a file that already holds what it
//! should is left alone, and one the node no longer explains is removed. What is there:
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
//!   of one node (what sysfs of a kernel without NUMA shows too).
//!
//! [`Host::numa`]: crate::node::Host::numa

use std::collections::BTreeMap;
use std::fs;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use crate::device::{self, PciAddress};
use crate::node::{FabricManager, Node};

/// The pid the simulated Fabric Manager runs as (in the simulated `proc/` only).
pub const FABRIC_MANAGER_PID: u32 = 4127;
/// The PCI bus of the first simulated NVSwitch (a DGX A100's are at `c4:00.0` to `c9:00.0`).
const FIRST_NVSWITCH_BUS: u8 = 0xc4;
/// Where the PCI Express capability sits in the rendered configuration space.
const PCIE_CAPABILITY: usize = 0x60;

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
/// content differs (atomically: a temporary file, then a rename), removes every other
/// file under `root`'s `sys/`, `run/` and `proc/` and the directories left empty.
pub fn render(root: &Path, node: &Node) -> Result<(), String> {
    let failed = |path: &Path, e: std::io::Error| format!("{}: {e}", path.display());
    let wanted = files(node);
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
        let mut tmp = path.clone().into_os_string();
        tmp.push(format!(".tmp.{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let written = fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(content))
            .and_then(|()| fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(failed(&path, e));
        }
    }
    for top in ["sys", "run", "proc"] {
        prune(root, &root.join(top), &wanted).map_err(|(p, e)| failed(&p, e))?;
    }
    Ok(())
}

/// Removes the files under `dir` that `wanted` lacks, then `dir` itself when empty;
/// whether `dir` is gone.
fn prune(
    root: &Path,
    dir: &Path,
    wanted: &BTreeMap<PathBuf, Vec<u8>>,
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
        } else if path.strip_prefix(root).is_ok_and(|r| wanted.contains_key(r)) {
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
}
