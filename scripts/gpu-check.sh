#!/usr/bin/env bash
# The GPU machine check, in one call: info, the C test suite (GPU tests included), the
# Python tests (CUDA included), and the GPU benchmarks, with logs and JSON under $OUT.
#
#   scripts/gpu-check.sh [--udev] [--quick] [--no-bench] [--no-tests] [--auto] [--offload]
#                        [--fio] [--ckpt] [--scenarios] [--dropin] [--dma] [--dcp] [--codec]
#                        [--peers] [--optim] [--pack]
#
# The GPU machine has no -dev packages, so by default it runs what was built on the
# development machine and carried along: `make BUILD=gpubuild all tests python` there, then
# carry gpubuild and python/fastensor/_C.abi3.so (the extension is on the stable ABI).
# --auto: AUTO against every fixed engine (bench/auto-vs-fixed.py: tune, then interleaved
#         rounds; CUDA and host memory, or those in FT_AUTO_MEMS), the mixed workload and
#         AUTO's decision overhead.
# --offload: the activation-offload benchmark (bench/offload.py: torchvision ViT-B/16,
#         transformers BERT-base and GPT-2 from their configs, under a GPU memory cap:
#         largest batch, bitwise gradients, step times against save_on_cpu and torch.save
#         hooks; FT_OFFLOAD_MODELS, FT_OFFLOAD_ARGS, FT_OFFLOAD_TIMEOUT (540 s)).
# --optim: optimizer-state offload: tests/python/test_optim.py and test_stream.py (CUDA
#         cases), then bench/optim.py (ViT-B/16 largest batch with activations + states
#         offloaded, and with the parameters streamed too, under a 3 GiB cap, bitwise steps; a Llama-style 1.6 B model under a 12 GiB cap against
#         torchao's CPUOffloadOptimizer and DeepSpeed ZeRO-Offload, installed from
#         .peers/wheels; DeepSpeed's CPU Adam is built at its first use, kept in
#         $WORK/torch-extensions); FT_OPTIM_ARGS, FT_OPTIM_TIMEOUT (480 s), FT_OPTIM_TESTS=0
#         skips the tests (a second call of the benchmark alone).
# --fio: fio against `fastensor bench` on this machine's disk (bench/vs-fio.sh: 64M blocks,
#         cold reads and durable writes, host memory; FT_FIO_SIZES, FT_FIO_REPEAT). The GPU
#         machine has no fio: scripts/build-fio.sh builds one into $BUILD/extra/ to carry
#         (or FT_FIO=path). With fio on PATH, compare.py adds fio's ceiling to its table.
# --ckpt: only the checkpoint comparison (compare.py, CUDA, ViT-H/14; engines
#         FT_COMPARE_ENGINES, default auto,uring,cufile; FT_COMPARE_REPEAT rounds, default 3),
#         after `fastensor tune --memory cuda --seconds $FT_TUNE_SECONDS` when that is set
#         (--auto tunes for $FT_TUNE_SECONDS too, default 60; FT_AUTO_TRACE=1 traces AUTO's
#         calls (and the mixed workload's: trace-mixed.txt), which costs its rows a few
#         percent: a line written per call;
#         FT_AUTO_MEMS: memory kinds, default "cuda host"; FT_AUTO_SIZES: block sizes,
#         default 16M,256M,1G; FT_AUTO_ROUNDS, default 3;
#         FT_AUTO_MIXED=0 skips the mixed workload; FT_AUTO_TWINS=1 runs every fixed engine
#         twice, the noise floor of the comparison).
#         (--no-bench runs neither.)
# --scenarios: only the scenario benchmark (bench/scenarios.py: fresh processes, interleaved
#         rounds; FT_SCEN_DEVICE cuda or cpu (cuda), FT_SCEN_SIZE (2G), FT_SCEN_ROUNDS (3),
#         FT_SCEN_TOOLS (fastensor,safetensors,torch,raw), FT_SCEN_LIST
#         (save,cold,repeat2,repeat3,procs), FT_SCEN_LIMIT seconds before the last round starts
#         (400), FT_SCEN_BASE: a built checkout of another commit for a paired comparison,
#         scenarios.py --base); JSON in $OUT/scenarios-<device>.json, then the decision overhead.
# --dropin: only the drop-in tests on CUDA (test_dropin.py's safe_open and save_file_async
#         cases), then the drop-in benchmark (bench/dropin.py: get_tensor of every tensor through
#         one safe_open into CUDA against load_file and safetensors, fresh processes, warm
#         file; save_file_async's blocked time against the device-to-pinned copy;
#         FT_DROPIN_SIZE (2G)); JSON in $OUT/dropin-cuda.json.
# --dma: only test_gpu, the Python tests, reads from the page cache into GPU memory by
#         every engine that can (fastensor bench --warm, 256 MiB to 4 GiB calls), then the
#         drop-in benchmark (FT_DMA_WARM=0 leaves the page-cache reads out).
# --dcp: only the DCP storage layer: tests/python/test_dcp.py (CUDA state dicts included;
#         FT_DCP_TESTS: a pytest -k expression to run only some),
#         then the dcp-save, dcp-load and dcp-async scenarios (bench/scenarios.py, one rank
#         per GPU, FT_DCP_LIST (dcp-save,dcp-load,dcp-async), FT_DCP_RANKS (the GPUs),
#         FT_DCP_SIZE (2G), FT_DCP_ROUNDS (3), FT_DCP_LIMIT
#         seconds before the last round starts (300), FT_DCP_TOOLS (fastensor,dcp,raw; add
#         fastensor-fst for compressed .fst data files), FT_DCP_DATA (random, or weights:
#         weights-like bf16, what the codec compresses)); JSON in $OUT/dcp-cuda.json.
# --codec: only the tensor codec: test_gpu's codec cases (the GPU decoder against the source
#         bytes, the GPU encoder against the CPU encoder's bytes) and its "coded ahead" case
#         (streams coded ahead on the GPU, packed: the coding save's file),
#         tests/python/test_fst.py (CUDA loads), then bench/codec.py --device cuda (a bf16
#         Llama-style state dict of FT_CODEC_SIZE (2G), then FT_CODEC_MODELS (gpt2-fp32):
#         ratio, encode and decode GB/s on the CPUs, GPU decode and encode GB/s, durable save and cold
#         load into GPU memory against the raw read and safetensors, FT_CODEC_ROUNDS (3),
#         GPU decode of streams coded in blocks of FT_CODEC_BLOCKS (256K,512K));
#         JSON in $OUT/codec.json; then bench/fst-save.py (the .fst save of a state dict in GPU
#         memory against a plain one, FT_FST_ROUNDS (5), in $OUT/fst-save.txt; GPT-2 fp32 in
#         $OUT/fst-save-fp32.txt; the bf16 one with the streams stored, in
#         $OUT/fst-save-stored.txt); then test_dcp.py's CUDA and coded-staging cases and
#         bench/async-stage.py (DCP async saves staged as coded streams against plain ones,
#         $OUT/async-stage.txt and .json).
# --peers: only the peer loaders (bench/peers.py: fastensor beside safetensors, fastsafetensors,
#         InstantTensor and the Run:ai streamer, fresh processes, every load fingerprinted),
#         the peers installed from .peers/wheels (scripts/fetch-peers.sh there; carry
#         .peers/wheels); FT_PEERS_SIZE (4G), FT_PEERS_ROWS (cold,warm,restart,procs),
#         FT_PEERS_TOOLS (all), FT_PEERS_ROUNDS (3), FT_PEERS_SHARDED (none: a sharded
#         directory's size, in FT_PEERS_SHARD (5G) shards), FT_PEERS_SWEEP=1 tries each peer's
#         settings first, FT_PEERS_LIMIT seconds before the last round starts (420); FT_COMMIT:
#         the commit that runs (the copy's git metadata is stale there);
#         JSON in $OUT/peers-cuda.json.
# --pack: leave one archive, $OUT/results.tgz, instead of the separate logs.
# FT_GPU_PYTEST_ARGS: more arguments for the Python tests' pytest (--deselect ...).
# --udev: ONLY on a throwaway test VM: create the udev entry cuFile needs for the block
#         device holding this directory (/run/udev/data/b<major>:<minor>), see DESIGN.md.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
OUT=${OUT:-$here/gpu-out}
BUILD=${BUILD:-gpubuild}
UDEV=0 QUICK=0 BENCH=1 TESTS=1 AUTO=0 OFFLOAD=0 PACK=0 FIO=0 CKPT=0 SCEN=0 DROPIN=0 DMA=0 DCP=0 CODEC=0
PEERS=0 OPTIM=0
for a in "$@"; do
    case $a in
        --udev) UDEV=1 ;;
        --quick) QUICK=1 ;;
        --no-bench) BENCH=0 ;;
        --no-tests) TESTS=0 ;;
        --auto) AUTO=1 ;;
        --offload) OFFLOAD=1 ;;
        --pack) PACK=1 ;;
        --fio) FIO=1 ;;
        --ckpt) CKPT=1 ;;
        --scenarios) SCEN=1 BENCH=0 TESTS=0 ;;
        --peers) PEERS=1 BENCH=0 TESTS=0 ;;
        --optim) OPTIM=1 BENCH=0 TESTS=0 ;;
        --dropin) DROPIN=1 BENCH=0 TESTS=0 ;;
        --dma) DMA=1 DROPIN=1 BENCH=0 TESTS=0 ;;
        --dcp) DCP=1 BENCH=0 TESTS=0 ;;
        --codec) CODEC=1 BENCH=0 TESTS=0 ;;
        -h|--help) sed -n '2,/^set -u$/{/^set -u$/!p}' "$0"; exit 0 ;;
        *) echo "unknown option $a" >&2; exit 2 ;;
    esac
done
mkdir -p "$OUT"
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
export FASTENSOR_PROFILE=${FASTENSOR_PROFILE:-$OUT/profile.txt}
export FASTENSOR_QUIET=1
WORK=${FT_GPU_WORK:-$here/gpu-work}
mkdir -p "$WORK"

log "machine: $(uname -r), $(nproc) CPUs, $(free -g | awk '/Mem:/{print $2}') GiB"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$OUT/summary.txt"

if [ $UDEV = 1 ]; then
    dev=$(stat -c '%d' "$WORK")
    maj=$((dev >> 8 & 0xfff)) min=$(( (dev & 0xff) | (dev >> 12 & 0xfff00) ))
    fstype=$(stat -f -c %T "$WORK")
    [ "$fstype" = ext2/ext3 ] && fstype=ext4
    mkdir -p /run/udev/data
    if [ ! -e "/run/udev/data/b$maj:$min" ]; then
        printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\n' "$fstype" > "/run/udev/data/b$maj:$min"
        log "created /run/udev/data/b$maj:$min for cuFile ($fstype) -- test VM only"
    fi
fi

if [ ! -x "$BUILD/fastensor" ]; then
    log "no carried build in $BUILD: building here"
    make BUILD="$BUILD" all tests >"$OUT/build.log" 2>&1 || { log "build failed (see build.log)"; exit 1; }
fi
"$BUILD/fastensor" info --path "$WORK" | tee "$OUT/info.txt"
# fio for --fio and for compare.py's ceiling: this machine's, or one carried in $BUILD/extra/
# the package runs the command-line tool from fastensor/_bin (`python -m fastensor convert`):
# the carried build's, where the carried extension came without it
if [ ! -x python/fastensor/_bin/fastensor ] && [ -x "$BUILD/fastensor" ]; then
    mkdir -p python/fastensor/_bin && cp "$BUILD/fastensor" python/fastensor/_bin/fastensor
fi
fio_bin=${FT_FIO:-$(command -v fio || echo "$here/$BUILD/extra/fio")}
if [ -x "$fio_bin" ]; then
    mkdir -p "$WORK/fio-bin" && ln -sf "$fio_bin" "$WORK/fio-bin/fio"
    export PATH="$WORK/fio-bin:$PATH"
fi

if [ $TESTS = 1 ]; then
    log "C tests (GPU suite included)"
    [ $QUICK = 1 ] && export FT_TEST_QUICK=1
    FT_NO_PYTEST=1 FT_TEST_DIR="$WORK/tests" BUILD="$BUILD" timeout 900 tests/run.sh 2>&1 | tee "$OUT/tests.log" | tail -12
    cp "$WORK"/tests/test_gpu.log "$OUT/test_gpu.log" 2>/dev/null
    log "Python tests (torch $(python3 -c 'import torch; print(torch.__version__)' 2>&1))"
    # shellcheck disable=SC2086  (FT_GPU_PYTEST_ARGS: more pytest arguments, e.g. --deselect)
    PYTHONPATH="$here/python" FT_TEST_DIR="$WORK/py" timeout 600 python3 -m pytest -q -rs \
        tests/python ${FT_GPU_PYTEST_ARGS:-} 2>&1 | tee "$OUT/pytest.log" | tail -8
fi

if [ $FIO = 1 ]; then
    if command -v fio >/dev/null; then
        log "fio $(fio --version) vs fastensor bench: host memory, 4 GiB, cold reads, durable writes"
        FT="$here/$BUILD/fastensor" SIZES="${FT_FIO_SIZES:-64M}" TOTAL=4G \
            REPEAT=${FT_FIO_REPEAT:-2} QDS="4 16" INFLIGHTS="4 16" ENGINES=direct,uring \
            timeout 400 bash bench/vs-fio.sh "$WORK/vsfio.bin" 2>&1 | tee "$OUT/vs-fio.md"
    else
        log "--fio: no fio binary (scripts/build-fio.sh builds one into $BUILD/extra/)"
    fi
fi
compare_ckpt() {
    if [ -n "${FT_TUNE_SECONDS:-}" ]; then
        log "fastensor tune --memory cuda --seconds $FT_TUNE_SECONDS"
        "$BUILD/fastensor" tune --file "$WORK/tune.bin" --memory cuda --seconds "$FT_TUNE_SECONDS" \
            >"$OUT/tune.log" 2>&1; rm -f "$WORK/tune.bin"
    fi
    log "checkpoints: fastensor vs torch vs safetensors, CUDA tensors (ViT-H/14, 2.5 GB)"
    PYTHONPATH="$here/python" timeout 500 python3 bench/compare.py --device cuda --models vit-h14 \
        --dir "$WORK" --engines "${FT_COMPARE_ENGINES:-auto,uring,cufile}" --skip numpy \
        --repeat "${FT_COMPARE_REPEAT:-3}" \
        --json "$OUT/compare.json" 2>&1 | tee "$OUT/compare.md" | tail -30
}
if [ $BENCH = 1 ] && [ $CKPT = 1 ]; then
    compare_ckpt
elif [ $BENCH = 1 ]; then
    F="$WORK/bench.bin"
    SZ=${FT_GPU_BENCH_TOTAL:-4G}
    log "raw O_DIRECT ceiling: 16M blocks, 1..16 in flight, host memory, $SZ cold"
    for q in 1 2 4 8 16; do
        "$BUILD/fastensor" bench --file "$F" --engine direct --size 16M --total "$SZ" --cold \
            --inflight $q --json | sed "s/}\$/,\"inflight\":$q}/"
    done | tee "$OUT/ceiling.json"
    log "file <-> GPU, cold, 4 GiB, 1 GiB and 256 MiB blocks, every engine"
    "$BUILD/fastensor" bench --file "$F" --memory cuda --engine posix,direct,uring,mmap,cufile,auto \
        --size 256M,1G --total "$SZ" --cold --json | tee "$OUT/gpu-cold.json"
    log "single cuFileRead/cuFileWrite calls of 1 GiB (no splitting), cold"
    FASTENSOR_CHUNK_SIZE=1G "$BUILD/fastensor" bench --file "$F" --memory cuda --engine cufile \
        --size 1G --total "$SZ" --cold --inflight 1 --json | tee "$OUT/cufile-single.json"
    log "page cache -> GPU, warm, 4 GiB"
    "$BUILD/fastensor" bench --file "$F" --memory cuda --engine posix,mmap,cachedma,auto \
        --op read --size 1G,4G --total "$SZ" --warm --json | tee "$OUT/gpu-warm.json"
    log "small transfers into GPU memory, 256 MiB cold: 16 async requests in flight, batches of 64, cuFile's batch API"
    for bs in 64K 1M; do
        for mode in "--inflight 16" "--batch 64"; do
            "$BUILD/fastensor" bench --file "$F" --memory cuda --engine cufile,posix,direct \
                --size $bs --total 256M --cold $mode --json | sed "s/}\$/,\"mode\":\"${mode#--}\"}/"
        done
        FASTENSOR_CUFILE_BATCH=1 "$BUILD/fastensor" bench --file "$F" --memory cuda --engine cufile \
            --size $bs --total 256M --cold --batch 64 --json | sed 's/}$/,"mode":"cuFile batch API 64"}/'
    done | tee "$OUT/gpu-small.json"
    rm -f "$F"
    [ $QUICK = 0 ] && compare_ckpt
fi
if [ $PEERS = 1 ]; then
    site="$WORK/peers-site"
    if ls .peers/wheels/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" .peers/wheels/*.whl 2>&1 | tail -3
    else
        log "--peers: no wheels in .peers/wheels (scripts/fetch-peers.sh, then carry .peers/wheels)"
    fi
    log "peer loaders: ${FT_PEERS_SIZE:-4G} bf16, CUDA, fresh processes"
    # shellcheck disable=SC2046  (the optional arguments split on purpose)
    PEERS_SITE="$site" PYTHONPATH="$here/python" PYTHONUNBUFFERED=1 python3 bench/peers.py \
        --device cuda --size "${FT_PEERS_SIZE:-4G}" --rounds "${FT_PEERS_ROUNDS:-3}" \
        --dir "$WORK" --rows "${FT_PEERS_ROWS:-cold,warm,restart,procs}" \
        --tools "${FT_PEERS_TOOLS:-fastensor,fastensor-twin,fastensor-bypass,fastensor-open,safetensors,safetensors-open,fastsafetensors,instanttensor,runai,raw}" \
        ${FT_PEERS_SHARDED:+--sharded-size "$FT_PEERS_SHARDED" --shard "${FT_PEERS_SHARD:-5G}"} \
        $( [ "${FT_PEERS_SWEEP:-0}" = 1 ] && echo --sweep) --time-limit "${FT_PEERS_LIMIT:-420}" \
        --json "$OUT/peers-cuda.json" 2>"$OUT/peers-cuda.log" | tee "$OUT/peers-cuda.txt" |
        grep -v '^round \|^sweep ' | tee -a "$OUT/summary.txt"
fi

if [ $SCEN = 1 ]; then
    dev=${FT_SCEN_DEVICE:-cuda}
    log "scenario benchmark: ${FT_SCEN_SIZE:-2G} bf16, device $dev, fresh processes"
    PYTHONPATH="$here/python" BUILD="$BUILD" python3 bench/scenarios.py --device "$dev" \
        --size "${FT_SCEN_SIZE:-2G}" --rounds "${FT_SCEN_ROUNDS:-3}" --dir "$WORK" \
        --tools "${FT_SCEN_TOOLS:-fastensor,safetensors,torch,raw}" \
        --scenarios "${FT_SCEN_LIST:-save,cold,repeat2,repeat3,procs}" \
        --time-limit "${FT_SCEN_LIMIT:-400}" ${FT_SCEN_BASE:+--base "$FT_SCEN_BASE"} --json "$OUT/scenarios-$dev.json" 2>"$OUT/scenarios-$dev.log" \
        | tee -a "$OUT/summary.txt"
    (cd "$WORK" && "$here/$BUILD/fastensor" bench --overhead) | tee -a "$OUT/summary.txt"
fi
if [ $DMA = 1 ]; then
    log "test_gpu"
    mkdir -p "$WORK/tests"
    FT_TEST_DIR="$WORK/tests" timeout 400 "$BUILD/tests/test_gpu" >"$OUT/test_gpu.log" 2>&1
    echo "test_gpu rc=$?" | tee -a "$OUT/summary.txt"
    grep -E "^FAIL|note:" "$OUT/test_gpu.log" | head -20 | tee -a "$OUT/summary.txt"
    log "Python tests (torch $(python3 -c 'import torch; print(torch.__version__)' 2>&1))"
    PYTHONPATH="$here/python" FT_TEST_DIR="$WORK/py" timeout 400 python3 -m pytest -q -rs \
        tests/python 2>&1 | tee "$OUT/pytest.log" | tail -8 | tee -a "$OUT/summary.txt"
    if [ "${FT_DMA_WARM:-1}" = 1 ]; then
        F="$WORK/dma.bin"
        log "page cache -> GPU, warm, 4 GiB: every engine that reads cached data"
        "$BUILD/fastensor" bench --file "$F" --memory cuda --engine posix,mmap,cachedma,auto \
            --op read --size 256M,1G,4G --total 4G --warm --json | tee "$OUT/gpu-warm.json" |
            tee -a "$OUT/summary.txt"
        rm -f "$F"
    fi
fi
if [ $DROPIN = 1 ]; then
    log "drop-in tests on CUDA (safe_open read-ahead windows, save_file_async snapshots)"
    PYTHONPATH="$here/python" FT_TEST_DIR="$WORK/py" timeout 180 python3 -m pytest -q -rs \
        -p no:logging tests/python/test_dropin.py -k "safe_open or async" 2>&1 | tail -6 |
        tee -a "$OUT/summary.txt"
    log "drop-in calls: safe_open get_tensor loop vs load_file, save_file_async blocked time"
    PYTHONPATH="$here/python" timeout 500 python3 bench/dropin.py --device cuda \
        --size "${FT_DROPIN_SIZE:-2G}" --rounds 3 --dir "$WORK" --json "$OUT/dropin-cuda.json" \
        2>"$OUT/dropin-cuda.log" | tee -a "$OUT/summary.txt"
fi
if [ $AUTO = 1 ]; then
    F="$WORK/auto.bin"
    for mem in ${FT_AUTO_MEMS:-cuda host}; do
        log "AUTO vs every fixed engine, $mem memory: tune, then interleaved rounds of fastensor bench"
        python3 bench/auto-vs-fixed.py --fastensor "$BUILD/fastensor" --file "$F" \
            --memory $mem --sizes ${FT_AUTO_SIZES:-16M,256M,1G} --total 1G \
            --rounds ${FT_AUTO_ROUNDS:-3} \
            --engines posix,direct,uring,mmap$([ $mem = cuda ] && echo ,cufile) \
            --tune-seconds ${FT_TUNE_SECONDS:-60} --json "$OUT/auto-$mem.json" \
            $([ "${FT_AUTO_TRACE:-0}" = 1 ] && echo --trace "$OUT/trace-$mem.txt") \
            $([ "${FT_AUTO_TWINS:-0}" = 1 ] && echo --twins) 2>"$OUT/auto-$mem.err" \
            | tee -a "$OUT/summary.txt"
    done
    rm -f "$F"
    if [ "${FT_AUTO_MIXED:-1}" = 1 ]; then
        log "AUTO: the seeded mixed workload (host memory)"
        (cd "$WORK" && if [ "${FT_AUTO_TRACE:-0}" = 1 ]; then
            export FASTENSOR_TRACE="$OUT/trace-mixed.txt"; rm -f "$FASTENSOR_TRACE"; fi
         "$here/$BUILD/fastensor" bench --mixed --engine posix,direct,uring,auto) \
            | tee -a "$OUT/summary.txt"
    fi
    (cd "$WORK" && "$here/$BUILD/fastensor" bench --overhead) | tee -a "$OUT/summary.txt"
fi
if [ $OFFLOAD = 1 ]; then
    log "activation offload: ${FT_OFFLOAD_MODELS:-vit_b_16,bert,gpt2} under a memory cap, step times"
    mkdir -p "$WORK/spill"
    PYTHONPATH="$here/python" timeout ${FT_OFFLOAD_TIMEOUT:-540} python3 bench/offload.py \
        --models "${FT_OFFLOAD_MODELS:-vit_b_16,bert,gpt2}" --dir "$WORK/spill" \
        --json "$OUT/offload.json" ${FT_OFFLOAD_ARGS:-} 2>&1 \
        | tee "$OUT/offload.log" | grep -v "batch .*: \(fits\|OOM\)" | tail -60
fi
if [ $OPTIM = 1 ]; then
    site="$WORK/optim-site"
    for peer in torchao deepspeed; do
        if ! ls .peers/wheels/$peer-*.whl >/dev/null 2>&1; then
            log "--optim: no $peer wheel in .peers/wheels (scripts/fetch-peers.sh): no $peer row"
            continue
        fi
        wheels=$(ls .peers/wheels/$peer-*.whl)
        if [ $peer = deepspeed ]; then  # and what it needs that this machine lacks
            wheels="$wheels $(ls .peers/wheels/{hjson,pydantic,pydantic_core,annotated_types,typing_inspection}-*.whl 2>/dev/null)"
        fi
        # shellcheck disable=SC2086  (one word per wheel)
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" $wheels 2>&1 | tail -3
    done
    export TORCH_EXTENSIONS_DIR="$WORK/torch-extensions"
    if [ "${FT_OPTIM_TESTS:-1}" = 1 ]; then
        log "optimizer offload tests (CUDA included)"
        PYTHONPATH="$here/python" FT_TEST_DIR="$WORK/py" timeout 200 python3 -m pytest -q -rs \
            tests/python/test_optim.py tests/python/test_stream.py 2>&1 |
            tee "$OUT/pytest-optim.log" | tail -6 | tee -a "$OUT/summary.txt"
    fi
    log "optimizer offload: ViT-B/16 largest batch (3 GiB), Llama-style 1.6 B (12 GiB) vs torchao"
    mkdir -p "$WORK/spill"
    # shellcheck disable=SC2086  (the optional arguments split on purpose)
    PEERS_SITE="$site" PYTHONPATH="$here/python" PYTHONUNBUFFERED=1 \
        timeout "${FT_OPTIM_TIMEOUT:-480}" python3 bench/optim.py --dir "$WORK/spill" \
        --json "$OUT/optim.json" ${FT_OPTIM_ARGS:-} 2>&1 | tee "$OUT/optim.log" |
        grep -v "batch .*: \(fits\|OOM\)" | tail -40 | tee -a "$OUT/summary.txt"
fi
if [ $DCP = 1 ]; then
    log "DCP storage layer: tests, then dcp-save / dcp-load / dcp-async against DCP's default"
    PYTHONPATH="$here/python" FT_TEST_DIR="$WORK/pytest" timeout 300 python3 -m pytest -q -rs \
        -p no:logging tests/python/test_dcp.py ${FT_DCP_TESTS:+-k "$FT_DCP_TESTS"} 2>&1 |
        tail -15 | tee -a "$OUT/summary.txt"
    ranks=${FT_DCP_RANKS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
    PYTHONPATH="$here/python" BUILD="$BUILD" python3 bench/scenarios.py --device cuda \
        --ranks "${ranks:-1}" --size "${FT_DCP_SIZE:-2G}" --rounds "${FT_DCP_ROUNDS:-3}" \
        --dir "$WORK" --tools "${FT_DCP_TOOLS:-fastensor,dcp,raw}" --dcp-data "${FT_DCP_DATA:-random}" \
        --scenarios "${FT_DCP_LIST:-dcp-save,dcp-load,dcp-async}" \
        --time-limit "${FT_DCP_LIMIT:-300}" --json "$OUT/dcp-cuda.json" \
        2>"$OUT/dcp-cuda.log" | tee -a "$OUT/summary.txt"
fi
if [ $CODEC = 1 ]; then
    log "tensor codec: the GPU decoder and encoder (test_gpu), CUDA loads of .fst (test_fst.py)"
    mkdir -p "$WORK/tests"
    for case in codec "coded ahead"; do
        FT_TEST_CASE="$case" FT_TEST_DIR="$WORK/tests" timeout 120 "$BUILD/tests/test_gpu" \
            >"$OUT/test_gpu-${case// /-}.log" 2>&1
        echo "test_gpu ($case cases) rc=$?" | tee -a "$OUT/summary.txt"
        grep -E "FAIL|ok |SKIP" "$OUT/test_gpu-${case// /-}.log" | head -20 |
            tee -a "$OUT/summary.txt"
    done
    PYTHONPATH="$here/python" FT_TEST_DIR="$WORK/py" timeout 120 python3 -m pytest -q -rs -s \
        -p no:logging tests/python/test_fst.py tests/python/test_codec.py >"$OUT/test_fst.log" 2>&1
    grep -E "^(FAILED|ERROR|E  )|passed|failed" "$OUT/test_fst.log" | head -30 | tee -a "$OUT/summary.txt"
    log "tensor codec: ratio, CPU and GPU decode and encode, save and cold load into GPU memory"
    PYTHONPATH="$here/python" timeout ${FT_CODEC_TIMEOUT:-420} python3 bench/codec.py \
        --size "${FT_CODEC_SIZE:-2G}" --models "llama-bf16,${FT_CODEC_MODELS:-gpt2-fp32}" \
        --rounds "${FT_CODEC_ROUNDS:-3}" --device cuda --dir "$WORK" --json "$OUT/codec.json" \
        --gpu-blocks "${FT_CODEC_BLOCKS:-256K,512K}" 2>&1 | tee -a "$OUT/summary.txt"
    log "tensor codec: a .fst save against a plain one (durable saves, interleaved)"
    PYTHONPATH="$here/python" timeout 150 python3 bench/fst-save.py --size "${FT_CODEC_SIZE:-2G}" \
        --rounds "${FT_FST_ROUNDS:-5}" --device cuda --dir "$WORK" >"$OUT/fst-save.txt" 2>&1
    grep -v "^  " "$OUT/fst-save.txt" | tee -a "$OUT/summary.txt"
    PYTHONPATH="$here/python" timeout 150 python3 bench/fst-save.py --model gpt2-fp32 \
        --rounds "${FT_FST_ROUNDS:-5}" --device cuda --dir "$WORK" >"$OUT/fst-save-fp32.txt" 2>&1
    grep -v "^  " "$OUT/fst-save-fp32.txt" | tee -a "$OUT/summary.txt"
    log "tensor codec: the same with the streams stored (the container's write path alone)"
    PYTHONPATH="$here/python" timeout 150 python3 bench/fst-save.py --size "${FT_CODEC_SIZE:-2G}" \
        --rounds "${FT_FST_ROUNDS:-5}" --device cuda --dir "$WORK" --compression none \
        >"$OUT/fst-save-stored.txt" 2>&1
    grep -v "^  " "$OUT/fst-save-stored.txt" | tee -a "$OUT/summary.txt"
    log "tensor codec: DCP async saves staged as coded streams (tests, then against plain ones)"
    PYTHONPATH="$here/python" FT_TEST_DIR="$WORK/py" timeout 120 python3 -m pytest -q -rs \
        -p no:logging tests/python/test_dcp.py -k "cuda or coded" >"$OUT/test_dcp-coded.log" 2>&1
    grep -E "^(FAILED|ERROR|E  )|passed|failed" "$OUT/test_dcp-coded.log" | head -20 |
        tee -a "$OUT/summary.txt"
    PYTHONPATH="$here/python" timeout 200 python3 bench/async-stage.py \
        --size "${FT_CODEC_SIZE:-2G}" --rounds "${FT_FST_ROUNDS:-5}" --dir "$WORK" \
        --json "$OUT/async-stage.json" >"$OUT/async-stage.txt" 2>&1
    grep -v "^  " "$OUT/async-stage.txt" | tee -a "$OUT/summary.txt"
fi
if [ $PACK = 1 ]; then # one archive, for callers that fetch only a few files
    tar -C "$OUT" -czf /tmp/gpu-check.tgz . && rm -rf "${OUT:?}"/* &&
        mv /tmp/gpu-check.tgz "$OUT/results.tgz"
fi
log "done; files in $OUT"
