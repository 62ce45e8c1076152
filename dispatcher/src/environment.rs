//! One `AgentEnvironment` served: a loop that polls its queue while it has
//! room (at most `maxConcurrentSessions` runs at once; the rest stays
//! queued on the hosted side), a run per item, and its status every few
//! seconds. The key is read from its Secret before every poll, so a
//! rotated key is used on the next poll.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use crds::{AgentEnvironment, AgentEnvironmentStatus, AgentSession};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use tokio::sync::{Semaphore, watch};

use crate::api::QueueStats;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::item::{self, Assignment};
use crate::metrics::EnvFigures;
use crate::retry;
use crate::sandbox;

/// The most bytes an environment key may have.
const MAX_KEY_BYTES: usize = 4096;
/// How often the status is written.
const STATUS_EVERY: Duration = Duration::from_secs(5);
/// The status is rewritten at least this often (the poll time moves).
const STATUS_REFRESH: Duration = Duration::from_secs(60);

/// The key in `secret[key]`, trimmed; refuses what cannot be one.
pub fn key_from_secret(secret: &Secret, key: &str) -> Result<String> {
    let name = secret.name_any();
    let raw = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .ok_or_else(|| Error::Key(format!("the Secret {name} has no data key {key:?}")))?;
    let s = std::str::from_utf8(&raw.0)
        .map_err(|_| Error::Key(format!("the Secret {name}'s {key:?} is not UTF-8")))?
        .trim();
    if s.is_empty() || s.len() > MAX_KEY_BYTES || s.bytes().any(|b| b.is_ascii_control()) {
        return Err(Error::Key(format!(
            "the Secret {name}'s {key:?} is not an environment key (empty, over {MAX_KEY_BYTES} bytes, or with control characters)"
        )));
    }
    Ok(s.to_owned())
}

/// Shared between an environment's loop and its status writer.
#[derive(Debug, Default)]
struct Observed {
    running: AtomicI64,
    /// Work items being served by this process: an item polled again
    /// (its lease lapsed and the queue handed it out anew while a resumed
    /// run holds it) is not served twice.
    active: std::sync::Mutex<std::collections::HashSet<String>>,
    last_poll: std::sync::Mutex<Option<(String, Option<String>)>>,
}

/// Serves `env` until `stop` says so (the environment was deleted or the
/// dispatcher is shutting down). Runs that are going keep going.
pub async fn serve(
    ctx: Arc<Context>,
    mut env: watch::Receiver<Arc<AgentEnvironment>>,
    mut stop: watch::Receiver<bool>,
) {
    let first = env.borrow().clone();
    let ns = first.namespace().unwrap_or_default();
    let label = format!("{ns}/{}", first.name_any());
    let uid = first.uid().unwrap_or_default();
    let cap = first
        .spec
        .max_concurrent_sessions
        .clamp(1, crds::environment::MAX_CONCURRENT_SESSIONS) as usize;
    let slots = Arc::new(Semaphore::new(cap));
    let mut slots_cap = cap;
    let observed = Arc::new(Observed::default());
    let sessions: Api<AgentSession> = Api::namespaced(ctx.kube.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(ctx.kube.clone(), &ns);

    tokio::spawn(status_loop(
        ctx.clone(),
        env.clone(),
        stop.clone(),
        observed.clone(),
        label.clone(),
    ));

    // Resume what an earlier incarnation was running (its sandboxes say so).
    match sessions
        .list(&ListParams::default().labels(&format!("{}={uid}", sandbox::ENVIRONMENT_LABEL)))
        .await
    {
        Ok(list) => {
            for (s, work, session) in sandbox::resumable(&list.items, &uid) {
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    break;
                };
                let key = match read_key(&secrets, &first).await {
                    Ok(k) => k,
                    Err(e) => {
                        tracing::warn!(environment = %label, error = %e, "cannot resume runs without the key");
                        break;
                    }
                };
                tracing::info!(environment = %label, work = %work, "resuming a run");
                let a = Assignment {
                    namespace: ns.clone(),
                    environment: first.clone(),
                    key: Arc::from(key.as_str()),
                    item: crate::api::WorkItem {
                        id: work,
                        kind: "session".into(),
                        session_id: Some(session),
                        sessions_token: None,
                    },
                    resumed: Some(s),
                };
                spawn_run(ctx.clone(), a, permit, observed.clone());
            }
        }
        Err(e) => {
            tracing::warn!(environment = %label, error = %e, "cannot list the environment's sessions to resume")
        }
    }

    let mut failures = 0u32;
    loop {
        if *stop.borrow() {
            return;
        }
        let current = env.borrow_and_update().clone();
        // A raised cap takes effect at once; a lowered one as runs end.
        let want = current
            .spec
            .max_concurrent_sessions
            .clamp(1, crds::environment::MAX_CONCURRENT_SESSIONS) as usize;
        if want > slots_cap {
            slots.add_permits(want - slots_cap);
            slots_cap = want;
        } else if want < slots_cap
            && let Ok(p) = slots
                .clone()
                .try_acquire_many_owned((slots_cap - want) as u32)
        {
            p.forget();
            slots_cap = want;
        }
        if current.spec.paused == Some(true) {
            if wait(&mut stop, Duration::from_secs(2)).await {
                return;
            }
            continue;
        }
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = stop.changed() => return,
            _ = env.changed() => continue,
        };
        let key = match read_key(&secrets, &current).await {
            Ok(k) => k,
            Err(e) => {
                record_poll(&observed, Some(e.to_string()));
                failures += 1;
                if wait(
                    &mut stop,
                    retry::backoff(failures, Duration::from_secs(1), Duration::from_secs(30)),
                )
                .await
                {
                    return;
                }
                continue;
            }
        };
        let asked = tokio::time::Instant::now();
        let polled = tokio::select! {
            r = ctx.api.poll(&current.spec.environment_id, &key, &ctx.worker_id) => r,
            _ = stop.changed() => return,
        };
        match polled {
            Ok(Some(item)) if observed.is_active(&item.id) => {
                failures = 0;
                record_poll(&observed, None);
                drop(permit);
                tracing::info!(environment = %label, work = %item.id, "polled an item this dispatcher already serves; left alone");
            }
            Ok(Some(item)) => {
                failures = 0;
                record_poll(&observed, None);
                tracing::info!(environment = %label, work = %item.id, session = ?item.session_id, "took a work item");
                let a = Assignment {
                    namespace: ns.clone(),
                    environment: current.clone(),
                    key: Arc::from(key.as_str()),
                    item,
                    resumed: None,
                };
                spawn_run(ctx.clone(), a, permit, observed.clone());
            }
            Ok(None) => {
                failures = 0;
                record_poll(&observed, None);
                drop(permit);
                // A poll the server held for its block time is itself the
                // wait: poll again at once, so a new item is taken within a
                // round trip. One that came back at once (a server that
                // does not block) waits 1-3 s, as the official worker
                // always does, so that nothing spins.
                let wait_for = retry::after_empty_poll(asked.elapsed());
                if wait(&mut stop, wait_for).await {
                    return;
                }
            }
            Err(e) => {
                drop(permit);
                record_poll(&observed, Some(e.to_string()));
                failures += 1;
                // A fatal answer (a revoked key, an unknown environment) is
                // shown in the status and polled again slowly: the fix is a
                // new key in the Secret, which the next poll reads.
                let cap = if e.is_transient() { 60 } else { 30 };
                tracing::warn!(environment = %label, error = %e, "poll failed");
                if wait(
                    &mut stop,
                    retry::backoff(failures, Duration::from_secs(1), Duration::from_secs(cap)),
                )
                .await
                {
                    return;
                }
            }
        }
    }
}

impl Observed {
    fn is_active(&self, work: &str) -> bool {
        self.active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(work)
    }
}

fn spawn_run(
    ctx: Arc<Context>,
    a: Assignment,
    permit: tokio::sync::OwnedSemaphorePermit,
    observed: Arc<Observed>,
) {
    let work = a.item.id.clone();
    if !observed
        .active
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(work.clone())
    {
        return;
    }
    observed.running.fetch_add(1, Ordering::Relaxed);
    tokio::spawn(async move {
        let end = item::serve(ctx, a).await;
        tracing::info!(work = %work, end = ?end, "run ended");
        observed.running.fetch_sub(1, Ordering::Relaxed);
        observed
            .active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&work);
        drop(permit);
    });
}

/// Sleeps `d`; true when the loop should stop.
async fn wait(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    tokio::select! {
        () = tokio::time::sleep(d) => *stop.borrow(),
        r = stop.changed() => r.is_err() || *stop.borrow(),
    }
}

async fn read_key(secrets: &Api<Secret>, env: &AgentEnvironment) -> Result<String> {
    let r = &env.spec.key_secret_ref;
    let s = secrets
        .get_opt(&r.name)
        .await
        .map_err(|e| Error::Key(format!("cannot read the Secret {}: {e}", r.name)))?;
    let s = s.ok_or_else(|| Error::Key(format!("the Secret {} does not exist", r.name)))?;
    key_from_secret(&s, &r.key)
}

fn record_poll(o: &Observed, error: Option<String>) {
    let now = now_rfc3339();
    *o.last_poll.lock().unwrap_or_else(|p| p.into_inner()) = Some((now, error));
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// Seconds since an RFC 3339 time, if it parses.
pub fn age_seconds(at: &str, now: time::OffsetDateTime) -> Option<i64> {
    let t = time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).ok()?;
    Some((now - t).whole_seconds().max(0))
}

/// The status to write from what was observed.
pub fn status_of(
    generation: Option<i64>,
    stats: Option<&QueueStats>,
    running: i64,
    last_poll: Option<&(String, Option<String>)>,
    now: time::OffsetDateTime,
) -> AgentEnvironmentStatus {
    let (ready, reason, message) = match last_poll {
        None => (
            "Unknown",
            "Starting",
            "the queue has not been polled yet".to_owned(),
        ),
        Some((_, None)) => (
            "True",
            "Polling",
            "the queue answers polls with this key".to_owned(),
        ),
        Some((_, Some(e))) => ("False", "PollFailed", e.clone()),
    };
    AgentEnvironmentStatus {
        queue_depth: stats.and_then(|s| s.depth),
        queue_pending: stats.and_then(|s| s.pending),
        oldest_queued_seconds: stats
            .and_then(|s| s.oldest_queued_at.as_deref())
            .and_then(|t| age_seconds(t, now)),
        sessions_running: i32::try_from(running).unwrap_or(i32::MAX),
        last_poll_time: last_poll.map(|p| p.0.clone()),
        last_poll_error: last_poll.and_then(|p| p.1.clone()),
        observed_generation: generation,
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: ready.into(),
            reason: reason.into(),
            message,
            observed_generation: generation,
            last_transition_time: Time(
                k8s_openapi::jiff::Timestamp::from_second(now.unix_timestamp()).unwrap_or_default(),
            ),
        }],
    }
}

async fn status_loop(
    ctx: Arc<Context>,
    env: watch::Receiver<Arc<AgentEnvironment>>,
    mut stop: watch::Receiver<bool>,
    observed: Arc<Observed>,
    label: String,
) {
    let mut last: Option<AgentEnvironmentStatus> = None;
    let mut written = tokio::time::Instant::now();
    loop {
        let e = env.borrow().clone();
        let ns = e.namespace().unwrap_or_default();
        let stats = match (async {
            let secrets: Api<Secret> = Api::namespaced(ctx.kube.clone(), &ns);
            let key = read_key(&secrets, &e).await?;
            ctx.api.stats(&e.spec.environment_id, &key).await
        })
        .await
        {
            Ok(s) => Some(s),
            Err(err) => {
                tracing::debug!(environment = %label, error = %err, "queue stats");
                None
            }
        };
        let running = observed.running.load(Ordering::Relaxed);
        let poll = observed
            .last_poll
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let now = time::OffsetDateTime::now_utc();
        let mut status = status_of(
            e.metadata.generation,
            stats.as_ref(),
            running,
            poll.as_ref(),
            now,
        );
        ctx.metrics.set(
            &label,
            EnvFigures {
                depth: status.queue_depth.unwrap_or(0),
                oldest_seconds: status.oldest_queued_seconds.unwrap_or(0),
                running,
            },
        );
        // Keep the condition's transition time while its status holds.
        if let Some(prev) = last.as_ref() {
            crds::conditions::keep_transition_times(&mut status.conditions, &prev.conditions);
        }
        let changed_besides_time = last.as_ref().map(|l| {
            let mut a = l.clone();
            let mut b = status.clone();
            a.last_poll_time = None;
            b.last_poll_time = None;
            a != b
        });
        // Written when something but the poll time changed, and at least
        // once a minute so that the poll time shows the loop is alive.
        if changed_besides_time != Some(false) || written.elapsed() >= STATUS_REFRESH {
            let api: Api<AgentEnvironment> = Api::namespaced(ctx.kube.clone(), &ns);
            let patch = serde_json::json!({
                "apiVersion": "agentplane.dev/v1alpha1",
                "kind": "AgentEnvironment",
                "status": status,
            });
            match api
                .patch_status(
                    &e.name_any(),
                    &PatchParams::apply("agentplane-dispatcher").force(),
                    &Patch::Apply(&patch),
                )
                .await
            {
                Ok(_) => {
                    last = Some(status);
                    written = tokio::time::Instant::now();
                }
                Err(err) => {
                    tracing::warn!(environment = %label, error = %err, "cannot write the status")
                }
            }
        }
        if wait(&mut stop, STATUS_EVERY).await {
            ctx.metrics.forget(&label);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    fn secret(v: &[u8]) -> Secret {
        Secret {
            metadata: kube::api::ObjectMeta {
                name: Some("k".into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([("key".to_owned(), ByteString(v.to_vec()))])),
            ..Default::default()
        }
    }

    #[test]
    fn keys_are_trimmed_and_bad_ones_named_without_their_value() {
        assert_eq!(
            key_from_secret(&secret(b"sk-env-1\n"), "key").unwrap(),
            "sk-env-1"
        );
        for bad in [&b""[..], b"  ", b"a\x00b", &[0xff, 0xfe]] {
            let e = key_from_secret(&secret(bad), "key")
                .unwrap_err()
                .to_string();
            assert!(e.contains("Secret k"), "{e}");
        }
        let e = key_from_secret(&secret(b"x"), "other")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no data key \"other\""), "{e}");
        let long = vec![b'a'; MAX_KEY_BYTES + 1];
        assert!(key_from_secret(&secret(&long), "key").is_err());
    }

    #[test]
    fn the_status_reads_the_queue_and_the_last_poll() {
        let now = time::OffsetDateTime::from_unix_timestamp(1_800_000_100).unwrap();
        let stats = QueueStats {
            depth: Some(7),
            pending: Some(1),
            oldest_queued_at: Some("2027-01-15T08:00:00Z".into()),
            workers_polling: Some(1),
        };
        let ok = ("t".to_owned(), None);
        let s = status_of(Some(3), Some(&stats), 2, Some(&ok), now);
        assert_eq!(s.queue_depth, Some(7));
        assert_eq!(s.sessions_running, 2);
        assert_eq!(s.conditions[0].status, "True");
        assert!(s.oldest_queued_seconds.is_some());
        let bad = (
            "t".to_owned(),
            Some(
                "the Managed Agents API answered 401 to poll: authentication_error: bad".to_owned(),
            ),
        );
        let s = status_of(Some(3), None, 0, Some(&bad), now);
        assert_eq!(s.conditions[0].status, "False");
        assert_eq!(s.conditions[0].reason, "PollFailed");
        assert!(s.last_poll_error.unwrap().contains("401"));
    }
}
