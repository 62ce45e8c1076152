//! The tool-duration metric. Its export is the shared `telemetry` crate's.

use std::time::Duration;

use opentelemetry::KeyValue;

use runner_api::ToolResult;

use crate::error::Error;

const METER_NAME: &str = "agentplane.sidecar";

/// Records one call's duration on `tool.execution.duration` (seconds), with
/// `gen_ai.tool.name` and, on failure, `error.type`: `tool_error` for a
/// result the model sees as an error, the [`Error::kind`] otherwise.
///
/// The meter is resolved per call rather than cached: a cached instrument
/// pins whichever provider was installed first, and a call costs far more
/// than the lookup. A name that is no built-in tool is recorded as `_OTHER`
/// (OTel's convention for values outside a known set), so a model inventing
/// names cannot grow the metric's cardinality without bound.
pub fn record_run(name: &str, d: Duration, res: &Result<ToolResult, Error>) {
    let tool = if toolset::BUILTIN_TOOLS.contains(&name) || toolset::is_web_tool(name) {
        name.to_owned()
    } else {
        "_OTHER".to_owned()
    };
    let mut attrs = vec![KeyValue::new(toolset::ATTR_TOOL_NAME, tool)];
    match res {
        Ok(r) if r.is_error => attrs.push(KeyValue::new(toolset::ATTR_ERROR_TYPE, "tool_error")),
        Ok(_) => {}
        Err(e) => attrs.push(KeyValue::new(toolset::ATTR_ERROR_TYPE, e.kind())),
    }
    opentelemetry::global::meter(METER_NAME)
        .f64_histogram(toolset::METRIC_TOOL_DURATION)
        .with_unit("s")
        .with_description("Duration of one built-in tool call in the sandbox runner.")
        .build()
        .record(d.as_secs_f64(), &attrs);
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
    use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

    /// (metric name, sorted attributes, count) of every data point.
    type Point = (String, Vec<(String, String)>, u64);

    fn points(exporter: &InMemoryMetricExporter) -> Vec<Point> {
        let mut out = Vec::new();
        for rm in exporter.get_finished_metrics().unwrap() {
            for sm in rm.scope_metrics() {
                for m in sm.metrics() {
                    assert_eq!(m.name(), toolset::METRIC_TOOL_DURATION);
                    assert_eq!(m.unit(), "s");
                    let AggregatedMetrics::F64(MetricData::Histogram(h)) = m.data() else {
                        panic!("not an f64 histogram");
                    };
                    for dp in h.data_points() {
                        let mut attrs: Vec<(String, String)> = dp
                            .attributes()
                            .map(|kv| (kv.key.to_string(), kv.value.to_string()))
                            .collect();
                        attrs.sort();
                        out.push((m.name().to_owned(), attrs, dp.count()));
                    }
                }
            }
        }
        out
    }

    /// The meter is resolved per call, so a provider installed after the
    /// first call still receives every later one.
    #[test]
    fn records_name_unit_and_attributes_on_the_current_provider() {
        let ok = Ok(ToolResult {
            content: String::new(),
            is_error: false,
        });
        record_run("bash", Duration::from_millis(3), &ok);

        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        opentelemetry::global::set_meter_provider(provider.clone());

        record_run("bash", Duration::from_millis(3), &ok);
        let tool_err = Ok(ToolResult {
            content: "x".into(),
            is_error: true,
        });
        record_run("read", Duration::from_millis(1), &tool_err);
        record_run(
            "made_up",
            Duration::from_millis(1),
            &Err(Error::DisabledTool {
                tool: "made_up".into(),
            }),
        );
        provider.force_flush().unwrap();
        let mut got = points(&exporter);
        got.sort();
        let kv = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        assert_eq!(
            got,
            vec![
                (
                    toolset::METRIC_TOOL_DURATION.to_owned(),
                    vec![
                        kv("error.type", "disabled_tool"),
                        kv("gen_ai.tool.name", "_OTHER")
                    ],
                    1
                ),
                (
                    toolset::METRIC_TOOL_DURATION.to_owned(),
                    vec![
                        kv("error.type", "tool_error"),
                        kv("gen_ai.tool.name", "read")
                    ],
                    1
                ),
                (
                    toolset::METRIC_TOOL_DURATION.to_owned(),
                    vec![kv("gen_ai.tool.name", "bash")],
                    1
                ),
            ]
        );
    }
}
