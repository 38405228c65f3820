//! What both simulated NVIDIA tools share: the record of what they were asked.
//!
//! Each simulated tool appends one line per invocation or command to the file named by
//! `GPUSHARE_SIM_RECORD` (nothing is recorded when it is unset or empty). A line is written
//! with a single `write` on a file opened for appending, so lines from tools running at the
//! same time do not interleave.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The environment variable naming the record file.
pub const RECORD_ENV: &str = "GPUSHARE_SIM_RECORD";

/// The record file named by `GPUSHARE_SIM_RECORD`, when it is set and not empty.
pub fn record_path_from_env() -> Option<PathBuf> {
    std::env::var_os(RECORD_ENV).filter(|p| !p.is_empty()).map(PathBuf::from)
}

/// Appends `line` to the record file `path` (nothing when `path` is `None`). A failure is
/// reported on stderr and otherwise ignored: the tool still does what it was asked.
pub fn record(path: Option<&Path>, line: &str) {
    let Some(path) = path else { return };
    let mut text = String::with_capacity(line.len() + 1);
    text.push_str(line);
    text.push('\n');
    let written = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()));
    if let Err(e) = written {
        eprintln!("simulated NVIDIA tool: cannot append to {RECORD_ENV}={}: {e}", path.display());
    }
}
