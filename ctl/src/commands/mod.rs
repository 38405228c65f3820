//! The verbs, one module each. Each module has a `run` that talks to the agent through
//! [`Client`] and prints through [`Output`], and pure `render_*` functions from the proto
//! documents to text, unit-tested with hand-built documents.
//!
//! Adding a verb: a variant in [`crate::cli::Command`], a module here, an arm in [`run`].
//! [`source`] and [`mps_words`] are shared rather than verbs: the profile given as `PROFILE`
//! or `-f FILE`; an MPS server in words (`mps`, `clients` and `status` say it alike).

pub mod apply;
pub mod assert;
pub mod bench;
pub mod cancel;
pub mod cdi;
pub mod clients;
pub mod env;
pub mod export;
pub mod gpu;
pub mod mig;
pub mod mps;
pub mod mps_words;
pub mod plan;
pub mod probe;
pub mod profiles;
pub mod source;
pub mod status;
pub mod top;
pub mod validate;

use crate::bus::Client;
use crate::cli::Command;
use crate::error::CtlError;
use crate::output::Output;

/// Exit status of a verb that ran to its end: 0, or 1 when its result is a failure that it
/// printed itself (`apply --json` of a failed job, `assert --json` of a profile not applied).
pub type ExitStatus = u8;

/// Runs one verb.
pub async fn run(
    command: Command,
    client: &mut Client,
    out: &Output,
) -> Result<ExitStatus, CtlError> {
    match command {
        Command::Apply(args) => apply::run(client, out, &args).await,
        Command::Plan(args) => {
            let source = source::Source::from_args(&args.source)?;
            plan::run(client, out, &source).await
        }
        Command::Assert(args) => assert::run(client, out, &args).await,
        Command::Status => status::run(client, out).await,
        Command::Export(args) => export::run(client, &args, out).await,
        Command::Profiles(args) => profiles::run(client, out, args.command).await,
        Command::Validate(args) => validate::run(client, out, &args.file).await,
        Command::Mps(args) => mps::run(client, out, args.command).await,
        Command::Mig(args) => mig::run(client, out, args.command).await,
        Command::Gpu(args) => gpu::run(client, out, args.command).await,
        Command::Env(args) => env::run(client, out, &args.target).await,
        Command::Cdi(args) => cdi::run(client, out, args.device.as_deref()).await,
        Command::Clients(args) => clients::run(client, out, &args).await,
        Command::Top(args) => top::run(client, out, args.interval).await,
        Command::Probe(args) => probe::run(client, out, &args).await,
        Command::Bench(args) => bench::run(client, out, &args).await,
        Command::Cancel(args) => cancel::run(client, out, &args.job).await,
    }
}
