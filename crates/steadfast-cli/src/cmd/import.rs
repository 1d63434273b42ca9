//! `steadfast import FILE`: read runs written by `export` into the store.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;

use anyhow::Context;
use steadfast::transfer::{decode_line, put_runs, Put, MAX_LINE_BYTES};

use super::{usage, Ctx, Failure};
use crate::args::exit;
use crate::output;

/// Arguments of `import`.
#[derive(clap::Args, Debug)]
pub struct ImportArgs {
    /// The export file (`-` for standard input).
    pub file: PathBuf,
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
    let mut reader = BufReader::new(input);
    let (mut written, mut replaced, mut kept) = (0u64, 0u64, 0u64);
    let mut lineno = 0usize;
    let mut batch = Vec::new();
    loop {
        let line = read_line(&mut reader, lineno + 1)?;
        let end = line.is_none();
        if let Some(text) = line {
            lineno += 1;
            if !text.trim().is_empty() {
                batch.push(decode_line(&text, lineno).map_err(|e| usage(e.to_string()))?);
            }
        }
        if batch.len() >= IN_FLIGHT || (end && !batch.is_empty()) {
            for done in put_runs(&*ctx.raw, &batch).await {
                match done? {
                    Put::Written => written += 1,
                    Put::Replaced { .. } => replaced += 1,
                    Put::Kept { .. } => kept += 1,
                    _ => {}
                }
            }
            batch.clear();
            let total = written + replaced + kept;
            if total % 1024 < IN_FLIGHT as u64 && !end {
                output::note(format_args!("import: {total} run(s) so far"));
            }
        }
        if end {
            break;
        }
    }
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
