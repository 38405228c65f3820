//! The profile a verb works on, `PROFILE` or `-f FILE [-c NAME]`, and the one call that
//! differs between the two for planning: `Plan` or `PlanDocument`. (Applying differs the
//! same way, `Apply` or `ApplyDocument`; see [`super::apply`].)
//!
//! A file is read here, in ctl, and sent as text with the path as given as its origin
//! (`<stdin>` for `-`), so the agent needs no access to the caller's files and names the
//! file in its messages. The agent tells the formats apart: a gpushare profile (TOML), or
//! NVIDIA mig-parted's `config.yaml` with `-c` naming one of its `mig-configs`.

use std::io::Read;

use gpushare_proto::{PROFILE_MAX_BYTES, profile_too_large};

use crate::bus::Client;
use crate::cli::ProfileSource;
use crate::error::{CtlError, Kind};

/// A profile, resolved from the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A known profile, by name.
    Named(String),
    /// A profile document read from a file.
    Document {
        /// The document's text.
        text: String,
        /// The file as given on the command line, `<stdin>` for `-`.
        origin: String,
        /// The mig-parted config to use (`-c`), empty when not given.
        config: String,
    },
}

impl Source {
    /// Resolves the command line's profile, reading the file if one is given.
    pub fn from_args(args: &ProfileSource) -> Result<Self, CtlError> {
        match (&args.profile, &args.file) {
            (_, Some(file)) => {
                let (text, origin) = read_document(file)?;
                Ok(Source::Document {
                    text,
                    origin,
                    config: args.config.clone().unwrap_or_default(),
                })
            }
            (Some(profile), None) => Ok(Source::Named(profile.clone())),
            // clap's group requires one of the two; this is for completeness only.
            (None, None) => {
                Err(CtlError::ctl(Kind::Usage, "give a profile name or -f FILE").with_exit_code(2))
            }
        }
    }
}

/// Reads a profile document and the name to give it in messages (`-` reads standard
/// input, named `<stdin>`). Fails with one line naming the file, also for a document over
/// [`PROFILE_MAX_BYTES`], of which no more is read: a pipe or `/dev/zero` may never end.
pub fn read_document(file: &str) -> Result<(String, String), CtlError> {
    let origin = if file == "-" { "<stdin>" } else { file };
    let read_error = |e: std::io::Error| {
        let reason = if e.kind() == std::io::ErrorKind::InvalidData {
            "it is not UTF-8 text".to_owned()
        } else {
            e.to_string()
        };
        CtlError::ctl(Kind::ReadFile, format!("cannot read {file}: {reason}"))
    };
    let bytes = if file == "-" {
        read_bounded(std::io::stdin().lock())
    } else {
        std::fs::File::open(file).and_then(read_bounded)
    }
    .map_err(read_error)?;
    if bytes.len() > PROFILE_MAX_BYTES {
        return Err(CtlError::ctl(Kind::ReadFile, format!("{origin}: {}", profile_too_large())));
    }
    let text =
        String::from_utf8(bytes).map_err(|_| read_error(std::io::ErrorKind::InvalidData.into()))?;
    // D-Bus strings hold no NUL: sent, it would cost ctl its connection to the bus.
    if let Some(at) = text.find('\0') {
        let line = text[..at].matches('\n').count() + 1;
        return Err(CtlError::ctl(
            Kind::ReadFile,
            format!("cannot read {file}: it is not text (a NUL byte on line {line})"),
        ));
    }
    Ok((text, origin.to_owned()))
}

/// Up to one byte more than a profile may have: enough to tell that it is too large.
fn read_bounded(reader: impl Read) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    reader.take(PROFILE_MAX_BYTES as u64 + 1).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The plan of `source` against this node: a [`gpushare_proto::types::PlanReport`] as JSON.
pub async fn plan(client: &mut Client, source: &Source) -> Result<String, CtlError> {
    match source {
        Source::Named(profile) => client.call("Plan", async |a| a.proxy.plan(profile).await).await,
        Source::Document { text, origin, config } => {
            client
                .call("PlanDocument", async |a| a.proxy.plan_document(text, origin, config).await)
                .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(profile: Option<&str>, file: Option<&str>, config: Option<&str>) -> ProfileSource {
        ProfileSource {
            profile: profile.map(str::to_owned),
            file: file.map(str::to_owned),
            config: config.map(str::to_owned),
        }
    }

    #[test]
    fn names_and_files() {
        assert_eq!(
            Source::from_args(&args(Some("all-mps"), None, None)).unwrap(),
            Source::Named("all-mps".into())
        );
        let path = std::env::temp_dir()
            .join(format!("gpushare-ctl-test-source-{}.yaml", std::process::id()));
        std::fs::write(&path, "version: v1\nmig-configs: {}\n").unwrap();
        let file = path.to_str().unwrap();
        let with_config = Source::from_args(&args(None, Some(file), Some("all-balanced")));
        let without = Source::from_args(&args(None, Some(file), None));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            with_config.unwrap(),
            Source::Document {
                text: "version: v1\nmig-configs: {}\n".into(),
                origin: file.into(),
                config: "all-balanced".into(),
            }
        );
        assert!(matches!(without.unwrap(), Source::Document { config, .. } if config.is_empty()));
        let e = Source::from_args(&args(None, None, None)).unwrap_err();
        assert_eq!(e.exit_code, 2);
    }

    #[test]
    fn unreadable_files_are_named() {
        let e = read_document("/nonexistent/lab.toml").unwrap_err();
        assert!(e.is(Kind::ReadFile));
        assert!(e.message.starts_with("cannot read /nonexistent/lab.toml: "), "{}", e.message);
        let e = Source::from_args(&args(None, Some("/nonexistent/config.yaml"), Some("x")))
            .unwrap_err();
        assert!(e.message.starts_with("cannot read /nonexistent/config.yaml: "), "{}", e.message);
        let dir = std::env::temp_dir();
        let e = read_document(dir.to_str().unwrap()).unwrap_err();
        assert!(e.message.starts_with("cannot read "), "{}", e.message);
        assert!(!e.message.contains('\n'));
        let path = dir.join(format!("gpushare-ctl-test-{}.toml", std::process::id()));
        std::fs::write(&path, [0xff, 0xfe, b'x']).unwrap();
        let e = read_document(path.to_str().unwrap()).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(e.message.ends_with(": it is not UTF-8 text"), "{}", e.message);
        let path = dir.join(format!("gpushare-ctl-test-nul-{}.toml", std::process::id()));
        std::fs::write(&path, b"name = \"x\"\0\n").unwrap();
        let e = read_document(path.to_str().unwrap()).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(e.message.ends_with(": it is not text (a NUL byte on line 1)"), "{}", e.message);
    }

    #[test]
    fn documents_end_at_the_size_limit() {
        let e = read_document("/dev/zero").unwrap_err();
        assert!(e.is(Kind::ReadFile));
        assert_eq!(e.message, "/dev/zero: larger than 256 KiB, the most a profile may be");
        let path = std::env::temp_dir()
            .join(format!("gpushare-ctl-test-limit-{}.toml", std::process::id()));
        std::fs::write(&path, vec![b'#'; PROFILE_MAX_BYTES]).unwrap();
        let at_limit = read_document(path.to_str().unwrap());
        std::fs::write(&path, vec![b'#'; PROFILE_MAX_BYTES + 1]).unwrap();
        let over = read_document(path.to_str().unwrap());
        std::fs::remove_file(&path).unwrap();
        assert_eq!(at_limit.unwrap().0.len(), PROFILE_MAX_BYTES);
        assert!(
            over.unwrap_err().message.ends_with(": larger than 256 KiB, the most a profile may be")
        );
    }
}
