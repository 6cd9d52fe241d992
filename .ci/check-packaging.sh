#!/usr/bin/env bash
# Packaging gate: the systemd unit (verify output and offline security exposure), the .deb
# and -dbgsym .ddeb that cargo-deb builds (contents, modes, conffiles, changelog, stripped
# binary, maintainer scripts, the credentials postinst creates) and the example
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
# readelf: is the packaged binary stripped, and do its symbols match the .ddeb's.
command -v readelf >/dev/null || missing+=(binutils)
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

step "unit and sample config: the same credential names"
# Each name the sample config.toml uses (commented or not) needs its LoadCredential= line,
# and a line no sample uses is a stale one.
sample_names=$(sed -n 's/^#* *[a-z_]*_credential = "\([^"]*\)".*/\1/p' packaging/config.toml | sort -u)
unit_names=$(sed -n 's|^LoadCredential=\([^:]*\):/etc/commitpoint/credentials/\1$|\1|p' "$UNIT" | sort -u)
[ -n "$sample_names" ] || fail "packaging/config.toml names no credential"
all_lines=$(grep -c '^LoadCredential=' "$UNIT" || true)
[ "$all_lines" -eq "$(printf '%s\n' "$unit_names" | wc -l)" ] ||
    fail "a LoadCredential= line in $UNIT is not NAME:/etc/commitpoint/credentials/NAME"
[ "$sample_names" = "$unit_names" ] ||
    fail "credential names differ: config.toml uses [$(echo $sample_names)], the unit loads [$(echo $unit_names)]"
echo "credentials: $(echo $unit_names)"

step "cargo deb (release build, debug symbols in a -dbgsym package)"
cargo deb --locked | tee "$work/cargo-deb.out"
deb=$(tail -n 1 "$work/cargo-deb.out")
[ -f "$deb" ] || fail "cargo deb did not report a .deb (got '$deb')"
ddeb=$(grep -E -- '-dbgsym_.*\.ddeb$' "$work/cargo-deb.out" | tail -n 1 || true)
[ -n "$ddeb" ] && [ -f "$ddeb" ] || fail "cargo deb made no -dbgsym .ddeb"

step "package contents"
dpkg-deb -c "$deb" >"$work/contents"
has() { # mode regex, path regex (relative to the package root)
    grep -Eq "^$1 .* \./$2\$" "$work/contents" || fail "the .deb has no $2 with mode $1"
}
has '-rwxr-xr-x' 'usr/bin/commitpoint'
has '-rw-r--r--' '(usr/)?lib/systemd/system/commitpoint\.service'
has '-rw-r--r--' 'etc/commitpoint/config\.toml'
# postinst makes the credentials: shipped ones would be conffiles dpkg may offer to replace.
if grep -q 'etc/commitpoint/credentials/.' "$work/contents"; then fail "the .deb ships a credential file"; fi
if grep -q 'usr/lib/debug/' "$work/contents"; then fail "the .deb holds debug symbols (they go in the .ddeb)"; fi
has '-rw-r--r--' 'usr/share/doc/commitpoint/OPERATIONS\.md'
has '-rw-r--r--' 'usr/share/doc/commitpoint/README\.md'
has '-rw-r--r--' 'usr/share/doc/commitpoint/changelog\.Debian\.gz'

dpkg-deb -x "$deb" "$work/root"
packaged_unit=$(find "$work/root" -path '*/lib/systemd/system/commitpoint.service' | head -n 1)
cmp -s "$packaged_unit" "$UNIT" || fail "the packaged unit differs from $UNIT"
cmp -s "$work/root/etc/commitpoint/config.toml" packaging/config.toml || fail "the packaged config differs"

step "stripped binary, symbols in the .ddeb"
packaged_bin="$work/root/usr/bin/commitpoint"
# .debug_gdb_scripts is loaded with the program (rustc's pretty-printer hook), not debug info.
if readelf -S --wide "$packaged_bin" | grep -Eq '\.(z?debug_(info|line|str|abbrev|ranges|loclists|rnglists))'; then
    fail "the packaged binary keeps debug sections"
fi
build_id=$(readelf -n "$packaged_bin" | sed -n 's/^ *Build ID: *\([0-9a-f]*\)$/\1/p')
[ -n "$build_id" ] || fail "the packaged binary has no build id"
dpkg-deb -c "$ddeb" >"$work/ddeb-contents"
grep -q "\./usr/lib/debug/\.build-id/${build_id:0:2}/${build_id:2}\.debug\$" "$work/ddeb-contents" ||
    fail "$ddeb has no symbols for build id $build_id"
echo "binary stripped; $(basename "$ddeb") holds build id $build_id"

step "control files"
dpkg-deb -e "$deb" "$work/control"
[ "$(cat "$work/control/conffiles")" = /etc/commitpoint/config.toml ] ||
    fail "conffiles is not exactly /etc/commitpoint/config.toml: $(cat "$work/control/conffiles")"
field() { sed -n "s/^$1: //p" "$work/control/control"; }
maintainer=$(field Maintainer)
name_and_address='^[^<]+ <[^@>]+@[^>]+>$'
[[ "$maintainer" =~ $name_and_address ]] || fail "Maintainer is not 'Name <address>': '$maintainer'"
# The changelog's top entry describes this version, signed by the same maintainer.
changelog=$(gzip -dc "$work/root/usr/share/doc/commitpoint/changelog.Debian.gz")
top=$(printf '%s\n' "$changelog" | head -n 1)
[[ "$top" == "commitpoint ($(field Version)) "* ]] || fail "changelog starts '$top', not version $(field Version)"
printf '%s\n' "$changelog" | grep -q "^ -- $maintainer  " || fail "the changelog's signature is not '$maintainer'"
echo "maintainer: $maintainer; changelog: $top"
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
grep -q 'make_credential' "$work/control/postinst" || fail "postinst lost our own part"

step "postinst makes the credentials (in the extracted tree, without the systemd part)"
# Our part only: the generated snippets would talk to this host's systemd.
ours() { # maintainer script: copies it without the generated sections
    sed '/^# Automatically added by /,/^# End automatically added section$/d' "$work/control/$1" >"$work/$1-ours"
    if grep -q 'deb-systemd' "$work/$1-ours"; then fail "could not cut the systemd part out of $1"; fi
}
ours postinst
ours postrm
creds="$work/root/etc/commitpoint/credentials"
as_root env DPKG_ROOT="$work/root" sh "$work/postinst-ours" configure
[ "$(stat -c '%a %u' "$creds")" = "700 0" ] || fail "credentials directory is $(stat -c '%a %u' "$creds")"
for name in $unit_names; do
    [ "$(as_root stat -c '%a %u %g' "$creds/$name")" = "600 0 0" ] ||
        fail "postinst made $name as $(as_root stat -c '%a %u %g' "$creds/$name" 2>&1), not 0600 root"
done
token=$(as_root cat "$creds/admin-token")
[[ "$token" =~ ^[0-9a-f]{64}$ ]] || fail "the admin token postinst made is not 64 hex digits"
printf 'sk-operator' | as_root tee "$creds/openai-key" >/dev/null
as_root env DPKG_ROOT="$work/root" sh "$work/postinst-ours" configure
[ "$(as_root cat "$creds/admin-token")" = "$token" ] || fail "a second configure replaced the admin token"
[ "$(as_root cat "$creds/openai-key")" = sk-operator ] || fail "a second configure replaced the operator's key"
echo "postinst: $(echo $unit_names) at 0600 root, admin-token random, kept on reconfigure"
as_root env DPKG_ROOT="$work/root" sh "$work/postrm-ours" purge
[ ! -e "$creds" ] || fail "postrm purge left $creds"
echo "postrm purge: credentials removed"

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
