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
    let leftovers = ctx.raw.collect_leftovers(args.dry_run).await?;
    let count = if args.dry_run {
        report.matched
    } else {
        report.deleted
    };
    let freed = match (blobs_before, ctx.raw.blob_totals().await?) {
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
                               "leftovers": {"remnants": leftovers.remnants, "items": leftovers.items}})
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
    if leftovers.remnants > 0 {
        let verb = if args.dry_run {
            "would remove"
        } else {
            "removed"
        };
        output::note(format_args!(
            "gc: {verb} {} item(s) that {} failed or cut-short write(s) left and no run reads",
            leftovers.items, leftovers.remnants
        ));
    }
    if report.building > 0 {
        output::note(format_args!(
            "gc: left {} run(s) alone that a fork, a copy or an import is writing (or left unfinished)",
            report.building
        ));
    }
    Ok(exit::OK)
}
