//! `steadfast copy --from URL --to URL`: every run from one store to another.

use anyhow::Context;
use steadfast::transfer::{copy_with, PutOptions};

use super::Failure;
use crate::args::exit;
use crate::output;

/// Arguments of `copy`.
#[derive(clap::Args, Debug)]
pub struct CopyArgs {
    /// The store to copy from (it must exist).
    #[arg(long)]
    pub from: String,
    /// The store to copy into (created if missing).
    #[arg(long)]
    pub to: String,
    /// Replace an older version of a run in the destination even while a
    /// live process holds it there (see `import --force`). Without it, a
    /// held run stops the copy with exit code 3 (what was copied stays).
    #[arg(long)]
    pub force: bool,
}

/// Copies page by page, with progress on stderr. Records move as they are
/// stored: encrypted values stay encrypted.
pub async fn run(args: CopyArgs) -> Result<i32, Failure> {
    let (from_shown, to_shown) = (
        steadfast::store::redact_url(&args.from),
        steadfast::store::redact_url(&args.to),
    );
    // Records move as they are stored: the raw stores.
    let from = steadfast::open_with(&args.from, &steadfast::OpenOptions::default())
        .await
        .with_context(|| format!("cannot open the store {from_shown}"))?
        .raw;
    let to = steadfast::open_with(&args.to, &steadfast::OpenOptions::default().create(true))
        .await
        .with_context(|| format!("cannot open the store {to_shown}"))?
        .raw;
    let opts = PutOptions::default().force(args.force);
    let report = copy_with(&*from, &*to, &opts, |r| {
        output::note(format_args!(
            "copy: {} written, {} replaced, {} already there",
            r.written, r.replaced, r.kept
        ))
    })
    .await?;
    output::note(format_args!(
        "copy {from_shown} -> {to_shown}: {} written, {} replaced an older version, {} already there (kept), {} vanished meanwhile",
        report.written, report.replaced, report.kept, report.vanished
    ));
    Ok(exit::OK)
}
