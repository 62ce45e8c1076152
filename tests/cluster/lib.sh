# shellcheck shell=bash disable=SC2034  # variables are used by the scripts that source this
# Shared settings for tests/cluster/*.sh (sourced, not executed).

CLUSTER_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
GOMOD_DIR="$CLUSTER_DIR/go"

modver() { # modver MODDIR MODULE -> version required in MODDIR/go.mod
	awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$GOMOD_DIR/$1/go.mod"
}
K8S_VERSION="$(modver k8s k8s.io/kubernetes)"
ETCD_VERSION="$(modver etcd go.etcd.io/etcd/server/v3)"
HELM_VERSION="$(modver helm helm.sh/helm/v4)"
KUBE_ROUTER_VERSION="$(modver kube-router github.com/cloudnativelabs/kube-router/v2)"
KWOK_VERSION="$(modver kwok sigs.k8s.io/kwok)"

CACHE_ROOT="${AGENTPLANE_CACHE:-$HOME/.cache/agentplane}"
BIN_DIR="$CACHE_ROOT/k8s-$K8S_VERSION/bin"

# Cluster state: all of it lives here and nowhere else.
STATE_DIR="${AGENTPLANE_CLUSTER_STATE:-/var/lib/agentplane-cluster}"
RUN_DIR="${AGENTPLANE_CLUSTER_RUN:-/run/agentplane-cluster}"
LOG_DIR="$STATE_DIR/logs"
PKI_DIR="$STATE_DIR/pki"
PID_DIR="$RUN_DIR/pids"
KUBECONFIG_PATH="$STATE_DIR/admin.kubeconfig"
CONTAINERD_SOCK="$RUN_DIR/containerd/containerd.sock"
CTR_NAMESPACE="k8s.io"

# Fixed image names (pods use imagePullPolicy: Never / IfNotPresent).
PAUSE_IMAGE="localhost/agentplane/pause:dev"
SANDBOX_BASE_IMAGE="localhost/agentplane/sandbox-base:dev"

log() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
