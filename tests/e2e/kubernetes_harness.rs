//! The harness for issue 40's Kubernetes tests, checked on hand-written files: the device
//! plugin's config schema (tests/data/device-plugin-config-schema.json with
//! tests/support/check_device_plugin_config.py) accepts valid configs of each kind and
//! refuses each fault alone in one; validity is compared, never the checker's wording.

use std::path::{Path, PathBuf};

use gpushare_tests::device_plugin::{has_device_plugin_checker, validate_device_plugin_config};
use serde_json::{Value, json};
use tempfile::TempDir;

fn write(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("config.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A config as the plugin's own documentation writes them, with every field a valid
/// file may have.
const FULL: &str = "\
# A comment, as gpushare writes one.
version: v1
flags:
  migStrategy: none
  failOnInitError: true
  mpsRoot: /run/gpushare/mps
  nvidiaDriverRoot: /
  nvidiaDevRoot: /
  gdrcopyEnabled: false
  gdsEnabled: false
  mofedEnabled: false
  useNodeFeatureAPI: false
  deviceDiscoveryStrategy: auto
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: [envvar, cdi-cri]
    deviceIDStrategy: uuid
    cdiAnnotationPrefix: cdi.k8s.io/
    nvidiaCTKPath: /usr/bin/nvidia-ctk
    containerDriverRoot: /driver-root
    sharedDevicesAllocationPolicy: packed
  gfd:
    oneshot: true
    noTimestamp: true
    sleepInterval: 60s
    outputFile: /tmp/gfd
    machineTypeFile: /sys/class/dmi/id/product_name
sharing:
  mps:
    renameByDefault: false
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
      devices: all
imex:
  channelIDs: [0]
  required: false
";

/// The valid config with `change` made at the JSON pointer `at` (`None` removes it; an
/// index one past an array's end appends).
fn changed(valid: &Value, at: &str, change: Option<Value>) -> Value {
    let mut doc = valid.clone();
    let (parent, key) = at.rsplit_once('/').unwrap();
    let parent = doc.pointer_mut(parent).unwrap_or_else(|| panic!("no {parent} in {valid}"));
    match (parent, change) {
        (Value::Object(map), Some(value)) => {
            map.insert(key.into(), value);
        }
        (Value::Object(map), None) => assert!(map.remove(key).is_some(), "no {at}"),
        (Value::Array(items), Some(value)) => match key.parse::<usize>().unwrap() {
            i if i == items.len() => items.push(value),
            i => items[i] = value,
        },
        (other, _) => panic!("{at}: cannot change {other}"),
    }
    doc
}

#[test]
fn device_plugin_schema_accepts_valid_configs_and_refuses_each_fault_alone() {
    if !has_device_plugin_checker() {
        return;
    }
    let dir = TempDir::new().unwrap();
    // JSON is YAML: the changed documents are written as JSON.
    let check = |doc: &Value| validate_device_plugin_config(&write(dir.path(), &doc.to_string()));
    let full = validate_device_plugin_config(&write(dir.path(), FULL)).unwrap();
    assert_eq!(full["sharing"]["mps"]["resources"][0]["replicas"], 4, "the document comes back");

    // The other valid shapes: the smallest file, time-slicing, MIG devices under mixed.
    let time_sliced = json!({
        "version": "v1",
        "flags": { "migStrategy": "none", "failOnInitError": true },
        "sharing": { "timeSlicing": { "failRequestsGreaterThanOne": true,
            "resources": [{ "name": "nvidia.com/gpu", "replicas": 4 }] } }
    });
    let mixed = json!({
        "version": "v1",
        "flags": { "migStrategy": "mixed", "failOnInitError": true },
        "sharing": { "timeSlicing": { "resources": [
            { "name": "nvidia.com/mig-1g.10gb", "replicas": 2 },
            { "name": "nvidia.com/mig-1g.24gb.gfx", "replicas": 3 },
            { "name": "nvidia.com/mig-1g.12gb.me.all", "replicas": 2 },
            { "name": "nvidia.com/mig-2g.48gb-me", "replicas": 2 },
            { "name": "nvidia.com/gpu", "replicas": 2 }
        ] } }
    });
    for valid in [
        json!({ "version": "v1" }),
        json!({ "version": "v1", "flags": { "migStrategy": "single" }, "sharing": {} }),
        time_sliced.clone(),
        mixed.clone(),
        changed(&full, "/flags/plugin/deviceListStrategy", Some(json!("volume-mounts"))),
        changed(&full, "/flags/gfd/sleepInterval", Some(json!("infinite"))),
        changed(&full, "/flags/gfd/sleepInterval", Some(json!(1_000_000_000))),
        changed(&full, "/imex/channelIDs", Some(json!([]))),
    ] {
        check(&valid).unwrap_or_else(|e| panic!("refused: {e}\n{valid:#}"));
    }

    let mps = "/sharing/mps";
    let first = "/sharing/mps/resources/0";
    for (fault, at, change) in [
        ("no version", "/version", None),
        ("version v2", "/version", Some(json!("v2"))),
        ("an unknown top-level field", "/extra", Some(json!(1))),
        ("an unknown flag", "/flags/migstrategy", Some(json!("none"))),
        ("an unknown plugin flag", "/flags/plugin/deviceListStrategies", Some(json!("envvar"))),
        ("an unknown field in a resource", &format!("{first}/replica"), Some(json!(2))),
        ("migStrategy all", "/flags/migStrategy", Some(json!("all"))),
        ("failOnInitError a string", "/flags/failOnInitError", Some(json!("true"))),
        ("a relative mpsRoot", "/flags/mpsRoot", Some(json!("run/mps"))),
        ("deviceIDStrategy name", "/flags/plugin/deviceIDStrategy", Some(json!("name"))),
        ("a list strategy unknown", "/flags/plugin/deviceListStrategy/1", Some(json!("cdi"))),
        ("an empty list strategy", "/flags/plugin/deviceListStrategy", Some(json!([]))),
        ("an allocation policy", "/flags/plugin/sharedDevicesAllocationPolicy", Some(json!("x"))),
        ("discovery strategy", "/flags/deviceDiscoveryStrategy", Some(json!("pci"))),
        ("a duration of 1 minute", "/flags/gfd/sleepInterval", Some(json!("1 minute"))),
        ("imex channel 1", "/imex/channelIDs", Some(json!([1]))),
        ("top-level resources (dropped)", "/resources", Some(json!({ "gpus": [] }))),
        ("replicas 1", &format!("{first}/replicas"), Some(json!(1))),
        ("replicas 4.0", &format!("{first}/replicas"), Some(json!(4.0))),
        ("replicas a string", &format!("{first}/replicas"), Some(json!("4"))),
        ("no replicas", &format!("{first}/replicas"), None),
        ("no name", &format!("{first}/name"), None),
        ("MPS replicas over 48", &format!("{first}/replicas"), Some(json!(49))),
        ("a rename (dropped)", &format!("{first}/rename"), Some(json!("nvidia.com/gpu.shared"))),
        ("devices 1 (dropped)", &format!("{first}/devices"), Some(json!(1))),
        ("devices listed (dropped)", &format!("{first}/devices"), Some(json!(["0"]))),
        ("a bare resource name", &format!("{first}/name"), Some(json!("gpu"))),
        ("another vendor", &format!("{first}/name"), Some(json!("amd.com/gpu"))),
        ("a resource that is never made", &format!("{first}/name"), Some(json!("nvidia.com/gpux"))),
        ("no resources", &format!("{mps}/resources"), None),
        ("empty resources", &format!("{mps}/resources"), Some(json!([]))),
        (
            "a resource twice",
            &format!("{mps}/resources/1"),
            Some(json!({
            "name": "nvidia.com/gpu", "replicas": 2 })),
        ),
        (
            "MPS and time-slicing",
            "/sharing/timeSlicing",
            Some(json!({
            "resources": [{ "name": "nvidia.com/gpu", "replicas": 2 }] })),
        ),
        ("MPS without mpsRoot", "/flags/mpsRoot", None),
        ("MPS with an empty mpsRoot", "/flags/mpsRoot", Some(json!(""))),
        ("MPS with mixed", "/flags/migStrategy", Some(json!("mixed"))),
        ("MPS on a MIG device", &format!("{first}/name"), Some(json!("nvidia.com/mig-1g.10gb"))),
        ("an unknown sharing", "/sharing/exclusive", Some(json!({}))),
    ] {
        let doc = changed(&full, at, change);
        assert!(check(&doc).is_err(), "{fault} ({at}) passes the schema:\n{doc:#}");
    }

    for (fault, doc) in [
        (
            "MIG resources without mixed",
            changed(&mixed, "/flags/migStrategy", Some(json!("single"))),
        ),
        ("MIG resources with no flags", changed(&mixed, "/flags", None)),
        (
            "a compute-instance profile",
            changed(
                &mixed,
                "/sharing/timeSlicing/resources/0/name",
                Some(json!("nvidia.com/mig-1c.3g.40gb")),
            ),
        ),
        (
            "a '+' in a MIG name",
            changed(
                &mixed,
                "/sharing/timeSlicing/resources/1/name",
                Some(json!("nvidia.com/mig-1g.24gb+gfx")),
            ),
        ),
        (
            "time-slicing without resources",
            changed(&time_sliced, "/sharing/timeSlicing/resources", None),
        ),
    ] {
        assert!(check(&doc).is_err(), "{fault} passes the schema:\n{doc:#}");
    }

    // What only the checker beside the schema sees in the YAML itself.
    for (fault, text) in [
        ("a key written twice", "version: v1\nversion: v1\n".to_string()),
        ("two documents", "version: v1\n---\nversion: v1\n".to_string()),
        ("not YAML", "version: [v1\n".to_string()),
        ("not a mapping", "- version\n".to_string()),
        ("MPS replicas as 4.0", FULL.replace("replicas: 4", "replicas: 4.0")),
        ("a tab-indented key", FULL.replace("  migStrategy", "\tmigStrategy")),
    ] {
        let path = write(dir.path(), &text);
        assert!(validate_device_plugin_config(&path).is_err(), "{fault} passes:\n{text}");
    }
}
