//! Calls that outlive their connection: a streamed call keeps running when
//! the executor's connection drops (a port-forward that broke), and the
//! executor re-attaches by the call's id, to a call still running or to one
//! that finished within the retention bound.
//!
//! A record holds no output: while the call runs it names the call's output
//! files, and a follower tails them from the offsets it was given; once the
//! call ends it holds the result, the same one `Run` would have returned.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};

use runner_api::ToolResult;

use crate::error::Error;

/// How long a finished call's result stays attachable.
pub const RETENTION: Duration = Duration::from_secs(10 * 60);
/// Most calls remembered at once; past it the oldest finished go first.
pub const MAX_RECORDS: usize = 1024;

/// Where a call is.
#[derive(Debug, Clone)]
pub enum Phase {
    /// Accepted, its process not started yet (or a tool without output files).
    Pending,
    /// Its stdout and stderr are being written to these files.
    Running {
        stdout: PathBuf,
        stderr: PathBuf,
        /// Set once the command is done: how much of each file is its
        /// output. What comes after is its background jobs', which a later
        /// bash result shows, so a follower stops there.
        ends: Option<[u64; 2]>,
    },
    /// Ended: the result `Run` would have returned, or the status; with the
    /// call's output while a follower may still need it (see [`Output`]).
    Done(Result<ToolResult, tonic::Status>, Option<Output>),
}

/// A call's output files, opened when it started. The phase watch keeps
/// only the latest phase, so a follower whose first look comes after the
/// call ended never saw it running; by then the files are removed (or
/// belong to the jobs the call left). It reads its output from these
/// descriptors instead, with positioned reads (followers share them).
/// Kept in the finished phase only while followers exist, and dropped by
/// the last one, so a runner holds two descriptors per call being
/// followed, not per call remembered.
#[derive(Debug, Clone)]
pub struct Output {
    pub files: Arc<[std::fs::File; 2]>,
    /// How much of each file is the call's own output (see `Running`).
    pub ends: Option<[u64; 2]>,
}

/// One streamed call.
#[derive(Debug)]
pub struct Record {
    pub id: String,
    /// Notified by `Cancel`; a running bash call ends as on a timeout.
    pub cancel: Arc<Notify>,
    phase: watch::Sender<Phase>,
    finished: Mutex<Option<Instant>>,
    /// The output files, opened when the call started running.
    opened: Mutex<Option<Arc<[std::fs::File; 2]>>>,
}

impl Record {
    fn new(id: String) -> Record {
        Record {
            id,
            cancel: Arc::new(Notify::new()),
            phase: watch::Sender::new(Phase::Pending),
            finished: Mutex::new(None),
            opened: Mutex::new(None),
        }
    }

    /// A record outside a runner's map, for tests of its followers.
    #[cfg(test)]
    pub fn for_test(id: &str) -> Record {
        Record::new(id.to_owned())
    }

    /// The call's output files exist and are being written.
    pub fn running(&self, stdout: PathBuf, stderr: PathBuf) {
        let opened = std::fs::File::open(&stdout)
            .and_then(|out| Ok([out, std::fs::File::open(&stderr)?]))
            .ok()
            .map(Arc::new);
        *self.opened.lock().unwrap_or_else(PoisonError::into_inner) = opened;
        self.phase.send_replace(Phase::Running {
            stdout,
            stderr,
            ends: None,
        });
    }

    /// The command is done; its output is the files' first `ends` bytes.
    pub fn output_ends(&self, ends: [u64; 2]) {
        self.phase.send_modify(|p| {
            if let Phase::Running { ends: e, .. } = p {
                *e = Some(ends);
            }
        });
    }

    /// The call ended. Its output stays readable for the followers there
    /// are now (a follower that comes later attaches to a finished call:
    /// it gets the result).
    pub fn finish(&self, result: Result<ToolResult, tonic::Status>) {
        *self.finished.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        let files = self
            .opened
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .filter(|_| self.phase.receiver_count() > 0);
        self.phase.send_modify(|p| {
            let ends = match p {
                Phase::Running { ends, .. } => *ends,
                _ => None,
            };
            *p = Phase::Done(result, files.map(|files| Output { files, ends }));
        });
    }

    /// A follower is done with the finished call's output: the last one
    /// (the caller's own receiver is the only one left) lets it go.
    pub fn release_output(&self) {
        if self.phase.receiver_count() > 1 {
            return;
        }
        self.phase.send_if_modified(|p| match p {
            Phase::Done(_, output @ Some(_)) => {
                *output = None;
                false
            }
            _ => false,
        });
    }

    /// Follows the call's phase.
    pub fn watch(&self) -> watch::Receiver<Phase> {
        self.phase.subscribe()
    }

    pub fn is_done(&self) -> bool {
        matches!(*self.phase.borrow(), Phase::Done(..))
    }

    fn finished_at(&self) -> Option<Instant> {
        *self.finished.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The streamed calls of one runner, by id.
#[derive(Debug, Default)]
pub struct Calls {
    map: Mutex<HashMap<String, Arc<Record>>>,
}

impl Calls {
    /// Registers a new call. An id whose call is still running is refused;
    /// a finished one is forgotten and its id reused.
    pub fn begin(&self, id: &str) -> Result<Arc<Record>, Error> {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        prune(&mut map, Instant::now());
        if let Some(r) = map.get(id)
            && !r.is_done()
        {
            return Err(Error::CallRunning { id: id.to_owned() });
        }
        if map.len() >= MAX_RECORDS {
            return Err(Error::TooManyCalls { limit: MAX_RECORDS });
        }
        let record = Arc::new(Record::new(id.to_owned()));
        map.insert(id.to_owned(), Arc::clone(&record));
        Ok(record)
    }

    pub fn get(&self, id: &str) -> Option<Arc<Record>> {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        prune(&mut map, Instant::now());
        map.get(id).cloned()
    }
}

/// Forgets finished calls past their retention, then, while the map is
/// full, the oldest finished ones. Running calls are never forgotten.
fn prune(map: &mut HashMap<String, Arc<Record>>, now: Instant) {
    map.retain(|_, r| {
        r.finished_at()
            .is_none_or(|t| now.saturating_duration_since(t) < RETENTION)
    });
    while map.len() >= MAX_RECORDS {
        let oldest = map
            .iter()
            .filter_map(|(k, r)| r.finished_at().map(|t| (t, k.clone())))
            .min();
        match oldest {
            Some((_, k)) => {
                map.remove(&k);
            }
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> Result<ToolResult, tonic::Status> {
        Ok(ToolResult {
            content: "x".into(),
            is_error: false,
        })
    }

    #[test]
    fn a_running_id_is_refused_a_finished_one_reused() {
        let calls = Calls::default();
        let r = calls.begin("a").unwrap();
        assert!(matches!(calls.begin("a"), Err(Error::CallRunning { .. })));
        r.finish(ok());
        let again = calls.begin("a").unwrap();
        assert!(!again.is_done());
        assert!(calls.get("a").is_some());
        assert!(calls.get("b").is_none());
    }

    #[test]
    fn finished_records_expire_and_make_room() {
        let mut map = HashMap::new();
        let now = Instant::now();
        for i in 0..MAX_RECORDS {
            let r = Arc::new(Record::new(format!("{i}")));
            r.finish(ok());
            map.insert(format!("{i}"), r);
        }
        let running = Arc::new(Record::new("live".into()));
        map.insert("live".into(), running);
        prune(&mut map, now);
        assert!(map.len() < MAX_RECORDS);
        assert!(map.contains_key("live"));
        prune(&mut map, now + RETENTION + Duration::from_secs(1));
        assert_eq!(map.len(), 1);
    }
}
