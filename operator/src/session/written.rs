//! What the operator last applied, so that a reconcile does not apply the
//! same ConfigMap or NetworkPolicy again when nothing changed. Every
//! reconcile reads both objects' metadata first (`observe`); when the
//! resourceVersion read is the one our own apply returned, and what the
//! plan wants is what that apply sent, the object on the server is exactly
//! ours and the apply is skipped. Anything else -- a change by someone else
//! (a new resourceVersion), a deleted object, a new desired content, an
//! operator restart (an empty record) -- applies as before, so the fence
//! that re-applies a tampered object holds.
//!
//! The record is bounded: past [`MAX_RECORDS`] it is cleared (objects of
//! deleted sessions are never looked up again), which costs one apply per
//! object, never a missed one.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

/// Records kept at most (two per session: ConfigMap and NetworkPolicy).
pub const MAX_RECORDS: usize = 50_000;

/// (kind, namespace, name): one applied object.
type Key = (&'static str, String, String);

/// The resourceVersion our apply left and the digest of what it sent.
type Record = (String, u64);

/// Key -> Record, for every object applied since the record was last cleared.
#[derive(Debug, Default)]
pub struct Written {
    records: Mutex<HashMap<Key, Record>>,
}

/// A stable-within-the-process digest of what an apply sends.
pub fn digest<T: serde::Serialize>(obj: &T) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(obj).unwrap_or_default().hash(&mut h);
    h.finish()
}

impl Written {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Record>> {
        crate::context::locked(&self.records)
    }

    /// Whether the object on the server (`observed_version`) is the one our
    /// last apply of `digest` made.
    pub fn unchanged(
        &self,
        kind: &'static str,
        ns: &str,
        name: &str,
        observed_version: Option<&str>,
        digest: u64,
    ) -> bool {
        let Some(seen) = observed_version else {
            return false;
        };
        self.map()
            .get(&(kind, ns.to_owned(), name.to_owned()))
            .is_some_and(|(version, d)| version == seen && *d == digest)
    }

    /// Records an apply of `digest` that left the object at `version`.
    pub fn record(
        &self,
        kind: &'static str,
        ns: &str,
        name: &str,
        version: Option<String>,
        digest: u64,
    ) {
        let mut map = self.map();
        let key = (kind, ns.to_owned(), name.to_owned());
        let Some(version) = version else {
            map.remove(&key);
            return;
        };
        if map.len() >= MAX_RECORDS && !map.contains_key(&key) {
            map.clear();
        }
        map.insert(key, (version, digest));
    }

    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_only_our_own_unchanged_write() {
        let w = Written::default();
        assert!(
            !w.unchanged("ConfigMap", "ns", "a", Some("5"), 1),
            "nothing recorded"
        );
        w.record("ConfigMap", "ns", "a", Some("5".into()), 1);
        assert!(w.unchanged("ConfigMap", "ns", "a", Some("5"), 1));
        assert!(
            !w.unchanged("ConfigMap", "ns", "a", Some("6"), 1),
            "changed by someone else"
        );
        assert!(!w.unchanged("ConfigMap", "ns", "a", None, 1), "deleted");
        assert!(
            !w.unchanged("ConfigMap", "ns", "a", Some("5"), 2),
            "new desired content"
        );
        assert!(
            !w.unchanged("NetworkPolicy", "ns", "a", Some("5"), 1),
            "other kind"
        );
        assert!(
            !w.unchanged("ConfigMap", "other", "a", Some("5"), 1),
            "other namespace"
        );
        w.record("ConfigMap", "ns", "a", None, 1);
        assert!(
            !w.unchanged("ConfigMap", "ns", "a", Some("5"), 1),
            "an apply without a version forgets"
        );
    }

    #[test]
    fn stays_bounded() {
        let w = Written::default();
        for i in 0..MAX_RECORDS + 10 {
            w.record("ConfigMap", "ns", &i.to_string(), Some("1".into()), 0);
        }
        assert!(w.len() <= MAX_RECORDS);
        assert!(!w.is_empty());
    }

    #[test]
    fn digest_follows_content() {
        assert_eq!(
            digest(&serde_json::json!({"a": 1})),
            digest(&serde_json::json!({"a": 1}))
        );
        assert_ne!(
            digest(&serde_json::json!({"a": 1})),
            digest(&serde_json::json!({"a": 2}))
        );
    }
}
