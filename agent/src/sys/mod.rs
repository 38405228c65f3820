//! What the agent needs from the operating system, written once: running external
//! programs ([`command`]), files written atomically ([`files`]), what `/proc` says about
//! processes ([`procfs`]), and the few raw C library calls ([`unix`]).

pub mod command;
pub mod files;
pub mod procfs;
pub mod unix;
