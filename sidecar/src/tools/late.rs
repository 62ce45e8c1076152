//! What a bash call's background jobs write after the call returned.
//!
//! A call's output goes to files, not a pipe, so that `server &` does not
//! hold the call; the jobs it leaves keep those files. The reference runs
//! one shell on pipes, and what a job prints later arrives in the next
//! call's result: agents start servers and watchers and look for their
//! output later. So a call whose process group still has members when it
//! returns is *followed*: its files are kept, and every later bash result
//! begins with what they gained since, framed with the call's id and
//! whether its jobs still run. What the model reads of it counts against
//! the one output budget of the result (the rest spilled, as any output);
//! what the jobs write on disk counts against the per-call output cap,
//! checked as often as a running call's, past which the jobs are ended as
//! a call would be.
//!
//! Followed: the call's process group (`cmd &`, `nohup`, subshells). A job
//! that leaves the group (`setsid`) is not seen to live on; what it writes
//! after its call's group is gone is lost, as is everything when the runner
//! restarts or bash is restarted, and when more than [`MAX_FOLLOWED`] calls
//! are followed at once (the result then says which call is dropped).

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use crate::output::Part;
use crate::reaper::{Supervisor, group_alive};

/// Most calls followed at once; one more drops the oldest.
pub const MAX_FOLLOWED: usize = 256;
/// Dropped calls named in the next result; more are counted.
const NAMED_DROPS: usize = 8;
/// How often followed files are measured against the output cap (as often
/// as a running call's), and calls whose jobs are gone and whose output
/// was all delivered let go.
const SWEEP: Duration = Duration::from_millis(100);

/// A call whose jobs may still write.
#[derive(Debug)]
struct Followed {
    id: String,
    pgid: i32,
    /// `AGENTPLANE_CALL=<token>`, to end what left the group when the jobs
    /// pass the cap.
    marker: Option<String>,
    out: PathBuf,
    err: PathBuf,
    /// Bytes of each file already delivered.
    out_at: u64,
    err_at: u64,
    /// The cap this call's jobs passed, once they did (and were ended).
    capped: Option<u64>,
}

#[derive(Debug, Default)]
struct State {
    followed: VecDeque<Followed>,
    /// Calls dropped since the last delivery, for the next result to name
    /// (the first few), and how many more were.
    dropped: Vec<String>,
    dropped_more: usize,
}

/// The calls followed for their late output.
#[derive(Debug)]
pub struct Late {
    state: Mutex<State>,
    supervisor: Arc<Supervisor>,
    /// The per-call output cap (`--max-call-output-bytes`).
    cap: u64,
}

impl Late {
    /// Starts following nothing, with the sweep that enforces the cap.
    /// Must be called inside a tokio runtime.
    pub fn new(supervisor: Arc<Supervisor>, cap: u64) -> Arc<Late> {
        let late = Arc::new(Late {
            state: Mutex::new(State::default()),
            supervisor,
            cap,
        });
        let weak: Weak<Late> = Arc::downgrade(&late);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(late) = weak.upgrade() else { return };
                if late.lock().followed.is_empty() {
                    continue;
                }
                // Metadata and /proc walks: blocking, if brief.
                let _ = tokio::task::spawn_blocking(move || late.sweep()).await;
            }
        });
        late
    }

    /// Follows call `id`, whose group `pgid` outlived it; `out` and `err`
    /// were delivered up to the given lengths. Its files now belong here.
    pub fn follow(
        &self,
        id: &str,
        pgid: i32,
        marker: Option<String>,
        (out, out_at): (PathBuf, u64),
        (err, err_at): (PathBuf, u64),
    ) {
        let mut st = self.lock();
        if st.followed.len() == MAX_FOLLOWED
            && let Some(old) = st.followed.pop_front()
        {
            remove(&old);
            if st.dropped.len() < NAMED_DROPS {
                st.dropped.push(old.id);
            } else {
                st.dropped_more += 1;
            }
        }
        st.followed.push_back(Followed {
            id: toolset::truncate_runes(id, 128).to_owned(),
            pgid,
            marker,
            out,
            err,
            out_at,
            err_at,
            capped: None,
        });
    }

    /// What followed calls' jobs wrote since they were last delivered, as
    /// parts of the next result, oldest call first; calls whose jobs are
    /// gone are let go once delivered.
    pub fn collect(&self) -> Vec<Part> {
        let mut st = self.lock();
        let mut parts = Vec::new();
        let dropped = std::mem::take(&mut st.dropped);
        for id in &dropped {
            parts.push(Part::Text(format!(
                "[call {id}'s background jobs are no longer followed (at most {MAX_FOLLOWED} calls' are): what they write from now on is not shown]\n"
            )));
        }
        if st.dropped_more > 0 {
            parts.push(Part::Text(format!(
                "[and {} more calls' background jobs are no longer followed]\n",
                std::mem::take(&mut st.dropped_more)
            )));
        }
        st.followed.retain_mut(|f| {
            // Liveness first: a group seen gone has no writer left, so the
            // lengths taken after it are final.
            let alive = group_alive(f.pgid);
            let (out, err) = match (File::open(&f.out), File::open(&f.err)) {
                (Ok(o), Ok(e)) => (o, e),
                _ => {
                    parts.push(Part::Text(format!(
                        "[call {}'s background output can no longer be read: its files in the runner's state directory were removed]\n",
                        f.id
                    )));
                    remove(f);
                    return false;
                }
            };
            let out_len = out.metadata().map(|m| m.len()).unwrap_or(f.out_at);
            let err_len = err.metadata().map(|m| m.len()).unwrap_or(f.err_at);
            let new_out = out_len.saturating_sub(f.out_at);
            let new_err = err_len.saturating_sub(f.err_at);
            if new_out > 0 || new_err > 0 {
                let (out, err) = (Arc::new(out), Arc::new(err));
                let mut body = Vec::new();
                if new_out > 0 {
                    body.push(Part::Range {
                        file: Arc::clone(&out),
                        start: f.out_at,
                        len: new_out,
                    });
                }
                if new_err > 0 {
                    if new_out > 0 && !ends_line(&out, out_len) {
                        body.push(Part::Text("\n".into()));
                    }
                    body.push(Part::Range {
                        file: Arc::clone(&err),
                        start: f.err_at,
                        len: new_err,
                    });
                }
                let state = match (f.capped, alive) {
                    (Some(cap), _) => format!(
                        "its jobs were ended: together with the call they wrote more than {cap} bytes, the most one call may write"
                    ),
                    (None, true) => "its jobs are still running".into(),
                    (None, false) => "its jobs have ended".into(),
                };
                parts.push(Part::Framed {
                    header: format!(
                        "[background output of call {}, written after that call returned]\n",
                        f.id
                    ),
                    body,
                    footer: format!("[end of background output of call {}: {state}]\n", f.id),
                });
                f.out_at = out_len;
                f.err_at = err_len;
            }
            if alive {
                return true;
            }
            remove(f);
            false
        });
        parts
    }

    /// Forgets every followed call (bash `restart`: its jobs are ended, and
    /// as in the reference, what they wrote goes with the old shell).
    pub fn clear(&self) {
        let mut st = self.lock();
        for f in st.followed.drain(..) {
            remove(&f);
        }
        st.dropped.clear();
        st.dropped_more = 0;
    }

    /// Ends the jobs of calls past the cap, and lets go of calls whose
    /// jobs are gone and whose output was all delivered.
    fn sweep(&self) {
        let mut over = Vec::new();
        {
            let mut st = self.lock();
            st.followed.retain_mut(|f| {
                let len = |p: &PathBuf| std::fs::metadata(p).map(|m| m.len()).ok();
                let (Some(out), Some(err)) = (len(&f.out), len(&f.err)) else {
                    // Removed behind the runner's back; collect says so.
                    return true;
                };
                if f.capped.is_none() && out.saturating_add(err) > self.cap {
                    f.capped = Some(self.cap);
                    over.push((f.pgid, f.marker.clone()));
                }
                if group_alive(f.pgid) || out > f.out_at || err > f.err_at {
                    return true;
                }
                remove(f);
                false
            });
        }
        // Outside the lock: ending a call walks /proc.
        for (pgid, marker) in over {
            let spared = self.supervisor.live_pids();
            match marker {
                Some(m) => {
                    crate::procs::end_call(pgid, &m, crate::procs::now_ticks(), &spared);
                }
                None => crate::reaper::kill_group(pgid),
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Whether the byte before `end` is a newline (or there is none).
fn ends_line(file: &File, end: u64) -> bool {
    if end == 0 {
        return true;
    }
    let mut b = [0u8; 1];
    matches!(file.read_at(&mut b, end - 1), Ok(1) if b[0] == b'\n')
}

fn remove(f: &Followed) {
    let _ = std::fs::remove_file(&f.out);
    let _ = std::fs::remove_file(&f.err);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(parts: &[Part]) -> Vec<String> {
        parts
            .iter()
            .filter_map(|p| match p {
                Part::Text(t) => Some(t.clone()),
                _ => None,
            })
            .collect()
    }

    /// One call more than the bound drops the oldest, and the next result
    /// names it; what the others wrote is still delivered, once.
    #[tokio::test]
    async fn the_oldest_call_is_dropped_past_the_bound_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let late = Late::new(Supervisor::start().unwrap(), 1 << 30);
        // A process group that does not exist: every call's jobs are gone,
        // so each is let go once its output was delivered.
        let gone = i32::MAX - 7;
        for i in 0..=MAX_FOLLOWED {
            let (out, err) = (
                dir.path().join(format!("{i}.out")),
                dir.path().join(format!("{i}.err")),
            );
            std::fs::write(&out, "before").unwrap();
            std::fs::write(&err, "").unwrap();
            late.follow(&format!("c{i}"), gone, None, (out.clone(), 6), (err, 0));
            std::fs::write(&out, format!("before after {i}\n")).unwrap();
        }
        let parts = late.collect();
        let t = texts(&parts);
        assert!(
            t[0].starts_with(
                "[call c0's background jobs are no longer followed (at most 256 calls' are)"
            ),
            "{t:?}"
        );
        let framed = parts
            .iter()
            .filter(|p| matches!(p, Part::Framed { .. }))
            .count();
        assert_eq!(framed, MAX_FOLLOWED);
        let Some(Part::Framed { header, footer, .. }) = parts.get(1) else {
            panic!("{parts:?}");
        };
        assert_eq!(
            header,
            "[background output of call c1, written after that call returned]\n"
        );
        assert_eq!(
            footer,
            "[end of background output of call c1: its jobs have ended]\n"
        );
        // Delivered and let go: nothing the next time, and the files are gone.
        assert!(late.collect().is_empty());
        assert!(!dir.path().join("1.out").exists());
    }
}
