//! `gpushare-ctl`: the command-line client of gpushare-agent.
//!
//! Verbs:
//!
//! - `apply PROFILE | -f FILE [-c NAME] [--dry-run] [--force]`: apply a profile as a job
//!   and follow it (`-f` takes a gpushare TOML profile or NVIDIA mig-parted's
//!   `config.yaml` with `-c` naming the config, `-` for stdin);
//! - `plan PROFILE | -f FILE [-c NAME]`: the steps an apply would take;
//! - `assert PROFILE | -f FILE [-c NAME]`: exit 0 exactly when the profile is applied;
//! - `status`: the GPUs, their sharing (MPS limits, time-slice interval), the active
//!   profile, an apply in progress;
//! - `export`: the GPUs' current state as a TOML profile;
//! - `profiles [list | show NAME]`: the known profiles;
//! - `validate FILE`: check a profile file and plan it;
//! - `mps [status]`: the MPS servers with their state, limits, clients and pipe
//!   directories;
//! - `mps limit --pid PID [--threads PCT] [--memory SIZE]`: set the limits of the MPS
//!   server serving a client (they apply to the server's new clients);
//! - `env GPU|MIG-UUID`: `export` lines of the variables a client needs
//!   (`eval "$(gpushare-ctl env 0)"`).
//!
//! It links the protocol crate only (names, proxies, documents, errors) and talks to the
//! agent over D-Bus. Modules:
//!
//! - [`cli`]: the command-line syntax (clap derive);
//! - [`bus`]: finding the agent on a bus and explaining call failures in one line;
//! - [`output`]: stdout/stderr, `--json`, tables;
//! - [`error`]: the error type, with stable names for `--json`;
//! - [`commands`]: one module per verb (`run` plus pure `render_*` functions).
//!
//! Exit status: 0 on success, 1 on any failure (for `assert`, also when the profile is not
//! applied), 2 on a usage error, 130 when interrupted while following a job.

mod bus;
mod cli;
mod commands;
mod error;
mod output;

use std::process::ExitCode;

use clap::Parser;

use crate::bus::{BusChoice, Client};
use crate::cli::Cli;
use crate::error::{CtlError, Kind};
use crate::output::Output;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let out = Output::detect(cli.json);
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            out.error(&CtlError::ctl(Kind::Failed, format!("cannot start the async runtime: {e}")));
            return ExitCode::FAILURE;
        }
    };
    let mut client = Client::new(BusChoice::parse(cli.address.as_deref()));
    match runtime.block_on(commands::run(cli.command, &mut client, &out)) {
        Ok(status) => ExitCode::from(status),
        Err(e) => {
            out.error(&e);
            ExitCode::from(e.exit_code)
        }
    }
}

/// Help and version go to stdout as clap prints them; real usage errors are clap's text on
/// stderr (exit 2), or with `--json` the JSON error object on stdout (exit 2).
fn usage_error(e: clap::Error) -> ExitCode {
    if e.use_stderr() && cli::args_request_json(std::env::args_os()) {
        let error =
            CtlError::ctl(Kind::Usage, usage_message(&e.render().to_string())).with_exit_code(2);
        Output { json: true, stdout_tty: false, stderr_tty: false }.error(&error);
        return ExitCode::from(2);
    }
    e.exit()
}

/// The reason part of clap's usage error text (up to the first blank line), on one line,
/// without the `error: ` prefix.
fn usage_message(rendered: &str) -> String {
    let reason: Vec<&str> = rendered.lines().map(str::trim).take_while(|l| !l.is_empty()).collect();
    let reason = reason.join(" ");
    let reason = reason.strip_prefix("error: ").unwrap_or(&reason).to_owned();
    if reason.is_empty() { "invalid command line".into() } else { reason }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn usage_errors_become_one_line() {
        let e = Cli::try_parse_from(["gpushare-ctl", "apply"]).unwrap_err();
        assert_eq!(
            usage_message(&e.render().to_string()),
            "the following required arguments were not provided: <PROFILE|--file <FILE>>"
        );
        let e = Cli::try_parse_from(["gpushare-ctl", "bogus"]).unwrap_err();
        assert_eq!(usage_message(&e.render().to_string()), "unrecognized subcommand 'bogus'");
    }
}
