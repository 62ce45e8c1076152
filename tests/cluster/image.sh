#!/usr/bin/env bash
# OCI images without Docker: write the OCI image layout by hand (layer
# tar.gz, config JSON, manifest, index.json, sha256 digests), pack it into a
# tarball and import it into the test cluster's containerd (namespace k8s.io).
#
#   image.sh oci NAME OUT.tar SRC [CMD...]   SRC = a directory (rootfs) or a
#                                           static binary (becomes /NAME-base);
#                                           CMD = entrypoint (default: the binary)
#   image.sh import TARBALL...              import into the cluster's containerd
#   image.sh load NAME SRC [CMD...]          oci + import in one go
#   image.sh pause                          build (cached) + import the pause image
#   image.sh sandbox-base                   build (cached) + import the sandbox base
#                                           (bash, coreutils, GNU grep, sed from the host)
#   image.sh list                           images in the cluster's containerd
#
# Image names are fixed (localhost/agentplane/...:dev); pods must use
# imagePullPolicy: Never or IfNotPresent — there is no registry.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/lib.sh
. "$HERE/lib.sh"

IMG_CACHE="$CACHE_ROOT/images"
SNAPSHOTTER="${AGENTPLANE_SNAPSHOTTER:-overlayfs}"

json_str() { # JSON string literal of $1
	local s=$1
	s=${s//\\/\\\\}
	s=${s//\"/\\\"}
	s=${s//$'\t'/\\t}
	s=${s//$'\n'/\\n}
	printf '"%s"' "$s"
}

json_arr() { # JSON array of strings from "$@"
	local out="[" sep="" a
	for a in "$@"; do
		out+="$sep$(json_str "$a")"
		sep=","
	done
	printf '%s]' "$out"
}

sha_of() { sha256sum "$1" | cut -d' ' -f1; }
size_of() { stat -c %s "$1"; }

# add_base_files ROOT: /etc/passwd, /etc/group, /tmp so non-root pods work.
add_base_files() {
	local root=$1
	mkdir -p "$root/etc" "$root/tmp" "$root/proc" "$root/sys" "$root/dev"
	chmod 1777 "$root/tmp"
	[[ -e "$root/etc/passwd" ]] || printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' \
		'nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin' >"$root/etc/passwd"
	[[ -e "$root/etc/group" ]] || printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' >"$root/etc/group"
}

# oci NAME OUT.tar SRC [CMD...]
cmd_oci() {
	[[ $# -ge 3 ]] || die "usage: image.sh oci NAME OUT.tar SRC [CMD...]"
	local name=$1 out=$2 src=$3
	shift 3
	local work
	work=$(mktemp -d "${TMPDIR:-/tmp}/agentplane-oci.XXXXXX")
	local root="$work/rootfs" cmd=("$@")
	mkdir -p "$root"
	if [[ -d "$src" ]]; then
		cp -a "$src/." "$root/"
		[[ ${#cmd[@]} -gt 0 ]] || cmd=(/bin/sh)
	elif [[ -f "$src" ]]; then
		# ldd says "not a dynamic executable" (exit 1) for a static binary and
		# "statically linked" (exit 0) for a static-pie one.
		local linkage
		linkage=$(ldd "$src" 2>&1 || true)
		if ! grep -qE 'not a dynamic executable|statically linked' <<<"$linkage"; then
			die "$src is dynamically linked; image.sh packs static binaries (or a rootfs dir)"
		fi
		local bn
		bn=$(basename "$src")
		install -m 0755 "$src" "$root/$bn"
		[[ ${#cmd[@]} -gt 0 ]] || cmd=("/$bn")
	else
		die "no such file or directory: $src"
	fi
	add_base_files "$root"

	local layout="$work/layout" blobs="$work/layout/blobs/sha256"
	mkdir -p "$blobs"
	# Reproducible layer: sorted, numeric root owner, fixed mtime, no atime/ctime.
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
		--format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
		-C "$root" -cf "$work/layer.tar" .
	local diff_id layer_digest
	diff_id=$(sha_of "$work/layer.tar")
	gzip -n -6 "$work/layer.tar"
	layer_digest=$(sha_of "$work/layer.tar.gz")
	mv "$work/layer.tar.gz" "$blobs/$layer_digest"

	printf '{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Entrypoint":%s,"WorkingDir":"/","Labels":{"org.opencontainers.image.title":%s}},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"tests/cluster/image.sh"}]}' \
		"$(json_arr "${cmd[@]}")" "$(json_str "$name")" "$diff_id" >"$work/config.json"
	local config_digest
	config_digest=$(sha_of "$work/config.json")
	printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%d},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%d}]}' \
		"$config_digest" "$(size_of "$work/config.json")" "$layer_digest" "$(size_of "$blobs/$layer_digest")" >"$work/manifest.json"
	mv "$work/config.json" "$blobs/$config_digest"
	local manifest_digest
	manifest_digest=$(sha_of "$work/manifest.json")
	local manifest_size
	manifest_size=$(size_of "$work/manifest.json")
	mv "$work/manifest.json" "$blobs/$manifest_digest"
	local tag=${name##*:}
	[[ "$tag" != "$name" && "$tag" != */* ]] || tag=latest
	printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%d,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":%s,"org.opencontainers.image.ref.name":%s}}]}' \
		"$manifest_digest" "$manifest_size" "$(json_str "$name")" "$(json_str "$tag")" >"$layout/index.json"
	printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
	mkdir -p "$(dirname "$out")"
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$layout" -cf "$out.tmp" oci-layout index.json blobs
	mv -f "$out.tmp" "$out"
	log "image: $name -> $out (manifest sha256:${manifest_digest:0:12}, layer $(size_of "$blobs/$layer_digest") bytes)"
	rm -rf "$work"
}

ctr_() { ctr --address "$CONTAINERD_SOCK" --namespace "$CTR_NAMESPACE" "$@"; }

cmd_import() {
	[[ -S "$CONTAINERD_SOCK" ]] || die "containerd socket $CONTAINERD_SOCK missing: is the cluster up? (tests/cluster/cluster.sh up)"
	local t
	for t in "$@"; do
		ctr_ images import --snapshotter "$SNAPSHOTTER" "$t" >/dev/null ||
			die "ctr images import $t failed"
		log "image: imported $t into containerd namespace $CTR_NAMESPACE"
	done
}

cmd_load() {
	[[ $# -ge 2 ]] || die "usage: image.sh load NAME SRC [CMD...]"
	local name=$1 tarball
	tarball="$IMG_CACHE/$(printf '%s' "$name" | tr '/:' '__').oci.tar"
	cmd_oci "$name" "$tarball" "${@:2}"
	cmd_import "$tarball"
}

# cached_tarball NAME KEY -> path of the cached tarball for this input key
cached_tarball() {
	printf '%s/%s-%s.oci.tar' "$IMG_CACHE" "$(printf '%s' "$1" | tr '/:' '__')" "${2:0:16}"
}

build_pause() {
	local key out
	key=$(cat "$HERE/pause/pause.c" "$HERE/image.sh" <(gcc --version | head -1) | sha256sum | cut -d' ' -f1)
	out=$(cached_tarball "$PAUSE_IMAGE" "$key")
	if [[ ! -f "$out" ]]; then
		command -v gcc >/dev/null || die "gcc missing (apt-get install gcc libc6-dev)"
		local work
		work=$(mktemp -d "${TMPDIR:-/tmp}/agentplane-pause.XXXXXX")
		gcc -static -Os -s -o "$work/pause" "$HERE/pause/pause.c" || { rm -rf "$work"; die "gcc -static pause.c failed (libc6-dev installed?)"; }
		cmd_oci "$PAUSE_IMAGE" "$out" "$work/pause" /pause
		rm -rf "$work"
	fi
	printf '%s\n' "$out"
}

SANDBOX_PKGS=(bash coreutils grep sed)

build_sandbox_base() {
	local key out
	key=$( {
		dpkg-query -W "${SANDBOX_PKGS[@]}" libc6
		cat "$HERE/image.sh"
	} | sha256sum | cut -d' ' -f1)
	out=$(cached_tarball "$SANDBOX_BASE_IMAGE" "$key")
	if [[ ! -f "$out" ]]; then
		local work root
		work=$(mktemp -d "${TMPDIR:-/tmp}/agentplane-sbx.XXXXXX")
		root="$work/rootfs"
		# Debian 12 is merged-/usr: mirror that layout.
		mkdir -p "$root/usr/bin" "$root/usr/sbin" "$root/usr/lib" "$root/usr/lib64"
		ln -s usr/bin "$root/bin"
		ln -s usr/sbin "$root/sbin"
		ln -s usr/lib "$root/lib"
		ln -s usr/lib64 "$root/lib64"
		local f bins=()
		while IFS= read -r f; do
			[[ -f "$f" && ! -L "$f" && -x "$f" ]] && bins+=("$f")
		done < <(dpkg -L "${SANDBOX_PKGS[@]}" | grep -E '^/(usr/)?s?bin/' | sort -u)
		for f in "${bins[@]}"; do
			local rel=${f#/}
			rel=${rel#usr/}
			cp -L "$f" "$root/usr/$rel"
		done
		ln -sf bash "$root/usr/bin/sh"
		# Shared libraries (and the dynamic loader) that those binaries need.
		local lib
		while IFS= read -r lib; do
			[[ -n "$lib" ]] || continue
			local real rel
			real=$(readlink -f "$lib")
			rel=${lib#/}
			rel=${rel#usr/}
			mkdir -p "$root/usr/$(dirname "$rel")"
			cp -L "$real" "$root/usr/$rel"
		done < <(for f in "${bins[@]}"; do
			ldd "$f" 2>/dev/null | awk '/=> \//{print $3} /^[ \t]*\/[^ ]+ \(/{print $1}'
		done | sort -u)
		mkdir -p "$root/etc" "$root/root" "$root/workspace"
		printf 'agentplane sandbox base (host copy of: %s)\n' "$(dpkg-query -W -f '${Package}=${Version} ' "${SANDBOX_PKGS[@]}")" >"$root/etc/agentplane-release"
		cmd_oci "$SANDBOX_BASE_IMAGE" "$out" "$root" /bin/bash
		rm -rf "$work"
	fi
	printf '%s\n' "$out"
}

cmd_list() { ctr_ images ls -q; }

main() {
	local sub=${1:-}
	[[ $# -gt 0 ]] && shift
	mkdir -p "$IMG_CACHE"
	case "$sub" in
	oci) cmd_oci "$@" ;;
	import) cmd_import "$@" ;;
	load) cmd_load "$@" ;;
	pause) cmd_import "$(build_pause)" ;;
	pause-tarball) build_pause ;;
	sandbox-base) cmd_import "$(build_sandbox_base)" ;;
	sandbox-base-tarball) build_sandbox_base ;;
	list) cmd_list ;;
	*) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; [[ -z "$sub" || "$sub" == help || "$sub" == -h ]] || exit 2 ;;
	esac
}

main "$@"
