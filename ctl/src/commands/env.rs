//! `gpushare-ctl env GPU|MIG-UUID`: the variables a client needs to use a GPU or MIG
//! instance as the active profile shares it, as shell code:
//!
//! ```text
//! export CUDA_VISIBLE_DEVICES='MIG-11111111-1111-1111-1111-111111111111'
//! export CUDA_MPS_PIPE_DIRECTORY='/run/gpushare/mps/MIG-11111111-1111-1111-1111-111111111111/pipe'
//! ```
//!
//! so that `eval "$(gpushare-ctl env 0)"` sets them. Nothing else goes to stdout; values are
//! single-quoted, and a variable name that is not a shell name is refused rather than
//! handed to `eval`. `--json` prints the [`ClientEnv`] document.

use gpushare_proto::types::ClientEnv;

use super::ExitStatus;
use crate::bus::Client;
use crate::error::{CtlError, Kind};
use crate::output::{Output, parse_document};

/// Runs `env`.
pub async fn run(client: &mut Client, out: &Output, target: &str) -> Result<ExitStatus, CtlError> {
    let raw = client.call("Env", async |a| a.proxy.env(target).await).await?;
    if out.json {
        out.print_document(&raw, "ClientEnv")?;
        return Ok(0);
    }
    let env: ClientEnv = parse_document(&raw, "ClientEnv")?;
    let text = render_exports(&env)?;
    if text.is_empty() {
        out.warn(&format!("the agent named no variables for {} ({})", env.uuid, env.strategy));
    } else {
        out.print(&text);
    }
    Ok(0)
}

/// `value` in single quotes for a POSIX shell: `it's` becomes `'it'\''s'`.
pub fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// Whether `name` can be exported by a POSIX shell: `[A-Za-z_][A-Za-z0-9_]*`.
fn is_shell_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// One `export NAME='value'` line per variable, in the agent's order.
pub fn render_exports(env: &ClientEnv) -> Result<String, CtlError> {
    let mut out = String::new();
    for (name, value) in &env.variables {
        if !is_shell_name(name) || value.contains('\0') {
            return Err(CtlError::ctl(
                Kind::BadReply,
                format!(
                    "the agent sent the variable {name:?}, which a shell cannot export; are gpushare-ctl and gpushare-agent the same version?"
                ),
            ));
        }
        out.push_str(&format!("export {name}={}\n", shell_quote(value)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(variables: &[(&str, &str)]) -> ClientEnv {
        ClientEnv {
            uuid: "MIG-11111111-1111-1111-1111-111111111111".into(),
            strategy: "mps".into(),
            variables: variables.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
        }
    }

    #[test]
    fn export_lines_quote_values() {
        let text = render_exports(&env(&[
            ("CUDA_VISIBLE_DEVICES", "MIG-11111111-1111-1111-1111-111111111111"),
            ("CUDA_MPS_PIPE_DIRECTORY", "/run/gpushare/mps/it's here"),
            ("EMPTY", ""),
        ]))
        .unwrap();
        assert_eq!(
            text,
            "export CUDA_VISIBLE_DEVICES='MIG-11111111-1111-1111-1111-111111111111'\n\
             export CUDA_MPS_PIPE_DIRECTORY='/run/gpushare/mps/it'\\''s here'\n\
             export EMPTY=''\n"
        );
        assert_eq!(render_exports(&env(&[])).unwrap(), "");
    }

    #[test]
    fn quoted_values_survive_a_shell() {
        let value = "a'b \"$HOME\" `x` \\ ''\nc";
        let text = render_exports(&env(&[("GPUSHARE_TEST_VALUE", value)])).unwrap();
        let Ok(output) = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{text}printf %s \"$GPUSHARE_TEST_VALUE\""))
            .output()
        else {
            return; // no shell here
        };
        assert_eq!(String::from_utf8_lossy(&output.stdout), value);
    }

    #[test]
    fn names_a_shell_cannot_export_are_refused() {
        for bad in ["", "1X", "A-B", "A=B", "X;rm", "X Y"] {
            let e = render_exports(&env(&[(bad, "v")])).unwrap_err();
            assert!(e.is(Kind::BadReply), "{bad}: {e:?}");
        }
        assert!(render_exports(&env(&[("A", "x\0y")])).is_err());
        assert!(render_exports(&env(&[("_a1", "v")])).is_ok());
    }

    #[test]
    fn env_document_parses() {
        let raw = r#"{"uuid":"GPU-0","strategy":"time-slicing","variables":[["CUDA_VISIBLE_DEVICES","GPU-0"]]}"#;
        let env: ClientEnv = parse_document(raw, "ClientEnv").unwrap();
        assert_eq!(render_exports(&env).unwrap(), "export CUDA_VISIBLE_DEVICES='GPU-0'\n");
    }
}
