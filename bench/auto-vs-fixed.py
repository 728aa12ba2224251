#!/usr/bin/python3
"""AUTO against every fixed engine, per block size, cold and warm reads and durable writes.

Builds the profile first (`fastensor tune`, as a user would once per machine), then runs
`fastensor bench --json` for every engine in rounds (this kind of disk drifts over minutes:
timing engines back to back in one stretch each compares the disk's moods), and prints per
(op, block, cache) the median GB/s of each engine, the best fixed engine and AUTO's ratio to
it. Every bench call is a new process that starts from the saved profile, as a job would.
Reads go to one file laid out once (O_DIRECT) and never rewritten, writes to another: on a
virtual disk cached by its host, how a file was written decides how fast it reads back "cold"
(measured: 1 MiB cold reads of a file the engine under test had just written ran at 1.2-1.5
GB/s after O_DIRECT writes and at 3.3 after buffered ones, whatever engine read it).

A round runs every engine's writes, then every engine's reads: how the process before wrote
decides how fast the next one reads another file cold (development machine, cold 4 KiB reads
of the read file by posix: 1.39-1.52 GB/s after a posix write pass, 0.96-1.12 after an AUTO
one, whose writes were O_DIRECT),
and a read right after its own engine's writes measured that engine's writes too. Each phase
of each round takes the engines in a fresh order (a permutation drawn from --seed), not a
rotation of one list: rotated, every engine came after the same engine in every round (AUTO
always after mmap's second run), so whatever a predecessor leaves behind would weigh on one
engine in every round. (Development machine, rotated: durable 64 MiB writes by `uring` and
its twin, each after a `direct` run, at medians of 4.3-5.9 GB/s, AUTO after `mmap` at 2.5-2.9,
while outside the bench, taking turns with `uring`, AUTO wrote them as fast.)

    bench/auto-vs-fixed.py [--memory host|cuda] [--sizes 4K,1M,64M,1G] [--rounds 3] ...
"""
import argparse
import collections
import json
import math
import os
import random
import statistics
import subprocess
import sys


def bench(exe, args, engine, trace=None):
    cmd = [exe, "bench", "--json", "--engine", engine] + args
    env = dict(os.environ, FASTENSOR_TRACE=trace) if trace else None
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env=env).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def trace_bytes(path, memory):
    """AUTO's bytes per table row and engine, from its trace: (op, block, cache) -> engine ->
    bytes. A line's call= is the caller's whole call, the bench's block (a trial slice is a
    part of one); reads decided as cached are the warm pass's, the others the cold one's."""
    rows = collections.defaultdict(collections.Counter)
    if not path or not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            words = line.split()
            kv = dict(w.split("=", 1) for w in words if "=" in w)
            if len(words) < 2 or words[1] != memory or "call" not in kv:
                continue
            op = words[0]
            cache = "sync" if op == "write" else "warm" if kv["cache"] == "2" else "cold"
            rows[(op, int(kv["call"]), cache)][kv["arm"].split("/")[0]] += int(kv["bytes"])
    return rows


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fastensor", default=os.path.join(here, "..", "build", "fastensor"))
    ap.add_argument("--file", default="./fastensor-auto-vs-fixed.tmp")
    ap.add_argument("--memory", default="host")
    ap.add_argument("--sizes", default="4K,1M,64M,1G")
    ap.add_argument("--engines", default="posix,direct,uring,mmap",
                    help="fixed engines to compare with auto (cufile too for --memory cuda)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1,
                    help="the engines' order in each phase of each round is a permutation drawn "
                         "from this seed")
    ap.add_argument("--total", default=None, help="bytes per measurement (bench's default)")
    ap.add_argument("--tune-seconds", type=int, default=60, help="0: use the profile as it is")
    ap.add_argument("--tune-max", default="1G")
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--trace", help="AUTO's calls, one line each (FASTENSOR_TRACE), to this file")
    ap.add_argument("--from-json", metavar="FILE",
                    help="print the table of a run saved by --json instead of running one "
                         "(its engines, twins and rounds as saved; --trace adds the shares)")
    ap.add_argument("--twins", action="store_true",
                    help="run every fixed engine twice per round (the second as ENGINE#2) and "
                         "report how the best engine's twin compares with the best: what the "
                         "same measure gives an oracle that always ran the best engine")
    a = ap.parse_args()

    if a.from_json:
        try:
            with open(a.from_json) as f:
                runs = json.load(f)
            need = {"engine", "round", "op", "block", "gbps"}
            if not isinstance(runs, list) or not runs or \
                    not all(isinstance(m, dict) and need <= m.keys() for m in runs):
                raise ValueError("no measurements saved by --json")
        except (OSError, ValueError, TypeError) as e:
            sys.exit("auto-vs-fixed.py: %s: %s" % (a.from_json, e))
        engines = list(dict.fromkeys(m["engine"] for m in runs))
        canon = ["posix", "direct", "uring", "mmap", "cufile"]  # the columns' usual order
        engines.sort(key=lambda e: (canon.index(e.split("#")[0])
                                    if e.split("#")[0] in canon else len(canon), e))
        a.twins = any("#" in e for e in engines)
        a.rounds = 1 + max(m["round"] for m in runs)
        a.memory = runs[0].get("memory", a.memory)
        summarize(a, runs, engines)
        return
    if a.tune_seconds > 0:
        print("tuning (fastensor tune, %d s at most) ..." % a.tune_seconds, file=sys.stderr)
        subprocess.run([a.fastensor, "tune", "--file", a.file, "--memory", a.memory, "--seconds",
                        str(a.tune_seconds), "--max-size", a.tune_max], check=True,
                       stdout=subprocess.DEVNULL)
    if a.trace and os.path.exists(a.trace):
        os.unlink(a.trace)  # the trace is appended to: this run's calls only
    rfile, wfile = a.file + ".r", a.file + ".w"
    common = ["--memory", a.memory, "--size", a.sizes] + (["--total", a.total] if a.total else [])
    subprocess.run([a.fastensor, "bench", "--engine", "direct", "--op", "write", "--size", "64M",
                    "--total", a.total or "1G", "--file", rfile], check=True,
                   stdout=subprocess.DEVNULL)
    engines = a.engines.split(",")
    engines += [e + "#2" for e in engines] if a.twins else []
    engines += ["auto"]
    runs = []
    try:
        shuffle = random.Random(a.seed)
        for r in range(a.rounds):
            for op, f in (("write", wfile), ("read", rfile)):
                order = list(engines)
                shuffle.shuffle(order)
                for e in order:
                    print("round %d/%d: %s %s" % (r + 1, a.rounds, op, e), file=sys.stderr)
                    trace = a.trace if e == "auto" else None
                    args = common + ["--op", op, "--file", f]
                    for m in bench(a.fastensor, args, e.split("#")[0], trace):
                        m["engine"] = e
                        m["round"] = r
                        runs.append(m)
                    save(a.json, runs)  # so far: a run cut short leaves its rounds
    finally:
        for f in (a.file, rfile, wfile):
            if os.path.exists(f):
                os.unlink(f)
    save(a.json, runs)
    summarize(a, runs, engines)


def save(path, runs):
    if not path or not runs:
        return
    with open(path + ".tmp", "w") as f:
        json.dump(runs, f, indent=1)
    os.replace(path + ".tmp", path)


def summarize(a, runs, engines):
    table = collections.defaultdict(lambda: collections.defaultdict(list))
    by_round = collections.defaultdict(dict)  # (op, block, cache, round) -> engine -> GB/s
    for m in runs:
        cache = "sync" if m["op"] == "write" else m["cache"]
        table[(m["op"], m["block"], cache)][m["engine"]].append(m["gbps"])
        by_round[(m["op"], m["block"], cache, m["round"])][m["engine"]] = m["gbps"]
    fixed = [e for e in engines if e != "auto" and "#" not in e]

    def size(b):
        for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
            if b >= 1 << shift:
                return "%d%s" % (b >> shift, unit)
        return str(b)

    print("AUTO vs fixed engines, %s memory, median GB/s of %d interleaved rounds"
          % (a.memory, a.rounds))
    print("(auto / best: AUTO's median over the best fixed engine's; paired: the median over "
          "rounds of\nAUTO's figure over that engine's in the same round, which the disk's "
          "drift between rounds moves less)")
    if a.twins:
        print("(twin: the best fixed engine's second run in the same rounds, by the same two "
              "measures: how close an\noracle that always ran the best engine comes; the best of "
              "several close, noisy medians is biased up)")
    print()
    twin_head = " twin / best | twin paired |" if a.twins else ""
    traced = trace_bytes(a.trace, a.memory)
    trace_head = " auto on a best engine |" if traced else ""
    print("| op | block | cache | " + " | ".join(fixed) +
          " | auto | best fixed | auto / best | paired |" + twin_head + trace_head)
    print("|---|---|---|" + "---|" * (len(fixed) + 4 + 2 * a.twins + bool(traced)))
    on_best = []
    within = total = twin_within = paired_within = twin_paired_within = 0

    def paired_ratios(op, block, cache, e, best):
        pairs = [by_round[(op, block, cache, r)] for r in range(a.rounds)]
        return [p[e] / p[best] for p in pairs if p.get(e) and p.get(best)]

    def paired_median(op, block, cache, e, best):
        pairs = paired_ratios(op, block, cache, e, best)
        return statistics.median(pairs) if pairs else None

    # The k-th lowest and k-th highest of n paired ratios hold their distribution's median
    # with probability 1 - 2 P(Binomial(n, 1/2) < k), whatever that distribution is: for the
    # whole range (k = 1) 1 - 2^(1-n), 94% for 5 rounds, 75% for 3. With more rounds k grows
    # while that stays at least 15/16 (the whole range of 5 rounds): 10 rounds drop the
    # lowest and the highest ratio (98%). A row is met when even the interval's low end is
    # within 5%, missed when even its high end is not, and open (the noise cannot tell)
    # otherwise.
    verdicts = collections.Counter()
    twin_verdicts = collections.Counter()

    def coverage(n, k):
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2.0 ** n

    def order_k(n):
        k = 1
        while k + 1 <= (n + 1) // 2 and coverage(n, k + 1) >= 15 / 16:
            k += 1
        return k

    def interval(pairs):
        x = sorted(pairs)
        k = order_k(len(x))
        return x[k - 1], x[len(x) - k]

    def verdict(pairs):
        if not pairs:
            return "-"
        lo, hi = interval(pairs)
        return "met" if lo >= 0.95 else "missed" if hi < 0.95 else "open"
    for (op, block, cache), per in sorted(table.items()):
        med = {e: statistics.median(v) for e, v in per.items()}
        best = max(fixed, key=lambda e: med.get(e, 0))
        ratio = med.get("auto", 0) / med[best] if med.get(best) else 0
        total += 1
        within += ratio >= 0.95
        pm = paired_median(op, block, cache, "auto", best)
        paired_within += pm is not None and pm >= 0.95
        pairs = paired_ratios(op, block, cache, "auto", best)
        verdicts[verdict(pairs)] += 1
        paired = "%.2f (%.2f-%.2f) %s" % ((pm,) + interval(pairs) + (verdict(pairs),)) \
            if pm is not None else "-"
        cells = ["%.2f" % med[e] if e in med else "-" for e in fixed]
        twin = ""
        if a.twins:
            t = med.get(best + "#2", 0) / med[best] if med.get(best) else 0
            twin_within += t >= 0.95
            tp = paired_median(op, block, cache, best + "#2", best)
            twin_verdicts[verdict(paired_ratios(op, block, cache, best + "#2", best))] += 1
            twin_paired_within += tp is not None and tp >= 0.95
            twin = " %.2f | %s |" % (t, "%.2f" % tp if tp is not None else "-")
        share = ""
        if traced:
            # AUTO's bytes moved by an engine within 5% of the best fixed one: what it chose,
            # apart from how fast the disk was while it ran
            good = {e for e in fixed if med.get(e, 0) >= 0.95 * med[best]}
            by = traced.get((op, block, cache), {})
            moved = sum(by.values())
            if moved:
                on_best.append(sum(by[e] for e in good) / moved)
            share = " %s |" % ("%.0f%%" % (100.0 * on_best[-1]) if moved else "-")
        print("| %s | %s | %s | %s | %.2f | %s | %.2f | %s |%s%s"
              % (op, size(block), cache, " | ".join(cells), med.get("auto", 0), best, ratio,
                 paired, twin, share))
    print()
    print("auto within 5%% of the best fixed engine in %d of %d cases (paired: %d of %d)"
          % (within, total, paired_within, total))
    if a.twins:
        print("the best engine's twin (a second run of it in every round: an oracle) within 5%% "
              "of the best fixed engine in %d of %d cases (paired: %d of %d)"
              % (twin_within, total, twin_paired_within, total))
    print("by an interval of the paired ratios (it holds their median with probability %.0f%%): "
          "auto met in %d, missed in %d, open in %d"
          % (100 * coverage(a.rounds, order_k(a.rounds)), verdicts["met"], verdicts["missed"],
             verdicts["open"]) +
          ("; the twin met in %d, missed in %d, open in %d"
           % (twin_verdicts["met"], twin_verdicts["missed"], twin_verdicts["open"])
           if a.twins else ""))
    if on_best:
        print("auto on a best engine: the share of AUTO's bytes (from its trace) that an engine "
              "within 5%% of the best\nfixed engine moved; at least 95%% in %d of %d cases "
              "(tracing costs AUTO's small calls a line each)"
              % (sum(x >= 0.95 for x in on_best), len(on_best)))


if __name__ == "__main__":
    main()
