//! The one runner of replicas: N copies of a command, started together through the gate
//! ([`super::gate`]), each in its own process group, as the identity asked for, with its
//! stdout and stderr in files and a report pipe read as it runs.
//!
//! The units-by-line method: every line a replica writes to the descriptor named by
//! `GPUSHARE_BENCH_REPORT` (always 3) is one completed unit of work; a line holding a number is that
//! unit's latency in milliseconds (`12.7`), an empty line a unit without one. Anything else
//! is counted as malformed, never as a unit.
//!
//! Each replica leads its process group and is not reaped until [`Batch::finish`]: its
//! zombie keeps the group's id from being reused, so stopping the group (the leader and
//! whatever it started) can never hit another process.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::sys::unix::{self, Identity};

/// The variable naming the report descriptor (a decimal descriptor number).
pub const REPORT_ENV: &str = "GPUSHARE_BENCH_REPORT";
/// The variable holding the replica's number, from 0.
pub const REPLICA_ENV: &str = "GPUSHARE_BENCH_REPLICA";
/// The variable holding how many replicas run together.
pub const REPLICAS_ENV: &str = "GPUSHARE_BENCH_REPLICAS";

/// The report pipe's capacity asked for.
const REPORT_PIPE_BYTES: usize = 1 << 20;
/// What the reader of a report pipe takes at once.
const REPORT_READ_BYTES: usize = 256 << 10;
/// How long the reader of a report pipe without a backlog waits before reading again.
const REPORT_READ_PAUSE: Duration = Duration::from_millis(50);

/// One replica to start.
#[derive(Debug, Clone)]
pub struct ReplicaSpec {
    /// The program and its arguments.
    pub command: Vec<OsString>,
    /// Environment added to the agent's own (`CUDA_VISIBLE_DEVICES`, the MPS pipe
    /// directory, ...); the runner adds the three `GPUSHARE_BENCH_*` variables.
    pub env: Vec<(String, String)>,
    /// Start from an empty environment rather than the agent's: `env` is then all the
    /// replica gets (a bench passes the caller's environment).
    pub clear_env: bool,
    /// Working directory, entered by the gate as the replica's user.
    pub cwd: Option<PathBuf>,
    /// Who it runs as; `None`: as the agent.
    pub identity: Option<Identity>,
    /// Where its stdout and stderr go: `replica-<i>.out` and `.err` in this directory.
    pub log_dir: PathBuf,
}

/// What a replica reported so far by line.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Units {
    /// Completed units.
    pub count: u64,
    /// Latencies of the units that gave one, ms, in report order.
    pub latencies_ms: Vec<f64>,
    /// When the first unit came.
    pub first_at: Option<Instant>,
    /// Lines that were neither empty nor a latency.
    pub malformed: u64,
    /// The first of those, for the report.
    pub first_malformed: Option<String>,
}

impl Units {
    /// Counts one report line as the reader has it, bytes without the newline. Most lines
    /// are plain decimals (`0.0337`): those are read here directly, the rest as text.
    fn add_bytes(&mut self, line: &[u8], at: Instant) {
        match plain_decimal(line) {
            Some(ms) => self.add_latency(ms, at),
            // Invalid UTF-8 counts as malformed.
            None => self.add_line(std::str::from_utf8(line).unwrap_or("\u{fffd}"), at),
        }
    }

    /// Counts one unit of `ms`.
    fn add_latency(&mut self, ms: f64, at: Instant) {
        self.count += 1;
        self.first_at.get_or_insert(at);
        self.latencies_ms.push(ms);
    }

    /// Counts one report line.
    pub fn add_line(&mut self, line: &str, at: Instant) {
        let line = line.trim();
        let latency = if line.is_empty() {
            None
        } else {
            match line.parse::<f64>() {
                Ok(ms) if ms.is_finite() && ms >= 0.0 => Some(ms),
                _ => {
                    self.malformed += 1;
                    if self.first_malformed.is_none() {
                        self.first_malformed = Some(line.chars().take(200).collect());
                    }
                    return;
                }
            }
        };
        self.count += 1;
        self.first_at.get_or_insert(at);
        self.latencies_ms.extend(latency);
    }
}

/// How a replica ended.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaOutcome {
    /// Its number, from 0.
    pub index: usize,
    /// Its process id.
    pub pid: u32,
    /// Exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Whether the runner stopped it (window over or time limit), rather than it ending
    /// by itself.
    pub stopped: bool,
    /// From the release to its end, seconds.
    pub seconds: f64,
    /// What it reported by line.
    pub units: Units,
    /// Its stdout file.
    pub stdout: PathBuf,
    /// Its stderr file.
    pub stderr: PathBuf,
}

/// Where a replica's count stood when a window opened ([`Batch::open_window`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// Units counted.
    pub count: u64,
}

impl ReplicaOutcome {
    /// Whether it ended by itself with status 0.
    pub fn succeeded(&self) -> bool {
        !self.stopped && self.code == Some(0)
    }
}

struct Replica {
    child: Child,
    units: Arc<Mutex<Units>>,
    exited: Arc<Mutex<Option<Instant>>>,
    stopped: bool,
    stdout: PathBuf,
    stderr: PathBuf,
}

/// N replicas, held at the gate until [`Batch::release`].
pub struct Batch {
    replicas: Vec<Replica>,
    gate: Option<OwnedFd>,
    released: Option<Instant>,
    /// The one thread reading every replica's report pipe, and what tells it to finish.
    reader: Option<(JoinHandle<()>, Arc<AtomicBool>)>,
}

impl Batch {
    /// Starts every replica through `gate_program` (`gpushare-agent`, run with
    /// `--bench-gate`); none runs its command before [`Batch::release`]. A replica that
    /// cannot be started stops the ones already started.
    pub fn spawn(gate_program: &Path, specs: Vec<ReplicaSpec>) -> io::Result<Batch> {
        let (gate_read, gate_write) = unix::pipe()?;
        let mut batch =
            Batch { replicas: Vec::new(), gate: Some(gate_write), released: None, reader: None };
        let total = specs.len();
        let mut reports = Vec::new();
        for (index, spec) in specs.into_iter().enumerate() {
            let (replica, report) = start_one(gate_program, &gate_read, index, total, spec)?;
            reports.push(ReportPipe::new(report, Arc::clone(&replica.units))?);
            batch.replicas.push(replica);
        }
        let finish = Arc::new(AtomicBool::new(false));
        let reader = {
            let finish = Arc::clone(&finish);
            std::thread::Builder::new()
                .name("bench-reports".into())
                .spawn(move || read_reports(reports, &finish))?
        };
        batch.reader = Some((reader, finish));
        Ok(batch)
    }

    /// Process ids, in replica order.
    pub fn pids(&self) -> Vec<u32> {
        self.replicas.iter().map(|r| r.child.id()).collect()
    }

    /// Lets every replica run its command, at once: one byte each on the gate.
    pub fn release(&mut self) -> io::Result<Instant> {
        let gate = self.gate.take().ok_or_else(|| io::Error::other("released twice"))?;
        let mut gate = File::from(gate);
        gate.write_all(&vec![b'g'; self.replicas.len()])?;
        let now = Instant::now();
        self.released = Some(now);
        Ok(now)
    }

    /// What each replica reported so far.
    pub fn units(&self) -> Vec<Units> {
        self.replicas.iter().map(|r| lock(&r.units).clone()).collect()
    }

    /// Opens a window: where each replica's count stands now. The latencies reported
    /// before it (warm-up) are dropped, so that the window's are all that is kept and
    /// [`Batch::close_window`] takes them without a copy.
    pub fn open_window(&self) -> Vec<Mark> {
        self.replicas
            .iter()
            .map(|r| {
                let mut u = lock(&r.units);
                u.latencies_ms.clear();
                Mark { count: u.count }
            })
            .collect()
    }

    /// Closes the window opened at `marks`: each replica's units since, and their
    /// latencies (taken out: the reader goes on into an empty list).
    pub fn close_window(&self, marks: &[Mark]) -> Vec<(u64, Vec<f64>)> {
        self.replicas
            .iter()
            .zip(marks)
            .map(|(r, mark)| {
                let mut u = lock(&r.units);
                let latencies = std::mem::take(&mut u.latencies_ms);
                (u.count.saturating_sub(mark.count), latencies)
            })
            .collect()
    }

    /// Units replica `index` reported so far (0 for an index out of range).
    pub fn unit_count(&self, index: usize) -> u64 {
        self.replicas.get(index).map_or(0, |r| lock(&r.units).count)
    }

    /// Whether replica `index` has ended.
    pub fn exited(&self, index: usize) -> bool {
        self.replicas.get(index).is_none_or(|r| lock(&r.exited).is_some())
    }

    /// How many replicas still run.
    pub fn running(&self) -> usize {
        self.replicas.iter().filter(|r| lock(&r.exited).is_none()).count()
    }

    /// Waits until every replica has ended or `deadline` passes; true when all ended.
    pub fn wait_until(&self, deadline: Instant) -> bool {
        loop {
            if self.running() == 0 {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            std::thread::sleep((deadline - now).min(Duration::from_millis(5)));
        }
    }

    /// Stops every replica still running: SIGTERM to its process group, SIGKILL after
    /// `grace`. Members a finished replica left behind get the same.
    pub fn stop(&mut self, grace: Duration) {
        for r in &mut self.replicas {
            r.stopped |= lock(&r.exited).is_none();
            let _ = unix::signal_group(r.child.id(), libc::SIGTERM);
        }
        let _ = self.wait_until(Instant::now() + grace);
        for r in &self.replicas {
            let _ = unix::signal_group(r.child.id(), libc::SIGKILL);
        }
    }

    /// Stops what still runs, reaps every replica and returns how each ended.
    pub fn finish(mut self, grace: Duration) -> Vec<ReplicaOutcome> {
        // Gates still waiting read end of file and exit without running the command.
        self.gate = None;
        self.stop(grace);
        let released = self.released;
        let reaped: Vec<_> = std::mem::take(&mut self.replicas)
            .into_iter()
            .enumerate()
            .map(|(index, mut r)| (index, r.child.wait(), r))
            .collect();
        // Every replica is reaped: what is left in the pipes is read, and the reader ends
        // even where a process a replica left behind still holds a pipe open.
        if let Some((reader, finish)) = self.reader.take() {
            finish.store(true, Ordering::SeqCst);
            let _ = reader.join();
        }
        reaped
            .into_iter()
            .map(|(index, status, r)| {
                let ended = lock(&r.exited).unwrap_or_else(Instant::now);
                let seconds = released
                    .map_or(0.0, |start| ended.saturating_duration_since(start).as_secs_f64());
                let (code, signal) = status.as_ref().map_or((None, None), split_status);
                ReplicaOutcome {
                    index,
                    pid: r.child.id(),
                    code,
                    signal,
                    stopped: r.stopped,
                    seconds,
                    units: lock(&r.units).clone(),
                    stdout: r.stdout,
                    stderr: r.stderr,
                }
            })
            .collect()
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // Never leave replicas behind: a batch dropped on an error path kills them all.
        self.gate = None;
        for r in &mut self.replicas {
            let _ = unix::signal_group(r.child.id(), libc::SIGKILL);
            let _ = r.child.wait();
        }
        if let Some((_, finish)) = &self.reader {
            finish.store(true, Ordering::SeqCst);
        }
    }
}

/// One replica's report pipe as the reader holds it: the read end (non-blocking), the
/// replica's counts, and a line begun in an earlier read.
struct ReportPipe {
    file: File,
    units: Arc<Mutex<Units>>,
    partial: Vec<u8>,
}

impl ReportPipe {
    fn new(read_end: OwnedFd, units: Arc<Mutex<Units>>) -> io::Result<ReportPipe> {
        unix::set_nonblocking(read_end.as_fd())?;
        Ok(ReportPipe { file: File::from(read_end), units, partial: Vec::new() })
    }

    /// Counts the complete lines of `chunk` (after the partial line before it) under one
    /// lock; keeps the incomplete rest for the next read. A line that is a plain decimal
    /// and its newline is read in one pass; anything else goes through
    /// [`Units::add_bytes`].
    fn take(&mut self, chunk: &[u8], at: Instant) {
        let mut units = lock(&self.units);
        let mut rest = chunk;
        if !self.partial.is_empty() {
            let Some(nl) = memchr::memchr(b'\n', rest) else {
                self.partial.extend_from_slice(rest);
                return;
            };
            self.partial.extend_from_slice(&rest[..nl]);
            units.add_bytes(&self.partial, at);
            self.partial.clear();
            rest = &rest[nl + 1..];
        }
        while !rest.is_empty() {
            if let Some((ms, len)) = decimal_prefix(rest)
                && rest.get(len) == Some(&b'\n')
            {
                units.add_latency(ms, at);
                rest = &rest[len + 1..];
                continue;
            }
            let Some(nl) = memchr::memchr(b'\n', rest) else {
                self.partial.extend_from_slice(rest);
                return;
            };
            units.add_bytes(&rest[..nl], at);
            rest = &rest[nl + 1..];
        }
    }

    /// Reads what the pipe holds now: whether more may be waiting (a full read), and
    /// whether the pipe is still open.
    fn read_now(&mut self, buffer: &mut [u8]) -> (bool, bool) {
        match self.file.read(buffer) {
            Ok(0) => {
                self.end();
                (false, false)
            }
            Ok(n) => {
                self.take(&buffer[..n], Instant::now());
                (n >= buffer.len() / 4, true)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => (false, true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => (true, true),
            Err(_) => {
                self.end();
                (false, false)
            }
        }
    }

    /// A last line without its newline still counts.
    fn end(&mut self) {
        if !self.partial.is_empty() {
            let line = String::from_utf8_lossy(&self.partial).into_owned();
            lock(&self.units).add_line(&line, Instant::now());
            self.partial.clear();
        }
    }
}

/// The reader of every replica's report pipe, on one thread: each pass reads what every
/// pipe holds; with no backlog it waits [`REPORT_READ_PAUSE`] before the next. Each wake-up
/// costs the agent more than the lines it brings (on the H100 host a reader thread per
/// replica, each waking 40 times a second, cost 0.11 % of a core per replica), so one
/// thread serves them all. Ends when every pipe is closed, or once `finish` is set (every
/// replica reaped) after a last pass.
fn read_reports(mut pipes: Vec<ReportPipe>, finish: &AtomicBool) {
    let mut buffer = vec![0u8; REPORT_READ_BYTES];
    while !pipes.is_empty() {
        let last = finish.load(Ordering::SeqCst);
        let mut backlog = false;
        pipes.retain_mut(|pipe| {
            let (more, open) = pipe.read_now(&mut buffer);
            backlog |= more;
            open
        });
        if last && !backlog {
            pipes.iter_mut().for_each(ReportPipe::end);
            return;
        }
        if !backlog {
            std::thread::sleep(REPORT_READ_PAUSE);
        }
    }
}

fn start_one(
    gate_program: &Path,
    gate_read: &OwnedFd,
    index: usize,
    total: usize,
    spec: ReplicaSpec,
) -> io::Result<(Replica, OwnedFd)> {
    let stdout = spec.log_dir.join(format!("replica-{index}.out"));
    let stderr = spec.log_dir.join(format!("replica-{index}.err"));
    let (report_read, report_write) = unix::pipe()?;
    // Room for a busy replica's lines while the reader pauses (see the reader below): a
    // replica must never block on its reports. Smaller where the host allows less.
    // (A pause of REPORT_READ_PAUSE at 8 MB/s of reports fills 400 KB of it.)
    let _ = unix::set_pipe_size(&report_write, REPORT_PIPE_BYTES);
    let mut command = Command::new(gate_program);
    command
        .arg("--bench-gate")
        .arg(gate_read.as_raw_fd().to_string())
        .arg(report_write.as_raw_fd().to_string());
    if let Some(cwd) = &spec.cwd {
        command.arg("--bench-cwd").arg(cwd);
    }
    if spec.clear_env {
        command.env_clear();
    }
    command
        .arg("--")
        .args(&spec.command)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .env(REPLICA_ENV, index.to_string())
        .env(REPLICAS_ENV, total.to_string())
        .stdin(Stdio::null())
        .stdout(File::create(&stdout)?)
        .stderr(File::create(&stderr)?)
        .process_group(0);
    unix::prepare_child(
        &mut command,
        spec.identity,
        vec![gate_read.as_raw_fd(), report_write.as_raw_fd()],
    );
    let child = command.spawn()?;
    // Only the replica holds the write end now: end of file comes when it (and anything
    // it started) is done.
    drop(report_write);
    let units = Arc::new(Mutex::new(Units::default()));
    let exited = Arc::new(Mutex::new(None));
    {
        let (exited, pid) = (Arc::clone(&exited), child.id());
        std::thread::Builder::new().name(format!("bench-exit-{index}")).spawn(move || {
            let _ = unix::wait_exit_keeping_zombie(pid);
            *lock(&exited) = Some(Instant::now());
        })?;
    }
    Ok((Replica { child, units, exited, stopped: false, stdout, stderr }, report_read))
}

/// The value of `digits[.digits]` with at most 15 digits in all (optionally with spaces
/// or a carriage return around it), or `None` for anything else, which `str::parse` then
/// reads. Up to 15 digits the mantissa and the power of ten are exact doubles, so their
/// quotient is the correctly rounded value, the same double `str::parse` gives (Clinger's
/// fast path): a report line costs a few nanoseconds instead of a general parse.
fn plain_decimal(line: &[u8]) -> Option<f64> {
    let line = line.trim_ascii();
    decimal_prefix(line).filter(|&(_, len)| len == line.len()).map(|(value, _)| value)
}

/// The plain decimal at the start of `bytes` (see [`plain_decimal`]) and how many bytes
/// it takes; `None` when there is none or it has more than 15 digits.
fn decimal_prefix(bytes: &[u8]) -> Option<(f64, usize)> {
    const POWERS: [f64; 16] =
        [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15];
    let (mut mantissa, mut digits, mut scale, mut seen_dot) = (0u64, 0usize, 0usize, false);
    let mut len = 0;
    for &b in bytes {
        match b {
            b'0'..=b'9' => {
                if digits == 15 {
                    return None;
                }
                mantissa = mantissa * 10 + u64::from(b - b'0');
                digits += 1;
                scale += usize::from(seen_dot);
            }
            b'.' if !seen_dot => seen_dot = true,
            _ => break,
        }
        len += 1;
    }
    if digits == 0 {
        return None;
    }
    // Lossless: below 10^15 < 2^53.
    #[allow(clippy::cast_precision_loss)]
    Some((mantissa as f64 / POWERS[scale], len))
}

fn split_status(status: &ExitStatus) -> (Option<i32>, Option<i32>) {
    use std::os::unix::process::ExitStatusExt;
    (status.code(), status.signal())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_decimals_read_as_str_parse_reads_them() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..200_000 {
            // xorshift: mantissas of every length, dots anywhere.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let digits = (x % 15 + 1) as usize;
            let text = format!("{:0width$}", x % 10u64.pow(digits as u32), width = digits);
            let dot = (x >> 40) as usize % (digits + 1);
            let line =
                if dot == digits { text } else { format!("{}.{}", &text[..dot], &text[dot..]) };
            let expected: f64 = line.parse().unwrap();
            assert_eq!(plain_decimal(line.as_bytes()), Some(expected), "{line}");
        }
        assert_eq!(plain_decimal(b" 12.5\r"), Some(12.5));
        for other in [&b""[..], b".", b"1.2.3", b"-1", b"1e3", b"NaN", b"12,5", b"1234567890123456"]
        {
            assert_eq!(plain_decimal(other), None, "{}", String::from_utf8_lossy(other));
        }
    }

    #[test]
    fn report_lines_are_units_with_or_without_latency() {
        let mut units = Units::default();
        let now = Instant::now();
        for line in ["12.5\n", "\n", " 3 \n", "oops\n", "-1\n", "NaN\n", "0\n"] {
            units.add_line(line, now);
        }
        assert_eq!(units.count, 4);
        assert_eq!(units.latencies_ms, [12.5, 3.0, 0.0]);
        assert_eq!(units.malformed, 3);
        assert_eq!(units.first_malformed.as_deref(), Some("oops"));
        assert_eq!(units.first_at, Some(now));
    }

    /// Feeds `text` to a report reader in the given pieces, then ends the pipe.
    fn read_in_pieces(text: &[u8], pieces: &[&[u8]], now: Instant) -> Units {
        let (read_end, _write_end) = unix::pipe().unwrap();
        let units = Arc::new(Mutex::new(Units::default()));
        let mut pipe = ReportPipe::new(read_end, Arc::clone(&units)).unwrap();
        assert_eq!(pieces.concat(), text);
        for piece in pieces {
            pipe.take(piece, now);
        }
        pipe.end();
        lock(&units).clone()
    }

    #[test]
    fn report_lines_count_the_same_however_reads_split_them() {
        let now = Instant::now();
        let text: &[u8] = b"0.0337\n12.5\n\n 3 \r\n12.5 ms\n7.\n1234567890123456\noops\n0.25\r\n42";
        let mut expected = Units::default();
        for line in String::from_utf8_lossy(text).split('\n') {
            expected.add_line(line, now);
        }
        assert_eq!(expected.count, 8, "{expected:?}");
        assert_eq!(read_in_pieces(text, &[text], now), expected);
        for cut in 0..=text.len() {
            let got = read_in_pieces(text, &[&text[..cut], &text[cut..]], now);
            assert_eq!(got, expected, "split at {cut}");
        }
        let bytes: Vec<&[u8]> = text.chunks(3).collect();
        assert_eq!(read_in_pieces(text, &bytes, now), expected);
    }

    /// A reader thread on one report pipe: its writer, the replica's counts, the flag
    /// that tells the reader to finish, and the thread.
    struct Reading {
        writer: File,
        units: Arc<Mutex<Units>>,
        finish: Arc<AtomicBool>,
        thread: JoinHandle<()>,
    }

    fn start_reading() -> Reading {
        let (read_end, write_end) = unix::pipe().unwrap();
        let units = Arc::new(Mutex::new(Units::default()));
        let pipe = ReportPipe::new(read_end, Arc::clone(&units)).unwrap();
        let finish = Arc::new(AtomicBool::new(false));
        let thread = {
            let finish = Arc::clone(&finish);
            std::thread::spawn(move || read_reports(vec![pipe], &finish))
        };
        Reading { writer: File::from(write_end), units, finish, thread }
    }

    #[test]
    fn a_report_pipe_is_read_until_its_writer_is_gone() {
        let Reading { mut writer, units, finish: _, thread } = start_reading();
        writer.write_all(b"1.5\n2.5\n3").unwrap();
        drop(writer);
        thread.join().unwrap();
        assert_eq!(lock(&units).latencies_ms, [1.5, 2.5, 3.0]);
    }

    #[test]
    fn the_reader_finishes_when_told_although_a_pipe_stays_open() {
        // A process a replica left behind holds the write end.
        let Reading { mut writer, units, finish, thread } = start_reading();
        writer.write_all(b"4\n5").unwrap();
        finish.store(true, Ordering::SeqCst);
        thread.join().unwrap();
        assert_eq!(lock(&units).latencies_ms, [4.0, 5.0]);
        drop(writer);
    }
}
