//! Logging (issue 13): with stderr connected to the journal (`JOURNAL_STREAM` naming
//! stderr's device and inode, as systemd sets it), the agent sends journald's native
//! entries, with a priority per level, no timestamp of its own and the fields
//! `GPUSHARE_PROFILE`, `GPUSHARE_JOB`, `GPUSHARE_GPU` and `GPUSHARE_STEP`; anywhere else,
//! fmt lines on stderr. journald here is a fake: a datagram socket the agent is pointed to
//! with `GPUSHARE_JOURNAL_SOCKET` (for tests only), decoding what a real one would store.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use gpushare_tests::{Agent, AgentOptions, text, wait_for};
use tempfile::TempDir;

/// One journal entry: field name → value.
type Entry = BTreeMap<String, String>;

/// The fields an entry of the agent's may have.
const FIELDS: [&str; 9] = [
    "MESSAGE",
    "PRIORITY",
    "SYSLOG_IDENTIFIER",
    "CODE_FILE",
    "CODE_LINE",
    "GPUSHARE_PROFILE",
    "GPUSHARE_JOB",
    "GPUSHARE_GPU",
    "GPUSHARE_STEP",
];

/// A socket where journald's would be, keeping every entry sent to it.
struct FakeJournald {
    path: PathBuf,
    entries: Arc<Mutex<Vec<Entry>>>,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
    _dir: TempDir,
}

impl FakeJournald {
    fn start() -> FakeJournald {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.socket");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let entries = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        // Read all the time: a full socket would hold up the agent's logging.
        let reader = {
            let (entries, stop) = (Arc::clone(&entries), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut buf = vec![0; 1 << 20];
                while !stop.load(Ordering::SeqCst) {
                    // The empty datagram is the agent's check that journald is there.
                    if let Ok(n @ 1..) = socket.recv(&mut buf) {
                        entries.lock().unwrap().push(decode(&buf[..n]));
                    }
                }
            })
        };
        FakeJournald { path, entries, stop, reader: Some(reader), _dir: dir }
    }

    fn entries(&self) -> Vec<Entry> {
        self.entries.lock().unwrap().clone()
    }

    /// The entries once one has a MESSAGE starting with `start` (within 10 s).
    fn wait_for_message(&self, start: &str) -> Vec<Entry> {
        wait_for(Duration::from_secs(10), Duration::from_millis(20), || {
            let entries = self.entries();
            if entries.iter().any(|e| e["MESSAGE"].starts_with(start)) {
                Ok(entries)
            } else {
                Err(format!("no journal entry {start:?} in {entries:#?}"))
            }
        })
    }
}

impl Drop for FakeJournald {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// Decodes an entry of journald's native protocol: `NAME=value\n`, or `NAME\n`, the
/// value's length (64-bit little-endian), the value and `\n`.
fn decode(mut data: &[u8]) -> Entry {
    let mut entry = Entry::new();
    while !data.is_empty() {
        let end = data.iter().position(|&b| b == b'\n' || b == b'=').expect("a field name");
        let name = String::from_utf8(data[..end].to_vec()).unwrap();
        let rest = &data[end + 1..];
        let value = if data[end] == b'=' {
            let len = rest.iter().position(|&b| b == b'\n').expect("a value's end");
            data = &rest[len + 1..];
            &rest[..len]
        } else {
            let len = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
            assert_eq!(rest[8 + len], b'\n', "{name}: a length-prefixed value ends in a newline");
            data = &rest[8 + len + 1..];
            &rest[8..8 + len]
        };
        let value = String::from_utf8(value.to_vec()).unwrap();
        assert!(entry.insert(name.clone(), value).is_none(), "{name} twice");
    }
    entry
}

/// `JOURNAL_STREAM`'s value for `file`: its device and inode, as systemd writes them.
fn journal_stream(file: &Path) -> String {
    let meta = std::fs::metadata(file).unwrap();
    format!("{}:{}", meta.dev(), meta.ino())
}

/// Whether a line starts with a timestamp, as fmt lines do (`2026-01-02T03:04:05…`).
fn stamped(line: &str) -> bool {
    let b = line.as_bytes();
    b.len() > 10 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' && b[10] == b'T'
}

/// An agent on two simulated A100s logging to `journald`, its stderr (the journal's
/// stream) in `stderr`.
fn agent_on_the_journal(journald: &FakeJournald, stderr: &Path, extra: &[(&str, &str)]) -> Agent {
    std::fs::write(stderr, "").unwrap();
    let mut options = AgentOptions::simulate("a100-40gb:2")
        .env("JOURNAL_STREAM", &journal_stream(stderr))
        .env("GPUSHARE_JOURNAL_SOCKET", journald.path.to_str().unwrap())
        .env("GPUSHARE_LOG", "info")
        .stderr_to(stderr);
    for (key, value) in extra {
        options = options.env(key, value);
    }
    Agent::start(options)
}

#[test]
fn an_applys_lines_reach_the_journal_with_priorities_and_fields() {
    let journald = FakeJournald::start();
    let dir = tempfile::tempdir().unwrap();
    let stderr = dir.path().join("stderr");
    // The second GPU instance the first apply creates fails: it is rolled back.
    let fail = ("GPUSHARE_SIM_FAIL", "nvmlDeviceCreateGpuInstanceWithPlacement:2");
    let agent = agent_on_the_journal(&journald, &stderr, &[fail]);
    let out = agent.ctl(&["apply", "half-balanced"]);
    assert!(!out.status.success(), "{}", text(&out));
    let out = agent.ctl(&["apply", "half-balanced"]);
    assert!(out.status.success(), "{}", text(&out));
    let entries = journald.wait_for_message("job succeeded");

    // Every entry: journald's conventions, gpushare's identifier, no timestamp of ours.
    for entry in &entries {
        for name in entry.keys() {
            assert!(FIELDS.contains(&name.as_str()), "field {name} in {entry:?}");
        }
        assert!(["3", "4", "6", "7"].contains(&entry["PRIORITY"].as_str()), "{entry:?}");
        assert_eq!(entry["SYSLOG_IDENTIFIER"], "gpushare-agent");
        assert!(!stamped(&entry["MESSAGE"]), "{entry:?}");
    }
    let serving = entries.iter().find(|e| e["MESSAGE"].starts_with("serving io.gpushare.Agent1"));
    assert_eq!(serving.map(|e| e["PRIORITY"].as_str()), Some("6"), "{entries:#?}");

    // `journalctl GPUSHARE_PROFILE=half-balanced`: both applies, each from its start line.
    let started: Vec<&Entry> =
        entries.iter().filter(|e| e["MESSAGE"].starts_with("apply started")).collect();
    let [first, second] = &started[..] else { panic!("{entries:#?}") };
    for start in [first, second] {
        assert_eq!(start["PRIORITY"], "6");
        assert_eq!(start["GPUSHARE_PROFILE"], "half-balanced");
        assert!(start["GPUSHARE_JOB"].starts_with("/io/gpushare/Agent1/jobs/"), "{start:?}");
    }
    let of = |start: &Entry| -> Vec<Entry> {
        let job = &start["GPUSHARE_JOB"];
        let lines: Vec<Entry> =
            entries.iter().filter(|e| e.get("GPUSHARE_JOB") == Some(job)).cloned().collect();
        for line in &lines {
            assert_eq!(line["GPUSHARE_PROFILE"], "half-balanced", "{line:?}");
        }
        lines
    };
    let (failed, succeeded) = (of(first), of(second));
    assert_ne!(first["GPUSHARE_JOB"], second["GPUSHARE_JOB"]);

    // Step lines: the GPU and the step's number in plan order.
    let steps = |lines: &[Entry]| -> Vec<Entry> {
        // (The failed step's warning starts so too.)
        let begun = |e: &&Entry| e["MESSAGE"].starts_with("plan step ") && e["PRIORITY"] == "6";
        let steps: Vec<Entry> = lines.iter().filter(begun).cloned().collect();
        for step in &steps {
            let (gpu, number) = (&step["GPUSHARE_GPU"], &step["GPUSHARE_STEP"]);
            let message = &step["MESSAGE"];
            assert!(message.starts_with(&format!("plan step {number} of ")), "{step:?}");
            assert!(message.contains(&format!(": GPU {gpu}: ")), "{step:?}");
        }
        steps
    };
    assert!(!steps(&failed).is_empty(), "{failed:#?}");
    assert!(steps(&succeeded).len() >= 8, "{succeeded:#?}");

    // `journalctl -p warning`: the failed step, with its GPU and number, then the job's
    // failure.
    let warnings: Vec<&Entry> =
        entries.iter().filter(|e| e["PRIORITY"].parse::<u8>().unwrap() <= 4).collect();
    let rolling_back: Vec<&Entry> =
        warnings.iter().copied().filter(|e| e["MESSAGE"].contains("; rolling back")).collect();
    let [step_failed] = &rolling_back[..] else { panic!("{warnings:#?}") };
    assert_eq!(step_failed["PRIORITY"], "4");
    assert_eq!(step_failed["GPUSHARE_JOB"], first["GPUSHARE_JOB"]);
    assert_eq!(step_failed["GPUSHARE_GPU"], "0");
    let number = &step_failed["GPUSHARE_STEP"];
    assert!(step_failed["MESSAGE"].starts_with(&format!("plan step {number} of ")));
    assert!(step_failed["MESSAGE"].contains("NVML_ERROR_INSUFFICIENT_RESOURCES"));
    let job_failed: Vec<&Entry> =
        warnings.iter().copied().filter(|e| e["PRIORITY"] == "3").collect();
    let [job_failed] = &job_failed[..] else { panic!("{warnings:#?}") };
    assert_eq!(job_failed["GPUSHARE_JOB"], first["GPUSHARE_JOB"]);
    assert_eq!(job_failed["GPUSHARE_PROFILE"], "half-balanced");
    assert!(job_failed["MESSAGE"].contains("rolled back: GPU 0 as before"), "{job_failed:?}");
    // The apply that succeeded warned of nothing: that the A100's MIG mode waits for the
    // reset its plan has next is the usual course, an info line of the driver call inside
    // step 1, with the step's fields.
    let second_job = Some(&second["GPUSHARE_JOB"]);
    let warned: Vec<&Entry> =
        warnings.iter().copied().filter(|e| e.get("GPUSHARE_JOB") == second_job).collect();
    assert!(warned.is_empty(), "{warned:#?}");
    let pending: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.get("GPUSHARE_JOB") == second_job)
        .filter(|e| e["MESSAGE"].starts_with("MIG mode change is pending"))
        .collect();
    let [pending] = &pending[..] else { panic!("{entries:#?}") };
    assert_eq!(pending["PRIORITY"], "6");
    assert_eq!((pending["GPUSHARE_GPU"].as_str(), pending["GPUSHARE_STEP"].as_str()), ("0", "1"));

    // The rollback's steps: the GPU, and no step number (they are not the apply's steps).
    let rollback: Vec<&Entry> =
        failed.iter().filter(|e| e["MESSAGE"].starts_with("rolling back: ")).collect();
    assert!(!rollback.is_empty(), "{failed:#?}");
    for step in rollback {
        assert_eq!((step["PRIORITY"].as_str(), step["GPUSHARE_GPU"].as_str()), ("6", "0"));
        assert!(!step.contains_key("GPUSHARE_STEP"), "{step:?}");
    }

    let done: Vec<&Entry> =
        succeeded.iter().filter(|e| e["MESSAGE"].starts_with("job succeeded")).collect();
    let [done] = &done[..] else { panic!("{succeeded:#?}") };
    assert_eq!(done["PRIORITY"], "6");

    // Nothing went to stderr as well.
    let written = std::fs::read_to_string(&stderr).unwrap();
    assert!(!written.lines().any(stamped), "{written}");
}

#[test]
fn elsewhere_the_lines_stay_fmt_lines_on_stderr() {
    let journald = FakeJournald::start();
    let dir = tempfile::tempdir().unwrap();
    let stderr = dir.path().join("stderr");

    // A variable inherited from a parent whose stderr was the journal: not this stderr.
    std::fs::write(&stderr, "").unwrap();
    let agent = Agent::start(
        AgentOptions::simulate("a100-40gb:2")
            .env("JOURNAL_STREAM", "1:1")
            .env("GPUSHARE_JOURNAL_SOCKET", journald.path.to_str().unwrap())
            .env("GPUSHARE_LOG", "info")
            .stderr_to(&stderr),
    );
    let out = agent.ctl(&["apply", "half-balanced"]);
    assert!(out.status.success(), "{}", text(&out));
    drop(agent);
    let written = std::fs::read_to_string(&stderr).unwrap();
    let line = |what: &str| written.lines().find(|l| l.contains(what));
    for what in ["serving io.gpushare.Agent1", "apply started", "plan step 1 of ", "job succeeded"]
    {
        assert!(line(what).is_some_and(stamped), "{what:?} in {written}");
    }
    assert!(line("plan step 1 of ").is_some_and(|l| l.contains(" INFO ")), "{written}");
    // The spans that carry the journal's fields are not shown.
    assert!(!written.contains("{job="), "{written}");
    assert!(journald.entries().is_empty(), "{:#?}", journald.entries());

    // The journal's stream, but no journald: stderr, saying so.
    let missing = dir.path().join("no-journald");
    let stream = journal_stream(&stderr);
    let agent = Agent::start(
        AgentOptions::simulate("a100-40gb:1")
            .env("JOURNAL_STREAM", &stream)
            .env("GPUSHARE_JOURNAL_SOCKET", missing.to_str().unwrap())
            .stderr_to(&stderr),
    );
    drop(agent);
    let written = std::fs::read_to_string(&stderr).unwrap();
    let refused = written.lines().find(|l| l.contains("cannot log to the journal"));
    assert!(
        refused.is_some_and(|l| stamped(l) && l.contains(" WARN ") && l.contains("no-journald")),
        "{written}"
    );
}
