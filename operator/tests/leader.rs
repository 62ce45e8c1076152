//! Leader election's timing rules, with Lease calls that can be made to
//! hang. The store is in memory because a real API server cannot be told to
//! stop answering one client mid-call; time is tokio's paused clock, so the
//! minutes these rules span take milliseconds. The real API server path is
//! the e2e chart walk (two replicas, one leader lease).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use operator::Error;
use operator::leader::{self, LeaseConfig, LeaseStore};
use tokio::time::Instant;

/// A Lease with the API server's optimistic concurrency, whose calls can be
/// made to hang forever.
#[derive(Default)]
struct Memory {
    lease: Mutex<Option<Lease>>,
    version: AtomicU64,
    hang: AtomicBool,
}

impl Memory {
    async fn answer(&self) {
        if self.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }

    fn stored(&self) -> Option<Lease> {
        self.lease.lock().unwrap().clone()
    }

    fn put(&self, mut lease: Lease) {
        let v = self.version.fetch_add(1, Ordering::SeqCst) + 1;
        lease.metadata.resource_version = Some(v.to_string());
        *self.lease.lock().unwrap() = Some(lease);
    }

    fn holder(&self) -> Option<String> {
        self.stored()?.spec?.holder_identity
    }
}

impl LeaseStore for Memory {
    async fn get(&self, _name: &str) -> operator::Result<Option<Lease>> {
        self.answer().await;
        Ok(self.stored())
    }

    async fn create(&self, lease: &Lease) -> operator::Result<bool> {
        self.answer().await;
        if self.stored().is_some() {
            return Ok(false);
        }
        self.put(lease.clone());
        Ok(true)
    }

    async fn replace(&self, _name: &str, lease: &Lease) -> operator::Result<bool> {
        self.answer().await;
        let current = self.stored().and_then(|l| l.metadata.resource_version);
        if current != lease.metadata.resource_version {
            return Ok(false);
        }
        self.put(lease.clone());
        Ok(true)
    }
}

fn cfg(identity: &str) -> LeaseConfig {
    LeaseConfig::new("ns".into(), "agentplane-operator".into(), identity.into())
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_calls_hang_stops_within_the_lease_duration() {
    let store = Memory::default();
    let a = cfg("a");
    leader::acquire(&store, &a).await.unwrap();
    assert_eq!(store.holder().as_deref(), Some("a"));

    store.hang.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(600), leader::hold(&store, &a))
        .await
        .expect("hold must end by itself when renewals hang");
    let took = started.elapsed();
    assert!(matches!(err, Error::LostLease(_)), "{err}");
    assert!(
        took < a.duration,
        "stepped down after {took:?}; another replica may lead after {:?}",
        a.duration
    );
    assert!(
        took >= a.renew_deadline,
        "not before the renew deadline: {took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_renewing_leader_keeps_the_lease_and_a_candidate_waits() {
    let store = Memory::default();
    let (a, b) = (cfg("a"), cfg("b"));
    leader::acquire(&store, &a).await.unwrap();
    let held = tokio::time::timeout(Duration::from_secs(120), async {
        tokio::join!(leader::hold(&store, &a), leader::acquire(&store, &b))
    })
    .await;
    assert!(held.is_err(), "neither ends while the leader renews");
    assert_eq!(store.holder().as_deref(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn expiry_is_measured_by_the_candidates_own_clock() {
    // The holder's renewTime is decades in the past (a skewed clock, or a
    // replica that died long ago): the candidate still waits one whole
    // lease duration of its own observation before taking over.
    let store = Memory::default();
    store.put(Lease {
        metadata: ObjectMeta {
            name: Some("agentplane-operator".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("gone".into()),
            renew_time: Some(MicroTime(Timestamp::UNIX_EPOCH)),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        }),
    });
    let b = cfg("b");
    let started = Instant::now();
    leader::acquire(&store, &b).await.unwrap();
    let waited = started.elapsed();
    assert_eq!(store.holder().as_deref(), Some("b"));
    assert!(
        waited >= Duration::from_secs(15),
        "took over after {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(20),
        "took over after {waited:?}"
    );
    let transitions = store.stored().and_then(|l| l.spec?.lease_transitions);
    assert_eq!(transitions, Some(1));
}

#[tokio::test(start_paused = true)]
async fn a_released_lease_is_taken_at_once() {
    let store = Memory::default();
    let (a, b) = (cfg("a"), cfg("b"));
    leader::acquire(&store, &a).await.unwrap();
    leader::release(&store, &a).await;
    let started = Instant::now();
    leader::acquire(&store, &b).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(store.holder().as_deref(), Some("b"));
}

#[tokio::test(start_paused = true)]
async fn a_hung_candidate_call_is_cut_off_and_retried() {
    let store = Memory::default();
    store.hang.store(true, Ordering::SeqCst);
    let b = cfg("b");
    let mut seen = leader::Observation::default();
    let err = leader::try_acquire(&store, &b, &mut seen)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseTimeout(_)), "{err}");
}

#[test]
fn a_faster_fail_over_is_accepted_only_with_timing_that_keeps_the_rules() {
    let s = Duration::from_secs;
    let fast = cfg("a")
        .with_timing(s(8), s(5), s(1))
        .expect("8/5/1 keeps the rules");
    assert_eq!(fast.duration, s(8));
    assert!(fast.call_timeout <= fast.renew_deadline / 2);
    for (d, r, p, says) in [
        (s(10), s(10), s(2), "shorter than the lease duration"),
        (s(15), s(10), s(6), "at most half the renew deadline"),
        (s(15), s(10), s(0), "must be positive"),
    ] {
        let err = cfg("a")
            .with_timing(d, r, p)
            .expect_err("refused")
            .to_string();
        assert!(err.contains(says), "{err}");
    }
}
