#!/usr/bin/env bash
# Runs the fuzz targets in fuzz/ (libFuzzer through cargo-fuzz, on nightly).
#
#   scripts/fuzz.sh [--time SECONDS] [--runs N] [--minimize] [target...]
#
# Each target runs for SECONDS of fuzzing (default 60) or N executions,
# whichever comes first when both are given, one after the other, from its
# committed seeds (fuzz/corpus/<target>) plus a working corpus of what
# earlier runs found (fuzz/corpus-work/<target>, not committed). Every input
# is bounded: -timeout=10 s per input (a hang), -rss_limit_mb=2048 (an
# allocation that runs away), and the whole run under an address-space limit.
# A crash, a hang or an out-of-memory stops that target, leaves the input in
# fuzz/artifacts/<target>/ and makes the script exit non-zero; the other
# targets still run. --minimize merges each working corpus down to the
# inputs that add coverage afterwards.
#
# Needs the nightly toolchain (it fails, not skips, without it). cargo-fuzz
# is used from PATH, else from ~/.cache/agentplane/cargo-fuzz, where it is
# installed from crates.io on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

ALL_TARGETS=(validate validate_mcp_toolset materialize resolve_mcp policies_tools
    admission_review runner_input output_cap duration)
CARGO_FUZZ_VERSION=0.13.2

seconds="" runs="" minimize=0 targets=()
while (($#)); do
    case $1 in
        --time) seconds=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        --minimize) minimize=1; shift ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
[[ -z $seconds && -z $runs ]] && seconds=60
((${#targets[@]})) || targets=("${ALL_TARGETS[@]}")
for t in "${targets[@]}"; do
    [[ " ${ALL_TARGETS[*]} " == *" $t "* ]] || { echo "fuzz.sh: no target $t (have: ${ALL_TARGETS[*]})" >&2; exit 2; }
done

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz.sh: the nightly toolchain is required (libFuzzer's instrumentation is nightly-only):" >&2
    echo "         rustup toolchain install nightly" >&2
    exit 2
fi

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    tools=${AGENTPLANE_FUZZ_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/agentplane/cargo-fuzz}
    if [[ ! -x $tools/bin/cargo-fuzz ]]; then
        echo "==> installing cargo-fuzz $CARGO_FUZZ_VERSION into $tools (crates.io, once)"
        nice -n 10 cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked --root "$tools"
    fi
    export PATH=$tools/bin:$PATH
fi

# The fuzz build has its own target directory, whatever CARGO_TARGET_DIR
# says: its flags (coverage instrumentation) differ from every other build.
target_dir=$ROOT/fuzz/target
echo "==> cargo +nightly fuzz build -O -a -s none (release, debug assertions and overflow checks on)"
nice -n 10 cargo +nightly fuzz build -O -a -s none --target-dir "$target_dir"
bin_dir=$target_dir/x86_64-unknown-linux-gnu/release

dict_of() {
    case $1 in
        admission_review) echo admission ;;
        runner_input) echo runner ;;
        duration) echo duration ;;
        output_cap) echo "" ;;
        *) echo toolset ;;
    esac
}

failed=() rows=()
for t in "${targets[@]}"; do
    work=$ROOT/fuzz/corpus-work/$t
    artifacts=$ROOT/fuzz/artifacts/$t
    log=$ROOT/fuzz/artifacts/logs/$t.log
    mkdir -p "$work" "$artifacts" "$(dirname "$log")"
    args=(-rss_limit_mb=2048 -timeout=10 -print_final_stats=1 -max_len=8192
        -artifact_prefix="$artifacts/" -error_exitcode=77 -timeout_exitcode=78)
    [[ -n $seconds ]] && args+=(-max_total_time="$seconds")
    [[ -n $runs ]] && args+=(-runs="$runs")
    dict=$(dict_of "$t")
    [[ -n $dict ]] && args+=(-dict="$ROOT/fuzz/dict/$dict.dict")
    # A wall-clock bound on the whole run as well: the per-input timeout
    # cannot see a run that is merely slow.
    wall=$(( ${seconds:-86400} + 600 ))
    echo "==> fuzz $t (${seconds:+${seconds}s}${seconds:+${runs:+, }}${runs:+$runs runs})"
    start=$(date +%s)
    set +e
    nice -n 10 timeout --kill-after=30 "$wall" \
        prlimit --as=$((8 << 30)) -- \
        "$bin_dir/$t" "${args[@]}" "$work" "$ROOT/fuzz/corpus/$t" >"$log" 2>&1
    rc=$?
    set -e
    took=$(( $(date +%s) - start ))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
    crash=0 hang=0 oom=0
    grep -q "ERROR: libFuzzer: timeout" "$log" && hang=1
    grep -q "ERROR: libFuzzer: out-of-memory" "$log" && oom=1
    if ((rc != 0 && hang == 0 && oom == 0)); then crash=1; fi
    rows+=("$(printf '%-22s %12s %9s %6s %6s %5s %7s %6s' "$t" "${execs:-?}" "${rate:-?}" "$crash" "$hang" "$oom" "${rss:-?}" "$took")")
    if ((rc != 0)); then
        failed+=("$t")
        echo "    FAILED (exit $rc): last lines of $log:"
        grep -E "panicked|ERROR: libFuzzer|SUMMARY|Test unit written" "$log" | head -20 | sed 's/^/    /'
    fi
    if ((minimize)) && ((rc == 0)); then
        mkdir -p "$work.min"
        "$bin_dir/$t" -merge=1 -rss_limit_mb=2048 -timeout=10 "$work.min" "$work" >>"$log" 2>&1
        rm -rf "$work" && mv "$work.min" "$work"
    fi
done

echo
echo "fuzz summary ($(date -u +%Y-%m-%dT%H:%MZ), ${seconds:+--time $seconds }${runs:+--runs $runs})"
printf '%-22s %12s %9s %6s %6s %5s %7s %6s\n' target executions exec/s crash hang oom rss_mb secs
printf '%s\n' "${rows[@]}"
if ((${#failed[@]})); then
    echo "fuzz.sh: FAILED: ${failed[*]} (inputs in fuzz/artifacts/<target>/; reproduce with" >&2
    echo "         fuzz/target/x86_64-unknown-linux-gnu/release/<target> <input>)" >&2
    exit 1
fi
