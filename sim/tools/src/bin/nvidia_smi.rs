//! `fake-nvidia-smi`: a stand-in for `nvidia-smi` in the tests, which run without a GPU. It
//! knows what the agent uses, answers as the real one of driver 580 does where that was seen
//! (the `compute-policy -l` table in tests/device/results/mps-probe-h100-2026-11-22.txt, the
//! `compute-policy` help, the error lines and exit statuses of nvidia-smi's manual), and
//! records every invocation.
//!
//! ```text
//! fake-nvidia-smi -L | --list-gpus [-i ID[,ID…]]
//! fake-nvidia-smi -r | --gpu-reset [-i ID[,ID…]]
//! fake-nvidia-smi compute-policy -l | --list [-i ID[,ID…]]
//! fake-nvidia-smi compute-policy [-i ID[,ID…]] --set-timeslice N   (N: 0-3; also --set-timeslice=N)
//! fake-nvidia-smi [compute-policy] -h | --help
//! ```
//!
//! An ID is a GPU index, UUID or PCI bus ID (`00000000:01:00.0`); without `-i` a command
//! applies to every GPU. Output, for what is supported:
//!
//! ```text
//! GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)   (-L)
//! GPU 00000000:01:00.0 was successfully reset.                                    (-r)
//! Set timeslice to 2 for GPU GPU-00000000-0000-0000-0000-000000000000              (the ID as given)
//! ```
//!
//! Exit statuses as the real tool's: 0; 2 for an unknown option or invalid value ("ERROR:
//! Option X is not recognized. Please run 'nvidia-smi -h' for help." / "Invalid combination
//! of input arguments. …"); 6 when an ID matches no GPU ("No devices were found"); 255 when
//! the state file cannot be read or written. Without arguments it prints the `-L` lines (not
//! the real summary table).
//!
//! State: the GPUs and their time-slice settings live in the JSON file named by
//! `GPUSHARE_FAKE_NVIDIA_SMI_STATE` (default: `gpushare-fake-nvidia-smi-state.json` in the
//! system temporary directory), `{"gpus": [{"index": 0, "uuid": "GPU-…", "name": "…",
//! "pci_bus_id": "00000000:01:00.0", "timeslice": 0, "reset_count": 0}, …]}`. Every key is
//! optional; a missing or empty file means 8 H100s with UUIDs
//! `GPU-00000000-0000-0000-0000-00000000000N`. Writing back keeps any other keys in the file.
//! Invocations hold a lock (`<state file>.lock`) while they read and write it.
//!
//! Record (`GPUSHARE_SIM_RECORD`): one line per invocation, `nvidia-smi` and its arguments
//! joined by spaces, e.g. `nvidia-smi compute-policy -i GPU-xxx --set-timeslice 2`.

#[path = "../common.rs"]
mod common;

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{Map, Value};

const STATE_ENV: &str = "GPUSHARE_FAKE_NVIDIA_SMI_STATE";
const DEFAULT_STATE_FILE: &str = "gpushare-fake-nvidia-smi-state.json";
const DEFAULT_GPU_COUNT: u32 = 8;
const DEFAULT_NAME: &str = "NVIDIA H100 80GB HBM3";
/// `--set-timeslice` values 0-3 and how `compute-policy -l` shows them.
const TIMESLICES: [&str; 4] = ["Default", "Short", "Medium", "Long"];

const HELP_HINT: &str = "Please run 'nvidia-smi -h' for help.";
const INVALID_COMBINATION: &str =
    "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.";
const NO_DEVICES: &str = "No devices were found";

/// Exit statuses from nvidia-smi's manual.
const EXIT_INVALID_ARGUMENT: u8 = 2;
const EXIT_NOT_FOUND: u8 = 6;
const EXIT_OTHER: u8 = 255;

const POLICY_TABLE_TOP: &str = "\
+-------------------------------------+
| GPU compute policies:               |
| GPU     Name           Value        |
|=====================================|
";
const POLICY_TABLE_BOTTOM: &str = "+-------------------------------------+\n";

/// The real `nvidia-smi compute-policy -h`.
const COMPUTE_POLICY_HELP: &str = "
    Compute Policy -- Control and list compute policies.

    Usage: nvidia-smi compute-policy [options]

    Options include:
    [-i | --id]: GPU device ID's. Provide comma
                 separated values for more than one device

    [-l | --list]: List all compute policies

    [ | --set-timeslice]: Set timeslice config for a GPU:
                          0=DEFAULT, 1=SHORT, 2=MEDIUM, 3=LONG

    [-h | --help]: Display help information

";

const HELP: &str = "\
fake nvidia-smi (gpushare tests): the options the agent uses.

    -L, --list-gpus         List the GPUs with their UUIDs.
    -i, --id=ID             Target GPU(s): index, UUID or PCI bus ID, comma separated.
    -r, --gpu-reset         Reset the GPU(s).
    -h, --help              Print this help.
    compute-policy          Control and list compute policies (compute-policy -h).

State: $GPUSHARE_FAKE_NVIDIA_SMI_STATE; record: $GPUSHARE_SIM_RECORD.
";

/// One GPU as the state file describes it.
#[derive(Debug, Clone, PartialEq)]
struct Gpu {
    index: u32,
    uuid: String,
    name: String,
    pci_bus_id: String,
    timeslice: u8,
    reset_count: u64,
}

impl Gpu {
    fn default_at(index: u32) -> Gpu {
        Gpu {
            index,
            uuid: format!("GPU-00000000-0000-0000-0000-{index:012x}"),
            name: DEFAULT_NAME.into(),
            pci_bus_id: format!("00000000:{:02X}:00.0", index + 1),
            timeslice: 0,
            reset_count: 0,
        }
    }

    /// The GPU at `position` in the file; keys left out take their defaults.
    fn from_json(position: usize, entry: &Value) -> Gpu {
        let index = entry
            .get("index")
            .and_then(Value::as_u64)
            .and_then(|i| u32::try_from(i).ok())
            .unwrap_or_else(|| u32::try_from(position).unwrap_or(u32::MAX));
        let mut gpu = Gpu::default_at(index);
        let text = |key: &str| entry.get(key).and_then(Value::as_str).map(str::to_string);
        if let Some(uuid) = text("uuid") {
            gpu.uuid = uuid;
        }
        if let Some(name) = text("name") {
            gpu.name = name;
        }
        if let Some(pci) = text("pci_bus_id") {
            gpu.pci_bus_id = pci;
        }
        let timeslice = entry.get("timeslice").and_then(Value::as_u64).unwrap_or(0);
        gpu.timeslice = u8::try_from(timeslice).ok().filter(|&t| t <= 3).unwrap_or(0);
        gpu.reset_count = entry.get("reset_count").and_then(Value::as_u64).unwrap_or(0);
        gpu
    }

    /// Writes this GPU's keys into `entry`, keeping the others.
    fn store(&self, entry: &mut Map<String, Value>) {
        entry.insert("index".into(), self.index.into());
        entry.insert("uuid".into(), self.uuid.clone().into());
        entry.insert("name".into(), self.name.clone().into());
        entry.insert("pci_bus_id".into(), self.pci_bus_id.clone().into());
        entry.insert("timeslice".into(), self.timeslice.into());
        entry.insert("reset_count".into(), self.reset_count.into());
    }

    /// Whether `id` (index, UUID or PCI bus ID) names this GPU.
    fn matches(&self, id: &str) -> bool {
        id == self.index.to_string()
            || id.eq_ignore_ascii_case(&self.uuid)
            || id.eq_ignore_ascii_case(&self.pci_bus_id)
    }
}

/// The state file's contents: the document as read (to keep unknown keys) and its GPUs.
struct Node {
    doc: Value,
    gpus: Vec<Gpu>,
}

impl Node {
    fn load(path: &Path) -> Result<Node, String> {
        let text = match fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        let doc = if text.trim().is_empty() {
            Value::Object(Map::new())
        } else {
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?
        };
        let gpus = match doc.get("gpus").and_then(Value::as_array) {
            Some(entries) => {
                entries.iter().enumerate().map(|(i, e)| Gpu::from_json(i, e)).collect()
            }
            None => (0..DEFAULT_GPU_COUNT).map(Gpu::default_at).collect(),
        };
        Ok(Node { doc, gpus })
    }

    /// Writes the state back (to a temporary file, then renamed over the state file).
    fn save(&mut self, path: &Path) -> Result<(), String> {
        if !self.doc.is_object() {
            self.doc = Value::Object(Map::new());
        }
        let doc = self.doc.as_object_mut().expect("an object");
        let entries = doc.entry("gpus").or_insert_with(|| Value::Array(Vec::new()));
        if !entries.is_array() {
            *entries = Value::Array(Vec::new());
        }
        let entries = entries.as_array_mut().expect("an array");
        entries.resize_with(self.gpus.len(), || Value::Object(Map::new()));
        for (entry, gpu) in entries.iter_mut().zip(&self.gpus) {
            if !entry.is_object() {
                *entry = Value::Object(Map::new());
            }
            gpu.store(entry.as_object_mut().expect("an object"));
        }
        let text = serde_json::to_string_pretty(&self.doc).map_err(|e| e.to_string())? + "\n";
        let tmp = with_suffix(path, &format!(".{}.tmp", std::process::id()));
        fs::write(&tmp, text)
            .and_then(|()| fs::rename(&tmp, path))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    /// The GPUs `ids` names (comma separated; all when `None`), each with the ID as given
    /// (its index when all). `Err` with the ID that matches none.
    fn select(&self, ids: Option<&str>) -> Result<Vec<(usize, String)>, String> {
        let Some(ids) = ids else {
            return Ok(self
                .gpus
                .iter()
                .enumerate()
                .map(|(i, g)| (i, g.index.to_string()))
                .collect());
        };
        let mut chosen = Vec::new();
        for id in ids.split(',').map(str::trim).filter(|id| !id.is_empty()) {
            let position = self.gpus.iter().position(|g| g.matches(id)).ok_or(id.to_string())?;
            chosen.push((position, id.to_string()));
        }
        if chosen.is_empty() {
            return Err(ids.to_string());
        }
        Ok(chosen)
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = OsString::from(path.as_os_str());
    name.push(suffix);
    PathBuf::from(name)
}

/// Runs `f` on the state while holding the state file's lock; `f` returns the exit status
/// and whether it changed the state (which is then saved).
fn with_state(
    path: &Path,
    out: &mut impl Write,
    f: impl FnOnce(&mut Node, &mut dyn Write) -> (u8, bool),
) -> u8 {
    let locked = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(with_suffix(path, ".lock"))
        .and_then(|file: File| file.lock().map(|()| file));
    let _lock = match locked {
        Ok(file) => file,
        Err(e) => {
            let _ =
                writeln!(out, "fake nvidia-smi: cannot lock the state of {}: {e}", path.display());
            return EXIT_OTHER;
        }
    };
    let mut node = match Node::load(path) {
        Ok(node) => node,
        Err(e) => {
            let _ = writeln!(out, "fake nvidia-smi: {e}");
            return EXIT_OTHER;
        }
    };
    let (status, changed) = f(&mut node, out);
    if changed && let Err(e) = node.save(path) {
        let _ = writeln!(out, "fake nvidia-smi: {e}");
        return EXIT_OTHER;
    }
    status
}

/// An option's value: inline (`--id=3`) or the next argument.
fn value_of<'a>(
    inline: Option<&'a str>,
    rest: &mut impl Iterator<Item = &'a String>,
) -> Option<String> {
    inline.map(str::to_string).or_else(|| rest.next().cloned())
}

/// `--name=value` → (`--name`, `value`); anything else unchanged.
fn split_inline(arg: &str) -> (&str, Option<&str>) {
    match arg.split_once('=') {
        Some((name, value)) if name.starts_with("--") => (name, Some(value)),
        _ => (arg, None),
    }
}

fn unrecognized(out: &mut impl Write, arg: &str) -> u8 {
    let _ = writeln!(out, "ERROR: Option {arg} is not recognized. {HELP_HINT}");
    EXIT_INVALID_ARGUMENT
}

fn missing_value(out: &mut impl Write, arg: &str) -> u8 {
    let _ = writeln!(out, "ERROR: Option {arg} is missing its value. {HELP_HINT}");
    EXIT_INVALID_ARGUMENT
}

fn no_devices(out: &mut dyn Write) -> (u8, bool) {
    let _ = writeln!(out, "{NO_DEVICES}");
    (EXIT_NOT_FOUND, false)
}

/// Runs one invocation: records it, then does what `args` ask; returns the exit status.
fn run(args: &[String], state: &Path, record: Option<&Path>, out: &mut impl Write) -> u8 {
    let mut line = String::from("nvidia-smi");
    for arg in args {
        line.push(' ');
        line.push_str(arg);
    }
    common::record(record, &line);
    let status = match args.first().map(String::as_str) {
        Some("compute-policy") => compute_policy(&args[1..], state, out),
        _ => top_level(args, state, out),
    };
    let _ = out.flush();
    status
}

/// `nvidia-smi [-L] [-r] [-i IDS]`.
fn top_level(args: &[String], state: &Path, out: &mut impl Write) -> u8 {
    let (mut ids, mut list, mut reset, mut help) = (None, false, false, false);
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match split_inline(arg) {
            ("-L" | "--list-gpus", None) => list = true,
            ("-r" | "--gpu-reset", None) => reset = true,
            ("-h" | "--help", None) => help = true,
            ("-i" | "--id", inline) => match value_of(inline, &mut rest) {
                Some(value) => ids = Some(value),
                None => return missing_value(out, arg),
            },
            _ => return unrecognized(out, arg),
        }
    }
    if help {
        let _ = write!(out, "{HELP}");
        return 0;
    }
    if list && reset {
        let _ = writeln!(out, "{INVALID_COMBINATION}");
        return EXIT_INVALID_ARGUMENT;
    }
    with_state(state, out, |node, out| {
        let Ok(chosen) = node.select(ids.as_deref()) else { return no_devices(out) };
        if reset {
            for (position, _) in &chosen {
                let gpu = &mut node.gpus[*position];
                gpu.reset_count += 1;
                let _ = writeln!(out, "GPU {} was successfully reset.", gpu.pci_bus_id);
            }
            return (0, true);
        }
        // `-L`, and for now also the summary without arguments.
        for (position, _) in &chosen {
            let gpu = &node.gpus[*position];
            let _ = writeln!(out, "GPU {}: {} (UUID: {})", gpu.index, gpu.name, gpu.uuid);
        }
        (0, false)
    })
}

/// The `compute-policy -l` table, one row per GPU.
fn policy_table(gpus: &[&Gpu]) -> String {
    let mut table = String::from(POLICY_TABLE_TOP);
    for gpu in gpus {
        let value = TIMESLICES[usize::from(gpu.timeslice.min(3))];
        table.push_str(&format!("| {:>3}   {:<16}{:<14}|\n", gpu.index, "Timeslice", value));
    }
    table.push_str(POLICY_TABLE_BOTTOM);
    table
}

/// `nvidia-smi compute-policy …`.
fn compute_policy(args: &[String], state: &Path, out: &mut impl Write) -> u8 {
    let (mut ids, mut list, mut set, mut help) = (None, false, None, false);
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match split_inline(arg) {
            ("-l" | "--list", None) => list = true,
            ("-h" | "--help", None) => help = true,
            ("-i" | "--id", inline) => match value_of(inline, &mut rest) {
                Some(value) => ids = Some(value),
                None => return missing_value(out, arg),
            },
            ("--set-timeslice", inline) => match value_of(inline, &mut rest) {
                Some(value) => set = Some(value),
                None => return missing_value(out, arg),
            },
            _ => return unrecognized(out, arg),
        }
    }
    if help || (!list && set.is_none()) {
        let _ = write!(out, "{COMPUTE_POLICY_HELP}");
        return 0;
    }
    let timeslice = match set.as_deref().map(str::parse::<u8>) {
        None => None,
        Some(Ok(value)) if usize::from(value) < TIMESLICES.len() => Some(value),
        Some(_) => {
            let _ = writeln!(out, "{INVALID_COMBINATION}");
            return EXIT_INVALID_ARGUMENT;
        }
    };
    with_state(state, out, |node, out| {
        let Ok(chosen) = node.select(ids.as_deref()) else { return no_devices(out) };
        if let Some(value) = timeslice {
            for (position, id) in &chosen {
                node.gpus[*position].timeslice = value;
                let _ = writeln!(out, "Set timeslice to {value} for GPU {id}");
            }
        }
        if list {
            let gpus: Vec<&Gpu> = chosen.iter().map(|(p, _)| &node.gpus[*p]).collect();
            let _ = write!(out, "{}", policy_table(&gpus));
        }
        (0, timeslice.is_some())
    })
}

/// The state file: `$GPUSHARE_FAKE_NVIDIA_SMI_STATE`, else one in the temporary directory.
fn state_path_from_env() -> PathBuf {
    std::env::var_os(STATE_ENV)
        .filter(|p| !p.is_empty())
        .map_or_else(|| std::env::temp_dir().join(DEFAULT_STATE_FILE), PathBuf::from)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let record = common::record_path_from_env();
    let mut stdout = io::stdout().lock();
    ExitCode::from(run(&args, &state_path_from_env(), record.as_deref(), &mut stdout))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temporary directory with a state file path and a record file path.
    struct Fixture {
        dir: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Fixture {
            Fixture { dir: tempfile::tempdir().unwrap() }
        }
        fn state(&self) -> PathBuf {
            self.dir.path().join("state.json")
        }
        fn record(&self) -> PathBuf {
            self.dir.path().join("record")
        }
        fn run(&self, args: &[&str]) -> (u8, String) {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            let mut out = Vec::new();
            let status = run(&args, &self.state(), Some(&self.record()), &mut out);
            (status, String::from_utf8(out).unwrap())
        }
    }

    const ONE_GPU: &str = r#"{"gpus": [{"uuid": "GPU-cc30f0e5-9f43-576f-21d0-04eb0bb6e180",
        "model": "h100-80gb-hbm3"}]}"#;

    #[test]
    fn lists_compute_policies_as_the_probe_shows() {
        let f = Fixture::new();
        fs::write(f.state(), ONE_GPU).unwrap();
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
        // Listing changes nothing, so the file is not rewritten.
        assert_eq!(fs::read_to_string(f.state()).unwrap(), ONE_GPU);
    }

    #[test]
    fn sets_timeslices_and_keeps_other_keys() {
        let f = Fixture::new();
        fs::write(f.state(), ONE_GPU).unwrap();
        let uuid = "GPU-cc30f0e5-9f43-576f-21d0-04eb0bb6e180";
        let (status, out) = f.run(&["compute-policy", "-i", uuid, "--set-timeslice", "2"]);
        assert_eq!(
            (status, out.as_str()),
            (0, format!("Set timeslice to 2 for GPU {uuid}\n").as_str())
        );
        let (_, out) = f.run(&["compute-policy", "-l"]);
        assert!(out.contains("|   0   Timeslice       Medium        |\n"), "{out}");
        let doc: Value = serde_json::from_str(&fs::read_to_string(f.state()).unwrap()).unwrap();
        assert_eq!(doc["gpus"][0]["timeslice"], 2);
        assert_eq!(doc["gpus"][0]["model"], "h100-80gb-hbm3");
        assert_eq!(doc["gpus"][0]["uuid"], uuid);

        let (status, out) = f.run(&["compute-policy", "--id=0", "--set-timeslice=3", "-l"]);
        assert_eq!(status, 0);
        assert!(out.starts_with("Set timeslice to 3 for GPU 0\n+---"), "{out}");
        assert!(out.contains("Long"), "{out}");
        let record = fs::read_to_string(f.record()).unwrap();
        assert_eq!(
            record,
            format!(
                "nvidia-smi compute-policy -i {uuid} --set-timeslice 2\n\
                 nvidia-smi compute-policy -l\n\
                 nvidia-smi compute-policy --id=0 --set-timeslice=3 -l\n"
            )
        );
    }

    #[test]
    fn default_gpus_when_there_is_no_state_file() {
        let f = Fixture::new();
        let (status, out) = f.run(&["-L"]);
        assert_eq!(status, 0);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 8);
        assert_eq!(
            lines[0],
            "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)"
        );
        assert!(!f.state().exists(), "reading creates no state file");
        let (_, out) = f.run(&[
            "compute-policy",
            "-i",
            "1,GPU-00000000-0000-0000-0000-000000000007",
            "--set-timeslice",
            "1",
        ]);
        assert_eq!(
            out,
            "Set timeslice to 1 for GPU 1\nSet timeslice to 1 for GPU GPU-00000000-0000-0000-0000-000000000007\n"
        );
        let (_, out) = f.run(&["compute-policy", "-l"]);
        let rows: Vec<&str> = out.lines().filter(|l| l.contains("Timeslice")).collect();
        assert_eq!(rows.len(), 8);
        assert_eq!(rows[1], "|   1   Timeslice       Short         |");
        assert_eq!(rows[2], "|   2   Timeslice       Default       |");
        assert_eq!(rows[7], "|   7   Timeslice       Short         |");
        let (_, out) = f.run(&["compute-policy", "-l", "-i", "00000000:08:00.0"]);
        assert_eq!(out.lines().filter(|l| l.contains("Timeslice")).count(), 1);
    }

    #[test]
    fn gpu_reset() {
        let f = Fixture::new();
        let (status, out) = f.run(&["--gpu-reset", "-i", "0"]);
        assert_eq!((status, out.as_str()), (0, "GPU 00000000:01:00.0 was successfully reset.\n"));
        let (status, out) = f.run(&["-r", "-i", "2"]);
        assert_eq!((status, out.as_str()), (0, "GPU 00000000:03:00.0 was successfully reset.\n"));
        let doc: Value = serde_json::from_str(&fs::read_to_string(f.state()).unwrap()).unwrap();
        assert_eq!(doc["gpus"][0]["reset_count"], 1);
        assert_eq!(doc["gpus"][1]["reset_count"], 0);
        assert_eq!(doc["gpus"].as_array().unwrap().len(), 8);
    }

    #[test]
    fn errors_as_the_real_tool() {
        let f = Fixture::new();
        let (status, out) = f.run(&["--bogus"]);
        assert_eq!(status, 2);
        assert_eq!(
            out,
            "ERROR: Option --bogus is not recognized. Please run 'nvidia-smi -h' for help.\n"
        );
        let (status, out) = f.run(&["compute-policy", "--set-timeslice", "4"]);
        assert_eq!((status, out.as_str()), (2, format!("{INVALID_COMBINATION}\n").as_str()));
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
        let (status, _) = f.run(&["-i", "9", "-L"]);
        assert_eq!(status, 6);
        let (status, _) = f.run(&["-L", "-r"]);
        assert_eq!(status, 2);
        let (status, out) = f.run(&["compute-policy"]);
        assert_eq!(status, 0);
        assert!(out.contains("[ | --set-timeslice]: Set timeslice config for a GPU:"));
        fs::write(f.state(), "{ not json").unwrap();
        let (status, _) = f.run(&["-L"]);
        assert_eq!(status, 255);
        // Every invocation is recorded, failed ones too.
        assert_eq!(fs::read_to_string(f.record()).unwrap().lines().count(), 9);
    }
}
