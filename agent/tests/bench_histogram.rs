//! The histogram method of bench against real servers: Python's `prometheus_client` (the
//! Debian package python3-prometheus-client; skipped with a line saying so where no
//! `python3` can import it), nothing listening, a 404 and a server that never answers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use gpushare_agent::bench::histogram::{self, Histogram};
use gpushare_agent::bench::stats::Latencies;

const INF: f64 = f64::INFINITY;
const TIMEOUT: Duration = Duration::from_secs(5);
const NAME: &str = "request_latency_seconds";

/// A port nothing listens on just now.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

/// A `python3` that can import prometheus_client: the one on PATH, else the system's (a
/// pyenv or venv python on PATH does not see Debian's dist-packages).
fn python() -> Option<&'static str> {
    ["python3", "/usr/bin/python3"].into_iter().find(|python| {
        Command::new(python)
            .args(["-c", "import prometheus_client"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    })
}

/// The replica: a histogram with known observations, served by `start_http_server`. Both
/// exposition formats of the first state are written to files too (argv 2 and 3).
const SCRIPT: &str = r#"
import sys, time
from prometheus_client import Histogram, REGISTRY, generate_latest, start_http_server
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

port, classic_path, openmetrics_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
h = Histogram('request_latency_seconds', 'Time spent serving a request',
              buckets=[0.005, 0.01, 0.05, 0.1])
for v in [0.001, 0.005, 0.007, 0.02, 0.2]:
    h.observe(v)
with open(classic_path, 'wb') as f:
    f.write(generate_latest(REGISTRY))
with open(openmetrics_path, 'wb') as f:
    f.write(generate_openmetrics(REGISTRY))
start_http_server(port, addr='127.0.0.1')
print('ready', flush=True)
sys.stdin.readline()
for v in [0.003, 0.006, 0.006, 0.03, 0.03, 0.03, 0.08, 0.5]:
    h.observe(v)
print('done', flush=True)
while True:
    time.sleep(3600)
"#;

/// The Python replica, killed when dropped.
struct Replica {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Replica {
    fn start(python: &str, port: u16, classic: &str, openmetrics: &str) -> Replica {
        let mut child = Command::new(python)
            .args(["-c", SCRIPT, &port.to_string(), classic, openmetrics])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start python3");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Replica { child, stdin, stdout }
    }

    fn expect_line(&mut self, want: &str) {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read the replica");
        assert_eq!(line.trim_end(), want, "the Python replica (its stderr is above)");
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn python_prometheus_client_bucket_deltas() {
    let Some(python) = python() else {
        gpushare_test_skip::skip(
            "no python3 imports prometheus_client (apt-get install python3-prometheus-client)",
        );
        return;
    };
    let dir = tempfile::tempdir().expect("temporary directory");
    let classic = dir.path().join("classic.txt");
    let openmetrics = dir.path().join("openmetrics.txt");
    let port = free_port();
    let mut replica = Replica::start(
        python,
        port,
        classic.to_str().expect("UTF-8 path"),
        openmetrics.to_str().expect("UTF-8 path"),
    );
    replica.expect_line("ready");

    let before = histogram::scrape(port, NAME, TIMEOUT).expect("scrape before");
    assert_eq!(before.count, 5);
    assert!(close(before.sum, 0.233), "{}", before.sum);
    assert_eq!(before.buckets, vec![(0.005, 2), (0.01, 3), (0.05, 4), (0.1, 4), (INF, 5)]);
    // The same state in both formats the client writes, read from the files.
    for path in [&classic, &openmetrics] {
        let page = std::fs::read_to_string(path).expect("read an exposition file");
        let parsed = histogram::parse(&page, NAME, &path.display().to_string())
            .unwrap_or_else(|e| panic!("{e}\n{page}"));
        assert_eq!(parsed, before, "{}", path.display());
    }
    assert!(std::fs::read_to_string(&openmetrics).expect("read").ends_with("# EOF\n"));

    // A name that is not there: one line, listing the histogram that is.
    let err = histogram::scrape(port, "no_such_seconds", TIMEOUT).unwrap_err();
    assert_eq!(
        err,
        format!(
            "no histogram `no_such_seconds` in the metrics of 127.0.0.1:{port} \
             (histograms there: {NAME})"
        )
    );

    replica.stdin.write_all(b"go\n").expect("tell the replica");
    replica.stdin.flush().expect("flush");
    replica.expect_line("done");
    let after = histogram::scrape(port, NAME, TIMEOUT).expect("scrape after");
    let window = histogram::delta(&before, &after).expect("delta");

    assert_eq!(window.count, 8);
    assert!(close(window.sum, 0.685), "{}", window.sum);
    assert_eq!(window.buckets, vec![(0.005, 1), (0.01, 3), (0.05, 6), (0.1, 7), (INF, 8)]);
    assert_eq!(window.rate(2.0), 4.0);
    assert_eq!(
        window.latencies_ms(NAME),
        Latencies::Buckets(vec![(5.0, 1), (10.0, 3), (50.0, 6), (100.0, 7), (INF, 8)])
    );

    // The other way round, as after a restart of the replica.
    let err = histogram::delta(&after, &before).unwrap_err();
    assert!(err.contains("went down"), "{err}");
}

/// Asserts a one-line error that names the address, and that it came fast.
fn assert_fast_one_line(result: Result<Histogram, String>, port: u16, started: Instant) {
    let err = result.expect_err("an error");
    assert!(!err.contains('\n'), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{port}")), "the address is missing: {err}");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
}

#[test]
fn nothing_listening_is_a_fast_one_line_error() {
    let port = free_port();
    let started = Instant::now();
    let result = histogram::scrape(port, NAME, TIMEOUT);
    assert_eq!(
        result,
        Err(format!(
            "scraping http://127.0.0.1:{port}/metrics: nothing listens there (connection refused)"
        ))
    );
    assert_fast_one_line(result, port, started);
}

/// Answers every connection with `status` and `body` after reading the request head.
fn serve(status: &str, body: &str) -> u16 {
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            read_head(&mut stream);
            let _ = stream.write_all(response.as_bytes());
        }
    });
    port
}

fn read_head(stream: &mut TcpStream) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
}

#[test]
fn a_404_is_an_error_with_the_status() {
    let port = serve("404 Not Found", "not here\n");
    let started = Instant::now();
    let result = histogram::scrape(port, NAME, TIMEOUT);
    let err = result.clone().unwrap_err();
    assert_eq!(
        err,
        format!("scraping http://127.0.0.1:{port}/metrics: the server answered 404 Not Found")
    );
    assert_fast_one_line(result, port, started);
}

#[test]
fn a_server_that_never_answers_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    // Accepts and reads, never answers; the connections stay open until the test ends.
    std::thread::spawn(move || {
        let mut open = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            read_head(&mut stream);
            open.push(stream);
        }
    });
    let started = Instant::now();
    let result = histogram::scrape(port, NAME, Duration::from_millis(300));
    assert_eq!(
        result,
        Err(format!("scraping http://127.0.0.1:{port}/metrics: no answer within 300ms"))
    );
    assert_fast_one_line(result, port, started);
    assert!(started.elapsed() >= Duration::from_millis(250));
}

#[test]
fn a_page_of_the_classic_format_over_http() {
    // What a Go replica would serve; also checks that the scraper reads a whole body.
    let port = serve(
        "200 OK",
        "# TYPE step_ms histogram\n\
          step_ms_bucket{le=\"2.5\"} 3\n\
          step_ms_bucket{le=\"+Inf\"} 4\n\
          step_ms_sum 9.5\n\
          step_ms_count 4\n",
    );
    let h = histogram::scrape(port, "step_ms", TIMEOUT).expect("scrape");
    assert_eq!((h.count, h.sum), (4, 9.5));
    assert_eq!(h.latencies_ms("step_ms"), Latencies::Buckets(vec![(2.5, 3), (INF, 4)]));
}
