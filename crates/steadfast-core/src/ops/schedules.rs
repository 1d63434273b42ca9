//! Adding, listing and removing schedules (`steadfast schedule`), and the
//! look a [`Worker`](crate::Worker) takes at them: every slot that came due
//! starts one run, whose id is the schedule's name and the slot, so two
//! workers never start a slot twice and a worker that was down catches up
//! (at most the schedule's catch-up of missed slots besides the latest).
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use steadfast_core::{schedule_ops, MemoryStore, CronSchedule, SystemClock};
//! let store = MemoryStore::new();
//! let hourly = CronSchedule::new("hourly", "report", "0 * * * *", "UTC")?;
//! schedule_ops::add_schedule(&store, hourly, &SystemClock).await?;
//! let all = schedule_ops::list_schedules(&store).await?;
//! assert_eq!(all[0].schedule.name, "hourly");
//! assert!(schedule_ops::remove_schedule(&store, "hourly").await?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use crate::engine::workflow::Workflow;
use crate::ops::start::{start, start_with, StartOptions};
use crate::record::clock::{Clock, Timestamp};
use crate::record::error::{invalid_input, store_error, Error, StoreError, StoreErrorKind};
use crate::record::schedule::{check_schedule_name, CronSchedule, SCHEDULE_PREFIX};
use crate::store::{documents_of, Store};

/// A schedule as stored, with its document's version and its next slot.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct ScheduleEntry {
    /// The schedule, with the latest slot dealt with (`since`).
    #[serde(flatten)]
    pub schedule: CronSchedule,
    /// The first slot after `since`: the next run it starts.
    pub next: Option<Timestamp>,
    /// The document's version.
    pub version: u64,
}

impl ScheduleEntry {
    fn new(schedule: CronSchedule, version: u64) -> Self {
        let next = schedule.next_after(schedule.since);
        ScheduleEntry {
            schedule,
            next,
            version,
        }
    }
}

/// What one look at the schedules did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Fired {
    /// Runs started now (a slot another worker started first is not counted).
    pub started: u64,
    /// Schedules that had more missed slots than their catch-up.
    pub skipped: u64,
}

fn corrupt(op: &str, key: &str, reason: String) -> Error {
    store_error(
        "",
        op,
        StoreError::Corrupt {
            location: format!("document {key:?}"),
            reason,
        },
    )
}

/// What a schedule's document holds: the schedule, or the mark its
/// removal left. A removal writes the mark instead of deleting the
/// document, so the document's version only ever grows and a worker's
/// compare-and-swap on an old version can never land on a schedule added
/// again under the same name.
enum Stored {
    Live(CronSchedule),
    Removed,
}

/// Reads the document under `key`: a schedule whose name is the key's, or
/// a removal mark.
fn read(key: &str, value: &serde_json::Value) -> Result<Stored, String> {
    if value.get("removed") == Some(&serde_json::Value::Bool(true)) {
        return Ok(Stored::Removed);
    }
    let s = CronSchedule::from_value(value)?;
    if key.strip_prefix(SCHEDULE_PREFIX) != Some(s.name.as_str()) {
        return Err(format!(
            "it names schedule {:?}, not the one its key does",
            s.name
        ));
    }
    Ok(Stored::Live(s))
}

fn removed_mark(at: Timestamp) -> serde_json::Value {
    serde_json::json!({"removed": true, "at": at})
}

/// Adds `schedule`, dealing with the slots after `clock`'s now (earlier
/// ones never start): pass the store's clock (a worker judges slots by it;
/// [`StoreExt::clock`](crate::StoreExt::clock), else the system's). Refused when
/// a schedule of that name exists (remove it first) or a part is wrong.
pub async fn add_schedule<S: Store + ?Sized>(
    store: &S,
    schedule: CronSchedule,
    clock: &dyn Clock,
) -> Result<ScheduleEntry, Error> {
    let schedule = schedule.since(clock.now());
    let what = format!("schedule {:?}", schedule.name);
    schedule.check().map_err(|r| invalid_input(&what, r))?;
    // Its input becomes each run's first state: one the store cannot keep
    // would fail every slot.
    if let Some(max) = store.capabilities().max_state_bytes {
        let size = serde_json::to_vec(&schedule.input).map_or(0, |v| v.len()) as u64;
        if size > max {
            return Err(invalid_input(
                &what,
                format!("its input is {size} bytes; a run's state on this store is at most {max}"),
            ));
        }
    }
    let op = format!("adding schedule {:?}", schedule.name);
    let docs = documents_of(store).map_err(|e| store_error("", &op, e))?;
    let key = schedule.document_key();
    for _ in 0..100 {
        let expected = match docs
            .get_document(&key)
            .await
            .map_err(|e| store_error("", &op, e))?
        {
            None => None,
            Some(d) => match read(&d.key, &d.value).map_err(|r| corrupt(&op, &key, r))? {
                Stored::Removed => Some(d.version),
                Stored::Live(_) => {
                    return Err(invalid_input(
                        &what,
                        "a schedule of that name exists; remove it first".into(),
                    ))
                }
            },
        };
        match docs
            .put_document(&key, &schedule.to_value(), expected)
            .await
        {
            Ok(version) => return Ok(ScheduleEntry::new(schedule, version)),
            Err(e) if e.kind() == StoreErrorKind::Conflict => continue,
            Err(e) => return Err(store_error("", &op, e)),
        }
    }
    Err(store_error("", &op, lost_race(key)))
}

fn lost_race(key: String) -> StoreError {
    StoreError::Conflict {
        run_id: key,
        expected: None,
        found: None,
    }
}

/// Every schedule on the store, by name. A document that cannot be read is
/// an error naming its key.
pub async fn list_schedules<S: Store + ?Sized>(store: &S) -> Result<Vec<ScheduleEntry>, Error> {
    let op = "listing schedules";
    let docs = documents_of(store).map_err(|e| store_error("", op, e))?;
    let found = docs
        .list_documents(SCHEDULE_PREFIX)
        .await
        .map_err(|e| store_error("", op, e))?;
    let mut out = Vec::new();
    for d in found {
        if let Stored::Live(s) = read(&d.key, &d.value).map_err(|r| corrupt(op, &d.key, r))? {
            out.push(ScheduleEntry::new(s, d.version));
        }
    }
    Ok(out)
}

/// Removes schedule `name`; `false` when there is none. Runs it started
/// are left as they are.
pub async fn remove_schedule<S: Store + ?Sized>(store: &S, name: &str) -> Result<bool, Error> {
    check_schedule_name(name).map_err(|r| invalid_input("the schedule's name", r))?;
    let op = format!("removing schedule {name:?}");
    let docs = documents_of(store).map_err(|e| store_error("", &op, e))?;
    let key = format!("{SCHEDULE_PREFIX}{name}");
    let now = crate::engine::Runner::new(store).now();
    for _ in 0..100 {
        let Some(d) = docs
            .get_document(&key)
            .await
            .map_err(|e| store_error("", &op, e))?
        else {
            return Ok(false);
        };
        // A document that does not read is removed all the same.
        if let Ok(Stored::Removed) = read(&d.key, &d.value) {
            return Ok(false);
        }
        match docs
            .put_document(&key, &removed_mark(now), Some(d.version))
            .await
        {
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == StoreErrorKind::Conflict => continue,
            Err(e) => return Err(store_error("", &op, e)),
        }
    }
    Err(store_error("", &op, lost_race(key)))
}

/// Whether a failed start may succeed if tried again soon (the store was
/// out of reach, or the outcome is unknown), rather than never.
fn passing(e: &Error) -> bool {
    e.store_error().is_some_and(|s| {
        matches!(
            s.kind(),
            StoreErrorKind::Unavailable | StoreErrorKind::OutcomeUnknown | StoreErrorKind::Conflict
        )
    })
}

/// Starts the due slots of every schedule whose workflow `registry` finds
/// (`None`: not here; `Some(None)`: a durable function; else the listed
/// workflow),
/// then moves each schedule's `since` to its latest slot. A run is started
/// before the schedule moves on, so a worker that dies between the two
/// leaves a start that the next look repeats, which changes nothing. A
/// slot whose run cannot start for good (its id taken by another run, an
/// input the store refuses) is logged and passed over; one that may start
/// later (the store out of reach) leaves its schedule as it is for the next
/// look. A schedule that cannot be read is logged and passed over; one
/// schedule never holds up another.
pub(crate) async fn fire<'r, S: Store + ?Sized>(
    store: &S,
    registry: impl Fn(&str) -> Option<Option<&'r Workflow>>,
    now: Timestamp,
) -> Result<Fired, Error> {
    let op = "looking at schedules";
    let docs = documents_of(store).map_err(|e| store_error("", op, e))?;
    let mut fired = Fired::default();
    let found = docs
        .list_documents(SCHEDULE_PREFIX)
        .await
        .map_err(|e| store_error("", op, e))?;
    'schedules: for mut doc in found {
        // A few rounds: another worker may move the schedule meanwhile.
        for _ in 0..10 {
            let schedule = match read(&doc.key, &doc.value) {
                Ok(Stored::Live(s)) => s,
                Ok(Stored::Removed) => break,
                Err(reason) => {
                    tracing::warn!(key = %doc.key, reason, "a schedule cannot be read; it is passed over");
                    break;
                }
            };
            let Some(listed) = registry(&schedule.workflow) else {
                break;
            };
            let due = match schedule.due(now) {
                Ok(due) if !due.slots.is_empty() => due,
                Ok(_) => break,
                Err(reason) => {
                    tracing::warn!(schedule = %schedule.name, reason, "a schedule's slots cannot be found; it is passed over");
                    break;
                }
            };
            if due.skipped {
                fired.skipped += 1;
                tracing::warn!(
                    schedule = %schedule.name,
                    catch_up = schedule.catch_up,
                    "more slots were missed than the schedule catches up; the older ones are skipped"
                );
            }
            for &slot in &due.slots {
                let run_id = schedule.run_id(slot);
                let started = match listed {
                    Some(wf) => {
                        // Its steps, but no version: workers of several
                        // versions may fire the same slot, and the run is
                        // pinned to the version that first runs it.
                        let mut options = StartOptions::new().listed(wf);
                        options.version = None;
                        start_with(store, wf.name(), &run_id, schedule.input.clone(), &options)
                            .await
                    }
                    None => {
                        start(
                            store,
                            &schedule.workflow,
                            &run_id,
                            schedule.input.clone(),
                            true,
                        )
                        .await
                    }
                };
                match started {
                    Ok(true) => {
                        fired.started += 1;
                        tracing::info!(schedule = %schedule.name, run_id, "a schedule started a run");
                    }
                    Ok(false) => {}
                    Err(e) if passing(&e) => {
                        tracing::warn!(schedule = %schedule.name, run_id, error = %crate::record::error::chain(&e), "a schedule's run could not start yet; trying again at the next look");
                        continue 'schedules;
                    }
                    Err(e) => {
                        tracing::warn!(schedule = %schedule.name, run_id, error = %crate::record::error::chain(&e), "a schedule's run cannot start; the slot is passed over");
                    }
                }
            }
            let latest = *due.slots.last().expect("a slot");
            let name = schedule.name.clone();
            let moved = schedule.since(latest).to_value();
            match docs.put_document(&doc.key, &moved, Some(doc.version)).await {
                Ok(_) => break,
                Err(e) if e.kind() == StoreErrorKind::Conflict => {
                    match docs.get_document(&doc.key).await {
                        Ok(Some(d)) => doc = d,
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!(key = %doc.key, error = %e, "a schedule could not be read again; it is looked at next time");
                            continue 'schedules;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(schedule = %name, error = %e, "a schedule could not be moved on; its slots are looked at again");
                    continue 'schedules;
                }
            }
        }
    }
    Ok(fired)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::clock::ManualClock;
    use crate::{update, MemoryStore};

    fn at(text: &str) -> Timestamp {
        Timestamp::from(humantime::parse_rfc3339(text).unwrap())
    }

    fn workflow() -> Workflow {
        Workflow::builder("wf")
            .step("a", |_, _| async { update(serde_json::json!({})) })
            .build()
            .unwrap()
    }

    /// A look that read a schedule before it was removed and added again
    /// cannot write the old one over the new: a removal leaves a mark, so
    /// the document's version never goes back.
    #[tokio::test]
    async fn a_schedule_added_again_is_never_overwritten_by_a_stale_look() {
        let store = MemoryStore::new();
        let clock = ManualClock::new(at("2026-12-03T00:00:00Z"));
        let old = CronSchedule::new("s", "wf", "* * * * * *", "UTC").unwrap();
        add_schedule(&store, old, &clock).await.unwrap();
        let docs = documents_of(&store).unwrap();
        let stale = docs.get_document("schedule:s").await.unwrap().unwrap();
        assert!(remove_schedule(&store, "s").await.unwrap());
        assert!(!remove_schedule(&store, "s").await.unwrap());
        assert!(list_schedules(&store).await.unwrap().is_empty());
        let new = CronSchedule::new("s", "wf", "0 0 * * *", "Asia/Tokyo").unwrap();
        add_schedule(&store, new, &clock).await.unwrap();
        let r = docs
            .put_document("schedule:s", &stale.value, Some(stale.version))
            .await;
        assert!(matches!(r, Err(e) if e.kind() == StoreErrorKind::Conflict));
        let listed = list_schedules(&store).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].schedule.cron, "0 0 * * *");
    }

    /// A slot whose run id another run has is passed over, and one
    /// schedule's trouble holds up no other: both move on.
    #[tokio::test]
    async fn a_slot_taken_by_another_run_is_passed_over_and_other_schedules_fire() {
        let wf = workflow();
        let store = MemoryStore::new();
        let clock = ManualClock::new(at("2026-12-03T00:00:00Z"));
        for name in ["a", "b"] {
            let s = CronSchedule::new(name, "wf", "* * * * * *", "UTC")
                .unwrap()
                .catch_up(5);
            add_schedule(&store, s, &clock).await.unwrap();
        }
        start(
            &store,
            "other",
            "a@2026-12-03T00:00:01Z",
            serde_json::json!({}),
            false,
        )
        .await
        .unwrap();
        let fired = fire(
            &store,
            |n| (n == "wf").then_some(Some(&wf)),
            at("2026-12-03T00:00:02.500Z"),
        )
        .await
        .unwrap();
        assert_eq!(fired.started, 3, "a's second slot and both of b's");
        for id in [
            "a@2026-12-03T00:00:02Z",
            "b@2026-12-03T00:00:01Z",
            "b@2026-12-03T00:00:02Z",
        ] {
            assert_eq!(
                store.load(id).await.unwrap().unwrap().workflow,
                "wf",
                "{id}"
            );
        }
        for e in list_schedules(&store).await.unwrap() {
            assert_eq!(
                e.schedule.since,
                at("2026-12-03T00:00:02Z"),
                "{}",
                e.schedule.name
            );
        }
        // Looked at again at once: nothing more to start.
        let again = fire(
            &store,
            |n| (n == "wf").then_some(Some(&wf)),
            at("2026-12-03T00:00:02.900Z"),
        )
        .await
        .unwrap();
        assert_eq!(again.started, 0);
    }

    /// A document that names another schedule than its key, or does not
    /// read, is passed over by the look and named by the listing.
    #[tokio::test]
    async fn a_changed_schedule_document_is_passed_over_and_named() {
        let wf = workflow();
        let store = MemoryStore::new();
        let s = CronSchedule::new("x", "wf", "* * * * * *", "UTC").unwrap();
        let docs = documents_of(&store).unwrap();
        docs.put_document("schedule:y", &s.to_value(), None)
            .await
            .unwrap();
        let fired = fire(
            &store,
            |n| (n == "wf").then_some(Some(&wf)),
            at("2026-12-03T00:00:02Z"),
        )
        .await
        .unwrap();
        assert_eq!(fired.started, 0);
        let e = list_schedules(&store).await.unwrap_err();
        let text = crate::record::error::chain(&e);
        assert!(text.contains("schedule:y"), "{text}");
        // It can still be removed by the key's name.
        assert!(remove_schedule(&store, "y").await.unwrap());
    }
}
