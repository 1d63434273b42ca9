//! The `steadfast` command: runs flow files (steps that are shell commands,
//! gates and durable timers) with durable checkpoints, and inspects any store.
//! `main.rs` only calls [`main`].

pub mod args;
pub mod cmd;
pub mod command;
pub mod flow;
#[doc(hidden)]
pub mod fuzzing;
pub mod json;
pub mod output;
pub mod serve;
pub mod telemetry;
pub mod update_reader;

use anyhow::Context;
use clap::Parser;

use crate::args::{exit, Cli, Command};
use crate::cmd::Failure;

/// Parses the command line, runs the command and returns the exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            return code;
        }
    };
    if let Command::Supervise { command } = &cli.command {
        return command::supervise(command);
    }
    let telemetry = telemetry::init(cli.verbose);
    // One thread: step processes are spawned from it, and their supervisors
    // follow the life of this process through it.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            output::note(format_args!("steadfast: cannot start: {e}"));
            return exit::FAILED;
        }
    };
    let done = rt.block_on(dispatch(cli));
    drop(rt);
    // Sends the spans still buffered before the process exits.
    drop(telemetry);
    match done {
        Ok(code) => code,
        Err(failure) => {
            // One line, whatever a step printed into its error.
            output::note(format_args!(
                "steadfast: {}",
                output::clean(&format!("{:#}", failure.error))
            ));
            failure.code
        }
    }
}

async fn dispatch(cli: Cli) -> Result<i32, Failure> {
    // Only `run`, `start`, `worker`, `import` and `limits set` may create a
    // store; the other commands work on runs that exist, and say so when the
    // store itself does not.
    // The keys first: a key that cannot be read is a usage error, before
    // the store is opened (or created).
    let keys = steadfast::seal::Keyring::from_env().map_err(|e| cmd::usage(e.to_string()))?;
    if keys.is_none() && matches!(cli.command, Command::Rekey(_)) {
        return Err(cmd::usage(format!(
            "rekey needs the keys: set {} or {}",
            steadfast::seal::KEY_ENV,
            steadfast::seal::KEY_FILE_ENV
        )));
    }
    if let Command::Copy(args) = cli.command {
        return cmd::copy::run(args).await;
    }
    let create = matches!(
        cli.command,
        Command::Run(_)
            | Command::Start(_)
            | Command::Worker(_)
            | Command::Import(_)
            | Command::Limits(cmd::limits::LimitsArgs {
                what: cmd::limits::LimitsCommand::Set(_)
            })
            | Command::Schedule(cmd::schedule::ScheduleArgs {
                what: cmd::schedule::ScheduleCommand::Add(_)
            })
    );
    // The library's one opening policy: sealed with keys, sealed records
    // refused without.
    let migrate = matches!(&cli.command, Command::Rekey(a) if a.migrate_plaintext);
    let opts = steadfast::OpenOptions::default()
        .create(create)
        .accept_plaintext(migrate);
    let shown = steadfast::store::redact_url(&cli.store);
    let steadfast::Opened {
        store, raw, sealed, ..
    } = steadfast::open_with(&cli.store, &opts)
        .await
        .with_context(|| format!("cannot open the store {shown}"))?;
    let ctx = cmd::Ctx {
        store,
        sealed,
        raw,
        url: shown,
    };
    match cli.command {
        Command::Run(args) => cmd::run::run(args, &ctx).await,
        Command::Start(args) => cmd::start::run(args, &ctx).await,
        Command::Worker(args) => cmd::worker::run(args, &ctx).await,
        Command::Runs(args) => cmd::runs::run(args, &ctx).await,
        Command::Show(args) => cmd::show::run(args, &ctx).await,
        Command::Plan(args) => cmd::plan::run(args, &ctx).await,
        Command::Migrate(args) => cmd::plan::migrate(args, &ctx).await,
        Command::History(args) => cmd::history::run(args, &ctx).await,
        Command::Watch(args) => cmd::watch::run(args, &ctx).await,
        Command::Approve(args) => cmd::approve::run(args, &ctx).await,
        Command::Reject(args) => cmd::reject::run(args, &ctx).await,
        Command::Signal(args) => cmd::signal::run(args, &ctx).await,
        Command::Limits(args) => cmd::limits::run(args, &ctx).await,
        Command::Schedule(args) => cmd::schedule::run(args, &ctx).await,
        Command::Delete(args) => cmd::delete::run(args, &ctx).await,
        Command::Cancel(args) => cmd::cancel::run(args, &ctx).await,
        Command::Retry(args) => cmd::retry::run(args, &ctx).await,
        Command::Rewind(args) => cmd::rewind::run(args, &ctx).await,
        Command::Fork(args) => cmd::fork::run(args, &ctx).await,
        Command::Gc(args) => cmd::gc::run(args, &ctx).await,
        Command::Prune(args) => cmd::prune::run(args, &ctx).await,
        Command::Export(args) => cmd::export::run(args, &ctx).await,
        Command::Import(args) => cmd::import::run(args, &ctx).await,
        Command::Copy(_) => Ok(exit::USAGE),
        Command::Rekey(args) => cmd::rekey::run(args, &ctx).await,
        Command::Serve(args) => cmd::serve::run(args, &ctx).await,
        Command::Supervise { .. } => Ok(exit::USAGE),
    }
}
