//! `steadfast gc --older-than DURATION`: delete finished runs.

use std::time::Duration;

use steadfast::retention::{collect, Retention};
use steadfast::RunStatus;
use steadfast::StoreExt as _;

use super::{usage, Ctx, Failure};
use crate::args::exit;
use crate::output;

/// Arguments of `gc`.
#[derive(clap::Args, Debug)]
pub struct GcArgs {
    /// Delete runs last saved longer ago than this (for example 30d).
    #[arg(long, value_parser = parse_age)]
    pub older_than: Duration,
    /// Only these statuses, comma-separated (default: completed, failed,
    /// rejected and cancelled; never a run still going).
    #[arg(long, value_delimiter = ',')]
    pub status: Vec<String>,
    /// Runs listed and deleted per batch (1 to 10000).
    #[arg(long, default_value_t = steadfast::retention::DEFAULT_BATCH)]
    pub batch: usize,
    /// Count what would be deleted; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Skip the look for what failed or cut-short writes left (on Cosmos
    /// DB a query over every item of the container).
    #[arg(long)]
    pub no_leftovers: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

pub(crate) fn parse_age(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if d > steadfast::retention::MAX_AGE {
        return Err("the age must be at most 100 years".into());
    }
    Ok(d)
}

/// Deletes in batches, with progress on stderr.
pub async fn run(args: GcArgs, ctx: &Ctx) -> Result<i32, Failure> {
    let mut policy = Retention::new(args.older_than)
        .batch(args.batch)
        .dry_run(args.dry_run);
    if !args.status.is_empty() {
        let statuses = args
            .status
            .iter()
            .map(|s| s.trim().parse::<RunStatus>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| usage(format!("--status: {e}")))?;
        policy = policy.statuses(statuses);
    }
    policy.check()?;
    let now = ctx.clock().now();
    let verb = if args.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    let dry = args.dry_run;
    // What the store's blobs weigh before and after: the bytes freed with
    // the runs (less what concurrent writers stored meanwhile).
    let blobs_before = ctx.raw.blob_totals().await?;
    // The raw store: retention reads heads only, which sealed runs keep
    // readable without the key.
    let report = collect(&*ctx.raw, &policy, now, |r| {
        if dry {
            output::note(format_args!(
                "gc: batch {}: {} run(s) would be deleted so far",
                r.batches, r.matched
            ));
        } else {
            output::note(format_args!(
                "gc: batch {}: {} deleted so far, {} changed since listed (kept)",
                r.batches, r.deleted, r.changed
            ));
        }
    })
    .await?;
    // What failed or cut-short writes left that no run will ever read
    // (stores that free everything in their own transactions have none).
    // A failure here is reported after what retention did, not instead.
    let leftovers = if args.no_leftovers {
        None
    } else {
        Some(ctx.raw.collect_leftovers(args.dry_run).await)
    };
    let count = if args.dry_run {
        report.matched
    } else {
        report.deleted
    };
    // Unknown, not a failure, when the totals cannot be read now: the
    // report of what was deleted still goes out.
    let after = ctx.raw.blob_totals().await.unwrap_or_else(|e| {
        output::note(format_args!(
            "gc: could not read the store's blob totals after deleting: {e}"
        ));
        None
    });
    let freed = match (blobs_before, after) {
        (Some(before), Some(after)) if !args.dry_run => {
            Some(before.bytes.saturating_sub(after.bytes))
        }
        _ => None,
    };
    if args.json {
        output::out!(
            "{}",
            serde_json::json!({"matched": report.matched, "deleted": report.deleted,
            "changed": report.changed, "batches": report.batches,
            "building": report.building, "dry_run": args.dry_run,
            "blob_bytes_freed": freed,
            "leftovers": match &leftovers {
                None => serde_json::Value::Null,
                Some(Ok(l)) => serde_json::json!({"remnants": l.remnants, "items": l.items, "failed": l.failed}),
                Some(Err(e)) => serde_json::json!({"error": e.to_string()}),
            }})
        );
    }
    output::note(format_args!(
        "gc: {verb} {count} run(s) last saved before {}",
        steadfast::Timestamp::from_unix_millis(
            now.unix_millis()
                .saturating_sub(args.older_than.as_millis().min(u64::MAX as u128) as u64)
        )
    ));
    if let Some(freed) = freed {
        output::note(format_args!(
            "gc: freed {} of large values no run refers to any more",
            output::bytes(freed)
        ));
    }
    let mut code = exit::OK;
    match &leftovers {
        Some(Ok(l)) if l.remnants > 0 => {
            let verb = if args.dry_run {
                "would remove"
            } else {
                "removed"
            };
            output::note(format_args!(
                "gc: {verb} {} item(s) that {} failed or cut-short write(s) left and no run reads",
                l.items, l.remnants
            ));
            if l.failed > 0 {
                output::note(format_args!(
                    "gc: the items of {} of them could not all be removed (see the log); the next gc tries again",
                    l.failed
                ));
                code = exit::FAILED;
            }
        }
        None | Some(Ok(_)) => {}
        Some(Err(e)) => {
            output::note(format_args!(
                "gc: could not look for what failed or cut-short writes left: {e}"
            ));
            code = exit::FAILED;
        }
    }
    if report.building > 0 {
        output::note(format_args!(
            "gc: left {} run(s) alone that a fork, a copy or an import is writing (or left unfinished)",
            report.building
        ));
    }
    Ok(code)
}
