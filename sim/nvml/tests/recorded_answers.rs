//! The simulator answers as the real driver did (issue 38): `tests/device/nvml_answers.py`,
//! which records a real GPU's answers read-only (error texts, addressing mode, fabric
//! info, attributes of a whole GPU, MIG-off lookups, the v1 entry points' argument
//! checks), runs here on the built library, on a simulated GPU of the model the recording
//! names (`gpu0.name`), and its answers must equal the recorded ones key by key. A future
//! recording that differs fails this test.
//!
//! The references are the recordings under `tests/device/results/nvml-answers-*/`
//! (`nvml-answers.json`: the first, an H100's, 2026-12-06), each compared.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The references: every recording.
fn references() -> Vec<(PathBuf, BTreeMap<String, Value>)> {
    let references = common::recordings("nvml-answers-", "nvml-answers.json");
    assert!(
        !references.is_empty(),
        "no recording under {}/nvml-answers-*/",
        common::workspace().join("tests/device/results").display()
    );
    references
        .into_iter()
        .map(|(path, value)| {
            let answers = serde_json::from_value(value)
                .unwrap_or_else(|e| panic!("{}: not a JSON object: {e}", path.display()));
            (path, answers)
        })
        .collect()
}

/// The simulated model of the GPU a recording names (`gpu0.name`, NVML's name).
fn model_of(path: &Path, recorded: &BTreeMap<String, Value>) -> &'static str {
    let name = recorded["gpu0"]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("{}: no gpu0.name", path.display()));
    let model = gpushare_catalog::model_by_nvml_name(name)
        .unwrap_or_else(|| panic!("{}: no simulated model is named {name:?}", path.display()));
    &model.key
}

/// What the recorder answers on the simulated library (None: python3 is missing).
fn simulated(model: &str) -> Option<BTreeMap<String, Value>> {
    let answers = common::run_recorder("nvml_answers.py", &format!("{model}:1"))?;
    Some(serde_json::from_value(answers).expect("the recorder prints an object"))
}

/// Where the simulator's answers differ from the recording's, one line each
/// (`key.field: recorded vs simulated`): every field recorded for a key must be the
/// simulator's (keys starting with `_` are notes).
fn differences(recorded: &BTreeMap<String, Value>, sim: &BTreeMap<String, Value>) -> Vec<String> {
    let mut out = Vec::new();
    for (key, want) in recorded.iter().filter(|(k, _)| !k.starts_with('_')) {
        let got = sim.get(key).unwrap_or(&Value::Null);
        match (want, got) {
            (Value::Object(w), Value::Object(g)) => {
                for (field, value) in w {
                    let mine = g.get(field).unwrap_or(&Value::Null);
                    if mine != value {
                        out.push(format!("{key}.{field}: {value} vs {mine}"));
                    }
                }
            }
            _ if want != got => out.push(format!("{key}: {want} vs {got}")),
            _ => {}
        }
    }
    out
}

#[test]
fn the_simulator_answers_as_the_recorded_driver() {
    for (path, recorded) in references() {
        let model = model_of(&path, &recorded);
        let Some(sim) = simulated(model) else {
            gpushare_test_skip::skip("python3 not found (it runs tests/device/nvml_answers.py)");
            return;
        };
        let diff = differences(&recorded, &sim);
        assert!(
            diff.is_empty(),
            "{} answers of a simulated {model} differ from {} (recorded vs simulated):\n{}",
            diff.len(),
            path.display(),
            diff.join("\n")
        );
        // A recording holds every key the recorder asks: a truncated file fails.
        let missing: Vec<&String> = sim.keys().filter(|k| !recorded.contains_key(*k)).collect();
        assert!(missing.is_empty(), "{} lacks {missing:?}", path.display());
    }
}
