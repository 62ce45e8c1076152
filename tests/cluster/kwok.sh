#!/usr/bin/env bash
# Fake nodes beside the real one, for the scale benchmark: the KWOK controller
# (built by build.sh like the other components) runs against the harness
# cluster, keeps N Node objects Ready and plays the pods bound to them through
# tests/cluster/kwok/stages.yaml (Running and Ready at once; removed when
# deleted). Everything else -- API server, etcd, scheduler, controller-manager,
# and whatever is installed (operator, webhook, pool controller, gateway) -- is
# real. See docs/cluster.md ("Simulated nodes").
#
#   kwok.sh up N     start the controller (if not running) and have N fake nodes
#                    (1..2000) named kwok-node-0000..; idempotent, grows or shrinks
#   kwok.sh down     delete the fake nodes and their pods, stop the controller
#   kwok.sh status   the controller's pid and how many fake nodes are Ready
#
# Fake nodes are labelled type=kwok and agentplane.dev/simulated=true and
# tainted agentplane.dev/simulated=true:NoSchedule: only pods that select and
# tolerate them land there (nothing of the chart's or of the e2e tests' does).
# `cluster.sh down` stops the controller too. Needs the cluster up (cluster.sh up)
# and, like it, root; hold /tmp/agentplane-cluster.lock around a shared cluster.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# cluster.sh defines start/stop/pid_alive/kc/wait_for when sourced.
# shellcheck source=SCRIPTDIR/cluster.sh
. "$HERE/cluster.sh"

KWOK_LABEL="type=kwok"
KWOK_TAINT_KEY="agentplane.dev/simulated"
# Pod IPs of fake pods: apart from the real pod, service and host ranges.
KWOK_CIDR="${AGENTPLANE_KWOK_CIDR:-10.200.0.0/16}"
KWOK_DIR="$STATE_DIR/kwok"

fake_node_yaml() { # fake_node_yaml NAME
	cat <<YAML
apiVersion: v1
kind: Node
metadata:
  name: $1
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    type: kwok
    agentplane.dev/simulated: "true"
    kubernetes.io/hostname: $1
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
spec:
  taints:
  - key: $KWOK_TAINT_KEY
    value: "true"
    effect: NoSchedule
---
YAML
}

ready_fake_nodes() {
	kc get nodes -l "$KWOK_LABEL" -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null |
		grep -c '^True$' || true
}

cmd_kwok_up() {
	local n=${1:-}
	[[ "$n" =~ ^[0-9]+$ && $n -ge 1 && $n -le 2000 ]] || die "kwok.sh up N: N fake nodes, 1..2000 (got '${n}')"
	[[ $EUID -eq 0 ]] || die "kwok.sh needs root (as cluster.sh)"
	is_up || die "kwok.sh up: the cluster is not up (tests/cluster/cluster.sh up)"
	"$HERE/build.sh" >/dev/null
	mkdir -p "$KWOK_DIR"
	cp "$HERE/kwok/stages.yaml" "$KWOK_DIR/stages.yaml"
	# Manages only nodes labelled type=kwok: the real node is never touched.
	start kwok "$BIN_DIR/kwok" \
		--kubeconfig "$KUBECONFIG_PATH" \
		--config "$KWOK_DIR/stages.yaml" \
		--manage-all-nodes=false \
		--manage-nodes-with-label-selector "$KWOK_LABEL" \
		--cidr "$KWOK_CIDR" \
		--node-ip "$HOST_IP" \
		--node-lease-duration-seconds 40 \
		--server-address 127.0.0.1:10247
	wait_for kwok 30 "kwok's healthz" curl -sf --max-time 2 http://127.0.0.1:10247/healthz
	# Create the missing nodes in batches; remove the ones above N.
	local have batch="" i name t0=$SECONDS
	have=$(kc get nodes -l "$KWOK_LABEL" -o name 2>/dev/null | sed 's|^node/||' | sort)
	for ((i = 0; i < n; i++)); do
		printf -v name 'kwok-node-%04d' "$i"
		grep -qxF "$name" <<<"$have" && continue
		batch+=$(fake_node_yaml "$name")$'\n'
		if [[ $(grep -c '^kind: Node' <<<"$batch") -ge 100 ]]; then
			kc apply -f - >/dev/null <<<"$batch" || die "kwok.sh: cannot create fake nodes"
			batch=""
		fi
	done
	[[ -z "$batch" ]] || kc apply -f - >/dev/null <<<"$batch" || die "kwok.sh: cannot create fake nodes"
	local extra
	extra=$(grep -E '^kwok-node-[0-9]{4}$' <<<"$have" | awk -v n="$n" '{ if (substr($0, 11) + 0 >= n) print }' || true)
	[[ -z "$extra" ]] || kc delete node $extra --wait=false >/dev/null
	local deadline=$((SECONDS + 120)) ready
	while :; do
		ready=$(ready_fake_nodes)
		[[ $ready -ge $n ]] && break
		pid_alive kwok || fail_component kwok "exited while $ready of $n fake nodes were Ready"
		[[ $SECONDS -lt $deadline ]] || fail_component kwok "only $ready of $n fake nodes Ready after 120s"
		sleep 1
	done
	log "kwok: $n fake nodes Ready in $((SECONDS - t0))s (label $KWOK_LABEL, taint $KWOK_TAINT_KEY=true:NoSchedule, pod IPs $KWOK_CIDR)"
}

cmd_kwok_down() {
	[[ $EUID -eq 0 ]] || die "kwok.sh needs root (as cluster.sh)"
	if pid_alive kube-apiserver && curl_api /readyz >/dev/null 2>&1; then
		# Pods on fake nodes first (force: no kubelet will confirm), then the nodes.
		local node
		for node in $(kc get nodes -l "$KWOK_LABEL" -o name 2>/dev/null | sed 's|^node/||'); do
			kc delete pods -A --field-selector "spec.nodeName=$node" --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
		done
		kc delete nodes -l "$KWOK_LABEL" --wait=false >/dev/null 2>&1 || true
	fi
	stop kwok
	rm -rf "$KWOK_DIR"
	log "kwok: fake nodes deleted, controller stopped"
}

cmd_kwok_status() {
	if pid_alive kwok; then
		printf 'kwok running (pid %s); %s fake nodes Ready\n' "$(cut -d' ' -f1 <"$(pidfile kwok)")" "$(ready_fake_nodes)"
	else
		printf 'kwok stopped\n'
		return 3
	fi
}

case "${1:-help}" in
up) shift; cmd_kwok_up "$@" ;;
down) cmd_kwok_down ;;
status) cmd_kwok_status ;;
*) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
