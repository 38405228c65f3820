//! Where and how ctl prints: stdout for results, stderr for progress and warnings, one
//! JSON object with `--json`, plain ASCII unless stdout is a terminal.

use std::io::{IsTerminal, Write};

use comfy_table::{ContentArrangement, Table, presets};
use serde::de::DeserializeOwned;

use crate::error::{CtlError, Kind};

/// Characters that differ between a terminal (UTF-8) and plain output (ASCII).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Glyphs {
    /// Branch to an instance that has a sibling below it.
    pub tree_mid: &'static str,
    /// Branch to the last instance.
    pub tree_last: &'static str,
    /// The line past a branch that has siblings below it (under `tree_mid`).
    pub tree_trunk: &'static str,
    /// "becomes".
    pub arrow: &'static str,
    /// "times", as in a ratio (`P50 ×`).
    pub times: &'static str,
    /// Between the ends of a range (`1.02–1.10x`).
    pub range: &'static str,
    /// Between a name and what is said of it (`launch: mps — …`).
    pub dash: &'static str,
}

impl Glyphs {
    /// For terminals.
    pub const UNICODE: Glyphs = Glyphs {
        tree_mid: "├─",
        tree_last: "└─",
        tree_trunk: "│",
        arrow: "→",
        times: "×",
        range: "–",
        dash: "—",
    };
    /// For pipes and files.
    pub const ASCII: Glyphs = Glyphs {
        tree_mid: "|-",
        tree_last: "`-",
        tree_trunk: "|",
        arrow: "->",
        times: "x",
        range: "-",
        dash: "-",
    };
}

/// The output mode of this run.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    /// `--json`.
    pub json: bool,
    /// Whether stdout is a terminal.
    pub stdout_tty: bool,
    /// Whether stderr is a terminal.
    pub stderr_tty: bool,
}

impl Output {
    /// Looks at the terminals.
    pub fn detect(json: bool) -> Self {
        Self {
            json,
            stdout_tty: std::io::stdout().is_terminal(),
            stderr_tty: std::io::stderr().is_terminal(),
        }
    }

    /// Glyphs for stdout.
    pub fn glyphs(&self) -> Glyphs {
        if self.stdout_tty { Glyphs::UNICODE } else { Glyphs::ASCII }
    }

    /// Whether to draw a progress bar (stderr is a terminal, not `--json`).
    pub fn progress_bar(&self) -> bool {
        self.stderr_tty && !self.json
    }

    /// Prints a result on stdout, with a final newline. A closed pipe is not an error.
    pub fn print(&self, text: &str) {
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(text.as_bytes());
        if !text.ends_with('\n') {
            let _ = stdout.write_all(b"\n");
        }
        let _ = stdout.flush();
    }

    /// Prints a warning on stderr (not with `--json`).
    pub fn warn(&self, text: &str) {
        if !self.json {
            eprintln!("gpushare-ctl: warning: {text}");
        }
    }

    /// Reports a failure: the JSON error object on stdout with `--json` (the message as it
    /// came), else one line on stderr (a failed step's sizes written as ours).
    pub fn error(&self, e: &CtlError) {
        if self.json {
            self.print(&e.to_json());
        } else {
            eprintln!("gpushare-ctl: {}", e.message);
        }
    }

    /// Prints an agent document as it came (with `--json`), after checking that it is one
    /// JSON object; `what` names it in errors (`Status`).
    pub fn print_document(&self, raw: &str, what: &str) -> Result<(), CtlError> {
        serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(raw)
            .map_err(|e| bad_reply(what, &e))?;
        self.print(raw.trim());
        Ok(())
    }
}

/// Reads an agent document into its proto type.
pub fn parse_document<T: DeserializeOwned>(raw: &str, what: &str) -> Result<T, CtlError> {
    serde_json::from_str(raw).map_err(|e| bad_reply(what, &e))
}

fn bad_reply(what: &str, e: &serde_json::Error) -> CtlError {
    CtlError::ctl(
        Kind::BadReply,
        format!(
            "the agent sent a {what} document that gpushare-ctl cannot read ({e}); are gpushare-ctl and gpushare-agent the same version?"
        ),
    )
}

/// A borderless table, aligned with two spaces between columns, never wrapped.
pub fn plain_table<S: ToString>(header: impl IntoIterator<Item = S>) -> Table {
    let mut table = Table::new();
    table
        .load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.into_iter().map(|h| h.to_string()).collect::<Vec<_>>());
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    table
}

/// Renders a table made by [`plain_table`] without trailing blanks, and without control
/// characters: cells may hold what other users chose (a process's name, a unit), and an
/// escape sequence printed to an administrator's terminal could rewrite what it shows.
pub fn render_table(table: &Table) -> String {
    let mut out = String::new();
    for line in table.lines() {
        let line = line.trim_end();
        out.push_str(&printable(line));
        out.push('\n');
    }
    out
}

/// `text` with each control character (ESC, BEL, CR, C1 …) and each invisible one that
/// reorders or hides text (bidirectional overrides and isolates, zero-width characters) as
/// `?`.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let misleading = |c: char| {
        c.is_control()
            || matches!(c, '\u{061C}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
    };
    if text.chars().any(misleading) {
        text.chars().map(|c| if misleading(c) { '?' } else { c }).collect()
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// `"1 step"`, `"3 steps"`.
pub fn plural(n: usize, word: &str) -> String {
    gpushare_proto::plural(n as u64, word)
}

pub use gpushare_proto::exact_size;

/// `23,810`: a count rounded to a whole number, with thousands separators.
pub fn thousands(value: f64) -> String {
    if !value.is_finite() {
        return format!("{value}");
    }
    let rounded = value.round();
    let digits = format!("{:.0}", rounded.abs());
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    if rounded < 0.0 { format!("-{grouped}") } else { grouped }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_get_thousands_separators() {
        assert_eq!(thousands(23_810.4), "23,810");
        assert_eq!(thousands(999.6), "1,000");
        assert_eq!(thousands(12.0), "12");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(-4321.0), "-4,321");
    }

    #[test]
    fn control_characters_never_reach_the_terminal() {
        let mut table = plain_table(["PID", "COMMAND"]);
        table.add_row(["7", "[\u{1b}]0;owned\u{7}\r]"]);
        let text = render_table(&table);
        assert!(!text.contains(['\u{1b}', '\u{7}', '\r']), "{text:?}");
        assert!(text.contains("[?]0;owned??]"), "{text:?}");
        assert_eq!(printable("plain"), "plain");
        assert_eq!(printable("bob\u{202E}ecilA\u{200B}"), "bob?ecilA?");
    }

    #[test]
    fn tables_are_aligned_without_borders_or_trailing_blanks() {
        let mut t = plain_table(["A", "LONGER", "C"]);
        t.add_row(vec!["xyz", "1", ""]);
        t.add_row(vec!["", "22", "end"]);
        assert_eq!(render_table(&t), "A    LONGER  C\nxyz  1\n     22      end\n");
    }

    #[test]
    fn documents_must_be_objects() {
        let out = Output { json: true, stdout_tty: false, stderr_tty: false };
        let e = out.print_document("[1]", "Status").unwrap_err();
        assert!(e.is(Kind::BadReply));
        assert!(e.message.starts_with("the agent sent a Status document"), "{}", e.message);
    }

    #[test]
    fn exact_sizes() {
        assert_eq!(exact_size(2 << 30), "2 GiB");
        assert_eq!(exact_size(2560 << 20), "2560 MiB");
        assert_eq!(exact_size(3 << 10), "3 KiB");
        assert_eq!(exact_size(1000), "1000 B");
        assert_eq!(exact_size(0), "0 B");
    }

    #[test]
    fn plurals() {
        assert_eq!(plural(1, "step"), "1 step");
        assert_eq!(plural(0, "GPU"), "0 GPUs");
    }
}
