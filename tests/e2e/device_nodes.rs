//! The device nodes a CDI spec lists (issue 28), on the simulated host: the simulated
//! driver makes `/dev/nvidia<N>`, `nvidiactl`, `nvidia-uvm(-tools)` and each live MIG
//! instance's capability files and `/dev/nvidia-caps/nvidia-cap<N>` nodes under
//! `<state>.host/` (the agent's `host_root` on `--simulate`), numbered as the real driver's
//! `mig-minors` table numbers them, and removes an instance's with the instance; podman
//! (where available) binds them into a container. Real character devices take root: as
//! anyone else the test says so and does nothing.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use gpushare_tests::{Agent, AgentOptions, is_root, text};
use nix::sys::stat::{major, minor};

/// The simulated host beside the node's state file.
fn host_of(agent: &Agent) -> PathBuf {
    let mut path = agent.sim_state().into_os_string();
    path.push(".host");
    PathBuf::from(path)
}

/// `(major, minor)` of the character device at `path`, failing on anything else.
fn char_device(path: &Path) -> (u32, u32) {
    let meta =
        std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(meta.file_type().is_char_device(), "{} is not a character device", path.display());
    // Linux's major and minor numbers are 32 bits wide each: the casts lose nothing.
    (major(meta.rdev()) as u32, minor(meta.rdev()) as u32)
}

/// The driver's capability minor of GPU instance `gi` on the GPU of minor `gpu`
/// (`/proc/driver/nvidia-caps/mig-minors`: 135 per GPU, 9 per GPU instance, from 3).
fn gi_minor(gpu: u32, gi: u32) -> u32 {
    3 + 135 * gpu + 9 * gi
}

#[test]
fn mig_instances_bring_their_capability_nodes_and_take_them_away() {
    if !is_root() {
        gpushare_tests::skip("the simulator makes device nodes only as root");
        return;
    }
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:1"));
    let host = host_of(&agent);
    let marker = std::fs::read_to_string(host.join("gpushare-simulated-host")).unwrap();
    if !marker.contains("device nodes: made") {
        gpushare_tests::skip(format_args!("root here may not make device nodes: {marker}"));
        return;
    }
    assert_eq!(char_device(&host.join("dev/nvidia0")), (195, 0));
    assert_eq!(char_device(&host.join("dev/nvidiactl")), (195, 255));
    char_device(&host.join("dev/nvidia-uvm"));
    char_device(&host.join("dev/nvidia-uvm-tools"));
    let caps = host.join("proc/driver/nvidia/capabilities");
    assert!(!caps.join("gpu0").exists(), "no MIG instance yet");

    let out = agent.ctl(&["apply", "all-balanced"]);
    assert!(out.status.success(), "{}", text(&out));
    let table = std::fs::read_to_string(host.join("proc/driver/nvidia-caps/mig-minors")).unwrap();
    let status = agent.status();
    let instances = &status.gpus[0].instances;
    assert!(instances.len() >= 3, "all-balanced on an A100: {instances:?}");
    let mut minors = Vec::new();
    for instance in instances {
        let gi = instance.gpu_instance_id;
        let mut capabilities = vec![(format!("gpu0/mig/gi{gi}/access"), gi_minor(0, gi))];
        assert!(table.contains(&format!("\ngpu0/gi{gi}/access {}\n", gi_minor(0, gi))));
        assert!(!instance.compute_instances.is_empty(), "{instance:?}");
        for ci in &instance.compute_instances {
            let ci = ci.compute_instance_id;
            let minor = gi_minor(0, gi) + 1 + ci;
            assert!(table.contains(&format!("\ngpu0/gi{gi}/ci{ci}/access {minor}\n")));
            capabilities.push((format!("gpu0/mig/gi{gi}/ci{ci}/access"), minor));
        }
        for (file, minor) in capabilities {
            let text =
                std::fs::read_to_string(caps.join(&file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(
                text,
                format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"),
                "{file}"
            );
            let node = host.join(format!("dev/nvidia-caps/nvidia-cap{minor}"));
            assert_eq!(char_device(&node).1, minor, "{}", node.display());
            minors.push(minor);
        }
    }

    // A real container runtime binds them: podman's --device takes the host's node
    // (its type and numbers) and makes it in the container.
    if let Some(podman) = gpushare_tests::podman::Podman::available() {
        let mut devices: Vec<String> = ["nvidia0", "nvidiactl"]
            .iter()
            .map(|n| format!("{}:/dev/{n}", host.join("dev").join(n).display()))
            .collect();
        for minor in &minors {
            let node = format!("dev/nvidia-caps/nvidia-cap{minor}");
            devices.push(format!("{}:/{node}", host.join(&node).display()));
        }
        let devices: Vec<&str> = devices.iter().map(String::as_str).collect();
        let out = podman.run(&devices, "stat -c '%n %F %t:%T' /dev/nvidia0 /dev/nvidia-caps/*");
        assert!(out.status.success(), "{}", text(&out));
        let seen = String::from_utf8_lossy(&out.stdout);
        assert!(seen.contains("/dev/nvidia0 character special file c3:0\n"), "{seen}");
        for minor in &minors {
            let line = format!(
                "/dev/nvidia-caps/nvidia-cap{minor} character special file 1ff:{minor:x}\n"
            );
            assert!(seen.contains(&line), "{line}: {seen}");
        }
    }

    let out = agent.ctl(&["apply", "all-disabled"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!caps.join("gpu0").exists(), "the instances' capability files are gone");
    for minor in minors {
        let node = host.join(format!("dev/nvidia-caps/nvidia-cap{minor}"));
        assert!(!node.exists(), "{} outlived its instance", node.display());
    }
    // The GPU's own nodes, and the driver's MIG config and monitor, stay.
    assert_eq!(char_device(&host.join("dev/nvidia0")), (195, 0));
    assert!(caps.join("mig/config").exists() && caps.join("mig/monitor").exists());
    assert_eq!(char_device(&host.join("dev/nvidia-caps/nvidia-cap1")).1, 1);
}
