//! The CDI spec as a view ([`super::View`]): rendered from each observation the views
//! share (after every transaction and at start-up), written when it changed; owns the
//! last build, which answers `gpushare-ctl cdi`, and the reasons for leaving devices out
//! already logged.

use std::path::PathBuf;
use std::sync::Mutex;

use gpushare_proto::cdi::{CdiDevice, CdiReport};

use super::{Observation, View};
use crate::cdi::writer::Writer;
use crate::cdi::{self, Described, Host, KIND};
use crate::gpu::device_nodes::DeviceNode;

/// The spec's writer and the last build.
pub struct CdiView {
    writer: Writer,
    last: Mutex<Option<Built>>,
    /// The reasons for leaving devices out last logged: each is said once, and again
    /// only after it went away (issue 37: 20 lines after every apply, as a user).
    logged: Mutex<Vec<String>>,
}

/// What the last build gave.
#[derive(Debug, Clone, Default)]
struct Built {
    described: Vec<Described>,
    left_out: Vec<String>,
    error: Option<String>,
}

/// The host as the spec needs it: device nodes as the observation finds them, MPS
/// directories where the sharing layer keeps them.
struct AccessHost<'a>(&'a Observation<'a>);

impl Host for AccessHost<'_> {
    fn nodes(&self, gpu: u32, mig: Option<(u32, u32)>) -> Result<Vec<DeviceNode>, String> {
        self.0.device_nodes(gpu, mig)
    }

    fn mps_dirs(&self, uuid: &str) -> (PathBuf, PathBuf) {
        let mps = &self.0.access.sharing.mps;
        (mps.pipe_dir(uuid), mps.log_dir(uuid))
    }
}

impl CdiView {
    /// The view writing through `writer`.
    pub fn new(writer: Writer) -> Self {
        CdiView { writer, last: Mutex::new(None), logged: Mutex::default() }
    }

    /// Builds the spec from `seen` and writes it when it changed.
    fn build(&self, seen: &Observation<'_>) -> Built {
        let host = AccessHost(seen);
        let (spec, described, left_out) = cdi::build(seen.node, &host);
        let bytes = (!spec.devices.is_empty()).then(|| cdi::to_bytes(&spec));
        let error = match self.writer.write(bytes.as_deref()) {
            Ok(true) => {
                tracing::info!(
                    devices = spec.devices.len(),
                    "CDI spec {} written",
                    self.writer.path().display()
                );
                None
            }
            Ok(false) => None,
            Err(e) => {
                let why = format!("writing {}: {e}", self.writer.path().display());
                tracing::error!("CDI spec: {why}");
                Some(why)
            }
        };
        self.log_left_out(&left_out);
        Built { described, left_out, error }
    }

    /// Warns of each reason for leaving devices out that was not already said, naming its
    /// first device and counting the others (`gpushare-ctl cdi` lists them all).
    fn log_left_out(&self, left_out: &[String]) {
        let reasons = cdi::reasons(left_out);
        let mut logged = self.logged.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (why, lines) in &reasons {
            if logged.contains(why) {
                continue;
            }
            match lines.len() {
                1 => tracing::warn!("CDI spec: left out {}", lines[0]),
                n => tracing::warn!(
                    "CDI spec: left out {} and {} more devices for the same reason (gpushare-ctl \
                     cdi lists them)",
                    lines[0],
                    n - 1
                ),
            }
        }
        *logged = reasons.into_iter().map(|(why, _)| why).collect();
    }

    /// The devices of the spec as last built, with the `podman run` line of each.
    pub fn report(&self) -> CdiReport {
        let last = self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let built = last.unwrap_or_default();
        let devices = built
            .described
            .into_iter()
            .map(|d| {
                let device = format!("{KIND}={}", d.name);
                CdiDevice {
                    podman: podman_line(&d.name, &device, d.what),
                    name: d.name,
                    device,
                    what: d.what.into(),
                    uuid: d.uuid,
                    describe: d.describe,
                }
            })
            .collect();
        CdiReport {
            enabled: self.writer.enabled,
            path: self.writer.path().display().to_string(),
            kind: KIND.into(),
            written: self.writer.enabled && self.writer.path().is_file(),
            devices,
            left_out: built.left_out,
            error: built.error,
        }
    }
}

impl View for CdiView {
    fn name(&self) -> &'static str {
        "CDI spec"
    }

    fn enabled(&self) -> bool {
        self.writer.enabled
    }

    fn follows_benches(&self) -> bool {
        true
    }

    /// The spec names devices, not how a whole GPU is time-sliced.
    fn reads_intervals(&self) -> bool {
        false
    }

    /// Its place only: the spec names whatever the GPUs become.
    fn check(&self, _ahead: &super::Ahead<'_>) -> Result<(), String> {
        self.writer.check()
    }

    /// A failure is logged and kept for `gpushare-ctl cdi`.
    fn render(&self, seen: Result<&Observation<'_>, &str>) {
        let built = match seen {
            Ok(seen) => self.build(seen),
            Err(why) => Built { error: Some(why.to_string()), ..Built::default() },
        };
        *self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(built);
    }
}

/// How a container asks for `device` (named `name`) with podman: with NVIDIA's device of
/// the same GPU or MIG device (the spec NVIDIA's container toolkit writes, which brings the
/// driver's libraries and its device nodes: gpushare's spec adds only the sharing, and
/// NVIDIA's names are the same index paths, `0` and `0:1`); an MPS share also shares the
/// server's IPC namespace (MPS clients meet their server in shared memory, which CDI cannot
/// give).
fn podman_line(name: &str, device: &str, what: &str) -> String {
    let nvidia = name.split_once("-mps-").map_or(name, |(path, _)| path);
    let ipc = if what == "mps-share" { " --ipc=host" } else { "" };
    format!("podman run --device nvidia.com/gpu={nvidia} --device {device}{ipc} IMAGE")
}
