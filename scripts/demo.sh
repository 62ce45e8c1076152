#!/usr/bin/env bash
# The main job, end to end: a cluster (the local one from tests/cluster
# unless KUBECONFIG points at a reachable one), the chart installed with the
# locally built images, examples/session.yaml applied, and tool calls made
# through `kubectl agent`. Leaves everything running; see the last lines for
# how to clean up.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
NS=agentplane-system

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

local_cluster=false
if [[ -n "${KUBECONFIG:-}" ]] && kubectl version --request-timeout=5s >/dev/null 2>&1; then
  step "using the cluster KUBECONFIG points at ($KUBECONFIG)"
else
  step "starting the local single-node cluster (first run builds Kubernetes from source: ~20 min)"
  tests/cluster/cluster.sh up
  eval "$(tests/cluster/cluster.sh env)"
  local_cluster=true
fi

if $local_cluster; then
  step "building the runner and operator images (static binaries, no Docker)"
  scripts/images.sh
else
  echo "note: with your own cluster, push localhost/agentplane/{runner,operator}:dev where its nodes can pull them" >&2
fi

step "building kubectl-agent"
cargo build --release --locked -p kubectl-agent
PATH="$CARGO_TARGET_DIR/release:$PATH"

step "installing the chart"
helm upgrade --install agentplane charts/agentplane -n "$NS" --create-namespace --wait --timeout 5m \
  --set replicaCount="${AGENTPLANE_REPLICAS:-2}"
kubectl -n "$NS" get pods -o wide

step "applying examples/session.yaml"
# The webhook answers as soon as one replica is ready; retry briefly.
for i in $(seq 1 30); do
  if kubectl apply -f examples/session.yaml; then break; fi
  [[ $i -lt 30 ]] || exit 1
  sleep 2
done
printf 'waiting for the session to be Ready '
for i in $(seq 1 120); do
  phase=$(kubectl get agentsession demo -o jsonpath='{.status.phase}' 2>/dev/null || true)
  [[ "$phase" == Ready ]] && break
  printf '.'
  sleep 2
done
echo " $phase"
[[ "$phase" == Ready ]] || { kubectl describe agentsession demo; exit 1; }
kubectl get agentsessions

step "kubectl agent tools demo"
kubectl agent tools demo

step "kubectl agent bash demo -- 'echo hello from \$(uname -n); id; cd /workspace && pwd'"
kubectl agent bash demo -- 'echo hello from $(uname -n); id; cd /workspace && pwd'

step "kubectl agent call demo write (always_ask: refused without --confirm)"
kubectl agent call demo write '{"file_path": "notes/hello.txt", "content": "written by the demo\n"}' || true

step "kubectl agent call demo write --confirm"
kubectl agent call demo write '{"file_path": "notes/hello.txt", "content": "written by the demo\n"}' --confirm

step "kubectl agent call demo read / grep / glob"
kubectl agent call demo read '{"file_path": "notes/hello.txt"}'
kubectl agent call demo grep '{"pattern": "demo", "path": "notes"}'
kubectl agent call demo glob '{"pattern": "**/*.txt"}'

cat <<MSG

Done. The session keeps running:
  kubectl get agentsessions; kubectl agent tools demo
Clean up:
  kubectl delete -f examples/session.yaml
  helm uninstall agentplane -n $NS
$($local_cluster && echo "  tests/cluster/cluster.sh down")
MSG
