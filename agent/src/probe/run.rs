//! Probe runs: a solo baseline, then N client processes started together.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpushare_proto::MPS_MAX_CLIENTS;
use serde::{Deserialize, Serialize};

use super::{ClientResult, ClientSpec, ClientStats, RunResult, Workload};
use crate::bench::stats::{inflation, jain_index, scaling, slowdown};

/// How long clients may take to become ready (context, kernels, buffers, warm-up).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Grace after the window for the clients to report.
const REPORT_GRACE: Duration = Duration::from_secs(30);
/// The window opens this long after the last client is ready.
const START_DELAY_MS: u64 = 50;

/// Runs a solo baseline of `workload`, then `clients` clients together (with `clients`
/// = 1, the solo run alone), each `agent_exe --probe-client <spec>` with `env` added to
/// the inherited environment (`CUDA_MPS_PIPE_DIRECTORY`, `CUDA_VISIBLE_DEVICES`, ...).
pub fn run(
    agent_exe: &Path,
    workload: Workload,
    clients: usize,
    seconds: f64,
    env: &[(String, String)],
) -> Result<RunResult, String> {
    sweep(agent_exe, workload, &[clients], seconds, env)?.pop().ok_or_else(|| "no run".to_string())
}

/// One solo baseline, then one run for each client count in `counts` (a count of 1 reuses
/// the baseline).
pub fn sweep(
    agent_exe: &Path,
    workload: Workload,
    counts: &[usize],
    seconds: f64,
    env: &[(String, String)],
) -> Result<Vec<RunResult>, String> {
    if counts.contains(&0) {
        return Err("a run needs at least one client".into());
    }
    let solo = run_clients(agent_exe, workload, 1, seconds, env)?
        .pop()
        .ok_or_else(|| "the solo client reported nothing".to_string())?;
    let mut runs = Vec::with_capacity(counts.len());
    for &n in counts {
        let clients = if n == 1 {
            vec![solo.clone()]
        } else {
            run_clients(agent_exe, workload, n, seconds, env)?
        };
        runs.push(summarize(&solo, clients, seconds));
    }
    Ok(runs)
}

/// A run's summary from the solo baseline and the clients that ran together (the
/// statistics are [`crate::bench::stats`]'s).
pub fn summarize(solo: &ClientResult, clients: Vec<ClientResult>, seconds: f64) -> RunResult {
    let throughputs: Vec<f64> = clients.iter().map(|c| c.throughput_per_s).collect();
    let per_client = clients
        .iter()
        .map(|c| ClientStats {
            pid: c.pid,
            throughput_per_s: c.throughput_per_s,
            p50_ms: c.p50_ms,
            p99_ms: c.p99_ms,
            slowdown: slowdown(solo.throughput_per_s, c.throughput_per_s),
        })
        .collect();
    let n = clients.len().max(1) as f64;
    let mean_p50 = clients.iter().map(|c| c.p50_ms).sum::<f64>() / n;
    let worst_p99 = clients.iter().map(|c| c.p99_ms).fold(0.0, f64::max);
    RunResult {
        workload: solo.workload,
        clients: clients.len(),
        seconds,
        solo_throughput_per_s: solo.throughput_per_s,
        solo_p50_ms: solo.p50_ms,
        solo_p99_ms: solo.p99_ms,
        per_client,
        aggregate_throughput_per_s: throughputs.iter().sum(),
        scaling: scaling(&throughputs, solo.throughput_per_s),
        jain_fairness: jain_index(&throughputs),
        p50_inflation: inflation(mean_p50, solo.p50_ms),
        p99_inflation: inflation(worst_p99, solo.p99_ms),
        max_late_ms: clients.iter().map(|c| c.late_ms).fold(0.0, f64::max),
        solo: solo.clone(),
        client_results: clients,
    }
}

enum Event {
    Line(usize, String),
    Closed(usize),
}

/// Starts `n` clients, opens their windows together once all are ready, and collects
/// their reports (in start order). Any failure stops every client and names the reason.
pub fn run_clients(
    agent_exe: &Path,
    workload: Workload,
    n: usize,
    seconds: f64,
    env: &[(String, String)],
) -> Result<Vec<ClientResult>, String> {
    let spec = ClientSpec { workload, seconds, start_at_unix_ms: None, device: 0 };
    let spec_json = serde_json::to_string(&spec).map_err(|e| e.to_string())?;
    let mut children = Clients(Vec::with_capacity(n));
    let (tx, rx) = mpsc::channel();
    let mut stdins: Vec<ChildStdin> = Vec::with_capacity(n);
    let mut stderrs = Vec::with_capacity(n);
    for i in 0..n {
        let mut command = Command::new(agent_exe);
        crate::sys::unix::with_open_files_at_start(&mut command);
        let mut child = command
            .arg("--probe-client")
            .arg(&spec_json)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting probe client {}: {e}", agent_exe.display()))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        stdins.push(child.stdin.take().ok_or("no stdin")?);
        let mut stderr = child.stderr.take().ok_or("no stderr")?;
        stderrs.push(std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        }));
        children.0.push(child);
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                match line {
                    Ok(l) => {
                        if tx.send(Event::Line(i, l)).is_err() {
                            return;
                        }
                    }
                    Err(_) => break,
                }
            }
            let _ = tx.send(Event::Closed(i));
        });
    }
    drop(tx);

    let fail = |children: &mut Clients,
                stderrs: Vec<std::thread::JoinHandle<String>>,
                i: usize,
                what: &str| {
        children.kill_all();
        let reason = stderrs
            .into_iter()
            .nth(i)
            .and_then(|h| h.join().ok())
            .map(|s| s.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string())
            .unwrap_or_default();
        if reason.is_empty() {
            format!("probe client {} of {n} ({workload}) {what}", i + 1)
        } else {
            format!("probe client {} of {n} ({workload}) {what}: {reason}", i + 1)
        }
    };

    // Phase 1: every client ready.
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut ready = vec![false; n];
    while ready.iter().any(|r| !r) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Event::Line(i, l)) if l.trim() == "ready" => ready[i] = true,
            Ok(Event::Line(..)) => {}
            Ok(Event::Closed(i)) => return Err(fail(&mut children, stderrs, i, "failed")),
            Err(_) => {
                let i = ready.iter().position(|r| !r).unwrap_or(0);
                return Err(fail(&mut children, stderrs, i, "was not ready in time"));
            }
        }
    }

    // Phase 2: the same start instant for all.
    let now_ms =
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let start = now_ms + START_DELAY_MS;
    for (i, stdin) in stdins.iter_mut().enumerate() {
        if writeln!(stdin, "{start}").and_then(|()| stdin.flush()).is_err() {
            return Err(fail(&mut children, stderrs, i, "went away before its window"));
        }
    }
    drop(stdins);

    // Phase 3: reports.
    let deadline = Instant::now() + Duration::from_secs_f64(seconds) + REPORT_GRACE;
    let mut results: Vec<Option<ClientResult>> = vec![None; n];
    let mut closed = vec![false; n];
    while closed.iter().any(|c| !c) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Event::Line(i, l)) => {
                if let Ok(r) = serde_json::from_str::<ClientResult>(&l) {
                    results[i] = Some(r);
                }
            }
            Ok(Event::Closed(i)) => {
                closed[i] = true;
                if results[i].is_none() {
                    return Err(fail(&mut children, stderrs, i, "failed"));
                }
            }
            Err(_) => {
                let i = closed.iter().position(|c| !c).unwrap_or(0);
                return Err(fail(&mut children, stderrs, i, "did not report in time"));
            }
        }
    }
    for (i, child) in children.0.iter_mut().enumerate() {
        match child.wait() {
            Ok(status) if status.success() => {}
            Ok(status) => {
                return Err(format!("probe client {} of {n} exited with {status}", i + 1));
            }
            Err(e) => return Err(format!("waiting for probe client {}: {e}", i + 1)),
        }
    }
    children.0.clear();
    Ok(results.into_iter().flatten().collect())
}

/// The clients of a run; any still running when this is dropped are killed and reaped.
struct Clients(Vec<Child>);

impl Clients {
    fn kill_all(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.0.clear();
    }
}

impl Drop for Clients {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// The output of `--probe-run`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepReport {
    /// Client counts asked for.
    pub counts: Vec<usize>,
    /// Window length, seconds.
    pub seconds: f64,
    /// Every run, workload after workload.
    pub runs: Vec<RunResult>,
    /// Wall time of the whole sweep, seconds.
    pub wall_seconds: f64,
}

/// Parses `--probe-run` arguments: `<workload|all> <n,n,...> <seconds>`.
pub fn parse_run_args(args: &[String]) -> Result<(Vec<Workload>, Vec<usize>, f64), String> {
    let [workload, counts, seconds] = args else {
        return Err("--probe-run takes <workload|all> <n,n,...> <seconds>".into());
    };
    let workloads =
        if workload == "all" { Workload::ALL.to_vec() } else { vec![workload.parse()?] };
    let counts = counts
        .split(',')
        .map(|c| match c.trim().parse::<usize>() {
            Ok(n) if (1..=MPS_MAX_CLIENTS as usize).contains(&n) => Ok(n),
            _ => Err(format!("client count {c:?}: expected 1 to {MPS_MAX_CLIENTS}")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let seconds: f64 = seconds.parse().map_err(|_| format!("window {seconds:?}: not a number"))?;
    if !(seconds > 0.0 && seconds <= 3600.0) {
        return Err(format!("window of {seconds} s: must be above 0 and at most 3600"));
    }
    Ok((workloads, counts, seconds))
}

/// `--probe-run <workload|all> <n,n,...> <seconds>`: sweeps with clients started from this
/// executable and prints a [`SweepReport`] as JSON.
pub fn main(args: &[String]) -> ExitCode {
    let result = (|| -> Result<SweepReport, String> {
        let (workloads, counts, seconds) = parse_run_args(args)?;
        let exe = crate::sys::agent_binary()?;
        let t = Instant::now();
        let mut runs = Vec::new();
        for w in workloads {
            runs.extend(sweep(&exe, w, &counts, seconds, &[])?);
        }
        Ok(SweepReport { counts, seconds, runs, wall_seconds: t.elapsed().as_secs_f64() })
    })();
    match result.and_then(|r| serde_json::to_string_pretty(&r).map_err(|e| e.to_string())) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gpushare-agent --probe-run: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn client(pid: u32, tput: f64, p50: f64, p99: f64) -> ClientResult {
        ClientResult {
            workload: Workload::Launch,
            pid,
            steps: (tput * 3.0) as u64,
            seconds: 3.0,
            throughput_per_s: tput,
            p50_ms: p50,
            p99_ms: p99,
            mean_ms: p50,
            achieved: crate::probe::Achieved {
                value: 1.0,
                limit: 2.0,
                unit: "TFLOP/s".into(),
                fraction_of_limit: 0.5,
                limit_basis: String::new(),
            },
            late_ms: f64::from(pid) / 10.0,
            kernels: "nvrtc".into(),
            device: crate::probe::DeviceInfo {
                name: "test".into(),
                compute_capability: (9, 0),
                sm_count: 132,
                sm_clock_mhz: 1980.0,
                memory_clock_mhz: 2619.0,
                memory_bus_bits: 5120,
                memory_bandwidth_bytes_per_s: 3.35e12,
                fp32_peak_flops: 66.9e12,
                fp32_lanes_per_sm: 128,
            },
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn a_run_is_summarized_against_its_solo_baseline() {
        let solo = client(1, 1000.0, 1.0, 2.0);
        let run =
            summarize(&solo, vec![client(2, 500.0, 2.0, 3.0), client(3, 250.0, 4.0, 8.0)], 3.0);
        assert_eq!(run.clients, 2);
        assert!(close(run.aggregate_throughput_per_s, 750.0));
        assert!(close(run.scaling, 0.75));
        assert!(close(run.per_client[0].slowdown, 2.0));
        assert!(close(run.per_client[1].slowdown, 4.0));
        assert!(close(run.jain_fairness, 750.0 * 750.0 / (2.0 * (250_000.0 + 62_500.0))));
        assert!(close(run.p50_inflation, 3.0));
        assert!(close(run.p99_inflation, 4.0));
        assert!(close(run.max_late_ms, 0.3));
        // The JSON form round-trips.
        let json = serde_json::to_string(&run).unwrap();
        assert_eq!(serde_json::from_str::<RunResult>(&json).unwrap(), run);
    }

    #[test]
    fn run_arguments_parse() {
        let (w, c, s) = parse_run_args(&strings(&["launch", "1,4,7", "3"])).unwrap();
        assert_eq!((w, c, s), (vec![Workload::Launch], vec![1, 4, 7], 3.0));
        assert_eq!(parse_run_args(&strings(&["all", "2", "0.5"])).unwrap().0.len(), 3);
        assert!(parse_run_args(&strings(&["launch", "0", "3"])).is_err());
        assert!(parse_run_args(&strings(&["warp", "1", "3"])).is_err());
        assert!(parse_run_args(&strings(&["launch", "1", "-1"])).is_err());
        assert!(parse_run_args(&strings(&["launch", "1"])).is_err());
    }

    #[test]
    fn a_client_that_cannot_start_is_a_clear_error() {
        let err = run(Path::new("/nonexistent/gpushare-agent"), Workload::Launch, 2, 0.1, &[])
            .unwrap_err();
        assert!(err.contains("starting probe client"), "{err}");
    }

    #[test]
    fn a_failing_client_is_reported_with_its_reason() {
        // `sh -c` stands in for the agent: it ignores the arguments and fails like a
        // client on a host without a driver.
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("fake-client");
        std::fs::write(
            &fake,
            "#!/bin/sh\necho 'gpushare-agent --probe-client: no CUDA driver' >&2\nexit 1\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = run(&fake, Workload::Compute, 3, 0.1, &[]).unwrap_err();
        assert!(err.contains("failed") && err.contains("no CUDA driver"), "{err}");
    }

    #[test]
    fn clients_are_started_together_and_collected() {
        // A fake client speaking the protocol: ready, read the start, report.
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("fake-client");
        let report = r#"{"workload":"launch","pid":PID,"steps":300,"seconds":0.1,"throughput_per_s":3000.0,"p50_ms":0.3,"p99_ms":0.5,"mean_ms":0.3,"achieved":{"value":1.0,"limit":60.0,"unit":"TFLOP/s","fraction_of_limit":0.016,"limit_basis":"x"},"late_ms":0.1,"kernels":"nvrtc","device":{"name":"fake","compute_capability":[9,0],"sm_count":132,"sm_clock_mhz":1980.0,"memory_clock_mhz":2619.0,"memory_bus_bits":5120,"memory_bandwidth_bytes_per_s":3.35e12,"fp32_peak_flops":6.69e13,"fp32_lanes_per_sm":128}}"#;
        let script = format!(
            "#!/bin/sh\necho ready\nread start\n[ \"$start\" -gt 0 ] || exit 3\necho '{}' | sed \"s/PID/$$/\"\n",
            report
        );
        std::fs::write(&fake, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let runs = sweep(&fake, Workload::Launch, &[1, 3], 0.1, &[]).unwrap();
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].clients, 1);
        assert_eq!(runs[1].clients, 3);
        assert!((runs[1].scaling - 3.0).abs() < 1e-9);
        assert!((runs[1].jain_fairness - 1.0).abs() < 1e-9);
        let pids: std::collections::BTreeSet<u32> =
            runs[1].per_client.iter().map(|c| c.pid).collect();
        assert_eq!(pids.len(), 3);
    }
}
