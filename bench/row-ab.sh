#!/usr/bin/env bash
# Two builds' AUTO on one `fastensor bench` measurement, taking turns with fixed engines, so
# that every figure of a round comes from the same stretch of the disk's speed:
#
#   bench/row-ab.sh FASTENSOR_A FASTENSOR_B ROUNDS ENGINES -- BENCH-ARGS...
#
# e.g. bench/row-ab.sh old/fastensor build/fastensor 8 posix,mmap -- --memory cuda
#      --op read --cold --size 4M --file /mnt/nvme/ab.bin
# BENCH-ARGS must name one measurement (one --op, one --size, --cold or --warm) and a --file
# that exists. Each round runs the ENGINES (fixed, with build A), then AUTO with A and AUTO
# with B, in an order drawn from the round's number. Each build's AUTO keeps a profile of its
# own from run to run (OUT/profile-A.txt, -B.txt; OUT defaults to .): a copy of the profile
# SEED_PROFILE when that is set, then `fastensor tune TUNE_ARGS` when TUNE_ARGS is set (e.g.
# "--file X --memory cuda --seconds 30"). TRACE=1 keeps B's AUTO calls in OUT/trace-B.txt
# (FASTENSOR_TRACE). Prints a line per round (GB/s), then the medians and the median over
# rounds of B's figure over A's.
set -eu
if [ $# -lt 6 ] || [ ! -x "$1" ] || [ ! -x "$2" ] || [ "$5" != -- ]; then
    echo "usage: bench/row-ab.sh FASTENSOR_A FASTENSOR_B ROUNDS ENGINES -- BENCH-ARGS..." >&2
    exit 2
fi
a=$1 b=$2 rounds=$3 engines=$4
shift 5
out=${OUT:-.}
mkdir -p "$out"
rm -f "$out/profile-A.txt" "$out/profile-B.txt" "$out/row-ab.json" "$out/trace-B.txt"
if [ -n "${SEED_PROFILE:-}" ]; then
    cp "$SEED_PROFILE" "$out/profile-A.txt"
    cp "$SEED_PROFILE" "$out/profile-B.txt"
fi
if [ -n "${TUNE_ARGS:-}" ]; then
    for v in A B; do
        exe=$a
        [ $v = B ] && exe=$b
        # shellcheck disable=SC2086 # TUNE_ARGS is a list of arguments
        FASTENSOR_PROFILE="$out/profile-$v.txt" "$exe" tune $TUNE_ARGS >/dev/null
    done
fi
gbps() { python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["gbps"])'; }
for r in $(seq 1 "$rounds"); do
    runs=$(echo "${engines//,/ } auto-A auto-B" | tr ' ' '\n' |
           python3 -c "import random,sys; l=sys.stdin.read().split(); random.Random($r).shuffle(l); print(' '.join(l))")
    line="r$r"
    for e in $runs; do
        case $e in
            auto-A) json=$(FASTENSOR_PROFILE="$out/profile-A.txt" "$a" bench --json --engine auto "$@") ;;
            auto-B) json=$(FASTENSOR_PROFILE="$out/profile-B.txt" FASTENSOR_TRACE=$([ "${TRACE:-0}" = 1 ] && echo "$out/trace-B.txt") \
                               "$b" bench --json --engine auto "$@") ;;
            *) json=$("$a" bench --json --engine "$e" "$@") ;;
        esac
        echo "$json" | sed "s/^{/{\"run\":\"$e\",\"round\":$r,/" >> "$out/row-ab.json"
        line="$line $e $(echo "$json" | gbps)"
    done
    echo "$line"
done
python3 - "$out/row-ab.json" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for m in runs:
    by.setdefault(m["run"], {})[m["round"]] = m["gbps"]
print("medians (GB/s): " + ", ".join("%s %.2f" % (k, statistics.median(v.values()))
                                      for k, v in sorted(by.items())))
pairs = [by["auto-B"][r] / by["auto-A"][r] for r in by["auto-A"] if r in by.get("auto-B", {})]
if pairs:
    print("B over A, paired by round: median %.2f (range %.2f-%.2f, %d rounds)"
          % (statistics.median(pairs), min(pairs), max(pairs), len(pairs)))
EOF
