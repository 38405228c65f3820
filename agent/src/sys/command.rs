//! The one way the agent runs an external program (nvidia-smi, the MPS control binary,
//! hooks): bounded in time, with stdout and stderr read while it runs (a chatty program
//! never blocks on a full pipe), stdin closed or fed a few bytes, and the output of a
//! program that leaves a process behind holding its pipes collected without waiting for
//! that process.
//!
//! Calls block; async callers run them on tokio's blocking pool.

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStderr, ChildStdout, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use super::unix;

/// How long to wait, once the program has exited, for its pipes to close: a background
/// process it started may hold them open for much longer.
const OUTPUT_GRACE: Duration = Duration::from_millis(250);
/// Most bytes kept of each of stdout and stderr; the rest is read and dropped.
const OUTPUT_LIMIT: usize = 1 << 20;
/// How long a program killed at its time limit may take to die before it is left behind.
const KILL_GRACE: Duration = Duration::from_secs(5);
/// How often a program is checked for exit when no watcher thread can be had.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// A program to run, with its arguments, environment, input and time limit.
#[derive(Debug)]
pub struct Command {
    inner: std::process::Command,
    input: Option<Vec<u8>>,
    timeout: Duration,
    own_group: bool,
    keep_stdout: bool,
}

/// How a program ended, with what it wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// How it exited; `None` when it ran past its time limit and was killed.
    pub status: Option<ExitStatus>,
    /// Its stdout (up to a limit; empty when it was discarded).
    pub stdout: Vec<u8>,
    /// Its stderr (up to a limit).
    pub stderr: Vec<u8>,
}

impl Finished {
    /// Whether it exited with status 0.
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// Its stdout, lossily decoded.
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Its stderr, lossily decoded.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// The first non-empty line of stderr, else of stdout, trimmed; `no output` when both
    /// are empty.
    pub fn first_line(&self) -> String {
        let text = if self.stderr.iter().all(u8::is_ascii_whitespace) {
            self.stdout_text()
        } else {
            self.stderr_text()
        };
        text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("no output").to_string()
    }
}

impl Command {
    /// Runs `program` (a bare name is looked up on `PATH`) with stdin closed and a time
    /// limit of `timeout`.
    pub fn new(program: impl AsRef<OsStr>, timeout: Duration) -> Self {
        Command {
            inner: std::process::Command::new(program),
            input: None,
            timeout,
            own_group: false,
            keep_stdout: true,
        }
    }

    /// Adds an argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.inner.arg(arg);
        self
    }

    /// Adds arguments.
    pub fn args<S: AsRef<OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.inner.args(args);
        self
    }

    /// Sets an environment variable.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.inner.env(key, value);
        self
    }

    /// Writes `bytes` to the program's stdin, then closes it.
    pub fn input(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.input = Some(bytes.into());
        self
    }

    /// Sends the program's stdout to `/dev/null`: for commands whose output nobody reads
    /// (hooks), so that a process they leave behind holds no pipe to the agent.
    pub fn discard_stdout(mut self) -> Self {
        self.keep_stdout = false;
        self
    }

    /// Runs the program in a process group of its own, and kills the whole group at the
    /// time limit: for shell commands, whose children would otherwise outlive them.
    pub fn own_process_group(mut self) -> Self {
        self.own_group = true;
        self
    }

    /// Runs the program to its end or its time limit. The error is the one of starting it
    /// (not found, not executable); everything after that is in [`Finished`].
    pub fn run(mut self) -> io::Result<Finished> {
        let stdin = if self.input.is_some() { Stdio::piped() } else { Stdio::null() };
        let stdout = if self.keep_stdout { Stdio::piped() } else { Stdio::null() };
        self.inner.stdin(stdin).stdout(stdout).stderr(Stdio::piped());
        if self.own_group {
            self.inner.process_group(0);
        }
        let mut child = self.inner.spawn()?;
        let stdout = Collector::start(child.stdout.take());
        let stderr = Collector::start(child.stderr.take());
        if let (Some(input), Some(mut pipe)) = (self.input.take(), child.stdin.take()) {
            // A pipe takes 64 KiB before a write blocks; more goes on from a thread, so a
            // program that does not read cannot hold the caller up. A program that exits
            // without reading makes the write fail: its exit status tells what happened.
            if input.len() <= 4096 {
                let _ = pipe.write_all(&input);
            } else {
                let _ = thread::Builder::new().spawn(move || pipe.write_all(&input));
            }
        }
        let status = wait_or_kill(&mut child, self.timeout, self.own_group)?;
        let deadline = Instant::now() + OUTPUT_GRACE;
        Ok(Finished { status, stdout: stdout.finish(deadline), stderr: stderr.finish(deadline) })
    }
}

/// Waits for `child` for at most `timeout`, then kills it (or its process group) and reaps
/// it. `None` when it was killed.
fn wait_or_kill(
    child: &mut Child,
    timeout: Duration,
    group: bool,
) -> io::Result<Option<ExitStatus>> {
    let pid = child.id();
    let (tx, exited) = mpsc::channel();
    // The watcher only watches: the child is reaped here, so its pid cannot be reused
    // before a kill at the time limit.
    let watching = thread::Builder::new()
        .spawn(move || {
            let _ = tx.send(unix::wait_for_exit_unreaped(pid));
        })
        .is_ok();
    let deadline = Instant::now() + timeout;
    let exited_in_time = if watching {
        match exited.recv_timeout(timeout) {
            Ok(Ok(())) => true,
            Err(mpsc::RecvTimeoutError::Timeout) => false,
            // No answer from waitid: watch by polling instead.
            Ok(Err(_)) | Err(mpsc::RecvTimeoutError::Disconnected) => poll_until(child, deadline)?,
        }
    } else {
        poll_until(child, deadline)?
    };
    if exited_in_time {
        return child.wait().map(Some);
    }
    if let Err(e) = unix::kill(pid, group) {
        tracing::warn!(pid, error = %e, "cannot kill a command past its time");
    }
    // A process stuck in the kernel (a wedged driver) may not die even of SIGKILL: it is
    // waited for a little, then left unreaped rather than hold the agent up.
    let dead = match exited.recv_timeout(KILL_GRACE) {
        Ok(Ok(())) => true,
        _ => poll_until(child, Instant::now() + KILL_GRACE)?,
    };
    if dead {
        child.wait()?;
    } else {
        tracing::warn!(pid, "a command killed past its time has not exited; left behind");
    }
    Ok(None)
}

/// Polls `child` until it exits (`true`) or `deadline` passes (`false`), without reaping it.
fn poll_until(child: &mut Child, deadline: Instant) -> io::Result<bool> {
    loop {
        if child.try_wait()?.is_some() {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// Reads one of a child's output pipes on a thread of its own until it closes.
struct Collector {
    bytes: Arc<Mutex<Vec<u8>>>,
    /// Set once the output was handed over: what comes later is drained, not kept.
    taken: Arc<AtomicBool>,
    closed: mpsc::Receiver<()>,
}

/// The output pipes a [`Collector`] reads.
trait OutputPipe: Read + Send + 'static {}
impl OutputPipe for ChildStdout {}
impl OutputPipe for ChildStderr {}

impl Collector {
    fn start(pipe: Option<impl OutputPipe>) -> Collector {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let taken = Arc::new(AtomicBool::new(false));
        let (tx, closed) = mpsc::channel();
        if let Some(mut pipe) = pipe {
            let (sink, done) = (Arc::clone(&bytes), Arc::clone(&taken));
            // Without a thread the pipe is dropped: the program sees its reader gone.
            let _ = thread::Builder::new().spawn(move || {
                let mut buf = [0u8; 8192];
                loop {
                    match pipe.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) if !done.load(Ordering::Relaxed) => {
                            let mut kept = sink.lock().unwrap_or_else(PoisonError::into_inner);
                            let room = OUTPUT_LIMIT.saturating_sub(kept.len());
                            kept.extend_from_slice(&buf[..n.min(room)]);
                        }
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
                let _ = tx.send(());
            });
        }
        Collector { bytes, taken, closed }
    }

    /// What was read once the pipe closed, or by `deadline` if it stays open.
    fn finish(self, deadline: Instant) -> Vec<u8> {
        let _ = self.closed.recv_timeout(deadline.saturating_duration_since(Instant::now()));
        self.taken.store(true, Ordering::Relaxed);
        std::mem::take(&mut *self.bytes.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, timeout: Duration) -> Command {
        Command::new("/bin/sh", timeout).args(["-c", script])
    }

    #[test]
    fn output_and_status_are_captured() {
        let done = sh("echo out; echo err >&2; exit 3", Duration::from_secs(30)).run().unwrap();
        assert_eq!(done.status.and_then(|s| s.code()), Some(3));
        assert_eq!((done.stdout_text(), done.stderr_text()), ("out\n".into(), "err\n".into()));
        assert!(!done.success());
        assert_eq!(done.first_line(), "err");
    }

    #[test]
    fn stdin_is_closed_or_fed() {
        let done = sh("cat; echo done", Duration::from_secs(30)).run().unwrap();
        assert_eq!(done.stdout_text(), "done\n");
        let done = sh("read line; echo \"got $line\"", Duration::from_secs(30))
            .input("quit\n")
            .run()
            .unwrap();
        assert_eq!(done.stdout_text(), "got quit\n");
        // More than a pipe holds, to a program that reads it all.
        let big = vec![b'x'; 1 << 18];
        let done = sh("wc -c", Duration::from_secs(30)).input(big).run().unwrap();
        assert_eq!(done.stdout_text().trim(), (1 << 18).to_string());
    }

    #[test]
    fn a_chatty_program_does_not_block_on_its_pipes() {
        // 4 MiB on each stream: far more than a pipe buffers.
        let script = "head -c 4194304 /dev/zero; head -c 4194304 /dev/zero >&2; echo end >&2";
        let done = sh(script, Duration::from_secs(30)).run().unwrap();
        assert!(done.success());
        assert_eq!(done.stdout.len(), OUTPUT_LIMIT);
        assert_eq!(done.stderr.len(), OUTPUT_LIMIT);
    }

    #[test]
    fn a_program_past_its_time_is_killed() {
        let started = Instant::now();
        let done = sh("echo started; exec sleep 30", Duration::from_millis(200)).run().unwrap();
        assert!(done.status.is_none());
        assert_eq!(done.stdout_text(), "started\n");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn its_process_group_is_killed_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let script = format!("sleep 30 & echo $! > {}; wait", pid_file.display());
        let done = sh(&script, Duration::from_millis(300)).own_process_group().run().unwrap();
        assert!(done.status.is_none());
        let pid: u32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while crate::sys::procfs::alive(pid) {
            assert!(Instant::now() < deadline, "the background sleep {pid} outlived the kill");
            thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_process_left_holding_the_pipes_does_not_hold_the_caller_up() {
        let started = Instant::now();
        let done = sh("echo bye >&2; sleep 5 & exit 4", Duration::from_secs(30)).run().unwrap();
        assert_eq!(done.status.and_then(|s| s.code()), Some(4));
        assert_eq!(done.stderr_text(), "bye\n");
        assert!(started.elapsed() < Duration::from_secs(4));
    }

    #[test]
    fn stdout_can_go_to_dev_null() {
        let done =
            sh("echo out; echo err >&2", Duration::from_secs(30)).discard_stdout().run().unwrap();
        assert_eq!((done.stdout_text(), done.stderr_text()), (String::new(), "err\n".into()));
    }

    #[test]
    fn a_missing_program_is_an_error_of_its_own() {
        let e = Command::new("/nonexistent/tool", Duration::from_secs(1)).run().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
