//! `gpushare-ctl cdi`: the devices the agent's CDI spec names now, each with how a
//! container asks for it:
//!
//! ```text
//! CDI spec /var/run/cdi/gpushare.json (kind gpushare.io/gpu)
//! DEVICE                  WHAT                                              PODMAN
//! gpushare.io/gpu=0       GPU 0 (A100-SXM4-40GB) whole (its MPS server, …)  podman run --device nvidia.com/gpu=0 --device gpushare.io/gpu=0 IMAGE
//! gpushare.io/gpu=0-mps-0 share 0 of 4 of the MPS server of GPU 0 (…)       podman run --device nvidia.com/gpu=0 --device gpushare.io/gpu=0-mps-0 --ipc=host IMAGE
//! ```
//!
//! `--json` prints the [`CdiReport`] document.

use gpushare_proto::cdi::{CdiDevice, CdiReport};

use super::ExitStatus;
use crate::bus::Client;
use crate::error::{CtlError, Kind};
use crate::output::{Output, parse_document};
use crate::table::Columns;

/// Runs `cdi [DEVICE]`.
pub async fn run(
    client: &mut Client,
    out: &Output,
    device: Option<&str>,
) -> Result<ExitStatus, CtlError> {
    let raw = client.call("CdiDevices", async |a| a.proxy.cdi_devices().await).await?;
    if out.json && device.is_none() {
        out.print_document(&raw, "CdiReport")?;
        return Ok(0);
    }
    let mut report: CdiReport = parse_document(&raw, "CdiReport")?;
    if let Some(wanted) = device {
        report.devices = vec![one(&report, wanted)?];
        if out.json {
            let doc = serde_json::to_string_pretty(&report.devices[0])
                .map_err(|e| CtlError::ctl(Kind::Failed, e.to_string()))?;
            out.print(&format!("{doc}\n"));
            return Ok(0);
        }
    }
    out.print(&render(&report));
    for why in &report.left_out {
        out.warn(&format!("left out of the spec: {why}"));
    }
    if let Some(error) = &report.error {
        out.warn(&format!("the spec was not rebuilt: {error}"));
    }
    Ok(0)
}

/// The device `wanted` names (its name, or `kind=name`), or a one-line refusal naming
/// the devices there are.
fn one(report: &CdiReport, wanted: &str) -> Result<gpushare_proto::cdi::CdiDevice, CtlError> {
    let name = wanted.strip_prefix(&format!("{}=", report.kind)).unwrap_or(wanted);
    if let Some(d) = report.devices.iter().find(|d| d.name == name) {
        return Ok(d.clone());
    }
    let names: Vec<&str> = report.devices.iter().map(|d| d.name.as_str()).collect();
    let there = if names.is_empty() { "none".to_string() } else { names.join(", ") };
    Err(CtlError::ctl(
        Kind::Failed,
        format!(
            "no CDI device {wanted:?} on this node as it is shared now; {} has: {there}",
            report.kind
        ),
    ))
}

/// The report for people.
pub fn render(report: &CdiReport) -> String {
    if !report.enabled {
        return "The agent writes no CDI spec (agent.toml [cdi] enabled = false).\n".into();
    }
    let state = if report.written { "" } else { " (not written yet)" };
    let mut text = format!("CDI spec {}{state} (kind {})\n", report.path, report.kind);
    if report.devices.is_empty() {
        text.push_str("No devices.\n");
        return text;
    }
    text.push_str(&device_columns().render(&report.devices));
    text.push_str(
        "Driver libraries come from NVIDIA's container toolkit: ask for its device too \
         (--device nvidia.com/gpu=…).\n",
    );
    text
}

/// The devices' columns.
fn device_columns() -> Columns<'static, CdiDevice> {
    Columns::<CdiDevice>::new()
        .left("DEVICE", |d| d.device.clone())
        .left("WHAT", |d| d.describe.clone())
        .left("PODMAN", |d| d.podman.clone())
}

#[cfg(test)]
mod tests {
    use gpushare_proto::cdi::CdiDevice;

    use super::*;

    #[test]
    fn devices_are_listed_with_their_podman_line() {
        let report = CdiReport {
            enabled: true,
            path: "/var/run/cdi/gpushare.json".into(),
            kind: "gpushare.io/gpu".into(),
            written: true,
            devices: vec![CdiDevice {
                name: "0-mps-1".into(),
                device: "gpushare.io/gpu=0-mps-1".into(),
                what: "mps-share".into(),
                uuid: "GPU-1".into(),
                describe: "share 1 of 4 of the MPS server of GPU 0".into(),
                podman: "podman run --device gpushare.io/gpu=0-mps-1 --ipc=host IMAGE".into(),
            }],
            left_out: Vec::new(),
            error: None,
        };
        let text = render(&report);
        assert!(text.starts_with("CDI spec /var/run/cdi/gpushare.json (kind gpushare.io/gpu)\n"));
        assert!(text.contains("gpushare.io/gpu=0-mps-1"), "{text}");
        assert!(text.contains("podman run --device gpushare.io/gpu=0-mps-1 --ipc=host IMAGE"));
        assert_eq!(one(&report, "gpushare.io/gpu=0-mps-1").unwrap().name, "0-mps-1");
        let e = one(&report, "0-mps-9").unwrap_err().to_string();
        assert!(
            e.contains("no CDI device \"0-mps-9\"") && e.contains("gpushare.io/gpu has: 0-mps-1"),
            "{e}"
        );
        let off = CdiReport { enabled: false, ..report };
        assert!(render(&off).contains("[cdi] enabled = false"));
    }
}
