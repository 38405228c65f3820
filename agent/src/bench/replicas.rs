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
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
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
const REPORT_READ_PAUSE: Duration = Duration::from_millis(25);

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
    /// Adds what `later` counted after these.
    fn merge(&mut self, later: Units) {
        self.count += later.count;
        self.latencies_ms.extend(later.latencies_ms);
        self.malformed += later.malformed;
        if self.first_at.is_none() {
            self.first_at = later.first_at;
        }
        if self.first_malformed.is_none() {
            self.first_malformed = later.first_malformed;
        }
    }

    /// Counts one report line as the reader has it, bytes without the newline. Most lines
    /// are plain decimals (`0.0337`): those are read here directly, the rest as text.
    fn add_bytes(&mut self, line: &[u8], at: Instant) {
        match plain_decimal(line) {
            Some(ms) => {
                self.count += 1;
                self.first_at.get_or_insert(at);
                self.latencies_ms.push(ms);
            }
            // Invalid UTF-8 counts as malformed.
            None => self.add_line(std::str::from_utf8(line).unwrap_or("\u{fffd}"), at),
        }
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

/// Where a replica's reports stood at an instant ([`Batch::marks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// Units counted.
    pub count: u64,
    /// Latencies kept.
    pub latencies: usize,
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
    reader: Option<JoinHandle<()>>,
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
}

impl Batch {
    /// Starts every replica through `gate_program` (`gpushare-agent`, run with
    /// `--bench-gate`); none runs its command before [`Batch::release`]. A replica that
    /// cannot be started stops the ones already started.
    pub fn spawn(gate_program: &Path, specs: Vec<ReplicaSpec>) -> io::Result<Batch> {
        let (gate_read, gate_write) = unix::pipe()?;
        let mut batch = Batch { replicas: Vec::new(), gate: Some(gate_write), released: None };
        let total = specs.len();
        for (index, spec) in specs.into_iter().enumerate() {
            let replica = start_one(gate_program, &gate_read, index, total, spec)?;
            batch.replicas.push(replica);
        }
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

    /// Where each replica's reports stand now, to measure a window from: units counted
    /// and latencies kept.
    pub fn marks(&self) -> Vec<Mark> {
        self.replicas
            .iter()
            .map(|r| {
                let u = lock(&r.units);
                Mark { count: u.count, latencies: u.latencies_ms.len() }
            })
            .collect()
    }

    /// What each replica reported since `marks`: its units, and their latencies (only
    /// those are copied, not everything a replica reported before).
    pub fn since(&self, marks: &[Mark]) -> Vec<(u64, Vec<f64>)> {
        self.replicas
            .iter()
            .zip(marks)
            .map(|(r, mark)| {
                let u = lock(&r.units);
                let fresh = u.latencies_ms.get(mark.latencies..).unwrap_or_default();
                (u.count.saturating_sub(mark.count), fresh.to_vec())
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
        let replicas = std::mem::take(&mut self.replicas);
        replicas
            .into_iter()
            .enumerate()
            .map(|(index, mut r)| {
                let status = r.child.wait();
                if let Some(reader) = r.reader.take() {
                    let _ = reader.join();
                }
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
    }
}

fn start_one(
    gate_program: &Path,
    gate_read: &OwnedFd,
    index: usize,
    total: usize,
    spec: ReplicaSpec,
) -> io::Result<Replica> {
    let stdout = spec.log_dir.join(format!("replica-{index}.out"));
    let stderr = spec.log_dir.join(format!("replica-{index}.err"));
    let (report_read, report_write) = unix::pipe()?;
    // Room for a busy replica's lines while the reader pauses (see the reader below): a
    // replica must never block on its reports. Smaller where the host allows less.
    // (A pause of REPORT_READ_PAUSE at 8 MB/s of reports fills 200 KB of it.)
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
    let reader = {
        let units = Arc::clone(&units);
        std::thread::Builder::new().name(format!("bench-report-{index}")).spawn(move || {
            // A fast replica reports tens of thousands of lines a second: each read's
            // complete lines are counted into a local batch, merged under the lock once.
            let mut reader = BufReader::with_capacity(REPORT_READ_BYTES, File::from(report_read));
            let mut partial: Vec<u8> = Vec::new();
            loop {
                let chunk = match reader.fill_buf() {
                    Ok([]) | Err(_) => break,
                    Ok(chunk) => chunk,
                };
                let now = Instant::now();
                let mut batch = Units::default();
                let mut rest = chunk;
                while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
                    let line = if partial.is_empty() {
                        &rest[..nl]
                    } else {
                        partial.extend_from_slice(&rest[..nl]);
                        &partial[..]
                    };
                    batch.add_bytes(line, now);
                    partial.clear();
                    rest = &rest[nl + 1..];
                }
                partial.extend_from_slice(rest);
                let used = chunk.len();
                reader.consume(used);
                lock(&units).merge(batch);
                // Each wake-up costs the agent more than the lines it brings: with no
                // backlog, let lines gather for a moment (a replica flushing every 10 ms
                // would otherwise wake the agent 100 times a second). A backlog of a
                // quarter of the read buffer is read again at once.
                if used < REPORT_READ_BYTES / 4 {
                    std::thread::sleep(REPORT_READ_PAUSE);
                }
            }
            if !partial.is_empty() {
                let mut batch = Units::default();
                batch.add_line(&String::from_utf8_lossy(&partial), Instant::now());
                lock(&units).merge(batch);
            }
        })?
    };
    let exited = Arc::new(Mutex::new(None));
    {
        let (exited, pid) = (Arc::clone(&exited), child.id());
        std::thread::Builder::new().name(format!("bench-exit-{index}")).spawn(move || {
            let _ = unix::wait_exit_keeping_zombie(pid);
            *lock(&exited) = Some(Instant::now());
        })?;
    }
    Ok(Replica { child, units, reader: Some(reader), exited, stopped: false, stdout, stderr })
}

/// The value of `digits[.digits]` with at most 15 digits in all (optionally with spaces
/// or a carriage return around it), or `None` for anything else, which `str::parse` then
/// reads. Up to 15 digits the mantissa and the power of ten are exact doubles, so their
/// quotient is the correctly rounded value, the same double `str::parse` gives (Clinger's
/// fast path): a report line costs a few nanoseconds instead of a general parse.
fn plain_decimal(line: &[u8]) -> Option<f64> {
    const POWERS: [f64; 16] =
        [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15];
    let line = line.trim_ascii();
    let (mut mantissa, mut digits, mut scale, mut seen_dot) = (0u64, 0usize, 0usize, false);
    for &b in line {
        match b {
            b'0'..=b'9' => {
                mantissa = mantissa * 10 + u64::from(b - b'0');
                digits += 1;
                scale += usize::from(seen_dot);
            }
            b'.' if !seen_dot => seen_dot = true,
            _ => return None,
        }
        if digits > 15 {
            return None;
        }
    }
    if digits == 0 {
        return None;
    }
    // Lossless: below 10^15 < 2^53.
    #[allow(clippy::cast_precision_loss)]
    Some(mantissa as f64 / POWERS[scale])
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
}
