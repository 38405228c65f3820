//! Who uses the GPUs (issue 29), end to end on simulated GPUs: a process on a whole GPU
//! and one in each of two MIG instances (the simulated driver's `GPUSHARE_SIM_PROCESSES`,
//! with their memory), and two MPS clients of a server (the simulated control daemon's
//! `--fake-client PID --memory SIZE`, which the simulated driver then lists as MPS clients,
//! as driver 580 does), all real `sleep` processes of known users, attributed by
//! `gpushare-ctl clients` and `status`; another user sees no command line but its own;
//! clients leave the table when their process exits.

use std::path::Path;
use std::process::Command;

use gpushare_proto::clients::{ClientTable, GpuClient};
use gpushare_tests::{
    Agent, AgentOptions, MEMBER, OTHER, SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV, Sleeper, binary,
    directory_of, id_of, is_root, parse_doc, stdout, text,
};

/// GPU 0 in MIG, GPU 1 under MPS (2 replicas: 50 % threads each), GPU 2 left alone.
const MIXED: &str = "name = \"mixed\"\n\
    [[gpu]]\nselect = 0\nmig = { \"1g\" = 2, \"2g\" = 1, \"3g\" = 1 }\n\
    [[gpu]]\nselect = 1\nsharing = { mps = { replicas = 2 } }\n";

/// Connects the simulated CUDA client `pid`, holding `memory` (`2GiB`), to the MPS server
/// of pipe directory `pipe`: the simulated driver lists it as an MPS client from then on.
fn connect_client(pipe: &str, pid: u32, memory: &str) {
    let client = Command::new(binary(SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV))
        .args(["--fake-client", &pid.to_string(), "--memory", memory])
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
        .output()
        .unwrap();
    assert!(client.status.success(), "{}", text(&client));
}

/// `clients --json` as root.
fn clients(agent: &Agent) -> ClientTable {
    agent.ctl_doc(&["clients"])
}

/// The client with process `pid`.
fn client(table: &ClientTable, pid: u32) -> &GpuClient {
    table
        .clients
        .iter()
        .find(|c| c.pid == pid)
        .unwrap_or_else(|| panic!("no client {pid} in {table:#?}"))
}

fn pids(table: &ClientTable) -> Vec<u32> {
    let mut pids: Vec<u32> = table.clients.iter().map(|c| c.pid).collect();
    pids.sort_unstable();
    pids
}

#[test]
fn every_client_is_attributed_and_leaves_when_it_exits() {
    if !is_root() {
        gpushare_tests::skip("needs root to create test users and own the bus name");
        return;
    }
    let options = AgentOptions::simulate("a100-40gb:3").profile("mixed.toml", MIXED);
    let mut agent = Agent::start(options.for_other_users());
    let out = agent.ctl(&["apply", "mixed"]);
    assert!(out.status.success(), "{}", text(&out));
    let status = agent.status();
    let first = &status.gpus[0].instances[0];
    let (gi, mig_uuid) = (first.gpu_instance_id, first.uuid.clone().expect("one CI, its MIG-"));
    let second = &status.gpus[0].instances[1];
    let (gi2, mig_uuid2) = (second.gpu_instance_id, second.uuid.clone().expect("its MIG-"));

    // The whole-GPU client runs in a unit of its own, where the test may make one (made
    // first, so that it goes after the client even when the test fails).
    let unit = gpushare_tests::Cgroup::new("clients-whole");
    let whole = Sleeper::start(None, &[]);
    if let Some(unit) = &unit {
        unit.add(whole.pid());
    }
    let in_mig = Sleeper::start(None, &[]);
    let in_mig2 = Sleeper::start(Some(OTHER), &[]);
    let lowered = Sleeper::start(Some(MEMBER), &[("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "10")]);
    let plain = Sleeper::start(Some(OTHER), &[]);
    let processes =
        format!("2:{}=3682MiB,0/{gi}:{},0/{gi2}:{}", whole.pid(), in_mig.pid(), in_mig2.pid());
    agent.restart_with_env(&[("GPUSHARE_SIM_PROCESSES", &processes)]);
    let server = agent.mps_servers().into_iter().find(|s| s.gpu == 1).expect("GPU 1's server");
    connect_client(&server.pipe_directory, lowered.pid(), "2370MiB");
    connect_client(&server.pipe_directory, plain.pid(), "1GiB");

    let table = clients(&agent);
    let mut expected = vec![whole.pid(), in_mig.pid(), in_mig2.pid(), lowered.pid(), plain.pid()];
    expected.sort_unstable();
    assert_eq!(pids(&table), expected, "{table:#?}");

    let c = client(&table, whole.pid());
    assert_eq!(
        (c.via.as_str(), c.gpu, c.gpu_uuid.as_str()),
        ("gpu", 2, status.gpus[2].uuid.as_str())
    );
    assert_eq!((c.instance.as_deref(), c.mps_server.as_deref(), &c.share), (None, None, &None));
    assert_eq!((c.uid, c.user.as_deref()), (Some(0), Some("root")));
    assert_eq!(c.memory_bytes, Some(3682 << 20), "the simulated driver's figure");
    if let Some(unit) = &unit {
        assert_eq!(c.unit.as_deref(), Some(unit.unit()));
    }
    assert_eq!(c.command.as_deref(), Some("sleep 600"));

    let c = client(&table, in_mig.pid());
    assert_eq!((c.via.as_str(), c.gpu, c.gpu_instance_id), ("mig", 0, Some(gi)));
    assert_eq!(c.instance.as_deref(), Some(mig_uuid.as_str()));
    assert_eq!(c.memory_bytes, Some(512 << 20));
    let c = client(&table, in_mig2.pid());
    assert_eq!((c.via.as_str(), c.gpu_instance_id), ("mig", Some(gi2)));
    assert_eq!((c.instance.as_deref(), c.user.as_deref()), (Some(mig_uuid2.as_str()), Some(OTHER)));

    let gpu1 = status.gpus[1].uuid.as_str();
    let c = client(&table, lowered.pid());
    assert_eq!((c.via.as_str(), c.gpu, c.mps_server.as_deref()), ("mps", 1, Some(gpu1)));
    assert_eq!((c.uid, c.user.as_deref()), (Some(id_of("passwd", MEMBER)), Some(MEMBER)));
    assert_eq!(c.memory_bytes, Some(2370 << 20), "the driver's figure for an MPS client");
    let share = c.share.as_ref().expect("an MPS client's share");
    assert_eq!((share.active_thread_percentage, share.from.as_str()), (10, "client"));

    let c = client(&table, plain.pid());
    assert_eq!((c.via.as_str(), c.user.as_deref()), ("mps", Some(OTHER)));
    let share = c.share.as_ref().expect("an MPS client's share");
    assert_eq!(share.active_thread_percentage, server.active_thread_percentage);
    assert_eq!(
        (share.from.as_str(), share.pinned_memory_bytes),
        ("server", server.pinned_memory_limit_bytes)
    );

    // `status` shows the same clients under their GPUs, attributed alike, with no command
    // line and no share from a client's environment (everyone may call it).
    let now = agent.status();
    for (index, gpu) in now.gpus.iter().enumerate() {
        let mut on_it: Vec<u32> = gpu.clients.iter().map(|c| c.pid).collect();
        on_it.sort_unstable();
        let mut expected_here: Vec<u32> =
            table.clients.iter().filter(|c| c.gpu as usize == index).map(|c| c.pid).collect();
        expected_here.sort_unstable();
        assert_eq!(on_it, expected_here, "GPU {index}: {:#?}", gpu.clients);
        for c in &gpu.clients {
            assert_eq!(c.command, None, "{c:?}");
            let full = client(&table, c.pid);
            assert_eq!((&c.via, &c.user, &c.unit), (&full.via, &full.user, &full.unit));
            assert_eq!((&c.instance, &c.mps_server), (&full.instance, &full.mps_server));
            assert_eq!(c.memory_bytes, full.memory_bytes);
            // The server's share: a client's own lower one is its environment's word, which
            // only root and its user may read (issue 36), and status is everyone's.
            let share = c.share.as_ref().map(|s| (s.active_thread_percentage, s.from.as_str()));
            let expected = full.share.as_ref().map(|_| (server.active_thread_percentage, "server"));
            assert_eq!(share, expected, "{c:?}");
        }
    }
    let out = agent.ctl(&["status"]);
    let shown = stdout(&out);
    assert!(shown.contains("\nClients (command lines: gpushare-ctl clients):\n"), "{shown}");
    assert!(!shown.contains("sleep 600"), "{shown}");

    // The other two instances of GPU 0 are idle; GPU 1's server has clients.
    let idle: Vec<&str> = table.idle.iter().map(|d| d.what.as_str()).collect();
    assert_eq!(idle, ["mig"; 2], "{table:#?}");
    assert!(!table.idle.iter().any(|d| d.uuid == mig_uuid || d.uuid == mig_uuid2));

    // A member sees every client, and its own command line alone.
    let home = directory_of(MEMBER);
    let out = agent
        .ctl_as(MEMBER, None, home.path(), home.path(), &["clients", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let seen: ClientTable = parse_doc(&out, "clients --json as a member");
    assert_eq!(pids(&seen), expected);
    for c in &seen.clients {
        let own = c.pid == lowered.pid();
        assert_eq!(c.command.is_some(), own, "{c:?}");
        assert_eq!(c.memory_bytes, client(&table, c.pid).memory_bytes);
    }

    // A user outside the group (the bus policy lets anyone ask) sees every client too,
    // and its own processes' command lines alone.
    let home = directory_of(OTHER);
    let out = agent
        .ctl_as(OTHER, None, home.path(), home.path(), &["clients", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let seen: ClientTable = parse_doc(&out, "clients --json as another user");
    assert_eq!(pids(&seen), expected);
    for c in &seen.clients {
        assert_eq!(c.command.is_some(), c.user.as_deref() == Some(OTHER), "{c:?}");
    }
    // And the CDI devices.
    let out =
        agent.ctl_as(OTHER, None, home.path(), home.path(), &["cdi", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));

    // For people: a line each, then the idle instances.
    let out = agent.ctl(&["clients"]);
    assert!(out.status.success(), "{}", text(&out));
    let shown = stdout(&out);
    assert!(shown.starts_with("PID"), "{shown}");
    assert!(shown.contains("10 % threads (own)"), "{shown}");
    assert!(shown.contains("Idle:\n"), "{shown}");

    // Clients leave as their processes exit; the server without one is idle.
    let (gone, stays) = (whole.pid(), in_mig.pid());
    whole.end();
    lowered.end();
    let table = clients(&agent);
    assert_eq!(pids(&table), {
        let mut left = vec![stays, in_mig2.pid(), plain.pid()];
        left.sort_unstable();
        left
    });
    assert!(!table.clients.iter().any(|c| c.pid == gone));
    in_mig.end();
    in_mig2.end();
    plain.end();
    let table = clients(&agent);
    assert!(table.clients.is_empty(), "{table:#?}");
    let idle: Vec<&str> = table.idle.iter().map(|d| d.what.as_str()).collect();
    assert_eq!(idle, ["mig", "mig", "mig", "mig", "mps-server"], "{table:#?}");
    assert!(table.idle[4].uuid == gpu1);
}

#[test]
fn a_process_the_driver_lists_and_proc_lacks_is_said_not_dropped() {
    // A PID no process of the agent's PID namespace has (a client in another namespace
    // looks the same to the agent): the driver lists it with its memory.
    let mut agent = Agent::start(AgentOptions::simulate("a100-40gb:1"));
    let absent = 4_000_000_u32;
    assert!(!Path::new(&format!("/proc/{absent}")).exists());
    agent.restart_with_env(&[("GPUSHARE_SIM_PROCESSES", &format!("0:{absent}=700MiB"))]);
    let table = clients(&agent);
    assert!(table.clients.is_empty(), "{table:#?}");
    let [unseen] = table.unseen.as_slice() else { panic!("{table:#?}") };
    assert_eq!((unseen.pid, unseen.gpu, unseen.memory_bytes), (absent, 0, Some(700 << 20)));
    let text = stdout(&agent.ctl(&["clients"]));
    assert!(text.contains(&format!("  PID {absent}  GPU 0  700 MiB")), "{text}");
    assert!(!text.contains("No process uses the GPUs."), "{text}");
}
