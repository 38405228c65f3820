//! `gpushare-ctl profiles [list [--names]]` and `gpushare-ctl profiles show NAME`.
//!
//! ```text
//!    NAME           SOURCE                                   DESCRIPTION
//! *  half-balanced  built-in                                 First half in balanced MIG, ...
//!    lab            /etc/gpushare/profiles.d/lab.toml        ...
//! ```
//!
//! Profile files that failed to load follow as warnings on stderr. `show` prints a few
//! `#` comment lines (name, source, description) and then the TOML text, so its output is
//! itself a valid profile file.

use gpushare_proto::types::{ProfileDetail, ProfileList, ProfileSummary};

use super::ExitStatus;
use crate::bus::Client;
use crate::cli::ProfilesCommand;
use crate::error::CtlError;
use crate::output::{Output, parse_document};
use crate::table::Columns;

/// Runs `profiles` (`list` when no sub-verb is given).
pub async fn run(
    client: &mut Client,
    out: &Output,
    command: Option<ProfilesCommand>,
) -> Result<ExitStatus, CtlError> {
    match command.unwrap_or(ProfilesCommand::List { names: false }) {
        ProfilesCommand::List { names } => {
            let raw = client.call("ListProfiles", async |a| a.proxy.list_profiles().await).await?;
            if out.json {
                out.print_document(&raw, "ProfileList")?;
                return Ok(0);
            }
            let list: ProfileList = parse_document(&raw, "ProfileList")?;
            if names {
                let lines: String = list.profiles.iter().map(|p| format!("{}\n", p.name)).collect();
                out.print(&lines);
                return Ok(0);
            }
            out.print(&render_list(&list));
            for error in &list.errors {
                out.warn(error);
            }
        }
        ProfilesCommand::Show { name } => {
            let raw =
                client.call("ShowProfile", async |a| a.proxy.show_profile(&name).await).await?;
            if out.json {
                out.print_document(&raw, "ProfileDetail")?;
                return Ok(0);
            }
            let detail: ProfileDetail = parse_document(&raw, "ProfileDetail")?;
            out.print(&render_detail(&detail));
        }
    }
    Ok(0)
}

/// The profile table; `*` marks the active profile.
pub fn render_list(list: &ProfileList) -> String {
    if list.profiles.is_empty() {
        return "No profiles.\n".into();
    }
    profile_columns().render(&list.profiles)
}

/// The profile table's columns.
fn profile_columns() -> Columns<'static, ProfileSummary> {
    Columns::<ProfileSummary>::new()
        .left("", |p| if p.active { "*" } else { "" }.to_owned())
        .left("NAME", |p| p.name.clone())
        .left("SOURCE", |p| p.source.clone())
        .left("DESCRIPTION", |p| p.description.clone())
}

/// Comment lines about the profile, then its TOML text.
pub fn render_detail(detail: &ProfileDetail) -> String {
    let s = &detail.summary;
    let mut out = format!(
        "# profile: {}{}\n# source: {}\n",
        s.name,
        if s.active { " (active)" } else { "" },
        s.source
    );
    if !s.description.is_empty() {
        out.push_str(&format!("# description: {}\n", s.description));
    }
    out.push('\n');
    out.push_str(&detail.text);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_proto::types::ProfileSummary;

    fn summary(name: &str, source: &str, description: &str, active: bool) -> ProfileSummary {
        ProfileSummary {
            name: name.into(),
            description: description.into(),
            source: source.into(),
            active,
        }
    }

    #[test]
    fn list_marks_the_active_profile() {
        let list = ProfileList {
            profiles: vec![
                summary("all-mps", "built-in", "MPS on every GPU", false),
                summary(
                    "half-balanced",
                    "built-in",
                    "First half balanced MIG, second half whole",
                    true,
                ),
                summary("lab", "/etc/gpushare/profiles.d/lab.toml", "", false),
            ],
            errors: vec!["/etc/gpushare/profiles.d/bad.toml:3:1: unknown field `migg`".into()],
        };
        let text = render_list(&list);
        let expected = "   NAME           SOURCE                             DESCRIPTION
   all-mps        built-in                           MPS on every GPU
*  half-balanced  built-in                           First half balanced MIG, second half whole
   lab            /etc/gpushare/profiles.d/lab.toml
";
        assert_eq!(text, expected, "\n{text}");
        assert_eq!(
            render_list(&ProfileList { profiles: vec![], errors: vec![] }),
            "No profiles.\n"
        );
    }

    #[test]
    fn show_prints_comments_then_the_text() {
        let detail = ProfileDetail {
            summary: summary("all-mps", "built-in", "MPS on every GPU", true),
            text: "name = \"all-mps\"\n[gpus.all]\nsharing = \"mps\"".into(),
        };
        assert_eq!(
            render_detail(&detail),
            "# profile: all-mps (active)\n# source: built-in\n# description: MPS on every GPU\n\nname = \"all-mps\"\n[gpus.all]\nsharing = \"mps\"\n"
        );
    }

    #[test]
    fn detail_document_is_flat() {
        let raw = r#"{"name":"x","description":"d","source":"built-in","active":false,"text":"t"}"#;
        let d: ProfileDetail = parse_document(raw, "ProfileDetail").unwrap();
        assert_eq!(d.summary.name, "x");
        assert_eq!(d.text, "t");
    }
}
