//! Reading Rust source as the house and layer tests do (`tests/house/main.rs`,
//! `agent/tests/layers.rs`, which include this file by path): a file's code without its
//! inline test modules and without comments, and the files to read.

use std::fs;
use std::path::{Path, PathBuf};

/// A file's text without its inline test modules (`#[cfg(test)] mod tests { … }`, wherever
/// they sit, matched brace for brace). A `mod tests;` declaration only names a test file,
/// which is left out on its own, so the code after it still counts.
pub fn without_tests(text: &str) -> String {
    let mut rest = text;
    let mut kept = String::new();
    loop {
        let found = ["#[cfg(test)]\nmod tests {", "#[cfg(test)]\npub(crate) mod tests {"]
            .iter()
            .filter_map(|marker| rest.find(marker).map(|at| (at, marker.len())))
            .min();
        let Some((at, len)) = found else {
            kept.push_str(rest);
            return kept;
        };
        kept.push_str(&rest[..at]);
        let body = &rest[at + len..];
        // An unbalanced module runs to the end of the file.
        rest = block_end(body).map_or("", |end| &body[end..]);
    }
}

/// Where the block whose `{` came just before `body` ends (the byte after its `}`), braces
/// in strings, character literals and comments not counted.
fn block_end(body: &str) -> Option<usize> {
    let b = body.as_bytes();
    let (mut i, mut depth) = (0, 1);
    while i < b.len() {
        match b[i] {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                i = body[i..].find('\n').map_or(b.len(), |n| i + n);
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'r' if matches!(b.get(i + 1), Some(b'"' | b'#')) && !ident_byte(b, i) => {
                let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
                if b.get(i + 1 + hashes) == Some(&b'"') {
                    let close = format!("\"{}", "#".repeat(hashes));
                    let from = i + 2 + hashes;
                    i = body[from..].find(&close).map_or(b.len(), |n| from + n + close.len() - 1);
                }
            }
            // A character literal ('{', '\'', '\\'); a lifetime ('a) is passed over.
            b'\'' if b.get(i + 2) == Some(&b'\'') => i += 2,
            b'\'' if b.get(i + 1) == Some(&b'\\') => {
                i = body[i + 3..].find('\'').map_or(b.len(), |n| i + 3 + n);
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Whether the byte before `i` continues an identifier (so `r` there is no raw string).
fn ident_byte(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// The code of a file without its test module and without comments.
pub fn code(text: &str) -> String {
    without_tests(text)
        .lines()
        .map(|l| l.split_once("//").map_or(l, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `.rs` file under `dir`, sorted.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else { return files };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}
