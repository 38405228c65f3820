//! The `a{sv}` options of `Apply` and `Probe`, read into typed requests; anything unknown
//! or of the wrong type is refused naming the option.

use std::collections::HashMap;

use gpushare_proto::{
    NAME_MAX_BYTES, OPTION_CLIENTS, OPTION_COMPARE, OPTION_FORCE, OPTION_SECONDS, OPTION_TARGET,
    OPTION_WORKLOADS, PROBE_DEFAULT_CLIENTS, PROBE_DEFAULT_SECONDS, Workload,
};
use zbus::zvariant::OwnedValue;

use gpushare_proto::bench::{
    BENCH_BUILTIN, BENCH_CPUS, BENCH_CWD, BENCH_DEFAULT_DURATION, BENCH_DEFAULT_FLEET,
    BENCH_DEFAULT_REPEAT, BENCH_DEFAULT_REPLICAS, BENCH_DEFAULT_TIME_LIMIT, BENCH_DURATION,
    BENCH_ENVIRONMENT, BENCH_FLEET, BENCH_HISTOGRAM, BENCH_LOGS, BENCH_MAX_ARGUMENTS,
    BENCH_MAX_COMMAND_BYTES, BENCH_MAX_DURATION, BENCH_MAX_ENVIRONMENT_BYTES, BENCH_MAX_NAME_BYTES,
    BENCH_MAX_PATH_BYTES, BENCH_MAX_TIME_LIMIT, BENCH_MAX_VARIABLES, BENCH_MIN_SECONDS,
    BENCH_OBJECTIVE, BENCH_PIN, BENCH_REPEAT, BENCH_REPLICAS, BENCH_SLO, BENCH_STRATEGIES,
    BENCH_TARGET, BENCH_TIME_LIMIT, BENCH_UNTIL_EXIT, BenchStrategy,
};

use crate::engine::{BenchOptions, EngineError, ProbeOptions};

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
    EngineError::InvalidArgument(format!("unknown option {:?}", short(key)))
}

/// `value`, an argument named `what`, when it has at most `max` bytes; refused otherwise,
/// saying only its size (never echoing it: a reply must stay far below the bus's limit).
pub fn bounded<'a>(what: &str, value: &'a str, max: usize) -> Result<&'a str, EngineError> {
    if value.len() > max {
        return Err(EngineError::InvalidArgument(format!(
            "{what}: {} bytes; at most {max}",
            value.len()
        )));
    }
    Ok(value)
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
                let target = String::try_from(value).map_err(|_| bad(key, "a string"))?;
                probe.target = Some(bounded(key, &target, NAME_MAX_BYTES)?.to_string());
            }
            OPTION_WORKLOADS => {
                let names: Vec<String> =
                    value.try_into().map_err(|_| bad(key, "an array of strings"))?;
                bounded_list(key, &names, 16, NAME_MAX_BYTES)?;
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

/// Refuses a list of more than `most` items or `bytes` bytes in all, naming it.
fn bounded_list(key: &str, items: &[String], most: usize, bytes: usize) -> Result<(), EngineError> {
    let total: usize = items.iter().map(String::len).sum();
    if items.len() > most || total > bytes {
        return Err(EngineError::InvalidArgument(format!(
            "{key}: {} items of {total} bytes in all; at most {most} items and {} KiB",
            items.len(),
            bytes >> 10
        )));
    }
    Ok(())
}

/// A number of seconds from `min` to `max`, else why not (never a panic later, whatever
/// the number).
fn seconds(key: &str, value: f64, max: f64, max_words: &str) -> Result<f64, EngineError> {
    if !(BENCH_MIN_SECONDS..=max).contains(&value) {
        return Err(EngineError::InvalidArgument(format!(
            "{key}: {} is not from 1 s to {max_words}",
            gpushare_proto::bench::seconds_text(value)
        )));
    }
    Ok(value)
}

/// Reads `Bench`'s command and options (the `BENCH_*` keys of the protocol); what is
/// left out takes the protocol's defaults, but the working directory must be given. Every
/// string, list and duration is bounded here, where it comes in.
pub fn bench_options(
    command: Vec<String>,
    options: &HashMap<String, OwnedValue>,
) -> Result<BenchOptions, EngineError> {
    bounded_list("command", &command, BENCH_MAX_ARGUMENTS, BENCH_MAX_COMMAND_BYTES)?;
    let mut bench = BenchOptions {
        target: None,
        command,
        builtin: None,
        replicas: BENCH_DEFAULT_REPLICAS.to_vec(),
        strategies: BenchStrategy::ALL.to_vec(),
        duration: Some(BENCH_DEFAULT_DURATION),
        objective: Default::default(),
        slo: None,
        histogram: None,
        fleet: BENCH_DEFAULT_FLEET,
        time_limit: BENCH_DEFAULT_TIME_LIMIT,
        repeat: BENCH_DEFAULT_REPEAT,
        cwd: Default::default(),
        environment: Vec::new(),
        logs: None,
        cpus: None,
        pin: true,
        replicas_given: false,
    };
    let mut until_exit = false;
    let text_of = |key: &str, value: OwnedValue, most: usize| {
        let text = String::try_from(value).map_err(|_| bad(key, "a string"))?;
        if text.len() > most {
            return Err(EngineError::InvalidArgument(format!(
                "{key}: {} bytes; at most {most}",
                text.len()
            )));
        }
        Ok(text)
    };
    let text = |key: &str, value: OwnedValue| text_of(key, value, BENCH_MAX_NAME_BYTES);
    let path = |key: &str, value: OwnedValue| text_of(key, value, BENCH_MAX_PATH_BYTES);
    let invalid = |key: &str, e: String| EngineError::InvalidArgument(format!("{key}: {e}"));
    for (key, value) in options {
        let value = value.try_clone().map_err(|_| bad(key, "a plain value"))?;
        match key.as_str() {
            BENCH_TARGET => bench.target = Some(text(key, value)?),
            BENCH_REPLICAS => {
                bench.replicas_given = true;
                bench.replicas = value.try_into().map_err(|_| bad(key, "an array of numbers"))?;
                if bench.replicas.len() > 64 {
                    return Err(bad(key, "at most 64 replica counts"));
                }
            }
            BENCH_STRATEGIES => {
                let names: Vec<String> =
                    value.try_into().map_err(|_| bad(key, "an array of strings"))?;
                bounded_list(key, &names, BenchStrategy::ALL.len() * 4, BENCH_MAX_NAME_BYTES)?;
                bench.strategies = names
                    .iter()
                    .map(|n| n.parse().map_err(|e| invalid(key, e)))
                    .collect::<Result<_, _>>()?;
                bench.strategies.dedup();
            }
            BENCH_DURATION => {
                let d = f64::try_from(value).map_err(|_| bad(key, "a number"))?;
                bench.duration = Some(seconds(key, d, BENCH_MAX_DURATION, "1 hour")?);
            }
            BENCH_UNTIL_EXIT => {
                until_exit = bool::try_from(value).map_err(|_| bad(key, "a boolean"))?;
            }
            BENCH_OBJECTIVE => {
                bench.objective = text(key, value)?.parse().map_err(|e| invalid(key, e))?;
            }
            BENCH_SLO => bench.slo = Some(text(key, value)?.parse().map_err(|e| invalid(key, e))?),
            BENCH_HISTOGRAM => {
                let name = text(key, value)?;
                if !gpushare_proto::bench::is_metric_name(&name) {
                    return Err(invalid(key, "not a Prometheus metric name".into()));
                }
                bench.histogram = Some(name);
            }
            BENCH_BUILTIN => {
                bench.builtin = Some(text(key, value)?.parse().map_err(|e| invalid(key, e))?);
            }
            BENCH_FLEET => bench.fleet = u32::try_from(value).map_err(|_| bad(key, "a number"))?,
            BENCH_REPEAT => {
                bench.repeat = u32::try_from(value).map_err(|_| bad(key, "a number"))?
            }
            BENCH_TIME_LIMIT => {
                let limit = f64::try_from(value).map_err(|_| bad(key, "a number"))?;
                bench.time_limit = seconds(key, limit, BENCH_MAX_TIME_LIMIT, "24 hours")?;
            }
            BENCH_CWD => bench.cwd = path(key, value)?.into(),
            BENCH_LOGS => bench.logs = Some(path(key, value)?.into()),
            BENCH_CPUS => bench.cpus = Some(text(key, value)?),
            BENCH_PIN => bench.pin = bool::try_from(value).map_err(|_| bad(key, "a boolean"))?,
            BENCH_ENVIRONMENT => {
                let pairs: Vec<String> =
                    value.try_into().map_err(|_| bad(key, "an array of strings"))?;
                bounded_list(key, &pairs, BENCH_MAX_VARIABLES, BENCH_MAX_ENVIRONMENT_BYTES)?;
                bench.environment = pairs
                    .into_iter()
                    .map(|p| match p.split_once('=') {
                        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
                        _ => Err(invalid(key, format!("{:?} is not NAME=value", short(&p)))),
                    })
                    .collect::<Result<_, _>>()?;
            }
            other => return Err(unknown(other)),
        }
    }
    if until_exit {
        if options.contains_key(BENCH_DURATION) {
            return Err(EngineError::InvalidArgument(
                "duration and until_exit exclude each other".into(),
            ));
        }
        bench.duration = None;
    }
    if bench.cwd.as_os_str().is_empty() {
        return Err(EngineError::InvalidArgument(
            "cwd: give the replicas' working directory".into(),
        ));
    }
    Ok(bench)
}

/// The first 64 characters of `text`, for a message about it (a caller's text: shown
/// safely, see [`crate::sys::text`]).
pub fn short(text: &str) -> String {
    let mut cut = crate::sys::text::printable(text, 64);
    if text.chars().nth(64).is_some() {
        cut.push('…');
    }
    cut
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

    #[test]
    fn bench_options_are_bounded_and_named_where_they_come_in() {
        let base = || vec![(BENCH_CWD, Value::from("/w"))];
        let with = |key: &'static str, value: Value<'static>| {
            let mut pairs = base();
            pairs.push((key, value));
            bench_options(vec!["true".into()], &options(pairs))
        };
        assert!(with(BENCH_HISTOGRAM, Value::from("rpc_seconds")).is_ok());
        let e = with(BENCH_HISTOGRAM, Value::from("")).unwrap_err();
        assert_eq!(e.to_string(), "histogram: not a Prometheus metric name");
        let e = with(BENCH_TIME_LIMIT, Value::from(1e300)).unwrap_err();
        assert_eq!(e.to_string(), "time_limit: 1e300 s is not from 1 s to 24 hours");
        let e = with(BENCH_TARGET, Value::from("x".repeat(300))).unwrap_err();
        assert_eq!(e.to_string(), "target: 300 bytes; at most 256");
        let e = bench_options(vec!["x".repeat(200 << 10)], &options(base())).unwrap_err();
        assert_eq!(
            e.to_string(),
            "command: 1 items of 204800 bytes in all; at most 4096 items and 128 KiB"
        );
        let long_key = "k".repeat(1000);
        let e = apply_options(&options(vec![(long_key.as_str(), Value::from(true))])).unwrap_err();
        assert!(e.to_string().len() < 100, "{e}");
    }
}
