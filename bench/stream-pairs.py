#!/usr/bin/python3
"""How fast an engine reads a cold stream depends on the engine that read before it.

Reads the first --total bytes of a file in order, cold (the file's pages dropped first with
POSIX_FADV_DONTNEED), one call at a time, the engines taking turns in a fixed pattern:
posix alone, direct alone, posix and direct alternating, and so on. Prints each engine's
GB/s within each pattern. An adaptive selector that samples one call of an arm in the
middle of a stream of another arm's calls measures the change, not the arm: these pairs
are what such samples look like.

    PYTHONPATH=python bench/stream-pairs.py --file /nvme/pairs.bin [--size 2G] [--total 1G]
        [--blocks 1M,16M,64M] [--patterns posix,direct,posix+direct,posix+uring,mmap,mmap+direct]
"""
import argparse
import os
import sys
import time

import numpy as np

import fastensor


def size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def drop(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run(path, block, pattern, total):
    """GB/s of each engine of @pattern, taking turns call by call over [0, total)."""
    drop(path)
    buf = np.empty(block, dtype=np.uint8)
    moved = {}
    with fastensor.File(path, "r") as f:
        for i, off in enumerate(range(0, total, block)):
            engine = pattern[i % len(pattern)]
            t0 = time.perf_counter()
            n = f.read_into(buf, off, engine=engine)
            dt = time.perf_counter() - t0
            acc = moved.setdefault(engine, [0, 0.0])
            acc[0] += n
            acc[1] += dt
    return {e: b / s / 1e9 for e, (b, s) in moved.items()}, sum(s for _, s in moved.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--file", required=True, help="file to read (made, random bytes, if "
                    "missing or of another size)")
    ap.add_argument("--size", default="2G")
    ap.add_argument("--total", default="1G", help="bytes read per pattern")
    ap.add_argument("--blocks", default="1M,16M,64M")
    ap.add_argument("--patterns", default="posix,direct,posix+direct,posix+uring,mmap,"
                    "mmap+direct")
    a = ap.parse_args()
    file_size, total = size(a.size), size(a.total)
    if total > file_size:
        sys.exit("--total is larger than --size")
    if not os.path.exists(a.file) or os.path.getsize(a.file) != file_size:
        chunk = np.random.default_rng(1).integers(0, 256, 64 << 20, dtype=np.uint8)
        with fastensor.File(a.file, "w", engine="direct") as f:
            for off in range(0, file_size, len(chunk)):
                f.write(chunk[:min(len(chunk), file_size - off)], off, sync=True)
    for block in (size(b) for b in a.blocks.split(",")):
        for pattern in (p.split("+") for p in a.patterns.split(",")):
            rates, seconds = run(a.file, block, pattern, total // block * block)
            print("%5s %-14s %6.2f s   %s" % (
                "%dM" % (block >> 20) if block >= 1 << 20 else "%dK" % (block >> 10),
                "+".join(pattern), seconds,
                "  ".join("%s %.2f GB/s" % (e, r) for e, r in rates.items())), flush=True)


if __name__ == "__main__":
    main()
