//! Issue 26, point 3: compute instances inside GPU instances (`"1c.3g" = 3`), with an MPS
//! server per compute instance, on simulated H100 and A100 nodes, through the simulated
//! driver's NVML calls.

use gpushare_proto::types::{JobOutcome, Status};
use gpushare_tests::{Agent, AgentOptions, layout, reason_lines, stderr, stdout, temp_file, text};

/// A profile: GPU 0 in one 3g instance of three 1c compute instances, each behind its own
/// MPS server for 2 clients, beside a whole 3g.
const SUBDIVIDED: &str = "name = \"subdivided\"\n[[gpu]]\nselect = 0\n\
                          mig = { \"1c.3g\" = 3, \"3g\" = 1 }\n\
                          instance_sharing.\"1c.3g\" = { mps = { replicas = 2 } }\n";

/// The compute-instance lines of the simulated `nvidia-smi mig -lci` that name `name`
/// (`1c.3g.40gb`).
fn compute_instances(agent: &Agent, name: &str) -> usize {
    let out = agent.nvidia_smi(&["mig", "-i", "0", "-lci"]);
    stdout(&out).lines().filter(|l| l.contains(&format!("MIG {name} "))).count()
}

/// The MIG UUIDs of the MPS servers on GPU 0 and the placement of each.
fn servers(agent: &Agent) -> Vec<(Option<u32>, String)> {
    let mut servers: Vec<(Option<u32>, String)> = agent
        .mps_servers()
        .into_iter()
        .filter(|s| s.gpu == 0 && s.state == "running")
        .map(|s| (s.placement_start, s.uuid))
        .collect();
    servers.sort();
    servers
}

fn subdivision_with_mps_round_trips(spec: &str, three_g: &str) {
    let agent = Agent::start(AgentOptions::simulate(spec).profile("subdivided.toml", SUBDIVIDED));
    let outcome: JobOutcome = agent.ctl_doc(&["apply", "subdivided"]);
    assert!(outcome.ok, "{outcome:?}");
    let status = agent.status();
    let gpu = &status.gpus[0];
    assert!(gpu.mig_enabled);
    let instances: Vec<(&str, u32)> =
        gpu.instances.iter().map(|i| (i.profile.as_str(), i.placement_start)).collect();
    assert_eq!(instances, [(three_g, 0), (three_g, 4)], "{spec}");
    // The 3g at 0 holds three 1c compute instances, the one at 4 its full-size one.
    assert_eq!(compute_instances(&agent, &format!("1c.{three_g}")), 3, "{spec}");
    assert_eq!(compute_instances(&agent, three_g), 1, "{spec}");
    // One MPS server per compute instance, each on its own MIG device, none on the whole 3g.
    let running = servers(&agent);
    assert_eq!(running.len(), 3, "{running:?}");
    assert!(running.iter().all(|(start, uuid)| *start == Some(0) && uuid.starts_with("MIG-")));
    let mut uuids: Vec<&str> = running.iter().map(|(_, u)| u.as_str()).collect();
    uuids.dedup();
    assert_eq!(uuids.len(), 3, "{running:?}");
    let whole = gpu.instances.iter().find(|i| i.placement_start == 4).unwrap();
    assert_eq!(whole.sharing.strategy, "exclusive");
    // Status lists them: three 1c compute instances, each behind its own server.
    let split = gpu.instances.iter().find(|i| i.placement_start == 0).unwrap();
    let listed: Vec<(u32, &str)> = split
        .compute_instances
        .iter()
        .map(|c| (c.compute_slices, c.sharing.strategy.as_str()))
        .collect();
    assert_eq!(listed, [(1, "mps"), (1, "mps"), (1, "mps")], "{split:?}");
    let listed: Vec<&str> = split.compute_instances.iter().map(|c| c.uuid.as_str()).collect();
    let mut served: Vec<&str> = running.iter().map(|(_, u)| u.as_str()).collect();
    served.sort();
    let mut listed_sorted = listed.clone();
    listed_sorted.sort();
    assert_eq!(listed_sorted, served);
    assert_eq!(whole.compute_instances.len(), 1);
    assert_eq!(whole.compute_instances[0].compute_slices, 3);
    // With a 3g instance there, the driver has told its compute-instance sizes: the
    // simulated driver's are the MIG guide's rule.
    let profiles: gpushare_proto::types::MigProfiles = agent.ctl_doc(&["mig", "profiles", "0"]);
    let three = profiles.gpus[0].profiles.iter().find(|p| p.name == three_g).unwrap();
    let sizes: Vec<(u32, u32)> =
        three.compute_instances.iter().map(|c| (c.compute_slices, c.count)).collect();
    assert!(three.compute_from_driver, "{three:?}");
    assert_eq!(sizes, [(1, 3), (2, 1), (3, 1)]);
    let seven = profiles.gpus[0].profiles.iter().find(|p| p.name.starts_with("7g.")).unwrap();
    assert!(!seven.compute_from_driver, "no 7g instance exists to ask about");
    let text_status = stdout(&agent.ctl(&["status"]));
    assert_eq!(text_status.matches(&format!("1c.{three_g}")).count(), 3, "{text_status}");

    // Applying it again changes nothing; so does applying the export of the MIG layout,
    // in both formats, onto the same node once MPS is stopped.
    let again: JobOutcome = agent.ctl_doc(&["apply", "subdivided"]);
    assert!(again.ok && !again.changed, "{again:?}");
    let mig_only = SUBDIVIDED
        .lines()
        .filter(|l| !l.starts_with("instance_sharing"))
        .collect::<Vec<_>>()
        .join("\n");
    let (_dir, file) = temp_file("mig-only.toml", format!("{mig_only}\n"));
    let out = agent.ctl(&["apply", "-f", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(servers(&agent).is_empty());
    let before = layout(&agent.status());
    for format in ["toml", "mig-parted"] {
        let out = agent.ctl(&["export", "--format", format]);
        assert!(out.status.success(), "{}", text(&out));
        let exported = stdout(&out);
        assert!(exported.contains(&format!("\"1c.{three_g}\"")), "{exported}");
        let name = if format == "toml" { "node.toml" } else { "node.yaml" };
        let (_dir, file) = temp_file(name, &exported);
        let out = agent.ctl(&["plan", "-f", file.to_str().unwrap()]);
        assert!(text(&out).contains("nothing to do"), "{format}: {}\n{exported}", text(&out));
    }
    assert_eq!(layout(&agent.status()), before);

    // All disabled: no instance and no server left.
    let out = agent.ctl(&["apply", "subdivided"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(servers(&agent).len(), 3);
    let out = agent.ctl(&["apply", "all-disabled"]);
    assert!(out.status.success(), "{}", text(&out));
    let status: Status = agent.status();
    assert!(!status.gpus[0].mig_enabled && status.gpus[0].instances.is_empty());
    assert!(servers(&agent).is_empty(), "{:?}", servers(&agent));
}

#[test]
fn a_subdivision_with_mps_on_its_compute_instances_on_an_h100() {
    subdivision_with_mps_round_trips("h100-80gb:1", "3g.40gb");
}

#[test]
fn a_subdivision_with_mps_on_its_compute_instances_on_an_a100() {
    subdivision_with_mps_round_trips("a100-40gb:1", "3g.20gb");
}

/// The second compute instance fails to be created: the GPU goes back to the state
/// before, its subdivision and MPS servers included.
#[test]
fn a_failed_compute_instance_rolls_back_to_the_subdivision_before() {
    let first = "name = \"first\"\n[[gpu]]\nselect = 0\nmig = { \"2c.3g\" = 1, \"3g\" = 1 }\n\
                 instance_sharing.\"2c.3g\" = \"mps\"\n";
    let agent = Agent::start(
        AgentOptions::simulate("h100-80gb:1")
            .profile("first.toml", first)
            .profile("subdivided.toml", SUBDIVIDED),
    );
    let outcome: JobOutcome = agent.ctl_doc(&["apply", "first"]);
    assert!(outcome.ok, "{outcome:?}");
    let before = layout(&agent.status());
    let before_servers = servers(&agent).len();
    assert_eq!(before_servers, 1);
    assert_eq!(compute_instances(&agent, "2c.3g.40gb"), 1);
    // The first apply made two compute instances; the next one's second fails.
    let mut agent = agent;
    agent.restart_with_env(&[("GPUSHARE_SIM_FAIL", "nvmlGpuInstanceCreateComputeInstance:2")]);
    let out = agent.ctl(&["apply", "subdivided"]);
    assert!(!out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("rolled back: GPU 0 as before"), "{err}");
    assert!(err.contains("compute instance"), "{err}");
    assert_eq!(reason_lines(&err), 1, "{err}");
    let status = agent.status();
    assert_eq!(status.active_profile.as_deref(), Some("first"));
    assert_eq!(layout(&status), before);
    assert_eq!(compute_instances(&agent, "2c.3g.40gb"), 1);
    assert_eq!(compute_instances(&agent, "1c.3g.40gb"), 0);
    assert_eq!(servers(&agent).len(), before_servers);
}

/// mig-parted's own spelling applies, and the driver then holds what it says.
#[test]
fn a_mig_parted_file_with_compute_instances_applies() {
    let agent = Agent::start(AgentOptions::simulate("h100-80gb:1"));
    let yaml = "version: v1\nmig-configs:\n  split:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1c.3g.40gb\": 3\n        \"3g.40gb\": 1\n";
    let (_dir, file) = temp_file("split.yaml", yaml);
    let out = agent.ctl(&["apply", "-f", file.to_str().unwrap(), "-c", "split"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(compute_instances(&agent, "1c.3g.40gb"), 3);
    assert_eq!(compute_instances(&agent, "3g.40gb"), 1);
    let out = agent.ctl(&["plan", "-f", file.to_str().unwrap(), "-c", "split"]);
    assert!(text(&out).contains("nothing to do"), "{}", text(&out));
}

/// A subdivision that does not fit: one line naming the place and what would fit, and
/// nothing changed.
#[test]
fn a_subdivision_that_does_not_fit_is_refused_in_one_line() {
    let bad = "name = \"bad\"\n[[gpu]]\nselect = 0\nmig = { \"4c.3g\" = 1 }\n";
    let agent = Agent::start(AgentOptions::simulate("h100-80gb:1").profile("bad.toml", bad));
    let before = agent.status();
    let out = agent.ctl(&["apply", "bad"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("GPU 0 (H100-80GB-HBM3): 4c.3g does not fit (the rule at ")
            && err.contains("bad.toml:2:1): a 3g.40gb instance holds 1c ×3, 2c ×1 or 3c ×1"),
        "{err}"
    );
    assert_eq!(agent.status(), before);
}
