//! Issue 42: a GPU that fails under sharing. Faults raised in the simulated driver the way
//! the real one reports them (`gpushare-sim-fault`: an Xid delivered to every waiting event
//! set, a GPU off the bus, a pending row remap) and an MPS server killed; each must show in
//! `status` with its action, name its clients in the journal line, move the metrics, refuse
//! a profile that would build there with nothing changed, and leave the CDI spec (and a
//! podman container asking for it) without its devices, while the other GPU's shares go
//! on; `gpushare-ctl gpu reset` (or the clean check) brings it back.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use gpushare_proto::health::HealthFault;
use gpushare_proto::types::{MpsServer, Status};
use gpushare_tests::{
    Agent, AgentOptions, SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV, Sleeper, binary, is_root, text,
    wait_for,
};
use serde_json::Value;

use crate::metrics::{free_port, scrape};
use crate::nvidia_clients::pynvml_python;

/// How long a fault may take to show: far above the watcher's poll (1 s) and slice
/// (0.5 s), so that a loaded machine does not fail the test.
const SHOWS: Duration = Duration::from_secs(30);
const EVERY: Duration = Duration::from_millis(100);

/// The simulated driver's fault tool.
const SIM_FAULT: &str = "gpushare-sim-fault";
const SIM_FAULT_ENV: &str = "GPUSHARE_SIM_FAULT_BIN";

/// An agent on `spec` with the MPS check every second and metrics on a free port; its
/// log goes to `<dir>/agent.log`.
struct Node {
    agent: Agent,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Node {
    fn start(spec: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("agent.log");
        let port = free_port();
        let config = format!(
            "[mps]\nhealth_interval_seconds = 1\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n"
        );
        let options = AgentOptions { config: Some(config), ..AgentOptions::simulate(spec) };
        let agent = Agent::start(options.stderr_to(&log));
        Node { agent, port, log, _dir: dir }
    }

    /// Runs the fault tool on this node.
    fn fault(&self, args: &[&str]) {
        let out = fault_tool(&self.agent.sim_state(), args);
        assert!(out.status.success(), "{SIM_FAULT} {args:?}: {}", text(&out));
    }

    fn apply(&self, profile: &str) {
        let out = self.agent.ctl(&["apply", profile]);
        assert!(out.status.success(), "apply {profile}: {}", text(&out));
    }

    /// The fault of `class` on `gpu` now, or what the GPU has instead.
    fn fault_now(&self, gpu: usize, class: &str) -> Result<HealthFault, String> {
        let status = self.agent.status();
        status.gpus[gpu]
            .health
            .iter()
            .find(|f| f.class == class)
            .cloned()
            .ok_or_else(|| format!("no {class} fault on GPU {gpu}: {:?}", status.gpus[gpu].health))
    }

    /// Waits for a fault of `class` on `gpu`.
    fn wait_fault(&self, gpu: usize, class: &str) -> HealthFault {
        wait_for(SHOWS, EVERY, || self.fault_now(gpu, class))
    }

    /// Waits for a fault of `class` on `gpu` whose clients the agent has read.
    fn wait_named(&self, gpu: usize, class: &str) -> HealthFault {
        wait_for(SHOWS, EVERY, || {
            let fault = self.fault_now(gpu, class)?;
            match fault.clients {
                Some(_) => Ok(fault),
                None => Err(format!("the clients of {fault:?} are not read yet")),
            }
        })
    }

    /// Waits until `gpu` has no fault.
    fn wait_healthy(&self, gpu: usize) -> Status {
        wait_for(SHOWS, EVERY, || {
            let status = self.agent.status();
            if status.gpus[gpu].health.is_empty() {
                Ok(status)
            } else {
                Err(format!("GPU {gpu} still unhealthy: {:?}", status.gpus[gpu].health))
            }
        })
    }

    /// Waits for a line of the agent's log holding every one of `words`.
    fn wait_log(&self, words: &[&str]) -> String {
        wait_for(SHOWS, EVERY, || {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            log.lines()
                .find(|l| words.iter().all(|w| l.contains(w)))
                .map(str::to_string)
                .ok_or_else(|| format!("no log line with {words:?}:\n{log}"))
        })
    }

    /// Waits for the sample of `name` with (at least) `labels` to be `value`.
    fn wait_metric(&self, name: &str, labels: &[(&str, &str)], value: &str) {
        wait_for(SHOWS, EVERY, || {
            let body = scrape(self.port);
            let line = body.lines().find(|l| {
                l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{'))
                    && labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
            });
            match line {
                Some(l) if l.rsplit(' ').next() == Some(value) => Ok(()),
                _ => Err(format!("{name}{labels:?} is not {value}:\n{body}")),
            }
        })
    }

    /// The names of the CDI spec's devices.
    fn cdi_names(&self) -> Vec<String> {
        crate::cdi::names(&crate::cdi::spec(&self.agent))
    }

    /// Waits until the CDI spec's names satisfy `ok`.
    fn wait_cdi(&self, what: &str, ok: impl Fn(&[String]) -> bool) -> Vec<String> {
        wait_for(SHOWS, EVERY, || {
            let names = self.cdi_names();
            if ok(&names) { Ok(names) } else { Err(format!("CDI spec not {what}: {names:?}")) }
        })
    }

    fn server_on(&self, gpu: u32) -> MpsServer {
        self.agent.mps_servers().into_iter().find(|s| s.gpu == gpu).expect("a server on the GPU")
    }
}

fn fault_tool(state: &Path, args: &[&str]) -> Output {
    Command::new(binary(SIM_FAULT, SIM_FAULT_ENV))
        .args(args)
        .env("GPUSHARE_SIM_STATE", state)
        .stdin(Stdio::null())
        .output()
        .expect("the fault tool runs")
}

/// Tells the simulated control daemon of `pipe` that `pid` is its client.
fn announce(pipe: &str, pid: u32) {
    let out = Command::new(binary(SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV))
        .args(["--fake-client", &pid.to_string()])
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "--fake-client: {}", text(&out));
}

/// NVIDIA's nvidia-ml-py waiting on the critical events of every GPU of `agent`'s node
/// (`tests/nvidia/pynvml_events.py`), started and registered; [`PynvmlWaiter::first_event`]
/// gives what it saw. Killed if the test ends first.
struct PynvmlWaiter(Option<Child>);

impl PynvmlWaiter {
    fn start(spec: &str, agent: &Agent) -> PynvmlWaiter {
        let mut child = pynvml_python(spec, &agent.sim_state())
            .arg(gpushare_tests::repo_root().join("tests/nvidia/pynvml_events.py"))
            .args(["--count", "1", "--timeout-s", "60"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        let ready: Option<Value> = serde_json::from_str(&line).ok();
        if ready.as_ref().and_then(|r| r["ready"].as_u64()).is_none_or(|n| n == 0) {
            let out = child.wait_with_output().unwrap();
            panic!("the pynvml waiter did not register ({line}): {}", text(&out));
        }
        PynvmlWaiter(Some(child))
    }

    fn first_event(mut self) -> Value {
        let out = self.0.take().expect("waiting").wait_with_output().unwrap();
        assert!(out.status.success(), "pynvml waiter: {}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("one event as JSON")
    }
}

impl Drop for PynvmlWaiter {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The error line of a failed ctl call.
fn refusal(out: &Output) -> String {
    assert!(!out.status.success(), "should have been refused: {}", text(out));
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn a_fatal_xid_takes_a_whole_gpu_out_until_it_is_reset() {
    if !is_root() {
        gpushare_tests::skip("the simulator makes the CDI spec's device nodes only as root");
        return;
    }
    let spec = "h100-80gb:2";
    let node = Node::start(spec);
    node.apply("all-mps");
    let (gpu0, gpu1) = (node.server_on(0), node.server_on(1));
    let status = node.agent.status();
    let uuid1 = status.gpus[1].uuid.clone();
    let client = Sleeper::start(None, &[]);
    announce(&gpu1.pipe_directory, client.pid());
    node.wait_metric("gpushare_gpu_healthy", &[("gpu", "1")], "1");
    let waiter = PynvmlWaiter::start(spec, &node.agent);

    // Xid 48, a double-bit ECC error: the catalogue asks for a GPU reset.
    node.fault(&["xid", "1", "48"]);
    let fault = node.wait_fault(1, "xid");
    assert_eq!((fault.xid, fault.action.as_str()), (Some(48), "reset-gpu"));
    assert_eq!((fault.gpu_instance_id, fault.compute_instance_id), (None, None));
    // NVIDIA's own client on the same node saw the same Xid.
    let seen = waiter.first_event();
    assert_eq!((seen["gpu"].as_u64(), seen["eventData"].as_u64()), (Some(1), Some(48)), "{seen}");
    assert_eq!(seen["gpuInstanceId"].as_u64(), Some(0xFFFF_FFFF), "{seen}");
    // The journal line names the client and its user.
    let pid = client.pid().to_string();
    let line = node.wait_log(&["Xid 48", "reset the GPU", &format!("pid {pid}")]);
    assert!(line.contains("root"), "{line}");
    node.wait_metric("gpushare_gpu_healthy", &[("gpu", "1")], "0");
    node.wait_metric("gpushare_gpu_faults", &[("class", "xid"), ("gpu", "1")], "1");
    // The CDI spec no longer names GPU 1, and podman cannot hand it out.
    let names = node.wait_cdi("without GPU 1", |n| !n.iter().any(|d| d == "1" || *d == uuid1));
    assert!(names.iter().any(|d| d == "0"), "{names:?}");
    if let Some(podman) = gpushare_tests::Podman::available() {
        let dir = node.agent.sim_state().parent().unwrap().join("cdi");
        let podman = podman.with_cdi_dir(&dir);
        gpushare_tests::podman::assert_unresolvable(
            &podman.run(&["gpushare.io/gpu=1"], "true"),
            "gpushare.io/gpu=1",
        );
        let out = podman.run(&["gpushare.io/gpu=0"], "echo $CUDA_VISIBLE_DEVICES");
        assert!(out.status.success(), "{}", text(&out));
    }
    // A profile that would build on GPU 1 is refused, in one line, nothing changed; even
    // forced (which only lets it stop the MPS server under its client).
    let before = node.agent.status();
    let why = refusal(&node.agent.ctl(&["apply", "all-balanced", "--force"]));
    assert!(why.contains("GPU 1") && why.contains("Xid 48"), "{why}");
    assert_eq!(why.trim().lines().count(), 1, "{why}");
    let after = node.agent.status();
    assert_eq!(after.active_profile, before.active_profile);
    assert_eq!(gpushare_tests::layout(&after), gpushare_tests::layout(&before));
    // GPU 0's share goes on: the same MPS server.
    assert_eq!(node.server_on(0).pid, gpu0.pid);

    // A reset is refused while the client is there, for a healthy GPU, and for no GPU.
    let why = refusal(&node.agent.ctl(&["gpu", "reset", "1"]));
    assert!(why.contains(&pid), "{why}");
    assert!(refusal(&node.agent.ctl(&["gpu", "reset", "0"])).contains("healthy"));
    assert!(refusal(&node.agent.ctl(&["gpu", "reset", "7"])).contains("no such GPU"));
    assert!(!node.agent.status().gpus[1].health.is_empty());

    client.end();
    // `plan` (and `apply --dry-run`) says what an apply would: refused for the fault.
    let planned = refusal(&node.agent.ctl(&["plan", "all-balanced"]));
    assert!(planned.contains("GPU 1") && planned.contains("Xid 48"), "{planned}");
    let out = node.agent.ctl(&["gpu", "reset", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    let status = node.wait_healthy(1);
    assert_eq!(status.active_profile.as_deref(), Some("all-mps"));
    // Back in the profile: a new MPS server on GPU 1, the same one on GPU 0.
    let again = node.server_on(1);
    assert!(again.pid.is_some() && again.pid != gpu1.pid, "{again:?}");
    assert_eq!(node.server_on(0).pid, gpu0.pid);
    node.wait_cdi("with GPU 1 again", |n| n.iter().any(|d| d == "1"));
    node.wait_metric("gpushare_gpu_healthy", &[("gpu", "1")], "1");
    assert!(node.agent.nvidia_smi(&["-q", "-i", "1"]).status.success());
}

#[test]
fn an_xid_on_one_mig_instance_takes_out_that_instance_alone_until_its_clients_end() {
    if !is_root() {
        gpushare_tests::skip("the simulator makes the CDI spec's device nodes only as root");
        return;
    }
    let mut node = Node::start("h100-80gb:1");
    let layout = "name = \"two-3g\"\n[[gpu]]\nselect = \"all\"\nmig = { \"3g\" = 2 }\n";
    let shared = "name = \"two-3g-mps\"\n[[gpu]]\nselect = \"all\"\nmig = { \"3g\" = 2 }\nsharing.mps = { replicas = 2 }\n";
    let (_d, plain) = gpushare_tests::temp_file("two-3g.toml", layout);
    let (_e, with_mps) = gpushare_tests::temp_file("two-3g-mps.toml", shared);
    let applied = node.agent.ctl(&["apply", "-f", plain.to_str().unwrap()]);
    assert!(applied.status.success(), "{}", text(&applied));
    let status = node.agent.status();
    let (hit, other) = (&status.gpus[0].instances[0], &status.gpus[0].instances[1]);
    let (gi, ci) = (hit.gpu_instance_id, hit.compute_instance_id.unwrap());
    let (hit_uuid, other_uuid) = (hit.uuid.clone().unwrap(), other.uuid.clone().unwrap());
    let client = Sleeper::start(None, &[]);
    node.agent.restart_with_env(&[("GPUSHARE_SIM_PROCESSES", &format!("0/{gi}:{}", client.pid()))]);

    // Xid 31 (a memory page fault, the application's): contained to the instance the event names.
    node.fault(&["xid", &format!("0/{gi}/{ci}"), "31"]);
    let fault = node.wait_fault(0, "xid");
    assert_eq!((fault.gpu_instance_id, fault.compute_instance_id), (Some(gi), Some(ci)));
    assert_eq!(fault.action, "restart-application");
    node.wait_log(&["Xid 31", &format!("pid {}", client.pid())]);
    node.wait_metric("gpushare_gpu_healthy", &[("gpu", "0")], "0");
    let names = node.wait_cdi("without the instance", |n| !n.contains(&hit_uuid));
    assert!(names.contains(&other_uuid), "the other instance stays: {names:?}");
    // MPS on every instance would start a server in the faulted one: refused.
    let before = node.agent.status();
    let why = refusal(&node.agent.ctl(&["apply", "-f", with_mps.to_str().unwrap()]));
    assert!(why.contains(&format!("MIG instance {gi}")) && why.contains("MPS"), "{why}");
    assert_eq!(gpushare_tests::layout(&node.agent.status()), gpushare_tests::layout(&before));
    // A reset does not clear what asks only for the application's restart while it runs.
    assert!(refusal(&node.agent.ctl(&["gpu", "reset", "0"])).contains(&client.pid().to_string()));

    // The clean check: the client ends, the fault clears, the instance is back.
    client.end();
    node.wait_healthy(0);
    node.wait_cdi("with the instance again", |n| n.contains(&hit_uuid));
    let applied = node.agent.ctl(&["apply", "-f", with_mps.to_str().unwrap()]);
    assert!(applied.status.success(), "{}", text(&applied));
}

#[test]
fn an_application_xid_on_a_whole_gpu_clears_when_its_clients_end() {
    let node = Node::start("h100-80gb:2");
    node.apply("all-mps");
    let gpu0 = node.server_on(0);
    let client = Sleeper::start(None, &[]);
    announce(&node.server_on(1).pipe_directory, client.pid());
    node.fault(&["xid", "1", "13"]);
    let fault = node.wait_fault(1, "xid");
    assert_eq!((fault.xid, fault.action.as_str()), (Some(13), "restart-application"));
    // Named once read (null until then, never "none").
    let fault = node.wait_named(1, "xid");
    assert_eq!(fault.clients, Some(vec![client.pid()]));
    node.wait_log(&["Xid 13", &format!("pid {}", client.pid())]);
    let why = refusal(&node.agent.ctl(&["apply", "all-balanced"]));
    assert!(why.contains("GPU 1"), "{why}");
    client.end();
    node.wait_healthy(1);
    assert_eq!(node.server_on(0).pid, gpu0.pid);
    node.wait_metric("gpushare_health_faults_total", &[("class", "xid")], "1");
}

#[test]
fn a_gpu_off_the_bus_asks_for_a_reboot_and_the_other_gpu_goes_on() {
    let mut node = Node::start("h100-80gb:2");
    node.apply("all-mps");
    let gpu0 = node.server_on(0);
    node.fault(&["lost", "1"]);
    let fault = node.wait_fault(1, "gpu-lost");
    assert_eq!(fault.action, "reboot-node");
    node.wait_log(&["GPU 1", "reboot the node"]);
    // A reset does not bring back a GPU off the bus.
    assert!(refusal(&node.agent.ctl(&["gpu", "reset", "1"])).contains("reboot"));
    let why = refusal(&node.agent.ctl(&["apply", "all-balanced"]));
    assert!(why.contains("GPU 1"), "{why}");
    // Status, and GPU 0's share, go on.
    assert_eq!(node.agent.status().gpus.len(), 2);
    assert_eq!(node.server_on(0).pid, gpu0.pid);
    node.wait_metric("gpushare_gpu_faults", &[("class", "gpu-lost"), ("gpu", "1")], "1");
    // The node reboots: the GPU is back, and so is the profile.
    let out = fault_tool(&node.agent.sim_state(), &["clear", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    node.agent.restart_with_env(&[("GPUSHARE_SIM_REBOOT", "1")]);
    let status = node.wait_healthy(1);
    assert_eq!(status.active_profile.as_deref(), Some("all-mps"));
    assert_eq!(node.agent.mps_servers().len(), 2);
}

#[test]
fn an_agent_restarted_while_a_gpu_is_lost_leaves_it_alone_and_serves_the_others() {
    let mut node = Node::start("h100-80gb:2");
    node.apply("all-mps");
    let gpu0 = node.server_on(0);
    node.fault(&["lost", "1"]);
    node.wait_fault(1, "gpu-lost");
    // No reboot: the start-up re-apply must not plan on the lost GPU.
    node.agent.restart();
    let status = node.agent.status();
    assert_eq!(status.active_profile.as_deref(), Some("all-mps"));
    assert!(status.start_up_error.is_none() && status.rollback_error.is_none(), "{status:?}");
    assert!(status.gpus[1].health.iter().any(|f| f.class == "gpu-lost"), "{status:?}");
    assert_eq!(node.server_on(0).pid, gpu0.pid);
    let why = refusal(&node.agent.ctl(&["apply", "all-balanced"]));
    assert!(why.contains("GPU 1") && why.contains("reboot"), "{why}");
}

#[test]
fn a_gpu_lost_when_the_agent_starts_is_watched_again_once_back_on_the_bus() {
    // The node's one GPU is lost when the agent starts: no GPU registers for the events.
    let mut node = Node::start("h100-80gb:1");
    node.fault(&["lost", "0"]);
    node.wait_fault(0, "gpu-lost");
    node.agent.restart();
    assert!(node.agent.status().health_events.is_some(), "{:?}", node.agent.status());
    node.fault(&["clear", "0"]);
    node.wait_healthy(0);
    // Its events are waited on again: an Xid is seen (raised until the new registration
    // delivers one).
    let fault = wait_for(SHOWS, EVERY, || {
        let _ = fault_tool(&node.agent.sim_state(), &["xid", "0", "79"]);
        let health = node.agent.status().gpus[0].health.clone();
        health.into_iter().find(|f| f.class == "xid").ok_or_else(|| "no Xid fault yet".to_string())
    });
    assert_eq!(fault.action, "reboot-node");
}

#[test]
fn a_reset_applies_its_gpus_part_again_whatever_another_gpus_fault() {
    let node = Node::start("h100-80gb:2");
    node.apply("all-mps");
    node.fault(&["remap", "0", "pending"]);
    node.fault(&["remap", "1", "pending"]);
    node.wait_fault(0, "row-remap-pending");
    node.wait_fault(1, "row-remap-pending");
    let gpu1 = node.server_on(1);
    let out = node.agent.ctl(&["gpu", "reset", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    node.wait_healthy(1);
    let again = node.server_on(1);
    assert!(again.pid.is_some() && again.pid != gpu1.pid, "{again:?}");
    assert!(!node.agent.status().gpus[0].health.is_empty());
}

#[test]
fn a_pending_row_remap_clears_with_the_reset_it_asks_for() {
    let node = Node::start("h100-80gb:2");
    node.apply("all-mps");
    let gpu0 = node.server_on(0);
    node.fault(&["remap", "1", "pending"]);
    let fault = node.wait_fault(1, "row-remap-pending");
    assert_eq!(fault.action, "reset-gpu");
    let why = refusal(&node.agent.ctl(&["apply", "all-balanced"]));
    assert!(why.contains("GPU 1") && why.contains("row remap"), "{why}");
    let out = node.agent.ctl(&["gpu", "reset", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    node.wait_healthy(1);
    // The reset did it: still healthy at the next polls.
    std::thread::sleep(Duration::from_secs(2));
    assert!(node.agent.status().gpus[1].health.is_empty());
    assert_eq!(node.server_on(0).pid, gpu0.pid);
    assert_eq!(node.agent.mps_servers().len(), 2);
}

#[test]
fn a_killed_mps_server_names_its_clients_and_restarts_on_a_healthy_gpu() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let node = Node::start("h100-80gb:2");
    node.apply("all-mps");
    let (gpu0, gpu1) = (node.server_on(0), node.server_on(1));
    let client = Sleeper::start(None, &[]);
    announce(&gpu1.pipe_directory, client.pid());
    // The health check (every second here) learns whom each server serves, asking its
    // control daemon (`ps`); the driver lists a dead server's clients no more. Two asks
    // after the client came: the first one's answer is kept by the time of the second.
    let asks = |node: &Node| {
        let line = format!("pipe={} cmd=ps", gpu1.pipe_directory);
        node.agent.sim_record().lines().filter(|l| l.ends_with(&line)).count()
    };
    let before = asks(&node);
    wait_for(SHOWS, EVERY, || {
        let now = asks(&node);
        if now >= before + 2 { Ok(()) } else { Err(format!("{now} asks of ps, {before} before")) }
    });
    let _ = kill(Pid::from_raw(gpu1.pid.unwrap() as i32), Signal::SIGKILL);
    let fault = node.wait_fault(1, "mps-server-died");
    assert_eq!(fault.action, "restart-application");
    node.wait_log(&["MPS server", "died", &format!("pid {}", client.pid())]);
    // Its GPU is otherwise healthy: the server is started again.
    wait_for(SHOWS, EVERY, || {
        let now = node.server_on(1);
        if now.pid.is_some() && now.pid != gpu1.pid { Ok(()) } else { Err(format!("{now:?}")) }
    });
    assert_eq!(node.server_on(0).pid, gpu0.pid);
    client.end();
    node.wait_healthy(1);
}

#[test]
fn a_server_on_an_unhealthy_gpu_stays_down_until_the_gpu_is_healthy() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let node = Node::start("h100-80gb:2");
    node.apply("all-mps");
    let gpu1 = node.server_on(1);
    node.fault(&["remap", "1", "pending"]);
    node.wait_fault(1, "row-remap-pending");
    let _ = kill(Pid::from_raw(gpu1.pid.unwrap() as i32), Signal::SIGKILL);
    node.wait_log(&["stays down", "unhealthy"]);
    let held = node.server_on(1).pid;
    assert!(held.is_none() || held == gpu1.pid);
    let out = node.agent.ctl(&["gpu", "reset", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    node.wait_healthy(1);
    wait_for(SHOWS, EVERY, || {
        let now = node.server_on(1);
        if now.pid.is_some() && now.pid != gpu1.pid { Ok(()) } else { Err(format!("{now:?}")) }
    });
}

#[test]
fn an_unknown_xid_is_kept_as_informational_and_a_failing_wait_is_retried() {
    // The first three waits fail: logged once, retried after a backoff, then watched.
    let fail = "nvmlEventSetWait_v2:1,nvmlEventSetWait_v2:2,nvmlEventSetWait_v2:3";
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("agent.log");
    let options = AgentOptions::simulate("h100-80gb:1").env("GPUSHARE_SIM_FAIL", fail);
    let node = Node { agent: Agent::start(options.stderr_to(&log)), port: 0, log, _dir: dir };
    node.wait_log(&["waiting on the driver's events failed"]);
    // An Xid the table does not know: logged, no fault, the agent goes on.
    wait_for(SHOWS, EVERY, || {
        let _ = fault_tool(&node.agent.sim_state(), &["xid", "0", "9999"]);
        let log = std::fs::read_to_string(&node.log).unwrap_or_default();
        if log.contains("Xid 9999") { Ok(()) } else { Err(log) }
    });
    let line = node.wait_log(&["Xid 9999"]);
    assert!(line.contains("informational"), "{line}");
    assert!(node.agent.status().gpus[0].health.is_empty());
    // Then a known one is seen: the watcher survived.
    node.fault(&["xid", "0", "79"]);
    let fault = node.wait_fault(0, "xid");
    assert_eq!(fault.action, "reboot-node");
    let log = std::fs::read_to_string(&node.log).unwrap();
    assert_eq!(log.matches("waiting on the driver's events failed").count(), 1, "{log}");
}

#[test]
fn the_fault_tool_refuses_bad_input_and_changes_nothing() {
    let node = Node::start("h100-80gb:1");
    let state = node.agent.sim_state();
    let before = std::fs::read(&state).unwrap();
    for args in [
        &["xid", "5", "48"][..],
        &["xid", "0", "x"],
        &["lost"],
        &["remap", "0", "maybe"],
        &["nonsense"],
    ] {
        let out = fault_tool(&state, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stderr).trim().lines().count(), 1, "{args:?}");
    }
    assert_eq!(std::fs::read(&state).unwrap(), before);
}
