//! `gpushare-ctl export`: the GPUs' current state as a gpushare profile (TOML), printed as
//! the agent wrote it, so that `gpushare-ctl export > now.toml` and later
//! `gpushare-ctl apply -f now.toml` restores it; `--format mig-parted` prints the MIG
//! layout as NVIDIA mig-parted's config file instead, one config named `exported`
//! (`apply -f now.yaml -c exported`, or mig-parted's own `apply -f now.yaml -c exported`).
//! `--json` prints the [`Export`] document, both texts.

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
    Ok(0)
}

/// The text `format` asks for.
fn text_of(export: &Export, format: ExportFormat) -> Result<&str, CtlError> {
    match format {
        ExportFormat::Toml => Ok(&export.text),
        ExportFormat::MigParted if export.mig_parted.is_empty() => Err(CtlError::ctl(
            Kind::AgentOutdated,
            "the agent does not export mig-parted files: upgrade gpushare-agent",
        )),
        ExportFormat::MigParted => Ok(&export.mig_parted),
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
        // An older agent's document: no mig-parted text.
        let e = text_of(&export, ExportFormat::MigParted).unwrap_err();
        assert!(e.to_string().contains("upgrade gpushare-agent"), "{e}");
    }
}
