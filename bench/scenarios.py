#!/usr/bin/env python3
"""Checkpoint workflows, the way users run them: every tool side by side, interleaved rounds.

Scenarios (each load in a fresh process, defaults, timed from the call to the last byte on
the device, host loads until every page of every tensor has been read once, so that tools
handing out views of a mapping pay for the pages they map; interpreter start and imports are
not counted):
  save     durable save (every tool's time includes making its files durable)
  cold     first load after a page-cache drop (needs root to drop the cache)
  repeat2  second load, a fresh process, no drop between (a restarted job)
  repeat3  third load, likewise (an evaluation after it)
  procsN   N processes loading the same checkpoint at once after a drop (the ranks of a node):
           aggregate GB/s = N x size / (last end - first start)
  big      first and second load of a checkpoint larger than the page cache may keep: the
           workers run in a cgroup whose memory.max is half the checkpoint (cgroup v2, root);
           skipped with the reason where that cannot be set up
  dcp-save, dcp-load, dcp-async
           torch.distributed.checkpoint with --ranks processes (gloo; on CUDA one GPU per rank,
           round robin, cpu:gloo,cuda:nccl), the state dict as DTensors sharded on dimension
           0: `dcp.save` (durable), `dcp.load` after a page-cache drop, and `dcp.async_save`
           (size / the caller's blocking time, the longest rank's), each from a barrier to a
           barrier; tool `fastensor` is fastensor.dcp's FastensorWriter/FastensorReader,
           `fastensor-fst` the same with compression="always" (.fst data files; DCP scenarios
           only), `dcp` DCP's default FileSystemWriter/FileSystemReader, `raw` the disk's
           ceiling with one writer (reader) per rank; each save goes to a new directory, as a
           job's do; `--dcp-data weights` makes the tensors weights-like (normal, std 0.02,
           bf16: what the codec is for) instead of random bytes
Tools: fastensor with a fresh profile (what a new user has: one empty profile directory for
the run) and with a tuned one (`fastensor tune` first), safetensors, torch.save/torch.load
(and torch.load(mmap=True)), torch.distributed.checkpoint's default
writer/reader, numpy (one .npy per tensor), and the raw ceiling of the disk in the same run
(fio, sequential O_DIRECT, 16 MiB blocks, 16 in flight; else a Python O_DIRECT dd).

Each round runs every (scenario, tool) once, tools in a shuffled order; the table gives the
median GB/s of the rounds with the range, and fastensor's ratios to safetensors and to the
raw ceiling of the same rounds.

A paired comparison of two builds: `--base DIR` adds `fastensor-base`, the package of
another checkout (DIR/python, built there with `make python`), with a fresh profile of its
own, and `fastensor-twin`, this build again under another name (its own file and fresh
profile): the twin's distance from `fastensor` is the noise floor the base's must exceed.
The table then adds fastensor / base and fastensor / twin.

    PYTHONPATH=python .venv/bin/python bench/scenarios.py --size 1G --rounds 3 \\
        --dir /nvme/bench --json docs/benchmarks/scenarios-dev.json [--device cuda] [--plot x.png]
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
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOOLS = ["fastensor", "fastensor-tuned", "safetensors", "torch", "torch-mmap", "dcp", "numpy",
         "raw"]
SCENARIOS = ["save", "cold", "repeat2", "repeat3", "procs", "big", "dcp-save", "dcp-load",
             "dcp-async"]
# the tools of the DCP scenarios (fastensor.dcp under fastensor's names)
DCP_TOOLS = ("fastensor", "fastensor-tuned", "fastensor-twin", "fastensor-fst", "dcp", "raw")


# ---- the state dict (made in each worker from a seed: the same bytes everywhere) ----

def shapes(size):
    """Names and shapes of a Llama-style decoder's weights (d 2048, ffn 5504) of about @p size
    bytes in bf16."""
    d, ffn = 2048, 5504
    per_layer = 4 * d * d + 3 * d * ffn + 2 * d  # q k v o, gate up down, norms (elements)
    out = []
    for i in range(max(1, size // (2 * per_layer))):
        for n, shape in (("q", (d, d)), ("k", (d, d)), ("v", (d, d)), ("o", (d, d)),
                         ("gate", (ffn, d)), ("up", (ffn, d)), ("down", (d, ffn)),
                         ("ln1", (d,)), ("ln2", (d,))):
            out.append((f"layers.{i}.{n}.weight", shape))
    return out


def state_dict(size, seed=0):
    """The state dict: random bytes as bf16 (one pass; the same in every worker)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randint(-32768, 32768, shape, dtype=torch.int16, generator=g)
            .view(torch.bfloat16) for name, shape in shapes(size)}


def nbytes(sd):
    return sum(t.numel() * t.element_size() for t in sd.values())


def fsync_tree(path):
    paths = [path] if os.path.isfile(path) else [os.path.join(r, f) for r, _, fs in os.walk(path)
                                                  for f in fs]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    d = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    os.fsync(d)
    os.close(d)


def target(tool, base):
    ext = {"safetensors": ".safetensors", "torch": ".pt", "torch-mmap": ".pt", "dcp": ".dcp",
           "numpy": ".npy.d", "raw": ".raw"}.get(tool, ".safetensors")
    name = ("torch" if tool == "torch-mmap"
            else "fastensor" if tool in ("fastensor", "fastensor-tuned") else tool)
    return os.path.join(base, name + ext)


# ---- one measurement, in a worker process ----

def do_save(tool, path, sd):
    import torch
    if tool.startswith("fastensor"):
        import fastensor.torch as ftt
        ftt.save_file(sd, path)  # durable by default
        return
    if tool == "safetensors":
        import safetensors.torch as st
        st.save_file(sd, path)
    elif tool in ("torch", "torch-mmap"):
        torch.save(sd, path)
    elif tool == "dcp":
        import torch.distributed.checkpoint as dcp
        shutil.rmtree(path, ignore_errors=True)
        dcp.save(sd, checkpoint_id=path)
    elif tool == "numpy":
        import numpy as np
        os.makedirs(path, exist_ok=True)
        for k, t in sd.items():
            np.save(os.path.join(path, k + ".npy"), t.view(torch.int16).numpy())
    fsync_tree(path)


def do_load(tool, path, device, template=None):
    import torch
    if tool.startswith("fastensor"):
        import fastensor.torch as ftt
        out = ftt.load_file(path, device=device)
    elif tool == "safetensors":
        import safetensors.torch as st
        out = st.load_file(path, device=device)
    elif tool == "torch":
        out = torch.load(path, map_location=device, weights_only=True)
    elif tool == "torch-mmap":
        out = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        out = {k: v.to(device) for k, v in out.items()} if device != "cpu" else out
    elif tool == "dcp":  # DCP loads in place: the destination is allocated here
        import torch.distributed.checkpoint as dcp
        out = {k: torch.empty(shape, dtype=torch.bfloat16, device=device)
               for k, shape in template}
        dcp.load(out, checkpoint_id=path)
    elif tool == "numpy":
        import numpy as np
        out = {}
        for f in sorted(os.listdir(path)):
            a = torch.from_numpy(np.load(os.path.join(path, f))).view(torch.bfloat16)
            out[f[:-4]] = a.to(device) if device != "cpu" else a
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    else:
        touch(out)
    return out


def touch(out):
    """Read one byte of every 4 KiB page of each host tensor: a tool that hands out views of a
    mapping (safetensors, fastensor's mapped loads, torch.load(mmap=True)) has read nothing
    when it returns, and a job's first use of the tensors pays for it. Tools that copied pay
    a page-table walk."""
    import torch
    s = 0
    for t in out.values():
        flat = t.reshape(-1).view(torch.uint8)
        s += int(flat[::4096].sum()) + int(flat[-1:].sum())
    return s


def raw_io(path, size, write, jobs=1, bs="16M", depth=16):
    """The disk's sequential O_DIRECT ceiling for @p size bytes: fio where installed (@p jobs
    processes, each a contiguous share of the file, @p depth requests of @p bs in flight
    each). A write goes to a new file, as a save's does: an overwrite in place of an
    allocated file skips the block allocation every save pays. The previous file is removed
    before the timing: freeing its blocks belongs to replacing a checkpoint, not to writing
    one. Without fio, or where it fails (the GPU machine's gVisor has no Linux AIO): @p jobs
    threads, each a contiguous share, one @p bs request at a time."""
    if write and os.path.exists(path):
        os.unlink(path)
    share = size // jobs >> 20 << 20
    fio = shutil.which("fio")
    if fio:
        args = [fio, "--name=ceiling", f"--filename={path}", f"--size={share}", f"--bs={bs}",
                f"--iodepth={depth}", "--ioengine=libaio", "--direct=1", "--output-format=json",
                f"--numjobs={jobs}", f"--offset_increment={share}", "--group_reporting",
                f"--rw={'write' if write else 'read'}"] + (["--end_fsync=1"] if write else
                                                       ["--readonly"])
        p = subprocess.run(args, capture_output=True, text=True)
        if p.returncode == 0:
            job = json.loads(p.stdout)["jobs"][0]["write" if write else "read"]
            return job["io_bytes"], job["runtime"] / 1000.0
        if write and os.path.exists(path):
            os.unlink(path)
    import mmap
    import threading
    block = parse_size(str(bs))
    fd = os.open(path, (os.O_WRONLY | os.O_CREAT if write else os.O_RDONLY) | os.O_DIRECT, 0o644)
    done = [0] * jobs

    def one(k):  # (the GIL is released in preadv/pwritev: the jobs run at once)
        buf = mmap.mmap(-1, block)
        at, end = k * share, (k + 1) * share
        while at < end:
            view = memoryview(buf)[:min(block, end - at)]
            n = os.pwritev(fd, [view], at) if write else os.preadv(fd, [view], at)
            if n <= 0:
                break
            at += n
            done[k] += n
    t0 = time.perf_counter()
    ts = [threading.Thread(target=one, args=(k,)) for k in range(jobs)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if write:
        os.fsync(fd)
    os.close(fd)
    return sum(done), time.perf_counter() - t0


def worker(spec):
    import torch
    if spec.get("cgroup"):
        with open(os.path.join(spec["cgroup"], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    tool, path, op, device = spec["tool"], spec["path"], spec["op"], spec["device"]
    if op.startswith("dcp-"):
        return dcp_rank(spec)
    if tool == "raw":
        n, secs = raw_io(path, spec["size"], op == "save")
        return {"bytes": n, "seconds": secs, "start": time.time() - secs, "end": time.time()}
    if device.startswith("cuda"):
        torch.zeros(1, device=device)  # the context, outside the timing
    sd = state_dict(spec["size"]) if op == "save" else shapes(spec["size"])
    if spec.get("barrier"):
        while not os.path.exists(spec["barrier"]):
            time.sleep(0.001)
    start = time.time()
    t0 = time.perf_counter()
    if op == "save":
        do_save(tool, path, sd)
        n = nbytes(sd)
    else:
        out = do_load(tool, path, device, sd)
        n = nbytes(out)
    secs = time.perf_counter() - t0
    return {"bytes": n, "seconds": secs, "start": start, "end": start + secs}


def dcp_rank(spec):
    """One rank of a DCP scenario; rank 0 returns the timing (from a barrier to a barrier)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device, op, tool = spec["device"], spec["op"], spec["tool"]
    if device.startswith("cuda"):
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        dist.init_process_group("cpu:gloo,cuda:nccl", device_id=dev,
                                timeout=datetime.timedelta(seconds=300))
        mesh = init_device_mesh("cuda", (world,))
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
        mesh = init_device_mesh("cpu", (world,))
    sd, local_bytes = {}, 0
    for k, (name, shape) in enumerate(shapes(spec["size"])):
        step = -(-shape[0] // world)
        lo, hi = min(rank * step, shape[0]), min((rank + 1) * step, shape[0])
        local_shape = (hi - lo,) + tuple(shape[1:])
        g = torch.Generator().manual_seed(k * 1000 + rank)
        if op == "dcp-load":
            t = torch.empty(local_shape, dtype=torch.bfloat16, device=dev)
        elif spec.get("weights"):
            t = (torch.randn(local_shape, generator=g) * 0.02).to(torch.bfloat16).to(dev)
        else:
            t = torch.randint(-32768, 32768, local_shape, dtype=torch.int16,
                              generator=g).view(torch.bfloat16).to(dev)
        local_bytes += t.numel() * 2
        stride = tuple(int(x) for x in torch.empty(shape, device="meta").stride())
        sd[name] = DTensor.from_local(t, mesh, [Shard(0)], run_check=False,
                                      shape=torch.Size(shape), stride=stride)
    if tool == "dcp":
        writer = lambda: dcp.FileSystemWriter(spec["path"])  # noqa: E731
        reader = lambda: dcp.FileSystemReader(spec["path"])  # noqa: E731
    else:
        import fastensor.dcp as fdcp
        mode = "always" if tool == "fastensor-fst" else None
        writer = lambda: fdcp.FastensorWriter(spec["path"], compression=mode)  # noqa: E731
        reader = lambda: fdcp.FastensorReader(spec["path"])  # noqa: E731
    if op != "dcp-load" and rank == 0:
        shutil.rmtree(spec["path"], ignore_errors=True)  # a new directory, outside the timing
    dist.barrier()
    t0 = time.perf_counter()
    blocked = None
    if op == "dcp-save":
        dcp.save(sd, storage_writer=writer())
    elif op == "dcp-async":
        fut = dcp.async_save(sd, storage_writer=writer())
        blocked = time.perf_counter() - t0
        fut.result()
    else:
        dcp.load(sd, storage_reader=reader())
        if dev.type == "cuda":
            torch.cuda.synchronize()
    dist.barrier()
    secs = time.perf_counter() - t0
    worst = torch.tensor([blocked or 0.0, secs], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    total = torch.tensor([local_bytes], dtype=torch.int64)
    dist.all_reduce(total)
    dist.destroy_process_group()
    if op == "dcp-async":
        secs = float(worst[0])
    return {"bytes": int(total[0]), "seconds": secs} if rank == 0 else {}


# ---- the driver ----

def compile_sources(*roots):
    """Byte-compile the Python packages under ``roots`` (a checkout's python/), as installing
    a wheel does: where PYTHONDONTWRITEBYTECODE is set, each fresh process would otherwise
    compile fastensor's sources inside the timed import (about 25 ms for the package on the
    development machine, where safetensors comes installed, compiled). Python reads the
    compiled files even where it writes none."""
    import compileall
    for root in roots:
        compileall.compile_dir(root, quiet=1)


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def spawn(spec, env, script=__file__):
    """A worker: @p script run with --worker @p spec (bench/peers.py's workers too)."""
    cmd = [sys.executable, os.path.abspath(script), "--worker", json.dumps(spec)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def collect(p):
    out, err = p.communicate()
    if p.returncode != 0:
        raise RuntimeError(f"worker failed ({p.returncode}): {err.strip()[-800:]}")
    return json.loads(out.strip().splitlines()[-1])


def env_for(tool, profiles, base=None):
    env = dict(os.environ)
    tree = base if tool == "fastensor-base" else ROOT
    env["PYTHONPATH"] = os.path.join(tree, "python") + os.pathsep + env.get("PYTHONPATH", "")
    env["FASTENSOR_QUIET"] = "1"
    if tool.startswith("fastensor"):
        env["FASTENSOR_PROFILE"] = profiles[{"fastensor": "fresh", "fastensor-tuned": "tuned",
                                             "fastensor-base": "base",
                                             "fastensor-twin": "twin",
                                             "fastensor-fst": "fst"}[tool]]
    return env


def make_cgroup(limit):
    """A cgroup v2 child with memory.max = @p limit, or (None, why not)."""
    base = "/sys/fs/cgroup"
    try:
        if "memory" not in open(os.path.join(base, "cgroup.controllers")).read().split():
            return None, "cgroup v2 has no memory controller here"
        ctl = os.path.join(base, "cgroup.subtree_control")
        if "memory" not in open(ctl).read().split():
            with open(ctl, "w") as f:
                f.write("+memory")
        cg = os.path.join(base, f"fastensor-bench-{os.getpid()}")
        os.makedirs(cg, exist_ok=True)
        with open(os.path.join(cg, "memory.max"), "w") as f:
            f.write(str(limit))
        return cg, None
    except OSError as e:
        return None, f"cannot set a cgroup memory limit ({e.strerror})"


def free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure_dcp(args, tool, scenario, profiles, paths):
    """A DCP scenario: --ranks processes, one checkpoint directory per tool."""
    if tool not in DCP_TOOLS or (tool == "raw" and scenario == "dcp-async"):
        return None
    env = env_for(tool, profiles, args.base)
    path = paths[tool] + f".ranks{args.ranks}"
    if scenario == "dcp-load" and not drop_caches():
        return None
    if tool == "raw":  # one O_DIRECT writer (reader) per rank, at once
        share = args.size_bytes // args.ranks
        op = "load" if scenario == "dcp-load" else "save"
        barrier = os.path.join(args.work, f"go-raw-{time.time_ns()}")
        procs = [spawn({"tool": "raw", "path": f"{path}.{r}", "device": args.device,
                        "size": share, "op": op, "barrier": barrier}, env)
                 for r in range(args.ranks)]
        time.sleep(0.3)
        open(barrier, "w").close()
        rs = [collect(p) for p in procs]
        os.unlink(barrier)
        span = max(r["end"] for r in rs) - min(r["start"] for r in rs)
        return sum(r["bytes"] for r in rs) / span / 1e9
    port = free_port()
    # NVLink multicast stays off (NCCL, symmetric memory, NVSHMEM): the GPU machines' rule
    env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NVSHMEM_DISABLE_NVLS="1")
    spec = {"tool": tool, "path": path, "device": args.device, "size": args.size_bytes,
            "op": scenario, "weights": args.dcp_data == "weights"}
    procs = [spawn(spec, dict(env, RANK=str(r), WORLD_SIZE=str(args.ranks),
                              LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                              MASTER_PORT=str(port)))
             for r in range(args.ranks)]
    rs = [collect(p) for p in procs]
    return rs[0]["bytes"] / rs[0]["seconds"] / 1e9


def measure(args, tool, scenario, profiles, paths, cgroup):
    if scenario.startswith("dcp-"):
        return measure_dcp(args, tool, scenario, profiles, paths)
    if tool == "fastensor-fst":
        return None
    env = env_for(tool, profiles, args.base)
    spec = {"tool": tool, "path": paths[tool], "device": args.device, "size": args.size_bytes,
            "op": "save" if scenario == "save" else "load"}
    if scenario in ("cold", "procs", "big") and not drop_caches():
        return None
    if scenario == "procs":
        barrier = os.path.join(args.work, f"go-{tool}-{time.time_ns()}")
        procs = [spawn(dict(spec, barrier=barrier), env) for _ in range(args.procs)]
        time.sleep(0.5 + 0.3 * args.procs)  # let them import and wait at the barrier
        open(barrier, "w").close()
        rs = [collect(p) for p in procs]
        os.unlink(barrier)
        span = max(r["end"] for r in rs) - min(r["start"] for r in rs)
        return sum(r["bytes"] for r in rs) / span / 1e9
    if scenario == "big":
        spec["cgroup"] = cgroup
    if scenario in ("repeat2", "repeat3", "big"):
        collect(spawn(spec, env))  # the load before (repeat3: two before) in a process of its own
        if scenario == "repeat3":
            collect(spawn(spec, env))
    if scenario == "big" and not drop_caches():
        return None
    r = collect(spawn(spec, env))
    return r["bytes"] / r["seconds"] / 1e9


def table(results, scenarios, tools):
    pairs = [("fastensor", "safetensors"), ("fastensor", "raw")]
    pairs += [("fastensor", t) for t in ("fastensor-base", "fastensor-twin") if t in tools]
    lines = ["| scenario | " + " | ".join(tools) + " | " +
             " | ".join(f"{a} / {b.replace('fastensor-', '')}" for a, b in pairs) + " |",
             "|---" * (len(tools) + len(pairs) + 1) + "|"]
    for s in scenarios:
        cells, med = [], {}
        for t in tools:
            v = [x for x in results.get(s, {}).get(t, []) if x is not None]
            if v:
                med[t] = statistics.median(v)
                cells.append(f"{med[t]:.2f} ({min(v):.2f}-{max(v):.2f})")
            else:
                cells.append("-")
        def ratio(a, b):
            return f"{med[a] / med[b]:.2f}x" if a in med and b in med and med[b] else "-"
        lines.append(f"| {s} | " + " | ".join(cells) + " | " +
                     " | ".join(ratio(a, b) for a, b in pairs) + " |")
    return "\n".join(lines)


def plot(results, scenarios, tools, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(12, 5))
    w = 0.8 / len(tools)
    for i, t in enumerate(tools):
        ys = [statistics.median(v) if (v := [x for x in results.get(s, {}).get(t, [])
                                              if x is not None]) else 0 for s in scenarios]
        ax.bar([k + i * w for k in range(len(scenarios))], ys, w, label=t)
    ax.set_xticks([k + 0.4 - w / 2 for k in range(len(scenarios))], scenarios)
    ax.set_ylabel("GB/s (median of rounds)")
    ax.legend(ncol=4, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def commit():
    """The commit of the code that ran: FT_COMMIT where the caller says (the GPU machine's copy
    of the tree carries git metadata of some earlier commit), else the tree's own."""
    return os.environ.get("FT_COMMIT") or subprocess.run(
        ["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
        text=True).stdout.strip()


def write_json(args, res, names, tools, skipped, rounds):
    with open(args.json, "w") as f:
        base = args.base and subprocess.run(
            ["git", "-C", args.base, "describe", "--always", "--dirty"], capture_output=True,
            text=True).stdout.strip()
        json.dump({"command": " ".join(sys.argv), "commit": commit(), "base_commit": base or None,
                   "size": args.size_bytes,
                   "device": args.device, "rounds": rounds, "machine": os.uname().nodename,
                   "cpus": os.cpu_count(), "samples_gbps": res, "skipped": skipped,
                   "table": table(res, names, tools)}, f, indent=1)


def parse_size(s):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * m[s[-1].upper()]) if s[-1].upper() in m else int(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--size", default="1G", help="checkpoint bytes (bf16 state dict), e.g. 3G")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--procs", type=int, default=4, help="processes of the procsN scenario")
    ap.add_argument("--ranks", type=int, default=4, help="ranks of the dcp-* scenarios")
    ap.add_argument("--dcp-data", choices=("random", "weights"), default="random",
                    help="the dcp-* scenarios' tensors: random bytes, or weights-like bf16")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--dir", default=None, help="where the checkpoints go (a real disk)")
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--tune-seconds", type=int, default=20)
    ap.add_argument("--json", help="write every sample and the table's medians here")
    ap.add_argument("--plot", help="a PNG of the medians")
    ap.add_argument("--base", help="a checkout of another commit, built (make python): adds "
                    "fastensor-base and fastensor-twin for a paired comparison")
    ap.add_argument("--time-limit", type=float, default=0,
                    help="seconds: start no round after this (the JSON holds the rounds done)")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        if json.loads(args.worker)["op"].startswith("dcp-"):
            # gloo ranks of torch 2.13 abort now and then in the exit-time teardown
            # ("terminate called without an active exception"): the result is out, skip it
            sys.stderr.flush()
            os._exit(0)
        return
    args.size_bytes = parse_size(args.size)
    tools = [t for t in args.tools.split(",") if t]
    if args.base:
        args.base = os.path.abspath(args.base)
        if not os.path.isdir(os.path.join(args.base, "python", "fastensor")):
            sys.exit(f"--base {args.base}: no python/fastensor there (a checkout, built)")
        tools += [t for t in ("fastensor-base", "fastensor-twin") if t not in tools]
    scenarios = [s for s in args.scenarios.split(",") if s]
    compile_sources(os.path.join(ROOT, "python"),
                    *([os.path.join(args.base, "python")] if args.base else []))
    try:
        import safetensors  # noqa: F401
    except ImportError:
        tools = [t for t in tools if t != "safetensors"]
    args.work = tempfile.mkdtemp(prefix="ft-scenarios-", dir=args.dir)
    profiles = {k: os.path.join(args.work, "profile-" + k)
                for k in ("fresh", "tuned", "base", "twin", "fst")}
    for p in profiles.values():
        os.makedirs(p)
    skipped = {}
    if "fastensor-tuned" in tools:
        cli = os.path.join(ROOT, os.environ.get("BUILD", "build"), "fastensor")
        subprocess.run([cli, "tune", "--file", os.path.join(args.work, "tune.bin"), "--seconds",
                        str(args.tune_seconds)] + (["--memory", "cuda"] if args.device != "cpu"
                                                   else []),
                       env=dict(os.environ, FASTENSOR_PROFILE=profiles["tuned"]), check=True,
                       stdout=subprocess.DEVNULL)
    if not drop_caches():
        skipped["cold, procs, big"] = "the page cache cannot be dropped (not root)"
    cgroup, why = make_cgroup(args.size_bytes // 2) if "big" in scenarios else (None, None)
    if "big" in scenarios and not cgroup:
        skipped["big"] = why
        scenarios.remove("big")
    paths = {t: target(t, args.work) for t in tools}
    results = {s: {t: [] for t in tools} for s in scenarios}
    names = [s if s != "procs" else f"procs{args.procs}" for s in scenarios]
    started, done = time.monotonic(), 0
    try:
        for t in tools:  # every tool's checkpoint exists before the first load
            measure(args, t, "save", profiles, paths, cgroup)
            if "dcp-load" in scenarios:
                measure(args, t, "dcp-save", profiles, paths, cgroup)
        for r in range(args.rounds):
            if args.time_limit and r and time.monotonic() - started > args.time_limit:
                skipped["rounds"] = f"{args.rounds - r} of {args.rounds} not run: --time-limit"
                break
            for s in scenarios:
                order = tools[:]
                random.shuffle(order)
                for t in order:
                    gbps = measure(args, t, s, profiles, paths, cgroup)
                    results[s][t].append(gbps)
                    print(f"round {r + 1} {s:8s} {t:16s} "
                          f"{'-' if gbps is None else f'{gbps:.2f} GB/s'}", file=sys.stderr)
            done = r + 1
            if args.json:  # after every round: a run cut short keeps what it measured
                write_json(args, {n: results[s] for n, s in zip(names, scenarios)}, names,
                           tools, skipped, done)
    finally:
        if cgroup:
            try:
                os.rmdir(cgroup)
            except OSError:
                pass
        shutil.rmtree(args.work, ignore_errors=True)
    res = {n: results[s] for n, s in zip(names, scenarios)}
    md = table(res, names, tools)
    print(f"\n{args.size} bf16 state dict, device {args.device}, {done} rounds, "
          f"GB/s median (range)\n\n{md}")
    for k, v in skipped.items():
        print(f"\nskipped {k}: {v}")
    if args.json:
        write_json(args, res, names, tools, skipped, done)
    if args.plot:
        plot(res, names, tools, args.plot)


if __name__ == "__main__":
    main()
