//! The sessions as this operator's last status write left them, until the
//! session watch catches up with that write.
//!
//! Why: a status write is conditional on the resourceVersion the reconcile
//! read (see `Plan::status_apply`), so that a plan made from a lagging cache
//! never overwrites a newer status. But the newer version is most often our
//! own last write, still on its way through the watch: a pod event right
//! after it (scheduled, then Ready) read the older copy, had its status
//! refused, and was retried -- under load, when the watch lags by seconds,
//! again and again (the scale bench counted 9 099 refusals for 6 000
//! sessions, about a third of the operator's session requests).
//!
//! So a successful write is recorded with the version it was made from and
//! the session it returned. A reconcile whose cached copy is still at the
//! version that write was made from reads the returned session instead: it
//! is the newest state the API server told us of. Anything else -- the
//! watch caught up, or someone changed the session since -- uses the cache,
//! and the record goes. A write made from the returned session is as
//! conditional as any other: a change by someone else that the watch has
//! not shown either is still refused by the API server.
//!
//! Bounded: a record leaves when the watch delivers any later version of
//! its session or its deletion; past [`MAX_RECORDS`] the map is cleared,
//! which costs a refused write, never a wrong one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crds::AgentSession;
use kube::ResourceExt;
use kube::runtime::watcher;

/// A watched session, as the controller's watch delivers it.
type Watched = kube::core::DeserializeGuard<AgentSession>;

/// Records kept at most.
pub const MAX_RECORDS: usize = 50_000;

type Key = (String, String);

#[derive(Debug)]
struct Record {
    /// The version the write was made from.
    from: String,
    /// What the API server returned.
    written: Arc<AgentSession>,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct OwnWrites {
    records: Mutex<HashMap<Key, Record>>,
}

fn key_of(session: &AgentSession) -> Option<Key> {
    Some((session.namespace()?, session.name_any()))
}

impl OwnWrites {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Record>> {
        crate::context::locked(&self.records)
    }

    /// Records a status write that returned `written`, made while the
    /// session cache held `cached` (the version later reconciles compare
    /// with, whether the write was made from it or from an earlier record).
    pub fn record(&self, cached: &AgentSession, mut written: AgentSession) {
        let (Some(key), Some(from)) = (key_of(cached), cached.resource_version()) else {
            return;
        };
        if written.uid() != cached.uid() {
            return;
        }
        written.metadata.managed_fields = None;
        let mut map = self.map();
        if map.len() >= MAX_RECORDS {
            map.clear();
        }
        map.insert(
            key,
            Record {
                from,
                written: Arc::new(written),
            },
        );
    }

    /// The session our last write returned, when the cache still holds
    /// `cached` at the version it held when that write was made. A cache
    /// that has moved on drops the record.
    pub fn newer_than(&self, cached: &AgentSession) -> Option<Arc<AgentSession>> {
        let key = key_of(cached)?;
        let version = cached.resource_version()?;
        let mut map = self.map();
        let r = map.get(&key)?;
        if r.from == version && r.written.uid() == cached.uid() {
            return Some(Arc::clone(&r.written));
        }
        map.remove(&key);
        None
    }

    /// For the session watch's events: any version other than the one a
    /// record was made from means the watch has caught up with (or gone
    /// past) our write, and a deletion ends the session.
    pub fn apply(&self, event: &watcher::Event<Watched>) {
        let seen = |w: &Watched| {
            let s = w.0.as_ref().ok()?;
            Some((key_of(s)?, s.resource_version()))
        };
        match event {
            watcher::Event::Apply(w) | watcher::Event::InitApply(w) => {
                if let Some((key, version)) = seen(w) {
                    let mut map = self.map();
                    if map
                        .get(&key)
                        .is_some_and(|r| Some(&r.from) != version.as_ref())
                    {
                        map.remove(&key);
                    }
                }
            }
            watcher::Event::Delete(w) => {
                if let Some((key, _)) = seen(w) {
                    self.map().remove(&key);
                }
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    /// How many writes are recorded (for tests).
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
    use kube::core::DeserializeGuard;

    fn at(version: &str, uid: &str) -> AgentSession {
        let mut s: AgentSession = serde_json::from_value(serde_json::json!({
            "apiVersion": "agentplane.dev/v1alpha1",
            "kind": "AgentSession",
            "metadata": {"name": "demo", "namespace": "team-a", "uid": uid,
                         "resourceVersion": version},
            "spec": {"image": "i", "tools": [{"type": "agent_toolset_20260401"}]}
        }))
        .expect("session");
        s.metadata.managed_fields = Some(Vec::new());
        s
    }

    fn event(s: &AgentSession) -> DeserializeGuard<AgentSession> {
        DeserializeGuard(Ok(s.clone()))
    }

    #[test]
    fn a_cache_behind_our_write_reads_the_write_and_a_cache_past_it_drops_it() {
        let own = OwnWrites::default();
        own.record(&at("1", "u"), at("2", "u"));
        let newer = own.newer_than(&at("1", "u")).expect("our write");
        assert_eq!(newer.resource_version().as_deref(), Some("2"));
        assert!(newer.metadata.managed_fields.is_none());
        // A write made from that answer is still recorded against what the
        // cache holds, so a cache two writes behind reads the last one.
        own.record(&at("1", "u"), at("3", "u"));
        let newer = own.newer_than(&at("1", "u")).expect("our last write");
        assert_eq!(newer.resource_version().as_deref(), Some("3"));
        // The cache moved on (our write, or someone else's): the cache wins.
        assert!(own.newer_than(&at("3", "u")).is_none());
        assert!(own.is_empty());
    }

    #[test]
    fn the_watch_clears_records_it_caught_up_with_and_deletions() {
        let own = OwnWrites::default();
        own.record(&at("1", "u"), at("2", "u"));
        own.apply(&watcher::Event::Apply(event(&at("1", "u"))));
        assert_eq!(own.len(), 1, "the version it was made from keeps it");
        own.apply(&watcher::Event::Apply(event(&at("2", "u"))));
        assert!(own.is_empty());
        own.record(&at("1", "u"), at("2", "u"));
        own.apply(&watcher::Event::Delete(event(&at("1", "u"))));
        assert!(own.is_empty());
    }

    #[test]
    fn another_session_under_the_name_is_not_given_our_write() {
        let own = OwnWrites::default();
        own.record(&at("1", "u"), at("2", "other"));
        assert!(own.is_empty(), "an answer about another object is not kept");
        own.record(&at("1", "u"), at("2", "u"));
        assert!(own.newer_than(&at("1", "recreated")).is_none());
    }
}
