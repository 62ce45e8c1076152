//! Logging and OpenTelemetry export, set up the same way in both binaries
//! (`agent-operator`, `agent-sidecar`), so that a platform team configures
//! both with the standard OpenTelemetry environment variables and nothing
//! project-specific:
//!
//! - `OTEL_EXPORTER_OTLP_ENDPOINT`, or the per-signal
//!   `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`:
//!   a signal is exported (OTLP over gRPC) only when one of its endpoints is
//!   set; an unset endpoint means no exporter, never a default that dials
//!   localhost from every sandbox;
//! - `OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none`,
//!   `OTEL_METRICS_EXPORTER=none`: switch export off;
//! - `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`: the resource (the
//!   binary's own name is used when no service name is set);
//! - `OTEL_BSP_SCHEDULE_DELAY`, `OTEL_METRIC_EXPORT_INTERVAL`, and the
//!   exporters' own `OTEL_EXPORTER_OTLP_*` settings (timeout, headers):
//!   read by the SDK itself;
//! - `RUST_LOG`: the log filter.

use opentelemetry::global;
use opentelemetry_otlp::{MetricExporter, SpanExporter};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;

/// What went wrong setting telemetry up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot install the logger: {0}")]
    Logging(String),
    #[error(
        "cannot build the OTLP {signal} exporter (check OTEL_EXPORTER_OTLP_* variables): {message}"
    )]
    Exporter {
        signal: &'static str,
        message: String,
    },
}

/// What a binary wants.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    /// `service.name` when `OTEL_SERVICE_NAME` does not set one.
    pub service: &'static str,
    /// Log as JSON lines instead of text.
    pub json_logs: bool,
    /// The log filter when `RUST_LOG` is not set.
    pub default_filter: &'static str,
    /// Whether the binary has spans worth exporting.
    pub traces: bool,
    /// Whether the binary has metrics worth exporting.
    pub metrics: bool,
}

/// The installed providers; flushed and stopped when dropped (at the end of
/// `main`), so the last batch is not lost on a clean exit.
#[derive(Debug, Default)]
pub struct Telemetry {
    tracer: Option<SdkTracerProvider>,
    meter: Option<SdkMeterProvider>,
}

impl Telemetry {
    /// Whether any signal is exported.
    pub fn exporting(&self) -> bool {
        self.tracer.is_some() || self.meter.is_some()
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(t) = self.tracer.take()
            && let Err(e) = t.shutdown()
        {
            tracing::warn!(error = %e, "trace exporter shutdown");
        }
        if let Some(m) = self.meter.take()
            && let Err(e) = m.shutdown()
        {
            tracing::warn!(error = %e, "metric exporter shutdown");
        }
    }
}

/// The two signals, with their environment variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Traces,
    Metrics,
}

impl Signal {
    fn endpoint_var(self) -> &'static str {
        match self {
            Self::Traces => "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            Self::Metrics => "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        }
    }

    fn exporter_var(self) -> &'static str {
        match self {
            Self::Traces => "OTEL_TRACES_EXPORTER",
            Self::Metrics => "OTEL_METRICS_EXPORTER",
        }
    }
}

/// Whether `signal` is to be exported, given a variable lookup (the
/// environment in production; a table in tests).
pub fn enabled(signal: Signal, var: impl Fn(&str) -> Option<String>) -> bool {
    let set = |k: &str| var(k).is_some_and(|v| !v.trim().is_empty());
    let is = |k: &str, want: &str| var(k).is_some_and(|v| v.trim().eq_ignore_ascii_case(want));
    if is("OTEL_SDK_DISABLED", "true") || is(signal.exporter_var(), "none") {
        return false;
    }
    set(signal.endpoint_var()) || set("OTEL_EXPORTER_OTLP_ENDPOINT")
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

/// Installs the logger and, for each signal whose endpoint is configured,
/// an OTLP exporter as the global provider. Must run inside a tokio runtime
/// when anything is exported (the gRPC exporters need one).
pub fn init(setup: Setup) -> Result<Telemetry, Error> {
    init_logging(setup)?;
    init_export(setup)
}

/// Installs the OTLP exporters [`init`] would, without the logger: for a
/// binary that must log before its async runtime exists.
pub fn init_export(setup: Setup) -> Result<Telemetry, Error> {
    let resource = resource(setup.service);
    let mut out = Telemetry::default();
    if setup.traces && enabled(Signal::Traces, env) {
        let spans = SpanExporter::builder()
            .with_tonic()
            .build()
            .map_err(|e| exporter_error("trace", e))?;
        let tracer = SdkTracerProvider::builder()
            .with_batch_exporter(spans)
            .with_resource(resource.clone())
            .build();
        global::set_tracer_provider(tracer.clone());
        out.tracer = Some(tracer);
    }
    if setup.metrics && enabled(Signal::Metrics, env) {
        let metrics = MetricExporter::builder()
            .with_tonic()
            .build()
            .map_err(|e| exporter_error("metric", e))?;
        let meter = SdkMeterProvider::builder()
            .with_periodic_exporter(metrics)
            .with_resource(resource)
            .build();
        global::set_meter_provider(meter.clone());
        out.meter = Some(meter);
    }
    if out.exporting() {
        tracing::info!(
            traces = out.tracer.is_some(),
            metrics = out.meter.is_some(),
            "exporting telemetry over OTLP"
        );
    }
    Ok(out)
}

fn exporter_error(signal: &'static str, e: impl std::fmt::Display) -> Error {
    Error::Exporter {
        signal,
        message: e.to_string(),
    }
}

/// The resource: the SDK's environment detectors, plus the binary's own
/// name unless `OTEL_SERVICE_NAME` gives one.
fn resource(service: &'static str) -> Resource {
    let mut builder = Resource::builder();
    if env("OTEL_SERVICE_NAME").is_none_or(|v| v.trim().is_empty()) {
        builder = builder.with_service_name(service);
    }
    builder.build()
}

/// Installs the logger [`init`] would, and nothing else.
pub fn init_logging(setup: Setup) -> Result<(), Error> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(setup.default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let installed = if setup.json_logs {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
    installed.map_err(|e| Error::Logging(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn a_signal_is_exported_only_with_an_endpoint_and_not_when_switched_off() {
        use Signal::{Metrics, Traces};
        type Case<'a> = (&'a [(&'a str, &'a str)], bool, bool);
        let cases: &[Case] = &[
            (&[], false, false),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", "")], false, false),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317")],
                true,
                true,
            ),
            (
                &[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://c:4317")],
                false,
                true,
            ),
            (
                &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4317")],
                true,
                false,
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                    ("OTEL_SDK_DISABLED", "TRUE"),
                ],
                false,
                false,
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                    ("OTEL_TRACES_EXPORTER", "none"),
                ],
                false,
                true,
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                    ("OTEL_METRICS_EXPORTER", "none"),
                ],
                true,
                false,
            ),
        ];
        for (env, traces, metrics) in cases {
            assert_eq!(enabled(Traces, vars(env)), *traces, "traces with {env:?}");
            assert_eq!(
                enabled(Metrics, vars(env)),
                *metrics,
                "metrics with {env:?}"
            );
        }
    }
}
