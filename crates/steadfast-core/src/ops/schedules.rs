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

use crate::ops::worker::{start, start_listed, Registry};
use crate::record::clock::{Clock, Timestamp};
use crate::record::error::{Error, StoreError, StoreErrorKind};
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

fn invalid(what: &str, reason: String) -> Error {
    Error::InvalidInput {
        what: what.to_string(),
        reason,
    }
}

fn store_err(op: &str, e: StoreError) -> Error {
    Error::Store {
        run_id: String::new(),
        op: op.to_string(),
        source: e,
    }
}

fn corrupt(op: &str, key: &str, reason: String) -> Error {
    store_err(
        op,
        StoreError::Corrupt {
            location: format!("document {key:?}"),
            reason,
        },
    )
}

/// Adds `schedule`, dealing with the slots after `clock`'s now (earlier
/// ones never start). Refused when a schedule of that name exists (remove
/// it first) or a part is wrong.
pub async fn add_schedule<S: Store + ?Sized>(
    store: &S,
    schedule: CronSchedule,
    clock: &dyn Clock,
) -> Result<ScheduleEntry, Error> {
    let schedule = schedule.since(clock.now());
    schedule
        .check()
        .map_err(|r| invalid(&format!("schedule {:?}", schedule.name), r))?;
    let op = format!("adding schedule {:?}", schedule.name);
    let docs = documents_of(store).map_err(|e| store_err(&op, e))?;
    match docs
        .put_document(&schedule.document_key(), &schedule.to_value(), None)
        .await
    {
        Ok(version) => Ok(ScheduleEntry::new(schedule, version)),
        Err(e) if e.kind() == StoreErrorKind::Conflict => Err(invalid(
            &format!("schedule {:?}", schedule.name),
            "a schedule of that name exists; remove it first".into(),
        )),
        Err(e) => Err(store_err(&op, e)),
    }
}

/// Every schedule on the store, by name.
pub async fn list_schedules<S: Store + ?Sized>(store: &S) -> Result<Vec<ScheduleEntry>, Error> {
    let op = "listing schedules";
    let docs = documents_of(store).map_err(|e| store_err(op, e))?;
    let found = docs
        .list_documents(SCHEDULE_PREFIX)
        .await
        .map_err(|e| store_err(op, e))?;
    found
        .into_iter()
        .map(|d| {
            let s = CronSchedule::from_value(&d.value).map_err(|r| corrupt(op, &d.key, r))?;
            Ok(ScheduleEntry::new(s, d.version))
        })
        .collect()
}

/// Removes schedule `name`; `false` when there is none. Runs it started
/// are left as they are.
pub async fn remove_schedule<S: Store + ?Sized>(store: &S, name: &str) -> Result<bool, Error> {
    check_schedule_name(name).map_err(|r| invalid("the schedule's name", r))?;
    let op = format!("removing schedule {name:?}");
    let docs = documents_of(store).map_err(|e| store_err(&op, e))?;
    let key = format!("{SCHEDULE_PREFIX}{name}");
    for _ in 0..100 {
        let Some(d) = docs
            .get_document(&key)
            .await
            .map_err(|e| store_err(&op, e))?
        else {
            return Ok(false);
        };
        if docs
            .delete_document(&key, d.version)
            .await
            .map_err(|e| store_err(&op, e))?
        {
            return Ok(true);
        }
    }
    Err(store_err(
        &op,
        StoreError::Conflict {
            run_id: key,
            expected: None,
            found: None,
        },
    ))
}

/// Starts the due slots of every schedule whose workflow `registry` has,
/// then moves each schedule's `since` to its latest slot. A run is started
/// before the schedule moves on, so a worker that dies between the two
/// leaves a start that the next look repeats, which changes nothing. A
/// schedule that cannot be read, or a slot whose run id another run has,
/// is logged and passed over; a store error ends the look.
pub(crate) async fn fire<S: Store + ?Sized>(
    store: &S,
    registry: &Registry,
    now: Timestamp,
) -> Result<Fired, Error> {
    let op = "looking at schedules";
    let docs = documents_of(store).map_err(|e| store_err(op, e))?;
    let mut fired = Fired::default();
    let found = docs
        .list_documents(SCHEDULE_PREFIX)
        .await
        .map_err(|e| store_err(op, e))?;
    for mut doc in found {
        // A few rounds: another worker may move the schedule meanwhile.
        for _ in 0..10 {
            let schedule = match CronSchedule::from_value(&doc.value) {
                Ok(s) => s,
                Err(reason) => {
                    tracing::warn!(key = %doc.key, reason, "a schedule cannot be read; it is passed over");
                    break;
                }
            };
            let Some(listed) = registry.listed(&schedule.workflow) else {
                break;
            };
            let due = match schedule.due(now) {
                Ok(due) if !due.slots.is_empty() => due,
                _ => break,
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
                    Some(wf) => start_listed(store, wf, &run_id, schedule.input.clone()).await,
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
                    Err(e @ Error::Store { .. }) => return Err(e),
                    Err(e) => {
                        tracing::warn!(schedule = %schedule.name, run_id, error = %crate::record::error::chain(&e), "a schedule's run could not start; the slot is passed over");
                    }
                }
            }
            let latest = *due.slots.last().expect("a slot");
            let moved = schedule.since(latest).to_value();
            match docs.put_document(&doc.key, &moved, Some(doc.version)).await {
                Ok(_) => break,
                Err(e) if e.kind() == StoreErrorKind::Conflict => {
                    match docs.get_document(&doc.key).await {
                        Ok(Some(d)) => doc = d,
                        // Removed meanwhile.
                        Ok(None) => break,
                        Err(e) => return Err(store_err(op, e)),
                    }
                }
                Err(e) => return Err(store_err(op, e)),
            }
        }
    }
    Ok(fired)
}
