//! `nvidia-smi` without a command: the summary table, compared with the real one recorded
//! on an H200 (driver 580.159.04, tests/device/results/clients-h200-2026-11-27/smi.txt),
//! and its MIG devices box and empty Processes box.

mod smi;

use std::os::unix::process::CommandExt;
use std::process::{Child, Command};

use gpushare_sim_nvml::node::{ComputeMode, Process};
use smi::Sim;

/// The recording: the summary, then the outputs of other commands.
const RECORDED: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/device/results/clients-h200-2026-11-27/smi.txt"
));

/// The summary's lines in the recording (its first 22).
fn recorded_summary() -> Vec<&'static str> {
    RECORDED.lines().take(22).collect()
}

/// A process running `sleep` under the argv[0] `name`, as the real MPS server and the
/// clients ran (nvidia-smi shows argv[0]); killed when dropped.
struct Named(Child);

impl Named {
    fn spawn(name: &str) -> Named {
        Named(Command::new("sleep").arg0(name).arg("300").spawn().unwrap())
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Named {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The date line: `Fri Nov 27 09:24:30 2026` and seven spaces, as recorded.
fn assert_date_line(line: &str) {
    assert_eq!(line.len(), 31, "{line:?}");
    assert!(line.ends_with("       ") && !line.ends_with("        "), "{line:?}");
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields.len(), 5, "{line:?}");
    assert_eq!(fields[3].len(), 8, "{line:?}");
    assert_eq!(fields[3].matches(':').count(), 2, "{line:?}");
}

/// The recorded H200's facts: one H200 at the recorded PCI address, MIG off, persistence
/// mode on, an MPS server (2676, 66 MiB), an MPS client (3608, 2370 MiB, `M+C`) and a
/// direct client (3609, 3682 MiB) with the recorded names. Every line is compared with the
/// recording except:
/// - the date (the time of the run; its format is checked);
/// - the PIDs (the test's own processes under the recorded names; same column);
/// - four values the simulator does not model as the real GPU had them, which take the
///   simulated driver's readings in the same columns: temperature 44C (recorded 47C),
///   power draw 223W (98W) and GPU-Util 90% (0%), the simulated NVML's figures for three
///   processes (35 °C, 73.6 W, 0 % idle; 3 °C, 50 W, 30 % each), and memory used 6118MiB,
///   the processes' memory (recorded 6134MiB: 16 MiB the driver used beside them, which
///   the simulator does not model).
#[test]
fn the_summary_reproduces_the_recorded_h200() {
    let sim = Sim::new("h200-141gb:1");
    let server = Named::spawn("nvidia-cuda-mps-server");
    let client = Named::spawn("python3");
    let direct = Named::spawn("python3");
    sim.change(|node| {
        node.gpus[0].pci_bus_id = smi::REAL_BUS.to_string();
        node.processes = vec![
            Process { memory: 69_206_016, ..Process::new(0, None, server.pid()) },
            Process { memory: 2_485_125_120, mps: true, ..Process::new(0, None, client.pid()) },
            Process { memory: 3_860_856_832, ..Process::new(0, None, direct.pid()) },
        ];
    });
    let out = sim.ok(&[]);
    let lines: Vec<&str> = out.lines().collect();
    let recorded = recorded_summary();
    assert_eq!(lines.len(), recorded.len(), "{out}");
    assert_date_line(lines[0]);

    let mut expected: Vec<String> = recorded.iter().map(|l| l.to_string()).collect();
    expected[9] = expected[9]
        .replacen("   47C", &format!("{:>5}C", 44), 1)
        .replacen("             98W", &format!("{:>16}", "223W"), 1)
        .replacen("    6134MiB", &format!("{:>11}", "6118MiB"), 1)
        .replacen("      0%", &format!("{:>8}", "90%"), 1);
    for (line, pid) in [(18, server.pid()), (19, client.pid()), (20, direct.pid())] {
        // The PID column: right-aligned, ending at column 33.
        expected[line].replace_range(17..33, &format!("{pid:>16}"));
    }
    for (n, (got, want)) in lines.iter().zip(&expected).enumerate().skip(1) {
        assert_eq!(got, want, "line {n} of\n{out}");
    }
}

/// An idle H100 80GB HBM3 (the recorded one's PCI address): the idle readings the real
/// H100 gave NVML (35 °C, 73.6 W, 0 %), no memory used, and the Processes box as the real
/// tool prints it without processes (driver 580.126.09's published output).
#[test]
fn without_processes_the_box_says_so() {
    let sim = Sim::recorded_h100();
    let out = sim.ok(&[]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[8..],
        [
            "|   0  NVIDIA H100 80GB HBM3          On  |   00000000:00:06.0 Off |                    0 |",
            "| N/A   35C    P0             73W /  700W |       0MiB /  81559MiB |      0%      Default |",
            "|                                         |                        |             Disabled |",
            "+-----------------------------------------+------------------------+----------------------+",
            "",
            "+-----------------------------------------------------------------------------------------+",
            "| Processes:                                                                              |",
            "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
            "|        ID   ID                                                               Usage      |",
            "|=========================================================================================|",
            "|  No running processes found                                                             |",
            "+-----------------------------------------------------------------------------------------+",
        ],
        "{out}"
    );
    // The header box as recorded on the H200 (same driver).
    assert_eq!(lines[1..8], recorded_summary()[1..8]);
    // `-i` alone chooses the GPUs the summary shows.
    assert_eq!(sim.ok(&["-i", "0"]).lines().skip(1).collect::<Vec<_>>(), lines[1..]);
    assert_eq!(sim.run(&["-i", "1"]), ("No devices were found\n".into(), 6));
}

/// An H100 with MIG on (a 3g.40gb with a process in it and a 1g.10gb, each with its
/// default compute instance) beside an A100 whose MIG mode waits for a reset (persistence
/// mode on): `On` as ECC and `N/A` as GPU-Util of the MIG GPU, `Enabled*` as the pending
/// mode, the MIG devices box (driver 580's layout from published transcripts; BAR1 and ECC
/// errors not modelled) and the process's GPU and compute instance ids. The A100's long
/// exclusive-process compute mode is abbreviated as the real tool does.
#[test]
fn mig_devices_and_their_processes() {
    let sim = Sim::new("h100-80gb:1,a100-40gb:1");
    assert_eq!(sim.run(&["-mig", "1", "-i", "0"]).1, 0);
    assert_eq!(sim.run(&["-mig", "1", "-i", "1"]).1, 0);
    assert_eq!(sim.run(&["mig", "-i", "0", "-cgi", "3g.40gb,1g.10gb", "-C"]).1, 0);
    let gi = sim.node().gpus[0].instances.iter().find(|gi| gi.profile_id == 9).unwrap().id;
    sim.change(|node| {
        node.gpus[1].compute_mode = ComputeMode::ExclusiveProcess;
        node.processes = vec![
            Process { memory: 3 << 30, ..Process::new(0, Some(gi), 4_000_001) },
            Process { memory: 1 << 30, ..Process::new(1, None, 4_000_002) },
        ];
    });
    let node = sim.node();
    assert!(node.gpus[0].mig_enabled && !node.gpus[1].mig_enabled);
    let devices = gpushare_sim_nvml::rules::mig_devices(&node.gpus[0]);
    assert_eq!(devices.len(), 2);
    let out = sim.ok(&[]);
    let lines: Vec<&str> = out.lines().collect();
    let (bus0, bus1) = (&node.gpus[0].pci_bus_id, &node.gpus[1].pci_bus_id);
    let a = |s: &str| s.to_string();
    let mut expected = vec![
        format!(
            "|   0  NVIDIA H100 80GB HBM3          On  |   {bus0} Off |                   On |"
        ),
        a(
            "| N/A   38C    P0            123W /  700W |    3072MiB /  81559MiB |     N/A      Default |",
        ),
        a(
            "|                                         |                        |              Enabled |",
        ),
        a(
            "+-----------------------------------------+------------------------+----------------------+",
        ),
        format!(
            "|   1  NVIDIA A100-SXM4-40GB          On  |   {bus1} Off |                    0 |"
        ),
        a(
            "| N/A   38C    P0            123W /  400W |    1024MiB /  40960MiB |     30%   E. Process |",
        ),
        a(
            "|                                         |                        |             Enabled* |",
        ),
        a(
            "+-----------------------------------------+------------------------+----------------------+",
        ),
        a(""),
        a(
            "+-----------------------------------------------------------------------------------------+",
        ),
        a(
            "| MIG devices:                                                                            |",
        ),
        a(
            "+------------------+----------------------------------+-----------+-----------------------+",
        ),
        a(
            "| GPU  GI  CI  MIG |              Shared Memory-Usage |        Vol|        Shared         |",
        ),
        a(
            "|      ID  ID  Dev |                Shared BAR1-Usage | SM     Unc| CE ENC  DEC  OFA  JPG |",
        ),
        a(
            "|                  |                                  |        ECC|                       |",
        ),
        a(
            "|==================+==================================+===========+=======================|",
        ),
    ];
    // NVML's device order: by placement; each device's memory is its GPU instance's.
    let g = &node.gpus[0];
    for (index, (gi_id, ci_id, _)) in devices.iter().enumerate() {
        let instance = g.instance(*gi_id).unwrap();
        let profile = gpushare_sim_nvml::rules::profile_of(g, instance);
        let used = if *gi_id == gi { 3072 } else { 0 };
        let e = profile.engines;
        expected.push(format!(
            "|  0{gi_id:>5}{ci_id:>4}{index:>4}  |{:<34}| {:<3}     0 |{:>3}{:>4}{:>5}{:>5}{:>5} |",
            format!("{used:>16}MiB / {:>5}MiB", profile.memory_mib),
            profile.sms,
            e.copy,
            e.encoders,
            e.decoders,
            e.ofa,
            e.jpeg
        ));
        expected.push(a(
            "|                  |                N/A /      N/A    |           |                       |",
        ));
        expected.push(a(
            "+------------------+----------------------------------+-----------+-----------------------+",
        ));
    }
    expected.extend([
        a(""),
        a("+-----------------------------------------------------------------------------------------+"),
        a("| Processes:                                                                              |"),
        a("|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |"),
        a("|        ID   ID                                                               Usage      |"),
        a("|=========================================================================================|"),
        format!(
            "|    0{gi:>5}    0          4000001      C   [Not Found]                            3072MiB |"
        ),
        a("|    1   N/A  N/A         4000002      C   [Not Found]                            1024MiB |"),
        a("+-----------------------------------------------------------------------------------------+"),
    ]);
    assert_eq!(lines[8..], expected, "{out}");
    // Every line is as wide as the recorded ones.
    assert!(lines[1..].iter().all(|l| l.is_empty() || l.chars().count() == 91), "{out}");

    // Only the A100: no MIG devices box (its MIG mode is only pending).
    let only_a100 = sim.ok(&["-i", "1"]);
    assert!(!only_a100.contains("MIG devices"), "{only_a100}");
    assert!(only_a100.contains("4000002") && !only_a100.contains("4000001"), "{only_a100}");

    // MIG on without any MIG device.
    sim.change(|node| {
        node.processes.clear();
        node.gpus[0].instances.clear();
    });
    let out = sim.ok(&["-i", "0"]);
    let lines: Vec<&str> = out.lines().collect();
    let box_end = lines.iter().position(|l| l.starts_with("|==================+")).unwrap();
    assert_eq!(
        lines[box_end + 1..box_end + 3],
        [
            "|  No MIG devices found                                                                   |",
            "+-----------------------------------------------------------------------------------------+",
        ],
        "{out}"
    );
}
