#!/usr/bin/env bash
# Build (once) the pinned Kubernetes, etcd, helm, kube-router, kwok,
# local-path-provisioner and CSI binaries (external-provisioner, csi-snapshotter,
# snapshot-controller, and the project's own driver hostpath.csi.agentplane.dev,
# go/csi/hostpath) from the Go module proxy into
# ~/.cache/agentplane/k8s-<version>/bin and reuse them afterwards; copy the
# VolumeSnapshot CRDs of external-snapshotter/client/v8 next to them
# (~/.cache/agentplane/k8s-<version>/snapshot-crds).
#
#   tests/cluster/build.sh          build what is missing, print the bin dir
#   tests/cluster/build.sh --force  rebuild everything
#   tests/cluster/build.sh gomod v1.X.Y   regenerate go/k8s/go.mod (+go.sum) for
#                                   another Kubernetes release: the staging modules
#                                   k8s.io/* are pinned by replace to v0.X.Y
#
# Versions live in tests/cluster/go/{k8s,etcd,helm,kube-router,kwok,local-path,csi}/go.mod (+ go.sum).
# Each component is rebuilt when the sha256 of its go.mod/go.sum changes (and,
# for a package of the module itself such as ./hostpath, of its .go files).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/lib.sh
. "$HERE/lib.sh"

# The VolumeSnapshot CRDs go next to the binaries (cluster.sh reads them there).
SNAPSHOT_CRD_DIR="${BIN_DIR%/bin}/snapshot-crds"

force=0
[[ "${1:-}" == "--force" ]] && force=1

need_go() {
	if ! command -v go >/dev/null 2>&1; then
		if [[ -x /usr/local/go/bin/go ]]; then
			export PATH="/usr/local/go/bin:$PATH"
		else
			die "go toolchain not found (need go >= 1.26 on PATH or at /usr/local/go/bin/go)"
		fi
	fi
}

# stamp_of DIR [PKG...] -> sha256 of the module's go.mod (without comments) +
# go.sum, + the .go files of the PKGs that are the module's own (./name)
stamp_of() {
	local dir=$1 p
	shift
	{
		grep -v '^[[:space:]]*//' "$dir/go.mod"
		cat "$dir/go.sum"
		for p in "$@"; do
			[[ "$p" == ./* ]] || continue
			find "$dir/$p" -maxdepth 1 -name '*.go' -type f -print0 | sort -z | xargs -0 -r cat
		done
	} | sha256sum | cut -d' ' -f1
}

# build_component NAME MODDIR "LDFLAGS" OUTPUT... -- PKG...
build_component() {
	local name=$1 moddir=$2 ldflags=$3
	shift 3
	local outs=() pkgs=()
	while [[ $# -gt 0 && "$1" != "--" ]]; do outs+=("$1"); shift; done
	shift
	pkgs=("$@")
	local stamp want have=""
	want=$(stamp_of "$moddir" "${pkgs[@]}")
	stamp="$BIN_DIR/.$name.stamp"
	[[ -f "$stamp" ]] && have=$(cat "$stamp")
	local missing=0 o
	for o in "${outs[@]}"; do [[ -x "$BIN_DIR/$o" ]] || missing=1; done
	if [[ $force -eq 0 && $missing -eq 0 && "$have" == "$want" ]]; then
		log "build: $name cached in $BIN_DIR"
		return 0
	fi
	need_go
	local tmp
	tmp=$(mktemp -d "$BIN_DIR/.build-$name.XXXXXX")
	log "build: $name (${pkgs[*]}) -> $BIN_DIR (nice 19; this takes a while on a cold cache)"
	local t0=$SECONDS
	(
		cd "$moddir"
		local out="$tmp/"
		# one package: name the output explicitly (etcd's main package is ".../server/v3")
		[[ ${#pkgs[@]} -eq 1 ]] && out="$tmp/${outs[0]}"
		GOFLAGS=-mod=mod CGO_ENABLED=0 nice -n 19 go build -trimpath \
			-ldflags "-s -w $ldflags" -o "$out" "${pkgs[@]}"
	) || { rm -rf "$tmp"; die "build of $name failed"; }
	for o in "${outs[@]}"; do
		# go build names the binary after the last path element of the package.
		[[ -x "$tmp/$o" ]] || { rm -rf "$tmp"; die "build of $name produced no $o"; }
		mv -f "$tmp/$o" "$BIN_DIR/$o"
	done
	rm -rf "$tmp"
	echo "$want" >"$stamp"
	log "build: $name done in $((SECONDS - t0))s"
}

# The VolumeSnapshot CRDs (snapshot.storage.k8s.io; not the group snapshots)
# of the external-snapshotter client module that go/csi/go.mod resolves,
# copied from the module cache into SNAPSHOT_CRD_DIR: cluster.sh up applies
# them without the network.
copy_snapshot_crds() {
	local m=github.com/kubernetes-csi/external-snapshotter/client/v8 v dir f
	v=$(modver csi "$m")
	[[ -n "$v" ]] || die "build: $m is not in $GOMOD_DIR/csi/go.mod"
	local stamp="$SNAPSHOT_CRD_DIR/.version"
	if [[ $force -eq 0 && -f "$stamp" && "$(cat "$stamp")" == "$v" ]]; then
		log "build: snapshot CRDs ($m $v) cached in $SNAPSHOT_CRD_DIR"
		return 0
	fi
	need_go
	dir=$(cd "$GOMOD_DIR/csi" && GOFLAGS=-mod=mod go mod download -json "$m@$v" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
	[[ -d "$dir/config/crd" ]] || die "build: no config/crd in $m@$v (module dir '$dir')"
	mkdir -p "$SNAPSHOT_CRD_DIR"
	rm -f "$SNAPSHOT_CRD_DIR"/*.yaml
	for f in volumesnapshotclasses volumesnapshotcontents volumesnapshots; do
		f="$dir/config/crd/snapshot.storage.k8s.io_$f.yaml"
		[[ -f "$f" ]] || die "build: $f missing"
		install -m 0644 "$f" "$SNAPSHOT_CRD_DIR/"
	done
	echo "$v" >"$stamp"
	log "build: snapshot CRDs ($m $v) copied to $SNAPSHOT_CRD_DIR"
}

gen_gomod() {
	local v=$1
	[[ "$v" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "gomod: want a version like v1.37.2, got '$v'"
	local sv="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}" moddir="$GOMOD_DIR/k8s" src
	need_go
	src=$(cd "$moddir" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$v" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
	[[ -f "$src" ]] || die "gomod: cannot download k8s.io/kubernetes@$v"
	local gov godebug m
	gov=$(awk '$1 == "go" {print $2; exit}' "$src")
	godebug=$(awk '$1 == "godebug" {print; exit}' "$src")
	{
		printf '%s\n' \
			'// Pinned Kubernetes control plane + node binaries for the agentplane test' \
			'// cluster (tests/cluster/build.sh). The staging modules k8s.io/* are pinned by' \
			'// replace to the v0.x.y that matches k8s.io/kubernetes v1.x.y.' \
			'// Regenerate after a version bump with: tests/cluster/build.sh gomod VERSION' \
			'module agentplane.test/cluster/k8s' '' "go $gov"
		[[ -n "$godebug" ]] && printf '\n%s\n' "$godebug"
		printf '\ntool (\n'
		for m in kube-apiserver kube-controller-manager kube-proxy kube-scheduler kubectl kubelet; do
			printf '\tk8s.io/kubernetes/cmd/%s\n' "$m"
		done
		printf ')\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$v"
		sed -n 's|^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/.*|\1|p' "$src" | grep -v '^k8s.io/sample-' |
			while IFS= read -r m; do printf '\t%s => %s %s\n' "$m" "$m" "$sv"; done
		printf ')\n'
	} >"$moddir/go.mod"
	rm -f "$moddir/go.sum"
	(cd "$moddir" && GOFLAGS=-mod=mod nice -n 19 go mod tidy) || die "gomod: go mod tidy failed"
	log "gomod: $moddir/go.mod now pins k8s.io/kubernetes $v (staging $sv); run build.sh to build it"
}

main() {
	mkdir -p "$BIN_DIR"
	local t0=$SECONDS
	local v=$K8S_VERSION major minor date k8s_ld=""
	major=${v#v}; major=${major%%.*}
	minor=${v#v*.}; minor=${minor%%.*}
	date=$(date -u -d "@${SOURCE_DATE_EPOCH:-0}" +%Y-%m-%dT%H:%M:%SZ)
	local p
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		k8s_ld+=" -X $p.gitVersion=$v -X $p.gitMajor=$major -X $p.gitMinor=$minor"
		k8s_ld+=" -X $p.gitTreeState=clean -X $p.gitCommit=module-proxy-$v -X $p.buildDate=$date"
	done
	local k8s_cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
	local k8s_pkgs=()
	for p in "${k8s_cmds[@]}"; do k8s_pkgs+=("k8s.io/kubernetes/cmd/$p"); done
	build_component k8s "$GOMOD_DIR/k8s" "$k8s_ld" "${k8s_cmds[@]}" -- "${k8s_pkgs[@]}"
	build_component etcd "$GOMOD_DIR/etcd" "" etcd -- go.etcd.io/etcd/server/v3
	build_component helm "$GOMOD_DIR/helm" "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" helm -- helm.sh/helm/v4/cmd/helm
	# kube-router runs firewall-only: the NetworkPolicy engine (docs/cluster.md).
	p=github.com/cloudnativelabs/kube-router/v2
	build_component kube-router "$GOMOD_DIR/kube-router" "-X $p/pkg/version.Version=$KUBE_ROUTER_VERSION -X $p/pkg/version.BuildDate=$date" \
		kube-router -- "$p/cmd/kube-router"
	# kwok fakes nodes and their pods for the scale benchmark (tests/cluster/kwok.sh).
	p=sigs.k8s.io/kwok
	build_component kwok "$GOMOD_DIR/kwok" "" kwok -- "$p/cmd/kwok"
	# The default StorageClass: claims are provisioned as on a real cluster.
	build_component local-path "$GOMOD_DIR/local-path" "" local-path-provisioner -- github.com/rancher/local-path-provisioner
	# CSI: the real sidecars (the kubelet's CSI plugin talks to the driver
	# directly: it registers itself, there is no node-driver-registrar), and
	# the project's own hostpath driver, built apart as it changes more often.
	p=github.com/kubernetes-csi
	v=$(modver csi "$p/external-provisioner/v6")
	build_component csi-provisioner "$GOMOD_DIR/csi" "-X main.version=$v" csi-provisioner -- \
		"$p/external-provisioner/v6/cmd/csi-provisioner"
	v=$(modver csi "$p/external-snapshotter/v8")
	build_component csi-snapshotter "$GOMOD_DIR/csi" "-X main.version=$v" csi-snapshotter snapshot-controller -- \
		"$p/external-snapshotter/v8/cmd/csi-snapshotter" "$p/external-snapshotter/v8/cmd/snapshot-controller"
	build_component csi-hostpath "$GOMOD_DIR/csi" "" csi-hostpath -- ./hostpath
	copy_snapshot_crds
	log "build: all binaries ready in $BIN_DIR ($((SECONDS - t0))s)"
	echo "$BIN_DIR"
}

if [[ "${1:-}" == gomod ]]; then
	gen_gomod "${2:-}"
	exit 0
fi
main "$@"
