//! The interface between `gpushare-agent` and its clients.
//!
//! Shared by the agent and `gpushare-ctl` (and anyone else who drives the agent): the bus
//! and object names, the zbus proxies, the D-Bus error names, and the JSON documents that
//! methods return. Methods that return structured data return one JSON document as a
//! D-Bus string; its shape is the one `gpushare-ctl --json` prints, defined by the types
//! in [`types`]. Fields may be added; none are renamed or removed.

pub mod bench;
pub mod cdi;
pub mod clients;
pub mod health;
pub mod telemetry;
pub mod types;
mod vocab;

pub use vocab::*;

use std::collections::HashMap;

use zbus::zvariant::{OwnedObjectPath, Value};

/// Well-known bus name the agent owns.
pub const BUS_NAME: &str = "io.gpushare.Agent1";
/// Object path of the agent's main object.
pub const OBJECT_PATH: &str = "/io/gpushare/Agent1";
/// Interface of the main object.
pub const INTERFACE: &str = "io.gpushare.Agent1";
/// Interface of job objects (`/io/gpushare/Agent1/jobs/<n>`).
pub const JOB_INTERFACE: &str = "io.gpushare.Job1";
/// Prefix of job object paths.
pub const JOB_PATH_PREFIX: &str = "/io/gpushare/Agent1/jobs";
/// Prefix of the D-Bus error names the agent returns.
pub const ERROR_PREFIX: &str = "io.gpushare.Agent1.Error";
/// Environment variable naming the bus address clients use instead of the system bus.
pub const BUS_ADDRESS_ENV: &str = "GPUSHARE_BUS_ADDRESS";
/// The system bus's address where `DBUS_SYSTEM_BUS_ADDRESS` names none (the D-Bus
/// specification's default).
pub const SYSTEM_BUS_DEFAULT: &str = "unix:path=/var/run/dbus/system_bus_socket";

/// The socket files a D-Bus address names, in order: each `unix:path=` of its
/// alternatives (`;` separates them, `,` their keys), with its `%xx` escapes undone.
/// Alternatives of other kinds (`abstract=`, `tcp:`) name none.
pub fn unix_socket_paths(address: &str) -> Vec<std::path::PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let decode = |value: &str| {
        let mut bytes = Vec::with_capacity(value.len());
        let mut rest = value.as_bytes();
        while let Some((&b, tail)) = rest.split_first() {
            let hex = tail.get(..2).and_then(|h| std::str::from_utf8(h).ok());
            match hex.filter(|_| b == b'%').and_then(|h| u8::from_str_radix(h, 16).ok()) {
                Some(byte) => {
                    bytes.push(byte);
                    rest = &tail[2..];
                }
                None => {
                    bytes.push(b);
                    rest = tail;
                }
            }
        }
        std::path::PathBuf::from(std::ffi::OsString::from_vec(bytes))
    };
    address
        .split(';')
        .filter_map(|t| t.trim_start().strip_prefix("unix:"))
        .filter_map(|t| t.split(',').find_map(|kv| kv.strip_prefix("path=")))
        .map(decode)
        .collect()
}

pub use gpushare_base::size::{exact_size, readable_size};

/// `"1 replica"`, `"3 replicas"`: `n` and `word`, plural unless `n` is one.
pub fn plural(n: impl Into<u64>, word: &str) -> String {
    match n.into() {
        1 => format!("1 {word}"),
        n => format!("{n} {word}s"),
    }
}

/// Parses a byte size as profiles and `gpushare-ctl` take it: a number of bytes, or a number with a unit
/// `B`, `K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB` (`2GiB`, `512M`). Zero is refused.
/// The rule is [`gpushare_base::size::parse_size`]'s; the messages are these.
pub fn parse_size(text: &str) -> Result<u64, String> {
    use gpushare_base::size::SizeError;
    let text = text.trim();
    gpushare_base::size::parse_size(text).map_err(|e| match e {
        SizeError::NotASize => format!(
            "`{text}` is not a size: give bytes or a number with a unit (2GiB, 512MiB, 2G, 512M)"
        ),
        SizeError::UnknownUnit(unit) => {
            format!("unknown size unit `{unit}`: use B, KiB, MiB, GiB or TiB")
        }
        SizeError::Zero => "the size must be above zero".into(),
        SizeError::TooLarge => format!("the size `{text}` is too large"),
    })
}

/// Errors the agent returns, as D-Bus errors named `io.gpushare.Agent1.Error.<Variant>`.
/// Each carries a one-line, human-readable reason.
#[derive(Debug, zbus::DBusError)]
#[zbus(prefix = "io.gpushare.Agent1.Error")]
pub enum AgentError {
    /// A transport error from zbus itself.
    #[zbus(error)]
    ZBus(zbus::Error),
    /// No profile of that name exists; the message lists the known ones.
    UnknownProfile(String),
    /// A profile file or text is malformed; the message names file, line and column.
    InvalidProfile(String),
    /// A profile cannot be carried out on this node; the message names GPU, model and why.
    Infeasible(String),
    /// Another job is changing the GPUs right now; the message names it.
    Busy(String),
    /// The caller may not do this; the message names what is missing.
    AccessDenied(String),
    /// Compute processes use what the change would destroy; the message lists their PIDs.
    GpuBusy(String),
    /// The GPU backend (driver or simulator) failed.
    Backend(String),
    /// Anything else.
    Failed(String),
}

pub use proxies::*;

/// The zbus proxies (their generated signal types carry no docs of their own).
#[allow(missing_docs)]
mod proxies {
    use super::*;

    /// The agent's main object.
    #[zbus::proxy(
        interface = "io.gpushare.Agent1",
        default_service = "io.gpushare.Agent1",
        default_path = "/io/gpushare/Agent1",
        gen_blocking = false
    )]
    pub trait Agent {
        /// Observed state of every GPU and the active profile: a [`types::Status`] as JSON.
        fn status(&self) -> Result<String, AgentError>;

        /// The steps that applying `profile` would take, changing nothing: a [`types::PlanReport`].
        fn plan(&self, profile: &str) -> Result<String, AgentError>;

        /// Starts applying `profile` and returns the job object at once. Options:
        /// `force` (b). Progress and the outcome arrive as signals of the job.
        fn apply(
            &self,
            profile: &str,
            options: HashMap<&str, Value<'_>>,
        ) -> Result<OwnedObjectPath, AgentError>;

        /// Like `Plan`, for a profile given as a document rather than by name: a gpushare
        /// profile (TOML) or NVIDIA mig-parted's `config.yaml` with `config` naming one of
        /// its `mig-configs` (empty for TOML). `origin` names the document in messages; a
        /// name ending in `.yaml`/`.yml` or a document with `mig-configs:` is mig-parted's.
        fn plan_document(
            &self,
            text: &str,
            origin: &str,
            config: &str,
        ) -> Result<String, AgentError>;

        /// Like `Apply`, for a document as in `PlanDocument`.
        fn apply_document(
            &self,
            text: &str,
            origin: &str,
            config: &str,
            options: HashMap<&str, Value<'_>>,
        ) -> Result<OwnedObjectPath, AgentError>;

        /// The current state of the GPUs as a profile: a [`types::Export`].
        fn export(&self) -> Result<String, AgentError>;

        /// Starts a probe run on one GPU or MIG instance under its current sharing and
        /// returns the job object; the job's outcome carries a [`types::ProbeReport`].
        /// Options: `target` (s: GPU index, `GPU-…` or `MIG-…`; default GPU 0),
        /// `workloads` (as: `launch`, `compute`, `memory`), `clients` (au), `seconds` (d),
        /// `compare` (b: run the sweep under time-slicing, MPS and MPS with per-client
        /// limits, restore the sharing afterwards, and recommend a strategy per workload).
        fn probe(&self, options: HashMap<&str, Value<'_>>) -> Result<OwnedObjectPath, AgentError>;

        /// Starts a bench: `command` (empty with the `builtin` option) run as N replicas
        /// under each sharing strategy, as the caller, on one GPU whose sharing is restored
        /// afterwards; returns the job object, whose outcome carries a
        /// [`bench::BenchReport`]. Options are the `BENCH_*` constants of [`bench`].
        fn bench(
            &self,
            command: &[&str],
            options: HashMap<&str, Value<'_>>,
        ) -> Result<OwnedObjectPath, AgentError>;

        /// Starts the reset of GPU `gpu` (by index), which must have a fault a reset repairs
        /// and no client (issue 42): its MPS servers stopped, the GPU reset through
        /// nvidia-smi, its faults cleared and the active profile applied again. Returns the
        /// job object; checks that fail are errors of this call, nothing changed.
        fn reset_gpu(&self, gpu: u32) -> Result<OwnedObjectPath, AgentError>;

        /// The MPS servers the agent runs, with their limits and clients: a
        /// [`types::MpsStatus`].
        fn mps_status(&self) -> Result<String, AgentError>;

        /// Sets the limits of the MPS server that serves client `pid` (MPS applies them
        /// to that server's new clients): `threads` 1-100 or 0 to leave, `memory_bytes`
        /// or 0 to leave. Returns a [`types::MpsLimitResult`].
        fn mps_limit(
            &self,
            pid: u32,
            threads: u32,
            memory_bytes: u64,
        ) -> Result<String, AgentError>;

        /// The environment a client needs to use a GPU (index or `GPU-…`) or MIG
        /// instance (`MIG-…`) as the active profile shares it: a [`types::ClientEnv`].
        fn env(&self, target: &str) -> Result<String, AgentError>;

        /// The MIG profiles of a GPU (index or `GPU-…`) as its driver reports them, or of
        /// every MIG-capable GPU when `gpu` is empty: a [`types::MigProfiles`]. A GPU
        /// without MIG, or one the node lacks, is refused (`Failed`) naming the GPUs that
        /// have MIG.
        fn mig_profiles(&self, gpu: &str) -> Result<String, AgentError>;

        /// The devices the agent's CDI spec names now, each with its `podman run` line:
        /// a [`cdi::CdiReport`]. Open to all, like `Status`.
        fn cdi_devices(&self) -> Result<String, AgentError>;

        /// Every process using the GPUs, attributed to its user, unit or container, with
        /// its GPU memory and MPS share, and the MIG devices and MPS servers no one uses: a
        /// [`clients::ClientTable`]. Open to all; a command line is shown to root and to the
        /// process's own user only.
        fn clients(&self) -> Result<String, AgentError>;

        /// What each GPU is doing now (utilisation, memory used, temperature, power, and
        /// each MIG device's memory, as NVML answers them): a [`telemetry::Telemetry`].
        /// Open to all, like `Status`; not part of `Status` (its time budget).
        fn telemetry(&self) -> Result<String, AgentError>;

        /// Every known profile: a [`types::ProfileList`].
        fn list_profiles(&self) -> Result<String, AgentError>;

        /// One profile with its source text: a [`types::ProfileDetail`].
        fn show_profile(&self, name: &str) -> Result<String, AgentError>;

        /// Parses and validates profile text (named `origin` in messages) and plans it against
        /// this node without changing anything: a [`types::Validation`].
        fn validate_profile(&self, text: &str, origin: &str) -> Result<String, AgentError>;

        /// The agent's version (`0.1.0`).
        #[zbus(property)]
        fn version(&self) -> zbus::Result<String>;
    }

    /// A job the agent runs in the background (an apply).
    #[zbus::proxy(
        interface = "io.gpushare.Job1",
        default_service = "io.gpushare.Agent1",
        gen_blocking = false
    )]
    pub trait Job {
        /// `running`, `succeeded` or `failed`.
        #[zbus(property)]
        fn state(&self) -> zbus::Result<String>;

        /// The outcome as a [`types::JobOutcome`] in JSON; empty while running. A bench's
        /// is its public part (`private`: true); see `GetOutcome`.
        #[zbus(property)]
        fn outcome(&self) -> zbus::Result<String>;

        /// The whole outcome as a [`types::JobOutcome`] in JSON (empty while running). A
        /// bench's answers only its caller's user and root (`AccessDenied` otherwise);
        /// other jobs' are `Outcome`.
        fn get_outcome(&self) -> Result<String, AgentError>;

        /// Asks a bench job to stop early: its replicas are stopped and the sharing is
        /// restored before it finishes (failed, "cancelled"). Other jobs cannot be
        /// cancelled (`Failed`). Only the caller that started the job, or root, may.
        fn cancel(&self) -> Result<(), AgentError>;

        /// Emitted as each step begins: steps begun before it (it is number `done + 1`, counted
        /// across GPUs in the order steps begin), total steps, the step. `total` 0: a line
        /// without a count (verifying, a rollback's `rolling back: …` lines).
        #[zbus(signal)]
        fn progress(&self, done: u32, total: u32, step: String) -> zbus::Result<()>;

        /// Emitted once when the job ends, with its [`types::JobOutcome`] as JSON.
        #[zbus(signal)]
        fn finished(&self, outcome: String) -> zbus::Result<()>;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unix_path_of_an_address_is_named_decoded() {
        let paths =
            unix_socket_paths("unix:path=/a%2cb,guid=1;tcp:host=x;unix:abstract=/c;unix:path=/d");
        assert_eq!(paths, [std::path::PathBuf::from("/a,b"), "/d".into()]);
        assert!(unix_socket_paths("tcp:host=localhost,port=1").is_empty());
    }

    #[test]
    fn byte_prefixes_end_on_a_character() {
        assert_eq!(byte_prefix("gpushare", 3), "gpu");
        assert_eq!(byte_prefix("gpu", 8), "gpu");
        // "é" takes bytes 1 and 2: a cut at 2 keeps only "x".
        assert_eq!(byte_prefix("xé", 2), "x");
        assert_eq!(byte_prefix("", 0), "");
    }

    #[test]
    fn sizes_for_people_and_plurals() {
        assert_eq!(readable_size(80 << 30), "80 GiB");
        assert_eq!(readable_size(81559 << 20), "79.6 GiB");
        assert_eq!(readable_size(512 << 20), "512 MiB");
        assert_eq!(plural(1u32, "replica"), "1 replica");
        assert_eq!(plural(7u32, "replica"), "7 replicas");
        assert_eq!(plural(0u64, "config"), "0 configs");
    }

    #[test]
    fn sizes_parse_like_profiles() {
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4096B"), Ok(4096));
        assert_eq!(parse_size(" 2 GiB "), Ok(2 << 30));
        assert!(parse_size("0").unwrap_err().contains("above zero"));
        assert!(parse_size("0MiB").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("G").unwrap_err().contains("not a size"));
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("1.5G").unwrap_err().contains("unknown size unit `.5G`"));
        assert!(parse_size("2gb").unwrap_err().contains("unknown size unit"));
        assert!(parse_size("99999999999999999999").unwrap_err().contains("too large"));
        assert!(parse_size("17179869184G").unwrap_err().contains("too large"));
    }
}
