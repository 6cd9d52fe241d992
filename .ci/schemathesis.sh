#!/usr/bin/env bash
# Checks the OpenAPI document a live server serves (GET /openapi.json) with the reference
# validator, then fuzzes the server against it with
# schemathesis and every check it has: no 5xx, every status and body as documented,
# invalid input refused, valid input accepted, bearer auth enforced, 405 with Allow.
#
# Usage: bash .ci/schemathesis.sh   (from anywhere; about a minute on 2 cores once built)
# Environment: SCHEMATHESIS_MAX_EXAMPLES (default 100 per operation), SCHEMATHESIS_SEED
# (default 1; `random` for a fresh one), SCHEMATHESIS_VENV (default target/schemathesis-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

version=4.32.5
# The reference validator client generators go by: a document it refuses (an operation id
# used twice, say) is one they cannot use either.
validator_version=0.9.0
venv=$(realpath -m "${SCHEMATHESIS_VENV:-target/schemathesis-venv}")
max_examples="${SCHEMATHESIS_MAX_EXAMPLES:-100}"
seed="${SCHEMATHESIS_SEED:-1}"
if [ "$seed" = random ]; then
    seed=$RANDOM
fi

if ! "$venv/bin/schemathesis" --version 2>/dev/null | grep -q "$version"; then
    echo "== installing schemathesis $version into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$version"
fi
if ! "$venv/bin/pip" show openapi-spec-validator 2>/dev/null | grep -q "^Version: $validator_version$"; then
    "$venv/bin/pip" install --quiet --disable-pip-version-check "openapi-spec-validator==$validator_version"
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

# An admin token (so the bearer security the document declares is enforced), one signed
# webhook endpoint (so its 401 path is reachable) and one outbox sink that nothing
# listens on, so events go dead at once and the outbox endpoints have data.
token="st-admin-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
umask 077
printf '%s\n' "$token" >"$work/admin-token"
cat >"$work/config.toml" <<EOF
[access]
admin_token_file = "$work/admin-token"
# The fuzzer sends wrong tokens on purpose, from the address its valid requests come from:
# without this, the wrong-token backoff would answer its valid requests 429.
wrong_token_allowance = 1000000

[[webhooks]]
name = "std"
scheme = "standard"
secret_env = "ST_WEBHOOK_SECRET"
tenant = "acme"
source_id_pointer = "/id"
content_pointer = "/text"
schema = "code-review@1"

[[outbox.sinks]]
name = "nowhere"
url = "http://127.0.0.1:1/events"
secret_env = "ST_WEBHOOK_SECRET"
max_attempts = 1
EOF

echo "== starting commitpoint serve"
: >"$work/stdout"
ST_WEBHOOK_SECRET="whsec_$(head -c 24 /dev/urandom | base64)" COMMITPOINT_LOG=warn \
    target/debug/commitpoint serve --config "$work/config.toml" --data-dir "$work/data" \
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
echo "   listening on $url"

echo "== openapi-spec-validator $validator_version on $url/openapi.json"
curl -sf "$url/openapi.json" -o "$work/openapi.json"
"$venv/bin/openapi-spec-validator" "$work/openapi.json"

echo "== schemathesis run $url/openapi.json (max $max_examples examples per operation, seed $seed)"
status=0
# Run from the temporary directory: schemathesis keeps a `.schemathesis/` cache in its
# working directory. One worker: with two, this version sometimes fails inside hypothesis
# ("AST constructor recursion depth mismatch"), an error of the tool, not of the API.
(cd "$work" && "$venv/bin/schemathesis" --config-file "$repo/.ci/schemathesis.toml" run "$url/openapi.json" \
    --checks all \
    --header "Authorization: Bearer $token" \
    --max-examples "$max_examples" \
    --seed "$seed" \
    --workers 1 \
    --generation-database none \
    --request-timeout 10 \
    --no-color) \
    || status=$?

if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "commitpoint exited during the run; stderr:" >&2
    cat "$work/stderr" >&2
    exit 1
fi
if grep -q "panicked" "$work/stderr"; then
    echo "commitpoint panicked during the run:" >&2
    grep -A5 "panicked" "$work/stderr" >&2
    status=1
fi
kill -TERM "$server_pid"
wait "$server_pid" || { echo "commitpoint did not stop cleanly" >&2; status=1; }
server_pid=""
exit "$status"
