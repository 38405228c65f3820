//! `gpushare-ctl mig profiles`: the MIG profiles of the simulated driver's H100s through
//! the agent, against the catalog's figures (those of the real H100) and against what the
//! simulated `nvidia-smi mig -lgip`/`-lgipp` print from the same driver; bad GPU arguments
//! are one line.

use std::collections::HashMap;

use gpushare_proto::types::{MigProfileInfo, MigProfiles};
use gpushare_tests::{Agent, AgentOptions, ctl_error, reason_lines, stderr, stdout, text};

/// catalog/models/h100-80gb.toml, as read off the real H100: name, id, enum, max count,
/// MiB, SMs, compute slices, memory slices, CE/DEC/ENC/JPEG/OFA, placements.
type Row = (&'static str, u32, u32, u32, u64, u32, u32, u32, [u32; 5], &'static [u32]);
const H100: [Row; 7] = [
    ("1g.10gb", 19, 0, 7, 9984, 16, 1, 1, [1, 1, 0, 1, 0], &[0, 1, 2, 3, 4, 5, 6]),
    ("1g.10gb+me", 20, 7, 1, 9984, 16, 1, 1, [1, 1, 0, 1, 1], &[0, 1, 2, 3, 4, 5, 6]),
    ("1g.20gb", 15, 9, 4, 20096, 26, 1, 2, [1, 1, 0, 1, 0], &[0, 2, 4, 6]),
    ("2g.20gb", 14, 1, 3, 20096, 32, 2, 2, [2, 2, 0, 2, 0], &[0, 2, 4]),
    ("3g.40gb", 9, 2, 2, 40448, 60, 3, 4, [3, 3, 0, 3, 0], &[0, 4]),
    ("4g.40gb", 5, 3, 1, 40448, 64, 4, 4, [4, 4, 0, 4, 0], &[0]),
    ("7g.80gb", 0, 4, 1, 81152, 132, 7, 8, [8, 7, 0, 7, 1], &[0]),
];

fn engines(p: &MigProfileInfo) -> [u32; 5] {
    let e = p.engines;
    [e.copy, e.decoders, e.encoders, e.jpeg, e.ofa]
}

#[test]
fn the_h100_profiles_as_the_driver_reports_them() {
    let agent = Agent::start(AgentOptions::simulate("h100-80gb:2"));
    let doc: MigProfiles = agent.ctl_doc(&["mig", "profiles", "0"]);
    assert_eq!(doc.gpus.len(), 1);
    let gpu = &doc.gpus[0];
    let status = agent.status();
    assert_eq!((gpu.index, &gpu.uuid), (0, &status.gpus[0].uuid));
    assert_eq!(gpu.model, status.gpus[0].model);
    // The table is the (simulated) driver's, read through NVML, and agrees with the catalog.
    assert!(gpu.from_driver, "{gpu:?}");
    assert!(gpu.source.starts_with("read from the driver (") && gpu.source.ends_with("NVML"));
    let catalog = gpu.catalog.as_ref().expect("the H100 is in the catalog");
    assert_eq!(catalog.key, "h100-80gb");
    assert!(catalog.differences.is_empty(), "{catalog:?}");
    assert_eq!((gpu.memory_slots, gpu.compute_slices, gpu.mig_enabled), (8, 7, false));
    assert_eq!(gpu.profiles.len(), 7, "{gpu:?}");
    for (p, row) in gpu.profiles.iter().zip(H100) {
        let (name, id, nvml_enum, max, mib, sms, slices, size, engine_counts, starts) = row;
        assert_eq!(
            (p.name.as_str(), p.id, p.nvml_enum, p.instances_total, p.memory_mib, p.sms),
            (name, id, nvml_enum, max, mib, sms),
            "{p:?}"
        );
        assert_eq!((p.compute_slices, p.memory_slices, engines(p)), (slices, size, engine_counts));
        assert_eq!(p.placements, starts, "{name}");
        // MIG is off: no free count.
        assert_eq!(p.instances_free, None, "{name}");
        // Every profile takes its exact name; the slice key `1g` is 1g.10gb's alone.
        assert_eq!(p.accepts.first().map(String::as_str), Some(name), "{p:?}");
        assert_eq!(p.accepts.iter().any(|a| a == "1g"), name == "1g.10gb", "{p:?}");
    }
    // Every MIG GPU without an argument; by UUID too.
    let all: MigProfiles = agent.ctl_doc(&["mig", "profiles"]);
    assert_eq!(all.gpus.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 1]);
    let by_uuid: MigProfiles = agent.ctl_doc(&["mig", "profiles", &status.gpus[1].uuid]);
    assert_eq!(by_uuid.gpus, all.gpus[1..]);

    // For people: nvidia-smi's columns, placements as -lgipp writes them, the names.
    let out = agent.ctl(&["mig", "profiles", "0"]);
    assert!(out.status.success(), "{}", text(&out));
    let printed = stdout(&out);
    let lines: Vec<&str> = printed.lines().collect();
    assert!(
        lines[0].starts_with("GPU 0: H100-80GB-HBM3, MIG off; profiles read from the driver (")
            && lines[0].ends_with("agrees with the catalog (h100-80gb)"),
        "{printed}"
    );
    let header: Vec<&str> = lines[1].split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
    assert_eq!(
        header,
        [
            "NAME",
            "ID",
            "FREE/TOTAL",
            "MEMORY GiB",
            "SM",
            "DEC",
            "ENC",
            "CE",
            "JPEG",
            "OFA",
            "PLACEMENTS",
            "COMPUTE INSTANCES",
            "ACCEPTS"
        ],
        "{printed}"
    );
    let row: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(
        row,
        [
            "1g.10gb",
            "19",
            "-/7",
            "9.75",
            "16",
            "1",
            "0",
            "1",
            "1",
            "0",
            "{0,1,2,3,4,5,6}:1",
            "1x1c",
            "1g.10gb,",
            "1g"
        ],
        "{printed}"
    );
    assert!(printed.contains("19.62") && printed.contains("{0,2,4,6}:2"), "{printed}");
    assert_eq!(lines.len(), 9, "{printed}");
}

/// `(gpu, name, id, free/total, GiB, SM, DEC, ENC, CE, JPEG, OFA)` rows of `nvidia-smi mig
/// -lgip`: a profile's line, then its engines' line.
fn lgip_rows(text: &str) -> Vec<Vec<String>> {
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.trim_matches('|').split_whitespace().collect::<Vec<&str>>())
        .collect();
    let mut rows = Vec::new();
    for (i, words) in lines.iter().enumerate() {
        if words.get(1) != Some(&"MIG") {
            continue;
        }
        let mut row: Vec<String> =
            words.iter().filter(|w| **w != "MIG" && **w != "No").map(|w| w.to_string()).collect();
        row.extend(lines[i + 1].iter().map(|w| w.to_string()));
        rows.push(row);
    }
    rows
}

#[test]
fn free_counts_and_placements_match_nvidia_smi_on_the_same_driver() {
    let layout = "[[gpu]]\nselect = 0\nmig = { \"3g\" = 1, \"1g.20gb\" = 1 }\n";
    let agent = Agent::start(AgentOptions::simulate("h100-80gb:2").profile("some.toml", layout));
    let out = agent.ctl(&["apply", "some"]);
    assert!(out.status.success(), "{}", text(&out));
    let doc: MigProfiles = agent.ctl_doc(&["mig", "profiles", "0"]);
    let gpu = &doc.gpus[0];
    assert!(gpu.mig_enabled);
    let ours: Vec<Vec<String>> = gpu
        .profiles
        .iter()
        .map(|p| {
            let free = p.instances_free.expect("MIG is on: the free count is known");
            let e = p.engines;
            [
                "0".to_owned(),
                p.name.clone(),
                p.id.to_string(),
                format!("{free}/{}", p.instances_total),
                format!("{:.2}", p.memory_mib as f64 / 1024.0),
                p.sms.to_string(),
            ]
            .into_iter()
            .chain([e.decoders, e.encoders, e.copy, e.jpeg, e.ofa].map(|n| n.to_string()))
            .collect()
        })
        .collect();
    let smi = agent.nvidia_smi(&["mig", "-i", "0", "-lgip"]);
    assert!(smi.status.success(), "{}", text(&smi));
    assert_eq!(ours, lgip_rows(&stdout(&smi)), "{}", stdout(&smi));
    // Some profile still fits and some no longer does: the counts say something.
    assert!(gpu.profiles.iter().any(|p| p.instances_free.is_some_and(|f| f > 0)), "{gpu:?}");
    assert!(gpu.profiles.iter().any(|p| p.instances_free == Some(0)), "{gpu:?}");

    let placements: HashMap<u32, String> = gpu
        .profiles
        .iter()
        .map(|p| {
            let starts: Vec<String> = p.placements.iter().map(u32::to_string).collect();
            (p.id, format!("{{{}}}:{}", starts.join(","), p.memory_slices))
        })
        .collect();
    let smi = agent.nvidia_smi(&["mig", "-i", "0", "-lgipp"]);
    let listed = stdout(&smi);
    let mut seen = 0;
    for line in listed.lines() {
        // GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1
        let words: Vec<&str> = line.split_whitespace().collect();
        let id: u32 = words[4].parse().unwrap_or_else(|_| panic!("{listed}"));
        assert_eq!(placements.get(&id), words.last().map(|w| w.to_string()).as_ref(), "{line}");
        seen += 1;
    }
    assert_eq!(seen, 7, "{listed}");
}

#[test]
fn bad_gpus_are_refused_in_one_line_naming_the_ones_with_mig() {
    let agent = Agent::start(AgentOptions::simulate("h100-80gb:2"));
    let out = agent.ctl(&["mig", "profiles", "9"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    assert_eq!(reason_lines(&err), 1, "{err}");
    assert!(
        err.contains("GPU \"9\": this node has no such GPU; the GPUs with MIG are 0-1"),
        "{err}"
    );
    let error = ctl_error(&agent.ctl(&["mig", "profiles", "GPU-nope", "--json"]));
    assert_eq!(error.name, "io.gpushare.Agent1.Error.Failed");
    assert!(error.message.starts_with("GPU \"GPU-nope\": this node has no such GPU"), "{error:?}");
    // A usage error names the sub-verbs.
    let out = agent.ctl(&["mig"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(stderr(&out).contains("a sub-verb is required: profiles"), "{}", text(&out));

    let agent = Agent::start(AgentOptions::simulate("l40s:1"));
    for args in [&["mig", "profiles", "0"][..], &["mig", "profiles"]] {
        let out = agent.ctl(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
        let err = stderr(&out);
        assert_eq!(reason_lines(&err), 1, "{err}");
        assert!(err.contains("no GPU of this node has MIG"), "{err}");
        assert!(stdout(&out).is_empty(), "{}", text(&out));
    }
    assert!(stderr(&agent.ctl(&["mig", "profiles", "0"])).contains("GPU 0 (L40S) has no MIG"));
}
