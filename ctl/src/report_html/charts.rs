//! The page's two charts of a report: aggregate throughput, and p99 (solid) and p50
//! (dashed) latency, against the replica count; a line per measured strategy, the
//! baseline (and a p99 SLO) as references, the runs' intervals as error bars. Drawn by
//! [`super::svg`].

use gpushare_proto::bench::{BenchReport, BenchRun, BenchStrategyRuns, Slo};

use super::markup::color;
use super::svg::{Chart, Reference, Series};
use super::text::figure;

/// The colour of the baseline's reference lines.
const BASELINE_COLOR: &str = "#6b7280";
/// The colour of the SLO's reference line.
const SLO_COLOR: &str = "#d97706";

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
pub(super) fn charts(report: &BenchReport, page: &mut String) {
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
