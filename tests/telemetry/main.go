// A minimal OpenTelemetry Collector for agentplane's telemetry contract test
// (tests/e2e/tests/telemetry.rs): the OTLP receiver and the file exporter,
// nothing else. Built by collector.sh from the pinned modules in go.mod.
package main

import (
	"fmt"
	"os"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

func factories() (otelcol.Factories, error) {
	return otelcol.Factories{
		Receivers: map[component.Type]receiver.Factory{
			otlpreceiver.NewFactory().Type(): otlpreceiver.NewFactory(),
		},
		Telemetry: otelconftelemetry.NewFactory(),
		Exporters: map[component.Type]exporter.Factory{
			fileexporter.NewFactory().Type(): fileexporter.NewFactory(),
		},
	}, nil
}

func main() {
	info := component.BuildInfo{
		Command:     "otelcol",
		Description: "agentplane test collector (otlp receiver, file exporter)",
		Version:     "v0.161.0",
	}
	cmd := otelcol.NewCommand(otelcol.CollectorSettings{
		BuildInfo: info,
		Factories: factories,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{
					fileprovider.NewFactory(),
					envprovider.NewFactory(),
				},
			},
		},
	})
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
