//! The one way the agent runs an external program (nvidia-smi, the MPS control binary,
//! hooks): bounded in time, with stdout and stderr read while it runs (a chatty program
//! never blocks on a full pipe), stdin closed or fed a few bytes, and the output of a
//! program that leaves a process behind holding its pipes collected without waiting for
//! that process. One thread does it all, polling the pipes and a pidfd of the program.
//!
//! Calls block; async callers run them on tokio's blocking pool.

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, ExitStatus, Stdio};
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
/// Without a pidfd, how soon a program is first looked at for its exit, and the longest
/// the looks are apart (they double in between).
const FIRST_NAP: Duration = Duration::from_micros(200);
const LAST_NAP: Duration = Duration::from_millis(20);

/// Where `program` would run from: the file itself when it names a path, else the first
/// executable of that name on `PATH`. The error says why it cannot run, in words that
/// follow "cannot run <program>: ".
pub fn find_program(program: &Path) -> Result<PathBuf, String> {
    let executable = |path: &Path| {
        path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.components().count() > 1 || program.is_absolute() {
        return match program.metadata() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err("no such file".to_owned()),
            Err(e) => Err(e.to_string()),
            Ok(_) if !executable(program) => Err("not an executable file".to_owned()),
            Ok(_) => Ok(program.to_path_buf()),
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| executable(candidate))
        .ok_or_else(|| "not found on PATH".to_owned())
}

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
        let mut inner = std::process::Command::new(program);
        super::unix::with_open_files_at_start(&mut inner);
        Command { inner, input: None, timeout, own_group: false, keep_stdout: true }
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
    pub fn run(self) -> io::Result<Finished> {
        self.run_watching(true)
    }

    /// [`Command::run`], with `pidfd` false watching the exit by looking now and then, as
    /// on kernels without pidfds.
    fn run_watching(mut self, pidfd: bool) -> io::Result<Finished> {
        let started = Instant::now();
        // For the debug line: what ran, with the first line it was fed (an MPS command).
        let what = tracing::enabled!(tracing::Level::DEBUG).then(|| self.describe());
        let stdin = if self.input.is_some() { Stdio::piped() } else { Stdio::null() };
        let stdout = if self.keep_stdout { Stdio::piped() } else { Stdio::null() };
        self.inner.stdin(stdin).stdout(stdout).stderr(Stdio::piped());
        if self.own_group {
            self.inner.process_group(0);
        }
        let mut child = self.inner.spawn()?;
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
        let mut run = Running {
            pidfd: if pidfd { unix::pidfd_open(child.id()) } else { None },
            stdout: Output::of(child.stdout.take()),
            stderr: Output::of(child.stderr.take()),
            child,
        };
        let status = run.wait(self.timeout, self.own_group)?;
        if let Some(what) = what {
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            tracing::debug!(?status, "ran {what} in {ms:.1} ms");
        }
        Ok(Finished { status, stdout: run.stdout.bytes, stderr: run.stderr.bytes })
    }

    /// The program, its arguments and the first line of its input, for the log.
    fn describe(&self) -> String {
        let mut words = vec![self.inner.get_program().to_string_lossy().into_owned()];
        words.extend(self.inner.get_args().map(|a| a.to_string_lossy().into_owned()));
        if let Some(input) = &self.input {
            let lines = input.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count();
            let first = input.split(|&b| b == b'\n').next().unwrap_or_default();
            words.push(format!("<<< {}", String::from_utf8_lossy(first)));
            if lines > 1 {
                words.push(format!("(+{} lines)", lines - 1));
            }
        }
        words.join(" ")
    }
}

/// A started program: its output pipes are read as it runs, on the caller's thread, while
/// its exit is watched through a pidfd (or, without one, by looking now and then).
struct Running {
    child: Child,
    pidfd: Option<OwnedFd>,
    stdout: Output,
    stderr: Output,
}

impl Running {
    /// Reads the output until the program has exited and its pipes are closed (or stay
    /// open [`OUTPUT_GRACE`] past its exit); kills it (or its process group) at `timeout`.
    /// `None` when it was killed.
    fn wait(&mut self, timeout: Duration, group: bool) -> io::Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        let mut status = None;
        let mut killed = false;
        // Until when to read: the time limit while the program runs, then the grace.
        let mut until = deadline;
        let mut nap = FIRST_NAP;
        loop {
            if status.is_none()
                && let Some(exited) = self.child.try_wait()?
            {
                status = Some(exited);
                until = Instant::now() + OUTPUT_GRACE;
            }
            let reading = self.stdout.open() || self.stderr.open();
            if status.is_some() && !reading {
                break;
            }
            let now = Instant::now();
            if now >= until {
                if status.is_some() {
                    // Exited, but a process it left behind holds its pipes.
                    break;
                }
                if killed {
                    // A process stuck in the kernel (a wedged driver) may not die even of
                    // SIGKILL: it is left unreaped rather than hold the agent up.
                    tracing::warn!(
                        pid = self.child.id(),
                        "a command killed past its time has not exited; left behind"
                    );
                    break;
                }
                // Not yet reaped, so the pid is surely still the child's.
                if let Err(e) = unix::kill(self.child.id(), group) {
                    tracing::warn!(pid = self.child.id(), error = %e, "cannot kill a command past its time");
                }
                killed = true;
                until = now + KILL_GRACE;
                continue;
            }
            // Sleep until output comes, the program exits, or it is time to act. Without a
            // pidfd an exit with pipes still open is noticed by looking every so often.
            let watch_exit = status.is_none() && self.pidfd.is_some();
            let mut wait = until - now;
            if status.is_none() && self.pidfd.is_none() {
                wait = wait.min(nap);
                nap = (nap * 2).min(LAST_NAP);
            }
            let mut fds = Vec::with_capacity(3);
            fds.extend(self.stdout.fd());
            fds.extend(self.stderr.fd());
            if watch_exit {
                fds.extend(self.pidfd.as_ref().map(AsFd::as_fd));
            }
            if fds.is_empty() {
                // Nothing to read and no pidfd: only the exit is left to wait for.
                thread::sleep(wait);
                continue;
            }
            let ready = unix::poll_readable(&fds, wait)?;
            let (mut ready, mut on) = (ready.into_iter(), [&mut self.stdout, &mut self.stderr]);
            for output in on.iter_mut().filter(|o| o.open()) {
                if ready.next() == Some(true) {
                    output.read_some();
                }
            }
        }
        if killed && status.is_none() {
            // Reap it if it died meanwhile; it was killed either way.
            let _ = self.child.try_wait()?;
        }
        Ok(if killed { None } else { status })
    }
}

/// One output pipe of a program and what was read from it.
struct Output {
    pipe: Option<Box<dyn OutputPipe>>,
    bytes: Vec<u8>,
}

/// The output pipes an [`Output`] reads.
trait OutputPipe: Read + AsFd {}
impl OutputPipe for ChildStdout {}
impl OutputPipe for ChildStderr {}

impl Output {
    fn of(pipe: Option<impl OutputPipe + 'static>) -> Output {
        Output { pipe: pipe.map(|p| Box::new(p) as Box<dyn OutputPipe>), bytes: Vec::new() }
    }

    /// Whether the pipe is still open.
    fn open(&self) -> bool {
        self.pipe.is_some()
    }

    fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.pipe.as_ref().map(|p| p.as_fd())
    }

    /// Reads what the pipe has (it was polled readable, so this does not block); closes
    /// it at end of file. Keeps at most [`OUTPUT_LIMIT`] bytes and drops the rest.
    fn read_some(&mut self) {
        let Some(pipe) = self.pipe.as_mut() else { return };
        let mut buf = [0u8; 16384];
        match pipe.read(&mut buf) {
            Ok(0) => self.pipe = None,
            Ok(n) => {
                let room = OUTPUT_LIMIT.saturating_sub(self.bytes.len());
                self.bytes.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => self.pipe = None,
        }
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
    fn a_program_that_closes_its_pipes_is_still_timed() {
        for pidfd in [true, false] {
            let started = Instant::now();
            let done = sh("exec >/dev/null 2>&1; exec sleep 30", Duration::from_millis(300))
                .run_watching(pidfd)
                .unwrap();
            assert!(done.status.is_none(), "pidfd {pidfd}");
            assert!(started.elapsed() < Duration::from_secs(10));
        }
    }

    #[test]
    fn without_a_pidfd_exits_are_seen_all_the_same() {
        let done =
            sh("echo out; sleep 0.1; exit 5", Duration::from_secs(30)).run_watching(false).unwrap();
        assert_eq!(
            (done.status.and_then(|s| s.code()), done.stdout_text()),
            (Some(5), "out\n".into())
        );
        let started = Instant::now();
        let done = sh("echo bye >&2; sleep 5 & exit 4", Duration::from_secs(30))
            .run_watching(false)
            .unwrap();
        assert_eq!(
            (done.status.and_then(|s| s.code()), done.stderr_text()),
            (Some(4), "bye\n".into())
        );
        assert!(started.elapsed() < Duration::from_secs(4));
    }

    #[test]
    fn stdout_can_go_to_dev_null() {
        let done =
            sh("echo out; echo err >&2", Duration::from_secs(30)).discard_stdout().run().unwrap();
        assert_eq!((done.stdout_text(), done.stderr_text()), (String::new(), "err\n".into()));
    }

    #[test]
    fn programs_are_found_by_path_or_on_path() {
        assert_eq!(find_program(Path::new("sh")).map(|p| p.is_absolute()), Ok(true));
        assert_eq!(
            find_program(Path::new("gpushare-no-such-tool")),
            Err("not found on PATH".to_owned())
        );
        assert_eq!(find_program(Path::new("/nonexistent/tool")), Err("no such file".to_owned()));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tool");
        std::fs::write(&file, "#!/bin/sh\n").unwrap();
        assert_eq!(find_program(&file), Err("not an executable file".to_owned()));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(find_program(&file), Ok(file.clone()));
        assert_eq!(find_program(dir.path()), Err("not an executable file".to_owned()));
    }

    #[test]
    fn a_missing_program_is_an_error_of_its_own() {
        let e = Command::new("/nonexistent/tool", Duration::from_secs(1)).run().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
