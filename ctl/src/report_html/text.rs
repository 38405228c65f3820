//! The bench report's words, shared by the text report (`commands/bench.rs`), the
//! progress lines (`job.rs`) and the page: figures, durations, how the replicas were
//! measured and pinned, the host's noise, a noisy baseline, ties, and the answer in a few
//! words. Plain text: the page escapes it.

use std::fmt::Write as _;

use gpushare_proto::bench::{BenchNoise, BenchPinning, BenchRecommendation, BenchReport, BenchRun};
use gpushare_proto::plural;

/// A command line as a shell would take it back: words with blanks or special
/// characters in single quotes (`./serve --name 'a b'`).
pub fn command_line(words: &[String]) -> String {
    let quote = |word: &String| {
        let plain = !word.is_empty()
            && word.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%^".contains(c));
        if plain { word.clone() } else { format!("'{}'", word.replace('\'', "'\\''")) }
    };
    words.iter().map(quote).collect::<Vec<_>>().join(" ")
}

/// A figure with three significant digits, whole from 100 on (`0.0412`, `2.41`, `412`,
/// `23810`).
pub(super) fn figure(value: f64) -> String {
    if !value.is_finite() {
        return format!("{value}");
    }
    let magnitude = value.abs();
    if magnitude >= 100.0 || magnitude == 0.0 {
        return format!("{value:.0}");
    }
    let decimals = (2.0 - magnitude.log10().floor()).clamp(0.0, 6.0) as usize;
    format!("{value:.decimals$}")
}

/// A figure or `–`.
pub(super) fn maybe(value: Option<f64>, format: impl Fn(f64) -> String) -> String {
    value.map_or("–".into(), format)
}

/// `2.94×`.
pub(super) fn times(value: f64) -> String {
    format!("{value:.2}×")
}

/// How the replicas were measured, in words.
pub(super) fn method(report: &BenchReport) -> String {
    // Display writes the shortest form that reads back: `30`, `1.5`.
    let window = report.window_seconds.map(|s| format!(" over {s} s windows"));
    let window = window.unwrap_or_default();
    match report.method.as_str() {
        "until-exit" => "each replica's wall time to its exit".into(),
        "histogram" => match &report.histogram {
            Some(name) => format!("histogram {name}{window}"),
            None => format!("a histogram{window}"),
        },
        "units" => format!("units reported by line{window}"),
        other => format!("{other}{window}"),
    }
}

/// What `--repeat K` did, in the one wording of the help, the README and the report:
/// `6 rounds: each run measured once a round, its median reported with its interval`.
pub fn rounds_text(repeat: u32) -> String {
    format!(
        "{repeat} rounds: each run measured once a round, its median reported with its interval"
    )
}

/// The answer in a few words, for the page's title: `mps at 3, mig at 7` (the pick per
/// replica count); `None` without a recommendation.
pub fn answer(report: &BenchReport) -> Option<String> {
    let picks: Vec<String> = report
        .recommendations
        .iter()
        .filter(|r| r.strategy != "none")
        .map(|r| format!("{} at {}", r.strategy, r.replicas))
        .collect();
    (!picks.is_empty()).then(|| picks.join(", "))
}

/// How much a spread of repeated measurements is worth a word: beyond it, scalings off by
/// that much are within the host's own noise.
const NOISY_SPREAD: f64 = 0.10;

/// When the baseline's measurements spread by more than [`NOISY_SPREAD`], what that means
/// for the report (every ratio in it divides by the baseline), in a sentence. The text
/// report and the page say the same.
pub fn noisy_baseline(report: &BenchReport) -> Option<String> {
    let spread = report.baseline.as_ref().and_then(BenchRun::repeat_spread)?;
    if spread <= NOISY_SPREAD {
        return None;
    }
    // --duration sets a window: with --until-exit there is none to lengthen.
    let windowed = report.window_seconds.is_some();
    let advice = match (report.repeat < 3, windowed) {
        (true, true) => "--repeat 3 (or more) and a longer --duration give steadier ratios",
        (true, false) => "--repeat 3 (or more) gives steadier ratios",
        (false, true) => "a longer --duration or a quieter host gives steadier ratios",
        (false, false) => "more --repeat or a quieter host gives steadier ratios",
    };
    Some(format!(
        "one replica alone varied by {:.0} % between its measurements: the scalings, \
         slowdowns and inflations carry that uncertainty; {advice}",
        spread * 100.0
    ))
}

/// A length of time to the second, as ctl's lines, the text report and the page say it
/// (`42s`, `6m30s`, `?` for no time).
pub use gpushare_base::duration::compact as duration_text;

/// `took 6m12s (estimated 6m30s)`: the bench's wall time, and its estimate when the agent
/// made one.
pub fn took(report: &BenchReport) -> String {
    let mut text = format!("took {}", duration_text(report.wall_seconds));
    if let Some(estimate) = report.estimate_seconds {
        let _ = write!(text, " (estimated {})", duration_text(estimate));
    }
    text
}

/// How the replicas were pinned, without the word `Pinned`: `2 CPUs per replica from CPUs
/// 0-15 (NUMA node 0 of the GPU); replica 0: 0-1, replica 1: 2-3, …`, at most `shown`
/// replicas named (the first ones and the last, `more` between them).
pub fn pinning_text(pinning: &BenchPinning, shown: usize, more: &str) -> String {
    let mut text = format!(
        "{} per replica from CPUs {} ({})",
        plural(pinning.cpus_per_replica, "CPU"),
        pinning.cpus,
        pinning.from
    );
    let named: Vec<String> = pinning
        .replicas
        .iter()
        .enumerate()
        .map(|(i, cpus)| format!("replica {i}: {cpus}"))
        .collect();
    let shown = shown.max(2);
    let listed = if named.len() > shown {
        let mut first = named[..shown - 1].to_vec();
        first.push(more.to_owned());
        first.push(named[named.len() - 1].clone());
        first
    } else {
        named
    };
    if !listed.is_empty() {
        let _ = write!(text, "; {}", listed.join(", "));
    }
    text
}

/// Whether the report comes from an agent that pins and measures the host's noise (issue
/// 27): one from an older agent says nothing of pinning.
pub fn knows_pinning(report: &BenchReport) -> bool {
    report.pinning.is_some() || report.noise.is_some() || !report.intervals.is_empty()
}

/// The host's noise in one sentence: `baseline spread 8.1 %, steal 0.4 %, CPU 2,450–3,100
/// MHz — differences under 12 % on this host are noise.`, figures written by `number`,
/// ranges joined by `range`, the meaning after `dash`.
pub fn noise_text(
    noise: &BenchNoise,
    number: impl Fn(f64) -> String,
    range: &str,
    dash: &str,
) -> String {
    let mut parts = Vec::new();
    if let Some(scale) = noise.baseline_scale {
        parts.push(format!("one measurement varies {:.1} %", scale * 100.0));
    } else if let Some(spread) = noise.baseline_spread {
        let mut part = format!("baseline spread {:.1} %", spread * 100.0);
        if let Some(p99) = noise.baseline_p99_spread {
            let _ = write!(part, " (p99 {:.1} %)", p99 * 100.0);
        }
        parts.push(part);
    }
    if let Some(steal) = noise.steal_percent {
        parts.push(format!("steal {steal:.1} %"));
    }
    if let Some([low, _, high]) = noise.frequency_mhz {
        if (high - low).abs() < 0.5 {
            parts.push(format!("CPU {} MHz", number(low)));
        } else {
            parts.push(format!("CPU {}{range}{} MHz", number(low), number(high)));
        }
    }
    let meaning = noise.meaning.trim().trim_end_matches('.');
    match (parts.is_empty(), meaning.is_empty()) {
        (true, true) => format!("noise floor {:.0} %", noise.floor * 100.0),
        (true, false) => format!("{meaning}."),
        (false, true) => parts.join(", "),
        (false, false) => format!("{} {dash} {meaning}.", parts.join(", ")),
    }
}

/// What a recommendation whose strategies the measurements cannot tell apart says of it,
/// when its reason does not say so already (a report of an older agent): `time-slicing,
/// mps and mps-limited within the noise of each other: picked by isolation`; `None` for a recommendation by
/// the figures.
pub fn tie_text(recommendation: &BenchRecommendation) -> Option<String> {
    let tied = &recommendation.indistinguishable;
    if tied.len() < 2 {
        return None;
    }
    let reason = recommendation.reason.to_lowercase();
    if reason.contains("indistinguishable")
        || reason.contains("cannot tell")
        || reason.contains("within the noise of each other")
    {
        return None;
    }
    let names = match tied.split_last() {
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    };
    // The one wording of a difference the measurements cannot tell (issue 37).
    Some(format!("{names} within the noise of each other: picked by isolation"))
}
