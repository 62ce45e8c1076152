//! Leader election over a coordination.k8s.io Lease, so that of several
//! operator replicas exactly one reconciles while all of them serve the
//! webhook.
//!
//! The rules are client-go's, for the same reasons:
//! - every Lease call has a timeout, so a hung API connection cannot keep a
//!   replica believing it leads;
//! - the leader steps down when it has not renewed for `renew_deadline`,
//!   which is shorter than the lease duration, so it has stopped acting
//!   before any other replica may take over;
//! - a candidate judges expiry by its own clock: a lease is free only after
//!   the candidate itself has seen the same record, unchanged, for the whole
//!   lease duration. Comparing the holder's renewTime with the local clock
//!   would let clock skew between nodes hand the lease over early.
//!
//! Writes are optimistic (resourceVersion), so two candidates racing for a
//! free lease cannot both win.
//!
//! `kube-lease-manager` was considered and not taken: it compares the
//! stored renewTime with the local system clock and puts no timeout on its
//! calls, so a leader whose calls hang keeps its "leader" state.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::time::Instant;

use crate::error::{Error, Result};

/// Who competes for which lease, and how fast.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    /// How long a lease lasts without renewal (written into the Lease).
    pub duration: Duration,
    /// The leader steps down when it could not renew for this long; must be
    /// shorter than `duration`.
    pub renew_deadline: Duration,
    /// How often the leader renews and a candidate retries.
    pub retry_period: Duration,
    /// The longest one Lease call may take.
    pub call_timeout: Duration,
}

impl LeaseConfig {
    /// client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry.
    pub fn new(namespace: String, name: String, identity: String) -> Self {
        Self {
            namespace,
            name,
            identity,
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            call_timeout: Duration::from_secs(5),
        }
    }

    /// Other timing, for a faster fail-over (`--lease-*-seconds`): the
    /// rules above hold only if a renew is retried at least twice before
    /// the deadline and the deadline passes before the lease does, so
    /// anything else is refused with the rule it breaks. Each call may take
    /// at most half the renew deadline (and never more than 5 s).
    pub fn with_timing(
        mut self,
        duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Result<Self> {
        if retry_period.is_zero() || retry_period.saturating_mul(2) > renew_deadline {
            return Err(Error::LeaseTiming(format!(
                "the retry period ({retry_period:?}) must be positive and at most half the renew deadline ({renew_deadline:?})"
            )));
        }
        if renew_deadline >= duration {
            return Err(Error::LeaseTiming(format!(
                "the renew deadline ({renew_deadline:?}) must be shorter than the lease duration ({duration:?})"
            )));
        }
        self.duration = duration;
        self.renew_deadline = renew_deadline;
        self.retry_period = retry_period;
        self.call_timeout = (renew_deadline / 2).min(Duration::from_secs(5));
        Ok(self)
    }
}

/// The Lease calls election needs; [`Api<Lease>`] in production. A trait so
/// that the timing rules can be tested with calls that never answer.
pub trait LeaseStore: Send + Sync {
    fn get(&self, name: &str) -> impl Future<Output = Result<Option<Lease>>> + Send;
    /// `Ok(false)` when someone else wrote first (a conflict).
    fn create(&self, lease: &Lease) -> impl Future<Output = Result<bool>> + Send;
    /// `Ok(false)` when someone else wrote first (a conflict).
    fn replace(&self, name: &str, lease: &Lease) -> impl Future<Output = Result<bool>> + Send;
}

fn conflict_is_false(r: kube::Result<Lease>) -> Result<bool> {
    match r {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

impl LeaseStore for Api<Lease> {
    async fn get(&self, name: &str) -> Result<Option<Lease>> {
        Ok(self.get_opt(name).await?)
    }

    async fn create(&self, lease: &Lease) -> Result<bool> {
        conflict_is_false(Api::create(self, &PostParams::default(), lease).await)
    }

    async fn replace(&self, name: &str, lease: &Lease) -> Result<bool> {
        conflict_is_false(Api::replace(self, name, &PostParams::default(), lease).await)
    }
}

/// The last lease record a candidate saw, and when (by its own clock).
#[derive(Debug, Default, Clone)]
pub struct Observation {
    record: Option<(Option<String>, Option<String>, Option<String>)>,
    since: Option<Instant>,
}

impl Observation {
    /// Notes the record read at `now`; the clock restarts when it changed.
    pub fn see(&mut self, spec: &LeaseSpec, resource_version: Option<&str>, now: Instant) {
        let record = (
            spec.holder_identity.clone(),
            spec.renew_time.as_ref().map(|t| t.0.to_string()),
            resource_version.map(str::to_owned),
        );
        if self.record.as_ref() != Some(&record) {
            self.record = Some(record);
            self.since = Some(now);
        }
    }

    /// Whether the lease is free for us at `now`: no holder, or a record
    /// unchanged for the lease's whole duration as this process measured it.
    pub fn expired(&self, spec: &LeaseSpec, now: Instant) -> bool {
        if spec.holder_identity.as_deref().is_none_or(str::is_empty) {
            return true;
        }
        let secs = spec.lease_duration_seconds.unwrap_or(15).max(1);
        let lasts = Duration::from_secs(u64::try_from(secs).unwrap_or(15));
        self.since
            .is_some_and(|since| now.saturating_duration_since(since) >= lasts)
    }
}

/// A call bounded by `limit`; a call that does not answer is an error.
async fn bounded<T>(limit: Duration, call: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or_else(|_| Err(Error::LeaseTimeout(limit)))
}

/// Tries once to take or renew the lease. `Ok(true)` when we hold it.
pub async fn try_acquire<S: LeaseStore>(
    store: &S,
    cfg: &LeaseConfig,
    seen: &mut Observation,
) -> Result<bool> {
    let stamp = Some(MicroTime(Timestamp::now()));
    let secs = i32::try_from(cfg.duration.as_secs()).unwrap_or(15);
    let Some(mut lease) = bounded(cfg.call_timeout, store.get(&cfg.name)).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(cfg.name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(cfg.identity.clone()),
                lease_duration_seconds: Some(secs),
                acquire_time: stamp.clone(),
                renew_time: stamp,
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return bounded(cfg.call_timeout, store.create(&lease)).await;
    };
    let version = lease.metadata.resource_version.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    seen.see(spec, version.as_deref(), Instant::now());
    let mine = spec.holder_identity.as_deref() == Some(cfg.identity.as_str());
    if !mine && !seen.expired(spec, Instant::now()) {
        return Ok(false);
    }
    if !mine {
        spec.holder_identity = Some(cfg.identity.clone());
        spec.acquire_time = stamp.clone();
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    spec.renew_time = stamp;
    spec.lease_duration_seconds = Some(secs);
    bounded(cfg.call_timeout, store.replace(&cfg.name, &lease)).await
}

/// Waits until this replica holds the lease.
pub async fn acquire<S: LeaseStore>(store: &S, cfg: &LeaseConfig) -> Result<()> {
    let mut seen = Observation::default();
    loop {
        match try_acquire(store, cfg, &mut seen).await {
            Ok(true) => {
                tracing::info!(lease = %cfg.name, identity = %cfg.identity, "became leader");
                return Ok(());
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "leader election attempt failed"),
        }
        tokio::time::sleep(cfg.retry_period).await;
    }
}

/// Renews the lease until it is lost: another holder, or no successful
/// renewal for `renew_deadline` (each attempt is cut off at the deadline,
/// so a hung call cannot stretch it). Returns the error that ends
/// leadership; the caller must stop acting at once.
pub async fn hold<S: LeaseStore>(store: &S, cfg: &LeaseConfig) -> Error {
    let mut last_ok = Instant::now();
    let mut seen = Observation::default();
    loop {
        tokio::time::sleep(cfg.retry_period).await;
        let left = cfg.renew_deadline.saturating_sub(last_ok.elapsed());
        let attempt = tokio::time::timeout(left, try_acquire(store, cfg, &mut seen)).await;
        match attempt {
            Ok(Ok(true)) => last_ok = Instant::now(),
            Ok(Ok(false)) => return Error::LostLease(cfg.name.clone()),
            Ok(Err(e)) => tracing::warn!(error = %e, "lease renewal failed"),
            Err(_) => tracing::warn!("lease renewal did not answer before the renew deadline"),
        }
        if last_ok.elapsed() >= cfg.renew_deadline {
            return Error::LostLease(cfg.name.clone());
        }
    }
}

/// Gives the lease up on shutdown so a standby takes over at once instead
/// of waiting for it to expire.
pub async fn release<S: LeaseStore>(store: &S, cfg: &LeaseConfig) {
    let got = bounded(cfg.call_timeout, store.get(&cfg.name)).await;
    if let Ok(Some(mut lease)) = got
        && let Some(spec) = lease.spec.as_mut()
        && spec.holder_identity.as_deref() == Some(cfg.identity.as_str())
    {
        spec.holder_identity = None;
        spec.renew_time = None;
        let _ = bounded(cfg.call_timeout, store.replace(&cfg.name, &lease)).await;
    }
}
