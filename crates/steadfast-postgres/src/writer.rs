//! Group commit: concurrent saves from one process share one transaction,
//! and so one WAL flush. Each member is one statement that changes nothing
//! when its version check fails, so a conflicting member fails alone and the
//! rest commit. A save is acknowledged only after COMMIT returned.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::future::join_all;
use steadfast_core::{StoreError, StoreErrorKind};
use tokio::sync::oneshot;
use tokio_postgres::types::ToSql;

use steadfast_core::store::blob::Blob;
use steadfast_core::store::group::Queue;
use steadfast_core::store::plan::Known;
use steadfast_core::store::rows::Place;

use crate::error::{map_err, pool_err};
use crate::Shared;

/// One step's history row, with the integers PostgreSQL takes.
pub(crate) struct StepRow {
    pub index: i64,
    pub name: String,
    pub update: String,
    pub attempt: i64,
    pub started_at: i64,
    pub finished_at: i64,
}

impl StepRow {
    /// The toolkit's row of a step of run `run_id`, its numbers checked.
    pub(crate) fn of(
        row: steadfast_core::store::plan::StepRow,
        run_id: &str,
    ) -> Result<Self, StoreError> {
        use steadfast_core::store::rows::to_i64;
        Ok(StepRow {
            index: to_i64(run_id, "step index", row.index as u64)?,
            name: row.name,
            update: row.update,
            attempt: i64::from(row.attempt),
            started_at: to_i64(run_id, "start time", row.started_at)?,
            finished_at: to_i64(run_id, "finish time", row.finished_at)?,
        })
    }
}

/// What this process knows of a run's stored record after its last load or
/// save: the toolkit's bookkeeping, and whether the record may refer to
/// blobs (so that a new snapshot must count its references again).
#[derive(Clone, Debug)]
pub(crate) struct Acct {
    pub known: Known,
    /// False only when no reference of the run's was stored at that
    /// version.
    pub refs: bool,
}

/// A save, with every value of its statement.
pub(crate) struct SaveJob {
    pub run_id: String,
    pub expected: Option<u64>,
    /// The version written (`expected + 1`, unless imported).
    pub version: i64,
    pub workflow: String,
    pub status: &'static str,
    /// `None` keeps the stored `next` (a head-only save).
    pub next: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
    pub head: String,
    pub wake_at: Option<i64>,
    /// A new snapshot: the state, the completed steps, its size.
    pub snapshot: Option<(String, String, i64)>,
    /// The bytes a delta adds (0 for none).
    pub delta_bytes: i64,
    pub step: Option<StepRow>,
    /// Whether workers should hear of this save (a run started or decided).
    pub notify: bool,
    /// How many times the server broke a deadlock of this save's batch.
    pub deadlocks: usize,
    /// The blobs the record refers to (written with it, each once).
    pub blobs: Vec<Blob>,
    /// Whether the save replaces the run's snapshot (its references are
    /// counted again, in its transaction).
    pub recount: bool,
    /// Whether the run may have referred to blobs before this save (true
    /// when not known); a fresh run's statement says it itself.
    pub refs_before: bool,
    pub reply: oneshot::Sender<Result<Acct, StoreError>>,
    /// Set by [`submit`] (from 1): which caller's save this is.
    pub ticket: u64,
}

impl SaveJob {
    /// Whether the save does more than its one statement: blobs to store,
    /// references to count. It never commits alone.
    fn touches_blobs(&self) -> bool {
        !self.blobs.is_empty() || self.recount
    }
}

/// How many times a batch whose transaction the server ended to break a
/// deadlock (two writers taking up and freeing the same blobs in opposite
/// order) is tried again before its saves fail.
const DEADLOCK_TRIES: usize = 3;

/// How long a leader waits, after a shared commit, for the callers it
/// acknowledged to queue their next saves.
const GATHER: std::time::Duration = std::time::Duration::from_micros(150);

/// Saves waiting for a commit.
#[derive(Default)]
pub(crate) struct Writer {
    pub queue: Queue<SaveJob>,
    /// The right to commit, and the connection the committer keeps between
    /// batches (so that a save pays no trip through the pool).
    pub lead: Arc<tokio::sync::Mutex<Option<deadpool_postgres::Object>>>,
}

/// Queues `job`; if no one is committing and the queue holds `job` alone,
/// commits it right here, without a hand-off to another task, then hands
/// what queued meanwhile to a leader task that commits batches until the
/// queue is empty. A batch that holds other callers' saves is always
/// committed by a leader task, never on a caller's path: a caller that stops
/// waiting (its future dropped mid-commit) then loses only its own save,
/// whose outcome it no longer asks for, and never another caller's.
pub(crate) async fn submit(shared: &Arc<Shared>, mut job: SaveJob) {
    let writer = &shared.writer;
    let ticket = TICKETS.fetch_add(1, Ordering::Relaxed);
    job.ticket = ticket;
    writer.queue.push(job);
    let Ok(guard) = Arc::clone(&writer.lead).try_lock_owned() else {
        // The one committing takes this job with its next batch.
        return;
    };
    let batch = writer.queue.take();
    if batch.len() > 1 || batch.first().is_some_and(|j| j.ticket != ticket) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(lead(Arc::clone(shared), guard, batch));
        } else {
            // No runtime to spawn on (a save polled by another executor):
            // committed here, as the only way it commits at all.
            lead(Arc::clone(shared), guard, batch).await;
        }
        return;
    }
    let mut turn = Turn {
        shared: Arc::clone(shared),
        guard: Some(guard),
    };
    if !batch.is_empty() {
        if let Some(conn) = turn.guard.as_mut() {
            commit(shared, conn, batch).await;
        }
    }
    turn.hand_on();
}

/// Numbers each save's job, so that a caller knows its own.
static TICKETS: AtomicU64 = AtomicU64::new(1);

type Lead = tokio::sync::OwnedMutexGuard<Option<deadpool_postgres::Object>>;

/// The right to commit, held by a caller; passed to a leader task when
/// saves are left in the queue (also when the caller's future is dropped).
struct Turn {
    shared: Arc<Shared>,
    guard: Option<Lead>,
}

impl Turn {
    fn hand_on(&mut self) {
        let Some(guard) = self.guard.take() else {
            return;
        };
        let writer = &self.shared.writer;
        let guard = if !writer.queue.is_empty() {
            guard
        } else {
            drop(guard);
            // A job queued after that look, by a caller that found the lead
            // taken, would wait for nobody: look once more.
            if writer.queue.is_empty() {
                return;
            }
            match Arc::clone(&writer.lead).try_lock_owned() {
                Ok(g) => g,
                Err(_) => return,
            }
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(lead(Arc::clone(&self.shared), guard, Vec::new()));
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.hand_on();
    }
}

/// Commits `first`, then batches until the queue is empty.
async fn lead(shared: Arc<Shared>, guard: Lead, first: Vec<SaveJob>) {
    let mut turn = Turn {
        shared: Arc::clone(&shared),
        guard: Some(guard),
    };
    let mut first = Some(first).filter(|b| !b.is_empty());
    loop {
        let batch = first.take().unwrap_or_else(|| shared.writer.queue.take());
        if batch.is_empty() {
            break;
        }
        let n = batch.len();
        if let Some(conn) = turn.guard.as_mut() {
            commit(&shared, conn, batch).await;
        }
        shared.writer.queue.gather(n, GATHER).await;
    }
    turn.hand_on();
}

fn params(job: &SaveJob) -> Vec<Box<dyn ToSql + Sync + Send + '_>> {
    let expected = job.expected.map(|v| v as i64);
    let (snap, completed, snap_bytes) = match &job.snapshot {
        Some((s, c, b)) => (Some(s.as_str()), Some(c.as_str()), Some(*b)),
        None => (None, None, None),
    };
    let step = job.step.as_ref();
    vec![
        Box::new(job.run_id.as_str()),
        Box::new(expected),
        Box::new(job.workflow.as_str()),
        Box::new(job.status),
        Box::new(job.next),
        Box::new(job.created_at),
        Box::new(job.updated_at),
        Box::new(job.head.as_str()),
        Box::new(job.wake_at),
        Box::new(snap),
        Box::new(completed),
        Box::new(snap_bytes),
        Box::new(job.delta_bytes),
        Box::new(step.map(|s| s.index)),
        Box::new(step.map(|s| s.name.as_str())),
        Box::new(step.map(|s| s.update.as_str())),
        Box::new(step.map(|s| s.attempt)),
        Box::new(step.map(|s| s.started_at)),
        Box::new(step.map(|s| s.finished_at)),
        Box::new(job.version),
    ]
}

/// The result of one member's statement: the row it returned, if its
/// version check passed.
type Member = Result<Option<tokio_postgres::Row>, tokio_postgres::Error>;

/// The committer's connection while a statement or a transaction is in
/// flight. If the future holding it is dropped before the answer came (a
/// caller that gave up, a worker aborting its runs), the connection is taken
/// out of the pool and closed, so that the server rolls back whatever was
/// open: it is never reused in the middle of a transaction.
struct InFlight(Option<deadpool_postgres::Object>);

impl InFlight {
    /// The connection back, clean, for the next batch.
    fn done(mut self) -> Option<deadpool_postgres::Object> {
        self.0.take()
    }

    /// The pooled connection, for what prepares through its statement cache.
    fn object(&self) -> &deadpool_postgres::Object {
        // Set from construction until `done` or drop.
        self.0.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl std::ops::Deref for InFlight {
    type Target = deadpool_postgres::ClientWrapper;
    fn deref(&self) -> &deadpool_postgres::ClientWrapper {
        // Set from construction until `done` or drop.
        self.0.as_deref().unwrap_or_else(|| unreachable!())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(obj) = self.0.take() {
            drop(deadpool_postgres::Object::take(obj));
        }
    }
}

/// Commits `batch` on the committer's connection `conn` (taken from the pool
/// when there is none or it broke). The connection goes back to `conn` only
/// when the batch ended cleanly; after any failure it is closed, so that the
/// next batch starts on a fresh one.
async fn commit(
    shared: &Arc<Shared>,
    conn: &mut Option<deadpool_postgres::Object>,
    batch: Vec<SaveJob>,
) {
    let fail_all = |batch: Vec<SaveJob>, e: &StoreError| {
        let (kind, msg) = (e.kind(), e.to_string());
        for job in batch {
            let _ = job.reply.send(Err(StoreError::backend(kind, msg.clone())));
        }
    };
    let obj = match conn.take() {
        Some(c) if !c.is_closed() => c,
        _ => match shared.pool.get().await {
            Ok(c) => c,
            Err(e) => {
                fail_all(
                    batch,
                    &pool_err(e, &format!("connecting to {}", shared.display)),
                );
                return;
            }
        },
    };
    let client = InFlight(Some(obj));
    let (fresh, update) = match (
        client.prepare_cached(&shared.sql.insert).await,
        client.prepare_cached(&shared.sql.update).await,
    ) {
        (Ok(f), Ok(u)) => (f, u),
        (Err(e), _) | (_, Err(e)) => {
            fail_all(
                batch,
                &map_err(e, &format!("preparing a save in {}", shared.display)),
            );
            return;
        }
    };
    let notify = batch.iter().any(|j| j.notify);
    if batch.len() == 1 && !notify && !batch.iter().any(SaveJob::touches_blobs) {
        // One save alone needs no BEGIN/COMMIT: its statement is its own
        // transaction, one round trip and one WAL flush.
        let Some(job) = batch.into_iter().next() else {
            return;
        };
        let stmt = if job.expected.is_none() {
            &fresh
        } else {
            &update
        };
        if commit_alone(shared, &client, stmt, job).await {
            *conn = client.done();
        }
        return;
    }
    let ping_stmt = if notify {
        match client.prepare_cached("SELECT pg_notify($1, 'work')").await {
            Ok(st) => Some(st),
            Err(e) => {
                fail_all(
                    batch,
                    &map_err(
                        e,
                        &format!("preparing a notification in {}", shared.display),
                    ),
                );
                return;
            }
        }
    } else {
        None
    };
    let all_params: Vec<_> = batch.iter().map(params).collect();
    // BEGIN, every member and the notification go out together (the driver
    // pipelines requests polled together): one round trip, then COMMIT.
    let begin = client.batch_execute("BEGIN");
    let members = join_all(batch.iter().zip(&all_params).map(|(job, p)| {
        let refs: Vec<&(dyn ToSql + Sync)> =
            p.iter().map(|b| &**b as &(dyn ToSql + Sync)).collect();
        let stmt = if job.expected.is_none() {
            &fresh
        } else {
            &update
        };
        let client: &tokio_postgres::Client = &client;
        async move { client.query_opt(stmt, &refs).await }
    }));
    let ping = async {
        match &ping_stmt {
            Some(st) => client.execute(st, &[&shared.schema]).await.map(|_| ()),
            None => Ok(()),
        }
    };
    let (began, mut results, pinged): (_, Vec<Member>, _) = tokio::join!(begin, members, ping);
    drop(all_params);
    let mut first_error = began
        .err()
        .or_else(|| {
            let i = results.iter().position(|r| r.is_err())?;
            results.remove(i).err()
        })
        .or(pinged.err());
    if first_error.is_none() {
        first_error = blob_work(shared, client.object(), &batch, &results)
            .await
            .err();
    }
    if let Some(e) = first_error {
        let deadlock = e.code() == Some(&tokio_postgres::error::SqlState::T_R_DEADLOCK_DETECTED);
        // Closing the connection (dropping `client`) rolls the transaction
        // back; nothing was committed, since COMMIT was never sent.
        let lost = client.is_closed() || e.code().is_none();
        drop(client);
        if deadlock && batch.len() == 1 && batch[0].deadlocks + 1 < DEADLOCK_TRIES {
            // Rolled back by the server: nothing of it was written.
            let mut batch = batch;
            batch[0].deadlocks += 1;
            Box::pin(commit(shared, conn, batch)).await;
            return;
        }
        if lost || batch.len() == 1 {
            let ctx = match &batch[..] {
                [job] => format!("saving run {:?} to {}", job.run_id, shared.display),
                _ => format!("saving to {}", shared.display),
            };
            fail_all(batch, &crate::error::race_is_transient(e, &ctx));
            return;
        }
        // One member's statement failed and took the transaction with it:
        // commit each member on its own, so only that one fails.
        for job in batch {
            Box::pin(commit(shared, conn, vec![job])).await;
        }
        return;
    }
    let n = batch.len();
    match client.batch_execute("COMMIT").await {
        Ok(()) => {
            shared.writer.queue.committed(n);
            *conn = client.done();
        }
        Err(e) => {
            // A COMMIT the server answered with an error did not commit; one
            // whose answer never came (the connection dropped) may have.
            let answered = e.code().is_some();
            drop(client);
            let msg = map_err(e, &format!("committing saves to {}", shared.display)).to_string();
            for job in batch {
                let err = if answered {
                    StoreError::backend(StoreErrorKind::Unavailable, msg.clone())
                } else {
                    StoreError::OutcomeUnknown {
                        run_id: job.run_id.clone(),
                        source: msg.clone().into(),
                    }
                };
                let _ = job.reply.send(Err(err));
            }
            return;
        }
    }
    // Answer the committed members first; a conflicting member's message
    // names the version it found, which costs a read.
    let mut conflicts = Vec::new();
    for (job, result) in batch.into_iter().zip(results) {
        match result {
            Ok(Some(row)) => {
                let reply = answer(shared, &job, Some(row)).await;
                let _ = job.reply.send(reply);
            }
            Ok(None) => conflicts.push(job),
            // Every member's error was handled before COMMIT.
            Err(_) => {
                let _ = job.reply.send(Err(StoreError::unavailable(format!(
                    "run {:?}: a failed statement reached COMMIT",
                    job.run_id
                ))));
            }
        }
    }
    for job in conflicts {
        let reply = answer(shared, &job, None).await;
        let _ = job.reply.send(reply);
    }
}

/// Inside the batch's transaction, after every member's statement: stores
/// the blobs of each member whose version check passed, and counts again
/// the references of those that replaced a snapshot. A conflicting member
/// wrote nothing, and stores nothing.
async fn blob_work(
    shared: &Shared,
    client: &deadpool_postgres::Object,
    batch: &[SaveJob],
    results: &[Member],
) -> Result<(), tokio_postgres::Error> {
    let q = crate::schema::quote(&shared.schema);
    for (job, result) in batch.iter().zip(results) {
        if !job.touches_blobs() || !matches!(result, Ok(Some(_))) {
            continue;
        }
        crate::blobs::write(client, &q, &job.run_id, &job.blobs).await?;
        if job.recount {
            let locate = crate::locate(shared, &job.run_id);
            crate::blobs::recount(client, &q, &job.run_id, &Place::new(&job.run_id, &locate))
                .await?;
        }
    }
    Ok(())
}

/// What a committed member's statement returned means: the new bookkeeping,
/// or (no row) a conflict that changed nothing.
async fn answer(
    shared: &Shared,
    job: &SaveJob,
    row: Option<tokio_postgres::Row>,
) -> Result<Acct, StoreError> {
    match row {
        Some(row) => {
            // The save committed: numbers that do not read back make its
            // bookkeeping unknown, never the save a failure. The run loop
            // looks, and recognises its write.
            let locate = crate::locate(shared, &job.run_id);
            let place = Place::new(&job.run_id, &locate);
            let known = (|| {
                Ok::<_, StoreError>(Known::new(
                    place.count("version", job.version)?,
                    place.index("next", row.get(0))?,
                    place.count("snapshot_bytes", row.get(1))?,
                    place.count("delta_bytes", row.get(2))?,
                ))
            })();
            // A fresh run's statement says whether references under its id
            // were there already; an update keeps what was known before.
            let before = if job.expected.is_none() {
                row.try_get::<_, bool>(3).unwrap_or(true)
            } else {
                job.refs_before
            };
            let refs = before || !job.blobs.is_empty();
            known
                .map(|known| Acct { known, refs })
                .map_err(|e| StoreError::OutcomeUnknown {
                    run_id: job.run_id.clone(),
                    source: Box::new(e),
                })
        }
        None => Err(StoreError::Conflict {
            run_id: job.run_id.clone(),
            expected: job.expected,
            found: crate::stored_version(shared, &job.run_id).await,
        }),
    }
}

/// Commits one save as a statement of its own (autocommit). A statement the
/// server answered with an error changed nothing; one whose answer never
/// came may have committed: an unknown outcome. Returns whether the
/// connection is clean for the next batch.
async fn commit_alone(
    shared: &Shared,
    client: &tokio_postgres::Client,
    stmt: &tokio_postgres::Statement,
    job: SaveJob,
) -> bool {
    let p = params(&job);
    let refs: Vec<&(dyn ToSql + Sync)> = p.iter().map(|b| &**b as &(dyn ToSql + Sync)).collect();
    let result = client.query_opt(stmt, &refs).await;
    drop(refs);
    drop(p);
    let (reply, clean) = match result {
        Ok(row) => {
            shared.writer.queue.committed(1);
            (answer(shared, &job, row).await, true)
        }
        Err(e) if e.code().is_some() => (
            Err(map_err(e, &format!("saving to {}", shared.display))),
            false,
        ),
        Err(e) => (
            Err(StoreError::OutcomeUnknown {
                run_id: job.run_id.clone(),
                source: map_err(e, &format!("saving to {}", shared.display)).into(),
            }),
            false,
        ),
    };
    let _ = job.reply.send(reply);
    clean
}
