//! The single writer: one thread owns the write connection and commits queued
//! saves in batches (group commit). A save is acknowledged only after the COMMIT
//! of its batch returned, so every acknowledged save is durable; one member's
//! conflict rolls back to its own savepoint and fails that member only.

use std::sync::mpsc::{Receiver, TryRecvError};

use rusqlite::{params, Connection, OptionalExtension};
use steadfast_core::StoreError;
use tokio::sync::oneshot;

use crate::error::{commit_outcome_unknown, map_err};

/// The bookkeeping of a run's snapshot and deltas, as of `version`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Acct {
    pub version: u64,
    pub next: usize,
    pub snapshot_bytes: u64,
    pub delta_bytes: u64,
}

/// The head of a run: every column of `runs` except the snapshot.
pub(crate) struct Head {
    pub workflow: String,
    pub status: &'static str,
    pub next: usize,
    pub format: u32,
    pub created_at: u64,
    pub updated_at: u64,
    pub attempts: u32,
    pub error: Option<String>,
    pub writer: u64,
}

/// A history row.
pub(crate) struct StepRow {
    pub index: usize,
    pub name: String,
    pub update: String,
    pub attempt: u32,
    pub started_at: u64,
    pub finished_at: u64,
}

pub(crate) enum Body {
    /// Append one step's update to the deltas since the snapshot.
    Delta { step: StepRow },
    /// Rewrite the snapshot with the full state (and record a step, if any).
    Snapshot {
        state: String,
        completed: String,
        step: Option<StepRow>,
    },
}

pub(crate) struct SaveJob {
    pub run_id: String,
    pub expected: Option<u64>,
    pub head: Head,
    pub body: Body,
    pub reply: oneshot::Sender<Result<Acct, StoreError>>,
}

pub(crate) enum Job {
    Save(Box<SaveJob>),
    Delete {
        run_id: String,
        reply: oneshot::Sender<Result<bool, StoreError>>,
    },
    /// Reads durability settings back from the live write connection.
    Settings {
        reply: oneshot::Sender<Result<crate::Settings, StoreError>>,
    },
}

enum Reply {
    Save(
        String,
        oneshot::Sender<Result<Acct, StoreError>>,
        Result<Acct, StoreError>,
    ),
    Delete(
        oneshot::Sender<Result<bool, StoreError>>,
        Result<bool, StoreError>,
    ),
}

const MAX_BATCH: usize = 256;

pub(crate) fn run_writer(mut conn: Connection, jobs: Receiver<Job>, path: String) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        commit_batch(&mut conn, batch, &path);
    }
}

fn commit_batch(conn: &mut Connection, batch: Vec<Job>, path: &str) {
    let mut replies = Vec::with_capacity(batch.len());
    let mut writes = Vec::with_capacity(batch.len());
    for job in batch {
        match job {
            Job::Settings { reply } => {
                let _ = reply.send(crate::read_settings(conn, path));
            }
            other => writes.push(other),
        }
    }
    if writes.is_empty() {
        return;
    }
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        let err = map_err(e, &format!("starting a write transaction on {path}"));
        for job in writes {
            fail(job, &err);
        }
        return;
    }
    for job in writes {
        let member = conn.execute_batch("SAVEPOINT member");
        let (reply, ok) = match job {
            Job::Save(save) => {
                let result = member
                    .map_err(|e| map_err(e, "savepoint"))
                    .and_then(|()| apply_save(conn, &save, path));
                let ok = result.is_ok();
                (Reply::Save(save.run_id, save.reply, result), ok)
            }
            Job::Delete { run_id, reply } => {
                let result = member
                    .map_err(|e| map_err(e, "savepoint"))
                    .and_then(|()| apply_delete(conn, &run_id, path));
                let ok = result.is_ok();
                (Reply::Delete(reply, result), ok)
            }
            Job::Settings { .. } => unreachable!("settings jobs were answered above"),
        };
        let end = if ok {
            conn.execute_batch("RELEASE member")
        } else {
            conn.execute_batch("ROLLBACK TO member; RELEASE member")
        };
        if let Err(e) = end {
            tracing::error!(error = %e, "could not close a member's savepoint");
        }
        replies.push(reply);
    }
    let committed = conn.execute_batch("COMMIT");
    let failure = committed.err().map(|e| {
        let unknown = commit_outcome_unknown(&e);
        let message = format!("committing to {path}: {e}");
        let _ = conn.execute_batch("ROLLBACK");
        (unknown, message)
    });
    // Members that failed on their own keep their own error; the others share
    // the batch's fate.
    let batch_error = |run_id: &str| -> StoreError {
        let (unknown, message) = failure.as_ref().expect("only called after a failed COMMIT");
        if *unknown {
            StoreError::OutcomeUnknown {
                run_id: run_id.to_string(),
                source: message.clone().into(),
            }
        } else {
            StoreError::Backend {
                kind: steadfast_core::StoreErrorKind::Unavailable,
                message: message.clone(),
                source: None,
            }
        }
    };
    for r in replies {
        match r {
            Reply::Save(run_id, tx, res) => {
                let res = match res {
                    Ok(_) if failure.is_some() => Err(batch_error(&run_id)),
                    other => other,
                };
                let _ = tx.send(res);
            }
            Reply::Delete(tx, res) => {
                let res = match res {
                    Ok(_) if failure.is_some() => Err(batch_error("")),
                    other => other,
                };
                let _ = tx.send(res);
            }
        }
    }
}

fn fail(job: Job, err: &StoreError) {
    let copy = || StoreError::Backend {
        kind: err.kind(),
        message: err.to_string(),
        source: None,
    };
    match job {
        Job::Save(s) => drop(s.reply.send(Err(copy()))),
        Job::Delete { reply, .. } => drop(reply.send(Err(copy()))),
        Job::Settings { reply } => drop(reply.send(Err(copy()))),
    }
}

fn apply_save(conn: &Connection, job: &SaveJob, path: &str) -> Result<Acct, StoreError> {
    let ctx = |what: &str| format!("{what} run {:?} in {path}", job.run_id);
    let row: Option<(i64, i64, i64, i64)> = conn
        .prepare_cached(
            "SELECT version, next, snapshot_bytes, delta_bytes FROM runs WHERE run_id = ?1",
        )
        .and_then(|mut st| {
            st.query_row([&job.run_id], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .optional()
        })
        .map_err(|e| map_err(e, &ctx("reading")))?;
    let found = row.map(|r| r.0 as u64);
    if found != job.expected {
        return Err(StoreError::Conflict {
            run_id: job.run_id.clone(),
            expected: job.expected,
            found,
        });
    }
    let version = job.expected.map_or(1, |v| v + 1);
    let h = &job.head;
    let acct = match &job.body {
        Body::Delta { step } => {
            let (_, next, snapshot_bytes, delta_bytes) =
                row.ok_or_else(|| StoreError::Conflict {
                    run_id: job.run_id.clone(),
                    expected: job.expected,
                    found: None,
                })?;
            if next as usize != step.index {
                return Err(StoreError::Conflict {
                    run_id: job.run_id.clone(),
                    expected: job.expected,
                    found,
                });
            }
            let delta_bytes = delta_bytes as u64 + step.update.len() as u64;
            conn.prepare_cached(
                "UPDATE runs SET workflow = ?2, status = ?3, next = ?4, version = ?5, format = ?6,
                    updated_at = ?7, attempts = ?8, error = ?9, writer = ?10, delta_bytes = ?11
                 WHERE run_id = ?1",
            )
            .and_then(|mut st| {
                st.execute(params![
                    job.run_id,
                    h.workflow,
                    h.status,
                    h.next as i64,
                    version as i64,
                    h.format,
                    h.updated_at as i64,
                    h.attempts,
                    h.error,
                    h.writer as i64,
                    delta_bytes as i64,
                ])
            })
            .map_err(|e| map_err(e, &ctx("updating")))?;
            insert_step(conn, &job.run_id, step)
                .map_err(|e| map_err(e, &ctx("recording a step of")))?;
            Acct {
                version,
                next: h.next,
                snapshot_bytes: snapshot_bytes as u64,
                delta_bytes,
            }
        }
        Body::Snapshot {
            state,
            completed,
            step,
        } => {
            conn.prepare_cached(
                "INSERT INTO runs (run_id, workflow, status, next, version, format, created_at, updated_at,
                    attempts, error, writer, snapshot, snapshot_completed, snapshot_next, snapshot_bytes, delta_bytes)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?4, ?14, 0)
                 ON CONFLICT (run_id) DO UPDATE SET workflow = ?2, status = ?3, next = ?4, version = ?5,
                    format = ?6, created_at = ?7, updated_at = ?8, attempts = ?9, error = ?10, writer = ?11,
                    snapshot = ?12, snapshot_completed = ?13, snapshot_next = ?4, snapshot_bytes = ?14,
                    delta_bytes = 0",
            )
            .and_then(|mut st| {
                st.execute(params![
                    job.run_id,
                    h.workflow,
                    h.status,
                    h.next as i64,
                    version as i64,
                    h.format,
                    h.created_at as i64,
                    h.updated_at as i64,
                    h.attempts,
                    h.error,
                    h.writer as i64,
                    state,
                    completed,
                    state.len() as i64,
                ])
            })
            .map_err(|e| map_err(e, &ctx("writing")))?;
            conn.prepare_cached("DELETE FROM steps WHERE run_id = ?1 AND idx >= ?2")
                .and_then(|mut st| st.execute(params![job.run_id, h.next as i64]))
                .map_err(|e| map_err(e, &ctx("trimming the history of")))?;
            if let Some(step) = step.as_ref().filter(|s| s.index < h.next) {
                insert_step(conn, &job.run_id, step)
                    .map_err(|e| map_err(e, &ctx("recording a step of")))?;
            }
            Acct {
                version,
                next: h.next,
                snapshot_bytes: state.len() as u64,
                delta_bytes: 0,
            }
        }
    };
    Ok(acct)
}

fn insert_step(conn: &Connection, run_id: &str, s: &StepRow) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "INSERT OR REPLACE INTO steps (run_id, idx, name, update_json, attempt, started_at, finished_at, duration_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        run_id,
        s.index as i64,
        s.name,
        s.update,
        s.attempt,
        s.started_at as i64,
        s.finished_at as i64,
        s.finished_at.saturating_sub(s.started_at) as i64,
    ])
}

fn apply_delete(conn: &Connection, run_id: &str, path: &str) -> Result<bool, StoreError> {
    let ctx = format!("deleting run {run_id:?} in {path}");
    conn.prepare_cached("DELETE FROM steps WHERE run_id = ?1")
        .and_then(|mut st| st.execute([run_id]))
        .map_err(|e| map_err(e, &ctx))?;
    let n = conn
        .prepare_cached("DELETE FROM runs WHERE run_id = ?1")
        .and_then(|mut st| st.execute([run_id]))
        .map_err(|e| map_err(e, &ctx))?;
    Ok(n > 0)
}
