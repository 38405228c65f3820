//! A replica's gate: `gpushare-agent --bench-gate [--bench-user UID:GID:G,...]`, the first
//! process of a replica (a transient unit's, or a child the agent forked into a new
//! session). Descriptor 0 is its control socket to the agent ([`super::control`]),
//! descriptor 1 the replica's report pipe.
//!
//! It first becomes the caller (exactly the caller's groups, then group, then user), then,
//! as the caller and in the caller's world: reads the spec, enters the directory, looks
//! the command up in the caller's `PATH`, binds itself to the spec's CPUs (which the
//! command then inherits; the caller's cpuset may refuse them), opens the log files, and
//! says `Ready` (or `Refused`, with the reason as the caller would see it). On `Go` it starts the command in
//! a process group of its own — stdin `/dev/null`, stdout and stderr pipes to the gate,
//! the report pipe as descriptor [`REPORT_FD`] — and supervises it: the output goes to
//! the log files up to their cap, the end of each stream is kept, and everything the
//! command starts stays the gate's to stop (the gate is a child subreaper, so even
//! processes that `setsid` away are reparented to it). When the command exits, on `Stop`,
//! or when the agent goes away (end of file on the socket), the gate stops the whole tree
//! (SIGTERM, SIGKILL after a grace), then reports `Done` and exits. The first line of the
//! command's stdout that is a plain number (a unit line written to the wrong descriptor)
//! is said at once (`StdoutNumber`).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use gpushare_proto::bench::find_command;

use super::control::{self, FromGate, Logs, STDOUT_NUMBER_MAX, Spec, ToGate};
use super::pinning;
use super::replicas::REPORT_ENV;
use crate::sys::procfs;
use crate::sys::unix::{self, Identity, Signal};

/// Exit status of a gate whose agent went away or gave up before the start.
pub const ABANDONED: u8 = 125;
/// Exit status of a gate that could not run the command (as a shell's 127).
pub const NOT_RUN: u8 = 127;

/// The descriptor a replica reports units on, as `GPUSHARE_BENCH_REPORT` says (shells such
/// as dash take single-digit descriptors only: `echo 12.5 >&3`).
pub const REPORT_FD: RawFd = 3;

/// How much of the end of each stream is kept for the report.
pub const TAIL_BYTES: usize = 4096;
/// How long what the command left behind gets after it exited, from SIGTERM to SIGKILL.
const LEFTOVER_GRACE: Duration = Duration::from_millis(1000);
/// How long the gate waits for its pipes' end of file once no process is left (a
/// descriptor passed out of the tree could hold them open for ever).
const DRAIN_AFTER: Duration = Duration::from_millis(500);
/// How often the gate looks at its processes while nothing else wakes it.
const TICK: Duration = Duration::from_millis(100);
/// The most a supervise pass reads from one pipe at once, and how many such reads a pass
/// makes before it looks at the rest again (a flood never keeps it from a `Stop`).
const READ_BYTES: usize = 64 << 10;
const READS_A_PASS: usize = 16;
/// The longest reason the gate sends (a path or a PATH can be long).
const WHY_BYTES: usize = 1024;
/// Where the gate's own copies of its two descriptors go, out of the way of the
/// command's 0-3.
const OWN_FDS_FROM: RawFd = 10;

/// `--bench-gate [--bench-user UID:GID:G,...]`.
pub fn main(user: Option<&str>) -> ExitCode {
    // The two descriptors are the gate's alone: the command gets neither as 0 or 1.
    let (control, report) = match take_descriptors() {
        Ok(pair) => pair,
        Err(e) => {
            eprintln!("gpushare-agent --bench-gate: descriptors 0 and 1: {e}");
            return ExitCode::from(NOT_RUN);
        }
    };
    let mut gate = Gate { control };
    if let Some(user) = user {
        let became = Identity::from_arg(user)
            .map_err(io::Error::other)
            .and_then(|identity| unix::become_identity(&identity));
        if let Err(e) = became {
            gate.say(&FromGate::Refused { why: format!("cannot become the caller ({user}): {e}") });
            return ExitCode::from(NOT_RUN);
        }
    }
    let spec = match control::receive::<ToGate>(&mut gate.control, control::TO_GATE_MAX) {
        Ok(Some(ToGate::Spec(spec))) => spec,
        Ok(None) => return ExitCode::from(ABANDONED),
        Ok(Some(other)) => {
            gate.say(&FromGate::Refused { why: format!("expected the spec, got {other:?}") });
            return ExitCode::from(NOT_RUN);
        }
        Err(e) => {
            gate.say(&FromGate::Refused { why: format!("reading the spec: {e}") });
            return ExitCode::from(NOT_RUN);
        }
    };
    let checked =
        check(&spec).and_then(|()| pin(spec.cpus.as_deref())).and_then(|()| open_logs(&spec));
    let files = match checked {
        Ok(files) => files,
        Err(why) => {
            gate.say(&FromGate::Refused { why });
            return ExitCode::from(NOT_RUN);
        }
    };
    gate.say(&FromGate::Ready);
    if spec.check_only {
        return ExitCode::SUCCESS;
    }
    match control::receive::<ToGate>(&mut gate.control, control::TO_GATE_MAX) {
        Ok(Some(ToGate::Go)) => {}
        // Stopped, or the agent gone, before the start: the command never runs.
        _ => return ExitCode::from(ABANDONED),
    }
    let cap = spec.logs.as_ref().map_or(0, |l| l.cap_bytes);
    gate.run(&spec, report, files, cap)
}

/// The gate's side of the control socket.
struct Gate {
    control: UnixStream,
}

impl Gate {
    /// Sends `message`; a gate whose agent is gone has no one to tell, and carries on
    /// (end of file on the socket tells it the same a moment later).
    fn say(&mut self, message: &FromGate) {
        let message = match message {
            FromGate::Refused { why } => &FromGate::Refused { why: short(why) },
            FromGate::NotRun { why } => &FromGate::NotRun { why: short(why) },
            other => other,
        };
        let _ = control::send(&mut self.control, message);
    }

    /// Says the first plain number of the command's stdout, once, when one has come.
    fn say_stdout_number(&mut self, out: &mut Sink) {
        if let Some(line) = out.numbers.as_mut().and_then(NumberWatch::take_found) {
            self.say(&FromGate::StdoutNumber { line });
        }
    }

    /// Starts the command and supervises it until it and everything it started is gone.
    fn run(
        &mut self,
        spec: &Spec,
        report: OwnedFd,
        files: (Option<File>, Option<File>),
        cap: u64,
    ) -> ExitCode {
        // Orphans of the command's tree come back here, whatever session they started.
        if let Err(e) = unix::become_child_subreaper() {
            self.say(&FromGate::NotRun {
                why: format!("cannot hold the replica's processes: {e}"),
            });
            return ExitCode::from(NOT_RUN);
        }
        let mut out = Sink::new(files.0, cap);
        out.numbers = Some(NumberWatch::default());
        let mut err = Sink::new(files.1, cap);
        let started = start_command(spec, &report);
        drop(report);
        let (child, out_pipe, err_pipe) = match started {
            Ok(started) => started,
            Err(why) => {
                err.take(format!("gpushare-agent --bench-gate: {why}\n").as_bytes());
                self.say(&FromGate::NotRun { why });
                self.say(&FromGate::Exited { code: Some(i32::from(NOT_RUN)), signal: None });
                self.say(&done(out, err));
                return ExitCode::SUCCESS;
            }
        };
        self.say(&FromGate::Running { pid: child });
        let mut supervisor = Supervisor {
            child,
            child_reaped: false,
            pidfd: unix::pidfd_open(child),
            pipes: [Some(out_pipe), Some(err_pipe)],
            kill_at: None,
            agent_gone: false,
            empty_since: None,
        };
        let mut sinks = [out, err];
        loop {
            let event = supervisor.wait(&self.control, &mut sinks);
            match event {
                Event::Message(ToGate::Stop { grace_ms }) => {
                    supervisor.terminate(Duration::from_millis(grace_ms));
                }
                Event::Message(_) => {}
                Event::AgentGone => {
                    supervisor.agent_gone = true;
                    supervisor.terminate(Duration::ZERO);
                }
                Event::Tick => {}
            }
            self.say_stdout_number(&mut sinks[0]);
            if let Some(ended) = supervisor.reap() {
                self.say(&FromGate::Exited { code: ended.code, signal: ended.signal });
                // A replica is its command: what it leaves behind stops with it.
                supervisor.terminate(LEFTOVER_GRACE);
            }
            if supervisor.finished() {
                break;
            }
        }
        let [mut out, err] = sinks;
        if !supervisor.agent_gone {
            self.say_stdout_number(&mut out);
            self.say(&done(out, err));
        }
        ExitCode::SUCCESS
    }
}

/// `why` cut to [`WHY_BYTES`] at a character boundary.
fn short(why: &str) -> String {
    match gpushare_proto::byte_prefix(why, WHY_BYTES) {
        whole if whole.len() == why.len() => why.to_string(),
        start => format!("{start}…"),
    }
}

/// Moves descriptors 0 (the control socket) and 1 (the report pipe) out of the way, each
/// closing on exec, and puts `/dev/null` in their place.
fn take_descriptors() -> io::Result<(UnixStream, OwnedFd)> {
    // Descriptors 0 and 1, as the starter (systemd or the agent) handed them over.
    let control = unix::duplicate_above(io::stdin().as_fd(), OWN_FDS_FROM)?;
    let report = unix::duplicate_above(io::stdout().as_fd(), OWN_FDS_FROM)?;
    unix::null_at(0)?;
    unix::null_at(1)?;
    // Whatever else the gate inherited (its starter's descriptors) stays out of the command.
    unix::close_on_exec_from(3)?;
    let control = socket(control)?;
    Ok((control, report))
}

/// `fd` as a socket, or why it is none.
fn socket(fd: OwnedFd) -> io::Result<UnixStream> {
    let stream = UnixStream::from(fd);
    stream
        .local_addr()
        .map_err(|e| io::Error::other(format!("descriptor 0 is no socket ({e})")))?;
    Ok(stream)
}

/// What the gate checks as the caller before it says `Ready`: the directory can be
/// entered (it is entered), the command found as a shell would find it, the log directory
/// written to. The reason is said as the caller would meet it.
fn check(spec: &Spec) -> Result<(), String> {
    let cwd = Path::new(&spec.cwd);
    if !cwd.is_absolute() {
        return Err(format!("cwd {}: not an absolute path", spec.cwd));
    }
    std::env::set_current_dir(cwd).map_err(|e| format!("cwd {}: {e}", spec.cwd))?;
    let program = spec.argv.first().ok_or("no command")?;
    let path = spec.env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_str());
    let path = std::ffi::OsStr::new(path.unwrap_or("/usr/local/bin:/usr/bin:/bin"));
    find_command(program, Some(path), cwd).map_err(|why| format!("command `{program}`: {why}"))?;
    if let Some(logs) = &spec.logs {
        let dir = Path::new(&logs.dir);
        if !dir.is_absolute() {
            return Err(format!("logs {}: not an absolute path", logs.dir));
        }
        let open = unix::open_directory(dir).map_err(|e| format!("logs {}: {e}", logs.dir))?;
        own_private_directory(&open).map_err(|why| format!("logs {}: {why}", logs.dir))?;
        unix::may_write_dir(dir).map_err(|e| format!("logs {}: {e}", logs.dir))?;
    }
    Ok(())
}

/// Binds the gate (and so the command it starts, and all that starts) to `cpus`, as the
/// caller: the caller's cpuset may allow fewer, and the kernel then keeps those it allows,
/// which is refused here too. `None`: unpinned, nothing changes.
fn pin(cpus: Option<&[u32]>) -> Result<(), String> {
    let Some(cpus) = cpus else { return Ok(()) };
    let wanted = pinning::CpuList::of(cpus)?;
    if wanted.is_empty() {
        return Err("cpus: an empty set to pin the replica to".into());
    }
    match unix::set_cpu_affinity(wanted.cpus()) {
        Ok(got) if got == wanted.cpus() => Ok(()),
        Ok(got) => Err(format!(
            "cpus {wanted}: only {} of them may be used here (a cpuset limits the caller's \
             processes); give --cpus within them, or --no-pin",
            pinning::format_cpus(&got)
        )),
        Err(e) => Err(format!(
            "cpus {wanted}: the replica cannot be pinned to them ({e}): they are offline, \
             absent or outside the caller's cpuset; give --cpus others, or --no-pin"
        )),
    }
}

/// Whether the open directory `dir` is this process's user's and writable by nobody else:
/// where the caller's output may go (another user's, or a shared one like /tmp, could
/// hand the output to whoever prepared it).
fn own_private_directory(dir: &File) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = dir.metadata().map_err(|e| e.to_string())?;
    if meta.uid() != unix::effective_uid() {
        return Err(format!("the directory is uid {}'s, not yours", meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "others may write in the directory (mode {:o}); chmod go-w it, or name another",
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Opens the replica's log files, as the caller: the run's directory (`0700`) and
/// `replica-<i>.out`/`.err` (`0600`), never through a symbolic link. In check mode, or
/// without logs, none.
fn open_logs(spec: &Spec) -> Result<(Option<File>, Option<File>), String> {
    let Some(Logs { dir, run, index, .. }) = spec.logs.as_ref().filter(|_| !spec.check_only) else {
        return Ok((None, None));
    };
    let plain = !run.is_empty() && run.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if !plain {
        return Err(format!("logs: `{run}` is not a plain directory name"));
    }
    let dir = PathBuf::from(dir).join(run);
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            return Err(format!("logs {}: {e}", dir.display()));
        }
        _ => {}
    }
    // The run's directory as it is now, checked, then used by descriptor alone.
    let open_dir =
        unix::open_directory(&dir).map_err(|e| format!("logs {}: {e}", dir.display()))?;
    own_private_directory(&open_dir).map_err(|why| format!("logs {}: {why}", dir.display()))?;
    let open = |name: String| {
        unix::create_new_in(&open_dir, &name, 0o600)
            .map_err(|e| format!("logs {}: {e}", dir.join(&name).display()))
    };
    Ok((Some(open(format!("replica-{index}.out"))?), Some(open(format!("replica-{index}.err"))?)))
}

/// Starts the command in its own process group, with the report pipe as descriptor 3;
/// returns its pid and the read ends of its stdout and stderr.
fn start_command(spec: &Spec, report: &OwnedFd) -> Result<(u32, File, File), String> {
    let (program, args) = spec.argv.split_first().ok_or("no command")?;
    let pipes = unix::pipe().and_then(|out| Ok((out, unix::pipe()?)));
    let ((out_read, out_write), (err_read, err_write)) =
        pipes.map_err(|e| format!("output pipes: {e}"))?;
    let mut command = std::process::Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .env(REPORT_ENV, REPORT_FD.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::from(out_write))
        .stderr(Stdio::from(err_write))
        .process_group(0);
    unix::with_fd_as(&mut command, report.as_raw_fd(), REPORT_FD);
    let child = command.spawn().map_err(|e| format!("cannot run {program}: {e}"))?;
    let pid = child.id();
    // The gate reaps its children itself ([`unix::reap_any`]); the handle is not needed.
    drop(child);
    // The command's copies of the pipes' write ends: dropping them leaves the command's.
    drop(command);
    for pipe in [&out_read, &err_read] {
        unix::set_nonblocking(pipe.as_fd()).map_err(|e| format!("output pipes: {e}"))?;
    }
    Ok((pid, File::from(out_read), File::from(err_read)))
}

/// One output stream: written to its file up to `cap` bytes, the rest counted; its last
/// [`TAIL_BYTES`] kept; stdout also watched for lines that look like units.
struct Sink {
    /// Looks for the first line that is a plain number (stdout only).
    numbers: Option<NumberWatch>,
    file: Option<File>,
    cap: u64,
    written: u64,
    /// Whether what was written ends a line (where the note on what was dropped begins).
    at_line_start: bool,
    dropped: u64,
    tail: Vec<u8>,
    /// Whether more than the tail went by (the tail then starts at a line).
    cut: bool,
}

impl Sink {
    fn new(file: Option<File>, cap: u64) -> Sink {
        Sink {
            numbers: None,
            file,
            cap,
            written: 0,
            at_line_start: true,
            dropped: 0,
            tail: Vec::new(),
            cut: false,
        }
    }

    fn take(&mut self, bytes: &[u8]) {
        if let Some(watch) = &mut self.numbers {
            watch.take(bytes);
        }
        if let Some(file) = &mut self.file {
            let room = usize::try_from(self.cap.saturating_sub(self.written)).unwrap_or(usize::MAX);
            let (kept, over) = bytes.split_at(bytes.len().min(room));
            // A log that cannot be written (a full disk) counts as dropped.
            match file.write_all(kept) {
                Ok(()) => {
                    self.written += kept.len() as u64;
                    if let Some(&last) = kept.last() {
                        self.at_line_start = last == b'\n';
                    }
                }
                Err(_) => self.dropped += kept.len() as u64,
            }
            self.dropped += over.len() as u64;
        }
        self.tail.extend_from_slice(bytes);
        if self.tail.len() > TAIL_BYTES {
            self.tail.drain(..self.tail.len() - TAIL_BYTES);
            self.cut = true;
        }
    }

    /// The kept end as text, from a line start when more went before it; the log file's
    /// last line says what was dropped.
    fn finish(mut self) -> (String, u64) {
        if let Some(file) = &mut self.file
            && self.dropped > 0
        {
            let _ = writeln!(
                file,
                "{}[gpushare: the log stops at {} bytes; {} more were dropped]",
                if self.at_line_start { "" } else { "\n" },
                self.cap,
                self.dropped
            );
        }
        let text = String::from_utf8_lossy(&self.tail).into_owned();
        let text = match (self.cut, text.find('\n')) {
            (true, Some(nl)) => text[nl + 1..].to_string(),
            _ => text,
        };
        (text, self.dropped)
    }
}

/// Finds the first line of a stream that is a plain number (what a unit line of the
/// report descriptor would be: `12.5`, ` 3 `), keeping at most [`STDOUT_NUMBER_MAX`] bytes
/// of the line under way; once found, the rest of the stream costs nothing.
#[derive(Debug, Default)]
struct NumberWatch {
    line: Vec<u8>,
    /// The line under way is longer than any number: skipped to its end.
    overlong: bool,
    found: Option<String>,
    /// Whether the line found was handed out.
    said: bool,
}

impl NumberWatch {
    fn take(&mut self, mut bytes: &[u8]) {
        while self.found.is_none() && !bytes.is_empty() {
            let (part, ended) = match memchr::memchr(b'\n', bytes) {
                Some(nl) => (&bytes[..nl], true),
                None => (bytes, false),
            };
            bytes = &bytes[(part.len() + usize::from(ended)).min(bytes.len())..];
            if !self.overlong {
                if self.line.len() + part.len() > STDOUT_NUMBER_MAX {
                    self.overlong = true;
                    self.line.clear();
                } else {
                    self.line.extend_from_slice(part);
                }
            }
            if ended {
                if !std::mem::take(&mut self.overlong) {
                    self.found = plain_number(&self.line);
                }
                self.line.clear();
            }
        }
    }

    /// The line found, the first time it is asked for after it was.
    fn take_found(&mut self) -> Option<String> {
        if self.said {
            return None;
        }
        let found = self.found.clone()?;
        self.said = true;
        Some(found)
    }
}

/// `line` trimmed, when it is a number the report descriptor would count as a unit's
/// latency (finite, not negative).
fn plain_number(line: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(line).ok()?.trim();
    let number: f64 = text.parse().ok()?;
    (number.is_finite() && number >= 0.0).then(|| text.to_string())
}

/// The gate's last message.
fn done(out: Sink, err: Sink) -> FromGate {
    let (stdout_tail, out_dropped) = out.finish();
    let (stderr_tail, err_dropped) = err.finish();
    FromGate::Done { stdout_tail, stderr_tail, dropped_bytes: out_dropped + err_dropped }
}

/// What woke the supervisor.
enum Event {
    Message(ToGate),
    AgentGone,
    Tick,
}

/// The command's process tree while it runs and until it is gone.
struct Supervisor {
    child: u32,
    child_reaped: bool,
    pidfd: Option<OwnedFd>,
    pipes: [Option<File>; 2],
    /// When whatever still runs gets SIGKILL (a stop is under way).
    kill_at: Option<Instant>,
    agent_gone: bool,
    /// Since when no process of the tree is left.
    empty_since: Option<Instant>,
}

impl Supervisor {
    /// Waits for a message, output, the command's exit or a tick; copies what the pipes
    /// hold to the sinks.
    fn wait(&mut self, control: &UnixStream, sinks: &mut [Sink; 2]) -> Event {
        let mut fds = Vec::new();
        if !self.agent_gone {
            fds.push(control.as_fd());
        }
        let pipe_slots: Vec<usize> = (0..2).filter(|&i| self.pipes[i].is_some()).collect();
        for &i in &pipe_slots {
            fds.extend(self.pipes[i].as_ref().map(AsFd::as_fd));
        }
        if let Some(pidfd) = self.pidfd.as_ref().filter(|_| !self.child_reaped) {
            fds.push(pidfd.as_fd());
        }
        let ready = unix::poll_readable(&fds, TICK).unwrap_or_default();
        let mut event = Event::Tick;
        let mut next = 0;
        if !self.agent_gone {
            if ready.first().copied().unwrap_or(false) {
                event = match control::receive::<ToGate>(&mut &*control, control::TO_GATE_MAX) {
                    Ok(Some(message)) => Event::Message(message),
                    _ => Event::AgentGone,
                };
            }
            next = 1;
        }
        for (k, &i) in pipe_slots.iter().enumerate() {
            if ready.get(next + k).copied().unwrap_or(false) {
                self.drain(i, &mut sinks[i]);
            }
        }
        event
    }

    /// Copies what pipe `i` holds into `sink`; forgets the pipe at its end of file.
    fn drain(&mut self, i: usize, sink: &mut Sink) {
        let Some(pipe) = &mut self.pipes[i] else { return };
        let mut buffer = vec![0u8; READ_BYTES];
        for _ in 0..READS_A_PASS {
            match pipe.read(&mut buffer) {
                Ok(0) => {
                    self.pipes[i] = None;
                    return;
                }
                Ok(n) => {
                    sink.take(&buffer[..n]);
                    if n < buffer.len() {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.pipes[i] = None;
                    return;
                }
            }
        }
    }

    /// Reaps every child that ended (the command, and orphans reparented here); the
    /// command's end when it is among them.
    fn reap(&mut self) -> Option<unix::Ended> {
        let mut command = None;
        while let Some(ended) = unix::reap_any() {
            if ended.pid == self.child {
                self.child_reaped = true;
                command = Some(ended);
            }
        }
        command
    }

    /// Begins stopping the whole tree: SIGTERM now, SIGKILL after `grace` (an earlier
    /// deadline stands).
    fn terminate(&mut self, grace: Duration) {
        let at = Instant::now() + grace;
        self.kill_at = Some(self.kill_at.map_or(at, |t| t.min(at)));
        self.signal_tree(Signal::SIGTERM);
        if grace.is_zero() {
            self.signal_tree(Signal::SIGKILL);
        }
    }

    /// Sends `signal` to the command's process group (while its leader is unreaped, the
    /// group id is still its) and to every process below the gate.
    fn signal_tree(&self, signal: Signal) {
        if !self.child_reaped {
            let _ = unix::signal_group(self.child, signal);
        }
        for pid in procfs::descendants(std::process::id()) {
            let _ = unix::signal(pid, signal);
        }
    }

    /// Whether the tree is gone and its output read; SIGKILLs it once its grace is over.
    fn finished(&mut self) -> bool {
        if self.kill_at.is_some_and(|t| Instant::now() >= t) {
            self.signal_tree(Signal::SIGKILL);
        }
        if !self.child_reaped {
            return false;
        }
        let _ = self.reap();
        let left = procfs::descendants(std::process::id());
        if !left.is_empty() {
            self.empty_since = None;
            if self.kill_at.is_none() {
                self.terminate(LEFTOVER_GRACE);
            }
            return false;
        }
        let since = *self.empty_since.get_or_insert_with(Instant::now);
        self.pipes.iter().all(Option::is_none) || since.elapsed() >= DRAIN_AFTER
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sink_writes_up_to_its_cap_and_keeps_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let file = File::create(&path).unwrap();
        let mut sink = Sink::new(Some(file), 10);
        sink.take(b"0123456");
        sink.take(b"789abcdef\n");
        let (tail, dropped) = sink.finish();
        assert_eq!(tail, "0123456789abcdef\n");
        assert_eq!(dropped, 7);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("0123456789\n[gpushare: the log stops at 10 bytes; 7 more"),
            "{text}"
        );
    }

    #[test]
    fn a_long_stream_keeps_its_last_lines_from_a_line_start() {
        let mut sink = Sink::new(None, 0);
        for i in 0..2000 {
            sink.take(format!("line {i}\n").as_bytes());
        }
        let (tail, dropped) = sink.finish();
        assert!(tail.starts_with("line "), "{tail:.20}");
        assert!(tail.ends_with("line 1999\n"));
        assert!(tail.len() <= TAIL_BYTES);
        assert_eq!(dropped, 0, "nothing is dropped where nothing is written");
    }

    #[test]
    fn log_names_stay_inside_the_directory() {
        let spec = |run: &str| Spec {
            check_only: false,
            argv: vec!["true".into()],
            env: Vec::new(),
            cwd: "/".into(),
            logs: Some(Logs { dir: "/tmp".into(), run: run.into(), index: 0, cap_bytes: 1 }),
            cpus: None,
        };
        for bad in ["../x", "a/b", "", "."] {
            assert!(open_logs(&spec(bad)).unwrap_err().contains("plain directory name"), "{bad}");
        }
    }

    #[test]
    fn the_first_plain_number_on_stdout_is_found_however_reads_split_it() {
        let text: &[u8] = b"loading model\nepoch 1: 12.5\n\n  \n-3\nNaN\ninf\n 12.5 \r\n7\n";
        for cut in 0..=text.len() {
            let mut watch = NumberWatch::default();
            watch.take(&text[..cut]);
            watch.take(&text[cut..]);
            assert_eq!(watch.take_found().as_deref(), Some("12.5"), "split at {cut}");
            assert_eq!(watch.take_found(), None, "said once");
        }
        let mut watch = NumberWatch::default();
        for byte in text {
            watch.take(std::slice::from_ref(byte));
        }
        assert_eq!(watch.take_found().as_deref(), Some("12.5"));
        // Nothing but text; a number without its newline yet.
        let mut watch = NumberWatch::default();
        watch.take(b"step 1 done\nstep 2 done\n42");
        assert_eq!(watch.take_found(), None);
        watch.take(b"\n");
        assert_eq!(watch.take_found().as_deref(), Some("42"));
    }

    #[test]
    fn a_long_line_ending_in_digits_is_no_number_and_costs_its_bound() {
        let mut watch = NumberWatch::default();
        let mut long = vec![b'x'; 1 << 20];
        long.extend_from_slice(b"12\n");
        watch.take(&long);
        assert_eq!(watch.take_found(), None);
        let digits = vec![b'1'; STDOUT_NUMBER_MAX + 1];
        watch.take(&digits);
        watch.take(b"\n");
        assert_eq!(watch.take_found(), None, "longer than any number");
        assert!(watch.line.capacity() <= 2 * STDOUT_NUMBER_MAX + 8);
        watch.take(b"0.25\n");
        assert_eq!(watch.take_found().as_deref(), Some("0.25"));
    }

    #[test]
    fn a_stdout_sink_watches_for_numbers_and_a_stderr_one_does_not() {
        let mut out = Sink::new(None, 0);
        out.numbers = Some(NumberWatch::default());
        out.take(b"3.5\n");
        assert_eq!(out.numbers.as_mut().and_then(NumberWatch::take_found).as_deref(), Some("3.5"));
        let mut err = Sink::new(None, 0);
        err.take(b"3.5\n");
        assert!(err.numbers.is_none());
    }

    #[test]
    fn pinning_binds_the_gate_or_says_why_not() {
        // A thread of its own: affinity is per thread.
        std::thread::spawn(|| {
            assert_eq!(pin(None), Ok(()));
            let all = unix::cpu_affinity().unwrap();
            assert_eq!(pin(Some(&[all[0]])), Ok(()));
            assert_eq!(unix::cpu_affinity().unwrap(), [all[0]]);
            let e = pin(Some(&[4000])).unwrap_err();
            assert!(e.starts_with("cpus 4000: the replica cannot be pinned to them ("), "{e}");
            let e = pin(Some(&[all[0], 4000])).unwrap_err();
            assert!(e.contains(&format!(": only {} of them may be used here", all[0])), "{e}");
            assert!(pin(Some(&[])).unwrap_err().contains("empty"));
            assert!(pin(Some(&[5000])).unwrap_err().contains("beyond"));
        })
        .join()
        .unwrap();
    }
}
