//! The simulator answers the health watcher's calls (issue 42) sensibly, and as the real
//! driver did once a recording exists: `tests/device/health_answers.py` (which records a
//! real GPU's answers read-only: the event API, row remaps, retired pages, ECC, field 230)
//! runs here on the built library, on a healthy simulated H100 (or on the model and GPU
//! count a recording names), and every recording under
//! `tests/device/results/health-h100-*/health-answers.json` must hold the same keys and,
//! timings aside, the same answers.

mod common;

use serde_json::{Value, json};

/// What the recorder answers on the simulated library; None when python3 is missing.
fn simulated(spec: &str) -> Option<Value> {
    common::run_recorder("health_answers.py", spec)
}

/// The node the healthy answers are asked of.
const HEALTHY: &str = "h100-80gb:1";

/// Timings, which differ from run to run.
const TIMINGS: &[&str] = &["elapsed_ms", "cpu_s", "wall_s", "poll_gpu0_100x_ms"];

/// Where `sim` differs from `recorded`, one line per leaf (`path: recorded vs simulated`).
fn differences(path: &str, recorded: &Value, sim: &Value, out: &mut Vec<String>) {
    match (recorded, sim) {
        (Value::Object(r), Value::Object(s)) => {
            for key in r.keys().chain(s.keys().filter(|k| !r.contains_key(*k))) {
                if TIMINGS.contains(&key.as_str()) {
                    continue;
                }
                let (rv, sv) =
                    (r.get(key).unwrap_or(&Value::Null), s.get(key).unwrap_or(&Value::Null));
                differences(&format!("{path}.{key}"), rv, sv, out);
            }
        }
        _ if recorded != sim => out.push(format!("{path}: {recorded} vs {sim}")),
        _ => {}
    }
}

#[test]
fn the_health_calls_answer_as_a_healthy_gpu_and_as_recorded() {
    let Some(sim) = simulated(HEALTHY) else {
        gpushare_test_skip::skip("python3 not found (it runs tests/device/health_answers.py)");
        return;
    };
    let gpu = &sim["gpus"]["0"];
    assert_eq!(sim["init"], 0);
    assert_eq!(gpu["supported_event_types"]["ret"], 0);
    assert_eq!(
        gpu["remapped_rows"],
        json!({"ret": 0, "corr": 0, "unc": 0, "pending": 0, "failure": 0})
    );
    assert_eq!(gpu["row_remapper_histogram"]["max"], 2560);
    assert_eq!(gpu["retired_pages_sbe"]["ret"], 3, "NOT_SUPPORTED: Hopper remaps rows");
    assert_eq!(gpu["ecc_mode"], json!({"ret": 0, "current": 1, "pending": 1}));
    assert_eq!(gpu["ecc_uncorrected_volatile"], json!({"ret": 0, "count": 0}));
    let fields = &gpu["field_values"];
    assert_eq!(fields["ret"], 0);
    assert_eq!(
        fields["fields"][0],
        json!({"fieldId": 230, "nvmlReturn": 0, "valueType": 1, "value": 0})
    );
    let events = &sim["events"];
    assert_eq!(events["event_set_create"]["ret"], 0);
    assert_eq!(
        events["register"]["0"],
        json!({"xid_dbe_sbe": 0, "unavailable_recovery": 0, "unknown_bit": 3})
    );
    for wait in ["wait_0ms", "wait_100ms", "wait_v1_100ms"] {
        assert_eq!(events[wait]["ret"], 10, "{wait}: NVML_ERROR_TIMEOUT");
    }
    assert_eq!(events["ten_1s_waits"]["rets"], json!([10]));
    assert_eq!(events["event_set_free"]["ret"], 0);
    assert_eq!(events["null_set_create"]["ret"], 2);

    for (path, recorded) in common::recordings("health-", "health-answers.json") {
        let name = recorded["gpu0_name"].as_str().expect("gpu0_name");
        let model = gpushare_catalog::model_by_nvml_name(name)
            .unwrap_or_else(|| panic!("{}: no simulated model is named {name:?}", path.display()));
        let count = recorded["gpus"].as_object().map_or(1, |g| g.len().max(1));
        let spec = format!("{}:{count}", model.key);
        // The healthy H100 above is asked again only for another spec (each run takes seconds).
        let other;
        let answers = if spec == HEALTHY {
            &sim
        } else {
            other = simulated(&spec).expect("python3 ran above");
            &other
        };
        let mut diff = Vec::new();
        differences("", &recorded, answers, &mut diff);
        assert!(
            diff.is_empty(),
            "{} answers differ from {} (recorded vs simulated):\n{}",
            diff.len(),
            path.display(),
            diff.join("\n")
        );
    }
}
