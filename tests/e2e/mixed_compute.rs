//! Issue 38, item 2: a mig-parted file with compute instances of mixed sizes applies,
//! asserts, plans and exports as mig-parted would have it (one GPU instance holding
//! `2c.3g.40gb` and `1c.3g.40gb`; `4c.7g.80gb` and `3c.7g.80gb` in the one 7g), through the
//! real binaries on simulated H100 and A100-80GB nodes; a set that fits no packing is
//! refused as being about compute instances.

use gpushare_tests::{Agent, AgentOptions, stderr, stdout, temp_file, text};

/// mig-parted configs as its users write them: mixed sizes in one 3g, and in the 7g.
const MIXED: &str = r#"version: v1
mig-configs:
  mixed-3g:
    - devices: all
      mig-enabled: true
      mig-devices:
        "2c.3g.40gb": 1
        "1c.3g.40gb": 1
  mixed-7g:
    - devices: all
      mig-enabled: true
      mig-devices:
        "4c.7g.80gb": 1
        "3c.7g.80gb": 1
  too-much-7g:
    - devices: all
      mig-enabled: true
      mig-devices:
        "4c.7g.80gb": 1
        "3c.7g.80gb": 1
        "2c.7g.80gb": 1
"#;

/// GPU 0's GPU instances as status lists them: profile and compute slices of each
/// compute instance, largest first.
fn instances(agent: &Agent) -> Vec<(String, Vec<u32>)> {
    let status = agent.status();
    status.gpus[0]
        .instances
        .iter()
        .map(|i| {
            let mut sizes: Vec<u32> =
                i.compute_instances.iter().map(|c| c.compute_slices).collect();
            sizes.sort_unstable_by(|a, b| b.cmp(a));
            (i.profile.clone(), sizes)
        })
        .collect()
}

/// The simulated `nvidia-smi mig -lci` lines of GPU 0 that name `name`.
fn listed(agent: &Agent, name: &str) -> usize {
    let out = agent.nvidia_smi(&["mig", "-i", "0", "-lci"]);
    stdout(&out).lines().filter(|l| l.contains(&format!("MIG {name} "))).count()
}

fn ok(agent: &Agent, args: &[&str]) -> String {
    let out = agent.ctl(args);
    assert!(out.status.success(), "{args:?}: {}", text(&out));
    stdout(&out)
}

#[test]
fn mixed_compute_instance_sizes_apply_assert_and_export_as_in_mig_parted() {
    let (_dir, file) = temp_file("mixed.yaml", MIXED);
    let file = file.to_str().unwrap();
    for spec in ["h100-80gb:1", "a100-80gb:1"] {
        let agent = Agent::start(AgentOptions::simulate(spec));
        for (config, gi, cis) in [
            ("mixed-3g", "3g.40gb", ["2c.3g.40gb", "1c.3g.40gb"]),
            ("mixed-7g", "7g.80gb", ["4c.7g.80gb", "3c.7g.80gb"]),
        ] {
            ok(&agent, &["apply", "-f", file, "-c", config]);
            // One GPU instance holds both compute instances, as mig-parted makes it.
            let (large, small) = if gi == "3g.40gb" { (2, 1) } else { (4, 3) };
            assert_eq!(
                instances(&agent),
                [(gi.to_string(), vec![large, small])],
                "{spec} {config}"
            );
            for ci in cis {
                assert_eq!(listed(&agent, ci), 1, "{spec} {config}: {ci}");
            }
            ok(&agent, &["assert", "-f", file, "-c", config]);
            let plan = ok(&agent, &["plan", "-f", file, "-c", config]);
            assert!(plan.contains("nothing to do"), "{spec} {config}: {plan}");
            // The export counts the compute instances as mig-parted's does, and plans to
            // nothing.
            let exported = ok(&agent, &["export", "--format", "mig-parted"]);
            for ci in cis {
                assert!(exported.contains(&format!("\"{ci}\": 1")), "{spec}: {exported}");
            }
            let (_d, back) = temp_file("node.yaml", &exported);
            let plan = ok(&agent, &["plan", "-f", back.to_str().unwrap()]);
            assert!(plan.contains("nothing to do"), "{spec} {config}: {plan}\n{exported}");
        }
        // The other config does not hold: assert says so.
        let out = agent.ctl(&["assert", "-f", file, "-c", "mixed-3g"]);
        assert_eq!(out.status.code(), Some(1), "{spec}: {}", text(&out));

        // 4c + 3c + 2c need two 7g instances, and a GPU has one: refused as a matter of
        // compute instances, nothing changed.
        let before = instances(&agent);
        let out = agent.ctl(&["apply", "-f", file, "-c", "too-much-7g"]);
        assert!(!out.status.success(), "{spec}: {}", text(&out));
        let e = stderr(&out);
        assert!(
            e.contains("compute instances 4c ×1 + 3c ×1 + 2c ×1 of 7g.80gb need 2 GPU instances"),
            "{spec}: {e}"
        );
        assert!(e.contains("7g.80gb ×2 exceeds the maximum of 1 per GPU"), "{spec}: {e}");
        assert_eq!(instances(&agent), before, "{spec}");
    }
}

/// An operator upgrading: GPU instances whose compute instances an older gpushare (or
/// `nvidia-smi`) packed otherwise — each size in its own 3g — are the ones asked for, so
/// `plan` keeps them, `assert` holds, `apply` changes nothing and `status` shows no drift,
/// for gpushare's own profile and the mig-parted file alike.
#[test]
fn compute_instances_an_older_gpushare_packed_are_kept() {
    let (_dir, yaml) = temp_file("mixed.yaml", MIXED);
    let yaml = yaml.to_str().unwrap();
    let (_d2, whole) =
        temp_file("two.toml", "name = \"two\"\n[[gpu]]\nselect = \"all\"\nmig = { \"3g\" = 2 }\n");
    let (_d3, own) = temp_file(
        "own.toml",
        "name = \"own\"\n[[gpu]]\nselect = \"all\"\nmig = { \"2c.3g\" = 1, \"1c.3g\" = 1 }\n",
    );
    let agent = Agent::start(AgentOptions::simulate("h100-80gb:1"));
    ok(&agent, &["apply", "-f", whole.to_str().unwrap()]);
    // As the old rule made it: one 3g with the 2c, the other with the 1c.
    let gis: Vec<String> =
        agent.status().gpus[0].instances.iter().map(|i| i.gpu_instance_id.to_string()).collect();
    assert_eq!(gis.len(), 2);
    let smi = |args: &[&str]| {
        let out = agent.nvidia_smi(args);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
    };
    smi(&["mig", "-i", "0", "-dci"]);
    smi(&["mig", "-i", "0", "-gi", &gis[0], "-cci", "1"]); // 2c.3g.40gb
    smi(&["mig", "-i", "0", "-gi", &gis[1], "-cci", "0"]); // 1c.3g.40gb
    let before = instances(&agent);
    assert_eq!(before, [("3g.40gb".into(), vec![2]), ("3g.40gb".into(), vec![1])]);
    for args in
        [vec!["plan", "-f", own.to_str().unwrap()], vec!["plan", "-f", yaml, "-c", "mixed-3g"]]
    {
        assert!(ok(&agent, &args).contains("nothing to do"), "{args:?}");
        let assert = [&["assert"][..], &args[1..]].concat();
        ok(&agent, &assert);
    }
    ok(&agent, &["apply", "-f", own.to_str().unwrap()]);
    assert_eq!(instances(&agent), before);
    let status = agent.status();
    assert_eq!(status.drift, None, "{status:?}");
    assert_eq!(listed(&agent, "2c.3g.40gb") + listed(&agent, "1c.3g.40gb"), 2);
}
