//! Errors of `gpushare-ctl`: every failure is one name and one line.
//!
//! The name is the D-Bus error name when the agent sent one (`io.gpushare.Agent1.Error.*`)
//! and `gpushare.Ctl.Error.<Kind>` when ctl diagnosed the problem itself (the agent is not
//! running, the bus is unreachable, a file cannot be read). People see only the message
//! (`gpushare-ctl: <message>` on stderr); `--json` prints both.

use gpushare_proto::AgentError;

/// Prefix of the error names ctl gives the failures it diagnoses itself.
pub const CTL_ERROR_PREFIX: &str = "gpushare.Ctl.Error";

/// D-Bus error: the destination name has no owner (and is not activatable).
pub const DBUS_SERVICE_UNKNOWN: &str = "org.freedesktop.DBus.Error.ServiceUnknown";
/// D-Bus error: the name has no owner.
pub const DBUS_NAME_HAS_NO_OWNER: &str = "org.freedesktop.DBus.Error.NameHasNoOwner";
/// D-Bus error: the object has no such method.
pub const DBUS_UNKNOWN_METHOD: &str = "org.freedesktop.DBus.Error.UnknownMethod";
/// D-Bus error: the object has no such interface.
pub const DBUS_UNKNOWN_INTERFACE: &str = "org.freedesktop.DBus.Error.UnknownInterface";
/// D-Bus error: the bus policy refused the message.
pub const DBUS_ACCESS_DENIED: &str = "org.freedesktop.DBus.Error.AccessDenied";
/// D-Bus error: no reply came (the callee left the bus, or a timeout).
pub const DBUS_NO_REPLY: &str = "org.freedesktop.DBus.Error.NoReply";
/// Prefix of the D-Bus errors of a failed service activation.
pub const DBUS_SPAWN_PREFIX: &str = "org.freedesktop.DBus.Error.Spawn.";

/// The kinds of failure ctl names itself (`gpushare.Ctl.Error.<Kind>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Nobody owns `io.gpushare.Agent1` on the bus (or buses) tried.
    NotRunning,
    /// The bus could not be reached at all.
    BusUnreachable,
    /// `--address` is not a valid D-Bus address.
    InvalidAddress,
    /// The bus is another user's and lets in only that user.
    AccessDenied,
    /// The agent does not know a method ctl called: it is older than ctl.
    AgentOutdated,
    /// The agent left the bus while a job ctl follows was running.
    AgentExited,
    /// The connection to the bus broke.
    ConnectionLost,
    /// The agent answered with a document ctl cannot read.
    BadReply,
    /// A file named on the command line cannot be read.
    ReadFile,
    /// A file named on the command line cannot be written (`bench --report`).
    WriteFile,
    /// The program a command line names is not there or not executable (`bench`).
    CommandNotFound,
    /// Ctl was interrupted (Ctrl-C) while following a job.
    Interrupted,
    /// The command line is malformed.
    Usage,
    /// `assert`: the profile is not applied.
    NotApplied,
    /// A job failed without naming an error.
    Failed,
    /// `export --format device-plugin`: NVIDIA's device plugin cannot express the GPUs as
    /// they are.
    Inexpressible,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::NotRunning => "NotRunning",
            Kind::BusUnreachable => "BusUnreachable",
            Kind::InvalidAddress => "InvalidAddress",
            Kind::AccessDenied => "AccessDenied",
            Kind::AgentOutdated => "AgentOutdated",
            Kind::AgentExited => "AgentExited",
            Kind::ConnectionLost => "ConnectionLost",
            Kind::BadReply => "BadReply",
            Kind::ReadFile => "ReadFile",
            Kind::WriteFile => "WriteFile",
            Kind::CommandNotFound => "CommandNotFound",
            Kind::Interrupted => "Interrupted",
            Kind::Usage => "Usage",
            Kind::NotApplied => "NotApplied",
            Kind::Failed => "Failed",
            Kind::Inexpressible => "Inexpressible",
        }
    }

    /// The full error name, `gpushare.Ctl.Error.<Kind>`.
    pub fn name(self) -> String {
        format!("{CTL_ERROR_PREFIX}.{}", self.as_str())
    }
}

/// A failure: a stable name, a one-line message and the exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtlError {
    /// D-Bus error name or `gpushare.Ctl.Error.<Kind>`.
    pub name: String,
    /// One line for people.
    pub message: String,
    /// Process exit status (1 unless said otherwise).
    pub exit_code: u8,
}

impl CtlError {
    /// An error with the given name; the message is folded onto one line.
    pub fn new(name: impl Into<String>, message: impl AsRef<str>) -> Self {
        Self { name: name.into(), message: one_line(message.as_ref()), exit_code: 1 }
    }

    /// An error ctl diagnosed itself.
    pub fn ctl(kind: Kind, message: impl AsRef<str>) -> Self {
        Self::new(kind.name(), message)
    }

    /// The same error with another exit status.
    pub fn with_exit_code(mut self, code: u8) -> Self {
        self.exit_code = code;
        self
    }

    /// Whether this is ctl's own error of `kind`.
    #[cfg(test)]
    pub fn is(&self, kind: Kind) -> bool {
        self.name == kind.name()
    }

    /// The `--json` form: `{"error": {"name": ..., "message": ...}}`, in that order.
    pub fn to_json(&self) -> String {
        #[derive(serde::Serialize)]
        struct Document<'a> {
            error: Inner<'a>,
        }
        #[derive(serde::Serialize)]
        struct Inner<'a> {
            name: &'a str,
            message: &'a str,
        }
        let doc = Document { error: Inner { name: &self.name, message: &self.message } };
        serde_json::to_string(&doc).unwrap_or_default()
    }
}

impl std::fmt::Display for CtlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CtlError {}

/// Folds a message onto one line: lines trimmed and joined with a space.
pub fn one_line(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for line in message.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(line);
    }
    out
}

/// The D-Bus error name and message inside a zbus error, when it is a D-Bus error reply.
pub fn dbus_error(e: &zbus::Error) -> Option<(String, Option<String>)> {
    match e {
        zbus::Error::MethodError(name, desc, _) => Some((name.to_string(), desc.clone())),
        zbus::Error::FDO(fdo) => {
            let fdo: &zbus::fdo::Error = fdo;
            if let zbus::fdo::Error::ZBus(inner) = fdo {
                return dbus_error(inner);
            }
            Some((
                zbus::DBusError::name(fdo).to_string(),
                zbus::DBusError::description(fdo).map(str::to_owned),
            ))
        }
        _ => None,
    }
}

/// The D-Bus error name of an agent error (`io.gpushare.Agent1.Error.Busy`,
/// `org.freedesktop.DBus.Error.ServiceUnknown`, ...), when it is a D-Bus error reply.
pub fn agent_error_name(e: &AgentError) -> Option<String> {
    match e {
        AgentError::ZBus(z) => dbus_error(z).map(|(name, _)| name),
        other => Some(zbus::DBusError::name(other).to_string()),
    }
}

/// Whether the call failed because nobody owns the agent's name on that bus.
pub fn is_no_owner(e: &AgentError) -> bool {
    matches!(agent_error_name(e).as_deref(), Some(DBUS_SERVICE_UNKNOWN | DBUS_NAME_HAS_NO_OWNER))
}

/// Whether the call failed because the agent lacks the method (it is older than ctl).
pub fn is_unknown_method(e: &AgentError) -> bool {
    matches!(agent_error_name(e).as_deref(), Some(DBUS_UNKNOWN_METHOD | DBUS_UNKNOWN_INTERFACE))
}

/// Maps an error of calling `method` on the agent on `bus` (`"system bus"`) to a
/// [`CtlError`]. The agent's own errors keep their name and message as they are; transport
/// errors become one line that says what to do. (Unknown methods need the agent's version
/// and are handled by the caller before this.)
pub fn from_agent_error(e: AgentError, method: &str, bus: &str) -> CtlError {
    match e {
        AgentError::ZBus(z) => from_zbus_error(z, method, bus),
        other => {
            let name = zbus::DBusError::name(&other).to_string();
            let message = zbus::DBusError::description(&other)
                .map(str::to_owned)
                .unwrap_or_else(|| format!("{method} failed ({name})"));
            CtlError::new(name, message)
        }
    }
}

/// Maps a transport-level zbus error of a call to `method` on `bus`.
pub fn from_zbus_error(e: zbus::Error, method: &str, bus: &str) -> CtlError {
    if let Some((name, desc)) = dbus_error(&e) {
        let desc = desc.unwrap_or_default();
        return match name.as_str() {
            DBUS_SERVICE_UNKNOWN | DBUS_NAME_HAS_NO_OWNER => CtlError::ctl(
                Kind::NotRunning,
                format!(
                    "gpushare-agent is not running on the {bus} ({} has no owner)",
                    gpushare_proto::BUS_NAME
                ),
            ),
            DBUS_ACCESS_DENIED => CtlError::new(
                name,
                format!(
                    "the D-Bus policy of the {bus} does not let you call {method}: it needs root or membership in the `gpushare` group"
                ),
            ),
            DBUS_NO_REPLY => {
                CtlError::new(name, format!("gpushare-agent did not reply to {method}: {desc}"))
            }
            n if n.starts_with(DBUS_SPAWN_PREFIX) => {
                CtlError::new(name.clone(), format!("D-Bus could not start gpushare-agent: {desc}"))
            }
            _ if desc.is_empty() => CtlError::new(name.clone(), format!("{method} failed: {name}")),
            _ => CtlError::new(name, desc),
        };
    }
    match e {
        zbus::Error::InputOutput(io) => CtlError::ctl(
            Kind::ConnectionLost,
            format!("lost the connection to the {bus} during {method}: {io}"),
        ),
        other => CtlError::ctl(
            Kind::ConnectionLost,
            format!("D-Bus error during {method} on the {bus}: {other}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn method_error(name: &str, desc: &str) -> zbus::Error {
        let msg = zbus::Message::method_call("/", "Ping").unwrap().build(&()).unwrap();
        zbus::Error::MethodError(
            zbus::names::ErrorName::try_from(name).unwrap().into(),
            Some(desc.to_owned()),
            msg,
        )
    }

    #[test]
    fn agent_errors_keep_name_and_message() {
        let e = AgentError::UnknownProfile("no profile `x`; known: all-mps, half-balanced".into());
        let c = from_agent_error(e, "Plan", "system bus");
        assert_eq!(c.name, "io.gpushare.Agent1.Error.UnknownProfile");
        assert_eq!(c.message, "no profile `x`; known: all-mps, half-balanced");
        assert_eq!(c.exit_code, 1);
        let c = from_agent_error(AgentError::Busy("job 3 applies all-mps".into()), "Apply", "x");
        assert_eq!(c.name, "io.gpushare.Agent1.Error.Busy");
    }

    #[test]
    fn agent_errors_arriving_as_method_errors_map_to_variants() {
        // What a proxy call returns when the agent replies with one of its errors.
        let e: AgentError = method_error("io.gpushare.Agent1.Error.Infeasible", "GPU 2: no").into();
        assert!(matches!(e, AgentError::Infeasible(ref m) if m == "GPU 2: no"));
        let c = from_agent_error(e, "Plan", "system bus");
        assert_eq!(c.name, "io.gpushare.Agent1.Error.Infeasible");
        assert_eq!(c.message, "GPU 2: no");
    }

    #[test]
    fn no_owner_is_recognised() {
        let e: AgentError =
            method_error(DBUS_SERVICE_UNKNOWN, "The name is not activatable").into();
        assert!(is_no_owner(&e));
        assert!(!is_unknown_method(&e));
        let c = from_agent_error(e, "Status", "system bus");
        assert!(c.is(Kind::NotRunning));
        assert!(c.message.contains("not running on the system bus"), "{}", c.message);
        let fdo = AgentError::ZBus(zbus::Error::FDO(Box::new(zbus::fdo::Error::NameHasNoOwner(
            "x".into(),
        ))));
        assert!(is_no_owner(&fdo));
    }

    #[test]
    fn unknown_method_is_recognised() {
        let e: AgentError = method_error(DBUS_UNKNOWN_METHOD, "No such method 'Probe'").into();
        assert!(is_unknown_method(&e));
        assert!(!is_no_owner(&e));
    }

    #[test]
    fn bus_policy_denial_is_one_line() {
        let e: AgentError = method_error(
            DBUS_ACCESS_DENIED,
            "Rejected send message, 2 matched rules;\n type=\"method_call\", sender=\":1.4\"",
        )
        .into();
        let c = from_agent_error(e, "Apply", "system bus");
        assert_eq!(c.name, DBUS_ACCESS_DENIED);
        assert!(!c.message.contains('\n'));
        assert!(c.message.contains("gpushare` group"), "{}", c.message);
    }

    #[test]
    fn io_errors_say_connection_lost() {
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "broken pipe");
        let c = from_agent_error(
            AgentError::ZBus(zbus::Error::InputOutput(io.into())),
            "Status",
            "session bus",
        );
        assert!(c.is(Kind::ConnectionLost));
        assert_eq!(c.message, "lost the connection to the session bus during Status: broken pipe");
    }

    #[test]
    fn messages_are_folded_onto_one_line() {
        assert_eq!(one_line("a\n  b\n\nc  "), "a b c");
        assert_eq!(CtlError::new("n", "x\ny").message, "x y");
    }

    #[test]
    fn json_error_shape() {
        let e = CtlError::ctl(Kind::ReadFile, "cannot read p.toml: No such file");
        assert_eq!(
            e.to_json(),
            r#"{"error":{"name":"gpushare.Ctl.Error.ReadFile","message":"cannot read p.toml: No such file"}}"#
        );
        let e = CtlError::new("x", "quote \" and\nnewline");
        assert_eq!(e.to_json(), r#"{"error":{"name":"x","message":"quote \" and newline"}}"#);
    }
}
