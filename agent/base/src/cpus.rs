//! Linux CPU lists (`0-3,8,10-11`), as sysfs writes them and `--cpus` takes them: the one
//! reader of a list's parts and the one canonical writer. Each caller words its own error
//! from [`CpuListError`] (`gpushare-ctl`'s `--cpus`, the agent's pinning, the simulator's
//! `numa:` fact, which joins its parts with `+`).

use std::collections::BTreeSet;
use std::fmt;

/// One past the highest CPU number gpushare takes.
pub const CPUS_MAX: u32 = 4096;

/// Why a CPU list is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuListError {
    /// A part (trimmed) that is neither a CPU number nor a range of two.
    NotANumber {
        /// The part, as written (trimmed).
        part: String,
    },
    /// A CPU number of [`CPUS_MAX`] or more.
    Beyond {
        /// The number, as written (trimmed; all digits, of any length).
        number: String,
    },
    /// A range whose first number is above its last.
    Backwards {
        /// The part, as written (trimmed).
        part: String,
    },
}

impl fmt::Display for CpuListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotANumber { part } => {
                write!(f, "`{part}` is not a CPU number or range (write them like 0-3,8,10-11)")
            }
            Self::Beyond { number } => write!(f, "CPU {number} is beyond CPU {}", CPUS_MAX - 1),
            Self::Backwards { part } => {
                write!(f, "`{part}` runs backwards (write the lower number first)")
            }
        }
    }
}

impl std::error::Error for CpuListError {}

/// One part of a list: a CPU number (`8`, as `(8, 8)`) or a range (`0-3`, as `(0, 3)`),
/// spaces around either number allowed. A number is ASCII digits only, below
/// [`CPUS_MAX`].
pub fn parse_part(part: &str) -> Result<(u32, u32), CpuListError> {
    let part = part.trim();
    let number = |s: &str| -> Result<u32, CpuListError> {
        let s = s.trim();
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(CpuListError::NotANumber { part: part.to_string() });
        }
        match s.parse::<u32>() {
            Ok(n) if n < CPUS_MAX => Ok(n),
            _ => Err(CpuListError::Beyond { number: s.to_string() }),
        }
    };
    let (first, last) = match part.split_once('-') {
        Some((a, b)) => (number(a)?, number(b)?),
        None => {
            let n = number(part)?;
            (n, n)
        }
    };
    if first > last {
        return Err(CpuListError::Backwards { part: part.to_string() });
    }
    Ok((first, last))
}

/// Reads a CPU list: parts ([`parse_part`]) joined by commas, spaces and a final newline
/// allowed; empty text is the empty set. The CPUs in increasing order, each once; the
/// first refused part is the error.
pub fn parse_cpu_list(text: &str) -> Result<Vec<u32>, CpuListError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    let mut set = BTreeSet::new();
    for part in trimmed.split(',') {
        let (first, last) = parse_part(part)?;
        set.extend(first..=last);
    }
    Ok(set.into_iter().collect())
}

/// `cpus` (in any order, repeats once) as the kernel writes a list: runs of consecutive
/// CPUs as ranges (`0-3,8,10-11`); no CPU is empty text.
pub fn write_cpu_list(cpus: &[u32]) -> String {
    let cpus: Vec<u32> = cpus.iter().copied().collect::<BTreeSet<u32>>().into_iter().collect();
    let mut text = String::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        if i > 0 {
            text.push(',');
        }
        if i == j {
            text.push_str(&cpus[i].to_string());
        } else {
            text.push_str(&format!("{}-{}", cpus[i], cpus[j]));
        }
        i = j + 1;
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_read_as_linux_writes_them() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), Ok(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_cpu_list(" 5 , 1-2 "), Ok(vec![1, 2, 5]));
        assert_eq!(parse_cpu_list("3,3,2-4"), Ok(vec![2, 3, 4]));
        assert_eq!(parse_cpu_list(""), Ok(vec![]));
        assert_eq!(parse_cpu_list("0-4095").map(|c| c.len()), Ok(4096));
        assert_eq!(parse_part(" 3 - 5 "), Ok((3, 5)));
    }

    #[test]
    fn odd_parts_are_named() {
        let not = |part: &str| Err(CpuListError::NotANumber { part: part.into() });
        assert_eq!(parse_cpu_list("0-3,x"), not("x"));
        assert_eq!(parse_cpu_list("1,,2"), not(""));
        assert_eq!(parse_cpu_list("1-2-3"), not("1-2-3"));
        assert_eq!(parse_cpu_list("+1"), not("+1"));
        assert_eq!(parse_cpu_list("1 2"), not("1 2"));
        assert_eq!(parse_cpu_list("é"), not("é"));
        assert_eq!(
            parse_cpu_list("0-99999999999999999999"),
            Err(CpuListError::Beyond { number: "99999999999999999999".into() })
        );
        assert_eq!(parse_cpu_list("4096"), Err(CpuListError::Beyond { number: "4096".into() }));
        assert_eq!(parse_cpu_list("5-2"), Err(CpuListError::Backwards { part: "5-2".into() }));
    }

    #[test]
    fn lists_are_written_canonically() {
        for (cpus, text) in [
            (&[0, 1, 2, 3, 8, 10, 11][..], "0-3,8,10-11"),
            (&[3, 2, 1, 0], "0-3"),
            (&[7], "7"),
            (&[], ""),
            (&[4, 0, 5, 1, 1], "0-1,4-5"),
        ] {
            assert_eq!(write_cpu_list(cpus), text);
            assert_eq!(parse_cpu_list(text).map(|c| write_cpu_list(&c)), Ok(text.to_string()));
        }
    }
}
