//! `gpushare-ctl cdi`: the devices the agent's CDI spec names now, each with how a
//! container asks for it:
//!
//! ```text
//! CDI spec /var/run/cdi/gpushare.json (kind gpushare.io/gpu)
//! DEVICE                  WHAT                                              PODMAN
//! gpushare.io/gpu=0       GPU 0 (A100-SXM4-40GB) whole (its MPS server, …)  podman run --device gpushare.io/gpu=0 IMAGE
//! gpushare.io/gpu=0-mps-0 share 0 of 4 of the MPS server of GPU 0 (…)       podman run --device gpushare.io/gpu=0-mps-0 --ipc=host IMAGE
//! ```
//!
//! `--json` prints the [`CdiReport`] document.

use gpushare_proto::cdi::CdiReport;

use super::ExitStatus;
use crate::bus::Client;
use crate::error::CtlError;
use crate::output::{Output, parse_document, plain_table, render_table};

/// Runs `cdi`.
pub async fn run(client: &mut Client, out: &Output) -> Result<ExitStatus, CtlError> {
    let raw = client.call("CdiDevices", async |a| a.proxy.cdi_devices().await).await?;
    if out.json {
        out.print_document(&raw, "CdiReport")?;
        return Ok(0);
    }
    let report: CdiReport = parse_document(&raw, "CdiReport")?;
    out.print(&render(&report));
    for why in &report.left_out {
        out.warn(&format!("left out of the spec: {why}"));
    }
    if let Some(error) = &report.error {
        out.warn(&format!("the spec was not rebuilt: {error}"));
    }
    Ok(0)
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
    let mut table = plain_table(["DEVICE", "WHAT", "PODMAN"]);
    for d in &report.devices {
        table.add_row([d.device.as_str(), d.describe.as_str(), d.podman.as_str()]);
    }
    text.push_str(&render_table(&table));
    text.push_str(
        "Driver libraries come from NVIDIA's container toolkit: ask for its device too \
         (--device nvidia.com/gpu=…).\n",
    );
    text
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
        let off = CdiReport { enabled: false, ..report };
        assert!(render(&off).contains("[cdi] enabled = false"));
    }
}
