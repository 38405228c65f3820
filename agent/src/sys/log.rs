//! Where the agent's log lines go (DESIGN.md, "Logging"). Under systemd, with stderr
//! connected to the journal, to journald itself over its native protocol: one entry per
//! event with its `PRIORITY` (ERROR 3, WARN 4, INFO 6, DEBUG and TRACE 7), no timestamp
//! of the agent's own (journald stamps every entry), and the structured fields
//! `GPUSHARE_PROFILE`, `GPUSHARE_JOB`, `GPUSHARE_GPU` and `GPUSHARE_STEP` where they
//! apply. Anywhere else (a terminal, a pipe, the tests), to stderr as `tracing`'s fmt
//! lines, as before. `GPUSHARE_LOG` filters both.
//!
//! The structured fields come from the event's fields named `profile`, `job`, `gpu` and
//! `step` and from those of the spans it happens in: [`apply_span`], [`job_span`],
//! [`step_span`] and [`gpu_span`] carry them to every line inside, on the journal only
//! (fmt lines stay as they were: those spans are off there).

use std::ffi::OsStr;
use std::io::{self, IsTerminal, Write};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Span, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{DefaultFields, FormatFields, Writer};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// The variable with `tracing`'s filter directives (default `info`).
pub const FILTER_ENV: &str = "GPUSHARE_LOG";
/// The variable systemd sets to the device and inode (`<dev>:<ino>`) of the journal stream
/// it connects stdout and stderr to (systemd.exec(5)).
pub const JOURNAL_STREAM_ENV: &str = "JOURNAL_STREAM";
/// journald's socket for native entries.
pub const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";
/// For tests only: another socket to send the entries to (a fake journald).
pub const JOURNAL_SOCKET_ENV: &str = "GPUSHARE_JOURNAL_SOCKET";
/// `SYSLOG_IDENTIFIER` of every entry, as journald gives the lines of the stream.
pub const IDENTIFIER: &str = "gpushare-agent";
/// The target of the spans that only carry fields: on for the journal, off for fmt.
const FIELDS_TARGET: &str = "gpushare_fields";
/// Fields (as events and spans name them) that become journal fields, and those names.
const FIELDS: [(&str, &str); 4] = [
    ("profile", "GPUSHARE_PROFILE"),
    ("job", "GPUSHARE_JOB"),
    ("gpu", "GPUSHARE_GPU"),
    ("step", "GPUSHARE_STEP"),
];
/// Where a message too long for one datagram is cut (journald's native protocol takes a
/// longer one only through a memory file descriptor; no line of the agent's comes close).
const MESSAGE_CUT: usize = 48 * 1024;

/// Where [`init`] sent the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// journald's native protocol.
    Journal,
    /// fmt lines on stderr.
    Stderr,
}

/// Sets up logging for the process: to the journal when stderr is the journal's stream
/// (and journald answers), else fmt lines on stderr. Call once, first thing. `quiet`: on
/// stderr, warnings and errors only unless `GPUSHARE_LOG` says otherwise (a simulated
/// agent run by hand: its terminal is the user's, issue 37); the journal gets `info`.
pub fn init(quiet: bool) -> Destination {
    let stream = std::env::var_os(JOURNAL_STREAM_ENV);
    let mut refused = None;
    if stream.as_deref().is_some_and(|s| is_journal_stream(s, stderr_identity())) {
        let path = std::env::var_os(JOURNAL_SOCKET_ENV)
            .map_or_else(|| PathBuf::from(JOURNAL_SOCKET), PathBuf::from);
        match Journal::connect(&path) {
            Ok(journal) => {
                tracing_subscriber::registry()
                    .with(filter(Destination::Journal, "info"))
                    .with(journal)
                    .init();
                return Destination::Journal;
            }
            Err(e) => refused = Some(format!("{}: {e}", path.display())),
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter(Destination::Stderr, if quiet { "warn" } else { "info" }))
        .with_writer(io::stderr)
        .with_ansi(io::stderr().is_terminal())
        .init();
    if let Some(why) = refused {
        tracing::warn!("cannot log to the journal ({why}): logging to stderr");
    }
    Destination::Stderr
}

/// `GPUSHARE_LOG`'s filter (`default` without it), with the spans that carry fields on for
/// the journal (whatever the level: a warning must carry them under `GPUSHARE_LOG=warn` too)
/// and off for fmt.
fn filter(to: Destination, default: &str) -> EnvFilter {
    let filter = EnvFilter::try_from_env(FILTER_ENV).unwrap_or_else(|_| EnvFilter::new(default));
    let spans = if to == Destination::Journal { "trace" } else { "off" };
    match format!("{FIELDS_TARGET}={spans}").parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    }
}

/// Whether `stream`, `JOURNAL_STREAM`'s value, names the file `stderr` (its device and
/// inode) is: then stderr goes to the journal (not merely a child's inherited variable).
pub fn is_journal_stream(stream: &OsStr, stderr: Option<(u64, u64)>) -> bool {
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    match (dev.parse::<u64>(), ino.parse::<u64>(), stderr) {
        (Ok(dev), Ok(ino), Some(stderr)) => (dev, ino) == stderr,
        _ => false,
    }
}

/// The device and inode of what descriptor 2 is open on.
fn stderr_identity() -> Option<(u64, u64)> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let fd = io::stderr().as_fd().try_clone_to_owned().ok()?;
    let meta = std::fs::File::from(fd).metadata().ok()?;
    Some((meta.dev(), meta.ino()))
}

/// The span around an apply (a job, or the start-up re-apply): `GPUSHARE_JOB` and
/// `GPUSHARE_PROFILE` on every line inside.
pub fn apply_span(job: &str, profile: &str) -> Span {
    tracing::info_span!(target: FIELDS_TARGET, "apply", job, profile)
}

/// The span around another job (a probe, a bench): `GPUSHARE_JOB`.
pub fn job_span(job: &str) -> Span {
    tracing::info_span!(target: FIELDS_TARGET, "job", job)
}

/// The span around step `step` of a plan (its number in plan order, from 1) on `gpu`.
pub fn step_span(gpu: u32, step: u32) -> Span {
    tracing::info_span!(target: FIELDS_TARGET, "step", gpu, step)
}

/// The span around work on `gpu` that is no step of the apply's plan (a rollback's).
pub fn gpu_span(gpu: u32) -> Span {
    tracing::info_span!(target: FIELDS_TARGET, "gpu", gpu)
}

/// `work` to run on another thread (`spawn_blocking`) inside the current span, so that
/// its lines carry the same fields.
pub fn in_current_span<R>(work: impl FnOnce() -> R) -> impl FnOnce() -> R {
    let span = Span::current();
    move || span.in_scope(work)
}

/// journald's priority of a level: syslog's err, warning, info and debug.
pub fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// The `tracing` layer that sends every event to journald as one entry.
#[derive(Debug)]
pub struct Journal {
    socket: UnixDatagram,
    path: PathBuf,
}

impl Journal {
    /// A layer sending to the socket at `path`; fails when nothing listens there.
    pub fn connect(path: &Path) -> io::Result<Journal> {
        let socket = UnixDatagram::unbound()?;
        // journald discards an empty datagram: this only checks that it is there.
        socket.send_to(&[], path)?;
        Ok(Journal { socket, path: path.to_path_buf() })
    }

    fn send(&self, priority: u8, message: &str, fields: &Fields, meta: &Metadata<'_>) {
        let sent = self.socket.send_to(&entry(priority, message, fields, meta), &self.path);
        let sent = match sent {
            Err(e) if e.raw_os_error() == Some(nix::errno::Errno::EMSGSIZE as i32) => {
                let start = gpushare_proto::byte_prefix(message, MESSAGE_CUT);
                let cut = format!("{start}… (cut at {} bytes)", start.len());
                self.socket.send_to(&entry(priority, &cut, fields, meta), &self.path)
            }
            other => other,
        };
        if sent.is_err() {
            // journald went away: the stream (stderr) keeps the line, its priority given
            // as the `<N>` prefix journald reads there.
            let _ = writeln!(io::stderr(), "<{priority}>{message}");
        }
    }
}

impl<S> tracing_subscriber::Layer<S> for Journal
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if !ours(attrs.metadata()) {
            return;
        }
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<Fields>()
        {
            values.record(fields);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        for span in ctx.event_scope(event).into_iter().flat_map(|s| s.from_root()) {
            if let Some(theirs) = span.extensions().get::<Fields>() {
                fields.merge(theirs);
            }
        }
        let meta = event.metadata();
        if ours(meta) {
            event.record(&mut fields);
        }
        // The text of the fmt line after its timestamp, level and target: the message and
        // the event's fields, `key=value`.
        let mut message = String::new();
        let _ = DefaultFields::new().format_fields(Writer::new(&mut message), event);
        self.send(priority(*meta.level()), &message, &fields, meta);
    }
}

/// Whether fields of this event or span are gpushare's (a library's `job` is not).
fn ours(meta: &Metadata<'_>) -> bool {
    meta.target().starts_with("gpushare")
}

/// The journal fields found on an event and its spans, by journal name; the innermost
/// value wins.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Fields(Vec<(&'static str, String)>);

impl Fields {
    fn set(&mut self, field: &Field, value: String) {
        let Some(&(_, name)) = FIELDS.iter().find(|(f, _)| *f == field.name()) else { return };
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.0.push((name, value)),
        }
    }

    fn merge(&mut self, inner: &Fields) {
        for (name, value) in &inner.0 {
            match self.0.iter_mut().find(|(n, _)| n == name) {
                Some(slot) => slot.1.clone_from(value),
                None => self.0.push((name, value.clone())),
            }
        }
    }
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.set(field, value.to_string());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.set(field, value.to_string());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(field, value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        // `%value` comes here too, and prints as Display.
        self.set(field, format!("{value:?}"));
    }
}

/// One entry in journald's native protocol: every field as its name, a newline, the
/// value's length (64-bit little-endian), the value and a newline, the form any value
/// may take. Fields: `PRIORITY`, `SYSLOG_IDENTIFIER`, `MESSAGE`, `CODE_FILE`, `CODE_LINE`
/// and the `GPUSHARE_*` found.
fn entry(priority: u8, message: &str, fields: &Fields, meta: &Metadata<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + message.len());
    let mut put = |name: &str, value: &[u8]| {
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
        out.extend_from_slice(&(value.len() as u64).to_le_bytes());
        out.extend_from_slice(value);
        out.push(b'\n');
    };
    put("PRIORITY", priority.to_string().as_bytes());
    put("SYSLOG_IDENTIFIER", IDENTIFIER.as_bytes());
    put("MESSAGE", message.as_bytes());
    if let Some(file) = meta.file() {
        put("CODE_FILE", file.as_bytes());
    }
    if let Some(line) = meta.line() {
        put("CODE_LINE", line.to_string().as_bytes());
    }
    for (name, value) in &fields.0 {
        put(name, value.as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;

    /// Decodes one native-protocol entry (both forms: `NAME=value\n` and length-prefixed).
    fn decode(mut data: &[u8]) -> BTreeMap<String, String> {
        let mut fields = BTreeMap::new();
        while !data.is_empty() {
            let end = data.iter().position(|&b| b == b'\n' || b == b'=').unwrap();
            let name = String::from_utf8(data[..end].to_vec()).unwrap();
            let value;
            if data[end] == b'=' {
                let rest = &data[end + 1..];
                let len = rest.iter().position(|&b| b == b'\n').unwrap();
                value = rest[..len].to_vec();
                data = &rest[len + 1..];
            } else {
                let rest = &data[end + 1..];
                let len = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
                value = rest[8..8 + len].to_vec();
                assert_eq!(rest[8 + len], b'\n');
                data = &rest[8 + len + 1..];
            }
            assert!(fields.insert(name, String::from_utf8(value).unwrap()).is_none());
        }
        fields
    }

    /// A fake journald at a temporary path.
    fn fake_journald() -> (tempfile::TempDir, PathBuf, UnixDatagram) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("socket");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (dir, path, socket)
    }

    /// The entries sent to `socket` (the empty datagram of `connect` left out).
    fn received(socket: &UnixDatagram) -> Vec<BTreeMap<String, String>> {
        socket.set_nonblocking(true).unwrap();
        let mut buf = vec![0; 1 << 20];
        let mut entries = Vec::new();
        while let Ok(n) = socket.recv(&mut buf) {
            if n > 0 {
                entries.push(decode(&buf[..n]));
            }
        }
        entries
    }

    #[test]
    fn the_journal_stream_is_stderrs_device_and_inode() {
        let s = |s: &str| OsStr::new(s).to_owned();
        assert!(is_journal_stream(&s("8:1234"), Some((8, 1234))));
        assert!(is_journal_stream(&s("64769:18446744073709551615"), Some((64769, u64::MAX))));
        // A child's inherited variable while its stderr goes elsewhere.
        assert!(!is_journal_stream(&s("8:1234"), Some((8, 1235))));
        assert!(!is_journal_stream(&s("9:1234"), Some((8, 1234))));
        assert!(!is_journal_stream(&s("8:1234"), None));
        for bad in ["", "8", "8:", ":1234", "8:1234:5", "x:1234", "8: 1234", "-8:1234"] {
            assert!(!is_journal_stream(&s(bad), Some((8, 1234))), "{bad:?}");
        }
    }

    #[test]
    fn this_processs_stderr_has_an_identity() {
        assert!(stderr_identity().is_some());
    }

    #[test]
    fn levels_map_to_syslog_priorities() {
        assert_eq!(priority(Level::ERROR), 3);
        assert_eq!(priority(Level::WARN), 4);
        assert_eq!(priority(Level::INFO), 6);
        assert_eq!(priority(Level::DEBUG), 7);
        assert_eq!(priority(Level::TRACE), 7);
    }

    #[test]
    fn connecting_needs_a_listener() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Journal::connect(&dir.path().join("nothing")).is_err());
        let (_dir, path, socket) = fake_journald();
        Journal::connect(&path).unwrap();
        assert!(received(&socket).is_empty(), "the check sends nothing but an empty datagram");
    }

    /// Events through the layer, under the filter `init` gives the journal with
    /// `GPUSHARE_LOG=warn` (the spans on whatever the level).
    fn journal_of(directives: &str, log: impl FnOnce()) -> Vec<BTreeMap<String, String>> {
        let (_dir, path, socket) = fake_journald();
        let spans = format!("{FIELDS_TARGET}=trace").parse().unwrap();
        let filter = EnvFilter::new(directives).add_directive(spans);
        let subscriber =
            tracing_subscriber::registry().with(filter).with(Journal::connect(&path).unwrap());
        tracing::subscriber::with_default(subscriber, log);
        received(&socket)
    }

    #[test]
    fn entries_carry_priority_message_and_the_fields_of_their_spans() {
        let entries = journal_of("warn", || {
            tracing::info!("not at warn");
            let apply = apply_span("/io/gpushare/Agent1/jobs/7", "half-balanced");
            let _in_apply = apply.enter();
            tracing::error!(target: "gpushare_agent::x", hook = "pre_apply", "hook failed");
            step_span(3, 12).in_scope(|| {
                // On another thread, as the steps' driver calls run (the agent's subscriber
                // is global; this test's is the thread's).
                let work = in_current_span(|| tracing::warn!(target: "gpushare_agent::x", "reset"));
                let dispatch = tracing::dispatcher::get_default(Clone::clone);
                std::thread::spawn(move || tracing::dispatcher::with_default(&dispatch, work))
                    .join()
                    .unwrap();
            });
            gpu_span(2).in_scope(|| tracing::warn!(target: "gpushare_agent::x", "rolling back"));
            // The event's own field wins over the span's.
            tracing::warn!(target: "gpushare_agent::x", profile = %"other", step = 4u32, "x");
        });
        let [hook, reset, rollback, own] = &entries[..] else { panic!("{entries:#?}") };
        assert_eq!(hook["PRIORITY"], "3");
        assert_eq!(hook["MESSAGE"], "hook failed hook=\"pre_apply\"");
        assert_eq!(hook["SYSLOG_IDENTIFIER"], "gpushare-agent");
        assert_eq!(hook["GPUSHARE_PROFILE"], "half-balanced");
        assert_eq!(hook["GPUSHARE_JOB"], "/io/gpushare/Agent1/jobs/7");
        assert!(hook["CODE_FILE"].ends_with("log.rs"), "{hook:?}");
        assert!(hook["CODE_LINE"].parse::<u32>().is_ok());
        let names: Vec<&str> = hook.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "CODE_FILE",
                "CODE_LINE",
                "GPUSHARE_JOB",
                "GPUSHARE_PROFILE",
                "MESSAGE",
                "PRIORITY",
                "SYSLOG_IDENTIFIER"
            ]
        );
        assert_eq!(reset["PRIORITY"], "4");
        assert_eq!(reset["MESSAGE"], "reset");
        assert_eq!(reset["GPUSHARE_GPU"], "3");
        assert_eq!(reset["GPUSHARE_STEP"], "12");
        assert_eq!(reset["GPUSHARE_PROFILE"], "half-balanced");
        assert_eq!(rollback["GPUSHARE_GPU"], "2");
        assert!(!rollback.contains_key("GPUSHARE_STEP"), "{rollback:?}");
        assert_eq!(rollback["GPUSHARE_JOB"], "/io/gpushare/Agent1/jobs/7");
        assert_eq!(own["GPUSHARE_PROFILE"], "other");
        assert_eq!(own["GPUSHARE_STEP"], "4");
        assert_eq!(own["MESSAGE"], "x profile=other step=4");
    }

    #[test]
    fn only_gpushare_fields_become_journal_fields() {
        let entries = journal_of("debug", || {
            tracing::debug!(target: "gpushare_agent::x", gpu = 1u32, uid = 0u32, "done");
            // A library's field of the same name is its own business.
            tracing::info!(target: "zbus::x", job = "theirs", "other");
        });
        let [ours, theirs] = &entries[..] else { panic!("{entries:#?}") };
        assert_eq!(ours["PRIORITY"], "7");
        assert_eq!(ours["GPUSHARE_GPU"], "1");
        assert_eq!(ours["MESSAGE"], "done gpu=1 uid=0");
        assert!(!ours.keys().any(|k| k.contains("UID")), "{ours:?}");
        assert_eq!(theirs["PRIORITY"], "6");
        assert!(!theirs.keys().any(|k| k.starts_with("GPUSHARE_")), "{theirs:?}");
        for entry in &entries {
            for name in entry.keys() {
                assert!(
                    name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
                        && !name.starts_with('_'),
                    "{name}"
                );
            }
        }
    }

    #[test]
    fn a_message_too_long_for_a_datagram_is_cut() {
        let long = "x".repeat(4 << 20);
        let entries = journal_of("info", || tracing::info!(target: "gpushare_agent::x", "{long}"));
        let [entry] = &entries[..] else { panic!("{} entries", entries.len()) };
        assert!(entry["MESSAGE"].starts_with("xxx"));
        assert!(entry["MESSAGE"].ends_with(&format!("… (cut at {MESSAGE_CUT} bytes)")));
    }
}
