//! The simulated nvidia-smi against the real one: each answer recorded read-only on a real
//! H100 80GB HBM3 (driver 580.159.04; tests/device/nvidia-tools-readonly.sh made them) is
//! asked of the simulator on an `h100-80gb:1` node that carries the recorded GPU's UUID
//! and PCI bus id, and must be equal line for line, exit status included, apart from the
//! values [`NOT_MODELLED`] names.

mod smi;

use smi::{REAL_BUS, REAL_UUID, Sim, log_entries, recorded, split_exit};

/// Values the simulator answers differently, by `--query-gpu` field or `-q` key, and why.
const NOT_MODELLED: &[(&str, &str)] = &[
    ("serial", "derived from the UUID, as the simulated driver's NVML serial is"),
    ("Serial Number", "derived from the UUID, as the simulated driver's NVML serial is"),
    ("vbios_version", "a simulated GPU has no VBIOS: [N/A]"),
    ("Timestamp", "the time of the run"),
];

fn not_modelled(name: &str) -> bool {
    NOT_MODELLED.iter().any(|(n, _)| *n == name)
}

/// The recorded answer to `args` is the simulator's, exactly.
fn same(sim: &Sim, name: &str, args: &[&str]) {
    assert_eq!(sim.run(args), recorded(name), "{name}: nvidia-smi {}", args.join(" "));
}

#[test]
fn lists_gpus_as_recorded() {
    same(&Sim::recorded_h100(), "L", &["-L"]);
}

#[test]
fn queries_fields_as_recorded() {
    let sim = Sim::recorded_h100();
    same(
        &sim,
        "query-noheader",
        &["--query-gpu=index,name,memory.total,mig.mode.current", "--format=csv,noheader"],
    );
    same(
        &sim,
        "query-nounits",
        &["--query-gpu=index,memory.total,memory.used", "--format=csv,noheader,nounits"],
    );
    same(&sim, "query-unknown", &["--query-gpu=index,no.such.field", "--format=csv"]);
    // Without --format the real tool answered as csv.
    same(&sim, "query-noformat", &["--query-gpu=index"]);

    // Every field the brief names, and two the simulator cannot know.
    let fields = "index,name,uuid,serial,pci.bus_id,pci.device_id,pci.sub_device_id,\
                  driver_version,persistence_mode,compute_mode,mig.mode.current,\
                  mig.mode.pending,memory.total,memory.reserved,memory.used,memory.free,count,\
                  vbios_version,gom.current";
    let (got, status) = sim.run(&[&format!("--query-gpu={fields}"), "--format=csv"]);
    let (want, want_status) = recorded("query-csv");
    assert_eq!(status, want_status);
    let (got_lines, want_lines): (Vec<&str>, Vec<&str>) =
        (got.lines().collect(), want.lines().collect());
    assert_eq!(got_lines.len(), 2, "{got}");
    assert_eq!(got_lines[0], want_lines[0], "the header");
    let header: Vec<&str> = want_lines[0].split(", ").collect();
    let values = |line: &str| line.split(", ").map(str::to_string).collect::<Vec<_>>();
    let (got_values, want_values) = (values(got_lines[1]), values(want_lines[1]));
    assert_eq!(got_values.len(), header.len());
    for ((name, got), want) in header.iter().zip(&got_values).zip(&want_values) {
        if not_modelled(name) {
            continue;
        }
        assert_eq!(got, want, "{name}");
    }
    assert_eq!(got_values[header.iter().position(|h| *h == "vbios_version").unwrap()], "[N/A]");
}

#[test]
fn takes_ids_in_every_form_as_recorded() {
    let sim = Sim::recorded_h100();
    let short = REAL_BUS.strip_prefix("0000").unwrap();
    for (name, id) in [
        ("i-index", "0"),
        ("i-uuid", REAL_UUID),
        ("i-bus", REAL_BUS),
        ("i-short", short),
        ("i-sysfs", &short.to_lowercase()),
        ("i-nodomain", REAL_BUS.strip_prefix("00000000:").unwrap()),
        ("i-missing", "99"),
        ("i-badbus", "0000:ff:00.0"),
        ("i-garbage", "not-a-gpu"),
    ] {
        same(&sim, name, &["-i", id, "--query-gpu=index,pci.bus_id", "--format=csv,noheader"]);
    }
    same(&sim, "L-with-i", &["-L", "-i", "0"]);
    // The recorded bus has no hex letters; the sysfs form mig-parted resets with has.
    let sim = Sim::new("a100-40gb:2");
    let (out, status) =
        sim.run(&["-i", "0000:1c:00.0,1B:00.0", "--query-gpu=index", "--format=csv,noheader"]);
    assert_eq!((out.as_str(), status), ("1\n0\n", 0));
}

/// The simulator's `-q` lines are the recording's lines of the same keys, in its order.
fn query_log_as_recorded(sim: &Sim, name: &str, args: &[&str]) -> Vec<(String, Option<String>)> {
    let (got, status) = sim.run(args);
    let (want, want_status) = recorded(name);
    assert_eq!(status, want_status, "{name}");
    let (got, want) = (log_entries(&got), log_entries(&want));
    let mut from = 0;
    for (path, value) in &got {
        let found = want[from..].iter().position(|(p, _)| p == path);
        let Some(offset) = found else {
            panic!("{name}: {path:?} is not in the recording after line {from}")
        };
        let (_, want_value) = &want[from + offset];
        let key = path.rsplit('/').next().unwrap();
        if !not_modelled(key) {
            assert_eq!(value, want_value, "{name}: {path}");
        }
        from += offset + 1;
    }
    got
}

#[test]
fn prints_the_query_log_as_recorded() {
    let sim = Sim::recorded_h100();
    let log = query_log_as_recorded(&sim, "q", &["-q"]);
    let paths: Vec<&str> = log.iter().map(|(p, _)| p.as_str()).collect();
    let gpu = format!("GPU {REAL_BUS}");
    for key in [
        "Timestamp",
        "Driver Version",
        "CUDA Version",
        "Attached GPUs",
        "Product Name",
        "Product Brand",
        "Product Architecture",
        "Persistence Mode",
        "MIG Mode/Current",
        "MIG Mode/Pending",
        "Serial Number",
        "GPU UUID",
        "Minor Number",
        "Board ID",
        "PCI/Bus",
        "PCI/Device",
        "PCI/Domain",
        "PCI/Device Id",
        "PCI/Bus Id",
        "PCI/Sub System Id",
        "FB Memory Usage/Total",
        "FB Memory Usage/Reserved",
        "FB Memory Usage/Used",
        "FB Memory Usage/Free",
        "Compute Mode",
        "GPU Recovery Action",
        "ECC Mode/Current",
        "ECC Errors/Volatile/DRAM Correctable",
        "ECC Errors/Aggregate/DRAM Uncorrectable",
        "Retired Pages/Single Bit ECC",
        "Remapped Rows/Uncorrectable Error",
        "Remapped Rows/Pending",
        "Remapped Rows/Remapping Failure Occurred",
        "Remapped Rows/Bank Remap Availability Histogram/Max",
        "Processes",
    ] {
        let under_gpu = format!("{gpu}/{key}");
        assert!(paths.contains(&key) || paths.contains(&under_gpu.as_str()), "{key} printed");
    }
    query_log_as_recorded(&sim, "q-i0", &["-q", "-i", "0"]);
    let memory = query_log_as_recorded(&sim, "q-i-uuid", &["-q", "-i", REAL_UUID, "-d", "MEMORY"]);
    assert!(memory.iter().all(|(p, _)| !p.contains("Product Name")), "-d MEMORY only");
}

#[test]
fn lists_mig_profiles_and_instances_as_recorded() {
    let sim = Sim::recorded_h100();
    same(&sim, "lgip", &["mig", "-lgip"]);
    same(&sim, "lgip-i", &["mig", "-i", "0", "-lgip"]);
    same(&sim, "lgipp", &["mig", "-lgipp"]);
    // MIG is off on the recorded GPU.
    same(&sim, "lgi", &["mig", "-lgi"]);
    same(&sim, "lci", &["mig", "-lci"]);
    same(&sim, "lcip", &["mig", "-lcip"]);
}

#[test]
fn lists_compute_policies_as_recorded() {
    same(&Sim::recorded_h100(), "compute-policy-l", &["compute-policy", "-l"]);
}

#[test]
fn refuses_options_as_recorded() {
    let sim = Sim::recorded_h100();
    same(&sim, "unknown-option", &["--no-such-option"]);
    // missing-values.txt: blocks of `== nvidia-smi ARGS (no value)`, the output, `exit N`.
    let text = std::fs::read_to_string(format!("{}/missing-values.txt", smi::RECORDED)).unwrap();
    let blocks: Vec<&str> = text.split("== nvidia-smi ").filter(|b| !b.is_empty()).collect();
    assert_eq!(blocks.len(), 4);
    for block in blocks {
        let (title, rest) = block.split_once('\n').unwrap();
        let args: Vec<&str> = title.strip_suffix(" (no value)").unwrap().split(' ').collect();
        let (want, want_status) = split_exit(rest);
        let (got, status) = sim.run(&args);
        assert_eq!(status, want_status, "{args:?}");
        if args == ["mig"] {
            // The recording holds the help's first lines; ours goes on with the options.
            assert!(got.starts_with(&want), "{args:?}: {got}");
        } else {
            assert_eq!(got, want, "{args:?}");
        }
    }
}
