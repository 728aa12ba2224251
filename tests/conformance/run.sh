#!/usr/bin/env bash
# safetensors' own Python test suite against fastensor. The safetensors source distribution
# of the pinned version is taken from the package index at run time (nothing of it is kept
# in this tree), its bindings/python/tests unpacked under $BUILD/st-conformance, and the
# PyTorch and numpy modules run twice: with the real package (the control) and with
# `safetensors` mapped onto fastensor by tests/conformance/shim, which only re-exports
# fastensor's names. Prints both runs' closing lines; fails where fastensor fails a test the
# control passes, unless tests/conformance/differences.txt lists it (with its reason).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PY=${FT_PYTHON:-$root/.venv/bin/python}
VERSION=0.8.0
SHA256=fabaf3e0f18a6618d9b36560682562157f77c2b71fcffc7b432be2baed9d753d
MODULES="test_handle test_multithreaded test_pread_backend test_pt_comparison test_pt_model
test_simple test_threadable"
work=${FT_CONFORMANCE_DIR:-$root/${BUILD:-build}/st-conformance}
mkdir -p "$work"
sdist=$work/safetensors-$VERSION.tar.gz

fetch() {
    # the index's simple page names the sdist's URL; the pinned hash checks what came
    local url
    url=$(curl -fsSL --retry 3 "https://pypi.org/simple/safetensors/" |
          grep -o "href=\"[^\"]*safetensors-$VERSION.tar.gz[^\"]*\"" | head -1 |
          sed -e 's/^href="//' -e 's/#.*//' -e 's/"$//')
    [ -n "$url" ] || { echo "no safetensors-$VERSION sdist on the package index"; return 1; }
    curl -fsSL --retry 3 -o "$sdist.part" "$url"
    mv "$sdist.part" "$sdist"
}
if [ ! -s "$sdist" ] || ! echo "$SHA256  $sdist" | sha256sum -c --status; then
    if ! fetch; then
        echo "SKIP: the safetensors $VERSION source distribution could not be fetched"
        exit 77
    fi
    echo "$SHA256  $sdist" | sha256sum -c --status ||
        { echo "safetensors-$VERSION.tar.gz: sha256 mismatch"; exit 1; }
fi
rm -rf "$work/src"
mkdir -p "$work/src"
tar -xzf "$sdist" -C "$work/src" "safetensors-$VERSION/bindings/python/tests"
tests=$work/src/safetensors-$VERSION/bindings/python

run() { # LABEL PYTHONPATH-prefix: the suite's closing line; per-test outcomes in $work/LABEL.txt
    local label=$1 prefix=$2 files=()
    for m in $MODULES; do files+=("tests/$m.py"); done
    # the tests write relative paths (./tests/data/...): run from the bindings folder
    (cd "$tests" && PYTHONPATH="$prefix" "$PY" -m pytest -p no:cacheprovider -q -rA \
        "${files[@]}" >"$work/$label.log" 2>&1) || true
    grep -E '^(PASSED|FAILED|ERROR|SKIPPED)' "$work/$label.log" |
        sed -E 's/^(PASSED|FAILED|ERROR) ([^ ]+).*/\1 \2/; s/^SKIPPED \[[0-9]+\] ([^:]+):[0-9]+.*/SKIPPED \1/' |
        sort -u >"$work/$label.txt"
    echo "$label: $(tail -1 "$work/$label.log" | sed -E 's/^=+ //; s/ =+$//')"
}
run safetensors "$(cd "$tests" && pwd)"
run fastensor "$here/shim:$root/python"

# every test the control passes: fastensor passes it, or the differences list names it
allowed=$(grep -vE '^\s*(#|$)' "$here/differences.txt" | awk '{print $1}' || true)
missing=0
while read -r _ id; do
    grep -qx "PASSED $id" "$work/fastensor.txt" && continue
    if printf '%s\n' "$allowed" | grep -qxF "$id"; then
        echo "  listed difference: $id"
    else
        echo "  NOT PASSED by fastensor: $id"
        missing=$((missing + 1))
    fi
done < <(grep '^PASSED ' "$work/safetensors.txt")
if [ "$missing" -gt 0 ]; then
    echo "fastensor fails $missing test(s) that safetensors $VERSION passes (log: $work/fastensor.log)"
    grep -E '^(FAILED|ERROR) ' "$work/fastensor.log" | head -40
    exit 1
fi
echo "fastensor passes every test safetensors $VERSION passes but the listed differences"
