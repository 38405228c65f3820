//! The Prometheus endpoint of a running agent, checked with Debian's `promtool`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use gpushare_tests::{Agent, AgentOptions, text, wait_for};

/// A TCP port free on 127.0.0.1 now (the metrics tests' listeners).
pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The body of `GET /metrics` on `port`, which must answer 200.
pub(crate) fn scrape(port: u16) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

#[test]
fn the_agent_serves_metrics_that_promtool_accepts() {
    let port = free_port();
    let options = AgentOptions {
        config: Some(format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n")),
        ..AgentOptions::simulate("a100-40gb:2")
    };
    let agent = Agent::start(options);
    let out = agent.ctl(&["apply", "half-balanced"]);
    assert!(out.status.success(), "{}", text(&out));

    // The state series follow the engine's events: a refresh that ran while the apply did
    // (a health check's) may show part of it until the one after the job's end.
    let expected = [
        "gpushare_active_profile_info{profile=\"half-balanced\"} 1",
        "gpushare_applies_total{profile=\"half-balanced\",result=\"success\"} 1",
        "gpushare_apply_duration_seconds_bucket",
        "gpushare_gpu_mig_enabled{gpu=\"0\",UUID=",
        "gpushare_mig_instance_sharing{",
        "gpushare_rollbacks_total 0",
    ];
    let body = wait_for(Duration::from_secs(15), Duration::from_millis(200), || {
        let body = scrape(port);
        match expected.iter().find(|name| !body.contains(**name)) {
            None => Ok(body),
            Some(name) => Err(format!("{name} missing:\n{body}")),
        }
    });

    let promtool = std::path::Path::new("/usr/bin/promtool");
    if !promtool.exists() {
        eprintln!("promtool not installed (apt-get install prometheus): exposition not linted");
        return;
    }
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "promtool check metrics: {}", text(&out));
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "promtool lint: {}", text(&out));
}
