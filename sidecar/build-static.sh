#!/usr/bin/env bash
# Builds agent-sidecar as a statically linked x86_64 Linux binary (glibc,
# +crt-static), so the init container can copy it into any sandbox image.
# The binary never resolves host names (addresses are parsed numerically),
# so glibc's static-NSS limitation does not apply to it at run time.
#
#   sidecar/build-static.sh            -> target/x86_64-unknown-linux-gnu/release/agent-sidecar
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-gnu
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
  cargo build --release -p sidecar --bin agent-sidecar --target "$target"
bin="target/$target/release/agent-sidecar"
if command -v ldd >/dev/null && ldd "$bin" 2>&1 | grep -q '=>'; then
  echo "error: $bin is dynamically linked:" >&2
  ldd "$bin" >&2
  exit 1
fi
command -v file >/dev/null && file "$bin"
ls -l "$bin"
