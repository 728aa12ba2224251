#!/usr/bin/env bash
# `fastensor demo` on a tiny model: the workflow table (every engine in rounds, a twin, the
# medians, the verdict),
# every load's bytes checked in its child process (the demo exits non-zero otherwise), and
# the checksums verified.
set -u
BUILD=${BUILD:-build}
bin=$BUILD/fastensor
[ -x "$bin" ] || { echo "SKIP: $bin is not built"; exit 77; }
case ${SAN:-} in *thread*)
    echo "SKIP: the demo forks a process per load, which ThreadSanitizer does not follow"
    exit 77 ;;
esac
dir=$(mktemp -d "${FT_TEST_DIR:-/tmp}/demo-XXXXXX")
trap 'rm -rf "$dir"' EXIT
out=$("$bin" demo --model tiny --dir "$dir" --json 2>&1)
rc=$?
printf '%s\n' "$out"
[ $rc = 0 ] || { echo "demo exited $rc"; exit 1; }
for e in auto posix direct uring mmap; do
    printf '%s\n' "$out" | grep -qE "^$e +[0-9.]+ " || { echo "no workflow row for $e"; exit 1; }
    printf '%s\n' "$out" | grep -q "\"what\":\"workflow\",\"engine\":\"$e\"" ||
        { echo "no JSON line for $e"; exit 1; }
done
printf '%s\n' "$out" | grep -qE '^[a-z]+ \(twin\) ' || { echo "no twin row"; exit 1; }
printf '%s\n' "$out" | grep -q '^median of 3 rounds' || { echo "no median table"; exit 1; }
[ "$(printf '%s\n' "$out" | grep -c '"what":"workflow","engine":"posix"')" = 3 ] ||
    { echo "posix did not run 3 rounds"; exit 1; }
printf '%s\n' "$out" | grep -q '^auto [0-9.]* s against the best fixed engine' ||
    { echo "no verdict line"; exit 1; }
printf '%s\n' "$out" | grep -q '^verify: all checksums match' || { echo "not verified"; exit 1; }
[ -z "$(ls -A "$dir")" ] || { echo "the demo left files: $(ls -A "$dir")"; exit 1; }
echo "demo: workflow rows, twin, verdict, checksums"
