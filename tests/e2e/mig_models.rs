//! Issue 26: MIG on every MIG GPU, as its driver describes it. Each simulated model (the
//! new Blackwell and Hopper parts, a GPU in no catalog, a driver whose table differs from
//! the catalog) driven end to end through the real binaries.

use std::path::Path;

use gpushare_tests::{
    Agent, AgentOptions, agent_check, instance_profiles, repo_root, stderr, temp_file, text,
};

/// The models issue 26 adds, with the profile a `"1g"` resolves to, its most instances,
/// and a variant the model has beside `+me` (a graphics or no-media profile), if any.
const NEW_MODELS: &[(&str, &str, usize, Option<&str>)] = &[
    ("b200", "1g.23gb", 7, None),
    ("gb200", "1g.23gb", 7, None),
    ("b300", "1g.34gb", 7, None),
    ("gh200-144gb", "1g.18gb", 7, None),
    ("h100-nvl", "1g.12gb", 7, None),
    ("h100-96gb", "1g.12gb", 7, None),
    ("rtx-pro-6000-bse", "1g.24gb", 4, Some("1g.24gb+gfx")),
    ("a30-24gb", "1g.6gb", 4, Some("2g.12gb+me")),
];

fn applied(agent: &Agent, args: &[&str]) {
    let out = agent.ctl(args);
    assert!(out.status.success(), "{args:?}: {}", text(&out));
}

fn profile(dir: &Path, name: &str, mig: &str) -> String {
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, format!("name = \"{name}\"\n[[gpu]]\nselect = \"all\"\nmig = {mig}\n"))
        .unwrap();
    file.to_str().unwrap().to_owned()
}

/// The balanced layout NVIDIA's mig-parted writes for each model (its `all-balanced`).
fn balanced(one_g: &str, model: &str) -> Vec<String> {
    let sizes: &[&str] = match model {
        "b200" => &["2g.45gb", "3g.90gb"],
        "gb200" => &["2g.47gb", "3g.93gb"],
        "b300" => &["2g.67gb", "3g.135gb"],
        "gh200-144gb" => &["2g.36gb", "3g.72gb"],
        "h100-nvl" | "h100-96gb" => &["2g.24gb", "3g.47gb"],
        "rtx-pro-6000-bse" => &["2g.48gb"],
        "a30-24gb" => &["2g.12gb"],
        other => panic!("{other}"),
    };
    let mut names: Vec<String> =
        [one_g, one_g].iter().chain(sizes).map(|s| s.to_string()).collect();
    if model == "h100-96gb" {
        names[3] = "3g.48gb".into();
    }
    names.sort();
    names
}

/// Acceptance: on each new simulated model, `all-balanced`, `"1g"` at the model's most,
/// a graphics or no-media variant where the model has one, a compute-instance subdivision
/// with MPS on its compute instances, and back to `all-disabled`;
/// NVIDIA's own mig-parted file applied and asserted on every model.
#[test]
fn every_new_model_takes_the_layouts_and_goes_back() {
    let dir = tempfile::tempdir().unwrap();
    let mig_parted = repo_root().join("tests/data/mig-parted-config-default.yaml");
    let mig_parted = mig_parted.to_str().unwrap();
    for &(model, one_g, most, variant) in NEW_MODELS {
        let agent = Agent::start(AgentOptions::simulate(&format!("{model}:2")));
        applied(&agent, &["apply", "all-balanced"]);
        let status = agent.status();
        assert_eq!(instance_profiles(&status, 1), balanced(one_g, model), "{model}");

        let all_1g = profile(dir.path(), "all-1g", &format!("{{ \"1g\" = {most} }}"));
        applied(&agent, &["apply", "-f", &all_1g]);
        assert_eq!(instance_profiles(&agent.status(), 0), vec![one_g.to_string(); most], "{model}");

        if let Some(variant) = variant {
            let file = profile(dir.path(), "variant", &format!("{{ \"{variant}\" = 1 }}"));
            applied(&agent, &["apply", "-f", &file]);
            assert_eq!(instance_profiles(&agent.status(), 1), vec![variant.to_string()]);
        }

        // A 2g instance split into two 1c compute instances, each behind its own MPS
        // server, beside a whole 1g.
        let split = dir.path().join("split.toml");
        std::fs::write(
            &split,
            "name = \"split\"\n[[gpu]]\nselect = \"all\"\nmig = { \"1c.2g\" = 2, \"1g\" = 1 }\n\
             instance_sharing.\"1c.2g\" = \"mps\"\n",
        )
        .unwrap();
        applied(&agent, &["apply", "-f", split.to_str().unwrap()]);
        let status = agent.status();
        let two_g = status.gpus[0].instances.iter().find(|i| i.profile.starts_with("2g.")).unwrap();
        let cis: Vec<(u32, &str)> = two_g
            .compute_instances
            .iter()
            .map(|c| (c.compute_slices, c.sharing.strategy.as_str()))
            .collect();
        assert_eq!(cis, [(1, "mps"), (1, "mps")], "{model}: {two_g:?}");
        let running = agent.mps_servers().iter().filter(|s| s.state == "running").count();
        assert_eq!(running, 4, "{model}: one server per compute instance on each GPU");

        // NVIDIA's file, as mig-parted ships it: its all-balanced entry for this GPU.
        applied(&agent, &["apply", "-f", mig_parted, "-c", "all-balanced"]);
        applied(&agent, &["assert", "-f", mig_parted, "-c", "all-balanced"]);
        assert_eq!(instance_profiles(&agent.status(), 0), balanced(one_g, model), "{model}");

        applied(&agent, &["apply", "all-disabled"]);
        let status = agent.status();
        assert!(status.gpus.iter().all(|g| !g.mig_enabled && g.instances.is_empty()), "{model}");
        assert!(agent.mps_servers().is_empty(), "{model}");
    }
}

/// Acceptance: a MIG GPU no catalog knows (the RTX PRO 5000 Blackwell is only in the
/// simulator's models) applies `all-balanced` from the driver's table alone.
#[test]
fn a_gpu_in_no_catalog_is_planned_from_its_driver() {
    let log = tempfile::NamedTempFile::new().unwrap();
    let options =
        AgentOptions::simulate("rtx-pro-5000:1").stderr_to(log.path()).env("GPUSHARE_LOG", "info");
    let agent = Agent::start(options);
    let status = agent.status();
    assert_eq!(status.gpus[0].model, "RTX PRO 5000 Blackwell", "{status:?}");
    applied(&agent, &["apply", "all-balanced"]);
    assert_eq!(instance_profiles(&agent.status(), 0), ["1g.24gb", "1g.24gb"]);
    let logged = std::fs::read_to_string(log.path()).unwrap();
    assert!(
        logged
            .contains("is not in gpushare's catalog: its MIG profiles come from the driver alone"),
        "{logged}"
    );
    applied(&agent, &["apply", "all-disabled"]);
}

/// Acceptance: a catalog that disagrees with the driver produces a warning, and the driver
/// wins. The pre-production GB200's driver printed `1g.24gb` where the catalog (production
/// boards) has `1g.23gb`: mig-parted applied nothing, successfully (its issue 227).
#[test]
fn where_the_catalog_disagrees_the_driver_wins_with_a_warning() {
    let log = tempfile::NamedTempFile::new().unwrap();
    let agent = Agent::start(AgentOptions::simulate("gb200-early:1").stderr_to(log.path()));
    applied(&agent, &["apply", "all-balanced"]);
    let names = instance_profiles(&agent.status(), 0);
    assert!(names.contains(&"1g.24gb".to_string()), "{names:?}");
    let logged = std::fs::read_to_string(log.path()).unwrap();
    assert!(
        logged.contains("the driver's MIG table differs from the catalog")
            && logged.contains("name: NVML 1g.24gb, catalog 1g.23gb")
            && logged.contains("using the driver's"),
        "{logged}"
    );

    // A profile written for the catalog's name is refused naming the driver's.
    let (_dir, file) = temp_file(
        "renamed.toml",
        "name = \"renamed\"\n[[gpu]]\nselect = \"all\"\nmig = { \"1g.23gb\" = 2 }\n",
    );
    let out = agent.ctl(&["apply", "-f", file.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("no MIG profile 1g.23gb") && err.contains("did you mean 1g.24gb?"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    // --check-catalog lists the differences, and says the tables disagree.
    let check = agent_check(&["--simulate", "gb200-early:1", "--check-catalog"]);
    assert!(!check.status.success(), "{}", text(&check));
    assert!(text(&check).contains("name: NVML 1g.24gb, catalog 1g.23gb"), "{}", text(&check));
}

/// Issue 38: "did you mean" names the profile a mistyped name most likely means on that
/// GPU (same slices, then nearest memory, then variant), not the one spelled most alike.
#[test]
fn did_you_mean_names_the_profile_that_is_meant() {
    for (model, typed, meant) in [
        ("a100-40gb:1", "3g.40gb", "3g.20gb"),
        ("h100-80gb:1", "1g.5gb", "1g.10gb"),
        ("h100-80gb:1", "1g.10gb-me", "1g.10gb"),
    ] {
        let agent = Agent::start(AgentOptions::simulate(model));
        let before = agent.status();
        let text =
            format!("name = \"meant\"\n[[gpu]]\nselect = \"all\"\nmig = {{ \"{typed}\" = 1 }}\n");
        let (_dir, file) = temp_file("meant.toml", text);
        let out = agent.ctl(&["apply", "-f", file.to_str().unwrap()]);
        assert!(!out.status.success());
        let err = stderr(&out);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(&format!("no MIG profile {typed} (the rule at ")), "{err}");
        assert!(err.contains(&format!("meant.toml:2:1); did you mean {meant}? ")), "{err}");
        assert_eq!(agent.status(), before);
    }
}

/// Issue 38: every simulated MIG model's profile names are what NVIDIA's tools (go-nvlib's
/// rule: mig-parted, GPU Feature Discovery) make of the memory the simulated driver reports
/// through NVML: each profile's `memorySizeMB` against the GPU's `nvmlDeviceGetMemoryInfo`
/// total, read by the agent.
#[test]
fn the_drivers_names_are_what_nvidias_rule_makes_of_its_memory() {
    let keys: Vec<String> = gpushare_catalog::simulated_models()
        .iter()
        .filter(|m| m.supports_mig())
        .map(|m| format!("{}:1", m.key))
        .collect();
    let agent = Agent::start(AgentOptions::simulate(&keys.join(",")));
    let status = agent.status();
    let doc: gpushare_proto::types::MigProfiles = agent.ctl_doc(&["mig", "profiles"]);
    assert_eq!(doc.gpus.len(), keys.len());
    let mut wrong = Vec::new();
    for (gpu, key) in doc.gpus.iter().zip(&keys) {
        let total = status.gpus[gpu.index as usize].memory_total_bytes;
        for p in &gpu.profiles {
            let derived =
                gpushare_catalog::naming::gpu_instance_name(p.nvml_enum, p.memory_mib, total);
            if derived.as_deref() != Some(p.name.as_str()) {
                wrong.push(format!("{key} {}: NVIDIA's tools name it {derived:?}", p.name));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Bad input: a profile name the GPU does not offer, or a variant its model lacks, is
/// refused in one line naming the rule and the names that would work; nothing changes.
#[test]
fn a_name_or_variant_the_gpu_lacks_is_refused_naming_what_it_has() {
    let agent = Agent::start(AgentOptions::simulate("h100-80gb:1"));
    let before = agent.status();
    for (key, guess) in [("1g.10gb+gfx", "1g.10gb"), ("1g.11gb", "1g.10gb")] {
        let text =
            format!("name = \"bad\"\n[[gpu]]\nselect = \"all\"\nmig = {{ \"{key}\" = 1 }}\n");
        let (_dir, file) = temp_file("bad.toml", text);
        let out = agent.ctl(&["apply", "-f", file.to_str().unwrap()]);
        assert!(!out.status.success());
        let err = stderr(&out);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(&format!("no MIG profile {key} (the rule at ")), "{err}");
        assert!(err.contains("bad.toml:2:1); did you mean ") && err.contains(guess), "{err}");
        assert!(
            err.contains("has 1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb, 1g.10gb+me, 1g.20gb"),
            "{err}"
        );
    }
    assert_eq!(agent.status(), before);
}
