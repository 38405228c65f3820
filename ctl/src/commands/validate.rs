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

use std::io::Read;

use gpushare_proto::types::Validation;

use super::ExitStatus;
use super::plan::render_plan;
use crate::bus::Client;
use crate::error::{CtlError, Kind};
use crate::output::{Output, parse_document};

/// Runs `validate FILE` (`-` reads standard input).
pub async fn run(client: &mut Client, out: &Output, file: &str) -> Result<ExitStatus, CtlError> {
    let (text, origin) = read_profile(file)?;
    let raw = client
        .call("ValidateProfile", async |a| {
            a.proxy.validate_profile(&text, &origin).await
        })
        .await?;
    if out.json {
        out.print_document(&raw, "Validation")?;
    } else {
        let validation: Validation = parse_document(&raw, "Validation")?;
        out.print(&render_validation(&origin, &validation));
    }
    Ok(0)
}

/// Reads the profile text and the name to give it in messages.
fn read_profile(file: &str) -> Result<(String, String), CtlError> {
    let read_error = |e: std::io::Error| {
        let reason = if e.kind() == std::io::ErrorKind::InvalidData {
            "it is not UTF-8 text".to_owned()
        } else {
            e.to_string()
        };
        CtlError::ctl(Kind::ReadFile, format!("cannot read {file}: {reason}"))
    };
    if file == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(read_error)?;
        return Ok((text, "<stdin>".into()));
    }
    let text = std::fs::read_to_string(file).map_err(read_error)?;
    Ok((text, file.to_owned()))
}

/// `FILE: valid profile NAME`, then the plan as `plan` prints it.
pub fn render_validation(origin: &str, validation: &Validation) -> String {
    format!(
        "{origin}: valid profile {}\n{}",
        validation.name,
        render_plan(&validation.plan)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::plan::tests::sample_plan;

    #[test]
    fn valid_profile_with_plan() {
        let v = Validation {
            name: "half-balanced".into(),
            plan: sample_plan(1),
        };
        assert_eq!(
            render_validation("lab.toml", &v),
            "lab.toml: valid profile half-balanced\n  1. GPU 0: enable MIG mode\n1 step on 1 GPU; nothing has been changed\n"
        );
    }

    #[test]
    fn unreadable_files_are_named() {
        let e = read_profile("/nonexistent/lab.toml").unwrap_err();
        assert!(e.is(Kind::ReadFile));
        assert!(
            e.message.starts_with("cannot read /nonexistent/lab.toml: "),
            "{}",
            e.message
        );
        let dir = std::env::temp_dir();
        let e = read_profile(dir.to_str().unwrap()).unwrap_err();
        assert!(e.message.starts_with("cannot read "), "{}", e.message);
        let path = dir.join(format!("gpushare-ctl-test-{}.toml", std::process::id()));
        std::fs::write(&path, [0xff, 0xfe, b'x']).unwrap();
        let e = read_profile(path.to_str().unwrap()).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(
            e.message.ends_with(": it is not UTF-8 text"),
            "{}",
            e.message
        );
    }
}
