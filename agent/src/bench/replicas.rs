//! The one runner of replicas: N copies of a command, each started through its own gate
//! ([`super::gate`], launched by [`super::launch`]) as the caller, all held until every
//! gate is ready and then let go together, each measured through its report pipe and
//! followed through its control socket ([`super::control`]).
//!
//! The units-by-line method: every line a replica writes to the descriptor named by
//! `GPUSHARE_BENCH_REPORT` (always 3) is one completed unit of work; a line holding a
//! number is that unit's latency in milliseconds (`12.7`), an empty line a unit without
//! one. Anything else is counted as malformed, never as a unit. What the agent keeps of it
//! is bounded whatever a replica writes: a line longer than [`REPORT_LINE_MAX`] is one
//! malformed line, and latencies are a uniform sample of at most [`LATENCIES_KEPT`].

use std::fs::File;
use std::io::{self, Read};
use std::net::Shutdown;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::control::{self, FromGate, Logs, ToGate};
use super::launch::{Gate, GateStart, Launcher};
use crate::apply::journal::ReplicaHandle;
use crate::sys::unix::{self, Identity};

/// The variable naming the report descriptor (a decimal descriptor number).
pub const REPORT_ENV: &str = "GPUSHARE_BENCH_REPORT";
/// The variable holding the replica's number, from 0.
pub const REPLICA_ENV: &str = "GPUSHARE_BENCH_REPLICA";
/// The variable holding how many replicas run together.
pub const REPLICAS_ENV: &str = "GPUSHARE_BENCH_REPLICAS";

/// The longest report line read as one; a longer one is one malformed line.
pub const REPORT_LINE_MAX: usize = 4096;
/// The most latencies kept of one replica (a uniform sample of those reported).
pub const LATENCIES_KEPT: usize = 65_536;

/// The report pipe's capacity asked for.
const REPORT_PIPE_BYTES: usize = 1 << 20;
/// What the reader of a report pipe takes at once.
const REPORT_READ_BYTES: usize = 256 << 10;
/// How long the reader of a report pipe without a backlog waits before reading again.
const REPORT_READ_PAUSE: Duration = Duration::from_millis(50);
/// How long a replica's gate may take to say it is ready (a unit to start, the
/// directories and the command checked, the log files opened).
const READY_WITHIN: Duration = Duration::from_secs(60);
/// How long the check gate may take to say it is ready, before the bench takes the apply
/// lock: a process start (under systemd a unit's, tens of milliseconds; seconds only for a
/// PID 1 under load) and a handful of system calls as the caller (an automounted or NFS
/// home may take a second or two). What it costs is the caller's alone: the lock is not
/// held meanwhile.
pub const CHECK_WITHIN: Duration = Duration::from_secs(5);
/// How long gates get beyond their grace to end before the launcher's last resort, and
/// again after it.
const STOP_SLACK: Duration = Duration::from_secs(2);
/// How often the runner looks at its gates while it waits for them.
const LOOK: Duration = Duration::from_millis(5);
/// The longest a message to a gate may take to go out.
const SEND_WITHIN: Duration = Duration::from_secs(10);
/// The most passes the report reader makes once every gate is gone: what a pipe still
/// held is read (1 MiB takes four), but a writer that escaped cannot keep it reading.
const LAST_PASSES: u32 = 8;

/// A request to stop a bench early (Ctrl-C of its client, its client gone, SIGTERM to the
/// agent), shared by the engine, the transport and the blocking runner. A window sleeps on it in one wait
/// (a cancel wakes it): the agent's CPU over a window is what measuring costs, so nothing
/// polls.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<(Mutex<bool>, Condvar, Mutex<Option<String>>)>);

impl Cancel {
    /// Asks the bench to stop.
    pub fn cancel(&self) {
        let (flag, woken, _) = &*self.0;
        *flag.lock().unwrap_or_else(PoisonError::into_inner) = true;
        woken.notify_all();
    }

    /// Asks the bench to stop, saying why (the first reason given is kept): its error is
    /// then `why` rather than `cancelled`.
    pub fn cancel_because(&self, why: String) {
        self.0.2.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(why);
        self.cancel();
    }

    /// Why it was cancelled: the reason given, else `cancelled`.
    pub fn reason(&self) -> String {
        let why = self.0.2.lock().unwrap_or_else(PoisonError::into_inner).clone();
        why.unwrap_or_else(|| "cancelled".into())
    }

    /// Whether it was asked to.
    pub fn is_cancelled(&self) -> bool {
        *self.0.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sleeps until `deadline` or a cancel, whichever is first; true when cancelled.
    pub fn sleep_until(&self, deadline: Instant) -> bool {
        let (flag, woken, _) = &*self.0;
        let mut cancelled = flag.lock().unwrap_or_else(PoisonError::into_inner);
        while !*cancelled {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            cancelled = woken
                .wait_timeout(cancelled, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }
}

/// One replica to start.
#[derive(Debug, Clone)]
pub struct ReplicaSpec {
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Its whole environment; the runner adds `GPUSHARE_BENCH_REPLICA(S)`, the gate
    /// `GPUSHARE_BENCH_REPORT`.
    pub env: Vec<(String, String)>,
    /// Its working directory (absolute; entered by the gate as the caller).
    pub cwd: String,
    /// Where its output goes (the gate writes it, as the caller).
    pub logs: Option<Logs>,
    /// The CPUs it is pinned to (its gate binds itself, as the caller, before it starts
    /// the command, and refuses a set the caller may not use); `None`: unpinned.
    pub cpus: Option<Vec<u32>>,
}

/// How the replicas of a batch are started.
#[derive(Debug, Clone, Copy)]
pub struct Launch<'a> {
    /// Who starts their gates.
    pub launcher: &'a Launcher,
    /// The gate's program (this binary).
    pub program: &'a Path,
    /// Whom they run as; `None`: as the agent.
    pub identity: Option<&'a Identity>,
    /// Names their units: the job's number.
    pub label: &'a str,
    /// The longest a replica's unit may live.
    pub runtime_max: Duration,
    /// Cancels the start too (gates that take long to get ready).
    pub cancel: Option<&'a Cancel>,
}

impl Launch<'_> {
    /// The user the replicas run as.
    fn uid(&self) -> u32 {
        self.identity.map_or_else(unix::effective_uid, |i| i.uid)
    }

    /// Starts one gate for `spec` and sends it; the gate is then held by `replica`.
    fn start(
        &self,
        spec: control::Spec,
        report: OwnedFd,
        description: String,
        seed: u64,
    ) -> Result<Replica, String> {
        let (mut agent_end, gate_end) =
            UnixStream::pair().map_err(|e| format!("a control socket: {e}"))?;
        // A gate its user stopped (SIGSTOP) must not hold the agent in a write.
        agent_end
            .set_write_timeout(Some(SEND_WITHIN))
            .map_err(|e| format!("a control socket: {e}"))?;
        let gate = self.launcher.start(GateStart {
            program: self.program,
            identity: self.identity,
            control: OwnedFd::from(gate_end),
            report,
            label: self.label,
            description,
            runtime_max: self.runtime_max,
        })?;
        let state = Arc::new(Mutex::new(GateState::default()));
        let units = Units { latencies: Sample::seeded(seed), ..Units::default() };
        let mut replica = Replica {
            gate: Some(gate),
            control: agent_end.try_clone().map_err(|e| format!("a control socket: {e}"))?,
            state: Arc::clone(&state),
            follower: None,
            units: Arc::new(Mutex::new(units)),
            stopped: false,
        };
        control::send(&mut agent_end, &ToGate::Spec(spec))
            .map_err(|e| format!("sending the replica's spec: {e}"))?;
        replica.follower = Some(
            std::thread::Builder::new()
                .name("bench-gate".into())
                .spawn(move || follow_gate(agent_end, &state))
                .map_err(|e| format!("a thread for the replica: {e}"))?,
        );
        Ok(replica)
    }
}

/// Checks `spec` as the caller, in the caller's world, through one gate in check mode:
/// the directory, the command, the log directory. Nothing else is started. Blocking; ends
/// within [`CHECK_WITHIN`] (and at once on `launch.cancel`): a gate that has not answered by
/// then (stopped, or slow) is killed.
pub fn check(launch: &Launch<'_>, spec: ReplicaSpec) -> Result<(), String> {
    let (_report_read, report_write) = unix::pipe().map_err(|e| format!("a pipe: {e}"))?;
    let spec = control::Spec {
        check_only: true,
        argv: spec.command,
        env: spec.env,
        cwd: spec.cwd,
        logs: spec.logs,
        cpus: spec.cpus,
    };
    let replica =
        launch.start(spec, report_write, format!("gpushare bench {}: check", launch.label), 0)?;
    let batch = Batch { launch: *launch, replicas: vec![replica], released: None, reader: None };
    match batch.wait_ready(Instant::now() + CHECK_WITHIN, CHECK_WITHIN) {
        Ok(()) => {
            let _ = batch.finish(Duration::ZERO);
            Ok(())
        }
        // Killed at once (dropping the batch): nothing of a check is worth waiting for.
        Err(why) if why.starts_with("the replicas' gates were not ready") => Err(format!(
            "the check of the directory and the command as you did not answer within {} s (a process of yours stopped or slow?)",
            CHECK_WITHIN.as_secs()
        )),
        Err(why) => Err(why),
    }
}

/// A uniform sample of at most [`LATENCIES_KEPT`] latencies of all those added
/// (reservoir sampling, Algorithm R), and how many were added.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    kept: Vec<f64>,
    seen: u64,
    random: u64,
}

impl Default for Sample {
    fn default() -> Self {
        Sample { kept: Vec::new(), seen: 0, random: 0x9E37_79B9_7F4A_7C15 }
    }
}

impl Sample {
    /// An empty sample whose choices follow `seed` (a replica's own).
    pub fn seeded(seed: u64) -> Sample {
        let random = Sample::default().random ^ seed.wrapping_mul(0xA24B_AED4_963E_E407);
        // Never zero, which xorshift cannot leave.
        Sample { random: random | 1, ..Sample::default() }
    }

    /// Adds one latency.
    pub fn push(&mut self, ms: f64) {
        self.seen += 1;
        if self.kept.len() < LATENCIES_KEPT {
            self.kept.push(ms);
        } else {
            let j = self.next_random() % self.seen;
            if let Some(slot) = usize::try_from(j).ok().and_then(|j| self.kept.get_mut(j)) {
                *slot = ms;
            }
        }
    }

    /// The latencies kept.
    pub fn kept(&self) -> &[f64] {
        &self.kept
    }

    /// How many were added.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// Forgets every latency (the warm-up before a window).
    pub fn clear(&mut self) {
        self.kept.clear();
        self.seen = 0;
    }

    /// xorshift64*: enough for choosing slots.
    fn next_random(&mut self) -> u64 {
        let mut x = self.random;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.random = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A uniform subsample of `n` of the kept latencies (all of them when `n` is not
    /// smaller), in no particular order.
    fn subsample(mut self, n: usize) -> Vec<f64> {
        let len = self.kept.len();
        if n >= len {
            return self.kept;
        }
        // The first n places of a partial Fisher-Yates shuffle.
        for i in 0..n {
            let span = (len - i) as u64;
            let j = i + usize::try_from(self.next_random() % span).unwrap_or(0);
            self.kept.swap(i, j);
        }
        self.kept.truncate(n);
        self.kept
    }
}

/// The latencies of several replicas thinned to one sampling rate (the lowest among
/// them), so that pooled together each replica weighs by the units it reported; where
/// nothing was sampled away, everything kept.
pub fn at_common_rate(samples: Vec<Sample>) -> Vec<Vec<f64>> {
    let rate = samples
        .iter()
        .filter(|s| s.seen > 0)
        .map(|s| s.kept.len() as f64 / s.seen as f64)
        .fold(1.0_f64, f64::min);
    samples
        .into_iter()
        .map(|s| {
            // Lossless below 2^53 units.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let n = (rate * s.seen as f64).round() as usize;
            s.subsample(n)
        })
        .collect()
}

/// What a replica reported so far by line.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Units {
    /// Completed units.
    pub count: u64,
    /// Latencies of the units that gave one, ms: a sample of them.
    pub latencies: Sample,
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
        self.latencies.push(ms);
    }

    /// Counts a malformed line; the first is kept (its first 200 characters).
    fn add_malformed(&mut self, line: &str) {
        self.malformed += 1;
        if self.first_malformed.is_none() {
            self.first_malformed = Some(line.chars().take(200).collect());
        }
    }

    /// Counts one report line.
    pub fn add_line(&mut self, line: &str, at: Instant) {
        let line = line.trim();
        if line.is_empty() {
            self.count += 1;
            self.first_at.get_or_insert(at);
            return;
        }
        match line.parse::<f64>() {
            Ok(ms) if ms.is_finite() && ms >= 0.0 => self.add_latency(ms, at),
            _ => self.add_malformed(line),
        }
    }
}

/// How a replica ended.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaOutcome {
    /// Its number, from 0.
    pub index: usize,
    /// Its command's process id (0 when it never ran).
    pub pid: u32,
    /// Exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Whether the runner stopped it (window over, time limit, cancel), rather than it
    /// ending by itself.
    pub stopped: bool,
    /// From the release to its end, seconds.
    pub seconds: f64,
    /// What it reported by line.
    pub units: Units,
    /// The end of its standard output.
    pub stdout_tail: String,
    /// The end of its standard error.
    pub stderr_tail: String,
    /// Output beyond its log files' cap, dropped.
    pub dropped_bytes: u64,
    /// What went wrong around it (its command could not run, its gate ended without a
    /// status), if something did.
    pub problem: Option<String>,
}

impl ReplicaOutcome {
    /// Whether it ended by itself with status 0.
    pub fn succeeded(&self) -> bool {
        !self.stopped && self.code == Some(0)
    }
}

/// Where a replica's count stood when a window opened ([`Batch::open_window`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// Units counted.
    pub count: u64,
}

/// What a gate has said.
#[derive(Debug, Default)]
struct GateState {
    ready: bool,
    refused: Option<String>,
    pid: Option<u32>,
    not_run: Option<String>,
    exited: Option<(Instant, Option<i32>, Option<i32>)>,
    done: Option<(String, String, u64)>,
    /// When its socket ended (the gate, and under systemd its unit, are gone).
    ended: Option<Instant>,
    /// A frame that broke the protocol.
    broken: Option<String>,
    /// The first line of its command's stdout that is a plain number.
    stdout_number: Option<String>,
}

/// Reads a gate's messages until its socket ends.
fn follow_gate(mut stream: UnixStream, state: &Mutex<GateState>) {
    loop {
        let message = control::receive::<FromGate>(&mut stream, control::FROM_GATE_MAX);
        let now = Instant::now();
        let mut s = lock(state);
        match message {
            Ok(Some(FromGate::Ready)) => s.ready = true,
            Ok(Some(FromGate::Refused { why })) => s.refused = Some(why),
            Ok(Some(FromGate::Running { pid })) => s.pid = Some(pid),
            Ok(Some(FromGate::NotRun { why })) => s.not_run = Some(why),
            Ok(Some(FromGate::StdoutNumber { line })) => {
                // Bounded here too: the gate is the caller's process.
                let line = gpushare_proto::byte_prefix(&line, control::STDOUT_NUMBER_MAX);
                s.stdout_number.get_or_insert_with(|| line.to_string());
            }
            Ok(Some(FromGate::Exited { code, signal })) => {
                s.exited.get_or_insert((now, code, signal));
            }
            Ok(Some(FromGate::Done { stdout_tail, stderr_tail, dropped_bytes })) => {
                s.done = Some((stdout_tail, stderr_tail, dropped_bytes));
            }
            Ok(None) => {
                s.ended = Some(now);
                return;
            }
            // The gate's end closed with a message it never read (a `Stop` that crossed
            // its last words): as good as an end of file.
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                s.ended = Some(now);
                return;
            }
            Err(e) => {
                s.broken = Some(format!("its gate broke the protocol: {e}"));
                s.ended = Some(now);
                return;
            }
        }
    }
}

struct Replica {
    gate: Option<Gate>,
    /// The agent's end of the control socket, for sending.
    control: UnixStream,
    state: Arc<Mutex<GateState>>,
    follower: Option<JoinHandle<()>>,
    units: Arc<Mutex<Units>>,
    stopped: bool,
}

impl Replica {
    fn send(&mut self, message: &ToGate) -> io::Result<()> {
        control::send(&mut self.control, message)
    }

    /// Whether its command has ended (or its gate, without saying).
    fn has_ended(&self) -> bool {
        let s = lock(&self.state);
        s.exited.is_some() || s.ended.is_some()
    }

    /// Whether its gate is gone.
    fn gone(&self) -> bool {
        lock(&self.state).ended.is_some()
    }

    /// Whether its gate has nothing left to do (it said `Done`, or it is gone).
    fn finished(&self) -> bool {
        let s = lock(&self.state);
        s.done.is_some() || s.ended.is_some()
    }
}

/// N replicas, held at their gates until [`Batch::release`].
pub struct Batch<'a> {
    launch: Launch<'a>,
    replicas: Vec<Replica>,
    released: Option<Instant>,
    /// The one thread reading every replica's report pipe, and what tells it to finish.
    reader: Option<(JoinHandle<()>, Arc<AtomicBool>)>,
}

impl<'a> Batch<'a> {
    /// Starts every replica's gate and waits until all are ready (each checked its spec
    /// as the caller); none runs its command before [`Batch::release`]. A gate that
    /// refuses or never gets ready fails the start, and stops the others.
    pub fn spawn(launch: Launch<'a>, specs: Vec<ReplicaSpec>) -> Result<Batch<'a>, String> {
        let mut batch = Batch { launch, replicas: Vec::new(), released: None, reader: None };
        let total = specs.len();
        let mut reports = Vec::new();
        for (index, spec) in specs.into_iter().enumerate() {
            let (report_read, report_write) = unix::pipe().map_err(|e| format!("a pipe: {e}"))?;
            // Room for a busy replica's lines while the reader pauses (see the reader
            // below): a replica must never block on its reports. Smaller where the host
            // allows less. (A pause of REPORT_READ_PAUSE at 8 MB/s of reports fills 400 KB.)
            let _ = unix::set_pipe_size(&report_write, REPORT_PIPE_BYTES);
            let mut env = spec.env;
            env.push((REPLICA_ENV.into(), index.to_string()));
            env.push((REPLICAS_ENV.into(), total.to_string()));
            let spec = control::Spec {
                check_only: false,
                argv: spec.command,
                env,
                cwd: spec.cwd,
                logs: spec.logs,
                cpus: spec.cpus,
            };
            let description =
                format!("gpushare bench {}: replica {index} of {total}", launch.label);
            let replica = launch.start(spec, report_write, description, index as u64)?;
            reports.push(
                ReportPipe::new(report_read, Arc::clone(&replica.units))
                    .map_err(|e| format!("a pipe: {e}"))?,
            );
            batch.replicas.push(replica);
        }
        batch.wait_ready(Instant::now() + READY_WITHIN, READY_WITHIN)?;
        let finish = Arc::new(AtomicBool::new(false));
        let reader = {
            let finish = Arc::clone(&finish);
            std::thread::Builder::new()
                .name("bench-reports".into())
                .spawn(move || read_reports(reports, &finish))
                .map_err(|e| format!("a thread for the reports: {e}"))?
        };
        batch.reader = Some((reader, finish));
        Ok(batch)
    }

    /// Waits until every gate said it is ready; the first refusal, or a gate that ended
    /// or stayed silent until `deadline` (`within` from the start), is the error.
    fn wait_ready(&self, deadline: Instant, within: Duration) -> Result<(), String> {
        loop {
            let mut all = true;
            for (index, r) in self.replicas.iter().enumerate() {
                let s = lock(&r.state);
                if let Some(why) = &s.refused {
                    return Err(why.clone());
                }
                if s.ready {
                    continue;
                }
                if s.ended.is_some() {
                    let why = s.broken.clone().unwrap_or_else(|| match &r.gate {
                        Some(Gate::Unit { name, .. }) => format!(
                            "its unit {name} ended before the gate ran (see journalctl -u {name})"
                        ),
                        _ => "its gate ended before it was ready".into(),
                    });
                    return Err(format!("replica {index}: {why}"));
                }
                all = false;
            }
            if all {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the replicas' gates were not ready within {} s",
                    within.as_secs()
                ));
            }
            if self.launch.cancel.is_some_and(Cancel::is_cancelled) {
                return Err("cancelled".into());
            }
            std::thread::sleep(LOOK);
        }
    }

    /// How the journal keeps the replicas, to stop them after an agent restart.
    pub fn handles(&self) -> Vec<ReplicaHandle> {
        self.replicas.iter().filter_map(|r| r.gate.as_ref().and_then(Launcher::handle)).collect()
    }

    /// The user the replicas run as (the caller's).
    pub fn uid(&self) -> u32 {
        self.launch.uid()
    }

    /// The processes of replica `index` now (its command and everything it started).
    pub fn processes(&self, index: usize) -> Vec<u32> {
        let Some(gate) = self.replicas.get(index).and_then(|r| r.gate.as_ref()) else {
            return Vec::new();
        };
        self.launch.launcher.processes(gate, self.launch.uid())
    }

    /// How many replicas the batch has.
    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    /// Whether the batch has none.
    pub fn is_empty(&self) -> bool {
        self.replicas.is_empty()
    }

    /// Lets every replica run its command, at once: `Go` to each gate.
    pub fn release(&mut self) -> Result<Instant, String> {
        if self.released.is_some() {
            return Err("released twice".into());
        }
        for (index, r) in self.replicas.iter_mut().enumerate() {
            r.send(&ToGate::Go).map_err(|e| format!("starting replica {index}: {e}"))?;
        }
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
                u.latencies.clear();
                Mark { count: u.count }
            })
            .collect()
    }

    /// Closes the window opened at `marks`: each replica's units since, and their
    /// latencies (taken out: the reader goes on into an empty sample).
    pub fn close_window(&self, marks: &[Mark]) -> Vec<(u64, Sample)> {
        self.replicas
            .iter()
            .zip(marks)
            .map(|(r, mark)| {
                let mut u = lock(&r.units);
                let latencies = std::mem::take(&mut u.latencies);
                (u.count.saturating_sub(mark.count), latencies)
            })
            .collect()
    }

    /// Units replica `index` reported so far (0 for an index out of range).
    pub fn unit_count(&self, index: usize) -> u64 {
        self.replicas.get(index).map_or(0, |r| lock(&r.units).count)
    }

    /// How many lines replica `index` wrote that are no unit, and the first of them.
    pub fn malformed(&self, index: usize) -> (u64, Option<String>) {
        self.replicas.get(index).map_or((0, None), |r| {
            let units = lock(&r.units);
            (units.malformed, units.first_malformed.clone())
        })
    }

    /// The first line replica `index` wrote to its stdout that is a plain number (`12.5`:
    /// a unit line, sent to the wrong descriptor), once its gate has seen one.
    pub fn stdout_number(&self, index: usize) -> Option<String> {
        self.replicas.get(index).and_then(|r| lock(&r.state).stdout_number.clone())
    }

    /// Whether replica `index` has ended.
    pub fn exited(&self, index: usize) -> bool {
        self.replicas.get(index).is_none_or(Replica::has_ended)
    }

    /// How many replicas still run.
    pub fn running(&self) -> usize {
        self.replicas.iter().filter(|r| !r.has_ended()).count()
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
            std::thread::sleep((deadline - now).min(LOOK));
        }
    }

    /// Waits until every gate is gone or `deadline` passes; true when all are.
    fn wait_gone(&self, deadline: Instant) -> bool {
        loop {
            if self.replicas.iter().all(Replica::gone) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(LOOK);
        }
    }

    /// Stops every replica and what it started: each gate sends SIGTERM, SIGKILL after
    /// `grace`; a gate that has not ended a moment after that gets the launcher's last
    /// resort (SIGKILL to its unit's cgroup or its session).
    pub fn stop(&mut self, grace: Duration) {
        let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        for r in &mut self.replicas {
            r.stopped |= !r.has_ended() && self.released.is_some();
            if !r.finished() {
                let _ = r.send(&ToGate::Stop { grace_ms });
            }
        }
        if self.wait_gone(Instant::now() + grace + STOP_SLACK) {
            return;
        }
        let uid = self.launch.uid();
        for r in self.replicas.iter().filter(|r| !r.gone()) {
            if let Some(gate) = &r.gate {
                tracing::warn!(
                    "a replica's gate did not stop it within {} s: killing it",
                    (grace + STOP_SLACK).as_secs()
                );
                self.launch.launcher.kill(gate, uid);
            }
        }
        if !self.wait_gone(Instant::now() + STOP_SLACK) {
            // Their followers end now, whatever holds the other end.
            for r in &self.replicas {
                let _ = r.control.shutdown(Shutdown::Both);
            }
        }
    }

    /// Stops what still runs, reaps every gate and returns how each replica ended.
    pub fn finish(mut self, grace: Duration) -> Vec<ReplicaOutcome> {
        self.stop(grace);
        let released = self.released;
        let replicas = std::mem::take(&mut self.replicas);
        let mut ended = Vec::new();
        for mut r in replicas {
            if let Some(follower) = r.follower.take() {
                let _ = follower.join();
            }
            if let Some(gate) = r.gate.take() {
                self.launch.launcher.reap(gate, self.launch.uid());
            }
            ended.push(r);
        }
        // Every gate is gone: what is left in the pipes is read, and the reader ends even
        // where a process that escaped still holds a pipe open.
        if let Some((reader, finish)) = self.reader.take() {
            finish.store(true, Ordering::SeqCst);
            let _ = reader.join();
        }
        ended
            .into_iter()
            .enumerate()
            .map(|(index, r)| {
                let s = std::mem::take(&mut *lock(&r.state));
                let end = s.exited.map(|e| e.0).or(s.ended).unwrap_or_else(Instant::now);
                let seconds = released
                    .map_or(0.0, |start| end.saturating_duration_since(start).as_secs_f64());
                let (code, signal) = s.exited.map_or((None, None), |(_, c, sig)| (c, sig));
                let (stdout_tail, stderr_tail, dropped_bytes) = s.done.unwrap_or_default();
                let problem = s.not_run.or(s.broken).or_else(|| {
                    (released.is_some() && s.exited.is_none())
                        .then(|| "its gate ended without its status".to_string())
                });
                ReplicaOutcome {
                    index,
                    pid: s.pid.unwrap_or(0),
                    code,
                    signal,
                    stopped: r.stopped,
                    seconds,
                    units: lock(&r.units).clone(),
                    stdout_tail,
                    stderr_tail,
                    dropped_bytes,
                    problem,
                }
            })
            .collect()
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        // Never leave replicas behind: a batch dropped on an error path kills them all.
        let uid = self.launch.uid();
        for r in &mut self.replicas {
            if let Some(gate) = r.gate.take() {
                if !r.gone() {
                    self.launch.launcher.kill(&gate, uid);
                }
                let _ = r.control.shutdown(Shutdown::Both);
                self.launch.launcher.reap(gate, uid);
            }
        }
        if let Some((_, finish)) = &self.reader {
            finish.store(true, Ordering::SeqCst);
        }
    }
}

/// One replica's report pipe as the reader holds it: the read end (non-blocking), the
/// replica's counts, and a line begun in an earlier read (at most [`REPORT_LINE_MAX`]
/// bytes of it: beyond that only the fact that it is too long is kept).
struct ReportPipe {
    file: File,
    units: Arc<Mutex<Units>>,
    partial: Vec<u8>,
    /// The line begun is longer than [`REPORT_LINE_MAX`]: its bytes are skipped to its end.
    overlong: bool,
}

impl ReportPipe {
    fn new(read_end: OwnedFd, units: Arc<Mutex<Units>>) -> io::Result<ReportPipe> {
        unix::set_nonblocking(read_end.as_fd())?;
        Ok(ReportPipe { file: File::from(read_end), units, partial: Vec::new(), overlong: false })
    }

    /// Counts the complete lines of `chunk` (after the partial line before it) under one
    /// lock; keeps the incomplete rest for the next read. A line that is a plain decimal
    /// and its newline is read in one pass; anything else goes through
    /// [`Units::add_bytes`], and a line longer than [`REPORT_LINE_MAX`] is one malformed
    /// line.
    fn take(&mut self, chunk: &[u8], at: Instant) {
        let units = Arc::clone(&self.units);
        let mut units = lock(&units);
        let mut rest = chunk;
        if self.overlong || !self.partial.is_empty() {
            let Some(nl) = memchr::memchr(b'\n', rest) else {
                self.keep_partial(rest);
                return;
            };
            self.keep_partial(&rest[..nl]);
            self.end_line(&mut units, at);
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
                self.keep_partial(rest);
                return;
            };
            if nl > REPORT_LINE_MAX {
                units.add_malformed(&overlong_line());
            } else {
                units.add_bytes(&rest[..nl], at);
            }
            rest = &rest[nl + 1..];
        }
    }

    /// Keeps `bytes` of the line begun, or only that it is too long.
    fn keep_partial(&mut self, bytes: &[u8]) {
        if self.overlong {
            return;
        }
        if self.partial.len() + bytes.len() > REPORT_LINE_MAX {
            self.overlong = true;
            self.partial = Vec::new();
        } else {
            self.partial.extend_from_slice(bytes);
        }
    }

    /// Counts the line begun, now that it ended.
    fn end_line(&mut self, units: &mut Units, at: Instant) {
        if std::mem::take(&mut self.overlong) {
            units.add_malformed(&overlong_line());
        } else {
            units.add_bytes(&self.partial, at);
        }
        self.partial.clear();
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
        if self.overlong || !self.partial.is_empty() {
            let units = Arc::clone(&self.units);
            self.end_line(&mut lock(&units), Instant::now());
        }
    }
}

/// How a report line longer than [`REPORT_LINE_MAX`] is shown as malformed.
fn overlong_line() -> String {
    format!("(a line of more than {REPORT_LINE_MAX} bytes)")
}

/// The reader of every replica's report pipe, on one thread: each pass reads what every
/// pipe holds; with no backlog it waits [`REPORT_READ_PAUSE`] before the next. Each wake-up
/// costs the agent more than the lines it brings (on the H100 host a reader thread per
/// replica, each waking 40 times a second, cost 0.11 % of a core per replica), so one
/// thread serves them all. Ends when every pipe is closed, or once `finish` is set (every
/// replica reaped) after a last pass.
fn read_reports(mut pipes: Vec<ReportPipe>, finish: &AtomicBool) {
    let mut buffer = vec![0u8; REPORT_READ_BYTES];
    let mut last_passes = 0;
    while !pipes.is_empty() {
        let last = finish.load(Ordering::SeqCst);
        let mut backlog = false;
        pipes.retain_mut(|pipe| {
            let (more, open) = pipe.read_now(&mut buffer);
            backlog |= more;
            open
        });
        last_passes += u32::from(last);
        if last && (!backlog || last_passes >= LAST_PASSES) {
            pipes.iter_mut().for_each(ReportPipe::end);
            return;
        }
        if !backlog {
            std::thread::sleep(REPORT_READ_PAUSE);
        }
    }
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

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
        assert_eq!(units.latencies.kept(), [12.5, 3.0, 0.0]);
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

    #[test]
    fn a_line_longer_than_the_bound_is_one_malformed_line_and_is_not_kept() {
        let now = Instant::now();
        let long = vec![b'7'; REPORT_LINE_MAX + 1];
        let mut text = b"1.5\n".to_vec();
        text.extend_from_slice(&long);
        text.extend_from_slice(b"\n2.5\n");
        text.extend_from_slice(&long);
        for pieces in [vec![&text[..]], text.chunks(1000).collect::<Vec<_>>()] {
            let units = read_in_pieces(&text, &pieces, now);
            assert_eq!(units.count, 2);
            assert_eq!(units.latencies.kept(), [1.5, 2.5]);
            assert_eq!(units.malformed, 2, "the unfinished one at the end too");
            assert_eq!(units.first_malformed, Some(overlong_line()));
        }
        // A gigabyte without a newline costs no more than the bound.
        let (read_end, _write_end) = unix::pipe().unwrap();
        let units = Arc::new(Mutex::new(Units::default()));
        let mut pipe = ReportPipe::new(read_end, Arc::clone(&units)).unwrap();
        let chunk = vec![b'1'; 1 << 20];
        for _ in 0..64 {
            pipe.take(&chunk, now);
            assert!(pipe.partial.capacity() <= 2 * REPORT_LINE_MAX);
        }
        pipe.end();
        assert_eq!(lock(&units).malformed, 1);
    }

    #[test]
    fn latencies_beyond_the_bound_are_a_uniform_sample_of_all() {
        let mut sample = Sample::default();
        let n = 10 * LATENCIES_KEPT as u64;
        for i in 0..n {
            sample.push(i as f64);
        }
        assert_eq!(sample.seen(), n);
        assert_eq!(sample.kept().len(), LATENCIES_KEPT);
        // Each tenth of the stream holds about a tenth of the sample.
        for decile in 0..10u64 {
            let range = (decile * n / 10) as f64..((decile + 1) * n / 10) as f64;
            let share = sample.kept().iter().filter(|x| range.contains(x)).count() as f64
                / LATENCIES_KEPT as f64;
            assert!((share - 0.1).abs() < 0.01, "decile {decile}: {share}");
        }
        sample.clear();
        assert_eq!((sample.seen(), sample.kept().len()), (0, 0));
    }

    #[test]
    fn pooled_samples_weigh_each_replica_by_its_units() {
        let sample = |n: u64, value: f64| {
            let mut s = Sample::default();
            (0..n).for_each(|_| s.push(value));
            s
        };
        // Unsampled: everything stays.
        let kept = at_common_rate(vec![sample(10, 1.0), sample(30, 2.0)]);
        assert_eq!((kept[0].len(), kept[1].len()), (10, 30));
        // One replica reported 4 × the bound, the other half of it: 1 to 8, as reported.
        let big = 4 * LATENCIES_KEPT as u64;
        let kept = at_common_rate(vec![sample(big, 1.0), sample(big / 8, 2.0)]);
        assert_eq!(kept[0].len(), LATENCIES_KEPT);
        assert_eq!(kept[1].len(), LATENCIES_KEPT / 8);
        assert!(kept[1].iter().all(|&x| x == 2.0));
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
        assert_eq!(lock(&units).latencies.kept(), [1.5, 2.5, 3.0]);
    }

    #[test]
    fn the_reader_finishes_when_told_although_a_pipe_stays_open() {
        // A process a replica left behind holds the write end.
        let Reading { mut writer, units, finish, thread } = start_reading();
        writer.write_all(b"4\n5").unwrap();
        finish.store(true, Ordering::SeqCst);
        thread.join().unwrap();
        assert_eq!(lock(&units).latencies.kept(), [4.0, 5.0]);
        drop(writer);
    }
}
