//! Following a job the agent runs (an apply or a probe): the job's signals are subscribed
//! to before the call that starts it, so none is missed however fast the job is;
//! `NameOwnerChanged` of the agent's name is watched too, so that ctl stops waiting if the
//! agent exits mid-job. Progress goes to stderr: a bar with the time since the job started
//! on a terminal, `[3/12 1m05s] GPU 0: ...` lines otherwise (steps numbered as they begin
//! on any GPU, with that time; `verifying` and a rollback's `rolling back: …` lines
//! without a count or time), nothing with `--json`.
//!
//! A job the agent refuses as busy because its re-apply at start-up still runs (`status`'s
//! `starting_up`) is asked for again until that ends: the agent itself waits up to 20 s per
//! call, within the 25 s a D-Bus client waits for a reply, and ctl calls again for as long
//! as systemd would wait for the agent's start (`TimeoutStartSec`), saying once on stderr
//! that it waits. A job refused because another client's job runs is not asked for again.
//!
//! Ctrl-C ([`OnInterrupt`]) leaves the job to the agent at once (apply, probe), or first
//! asks the agent to cancel it and keeps following it to its end (bench), leaving at the
//! second Ctrl-C.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use gpushare_proto::{AgentError, BUS_NAME, JOB_INTERFACE, JobProxy};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use zbus::message::Type as MessageType;
use zbus::proxy::CacheProperties;
use zbus::zvariant::OwnedObjectPath;
use zbus::{Connection, MatchRule, Message, MessageStream};

use crate::bus::{Agent, Client};
use crate::error::{CtlError, Kind};
use crate::output::Output;
use gpushare_base::duration::compact as duration_text;

/// How many job signals may queue while the starting call is in flight.
const SIGNAL_QUEUE: usize = 4096;
/// How long ctl keeps calling again while the agent refuses the job because its re-apply
/// at start-up still runs (the unit's `TimeoutStartSec`, which systemd would wait for its
/// start); each call waits up to 20 s in the agent itself.
const START_UP_PATIENCE: Duration = Duration::from_secs(900);
/// The least time between two such calls (the agent answers at once when it predates
/// waiting).
const START_UP_RETRY: Duration = Duration::from_secs(1);

/// What Ctrl-C does while ctl follows a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnInterrupt {
    /// Stop following at once (exit 130); the agent carries on with the job.
    Leave,
    /// The first Ctrl-C asks the agent to cancel the job (`Job1.Cancel`), prints `notice`
    /// on stderr and keeps following the job to its `Finished`; the second leaves at once
    /// (exit 130), the agent finishing the cancellation on its own.
    Cancel {
        /// The line printed at the first Ctrl-C (`cancelling: …`).
        notice: &'static str,
    },
}

/// Starts a job with `start` (the call `method`: `Apply`, `ApplyDocument`, `Probe`) and
/// follows its signals to the end, showing progress; returns the outcome document as it
/// came. The job signals are subscribed to before `start` runs. `what` names the job in
/// messages (`apply`, `probe`). Ctrl-C leaves the job to the agent ([`OnInterrupt::Leave`]).
pub async fn start_and_follow(
    client: &mut Client,
    out: &Output,
    method: &str,
    what: &str,
    start: impl AsyncFn(&Agent) -> Result<OwnedObjectPath, AgentError>,
) -> Result<String, CtlError> {
    start_and_follow_with(client, out, method, what, OnInterrupt::Leave, start).await
}

/// [`start_and_follow`] with a choice of what Ctrl-C does.
pub async fn start_and_follow_with(
    client: &mut Client,
    out: &Output,
    method: &str,
    what: &str,
    on_interrupt: OnInterrupt,
    start: impl AsyncFn(&Agent) -> Result<OwnedObjectPath, AgentError>,
) -> Result<String, CtlError> {
    // Watched from before the job starts: once ctl has the job, no Ctrl-C may be missed.
    let mut interrupts = signal(SignalKind::interrupt()).map_err(|e| {
        CtlError::ctl(Kind::Failed, format!("cannot watch for Ctrl-C during the {what}: {e}"))
    })?;
    let starting = client.call(method, async |a| {
        let mut waiting_since = None;
        loop {
            // Subscribe first: the job may finish before the reply reaches us.
            let jobs =
                MessageStream::for_match_rule(job_rule()?, &a.conn, Some(SIGNAL_QUEUE)).await?;
            let owners = MessageStream::for_match_rule(owner_rule()?, &a.conn, None).await?;
            let asked = Instant::now();
            let busy = match start(a).await {
                Ok(job) => return Ok((job, jobs, owners, a.conn.clone())),
                Err(e @ AgentError::Busy(_)) => e,
                Err(e) => return Err(e),
            };
            // The agent's re-apply at start-up, which the agent waited for up to 20 s:
            // ctl waits on, calling again, as long as it runs (and so long as systemd
            // would wait for the agent's start).
            let since = *waiting_since.get_or_insert(asked);
            let Some(running) = re_applying_at_start_up(a).await else { return Err(busy) };
            if since.elapsed() >= START_UP_PATIENCE {
                return Err(busy);
            }
            if since == asked && !out.json {
                eprintln!(
                    "gpushare-ctl: waiting for the agent's re-apply at start-up to finish ({running})"
                );
            }
            if asked.elapsed() < START_UP_RETRY {
                tokio::time::sleep(START_UP_RETRY).await;
            }
        }
    });
    let (job, jobs, owners, conn) = tokio::select! {
        started = starting => started?,
        // No job to cancel yet: leave, as the default action of SIGINT would.
        _ = interrupts.recv() => {
            return Err(CtlError::ctl(
                Kind::Interrupted,
                format!("interrupted while starting the {what}; run `gpushare-ctl status` to see whether it runs"),
            )
            .with_exit_code(130));
        }
    };

    let mut progress = Progress::new(out);
    let streams = Streams { jobs, owners, interrupts };
    let result = follow(&job, &conn, what, on_interrupt, streams, &mut progress).await;
    progress.finish();
    result
}

/// What [`follow`] listens to.
struct Streams {
    /// The job signals.
    jobs: MessageStream,
    /// `NameOwnerChanged` of the agent's name.
    owners: MessageStream,
    /// SIGINT.
    interrupts: tokio::signal::unix::Signal,
}

/// Calls `Cancel` on job `job`.
async fn cancel_job(conn: Connection, job: OwnedObjectPath) -> Result<(), AgentError> {
    let proxy =
        JobProxy::builder(&conn).path(job)?.cache_properties(CacheProperties::No).build().await?;
    proxy.cancel().await
}

/// The job `status` names when it is the agent's re-apply at start-up (`starting_up`);
/// `None` when another job runs, or none, or the status cannot be read.
async fn re_applying_at_start_up(agent: &Agent) -> Option<String> {
    let raw = agent.proxy.status().await.ok()?;
    let status: serde_json::Value = serde_json::from_str(&raw).ok()?;
    if status.get("starting_up")?.as_bool()? {
        Some(status.get("apply_in_progress")?.as_str().unwrap_or("start-up").to_string())
    } else {
        None
    }
}

/// Signals of job objects, from the agent's name.
fn job_rule() -> zbus::Result<MatchRule<'static>> {
    Ok(MatchRule::builder()
        .msg_type(MessageType::Signal)
        .sender(BUS_NAME)?
        .interface(JOB_INTERFACE)?
        .build())
}

/// Changes of the owner of the agent's name.
fn owner_rule() -> zbus::Result<MatchRule<'static>> {
    Ok(MatchRule::builder()
        .msg_type(MessageType::Signal)
        .sender("org.freedesktop.DBus")?
        .interface("org.freedesktop.DBus")?
        .member("NameOwnerChanged")?
        .path("/org/freedesktop/DBus")?
        .arg(0, BUS_NAME)?
        .build())
}

/// What one job signal says.
#[derive(Debug, Clone, PartialEq)]
pub enum JobEvent {
    /// `Progress(done, total, step)`.
    Progress {
        /// Steps done.
        done: u32,
        /// Steps in all.
        total: u32,
        /// The step that comes next.
        step: String,
    },
    /// `Finished(outcome)`: the outcome document.
    Finished(String),
}

/// Reads a signal of job `job`; `None` for other jobs and other signals.
pub fn job_event(msg: &Message, job: &str) -> Option<JobEvent> {
    let header = msg.header();
    if header.path().map(|p| p.as_str()) != Some(job) {
        return None;
    }
    match header.member()?.as_str() {
        "Progress" => {
            let (done, total, step) = msg.body().deserialize::<(u32, u32, String)>().ok()?;
            Some(JobEvent::Progress { done, total, step })
        }
        "Finished" => msg.body().deserialize::<String>().ok().map(JobEvent::Finished),
        _ => None,
    }
}

/// The whole outcome of a job whose `Finished` carried only its public part (`private`:
/// a bench's outcome is its caller's, read with `GetOutcome`); other outcomes as they came.
async fn whole_outcome(
    conn: &Connection,
    job: &OwnedObjectPath,
    outcome: String,
) -> Result<String, CtlError> {
    let private = serde_json::from_str::<serde_json::Value>(&outcome)
        .ok()
        .and_then(|v| v.get("private")?.as_bool())
        .unwrap_or(false);
    if !private {
        return Ok(outcome);
    }
    let proxy = JobProxy::builder(conn)
        .path(job.clone())
        .map(|b| b.cache_properties(CacheProperties::No))
        .map_err(|e| crate::error::from_zbus_error(e, "GetOutcome", "bus"))?
        .build()
        .await
        .map_err(|e| crate::error::from_zbus_error(e, "GetOutcome", "bus"))?;
    proxy.get_outcome().await.map_err(|e| crate::error::from_agent_error(e, "GetOutcome", "bus"))
}

/// Whether a `NameOwnerChanged` message says the agent's owner went away.
pub fn agent_left(msg: &Message) -> bool {
    match msg.body().deserialize::<(String, String, String)>() {
        Ok((name, old_owner, _new_owner)) => name == BUS_NAME && !old_owner.is_empty(),
        Err(_) => false,
    }
}

/// Waits for the job's `Finished` signal, reporting progress; returns the outcome document.
async fn follow(
    job: &OwnedObjectPath,
    conn: &Connection,
    what: &str,
    on_interrupt: OnInterrupt,
    streams: Streams,
    progress: &mut Progress,
) -> Result<String, CtlError> {
    let Streams { mut jobs, mut owners, mut interrupts } = streams;
    let job_path = job.as_str();
    let lost = |lost: String| {
        CtlError::ctl(
            Kind::ConnectionLost,
            format!("{lost} during the {what}; run `gpushare-ctl status` to see the GPUs"),
        )
    };
    let leave = |message: String| CtlError::ctl(Kind::Interrupted, message).with_exit_code(130);
    // The reply to `Cancel`, once asked for; the sender stays here so that the branch
    // waits rather than ends while no cancellation runs.
    let (cancel_sender, mut cancel_replies) = mpsc::channel::<Result<(), AgentError>>(1);
    let mut cancelling = false;
    loop {
        tokio::select! {
            // A Finished queued before the agent's exit must win.
            biased;
            msg = jobs.next() => match msg {
                Some(Ok(msg)) => match job_event(&msg, job_path) {
                    Some(JobEvent::Progress { done, total, step }) => progress.update(done, total, &step),
                    Some(JobEvent::Finished(outcome)) => return whole_outcome(conn, job, outcome).await,
                    None => {}
                },
                Some(Err(e)) => return Err(lost(format!("lost the connection to the bus ({e})"))),
                None => return Err(lost("lost the connection to the bus".into())),
            },
            msg = owners.next() => match msg {
                Some(Ok(msg)) if agent_left(&msg) => {
                    return Err(CtlError::ctl(
                        Kind::AgentExited,
                        format!("gpushare-agent exited during the {what}; run `gpushare-ctl status` to see the GPUs"),
                    ));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(lost(format!("lost the connection to the bus ({e})"))),
                None => return Err(lost("lost the connection to the bus".into())),
            },
            Some(reply) = cancel_replies.recv() => {
                if let Err(e) = reply {
                    let e = crate::error::from_agent_error(e, "Cancel", "bus");
                    progress.println(&format!(
                        "gpushare-ctl: cannot cancel the {what}: {}; it goes on (Ctrl-C again to leave it to the agent)",
                        e.message
                    ));
                }
            },
            _ = interrupts.recv() => match on_interrupt {
                OnInterrupt::Cancel { notice } if !cancelling => {
                    cancelling = true;
                    progress.println(notice);
                    let (conn, job, sender) = (conn.clone(), job.clone(), cancel_sender.clone());
                    tokio::spawn(async move {
                        let _ = sender.send(cancel_job(conn, job).await).await;
                    });
                }
                OnInterrupt::Cancel { .. } => {
                    return Err(leave(format!(
                        "interrupted again; the agent goes on cancelling the {what} ({job_path}): run `gpushare-ctl status` to see the GPUs"
                    )));
                }
                OnInterrupt::Leave => {
                    return Err(leave(format!(
                        "interrupted; the agent carries on with the {what} ({job_path}); run `gpushare-ctl status` to see the GPUs"
                    )));
                }
            },
        }
    }
}

/// `[3/12 1m05s] GPU 0: create 2g.10gb at slot 4`: the step about to run, counted from 1,
/// and the time since the job started; the text alone for a line without a count (`total`
/// 0: verifying, rolling back).
pub fn progress_line(done: u32, total: u32, step: &str, elapsed: Duration) -> String {
    if total == 0 {
        return step.to_string();
    }
    // An agent before issue 10 sent its verification as step `total` of `total`.
    let number = if done >= total { total } else { done + 1 };
    format!("[{number}/{total} {}] {step}", duration_text(elapsed.as_secs_f64()))
}

/// The bar's look: `███░░░   3/9  1m12s mps: 3 replicas …`, the time since the job
/// started written as the plain lines write it (`1m12s`, not indicatif's `1m`).
fn bar_style() -> Option<ProgressStyle> {
    let since_start = |state: &ProgressState, w: &mut dyn std::fmt::Write| {
        let _ = write!(w, "{:>5}", duration_text(state.elapsed().as_secs_f64()));
    };
    ProgressStyle::with_template("{bar:30} {pos:>3}/{len:3} {since_start} {wide_msg}")
        .ok()
        .map(|style| style.with_key("since_start", since_start))
}

/// Progress on stderr: a bar on a terminal, plain lines otherwise, nothing with `--json`;
/// both with the time since the job started.
struct Progress {
    mode: ProgressMode,
    /// When ctl began following the job (its start, to within the starting call).
    started: Instant,
}

enum ProgressMode {
    Silent,
    Lines,
    Bar(Option<ProgressBar>),
}

impl Progress {
    fn new(out: &Output) -> Self {
        let mode = if out.json {
            ProgressMode::Silent
        } else if out.progress_bar() {
            ProgressMode::Bar(None)
        } else {
            ProgressMode::Lines
        };
        Self { mode, started: Instant::now() }
    }

    fn update(&mut self, done: u32, total: u32, step: &str) {
        match &mut self.mode {
            ProgressMode::Silent => {}
            ProgressMode::Lines => {
                eprintln!("{}", progress_line(done, total, step, self.started.elapsed()))
            }
            ProgressMode::Bar(Some(bar)) if total == 0 => bar.set_message(step.to_string()),
            ProgressMode::Bar(None) if total == 0 => eprintln!("{step}"),
            ProgressMode::Bar(bar) => {
                let started = self.started;
                let bar = bar.get_or_insert_with(|| {
                    // The job's time, not the bar's: the bar comes with the first counted step.
                    let bar = ProgressBar::with_draw_target(
                        Some(u64::from(total)),
                        ProgressDrawTarget::stderr(),
                    )
                    .with_elapsed(started.elapsed());
                    if let Some(style) = bar_style() {
                        bar.set_style(style);
                    }
                    // The time goes on during a step (a bench's window: minutes).
                    bar.enable_steady_tick(Duration::from_secs(1));
                    bar
                });
                bar.set_length(u64::from(total));
                // The step's number, as the plain lines show it.
                bar.set_position(u64::from(done) + 1);
                bar.set_message(step.to_string());
            }
        }
    }

    /// A line on stderr that does not tear the bar (shown with `--json` too: it answers
    /// the user's Ctrl-C).
    fn println(&self, line: &str) {
        match &self.mode {
            ProgressMode::Bar(Some(bar)) => bar.suspend(|| eprintln!("{line}")),
            _ => eprintln!("{line}"),
        }
    }

    fn finish(&mut self) {
        if let ProgressMode::Bar(Some(bar)) = &self.mode {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn progress_lines_count_from_one_with_the_time_since_the_start() {
        assert_eq!(
            progress_line(2, 12, "GPU 0: create 2g.10gb at slot 4", secs(0.3)),
            "[3/12 0s] GPU 0: create 2g.10gb at slot 4"
        );
        assert_eq!(progress_line(0, 1, "x", secs(7.6)), "[1/1 8s] x");
        assert_eq!(progress_line(12, 12, "verify", secs(59.4)), "[12/12 59s] verify");
        assert_eq!(
            progress_line(2, 9, "mps: 3 replicas (MPS, 3 clients)", secs(72.0)),
            "[3/9 1m12s] mps: 3 replicas (MPS, 3 clients)"
        );
    }

    /// A terminal that keeps what is drawn on it.
    #[derive(Debug, Clone, Default)]
    struct Screen(std::sync::Arc<std::sync::Mutex<String>>);

    impl indicatif::TermLike for Screen {
        fn width(&self) -> u16 {
            100
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            self.write_str(&format!("{s}\n"))
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            self.0.lock().unwrap().push_str(s);
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_bar_shows_the_time_since_the_job_started() {
        let screen = Screen::default();
        let bar = ProgressBar::with_draw_target(
            Some(9),
            ProgressDrawTarget::term_like(Box::new(screen.clone())),
        )
        .with_elapsed(secs(72.0));
        bar.set_style(bar_style().expect("a valid template"));
        bar.set_position(3);
        bar.set_message("mps: 3 replicas");
        bar.force_draw();
        let drawn = screen.0.lock().unwrap().clone();
        assert!(drawn.contains("  3/9   1m12s mps: 3 replicas"), "{drawn:?}");
    }

    #[test]
    fn progress_without_a_count_is_the_text_alone() {
        assert_eq!(progress_line(0, 0, "verifying", secs(75.0)), "verifying");
        assert_eq!(
            progress_line(0, 0, "rolling back: GPU 0: disable MIG mode", secs(3.0)),
            "rolling back: GPU 0: disable MIG mode"
        );
    }

    #[test]
    fn durations_read_to_the_second() {
        for (seconds, text) in [
            (0.0, "0s"),
            (0.49, "0s"),
            (42.0, "42s"),
            (59.6, "1m00s"),
            (65.0, "1m05s"),
            (372.0, "6m12s"),
            (3599.0, "59m59s"),
            (3720.0, "1h02m"),
            (90_000.0, "25h00m"),
        ] {
            assert_eq!(duration_text(seconds), text, "{seconds}");
        }
        for nonsense in [f64::NAN, -1.0, f64::INFINITY] {
            assert_eq!(duration_text(nonsense), "?");
        }
    }

    fn signal(path: &str, member: &str) -> zbus::message::Builder<'static> {
        Message::signal(path.to_owned(), JOB_INTERFACE, member.to_owned()).unwrap()
    }

    #[test]
    fn job_signals_are_read_for_our_job_only() {
        let job = "/io/gpushare/Agent1/jobs/7";
        let msg = signal(job, "Progress").build(&(2u32, 12u32, "GPU 0: enable MIG mode")).unwrap();
        assert_eq!(
            job_event(&msg, job),
            Some(JobEvent::Progress { done: 2, total: 12, step: "GPU 0: enable MIG mode".into() })
        );
        assert_eq!(job_event(&msg, "/io/gpushare/Agent1/jobs/8"), None);
        let raw = r#"{"ok":true}"#.to_string();
        let msg = signal(job, "Finished").build(&(raw.as_str(),)).unwrap();
        assert_eq!(job_event(&msg, job), Some(JobEvent::Finished(raw)));
        let msg = signal(job, "Other").build(&()).unwrap();
        assert_eq!(job_event(&msg, job), None);
    }

    #[test]
    fn agent_exit_is_seen_in_name_owner_changed() {
        let noc = |old: &str, new: &str| {
            Message::signal("/org/freedesktop/DBus", "org.freedesktop.DBus", "NameOwnerChanged")
                .unwrap()
                .build(&(BUS_NAME, old, new))
                .unwrap()
        };
        assert!(agent_left(&noc(":1.5", "")));
        assert!(agent_left(&noc(":1.5", ":1.9")));
        assert!(!agent_left(&noc("", ":1.9")));
    }

    #[test]
    fn match_rules_are_valid() {
        let rule = job_rule().unwrap().to_string();
        assert!(rule.contains("sender='io.gpushare.Agent1'"), "{rule}");
        assert!(rule.contains("interface='io.gpushare.Job1'"), "{rule}");
        let rule = owner_rule().unwrap().to_string();
        assert!(rule.contains("arg0='io.gpushare.Agent1'"), "{rule}");
    }
}
