//! The service manager over its D-Bus API (`org.freedesktop.systemd1` on the system bus):
//! transient services started with descriptors handed over, killed, stopped and listed.
//! What the agent starts this way runs from PID 1, outside the agent's own sandbox and
//! cgroup (see DESIGN.md, "Replicas are the user's own processes").

use std::os::fd::OwnedFd;
use std::time::Duration;

use zbus::zvariant::{Fd, OwnedObjectPath, Value};

/// A unit as `ListUnitsByPatterns` lists it.
type UnitListing =
    (String, String, String, String, String, String, OwnedObjectPath, u32, String, OwnedObjectPath);

/// systemd's manager object (generated proxy; its types carry no docs of their own).
#[allow(missing_docs)]
mod manager {
    use super::UnitListing;
    use zbus::zvariant::{OwnedObjectPath, Value};

    #[zbus::proxy(
        interface = "org.freedesktop.systemd1.Manager",
        default_service = "org.freedesktop.systemd1",
        default_path = "/org/freedesktop/systemd1",
        gen_blocking = false
    )]
    pub trait Manager {
        fn start_transient_unit(
            &self,
            name: &str,
            mode: &str,
            properties: &[(&str, Value<'_>)],
            aux: &[(&str, &[(&str, Value<'_>)])],
        ) -> zbus::Result<OwnedObjectPath>;

        fn kill_unit(&self, name: &str, whom: &str, signal: i32) -> zbus::Result<()>;

        fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

        fn get_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;

        fn list_units_by_patterns(
            &self,
            states: &[&str],
            patterns: &[&str],
        ) -> zbus::Result<Vec<UnitListing>>;
    }
}

/// A transient service to start.
#[derive(Debug)]
pub struct TransientService {
    /// The unit's name, `….service`.
    pub name: String,
    /// For `systemctl status`.
    pub description: String,
    /// The slice it runs in (`user-1000.slice`).
    pub slice: String,
    /// The program (an absolute path) and its arguments, `argv[0]` first.
    pub argv: Vec<String>,
    /// Its standard input.
    pub stdin: OwnedFd,
    /// Its standard output.
    pub stdout: OwnedFd,
    /// The longest it may run before systemd stops it.
    pub runtime_max: Duration,
}

/// A connection to the system's service manager.
#[derive(Debug, Clone)]
pub struct Systemd {
    manager: manager::ManagerProxy<'static>,
}

impl Systemd {
    /// Connects to systemd on the system bus.
    pub async fn connect() -> zbus::Result<Systemd> {
        let connection = zbus::Connection::system().await?;
        let manager = manager::ManagerProxy::new(&connection).await?;
        Ok(Systemd { manager })
    }

    /// Starts `service`: a `Type=exec` service whose start job is done once its program
    /// runs; its whole cgroup is stopped when the program ends (`KillMode=control-group`)
    /// and the unit collected even when it failed. Its standard error goes to the journal.
    pub async fn start_service(&self, service: TransientService) -> zbus::Result<()> {
        let TransientService { name, description, slice, argv, stdin, stdout, runtime_max } =
            service;
        let program = argv.first().cloned().unwrap_or_default();
        let exec_start = vec![(program, argv, false)];
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let properties: Vec<(&str, Value<'_>)> = vec![
            ("Description", Value::from(description)),
            ("Slice", Value::from(slice)),
            ("Type", Value::from("exec")),
            ("ExecStart", Value::from(exec_start)),
            ("StandardInputFileDescriptor", Value::from(Fd::from(stdin))),
            ("StandardOutputFileDescriptor", Value::from(Fd::from(stdout))),
            ("StandardError", Value::from("journal")),
            ("KillMode", Value::from("control-group")),
            ("CollectMode", Value::from("inactive-or-failed")),
            ("TimeoutStopUSec", Value::from(micros(Duration::from_secs(10)))),
            ("RuntimeMaxUSec", Value::from(micros(runtime_max))),
        ];
        self.manager.start_transient_unit(&name, "fail", &properties, &[]).await?;
        Ok(())
    }

    /// Sends `signal` to every process of unit `name`.
    pub async fn kill_all(&self, name: &str, signal: super::unix::Signal) -> zbus::Result<()> {
        self.manager.kill_unit(name, "all", signal as i32).await
    }

    /// Asks systemd to stop unit `name` (its processes get SIGTERM, SIGKILL later).
    pub async fn stop(&self, name: &str) -> zbus::Result<()> {
        self.manager.stop_unit(name, "replace").await.map(|_| ())
    }

    /// The loaded units whose names match `pattern` (`gpushare-bench-*.service`).
    pub async fn units_matching(&self, pattern: &str) -> zbus::Result<Vec<String>> {
        let units = self.manager.list_units_by_patterns(&[], &[pattern]).await?;
        Ok(units.into_iter().map(|u| u.0).collect())
    }
}
