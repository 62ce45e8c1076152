//! The dispatcher's metrics (exported by OTLP like the rest of the plane):
//! per environment, the hosted queue's depth and the sessions running here,
//! so that a platform can size the warm pool from the queue (an HPA or
//! KEDA on `agentplane.managed.queue.depth`); and the calls run.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram};

/// Per environment (`namespace/name`): queue depth, oldest item age,
/// sessions running.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct EnvFigures {
    /// Items queued on the hosted side.
    pub depth: i64,
    /// Age of the oldest queued item, seconds.
    pub oldest_seconds: i64,
    /// Sessions running here.
    pub running: i64,
}

/// The dispatcher's instruments.
#[derive(Debug, Clone)]
pub struct Metrics {
    figures: Arc<Mutex<BTreeMap<String, EnvFigures>>>,
    calls: Counter<u64>,
    duration: Histogram<f64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers the instruments on the global meter.
    pub fn new() -> Self {
        let meter = opentelemetry::global::meter("agentplane-dispatcher");
        let figures: Arc<Mutex<BTreeMap<String, EnvFigures>>> = Arc::default();
        let gauge = |name: &'static str, desc: &'static str, pick: fn(&EnvFigures) -> i64| {
            let f = figures.clone();
            meter
                .i64_observable_gauge(name)
                .with_description(desc)
                .with_callback(move |obs| {
                    let map = f.lock().unwrap_or_else(|p| p.into_inner());
                    for (env, fig) in map.iter() {
                        obs.observe(pick(fig), &[KeyValue::new("environment", env.clone())]);
                    }
                })
                .build()
        };
        // The gauges live as long as the meter provider; their handles
        // need not be kept.
        let _ = gauge(
            "agentplane.managed.queue.depth",
            "Work items queued on the hosted side",
            |f| f.depth,
        );
        let _ = gauge(
            "agentplane.managed.queue.oldest",
            "Age in seconds of the oldest queued work item",
            |f| f.oldest_seconds,
        );
        let _ = gauge(
            "agentplane.managed.sessions.running",
            "Sessions whose tools run here now",
            |f| f.running,
        );
        Self {
            figures,
            calls: meter
                .u64_counter("agentplane.managed.calls")
                .with_description("Tool calls run for hosted sessions")
                .build(),
            duration: meter
                .f64_histogram("agentplane.managed.call.duration")
                .with_unit("s")
                .with_description("Time from a call's start to its result, through the gateway")
                .build(),
        }
    }

    /// Sets an environment's figures.
    pub fn set(&self, env: &str, f: EnvFigures) {
        self.figures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(env.to_owned(), f);
    }

    /// Forgets an environment.
    pub fn forget(&self, env: &str) {
        self.figures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(env);
    }

    /// Counts a call.
    pub fn call(&self, took: Duration, is_error: bool) {
        let attrs = [KeyValue::new("is_error", is_error)];
        self.calls.add(1, &attrs);
        self.duration.record(took.as_secs_f64(), &attrs);
    }
}
