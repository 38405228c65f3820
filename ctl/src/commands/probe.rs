//! `gpushare-ctl probe [--target GPU|MIG-UUID] [--clients 1,2,4,7]
//! [--workload launch,compute,memory] [--seconds S] [--compare]`: starts a probe job (`Probe`) and
//! follows it like an apply ([`crate::job::start_and_follow`]), then prints what sharing
//! cost:
//!
//! ```text
//! Probe of GPU-00000000-0000-0000-0000-000000000000 (GPU 0, NVIDIA H100 80GB HBM3) shared as mps; 2 s windows, 41.3 s in all
//!
//! launch: solo 23,810 steps/s, p50 0.042 ms (23.8 k launches/s)
//! CLIENTS  SCALING  FAIRNESS  P50 x  P99 x  SLOWDOWN
//!       2    1.96x     1.000  1.02x  1.10x  1.02-1.03x
//!
//! Results kept in /var/lib/gpushare/probes/20261122T084400Z.json
//! ```
//!
//! With `--compare` it is the built-in case of `bench` ([`compare_as_bench`]): one bench
//! per workload, of the built-in workload under time-slicing, MPS and MPS with limits,
//! printed as bench prints. (A report with a `comparison`, from an agent before bench, is
//! still rendered as one table per workload with a row per strategy.)
//!
//! Only the options given are sent; the agent fills in the rest. With `--json` the
//! [`ProbeReport`] alone is printed, or the JSON error object when the probe failed.

use std::collections::HashMap;

use gpushare_proto::types::{JobOutcome, ProbeReport, ProbeRun, StrategyRuns};
use gpushare_proto::{
    OPTION_CLIENTS, OPTION_SECONDS, OPTION_TARGET, OPTION_WORKLOADS, PROBE_DEFAULT_CLIENTS,
    PROBE_DEFAULT_SECONDS,
};
use zbus::zvariant::Value;

use super::ExitStatus;
use crate::bus::Client;
use clap::ValueEnum;
use gpushare_proto::bench::BenchStrategy;

use super::bench;
use crate::cli::{BenchArgs, ProbeArgs, ProbeWorkload};
use crate::error::{CtlError, Kind};
use crate::job::start_and_follow;
use crate::output::{Glyphs, Output, parse_document, thousands};
use crate::table::Columns;

/// Runs `probe`.
pub async fn run(
    client: &mut Client,
    out: &Output,
    args: &ProbeArgs,
) -> Result<ExitStatus, CtlError> {
    if args.compare {
        return compare_as_bench(client, out, args).await;
    }
    let raw = start_and_follow(client, out, "Probe", "probe", async |a| {
        a.proxy.probe(options(args)).await
    })
    .await?;
    let outcome: JobOutcome = parse_document(&raw, "JobOutcome")?;
    let report = report_of(&outcome)?;
    for warning in &outcome.warnings {
        out.warn(warning);
    }
    if out.json {
        let json = serde_json::to_string_pretty(report).map_err(|e| {
            CtlError::ctl(Kind::Failed, format!("cannot write the probe report as JSON: {e}"))
        })?;
        out.print(&json);
    } else {
        out.print(&render_report(report, out.glyphs()));
    }
    Ok(0)
}

/// The options of `Probe`: only those given on the command line.
pub fn options(args: &ProbeArgs) -> HashMap<&'static str, Value<'static>> {
    let mut options = HashMap::new();
    if let Some(target) = &args.target {
        options.insert(OPTION_TARGET, Value::from(target.clone()));
    }
    if !args.workloads.is_empty() {
        let names: Vec<String> =
            args.workloads.iter().map(|w| w.workload().as_str().to_owned()).collect();
        options.insert(OPTION_WORKLOADS, Value::from(names));
    }
    if !args.clients.is_empty() {
        options.insert(OPTION_CLIENTS, Value::from(args.clients.clone()));
    }
    if let Some(seconds) = args.seconds {
        options.insert(OPTION_SECONDS, Value::from(seconds));
    }
    options
}

/// `probe --compare` is the built-in case of `bench`: one bench per workload, of its
/// client counts as replica counts under time-slicing, MPS and MPS with limits, each
/// window `--seconds` long (at least 1 s, bench's shortest).
async fn compare_as_bench(
    client: &mut Client,
    out: &Output,
    args: &ProbeArgs,
) -> Result<ExitStatus, CtlError> {
    let workloads: Vec<ProbeWorkload> = if args.workloads.is_empty() {
        ProbeWorkload::value_variants().to_vec()
    } else {
        args.workloads.clone()
    };
    if out.json && workloads.len() > 1 {
        return Err(CtlError::ctl(
            Kind::Usage,
            "probe --compare --json: give one --workload (each is a bench with its own report)",
        )
        .with_exit_code(2));
    }
    let clients =
        if args.clients.is_empty() { PROBE_DEFAULT_CLIENTS.to_vec() } else { args.clients.clone() };
    for workload in workloads {
        let bench = compare_args(args, workload, clients.clone());
        bench::run(client, out, &bench).await?;
    }
    Ok(0)
}

/// The bench `probe --compare` runs for one workload.
fn compare_args(args: &ProbeArgs, workload: ProbeWorkload, replicas: Vec<u32>) -> BenchArgs {
    BenchArgs {
        target: args.target.clone(),
        replicas,
        strategies: vec![BenchStrategy::TimeSlicing, BenchStrategy::Mps, BenchStrategy::MpsLimited],
        duration: Some(args.seconds.unwrap_or(PROBE_DEFAULT_SECONDS).max(1.0)),
        until_exit: false,
        objective: None,
        slo: None,
        histogram: None,
        builtin: Some(workload),
        fleet: None,
        time_limit: None,
        repeat: None,
        cpus: None,
        no_pin: false,
        report: None,
        logs: None,
        command: Vec::new(),
    }
}

/// The report of a finished probe job, or why there is none.
pub fn report_of(outcome: &JobOutcome) -> Result<&ProbeReport, CtlError> {
    if !outcome.ok {
        let message = outcome.error.clone().unwrap_or_else(|| "the probe failed".into());
        return Err(match &outcome.error_name {
            Some(name) => CtlError::new(name.clone(), message),
            None => CtlError::ctl(Kind::Failed, message),
        });
    }
    outcome.probe.as_ref().ok_or_else(|| {
        CtlError::ctl(
            Kind::BadReply,
            "the probe job finished without a report; are gpushare-ctl and gpushare-agent the same version?",
        )
    })
}

/// `1.02–1.10x`: the least and the greatest slowdown of a run's clients (one value when
/// they agree, `-` with no clients).
pub fn slowdown_cell(run: &ProbeRun, glyphs: Glyphs) -> String {
    let mut slowdowns = run.per_client.iter().map(|c| c.slowdown);
    let Some(first) = slowdowns.next() else {
        return "-".into();
    };
    let (min, max) = slowdowns.fold((first, first), |(lo, hi), s| (lo.min(s), hi.max(s)));
    let (min, max) = (format!("{min:.2}"), format!("{max:.2}"));
    if min == max { format!("{min}x") } else { format!("{min}{}{max}x", glyphs.range) }
}

/// The report as people read it: a header, then per workload (in the order of its first
/// run) the solo baseline and a table of client counts, then where the results are kept.
pub fn render_report(report: &ProbeReport, glyphs: Glyphs) -> String {
    let mut text = format!(
        "Probe of {} (GPU {}, {}) shared as {}; {} s windows, {:.1} s in all\n",
        report.target,
        report.gpu,
        report.device,
        report.strategy,
        report.seconds,
        report.wall_seconds
    );
    if report.comparison.is_empty() {
        render_runs(report, glyphs, &mut text);
    } else {
        render_comparison(report, glyphs, &mut text);
    }
    text.push_str(&format!("\nResults kept in {}\n", report.saved_to));
    text
}

/// The workloads of some runs, in the order of their first run.
fn workloads_of<'a>(runs: impl IntoIterator<Item = &'a ProbeRun>) -> Vec<&'a str> {
    let mut workloads: Vec<&str> = Vec::new();
    for run in runs {
        if !workloads.contains(&run.workload.as_str()) {
            workloads.push(&run.workload);
        }
    }
    workloads
}

/// `launch: solo 23,810 steps/s, p50 0.042 ms (23.8 k launches/s)`, after a blank line.
fn baseline_line(solo: &ProbeRun, text: &mut String) {
    text.push('\n');
    text.push_str(&format!(
        "{}: solo {} steps/s, p50 {:.3} ms ({})\n",
        solo.workload,
        thousands(solo.solo_throughput_per_s),
        solo.solo_p50_ms,
        solo.solo_achieved
    ));
}

/// Per workload: the solo baseline and a table of client counts.
fn render_runs(report: &ProbeReport, glyphs: Glyphs, text: &mut String) {
    let workloads = workloads_of(&report.runs);
    if workloads.is_empty() {
        text.push_str("\nNo runs.\n");
    }
    for workload in workloads {
        let runs: Vec<&ProbeRun> = report.runs.iter().filter(|r| r.workload == workload).collect();
        baseline_line(runs[0], text);
        let times = glyphs.times;
        let columns = Columns::<&ProbeRun>::new()
            .right("CLIENTS", |r| r.clients.to_string())
            .right("SCALING", |r| format!("{:.2}x", r.scaling))
            .right("FAIRNESS", |r| format!("{:.3}", r.jain_fairness))
            .right(format!("P50 {times}"), |r| format!("{:.2}x", r.p50_inflation))
            .right(format!("P99 {times}"), |r| format!("{:.2}x", r.p99_inflation))
            .left("SLOWDOWN", move |r| slowdown_cell(r, glyphs));
        text.push_str(&columns.render(&runs));
    }
}

/// Per workload (in the order of its first run in any strategy): the solo baseline and a
/// table with a row per strategy (in the report's order), its scaling at each client count
/// and its fairness at the largest; then the recommendations.
fn render_comparison(report: &ProbeReport, glyphs: Glyphs, text: &mut String) {
    let all_runs = || report.comparison.iter().flat_map(|s| &s.runs);
    let workloads = workloads_of(all_runs());
    if workloads.is_empty() {
        text.push_str("\nNo runs.\n");
    }
    for workload in workloads {
        let mut counts: Vec<u32> =
            all_runs().filter(|r| r.workload == workload).map(|r| r.clients).collect();
        counts.sort_unstable();
        counts.dedup();
        let largest = counts.last().copied();
        if let Some(solo) = all_runs().find(|r| r.workload == workload) {
            baseline_line(solo, text);
        }
        // A column per client count, then the fairness at the largest.
        let mut columns = Columns::<StrategyRuns>::new().left("STRATEGY", |s| s.strategy.clone());
        for &n in &counts {
            columns = columns.right(format!("N={n}"), move |s| {
                run_at(s, workload, n).map_or("-".into(), |r| format!("{:.2}x", r.scaling))
            });
        }
        let columns = columns.right("FAIRNESS", move |s| {
            let at_largest = largest.and_then(|n| run_at(s, workload, n));
            at_largest.map_or("-".into(), |r| format!("{:.3}", r.jain_fairness))
        });
        text.push_str(&columns.render(&report.comparison));
    }
    if !report.recommendations.is_empty() {
        text.push_str("\nRecommendation:\n");
        for r in &report.recommendations {
            text.push_str(&format!(
                "{}: {} {} {}\n",
                r.workload, r.strategy, glyphs.dash, r.reason
            ));
        }
    }
}

/// The run of `workload` with `clients` clients under one strategy.
fn run_at<'a>(strategy: &'a StrategyRuns, workload: &str, clients: u32) -> Option<&'a ProbeRun> {
    strategy.runs.iter().find(|r| r.workload == workload && r.clients == clients)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::ProbeWorkload;
    use gpushare_proto::types::{ProbeClient, Recommendation};

    fn client(throughput: f64, slowdown: f64) -> ProbeClient {
        ProbeClient { throughput_per_s: throughput, p50_ms: 0.05, p99_ms: 0.2, slowdown }
    }

    fn run(workload: &str, clients: u32, scaling: f64, slowdowns: &[f64]) -> ProbeRun {
        let (solo, p50, achieved) = match workload {
            "launch" => (23_810.4, 0.0421, "23.8 k launches/s"),
            _ => (412.0, 2.4271, "63.6 of 66.9 TFLOP/s fp32 (95 %)"),
        };
        ProbeRun {
            workload: workload.into(),
            clients,
            solo_throughput_per_s: solo,
            solo_p50_ms: p50,
            solo_achieved: achieved.into(),
            scaling,
            jain_fairness: 0.99987,
            p50_inflation: 1.0234,
            p99_inflation: 1.1,
            per_client: slowdowns.iter().map(|&s| client(solo / s, s)).collect(),
        }
    }

    fn report() -> ProbeReport {
        ProbeReport {
            target: "GPU-00000000-0000-0000-0000-000000000000".into(),
            gpu: 0,
            strategy: "mps".into(),
            device: "NVIDIA H100 80GB HBM3".into(),
            seconds: 2.0,
            wall_seconds: 41.26,
            runs: vec![
                run("launch", 1, 1.0, &[1.0]),
                run("launch", 2, 1.96, &[1.02, 1.03]),
                run("launch", 4, 3.6712, &[1.02, 1.10, 1.05, 1.08]),
                run("compute", 1, 1.0, &[1.0]),
                run("compute", 7, 1.01, &[6.9, 7.02, 6.95, 7.0, 6.91, 6.99, 7.01]),
            ],
            saved_to: "/var/lib/gpushare/probes/20261122T084400Z.json".into(),
            comparison: vec![],
            recommendations: vec![],
        }
    }

    #[test]
    fn report_with_two_workloads() {
        let text = render_report(&report(), Glyphs::ASCII);
        let expected = "\
Probe of GPU-00000000-0000-0000-0000-000000000000 (GPU 0, NVIDIA H100 80GB HBM3) shared as mps; 2 s windows, 41.3 s in all

launch: solo 23,810 steps/s, p50 0.042 ms (23.8 k launches/s)
CLIENTS  SCALING  FAIRNESS  P50 x  P99 x  SLOWDOWN
      1    1.00x     1.000  1.02x  1.10x  1.00x
      2    1.96x     1.000  1.02x  1.10x  1.02-1.03x
      4    3.67x     1.000  1.02x  1.10x  1.02-1.10x

compute: solo 412 steps/s, p50 2.427 ms (63.6 of 66.9 TFLOP/s fp32 (95 %))
CLIENTS  SCALING  FAIRNESS  P50 x  P99 x  SLOWDOWN
      1    1.00x     1.000  1.02x  1.10x  1.00x
      7    1.01x     1.000  1.02x  1.10x  6.90-7.02x

Results kept in /var/lib/gpushare/probes/20261122T084400Z.json
";
        assert_eq!(text, expected, "\n{text}");
    }

    #[test]
    fn report_on_a_terminal_uses_unicode() {
        let text = render_report(&report(), Glyphs::UNICODE);
        assert!(text.contains("P50 ×  P99 ×"), "{text}");
        assert!(text.contains("1.02–1.10x"), "{text}");
    }

    #[test]
    fn report_without_runs() {
        let mut r = report();
        r.runs.clear();
        r.seconds = 0.5;
        let text = render_report(&r, Glyphs::ASCII);
        assert!(text.contains("; 0.5 s windows, 41.3 s in all\n\nNo runs.\n\nResults kept in"));
    }

    /// A run of `workload` at `clients` with a scaling and a fairness.
    fn scaled(workload: &str, clients: u32, scaling: f64, fairness: f64) -> ProbeRun {
        let mut r = run(workload, clients, scaling, &vec![1.0; clients as usize]);
        r.jain_fairness = fairness;
        r
    }

    fn comparison_report() -> ProbeReport {
        let mut r = report();
        r.strategy = "time-slicing".into();
        r.wall_seconds = 124.04;
        r.comparison = vec![
            StrategyRuns {
                strategy: "time-slicing".into(),
                runs: vec![
                    scaled("launch", 4, 1.0012, 0.9981),
                    scaled("launch", 7, 1.01, 0.99),
                    scaled("compute", 4, 1.0, 1.0),
                    scaled("compute", 7, 0.998, 0.9999),
                ],
            },
            StrategyRuns {
                strategy: "mps".into(),
                runs: vec![
                    scaled("launch", 4, 3.6712, 0.99996),
                    scaled("launch", 7, 6.1, 0.9712),
                    scaled("compute", 4, 1.02, 0.874),
                    scaled("compute", 7, 1.03, 0.8123),
                ],
            },
        ];
        r.recommendations = vec![
            Recommendation {
                workload: "launch".into(),
                strategy: "mps".into(),
                reason: "6.10x at N=7 against 1.01x time-slicing".into(),
            },
            Recommendation {
                workload: "compute".into(),
                strategy: "time-slicing".into(),
                reason: "no gain from mps (1.03x at N=7); fairer (1.000 against 0.812)".into(),
            },
        ];
        r
    }

    #[test]
    fn comparison_has_a_table_per_workload_and_recommendations() {
        let text = render_report(&comparison_report(), Glyphs::ASCII);
        let expected = "\
Probe of GPU-00000000-0000-0000-0000-000000000000 (GPU 0, NVIDIA H100 80GB HBM3) shared as time-slicing; 2 s windows, 124.0 s in all

launch: solo 23,810 steps/s, p50 0.042 ms (23.8 k launches/s)
STRATEGY        N=4    N=7  FAIRNESS
time-slicing  1.00x  1.01x     0.990
mps           3.67x  6.10x     0.971

compute: solo 412 steps/s, p50 2.427 ms (63.6 of 66.9 TFLOP/s fp32 (95 %))
STRATEGY        N=4    N=7  FAIRNESS
time-slicing  1.00x  1.00x     1.000
mps           1.02x  1.03x     0.812

Recommendation:
launch: mps - 6.10x at N=7 against 1.01x time-slicing
compute: time-slicing - no gain from mps (1.03x at N=7); fairer (1.000 against 0.812)

Results kept in /var/lib/gpushare/probes/20261122T084400Z.json
";
        assert_eq!(text, expected, "\n{text}");
        let unicode = render_report(&comparison_report(), Glyphs::UNICODE);
        assert!(unicode.contains("\nlaunch: mps — 6.10x at N=7"), "{unicode}");
    }

    #[test]
    fn comparison_marks_runs_a_strategy_lacks() {
        let mut r = comparison_report();
        r.comparison[1].runs.retain(|run| !(run.workload == "compute" && run.clients == 7));
        r.comparison[0].runs.push(scaled("compute", 1, 1.0, 1.0));
        r.recommendations.clear();
        let text = render_report(&r, Glyphs::ASCII);
        assert!(
            text.contains(
                "\
STRATEGY        N=1    N=4    N=7  FAIRNESS
time-slicing  1.00x  1.00x  1.00x     1.000
mps               -  1.02x      -         -
"
            ),
            "{text}"
        );
        assert!(!text.contains("Recommendation:"), "{text}");
        r.comparison.iter_mut().for_each(|s| s.runs.clear());
        let text = render_report(&r, Glyphs::ASCII);
        assert!(text.contains("in all\n\nNo runs.\n\nResults kept in"), "{text}");
    }

    #[test]
    fn comparison_json_carries_the_new_fields_only_when_set() {
        let plain = serde_json::to_value(report()).unwrap();
        assert!(plain.get("comparison").is_none() && plain.get("recommendations").is_none());
        let compared = serde_json::to_value(comparison_report()).unwrap();
        assert_eq!(compared["comparison"][1]["strategy"], "mps");
        assert_eq!(compared["recommendations"][0]["strategy"], "mps");
    }

    #[test]
    fn compare_is_a_bench_of_the_built_in_workload() {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from([
            "gpushare-ctl",
            "probe",
            "--compare",
            "--target",
            "1",
            "--seconds",
            "0.5",
        ])
        .unwrap();
        let crate::cli::Command::Probe(args) = cli.command else { panic!("{cli:?}") };
        let bench = compare_args(&args, ProbeWorkload::Compute, vec![1, 4, 7]);
        assert_eq!(bench.builtin, Some(ProbeWorkload::Compute));
        assert_eq!(bench.replicas, [1, 4, 7]);
        assert_eq!(bench.duration, Some(1.0), "bench's shortest window");
        assert_eq!(bench.target.as_deref(), Some("1"));
        assert_eq!(bench.strategies.len(), 3);
        assert!(bench.command.is_empty() && bench.histogram.is_none());
        assert!(!options(&args).contains_key("compare"));
    }

    fn outcome(ok: bool) -> JobOutcome {
        JobOutcome {
            ok,
            profile: String::new(),
            changed: false,
            steps_done: 3,
            steps_total: 5,
            duration_seconds: 41.26,
            error_name: (!ok).then(|| "io.gpushare.Agent1.Error.Backend".into()),
            error: (!ok).then(|| "client 3 failed: CUDA_ERROR_OUT_OF_MEMORY".into()),
            warnings: vec![],
            probe: ok.then(report),
            bench: None,
            private: false,
        }
    }

    #[test]
    fn outcomes_become_reports_or_errors() {
        assert_eq!(report_of(&outcome(true)).unwrap(), &report());
        let e = report_of(&outcome(false)).unwrap_err();
        assert_eq!(e.name, "io.gpushare.Agent1.Error.Backend");
        assert_eq!(e.message, "client 3 failed: CUDA_ERROR_OUT_OF_MEMORY");
        assert_eq!(e.exit_code, 1);
        let mut o = outcome(false);
        (o.error, o.error_name) = (None, None);
        let e = report_of(&o).unwrap_err();
        assert!(e.is(Kind::Failed));
        assert_eq!(e.message, "the probe failed");
        let mut o = outcome(true);
        o.probe = None;
        assert!(report_of(&o).unwrap_err().is(Kind::BadReply));
    }

    #[test]
    fn only_given_options_are_sent() {
        let none = ProbeArgs {
            target: None,
            clients: vec![],
            workloads: vec![],
            seconds: None,
            compare: false,
        };
        assert!(options(&none).is_empty());
        let all = ProbeArgs {
            target: Some("1".into()),
            clients: vec![1, 2, 4, 7],
            workloads: vec![ProbeWorkload::Launch, ProbeWorkload::Memory],
            seconds: Some(2.5),
            compare: true,
        };
        let o = options(&all);
        assert_eq!(o.len(), 4, "compare is a bench, not an option of Probe");
        assert_eq!(o["target"], Value::from("1"));
        assert_eq!(o["seconds"], Value::from(2.5));
        assert_eq!(o["clients"].value_signature().to_string(), "au");
        assert_eq!(o["workloads"].value_signature().to_string(), "as");
        assert_eq!(o["clients"], Value::from(vec![1u32, 2, 4, 7]));
        assert_eq!(o["workloads"], Value::from(vec!["launch".to_owned(), "memory".to_owned()]));
    }
}
