//! The ranges every input must lie in: durations, and the sizes of the text
//! that a checkpoint carries besides its state.
//!
//! Each range is checked where the value enters (flow files, command-line
//! flags, builders), so that a duration like `10000y` is refused with the name
//! of the field instead of overflowing a timestamp or sleeping for ever.

use std::fmt;
use std::time::Duration;

/// An inclusive range of durations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DurationRange {
    /// The shortest duration allowed.
    pub min: Duration,
    /// The longest duration allowed.
    pub max: Duration,
}

const DAY: u64 = 24 * 60 * 60;
/// A year as durations are written (`1y`): 365.25 days.
const YEAR: u64 = 31_557_600;

/// A step's timeout: 1 ms to 1 year.
pub const STEP_TIMEOUT: DurationRange = DurationRange {
    min: Duration::from_millis(1),
    max: Duration::from_secs(YEAR),
};

/// A durable timer: 0 to 1 year.
pub const SLEEP: DurationRange = DurationRange {
    min: Duration::ZERO,
    max: Duration::from_secs(YEAR),
};

/// A gate's timeout: 0 to 1 year.
pub const GATE_TIMEOUT: DurationRange = SLEEP;

/// A delay between attempts (first and largest): 0 to 1 day.
pub const BACKOFF: DurationRange = DurationRange {
    min: Duration::ZERO,
    max: Duration::from_secs(DAY),
};

/// A lease's time to live: 100 ms to 1 day. Shorter leases cannot be renewed
/// in time; longer ones keep a crashed holder's runs stuck for too long.
pub const LEASE: DurationRange = DurationRange {
    min: Duration::from_millis(100),
    max: Duration::from_secs(DAY),
};

/// The most attempts a step may have (its first and every retry).
pub const MAX_ATTEMPTS: u32 = 1000;

/// The largest flow file read, in bytes.
pub const MAX_FLOW_BYTES: u64 = 1 << 20;

/// The longest rejection reason, in bytes.
pub const MAX_REASON_BYTES: usize = 64 * 1024;

/// The longest recorded error message, in bytes; longer ones are cut to it
/// (keeping their start and end) when a failure is recorded.
pub const MAX_ERROR_BYTES: usize = 64 * 1024;

impl DurationRange {
    /// Whether `d` lies in the range.
    pub fn contains(&self, d: Duration) -> bool {
        self.min <= d && d <= self.max
    }

    /// `d` if it lies in the range; otherwise an error that names `field`,
    /// the value and the range.
    ///
    /// ```
    /// use std::time::Duration;
    /// use steadfast_core::limits::STEP_TIMEOUT;
    /// assert!(STEP_TIMEOUT.check("timeout", Duration::from_secs(30)).is_ok());
    /// let err = STEP_TIMEOUT.check("timeout", Duration::ZERO).unwrap_err();
    /// assert_eq!(err, "timeout of 0s is out of range: it must be from 1ms to 1year");
    /// ```
    pub fn check(&self, field: &str, d: Duration) -> Result<Duration, String> {
        if self.contains(d) {
            Ok(d)
        } else {
            Err(format!(
                "{field} of {} is out of range: it must be {self}",
                show(d)
            ))
        }
    }
}

impl fmt::Display for DurationRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "from {} to {}", show(self.min), show(self.max))
    }
}

/// A duration as people write it (`1h 30m`), shortened to whole milliseconds.
pub(crate) fn show(d: Duration) -> String {
    let ms = Duration::from_millis(d.as_millis().min(u64::MAX as u128) as u64);
    humantime::format_duration(ms).to_string()
}

/// Cuts `text` to at most `max` bytes on a character boundary, keeping its
/// start and its end (where an error's cause usually is) around a marker.
pub(crate) fn cut_middle(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    const MARK: &str = " [...] ";
    let keep = max.saturating_sub(MARK.len()) / 2;
    let mut head = keep;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - keep;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}{MARK}{}", &text[..head], &text[tail..])
}

/// The longest version a step or a workflow may declare, in bytes.
pub const MAX_VERSION_BYTES: usize = 100;

/// Checks a declared version (of a step or a workflow): 1 to
/// [`MAX_VERSION_BYTES`](crate::version::MAX_VERSION_BYTES) bytes, no control characters; `what` names it in
/// the reason.
///
/// ```
/// use steadfast_core::version::check_version;
/// assert!(check_version("the version", "2026-12-01").is_ok());
/// assert!(check_version("the version", "").is_err());
/// assert!(check_version("the version", "a\nb").is_err());
/// ```
pub fn check_version(what: &str, version: &str) -> Result<(), String> {
    if version.is_empty() || version.len() > MAX_VERSION_BYTES {
        return Err(format!(
            "{what} is 1 to {MAX_VERSION_BYTES} bytes, not {}",
            version.len()
        ));
    }
    if version.chars().any(char::is_control) {
        return Err(format!(
            "{what} {:?} holds a control character",
            version.chars().take(64).collect::<String>()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ranges_name_the_field_and_the_bounds() {
        let err = SLEEP
            .check("sleep", Duration::from_secs(10_000 * 366 * DAY))
            .unwrap_err();
        assert!(err.starts_with("sleep of "), "{err}");
        assert!(err.ends_with("from 0s to 1year"), "{err}");
        assert!(LEASE.check("--lease", Duration::ZERO).is_err());
        assert!(LEASE.check("--lease", Duration::from_secs(30)).is_ok());
    }

    proptest! {
        #[test]
        fn cut_text_fits_and_keeps_both_ends(s in "\\PC{0,300}", max in 8usize..200) {
            let cut = cut_middle(s.clone(), max);
            if s.len() <= max {
                prop_assert_eq!(cut, s);
            } else {
                prop_assert!(cut.len() <= max);
                prop_assert!(cut.contains("[...]"));
            }
        }
    }
}
