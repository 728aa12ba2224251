#!/usr/bin/env bash
# fio and `fastensor bench` side by side on the same file and block sizes.
#   cold reads and durable writes: fio O_DIRECT io_uring at its best queue depth vs every
#   fastensor engine; warm reads: fio psync with T jobs vs posix/mmap with T threads.
# Runs are interleaved and repeated (REPEAT, default 3); medians are compared. Writes are
# durable on both sides (fio's figure gets its fdatasync time added; fastensor bench times
# writes including fdatasync).
# Usage: bench/vs-fio.sh [FILE]   (env: SIZES="64M 1G" TOTAL=4G REPEAT=3 QDS="1 2 4 8")
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
FT=${FT:-$here/build/fastensor}
PY=/usr/bin/python3
FILE=${1:-$PWD/fastensor-vs-fio.tmp}
SIZES=${SIZES:-"64M 1G"}
TOTAL=${TOTAL:-4G}
REPEAT=${REPEAT:-3}
QDS=${QDS:-"1 2 4 8"}
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
. "$here/bench/lib.sh"
# Lay the file out once.
if [ "$(stat -c %s "$FILE" 2>/dev/null || echo 0)" -lt "$total_b" ]; then
    fio --name=layout --filename="$FILE" --rw=write --bs=64M --size="$TOTAL" --direct=1 \
        --ioengine=psync --output=/dev/null
fi
for rep in $(seq "$REPEAT"); do
    for bs in $SIZES; do
        bs_b=$(bytes "$bs")
        for qd in $QDS; do
            # keep fio's buffers (bs x depth) within 4 GiB
            [ $((bs_b * qd)) -gt $((4 << 30)) ] && continue
            for op in read write; do
                drop
                fio --name=f --filename="$FILE" --rw=$op --bs="$bs" --size="$TOTAL" --direct=1 \
                    --ioengine=io_uring --iodepth="$qd" --output-format=json \
                    --output="$out/fio.json" >/dev/null
                if [ $op = write ]; then
                    echo "fio $op $bs qd$qd $(durable_bw "$out/fio.json" "$total_b" "$FILE")" >>"$out/results"
                else
                    echo "fio $op $bs qd$qd $(fio_bw "$out/fio.json" $op)" >>"$out/results"
                fi
            done
        done
        for op in read write; do
            drop
            "$FT" bench --file "$FILE" \
                --engine "$ENGINES" --op $op --size "$bs" --total "$TOTAL" --cold --json \
                >"$out/ft.json"
            $PY -c 'import json,sys
for l in open(sys.argv[1]):
    j=json.loads(l); print("fastensor", j["op"], sys.argv[2], j["engine"], j["gbps"])' \
                "$out/ft.json" "$bs" >>"$out/results"
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
res = collections.defaultdict(list)
for line in open(sys.argv[1]):
    tool, op, bs, cfg, gbps = line.split()
    res[(tool, op, bs, cfg)].append(float(gbps))
med = {k: statistics.median(v) for k, v in res.items()}
print(f"# fio vs fastensor: {sys.argv[3]} per run, cold (caches dropped), medians of {sys.argv[2]} interleaved runs\n")
print("| op | block | fio best (O_DIRECT io_uring; writes + fdatasync) | engine | fastensor GB/s | ratio |")
print("|---|---|---|---|---|---|")
for op in ("read", "write"):
    for bs in sorted({k[2] for k in med}, key=lambda s: (len(s), s)):
        fio = {k[3]: v for k, v in med.items() if k[0] == "fio" and k[1] == op and k[2] == bs}
        if not fio:
            continue
        best_cfg = max(fio, key=fio.get)
        for k, v in sorted(med.items()):
            if k[0] == "fastensor" and k[1] == op and k[2] == bs:
                print(f"| {op} | {bs} | {fio[best_cfg]:.2f} ({best_cfg}) | {k[3]} | {v:.2f} | {v/fio[best_cfg]:.2f}x |")
print(f"\n# warm (page cache) reads, {sys.argv[4]} threads each\n")
print("| block | fio psync GB/s | engine | fastensor GB/s | ratio |")
print("|---|---|---|---|---|")
for k, v in sorted(med.items()):
    if k[0] == "ftwarm":
        f = med.get(("fiowarm", "read", k[2], f"psync{sys.argv[4]}"))
        if f:
            print(f"| {k[2]} | {f:.2f} | {k[3]} | {v:.2f} | {v/f:.2f}x |")
PYEOF
