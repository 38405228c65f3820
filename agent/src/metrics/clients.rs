//! Series per client (issue 29): the GPU memory and MPS share of the clients in the
//! engine's client table, aggregated over bounded label sets, and the journal lines of
//! clients that come and go.
//!
//! [`watch`] refreshes them every few seconds (`[metrics] client_refresh_seconds`, 5 by
//! default) from [`Engine::clients_and_servers`] (one shared observation, as `status` reads
//! it; no command line or environment read). The endpoint answers whoever connects, so the
//! series are the clients as anyone may see them (`ClientsRefresh::public`): under
//! `hidepid`, no `user` or `unit` (both empty: one series per GPU, instance and way in),
//! and a thread share that is always the server's; the journal's lines name every client.
//!
//! # Labels
//!
//! `gpu` (index), `UUID` (the GPU's `GPU-…`), `GPU_I_ID` (the MIG GPU instance id, empty
//! on a whole GPU), as the other GPU series name them (dcgm-exporter's: series join); `via`
//! (`gpu`, `mig`, `mps`); `user` (the name, else the uid, else empty); `unit` (the systemd
//! unit, else the container id, else empty). Never a PID or a command line. Not
//! `instance`: Prometheus sets that label on every scraped series itself (ours would
//! become `exported_instance`).
//!
//! Several clients with the same labels (one user's processes in one unit on one device)
//! are one series: their memory summed, their thread share the highest of theirs.
//!
//! # Removal and cap
//!
//! These series are rendered by [`render`] beside the recorder's (the recorder cannot
//! remove a series): a label set no client has any more is gone at the next refresh. At
//! most `[metrics] client_series_max` label sets ([`SERIES_MAX`] by default) are exported,
//! shared out equally among users (see [`ClientSeries::update`]), within each user's share
//! those exported before first; each refresh counts the label sets it leaves out in
//! `gpushare_client_series_dropped_total`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use gpushare_proto::clients::{ClientTable, GpuClient};
use metrics::{Unit, counter, describe_counter};

use crate::engine::Engine;
use crate::engine::clients::ServerHealth;

/// GPU memory of a label set's clients.
pub const CLIENT_MEMORY: &str = "gpushare_client_gpu_memory_bytes";
/// Active thread share of a label set's MPS clients, 0-1.
pub const CLIENT_THREADS: &str = "gpushare_client_mps_active_thread_ratio";
/// Label sets left out by the cap, counted at each refresh.
pub const CLIENT_DROPPED: &str = "gpushare_client_series_dropped_total";
/// The most label sets exported by default (`[metrics] client_series_max`).
pub const SERIES_MAX: usize = crate::config::CLIENT_SERIES_MAX;
/// How often [`watch`] refreshes by default (`[metrics] client_refresh_seconds`).
pub const REFRESH_EVERY: Duration = Duration::from_secs(crate::config::CLIENT_REFRESH_SECONDS);

/// The labels of one client series.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClientKey {
    /// `gpu`: the GPU's index.
    pub gpu: u32,
    /// `UUID`: the GPU's `GPU-…`.
    pub gpu_uuid: String,
    /// `GPU_I_ID`: the MIG GPU instance id, empty on a whole GPU.
    pub gpu_instance: String,
    /// `via`: `gpu`, `mig` or `mps`.
    pub via: String,
    /// `user`: the user's name, else the uid, else empty.
    pub user: String,
    /// `unit`: the systemd unit or Slurm job (`slurm-job-<id>`), else the container id, else
    /// empty.
    pub unit: String,
}

impl ClientKey {
    /// The labels of client `c`.
    pub fn of(c: &GpuClient) -> Self {
        ClientKey {
            gpu: c.gpu,
            gpu_uuid: c.gpu_uuid.clone(),
            gpu_instance: c.gpu_instance_id.map(|i| i.to_string()).unwrap_or_default(),
            via: c.via.clone(),
            user: c.user.clone().or_else(|| c.uid.map(|u| u.to_string())).unwrap_or_default(),
            unit: c.unit.clone().or_else(|| c.container.clone()).unwrap_or_default(),
        }
    }

    fn labels(&self) -> [(&'static str, String); 6] {
        [
            ("gpu", self.gpu.to_string()),
            ("UUID", self.gpu_uuid.clone()),
            ("GPU_I_ID", self.gpu_instance.clone()),
            ("via", self.via.clone()),
            ("user", self.user.clone()),
            ("unit", self.unit.clone()),
        ]
    }
}

/// What the clients of one label set add up to.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Aggregate {
    /// Their memory summed; `None` when the driver reports none of theirs (MPS clients).
    pub memory_bytes: Option<u64>,
    /// The highest active thread percentage among them (MPS clients only).
    pub threads: Option<u32>,
}

/// The exported client series, at most `cap` label sets.
#[derive(Debug)]
pub struct ClientSeries {
    series: BTreeMap<ClientKey, Aggregate>,
    cap: usize,
}

impl Default for ClientSeries {
    fn default() -> Self {
        Self::new()
    }
}

impl ClientSeries {
    /// No series, at most [`SERIES_MAX`] label sets.
    pub const fn new() -> Self {
        Self::with_cap(SERIES_MAX)
    }

    /// No series, at most `cap` label sets.
    pub const fn with_cap(cap: usize) -> Self {
        ClientSeries { series: BTreeMap::new(), cap }
    }

    /// Sets the most label sets exported, from the next [`ClientSeries::update`] on.
    pub fn set_cap(&mut self, cap: usize) {
        self.cap = cap;
    }

    /// The most label sets exported.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Replaces the series with `table`'s; returns how many label sets the cap left out.
    pub fn update(&mut self, table: &ClientTable) -> usize {
        let mut all: BTreeMap<ClientKey, Aggregate> = BTreeMap::new();
        for c in &table.clients {
            let a = all.entry(ClientKey::of(c)).or_default();
            if let Some(m) = c.memory_bytes {
                a.memory_bytes = Some(a.memory_bytes.unwrap_or(0).saturating_add(m));
            }
            if let Some(share) = &c.share {
                a.threads = a.threads.max(Some(share.active_thread_percentage));
            }
        }
        let total = all.len();
        if total <= self.cap {
            self.series = all;
            return 0;
        }
        // Over the cap, the label sets are shared out by user, so that one user's many
        // units cannot crowd out everyone else's: each user gets up to the same number
        // (`level`, the most that fits), the few places left go one each to users with
        // more. Within a user's share the label sets exported
        // before come first (a series does not come and go from one scrape to the next),
        // then new ones in order.
        let mut by_user: BTreeMap<String, Vec<(ClientKey, Aggregate)>> = BTreeMap::new();
        for (key, aggregate) in all {
            by_user.entry(key.user.clone()).or_default().push((key, aggregate));
        }
        for sets in by_user.values_mut() {
            sets.sort_by_key(|(k, _)| !self.series.contains_key(k));
        }
        let shares = |level: usize| by_user.values().map(|s| s.len().min(level)).sum::<usize>();
        let (mut level, mut above) = (0, by_user.values().map(Vec::len).max().unwrap_or(0));
        while level < above {
            let mid = (level + above).div_ceil(2);
            if shares(mid) <= self.cap { level = mid } else { above = mid - 1 }
        }
        let mut spare = self.cap - shares(level);
        // The spare places go first to users who had more than `level` exported.
        let exported =
            |u: &str| by_user[u].iter().filter(|(k, _)| self.series.contains_key(k)).count();
        let mut users: Vec<&String> = by_user.keys().collect();
        users.sort_by_key(|u| exported(u) <= level);
        let mut series = BTreeMap::new();
        for user in users {
            let sets = &by_user[user];
            let mut allowed = sets.len().min(level);
            if sets.len() > level && spare > 0 {
                allowed += 1;
                spare -= 1;
            }
            series.extend(sets.iter().take(allowed).cloned());
        }
        self.series = series;
        total - self.series.len()
    }

    /// The series in the exposition format, empty when there are none.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let memory: Vec<_> =
            self.series.iter().filter_map(|(k, a)| Some((k, a.memory_bytes? as f64))).collect();
        let threads: Vec<_> = self
            .series
            .iter()
            .filter_map(|(k, a)| Some((k, f64::from(a.threads?) / 100.0)))
            .collect();
        for (name, help, samples) in [
            (
                CLIENT_MEMORY,
                "GPU memory of clients, summed by GPU, instance, way in, user and unit.",
                memory,
            ),
            (
                CLIENT_THREADS,
                "Active thread share of MPS clients (0-1), the highest by GPU, instance, user and unit.",
                threads,
            ),
        ] {
            if samples.is_empty() {
                continue;
            }
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (key, value) in samples {
                let labels: Vec<String> =
                    key.labels().iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
                let _ = writeln!(out, "{name}{{{}}} {value}", labels.join(","));
            }
            out.push('\n');
        }
        out
    }

    /// How many label sets are exported.
    pub fn len(&self) -> usize {
        self.series.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }
}

/// A label value as the exposition format quotes it.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The series [`render`] shows.
static SERIES: Mutex<ClientSeries> = Mutex::new(ClientSeries::new());

/// The client series, for the endpoint to append to the recorder's.
pub fn render() -> String {
    SERIES.lock().unwrap_or_else(PoisonError::into_inner).render()
}

/// Describes the dropped counter and creates it at 0.
pub fn register() {
    describe_counter!(
        CLIENT_DROPPED,
        Unit::Count,
        "Client label sets not exported because of the cap, counted at each refresh."
    );
    counter!(CLIENT_DROPPED).increment(0);
}

/// Sets the client series from `table`.
pub fn update(table: &ClientTable) {
    let dropped = SERIES.lock().unwrap_or_else(PoisonError::into_inner).update(table);
    counter!(CLIENT_DROPPED).increment(dropped as u64);
}

/// A client as the journal lines remember it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    who: String,
    place: String,
    gpu: u32,
    server: Option<String>,
}

/// The clients of the last refresh and the MPS servers' health, to log who comes and goes.
#[derive(Debug, Default)]
pub struct Journal {
    clients: HashMap<(u32, u32), Seen>,
    servers: HashMap<String, ServerHealth>,
    /// Whether a first refresh was taken: the clients found then were running already.
    primed: bool,
}

/// What a client's comings and goings are logged as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A client appeared (debug).
    Started(String),
    /// A client left (debug).
    Left(String),
    /// A client left as its MPS server restarted or went down (info).
    Faulted(String),
}

impl Journal {
    /// The changes since the last call (the first call reports every client as running
    /// when the agent started). Holds at most one entry per client of the table (itself
    /// capped).
    pub fn diff(&mut self, table: &ClientTable, servers: &[ServerHealth]) -> Vec<Change> {
        let now: HashMap<(u32, u32), Seen> = table
            .clients
            .iter()
            .map(|c| {
                let key = ClientKey::of(c);
                let user = if key.user.is_empty() { "unknown user" } else { &key.user };
                let who = match (&c.container, &c.unit) {
                    (Some(id), _) => format!("client {} ({user}, container {id})", c.pid),
                    (None, Some(unit)) => format!("client {} ({user}, {unit})", c.pid),
                    (None, None) => format!("client {} ({user})", c.pid),
                };
                let place = match (&c.instance, &c.mps_server) {
                    (_, Some(server)) => {
                        format!("GPU {} through the MPS server of {server}", c.gpu)
                    }
                    (Some(mig), None) => format!("GPU {} MIG device {mig}", c.gpu),
                    (None, None) => match c.gpu_instance_id {
                        Some(gi) => format!("GPU {} GPU instance {gi}", c.gpu),
                        None => format!("GPU {}", c.gpu),
                    },
                };
                let seen = Seen { who, place, gpu: c.gpu, server: c.mps_server.clone() };
                ((c.pid, c.gpu), seen)
            })
            .collect();
        let health: HashMap<String, ServerHealth> =
            servers.iter().map(|s| (s.uuid.clone(), s.clone())).collect();
        let mut changes = Vec::new();
        let mut left: BTreeSet<&(u32, u32)> = BTreeSet::new();
        for (key, seen) in &self.clients {
            if now.contains_key(key) {
                continue;
            }
            left.insert(key);
            let faulted = seen.server.as_ref().is_some_and(|uuid| {
                let before = self.servers.get(uuid);
                match health.get(uuid) {
                    Some(h) => !h.running || before.is_some_and(|b| h.restarts > b.restarts),
                    None => false,
                }
            });
            changes.push(match (&seen.server, faulted) {
                (Some(server), true) => Change::Faulted(format!(
                    "{} ended as its MPS server ({server}, GPU {}) failed",
                    seen.who, seen.gpu
                )),
                _ => Change::Left(format!("{} left {}", seen.who, seen.place)),
            });
        }
        for (key, seen) in &now {
            if !self.clients.contains_key(key) {
                changes.push(Change::Started(if self.primed {
                    format!("{} started on {}", seen.who, seen.place)
                } else {
                    format!("{} was running on {} when the agent started", seen.who, seen.place)
                }));
            }
        }
        self.primed = true;
        changes.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        self.clients = now;
        self.servers = health;
        changes
    }
}

/// Refreshes the client series, at most `cap` label sets, and logs the clients that come
/// and go, every `every`.
pub fn watch(engine: Arc<Engine>, every: Duration, cap: usize) -> tokio::task::JoinHandle<()> {
    SERIES.lock().unwrap_or_else(PoisonError::into_inner).set_cap(cap);
    tokio::spawn(async move {
        let mut journal = Journal::default();
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match engine.clients_and_servers().await {
                Ok(refresh) => {
                    update(&refresh.public);
                    for change in journal.diff(&refresh.table, &refresh.servers) {
                        match change {
                            Change::Started(line) | Change::Left(line) => tracing::debug!("{line}"),
                            Change::Faulted(line) => tracing::info!("{line}"),
                        }
                    }
                }
                Err(e) => tracing::debug!("client metrics not refreshed: {e}"),
            }
        }
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use gpushare_proto::clients::ClientShare;

    const GPU0: &str = "GPU-00000000-0000-0000-0000-000000000000";

    fn client(pid: u32, user: &str, unit: Option<&str>) -> GpuClient {
        GpuClient {
            pid,
            uid: Some(1000),
            user: Some(user.into()),
            command: None,
            unit: unit.map(Into::into),
            container: None,
            gpu: 0,
            gpu_uuid: GPU0.into(),
            instance: None,
            gpu_instance_id: None,
            via: "gpu".into(),
            mps_server: None,
            memory_bytes: Some(100),
            share: None,
            unhealthy: None,
        }
    }

    fn mps(pid: u32, user: &str, threads: u32) -> GpuClient {
        GpuClient {
            via: "mps".into(),
            mps_server: Some(GPU0.into()),
            memory_bytes: None,
            share: Some(ClientShare {
                active_thread_percentage: threads,
                pinned_memory_bytes: None,
                from: "server".into(),
            }),
            ..client(pid, user, None)
        }
    }

    fn table(clients: Vec<GpuClient>) -> ClientTable {
        ClientTable { clients, ..ClientTable::default() }
    }

    #[test]
    fn clients_of_one_label_set_add_up() {
        let mut series = ClientSeries::new();
        let dropped = series.update(&table(vec![
            client(1, "alice", Some("a.service")),
            client(2, "alice", Some("a.service")),
            client(3, "bob", Some("a.service")),
            mps(4, "carol", 30),
            mps(5, "carol", 60),
        ]));
        assert_eq!((dropped, series.len()), (0, 3));
        let text = series.render();
        let line = |s: &str| text.lines().any(|l| l == s);
        assert!(
            line(&format!(
                "{CLIENT_MEMORY}{{gpu=\"0\",UUID=\"{GPU0}\",GPU_I_ID=\"\",via=\"gpu\",user=\"alice\",unit=\"a.service\"}} 200"
            )),
            "{text}"
        );
        assert!(
            line(&format!(
                "{CLIENT_MEMORY}{{gpu=\"0\",UUID=\"{GPU0}\",GPU_I_ID=\"\",via=\"gpu\",user=\"bob\",unit=\"a.service\"}} 100"
            )),
            "{text}"
        );
        assert!(
            line(&format!(
                "{CLIENT_THREADS}{{gpu=\"0\",UUID=\"{GPU0}\",GPU_I_ID=\"\",via=\"mps\",user=\"carol\",unit=\"\"}} 0.6"
            )),
            "{text}"
        );
        // MPS clients have no memory of their own in the driver's list: no memory series.
        assert!(!text.contains(&format!(
            "{CLIENT_MEMORY}{{gpu=\"0\",UUID=\"{GPU0}\",GPU_I_ID=\"\",via=\"mps\""
        )));
        assert!(text.contains(&format!("# TYPE {CLIENT_MEMORY} gauge")));
    }

    /// Series of every kind, for the promtool test of the whole exposition.
    pub(crate) fn sample() -> ClientSeries {
        let mut series = ClientSeries::new();
        series.update(&table(vec![
            client(1, "alice", Some("a.service")),
            client(2, "bob", None),
            mps(3, "carol", 40),
        ]));
        series
    }

    #[test]
    fn series_go_when_their_clients_do() {
        let mut series = ClientSeries::new();
        series.update(&table(vec![client(1, "alice", None), client(2, "bob", None)]));
        series.update(&table(vec![client(2, "bob", None)]));
        let text = series.render();
        assert!(!text.contains("alice") && text.contains("bob"), "{text}");
        series.update(&table(Vec::new()));
        assert_eq!(series.render(), "");
    }

    #[test]
    fn the_cap_holds_and_keeps_the_series_exported_before() {
        for cap in [SERIES_MAX, 6, 1] {
            let mut series =
                if cap == SERIES_MAX { ClientSeries::new() } else { ClientSeries::with_cap(cap) };
            assert_eq!(series.cap(), cap);
            series.update(&table(vec![client(1, "zed", None)]));
            // 1,000 short-lived clients of as many users.
            let many: Vec<GpuClient> =
                (0..1000).map(|i| client(10 + i, &format!("u{i:04}"), None)).collect();
            let mut with_zed = many.clone();
            with_zed.push(client(1, "zed", None));
            let dropped = series.update(&table(with_zed));
            assert_eq!((series.len(), dropped), (cap, 1001 - cap));
            assert!(series.render().contains("user=\"zed\""), "the series exported first stays");
            let samples = series.render().lines().filter(|l| !l.starts_with('#')).count();
            // One blank line after the family.
            assert_eq!(samples, cap + 1);
            // The next refresh: the same clients, the same series, as many left out.
            let before = series.render();
            assert_eq!(series.update(&table(many.clone())), 1000 - cap);
            assert_eq!(series.len(), cap);
            // zed left: its place goes to a new one, the others exported stay.
            let after = series.render();
            for line in before.lines().filter(|l| l.starts_with(CLIENT_MEMORY)) {
                assert_eq!(after.contains(line), !line.contains("zed"), "{line}\n{after}");
            }
            // They all exit: nothing stale.
            assert_eq!(series.update(&table(Vec::new())), 0);
            assert_eq!((series.len(), series.render()), (0, String::new()));
        }
    }

    #[test]
    fn one_user_with_many_units_does_not_crowd_out_the_others() {
        let mut series = ClientSeries::with_cap(6);
        let units: Vec<String> = (0..300).map(|i| format!("hog-{i:03}.scope")).collect();
        let hog: Vec<GpuClient> = units
            .iter()
            .enumerate()
            .map(|(i, u)| client(100 + i as u32, "mallory", Some(u)))
            .collect();
        assert_eq!(series.update(&table(hog.clone())), 294);
        let mut shared = hog.clone();
        shared.extend([client(1, "alice", Some("a.service")), client(2, "bob", None)]);
        shared.extend([client(3, "bob", Some("b.service")), client(4, "bob", Some("c.service"))]);
        assert_eq!(series.update(&table(shared.clone())), 300 + 4 - 6);
        let text = series.render();
        let count =
            |user: &str| text.lines().filter(|l| l.contains(&format!("user=\"{user}\""))).count();
        // 6 places: 1 each, then the rest, those exported before first (mallory's).
        assert_eq!((count("alice"), count("bob"), count("mallory")), (1, 2, 3), "{text}");
        // The next refresh keeps the same ones.
        assert_eq!(series.update(&table(shared)), 298);
        assert_eq!(series.render(), text);
        assert!(text.contains("unit=\"hog-000.scope\""), "mallory's first stay: {text}");
    }

    #[test]
    fn the_cap_can_change_between_refreshes() {
        let mut series = ClientSeries::with_cap(2);
        let three = table(vec![client(1, "a", None), client(2, "b", None), client(3, "c", None)]);
        assert_eq!(series.update(&three), 1);
        series.set_cap(3);
        assert_eq!((series.update(&three), series.len()), (0, 3));
        series.set_cap(1);
        assert_eq!((series.update(&three), series.len()), (2, 1));
    }

    #[test]
    fn label_values_are_escaped() {
        let mut series = ClientSeries::new();
        series.update(&table(vec![client(1, "a\"b\\c\nd", None)]));
        assert!(series.render().contains("user=\"a\\\"b\\\\c\\nd\""), "{}", series.render());
    }

    #[test]
    fn the_journal_tells_starts_leaves_and_faults() {
        let server = |restarts, running| ServerHealth { uuid: GPU0.into(), restarts, running };
        let mut journal = Journal::default();
        let changes = journal.diff(
            &table(vec![
                client(1, "alice", Some("a.service")),
                mps(2, "carol", 50),
                mps(3, "carol", 50),
            ]),
            &[server(0, true)],
        );
        assert_eq!(changes.len(), 3);
        let running = "client 1 (alice, a.service) was running on GPU 0 when the agent started";
        assert!(changes.contains(&Change::Started(running.into())), "{changes:?}");
        assert!(changes.iter().all(|c| matches!(c, Change::Started(_))));
        let contained =
            GpuClient { container: Some("0123456789ab".into()), ..client(4, "bob", None) };
        let changes = journal.diff(
            &table(vec![
                client(1, "alice", Some("a.service")),
                mps(2, "carol", 50),
                mps(3, "carol", 50),
                contained.clone(),
            ]),
            &[server(0, true)],
        );
        let started = "client 4 (bob, container 0123456789ab) started on GPU 0";
        assert_eq!(changes, [Change::Started(started.into())]);
        // Client 1 leaves; 2 goes with a restarted server.
        let changes =
            journal.diff(&table(vec![mps(3, "carol", 50), contained]), &[server(1, true)]);
        assert_eq!(
            changes,
            [
                Change::Faulted(format!(
                    "client 2 (carol) ended as its MPS server ({GPU0}, GPU 0) failed"
                )),
                Change::Left("client 1 (alice, a.service) left GPU 0".into()),
            ]
        );
        // A client leaving a server that did not restart just leaves.
        let changes = journal.diff(&table(Vec::new()), &[server(1, true)]);
        assert!(matches!(changes.as_slice(), [Change::Left(_), Change::Left(_)]), "{changes:?}");
        // Nothing more.
        assert!(journal.diff(&table(Vec::new()), &[]).is_empty());
    }
}
