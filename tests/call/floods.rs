//! The floods of issue 36, as a hostile local user sends them (the tests and the bench run
//! this binary as another user):
//!
//! - `forget CONNECTIONS CALLS KIND SECONDS`: for SECONDS, again and again, CONNECTIONS new
//!   connections each send CALLS calls of KIND without waiting for an answer, then close;
//!   prints `sent N calls on M connections`.
//! - `unread CONNECTIONS CALLS KIND SECONDS`: CONNECTIONS connections each send CALLS calls
//!   of KIND, then nothing reads their answers for SECONDS (the process sleeps with the
//!   connections open); prints `sent N calls`.
//! - `pipeline CONNECTIONS DEPTH KIND SECONDS`: for SECONDS, CONNECTIONS connections each
//!   keep DEPTH calls of KIND in flight, reading every answer; prints `answered N calls
//!   (F failed) in S s` (S: from the first connection to the last answer).
//!
//! KIND: `Introspect`, `Ping`, `GetAll` (the standard interfaces), or a method of
//! `io.gpushare.Agent1` taking no arguments (`Status`, `Export`, `CdiDevices`,
//! `ListProfiles`, `Telemetry`, `Clients`, `MpsStatus`), `ShowProfile` (of `all-mps`), or
//! `Validate` (`ValidateProfile` of a 256 KiB profile).

use std::time::{Duration, Instant};

use gpushare_proto::{BUS_NAME, OBJECT_PATH, PROFILE_MAX_BYTES};
use zbus::{Connection, Message};

/// A profile of nearly the largest size the agent takes, padded with comments.
fn large_profile() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        let mut text = String::from("[[gpu]]\nselect = \"all\"\n");
        while text.len() + 32 < PROFILE_MAX_BYTES {
            text.push_str("# padding padding padding pad\n");
        }
        text
    })
}

/// A call of `kind` to the agent (a new message, with a serial of its own, each time).
fn call(kind: &str) -> Result<Message, String> {
    let build = |interface: &str, member: &str| {
        Message::method_call(OBJECT_PATH, member.to_owned())
            .and_then(|b| b.destination(BUS_NAME))
            .and_then(|b| b.interface(interface.to_owned()))
            .map_err(|e| e.to_string())
    };
    let agent = "io.gpushare.Agent1";
    let built = match kind {
        "Introspect" => build("org.freedesktop.DBus.Introspectable", "Introspect")?.build(&()),
        "Ping" => build("org.freedesktop.DBus.Peer", "Ping")?.build(&()),
        "GetAll" => build("org.freedesktop.DBus.Properties", "GetAll")?.build(&(agent,)),
        "ShowProfile" => build(agent, "ShowProfile")?.build(&("all-mps",)),
        "Validate" => build(agent, "ValidateProfile")?.build(&(large_profile(), "flood.toml")),
        "Status" | "Export" | "CdiDevices" | "ListProfiles" | "Telemetry" | "Clients"
        | "MpsStatus" => build(agent, kind)?.build(&()),
        other => return Err(format!("no flood of {other}")),
    };
    built.map_err(|e| e.to_string())
}

async fn connect(address: &str) -> Result<Connection, String> {
    zbus::connection::Builder::address(address)
        .map_err(|e| e.to_string())?
        .build()
        .await
        .map_err(|e| e.to_string())
}

fn numbers(values: &[&String]) -> Result<Vec<u64>, String> {
    values.iter().map(|v| v.parse().map_err(|e| format!("{v}: {e}"))).collect()
}

/// Calls `kind` and waits for its answer.
async fn ask(connection: &Connection, kind: &str) -> zbus::Result<Message> {
    let agent = "io.gpushare.Agent1";
    let to = |interface: &'static str, member: &'static str| {
        (Some(BUS_NAME), OBJECT_PATH, Some(interface), member)
    };
    match kind {
        "Introspect" => {
            let (d, p, i, m) = to("org.freedesktop.DBus.Introspectable", "Introspect");
            connection.call_method(d, p, i, m, &()).await
        }
        "Ping" => {
            let (d, p, i, m) = to("org.freedesktop.DBus.Peer", "Ping");
            connection.call_method(d, p, i, m, &()).await
        }
        "GetAll" => {
            let (d, p, i, m) = to("org.freedesktop.DBus.Properties", "GetAll");
            connection.call_method(d, p, i, m, &(agent,)).await
        }
        "ShowProfile" => {
            connection
                .call_method(Some(BUS_NAME), OBJECT_PATH, Some(agent), kind, &("all-mps",))
                .await
        }
        "Validate" => {
            let body = (large_profile(), "flood.toml");
            connection
                .call_method(Some(BUS_NAME), OBJECT_PATH, Some(agent), "ValidateProfile", &body)
                .await
        }
        _ => connection.call_method(Some(BUS_NAME), OBJECT_PATH, Some(agent), kind, &()).await,
    }
}

/// Runs a flood verb; `None` when `verb` is none of them.
pub async fn run(address: &str, verb: &str, rest: &[String]) -> Option<Result<String, String>> {
    let [connections, calls, kind, seconds] = rest else {
        return match verb {
            "forget" | "unread" | "pipeline" => {
                Some(Err(format!("usage: {verb} CONNECTIONS CALLS KIND SECONDS")))
            }
            _ => None,
        };
    };
    let parsed = numbers(&[connections, calls, seconds]);
    let (connections, calls, seconds) = match parsed.as_deref() {
        Ok([c, n, s]) => (*c as usize, *n as usize, Duration::from_secs(*s)),
        _ => return Some(Err(parsed.err().unwrap_or_default())),
    };
    if let Err(e) = call(kind) {
        return Some(Err(e));
    }
    Some(match verb {
        "forget" => forget(address, connections, calls, kind, seconds).await,
        "unread" => unread(address, connections, calls, kind, seconds).await,
        "pipeline" => pipeline(address, connections, calls, kind, seconds).await,
        _ => return None,
    })
}

/// Sends `calls` calls of `kind` on `connection` without waiting for answers; how many
/// went out.
async fn send_calls(connection: &Connection, calls: usize, kind: &str) -> usize {
    let mut sent = 0;
    for _ in 0..calls {
        let Ok(m) = call(kind) else { break };
        if connection.send(&m).await.is_err() {
            break;
        }
        sent += 1;
    }
    sent
}

async fn forget(
    address: &str,
    connections: usize,
    calls: usize,
    kind: &str,
    seconds: Duration,
) -> Result<String, String> {
    let started = Instant::now();
    let (mut sent, mut opened) = (0usize, 0usize);
    while started.elapsed() < seconds {
        let rounds = (0..connections).map(|_| async {
            let Ok(connection) = connect(address).await else { return 0 };
            send_calls(&connection, calls, kind).await
        });
        let counts = futures_util::future::join_all(rounds).await;
        sent += counts.iter().sum::<usize>();
        opened += connections;
    }
    Ok(format!("sent {sent} calls on {opened} connections"))
}

async fn unread(
    address: &str,
    connections: usize,
    calls: usize,
    kind: &str,
    seconds: Duration,
) -> Result<String, String> {
    let mut open = Vec::new();
    let mut sent = 0usize;
    for _ in 0..connections {
        let connection = connect(address).await?;
        sent += send_calls(&connection, calls, kind).await;
        open.push(connection);
    }
    // Nothing reads the answers: this thread (the runtime's only one) sleeps.
    std::thread::sleep(seconds);
    drop(open);
    Ok(format!("sent {sent} calls"))
}

async fn pipeline(
    address: &str,
    connections: usize,
    depth: usize,
    kind: &str,
    seconds: Duration,
) -> Result<String, String> {
    let started = Instant::now();
    let mut open = Vec::new();
    for _ in 0..connections {
        open.push(connect(address).await?);
    }
    let lanes = open.iter().flat_map(|connection| {
        (0..depth).map(move |_| async move {
            let (mut answered, mut errors) = (0usize, Vec::new());
            while started.elapsed() < seconds {
                let reply = ask(connection, kind).await;
                answered += 1;
                if let Err(e) = reply {
                    errors.push(match e {
                        zbus::Error::MethodError(name, _, _) => name.to_string(),
                        other => other.to_string(),
                    });
                }
            }
            (answered, errors)
        })
    });
    let counts = futures_util::future::join_all(lanes).await;
    let answered: usize = counts.iter().map(|c| c.0).sum();
    let mut by_name = std::collections::BTreeMap::<String, usize>::new();
    for name in counts.into_iter().flat_map(|c| c.1) {
        *by_name.entry(name).or_default() += 1;
    }
    let failed: usize = by_name.values().sum();
    let names: Vec<String> = by_name.iter().map(|(n, k)| format!("{n} ×{k}")).collect();
    let took = started.elapsed().as_secs_f64();
    if names.is_empty() {
        return Ok(format!("answered {answered} calls (0 failed) in {took:.2} s"));
    }
    Ok(format!("answered {answered} calls ({failed} failed: {}) in {took:.2} s", names.join(", ")))
}
