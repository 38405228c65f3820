//! `gpushare-e2e-call ADDRESS VERB ...`: D-Bus calls the end-to-end tests make that no
//! `gpushare-ctl` makes, run as whichever user the test chooses (`setpriv`):
//!
//! - `bench JSON`: `Bench` with `{"command": [...], "options": {...}}` as given, typed
//!   from JSON (strings `s`, whole numbers `u`, other numbers `d`, booleans `b`, lists of
//!   strings `as`, lists of numbers `au`); prints `job PATH`.
//! - `latest-job`: the object path of the newest job on the bus.
//! - `outcome PATH`: the job's `Outcome` property.
//! - `get-outcome PATH`: the job's `GetOutcome()`.
//! - `huge METHOD BYTES`: `METHOD` (`Plan`, `ShowProfile`, `Env`, `MigProfiles`, `ValidateProfile`,
//!   `PlanDocument`, `ApplyDocument`) with one string argument of `BYTES` bytes (the name,
//!   target or origin; a small valid profile as the text); prints `ok N` or the error as
//!   `error NAME: (N bytes) FIRST-200-CHARACTERS`.
//!
//! - `flood CONNECTIONS CALLS METHOD`: `CONNECTIONS` connections, each sending `CALLS`
//!   calls of `METHOD` (`Export`, `Status`, `Origin:BYTES`: `ValidateProfile` with an
//!   origin of `BYTES` bytes, or `Text:BYTES`: `PlanDocument` with a text of `BYTES`
//!   bytes) at once (pipelined), waiting for every reply; prints `flooded N calls in MS ms
//!   (F failed)`.
//! - `latency COUNT`: `COUNT` `Status` calls one after another on one connection; prints
//!   `p50 MS p99 MS max MS`.
//!
//! - `forget`, `unread`, `pipeline`: the floods of issue 36 ([`floods`]).
//!
//! Errors print `error NAME: MESSAGE` and exit 1.

mod floods;

use std::collections::HashMap;
use std::process::ExitCode;

use gpushare_proto::{AgentProxy, JobProxy};
use serde_json::Value as Json;
use zbus::zvariant::Value;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    match runtime.block_on(call(&args)) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("error {e}");
            ExitCode::FAILURE
        }
    }
}

async fn call(args: &[String]) -> Result<String, String> {
    let [address, verb, rest @ ..] = args else {
        return Err("usage: gpushare-e2e-call ADDRESS VERB ...".into());
    };
    if let Some(flooded) = floods::run(address, verb, rest).await {
        return flooded;
    }
    let connection = zbus::connection::Builder::address(address.as_str())
        .map_err(|e| e.to_string())?
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let named = |e: gpushare_proto::AgentError| {
        use zbus::DBusError;
        format!("{}: {}", e.name(), e.description().unwrap_or_default())
    };
    match (verb.as_str(), rest) {
        ("bench", [json]) => {
            let request: Json = serde_json::from_str(json).map_err(|e| e.to_string())?;
            let command: Vec<String> =
                serde_json::from_value(request["command"].clone()).map_err(|e| e.to_string())?;
            let command: Vec<&str> = command.iter().map(String::as_str).collect();
            let options = request["options"].as_object().cloned().unwrap_or_default();
            let options: HashMap<&str, Value<'_>> =
                options.iter().map(|(k, v)| (k.as_str(), typed(v))).collect();
            let agent = AgentProxy::new(&connection).await.map_err(|e| e.to_string())?;
            let job = agent.bench(&command, options).await.map_err(named)?;
            Ok(format!("job {}", job.as_str()))
        }
        ("latest-job", []) => {
            let jobs = zbus::fdo::IntrospectableProxy::builder(&connection)
                .destination(gpushare_proto::BUS_NAME)
                .and_then(|b| b.path(gpushare_proto::JOB_PATH_PREFIX))
                .map_err(|e| e.to_string())?
                .build()
                .await
                .map_err(|e| e.to_string())?;
            let xml = jobs.introspect().await.map_err(|e| e.to_string())?;
            let newest = xml
                .split("<node name=\"")
                .skip(1)
                .filter_map(|n| n.split('"').next()?.parse::<u64>().ok())
                .max()
                .ok_or("no job")?;
            Ok(format!("{}/{newest}", gpushare_proto::JOB_PATH_PREFIX))
        }
        ("outcome", [path]) => {
            job(&connection, path).await?.outcome().await.map_err(|e| e.to_string())
        }
        ("get-outcome", [path]) => job(&connection, path).await?.get_outcome().await.map_err(named),
        ("flood", [connections, calls, method]) => {
            let (connections, calls): (usize, usize) = (
                connections.parse().map_err(|e| format!("{connections}: {e}"))?,
                calls.parse().map_err(|e| format!("{calls}: {e}"))?,
            );
            let started = std::time::Instant::now();
            let mut clients = Vec::new();
            for _ in 0..connections {
                let conn = zbus::connection::Builder::address(address.as_str())
                    .map_err(|e| e.to_string())?
                    .build()
                    .await
                    .map_err(|e| e.to_string())?;
                clients.push(AgentProxy::new(&conn).await.map_err(|e| e.to_string())?);
            }
            let sized = |prefix: &str| -> Result<String, String> {
                match method.strip_prefix(prefix) {
                    Some(bytes) => {
                        Ok("o".repeat(bytes.parse().map_err(|e| format!("{bytes}: {e}"))?))
                    }
                    None => Ok(String::new()),
                }
            };
            let (origin, text) = (sized("Origin:")?, sized("Text:")?);
            let (origin, text) = (&origin, &text);
            let all = clients.iter().flat_map(|agent| {
                (0..calls).map(move |_| async move {
                    match method.as_str() {
                        "Export" => agent.export().await.map(|_| ()),
                        "Status" => agent.status().await.map(|_| ()),
                        m if m.starts_with("Text:") => {
                            agent.plan_document(text, "flood.toml", "").await.map(|_| ())
                        }
                        _ => agent
                            .validate_profile("[[gpu]]\nselect = 0\n", origin)
                            .await
                            .map(|_| ()),
                    }
                })
            });
            let answers = futures_util::future::join_all(all).await;
            let failed = answers.iter().filter(|a| a.is_err()).count();
            Ok(format!(
                "flooded {} calls in {} ms ({failed} failed)",
                answers.len(),
                started.elapsed().as_millis()
            ))
        }
        ("latency", [count]) => {
            let count: usize = count.parse().map_err(|e| format!("{count}: {e}"))?;
            let agent = AgentProxy::new(&connection).await.map_err(|e| e.to_string())?;
            let mut ms = Vec::new();
            for _ in 0..count {
                let t = std::time::Instant::now();
                agent.status().await.map_err(named)?;
                ms.push(t.elapsed().as_secs_f64() * 1000.0);
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            ms.sort_by(f64::total_cmp);
            let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
            Ok(format!("p50 {:.1} p99 {:.1} max {:.1}", at(0.5), at(0.99), ms[ms.len() - 1]))
        }
        ("huge", [method, bytes]) => {
            let n: usize = bytes.parse().map_err(|e| format!("{bytes}: {e}"))?;
            let big = "p".repeat(n);
            let text = "[[gpu]]\nselect = \"all\"\n";
            let agent = AgentProxy::new(&connection).await.map_err(|e| e.to_string())?;
            let answer = match method.as_str() {
                "Plan" => agent.plan(&big).await,
                "ShowProfile" => agent.show_profile(&big).await,
                "Env" => agent.env(&big).await,
                "MigProfiles" => agent.mig_profiles(&big).await,
                "ValidateProfile" => agent.validate_profile(text, &big).await,
                "PlanDocument" => agent.plan_document(text, &big, "").await,
                "ApplyDocument" => agent
                    .apply_document(text, &big, "", HashMap::new())
                    .await
                    .map(|job| job.to_string()),
                other => return Err(format!("no huge call {other}")),
            };
            match answer {
                Ok(reply) => Ok(format!("ok {}", reply.len())),
                Err(e) => {
                    use zbus::DBusError;
                    let message = e.description().unwrap_or_default().to_string();
                    let head: String = message.chars().take(200).collect();
                    Err(format!("{}: ({} bytes) {head}", e.name(), message.len()))
                }
            }
        }
        _ => Err(format!("unknown call {verb} {rest:?}")),
    }
}

async fn job<'a>(connection: &zbus::Connection, path: &'a str) -> Result<JobProxy<'a>, String> {
    JobProxy::builder(connection)
        .path(path)
        .map(|b| b.cache_properties(zbus::proxy::CacheProperties::No))
        .map_err(|e| e.to_string())?
        .build()
        .await
        .map_err(|e| e.to_string())
}

/// A D-Bus value for a JSON one.
fn typed(value: &Json) -> Value<'static> {
    match value {
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => match n.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(whole) => Value::from(whole),
            None => Value::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::from(s.clone()),
        Json::Array(items) if items.iter().all(Json::is_u64) => Value::from(
            items
                .iter()
                .filter_map(|i| i.as_u64().and_then(|n| u32::try_from(n).ok()))
                .collect::<Vec<u32>>(),
        ),
        Json::Array(items) => Value::from(
            items
                .iter()
                .map(|i| i.as_str().unwrap_or_default().to_string())
                .collect::<Vec<String>>(),
        ),
        other => Value::from(other.to_string()),
    }
}
