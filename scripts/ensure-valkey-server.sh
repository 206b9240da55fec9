# Sourced by test-valkey.sh: installs Valkey 8's `valkey-server` from Debian's bookworm-backports
# when it is missing (Debian bookworm has no Valkey; backports has 8.0), and exports
# VALKEY_SERVER_BIN. The packaged service is not used: tests start their own servers.

source "$(dirname "${BASH_SOURCE[0]}")/ensure-redis-server.sh"   # for as_root

if ! command -v valkey-server >/dev/null; then
    echo "==> valkey-server not found; installing it from bookworm-backports with apt-get" >&2
    backports=/etc/apt/sources.list.d/lockmacro-bookworm-backports.sources
    if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        as_root tee "$backports" >/dev/null <<'SOURCES'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
    fi
    as_root apt-get -o DPkg::Lock::Timeout=600 update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        -t bookworm-backports valkey-server </dev/null
fi
VALKEY_SERVER_BIN="$(command -v valkey-server)"
export VALKEY_SERVER_BIN
