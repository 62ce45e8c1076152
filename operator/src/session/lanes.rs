//! Two lanes into the reconcile slots, so that a session someone is
//! waiting for is never queued behind thousands of resyncs.
//!
//! Why: the scale bench's fail-over at ten thousand sessions. The new
//! leader looks at every session once (it cannot know what its predecessor
//! finished), and the sessions created while the lease moved waited behind
//! all of them: the lease moved in 9.8 s, the first new session was Ready
//! after 38 s, the last after 138 s. The same holds for a burst of new
//! sessions arriving during a resync.
//!
//! A session whose status already settles its current generation (Ready,
//! suspended, ended, refused) is *background*: a look at it finds nothing
//! to do, most of the time. Everything else -- new, changed, pending, asked
//! to wake -- is *urgent*. Background reconciles may hold at most
//! `capacity - reserve` of the slots, so `reserve` slots are always there for
//! urgent ones; otherwise both lanes share the slots first come, first
//! served (background work is not starved either).
//!
//! The controller hands every due reconcile to the lanes at once (its own
//! concurrency is unbounded); a waiting reconcile is a few hundred bytes (its
//! work is boxed only once it holds a slot), and the controller never runs
//! two reconciles of one session, so the waiters are bounded by the number
//! of sessions, like the session store itself.

use std::sync::Arc;

use crds::{AgentSession, SessionPhase};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::session::lifecycle::WAKE_ANNOTATION;

/// Which lane a reconcile waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Someone is waiting for this session: it is new, changed, not yet
    /// running, or asked to wake.
    Urgent,
    /// A look at a session whose status settles its current generation.
    Background,
}

impl Lane {
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Urgent => "urgent",
            Lane::Background => "background",
        }
    }
}

/// The lane of a reconcile of `session` (the newest version known).
pub fn lane(session: &AgentSession) -> Lane {
    let Some(status) = &session.status else {
        return Lane::Urgent;
    };
    if session.metadata.deletion_timestamp.is_some()
        || status.observed_generation.is_none()
        || status.observed_generation != session.metadata.generation
    {
        return Lane::Urgent;
    }
    let waking = session
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(WAKE_ANNOTATION));
    match status.phase {
        None | Some(SessionPhase::Pending) => Lane::Urgent,
        Some(SessionPhase::Suspended) if waking => Lane::Urgent,
        Some(
            SessionPhase::Ready
            | SessionPhase::Invalid
            | SessionPhase::Failed
            | SessionPhase::Succeeded
            | SessionPhase::Suspended
            | SessionPhase::Finished,
        ) => Lane::Background,
    }
}

/// The reconcile slots, shared by both lanes.
#[derive(Debug)]
pub struct Lanes {
    all: Arc<Semaphore>,
    background: Arc<Semaphore>,
    capacity: usize,
    reserve: usize,
}

/// A held slot; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot {
    _all: OwnedSemaphorePermit,
    _background: Option<OwnedSemaphorePermit>,
}

impl Lanes {
    /// `capacity` slots (at least one), of which a quarter (at least one,
    /// none when there is a single slot) are kept for urgent reconciles.
    pub fn new(capacity: u16) -> Self {
        let capacity = usize::from(capacity.max(1));
        let reserve = if capacity == 1 {
            0
        } else {
            (capacity / 4).max(1)
        };
        Self {
            all: Arc::new(Semaphore::new(capacity)),
            background: Arc::new(Semaphore::new(capacity - reserve)),
            capacity,
            reserve,
        }
    }

    /// Slots in all.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Slots only urgent reconciles may take.
    pub fn reserve(&self) -> usize {
        self.reserve
    }

    /// Waits for a slot in `lane`. The semaphores are never closed, so this
    /// cannot fail; a closed one would be a bug, answered with a slot that
    /// limits nothing rather than a reconcile that never runs.
    pub async fn enter(&self, lane: Lane) -> Option<Slot> {
        let background = match lane {
            Lane::Urgent => None,
            Lane::Background => Some(Arc::clone(&self.background).acquire_owned().await.ok()?),
        };
        let all = Arc::clone(&self.all).acquire_owned().await.ok()?;
        Some(Slot {
            _all: all,
            _background: background,
        })
    }

    /// Slots free now (for tests and metrics).
    pub fn free(&self) -> usize {
        self.all.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::AgentSessionStatus;
    use std::time::Duration;

    fn session(generation: i64, status: Option<(i64, SessionPhase)>) -> AgentSession {
        let mut s: AgentSession = serde_json::from_value(serde_json::json!({
            "apiVersion": "agentplane.dev/v1alpha1",
            "kind": "AgentSession",
            "metadata": {"name": "s", "namespace": "n", "generation": generation},
            "spec": {"image": "img", "tools": [{"type": "agent_toolset_20260401"}]},
        }))
        .expect("a session");
        s.status = status.map(|(observed, phase)| AgentSessionStatus {
            observed_generation: Some(observed),
            phase: Some(phase),
            ..AgentSessionStatus::default()
        });
        s
    }

    #[test]
    fn only_a_status_that_settles_the_current_generation_is_background() {
        assert_eq!(lane(&session(1, None)), Lane::Urgent);
        assert_eq!(
            lane(&session(1, Some((1, SessionPhase::Pending)))),
            Lane::Urgent
        );
        assert_eq!(
            lane(&session(2, Some((1, SessionPhase::Ready)))),
            Lane::Urgent,
            "a changed spec"
        );
        for settled in [
            SessionPhase::Ready,
            SessionPhase::Invalid,
            SessionPhase::Failed,
            SessionPhase::Succeeded,
            SessionPhase::Suspended,
            SessionPhase::Finished,
        ] {
            assert_eq!(
                lane(&session(3, Some((3, settled)))),
                Lane::Background,
                "{settled:?}"
            );
        }
        let mut waking = session(1, Some((1, SessionPhase::Suspended)));
        waking.metadata.annotations = Some(
            [(
                WAKE_ANNOTATION.to_owned(),
                "2026-12-07T00:00:00Z".to_owned(),
            )]
            .into(),
        );
        assert_eq!(lane(&waking), Lane::Urgent, "asked to wake");
        let mut going = session(1, Some((1, SessionPhase::Ready)));
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(lane(&going), Lane::Urgent, "being deleted");
    }

    #[test]
    fn a_quarter_of_the_slots_is_kept_for_urgent_work() {
        for (capacity, reserve) in [(0, 0), (1, 0), (2, 1), (4, 1), (16, 4), (64, 16)] {
            let lanes = Lanes::new(capacity);
            assert_eq!(lanes.reserve(), reserve, "capacity {capacity}");
            assert_eq!(lanes.capacity(), usize::from(capacity.max(1)));
        }
    }

    #[tokio::test]
    async fn background_work_never_takes_the_reserve() {
        let lanes = Arc::new(Lanes::new(4));
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(lanes.enter(Lane::Background).await.expect("a slot"));
        }
        // A fourth background reconcile waits although a slot is free...
        let waiting = {
            let lanes = Arc::clone(&lanes);
            tokio::spawn(async move { lanes.enter(Lane::Background).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "background took the reserved slot");
        assert_eq!(lanes.free(), 1);
        // ...and an urgent one takes that slot at once.
        let urgent = tokio::time::timeout(Duration::from_secs(5), lanes.enter(Lane::Urgent))
            .await
            .expect("an urgent reconcile waited behind background ones")
            .expect("a slot");
        assert_eq!(lanes.free(), 0);
        // Slots freed go round: the waiting background reconcile gets one.
        held.pop();
        let got = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the background reconcile never got a freed slot")
            .expect("joined");
        assert!(got.is_some());
        drop(urgent);
        assert_eq!(lanes.free(), 1);
    }

    #[tokio::test]
    async fn urgent_work_may_use_every_slot() {
        let lanes = Lanes::new(4);
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(
                tokio::time::timeout(Duration::from_secs(5), lanes.enter(Lane::Urgent))
                    .await
                    .expect("an urgent slot")
                    .expect("a slot"),
            );
        }
        assert_eq!(lanes.free(), 0);
        drop(held);
        assert_eq!(lanes.free(), 4);
    }
}
