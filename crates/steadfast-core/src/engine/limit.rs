//! A step's slot of a shared limit, through the store's documents: taken
//! before an attempt (or a time to look again), renewed while it runs,
//! given back when it returns; and a provider's "retry after" set on the
//! key for everyone.

use std::time::Duration;

use crate::engine::process::holder_is_running;
use crate::engine::Runner;
use crate::record::checkpoint::Owner;
use crate::record::clock::Timestamp;
use crate::record::error::{Error, StoreErrorKind};
use crate::record::limit::{LimitDoc, LimitSpec, Slot, Taken, SLOT_LEASE};
use crate::store::{documents_of, Documents, Store};

/// How many times a write of a limit's document is tried against other
/// writers before giving up for now.
const TRIES: usize = 200;

/// Woken when this process gives a slot back, so that its own waiters look
/// again at once rather than at their next time (other processes' waiters
/// look at theirs).
static RELEASED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Waits until `left` has passed or this process gave a slot back.
pub(crate) async fn until_free(left: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(left) => {}
        _ = RELEASED.notified() => {}
    }
}

/// A slot this process holds for a step.
pub(crate) struct Held {
    key: String,
    run: String,
    step: String,
    owner: Owner,
    ttl: Duration,
}

impl Held {
    /// How often the slot is renewed while its step runs.
    pub(crate) fn renew_every(&self) -> Duration {
        (self.ttl / 3).max(Duration::from_millis(10))
    }
}

/// What a look for a slot found.
pub(crate) enum Take {
    /// Taken.
    Held(Held),
    /// None free: look again at this time.
    Wait(Timestamp),
}

fn store_err(run_id: &str, what: String, e: crate::StoreError) -> Error {
    crate::engine::store_error(run_id, &what, e)
}

/// Reads a limit's document (its version too; a new one reads as empty).
async fn read(
    docs: &dyn Documents,
    key: &str,
) -> Result<(LimitDoc, Option<u64>), crate::StoreError> {
    match docs.get_document(key).await? {
        None => Ok((LimitDoc::default(), None)),
        Some(d) => {
            let doc =
                LimitDoc::from_value(&d.value).map_err(|reason| crate::StoreError::Corrupt {
                    location: format!("document {key:?}"),
                    reason,
                })?;
            Ok((doc, Some(d.version)))
        }
    }
}

/// Changes a limit's document by compare-and-swap, trying again when
/// another writer came first; `change` says whether there is anything to
/// write and what to return.
async fn update<T>(
    docs: &dyn Documents,
    key: &str,
    mut change: impl FnMut(&mut LimitDoc) -> Result<(bool, T), Error>,
) -> Result<Result<T, crate::StoreError>, Error> {
    // One change of a key at a time in this process: its steps would only
    // meet each other's writes and try again (other processes still may).
    let turn = local_turn(key);
    let _turn = turn.lock().await;
    let mut last = None;
    for i in 0..TRIES {
        let (mut doc, version) = match read(docs, key).await {
            Ok(x) => x,
            Err(e) => return Ok(Err(e)),
        };
        let (write, out) = change(&mut doc)?;
        if !write {
            return Ok(Ok(out));
        }
        match docs.put_document(key, &doc.to_value(), version).await {
            Ok(_) => return Ok(Ok(out)),
            Err(e) if e.kind() == StoreErrorKind::Conflict => {
                last = Some(e);
                // Spread the writers out a little as they keep meeting.
                let spread = fastrand::u64(0..=(1 + i as u64).min(20));
                tokio::time::sleep(Duration::from_millis(spread)).await;
            }
            Err(e) => return Ok(Err(e)),
        }
    }
    Ok(Err(last.unwrap_or_else(|| crate::StoreError::Conflict {
        run_id: key.to_string(),
        expected: None,
        found: None,
    })))
}

/// The most keys [`local_turn`] remembers before it starts over.
const MAX_TURNS: usize = 4096;

/// This process's turn at changing the document of `key`.
fn local_turn(key: &str) -> std::sync::Arc<tokio::sync::Mutex<()>> {
    static TURNS: std::sync::Mutex<
        Option<std::collections::HashMap<String, std::sync::Arc<tokio::sync::Mutex<()>>>>,
    > = std::sync::Mutex::new(None);
    let mut turns = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    let map = turns.get_or_insert_with(Default::default);
    if map.len() >= MAX_TURNS && !map.contains_key(key) {
        // Only turns nobody waits for are dropped.
        map.retain(|_, t| std::sync::Arc::strong_count(t) > 1);
    }
    std::sync::Arc::clone(map.entry(key.to_string()).or_default())
}

/// Whether the holder of a slot is surely gone (a dead process on this
/// host).
fn gone(owner: &Owner) -> bool {
    holder_is_running(owner) == Some(false)
}

/// Looks for a slot of `spec` for `step` of `run`.
pub(crate) async fn take<S: Store + ?Sized>(
    r: &Runner<'_, S>,
    spec: &LimitSpec,
    run: &str,
    step: &str,
) -> Result<Take, Error> {
    let docs = documents_of(&*r.store).map_err(|e| {
        store_err(
            run,
            format!("taking a slot of limit {:?} for step {step:?}", spec.key),
            e,
        )
    })?;
    let (owner, ttl) = match &r.lease {
        Some((owner, ttl)) => (owner.clone(), *ttl),
        None => (crate::engine::process::current_owner(), SLOT_LEASE),
    };
    let key = spec.document_key();
    let reclaimed = r.slot_reclaimed.clone();
    let took = update(docs, &key, |doc| {
        let now = r.clock.now();
        if let Some(hook) = &reclaimed {
            // Their steps go before their slots do.
            for s in doc.held.iter().filter(|s| s.until > now && gone(&s.owner)) {
                hook(&s.owner, &s.run);
            }
        }
        doc.expire(now, gone);
        let me = Slot::new(run, step, owner.clone(), now.saturating_add(ttl));
        match doc.take(me, spec.size, now) {
            Err(reason) => Err(Error::InvalidWorkflow {
                workflow: String::new(),
                reason: format!("step {step:?}: limit {:?}: {reason}", spec.key),
            }),
            Ok(Taken::Got) => Ok((true, None)),
            Ok(Taken::Wait(at)) => Ok((false, Some((at, false)))),
            Ok(Taken::Reserved(at)) => Ok((true, Some((at, true)))),
        }
    })
    .await?;
    match took {
        Ok(None) => Ok(Take::Held(Held {
            key,
            run: run.to_string(),
            step: step.to_string(),
            owner,
            ttl,
        })),
        // A promised start: back exactly then.
        Ok(Some((at, true))) => Ok(Take::Wait(at)),
        // Waiters for a slot spread out over up to half a recheck, so that
        // many of them do not all come back at the same instant to find one.
        Ok(Some((at, false))) => {
            let spread =
                fastrand::u64(0..=crate::record::limit::LIMIT_RECHECK.as_millis() as u64 / 2);
            Ok(Take::Wait(at.saturating_add(Duration::from_millis(spread))))
        }
        // Many writers at once, or a document grown to its limit (its
        // holders' run ids are long): look again soon.
        Err(e)
            if matches!(
                e.kind(),
                StoreErrorKind::Conflict | StoreErrorKind::TooLarge
            ) =>
        {
            Ok(Take::Wait(
                r.clock.now().saturating_add(Duration::from_millis(50)),
            ))
        }
        Err(e) => Err(store_err(
            run,
            format!("taking a slot of limit {:?} for step {step:?}", spec.key),
            e,
        )),
    }
}

/// Moves the slot's time on while its step runs. A slot that ran out and
/// was taken by another step is said in the log: the step goes on.
pub(crate) async fn renew<S: Store + ?Sized>(r: &Runner<'_, S>, held: &Held) {
    let Ok(docs) = documents_of(&*r.store) else {
        return;
    };
    let out = update(docs, &held.key, |doc| {
        let until = r.clock.now().saturating_add(held.ttl);
        let had = doc.renew(&held.run, &held.step, &held.owner, until);
        Ok((had, had))
    })
    .await;
    match out {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => {
            tracing::warn!(run_id = %held.run, step = %held.step, key = %held.key, "a step's slot of its limit ran out before it was renewed; the step goes on");
        }
        Ok(Err(e)) | Err(Error::Store { source: e, .. }) => {
            tracing::warn!(run_id = %held.run, key = %held.key, error = %e, "could not renew a step's slot")
        }
        Err(_) => {}
    }
}

/// Gives the slot back. When the store cannot take it now, the slot frees
/// itself when its time runs out.
pub(crate) async fn release<S: Store + ?Sized>(r: &Runner<'_, S>, held: Held) {
    let Ok(docs) = documents_of(&*r.store) else {
        return;
    };
    let out = update(docs, &held.key, |doc| {
        let had = doc.release(&held.run, &held.step, &held.owner);
        Ok((had, ()))
    })
    .await;
    if let Ok(Err(e)) = out {
        tracing::warn!(run_id = %held.run, key = %held.key, error = %e, "could not give back a step's slot; it frees itself when its time runs out");
    }
    RELEASED.notify_waiters();
}

/// Asks every step of the slot's key to wait until `until` (a provider's
/// "retry after").
pub(crate) async fn pause<S: Store + ?Sized>(r: &Runner<'_, S>, key: &LimitSpec, until: Timestamp) {
    let Ok(docs) = documents_of(&*r.store) else {
        return;
    };
    let out = update(docs, &key.document_key(), |doc| {
        doc.pause(until);
        Ok((true, ()))
    })
    .await;
    if let Ok(Err(e)) = out {
        tracing::warn!(key = %key.key, error = %e, "could not pause a limit as a step's provider asked");
    }
}
