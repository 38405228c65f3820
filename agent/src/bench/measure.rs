//! One run of a bench: N replicas started together (through [`super::replicas`]) under a
//! strategy the engine has already set up, measured by one method, stopped, and what
//! each replica did returned for [`super::stats::summarize_run`].
//!
//! The measurement window (units by line, histogram) opens once every replica has shown
//! it is working: a first unit on its report descriptor, or its histogram answering a
//! scrape. Start-up (imports, CUDA context, model loading, warm-up) is thus never
//! measured, however long each replica takes; the window then lasts the duration asked
//! for, for all replicas at once. With `--until-exit` there is no window: each replica's
//! wall time from the common start to its exit is its one unit.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gpushare_proto::bench::{BenchReplica, ENV_METRICS_PORT, Method as MethodName};

use super::control::Logs;
use super::histogram::{self, Histogram};
use super::host_noise::{HostNoise, HostSampler};
use super::listener;
use super::replicas::{Batch, Launch, ReplicaOutcome, ReplicaSpec, at_common_rate};
use super::stats::{Latencies, ReplicaMeasure};
use crate::apply::journal::ReplicaHandle;

/// How long replicas get to stop after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// The most of each output stream of a replica written to its log file.
pub const BENCH_LOG_CAP: u64 = 8 << 20;
/// How often the runner looks at the replicas while it waits.
const POLL: Duration = Duration::from_millis(20);
/// How often a histogram is scraped while waiting for every replica to serve it.
const SCRAPE_POLL: Duration = Duration::from_millis(250);
/// Timeout of one scrape.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// How a run is measured.
#[derive(Debug, Clone, PartialEq)]
pub enum Method {
    /// Each replica's wall time to its exit.
    UntilExit,
    /// Units by line during a window of this length.
    Units(Duration),
    /// The histogram `name` of every replica, scraped before and after a window.
    Histogram {
        /// The histogram's name.
        name: String,
        /// The window.
        window: Duration,
    },
}

impl Method {
    /// The protocol's name of this method.
    pub fn name(&self) -> MethodName {
        match self {
            Method::UntilExit => MethodName::UntilExit,
            Method::Units(_) => MethodName::Units,
            Method::Histogram { .. } => MethodName::Histogram,
        }
    }
}

pub use super::replicas::Cancel;

/// One run: what to start, with what, measured how.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// The command each replica runs.
    pub command: Vec<String>,
    /// The replicas' environment (the caller's), before the per-replica variables.
    pub env: Vec<(String, String)>,
    /// Per replica, the variables of its device (`CUDA_VISIBLE_DEVICES`, the MPS pipe
    /// directory, the strategy); their number is the number of replicas.
    pub devices: Vec<Vec<(String, String)>>,
    /// Their working directory (absolute).
    pub cwd: String,
    /// Where their stdout and stderr go: the caller's log directory and this run's
    /// directory in it (`mps-3`); `None`: not kept.
    pub logs: Option<(String, String)>,
    /// How they are measured.
    pub method: Method,
    /// Longest a replica may run (and the longest a window waits for every replica to
    /// start working).
    pub time_limit: Duration,
    /// Per replica, the CPUs it is pinned to (the same number of entries as `devices`);
    /// `None`: unpinned.
    pub cpus: Option<Vec<Vec<u32>>>,
}

/// What a run gives back: each replica's measurement, and why the run as a whole has no
/// figures if it has none.
#[derive(Debug)]
pub struct RunOutcome {
    /// Each replica, by index.
    pub measures: Vec<ReplicaMeasure>,
    /// Why the window never opened (nobody started working, a cancel), if so.
    pub error: Option<String>,
    /// The agent's CPU time over the window, percent of one core.
    pub agent_cpu_percent: Option<f64>,
    /// The replicas' CPUs over the window: steal and clock.
    pub host: Option<HostNoise>,
}

/// GPU memory per process id, sampled near the window's end.
pub type MemorySampler<'a> = &'a mut dyn FnMut() -> HashMap<u32, u64>;

/// Runs the replicas of `spec`, started as `launch` says, and measures them. `started` is
/// told how to stop them once they exist, before they run the command, so that an agent
/// restarted mid-run can.
/// `window_opened` is called as the window opens (never with `--until-exit`).
pub fn run(
    spec: &RunSpec,
    launch: &Launch<'_>,
    cancel: &Cancel,
    started: &mut dyn FnMut(Vec<ReplicaHandle>),
    memory: MemorySampler<'_>,
    window_opened: &mut dyn FnMut(),
) -> Result<RunOutcome, String> {
    let ports = match spec.method {
        Method::Histogram { .. } => free_ports(spec.devices.len())?,
        _ => Vec::new(),
    };
    let specs = spec
        .devices
        .iter()
        .enumerate()
        .map(|(i, device)| {
            let mut env = spec.env.clone();
            env.extend(device.iter().cloned());
            if let Some(port) = ports.get(i) {
                env.push((ENV_METRICS_PORT.into(), port.to_string()));
            }
            let logs = spec.logs.as_ref().map(|(dir, run)| Logs {
                dir: dir.clone(),
                run: run.clone(),
                index: u32::try_from(i).unwrap_or(u32::MAX),
                cap_bytes: BENCH_LOG_CAP,
            });
            ReplicaSpec {
                command: spec.command.clone(),
                env,
                cwd: spec.cwd.clone(),
                logs,
                cpus: spec.cpus.as_ref().and_then(|sets| sets.get(i).cloned()),
            }
        })
        .collect();
    let mut batch =
        Batch::spawn(*launch, specs).map_err(|e| format!("starting the replicas: {e}"))?;
    started(batch.handles());
    let start = batch.release()?;
    let deadline = start + spec.time_limit;

    // The CPUs whose noise the window sees: the replicas' (every CPU when unpinned).
    let sampled: Vec<u32> = spec.cpus.iter().flatten().flatten().copied().collect();
    let window = Window { cancel, deadline, memory, opened: window_opened, cpus: &sampled };
    let measured = match &spec.method {
        Method::UntilExit => until_exit(&batch, cancel, deadline),
        Method::Units(length) => units_window(&batch, *length, window),
        Method::Histogram { name, window: length } => {
            histogram_window(&batch, &ports, name, *length, window)
        }
    };
    let outcomes = batch.finish(STOP_GRACE);
    let window_method = spec.method != Method::UntilExit;
    let measures = outcomes
        .iter()
        .map(|o| {
            let device = spec.devices[o.index]
                .iter()
                .find(|(k, _)| k == "CUDA_VISIBLE_DEVICES")
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            let window = measured.per_replica.get(o.index);
            replica_measure(o, device, window, window_method, &measured.memory)
        })
        .collect();
    Ok(RunOutcome {
        measures,
        error: measured.error,
        agent_cpu_percent: measured.cpu_percent,
        host: measured.host,
    })
}

/// What a window method needs besides the batch: when to give up, what to sample, whom
/// to tell it opened.
struct Window<'a, 'b> {
    cancel: &'a Cancel,
    deadline: Instant,
    memory: MemorySampler<'b>,
    opened: &'a mut dyn FnMut(),
    cpus: &'a [u32],
}

/// What a method measured of each replica, before the replicas were reaped.
#[derive(Default)]
struct Measured {
    per_replica: Vec<(u64, f64, Latencies)>,
    memory: HashMap<usize, u64>,
    error: Option<String>,
    cpu_percent: Option<f64>,
    host: Option<HostNoise>,
}

fn until_exit(batch: &Batch, cancel: &Cancel, deadline: Instant) -> Measured {
    while batch.running() > 0 && Instant::now() < deadline {
        if cancel.sleep_until((Instant::now() + POLL).min(deadline)) {
            return Measured { error: Some("cancelled".into()), ..Measured::default() };
        }
    }
    // Each replica's wall time comes from its outcome (see `replica_measure`).
    Measured::default()
}

/// How long a replica may write nothing but lines that are no unit before the bench says
/// so (rather than wait out the whole `--time-limit`): a header line or two before the
/// first unit is fine, seconds of them are a replica reporting the wrong way.
const MALFORMED_GRACE: Duration = Duration::from_secs(5);

/// Waits until every replica still running passes `working`; an error names who did not.
/// `wrong` may give up on a replica that is not working yet (given the time waited): its
/// answer is the error.
fn wait_for_work(
    batch: &Batch,
    cancel: &Cancel,
    deadline: Instant,
    mut working: impl FnMut(usize) -> bool,
    mut wrong: impl FnMut(usize, Duration) -> Option<String>,
    what: &str,
) -> Result<(), String> {
    let mut ready = vec![false; batch.len()];
    let began = Instant::now();
    loop {
        for (i, r) in ready.iter_mut().enumerate() {
            if !*r {
                *r = working(i);
                if !*r && let Some(why) = wrong(i, began.elapsed()) {
                    return Err(why);
                }
            }
        }
        if ready.iter().all(|&r| r) {
            return Ok(());
        }
        if batch.running() == 0 {
            return Err(format!("every replica exited before the window opened ({what})"));
        }
        if Instant::now() >= deadline {
            let late: Vec<String> = ready
                .iter()
                .enumerate()
                .filter(|(_, r)| !**r)
                .map(|(i, _)| i.to_string())
                .collect();
            return Err(format!(
                "replica {} did not start working within the time limit ({what})",
                late.join(", ")
            ));
        }
        if cancel.sleep_until(Instant::now() + POLL) {
            return Err("cancelled".into());
        }
    }
}

/// The error for replica `i` when, `waited` into the wait, it has written only lines that
/// are no unit for [`MALFORMED_GRACE`]: what arrived (the first line) and what is expected.
fn malformed_only(batch: &Batch, i: usize, waited: Duration) -> Option<String> {
    let (count, first) = batch.malformed(i);
    if count == 0 || waited < MALFORMED_GRACE {
        return None;
    }
    let first = first.unwrap_or_default();
    Some(format!(
        "replica {i} writes lines to $GPUSHARE_BENCH_REPORT that are no unit ({count} in {}s, the first: {first:?}); write one line per unit of work done: an empty line, or the unit's latency in milliseconds as a number (12.5)",
        waited.as_secs()
    ))
}

/// The error for replica `i` when, `waited` into the wait, it has reported no unit for
/// [`MALFORMED_GRACE`] but writes numbers to its stdout: units sent the wrong way.
fn units_on_stdout(batch: &Batch, i: usize, waited: Duration) -> Option<String> {
    if waited < MALFORMED_GRACE || batch.unit_count(i) > 0 {
        return None;
    }
    let line = batch.stdout_number(i)?;
    Some(format!(
        "replica {i} writes numbers to its stdout (the first: {line:?}) and no unit to $GPUSHARE_BENCH_REPORT in {}s; write each unit to descriptor 3 instead (echo 12.5 >&3, or os.fdopen(int(os.environ[\"GPUSHARE_BENCH_REPORT\"]), \"w\"))",
        waited.as_secs()
    ))
}

fn units_window(batch: &Batch, length: Duration, w: Window<'_, '_>) -> Measured {
    let opened = wait_for_work(
        batch,
        w.cancel,
        w.deadline,
        |i| batch.unit_count(i) > 0 || batch.exited(i),
        |i, waited| malformed_only(batch, i, waited).or_else(|| units_on_stdout(batch, i, waited)),
        "no unit on the descriptor in $GPUSHARE_BENCH_REPORT",
    );
    if let Err(error) = opened {
        return Measured { error: Some(error), ..Measured::default() };
    }
    (w.opened)();
    let marks = batch.open_window();
    let open = Instant::now();
    let cpu = process_cpu_seconds();
    let host = HostSampler::start(w.cpus);
    if w.cancel.sleep_until(open + length) {
        return Measured { error: Some("cancelled".into()), ..Measured::default() };
    }
    let (units, samples): (Vec<u64>, Vec<_>) = batch.close_window(&marks).into_iter().unzip();
    let seconds = open.elapsed().as_secs_f64();
    let cpu_percent = cpu_percent(cpu, seconds);
    let host = Some(host.finish());
    // After the window: finding each replica's processes scans /proc.
    let memory = by_replica(batch, (w.memory)());
    let per_replica = units
        .into_iter()
        .zip(at_common_rate(samples))
        .map(|(units, latencies)| {
            let latencies =
                if latencies.is_empty() { Latencies::None } else { Latencies::Samples(latencies) };
            (units, seconds, latencies)
        })
        .collect();
    Measured { per_replica, memory, error: None, cpu_percent, host }
}

fn histogram_window(
    batch: &Batch,
    ports: &[u16],
    name: &str,
    length: Duration,
    w: Window<'_, '_>,
) -> Measured {
    let cancel = w.cancel;
    let mut first: Vec<Option<Histogram>> = vec![None; ports.len()];
    let mut last_error: Vec<String> = vec![String::new(); ports.len()];
    let mut next_try = vec![Instant::now(); ports.len()];
    // A port another program listens on: the replica cannot have it (said at once).
    let foreign: std::cell::RefCell<Vec<Option<String>>> = vec![None; ports.len()].into();
    let opened = wait_for_work(
        batch,
        cancel,
        w.deadline,
        |i| {
            if Instant::now() < next_try[i] {
                return false;
            }
            next_try[i] = Instant::now() + SCRAPE_POLL;
            // Only the replica's own listener is believed.
            if let Err(e) = listener::check_owner(ports[i], i, batch.uid()) {
                if let listener::NotOwn::Foreign(why) = &e {
                    foreign.borrow_mut()[i] = Some(why.clone());
                }
                last_error[i] = e.why().to_string();
                return batch.exited(i);
            }
            match histogram::scrape(ports[i], name, SCRAPE_TIMEOUT) {
                Ok(h) => {
                    first[i] = Some(h);
                    true
                }
                Err(e) => {
                    last_error[i] = e;
                    batch.exited(i)
                }
            }
        },
        |i, _| foreign.borrow_mut()[i].take(),
        &format!("histogram `{name}` on $GPUSHARE_BENCH_METRICS_PORT"),
    );
    if let Err(error) = opened {
        let detail = last_error.iter().find(|e| !e.is_empty());
        let error = match detail {
            Some(d) if error != "cancelled" => format!("{error}; last scrape: {d}"),
            _ => error,
        };
        return Measured { error: Some(error), ..Measured::default() };
    }
    // The window opens with a scrape of every replica, together.
    (w.opened)();
    let cancelled = || Measured { error: Some("cancelled".into()), ..Measured::default() };
    let Some(before) = scrape_all(batch, ports, name, cancel) else { return cancelled() };
    let open = Instant::now();
    let cpu = process_cpu_seconds();
    let host = HostSampler::start(w.cpus);
    if cancel.sleep_until(open + length) {
        return Measured { error: Some("cancelled".into()), ..Measured::default() };
    }
    let Some(after) = scrape_all(batch, ports, name, cancel) else { return cancelled() };
    let seconds = open.elapsed().as_secs_f64();
    let cpu_percent = cpu_percent(cpu, seconds);
    let host = Some(host.finish());
    // After the window: finding each replica's processes scans /proc.
    let memory = by_replica(batch, (w.memory)());
    let per_replica = before
        .iter()
        .zip(&after)
        .map(|(b, a)| match (b, a) {
            (Some(b), Some(a)) => match histogram::delta(b, a) {
                Ok(d) => (d.count, seconds, d.latencies_ms(name)),
                Err(_) => (0, seconds, Latencies::None),
            },
            _ => (0, seconds, Latencies::None),
        })
        .collect();
    Measured { per_replica, memory, error: None, cpu_percent, host }
}

/// Histogram `name` of every replica, one after another (each scrape may take up to
/// [`SCRAPE_TIMEOUT`]), each only from a listener of the replica's own (see
/// [`listener`]); `None` as soon as the bench is cancelled.
fn scrape_all(
    batch: &Batch,
    ports: &[u16],
    name: &str,
    cancel: &Cancel,
) -> Option<Vec<Option<Histogram>>> {
    ports
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            (!cancel.is_cancelled()).then(|| {
                listener::check_owner(p, i, batch.uid()).ok()?;
                histogram::scrape(p, name, SCRAPE_TIMEOUT).ok()
            })
        })
        .collect()
}

/// This process's CPU time so far (all threads, user and system), seconds.
fn process_cpu_seconds() -> Option<f64> {
    use nix::sys::resource::{UsageWho, getrusage};
    use nix::sys::time::TimeValLike;
    let usage = getrusage(UsageWho::RUSAGE_SELF).ok()?;
    let secs = |t: nix::sys::time::TimeVal| t.num_microseconds() as f64 / 1e6;
    Some(secs(usage.user_time()) + secs(usage.system_time()))
}

/// CPU time since `since` over `seconds` of wall time, percent of one core.
fn cpu_percent(since: Option<f64>, seconds: f64) -> Option<f64> {
    let used = process_cpu_seconds()? - since?;
    (seconds > 0.0).then(|| used / seconds * 100.0)
}

/// GPU memory per replica: the processes NVML lists, summed per replica over its
/// processes (its unit's cgroup, or its gate's session).
fn by_replica(batch: &Batch<'_>, per_pid: HashMap<u32, u64>) -> HashMap<usize, u64> {
    let mut memory = HashMap::new();
    if per_pid.is_empty() {
        return memory;
    }
    for index in 0..batch.len() {
        let held: u64 = batch.processes(index).iter().filter_map(|pid| per_pid.get(pid)).sum();
        if held > 0 {
            memory.insert(index, held);
        }
    }
    memory
}

fn replica_measure(
    o: &ReplicaOutcome,
    device: String,
    window: Option<&(u64, f64, Latencies)>,
    window_method: bool,
    memory: &HashMap<usize, u64>,
) -> ReplicaMeasure {
    let (outcome, failed) = classify(o, window_method);
    let (units, seconds, latencies) = match (window_method, window) {
        (true, Some((units, seconds, latencies))) => (*units, *seconds, latencies.clone()),
        (true, None) => (0, 0.0, Latencies::None),
        // Until exit: one unit, its wall time, when it finished by itself.
        (false, _) if !failed => (1, o.seconds, Latencies::Samples(vec![o.seconds * 1000.0])),
        (false, _) => (0, o.seconds, Latencies::None),
    };
    let failed = failed || (window_method && window.is_some() && units == 0);
    let outcome = if failed && window_method && units == 0 && outcome == "stopped" {
        "no units in the window".to_string()
    } else {
        outcome
    };
    ReplicaMeasure {
        replica: BenchReplica {
            index: u32::try_from(o.index).unwrap_or(u32::MAX),
            pid: o.pid,
            device,
            outcome,
            failed,
            seconds: o.seconds,
            units: 0,
            throughput_per_s: 0.0,
            p50_ms: None,
            p99_ms: None,
            slowdown: None,
            gpu_memory_bytes: memory.get(&o.index).copied(),
            malformed_lines: o.units.malformed,
            stdout_tail: o.stdout_tail.clone(),
            stderr_tail: o.stderr_tail.clone(),
            output_dropped_bytes: o.dropped_bytes,
        },
        units,
        seconds,
        latencies,
    }
}

/// The replica's outcome in words, and whether it counts as failed: with a window, a
/// replica must still run when the window closes (it is then stopped); to completion, it
/// must exit 0 within the time limit.
fn classify(o: &ReplicaOutcome, window_method: bool) -> (String, bool) {
    if let Some(problem) = &o.problem {
        return (problem.clone(), true);
    }
    match (o.stopped, o.code, o.signal) {
        (true, _, _) if window_method => ("stopped".into(), false),
        (true, _, _) => ("time limit".into(), true),
        (false, Some(0), _) if window_method => ("exit 0 before the window closed".into(), true),
        (false, Some(0), _) => ("ok".into(), false),
        (false, Some(code), _) => (format!("exit {code}"), true),
        (false, None, Some(signal)) => (format!("signal {signal}"), true),
        (false, None, None) => ("unknown".into(), true),
    }
}

/// `n` TCP ports free on 127.0.0.1 now, one per replica (bound and released: a replica
/// binds its own a moment later).
fn free_ports(n: usize) -> Result<Vec<u16>, String> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind(("127.0.0.1", 0)))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("finding free ports for the replicas' metrics: {e}"))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("finding free ports for the replicas' metrics: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::replicas::Units;

    fn outcome(stopped: bool, code: Option<i32>, signal: Option<i32>) -> ReplicaOutcome {
        ReplicaOutcome {
            index: 0,
            pid: 1,
            code,
            signal,
            stopped,
            seconds: 2.5,
            units: Units::default(),
            stdout_tail: String::new(),
            stderr_tail: String::new(),
            dropped_bytes: 0,
            problem: None,
        }
    }

    #[test]
    fn outcomes_fail_by_method() {
        assert_eq!(classify(&outcome(true, None, Some(15)), true), ("stopped".into(), false));
        assert_eq!(classify(&outcome(true, None, Some(15)), false), ("time limit".into(), true));
        assert_eq!(classify(&outcome(false, Some(0), None), false), ("ok".into(), false));
        assert!(classify(&outcome(false, Some(0), None), true).1);
        assert_eq!(classify(&outcome(false, Some(3), None), false), ("exit 3".into(), true));
        assert_eq!(classify(&outcome(false, None, Some(9)), true), ("signal 9".into(), true));
    }

    #[test]
    fn a_finished_replica_is_one_unit_of_its_wall_time() {
        let m = replica_measure(
            &outcome(false, Some(0), None),
            "GPU-x".into(),
            None,
            false,
            &HashMap::new(),
        );
        assert_eq!((m.units, m.seconds), (1, 2.5));
        assert_eq!(m.latencies, Latencies::Samples(vec![2500.0]));
        assert!(!m.replica.failed);
        let m = replica_measure(
            &outcome(false, Some(1), None),
            "GPU-x".into(),
            None,
            false,
            &HashMap::new(),
        );
        assert_eq!((m.units, m.replica.failed), (0, true));
    }

    #[test]
    fn a_replica_without_units_in_the_window_failed() {
        let window = (0, 30.0, Latencies::None);
        let m = replica_measure(
            &outcome(true, None, Some(15)),
            "GPU-x".into(),
            Some(&window),
            true,
            &HashMap::new(),
        );
        assert!(m.replica.failed);
        assert_eq!(m.replica.outcome, "no units in the window");
    }
}
