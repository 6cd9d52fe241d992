#!/usr/bin/env bash
# The worker clients in clients/ against the real binary, and the OpenAPI document against
# client generators. Each client runs claim → post → replay → stale lease → lease extension →
# its work loop with a heartbeat, on a `commitpoint serve --listen 127.0.0.1:0` of its own
# (a fresh data directory, an admin token, no provider: the work waits for workers).
#
# Usage: bash .ci/clients.sh   (about a minute once built and installed)
# Needs: python3-venv, node 20 with npm, go (Debian's golang-go; `.ci/run` installs them).
# Environment: CLIENTS_VENV (default target/clients-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

generator_version=0.29.1
validator_version=0.9.0
mypy_version=2.4.1
venv=$(realpath -m "${CLIENTS_VENV:-target/clients-venv}")

for tool in node npm go; do
    command -v "$tool" >/dev/null 2>&1 || { echo "clients.sh needs $tool (see .ci/run)" >&2; exit 1; }
done
wanted="openapi-python-client==$generator_version openapi-spec-validator==$validator_version mypy==$mypy_version"
# Read once, not piped into `grep -q` (which would end pip early, a failure under pipefail).
installed=$("$venv/bin/pip" freeze 2>/dev/null || true)
if ! grep -qx "openapi-python-client==$generator_version" <<<"$installed" \
    || ! grep -qx "openapi-spec-validator==$validator_version" <<<"$installed" \
    || ! grep -qx "mypy==$mypy_version" <<<"$installed"; then
    echo "== installing $wanted into $venv"
    python3 -m venv "$venv"
    # shellcheck disable=SC2086
    "$venv/bin/pip" install --quiet --disable-pip-version-check $wanted
fi

echo "== building commitpoint"
cargo build --quiet --bin commitpoint
bin="${CARGO_TARGET_DIR:-target}/debug/commitpoint"

work=$(mktemp -d)
server_pid=""
stop_server() {
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    server_pid=""
}
cleanup() {
    stop_server
    rm -rf "$work"
}
trap cleanup EXIT

token="cl-admin-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
umask 077
printf '%s\n' "$token" >"$work/admin-token"
printf '[access]\nadmin_token_file = "%s"\n' "$work/admin-token" >"$work/config.toml"
export COMMITPOINT_TOKEN="$token"

# A fresh server on its own data directory; sets COMMITPOINT_URL from `<data-dir>/address`.
start_server() {
    local data="$work/data-$1"
    COMMITPOINT_LOG=warn "$bin" serve --config "$work/config.toml" --data-dir "$data" \
        --listen 127.0.0.1:0 </dev/null >"$work/$1.stdout" 2>"$work/$1.stderr" &
    server_pid=$!
    for _ in $(seq 1 300); do
        if [ -s "$data/address" ] || ! kill -0 "$server_pid" 2>/dev/null; then
            break
        fi
        sleep 0.1
    done
    if [ ! -s "$data/address" ]; then
        echo "commitpoint did not write $data/address; stderr:" >&2
        cat "$work/$1.stderr" >&2
        exit 1
    fi
    export COMMITPOINT_URL="http://$(cat "$data/address")"
}

# Stops the server; fails if it panicked or did not stop cleanly.
finish_server() {
    if grep -q "panicked" "$work/$1.stderr"; then
        echo "commitpoint panicked during the $1 client's run:" >&2
        grep -A5 "panicked" "$work/$1.stderr" >&2
        exit 1
    fi
    kill -TERM "$server_pid"
    wait "$server_pid" || { echo "commitpoint did not stop cleanly after the $1 client" >&2; exit 1; }
    server_pid=""
}

echo "== the OpenAPI document against openapi-spec-validator and openapi-python-client $generator_version"
start_server openapi
curl -sf "$COMMITPOINT_URL/openapi.json" -o "$work/openapi.json"
python3 .ci/check-openapi-generators.py "$work/openapi.json" "$venv"
finish_server openapi

echo "== python client (mypy --strict, the retry tests, then clients/python/tests/live.py)"
(cd clients/python && "$venv/bin/mypy" --strict --cache-dir "$work/mypy-cache" src tests \
    && python3 -W error -m unittest tests/test_retry.py)
start_server python
python3 clients/python/tests/live.py
finish_server python

echo "== typescript client (tsc, the retry tests, then test/live.ts on Node $(node --version))"
(cd clients/typescript && npm ci --no-audit --no-fund --silent && npx tsc -p . && node dist/test/retry.js)
start_server typescript
node clients/typescript/dist/test/live.js
finish_server typescript

echo "== go client (go vet, go test, then cmd/live on $(go version | awk '{print $3}'))"
(cd clients/go && go vet ./... && go test ./... && go build -o "$work/go-live" ./cmd/live)
start_server go
"$work/go-live"
finish_server go
echo "== clients: all passed ($repo/clients)"
