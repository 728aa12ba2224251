#!/usr/bin/env bash
# Run every test binary under $BUILD/tests (and tests/*.sh checks), each with a timeout.
# Exit code 77 means skipped. Prints "N passed, N failed, N skipped" as the closing line.
set -u
BUILD=${BUILD:-build}
TIMEOUT=${FT_TEST_TIMEOUT:-900}
here=$(cd "$(dirname "$0")" && pwd)
export BUILD
# Test files go on a real disk filesystem next to the build, not tmpfs.
export FT_TEST_DIR=${FT_TEST_DIR:-$PWD/$BUILD/test-tmp}
# AUTO learns a profile; keep the tests' away from the user's ~/.cache.
export FASTENSOR_PROFILE=${FASTENSOR_PROFILE:-off}
mkdir -p "$FT_TEST_DIR"
# The binaries append the call sites they injected faults at; check-fault-sites.sh reads them.
export FT_FAULT_SITES=${FT_FAULT_SITES:-$FT_TEST_DIR/fault-sites.txt}
rm -f "$FT_FAULT_SITES"
if [ -n "${SAN:-}" ]; then
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$here/tsan.supp}
fi
passed=0 failed=0 skipped=0
failed_names=()
run_one() {
    local name=$1; shift
    local start end rc
    start=$(date +%s.%N)
    timeout --kill-after=10 "$TIMEOUT" "$@" >"$FT_TEST_DIR/$name.log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    local secs
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", b-a}')
    case $rc in
        0) passed=$((passed + 1)); printf 'PASS  %-28s %6ss\n' "$name" "$secs" ;;
        77) skipped=$((skipped + 1)); printf 'SKIP  %-28s %s\n' "$name" \
                "$(grep -m1 '^SKIP:' "$FT_TEST_DIR/$name.log" | cut -c7-)" ;;
        *) failed=$((failed + 1)); failed_names+=("$name")
           [ $rc = 124 ] && echo "(timed out after ${TIMEOUT}s)" >>"$FT_TEST_DIR/$name.log"
           printf 'FAIL  %-28s %6ss (exit %d)\n' "$name" "$secs" "$rc"
           sed 's/^/    | /' "$FT_TEST_DIR/$name.log" | tail -40 ;;
    esac
}
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" "$t"
done
for s in "$here"/check-*.sh; do
    [ -e "$s" ] || continue
    run_one "$(basename "$s")" bash "$s"
done
if [ -z "${SAN:-}" ] && [ -z "${FT_NO_PYTEST:-}" ] && [ -d "$here/python" ]; then
    run_one "pytest" "$here/../scripts/pytest.sh"
    # safetensors' own suite, the real package's run and fastensor's (tests/conformance)
    run_one "safetensors-conformance" "$here/conformance/run.sh"
    grep -E '^(safetensors|fastensor): ' "$FT_TEST_DIR/safetensors-conformance.log" |
        sed 's/^/      /'
fi
echo
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
