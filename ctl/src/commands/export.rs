//! `gpushare-ctl export`: the GPUs' current state as a gpushare profile (TOML) — MIG
//! layout, MPS with its limits, time-slicing with its interval, and so the compute modes —
//! printed as the agent wrote it, so that `gpushare-ctl export > now.toml` and later
//! `gpushare-ctl apply -f now.toml` restores it; what a profile cannot say leads the text
//! as comment lines and is said on stderr. `--format mig-parted` prints the MIG layout
//! alone as NVIDIA mig-parted's config file, one config named `exported` (`apply -f
//! now.yaml -c exported`, or mig-parted's own `apply -f now.yaml -c exported`), and says
//! on stderr what it leaves out. `--format device-plugin` and `--format labels` print what
//! NVIDIA's device plugin and NFD's local source are given for the GPUs as they are (the
//! agent's `[device_plugin]` and `[labels]` files, whether it keeps them or not); a node
//! the plugin cannot express is an error naming the plugin's rule. `--format slurm`
//! prints this node's gres.conf as `[slurm]` keeps it. `--json` prints the [`Export`]
//! document, every text.

use gpushare_proto::types::Export;

use super::ExitStatus;
use crate::bus::Client;
use crate::cli::{ExportArgs, ExportFormat};
use crate::error::{CtlError, Kind};
use crate::output::{Output, parse_document};

/// Runs `export`.
pub async fn run(
    client: &mut Client,
    args: &ExportArgs,
    out: &Output,
) -> Result<ExitStatus, CtlError> {
    let raw = client.call("Export", async |a| a.proxy.export().await).await?;
    if out.json {
        out.print_document(&raw, "Export")?;
        return Ok(0);
    }
    let export: Export = parse_document(&raw, "Export")?;
    out.print(text_of(&export, args.format)?);
    for warning in warnings(&export, args.format) {
        out.warn(&warning);
    }
    Ok(0)
}

/// The text `format` asks for.
fn text_of(export: &Export, format: ExportFormat) -> Result<&str, CtlError> {
    match format {
        ExportFormat::Toml => Ok(&export.text),
        ExportFormat::MigParted if export.mig_parted.is_empty() => {
            Err(outdated("mig-parted files"))
        }
        ExportFormat::MigParted => Ok(&export.mig_parted),
        ExportFormat::DevicePlugin => match &export.device_plugin_refused {
            Some(why) => Err(CtlError::ctl(Kind::Inexpressible, why.clone())),
            None if export.device_plugin.is_empty() => Err(outdated("device plugin configs")),
            None => Ok(&export.device_plugin),
        },
        ExportFormat::Labels if export.labels.is_empty() => Err(outdated("node labels")),
        ExportFormat::Labels => Ok(&export.labels),
        ExportFormat::Slurm => match &export.slurm_refused {
            Some(why) => Err(CtlError::ctl(Kind::Failed, why.clone())),
            None if export.slurm.is_empty() => Err(outdated("Slurm's gres.conf")),
            None => Ok(&export.slurm),
        },
    }
}

/// The error of an agent that does not export `what`.
fn outdated(what: &str) -> CtlError {
    CtlError::ctl(
        Kind::AgentOutdated,
        format!("the agent does not export {what}: upgrade gpushare-agent"),
    )
}

/// What stderr says besides the text, a line each: what the profile cannot say, or what
/// the mig-parted file leaves out.
fn warnings(export: &Export, format: ExportFormat) -> Vec<String> {
    match format {
        ExportFormat::Toml => {
            export.notes.iter().map(|n| format!("the export differs from the node: {n}")).collect()
        }
        ExportFormat::DevicePlugin | ExportFormat::Labels | ExportFormat::Slurm => Vec::new(),
        ExportFormat::MigParted => export
            .mig_parted_left_out
            .iter()
            .map(|l| {
                format!("left out of the mig-parted file (applying it undoes this; `export` keeps it): {l}")
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_document_carries_the_text() {
        let raw = r#"{"text":"name = \"exported\"\n[gpus.all]\nsharing = \"exclusive\"\n"}"#;
        let export: Export = parse_document(raw, "Export").unwrap();
        assert_eq!(export.text, "name = \"exported\"\n[gpus.all]\nsharing = \"exclusive\"\n");
        // An older agent's document: no mig-parted text, nothing to warn of.
        let e = text_of(&export, ExportFormat::MigParted).unwrap_err();
        assert!(e.to_string().contains("upgrade gpushare-agent"), "{e}");
        assert!(warnings(&export, ExportFormat::Toml).is_empty());
    }

    #[test]
    fn what_is_left_out_is_said_for_the_format_asked() {
        let raw = r#"{"text":"x","mig_parted":"y","notes":["GPU 3: compute mode prohibited"],
            "mig_parted_left_out":["GPUs 0-7: MPS (25% threads, 10 GiB)"]}"#;
        let export: Export = parse_document(raw, "Export").unwrap();
        assert_eq!(
            warnings(&export, ExportFormat::Toml),
            ["the export differs from the node: GPU 3: compute mode prohibited"]
        );
        let yaml = warnings(&export, ExportFormat::MigParted);
        assert_eq!(yaml.len(), 1);
        assert!(yaml[0].starts_with("left out of the mig-parted file"), "{yaml:?}");
        assert!(yaml[0].ends_with(": GPUs 0-7: MPS (25% threads, 10 GiB)"), "{yaml:?}");
    }
}
