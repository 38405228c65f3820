//! The control socket between the agent and a replica's gate ([`super::gate`]): one
//! `socketpair`, the gate's descriptor 0. Each message is a frame: its length (4 bytes, big
//! endian), then the message as JSON. Frames are bounded both ways ([`TO_GATE_MAX`],
//! [`FROM_GATE_MAX`]); a longer one is an error, never a larger buffer.
//!
//! The exchange: the agent sends [`ToGate::Spec`]; the gate, already the caller, checks it
//! in the caller's world and answers [`FromGate::Ready`] or [`FromGate::Refused`] (and, in
//! check mode, ends there). Then [`ToGate::Go`] starts the command ([`FromGate::Running`],
//! later [`FromGate::Exited`] and [`FromGate::Done`]); [`ToGate::Stop`] stops it. End of
//! file on either side means the other side is gone. While the command runs, the gate
//! also says [`FromGate::StdoutNumber`] once if its standard output looks like units.

use std::io::{self, Read, Write};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The largest frame the agent sends (a spec: the command and environment, bounded by the
/// bench's options, and JSON's escapes of them).
pub const TO_GATE_MAX: usize = 4 << 20;
/// The largest frame a gate sends (two 4 KiB tails and a few numbers).
pub const FROM_GATE_MAX: usize = 64 << 10;

/// The longest line [`FromGate::StdoutNumber`] carries (no plain number is longer).
pub const STDOUT_NUMBER_MAX: usize = 64;

/// What one gate is to run, and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Spec {
    /// Only check the spec as the caller (directory, command, log directory), then end.
    pub check_only: bool,
    /// The command and its arguments.
    pub argv: Vec<String>,
    /// The whole environment of the command.
    pub env: Vec<(String, String)>,
    /// The absolute directory the command runs in.
    pub cwd: String,
    /// Where its output goes; `None`: counted and its ends kept, not written.
    pub logs: Option<Logs>,
    /// The CPUs the gate binds itself to before the command starts (the command and all
    /// it starts inherit them); `None`: unpinned. Checked as the caller (the caller's
    /// cpuset may not allow them) before [`FromGate::Ready`].
    #[serde(default)]
    pub cpus: Option<Vec<u32>>,
}

/// Where a replica's stdout and stderr go: `<dir>/<run>/replica-<index>.{out,err}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Logs {
    /// The caller's log directory (absolute).
    pub dir: String,
    /// The run's directory inside it (`mps-3`, `mps-3-2`): a plain name.
    pub run: String,
    /// The replica's number.
    pub index: u32,
    /// The most bytes written of each stream; the rest is counted and dropped.
    pub cap_bytes: u64,
}

/// A message to a gate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "message", rename_all = "snake_case")]
pub enum ToGate {
    /// The first message: what to run.
    Spec(Spec),
    /// Start the command now.
    Go,
    /// Stop the command and what it started: SIGTERM, SIGKILL after `grace_ms`.
    Stop {
        /// Milliseconds from SIGTERM to SIGKILL.
        grace_ms: u64,
    },
}

/// A message from a gate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "message", rename_all = "snake_case")]
pub enum FromGate {
    /// The spec checks out as the caller; waiting for [`ToGate::Go`].
    Ready,
    /// The spec does not, as the caller sees it: why, in one line.
    Refused {
        /// The reason (`cwd /root/x: Permission denied (os error 13)`).
        why: String,
    },
    /// The command runs, as process `pid`.
    Running {
        /// Its process id (it leads its process group).
        pid: u32,
    },
    /// The command could not be started (after [`ToGate::Go`]).
    NotRun {
        /// Why (`cannot run ./x: Permission denied (os error 13)`).
        why: String,
    },
    /// A line of the command's standard output is a plain number (`12.5`), as a unit line
    /// of the report descriptor would be: the first such line, said once (at most
    /// [`STDOUT_NUMBER_MAX`] bytes), so that a replica reporting to the wrong descriptor is
    /// told within seconds.
    StdoutNumber {
        /// The line, without its newline.
        line: String,
    },
    /// The command's own process ended.
    Exited {
        /// Its exit code, when it exited.
        code: Option<i32>,
        /// The signal that ended it, when one did.
        signal: Option<i32>,
    },
    /// Everything the command started is gone and its output is written: the last message.
    Done {
        /// The end of its standard output (at most 4 KiB, from a line start).
        stdout_tail: String,
        /// The end of its standard error.
        stderr_tail: String,
        /// Bytes of output beyond the log files' cap, dropped.
        dropped_bytes: u64,
    },
}

/// Writes `message` as one frame.
pub fn send(to: &mut impl Write, message: &impl Serialize) -> io::Result<()> {
    let body = serde_json::to_vec(message).map_err(io::Error::other)?;
    let length = u32::try_from(body.len()).map_err(io::Error::other)?;
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&length.to_be_bytes());
    frame.extend_from_slice(&body);
    to.write_all(&frame)
}

/// Reads one frame of at most `max` bytes: `None` at end of file before it began.
pub fn receive<T: DeserializeOwned>(from: &mut impl Read, max: usize) -> io::Result<Option<T>> {
    let mut length = [0u8; 4];
    let mut got = 0;
    while got < length.len() {
        match from.read(&mut length[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let length = usize::try_from(u32::from_be_bytes(length)).map_err(io::Error::other)?;
    if length > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {length} bytes, more than the {max} allowed"),
        ));
    }
    let mut body = vec![0u8; length];
    from.read_exact(&mut body)?;
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_messages_both_ways() {
        let (mut agent, mut gate) = std::os::unix::net::UnixStream::pair().unwrap();
        let spec = ToGate::Spec(Spec {
            check_only: false,
            argv: vec!["python3".into(), "serve.py".into()],
            env: vec![("BASH_FUNC_x%%".into(), "() { echo \"é\n\"; }".into())],
            cwd: "/home/member".into(),
            logs: Some(Logs { dir: "/tmp/l".into(), run: "mps-3".into(), index: 2, cap_bytes: 9 }),
            cpus: Some(vec![2, 3]),
        });
        send(&mut agent, &spec).unwrap();
        send(&mut agent, &ToGate::Stop { grace_ms: 3000 }).unwrap();
        assert_eq!(receive::<ToGate>(&mut gate, TO_GATE_MAX).unwrap(), Some(spec));
        assert_eq!(
            receive::<ToGate>(&mut gate, TO_GATE_MAX).unwrap(),
            Some(ToGate::Stop { grace_ms: 3000 })
        );
        send(&mut gate, &FromGate::StdoutNumber { line: "12.5".into() }).unwrap();
        send(&mut gate, &FromGate::Exited { code: None, signal: Some(9) }).unwrap();
        drop(gate);
        assert_eq!(
            receive::<FromGate>(&mut agent, FROM_GATE_MAX).unwrap(),
            Some(FromGate::StdoutNumber { line: "12.5".into() })
        );
        assert_eq!(
            receive::<FromGate>(&mut agent, FROM_GATE_MAX).unwrap(),
            Some(FromGate::Exited { code: None, signal: Some(9) })
        );
        assert_eq!(receive::<FromGate>(&mut agent, FROM_GATE_MAX).unwrap(), None);
    }

    #[test]
    fn a_spec_without_cpus_is_unpinned() {
        let text =
            r#"{"message":"spec","check_only":true,"argv":["x"],"env":[],"cwd":"/","logs":null}"#;
        let mut frame = (text.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(text.as_bytes());
        match receive::<ToGate>(&mut &frame[..], TO_GATE_MAX).unwrap() {
            Some(ToGate::Spec(spec)) => assert_eq!(spec.cpus, None),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn frames_beyond_the_bound_and_torn_frames_are_errors() {
        let (mut agent, mut gate) = std::os::unix::net::UnixStream::pair().unwrap();
        gate.write_all(&(100_000u32).to_be_bytes()).unwrap();
        let e = receive::<FromGate>(&mut agent, FROM_GATE_MAX).unwrap_err();
        assert!(e.to_string().contains("more than the 65536 allowed"), "{e}");
        let (mut agent, mut gate) = std::os::unix::net::UnixStream::pair().unwrap();
        gate.write_all(&[0, 0]).unwrap();
        drop(gate);
        assert!(receive::<FromGate>(&mut agent, FROM_GATE_MAX).is_err());
        let (mut agent, mut gate) = std::os::unix::net::UnixStream::pair().unwrap();
        gate.write_all(&[0, 0, 0, 2, b'{', b'x']).unwrap();
        assert!(receive::<FromGate>(&mut agent, FROM_GATE_MAX).is_err());
    }
}
