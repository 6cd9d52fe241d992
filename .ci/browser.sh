#!/usr/bin/env bash
# The console's end-to-end test in a real browser: headless Chromium (Debian's chromium
# and chromium-driver) driven by selenium (PyPI) against a real `commitpoint serve` with
# an admin token, tenant tokens and the built-in simulator provider. Then the replays of
# issue 30's attacks (tests/attacks/), each against a server of its own: a page on another
# loopback origin and a rebound DNS name in Chromium, and trickling console logins.
#
# Usage: bash .ci/browser.sh   (as root it installs chromium when missing)
# Output: screenshots of every page, 1280x800 and phone-width, in target/browser-screenshots/.
# Environment: BROWSER_VENV (default target/browser-venv).
set -euo pipefail
cd "$(dirname "$0")/.."

selenium_version=4.27.1
venv=$(realpath -m "${BROWSER_VENV:-target/browser-venv}")
shots=$(realpath -m target/browser-screenshots)

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
fi
if ! "$venv/bin/python" -c "import selenium, sys; sys.exit(selenium.__version__ != '$selenium_version')" 2>/dev/null; then
    echo "== installing selenium $selenium_version into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "selenium==$selenium_version"
fi

echo "== building commitpoint"
cargo build --quiet --bin commitpoint

work=$(mktemp -d)
server_pid=""
cleanup() {
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

random() { od -An -tx1 -N16 /dev/urandom | tr -d ' \n'; }
admin_token="admin-$(random)"
acme_token="acme-$(random)"
umask 077
printf '%s\n' "$admin_token" >"$work/admin-token"
printf 'acme %s\nglobex globex-%s\n' "$acme_token" "$(random)" >"$work/tenant-tokens"
printf 'whsec_%s\n' "$(head -c 24 /dev/urandom | base64)" >"$work/sink-secret"
# A sink nobody listens on, tried once: every event becomes a dead letter for the
# dead-letters page to show (port 1 on loopback: closed on any host that runs no tcpmux).
cat >"$work/config.toml" <<CONF
[access]
admin_token_file = "$work/admin-token"
tenant_tokens_file = "$work/tenant-tokens"

[[outbox.sinks]]
name = "nowhere"
url = "http://127.0.0.1:1/events"
secret_file = "$work/sink-secret"
max_attempts = 1
CONF

echo "== starting commitpoint serve"
COMMITPOINT_LOG=warn target/debug/commitpoint serve --config "$work/config.toml" --data-dir "$work/data" \
    --listen 127.0.0.1:0 --provider simulator </dev/null >"$work/stdout" 2>"$work/stderr" &
server_pid=$!
url=""
for _ in $(seq 1 300); do
    url=$(sed -n 's/^commitpoint listening on //p' "$work/stdout" | head -n 1)
    if [ -n "$url" ] || ! kill -0 "$server_pid" 2>/dev/null; then
        break
    fi
    sleep 0.1
done
if [ -z "$url" ]; then
    echo "commitpoint did not report its address; stderr:" >&2
    cat "$work/stderr" >&2
    exit 1
fi
echo "   console at $url/ui"

rm -rf "$shots"
mkdir -p "$shots"
status=0
CONSOLE_URL="$url" ADMIN_TOKEN="$admin_token" ACME_TOKEN="$acme_token" SCREENSHOTS="$shots" \
    CHROME_PROFILE="$work/chromium-profile" "$venv/bin/python" tests/browser/console_test.py || status=$?
if grep -q "panicked" "$work/stderr"; then
    echo "commitpoint panicked during the run:" >&2
    grep -A5 "panicked" "$work/stderr" >&2
    status=1
fi
kill -TERM "$server_pid"
wait "$server_pid" || { echo "commitpoint did not stop cleanly" >&2; status=1; }
server_pid=""
echo "   screenshots: $(find "$shots" -name '*.png' | wc -l) in $shots"

echo "== attack replays (tests/attacks/): cross-site and rebinding in Chromium, trickling logins"
COMMITPOINT_BIN=target/debug/commitpoint "$venv/bin/python" tests/attacks/cross_site.py || status=1
COMMITPOINT_BIN=target/debug/commitpoint python3 tests/attacks/trickle_logins.py || status=1
exit "$status"
