#!/usr/bin/env python3
"""Activation offload on real models: the largest batch under a GPU memory cap, and step
times side by side.

Models, built from their configurations (no weights downloaded): torchvision's ViT-B/16
(224x224 images, 1000 classes), Hugging Face transformers' BERT-base (sequence
classification, --bert-seq tokens) and GPT-2 small (causal LM, --gpt2-seq tokens), fp32,
eager attention, SGD with momentum. For each model, under a cap of --cap-gib GiB
(torch.cuda.set_per_process_memory_fraction):

1. The largest batch that trains (forward, backward, optimizer step) without offload, and
   with ``fastensor.torch.offload_activations(dir)`` at its defaults: doubling, then
   bisection, in one process with one model, as a user's batch-size search runs; an
   out-of-memory error in a try is caught and the next try goes on (whether the store was
   left empty each time is reported).
2. Gradients of one step from the same weights, at the largest batch that fits without
   offload, under every mode: bitwise equal to no offload's (and no offload's twin, to
   show the step is deterministic at all).
3. Step times at that batch, under the cap, interleaved rounds (every mode once per round,
   the allocator's peak reset before each, as a process training that way alone would
   have it; a new hooks object each step, as a training loop writes it): no offload and its twin
   (the noise floor), fastensor defaults (GPU budget, pinned host tier, spill file),
   fastensor keeping every tensor on the GPU (the hooks' own cost; "hooks-identity", torch's
   saved_tensors_hooks with functions that return their argument, is the floor of any
   hook-based offload, on request), fastensor host tier
   only (gpu_budget_bytes=0), fastensor SSD only (no GPU or host tier),
   torch.autograd.graph.save_on_cpu(pin_memory=True), and hooks that torch.save /
   torch.load one file per tensor (the Fastensor paper's baseline). Then, at a batch N
   times the plain largest (--big, 4), fastensor defaults against save_on_cpu.

With --profile MODE, --steps steps of MODE at that batch then run under cProfile: where
the hooks' time goes, the functions with the most time of their own (printed, and in the
JSON).

Medians of all rounds' steps, their spread (min-max) and ratios are printed; --json
writes everything. Without CUDA (--quick on a laptop), small configurations run on the
CPU: a check that every mode trains and agrees, not a measurement.

    PYTHONPATH=python python3 bench/offload.py --dir /nvme/spill --json offload.json
"""
import argparse
import cProfile
import gc
import io
import pstats
import json
import os
import statistics
import sys
import tempfile
import time
import uuid

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

import torch  # noqa: E402

import fastensor.torch as ftt  # noqa: E402
from fastensor import offload as fto  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.benchmark = False
_GiB = 1 << 30


# -- models ------------------------------------------------------------------------------

def model_vit(quick):
    from torchvision.models import vit_b_16
    from torchvision.models.vision_transformer import VisionTransformer
    if quick:
        m = VisionTransformer(image_size=64, patch_size=16, num_layers=2, num_heads=4,
                              hidden_dim=128, mlp_dim=512)
        return m, 64
    return vit_b_16(weights=None), 224


def model_bert(quick):
    from transformers import AutoModelForSequenceClassification, BertConfig
    cfg = (BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                      intermediate_size=512) if quick else BertConfig())
    return AutoModelForSequenceClassification.from_config(cfg, attn_implementation="eager")


def model_gpt2(quick):
    from transformers import AutoModelForCausalLM, GPT2Config
    cfg = GPT2Config(n_layer=2, n_embd=128, n_head=4) if quick else GPT2Config()
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")


class Workload:
    """A model, its optimizer and how to make a batch and a loss."""

    def __init__(self, name, args, device):
        self.name, self.device, self.args = name, device, args
        torch.manual_seed(0)
        if name == "vit_b_16":
            self.model, self.image = model_vit(args.quick)
        elif name == "bert":
            self.model, self.seq = model_bert(args.quick), 32 if args.quick else args.bert_seq
        elif name == "gpt2":
            self.model, self.seq = model_gpt2(args.quick), 32 if args.quick else args.gpt2_seq
        else:
            raise SystemExit(f"unknown model {name!r} (vit_b_16, bert, gpt2)")
        self.model.to(device).train()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4, momentum=0.9)
        self.initial = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    def batch(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        if self.name == "vit_b_16":
            x = torch.randn(n, 3, self.image, self.image, generator=g)
            y = torch.randint(0, 1000, (n,), generator=g)
        elif self.name == "bert":
            x = torch.randint(0, self.model.config.vocab_size, (n, self.seq), generator=g)
            y = torch.randint(0, 2, (n,), generator=g)
        else:
            x = torch.randint(0, self.model.config.vocab_size, (n, self.seq), generator=g)
            y = x
        return x.to(self.device), y.to(self.device)

    def loss(self, x, y):
        if self.name == "vit_b_16":
            return torch.nn.functional.cross_entropy(self.model(x), y)
        return self.model(input_ids=x, labels=y).loss

    def params(self):
        return sum(p.numel() for p in self.model.parameters())


# -- modes -------------------------------------------------------------------------------

class TorchSaveHooks(torch.autograd.graph.saved_tensors_hooks):
    """The paper's baseline: one torch.save'd file per saved tensor, loaded back at unpack."""

    def __init__(self, directory, min_bytes):
        def pack(t):
            if t.numel() * t.element_size() < min_bytes or (t.is_leaf and t.requires_grad):
                return t
            path = os.path.join(directory, uuid.uuid4().hex + ".pt")
            torch.save(t, path)
            return (path, t.device)

        def unpack(p):
            if isinstance(p, torch.Tensor):
                return p
            t = torch.load(p[0], map_location=p[1])
            os.remove(p[0])
            return t
        super().__init__(pack, unpack)


MODES = ("none", "none#2", "hooks-identity", "fastensor", "fastensor-keep", "fastensor-host",
         "fastensor-ssd", "save_on_cpu", "torch.save")
DEFAULT_MODES = tuple(m for m in MODES if m != "hooks-identity")


def _same(t):
    return t


def hooks_for(mode, args):
    """A new hooks object for one step of ``mode`` (None: no offload)."""
    if mode.startswith("none"):
        return None
    if mode == "hooks-identity":  # torch's hooks, doing nothing: any hook-based offload's floor
        return torch.autograd.graph.saved_tensors_hooks(_same, _same)
    if mode == "fastensor":
        return ftt.offload_activations(args.dir)
    if mode == "fastensor-keep":  # every tensor stays on the GPU: the hooks' own cost
        return ftt.offload_activations(args.dir, gpu_budget_bytes=1 << 60)
    if mode == "fastensor-host":
        return ftt.offload_activations(args.dir, gpu_budget_bytes=0)
    if mode == "fastensor-ssd":
        return ftt.offload_activations(args.dir, gpu_budget_bytes=0, host_cache_bytes=0)
    if mode == "save_on_cpu":
        return torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available())
    if mode == "torch.save":
        return TorchSaveHooks(args.tsave_dir, 1 << 20)
    raise SystemExit(f"unknown mode {mode!r}")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_step(w, x, y, hooks, optimizer=True):
    w.opt.zero_grad(set_to_none=True)
    if hooks is None:
        loss = w.loss(x, y)
    else:
        with hooks:
            loss = w.loss(x, y)
    loss.backward()
    if optimizer:
        w.opt.step()
    return hooks


def release(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def store_entries():
    """Entries held by every store offload_activations made in this process."""
    return sum(sh.store.stats()["entries"] for sh in fto._STORES.values())


# -- 1. largest batch ----------------------------------------------------------------------

def trains(w, mode, n, args):
    """Whether a step at batch ``n`` fits; an out-of-memory error is caught, as a user's
    loop does, and the state it leaves is checked."""
    x = y = None
    try:
        x, y = w.batch(n, 1)
        run_step(w, x, y, hooks_for(mode, args))
        sync(w.device)
        return True, None
    except torch.OutOfMemoryError:
        pass
    x = y = None
    w.opt.zero_grad(set_to_none=True)
    release(w.device)
    return False, store_entries()


def largest_batch(w, mode, args, start, limit):
    """Doubling from ``start``, then bisection to within an eighth; stops early past
    --search-seconds. Returns a dict: largest, tries, whether the limit or the time cut it."""
    tries, t_begin = [], time.perf_counter()
    good, bad, n, cut = 0, None, start, None
    ok_after_oom, entries_after_oom = None, []

    def attempt(b):
        nonlocal ok_after_oom
        t0 = time.perf_counter()
        ok, left = trains(w, mode, b, args)
        tries.append({"batch": b, "fits": ok, "s": round(time.perf_counter() - t0, 2)})
        print(f"    {mode:10s} batch {b:5d}: {'fits' if ok else 'OOM '} "
              f"({tries[-1]['s']:.1f} s)", flush=True)
        if not ok:
            entries_after_oom.append(left)
        elif entries_after_oom and ok_after_oom is None:
            ok_after_oom = True
        return ok

    while True:
        if n > limit:
            cut = "limit"
            break
        if time.perf_counter() - t_begin > args.search_seconds:
            cut = "time"
            break
        if not attempt(n):
            bad = n
            break
        good, n = n, n * 2
    while bad is not None and bad - good > max(1, good // 8):
        if time.perf_counter() - t_begin > args.search_seconds:
            cut = "time"
            break
        mid = (good + bad) // 2
        if attempt(mid):
            good = mid
        else:
            bad = mid
    if entries_after_oom and not ok_after_oom and good:  # the search ended on failures
        ok_after_oom = attempt(good)
    return {"largest": good, "first_failing": bad, "cut": cut, "tries": tries,
            "store_entries_after_oom": entries_after_oom,
            "trained_after_oom": bool(ok_after_oom)}


# -- 2. gradients ----------------------------------------------------------------------------

def gradients(w, mode, n, args):
    w.model.load_state_dict(w.initial)
    if w.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(w.device)
    x, y = w.batch(n, 2)
    torch.manual_seed(3)  # dropout draws the same masks in every mode
    run_step(w, x, y, hooks_for(mode, args), optimizer=False)
    grads = [p.grad.detach().cpu().clone() for p in w.model.parameters()]
    w.opt.zero_grad(set_to_none=True)
    release(w.device)
    return grads


# -- 3. step times -------------------------------------------------------------------------

def spread(times):
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "n": len(times)}


def time_modes(w, modes, n, args, rounds, steps):
    times = {m: [] for m in modes}
    per_step = {}
    for r in range(rounds):
        for m in modes:
            if w.device.type == "cuda":  # the peak as a process training this way would see
                torch.cuda.reset_peak_memory_stats(w.device)
            x, y = w.batch(n, 10 + r)
            if r == 0:  # warm-up: allocator, pinned memory, the store's first use
                run_step(w, x, y, hooks_for(m, args))
            sync(w.device)
            for _ in range(steps):
                base = {k: sh.store.stats() for k, sh in fto._STORES.items()}
                t0 = time.perf_counter()
                hooks = run_step(w, x, y, hooks_for(m, args))
                sync(w.device)
                times[m].append(time.perf_counter() - t0)
                if isinstance(hooks, ftt.offload_activations):
                    s = hooks.stats()
                    per_step[m] = {k: s[k] for k in (
                        "tensors_offloaded", "tensors_on_gpu", "tensors_passed", "bytes_on_gpu",
                        "bytes_offloaded",
                        "bytes_written", "bytes_read", "bytes_demoted", "host_hits",
                        "stall_seconds", "engine", "cache", "prefetch_bytes")}
                    per_step[m]["host_pinned"] = s["host_pinned"]
                del hooks, base
            del x, y
            release(w.device)
    rows = {m: spread(t) | {"times": [round(v, 4) for v in t]} for m, t in times.items()}
    for m, s in per_step.items():
        rows[m]["per_step"] = s
    return rows


def profile_mode(w, mode, n, args, top=25):
    """Steps of ``mode`` under cProfile: the ``top`` functions by their own time, and the
    hooks' share of the steps (fastensor's module and the hooks objects)."""
    x, y = w.batch(n, 99)
    run_step(w, x, y, hooks_for(mode, args))  # warm-up
    sync(w.device)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(args.steps):
        run_step(w, x, y, hooks_for(mode, args))
    sync(w.device)
    prof.disable()
    wall = (time.perf_counter() - t0) / args.steps
    st = pstats.Stats(prof)
    rows, fastensor_s = [], 0.0
    for (fname, line, func), (cc, nc, tt, ct, _callers) in st.stats.items():
        where = f"{os.path.basename(fname)}:{line}({func})"
        if "fastensor" in fname:
            fastensor_s += tt
        rows.append({"function": where, "calls": nc // args.steps,
                     "own_ms": tt / args.steps * 1e3, "total_ms": ct / args.steps * 1e3})
    rows.sort(key=lambda r: -r["own_ms"])
    out = io.StringIO()
    print(f"  profile of {mode} at batch {n} (per step, under cProfile: {wall * 1e3:.1f} ms "
          f"a step; fastensor's own Python time {fastensor_s / args.steps * 1e3:.1f} ms):",
          file=out)
    for r in rows[:top]:
        print(f"    {r['own_ms']:8.2f} ms own {r['total_ms']:8.2f} ms total "
              f"{r['calls']:7d} calls  {r['function']}", file=out)
    print(out.getvalue(), end="", flush=True)
    del x, y
    release(w.device)
    return {"mode": mode, "batch": n, "step_ms_profiled": wall * 1e3,
            "fastensor_own_ms": fastensor_s / args.steps * 1e3, "top": rows[:top]}


def print_rows(rows, base):
    print(f"    {'mode':16s} {'median s':>9s} {'min-max s':>15s} {'vs none':>8s}  "
          f"offloaded/step (GPU kept, file written)")
    for m, r in rows.items():
        ps = r.get("per_step")
        extra = (f"  {ps['bytes_offloaded'] / 1e9:6.2f} GB ({ps['bytes_on_gpu'] / 1e9:.2f} "
                 f"kept, {ps['bytes_written'] / 1e9:.2f} written)" if ps else "")
        print(f"    {m:16s} {r['median_s']:9.3f} {r['min_s']:7.3f}-{r['max_s']:<7.3f} "
              f"{r['median_s'] / rows[base]['median_s']:7.2f}x{extra}")


def ratio(rows, a, b):
    return rows[a]["median_s"] / rows[b]["median_s"] if a in rows and b in rows else None


def bench_model(name, args, device):
    res = {}
    w = Workload(name, args, device)
    res["params"] = w.params()
    print(f"\n== {name}: {w.params() / 1e6:.1f} M parameters", flush=True)
    cuda = device.type == "cuda"
    if cuda:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(args.cap_gib * _GiB / total, device)
        res["cap_gib"] = args.cap_gib
    if cuda and args.no_search:
        if not args.batch:
            raise SystemExit("--no-search needs --batch")
    elif cuda:
        print(f"  largest batch under a {args.cap_gib} GiB cap:", flush=True)
        plain = largest_batch(w, "none", args, 1, 1 << 14)
        n = max(plain["largest"], 1)
        off = largest_batch(w, "fastensor", args, n, n * args.max_ratio)
        res["search"] = {"none": plain, "fastensor": off}
        res["largest_none"], res["largest_fastensor"] = plain["largest"], off["largest"]
        res["largest_ratio"] = off["largest"] / n
        print(f"  largest batch: {plain['largest']} without offload, {off['largest']}"
              f"{'+' if off['cut'] else ''} with ({res['largest_ratio']:.1f}x"
              f"{', search cut by ' + off['cut'] if off['cut'] else ''}); after each OOM the "
              f"store held {off['store_entries_after_oom']} entries, next try trained: "
              f"{off['trained_after_oom']}", flush=True)
    else:
        n = args.batch or 4
    if args.batch:
        n = args.batch
    res["batch"] = n
    modes = [m for m in args.modes.split(",") if m]
    # 2. gradients, bitwise
    grads = {m: gradients(w, m, n, args) for m in modes}
    ref = grads[modes[0]]
    res["grads_equal"] = {m: all(torch.equal(a, b) for a, b in zip(ref, g))
                          for m, g in grads.items() if m != modes[0]}
    del grads, ref
    print(f"  gradients at batch {n} equal to {modes[0]}'s: {res['grads_equal']}", flush=True)
    # 3. step times
    rows = time_modes(w, modes, n, args, args.rounds, args.steps)
    res["rows"] = rows
    print(f"  step time at batch {n} ({args.rounds} rounds x {args.steps} steps, "
          f"interleaved; new hooks object each step):")
    print_rows(rows, modes[0])
    res["ratios"] = {
        "twin": ratio(rows, "none#2", "none"),
        "fastensor_vs_none": ratio(rows, "fastensor", "none"),
        "host_vs_save_on_cpu": ratio(rows, "fastensor-host", "save_on_cpu"),
        "torch_save_vs_fastensor_ssd": ratio(rows, "torch.save", "fastensor-ssd"),
        "torch_save_vs_fastensor": ratio(rows, "torch.save", "fastensor"),
    }
    print("  ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in res["ratios"].items()
                                   if v is not None), flush=True)
    if args.profile:
        res["profile"] = profile_mode(w, args.profile, n, args)
    if cuda and args.big and res.get("largest_fastensor", 0) >= n * args.big:
        nb = n * args.big
        try:
            big = time_modes(w, ["fastensor", "save_on_cpu"], nb, args, 2, 2)
            res["big"] = {"batch": nb, "rows": big,
                          "fastensor_vs_save_on_cpu": ratio(big, "fastensor", "save_on_cpu")}
            print(f"  step time at batch {nb} (2 rounds x 2 steps):")
            print_rows(big, "save_on_cpu")
        except torch.OutOfMemoryError as e:
            res["big"] = {"batch": nb, "oom": str(e).splitlines()[0]}
            print(f"  step time at batch {nb}: out of memory ({res['big']['oom']})")
            w.opt.zero_grad(set_to_none=True)
            release(device)
    if cuda:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    del w
    release(device)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="vit_b_16,bert,gpt2")
    ap.add_argument("--dir", default=os.environ.get("FASTENSOR_SPILL_DIR", "/var/tmp"),
                    help="spill directory (on the SSD under test)")
    ap.add_argument("--cap-gib", type=float, default=3.0, help="GPU memory cap (GiB)")
    ap.add_argument("--bert-seq", type=int, default=128)
    ap.add_argument("--gpt2-seq", type=int, default=256)
    ap.add_argument("--max-ratio", type=int, default=32,
                    help="search batches up to this multiple of the plain largest")
    ap.add_argument("--search-seconds", type=float, default=120,
                    help="no new search try starts after this long (per model and mode)")
    ap.add_argument("--batch", type=int, default=0,
                    help="batch for gradients and step times (0: the largest without offload)")
    ap.add_argument("--no-search", action="store_true",
                    help="skip the largest-batch search (with --batch)")
    ap.add_argument("--big", type=int, default=4,
                    help="also time fastensor and save_on_cpu at this multiple of the batch "
                    "(0: not)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES),
                    help=f"of {', '.join(MODES)}")
    ap.add_argument("--profile", metavar="MODE", choices=MODES,
                    help="then profile --steps steps of MODE at the batch (cProfile)")
    ap.add_argument("--quick", action="store_true",
                    help="small configurations (a check that the bench runs)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    device = (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
              else torch.device("cpu"))
    os.makedirs(args.dir, exist_ok=True)
    args.tsave_dir = tempfile.mkdtemp(prefix="tsave-", dir=args.dir)
    print(f"device {device}" + (f" ({torch.cuda.get_device_name()})" if device.type == "cuda"
                                else "") + f"; spill dir {args.dir}; torch {torch.__version__}")
    results = {"device": str(device), "torch": torch.__version__, "spill_dir": args.dir,
               "args": {k: v for k, v in vars(args).items() if k != "tsave_dir"},
               "models": {}}
    if device.type == "cuda":
        results["gpu"] = torch.cuda.get_device_name()
    for name in filter(None, args.models.split(",")):
        try:
            results["models"][name] = bench_model(name, args, device)
        except ImportError as e:
            print(f"\n== {name}: skipped, {e}", flush=True)
            results["models"][name] = {"skipped": str(e)}
        if args.json:  # after each model: a timeout keeps what was measured
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    os.rmdir(args.tsave_dir)


if __name__ == "__main__":
    sys.exit(main())
