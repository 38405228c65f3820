//! A bench report as one self-contained HTML5 page (`gpushare-ctl bench --report
//! FILE.html`): no network, no script, no external style or font. This module owns the
//! page: its head and style, its order, the header and "How it was measured"; its rooms:
//!
//! - [`text`]: the report's words, shared with the text report and the progress lines
//!   (figures, durations, pinning, the host's noise, ties, the answer);
//! - [`markup`]: escaping and the strategies' colours (a leaf: HTML and SVG alike);
//! - [`sections`]: the page's tables and lists: the runs per strategy, the
//!   recommendations, capacity and cost, the measurements in the order taken, the
//!   replicas and their logs;
//! - [`charts`]: what the two charts plot: aggregate throughput, and p99 (solid) and p50
//!   (dashed) latency, against the replica count, with the baseline (and a p99 SLO) as
//!   dashed references and each run's interval as an error bar;
//! - [`svg`]: drawing a line chart as inline SVG.
//!
//! Every string taken from the report (command lines, setups, reasons, logs) is escaped:
//! they are user data. A Content-Security-Policy forbids scripts and fetches besides.
//!
//! The modules use the standard library and the proto documents only, so that the
//! integration test that opens the page in a browser can build them on their own
//! (`#[path]`); their unit tests are in `report_html_tests.rs` for the same reason.

pub mod charts;
pub mod markup;
pub mod sections;
pub mod svg;
pub mod text;

use std::fmt::Write as _;

use gpushare_proto::bench::BenchReport;
use gpushare_proto::plural;

use self::charts::charts;
use self::markup::escape;
use self::sections::{baseline, capacity, logs, recommendations, sequence, tables};
use self::text::{
    answer, command_line, figure, knows_pinning, method, noise_text, noisy_baseline, pinning_text,
    rounds_text, took,
};

// Where the progress lines take it from (`crate::report_html::duration_text`); the
// browser test, which builds this module alone, has none.
#[allow(unused_imports)]
pub use self::text::duration_text;

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
