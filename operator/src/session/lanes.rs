//! Three lanes into the reconcile slots, so that a session someone is
//! waiting for is never queued behind thousands of resyncs, and a session
//! already under way is finished before new ones are started.
//!
//! Why: the scale bench. At a fail-over with ten thousand sessions the new
//! leader looks at every session once (it cannot know what its predecessor
//! finished), and the sessions created while the lease moved waited behind
//! all of them: the lease moved in 9.8 s, the first new session was Ready
//! after 38 s, the last after 138 s. And in a burst, a session whose pod
//! has just turned Ready (one status write from Ready) waited behind every
//! session created after it, so that all of them turned Ready late
//! together.
//!
//! - *finishing*: the status is there but does not settle the current
//!   generation (pending, changed, asked to wake, being deleted); may take
//!   any slot.
//! - *new*: no status yet; may hold at most `capacity - reserve` slots.
//! - *background*: the status settles the current generation (Ready,
//!   suspended, ended, refused): a look at it almost always finds nothing to
//!   do; may hold at most `capacity - reserve` slots.
//!
//! So `reserve` slots are always there for finishing work, and new work
//! always finds a slot that resyncs cannot take. Within those bounds the
//! lanes share the slots first come, first served: nothing starves.
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
    /// A session under way: its status does not settle its generation.
    Finishing,
    /// A session never reconciled (no status).
    New,
    /// A look at a session whose status settles its current generation.
    Background,
}

impl Lane {
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Finishing => "finishing",
            Lane::New => "new",
            Lane::Background => "background",
        }
    }
}

/// The lane of a reconcile of `session` (the newest version known).
pub fn lane(session: &AgentSession) -> Lane {
    let Some(status) = &session.status else {
        return Lane::New;
    };
    if session.metadata.deletion_timestamp.is_some()
        || status.observed_generation.is_none()
        || status.observed_generation != session.metadata.generation
    {
        return Lane::Finishing;
    }
    let waking = session
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(WAKE_ANNOTATION));
    match status.phase {
        None | Some(SessionPhase::Pending) => Lane::Finishing,
        Some(SessionPhase::Suspended) if waking => Lane::Finishing,
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

/// The reconcile slots, shared by the lanes.
#[derive(Debug)]
pub struct Lanes {
    all: Arc<Semaphore>,
    new: Arc<Semaphore>,
    background: Arc<Semaphore>,
    capacity: usize,
    reserve: usize,
}

/// A held slot; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot {
    _all: OwnedSemaphorePermit,
    _lane: Option<OwnedSemaphorePermit>,
}

impl Lanes {
    /// `capacity` slots (at least one), of which a quarter (at least one,
    /// none when there is a single slot) only finishing work may take.
    pub fn new(capacity: u16) -> Self {
        let capacity = usize::from(capacity.max(1));
        let reserve = if capacity == 1 {
            0
        } else {
            (capacity / 4).max(1)
        };
        Self {
            all: Arc::new(Semaphore::new(capacity)),
            new: Arc::new(Semaphore::new(capacity - reserve)),
            background: Arc::new(Semaphore::new(capacity - reserve)),
            capacity,
            reserve,
        }
    }

    /// Slots in all.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Slots new and background work may not take.
    pub fn reserve(&self) -> usize {
        self.reserve
    }

    /// Waits for a slot in `lane`. The semaphores are never closed, so this
    /// cannot fail; `None` (a closed one, a bug) lets the reconcile run
    /// unlimited rather than never.
    pub async fn enter(&self, lane: Lane) -> Option<Slot> {
        let bound = match lane {
            Lane::Finishing => None,
            Lane::New => Some(&self.new),
            Lane::Background => Some(&self.background),
        };
        let lane = match bound {
            Some(s) => Some(Arc::clone(s).acquire_owned().await.ok()?),
            None => None,
        };
        let all = Arc::clone(&self.all).acquire_owned().await.ok()?;
        Some(Slot {
            _all: all,
            _lane: lane,
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
        assert_eq!(lane(&session(1, None)), Lane::New);
        assert_eq!(
            lane(&session(1, Some((1, SessionPhase::Pending)))),
            Lane::Finishing
        );
        assert_eq!(
            lane(&session(2, Some((1, SessionPhase::Ready)))),
            Lane::Finishing,
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
        assert_eq!(lane(&waking), Lane::Finishing, "asked to wake");
        let mut going = session(1, Some((1, SessionPhase::Ready)));
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(lane(&going), Lane::Finishing, "being deleted");
    }

    #[test]
    fn a_quarter_of_the_slots_is_kept_for_finishing_work() {
        for (capacity, reserve) in [(0, 0), (1, 0), (2, 1), (4, 1), (16, 4), (64, 16)] {
            let lanes = Lanes::new(capacity);
            assert_eq!(lanes.reserve(), reserve, "capacity {capacity}");
            assert_eq!(lanes.capacity(), usize::from(capacity.max(1)));
        }
    }

    /// Fills the lane's share of four slots (three), then shows that a
    /// fourth reconcile of that lane waits while a finishing one gets the
    /// reserved slot at once, and that a freed slot goes to the waiter.
    async fn a_bounded_lane_never_takes_the_reserve(bounded: Lane) {
        let lanes = Arc::new(Lanes::new(4));
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(lanes.enter(bounded).await.expect("a slot"));
        }
        let waiting = {
            let lanes = Arc::clone(&lanes);
            tokio::spawn(async move { lanes.enter(bounded).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "{bounded:?} took the reserved slot");
        assert_eq!(lanes.free(), 1);
        let finishing = tokio::time::timeout(Duration::from_secs(5), lanes.enter(Lane::Finishing))
            .await
            .expect("finishing work waited behind {bounded:?} work")
            .expect("a slot");
        assert_eq!(lanes.free(), 0);
        held.pop();
        let got = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiting reconcile never got a freed slot")
            .expect("joined");
        assert!(got.is_some());
        drop(finishing);
        assert_eq!(lanes.free(), 1);
    }

    #[tokio::test]
    async fn background_work_never_takes_the_reserve() {
        a_bounded_lane_never_takes_the_reserve(Lane::Background).await;
    }

    #[tokio::test]
    async fn new_work_never_takes_the_reserve() {
        a_bounded_lane_never_takes_the_reserve(Lane::New).await;
    }

    #[tokio::test]
    async fn resyncs_leave_room_for_new_sessions() {
        let lanes = Lanes::new(4);
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(lanes.enter(Lane::Background).await.expect("a slot"));
        }
        let new = tokio::time::timeout(Duration::from_secs(5), lanes.enter(Lane::New))
            .await
            .expect("a new session waited behind resyncs")
            .expect("a slot");
        assert_eq!(lanes.free(), 0);
        drop((held, new));
        assert_eq!(lanes.free(), 4);
    }

    #[tokio::test]
    async fn finishing_work_may_use_every_slot() {
        let lanes = Lanes::new(4);
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(
                tokio::time::timeout(Duration::from_secs(5), lanes.enter(Lane::Finishing))
                    .await
                    .expect("a finishing slot")
                    .expect("a slot"),
            );
        }
        assert_eq!(lanes.free(), 0);
        drop(held);
        assert_eq!(lanes.free(), 4);
    }
}
