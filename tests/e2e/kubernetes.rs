//! Issue 40's acceptance on simulated GPUs: with `[device_plugin]` and `[labels]` on, the
//! device plugin's config passes the schema written from NVIDIA's k8s-device-plugin
//! v0.20.0 (tests/support/device_plugin.rs), the labels pass NFD v0.19.0's rules
//! (tests/support/nfd.rs), both say what `gpushare-ctl status --json` says field for
//! field after every built-in profile, `gpushare-ctl export` prints the same bytes, a
//! rolled-back apply leaves them as they were, and what the plugin cannot express or a path
//! the agent cannot use is refused with the GPUs unchanged.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gpushare_tests::device_plugin::validate_device_plugin_config;
use gpushare_tests::nfd::check_feature_file;
use gpushare_tests::{Agent, AgentOptions, is_root, stderr, stdout, text};
use serde_json::{Value, json};
use tempfile::TempDir;

/// The replicas of the built-in `all-time-sliced` (agent/src/profile/builtin): status shows
/// no time-slicing replicas, so the test knows them from the profile.
const TIME_SLICED_REPLICAS: u64 = 4;

/// Where a test's agent writes the two views: a directory of the test's own.
struct Views {
    dir: TempDir,
}

impl Views {
    fn new() -> Views {
        let dir = TempDir::new().unwrap();
        std::fs::create_dir(dir.path().join("features.d")).unwrap();
        Views { dir }
    }

    fn plugin(&self) -> PathBuf {
        self.dir.path().join("device-plugin.yaml")
    }

    fn labels(&self) -> PathBuf {
        self.dir.path().join("features.d/gpushare")
    }

    /// agent.toml's two sections, for these paths.
    fn config(&self) -> String {
        view_config(&self.plugin(), &self.labels())
    }

    /// Both files' bytes (`None`: no file).
    fn bytes(&self) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
        (std::fs::read(self.plugin()).ok(), std::fs::read(self.labels()).ok())
    }
}

fn view_config(plugin: &Path, labels: &Path) -> String {
    format!(
        "[device_plugin]\nenabled = true\npath = {:?}\nmps_host_shm = true\n\n[labels]\nenabled = \
         true\npath = {:?}\n",
        plugin.display().to_string(),
        labels.display().to_string()
    )
}

fn start(spec: &str, views: &Views, profiles: &[(&str, &str)]) -> Agent {
    let mut options = AgentOptions::simulate(spec).config(&views.config());
    for (file, text) in profiles {
        options = options.profile(file, text);
    }
    Agent::start(options)
}

/// `status --json` as a document (every field, the new ones too).
fn status(agent: &Agent) -> Value {
    let out = agent.ctl(&["status", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).expect("status --json is JSON")
}

/// The GPUs part of a status, to compare before and after a refused apply.
fn gpus(agent: &Agent) -> Value {
    status(agent)["gpus"].clone()
}

/// [`gpus`] without the MPS servers' process ids: a rollback starts the servers again.
fn layout(agent: &Agent) -> Value {
    let mut gpus = gpus(agent);
    for gpu in gpus.as_array_mut().unwrap() {
        if let Some(server) = gpu["sharing"]["mps"].as_object_mut() {
            server.remove("pid");
        }
    }
    gpus
}

fn apply(agent: &Agent, profile: &str) {
    let out = agent.ctl(&["apply", profile]);
    assert!(out.status.success(), "apply {profile}: {}", text(&out));
}

/// A MIG device kind as the plugin and the labels spell it (`+` becomes `.`).
fn kind(profile: &str) -> String {
    profile.replace('+', ".")
}

/// An MPS server's shares: (replicas, thread percentage, memory limit in MiB).
type Shares = (u64, u64, Option<u64>);

/// The MIG devices of a GPU in `status`, by kind, each with its MPS server's shares if one
/// serves it: each compute instance is one (a GPU instance without one is none), named by
/// its GPU instance's profile, or `<c>c.<profile>` when it has fewer compute slices than
/// its GPU instance (`1c.3g.40gb`).
fn mig_devices(gpu: &Value) -> BTreeMap<String, Vec<Option<Shares>>> {
    let mut kinds: BTreeMap<String, Vec<Option<Shares>>> = BTreeMap::new();
    for instance in gpu["instances"].as_array().unwrap() {
        let profile = instance["profile"].as_str().unwrap();
        let slices: u64 = profile.split_once('g').and_then(|(g, _)| g.parse().ok()).unwrap();
        for ci in instance["compute_instances"].as_array().unwrap() {
            let c = ci["compute_slices"].as_u64().unwrap();
            let name = if c < slices { format!("{c}c.{profile}") } else { profile.to_string() };
            let served = (ci["sharing"]["strategy"] == "mps").then(|| mps_shares(&ci["sharing"]));
            kinds.entry(kind(&name)).or_default().push(served);
        }
    }
    kinds
}

/// The MPS server's (replicas, thread percentage, memory limit in MiB) as status shows it:
/// replicas are 100 / the thread percentage the profile set (`configured`), as the CDI
/// spec counts shares; the limits are those a client connecting now gets.
fn mps_shares(sharing: &Value) -> Shares {
    let server = &sharing["mps"];
    let configured = if server["configured"].is_object() { &server["configured"] } else { server };
    let set = configured["active_thread_percentage"].as_u64().expect("a thread percentage");
    let threads = server["active_thread_percentage"].as_u64().expect("a thread percentage");
    let memory = server["pinned_memory_limit_bytes"].as_u64().map(|b| b >> 20);
    (100 / set, threads, memory)
}

/// The labels the node must carry, from `status`: its profile and `state` (none before the
/// first apply), and each GPU's
/// sharing, MIG devices per kind, MPS shares and limits, time-slicing.
fn expected_labels(status: &Value, state: Option<&str>) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut put = |key: String, value: String| {
        assert!(labels.insert(format!("gpushare.io/{key}"), value).is_none(), "{key} twice");
    };
    // No profile label while status has no active profile (the GPUs between layouts).
    if let Some(profile) = status["active_profile"].as_str() {
        put("profile".into(), profile.into());
    }
    if let Some(state) = state {
        put("state".into(), state.into());
    }
    for gpu in status["gpus"].as_array().unwrap() {
        let at = format!("gpu-{}", gpu["index"]);
        if gpu["mig_enabled"] == true {
            put(format!("{at}.sharing"), "mig".into());
            for (kind, devices) in mig_devices(gpu) {
                let k = format!("{at}.mig.{kind}");
                put(k.clone(), devices.len().to_string());
                let servers: Vec<Shares> = devices.into_iter().flatten().collect();
                if servers.is_empty() {
                    continue;
                }
                put(format!("{k}.mps.servers"), servers.len().to_string());
                // The shares only when every server of the kind gives the same.
                if servers.iter().all(|s| *s == servers[0]) {
                    mps_labels(&mut put, &k, servers[0]);
                }
            }
            continue;
        }
        let sharing = &gpu["sharing"];
        let strategy = sharing["strategy"].as_str().unwrap();
        put(format!("{at}.sharing"), strategy.into());
        match strategy {
            "mps" => mps_labels(&mut put, &at, mps_shares(sharing)),
            "time-slicing" => {
                put(format!("{at}.time-slicing.replicas"), TIME_SLICED_REPLICAS.to_string());
                let interval = sharing["interval"].as_str().expect("an interval");
                put(format!("{at}.time-slicing.interval"), interval.into());
            }
            _ => {}
        }
    }
    labels
}

/// The labels of an MPS server's shares under `at` (`gpu-1`, `gpu-0.mig.1c.3g.40gb`).
fn mps_labels(put: &mut impl FnMut(String, String), at: &str, shares: Shares) {
    let (replicas, threads, memory) = shares;
    put(format!("{at}.mps.replicas"), replicas.to_string());
    put(format!("{at}.mps.thread-percentage"), threads.to_string());
    if let Some(mib) = memory {
        put(format!("{at}.mps.memory-limit-mib"), mib.to_string());
    }
}

/// The device plugin's config the node must have, from `status` (as JSON): the MIG
/// strategy from the layout, and the whole GPUs' one sharing with its replicas.
fn expected_config(status: &Value, mps_root: &Path) -> Value {
    let gpus = status["gpus"].as_array().unwrap();
    let mig: Vec<&Value> = gpus.iter().filter(|g| g["mig_enabled"] == true).collect();
    let kinds: std::collections::BTreeSet<String> =
        mig.iter().flat_map(|g| mig_devices(g).into_keys()).collect();
    let strategy = match (mig.len(), kinds.len()) {
        (0, _) => "none",
        (n, 1) if n == gpus.len() => "single",
        _ => "mixed",
    };
    let mut flags = json!({ "migStrategy": strategy, "failOnInitError": true });
    let whole: Vec<&Value> = gpus.iter().filter(|g| g["mig_enabled"] != true).collect();
    let shared: Vec<&str> = whole
        .iter()
        .map(|g| g["sharing"]["strategy"].as_str().unwrap())
        .filter(|s| *s != "exclusive")
        .collect();
    let mut config = json!({ "version": "v1", "flags": flags.clone() });
    let Some(&strategy) = shared.first() else { return config };
    assert_eq!(shared.len(), whole.len(), "one sharing for every whole GPU: {status}");
    let (block, replicas) = match strategy {
        "mps" => {
            assert_eq!(whole.len(), 1, "MPS on one GPU only");
            flags["mpsRoot"] = json!(mps_root.display().to_string());
            ("mps", mps_shares(&whole[0]["sharing"]).0)
        }
        "time-slicing" => ("timeSlicing", TIME_SLICED_REPLICAS),
        other => panic!("no plugin sharing for {other}"),
    };
    config["flags"] = flags;
    config["sharing"] = json!({ block: {
        "failRequestsGreaterThanOne": true,
        "resources": [{ "name": "nvidia.com/gpu", "replicas": replicas }]
    } });
    config
}

/// Both files pass their checkers, say what status says (labels with `state`), and
/// `gpushare-ctl export` prints them byte for byte.
fn assert_views(agent: &Agent, views: &Views, state: Option<&str>) {
    let status = status(agent);
    let config = validate_device_plugin_config(&views.plugin())
        .unwrap_or_else(|e| panic!("the device plugin's config breaks the schema: {e}"));
    if !config.is_null() {
        assert_eq!(config, expected_config(&status, &agent.mps_root()), "config vs {status:#}");
    }
    assert_exported(agent, "device-plugin", &views.plugin());
    assert_labels(agent, &views.labels(), &status, state);
}

/// The labels file passes NFD's rules and says what `status` says, and `export --format
/// labels` prints it byte for byte.
fn assert_labels(agent: &Agent, path: &Path, status: &Value, state: Option<&str>) {
    let labels =
        check_feature_file(path).unwrap_or_else(|e| panic!("the labels break NFD's rules: {e}"));
    assert_eq!(labels, expected_labels(status, state), "labels vs status {status:#}");
    assert_exported(agent, "labels", path);
}

/// `gpushare-ctl export --format FORMAT` prints the file at `path` byte for byte.
fn assert_exported(agent: &Agent, format: &str, path: &Path) {
    let out = agent.ctl(&["export", "--format", format]);
    assert!(out.status.success(), "export --format {format}: {}", text(&out));
    let kept = std::fs::read_to_string(path).unwrap();
    assert_eq!(stdout(&out), kept, "export --format {format} vs {}", path.display());
}

/// Under MPS, the plugin's layout: `<mps root>/nvidia.com/gpu/pipe` is the server's pipe
/// directory and `<mps root>/shm` is /dev/shm.
fn assert_mps_layout(agent: &Agent, status: &Value) {
    let root = agent.mps_root();
    let server = &status["gpus"][0]["sharing"]["mps"];
    let pipe = Path::new(server["pipe_directory"].as_str().unwrap());
    let seen = root.join("nvidia.com/gpu/pipe");
    assert_eq!(
        std::fs::canonicalize(&seen).unwrap_or_else(|e| panic!("{}: {e}", seen.display())),
        std::fs::canonicalize(pipe).unwrap(),
        "the plugin's pipe directory is the server's"
    );
    let shm = std::fs::canonicalize(root.join("shm")).expect("<mps root>/shm");
    assert_eq!(shm, Path::new("/dev/shm"));
}

#[test]
fn every_profile_on_one_gpu_writes_both_views_as_status_says() {
    if !is_root() {
        gpushare_tests::skip("the simulator makes device nodes only as root");
        return;
    }
    let views = Views::new();
    let agent = start("h100-80gb:1", &views, &[]);
    // At start-up: the GPUs whole, no profile and no state yet.
    assert_views(&agent, &views, None);
    for profile in ["half-balanced", "all-balanced", "all-mps", "all-time-sliced", "all-disabled"] {
        apply(&agent, profile);
        assert_views(&agent, &views, Some("success"));
        if profile == "all-mps" {
            assert_mps_layout(&agent, &status(&agent));
        }
    }
    // Both files 0644, and nothing else in features.d for NFD to read (no temporary file
    // left: the agent writes a dot-file and renames it).
    use std::os::unix::fs::PermissionsExt;
    for path in [views.plugin(), views.labels()] {
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o644, "{}", path.display());
    }
    let names: Vec<String> = std::fs::read_dir(views.labels().parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["gpushare"]);
}

#[test]
fn every_expressible_profile_on_two_gpus_writes_both_views_as_status_says() {
    if !is_root() {
        gpushare_tests::skip("the simulator makes device nodes only as root");
        return;
    }
    let views = Views::new();
    let agent = start("a100-40gb:2", &views, &[("all-3g.toml", ALL_3G)]);
    // all-3g: every GPU in MIG mode with one kind of MIG device, the plugin's `single`.
    for profile in ["half-balanced", "all-balanced", "all-3g", "all-time-sliced", "all-disabled"] {
        apply(&agent, profile);
        assert_views(&agent, &views, Some("success"));
        let config = validate_device_plugin_config(&views.plugin()).unwrap();
        let single = config["flags"]["migStrategy"] == "single";
        assert!(config.is_null() || single == (profile == "all-3g"), "{profile}: {config}");
    }
}

/// Every GPU in two 3g instances: one kind of MIG device on the node.
const ALL_3G: &str = "name = \"all-3g\"\n[[gpu]]\nselect = \"all\"\nmig = { \"3g\" = 2 }\n";

/// Profiles the plugin cannot express on a 2-GPU node.
const MPS_AND_EXCLUSIVE: &str = "name = \"mps-and-exclusive\"\n\
    [[gpu]]\nselect = 0\nmig = \"disabled\"\nsharing.mps = { replicas = 4 }\n\
    [[gpu]]\nselect = 1\nmig = \"disabled\"\nsharing = \"exclusive\"\n";
const MPS_AND_MIG: &str = "name = \"mps-and-mig\"\n\
    [[gpu]]\nselect = 0\nmig = \"balanced\"\n\
    [[gpu]]\nselect = 1\nmig = \"disabled\"\nsharing.mps = { replicas = 4 }\n";
const SLICED_AND_EXCLUSIVE: &str = "name = \"sliced-and-exclusive\"\n\
    [[gpu]]\nselect = 0\nmig = \"disabled\"\n\
    sharing.time-slicing = { interval = \"medium\", replicas = 4 }\n\
    [[gpu]]\nselect = 1\nmig = \"disabled\"\nsharing = \"exclusive\"\n";
/// GPU 0 in one 3g instance of three 1c compute instances (`1c.3g.40gb` on an H100).
const SUBDIVIDED: &str = "name = \"subdivided\"\n[[gpu]]\nselect = 0\n\
    mig = { \"1c.3g\" = 3, \"3g\" = 1 }\n";

/// `profile` is refused in one line, before any step: the GPUs and both files as before.
fn assert_refused(agent: &Agent, views: &Views, profile: &str) {
    let before = (gpus(agent), views.bytes());
    let out = agent.ctl(&["apply", profile]);
    assert!(!out.status.success(), "{profile} applied: {}", text(&out));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{profile}: {err}");
    assert!(err.contains("[device_plugin]"), "{profile}: the setting is not named: {err}");
    assert_eq!(gpus(agent), before.0, "{profile}: the GPUs changed");
    assert!(views.bytes() == before.1, "{profile}: the views changed");
}

#[test]
fn what_the_plugin_cannot_express_is_refused_with_the_gpus_unchanged() {
    if !is_root() {
        gpushare_tests::skip("the simulator makes device nodes only as root");
        return;
    }
    let views = Views::new();
    let profiles = [
        ("mps-and-exclusive.toml", MPS_AND_EXCLUSIVE),
        ("mps-and-mig.toml", MPS_AND_MIG),
        ("sliced-and-exclusive.toml", SLICED_AND_EXCLUSIVE),
    ];
    let agent = start("a100-40gb:2", &views, &profiles);
    apply(&agent, "half-balanced");
    let refused = ["all-mps", "mps-and-exclusive", "mps-and-mig", "sliced-and-exclusive"];
    for profile in refused {
        assert_refused(&agent, &views, profile);
    }
    assert_views(&agent, &views, Some("success"));
    // The plugin's rules refused them: with the views off, each applies.
    let mut options = AgentOptions::simulate("a100-40gb:2");
    for (file, text) in profiles {
        options = options.profile(file, text);
    }
    let plain = Agent::start(options);
    for profile in refused {
        apply(&plain, profile);
    }

    let views = Views::new();
    let subdivided = [("subdivided.toml", SUBDIVIDED)];
    let agent = start("h100-80gb:1", &views, &subdivided);
    apply(&agent, "all-time-sliced");
    assert_refused(&agent, &views, "subdivided");
    assert_views(&agent, &views, Some("success"));
    apply(
        &Agent::start(AgentOptions::simulate("h100-80gb:1").profile(subdivided[0].0, SUBDIVIDED)),
        "subdivided",
    );
}

#[test]
fn a_rolled_back_apply_leaves_both_views_byte_for_byte() {
    if !is_root() {
        gpushare_tests::skip("the simulator makes device nodes only as root");
        return;
    }
    let views = Views::new();
    let mut agent = start("a100-40gb:1", &views, &[]);
    apply(&agent, "all-mps");
    let before = views.bytes();
    // Restarted with a fault to come, the agent writes the same bytes again.
    agent.restart_with_env(&[("GPUSHARE_SIM_FAIL", "nvmlDeviceCreateGpuInstanceWithPlacement:2")]);
    assert!(views.bytes() == before, "a restart rewrote the views differently");
    let gpus_before = layout(&agent);

    let out = agent.ctl(&["apply", "all-balanced"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert_eq!(layout(&agent), gpus_before, "rolled back");
    let after = views.bytes();
    assert_eq!(after.0, before.0, "rolled back, the device plugin's config as before");
    assert_eq!(after.1, before.1, "rolled back, the labels as before (their state too)");
    let doc = status(&agent);
    assert!(doc["apply_error"].is_string(), "apply_error in {doc:#}");
    assert_views(&agent, &views, Some("success"));

    // The next apply that succeeds clears the reason.
    agent.restart_with_env(&[]);
    apply(&agent, "all-time-sliced");
    assert_views(&agent, &views, Some("success"));
    assert!(status(&agent)["apply_error"].is_null());
}

/// All-balanced on two GPUs, then an apply of all-disabled whose rollback fails too
/// (issue 38's recipe, tests/e2e/agent_state.rs): the GPUs are left between layouts.
fn rollback_failed(views: &Views) -> Agent {
    let mut agent = start("a100-40gb:2", views, &[]);
    apply(&agent, "all-balanced");
    agent.restart_with_env(&[(
        "GPUSHARE_SIM_FAIL",
        "nvmlGpuInstanceDestroy:3,nvmlDeviceCreateGpuInstanceWithPlacement:1",
    )]);
    let out = agent.ctl(&["apply", "all-disabled"]);
    assert!(!out.status.success(), "{}", text(&out));
    let doc = status(&agent);
    assert!(doc["rollback_error"].is_string() && doc["apply_error"].is_string(), "{doc:#}");
    agent
}

/// An apply whose rollback failed too leaves the GPUs between layouts: the labels say
/// `failed` (status has `rollback_error`) and both views follow the GPUs as they are
/// (MIG devices are compute instances: a GPU instance whose one was destroyed is none).
#[test]
fn an_apply_whose_rollback_failed_says_failed() {
    if !is_root() {
        gpushare_tests::skip("the simulator makes device nodes only as root");
        return;
    }
    let views = Views::new();
    let mut agent = rollback_failed(&views);
    assert_views(&agent, &views, Some("failed"));

    agent.restart_with_env(&[]);
    apply(&agent, "all-balanced");
    assert_views(&agent, &views, Some("success"));
}

/// After a failed rollback status has no active profile (the journal drops it), and nor
/// do the labels: they name the journal's after every transaction (issue 40's finding:
/// they kept the profile before). A restart rolls the apply back and both say that
/// profile again.
#[test]
fn after_a_failed_rollback_the_profile_label_agrees_with_status() {
    let views = Views::new();
    let agent = rollback_failed(&views);
    let labels = check_feature_file(&views.labels()).unwrap();
    let active = status(&agent)["active_profile"].as_str().map(String::from);
    assert_eq!(labels.get("gpushare.io/profile"), active.as_ref(), "profile label vs status");
}

#[test]
fn a_view_path_the_agent_cannot_use_refuses_the_apply_with_the_gpus_unchanged() {
    if !is_root() {
        gpushare_tests::skip("the simulator makes device nodes only as root");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let place = TempDir::new().unwrap();
    std::fs::set_permissions(place.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = place.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let open = place.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let good = place.path().join("good");
    std::fs::create_dir(&good).unwrap();
    for (plugin, labels, named) in [
        (file.join("device-plugin.yaml"), good.join("labels"), "[device_plugin] path"),
        (good.join("device-plugin.yaml"), open.join("gpushare"), "[labels] path"),
    ] {
        let config = view_config(&plugin, &labels);
        let agent = Agent::start(AgentOptions::simulate("a100-40gb:1").config(&config));
        let before = (gpus(&agent), std::fs::read(&plugin).ok(), std::fs::read(&labels).ok());
        let out = agent.ctl(&["apply", "all-time-sliced"]);
        assert!(!out.status.success(), "{named}: applied: {}", text(&out));
        let err = stderr(&out);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(named), "{named} not named: {err}");
        let after = (gpus(&agent), std::fs::read(&plugin).ok(), std::fs::read(&labels).ok());
        assert_eq!(after.0, before.0, "{named}: the GPUs changed");
        assert!(after.1 == before.1 && after.2 == before.2, "{named}: a view changed");
    }
    assert!(
        std::fs::read_dir(&open).unwrap().next().is_none(),
        "nothing written where others may write"
    );
}

#[test]
fn the_labels_say_pending_while_an_apply_runs() {
    if !is_root() {
        gpushare_tests::skip("the simulator makes device nodes only as root");
        return;
    }
    let views = Views::new();
    // The apply's pre_apply hook runs after the labels say pending and before its first
    // step: a copy it makes is the labels while the apply runs, with no timing involved.
    let during = views.dir.path().join("labels-during-the-apply");
    let hook = format!("cp {} {}", views.labels().display(), during.display());
    let config = format!(
        "{}
[hooks]
pre_apply = [{hook:?}]
",
        views.config()
    );
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:1").config(&config));
    let before = std::fs::read_to_string(views.labels()).unwrap();
    apply(&agent, "all-balanced");
    let labels = std::fs::read_to_string(&during).expect("the hook's copy of the labels");
    assert!(labels.lines().any(|l| l == "gpushare.io/state=pending"), "{labels}");
    // Pending changes the state alone: the rest is the node as it was before the apply.
    let others = |text: &str| -> Vec<String> {
        text.lines().filter(|l| !l.starts_with("gpushare.io/state=")).map(String::from).collect()
    };
    assert_eq!(others(&labels), others(&before));
    assert_views(&agent, &views, Some("success"));
}

/// The harness itself: views that disagree with status, or break NVIDIA's or NFD's rules,
/// fail [`assert_views`] (each change alone, on files the agent wrote for `all-mps`).
#[test]
fn the_checks_refuse_views_that_disagree_with_status() {
    if !is_root() {
        gpushare_tests::skip("the simulator makes device nodes only as root");
        return;
    }
    let views = Views::new();
    let agent = start("a100-40gb:1", &views, &[]);
    apply(&agent, "all-mps");
    assert_views(&agent, &views, Some("success"));
    let (config, labels) = views.bytes();
    let (config, labels) = (String::from_utf8(config.unwrap()).unwrap(), labels.unwrap());
    let labels = String::from_utf8(labels).unwrap();
    let plugin_changes = [
        ("replicas: 4", "replicas: 5"),
        ("migStrategy: none", "migStrategy: mixed"),
        ("failOnInitError: true", "failOnInitError: false"),
        ("version: v1", "version: v2"),
        ("  mps:\n", "  timeSlicing:\n"),
    ];
    let label_changes = [
        ("mps.replicas=4", "mps.replicas=5"),
        ("state=success", "state=pending"),
        ("profile=all-mps", "profile=all-balanced"),
        (
            "gpushare.io/gpu-0.sharing=mps\n",
            "gpushare.io/gpu-0.sharing=mps\nnvidia.com/mps.capable=true\n",
        ),
        ("gpushare.io/gpu-0.sharing=mps\n", ""),
    ];
    let mut cases: Vec<(PathBuf, String)> = Vec::new();
    for (from, to) in plugin_changes {
        assert!(config.contains(from), "{from:?} not in {config}");
        cases.push((views.plugin(), config.replacen(from, to, 1)));
    }
    for (from, to) in label_changes {
        assert!(labels.contains(from), "{from:?} not in {labels}");
        cases.push((views.labels(), labels.replacen(from, to, 1)));
    }
    for (path, changed) in cases {
        let original = std::fs::read(&path).unwrap();
        std::fs::write(&path, &changed).unwrap();
        let caught = std::panic::catch_unwind(|| assert_views(&agent, &views, Some("success")));
        std::fs::write(&path, original).unwrap();
        assert!(caught.is_err(), "passed: {}:\n{changed}", path.display());
    }
    assert_views(&agent, &views, Some("success"));
}

/// With `[labels]` on and `[device_plugin]` off, what the plugin cannot express applies,
/// and the labels say it as status does (MPS on MIG devices too); `export --format
/// device-plugin` refuses such a node in one line.
#[test]
fn the_labels_alone_follow_what_the_plugin_cannot_express() {
    if !is_root() {
        gpushare_tests::skip("the simulator makes device nodes only as root");
        return;
    }
    let dir = TempDir::new().unwrap();
    let labels = dir.path().join("gpushare");
    let config = format!("[labels]\nenabled = true\npath = {:?}\n", labels.display().to_string());
    let mut options = AgentOptions::simulate("a100-40gb:2").config(&config);
    for (file, text) in [
        ("mps-and-exclusive.toml", MPS_AND_EXCLUSIVE),
        ("mps-and-mig.toml", MPS_AND_MIG),
        ("sliced-and-exclusive.toml", SLICED_AND_EXCLUSIVE),
    ] {
        options = options.profile(file, text);
    }
    let agent = Agent::start(options);
    for profile in ["mps-and-exclusive", "mps-and-mig", "sliced-and-exclusive", "all-mps"] {
        apply(&agent, profile);
        assert_labels(&agent, &labels, &status(&agent), Some("success"));
        let out = agent.ctl(&["export", "--format", "device-plugin"]);
        assert!(!out.status.success(), "{profile}: exported {}", text(&out));
        assert_eq!(stderr(&out).trim().lines().count(), 1, "{profile}: {}", text(&out));
    }

    drop(agent);

    // MPS on MIG devices: three 1c compute instances, each its own server for 2 clients.
    let subdivided_mps =
        format!("{SUBDIVIDED}instance_sharing.\"1c.3g\" = {{ mps = {{ replicas = 2 }} }}\n");
    let options = AgentOptions::simulate("h100-80gb:1")
        .config(&config)
        .profile("subdivided.toml", &subdivided_mps);
    let agent = Agent::start(options);
    apply(&agent, "subdivided");
    assert_labels(&agent, &labels, &status(&agent), Some("success"));
    let kept = std::fs::read_to_string(&labels).unwrap();
    assert!(kept.contains("gpushare.io/gpu-0.mig.1c.3g.40gb.mps.servers=3\n"), "{kept}");
}

/// A view that cannot follow never keeps the GPUs from their profile at start-up (MIG
/// instances and MPS servers do not survive a reboot): the re-apply runs, and the view
/// says why it wrote nothing. Here all-mps on two GPUs, applied before [device_plugin] was
/// turned on (review of issue 40: the re-apply was refused, the GPUs left as the reboot
/// left them).
#[test]
fn a_view_that_cannot_follow_does_not_stop_the_start_up_re_apply() {
    if !is_root() {
        gpushare_tests::skip("the simulator makes device nodes only as root");
        return;
    }
    let views = Views::new();
    let mut agent = Agent::start(AgentOptions::simulate("a100-40gb:2"));
    apply(&agent, "all-mps");
    let config = agent.dir.path().join("agent.toml");
    let before = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{}\n{before}", views.config())).unwrap();
    agent.restart();
    let status = status(&agent);
    assert_eq!(status["start_up_error"], Value::Null, "{status:#}");
    assert_eq!(status["active_profile"], "all-mps");
    for gpu in status["gpus"].as_array().unwrap() {
        assert_eq!(gpu["sharing"]["strategy"], "mps", "{status:#}");
    }
    assert!(!views.plugin().exists(), "the plugin's config was written half true");
    let out = agent.ctl(&["export", "--format", "device-plugin"]);
    assert!(!out.status.success() && stderr(&out).contains("MPS on GPUs 0, 1"), "{}", text(&out));
    assert_labels(&agent, &views.labels(), &status, Some("success"));
}

/// post_apply runs after the views are written: a hook that restarts NVIDIA's device
/// plugin (README's `pkill -HUP`) finds the new config, and the labels say success (review
/// of issue 40: the hook ran before, and saw the old config and `pending`).
#[test]
fn post_apply_finds_the_views_written() {
    if !is_root() {
        gpushare_tests::skip("the simulator makes device nodes only as root");
        return;
    }
    let views = Views::new();
    let seen = views.dir.path().join("seen-by-post-apply");
    std::fs::create_dir(&seen).unwrap();
    let hook =
        format!("cp {} {} {}", views.plugin().display(), views.labels().display(), seen.display());
    let config = format!("{}\n[hooks]\npost_apply = [{hook:?}]\n", views.config());
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2").config(&config));
    apply(&agent, "all-time-sliced");
    let (plugin, labels) = views.bytes();
    assert_eq!(std::fs::read(seen.join("device-plugin.yaml")).ok(), plugin);
    assert_eq!(std::fs::read(seen.join("gpushare")).ok(), labels);
    assert_views(&agent, &views, Some("success"));
}

/// A start-up whose re-apply does not commit still advertises the active profile's
/// time-slicing replicas (nothing on the GPU records them): the agent learns them from the
/// profile planned at start-up (review of issue 40: the plugin's config was rewritten as
/// "not shared"). Here the re-apply is refused: agent.toml now forbids setting intervals.
#[test]
fn time_slicing_replicas_survive_a_start_up_that_does_not_re_apply() {
    if !is_root() {
        gpushare_tests::skip("the simulator makes device nodes only as root");
        return;
    }
    let views = Views::new();
    let mut agent = start("a100-40gb:2", &views, &[]);
    apply(&agent, "all-time-sliced");
    let before = views.bytes();
    assert!(String::from_utf8_lossy(before.0.as_deref().unwrap()).contains("replicas: 4"));
    let config = agent.dir.path().join("agent.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("[gpu]\nmanage_timeslice = false\n{text}")).unwrap();
    agent.restart();
    let status = status(&agent);
    assert!(status["start_up_error"].is_string(), "the re-apply was not refused: {status:#}");
    assert_eq!(views.bytes().0, before.0, "the plugin's config changed");
    for gpu in status["gpus"].as_array().unwrap() {
        assert_eq!(gpu["sharing"]["replicas"], 4, "{status:#}");
    }
}

/// A bench's setups are no profile of the node: the files schedulers read stay as they
/// were while it holds its GPU (its replicas copy them mid-bench), and after it (review of
/// issue 40: a user's bench relabelled the node and rewrote the plugin's config).
#[test]
fn a_bench_leaves_the_views_schedulers_read_as_they_were() {
    if !is_root() {
        gpushare_tests::skip("the simulator makes device nodes only as root");
        return;
    }
    let views = Views::new();
    let agent = start("a100-40gb:1", &views, &[]);
    apply(&agent, "all-disabled");
    let before = views.bytes();
    let seen = views.dir.path().join("seen-during-the-bench");
    std::fs::create_dir(&seen).unwrap();
    let replica = format!(
        "cp {} {}/labels-$$ && cp {} {}/plugin-$$",
        views.labels().display(),
        seen.display(),
        views.plugin().display(),
        seen.display()
    );
    let out = agent.ctl(&[
        "bench",
        "--replicas",
        "2",
        "--strategies",
        "mps-limited",
        "--until-exit",
        "--",
        "/bin/sh",
        "-c",
        &replica,
    ]);
    assert!(out.status.success(), "bench: {}", text(&out));
    let mut copies = 0;
    for entry in std::fs::read_dir(&seen).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let want = if name.starts_with("labels-") { &before.1 } else { &before.0 };
        assert_eq!(std::fs::read(&path).ok(), *want, "{name} during the bench");
        copies += 1;
    }
    assert!(copies >= 2, "the replicas copied nothing");
    assert_eq!(views.bytes(), before, "the views after the bench");
    assert_views(&agent, &views, Some("success"));
}

/// MPS through the plugin only where agent.toml accepts that its pods get the host's
/// /dev/shm (review of issue 40): without `mps_host_shm`, all-mps on one GPU is refused
/// with the GPUs unchanged, naming the setting.
#[test]
fn mps_through_the_plugin_needs_the_host_shm_accepted() {
    if !is_root() {
        gpushare_tests::skip("the simulator makes device nodes only as root");
        return;
    }
    let views = Views::new();
    let config = views.config().replace("mps_host_shm = true\n", "");
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:1").config(&config));
    let before = (gpus(&agent), views.bytes());
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(!out.status.success(), "applied: {}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("mps_host_shm") && err.trim().lines().count() == 1, "{err}");
    assert_eq!((gpus(&agent), views.bytes()), before);
}
