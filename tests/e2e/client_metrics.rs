//! Series per client (issue 29) on `/metrics`: real `sleep` processes stand for clients on
//! a whole GPU (two of one user: one series, memory summed), in a MIG instance
//! (`GPUSHARE_SIM_PROCESSES`, 512 MiB each) and through an MPS server (the simulated control
//! daemon's `--fake-client`); the series carry their labels, promtool lints the exposition,
//! and the series are gone once the processes exit (the agent refreshes every 5 s). A
//! client lost when its MPS server is killed is an info line in the agent's log.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::metrics::{free_port, scrape};

use gpushare_tests::{
    Agent, AgentOptions, MEMBER, SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV, Sleeper, binary, is_root,
    text, wait_for,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// GPU 0 in MIG, GPU 1 under MPS (2 replicas: 50 % threads each), GPU 2 left alone.
const MIXED: &str = "name = \"mixed\"\n\
    [[gpu]]\nselect = 0\nmig = { \"1g\" = 2, \"2g\" = 1, \"3g\" = 1 }\n\
    [[gpu]]\nselect = 1\nsharing = { mps = { replicas = 2 } }\n";

const MEMORY: &str = "gpushare_client_gpu_memory_bytes";
const THREADS: &str = "gpushare_client_mps_active_thread_ratio";

/// The value of the one `name` sample whose labels start with `labels` (everything up to
/// `unit`, whose value depends on where the test runs).
fn sample(body: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = format!("{name}{{{labels},unit=\"");
    let found: Vec<f64> = body
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .map(|l| l.rsplit_once(' ').expect("a value").1.parse().expect("a number"))
        .collect();
    assert!(found.len() <= 1, "{prefix} appears {} times:\n{body}", found.len());
    found.first().copied()
}

/// Client series in `body` (sample lines).
fn client_samples(body: &str) -> Vec<&str> {
    body.lines().filter(|l| l.starts_with(MEMORY) || l.starts_with(THREADS)).collect()
}

/// promtool (Debian's, as CI installs it) lints `body` clean; without it, says so.
pub(crate) fn promtool_accepts(body: &str) {
    let promtool = std::path::Path::new("/usr/bin/promtool");
    if !promtool.exists() {
        eprintln!("promtool not installed (apt-get install prometheus): exposition not linted");
        return;
    }
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "promtool check metrics: {}\n{body}", text(&out));
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "promtool lint: {}", text(&out));
}

#[test]
fn client_series_appear_with_their_labels_and_go_with_their_processes() {
    if !is_root() {
        gpushare_tests::skip("needs root to create test users and own the bus name");
        return;
    }
    let port = free_port();
    let options = AgentOptions {
        config: Some(format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n")),
        ..AgentOptions::simulate("a100-40gb:3").profile("mixed.toml", MIXED)
    };
    let mut agent = Agent::start(options.for_other_users());
    let out = agent.ctl(&["apply", "mixed"]);
    assert!(out.status.success(), "{}", text(&out));
    let status = agent.status();
    let gi = status.gpus[0].instances[0].gpu_instance_id;
    let (gpu0, gpu1, gpu2) =
        (status.gpus[0].uuid.clone(), status.gpus[1].uuid.clone(), status.gpus[2].uuid.clone());

    let whole = Sleeper::start(None, &[]);
    let whole2 = Sleeper::start(None, &[]);
    let in_mig = Sleeper::start(None, &[]);
    let mps_client = Sleeper::start(Some(MEMBER), &[]);
    let processes = format!("2:{},2:{},0/{gi}:{}", whole.pid(), whole2.pid(), in_mig.pid());
    agent.restart_with_env(&[("GPUSHARE_SIM_PROCESSES", &processes)]);
    let server = agent.mps_servers().into_iter().find(|s| s.gpu == 1).expect("GPU 1's server");
    let connect = Command::new(binary(SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV))
        .args(["--fake-client", &mps_client.pid().to_string(), "--memory", "2370MiB"])
        .env("CUDA_MPS_PIPE_DIRECTORY", &server.pipe_directory)
        .output()
        .unwrap();
    assert!(connect.status.success(), "{}", text(&connect));

    let whole_labels = format!("gpu=\"2\",UUID=\"{gpu2}\",GPU_I_ID=\"\",via=\"gpu\",user=\"root\"");
    let mig_labels =
        format!("gpu=\"0\",UUID=\"{gpu0}\",GPU_I_ID=\"{gi}\",via=\"mig\",user=\"root\"");
    let mps_labels =
        format!("gpu=\"1\",UUID=\"{gpu1}\",GPU_I_ID=\"\",via=\"mps\",user=\"{MEMBER}\"");
    let body = wait_for(Duration::from_secs(20), Duration::from_millis(250), || {
        let body = scrape(port);
        if sample(&body, THREADS, &mps_labels).is_some()
            && sample(&body, MEMORY, &mig_labels).is_some()
        {
            return Ok(body);
        }
        Err(format!("the client series never appeared:\n{body}"))
    });
    // Two clients of one user and unit on one GPU: one series, their memory summed.
    assert_eq!(sample(&body, MEMORY, &whole_labels), Some(f64::from(1024 << 20)), "{body}");
    assert_eq!(sample(&body, MEMORY, &mig_labels), Some(f64::from(512 << 20)), "{body}");
    let ratio = f64::from(server.active_thread_percentage) / 100.0;
    assert_eq!(sample(&body, THREADS, &mps_labels), Some(ratio), "{body}");
    // The driver lists an MPS client with its own memory, as driver 580 does.
    assert_eq!(sample(&body, MEMORY, &mps_labels), Some(f64::from(2370u32 << 20)), "{body}");
    assert_eq!(client_samples(&body).len(), 4, "{body}");
    assert!(body.contains("gpushare_client_series_dropped_total 0"), "{body}");
    assert!(!body.contains(&format!("\"{}\"", whole.pid())), "no PID as a label value");
    promtool_accepts(&body);

    // One of the two whole-GPU clients exits: the series stays, with its memory.
    drop(whole2);
    wait_for(Duration::from_secs(20), Duration::from_millis(250), || {
        let body = scrape(port);
        match sample(&body, MEMORY, &whole_labels) {
            Some(v) if v == f64::from(512 << 20) => Ok(()),
            v => Err(format!("{whole_labels}: {v:?}:\n{body}")),
        }
    });
    // All exit: no client series left.
    drop((whole, in_mig, mps_client));
    let body = wait_for(Duration::from_secs(20), Duration::from_millis(250), || {
        let body = scrape(port);
        if client_samples(&body).is_empty() {
            return Ok(body);
        }
        Err(format!("client series left after the clients exited:\n{body}"))
    });
    promtool_accepts(&body);
}

#[test]
fn a_client_lost_to_an_mps_server_fault_is_logged() {
    if !is_root() {
        gpushare_tests::skip("needs root to own the bus name");
        return;
    }
    let port = free_port();
    let log = tempfile::NamedTempFile::new().unwrap();
    let options = AgentOptions {
        config: Some(format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n")),
        ..AgentOptions::simulate("h100-80gb:1")
            .env("GPUSHARE_LOG", "warn,gpushare_agent::metrics=info")
            .stderr_to(log.path())
    };
    let agent = Agent::start(options);
    assert!(agent.ctl(&["apply", "all-mps"]).status.success());
    let server = agent.mps_servers()[0].clone();
    let client = Sleeper::start(None, &[]);
    let connect = Command::new(binary(SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV))
        .args(["--fake-client", &client.pid().to_string()])
        .env("CUDA_MPS_PIPE_DIRECTORY", &server.pipe_directory)
        .output()
        .unwrap();
    assert!(connect.status.success(), "{}", text(&connect));
    // A refresh has seen the client.
    wait_for(Duration::from_secs(20), Duration::from_millis(250), || {
        let body = scrape(port);
        if body.lines().any(|l| l.starts_with(THREADS)) {
            return Ok(());
        }
        Err(format!("the client's series never appeared:\n{body}"))
    });
    let _ = kill(Pid::from_raw(server.pid.expect("the server's pid") as i32), Signal::SIGKILL);
    let said = wait_for(Duration::from_secs(20), Duration::from_millis(250), || {
        let said = std::fs::read_to_string(log.path()).unwrap_or_default();
        if said.contains("ended as its MPS server (") {
            return Ok(said);
        }
        Err(format!("no line about the client's end:\n{said}"))
    });
    let line = format!("client {} (root", client.pid());
    assert!(said.contains(&line), "{said}");
    assert!(!said.contains("started on"), "starts are debug lines: {said}");
}
