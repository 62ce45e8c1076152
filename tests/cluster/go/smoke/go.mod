// Static test binary for tests/cluster/smoke.sh (stdlib only).
module agentplane.test/cluster/smoke

go 1.26.0
