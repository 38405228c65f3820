//! The simulator's own client-daemon protocol: a command per line, each answer ended by U+0004.

/// Ends each answer on the socket.
pub const END_OF_ANSWER: &str = "\u{4}";
/// Socket commands behind `--fake-client` / `--fake-client-exit`.
pub const FAKE_CONNECT: &str = "__fake_client_connect";
pub const FAKE_EXIT: &str = "__fake_client_exit";

/// The PID after `<command> ` on a fake-client line.
pub fn fake_client_arg(line: &str, command: &str) -> Option<u32> {
    line.strip_prefix(command)?.trim().parse().ok()
}
