//! MIG through the simulated nvidia-smi as an operator drives it: `-pm`, `-mig`, `-r`,
//! `mig -cgi/-cci/-lgi/-lci/-lcip/-dci/-dgi`, on A100 and H100 nodes, checked against the
//! node the simulated driver sees and the texts NVIDIA's MIG user guide shows. GPU
//! instance ids are the driver's (`rules`), read back from the node.

mod smi;

use gpushare_sim_nvml::node::{Node, Process};
use smi::{Sim, log_entries};

const BUS: &str = "00000000:1B:00.0";

/// The id of GPU 0's instance placed at `start`.
fn gi_at(node: &Node, start: u8) -> u32 {
    node.gpus[0].instances.iter().find(|gi| gi.start == start).expect("an instance there").id
}

/// Each instance's (start, compute instances' (start, size)), by start.
fn layout(node: &Node) -> Vec<(u8, Vec<(u8, u8)>)> {
    let mut gis: Vec<_> = node.gpus[0]
        .instances
        .iter()
        .map(|gi| (gi.start, gi.compute_instances.iter().map(|ci| (ci.start, ci.size)).collect()))
        .collect();
    gis.sort();
    gis
}

fn lgi_row(gi: u32, name: &str, profile: u32, start: u8, size: u8) -> String {
    format!("|   0  MIG {name:<16}{profile:>4}{gi:>9}{start:>11}:{size:<5} |")
}

#[test]
fn an_a100_goes_into_mig_and_back() {
    let sim = Sim::new("a100-40gb:1");
    // Persistence mode (on, as with nvidia-persistenced) keeps an Ampere change pending.
    assert_eq!(
        sim.ok(&["-mig", "1"]),
        format!(
            "Warning: MIG mode is in pending enable state for GPU {BUS}:In use by another \
             client\n{BUS} is currently being used by one or more other processes (e.g. CUDA \
             application or a monitoring application such as another instance of nvidia-smi). \
             Please first kill all processes using the device and retry the command or reboot \
             the system to make MIG mode effective.\nAll done.\n"
        )
    );
    let modes = ["--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader"];
    assert_eq!(sim.ok(&modes), "Disabled, Enabled\n");
    assert_eq!(
        sim.ok(&["-pm", "0"]),
        format!("Disabled persistence mode for GPU {BUS}.\nAll done.\n")
    );
    assert_eq!(
        sim.ok(&["-pm", "DISABLED"]),
        format!("Persistence mode is already Disabled for GPU {BUS}.\nAll done.\n")
    );
    // mig-parted resets with the sysfs form of the bus id.
    assert_eq!(
        sim.ok(&["-r", "-i", "0000:1b:00.0"]),
        format!("GPU {BUS} was successfully reset.\nAll done.\n")
    );
    assert_eq!(sim.ok(&modes), "Enabled, Enabled\n");
    assert_eq!(sim.run(&["mig", "-lgi"]), ("No GPU instances found: Not Found\n".into(), 6));

    // The MIG user guide's example: one by id, one by name, each with its compute instance.
    let created = sim.ok(&["mig", "-cgi", "9,3g.20gb", "-C"]);
    let node = sim.node();
    assert_eq!(layout(&node), [(0, vec![(0, 3)]), (4, vec![(0, 3)])], "the first at slot 4");
    let (first, second) = (gi_at(&node, 4), gi_at(&node, 0));
    let gi_line = |gi: u32| {
        format!(
            "Successfully created GPU instance ID {gi:>2} on GPU  0 using profile MIG 3g.20gb (ID  9)\n"
        )
    };
    let ci_line = |gi: u32| {
        format!(
            "Successfully created compute instance ID  0 on GPU  0 GPU instance ID {gi:>2} using \
             profile MIG 3g.20gb (ID  2)\n"
        )
    };
    assert_eq!(
        created,
        [gi_line(first), ci_line(first), gi_line(second), ci_line(second)].concat()
    );

    let (low, high) = (first.min(second), first.max(second));
    let start_of = |gi: u32| if gi == first { 4 } else { 0 };
    let border = "+---------------------------------------------------------+";
    let lgi = sim.ok(&["mig", "-lgi"]);
    let lines: Vec<&str> = lgi.lines().collect();
    assert_eq!(lines.len(), 9, "{lgi}");
    assert_eq!(lines[5], lgi_row(low, "3g.20gb", 9, start_of(low), 4));
    assert_eq!(lines[7], lgi_row(high, "3g.20gb", 9, start_of(high), 4));
    assert_eq!((lines[0], lines[6], lines[8]), (border, border, border));

    let lci = sim.ok(&["mig", "-lci", "-gi", &second.to_string()]);
    assert_eq!(
        lci.lines().nth(6).unwrap(),
        format!("|   0{second:>7}       MIG 3g.20gb          2         0          0:3     |")
    );
    // A GPU instance's compute-instance profiles, laid out as in the user guide (A100-40GB,
    // 3g.20gb); none free while the default compute instance takes all three slices.
    let lcip = sim.ok(&["mig", "-lcip", "-gi", &second.to_string()]);
    let rows: Vec<&str> = lcip.lines().skip(6).collect();
    let row = |name: &str, profile: u32, default: &str, total: u32, sms: u32| {
        format!(
            "|   0{second:>7}       MIG {name:<13}{profile:>5}{default:<1}     0/{total:<12}{sms:<10}2     \
             0     0   |"
        )
    };
    let shared = format!("|{:70}3     0         |", "");
    assert_eq!(rows[0], row("1c.3g.20gb", 0, " ", 3, 14));
    assert_eq!(rows[1], shared);
    assert_eq!(rows[3], row("2c.3g.20gb", 1, " ", 1, 28));
    assert_eq!(rows[6], row("3g.20gb", 2, "*", 1, 42));
    assert_eq!(rows.len(), 9);

    // Nothing is destroyed under compute instances, nor MIG turned off under instances.
    assert_eq!(
        sim.run(&["mig", "-dgi"]),
        (
            format!(
                "Unable to destroy GPU instance ID {low:>2} from GPU  0: In use by another client\n\
                 Failed to destroy GPU instances: In use by another client\n"
            ),
            255
        )
    );
    assert_eq!(
        sim.run(&["-mig", "0"]),
        (
            format!(
                "Unable to disable MIG Mode for GPU {BUS}: In use by another client\nTerminating \
                 early due to previous errors.\n"
            ),
            255
        )
    );
    // Nor a compute instance a process runs in.
    sim.change(|node| node.processes.push(Process { gpu: 0, gpu_instance: Some(low), pid: 77 }));
    assert_eq!(
        sim.run(&["mig", "-dci", "-gi", &low.to_string()]),
        (
            format!(
                "Unable to destroy compute instance ID  0 from GPU  0 GPU instance ID {low:>2}: In \
                 use by another client\nFailed to destroy compute instances: In use by another \
                 client\n"
            ),
            255
        )
    );
    sim.change(|node| node.processes.clear());
    assert_eq!(sim.node().gpus[0].instances.len(), 2);

    // Three 1-slice compute instances where the default one was.
    assert_eq!(
        sim.ok(&["mig", "-dci", "-ci", "0", "-gi", &high.to_string()]),
        format!(
            "Successfully destroyed compute instance ID  0 from GPU  0 GPU instance ID {high:>2}\n"
        )
    );
    let created = sim.ok(&["mig", "-cci", "0,1c.3g.20gb,MIG 1c.3g.20gb", "-gi", &high.to_string()]);
    let ci = |id: u32| {
        format!(
            "Successfully created compute instance ID {id:>2} on GPU  0 GPU instance ID {high:>2} \
             using profile MIG 1c.3g.20gb (ID  0)\n"
        )
    };
    assert_eq!(created, [ci(0), ci(1), ci(2)].concat());
    let cis = |node: &Node| {
        let gi = node.gpus[0].instance(high).unwrap();
        gi.compute_instances.iter().map(|c| (c.start, c.size)).collect::<Vec<_>>()
    };
    assert_eq!(cis(&sim.node()), [(0, 1), (1, 1), (2, 1)]);
    assert_eq!(sim.node().gpus[0].instance(low).unwrap().compute_instances.len(), 1);
    let devices = sim.ok(&["-L"]);
    assert_eq!(devices.lines().count(), 5, "{devices}");

    let destroyed = sim.ok(&["mig", "-dci"]);
    let mut want = vec![(low, 0)];
    want.extend([(high, 0), (high, 1), (high, 2)]);
    want.sort();
    let want: String = want
        .into_iter()
        .map(|(gi, ci)| {
            format!("Successfully destroyed compute instance ID {ci:>2} from GPU  0 GPU instance ID {gi:>2}\n")
        })
        .collect();
    assert_eq!(destroyed, want);
    assert_eq!(sim.run(&["mig", "-lci"]), ("No compute instances found: Not Found\n".into(), 6));
    assert_eq!(
        sim.ok(&["mig", "-dgi"]),
        format!(
            "Successfully destroyed GPU instance ID {low:>2} from GPU  0\nSuccessfully destroyed \
             GPU instance ID {high:>2} from GPU  0\n"
        )
    );
    assert!(sim.node().gpus[0].instances.is_empty());
    assert_eq!(
        sim.ok(&["-mig", "0"]),
        format!(
            "Disabled MIG Mode for GPU {BUS}\n\nWarning: persistence mode is disabled on device \
             {BUS}. See the Known Issues section of the nvidia-smi(1) man page for more \
             information. Run with [--help | -h] switch to get more information on how to enable \
             persistence mode.\nAll done.\n"
        )
    );
    assert_eq!(sim.ok(&["mig", "-lgi"]), "No MIG-enabled devices found.\n");
    assert!(!sim.node().gpus[0].mig_enabled);
}

#[test]
fn an_h100_is_cut_into_seven() {
    let sim = Sim::new("h100-80gb:1");
    // Hopper switches at once; persistence mode is on, so no warning.
    assert_eq!(
        sim.ok(&["-mig", "ENABLED"]),
        format!("Enabled MIG Mode for GPU {BUS}\nAll done.\n")
    );
    let created = sim.ok(&["mig", "-cgi", "19,19,19,19,19,19,19", "-C"]);
    let node = sim.node();
    // Placed as the published H100 output shows: 6, 4, 5, then 0 to 3.
    let starts: Vec<u8> = node.gpus[0].instances.iter().map(|gi| gi.start).collect();
    assert_eq!(starts, [6, 4, 5, 0, 1, 2, 3]);
    let want: String = node.gpus[0]
        .instances
        .iter()
        .map(|gi| {
            format!(
                "Successfully created GPU instance ID {0:>2} on GPU  0 using profile MIG 1g.10gb \
                 (ID 19)\nSuccessfully created compute instance ID  0 on GPU  0 GPU instance ID \
                 {0:>2} using profile MIG 1g.10gb (ID  0)\n",
                gi.id
            )
        })
        .collect();
    assert_eq!(created, want);

    // -lgi by id, -lgip with nothing left free.
    let mut by_id: Vec<_> = node.gpus[0].instances.iter().map(|gi| (gi.id, gi.start)).collect();
    by_id.sort();
    let lgi = sim.ok(&["mig", "-lgi"]);
    let rows: Vec<&str> = lgi.lines().skip(5).step_by(2).collect();
    let want: Vec<String> =
        by_id.iter().map(|&(id, start)| lgi_row(id, "1g.10gb", 19, start, 1)).collect();
    assert_eq!(rows, want);
    let lgip = sim.ok(&["mig", "-lgip"]);
    assert!(lgip.contains("|   0  MIG 1g.10gb         19     0/7        9.75"), "{lgip}");
    assert!(lgip.contains("|   0  MIG 7g.80gb          0     0/1        79.25"), "{lgip}");
    assert_eq!(sim.ok(&["mig", "-lci"]).lines().count(), 6 + 2 * 7);

    // The query log shows each MIG device with its GPU instance's engines and memory.
    let log = log_entries(&sim.ok(&["-q"]));
    let values = |key: &str| -> Vec<String> {
        log.iter().filter(|(p, _)| p.ends_with(key)).filter_map(|(_, v)| v.clone()).collect()
    };
    let ids: Vec<String> = values("MIG Devices/MIG Device/GPU Instance ID");
    let mut placed: Vec<_> = node.gpus[0].instances.iter().map(|gi| (gi.start, gi.id)).collect();
    placed.sort();
    assert_eq!(
        ids,
        placed.iter().map(|(_, id)| id.to_string()).collect::<Vec<_>>(),
        "by placement"
    );
    assert_eq!(values("Shared/Multiprocessor count"), vec!["16"; 7]);
    assert_eq!(values("Shared/JPG count"), vec!["1"; 7]);
    assert_eq!(values("MIG Device/FB Memory Usage/Total"), vec!["9984 MiB"; 7]);
    assert_eq!(values("MIG Mode/Current"), ["Enabled"]);

    // Full: another GPU instance, or a second compute instance, finds no room.
    assert_eq!(
        sim.run(&["mig", "-cgi", "MIG 1g.10gb"]),
        (
            "Unable to create a GPU instance on GPU  0 using profile MIG 1g.10gb: Insufficient \
             Resources\nFailed to create GPU instances: Insufficient Resources\n"
                .into(),
            255
        )
    );
    let gi = by_id[0].0;
    assert_eq!(
        sim.run(&["mig", "-cci", "-gi", &gi.to_string()]),
        (
            format!(
                "Unable to create a compute instance on GPU  0 GPU instance ID {gi:>2} using \
                 profile 0: Insufficient Resources\nFailed to create compute instances: \
                 Insufficient Resources\n"
            ),
            255
        )
    );
    assert_eq!(sim.ok(&["mig", "-dci"]).lines().count(), 7);
    assert_eq!(sim.ok(&["mig", "-dgi"]).lines().count(), 7);
    assert_eq!(sim.ok(&["-mig", "0"]), format!("Disabled MIG Mode for GPU {BUS}\nAll done.\n"));
    assert_eq!(sim.node().gpus[0].instances.len(), 0);
}

#[test]
fn gpu_instances_go_where_the_mig_user_guide_shows() {
    let sim = Sim::new("a100-40gb:1");
    sim.change(|node| node.gpus[0].mig_enabled = true);
    // The guide's "known issue": the 3g.20gb no longer fits after these three.
    let (out, status) = sim.run(&["mig", "-cgi", "19,19,14,9"]);
    assert_eq!(status, 255);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 5, "{out}");
    assert_eq!(
        lines[3..],
        [
            "Unable to create a GPU instance on GPU  0 using profile 9: Insufficient Resources",
            "Failed to create GPU instances: Insufficient Resources"
        ]
    );
    assert_eq!(layout(&sim.node()), [(0, vec![]), (4, vec![]), (6, vec![])]);
    sim.ok(&["mig", "-dgi"]);
    sim.ok(&["mig", "-cgi", "9,19,14,19"]);
    assert_eq!(layout(&sim.node()), [(0, vec![]), (1, vec![]), (2, vec![]), (4, vec![])]);

    // A profile the GPU lacks, and a GPU without MIG.
    assert_eq!(
        sim.run(&["mig", "-cgi", "7g.80gb"]),
        (
            "Unable to create a GPU instance on GPU  0 using profile 7g.80gb: Invalid Argument\n\
             Failed to create GPU instances: Invalid Argument\n"
                .into(),
            2
        )
    );
    let l40s = Sim::new("l40s:1");
    assert_eq!(l40s.run(&["mig", "-cgi", "19"]), ("No MIG-enabled devices found.\n".into(), 6));
    assert_eq!(
        l40s.run(&["-mig", "1"]),
        (
            "Unable to enable MIG Mode for GPU 00000000:1B:00.0: Not Supported\nTerminating \
             early due to previous errors.\n"
                .into(),
            3
        )
    );
}

#[test]
fn a_mig_change_waits_for_the_processes_on_an_a100() {
    let sim = Sim::new("a100-40gb:1");
    sim.change(|node| {
        node.gpus[0].persistence_mode = false;
        node.processes.push(Process { gpu: 0, gpu_instance: None, pid: 4242 });
    });
    let out = sim.ok(&["-i", "0", "-mig", "1"]);
    assert!(out.starts_with(&format!(
        "Warning: MIG mode is in pending enable state for GPU {BUS}:In use"
    )));
    let pending = ["--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader"];
    assert_eq!(sim.ok(&pending), "Disabled, Enabled\n");
    let log = log_entries(&sim.ok(&["-q", "-d", "PIDS"]));
    let processes: Vec<_> = log.iter().filter(|(p, _)| p.contains("/Processes/")).collect();
    let process = |key: &str| processes.iter().find(|(p, _)| p.ends_with(key)).unwrap().1.clone();
    assert_eq!(process("Process ID"), Some("4242".into()));
    assert_eq!(process("GPU instance ID"), Some("N/A".into()));
    assert_eq!(sim.ok(&["--query-gpu=memory.used", "--format=csv,noheader"]), "512 MiB\n");
}
