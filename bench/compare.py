#!/usr/bin/env python3
"""Save and load the same state dicts with fastensor and the usual tools, side by side.

Models (synthetic weights, real layer shapes): gpt2 (GPT-2 small, fp32, 0.5 GB), vit-b16
(ViT-B/16, fp32, 0.35 GB), vit-h14 (ViT-H/14, fp32, 2.5 GB), llama-1b (16 x 2048 decoder,
bf16, 2.5 GB). Tools: fastensor (auto and each engine), torch.save/torch.load,
numpy.save/numpy.load (one .npy per tensor in a directory), safetensors (when installed),
and the raw ceiling (fio, sequential O_DIRECT, same bytes) when fio is installed. Saves are
durable for every tool (fsync of what it wrote); cold loads follow a page-cache drop (root),
warm loads a plain read of the file(s) through the page cache. With --repeat N, N rounds
(fio and every tool once each, so the disk's fast and slow phases fall on all alike) and
the median of each.

    PYTHONPATH=python /usr/bin/python3 bench/compare.py --models gpt2,llama-1b --json out.json
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

import fastensor
import fastensor.torch as ftt

try:
    import safetensors.torch as sft
except ImportError:
    sft = None


def llama(layers, d, ffn, vocab, dtype):
    sd = {"embed_tokens.weight": (vocab, d)}
    for i in range(layers):
        for n, s in (("q_proj", (d, d)), ("k_proj", (d, d)), ("v_proj", (d, d)),
                     ("o_proj", (d, d)), ("gate_proj", (ffn, d)), ("up_proj", (ffn, d)),
                     ("down_proj", (d, ffn)), ("input_layernorm", (d,)),
                     ("post_attention_layernorm", (d,))):
            sd[f"layers.{i}.{n}.weight"] = s
    sd["norm.weight"] = (d,)
    sd["lm_head.weight"] = (vocab, d)
    return sd, dtype


def gpt2(layers=12, d=768, vocab=50257):
    sd = {"wte.weight": (vocab, d), "wpe.weight": (1024, d)}
    for i in range(layers):
        for n, s in (("ln_1.weight", (d,)), ("ln_1.bias", (d,)), ("attn.c_attn.weight", (d, 3 * d)),
                     ("attn.c_attn.bias", (3 * d,)), ("attn.c_proj.weight", (d, d)),
                     ("attn.c_proj.bias", (d,)), ("ln_2.weight", (d,)), ("ln_2.bias", (d,)),
                     ("mlp.c_fc.weight", (d, 4 * d)), ("mlp.c_fc.bias", (4 * d,)),
                     ("mlp.c_proj.weight", (4 * d, d)), ("mlp.c_proj.bias", (d,))):
            sd[f"h.{i}.{n}"] = s
    sd["ln_f.weight"] = (d,)
    sd["ln_f.bias"] = (d,)
    return sd, torch.float32


def vit(layers, d, mlp, patch, img=224, classes=1000):
    sd = {"patch_embed.proj.weight": (d, 3, patch, patch), "patch_embed.proj.bias": (d,),
          "cls_token": (1, 1, d), "pos_embed": (1, (img // patch) ** 2 + 1, d)}
    for i in range(layers):
        for n, s in (("norm1.weight", (d,)), ("norm1.bias", (d,)), ("attn.qkv.weight", (3 * d, d)),
                     ("attn.qkv.bias", (3 * d,)), ("attn.proj.weight", (d, d)),
                     ("attn.proj.bias", (d,)), ("norm2.weight", (d,)), ("norm2.bias", (d,)),
                     ("mlp.fc1.weight", (mlp, d)), ("mlp.fc1.bias", (mlp,)),
                     ("mlp.fc2.weight", (d, mlp)), ("mlp.fc2.bias", (d,))):
            sd[f"blocks.{i}.{n}"] = s
    sd["norm.weight"] = (d,)
    sd["norm.bias"] = (d,)
    sd["head.weight"] = (classes, d)
    sd["head.bias"] = (classes,)
    return sd, torch.float32


MODELS = {
    "gpt2": lambda: gpt2(),
    "vit-b16": lambda: vit(12, 768, 3072, 16),
    "vit-h14": lambda: vit(32, 1280, 5120, 14),
    "llama-1b": lambda: llama(16, 2048, 8192, 32000, torch.bfloat16),
}


def make_state(name, device):
    shapes, dtype = MODELS[name]()
    g = torch.Generator().manual_seed(0)
    sd = {k: torch.randn(s, generator=g).to(dtype) for k, s in shapes.items()}
    if torch.device(device).type != "cpu":
        sd = {k: v.to(device) for k, v in sd.items()}
    return sd


def nbytes(sd):
    return sum(t.numel() * t.element_size() for t in sd.values())


def drop_caches():
    os.sync()
    if os.geteuid() == 0:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    return False


def fsync_path(path):
    paths = [path] if os.path.isfile(path) else [os.path.join(path, f) for f in os.listdir(path)]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    d = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    os.fsync(d)
    os.close(d)


def sync_device(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


# ---- the tools: (save(sd, path), load(path, device) -> dict) ----

def fastensor_tool(engine):
    return (lambda sd, p: ftt.save_file(sd, p, engine=engine),
            lambda p, dev: ftt.load_file(p, device=dev, engine=engine))


def torch_save(sd, p):
    torch.save(sd, p)
    fsync_path(p)


def torch_load(p, dev):
    return torch.load(p, map_location=dev)


def numpy_save(sd, p):
    os.makedirs(p, exist_ok=True)
    for i, (k, t) in enumerate(sd.items()):
        t = t.detach().cpu()
        arr = t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
        np.save(os.path.join(p, f"{i}.npy"), arr)
    fsync_path(p)


def numpy_load(p, dev):
    out = {}
    for f in sorted(os.listdir(p), key=lambda s: int(s.split(".")[0])):
        arr = np.load(os.path.join(p, f))
        t = torch.from_numpy(arr)
        out[f] = t.to(dev) if torch.device(dev).type != "cpu" else t
    return out


def st_save(sd, p):
    sft.save_file({k: v.contiguous() for k, v in sd.items()}, p)
    fsync_path(p)


def st_load(p, dev):
    return sft.load_file(p, device=str(dev))


def remove(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.unlink(path)


def fill_cache(path):
    """Read the file(s) at path through the page cache, the same way for every tool (a
    tool's own load may bypass the cache: O_DIRECT engines, or AUTO on a cold file). Twice:
    the kernel activates a cached page on its second read, work a timed load would pay if
    it were that second read (after an O_DIRECT cold load) and not after a buffered one."""
    paths = [os.path.join(path, n) for n in sorted(os.listdir(path))] if os.path.isdir(path) else [path]
    buf = bytearray(16 << 20)
    for _ in range(2):
        for p in paths:
            with open(p, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass


def fio_ceiling(path, size):
    """(write GB/s, read GB/s) of fio's sequential O_DIRECT io_uring at depth 4, or None."""
    if not shutil.which("fio"):
        return None
    out = []
    for rw in ("write", "read"):
        if rw == "read":
            drop_caches()
        r = subprocess.run(["fio", "--name=c", f"--filename={path}", f"--rw={rw}", "--bs=64M",
                            f"--size={size}", "--direct=1", "--ioengine=io_uring",
                            "--iodepth=4", "--end_fsync=1", "--output-format=json"],
                           capture_output=True, text=True)
        if r.returncode:
            return None
        out.append(json.loads(r.stdout)["jobs"][0][rw]["bw_bytes"] / 1e9)
    os.unlink(path)
    return tuple(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2,vit-b16,llama-1b")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--dir", default=".", help="where the files go (a real disk)")
    ap.add_argument("--engines", default="auto,posix,direct,uring,mmap")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds (fio's ceiling and every tool once each), median reported")
    ap.add_argument("--cache", default="cold,warm")
    ap.add_argument("--json", help="write all measurements here")
    ap.add_argument("--plot", help="draw a PNG chart here (needs matplotlib)")
    ap.add_argument("--skip", default="", help="tools to leave out, e.g. numpy,torch")
    args = ap.parse_args()
    device = torch.device(args.device)
    tools = {f"fastensor-{e}": fastensor_tool(e) for e in args.engines.split(",")}
    tools["torch"] = (torch_save, torch_load)
    tools["numpy"] = (numpy_save, numpy_load)
    if sft:
        tools["safetensors"] = (st_save, st_load)
    for s in filter(None, args.skip.split(",")):
        tools.pop(s, None)
    caches = args.cache.split(",")
    root = tempfile.mkdtemp(prefix="fastensor-compare-", dir=args.dir)
    results = []
    can_drop = os.geteuid() == 0
    if not can_drop:
        print("note: not root, so 'cold' loads cannot drop the page cache", file=sys.stderr)
    try:
        for model in args.models.split(","):
            sd = make_state(model, device)
            size = nbytes(sd)
            print(f"\n## {model}: {len(sd)} tensors, {size / 1e9:.2f} GB, on {device}\n", flush=True)
            # Rounds: in each, fio's ceiling and then every tool once (save, then its loads),
            # so that a slow or fast phase of the disk falls on all of them alike, the tools'
            # order rotated each round (what ran just before matters: memory freed a moment
            # ago is still backed, long-freed memory is slow to touch again in a VM);
            # reported: the median over the rounds.
            times = {name: {} for name in (["fio-ceiling"] if shutil.which("fio") else []) + list(tools)}
            for rnd in range(args.repeat):
                ceil = fio_ceiling(os.path.join(root, "fio.bin"), size)
                if ceil:
                    times["fio-ceiling"].setdefault("save", []).append(size / ceil[0] / 1e9)
                    times["fio-ceiling"].setdefault("load-cold", []).append(size / ceil[1] / 1e9)
                items = list(tools.items())
                for name, (save, load) in items[rnd % len(items):] + items[:rnd % len(items)]:
                    t = times[name]
                    path = os.path.join(root, f"{model}-{name}")
                    remove(path)
                    sync_device(device)
                    t0 = time.perf_counter()
                    save(sd, path)
                    t.setdefault("save", []).append(time.perf_counter() - t0)
                    for cache in caches:
                        if cache == "cold":
                            drop_caches()
                        else:
                            fill_cache(path)
                        sync_device(device)
                        t0 = time.perf_counter()
                        out = load(path, device)
                        sync_device(device)
                        t.setdefault(f"load-{cache}", []).append(time.perf_counter() - t0)
                        del out
                    remove(path)
            for name, t in times.items():
                if not t:
                    continue
                for key, ts in t.items():
                    op, _, cache = key.partition("-")
                    sec = statistics.median(ts)
                    results.append(dict(model=model, tool=name, op=op, cache=cache or "cold",
                                        seconds=sec, gbps=size / sec / 1e9, bytes=size,
                                        device=str(device), rounds=[size / x / 1e9 for x in ts]))
                print(f"  {name:18s} " + "  ".join(f"{k} {size / statistics.median(v) / 1e9:6.2f} GB/s"
                                                   for k, v in t.items()), flush=True)
            del sd
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.plot:
        plot(results, args.plot)


def print_table(results):
    """Markdown table; the ratio is the median of the rounds' ratios (each round's runs are
    close in time, so pairing them takes out most of the disk's swings) when there are
    several rounds, else the ratio of the figures."""
    print("\n| model | op | cache | tool | GB/s | fastensor-auto / tool |")
    print("|---|---|---|---|---|---|")
    for r in results:
        ref = next((x for x in results if x["model"] == r["model"] and x["op"] == r["op"]
                    and x["cache"] == r["cache"] and x["tool"] == "fastensor-auto"), None)
        ratio = "-"
        if ref:
            a, b = ref.get("rounds", []), r.get("rounds", [])
            if len(a) > 1 and len(a) == len(b):
                ratio = f"{statistics.median(x / y for x, y in zip(a, b)):.2f}x"
            else:
                ratio = f"{ref['gbps'] / r['gbps']:.2f}x"
        print(f"| {r['model']} | {r['op']} | {r['cache']} | {r['tool']} | {r['gbps']:.2f} | {ratio} |")


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    keys = sorted({(r["model"], r["op"], r["cache"]) for r in results})
    tools = sorted({r["tool"] for r in results})
    fig, ax = plt.subplots(figsize=(max(8, len(keys) * 1.6), 5))
    w = 0.8 / len(tools)
    for i, t in enumerate(tools):
        vals = [next((r["gbps"] for r in results if (r["model"], r["op"], r["cache"]) == k
                      and r["tool"] == t), 0) for k in keys]
        ax.bar([j + i * w for j in range(len(keys))], vals, w, label=t)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(keys))])
    ax.set_xticklabels([f"{m}\n{o} {c}" for m, o, c in keys], fontsize=8)
    ax.set_ylabel("GB/s")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
