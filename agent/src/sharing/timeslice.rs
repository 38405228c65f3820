//! The time-slice interval of whole GPUs, through `nvidia-smi compute-policy` (NVML has no
//! public setter; NVIDIA's DRA driver does the same).

use std::path::PathBuf;
use std::time::Duration;

use super::{SharingError, SharingErrorKind as Kind};
use crate::node::TimeSliceInterval;
use crate::sys::command::Command;

/// How long one nvidia-smi run may take (`status` waits for it).
const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads and sets time-slice intervals with one nvidia-smi.
#[derive(Debug, Clone)]
pub struct TimesliceControl {
    nvidia_smi: PathBuf,
}

/// The number `--set-timeslice` takes for an interval.
fn setting(interval: TimeSliceInterval) -> u8 {
    match interval {
        TimeSliceInterval::Default => 0,
        TimeSliceInterval::Short => 1,
        TimeSliceInterval::Medium => 2,
        TimeSliceInterval::Long => 3,
    }
}

impl TimesliceControl {
    /// Using the nvidia-smi at `path` (a bare name is looked up on `PATH`).
    pub fn new(nvidia_smi: impl Into<PathBuf>) -> Self {
        TimesliceControl { nvidia_smi: nvidia_smi.into() }
    }

    /// The nvidia-smi it runs.
    pub fn nvidia_smi(&self) -> &std::path::Path {
        &self.nvidia_smi
    }

    fn run(&self, args: &[&str]) -> Result<String, SharingError> {
        let shown = || format!("{} {}", self.nvidia_smi.display(), args.join(" "));
        let done =
            Command::new(&self.nvidia_smi, NVIDIA_SMI_TIMEOUT).args(args).run().map_err(|e| {
                let message = format!("cannot run {}: {e}", self.nvidia_smi.display());
                SharingError::new(Kind::CannotRun, message)
            })?;
        match done.status {
            Some(status) if status.success() => Ok(done.stdout_text()),
            Some(status) => Err(SharingError::new(
                Kind::Failed,
                format!("{} failed ({status}): {}", shown(), done.first_line()),
            )),
            None => Err(SharingError::new(
                Kind::TimedOut,
                format!(
                    "{} did not finish within {} s and was killed",
                    shown(),
                    NVIDIA_SMI_TIMEOUT.as_secs()
                ),
            )),
        }
    }

    /// The interval of every GPU, by index (`nvidia-smi compute-policy -l`).
    pub fn read_all(&self) -> Result<Vec<(u32, TimeSliceInterval)>, SharingError> {
        Ok(parse_policy_table(&self.run(&["compute-policy", "-l"])?))
    }

    /// Sets the interval of GPU `index` (the index, as `compute-policy -l` lists them).
    pub fn set(&self, index: u32, interval: TimeSliceInterval) -> Result<(), SharingError> {
        let n = setting(interval).to_string();
        self.run(&["compute-policy", "-i", &index.to_string(), "--set-timeslice", &n]).map(|_| ())
    }
}

/// Parses the rows `|   0   Timeslice       Default       |` of `compute-policy -l`.
fn parse_policy_table(text: &str) -> Vec<(u32, TimeSliceInterval)> {
    text.lines()
        .filter_map(|line| {
            let mut words =
                line.trim_matches(|c: char| c == '|' || c.is_whitespace()).split_whitespace();
            let index: u32 = words.next()?.parse().ok()?;
            if words.next()? != "Timeslice" {
                return None;
            }
            let value = words.next()?.to_ascii_lowercase();
            Some((index, TimeSliceInterval::from_name(&value)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharing::SharingErrorKind;

    #[test]
    fn reads_the_table_the_real_h100_printed() {
        let table = "+-------------------------------------+\n\
                     | GPU compute policies:               |\n\
                     | GPU     Name           Value        |\n\
                     |=====================================|\n\
                     |   0   Timeslice       Default       |\n\
                     |   1   Timeslice       Long          |\n\
                     +-------------------------------------+\n";
        assert_eq!(
            parse_policy_table(table),
            vec![(0, TimeSliceInterval::Default), (1, TimeSliceInterval::Long)]
        );
    }

    #[test]
    fn a_missing_nvidia_smi_is_one_clear_line() {
        let e = TimesliceControl::new("/nonexistent/nvidia-smi").read_all().unwrap_err();
        assert_eq!(e.kind, SharingErrorKind::CannotRun);
        assert!(e.to_string().starts_with("cannot run /nonexistent/nvidia-smi: "), "{e}");
    }
}
