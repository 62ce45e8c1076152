//! Keeping a work item's lease: a task that heartbeats until the item is
//! stopped, the server asks for a stop, the lease is lost, or the run
//! ends. The rest of the run watches its state and stops when it ends, so
//! an item whose lease went to someone else is never worked on twice.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::api::{ManagedApi, NO_HEARTBEAT};
use crate::error::Error;

/// The interval before the server has said the lease's TTL.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
/// The TTL assumed before the server has said one.
pub const DEFAULT_TTL: Duration = Duration::from_secs(90);
/// The TTL asked for.
pub const DESIRED_TTL_SECONDS: u64 = 90;

/// Why a lease ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEnd {
    /// The server is stopping the item (a stop was asked, or it would not
    /// extend the lease).
    StopRequested,
    /// Someone else holds it, or no beat succeeded for a whole TTL: leave
    /// the item alone.
    Lost(String),
    /// The server refused the beat for good (a 4xx other than 408/409/429).
    Rejected(String),
}

/// The lease's state as the run sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// Held; the latest TTL.
    Held(Duration),
    /// Over.
    Ended(LeaseEnd),
}

/// The next beat's interval for a TTL: half of it, at least a second, at
/// most thirty.
pub fn interval_for(ttl: Duration) -> Duration {
    (ttl / 2).clamp(Duration::from_secs(1), DEFAULT_INTERVAL)
}

/// How to reach the item's heartbeat.
#[derive(Debug, Clone)]
pub struct Target {
    /// The API.
    pub api: ManagedApi,
    /// The environment.
    pub environment: String,
    /// The item.
    pub work: String,
    /// The item's bearer (its sessions token, or the environment key).
    pub bearer: Arc<str>,
}

/// A running heartbeat.
#[derive(Debug)]
pub struct Lease {
    state: watch::Receiver<LeaseState>,
    task: tokio::task::JoinHandle<()>,
}

impl Lease {
    /// Starts beating at once. With `adopt`, a first 412 is taken as this
    /// dispatcher's own earlier lease (a restart): the server's current
    /// `last_heartbeat` is echoed and the lease continues. Only a caller
    /// that can show the item was its own (the AgentSession it created for
    /// it) may adopt.
    pub fn start(target: Target, adopt: bool) -> Self {
        let (tx, rx) = watch::channel(LeaseState::Held(DEFAULT_TTL));
        let task = tokio::spawn(beat(target, adopt, tx));
        Self { state: rx, task }
    }

    /// The current state.
    pub fn state(&self) -> LeaseState {
        self.state.borrow().clone()
    }

    /// The TTL last reported, when held.
    pub fn ttl(&self) -> Option<Duration> {
        match self.state() {
            LeaseState::Held(t) => Some(t),
            LeaseState::Ended(_) => None,
        }
    }

    /// Resolves when the lease ends.
    pub async fn ended(&self) -> LeaseEnd {
        let mut rx = self.state.clone();
        loop {
            if let LeaseState::Ended(e) = rx.borrow_and_update().clone() {
                return e;
            }
            if rx.changed().await.is_err() {
                return LeaseEnd::Lost("the heartbeat task ended".into());
            }
        }
    }

    /// Whether the item may still be stopped by us (a lost lease belongs
    /// to someone else now).
    pub fn may_stop(&self) -> bool {
        !matches!(self.state(), LeaseState::Ended(LeaseEnd::Lost(_)))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn beat(t: Target, mut adopt: bool, tx: watch::Sender<LeaseState>) {
    let mut expected = NO_HEARTBEAT.to_owned();
    let mut ttl = DEFAULT_TTL;
    let mut last_ok = Instant::now();
    let mut first = true;
    loop {
        let interval = interval_for(ttl);
        if !first {
            tokio::time::sleep(interval).await;
        }
        first = false;
        let r = t
            .api
            .heartbeat(
                &t.environment,
                &t.bearer,
                &t.work,
                &expected,
                DESIRED_TTL_SECONDS,
                interval,
            )
            .await;
        match r {
            Ok(hb) => {
                last_ok = Instant::now();
                adopt = false;
                expected = hb.last_heartbeat;
                if let Some(s) = hb.ttl_seconds.filter(|s| s.is_finite() && *s > 0.0) {
                    ttl = Duration::from_secs_f64(s.min(86_400.0));
                }
                if !hb.lease_extended || matches!(hb.state.as_str(), "stopping" | "stopped") {
                    let _ = tx.send(LeaseState::Ended(LeaseEnd::StopRequested));
                    return;
                }
                let _ = tx.send(LeaseState::Held(ttl));
            }
            Err(e) if e.status() == Some(412) => {
                if adopt && let Some(cur) = current_last_heartbeat(&e) {
                    adopt = false;
                    expected = cur;
                    first = true;
                    continue;
                }
                let _ = tx.send(LeaseState::Ended(LeaseEnd::Lost(
                    "the server's last heartbeat is not ours (412): another worker holds the item"
                        .into(),
                )));
                return;
            }
            Err(e) if !e.is_transient() && e.status().is_some() => {
                let _ = tx.send(LeaseState::Ended(LeaseEnd::Rejected(e.to_string())));
                return;
            }
            Err(e) => {
                if last_ok.elapsed() >= ttl {
                    let _ = tx.send(LeaseState::Ended(LeaseEnd::Lost(format!(
                        "no heartbeat succeeded for the lease's whole TTL ({}s); last error: {e}",
                        ttl.as_secs()
                    ))));
                    return;
                }
                tracing::warn!(work = %t.work, error = %e, "heartbeat failed; retrying");
            }
        }
    }
}

/// `details.current_state.last_heartbeat` of a 412, if it names one and
/// the item is not over.
fn current_last_heartbeat(e: &Error) -> Option<String> {
    let Error::Api { body: Some(b), .. } = e else {
        return None;
    };
    let cur = b
        .pointer("/error/details/current_state")
        .or_else(|| b.pointer("/details/current_state"))?;
    let state = cur.get("state").and_then(|v| v.as_str()).unwrap_or("");
    if matches!(state, "stopping" | "stopped") {
        return None;
    }
    cur.get("last_heartbeat")
        .and_then(|v| v.as_str())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_is_half_the_ttl_within_bounds() {
        assert_eq!(
            interval_for(Duration::from_secs(90)),
            Duration::from_secs(30)
        );
        assert_eq!(
            interval_for(Duration::from_secs(20)),
            Duration::from_secs(10)
        );
        assert_eq!(
            interval_for(Duration::from_millis(500)),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn a_412_names_the_current_heartbeat_unless_the_item_is_over() {
        let e = |state: &str| Error::Api {
            what: "heartbeat",
            status: 412,
            message: String::new(),
            body: Some(serde_json::json!({"type": "error", "error": {
                "type": "heartbeat_precondition_failed",
                "details": {"current_state": {"state": state, "last_heartbeat": "2026-01-01T00:00:00Z"}}}})),
        };
        assert_eq!(
            current_last_heartbeat(&e("active")).as_deref(),
            Some("2026-01-01T00:00:00Z")
        );
        assert_eq!(current_last_heartbeat(&e("stopped")), None);
    }
}
