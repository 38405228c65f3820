//! The limits an MPS control daemon applies now (its *live* limits): read in one control
//! run per daemon, set on one server process (`mps limit`), and put back where they
//! drifted from what the agent set. Also who a daemon's servers serve and their clients.
//!
//! **One run.** The daemon answers the lines of one run in turn, without separators, and
//! answers some with nothing at all (a limit not set, a server that is gone). The queries
//! are therefore sent in an order whose answers tell themselves apart by their shape: the
//! default thread percentage (always answered, `40.0`), the default memory limit (`8G`, or
//! nothing), the thread percentage and memory limit of the server process asked about last
//! time (a percentage and a memory value, or nothing for a server that is gone),
//! `get_server_list` (bare numbers), and `ps` (a header and rows) when clients are wanted.
//! Only when a server process runs that the run did not ask about (the first read, or a
//! server replaced for another user) does a second run ask for its limits.
//!
//! **Fresh enough.** A read is kept for [`LIVE_FRESH`] and answers the reads of limits
//! alone that follow within it (the health check's, then the drift check's and the
//! metrics' right after it, a `status` polled by a watcher); anything the agent sets or
//! starts drops it. A read of clients is always made afresh (clients come and go), and so
//! is the read `mps limit` makes.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{Kind, MpsController, ServerRecord, SharingError};
use crate::node::{
    LimitDrift, LimitOverride, MpsLimits, MpsServerDetail, limits_text, mps_memory_value,
};
use crate::sys::files::{PRIVATE, write_json};

/// How long a live read answers for the daemon before it is asked again.
pub const LIVE_FRESH: Duration = Duration::from_secs(1);

/// What a daemon answered for its limits, and its clients where asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveRead {
    /// Its default limits, memory read as the record's limit where it reads back as it.
    pub defaults: MpsLimits,
    /// Its server processes, each with its limits (memory read back against what the
    /// agent set on it, as for the defaults).
    pub servers: Vec<(u32, MpsLimits)>,
    /// The pids `ps` listed, when asked.
    pub clients: Option<Vec<u32>>,
}

/// What a restore put back, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The daemon's defaults: (what they were, what they are again).
    pub defaults: Option<(MpsLimits, MpsLimits)>,
    /// Server processes: (pid, what it was, what it is again).
    pub servers: Vec<(u32, MpsLimits, MpsLimits)>,
}

/// The line the real daemon answers a setting from a user who may not change it with
/// (driver 580 on an H100, tests/device/results/mps-privilege-h100-2026-12-06).
const REFUSED: &str = "Insufficient privileges";

/// The last read of each daemon's limits, by UUID, with when it was taken; `None` where
/// it was forgotten (and when).
pub(super) type LiveCache = HashMap<String, (Instant, Option<LiveRead>)>;

/// How long a forgotten daemon's mark is kept: longer than a control run may take.
const FORGOTTEN_KEPT: Duration = Duration::from_secs(300);

impl MpsController {
    /// The MPS server processes of a daemon with their client pids.
    pub fn clients(&self, uuid: &str) -> Result<Vec<(u32, Vec<u32>)>, SharingError> {
        let mut out = Vec::new();
        for server in self.command(uuid, "get_server_list")? {
            let Ok(server) = server.parse::<u32>() else { continue };
            let clients = self
                .command(uuid, &format!("get_client_list {server}"))?
                .iter()
                .filter_map(|l| l.parse().ok())
                .collect();
            out.push((server, clients));
        }
        Ok(out)
    }

    /// The live limits of the daemon of `uuid` (whose record `detail` gives what the agent
    /// set) and, with `with_clients`, its clients (`ps`), in one control run; a second only
    /// to ask for a server process the first did not know of (see the module's
    /// documentation).
    pub fn read_live(
        &self,
        uuid: &str,
        detail: &MpsServerDetail,
        with_clients: bool,
    ) -> Result<LiveRead, SharingError> {
        if !with_clients && let Some(fresh) = self.fresh_read(uuid) {
            return Ok(fresh);
        }
        self.read_live_now(uuid, detail, with_clients)
    }

    /// A read of the limits of the daemon of `uuid` younger than [`LIVE_FRESH`].
    pub fn fresh_read(&self, uuid: &str) -> Option<LiveRead> {
        let cache = self.live_cache();
        let (at, read) = cache.get(uuid)?;
        let read = read.as_ref()?;
        (at.elapsed() < LIVE_FRESH).then(|| LiveRead { clients: None, ..read.clone() })
    }

    /// Forgets what the daemon of `uuid` answered last: something changed it. The time it
    /// was forgotten is kept, so that a read begun before is not kept after (it may have
    /// seen the daemon before the change: a new daemon's defaults before its limits).
    /// Marks older than a control run can take are dropped then (a daemon's UUID goes
    /// with its MIG instance).
    pub(super) fn forget_live(&self, uuid: &str) {
        let mut cache = self.live_cache();
        cache.retain(|_, (at, read)| read.is_some() || at.elapsed() < FORGOTTEN_KEPT);
        cache.insert(uuid.to_string(), (Instant::now(), None));
    }

    fn live_cache(&self) -> std::sync::MutexGuard<'_, LiveCache> {
        self.live_cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// [`Self::read_live`], asking the daemon whatever it answered last (the read is kept
    /// for the reads of limits that follow).
    pub fn read_live_now(
        &self,
        uuid: &str,
        detail: &MpsServerDetail,
        with_clients: bool,
    ) -> Result<LiveRead, SharingError> {
        let asked = Instant::now();
        let read = self.ask_live(uuid, detail, with_clients)?;
        let mut cache = self.live_cache();
        if cache.get(uuid).is_none_or(|(at, _)| *at <= asked) {
            cache.insert(uuid.to_string(), (Instant::now(), Some(read.clone())));
        }
        Ok(read)
    }

    /// One read of the daemon's limits (and clients), as the module's documentation says.
    fn ask_live(
        &self,
        uuid: &str,
        detail: &MpsServerDetail,
        with_clients: bool,
    ) -> Result<LiveRead, SharingError> {
        let known: Vec<u32> = self.known_servers().get(uuid).cloned().unwrap_or_default();
        // Asked about in the same run only when it is one: the answers of two servers, one
        // of them gone, could not be told apart.
        let asked = match known.as_slice() {
            [one] => Some(*one),
            _ => None,
        };
        let mut lines = vec![
            "get_default_active_thread_percentage".to_string(),
            "get_default_device_pinned_mem_limit 0".to_string(),
        ];
        if let Some(pid) = asked {
            lines.push(format!("get_active_thread_percentage {pid}"));
            lines.push(format!("get_device_pinned_mem_limit {pid} 0"));
        }
        lines.push("get_server_list".to_string());
        if with_clients {
            lines.push("ps".to_string());
        }
        let answers = self.commands(uuid, &lines)?;
        let batch = parse_batch(&answers, asked.is_some()).ok_or_else(|| {
            SharingError::new(
                Kind::Failed,
                format!(
                    "MPS server for {uuid}: the control daemon did not answer its limits: {:?}",
                    answers.first().map_or("", String::as_str)
                ),
            )
        })?;
        let mut servers = Vec::new();
        for &pid in &batch.servers {
            let answer = match (asked, &batch.asked) {
                (Some(a), Some(answer)) if a == pid => Some(answer.clone()),
                _ => self.server_limits(uuid, pid)?,
            };
            if let Some((threads, memory)) = answer {
                let want = detail.expected(pid);
                servers.push((pid, limits_of(threads, memory.as_deref(), want)));
            }
        }
        self.known_servers().insert(uuid.to_string(), batch.servers.clone());
        Ok(LiveRead {
            defaults: limits_of(batch.threads, batch.memory.as_deref(), detail.configured),
            servers,
            clients: with_clients.then(|| ps_client_pids(&batch.ps)),
        })
    }

    /// The thread percentage and memory limit server process `pid` answers; `None` when it
    /// answers none (it is gone).
    fn server_limits(
        &self,
        uuid: &str,
        pid: u32,
    ) -> Result<Option<(f64, Option<String>)>, SharingError> {
        let lines = [
            format!("get_active_thread_percentage {pid}"),
            format!("get_device_pinned_mem_limit {pid} 0"),
        ];
        let answers = self.commands(uuid, &lines)?;
        let mut answers = answers.iter().map(String::as_str).peekable();
        let Some(threads) = answers.next().and_then(percentage) else { return Ok(None) };
        let memory = answers.next().filter(|a| memory_bytes(a).is_some()).map(str::to_string);
        Ok(Some((threads, memory)))
    }

    pub(super) fn known_servers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<u32>>> {
        self.known_servers.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The client PIDs of a daemon's servers, from one `ps` (the first column of its
    /// rows); a control tool without `ps` is asked server by server instead.
    pub fn client_pids(&self, uuid: &str) -> Result<Vec<u32>, SharingError> {
        let mut pids: Vec<u32> = match self.command(uuid, "ps") {
            Ok(lines) => ps_client_pids(&lines),
            Err(e) if e.message.contains("Unknown command") => {
                self.clients(uuid)?.into_iter().flat_map(|(_, clients)| clients).collect()
            }
            Err(e) => return Err(e),
        };
        // In the order the daemon lists them (connection order); a plan sorts its own.
        let mut seen = std::collections::HashSet::new();
        pids.retain(|pid| seen.insert(*pid));
        Ok(pids)
    }

    /// The server record of the daemon whose MPS server process serves client `pid`, and
    /// that server process.
    pub fn server_of_client(&self, pid: u32) -> Result<(ServerRecord, u32), SharingError> {
        let found = self.daemons().into_iter().filter(|s| s.pid.is_some()).find_map(|s| {
            let clients = self.clients(&s.record.uuid).ok()?;
            let server = clients.iter().find(|(_, c)| c.contains(&pid)).map(|(srv, _)| *srv)?;
            Some((s.record, server))
        });
        found.ok_or_else(|| {
            SharingError::new(
                Kind::NotAClient,
                format!("PID {pid} is not a client of an MPS server gpushare runs"),
            )
        })
    }

    /// Sets the limits of MPS server process `server` of the daemon of `uuid` (MPS applies
    /// them to that server's new clients) and reads both back, in one control run; returns
    /// what the server answers after. `current` is what it answered before (the memory
    /// read back against it).
    pub fn limit_server(
        &self,
        uuid: &str,
        server: u32,
        threads: Option<u32>,
        memory_bytes: Option<u64>,
        current: MpsLimits,
    ) -> Result<MpsLimits, SharingError> {
        let err = |kind, what: String| {
            SharingError::new(kind, format!("MPS server {server} of {uuid}: {what}"))
        };
        let mut lines = Vec::new();
        if let Some(t) = threads {
            lines.push(format!("set_active_thread_percentage {server} {t}"));
        }
        if let Some(bytes) = memory_bytes {
            lines.push(format!(
                "set_device_pinned_mem_limit {server} 0 {}",
                mps_memory_value(bytes)
            ));
        }
        lines.push(format!("get_active_thread_percentage {server}"));
        lines.push(format!("get_device_pinned_mem_limit {server} 0"));
        self.forget_live(uuid);
        let answers = self.commands(uuid, &lines)?;
        if let Some(refused) = answers.iter().find(|a| a.starts_with(REFUSED)) {
            return Err(err(Kind::Refused, format!("the control daemon refused: {refused}")));
        }
        let want = MpsLimits {
            active_thread_percentage: threads.unwrap_or(current.active_thread_percentage),
            pinned_memory_limit_bytes: memory_bytes.or(current.pinned_memory_limit_bytes),
        };
        let read = read_back(&answers, want).ok_or_else(|| {
            err(
                Kind::Failed,
                "it no longer answers (gone: a server for another user replaced it?)".into(),
            )
        })?;
        if read != want {
            return Err(err(
                Kind::NotApplied,
                format!(
                    "the limits did not take: it reports {} after setting {}",
                    limits_text(read),
                    limits_text(want)
                ),
            ));
        }
        Ok(read)
    }

    /// Puts the limits of the daemon of `uuid` back where they drifted (`drift`, worked
    /// out from a live read): its defaults to those configured (`detail`), each drifted
    /// server process to what the agent set on it; all in one control run, read back after.
    pub fn restore_limits(
        &self,
        uuid: &str,
        detail: &MpsServerDetail,
        drift: &LimitDrift,
    ) -> Result<Restored, SharingError> {
        let mut lines = Vec::new();
        if drift.defaults.is_some() {
            let limits = detail.configured;
            lines.push(format!(
                "set_default_active_thread_percentage {}",
                limits.active_thread_percentage
            ));
            // A limit that was none cannot be set back to none: MPS has no command to
            // remove one (a restart of the daemon would).
            if let Some(bytes) = limits.pinned_memory_limit_bytes {
                lines.push(format!(
                    "set_default_device_pinned_mem_limit 0 {}",
                    mps_memory_value(bytes)
                ));
            }
        }
        for &(pid, _, want) in &drift.servers {
            lines.push(format!(
                "set_active_thread_percentage {pid} {}",
                want.active_thread_percentage
            ));
            if let Some(bytes) = want.pinned_memory_limit_bytes {
                lines.push(format!(
                    "set_device_pinned_mem_limit {pid} 0 {}",
                    mps_memory_value(bytes)
                ));
            }
        }
        if lines.is_empty() {
            return Ok(Restored { defaults: None, servers: Vec::new() });
        }
        self.forget_live(uuid);
        let answers = self.commands(uuid, &lines)?;
        if let Some(refused) = answers.iter().find(|a| a.starts_with(REFUSED)) {
            return Err(SharingError::new(
                Kind::Refused,
                format!(
                    "MPS server for {uuid}: the control daemon refused to restore its limits: {refused}"
                ),
            ));
        }
        // Read back as any observation reads them.
        let after = self.read_live_now(uuid, detail, false)?;
        let mut restored = Restored { defaults: None, servers: Vec::new() };
        let mut left = Vec::new();
        if let Some((was, want)) = drift.defaults {
            if after.defaults == want {
                restored.defaults = Some((was, want));
            } else {
                left.push(format!("its defaults are {}", limits_text(after.defaults)));
            }
        }
        for &(pid, was, want) in &drift.servers {
            match after.servers.iter().find(|(p, _)| *p == pid) {
                Some((_, now)) if *now == want => restored.servers.push((pid, was, want)),
                Some((_, now)) => left.push(format!("server {pid} has {}", limits_text(*now))),
                // Gone meanwhile: nothing to put back.
                None => {}
            }
        }
        if !left.is_empty() {
            // MPS has no command that removes a memory limit: only a new daemon has none.
            let why = if drift.removes_memory_limit() {
                " (MPS cannot remove a memory limit from a running daemon; applying the profile \
                 again restarts it, which stops its clients)"
            } else {
                ""
            };
            return Err(SharingError::new(
                Kind::NotApplied,
                format!("MPS server for {uuid}: the limits did not take: {}{why}", left.join("; ")),
            ));
        }
        Ok(restored)
    }

    /// [`Self::restore_limits`] for the server of `uuid` as its record says (what a plan's
    /// step carries out).
    pub fn restore(&self, uuid: &str, drift: &LimitDrift) -> Result<Restored, SharingError> {
        let dir = self.server_dir(uuid);
        let Ok(Some(record)) = super::trusted_record(&dir) else {
            return Err(SharingError::new(
                Kind::Files,
                format!(
                    "MPS server for {uuid}: no record the agent may trust in {}",
                    dir.display()
                ),
            ));
        };
        let detail = MpsServerDetail::configured(record.spec(), record.overrides);
        self.restore_limits(uuid, &detail, drift)
    }

    /// Records `made` in the server record of `uuid`, keeping the overrides of the server
    /// processes in `running` only (a server that is gone took its override with it), and
    /// one override a server: a limit `made` leaves unset keeps what an earlier one set
    /// (threads, then memory, is both), so the record says what the server holds and grows
    /// no longer with every `mps limit`.
    pub fn record_override(
        &self,
        uuid: &str,
        mut made: LimitOverride,
        running: &[u32],
    ) -> Result<(), SharingError> {
        self.update_record(uuid, |record| {
            record.overrides.retain(|o| running.contains(&o.server_pid));
            if let Some(i) = record.overrides.iter().position(|o| o.server_pid == made.server_pid) {
                let earlier = record.overrides.remove(i);
                made.active_thread_percentage =
                    made.active_thread_percentage.or(earlier.active_thread_percentage);
                made.pinned_memory_limit_bytes =
                    made.pinned_memory_limit_bytes.or(earlier.pinned_memory_limit_bytes);
            }
            record.overrides.push(made);
        })
    }

    /// Forgets the overrides of server processes not in `running`; returns those it forgot.
    pub fn forget_overrides(
        &self,
        uuid: &str,
        running: &[u32],
    ) -> Result<Vec<LimitOverride>, SharingError> {
        let mut forgotten = Vec::new();
        self.update_record(uuid, |record| {
            let (kept, gone) =
                record.overrides.drain(..).partition(|o| running.contains(&o.server_pid));
            record.overrides = kept;
            forgotten = gone;
        })?;
        Ok(forgotten)
    }

    /// Rewrites the record of `uuid` with `change` made to it (only a record the agent may
    /// trust; none: nothing to change).
    fn update_record(
        &self,
        uuid: &str,
        change: impl FnOnce(&mut ServerRecord),
    ) -> Result<(), SharingError> {
        let dir = self.server_dir(uuid);
        let err =
            |what: String| SharingError::new(Kind::Files, format!("MPS server for {uuid}: {what}"));
        let Ok(Some(mut record)) = super::trusted_record(&dir) else {
            return Err(err(format!("no record the agent may trust in {}", dir.display())));
        };
        let before = record.clone();
        change(&mut record);
        self.forget_live(uuid);
        if record != before {
            write_json(&dir.join("server.json"), &record, PRIVATE)
                .map_err(|e| err(format!("server.json: {e}")))?;
        }
        Ok(())
    }
}

/// A daemon's answers to one run of [`MpsController::read_live`].
#[derive(Debug, Clone, PartialEq)]
struct Batch {
    threads: f64,
    memory: Option<String>,
    /// The server process asked about: its thread percentage and memory limit, when it
    /// answered (it runs).
    asked: Option<(f64, Option<String>)>,
    servers: Vec<u32>,
    ps: Vec<String>,
}

/// The answers of one run, told apart by their shapes (see the module's documentation);
/// `None` when the first is no percentage (the daemon did not answer as one does).
fn parse_batch(lines: &[String], asked_server: bool) -> Option<Batch> {
    let mut lines = lines.iter().map(String::as_str).peekable();
    let threads = lines.next().and_then(percentage)?;
    let memory = lines.next_if(|l| memory_bytes(l).is_some()).map(str::to_string);
    let asked = if asked_server {
        lines
            .next_if(|l| percentage(l).is_some())
            .and_then(percentage)
            .map(|t| (t, lines.next_if(|l| memory_bytes(l).is_some()).map(str::to_string)))
    } else {
        None
    };
    let mut servers = Vec::new();
    while let Some(pid) = lines.next_if(|l| l.bytes().all(|b| b.is_ascii_digit())) {
        if let Ok(pid) = pid.parse() {
            servers.push(pid);
        }
    }
    Some(Batch { threads, memory, asked, servers, ps: lines.map(str::to_string).collect() })
}

/// The thread percentage and memory limit of a server or daemon after setting limits:
/// the last percentage answered, and the memory value after it (none: no limit); `None`
/// when no percentage came (the server is gone). `want` is what was set, the memory read
/// back against it.
fn read_back(answers: &[String], want: MpsLimits) -> Option<MpsLimits> {
    let last = answers.iter().rposition(|a| percentage(a).is_some())?;
    let threads = percentage(&answers[last])?;
    let memory = answers[last + 1..].iter().find(|a| memory_bytes(a).is_some());
    Some(limits_of(threads, memory.map(String::as_str), want))
}

/// Limits from a daemon's answers: the percentage rounded to a whole one, the memory
/// value as `want`'s limit when it reads back as it (the daemon shows a limit of a
/// gibibyte or more in whole `G`, rounded down), else as the bytes it says.
fn limits_of(threads: f64, memory: Option<&str>, want: MpsLimits) -> MpsLimits {
    let pinned_memory_limit_bytes =
        memory.and_then(|answer| match want.pinned_memory_limit_bytes {
            Some(set) if pinned_limit_reads_back(set, answer) => Some(set),
            _ => memory_bytes(answer),
        });
    MpsLimits {
        active_thread_percentage: threads.round().clamp(0.0, 100.0) as u32,
        pinned_memory_limit_bytes,
    }
}

/// A thread percentage as the daemon prints it (`40.0`; always with its decimal point,
/// which tells it from a pid).
fn percentage(answer: &str) -> Option<f64> {
    answer.contains('.').then(|| answer.trim().parse().ok()).flatten()
}

/// The bytes of a memory limit as the daemon prints it (`8G`, `512M`).
fn memory_bytes(answer: &str) -> Option<u64> {
    let (digits, unit) = match (answer.strip_suffix('G'), answer.strip_suffix('M')) {
        (Some(d), _) => (d, 1u64 << 30),
        (None, Some(d)) => (d, 1u64 << 20),
        (None, None) => return None,
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

/// Whether the daemon's answer to `get_default_device_pinned_mem_limit` shows `set` bytes.
/// The real daemon shows a limit of a gibibyte or more in whole `G`, rounded down (an
/// H100 answered `79G` for `81559M`, `19G` for `20389M`), smaller ones in `M`: the answer
/// must be the set limit rounded down to its unit.
pub(super) fn pinned_limit_reads_back(set: u64, answer: &str) -> bool {
    let (digits, unit) = match (answer.strip_suffix('G'), answer.strip_suffix('M')) {
        (Some(d), _) => (d, 1u64 << 30),
        (None, Some(d)) => (d, 1u64 << 20),
        (None, None) => return false,
    };
    digits.parse::<u64>().ok().and_then(|n| n.checked_mul(unit)) == Some(set / unit * unit)
}

/// The client PIDs of `ps`'s rows (`PID ID SERVER DEVICE NAMESPACE COMMAND`, after a
/// header; nothing at all without clients).
pub(super) fn ps_client_pids(lines: &[String]) -> Vec<u32> {
    lines.iter().filter_map(|l| l.split_whitespace().next()?.parse().ok()).collect()
}

/// `25.0` → 25.
pub(super) fn parse_percentage(answer: &str) -> Option<u32> {
    let value: f64 = answer.trim().parse().ok()?;
    (value.fract() == 0.0).then_some(value as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn lines(text: &[&str]) -> Vec<String> {
        text.iter().map(|l| l.to_string()).collect()
    }

    #[test]
    fn one_run_is_told_apart_by_the_shapes_of_its_answers() {
        // What the H100 answered (mps-privilege-h100-2026-12-06): defaults 40 % and 8G,
        // server 600 with the same, one client in `ps`.
        let ps = [
            "PID       ID        SERVER         DEVICE                    NAMESPACE      COMMAND",
            "563       1         600            GPU-73564394-e8b4-767b    4026531836     python3",
        ];
        let mut answers = lines(&["40.0", "8G", "40.0", "8G", "600"]);
        answers.extend(lines(&ps));
        let batch = parse_batch(&answers, true).unwrap();
        assert_eq!(batch.threads, 40.0);
        assert_eq!(batch.memory.as_deref(), Some("8G"));
        assert_eq!(batch.asked, Some((40.0, Some("8G".into()))));
        assert_eq!(batch.servers, [600]);
        assert_eq!(ps_client_pids(&batch.ps), [563]);
        // No default memory limit (answered by nothing), the server asked about gone and
        // another one running.
        let batch = parse_batch(&lines(&["25.0", "1053"]), true).unwrap();
        assert_eq!((batch.memory, batch.asked, batch.servers), (None, None, vec![1053]));
        // A server without a memory limit, a daemon with one: the memory after the
        // second percentage is the server's.
        let batch = parse_batch(&lines(&["25.0", "2G", "30.0", "600"]), true).unwrap();
        assert_eq!(batch.memory.as_deref(), Some("2G"));
        assert_eq!(batch.asked, Some((30.0, None)));
        let batch = parse_batch(&lines(&["25.0", "30.0", "6G", "600"]), true).unwrap();
        assert_eq!((batch.memory.as_deref(), batch.asked), (None, Some((30.0, Some("6G".into())))));
        // No server yet: nothing after the defaults.
        let batch = parse_batch(&lines(&["100.0"]), false).unwrap();
        assert!(batch.servers.is_empty() && batch.ps.is_empty());
        // Not a daemon's answer.
        assert_eq!(parse_batch(&lines(&["Unknown command \"x\""]), false), None);
        assert_eq!(parse_batch(&[], false), None);
    }

    #[test]
    fn memory_reads_back_against_what_was_set() {
        let set = MpsLimits {
            active_thread_percentage: 25,
            pinned_memory_limit_bytes: Some(20389 << 20),
        };
        // The daemon rounds a limit of a GiB or more down to whole G: still the limit set.
        assert_eq!(limits_of(25.0, Some("19G"), set), set);
        // Another value is what it says.
        let other = limits_of(90.0, Some("30G"), set);
        assert_eq!(
            other,
            MpsLimits { active_thread_percentage: 90, pinned_memory_limit_bytes: Some(30 * GIB) }
        );
        assert_eq!(limits_of(25.0, None, set).pinned_memory_limit_bytes, None);
        assert_eq!(memory_bytes("512M"), Some(512 << 20));
        assert_eq!(memory_bytes("G"), None);
        assert_eq!(percentage("600"), None);
        assert_eq!(percentage("33.3"), Some(33.3));
    }

    #[test]
    fn a_setting_reads_back_from_its_last_answers() {
        let want =
            MpsLimits { active_thread_percentage: 30, pinned_memory_limit_bytes: Some(6 * GIB) };
        // `set_active… 30` echoes 30.0, the memory setter says nothing, then the gets.
        assert_eq!(read_back(&lines(&["30.0", "30.0", "6G"]), want), Some(want));
        assert_eq!(
            read_back(&lines(&["40.0"]), want).map(|l| l.active_thread_percentage),
            Some(40)
        );
        assert_eq!(read_back(&[], want), None);
    }
}
