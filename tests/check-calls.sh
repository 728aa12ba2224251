#!/usr/bin/env bash
# The layering rule on calls, as the linker sees them: for every object of the library under
# $BUILD/src/FOLDER/, each ft_/ft__ symbol it calls or reads is defined in its own folder or
# in one the rule lets it use (tests/check-layers.sh's `allowed`: base <- gpu <- engine <-
# select <- core <- {ckpt, store}; codec over base and gpu, ckpt over codec); the CLI's
# objects use public (ft_) symbols only; and no two files of src/ call each other, directly
# or around a longer circle. What the redesign has not removed yet is listed in
# tests/calls-known.txt; that list only shrinks (a listed one no longer found fails too).
#
#   tests/check-calls.sh              check $BUILD (build by default), then the self-test
#   tests/check-calls.sh BUILD KNOWN  check the objects under BUILD against list KNOWN
#   tests/check-calls.sh --self-test  plant an upward call and a circle: both must fail
set -u
export LC_ALL=C # (sort and comm order names alike on every machine)
# shellcheck source=tests/known-list.sh
. "$(dirname "$0")/known-list.sh"
here=$(cd "$(dirname "$0")" && pwd)
command -v nm >/dev/null || { echo "SKIP: nm (binutils) is not installed"; exit 77; }
# shellcheck source=tests/check-layers.sh
eval "$(sed -n '/^rank() {/,/^}/p; /^allowed() {/,/^}/p' "$here/check-layers.sh")"

# "caller -> callee (symbol)" lines: calls against the rule, then file circles.
violations() {
    local build=$1 defs uses
    defs=$(mktemp) uses=$(mktemp)
    for o in "$build"/src/*/*.o "$build"/tools/*.o; do
        [ -e "$o" ] || continue
        local rel=${o#"$build"/}
        # (an object whose source is gone is a stale leftover of an older build)
        [ -z "${SOURCES:-}" ] || [ -e "$SOURCES/${rel%.o}.c" ] || continue
        nm -g --defined-only "$o" 2>/dev/null | awk -v f="$rel" '$3 ~ /^ft_/ {print $3, f}' >>"$defs"
        nm -u "$o" 2>/dev/null | awk -v f="$rel" '$2 ~ /^ft_/ {print f, $2}' >>"$uses"
    done
    # caller file, callee file, symbol
    awk 'NR == FNR { def[$1] = $2; next } ($2 in def) && def[$2] != $1 { print $1, def[$2], $2 }' \
        "$defs" "$uses" | sort -u >"$uses.edges"
    while read -r from to sym; do
        local a b
        a=$(basename "$(dirname "$from")") b=$(basename "$(dirname "$to")")
        if [ "$a" = tools ]; then
            case $sym in ft__*) echo "$from -> $to ($sym: the CLI uses the public API only)" ;; esac
        elif [ "$a" != "$b" ] && ! allowed "$a" "$b"; then
            echo "$from -> $to ($sym)"
        fi
    done <"$uses.edges"
    # circles: the strongly connected components of the file graph with more than one file
    awk '{ print $1, $2 }' "$uses.edges" | sort -u | circles
    rm -f "$defs" "$uses" "$uses.edges"
}

# Files that reach each other through calls, one component a line: "circle: a b c".
circles() {
    awk '
    { n[$1]; n[$2]; adj[$1] = adj[$1] " " $2 }
    function reach(s, seen, stack, top, x, i, m, parts) {
        top = 1; stack[1] = s; seen[s] = 1
        while (top > 0) {
            x = stack[top--]
            m = split(adj[x], parts, " ")
            for (i = 1; i <= m; i++) if (!(parts[i] in seen)) { seen[parts[i]] = 1; stack[++top] = parts[i] }
        }
    }
    END {
        for (a in n) { delete r; reach(a, r); for (b in r) R[a, b] = 1 }
        for (a in n) {
            if (a in done) continue
            comp = a; k = 1
            for (b in n) if (b != a && ((a, b) in R) && ((b, a) in R)) { comp = comp " " b; done[b]; k++ }
            if (k > 1) print comp
        }
    }' | while read -r line; do
        echo "circle: $(printf '%s\n' $line | sort | tr '\n' ' ' | sed 's/ $//')"
    done
}

check() {
    against_known "$(violations "$1")" "$2" \
        "calls against the layering rule, or files calling each other" calls
}

# Two small trees of objects: base/ calling store/ (upward), and two files of core/ calling
# each other (a circle). The check must fail on each, naming it.
self_test() {
    local tmp rc=0 out
    tmp=$(mktemp -d)
    mkdir -p "$tmp/up/src/base" "$tmp/up/src/store" "$tmp/ring/src/core"
    cc_obj() { printf '%s\n' "$2" | ${CC:-cc} -x c -c -o "$1" - 2>/dev/null; }
    cc_obj "$tmp/up/src/base/rw.o" 'int ft__store_put(void); int ft__rw(void) { return ft__store_put(); }'
    cc_obj "$tmp/up/src/store/put.o" 'int ft__store_put(void) { return 1; }'
    cc_obj "$tmp/ring/src/core/a.o" 'int ft__b(int); int ft__a(int n) { return n ? ft__b(n - 1) : 0; }'
    cc_obj "$tmp/ring/src/core/b.o" 'int ft__a(int); int ft__b(int n) { return n ? ft__a(n - 1) : 1; }'
    : >"$tmp/none.txt"
    out=$(check "$tmp/up" "$tmp/none.txt")
    if printf '%s' "$out" | grep -q 'src/base/rw.o -> src/store/put.o (ft__store_put)'; then
        echo "self-test: a call from base/ up to store/ fails the check"
    else
        echo "self-test: a call from base/ up to store/ was not found: $out"
        rc=1
    fi
    out=$(check "$tmp/ring" "$tmp/none.txt")
    if printf '%s' "$out" | grep -q 'circle: src/core/a.o src/core/b.o'; then
        echo "self-test: two files calling each other fail the check"
    else
        echo "self-test: a circle of two files was not found: $out"
        rc=1
    fi
    rm -rf "$tmp"
    return $rc
}

if [ "${1:-}" = --self-test ]; then
    self_test
    exit
fi
build=${1:-$here/../${BUILD:-build}}
if ! ls "$build"/src/*/*.o >/dev/null 2>&1; then
    echo "SKIP: no library objects under $build (make first)"
    exit 77
fi
SOURCES=$(cd "$here/.." && pwd) check "$build" "${2:-$here/calls-known.txt}" || exit 1
[ -n "${1:-}" ] || self_test
