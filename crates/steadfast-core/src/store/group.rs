//! Group commit's waiting line, for stores that commit many runs' writes in
//! one transaction (one fsync or one WAL flush for all of them): writes
//! queue here, and whoever commits next takes up to [`MAX_BATCH`] of them.
//! How a store elects the committer and commits is its own.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The most writes one transaction takes.
pub const MAX_BATCH: usize = 256;

/// Writes waiting for a commit, with counts of the commits made.
#[derive(Debug)]
pub struct Queue<J> {
    jobs: Mutex<Vec<J>>,
    commits: AtomicU64,
    writes: AtomicU64,
}

impl<J> Default for Queue<J> {
    fn default() -> Self {
        Queue {
            jobs: Mutex::new(Vec::new()),
            commits: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        }
    }
}

impl<J> Queue<J> {
    /// Queues a write.
    pub fn push(&self, job: J) {
        self.jobs().push(job);
    }

    /// The next batch: up to [`MAX_BATCH`] writes, oldest first.
    pub fn take(&self) -> Vec<J> {
        self.take_up_to(MAX_BATCH)
    }

    /// Up to `n` of the waiting writes (and at most [`MAX_BATCH`]), oldest
    /// first: those that join a batch already begun.
    pub fn take_up_to(&self, n: usize) -> Vec<J> {
        let mut jobs = self.jobs();
        let n = jobs.len().min(n).min(MAX_BATCH);
        jobs.drain(..n).collect()
    }

    /// How many writes are waiting.
    pub fn len(&self) -> usize {
        self.jobs().len()
    }

    /// Whether none is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counts a committed transaction of `writes` writes.
    pub fn committed(&self, writes: usize) {
        self.commits.fetch_add(1, Relaxed);
        self.writes.fetch_add(writes as u64, Relaxed);
    }

    /// Transactions committed, and the writes they carried: with
    /// concurrent runs, more writes than commits is group commit at work.
    pub fn counts(&self) -> (u64, u64) {
        (self.commits.load(Relaxed), self.writes.load(Relaxed))
    }

    /// After a commit shared by `last` writes, gives their callers a moment
    /// to queue their next writes, so that they share the next commit
    /// instead of splitting into two cohorts that alternate: at most
    /// `within`, and only until `last` writes are waiting. A lone write (a
    /// batch of one) never waits. Yields to the runtime as it waits.
    pub async fn gather(&self, last: usize, within: Duration) {
        let start = Instant::now();
        while last > 1 && start.elapsed() < within && self.len() < last {
            tokio::task::yield_now().await;
        }
    }

    fn jobs(&self) -> std::sync::MutexGuard<'_, Vec<J>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn batches_are_bounded_and_counted() {
        let q = Queue::default();
        for i in 0..MAX_BATCH + 3 {
            q.push(i);
        }
        let first = q.take();
        assert_eq!((first.len(), first[0], q.len()), (MAX_BATCH, 0, 3));
        q.committed(first.len());
        assert_eq!(q.counts(), (1, MAX_BATCH as u64));
        // Enough waiting: no wait at all, even with a long limit.
        let start = Instant::now();
        q.gather(2, Duration::from_secs(60)).await;
        assert!(start.elapsed() < Duration::from_secs(30));
        assert_eq!(q.take_up_to(2), vec![MAX_BATCH, MAX_BATCH + 1]);
        assert_eq!(q.take_up_to(5), vec![MAX_BATCH + 2]);
        assert!(q.is_empty());
        for i in 0..MAX_BATCH + 1 {
            q.push(i);
        }
        assert_eq!(q.take_up_to(usize::MAX).len(), MAX_BATCH, "bounded too");
    }

    #[tokio::test]
    async fn after_a_lone_write_there_is_no_wait() {
        let q: Queue<u8> = Queue::default();
        let start = Instant::now();
        q.gather(1, Duration::from_secs(60)).await;
        assert!(start.elapsed() < Duration::from_secs(30));
    }

    /// The wait ends once as many writes are queued as the last commit
    /// carried, whoever queues them; with fewer, it lasts its bound.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_wait_ends_when_as_many_are_back_and_is_bounded() {
        let q: std::sync::Arc<Queue<u8>> = std::sync::Arc::default();
        let pusher = {
            let q = std::sync::Arc::clone(&q);
            std::thread::spawn(move || {
                for i in 0..3 {
                    std::thread::sleep(Duration::from_millis(20));
                    q.push(i);
                }
            })
        };
        let start = Instant::now();
        q.gather(3, Duration::from_secs(60)).await;
        assert_eq!(q.len(), 3, "returned before the writes were back");
        assert!(start.elapsed() < Duration::from_secs(30));
        pusher.join().expect("the pusher");
        q.take();
        q.push(0);
        let start = Instant::now();
        q.gather(3, Duration::from_millis(50)).await;
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(50), "{waited:?}");
        assert!(waited < Duration::from_secs(30), "{waited:?}");
    }
}
