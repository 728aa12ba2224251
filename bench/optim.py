#!/usr/bin/env python3
"""Optimizer-state offload on real models: the largest batch with activations, states and
gradients offloaded, and fine-tuning a model whose states do not fit the GPU.

1. ``vit``: torchvision's ViT-B/16 (fp32, SGD with momentum, 224x224 images) under a GPU cap
   of --cap-gib GiB (torch.cuda.set_per_process_memory_fraction): the largest batch that
   trains (doubling, then bisection, as bench/offload.py searches) without offload
   ("none"), with ``offload_activations`` ("activations"), and with ``offload_activations``
   plus ``OffloadedOptimizer(offload_grads=True)`` ("activations+states"), and the same
   with the encoder's 12 blocks streamed (``stream_parameters``: "activations+states+params");
   then, at half the largest batch without offload, 3 steps from the same weights with and
   without the offloads: the parameters and momentum buffers bitwise equal (and the plain
   run's twin: where attention's kernels are not deterministic, again with the math
   kernel); then one step (all three offloads) at the first batch that failed and at 20x:
   where the allocator failed.
2. ``llama``: a Llama-style causal LM built from its configuration (hidden 2048, MLP 8192,
   16 heads, 8 KV heads, vocabulary 32000, --llama-layers layers: 1.6 B parameters with 24),
   bf16 weights, AdamW, batch --llama-batch of --llama-seq tokens, under a cap of
   --llama-cap-gib GiB: the plain optimizer's step (out of memory where the states do not
   fit), then, in rounds (a fresh process, model and optimizer for each round and mode;
   --warmup steps, then --steps timed ones): fastensor with the states in host memory
   (``OffloadedOptimizer(AdamW, offload_grads=True)``), the same keeping states on the GPU
   where the measured peak leaves room (``gpu_budget_bytes="auto"``), with fp32 master weights
   (fp32 states), the same with the states on the SSD (host tier --ssd-host-gib), with the
   decoder layers' weights streamed too ("fastensor-stream", not among the defaults), and
   torchao's ``CPUOffloadOptimizer(offload_gradients=True)`` (update on the CPU) where
   torchao imports, and DeepSpeed ZeRO-Offload (ZeRO stage 2, bf16 with fp32 masters and
   states in pinned host memory, its own CPU AdamW, built at first use) where deepspeed
   imports (``PEERS_SITE``: a directory to import them from). Each step's time (forward,
   backward, step), the optimizer step's own, the peak GPU memory and the loss are printed;
   medians with min-max and ratios to the best host-memory peer.

    PYTHONPATH=python python3 bench/optim.py --dir /nvme/spill --json optim.json
"""
import argparse
import contextlib
import gc
import importlib
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import offload as bo  # noqa: E402  (bench/offload.py: the model workloads and batch search)
import torch  # noqa: E402

import fastensor.torch as ftt  # noqa: E402

_GiB = 1 << 30
_MiB = 1 << 20
if os.environ.get("PEERS_SITE"):
    sys.path.append(os.environ["PEERS_SITE"])


def release(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def spread(v):
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


# -- 1. ViT-B/16: the largest batch -------------------------------------------------------

@contextlib.contextmanager
def states_offloaded(w, args, params=False):
    """The workload's SGD wrapped in OffloadedOptimizer (offloaded gradients) for the
    block, starting and ending without momentum; ``params``: the encoder's blocks streamed
    too (stream_parameters)."""
    sgd = w.opt
    sgd.state.clear()
    w.opt = ftt.OffloadedOptimizer(sgd, args.dir, offload_grads=True)
    if params:
        ftt.stream_parameters(w.model, w.opt)
    try:
        yield w.opt
    finally:
        w.opt.close()
        w.opt = sgd
        sgd.state.clear()


def vit_part(args, device):
    res = {}
    w = bo.Workload("vit_b_16", args, device)
    cuda = device.type == "cuda"
    if cuda:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(args.cap_gib * _GiB / total, device)
    print(f"\n== vit_b_16: {w.params() / 1e6:.1f} M parameters, cap {args.cap_gib} GiB",
          flush=True)
    if not cuda:  # no memory cap to search under: the bitwise check only
        return vit_bitwise(args, device, w, 4, res)
    if args.probe:  # only one step at each (batch, activation budget) asked for
        res["probe"] = {}
        with states_offloaded(w, args, params=True):
            for spec in args.probe.split(","):
                nb, _, budget = spec.partition(":")
                b = int(float(budget) * _GiB) if budget else None
                res["probe"][spec] = probe(w, int(nb), args, device, b)
                print(f"  batch {nb}, activation budget {budget or 'default'}: "
                      f"{res['probe'][spec]}", flush=True)
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        return res
    plain = bo.largest_batch(w, "none", args, 1, 1 << 14)
    n = max(plain["largest"], 1)
    res["search"] = {"none": plain}
    if "activations" in args.vit_modes:
        res["search"]["activations"] = bo.largest_batch(w, "fastensor", args, n,
                                                        n * args.max_ratio)
    with states_offloaded(w, args):
        res["search"]["activations+states"] = bo.largest_batch(w, "fastensor", args, n,
                                                               n * args.max_ratio)
    release(device)
    with states_offloaded(w, args, params=True):
        res["search"]["activations+states+params"] = bo.largest_batch(
            w, "fastensor", args, n, n * args.max_ratio)
    release(device)
    largest = {m: s["largest"] for m, s in res["search"].items()}
    res["largest"] = largest
    res["ratio"] = {m: v / n for m, v in largest.items()}
    print("  largest batch: " + ", ".join(
        f"{m} {v}{'+' if res['search'][m]['cut'] else ''} ({v / n:.1f}x)"
        for m, v in largest.items()), flush=True)
    # bitwise first (below the plain largest: its margin is thin), then where the first
    # failing batch and 20x fail: the phase, the allocator's figures
    vit_bitwise(args, device, w, max(1, n // 2), res)
    res["probe"] = {}
    streamed = res["search"]["activations+states+params"]
    with states_offloaded(w, args, params=True):
        for nb in sorted({streamed["first_failing"] or 0, 20 * n} - {0}):
            res["probe"][nb] = probe(w, nb, args, device)
            print(f"  batch {nb} with activations+states+params: {res['probe'][nb]}",
                  flush=True)
    release(device)
    torch.cuda.set_per_process_memory_fraction(1.0, device)
    del w
    release(device)
    return res


def probe(w, n, args, device, budget=None):
    """One step of activations+states at batch ``n`` (``budget``: the activation offload's
    gpu_budget_bytes, None its default): whether it fits, else in which phase the allocator
    failed, with its message and peak."""
    torch.cuda.reset_peak_memory_stats(device)
    phase, out = "batch", {}
    off = ftt.offload_activations(args.dir, gpu_budget_bytes=budget)
    try:
        x, y = w.batch(n, 1)
        phase = "forward"
        w.opt.zero_grad(set_to_none=True)
        with off:
            loss = w.loss(x, y)
        phase = "backward"
        loss.backward()
        phase = "step"
        w.opt.step()
        bo.sync(device)
        out["fits"] = True
    except torch.OutOfMemoryError as e:
        # what held the memory when the allocator failed (the frames are alive until here)
        out.update(fits=False, phase=phase, error=" ".join(str(e).split())[:400],
                   blocks_mib=live_blocks())
    st = off.stats()
    out["offload"] = {k: st[k] for k in ("tensors_offloaded", "tensors_on_gpu", "bytes_on_gpu",
                                         "tensors_kept", "tensors_passed")}
    out["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated(device) / _GiB, 3)
    out["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved(device) / _GiB, 3)
    x = y = loss = None
    w.opt.zero_grad(set_to_none=True)
    release(device)
    return out


def live_blocks(top=12):
    """The allocator's blocks now, in MiB: the largest allocated ones, their total and count,
    and the bytes freed but waiting for another stream's work (record_stream)."""
    sizes, pending = [], 0
    for seg in torch.cuda.memory_snapshot():
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                sizes.append(b["size"])
            elif b["state"] == "active_pending_free":
                pending += b["size"]
    sizes.sort(reverse=True)
    return {"largest": [round(v / _MiB, 1) for v in sizes[:top]],
            "allocated": round(sum(sizes) / _MiB, 1), "count": len(sizes),
            "pending_free": round(pending / _MiB, 1)}


def vit_bitwise(args, device, w, n, res):
    """3 steps from the same weights at batch ``n``, without offload and with activation,
    state and gradient offload: the same parameters and momentum, bitwise."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for kernels in ("default", "math"):
        res.setdefault("bitwise", {})[kernels] = r = {}
        if kernels == "math":  # attention's fused backward kernels may not be deterministic
            with sdpa_kernel([SDPBackend.MATH]):
                vit_steps(args, device, w, n, r)
        else:
            vit_steps(args, device, w, n, r)
        print(f"  3 steps at batch {n} ({kernels} attention kernels): twin of none equal "
              f"{r['twin_equal']}; activations+states against none: parameters equal "
              f"{r['params_equal']}, momentum equal {r['momentum_equal']}; with parameters "
              f"streamed: {r['streamed_params_equal']}, {r['streamed_momentum_equal']}",
              flush=True)
        if r["twin_equal"]:
            break
    return res


def vit_steps(args, device, w, n, res):
    sgd = w.opt
    finals = {}
    for mode in ("none", "none#2", "activations+states", "activations+states+params"):
        w.model.load_state_dict(w.initial)
        sgd.state.clear()
        plain = mode.startswith("none")
        opt = sgd if plain else ftt.OffloadedOptimizer(sgd, args.dir, offload_grads=True)
        if mode.endswith("params"):
            ftt.stream_parameters(w.model, opt)
        w.opt = opt
        for step in range(3):
            x, y = w.batch(n, 20 + step)
            bo.run_step(w, x, y, None if plain else bo.hooks_for("fastensor", args))
        bo.sync(device)
        moms = opt.state_dict()["state"]
        if opt is not sgd:
            opt.close()  # streamed parameters back in place first
        params = [p.detach().cpu().clone() for p in w.model.parameters()]
        finals[mode] = (params, {k: v["momentum_buffer"].cpu() for k, v in moms.items()})
        w.opt = sgd
        sgd.state.clear()
        release(device)
    def same(a, b):
        (pa, ma), (pb, mb) = finals[a], finals[b]
        return (all(torch.equal(u, v) for u, v in zip(pa, pb)),
                ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma))
    res["batch"] = n
    res["twin_equal"] = all(same("none", "none#2"))
    res["params_equal"], res["momentum_equal"] = same("none", "activations+states")
    res["streamed_params_equal"], res["streamed_momentum_equal"] = same(
        "none", "activations+states+params")


# -- 2. Llama-style fine-tuning -------------------------------------------------------------

def llama_model(args, device):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=8192,
                      num_hidden_layers=args.llama_layers, num_attention_heads=16,
                      num_key_value_heads=8, max_position_embeddings=4096,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            m = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(dtype)
    return m.train()


def llama_optimizer(mode, model, args):
    params = model.parameters()
    kw = {"lr": 1e-5, "weight_decay": 0.01}
    if mode == "plain":
        return torch.optim.AdamW(params, **kw)
    if mode == "torchao":
        from torchao.optim import CPUOffloadOptimizer
        return CPUOffloadOptimizer(params, torch.optim.AdamW, offload_gradients=True, **kw)
    inner = torch.optim.AdamW(params, **kw)
    if mode == "fastensor":
        return ftt.OffloadedOptimizer(inner, args.dir, offload_grads=True)
    if mode == "fastensor-gpu":  # states kept on the GPU where the measured peak leaves room
        return ftt.OffloadedOptimizer(inner, args.dir, offload_grads=True,
                                      gpu_budget_bytes="auto")
    if mode == "fastensor-stream":  # the decoder layers' weights streamed too
        opt = ftt.OffloadedOptimizer(inner, args.dir, offload_grads=True)
        ftt.stream_parameters(model, opt)
        return opt
    if mode == "fastensor-master":
        return ftt.OffloadedOptimizer(inner, args.dir, offload_grads=True, master_weights=True)
    if mode in ("fastensor-ssd", "fastensor-ssd-direct"):
        return ftt.OffloadedOptimizer(inner, args.dir, offload_grads=True,
                                      host_cache_bytes=int(args.ssd_host_gib * _GiB),
                                      engine="direct" if mode.endswith("direct") else "auto")
    raise SystemExit(f"unknown mode {mode!r}")


def llama_deepspeed(model, args):
    """DeepSpeed ZeRO-Offload on ``model`` as its users set it up for one GPU: a DeepSpeed
    engine (ZeRO stage 2, bf16, the optimizer offloaded to pinned host memory: fp32 master
    weights and AdamW states there, updated by DeepSpeedCPUAdam), as a process group of one."""
    import socket

    import deepspeed
    with socket.socket() as s:  # a free port for the group of one
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                 ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port))):
        os.environ.setdefault(k, v)
    cfg = {"train_micro_batch_size_per_gpu": args.llama_batch, "gradient_accumulation_steps": 1,
           "bf16": {"enabled": True},
           "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",
                                                                   "pin_memory": True}},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "weight_decay": 0.01}},
           "steps_per_print": 1 << 30}
    engine, _opt, _loader, _sched = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def llama_steps(mode, args, device, steps):
    """A fresh model and optimizer of ``mode``: --warmup steps, then ``steps`` timed ones.
    Returns (step seconds, optimizer-step seconds, peak GPU bytes, last loss, warm-up step
    seconds, a trace of every step: forward+backward and step seconds, and for fastensor the
    host memory the store pinned and the time it stalled during the step)."""
    model = llama_model(args, device)
    if mode == "deepspeed":  # the engine wraps the model: its backward and step (which zeroes)
        model = opt = llama_deepspeed(model, args)
        do_backward, do_step = model.backward, model.step
    else:
        opt = llama_optimizer(mode, model, args)

        def do_backward(loss):
            loss.backward()

        def do_step(opt=opt):
            opt.step()
            opt.zero_grad(set_to_none=True)
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, 32000, (args.llama_batch, args.llama_seq), generator=g).to(device)
    times, opt_times, warm, trace, loss = [], [], [], [], None
    store = opt._shared.store if isinstance(opt, ftt.OffloadedOptimizer) else None
    try:
        for i in range(args.warmup + steps):
            bo.sync(device)
            if i == args.warmup and device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            s0 = store.stats() if store else None
            t0 = time.perf_counter()
            loss = model(input_ids=x, labels=x).loss
            do_backward(loss)
            bo.sync(device)
            t1 = time.perf_counter()
            do_step()
            bo.sync(device)
            t2 = time.perf_counter()
            step = {"fb_s": round(t1 - t0, 3), "opt_s": round(t2 - t1, 3)}
            if store:
                s1 = store.stats()
                step.update(pinned_mb=(s1["host_pinned"] - s0["host_pinned"]) >> 20,
                            stall_s=round((s1["stall_ns"] - s0["stall_ns"]) / 1e9, 3))
            trace.append(step)
            if i >= args.warmup:
                times.append(t2 - t0)
                opt_times.append(t2 - t1)
            else:
                warm.append(t2 - t0)
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
        return times, opt_times, peak, loss.item(), warm, trace
    finally:
        if hasattr(opt, "close"):
            opt.close()
        del opt, model, x, loss
        release(device)


def llama_worker(args, device):
    """One (round, mode) of the Llama part in this fresh process: RESULT and a JSON line."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(args.llama_cap_gib * _GiB / total, device)
    try:
        t, o, peak, loss, warm, trace = llama_steps(args.llama_worker, args, device,
                                                    args.steps)
        out = {"step": t, "opt": o, "peak": peak, "loss": loss, "warmup": warm,
               "trace": trace}
    except torch.OutOfMemoryError as e:
        out = {"oom": " ".join(str(e).split())[:300]}
    print("RESULT " + json.dumps(out), flush=True)


def llama_run(mode, args, steps):
    """llama_worker in a fresh process (a peer's hooks may keep its model alive)."""
    import subprocess
    cmd = [sys.executable, os.path.abspath(__file__), "--llama-worker", mode, "--dir", args.dir,
           "--steps", str(steps), "--warmup", str(args.warmup)]
    for k in ("llama_layers", "llama_batch", "llama_seq", "llama_cap_gib", "ssd_host_gib"):
        cmd += ["--" + k.replace("_", "-"), str(getattr(args, k))]
    if args.quick:
        cmd.append("--quick")
    p = subprocess.run(cmd, capture_output=True, text=True)
    for line in p.stdout.splitlines()[::-1]:
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": f"exit {p.returncode}: {(p.stderr or p.stdout)[-400:]}"}


def llama_part(args, device):
    res = {"layers": args.llama_layers, "batch": args.llama_batch, "seq": args.llama_seq,
           "cap_gib": args.llama_cap_gib}
    m = llama_model(args, device)
    res["params"] = sum(p.numel() for p in m.parameters())
    del m
    release(device)
    print(f"\n== llama-style: {res['params'] / 1e9:.2f} B parameters, bf16, AdamW, batch "
          f"{args.llama_batch} x {args.llama_seq} tokens, cap {args.llama_cap_gib} GiB",
          flush=True)
    r = llama_run("plain", args, 1)
    res["plain"] = ({"fits": True, "step_s": r["step"][0], "peak_gib": r["peak"] / _GiB}
                    if "step" in r else {"fits": False, "error": r.get("oom") or r.get("error")})
    print(f"  plain AdamW: {'fits' if res['plain']['fits'] else 'out of memory'}", flush=True)
    modes = [m for m in args.llama_modes.split(",") if m]
    for peer in ("torchao", "deepspeed"):
        if peer not in modes:
            continue
        try:
            mod = importlib.import_module(peer)
            if peer == "torchao":
                importlib.import_module("torchao.optim")
            res[peer] = mod.__version__
        except Exception as e:  # noqa: BLE001  (any import failure: say why, go on)
            print(f"  {peer}: not importable ({e}); its row is left out", flush=True)
            res[peer + "_error"] = str(e)[:300]
            modes.remove(peer)
    rows = {m: {"step": [], "opt": [], "peak": [], "loss": [], "warmup": []} for m in modes}
    for r in range(args.rounds):
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            got = llama_run(mode, args, args.steps)
            if "step" not in got:
                why = "oom" if "oom" in got else "error"
                rows[mode].setdefault(why, got.get(why))
                print(f"  round {r} {mode}: {rows[mode][why]}", flush=True)
                continue
            t, o, peak, loss = got["step"], got["opt"], got["peak"], got["loss"]
            rows[mode]["warmup"].append(got["warmup"])
            rows[mode].setdefault("trace", []).append(got["trace"])
            rows[mode]["step"] += t
            rows[mode]["opt"] += o
            rows[mode]["peak"].append(peak)
            rows[mode]["loss"].append(loss)
            print(f"  round {r} {mode:17s} step {statistics.median(t):6.2f} s (optimizer "
                  f"{statistics.median(o):5.2f} s), peak {peak / _GiB:5.2f} GiB, loss "
                  f"{loss:.4f}; warm-up steps " + " ".join(f"{w:.2f}" for w in got["warmup"]),
                  flush=True)
            if "pinned_mb" in got["trace"][0]:
                print("    steps (fwd+bwd/step s, MiB pinned, s stalled): " + "  ".join(
                    f"{t['fb_s']:.2f}/{t['opt_s']:.2f} {t['pinned_mb']} {t['stall_s']:.2f}"
                    for t in got["trace"]), flush=True)
    out = {}
    for mode, v in rows.items():
        if not v["step"]:
            out[mode] = {k: v[k] for k in ("oom", "error") if k in v}
            continue
        out[mode] = {"step_s": spread(v["step"]), "optimizer_s": spread(v["opt"]),
                     "peak_gib": max(v["peak"]) / _GiB, "loss": v["loss"],
                     "warmup_steps_s": v["warmup"], "trace": v.get("trace")}
    res["rows"] = out
    host = [m for m in ("torchao", "deepspeed") if "step_s" in out.get(m, {})]
    best = min(host, key=lambda m: out[m]["step_s"]["median"]) if host else None
    print(f"  {'mode':17s} {'step s':>7s} {'min-max':>13s} {'opt s':>6s} {'peak GiB':>9s}"
          + (f" {'vs ' + best:>12s}" if best else ""))
    for mode, v in out.items():
        if "step_s" not in v:
            print(f"  {mode:17s} " + ("out of memory" if "oom" in v else "failed (above)"))
            continue
        s = v["step_s"]
        line = (f"  {mode:17s} {s['median']:7.2f} {s['min']:6.2f}-{s['max']:<6.2f} "
                f"{v['optimizer_s']['median']:6.2f} {v['peak_gib']:9.2f}")
        if best:
            v["vs_best_peer"] = s["median"] / out[best]["step_s"]["median"]
            line += f" {v['vs_best_peer']:11.2f}x"
        print(line, flush=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="vit,llama")
    ap.add_argument("--dir", default=os.environ.get("FASTENSOR_SPILL_DIR", "/var/tmp"),
                    help="spill directory (on the SSD under test)")
    ap.add_argument("--cap-gib", type=float, default=3.0, help="ViT's GPU memory cap (GiB)")
    ap.add_argument("--vit-modes", default="activations",
                    help="searched beside none and activations+states: 'activations' or ''")
    ap.add_argument("--max-ratio", type=int, default=32)
    ap.add_argument("--probe", metavar="N[:GIB],...",
                    help="ViT: instead of the search, one step of activations+states at each "
                    "batch N (with the activation offload's gpu_budget_bytes GIB GiB)")
    ap.add_argument("--search-seconds", type=float, default=150)
    ap.add_argument("--llama-layers", type=int, default=24)
    ap.add_argument("--llama-batch", type=int, default=1)
    ap.add_argument("--llama-seq", type=int, default=1024)
    ap.add_argument("--llama-cap-gib", type=float, default=12.0)
    ap.add_argument("--llama-modes",
                    default="fastensor,fastensor-gpu,fastensor-master,fastensor-ssd,"
                            "fastensor-ssd-direct,torchao,deepspeed")
    ap.add_argument("--ssd-host-gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=4,
                    help="Llama steps before the timed ones (the host tier pins its memory as "
                    "entries first reach it, over the first steps)")
    ap.add_argument("--quick", action="store_true",
                    help="small ViT configuration (a check that the bench runs)")
    ap.add_argument("--json")
    ap.add_argument("--llama-worker", metavar="MODE", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.bert_seq = args.gpt2_seq = 32  # bench/offload.py's Workload reads them
    if args.quick:  # a check that the bench runs: small models, the CPU where no GPU
        args.llama_layers, args.llama_seq, args.rounds = 1, 64, 1
        args.steps = min(args.steps, 1)
    device = (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
              else torch.device("cpu"))
    os.makedirs(args.dir, exist_ok=True)
    if args.llama_worker:
        return llama_worker(args, device)
    print(f"device {device}" + (f" ({torch.cuda.get_device_name()})" if device.type == "cuda"
                                else "") + f"; spill dir {args.dir}; torch {torch.__version__}",
          flush=True)
    results = {"device": str(device), "torch": torch.__version__, "args": vars(args)}
    if device.type == "cuda":
        results["gpu"] = torch.cuda.get_device_name()
    parts = [p for p in args.parts.split(",") if p]
    for part in parts:
        if device.type != "cuda" and not args.quick:
            print(f"\n== {part}: skipped, no CUDA device (--quick runs small ones on the CPU)",
                  flush=True)
            continue
        try:
            results[part] = (vit_part if part == "vit" else llama_part)(args, device)
        except ImportError as e:
            print(f"\n== {part}: skipped, {e}", flush=True)
            results[part] = {"skipped": str(e)}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
