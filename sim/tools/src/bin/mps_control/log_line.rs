//! The lines of `control.log` and `server.log`, in the real daemon's format.

use std::time::{SystemTime, UNIX_EPOCH};

/// Which log file a line goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFile {
    /// `control.log`.
    Control,
    /// `server.log`.
    Server,
}

/// One log line before its timestamp: `[<time> <tag> <pid>] <text>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub file: LogFile,
    /// `Control`, `Server` or `Other`, as in the real logs.
    pub tag: &'static str,
    pub pid: u32,
    pub text: String,
}

impl LogLine {
    /// The line as the real daemon writes it.
    pub fn render(&self, timestamp: &str) -> String {
        format!("[{timestamp} {} {:>5}] {}", self.tag, self.pid, self.text)
    }
}

/// Local time as the real logs show it: `2026-11-22 07:35:47.100`.
pub fn timestamp() -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    match gpushare_base::local_time::format(now.as_secs(), "%Y-%m-%d %H:%M:%S") {
        Some(local) => format!("{local}.{:03}", now.subsec_millis()),
        None => format!("{}.{:03}", now.as_secs(), now.subsec_millis()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_render_as_the_real_ones() {
        let line =
            LogLine { file: LogFile::Control, tag: "Control", pid: 408, text: "NEW UI".into() };
        assert_eq!(
            line.render("2026-11-22 07:35:47.103"),
            "[2026-11-22 07:35:47.103 Control   408] NEW UI"
        );
        let line =
            LogLine { file: LogFile::Server, tag: "Other", pid: 441, text: "Startup".into() };
        assert_eq!(
            line.render("2026-11-22 07:35:47.205"),
            "[2026-11-22 07:35:47.205 Other   441] Startup"
        );
        let line = LogLine { file: LogFile::Control, tag: "Control", pid: 11107, text: "x".into() };
        assert_eq!(line.render("t"), "[t Control 11107] x");
        let ts = timestamp();
        assert_eq!(ts.len(), "2026-11-22 07:35:47.103".len(), "{ts}");
    }
}
