#!/usr/bin/env bash
# What the `metrics` feature costs the uncontended hot path with no recorder installed: W1
# built without and with the feature, run alternately (A B A B ...), each figure the time per
# lock cycle over the raw-Redis floor measured in the same run. Usage: scripts/bench-metrics.sh [runs]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

runs="${1:-4}"
binary() {
    cargo bench -p lockmacro-bench "$@" --no-run --message-format=json 2>/dev/null \
        | grep -o '"executable":"[^"]*lock_bench-[^"]*"' | tail -1 | cut -d'"' -f4
}
plain="$(binary)"
with_metrics="$(binary --features metrics)"
# The feature's build overwrites nothing: each binary has its own hash.
printf '| run | without `metrics` (macro, run_locked, rslock) | with `metrics`, no recorder (same) |\n|---|---|---|\n'
for run in $(seq "$runs"); do
    a="$("$plain" W1 | grep 'time per cycle' | awk -F'|' '{gsub(/ /, "", $5); printf "%s ", $5}')"
    b="$("$with_metrics" W1 | grep 'time per cycle' | awk -F'|' '{gsub(/ /, "", $5); printf "%s ", $5}')"
    echo "| $run | $a| $b|"
done
