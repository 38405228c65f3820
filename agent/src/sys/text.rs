//! Text that came from someone else (a caller's document name, a process's command or
//! cgroup name), made safe to show: nothing in it may change how a terminal shows what
//! follows, so that one user's text can neither send escape sequences to root's terminal
//! nor make a line read as another's.

/// Whether `c` would change how a terminal shows what follows it rather than show itself:
/// a control character (escape sequences, newlines), or an invisible one that reorders or
/// hides text (bidirectional overrides and isolates, zero-width characters).
pub fn misleading(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061C}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
}

/// `text` with every [`misleading`] character shown as `?`, cut at `max_chars` characters.
pub fn printable(text: &str, max_chars: usize) -> String {
    text.chars().take(max_chars).map(|c| if misleading(c) { '?' } else { c }).collect()
}

/// Whether `text` would be shown as it is by [`printable`] (no character replaced).
pub fn is_printable(text: &str) -> bool {
    !text.chars().any(misleading)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_newlines_and_reordering_become_question_marks() {
        assert_eq!(printable("a\x1b[31mb\nc\u{202E}d\u{200B}e", 100), "a?[31mb?c?d?e");
        assert_eq!(printable("héllo.toml", 100), "héllo.toml");
        assert_eq!(printable("abcdef", 3), "abc");
        assert!(is_printable("plain/file.toml:3:1"));
        assert!(!is_printable("x\u{061C}y"));
    }
}
