//! How often and how long a caller tries again: the one policy every retry loop in maxrs follows
//! (Cloud Storage requests, the Vertex AI and Cloud Logging calls, a process registering with its
//! coordinator). What counts as worth retrying stays with each caller; how many tries, how long
//! between them and until when is decided here.

use std::time::{Duration, Instant};

/// Tries, exponential backoff and an optional deadline.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Tries in all, the first included (`u32::MAX`: only the deadline bounds them).
    pub attempts: u32,
    /// The wait after the first failed try; each later wait doubles, up to `max_delay`.
    pub base_delay: Duration,
    /// Cap on one wait, a server's `Retry-After` included.
    pub max_delay: Duration,
    /// Each wait is drawn between half and all of the backoff, so that processes failing
    /// together (a job's processes waiting for their coordinator) do not retry in lockstep.
    pub jitter: bool,
    /// How long the tries may take in all, waits included (`None`: `attempts` alone bounds them).
    pub deadline: Option<Duration>,
}

impl Default for RetryPolicy {
    /// A Google API's: 5 tries, waits of 2 s doubling up to a minute.
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            base_delay: Duration::from_secs(2),
            max_delay: Duration::from_secs(60),
            jitter: false,
            deadline: None,
        }
    }
}

impl RetryPolicy {
    /// The wait after failed try `attempt` (from 1), before jitter.
    pub fn backoff(&self, attempt: u32) -> Duration {
        self.base_delay.saturating_mul(1 << attempt.saturating_sub(1).min(16)).min(self.max_delay)
    }

    /// Starts counting tries (and the deadline's clock).
    pub fn tries(&self) -> Tries<'_> {
        Tries { policy: self, attempt: 1, deadline: self.deadline.map(|d| Instant::now() + d) }
    }
}

/// The tries of one operation under a [`RetryPolicy`].
pub struct Tries<'a> {
    policy: &'a RetryPolicy,
    attempt: u32,
    deadline: Option<Instant>,
}

impl Tries<'_> {
    /// The try under way, from 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Tries in all.
    pub fn attempts(&self) -> u32 {
        self.policy.attempts.max(1)
    }

    /// Whether the try under way is the last: the tries are used up or the deadline has passed.
    pub fn last(&self) -> bool {
        self.attempt >= self.attempts() || self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Time left before the deadline (`None`: there is none).
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline.map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// Moves on to the next try and returns how long to wait before it: `asked` (a server's
    /// `Retry-After`) or the backoff, at most `max_delay` and never past the deadline.
    pub fn next(&mut self, asked: Option<Duration>) -> Duration {
        let mut wait = asked.unwrap_or_else(|| self.policy.backoff(self.attempt)).min(self.policy.max_delay);
        if self.policy.jitter && asked.is_none() {
            wait = wait.mul_f64(0.5 + rand::random::<f64>() / 2.0);
        }
        self.attempt = self.attempt.saturating_add(1);
        self.remaining().map_or(wait, |left| wait.min(left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let p = RetryPolicy {
            attempts: 9,
            base_delay: Duration::from_secs(2),
            max_delay: Duration::from_secs(10),
            ..RetryPolicy::default()
        };
        assert_eq!([1, 2, 3, 4].map(|a| p.backoff(a).as_secs()), [2, 4, 8, 10]);
    }

    #[test]
    fn tries_end_at_the_count_or_the_deadline() {
        let p = RetryPolicy { attempts: 3, base_delay: Duration::from_millis(1), ..RetryPolicy::default() };
        let mut tries = p.tries();
        assert!(!tries.last());
        assert_eq!(tries.next(Some(Duration::from_secs(600))), Duration::from_secs(60), "Retry-After is capped");
        tries.next(None);
        assert!(tries.last() && tries.attempt() == 3);

        let p = RetryPolicy {
            attempts: u32::MAX,
            base_delay: Duration::from_secs(1),
            jitter: true,
            deadline: Some(Duration::from_millis(50)),
            ..RetryPolicy::default()
        };
        let mut tries = p.tries();
        assert!(!tries.last());
        assert!(tries.next(None) <= Duration::from_millis(50), "no wait past the deadline");
        std::thread::sleep(Duration::from_millis(60));
        assert!(tries.last());
    }
}
