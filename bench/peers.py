#!/usr/bin/env python3
"""fastensor beside the safetensors loaders users pick: one checkpoint, every tool, fresh processes.

Tools (each load in a fresh process; `--tools` picks, those not installed are skipped and said):
  fastensor          fastensor.torch.load_file, defaults (a fresh profile for the run)
  fastensor-twin     the same again under another name and profile: the noise floor
  fastensor-bypass   load_file(cache="bypass"): O_DIRECT, nothing left in the page cache
  fastensor-open     fastensor.torch.safe_open, get_tensor of every tensor
  safetensors        safetensors.torch.load_file (a shard at a time)
  safetensors-open   safetensors.safe_open, get_tensor of every tensor
  fastsafetensors    fastsafe_open (all files at once), get_tensor of every tensor; without
                     GDS where nvidia-fs is absent (the table says which)
  instanttensor      instanttensor.safe_open(...).tensors() (CUDA only)
  runai              runai_model_streamer.SafetensorsStreamer: stream_files to the CPU, each
                     tensor moved to the device as it arrives (as vLLM's loader does)
  raw                the disk's ceiling: a sequential O_DIRECT read of as many bytes (and the
                     write, reported beside the table)
A tool may carry settings: TOOL:KEY=VALUE+KEY=VALUE runs it with those environment variables
(`fastensor-bypass:FASTENSOR_THREADS=64`, its own profile), for raw fio's jobs (each a
contiguous share of the file), bs and depth (`raw:jobs=16+bs=4M+depth=8`).

Rows: cold (page cache dropped), warm (every file read into the page cache first, by `cat`:
the stand-in for storage faster than this disk), restart (the tool's own cold load in one
process, then the measured load in a fresh one), procsN (N processes loading at once after a
drop: aggregate GB/s, the first start to the last end), and the same cold and warm for an
HF-style sharded directory (model-0000k-of-0000n.safetensors and its index) when
`--sharded-size` is given. Every load's tensors are fingerprinted against the source bytes
(a weighted sum of every byte, exact integer arithmetic, computed after the timing): a tool
that returns other bytes or names gets no figure. Each load also reports the tool's import
time, the CUDA context's, the time to its first tensor, the peak GPU memory beyond the
tensors (device memory in use, sampled every 5 ms, and torch's allocator peak, the larger)
and the peak host RSS.

`--sweep` first loads cold and warm once with each peer's settings (InstantTensor's backends,
Run:ai's concurrency, fastsafetensors' GDS where nvidia-fs is there) and gives each peer, per
row, the one that was fastest: the table names it.

The peers are fetched at run time, never committed: scripts/fetch-peers.sh installs them
into .peers/ (git-ignored) for this machine's venv and downloads Python 3.12 wheels to carry
to the GPU machine; the workers find them through PEERS_SITE (default .peers/site).

    PYTHONPATH=python .venv/bin/python bench/peers.py --size 1G --rounds 3 --dir /var/tmp \\
        [--device cuda] [--sharded-size 2G --shard 512M] [--sweep] --json peers.json
"""
import argparse
import datetime
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import scenarios as sc  # noqa: E402  (the state dict, the raw ceiling, the page-cache drop)

TOOLS = ["fastensor", "fastensor-twin", "fastensor-bypass", "fastensor-open", "safetensors",
         "safetensors-open", "fastsafetensors", "instanttensor", "runai", "raw"]
MODULES = {"fastsafetensors": "fastsafetensors", "instanttensor": "instanttensor",
           "runai": "runai_model_streamer", "safetensors": "safetensors",
           "safetensors-open": "safetensors"}
ROWS = ["cold", "warm", "restart", "procs", "sharded-cold", "sharded-warm"]


def nvidia_fs():
    return os.path.exists("/proc/driver/nvidia-fs")


def variants(tool, device):
    """Each peer's settings worth trying on this machine (the first: its defaults)."""
    cuda = device.startswith("cuda")
    if tool == "instanttensor" and cuda:
        return [{}] + [{"kw": {"backend": b}} for b in
                       ("URING", "AIO", "URING_BUFFERED", "AIO_BUFFERED", "MMAP")]
    if tool == "runai":
        return [{}] + [{"env": {"RUNAI_STREAMER_CONCURRENCY": str(c)}} for c in (8, 32, 64)]
    if tool == "fastsafetensors" and cuda and nvidia_fs():
        return [{"kw": {"nogds": True}}, {"kw": {"nogds": False}}]
    if tool == "fastsafetensors":
        return [{"kw": {"nogds": True}}]
    return [{}]


def parse_tool(spec):
    """A --tools entry: TOOL, or TOOL:KEY=VALUE+KEY=VALUE (environment settings of the tool's
    processes, or for raw fio's jobs, bs and depth): the tool and its fixed variant, or None."""
    tool, _, rest = spec.partition(":")
    if not rest:
        return tool, None
    pairs = dict(kv.split("=", 1) for kv in rest.split("+"))
    return tool, ({"fio": pairs} if tool == "raw" else {"env": pairs})


def label(tool, v):
    s = ",".join(f"{k}={x}" for d in (v.get("kw", {}), v.get("env", {}), v.get("fio", {}))
                 for k, x in d.items())
    return f"{tool}[{s}]" if s else tool


# ---- the checkpoint and its fingerprints ----

_STEP = 65521 * 256  # 8-byte words per chunk: a whole number of weight periods
_WEIGHTS = {}


def fingerprint(t):
    """The tensor's bytes as 8-byte words, summed with weights 1..65521 by position (int64
    arithmetic, which wraps the same way in any order, on the CPU and the GPU), the last
    bytes weighted one by one: a byte changed, moved or missing changes it."""
    import torch
    flat = t.detach().contiguous().view(-1).view(torch.uint8)
    whole = flat.numel() // 8 * 8
    head = flat[:whole]
    if head.storage_offset() % 8:
        head = head.clone()
    words = head.view(torch.int64)
    w = _WEIGHTS.get(words.device)
    if w is None:
        w = _WEIGHTS[words.device] = (torch.arange(_STEP, dtype=torch.int64, device=words.device)
                                      % 65521 + 1)
    total = 0
    for at in range(0, words.numel(), _STEP):
        x = words[at:at + _STEP]
        total += int((x * w[:x.numel()]).sum())
    total += sum((i + 1) * int(b) for i, b in enumerate(flat[whole:].tolist()))
    return [str(t.dtype).replace("torch.", ""), list(t.shape), total]


def write_checkpoints(args):
    """The single file, and the sharded directory when asked: safetensors' own writer (the
    format's reference), the fingerprints beside them."""
    import torch
    from safetensors.torch import save_file
    made = {"single": os.path.join(args.work, "model.safetensors")}
    sizes = [("single", args.size_bytes)]
    if args.sharded_bytes:
        made["sharded"] = os.path.join(args.work, "sharded")
        sizes.append(("sharded", args.sharded_bytes))
    fps = {}
    for kind, size in sizes:
        sd = sc.state_dict(size, seed=1 if kind == "single" else 2)
        fps[kind] = {k: fingerprint(v) for k, v in sd.items()}
        if kind == "single":
            save_file(sd, made[kind])
        else:
            os.makedirs(made[kind])
            shards, cur, used = [], {}, 0
            for k, v in sd.items():
                n = v.numel() * v.element_size()
                if cur and used + n > args.shard_bytes:
                    shards.append(cur)
                    cur, used = {}, 0
                cur[k] = v
                used += n
            shards.append(cur)
            weight_map = {}
            for i, part in enumerate(shards):
                name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                save_file(part, os.path.join(made[kind], name))
                weight_map.update({k: name for k in part})
            with open(os.path.join(made[kind], "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": sc.nbytes(sd)}, "weight_map": weight_map}, f)
        del sd
        sc.fsync_tree(made[kind])
    if os.environ.get("PEERS_TAMPER"):  # the tests' check that a wrong load gets no figure
        for kind in fps:
            name = next(iter(fps[kind]))
            fps[kind][name][2] += 1
    with open(os.path.join(args.work, "fingerprints.json"), "w") as f:
        json.dump(fps, f)
    del torch
    return made


def files_of(path):
    if os.path.isfile(path):
        return [path]
    return sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))


# ---- one load, in a worker process ----

def load_with(tool, path, device, v, first):
    """Every tensor of @p path (a file or a sharded directory) on @p device; first() is called
    as the first tensor is handed over."""
    import torch
    kw = v.get("kw", {})
    out = {}
    files = files_of(path)
    if tool.startswith("fastensor") and tool != "fastensor-open":
        import fastensor.torch as ftt
        out = ftt.load_file(path, device=device,
                            cache="bypass" if tool == "fastensor-bypass" else "auto")
        first()
    elif tool == "fastensor-open":
        import fastensor.torch as ftt
        for f in files:
            with ftt.safe_open(f, framework="pt", device=device) as h:
                for k in h.keys():
                    out[k] = h.get_tensor(k)
                    first()
    elif tool == "safetensors":
        import safetensors.torch as st
        for f in files:
            out.update(st.load_file(f, device=device))
            first()
    elif tool == "safetensors-open":
        from safetensors import safe_open
        for f in files:
            with safe_open(f, framework="pt", device=device) as h:
                for k in h.keys():
                    out[k] = h.get_tensor(k)
                    first()
    elif tool == "fastsafetensors":
        from fastsafetensors import fastsafe_open
        dev = "cuda:0" if device == "cuda" else device
        with fastsafe_open(filenames=files, framework="pt", device=dev, **kw) as h:
            for k in h.keys():
                out[k] = h.get_tensor(k)
                first()
    elif tool == "instanttensor":
        import instanttensor
        if "backend" in kw:
            kw = dict(kw, backend=getattr(instanttensor.Backend, kw["backend"]))
        with instanttensor.safe_open(files, framework="pt", device=torch.device(device).index
                                     or 0, **kw) as h:
            for k, t in h.tensors():
                out[k] = t
                first()
    elif tool == "runai":
        from runai_model_streamer import SafetensorsStreamer
        with SafetensorsStreamer() as s:
            s.stream_files(files, device="cpu")
            for k, t in s.get_tensors():
                out[k] = t.to(device) if device != "cpu" else t
                first()
    else:
        raise ValueError(f"unknown tool {tool}")
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    else:
        sc.touch(out)
    return out


def rss_bytes(field="VmRSS"):
    """This process's resident memory now, or its peak (VmHWM): getrusage's ru_maxrss would
    carry the parent's peak over fork and exec."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def worker(spec):
    t = time.perf_counter()
    import torch
    torch_s = time.perf_counter() - t
    tool, device, v = spec["tool"], spec["device"], spec.get("variant", {})
    cuda = device.startswith("cuda")
    t = time.perf_counter()
    if cuda:
        torch.zeros(1, device=device)
        torch.cuda.synchronize()
    cuda_s = time.perf_counter() - t
    t = time.perf_counter()
    if tool.startswith("fastensor"):
        import fastensor.torch  # noqa: F401
    elif tool in MODULES:
        __import__(MODULES[tool])
    import_s = time.perf_counter() - t
    if tool == "raw":
        fio = spec.get("variant", {}).get("fio", {})
        n, secs = sc.raw_io(spec["path"], spec["size"], False, int(fio.get("jobs", 1)),
                            fio.get("bs", "16M"), int(fio.get("depth", 16)))
        now = time.time()
        return {"bytes": n, "seconds": secs, "start": now - secs, "end": now, "ok": True}
    if spec.get("barrier"):
        while not os.path.exists(spec["barrier"]):
            time.sleep(0.001)
    free0 = torch.cuda.mem_get_info()[0] if cuda else 0
    low = [free0]
    done = threading.Event()

    def sample():  # device memory in use, every 5 ms (sleep releases the GIL)
        while not done.wait(0.005):
            low[0] = min(low[0], torch.cuda.mem_get_info()[0])
    sampler = threading.Thread(target=sample, daemon=True) if cuda and not spec.get(
        "barrier") else None
    if sampler:
        sampler.start()
    rss0 = rss_bytes()
    firsts = []
    start = time.time()
    t0 = time.perf_counter()
    out = load_with(tool, spec["path"], device, v,
                    lambda: firsts or firsts.append(time.perf_counter() - t0))
    secs = time.perf_counter() - t0
    if sampler:
        done.set()
        sampler.join()
        low[0] = min(low[0], torch.cuda.mem_get_info()[0])
    tensor_bytes = sum(x.numel() * x.element_size() for x in out.values())
    res = {"bytes": tensor_bytes, "seconds": secs, "start": start, "end": start + secs,
           "torch_import_s": torch_s, "cuda_init_s": cuda_s, "import_s": import_s,
           "first_tensor_s": firsts[0] if firsts else secs,
           "rss_peak_bytes": rss_bytes("VmHWM"),
           "rss_before_bytes": rss0}
    if cuda:
        res["gpu_extra_bytes"] = max(free0 - low[0] if sampler else 0,
                                     torch.cuda.max_memory_reserved()) - tensor_bytes
    with open(spec["fingerprints"]) as f:
        want = json.load(f)[spec["kind"]]
    got = {k: fingerprint(x) for k, x in out.items()}
    bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
    res["ok"] = not bad
    res["bad"] = bad[:5]
    return res


# ---- the driver ----

def spawn(spec, env):
    return sc.spawn(spec, env, __file__)


collect = sc.collect


def env_for(tool, v, work):
    """The worker's environment: the package, the peers, a profile in @p work per tool."""
    env = dict(os.environ)
    site = os.environ.get("PEERS_SITE", os.path.join(ROOT, ".peers", "site"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "python"), site,
                                                    env.get("PYTHONPATH", "")) if p)
    env["FASTENSOR_QUIET"] = "1"
    env["RUNAI_STREAMER_LOG_LEVEL"] = "WARNING"
    if tool.startswith("fastensor"):
        env["FASTENSOR_PROFILE"] = os.path.join(work, "profile-" + tool.replace(os.sep, "_"))
    env.update(v.get("env", {}))
    return env


def warm_up(path):
    for f in files_of(path):
        with open(f, "rb") as fh:
            while fh.read(16 << 20):
                pass


def measure(args, tool, v, row, made, name=None):
    """GB/s of one row's load, or None (the row does not apply, or no root to drop caches);
    the worker's report rides along. @p name: the --tools entry (its own profile)."""
    kind = "sharded" if row.startswith("sharded") else "single"
    if kind not in made:
        return None, None
    path = made[kind]
    env = env_for(name or tool, v, args.work)
    spec = {"tool": tool, "variant": v, "path": path, "device": args.device, "kind": kind,
            "fingerprints": os.path.join(args.work, "fingerprints.json")}
    if tool == "raw":
        if row not in ("cold", "sharded-cold") or not sc.drop_caches():
            return None, None
        # as many bytes as the checkpoint holds, whole MiB: never past a file's end
        have = sum(os.path.getsize(f) for f in files_of(path))
        spec.update(path=files_of(path)[0] if kind == "single" else path + ".raw",
                    size=have >> 20 << 20)
        if kind == "sharded" and not os.path.exists(spec["path"]):
            sc.raw_io(spec["path"], spec["size"], True)
            sc.drop_caches()
        r = collect(spawn(spec, env))
        return r["bytes"] / r["seconds"] / 1e9, r
    if row in ("cold", "restart", "procs", "sharded-cold") and not sc.drop_caches():
        return None, None
    if row in ("warm", "sharded-warm"):
        warm_up(path)
    if row == "restart":
        collect(spawn(spec, env))
    if row == "procs":
        barrier = os.path.join(args.work, f"go-{time.time_ns()}")
        procs = [spawn(dict(spec, barrier=barrier), env) for _ in range(args.procs)]
        time.sleep(2.0 + 0.5 * args.procs)  # imports and CUDA contexts, before the barrier
        open(barrier, "w").close()
        rs = [collect(p) for p in procs]
        os.unlink(barrier)
        if not all(r["ok"] for r in rs):
            return None, rs[0]
        span = max(r["end"] for r in rs) - min(r["start"] for r in rs)
        return sum(r["bytes"] for r in rs) / span / 1e9, rs[0]
    r = collect(spawn(spec, env))
    return (r["bytes"] / r["seconds"] / 1e9 if r["ok"] else None), r


def available(tool):
    if tool.startswith("fastensor") or tool == "raw":
        return None
    env = env_for(tool, {}, "")
    mod = MODULES[tool]
    p = subprocess.run([sys.executable, "-c", f"import {mod}"], env=env, capture_output=True,
                       text=True)
    if p.returncode:
        return f"{mod} is not installed (scripts/fetch-peers.sh)"
    return None


def sweep(args, tools, made, rows):
    """Per peer and row, the settings that loaded fastest once (cold and warm rows; the others
    take the cold row's choice)."""
    chosen = {}
    for tool in tools:
        vs = variants(tool, args.device)
        if len(vs) < 2:
            continue
        for row in [r for r in rows if r in ("cold", "warm", "sharded-cold", "sharded-warm")]:
            best = None
            for v in vs:
                try:
                    g, _ = measure(args, tool, v, row, made)
                except RuntimeError as e:
                    print(f"sweep {label(tool, v)} {row}: failed ({str(e)[-200:]})")
                    continue
                print(f"sweep {label(tool, v)} {row}: {g if g is None else round(g, 2)} GB/s",
                      flush=True)
                if g is not None and (best is None or g > best[0]):
                    best = (g, v)
            if best:
                chosen[(tool, row)] = best[1]
    return chosen


def table(res, rows, tools, settings):
    peers = [t for t in tools if not t.startswith(("fastensor", "raw"))]
    head = "| row | " + " | ".join(tools) + " | fastensor / best peer | fastensor / twin |"
    lines = [head, "|---" * (len(tools) + 3) + "|"]
    for row in rows:
        med, cells = {}, []
        for t in tools:
            v = [x for x in res.get(row, {}).get(t, []) if x is not None]
            if v:
                med[t] = statistics.median(v)
                cells.append(f"{med[t]:.2f} ({min(v):.2f}-{max(v):.2f})")
            else:
                cells.append("-")
        best = max((med[t], t) for t in peers if t in med) if any(t in med for t in peers) \
            else None
        r1 = f"{med['fastensor'] / best[0]:.2f}x ({best[1]})" if best and "fastensor" in med \
            else "-"
        r2 = (f"{med['fastensor'] / med['fastensor-twin']:.2f}x"
              if "fastensor" in med and "fastensor-twin" in med else "-")
        lines.append(f"| {row} | " + " | ".join(cells) + f" | {r1} | {r2} |")
    used = {f"{t} {r}": label(t, v) for (t, r), v in settings.items() if v}
    if used:
        lines.append("\nsettings chosen by the sweep: " +
                     "; ".join(f"{k}: {v}" for k, v in sorted(used.items())))
    return "\n".join(lines)


def costs(reports, tools):
    """Per tool, medians over its cold single-file loads: import, CUDA init, first tensor, GPU
    memory beyond the tensors, peak RSS."""
    lines = ["| tool | import s | CUDA init s | first tensor s | GPU extra MiB | peak RSS MiB |",
             "|---|---|---|---|---|---|"]
    out = {}
    for t in tools:
        rs = [r for r in reports.get(t, []) if r]
        if not rs or parse_tool(t)[0] == "raw":
            continue

        def med(k, scale=1.0):
            v = [r[k] for r in rs if k in r]
            return statistics.median(v) / scale if v else None
        out[t] = {k: med(k) for k in ("import_s", "cuda_init_s", "first_tensor_s",
                                      "gpu_extra_bytes", "rss_peak_bytes")}
        f = out[t]
        lines.append(f"| {t} | {f['import_s']:.2f} | {f['cuda_init_s']:.2f} | "
                     f"{f['first_tensor_s']:.3f} | "
                     + (f"{f['gpu_extra_bytes'] / 2**20:.0f}" if f["gpu_extra_bytes"] is not None
                        else "-") + f" | {f['rss_peak_bytes'] / 2**20:.0f} |")
    return "\n".join(lines), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--size", default="1G", help="the single file's bytes (bf16), e.g. 4G")
    ap.add_argument("--sharded-size", default=None, help="also a sharded directory this big")
    ap.add_argument("--shard", default="5G", help="shard size of the sharded directory (5G)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--dir", default=None, help="where the checkpoints go (a real disk)")
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--sweep", action="store_true", help="try each peer's settings first")
    ap.add_argument("--time-limit", type=float, default=0,
                    help="seconds: start no round after this")
    ap.add_argument("--json", help="write every sample, the medians and the settings here")
    args = ap.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(worker(spec)), flush=True)
        if spec["tool"].startswith("fastensor"):
            return  # exits as a user's process does: AUTO's profile is saved for the next one
        sys.stdout.flush()
        os._exit(0)  # some peers' threads hang the interpreter's exit: the result is out
    args.size_bytes = sc.parse_size(args.size)
    args.sharded_bytes = sc.parse_size(args.sharded_size) if args.sharded_size else 0
    args.shard_bytes = sc.parse_size(args.shard)
    cuda = args.device.startswith("cuda")
    skipped = {}
    tools = []
    for t in [t for t in args.tools.split(",") if t]:
        base = parse_tool(t)[0]
        why = ("CUDA only" if base == "instanttensor" and not cuda else available(base))
        if why:
            skipped[t] = why
        else:
            tools.append(t)
    rows = [r for r in args.rows.split(",") if r]
    if not args.sharded_bytes:
        rows = [r for r in rows if not r.startswith("sharded")]
    rows = [f"procs{args.procs}" if r == "procs" else r for r in rows]
    sc.compile_sources(os.path.join(ROOT, "python"))
    args.work = tempfile.mkdtemp(prefix="ft-peers-", dir=args.dir)
    res = {r: {t: [] for t in tools} for r in rows}
    reports, settings = {}, {}
    t_start = time.time()
    try:
        made = write_checkpoints(args)
        if args.sweep:
            settings = sweep(args, tools, made, rows)
        done = 0
        for rnd in range(args.rounds):
            if args.time_limit and rnd and time.time() - t_start > args.time_limit:
                break
            order = [(r, t) for r in rows for t in tools]
            random.Random(rnd).shuffle(order)
            for row, tool in order:
                base, fixed = parse_tool(tool)
                v = fixed or settings.get((tool, row), settings.get((tool, "cold"), variants(
                    tool, args.device)[0]))
                base_row = "procs" if row.startswith("procs") else row
                try:
                    g, rep = measure(args, base, v, base_row, made, tool)
                except RuntimeError as e:
                    g, rep = None, None
                    skipped[f"{tool} {row}"] = str(e)[-300:]
                if rep is not None and not rep.get("ok", True):
                    skipped[f"{tool} {row}"] = f"other bytes than written: {rep.get('bad')}"
                res[row][tool].append(g)
                if row == "cold" and rep:
                    reports.setdefault(tool, []).append(rep)
                print(f"round {rnd + 1} {row:13s} {tool if fixed else label(tool, v):40s} "
                      f"{'-' if g is None else f'{g:.2f}'} GB/s", flush=True)
            done += 1
        raw_w = None
        if "raw" in tools:
            n, secs = sc.raw_io(os.path.join(args.work, "raw-write.bin"),
                                os.path.getsize(made["single"]) >> 20 << 20, True)
            raw_w = n / secs / 1e9
    finally:
        shutil.rmtree(args.work, ignore_errors=True)
    md = table(res, rows, tools, settings)
    cmd, cost = costs(reports, tools)
    print(f"\n{args.size} bf16 single file"
          + (f", {args.sharded_size} in {args.shard} shards" if args.sharded_bytes else "")
          + f", device {args.device}, {done} rounds, GB/s median (range)"
          + ("" if raw_w is None else f"; raw O_DIRECT write {raw_w:.2f} GB/s")
          + f"\n\n{md}\n\ncold single-file loads, medians:\n\n{cmd}")
    if cuda and "fastsafetensors" in tools:
        print(f"\nfastsafetensors: {'GDS tried (nvidia-fs present)' if nvidia_fs() else 'without GDS (no nvidia-fs on this machine)'}")
    for k, v in skipped.items():
        print(f"\nskipped {k}: {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"what": "bench/peers.py", "date": datetime.date.today().isoformat(),
                       "size": args.size, "sharded_size": args.sharded_size,
                       "shard": args.shard, "device": args.device, "rounds": done,
                       "cpus": os.cpu_count(), "raw_write_gbps": raw_w,
                       "gds": nvidia_fs(), "rows": rows, "tools": tools,
                       "samples": res, "costs": cost, "skipped": skipped,
                       "settings": {f"{t} {r}": label(t, v) for (t, r), v in settings.items()},
                       "table": md, "commit": sc.commit()}, f, indent=1)


if __name__ == "__main__":
    main()
