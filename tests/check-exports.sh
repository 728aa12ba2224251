#!/usr/bin/env bash
# The shared library exports exactly the functions declared in include/fastensor.h.
set -eu
BUILD=${BUILD:-build}
lib="$BUILD/libfastensor.so"
[ -f "$lib" ] || { echo "missing $lib"; exit 1; }
exported=$(nm -D --defined-only "$lib" | awk '$2 == "T" {print $3}' | sed 's/@.*//' | sort -u)
declared=$(grep -oE '\bft_[a-z_0-9]+\(' include/fastensor.h | tr -d '(' | grep -v '^ft_host_buf$' | sort -u)
bad=0
for s in $exported; do
    case $s in ft__*|[!f]*|f[!t]*) echo "leaked internal symbol: $s"; bad=1 ;; esac
done
missing=$(comm -13 <(echo "$exported") <(echo "$declared"))
extra=$(comm -23 <(echo "$exported") <(echo "$declared"))
[ -n "$missing" ] && { echo "declared but not exported: $missing"; bad=1; }
[ -n "$extra" ] && { echo "exported but not declared: $extra"; bad=1; }
n=$(echo "$exported" | wc -l)
[ $bad = 0 ] && echo "ok: $n exported functions match the header"
exit $bad
