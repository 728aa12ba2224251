#!/usr/bin/env bash
# fio and `fastensor bench` side by side on the same file and block sizes.
#   cold reads and durable writes: fio O_DIRECT io_uring at its best queue depth vs every
#   fastensor engine; warm reads: fio psync with T jobs vs posix/mmap with T threads.
# fio's best queue depth is found once, by one calibration pass; fastensor runs with as many
# requests in flight (--inflight) as fio's best depth, or, with INFLIGHTS="1 2 4 8", at its
# own best found by a calibration pass of its own (single passes swing up to 3x on these
# disks, so the default leaves only one choice to chance). Then each fastensor run is paired
# with a fio run (alternating which goes first) REPEAT times (default 3), and the median of
# the pairs' ratios is reported: the disks we run on swing between fast and slow phases.
# Writes are durable on both sides (fio's writes end with an fsync inside its clock,
# --end_fsync=1; fastensor bench times writes including fdatasync).
# Usage: bench/vs-fio.sh [FILE]
#   env: SIZES="64M 1G" TOTAL=4G REPEAT=3 QDS="1 2 4 8" INFLIGHTS=fio ENGINES=...
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
FT=${FT:-$here/build/fastensor}
PY=/usr/bin/python3
FILE=${1:-$PWD/fastensor-vs-fio.tmp}
SIZES=${SIZES:-"64M 1G"}
TOTAL=${TOTAL:-4G}
REPEAT=${REPEAT:-3}
QDS=${QDS:-"1 2 4 8"}
INFLIGHTS=${INFLIGHTS:-fio}
THREADS=${THREADS:-$(nproc)}
ENGINES=${ENGINES:-posix,direct,uring,mmap}
command -v fio >/dev/null || { echo "fio is missing: apt-get install fio" >&2; exit 1; }
[ -x "$FT" ] || { echo "build first: make" >&2; exit 1; }
[ "$(id -u)" = 0 ] || echo "note: not root, so cold runs cannot drop the page cache" >&2
created=0
[ -e "$FILE" ] || created=1
cleanup() { [ $created = 1 ] && rm -f "$FILE"; }
trap cleanup EXIT
out=$(mktemp -d)
drop() { sync; [ "$(id -u)" = 0 ] && echo 3 > /proc/sys/vm/drop_caches || true; }
bytes() { $PY -c "import sys; s=sys.argv[1]; m={'K':10,'M':20,'G':30}; print(int(s[:-1])<<m[s[-1]] if s[-1] in m else int(s))" "$1"; }
total_b=$(bytes "$TOTAL")
fio_bw() { # prints GB/s of the job's read or write
    $PY -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"]; op=sys.argv[2]
print(round(sum(x[op]["bw_bytes"] for x in j)/1e9, 4))' "$1" "$2"
}
# Lay the file out once.
if [ "$(stat -c %s "$FILE" 2>/dev/null || echo 0)" -lt "$total_b" ]; then
    fio --name=layout --filename="$FILE" --rw=write --bs=64M --size="$TOTAL" --direct=1 \
        --ioengine=psync --output=/dev/null
fi
fio_run() { # op bs qd -> GB/s (durable for writes)
    drop
    fio --name=f --filename="$FILE" --rw=$1 --bs="$2" --size="$TOTAL" --direct=1 \
        --ioengine=io_uring --iodepth="$3" $([ $1 = write ] && echo --end_fsync=1) \
        --output-format=json --output="$out/fio.json" >/dev/null
    fio_bw "$out/fio.json" $1
}
ft_run() { # op bs engine inflight -> GB/s
    drop
    "$FT" bench --file "$FILE" --engine "$3" --op $1 --size "$2" --total "$TOTAL" --cold \
        --inflight "$4" --json \
        | $PY -c 'import json,sys; print(json.loads(sys.stdin.readline())["gbps"])'
}
better() { $PY -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$1" "$2"; }
# fio's best queue depth per (op, block): one calibration pass.
declare -A bestqd bestin
for bs in $SIZES; do
    bs_b=$(bytes "$bs")
    for op in read write; do
        best=0
        for qd in $QDS; do
            [ $((bs_b * qd)) -gt $((4 << 30)) ] && continue # fio's buffers within 4 GiB
            g=$(fio_run $op "$bs" "$qd")
            echo "calib $op $bs qd$qd $g" >>"$out/results"
            if better "$g" "$best"; then best=$g; bestqd[$op$bs]=$qd; fi
        done
        for eng in ${ENGINES//,/ }; do # fastensor's own queue depth, the same way
            if [ "$INFLIGHTS" = fio ]; then bestin[$op$bs$eng]=${bestqd[$op$bs]}; continue; fi
            best=0
            for n in $INFLIGHTS; do
                [ $((bs_b * n)) -gt $((4 << 30)) ] && continue
                g=$(ft_run $op "$bs" "$eng" "$n")
                echo "calib $op $bs $eng inflight$n $g" >>"$out/results"
                if better "$g" "$best"; then best=$g; bestin[$op$bs$eng]=$n; fi
            done
        done
    done
done
# The disk swings between fast and slow phases, so each fastensor run is paired with a fio
# run (best queue depth) right before or after it, the order alternating, and the median of
# the pairs' ratios is reported.
for rep in $(seq "$REPEAT"); do
    for bs in $SIZES; do
        for op in read write; do
            qd=${bestqd[$op$bs]}
            for eng in ${ENGINES//,/ }; do
                n=${bestin[$op$bs$eng]}
                if [ $((rep % 2)) = 1 ]; then
                    f=$(fio_run $op "$bs" "$qd"); g=$(ft_run $op "$bs" "$eng" "$n")
                else
                    g=$(ft_run $op "$bs" "$eng" "$n"); f=$(fio_run $op "$bs" "$qd")
                fi
                echo "pair $op $bs $eng/$n qd$qd $f $g" >>"$out/results"
            done
        done
        # warm: fio psync with THREADS jobs over slices vs fastensor with THREADS threads
        # (THREADS-1 pool workers + the calling thread)
        cat "$FILE" >/dev/null
        slice=$((total_b / THREADS))
        fio --name=w --filename="$FILE" --rw=read --bs="$bs" --size=$slice --numjobs="$THREADS" \
            --offset_increment=$slice --invalidate=0 --ioengine=psync --group_reporting --output-format=json \
            --output="$out/fio.json" >/dev/null 2>&1 || true
        echo "fiowarm read $bs psync$THREADS $(fio_bw "$out/fio.json" read)" >>"$out/results"
        FASTENSOR_THREADS=$((THREADS > 1 ? THREADS - 1 : 1)) "$FT" bench --file "$FILE" \
            --engine posix,mmap --op read --size "$bs" --total "$TOTAL" --warm --json >"$out/ft.json"
        $PY -c 'import json,sys
for l in open(sys.argv[1]):
    j=json.loads(l); print("ftwarm", j["op"], sys.argv[2], j["engine"], j["gbps"])' \
            "$out/ft.json" "$bs" >>"$out/results"
    done
done
$PY - "$out/results" "$REPEAT" "$TOTAL" "$THREADS" <<'PYEOF'
import sys, statistics, collections
pairs = collections.defaultdict(list)
warm = collections.defaultdict(list)
for line in open(sys.argv[1]):
    w = line.split()
    if w[0] == "pair":
        _, op, bs, eng, qd, f, g = w
        pairs[(op, bs, eng, qd)].append((float(f), float(g)))
    elif w[0] in ("fiowarm", "ftwarm"):
        warm[(w[0], w[2], w[3])].append(float(w[4]))
med = statistics.median
print(f"# fio vs fastensor: {sys.argv[3]} per run, cold (caches dropped), {sys.argv[2]} pairs each\n")
print("Each fastensor run (with N requests in flight, shown as engine/N) is paired with a fio run at")
print("fio's best queue depth (O_DIRECT io_uring; writes end with fsync) right before or after it;")
print("the ratio is the median of the pairs' ratios.\n")
print("| op | block | engine | fio GB/s (median) | fastensor GB/s (median) | ratio (median of pairs) |")
print("|---|---|---|---|---|---|")
order = lambda s: (len(s), s)
for (op, bs, eng, qd), v in sorted(pairs.items(), key=lambda kv: (kv[0][0], order(kv[0][1]), kv[0][2])):
    print(f"| {op} | {bs} | {eng} | {med([f for f, g in v]):.2f} ({qd}) | {med([g for f, g in v]):.2f} | "
          f"{med([g / f for f, g in v]):.2f}x |")
print(f"\n# warm (page cache) reads, {sys.argv[4]} threads each\n")
print("| block | fio psync GB/s | engine | fastensor GB/s | ratio |")
print("|---|---|---|---|---|")
for (tool, bs, eng), v in sorted(warm.items()):
    if tool == "ftwarm":
        f = warm.get(("fiowarm", bs, f"psync{sys.argv[4]}"))
        if f:
            print(f"| {bs} | {med(f):.2f} | {eng} | {med(v):.2f} | {med(v) / med(f):.2f}x |")
PYEOF
