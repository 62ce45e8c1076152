//! How many calls run through one gateway replica: at most so many for one
//! caller and so many in all. One more is refused at once (429 or
//! RESOURCE_EXHAUSTED) rather than queued, so a caller that floods the
//! gateway is told so and everyone else keeps their share.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, Result};

/// Held while a call (or a stream) runs.
#[derive(Debug)]
pub struct Slot {
    _caller: OwnedSemaphorePermit,
    _total: OwnedSemaphorePermit,
}

/// Per-caller and total bounds.
#[derive(Debug)]
pub struct Limits {
    per_caller: usize,
    total: Arc<Semaphore>,
    callers: Mutex<HashMap<String, Arc<Semaphore>>>,
    max_callers: usize,
}

impl Limits {
    pub fn new(per_caller: usize, total: usize, max_callers: usize) -> Self {
        Self {
            per_caller: per_caller.max(1),
            total: Arc::new(Semaphore::new(total.max(1))),
            callers: Mutex::new(HashMap::new()),
            max_callers: max_callers.max(1),
        }
    }

    /// A slot for `user`, or why not.
    pub fn take(&self, user: &str) -> Result<Slot> {
        let caller = {
            let mut map = self
                .callers
                .lock()
                .map_err(|_| Error::Internal("limits lock poisoned".into()))?;
            if !map.contains_key(user) && map.len() >= self.max_callers {
                // Callers with nothing running hold nothing.
                let per = self.per_caller;
                map.retain(|_, s| s.available_permits() < per);
                if map.len() >= self.max_callers {
                    return Err(Error::TooManyRequests(format!(
                        "{} callers have calls running on this gateway replica, its most",
                        self.max_callers
                    )));
                }
            }
            Arc::clone(
                map.entry(user.to_owned())
                    .or_insert_with(|| Arc::new(Semaphore::new(self.per_caller))),
            )
        };
        let caller = caller.try_acquire_owned().map_err(|_| {
            Error::TooManyRequests(format!(
                "{user} has {} calls running through this gateway replica, its most; wait for one to end",
                self.per_caller
            ))
        })?;
        let total = Arc::clone(&self.total).try_acquire_owned().map_err(|_| {
            Error::TooManyRequests(
                "this gateway replica runs as many calls as it may; retry shortly".into(),
            )
        })?;
        Ok(Slot {
            _caller: caller,
            _total: total,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_caller_cannot_take_anothers_share() {
        let l = Limits::new(2, 3, 10);
        let a1 = l.take("a").expect("a1");
        let _a2 = l.take("a").expect("a2");
        assert!(matches!(l.take("a"), Err(Error::TooManyRequests(_))));
        let _b1 = l.take("b").expect("b gets its own");
        assert!(l.take("c").is_err(), "the total is reached");
        drop(a1);
        assert!(l.take("c").is_ok());
    }

    #[test]
    fn idle_callers_are_forgotten_at_the_bound() {
        let l = Limits::new(1, 100, 2);
        drop(l.take("a").expect("a"));
        drop(l.take("b").expect("b"));
        let _c = l.take("c").expect("idle a and b make room");
    }
}
