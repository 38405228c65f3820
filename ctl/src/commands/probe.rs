//! `gpushare-ctl probe [--target GPU|MIG-UUID] [--clients 1,2,4,7]
//! [--workload launch,compute,memory] [--seconds S]`: starts a probe job (`Probe`) and
//! follows it like an apply ([`super::apply::start_and_follow`]), then prints what sharing
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
//! Only the options given are sent; the agent fills in the rest. With `--json` the
//! [`ProbeReport`] alone is printed, or the JSON error object when the probe failed.

use std::collections::HashMap;

use comfy_table::CellAlignment;
use gpushare_proto::types::{JobOutcome, ProbeReport, ProbeRun};
use zbus::zvariant::Value;

use super::ExitStatus;
use super::apply::start_and_follow;
use crate::bus::Client;
use crate::cli::ProbeArgs;
use crate::error::{CtlError, Kind};
use crate::output::{Glyphs, Output, parse_document, plain_table, render_table};

/// Runs `probe`.
pub async fn run(
    client: &mut Client,
    out: &Output,
    args: &ProbeArgs,
) -> Result<ExitStatus, CtlError> {
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
        options.insert("target", Value::from(target.clone()));
    }
    if !args.workloads.is_empty() {
        let names: Vec<String> = args.workloads.iter().map(|w| w.name().to_owned()).collect();
        options.insert("workloads", Value::from(names));
    }
    if !args.clients.is_empty() {
        options.insert("clients", Value::from(args.clients.clone()));
    }
    if let Some(seconds) = args.seconds {
        options.insert("seconds", Value::from(seconds));
    }
    options
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

/// `23,810`: a count rounded to a whole number, with thousands separators.
pub fn thousands(value: f64) -> String {
    if !value.is_finite() {
        return format!("{value}");
    }
    let rounded = value.round();
    let digits = format!("{:.0}", rounded.abs());
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    if rounded < 0.0 { format!("-{grouped}") } else { grouped }
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
    let mut workloads: Vec<&str> = Vec::new();
    for run in &report.runs {
        if !workloads.contains(&run.workload.as_str()) {
            workloads.push(&run.workload);
        }
    }
    if workloads.is_empty() {
        text.push_str("\nNo runs.\n");
    }
    for workload in workloads {
        let runs: Vec<&ProbeRun> = report.runs.iter().filter(|r| r.workload == workload).collect();
        let solo = runs[0];
        text.push('\n');
        text.push_str(&format!(
            "{workload}: solo {} steps/s, p50 {:.3} ms ({})\n",
            thousands(solo.solo_throughput_per_s),
            solo.solo_p50_ms,
            solo.solo_achieved
        ));
        let times = glyphs.times;
        let mut table = plain_table([
            "CLIENTS".to_owned(),
            "SCALING".to_owned(),
            "FAIRNESS".to_owned(),
            format!("P50 {times}"),
            format!("P99 {times}"),
            "SLOWDOWN".to_owned(),
        ]);
        for column in 0..5 {
            if let Some(c) = table.column_mut(column) {
                c.set_cell_alignment(CellAlignment::Right);
            }
        }
        for run in runs {
            table.add_row(vec![
                run.clients.to_string(),
                format!("{:.2}x", run.scaling),
                format!("{:.3}", run.jain_fairness),
                format!("{:.2}x", run.p50_inflation),
                format!("{:.2}x", run.p99_inflation),
                slowdown_cell(run, glyphs),
            ]);
        }
        text.push_str(&render_table(&table));
    }
    text.push_str(&format!("\nResults kept in {}\n", report.saved_to));
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::ProbeWorkload;
    use gpushare_proto::types::ProbeClient;

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

    #[test]
    fn numbers_get_thousands_separators() {
        assert_eq!(thousands(23_810.4), "23,810");
        assert_eq!(thousands(999.6), "1,000");
        assert_eq!(thousands(12.0), "12");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(-4321.0), "-4,321");
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
        let none = ProbeArgs { target: None, clients: vec![], workloads: vec![], seconds: None };
        assert!(options(&none).is_empty());
        let all = ProbeArgs {
            target: Some("1".into()),
            clients: vec![1, 2, 4, 7],
            workloads: vec![ProbeWorkload::Launch, ProbeWorkload::Memory],
            seconds: Some(2.5),
        };
        let o = options(&all);
        assert_eq!(o.len(), 4);
        assert_eq!(o["target"], Value::from("1"));
        assert_eq!(o["seconds"], Value::from(2.5));
        assert_eq!(o["clients"].value_signature().to_string(), "au");
        assert_eq!(o["workloads"].value_signature().to_string(), "as");
        assert_eq!(o["clients"], Value::from(vec![1u32, 2, 4, 7]));
        assert_eq!(o["workloads"], Value::from(vec!["launch".to_owned(), "memory".to_owned()]));
    }
}
