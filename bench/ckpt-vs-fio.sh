#!/usr/bin/env bash
# A >= 2 GiB checkpoint on host memory: fastensor's durable save and cold load against fio's
# best O_DIRECT write (a fresh file, as a save makes) and cold read of the same bytes.
# Both durable: fio's writes end with an fsync inside its own clock (--end_fsync=1);
# fastensor's save includes its fdatasync, rename and directory fsync. Each fastensor run is
# a fresh process (numpy arrays with a GPT-style decoder's layer shapes, made and read once
# before the clock starts; a load goes into one buffer touched before the clock starts),
# paired with a fio run right before or after it (the order alternating); reported: medians
# and the median of the pairs' ratios (this VM's disk swings between fast and slow phases
# from one minute to the next).
# Usage: bench/ckpt-vs-fio.sh [DIR]
#   env: SIZE=2G REPEAT=6 QDS="1 4 8" SAVE_ENGINES=direct,auto LOAD_ENGINES=uring,auto
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
PY=/usr/bin/python3
DIR=${1:-$PWD}
SIZE=${SIZE:-2G}
REPEAT=${REPEAT:-6}
QDS=${QDS:-"1 4 8"}
SAVE_ENGINES=${SAVE_ENGINES:-direct,auto}
LOAD_ENGINES=${LOAD_ENGINES:-uring,auto}
command -v fio >/dev/null || { echo "fio is missing: apt-get install fio" >&2; exit 1; }
[ "$(id -u)" = 0 ] || echo "note: not root, so cold runs cannot drop the page cache" >&2
out=$(mktemp -d)
f="$DIR/fastensor-ckpt-fio.tmp"
ck="$DIR/fastensor-ckpt.safetensors"
trap 'rm -f "$f" "$ck"; rm -rf "$out"' EXIT
drop() { sync; [ "$(id -u)" = 0 ] && echo 3 > /proc/sys/vm/drop_caches || true; }
bw() { $PY -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(j[sys.argv[2]]["bw_bytes"]/1e9)' "$1" "$2"; }
fio_op() { # write|read qd -> GB/s (writes: a fresh file, durable)
    [ "$1" = write ] && rm -f "$f"
    drop
    fio --name=x --filename="$f" --rw="$1" --bs=64M --size="$SIZE" --direct=1 \
        --ioengine=io_uring --iodepth="$2" $([ "$1" = write ] && echo --end_fsync=1) \
        --output-format=json --output="$out/fio.json" >/dev/null
    bw "$out/fio.json" "$1"
}
ft_op() { # save|load engine -> GB/s, in a fresh process
    [ "$1" = save ] && rm -f "$ck"
    drop # as before fio's runs (a removed file's blocks are discarded by the next commit)
    PYTHONPATH="$here/python" $PY - "$1" "$2" "$ck" "$SIZE" <<'PYX'
import sys, time
import numpy as np
import fastensor.numpy as fnp
op, engine, path, size = sys.argv[1:5]
if op == "save":
    want = int(size[:-1]) << {"K": 10, "M": 20, "G": 30}[size[-1]] if size[-1] in "KMG" else int(size)
    d, arrays, n = 1024, {}, 0
    layer = [("attn.qkv.weight", (3 * d, d)), ("attn.qkv.bias", (3 * d,)),
             ("attn.proj.weight", (d, d)), ("attn.proj.bias", (d,)),
             ("ln1.weight", (d,)), ("ln1.bias", (d,)), ("mlp.fc1.weight", (4 * d, d)),
             ("mlp.fc1.bias", (4 * d,)), ("mlp.fc2.weight", (d, 4 * d)), ("mlp.fc2.bias", (d,)),
             ("ln2.weight", (d,)), ("ln2.bias", (d,))]
    arrays["wte.weight"] = np.full((50304, d), 0.5, dtype=np.float32)  # touched memory
    n += arrays["wte.weight"].nbytes
    i = 0
    while n < want:
        for name, shape in layer:
            a = np.full(shape, i + 0.25, dtype=np.float32)
            arrays[f"h.{i}.{name}"] = a
            n += a.nbytes
        i += 1
    # Read every array once before the clock, as a model's parameters have been read by the
    # step before a save. In this VM the first access after memory was populated through
    # huge pages (numpy madvises them for large arrays) runs ~10x slower than any later one
    # (2 GB/s vs 20, whatever reads it), which a fresh process's first reader would pay.
    for a in arrays.values():
        a.sum()
    t = time.perf_counter()
    fnp.save_file(arrays, path, engine=engine)
    dt = time.perf_counter() - t
else:  # into memory touched before the clock starts, as fio's buffers are (and as a
    # training job's are when it reloads): in this VM the first touch of fresh memory runs
    # at 0.2-0.7 GB/s and would be all one measured (fastensor.numpy.load_file allocates)
    from fastensor import _ckpt
    ck, tensors, _, shards = _ckpt.open_checkpoint(path)
    n = shards[0][1]
    buf = np.ones(n, dtype=np.uint8)
    buf.sum()  # (see the save: the first access after population is the slow one here)
    del ck
    t = time.perf_counter()
    ck, tensors, _, shards = _ckpt.open_checkpoint(path)
    _ckpt.load_shard(ck, 0, buf.ctypes.data, n, engine=engine)
    dt = time.perf_counter() - t
print(round(n / dt / 1e9, 4))
PYX
}
# fio's best queue depth per op: one calibration pass.
declare -A qd
for op in write read; do
    best=0
    for q in $QDS; do
        g=$(fio_op $op $q)
        echo "calib $op qd$q $g" >>"$out/res"
        if $PY -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$g" "$best"; then
            best=$g; qd[$op]=$q
        fi
    done
done
ft_op save direct >/dev/null # a checkpoint for the loads (and a warm-up)
for rep in $(seq "$REPEAT"); do
    for pair in $(for e in ${SAVE_ENGINES//,/ }; do echo save:$e; done) \
                $(for e in ${LOAD_ENGINES//,/ }; do echo load:$e; done); do
        op=${pair%%:*} eng=${pair#*:}
        fop=$([ $op = save ] && echo write || echo read)
        if [ $((rep % 2)) = 1 ]; then
            a=$(fio_op $fop ${qd[$fop]}); b=$(ft_op $op $eng)
        else
            b=$(ft_op $op $eng); a=$(fio_op $fop ${qd[$fop]})
        fi
        echo "pair $op $eng qd${qd[$fop]} $a $b" >>"$out/res"
    done
done
$PY - "$out/res" "$SIZE" "$REPEAT" <<'PYEOF'
import sys, statistics, collections
pairs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    w = line.split()
    if w[0] == "pair":
        pairs[(w[1], w[2], w[3])].append((float(w[4]), float(w[5])))
med = statistics.median
print(f"# {sys.argv[2]} checkpoint (host memory) vs fio on the same bytes, {sys.argv[3]} pairs each\n")
print("fio: 64M blocks, O_DIRECT io_uring at its best queue depth; writes to a fresh file, ending with fsync (--end_fsync=1).")
print("fastensor: save = durable (fdatasync, rename, directory fsync); load = cold.\n")
print("| fastensor | engine | fio GB/s (median) | fastensor GB/s (median) | ratio (median of pairs) | pair ratios |")
print("|---|---|---|---|---|---|")
for (op, eng, qd), v in sorted(pairs.items()):
    rs = sorted(b / a for a, b in v)
    print(f"| {op} | {eng} | {med([a for a, b in v]):.2f} ({qd}) | {med([b for a, b in v]):.2f} | "
          f"{med(rs):.2f}x | {rs[0]:.2f}-{rs[-1]:.2f} |")
print("\nPairs (fio GB/s, fastensor GB/s), in the order run:\n")
for (op, eng, qd), v in sorted(pairs.items()):
    print(f"- {op} {eng}: " + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in v))
PYEOF
