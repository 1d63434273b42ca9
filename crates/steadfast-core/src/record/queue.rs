//! Where a run stands in the workers' queue: its priority and the partition
//! (a tenant, say) it shares fairly with others, set when it is started,
//! and the one rule by which every store orders the due runs a worker
//! claims ([`fair_order`]).
//!
//! ```
//! use steadfast_core::{fair_order, Queue};
//! // Tenant a has four due runs, tenant b one, and one urgent run is due last.
//! let due = [
//!     ("a1", 1, Queue::new(0, Some("a")).unwrap()),
//!     ("a2", 2, Queue::new(0, Some("a")).unwrap()),
//!     ("a3", 3, Queue::new(0, Some("a")).unwrap()),
//!     ("a4", 4, Queue::new(0, Some("a")).unwrap()),
//!     ("b1", 5, Queue::new(0, Some("b")).unwrap()),
//!     ("urgent", 6, Queue::new(10, None).unwrap()),
//! ];
//! let order = fair_order(due.iter().map(|(id, at, q)| (*id, *at, q)), 4, 7);
//! // The urgent run; then a's and b's first, in the claim's drawn order;
//! // then a's second.
//! assert_eq!(order[0], "urgent");
//! assert!(order[1..3] == ["a1", "b1"] || order[1..3] == ["b1", "a1"]);
//! assert_eq!(order[3], "a2");
//! ```

use serde::{Deserialize, Serialize};

/// The highest priority (and, negated, the lowest).
pub const MAX_PRIORITY: i32 = 1_000;

/// The longest partition key, in bytes.
pub const MAX_PARTITION_BYTES: usize = 64;

/// A run's place in the queue: higher priorities are claimed first, and
/// within a priority the runs of each partition take turns.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Queue {
    /// From -1000 to 1000; 0 when not set.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: i32,
    /// The partition (a tenant, a user) whose runs share turns with other
    /// partitions' runs of the same priority; runs without one share one
    /// partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

impl Queue {
    /// A place of `priority` in `partition`, checked.
    pub fn new(priority: i32, partition: Option<&str>) -> Result<Self, String> {
        let q = Queue {
            priority,
            partition: partition.map(str::to_string),
        };
        q.check()?;
        Ok(q)
    }

    /// Whether it says nothing (priority 0, no partition): such a run's
    /// record carries no queue.
    pub fn is_default(&self) -> bool {
        self.priority == 0 && self.partition.is_none()
    }

    /// Checks the priority's range and the partition key: 1 to 64 bytes of
    /// ASCII letters, digits, `_`, `-`, `.`, `/`, `:` and `@`.
    pub fn check(&self) -> Result<(), String> {
        if !(-MAX_PRIORITY..=MAX_PRIORITY).contains(&self.priority) {
            return Err(format!(
                "a priority is from -{MAX_PRIORITY} to {MAX_PRIORITY}, not {}",
                self.priority
            ));
        }
        if let Some(p) = &self.partition {
            if p.is_empty() || p.len() > MAX_PARTITION_BYTES {
                return Err(format!(
                    "a partition key is 1 to {MAX_PARTITION_BYTES} bytes, not {}",
                    p.len()
                ));
            }
            if let Some(c) = p.chars().find(|c| {
                !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | ':' | '@'))
            }) {
                return Err(format!(
                    "the partition key {:?} has {c:?}; use letters, digits, '_', '-', '.', '/', ':' and '@'",
                    p.chars().take(64).collect::<String>()
                ));
            }
        }
        Ok(())
    }
}

/// Orders due runs for a claim of at most `limit`: higher priority first;
/// within a priority, round by round over the partitions (each partition's
/// earliest due run in the first round, its second in the second, …), and
/// within a round the partitions in an order drawn from `seed` (see
/// [`partition_rank`]), then by due time and id. A partition with ten
/// thousand due runs therefore gets one run per round like a partition
/// with ten, and a claimer that draws a new seed at each claim takes each
/// partition first equally often, however few runs it claims at a time.
///
/// `due` gives each run's id, its due time (any ordered key) and its queue.
pub fn fair_order<'a, T: Ord + Copy>(
    due: impl IntoIterator<Item = (&'a str, T, &'a Queue)>,
    limit: usize,
    seed: u64,
) -> Vec<&'a str> {
    let mut runs: Vec<(&'a str, T, &'a Queue)> = due.into_iter().collect();
    // Each run's round: its rank by due time within its priority and partition.
    runs.sort_by(|a, b| {
        (b.2.priority, &a.2.partition, a.1, a.0).cmp(&(a.2.priority, &b.2.partition, b.1, b.0))
    });
    let mut ranked: Vec<(i32, usize, u64, T, &'a str)> = Vec::with_capacity(runs.len());
    let mut round = 0;
    for (i, (id, at, q)) in runs.iter().enumerate() {
        let same = i > 0 && {
            let prev = runs[i - 1].2;
            prev.priority == q.priority && prev.partition == q.partition
        };
        round = if same { round + 1 } else { 0 };
        let rank = partition_rank(q.partition.as_deref(), seed);
        ranked.push((-q.priority, round, rank, *at, id));
    }
    ranked.sort();
    ranked.into_iter().take(limit).map(|r| r.4).collect()
}

/// Where `partition` (none: the runs without one) stands within a round
/// of a claim drawn with `seed`: the first 8 bytes of SHA-256 over the
/// seed in decimal, a space, and the partition key. PostgreSQL computes
/// the same in its claim.
pub fn partition_rank(partition: Option<&str>, seed: u64) -> u64 {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    hash.update(seed.to_string().as_bytes());
    hash.update(b" ");
    hash.update(partition.unwrap_or("").as_bytes());
    let digest = hash.finalize();
    u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Claims of one run at a time with a fresh seed each take every
    /// partition first about equally often.
    #[test]
    fn fresh_seeds_share_single_claims_between_partitions() {
        let (a, b) = (
            Queue::new(0, Some("a")).unwrap(),
            Queue::new(0, Some("b")).unwrap(),
        );
        let due = [("a1", 1, &a), ("a2", 2, &a), ("b1", 3, &b)];
        let firsts = (0..1_000u64)
            .filter(|seed| fair_order(due, 1, *seed) == ["b1"])
            .count();
        assert!(
            (400..=600).contains(&firsts),
            "b first {firsts} times in 1000"
        );
        // One seed, one order: the same claim twice gives the same runs.
        assert_eq!(fair_order(due, 3, 9), fair_order(due, 3, 9));
        assert_eq!(partition_rank(Some("a"), 1), partition_rank(Some("a"), 1));
        assert_ne!(partition_rank(Some("a"), 1), partition_rank(Some("a"), 2));
    }

    #[test]
    fn bad_places_are_refused_with_what_is_wrong() {
        assert!(Queue::new(1_001, None)
            .unwrap_err()
            .contains("-1000 to 1000"));
        assert!(Queue::new(-1_001, None)
            .unwrap_err()
            .contains("-1000 to 1000"));
        assert!(Queue::new(0, Some(""))
            .unwrap_err()
            .contains("1 to 64 bytes"));
        assert!(Queue::new(0, Some(&"t".repeat(65)))
            .unwrap_err()
            .contains("1 to 64 bytes"));
        assert!(Queue::new(0, Some("a b")).unwrap_err().contains("' '"));
        assert!(Queue::new(0, Some("a\u{7}"))
            .unwrap_err()
            .contains("\\u{7}"));
        assert!(Queue::new(-1_000, Some("tenant:42/eu@x")).is_ok());
        assert!(Queue::default().is_default());
        let v = serde_json::json!({"priority": 1, "partition": "a", "x": 1});
        assert!(serde_json::from_value::<Queue>(v).is_err());
    }

    proptest! {
        /// Whatever the due runs, the claim takes the highest priorities
        /// first, and within the priority it stops at, no partition gets a
        /// second run before every partition with runs left got one.
        #[test]
        fn a_claim_is_by_priority_then_by_turns(
            runs in prop::collection::vec((0u8..3, 0u8..4, 0u32..1000), 0..60),
            limit in 0usize..70,
            seed in any::<u64>(),
        ) {
            let places: Vec<(String, u32, Queue)> = runs
                .iter()
                .enumerate()
                .map(|(i, (p, part, at))| {
                    (format!("r{i:03}"), *at, Queue::new(i32::from(*p), Some(&format!("t{part}"))).unwrap())
                })
                .collect();
            let order = fair_order(places.iter().map(|(id, at, q)| (id.as_str(), *at, q)), limit, seed);
            prop_assert_eq!(order.len(), limit.min(places.len()));
            let place = |id: &str| places.iter().find(|p| p.0 == id).unwrap();
            // Priorities never rise along the claim, and every run left out
            // has a priority no higher than the last one taken.
            for w in order.windows(2) {
                prop_assert!(place(w[0]).2.priority >= place(w[1]).2.priority);
            }
            if let Some(last) = order.last() {
                let floor = place(last).2.priority;
                for p in &places {
                    if !order.contains(&p.0.as_str()) {
                        prop_assert!(p.2.priority <= floor);
                    }
                }
                // Within the lowest priority taken: the counts taken per
                // partition differ by at most one, unless a partition ran out.
                let mut taken: std::collections::BTreeMap<&str, usize> = Default::default();
                let mut left: std::collections::BTreeMap<&str, usize> = Default::default();
                for p in places.iter().filter(|p| p.2.priority == floor) {
                    let part = p.2.partition.as_deref().unwrap();
                    if order.contains(&p.0.as_str()) {
                        *taken.entry(part).or_default() += 1;
                    } else {
                        *left.entry(part).or_default() += 1;
                    }
                }
                let most = taken.values().copied().max().unwrap_or(0);
                for part in left.keys() {
                    prop_assert!(taken.get(part).copied().unwrap_or(0) + 1 >= most,
                        "partition {} waits while another had {} turns", part, most);
                }
                // Within a partition, earlier due first.
                for w in order.windows(2) {
                    let (a, b) = (place(w[0]), place(w[1]));
                    if a.2 == b.2 && a.1 > b.1 {
                        // b comes after a though due earlier: only allowed
                        // when b is in a later round, which cannot be.
                        prop_assert!(false, "{} before {} in one partition", a.0, b.0);
                    }
                }
            }
        }
    }
}
