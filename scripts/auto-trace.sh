#!/usr/bin/env bash
# Where AUTO's time goes against one fixed engine: tune, then fresh `fastensor bench`
# processes for AUTO and the engine in turn, every AUTO call traced (FASTENSOR_TRACE), and a
# per-key summary of the traces. Results under $OUT (default ./auto-trace-out).
#
#   scripts/auto-trace.sh [--memory host|cuda] [--engine posix] [--sizes 16M,256M,1G]
#                         [--rounds 3] [--tune-seconds 40] [--file PATH]
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-./auto-trace-out}
BUILD=${BUILD:-build}
MEM=host ENGINE=posix SIZES=16M,256M,1G ROUNDS=3 TUNE=40 FILE=./fastensor-auto-trace.tmp
while [ $# -gt 0 ]; do
    case $1 in
        --memory) MEM=$2; shift ;;
        --engine) ENGINE=$2; shift ;;
        --sizes) SIZES=$2; shift ;;
        --rounds) ROUNDS=$2; shift ;;
        --tune-seconds) TUNE=$2; shift ;;
        --file) FILE=$2; shift ;;
        -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
fastensor=$here/$BUILD/fastensor
mkdir -p "$OUT"
export FASTENSOR_PROFILE=${FASTENSOR_PROFILE:-$OUT/profile-$MEM.txt} FASTENSOR_QUIET=1
trap 'rm -f "$FILE" "$FILE.r"' EXIT
[ "$TUNE" -gt 0 ] && "$fastensor" tune --file "$FILE" --memory "$MEM" --seconds "$TUNE" >/dev/null
"$fastensor" profile show --file "$(dirname "$FILE")" >"$OUT/profile-$MEM-tuned.txt" 2>&1 || true
"$fastensor" bench --engine direct --op write --size 64M --total 1G --file "$FILE.r" >/dev/null
for r in $(seq 1 "$ROUNDS"); do
    for e in auto "$ENGINE"; do
        FASTENSOR_TRACE=$OUT/trace-$MEM-$e-$r.txt "$fastensor" bench --json --engine "$e" \
            --op read --memory "$MEM" --size "$SIZES" --total 1G --file "$FILE.r" |
            tee -a "$OUT/bench-$MEM.json"
    done
done
"$fastensor" profile show --file "$(dirname "$FILE")" >"$OUT/profile-$MEM-after.txt" 2>&1 || true
# per key and arm: calls, and the time they took (ms), over every traced AUTO call
cat "$OUT"/trace-"$MEM"-auto-*.txt | awk '{
        key = ""; ns = 0
        for (i = 1; i <= NF; i++) {
            if ($i ~ /^ns=/) { ns = substr($i, 4) }
            else if ($i !~ /^(bytes|inflight)=/ && $i != "sample" && $i != "first-use") key = key " " $i
        }
        n[key]++; t[key] += ns / 1e6
    } END { for (k in n) printf "%6d calls %10.1f ms %s\n", n[k], t[k], k }' |
    sort -k5 >"$OUT/trace-$MEM-summary.txt"
cat "$OUT/trace-$MEM-summary.txt"
