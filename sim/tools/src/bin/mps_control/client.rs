//! The client: sends stdin's commands or a `--fake-client` event to the daemon, prints answers.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use gpushare_sim_nvml::node::pid_alive;

use crate::common;
use crate::pipe_dir::SOCKET_NAME;
use crate::protocol::{END_OF_ANSWER, FAKE_CONNECT, FAKE_EXIT, fake_client_line};

const NO_DAEMON: &str = "Cannot find MPS control daemon process";

/// Sends `lines` to the daemon of `pipe_dir`, one at a time, and prints the answers on
/// `out`, or, for `--fake-client` events (`events`), on stderr: an answer to an event is
/// the daemon's refusal. `describe` gives each line's record entry. Exit status: 0, or 1
/// when no daemon answers on the socket or it refused an event.
fn converse(
    pipe_dir: &Path,
    lines: impl Iterator<Item = String>,
    out: &mut impl Write,
    events: bool,
    record: Option<&Path>,
    describe: impl Fn(&str) -> String,
) -> u8 {
    let mut refused = false;
    let pipe = pipe_dir.display();
    let stream = match UnixStream::connect(pipe_dir.join(SOCKET_NAME)) {
        Ok(stream) => stream,
        Err(_) => {
            common::record(record, &format!("mps-control pipe={pipe} error=no-daemon"));
            let _ = writeln!(out, "{NO_DAEMON}");
            return 1;
        }
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(read_half) = stream.try_clone() else { return 1 };
    let mut reader = BufReader::new(read_half);
    let mut writer = stream;
    for line in lines {
        common::record(record, &format!("mps-control pipe={pipe} {}", describe(&line)));
        if writeln!(writer, "{line}").and_then(|()| writer.flush()).is_err() {
            return 0;
        }
        loop {
            let mut answer = String::new();
            match reader.read_line(&mut answer) {
                // The daemon is gone (after `quit`): nothing more to ask.
                Ok(0) => return 0,
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return 0,
                Ok(_) => {}
                Err(e) => {
                    let _ = writeln!(out, "simulated nvidia-cuda-mps-control: no answer: {e}");
                    return 1;
                }
            }
            let answer = answer.trim_end_matches(['\n', '\r']);
            if answer == END_OF_ANSWER {
                break;
            }
            if events {
                refused = true;
                eprintln!("{answer}");
            } else {
                let _ = writeln!(out, "{answer}");
            }
        }
    }
    let _ = out.flush();
    u8::from(refused)
}

/// Client mode: commands from `input`, one per line (blank lines skipped), answers on `out`.
pub fn run_client(
    pipe_dir: &Path,
    input: impl BufRead,
    out: &mut impl Write,
    record: Option<&Path>,
) -> u8 {
    let lines = input.lines().map_while(Result::ok).map(|l| l.trim().to_string());
    let lines = lines.filter(|l| !l.is_empty());
    converse(pipe_dir, lines, out, false, record, |l| format!("cmd={l}"))
}

/// Why `pid` cannot connect as a simulated client, if it cannot: it does not run
/// ([`pid_alive`], the rule by which the daemon drops a client whose process ended). A real
/// MPS client is a running CUDA process; the daemon is not asked.
pub fn not_a_client(pid: u32) -> Option<String> {
    (!pid_alive(pid)).then(|| {
        format!(
            "simulated nvidia-cuda-mps-control: no process {pid}: a simulated MPS client must be a running process"
        )
    })
}

/// `--fake-client PID [--memory SIZE]` (`connect`, `memory` in bytes) or
/// `--fake-client-exit PID`, as the user running it. Recorded `fake-client=<pid>` (with
/// ` memory=<bytes>` when given) or `fake-client-exit=<pid>`. `out` gets only the line
/// saying there is no daemon; a refusal goes to stderr (exit 1).
pub fn run_fake_client(
    pipe_dir: &Path,
    pid: u32,
    connect: bool,
    memory: Option<u64>,
    out: &mut impl Write,
    record: Option<&Path>,
) -> u8 {
    let (command, key) =
        if connect { (FAKE_CONNECT, "fake-client") } else { (FAKE_EXIT, "fake-client-exit") };
    let memory = memory.filter(|_| connect);
    let line = fake_client_line(command, pid, memory);
    let entry = match memory {
        Some(bytes) => format!("{key}={pid} memory={bytes}"),
        None => format!("{key}={pid}"),
    };
    converse(pipe_dir, std::iter::once(line), out, true, record, |_| entry.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn client_without_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("record");
        let mut out = Vec::new();
        let status =
            run_client(dir.path(), "get_server_list\n".as_bytes(), &mut out, Some(&record));
        assert_eq!(status, 1);
        assert_eq!(String::from_utf8(out).unwrap(), "Cannot find MPS control daemon process\n");
        let record = fs::read_to_string(record).unwrap();
        assert_eq!(record, format!("mps-control pipe={} error=no-daemon\n", dir.path().display()));
    }

    #[test]
    fn only_a_running_process_may_connect() {
        assert_eq!(not_a_client(std::process::id()), None);
        // Above the largest pid_max Linux allows (2^22): never a process.
        assert_eq!(
            not_a_client(4_194_305).as_deref(),
            Some(
                "simulated nvidia-cuda-mps-control: no process 4194305: a simulated MPS client \
                 must be a running process"
            )
        );
        let mut child = std::process::Command::new("true").spawn().unwrap();
        child.wait().unwrap();
        let why = not_a_client(child.id()).expect("an exited, reaped child is no client");
        assert!(why.contains(&format!("no process {}:", child.id())), "{why}");
    }
}
