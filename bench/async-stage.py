#!/usr/bin/env python3
"""DCP async saves of a GPU state dict, staged as copies or as coded streams: one process
saving again and again (as a training job does) with fastensor.dcp's FastensorWriter, plain
(safetensors data files, the staging a pinned copy of the tensors), compressed (.fst data
files, compression="always" or --compression: where the GPU codes the tensors, the staging
is their coded streams) and plain again (its twin, the noise floor), interleaved, each
first in turn. Per save: the time async_save blocks the caller, the time to the durable
commit, and the host memory kept for staging; medians (range) and ratios to the plain save.

    PYTHONPATH=python python3 bench/async-stage.py --size 2G --dir /nvme/dir --rounds 5 \
        [--json out.json]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

import fastensor.dcp as fdcp  # noqa: E402
from fastensor import _fst  # noqa: E402
from codec import gpt2, llama, nbytes_of  # noqa: E402  (bench/codec.py's state dicts)

TOOLS = ("plain", "fst", "twin")


def staging_bytes(sig, tool):
    """The host memory kept for the next save's staging of this tool."""
    if tool == "fst":
        return sum(_fst.coded_memory(c) for c in fdcp._STAGING.free.get(("fst", sig), []))
    return sum(t.numel() * t.element_size()
               for kept in fdcp._STAGING.free.get(sig, []) for t in kept)


def wait_kept(sig, tool, seconds=120):
    """Wait for the staging memory a first save leaves (made in the background)."""
    deadline = time.monotonic() + seconds
    while not staging_bytes(sig, tool) and time.monotonic() < deadline:
        time.sleep(0.02)


def save(sd, path, compression):
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    fut = dcp.async_save(sd, storage_writer=fdcp.FastensorWriter(path, compression=compression))
    blocked = time.perf_counter() - t0
    fut.result()
    return blocked, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama-bf16", help="llama-bf16 (--size bytes) or gpt2-fp32")
    ap.add_argument("--size", default="1G", help="bytes of the bf16 state dict (K, M, G)")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compression", default="always", help='the compressed saves\' ("auto")')
    ap.add_argument("--device", default="cuda", help="cuda (default), or cpu (no GPU codes)")
    ap.add_argument("--json")
    a = ap.parse_args()
    sd = gpt2() if a.model == "gpt2-fp32" else llama(nbytes_of(a.size))
    sd = {k: v.to(a.device) for k, v in sd.items()}
    gpu = torch.cuda.get_device_name() if a.device.startswith("cuda") else "no GPU"
    total = sum(t.numel() * t.element_size() for t in sd.values())
    sig = fdcp._signature(sd)
    codes = fdcp._codes_on_gpu(list(sd.values()), a.compression)
    print(f"{a.model}: {total / 2**30:.2f} GiB in {a.device} memory, {len(sd)} tensors, "
          f"{gpu}, {os.cpu_count()} CPUs, {a.dir}; the GPU codes them: {codes}")
    mode = {"plain": None, "twin": None, "fst": a.compression}
    path = {t: os.path.join(a.dir, f"async-stage-{os.getpid()}-{t}") for t in TOOLS}
    kind = {"plain": "plain", "twin": "plain", "fst": "fst" if codes else "plain"}
    for tool in ("plain", "fst"):  # first saves: the staging memory made after each
        save(sd, path[tool], mode[tool])
        wait_kept(sig, kind[tool])
    runs = {t: [] for t in TOOLS}
    try:
        for r in range(a.rounds):
            for tool in TOOLS[r % 3:] + TOOLS[:r % 3]:
                sd[next(iter(sd))].add_(1)  # (a training step's change)
                kept = staging_bytes(sig, kind[tool])
                blocked, secs = save(sd, path[tool], mode[tool])
                runs[tool].append({"blocked": blocked, "seconds": secs, "staging": kept})
                print(f"  round {r + 1} {tool}: blocked {blocked * 1e3:.1f} ms, done "
                      f"{secs:.3f} s, staging memory {kept / 2**30:.2f} GiB", flush=True)
    finally:
        for p in path.values():
            shutil.rmtree(p, ignore_errors=True)

    def med(tool, key):
        v = [x[key] for x in runs[tool]]
        return statistics.median(v), min(v), max(v)
    print("\n| save | blocked ms | / plain | done s | GB/s | / plain | staging GiB |")
    print("|---|---|---|---|---|---|---|")
    summary = {}
    for tool in TOOLS:
        b, bl, bh = med(tool, "blocked")
        d, dl, dh = med(tool, "seconds")
        pb, pd = med("plain", "blocked")[0], med("plain", "seconds")[0]
        st = med(tool, "staging")[0]
        print(f"| {tool} | {b * 1e3:.1f} ({bl * 1e3:.1f}-{bh * 1e3:.1f}) | {b / pb:.2f}x | "
              f"{d:.3f} ({dl:.3f}-{dh:.3f}) | {total / d / 1e9:.2f} | {pd / d:.2f}x | "
              f"{st / 2**30:.2f} |")
        summary[tool] = {"blocked_s": b, "seconds": d, "staging_bytes": st}
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "bytes": total, "gpu": gpu,
                       "gpu_codes": codes, "compression": a.compression, "runs": runs,
                       "median": summary}, f, indent=1)


if __name__ == "__main__":
    main()
