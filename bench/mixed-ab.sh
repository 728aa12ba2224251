#!/usr/bin/env bash
# Two builds of fastensor on the mixed workload, taking turns: `fastensor bench --mixed` with
# build A, then build B, PAIRS times, each build with its own profile kept from run to run
# (its first run starts from nothing: AUTO's learning passes; the later ones from what the
# earlier runs left, as a job that runs again on the same machine). Taking turns puts both
# builds in the same stretches of the disk's speed, which drifts over minutes.
#
#   bench/mixed-ab.sh FASTENSOR_A FASTENSOR_B [PAIRS] [ENGINES]
#
# PAIRS: 3; ENGINES: posix,direct,auto. Runs in the current directory (the workload's files,
# 10 GiB, go there); OUT (default .) receives mixed-A<i>.txt, mixed-B<i>.txt and the two
# profiles, and with TRACE=1 AUTO's traces (FASTENSOR_TRACE), trace-A<i>.txt, trace-B<i>.txt.
set -eu
if [ $# -lt 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
    echo "usage: bench/mixed-ab.sh FASTENSOR_A FASTENSOR_B [PAIRS] [ENGINES] (two executables)" >&2
    exit 2
fi
a=$1 b=$2 pairs=${3:-3} engines=${4:-posix,direct,auto}
out=${OUT:-.}
rm -f "$out/profile-A.txt" "$out/profile-B.txt"
for i in $(seq 1 "$pairs"); do
    for v in A B; do
        exe=$a
        [ $v = B ] && exe=$b
        trace=
        [ "${TRACE:-0}" = 1 ] && trace="$out/trace-$v$i.txt" && rm -f "$trace"
        if ! FASTENSOR_PROFILE="$out/profile-$v.txt" FASTENSOR_TRACE="$trace" "$exe" bench \
            --mixed --engine "$engines" > "$out/mixed-$v$i.txt" 2>&1; then
            echo "mixed-ab.sh: $exe bench --mixed failed:" >&2
            cat "$out/mixed-$v$i.txt" >&2
            exit 1
        fi
        printf '%s%d: ' $v "$i"
        awk '$1 == "auto" || $1 == "posix" || $1 == "direct" || $1 == "uring" {
                 printf "%s %s s (cold %s)  ", $1, $2, $6 }
             END { printf "\n" }' "$out/mixed-$v$i.txt"
    done
done
