//! What a caller may ask, as typed [`Call`]s: every method call the agent answers, on every
//! interface it serves (its own and the standard ones), is read here from the message,
//! synchronously and before anything waits, into one value. The interfaces themselves are
//! the tables [`AGENT1`] and [`JOB1`]: the parser checks a call's arguments against them
//! and the introspection data is rendered from them, so the two cannot disagree.
//!
//! Every argument is bounded here, before it is copied: a message whose arguments take
//! more bytes than its method can use is refused by its size alone, and each string by its
//! own limit (the messages of [`options::bounded`]).

use std::collections::HashMap;

use gpushare_proto::bench::{BENCH_MAX_COMMAND_BYTES, BENCH_MAX_ENVIRONMENT_BYTES};
use gpushare_proto::{
    AgentError, JOB_PATH_PREFIX, NAME_MAX_BYTES, OBJECT_PATH, ORIGIN_MAX_BYTES, PROFILE_MAX_BYTES,
};
use zbus::Message;
use zbus::message::Flags;
use zbus::zvariant::OwnedValue;

use super::errors::Failure;
use super::options::{self, ApplyOptions};
use crate::engine::{BenchOptions, ProbeOptions};

/// `io.gpushare.Agent1`.
pub const AGENT1: &str = "io.gpushare.Agent1";
/// `io.gpushare.Job1`.
pub const JOB1: &str = "io.gpushare.Job1";
const INTROSPECTABLE: &str = "org.freedesktop.DBus.Introspectable";
const PROPERTIES: &str = "org.freedesktop.DBus.Properties";
const PEER: &str = "org.freedesktop.DBus.Peer";

/// A method of one of the agent's interfaces: its name, its arguments (name and
/// signature), its reply's signature, and the most bytes its arguments may take.
#[derive(Debug)]
pub struct Method {
    pub name: &'static str,
    pub args: &'static [(&'static str, &'static str)],
    pub reply: &'static str,
    /// The most bytes the message body may have (what its strings may take, with room for
    /// their framing); a larger body is refused by its size before it is read.
    pub max_body: usize,
}

/// A signal of one of the agent's interfaces.
#[derive(Debug)]
pub struct Signal {
    pub name: &'static str,
    pub args: &'static [(&'static str, &'static str)],
}

/// A read-only property: its name, signature, and whether `PropertiesChanged` tells of its
/// changes (`false`: it never changes, introspected as `EmitsChangedSignal` `const`).
#[derive(Debug)]
pub struct Property {
    pub name: &'static str,
    pub signature: &'static str,
    pub changes: bool,
}

/// One interface: its methods, read-only properties and signals.
#[derive(Debug)]
pub struct Interface {
    pub name: &'static str,
    pub methods: &'static [Method],
    pub properties: &'static [Property],
    pub signals: &'static [Signal],
}

/// Room a body may take besides its strings (framing, small numbers).
const SMALL: usize = 1024;
/// An `a{sv}` of options of `Apply` and `Probe`: a few keys and small values. Options are
/// read into typed requests as the call is parsed (a variant of small numbers takes tens of
/// times its size once decoded: they are never kept decoded, and their size is bounded).
const OPTIONS: usize = 16 << 10;

const fn method(
    name: &'static str,
    args: &'static [(&'static str, &'static str)],
    reply: &'static str,
    max_body: usize,
) -> Method {
    Method { name, args, reply, max_body }
}

/// `io.gpushare.Agent1` at [`OBJECT_PATH`].
pub static AGENT1_INTERFACE: Interface = Interface {
    name: AGENT1,
    methods: &[
        method("Status", &[], "s", SMALL),
        method("Plan", &[("profile", "s")], "s", SMALL + NAME_MAX_BYTES),
        method(
            "PlanDocument",
            &[("text", "s"), ("origin", "s"), ("config", "s")],
            "s",
            SMALL + PROFILE_MAX_BYTES + ORIGIN_MAX_BYTES + NAME_MAX_BYTES,
        ),
        method("Apply", &[("profile", "s"), ("options", "a{sv}")], "o", OPTIONS + NAME_MAX_BYTES),
        method(
            "ApplyDocument",
            &[("text", "s"), ("origin", "s"), ("config", "s"), ("options", "a{sv}")],
            "o",
            OPTIONS + PROFILE_MAX_BYTES + ORIGIN_MAX_BYTES + NAME_MAX_BYTES,
        ),
        method("Export", &[], "s", SMALL),
        method("Probe", &[("options", "a{sv}")], "o", OPTIONS),
        method(
            "Bench",
            &[("command", "as"), ("options", "a{sv}")],
            "o",
            // The command and the environment (an option), each string with framing of
            // up to 8 bytes: 4096 of each at most.
            OPTIONS + BENCH_MAX_COMMAND_BYTES + BENCH_MAX_ENVIRONMENT_BYTES + (64 << 10),
        ),
        method("ResetGpu", &[("gpu", "u")], "o", SMALL),
        method("MpsStatus", &[], "s", SMALL),
        method("MpsLimit", &[("pid", "u"), ("threads", "u"), ("memory_bytes", "t")], "s", SMALL),
        method("Env", &[("target", "s")], "s", SMALL + NAME_MAX_BYTES),
        method("MigProfiles", &[("gpu", "s")], "s", SMALL + NAME_MAX_BYTES),
        method("CdiDevices", &[], "s", SMALL),
        method("Clients", &[], "s", SMALL),
        method("Telemetry", &[], "s", SMALL),
        method("ListProfiles", &[], "s", SMALL),
        method("ShowProfile", &[("name", "s")], "s", SMALL + NAME_MAX_BYTES),
        method(
            "ValidateProfile",
            &[("text", "s"), ("origin", "s")],
            "s",
            SMALL + PROFILE_MAX_BYTES + ORIGIN_MAX_BYTES,
        ),
    ],
    properties: &[Property { name: "Version", signature: "s", changes: false }],
    signals: &[],
};

/// `io.gpushare.Job1` at each job's path.
pub static JOB1_INTERFACE: Interface = Interface {
    name: JOB1,
    methods: &[method("Cancel", &[], "", SMALL), method("GetOutcome", &[], "s", SMALL)],
    properties: &[
        Property { name: "State", signature: "s", changes: true },
        Property { name: "Outcome", signature: "s", changes: true },
    ],
    signals: &[
        Signal { name: "Progress", args: &[("done", "u"), ("total", "u"), ("step", "s")] },
        Signal { name: "Finished", args: &[("outcome", "s")] },
    ],
};

/// What a caller asked.
#[derive(Debug)]
pub enum Call {
    /// `Agent1.Status`.
    Status,
    /// `Agent1.Plan`.
    Plan { profile: String },
    /// `Agent1.PlanDocument`.
    PlanDocument { text: String, origin: String, config: String },
    /// `Agent1.Apply`.
    Apply { profile: String, options: ApplyOptions },
    /// `Agent1.ApplyDocument`.
    ApplyDocument { text: String, origin: String, config: String, options: ApplyOptions },
    /// `Agent1.Export`.
    Export,
    /// `Agent1.Probe`.
    Probe { options: ProbeOptions },
    /// `Agent1.Bench`.
    Bench { options: Box<BenchOptions> },
    /// `Agent1.ResetGpu`.
    ResetGpu { gpu: u32 },
    /// `Agent1.MpsStatus`.
    MpsStatus,
    /// `Agent1.MpsLimit`.
    MpsLimit { pid: u32, threads: u32, memory_bytes: u64 },
    /// `Agent1.Env`.
    Env { target: String },
    /// `Agent1.MigProfiles`.
    MigProfiles { gpu: String },
    /// `Agent1.CdiDevices`.
    CdiDevices,
    /// `Agent1.Clients`.
    Clients,
    /// `Agent1.Telemetry`.
    Telemetry,
    /// `Agent1.ListProfiles`.
    ListProfiles,
    /// `Agent1.ShowProfile`.
    ShowProfile { name: String },
    /// `Agent1.ValidateProfile`.
    ValidateProfile { text: String, origin: String },
    /// `Job1.Cancel` of job number `job`.
    Cancel { job: u64 },
    /// `Job1.GetOutcome` of job number `job`.
    GetOutcome { job: u64 },
    /// `Introspectable.Introspect` of an object.
    Introspect { object: Object },
    /// `Properties.Get` of one property of an object's interface.
    Get { object: Object, interface: String, property: String },
    /// `Properties.GetAll` of an object's interface.
    GetAll { object: Object, interface: String },
    /// `Peer.Ping`.
    Ping,
    /// `Peer.GetMachineId`.
    GetMachineId,
}

impl Call {
    /// Whether the call may change the GPUs or start a job (needs the access policy's
    /// consent), rather than only read.
    pub fn changes(&self) -> bool {
        matches!(
            self,
            Call::Apply { .. }
                | Call::ApplyDocument { .. }
                | Call::Probe { .. }
                | Call::Bench { .. }
                | Call::MpsLimit { .. }
                | Call::ResetGpu { .. }
        )
    }

    /// Whether the call does anything besides answer: one sent without asking for an answer
    /// is carried out only then.
    pub fn acts(&self) -> bool {
        self.changes() || matches!(self, Call::Cancel { .. })
    }

    /// The method's name as the access policy's refusals quote it.
    pub fn method(&self) -> &'static str {
        match self {
            Call::Status => "Status",
            Call::Plan { .. } => "Plan",
            Call::PlanDocument { .. } => "PlanDocument",
            Call::Apply { .. } => "Apply",
            Call::ApplyDocument { .. } => "ApplyDocument",
            Call::Export => "Export",
            Call::Probe { .. } => "Probe",
            Call::Bench { .. } => "Bench",
            Call::ResetGpu { .. } => "ResetGpu",
            Call::MpsStatus => "MpsStatus",
            Call::MpsLimit { .. } => "MpsLimit",
            Call::Env { .. } => "Env",
            Call::MigProfiles { .. } => "MigProfiles",
            Call::CdiDevices => "CdiDevices",
            Call::Clients => "Clients",
            Call::Telemetry => "Telemetry",
            Call::ListProfiles => "ListProfiles",
            Call::ShowProfile { .. } => "ShowProfile",
            Call::ValidateProfile { .. } => "ValidateProfile",
            Call::Cancel { .. } => "Cancel",
            Call::GetOutcome { .. } => "GetOutcome",
            Call::Introspect { .. } => "Introspect",
            Call::Get { .. } => "Get",
            Call::GetAll { .. } => "GetAll",
            Call::Ping => "Ping",
            Call::GetMachineId => "GetMachineId",
        }
    }
}

/// The objects the agent serves: the tree down to its main object, the main object, the
/// folder of jobs and each job (by number; whether it still exists is the job table's
/// business).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Object {
    /// `/`, `/io`, `/io/gpushare`: nodes on the way to the main object; the number of
    /// path elements (0 for `/`).
    Above(usize),
    /// [`OBJECT_PATH`].
    Agent,
    /// `<OBJECT_PATH>/jobs`.
    Jobs,
    /// `<OBJECT_PATH>/jobs/<n>`.
    Job(u64),
}

impl Object {
    /// The object at `path`, if the agent serves one there.
    pub fn at(path: &str) -> Option<Object> {
        if path == OBJECT_PATH {
            return Some(Object::Agent);
        }
        if path == JOB_PATH_PREFIX {
            return Some(Object::Jobs);
        }
        if let Some(number) = path.strip_prefix(JOB_PATH_PREFIX).and_then(|r| r.strip_prefix('/')) {
            // Canonical numbers only: `/jobs/007` is no job.
            let job: u64 = number.parse().ok()?;
            return (job.to_string() == number).then_some(Object::Job(job));
        }
        let above: Vec<&str> = OBJECT_PATH.split('/').filter(|s| !s.is_empty()).collect();
        let here: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        (path.starts_with('/') && here.len() < above.len() && above.starts_with(&here))
            .then_some(Object::Above(here.len()))
    }
}

/// Reads the method call `msg` into a [`Call`], or says why it is not one the agent
/// answers (an unknown object, interface or method, arguments of the wrong types, an
/// argument over its bound). Synchronous: the caller has not been counted yet.
pub fn parse(msg: &Message) -> Result<Call, Failure> {
    let header = msg.header();
    let path = header.path().map(|p| p.as_str()).unwrap_or_default();
    let member = header.member().map(|m| m.as_str()).unwrap_or_default();
    let interface = header.interface().map(|i| i.as_str());
    let object = Object::at(path);
    // D-Bus: Peer answers on any path.
    if interface == Some(PEER) {
        return match member {
            "Ping" => no_arguments(msg).map(|()| Call::Ping),
            "GetMachineId" => no_arguments(msg).map(|()| Call::GetMachineId),
            _ => Err(unknown_method(PEER, member)),
        };
    }
    let Some(object) = object else {
        return Err(Failure::fdo(zbus::fdo::Error::UnknownObject(format!(
            "no object at {}",
            options::short(path)
        ))));
    };
    match interface {
        Some(INTROSPECTABLE) => match member {
            "Introspect" => no_arguments(msg).map(|()| Call::Introspect { object }),
            _ => Err(unknown_method(INTROSPECTABLE, member)),
        },
        Some(PROPERTIES) => properties(msg, object, member),
        Some(AGENT1) if object == Object::Agent => agent(msg, member),
        Some(JOB1) => match object {
            Object::Job(job) => job_call(msg, member, job),
            _ => Err(unknown_interface(JOB1, path)),
        },
        // No interface named: the method is looked up on the object's own interface.
        None => match object {
            Object::Agent => agent(msg, member),
            Object::Job(job) => job_call(msg, member, job),
            _ => Err(unknown_method("", member)),
        },
        Some(other) => Err(unknown_interface(other, path)),
    }
}

/// Whether the caller asked for no reply: a read-only call then has nothing to do.
pub fn no_reply_expected(msg: &Message) -> bool {
    msg.primary_header().flags().contains(Flags::NoReplyExpected)
}

fn unknown_method(interface: &str, member: &str) -> Failure {
    Failure::fdo(zbus::fdo::Error::UnknownMethod(format!(
        "no method {} on {interface}",
        options::short(member)
    )))
}

fn unknown_interface(interface: &str, path: &str) -> Failure {
    Failure::fdo(zbus::fdo::Error::UnknownInterface(format!(
        "no interface {} at {}",
        options::short(interface),
        options::short(path)
    )))
}

fn invalid_args(why: impl std::fmt::Display) -> Failure {
    Failure::fdo(zbus::fdo::Error::InvalidArgs(why.to_string()))
}

/// Checks that `msg` carries the arguments `method` takes, and no more bytes than it may.
fn check(msg: &Message, interface: &str, method: &Method) -> Result<(), Failure> {
    let body = msg.body();
    let expected: String = method.args.iter().map(|(_, sig)| *sig).collect();
    let signature = body.signature().to_string_no_parens();
    if signature != expected {
        return Err(invalid_args(format!(
            "{interface}.{} takes ({expected}), not ({})",
            method.name,
            options::short(&signature)
        )));
    }
    if body.len() > method.max_body {
        return Err(Failure::agent(AgentError::Failed(format!(
            "{}: {} bytes of arguments; at most {}",
            method.name,
            body.len(),
            method.max_body
        ))));
    }
    Ok(())
}

fn no_arguments(msg: &Message) -> Result<(), Failure> {
    let body = msg.body();
    if body.signature().to_string_no_parens().is_empty() {
        Ok(())
    } else {
        Err(invalid_args("the method takes no arguments"))
    }
}

fn deserialized<'b, T>(body: &'b zbus::message::Body) -> Result<T, Failure>
where
    T: zbus::zvariant::DynamicDeserialize<'b>,
{
    body.deserialize::<T>().map_err(invalid_args)
}

/// `text`, `origin` and `config` of a document call, each bounded before it is copied.
/// The names are shown to every user (`status` names where the active profile came from)
/// and quoted in messages: control and invisible characters become `?` here, as they
/// enter ([`crate::sys::text`]).
fn document(text: &str, origin: &str, config: &str) -> Result<(String, String, String), Failure> {
    let origin = options::bounded("origin", origin, ORIGIN_MAX_BYTES)?;
    crate::profile::check_size(text, origin).map_err(crate::engine::EngineError::from)?;
    let config = options::bounded("config", config, NAME_MAX_BYTES)?;
    Ok((text.to_owned(), shown(origin), shown(config)))
}

/// A name a caller gave, as it may be shown to anyone.
fn shown(name: &str) -> String {
    crate::sys::text::printable(name, usize::MAX)
}

fn agent(msg: &Message, member: &str) -> Result<Call, Failure> {
    let method = AGENT1_INTERFACE
        .methods
        .iter()
        .find(|m| m.name == member)
        .ok_or_else(|| unknown_method(AGENT1, member))?;
    check(msg, AGENT1, method)?;
    let body = msg.body();
    let name = |what: &str, value: &str| -> Result<String, Failure> {
        Ok(options::bounded(what, value, NAME_MAX_BYTES)?.to_owned())
    };
    Ok(match member {
        "Status" => Call::Status,
        "Export" => Call::Export,
        "MpsStatus" => Call::MpsStatus,
        "CdiDevices" => Call::CdiDevices,
        "Clients" => Call::Clients,
        "Telemetry" => Call::Telemetry,
        "ListProfiles" => Call::ListProfiles,
        "Plan" => {
            let (profile,): (&str,) = deserialized(&body)?;
            Call::Plan { profile: name("profile name", profile)? }
        }
        "PlanDocument" => {
            let (text, origin, config): (&str, &str, &str) = deserialized(&body)?;
            let (text, origin, config) = document(text, origin, config)?;
            Call::PlanDocument { text, origin, config }
        }
        "Apply" => {
            let (profile, options): (&str, HashMap<String, OwnedValue>) = deserialized(&body)?;
            let profile = name("profile name", profile)?;
            Call::Apply { profile, options: options::apply_options(&options)? }
        }
        "ApplyDocument" => {
            let (text, origin, config, options): (&str, &str, &str, HashMap<String, OwnedValue>) =
                deserialized(&body)?;
            let options = options::apply_options(&options)?;
            let (text, origin, config) = document(text, origin, config)?;
            Call::ApplyDocument { text, origin, config, options }
        }
        "Probe" => {
            let (options,): (HashMap<String, OwnedValue>,) = deserialized(&body)?;
            Call::Probe { options: options::probe_options(&options)? }
        }
        "Bench" => {
            let (command, options): (Vec<String>, HashMap<String, OwnedValue>) =
                deserialized(&body)?;
            Call::Bench { options: Box::new(options::bench_options(command, &options)?) }
        }
        "ResetGpu" => {
            let (gpu,): (u32,) = deserialized(&body)?;
            Call::ResetGpu { gpu }
        }
        "MpsLimit" => {
            let (pid, threads, memory_bytes): (u32, u32, u64) = deserialized(&body)?;
            Call::MpsLimit { pid, threads, memory_bytes }
        }
        "Env" => {
            let (target,): (&str,) = deserialized(&body)?;
            Call::Env { target: name("target", target)? }
        }
        "MigProfiles" => {
            let (gpu,): (&str,) = deserialized(&body)?;
            Call::MigProfiles { gpu: name("GPU", gpu)? }
        }
        "ShowProfile" => {
            let (profile,): (&str,) = deserialized(&body)?;
            Call::ShowProfile { name: name("profile name", profile)? }
        }
        "ValidateProfile" => {
            let (text, origin): (&str, &str) = deserialized(&body)?;
            let origin = options::bounded("origin", origin, ORIGIN_MAX_BYTES)?;
            crate::profile::check_size(text, origin).map_err(crate::engine::EngineError::from)?;
            Call::ValidateProfile { text: text.to_owned(), origin: shown(origin) }
        }
        // Every method of the table is read above (a test calls each).
        _ => return Err(unknown_method(AGENT1, member)),
    })
}

fn job_call(msg: &Message, member: &str, job: u64) -> Result<Call, Failure> {
    let method = JOB1_INTERFACE
        .methods
        .iter()
        .find(|m| m.name == member)
        .ok_or_else(|| unknown_method(JOB1, member))?;
    check(msg, JOB1, method)?;
    Ok(match member {
        "Cancel" => Call::Cancel { job },
        _ => Call::GetOutcome { job },
    })
}

fn properties(msg: &Message, object: Object, member: &str) -> Result<Call, Failure> {
    let body = msg.body();
    let bounded = |what: &str, value: &str| -> Result<String, Failure> {
        Ok(options::bounded(what, value, NAME_MAX_BYTES)?.to_owned())
    };
    match member {
        "Get" => {
            let (interface, property): (&str, &str) = deserialized(&body)?;
            Ok(Call::Get {
                object,
                interface: bounded("interface", interface)?,
                property: bounded("property", property)?,
            })
        }
        "GetAll" => {
            let (interface,): (&str,) = deserialized(&body)?;
            Ok(Call::GetAll { object, interface: bounded("interface", interface)? })
        }
        "Set" => Err(Failure::fdo(zbus::fdo::Error::PropertyReadOnly(
            "the agent's properties are read-only".into(),
        ))),
        _ => Err(unknown_method(PROPERTIES, member)),
    }
}

/// The well-known name calls are sent to (for the tests' messages).
#[cfg(test)]
const DESTINATION: &str = gpushare_proto::BUS_NAME;

#[cfg(test)]
mod tests {
    use super::*;
    use zbus::zvariant::{Str, Value};

    fn call(path: &str, interface: Option<&str>, member: &str) -> zbus::message::Builder<'static> {
        let mut b = Message::method_call(path.to_owned(), member.to_owned())
            .unwrap()
            .destination(DESTINATION)
            .unwrap();
        if let Some(i) = interface {
            b = b.interface(i.to_owned()).unwrap();
        }
        b
    }

    /// A body of `signature` with small values of each type.
    fn sample(signature: &str) -> Message {
        let b = call(OBJECT_PATH, Some(AGENT1), "X");
        let options: HashMap<&str, Value<'_>> = HashMap::new();
        match signature {
            "" => b.build(&()).unwrap(),
            "s" => b.build(&("a",)).unwrap(),
            "ss" => b.build(&("a", "b.toml")).unwrap(),
            "sss" => b.build(&("a", "b.toml", "")).unwrap(),
            "sa{sv}" => b.build(&("a", options)).unwrap(),
            "sssa{sv}" => b.build(&("a", "b.toml", "", options)).unwrap(),
            "a{sv}" => b.build(&(options,)).unwrap(),
            "asa{sv}" => {
                let bench = HashMap::from([("cwd", Value::from("/tmp"))]);
                b.build(&(vec!["true"], bench)).unwrap()
            }
            "uut" => b.build(&(1u32, 2u32, 3u64)).unwrap(),
            "u" => b.build(&(1u32,)).unwrap(),
            other => panic!("no sample of {other}"),
        }
    }

    #[test]
    fn every_method_of_the_tables_is_read() {
        for m in AGENT1_INTERFACE.methods {
            let signature: String = m.args.iter().map(|(_, s)| *s).collect();
            let msg = sample(&signature);
            let parsed = agent(&msg, m.name);
            assert!(parsed.is_ok(), "{}: {parsed:?}", m.name);
            assert_eq!(parsed.unwrap().method(), m.name);
        }
        for m in JOB1_INTERFACE.methods {
            let msg = call(&format!("{JOB_PATH_PREFIX}/3"), Some(JOB1), m.name).build(&()).unwrap();
            let parsed = parse(&msg).unwrap();
            assert_eq!(parsed.method(), m.name);
        }
    }

    #[test]
    fn wrong_arguments_and_unknown_names_are_refused() {
        let wrong = call(OBJECT_PATH, Some(AGENT1), "Plan").build(&(1u32,)).unwrap();
        assert!(parse(&wrong).unwrap_err().name().contains("InvalidArgs"));
        let unknown = call(OBJECT_PATH, Some(AGENT1), "Nope").build(&()).unwrap();
        assert!(parse(&unknown).unwrap_err().name().contains("UnknownMethod"));
        let elsewhere = call("/io/gpushare/Other", Some(AGENT1), "Status").build(&()).unwrap();
        assert!(parse(&elsewhere).unwrap_err().name().contains("UnknownObject"));
        let job_on_agent = call(OBJECT_PATH, Some(JOB1), "Cancel").build(&()).unwrap();
        assert!(parse(&job_on_agent).unwrap_err().name().contains("UnknownInterface"));
        let set = call(OBJECT_PATH, Some(PROPERTIES), "Set")
            .build(&(AGENT1, "Version", Value::from(Str::from("x"))))
            .unwrap();
        assert!(parse(&set).unwrap_err().name().contains("PropertyReadOnly"));
    }

    #[test]
    fn arguments_are_bounded_before_they_are_copied() {
        let long = "x".repeat(NAME_MAX_BYTES + 1);
        let plan = call(OBJECT_PATH, Some(AGENT1), "Plan").build(&(long.as_str(),)).unwrap();
        let e = parse(&plan).unwrap_err();
        assert!(e.message().contains("at most 256"), "{}", e.message());
        // A body larger than the method can use: refused by its size.
        let huge = "x".repeat(PROFILE_MAX_BYTES * 2);
        let doc = call(OBJECT_PATH, Some(AGENT1), "ValidateProfile")
            .build(&(huge.as_str(), "o"))
            .unwrap();
        let e = parse(&doc).unwrap_err();
        assert!(e.message().contains("bytes of arguments"), "{}", e.message());
        assert!(e.message().len() < 200);
        // Options are small: a variant of 60 KiB of bytes (tens of times that once decoded)
        // is refused by its size before it is read.
        let bytes = vec![0u8; 60 << 10];
        let options = HashMap::from([("force", Value::from(bytes))]);
        let apply = call(OBJECT_PATH, Some(AGENT1), "Apply").build(&("all-mps", options)).unwrap();
        let e = parse(&apply).unwrap_err();
        assert!(e.message().contains("bytes of arguments"), "{}", e.message());
        // Read into typed requests: a wrong option is refused naming it.
        let options = HashMap::from([("forse", Value::from(true))]);
        let apply = call(OBJECT_PATH, Some(AGENT1), "Apply").build(&("all-mps", options)).unwrap();
        assert!(parse(&apply).unwrap_err().message().contains("forse"));
    }

    #[test]
    fn a_cancel_nobody_waits_for_still_acts() {
        let cancel =
            call(&format!("{JOB_PATH_PREFIX}/3"), Some(JOB1), "Cancel").build(&()).unwrap();
        assert!(parse(&cancel).unwrap().acts());
        let status = call(OBJECT_PATH, Some(AGENT1), "Status").build(&()).unwrap();
        assert!(!parse(&status).unwrap().acts());
    }

    #[test]
    fn names_callers_give_reach_no_one_with_escapes() {
        let text = "[[gpu]]\nselect = 0\n";
        let msg = call(OBJECT_PATH, Some(AGENT1), "PlanDocument")
            .build(&(text, "\x1b]0;owned\x07\nroot$ x.toml", "c\u{202E}fig"))
            .unwrap();
        match parse(&msg).unwrap() {
            Call::PlanDocument { origin, config, .. } => {
                assert_eq!(origin, "?]0;owned??root$ x.toml");
                assert_eq!(config, "c?fig");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn standard_interfaces_on_the_agents_objects() {
        for path in ["/", "/io", "/io/gpushare", OBJECT_PATH, JOB_PATH_PREFIX] {
            let msg = call(path, Some(INTROSPECTABLE), "Introspect").build(&()).unwrap();
            assert!(matches!(parse(&msg).unwrap(), Call::Introspect { .. }), "{path}");
        }
        let ping = call("/anywhere/at/all", Some(PEER), "Ping").build(&()).unwrap();
        assert!(matches!(parse(&ping).unwrap(), Call::Ping));
        let get = call(&format!("{JOB_PATH_PREFIX}/12"), Some(PROPERTIES), "Get")
            .build(&(JOB1, "State"))
            .unwrap();
        match parse(&get).unwrap() {
            Call::Get { object: Object::Job(12), interface, property } => {
                assert_eq!((interface.as_str(), property.as_str()), (JOB1, "State"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(Object::at(&format!("{JOB_PATH_PREFIX}/012")), None);
        assert_eq!(Object::at("/io/gpushare/Agent1/jobs/1/x"), None);
        assert_eq!(Object::at("/io/other"), None);
    }
}
