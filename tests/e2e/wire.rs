//! The JSON documents as they travel, read without the protocol crate's types: a field
//! renamed or dropped on both sides at once would pass every typed test, so this one lists
//! the field names clients rely on (fields may be added, none renamed or removed).

use std::collections::BTreeSet;

use gpushare_tests::{Agent, AgentOptions, text};
use serde_json::Value;

/// A profile that puts every kind of object into the documents: MIG instances, one of them
/// under MPS, and a time-sliced whole GPU.
const WIRE: &str = "name = \"wire\"\n\
                    [[gpu]]\nselect = \"0\"\nmig = { \"1g\" = 2, \"2g\" = 1, \"3g\" = 1 }\n\
                    instance_sharing.\"3g\".mps = { replicas = 2 }\n\
                    [[gpu]]\nselect = \"1\"\nmig = \"disabled\"\n\
                    sharing.time-slicing = { interval = \"short\" }\n";

/// `gpushare-ctl ARGS --json`, as raw JSON.
fn raw(agent: &Agent, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = agent.ctl(&all);
    assert!(out.status.success(), "gpushare-ctl {args:?}: {}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {}", text(&out)))
}

/// Asserts that `value` is an object with at least the fields `names`.
#[track_caller]
fn has_fields(value: &Value, names: &[&str]) {
    let object = value.as_object().unwrap_or_else(|| panic!("not an object: {value}"));
    let have: BTreeSet<&str> = object.keys().map(String::as_str).collect();
    let missing: Vec<&&str> = names.iter().filter(|n| !have.contains(**n)).collect();
    assert!(missing.is_empty(), "missing {missing:?} in {value}");
}

#[test]
fn the_documents_keep_their_field_names() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2").profile("wire.toml", WIRE));

    let plan = raw(&agent, &["plan", "wire"]);
    has_fields(&plan, &["profile", "changes", "steps", "targets"]);
    has_fields(&plan["steps"][0], &["gpu", "operation", "description"]);
    has_fields(&plan["targets"][0], &["gpu", "model", "mig_enabled", "instances", "unchanged"]);
    has_fields(&plan["targets"][0]["instances"][0], &["profile", "placement_start"]);

    let outcome = raw(&agent, &["apply", "wire"]);
    has_fields(
        &outcome,
        &[
            "ok",
            "profile",
            "changed",
            "steps_done",
            "steps_total",
            "duration_seconds",
            "error_name",
            "error",
            "warnings",
        ],
    );
    assert_eq!(outcome["ok"], true, "{outcome}");

    let status = raw(&agent, &["status"]);
    has_fields(
        &status,
        &[
            "active_profile",
            "backend",
            "apply_in_progress",
            "starting_up",
            "rollback_error",
            "gpus",
        ],
    );
    let gpu = &status["gpus"][0];
    has_fields(
        gpu,
        &[
            "index",
            "uuid",
            "model",
            "memory_total_bytes",
            "mig_enabled",
            "mig_pending",
            "compute_mode",
            "sharing",
            "instances",
            "processes",
        ],
    );
    let instances = gpu["instances"].as_array().expect("instances");
    for instance in instances {
        has_fields(
            instance,
            &[
                "profile",
                "placement_start",
                "placement_size",
                "gpu_instance_id",
                "compute_instance_id",
                "uuid",
                "memory_bytes",
                "sharing",
            ],
        );
    }
    let under_mps = instances.iter().find(|i| i["sharing"]["strategy"] == "mps").expect("MPS");
    has_fields(&under_mps["sharing"], &["strategy", "mps"]);
    let sliced = &status["gpus"][1]["sharing"];
    assert_eq!(
        (&sliced["strategy"], &sliced["interval"]),
        (&"time-slicing".into(), &"short".into())
    );

    let mps = raw(&agent, &["mps", "status"]);
    has_fields(&mps, &["servers"]);
    has_fields(
        &mps["servers"][0],
        &[
            "uuid",
            "gpu",
            "placement_start",
            "state",
            "pid",
            "active_thread_percentage",
            "pinned_memory_limit_bytes",
            "restarts",
            "pipe_directory",
            "clients",
        ],
    );
    assert_eq!(mps["servers"][0]["state"], "running");

    let mig = under_mps["uuid"].as_str().expect("a MIG UUID");
    let env = raw(&agent, &["env", mig]);
    has_fields(&env, &["uuid", "strategy", "variables"]);
    assert_eq!(env["strategy"], "mps");

    let profiles = raw(&agent, &["profiles"]);
    has_fields(&profiles, &["profiles", "errors"]);
    has_fields(&profiles["profiles"][0], &["name", "description", "source", "active"]);
    let shown = raw(&agent, &["profiles", "show", "wire"]);
    has_fields(&shown, &["name", "description", "source", "active", "text"]);

    has_fields(&raw(&agent, &["export"]), &["text"]);
}
