//! Retention: deleting finished runs older than a cutoff, in bounded
//! batches, without ever touching a run that is still going.
//!
//! [`collect`] is what `steadfast gc` calls; a [`Worker`](crate::Worker)
//! applies a [`Retention`] periodically when given one
//! ([`Worker::retention`](crate::Worker::retention)).
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use std::time::Duration;
//! use serde_json::json;
//! use steadfast_core::{retention::{collect, Retention}, run, update, Clock, MemoryStore, Store, SystemClock, Workflow};
//!
//! let wf = Workflow::builder("w").step("a", |_, _| async { update(json!({})) }).build()?;
//! let store = MemoryStore::new();
//! run("old", &wf, &store).await?;
//! // An hour from now, a policy of "finished more than 30 minutes ago" takes it.
//! let later = SystemClock.now().saturating_add(Duration::from_secs(3600));
//! let report = collect(&store, &Retention::new(Duration::from_secs(1800)), later, |_| {}).await?;
//! assert_eq!(report.deleted, 1);
//! assert!(store.load("old").await.unwrap().is_none());
//! # Ok::<(), steadfast_core::Error>(())
//! # }).unwrap();
//! ```

use std::time::Duration;

use crate::record::checkpoint::RunStatus;
use crate::record::clock::Timestamp;
use crate::record::error::{Error, StoreErrorKind};
use crate::store::{ListFilter, Store};

/// The statuses of runs that are over, which retention may delete.
pub const FINISHED: [RunStatus; 4] = [
    RunStatus::Completed,
    RunStatus::Failed,
    RunStatus::Rejected,
    RunStatus::Cancelled,
];

/// The default number of runs listed, and deleted, per batch.
pub const DEFAULT_BATCH: usize = 500;

/// The longest `older_than` a policy takes: 100 years.
pub const MAX_AGE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How many deletes of a batch are in flight at once: stores that group
/// concurrent writes (SQLite) commit them together.
const IN_FLIGHT: usize = 256;

/// Which finished runs to delete.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retention {
    /// Only runs last saved longer ago than this.
    pub older_than: Duration,
    /// Only runs with these statuses (each one of [`FINISHED`]).
    pub statuses: Vec<RunStatus>,
    /// Runs listed per batch (1 to 10,000).
    pub batch: usize,
    /// Count what would be deleted, and delete nothing.
    pub dry_run: bool,
}

impl Retention {
    /// Every finished run (completed, failed, rejected, cancelled) last
    /// saved more than `older_than` ago, in batches of [`DEFAULT_BATCH`].
    pub fn new(older_than: Duration) -> Self {
        Retention {
            older_than,
            statuses: FINISHED.to_vec(),
            batch: DEFAULT_BATCH,
            dry_run: false,
        }
    }

    /// Only runs with these statuses.
    pub fn statuses(mut self, statuses: impl IntoIterator<Item = RunStatus>) -> Self {
        self.statuses = statuses.into_iter().collect();
        self
    }

    /// Runs listed per batch.
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n;
        self
    }

    /// Counts instead of deleting.
    pub fn dry_run(mut self, yes: bool) -> Self {
        self.dry_run = yes;
        self
    }

    /// Checks the policy's ranges: a status that is not finished, an age
    /// over [`MAX_AGE`], a batch outside 1 to 10,000.
    pub fn check(&self) -> Result<(), Error> {
        let bad = |reason: String| Error::InvalidInput {
            what: "the retention policy".into(),
            reason,
        };
        if let Some(s) = self.statuses.iter().find(|s| !FINISHED.contains(s)) {
            return Err(bad(format!(
                "status {s} is not finished: only completed, failed, rejected and cancelled runs are ever deleted"
            )));
        }
        if self.statuses.is_empty() {
            return Err(bad("it names no status".into()));
        }
        if self.older_than > MAX_AGE {
            return Err(bad(format!(
                "an age of {} is over the limit of 100 years",
                humantime::format_duration(self.older_than)
            )));
        }
        if !(1..=10_000).contains(&self.batch) {
            return Err(bad(format!(
                "a batch of {} runs is outside 1 to 10000",
                self.batch
            )));
        }
        Ok(())
    }
}

/// What [`collect`] did (or, dry, would do).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GcReport {
    /// Runs listed as matching.
    pub matched: u64,
    /// Runs deleted (none on a dry run).
    pub deleted: u64,
    /// Runs left alone because they changed after they were listed (a
    /// retry, a rewind, a new save): their version moved.
    pub changed: u64,
    /// Batches done.
    pub batches: u64,
    /// Runs left alone because a fork, a copy or an import is still
    /// writing them ([`Checkpoint::being_built`](crate::Checkpoint::being_built)),
    /// whatever their age.
    pub building: u64,
}

/// Deletes the runs `policy` names, judging age against `now`, in batches:
/// a page of at most `policy.batch` runs is listed, then each is deleted on
/// condition that its version is still the one listed
/// ([`Store::delete_if`]), so that a run retried, rewound or saved since is
/// never deleted. A run that is pending, running, waiting or sleeping is
/// never listed, and one that a fork, a copy or an import is still
/// writing (marked cancelled meanwhile) is left alone. `progress` is
/// called after each batch.
///
/// Fails with [`Error::InvalidInput`] for a policy out of range, and on the
/// first store error (what was deleted before it stays deleted).
pub async fn collect<S: Store + ?Sized>(
    store: &S,
    policy: &Retention,
    now: Timestamp,
    mut progress: impl FnMut(&GcReport),
) -> Result<GcReport, Error> {
    policy.check()?;
    let cutoff = Timestamp::from_unix_millis(
        now.unix_millis()
            .saturating_sub(policy.older_than.as_millis().min(u64::MAX as u128) as u64),
    );
    let mut report = GcReport::default();
    let store_err = |run_id: &str, e| crate::engine::store_error(run_id, "garbage collection", e);
    for &status in &policy.statuses {
        let mut filter = ListFilter::new()
            .status(status)
            .updated_before(cutoff)
            .limit(policy.batch);
        loop {
            let page = filter
                .next_page(store)
                .await
                .map_err(|e| store_err("*", e))?;
            if page.is_empty() {
                break;
            }
            let listed = page.len();
            // A cancelled run may be one a fork, a copy or an import is
            // still writing: those are left alone.
            let page = if status == RunStatus::Cancelled {
                let mut finished = Vec::with_capacity(page.len());
                for chunk in page.chunks(IN_FLIGHT) {
                    let loads = chunk.iter().map(|r| store.load(&r.run_id));
                    for (r, loaded) in chunk
                        .iter()
                        .zip(futures_util::future::join_all(loads).await)
                    {
                        match loaded.map_err(|e| store_err(&r.run_id, e))? {
                            Some(cp) if cp.being_built() => report.building += 1,
                            Some(_) => finished.push(r.clone()),
                            None => {}
                        }
                    }
                }
                finished
            } else {
                page
            };
            report.matched += page.len() as u64;
            if !policy.dry_run {
                for chunk in page.chunks(IN_FLIGHT) {
                    let deletes = chunk.iter().map(|r| store.delete_if(&r.run_id, r.version));
                    let results = futures_util::future::join_all(deletes).await;
                    for (r, result) in chunk.iter().zip(results) {
                        match result {
                            Ok(true) => report.deleted += 1,
                            // Deleted meanwhile by someone else.
                            Ok(false) => {}
                            Err(e) if e.kind() == StoreErrorKind::Conflict => report.changed += 1,
                            Err(e) => return Err(store_err(&r.run_id, e)),
                        }
                    }
                }
            }
            report.batches += 1;
            progress(&report);
            if listed < policy.batch {
                break;
            }
        }
    }
    Ok(report)
}
