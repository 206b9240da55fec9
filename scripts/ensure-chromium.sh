# Sourced by test.sh after ensure-redis-server.sh (whose `as_root` it uses): installs Debian's
# Chromium and its WebDriver, chromedriver, when missing. The locks page's browser test
# (tests/locks_page_browser.rs) drives them; CHROMEDRIVER and CHROMIUM name other binaries.

browser_missing() {
    { [ -z "${CHROMEDRIVER:-}" ] && ! command -v chromedriver >/dev/null; } ||
        { [ -z "${CHROMIUM:-}" ] && ! command -v chromium >/dev/null; }
}

if browser_missing; then
    echo "==> chromium or chromedriver not found; installing them with apt-get" >&2
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver </dev/null
fi
