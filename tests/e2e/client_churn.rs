//! Many short-lived clients (issue 29): 1,000 simulated MPS clients (real `sleep`
//! processes announced to the simulated control daemons with `--fake-client`) of three
//! users, on four GPUs and, where the tests may make cgroup-v2 leaves, in three units,
//! come and go in overlapping waves while the agent refreshes its series per client every
//! second with a cap of 6 label sets. At every scrape the cap holds, the label sets left
//! out are counted, and promtool accepts the exposition; once the clients are gone no
//! client series and no client is left, and the agent's memory has not grown with them.
//! Half of the clients leave with `--fake-client-exit`, the others just die (a crash: the
//! simulated daemon keeps listing them, and the agent must drop them as their `/proc`
//! entry goes).
//!
//! Also: the unit of a process in a cgroup leaf is its `unit` in `clients --json` and in
//! the series' labels.

use std::collections::{BTreeSet, HashMap};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gpushare_proto::clients::ClientTable;
use gpushare_tests::{
    Agent, AgentOptions, Cgroup, MEMBER, OTHER, SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV, as_user,
    binary, ensure_users, is_root, text, wait_for,
};

use crate::client_metrics::promtool_accepts;
use crate::metrics::{free_port, scrape};

/// The label sets the agent is told to export at most.
const CAP: usize = 6;
/// Clients started in all.
const CLIENTS: usize = 1000;
/// Clients started together; a wave lives while the next one starts.
const WAVE: usize = 50;
/// How long the test waits between two waves.
const PAUSE: Duration = Duration::from_millis(700);

const DROPPED: &str = "gpushare_client_series_dropped_total";

/// The agent's configuration: metrics on `port`, the cap, a refresh every second.
fn config(port: u16) -> String {
    format!(
        "[metrics]\nlisten = \"127.0.0.1:{port}\"\nclient_series_max = {CAP}\n\
         client_refresh_seconds = 1\n"
    )
}

/// A `sleep` standing for an MPS client, killed and reaped on drop.
struct Client {
    child: Child,
    pipe: String,
    /// Whether it announces its exit (else it just dies, as a crashed client does).
    announces_exit: bool,
}

impl Client {
    fn start(user: Option<&str>, pipe: &str, announces_exit: bool) -> Client {
        let mut command = match user {
            Some(user) => {
                let mut c = as_user(user);
                c.arg("sleep");
                c
            }
            None => Command::new("sleep"),
        };
        // Not 600: a client the test fails to end goes by itself.
        command.arg("120").stdin(Stdio::null());
        let child = command.spawn().expect("sleep starts");
        Client { child, pipe: pipe.to_string(), announces_exit }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `--fake-client PID` (or `--fake-client-exit PID`) for each of `clients`, all at once.
fn announce<'a>(clients: impl IntoIterator<Item = &'a Client>, exit: bool) {
    let flag = if exit { "--fake-client-exit" } else { "--fake-client" };
    let control = binary(SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV);
    let running: Vec<Child> = clients
        .into_iter()
        .map(|c| {
            Command::new(&control)
                .args([flag, &c.pid().to_string()])
                .env("CUDA_MPS_PIPE_DIRECTORY", &c.pipe)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("the simulated control starts")
        })
        .collect();
    for child in running {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{flag}: {}", text(&out));
    }
}

/// The label sets of the client series in `body` (`gpushare_client_*` samples but the
/// dropped counter).
fn client_label_sets(body: &str) -> BTreeSet<String> {
    body.lines()
        .filter(|l| l.starts_with("gpushare_client_") && !l.starts_with(DROPPED))
        .filter_map(|l| Some(l.split_once('{')?.1.rsplit_once('}')?.0.to_string()))
        .collect()
}

/// `gpushare_client_series_dropped_total` in `body`.
fn dropped(body: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(DROPPED)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {DROPPED} in:\n{body}"))
}

/// The resident memory of process `pid` in KiB (`VmRSS`).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in {status}"))
}

/// What the scrapes during the churn saw.
#[derive(Debug, Default)]
struct Seen {
    scrapes: usize,
    /// The most client label sets of one scrape.
    most: usize,
    /// Scrapes with as many label sets as the cap.
    at_cap: usize,
    /// Scrapes promtool linted.
    linted: usize,
    /// The dropped counter at the last scrape.
    dropped: f64,
    /// Every label set seen.
    label_sets: BTreeSet<String>,
}

/// Scrapes `port` every 150 ms until `stop`: the cap must hold at every scrape, the
/// dropped counter never go down; promtool lints the first scrape at the cap and every
/// 15th.
fn watch_scrapes(port: u16, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Seen> {
    std::thread::spawn(move || {
        let mut seen = Seen::default();
        while !stop.load(Ordering::Relaxed) {
            let body = scrape(port);
            let sets = client_label_sets(&body);
            assert!(sets.len() <= CAP, "{} client label sets, cap {CAP}:\n{body}", sets.len());
            let count = dropped(&body);
            assert!(count >= seen.dropped, "{DROPPED} went down: {count} < {}", seen.dropped);
            seen.dropped = count;
            seen.most = seen.most.max(sets.len());
            let first_at_cap = sets.len() == CAP && seen.at_cap == 0;
            if sets.len() == CAP {
                seen.at_cap += 1;
            }
            if first_at_cap || seen.scrapes % 15 == 0 {
                promtool_accepts(&body);
                seen.linted += 1;
            }
            seen.label_sets.extend(sets);
            seen.scrapes += 1;
            std::thread::sleep(Duration::from_millis(150));
        }
        seen
    })
}

#[test]
fn a_thousand_short_lived_clients_leave_no_stale_series_and_the_cap_holds() {
    if !is_root() {
        gpushare_tests::skip("needs root to start clients as other users and own the bus name");
        return;
    }
    ensure_users();
    let began = Instant::now();
    let port = free_port();
    let options =
        AgentOptions { config: Some(config(port)), ..AgentOptions::simulate("h100-80gb:4") };
    let agent = Agent::start(options);
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "{}", text(&out));
    let pipes: Vec<String> = agent.mps_servers().into_iter().map(|s| s.pipe_directory).collect();
    assert_eq!(pipes.len(), 4, "one MPS server per GPU");
    // Units where cgroup leaves can be made (else every client has none).
    let units: Vec<Cgroup> =
        ["churn-a", "churn-b", "churn-c"].into_iter().map_while(Cgroup::new).collect();
    let users = [None, Some(MEMBER), Some(OTHER)];
    let unit_count = units.len() + 1;
    // Every label set: 4 GPUs × 3 users × (3 units and none, or none).
    assert!(4 * users.len() * unit_count > CAP);

    // The agent's memory once it has refreshed a few times, before the clients.
    let agent_pid = agent.pid().expect("the agent runs");
    let before = scrape(port);
    assert!(client_label_sets(&before).is_empty(), "{before}");
    assert_eq!(dropped(&before), 0.0, "{before}");
    std::thread::sleep(Duration::from_millis(2500));
    let rss_before = rss_kib(agent_pid);

    let stop = Arc::new(AtomicBool::new(false));
    let scrapes = watch_scrapes(port, Arc::clone(&stop));
    let mut alive: Vec<Client> = Vec::new();
    // What each client's attribution must be: GPU, user, unit.
    let mut expected: HashMap<u32, (u32, &str, Option<&str>)> = HashMap::new();
    let mut mid_table: Option<ClientTable> = None;
    let mut started = 0;
    let mut wave = 0;
    while started < CLIENTS {
        let count = WAVE.min(CLIENTS - started);
        let mut clients: Vec<Client> = (started..started + count)
            .map(|i| {
                let (gpu, user, unit) = (i % 4, (i / 4) % users.len(), (i / 12) % unit_count);
                let client = Client::start(users[user], &pipes[gpu], i % 2 == 0);
                if let Some(cgroup) = units.get(unit) {
                    cgroup.add(client.pid());
                }
                let user = users[user].unwrap_or("root");
                expected
                    .insert(client.pid(), (gpu as u32, user, units.get(unit).map(Cgroup::unit)));
                client
            })
            .collect();
        announce(&clients, false);
        // One in five dies at once: most are never seen by a refresh.
        for client in clients.iter_mut().step_by(5) {
            client.kill();
        }
        // The wave before ends: half announce it, the others die without a word.
        announce(alive.iter().filter(|c| c.announces_exit), true);
        for mut client in alive.drain(..) {
            client.kill();
        }
        alive = clients;
        started += count;
        wave += 1;
        if wave == 10 {
            mid_table = Some(agent.ctl_doc(&["clients"]));
        }
        std::thread::sleep(PAUSE);
    }
    let churn = began.elapsed();
    announce(alive.iter().filter(|c| c.announces_exit), true);
    for mut client in alive.drain(..) {
        client.kill();
    }

    // Gone within a few refreshes: no client series, only the dropped counter.
    let body = wait_for(Duration::from_secs(10), Duration::from_millis(200), || {
        let body = scrape(port);
        if client_label_sets(&body).is_empty() {
            return Ok(body);
        }
        Err(format!("client series left after every client exited:\n{body}"))
    });
    stop.store(true, Ordering::Relaxed);
    let seen = scrapes.join().expect("the scrapes");
    assert!(!body.lines().any(|l| l.starts_with("gpushare_client_gpu_memory_bytes")), "{body}");
    assert!(!body.lines().any(|l| l.starts_with("gpushare_client_mps_active")), "{body}");
    assert!(body.lines().any(|l| l.starts_with(DROPPED)), "{body}");
    promtool_accepts(&body);
    let table: ClientTable = agent.ctl_doc(&["clients"]);
    assert!(table.clients.is_empty(), "clients left: {:#?}", table.clients);

    // The cap was reached and held, the label sets left out counted.
    assert_eq!(seen.most, CAP, "{seen:?}");
    assert!(seen.at_cap >= 3, "{seen:?}");
    assert!(seen.linted >= 2, "{seen:?}");
    assert!(dropped(&body) > 0.0 && dropped(&body) >= seen.dropped, "{seen:?}\n{body}");
    // Every label set names one of the test's users and units (the cap keeps those exported
    // first while they have clients, so not every one is seen).
    let unit_names: Vec<&str> = units.iter().map(Cgroup::unit).chain([""]).collect();
    for set in &seen.label_sets {
        let has = |name: &str, values: &[&str]| {
            values.iter().any(|v| set.contains(&format!("{name}=\"{v}\"")))
        };
        assert!(has("user", &["root", MEMBER, OTHER]) && has("unit", &unit_names), "{set}");
        assert!(set.contains("via=\"mps\""), "{set}");
    }
    // Mid-churn, the table attributed each live client to its user, unit and GPU.
    let mid = mid_table.expect("a table in the middle");
    // A wave's 40 survivors (one in five died at once), the wave before ended.
    assert!(mid.clients.len() >= 24, "{} clients in the middle of the churn", mid.clients.len());
    for c in &mid.clients {
        let (gpu, user, unit) = expected
            .get(&c.pid)
            .unwrap_or_else(|| panic!("a client the test did not start: {c:?}"));
        assert_eq!((c.via.as_str(), c.gpu), ("mps", *gpu), "{c:?}");
        assert_eq!((c.user.as_deref(), c.unit.as_deref()), (Some(*user), *unit), "{c:?}");
    }
    let users_seen: BTreeSet<_> = mid.clients.iter().map(|c| c.user.clone()).collect();
    let units_seen: BTreeSet<_> = mid.clients.iter().map(|c| c.unit.clone()).collect();
    assert_eq!((users_seen.len(), units_seen.len()), (3, unit_count), "{mid:#?}");

    // The agent's memory did not grow with the clients.
    let rss_after = rss_kib(agent_pid);
    assert!(
        rss_after < 2 * rss_before + 8 * 1024,
        "the agent's RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
    eprintln!(
        "{CLIENTS} clients in {wave} waves: churn {:.1} s, all {:.1} s; {} scrapes ({} at the \
         cap, {} linted), {} label sets seen, {} left out in all; {} unit(s); {} clients in the \
         middle; agent RSS \
         {rss_before} → {rss_after} KiB",
        churn.as_secs_f64(),
        began.elapsed().as_secs_f64(),
        seen.scrapes,
        seen.at_cap,
        seen.linted,
        seen.label_sets.len(),
        dropped(&body),
        units.len(),
        mid.clients.len(),
    );
}

#[test]
fn a_cgroup_unit_is_the_clients_unit_in_the_table_and_the_series() {
    if !is_root() {
        gpushare_tests::skip("needs root to make cgroups and own the bus name");
        return;
    }
    let Some(cgroup) = Cgroup::new("attribution") else { return };
    ensure_users();
    let port = free_port();
    let options =
        AgentOptions { config: Some(config(port)), ..AgentOptions::simulate("h100-80gb:2") };
    let agent = Agent::start(options);
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "{}", text(&out));
    let server = agent.mps_servers().into_iter().find(|s| s.gpu == 1).expect("GPU 1's server");
    let gpu1 = agent.status().gpus[1].uuid.clone();

    let mut client = Client::start(Some(MEMBER), &server.pipe_directory, true);
    cgroup.add(client.pid());
    assert_eq!(cgroup.pids(), [client.pid()]);
    let unit = cgroup.unit().to_string();
    assert!(unit.starts_with("attribution-") && unit.ends_with(".service"), "{unit}");
    announce([&client], false);

    let table: ClientTable = agent.ctl_doc(&["clients"]);
    let c = table.clients.iter().find(|c| c.pid == client.pid()).expect("the client");
    assert_eq!((c.unit.as_deref(), c.container.as_deref()), (Some(unit.as_str()), None));
    assert_eq!((c.user.as_deref(), c.via.as_str(), c.gpu), (Some(MEMBER), "mps", 1));

    let labels = format!(
        "gpushare_client_mps_active_thread_ratio{{gpu=\"1\",UUID=\"{gpu1}\",GPU_I_ID=\"\",\
         via=\"mps\",user=\"{MEMBER}\",unit=\"{unit}\"}} "
    );
    let body = wait_for(Duration::from_secs(10), Duration::from_millis(200), || {
        let body = scrape(port);
        if body.lines().any(|l| l.starts_with(&labels)) {
            return Ok(body);
        }
        Err(format!("no {labels}in:\n{body}"))
    });
    assert_eq!(client_label_sets(&body).len(), 1, "{body}");
    promtool_accepts(&body);

    announce([&client], true);
    client.kill();
    wait_for(Duration::from_secs(10), Duration::from_millis(200), || {
        let body = scrape(port);
        if client_label_sets(&body).is_empty() {
            return Ok(());
        }
        Err(format!("the client's series stayed:\n{body}"))
    });
    let path = cgroup.path().to_path_buf();
    drop(cgroup);
    assert!(!path.exists(), "{} left behind", path.display());
}
