#!/usr/bin/env bash
# The safety campaign: workers lock and increment counters on every deployment (one Redis,
# Sentinel, Cluster, Redlock over 3 and 5 masters) while a nemesis kills, freezes, fails over
# and partitions them; a checker then counts overlapping holders, stale fenced writes, lost
# updates, time a key stood free while someone waited, recovery, and locks left behind, and
# fails when a figure the contract promises to be zero is not (src/safety/promises.rs). Callers
# with `wait = 10s` and callers without `wait` (fail-fast) are counted apart: on a failover the
# first must see no error.
#
#   scripts/safety.sh                    the full run (~8 min), for the table in docs/safety.md
#   scripts/safety.sh --quick            about a minute of campaign, for CI
#   scripts/safety.sh --failover-figure  2 processes x 4 tasks with `wait = 10s` through a
#                                        Sentinel master killed (~10 s): no campaign
#
# Extra arguments go to the runner: `--only single|sentinel|cluster|redlock3|redlock5`, `--fault NAME`
# (one fault alone, e.g. `--fault laggingfailover`),
# `--replica-acks N`, `--out FILE` (the report, also printed). Histories are kept under
# target/safety/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

source scripts/ensure-redis-server.sh
echo "==> using $("${REDIS_SERVER_BIN:-redis-server}" --version)"

# The runner starts its workers from its own directory: build both, then run it. They are built
# as the tests build them (the whole workspace, every feature, dev-dependencies' features too):
# after `scripts/test.sh` this builds nothing, where `cargo build --bin safety` resolved other
# features and built every dependency again (about 3.5 min on 2 loaded cores). An integration
# test brings its package's binaries; `testkit_selftest` is the smallest.
cargo test --workspace --all-features --no-run --test testkit_selftest
exec "${CARGO_TARGET_DIR:-target}/debug/safety" "$@"
