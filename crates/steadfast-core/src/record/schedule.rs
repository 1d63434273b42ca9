//! Schedules: a workflow started once per slot of a cron expression, read
//! in an explicit time zone. A schedule is kept in one document of the
//! store with the last slot dealt with; a run's id is the schedule's name
//! and its slot, so a slot is started at most once however many workers
//! look at it. Pure: the worker reads and writes the document.
//!
//! ```
//! use steadfast_core::{CronSchedule, Timestamp};
//! let at = |text: &str| Timestamp::from(humantime::parse_rfc3339(text).unwrap());
//! let s = CronSchedule::new("hourly", "report", "0 * * * *", "Europe/Berlin")
//!     .unwrap()
//!     .since(at("2026-12-03T10:30:00Z"));
//! // Down from 10:30 to 13:10 (UTC): the slots of 11:00, 12:00 and 13:00
//! // were missed; the latest and one before it start (catch-up 1).
//! let due = s.due(at("2026-12-03T13:10:00Z")).unwrap();
//! assert_eq!(due.slots, [at("2026-12-03T12:00:00Z"), at("2026-12-03T13:00:00Z")]);
//! assert!(due.skipped);
//! assert_eq!(s.run_id(due.slots[1]), "hourly@2026-12-03T13:00:00Z");
//! ```

use std::str::FromStr as _;

use chrono::{DateTime, TimeZone as _, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::record::clock::Timestamp;

/// The prefix of a schedule's document key.
pub const SCHEDULE_PREFIX: &str = "schedule:";

/// The most missed slots a schedule may start besides the latest one.
pub const MAX_CATCH_UP: u32 = 1_000;

/// Missed slots started besides the latest one, unless the schedule says.
pub const DEFAULT_CATCH_UP: u32 = 1;

/// The longest schedule name, in bytes (the run ids it makes stay short).
pub const MAX_SCHEDULE_NAME_BYTES: usize = 100;

/// A schedule: start `workflow` with `input` at every slot of `cron`, read
/// in time zone `zone`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct CronSchedule {
    /// Its name: 1 to 100 bytes of ASCII letters, digits, `_`, `-` and `.`.
    pub name: String,
    /// The workflow each slot starts (a flow's name, a durable function's).
    pub workflow: String,
    /// The cron expression: five fields (minute, hour, day of month, month,
    /// day of week) or six with seconds first.
    pub cron: String,
    /// The IANA time zone the expression is read in (`UTC`, `Europe/Berlin`).
    pub zone: String,
    /// Each run's input: a JSON object, or null for none.
    #[serde(default)]
    pub input: Value,
    /// How many missed slots start besides the latest when a worker finds
    /// several due at once (it was down, or none ran); older ones are
    /// skipped.
    pub catch_up: u32,
    /// Slots up to this time are dealt with: the time the schedule was
    /// added, then the latest slot started.
    pub since: Timestamp,
}

/// The slots of a schedule due at a time.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Due {
    /// The slots to start, oldest first; the last is the latest due.
    pub slots: Vec<Timestamp>,
    /// Whether older due slots were left out (more than the catch-up).
    pub skipped: bool,
}

impl CronSchedule {
    /// A schedule of `workflow` on `cron` in `zone`, from the epoch on
    /// (set [`since`](CronSchedule::since) to the time it is added), with no
    /// input and the default catch-up. Checks every part.
    pub fn new(
        name: impl Into<String>,
        workflow: impl Into<String>,
        cron: impl Into<String>,
        zone: impl Into<String>,
    ) -> Result<Self, String> {
        let s = CronSchedule {
            name: name.into(),
            workflow: workflow.into(),
            cron: cron.into(),
            zone: zone.into(),
            input: Value::Null,
            catch_up: DEFAULT_CATCH_UP,
            since: Timestamp::EPOCH,
        };
        s.check()?;
        Ok(s)
    }

    /// With `input` for each run (a JSON object, or null).
    pub fn input(mut self, input: Value) -> Self {
        self.input = input;
        self
    }

    /// Starting at most `n` missed slots besides the latest.
    pub fn catch_up(mut self, n: u32) -> Self {
        self.catch_up = n;
        self
    }

    /// Dealing only with slots after `t`.
    pub fn since(mut self, t: Timestamp) -> Self {
        self.since = t;
        self
    }

    /// Checks every part: the name, the workflow's name, that the cron
    /// expression parses and ever matches, the zone, the input and the
    /// catch-up.
    pub fn check(&self) -> Result<(), String> {
        check_schedule_name(&self.name)?;
        crate::record::ids::check_step_name(&self.workflow)
            .map_err(|r| format!("the workflow's name: {r}"))?;
        self.parsed()?;
        if !(self.input.is_object() || self.input.is_null()) {
            return Err(format!(
                "the input must be a JSON object, not {}",
                crate::record::state::json_kind(&self.input)
            ));
        }
        if self.catch_up > MAX_CATCH_UP {
            return Err(format!(
                "the catch-up is at most {MAX_CATCH_UP} slots, not {}",
                self.catch_up
            ));
        }
        Ok(())
    }

    /// The document key it is kept under.
    pub fn document_key(&self) -> String {
        format!("{SCHEDULE_PREFIX}{}", self.name)
    }

    /// The id of the run that slot `slot` starts: `NAME@` and the slot in
    /// UTC to the second.
    pub fn run_id(&self, slot: Timestamp) -> String {
        let t = humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(slot.unix_millis()),
        );
        format!("{}@{t}", self.name)
    }

    /// The slots due at `now`: those after [`since`](CronSchedule::since) and no
    /// later than `now`, at most `catch_up + 1` of them (the latest).
    pub fn due(&self, now: Timestamp) -> Result<Due, String> {
        let (cron, tz) = self.parsed()?;
        let mut slots = Vec::new();
        let mut cursor = utc(now).with_timezone(&tz);
        let mut inclusive = true;
        let mut skipped = false;
        loop {
            let slot = match cron.find_previous_occurrence(&cursor, inclusive) {
                Ok(slot) => slot,
                // No earlier slot at all: the search gave up (a slot far
                // older than any `since` is no loss).
                Err(e) if slots.is_empty() && inclusive => {
                    return Err(format!("no slot of {:?} before {now}: {e}", self.cron))
                }
                Err(_) => break,
            };
            let at = timestamp(slot.with_timezone(&Utc));
            if at <= self.since {
                break;
            }
            if slots.len() > self.catch_up as usize {
                skipped = true;
                break;
            }
            slots.push(at);
            cursor = slot;
            inclusive = false;
        }
        slots.reverse();
        Ok(Due { slots, skipped })
    }

    /// The first slot after `t`, if the expression matches again.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        let (cron, tz) = self.parsed().ok()?;
        cron.find_next_occurrence(&utc(t).with_timezone(&tz), false)
            .ok()
            .map(|slot| timestamp(slot.with_timezone(&Utc)))
    }

    /// Reads a stored schedule, checked as on its way in.
    pub fn from_value(value: &Value) -> Result<Self, String> {
        let s: CronSchedule = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
        s.check()?;
        Ok(s)
    }

    /// As stored.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    fn parsed(&self) -> Result<(croner::Cron, chrono_tz::Tz), String> {
        let text = self.cron.trim();
        if text.is_empty() || text.len() > 200 {
            return Err("the cron expression must be 1 to 200 bytes".into());
        }
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .year(croner::parser::Year::Disallowed)
            .build()
            .parse(text)
            .map_err(|e| format!("the cron expression {text:?} does not parse: {e}"))?;
        let tz = chrono_tz::Tz::from_str(self.zone.trim()).map_err(|_| {
            format!(
                "the time zone {:?} is not an IANA zone name (such as UTC or Europe/Berlin)",
                self.zone.chars().take(64).collect::<String>()
            )
        })?;
        // An expression that never matches (the 30th of February) would
        // never start anything: refuse it.
        let probe = utc(Timestamp::from_unix_millis(1_767_225_600_000)).with_timezone(&tz);
        if cron.find_next_occurrence(&probe, false).is_err() {
            return Err(format!("the cron expression {text:?} never matches"));
        }
        Ok((cron, tz))
    }
}

/// Checks a schedule's name: 1 to 100 bytes of ASCII letters, digits, `_`,
/// `-` and `.`.
pub fn check_schedule_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_SCHEDULE_NAME_BYTES {
        return Err(format!(
            "a schedule's name must be 1 to {MAX_SCHEDULE_NAME_BYTES} bytes, not {}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!(
            "the schedule name {:?} has {c:?}; use letters, digits, '_', '-' and '.'",
            name.chars().take(64).collect::<String>()
        ));
    }
    Ok(())
}

fn utc(t: Timestamp) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(t.unix_millis() as i64)
        .single()
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn timestamp(t: DateTime<Utc>) -> Timestamp {
    Timestamp::from_unix_millis(t.timestamp_millis().max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        Timestamp::from(humantime::parse_rfc3339(text).unwrap())
    }

    #[test]
    fn slots_after_since_up_to_now_and_no_more_than_the_catch_up() {
        let s = CronSchedule::new("s", "wf", "*/10 * * * * *", "UTC")
            .unwrap()
            .since(at("2026-12-03T12:00:00Z"))
            .catch_up(2);
        // Nothing due yet, and the slot at `since` itself is dealt with.
        assert!(s
            .due(at("2026-12-03T12:00:09.999Z"))
            .unwrap()
            .slots
            .is_empty());
        let due = s.due(at("2026-12-03T12:00:10Z")).unwrap();
        assert_eq!(due.slots, [at("2026-12-03T12:00:10Z")]);
        assert!(!due.skipped);
        let due = s.due(at("2026-12-03T12:00:35Z")).unwrap();
        assert_eq!(
            due.slots,
            [
                at("2026-12-03T12:00:10Z"),
                at("2026-12-03T12:00:20Z"),
                at("2026-12-03T12:00:30Z")
            ]
        );
        assert!(!due.skipped);
        let due = s.due(at("2026-12-03T12:01:00Z")).unwrap();
        assert_eq!(due.slots.len(), 3);
        assert_eq!(due.slots[2], at("2026-12-03T12:01:00Z"));
        assert!(due.skipped, "12:00:10 to 12:00:30 were left out");
        // A catch-up of 0 starts only the latest.
        let due = s
            .clone()
            .catch_up(0)
            .due(at("2026-12-03T12:01:00Z"))
            .unwrap();
        assert_eq!(due.slots, [at("2026-12-03T12:01:00Z")]);
    }

    #[test]
    fn the_zone_is_the_one_named() {
        // 09:00 in New York on a December day is 14:00 UTC.
        let s = CronSchedule::new("s", "wf", "0 9 * * *", "America/New_York")
            .unwrap()
            .since(at("2026-12-03T00:00:00Z"));
        assert_eq!(
            s.next_after(at("2026-12-03T00:00:00Z")),
            Some(at("2026-12-03T14:00:00Z"))
        );
        assert_eq!(
            s.due(at("2026-12-03T14:00:01Z")).unwrap().slots,
            [at("2026-12-03T14:00:00Z")]
        );
        // In July (daylight saving time) it is 13:00 UTC.
        assert_eq!(
            s.next_after(at("2026-07-01T00:00:00Z")),
            Some(at("2026-07-01T13:00:00Z"))
        );
    }

    #[test]
    fn bad_schedules_are_refused_with_what_is_wrong() {
        let refused = |name: &str, cron: &str, zone: &str| {
            CronSchedule::new(name, "wf", cron, zone).unwrap_err()
        };
        assert!(refused("", "* * * * *", "UTC").contains("1 to 100 bytes"));
        assert!(refused(&"n".repeat(101), "* * * * *", "UTC").contains("1 to 100 bytes"));
        assert!(refused("a b", "* * * * *", "UTC").contains("' '"));
        assert!(refused("a@b", "* * * * *", "UTC").contains("'@'"));
        assert!(refused("s", "61 * * * *", "UTC").contains("does not parse"));
        assert!(refused("s", "", "UTC").contains("1 to 200 bytes"));
        assert!(refused("s", "* * * * * * * *", "UTC").contains("does not parse"));
        assert!(refused("s", "0 0 30 2 *", "UTC").contains("never matches"));
        assert!(refused("s", "* * * * *", "Mars/Olympus").contains("IANA"));
        assert!(refused("s", "* * * * *", "").contains("IANA"));
        let s = CronSchedule::new("s", "wf", "* * * * *", "UTC").unwrap();
        assert!(s
            .clone()
            .catch_up(1_001)
            .check()
            .unwrap_err()
            .contains("at most 1000"));
        assert!(s
            .clone()
            .input(serde_json::json!([1]))
            .check()
            .unwrap_err()
            .contains("array"));
        assert!(CronSchedule::new("s", "", "* * * * *", "UTC")
            .unwrap_err()
            .contains("workflow"));
    }

    #[test]
    fn a_stored_schedule_reads_back_and_a_changed_one_is_refused() {
        let s = CronSchedule::new("nightly", "wf", "0 2 * * *", "Europe/Berlin")
            .unwrap()
            .input(serde_json::json!({"k": 1}))
            .catch_up(3)
            .since(at("2026-12-03T00:00:00Z"));
        assert_eq!(CronSchedule::from_value(&s.to_value()).unwrap(), s);
        let mut v = s.to_value();
        v["cron"] = "nope".into();
        assert!(CronSchedule::from_value(&v).is_err());
        let mut v = s.to_value();
        v["extra"] = 1.into();
        assert!(CronSchedule::from_value(&v).is_err());
    }

    #[test]
    fn run_ids_name_the_schedule_and_the_slot_in_utc() {
        let s = CronSchedule::new("n.1", "wf", "* * * * *", "Asia/Tokyo").unwrap();
        assert_eq!(
            s.run_id(at("2026-12-03T05:07:00Z")),
            "n.1@2026-12-03T05:07:00Z"
        );
        let long = CronSchedule::new("n".repeat(100), "wf", "* * * * *", "UTC").unwrap();
        assert!(crate::record::ids::validate_run_id(&long.run_id(Timestamp::MAX)).is_ok());
    }
}
