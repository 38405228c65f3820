//! The `a{sv}` options of `Apply` and `Probe`, read into typed requests; anything unknown
//! or of the wrong type is refused naming the option.

use std::collections::HashMap;

use gpushare_proto::{
    OPTION_CLIENTS, OPTION_COMPARE, OPTION_FORCE, OPTION_SECONDS, OPTION_TARGET, OPTION_WORKLOADS,
    PROBE_DEFAULT_CLIENTS, PROBE_DEFAULT_SECONDS, Workload,
};
use zbus::zvariant::OwnedValue;

use crate::engine::{EngineError, ProbeOptions};

/// The options of `Apply` and `ApplyDocument`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ApplyOptions {
    /// Proceed although compute processes use what must change.
    pub force: bool,
}

fn bad(key: &str, what: &str) -> EngineError {
    EngineError::InvalidArgument(format!("option {key:?} must be {what}"))
}

fn unknown(key: &str) -> EngineError {
    EngineError::InvalidArgument(format!("unknown option {key:?}"))
}

/// Reads `Apply`'s options: `force` (b).
pub fn apply_options(options: &HashMap<String, OwnedValue>) -> Result<ApplyOptions, EngineError> {
    let mut apply = ApplyOptions::default();
    if let Some(v) = options.get(OPTION_FORCE) {
        apply.force = bool::try_from(v).map_err(|_| bad(OPTION_FORCE, "a boolean"))?;
    }
    match options.keys().find(|k| k.as_str() != OPTION_FORCE) {
        Some(key) => Err(unknown(key)),
        None => Ok(apply),
    }
}

/// Reads `Probe`'s options: `target` (s), `workloads` (as), `clients` (au), `seconds` (d),
/// `compare` (b); what is left out takes the protocol's defaults.
pub fn probe_options(options: &HashMap<String, OwnedValue>) -> Result<ProbeOptions, EngineError> {
    let mut probe = ProbeOptions {
        target: None,
        workloads: Workload::ALL.to_vec(),
        clients: PROBE_DEFAULT_CLIENTS.iter().map(|&n| n as usize).collect(),
        seconds: PROBE_DEFAULT_SECONDS,
        compare: false,
    };
    for (key, value) in options {
        let value = value.try_clone().map_err(|_| bad(key, "a plain value"))?;
        match key.as_str() {
            OPTION_TARGET => {
                probe.target = Some(String::try_from(value).map_err(|_| bad(key, "a string"))?);
            }
            OPTION_WORKLOADS => {
                let names: Vec<String> =
                    value.try_into().map_err(|_| bad(key, "an array of strings"))?;
                probe.workloads = names
                    .iter()
                    .map(|n| n.parse().map_err(EngineError::InvalidArgument))
                    .collect::<Result<_, _>>()?;
            }
            OPTION_CLIENTS => {
                let counts: Vec<u32> =
                    value.try_into().map_err(|_| bad(key, "an array of numbers"))?;
                probe.clients = counts.into_iter().map(|c| c as usize).collect();
            }
            OPTION_SECONDS => {
                probe.seconds = f64::try_from(value).map_err(|_| bad(key, "a number"))?;
            }
            OPTION_COMPARE => {
                probe.compare = bool::try_from(value).map_err(|_| bad(key, "a boolean"))?;
            }
            other => return Err(unknown(other)),
        }
    }
    Ok(probe)
}

#[cfg(test)]
mod tests {
    use super::*;
    use zbus::zvariant::Value;

    fn options(pairs: Vec<(&str, Value<'_>)>) -> HashMap<String, OwnedValue> {
        pairs.into_iter().map(|(k, v)| (k.to_string(), v.try_to_owned().unwrap())).collect()
    }

    #[test]
    fn apply_takes_force_and_nothing_else() {
        assert_eq!(apply_options(&options(vec![])).unwrap(), ApplyOptions { force: false });
        let forced = options(vec![(OPTION_FORCE, Value::from(true))]);
        assert_eq!(apply_options(&forced).unwrap(), ApplyOptions { force: true });
        let e = apply_options(&options(vec![(OPTION_FORCE, Value::from(1u32))])).unwrap_err();
        assert_eq!(e.to_string(), "option \"force\" must be a boolean");
        let e = apply_options(&options(vec![("dry", Value::from(true))])).unwrap_err();
        assert_eq!(e.to_string(), "unknown option \"dry\"");
    }

    #[test]
    fn probe_options_fill_in_the_defaults() {
        let p = probe_options(&options(vec![])).unwrap();
        assert_eq!((p.workloads.len(), p.clients.clone(), p.seconds), (3, vec![1, 2, 4, 7], 3.0));
        let p = probe_options(&options(vec![
            (OPTION_WORKLOADS, Value::from(vec!["memory"])),
            (OPTION_CLIENTS, Value::from(vec![2u32])),
            (OPTION_COMPARE, Value::from(true)),
            (OPTION_TARGET, Value::from("MIG-1")),
        ]))
        .unwrap();
        assert_eq!(p.workloads, [Workload::Memory]);
        assert_eq!((p.clients, p.compare, p.target.as_deref()), (vec![2], true, Some("MIG-1")));
        let e = probe_options(&options(vec![(OPTION_WORKLOADS, Value::from(vec!["io"]))]));
        assert_eq!(
            e.unwrap_err().to_string(),
            "unknown probe workload \"io\" (launch, compute, memory)"
        );
    }
}
