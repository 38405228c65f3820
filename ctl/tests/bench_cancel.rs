//! Ctrl-C during `gpushare-ctl bench`, against a fake agent on a private dbus-daemon: the
//! first SIGINT calls `Job1.Cancel` and ctl waits for the job's end (printing what was
//! measured); a second one leaves at once with status 130.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use gpushare_proto::bench::BenchReport;
use gpushare_proto::types::JobOutcome;
use zbus::object_server::SignalEmitter;
use zbus::zvariant::{OwnedObjectPath, OwnedValue};

const JOB: &str = "/io/gpushare/Agent1/jobs/1";

/// A private bus (the repository's test configuration), stopped on drop.
struct Bus {
    child: Child,
    address: String,
    dir: PathBuf,
}

impl Bus {
    fn start(name: &str) -> Option<Bus> {
        let dir =
            std::env::temp_dir().join(format!("gpushare-ctl-cancel-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/dbus/session.conf");
        let spawned = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", config.display()))
            .arg(format!("--address=unix:path={}", dir.join("bus").display()))
            .args(["--nofork", "--nopidfile", "--print-address=1"])
            .stdout(Stdio::piped())
            .spawn();
        let Ok(mut child) = spawned else {
            gpushare_test_skip::skip("no dbus-daemon (apt-get install dbus-daemon)");
            return None;
        };
        let mut address = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut address).unwrap();
        assert!(address.starts_with("unix:"), "dbus-daemon said {address:?}");
        Some(Bus { child, address: address.trim().into(), dir })
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The fake agent's objects (the zbus macro writes undocumented methods).
#[allow(missing_docs)]
mod fake {
    use super::*;

    /// The agent's main object: `Bench` starts job 1.
    pub struct FakeAgent {
        pub calls: mpsc::Sender<String>,
    }

    #[zbus::interface(name = "io.gpushare.Agent1")]
    impl FakeAgent {
        /// Records the call; returns job 1.
        async fn bench(
            &self,
            command: Vec<String>,
            options: HashMap<String, OwnedValue>,
        ) -> OwnedObjectPath {
            let mut keys: Vec<_> = options.keys().cloned().collect();
            keys.sort();
            let _ = self.calls.send(format!("Bench {command:?} {keys:?}"));
            OwnedObjectPath::try_from(JOB).unwrap()
        }
    }

    /// Job 1: finishes (failed, "cancelled", with what was measured) when cancelled, or
    /// never.
    pub struct FakeJob {
        pub calls: mpsc::Sender<String>,
        pub finish_on_cancel: bool,
    }

    #[zbus::interface(name = "io.gpushare.Job1")]
    impl FakeJob {
        /// Records the call; finishes the job if it is to.
        async fn cancel(&self, #[zbus(signal_emitter)] emitter: SignalEmitter<'_>) {
            let _ = self.calls.send("Cancel".into());
            if self.finish_on_cancel {
                let _ = Self::finished(&emitter, &cancelled_outcome()).await;
            }
        }

        /// The job ended, with its outcome.
        #[zbus(signal)]
        async fn finished(emitter: &SignalEmitter<'_>, outcome: &str) -> zbus::Result<()>;
    }
}

use fake::{FakeAgent, FakeJob};

/// The outcome of a cancelled bench: failed, with the baseline it had measured.
fn cancelled_outcome() -> String {
    let report: BenchReport = serde_json::from_value(serde_json::json!({
        "target": "GPU-00000000-0000-0000-0000-000000000000", "gpu": 0,
        "device": "Simulated A100", "command": ["true"], "method": "units",
        "objective": "throughput", "window_seconds": 30.0, "fleet": 100,
        "wall_seconds": 3.5, "baseline": null, "strategies": [], "recommendations": [],
        "restored": "exclusive (as before)", "saved_to": "/tmp/bench.json"
    }))
    .unwrap();
    let outcome = JobOutcome {
        ok: false,
        profile: String::new(),
        changed: false,
        steps_done: 1,
        steps_total: 9,
        duration_seconds: 3.5,
        error_name: Some("io.gpushare.Agent1.Error.Failed".into()),
        error: Some("cancelled".into()),
        warnings: vec![],
        probe: None,
        bench: Some(report),
        private: false,
    };
    serde_json::to_string(&outcome).unwrap()
}

/// Serves the fake agent on `address` from a thread of its own; returns the calls it gets.
fn serve(address: &str, finish_on_cancel: bool) -> mpsc::Receiver<String> {
    let (calls, received) = mpsc::channel();
    let (ready, is_ready) = mpsc::channel();
    let address = address.to_owned();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let agent = FakeAgent { calls: calls.clone() };
            let job = FakeJob { calls, finish_on_cancel };
            let _conn = zbus::connection::Builder::address(address.as_str())
                .unwrap()
                .name(gpushare_proto::BUS_NAME)
                .unwrap()
                .serve_at(gpushare_proto::OBJECT_PATH, agent)
                .unwrap()
                .serve_at(JOB, job)
                .unwrap()
                .build()
                .await
                .unwrap();
            ready.send(()).unwrap();
            std::future::pending::<()>().await;
        });
    });
    is_ready.recv_timeout(Duration::from_secs(20)).expect("the fake agent is on the bus");
    received
}

fn start_ctl(bus: &Bus, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_gpushare-ctl"))
        .args(["--address", &bus.address, "bench", "--replicas", "1"])
        .args(extra)
        .args(["--", "true"])
        .env("PATH", "/usr/bin:/bin")
        .env("XDG_STATE_HOME", bus.dir.join("state"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn interrupt(child: &Child) {
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
}

/// Waits for `child` to exit, killing it past `limit`.
fn wait_for(mut child: Child, limit: Duration) -> Output {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("gpushare-ctl did not exit within {limit:?}: {:?}", child.wait_with_output());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn next_call(calls: &mpsc::Receiver<String>) -> String {
    calls.recv_timeout(Duration::from_secs(20)).expect("a call to the fake agent")
}

#[test]
fn the_first_ctrl_c_cancels_and_waits_for_the_end() {
    let Some(bus) = Bus::start("once") else { return };
    let calls = serve(&bus.address, true);
    let report = bus.dir.join("r.html");
    let ctl = start_ctl(&bus, &["--report", report.to_str().unwrap()]);
    let bench = next_call(&calls);
    assert!(
        bench.starts_with(r#"Bench ["true"] ["cwd", "environment", "logs", "replicas"]"#),
        "{bench}"
    );
    // The job path reaches ctl right after.
    std::thread::sleep(Duration::from_millis(300));
    interrupt(&ctl);
    assert_eq!(next_call(&calls), "Cancel");
    let out = wait_for(ctl, Duration::from_secs(20));
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "cancelling: stopping the replicas and restoring the sharing (Ctrl-C again to leave it to the agent)\nreport: {}\ngpushare-ctl: cancelled\n",
            report.display()
        )
    );
    // What was measured before, and where the sharing went.
    assert!(stdout.starts_with("Bench of GPU-00000000-0000-0000-0000-000000000000"), "{stdout}");
    assert!(stdout.contains("\nRestored: exclusive (as before)\n"), "{stdout}");
    assert!(std::fs::read_to_string(&report).unwrap().starts_with("<!DOCTYPE html>"));
}

#[test]
fn a_second_ctrl_c_leaves_at_once() {
    let Some(bus) = Bus::start("twice") else { return };
    let calls = serve(&bus.address, false);
    let ctl = start_ctl(&bus, &["--json"]);
    next_call(&calls);
    std::thread::sleep(Duration::from_millis(300));
    interrupt(&ctl);
    assert_eq!(next_call(&calls), "Cancel");
    std::thread::sleep(Duration::from_millis(100));
    interrupt(&ctl);
    let out = wait_for(ctl, Duration::from_secs(10));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.starts_with("cancelling: "), "{stderr}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["error"]["name"], "gpushare.Ctl.Error.Interrupted", "{doc}");
    let message = doc["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("interrupted again; the agent goes on cancelling the bench"),
        "{message}"
    );
}
