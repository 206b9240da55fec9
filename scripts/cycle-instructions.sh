#!/usr/bin/env bash
# Instructions per uncontended cycle (acquire + release), counted by callgrind: the client's and
# redis-server's, for redis-rs alone (the floor) and lockmacro's `run_locked`, each system a
# process of its own (the cycle bench's children). Unlike time, an instruction count does not
# move with the machine's load, so a difference of a few percent is a result in one run.
#
#   scripts/cycle-instructions.sh              W1 (one task) and W2 (64 tasks, a key each)
#   scripts/cycle-instructions.sh W2           one workload
#
# A count is per cycle: the difference between two runs of a child (CYCLE_COUNT cycles per task,
# fewer and more) over the difference of their cycles, so start-up and shut-down cancel out.
# Redis runs under callgrind too, its own server per run (`hz 1`: its timer's work would
# otherwise grow with the slower run's length). About 4 minutes for both workloads.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/ensure-redis-server.sh
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }

workloads=("$@")
[ ${#workloads[@]} -gt 0 ] || workloads=(W1 W2)
cargo bench -p lockmacro-bench --bench cycle --no-run 2>/dev/null
bin=$(ls -t target/release/deps/cycle-* | grep -v '\.d$' | head -1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 20000))
    (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null || { echo $port; return; }
  done
}

# The total of a callgrind output file.
total() { awk '/^(summary|totals):/ { print $2; exit }' "$1"; }

# Runs `system` for `count` cycles on each of `tasks` tasks; prints "client redis" instructions.
count_run() {
  local system=$1 tasks=$2 count=$3 port
  port=$(free_port)
  valgrind --tool=callgrind --callgrind-out-file="$work/redis.out" \
    "${REDIS_SERVER_BIN:-redis-server}" --port "$port" --save '' --appendonly no --hz 1 \
    >/dev/null 2>&1 &
  local redis=$!
  until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.2; done
  CYCLE_COUNT=$count valgrind --tool=callgrind --callgrind-out-file="$work/client.out" \
    "$bin" --cycle-child "$system" "redis://127.0.0.1:$port" "$tasks" >/dev/null 2>&1
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait $redis || true
  echo "$(total "$work/client.out") $(total "$work/redis.out")"
}

echo "| workload | system | client instructions per cycle | redis-server instructions per cycle |"
echo "|---|---|---:|---:|"
declare -A client redis
for workload in "${workloads[@]}"; do
  case $workload in
    W1) tasks=1; counts=(1000 3000) ;;
    W2) tasks=64; counts=(100 300) ;;
    *) echo "unknown workload $workload (W1, W2)" >&2; exit 2 ;;
  esac
  for system in redis-rs lockmacro; do
    read -r c1 r1 < <(count_run $system $tasks "${counts[0]}")
    read -r c2 r2 < <(count_run $system $tasks "${counts[1]}")
    cycles=$(( (counts[1] - counts[0]) * tasks ))
    client[$system]=$(( (c2 - c1) / cycles ))
    redis[$system]=$(( (r2 - r1) / cycles ))
    echo "| $workload | $system | ${client[$system]} | ${redis[$system]} |"
  done
  awk -v w="$workload" -v c1="${client[redis-rs]}" -v c2="${client[lockmacro]}" \
    -v r1="${redis[redis-rs]}" -v r2="${redis[lockmacro]}" \
    'BEGIN { printf "| %s | lockmacro ÷ redis-rs | %.2f× | %.2f× |\n", w, c2 / c1, r2 / r1 }'
done
