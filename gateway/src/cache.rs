//! A small map with a bound on its size and on the age of what it holds:
//! what the gateway remembers of tokens and permissions. A flood of
//! distinct tokens fills it to its bound and no further.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Entries expire after their time to live; at the bound, expired entries
/// go first, then an arbitrary tenth.
#[derive(Debug)]
pub struct Bounded<K, V> {
    max: usize,
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: Hash + Eq + Clone, V: Clone> Bounded<K, V> {
    pub fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The value, if present and not expired.
    pub fn get(&self, key: &K, now: Instant) -> Option<V> {
        let map = self.entries.lock().ok()?;
        map.get(key)
            .filter(|(_, until)| *until > now)
            .map(|(v, _)| v.clone())
    }

    /// Keeps `value` for `ttl`.
    pub fn put(&self, key: K, value: V, ttl: Duration, now: Instant) {
        let Ok(mut map) = self.entries.lock() else {
            return;
        };
        if map.len() >= self.max && !map.contains_key(&key) {
            map.retain(|_, (_, until)| *until > now);
            if map.len() >= self.max {
                let drop: Vec<K> = map.keys().take(self.max / 10 + 1).cloned().collect();
                for k in drop {
                    map.remove(&k);
                }
            }
        }
        map.insert(key, (value, now + ttl));
    }

    pub fn len(&self) -> usize {
        self.entries.lock().map(|m| m.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_no_more_than_its_bound_and_forgets_the_expired() {
        let c = Bounded::new(100);
        let t0 = Instant::now();
        for i in 0..10_000u32 {
            c.put(i, i, Duration::from_secs(60), t0);
            assert!(c.len() <= 100);
        }
        c.put(1_000_000, 7, Duration::from_secs(1), t0);
        assert_eq!(c.get(&1_000_000, t0), Some(7));
        assert_eq!(c.get(&1_000_000, t0 + Duration::from_secs(2)), None);
    }
}
