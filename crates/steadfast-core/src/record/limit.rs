//! Shared limits: how many steps holding a key may run at once, and how
//! often they may start (a token bucket), kept in one document per key in
//! the store, and the rules for taking and giving back a slot. Pure: the
//! engine reads and writes the document.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::record::checkpoint::Owner;
use crate::record::clock::Timestamp;

/// The largest concurrency a limit may have.
pub const MAX_LIMIT_SIZE: u32 = 1_000;

/// How often a step waiting for a slot looks again, at most: a waiting run
/// sleeps this long (or until the slot it waits for may be free) between
/// looks, whatever the number of waiters.
pub const LIMIT_RECHECK: Duration = Duration::from_secs(1);

/// How long a slot is held without renewal when the runner has no lease
/// of its own: a holder that dies on another host frees its slot after it.
pub const SLOT_LEASE: Duration = Duration::from_secs(30);

/// The prefix of a limit's document key.
pub const LIMIT_PREFIX: &str = "limit:";

/// What a step declares: the key it holds while it runs, and the size it
/// assumes when the store sets none (`openai:8`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimitSpec {
    /// The shared key.
    pub key: String,
    /// How many steps holding it may run at once, unless the store's
    /// setting (`steadfast limits set`) says otherwise.
    pub size: Option<u32>,
}

impl LimitSpec {
    /// A limit on `key` of `size` at once.
    pub fn new(key: impl Into<String>, size: Option<u32>) -> Result<Self, String> {
        let key = key.into();
        check_limit_key(&key)?;
        if let Some(n) = size {
            check_size(n)?;
        }
        Ok(LimitSpec { key, size })
    }

    /// Reads `KEY` or `KEY:N` (as a flow file writes it).
    ///
    /// ```
    /// use steadfast_core::LimitSpec;
    /// let l = LimitSpec::parse("openai:8").unwrap();
    /// assert_eq!((l.key.as_str(), l.size), ("openai", Some(8)));
    /// assert_eq!(LimitSpec::parse("tool").unwrap().size, None);
    /// assert!(LimitSpec::parse("openai:0").is_err());
    /// assert!(LimitSpec::parse("a b:1").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.rsplit_once(':') {
            Some((key, n)) => {
                let n: u32 = n
                    .trim()
                    .parse()
                    .map_err(|_| format!("the size in {text:?} is not a whole number"))?;
                Self::new(key.trim(), Some(n))
            }
            None => Self::new(text.trim(), None),
        }
    }

    /// The key of its document.
    pub fn document_key(&self) -> String {
        format!("{LIMIT_PREFIX}{}", self.key)
    }
}

/// Checks a limit's key: 1 to 64 bytes of ASCII letters, digits, `_`, `-`,
/// `.` and `/`.
pub fn check_limit_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > 64 {
        return Err(format!(
            "the limit key {:?} must be 1 to 64 bytes",
            key.chars().take(40).collect::<String>()
        ));
    }
    if let Some(c) = key
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/')))
    {
        return Err(format!(
            "the limit key {key:?} has {c:?}; use letters, digits, '_', '-', '.' and '/'"
        ));
    }
    Ok(())
}

fn check_size(n: u32) -> Result<(), String> {
    if !(1..=MAX_LIMIT_SIZE).contains(&n) {
        return Err(format!(
            "a limit's size is from 1 to {MAX_LIMIT_SIZE}, not {n}"
        ));
    }
    Ok(())
}

/// A rate: `tokens` per `per`, with a bucket of `burst`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Rate {
    /// Starts allowed per period.
    pub tokens: f64,
    /// The period, in milliseconds.
    pub per_ms: u64,
    /// The most starts allowed at once after a quiet spell.
    pub burst: f64,
}

impl Rate {
    /// Reads `N/PERIOD` (`500/min`, `10/s`, `2/1h`) with an optional
    /// burst (by default one period's tokens, at least 1).
    ///
    /// ```
    /// use steadfast_core::Rate;
    /// let r = Rate::parse("500/min", None).unwrap();
    /// assert_eq!((r.tokens, r.per_ms, r.burst), (500.0, 60_000, 500.0));
    /// assert_eq!(Rate::parse("10/s", Some(2.0)).unwrap().burst, 2.0);
    /// assert!(Rate::parse("0/s", None).is_err());
    /// assert!(Rate::parse("5", None).is_err());
    /// ```
    pub fn parse(text: &str, burst: Option<f64>) -> Result<Self, String> {
        let (n, per) = text
            .split_once('/')
            .ok_or_else(|| format!("the rate {text:?} is not N/PERIOD (like 500/min)"))?;
        let tokens: f64 = n
            .trim()
            .parse()
            .map_err(|_| format!("the count in the rate {text:?} is not a number"))?;
        let per = per.trim();
        let period = match per {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "m" | "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            "d" | "day" => Duration::from_secs(86_400),
            other => humantime::parse_duration(other)
                .map_err(|e| format!("the period in the rate {text:?}: {e}"))?,
        };
        Self::new(tokens, period, burst)
    }

    /// `tokens` per `period`, with a bucket of `burst` (by default one
    /// period's tokens, at least 1).
    pub fn new(tokens: f64, period: Duration, burst: Option<f64>) -> Result<Self, String> {
        if !(tokens.is_finite() && (1.0..=1e9).contains(&tokens)) {
            return Err(format!(
                "a rate's count is from 1 to 1e9 starts per period, not {tokens} (write 1/2s for half a start a second)"
            ));
        }
        let per_ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX);
        if !(1..=365 * 86_400_000).contains(&per_ms) {
            return Err("a rate's period is from 1 ms to 365 days".into());
        }
        let burst = burst.unwrap_or(tokens.max(1.0));
        if !burst.is_finite() || !(1.0..=1e9).contains(&burst) {
            return Err(format!("a burst is from 1 to 1e9, not {burst}"));
        }
        Ok(Rate {
            tokens,
            per_ms,
            burst,
        })
    }
}

/// One step holding a slot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Slot {
    /// The run.
    pub run: String,
    /// The step.
    pub step: String,
    /// The process that runs it.
    pub owner: Owner,
    /// Until when it holds the slot without renewal.
    pub until: Timestamp,
}

impl Slot {
    /// A slot of `step` of `run`, held by `owner` until `until`.
    pub fn new(run: &str, step: &str, owner: Owner, until: Timestamp) -> Self {
        Slot {
            run: run.to_string(),
            step: step.to_string(),
            owner,
            until,
        }
    }
}

/// A start a waiter was promised at a time of the rate's schedule: it
/// comes back then and starts without being overtaken by newcomers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Reservation {
    /// The run.
    pub run: String,
    /// The step.
    pub step: String,
    /// When its start is due.
    pub at: Timestamp,
}

/// The most starts promised at once; past them, a waiter looks again
/// later without a promise (the document stays small).
pub const MAX_RESERVATIONS: usize = 500;

/// How long a promised start is kept for a waiter that does not come back
/// (it died): then it is given up.
pub const RESERVATION_KEPT: Duration = Duration::from_secs(60);

/// What a look for a slot found ([`LimitDoc::take`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Taken {
    /// A slot is the step's.
    Got,
    /// None is free: look again at this time (nothing to write).
    Wait(Timestamp),
    /// The rate promised the step a start at this time (the document
    /// changed: write it, then come back then).
    Reserved(Timestamp),
}

/// A limit's document: its setting (size, rate), who holds its slots, its
/// bucket, and until when a provider asked everyone to wait.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LimitDoc {
    /// How many steps may hold it at once, as set on the store (else each
    /// step's own size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u32>,
    /// How often steps may start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    /// The steps holding a slot now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<Slot>,
    /// The rate's schedule: when the next start is due if none waits, in
    /// milliseconds since the epoch (a start takes one period's share of
    /// it; the burst lets it lag behind now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_start_ms: Option<f64>,
    /// Starts promised to waiters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved: Vec<Reservation>,
    /// No step starts before this (a provider's "retry after").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_until: Option<Timestamp>,
}

impl LimitDoc {
    /// Reads a document's value.
    pub fn from_value(v: &serde_json::Value) -> Result<Self, String> {
        let doc: LimitDoc = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
        if let Some(n) = doc.size {
            check_size(n)?;
        }
        if let Some(r) = &doc.rate {
            Rate::new(r.tokens, Duration::from_millis(r.per_ms), Some(r.burst))?;
        }
        Ok(doc)
    }

    /// The document's value.
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// Sets the size (none: each step's own) and the rate (none: no rate),
    /// keeping who holds slots; a pause a provider asked for is lifted.
    pub fn configure(&mut self, size: Option<u32>, rate: Option<Rate>) -> Result<(), String> {
        if let Some(n) = size {
            check_size(n)?;
        }
        self.size = size;
        // A setting given by hand lifts a provider's pause.
        self.paused_until = None;
        if rate.as_ref().map(|r| (r.tokens, r.per_ms))
            != self.rate.as_ref().map(|r| (r.tokens, r.per_ms))
        {
            self.next_start_ms = None;
            self.reserved.clear();
        }
        self.rate = rate;
        Ok(())
    }

    /// Drops slots whose time ran out and those of processes `gone` says
    /// have died.
    pub fn expire(&mut self, now: Timestamp, gone: impl Fn(&Owner) -> bool) {
        self.held.retain(|s| s.until > now && !gone(&s.owner));
    }

    /// Takes a slot for `me` (and a start of the rate's, with one) at
    /// `now`, for a step that assumes `size` when the store sets none.
    /// Refused (`Err`) when neither the store nor the step gives a size and
    /// there is no rate.
    ///
    /// The rate is a schedule of starts (a generic cell rate algorithm): a
    /// start is free when the schedule lags no more than the burst behind;
    /// a waiter is promised the next start of the schedule
    /// ([`Taken::Reserved`]) and takes it when it comes back, so waiters
    /// look once each instead of all looking at every start.
    pub fn take(&mut self, me: Slot, size: Option<u32>, now: Timestamp) -> Result<Taken, String> {
        let size = self.size.or(size);
        if size.is_none() && self.rate.is_none() {
            return Err(
                "it has no size: give one in the step (KEY:N) or set one with `steadfast limits set`"
                    .into(),
            );
        }
        // A run's step holds one slot: an earlier holder of it is an attempt
        // that was cut off.
        self.held
            .retain(|s| !(s.run == me.run && s.step == me.step));
        let recheck = now.saturating_add(LIMIT_RECHECK);
        if let Some(p) = self.paused_until.filter(|p| *p > now) {
            return Ok(Taken::Wait(
                p.min(now.saturating_add(Duration::from_secs(3600))),
            ));
        }
        if let Some(n) = size {
            if self.held.len() >= n as usize {
                let first_free = self.held.iter().map(|s| s.until).min().unwrap_or(recheck);
                return Ok(Taken::Wait(first_free.min(recheck)));
            }
        }
        if let Some(rate) = &self.rate {
            let kept = now
                .unix_millis()
                .saturating_sub(RESERVATION_KEPT.as_millis() as u64);
            self.reserved.retain(|r| r.at.unix_millis() >= kept);
            let mine = self
                .reserved
                .iter()
                .position(|r| r.run == me.run && r.step == me.step);
            // A promise is kept for a waiter that comes back within a
            // recheck of its time; one that comes back later has let its
            // start go (else late starters would bunch up with those on
            // time), and takes its place in the schedule again.
            if let Some(i) = mine {
                if self.reserved[i].at.saturating_add(LIMIT_RECHECK) < now {
                    self.reserved.remove(i);
                }
            }
            let mine = self
                .reserved
                .iter()
                .position(|r| r.run == me.run && r.step == me.step);
            match mine {
                Some(i) if self.reserved[i].at <= now => {
                    self.reserved.remove(i);
                }
                Some(i) => return Ok(Taken::Wait(self.reserved[i].at)),
                None if self.reserved.len() >= MAX_RESERVATIONS => {
                    return Ok(Taken::Wait(recheck));
                }
                None => {
                    let interval = rate.per_ms as f64 / rate.tokens;
                    let slack = (rate.burst - 1.0) * interval;
                    let now_ms = now.unix_millis() as f64;
                    let next = self.next_start_ms.unwrap_or(now_ms).max(now_ms);
                    let due = next - slack;
                    if due > now_ms {
                        // Not yet: promised the next start of the schedule.
                        let at = Timestamp::from_unix_millis(due.ceil() as u64);
                        self.next_start_ms = Some(next + interval);
                        self.reserved.push(Reservation {
                            run: me.run.clone(),
                            step: me.step.clone(),
                            at,
                        });
                        return Ok(Taken::Reserved(at));
                    }
                    self.next_start_ms = Some(next + interval);
                }
            }
        }
        self.held.push(me);
        Ok(Taken::Got)
    }

    /// Moves the slot of `step` of `run` held by `owner` on to `until`;
    /// `false` when it holds none (it ran out and was taken).
    pub fn renew(&mut self, run: &str, step: &str, owner: &Owner, until: Timestamp) -> bool {
        match self
            .held
            .iter_mut()
            .find(|s| s.run == run && s.step == step && s.owner == *owner)
        {
            Some(s) => {
                s.until = s.until.max(until);
                true
            }
            None => false,
        }
    }

    /// Gives back the slot of `step` of `run` held by `owner`.
    pub fn release(&mut self, run: &str, step: &str, owner: &Owner) -> bool {
        let before = self.held.len();
        self.held
            .retain(|s| !(s.run == run && s.step == step && s.owner == *owner));
        self.held.len() != before
    }

    /// Asks every step of the key to wait until `until` (a provider's
    /// "retry after"); a later pause already set stays.
    pub fn pause(&mut self, until: Timestamp) {
        self.paused_until = Some(self.paused_until.map_or(until, |p| p.max(until)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_unix_millis(1_000_000 + ms)
    }

    fn slot(run: &str, pid: u32, until: u64) -> Slot {
        Slot::new(run, "s", Owner::new("h", pid, 1), at(until))
    }

    #[test]
    fn slots_are_taken_up_to_the_size_and_freed_by_release_expiry_or_death() {
        let mut d = LimitDoc::default();
        assert!(d.take(slot("a", 1, 100), None, at(0)).is_err(), "no size");
        assert_eq!(d.take(slot("a", 1, 100), Some(2), at(0)), Ok(Taken::Got));
        assert_eq!(d.take(slot("b", 2, 150), Some(2), at(0)), Ok(Taken::Got));
        assert_eq!(
            d.take(slot("c", 3, 100), Some(2), at(0)),
            Ok(Taken::Wait(at(100)))
        );
        // The store's size wins over the step's.
        d.size = Some(3);
        assert_eq!(d.take(slot("c", 3, 100), Some(2), at(0)), Ok(Taken::Got));
        d.size = None;
        assert!(d.release("c", "s", &Owner::new("h", 3, 1)));
        assert!(!d.release("c", "s", &Owner::new("h", 3, 1)));
        // Expired at 100; a dead holder at once.
        d.expire(at(100), |_| false);
        assert_eq!(d.held.len(), 1);
        d.expire(at(101), |o| o.pid == 2);
        assert!(d.held.is_empty());
        // A step that takes its slot again replaces the cut-off attempt's.
        assert_eq!(d.take(slot("a", 1, 100), Some(1), at(0)), Ok(Taken::Got));
        assert_eq!(d.take(slot("a", 9, 500), Some(1), at(1)), Ok(Taken::Got));
        assert_eq!(d.held.len(), 1);
        assert!(d.renew("a", "s", &Owner::new("h", 9, 1), at(900)));
        assert!(!d.renew("a", "s", &Owner::new("h", 1, 1), at(900)));
    }

    #[test]
    fn a_rate_admits_its_starts_over_time_in_order_and_a_pause_holds_everyone() {
        let mut d = LimitDoc {
            rate: Some(Rate::parse("10/s", Some(2.0)).unwrap()),
            ..LimitDoc::default()
        };
        // Fifty eager starters at once: the burst of 2 now, the others
        // promised a start each, 100 ms apart, in the order they came.
        let mut promised = Vec::new();
        for i in 0..50 {
            match d.take(slot(&format!("r{i}"), 1, 50), None, at(0)).unwrap() {
                Taken::Got => assert!(i < 2, "{i} started at once"),
                Taken::Reserved(t) => promised.push((i, t)),
                Taken::Wait(t) => panic!("{i} was told to wait until {t:?} without a promise"),
            }
            d.held.clear();
        }
        assert_eq!(promised.len(), 48);
        for (n, (_, t)) in promised.iter().enumerate() {
            assert_eq!(*t, at(100 * (n as u64 + 1)), "start {n}");
        }
        // Back early: told to wait for its time; on time: it starts, and a
        // newcomer meanwhile is promised a time after every earlier promise.
        let (i, t) = promised[5];
        assert_eq!(
            d.take(slot(&format!("r{i}"), 1, 50), None, at(10)),
            Ok(Taken::Wait(t))
        );
        assert_eq!(
            d.take(slot(&format!("r{i}"), 1, 50), None, t),
            Ok(Taken::Got)
        );
        assert_eq!(
            d.take(slot("late", 1, 50), None, t),
            Ok(Taken::Reserved(at(4900)))
        );
        // A promise nobody comes back for is given up after a minute.
        assert!(d.reserved.iter().any(|r| r.run == "r9"));
        d.held.clear();
        let _ = d.take(slot("later", 1, 50), None, at(70_000)).unwrap();
        assert!(!d.reserved.iter().any(|r| r.run == "r9"));
        d.pause(at(90_000));
        assert_eq!(
            d.take(slot("x", 1, 0), None, at(80_000)),
            Ok(Taken::Wait(at(90_000)))
        );
        d.pause(at(85_000));
        assert_eq!(d.paused_until, Some(at(90_000)));
    }

    #[test]
    fn settings_are_checked() {
        assert!(LimitSpec::parse(":3").is_err());
        assert!(LimitSpec::parse("k:1001").is_err());
        assert!(Rate::parse("0.5/s", None).is_err());
        assert!(Rate::parse("5e-324/s", None).is_err());
        // A setting given by hand lifts a pause; promises are bounded.
        let mut d = LimitDoc::default();
        d.pause(Timestamp::from_unix_millis(u64::MAX / 2));
        d.configure(Some(2), Rate::parse("1/h", Some(1.0)).ok())
            .unwrap();
        assert_eq!(d.paused_until, None);
        let t = Timestamp::from_unix_millis(1_000_000);
        let mut promised = 0;
        for i in 0..(MAX_RESERVATIONS + 10) {
            let me = Slot::new(&format!("r{i}"), "s", Owner::new("h", 1, 1), t);
            match d.take(me, None, t).unwrap() {
                Taken::Reserved(_) => promised += 1,
                Taken::Got => d.held.clear(),
                Taken::Wait(_) => {}
            }
        }
        assert_eq!(promised, MAX_RESERVATIONS);
        assert!(Rate::parse("1/0s", None).is_err());
        assert!(Rate::parse("NaN/s", None).is_err());
        assert!(Rate::parse("1/s", Some(0.5)).is_err());
        assert!(LimitDoc::from_value(&serde_json::json!({"size": 0})).is_err());
        assert!(LimitDoc::from_value(&serde_json::json!({"size": 2, "x": 1})).is_ok());
        let mut d = LimitDoc::default();
        assert!(d.configure(Some(0), None).is_err());
    }
}
