//! The simulator's own client-daemon protocol: a command per line, each answer ended by U+0004.

/// Ends each answer on the socket.
pub const END_OF_ANSWER: &str = "\u{4}";
/// Socket commands behind `--fake-client` / `--fake-client-exit`.
pub const FAKE_CONNECT: &str = "__fake_client_connect";
pub const FAKE_EXIT: &str = "__fake_client_exit";

/// The PID after `<command> ` on a fake-client line, and the client's GPU memory in bytes
/// when the line gives it (`__fake_client_connect <pid> [<bytes>]`).
pub fn fake_client_arg(line: &str, command: &str) -> Option<(u32, Option<u64>)> {
    let mut words = line.strip_prefix(command)?.split_whitespace();
    let pid = words.next()?.parse().ok()?;
    let memory = match words.next() {
        Some(bytes) => Some(bytes.parse().ok()?),
        None => None,
    };
    words.next().is_none().then_some((pid, memory))
}

/// The fake-client line of `command` for `pid` (and `memory`).
pub fn fake_client_line(command: &str, pid: u32, memory: Option<u64>) -> String {
    match memory {
        Some(bytes) => format!("{command} {pid} {bytes}"),
        None => format!("{command} {pid}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_client_lines_round_trip() {
        for memory in [None, Some(2u64 << 30)] {
            let line = fake_client_line(FAKE_CONNECT, 438, memory);
            assert_eq!(fake_client_arg(&line, FAKE_CONNECT), Some((438, memory)));
            assert_eq!(fake_client_arg(&line, FAKE_EXIT), None);
        }
        assert_eq!(fake_client_arg("__fake_client_exit 9", FAKE_EXIT), Some((9, None)));
        for bad in ["__fake_client_exit", "__fake_client_exit x", "__fake_client_exit 9 1 2"] {
            assert_eq!(fake_client_arg(bad, FAKE_EXIT), None, "{bad}");
        }
    }
}
