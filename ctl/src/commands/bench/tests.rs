use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use clap::Parser;
use gpushare_proto::bench::{
    BenchCapacity, BenchMeasurement, BenchNoise, BenchPinning, BenchRecommendation, BenchReplica,
    BenchStrategy, BenchStrategyRuns, Objective, Slo,
};

use super::*;
use crate::cli::{Cli, Command};

/// A replica of a run that went well.
pub(crate) fn replica(index: u32, throughput: f64, slowdown: f64) -> BenchReplica {
    BenchReplica {
        index,
        pid: 4200 + index,
        device: "GPU-00000000-0000-0000-0000-000000000000".into(),
        outcome: "stopped".into(),
        failed: false,
        seconds: 30.0,
        units: (throughput * 30.0) as u64,
        throughput_per_s: throughput,
        p50_ms: Some(2.5 * slowdown),
        p99_ms: Some(3.2 * slowdown),
        slowdown: Some(slowdown),
        gpu_memory_bytes: Some(3 << 30),
        malformed_lines: 0,
        stdout_tail: format!("replica {index} serving\n"),
        stderr_tail: String::new(),
        output_dropped_bytes: 0,
    }
}

/// A run of `n` replicas with its figures.
pub(crate) fn run(n: u32, throughput: f64, p50: Option<f64>, p99: Option<f64>) -> BenchRun {
    let each = throughput / f64::from(n);
    BenchRun {
        replicas: n,
        setup: format!("{n} clients"),
        seconds: 30.0,
        units: (throughput * 30.0) as u64,
        throughput_per_s: throughput,
        scaling: Some(throughput / 402.1),
        p50_ms: p50,
        p99_ms: p99,
        p50_inflation: p50.map(|p| p / 2.41),
        p99_inflation: p99.map(|p| p / 3.1),
        jain_fairness: Some(0.9991),
        max_slowdown: Some(402.1 / each),
        failed: 0,
        error: None,
        agent_cpu_percent: Some(0.4),
        setup_ms: None,
        repeat_throughputs_per_s: Vec::new(),
        repeat_p99s_ms: Vec::new(),
        throughput_interval: None,
        p99_interval_ms: None,
        scaling_warning: None,
        per_replica: (0..n).map(|i| replica(i, each, 402.1 / each)).collect(),
    }
}

/// A realistic report: three strategies measured (one run with a failed replica whose
/// stderr holds markup, one run that could not be set up, one without p50), MIG skipped,
/// recommendations and capacity.
pub(crate) fn sample_report() -> BenchReport {
    let mut failed_run = run(5, 1560.0, Some(3.9), Some(61.0));
    failed_run.failed = 1;
    let bad = &mut failed_run.per_replica[3];
    bad.failed = true;
    bad.outcome = "exit 3".into();
    bad.throughput_per_s = 0.0;
    bad.stderr_tail =
        "loading model\n<script>alert(1)</script>\nCUDA error: out of memory\n".into();
    let mut no_p50 = run(3, 1100.0, None, Some(4.4));
    no_p50.setup = "MPS, 33 % threads, 13 GiB each".into();
    no_p50.setup_ms = Some(29.6);
    let mut baseline = run(1, 402.1, Some(2.41), Some(3.1));
    baseline.setup_ms = Some(55.1);
    let mut mps_first = run(1, 399.0, Some(2.43), Some(3.2));
    mps_first.setup_ms = Some(27.4);
    let mut limited_first = run(1, 398.0, Some(2.44), Some(3.3));
    limited_first.setup_ms = Some(31.2);
    let mut unset = run(5, 0.0, None, None);
    unset.error = Some("cannot give 5 clients 20 % threads: the MPS server refused".into());
    unset.per_replica.clear();
    // Intervals where the runs were measured three times.
    baseline.throughput_interval = Some([388.0, 415.0]);
    baseline.p99_interval_ms = Some([3.0, 3.2]);
    let mut sliced_alone = run(1, 401.0, Some(2.42), Some(3.1));
    sliced_alone.throughput_interval = Some([395.0, 410.0]);
    let mut mps_three = run(3, 1180.0, Some(2.52), Some(3.4));
    mps_three.throughput_interval = Some([1120.0, 1230.0]);
    mps_three.p99_interval_ms = Some([3.1, 3.6]);
    mps_three.setup = "3 × MPS clients".into();
    // More than one replica alone: a noisy baseline, flagged.
    limited_first.throughput_per_s = 442.0;
    limited_first.scaling = Some(442.0 / 402.1);
    limited_first.throughput_interval = Some([401.0, 450.0]);
    limited_first.scaling_warning = Some(
        "1.10x with 1 replica is above 1, which no sharing gives: the baseline's noise, not a gain"
            .into(),
    );
    BenchReport {
        target: "GPU-00000000-0000-0000-0000-000000000000".into(),
        gpu: 0,
        device: "NVIDIA A100-SXM4-40GB".into(),
        command: vec!["./serve".into(), "--model".into(), "small files".into()],
        method: "units".into(),
        histogram: None,
        objective: "throughput".into(),
        window_seconds: Some(30.0),
        repeat: 1,
        slo: Some("p99=50ms".into()),
        fleet: 100,
        wall_seconds: 412.34,
        baseline: Some(baseline),
        strategies: vec![
            BenchStrategyRuns {
                strategy: "time-slicing".into(),
                skipped: None,
                runs: vec![
                    sliced_alone,
                    run(3, 405.0, Some(7.3), Some(9.8)),
                    run(5, 404.0, Some(12.2), Some(16.4)),
                ],
            },
            BenchStrategyRuns {
                strategy: "mps".into(),
                skipped: None,
                runs: vec![mps_first, mps_three, failed_run],
            },
            BenchStrategyRuns {
                strategy: "mps-limited".into(),
                skipped: None,
                runs: vec![limited_first, no_p50, unset],
            },
            BenchStrategyRuns {
                strategy: "mig".into(),
                skipped: Some("manage_mig = false".into()),
                runs: vec![],
            },
        ],
        recommendations: vec![
            BenchRecommendation {
                replicas: 1,
                strategy: "mps-limited".into(),
                reason: "throughputs within 12 % of each other, the host's noise".into(),
                indistinguishable: vec!["time-slicing".into(), "mps".into(), "mps-limited".into()],
            },
            BenchRecommendation {
                replicas: 3,
                strategy: "mps".into(),
                reason: "2.91x the throughput of time-slicing, p99 0.3x".into(),
                indistinguishable: Vec::new(),
            },
            BenchRecommendation {
                replicas: 5,
                strategy: "mps".into(),
                reason: "3.86x the throughput of time-slicing; 1 replica failed".into(),
                indistinguishable: Vec::new(),
            },
        ],
        capacity: vec![
            BenchCapacity {
                strategy: "time-slicing".into(),
                replicas_per_gpu: 5,
                gpus_needed: 20,
                saving: 0.8,
                reason: "p99 16.4 ms at N=5".into(),
            },
            BenchCapacity {
                strategy: "mps".into(),
                replicas_per_gpu: 3,
                gpus_needed: 34,
                saving: 0.66,
                reason: "p99 61 ms at N=5 breaks it".into(),
            },
        ],
        restored: "time-slicing (as before)".into(),
        saved_to: "/home/ada/.local/state/gpushare/bench/bench-1795428900000/report.json".into(),
        logs_dir: "/home/ada/.local/state/gpushare/bench/bench-1795428900000".into(),
        pinning: Some(BenchPinning {
            cpus: "0-15".into(),
            from: "NUMA node 0 of the GPU".into(),
            cpus_per_replica: 3,
            replicas: ["0-2", "3-5", "6-8", "9-11", "12-14"].map(String::from).to_vec(),
        }),
        intervals: "95 % bootstrap interval of the median over 3 measurements".into(),
        noise: Some(BenchNoise {
            baseline_spread: Some(0.081),
            baseline_p99_spread: None,
            baseline_scale: None,
            floor: 0.12,
            steal_percent: Some(0.4),
            frequency_mhz: Some([2450.0, 2900.0, 3100.0]),
            meaning: "differences under 12 % on this host are noise".into(),
        }),
        estimate_seconds: Some(390.0),
        capped: String::new(),
        partial: String::new(),
        plan: Vec::new(),
        sequence: vec![
            measurement(1, "baseline", 1, 0.0, 402.1),
            measurement(1, "time-slicing", 3, 31.0, 405.0),
            measurement(1, "mps", 3, 64.5, 1180.0),
            measurement(2, "baseline", 1, 98.2, 388.0),
        ],
    }
}

/// One measurement of the bench's sequence.
pub(crate) fn measurement(
    round: u32,
    strategy: &str,
    replicas: u32,
    at_seconds: f64,
    throughput: f64,
) -> BenchMeasurement {
    BenchMeasurement {
        round,
        strategy: strategy.into(),
        replicas,
        at_seconds,
        throughput_per_s: throughput,
        p99_ms: Some(3.1),
        worst_p99_ms: Some(3.3),
        failed: false,
    }
}

/// [`sample_report`] as an agent before issue 27 sent it: no pinning, intervals, noise,
/// estimate or sequence.
pub(crate) fn older_report() -> BenchReport {
    let mut r = sample_report();
    (r.pinning, r.noise, r.estimate_seconds) = (None, None, None);
    r.intervals.clear();
    r.sequence.clear();
    let runs = r.strategies.iter_mut().flat_map(|s| s.runs.iter_mut());
    for run in runs.chain(r.baseline.as_mut()) {
        (run.throughput_interval, run.p99_interval_ms, run.scaling_warning) = (None, None, None);
    }
    for rec in &mut r.recommendations {
        rec.indistinguishable.clear();
    }
    r
}

fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
    let cli = Cli::try_parse_from(["gpushare-ctl", "bench"].iter().chain(args))?;
    match cli.command {
        Command::Bench(b) => Ok(*b),
        other => panic!("{other:?}"),
    }
}

/// The one line a usage error of `bench` prints (main's form of clap's error).
fn usage_line(args: &[&str]) -> String {
    let e = parse(args).expect_err("a usage error");
    assert_eq!(e.exit_code(), 2, "{args:?}");
    let rendered = e.render().to_string();
    let first = rendered.split("\n\n").next().unwrap_or_default();
    let line = first.lines().map(str::trim).collect::<Vec<_>>().join(" ");
    line.strip_prefix("error: ").unwrap_or(&line).to_owned()
}

#[test]
fn command_and_defaults() {
    let b = parse(&["--", "./serve", "--port", "0"]).unwrap();
    assert_eq!(b.command, ["./serve", "--port", "0"]);
    assert!(b.replicas.is_empty() && b.strategies.is_empty());
    assert_eq!((b.duration, b.until_exit, b.objective, b.builtin), (None, false, None, None));
    assert_eq!((b.fleet, b.time_limit, b.report.as_deref()), (None, None, None));
}

#[test]
fn every_option_parses() {
    let b = parse(&[
        "--target",
        "MIG-1111",
        "--replicas",
        "1,2,48",
        "--strategies",
        "mps,mig",
        "--duration",
        "1.5s",
        "--objective",
        "latency",
        "--slo",
        "p99=0.2s",
        "--histogram",
        "request_seconds",
        "--fleet",
        "40",
        "--time-limit",
        "10m",
        "--repeat",
        "3",
        "--cpus",
        " 0-7,16-23 ",
        "--report",
        "out.html",
        "--json",
        "--",
        "python3",
        "infer.py",
        "--json",
    ])
    .unwrap();
    assert_eq!(b.target.as_deref(), Some("MIG-1111"));
    assert_eq!(b.replicas, [1, 2, 48]);
    assert_eq!(b.strategies, [BenchStrategy::Mps, BenchStrategy::Mig]);
    assert_eq!(b.duration, Some(1.5));
    assert_eq!(b.objective, Some(Objective::Latency));
    let slo = b.slo.clone().unwrap();
    assert_eq!((slo.written.as_str(), slo.slo), ("p99=0.2s", Slo::P99Ms(200.0)));
    assert_eq!(b.histogram.as_deref(), Some("request_seconds"));
    assert_eq!((b.fleet, b.time_limit, b.repeat), (Some(40), Some(600.0), Some(3)));
    assert_eq!(b.report.as_deref(), Some(Path::new("out.html")));
    assert_eq!((b.cpus.as_deref(), b.no_pin), (Some("0-7,16-23"), false));
    // `--json` after `--` is the program's.
    assert_eq!(b.command, ["python3", "infer.py", "--json"]);
    let b = parse(&["--until-exit", "--builtin", "compute", "--slo", "slowdown=1.5x"]).unwrap();
    assert!(b.until_exit && b.command.is_empty());
    assert_eq!(b.builtin, Some(crate::cli::ProbeWorkload::Compute));
    assert_eq!(b.slo.unwrap().slo, Slo::Slowdown(1.5));
    let b = parse(&["--no-pin", "--", "./serve"]).unwrap();
    assert!(b.no_pin && b.cpus.is_none());
}

#[test]
fn durations() {
    use crate::cli::parse_duration;
    for (text, seconds) in
        [("30s", 30.0), ("2m", 120.0), ("500ms", 0.5), ("1.5s", 1.5), ("45", 45.0), ("1h", 3600.0)]
    {
        assert_eq!(parse_duration(text), Ok(seconds), "{text}");
    }
    assert_eq!(parse_duration(" 2 m "), Ok(120.0));
    for bad in ["", "s", "soon", "1d", "-1s", "1e3", "inf", "NaN", "1..5s", "+3"] {
        assert_eq!(
            parse_duration(bad).unwrap_err(),
            format!("`{bad}` is not a duration (500ms, 1.5s, 30s, 2m, 1h or seconds)"),
            "{bad}"
        );
    }
    assert_eq!(parse_duration("0s").unwrap_err(), "`0s`: a duration must be above zero");
    assert_eq!(parse_duration("0.0").unwrap_err(), "`0.0`: a duration must be above zero");
}

#[test]
fn each_bad_input_is_one_line_naming_its_option() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--replicas", "0", "--", "true"],
            "invalid value '0' for '--replicas <N,…>': N = 0: a run has 1 to 48 replicas",
        ),
        (
            &["--replicas", "1,49", "--", "true"],
            "invalid value '49' for '--replicas <N,…>': N = 49: a run has 1 to 48 replicas",
        ),
        (
            &["--replicas", "1,x", "--", "true"],
            "invalid value 'x' for '--replicas <N,…>': `x` is not a replica count",
        ),
        (
            &["--objective", "speed", "--", "true"],
            "invalid value 'speed' for '--objective <WHAT>': unknown objective \"speed\" (latency, throughput)",
        ),
        (
            &["--slo", "p50=3ms", "--", "true"],
            "invalid value 'p50=3ms' for '--slo <MEASURE=LIMIT>': SLO \"p50=3ms\": unknown measure `p50` (p99=50ms or slowdown=2)",
        ),
        (
            &["--slo", "slowdown=0.5", "--", "true"],
            "invalid value 'slowdown=0.5' for '--slo <MEASURE=LIMIT>': SLO \"slowdown=0.5\": a slowdown is 1 or more (p99=50ms or slowdown=2)",
        ),
        (
            &["--duration", "soon", "--", "true"],
            "invalid value 'soon' for '--duration <TIME>': `soon` is not a duration (500ms, 1.5s, 30s, 2m, 1h or seconds)",
        ),
        (
            &["--time-limit", "0s", "--", "true"],
            "invalid value '0s' for '--time-limit <TIME>': `0s`: a duration must be above zero",
        ),
        (
            &["--time-limit", "18446744073709551615s", "--", "true"],
            "invalid value '18446744073709551615s' for '--time-limit <TIME>': `18446744073709551615s`: from 1s to 24h",
        ),
        (
            &["--duration", "500ms", "--", "true"],
            "invalid value '500ms' for '--duration <TIME>': `500ms`: from 1s to 1h",
        ),
        (
            &["--duration", "61m", "--", "true"],
            "invalid value '61m' for '--duration <TIME>': `61m`: from 1s to 1h",
        ),
        (
            &["--fleet", "0", "--", "true"],
            "invalid value '0' for '--fleet <K>': 0 is not in 1..=4294967295",
        ),
        (
            &["--histogram", "9lives", "--", "true"],
            "invalid value '9lives' for '--histogram <NAME>': `9lives` is not a Prometheus metric name",
        ),
        (
            &["--builtin", "flops"],
            "invalid value 'flops' for '--builtin <NAME>' [possible values: launch, compute, memory]",
        ),
        (
            &["--duration", "30s", "--until-exit", "--", "true"],
            "the argument '--duration <TIME>' cannot be used with '--until-exit'",
        ),
        (
            &["--histogram", "h", "--until-exit", "--", "true"],
            "the argument '--histogram <NAME>' cannot be used with '--until-exit'",
        ),
        (
            &["--builtin", "compute", "--", "./serve"],
            "the argument '--builtin <NAME>' cannot be used with '[COMMAND]...'",
        ),
        (&[], "the following required arguments were not provided: <--builtin <NAME>|COMMAND>"),
        (
            &["--cpus", "0-3,x", "--", "true"],
            "invalid value '0-3,x' for '--cpus <LIST>': `x` is not a CPU number or range (write them like 0-3,8,10-11)",
        ),
        (
            &["--cpus", "7-4", "--", "true"],
            "invalid value '7-4' for '--cpus <LIST>': `7-4` runs backwards (write the lower number first)",
        ),
        (
            &["--cpus", "0-4096", "--", "true"],
            "invalid value '0-4096' for '--cpus <LIST>': CPU 4096: CPU numbers go up to 4095",
        ),
        (
            &["--cpus", "0--3", "--", "true"],
            "invalid value '0--3' for '--cpus <LIST>': `0--3` is not a CPU number or range (write them like 0-3,8,10-11)",
        ),
        (
            &["--cpus", "1,,2", "--", "true"],
            "invalid value '1,,2' for '--cpus <LIST>': `` is not a CPU number or range (write them like 0-3,8,10-11)",
        ),
        (
            &["--cpus", " ", "--", "true"],
            "invalid value ' ' for '--cpus <LIST>': an empty CPU list (write it like 0-3,8,10-11)",
        ),
        (
            &["--cpus", "0-3", "--no-pin", "--", "true"],
            "the argument '--cpus <LIST>' cannot be used with '--no-pin'",
        ),
    ];
    for (args, expected) in cases {
        assert_eq!(&usage_line(args), expected, "{args:?}");
    }
    // A strategy the bench lacks: clap's sentence, with what gpushare gives it (the
    // option, the word, every strategy's name).
    let line = usage_line(&["--strategies", "mps,fast", "--", "true"]);
    assert!(!line.contains('\n'), "{line}");
    for part in ["--strategies", "'fast'", "time-slicing", "mps", "mps-limited", "mig"] {
        assert!(line.contains(part), "{part} not in {line}");
    }
    // A command without `--` is not taken for one.
    assert!(usage_line(&["./serve"]).starts_with("unexpected argument './serve' found"));
}

/// A caller in `dir` whose PATH is `path`.
fn caller(dir: &Path, path: &str) -> Caller {
    Caller {
        cwd: dir.to_path_buf(),
        environment: vec![
            ("PATH".into(), path.into()),
            ("HOME".into(), "/home/ada".into()),
            // Not UTF-8: left out of the environment sent.
            (std::os::unix::ffi::OsStringExt::from_vec(b"BAD\xff".to_vec()), OsString::from("x")),
        ],
    }
}

/// A scratch directory with an executable `serve`, a plain `notes.txt` and a `sub/`.
fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("gpushare-ctl-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("serve"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(dir.join("serve"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.join("notes.txt"), "x").unwrap();
    dir
}

#[test]
fn programs_are_found_as_a_shell_would() {
    let dir = scratch("find");
    let path = format!("/nonexistent:{}", dir.display());
    let found = find_program("serve", Some(OsStr::new(&path)), Path::new("/")).unwrap();
    assert_eq!(found, dir.join("serve"));
    // Relative to the directory when it names a path.
    assert_eq!(find_program("./serve", None, &dir).unwrap(), dir.join("./serve"));
    // An empty PATH entry is the current directory.
    assert_eq!(
        find_program("serve", Some(OsStr::new("/nonexistent:")), &dir).unwrap(),
        dir.join("serve")
    );
    let message = |program: &str, path: Option<&str>| {
        let e = find_program(program, path.map(OsStr::new), &dir).unwrap_err();
        assert!(e.is(Kind::CommandNotFound), "{e:?}");
        e.message
    };
    assert_eq!(
        message("nope", Some("/usr/bin:/bin")),
        "bench: COMMAND `nope`: not found (PATH=/usr/bin:/bin)"
    );
    assert_eq!(message("notes.txt", Some(".")), "bench: COMMAND `notes.txt`: not found (PATH=.)");
    assert_eq!(message("nope", None), "bench: COMMAND `nope`: not found (PATH is not set)");
    assert_eq!(
        message("./nope", None),
        format!("bench: COMMAND `./nope`: not found (in {})", dir.display())
    );
    assert_eq!(message("./sub", None), "bench: COMMAND `./sub`: is a directory");
    assert_eq!(
        message("./notes.txt", None),
        "bench: COMMAND `./notes.txt`: not executable (mode 644): chmod +x it, or name its interpreter first"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn report_files_must_be_writable_and_are_not_created() {
    let dir = scratch("report");
    check_writable(Path::new("out.html"), &dir).unwrap();
    check_writable(&dir.join("sub/out.html"), Path::new("/")).unwrap();
    assert!(!dir.join("out.html").exists() && !dir.join("sub/out.html").exists());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 3, "no scratch file left");
    let message = |file: &str| {
        let e = check_writable(Path::new(file), &dir).unwrap_err();
        assert!(e.is(Kind::WriteFile), "{e:?}");
        e.message
    };
    assert_eq!(message("sub"), "--report sub: is a directory");
    assert_eq!(
        message("missing/out.html"),
        format!("--report missing/out.html: no directory {}", dir.join("missing").display())
    );
    assert_eq!(message("/"), "--report /: names no file");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reports_are_written_whole() {
    let dir = scratch("atomic");
    let file = dir.join("r.html");
    write_atomically(&file, "<p>one</p>", 0o666).unwrap();
    write_atomically(&file, "<p>two</p>", 0o666).unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "<p>two</p>");
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 4, "no scratch file left: {names:?}");
    assert!(write_atomically(&dir.join("missing/r.html"), "x", 0o666).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn refusals_come_before_anything_is_built() {
    let dir = scratch("prepare");
    let c = caller(&dir, "/usr/bin:/bin");
    let e = prepare(&parse(&["--replicas", "1,3,1", "--", "./serve"]).unwrap(), &c).unwrap_err();
    assert_eq!((e.message.as_str(), e.exit_code), ("--replicas: N = 1 is given twice", 2));
    assert!(e.is(Kind::Usage));
    let e = prepare(&parse(&["--strategies", "mps,mig,mps", "--", "./serve"]).unwrap(), &c)
        .unwrap_err();
    assert_eq!(e.message, "--strategies: mps is given twice");
    let e = prepare(&parse(&["--", "no-such-program-here"]).unwrap(), &c).unwrap_err();
    assert_eq!(e.message, "bench: COMMAND `no-such-program-here`: not found (PATH=/usr/bin:/bin)");
    assert_eq!(e.exit_code, 1);
    let e = prepare(&parse(&["--report", "sub", "--", "./serve"]).unwrap(), &c).unwrap_err();
    assert_eq!(e.message, "--report sub: is a directory");
    // The built-in needs no program.
    let request = prepare(&parse(&["--builtin", "launch"]).unwrap(), &c).unwrap();
    assert!(request.command.is_empty());
    assert_eq!(request.options["builtin"], Value::from("launch"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn only_given_options_are_sent_with_the_callers_directory_and_environment() {
    let dir = scratch("options");
    let c = caller(&dir, "/usr/bin:/bin");
    let request = prepare(&parse(&["--", "./serve", "--port", "0"]).unwrap(), &c).unwrap();
    assert_eq!(request.command, ["./serve", "--port", "0"]);
    let o = &request.options;
    let mut keys: Vec<_> = o.keys().copied().collect();
    keys.sort_unstable();
    assert_eq!(keys, ["cwd", "environment"]);
    assert_eq!(o["cwd"], Value::from(dir.to_str().unwrap()));
    assert_eq!(o["environment"].value_signature().to_string(), "as");
    assert_eq!(
        o["environment"],
        Value::from(vec!["PATH=/usr/bin:/bin".to_owned(), "HOME=/home/ada".to_owned()])
    );

    let args = parse(&[
        "--target",
        "1",
        "--replicas",
        "1,3",
        "--strategies",
        "mps-limited,time-slicing",
        "--duration",
        "1500ms",
        "--objective",
        "latency",
        "--slo",
        " p99=50ms",
        "--histogram",
        "rpc_seconds",
        "--fleet",
        "12",
        "--time-limit",
        "2m",
        "--",
        "./serve",
    ])
    .unwrap();
    let o = options(&args, "/w", vec![]);
    assert_eq!(o.len(), 11);
    let signature = |key: &str| o[key].value_signature().to_string();
    assert_eq!(o["target"], Value::from("1"));
    assert_eq!(
        (o["replicas"].clone(), signature("replicas")),
        (Value::from(vec![1u32, 3]), "au".into())
    );
    assert_eq!(
        o["strategies"],
        Value::from(vec!["mps-limited".to_owned(), "time-slicing".to_owned()])
    );
    assert_eq!(signature("strategies"), "as");
    assert_eq!((o["duration"].clone(), signature("duration")), (Value::from(1.5), "d".into()));
    assert_eq!(o["objective"], Value::from("latency"));
    assert_eq!(o["slo"], Value::from("p99=50ms"));
    assert_eq!(o["histogram"], Value::from("rpc_seconds"));
    assert_eq!((o["fleet"].clone(), signature("fleet")), (Value::from(12u32), "u".into()));
    assert_eq!(
        (o["time_limit"].clone(), signature("time_limit")),
        (Value::from(120.0), "d".into())
    );
    assert_eq!(o["cwd"], Value::from("/w"));
    assert!(!o.contains_key("until_exit"));

    assert!(!o.contains_key("cpus") && !o.contains_key("pin"), "pinned by the agent's default");
    let o = options(&parse(&["--cpus", "0-7, 16-23", "--", "x"]).unwrap(), "/w", vec![]);
    assert_eq!(
        (o["cpus"].clone(), signature_of(&o, "cpus")),
        (Value::from("0-7, 16-23"), "s".into())
    );
    assert!(!o.contains_key("pin"));
    let o = options(&parse(&["--no-pin", "--", "x"]).unwrap(), "/w", vec![]);
    assert_eq!((o["pin"].clone(), signature_of(&o, "pin")), (Value::from(false), "b".into()));
    assert!(!o.contains_key("cpus"));
    let o = options(&parse(&["--until-exit", "--", "x"]).unwrap(), "/w", vec![]);
    assert_eq!(
        (o["until_exit"].clone(), signature_of(&o, "until_exit")),
        (Value::from(true), "b".into())
    );
    assert!(!o.contains_key("duration"));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn signature_of(o: &HashMap<&str, Value<'_>>, key: &str) -> String {
    o[key].value_signature().to_string()
}

#[test]
fn human_report() {
    let text = render_report(&sample_report(), Glyphs::ASCII);
    let expected = "\
Bench of GPU-00000000-0000-0000-0000-000000000000 (GPU 0, NVIDIA A100-SXM4-40GB): ./serve --model 'small files'
Measured: units by line over 30 s windows; objective throughput; SLO p99=50ms
Pinned: 3 CPUs per replica from CPUs 0-15 (NUMA node 0 of the GPU); replica 0: 0-2, replica 1: 3-5, replica 2: 6-8, ..., replica 4: 12-14
Baseline: 1 replica alone: 402 [388-415] units/s, p50 2.41 ms, p99 3.10 [3.00-3.20] ms
Host noise: baseline spread 8.1 %, steal 0.4 %, CPU 2,450-3,100 MHz - differences under 12 % on this host are noise.

time-slicing:
N  UNITS/S            SCALING  P50 MS  P99 MS  P99 x  FAIRNESS  SLOWEST  FAILED  SETUP
1      401 [395-410]    1.00x    2.42    3.10  1.00x     0.999    1.00x       0  1 clients
3      405              1.01x    7.30    9.80  3.16x     0.999    2.98x       0  3 clients
5      404              1.00x    12.2    16.4  5.29x     0.999    4.98x       0  5 clients

mps:
N  UNITS/S                SCALING  P50 MS  P99 MS               P99 x  FAIRNESS  SLOWEST  FAILED  SETUP
1      399                  0.99x    2.43    3.20               1.03x     0.999    1.01x       0  1 clients
3    1,180 [1,120-1,230]    2.93x    2.52    3.40 [3.10-3.60]   1.10x     0.999    1.02x       0  3 × MPS clients
5    1,560                  3.88x    3.90    61.0              19.68x     0.999    1.29x       1  5 clients

mps-limited:
N  UNITS/S            SCALING  P50 MS  P99 MS  P99 x  FAIRNESS  SLOWEST  FAILED  SETUP
1      442 [401-450]   1.10x!    2.44    3.30  1.06x     0.999    1.01x       0  1 clients
3    1,100             2.74x        -    4.40  1.42x     0.999    1.10x       0  MPS, 33 % threads, 13 GiB each
5        -                  -       -       -      -         -        -       -  error: cannot give 5 clients 20 % threads: the MPS server refused
! N=1: 1.10x with 1 replica is above 1, which no sharing gives: the baseline's noise, not a gain

mig: skipped (manage_mig = false)

Intervals [low-high]: 95 % bootstrap interval of the median over 3 measurements

Recommendation (throughput):
N=1: mps-limited - time-slicing, mps and mps-limited within the noise of each other: picked by isolation; throughputs within 12 % of each other, the host's noise
N=3: mps - 2.91x the throughput of time-slicing, p99 0.3x
N=5: mps - 3.86x the throughput of time-slicing; 1 replica failed

Capacity at p99=50ms (a fleet of 100 replicas):
STRATEGY      PER GPU  GPUS  SAVING  WHY
time-slicing        5    20    80 %  p99 16.4 ms at N=5
mps                 3    34    66 %  p99 61 ms at N=5 breaks it

Failed replicas:
mps, N=5, replica 3 (pid 4203): exit 3
    | loading model
    | <script>alert(1)</script>
    | CUDA error: out of memory

The agent's own CPU over a window: 0.40 % of a core at most
Setting up (planned, set up, verified): time-slicing 55 ms, mps 27 ms, mps-limited 30-31 ms

Took 6m52s (estimated 6m30s)
Restored: time-slicing (as before)
Results kept in /home/ada/.local/state/gpushare/bench/bench-1795428900000/report.json
";
    assert_eq!(text, expected, "\n{text}");
    let unicode = render_report(&sample_report(), Glyphs::UNICODE);
    assert!(unicode.contains("P99 ×") && unicode.contains("N=3: mps — 2.91x"), "{unicode}");
    for ranged in ["1,180 [1,120–1,230]", "3.40 [3.10–3.60]", "CPU 2,450–3,100 MHz — differences"]
    {
        assert!(unicode.contains(ranged), "{ranged}: {unicode}");
    }
    assert!(unicode.contains("replica 2: 6-8, …, replica 4: 12-14\n"), "{unicode}");
    assert!(unicode.contains("Intervals [low–high]: 95 % bootstrap"), "{unicode}");
    // No figure of the table spills past 100 columns (the setup's words may).
    for line in text.lines().filter(|l| l.starts_with(|c: char| c.is_ascii_digit())) {
        let setup = line.rfind("  ").unwrap();
        assert!(setup <= 100, "{line}");
    }
}

#[test]
fn repeated_runs_show_their_spread_and_a_noisy_baseline_a_note() {
    // As an agent before issue 27 reports them: no intervals, so a SPREAD column.
    let mut r = older_report();
    r.repeat = 3;
    let baseline = r.baseline.as_mut().unwrap();
    baseline.repeat_throughputs_per_s = vec![402.0, 300.0, 450.0];
    r.strategies[1].runs[1].repeat_throughputs_per_s = vec![1180.0, 1100.0, 1210.0];
    let text = render_report(&r, Glyphs::ASCII);
    assert!(
        text.contains(
            "; 3 rounds: each run measured once a round, its median reported with its interval\n"
        ),
        "{text}"
    );
    // Nothing said of pinning, noise or an estimate that the agent did not report.
    assert!(!text.contains("inned") && !text.contains("Host noise") && !text.contains("Intervals"));
    assert!(text.contains("\nTook 6m52s\nRestored: "), "{text}");
    assert!(
        text.contains("Baseline: 1 replica alone: 402 units/s (median of 3, 300-450), p50 2.41 ms"),
        "{text}"
    );
    assert!(
        text.contains("Note: one replica alone varied by 50 % between its measurements"),
        "{text}"
    );
    assert!(text.contains("a longer --duration or a quieter host"), "{text}");
    // The spread column in the tables of repeated runs only; "-" for a run measured once.
    assert!(text.contains("N  UNITS/S  SPREAD  SCALING"), "{text}");
    assert!(text.contains("3    1,180    10 %    2.93x"), "{text}");
    assert!(text.contains("1      399       -    0.99x"), "{text}");
    assert!(!text.contains("time-slicing:\nN  UNITS/S  SPREAD"), "{text}");

    // A steady baseline gets no note; one measured less than 3 times suggests --repeat.
    r.baseline.as_mut().unwrap().repeat_throughputs_per_s = vec![402.0, 390.0, 410.0];
    assert!(!render_report(&r, Glyphs::ASCII).contains("Note:"));
    r.repeat = 1;
    r.baseline.as_mut().unwrap().repeat_throughputs_per_s = vec![402.0, 300.0, 450.0];
    assert!(render_report(&r, Glyphs::ASCII).contains("--repeat 3 (or more)"));

    // Run to completion: runs a second, and no --duration to lengthen.
    r.method = "until-exit".into();
    r.window_seconds = None;
    let text = render_report(&r, Glyphs::ASCII);
    assert!(
        text.contains("Baseline: 1 replica alone: 402 runs/s (median of 3, 300-450)"),
        "{text}"
    );
    assert!(text.contains("N  RUNS/S  SPREAD  SCALING") && !text.contains("units/s"), "{text}");
    assert!(text.contains("; --repeat 3 (or more) gives steadier ratios"), "{text}");
    assert!(!text.contains("--duration"), "{text}");
}

#[test]
fn pinning_is_shown_as_the_agent_did_it() {
    let mut r = sample_report();
    let pinning = r.pinning.as_mut().unwrap();
    pinning.replicas.truncate(4);
    pinning.cpus_per_replica = 1;
    pinning.from = "--cpus".into();
    pinning.cpus = "8-11".into();
    pinning.replicas = ["8", "9", "10", "11"].map(String::from).to_vec();
    let text = render_report(&r, Glyphs::ASCII);
    assert!(
        text.contains(
            "\nPinned: 1 CPU per replica from CPUs 8-11 (--cpus); replica 0: 8, replica 1: 9, replica 2: 10, replica 3: 11\nBaseline: "
        ),
        "{text}"
    );
    // --no-pin; an agent before pinning says nothing of it.
    r.pinning = None;
    let text = render_report(&r, Glyphs::ASCII);
    assert!(text.contains("SLO p99=50ms\nNot pinned (--no-pin)\nBaseline: "), "{text}");
    assert!(!render_report(&older_report(), Glyphs::ASCII).contains("pinned"));
    // The default replica counts the host's CPUs could not pin, as the agent says it.
    r.capped = "N=7 left out: 16 CPUs pin at most 5 replicas of 3 CPUs".into();
    let text = render_report(&r, Glyphs::ASCII);
    assert!(
        text.contains(
            "Not pinned (--no-pin)\nNote: N=7 left out: 16 CPUs pin at most 5 replicas of 3 CPUs\nBaseline: "
        ),
        "{text}"
    );
}

#[test]
fn the_hosts_noise_is_one_line_with_what_it_means() {
    let mut r = sample_report();
    let noise = r.noise.as_mut().unwrap();
    noise.baseline_p99_spread = Some(0.153);
    noise.meaning = "differences in throughput under 12 % on this host are noise: one replica alone varied that much over 3 measurements.".into();
    let text = render_report(&r, Glyphs::ASCII);
    assert!(
        text.contains(
            "\nHost noise: baseline spread 8.1 % (p99 15.3 %), steal 0.4 %, CPU 2,450-3,100 MHz - differences in throughput under 12 % on this host are noise: one replica alone varied that much over 3 measurements.\n"
        ),
        "one full stop: {text}"
    );
    // What the host does not say is left out; a steady clock is one figure.
    let noise = r.noise.as_mut().unwrap();
    (noise.baseline_spread, noise.steal_percent) = (None, None);
    noise.frequency_mhz = Some([2900.0, 2900.0, 2900.2]);
    noise.meaning =
        "the baseline was measured fewer than twice, so differences under 2 % are called noise"
            .into();
    let text = render_report(&r, Glyphs::ASCII);
    assert!(
        text.contains(
            "\nHost noise: CPU 2,900 MHz - the baseline was measured fewer than twice, so differences under 2 % are called noise.\n"
        ),
        "{text}"
    );
    r.noise.as_mut().unwrap().frequency_mhz = None;
    let text = render_report(&r, Glyphs::ASCII);
    assert!(text.contains("\nHost noise: the baseline was measured fewer than twice"), "{text}");
}

#[test]
fn strategies_the_measurements_cannot_tell_apart_are_said_to_be_so_once() {
    let mut r = sample_report();
    let text = render_report(&r, Glyphs::ASCII);
    let line = text.lines().find(|l| l.starts_with("N=1: ")).unwrap();
    assert_eq!(
        line,
        "N=1: mps-limited - time-slicing, mps and mps-limited within the noise of each other: picked by isolation; throughputs within 12 % of each other, the host's noise"
    );
    // Where the agent's reason says it already, it is not said twice.
    r.recommendations[0].reason =
        "indistinguishable here from time-slicing and mps (intervals overlap); mps-limited isolates best".into();
    r.recommendations[0].indistinguishable = vec!["mps-limited".into(), "mps".into()];
    let text = render_report(&r, Glyphs::ASCII);
    assert!(
        text.contains("\nN=1: mps-limited - indistinguishable here from time-slicing and mps (intervals overlap); mps-limited isolates best\n"),
        "{text}"
    );
    assert_eq!(text.matches("indistinguishable").count(), 1, "{text}");
    // A pick by the figures says nothing of ties.
    assert!(!text.contains("cannot tell"), "{text}");
}

#[test]
fn a_scaling_above_n_is_marked_and_said_under_its_table() {
    let mut r = sample_report();
    let run = &mut r.strategies[1].runs[1];
    run.scaling = Some(3.4);
    run.scaling_warning = Some("3.40x with 3 replicas is above 3: the baseline's noise".into());
    let text = render_report(&r, Glyphs::ASCII);
    let mps = &text[text.find("\nmps:\n").unwrap()..text.find("\nmps-limited:\n").unwrap()];
    assert!(mps.contains("\n3    1,180 [1,120-1,230]   3.40x!    2.52"), "{mps}");
    assert!(mps.contains("\n1      399                 0.99x     2.43"), "aligned: {mps}");
    assert!(
        mps.ends_with("\n! N=3: 3.40x with 3 replicas is above 3: the baseline's noise\n"),
        "{mps}"
    );
    // A run that failed to set up has no figures to flag.
    r.strategies[2].runs[2].scaling_warning = Some("never shown".into());
    assert!(!render_report(&r, Glyphs::ASCII).contains("never shown"));
}

#[test]
fn intervals_replace_the_spread_and_are_explained_once() {
    let mut r = sample_report();
    r.repeat = 3;
    r.strategies[1].runs[1].repeat_throughputs_per_s = vec![1180.0, 1100.0, 1210.0];
    let text = render_report(&r, Glyphs::ASCII);
    assert!(!text.contains("SPREAD"), "{text}");
    assert_eq!(text.matches("Intervals [low-high]:").count(), 1, "{text}");
    // Without any interval in the runs, no footnote.
    let mut r = older_report();
    r.intervals = "95 % bootstrap interval of the median over 3 measurements".into();
    assert!(!render_report(&r, Glyphs::ASCII).contains("Intervals"));
}

#[test]
fn the_footer_has_the_time_taken_and_the_estimate() {
    let mut r = sample_report();
    (r.wall_seconds, r.estimate_seconds) = (19.4, Some(21.0));
    assert!(render_report(&r, Glyphs::ASCII).contains("\nTook 19s (estimated 21s)\nRestored: "));
    (r.wall_seconds, r.estimate_seconds) = (3725.0, None);
    assert!(render_report(&r, Glyphs::ASCII).contains("\nTook 1h02m\nRestored: "));
}

#[test]
fn human_report_of_a_bench_with_nothing_measured() {
    let mut r = sample_report();
    r.baseline = None;
    r.method = "until-exit".into();
    r.window_seconds = None;
    r.slo = None;
    r.capacity.clear();
    r.recommendations.clear();
    for s in &mut r.strategies {
        s.runs.clear();
    }
    let text = render_report(&r, Glyphs::ASCII);
    assert!(
        text.contains(
            "Measured: each replica's wall time to its exit; objective throughput\nPinned: "
        ),
        "{text}"
    );
    assert!(text.contains("replica 4: 12-14\nBaseline: none\nHost noise: "), "{text}");
    assert!(text.contains("\nmps:\nno runs\n"), "{text}");
    assert!(
        !text.contains("Recommendation") && !text.contains("Capacity") && !text.contains("Failed"),
        "{text}"
    );
}

#[test]
fn histogram_method_names_the_histogram() {
    let mut r = sample_report();
    r.method = "histogram".into();
    r.histogram = Some("request_duration_seconds".into());
    assert_eq!(method_line(&r), "histogram request_duration_seconds over 30 s windows");
}

#[test]
fn figures_have_three_significant_digits() {
    for (value, text) in [
        (0.0, "0"),
        (0.041234, "0.0412"),
        (2.4149, "2.41"),
        (41.25, "41.2"),
        (412.3, "412"),
        (23_810.4, "23,810"),
    ] {
        assert_eq!(figure(value), text, "{value}");
    }
}

fn outcome(ok: bool, bench: Option<BenchReport>) -> JobOutcome {
    JobOutcome {
        ok,
        profile: String::new(),
        changed: false,
        steps_done: 0,
        steps_total: 0,
        duration_seconds: 12.0,
        error_name: (!ok).then(|| "io.gpushare.Agent1.Error.Failed".into()),
        error: (!ok).then(|| "cancelled".into()),
        warnings: vec![],
        probe: None,
        bench,
        private: false,
    }
}

#[test]
fn outcomes_become_errors_when_failed_even_with_a_partial_report() {
    assert!(failure_of(&outcome(true, Some(sample_report()))).is_ok());
    let e = failure_of(&outcome(false, Some(sample_report()))).unwrap_err();
    assert_eq!(
        (e.name.as_str(), e.message.as_str()),
        ("io.gpushare.Agent1.Error.Failed", "cancelled")
    );
    let mut o = outcome(false, None);
    (o.error, o.error_name) = (None, None);
    let e = failure_of(&o).unwrap_err();
    assert!(e.is(Kind::Failed));
    assert_eq!(e.message, "the bench failed");
    assert!(failure_of(&outcome(true, None)).unwrap_err().is(Kind::BadReply));
}

#[test]
fn json_is_the_report_document() {
    let value = serde_json::to_value(sample_report()).unwrap();
    assert_eq!(value["strategies"][3]["skipped"], "manage_mig = false");
    assert!(value["strategies"][0].get("skipped").is_none());
    // Issue 27's fields come through as the agent sent them.
    assert_eq!(value["pinning"]["replicas"][1], "3-5");
    assert_eq!(value["noise"]["frequency_mhz"][2], 3100.0);
    assert_eq!(value["estimate_seconds"], 390.0);
    assert_eq!(value["sequence"][2]["strategy"], "mps");
    assert_eq!(value["strategies"][1]["runs"][1]["throughput_interval"][0], 1120.0);
    assert_eq!(value["recommendations"][0]["indistinguishable"][2], "mps-limited");
    assert!(value["intervals"].as_str().unwrap().starts_with("95 % bootstrap"));
    // An older agent's report reads, without them.
    let older = serde_json::to_value(older_report()).unwrap();
    assert!(older.get("pinning").is_none() && older.get("sequence").is_none());
    let back: BenchReport = serde_json::from_value(older.clone()).unwrap();
    assert_eq!(serde_json::to_value(back).unwrap(), older);
    // Read back, it writes the same document (serde_json reads floats to within an ulp).
    let back: BenchReport = serde_json::from_value(value.clone()).unwrap();
    assert_eq!(serde_json::to_value(back).unwrap(), value);
}

#[test]
fn a_bench_gets_a_log_directory_of_the_callers_and_the_newest_ten_are_kept() {
    let state = tempfile::tempdir().unwrap();
    let caller = Caller {
        cwd: state.path().to_path_buf(),
        environment: vec![("XDG_STATE_HOME".into(), state.path().into())],
    };
    let root = state.path().join("gpushare/bench");
    std::fs::create_dir_all(&root).unwrap();
    for stamp in 1..=12 {
        std::fs::create_dir(root.join(format!("bench-{stamp}"))).unwrap();
    }
    std::fs::create_dir(root.join("mine")).unwrap();
    let logs = LogDir::make(None, &caller).unwrap();
    assert!(logs.path.starts_with(&root), "{:?}", logs.path);
    assert_eq!(std::fs::metadata(&logs.path).unwrap().permissions().mode() & 0o777, 0o700);
    let mut left: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    // The 9 newest old ones and the new one; what is not a bench-<ms> stays.
    assert_eq!(left.len(), 11, "{left:?}");
    assert!(left.contains(&"mine".to_string()) && !left.contains(&"bench-3".to_string()));
    assert!(left.contains(&"bench-4".to_string()), "{left:?}");
    // The report is the caller's alone.
    let file = logs.keep_report(&sample_report()).unwrap();
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    // A directory named with --logs is made, relative to the caller's, and never cleaned.
    let given = LogDir::make(Some(Path::new("here/logs")), &caller).unwrap();
    assert_eq!(given.path, state.path().join("here/logs"));
    let none = Caller { cwd: "/".into(), environment: Vec::new() };
    let e = LogDir::make(None, &none).unwrap_err();
    assert!(e.message.contains("give --logs DIR"), "{}", e.message);
    // A directory others may write in is nobody's private place.
    let shared = state.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let e = LogDir::make(Some(Path::new("shared")), &caller).unwrap_err();
    assert!(e.message.contains("others may write in it (mode 1777)"), "{}", e.message);
}

#[test]
fn a_partial_report_says_so_under_its_header() {
    let mut r = sample_report();
    r.partial = "cancelled after 1 of 3 whole rounds and 7 measurements: the figures below are of those alone".into();
    r.plan = vec![
        "Will measure: the baseline (1 replica alone) 3 times, then mps at 3 in 1 round: 4 measurements".into(),
        "Left out: 5, 7 replicas: 2 CPUs to pin one replica each".into(),
    ];
    let text = render_report(&r, Glyphs::ASCII);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[2].starts_with("Partial: cancelled after 1 of 3 whole rounds"), "{text}");
    assert!(text.contains("\nLeft out: 5, 7 replicas: 2 CPUs"), "{text}");
    assert!(!text.contains("Will measure"), "said before measuring, not again: {text}");
}
