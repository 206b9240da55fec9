#!/usr/bin/env bash
# Instructions per uncontended cycle (acquire + release), counted by callgrind, for each system
# against its floor, each a process of its own (the cycle bench's children): redis-rs alone,
# `run_locked` and `#[redis_lock]` on one Redis (the client's and redis-server's instructions),
# redis-rs's cluster connection, `run_locked` and `#[redis_lock]` on a 3-master Cluster, the same
# commands to 3 masters at once, `run_locked` and `#[redis_lock]` on a 3-master Redlock (the
# client's). Unlike time, an instruction count does not
# move with the machine's load, so a difference of a few percent is a result in one run.
#
#   scripts/cycle-instructions.sh              W1 (one task) and W2 (64 tasks, a key each)
#   scripts/cycle-instructions.sh W2 W2c W2r   W2 on one Redis, a Cluster, a Redlock
#
# A count is per cycle: the difference between two runs of a child (CYCLE_COUNT cycles per task,
# fewer and more) over the difference of their cycles, so start-up and shut-down cancel out.
# On one Redis, Redis runs under callgrind too, its own server per run (`hz 1`: its timer's work
# would otherwise grow with the slower run's length). About 3 minutes a workload.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/ensure-redis-server.sh
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }

workloads=("$@")
[ ${#workloads[@]} -gt 0 ] || workloads=(W1 W2)
# CYCLE_BIN=path counts with a cycle-bench binary built before (one kept from another commit).
if [ -n "${CYCLE_BIN:-}" ]; then
  bin=$CYCLE_BIN
else
  cargo bench -p lockmacro-bench --bench cycle --no-run 2>/dev/null
  bin=$(ls -t target/release/deps/cycle-* | grep -v '\.d$' | head -1)
fi
work=$(mktemp -d)

free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 20000))
    (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null || { echo $port; return; }
  done
}

# The total of a callgrind output file.
total() { awk '/^(summary|totals):/ { print $2; exit }' "$1"; }

started=()
stop_started() {
  for port in "${started[@]}"; do redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; done
  started=()
}
trap 'stop_started; rm -rf "$work"' EXIT

# Starts a redis-server for the run (with `$@` added); prints its port.
start_server() {
  local port
  port=$(free_port)
  "${REDIS_SERVER_BIN:-redis-server}" --port "$port" --save '' --appendonly no --daemonize yes \
    --dir "$work" --dbfilename "dump-$port.rdb" "$@" >/dev/null
  until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
  echo "$port"
}

# Sets `url` to the URLs of a 3-master Redlock, or of a 3-master Cluster's seeds, started for
# the run.
masters() {
  local cluster=$1 ports=() port urls=()
  for _ in 1 2 3; do
    if [ "$cluster" = yes ]; then
      port=$(start_server --cluster-enabled yes --cluster-config-file "$work/nodes-$RANDOM.conf")
    else
      port=$(start_server)
    fi
    ports+=("$port")
    urls+=("redis://127.0.0.1:$port")
  done
  if [ "$cluster" = yes ]; then
    redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-yes >/dev/null
    until redis-cli -p "${ports[0]}" cluster info | grep -q 'cluster_state:ok'; do sleep 0.2; done
  fi
  started+=("${ports[@]}")
  url=$(IFS=,; echo "${urls[*]}")
}

# The client's instructions for `count` cycles on each of `tasks` tasks of `system` at `url`.
count_client() {
  local system=$1 url=$2 tasks=$3 count=$4
  CYCLE_COUNT=$count valgrind --tool=callgrind --callgrind-out-file="$work/client.out" \
    "$bin" --cycle-child "$system" "$url" "$tasks" >/dev/null 2>&1
  total "$work/client.out"
}

# Runs `system` for `count` cycles on each of `tasks` tasks; prints "client redis" instructions.
count_run() {
  local system=$1 tasks=$2 count=$3 port
  port=$(free_port)
  valgrind --tool=callgrind --callgrind-out-file="$work/redis.out" \
    "${REDIS_SERVER_BIN:-redis-server}" --port "$port" --save '' --appendonly no --hz 1 \
    >/dev/null 2>&1 &
  local redis=$!
  until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.2; done
  local client
  client=$(count_client "$system" "redis://127.0.0.1:$port" "$tasks" "$count")
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait $redis || true
  echo "$client $(total "$work/redis.out")"
}

echo "| workload | system | client instructions per cycle | redis-server instructions per cycle |"
echo "|---|---|---:|---:|"
for workload in "${workloads[@]}"; do
  # W1 is one round trip after another: more cycles, or its count varies by a few thousand.
  case $workload in
    W1*) tasks=1; counts=(2000 6000) ;;
    W2*) tasks=64; counts=(100 300) ;;
  esac
  case $workload in
    W1 | W2) systems=(redis-rs lockmacro lockmacro-attr); url= ;;
    W1c | W2c) systems=(redis-rs-cluster lockmacro-cluster lockmacro-cluster-attr); masters yes ;;
    W1r | W2r) systems=(redis-rs-redlock lockmacro-redlock lockmacro-redlock-attr); masters no ;;
    *) echo "unknown workload $workload (W1, W2, W1c, W2c, W1r, W2r)" >&2; exit 2 ;;
  esac
  cycles=$(( (counts[1] - counts[0]) * tasks ))
  figures=()
  for system in "${systems[@]}"; do
    if [ -z "$url" ]; then
      read -r c1 r1 < <(count_run "$system" $tasks "${counts[0]}")
      read -r c2 r2 < <(count_run "$system" $tasks "${counts[1]}")
      redis=$(( (r2 - r1) / cycles ))
    else
      c1=$(count_client "$system" "$url" $tasks "${counts[0]}")
      c2=$(count_client "$system" "$url" $tasks "${counts[1]}")
      redis=
    fi
    client=$(( (c2 - c1) / cycles ))
    figures+=("$client" "$redis")
    echo "| $workload | $system | $client | ${redis:-} |"
  done
  # Each of ours (run_locked, then the attribute) against the floor.
  for ours in 1 2; do
    awk -v w="$workload" -v s="${systems[$ours]}" -v c1="${figures[0]}" \
      -v c2="${figures[$((2 * ours))]}" -v r1="${figures[1]}" -v r2="${figures[$((2 * ours + 1))]}" \
      'BEGIN {
        redis = r1 > 0 ? sprintf("%.2f×", r2 / r1) : ""
        printf "| %s | %s ÷ its floor | %.2f× | %s |\n", w, s, c2 / c1, redis
      }'
  done
  stop_started
done
