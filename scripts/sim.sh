#!/usr/bin/env bash
# The deterministic simulator: worlds run on one thread in paused time, every source of chance
# drawn from a seed (lockmacro-runtime/tests/sim_determinism.rs, feature `sim`). Each seed runs
# twice; it passes when both runs give one trace and the checker finds nothing (exclusion per
# kind, fencing; once the simulated network's faults healed, no waiter left asleep).
#
#   scripts/sim.sh [--tier T] --seeds N [--from S | --random]   N seeds from S (default 1;
#                                                    --random: a random start, printed)
#   scripts/sim.sh [--tier T] --seed S [--only PARTS]  seed S alone, its trace printed in full
#                                                    (--only: just these calls and incidents)
#   --shrink (with either): cut each failing seed down to the calls that still fail it
#
# --tier memory (the default): tier one, over the in-memory store. --tier redis: tier two, over
# the real Redis store and its Lua scripts on a simulated Redis server.
#
# Prints `trace <seed> <hash>` for each seed that passed and `seed <seed> failed: <why>` for
# each that did not (with --shrink, then `seed <seed> shrunk to <n> parts of <m>: <command>`, the
# command replaying the small case, and why it fails), then `sometimes <name> <count>` for each
# rare state the runs reached, and how many seeds ran a second; exits non-zero when a seed failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() {
    sed -n '6,15p' "$0" | sed 's/^# *//' >&2
    exit 2
}
number() {
    [[ "${1:-}" =~ ^[0-9]{1,18}$ ]] || { echo "not a number: '${1:-}'" >&2; usage; }
}

count= from= seed= random= tier=memory only= shrink=
while [ $# -gt 0 ]; do
    case "$1" in
        --random) random=1; shift; continue ;;
        --shrink) shrink=1; shift; continue ;;
    esac
    [ $# -ge 2 ] || usage
    case "$1" in
        --seeds) number "$2"; count=$2 ;;
        --from) number "$2"; from=$2 ;;
        --seed) number "$2"; seed=$2 ;;
        --tier) tier=$2 ;;
        --only) only=$2 ;;
        *) usage ;;
    esac
    shift 2
done
[ -z "$only" ] || [ -n "$seed" ] || usage
trace=
if [ -n "$seed" ]; then
    [ -z "$count$from$random" ] || usage
    range=$seed
    trace=1
elif [ -n "$count" ]; then
    [ -z "$from" ] || [ -z "$random" ] || usage
    [ -z "$random" ] || from=$(( (RANDOM << 15) | RANDOM ))
    from=${from:-1}
    range="$from..$((from + count))"
    echo "seeds $range"
else
    usage
fi

case "$tier" in
    memory) test=a_seed_replays_its_trace_exactly_keeps_exclusion_and_another_seed_differs ;;
    redis) test=over_the_simulated_redis_a_seed_replays_its_trace_and_keeps_exclusion ;;
    *) echo "not a tier: '$tier' (memory or redis)" >&2; usage ;;
esac

output=$(mktemp)
trap 'rm -f "$output"' EXIT
status=0
SIM_SEEDS=$range SIM_TRACE=$trace SIM_ONLY=$only SIM_SHRINK=$shrink cargo test -q -p lockmacro-runtime --all-features --test sim_determinism -- \
    --exact "$test" \
    --nocapture --test-threads=1 >"$output" 2>&1 || status=$?
# `-q` prints a dot per test, which may land before a line.
if [ -n "$trace" ]; then
    # The seed's trace: the faults, then each call's events stamped in simulated µs.
    grep -E '^faults |^ +[0-9]+ p[0-9]' "$output" || true
fi
grep -oE 'trace [0-9]+ [0-9a-f]+|seed [0-9]+ (failed|shrunk).*|sometimes .*|[0-9]+ seeds of .*' "$output" || true
if [ "$status" -ne 0 ] && ! grep -q 'failed: ' "$output"; then
    # Not a seed's failure (a build error, a panic): show what cargo said.
    tail -n 40 "$output" >&2
fi
exit "$status"
