# Sourced by test.sh and demo.sh: installs redis-server from Debian's packages when it is missing.

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        echo "error: need root (or sudo) to run: $*" >&2
        exit 1
    fi
}

if ! command -v redis-server >/dev/null && [ -z "${REDIS_SERVER_BIN:-}" ]; then
    echo "==> redis-server not found; installing it with apt-get" >&2
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server </dev/null
fi
