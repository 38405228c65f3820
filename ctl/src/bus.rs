//! Finding the agent: which bus, one connection, and turning call failures into one line.
//!
//! The happy path is one connection and one method call: no name-owner lookup, no
//! `Version` read, no property cache. Only when a call fails does ctl look further: when
//! nobody owns `io.gpushare.Agent1` on the system bus (or the system bus is unreachable)
//! and `DBUS_SESSION_BUS_ADDRESS` is set, the same call is retried on the session bus,
//! where a newcomer's agent runs without root; when the agent does not know a method, its
//! `Version` is read to say which agent is too old. When nobody owns the name but an agent
//! for this bus began moments ago, ctl waits for it to take the name ([`starting`]). On
//! the system bus the agent is
//! activatable: a call that has no answer after a quarter of a second asks systemd whether the
//! unit can start at all, and once two looks agree says why not, rather than after the
//! bus's 25 s activation timeout ([`unit_cannot_start`]).

use gpushare_proto::{AgentError, AgentProxy, BUS_ADDRESS_ENV, BUS_NAME};
use zbus::Connection;
use zbus::proxy::CacheProperties;

/// How long one D-Bus call may take (the agent answers in milliseconds; libdbus
/// clients give up after 25 s).
const METHOD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(25);

use crate::error::{self, CtlError, Kind};
use crate::starting;

/// What `--address` (or `GPUSHARE_BUS_ADDRESS`) asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BusChoice {
    /// Nothing given: the system bus, then the session bus if the agent is not there.
    Auto,
    /// `system`.
    System,
    /// `session`.
    Session,
    /// A D-Bus address (`unix:path=/tmp/bus`).
    Address(String),
}

impl BusChoice {
    /// Reads the `--address` value.
    pub fn parse(address: Option<&str>) -> Self {
        match address.map(str::trim) {
            None | Some("") => BusChoice::Auto,
            Some("system") => BusChoice::System,
            Some("session") => BusChoice::Session,
            Some(other) => BusChoice::Address(other.to_owned()),
        }
    }
}

/// One bus ctl connects to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bus {
    /// The system bus (`DBUS_SYSTEM_BUS_ADDRESS` or the standard socket).
    System,
    /// The session bus (`DBUS_SESSION_BUS_ADDRESS`).
    Session,
    /// An explicit address.
    Address(String),
}

impl Bus {
    /// How messages name it: `system bus`, `session bus`, `bus at unix:path=/x`.
    pub fn describe(&self) -> String {
        match self {
            Bus::System => "system bus".into(),
            Bus::Session => "session bus".into(),
            Bus::Address(a) => format!("bus at {a}"),
        }
    }

    /// How to start an agent on this bus.
    pub fn start_hint(&self) -> String {
        match self {
            Bus::System => "`systemctl start gpushare-agent`".into(),
            Bus::Session => "`gpushare-agent --bus session`".into(),
            Bus::Address(a) => format!("`gpushare-agent --bus {a}`"),
        }
    }

    async fn connect(&self) -> Result<Connection, ConnectError> {
        let builder = match self {
            Bus::System => zbus::connection::Builder::system(),
            Bus::Session => zbus::connection::Builder::session(),
            Bus::Address(a) => Ok(zbus::connection::Builder::address(a.as_str())
                .map_err(|e| ConnectError::InvalidAddress(a.clone(), address_error(&e)))?),
        };
        let builder = match builder {
            Ok(builder) => builder,
            Err(e) => return Err(self.unreachable(&e)),
        };
        // A wedged agent must not hang a bootstrap script: every call answers or fails.
        // Long operations return a job at once, so no method needs longer.
        let result = builder.method_timeout(METHOD_TIMEOUT).build().await;
        result.map_err(|e| match (self, &e) {
            (Bus::Address(a), zbus::Error::Address(_)) => {
                ConnectError::InvalidAddress(a.clone(), address_error(&e))
            }
            _ => self.unreachable(&e),
        })
    }

    /// Why connecting failed: another user's bus that let us in no further than its
    /// socket, or the bus is not there.
    fn unreachable(&self, e: &zbus::Error) -> ConnectError {
        // The system bus is everyone's; a socket nobody listens on is no one's.
        let io_kind = match e {
            zbus::Error::InputOutput(io) => Some(io.kind()),
            zbus::Error::Connection(io, _) => Some(io.kind()),
            _ => None,
        };
        let no_listener = matches!(
            io_kind,
            Some(std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound)
        );
        let owner = match self {
            Bus::System => None,
            _ if no_listener => None,
            _ => self.socket_path().and_then(|path| foreign_socket(&path)),
        };
        match owner {
            Some(owner) => ConnectError::Foreign(self.clone(), owner),
            None => ConnectError::Unreachable(self.clone(), connect_error(e)),
        }
    }

    /// The socket file of this bus, when its address names one (`unix:path=`).
    fn socket_path(&self) -> Option<std::path::PathBuf> {
        let address = match self {
            Bus::System => std::env::var("DBUS_SYSTEM_BUS_ADDRESS")
                .unwrap_or_else(|_| gpushare_proto::SYSTEM_BUS_DEFAULT.into()),
            Bus::Session => std::env::var("DBUS_SESSION_BUS_ADDRESS").ok()?,
            Bus::Address(a) => a.clone(),
        };
        socket_path_of(&address)
    }
}

/// The first `unix:path=` of a D-Bus address, its escapes undone.
fn socket_path_of(address: &str) -> Option<std::path::PathBuf> {
    gpushare_proto::unix_socket_paths(address).into_iter().next()
}

/// The user who owns the socket at `path` (or, where this user may not look into its
/// directory, the directory), when that is not this process's user.
fn foreign_socket(path: &std::path::Path) -> Option<Owner> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let owner = match std::fs::metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => meta.uid(),
        Ok(_) => return None,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            std::fs::metadata(path.parent()?).ok()?.uid()
        }
        Err(_) => return None,
    };
    let me = own_uid()?;
    (owner != me).then_some(Owner { bus: owner, me })
}

/// Whose bus it is, and who we are.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Owner {
    /// The uid that owns the bus's socket.
    bus: u32,
    /// This process's uid.
    me: u32,
}

/// A user as messages name them: `root (uid 0)`, or `uid 1234` when it has no name here.
fn user_name(uid: u32) -> String {
    match login(uid) {
        Some(name) => format!("{name} (uid {uid})"),
        None => format!("uid {uid}"),
    }
}

/// The login name of `uid` in `/etc/passwd`.
fn login(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        (fields.nth(1)?.parse::<u32>().ok()? == uid).then(|| name.to_owned())
    })
}

/// Why a bus could not be connected to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ConnectError {
    /// `--address` does not parse: the address and why.
    InvalidAddress(String, String),
    /// The bus is not there: which bus, and the reason in a few words.
    Unreachable(Bus, String),
    /// The bus is another user's and did not let this one in.
    Foreign(Bus, Owner),
}

impl From<ConnectError> for CtlError {
    fn from(e: ConnectError) -> Self {
        match e {
            ConnectError::InvalidAddress(a, why) => {
                CtlError::ctl(Kind::InvalidAddress, format!("invalid bus address `{a}`: {why}"))
            }
            ConnectError::Unreachable(bus, why) => CtlError::ctl(
                Kind::BusUnreachable,
                format!(
                    "cannot connect to the {}: {why}; is D-Bus running? Otherwise set {BUS_ADDRESS_ENV} (or --address) to the address of the agent's bus",
                    bus.describe()
                ),
            ),
            ConnectError::Foreign(bus, owner) => CtlError::ctl(
                Kind::AccessDenied,
                format!(
                    "the {} is the bus of {}, and it lets in only its own user, not you, {}: run gpushare-ctl as {}, or set {BUS_ADDRESS_ENV} (or --address) to a bus of yours or the system bus",
                    bus.describe(),
                    user_name(owner.bus),
                    user_name(owner.me),
                    login(owner.bus).unwrap_or_else(|| format!("uid {}", owner.bus)),
                ),
            ),
        }
    }
}

fn address_error(e: &zbus::Error) -> String {
    match e {
        zbus::Error::Address(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A connection error in a few words (`No such file or directory (os error 2)`).
fn connect_error(e: &zbus::Error) -> String {
    match e {
        zbus::Error::InputOutput(io) => io.to_string(),
        zbus::Error::Connection(io, _) => io.to_string(),
        other => other.to_string(),
    }
}

/// A connection to the bus the agent was found on.
pub struct Agent {
    /// The bus connection (for signal subscriptions).
    pub conn: Connection,
    /// The agent's main object, without a property cache.
    pub proxy: AgentProxy<'static>,
    /// Which bus it is.
    pub bus: Bus,
}

impl Agent {
    async fn open(bus: Bus) -> Result<Self, ConnectError> {
        let conn = bus.connect().await?;
        // CacheProperties::No: building the proxy costs no round trip.
        let proxy = AgentProxy::builder(&conn)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| ConnectError::Unreachable(bus.clone(), e.to_string()))?;
        Ok(Self { conn, proxy, bus })
    }

    /// Maps the failure of `method` to one line; an unknown method reads `Version` first.
    pub async fn explain(&self, method: &str, e: AgentError) -> CtlError {
        if error::is_unknown_method(&e) {
            let version = match self.proxy.version().await {
                Ok(v) => format!("version {v}"),
                Err(_) => "version unknown".into(),
            };
            return CtlError::ctl(
                Kind::AgentOutdated,
                format!("the agent ({version}) does not know {method}: upgrade gpushare-agent"),
            );
        }
        error::from_agent_error(e, method, &self.bus.describe())
    }
}

/// The agent client: connects on the first call, then keeps the connection.
pub struct Client {
    choice: BusChoice,
    agent: Option<Agent>,
}

impl Client {
    /// A client for the bus `--address` names; nothing is connected yet.
    pub fn new(choice: BusChoice) -> Self {
        Self { choice, agent: None }
    }

    /// Runs `f` (named `method` in messages) against the agent. The first call connects:
    /// on the bus asked for, or by default on the system bus and then, if the agent is not
    /// there and a session bus is configured, on the session bus. `f` may be run twice,
    /// once per bus, so it must not have done anything the agent sees when it fails with
    /// "no owner" (subscriptions are fine).
    pub async fn call<T>(
        &mut self,
        method: &str,
        f: impl AsyncFn(&Agent) -> Result<T, AgentError>,
    ) -> Result<T, CtlError> {
        if let Some(agent) = &self.agent {
            return match f(agent).await {
                Ok(v) => Ok(v),
                Err(e) => Err(agent.explain(method, e).await),
            };
        }
        let (primary, fallback) = match &self.choice {
            BusChoice::Auto => (Bus::System, session_bus_configured()),
            BusChoice::System => (Bus::System, false),
            BusChoice::Session => (Bus::Session, false),
            BusChoice::Address(a) => (Bus::Address(a.clone()), false),
        };
        let not_running = |bus: &Bus| {
            CtlError::ctl(
                Kind::NotRunning,
                format!(
                    "gpushare-agent is not running on the {} ({BUS_NAME} has no owner); start it with {}, or set {BUS_ADDRESS_ENV} (or --address) to the address of its bus",
                    bus.describe(),
                    bus.start_hint()
                ),
            )
        };

        // Why the agent was not found on the primary bus, when the session bus may have it.
        enum Missed {
            NoOwner,
            Unreachable(String),
        }
        let missed = match Agent::open(primary.clone()).await {
            Ok(agent) => {
                match retry_once_started(&agent, first_call(&agent, &f).await?, &f).await {
                    Err(e) if error::is_no_owner(&e) && fallback => Missed::NoOwner,
                    Err(e) if error::is_no_owner(&e) => return Err(not_running(&primary)),
                    other => return self.keep(agent, method, other).await,
                }
            }
            Err(ConnectError::Unreachable(_, why)) if fallback => Missed::Unreachable(why),
            Err(e) => return Err(e.into()),
        };

        // The session bus, as a fallback of the system bus.
        let session = match Agent::open(Bus::Session).await {
            Ok(agent) => agent,
            // No usable session bus: report what the system bus said.
            Err(_) => {
                return Err(match missed {
                    Missed::NoOwner => not_running(&primary),
                    Missed::Unreachable(why) => ConnectError::Unreachable(primary, why).into(),
                });
            }
        };
        let answer = f(&session).await;
        match retry_once_started(&session, answer, &f).await {
            Err(e) if error::is_no_owner(&e) => {
                let message = match missed {
                    Missed::NoOwner => format!(
                        "gpushare-agent is not running on the system bus or the session bus ({BUS_NAME} has no owner on either); start it with {}, or set {BUS_ADDRESS_ENV} (or --address) to the address of its bus",
                        Bus::System.start_hint()
                    ),
                    Missed::Unreachable(why) => format!(
                        "gpushare-agent is not running: the system bus is unreachable ({why}) and {BUS_NAME} has no owner on the session bus; start it with {}, or set {BUS_ADDRESS_ENV} (or --address) to the address of its bus",
                        Bus::Session.start_hint()
                    ),
                };
                Err(CtlError::ctl(Kind::NotRunning, message))
            }
            other => self.keep(session, method, other).await,
        }
    }

    async fn keep<T>(
        &mut self,
        agent: Agent,
        method: &str,
        result: Result<T, AgentError>,
    ) -> Result<T, CtlError> {
        let agent = self.agent.insert(agent);
        match result {
            Ok(v) => Ok(v),
            Err(e) => Err(agent.explain(method, e).await),
        }
    }
}

/// `answer` again, or when it says nobody owns the agent's name while an agent for this
/// bus is starting, the call made again once the agent took its name (or gave up).
async fn retry_once_started<T>(
    agent: &Agent,
    answer: Result<T, AgentError>,
    f: &impl AsyncFn(&Agent) -> Result<T, AgentError>,
) -> Result<T, AgentError> {
    match answer {
        Err(e) if error::is_no_owner(&e) && agent_took_its_name(agent).await => f(agent).await,
        other => other,
    }
}

/// How often ctl looks whether a starting agent has taken its name.
const START_POLL: std::time::Duration = std::time::Duration::from_millis(20);
/// How long ctl looks for a starting agent at all: a shell's `gpushare-agent … &` may not
/// have exec'd the agent yet when the next line runs ctl.
const LOOK_FOR_START: std::time::Duration = std::time::Duration::from_millis(200);

/// Waits while an agent that serves `agent`'s bus is starting (begun moments ago, see
/// [`starting`]); whether it took its name. Nobody starting within [`LOOK_FOR_START`]:
/// false.
async fn agent_took_its_name(agent: &Agent) -> bool {
    let Ok(dbus) = zbus::fdo::DBusProxy::new(&agent.conn).await else { return false };
    let Ok(name) = zbus::names::BusName::try_from(BUS_NAME) else { return false };
    let me = own_uid();
    // A session bus is its user's: another user's agent never serves this one.
    let serves = |s: &starting::StartingAgent| match (&agent.bus, s.bus.as_deref()) {
        (Bus::System, Some(bus)) => bus == "system",
        (Bus::Session, Some(bus)) => bus == "session" && Some(s.uid) == me,
        (Bus::Address(address), Some(bus)) => bus == address,
        (Bus::System, None) => s.uid == 0,
        (Bus::Session, None) => s.uid != 0 && Some(s.uid) == me,
        (Bus::Address(_), None) => false,
    };
    let looking_until = tokio::time::Instant::now() + LOOK_FOR_START;
    let mut starting = Vec::new();
    while starting.is_empty() {
        starting = starting::starting_agents().into_iter().filter(serves).collect();
        if dbus.name_has_owner(name.clone()).await.unwrap_or(false) {
            return true;
        }
        if starting.is_empty() {
            if tokio::time::Instant::now() >= looking_until {
                return false;
            }
            tokio::time::sleep(START_POLL).await;
        }
    }
    let longest = starting.iter().map(|s| s.left).max().unwrap_or_default();
    let deadline = tokio::time::Instant::now() + longest;
    while tokio::time::Instant::now() < deadline {
        if dbus.name_has_owner(name.clone()).await.unwrap_or(false) {
            return true;
        }
        starting.retain(|s| starting::alive(s.pid));
        if starting.is_empty() {
            return false;
        }
        tokio::time::sleep(START_POLL).await;
    }
    false
}

/// This process's user (the owner of `/proc/self`).
fn own_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// The first call on a bus. On the system bus it is raced against [`unit_cannot_start`]:
/// an agent whose unit cannot start fails the call at once with the reason.
async fn first_call<T>(
    agent: &Agent,
    f: &impl AsyncFn(&Agent) -> Result<T, AgentError>,
) -> Result<Result<T, AgentError>, CtlError> {
    if agent.bus != Bus::System {
        return Ok(f(agent).await);
    }
    tokio::select! {
        answer = f(agent) => Ok(answer),
        why = unit_cannot_start(&agent.conn) => Err(CtlError::ctl(Kind::NotRunning, why)),
    }
}

/// systemd's interface of every unit.
const UNIT_INTERFACE: &str = "org.freedesktop.systemd1.Unit";
/// The unit of the packaged agent.
const AGENT_UNIT: &str = "gpushare-agent.service";
/// How long the first call waits for an answer before ctl asks systemd about the agent.
const ASK_SYSTEMD_AFTER: std::time::Duration = std::time::Duration::from_millis(250);

/// Resolves, with the reason in one line, once the agent's name has no owner and systemd
/// shows its unit cannot start (no driver: its `ExecCondition=` failed; the start limit
/// hit; a failure); never while the agent runs or is starting, nor where there is no such
/// unit.
async fn unit_cannot_start(conn: &Connection) -> String {
    // Twice the same answer, a quarter of a second apart: the first look may come before
    // systemd has queued the start this very call asked for (a busy host), and show the
    // outcome of an earlier attempt.
    let mut last = None;
    loop {
        tokio::time::sleep(ASK_SYSTEMD_AFTER).await;
        let why = why_unit_cannot_start(conn).await;
        if why.is_some() && why == last {
            return why.unwrap_or_default();
        }
        last = why;
    }
}

async fn why_unit_cannot_start(conn: &Connection) -> Option<String> {
    let dbus = zbus::fdo::DBusProxy::new(conn).await.ok()?;
    let name = zbus::names::BusName::try_from(BUS_NAME).ok()?;
    if dbus.name_has_owner(name).await.ok()? {
        return None;
    }
    let manager = zbus::Proxy::new(
        conn,
        "org.freedesktop.systemd1",
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
    )
    .await
    .ok()?;
    // LoadUnit rather than GetUnit: an inactive unit systemd unloaded is still the one.
    let unit: zbus::zvariant::OwnedObjectPath =
        manager.call("LoadUnit", &(AGENT_UNIT,)).await.ok()?;
    let property = async |interface: &'static str, name: &'static str| -> Option<String> {
        let proxy = zbus::Proxy::new(conn, "org.freedesktop.systemd1", unit.clone(), interface)
            .await
            .ok()?;
        proxy.get_property::<String>(name).await.ok()
    };
    // A start queued or running (the activation of this very call, say) may yet succeed;
    // until it ends, the unit's state is that of the last attempt.
    let unit_proxy =
        zbus::Proxy::new(conn, "org.freedesktop.systemd1", unit.clone(), UNIT_INTERFACE)
            .await
            .ok()?;
    let (job, _): (u32, zbus::zvariant::OwnedObjectPath) =
        unit_proxy.get_property("Job").await.ok()?;
    if job != 0 {
        return None;
    }
    let state = property(UNIT_INTERFACE, "ActiveState").await?;
    let result = property("org.freedesktop.systemd1.Service", "Result").await?;
    let see = "see `journalctl -u gpushare-agent`";
    match (state.as_str(), result.as_str()) {
        (_, "exec-condition") if matches!(state.as_str(), "inactive" | "failed") => Some(format!(
            "gpushare-agent is not running: it found no usable NVIDIA driver (its ExecCondition, gpushare-agent --check-driver, failed; {see}); once the driver works, run `systemctl start gpushare-agent`"
        )),
        ("failed" | "inactive", "start-limit-hit") => Some(format!(
            "gpushare-agent is not running: it failed to start too often and systemd stopped trying (start-limit-hit; {see}); after fixing the cause, run `systemctl reset-failed gpushare-agent && systemctl start gpushare-agent`"
        )),
        // With Restart=on-failure, a unit left failed is one systemd stopped restarting.
        ("failed", result) => Some(format!(
            "gpushare-agent is not running: its unit failed ({result}) and systemd stopped restarting it ({see}); after fixing the cause, run `systemctl reset-failed gpushare-agent && systemctl start gpushare-agent`"
        )),
        _ => None,
    }
}

/// Whether a session bus is configured to fall back to.
fn session_bus_configured() -> bool {
    std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_some_and(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_of_an_address() {
        assert_eq!(socket_path_of("unix:path=/tmp/dbus-x,guid=ab12"), Some("/tmp/dbus-x".into()));
        assert_eq!(
            socket_path_of("tcp:host=x,port=1;unix:guid=1,path=/tmp/a%20b"),
            Some("/tmp/a b".into())
        );
        assert_eq!(socket_path_of("unix:abstract=/tmp/x"), None);
        assert_eq!(socket_path_of("tcp:host=localhost,port=1"), None);
    }

    #[test]
    fn address_choices() {
        assert_eq!(BusChoice::parse(None), BusChoice::Auto);
        assert_eq!(BusChoice::parse(Some("")), BusChoice::Auto);
        assert_eq!(BusChoice::parse(Some("system")), BusChoice::System);
        assert_eq!(BusChoice::parse(Some("session")), BusChoice::Session);
        assert_eq!(
            BusChoice::parse(Some("unix:path=/tmp/x")),
            BusChoice::Address("unix:path=/tmp/x".into())
        );
    }

    #[test]
    fn bus_descriptions() {
        assert_eq!(Bus::System.describe(), "system bus");
        assert_eq!(Bus::Address("unix:path=/x".into()).describe(), "bus at unix:path=/x");
        assert!(Bus::Session.start_hint().contains("--bus session"));
    }

    #[test]
    fn explicit_bus_errors_are_one_line() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut client =
            Client::new(BusChoice::Address("unix:path=/nonexistent/gpushare-test".into()));
        let e = rt
            .block_on(client.call("Status", async |a: &Agent| a.proxy.status().await))
            .unwrap_err();
        assert!(e.is(Kind::BusUnreachable), "{e:?}");
        assert!(
            e.message
                .starts_with("cannot connect to the bus at unix:path=/nonexistent/gpushare-test: "),
            "{}",
            e.message
        );

        let mut client = Client::new(BusChoice::Address("bogus".into()));
        let e = rt
            .block_on(client.call("Status", async |a: &Agent| a.proxy.status().await))
            .unwrap_err();
        assert!(e.is(Kind::InvalidAddress), "{e:?}");
        assert!(e.message.starts_with("invalid bus address `bogus`"), "{}", e.message);
    }
}
