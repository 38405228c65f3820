//! The harness for issue 28's CDI tests, checked on hand-written specs: the CDI schema
//! (tests/data/cdi-schema.json) accepts a valid spec and refuses each fault alone in one,
//! and a real podman (Debian's 4.3 with runc, `tests/support/podman.rs`) injects a spec's
//! environment, device node and mount into a container, refuses an unknown name
//! with CDI's "unresolvable" error, and gives each test its own CDI directory.

use std::path::Path;

use gpushare_tests::podman::{UNRESOLVABLE, assert_unresolvable, has_jsonschema};
use gpushare_tests::{Podman, stdout, text, validate_cdi};
use nix::sys::stat::{Mode, SFlag, makedev, mknod};
use serde_json::{Value, json};
use tempfile::TempDir;

/// The kind of the hand-written specs (not gpushare's own).
const KIND: &str = "gpushare-test.io/gpu";

/// A spec with every edit the agent's will use: env, a device node (`host_node` as
/// `/dev/gpushare-test0`), a bind mount (`host_dir` as `/mounted`), spec-wide env.
fn full_spec(host_node: &Path, host_dir: &Path) -> Value {
    json!({
        "cdiVersion": "0.5.0",
        "kind": KIND,
        "devices": [
            {
                "name": "x",
                "containerEdits": {
                    "env": ["GPUSHARE_TEST_DEVICE=x", "CUDA_MPS_PIPE_DIRECTORY=/mounted"],
                    "deviceNodes": [{
                        "path": "/dev/gpushare-test0",
                        "hostPath": host_node,
                        "type": "c",
                        "major": 195,
                        "minor": 0,
                        "permissions": "rw",
                        "fileMode": 0o666
                    }],
                    "mounts": [{
                        "hostPath": host_dir,
                        "containerPath": "/mounted",
                        "options": ["ro", "nosuid", "nodev", "bind"]
                    }]
                }
            },
            { "name": "0", "containerEdits": { "env": ["GPUSHARE_TEST_ZERO=1"] } }
        ],
        "containerEdits": { "env": ["GPUSHARE_TEST_SPEC=1"] }
    })
}

fn write_spec(dir: &Path, spec: &Value) -> std::path::PathBuf {
    let path = dir.join("test.json");
    std::fs::write(&path, serde_json::to_vec_pretty(spec).unwrap()).unwrap();
    path
}

/// A character device 195:0 (as /dev/nvidia0) made with mknod under `dir`.
fn char_device(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("gpu0");
    let made = mknod(&path, SFlag::S_IFCHR, Mode::from_bits_truncate(0o666), makedev(195, 0));
    if let Err(e) = made {
        panic!("mknod {}: {}", path.display(), std::io::Error::from(e));
    }
    path
}

/// The valid spec with `change` made at the JSON pointer `at`: `Some(value)` sets it,
/// `None` removes it.
fn changed(spec: &Value, at: &str, change: Option<Value>) -> Value {
    let mut spec = spec.clone();
    let (parent, key) = at.rsplit_once('/').unwrap();
    let parent = spec.pointer_mut(parent).unwrap_or_else(|| panic!("no {parent} in the spec"));
    match (parent, change) {
        (Value::Object(map), Some(value)) => {
            map.insert(key.into(), value);
        }
        (Value::Object(map), None) => assert!(map.remove(key).is_some(), "no {at}"),
        (Value::Array(items), Some(value)) => items[key.parse::<usize>().unwrap()] = value,
        (other, _) => panic!("{at}: cannot change {other}"),
    }
    spec
}

/// Each fault, alone in an otherwise valid spec, makes it invalid: validity is compared,
/// never the validator's wording (which differs between jsonschema releases).
#[test]
fn schema_accepts_a_valid_spec_and_refuses_each_fault_alone() {
    if !has_jsonschema() {
        return;
    }
    let dir = TempDir::new().unwrap();
    let check = |spec: &Value| validate_cdi(&write_spec(dir.path(), spec));
    let valid = full_spec(Path::new("/dev/nvidia0"), Path::new("/tmp"));
    check(&valid).unwrap();

    let edits = "/devices/0/containerEdits";
    for (fault, at, change) in [
        ("annotations before 0.6.0", "/annotations", Some(json!({ "a": "b" }))),
        ("a dot in the class before 0.6.0", "/kind", Some(json!("gpushare-test.io/gpu.mps"))),
        ("an env entry without '='", &format!("{edits}/env/0"), Some(json!("NO_EQUALS"))),
        ("an unknown field", &format!("{edits}/unknown"), Some(json!([]))),
        ("a relative device path", &format!("{edits}/deviceNodes/0/path"), Some(json!("dev/x"))),
        ("a device type of x", &format!("{edits}/deviceNodes/0/type"), Some(json!("x"))),
        ("a mount without options", &format!("{edits}/mounts/0/options"), None),
        ("a device without edits", "/devices/1/containerEdits", Some(json!({}))),
        ("a name starting with '-'", "/devices/1/name", Some(json!("-bad"))),
        ("a name defined twice", "/devices/1/name", Some(json!("x"))),
        ("no devices", "/devices", Some(json!([]))),
        ("no kind", "/kind", None),
    ] {
        let spec = changed(&valid, at, change);
        assert!(check(&spec).is_err(), "{fault} ({at}) passes the schema:\n{spec:#}");
    }

    // 0.6.0 allows annotations and a dot in the class; not JSON at all is refused.
    let v060 = changed(&valid, "/cdiVersion", Some(json!("0.6.0")));
    let v060 = changed(&v060, "/kind", Some(json!("gpushare-test.io/gpu.mps")));
    check(&changed(&v060, "/annotations", Some(json!({ "a": "b" })))).unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{").unwrap();
    assert!(validate_cdi(&bad).is_err());
}

#[test]
fn podman_injects_a_hand_written_cdi_spec() {
    let Some(podman) = Podman::available() else { return };
    let host = TempDir::new().unwrap();
    let node = char_device(host.path());
    let mounted = host.path().join("mounted");
    std::fs::create_dir(&mounted).unwrap();
    std::fs::write(mounted.join("pipe-file"), "hello\n").unwrap();
    let cdi = TempDir::new().unwrap();
    let spec = write_spec(cdi.path(), &full_spec(&node, &mounted));
    validate_cdi(&spec).unwrap();
    let podman = podman.with_cdi_dir(cdi.path());

    let out = podman.run(
        &[&format!("{KIND}=x")],
        "env | sort | grep -E '^(GPUSHARE|CUDA)_'; ls -l /dev/gpushare-test0; ls /mounted; \
         cat /mounted/pipe-file; touch /mounted/w 2>&1 || echo read-only",
    );
    assert!(out.status.success(), "{}", text(&out));
    let seen = stdout(&out);
    for line in [
        "CUDA_MPS_PIPE_DIRECTORY=/mounted",
        "GPUSHARE_TEST_DEVICE=x",
        "GPUSHARE_TEST_SPEC=1",
        "pipe-file",
        "hello",
        "read-only",
    ] {
        assert!(seen.lines().any(|l| l == line), "no line {line:?} in:\n{seen}");
    }
    let node_line = seen.lines().find(|l| l.ends_with("/dev/gpushare-test0")).unwrap();
    assert!(
        node_line.starts_with('c') && node_line.contains("195,") && node_line.contains(" 0 "),
        "{node_line}"
    );

    // Two devices of one spec at once; a device name starting with a digit (0.5.0).
    let out = podman.run(&[&format!("{KIND}=0"), &format!("{KIND}=x")], "env | sort");
    assert!(out.status.success(), "{}", text(&out));
    for line in ["GPUSHARE_TEST_ZERO=1", "GPUSHARE_TEST_DEVICE=x"] {
        assert!(stdout(&out).lines().any(|l| l == line), "no {line:?}: {}", text(&out));
    }

    // A name the spec lacks: CDI's "unresolvable" error, podman's exit status 126.
    let missing = format!("{KIND}=nope");
    let out = podman.run(&[&missing], "true");
    assert_unresolvable(&out, &missing);
    assert_eq!(out.status.code(), Some(126), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("Error: setting up CDI devices: {UNRESOLVABLE} {missing}")),
        "{}",
        text(&out)
    );

    // Debian 12's podman 4.3 loads specs up to cdiVersion 0.5.0: a 0.6.0 file is skipped
    // whole, so even its valid devices are "unresolvable". The agent writes 0.5.0.
    let version = podman.command().arg("--version").output().unwrap();
    if stdout(&version).starts_with("podman version 4.3.") {
        let mut v060 = full_spec(&node, &mounted);
        v060["cdiVersion"] = json!("0.6.0");
        write_spec(cdi.path(), &v060);
        assert_unresolvable(&podman.run(&[&format!("{KIND}=x")], "true"), &format!("{KIND}=x"));
    }
}

#[test]
fn each_podman_sees_only_its_own_cdi_directory() {
    let Some(podman) = Podman::available() else { return };
    // The same kind and name in two directories, used at once from two threads.
    let dirs: Vec<TempDir> = (0..2).map(|_| TempDir::new().unwrap()).collect();
    for (i, dir) in dirs.iter().enumerate() {
        let spec = json!({
            "cdiVersion": "0.5.0",
            "kind": KIND,
            "devices": [{ "name": "x", "containerEdits": { "env": [format!("WHICH={i}")] } }]
        });
        write_spec(dir.path(), &spec);
    }
    std::thread::scope(|s| {
        let runs: Vec<_> = dirs
            .iter()
            .enumerate()
            .map(|(i, dir)| {
                let podman = podman.with_cdi_dir(dir.path());
                s.spawn(move || (i, podman.run(&[&format!("{KIND}=x")], "echo $WHICH")))
            })
            .collect();
        for run in runs {
            let (i, out) = run.join().unwrap();
            assert!(out.status.success(), "{}", text(&out));
            assert_eq!(stdout(&out).trim(), i.to_string());
        }
    });
    // Without a directory of its own a container sees no spec at all.
    let device = format!("{KIND}=x");
    assert_unresolvable(&podman.run(&[&device], "true"), &device);
}
