//! Byte sizes as gpushare reads and writes them: a number of bytes, or a number with a
//! binary unit (`2GiB`, `512M`, `1536 MiB`), and the two ways of writing one back
//! ([`exact_size`] for settings, [`readable_size`] for people). Each caller words its own
//! error from [`SizeError`], so that messages stay as they were where sizes are read
//! (profiles, `gpushare-ctl`, the simulator's knobs).

use std::fmt;

/// Why a text is no size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SizeError {
    /// It does not start with a digit.
    NotASize,
    /// A unit other than `B`, `K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB` (trimmed).
    UnknownUnit(String),
    /// Zero bytes.
    Zero,
    /// More than 2^64 - 1 bytes.
    TooLarge,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotASize => f.write_str("not a size"),
            Self::UnknownUnit(unit) => write!(f, "unknown size unit `{unit}`"),
            Self::Zero => f.write_str("the size must be above zero"),
            Self::TooLarge => f.write_str("the size is too large"),
        }
    }
}

impl std::error::Error for SizeError {}

/// Reads a byte size: a number of bytes, or a number followed (spaces allowed) by a unit
/// `B`, `K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB`; surrounding spaces are ignored. Zero is
/// refused.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err(SizeError::NotASize);
    }
    let factor: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        other => return Err(SizeError::UnknownUnit(other.to_string())),
    };
    let n: u64 = digits.parse().map_err(|_| SizeError::TooLarge)?;
    match n.checked_mul(factor) {
        Some(0) => Err(SizeError::Zero),
        Some(bytes) => Ok(bytes),
        None => Err(SizeError::TooLarge),
    }
}

/// A byte size exactly, in the largest binary unit that divides it: `2 GiB`, `512 MiB`,
/// `1000 B`. What [`parse_size`] reads back; the one way agent and ctl write a size that
/// is a setting (an MPS limit).
pub fn exact_size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] =
        [(1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    UNITS.iter().find(|(factor, _)| bytes != 0 && bytes.is_multiple_of(*factor)).map_or_else(
        || format!("{bytes} B"),
        |&(factor, unit)| format!("{} {unit}", bytes / factor),
    )
}

/// A byte size for people: exactly when it is a whole number of GiB (or less than one),
/// else in GiB with one decimal (`79.6 GiB`, where the exact size is `81559 MiB`).
pub fn readable_size(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    if bytes < GIB || bytes.is_multiple_of(GIB) {
        exact_size(bytes)
    } else {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_with_and_without_units() {
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size(" 512 M "), Ok(512 << 20));
        assert_eq!(parse_size("1536MiB"), Ok(1536 << 20));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("7B"), Ok(7));
        assert_eq!(parse_size("GiB"), Err(SizeError::NotASize));
        assert_eq!(parse_size(""), Err(SizeError::NotASize));
        assert_eq!(parse_size("-1"), Err(SizeError::NotASize));
        assert_eq!(parse_size("2GB"), Err(SizeError::UnknownUnit("GB".into())));
        assert_eq!(parse_size("2 x"), Err(SizeError::UnknownUnit("x".into())));
        assert_eq!(parse_size("0GiB"), Err(SizeError::Zero));
        assert_eq!(parse_size("99999999999999999999"), Err(SizeError::TooLarge));
        assert_eq!(parse_size("17179869184TiB"), Err(SizeError::TooLarge));
    }

    #[test]
    fn sizes_are_written_exactly_or_for_people() {
        assert_eq!(exact_size(2 << 30), "2 GiB");
        assert_eq!(exact_size(1536 << 20), "1536 MiB");
        assert_eq!(exact_size(1000), "1000 B");
        assert_eq!(exact_size(0), "0 B");
        assert_eq!(parse_size(&exact_size(3 << 40)), Ok(3 << 40));
        assert_eq!(readable_size(80 << 30), "80 GiB");
        assert_eq!(readable_size(81559 << 20), "79.6 GiB");
        assert_eq!(readable_size(512 << 20), "512 MiB");
    }
}
