//! The daemon's clients in the simulated node: the real driver lists an MPS client among
//! the GPU's compute processes and in `nvmlDeviceGetMPSComputeRunningProcesses` (driver
//! 580 on an H200: tests/device/results/clients-h200-2026-11-27), so the simulated daemon
//! registers each client its server serves (`--fake-client PID [--memory SIZE]`; a client
//! waiting for a server of its user once it is served) in the node's
//! state file (`GPUSHARE_SIM_STATE`), as a [`Process`] with `mps` and `registered` set, on
//! the GPU or GPU instance its server serves: the first device of the daemon's
//! `CUDA_VISIBLE_DEVICES` (a `GPU-` or `MIG-` UUID, or an index; GPU 0 when unset, as a
//! CUDA client picks). It removes them when the client leaves (its process ends,
//! `--fake-client-exit`, `terminate_client`), when the server ends (`quit`) and when the
//! daemon stops.
//!
//! The simulated MPS server is not a process (its PID is a number only), so the server's
//! own entry the real driver lists (`nvidia-cuda-mps-server`, 66 MiB) is not registered.
//!
//! Writes go through [`NodeFile::update`]: the node's lock and atomic write, as the
//! simulated nvidia-smi's. Without a state file (no simulated node: `GPUSHARE_SIM_STATE`
//! unset, or no agent started it) nothing is registered.

use std::collections::BTreeMap;
use std::path::PathBuf;

use gpushare_sim_nvml::node::{Node, Process};
use gpushare_sim_nvml::state_file::NodeFile;

/// Where a client runs: GPU index and GPU instance.
type Place = (u32, Option<u32>);

/// The registrations of one daemon.
#[derive(Debug)]
pub struct NodeClients {
    file: Option<NodeFile>,
    /// The first device of `CUDA_VISIBLE_DEVICES`.
    device: Option<String>,
    /// Each registered client's place, to remove exactly its entry.
    registered: BTreeMap<u32, Place>,
}

impl NodeClients {
    pub fn new(state: Option<PathBuf>, visible_devices: Option<&str>) -> NodeClients {
        let device = visible_devices
            .and_then(|v| v.split(',').next())
            .map(|d| d.trim().to_string())
            .filter(|d| !d.is_empty());
        NodeClients { file: state.map(NodeFile::new), device, registered: BTreeMap::new() }
    }

    /// The node file, when a simulated node exists.
    fn file(&self) -> Option<&NodeFile> {
        self.file.as_ref().filter(|f| f.path().exists())
    }

    /// Registers client `pid` using `memory` bytes, on the served device as the node is
    /// now. Returns what went wrong, for the daemon's log; a node without the device
    /// registers nothing.
    pub fn register(&mut self, pid: u32, memory: u64) -> Result<(), String> {
        let Some(file) = self.file() else { return Ok(()) };
        let device = self.device.clone();
        let before = self.registered.get(&pid).copied();
        let place = file.update(|node| {
            let place = place_of(node, device.as_deref())?;
            node.prune_exited();
            node.processes.retain(|p| !(is_ours(p, pid, before) || is_ours(p, pid, Some(place))));
            node.processes.push(Process {
                memory,
                mps: true,
                registered: true,
                // The daemon stands for the server: killed, its clients' entries go.
                server: Some(std::process::id()),
                ..Process::new(place.0, place.1, pid)
            });
            Some(place)
        })?;
        match place {
            Some(place) => {
                self.registered.insert(pid, place);
                Ok(())
            }
            None => Err(format!(
                "the simulated node has no device {:?}: client {pid} not registered",
                device.as_deref().unwrap_or("0")
            )),
        }
    }

    /// Removes the entries of clients `pids` this daemon registered.
    pub fn unregister(&mut self, pids: &[u32]) -> Result<(), String> {
        let places: Vec<(u32, Place)> = pids
            .iter()
            .filter_map(|p| self.registered.remove(p).map(|place| (*p, place)))
            .collect();
        if places.is_empty() {
            return Ok(());
        }
        let Some(file) = self.file() else { return Ok(()) };
        file.update(|node| {
            node.processes
                .retain(|p| !places.iter().any(|&(pid, place)| is_ours(p, pid, Some(place))));
            node.prune_exited();
        })
    }

    /// Removes every entry this daemon registered (it stops).
    pub fn unregister_all(&mut self) -> Result<(), String> {
        let pids: Vec<u32> = self.registered.keys().copied().collect();
        self.unregister(&pids)
    }
}

/// Whether `p` is the entry registered for client `pid` at `place`.
fn is_ours(p: &Process, pid: u32, place: Option<Place>) -> bool {
    p.registered && p.mps && p.pid == pid && place == Some((p.gpu, p.gpu_instance))
}

/// The GPU and GPU instance a device of `CUDA_VISIBLE_DEVICES` names in `node`: a GPU's
/// UUID, a MIG device's UUID (its compute instance's GPU instance), or an index; GPU 0
/// when unset.
pub fn place_of(node: &Node, device: Option<&str>) -> Option<Place> {
    let device = device.unwrap_or("0");
    if let Ok(index) = device.parse::<u32>() {
        return ((index as usize) < node.gpus.len()).then_some((index, None));
    }
    node.gpus.iter().enumerate().find_map(|(i, g)| {
        if g.uuid == device {
            return Some((i as u32, None));
        }
        g.instances
            .iter()
            .find(|gi| gi.compute_instances.iter().any(|ci| ci.uuid == device))
            .map(|gi| (i as u32, Some(gi.id)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_catalog::parse_node_spec;
    use gpushare_sim_nvml::node::{ComputeInstance, GpuInstance};

    fn node_file(dir: &tempfile::TempDir) -> (NodeFile, PathBuf) {
        let path = dir.path().join("node.json");
        let file = NodeFile::new(&path);
        let mut node = Node::new(&parse_node_spec("h100-80gb:2").unwrap());
        node.gpus[1].mig_enabled = true;
        node.gpus[1].instances.push(GpuInstance {
            id: 3,
            profile_id: 9,
            start: 0,
            size: 4,
            serial: 1,
            compute_instances: vec![ComputeInstance {
                id: 0,
                profile_id: 2,
                start: 0,
                size: 3,
                uuid: "MIG-aaaa".into(),
                serial: 2,
            }],
        });
        node.processes.push(Process::new(0, None, 4242));
        file.write(&file.lock().unwrap(), &node).unwrap();
        (file, path)
    }

    #[test]
    fn devices_map_to_their_place_in_the_node() {
        let dir = tempfile::tempdir().unwrap();
        let (file, _) = node_file(&dir);
        let node = file.read().unwrap();
        let gpu1 = node.gpus[1].uuid.clone();
        assert_eq!(place_of(&node, None), Some((0, None)));
        assert_eq!(place_of(&node, Some("1")), Some((1, None)));
        assert_eq!(place_of(&node, Some("2")), None);
        assert_eq!(place_of(&node, Some(&gpu1)), Some((1, None)));
        assert_eq!(place_of(&node, Some("MIG-aaaa")), Some((1, Some(3))));
        assert_eq!(place_of(&node, Some("GPU-nope")), None);
    }

    #[test]
    fn clients_are_registered_and_removed_in_the_node() {
        let dir = tempfile::tempdir().unwrap();
        let (file, path) = node_file(&dir);
        let me = std::process::id();
        let mut clients = NodeClients::new(Some(path.clone()), Some("MIG-aaaa,GPU-x"));
        clients.register(me, 2 << 30).unwrap();
        let node = file.read().unwrap();
        assert_eq!(
            node.processes,
            [
                Process::new(0, None, 4242),
                Process {
                    memory: 2 << 30,
                    mps: true,
                    registered: true,
                    server: Some(me),
                    ..Process::new(1, Some(3), me)
                }
            ]
        );
        // Again (another --memory): one entry, the new figure.
        clients.register(me, 1 << 20).unwrap();
        let node = file.read().unwrap();
        assert_eq!(node.processes.len(), 2);
        assert_eq!(node.processes[1].memory, 1 << 20);
        // Another daemon's client of the same PID elsewhere is not ours to remove.
        let mut other = NodeClients::new(Some(path.clone()), None);
        other.register(me, 1).unwrap();
        clients.unregister(&[me, 77]).unwrap();
        let pids: Vec<Place> =
            file.read().unwrap().processes.iter().map(|p| (p.gpu, p.gpu_instance)).collect();
        assert_eq!(pids, [(0, None), (0, None)]);
        other.unregister_all().unwrap();
        assert_eq!(file.read().unwrap().processes, [Process::new(0, None, 4242)]);

        // A device the node lacks: nothing registered, said.
        let mut lost = NodeClients::new(Some(path), Some("GPU-nope"));
        let e = lost.register(me, 1).unwrap_err();
        assert!(e.contains("no device \"GPU-nope\""), "{e}");
        // No node: nothing to do.
        let mut none = NodeClients::new(Some(dir.path().join("absent.json")), None);
        none.register(me, 1).unwrap();
        none.unregister_all().unwrap();
        let mut unset = NodeClients::new(None, None);
        unset.register(me, 1).unwrap();
    }
}
