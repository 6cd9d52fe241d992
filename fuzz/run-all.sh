#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 60), one after the other (libFuzzer
# takes a core; two at once would starve the rest of a 2-core machine). New inputs go to
# fuzz/work/<target>/ (ignored by git); the committed seeds in fuzz/corpus/<target>/ and
# the kept crashes in fuzz/regressions/<target>/ are read, never written. A crash stops
# only its own target: its input lands in fuzz/artifacts/<target>/, and the summary at
# the end names it. Needs the nightly toolchain and `cargo install cargo-fuzz`.
#
#   fuzz/run-all.sh 120                # every target, 120 s each
#   fuzz/run-all.sh 60 store_decode    # only the targets named
set -uo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi

cargo +nightly fuzz build || exit 1
mkdir -p logs
summary=()
status=0
for target in "${targets[@]}"; do
    mkdir -p "work/$target" "regressions/$target"
    log="logs/$target.log"
    # The store's decoder may size one buffer up to redb's 3 GiB value limit from a
    # corrupt length prefix before finding the bytes missing (src/store/codec.rs), more
    # than libFuzzer's default malloc limit (the RSS limit, 2 GiB) allows.
    extra=(-dict="$PWD/json.dict")
    if [ "$target" = store_decode ]; then extra=(-malloc_limit_mb=3200); fi
    echo "== $target: ${seconds}s"
    cargo +nightly fuzz run "$target" "work/$target" "corpus/$target" "regressions/$target" -- \
        -max_total_time="$seconds" -max_len=16384 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "${extra[@]}" \
        >"$log" 2>&1
    code=$?
    execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -n 1)
    corpus=$(find "work/$target" "corpus/$target" -type f | wc -l)
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -n 1 | grep -oE '[0-9]+')
    if [ "$code" -eq 0 ]; then
        finding="none"
    else
        status=1
        finding="exit $code: $(grep -m 1 -E 'panicked at|ERROR: libFuzzer|SUMMARY' "$log" | cut -c 1-160)"
    fi
    summary+=("$target	${seconds}s	execs=${execs:-?}	cov=${cov:-?}	corpus=$corpus	$finding")
done

echo
echo "target	time	executions	coverage	corpus	findings"
printf '%s\n' "${summary[@]}"
exit $status
