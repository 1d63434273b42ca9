//! `steadfast import FILE`: read runs written by `export` into the store.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;

use anyhow::Context;
use steadfast::transfer::{put_runs_with, ImportReader, Put, PutOptions, MAX_LINE_BYTES};

use super::{usage, Ctx, Failure};
use crate::args::exit;
use crate::output;

/// Arguments of `import`.
#[derive(clap::Args, Debug)]
pub struct ImportArgs {
    /// The export file (`-` for standard input).
    pub file: PathBuf,
    /// Replace an older version of a run even while a live process holds
    /// it. That process's running step goes on (its side effects happen)
    /// but its result is never saved: its next save is refused and it
    /// stops, saying the run was replaced; steps it did that the imported
    /// record lacks run again. Without it, a held run stops the import
    /// with exit code 3 (the runs before it stay imported).
    #[arg(long)]
    pub force: bool,
}

/// How many runs are written at once (stores that group writes commit
/// them together).
const IN_FLIGHT: usize = 32;

/// Imports every line: a run absent here is written, an older version
/// replaced, the same or a newer one kept. The first bad line stops the
/// import with its number; what came before it stays imported.
pub async fn run(args: ImportArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let input: Box<dyn Read> = if args.file.as_os_str() == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(
            std::fs::File::open(&args.file)
                .with_context(|| format!("opening {}", args.file.display()))?,
        )
    };
    let opts = PutOptions::default().force(args.force);
    let mut reader = BufReader::new(input);
    let mut lineno = 0usize;
    let mut batch: Vec<steadfast::transfer::Exported> = Vec::new();
    let mut batch_bytes = 0usize;
    let mut counts = Counts::default();
    let mut blobs = ImportReader::new();
    loop {
        let line = read_line(&mut reader, lineno + 1);
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                // What came before the bad line is imported first.
                flush(ctx, &opts, &mut batch, &mut counts).await?;
                return Err(e);
            }
        };
        let Some(text) = line else { break };
        lineno += 1;
        if text.trim().is_empty() {
            continue;
        }
        // A blob's parts count towards the batch's memory as the runs that
        // hold its value do.
        batch_bytes += text.len();
        let record = match blobs.line(&text, lineno) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => {
                flush(ctx, &opts, &mut batch, &mut counts).await?;
                // A bad line is a usage error (exit 2); a blob the import
                // could not keep or read back (a full disk) is a failure,
                // with its cause.
                return Err(e.into());
            }
        };
        // One run id twice in a batch would race with itself.
        if batch.iter().any(|b| b.run.run_id == record.run.run_id) {
            flush(ctx, &opts, &mut batch, &mut counts).await?;
            batch_bytes = 0;
        }
        batch.push(record);
        if batch.len() >= IN_FLIGHT || batch_bytes >= MAX_LINE_BYTES {
            flush(ctx, &opts, &mut batch, &mut counts).await?;
            batch_bytes = 0;
            let total = counts.written + counts.replaced + counts.kept;
            if total % 1024 < IN_FLIGHT as u64 {
                output::note(format_args!("import: {total} run(s) so far"));
            }
        }
    }
    flush(ctx, &opts, &mut batch, &mut counts).await?;
    blobs.finish().map_err(|e| usage(e.to_string()))?;
    let Counts {
        written,
        replaced,
        kept,
        ..
    } = counts;
    output::note(format_args!(
        "import: {written} written, {replaced} replaced an older version, {kept} already there (same or newer version, kept)"
    ));
    Ok(exit::OK)
}

/// One line (without its newline), `None` at the end; a line over
/// [`MAX_LINE_BYTES`] or not UTF-8 is a usage error naming it.
fn read_line(reader: &mut impl BufRead, lineno: usize) -> Result<Option<String>, Failure> {
    let mut bytes = Vec::new();
    loop {
        let buf = reader.fill_buf().context("reading the export")?;
        if buf.is_empty() {
            break;
        }
        let (take, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        bytes.extend_from_slice(&buf[..take]);
        reader.consume(take);
        if bytes.len() > MAX_LINE_BYTES + 1 {
            return Err(usage(format!(
                "line {lineno} of the export is over {MAX_LINE_BYTES} bytes"
            )));
        }
        if done {
            break;
        }
    }
    if bytes.is_empty() {
        return Ok(None);
    }
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| usage(format!("line {lineno} of the export is not UTF-8")))
}

#[derive(Default)]
struct Counts {
    written: u64,
    replaced: u64,
    kept: u64,
    /// Runs of the last batch that could not be imported.
    failed: Vec<String>,
}

/// Writes the batch (all at once) and empties it. When a run of it fails,
/// the others were written all the same: the counts say so before the
/// first failure is returned.
async fn flush(
    ctx: &Ctx,
    opts: &PutOptions,
    batch: &mut Vec<steadfast::transfer::Exported>,
    counts: &mut Counts,
) -> Result<(), Failure> {
    let done = put_runs_with(&*ctx.raw, batch, opts).await;
    let mut first = None;
    for (d, rec) in done.into_iter().zip(batch.iter()) {
        match d {
            Ok(Put::Written) => counts.written += 1,
            Ok(Put::Replaced { .. }) => counts.replaced += 1,
            Ok(Put::Kept { .. }) => counts.kept += 1,
            Ok(_) => {}
            Err(e) => {
                counts.failed.push(rec.run.run_id.clone());
                first.get_or_insert(e);
            }
        }
    }
    batch.clear();
    match first {
        None => Ok(()),
        Some(e) => {
            let Counts {
                written,
                replaced,
                kept,
                failed,
            } = &*counts;
            output::note(format_args!(
                "import stopped: {written} written, {replaced} replaced an older version, {kept} already there (kept); {} not imported ({})",
                failed.len(),
                output::clean(&failed.join(", "))
            ));
            Err(e.into())
        }
    }
}
