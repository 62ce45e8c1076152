//! Logs through `tracing`; traces and metrics over OTLP when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set (the standard variable, so the
//! chart and any collector setup work unchanged). Without it nothing is
//! exported and the global no-op providers absorb every record.

use opentelemetry::global;
use opentelemetry_otlp::{MetricExporter, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;

use crate::error::{Error, Result};

/// Flushes and stops the exporters when dropped at the end of `main`.
#[derive(Debug, Default)]
pub struct Telemetry {
    tracer: Option<SdkTracerProvider>,
    meter: Option<SdkMeterProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(t) = self.tracer.take() {
            let _ = t.shutdown();
        }
        if let Some(m) = self.meter.take() {
            let _ = m.shutdown();
        }
    }
}

/// Installs logging and, when configured, the OTLP exporters.
pub fn init(service: &'static str, json_logs: bool) -> Result<Telemetry> {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,kube=warn,tower=warn,hyper=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = if json_logs {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
    installed.map_err(|e| Error::Telemetry(e.to_string()))?;

    let Ok(endpoint) = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT") else {
        return Ok(Telemetry::default());
    };
    let resource = Resource::builder().with_service_name(service).build();
    let spans = SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.clone())
        .build()
        .map_err(|e| Error::Telemetry(format!("OTLP span exporter for {endpoint}: {e}")))?;
    let tracer = SdkTracerProvider::builder()
        .with_batch_exporter(spans)
        .with_resource(resource.clone())
        .build();
    global::set_tracer_provider(tracer.clone());
    let metrics = MetricExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.clone())
        .build()
        .map_err(|e| Error::Telemetry(format!("OTLP metric exporter for {endpoint}: {e}")))?;
    let reader = PeriodicReader::builder(metrics)
        .with_interval(std::time::Duration::from_secs(10))
        .build();
    let meter = SdkMeterProvider::builder()
        .with_reader(reader)
        .with_resource(resource)
        .build();
    global::set_meter_provider(meter.clone());
    tracing::info!(%endpoint, "exporting traces and metrics over OTLP");
    Ok(Telemetry {
        tracer: Some(tracer),
        meter: Some(meter),
    })
}
