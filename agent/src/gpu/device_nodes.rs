//! The device nodes a container needs to use a GPU, a MIG device or an MPS share (issue
//! 28: what the CDI spec lists), found under the host's root (agent.toml `host_root`: `/`
//! on a real host, `<state>.host/` on a simulated one) the way NVIDIA's container toolkit
//! finds them. Pure functions over the file system: nothing is created or changed.
//!
//! - A GPU is `/dev/nvidia<minor>` (the character device of major 195 and the minor NVML
//!   answers for `nvmlDeviceGetMinorNumber`) beside `/dev/nvidiactl` (195, 255), which
//!   every CUDA process opens first, and `/dev/nvidia-uvm` and `/dev/nvidia-uvm-tools`
//!   where they exist. The toolkit's CDI generator (`nvidia-ctk cdi generate`, its
//!   "common" device nodes) lists the control nodes `nvidiactl`, `nvidia-uvm`,
//!   `nvidia-uvm-tools` (and `nvidia-modeset`) for every device, each only where it exists
//!   on the host: the `nvidia-uvm` module is loaded, and its nodes made (by nvidia-modprobe),
//!   only once something asked for them, and CUDA cannot allocate memory without it.
//! - A MIG device adds two capability nodes, the GPU instance's and the compute
//!   instance's. The driver describes each capability in a file under
//!   `/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<GI>/access` and
//!   `…/gi<GI>/ci<CI>/access`, lines `DeviceFileMinor: N`, `DeviceFileMode: 292` (0444),
//!   `DeviceFileModify: 1`; the node granting it is `/dev/nvidia-caps/nvidia-cap<N>`
//!   (major: `nvidia-caps` in `/proc/devices`, dynamic). libnvidia-container and NVIDIA's
//!   DRA driver read these files (through nvidia-modprobe's `nvidia_cap_get_device_file_attrs`
//!   and its Go twin); the Go toolkit reads the same minors from the driver's table
//!   `/proc/driver/nvidia-caps/mig-minors` (`gpu<minor>/gi<GI>/access <N>`). The access
//!   file exists only while the instance does, so a destroyed instance is an error here,
//!   never a stale node.
//!
//! Every node must be a character device with the expected minor: a root daemon hands
//! these paths to containers, so a regular file, a symbolic link or another device planted
//! under the name is refused, naming it. The files read are tiny; more than
//! [`MAX_CAPABILITY_FILE`] bytes is refused too.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat;

/// A device node a container gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    /// Its path inside the container (and on a real host): `/dev/nvidia0`.
    pub path: String,
    /// Where it is on this host: `host_root` joined with [`DeviceNode::path`].
    pub host_path: PathBuf,
}

/// The largest capability file read (the driver's are under 64 bytes).
pub const MAX_CAPABILITY_FILE: u64 = 4096;

/// The major number of `/dev/nvidia<N>` and `/dev/nvidiactl` (`NV_MAJOR_DEVICE_NUMBER`).
pub const NVIDIA_MAJOR: u32 = 195;
/// The minor number of `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: u32 = 255;

/// The file the simulated driver writes at the root of a simulated host: it says whether
/// it made the device nodes (only root can), so that a missing node says why.
pub const SIMULATED_HOST_MARKER: &str = "gpushare-simulated-host";

/// The nodes a whole GPU needs: `/dev/nvidia<minor>` and `/dev/nvidiactl` (both required),
/// then `/dev/nvidia-uvm` and `/dev/nvidia-uvm-tools` where they exist (see the module's
/// documentation). An error names the node missing or not a character device.
pub fn gpu_nodes(host_root: &Path, minor: u32) -> Result<Vec<DeviceNode>, String> {
    let mut nodes = vec![
        required(host_root, &format!("/dev/nvidia{minor}"), Some(NVIDIA_MAJOR), minor)?,
        required(host_root, "/dev/nvidiactl", Some(NVIDIA_MAJOR), NVIDIACTL_MINOR)?,
    ];
    for path in ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] {
        let node = node_at(host_root, path);
        match fs::symlink_metadata(&node.host_path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: {e}", node.host_path.display())),
            // The uvm major is dynamic and its minors are the module's: type only.
            Ok(meta) => check_char_device(&node, &meta)?,
        }
        nodes.push(node);
    }
    Ok(nodes)
}

/// The capability nodes of MIG device `compute_instance` of GPU instance `gpu_instance`
/// on the GPU of device minor `minor`: the GPU instance's, then the compute instance's
/// (`/dev/nvidia-caps/nvidia-cap<N>`, each `N` read from the driver's capability file).
/// The GPU's own nodes are [`gpu_nodes`]'. An error names the capability file missing or
/// unreadable, or the node missing or not a character device of that minor.
pub fn mig_nodes(
    host_root: &Path,
    minor: u32,
    gpu_instance: u32,
    compute_instance: u32,
) -> Result<Vec<DeviceNode>, String> {
    let gi = format!("/proc/driver/nvidia/capabilities/gpu{minor}/mig/gi{gpu_instance}");
    let ci = format!("{gi}/ci{compute_instance}");
    let mut nodes = Vec::with_capacity(2);
    for (capability, what) in [
        (format!("{gi}/access"), format!("GPU instance {gpu_instance}")),
        (
            format!("{ci}/access"),
            format!("compute instance {compute_instance} of GPU instance {gpu_instance}"),
        ),
    ] {
        let file = host_root.join(capability.trim_start_matches('/'));
        let text = read_capability(&file)
            .map_err(|e| format!("{what} of the GPU of minor {minor}: its capability file {e}"))?;
        let cap_minor = device_file_minor(&text)
            .ok_or_else(|| format!("{}: no line DeviceFileMinor: <number>", file.display()))?;
        let path = format!("/dev/nvidia-caps/nvidia-cap{cap_minor}");
        nodes
            .push(required(host_root, &path, None, cap_minor).map_err(|e| format!("{what}: {e}"))?);
    }
    Ok(nodes)
}

/// The `N` of a capability file's line `DeviceFileMinor: N` (the driver's
/// `/proc/driver/nvidia/capabilities/…` files; spaces around the value allowed, as the
/// toolkit's readers allow them); `None` without such a line or with a value that is not
/// a decimal `u32`.
pub fn device_file_minor(text: &str) -> Option<u32> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        if key.trim() != "DeviceFileMinor" {
            return None;
        }
        let value = value.trim();
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        value.parse().ok()
    })
}

fn node_at(host_root: &Path, path: &str) -> DeviceNode {
    DeviceNode { path: path.to_string(), host_path: host_root.join(path.trim_start_matches('/')) }
}

/// The node at `path`, which must be a character device of minor `minor` (and of major
/// `major` where it is fixed).
fn required(
    host_root: &Path,
    path: &str,
    major: Option<u32>,
    minor: u32,
) -> Result<DeviceNode, String> {
    let node = node_at(host_root, path);
    let meta = match fs::symlink_metadata(&node.host_path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(missing(host_root, &node));
        }
        Err(e) => return Err(format!("{}: {e}", node.host_path.display())),
    };
    check_char_device(&node, &meta)?;
    let rdev = meta.rdev();
    let (got_major, got_minor) = (stat::major(rdev), stat::minor(rdev));
    if major.is_some_and(|m| u64::from(m) != got_major) || got_minor != u64::from(minor) {
        let wanted = major.map_or_else(|| format!("of minor {minor}"), |m| format!("{m}:{minor}"));
        return Err(format!(
            "{} is the character device {got_major}:{got_minor}, not {wanted}: refused",
            node.host_path.display()
        ));
    }
    Ok(node)
}

/// Why a node is missing, in one line: on a simulated host whose simulator could not make
/// device nodes, that; else what makes them on a real host.
fn missing(host_root: &Path, node: &DeviceNode) -> String {
    let marker = host_root.join(SIMULATED_HOST_MARKER);
    if let Ok(text) = read_capability(&marker) {
        if let Some(why) = text.lines().find_map(|l| l.strip_prefix("device nodes: none: ")) {
            return format!("{} is missing: {why}", node.host_path.display());
        }
        return format!("{} is missing on the simulated host", node.host_path.display());
    }
    format!(
        "{} is missing (the NVIDIA driver's nodes are made by nvidia-modprobe, which CUDA, nvidia-smi and nvidia-persistenced run)",
        node.host_path.display()
    )
}

/// Refuses anything but a character device.
fn check_char_device(node: &DeviceNode, meta: &fs::Metadata) -> Result<(), String> {
    let kind = meta.file_type();
    if kind.is_char_device() {
        return Ok(());
    }
    let what = if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_file() {
        "a regular file"
    } else if kind.is_dir() {
        "a directory"
    } else {
        "something else"
    };
    Err(format!("{} is {what}, not a character device: refused", node.host_path.display()))
}

/// A small text file, read without following a symbolic link, at most
/// [`MAX_CAPABILITY_FILE`] bytes; the error starts with the path.
fn read_capability(path: &Path) -> Result<String, String> {
    let failed = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::NotFound {
            format!("{} does not exist", path.display())
        } else {
            format!("{}: {e}", path.display())
        }
    };
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits())
        .open(path)
        .map_err(failed)?;
    let meta = file.metadata().map_err(failed)?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    let mut bytes = Vec::new();
    file.take(MAX_CAPABILITY_FILE + 1).read_to_end(&mut bytes).map_err(failed)?;
    if bytes.len() as u64 > MAX_CAPABILITY_FILE {
        return Err(format!("{} holds more than {MAX_CAPABILITY_FILE} bytes", path.display()));
    }
    String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::stat::{Mode, SFlag, makedev};

    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    /// Makes a character device; false where the process may not (not root, or a user
    /// namespace without CAP_MKNOD).
    fn mknod(path: &Path, major: u32, minor: u32) -> bool {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mode = Mode::from_bits_truncate(0o666);
        let dev = makedev(u64::from(major), u64::from(minor));
        stat::mknod(path, SFlag::S_IFCHR, mode, dev).is_ok()
    }

    fn write(root: &Path, relative: &str, text: &str) {
        let path = root.join(relative);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    const ACCESS_GI: &str = "proc/driver/nvidia/capabilities/gpu0/mig/gi1/access";
    const ACCESS_CI: &str = "proc/driver/nvidia/capabilities/gpu0/mig/gi1/ci0/access";

    #[test]
    fn device_file_minor_reads_the_drivers_format() {
        let text = "DeviceFileMinor: 12\nDeviceFileMode: 292\nDeviceFileModify: 1\n";
        assert_eq!(device_file_minor(text), Some(12));
        assert_eq!(device_file_minor("DeviceFileMode: 292\nDeviceFileMinor:4322"), Some(4322));
        assert_eq!(device_file_minor("  DeviceFileMinor :  7  \n"), Some(7));
        assert_eq!(device_file_minor(""), None);
        assert_eq!(device_file_minor("DeviceFileMode: 292\n"), None);
        assert_eq!(device_file_minor("DeviceFileMinor: -1\n"), None);
        assert_eq!(device_file_minor("DeviceFileMinor: +3\n"), None);
        assert_eq!(device_file_minor("DeviceFileMinor: 12a\n"), None);
        assert_eq!(device_file_minor("DeviceFileMinor: 99999999999\n"), None);
        assert_eq!(device_file_minor("DeviceFileMinorX: 3\nDeviceFileMinor: 4\n"), Some(4));
    }

    #[test]
    fn a_missing_gpu_node_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = gpu_nodes(dir.path(), 3).unwrap_err();
        assert!(e.contains("/dev/nvidia3 is missing (the NVIDIA driver's nodes"), "{e}");
        assert!(!e.contains('\n'));
        // On a simulated host that could not make nodes, the simulator's reason.
        write(
            dir.path(),
            SIMULATED_HOST_MARKER,
            "device nodes: none: the simulator makes device nodes only as root\n",
        );
        let e = gpu_nodes(dir.path(), 0).unwrap_err();
        assert!(
            e.ends_with("/dev/nvidia0 is missing: the simulator makes device nodes only as root"),
            "{e}"
        );
    }

    #[test]
    fn planted_files_and_links_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "dev/nvidia0", "");
        let e = gpu_nodes(dir.path(), 0).unwrap_err();
        assert!(e.contains("dev/nvidia0 is a regular file, not a character device"), "{e}");
        fs::remove_file(dir.path().join("dev/nvidia0")).unwrap();
        std::os::unix::fs::symlink("/dev/null", dir.path().join("dev/nvidia0")).unwrap();
        let e = gpu_nodes(dir.path(), 0).unwrap_err();
        assert!(e.contains("dev/nvidia0 is a symbolic link"), "{e}");
        fs::remove_file(dir.path().join("dev/nvidia0")).unwrap();
        fs::create_dir(dir.path().join("dev/nvidia0")).unwrap();
        let e = gpu_nodes(dir.path(), 0).unwrap_err();
        assert!(e.contains("dev/nvidia0 is a directory"), "{e}");
    }

    #[test]
    fn mig_capability_files_are_required_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let e = mig_nodes(root, 0, 1, 0).unwrap_err();
        assert!(e.starts_with("GPU instance 1 of the GPU of minor 0: its capability file "), "{e}");
        assert!(e.ends_with("gpu0/mig/gi1/access does not exist"), "{e}");
        write(root, ACCESS_GI, "DeviceFileMode: 292\n");
        let e = mig_nodes(root, 0, 1, 0).unwrap_err();
        assert!(e.ends_with("gi1/access: no line DeviceFileMinor: <number>"), "{e}");
        write(root, ACCESS_GI, &"x".repeat(5000));
        let e = mig_nodes(root, 0, 1, 0).unwrap_err();
        assert!(e.ends_with("holds more than 4096 bytes"), "{e}");
        // A link in place of the capability file is not followed.
        fs::remove_file(root.join(ACCESS_GI)).unwrap();
        let elsewhere = root.join("elsewhere");
        fs::write(&elsewhere, "DeviceFileMinor: 12\n").unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join(ACCESS_GI)).unwrap();
        let e = mig_nodes(root, 0, 1, 0).unwrap_err();
        assert!(e.contains("gi1/access: "), "{e}");
        fs::remove_file(root.join(ACCESS_GI)).unwrap();
        write(root, ACCESS_GI, "DeviceFileMinor: 12\nDeviceFileMode: 292\nDeviceFileModify: 1\n");
        let e = mig_nodes(root, 0, 1, 0).unwrap_err();
        assert!(e.starts_with("GPU instance 1: "), "{e}");
        assert!(e.contains("/dev/nvidia-caps/nvidia-cap12 is missing"), "{e}");
        write(root, "dev/nvidia-caps/nvidia-cap12", "");
        let e = mig_nodes(root, 0, 1, 0).unwrap_err();
        assert!(e.contains("nvidia-cap12 is a regular file"), "{e}");
    }

    #[test]
    fn character_devices_are_found_as_root() {
        if !is_root() {
            gpushare_test_skip::skip("making character devices needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        if !mknod(&root.join("dev/nvidia1"), NVIDIA_MAJOR, 1) {
            gpushare_test_skip::skip("mknod refused (no CAP_MKNOD here)");
            return;
        }
        let e = gpu_nodes(root, 1).unwrap_err();
        assert!(e.contains("dev/nvidiactl is missing"), "{e}");
        assert!(mknod(&root.join("dev/nvidiactl"), NVIDIA_MAJOR, NVIDIACTL_MINOR));
        let nodes = gpu_nodes(root, 1).unwrap();
        assert_eq!(
            nodes.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(),
            ["/dev/nvidia1", "/dev/nvidiactl"]
        );
        assert_eq!(nodes[0].host_path, root.join("dev/nvidia1"));
        assert!(mknod(&root.join("dev/nvidia-uvm-tools"), 510, 1));
        assert!(mknod(&root.join("dev/nvidia-uvm"), 510, 0));
        let paths: Vec<_> = gpu_nodes(root, 1).unwrap().into_iter().map(|n| n.path).collect();
        assert_eq!(
            paths,
            ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        );
        // Another device under the GPU's name (here /dev/null's numbers) is refused.
        assert!(mknod(&root.join("dev/nvidia2"), 1, 3));
        let e = gpu_nodes(root, 2).unwrap_err();
        assert!(e.contains("dev/nvidia2 is the character device 1:3, not 195:2: refused"), "{e}");

        write(root, ACCESS_GI, "DeviceFileMinor: 12\nDeviceFileMode: 292\nDeviceFileModify: 1\n");
        write(root, ACCESS_CI, "DeviceFileMinor: 13\nDeviceFileMode: 292\nDeviceFileModify: 1\n");
        assert!(mknod(&root.join("dev/nvidia-caps/nvidia-cap12"), 511, 12));
        assert!(mknod(&root.join("dev/nvidia-caps/nvidia-cap13"), 511, 14));
        let e = mig_nodes(root, 0, 1, 0).unwrap_err();
        assert!(
            e.starts_with("compute instance 0 of GPU instance 1: ")
                && e.contains(
                    "nvidia-cap13 is the character device 511:14, not of minor 13: refused"
                ),
            "{e}"
        );
        fs::remove_file(root.join("dev/nvidia-caps/nvidia-cap13")).unwrap();
        assert!(mknod(&root.join("dev/nvidia-caps/nvidia-cap13"), 511, 13));
        let nodes = mig_nodes(root, 0, 1, 0).unwrap();
        assert_eq!(
            nodes,
            [
                DeviceNode {
                    path: "/dev/nvidia-caps/nvidia-cap12".into(),
                    host_path: root.join("dev/nvidia-caps/nvidia-cap12"),
                },
                DeviceNode {
                    path: "/dev/nvidia-caps/nvidia-cap13".into(),
                    host_path: root.join("dev/nvidia-caps/nvidia-cap13"),
                },
            ]
        );
    }

    /// The simulated driver's host (its library's own rendering) reads as a real one.
    #[test]
    fn the_simulated_host_gives_every_node() {
        use gpushare_sim_nvml::{host, node::Node, rules};
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let mut node = Node::new(&gpushare_catalog::parse_node_spec("a100-40gb:2").unwrap());
        node.gpus[1].mig_enabled = true;
        // A 3g.20gb (profile 9) at slot 4 (GI 2) in two compute instances.
        let gi = rules::create_gpu_instance(&mut node, 1, 9, 4, 4).unwrap();
        rules::create_compute_instance(&mut node, 1, gi, 0).unwrap();
        rules::create_compute_instance(&mut node, 1, gi, 0).unwrap();
        host::render(root, &node).unwrap();
        assert_eq!(host::MARKER, SIMULATED_HOST_MARKER);
        let made = fs::read_to_string(root.join(SIMULATED_HOST_MARKER))
            .unwrap()
            .contains("device nodes: made");
        if !made {
            let e = gpu_nodes(root, 1).unwrap_err();
            assert!(
                e.ends_with(
                    "dev/nvidia1 is missing: the simulator makes device nodes only as root"
                ),
                "{e}"
            );
            let e = mig_nodes(root, 1, gi, 1).unwrap_err();
            assert!(e.contains("nvidia-cap156 is missing: the simulator makes"), "{e}");
            return;
        }
        let paths = |nodes: Vec<DeviceNode>| nodes.into_iter().map(|n| n.path).collect::<Vec<_>>();
        assert_eq!(
            paths(gpu_nodes(root, 1).unwrap()),
            ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        );
        // GPU minor 1, GI 2: 3 + 135 + 18 = 156; CI 1: 158 (the driver's mig-minors).
        assert_eq!(
            paths(mig_nodes(root, 1, gi, 1).unwrap()),
            ["/dev/nvidia-caps/nvidia-cap156", "/dev/nvidia-caps/nvidia-cap158"]
        );
        let e = mig_nodes(root, 1, gi, 2).unwrap_err();
        assert!(e.starts_with("compute instance 2 of GPU instance 2 of the GPU of minor 1"), "{e}");
        let e = mig_nodes(root, 0, gi, 0).unwrap_err();
        assert!(e.ends_with("capabilities/gpu0/mig/gi2/access does not exist"), "{e}");
    }
}
