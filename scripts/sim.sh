#!/usr/bin/env bash
# The deterministic simulator: in-memory worlds run on one thread in paused time, every source of
# chance drawn from a seed (lockmacro-runtime/tests/sim_determinism.rs, feature `sim`). Each seed
# runs twice; it passes when both runs give one trace and no two callers held the lock at once.
#
#   scripts/sim.sh --seeds N [--from S]   N seeds from S on (S random unless given)
#   scripts/sim.sh --seed S               seed S alone: a failure, replayed
#
# Prints `trace <seed> <hash>` for each seed that passed and `seed <seed> failed: <why>` for
# each that did not; exits non-zero when one failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() {
    sed -n '6,7p' "$0" | sed 's/^# *//' >&2
    exit 2
}
number() {
    [[ "${1:-}" =~ ^[0-9]{1,18}$ ]] || { echo "not a number: '${1:-}'" >&2; usage; }
}

count= from= seed=
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || usage
    case "$1" in
        --seeds) number "$2"; count=$2 ;;
        --from) number "$2"; from=$2 ;;
        --seed) number "$2"; seed=$2 ;;
        *) usage ;;
    esac
    shift 2
done
if [ -n "$seed" ]; then
    [ -z "$count$from" ] || usage
    range=$seed
elif [ -n "$count" ]; then
    from=${from:-$(( (RANDOM << 15) | RANDOM ))}
    range="$from..$((from + count))"
    echo "seeds $range"
else
    usage
fi

output=$(mktemp)
trap 'rm -f "$output"' EXIT
status=0
SIM_SEEDS=$range cargo test -q -p lockmacro-runtime --all-features --test sim_determinism -- \
    --exact a_seed_replays_its_trace_exactly_keeps_exclusion_and_another_seed_differs \
    --nocapture --test-threads=1 >"$output" 2>&1 || status=$?
# `-q` prints a dot per test, which may land before a line.
grep -oE 'trace [0-9]+ [0-9a-f]+|seed [0-9]+ failed: .*' "$output" || true
if [ "$status" -ne 0 ] && ! grep -q 'failed: ' "$output"; then
    # Not a seed's failure (a build error, a panic): show what cargo said.
    tail -n 40 "$output" >&2
fi
exit "$status"
