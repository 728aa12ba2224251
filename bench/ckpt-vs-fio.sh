#!/usr/bin/env bash
# A >= 2 GiB checkpoint: fastensor save (durable: fdatasync + rename + directory fsync) and
# cold load against fio's best O_DIRECT write (fresh file, like a save) and cold read of the
# same bytes. Both durable: fio's write figure gets the time of an fdatasync run right after
# it; fastensor's save includes its fdatasync, rename and directory fsync. Interleaved,
# REPEAT times, medians.
# Usage: bench/ckpt-vs-fio.sh [DIR]   (env: SIZE=2G REPEAT=3 QDS="1 4 8")
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
FT=${FT:-$here/build/fastensor}
PY=/usr/bin/python3
DIR=${1:-$PWD}
SIZE=${SIZE:-2G}
REPEAT=${REPEAT:-3}
QDS=${QDS:-"1 4 8"}
command -v fio >/dev/null || { echo "fio is missing: apt-get install fio" >&2; exit 1; }
out=$(mktemp -d)
f="$DIR/fastensor-ckpt-fio.tmp"
trap 'rm -f "$f"; rm -rf "$out"' EXIT
drop() { sync; [ "$(id -u)" = 0 ] && echo 3 > /proc/sys/vm/drop_caches || true; }
. "$here/bench/lib.sh"
bw() { $PY -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(j[sys.argv[2]]["bw_bytes"]/1e9)' "$1" "$2"; }
for rep in $(seq "$REPEAT"); do
    for qd in $QDS; do
        rm -f "$f"; drop
        fio --name=w --filename="$f" --rw=write --bs=64M --size="$SIZE" --direct=1 \
            --ioengine=io_uring --iodepth="$qd" --output-format=json --output="$out/w.json" >/dev/null
        echo "fio write qd$qd $(durable_bw "$out/w.json" "$(stat -c %s "$f")" "$f")" >>"$out/res"
        drop
        fio --name=r --filename="$f" --rw=read --bs=64M --size="$SIZE" --direct=1 \
            --ioengine=io_uring --iodepth="$qd" --output-format=json --output="$out/r.json" >/dev/null
        echo "fio read qd$qd $(bw "$out/r.json" read)" >>"$out/res"
    done
    rm -f "$f"; drop
    "$FT" demo --size "$SIZE" --dir "$DIR" --json | grep '^{' >"$out/ft.json"
    $PY -c 'import json,sys
for l in open(sys.argv[1]):
    j=json.loads(l)
    if j["what"]=="fastensor":
        tag=j["op"]+"-"+j["engine"]+("+verify" if j.get("verify") else "")
        print("fastensor", tag, "-", j["bytes"]/j["seconds"]/1e9)' "$out/ft.json" >>"$out/res"
done
$PY - "$out/res" "$SIZE" "$REPEAT" <<'PYEOF'
import sys, statistics, collections
r = collections.defaultdict(list)
for line in open(sys.argv[1]):
    tool, op, cfg, v = line.split()
    r[(tool, op, cfg)].append(float(v))
m = {k: statistics.median(v) for k, v in r.items()}
fw = max(v for k, v in m.items() if k[0] == "fio" and k[1] == "write")
fr = max(v for k, v in m.items() if k[0] == "fio" and k[1] == "read")
print(f"# {sys.argv[2]} checkpoint vs fio (64M blocks, best queue depth), medians of {sys.argv[3]}\n")
print(f"fio best durable write {fw:.2f} GB/s (with fdatasync), best cold read {fr:.2f} GB/s\n")
print("| fastensor | GB/s | ratio to fio |")
print("|---|---|---|")
for k, v in sorted(m.items()):
    if k[0] == "fastensor":
        base = fw if k[1].startswith("save") else fr
        print(f"| {k[1]} | {v:.2f} | {v/base:.2f}x |")
PYEOF
