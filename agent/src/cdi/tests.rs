//! The spec of simulated nodes, with a host of known nodes and directories.

use std::path::{Path, PathBuf};

use super::*;
use crate::catalog::parse_node_spec;
use crate::gpu::GpuBackend;
use crate::gpu::sim::{SimBackend, SimOptions};
use crate::node::{ComputeInstance, GpuInstance, MpsLimits};

/// Nodes under `/sim/dev`, MPS directories under `/run/gpushare/mps`; GPU 1's nodes missing.
struct FakeHost;

impl Host for FakeHost {
    fn nodes(&self, gpu: u32, mig: Option<(u32, u32)>) -> Result<Vec<DeviceNode>, String> {
        if gpu == 1 {
            return Err("/dev/nvidia1 is missing".into());
        }
        let node = |path: &str| DeviceNode {
            path: path.into(),
            host_path: Path::new("/sim").join(path.trim_start_matches('/')),
        };
        let mut nodes = vec![node(&format!("/dev/nvidia{gpu}")), node("/dev/nvidiactl")];
        if let Some((gi, ci)) = mig {
            nodes.push(node(&format!("/dev/nvidia-caps/nvidia-cap{}", 10 + gi * 10 + ci)));
        }
        Ok(nodes)
    }

    fn mps_dirs(&self, uuid: &str) -> (PathBuf, PathBuf) {
        let dir = Path::new("/run/gpushare/mps").join(uuid);
        (dir.join("pipe"), dir.join("log"))
    }
}

fn observed(spec: &str) -> NodeState {
    let sim = SimBackend::new(&parse_node_spec(spec).unwrap(), SimOptions::default());
    NodeState::of_gpus(sim.observe().unwrap())
}

fn server(
    node: &NodeState,
    gpu: u32,
    uuid: &str,
    threads: u32,
    memory: Option<u64>,
) -> MpsServerState {
    let _ = node;
    MpsServerState {
        uuid: uuid.into(),
        gpu,
        placement_start: None,
        compute_instance: 0,
        limits: MpsLimits { active_thread_percentage: threads, pinned_memory_limit_bytes: memory },
        pid: Some(4242),
        restarts: 0,
        clients: Vec::new(),
        clients_read: false,
    }
}

fn names(spec: &Spec) -> Vec<&str> {
    spec.devices.iter().map(|d| d.name.as_str()).collect()
}

#[test]
fn whole_gpus_are_named_by_index_and_uuid_and_a_gpu_without_nodes_is_left_out() {
    let node = observed("a100-40gb:2");
    let (spec, described, left_out) = build(&node, &FakeHost);
    let uuid = node.gpus[0].uuid.clone();
    assert_eq!(names(&spec), ["0", uuid.as_str()]);
    assert_eq!((spec.cdi_version.as_str(), spec.kind.as_str()), ("0.5.0", "gpushare.io/gpu"));
    let edits = &spec.devices[0].container_edits;
    assert_eq!(edits.env, [format!("CUDA_VISIBLE_DEVICES={uuid}")]);
    assert_eq!(
        edits.device_nodes[0],
        Node { path: "/dev/nvidia0".into(), host_path: Some("/sim/dev/nvidia0".into()) }
    );
    assert!(edits.mounts.is_empty());
    assert_eq!(described[0].describe, "GPU 0 (A100-SXM4-40GB) whole");
    assert_eq!(left_out, ["GPU 1 (A100-SXM4-40GB): /dev/nvidia1 is missing"]);
}

#[test]
fn an_mps_server_gives_one_share_per_replica_with_its_limits() {
    let mut node = observed("a100-40gb:1");
    let uuid = node.gpus[0].uuid.clone();
    node.mps.push(server(&node, 0, &uuid, 25, Some(10 << 30)));
    let (spec, described, _) = build(&node, &FakeHost);
    assert_eq!(names(&spec), ["0", uuid.as_str(), "0-mps-0", "0-mps-1", "0-mps-2", "0-mps-3"]);
    let share = &spec.devices[3].container_edits;
    let pipe = format!("/run/gpushare/mps/{uuid}/pipe");
    assert_eq!(
        share.env,
        [
            format!("CUDA_VISIBLE_DEVICES={uuid}"),
            format!("CUDA_MPS_PIPE_DIRECTORY={pipe}"),
            format!("CUDA_MPS_LOG_DIRECTORY=/run/gpushare/mps/{uuid}/log"),
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25".into(),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10G".into(),
            "GPUSHARE_CDI_DEVICE=gpushare.io/gpu=0-mps-1".into(),
        ]
    );
    assert_eq!(share.mounts[0].host_path, pipe);
    assert_eq!(share.mounts[0].container_path, pipe);
    assert_eq!(share.mounts[0].options, ["rbind", "rw", "nosuid", "nodev"]);
    assert_eq!(share.mounts[1].options[1], "ro");
    // The whole GPU, served: the pipe, no limits.
    let whole = &spec.devices[0].container_edits;
    assert_eq!(whole.env.len(), 3);
    assert!(!whole.env.iter().any(|e| e.starts_with("CUDA_MPS_ACTIVE")));
    assert_eq!(
        described[3].describe,
        "share 1 of 4 of the MPS server of GPU 0 (A100-SXM4-40GB): 25 % threads, 10 GiB pinned \
         memory; one user at a time: a container of another user waits until the server's \
         clients are gone"
    );
    // A server without a thread limit is one share; a stopped one none.
    node.mps[0].limits =
        MpsLimits { active_thread_percentage: 100, pinned_memory_limit_bytes: None };
    assert_eq!(names(&build(&node, &FakeHost).0).len(), 3);
    node.mps[0].pid = None;
    assert_eq!(names(&build(&node, &FakeHost).0).len(), 2);
}

#[test]
fn a_share_asks_for_the_limits_the_server_gives_now_and_keeps_its_name() {
    use crate::node::{LimitOverride, LiveLimits, LiveServer, MpsServerDetail, MpsSpec};
    let mut node = observed("a100-40gb:1");
    let uuid = node.gpus[0].uuid.clone();
    node.mps.push(server(&node, 0, &uuid, 25, Some(10 << 30)));
    let configured =
        MpsLimits { active_thread_percentage: 25, pinned_memory_limit_bytes: Some(10 << 30) };
    let raised = MpsLimits { active_thread_percentage: 50, ..configured };
    let made = LimitOverride {
        server_pid: 77,
        active_thread_percentage: Some(50),
        pinned_memory_limit_bytes: None,
        by_uid: Some(0),
        at_unix_seconds: 1,
    };
    let mut detail =
        MpsServerDetail::configured(MpsSpec { limits: configured, multi_user: true }, vec![made]);
    detail.live = Some(LiveLimits {
        defaults: configured,
        servers: vec![LiveServer { pid: 77, uid: Some(0), limits: raised }],
    });
    node.mps_details.insert(uuid.clone(), detail);
    let (spec, described, _) = build(&node, &FakeHost);
    // Still four shares, named as before: the count is the profile's.
    assert_eq!(names(&spec).len(), 6);
    assert!(
        spec.devices[2]
            .container_edits
            .env
            .contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50".into())
    );
    assert_eq!(
        described[2].describe,
        "share 0 of 4 of the MPS server of GPU 0 (A100-SXM4-40GB): 50 % threads, 10 GiB pinned \
         memory (set by gpushare-ctl mps limit); multi-user: every user's containers at once, \
         through one server running as root"
    );
}

#[test]
fn mig_devices_are_named_by_index_path_and_uuid_with_their_capability_nodes() {
    let mut node = observed("a100-40gb:1");
    let g = &mut node.gpus[0];
    g.mig_enabled = true;
    let instance = |id: u32, profile_id: u32, start: u8, ci: Vec<ComputeInstance>| GpuInstance {
        id,
        profile_id,
        placement_start: start,
        placement_size: 1,
        compute_instances: ci,
    };
    let ci = |id: u32, uuid: &str| ComputeInstance { id, uuid: uuid.into(), slices: 1 };
    g.instances = vec![
        instance(3, 0, 0, vec![ci(0, "MIG-aaaa")]),
        instance(5, 0, 1, vec![ci(0, "MIG-bbbb"), ci(1, "MIG-cccc")]),
    ];
    node.mps.push(server(&node, 0, "MIG-bbbb", 50, None));
    let (spec, described, _) = build(&node, &FakeHost);
    assert_eq!(
        names(&spec),
        ["0:0", "MIG-aaaa", "0:1", "MIG-bbbb", "0:1-mps-0", "0:1-mps-1", "0:2", "MIG-cccc"]
    );
    let second = &spec.devices[2].container_edits;
    assert_eq!(second.env[0], "CUDA_VISIBLE_DEVICES=MIG-bbbb");
    assert_eq!(second.device_nodes[2].path, "/dev/nvidia-caps/nvidia-cap60");
    assert!(
        described[0].describe.starts_with("GPU 0 (A100-SXM4-40GB) MIG device 0:0 ("),
        "{}",
        described[0].describe
    );
    assert!(described[0].describe.ends_with(" at slot 0)"), "{}", described[0].describe);
    // No whole-GPU device for a GPU with MIG on: CUDA cannot use it whole.
    assert!(!names(&spec).contains(&"0"));
}

#[test]
fn the_same_node_gives_the_same_bytes() {
    let mut node = observed("a100-40gb:1");
    let uuid = node.gpus[0].uuid.clone();
    node.mps.push(server(&node, 0, &uuid, 25, None));
    let a = to_bytes(&build(&node, &FakeHost).0);
    let b = to_bytes(&build(&node.clone(), &FakeHost).0);
    assert_eq!(a, b);
    assert!(a.ends_with(b"}\n"));
    let back: Spec = serde_json::from_slice(&a).unwrap();
    assert_eq!(back.devices.len(), 6);
}

/// Issue 37: one cause shared by many devices is one reason (said once), whatever the
/// devices and their paths; other causes are reasons of their own.
#[test]
fn left_out_devices_are_grouped_by_their_reason() {
    let root = "the simulator makes device nodes only as root";
    let left_out = vec![
        format!("GPU 0 (A100-SXM4-40GB): /s/dev/nvidia0 is missing: {root}"),
        format!(
            "GPU 1 (A100-SXM4-40GB) MIG device 1:0 (1g.5gb at slot 0): GPU instance 1: /s/dev/nvidia-caps/nvidia-cap147 is missing: {root}"
        ),
        "GPU 2 (A100-SXM4-40GB): /dev/nvidia2 is a regular file, not a character device: refused"
            .to_string(),
        format!("GPU 3 (A100-SXM4-40GB): /s/dev/nvidia3 is missing: {root}"),
    ];
    let reasons = reasons(&left_out);
    let whys: Vec<&str> = reasons.iter().map(|(why, _)| why.as_str()).collect();
    assert_eq!(whys, [root, "refused"]);
    assert_eq!(reasons[0].1, [&left_out[0], &left_out[1], &left_out[3]]);
    assert!(super::reasons(&[]).is_empty());
}
