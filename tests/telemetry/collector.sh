#!/usr/bin/env bash
# The OpenTelemetry Collector used by the telemetry contract test
# (tests/e2e/tests/telemetry.rs): OTLP receiver (gRPC) -> file exporter.
# Built from the pinned Go modules beside this script (go.mod, main.go).
#
#   collector.sh build          build once into the cache; print the binary path
#   collector.sh start OUTFILE  write a config and start it in the background;
#                               traces and metrics go to OUTFILE as OTLP JSON lines
#   collector.sh stop           stop the one start started (pid file)
#   collector.sh path           print the binary path
#
# Env: AGENTPLANE_OTELCOL_ADDR (default 0.0.0.0:4317), AGENTPLANE_OTELCOL_RUN
# (state dir for config, pid and log; default /tmp/agentplane-otelcol).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VERSION="v0.161.0"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/agentplane/otelcol-$VERSION"
BIN="$CACHE/otelcol"
ADDR="${AGENTPLANE_OTELCOL_ADDR:-0.0.0.0:4317}"
RUN="${AGENTPLANE_OTELCOL_RUN:-/tmp/agentplane-otelcol}"
PIDFILE="$RUN/otelcol.pid"

die() {
	echo "collector.sh: $*" >&2
	exit 1
}

build() {
	if [[ -x "$BIN" ]]; then
		echo "$BIN"
		return 0
	fi
	command -v go >/dev/null || die "go is not installed"
	mkdir -p "$CACHE"
	echo "collector.sh: building otelcol $VERSION into $BIN (takes a few minutes once)" >&2
	(cd "$HERE" && CGO_ENABLED=0 nice -n 19 go build -trimpath -ldflags='-s -w' -o "$BIN.tmp" .) ||
		die "go build failed"
	mv "$BIN.tmp" "$BIN"
	echo "$BIN"
}

running() {
	[[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

start() {
	local out="${1:-}"
	[[ -n "$out" ]] || die "usage: collector.sh start OUTFILE"
	build >/dev/null
	if running; then
		die "already running (pid $(cat "$PIDFILE")); run collector.sh stop first"
	fi
	mkdir -p "$RUN" "$(dirname "$out")"
	out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
	: >"$out"
	cat >"$RUN/config.yaml" <<YAML
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: $ADDR
exporters:
  file:
    path: $out
    format: json
    flush_interval: 1s
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
    metrics:
      receivers: [otlp]
      exporters: [file]
YAML
	"$BIN" validate --config "file:$RUN/config.yaml" >"$RUN/otelcol.log" 2>&1 ||
		die "config rejected: $(cat "$RUN/otelcol.log")"
	nohup "$BIN" --config "file:$RUN/config.yaml" >"$RUN/otelcol.log" 2>&1 </dev/null &
	echo $! >"$PIDFILE"
	# Ready once the gRPC port listens (or fail if the process died).
	local port="${ADDR##*:}"
	for _ in $(seq 1 100); do
		running || die "exited at start: $(tail -20 "$RUN/otelcol.log")"
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			echo "collector.sh: listening on $ADDR (pid $(cat "$PIDFILE")), writing $out" >&2
			return 0
		fi
		sleep 0.1
	done
	stop
	die "not listening on $ADDR after 10 s: $(tail -20 "$RUN/otelcol.log")"
}

stop() {
	[[ -f "$PIDFILE" ]] || return 0
	local pid
	pid="$(cat "$PIDFILE")"
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid"
		for _ in $(seq 1 50); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
	fi
	rm -f "$PIDFILE"
}

case "${1:-}" in
build) build ;;
start) start "${2:-}" ;;
stop) stop ;;
path) echo "$BIN" ;;
*) die "usage: collector.sh build|start OUTFILE|stop|path" ;;
esac
