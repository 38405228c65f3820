//! The tool in-process: its answers and the node it leaves.

use std::fs;

use gpushare_catalog::parse_node_spec;
use gpushare_sim_nvml::node::{ComputeInstance, ComputeMode, GpuInstance, Process};
use gpushare_sim_nvml::state_file::Generation;

use super::*;

/// A temporary directory with a node file of `spec`'s GPUs and a record file.
struct Fixture {
    dir: tempfile::TempDir,
    /// `GPUSHARE_SIM_FAIL`'s value.
    fail: String,
}

impl Fixture {
    fn new(spec: &str) -> Fixture {
        let f = Fixture { dir: tempfile::tempdir().unwrap(), fail: String::new() };
        let file = f.file();
        file.write(&file.lock().unwrap(), &Node::new(&parse_node_spec(spec).unwrap())).unwrap();
        f
    }
    fn state(&self) -> PathBuf {
        self.dir.path().join("simulated-gpus.json")
    }
    fn file(&self) -> NodeFile {
        NodeFile::new(self.state())
    }
    fn node(&self) -> Node {
        self.file().read().unwrap()
    }
    fn change(&self, f: impl FnOnce(&mut Node)) {
        self.file().update(f).unwrap();
    }
    fn record(&self) -> PathBuf {
        self.dir.path().join("record")
    }
    fn env(&self) -> Env {
        Env {
            state: Some(self.state()),
            record: Some(self.record()),
            failures: faults::parse(&self.fail),
        }
    }
    /// Runs one invocation: (exit status, stdout, stderr).
    fn run_with(&self, env: &Env, args: &[&str]) -> (u8, String, String) {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let status = run(&args, env, &mut Out { out: &mut stdout, err: &mut stderr });
        (status, String::from_utf8(stdout).unwrap(), String::from_utf8(stderr).unwrap())
    }
    /// Runs one invocation: (exit status, stdout); stderr must be empty.
    fn run(&self, args: &[&str]) -> (u8, String) {
        let (status, out, err) = self.run_with(&self.env(), args);
        assert_eq!(err, "", "{args:?}");
        (status, out)
    }
}

fn in_use(pci: &str) -> String {
    format!(
        "The following GPUs could not be reset:\n  GPU {pci}: In use by another client\n\n\
         1 device is currently being used by one or more other processes (e.g., Fabric \
         Manager, CUDA application, graphics application such as an X server, or a \
         monitoring application such as another instance of nvidia-smi). Please first kill \
         all processes using this device and all compute applications running in the \
         system.\n"
    )
}

#[test]
fn lists_the_nodes_gpus_with_their_nvml_names() {
    let f = Fixture::new("h100-80gb:2,a30:1");
    let node = f.node();
    let (status, out) = f.run(&["-L"]);
    assert_eq!(status, 0);
    assert_eq!(
        out,
        format!(
            "GPU 0: NVIDIA H100 80GB HBM3 (UUID: {})\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: {})\n\
             GPU 2: {} (UUID: {})\n",
            node.gpus[0].uuid,
            node.gpus[1].uuid,
            node.gpus[2].name(),
            node.gpus[2].uuid
        )
    );
    // An ID is the index, the UUID or the PCI bus ID, in any case and form.
    let query = ["--query-gpu=index,name", "--format=csv,noheader", "-i"];
    for id in
        ["2", &node.gpus[2].uuid.to_uppercase(), "00000000:1d:00.0", "0000:1D:00.0", "1d:00.0"]
    {
        let (status, out) = f.run(&[&query[..], &[id]].concat());
        assert_eq!((status, out), (0, format!("2, {}\n", node.gpus[2].name())), "{id}");
    }
    let (status, out) = f.run(&[&query[..], &["1,0"]].concat());
    assert_eq!((status, out.as_str()), (0, "1, NVIDIA H100 80GB HBM3\n0, NVIDIA H100 80GB HBM3\n"));
    assert_eq!(f.run(&[&query[..], &["3"]].concat()), (6, "No devices were found\n".into()));
    // -L takes no -i, as the real tool.
    assert_eq!(
        f.run(&["-L", "-i", "0"]),
        (2, "ERROR: Option -i is not valid for this command. Please run 'nvidia-smi -h' for help.\n\n".into())
    );
    assert_eq!(f.node(), node, "listing changes nothing");
}

#[test]
fn lists_mig_devices_under_their_gpu() {
    let f = Fixture::new("h100-80gb:1");
    f.change(|node| {
        let gpu = &mut node.gpus[0];
        gpu.mig_enabled = true;
        let ci = |id, size, uuid: &str| ComputeInstance {
            id,
            profile_id: 0,
            start: 0,
            size,
            uuid: uuid.into(),
            serial: 0,
        };
        // 3g.40gb is profile 9, 1g.10gb profile 19 on an H100-80GB.
        gpu.instances = vec![
            GpuInstance {
                id: 2,
                profile_id: 9,
                start: 4,
                size: 4,
                serial: 1,
                compute_instances: vec![ci(0, 3, "MIG-aaaa")],
            },
            GpuInstance {
                id: 9,
                profile_id: 19,
                start: 0,
                size: 1,
                serial: 2,
                compute_instances: vec![ci(0, 1, "MIG-bbbb")],
            },
        ];
    });
    let (status, out) = f.run(&["-L"]);
    assert_eq!(status, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[1..],
        // In NVML's device order: by placement, not as the node holds them.
        [
            "  MIG 1g.10gb     Device  0: (UUID: MIG-bbbb)",
            "  MIG 3g.40gb     Device  1: (UUID: MIG-aaaa)"
        ]
    );
}

#[test]
fn lists_compute_policies_as_the_probe_shows() {
    let f = Fixture::new("h100-80gb:1");
    let generation = Generation::open(&f.file()).unwrap();
    let before = generation.current();
    let (status, out) = f.run(&["compute-policy", "-l"]);
    assert_eq!(status, 0);
    assert_eq!(
        out,
        "\
+-------------------------------------+
| GPU compute policies:               |
| GPU     Name           Value        |
|=====================================|
|   0   Timeslice       Default       |
+-------------------------------------+
"
    );
    assert_eq!(generation.current(), before, "listing does not rewrite the node");
}

#[test]
fn sets_timeslices_on_the_node() {
    let f = Fixture::new("h100-80gb:8");
    let uuid = f.node().gpus[0].uuid.clone();
    let (status, out) = f.run(&["compute-policy", "-i", &uuid, "--set-timeslice", "2"]);
    assert_eq!((status, out), (0, format!("Set timeslice to 2 for GPU {uuid}\n")));
    assert_eq!(f.node().gpus[0].timeslice, 2);
    let (_, out) = f.run(&["compute-policy", "-l"]);
    assert!(out.contains("|   0   Timeslice       Medium        |\n"), "{out}");

    let (status, out) = f.run(&["compute-policy", "--id=0", "--set-timeslice=3", "-l"]);
    assert_eq!(status, 0);
    assert!(out.starts_with("Set timeslice to 3 for GPU 0\n+---"), "{out}");
    assert!(out.contains("Long"), "{out}");
    let (_, out) = f.run(&["compute-policy", "-i", "1,00000000:22:00.0", "--set-timeslice", "1"]);
    assert_eq!(out, "Set timeslice to 1 for GPU 1\nSet timeslice to 1 for GPU 00000000:22:00.0\n");
    let (_, out) = f.run(&["compute-policy", "-l"]);
    let rows: Vec<&str> = out.lines().filter(|l| l.contains("Timeslice")).collect();
    assert_eq!(rows.len(), 8);
    assert_eq!(rows[1], "|   1   Timeslice       Short         |");
    assert_eq!(rows[2], "|   2   Timeslice       Default       |");
    assert_eq!(rows[7], "|   7   Timeslice       Short         |");
    let timeslices: Vec<u8> = f.node().gpus.iter().map(|g| g.timeslice).collect();
    assert_eq!(timeslices, [3, 1, 0, 0, 0, 0, 0, 1]);
    let record = fs::read_to_string(f.record()).unwrap();
    assert_eq!(
        record.lines().take(3).collect::<Vec<_>>(),
        [
            format!("nvidia-smi compute-policy -i {uuid} --set-timeslice 2"),
            "nvidia-smi compute-policy -l".into(),
            "nvidia-smi compute-policy --id=0 --set-timeslice=3 -l".into(),
        ]
    );
    assert_eq!(f.node().tool_calls["set-timeslice"], 3);
}

#[test]
fn a_reset_is_refused_while_persistence_mode_is_on() {
    let f = Fixture::new("a100-40gb:2");
    assert!(f.node().gpus[1].persistence_mode, "on by default, as nvidia-persistenced");
    let (status, out) = f.run(&["--gpu-reset", "-i", "1"]);
    assert_eq!((status, out), (255, in_use("00000000:1C:00.0")));
    assert_eq!(f.node().gpus[1].reset_count, 0);
}

#[test]
fn a_reset_is_refused_while_processes_hold_the_gpu() {
    let f = Fixture::new("a100-40gb:2");
    f.change(|node| {
        node.gpus[0].persistence_mode = false;
        node.processes.push(Process::new(0, None, 4242));
    });
    let (status, out) = f.run(&["-r", "-i", "0"]);
    assert_eq!((status, out), (255, in_use("00000000:1B:00.0")));
    // Both GPUs: one in use, the other (persistence mode on) too.
    let (status, out) = f.run(&["-r"]);
    assert_eq!(status, 255);
    assert!(
        out.starts_with(
            "The following GPUs could not be reset:\n  GPU 00000000:1B:00.0: In use by another client\n  \
             GPU 00000000:1C:00.0: In use by another client\n\n2 devices are currently being used"
        ),
        "{out}"
    );
    assert!(out.contains("using these devices"), "{out}");
    assert_eq!(f.node().gpus[0].reset_count, 0);
}

#[test]
fn a_reset_settles_a_pending_mig_mode_and_restores_defaults() {
    let f = Fixture::new("a100-40gb:2");
    f.change(|node| {
        let gpu = &mut node.gpus[1];
        gpu.persistence_mode = false;
        gpu.mig_pending = Some(true);
        gpu.compute_mode = ComputeMode::ExclusiveProcess;
        gpu.timeslice = 2;
    });
    let (status, out) = f.run(&["--gpu-reset", "-i", "1"]);
    assert_eq!(
        (status, out.as_str()),
        (0, "GPU 00000000:1C:00.0 was successfully reset.\nAll done.\n")
    );
    let node = f.node();
    let gpu = &node.gpus[1];
    assert!(gpu.mig_enabled && gpu.mig_pending.is_none());
    assert_eq!((gpu.compute_mode, gpu.timeslice, gpu.reset_count), (ComputeMode::Default, 0, 1));
    assert_eq!(node.gpus[0].reset_count, 0);
    assert_eq!(node.tool_calls["gpu-reset"], 1);
}

#[test]
fn the_second_reset_fails_when_injected_counted_across_invocations() {
    let mut f = Fixture::new("h100-80gb:1");
    f.change(|node| node.gpus[0].persistence_mode = false);
    f.fail = "gpu-reset:2".into();
    let ok = "GPU 00000000:1B:00.0 was successfully reset.\nAll done.\n";
    assert_eq!(f.run(&["-r", "-i", "0"]), (0, ok.into()));
    let (status, out, err) = f.run_with(&f.env(), &["-r", "-i", "0"]);
    assert_eq!((status, out), (255, in_use("00000000:1B:00.0")));
    assert_eq!(
        err,
        "gpushare-sim-nvidia-smi: failure injected by GPUSHARE_SIM_FAIL: call 2 of gpu-reset \
         fails with NVML_ERROR_IN_USE\n"
    );
    assert_eq!(f.node().gpus[0].reset_count, 1);
    assert_eq!(f.run(&["-r", "-i", "0"]), (0, ok.into()));
    assert_eq!(f.node().tool_calls["gpu-reset"], 3);
    // Another code when the entry names one.
    f.fail = "gpu-reset:4=NVML_ERROR_GPU_IS_LOST".into();
    let (status, out, err) = f.run_with(&f.env(), &["-r", "-i", "0"]);
    assert_eq!((status, out.as_str()), (15, "Unable to reset GPU 00000000:1B:00.0: GPU is lost\n"));
    assert!(err.contains("NVML_ERROR_GPU_IS_LOST"), "{err}");
}

#[test]
fn an_injected_timeslice_failure_lacks_permissions() {
    let mut f = Fixture::new("h100-80gb:2");
    f.fail = "set-timeslice:1".into();
    let (status, out, err) =
        f.run_with(&f.env(), &["compute-policy", "-i", "1", "--set-timeslice", "2"]);
    assert_eq!(
        (status, out.as_str()),
        (4, "Unable to set timeslice for GPU 00000000:1C:00.0: Insufficient Permissions\n")
    );
    assert!(err.contains("call 1 of set-timeslice"), "{err}");
    assert_eq!(f.node().gpus[1].timeslice, 0);
    let (status, _) = f.run(&["compute-policy", "-i", "1", "--set-timeslice", "2"]);
    assert_eq!(status, 0);
    assert_eq!(f.node().gpus[1].timeslice, 2);
    // A GPUSHARE_SIM_FAIL that does not parse stops a change.
    f.fail = "set-timeslice".into();
    let (status, out, err) =
        f.run_with(&f.env(), &["compute-policy", "-i", "1", "--set-timeslice", "0"]);
    assert_eq!((status, out.as_str()), (255, ""));
    assert!(err.starts_with("gpushare-sim-nvidia-smi: GPUSHARE_SIM_FAIL: "), "{err}");
    assert_eq!(f.node().gpus[1].timeslice, 2);
}

#[test]
fn without_a_node_it_answers_as_a_host_without_a_driver() {
    let f = Fixture::new("h100-80gb:1");
    let driver = format!("{NO_DRIVER}\n");
    let unset = Env { state: None, record: Some(f.record()), failures: Ok(Vec::new()) };
    for args in [&["-L"][..], &["-r", "-i", "0"], &["compute-policy", "-l"]] {
        let (status, out, err) = f.run_with(&unset, args);
        assert_eq!((status, &out), (9, &driver), "{args:?}");
        assert!(err.contains("GPUSHARE_SIM_STATE is not set"), "{err}");
        assert_eq!(err.lines().count(), 1);
    }
    let missing = Env { state: Some(f.dir.path().join("none.json")), ..f.env() };
    let (status, out, err) = f.run_with(&missing, &["compute-policy", "--set-timeslice", "1"]);
    assert_eq!((status, out), (9, driver));
    assert!(err.contains("no simulated node at GPUSHARE_SIM_STATE="), "{err}");
    // The help needs no driver.
    assert_eq!(f.run_with(&unset, &["compute-policy", "-h"]).0, 0);
    assert_eq!(fs::read_to_string(f.record()).unwrap().lines().count(), 5);
}

#[test]
fn errors_as_the_real_tool() {
    let f = Fixture::new("h100-80gb:1");
    let (status, out) = f.run(&["--bogus"]);
    assert_eq!(
        (status, out.as_str()),
        (255, "ERROR: Option --bogus is not recognized. Please run 'nvidia-smi -h'.\n\n")
    );
    let (status, out) = f.run(&["compute-policy", "--set-timeslice", "4"]);
    assert_eq!((status, out), (2, format!("{INVALID_COMBINATION}\n")));
    let (status, _) = f.run(&["compute-policy", "--set-timeslice", "x"]);
    assert_eq!(status, 2);
    let (status, out) = f.run(&["compute-policy", "-i"]);
    assert_eq!(status, 2);
    assert_eq!(
        out,
        "ERROR: Option -i is missing its value. Please run 'nvidia-smi -h' for help.\n"
    );
    let (status, out) = f.run(&["compute-policy", "-i", "GPU-nope", "--set-timeslice", "1"]);
    assert_eq!((status, out.as_str()), (6, "No devices were found\n"));
    let (status, _) = f.run(&["-i", "9", "-r"]);
    assert_eq!(status, 6);
    let (status, _) = f.run(&["-L", "-r"]);
    assert_eq!(status, 2);
    let (status, out) = f.run(&["compute-policy"]);
    assert_eq!(status, 0);
    assert!(out.contains("[ | --set-timeslice]: Set timeslice config for a GPU:"));
    fs::write(f.state(), "{ not json").unwrap();
    let (status, out, err) = f.run_with(&f.env(), &["-L"]);
    assert_eq!((status, out.as_str()), (255, ""));
    assert!(err.contains("unreadable simulated node state"), "{err}");
    // Every invocation is recorded, failed ones too.
    assert_eq!(fs::read_to_string(f.record()).unwrap().lines().count(), 9);
}

#[test]
fn values_it_does_not_know_are_refused_before_the_node_is_read() {
    let f = Fixture::new("h100-80gb:1");
    let node = f.node();
    let invalid = (2, format!("{INVALID_COMBINATION}\n"));
    for args in [
        &["-q", "-d", "TEMPERATURES"][..],
        &["--query-gpu=index", "--format=tsv"],
        &["-pm", "2"],
        &["-mig", "on"],
        &["-q", "--query-gpu=index"],
        &["-L", "-pm", "1"],
        &["-d", "MEMORY"],
        &["mig", "-lgi", "-lci"],
        &["mig", "-C"],
        &["mig", "-lgi", "-gi", "one"],
    ] {
        assert_eq!(f.run(args), invalid, "{args:?}");
    }
    // A display type without a modelled section prints the header and the GPU alone.
    let (status, out) = f.run(&["-q", "-d", "temperature"]);
    assert_eq!(status, 0);
    assert!(
        out.ends_with(
            "Attached GPUs                                          : 1\nGPU 00000000:1B:00.0\n\n"
        ),
        "{out}"
    );
    assert_eq!(f.node(), node, "nothing changed");
}

/// Each reset blocker of issue 26 (point 5) refuses `-r` as the real tool does, and resets
/// nothing; without it the same reset goes through.
#[test]
fn reset_blockers_refuse_resets_and_change_nothing() {
    use gpushare_sim_nvml::node::{FabricManager, NvidiaDrm, VirtualizationMode};
    let f = Fixture::new("a100-40gb:2");
    f.change(|node| {
        for gpu in &mut node.gpus {
            gpu.persistence_mode = false;
            gpu.mig_pending = Some(true);
        }
    });
    let refused = |args: &[&str], expected: (u8, &str)| {
        let before = f.node();
        let (status, out) = f.run(args);
        assert_eq!((status, out.as_str()), expected, "{args:?}");
        assert_eq!(f.node().gpus, before.gpus, "{args:?}: nothing reset");
    };

    // An A100 passed through to a VM without function-level reset (the MIG user guide's
    // example).
    f.change(|node| {
        node.gpus[0].virtualization_mode = VirtualizationMode::Passthrough;
        node.gpus[0].flr = false;
    });
    refused(&["-r", "-i", "0"], (3, "Resetting GPU 00000000:1B:00.0 is not supported.\n"));
    refused(&["-r"], (3, "Resetting GPU 00000000:1B:00.0 is not supported.\n"));
    // A vGPU guest.
    f.change(|node| {
        node.gpus[0].virtualization_mode = VirtualizationMode::Vgpu;
        node.gpus[0].flr = true;
    });
    refused(&["-r", "-i", "0"], (3, "Resetting GPU 00000000:1B:00.0 is not supported.\n"));

    // nvidia_drm with modesetting holds every GPU.
    f.change(|node| {
        node.gpus[0].virtualization_mode = VirtualizationMode::Passthrough;
        node.host.nvidia_drm = Some(NvidiaDrm { modeset: true });
    });
    refused(&["-r", "-i", "1"], (255, &in_use("00000000:1C:00.0")));

    // NVSwitches without Fabric Manager: an A100 is reset only with its NVLink peers.
    f.change(|node| {
        node.host.nvidia_drm = Some(NvidiaDrm { modeset: false });
        node.host.nvswitches = 6;
        node.host.fabric_manager = FabricManager::Stopped;
    });
    refused(
        &["-r", "-i", "0"],
        (
            255,
            "Unable to reset GPU 00000000:1B:00.0: Fabric Manager is not running, so the GPUs \
             connected to it by NVLink must be reset in the same command: 00000000:1C:00.0\n",
        ),
    );
    // All of them together, or one with Fabric Manager running, are reset.
    let (status, out) = f.run(&["-r"]);
    assert_eq!(status, 0, "{out}");
    assert!(f.node().gpus.iter().all(|g| g.mig_enabled && g.reset_count == 1));
    f.change(|node| node.host.fabric_manager = FabricManager::Running);
    assert_eq!(
        f.run(&["-r", "-i", "1"]),
        (0, "GPU 00000000:1C:00.0 was successfully reset.\nAll done.\n".into())
    );
}

/// The recorded H200's clients (driver 580.159.04, tests/device/results/
/// clients-h200-2026-11-27/smi.txt): `--query-compute-apps` lists the MPS server, the
/// MPS client and the direct client, each with its own memory; `-q` shows the MPS client
/// as `M+C`; the GPU's used memory is theirs together.
#[test]
fn compute_apps_show_each_processs_memory_and_mps_clients() {
    let f = Fixture::new("h100-80gb:2");
    let me = std::process::id();
    // The name nvidia-smi shows: argv[0], as the real tool showed `nvidia-cuda-mps-server`.
    let comm = std::env::args().next().unwrap();
    f.change(|node| {
        node.processes.push(Process { memory: 69_206_016, ..Process::new(0, None, 2676) });
        node.processes.push(Process {
            memory: 2_485_125_120,
            mps: true,
            registered: true,
            ..Process::new(0, None, me)
        });
        node.processes.push(Process { memory: 3_860_856_832, ..Process::new(0, None, 3609) });
        // A registered client that has exited is not listed.
        node.processes.push(Process { mps: true, registered: true, ..Process::new(0, None, 0) });
    });
    let (status, out) =
        f.run(&["--query-compute-apps=pid,process_name,used_memory", "--format=csv"]);
    assert_eq!(status, 0);
    assert_eq!(
        out,
        format!(
            "pid, process_name, used_gpu_memory [MiB]\n2676, [Not Found], 66 MiB\n\
             {me}, {comm}, 2370 MiB\n3609, [Not Found], 3682 MiB\n"
        )
    );
    let (_, out) = f.run(&[
        "--query-compute-apps=gpu_uuid,pid,used_gpu_memory",
        "--format=csv,noheader,nounits",
        "-i",
        "1",
    ]);
    assert_eq!(out, "");
    let uuid = f.node().gpus[0].uuid.clone();
    let (_, out) =
        f.run(&["--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader", "-i", "0"]);
    assert_eq!(out.lines().next().unwrap(), format!("{uuid}, 2676"));
    let (status, out) = f.run(&["--query-compute-apps=pid,bogus"]);
    assert_eq!((status, out.as_str()), (2, "Field \"bogus\" is not a valid field to query.\n\n"));

    let (_, out) = f.run(&["-q", "-d", "PIDS", "-i", "0"]);
    let types: Vec<&str> = out.lines().filter(|l| l.trim_start().starts_with("Type")).collect();
    assert_eq!(types.len(), 3, "{out}");
    assert!(types[0].ends_with(": C") && types[1].ends_with(": M+C"), "{out}");
    assert!(out.contains(": 2370 MiB") && out.contains(": 3682 MiB"), "{out}");
    let (_, out) = f.run(&["--query-gpu=memory.used", "--format=csv,noheader", "-i", "0"]);
    assert_eq!(out, format!("{} MiB\n", 66 + 2370 + 3682));
}
