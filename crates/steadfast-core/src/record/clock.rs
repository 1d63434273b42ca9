//! Wall-clock time for checkpoints, behind a trait so tests can control it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A point in wall-clock time with millisecond precision, stored as RFC 3339 text
/// (`2026-11-29T18:20:05.123Z`) so a checkpoint stays readable.
///
/// Timestamps lie between the Unix epoch and [`Timestamp::MAX`], the last
/// millisecond of the year 9999 (the last one RFC 3339 can write): every
/// constructor and every addition saturates there, so formatting one never fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

/// Milliseconds from the Unix epoch to 9999-12-31T23:59:59.999Z.
const MAX_MILLIS: u64 = 253_402_300_799_999;

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// The latest timestamp: 9999-12-31T23:59:59.999Z.
    pub const MAX: Timestamp = Timestamp(MAX_MILLIS);

    /// A timestamp `ms` milliseconds after the Unix epoch, or [`Timestamp::MAX`]
    /// if that lies beyond it.
    ///
    /// ```
    /// use steadfast_core::Timestamp;
    /// assert_eq!(Timestamp::from_unix_millis(u64::MAX), Timestamp::MAX);
    /// assert_eq!(Timestamp::MAX.to_string(), "9999-12-31T23:59:59.999Z");
    /// ```
    pub const fn from_unix_millis(ms: u64) -> Self {
        if ms > MAX_MILLIS {
            Timestamp(MAX_MILLIS)
        } else {
            Timestamp(ms)
        }
    }

    /// Milliseconds since the Unix epoch.
    pub const fn unix_millis(self) -> u64 {
        self.0
    }

    /// This timestamp plus `d`, saturating at [`Timestamp::MAX`].
    pub fn saturating_add(self, d: Duration) -> Self {
        Timestamp::from_unix_millis(
            self.0
                .saturating_add(d.as_millis().min(u64::MAX as u128) as u64),
        )
    }

    /// How far `self` lies after `earlier` (zero when it does not).
    pub fn saturating_since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    fn to_system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.0)
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Self {
        let ms = t
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis().min(u64::MAX as u128) as u64)
            .unwrap_or(0);
        Timestamp::from_unix_millis(ms)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}",
            humantime::format_rfc3339_millis(self.to_system_time())
        )
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(d)?;
        humantime::parse_rfc3339(&text)
            .map(Timestamp::from)
            .map_err(|e| serde::de::Error::custom(format!("bad timestamp {text:?}: {e}")))
    }
}

/// Where the run loop reads the time. Inject a [`ManualClock`] in tests so that
/// timestamps (and later, leases and timers) are deterministic.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current wall-clock time.
    fn now(&self) -> Timestamp;
}

/// The operating system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::from(SystemTime::now())
    }
}

/// A clock that moves only when told to.
///
/// ```
/// use std::time::Duration;
/// use steadfast_core::{Clock, ManualClock, Timestamp};
///
/// let clock = ManualClock::new(Timestamp::from_unix_millis(1_000));
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(clock.now().unix_millis(), 3_000);
/// ```
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock that reads `start` until advanced.
    pub fn new(start: Timestamp) -> Self {
        ManualClock(AtomicU64::new(start.unix_millis()))
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.0
            .fetch_add(d.as_millis().min(u64::MAX as u128) as u64, Ordering::SeqCst);
    }

    /// Sets the clock to `t`.
    pub fn set(&self, t: Timestamp) {
        self.0.store(t.unix_millis(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_unix_millis(self.0.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamp_round_trips_through_json() -> Result<(), serde_json::Error> {
        let t = Timestamp::from_unix_millis(1_764_440_405_123);
        let text = serde_json::to_string(&t)?;
        assert_eq!(text, "\"2025-11-29T18:20:05.123Z\"");
        assert_eq!(serde_json::from_str::<Timestamp>(&text)?, t);
        Ok(())
    }

    #[test]
    fn far_future_timestamps_saturate_and_round_trip() -> Result<(), serde_json::Error> {
        let far = Timestamp::EPOCH.saturating_add(Duration::from_secs(u64::MAX));
        assert_eq!(far, Timestamp::MAX);
        let text = serde_json::to_string(&far)?;
        assert_eq!(text, "\"9999-12-31T23:59:59.999Z\"");
        assert_eq!(serde_json::from_str::<Timestamp>(&text)?, far);
        let clock = ManualClock::new(Timestamp::MAX);
        clock.advance(Duration::from_secs(10_000 * 366 * 86_400));
        assert_eq!(clock.now(), Timestamp::MAX);
        Ok(())
    }

    #[test]
    fn bad_timestamp_text_is_an_error() {
        assert!(serde_json::from_str::<Timestamp>("\"yesterday\"").is_err());
    }
}
