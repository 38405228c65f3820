//! Issue 36, finding 6, as real users: what one user may see of another's GPU clients,
//! and a simulated driver that stays one.
//!
//! - With the agent's `/proc` mounted `hidepid=2` (the agent started in a mount namespace
//!   of its own: the host's `/proc` is left as it is), [`OTHER`] sees [`MEMBER`]'s client
//!   as NVIDIA's driver shows it to anyone (its PID, GPU and memory: recorded on an H100,
//!   tests/device/results/hidepid-smi-h100-2026-12-06), not whose it is, its unit or its
//!   command line; each sees their own whole; `status` shows everyone's as anyone may, and
//!   the metrics (whoever connects) have no user or unit label values.
//! - A value in MEMBER's client's private environment (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`)
//!   reaches neither OTHER's `clients` nor `status`.
//! - A cgroup MEMBER names in a subtree delegated to them (`docker-<64 hex>.scope`,
//!   `sshd.service`) is shown as their delegated unit, never as a container or a system
//!   unit; one root named so is.
//! - The device nodes the simulated driver makes as root are no one else's to open; an
//!   agent that drives NVIDIA's driver and finds the simulated library as
//!   `libnvidia-ml.so.1` is refused by it before it reads a knob or makes a file.
//!
//! Root only (test users, cgroups, device nodes, mount namespaces): others skip.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use gpushare_proto::clients::{ClientTable, GpuClient};
use gpushare_proto::types::Status;
use gpushare_tests::{
    Agent, AgentOptions, Cgroup, MEMBER, OTHER, SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV, Sleeper,
    as_user, binary, directory_of, id_of, is_root, parse_doc, stderr, text, wait_for,
};

use crate::metrics::{free_port, scrape};

/// `ARGS --json` of `gpushare-ctl` as `user` (root: `None`), parsed.
fn ctl_doc<T: serde::de::DeserializeOwned>(agent: &Agent, user: Option<&str>, args: &[&str]) -> T {
    let mut all = args.to_vec();
    all.push("--json");
    let out = match user {
        Some(user) => {
            let home = directory_of(user);
            agent.ctl_as(user, None, home.path(), home.path(), &all).output().unwrap()
        }
        None => agent.ctl(&all),
    };
    assert!(out.status.success(), "{user:?} {args:?}: {}", text(&out));
    parse_doc(&out, &format!("{args:?} as {user:?}"))
}

/// The client with process `pid`.
fn client(table: &ClientTable, pid: u32) -> &GpuClient {
    table
        .clients
        .iter()
        .find(|c| c.pid == pid)
        .unwrap_or_else(|| panic!("no client {pid} in {table:#?}"))
}

/// `(uid, user, unit, container, command)` of a client: what tells whose it is and what
/// it runs.
type Whose = (Option<u32>, Option<String>, Option<String>, Option<String>, Option<String>);

fn whose(c: &GpuClient) -> Whose {
    (c.uid, c.user.clone(), c.unit.clone(), c.container.clone(), c.command.clone())
}

const NOBODYS: Whose = (None, None, None, None, None);

/// Why a `/proc` mounted `hidepid=2` in a mount namespace of its own cannot be had here.
fn no_private_hidepid_proc() -> Option<String> {
    let probe = "mount -t proc -o hidepid=2 proc /proc && grep -q hidepid= /proc/self/mountinfo";
    match Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c", probe])
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!("unshare --mount with a hidepid /proc failed: {}", text(&out))),
        Err(e) => Some(format!("unshare: {e}")),
    }
}

/// A directory whose `gpushare-agent` starts this build's in a mount namespace of its own
/// with `/proc` mounted `hidepid=2` (the same process: unshare and sh exec it), beside
/// this build's `gpushare-ctl`.
fn hidepid_binaries() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let agent = binary("gpushare-agent", "GPUSHARE_AGENT_BIN");
    let script = format!(
        "#!/bin/sh\nexec unshare --mount --propagation private -- sh -c \
         'mount -t proc -o hidepid=2 proc /proc && exec \"$0\" \"$@\"' '{}' \"$@\"\n",
        agent.display()
    );
    let wrapper = dir.path().join("gpushare-agent");
    std::fs::write(&wrapper, script).unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink(
        binary("gpushare-ctl", "GPUSHARE_CTL_BIN"),
        dir.path().join("gpushare-ctl"),
    )
    .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[test]
fn under_hidepid_another_users_client_is_its_pid_gpu_and_memory() {
    if !is_root() {
        gpushare_tests::skip("needs root (test users, a mount namespace)");
        return;
    }
    if let Some(why) = no_private_hidepid_proc() {
        gpushare_tests::skip(why);
        return;
    }
    let binaries = hidepid_binaries();
    let port = free_port();
    let options = AgentOptions {
        config: Some(format!(
            "[metrics]\nlisten = \"127.0.0.1:{port}\"\nclient_refresh_seconds = 1\n"
        )),
        ..AgentOptions::simulate("a100-40gb:1")
    };
    let mut agent = Agent::start(options.for_other_users().binaries(binaries.path()));
    // MEMBER's client in a unit of its own where one can be made (root names it: a unit
    // anyone not hidden from may see).
    let unit = Cgroup::new("views-hidepid");
    let members = Sleeper::start(Some(MEMBER), &[]);
    if let Some(unit) = &unit {
        unit.add(members.pid());
    }
    let others = Sleeper::start(Some(OTHER), &[]);
    let processes = format!("0:{}=1GiB,0:{}=2GiB", members.pid(), others.pid());
    agent.restart_with_env(&[("GPUSHARE_SIM_PROCESSES", &processes)]);
    let (member, other) = (id_of("passwd", MEMBER), id_of("passwd", OTHER));
    let sleep = Some("sleep 600".to_string());
    let unit_name = unit.as_ref().map(|u| u.unit().to_string());
    let members_whole = (Some(member), Some(MEMBER.into()), unit_name, None, sleep.clone());
    let others_whole = (Some(other), Some(OTHER.into()), None, None, sleep);

    // Root sees everything.
    let table: ClientTable = ctl_doc(&agent, None, &["clients"]);
    assert_eq!(whose(client(&table, members.pid())), members_whole);
    // OTHER: MEMBER's client is a PID on GPU 0 with its memory, as nvidia-smi shows it to
    // anyone; their own is whole.
    let table: ClientTable = ctl_doc(&agent, Some(OTHER), &["clients"]);
    let c = client(&table, members.pid());
    assert_eq!(whose(c), NOBODYS, "{c:#?}");
    assert_eq!((c.gpu, c.via.as_str(), c.memory_bytes), (0, "gpu", Some(1 << 30)));
    assert_eq!(whose(client(&table, others.pid())), others_whole);
    // MEMBER, the other way round.
    let table: ClientTable = ctl_doc(&agent, Some(MEMBER), &["clients"]);
    assert_eq!(whose(client(&table, members.pid())), members_whole);
    assert_eq!(whose(client(&table, others.pid())), NOBODYS);
    // Status is everyone's: nobody's client is attributed there.
    let status: Status = ctl_doc(&agent, Some(OTHER), &["status"]);
    let shown = &status.gpus[0].clients;
    assert_eq!(shown.len(), 2, "{shown:#?}");
    for c in shown {
        assert_eq!(whose(c), NOBODYS, "{c:#?}");
        assert!(c.memory_bytes.is_some(), "{c:#?}");
    }
    // The metrics answer anyone: one series for GPU 0's processes, nobody's user or unit.
    let memory = "gpushare_client_gpu_memory_bytes{";
    let series = wait_for(Duration::from_secs(20), Duration::from_millis(250), || {
        let body = scrape(port);
        let series: Vec<String> =
            body.lines().filter(|l| l.starts_with(memory)).map(str::to_string).collect();
        match series.is_empty() {
            true => Err(format!("no client series yet:\n{body}")),
            false => Ok(series),
        }
    });
    let [one] = series.as_slice() else { panic!("one label set expected: {series:#?}") };
    assert!(one.contains(",user=\"\",unit=\"\"}"), "{one}");
    assert!(one.ends_with(&format!(" {}", 3u64 << 30)), "both clients' memory: {one}");
}

/// Connects the simulated CUDA client `pid`, holding `memory`, to the MPS server of pipe
/// directory `pipe` (the simulated driver lists it as an MPS client from then on).
fn connect_client(pipe: &str, pid: u32, memory: &str) {
    let out = Command::new(binary(SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV))
        .args(["--fake-client", &pid.to_string(), "--memory", memory])
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn a_clients_environment_reaches_no_other_user() {
    if !is_root() {
        gpushare_tests::skip("needs root to create test users and own the bus name");
        return;
    }
    let profile = "name = \"mps\"\n[[gpu]]\nselect = 0\nsharing = { mps = { replicas = 2 } }\n";
    let options = AgentOptions::simulate("a100-40gb:1").profile("mps.toml", profile);
    let agent = Agent::start(options.for_other_users());
    let out = agent.ctl(&["apply", "mps"]);
    assert!(out.status.success(), "{}", text(&out));
    let server = agent.mps_servers().into_iter().next().expect("GPU 0's server");
    assert_eq!(server.active_thread_percentage, 50);
    // MEMBER's client lowers its share in its own environment: 37 is MEMBER's secret.
    let env = [("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "37"), ("GPUSHARE_E2E_SECRET", "hunter2")];
    let members = Sleeper::start(Some(MEMBER), &env);
    connect_client(&server.pipe_directory, members.pid(), "1GiB");
    let share = |table: &ClientTable| {
        let s = client(table, members.pid()).share.clone().expect("an MPS client's share");
        (s.active_thread_percentage, s.from)
    };
    let own = (37, "client".to_string());
    let servers = (50, "server".to_string());
    assert_eq!(share(&ctl_doc(&agent, None, &["clients"])), own, "root may read it");
    assert_eq!(share(&ctl_doc(&agent, Some(MEMBER), &["clients"])), own, "MEMBER's own");
    assert_eq!(share(&ctl_doc(&agent, Some(OTHER), &["clients"])), servers);
    let status: Status = ctl_doc(&agent, Some(OTHER), &["status"]);
    let table = ClientTable { clients: status.gpus[0].clients.clone(), ..Default::default() };
    assert_eq!(share(&table), servers, "status is everyone's");
    // No other word of that environment anywhere.
    let home = directory_of(OTHER);
    for args in [&["clients", "--json"][..], &["status", "--json"], &["clients"]] {
        let out = agent.ctl_as(OTHER, None, home.path(), home.path(), args).output().unwrap();
        assert!(!String::from_utf8_lossy(&out.stdout).contains("hunter2"), "{}", text(&out));
    }
}

/// Cgroup directories made for a test, removed (once their processes are gone) on drop.
struct Made(Vec<PathBuf>);

impl Drop for Made {
    fn drop(&mut self) {
        for dir in self.0.iter().rev() {
            for _ in 0..250 {
                match std::fs::remove_dir(dir) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                    _ => break,
                }
            }
        }
    }
}

/// Moves process `pid` into cgroup `dir` (as root).
fn move_into(dir: &Path, pid: u32) {
    let procs = dir.join("cgroup.procs");
    std::fs::write(&procs, pid.to_string())
        .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", procs.display()));
}

#[test]
fn cgroups_a_user_names_are_not_containers_or_system_units() {
    if !is_root() {
        gpushare_tests::skip("needs root to create test users and cgroups");
        return;
    }
    let mut agent = Agent::start(AgentOptions::simulate("a100-40gb:1").for_other_users());
    // A subtree delegated to MEMBER, as systemd delegates user@UID.service: the directory
    // and its cgroup.procs, cgroup.threads and cgroup.subtree_control are MEMBER's. And a
    // leaf of root's.
    let (Some(delegated), Some(roots)) =
        (Cgroup::new("views-delegated"), Cgroup::new("views-root"))
    else {
        return;
    };
    let (uid, gid) = (id_of("passwd", MEMBER), id_of("group", MEMBER));
    for file in ["", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control"] {
        std::os::unix::fs::chown(delegated.path().join(file), Some(uid), Some(gid)).unwrap();
    }
    let id = "3f".repeat(32);
    let container = format!("docker-{id}.scope");
    let mut made = Made(Vec::new());
    for name in [container.as_str(), "sshd.service"] {
        let dir = delegated.path().join(name);
        let out = as_user(MEMBER).arg("mkdir").arg(&dir).output().unwrap();
        assert!(out.status.success(), "MEMBER names a cgroup of theirs: {}", text(&out));
        made.0.push(dir);
    }
    let system = roots.path().join(&container);
    std::fs::create_dir(&system).unwrap();
    made.0.push(system.clone());

    let as_container = Sleeper::start(Some(MEMBER), &[]);
    let as_sshd = Sleeper::start(Some(MEMBER), &[]);
    let in_roots = Sleeper::start(Some(MEMBER), &[]);
    move_into(&made.0[0], as_container.pid());
    move_into(&made.0[1], as_sshd.pid());
    move_into(&system, in_roots.pid());
    let processes = format!("0:{},0:{},0:{}", as_container.pid(), as_sshd.pid(), in_roots.pid());
    agent.restart_with_env(&[("GPUSHARE_SIM_PROCESSES", &processes)]);

    for viewer in [None, Some(MEMBER), Some(OTHER)] {
        let table: ClientTable = ctl_doc(&agent, viewer, &["clients"]);
        for pid in [as_container.pid(), as_sshd.pid()] {
            let c = client(&table, pid);
            let place = (c.user.as_deref(), c.unit.as_deref(), c.container.as_deref());
            assert_eq!(place, (Some(MEMBER), Some(delegated.unit()), None), "{viewer:?}: {c:#?}");
        }
        // Root named this one: a container.
        let c = client(&table, in_roots.pid());
        assert_eq!(c.container.as_deref(), Some(&id[..12]), "{viewer:?}: {c:#?}");
    }
}

/// `<state>.host/dev/…`: the simulated driver's device nodes of `agent`.
fn device_nodes(agent: &Agent) -> Vec<PathBuf> {
    let mut host = agent.sim_state().into_os_string();
    host.push(".host/dev");
    let dev = PathBuf::from(host);
    let mut nodes = Vec::new();
    for dir in [dev.clone(), dev.join("nvidia-caps")] {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            if entry.file_type().unwrap().is_char_device() {
                nodes.push(entry.path());
            }
        }
    }
    nodes
}

#[test]
fn the_simulators_device_nodes_are_roots_alone() {
    if !is_root() {
        gpushare_tests::skip("the simulator makes device nodes only as root");
        return;
    }
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:1").for_other_users());
    let mut marker = agent.sim_state().into_os_string();
    marker.push(".host/gpushare-simulated-host");
    let said = std::fs::read_to_string(PathBuf::from(marker)).unwrap();
    if !said.contains("device nodes: made") {
        gpushare_tests::skip(format_args!("root here may not make device nodes: {said}"));
        return;
    }
    let nodes = device_nodes(&agent);
    assert!(nodes.iter().any(|n| n.ends_with("dev/nvidia0")), "{nodes:?}");
    assert!(nodes.iter().any(|n| n.ends_with("nvidia-caps/nvidia-cap2")), "{nodes:?}");
    for node in &nodes {
        // Its path is open to OTHER (the agent's directories are 0755), the node is not:
        // access(2) as OTHER, by the permission bits alone.
        let out = as_user(OTHER).args(["test", "-r"]).arg(node).output().unwrap();
        assert!(!out.status.success(), "OTHER may read {}", node.display());
        let out = as_user(OTHER).args(["test", "-w"]).arg(node).output().unwrap();
        assert!(!out.status.success(), "OTHER may write {}", node.display());
        let out = as_user(OTHER).args(["test", "-e"]).arg(node).output().unwrap();
        assert!(out.status.success(), "OTHER reaches {}", node.display());
    }
}

#[test]
fn a_production_agent_is_refused_by_the_simulated_library_before_it_makes_anything() {
    if !is_root() {
        gpushare_tests::skip("the finding is root's agent making device nodes");
        return;
    }
    // The simulated library where the loader looks first for libnvidia-ml.so.1.
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("lib");
    std::fs::create_dir(&lib).unwrap();
    let simulated = gpushare_tests::simulated_library();
    std::os::unix::fs::symlink(&simulated, lib.join("libnvidia-ml.so.1")).unwrap();
    // Knobs left in its environment, and a state file the library would make.
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let out = Command::new(binary("gpushare-agent", "GPUSHARE_AGENT_BIN"))
        .args(["--check-driver", "--config"])
        .arg(dir.path().join("agent.toml"))
        .env("LD_LIBRARY_PATH", &lib)
        .env("GPUSHARE_SIM_NODE", "a100-40gb:1")
        .env("GPUSHARE_SIM_STATE", state.join("node.json"))
        .env("GPUSHARE_SIM_PROCESSES", "0:1")
        .env("GPUSHARE_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(stderr(&out).contains("simulated driver"), "{}", text(&out));
    let left: Vec<PathBuf> =
        std::fs::read_dir(&state).unwrap().flatten().map(|e| e.path()).collect();
    assert!(left.is_empty(), "the library made {left:?}: {}", text(&out));
}
