//! Backoff with jitter, bounded: every wait here has a ceiling and every
//! retry loop a deadline, so a failing API slows the dispatcher down but
//! never makes it spin or wait forever.

use std::time::Duration;

/// The delay before attempt `n` (0-based): `base * 2^n`, capped at `cap`,
/// then jittered to between half and all of it so that many dispatchers
/// failing together do not retry together.
pub fn backoff(n: u32, base: Duration, cap: Duration) -> Duration {
    let full = base
        .checked_mul(1u32.checked_shl(n.min(20)).unwrap_or(u32::MAX))
        .unwrap_or(cap)
        .min(cap);
    jitter(full)
}

/// Somewhere between half of `d` and all of it.
pub fn jitter(d: Duration) -> Duration {
    let half = d / 2;
    half + half.mul_f64(fastrand::f64())
}

/// The wait after an empty poll: one to three seconds, as the official
/// worker waits, so that idle environments cost the API little.
pub fn idle_poll_wait() -> Duration {
    Duration::from_millis(1000 + fastrand::u64(0..2000))
}

/// The wait after an empty poll that took `took`: none when the server
/// held the poll (half its block time or more), else `idle_poll_wait`.
pub fn after_empty_poll(took: Duration) -> Duration {
    if took >= Duration::from_millis(u64::from(crate::api::POLL_BLOCK_MS) / 2) {
        Duration::ZERO
    } else {
        idle_poll_wait()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_stays_under_its_cap() {
        let base = Duration::from_millis(500);
        let cap = Duration::from_secs(10);
        for n in 0..64 {
            let d = backoff(n, base, cap);
            let full = (base * 2u32.pow(n.min(10))).min(cap);
            assert!(d <= full, "attempt {n}: {d:?} > {full:?}");
            assert!(d >= full / 2, "attempt {n}: {d:?} < half of {full:?}");
        }
    }

    #[test]
    fn a_held_poll_is_the_wait_and_a_quick_one_is_not() {
        assert_eq!(after_empty_poll(Duration::from_millis(999)), Duration::ZERO);
        assert!(after_empty_poll(Duration::from_millis(3)) >= Duration::from_secs(1));
    }

    #[test]
    fn an_idle_poll_waits_one_to_three_seconds() {
        for _ in 0..100 {
            let d = idle_poll_wait();
            assert!(d >= Duration::from_secs(1) && d < Duration::from_secs(3));
        }
    }
}
