//! `steadfast export [--run ID…]`: runs as JSON Lines on stdout, each large
//! value once (see `steadfast::transfer`).

use std::io::Write;

use anyhow::Context;
use steadfast::transfer::{export_run, ExportWriter};
use steadfast::ListFilter;

use super::{no_such_run, usage, Ctx, Failure};
use crate::args::exit;
use crate::output;

/// Arguments of `export`.
#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// Only these runs (default: every run).
    #[arg(long = "run", value_name = "ID")]
    pub runs: Vec<String>,
    /// Write encrypted runs opened (needs the keys). Without it, every run
    /// is written as it is stored: encrypted values stay encrypted.
    #[arg(long)]
    pub decrypt: bool,
}

/// Writes one line per run; progress on stderr.
pub async fn run(args: ExportArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let store = if args.decrypt {
        if ctx.sealed.is_none() {
            return Err(usage(format!(
                "--decrypt needs the keys: set {} or {}",
                steadfast::seal::KEY_ENV,
                steadfast::seal::KEY_FILE_ENV
            )));
        }
        &ctx.store
    } else {
        &ctx.raw
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut written = 0u64;
    let mut writer = ExportWriter::new();
    let mut put = |record: &steadfast::transfer::Exported| -> Result<(), Failure> {
        let mut failed = None;
        writer
            .write(record, &mut |line| {
                if let Err(e) = writeln!(out, "{line}") {
                    failed = Some(e);
                    return Err(steadfast::Error::InvalidInput {
                        what: "the export".into(),
                        reason: "it could not be written".into(),
                    });
                }
                Ok(())
            })
            .map_err(|e| match failed.take() {
                Some(io) => Failure::from(anyhow::Error::new(io).context("writing the export")),
                None => Failure::from(e),
            })?;
        written += 1;
        if written.is_multiple_of(1000) {
            output::note(format_args!("export: {written} run(s)"));
        }
        Ok(())
    };
    if !args.runs.is_empty() {
        for id in &args.runs {
            steadfast::validate_run_id(id)?;
            let record = export_run(&**store, id)
                .await?
                .ok_or_else(|| no_such_run(id, ctx))?;
            put(&record)?;
        }
    } else {
        let mut filter = ListFilter::new().limit(500);
        loop {
            let page = filter.next_page(&**store).await.context("listing runs")?;
            if page.is_empty() {
                break;
            }
            for summary in &page {
                // Deleted since it was listed: not exported.
                if let Some(record) = export_run(&**store, &summary.run_id).await? {
                    put(&record)?;
                }
            }
        }
    }
    out.flush().context("writing the export")?;
    output::note(format_args!("export: {written} run(s) written"));
    Ok(exit::OK)
}
