#!/usr/bin/env bash
# The fuzz targets' corpora (tests/fuzz/corpus/T) replayed through each target without
# libFuzzer: every input once, under the sanitizers of the build at hand.
set -u
here=$(cd "$(dirname "$0")" && pwd)
BUILD=${BUILD:-build}
status=0
for t in header index profile codec encode; do
    bin=$BUILD/fuzz-replay/fuzz_$t
    [ -x "$bin" ] || { echo "missing $bin (make tests builds it)"; exit 1; }
    FASTENSOR_PROFILE=off "$bin" "$here"/fuzz/corpus/$t/* || status=1
done
exit $status
