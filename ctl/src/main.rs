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
//! - `export`: the GPUs as a TOML profile, sharing included (or their MIG layout as a
//!   mig-parted file);
//! - `profiles [list | show NAME]`: the known profiles;
//! - `validate FILE`: check a profile file and plan it;
//! - `mps [status]`: the MPS servers with their state, limits, clients and pipe
//!   directories;
//! - `mps limit --pid PID [--threads PCT] [--memory SIZE]`: set the limits of the MPS
//!   server serving a client (they apply to the server's new clients);
//! - `mig profiles [GPU]`: a GPU's MIG profiles as its driver reports them (`nvidia-smi mig
//!   -lgip`'s columns, `-lgipp`'s placements) with the names gpushare profiles accept;
//! - `clients [--watch [--interval S]] [--query FIELDS [--format csv[,noheader]]]`: every
//!   process using the GPUs, attributed (user, unit or container, memory, MPS share), and
//!   the capacity no one uses; refreshed until Ctrl-C, or as CSV;
//! - `top [--interval S]`: `status` and `clients` together, one screen refreshed each
//!   second;
//! - `env GPU|MIG-UUID`: `export` lines of the variables a client needs
//!   (`eval "$(gpushare-ctl env 0)"`);
//! - `probe [--target GPU|MIG-UUID] [--clients 1,2,4,7] [--workload launch,compute,memory]
//!   [--seconds S] [--compare]`: measure what sharing costs, N CUDA client processes
//!   against a solo baseline under the current sharing (a job, followed like `apply`); with
//!   `--compare`, a bench of the built-in workload under time-slicing, MPS and limited MPS.
//! - `bench [--replicas 1,3,5,7] [--strategies …] [--duration 30s | --until-exit]
//!   [--objective latency|throughput] [--slo p99=50ms] [--report FILE.html] ... -- COMMAND`:
//!   the user's own program as N replicas under each sharing strategy, measured, with the
//!   sharing restored afterwards; which strategy, how many per GPU, what that saves
//!   (Ctrl-C cancels it);
//! - `cancel JOB`: stop a running bench early (root: anyone's), its GPU restored.
//!
//! It links the protocol crate only (names, proxies, documents, errors) and talks to the
//! agent over D-Bus. Modules:
//!
//! - [`cli`]: the command-line syntax (clap derive);
//! - [`bus`]: finding the agent on a bus and explaining call failures in one line;
//! - [`output`]: stdout/stderr, `--json`, tables;
//! - [`table`]: a table as a list of columns, each defined once (header, alignment, cell);
//! - [`error`]: the error type, with stable names for `--json`;
//! - [`commands`]: one module per verb (`run` plus pure `render_*` functions);
//! - [`job`]: following a job the agent runs (apply, probe, bench) to its end, with
//!   progress;
//! - [`report_html`]: a bench report as one self-contained HTML page with SVG charts, and
//!   the report's words the text report shares (`report_html::text`).
//!
//! Exit status: 0 on success, 1 on any failure (for `assert`, also when the profile is not
//! applied), 2 on a usage error, 130 when interrupted while following a job.
//!
//! A hidden verb serves packaging: `gpushare-ctl generate man|completions DIR` writes the
//! man pages (`gpushare-ctl.1`, one `gpushare-ctl-VERB.1` per verb) or the bash, zsh and fish
//! completions (`gpushare-ctl.bash`, `_gpushare-ctl`, `gpushare-ctl.fish`) into DIR.

mod bus;
mod cli;
mod commands;
mod error;
mod job;
mod output;
mod report_html;
#[cfg(test)]
mod report_html_tests;
mod starting;
mod table;

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::CommandFactory;

use crate::bus::{BusChoice, Client};
use crate::cli::{Cli, GenerateArgs, Generated, Hidden, Invocation};
use crate::error::{CtlError, Kind};
use crate::output::Output;

fn main() -> ExitCode {
    let cli = match cli::parse() {
        Ok(Invocation::Run(cli)) => cli,
        Ok(Invocation::Hidden(Hidden::Generate(args))) => return generate(&args),
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

/// The hidden `generate`: writes the files, prints their paths.
fn generate(args: &GenerateArgs) -> ExitCode {
    let written = std::fs::create_dir_all(&args.dir).and_then(|()| match args.what {
        Generated::Man => write_man_pages(&args.dir),
        Generated::Completions => write_completions(&args.dir),
    });
    match written {
        Ok(paths) => {
            for path in paths {
                println!("{}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gpushare-ctl: cannot write into {}: {e}", args.dir.display());
            ExitCode::FAILURE
        }
    }
}

/// `gpushare-ctl.1` and a page per verb and sub-verb (`gpushare-ctl-mps-limit.1`), which
/// the SUBCOMMANDS sections refer to.
fn write_man_pages(dir: &Path) -> io::Result<Vec<PathBuf>> {
    fn write(cmd: clap::Command, dir: &Path, paths: &mut Vec<PathBuf>) -> io::Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            write(sub.clone(), dir, paths)?;
        }
        let source = format!("gpushare-ctl {}", env!("CARGO_PKG_VERSION"));
        let page = clap_mangen::Man::new(cmd).section("1").source(source).manual("gpushare");
        paths.push(page.generate_to(dir)?);
        Ok(())
    }
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut paths = Vec::new();
    write(cmd, dir, &mut paths)?;
    Ok(paths)
}

/// Completions for bash, zsh and fish, under the names clap_complete gives them. Bash's
/// also completes profile names (asked of the agent) where a verb takes a PROFILE.
fn write_completions(dir: &Path) -> io::Result<Vec<PathBuf>> {
    use clap_complete::Shell;
    let mut cmd = Cli::command();
    let paths = [Shell::Bash, Shell::Zsh, Shell::Fish]
        .into_iter()
        .map(|shell| clap_complete::generate_to(shell, &mut cmd, "gpushare-ctl", dir))
        .collect::<io::Result<Vec<PathBuf>>>()?;
    if let Some(bash) = paths.iter().find(|p| p.extension().is_some_and(|e| e == "bash")) {
        let generated = std::fs::read_to_string(bash)?;
        std::fs::write(bash, repair_bash_cases(&generated) + BASH_PROFILE_NAMES)?;
    }
    Ok(paths)
}

/// clap_complete names a hyphenated binary's verbs two ways in its bash script: it sets
/// `cmd="gpushare__ctl__subcmd__apply"` but matches `gpushare__subcmd__ctl__subcmd__apply)`,
/// so no verb's options complete. The arms are renamed to what `cmd` holds.
fn repair_bash_cases(script: &str) -> String {
    script.replace("gpushare__subcmd__ctl", "gpushare__ctl")
}

/// Appended to clap's bash completion: the profile names the agent knows, for the
/// PROFILE of `apply`, `plan` and `assert` and the NAME of `profiles show`; everything
/// else as clap completes it.
const BASH_PROFILE_NAMES: &str = r#"
_gpushare_ctl_profiles() {
    local cur=${COMP_WORDS[COMP_CWORD]} verb=${COMP_WORDS[1]}
    if [[ $cur != -* && ${COMP_WORDS[COMP_CWORD-1]} != -* ]]; then
        if [[ ($COMP_CWORD -eq 2 && ($verb == apply || $verb == plan || $verb == assert)) ||
              ($COMP_CWORD -eq 3 && $verb == profiles && ${COMP_WORDS[2]} == show) ]]; then
            COMPREPLY=($(compgen -W "$(gpushare-ctl profiles list --names 2>/dev/null)" -- "$cur"))
            return 0
        fi
    fi
    _gpushare__ctl "$@"
}
complete -F _gpushare_ctl_profiles -o bashdefault -o default gpushare-ctl
"#;

/// Help and version go to stdout as clap prints them; usage errors are one line, on stderr
/// or with `--json` as the JSON error object on stdout, exit status 2.
fn usage_error(e: clap::Error) -> ExitCode {
    if !e.use_stderr() {
        e.exit()
    }
    let args: Vec<_> = std::env::args_os().collect();
    let error = CtlError::ctl(Kind::Usage, usage_line(&e, &args)).with_exit_code(2);
    let json = cli::args_request_json(&args);
    Output { json, stdout_tty: false, stderr_tty: false }.error(&error);
    ExitCode::from(2)
}

/// A usage error in one line: clap's reason and tips (its text up to `Usage:`), then
/// where to read more, `see 'gpushare-ctl mps limit --help'`. `args` is the command line.
fn usage_line(e: &clap::Error, args: &[OsString]) -> String {
    use clap::error::ErrorKind;
    let command = cli::verb_path(args);
    let reason = match e.kind() {
        // clap would list `help` and show the whole help text.
        ErrorKind::MissingSubcommand | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            match command.as_str() {
                "gpushare-ctl" => format!("a verb is required: {}", cli::verbs().join(", ")),
                _ => format!("a sub-verb is required: {}", cli::sub_verbs(args).join(", ")),
            }
        }
        _ => {
            let rendered = e.render().to_string();
            let mut parts: Vec<String> = Vec::new();
            for paragraph in rendered.split("\n\n") {
                if paragraph.starts_with("Usage:") || paragraph.starts_with("For more information")
                {
                    continue;
                }
                let text: Vec<&str> = paragraph.lines().map(str::trim).collect();
                let text = text.join(" ");
                let text = text.strip_prefix("error: ").unwrap_or(&text);
                let text = text.strip_prefix("tip: ").unwrap_or(text);
                if !text.is_empty() {
                    parts.push(text.to_owned());
                }
            }
            if parts.is_empty() { "invalid command line".into() } else { parts.join("; ") }
        }
    };
    format!("{reason}; see '{command} --help'")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gpushare-ctl-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn man_pages_cover_every_verb_and_hide_generate() {
        let dir = scratch_dir("man");
        std::fs::create_dir_all(&dir).unwrap();
        let paths = write_man_pages(&dir).unwrap();
        let names: Vec<String> =
            paths.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        for name in [
            "gpushare-ctl.1",
            "gpushare-ctl-apply.1",
            "gpushare-ctl-mps-limit.1",
            "gpushare-ctl-mig-profiles.1",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
        }
        assert!(!names.iter().any(|n| n.contains("generate") || n.contains("help")), "{names:?}");
        let main = std::fs::read_to_string(dir.join("gpushare-ctl.1")).unwrap();
        assert!(main.starts_with(".ie"), "{main}");
        assert!(main.contains(".TH gpushare-ctl 1"), "{main}");
        assert!(main.contains("gpushare\\-ctl\\-apply(1)"), "{main}");
        assert!(!main.contains("generate"), "{main}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn completions_for_three_shells() {
        let dir = scratch_dir("completions");
        std::fs::create_dir_all(&dir).unwrap();
        let paths = write_completions(&dir).unwrap();
        assert_eq!(paths.len(), 3);
        for name in ["gpushare-ctl.bash", "_gpushare-ctl", "gpushare-ctl.fish"] {
            let text = std::fs::read_to_string(dir.join(name)).unwrap();
            assert!(text.contains("apply") && text.contains("json"), "{name}");
            assert!(!text.contains("generate"), "{name}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// What bash offers for the words `line` (the last one being completed), with the
    /// completion script loaded as bash-completion loads it.
    fn bash_completes(script: &Path, line: &[&str]) -> Vec<String> {
        let words: Vec<String> = line.iter().map(|w| format!("'{w}'")).collect();
        let current = line.len() - 1;
        let program = format!(
            "source '{}'\nCOMP_WORDS=({})\nCOMP_CWORD={current}\nCOMP_LINE='{}'\n\
             _gpushare_ctl_profiles gpushare-ctl '{}' '{}'\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
            script.display(),
            words.join(" "),
            line.join(" "),
            line[current],
            line[current - 1],
        );
        let out = std::process::Command::new("bash")
            .args(["--norc", "--noprofile", "-c", &program])
            .env("PATH", "/usr/bin:/bin")
            .output()
            .expect("bash runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
    }

    #[test]
    fn bash_completes_every_verbs_options() {
        let dir = scratch_dir("bash-completion");
        std::fs::create_dir_all(&dir).unwrap();
        write_completions(&dir).unwrap();
        let script = dir.join("gpushare-ctl.bash");
        let apply = bash_completes(&script, &["gpushare-ctl", "apply", "--"]);
        for option in ["--file", "--config", "--force", "--dry-run", "--json", "--address"] {
            assert!(apply.iter().any(|o| o == option), "apply --: {option} not in {apply:?}");
        }
        let bench = bash_completes(&script, &["gpushare-ctl", "bench", "--"]);
        for option in ["--replicas", "--strategies", "--duration", "--until-exit", "--report"] {
            assert!(bench.iter().any(|o| o == option), "bench --: {option} not in {bench:?}");
        }
        // The strategies' names, not file names (issue 37, item 8).
        let strategies = bash_completes(&script, &["gpushare-ctl", "bench", "--strategies", ""]);
        assert_eq!(strategies, ["time-slicing", "mps", "mps-limited", "mig"]);
        let limit = bash_completes(&script, &["gpushare-ctl", "mps", "limit", "--"]);
        assert!(!limit.is_empty() && limit.iter().all(|o| o.starts_with("--")), "{limit:?}");
        let mig = bash_completes(&script, &["gpushare-ctl", "mig", "p"]);
        assert_eq!(mig, ["profiles"]);
        let profiles = bash_completes(&script, &["gpushare-ctl", "mig", "profiles", "--"]);
        assert!(profiles.iter().any(|o| o == "--json"), "{profiles:?}");
        let verbs = bash_completes(&script, &["gpushare-ctl", "ap"]);
        assert_eq!(verbs, ["apply"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn usage_line_of(args: &[&str]) -> String {
        let args: Vec<OsString> =
            std::iter::once("gpushare-ctl").chain(args.iter().copied()).map(Into::into).collect();
        let e = cli::parse_from(args.clone()).expect_err("a usage error");
        usage_line(&e, &args)
    }

    #[test]
    fn usage_errors_become_one_line() {
        assert_eq!(
            usage_line_of(&["apply"]),
            "the following required arguments were not provided: <PROFILE|--file <FILE>>; see 'gpushare-ctl apply --help'"
        );
        assert_eq!(
            usage_line_of(&["bogus"]),
            "unrecognized subcommand 'bogus'; see 'gpushare-ctl --help'"
        );
        assert_eq!(
            usage_line_of(&["--json", "stauts"]),
            "unrecognized subcommand 'stauts'; a similar subcommand exists: 'status'; see 'gpushare-ctl --help'"
        );
        let verbs = "apply, plan, assert, status, export, profiles, validate, mps, mig, gpu, env, cdi, clients, top, probe, bench, cancel";
        for args in [&[][..], &["--json"], &["--address", "session"]] {
            assert_eq!(
                usage_line_of(args),
                format!("a verb is required: {verbs}; see 'gpushare-ctl --help'")
            );
        }
        for args in [&["mig"][..], &["--json", "mig"]] {
            assert_eq!(
                usage_line_of(args),
                "a sub-verb is required: profiles; see 'gpushare-ctl mig --help'"
            );
        }
        assert_eq!(
            usage_line_of(&["mig", "profiles", "0", "1"]),
            "unexpected argument '1' found; see 'gpushare-ctl mig profiles --help'"
        );
        assert_eq!(
            usage_line_of(&["probe", "--workload", "flops"]),
            "invalid value 'flops' for '--workload <NAME,…>' [possible values: launch, compute, memory]; see 'gpushare-ctl probe --help'"
        );
        assert_eq!(
            usage_line_of(&["mps", "limit", "--pid", "0", "--threads", "5"]),
            "invalid value '0' for '--pid <PID>': 0 is not in 1..=4294967295; see 'gpushare-ctl mps limit --help'"
        );
        for args in [
            &["status", "--bogus"][..],
            &["apply", "x", "-c", "y"],
            &["mps", "limit", "--pid", "1"],
            &["help", "bogus"],
            &["generate", "pdf", "d"],
            &["--address"],
        ] {
            let line = usage_line_of(args);
            assert!(!line.contains('\n') && !line.starts_with("error"), "{args:?}: {line}");
            assert!(line.ends_with(" --help'"), "{args:?}: {line}");
        }
    }
}
