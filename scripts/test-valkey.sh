#!/usr/bin/env bash
# The test command against Valkey 8 instead of Redis 7: installs `valkey-server` from Debian's
# bookworm-backports when it is missing (scripts/ensure-valkey-server.sh), points the test kit at
# it with REDIS_SERVER_BIN, and runs scripts/test.sh. Extra arguments go to the test runner.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

source scripts/ensure-valkey-server.sh
export REDIS_SERVER_BIN="$VALKEY_SERVER_BIN"
exec bash scripts/test.sh "$@"
