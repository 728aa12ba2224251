#!/usr/bin/env python3
"""A .fst save against a plain one: durable saves of one state dict as .safetensors and as a
.fst container (compression="always", or --compression), and the plain save again (its twin,
the noise floor), interleaved (each first in turn), in one process (as a training job saves
again and again), from host memory or (--device cuda) GPU memory, where the GPU encoder codes
it. Each save starts once the last one's work has settled (os.sync, then --settle seconds: a
save frees the file it replaces in the background, with online discard for a while, and a
training job's saves are minutes apart; back to back, each save ran beside the last one's
free, which took about the same time from both and hid part of the .fst's lead: development
machine, coded streams of 1 GiB of bf16 written as .fst, 1.34-1.39x the plain save back to
back, 1.54-1.77x settled). Per round: GB/s of the saves, the .fst's and the twin's ratio to the
plain save; medians.
Then what compression="auto" measures there (the library's ft_fst_measure) and decides, and
with --device cuda whether the GPU codes (ft_fst_gpu_codes).
(The save is the library's, src/ckpt/fst_save.c: its calls are not timed from here.)

    PYTHONPATH=python python3 bench/fst-save.py --size 2G --dir /nvme/dir --rounds 3 \
        [--device cuda]
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
sys.path.insert(0, HERE)

import fastensor.torch as ft  # noqa: E402
from fastensor import _fst  # noqa: E402
from codec import gpt2, llama, nbytes_of  # noqa: E402  (bench/codec.py's state dicts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama-bf16",
                    help="llama-bf16 (default: Llama-style, --size bytes) or gpt2-fp32 (GPT-2 "
                         "from its config, 0.6 GiB; transformers)")
    ap.add_argument("--size", default="1G", help="bytes of the bf16 state dict (K, M, G)")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu", help="where the state dict lives: cpu or cuda")
    ap.add_argument("--compression", default="always",
                    help='the .fst save\'s: "always" (default), "auto", or "none" (streams '
                         "stored: the container's write path alone)")
    ap.add_argument("--settle", type=float, default=2.0,
                    help="seconds after os.sync() between saves (0: back to back)")
    a = ap.parse_args()
    sd = gpt2() if a.model == "gpt2-fp32" else llama(nbytes_of(a.size))
    sd = {k: v.to(a.device) for k, v in sd.items()}
    total = sum(t.numel() * t.element_size() for t in sd.values())
    print(f"{a.model}: {total / 2**30:.2f} GiB in {a.device} memory, {len(sd)} tensors, "
          f"{os.cpu_count()} CPUs, {a.dir}, {a.settle:g} s settled between saves")
    # 0: the plain save; 1: the .fst save; 2: the plain save again (its twin: the noise floor)
    paths = [os.path.join(a.dir, f"fst-save-{os.getpid()}{x}")
             for x in (".safetensors", ".fst", "-twin.safetensors")]
    ratios, twins = [], []
    try:
        for r in range(a.rounds):
            secs = {}
            for k in (0, 1, 2)[r % 3:] + (0, 1, 2)[:r % 3]:  # (each first in turn)
                os.sync()
                time.sleep(a.settle)
                s = time.perf_counter()
                ft.save_file(sd, paths[k], **({"compression": a.compression} if k == 1 else {}))
                secs[k] = time.perf_counter() - s
            ratios.append(secs[0] / secs[1])
            twins.append(secs[0] / secs[2])
            print(f"round {r + 1}: .safetensors {total / secs[0] / 1e9:.2f} GB/s, .fst "
                  f"{total / secs[1] / 1e9:.2f} GB/s ({ratios[-1]:.2f}x), twin "
                  f"{total / secs[2] / 1e9:.2f} GB/s ({twins[-1]:.2f}x)")
        print(f".fst / .safetensors save: median {statistics.median(ratios):.2f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f}), {a.rounds} rounds; the plain save's twin "
              f"{statistics.median(twins):.2f}x ({min(twins):.2f}-{max(twins):.2f})")
    finally:
        for p in paths:
            if os.path.exists(p):
                os.unlink(p)
    enc, _, dec, write, read = _fst.cost(a.dir, 2)
    enc4 = _fst.cost(a.dir, 4)[0]
    print(f'compression="auto" measures encode {enc:.2f} (fp32 {enc4:.2f}), decode {dec:.2f}, '
          f"write {write:.2f}, read {read:.2f} GB/s (encode / write {enc / write:.2f}): bf16 "
          f"{'codes' if _fst.coding_pays(a.dir) else 'stores'}, fp32 "
          f"{'codes' if _fst.coding_pays(a.dir, 4) else 'stores'}")
    if a.device.startswith("cuda"):
        dev = sd[next(iter(sd))].device.index or 0
        for elem, name in ((2, "bf16"), (4, "fp32")):
            codes, rate = _fst.gpu_codes(dev, elem)
            print(f"GPU {dev} encoder, {name}: {rate:.2f} GB/s on 32 MiB (to pinned memory); "
                  f"{name} tensors in its memory are coded {'there' if codes else 'on the host'}")


if __name__ == "__main__":
    main()
