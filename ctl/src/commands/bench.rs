//! `gpushare-ctl bench [--target GPU|MIG-UUID] [--replicas 1,3,5,7] [--strategies …]
//! [--duration 30s | --until-exit] [--objective latency|throughput] [--slo p99=50ms]
//! [--histogram NAME] [--builtin launch|compute|memory] [--fleet K] [--time-limit 10m]
//! [--repeat K] [--cpus LIST | --no-pin] [--report FILE.html] -- COMMAND [ARGS...]`: starts a bench job (`Bench`) and follows it
//! like a probe, then prints which strategy wins at each replica count:
//!
//! ```text
//! Bench of GPU-00000000-… (GPU 0, NVIDIA H100 80GB HBM3): ./serve --model small
//! Measured: units by line over 30 s windows; objective throughput; 3 rounds: each run measured once a round, its median reported with its interval
//! Pinned: 2 CPUs per replica from CPUs 0-15 (NUMA node 0 of the GPU); replica 0: 0-1, replica 1: 2-3, …
//! Baseline: 1 replica alone: 402 [388–415] units/s, p50 2.41 ms, p99 3.10 ms
//! Host noise: one measurement varies 3.1 %, steal 0.4 %, CPU 2,450–3,100 MHz — … between runs measured 3 times each, differences under 8 % are within the noise.
//!
//! mps:
//! N  UNITS/S                SCALING  P50 MS  P99 MS  P99 x  FAIRNESS  SLOWEST  FAILED  SETUP
//! 1      399                  0.99x    2.43    3.20  1.03x     0.999    1.01x       0  MPS, 1 client
//! 3    1,180 [1,120–1,230]    2.94x    2.52    3.40  1.10x     0.999    1.03x       0  MPS, 3 clients
//!
//! mig: skipped (manage_mig = false)
//!
//! Intervals [low–high]: 95 % bootstrap interval of the median over 3 measurements
//!
//! Recommendation (throughput):
//! N=3: mps — 2.94x the throughput of time-slicing, p99 1.1x worse
//!
//! Took 6m52s (estimated 6m30s)
//! ```
//!
//! Nothing is sent before the command line has been checked through: the program must
//! exist and be executable here, and the `--report` file's directory writable ("refuse
//! before touching"). Only the options given are sent, plus the caller's directory and
//! environment, which the replicas run with, and the log directory ([`LogDir`]), made here
//! as the caller, where the replicas write their output and this command `report.json`.
//! With `--json` the [`BenchReport`] alone is printed, or the JSON error object when the
//! bench failed. Ctrl-C cancels the bench ([`OnInterrupt::Cancel`]); what was measured
//! before it is printed, under a `Partial:` line. What the bench will run and leave out
//! comes first, as progress lines from the agent, before its first measurement.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::{Path, PathBuf};

use gpushare_proto::bench::{
    BENCH_BUILTIN, BENCH_CPUS, BENCH_CWD, BENCH_DURATION, BENCH_ENVIRONMENT, BENCH_FLEET,
    BENCH_HISTOGRAM, BENCH_LOGS, BENCH_OBJECTIVE, BENCH_PIN, BENCH_REPEAT, BENCH_REPLICAS,
    BENCH_SLO, BENCH_STRATEGIES, BENCH_TARGET, BENCH_TIME_LIMIT, BENCH_UNTIL_EXIT, BenchCapacity,
    BenchReport, BenchRun, Method, find_command,
};
use gpushare_proto::types::JobOutcome;
use zbus::zvariant::Value;

use super::ExitStatus;
use crate::bus::Client;
use crate::cli::BenchArgs;
use crate::error::{CtlError, Kind};
use crate::job::{OnInterrupt, start_and_follow_with};
use crate::output::{Glyphs, Output, parse_document, plural, thousands};
use crate::report_html;
use crate::report_html::text::{self as report_text, command_line};
use crate::table::Columns;

/// What the first Ctrl-C during a bench prints on stderr.
pub const CANCEL_NOTICE: &str = "cancelling: stopping the replicas and restoring the sharing (Ctrl-C again to leave it to the agent)";

/// How many lines of a failed replica's stderr the text output shows.
const STDERR_LINES: usize = 5;

/// Runs `bench`.
pub async fn run(
    client: &mut Client,
    out: &Output,
    args: &BenchArgs,
) -> Result<ExitStatus, CtlError> {
    let caller = Caller::current()?;
    let mut request = prepare(args, &caller)?;
    let logs = LogDir::make(args.logs.as_deref(), &caller)?;
    request.options.insert(BENCH_LOGS, Value::from(logs.text()?));
    let command: Vec<&str> = request.command.iter().map(String::as_str).collect();
    let notice = OnInterrupt::Cancel { notice: CANCEL_NOTICE };
    let started = start_and_follow_with(client, out, "Bench", "bench", notice, async |a| {
        a.proxy.bench(&command, request.options.clone()).await
    })
    .await;
    let raw = match started {
        Ok(raw) => raw,
        Err(e) => {
            logs.forget_if_empty();
            return Err(e);
        }
    };
    let mut outcome: JobOutcome = parse_document(&raw, "JobOutcome")?;
    for warning in &outcome.warnings {
        out.warn(warning);
    }
    if let Some(report) = outcome.bench.as_mut() {
        match logs.keep_report(report) {
            Ok(file) => report.saved_to = file.display().to_string(),
            Err(e) => out.warn(&format!("the report was not kept: {e}")),
        }
    }
    let report = outcome.bench.as_ref();
    // What was measured is shown even when the bench failed part-way (not with --json:
    // one object, the error).
    if let Some(report) = report {
        if !out.json {
            out.print(&render_report(report, out.glyphs()));
        } else if outcome.ok {
            let json = serde_json::to_string_pretty(report).map_err(|e| {
                CtlError::ctl(Kind::Failed, format!("cannot write the bench report as JSON: {e}"))
            })?;
            out.print(&json);
        }
        if let Some(path) = &args.report {
            // It holds the command line and the replicas' output tails: the caller's alone.
            write_atomically(path, &report_html::render(report), 0o600).map_err(|e| {
                CtlError::ctl(
                    Kind::WriteFile,
                    format!("cannot write the report {}: {e}", path.display()),
                )
            })?;
            eprintln!("report: {}", path.display());
        }
    }
    failure_of(&outcome)?;
    Ok(0)
}

/// What `Bench` is called with: the command and the options.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The command line of the replicas; empty with `--builtin`.
    pub command: Vec<String>,
    /// The options of `Bench`.
    pub options: HashMap<&'static str, Value<'static>>,
}

/// Where and as what ctl runs: what the replicas inherit and the program is looked up in.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The current directory.
    pub cwd: PathBuf,
    /// The environment, in order.
    pub environment: Vec<(OsString, OsString)>,
}

impl Caller {
    /// This process's directory and environment.
    pub fn current() -> Result<Self, CtlError> {
        let cwd = std::env::current_dir().map_err(|e| {
            CtlError::ctl(Kind::Failed, format!("bench: cannot read the current directory: {e}"))
        })?;
        Ok(Self { cwd, environment: std::env::vars_os().collect() })
    }

    /// `PATH`, if set.
    fn path(&self) -> Option<&OsStr> {
        self.environment.iter().find(|(name, _)| name == "PATH").map(|(_, v)| v.as_os_str())
    }

    /// The environment as `NAME=value`, leaving out what is not UTF-8.
    fn environment_strings(&self) -> Vec<String> {
        let utf8 = |(name, value): &(OsString, OsString)| {
            Some(format!("{}={}", name.to_str()?, value.to_str()?))
        };
        self.environment.iter().filter_map(utf8).collect()
    }
}

/// Checks what the command line asks for against this machine, touching nothing, and
/// builds the call: duplicates in the lists, the program, the report's directory, the
/// directory the replicas run in.
pub fn prepare(args: &BenchArgs, caller: &Caller) -> Result<Request, CtlError> {
    if let Some(n) = first_repeated(&args.replicas) {
        return Err(usage(format!("--replicas: N = {n} is given twice")));
    }
    if let Some(s) = first_repeated(&args.strategies) {
        return Err(usage(format!("--strategies: {s} is given twice")));
    }
    if let Some(program) = args.command.first() {
        find_program(program, caller.path(), &caller.cwd)?;
    }
    if let Some(report) = &args.report {
        check_writable(report, &caller.cwd)?;
    }
    let cwd = caller.cwd.to_str().ok_or_else(|| {
        CtlError::ctl(
            Kind::Failed,
            format!(
                "bench: the current directory {} is not UTF-8: the agent cannot be told to run the replicas there",
                caller.cwd.display()
            ),
        )
    })?;
    Ok(Request {
        command: args.command.clone(),
        options: options(args, cwd, caller.environment_strings()),
    })
}

/// The options of `Bench`: those given on the command line, the replicas' directory and
/// environment.
pub fn options(
    args: &BenchArgs,
    cwd: &str,
    environment: Vec<String>,
) -> HashMap<&'static str, Value<'static>> {
    let mut options = HashMap::from([
        (BENCH_CWD, Value::from(cwd.to_owned())),
        (BENCH_ENVIRONMENT, Value::from(environment)),
    ]);
    if let Some(target) = &args.target {
        options.insert(BENCH_TARGET, Value::from(target.clone()));
    }
    if !args.replicas.is_empty() {
        options.insert(BENCH_REPLICAS, Value::from(args.replicas.clone()));
    }
    if !args.strategies.is_empty() {
        let names: Vec<String> = args.strategies.iter().map(|s| s.as_str().to_owned()).collect();
        options.insert(BENCH_STRATEGIES, Value::from(names));
    }
    if let Some(seconds) = args.duration {
        options.insert(BENCH_DURATION, Value::from(seconds));
    }
    if args.until_exit {
        options.insert(BENCH_UNTIL_EXIT, Value::from(true));
    }
    if let Some(objective) = args.objective {
        options.insert(BENCH_OBJECTIVE, Value::from(objective.as_str().to_owned()));
    }
    if let Some(slo) = &args.slo {
        options.insert(BENCH_SLO, Value::from(slo.written.clone()));
    }
    if let Some(histogram) = &args.histogram {
        options.insert(BENCH_HISTOGRAM, Value::from(histogram.clone()));
    }
    if let Some(builtin) = args.builtin {
        options.insert(BENCH_BUILTIN, Value::from(builtin.workload().as_str().to_owned()));
    }
    if let Some(fleet) = args.fleet {
        options.insert(BENCH_FLEET, Value::from(fleet));
    }
    if let Some(seconds) = args.time_limit {
        options.insert(BENCH_TIME_LIMIT, Value::from(seconds));
    }
    if let Some(repeat) = args.repeat {
        options.insert(BENCH_REPEAT, Value::from(repeat));
    }
    if let Some(cpus) = &args.cpus {
        options.insert(BENCH_CPUS, Value::from(cpus.clone()));
    }
    if args.no_pin {
        options.insert(BENCH_PIN, Value::from(false));
    }
    options
}

/// How many `bench-*` directories of the default place are kept (the newest).
pub const LOG_DIRS_KEPT: usize = 10;

/// The directory of one bench's output, the caller's: `--logs DIR`, or a new
/// `bench-<ms>` under `${XDG_STATE_HOME:-~/.local/state}/gpushare/bench`, made with mode
/// 0700 as the caller. Of the default place's `bench-*` directories the newest
/// [`LOG_DIRS_KEPT`] are kept: older ones are removed when a new one is made. A directory
/// given with `--logs` is never removed.
#[derive(Debug)]
pub struct LogDir {
    /// The directory (absolute).
    pub path: PathBuf,
    /// Whether ctl made it for this bench (and may remove it when the bench never ran).
    made: bool,
}

impl LogDir {
    /// Makes (or takes) the directory of this bench.
    pub fn make(given: Option<&Path>, caller: &Caller) -> Result<LogDir, CtlError> {
        use std::os::unix::fs::DirBuilderExt;
        let refuse = |path: &Path, e: std::io::Error| {
            CtlError::ctl(
                Kind::WriteFile,
                format!(
                    "bench: cannot make the log directory {}: {e}; give --logs DIR",
                    path.display()
                ),
            )
        };
        if let Some(dir) = given {
            let path = caller.cwd.join(dir);
            let made = !path.exists();
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&path)
                .map_err(|e| refuse(&path, e))?;
            private_directory(&path)?;
            return Ok(LogDir { path, made });
        }
        let root = default_log_root(&caller.environment).ok_or_else(|| {
            CtlError::ctl(
                Kind::WriteFile,
                "bench: neither XDG_STATE_HOME nor HOME is set: give --logs DIR for the replicas' output",
            )
        })?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)
            .map_err(|e| refuse(&root, e))?;
        remove_old_log_dirs(&root, LOG_DIRS_KEPT - 1);
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let path = root.join(format!("bench-{stamp}"));
        std::fs::DirBuilder::new().mode(0o700).create(&path).map_err(|e| refuse(&path, e))?;
        private_directory(&path)?;
        Ok(LogDir { path, made: true })
    }

    /// The directory as the `logs` option sends it.
    fn text(&self) -> Result<String, CtlError> {
        self.path.to_str().map(str::to_owned).ok_or_else(|| {
            CtlError::ctl(
                Kind::WriteFile,
                format!(
                    "bench: the log directory {} is not UTF-8; give --logs DIR",
                    self.path.display()
                ),
            )
        })
    }

    /// Removes the directory ctl made when nothing came into it (the bench was refused).
    fn forget_if_empty(&self) {
        if self.made {
            let _ = std::fs::remove_dir(&self.path);
        }
    }

    /// Writes `report` as `report.json` into the directory (mode 0600); its path.
    fn keep_report(&self, report: &BenchReport) -> std::io::Result<PathBuf> {
        let file = self.path.join("report.json");
        let text = serde_json::to_string_pretty(report).map_err(std::io::Error::other)?;
        write_atomically(&file, &text, 0o600)?;
        Ok(file)
    }
}

/// Refuses a log directory that is not the caller's alone: another user's, a link, or
/// one others may write in (a file prepared there could hand them the replicas' output).
fn private_directory(dir: &Path) -> Result<(), CtlError> {
    use std::os::unix::fs::MetadataExt;
    let refuse = |why: String| {
        CtlError::ctl(Kind::WriteFile, format!("bench: the log directory {}: {why}", dir.display()))
    };
    let meta = std::fs::symlink_metadata(dir).map_err(|e| refuse(e.to_string()))?;
    // /proc/self is owned by this process's effective user.
    let me = std::fs::metadata("/proc/self").map(|m| m.uid()).map_err(|e| refuse(e.to_string()))?;
    if !meta.is_dir() {
        return Err(refuse("not a directory (a link?); give --logs DIR".into()));
    }
    if meta.uid() != me {
        return Err(refuse(format!("uid {}'s, not yours; give --logs DIR", meta.uid())));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(refuse(format!(
            "others may write in it (mode {:o}): chmod go-w it, or give another",
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

/// `${XDG_STATE_HOME:-$HOME/.local/state}/gpushare/bench` of `environment`.
fn default_log_root(environment: &[(OsString, OsString)]) -> Option<PathBuf> {
    let var = |name: &str| {
        environment
            .iter()
            .find(|(k, v)| k == name && !v.is_empty())
            .map(|(_, v)| PathBuf::from(v))
            .filter(|p| p.is_absolute())
    };
    let state = var("XDG_STATE_HOME").or_else(|| var("HOME").map(|h| h.join(".local/state")))?;
    Some(state.join("gpushare").join("bench"))
}

/// Removes the oldest `bench-<ms>` directories of `root` beyond the newest `keep`.
fn remove_old_log_dirs(root: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    let mut dirs: Vec<(u128, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let stamp = e.file_name().to_str()?.strip_prefix("bench-")?.parse().ok()?;
            Some((stamp, e.path()))
        })
        .collect();
    dirs.sort();
    let extra = dirs.len().saturating_sub(keep);
    for (_, dir) in dirs.into_iter().take(extra) {
        // remove_dir_all does not follow symbolic links inside.
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A usage error of ctl's own (exit status 2).
fn usage(message: String) -> CtlError {
    CtlError::ctl(Kind::Usage, message).with_exit_code(2)
}

/// The first item given a second time.
fn first_repeated<T: Eq + std::hash::Hash + Copy>(items: &[T]) -> Option<T> {
    let mut seen = HashSet::new();
    items.iter().copied().find(|item| !seen.insert(*item))
}

/// The file a shell would run for `program` (see [`find_command`]); refused as
/// `CommandNotFound` in one line.
pub fn find_program(program: &str, path: Option<&OsStr>, cwd: &Path) -> Result<PathBuf, CtlError> {
    find_command(program, path, cwd).map_err(|why| {
        CtlError::ctl(Kind::CommandNotFound, format!("bench: COMMAND `{program}`: {why}"))
    })
}

/// Checks that `file` (relative to `cwd`) can be written later: its directory exists and
/// takes a new file (tried with a scratch file, removed at once), and it is not a directory.
/// The file itself is not created.
pub fn check_writable(file: &Path, cwd: &Path) -> Result<(), CtlError> {
    let refuse =
        |why: String| CtlError::ctl(Kind::WriteFile, format!("--report {}: {why}", file.display()));
    let (dir, name) = split_file(file, cwd).ok_or_else(|| refuse("names no file".into()))?;
    if !dir.is_dir() {
        return Err(refuse(format!("no directory {}", dir.display())));
    }
    if cwd.join(file).is_dir() {
        return Err(refuse("is a directory".into()));
    }
    let scratch = dir.join(format!(".{}.{}.check", name.to_string_lossy(), std::process::id()));
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&scratch) {
        Ok(_) => {
            let _ = std::fs::remove_file(&scratch);
            Ok(())
        }
        Err(e) => Err(refuse(format!("cannot write in {}: {e}", dir.display()))),
    }
}

/// The directory (relative to `cwd`) and the name of a file.
fn split_file(file: &Path, cwd: &Path) -> Option<(PathBuf, OsString)> {
    let name = file.file_name()?.to_owned();
    let dir = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => cwd.join(p),
        _ => cwd.to_path_buf(),
    };
    Some((dir, name))
}

/// Writes `contents` to `file` as a whole or not at all: into a scratch file beside it
/// (created anew, `O_EXCL`: a link planted under its name is not followed), then renamed
/// over it (a link at `file` is replaced, never followed). The file gets `mode` (less the
/// umask), also where it replaces one of other permissions.
pub fn write_atomically(file: &Path, contents: &str, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let cwd = std::env::current_dir()?;
    let (dir, name) = split_file(file, &cwd).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path names no file")
    })?;
    let scratch = dir.join(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    let written = (|| {
        let mut f =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&scratch)?;
        f.write_all(contents.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&scratch, dir.join(&name))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&scratch);
    }
    written
}

/// The failure of a bench job, if it failed.
pub fn failure_of(outcome: &JobOutcome) -> Result<(), CtlError> {
    if !outcome.ok {
        let message = outcome.error.clone().unwrap_or_else(|| "the bench failed".into());
        return Err(match &outcome.error_name {
            Some(name) => CtlError::new(name.clone(), message),
            None => CtlError::ctl(Kind::Failed, message),
        });
    }
    if outcome.bench.is_none() {
        return Err(CtlError::ctl(
            Kind::BadReply,
            "the bench job finished without a report; are gpushare-ctl and gpushare-agent the same version?",
        ));
    }
    Ok(())
}

/// A figure with three significant digits (`0.0412`, `2.41`, `41.2`, `412`), whole and
/// with thousands separators from 1000 on (`23,810`).
pub fn figure(value: f64) -> String {
    if !value.is_finite() {
        return format!("{value}");
    }
    let magnitude = value.abs();
    if magnitude >= 100.0 || magnitude == 0.0 {
        return thousands(value);
    }
    let decimals = (2.0 - magnitude.log10().floor()).clamp(0.0, 6.0) as usize;
    format!("{value:.decimals$}")
}

/// `2.94x`, or `-` when unknown.
fn times(value: Option<f64>) -> String {
    value.map_or("-".into(), |x| format!("{x:.2}x"))
}

/// `1.240`, or `-`.
fn fairness(value: Option<f64>) -> String {
    value.map_or("-".into(), |x| format!("{x:.3}"))
}

/// A figure, or `-`.
fn maybe_figure(value: Option<f64>) -> String {
    value.map_or("-".into(), figure)
}

/// How the replicas were measured, in words: `units by line over 30 s windows`.
pub fn method_line(report: &BenchReport) -> String {
    // Display writes the shortest form that reads back: `30`, `1.5`.
    let window = report.window_seconds.map(|s| format!(" over {s} s windows"));
    let window = window.unwrap_or_default();
    match report.method.as_str() {
        m if m == Method::UntilExit.as_str() => "each replica's wall time to its exit".into(),
        m if m == Method::Histogram.as_str() => match &report.histogram {
            Some(name) => format!("histogram {name}{window}"),
            None => format!("a histogram{window}"),
        },
        m if m == Method::Units.as_str() => format!("units by line{window}"),
        other => format!("{other}{window}"),
    }
}

/// The report as people read it: a header, the baseline, a table per strategy, the
/// recommendations, the capacity, the failed replicas, and where the sharing and the
/// results went.
pub fn render_report(report: &BenchReport, glyphs: Glyphs) -> String {
    let mut text = format!(
        "Bench of {} (GPU {}, {}): {}\n",
        report.target,
        report.gpu,
        report.device,
        command_line(&report.command)
    );
    let mut measured = format!("Measured: {}; objective {}", method_line(report), report.objective);
    if let Some(slo) = &report.slo {
        measured.push_str(&format!("; SLO {slo}"));
    }
    if report.repeat > 1 {
        measured.push_str(&format!("; {}", report_text::rounds_text(report.repeat)));
    }
    text.push_str(&format!("{measured}\n"));
    if !report.partial.is_empty() {
        text.push_str(&format!("Partial: {}\n", report.partial));
    }
    text.push_str(&pinning_line(report, glyphs));
    if report.plan.is_empty() && !report.capped.is_empty() {
        text.push_str(&format!("Note: {}\n", report.capped));
    }
    for line in report.plan.iter().filter(|l| l.starts_with("Left out")) {
        text.push_str(&format!("{line}\n"));
    }
    text.push_str(&baseline_line(report.baseline.as_ref(), report.rate_unit(), glyphs));
    if let Some(noise) = &report.noise {
        let line = report_text::noise_text(noise, figure, glyphs.range, glyphs.dash);
        text.push_str(&format!("Host noise: {line}\n"));
    }
    if let Some(note) = report_text::noisy_baseline(report) {
        text.push_str(&format!("Note: {note}\n"));
    }

    for strategy in &report.strategies {
        text.push('\n');
        if let Some(why) = &strategy.skipped {
            text.push_str(&format!("{}: skipped ({why})\n", strategy.strategy));
            continue;
        }
        text.push_str(&format!("{}:\n", strategy.strategy));
        if strategy.runs.is_empty() {
            text.push_str("no runs\n");
            continue;
        }
        text.push_str(&runs_table(&strategy.runs, report.rate_unit(), glyphs));
        for run in strategy.runs.iter().filter(|r| r.error.is_none()) {
            if let Some(warning) = &run.scaling_warning {
                text.push_str(&format!("! N={}: {warning}\n", run.replicas));
            }
        }
    }
    if !report.intervals.is_empty() && has_intervals(report) {
        text.push_str(&format!("\nIntervals [low{}high]: {}\n", glyphs.range, report.intervals));
    }

    if !report.recommendations.is_empty() {
        text.push_str(&format!("\nRecommendation ({}):\n", report.objective));
        for r in &report.recommendations {
            let reason = match report_text::tie_text(r) {
                Some(tie) => format!("{tie}; {}", r.reason),
                None => r.reason.clone(),
            };
            text.push_str(&format!("N={}: {} {} {reason}\n", r.replicas, r.strategy, glyphs.dash));
        }
    }

    if !report.capacity.is_empty() {
        let slo = report.slo.as_deref().unwrap_or("the SLO");
        let fleet = plural(report.fleet as usize, "replica");
        text.push_str(&format!("\nCapacity at {slo} (a fleet of {fleet}):\n"));
        let columns = Columns::<BenchCapacity>::new()
            .left("STRATEGY", |c| c.strategy.clone())
            .right("PER GPU", |c| {
                if c.replicas_per_gpu == 0 { "none".into() } else { c.replicas_per_gpu.to_string() }
            })
            .right("GPUS", |c| c.gpus_needed.to_string())
            .right("SAVING", |c| format!("{:.0} %", c.saving * 100.0))
            .left("WHY", |c| c.reason.clone());
        text.push_str(&columns.render(&report.capacity));
    }

    text.push_str(&failed_replicas(report));
    let agent_cpu = report
        .strategies
        .iter()
        .flat_map(|s| &s.runs)
        .chain(report.baseline.as_ref())
        .filter_map(|r| r.agent_cpu_percent)
        .reduce(f64::max);
    if let Some(cpu) = agent_cpu {
        text.push_str(&format!(
            "\nThe agent's own CPU over a window: {cpu:.2} % of a core at most\n"
        ));
    }
    text.push_str(&setups_line(report));
    let mut took = report_text::took(report);
    took[..1].make_ascii_uppercase();
    text.push_str(&format!(
        "\n{took}\nRestored: {}\nResults kept in {}\n",
        report.restored, report.saved_to
    ));
    text
}

/// How many replicas the pinning line names before it leaves some out.
const PINNING_SHOWN: usize = 4;

/// `Pinned: 2 CPUs per replica from CPUs 0-15 (NUMA node 0 of the GPU); replica 0: 0-1,
/// …`, or `Not pinned (--no-pin)`; nothing for a report of an agent that never pinned.
fn pinning_line(report: &BenchReport, glyphs: Glyphs) -> String {
    let more = if glyphs == Glyphs::ASCII { "..." } else { "…" };
    match &report.pinning {
        Some(pinning) => {
            format!("Pinned: {}\n", report_text::pinning_text(pinning, PINNING_SHOWN, more))
        }
        None if report_text::knows_pinning(report) => "Not pinned (--no-pin)\n".into(),
        None => String::new(),
    }
}

/// Whether any run (the baseline included) has an interval.
fn has_intervals(report: &BenchReport) -> bool {
    report
        .strategies
        .iter()
        .flat_map(|s| &s.runs)
        .chain(report.baseline.as_ref())
        .any(|r| r.throughput_interval.is_some() || r.p99_interval_ms.is_some())
}

/// `1,180 [1,120-1,230]`: a figure and its interval, when it has one.
fn with_interval(shown: String, interval: Option<[f64; 2]>, glyphs: Glyphs) -> String {
    match interval {
        Some([low, high]) => {
            format!("{shown} [{}{}{}]", figure(low), glyphs.range, figure(high))
        }
        None => shown,
    }
}

/// `Setting up: time-slicing 31 ms, mps 27 ms, mps-limited 28-35 ms` (the switches the
/// agent made, each planned, set up and verified); empty without any.
fn setups_line(report: &BenchReport) -> String {
    let baseline = report.baseline.iter().map(|b| ("time-slicing", b));
    let runs =
        report.strategies.iter().flat_map(|s| s.runs.iter().map(|r| (s.strategy.as_str(), r)));
    let mut by_strategy: Vec<(&str, Vec<f64>)> = Vec::new();
    for (strategy, ms) in baseline.chain(runs).filter_map(|(s, r)| Some((s, r.setup_ms?))) {
        match by_strategy.iter_mut().find(|(s, _)| *s == strategy) {
            Some((_, all)) => all.push(ms),
            None => by_strategy.push((strategy, vec![ms])),
        }
    }
    if by_strategy.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = by_strategy
        .iter()
        .map(|(strategy, all)| {
            let low = all.iter().copied().fold(f64::INFINITY, f64::min);
            let high = all.iter().copied().fold(0.0, f64::max);
            if high - low < 0.5 {
                format!("{strategy} {low:.0} ms")
            } else {
                format!("{strategy} {low:.0}-{high:.0} ms")
            }
        })
        .collect();
    format!("Setting up (planned, set up, verified): {}\n", parts.join(", "))
}

/// `Baseline: 1 replica alone: 402 units/s, p50 2.41 ms, p99 3.10 ms`, with the
/// intervals where there are, and the measurements' range when there were several
/// (`median of 3, 388-415`).
fn baseline_line(baseline: Option<&BenchRun>, rate: &str, glyphs: Glyphs) -> String {
    let Some(run) = baseline else {
        return "Baseline: none\n".into();
    };
    if let Some(error) = &run.error {
        return format!("Baseline: error: {error}\n");
    }
    let throughput = with_interval(figure(run.throughput_per_s), run.throughput_interval, glyphs);
    let mut line = format!("Baseline: 1 replica alone: {throughput} {rate}");
    if let Some(range) = repeat_range(run) {
        line.push_str(&format!(" ({range})"));
    }
    if let Some(p50) = run.p50_ms {
        line.push_str(&format!(", p50 {} ms", figure(p50)));
    }
    if let Some(p99) = run.p99_ms {
        let p99 = with_interval(figure(p99), run.p99_interval_ms, glyphs);
        line.push_str(&format!(", p99 {p99} ms"));
    }
    if run.failed > 0 {
        line.push_str(", failed");
    }
    line.push('\n');
    line
}

/// `median of 3, 22,418-34,465` for a run measured several times; `None` for once.
fn repeat_range(run: &BenchRun) -> Option<String> {
    let (low, high) = run.repeat_bounds()?;
    let count = run.repeat_throughputs_per_s.len();
    Some(format!("median of {count}, {}-{}", figure(low), figure(high)))
}

/// A row per replica count; the throughput's and the p99's intervals in columns of their
/// own beside them, unnamed (`1,180 [1,120-1,230]`: the medians stay aligned), where any
/// run has one; a scaling above N marked (`2.10x!`, its note under the table); a SPREAD
/// column (the measurements' largest throughput over the smallest) when runs were measured
/// more than once and have no intervals (a report of an older agent): an interval says
/// what the spread said, and more.
fn runs_table(runs: &[BenchRun], rate: &str, glyphs: Glyphs) -> String {
    let measured = || runs.iter().filter(|r| r.error.is_none());
    let intervals = measured().any(|r| r.throughput_interval.is_some());
    let p99_intervals = measured().any(|r| r.p99_interval_ms.is_some());
    let repeated = !intervals && runs.iter().any(|r| r.repeat_throughputs_per_s.len() > 1);
    let flagged = measured().any(|r| r.scaling_warning.is_some());
    // A figure of a run, `-` for one that ended in an error; an interval, nothing for it.
    let figured = |cell: fn(&BenchRun) -> String| {
        move |r: &BenchRun| if r.error.is_some() { "-".to_owned() } else { cell(r) }
    };
    let bounds = move |interval: Option<[f64; 2]>| {
        interval.map_or(String::new(), |[low, high]| {
            format!("[{}{}{}]", figure(low), glyphs.range, figure(high))
        })
    };
    let interval = move |pick: fn(&BenchRun) -> Option<[f64; 2]>| {
        move |r: &BenchRun| if r.error.is_some() { String::new() } else { bounds(pick(r)) }
    };
    let mut columns = Columns::<BenchRun>::new()
        .right("N", |r| r.replicas.to_string())
        .right(rate.to_uppercase(), figured(|r| figure(r.throughput_per_s)));
    if intervals {
        columns = columns.beside(interval(|r| r.throughput_interval));
    }
    if repeated {
        columns = columns.right(
            "SPREAD",
            figured(|r| {
                r.repeat_spread().map_or("-".to_owned(), |s| format!("{:.0} %", s * 100.0))
            }),
        );
    }
    columns = columns
        .right("SCALING", move |r| {
            if r.error.is_some() {
                return "-".to_owned();
            }
            // The mark after the figure, a blank where others have one: the points align.
            let mut scaling = times(r.scaling);
            if r.scaling_warning.is_some() {
                scaling.push('!');
            } else if flagged {
                scaling.push(' ');
            }
            scaling
        })
        .right("P50 MS", figured(|r| maybe_figure(r.p50_ms)))
        .right("P99 MS", figured(|r| maybe_figure(r.p99_ms)));
    if p99_intervals {
        columns = columns.beside(interval(|r| r.p99_interval_ms));
    }
    columns
        .right(format!("P99 {}", glyphs.times), figured(|r| times(r.p99_inflation)))
        .right("FAIRNESS", figured(|r| fairness(r.jain_fairness)))
        .right("SLOWEST", figured(|r| times(r.max_slowdown)))
        .right("FAILED", figured(|r| r.failed.to_string()))
        .left("SETUP", |r| match &r.error {
            Some(error) => format!("error: {error}"),
            None => r.setup.clone(),
        })
        .render(runs)
}

/// The failed replicas of every run, each with its outcome and the end of its stderr;
/// empty when none failed.
fn failed_replicas(report: &BenchReport) -> String {
    let baseline = report.baseline.iter().map(|run| ("baseline".to_owned(), run));
    let runs = report.strategies.iter().flat_map(|s| {
        s.runs.iter().map(move |run| (format!("{}, N={}", s.strategy, run.replicas), run))
    });
    let mut text = String::new();
    for (label, run) in baseline.chain(runs) {
        for replica in run.per_replica.iter().filter(|r| r.failed) {
            text.push_str(&format!(
                "{label}, replica {} (pid {}): {}\n",
                replica.index, replica.pid, replica.outcome
            ));
            let lines: Vec<&str> = replica.stderr_tail.lines().collect();
            if lines.is_empty() {
                text.push_str("    (nothing on stderr)\n");
            }
            for line in &lines[lines.len().saturating_sub(STDERR_LINES)..] {
                text.push_str(&format!("    | {line}\n"));
            }
        }
    }
    if text.is_empty() { text } else { format!("\nFailed replicas:\n{text}") }
}

#[cfg(test)]
pub(crate) mod tests;
