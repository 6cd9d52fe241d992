#!/usr/bin/env bash
# Packaging gate: the systemd unit (verify output and offline security exposure), the .deb
# that cargo-deb builds (contents, modes, conffiles, maintainer scripts) and the example
# configuration it ships. Installs cargo-deb and apt packages only when they are missing.
# Run from anywhere: .ci/check-packaging.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
SECONDS=0

UNIT=systemd/commitpoint.service
DEB_UNIT=packaging/debian/commitpoint.service
# `systemd-analyze security --threshold` is on a 0-100 scale: 15 means exposure <= 1.5.
MAX_EXPOSURE_X10=15
# The only verify message tolerated, and only while the binary is not installed here.
MISSING_BINARY='^commitpoint\.service: Command /usr/bin/commitpoint is not executable: No such file or directory$'

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
    echo "check-packaging: FAIL: $*" >&2
    exit 1
}
step() { echo "== $*"; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

step "tools"
missing=()
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v dpkg-deb >/dev/null || missing+=(dpkg)
if [ ${#missing[@]} -gt 0 ]; then
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if ! command -v cargo-deb >/dev/null; then
    cargo install cargo-deb --locked
fi
echo "$(systemd-analyze --version | head -n 1); $(cargo deb --version)"

step "unit: one source of truth"
[ -f "$UNIT" ] || fail "$UNIT is missing"
cmp -s "$UNIT" "$DEB_UNIT" || fail "$DEB_UNIT differs from $UNIT (it should be a symlink to it)"

verify_unit() { # unit file, tolerated-message regex (or empty): prints what remains
    local out
    out=$(systemd-analyze verify --man=no "$1" 2>&1 || true)
    if [ -n "$2" ]; then
        out=$(printf '%s\n' "$out" | grep -Ev -- "$2" || true)
    fi
    printf '%s' "$out" | grep -v '^[[:space:]]*$' || true
}

step "unit: systemd-analyze verify --man=no"
tolerated=""
[ -x /usr/bin/commitpoint ] || tolerated=$MISSING_BINARY
left=$(verify_unit "$UNIT" "$tolerated")
[ -z "$left" ] || fail "systemd-analyze verify printed:"$'\n'"$left"
echo "verify: clean${tolerated:+ (apart from the not-yet-installed /usr/bin/commitpoint)}"

step "unit: systemd-analyze security --offline=yes --threshold=$MAX_EXPOSURE_X10"
security_rc=0
security=$(systemd-analyze security --offline=yes --threshold="$MAX_EXPOSURE_X10" "$UNIT" 2>&1) || security_rc=$?
exposure=$(printf '%s\n' "$security" | sed -n 's/.*Overall exposure level for commitpoint.service: \([0-9.]*\).*/\1/p')
[ -n "$exposure" ] || fail "no exposure score in:"$'\n'"$security"
[ "$security_rc" -eq 0 ] || fail "exposure $exposure is above $((MAX_EXPOSURE_X10 / 10)).$((MAX_EXPOSURE_X10 % 10))"
echo "exposure: $exposure"

step "cargo deb (release build)"
deb=$(cargo deb --locked | tail -n 1)
[ -f "$deb" ] || fail "cargo deb did not report a .deb (got '$deb')"
echo "$deb"

step "package contents"
dpkg-deb -c "$deb" >"$work/contents"
has() { # mode regex, path regex (relative to the package root)
    grep -Eq "^$1 .* \./$2\$" "$work/contents" || fail "the .deb has no $2 with mode $1"
}
has '-rwxr-xr-x' 'usr/bin/commitpoint'
has '-rw-r--r--' '(usr/)?lib/systemd/system/commitpoint\.service'
has '-rw-r--r--' 'etc/commitpoint/config\.toml'
# Every LoadCredential= source the unit names must ship (empty, 0600), or the start fails.
credentials=$(sed -n 's|^LoadCredential=[^:]*:/||p' "$UNIT")
[ -n "$credentials" ] || fail "$UNIT names no LoadCredential= file"
for path in $credentials; do
    has '-rw-------' "${path//./\\.}"
done
has '-rw-r--r--' 'usr/share/doc/commitpoint/OPERATIONS\.md'
has '-rw-r--r--' 'usr/share/doc/commitpoint/README\.md'

dpkg-deb -x "$deb" "$work/root"
packaged_unit=$(find "$work/root" -path '*/lib/systemd/system/commitpoint.service' | head -n 1)
cmp -s "$packaged_unit" "$UNIT" || fail "the packaged unit differs from $UNIT"
cmp -s "$work/root/etc/commitpoint/config.toml" packaging/config.toml || fail "the packaged config differs"
for path in $credentials; do
    [ ! -s "$work/root/$path" ] || fail "the shipped credential file /$path is not empty"
done

step "control files"
dpkg-deb -e "$deb" "$work/control"
grep -qx '/etc/commitpoint/config.toml' "$work/control/conffiles" || fail "conffiles does not list /etc/commitpoint/config.toml"
for script in postinst prerm postrm; do
    [ -f "$work/control/$script" ] || continue
    sh -n "$work/control/$script" || fail "$script is not valid sh"
    if grep -q '#DEBHELPER#' "$work/control/$script"; then fail "$script still contains #DEBHELPER#"; fi
done
# cargo-deb substitutes the token wherever it appears, comments included: one snippet only.
enables=$(grep -c 'deb-systemd-helper enable commitpoint.service' "$work/control/postinst" || true)
[ "$enables" -eq 1 ] || fail "postinst enables the unit $enables times (expected once)"
if grep -q 'deb-systemd-invoke start' "$work/control/postinst"; then
    fail "postinst starts the unit on a fresh install (systemd-units start = false)"
fi
grep -q 'chmod 0700 /etc/commitpoint/credentials' "$work/control/postinst" || fail "postinst lost our own part"

step "the built binary against the unit and the shipped config"
target_dir=${CARGO_TARGET_DIR:-target}
case "$target_dir" in /*) ;; *) target_dir="$PWD/$target_dir" ;; esac
binary="$target_dir/release/commitpoint"
sed "s|/usr/bin/commitpoint|$binary|g" "$UNIT" >"$work/commitpoint.service"
left=$(verify_unit "$work/commitpoint.service" "")
[ -z "$left" ] || fail "verify with the built binary printed:"$'\n'"$left"
echo "verify with $binary: empty output"

clean_env=(env -u COMMITPOINT_CONFIG -u COMMITPOINT_DATA_DIR -u COMMITPOINT_LISTEN)
"${clean_env[@]}" "$binary" config check --config packaging/config.toml >"$work/effective.toml" 2>"$work/check.err" ||
    fail "config check of packaging/config.toml exited $?: $(cat "$work/check.err")"
printf '[server]\nlisten_addr = "127.0.0.1:1"\n' >"$work/bad.toml"
rc=0
"${clean_env[@]}" "$binary" config check --config "$work/bad.toml" >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 78 ] || fail "a bad config exited $rc, not 78 (the unit's RestartPreventExitStatus)"
echo "config check: packaging/config.toml ok; a bad file exits 78"

echo
echo "check-packaging: OK in ${SECONDS}s"
echo "  unit exposure: $exposure (limit 1.5); verify: clean"
echo "  package: $deb ($(du -h "$deb" | cut -f1))"
awk '{print "   ", $1, $NF}' "$work/contents" | grep -v '/$'
