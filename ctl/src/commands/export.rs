//! `gpushare-ctl export`: the GPUs' current state as a gpushare profile (TOML), printed as
//! the agent wrote it, so that `gpushare-ctl export > now.toml` and later
//! `gpushare-ctl apply -f now.toml` restores it. `--json` prints the [`Export`] document.

use gpushare_proto::types::Export;

use super::ExitStatus;
use crate::bus::Client;
use crate::error::CtlError;
use crate::output::{Output, parse_document};

/// Runs `export`.
pub async fn run(client: &mut Client, out: &Output) -> Result<ExitStatus, CtlError> {
    let raw = client.call("Export", async |a| a.proxy.export().await).await?;
    if out.json {
        out.print_document(&raw, "Export")?;
    } else {
        let export: Export = parse_document(&raw, "Export")?;
        out.print(&export.text);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_document_carries_the_text() {
        let raw = r#"{"text":"name = \"exported\"\n[gpus.all]\nsharing = \"exclusive\"\n"}"#;
        let export: Export = parse_document(raw, "Export").unwrap();
        assert_eq!(export.text, "name = \"exported\"\n[gpus.all]\nsharing = \"exclusive\"\n");
    }
}
