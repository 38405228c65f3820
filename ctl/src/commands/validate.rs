//! `gpushare-ctl validate FILE`: checks a profile file with the agent (the agent parses it,
//! so ctl and agent never disagree about the format) and plans it against this node.
//!
//! ```text
//! lab.toml: valid profile lab
//!   1. GPU 0: enable MIG mode
//! 1 step on 1 GPU; nothing has been changed
//! ```
//!
//! An invalid file fails with the agent's reason, which names `file:line:column`.

use gpushare_proto::types::Validation;

use super::ExitStatus;
use super::plan::render_plan;
use super::source::read_document;
use crate::bus::Client;
use crate::error::CtlError;
use crate::output::{Output, parse_document};

/// Runs `validate FILE` (`-` reads standard input).
pub async fn run(client: &mut Client, out: &Output, file: &str) -> Result<ExitStatus, CtlError> {
    let (text, origin) = read_document(file)?;
    let raw = client
        .call("ValidateProfile", async |a| a.proxy.validate_profile(&text, &origin).await)
        .await?;
    if out.json {
        out.print_document(&raw, "Validation")?;
    } else {
        let validation: Validation = parse_document(&raw, "Validation")?;
        out.print(&render_validation(&origin, &validation));
    }
    Ok(0)
}

/// `FILE: valid profile NAME`, then the plan as `plan` prints it.
pub fn render_validation(origin: &str, validation: &Validation) -> String {
    format!("{origin}: valid profile {}\n{}", validation.name, render_plan(&validation.plan))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::plan::tests::sample_plan;

    #[test]
    fn valid_profile_with_plan() {
        let v = Validation { name: "half-balanced".into(), plan: sample_plan(1) };
        assert_eq!(
            render_validation("lab.toml", &v),
            "lab.toml: valid profile half-balanced\n  1. GPU 0: enable MIG mode\n1 step on 1 GPU; nothing has been changed\n"
        );
    }
}
