//! Limit values as the control daemon reads and prints them: thread percentages and pinned
//! memory limits.

/// A percentage as the daemon prints it: one decimal.
pub fn percent(value: f64) -> String {
    format!("{value:.1}")
}

/// A valid active thread percentage: a number in (0, 100].
pub fn parse_percentage(text: Option<&&str>) -> Option<f64> {
    let value: f64 = text?.parse().ok()?;
    (value > 0.0 && value <= 100.0).then_some(value)
}

/// A pinned memory limit as the real daemon shows it: a gibibyte or more in whole `G`,
/// rounded down (an H100 answered `79G` for `81559M` and `19G` for `20389M`), less in `M`.
pub fn shown_limit(value: &str) -> String {
    match mem_limit_bytes(value) {
        Some(bytes) if bytes >= 1 << 30 => format!("{}G", bytes >> 30),
        _ => value.to_string(),
    }
}

/// Bytes of a pinned memory limit written `<n>G` or `<n>M`.
pub fn mem_limit_bytes(text: &str) -> Option<u64> {
    let (digits, shift) =
        if let Some(d) = text.strip_suffix('G') { (d, 30) } else { (text.strip_suffix('M')?, 20) };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_and_shown_as_the_daemon_does() {
        assert_eq!(mem_limit_bytes("2G"), Some(0x8000_0000));
        assert_eq!(mem_limit_bytes("512M"), Some(512 << 20));
        for bad in ["2T", "G", "1.5G", "2g", "-1G", ""] {
            assert_eq!(mem_limit_bytes(bad), None, "{bad}");
        }
        assert_eq!(shown_limit("81559M"), "79G");
        assert_eq!(shown_limit("512M"), "512M");
        assert_eq!(percent(33.333), "33.3");
        assert_eq!(parse_percentage(Some(&"100")), Some(100.0));
        assert_eq!(parse_percentage(Some(&"0")), None);
        assert_eq!(parse_percentage(None), None);
    }
}
