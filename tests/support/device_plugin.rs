//! The check of NVIDIA k8s-device-plugin config files (issue 40): the schema
//! `tests/data/device-plugin-config-schema.json`, written from the plugin's v0.20.0
//! `api/config/v1` types and refusals, and the rules beside it in
//! `tests/support/check_device_plugin_config.py`, run with a python3 that has jsonschema
//! and yaml (Debian's python3-jsonschema and python3-yaml, `scripts/install-test-deps`).
//!
//! Without them the checks skip with a line saying so; under `GPUSHARE_REQUIRE_PODMAN=1`
//! (set by `.ci/run`, the variable the CDI schema check uses too) they fail instead.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::podman::REQUIRE_ENV;

/// The schema, relative to the repository root.
pub const DEVICE_PLUGIN_SCHEMA: &str = "tests/data/device-plugin-config-schema.json";
/// The checker, relative to the repository root.
pub const DEVICE_PLUGIN_CHECKER: &str = "tests/support/check_device_plugin_config.py";

/// The python3s tried, Debian's first (its python3-jsonschema and python3-yaml install
/// there, whatever python3 is first on PATH).
const PYTHONS: [&str; 2] = ["/usr/bin/python3", "python3"];

fn skip(reason: &str) {
    let required = std::env::var_os(REQUIRE_ENV).is_some_and(|v| v == "1");
    assert!(!required, "{REQUIRE_ENV}=1: {reason}");
    crate::skip(reason);
}

/// Whether [`validate_device_plugin_config`] can check (a python3 with jsonschema and
/// yaml); prints a skip line, or fails under `GPUSHARE_REQUIRE_PODMAN=1`, when it cannot.
pub fn has_device_plugin_checker() -> bool {
    let found = PYTHONS.iter().any(|python| {
        Command::new(python)
            .args(["-c", "import jsonschema, yaml"])
            .stdin(Stdio::null())
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !found {
        skip(
            "no python3 with jsonschema and yaml (apt-get install python3-jsonschema python3-yaml)",
        );
    }
    found
}

/// Checks the device plugin's config file at `path` against [`DEVICE_PLUGIN_SCHEMA`] and
/// the checker's own rules. `Ok` holds the document as JSON (`Value::Null` when no
/// checker could run, after a skip line); `Err` says why the file is refused, one problem
/// a line (`<path in the document>: <message>`, worded by whichever jsonschema ran: never
/// to be matched by a test). A checker that fails otherwise (a traceback, the schema
/// itself refused) panics.
pub fn validate_device_plugin_config(path: &Path) -> Result<Value, String> {
    let root = crate::repo_root();
    for python in PYTHONS {
        let Ok(out) = Command::new(python)
            .arg(root.join(DEVICE_PLUGIN_CHECKER))
            .arg(root.join(DEVICE_PLUGIN_SCHEMA))
            .arg(path)
            .stdin(Stdio::null())
            .output()
        else {
            continue;
        };
        let said = || {
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            format!("{}: {stdout}{stderr}", path.display()).trim().to_string()
        };
        match out.status.code() {
            Some(0) => {
                return Ok(serde_json::from_slice(&out.stdout)
                    .unwrap_or_else(|e| panic!("the checker's JSON ({e}): {}", said())));
            }
            Some(3) => continue,
            Some(10) => return Err(said()),
            _ => panic!(
                "the device plugin config check with {python} failed ({}): {}",
                out.status,
                said()
            ),
        }
    }
    skip(&format!("{} not checked: no python3 with jsonschema and yaml", path.display()));
    Ok(Value::Null)
}
