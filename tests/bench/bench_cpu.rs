//! `--bench-cpu ROUNDS --against DIR`: the agent's own CPU over a bench's measurement
//! windows, this build against another, on simulated GPUs (issue 39: "the agent's CPU over
//! a bench window no worse than before").
//!
//! Both agents run at once on their own buses; each round runs the same bench on one and
//! then the other, the order alternating, so that whatever else the machine does weighs on
//! both alike. A replica is a shell loop that reports units of work as fast as it can,
//! pausing briefly every 200 units: the agent reads every line, so this is the heavy end
//! of what its report reader sees. Every window's `agent_cpu_percent` (the agent's
//! `getrusage` over the window, in percent of one core) is collected; the table gives the
//! medians per build.

use std::path::Path;

use gpushare_proto::bench::BenchReport;
use gpushare_tests::{Agent, AgentOptions, text};

/// Reports units as fast as a shell can write them, with a short pause every 200.
const BUSY_REPLICA: &str = r#"#!/bin/sh
i=0
while :; do
  echo 2 >&3
  i=$((i + 1))
  if [ $((i % 200)) -eq 0 ]; then sleep 0.02; fi
done
"#;

/// The bench each round runs: MPS and time-slicing with 1 and 2 replicas, 5 s windows.
const BENCH: &[&str] = &[
    "bench",
    "--target",
    "0",
    "--replicas",
    "1,2",
    "--strategies",
    "time-slicing,mps",
    "--no-pin",
    "--duration",
    "5s",
    "--json",
    "--",
    "/bin/sh",
    "replica.sh",
];

/// The windows of one bench: (agent CPU %, units per second) of the baseline and each run.
fn windows(agent: &Agent, dir: &Path) -> Vec<(f64, f64)> {
    let out = agent.ctl_command(BENCH).current_dir(dir).output().expect("gpushare-ctl runs");
    assert!(out.status.success(), "bench failed: {}", text(&out));
    let report: BenchReport = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bench --json printed no report ({e}): {}", text(&out)));
    let runs = report.baseline.iter().chain(report.strategies.iter().flat_map(|s| s.runs.iter()));
    runs.filter_map(|r| Some((r.agent_cpu_percent?, r.throughput_per_s))).collect()
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

pub fn bench_cpu(other: &Path, spec: &str, rounds: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("replica.sh"), BUSY_REPLICA).expect("replica.sh written");
    // The benches run in the replica's directory: a relative DIR would not be found there.
    let other = &other.canonicalize().expect("--against DIR exists");
    let theirs = Agent::start(AgentOptions::simulate(spec).binaries(other));
    let ours = Agent::start(AgentOptions::simulate(spec));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        if round % 2 == 0 {
            a.extend(windows(&theirs, dir.path()));
            b.extend(windows(&ours, dir.path()));
        } else {
            b.extend(windows(&ours, dir.path()));
            a.extend(windows(&theirs, dir.path()));
        }
    }
    println!(
        "Simulated {spec}; {rounds} benches on each build (`gpushare-ctl {}`, a replica \
         that reports units as fast as a shell loop can), one build and then the other in \
         alternating order; the build in {} is \"other\".\n",
        BENCH.join(" "),
        other.display()
    );
    println!("| build | windows | median agent CPU % of a core | median units/s |");
    println!("|---|---|---|---|");
    for (name, w) in [("other", &a), ("this", &b)] {
        let mut cpu: Vec<f64> = w.iter().map(|x| x.0).collect();
        let mut units: Vec<f64> = w.iter().map(|x| x.1).collect();
        assert!(!cpu.is_empty(), "the {name} build's benches reported no agent CPU");
        println!(
            "| {name} | {} | {:.2} | {:.0} |",
            cpu.len(),
            median(&mut cpu),
            median(&mut units)
        );
    }
}
