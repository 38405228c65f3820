//! Unit tests of [`crate::report_html`] (kept out of that file, which the browser test
//! includes on its own).

use gpushare_proto::bench::BenchReport;

use crate::commands::bench::tests::{older_report, sample_report};
use crate::report_html::markup::escape;
use crate::report_html::render;
use crate::report_html::text::command_line;

/// The text between the `n`th `<svg` and its `</svg>`.
fn svg(page: &str, n: usize) -> &str {
    let start = page.match_indices("<svg").nth(n).expect("an svg").0;
    let end = start + page[start..].find("</svg>").expect("closed");
    &page[start..end]
}

#[test]
fn escapes_the_five_characters() {
    assert_eq!(
        escape(r#"<a href="x">Tom & 'Jerry'</a>"#),
        "&lt;a href=&quot;x&quot;&gt;Tom &amp; &#39;Jerry&#39;&lt;/a&gt;"
    );
    assert_eq!(escape("plain"), "plain");
}

#[test]
fn command_lines_are_quoted_like_a_shell() {
    let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        command_line(&words(&["./serve", "--port=8000", "a/b.py"])),
        "./serve --port=8000 a/b.py"
    );
    assert_eq!(command_line(&words(&["echo", "a b", "it's", ""])), "echo 'a b' 'it'\\''s' ''");
}

#[test]
fn one_self_contained_page() {
    let page = render(&sample_report());
    assert!(page.starts_with("<!DOCTYPE html>\n<html lang=\"en\">"), "{page}");
    assert!(page.ends_with("</body>\n</html>\n"));
    assert_eq!(page.matches("<html").count(), 1);
    assert!(page.contains("<meta charset=\"utf-8\">"));
    assert!(page.contains("Content-Security-Policy\" content=\"default-src 'none'"));
    // Nothing fetched, nothing run.
    for fetch in ["<script", "<link", "src=", "href=", "@import", "url(", "https:"] {
        assert!(!page.contains(fetch), "{fetch} in the page");
    }
    // The only `http:` is the SVG namespace.
    assert_eq!(
        page.matches("http:").count(),
        page.matches("xmlns=\"http://www.w3.org/2000/svg\"").count()
    );
    for section in [
        "id=\"throughput\"",
        "id=\"latency\"",
        "id=\"runs\"",
        "id=\"recommendation\"",
        "id=\"capacity\"",
        "id=\"logs\"",
    ] {
        assert_eq!(page.matches(section).count(), 1, "{section}");
    }
    assert_eq!(page.matches("<svg").count(), 2);
    assert_eq!(page.matches("</svg>").count(), 2);
    assert_eq!(page.matches("<details").count(), page.matches("</details>").count());
    assert_eq!(page.matches("<table").count(), page.matches("</table>").count());
}

#[test]
fn user_data_stays_text() {
    let page = render(&sample_report());
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "the log is shown");
    assert!(!page.contains("<script>alert"));
    assert!(page.contains("<code>./serve --model &#39;small files&#39;</code>"));

    let hostile = "<img src=x onerror=alert(1)>\"'&";
    let mut r = sample_report();
    r.device = hostile.into();
    r.target = hostile.into();
    r.command = vec![hostile.into()];
    r.objective = hostile.into();
    r.slo = Some(hostile.into());
    r.restored = hostile.into();
    r.saved_to = hostile.into();
    r.strategies[0].strategy = hostile.into();
    r.strategies[1].runs[0].setup = hostile.into();
    r.strategies[1].runs[0].per_replica[0].outcome = hostile.into();
    r.strategies[1].runs[0].per_replica[0].device = hostile.into();
    r.strategies[1].runs[0].per_replica[0].stdout_tail = hostile.into();
    r.strategies[2].runs[2].error = Some(hostile.into());
    r.strategies[3].skipped = Some(hostile.into());
    r.recommendations[0].reason = hostile.into();
    r.recommendations[0].strategy = hostile.into();
    r.capacity[0].reason = hostile.into();
    r.capacity[0].strategy = hostile.into();
    let page = render(&r);
    assert!(!page.contains("<img"), "{page}");
    assert!(!page.contains("\"'&\""));
    assert!(page.matches("&lt;img src=x onerror=alert(1)&gt;&quot;&#39;&amp;").count() >= 18);
}

#[test]
fn charts_have_a_line_per_measured_strategy_with_axes_and_legend() {
    let page = render(&sample_report());
    let throughput = svg(&page, 0);
    // Three strategies measured; mig skipped draws nothing.
    for (name, color) in
        [("time-slicing", "#1f77b4"), ("mps", "#d62728"), ("mps-limited", "#2ca02c")]
    {
        assert!(
            throughput.contains(&format!("stroke=\"{color}\" stroke-width=\"2.5\" points=")),
            "{name}"
        );
        assert!(throughput.contains(&format!("\">{name}</text>")), "legend of {name}");
    }
    assert!(!throughput.contains("#9467bd"), "mig is skipped");
    assert_eq!(throughput.matches("<polyline").count(), 3);
    // mps-limited's N=5 could not be set up: two markers, not three.
    assert_eq!(throughput.matches("fill=\"#2ca02c\"").count(), 2);
    assert!(throughput.contains("<title>mps, N=3: 1180 units/s</title>"), "{throughput}");
    assert!(
        throughput.contains(">replicas (N)</text>")
            && throughput.contains(">units/s, all replicas</text>")
    );
    // Ticks at each N measured, and the baseline as a dashed reference.
    for n in ["1", "3", "5"] {
        assert!(
            throughput.contains(&format!("text-anchor=\"middle\" fill=\"#374151\">{n}</text>")),
            "tick {n}"
        );
    }
    assert!(throughput.contains(">1 alone: 402 units/s</text>"));
    assert!(throughput.contains("stroke-dasharray=\"3 4\""));

    let latency = svg(&page, 1);
    assert!(latency.contains(">mps p99</text>") && latency.contains(">mps p50</text>"));
    // p50 dashed, p99 solid: time-slicing and mps have both lines; mps-limited has a p99
    // line over N=1,3 and a lone p50 marker at N=1.
    assert_eq!(latency.matches("stroke-dasharray=\"8 5\" points=").count(), 2);
    assert_eq!(latency.matches("stroke-width=\"2.5\" points=").count(), 3);
    assert_eq!(latency.matches("<rect").count(), 3 + 3 + 1);
    assert!(latency.contains(">1 alone: p99 3.10 ms</text>"));
    // The p99 SLO as a reference too; a slowdown SLO has no line there.
    assert!(latency.contains(">SLO: p99 50 ms</text>") && latency.contains(">SLO (p99)</text>"));
    let mut r = sample_report();
    r.slo = Some("slowdown=2".into());
    assert!(!svg(&render(&r), 1).contains("SLO"));
}

#[test]
fn tables_mark_errors_skips_and_recommendations() {
    let page = render(&sample_report());
    assert!(page.contains("<p class=\"skipped\">Skipped: manage_mig = false</p>"));
    assert!(page.contains("<td class=\"text error\" colspan=\"9\">error: cannot give 5 clients 20 % threads: the MPS server refused</td>"));
    assert_eq!(page.matches("<tr class=\"recommended\">").count(), 3);
    assert!(
        page.contains("<td>3</td><td>1100</td><td>2.74×</td><td>–</td><td>4.40</td>"),
        "a missing p50 is a dash"
    );
    // Intervals beside their figures.
    assert!(
        page.contains(
            "<td>3</td><td>1180 <span class=\"interval\">[1120–1230]</span></td><td>2.93×</td>\
             <td>2.52</td><td>3.40 <span class=\"interval\">[3.10–3.60]</span></td>"
        ),
        "{page}"
    );
    assert!(
        page.contains("<td>mps</td><td>3</td><td>34</td><td>66 %</td>")
            || page.contains("<td class=\"text\">mps</td><td>3</td><td>34</td><td>66 %</td>")
    );
    // The failed replica's log is open, others closed.
    assert!(page.contains(
        "<details open class=\"failed\"><summary>replica 3 (pid 4203): exit 3</summary>"
    ));
    assert!(page.contains("<details><summary>replica 0 (pid 4200): stopped</summary>"));
    assert!(page.contains("<details open class=\"failed\"><summary>mps, N=5 — 5 replicas, 1 failed (5 clients)</summary>"));
}

/// A bench where every strategy was skipped or failed: no figures anywhere.
fn nothing_measured() -> BenchReport {
    let mut r = sample_report();
    r.baseline.as_mut().unwrap().error = Some("the replica exited at once".into());
    r.recommendations.clear();
    r.capacity.clear();
    r.slo = None;
    for s in &mut r.strategies {
        for run in &mut s.runs {
            run.error = Some("all replicas failed".into());
            for replica in &mut run.per_replica {
                replica.failed = true;
                replica.outcome = "exit 1".into();
            }
        }
    }
    r
}

#[test]
fn a_bench_without_figures_still_renders() {
    let page = render(&nothing_measured());
    assert_eq!(page.matches("<svg").count(), 0);
    assert_eq!(page.matches("No figures to chart").count(), 2);
    assert!(page.contains("error: the replica exited at once"));
    assert!(page.contains("None: no strategy measured at any replica count."));
    assert!(page.contains("No SLO was given"));
    let mut r = nothing_measured();
    r.strategies.clear();
    r.baseline = None;
    let page = render(&r);
    assert!(
        page.contains("No strategy was run.") && page.contains("<p class=\"empty\">No runs.</p>")
    );
}

#[test]
fn tick_steps_are_round() {
    use crate::report_html::svg::tick_step;
    assert_eq!(tick_step(1000.0), 200.0);
    assert_eq!(tick_step(7.0), 2.0);
    assert_eq!(tick_step(12.0), 2.5);
    assert_eq!(tick_step(0.3), 0.1);
    assert_eq!(tick_step(50.0), 10.0);
}

#[test]
fn repeated_runs_show_their_median_and_spread() {
    let mut r = sample_report();
    r.repeat = 3;
    r.baseline.as_mut().unwrap().repeat_throughputs_per_s = vec![402.0, 300.0, 450.0];
    r.strategies[1].runs[1].repeat_throughputs_per_s = vec![1180.0, 1100.0, 1210.0];
    let page = render(&r);
    assert!(page.contains(
        "<dt>Rounds</dt><dd>3 rounds: each run measured once a round, its median reported with its interval</dd>"
    ));
    // The baseline's measurements spread by 50 %: the page says so, as the text does.
    assert!(page.contains(
        "<dt>Note</dt><dd><span class=\"note\">one replica alone varied by 50 % between its \
         measurements: the scalings, slowdowns and inflations carry that uncertainty; a longer \
         --duration or a quieter host gives steadier ratios</span></dd>"
    ));
    assert!(page.contains(
        "1 replica alone: 402 <span class=\"interval\">[388–415]</span> units/s (the median of 3: 402, 300, 450 units/s)"
    ));
    assert!(page.contains(
        "<td>1180 <span class=\"interval\">[1120–1230]</span> <span class=\"spread\" title=\"the median of 3: 1180, 1100, 1210 units/s\">(spread 10 %)</span></td>"
    ));
    // Runs measured once keep the bare figure.
    assert!(page.contains("<td>399</td>"), "{page}");
    // Within 10 %, no note.
    r.baseline.as_mut().unwrap().repeat_throughputs_per_s = vec![402.0, 390.0, 420.0];
    assert!(!render(&r).contains("<dt>Note</dt>"));
}

#[test]
fn the_header_says_how_the_replicas_were_pinned_and_how_noisy_the_host_was() {
    let page = render(&sample_report());
    assert!(page.contains(
        "<dt>Pinned</dt><dd>3 CPUs per replica from CPUs 0-15 (NUMA node 0 of the GPU); \
         replica 0: 0-2, replica 1: 3-5, replica 2: 6-8, replica 3: 9-11, replica 4: 12-14</dd>"
    ));
    assert!(page.contains(
        "<dt>Host noise</dt><dd>baseline spread 8.1 %, steal 0.4 %, CPU 2450–3100 MHz — \
         differences under 12 % on this host are noise.</dd>"
    ));
    assert!(page.contains("<dt>Wall time</dt><dd>6m52s (estimated 6m30s)</dd>"));
    assert!(page.contains("<td class=\"text\">1 clients (recommended, by isolation)</td>"));
    assert!(page.contains("<td class=\"text\">3 × MPS clients (recommended)</td>"));
    assert!(page.contains(
        "<dt>Baseline</dt><dd>1 replica alone: 402 <span class=\"interval\">[388–415]</span> \
         units/s, p50 2.41 ms, p99 3.10 <span class=\"interval\">[3.00–3.20]</span> ms</dd>"
    ));
    assert!(!page.contains("<dt>Note</dt>"), "nothing capped, a steady baseline");
    let mut r = sample_report();
    r.pinning = None;
    r.capped = "N=7 left out: <16> CPUs".into();
    let page = render(&r);
    assert!(page.contains("<dt>Pinned</dt><dd>no (--no-pin)</dd>"));
    assert!(page.contains(
        "<dt>Note</dt><dd><span class=\"note\">N=7 left out: &lt;16&gt; CPUs</span></dd>"
    ));
    // An older agent's report says nothing of what it did not do.
    let page = render(&older_report());
    for absent in
        ["Pinned", "Host noise", "estimated", "class=\"interval\"", "Error bars", "sequence"]
    {
        assert!(!page.contains(absent), "{absent}");
    }
}

#[test]
fn intervals_are_error_bars_explained_once_under_the_runs() {
    let page = render(&sample_report());
    let throughput = svg(&page, 0);
    // The baseline-less runs with an interval: time-slicing 1, mps 3, mps-limited 1.
    assert_eq!(throughput.matches("<g class=\"interval\"").count(), 3, "{throughput}");
    assert!(throughput.contains(
        "<g class=\"interval\" stroke=\"#d62728\" stroke-width=\"1.5\"><title>mps, N=3: interval 1120–1230 units/s</title>"
    ));
    let latency = svg(&page, 1);
    assert_eq!(latency.matches("<g class=\"interval\"").count(), 1, "{latency}");
    assert!(latency.contains("<title>mps p99, N=3: interval 3.10–3.60 ms</title>"));
    // The footnote once (issue 37: it was said three times), the charts pointing at it.
    assert_eq!(
        page.matches("95 % bootstrap interval of the median over 3 measurements").count(),
        1
    );
    assert_eq!(
        page.matches(
            "<p class=\"footnote\">Error bars: the runs' intervals (how they were found: under Runs).</p>"
        )
        .count(),
        2
    );
    assert_eq!(
        page.matches(
            "<p class=\"footnote\" id=\"intervals\">Intervals [low–high]: 95 % bootstrap interval of the median over 3 measurements.</p>"
        )
        .count(),
        1
    );
    // A bar reaches above every figure: the axis makes room for it.
    let mut r = sample_report();
    r.strategies[1].runs[2].throughput_interval = Some([1500.0, 5000.0]);
    assert!(svg(&render(&r), 0).contains(">5000</text>"), "the axis goes up to the bar's top");
}

#[test]
fn scaling_warnings_ties_and_the_sequence_are_shown() {
    let page = render(&sample_report());
    assert!(page.contains(
        "<td><span class=\"note\" title=\"1.10x with 1 replica is above 1, which no sharing gives: the baseline&#39;s noise, not a gain\">1.10×!</span></td>"
    ));
    assert!(page.contains(
        "<p class=\"note\">N=1: 1.10x with 1 replica is above 1, which no sharing gives: the baseline&#39;s noise, not a gain</p>"
    ));
    assert!(page.contains(
        "<li class=\"tie\"><strong>N=1: mps-limited</strong> — <em>time-slicing, mps and \
         mps-limited within the noise of each other: picked by isolation</em>; throughputs \
         within 12 % of each other, the host&#39;s noise</li>"
    ));
    assert!(page.contains("<li><strong>N=3: mps</strong> — 2.91x the throughput"));
    // The agent's reason says it: not twice.
    let mut r = sample_report();
    r.recommendations[0].reason = "indistinguishable here: time-slicing, mps".into();
    let page = render(&r);
    assert!(page.contains(
        "<li class=\"tie\"><strong>N=1: mps-limited</strong> — indistinguishable here: time-slicing, mps</li>"
    ));
    assert!(!page.contains("cannot tell"));
    // The measurements in the order taken, folded.
    let page = render(&sample_report());
    assert!(page.contains(
        "<h2 id=\"sequence\">Measurements in the order taken</h2>\n<details><summary>4 measurements</summary>"
    ));
    assert!(page.contains(
        "<tr><td>1</td><td class=\"text\">mps</td><td>3</td><td>1m05s</td><td>1180</td><td>3.10</td><td>3.30</td><td class=\"text error\"></td></tr>"
    ));
}

#[test]
fn the_answer_comes_first_and_a_partial_bench_says_so() {
    // Issue 37: the recommendation sat below the first screen and was missing from the
    // header; a cancelled bench's page did not say it was partial.
    let mut r = sample_report();
    r.partial = "cancelled after 1 of 3 whole rounds and 7 measurements".into();
    r.plan = vec!["Will measure: the baseline (1 replica alone) 3 times".into()];
    let page = render(&r);
    let at = |what: &str| page.find(what).unwrap_or_else(|| panic!("{what} not in the page"));
    assert!(at("<h2 id=\"recommendation\">") < at("<h2 id=\"how\">"));
    assert!(at("<h2 id=\"recommendation\">") < at("<h2 id=\"throughput\">"));
    assert!(
        at("<strong>Partial:</strong> cancelled after 1 of 3") < at("<h2 id=\"recommendation\">")
    );
    let title = &page[at("<title>")..at("</title>")];
    assert!(title.contains("mps-limited at 1, mps at 3"), "{title}");
    assert!(page.contains("<dt>Planned</dt><dd>Will measure: the baseline"));
}
