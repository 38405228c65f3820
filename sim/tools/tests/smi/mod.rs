//! Running the built simulated nvidia-smi on a node of its own, and reading the answers
//! the real one gave (tests/device/results/nvidia-tools-2026-11-27/nvidia-smi).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpushare_catalog::parse_node_spec;
use gpushare_sim_nvml::node::Node;
use gpushare_sim_nvml::state_file::NodeFile;

/// Where the real tool's answers were recorded.
pub const RECORDED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/device/results/nvidia-tools-2026-11-27/nvidia-smi"
);

/// The recorded H100's UUID and PCI bus id.
pub const REAL_UUID: &str = "GPU-a07016e4-0981-b597-73d0-662e32dc7b13";
pub const REAL_BUS: &str = "00000000:00:06.0";

/// A simulated node in a temporary directory.
pub struct Sim {
    dir: tempfile::TempDir,
}

impl Sim {
    /// A fresh node of `spec`'s GPUs.
    pub fn new(spec: &str) -> Sim {
        let sim = Sim { dir: tempfile::tempdir().unwrap() };
        let file = sim.file();
        file.write(&file.lock().unwrap(), &Node::new(&parse_node_spec(spec).unwrap())).unwrap();
        sim
    }

    /// One H100 80GB HBM3 with the recorded GPU's UUID and PCI bus id, so that the ids
    /// in the answers are the recorded ones.
    pub fn recorded_h100() -> Sim {
        let sim = Sim::new("h100-80gb:1");
        sim.change(|node| {
            node.gpus[0].uuid = REAL_UUID.to_string();
            node.gpus[0].pci_bus_id = REAL_BUS.to_string();
        });
        sim
    }

    pub fn state(&self) -> PathBuf {
        self.dir.path().join("simulated-gpus.json")
    }

    pub fn file(&self) -> NodeFile {
        NodeFile::new(self.state())
    }

    pub fn node(&self) -> Node {
        self.file().read().unwrap()
    }

    pub fn change(&self, f: impl FnOnce(&mut Node)) {
        self.file().update(f).unwrap();
    }

    /// Runs the tool: (stdout, exit status); the simulator's own notes (stderr) must be
    /// empty.
    pub fn run(&self, args: &[&str]) -> (String, i32) {
        let out = Command::new(env!("CARGO_BIN_EXE_gpushare-sim-nvidia-smi"))
            .args(args)
            .env("GPUSHARE_SIM_STATE", self.state())
            .env_remove("GPUSHARE_SIM_FAIL")
            .env_remove("GPUSHARE_SIM_RECORD")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
        (String::from_utf8(out.stdout).unwrap(), out.status.code().unwrap())
    }

    /// Runs `gpushare-sim-fault` on this node, which prints nothing on stdout: (exit status,
    /// stderr).
    pub fn fault(&self, args: &[&str]) -> (i32, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_gpushare-sim-fault"))
            .args(args)
            .env("GPUSHARE_SIM_STATE", self.state())
            .output()
            .unwrap();
        assert!(out.stdout.is_empty(), "{args:?} prints nothing on stdout");
        (out.status.code().unwrap(), String::from_utf8(out.stderr).unwrap())
    }

    /// Runs the tool, which must succeed: its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let (out, status) = self.run(args);
        assert_eq!(status, 0, "{args:?}: {out}");
        out
    }
}

/// A recorded answer: (output, exit status), from a file of the output then `exit N`.
pub fn recorded(name: &str) -> (String, i32) {
    let path = Path::new(RECORDED).join(format!("{name}.txt"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    split_exit(&text)
}

/// Splits `output…exit N\n` into (output, N).
pub fn split_exit(text: &str) -> (String, i32) {
    let body = text.strip_suffix('\n').unwrap_or(text);
    let (output, last) = body.rsplit_once('\n').map_or(("", body), |(o, l)| (o, l));
    let status = last.strip_prefix("exit ").and_then(|n| n.parse().ok()).expect("ends in exit N");
    let output = if output.is_empty() { String::new() } else { format!("{output}\n") };
    (output, status)
}

/// The `key : value` lines of a query log as (path of section titles and key, value),
/// the title lines and the header lines as (the line, None), in order.
pub fn log_entries(log: &str) -> Vec<(String, Option<String>)> {
    let mut sections: Vec<String> = Vec::new();
    let mut entries = Vec::new();
    for line in log.lines() {
        let depth = (line.len() - line.trim_start().len()) / 4;
        let (key, value) = match line.split_once(" : ") {
            Some((k, v)) => (k.trim(), Some(v.to_string())),
            None => (line.trim_end().trim_start(), None),
        };
        sections.truncate(depth);
        let path = sections.iter().map(String::as_str).chain([key]).collect::<Vec<_>>().join("/");
        if value.is_none() {
            sections.push(key.to_string());
        }
        entries.push((path, value));
    }
    entries
}

/// A finished tool's exit code, stdout and stderr.
pub fn text(out: &Output) -> (Option<i32>, String, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
