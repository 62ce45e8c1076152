#!/usr/bin/env bash
# Single-node Kubernetes test cluster for agentplane, built from source (Go
# module proxy) and run directly on this machine: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, containerd (+runc, CNI bridge),
# kubelet, kube-proxy and kube-router (firewall only: it enforces NetworkPolicy);
# storage: local-path-provisioner (the default class) and a CSI stack with
# VolumeSnapshots (the project's hostpath driver, external-provisioner,
# csi-snapshotter, snapshot-controller). No Docker, no registry. See docs/cluster.md.
#
#   cluster.sh up          start everything (idempotent: a 2nd up returns at once)
#   cluster.sh down        stop exactly what up started, clean sandboxes, remove state
#   cluster.sh status      per-component status; exit 0 when fully up
#   cluster.sh restart-apiserver  SIGKILL the API server and start it again
#   cluster.sh kubeconfig  print the admin kubeconfig path
#   cluster.sh build       build the pinned binaries into the cache (once)
#   cluster.sh image NAME SRC [CMD...]  pack a static binary or rootfs dir (or an
#                          OCI tarball, when SRC ends in .tar) and import it
#   cluster.sh kubectl ARGS...          kubectl (built, same version) on this cluster
#   cluster.sh helm ARGS...             helm on this cluster
#   cluster.sh env         print shell exports (KUBECONFIG, PATH with the binaries)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/lib.sh
. "$HERE/lib.sh"

# --- settings (env-overridable) ----------------------------------------------
NODE_NAME="${AGENTPLANE_NODE_NAME:-agentplane-node}"
BRIDGE="${AGENTPLANE_BRIDGE:-apbr0}"
POD_CIDR="${AGENTPLANE_POD_CIDR:-10.88.0.0/16}"
# The bridge gateway doubles as the node IP: the kubelet refuses a loopback
# node IP, and pods must reach the API server (Service 10.96.0.1 -> here).
HOST_IP="${AGENTPLANE_HOST_IP:-10.88.0.1}"
SERVICE_CIDR="${AGENTPLANE_SERVICE_CIDR:-10.96.0.0/16}"
API_SERVICE_IP="${AGENTPLANE_API_SERVICE_IP:-10.96.0.1}"
API_PORT="${AGENTPLANE_API_PORT:-6443}"
ETCD_PORT="${AGENTPLANE_ETCD_PORT:-2379}"
ETCD_PEER_PORT="${AGENTPLANE_ETCD_PEER_PORT:-2380}"
KUBELET_PORT="${AGENTPLANE_KUBELET_PORT:-10250}"
CGROUP_ROOT="/agentplane-cluster"
CNI_NET="agentplane"
FWD_CHAIN="AGENTPLANE-FWD"
IN_CHAIN="AGENTPLANE-IN"
API_URL="https://127.0.0.1:$API_PORT"
# Client rate limits of the scheduler (binds) and controller-manager (GC,
# namespaces); the defaults are upstream's, the scale benchmark raises them.
SCHEDULER_QPS="${AGENTPLANE_SCHEDULER_QPS:-50}"
CM_QPS="${AGENTPLANE_CONTROLLER_MANAGER_QPS:-20}"
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy kube-router local-path-provisioner
	csi-hostpath csi-provisioner csi-snapshotter snapshot-controller)
# Dynamic provisioning: rancher's local-path-provisioner, run on the host
# against the API server; its volumes are directories under LOCAL_PATH_DIR.
LOCAL_PATH_NS=local-path-storage
LOCAL_PATH_CLASS=local-path
LOCAL_PATH_DIR="$STATE_DIR/local-path"
KUBELET_ROOT="$STATE_DIR/kubelet/root"
# CSI with VolumeSnapshots: the project's driver (tests/cluster/go/csi/hostpath)
# registers with the kubelet through its plugins_registry directory and serves
# CSI on a socket in the kubelet's plugins directory; its volumes and snapshots
# are directories under CSI_DATA_DIR. The real external-provisioner,
# csi-snapshotter and snapshot-controller run on the host against the API server.
CSI_DRIVER=hostpath.csi.agentplane.dev
CSI_CLASS=agentplane-snapshot
CSI_SNAPSHOT_CLASS=agentplane-snapshot
CSI_SOCK="$KUBELET_ROOT/plugins/$CSI_DRIVER/csi.sock"
CSI_REG_SOCK="$KUBELET_ROOT/plugins_registry/$CSI_DRIVER-reg.sock"
CSI_DATA_DIR="$STATE_DIR/csi-hostpath"
# The VolumeSnapshot CRDs, copied next to the binaries by build.sh.
SNAPSHOT_CRD_DIR="${BIN_DIR%/bin}/snapshot-crds"
# Host sysctls that kubelet (kernel tunables), kube-proxy (route_localnet) and the
# CNI bridge (ip_forward) change: saved by up, restored by down.
HOST_SYSCTLS=(net.ipv4.ip_forward net.ipv4.conf.all.route_localnet net.bridge.bridge-nf-call-iptables
	net.bridge.bridge-nf-call-ip6tables vm.overcommit_memory kernel.panic kernel.panic_on_oops
	kernel.keys.root_maxkeys kernel.keys.root_maxbytes)
DEB_PACKAGES=(containerd runc containernetworking-plugins iptables ipset conntrack iproute2 openssl curl gcc libc6-dev)
# What kube-router's NetworkPolicy controller creates: filter chains (top-level,
# per pod, per policy) and ipsets (policy sources/destinations).
KR_CHAINS='KUBE-ROUTER-[A-Z]+|KUBE-POD-FW-[A-Z0-9]+|KUBE-NWPLCY-[A-Z0-9]+'
KR_SETS='^(inet6:)?(KUBE-SRC-|KUBE-DST-|kube-router-)'

KUBECTL="$BIN_DIR/kubectl"
kc() { "$KUBECTL" --kubeconfig "$KUBECONFIG_PATH" "$@"; }

# --- helpers -------------------------------------------------------------------
now_ms() { date +%s%3N; }

ensure_packages() {
	local missing=() p
	for p in "${DEB_PACKAGES[@]}"; do
		dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[[ ${#missing[@]} -eq 0 ]] && return 0
	log "installing Debian packages: ${missing[*]}"
	[[ $EUID -eq 0 ]] || die "need root to install ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y --no-install-recommends "${missing[@]}" >"${TMPDIR:-/tmp}/agentplane-apt.log" 2>&1 ||
		{ apt-get update >>"${TMPDIR:-/tmp}/agentplane-apt.log" 2>&1 &&
			apt-get install -y --no-install-recommends "${missing[@]}" >>"${TMPDIR:-/tmp}/agentplane-apt.log" 2>&1; } ||
		{ tail -20 "${TMPDIR:-/tmp}/agentplane-apt.log" >&2; die "apt-get install ${missing[*]} failed"; }
	# Debian's containerd package may start the system instance on hosts with an
	# init system; it is not ours and is left alone (we use our own socket).
}

pidfile() { printf '%s/%s.pid' "$PID_DIR" "$1"; }

# pid_alive NAME: the recorded pid is alive and still runs the binary we started.
pid_alive() {
	local f pid exe want
	f=$(pidfile "$1")
	[[ -f "$f" ]] || return 1
	read -r pid want <"$f" || return 1
	[[ -n "$pid" && -d "/proc/$pid" ]] || return 1
	exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
	[[ "$exe" == "$want" ]]
}

show_log_tail() {
	local name=$1
	log "---- last 40 lines of $LOG_DIR/$name.log ----"
	tail -n 40 "$LOG_DIR/$name.log" >&2 2>/dev/null || true
	log "---- end of $name.log ----"
}

fail_component() { # fail_component NAME MESSAGE
	show_log_tail "$1"
	die "$1: $2 (full log: $LOG_DIR/$1.log)"
}

# start NAME BINARY ARGS...: run in its own session, log to a file, record pid.
start() {
	local name=$1 bin=$2
	shift 2
	if pid_alive "$name"; then
		log "$name already running (pid $(cut -d' ' -f1 <"$(pidfile "$name")"))"
		return 0
	fi
	[[ -x "$bin" ]] || die "$name: binary $bin missing"
	local exe
	exe=$(readlink -f "$bin")
	setsid "$exe" "$@" >>"$LOG_DIR/$name.log" 2>&1 </dev/null &
	local pid=$!
	printf '%s %s\n' "$pid" "$exe" >"$(pidfile "$name")"
	log "started $name (pid $pid, log $LOG_DIR/$name.log)"
}

# wait_for NAME TIMEOUT_S DESCRIPTION CMD...: poll CMD until it succeeds; fail
# with the component's log tail when it dies or the timeout passes.
wait_for() {
	local name=$1 timeout=$2 what=$3
	shift 3
	local deadline=$((SECONDS + timeout))
	while ! "$@" >/dev/null 2>&1; do
		# Right after start the pid may still be the forking shell or setsid
		# (its exe is not yet the binary): look again before calling it dead.
		pid_alive "$name" || { sleep 1; pid_alive "$name"; } || fail_component "$name" "exited while waiting for $what"
		[[ $SECONDS -lt $deadline ]] || fail_component "$name" "timed out after ${timeout}s waiting for $what"
		sleep 0.5
	done
}

# stop NAME: TERM, wait, KILL; only the pid we recorded, only if it still runs our binary.
stop() {
	local name=$1 f pid
	f=$(pidfile "$name")
	[[ -f "$f" ]] || return 0
	if pid_alive "$name"; then
		read -r pid _ <"$f"
		kill -TERM "$pid" 2>/dev/null || true
		local i
		for i in $(seq 1 100); do
			[[ -d "/proc/$pid" ]] || break
			# a zombie child of ours counts as gone
			[[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" == Z ]] && break
			sleep 0.1
			if [[ $i -eq 60 ]]; then kill -KILL "$pid" 2>/dev/null || true; fi
		done
		log "stopped $name (pid $pid)"
	fi
	rm -f "$f"
}

curl_api() { # curl_api PATH: GET against the apiserver as admin
	curl -sf --max-time 5 --cacert "$PKI_DIR/ca.crt" --cert "$PKI_DIR/admin.crt" --key "$PKI_DIR/admin.key" "$API_URL$1"
}

# --- PKI -------------------------------------------------------------------------
# gen_cert NAME CN ORG KIND(server|client|both) [SAN...]
gen_cert() {
	local name=$1 cn=$2 org=$3 kind=$4
	shift 4
	[[ -f "$PKI_DIR/$name.crt" ]] && return 0
	local subj="/CN=$cn" eku san="" s
	[[ -n "$org" ]] && subj="/O=$org$subj"
	case $kind in
	server) eku=serverAuth ;;
	client) eku=clientAuth ;;
	both) eku=serverAuth,clientAuth ;;
	esac
	for s in "$@"; do san+="${san:+,}$s"; done
	{
		echo "basicConstraints=critical,CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=$eku"
		[[ -n "$san" ]] && echo "subjectAltName=$san"
	} >"$PKI_DIR/$name.ext"
	openssl ecparam -name prime256v1 -genkey -noout -out "$PKI_DIR/$name.key" 2>/dev/null
	openssl req -new -key "$PKI_DIR/$name.key" -subj "$subj" -out "$PKI_DIR/$name.csr" 2>/dev/null
	openssl x509 -req -in "$PKI_DIR/$name.csr" -CA "$PKI_DIR/ca.crt" -CAkey "$PKI_DIR/ca.key" \
		-CAcreateserial -days 825 -sha256 -extfile "$PKI_DIR/$name.ext" -out "$PKI_DIR/$name.crt" 2>/dev/null
	rm -f "$PKI_DIR/$name.csr" "$PKI_DIR/$name.ext"
	chmod 600 "$PKI_DIR/$name.key"
}

gen_pki() {
	mkdir -p "$PKI_DIR"
	chmod 700 "$PKI_DIR"
	if [[ ! -f "$PKI_DIR/ca.crt" ]]; then
		openssl ecparam -name prime256v1 -genkey -noout -out "$PKI_DIR/ca.key" 2>/dev/null
		openssl req -x509 -new -key "$PKI_DIR/ca.key" -sha256 -days 3650 -subj "/CN=agentplane-cluster-ca" \
			-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
			-out "$PKI_DIR/ca.crt" 2>/dev/null
	fi
	gen_cert apiserver kube-apiserver "" server \
		IP:127.0.0.1 "IP:$HOST_IP" "IP:$API_SERVICE_IP" DNS:localhost DNS:kubernetes DNS:kubernetes.default \
		DNS:kubernetes.default.svc DNS:kubernetes.default.svc.cluster.local
	gen_cert admin agentplane-admin system:masters client
	gen_cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters client
	gen_cert controller-manager system:kube-controller-manager "" client
	gen_cert scheduler system:kube-scheduler "" client
	gen_cert kube-proxy system:kube-proxy "" client
	gen_cert kubelet-client "system:node:$NODE_NAME" system:nodes client
	gen_cert kubelet-serving "system:node:$NODE_NAME" system:nodes server \
		IP:127.0.0.1 "IP:$HOST_IP" "DNS:$NODE_NAME" DNS:localhost
	if [[ ! -f "$PKI_DIR/sa.key" ]]; then
		openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$PKI_DIR/sa.key" 2>/dev/null
		openssl pkey -in "$PKI_DIR/sa.key" -pubout -out "$PKI_DIR/sa.pub" 2>/dev/null
		chmod 600 "$PKI_DIR/sa.key"
	fi
}

# write_kubeconfig FILE CERTNAME: client-cert kubeconfig (certs embedded).
write_kubeconfig() {
	local file=$1 cert=$2
	cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: agentplane
  cluster:
    server: $API_URL
    certificate-authority-data: $(base64 -w0 <"$PKI_DIR/ca.crt")
users:
- name: $cert
  user:
    client-certificate-data: $(base64 -w0 <"$PKI_DIR/$cert.crt")
    client-key-data: $(base64 -w0 <"$PKI_DIR/$cert.key")
contexts:
- name: agentplane
  context:
    cluster: agentplane
    user: $cert
current-context: agentplane
EOF
	chmod 600 "$file"
}

# --- host sysctls ---------------------------------------------------------------------
save_sysctls() {
	local f="$STATE_DIR/host-sysctls" k v
	[[ -f "$f" ]] && return 0
	for k in "${HOST_SYSCTLS[@]}"; do
		v=$(sysctl -n "$k" 2>/dev/null) || continue
		printf '%s=%s\n' "$k" "$v"
	done >"$f.tmp"
	mv "$f.tmp" "$f"
}

restore_sysctls() {
	local f="$STATE_DIR/host-sysctls" kv
	[[ -f "$f" ]] || return 0
	while IFS= read -r kv; do
		[[ -n "$kv" ]] && { sysctl -qw "$kv" 2>/dev/null || log "warning: cannot restore sysctl $kv"; }
	done <"$f"
}

# --- host network ------------------------------------------------------------------
setup_network() {
	if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
		ip link add "$BRIDGE" type bridge
	fi
	ip addr show dev "$BRIDGE" | grep -q "inet $HOST_IP/" || ip addr add "$HOST_IP/${POD_CIDR#*/}" dev "$BRIDGE"
	ip link set "$BRIDGE" up
	sysctl -qw net.ipv4.ip_forward=1
	# Bridged pod-to-pod traffic must traverse iptables for Service DNAT replies.
	if [[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]]; then
		sysctl -qw net.bridge.bridge-nf-call-iptables=1
	else
		log "warning: br_netfilter not loaded; Service traffic relies on kube-proxy masqueradeAll"
	fi
	# Pods may talk to each other and to this host, never beyond it. In the
	# mangle table, so that no ACCEPT of kube-proxy's filter rules comes first.
	iptables -w -t mangle -N "$FWD_CHAIN" 2>/dev/null || true
	iptables -w -t mangle -F "$FWD_CHAIN"
	iptables -w -t mangle -A "$FWD_CHAIN" -s "$POD_CIDR" -o "$BRIDGE" -j RETURN
	iptables -w -t mangle -A "$FWD_CHAIN" -s "$POD_CIDR" -j DROP
	iptables -w -t mangle -C FORWARD -j "$FWD_CHAIN" 2>/dev/null || iptables -w -t mangle -I FORWARD 1 -j "$FWD_CHAIN"
	# The API server listens on 0.0.0.0 (loopback for us, the bridge address for
	# pods): refuse it on every other interface.
	iptables -w -N "$IN_CHAIN" 2>/dev/null || true
	iptables -w -F "$IN_CHAIN"
	iptables -w -A "$IN_CHAIN" -i lo -j RETURN
	iptables -w -A "$IN_CHAIN" -i "$BRIDGE" -j RETURN
	iptables -w -A "$IN_CHAIN" -p tcp --dport "$API_PORT" -j DROP
	iptables -w -C INPUT -j "$IN_CHAIN" 2>/dev/null || iptables -w -I INPUT 1 -j "$IN_CHAIN"
}

teardown_network() {
	local ch table parent chain
	for ch in "mangle:FORWARD:$FWD_CHAIN" "filter:INPUT:$IN_CHAIN"; do
		IFS=: read -r table parent chain <<<"$ch"
		while iptables -w -t "$table" -C "$parent" -j "$chain" 2>/dev/null; do
			iptables -w -t "$table" -D "$parent" -j "$chain" || break
		done
		iptables -w -t "$table" -F "$chain" 2>/dev/null || true
		iptables -w -t "$table" -X "$chain" 2>/dev/null || true
	done
	# kube-proxy's KUBE-FIREWALL (its --cleanup leaves it), IPv4 and IPv6.
	local t c
	for t in iptables ip6tables; do
		command -v "$t" >/dev/null || continue
		for c in INPUT OUTPUT; do
			while "$t" -w -C "$c" -j KUBE-FIREWALL 2>/dev/null; do "$t" -w -D "$c" -j KUBE-FIREWALL || break; done
		done
		"$t" -w -F KUBE-FIREWALL 2>/dev/null || true
		"$t" -w -X KUBE-FIREWALL 2>/dev/null || true
	done
	# CNI bridge/portmap rules left behind by sandboxes that never got a CNI DEL.
	local rule
	while IFS= read -r rule; do
		[[ -n "$rule" ]] || continue
		# shellcheck disable=SC2086  # rule is an iptables-save argument list
		eval "iptables -w -t nat ${rule/-A /-D }" 2>/dev/null || true
	done < <(iptables-save -t nat 2>/dev/null | grep -F "name: \\\"$CNI_NET\\\"" || true)
	if ip link show "$BRIDGE" >/dev/null 2>&1; then
		ip link del "$BRIDGE" || true
	fi
}

# --- config files ----------------------------------------------------------------------
write_configs() {
	mkdir -p "$STATE_DIR/cni/net.d" "$STATE_DIR/cni/ipam" "$STATE_DIR/containerd" "$STATE_DIR/kubelet" \
		"$STATE_DIR/kube-proxy" "$RUN_DIR/containerd"
	cat >"$STATE_DIR/cni/net.d/10-$CNI_NET.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$CNI_NET",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$STATE_DIR/cni/ipam",
        "ranges": [[{ "subnet": "$POD_CIDR", "gateway": "$HOST_IP" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
	cat >"$STATE_DIR/containerd/config.toml" <<EOF
version = 2
root = "$STATE_DIR/containerd/root"
state = "$RUN_DIR/containerd/state"
plugin_dir = ""
disabled_plugins = ["io.containerd.internal.v1.tracing", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
oom_score = 0

[grpc]
  address = "$CONTAINERD_SOCK"

[ttrpc]
  address = "$RUN_DIR/containerd/containerd.sock.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE_DIR/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  # This machine withholds CAP_SYS_RESOURCE: a negative oom_score_adj (-998 for
  # the pause process) is refused by the kernel, so clamp to containerd's own.
  restrict_oom_score_adj = true
  max_container_log_line_size = 16384

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    discard_unpacked_layers = false

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$RUN_DIR/runc"
        BinaryName = "$(command -v runc)"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE_DIR/cni/net.d"
    max_conf_num = 1

  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = ""
EOF
	# Pods get a resolv.conf that points nowhere off this machine (no cluster DNS).
	printf 'nameserver 127.0.0.1\noptions ndots:1 timeout:1 attempts:1\n' >"$STATE_DIR/kubelet/resolv.conf"
	write_kubeconfig "$STATE_DIR/kubelet/kubeconfig" kubelet-client
	cat >"$STATE_DIR/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $HOST_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $PKI_DIR/kubelet-serving.crt
tlsPrivateKeyFile: $PKI_DIR/kubelet-serving.key
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $PKI_DIR/ca.crt
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
imageServiceEndpoint: unix://$CONTAINERD_SOCK
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
cgroupsPerQOS: true
enforceNodeAllocatable: ["pods"]
failCgroupV1: false
failSwapOn: false
resolvConf: $STATE_DIR/kubelet/resolv.conf
podLogsDir: $STATE_DIR/pod-logs
registerNode: true
rotateCertificates: false
serverTLSBootstrap: false
serializeImagePulls: false
# Imported images cannot be pulled again: never garbage-collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# Node-pressure eviction is off ("0%" disables a signal): this node shares
# its host with the build, whose page cache and target directories are not
# the pods' doing, and evicting the harness's own pods for them failed a CI
# run (memory pressure taint, pods Failed). The bounds that matter here are
# per pod and stay on: a container's memory limit (the kernel's OOM killer),
# its ephemeral-storage limit (the eviction manager's local-storage check,
# which runs with no node threshold), and podPidsLimit below.
evictionHard:
  memory.available: "0%"
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
  imagefs.inodesFree: "0%"
protectKernelDefaults: false
makeIPTablesUtilChains: false
# Every pod's process budget (the chart documents it as a requirement): a
# fork bomb in one sandbox ends at its own pod's limit, not the node's.
podPidsLimit: 1024
# How often the kubelet measures each pod's volumes (du), which is what the
# local-storage eviction reads: 1m by default, with up to as much jitter
# again, so a sandbox past its /tmp bound could run on for two minutes. A
# test node measures every 10 s.
volumeStatsAggPeriod: 10s
nodeStatusReportFrequency: 10s
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
fileCheckFrequency: 20s
maxPods: 110
EOF
	write_kubeconfig "$STATE_DIR/kube-proxy/kubeconfig" kube-proxy
	cat >"$STATE_DIR/kube-proxy/config.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE_NAME
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
clientConnection:
  kubeconfig: $STATE_DIR/kube-proxy/kubeconfig
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  masqueradeAll: true
  syncPeriod: 10s
  minSyncPeriod: 1s
EOF
	write_kubeconfig "$STATE_DIR/controller-manager.kubeconfig" controller-manager
	write_kubeconfig "$STATE_DIR/scheduler.kubeconfig" scheduler
}

# Pod cgroups live under $CGROUP_ROOT in every v1 hierarchy (and in the unified one).
setup_cgroups() {
	local d
	for d in /sys/fs/cgroup/*/; do
		d=${d%/}
		mountpoint -q "$d" || continue
		mkdir -p "$d$CGROUP_ROOT"
		if [[ -f "$d/cpuset.cpus" ]]; then
			[[ -n "$(cat "$d$CGROUP_ROOT/cpuset.cpus")" ]] || cat "$d/cpuset.cpus" >"$d$CGROUP_ROOT/cpuset.cpus"
			[[ -n "$(cat "$d$CGROUP_ROOT/cpuset.mems")" ]] || cat "$d/cpuset.mems" >"$d$CGROUP_ROOT/cpuset.mems"
		fi
	done
}

# Every process inside our pod cgroup tree (containers and pause processes).
cgroup_pids() {
	local d
	for d in /sys/fs/cgroup/*/; do
		d=${d%/}
		[[ -d "$d$CGROUP_ROOT" ]] || continue
		find "$d$CGROUP_ROOT" -name cgroup.procs -exec cat {} + 2>/dev/null
	done | sort -un
}

teardown_cgroups() {
	local d
	for d in /sys/fs/cgroup/*/; do
		d=${d%/}
		[[ -d "$d$CGROUP_ROOT" ]] || continue
		find "$d$CGROUP_ROOT" -depth -type d -exec rmdir {} \; 2>/dev/null || true
		[[ -d "$d$CGROUP_ROOT" ]] && log "warning: could not remove cgroup $d$CGROUP_ROOT"
	done
	return 0
}

# containerd shims started for our containerd (matched by their exact -address argument).
our_shims() {
	local p
	for p in /proc/[0-9]*; do
		[[ -r "$p/cmdline" ]] || continue
		tr '\0' '\n' <"$p/cmdline" 2>/dev/null | grep -qxF -- "$CONTAINERD_SOCK" || continue
		[[ "$(readlink "$p/exe" 2>/dev/null)" == *containerd-shim* ]] || continue
		echo "${p#/proc/}"
	done
}

# Processes still running one of our binaries or inside our state (for `down` checks).
our_leftovers() {
	local p exe
	for p in /proc/[0-9]*; do
		exe=$(readlink "$p/exe" 2>/dev/null) || continue
		case $exe in
		"$BIN_DIR"/*) echo "${p#/proc/} $exe" ;;
		*/containerd)
			tr '\0' '\n' <"$p/cmdline" 2>/dev/null | grep -qxF -- "$STATE_DIR/containerd/config.toml" && echo "${p#/proc/} $exe"
			;;
		esac
	done
	for p in $(our_shims); do echo "$p shim"; done
	for p in $(cgroup_pids); do echo "$p pod-process"; done
}

# Mounts under our dirs (deepest first), plus network namespaces whose pod side
# is plugged into our bridge.
cleanup_mounts() {
	local m
	while IFS= read -r m; do
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "warning: cannot unmount $m"
	done < <(awk -v a="$STATE_DIR" -v b="$RUN_DIR" '$5 == a || index($5, a "/") == 1 || $5 == b || index($5, b "/") == 1 {print $5}' /proc/self/mountinfo | sort -r)
	local ns peer
	for ns in /run/netns/cni-*; do
		[[ -e "$ns" ]] || continue
		# eth0@ifN inside the pod netns: N is the host-side veth; ours if on our bridge.
		peer=$(ip -n "$(basename "$ns")" -o link show type veth 2>/dev/null | sed -n 's/^[0-9]*: [^@]*@if\([0-9]*\):.*/\1/p' | head -1)
		[[ -n "$peer" ]] || continue
		ip -o link show 2>/dev/null | grep -q "^$peer: .* master $BRIDGE " || continue
		umount "$ns" 2>/dev/null || umount -l "$ns" 2>/dev/null || true
		rm -f "$ns"
	done
}

# --- up -------------------------------------------------------------------------------
is_up() {
	local c
	for c in "${COMPONENTS[@]}"; do pid_alive "$c" || return 1; done
	curl_api /readyz >/dev/null 2>&1
}

any_started() {
	local c
	for c in "${COMPONENTS[@]}"; do [[ -f "$(pidfile "$c")" ]] && return 0; done
	return 1
}

# kube-router's policy controller has hooked its chains into filter INPUT,
# FORWARD and OUTPUT (its first sync).
kube_router_synced() {
	local rules c
	rules=$(iptables-save -t filter 2>/dev/null) || return 1
	for c in INPUT FORWARD OUTPUT; do
		grep -q -- "^-A $c .*-j KUBE-ROUTER-$c\$" <<<"$rules" || return 1
	done
}

# kube_router_leftovers: kube-router's chains and ipsets still on the host.
kube_router_leftovers() {
	iptables-save 2>/dev/null | grep -E -- "$KR_CHAINS" || true
	command -v ipset >/dev/null && { ipset list -n 2>/dev/null | grep -E -- "$KR_SETS" || true; }
}

# Remove what kube-router's policy controller put on the host: its chains (by
# name) and ipsets (by prefix). Not with `kube-router --cleanup-config`: in
# v2.1.0 that cleans the policy controller through an uninitialized one (no
# iptables or ipset handlers: it logs success and removes nothing), then
# panics in the service proxy's cleanup, which would first have loaded ip_vs
# and flushed every IPVS service on the host, ours or not (docs/cluster.md).
teardown_kube_router() {
	local rule chain set
	# jumps from the built-in chains first, then flush every chain, then delete them
	while IFS= read -r rule; do
		# shellcheck disable=SC2086  # rule is an iptables-save argument list
		eval "iptables -w -t filter ${rule/-A /-D }" 2>/dev/null || true
	done < <(iptables-save -t filter 2>/dev/null | grep -E -- "^-A (INPUT|FORWARD|OUTPUT) .*-j ($KR_CHAINS)( |\$)" || true)
	local chains sets
	chains=$(iptables-save -t filter 2>/dev/null | sed -n 's/^:\([^ ]*\) .*/\1/p' | grep -xE -- "$KR_CHAINS" || true)
	# shellcheck disable=SC2086  # one chain or set name per word
	# In one transaction: one iptables call per chain rewrites the whole
	# table each time, which after the scale bench (thousands of policies)
	# took longer than the bench. One by one only if the batch is refused.
	if [[ -n "$chains" ]] && ! {
		echo '*filter'
		printf -- '-F %s\n' $chains
		printf -- '-X %s\n' $chains
		echo COMMIT
	} | iptables-restore -w --noflush 2>/dev/null; then
		for chain in $chains; do iptables -w -t filter -F "$chain" 2>/dev/null || true; done
		for chain in $chains; do iptables -w -t filter -X "$chain" 2>/dev/null || true; done
	fi
	if command -v ipset >/dev/null; then
		sets=$(ipset list -n 2>/dev/null | grep -E -- "$KR_SETS" || true)
		if [[ -n "$sets" ]] && ! printf 'destroy %s\n' $sets | ipset restore 2>/dev/null; then
			for set in $sets; do
				ipset destroy "$set" 2>/dev/null || log "warning: cannot destroy ipset $set"
			done
		fi
	fi
	local left
	left=$(kube_router_leftovers)
	[[ -z "$left" ]] || { log "warning: kube-router left behind:"; printf '%s\n' "$left" >&2; }
}

node_ready() {
	[[ "$(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}

# start_apiserver: the API server with this cluster's flags, then wait for
# /readyz (used by up and by restart-apiserver).
start_apiserver() {
	start kube-apiserver "$BIN_DIR/kube-apiserver" \
		--etcd-servers "http://127.0.0.1:$ETCD_PORT" \
		--bind-address 0.0.0.0 --secure-port "$API_PORT" --advertise-address "$HOST_IP" \
		--tls-cert-file "$PKI_DIR/apiserver.crt" --tls-private-key-file "$PKI_DIR/apiserver.key" \
		--client-ca-file "$PKI_DIR/ca.crt" \
		--kubelet-client-certificate "$PKI_DIR/apiserver-kubelet-client.crt" \
		--kubelet-client-key "$PKI_DIR/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority "$PKI_DIR/ca.crt" \
		--kubelet-preferred-address-types InternalIP,Hostname \
		--service-cluster-ip-range "$SERVICE_CIDR" \
		--service-account-issuer https://kubernetes.default.svc.cluster.local \
		--service-account-key-file "$PKI_DIR/sa.pub" \
		--service-account-signing-key-file "$PKI_DIR/sa.key" \
		--api-audiences https://kubernetes.default.svc.cluster.local \
		--authorization-mode Node,RBAC \
		--enable-admission-plugins NamespaceLifecycle,LimitRanger,ServiceAccount,NodeRestriction,PodSecurity,DefaultStorageClass,ResourceQuota,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy \
		--allow-privileged=true \
		--profiling=false \
		--endpoint-reconciler-type lease
	wait_for kube-apiserver 120 "apiserver /readyz" curl_api /readyz
}

# restart-apiserver: SIGKILL the API server and start it again, the other
# components left running (a control-plane fault, for chaos tests).
cmd_restart_apiserver() {
	is_up || die "restart-apiserver: the cluster is not fully up"
	local pid
	read -r pid _ <"$(pidfile kube-apiserver)"
	kill -KILL "$pid" 2>/dev/null || true
	while [[ -d "/proc/$pid" && "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]]; do sleep 0.1; done
	rm -f "$(pidfile kube-apiserver)"
	log "killed kube-apiserver (pid $pid)"
	start_apiserver
}

cmd_up() {
	local t0
	t0=$(now_ms)
	[[ $EUID -eq 0 ]] || die "cluster.sh up needs root (containerd, kubelet, iptables, mounts)"
	if is_up; then
		log "cluster already up; kubeconfig: $KUBECONFIG_PATH"
		echo "$KUBECONFIG_PATH"
		return 0
	fi
	if any_started || [[ -e "$STATE_DIR" || -e "$RUN_DIR" ]]; then
		log "cluster partially up or stale state in $STATE_DIR; cleaning it up first"
		cmd_down
	fi
	ensure_packages
	"$HERE/build.sh" >/dev/null
	local pause_tar sandbox_tar
	pause_tar=$("$HERE/image.sh" pause-tarball)
	sandbox_tar=$("$HERE/image.sh" sandbox-base-tarball)

	mkdir -p "$STATE_DIR" "$LOG_DIR" "$PID_DIR" "$RUN_DIR"
	chmod 700 "$STATE_DIR"
	gen_pki
	save_sysctls
	write_kubeconfig "$KUBECONFIG_PATH" admin
	write_configs
	setup_network
	setup_cgroups

	start etcd "$BIN_DIR/etcd" \
		--name agentplane --data-dir "$STATE_DIR/etcd" \
		--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
		--listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
		--initial-cluster "agentplane=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "" \
		--unsafe-no-fsync --quota-backend-bytes 2147483648 --log-level warn
	wait_for etcd 60 "etcd /health" curl -sf --max-time 2 "http://127.0.0.1:$ETCD_PORT/health"

	start_apiserver

	start kube-controller-manager "$BIN_DIR/kube-controller-manager" \
		--kubeconfig "$STATE_DIR/controller-manager.kubeconfig" \
		--authentication-kubeconfig "$STATE_DIR/controller-manager.kubeconfig" \
		--authorization-kubeconfig "$STATE_DIR/controller-manager.kubeconfig" \
		--bind-address 127.0.0.1 --leader-elect=false \
		--controllers '*' --use-service-account-credentials \
		--service-account-private-key-file "$PKI_DIR/sa.key" --root-ca-file "$PKI_DIR/ca.crt" \
		--cluster-signing-cert-file "$PKI_DIR/ca.crt" --cluster-signing-key-file "$PKI_DIR/ca.key" \
		--service-cluster-ip-range "$SERVICE_CIDR" --allocate-node-cidrs=false --profiling=false \
		--kube-api-qps "$CM_QPS" --kube-api-burst "$((CM_QPS * 3 / 2))"
	start kube-scheduler "$BIN_DIR/kube-scheduler" \
		--kubeconfig "$STATE_DIR/scheduler.kubeconfig" \
		--authentication-kubeconfig "$STATE_DIR/scheduler.kubeconfig" \
		--authorization-kubeconfig "$STATE_DIR/scheduler.kubeconfig" \
		--bind-address 127.0.0.1 --leader-elect=false --profiling=false \
		--kube-api-qps "$SCHEDULER_QPS" --kube-api-burst "$((SCHEDULER_QPS * 2))"

	start containerd "$(command -v containerd)" --config "$STATE_DIR/containerd/config.toml"
	wait_for containerd 60 "containerd socket" ctr --address "$CONTAINERD_SOCK" version
	"$HERE/image.sh" import "$pause_tar" "$sandbox_tar"

	start kubelet "$BIN_DIR/kubelet" \
		--config "$STATE_DIR/kubelet/config.yaml" \
		--kubeconfig "$STATE_DIR/kubelet/kubeconfig" \
		--root-dir "$KUBELET_ROOT" \
		--cert-dir "$PKI_DIR" \
		--hostname-override "$NODE_NAME" --node-ip "$HOST_IP" \
		--v 1
	wait_for kubelet 120 "node $NODE_NAME Ready" node_ready

	start kube-proxy "$BIN_DIR/kube-proxy" --config "$STATE_DIR/kube-proxy/config.yaml"
	wait_for kube-proxy 60 "kube-proxy /healthz" curl -sf --max-time 2 http://127.0.0.1:10256/healthz

	# NetworkPolicy: kube-router's policy controller alone (no routing, no
	# service proxy: the CNI bridge and kube-proxy do those). It reads the node
	# (InternalIP), pods, namespaces and policies; no listening port at all
	# (health and metrics off: its health server would also serve pprof).
	start kube-router "$BIN_DIR/kube-router" \
		--kubeconfig "$KUBECONFIG_PATH" --hostname-override "$NODE_NAME" \
		--run-firewall=true --run-router=false --run-service-proxy=false --run-loadbalancer=false \
		--enable-cni=false --enable-ipv4=true --enable-ipv6=false \
		--service-cluster-ip-range "$SERVICE_CIDR" \
		--health-port 0 --metrics-port 0 --iptables-sync-period 1m
	wait_for kube-router 60 "kube-router's filter chains" kube_router_synced

	# A pod can run: default service account exists, a pod reaches Running.
	wait_for kube-controller-manager 60 "default service account" kc -n default get serviceaccount default
	wait_for kube-controller-manager 60 "kube-root-ca.crt configmap" kc -n default get configmap kube-root-ca.crt
	kc -n default delete pod agentplane-up-probe --ignore-not-found --wait=true >/dev/null 2>&1 || true
	kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: agentplane-up-probe
  namespace: default
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: pause
    image: $PAUSE_IMAGE
    imagePullPolicy: Never
EOF
	if ! kc -n default wait --for=condition=Ready pod/agentplane-up-probe --timeout=120s >/dev/null; then
		kc -n default describe pod agentplane-up-probe >&2 || true
		fail_component kubelet "probe pod did not become Ready"
	fi
	kc -n default delete pod agentplane-up-probe --wait=false >/dev/null
	start_local_path
	start_csi
	local ms=$(($(now_ms) - t0))
	log "cluster up in $((ms / 1000)).$(printf '%03d' $((ms % 1000)))s: kubernetes $K8S_VERSION, node $NODE_NAME ($HOST_IP)"
	log "export KUBECONFIG=$KUBECONFIG_PATH"
	echo "$KUBECONFIG_PATH"
}

# The cluster's default StorageClass, `local-path` (WaitForFirstConsumer,
# reclaim Delete), served by local-path-provisioner on the host. Its helper
# pods (which make and remove each volume's directory) run the sandbox base
# image: /bin/sh, mkdir and rm are all they need.
start_local_path() {
	mkdir -p "$LOCAL_PATH_DIR"
	kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: $LOCAL_PATH_NS
  labels:
    pod-security.kubernetes.io/enforce: privileged
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: local-path-provisioner
  namespace: $LOCAL_PATH_NS
automountServiceAccountToken: false
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: $LOCAL_PATH_CLASS
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: rancher.io/local-path
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: local-path-config
  namespace: $LOCAL_PATH_NS
data:
  config.json: |-
    {"cmdTimeoutSeconds": 60,
     "nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": ["$LOCAL_PATH_DIR"]}]}
  setup: |-
    #!/bin/sh
    set -eu
    mkdir -m 0777 -p "\$VOL_DIR"
  teardown: |-
    #!/bin/sh
    set -eu
    rm -rf "\$VOL_DIR"
  helperPod.yaml: |-
    apiVersion: v1
    kind: Pod
    metadata:
      name: helper-pod
    spec:
      terminationGracePeriodSeconds: 0
      securityContext:
        runAsUser: 0
        runAsGroup: 0
      containers:
      - name: helper-pod
        image: $SANDBOX_BASE_IMAGE
        imagePullPolicy: Never
EOF
	start local-path-provisioner "$BIN_DIR/local-path-provisioner" start \
		--kubeconfig "$KUBECONFIG_PATH" --namespace "$LOCAL_PATH_NS" \
		--service-account-name local-path-provisioner --helper-image "$SANDBOX_BASE_IMAGE"
	sleep 1
	pid_alive local-path-provisioner || fail_component local-path-provisioner "exited at start"
}

# csinode_has_driver: the kubelet registered the CSI driver (the node's CSINode lists it).
csinode_has_driver() {
	kc get csinode "$NODE_NAME" -o jsonpath='{.spec.drivers[*].name}' 2>/dev/null | tr ' ' '\n' | grep -qxF "$CSI_DRIVER"
}

# CSI storage with VolumeSnapshots: the CRDs, the driver (which registers
# itself with the kubelet), the CSIDriver object, the StorageClass
# `agentplane-snapshot` (not the default: local-path stays that), the default
# VolumeSnapshotClass, and the three sidecars as host processes. The sidecars'
# CSI timeout is long: a snapshot or a restore is a copy of a directory tree.
start_csi() {
	local f crds=()
	for f in volumesnapshotclasses volumesnapshotcontents volumesnapshots; do
		[[ -f "$SNAPSHOT_CRD_DIR/snapshot.storage.k8s.io_$f.yaml" ]] ||
			die "VolumeSnapshot CRD $f missing in $SNAPSHOT_CRD_DIR (run tests/cluster/build.sh)"
		crds+=(-f "$SNAPSHOT_CRD_DIR/snapshot.storage.k8s.io_$f.yaml")
	done
	kc apply "${crds[@]}" >/dev/null
	kc wait --for=condition=Established --timeout=60s crd/volumesnapshotclasses.snapshot.storage.k8s.io \
		crd/volumesnapshotcontents.snapshot.storage.k8s.io crd/volumesnapshots.snapshot.storage.k8s.io >/dev/null ||
		die "the VolumeSnapshot CRDs were not established within 60s"
	kc apply -f - >/dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata:
  name: $CSI_DRIVER
spec:
  attachRequired: false
  podInfoOnMount: false
  fsGroupPolicy: File
  volumeLifecycleModes: [Persistent]
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: $CSI_CLASS
provisioner: $CSI_DRIVER
reclaimPolicy: Delete
volumeBindingMode: WaitForFirstConsumer
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata:
  name: $CSI_SNAPSHOT_CLASS
  annotations:
    snapshot.storage.kubernetes.io/is-default-class: "true"
driver: $CSI_DRIVER
deletionPolicy: Delete
EOF
	mkdir -p "$CSI_DATA_DIR"
	chmod 700 "$CSI_DATA_DIR"
	start csi-hostpath "$BIN_DIR/csi-hostpath" \
		--csi-socket "$CSI_SOCK" --registration-socket "$CSI_REG_SOCK" \
		--data-dir "$CSI_DATA_DIR" --node-id "$NODE_NAME"
	wait_for csi-hostpath 30 "CSI socket $CSI_SOCK" test -S "$CSI_SOCK"
	start csi-provisioner "$BIN_DIR/csi-provisioner" \
		--csi-address "$CSI_SOCK" --kubeconfig "$KUBECONFIG_PATH" --leader-election=false \
		--timeout 300s --retry-interval-max 30s
	start csi-snapshotter "$BIN_DIR/csi-snapshotter" \
		--csi-address "$CSI_SOCK" --kubeconfig "$KUBECONFIG_PATH" --leader-election=false \
		--timeout 300s --retry-interval-max 30s --feature-gates CSIVolumeGroupSnapshot=false
	# No group snapshots (their CRDs are not installed): with the gate on, the
	# controller would first wait 30 s for them.
	start snapshot-controller "$BIN_DIR/snapshot-controller" \
		--kubeconfig "$KUBECONFIG_PATH" --leader-election=false --retry-interval-max 30s \
		--feature-gates CSIVolumeGroupSnapshot=false
	wait_for csi-hostpath 60 "the kubelet to register $CSI_DRIVER (CSINode $NODE_NAME)" csinode_has_driver
	local c
	for c in csi-provisioner csi-snapshotter snapshot-controller; do
		pid_alive "$c" || { sleep 1; pid_alive "$c"; } || fail_component "$c" "exited at start"
	done
}

# --- down ------------------------------------------------------------------------------
cmd_down() {
	[[ $EUID -eq 0 ]] || die "cluster.sh down needs root"
	local t0
	t0=$(now_ms)
	# 0. The fake nodes' controller (kwok.sh), if it runs: the pods it
	#    played go with the API server's state below.
	stop kwok
	# Volumes are made and removed by helper pods: nothing to make any more.
	stop local-path-provisioner
	# No more CSI volumes or snapshots either (the driver itself stays until
	# the kubelet has unmounted the pods' volumes through it).
	stop csi-provisioner
	stop csi-snapshotter
	stop snapshot-controller
	# 1. No more scheduling or re-creation; then let the kubelet tear pods down
	#    properly (CRI StopPodSandbox -> CNI DEL, unmounts).
	stop kube-controller-manager
	stop kube-scheduler
	if pid_alive kubelet && pid_alive kube-apiserver && curl_api /readyz >/dev/null 2>&1; then
		# Only the real node's pods have containers to tear down; pods bound
		# to fake nodes (tests/cluster/kwok.sh) or to none go with etcd's data
		# (deleting the scale bench's 11 000 one by one took minutes). No
		# --all: kubectl 1.37 refuses it next to a selector (and deleted
		# nothing, so down waited out both timeouts below, 90 s).
		local here="spec.nodeName=$NODE_NAME"
		kc delete pods --all-namespaces --field-selector "$here" \
			--grace-period=0 --force --wait=false >/dev/null 2>&1 || true
		local deadline=$((SECONDS + 60))
		while [[ $SECONDS -lt $deadline ]]; do
			[[ -z "$(kc get pods -A -o name --field-selector "$here" 2>/dev/null)" ]] && break
			sleep 1
		done
		# The kubelet stops sandboxes of deleted pods asynchronously.
		deadline=$((SECONDS + 30))
		while [[ $SECONDS -lt $deadline ]] && pid_alive containerd; do
			ctr --address "$CONTAINERD_SOCK" -n "$CTR_NAMESPACE" tasks ls 2>/dev/null | grep -q RUNNING || break
			sleep 1
		done
	fi
	stop kube-router
	teardown_kube_router
	stop kube-proxy
	if [[ -x "$BIN_DIR/kube-proxy" ]]; then
		"$BIN_DIR/kube-proxy" --cleanup >>"$LOG_DIR/kube-proxy-cleanup.log" 2>&1 || true
	fi
	stop kubelet
	stop csi-hostpath
	# 2. Whatever still runs in containerd: kill tasks, delete containers.
	if pid_alive containerd; then
		local id
		for id in $(ctr --address "$CONTAINERD_SOCK" -n "$CTR_NAMESPACE" tasks ls -q 2>/dev/null); do
			ctr --address "$CONTAINERD_SOCK" -n "$CTR_NAMESPACE" tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
		done
		sleep 0.5
		for id in $(ctr --address "$CONTAINERD_SOCK" -n "$CTR_NAMESPACE" tasks ls -q 2>/dev/null); do
			ctr --address "$CONTAINERD_SOCK" -n "$CTR_NAMESPACE" tasks delete -f "$id" >/dev/null 2>&1 || true
		done
	fi
	stop containerd
	stop kube-apiserver
	stop etcd
	# 3. Stragglers we caused: pod processes (by our cgroup tree), then shims.
	local p
	for p in $(cgroup_pids); do kill -KILL "$p" 2>/dev/null || true; done
	for p in $(our_shims); do kill -KILL "$p" 2>/dev/null || true; done
	local i
	for i in $(seq 1 50); do
		[[ -z "$(cgroup_pids)$(our_shims)" ]] && break
		sleep 0.1
	done
	# 4. Mounts, network, cgroups, state.
	cleanup_mounts
	teardown_network
	restore_sysctls
	teardown_cgroups
	local l
	for l in /var/log/containers/*.log; do
		[[ -L "$l" && "$(readlink "$l")" == "$STATE_DIR"/* ]] && rm -f "$l"
	done
	# Fixed paths outside our dirs that the components use: remove only our
	# entries, and the directories only when they are then empty.
	local r id
	for r in /var/lib/cni/results/"$CNI_NET"-*-eth0; do
		[[ -e "$r" ]] || continue
		id=${r#/var/lib/cni/results/"$CNI_NET"-}
		id=${id%-eth0}
		rm -f "$r" "/var/lib/cni/results/cni-loopback-$id-lo"
	done
	rm -f /var/lib/kubelet/device-plugins/kubelet.sock
	rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet /var/lib/cni/results /var/lib/cni \
		/run/containerd/s /run/containerd/fifo /run/containerd/runc/k8s.io /run/containerd/runc /run/containerd \
		/run/netns /var/log/containers 2>/dev/null || true
	cleanup_mounts
	rm -rf "$STATE_DIR" "$RUN_DIR"
	local left
	left=$(our_leftovers)
	if [[ -n "$left" ]]; then
		log "warning: processes left behind:"
		printf '%s\n' "$left" >&2
		return 1
	fi
	local ms=$(($(now_ms) - t0))
	log "cluster down in $((ms / 1000)).$(printf '%03d' $((ms % 1000)))s; no process left"
}

# --- status ---------------------------------------------------------------------------
cmd_status() {
	local c up=0 total=0 pid
	for c in "${COMPONENTS[@]}"; do
		total=$((total + 1))
		if pid_alive "$c"; then
			read -r pid _ <"$(pidfile "$c")"
			printf '%-24s running (pid %s)\n' "$c" "$pid"
			up=$((up + 1))
		elif [[ -f "$(pidfile "$c")" ]]; then
			printf '%-24s DEAD (see %s)\n' "$c" "$LOG_DIR/$c.log"
		else
			printf '%-24s stopped\n' "$c"
		fi
	done
	if curl_api /readyz >/dev/null 2>&1; then
		printf '%-24s ok (%s)\n' "apiserver /readyz" "$API_URL"
		printf '%-24s %s\n' "node $NODE_NAME" "$(node_ready && echo Ready || echo NotReady)"
	fi
	printf 'kubernetes %s, etcd %s, helm %s, kube-router %s, external-provisioner %s, external-snapshotter %s; kubeconfig %s\n' \
		"$K8S_VERSION" "$ETCD_VERSION" "$HELM_VERSION" "$KUBE_ROUTER_VERSION" \
		"$(modver csi github.com/kubernetes-csi/external-provisioner/v6)" "$(modver csi github.com/kubernetes-csi/external-snapshotter/v8)" \
		"$KUBECONFIG_PATH"
	if [[ $up -eq $total ]] && node_ready; then return 0; fi
	[[ $up -eq 0 ]] && return 3
	return 1
}

cmd_image() {
	[[ $# -ge 2 ]] || die "usage: cluster.sh image NAME SRC [CMD...]   (SRC: static binary, rootfs dir or OCI .tar)"
	if [[ -f "$2" && "$2" == *.tar ]]; then
		"$HERE/image.sh" import "$2"
	else
		"$HERE/image.sh" load "$@"
	fi
}

main() {
	local sub=${1:-help}
	[[ $# -gt 0 ]] && shift
	case "$sub" in
	up) cmd_up ;;
	down) cmd_down ;;
	status) cmd_status ;;
	kubeconfig) echo "$KUBECONFIG_PATH" ;;
	build) "$HERE/build.sh" "$@" ;;
	image) cmd_image "$@" ;;
	restart-apiserver) cmd_restart_apiserver ;;
	kubectl) kc "$@" ;;
	helm) KUBECONFIG="$KUBECONFIG_PATH" "$BIN_DIR/helm" "$@" ;;
	env) printf 'export KUBECONFIG=%q\nexport PATH=%q:"$%s"\n' "$KUBECONFIG_PATH" "$BIN_DIR" PATH ;;
	help | -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' ;;
	*) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
	esac
}

# Sourcing this file (for debugging) defines the functions without running main.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then main "$@"; fi
