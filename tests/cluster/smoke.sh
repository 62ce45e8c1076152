#!/usr/bin/env bash
# Smoke tests for the single-node test cluster (tests/cluster/cluster.sh).
#
#   tests/cluster/smoke.sh          up (if needed), run the tests, down, check
#                                   that nothing is left; last line: "N passed, N failed"
#   tests/cluster/smoke.sh --keep   leave the cluster up afterwards (skips the down test)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/lib.sh
. "$HERE/lib.sh"

KEEP=0
[[ "${1:-}" == "--keep" ]] && KEEP=1

CLUSTER="$HERE/cluster.sh"
NS=agentplane-smoke
SMOKE_IMAGE="localhost/agentplane/smoke:dev"
PASSED=0
FAILED=0
FAILURES=()
FIGURES=()

now_ms() { date +%s%3N; }
secs() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }

pass() {
	PASSED=$((PASSED + 1))
	printf 'ok   - %s\n' "$1"
}
fail() {
	FAILED=$((FAILED + 1))
	FAILURES+=("$1")
	printf 'FAIL - %s\n' "$1"
	[[ -n "${2:-}" ]] && printf '%s\n' "$2" | sed 's/^/       /' | tail -n 25
	# The first failure says what the node thought of itself then: later
	# failures are often its consequence (a tainted node, evicted pods).
	if [[ $FAILED -eq 1 ]]; then
		node_state | sed 's/^/       node: /'
	fi
	return 0
}
node_state() {
	kc get nodes -o jsonpath='{range .items[*]}{.metadata.name} taints={.spec.taints}{"\n"}{range .status.conditions[*]}{.type}={.status} ({.reason}){"\n"}{end}{end}' 2>&1 | head -n 20 || true
	grep -i -E 'evict|pressure' "$LOG_DIR/kubelet.log" 2>/dev/null | tail -n 8 || true
}
finish() {
	[[ ${#FIGURES[@]} -gt 0 ]] && printf 'figure: %s\n' "${FIGURES[@]}"
	[[ ${#FAILURES[@]} -gt 0 ]] && printf 'failed: %s\n' "${FAILURES[@]}"
	echo "$PASSED passed, $FAILED failed"
	[[ $FAILED -eq 0 ]]
}

kc() { "$BIN_DIR/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }

# --- 0. cluster up -----------------------------------------------------------------
t0=$(now_ms)
if "$CLUSTER" status >/dev/null 2>&1; then
	pass "cluster already up"
elif out=$("$CLUSTER" up 2>&1); then
	up_ms=$(($(now_ms) - t0))
	FIGURES+=("cluster.sh up: $(secs "$up_ms")s")
	pass "cluster.sh up ($(secs "$up_ms")s)"
else
	fail "cluster.sh up" "$out"
	finish
	exit 1
fi

# second up is a no-op
t0=$(now_ms)
if out=$("$CLUSTER" up 2>&1) && grep -q "already up" <<<"$out"; then
	pass "second cluster.sh up returns at once ($(secs $(($(now_ms) - t0)))s)"
else
	fail "second cluster.sh up" "$out"
fi

# --- 1. API server ---------------------------------------------------------------------
if out=$(kc get --raw /readyz 2>&1) && [[ "$out" == ok ]]; then
	pass "apiserver /readyz = ok"
else
	fail "apiserver /readyz" "$out"
fi
if out=$(curl -sS --max-time 5 --cacert "$PKI_DIR/ca.crt" "https://127.0.0.1:6443/readyz?verbose" 2>&1) &&
	grep -q "readyz check passed" <<<"$out"; then
	pass "apiserver /readyz?verbose (anonymous, CA-verified TLS)"
else
	fail "apiserver /readyz?verbose" "$out"
fi
if out=$(kc version -o json 2>&1) && grep -q "\"gitVersion\": \"$K8S_VERSION\"" <<<"$out" &&
	[[ $(grep -c "\"gitVersion\": \"$K8S_VERSION\"" <<<"$out") -eq 2 ]]; then
	pass "kubectl and server are both $K8S_VERSION"
else
	fail "kubectl/server version $K8S_VERSION" "$out"
fi
if out=$(kc get nodes -o wide 2>&1) && grep -q " Ready " <<<"$out"; then
	pass "node Ready: $(awk 'NR==2{print $1, $5, $6}' <<<"$out")"
else
	fail "node Ready" "$out"
fi

# --- 2. images -------------------------------------------------------------------------
# A static test binary (Go, stdlib only), cached by source hash.
smoke_key=$(cat "$GOMOD_DIR/smoke/go.mod" "$GOMOD_DIR/smoke/main.go" | sha256sum | cut -c1-16)
smoke_bin="$CACHE_ROOT/smoke-$smoke_key/smoke"
if [[ ! -x "$smoke_bin" ]]; then
	command -v go >/dev/null 2>&1 || export PATH="/usr/local/go/bin:$PATH"
	mkdir -p "$(dirname "$smoke_bin")"
	(cd "$GOMOD_DIR/smoke" && CGO_ENABLED=0 nice -n 19 go build -trimpath -ldflags='-s -w' -o "$smoke_bin.tmp" . && mv "$smoke_bin.tmp" "$smoke_bin")
fi
if out=$("$CLUSTER" image "$SMOKE_IMAGE" "$smoke_bin" /smoke 2>&1) &&
	# cluster.sh up imports the sandbox base; import only if it is missing (a
	# re-import replaces the image record while pods may be resolving it).
	out2=$("$HERE/image.sh" list 2>&1 | grep -x "$SANDBOX_BASE_IMAGE" || "$HERE/image.sh" sandbox-base 2>&1) &&
	imgs=$("$HERE/image.sh" list 2>&1) &&
	grep -qx "$SMOKE_IMAGE" <<<"$imgs" && grep -qx "$SANDBOX_BASE_IMAGE" <<<"$imgs" && grep -qx "$PAUSE_IMAGE" <<<"$imgs"; then
	pass "OCI images built without Docker and imported: $SMOKE_IMAGE $SANDBOX_BASE_IMAGE $PAUSE_IMAGE"
else
	fail "image build/import" "${out:-}${out2:-}${imgs:-}"
fi

# --- 3. Pod Security -------------------------------------------------------------------
kc delete namespace "$NS" --ignore-not-found --wait=true --timeout=90s >/dev/null 2>&1 || true
kc create namespace "$NS" >/dev/null
kc label namespace "$NS" pod-security.kubernetes.io/enforce=restricted pod-security.kubernetes.io/enforce-version=latest >/dev/null
for _ in $(seq 1 60); do kc -n "$NS" get serviceaccount default >/dev/null 2>&1 && break; sleep 0.5; done

if out=$(kc -n "$NS" apply -f - 2>&1 <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: privileged
spec:
  containers:
  - name: c
    image: $SANDBOX_BASE_IMAGE
    imagePullPolicy: Never
    command: ["sleep", "3600"]
    securityContext:
      privileged: true
EOF
); then
	fail "restricted namespace rejects a privileged pod" "pod was admitted: $out"
	kc -n "$NS" delete pod privileged --grace-period=0 --force >/dev/null 2>&1 || true
elif grep -q 'violates PodSecurity "restricted:latest"' <<<"$out" && grep -q 'privileged' <<<"$out"; then
	pass "restricted namespace rejects a privileged pod (PodSecurity)"
else
	fail "restricted namespace rejects a privileged pod" "$out"
fi

# --- 4. pods from local images ---------------------------------------------------------------
restricted_sc='
    securityContext:
      runAsNonRoot: true
      runAsUser: 65534
      runAsGroup: 65534
      allowPrivilegeEscalation: false
      capabilities: {drop: ["ALL"]}
      seccompProfile: {type: RuntimeDefault}'

t0=$(now_ms)
out=$(kc -n "$NS" apply -f - 2>&1 <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: smoke-web}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: $SMOKE_IMAGE
    imagePullPolicy: Never
    args: ["serve", ":8080"]
    ports: [{containerPort: 8080}]$restricted_sc
EOF
) || true
if kc -n "$NS" wait --for=jsonpath='{.status.phase}'=Running pod/web --timeout=120s >/dev/null 2>&1; then
	run_ms=$(($(now_ms) - t0))
	FIGURES+=("pod create-to-Running (static binary image, restricted): $(secs "$run_ms")s")
	pass "pod from locally built image (static binary) Running in restricted namespace ($(secs "$run_ms")s)"
else
	fail "pod web Running" "$out$(kc -n "$NS" describe pod web 2>&1 | tail -20)"
fi

t0=$(now_ms)
out=$(kc -n "$NS" apply -f - 2>&1 <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: sandbox
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: sh
    image: $SANDBOX_BASE_IMAGE
    imagePullPolicy: Never
    command: ["sleep", "infinity"]$restricted_sc
EOF
) || true
if kc -n "$NS" wait --for=jsonpath='{.status.phase}'=Running pod/sandbox --timeout=120s >/dev/null 2>&1; then
	run_ms=$(($(now_ms) - t0))
	FIGURES+=("pod create-to-Running (sandbox base image): $(secs "$run_ms")s")
	pass "pod from sandbox base image Running ($(secs "$run_ms")s)"
else
	fail "pod sandbox Running" "$out$(kc -n "$NS" describe pod sandbox 2>&1 | tail -20)"
fi

# --- 5. exec ---------------------------------------------------------------------------------
if out=$(kc -n "$NS" exec sandbox -- bash -c 'printf "a\nb\nagentplane\n" | grep -c agentplane; id -u; ls / | sort | head -3 | tr "\n" " "' 2>&1) &&
	[[ "$(sed -n 1p <<<"$out")" == 1 && "$(sed -n 2p <<<"$out")" == 65534 ]]; then
	pass "kubectl exec: bash + GNU grep + coreutils as uid 65534 ($(tr '\n' ' ' <<<"$out"))"
else
	fail "kubectl exec" "$out"
fi

# --- 5b. dynamic provisioning: a claim with no class gets local-path --------------------------
t0=$(now_ms)
out=$(kc -n "$NS" apply -f - 2>&1 <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 64Mi}}
---
apiVersion: v1
kind: Pod
metadata:
  name: writer
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
  containers:
  - name: sh
    image: $SANDBOX_BASE_IMAGE
    imagePullPolicy: Never
    command: ["bash", "-c", "echo provisioned > /data/f"]
    volumeMounts: [{name: data, mountPath: /data}]$restricted_sc
EOF
) || true
pv=""
if kc -n "$NS" wait --for=jsonpath='{.status.phase}'=Succeeded pod/writer --timeout=120s >/dev/null 2>&1; then
	pv=$(kc -n "$NS" get pvc data -o jsonpath='{.spec.volumeName}' 2>/dev/null)
	class=$(kc -n "$NS" get pvc data -o jsonpath='{.spec.storageClassName}' 2>/dev/null)
	by=$(kc get pv "$pv" -o jsonpath='{.metadata.annotations.pv\.kubernetes\.io/provisioned-by}' 2>/dev/null)
	dir=$(kc get pv "$pv" -o jsonpath='{.spec.hostPath.path}' 2>/dev/null)
	if [[ "$class" == local-path && "$by" == rancher.io/local-path && "$(cat "$dir/f" 2>/dev/null)" == provisioned ]]; then
		pass "dynamic provisioning: a claim with no class bound a local-path volume, written as uid 65534 ($(secs $(($(now_ms) - t0)))s)"
	else
		fail "dynamic provisioning" "class=$class provisioned-by=$by dir=$dir $(ls -la "$dir" 2>&1)"
	fi
else
	fail "dynamic provisioning: writer pod Succeeded" "$out$(kc -n "$NS" describe pvc data 2>&1 | tail -8)$(kc -n "$NS" describe pod writer 2>&1 | tail -10)$(tail -10 "$LOG_DIR/local-path-provisioner.log" 2>&1)"
fi
kc -n "$NS" delete pod writer --wait=true --timeout=60s >/dev/null 2>&1 || true
kc -n "$NS" delete pvc data --wait=true --timeout=60s >/dev/null 2>&1 || true
if [[ -n "$pv" ]]; then
	gone=0
	for _ in $(seq 1 60); do
		if ! kc get pv "$pv" >/dev/null 2>&1 && [[ ! -e "${dir:-/nonexistent}" ]]; then gone=1; break; fi
		sleep 1
	done
	if [[ $gone -eq 1 ]]; then
		pass "the claim's deletion removed its volume and its directory"
	else
		fail "volume removed with its claim" "$(kc get pv "$pv" 2>&1) $(ls -la "$dir" 2>&1 | head -3)"
	fi
fi
if out=$(printf 'from-stdin\n' | kc -n "$NS" exec -i sandbox -- cat 2>&1) && [[ "$out" == from-stdin ]]; then
	pass "kubectl exec -i (stdin streaming)"
else
	fail "kubectl exec -i" "$out"
fi

# --- 5c. CSI VolumeSnapshots: snapshot a claim, fork a claim from it ----------------------------
# The class agentplane-snapshot (the project's hostpath driver behind the real
# external-provisioner, csi-snapshotter and snapshot-controller). Pods run as
# uid 1000 with an fsGroup, like sandboxes.
CSI_DATA_DIR="$STATE_DIR/csi-hostpath"
csi_pod() { # csi_pod NAME CLAIM SCRIPT
	cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  securityContext:
    fsGroup: 1000
    seccompProfile: {type: RuntimeDefault}
  volumes: [{name: data, persistentVolumeClaim: {claimName: $2}}]
  containers:
  - name: sh
    image: $SANDBOX_BASE_IMAGE
    imagePullPolicy: Never
    command: ["bash", "-c", "$3"]
    volumeMounts: [{name: data, mountPath: /data}]
    securityContext:
      runAsNonRoot: true
      runAsUser: 1000
      runAsGroup: 1000
      allowPrivilegeEscalation: false
      capabilities: {drop: ["ALL"]}
EOF
}
csi_diag() {
	kc -n "$NS" get pvc,volumesnapshot,pod 2>&1 | tail -8
	kc get volumesnapshotcontent 2>&1 | tail -3
	local c
	for c in csi-hostpath csi-provisioner csi-snapshotter snapshot-controller; do
		tail -n 4 "$LOG_DIR/$c.log" 2>&1 | sed "s/^/$c: /" | cut -c1-300
	done
}
t0=$(now_ms)
out=$({
	printf 'apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: snap-src\nspec:\n  storageClassName: agentplane-snapshot\n  accessModes: [ReadWriteOnce]\n  resources: {requests: {storage: 64Mi}}\n---\n'
	csi_pod snap-writer snap-src 'echo snapshot-me > /data/f'
} | kc -n "$NS" apply -f - 2>&1) || true
src_h="" dst_h="" snap_h=""
if kc -n "$NS" wait --for=jsonpath='{.status.phase}'=Succeeded pod/snap-writer --timeout=90s >/dev/null 2>&1 &&
	src_h=$(kc get pv "$(kc -n "$NS" get pvc snap-src -o jsonpath='{.spec.volumeName}')" -o jsonpath='{.spec.csi.volumeHandle}' 2>/dev/null) &&
	[[ "$(cat "$CSI_DATA_DIR/volumes/$src_h/f" 2>/dev/null)" == snapshot-me ]]; then
	# no class named: the default VolumeSnapshotClass
	out=$(printf 'apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshot\nmetadata:\n  name: snap\nspec:\n  source: {persistentVolumeClaimName: snap-src}\n' |
		kc -n "$NS" apply -f - 2>&1) || true
	if kc -n "$NS" wait --for=jsonpath='{.status.readyToUse}'=true volumesnapshot/snap --timeout=60s >/dev/null 2>&1; then
		snap_ms=$(($(now_ms) - t0))
		content=$(kc -n "$NS" get volumesnapshot snap -o jsonpath='{.status.boundVolumeSnapshotContentName}' 2>/dev/null)
		snap_h=$(kc get volumesnapshotcontent "$content" -o jsonpath='{.status.snapshotHandle}' 2>/dev/null)
		out=$({
			printf 'apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: snap-fork\nspec:\n  storageClassName: agentplane-snapshot\n  accessModes: [ReadWriteOnce]\n  resources: {requests: {storage: 64Mi}}\n'
			printf '  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: snap}\n---\n'
			csi_pod snap-reader snap-fork 'cat /data/f && stat -c %u /data/f && echo forked > /data/g'
		} | kc -n "$NS" apply -f - 2>&1) || true
		if kc -n "$NS" wait --for=jsonpath='{.status.phase}'=Succeeded pod/snap-reader --timeout=90s >/dev/null 2>&1 &&
			out=$(kc -n "$NS" logs snap-reader 2>&1) && [[ "$(tr '\n' ' ' <<<"$out")" == "snapshot-me 1000 " ]] &&
			dst_h=$(kc get pv "$(kc -n "$NS" get pvc snap-fork -o jsonpath='{.spec.volumeName}')" -o jsonpath='{.spec.csi.volumeHandle}' 2>/dev/null) &&
			[[ -n "$dst_h" && "$dst_h" != "$src_h" && -f "$CSI_DATA_DIR/volumes/$dst_h/g" && ! -e "$CSI_DATA_DIR/volumes/$src_h/g" ]] &&
			[[ -n "$snap_h" && -f "$CSI_DATA_DIR/snapshots/$snap_h/f" && ! -e "$CSI_DATA_DIR/snapshots/$snap_h/g" ]]; then
			FIGURES+=("VolumeSnapshot readyToUse (claim written, snapshotted): $(secs "$snap_ms")s")
			pass "VolumeSnapshot of a claim ready ($(secs "$snap_ms")s); a claim forked from it reads the file as uid 1000, and its write stays out of the source ($(secs $(($(now_ms) - t0)))s)"
		else
			fail "claim from a VolumeSnapshot" "$out src=$src_h snapshot=$snap_h fork=$dst_h $(csi_diag)"
		fi
	else
		fail "VolumeSnapshot readyToUse" "$out $(csi_diag)"
	fi
else
	fail "claim on agentplane-snapshot written by a uid 1000 pod" "$out src=$src_h $(csi_diag)"
fi
kc -n "$NS" delete pod snap-writer snap-reader --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || true
kc -n "$NS" delete volumesnapshot snap --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || true
kc -n "$NS" delete pvc snap-src snap-fork --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || true
gone=0
for _ in $(seq 1 60); do
	if [[ -z "$(kc get volumesnapshotcontent -o name 2>/dev/null)$(kc get pv -o jsonpath='{.items[?(@.spec.csi.driver=="hostpath.csi.agentplane.dev")].metadata.name}' 2>/dev/null)" &&
		-z "$(find "$CSI_DATA_DIR/volumes" "$CSI_DATA_DIR/snapshots" -mindepth 1 -maxdepth 1 2>&1)" ]]; then
		gone=1
		break
	fi
	sleep 1
done
if [[ $gone -eq 1 ]]; then
	pass "claims and snapshot deleted: no PV, VolumeSnapshotContent or directory of the CSI driver left"
else
	fail "CSI volumes and snapshot removed" "$(kc get pv,volumesnapshotcontent 2>&1) $(find "$CSI_DATA_DIR" -maxdepth 2 2>&1 | head -5)"
fi

# --- 6. port-forward ---------------------------------------------------------------------------
pf_log=$(mktemp)
# kubectl itself in the background (not the kc function: that would fork a subshell)
"$BIN_DIR/kubectl" --kubeconfig "$KUBECONFIG_PATH" -n "$NS" port-forward pod/web 0:8080 >"$pf_log" 2>&1 &
pf_pid=$!
port=""
for _ in $(seq 1 50); do
	port=$(sed -n 's/^Forwarding from 127.0.0.1:\([0-9]*\) -> 8080$/\1/p' "$pf_log" | head -1)
	[[ -n "$port" ]] && break
	sleep 0.2
done
if [[ -n "$port" ]] && out=$(curl -sS --max-time 5 "http://127.0.0.1:$port/" 2>&1) && grep -q '^agentplane-smoke-ok web$' <<<"$out"; then
	pass "kubectl port-forward reaches the pod (127.0.0.1:$port -> web:8080)"
else
	fail "kubectl port-forward" "${out:-}$(cat "$pf_log")"
fi
kill "$pf_pid" 2>/dev/null || true
wait "$pf_pid" 2>/dev/null || true
rm -f "$pf_log"

# --- 7. pod network: pod-to-pod, Service (kube-proxy), API server via kubernetes Service --------
web_ip=$(kc -n "$NS" get pod web -o jsonpath='{.status.podIP}' 2>/dev/null || true)
# bash's /dev/tcp: the sandbox base image has no curl.
http_from_sandbox() {
	kc -n "$NS" exec sandbox -- bash -c "exec 3<>/dev/tcp/$1/$2 && printf 'GET / HTTP/1.0\r\nHost: x\r\n\r\n' >&3 && timeout 5 cat <&3" 2>&1
}
if [[ -n "$web_ip" ]] && out=$(http_from_sandbox "$web_ip" 8080) && grep -q '^agentplane-smoke-ok web' <<<"$out"; then
	pass "pod-to-pod: sandbox -> web ($web_ip:8080)"
else
	fail "pod-to-pod" "ip=$web_ip ${out:-}"
fi

kc -n "$NS" apply -f - >/dev/null 2>&1 <<EOF || true
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: smoke-web}
  ports: [{port: 80, targetPort: 8080}]
EOF
svc_ip=$(kc -n "$NS" get service web -o jsonpath='{.spec.clusterIP}' 2>/dev/null || true)
ok=0
for _ in $(seq 1 30); do
	if [[ -n "$svc_ip" ]] && out=$(http_from_sandbox "$svc_ip" 80) && grep -q '^agentplane-smoke-ok web' <<<"$out"; then
		ok=1
		break
	fi
	sleep 1
done
if [[ $ok -eq 1 ]]; then
	pass "Service ClusterIP via kube-proxy: sandbox -> $svc_ip:80 -> web:8080"
else
	fail "Service ClusterIP" "svc=$svc_ip ${out:-}"
fi

out=$(kc -n "$NS" apply -f - 2>&1 <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: api-client
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: $SMOKE_IMAGE
    imagePullPolicy: Never
    args: ["apiserver"]$restricted_sc
EOF
) || true
if kc -n "$NS" wait --for=jsonpath='{.status.phase}'=Succeeded pod/api-client --timeout=90s >/dev/null 2>&1 &&
	out=$(kc -n "$NS" logs api-client 2>&1) && grep -q "\"gitVersion\": \"$K8S_VERSION\"" <<<"$out"; then
	pass "pod reaches the API server via the kubernetes Service with its service-account token (kubectl logs)"
else
	fail "pod -> API server via kubernetes Service" "$out$(kc -n "$NS" logs api-client 2>&1 | tail -5)$(kc -n "$NS" describe pod api-client 2>&1 | tail -10)"
fi

# --- 7b. NetworkPolicy enforced (kube-router, firewall only) ------------------------------------
# A policy that admits no ingress to web: sandbox -> web is refused; deleting it reopens the path.
np_probe() { # np_probe -> "open" or "closed"
	if kc -n "$NS" exec sandbox -- timeout 3 bash -c "exec 3<>/dev/tcp/$web_ip/8080" >/dev/null 2>&1; then echo open; else echo closed; fi
}
np_wait() { # np_wait WANT: probe until WANT, 30 s at most
	local i
	for i in $(seq 1 30); do
		[[ "$(np_probe)" == "$1" ]] && return 0
		sleep 1
	done
	return 1
}
kc -n "$NS" apply -f - >/dev/null 2>&1 <<EOF || true
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: web-deny-ingress
spec:
  podSelector: {matchLabels: {app: smoke-web}}
  policyTypes: [Ingress]
EOF
t0=$(now_ms)
if [[ -n "$web_ip" ]] && np_wait closed; then
	closed_ms=$(($(now_ms) - t0))
	kc -n "$NS" delete networkpolicy web-deny-ingress >/dev/null 2>&1 || true
	if np_wait open; then
		FIGURES+=("NetworkPolicy on the node's rules in: $(secs "$closed_ms")s")
		pass "NetworkPolicy enforced: sandbox -> web refused under a deny-ingress policy ($(secs "$closed_ms")s), open again once deleted"
	else
		fail "NetworkPolicy deleted: sandbox -> web still refused after 30s"
	fi
else
	fail "NetworkPolicy enforced" "ip=$web_ip: sandbox -> web still open 30s after a deny-ingress policy; $(tail -5 "$LOG_DIR/kube-router.log" 2>&1)"
fi
kc -n "$NS" delete networkpolicy web-deny-ingress --ignore-not-found >/dev/null 2>&1 || true

# --- 8. validating admission webhook: API server -> Service (kube-proxy) -> pod, TLS ------
wh=$(mktemp -d)
(
	cd "$wh"
	openssl ecparam -name prime256v1 -genkey -noout -out ca.key
	openssl req -x509 -new -key ca.key -subj /CN=smoke-webhook-ca -days 1 -out ca.crt \
		-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign
	openssl ecparam -name prime256v1 -genkey -noout -out tls.key
	openssl req -new -key tls.key -subj "/CN=webhook.$NS.svc" -out tls.csr
	printf 'subjectAltName=DNS:webhook.%s.svc\nextendedKeyUsage=serverAuth\n' "$NS" >ext
	openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 -extfile ext -out tls.crt
) >/dev/null 2>&1
kc -n "$NS" create secret tls webhook-tls --cert "$wh/tls.crt" --key "$wh/tls.key" >/dev/null 2>&1 || true
kc -n "$NS" apply -f - >/dev/null 2>&1 <<EOF || true
apiVersion: v1
kind: Pod
metadata:
  name: webhook
  labels: {app: smoke-webhook}
spec:
  terminationGracePeriodSeconds: 1
  volumes: [{name: tls, secret: {secretName: webhook-tls}}]
  containers:
  - name: webhook
    image: $SMOKE_IMAGE
    imagePullPolicy: Never
    args: ["webhook", ":8443", "/tls/tls.crt", "/tls/tls.key"]
    volumeMounts: [{name: tls, mountPath: /tls, readOnly: true}]$restricted_sc
---
apiVersion: v1
kind: Service
metadata:
  name: webhook
spec:
  selector: {app: smoke-webhook}
  ports: [{port: 443, targetPort: 8443}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: agentplane-smoke
webhooks:
- name: deny.smoke.agentplane.test
  clientConfig:
    service: {namespace: $NS, name: webhook, path: /validate, port: 443}
    caBundle: $(base64 -w0 <"$wh/ca.crt")
  rules:
  - {apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["configmaps"]}
  namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: $NS}}
  objectSelector: {matchLabels: {agentplane-smoke/webhook: "yes"}}
  failurePolicy: Fail
  sideEffects: None
  admissionReviewVersions: ["v1"]
  timeoutSeconds: 5
EOF
rm -rf "$wh"
kc -n "$NS" wait --for=condition=Ready pod/webhook --timeout=60s >/dev/null 2>&1 || true
denied="" allowed=""
for i in $(seq 1 30); do
	kc -n "$NS" delete configmap wh-deny wh-allow --ignore-not-found >/dev/null 2>&1 || true
	denied=$(printf 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: wh-deny\n  labels: {agentplane-smoke/webhook: "yes", agentplane-smoke/deny: "true"}\n' |
		kc -n "$NS" create -f - 2>&1) && denied="ADMITTED: $denied"
	allowed=$(printf 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: wh-allow\n  labels: {agentplane-smoke/webhook: "yes"}\n' |
		kc -n "$NS" create -f - 2>&1) || allowed="REJECTED: $allowed"
	grep -q 'agentplane-smoke webhook denied wh-deny' <<<"$denied" && [[ "$allowed" != REJECTED* ]] && break
	sleep 1
done
if grep -q 'admission webhook "deny.smoke.agentplane.test" denied the request: agentplane-smoke webhook denied wh-deny' <<<"$denied" &&
	[[ "$allowed" != REJECTED* ]] && kc -n "$NS" logs webhook 2>/dev/null | grep -q 'wh-allow allowed=true'; then
	pass "ValidatingAdmissionWebhook: API server -> Service -> webhook pod (TLS) denies and allows (try $i)"
else
	fail "ValidatingAdmissionWebhook" "denied: $denied; allowed: $allowed; $(kc -n "$NS" logs webhook 2>&1 | tail -5)"
fi
kc delete validatingwebhookconfiguration agentplane-smoke --ignore-not-found >/dev/null 2>&1 || true

# --- 9. helm ---------------------------------------------------------------------------------------
chart=$(mktemp -d)
mkdir -p "$chart/smoke/templates"
printf 'apiVersion: v2\nname: smoke\nversion: 0.1.0\n' >"$chart/smoke/Chart.yaml"
printf 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\ndata:\n  k8s: {{ .Capabilities.KubeVersion.Version | quote }}\n' >"$chart/smoke/templates/cm.yaml"
if out=$("$CLUSTER" helm install smoke "$chart/smoke" -n "$NS" --wait --timeout 60s 2>&1) &&
	out=$(kc -n "$NS" get configmap smoke-cm -o jsonpath='{.data.k8s}' 2>&1) && [[ "$out" == "$K8S_VERSION" ]] &&
	out=$("$CLUSTER" helm uninstall smoke -n "$NS" 2>&1); then
	pass "helm $HELM_VERSION install/uninstall a chart (sees server $K8S_VERSION)"
else
	fail "helm install" "$out"
fi
rm -rf "$chart"

# --- 10. down -------------------------------------------------------------------------------------------
if [[ $KEEP -eq 1 ]]; then
	kc delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
	echo "cluster left up (--keep); KUBECONFIG=$KUBECONFIG_PATH"
else
	pids=""
	for f in "$PID_DIR"/*.pid; do [[ -f "$f" ]] && pids+="$(cut -d' ' -f1 "$f") "; done
	t0=$(now_ms)
	if out=$("$CLUSTER" down 2>&1); then
		down_ms=$(($(now_ms) - t0))
		alive=""
		# a zombie (dead, waiting for PID 1 to reap it) is not a running process
		for p in $pids; do
			st=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null || true)
			[[ -n "$st" && "$st" != Z ]] && alive+="$p($st) "
		done
		mounts=$(awk -v a="$STATE_DIR" -v b="$RUN_DIR" 'index($5, a) == 1 || index($5, b) == 1' /proc/self/mountinfo)
		# kube-router's filter chains and ipsets (cluster.sh's KR_CHAINS, KR_SETS)
		netpol=$( (iptables-save 2>/dev/null | grep -E 'KUBE-ROUTER-|KUBE-POD-FW-|KUBE-NWPLCY-'
			ipset list -n 2>/dev/null | grep -E '^(inet6:)?(KUBE-SRC-|KUBE-DST-|kube-router-)') || true)
		if [[ -z "$alive" && -z "$mounts" && -z "$netpol" && ! -e "$STATE_DIR" && ! -e "$RUN_DIR" ]] && ! ip link show apbr0 >/dev/null 2>&1; then
			pass "cluster.sh down: no process, mount, bridge, state or NetworkPolicy rule left ($(secs "$down_ms")s)"
		else
			fail "cluster.sh down leftovers" "alive pids: $alive; mounts: $mounts; kube-router: $netpol; $(ls -d "$STATE_DIR" "$RUN_DIR" 2>&1)"
		fi
	else
		fail "cluster.sh down" "$out"
	fi
fi

finish
