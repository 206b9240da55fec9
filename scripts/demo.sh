#!/usr/bin/env bash
# Quick start: runs the demo against the Redis at $REDIS_URL (default redis://127.0.0.1:6379),
# or, if nothing answers there, against a throwaway redis-server that is stopped on exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Whether a Redis at URL $1 answers PING within a second or two.
answers_ping() {
    if command -v redis-cli >/dev/null; then
        [ "$(timeout 2 redis-cli -u "$1" ping 2>/dev/null)" = "PONG" ]
    else
        # No redis-cli: speak RESP over bash's /dev/tcp (host and port only, no auth).
        local hostport="${1#*://}"
        hostport="${hostport##*@}"
        hostport="${hostport%%/*}"
        local host="${hostport%:*}" port="${hostport##*:}"
        [ "$host" = "$hostport" ] && port=6379
        timeout 2 bash -c '
            exec 3<>"/dev/tcp/$0/$1" || exit 1
            printf "PING\r\n" >&3
            IFS= read -r line <&3 && [ "${line%$'"'"'\r'"'"'}" = "+PONG" ]
        ' "$host" "$port" 2>/dev/null
    fi
}

free_port() {
    if command -v python3 >/dev/null; then
        python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
    else
        local port
        while :; do
            port=$((20000 + RANDOM % 30000))
            if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
                echo "$port"
                return
            fi
        done
    fi
}

export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
if answers_ping "$REDIS_URL"; then
    echo "==> using the Redis at $REDIS_URL" >&2
else
    # Only now is a redis-server of our own needed: install it if missing.
    source scripts/ensure-redis-server.sh
    port="$(free_port)"
    dir="$(mktemp -d)"
    echo "==> nothing answers at $REDIS_URL; starting a throwaway redis-server on port $port" >&2
    "${REDIS_SERVER_BIN:-redis-server}" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
        --dir "$dir" --loglevel warning </dev/null >"$dir/redis-server.log" 2>&1 &
    redis_pid=$!
    trap 'kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
    trap 'exit 130' INT TERM
    export REDIS_URL="redis://127.0.0.1:$port"
    for _ in $(seq 100); do
        answers_ping "$REDIS_URL" && break
        kill -0 "$redis_pid" 2>/dev/null || { echo "error: redis-server exited:" >&2; cat "$dir/redis-server.log" >&2; exit 1; }
        sleep 0.1
    done
    answers_ping "$REDIS_URL" || { echo "error: redis-server did not answer PING" >&2; exit 1; }
fi

echo "==> building and running examples/demo.rs (the first build takes a minute or two)" >&2
cargo run --example demo
