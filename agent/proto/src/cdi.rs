//! The CDI devices the agent's spec names now: `CdiDevices`'s answer, and what
//! `gpushare-ctl cdi --json` prints.

use serde::{Deserialize, Serialize};

/// The spec as last written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CdiReport {
    /// Whether the agent writes a spec (`[cdi] enabled`).
    pub enabled: bool,
    /// Where (`/var/run/cdi/gpushare.json`).
    pub path: String,
    /// The CDI kind of its devices (`gpushare.io/gpu`).
    pub kind: String,
    /// Whether the spec is on disk now.
    pub written: bool,
    /// Its devices, in its order.
    pub devices: Vec<CdiDevice>,
    /// Devices it could not name, one line each (a device node missing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<String>,
    /// Why the last rebuild failed, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One device of the spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CdiDevice {
    /// Its name (`0`, `GPU-…`, `0:1`, `MIG-…`, `0-mps-2`).
    pub name: String,
    /// The fully qualified name a runtime takes (`gpushare.io/gpu=0-mps-2`).
    pub device: String,
    /// `gpu`, `mig` or `mps-share`.
    pub what: String,
    /// The `GPU-…`/`MIG-…` it gives access to.
    pub uuid: String,
    /// What it is, one line.
    pub describe: String,
    /// How podman asks for it.
    pub podman: String,
}
