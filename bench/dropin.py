#!/usr/bin/env python3
"""The drop-in calls against the whole-file ones, the way a loader uses them.

  get_tensor  every tensor of a checkpoint through one `fastensor.safe_open`, one after the
              other (as transformers' loaders do), against `fastensor.torch.load_file` of the
              same file, and safetensors' `safe_open` loop; each in a fresh process, the
              file in the page cache (a warm load: the loop's own cost shows), interleaved
              rounds, host tensors read once to the last page; GB/s median (range) and the
              ratio to load_file.
  async       `save_file_async` of a state dict on the device: the time the caller is
              blocked, first call of a process and second, against the plain copy of the
              same bytes into pinned host memory allocated beforehand (CUDA) or into memory
              allocated beforehand (CPU); that allocation's time is shown too.

    PYTHONPATH=python python3 bench/dropin.py --size 2G --device cuda --dir /nvme \\
        --json dropin.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def state(size, device, seed=0):
    import torch
    g = torch.Generator().manual_seed(seed)
    out, n, i = {}, 0, 0
    while n < size:
        rows = 2048 if i % 3 else 512
        t = torch.randn(rows, 4096, generator=g).to(torch.bfloat16)
        out[f"layers.{i}.weight"] = t.to(device)
        n += t.numel() * 2
        i += 1
    return out


def worker(spec):
    import torch
    dev = spec["device"]
    if dev.startswith("cuda"):
        torch.zeros(1, device=dev)
    path, tool = spec["path"], spec["tool"]
    if spec["op"] == "async":
        import fastensor.torch as ft
        sd = state(spec["size"], dev)
        n = sum(t.numel() * t.element_size() for t in sd.values())
        blocked, where = [], []
        for k in range(2):
            f = ft.save_file_async(sd, path + f".{k}")
            blocked.append(f.blocked_seconds)
            where.append(f.snapshot)
            f.result()
        pinned = dev.startswith("cuda")
        t0 = time.perf_counter()
        copies = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=pinned) for k, v in sd.items()}
        alloc = time.perf_counter() - t0
        t0 = time.perf_counter()
        for k, v in sd.items():
            copies[k].copy_(v, non_blocking=pinned)
        if pinned:
            torch.cuda.synchronize()
        copy = time.perf_counter() - t0
        return {"bytes": n, "first": blocked[0], "second": blocked[1], "copy": copy,
                "alloc": alloc, "snapshot": where}
    t0 = time.perf_counter()
    if tool == "load_file":
        import fastensor.torch as ft
        out = ft.load_file(path, device=dev)
    elif tool == "safe_open":
        import fastensor
        with fastensor.safe_open(path, framework="pt", device=dev) as f:
            out = {k: f.get_tensor(k) for k in f.keys()}
    else:
        import safetensors
        with safetensors.safe_open(path, framework="pt", device=dev) as f:
            out = {k: f.get_tensor(k) for k in f.keys()}
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
    else:  # every page read once: tensors that view a mapping pay for the pages they map
        for t in out.values():
            t.reshape(-1).view(torch.uint8)[::4096].sum()
    secs = time.perf_counter() - t0
    return {"bytes": sum(t.numel() * t.element_size() for t in out.values()), "seconds": secs}


def run(spec):
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(HERE), "python") +
               os.pathsep + os.environ.get("PYTHONPATH", ""), FASTENSOR_QUIET="1")
    r = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        raise RuntimeError(r.stderr[-800:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--size", default="1G")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(json.loads(a.worker))))
        return
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    size = int(float(a.size[:-1]) * mult[a.size[-1]]) if a.size[-1] in mult else int(a.size)
    from scenarios import compile_sources
    compile_sources(os.path.join(os.path.dirname(HERE), "python"))  # (as installed: compiled)
    work = tempfile.mkdtemp(prefix="ft-dropin-", dir=a.dir)
    path = os.path.join(work, "model.safetensors")
    import fastensor.torch as ft
    ft.save_file(state(size, "cpu"), path)
    tools = ["load_file", "safe_open", "safetensors"]
    res = {t: [] for t in tools}
    asyncs = []
    try:
        run({"tool": "load_file", "path": path, "device": a.device, "op": "load"})  # warm
        for r in range(a.rounds):
            for t in tools[r % 3:] + tools[:r % 3]:
                x = run({"tool": t, "path": path, "device": a.device, "op": "load"})
                res[t].append(x["bytes"] / x["seconds"] / 1e9)
                print(f"round {r + 1} {t:12s} {res[t][-1]:.2f} GB/s", file=sys.stderr)
            asyncs.append(run({"tool": "async", "path": os.path.join(work, "async.safetensors"),
                               "device": a.device, "op": "async", "size": size}))
            print(f"round {r + 1} async {asyncs[-1]}", file=sys.stderr)
    finally:
        for f in os.listdir(work):
            os.unlink(os.path.join(work, f))
        os.rmdir(work)
    med = {t: statistics.median(v) for t, v in res.items()}
    lines = [f"{a.size} bf16, device {a.device}, file in the page cache, {a.rounds} rounds, "
             "fresh processes", "", "| call | GB/s median (range) | / load_file |", "|---|---|---|"]
    for t, v in res.items():
        lines.append(f"| {t} | {med[t]:.2f} ({min(v):.2f}-{max(v):.2f}) | "
                     f"{med[t] / med['load_file']:.2f}x |")
    m = {k: statistics.median(x[k] for x in asyncs) for k in ("first", "second", "copy",
                                                              "alloc")}
    lines += ["", "| save_file_async blocked | s, median (range) | / plain copy | snapshot |",
              "|---|---|---|---|"]
    for i, k in enumerate(("first", "second")):
        v = [x[k] for x in asyncs]
        lines.append(f"| {k} call | {m[k]:.4f} ({min(v):.4f}-{max(v):.4f}) | "
                     f"{m[k] / m['copy']:.2f}x | {asyncs[-1]['snapshot'][i]} |")
    lines.append(f"| plain copy into memory allocated before | {m['copy']:.4f} | 1.00x | |")
    lines.append(f"| (allocating that memory) | {m['alloc']:.4f} | "
                 f"{m['alloc'] / m['copy']:.2f}x | |")
    print("\n".join(lines))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "size": size, "device": a.device,
                       "gbps": res, "async": asyncs, "table": "\n".join(lines)}, f, indent=1)


if __name__ == "__main__":
    main()
