//! The CDI spec (Container Device Interface, <https://github.com/cncf-tags/container-device-interface>)
//! of what the node shares now: whole GPUs, MIG devices, and the shares of each MPS
//! server, so that `podman run --device gpushare.io/gpu=0-mps-1` gives a container one
//! share with one flag. The spec is a function of the observed node ([`build`]): written
//! after every transaction (commit, rollback, restore) and at start-up, so it never names
//! an instance that no longer exists (NVIDIA's toolkit's spec does, after a repartition).
//!
//! Names (kind [`KIND`]):
//! - `0`, `GPU-…`: a whole GPU (MIG off), as `gpushare-ctl env` gives it (with the MPS
//!   server's pipe directory where one serves it, without limits).
//! - `0:1`, `MIG-…`: a MIG device, GPU 0's second in placement order (the index path of
//!   NVIDIA's toolkit).
//! - `0-mps-2`, `0:1-mps-0`: share 2 of the MPS server of GPU 0 (of MIG device `0:1`): the
//!   device, the server's pipe and log directories, and the share's limits as the client's
//!   own `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` / `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`: the
//!   limits the server gives a client connecting now, as its control daemon answers them
//!   (an override of `gpushare-ctl mps limit` included), so that a share never asks for
//!   less than the server gives. A server has as many shares as its configured thread
//!   limit gives (100 % / threads: 4 at 25 %, the `replicas = 4` of `all-mps`; one without
//!   a thread limit has one), so that the names stay while live limits change. A share
//!   says whom the server serves: one user at a time (NVIDIA's default), or everyone at
//!   once (multi-user).
//!
//! Driver libraries are NVIDIA's business: a container asks for NVIDIA's device too
//! (`--device nvidia.com/gpu=0`), whose spec mounts them (see DESIGN.md, "CDI").

pub mod writer;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::gpu::device_nodes::DeviceNode;
use crate::node::{LimitSource, MpsServerDetail, MpsServerState, NodeState, mps_memory_value};

/// The CDI kind of gpushare's devices.
pub const KIND: &str = "gpushare.io/gpu";
/// The CDI version written: 0.5.0 brought `hostPath` to device nodes (the simulator's
/// nodes live under its state directory), and is what podman 4.3 reads.
pub const CDI_VERSION: &str = "0.5.0";
/// The spec's file name in the CDI directory.
pub const FILE_NAME: &str = "gpushare.json";

/// A CDI spec document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Spec {
    /// The CDI version.
    #[serde(rename = "cdiVersion")]
    pub cdi_version: String,
    /// `vendor/class`.
    pub kind: String,
    /// The devices, in the order `gpushare-ctl cdi` lists them.
    pub devices: Vec<Device>,
}

/// One device of a spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    /// The name after `kind=`.
    pub name: String,
    /// What a container that asks for it gets.
    #[serde(rename = "containerEdits")]
    pub container_edits: Edits,
}

/// Edits to a container's OCI spec.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Edits {
    /// `NAME=value`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes bound in.
    #[serde(rename = "deviceNodes", default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<Node>,
    /// Bind mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

/// A device node: `path` in the container, `host_path` on the host where it differs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// In the container.
    pub path: String,
    /// On the host, where it is not `path` (the simulator's nodes).
    #[serde(rename = "hostPath", default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
}

/// A bind mount.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mount {
    /// On the host.
    #[serde(rename = "hostPath")]
    pub host_path: String,
    /// In the container.
    #[serde(rename = "containerPath")]
    pub container_path: String,
    /// Mount options.
    pub options: Vec<String>,
}

/// What a device is, for people and for `gpushare-ctl cdi`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Described {
    /// Its name.
    pub name: String,
    /// `gpu`, `mig` or `mps-share`.
    pub what: &'static str,
    /// The `GPU-…`/`MIG-…` it gives access to.
    pub uuid: String,
    /// One line: `GPU 0 (A100-SXM4-40GB) whole`, `share 1 of 4 of GPU 0's MPS server: 25 %
    /// threads, 10 GiB`.
    pub describe: String,
}

/// Where a device's pieces are on this host: its nodes (`None` for a whole GPU, or the GPU
/// instance and compute instance ids of a MIG device), the MPS directories of a `GPU-`/
/// `MIG-` UUID.
pub trait Host {
    /// The device nodes of GPU `gpu` (NVML index), or of its MIG device `mig` (GPU
    /// instance id, compute instance id).
    fn nodes(&self, gpu: u32, mig: Option<(u32, u32)>) -> Result<Vec<DeviceNode>, String>;
    /// The pipe and log directories of the MPS server of `uuid`.
    fn mps_dirs(&self, uuid: &str) -> (PathBuf, PathBuf);
}

/// The reasons in `left_out` ([`build`]'s lines), each with the devices it left out, in
/// order of first appearance: a reason is a line's text after its last `": "` (the device
/// and its path before it), so that one cause shared by many devices (the simulator makes
/// no device nodes without root) is one reason.
pub fn reasons(left_out: &[String]) -> Vec<(String, Vec<&str>)> {
    let mut reasons: Vec<(String, Vec<&str>)> = Vec::new();
    for line in left_out {
        let why = line.rsplit_once(": ").map_or(line.as_str(), |(_, why)| why);
        match reasons.iter_mut().find(|(w, _)| w == why) {
            Some((_, lines)) => lines.push(line),
            None => reasons.push((why.to_string(), vec![line])),
        }
    }
    reasons
}

/// The spec of `node` as it is, the devices described, and the devices left out with why
/// (one line each: a device node missing, say).
pub fn build(node: &NodeState, host: &dyn Host) -> (Spec, Vec<Described>, Vec<String>) {
    let mut devices = Vec::new();
    let mut described = Vec::new();
    let mut left_out = Vec::new();
    for g in &node.gpus {
        let label = g.label();
        if !g.mig_enabled {
            match host.nodes(g.index, None) {
                Ok(nodes) => {
                    let server = served(node, &g.uuid);
                    let edits =
                        device_edits(&g.uuid, &nodes, server.map(|_| host.mps_dirs(&g.uuid)));
                    for name in [g.index.to_string(), g.uuid.clone()] {
                        devices.push(Device { name: name.clone(), container_edits: edits.clone() });
                        described.push(Described {
                            name,
                            what: "gpu",
                            uuid: g.uuid.clone(),
                            describe: format!("{label} whole{}", mps_words(server)),
                        });
                    }
                    if let Some(server) = server {
                        shares(&g.index.to_string(), &g.uuid, &label, server, node, &nodes, host)
                            .into_iter()
                            .for_each(|(d, w)| {
                                devices.push(d);
                                described.push(w);
                            });
                    }
                }
                Err(why) => left_out.push(format!("{label}: {why}")),
            }
            continue;
        }
        let mut k = 0;
        for gi in &g.instances {
            let profile = g
                .model
                .and_then(|m| m.profile_by_id(gi.profile_id))
                .map_or_else(|| format!("profile {}", gi.profile_id), |p| p.name.to_string());
            for ci in &gi.compute_instances {
                let path = format!("{}:{k}", g.index);
                k += 1;
                let what =
                    format!("{label} MIG device {path} ({profile} at slot {})", gi.placement_start);
                match host.nodes(g.index, Some((gi.id, ci.id))) {
                    Ok(nodes) => {
                        let server = served(node, &ci.uuid);
                        let edits =
                            device_edits(&ci.uuid, &nodes, server.map(|_| host.mps_dirs(&ci.uuid)));
                        for name in [path.clone(), ci.uuid.clone()] {
                            devices.push(Device {
                                name: name.clone(),
                                container_edits: edits.clone(),
                            });
                            described.push(Described {
                                name,
                                what: "mig",
                                uuid: ci.uuid.clone(),
                                describe: format!("{what}{}", mps_words(server)),
                            });
                        }
                        if let Some(server) = server {
                            for (d, w) in shares(&path, &ci.uuid, &what, server, node, &nodes, host)
                            {
                                devices.push(d);
                                described.push(w);
                            }
                        }
                    }
                    Err(why) => left_out.push(format!("{what}: {why}")),
                }
            }
        }
    }
    let spec = Spec { cdi_version: CDI_VERSION.into(), kind: KIND.into(), devices };
    (spec, described, left_out)
}

/// The running MPS server of `uuid`, if one serves it.
fn served<'a>(node: &'a NodeState, uuid: &str) -> Option<&'a MpsServerState> {
    node.mps.iter().find(|s| s.uuid == uuid && s.pid.is_some())
}

/// `, served by MPS` for a device an MPS server serves.
fn mps_words(server: Option<&MpsServerState>) -> &'static str {
    if server.is_some() { " (its MPS server, without limits)" } else { "" }
}

/// How many shares a server has: as many as its configured thread limit gives
/// (100 % / threads; an observation's `limits` are the configured ones).
pub fn share_count(server: &MpsServerState) -> u32 {
    server.limits.shares()
}

/// The device `uuid` with its `nodes`, and the MPS server's directories where one serves it.
fn device_edits(uuid: &str, nodes: &[DeviceNode], mps: Option<(PathBuf, PathBuf)>) -> Edits {
    let mut env = vec![format!("CUDA_VISIBLE_DEVICES={uuid}")];
    let mut mounts = Vec::new();
    if let Some((pipe, log)) = mps {
        env.push(format!("CUDA_MPS_PIPE_DIRECTORY={}", pipe.display()));
        env.push(format!("CUDA_MPS_LOG_DIRECTORY={}", log.display()));
        mounts = directories(&pipe, &log);
    }
    Edits { env, device_nodes: nodes.iter().map(node_of).collect(), mounts }
}

/// The server's pipe directory (clients write its control pipe) and log directory, at the
/// same paths in the container, so that the variables name them there too.
fn directories(pipe: &std::path::Path, log: &std::path::Path) -> Vec<Mount> {
    let bind = |dir: &std::path::Path, mode: &str| Mount {
        host_path: dir.display().to_string(),
        container_path: dir.display().to_string(),
        options: vec!["rbind".into(), mode.into(), "nosuid".into(), "nodev".into()],
    };
    vec![bind(pipe, "rw"), bind(log, "ro")]
}

fn node_of(n: &DeviceNode) -> Node {
    let host = n.host_path.display().to_string();
    Node { host_path: (host != n.path).then_some(host), path: n.path.clone() }
}

/// The shares of `server` serving `uuid` (device `path`, `0` or `0:1`).
fn shares(
    path: &str,
    uuid: &str,
    what: &str,
    server: &MpsServerState,
    node: &NodeState,
    nodes: &[DeviceNode],
    host: &dyn Host,
) -> Vec<(Device, Described)> {
    let count = share_count(server);
    let detail = node.mps_detail(uuid);
    let (limits, source) = detail
        .and_then(MpsServerDetail::for_new_clients)
        .unwrap_or((server.limits, LimitSource::Profile));
    let threads = limits.active_thread_percentage;
    let memory = limits.pinned_memory_limit_bytes;
    let from = match source {
        LimitSource::Profile => "",
        LimitSource::MpsLimit => " (set by gpushare-ctl mps limit)",
        LimitSource::Unknown => {
            " (changed outside gpushare: the health check puts the profile's back)"
        }
    };
    let users = if detail.is_some_and(|d| d.multi_user) {
        "; multi-user: every user's containers at once, through one server running as root"
    } else {
        "; one user at a time: a container of another user waits until the server's clients are gone"
    };
    (0..count)
        .map(|i| {
            let name = format!("{path}-mps-{i}");
            let mut edits = device_edits(uuid, nodes, Some(host.mps_dirs(uuid)));
            edits.env.push(format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={threads}"));
            if let Some(bytes) = memory {
                // Ordinal 0: the one device the container sees.
                edits.env.push(format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={}", mps_memory_value(bytes)));
            }
            edits.env.push(format!("GPUSHARE_CDI_DEVICE={KIND}={name}"));
            let memory_words = memory.map_or("no memory limit".to_string(), |b| {
                format!("{} pinned memory", gpushare_proto::readable_size(b))
            });
            let described = Described {
                name: name.clone(),
                what: "mps-share",
                uuid: uuid.to_string(),
                describe: format!(
                    "share {i} of {count} of the MPS server of {what}: {threads} % threads, {memory_words}{from}{users}"
                ),
            };
            (Device { name, container_edits: edits }, described)
        })
        .collect()
}

/// The spec as written: JSON, pretty, with a newline; the same node always gives the same
/// bytes (a rolled-back apply leaves the spec as it was, byte for byte).
pub fn to_bytes(spec: &Spec) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(spec).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

#[cfg(test)]
mod tests;
