//! What the agent needs from the operating system, written once: running external
//! programs ([`command`]), files written atomically ([`files`]), what `/proc` says about
//! processes ([`procfs`]), the few raw C library calls ([`unix`]), and where log lines go:
//! stderr or the systemd journal ([`log`]), and transient units of systemd ([`systemd`]).

pub mod command;
pub mod files;
pub mod log;
pub mod procfs;
pub mod systemd;
pub mod unix;
