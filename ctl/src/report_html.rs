//! A bench report as one self-contained HTML5 page (`gpushare-ctl bench --report
//! FILE.html`): no network, no script, no external style or font. Charts are inline SVG
//! drawn here: aggregate throughput against the replica count, one line per strategy, and
//! p99 (solid) and p50 (dashed) latency against the replica count, with the baseline
//! (and a p99 SLO) as dashed references and each run's interval as an error bar; then a
//! table per strategy, the recommendations, capacity and cost, the measurements in the
//! order taken, and each run's replicas with the ends of their stdout and stderr. The
//! header says how the replicas were pinned and how noisy the host was.
//!
//! Every string taken from the report (command lines, setups, reasons, logs) is escaped:
//! they are user data. A Content-Security-Policy forbids scripts and fetches besides.
//!
//! The module uses the standard library and the proto documents only, so that the
//! integration test that opens the page in a browser can build it on its own
//! (`#[path]`); its unit tests are in `report_html_tests.rs` for the same reason.

use std::fmt::Write as _;

use gpushare_proto::bench::{
    BenchNoise, BenchPinning, BenchRecommendation, BenchReport, BenchRun, BenchStrategyRuns, Slo,
};

use gpushare_proto::plural;

/// The page for `report`.
pub fn render(report: &BenchReport) -> String {
    let mut page = String::with_capacity(64 * 1024);
    let title = match answer(report) {
        Some(answer) => format!("gpushare bench: {answer} ({})", command_line(&report.command)),
        None => format!("gpushare bench: {}", command_line(&report.command)),
    };
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        escape(&title)
    );
    // The answer first (issue 37): the recommendation and capacity on the first screen,
    // then how they were found.
    header(report, &mut page);
    recommendations(report, &mut page);
    capacity(report, &mut page);
    meta(report, &mut page);
    charts(report, &mut page);
    tables(report, &mut page);
    sequence(report, &mut page);
    logs(report, &mut page);
    page.push_str("</body>\n</html>\n");
    page
}

/// The page's style: system fonts, nothing fetched.
const STYLE: &str = "
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2rem auto; max-width: 72rem; padding: 0 1rem; color: #1b1f24; background: #fff; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; }
h2 { font-size: 1.25rem; margin-top: 2rem; border-bottom: 1px solid #d0d7de; padding-bottom: .2rem; }
h3 { font-size: 1.05rem; margin: 1.2rem 0 .4rem; }
code, pre { font-family: ui-monospace, 'DejaVu Sans Mono', monospace; font-size: .85rem; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1rem; }
dl.meta dt { font-weight: 600; }
dl.meta dd { margin: 0; }
table { border-collapse: collapse; margin: .4rem 0 1rem; font-size: .9rem; }
th, td { padding: .25rem .6rem; border-bottom: 1px solid #d0d7de; text-align: right; }
th { background: #f6f8fa; }
td.text, th.text { text-align: left; }
td:not(.text) { white-space: nowrap; }
tr.recommended td { background: #eef7ee; }
td.error, p.error { color: #b42318; }
span.note, p.note { color: #9a6700; }
span.interval { color: #57606a; font-size: .85em; white-space: nowrap; }
p.footnote { color: #57606a; font-size: .9rem; }
li.tie em { font-style: normal; color: #57606a; }
p.skipped, p.empty { color: #57606a; font-style: italic; }
.chart { margin: .5rem 0 1.5rem; }
.chart svg { max-width: 100%; height: auto; }
.swatch { display: inline-block; width: .8rem; height: .8rem; border-radius: 2px; margin-right: .3rem; vertical-align: middle; }
details { margin: .3rem 0; }
details > summary { cursor: pointer; }
details.failed > summary { color: #b42318; }
pre { background: #f6f8fa; border: 1px solid #d0d7de; padding: .5rem; overflow-x: auto; white-space: pre-wrap; word-break: break-all; max-height: 24rem; }
";

/// Escapes text for HTML content and quoted attributes.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

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

/// The colour of a strategy in charts and legends.
fn color(strategy: &str, position: usize) -> &'static str {
    const OTHERS: [&str; 4] = ["#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"];
    match strategy {
        "time-slicing" => "#1f77b4",
        "mps" => "#d62728",
        "mps-limited" => "#2ca02c",
        "mig" => "#9467bd",
        _ => OTHERS[position % OTHERS.len()],
    }
}

/// A figure with three significant digits, whole from 100 on (`0.0412`, `2.41`, `412`,
/// `23810`).
fn figure(value: f64) -> String {
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
fn maybe(value: Option<f64>, format: impl Fn(f64) -> String) -> String {
    value.map_or("–".into(), format)
}

/// `2.94×`.
fn times(value: f64) -> String {
    format!("{value:.2}×")
}

/// How the replicas were measured, in words.
fn method(report: &BenchReport) -> String {
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

/// The title, what was benched, and whether the bench ended early.
fn header(report: &BenchReport, page: &mut String) {
    let _ = writeln!(
        page,
        "<h1>gpushare bench</h1>\n<p><code>{}</code> on {} (GPU {})</p>",
        escape(&command_line(&report.command)),
        escape(&report.device),
        report.gpu
    );
    if !report.partial.is_empty() {
        let _ = writeln!(
            page,
            "<p class=\"note\"><strong>Partial:</strong> {}</p>",
            escape(&report.partial)
        );
    }
}

/// What was benched, how: the plan, the baseline, the host's noise, where things went.
fn meta(report: &BenchReport, page: &mut String) {
    page.push_str("<h2 id=\"how\">How it was measured</h2>\n<dl class=\"meta\">\n");
    let mut item = |term: &str, value: String| {
        let _ = writeln!(page, "<dt>{term}</dt><dd>{value}</dd>");
    };
    item("Target", format!("<code>{}</code>", escape(&report.target)));
    item("Measured", escape(&method(report)));
    item("Objective", escape(&report.objective));
    if let Some(slo) = &report.slo {
        item("SLO", escape(slo));
    }
    if report.repeat > 1 {
        item("Rounds", escape(&rounds_text(report.repeat)));
    }
    item("Fleet", plural(report.fleet, "replica"));
    item("Wall time", took(report).replacen("took ", "", 1));
    match &report.pinning {
        Some(pinning) => item("Pinned", escape(&pinning_text(pinning, usize::MAX, "…"))),
        None if knows_pinning(report) => item("Pinned", "no (--no-pin)".into()),
        None => {}
    }
    if !report.plan.is_empty() {
        let lines: Vec<String> = report.plan.iter().map(|l| escape(l)).collect();
        item("Planned", lines.join("<br>"));
    } else if !report.capped.is_empty() {
        item("Note", format!("<span class=\"note\">{}</span>", escape(&report.capped)));
    }
    item("Baseline", baseline(report.baseline.as_ref(), report.rate_unit()));
    if let Some(noise) = &report.noise {
        item("Host noise", escape(&noise_text(noise, figure, "–", "—")));
    }
    if let Some(note) = noisy_baseline(report) {
        item("Note", format!("<span class=\"note\">{}</span>", escape(&note)));
    }
    item("Sharing restored", escape(&report.restored));
    item("Results kept in", format!("<code>{}</code>", escape(&report.saved_to)));
    page.push_str("</dl>\n");
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

/// A length of time as people read it, to the second: `0s`, `42s`, `1m05s`, `6m30s`,
/// `1h02m` (minutes from an hour on); `?` for what is no time. Progress lines, the text
/// report and the page write times so.
pub fn duration_text(seconds: f64) -> String {
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

/// The baseline in a few words.
fn baseline(run: Option<&BenchRun>, rate: &str) -> String {
    let Some(run) = run else { return "none".into() };
    if let Some(error) = &run.error {
        return format!("<span class=\"error\">error: {}</span>", escape(error));
    }
    let mut text = format!(
        "1 replica alone: {}{} {rate}",
        figure(run.throughput_per_s),
        interval(run.throughput_interval)
    );
    if run.repeat_throughputs_per_s.len() > 1 {
        let _ = write!(text, " (the median of {})", measurements(run, rate));
    }
    if let Some(p50) = run.p50_ms {
        let _ = write!(text, ", p50 {} ms", figure(p50));
    }
    if let Some(p99) = run.p99_ms {
        let _ = write!(text, ", p99 {}{} ms", figure(p99), interval(run.p99_interval_ms));
    }
    text
}

/// ` <span class="interval">[1120–1230]</span>`: an interval after its figure; empty
/// without one.
fn interval(bounds: Option<[f64; 2]>) -> String {
    match bounds {
        Some([low, high]) => {
            format!(" <span class=\"interval\">[{}–{}]</span>", figure(low), figure(high))
        }
        None => String::new(),
    }
}

/// `3: 28,300, 31,120, 30,269 units/s`: a repeated run's measurements, in order.
fn measurements(run: &BenchRun, rate: &str) -> String {
    let all: Vec<String> = run.repeat_throughputs_per_s.iter().map(|t| figure(*t)).collect();
    format!("{}: {} {rate}", all.len(), all.join(", "))
}

/// The units/s cell of a run: the figure with its interval, and for a repeated run its
/// spread, with every measurement in the tooltip.
fn throughput_cell(run: &BenchRun, rate: &str) -> String {
    let shown = format!("{}{}", figure(run.throughput_per_s), interval(run.throughput_interval));
    match run.repeat_spread() {
        Some(spread) => format!(
            "{shown} <span class=\"spread\" title=\"the median of {}\">(spread {:.0} %)</span>",
            escape(&measurements(run, rate)),
            spread * 100.0
        ),
        None => shown,
    }
}

/// One line of a chart: a strategy's figure at each replica count it has one for.
struct Series {
    /// Legend text.
    label: String,
    /// Stroke and marker colour.
    color: &'static str,
    /// Dashed line and hollow markers.
    dashed: bool,
    /// `(N, figure)`; `None` breaks the line.
    points: Vec<(f64, Option<f64>)>,
    /// `(N, [low, high])`: the figures' intervals, drawn as error bars.
    bars: Vec<(f64, [f64; 2])>,
    /// The unit in marker tooltips (`units/s`).
    unit: &'static str,
}

/// A horizontal reference line, dashed.
struct Reference {
    /// Its height.
    y: f64,
    /// The text on the line.
    label: String,
    /// The text in the legend.
    legend: String,
    /// Its colour.
    color: &'static str,
}

/// The colour of the baseline's reference lines.
const BASELINE_COLOR: &str = "#6b7280";
/// The colour of the SLO's reference line.
const SLO_COLOR: &str = "#d97706";

/// A line chart of figures against the replica count.
struct Chart {
    /// Accessible name.
    title: String,
    /// The vertical axis's title.
    y_label: &'static str,
    series: Vec<Series>,
    references: Vec<Reference>,
}

/// Chart geometry, in SVG units.
const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 400.0;
const LEFT: f64 = 78.0;
const RIGHT: f64 = 210.0;
const TOP: f64 = 20.0;
const BOTTOM: f64 = 56.0;

/// Round tick steps: 1, 2, 2.5 or 5 times a power of ten, about `span / 5`.
pub(crate) fn tick_step(span: f64) -> f64 {
    let raw = (span / 5.0).max(f64::MIN_POSITIVE);
    let power = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].into_iter().find(|m| m * power >= raw).unwrap_or(10.0);
    step * power
}

/// A tick label: `0`, `2.5`, `1200`, `15k`, `2.5M`.
fn tick_label(value: f64) -> String {
    let magnitude = value.abs();
    let compact = |scaled: f64, suffix: &str| {
        let text = format!("{scaled:.1}");
        format!("{}{suffix}", text.trim_end_matches('0').trim_end_matches('.'))
    };
    if magnitude >= 1e6 {
        compact(value / 1e6, "M")
    } else if magnitude >= 1e4 {
        compact(value / 1e3, "k")
    } else if magnitude >= 1.0 || magnitude == 0.0 {
        compact(value, "")
    } else {
        figure(value)
    }
}

impl Chart {
    /// The SVG, or a line saying there is nothing to draw.
    fn svg(&self) -> String {
        let xs: Vec<f64> = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
        let ys: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().filter_map(|p| p.1))
            .chain(self.series.iter().flat_map(|s| s.bars.iter().map(|b| b.1[1])))
            .chain(self.references.iter().map(|r| r.y))
            .filter(|y| y.is_finite())
            .collect();
        let drawn = self.series.iter().any(|s| s.points.iter().any(|p| p.1.is_some()));
        if !drawn {
            return "<p class=\"empty\">No figures to chart: no run measured any.</p>\n".into();
        }
        let x_max = xs.iter().copied().fold(1.0, f64::max);
        let y_top = ys.iter().copied().fold(0.0, f64::max);
        let step = tick_step(if y_top > 0.0 { y_top } else { 1.0 });
        let y_max = ((y_top * 1.05) / step).ceil().max(1.0) * step;
        let x_hi = x_max + (x_max * 0.06).max(0.5);
        let (plot_w, plot_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
        let px = |x: f64| LEFT + x / x_hi * plot_w;
        let py = |y: f64| TOP + plot_h - (y.clamp(0.0, y_max) / y_max) * plot_h;

        let mut svg = String::new();
        let _ = write!(
            svg,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" role=\"img\" font-family=\"system-ui, sans-serif\" font-size=\"12\">\n<title>{}</title>\n",
            escape(&self.title)
        );
        // Grid and vertical axis ticks.
        let mut y = 0.0;
        while y <= y_max + step / 2.0 {
            let at = py(y);
            let _ = writeln!(
                svg,
                "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{at:.1}\" y2=\"{at:.1}\" stroke=\"#e5e7eb\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#374151\">{}</text>",
                LEFT + plot_w,
                LEFT - 8.0,
                at + 4.0,
                tick_label(y)
            );
            y += step;
        }
        // Horizontal axis ticks: every replica count measured.
        let mut counts: Vec<f64> = xs.clone();
        counts.sort_by(f64::total_cmp);
        counts.dedup();
        for n in &counts {
            let at = px(*n);
            let _ = writeln!(
                svg,
                "<line x1=\"{at:.1}\" x2=\"{at:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#374151\"/>\
                 <text x=\"{at:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#374151\">{n}</text>",
                TOP + plot_h,
                TOP + plot_h + 5.0,
                TOP + plot_h + 19.0
            );
        }
        // Axes and their titles.
        let _ = write!(
            svg,
            "<line x1=\"{LEFT}\" x2=\"{LEFT}\" y1=\"{TOP}\" y2=\"{:.1}\" stroke=\"#374151\"/>\
             <line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#374151\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#111827\">replicas (N)</text>\n\
             <text transform=\"translate(18 {:.1}) rotate(-90)\" text-anchor=\"middle\" fill=\"#111827\">{}</text>\n",
            TOP + plot_h,
            LEFT + plot_w,
            TOP + plot_h,
            TOP + plot_h,
            LEFT + plot_w / 2.0,
            HEIGHT - 14.0,
            TOP + plot_h / 2.0,
            escape(self.y_label)
        );
        // References, under the lines.
        for r in &self.references {
            let at = py(r.y);
            let _ = writeln!(
                svg,
                "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{at:.1}\" y2=\"{at:.1}\" stroke=\"{}\" stroke-width=\"1.5\" stroke-dasharray=\"3 4\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"{}\">{}</text>",
                LEFT + plot_w,
                r.color,
                LEFT + plot_w - 4.0,
                at - 5.0,
                r.color,
                escape(&r.label)
            );
        }
        // Error bars, under the lines: a vertical line from low to high, capped.
        for s in &self.series {
            for (n, [low, high]) in &s.bars {
                if !(low.is_finite() && high.is_finite()) {
                    continue;
                }
                let (x, top, bottom) = (px(*n), py(*high), py(*low));
                let tip = format!(
                    "{}, N={n}: interval {}–{} {}",
                    s.label,
                    figure(*low),
                    figure(*high),
                    s.unit
                );
                let _ = writeln!(
                    svg,
                    "<g class=\"interval\" stroke=\"{}\" stroke-width=\"1.5\"><title>{}</title>\
                     <line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{top:.1}\" y2=\"{bottom:.1}\"/>\
                     <line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{top:.1}\" y2=\"{top:.1}\"/>\
                     <line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{bottom:.1}\" y2=\"{bottom:.1}\"/></g>",
                    s.color,
                    escape(&tip),
                    x - 5.0,
                    x + 5.0,
                    x - 5.0,
                    x + 5.0
                );
            }
        }
        // The series: a polyline per unbroken stretch, and a marker per figure.
        for s in &self.series {
            let dash = if s.dashed { " stroke-dasharray=\"8 5\"" } else { "" };
            let mut stretch: Vec<String> = Vec::new();
            let flush = |stretch: &mut Vec<String>, svg: &mut String| {
                if stretch.len() > 1 {
                    let _ = writeln!(
                        svg,
                        "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2.5\"{dash} points=\"{}\"/>",
                        s.color,
                        stretch.join(" ")
                    );
                }
                stretch.clear();
            };
            for (n, value) in &s.points {
                match value {
                    Some(v) if v.is_finite() => {
                        stretch.push(format!("{:.1},{:.1}", px(*n), py(*v)))
                    }
                    _ => flush(&mut stretch, &mut svg),
                }
            }
            flush(&mut stretch, &mut svg);
            for (n, value) in &s.points {
                let Some(v) = value.filter(|v| v.is_finite()) else { continue };
                let tip = format!("{}, N={n}: {} {}", s.label, figure(v), s.unit);
                let (x, y) = (px(*n), py(v));
                let shape = if s.dashed {
                    format!(
                        "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"8\" height=\"8\" fill=\"#fff\" stroke=\"{}\" stroke-width=\"2\">",
                        x - 4.0,
                        y - 4.0,
                        s.color
                    )
                } else {
                    format!("<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"4.5\" fill=\"{}\">", s.color)
                };
                let close = if s.dashed { "</rect>" } else { "</circle>" };
                let _ = writeln!(svg, "{shape}<title>{}</title>{close}", escape(&tip));
            }
        }
        // The legend, right of the plot.
        let legend_x = LEFT + plot_w + 20.0;
        for (i, s) in self.series.iter().enumerate() {
            let y = TOP + 10.0 + i as f64 * 22.0;
            let dash = if s.dashed { " stroke-dasharray=\"6 4\"" } else { "" };
            let _ = writeln!(
                svg,
                "<line x1=\"{legend_x:.1}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"{}\" stroke-width=\"2.5\"{dash}/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#111827\">{}</text>",
                legend_x + 28.0,
                s.color,
                legend_x + 36.0,
                y + 4.0,
                escape(&s.label)
            );
        }
        for (i, r) in self.references.iter().enumerate() {
            let y = TOP + 10.0 + (self.series.len() + i) as f64 * 22.0;
            let _ = writeln!(
                svg,
                "<line x1=\"{legend_x:.1}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"{}\" stroke-width=\"1.5\" stroke-dasharray=\"3 4\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#111827\">{}</text>",
                legend_x + 28.0,
                r.color,
                legend_x + 36.0,
                y + 4.0,
                escape(&r.legend)
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}

/// The strategies that have runs, with their colour.
fn measured(report: &BenchReport) -> impl Iterator<Item = (&BenchStrategyRuns, &'static str)> {
    report
        .strategies
        .iter()
        .enumerate()
        .filter(|(_, s)| s.skipped.is_none() && !s.runs.is_empty())
        .map(|(i, s)| (s, color(&s.strategy, i)))
}

/// A run's figure, `None` for a run without figures.
fn figure_of(run: &BenchRun, pick: impl Fn(&BenchRun) -> Option<f64>) -> Option<f64> {
    if run.error.is_some() { None } else { pick(run) }
}

/// The two charts.
fn charts(report: &BenchReport, page: &mut String) {
    let ok_baseline = report.baseline.as_ref().filter(|b| b.error.is_none());
    let throughput = Chart {
        title: "Aggregate throughput against replicas per GPU".into(),
        y_label: match report.rate_unit() {
            "runs/s" => "runs/s, all replicas",
            _ => "units/s, all replicas",
        },
        series: measured(report)
            .map(|(s, color)| Series {
                label: s.strategy.clone(),
                color,
                dashed: false,
                points: s
                    .runs
                    .iter()
                    .map(|r| (f64::from(r.replicas), figure_of(r, |r| Some(r.throughput_per_s))))
                    .collect(),
                bars: bars(&s.runs, |r| r.throughput_interval),
                unit: report.rate_unit(),
            })
            .collect(),
        references: ok_baseline
            .filter(|b| b.throughput_per_s > 0.0)
            .map(|b| Reference {
                y: b.throughput_per_s,
                label: format!("1 alone: {} {}", figure(b.throughput_per_s), report.rate_unit()),
                legend: "baseline (1 alone)".into(),
                color: BASELINE_COLOR,
            })
            .into_iter()
            .collect(),
    };
    let mut latency_series = Vec::new();
    for (s, color) in measured(report) {
        let points = |pick: fn(&BenchRun) -> Option<f64>| -> Vec<(f64, Option<f64>)> {
            s.runs.iter().map(|r| (f64::from(r.replicas), figure_of(r, pick))).collect()
        };
        latency_series.push(Series {
            label: format!("{} p99", s.strategy),
            color,
            dashed: false,
            points: points(|r| r.p99_ms),
            bars: bars(&s.runs, |r| r.p99_interval_ms),
            unit: "ms",
        });
        latency_series.push(Series {
            label: format!("{} p50", s.strategy),
            color,
            dashed: true,
            points: points(|r| r.p50_ms),
            bars: Vec::new(),
            unit: "ms",
        });
    }
    let latency = Chart {
        title: "Latency (p99 solid, p50 dashed) against replicas per GPU".into(),
        y_label: "latency, ms",
        series: latency_series,
        references: ok_baseline
            .and_then(|b| b.p99_ms)
            .map(|p99| Reference {
                y: p99,
                label: format!("1 alone: p99 {} ms", figure(p99)),
                legend: "baseline p99 (1 alone)".into(),
                color: BASELINE_COLOR,
            })
            .into_iter()
            .chain(slo_reference(report))
            .collect(),
    };
    let caption = |chart: &Chart| {
        let drawn = chart.series.iter().any(|s| !s.bars.is_empty());
        if drawn && !report.intervals.is_empty() {
            // Said once, under the runs' tables; here a link to it.
            "<p class=\"footnote\">Error bars: the runs' intervals (how they were found: under Runs).</p>\n".to_owned()
        } else {
            String::new()
        }
    };
    page.push_str("<h2 id=\"throughput\">Throughput</h2>\n<div class=\"chart\">\n");
    page.push_str(&throughput.svg());
    page.push_str(&caption(&throughput));
    page.push_str("</div>\n<h2 id=\"latency\">Latency</h2>\n<div class=\"chart\">\n");
    page.push_str(&latency.svg());
    page.push_str(&caption(&latency));
    page.push_str("</div>\n");
}

/// The intervals of the runs with figures that have one.
fn bars(runs: &[BenchRun], pick: fn(&BenchRun) -> Option<[f64; 2]>) -> Vec<(f64, [f64; 2])> {
    runs.iter()
        .filter(|r| r.error.is_none())
        .filter_map(|r| Some((f64::from(r.replicas), pick(r)?)))
        .collect()
}

/// A p99 SLO as a line on the latency chart.
fn slo_reference(report: &BenchReport) -> Option<Reference> {
    match report.slo.as_deref()?.parse::<Slo>().ok()? {
        Slo::P99Ms(ms) => Some(Reference {
            y: ms,
            label: format!("SLO: p99 {ms} ms"),
            legend: "SLO (p99)".into(),
            color: SLO_COLOR,
        }),
        Slo::Slowdown(_) => None,
    }
}

/// A table per strategy, or why it has none.
fn tables(report: &BenchReport, page: &mut String) {
    page.push_str("<h2 id=\"runs\">Runs</h2>\n");
    if report.strategies.is_empty() {
        page.push_str("<p class=\"empty\">No strategy was run.</p>\n");
    }
    for (i, s) in report.strategies.iter().enumerate() {
        let _ = writeln!(
            page,
            "<h3><span class=\"swatch\" style=\"background:{}\"></span>{}</h3>",
            color(&s.strategy, i),
            escape(&s.strategy)
        );
        if let Some(why) = &s.skipped {
            let _ = writeln!(page, "<p class=\"skipped\">Skipped: {}</p>", escape(why));
            continue;
        }
        if s.runs.is_empty() {
            page.push_str("<p class=\"empty\">No runs.</p>\n");
            continue;
        }
        let _ = write!(
            page,
            "<table>\n<thead><tr><th>N</th><th>{}</th><th>scaling</th><th>p50 ms</th>\
             <th>p99 ms</th><th>p99 ×</th><th>fairness</th><th>max slowdown</th><th>failed</th>\
             <th class=\"text\">setup</th></tr></thead>\n<tbody>\n",
            report.rate_unit()
        );
        for run in &s.runs {
            let recommended = report
                .recommendations
                .iter()
                .any(|r| r.replicas == run.replicas && r.strategy == s.strategy);
            let class = if recommended { " class=\"recommended\"" } else { "" };
            if let Some(error) = &run.error {
                let _ = writeln!(
                    page,
                    "<tr><td>{}</td><td class=\"text error\" colspan=\"9\">error: {}</td></tr>",
                    run.replicas,
                    escape(error)
                );
                continue;
            }
            let tied = report.recommendations.iter().any(|r| {
                r.replicas == run.replicas
                    && r.strategy == s.strategy
                    && r.indistinguishable.len() > 1
            });
            let mark = match (recommended, tied) {
                (true, true) => " (recommended, by isolation)",
                (true, false) => " (recommended)",
                _ => "",
            };
            let _ = writeln!(
                page,
                "<tr{class}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td><td>{}</td><td class=\"text\">{}{mark}</td></tr>",
                run.replicas,
                throughput_cell(run, report.rate_unit()),
                scaling_cell(run),
                maybe(run.p50_ms, figure),
                maybe(run.p99_ms, |p99| format!(
                    "{}{}",
                    figure(p99),
                    interval(run.p99_interval_ms)
                )),
                maybe(run.p99_inflation, times),
                maybe(run.jain_fairness, |x| format!("{x:.3}")),
                maybe(run.max_slowdown, times),
                run.failed,
                escape(&run.setup)
            );
        }
        page.push_str("</tbody>\n</table>\n");
        for run in s.runs.iter().filter(|r| r.error.is_none()) {
            if let Some(warning) = &run.scaling_warning {
                let _ =
                    writeln!(page, "<p class=\"note\">N={}: {}</p>", run.replicas, escape(warning));
            }
        }
    }
    let any_interval = report
        .strategies
        .iter()
        .flat_map(|s| &s.runs)
        .chain(report.baseline.as_ref())
        .any(|r| r.throughput_interval.is_some() || r.p99_interval_ms.is_some());
    if any_interval && !report.intervals.is_empty() {
        let _ = writeln!(
            page,
            "<p class=\"footnote\" id=\"intervals\">Intervals [low–high]: {}.</p>",
            escape(report.intervals.trim_end_matches('.'))
        );
    }
}

/// The scaling cell of a run: above N it is marked (`2.10×!`), the warning in its tooltip.
fn scaling_cell(run: &BenchRun) -> String {
    let shown = maybe(run.scaling, times);
    match &run.scaling_warning {
        Some(warning) => {
            format!("<span class=\"note\" title=\"{}\">{shown}!</span>", escape(warning))
        }
        None => shown,
    }
}

/// The strategy the objective picks at each replica count.
fn recommendations(report: &BenchReport, page: &mut String) {
    let _ = writeln!(
        page,
        "<h2 id=\"recommendation\">Recommendation (objective: {})</h2>",
        escape(&report.objective)
    );
    if report.recommendations.is_empty() {
        page.push_str("<p class=\"empty\">None: no strategy measured at any replica count.</p>\n");
        return;
    }
    page.push_str("<ul>\n");
    for r in &report.recommendations {
        let (class, tie) = match tie_text(r) {
            Some(tie) => (" class=\"tie\"", format!("<em>{}</em>; ", escape(&tie))),
            None if r.indistinguishable.len() > 1 => (" class=\"tie\"", String::new()),
            None => ("", String::new()),
        };
        let _ = writeln!(
            page,
            "<li{class}><strong>N={}: {}</strong> — {tie}{}</li>",
            r.replicas,
            escape(&r.strategy),
            escape(&r.reason)
        );
    }
    page.push_str("</ul>\n");
}

/// Replicas per GPU under the SLO, and the GPUs a fleet needs.
fn capacity(report: &BenchReport, page: &mut String) {
    page.push_str("<h2 id=\"capacity\">Capacity &amp; cost</h2>\n");
    if report.capacity.is_empty() {
        page.push_str("<p class=\"empty\">No SLO was given (<code>--slo p99=50ms</code> or <code>--slo slowdown=2</code>): no capacity figures.</p>\n");
        return;
    }
    let _ = writeln!(
        page,
        "<p>At {} for a fleet of {}:</p>\n<table>\n<thead><tr><th class=\"text\">strategy</th>\
         <th>replicas per GPU</th><th>GPUs needed</th><th>saving</th><th class=\"text\">why</th></tr></thead>\n<tbody>",
        escape(report.slo.as_deref().unwrap_or("the SLO")),
        plural(report.fleet, "replica")
    );
    for c in &report.capacity {
        let per_gpu =
            if c.replicas_per_gpu == 0 { "none".into() } else { c.replicas_per_gpu.to_string() };
        let _ = writeln!(
            page,
            "<tr><td class=\"text\">{}</td><td>{per_gpu}</td><td>{}</td><td>{:.0} %</td><td class=\"text\">{}</td></tr>",
            escape(&c.strategy),
            c.gpus_needed,
            c.saving * 100.0,
            escape(&c.reason)
        );
    }
    page.push_str("</tbody>\n</table>\n");
}

/// Every measurement in the order taken (rounds interleave the strategies and replica
/// counts), folded away.
fn sequence(report: &BenchReport, page: &mut String) {
    if report.sequence.is_empty() {
        return;
    }
    let rate = report.rate_unit();
    let _ = write!(
        page,
        "<h2 id=\"sequence\">Measurements in the order taken</h2>\n<details><summary>{}</summary>\n\
         <table>\n<thead><tr><th>round</th><th class=\"text\">strategy</th><th>N</th>\
         <th>started at</th><th>{rate}</th><th>p99 ms</th><th>worst replica's p99 ms</th>\
         <th class=\"text\">failed</th></tr></thead>\n<tbody>\n",
        plural(report.sequence.len() as u64, "measurement")
    );
    for m in &report.sequence {
        let _ = writeln!(
            page,
            "<tr><td>{}</td><td class=\"text\">{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td class=\"text error\">{}</td></tr>",
            m.round,
            escape(&m.strategy),
            m.replicas,
            duration_text(m.at_seconds),
            figure(m.throughput_per_s),
            maybe(m.p99_ms, figure),
            maybe(m.worst_p99_ms, figure),
            if m.failed { "failed" } else { "" }
        );
    }
    page.push_str("</tbody>\n</table>\n</details>\n");
}

/// Every run's replicas, with the ends of their output; failed ones open.
fn logs(report: &BenchReport, page: &mut String) {
    page.push_str("<h2 id=\"logs\">Replicas and their logs</h2>\n");
    let baseline = report.baseline.iter().map(|run| ("baseline".to_owned(), run));
    let runs = report.strategies.iter().flat_map(|s| {
        s.runs.iter().map(move |run| (format!("{}, N={}", s.strategy, run.replicas), run))
    });
    let mut any = false;
    for (label, run) in baseline.chain(runs) {
        any = true;
        let failed = run.per_replica.iter().filter(|r| r.failed).count();
        let open = if failed > 0 { " open class=\"failed\"" } else { "" };
        let state = match (&run.error, failed) {
            (Some(error), _) => format!("error: {}", escape(error)),
            (None, 0) => plural(run.per_replica.len() as u64, "replica"),
            (None, n) => format!("{}, {n} failed", plural(run.per_replica.len() as u64, "replica")),
        };
        let _ = writeln!(
            page,
            "<details{open}><summary>{} — {state} ({})</summary>",
            escape(&label),
            escape(&run.setup)
        );
        if !run.per_replica.is_empty() {
            let rate = report.rate_unit();
            let units = rate.trim_end_matches("/s");
            let _ = write!(
                page,
                "<table>\n<thead><tr><th>replica</th><th>pid</th><th class=\"text\">device</th>\
                 <th class=\"text\">outcome</th><th>seconds</th><th>{units}</th><th>{rate}</th>\
                 <th>p50 ms</th><th>p99 ms</th><th>slowdown</th><th>GPU memory</th>\
                 <th>malformed lines</th></tr></thead>\n<tbody>\n",
            );
            for r in &run.per_replica {
                let class = if r.failed { " class=\"error\"" } else { "" };
                let _ = writeln!(
                    page,
                    "<tr><td>{}</td><td>{}</td><td class=\"text\">{}</td><td class=\"text\"><span{class}>{}</span></td>\
                     <td>{:.1}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    r.index,
                    r.pid,
                    escape(&r.device),
                    escape(&r.outcome),
                    r.seconds,
                    r.units,
                    figure(r.throughput_per_s),
                    maybe(r.p50_ms, figure),
                    maybe(r.p99_ms, figure),
                    maybe(r.slowdown, times),
                    r.gpu_memory_bytes.map_or("–".into(), |b| format!(
                        "{:.1} GiB",
                        b as f64 / (1u64 << 30) as f64
                    )),
                    r.malformed_lines
                );
            }
            page.push_str("</tbody>\n</table>\n");
        }
        for r in &run.per_replica {
            let open = if r.failed { " open class=\"failed\"" } else { "" };
            let _ = writeln!(
                page,
                "<details{open}><summary>replica {} (pid {}): {}</summary>",
                r.index,
                r.pid,
                escape(&r.outcome)
            );
            for (stream, tail) in [("stdout", &r.stdout_tail), ("stderr", &r.stderr_tail)] {
                if tail.is_empty() {
                    let _ = writeln!(page, "<p class=\"empty\">Nothing on {stream}.</p>");
                } else {
                    let _ = writeln!(page, "<h4>{stream} (end)</h4>\n<pre>{}</pre>", escape(tail));
                }
            }
            page.push_str("</details>\n");
        }
        page.push_str("</details>\n");
    }
    if !any {
        page.push_str("<p class=\"empty\">No runs.</p>\n");
    }
}
