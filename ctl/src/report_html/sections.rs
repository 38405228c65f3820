//! The page's tables and lists below the charts, and the cells they share with the
//! header: the runs of each strategy, the recommendations, capacity and cost, the
//! measurements in the order taken, and every run's replicas with the ends of their
//! stdout and stderr.

use std::fmt::Write as _;

use gpushare_proto::bench::{BenchReport, BenchRun};
use gpushare_proto::plural;

use super::markup::{color, escape};
use super::text::{duration_text, figure, maybe, tie_text, times};

/// The baseline in a few words.
pub(super) fn baseline(run: Option<&BenchRun>, rate: &str) -> String {
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

/// A table per strategy, or why it has none.
pub(super) fn tables(report: &BenchReport, page: &mut String) {
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
pub(super) fn recommendations(report: &BenchReport, page: &mut String) {
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
pub(super) fn capacity(report: &BenchReport, page: &mut String) {
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
pub(super) fn sequence(report: &BenchReport, page: &mut String) {
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
pub(super) fn logs(report: &BenchReport, page: &mut String) {
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
