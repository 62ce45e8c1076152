//! Leader election over a coordination.k8s.io Lease, so that of several
//! operator replicas exactly one reconciles while all of them serve the
//! webhook. Writes are optimistic (resourceVersion), so two candidates
//! racing for an expired lease cannot both win.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;

use crate::error::{Error, Result};

/// Who competes for which lease, and how fast.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub duration: Duration,
    pub renew_every: Duration,
}

/// Whether a lease held by someone else has run out at `now`.
pub fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    let Some(renewed) = spec.renew_time.as_ref().map(|t| t.0) else {
        return true;
    };
    let secs = spec.lease_duration_seconds.unwrap_or(15).max(1);
    let until = renewed
        .checked_add(jiff_secs(i64::from(secs)))
        .unwrap_or(renewed);
    until < now
}

fn jiff_secs(s: i64) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::from_secs(s)
}

fn now() -> Timestamp {
    Timestamp::now()
}

/// Tries once to take or renew the lease. `Ok(true)` when we hold it.
pub async fn try_acquire(api: &Api<Lease>, cfg: &LeaseConfig) -> Result<bool> {
    let stamp = Some(MicroTime(now()));
    let secs = i32::try_from(cfg.duration.as_secs()).unwrap_or(15);
    match api.get_opt(&cfg.name).await? {
        None => {
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
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            }
        }
        Some(mut lease) => {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            let mine = spec.holder_identity.as_deref() == Some(cfg.identity.as_str());
            if !mine && !expired(spec, now()) {
                return Ok(false);
            }
            if !mine {
                spec.holder_identity = Some(cfg.identity.clone());
                spec.acquire_time = stamp.clone();
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            spec.renew_time = stamp;
            spec.lease_duration_seconds = Some(secs);
            match api.replace(&cfg.name, &PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            }
        }
    }
}

/// Waits until this replica holds the lease.
pub async fn acquire(api: &Api<Lease>, cfg: &LeaseConfig) -> Result<()> {
    loop {
        match try_acquire(api, cfg).await {
            Ok(true) => {
                tracing::info!(lease = %cfg.name, identity = %cfg.identity, "became leader");
                return Ok(());
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "leader election attempt failed"),
        }
        tokio::time::sleep(cfg.renew_every).await;
    }
}

/// Renews the lease until a renewal fails for longer than the lease lasts;
/// then returns the error that ends leadership. The caller exits, because a
/// replica that may no longer be leader must stop reconciling at once.
pub async fn hold(api: Api<Lease>, cfg: LeaseConfig) -> Error {
    let mut last_ok = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(cfg.renew_every).await;
        match try_acquire(&api, &cfg).await {
            Ok(true) => last_ok = tokio::time::Instant::now(),
            Ok(false) => return Error::LostLease(cfg.name.clone()),
            Err(e) => {
                tracing::warn!(error = %e, "lease renewal failed");
                if last_ok.elapsed() >= cfg.duration {
                    return Error::LostLease(cfg.name.clone());
                }
            }
        }
    }
}

/// Gives the lease up on shutdown so a standby takes over at once instead
/// of waiting for it to expire.
pub async fn release(api: &Api<Lease>, cfg: &LeaseConfig) {
    if let Ok(Some(mut lease)) = api.get_opt(&cfg.name).await
        && let Some(spec) = lease.spec.as_mut()
        && spec.holder_identity.as_deref() == Some(cfg.identity.as_str())
    {
        spec.holder_identity = None;
        spec.renew_time = None;
        let _ = api.replace(&cfg.name, &PostParams::default(), &lease).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_expires_after_its_duration() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().expect("timestamp");
        let spec = LeaseSpec {
            renew_time: Some(MicroTime(t0)),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        };
        assert!(!expired(&spec, t0.checked_add(jiff_secs(14)).expect("t")));
        assert!(expired(&spec, t0.checked_add(jiff_secs(16)).expect("t")));
        assert!(expired(&LeaseSpec::default(), t0), "never renewed is free");
    }
}
