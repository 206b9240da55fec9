#!/usr/bin/env bash
# The test command: every test of the workspace, each behaviour test against its own redis-server.
#
# Installs redis-server, and Chromium with chromedriver for the locks page's browser test, if
# they are missing (Debian/Ubuntu). The packaged service is not used: tests
# start their own servers on free loopback ports and never touch 6379. Extra arguments go to the
# test runner, e.g. `scripts/test.sh lease_` to run only matching tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

source scripts/ensure-redis-server.sh
source scripts/ensure-chromium.sh
echo "==> using $("${REDIS_SERVER_BIN:-redis-server}" --version)"
echo "==> using $("${CHROMIUM:-chromium}" --version 2>/dev/null)"

status=0
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --all-features --no-fail-fast "$@" || status=$?
    # nextest does not run doctests.
    echo "==> doctests (at $SECONDS s)"
    cargo test --workspace --all-features --doc || status=$?
else
    echo "==> cargo-nextest not installed; falling back to cargo test" >&2
    cargo test --workspace --all-features --no-fail-fast "$@" || status=$?
fi

if [ "$status" -ne 0 ]; then
    echo "==> FAILED (exit status $status)" >&2
fi
exit "$status"
