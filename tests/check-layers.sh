#!/usr/bin/env bash
# The layering rule (DESIGN.md): base <- gpu <- engine <- select <- core <- {ckpt, store} <-
# {tools, python}; codec uses only base and gpu, and ckpt uses codec. A file in src/ includes
# headers of its own folder and of folders to its left, never to its right (ckpt and store
# not each other); tools/ and python/ include the public header only (and their own
# folder's headers). Each include against the rule fails
# the check, except those listed in tests/layers-known.txt: the violations the redesign has
# not removed yet. That list only shrinks: a listed one that no longer occurs fails too (take
# it off the list).
#
#   tests/check-layers.sh             check this checkout, then the self-test
#   tests/check-layers.sh ROOT        check the tree at ROOT
#   tests/check-layers.sh --self-test plant a violation in a copy and expect a failure
set -u
export LC_ALL=C # (sort and comm order names alike on every machine)
# shellcheck source=tests/known-list.sh
. "$(dirname "$0")/known-list.sh"
here=$(cd "$(dirname "$0")" && pwd)

rank() {
    case $1 in
        base) echo 0 ;; gpu) echo 1 ;; engine) echo 2 ;; select) echo 3 ;; core) echo 4 ;;
        ckpt|store) echo 5 ;; codec) echo 2 ;; *) echo -1 ;;
    esac
}

# Whether folder $1 may include headers of folder $2 (another one).
allowed() {
    case $1:$2 in
        codec:base|codec:gpu|ckpt:codec) return 0 ;;
        codec:*|*:codec) return 1 ;;
    esac
    [ "$(rank "$2")" -ge 0 ] && [ "$(rank "$2")" -lt "$(rank "$1")" ]
}

# Print "file -> include" for every include against the rule under root $1.
violations() {
    local root=$1 f dir inc target
    for f in "$root"/src/*/*.[ch]; do
        dir=$(basename "$(dirname "$f")")
        [ "$(rank "$dir")" -ge 0 ] || { echo "${f#"$root"/} -> (folder $dir has no layer)"; continue; }
        grep -oE '^#include "[^"]+"' "$f" | sed -E 's/#include "(.*)"/\1/' | while read -r inc; do
            case $inc in
                ../*/*) target=${inc#../}; target=${target%%/*} ;;
                fastensor.h) continue ;;
                */*) echo "${f#"$root"/} -> $inc (outside src/)"; continue ;;
                *) continue ;; # its own folder's header
            esac
            if [ "$target" != "$dir" ] && ! allowed "$dir" "$target"; then
                echo "${f#"$root"/} -> $inc"
            fi
        done
    done
    for f in "$root"/tools/*.[ch] "$root"/python/fastensor/*.[ch]; do
        [ -e "$f" ] || continue
        grep -oE '^#include "[^"]+"' "$f" | sed -E 's/#include "(.*)"/\1/' | while read -r inc; do
            case $inc in */*) echo "${f#"$root"/} -> $inc (the public header only)" ;; esac
        done
    done
}

check() {
    against_known "$(violations "$1")" "$2" "includes against the layering rule" layers
}

# Plant an include of ckpt/ in base/ in a copy of the sources: the check must fail on it.
self_test() {
    local tmp rc=0
    tmp=$(mktemp -d)
    mkdir -p "$tmp/python"
    cp -r "$here/../src" "$here/../tools" "$tmp/" && cp -r "$here/../python/fastensor" "$tmp/python/"
    echo '#include "../ckpt/ckpt.h"' >>"$tmp/src/base/rw.c"
    if check "$tmp" "$here/layers-known.txt" >/dev/null; then
        echo "self-test: an include of ckpt/ planted in base/rw.c was not found"
        rc=1
    else
        echo "self-test: an include of ckpt/ planted in base/rw.c fails the check"
    fi
    rm -rf "$tmp"
    return $rc
}

if [ "${1:-}" = --self-test ]; then
    self_test
    exit
fi
check "${1:-$here/..}" "$here/layers-known.txt" || exit 1
[ -n "${1:-}" ] || self_test
