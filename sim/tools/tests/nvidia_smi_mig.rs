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
    sim.change(|node| node.processes.push(Process::new(0, Some(low), 77)));
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
        node.processes.push(Process::new(0, None, 4242));
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

#[test]
fn an_rtx_pro_6000_lists_and_cuts_as_published() {
    // Against the -lgip, -lgipp, -cgi, -lgi and -lci that kubesimplify published for an
    // RTX PRO 6000 Blackwell Server Edition (driver 610.43.02; catalog/listings.md, KS).
    let sim = Sim::new("rtx-pro-6000-bse:1");
    assert_eq!(sim.ok(&["-mig", "1"]), format!("Enabled MIG Mode for GPU {BUS}\nAll done.\n"));
    let lgip = sim.ok(&["mig", "-i", "0", "-lgip"]);
    let lines: Vec<&str> = lgip.lines().collect();
    assert_eq!(lines.len(), 5 + 3 * 11, "{lgip}");
    for (at, want) in [
        (5, "|   0  MIG 1g.24gb         14     4/4        23.62      No     46     1     1   |"),
        (6, "|                                                               1     1     0   |"),
        (14, "|   0  MIG 1g.24gb+me.all  65     1/1        23.62      No     46     4     4   |"),
        (15, "|                                                               1     4     1   |"),
        (17, "|   0  MIG 1g.24gb-me      67     4/4        23.62      No     46     0     0   |"),
        (23, "|   0  MIG 2g.48gb+gfx     35     2/2        47.38      No     94     2     2   |"),
        (35, "|   0  MIG 4g.96gb+gfx     32     1/1        95.12      No     188    4     4   |"),
        (36, "|                                                               4     4     1   |"),
    ] {
        assert_eq!(lines[at], want, "line {at}");
    }
    let lgipp = sim.ok(&["mig", "-i", "0", "-lgipp"]);
    let want: String = [
        (14, "s: {0,3,6,9}:3"),
        (21, "s: {0,3,6,9}:3"),
        (47, "s: {0,3,6,9}:3"),
        (65, "s: {0,3,6,9}:3"),
        (67, "s: {0,3,6,9}:3"),
        (5, "s: {0,6}:6"),
        (35, "s: {0,6}:6"),
        (64, "s: {0,6}:6"),
        (66, "s: {0,6}:6"),
        (0, " : {0}:12"),
        (32, " : {0}:12"),
    ]
    .iter()
    .map(|(id, rest)| format!("GPU  0 Profile ID {id:>2} Placement{rest}\n"))
    .collect();
    assert_eq!(lgipp, want);

    // Four 1g.24gb with their compute instances: GI 3 to 6, at 0, 3, 6, 9.
    let created = sim.ok(&["mig", "-i", "0", "-cgi", "1g.24gb,1g.24gb,1g.24gb,1g.24gb", "-C"]);
    let want: String = (3..=6)
        .map(|gi| {
            format!(
                "Successfully created GPU instance ID {gi:>2} on GPU  0 using profile MIG 1g.24gb \
                 (ID 14)\nSuccessfully created compute instance ID  0 on GPU  0 GPU instance ID \
                 {gi:>2} using profile MIG 1g.24gb (ID  0)\n"
            )
        })
        .collect();
    assert_eq!(created, want);
    let rows: Vec<String> =
        sim.ok(&["mig", "-lgi"]).lines().skip(5).step_by(2).map(String::from).collect();
    let want: Vec<String> =
        [(3, 0), (4, 3), (5, 6), (6, 9)].map(|(gi, s)| lgi_row(gi, "1g.24gb", 14, s, 3)).to_vec();
    assert_eq!(rows, want);
    let lci = sim.ok(&["mig", "-lci"]);
    assert_eq!(
        lci.lines().nth(6).unwrap(),
        "|   0      3       MIG 1g.24gb          0         0          0:1     |"
    );
    assert_eq!(lci.lines().count(), 6 + 2 * 4);
    assert!(sim.ok(&["mig", "-lgip"]).contains("|   0  MIG 1g.24gb         14     0/4"));

    // Torn down, then one 2g and two 1g: GI 1 at 0:6, GI 5 and 6 at 6:3 and 9:3, listed
    // 1g first as the real tool does.
    assert_eq!(sim.ok(&["mig", "-dci"]).lines().count(), 4);
    assert_eq!(sim.ok(&["mig", "-dgi"]).lines().count(), 4);
    let created = sim.ok(&["mig", "-cgi", "2g.48gb,1g.24gb,1g.24gb", "-C"]);
    assert!(created.starts_with(
        "Successfully created GPU instance ID  1 on GPU  0 using profile MIG 2g.48gb (ID  5)\n\
         Successfully created compute instance ID  0 on GPU  0 GPU instance ID  1 using profile \
         MIG 2g.48gb (ID  1)\n"
    ));
    let rows: Vec<String> =
        sim.ok(&["mig", "-lgi"]).lines().skip(5).step_by(2).map(String::from).collect();
    assert_eq!(
        rows,
        [
            lgi_row(5, "1g.24gb", 14, 6, 3),
            lgi_row(6, "1g.24gb", 14, 9, 3),
            lgi_row(1, "2g.48gb", 5, 0, 6)
        ]
    );
    // Inside the 2g: two 1-slice compute instances where its default one was.
    sim.ok(&["mig", "-dci", "-gi", "1"]);
    let created = sim.ok(&["mig", "-cci", "1c.2g.48gb,0", "-gi", "1"]);
    assert_eq!(created.lines().count(), 2, "{created}");
    assert_eq!(layout(&sim.node())[0], (0, vec![(0, 1), (1, 1)]));
    assert_eq!(sim.ok(&["-L"]).matches("MIG 1c.2g.48gb").count(), 2);
}

#[test]
fn an_rtx_pro_6000s_variants_share_its_media_engines() {
    let sim = Sim::new("rtx-pro-6000:1");
    sim.change(|node| node.gpus[0].mig_enabled = true);
    // +me.all takes all four decoders and encoders: no plain 1g.24gb beside it, -me ones
    // (none) fit.
    let made = sim.ok(&["mig", "-cgi", "1g.24gb+me.all", "-C"]);
    assert!(made.starts_with(
        "Successfully created GPU instance ID  3 on GPU  0 using profile MIG 1g.24gb+me.all (ID 65)"
    ));
    let lgip = sim.ok(&["mig", "-lgip"]);
    assert!(lgip.contains("|   0  MIG 1g.24gb         14     0/4"), "{lgip}");
    assert!(lgip.contains("|   0  MIG 1g.24gb-me      67     3/4"), "{lgip}");
    assert_eq!(
        sim.run(&["mig", "-cgi", "14"]),
        (
            "Unable to create a GPU instance on GPU  0 using profile 14: Insufficient Resources\n\
             Failed to create GPU instances: Insufficient Resources\n"
                .into(),
            255
        )
    );
    sim.ok(&["mig", "-cgi", "1g.24gb-me,MIG 1g.24gb-me,67", "-C"]);
    assert_eq!(sim.node().gpus[0].instances.len(), 4);
    sim.ok(&["mig", "-dci"]);
    sim.ok(&["mig", "-dgi"]);
    // The whole card with graphics, cut into compute instances by name.
    sim.ok(&["mig", "-cgi", "4g.96gb+gfx"]);
    let lcip = sim.ok(&["mig", "-lcip"]);
    let names: Vec<&str> =
        lcip.lines().skip(6).step_by(3).map(|l| l.split_whitespace().nth(4).unwrap()).collect();
    assert_eq!(names, ["1c.4g.96gb+gfx", "2c.4g.96gb+gfx", "4g.96gb+gfx"], "{lcip}");
    sim.ok(&["mig", "-cci", "2c.4g.96gb+gfx,1c.4g.96gb+gfx,0"]);
    assert_eq!(layout(&sim.node()), [(0, vec![(0, 2), (2, 1), (3, 1)])]);
}

#[test]
fn every_simulated_model_takes_its_profiles_through_nvidia_smi() {
    for model in gpushare_catalog::simulated_models().iter().filter(|m| m.supports_mig()) {
        let sim = Sim::new(&format!("{}:1", model.key));
        sim.change(|node| node.gpus[0].mig_enabled = true);
        let lgipp = sim.ok(&["mig", "-lgipp"]);
        assert_eq!(lgipp.lines().count(), model.mig_profiles.len(), "{}", model.key);
        let lgip = sim.ok(&["mig", "-lgip"]);
        for p in &model.mig_profiles {
            let row =
                format!("|   0  MIG {:<14}{:>4}{:>6}/{}", p.name, p.id, p.max_count, p.max_count);
            assert!(lgip.contains(&row), "{}: {row}\n{lgip}", model.key);
        }
        // Each profile alone by name, with its default compute instance, and back.
        for p in &model.mig_profiles {
            let made = sim.ok(&["mig", "-cgi", &p.name, "-C"]);
            assert!(made.contains(&format!("using profile MIG {} (ID {:>2})", p.name, p.id)));
            sim.ok(&["mig", "-dci"]);
            sim.ok(&["mig", "-dgi"]);
        }
        // NVIDIA's balanced layout, largest first, by slice count's plain profile.
        let slices: &[u8] = match model.compute_slices {
            7 => &[3, 2, 1, 1],
            4 => &[2, 1, 1],
            _ => &[1, 1],
        };
        let names: Vec<&str> = slices
            .iter()
            .map(|&c| model.profile_by_compute_slices(c).unwrap().name.as_str())
            .collect();
        let made = sim.ok(&["mig", "-cgi", &names.join(","), "-C"]);
        assert_eq!(made.lines().count(), 2 * names.len(), "{}: {made}", model.key);
        assert_eq!(sim.ok(&["-L"]).matches("MIG ").count(), names.len(), "{}", model.key);
    }
}
