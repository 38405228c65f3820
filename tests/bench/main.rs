//! `gpushare-bench`: measures what BENCHMARKS.md reports, through the real binaries on a
//! private bus, and prints Markdown.
//!
//! ```text
//! gpushare-bench [--simulate a100-40gb:8 | --nvml] [--runs 50] [--applies 100]
//! gpushare-bench --against DIR [--simulate a100-40gb:8] [--runs 200]
//! ```
//!
//! gpushare-bench --flood [--against DIR] [--simulate a100-40gb:1]
//! gpushare-bench --floods [KIND,...] [--against DIR] [--simulate a100-40gb:1]
//! gpushare-bench --clients 8 [--simulate a100-40gb:8] [--runs 50]
//! gpushare-bench --time RUNS -- COMMAND [ARGS...]
//! gpushare-bench --bench-cpu ROUNDS --against DIR [--simulate a100-40gb:1]
//!
//! `--time` times any command (an agent already running, `nvidia-smi`) the way the rest
//! times `gpushare-ctl`, and prints its row: the device scripts use it so that their
//! figures compare with these.
//! ```
//!
//! `--flood` (root: the flood runs as the tests' other user, on a system-type bus with
//! the package's policy) times root's `status` while another user floods the agent with
//! 64 connections × 100 pipelined `Export`s, then reads the agent's resident memory after
//! that and after 24 × 30 MiB origins; with `--against DIR` the other build is measured
//! the same way right after.
//!
//! ```text
//! `--against DIR` compares this build with the `gpushare-agent` and `gpushare-ctl` of
//! DIR (another build): both agents run at once on their own buses, and each timed call
//! goes to one and then the other (the order alternating), so that whatever else the
//! machine does weighs on both alike.
//!
//! With `--nvml` the agent runs on the real GPUs with `manage_mig = false` and
//! `manage_compute_mode = false`: it changes nothing, so only status and a no-op apply are
//! timed. `nvidia-smi` is timed alongside when it is on the PATH.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use gpushare_tests::{Agent, AgentOptions, text};

mod bench_cpu;
mod floods;

struct Args {
    simulate: Option<String>,
    runs: usize,
    applies: usize,
    /// Per-call delay for the parallel-against-serial comparison; none skips it.
    mig_delay_ms: Option<u64>,
    /// Another build's binaries to compare with.
    against: Option<PathBuf>,
    /// Root's status under another user's flood of reads.
    flood: bool,
    /// Issue 36's floods, each kind (or those named).
    floods: Option<Option<String>>,
    /// `status` and `clients` with this many MPS clients (issue 29).
    clients: Option<usize>,
    /// `--time`: the command to time, `runs` times.
    time: Option<Vec<String>>,
    /// `--bench-cpu ROUNDS`: the agent's CPU over bench windows, against `--against`.
    bench_cpu: Option<usize>,
}

fn parse_args() -> Args {
    let mut args = Args {
        simulate: Some("a100-40gb:8".into()),
        runs: 50,
        applies: 100,
        mig_delay_ms: None,
        against: None,
        flood: false,
        floods: None,
        clients: None,
        time: None,
        bench_cpu: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--simulate" => args.simulate = it.next(),
            "--nvml" => args.simulate = None,
            "--runs" => args.runs = it.next().and_then(|n| n.parse().ok()).expect("--runs N"),
            "--mig-delay-ms" => {
                args.mig_delay_ms = it.next().and_then(|n| n.parse().ok());
                assert!(args.mig_delay_ms.is_some(), "--mig-delay-ms MS");
            }
            "--against" => args.against = Some(it.next().expect("--against DIR").into()),
            "--flood" => args.flood = true,
            "--floods" => args.floods = Some(None),
            kinds if args.floods == Some(None) && !kinds.starts_with("--") => {
                args.floods = Some(Some(kinds.to_string()))
            }
            "--time" => {
                args.runs = it.next().and_then(|n| n.parse().ok()).expect("--time RUNS -- COMMAND");
                assert_eq!(it.next().as_deref(), Some("--"), "--time RUNS -- COMMAND");
                let command: Vec<String> = it.by_ref().collect();
                assert!(!command.is_empty(), "--time RUNS -- COMMAND");
                args.time = Some(command);
            }
            "--bench-cpu" => {
                args.bench_cpu = it.next().and_then(|n| n.parse().ok());
                assert!(args.bench_cpu.is_some(), "--bench-cpu ROUNDS");
            }
            "--clients" => {
                args.clients = it.next().and_then(|n| n.parse().ok());
                assert!(args.clients.is_some(), "--clients N");
            }
            "--applies" => {
                args.applies = it.next().and_then(|n| n.parse().ok()).expect("--applies N")
            }
            other => {
                eprintln!("gpushare-bench: unknown argument {other:?}");
                std::process::exit(2);
            }
        }
    }
    args
}

/// Wall time of `runs` runs of a command, from spawn to exit; each must succeed.
fn time_runs(runs: usize, mut command: impl FnMut() -> Command) -> Vec<Duration> {
    (0..runs)
        .map(|_| {
            let mut cmd = command();
            let start = Instant::now();
            let out = cmd.output().expect("command runs");
            let elapsed = start.elapsed();
            assert!(out.status.success(), "{cmd:?} failed: {}", text(&out));
            elapsed
        })
        .collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn row(what: &str, samples: &mut [Duration]) {
    samples.sort();
    let n = samples.len();
    println!(
        "| {what} | {n} | {:.2} | {:.2} | {:.2} | {:.2} |",
        ms(samples[n / 2]),
        ms(samples[0]),
        ms(samples[(n * 9 / 10).min(n - 1)]),
        ms(samples[n - 1])
    );
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("memory field")
}

/// `half-balanced` on 8 simulated A100s with a delay per driver call, all GPUs at once
/// against one GPU at a time (`max_parallel_gpus = 1`), from MIG off each time.
fn parallel_against_serial(delay_ms: u64, runs: usize) {
    println!(
        "Per-call delay {delay_ms} ms, `gpushare-ctl apply half-balanced` from all-disabled on 8 simulated A100-40GB (40 calls on 4 GPUs)\n"
    );
    println!("| measurement | runs | median ms | min ms | p90 ms | max ms |");
    println!("|---|---|---|---|---|---|");
    for (label, config) in [
        ("all GPUs at once (default)", ""),
        ("one GPU at a time (`max_parallel_gpus = 1`)", "[apply]\nmax_parallel_gpus = 1\n"),
    ] {
        let options = AgentOptions::simulate("a100-40gb:8")
            .env("GPUSHARE_SIM_DELAY_MS", &delay_ms.to_string())
            .config(config);
        let agent = Agent::start(options);
        let mut samples = Vec::new();
        for _ in 0..runs {
            samples.extend(time_runs(1, || agent.ctl_command(&["apply", "half-balanced"])));
            time_runs(1, || agent.ctl_command(&["apply", "all-disabled"]));
        }
        row(label, &mut samples);
    }
}

/// The median of `samples`, in ms.
fn median_ms(samples: &mut [Duration]) -> f64 {
    samples.sort();
    ms(samples[samples.len() / 2])
}

/// Status, status as JSON and an idempotent re-apply of this build against the build in
/// `other`, interleaved call by call; prints medians and their ratio (this build over the
/// other).
fn side_by_side(other: &std::path::Path, spec: &str, runs: usize) {
    let theirs = Agent::start(AgentOptions::simulate(spec).binaries(other));
    let ours = Agent::start(AgentOptions::simulate(spec));
    for agent in [&theirs, &ours] {
        let out = agent.ctl(&["apply", "half-balanced"]);
        assert!(out.status.success(), "{}", text(&out));
    }
    println!(
        "Simulated {spec}; {runs} calls to each build, each call to the build in {} and to \
         this one in turn, in alternating order.\n",
        other.display()
    );
    println!("| measurement | other build median ms | this build median ms | this / other |");
    println!("|---|---|---|---|");
    let cases: [(&str, &[&str]); 3] = [
        ("`gpushare-ctl status`", &["status"]),
        ("`gpushare-ctl status --json`", &["status", "--json"]),
        ("`gpushare-ctl apply half-balanced` again (idempotent)", &["apply", "half-balanced"]),
    ];
    for (what, args) in cases {
        let (mut a, mut b) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
        for i in 0..runs {
            let one = |agent: &Agent| time_runs(1, || agent.ctl_command(args))[0];
            if i % 2 == 0 {
                a.push(one(&theirs));
                b.push(one(&ours));
            } else {
                b.push(one(&ours));
                a.push(one(&theirs));
            }
        }
        let (theirs_ms, ours_ms) = (median_ms(&mut a), median_ms(&mut b));
        println!("| {what} | {theirs_ms:.2} | {ours_ms:.2} | {:.3} |", ours_ms / theirs_ms);
    }
}

/// `--clients N` (issue 29): `status`, `status --json` and `clients --json` with no client,
/// then with N clients of GPU 0's MPS server (`all-mps`; `sleep` processes announced to the
/// simulated control daemon with 2 GiB each, which the simulated driver then lists as MPS
/// clients), each beside the simulated nvidia-smi's process query, the bare driver read.
fn with_clients(spec: &str, n: usize, runs: usize) {
    use gpushare_tests::{SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV, binary};
    let agent = Agent::start(AgentOptions::simulate(spec));
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "{}", text(&out));
    let server = agent.mps_servers().into_iter().find(|s| s.gpu == 0).expect("GPU 0's server");
    println!("Backend: simulated {spec}, all-mps\n");
    println!("| measurement | runs | median ms | min ms | p90 ms | max ms |");
    println!("|---|---|---|---|---|---|");
    let timed = |clients: usize| {
        let cases: [(&str, &[&str]); 3] = [
            ("`gpushare-ctl status`", &["status"]),
            ("`gpushare-ctl status --json`", &["status", "--json"]),
            ("`gpushare-ctl clients --json`", &["clients", "--json"]),
        ];
        for (what, args) in cases {
            let mut samples = time_runs(runs, || agent.ctl_command(args));
            row(&format!("{what}, {clients} clients"), &mut samples);
        }
        let query = ["--query-compute-apps=pid,used_memory", "--format=csv"];
        let mut smi = time_runs(runs, || {
            let mut c = Command::new(binary(
                gpushare_tests::SIM_NVIDIA_SMI,
                gpushare_tests::SIM_NVIDIA_SMI_ENV,
            ));
            c.args(query).env("GPUSHARE_SIM_STATE", agent.sim_state());
            c
        });
        row(&format!("simulated `nvidia-smi {}`, {clients} clients", query.join(" ")), &mut smi);
    };
    timed(0);
    let mut sleepers: Vec<std::process::Child> =
        (0..n).map(|_| Command::new("sleep").arg("600").spawn().expect("sleep starts")).collect();
    for s in &sleepers {
        let out = Command::new(binary(SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV))
            .args(["--fake-client", &s.id().to_string(), "--memory", "2GiB"])
            .env("CUDA_MPS_PIPE_DIRECTORY", &server.pipe_directory)
            .output()
            .expect("the simulated control client runs");
        assert!(out.status.success(), "{}", text(&out));
    }
    let table: gpushare_proto::clients::ClientTable = agent.ctl_doc(&["clients"]);
    assert_eq!(table.clients.len(), n, "{table:#?}");
    let status = agent.status();
    assert_eq!(status.gpus[0].clients.len(), n, "status lists every client");
    timed(n);
    for s in &mut sleepers {
        let _ = s.kill();
        let _ = s.wait();
    }
}

fn main() {
    let args = parse_args();
    if let Some(delay) = args.mig_delay_ms {
        parallel_against_serial(delay, 5);
        return;
    }
    if let Some(command) = &args.time {
        let mut samples = time_runs(args.runs, || {
            let mut c = Command::new(&command[0]);
            c.args(&command[1..]);
            c
        });
        let program = command[0].rsplit('/').next().unwrap_or(&command[0]);
        let shown: Vec<&str> =
            std::iter::once(program).chain(command[1..].iter().map(String::as_str)).collect();
        row(&format!("`{}`", shown.join(" ")), &mut samples);
        return;
    }
    if let Some(rounds) = args.bench_cpu {
        let other = args.against.as_deref().expect("--bench-cpu ROUNDS needs --against DIR");
        bench_cpu::bench_cpu(other, args.simulate.as_deref().unwrap_or("a100-40gb:1"), rounds);
        return;
    }
    if let Some(n) = args.clients {
        with_clients(args.simulate.as_deref().unwrap_or("a100-40gb:8"), n, args.runs);
        return;
    }
    if let Some(only) = &args.floods {
        let spec = args.simulate.as_deref().unwrap_or("a100-40gb:1");
        floods::floods(spec, args.against.as_deref(), only.as_deref());
        return;
    }
    if args.flood {
        flood(args.simulate.as_deref().unwrap_or("a100-40gb:1"), args.against.as_deref());
        return;
    }
    if let Some(other) = &args.against {
        let spec = args.simulate.as_deref().unwrap_or("a100-40gb:8");
        side_by_side(other, spec, args.runs);
        return;
    }
    let options = match &args.simulate {
        Some(spec) => AgentOptions::simulate(spec),
        None => AgentOptions::default()
            .config("[gpu]\nmanage_mig = false\nmanage_compute_mode = false\n"),
    };
    let backend =
        args.simulate.clone().map_or("NVML (hands off)".to_string(), |s| format!("simulated {s}"));
    let agent = Agent::start(options);
    let pid = agent.pid().expect("agent pid");
    let rss_start = rss_kib(pid, "VmRSS:");

    println!("Backend: {backend}\n");
    println!("| measurement | runs | median ms | min ms | p90 ms | max ms |");
    println!("|---|---|---|---|---|---|");

    let mut status = time_runs(args.runs, || agent.ctl_command(&["status"]));
    row("`gpushare-ctl status`", &mut status);
    let mut status_json = time_runs(args.runs, || agent.ctl_command(&["status", "--json"]));
    row("`gpushare-ctl status --json`", &mut status_json);

    if Command::new("nvidia-smi").arg("-L").output().is_ok_and(|o| o.status.success()) {
        let mut smi = time_runs(args.runs, || {
            let mut c = Command::new("nvidia-smi");
            c.args([
                "--query-gpu=index,uuid,name,mig.mode.current,compute_mode,memory.total",
                "--format=csv",
            ]);
            c
        });
        row(
            "`nvidia-smi --query-gpu=index,uuid,name,mig.mode.current,compute_mode,memory.total --format=csv`",
            &mut smi,
        );
    }

    let profile = if args.simulate.is_some() { "half-balanced" } else { "all-disabled" };
    if args.simulate.is_some() {
        let mut first = time_runs(1, || agent.ctl_command(&["apply", profile]));
        row(&format!("`gpushare-ctl apply {profile}` from all MIG off (changes)"), &mut first);
    } else {
        // Hands off: the first apply records the profile, the rest are the timed no-ops.
        time_runs(1, || agent.ctl_command(&["apply", profile]));
    }
    let mut again = time_runs(args.runs, || agent.ctl_command(&["apply", profile]));
    row(&format!("`gpushare-ctl apply {profile}` again (idempotent)"), &mut again);

    let mut rss_lines = vec![format!("| after start | {rss_start} |")];
    if args.simulate.is_some() {
        let rss_before = rss_kib(pid, "VmRSS:");
        rss_lines.push(format!("| after the timed runs | {rss_before} |"));
        let mut changing = Vec::new();
        // Two rounds: memory must not grow from the first round to the second.
        for round in 1..=2 {
            for i in 0..args.applies {
                let target = if i % 2 == 0 { "all-balanced" } else { "half-balanced" };
                changing.extend(time_runs(1, || agent.ctl_command(&["apply", target])));
            }
            rss_lines.push(format!(
                "| after {} more applies that change the GPUs | {} |",
                round * args.applies,
                rss_kib(pid, "VmRSS:")
            ));
        }
        if !changing.is_empty() {
            row(
                &format!(
                    "`gpushare-ctl apply` alternating all-balanced / half-balanced ({} applies)",
                    2 * args.applies
                ),
                &mut changing,
            );
        }
    }
    rss_lines.push(format!("| peak (VmHWM) | {} |", rss_kib(pid, "VmHWM:")));
    println!("\n| agent resident memory | KiB |\n|---|---|");
    for l in rss_lines {
        println!("{l}");
    }
}

/// `--flood`: root's `status` while another user floods the agent with reads, and the
/// agent's memory after (issue 23), for this build and then the one of `against`.
fn flood(spec: &str, against: Option<&std::path::Path>) {
    use gpushare_tests::OTHER;
    assert!(gpushare_tests::is_root(), "--flood needs root: the flood runs as {OTHER}");
    println!("Backend: simulated {spec}; the flood from {OTHER}, status from root\n");
    println!(
        "| build | root's `status` during 64 × 100 pipelined `Export`s: p50 / p99 / max ms | the flood | RSS after it | 24 × 30 MiB origins | RSS after them |"
    );
    println!("|---|---|---|---|---|---|");
    let builds = std::iter::once(None).chain(against.map(Some));
    for dir in builds {
        let mut options = AgentOptions::simulate(spec).for_other_users();
        if let Some(dir) = dir {
            options = options.binaries(dir);
        }
        let agent = Agent::start(options);
        let pid = agent.pid().expect("agent pid");
        let as_other = |args: &[&str]| {
            let mut cmd = agent.call_command(Some(OTHER), args);
            cmd.stdout(std::process::Stdio::piped());
            cmd
        };
        let flooding = as_other(&["flood", "64", "100", "Export"]).spawn().expect("the flood");
        std::thread::sleep(Duration::from_millis(300));
        let latency = agent.call(None, &["latency", "40"]);
        let flooded = flooding.wait_with_output().expect("the flood ends");
        let flooded = String::from_utf8_lossy(&flooded.stdout).trim().replace("flooded ", "");
        let rss_flood = rss_kib(pid, "VmRSS:");
        let origins = as_other(&["flood", "24", "1", "Origin:31457280"]).output().unwrap();
        let origins = String::from_utf8_lossy(&origins.stdout).trim().replace("flooded ", "");
        let rss_origins = rss_kib(pid, "VmRSS:");
        let label = dir.map_or("this build".to_string(), |d| format!("`{}`", d.display()));
        let latency = latency.replace("p50 ", "").replace(" p99 ", " / ").replace(" max ", " / ");
        println!(
            "| {label} | {latency} | {flooded} | {:.1} MiB | {origins} | {:.1} MiB |",
            rss_flood as f64 / 1024.0,
            rss_origins as f64 / 1024.0
        );
    }
}
