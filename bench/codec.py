#!/usr/bin/env python3
"""The tensor codec on real state dicts: compression ratio, encode and decode GB/s (of the
uncompressed bytes, host memory, all of the context's threads), and the disk's O_DIRECT read
ceiling in the same run, for the cold-load rate the codec would allow: min(decode, ceiling /
ratio). With --dir, the first state dict is also saved (durable) as .safetensors and as a
.fst container (compression="always") and loaded cold (a page-cache drop, a fresh process,
into --device memory), the two interleaved per round with the raw O_DIRECT read of as many
bytes and (for loads) the safetensors package where installed: GB/s of the state dict's
bytes; and what compression="auto" decides there (fastensor._fst.coding_pays, from its
measured rates). With --device cuda every state dict is also decoded on the GPU: all its
streams in one ft_codec_decode_cuda call, from streams already in device memory (the
kernel's rate, with the host's checks) and from pinned host memory (with the copy); and
encoded on the GPU (ft_codec_encode_cuda_batch, every tensor in one call, into device memory
and into pinned host memory: GB/s of the uncompressed bytes, and whether every stream is the
CPU encoder's, byte for byte).

State dicts (random init from a config, as the architectures ship it; no download):
  llama-bf16  a Llama-style decoder in bf16 (transformers' LlamaForCausalLM where installed,
              else the same shapes, normal(0, 0.02)), at least --size bytes
  gpt2-fp32   transformers' GPT-2 (124M) in fp32
  vit-fp32    torchvision's ViT-B/16 in fp32 (where torchvision is installed)

    PYTHONPATH=python .venv/bin/python bench/codec.py --size 2G --rounds 3 --dir /var/tmp \\
        --json docs/benchmarks/codec-dev.json
    (scripts/gpu-check.sh --codec runs it with --device cuda on the GPU machine)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
sys.path.insert(0, HERE)

from fastensor import _C, context  # noqa: E402
from scenarios import drop_caches, raw_io  # noqa: E402  (bench/scenarios.py)


def nbytes_of(text):
    """Bytes of a size such as 512K, 2G or 1000."""
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    unit = text[-1].upper()
    return int(float(text[:-1]) * mult[unit]) if unit in mult else int(text)


def llama(size):
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        LlamaConfig = None
    d, ffn, vocab = 2048, 5504, 32000
    per_layer = 4 * d * d + 3 * d * ffn
    layers = max(1, -(-(size // 2 - 2 * vocab * d) // per_layer))  # at least size bytes
    if LlamaConfig is not None:
        cfg = LlamaConfig(hidden_size=d, intermediate_size=ffn, num_hidden_layers=int(layers),
                          num_attention_heads=16, num_key_value_heads=16, vocab_size=vocab)
        torch.manual_seed(0)
        with torch.no_grad():
            m = LlamaForCausalLM(cfg).to(torch.bfloat16)
        return {k: v.contiguous() for k, v in m.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    shapes = [(f"layers.{i}.{n}", shape) for i in range(int(layers)) for n, shape in
              (("q", (d, d)), ("k", (d, d)), ("v", (d, d)), ("o", (d, d)), ("gate", (ffn, d)),
               ("up", (ffn, d)), ("down", (d, ffn)))]
    shapes += [("embed", (vocab, d)), ("head", (vocab, d))]
    return {n: (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16) for n, shape in shapes}


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    # (the tied embedding and head cloned apart: a save refuses shared tensors)
    return {k: v.clone().contiguous()
            for k, v in GPT2LMHeadModel(GPT2Config()).state_dict().items()}


def vit():
    import torchvision
    torch.manual_seed(0)
    return {k: v.contiguous() for k, v in torchvision.models.vit_b_16().state_dict().items()}


def floats(sd):
    return {k: v for k, v in sd.items() if v.is_floating_point() and v.numel()}


def save_block(t):
    """The codec blocks a .fst save codes ``t`` in (src/ckpt/fst_save.c's block_of)."""
    return 512 << 10 if t.element_size() == 4 else 1 << 20


def encode_all(sd, block=None):
    """Each tensor's stream, in the blocks a .fst save uses (or of ``block`` bytes; one
    tensor at a time: the codec call's own rate)."""
    ctx, out = context(), {}
    for k, t in sd.items():
        n, b = t.numel() * t.element_size(), block or save_block(t)
        buf = torch.empty(_C.codec_bound(n, t.element_size(), b), dtype=torch.uint8)
        m = _C.codec_encode(ctx, t.data_ptr(), n, t.element_size(), b, 0, buf.data_ptr(),
                            buf.numel())
        out[k] = buf[:m]
    return out


def decode_all(streams, outs):
    ctx = context()
    for k, s in streams.items():
        o = outs[k]
        _C.codec_decode(ctx, s.numpy(), o.data_ptr(), o.numel() * o.element_size())


def raw_read_ceiling(path, nbytes):
    """O_DIRECT read GB/s of a fresh file of @p nbytes after a page-cache drop (root; else
    None), as the scenario benchmark measures its raw ceiling."""
    raw_io(path, nbytes, True)
    if not drop_caches():
        os.unlink(path)
        return None
    done, secs = raw_io(path, nbytes, False)
    os.unlink(path)
    return done / secs / 1e9


LOADER = r"""
import sys, time, torch
sys.path.insert(0, sys.argv[2])
path, device, tool = sys.argv[1], sys.argv[3], sys.argv[4]
if device == "cuda":
    torch.empty(1, device="cuda")  # the CUDA context is not the load's time
if tool == "safetensors":
    from safetensors.torch import load_file
else:
    from fastensor.torch import load_file
t0 = time.perf_counter()
sd = load_file(path, device=device)
s = sum(int(v.reshape(-1).view(torch.uint8)[::4096].sum()) for v in sd.values() if v.numel())
if device == "cuda":
    torch.cuda.synchronize()
print(time.perf_counter() - t0)
"""


def save_and_load(sd, directory, rounds, device):
    """Durable save and cold load of .safetensors and .fst, interleaved, beside the raw read
    of as many bytes and the safetensors package's load. {kind: [GB/s]}."""
    import fastensor.torch as ft
    try:
        import safetensors  # noqa: F401
        package = True
    except ImportError:
        package = False
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    paths = {k: os.path.join(directory, f"codec-bench-{os.getpid()}{k}")
             for k in (".safetensors", ".fst")}
    raw = os.path.join(directory, f"codec-bench-{os.getpid()}.raw")
    out = {f"save{k}": [] for k in paths}
    loads = list(paths) + (["safetensors package"] if package else []) + ["raw read"]
    out.update({f"cold load {k}": [] for k in loads})
    pydir = os.path.join(os.path.dirname(HERE), "python")
    try:
        raw_io(raw, nbytes, True)
        for r in range(rounds):
            order = list(paths) if r % 2 == 0 else list(paths)[::-1]
            for k in order:
                t0 = time.perf_counter()
                ft.save_file(sd, paths[k], compression="always") if k == ".fst" else \
                    ft.save_file(sd, paths[k])
                out[f"save{k}"].append(nbytes / (time.perf_counter() - t0) / 1e9)
            for k in loads if r % 2 == 0 else loads[::-1]:
                if not drop_caches():
                    raise PermissionError(1, "cannot drop the page cache (not root)")
                if k == "raw read":
                    done, secs = raw_io(raw, nbytes, False)
                    out["cold load raw read"].append(done / secs / 1e9)
                    continue
                path = paths[".safetensors"] if k == "safetensors package" else paths[k]
                tool = "safetensors" if k == "safetensors package" else "fastensor"
                secs = float(subprocess.run([sys.executable, "-c", LOADER, path, pydir, device,
                                             tool], capture_output=True, text=True,
                                            check=True).stdout.split()[-1])
                out[f"cold load {k}"].append(nbytes / secs / 1e9)
    finally:
        for p in list(paths.values()) + [raw]:
            if os.path.exists(p):
                os.unlink(p)
    return out


def gpu_decode(sd, streams, rounds):
    """All streams of a state dict decoded on the GPU in one call: (GB/s from device-resident
    streams, GB/s from pinned host streams, bit-exact), GB/s of the decoded bytes."""
    ctx = context()
    dev = torch.cuda.current_device()
    hosts = {k: s.pin_memory() for k, s in streams.items()}
    on_dev = {k: s.cuda() for k, s in streams.items()}
    outs = {k: torch.empty_like(v, device="cuda") for k, v in sd.items()}
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())

    def jobs(resident):
        return [(hosts[k].data_ptr(), hosts[k].numel(), outs[k].data_ptr(),
                 outs[k].numel() * outs[k].element_size()) +
                ((on_dev[k].data_ptr(),) if resident else ()) for k in sd]
    rates = {True: [], False: []}
    stream = torch.cuda.current_stream().cuda_stream
    for _ in range(rounds + 1):  # (the first: the module's load)
        for resident in (True, False):
            j = jobs(resident)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            _C.codec_decode_cuda(ctx, j, dev, stream)
            rates[resident].append(nbytes / (time.perf_counter() - t0) / 1e9)
    exact = all(torch.equal(outs[k].view(torch.uint8).cpu(), sd[k].view(torch.uint8))
                for k in sd)
    return rates[True][1:], rates[False][1:], exact


def gpu_encode(sd, streams, rounds):
    """Every tensor of a state dict encoded on the GPU in one call (ft_codec_encode_cuda_batch),
    into device memory (the encoder's rate) and into pinned host memory (with the copy of the
    coded bytes): (GB/s of the uncompressed bytes per round into the device, the same into the
    host, every stream the CPU encoder's)."""
    ctx = context()
    dev = torch.cuda.current_device()
    on_dev = {k: t.cuda() for k, t in sd.items()}

    def room(t):
        return _C.codec_bound(t.numel() * t.element_size(), t.element_size(), save_block(t))
    outs = {"cuda": {k: torch.empty(room(t), dtype=torch.uint8, device="cuda")
                     for k, t in sd.items()},
            "host": {k: torch.empty(room(t), dtype=torch.uint8).pin_memory()
                     for k, t in sd.items()}}
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    stream = torch.cuda.current_stream().cuda_stream
    rates, same = {"cuda": [], "host": []}, True
    for _ in range(rounds + 1):  # (the first: the module's load)
        for where, out in outs.items():
            jobs = [(t.data_ptr(), t.numel() * t.element_size(), t.element_size(),
                     save_block(t), out[k].data_ptr(), out[k].numel())
                    for k, t in on_dev.items()]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            got = _C.codec_encode_cuda(ctx, jobs, dev, stream)
            rates[where].append(nbytes / (time.perf_counter() - t0) / 1e9)
            sizes = dict(zip(on_dev, got))
            same = same and all(torch.equal(out[k][:sizes[k]].cpu(), streams[k]) for k in sd)
    del on_dev, outs
    return rates["cuda"][1:], rates["host"][1:], same


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="1G", help="bytes of the bf16 Llama-style state dict (at least)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="llama-bf16,gpt2-fp32,vit-fp32")
    ap.add_argument("--dir", default=None, help="a directory on the disk for the ceiling")
    ap.add_argument("--device", default="cpu", help="cpu or cuda: where loads put tensors")
    ap.add_argument("--gpu-blocks", default="",
                    help="with --device cuda: also decode on the GPU streams coded in blocks "
                    "of these sizes (e.g. 256K,512K): ratio and GPU decode GB/s per size")
    ap.add_argument("--json")
    a = ap.parse_args()
    size = nbytes_of(a.size)
    blocks = [nbytes_of(v) for v in a.gpu_blocks.split(",") if v]
    makers = {"llama-bf16": lambda: llama(size), "gpt2-fp32": gpt2, "vit-fp32": vit}
    rows, skipped, workflow, workflow_of = [], {}, {}, []
    for name in a.models.split(","):
        try:
            sd = floats(makers[name]())
        except ImportError as e:
            skipped[name] = f"not installed: {e.name}"
            continue
        nbytes = sum(t.numel() * t.element_size() for t in sd.values())
        enc, dec = [], []
        outs = {k: torch.empty_like(v) for k, v in sd.items()}
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            streams = encode_all(sd)
            t1 = time.perf_counter()
            decode_all(streams, outs)
            t2 = time.perf_counter()
            enc.append(nbytes / (t1 - t0) / 1e9)
            dec.append(nbytes / (t2 - t1) / 1e9)
        exact = all(torch.equal(outs[k].view(torch.uint8), sd[k].view(torch.uint8)) for k in sd)
        ratio = sum(s.numel() for s in streams.values()) / nbytes
        row = {"model": name, "bytes": nbytes, "tensors": len(sd), "ratio": ratio,
               "encode_gbps": enc, "decode_gbps": dec, "bit_exact": exact}
        if a.device == "cuda":
            res, pinned, gexact = gpu_decode(sd, streams, a.rounds)
            genc, genc_host, gsame = gpu_encode(sd, streams, a.rounds)
            row.update(gpu_decode_gbps=res, gpu_decode_with_copy_gbps=pinned,
                       gpu_bit_exact=gexact, gpu_encode_gbps=genc,
                       gpu_encode_with_copy_gbps=genc_host, gpu_encode_same_bytes=gsame)
            row["bit_exact"] = exact and gexact and gsame
            sweep = {}
            for b in blocks:
                coded = encode_all(sd, b)
                res_b, _, exact_b = gpu_decode(sd, coded, a.rounds)
                sweep[b] = {"ratio": sum(s.numel() for s in coded.values()) / nbytes,
                            "gpu_decode_gbps": res_b, "gpu_bit_exact": exact_b}
                row["bit_exact"] = row["bit_exact"] and exact_b
                del coded
            if sweep:
                row["gpu_block_sweep"] = sweep
        rows.append(row)
        del outs, streams
        if a.dir and (not workflow or a.device == "cuda"):
            try:
                workflow[name] = save_and_load(sd, a.dir, a.rounds, a.device)
                workflow_of.append(name)
            except OSError as e:
                skipped["save/load"] = f"cannot drop the page cache ({e.strerror})"
        del sd
        if a.device == "cuda":
            torch.cuda.empty_cache()
    ceiling = None
    auto = None
    if a.dir:
        from fastensor import _fst
        rates = _fst.cost(a.dir, 2)
        auto = {"encode_gbps": rates[0], "decode_gbps": rates[2], "write_gbps": rates[3],
                "read_gbps": rates[4], "codes": _fst.coding_pays(a.dir),
                "fp32_encode_gbps": _fst.cost(a.dir, 4)[0], "codes_fp32": _fst.coding_pays(a.dir, 4)}
        ceiling = raw_read_ceiling(os.path.join(a.dir, f"codec-ceiling-{os.getpid()}"),
                                   min(size, 2 << 30))
    def cell(v):
        return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
    gpu = a.device == "cuda"
    lines = ["| state dict | GiB | ratio | encode GB/s | decode GB/s | " +
             ("GPU decode GB/s | GPU decode + copy GB/s | GPU encode GB/s | "
              "GPU encode + copy GB/s | " if gpu else "") +
             "cold-load bound GB/s |",
             "|---|---|---|---|---|" + ("---|---|---|---|" if gpu else "") +
             "---|"]
    for r in rows:
        d = statistics.median(r["decode_gbps"])
        if gpu:
            d = statistics.median(r["gpu_decode_gbps"])
        bound = f"{min(d, ceiling / r['ratio']):.2f}" if ceiling else "-"
        lines.append(f"| {r['model']} | {r['bytes'] / 2**30:.2f} | {r['ratio']:.3f} | "
                     f"{cell(r['encode_gbps'])} | {cell(r['decode_gbps'])} | " +
                     (f"{cell(r['gpu_decode_gbps'])} | {cell(r['gpu_decode_with_copy_gbps'])} | "
                      f"{cell(r['gpu_encode_gbps'])} | {cell(r['gpu_encode_with_copy_gbps'])}"
                      f"{'' if r['gpu_encode_same_bytes'] else ' (NOT the CPU bytes)'} | "
                      if gpu else "") + f"{bound} |")
    for r in rows:
        if "gpu_block_sweep" not in r:
            continue
        lines += ["", f"{r['model']}, GPU decode by codec block size:", "",
                  "| block | ratio | GPU decode GB/s |", "|---|---|---|"]
        for b, v in r["gpu_block_sweep"].items():
            lines.append(f"| {b >> 10} KiB | {v['ratio']:.4f} | {cell(v['gpu_decode_gbps'])} |")
    for name, w in workflow.items():
        lines += ["", f"{name}, durable save and cold load into {a.device} memory, GB/s of its "
                  "bytes (uncompressed):", "", "| | GB/s | / raw read | / .safetensors |",
                  "|---|---|---|---|"]
        raw = statistics.median(w["cold load raw read"])
        for k, v in w.items():
            base = w["save.safetensors"] if k.startswith("save") else \
                w["cold load .safetensors"]
            ratio_raw = f"{statistics.median(v) / raw:.2f}x" if k.startswith("cold") else "-"
            lines.append(f"| {k} | {cell(v)} | {ratio_raw} | "
                         f"{statistics.median(v) / statistics.median(base):.2f}x |")
    if auto:
        verdict = lambda yes: "codes" if yes else "stores"  # noqa: E731
        lines += ["", f"compression=\"auto\" here: bf16 {verdict(auto['codes'])}, fp32 "
                  f"{verdict(auto['codes_fp32'])} (codec {auto['encode_gbps']:.2f} / "
                  f"{auto['decode_gbps']:.2f} GB/s encode / decode bf16, "
                  f"{auto['fp32_encode_gbps']:.2f} encode fp32; disk {auto['write_gbps']:.2f} / "
                  f"{auto['read_gbps']:.2f} write / read)"]
    table = "\n".join(lines)
    head = (f"{os.cpu_count()} CPUs, {a.rounds} rounds, median (range); raw O_DIRECT read "
            f"ceiling {ceiling:.2f} GB/s" if ceiling else f"{os.cpu_count()} CPUs, no ceiling")
    print(f"{head}\n\n{table}")
    for k, v in skipped.items():
        print(f"skipped {k}: {v}")
    if not all(r["bit_exact"] for r in rows):
        print("MISMATCH: a decode differs from the input", file=sys.stderr)
        sys.exit(1)
    if a.json:
        commit = os.environ.get("FT_COMMIT") or subprocess.run(
            ["git", "-C", HERE, "describe", "--always", "--dirty"], capture_output=True,
            text=True).stdout.strip()
        with open(a.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "commit": commit,
                       "machine": os.uname().nodename, "cpus": os.cpu_count(),
                       "raw_read_gbps": ceiling, "rows": rows, "skipped": skipped,
                       "save_load_gbps": workflow, "auto": auto,
                       "table": table}, f, indent=1)


if __name__ == "__main__":
    main()
