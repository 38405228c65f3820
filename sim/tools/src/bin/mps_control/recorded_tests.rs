//! The H100's recorded sessions replayed against the simulated daemon
//! (tests/device/results/mps-privilege-h100-2026-12-06): each command from the user who
//! sent it, each client as it came and went, each at its recorded time. Every answer is
//! the recorded one, the control log the recorded one line for line, and the server log's
//! lines are the recorded ones, in order (the simulator writes fewer).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::commands::answer;
use crate::log_line::{LogFile, LogLine};
use crate::state::State;

const RESULTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/device/results/mps-privilege-h100-2026-12-06"
);
const SOCKET: &str = "/tmp/mps-privilege.J1IL0h/pipe/control";
const DEVICE: &str = "GPU-73564394-e8b4-767b-2871-da058c0a05cd";

fn read(name: &str) -> String {
    std::fs::read_to_string(Path::new(RESULTS).join(name)).unwrap()
}

/// One line of a recorded log: milliseconds into the day, the PID it names, its text.
#[derive(Debug, Clone)]
struct Line {
    ms: u64,
    pid: u32,
    text: String,
}

/// `[2026-12-06 07:21:38.804 Control   549] text`.
fn parse_log(text: &str) -> Vec<Line> {
    text.lines()
        .map(|l| {
            let (head, text) = l.strip_prefix('[').unwrap().split_once("] ").unwrap();
            let words: Vec<&str> = head.split_whitespace().collect();
            let clock: Vec<f64> = words[1].split(':').map(|n| n.parse().unwrap()).collect();
            let ms = ((clock[0] * 3600.0 + clock[1] * 60.0 + clock[2]) * 1000.0).round() as u64;
            Line { ms, pid: words[3].parse().unwrap(), text: text.to_string() }
        })
        .collect()
}

/// A command of `mps-privilege.txt`: who sent it, and its stdout.
#[derive(Debug)]
struct Asked {
    who: String,
    command: String,
    stdout: Vec<String>,
}

/// The commands of the section of `mps-privilege.txt` whose titles start `== <section>:`,
/// and the user of every client the file names (its JSON lines).
fn parse_session(section: &str) -> (Vec<Asked>, BTreeMap<u32, u32>) {
    let mut asked: Vec<Asked> = Vec::new();
    let mut uids = BTreeMap::new();
    let mut inside = false;
    for line in read("mps-privilege.txt").lines() {
        if let Some(title) = line.strip_prefix("== ") {
            inside = title.starts_with(&format!("{section}:"));
        } else if line.starts_with("{\"who\"") && line.contains("\"uid\"") {
            let field = |name: &str| -> u32 {
                let at = line.find(&format!("\"{name}\": ")).unwrap() + name.len() + 4;
                line[at..].split([',', '}']).next().unwrap().parse().unwrap()
            };
            uids.insert(field("pid"), field("uid"));
        } else if !inside {
        } else if let Some(rest) = line.strip_prefix("> [") {
            let (who, command) = rest.split_once("] ").unwrap();
            asked.push(Asked { who: who.into(), command: command.into(), stdout: Vec::new() });
        } else if let Some(out) = line.strip_prefix("  stdout: ") {
            asked.last_mut().unwrap().stdout.push(out.to_string());
        }
    }
    (asked, uids)
}

fn uid_of(who: &str) -> u32 {
    match who {
        "root" => 0,
        "nobody" => 65534,
        "gsmpsb" => 4321,
        other => panic!("no user {other}"),
    }
}

/// A line as both sides are compared: words single-spaced, server PIDs as recorded, and
/// of a `ps` row only the first four columns (the namespace and command are this host's).
fn normal(line: &str, servers: &BTreeMap<u32, u32>) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let ps_row = words.len() == 6 && words[0].parse::<u32>().is_ok();
    let words = if ps_row { &words[..4] } else { &words[..] };
    let word = |w: &&str| {
        let (digits, after) = w.split_at(w.find(|c: char| !c.is_ascii_digit()).unwrap_or(w.len()));
        match digits.parse().ok().and_then(|pid| servers.get(&pid)) {
            Some(recorded) => format!("{recorded}{after}"),
            None => w.to_string(),
        }
    };
    words.iter().map(word).collect::<Vec<_>>().join(" ")
}

/// What happens in a recorded session.
enum Event {
    Command(String),
    Connect(u32),
    Exit(u32),
}

/// A replayed session: the control log's texts and the server log's (PID, text) lines,
/// each side normalized.
struct Replayed {
    ours: Vec<String>,
    recorded: Vec<String>,
    our_servers: Vec<(u32, String)>,
    recorded_servers: Vec<(u32, String)>,
}

/// Replays the `index`-th control daemon of the recording (section `section` of
/// `mps-privilege.txt`), with `-M` when `multiuser`.
fn replay(index: usize, section: &str, multiuser: bool) -> Replayed {
    let control = parse_log(&read("mps-log/control.log"));
    let starts: Vec<usize> = (0..control.len())
        .filter(|&i| control[i].text.starts_with("Starting control daemon"))
        .collect();
    let begin = starts[index];
    let end = control[begin..].iter().position(|l| l.text == "Exit with status 0").unwrap();
    // The three start lines are the daemon's, not the state's.
    let session = &control[begin + 3..=begin + end];
    let (first, last) = (control[begin].ms, session.last().unwrap().ms);
    let server_log: Vec<Line> = parse_log(&read("mps-log/server.log"))
        .into_iter()
        .filter(|l| (first..=last).contains(&l.ms))
        .collect();
    let (asked, uids) = parse_session(section);

    let mut events: Vec<(u64, Event)> = Vec::new();
    let mut seen = BTreeSet::new();
    for line in session {
        if let Some(command) = line.text.strip_prefix("Cmd:") {
            events.push((line.ms, Event::Command(command.to_string())));
        } else if let Some(rest) = line.text.strip_prefix("NEW CLIENT ") {
            let pid: u32 = rest.split(' ').next().unwrap().parse().unwrap();
            if seen.insert(pid) {
                events.push((line.ms, Event::Connect(pid)));
            }
        }
    }
    for line in &server_log {
        if let Some(pid) = line.text.strip_prefix("Client process ") {
            let pid = pid.strip_suffix(" disconnected").unwrap().parse().unwrap();
            events.push((line.ms, Event::Exit(pid)));
        }
    }
    events.sort_by_key(|(ms, _)| *ms);
    let times: BTreeSet<u64> =
        session.iter().map(|l| l.ms).chain(events.iter().map(|e| e.0)).collect();

    // Our servers' PIDs stand for the recorded ones, in the order they started.
    let started = |lines: &mut dyn Iterator<Item = &str>| -> Vec<u32> {
        lines
            .filter_map(|t| t.strip_prefix("Starting new server ")?.split(' ').next()?.parse().ok())
            .collect()
    };
    let recorded_started = started(&mut session.iter().map(|l| l.text.as_str()));
    let mut servers: BTreeMap<u32, u32> = BTreeMap::new();

    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms - first);
    let pid = control[begin].pid;
    let mut s =
        State::new(pid, 0, multiuser, Path::new(SOCKET), Some(DEVICE)).with_running(|_| true);
    let mut log: Vec<LogLine> = Vec::new();
    let mut replies: Vec<(&Asked, Vec<String>)> = Vec::new();
    let mut next = asked.iter().peekable();
    let mut events = events.into_iter().peekable();
    for ms in times {
        log.extend(s.tick(at(ms)));
        while let Some((_, event)) = events.next_if(|(t, _)| *t == ms) {
            match event {
                Event::Command(command) => {
                    let known = next.next_if(|a| a.command == command);
                    let caller = known.map_or(0, |a| uid_of(&a.who));
                    // The recorded command, naming our servers.
                    let ours: BTreeMap<u32, u32> = servers.iter().map(|(o, r)| (*r, *o)).collect();
                    let command = normal(&command, &ours);
                    log.extend([s.control("Accepting connection..."), s.control("NEW UI")]);
                    let answer = answer(&mut s, &command, caller, at(ms));
                    log.extend(answer.log);
                    if let Some(asked) = known {
                        replies.push((asked, answer.reply.clone()));
                    }
                    if !answer.quit {
                        log.push(s.control("UI closed"));
                    }
                }
                Event::Connect(client) => {
                    log.push(s.control("Accepting connection..."));
                    log.extend(s.connect_client(client, uids[&client], 512 << 20, at(ms)));
                }
                Event::Exit(client) => log.extend(s.client_exit(client)),
            }
            let ours_started = started(&mut log.iter().map(|l| l.text.as_str()));
            servers = ours_started.into_iter().zip(recorded_started.iter().copied()).collect();
        }
    }
    assert!(next.peek().is_none(), "not asked: {:?}", next.collect::<Vec<_>>());

    assert_eq!(servers.len(), recorded_started.len(), "servers started");
    let none = BTreeMap::new();
    for (asked, reply) in replies {
        let ours: Vec<String> = reply.iter().map(|r| normal(r, &servers)).collect();
        let theirs: Vec<String> = asked.stdout.iter().map(|r| normal(r, &none)).collect();
        assert_eq!(ours, theirs, "stdout of [{}] {}", asked.who, asked.command);
    }
    Replayed {
        ours: log
            .iter()
            .filter(|l| l.file == LogFile::Control)
            .map(|l| normal(&l.text, &servers))
            .collect(),
        recorded: session.iter().map(|l| normal(&l.text, &none)).collect(),
        our_servers: log
            .iter()
            .filter(|l| l.file == LogFile::Server)
            .map(|l| (servers.get(&l.pid).copied().unwrap_or(l.pid), normal(&l.text, &servers)))
            .collect(),
        recorded_servers: server_log.iter().map(|l| (l.pid, normal(&l.text, &none))).collect(),
    }
}

/// Whether `part` is `whole` with lines left out.
fn in_order<T: PartialEq + std::fmt::Debug>(part: &[T], whole: &[T]) -> Result<(), String> {
    let mut rest = whole.iter();
    for line in part {
        if !rest.any(|w| w == line) {
            return Err(format!("{line:?} is not among the recorded lines, in order"));
        }
    }
    Ok(())
}

/// Without `-M`: root's settings, nobody's and a second user's commands (queries
/// answered, settings, `terminate_client`, `shutdown_server` and `quit` refused,
/// `start_server -uid <own>` accepted), root's per-server limits, the second user's client
/// waiting 22 s for root's, the servers started and stopped for nobody's request and then
/// for the waiting client, and root's `quit`.
#[test]
fn the_recorded_session_without_m_replays_line_for_line() {
    let replayed = replay(0, "A", false);
    for (i, (ours, recorded)) in replayed.ours.iter().zip(&replayed.recorded).enumerate() {
        assert_eq!(ours, recorded, "control.log line {i} of the session");
    }
    assert_eq!(replayed.ours.len(), replayed.recorded.len(), "{:#?}", replayed.ours);
    in_order(&replayed.our_servers, &replayed.recorded_servers).unwrap();
}

/// With `-M`: one root server for root's and the second user's clients at once (the log
/// names both "from user 0"), the second user's settings, `terminate_client` and `quit`
/// refused. A real client connects twice (the log names it twice); the simulated one
/// once, so the connection lines are compared as a set.
#[test]
fn the_recorded_session_with_m_replays_line_for_line() {
    let replayed = replay(1, "B", true);
    let connection = |l: &&String| {
        l.as_str() == "Accepting connection..."
            || l.as_str() == "User did not send valid credentials"
            || (l.starts_with("NEW CLIENT ") && l.ends_with("Server already exists"))
    };
    let rest =
        |lines: &[String]| lines.iter().filter(|l| !connection(l)).cloned().collect::<Vec<_>>();
    assert_eq!(rest(&replayed.ours), rest(&replayed.recorded));
    let set = |lines: &[String]| lines.iter().filter(connection).cloned().collect::<BTreeSet<_>>();
    assert_eq!(set(&replayed.ours), set(&replayed.recorded));
    in_order(&replayed.our_servers, &replayed.recorded_servers).unwrap();
}
