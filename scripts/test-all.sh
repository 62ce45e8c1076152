#!/usr/bin/env bash
# Runs every test tier of the project, in the order a failure is cheapest to
# read: formatting, lints, the Rust unit and process-level tests, then the
# tiers that need a real cluster (added as they land).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test (unit, property and runner process tests)"
cargo test --workspace --locked
