//! `gpushare-ctl top` on a GPU instance split into compute instances (`"1c.3g" = 3`): a
//! line for the GPU instance, then one per compute instance with its profile name and
//! MIG UUID as `status` shows them, then the processes the driver places in the GPU
//! instance (it never names their compute instance); a whole instance keeps its one line.
//! The GPU line of a MIG GPU says `util -` and states the total memory once.

use std::process::{Child, Command, Stdio};

use crate::clients_watch::watch_until;
use gpushare_tests::{Agent, AgentOptions, stdout, text};

/// GPU 0: one 3g instance split into three 1c compute instances, and one whole 3g.
const SPLIT: &str = "name = \"split\"\n[[gpu]]\nselect = 0\nmig = { \"1c.3g\" = 3, \"3g\" = 1 }\n";

/// A `sleep` the simulated driver lists as a compute process, killed on drop.
struct Sleeper(Child);

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The first view `gpushare-ctl top` prints into a pipe (up to its first blank line).
fn first_view(agent: &Agent) -> String {
    let command = agent.ctl_command(&["top", "--interval", "0.2"]);
    let (code, out) = watch_until(command, 1, |out| out.matches("\n\n").count());
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("\n\n"), "a view within 20 s: {out}");
    out.split("\n\n").next().unwrap_or_default().to_owned()
}

#[test]
fn top_lists_each_compute_instance_and_the_gpu_instances_processes_under_it() {
    let mut agent =
        Agent::start(AgentOptions::simulate("a100-40gb:1").profile("split.toml", SPLIT));
    let out = agent.ctl(&["apply", "split"]);
    assert!(out.status.success(), "{}", text(&out));
    let status = agent.status();
    let instances = &status.gpus[0].instances;
    let split = instances.iter().find(|i| i.compute_instances.len() == 3).expect("split GI");
    let whole = instances.iter().find(|i| i.compute_instances.len() == 1).expect("whole GI");
    let gi = split.gpu_instance_id;

    let sleeper = Command::new("sleep").arg("600").stdin(Stdio::null()).spawn().unwrap();
    let sleeper = Sleeper(sleeper);
    let processes = format!("0/{gi}:{}=1GiB", sleeper.0.id());
    agent.restart_with_env(&[("GPUSHARE_SIM_PROCESSES", &processes)]);

    let view = first_view(&agent);
    let lines: Vec<&str> = view.lines().collect();
    let gpu = lines.iter().find(|l| l.starts_with("GPU 0 ")).expect("GPU 0's line");
    // MIG on: no utilisation (no unit either); the total memory once, as `mem used/total`.
    assert!(gpu.contains("  util -  mem 1.0/40 GiB  "), "{view}");
    assert!(gpu.contains("  processes hold 1 GiB  GPU-"), "{view}");
    assert!(!gpu.contains("memory") && !gpu.contains(" - %"), "{view}");

    // The GPU instance, then its three compute instances, then its process.
    let head = format!("3g.20gb (GI {gi})  memory 19.5 GiB, processes hold 1 GiB");
    let at = lines.iter().position(|l| l.ends_with(&head)).unwrap_or_else(|| panic!("{view}"));
    let human_status = stdout(&agent.ctl(&["status"]));
    for (k, ci) in split.compute_instances.iter().enumerate() {
        let line = lines[at + 1 + k];
        let name = format!("1c.3g.20gb (CI {})", ci.compute_instance_id);
        assert!(line.contains(&name) && line.ends_with(&ci.uuid), "{view}");
        // As `status` shows it: the same name and UUID on one line.
        let shown = human_status.lines().any(|l| l.contains("1c.3g.20gb") && l.contains(&ci.uuid));
        assert!(shown, "{human_status}");
    }
    assert!(lines[at + 4].trim_start().starts_with("PID "), "{view}");
    let row = lines[at + 5];
    assert!(row.contains(&sleeper.0.id().to_string()), "{view}");
    assert!(row.contains(&format!("GPU 0/GI {gi}")), "{view}");
    assert_eq!(view.matches("1c.3g.20gb").count(), 3, "{view}");
    assert_eq!(view.matches(&format!(" {} ", sleeper.0.id())).count(), 1, "{view}");

    // The whole instance keeps its one line, with its own compute instance's UUID.
    let uuid = whole.uuid.as_deref().expect("whole GI's MIG device");
    let line =
        format!("3g.20gb (GI {}, CI 0)  exclusive  memory 19.5 GiB  {uuid}", whole.gpu_instance_id);
    assert!(lines.iter().any(|l| l.ends_with(&line)), "{view}");
    drop(sleeper);
}
