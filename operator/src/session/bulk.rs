//! The cached sessions' tool definitions and toolsets, held once per
//! distinct value instead of once per session.
//!
//! Why: a session's status carries every tool's definition as the model is
//! handed it (descriptions and JSON schemas, ~7 KB of JSON for the six
//! built-in tools), decoded into JSON trees several times that size. At ten
//! thousand sessions that was most of the operator's memory (the scale
//! bench, docs/benchmarks.md), although nearly every session of a platform
//! has one of a few toolsets. A reconcile reads that part of the previous
//! status only to tell whether the status changed ([`Plan::changes_status`]).
//!
//! So the session watch takes it out of each cached session ([`Bulk::take`],
//! in the watch's `modify`, before the store holds it) and keeps it here,
//! shared between the sessions with an equal one, under the session's key and
//! resourceVersion. A value unlike the [`MAX_SHARED`] already held stays in
//! its session, where it was. Reconciles ask [`StatusBulk::of`] with the
//! version they read; any other version answers nothing, and the status is
//! then judged changed and written (conditionally on that version), which is
//! always safe.
//!
//! [`Plan::changes_status`]: crate::session::plan::Plan::changes_status

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crds::{AgentSession, ToolStatus};
use kube::ResourceExt;
use kube::runtime::watcher;

/// A watched session, as the controller's watch delivers it.
type Watched = kube::core::DeserializeGuard<AgentSession>;

/// Most distinct values shared at once; past it, the values no cached
/// session uses any more are dropped, and a new value beyond that stays in
/// its session.
pub const MAX_SHARED: usize = 256;

/// The part of a status held here.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Bulk {
    pub tools: Vec<ToolStatus>,
    pub toolsets: Vec<serde_json::Value>,
}

impl Bulk {
    /// Takes the bulk out of `session`'s status (nothing when it has none).
    fn take(session: &mut AgentSession) -> Option<Bulk> {
        let status = session.status.as_mut()?;
        if status.tools.is_empty() && status.toolsets.is_empty() {
            return None;
        }
        Some(Bulk {
            tools: std::mem::take(&mut status.tools),
            toolsets: std::mem::take(&mut status.toolsets),
        })
    }

    /// Puts it back (a value that could not be shared).
    fn restore(self, session: &mut AgentSession) {
        if let Some(status) = session.status.as_mut() {
            status.tools = self.tools;
            status.toolsets = self.toolsets;
        }
    }
}

type Key = (String, String);

#[derive(Debug, Default)]
struct Inner {
    shared: Vec<Arc<Bulk>>,
    by_session: HashMap<Key, (String, Arc<Bulk>)>,
    /// The sessions seen since a relist began (see [`StatusBulk::apply`]).
    relisting: Option<HashSet<Key>>,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct StatusBulk {
    inner: Mutex<Inner>,
}

fn key_of(session: &AgentSession) -> Option<Key> {
    Some((session.namespace()?, session.name_any()))
}

impl StatusBulk {
    /// For the session watch's `modify`: moves the session's bulk here when
    /// it can be shared.
    pub fn slim(&self, watched: &mut Watched) {
        let Ok(session) = &mut watched.0 else {
            return;
        };
        let (Some(key), Some(version)) = (key_of(session), session.resource_version()) else {
            return;
        };
        let Some(bulk) = Bulk::take(session) else {
            return;
        };
        let Ok(mut inner) = self.inner.lock() else {
            bulk.restore(session);
            return;
        };
        let shared = match inner.shared.iter().find(|s| ***s == bulk) {
            Some(s) => Arc::clone(s),
            None => {
                if inner.shared.len() >= MAX_SHARED {
                    inner.shared.retain(|s| Arc::strong_count(s) > 1);
                }
                if inner.shared.len() >= MAX_SHARED {
                    bulk.restore(session);
                    inner.by_session.remove(&key);
                    return;
                }
                let s = Arc::new(bulk);
                inner.shared.push(Arc::clone(&s));
                s
            }
        };
        inner.by_session.insert(key, (version, shared));
    }

    /// For the events after the store took them: a deleted session's bulk
    /// goes, and a relist, when done, drops every session it did not list.
    pub fn apply(&self, event: &watcher::Event<Watched>) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let key = |w: &Watched| w.0.as_ref().ok().and_then(key_of);
        match event {
            watcher::Event::Delete(w) => {
                if let Some(k) = key(w) {
                    inner.by_session.remove(&k);
                }
            }
            watcher::Event::Init => inner.relisting = Some(HashSet::new()),
            watcher::Event::InitApply(w) => {
                if let (Some(k), Some(seen)) = (key(w), inner.relisting.as_mut()) {
                    seen.insert(k);
                }
            }
            watcher::Event::InitDone => {
                if let Some(seen) = inner.relisting.take() {
                    inner.by_session.retain(|k, _| seen.contains(k));
                }
            }
            watcher::Event::Apply(_) => {}
        }
    }

    /// The bulk of `session` as read at its resourceVersion, if it is held
    /// here.
    pub fn of(&self, session: &AgentSession) -> Option<Arc<Bulk>> {
        let key = key_of(session)?;
        let version = session.resource_version()?;
        let inner = self.inner.lock().ok()?;
        let (v, bulk) = inner.by_session.get(&key)?;
        (*v == version).then(|| Arc::clone(bulk))
    }

    /// How many sessions and distinct values are held (for tests and logs).
    pub fn counts(&self) -> (usize, usize) {
        self.inner
            .lock()
            .map(|i| (i.by_session.len(), i.shared.len()))
            .unwrap_or_default()
    }
}
