#!/usr/bin/env python3
"""Activation offload: larger batches under a GPU memory cap, and step time side by side.

Models (defined here, plain PyTorch, deterministic kernels): a ViT-style encoder (patch
embedding, pre-LN blocks with explicit softmax attention, GELU MLP) and a BERT-style encoder
(token embedding, post-LN blocks). For each model:

1. Under a cap (torch.cuda.set_per_process_memory_fraction), the largest batch that trains
   (forward, backward, SGD step) without offload and with fastensor's offload (searched by
   doubling, then bisection, up to --max-ratio times the first).
2. Losses of the first steps at a common batch, without and with offload (must be equal).
3. At a batch that fits without offload, the step time of: no offload; fastensor offload
   (engine auto: through the page cache while the spill file is within an eighth of the
   available memory, as the torch.save baseline goes, then O_DIRECT); fastensor:direct
   (O_DIRECT: the disk itself); fastensor with a host-RAM tier holding the step's bytes;
   torch.autograd.graph.save_on_cpu(pin_memory=True); and the paper's baseline, hooks that
   torch.save / torch.load one file per tensor. Bytes offloaded per step, GB/s achieved,
   stall time, and whether the offloaded bytes / disk bandwidth are below the compute time
   (the case where offload should cost <= 15%). Where they are not (the disk is too slow
   for the whole step's activations), the same comparison with only the first K blocks
   offloaded, K sized so that they are (about half the compute time).

On a machine without CUDA the same comparison runs on host memory (no cap search).

    PYTHONPATH=python /usr/bin/python3 bench/offload.py --dir /nvme/spill --json out.json
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

import torch  # noqa: E402

import fastensor.torch as ftt  # noqa: E402
from fastensor.offload import measure_read_bandwidth  # noqa: E402

torch.use_deterministic_algorithms(True, warn_only=True)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


class Attention(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        out = att.softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class Block(torch.nn.Module):
    def __init__(self, d, heads, pre_ln):
        super().__init__()
        self.pre_ln = pre_ln
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.att = Attention(d, heads)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d, d))

    def forward(self, x):
        if self.pre_ln:
            x = x + self.att(self.ln1(x))
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.att(x))
        return self.ln2(x + self.mlp(x))


class ViT(torch.nn.Module):
    def __init__(self, depth, d, heads, image=224, patch=16, classes=1000):
        super().__init__()
        self.patch = patch
        self.embed = torch.nn.Linear(3 * patch * patch, d)
        self.cls = torch.nn.Parameter(torch.zeros(1, 1, d))
        self.pos = torch.nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, d) * 0.02)
        self.blocks = torch.nn.Sequential(*[Block(d, heads, True) for _ in range(depth)])
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, classes)

    def forward(self, img):
        b, c, h, w = img.shape
        p = self.patch
        x = img.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(
            b, (h // p) * (w // p), c * p * p)
        x = torch.cat([self.cls.expand(b, -1, -1), self.embed(x)], 1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


class Bert(torch.nn.Module):
    def __init__(self, depth, d, heads, seq=512, vocab=30522):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.randn(1, seq, d) * 0.02)
        self.ln = torch.nn.LayerNorm(d)
        self.blocks = torch.nn.Sequential(*[Block(d, heads, False) for _ in range(depth)])
        self.head = torch.nn.Linear(d, 2)

    def forward(self, ids):
        return self.head(self.blocks(self.ln(self.tok(ids) + self.pos))[:, 0])


MODELS = {
    "vit": lambda a: (ViT(a.depth, a.width, a.heads, a.image), "image"),
    "bert": lambda a: (Bert(a.depth, a.width, a.heads, a.seq), "tokens"),
}


def make_batch(kind, batch, args, device, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "image":
        x = torch.randn(batch, 3, args.image, args.image, generator=g)
        y = torch.randint(0, 1000, (batch,), generator=g)
    else:
        x = torch.randint(0, 30522, (batch, args.seq), generator=g)
        y = torch.randint(0, 2, (batch,), generator=g)
    return x.to(device), y.to(device)


class TorchSaveHooks(torch.autograd.graph.saved_tensors_hooks):
    """The paper's baseline: one torch.save'd file per saved tensor, loaded back at unpack."""

    def __init__(self, directory, min_bytes):
        self.dir = directory

        def pack(t):
            if t.numel() * t.element_size() < min_bytes or (t.is_leaf and t.requires_grad):
                return t
            path = os.path.join(self.dir, uuid.uuid4().hex + ".pt")
            torch.save(t, path)
            return (path, t.device)

        def unpack(p):
            if isinstance(p, torch.Tensor):
                return p
            t = torch.load(p[0], map_location=p[1])
            os.remove(p[0])
            return t
        super().__init__(pack, unpack)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step(model, opt, x, y, hooks):
    opt.zero_grad(set_to_none=True)
    if hooks is None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
    else:
        with hooks:
            loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def is_oom(e):
    text = str(e)
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in text


def trains(make, kind, batch, args, device, offload):
    """Whether one training step at ``batch`` fits under the cap."""
    model = opt = x = y = off = None
    try:
        model = make().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        x, y = make_batch(kind, batch, args, device, 0)
        off = ftt.offload_activations(args.dir, min_bytes=args.min_bytes,
                                      prefetch_bytes=args.prefetch) if offload else None
        step(model, opt, x, y, off)
        sync(device)
        return True
    except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
        if not is_oom(e):
            raise
        return False
    finally:
        if off is not None:
            off.close()
        del model, opt, x, y, off
        if device.type == "cuda":
            torch.cuda.empty_cache()


def largest_batch(make, kind, args, device, offload, start, limit):
    """Doubling from ``start`` then bisection; (largest that trains, whether limit was hit)."""
    good, bad, b = 0, None, start
    while b <= limit:
        t0 = time.perf_counter()
        ok = trains(make, kind, b, args, device, offload)
        print(f"    batch {b:5d} {'offload' if offload else 'plain  '}: "
              f"{'fits' if ok else 'OOM '} ({time.perf_counter() - t0:.1f} s)", flush=True)
        if not ok:
            bad = b
            break
        good, b = b, b * 2
    if bad is None:
        return good, True
    while bad - good > max(1, good // 8):
        mid = (good + bad) // 2
        if trains(make, kind, mid, args, device, offload):
            good = mid
        else:
            bad = mid
        print(f"    bisect -> [{good}, {bad})", flush=True)
    return good, False


class Scoped(torch.nn.Module):
    """A block run inside the hooks: only its saved tensors are offloaded."""

    def __init__(self, inner, hooks):
        super().__init__()
        self.inner, self.hooks = inner, hooks

    def forward(self, x):
        with self.hooks:
            return self.inner(x)


def time_mode(make, kind, batch, args, device, mode, steps):
    """Step times of one mode: none, fastensor[:ENGINE][@K] (@K: only the first K blocks
    offloaded), fastensor-check, fastensor+ram, save_on_cpu, torch.save."""
    torch.manual_seed(0)
    model = make().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    spill = tempfile.mkdtemp(prefix="offload-", dir=args.dir)
    hooks, losses, times = None, [], []
    step_bytes = None
    mode, _, scope = mode.partition("@")
    if mode.startswith("fastensor:") or mode == "fastensor":  # fastensor[:ENGINE]
        hooks = ftt.offload_activations(args.dir, min_bytes=args.min_bytes,
                                        prefetch_bytes=args.prefetch,
                                        engine=mode.partition(":")[2] or "auto")
    elif mode == "fastensor-check":
        hooks = ftt.offload_activations(args.dir, min_bytes=args.min_bytes,
                                        prefetch_bytes=args.prefetch, _check=True)
    elif mode == "fastensor+ram":
        hooks = ftt.offload_activations(args.dir, min_bytes=args.min_bytes,
                                        prefetch_bytes=args.prefetch,
                                        host_cache_bytes=args.ram_tier)
    elif mode == "save_on_cpu":
        hooks = torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda")
    elif mode == "torch.save":
        hooks = TorchSaveHooks(spill, args.min_bytes)
    outer = hooks
    if scope:
        for i in range(int(scope)):
            model.blocks[i] = Scoped(model.blocks[i], hooks)
        outer = None
    try:
        for i in range(steps + 1):  # the first step warms up (allocator, pinned memory)
            x, y = make_batch(kind, batch, args, device, 100 + i)
            sync(device)
            before = hooks.stats() if isinstance(hooks, ftt.offload_activations) else None
            t0 = time.perf_counter()
            losses.append(float(step(model, opt, x, y, outer)))
            sync(device)
            if i:
                times.append(time.perf_counter() - t0)
            if before is not None:
                after = hooks.stats()
                step_bytes = after["bytes_offloaded"] - before["bytes_offloaded"]
                step_read = after["bytes_read"] - before["bytes_read"]
                stall = after["stall_seconds"] - before["stall_seconds"]
        out = {"mode": mode + ("@" + scope if scope else ""), "batch": batch,
               "step_s": statistics.median(times), "times": times, "losses": losses}
        if step_bytes is not None:
            out.update(bytes_per_step=step_bytes, read_per_step=step_read, stall_s=stall,
                       gbps=2 * step_bytes / out["step_s"] / 1e9,
                       peak_inflight_bytes=hooks.stats()["peak_inflight_bytes"])
        return out
    finally:
        if isinstance(hooks, ftt.offload_activations):
            hooks.close()
        shutil.rmtree(spill, ignore_errors=True)
        del model, opt
        if device.type == "cuda":
            torch.cuda.empty_cache()


def store_throughput(args, device, total=1 << 30, entry=16 << 20):
    """The store alone: ``total`` bytes put as ``entry``-sized tensors, flushed, then got
    back newest first with prefetch running ahead (an activation's life), in GB/s."""
    import fastensor
    n = total // entry
    src = [torch.full((entry,), i % 251, dtype=torch.uint8, device=device) for i in range(n)]
    out = torch.empty(entry, dtype=torch.uint8, device=device)
    ring = (args.prefetch or (256 << 20)) + (256 << 20)
    with fastensor.SpillStore(args.dir, staging_bytes=ring) as st:
        sync(device)
        t0 = time.perf_counter()
        keys = [st.put(t) for t in src]
        st.flush()
        t_put = time.perf_counter() - t0
        ahead = max(1, (args.prefetch or (256 << 20)) // entry)
        t0 = time.perf_counter()
        for j in range(min(ahead, n)):
            st.prefetch(keys[n - 1 - j])
        for i in reversed(range(n)):
            if i - ahead >= 0:
                st.prefetch(keys[i - ahead])
            st.get(keys[i], out)
            st.wait(keys[i])
            st.drop(keys[i])
        sync(device)
        t_get = time.perf_counter() - t0
        if not torch.equal(out, src[0]):
            raise RuntimeError("store round trip changed the data")
        engine = st.stats()["engine"]
    return {"engine": engine, "bytes": n * entry, "put_gbps": n * entry / t_put / 1e9,
            "get_gbps": n * entry / t_get / 1e9}


def print_rows(rows, base, tsave):
    print(f"    {'mode':20s} {'step s':>8s} {'vs none':>8s} {'vs torch.save':>14s} "
          f"{'GB/step':>8s} {'GB read':>8s} {'GB/s':>6s} {'stall s':>8s}")
    for r in rows:
        vs = r["step_s"] / base["step_s"] if base else float("nan")
        vt = f"{tsave['step_s'] / r['step_s']:13.1f}x" if tsave else f"{'-':>14s}"
        extra = (f"{r['bytes_per_step'] / 1e9:8.2f} {r['read_per_step'] / 1e9:8.2f} "
                 f"{r['gbps']:6.2f} {r['stall_s']:8.3f}" if "bytes_per_step" in r else "")
        print(f"    {r['mode']:20s} {r['step_s']:8.3f} {vs:7.2f}x {vt} {extra}")


def partial_offload(make, kind, batch, args, device, base, full, bw):
    """Where offloading everything is disk-bound, offload only the first K blocks (their
    activations are wanted last in the backward pass), K chosen so that the offloaded bytes /
    disk bandwidth are about half the compute time, and compare with no offload; through
    O_DIRECT, so that the disk itself is what the condition is about."""
    k = max(1, int(args.depth * 0.5 * base["step_s"] * bw / full["bytes_per_step"]))
    steps, rounds = max(args.steps, 5), 3
    rows = {}
    for _ in range(rounds):  # interleaved: the GPU's step time drifts between runs
        for m in ("none", f"fastensor:direct@{k}"):
            r = time_mode(make, kind, batch, args, device, m, steps)
            if m in rows:
                r["times"] += rows[m]["times"]
                r["step_s"] = statistics.median(r["times"])
            rows[m] = r
    rows = list(rows.values())
    none, part = rows
    io_s = part["bytes_per_step"] / bw
    print(f"  first {k} of {args.depth} blocks offloaded (median of {rounds} x {steps} steps, "
          f"interleaved):")
    print_rows(rows, none, None)
    ratio = part["step_s"] / none["step_s"]
    print(f"  offloaded bytes / disk read bandwidth = {io_s:.3f} s vs compute "
          f"{none['step_s']:.3f} s: step time {ratio:.2f}x of no offload "
          f"({'within' if ratio <= 1.15 else 'over'} the 1.15x target)")
    return {"blocks": k, "io_s": io_s, "compute_s": none["step_s"], "ratio": ratio,
            "rows": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="vit,bert")
    ap.add_argument("--dir", default=os.environ.get("FASTENSOR_SPILL_DIR", "/var/tmp"),
                    help="spill directory (on the SSD under test)")
    ap.add_argument("--depth", type=int, default=24)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--cap-mib", type=int, default=768, help="GPU memory cap (MiB)")
    ap.add_argument("--max-ratio", type=int, default=16,
                    help="search batches up to this multiple of the plain largest")
    ap.add_argument("--batch", type=int, default=0,
                    help="batch for step times (0: the largest without offload)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--min-bytes", type=int, default=1 << 20)
    ap.add_argument("--prefetch", type=int, default=None, help="prefetch bytes (None: auto)")
    ap.add_argument("--ram-tier", type=int, default=0,
                    help="host tier bytes for the fastensor+ram mode (0: the step's bytes)")
    ap.add_argument("--modes", default="none,fastensor,fastensor:direct,fastensor+ram,"
                    "save_on_cpu,torch.save",
                    help="none, fastensor[:ENGINE] (spill file through that engine), "
                    "fastensor+ram (host tier), save_on_cpu, torch.save")
    ap.add_argument("--skip-search", action="store_true")
    ap.add_argument("--no-partial", dest="partial", action="store_false",
                    help="skip the partial offload (first K blocks) run made when offloading "
                    "everything is disk-bound")
    ap.add_argument("--store-only", action="store_true",
                    help="only the store's own throughput: 1 GiB out in 16 MiB tensors, "
                    "flushed, back newest first with prefetch")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--verify", action="store_true",
                    help="only check: plain steps twice (are they deterministic?) and offload "
                    "steps comparing every restored tensor with a copy kept aside")
    args = ap.parse_args()

    device = (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
              else torch.device("cpu"))
    os.makedirs(args.dir, exist_ok=True)
    bw = measure_read_bandwidth(args.dir, 256 << 20)
    print(f"device {device}" + (f" ({torch.cuda.get_device_name()})" if device.type == "cuda"
                                else "") + f"; spill dir {args.dir}: reads {bw / 1e9:.2f} GB/s")
    if args.prefetch is None:  # sized to the disk once, as offload_activations would
        args.prefetch = int(min(max(bw * 0.25, 64 << 20), 1 << 30))
    results = {"device": str(device), "spill_dir": args.dir, "disk_read_gbps": bw / 1e9,
               "prefetch_bytes": args.prefetch, "models": {}}
    if args.store_only:
        r = results["store"] = store_throughput(args, device)
        print(f"store ({r['engine']}): {r['bytes'] >> 20} MiB out {r['put_gbps']:.2f} GB/s "
              f"(to disk, flushed), back {r['get_gbps']:.2f} GB/s (newest first, prefetched)")
        args.models = ""
    for name in filter(None, args.models.split(",")):
        make_model = MODELS[name]
        kind = make_model(args)[1]

        def make():
            return make_model(args)[0]
        if args.verify:
            batch = args.batch or 6
            for m in args.modes.split(","):
                print(f"== {name} batch {batch} {m:16s} "
                      f"{time_mode(make, kind, batch, args, device, m, 4)['losses']}", flush=True)
            continue
        res = results["models"][name] = {}
        print(f"\n== {name}: depth {args.depth}, width {args.width}")
        if device.type == "cuda" and not args.skip_search:
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(args.cap_mib * (1 << 20) / total, device)
            print(f"  largest batch under a {args.cap_mib} MiB cap:")
            plain, _ = largest_batch(make, kind, args, device, False, 1, 1 << 16)
            off, hit = largest_batch(make, kind, args, device, True, max(plain, 1),
                                     max(plain, 1) * args.max_ratio)
            res.update(cap_mib=args.cap_mib, largest_plain=plain, largest_offload=off,
                       offload_search_limited=hit, ratio=off / max(plain, 1))
            print(f"  largest batch: {plain} without, {off}{'+' if hit else ''} with offload "
                  f"({off / max(plain, 1):.1f}x{', search limit' if hit else ''})")
            torch.cuda.set_per_process_memory_fraction(1.0, device)
            batch = args.batch or max(plain, 1)
            # Identical losses at a common batch, from the same initial weights
            ref = time_mode(make, kind, batch, args, device, "none", 2)
            got = time_mode(make, kind, batch, args, device, "fastensor", 2)
            res["losses_equal"] = ref["losses"] == got["losses"]
            print(f"  losses at batch {batch}: {ref['losses']} vs {got['losses']} -> "
                  f"{'identical' if res['losses_equal'] else 'DIFFERENT'}")
        else:
            batch = args.batch or 8
        rows = []
        for mode in args.modes.split(","):
            if mode == "fastensor+ram" and not args.ram_tier:
                probe = next((r for r in rows if r.get("bytes_per_step")), None)
                if probe is None:
                    continue
                args.ram_tier = int(probe["bytes_per_step"] * 1.1)
            r = time_mode(make, kind, batch, args, device, mode, args.steps)
            rows.append(r)
        base = next((r for r in rows if r["mode"] == "none"), None)
        tsave = next((r for r in rows if r["mode"] == "torch.save"), None)
        print(f"  step time at batch {batch} (median of {args.steps}):")
        print_rows(rows, base, tsave)
        fe = next((r for r in rows if r["mode"] in ("fastensor:direct", "fastensor")), None)
        if fe and base:
            io_s = fe["bytes_per_step"] / bw
            res["io_below_compute"] = io_s < base["step_s"]
            print(f"  offloaded bytes / disk read bandwidth = {io_s:.3f} s vs compute "
                  f"{base['step_s']:.3f} s: the <= 1.15x target "
                  f"{'applies' if io_s < base['step_s'] else 'does not apply (disk-bound)'}")
            if io_s >= base["step_s"] and args.partial:
                res["partial"] = partial_offload(make, kind, batch, args, device, base, fe, bw)
        res["step_times"] = rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
