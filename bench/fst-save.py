#!/usr/bin/env python3
"""Where a .fst save's time goes: durable saves of one state dict as .safetensors and as a
.fst container (compression="always"), interleaved, in one process (as a training job saves
again and again), with the .fst save's encode calls, piece writes and fdatasyncs timed.

Per round: GB/s of both saves and their ratio; the seconds the writes and syncs took (summed
over the writer threads: above the save's time when they overlap) and the encode calls took.
--timeline prints the last round's calls (start, end in ms; pieces of at least 16 MiB
coded, 4 MiB written). Then what compression="auto" measures there and decides.

    PYTHONPATH=python python3 bench/fst-save.py --size 2G --dir /nvme/dir --rounds 3
"""
import argparse
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
sys.path.insert(0, HERE)

import fastensor  # noqa: E402
import fastensor.torch as ft  # noqa: E402
from fastensor import _C, _fst  # noqa: E402
from codec import llama  # noqa: E402  (bench/codec.py: a Llama-style bf16 state dict)


def instrument(events, t0):
    """Time _fst's encode calls and File.write / File.sync (appended to ``events`` as (kind,
    MiB, start, end) relative to t0[0])."""
    lock = threading.Lock()
    real_encode = _C.codec_encode

    def encode(*a):
        s = time.perf_counter()
        r = real_encode(*a)
        with lock:
            events.append(("encode", a[2] >> 20, s - t0[0], time.perf_counter() - t0[0]))
        return r
    _fst._C = type("C", (), {k: getattr(_C, k) for k in dir(_C) if not k.startswith("__")})
    _fst._C.codec_encode = staticmethod(encode)
    for name in ("write", "sync"):
        real = getattr(fastensor.File, name)

        def timed(*a, _real=real, _name=name, **k):
            s = time.perf_counter()
            r = _real(*a, **k)
            size = (a[1].size >> 20) if len(a) > 1 and hasattr(a[1], "size") else 0
            with lock:
                events.append((_name, size, s - t0[0], time.perf_counter() - t0[0]))
            return r
        setattr(fastensor.File, name, timed)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="1G", help="bytes of the bf16 state dict (K, M, G)")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeline", action="store_true")
    a = ap.parse_args()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    unit = a.size[-1].upper()
    size = int(float(a.size[:-1]) * mult[unit]) if unit in mult else int(a.size)
    sd = llama(size)
    total = sum(t.numel() * t.element_size() for t in sd.values())
    print(f"{total / 2**30:.2f} GiB bf16, {len(sd)} tensors, {os.cpu_count()} CPUs, {a.dir}")
    events, t0 = [], [0.0]
    instrument(events, t0)
    paths = [os.path.join(a.dir, f"fst-save-{os.getpid()}{x}") for x in (".safetensors", ".fst")]
    try:
        for r in range(a.rounds):
            s = time.perf_counter()
            ft.save_file(sd, paths[0])
            plain = time.perf_counter() - s
            events.clear()
            t0[0] = time.perf_counter()
            ft.save_file(sd, paths[1], compression="always")
            coded = time.perf_counter() - t0[0]
            io = sum(e[3] - e[2] for e in events if e[0] in ("write", "sync"))
            enc = sum(e[3] - e[2] for e in events if e[0] == "encode")
            print(f"round {r + 1}: .safetensors {total / plain / 1e9:.2f} GB/s, .fst "
                  f"{total / coded / 1e9:.2f} GB/s ({plain / coded:.2f}x); writes and syncs "
                  f"{io:.3f} s, encode calls {enc:.3f} s, in a save of {coded:.3f} s")
        if a.timeline:
            for kind, mib, s, e in sorted(events, key=lambda e: e[2]):
                if kind == "sync" or (kind == "write" and mib >= 4) or mib >= 16:
                    print(f"  {kind:6s} {mib:5d} MiB {s * 1e3:8.1f} {e * 1e3:8.1f} ms")
    finally:
        for p in paths:
            if os.path.exists(p):
                os.unlink(p)
    enc, dec, write, read = _fst._measure(a.dir)
    enc4 = _fst._sample(4)[0]
    print(f'compression="auto" measures encode {enc:.2f} (fp32 {enc4:.2f}), decode {dec:.2f}, '
          f"write {write:.2f}, read {read:.2f} GB/s (encode / write {enc / write:.2f}): bf16 "
          f"{'codes' if _fst.coding_pays(a.dir) else 'stores'}, fp32 "
          f"{'codes' if _fst.coding_pays(a.dir, 4) else 'stores'}")


if __name__ == "__main__":
    main()
