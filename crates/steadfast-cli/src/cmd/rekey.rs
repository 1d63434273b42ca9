//! `steadfast rekey [--migrate-plaintext]`: rewrites every run whose record
//! uses an older key (or, when asked, no encryption at all) under the current
//! key. Runs running under a live lease are left for another pass, so a
//! stopped or partial rekey is finished by running it again.

use anyhow::Context;
use steadfast::seal::{Rekeyed, SealedStore};
use steadfast::ListFilter;

use super::{Ctx, Failure};
use crate::args::exit;
use crate::output;

/// Runs listed per page.
const PAGE: usize = 500;

/// Arguments of `rekey`.
#[derive(clap::Args, Debug)]
pub struct RekeyArgs {
    /// Also encrypt records written without encryption (otherwise refused).
    #[arg(long)]
    pub migrate_plaintext: bool,
}

/// Rekeys every run; exit 3 when some were busy (run it again), 1 when some
/// could not be rekeyed (they need a person: tampered, plaintext without
/// `--migrate-plaintext`, under a key not given).
pub async fn run(_args: RekeyArgs, ctx: &Ctx) -> Result<i32, Failure> {
    // The CLI wraps the store in the seal whenever keys are given, and
    // refuses `rekey` without them.
    let (mut rewritten, mut current, mut busy) = (0u64, 0u64, Vec::new());
    let mut failed = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut filter = ListFilter::new().limit(PAGE);
        if let Some(a) = &after {
            filter = filter.after(a.clone());
        }
        let page = ctx.store.list(&filter).await.context("listing the runs")?;
        for summary in &page {
            let id = summary.run_id.as_str();
            let sealed = sealed_store(ctx);
            // One run that cannot be rekeyed (tampered, plaintext, under a
            // retired key) does not stop the others.
            match sealed.rekey(id).await {
                Ok(Rekeyed::Rewritten) => rewritten += 1,
                Ok(Rekeyed::Current) => current += 1,
                Ok(Rekeyed::Busy) => busy.push(id.to_string()),
                Ok(_) => {}
                Err(e) => failed.push(format!(
                    "run {id:?}: {}",
                    output::clean(&steadfast::error_chain(&e))
                )),
            }
        }
        match page.last() {
            Some(last) if page.len() == PAGE => after = Some(last.run_id.clone()),
            _ => break,
        }
    }
    let key = sealed_store(ctx).keys().current().to_string();
    output::note(format_args!(
        "rekey: {rewritten} runs rewritten under key {key:?}, {current} already current, {} busy, {} failed",
        busy.len(),
        failed.len()
    ));
    for f in &failed {
        output::note(format_args!("failed: {f}"));
    }
    if !busy.is_empty() {
        output::note(format_args!(
            "busy (held under a live lease, or changed meanwhile): {}; run `steadfast rekey` again",
            busy.join(", ")
        ));
    }
    Ok(if !failed.is_empty() {
        exit::FAILED
    } else if !busy.is_empty() {
        exit::HELD
    } else {
        exit::OK
    })
}

fn sealed_store(ctx: &Ctx) -> &SealedStore {
    ctx.sealed
        .as_deref()
        .expect("rekey runs only with keys, which wrap the store")
}
