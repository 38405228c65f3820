//! Lengths of time as people read them. gpushare writes them four ways, each kept as its
//! readers know it: [`seconds_text`] for a setting in a message (`0.5 s`), [`spaced`] for
//! the agent's bench progress and plan (`6m 05s`), [`compact`] for `gpushare-ctl`'s
//! progress lines, the text report and the HTML page (`6m05s`), and [`worded`] for how
//! long something has been running in `gpushare-ctl status` (`2 min 5 s`).

/// A number of seconds as a message shows it: `0.5 s`, `1e300 s` (never three hundred
/// digits).
pub fn seconds_text(seconds: f64) -> String {
    if seconds.is_finite() && seconds.abs() < 1e9 {
        format!("{seconds} s")
    } else {
        format!("{seconds:e} s")
    }
}

/// `45 s`, `6m 05s`, `1h 02m`: whole seconds, rounded, a negative time (or none) as 0.
pub fn spaced(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
    }
}

/// A length of time to the second: `0s`, `42s`, `1m05s`, `6m30s`, `1h02m` (minutes from
/// an hour on); `?` for what is no time (negative, infinite, not a number).
pub fn compact(seconds: f64) -> String {
    if !seconds.is_finite() || seconds < 0.0 {
        return "?".into();
    }
    // Whole seconds, rounded; beyond a thousand years it is all the same.
    let total = seconds.min(3.2e10).round() as u64;
    let (hours, minutes, secs) = (total / 3600, total / 60 % 60, total % 60);
    if hours > 0 {
        format!("{hours}h{minutes:02}m")
    } else if minutes > 0 {
        format!("{minutes}m{secs:02}s")
    } else {
        format!("{secs}s")
    }
}

/// How long something has run, in words: `45 s`, `2 min 5 s`, `1 h 3 min`.
pub fn worded(seconds: u64) -> String {
    match seconds {
        0..60 => format!("{seconds} s"),
        60..3600 => format!("{} min {} s", seconds / 60, seconds % 60),
        _ => format!("{} h {} min", seconds / 3600, seconds % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_never_take_three_hundred_digits() {
        assert_eq!(seconds_text(0.5), "0.5 s");
        assert_eq!(seconds_text(30.0), "30 s");
        assert_eq!(seconds_text(1e300), "1e300 s");
        assert_eq!(seconds_text(f64::INFINITY), "inf s");
    }

    #[test]
    fn spaced_durations_as_the_agent_writes_them() {
        assert_eq!(spaced(44.6), "45 s");
        assert_eq!(spaced(365.0), "6m 05s");
        assert_eq!(spaced(3720.0), "1h 02m");
        assert_eq!(spaced(-1.0), "0 s");
        assert_eq!(spaced(f64::NAN), "0 s");
    }

    #[test]
    fn compact_durations_as_ctl_writes_them() {
        for (seconds, text) in [
            (0.0, "0s"),
            (0.4, "0s"),
            (42.0, "42s"),
            (65.0, "1m05s"),
            (390.0, "6m30s"),
            (3720.0, "1h02m"),
            (1e300, "8888888h53m"),
        ] {
            assert_eq!(compact(seconds), text, "{seconds}");
        }
        for nonsense in [-1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(compact(nonsense), "?");
        }
    }

    #[test]
    fn running_times_are_worded() {
        assert_eq!(worded(45), "45 s");
        assert_eq!(worded(125), "2 min 5 s");
        assert_eq!(worded(3780), "1 h 3 min");
    }
}
