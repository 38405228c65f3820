//! Command-line syntax of `gpushare-ctl` (clap derive).
//!
//! Global options (`--json`, `--address`) are accepted before or after the verb. A new verb
//! is a new variant of [`Command`] plus a module under `commands/` that runs it.

use clap::{Args, Parser, Subcommand};
use gpushare_proto::BUS_ADDRESS_ENV;

/// Drives gpushare-agent: applies GPU sharing profiles (MIG, MPS, time-slicing) and shows
/// the GPUs' state.
#[derive(Debug, Parser)]
#[command(name = "gpushare-ctl", version, about)]
pub struct Cli {
    /// Print exactly one JSON object on stdout (errors too); no prompts, no progress.
    #[arg(long, global = true)]
    pub json: bool,

    /// Bus of the agent: `system`, `session`, or a D-Bus address (`unix:path=/run/x`).
    ///
    /// By default ctl calls the agent on the system bus and, when nobody serves
    /// io.gpushare.Agent1 there and DBUS_SESSION_BUS_ADDRESS is set, on the session bus.
    #[arg(long, global = true, value_name = "ADDR", env = BUS_ADDRESS_ENV)]
    pub address: Option<String>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply a sharing profile to the GPUs (the agent runs it as a job and reports progress).
    Apply(ApplyArgs),
    /// Show the steps applying a profile would take, changing nothing.
    Plan(PlanArgs),
    /// Show the GPUs, their MIG instances and sharing, and the active profile.
    Status,
    /// List the known profiles, or show one.
    Profiles(ProfilesArgs),
    /// Check a profile file and plan it against this node, changing nothing.
    Validate(ValidateArgs),
}

/// Arguments of `apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// Profile name (see `gpushare-ctl profiles`).
    pub profile: String,
    /// Print the plan instead of applying it (same as `plan PROFILE`).
    #[arg(long)]
    pub dry_run: bool,
    /// Proceed although compute processes use what must change (they will lose their GPU).
    #[arg(long)]
    pub force: bool,
}

/// Arguments of `plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Profile name (see `gpushare-ctl profiles`).
    pub profile: String,
}

/// Arguments of `profiles`.
#[derive(Debug, Args)]
pub struct ProfilesArgs {
    /// `list` (the default) or `show NAME`.
    #[command(subcommand)]
    pub command: Option<ProfilesCommand>,
}

/// Sub-verbs of `profiles`.
#[derive(Debug, Subcommand)]
pub enum ProfilesCommand {
    /// List the known profiles; `*` marks the active one.
    List,
    /// Show one profile's source text.
    Show {
        /// Profile name.
        name: String,
    },
}

/// Arguments of `validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Profile file (TOML) to check; `-` reads standard input.
    pub file: String,
}

/// Whether the raw arguments ask for `--json`, for reporting usage errors before clap has
/// parsed anything.
pub fn args_request_json<I, S>(args: I) -> bool
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    args.into_iter()
        .skip(1)
        .take_while(|a| a.as_ref() != "--")
        .any(|a| a.as_ref() == "--json")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("gpushare-ctl").chain(args.iter().copied()))
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn global_options_go_before_or_after_the_verb() {
        let cli = parse(&["status", "--json"]).unwrap();
        assert!(cli.json);
        assert!(matches!(cli.command, Command::Status));
        let cli = parse(&["--json", "--address", "session", "status"]).unwrap();
        assert!(cli.json);
        assert_eq!(cli.address.as_deref(), Some("session"));
    }

    #[test]
    fn apply_flags() {
        let cli = parse(&["apply", "half-balanced", "--dry-run", "--force"]).unwrap();
        match cli.command {
            Command::Apply(a) => {
                assert_eq!(a.profile, "half-balanced");
                assert!(a.dry_run && a.force);
            }
            other => panic!("{other:?}"),
        }
        let cli = parse(&["apply", "all-mps"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Apply(ApplyArgs {
                dry_run: false,
                force: false,
                ..
            })
        ));
    }

    #[test]
    fn profiles_defaults_to_list() {
        let cli = parse(&["profiles"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Profiles(ProfilesArgs { command: None })
        ));
        let cli = parse(&["profiles", "list"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Profiles(ProfilesArgs {
                command: Some(ProfilesCommand::List)
            })
        ));
        let cli = parse(&["profiles", "show", "all-mps"]).unwrap();
        match cli.command {
            Command::Profiles(ProfilesArgs {
                command: Some(ProfilesCommand::Show { name }),
            }) => {
                assert_eq!(name, "all-mps")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn usage_errors() {
        use clap::error::ErrorKind;
        assert_eq!(
            parse(&["apply"]).unwrap_err().kind(),
            ErrorKind::MissingRequiredArgument
        );
        assert_eq!(
            parse(&["frobnicate"]).unwrap_err().kind(),
            ErrorKind::InvalidSubcommand
        );
        assert_eq!(
            parse(&["status", "--bogus"]).unwrap_err().kind(),
            ErrorKind::UnknownArgument
        );
        assert_eq!(
            parse(&["validate"]).unwrap_err().kind(),
            ErrorKind::MissingRequiredArgument
        );
        assert_eq!(
            parse(&["profiles", "show"]).unwrap_err().kind(),
            ErrorKind::MissingRequiredArgument
        );
        let e = parse(&[]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn json_request_is_seen_in_raw_args() {
        assert!(args_request_json(["gpushare-ctl", "apply", "--json"]));
        assert!(!args_request_json([
            "gpushare-ctl",
            "apply",
            "--",
            "--json"
        ]));
        assert!(!args_request_json(["--json"]));
    }
}
