#!/usr/bin/env python3
"""Where a workflow's time goes: fastensor's saves and loads beside the disk's raw rate,
with settings varied one at a time, each run in a fresh process with a fresh profile.

    PYTHONPATH=python python bench/breakdown.py --size 2G --dir /nvme/tmp [--json out.json]

Sections (each prints a table of seconds and GB/s, median of --rounds):
  save   durable saves of host tensors: AUTO, each fixed engine, FASTENSOR_THREADS variants,
         against the raw O_DIRECT write rate (a new file, 16 MiB writes, one at a time, then fsync);
  cold   first loads after a page-cache drop (host memory): AUTO, cache=bypass, fixed
         engines, thread variants, against the raw O_DIRECT read rate;
  repeat loads of a cached checkpoint in a fresh process: the load call, then the first
         touch of every page, timed apart, for fastensor and safetensors; with --profile a
         cProfile listing of each (its 15 costliest calls);
and the AUTO trace of the default save and cold load summarised (calls per arm).
This is a diagnostic: bench/scenarios.py is the yardstick.
"""
import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scenarios  # noqa: E402  (the state dict, the raw ceiling, drop_caches, touch)


def worker(spec):
    import torch
    op, path = spec["op"], spec["path"]
    if op == "raw":
        n, secs = scenarios.raw_io(path, spec["size"], spec["write"])
        return {"seconds": secs, "bytes": n}
    if op == "save":
        sd = scenarios.state_dict(spec["size"])
        if spec["device"] != "cpu":
            sd = {k: v.to(spec["device"]) for k, v in sd.items()}
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        import fastensor.torch as ftt
        ftt.save_file(sd, path, cache=spec.get("cache", "auto"))
        return {"seconds": time.perf_counter() - t0, "bytes": scenarios.nbytes(sd)}
    prof = None
    if spec.get("profile"):
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    dev = spec["device"]
    if dev != "cpu":
        torch.zeros(1, device=dev)  # the context, outside the timing
    t0 = time.perf_counter()
    if spec["tool"] == "safetensors":
        import safetensors.torch as st
        out = st.load_file(path, device=dev)
    else:
        import fastensor.torch as ftt
        out = ftt.load_file(path, device=dev, cache=spec.get("cache", "auto"))
    if dev != "cpu":
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    if dev == "cpu":
        scenarios.touch(out)
    t2 = time.perf_counter()
    res = {"seconds": t2 - t0, "load": t1 - t0, "touch": t2 - t1,
           "bytes": scenarios.nbytes(out)}
    if prof:
        import io
        import pstats
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(15)
        res["profile"] = s.getvalue()
    return res


DEVICE = "cpu"


def run(spec, env_extra):
    env = dict(os.environ)
    env.update(env_extra)
    env["PYTHONPATH"] = os.path.join(os.path.dirname(HERE), "python") + os.pathsep + \
        env.get("PYTHONPATH", "")
    env["FASTENSOR_QUIET"] = "1"
    spec = dict(spec, device=DEVICE)
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
                       capture_output=True, text=True, env=env)
    if p.returncode:
        raise RuntimeError(p.stderr[-800:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def arms_of(trace):
    """Calls and bytes per (direction, arm) in a FASTENSOR_TRACE file."""
    c = collections.Counter()
    b = collections.Counter()
    try:
        for line in open(trace):
            f = line.split()
            kv = dict(x.split("=", 1) for x in f if "=" in x)
            k = f"{f[0]} cls={kv.get('cls')} {kv.get('arm')}"
            c[k] += 1
            b[k] += max(0, int(kv.get("bytes", 0)))
    except OSError:
        return {}
    return {k: f"{c[k]} calls, {b[k] / 2**20:.0f} MiB" for k in sorted(c)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--size", default="1G")
    ap.add_argument("--dir")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]: where tensors live")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sections", default="save,cold,repeat")
    ap.add_argument("--threads", default="4,8", help="FASTENSOR_THREADS variants")
    ap.add_argument("--engines", default="direct,uring,posix")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(json.loads(a.worker))))
        return
    global DEVICE
    DEVICE = a.device
    size = scenarios.parse_size(a.size)
    work = tempfile.mkdtemp(prefix="ft-breakdown-", dir=a.dir)
    path = os.path.join(work, "ckpt.safetensors")
    raw = os.path.join(work, "raw.bin")
    fresh = lambda tag: os.path.join(work, f"profile-{tag}-{time.time_ns()}.txt")  # noqa: E731
    threads = [t for t in a.threads.split(",") if t]
    engines = [e for e in a.engines.split(",") if e]
    sections = a.sections.split(",")
    results = {}

    def cell(name, fn):
        xs = []
        for _ in range(a.rounds):
            r = fn()
            xs.append(r)
        secs = [r["seconds"] for r in xs]
        n = xs[0]["bytes"]
        row = {"median_s": statistics.median(secs), "min_s": min(secs), "max_s": max(secs),
               "gbps": n / statistics.median(secs) / 1e9}
        for extra in ("load", "touch"):
            if extra in xs[0]:
                row[extra + "_s"] = statistics.median(r[extra] for r in xs)
        if "profile" in xs[-1]:
            row["profile"] = xs[-1]["profile"]
        results[name] = row
        more = "".join(f"  {k[:-2]} {row[k]:.3f}" for k in ("load_s", "touch_s") if k in row)
        print(f"{name:34s} {row['median_s']:7.3f} s [{row['min_s']:.3f}-{row['max_s']:.3f}]"
              f"  {row['gbps']:6.2f} GB/s{more}", flush=True)

    if "save" in sections:
        print(f"== save ({size / 2**30:.2f} GiB, {DEVICE} tensors, durable)")
        cell("raw O_DIRECT write 16M", lambda: run({"op": "raw", "path": raw, "size": size,
                                                    "write": True}, {}))
        tr = os.path.join(work, "trace-save.txt")
        cell("fastensor auto", lambda: run({"op": "save", "path": path, "size": size},
                                           {"FASTENSOR_PROFILE": fresh("s")}))
        run({"op": "save", "path": path, "size": size},
            {"FASTENSOR_PROFILE": fresh("s"), "FASTENSOR_TRACE": tr})
        results["save trace"] = arms_of(tr)
        for e in engines:
            cell(f"fastensor engine={e}", lambda e=e: run(
                {"op": "save", "path": path, "size": size},
                {"FASTENSOR_PROFILE": fresh("s"), "FASTENSOR_ENGINE": e}))
        for t in threads:
            cell(f"fastensor auto threads={t}", lambda t=t: run(
                {"op": "save", "path": path, "size": size},
                {"FASTENSOR_PROFILE": fresh("s"), "FASTENSOR_THREADS": t}))
        cell("fastensor cache=keep", lambda: run(
            {"op": "save", "path": path, "size": size, "cache": "keep"},
            {"FASTENSOR_PROFILE": fresh("s")}))
    if not os.path.exists(path):
        run({"op": "save", "path": path, "size": size}, {"FASTENSOR_PROFILE": fresh("s")})
    if not os.path.exists(raw):
        run({"op": "raw", "path": raw, "size": size, "write": True}, {})

    def cold(spec, env):
        if not scenarios.drop_caches():
            raise SystemExit("cold loads need root (drop_caches)")
        return run(spec, env)

    if "cold" in sections:
        print(f"== cold loads ({DEVICE} memory)")
        cell("raw O_DIRECT read 16M", lambda: cold({"op": "raw", "path": raw, "size": size,
                                                   "write": False}, {}))
        load = {"op": "load", "tool": "fastensor", "path": path}
        cell("fastensor auto", lambda: cold(load, {"FASTENSOR_PROFILE": fresh("c")}))
        tr = os.path.join(work, "trace-cold.txt")
        cold(load, {"FASTENSOR_PROFILE": fresh("c"), "FASTENSOR_TRACE": tr})
        results["cold trace"] = arms_of(tr)
        cell("fastensor cache=bypass", lambda: cold(dict(load, cache="bypass"),
                                                   {"FASTENSOR_PROFILE": fresh("c")}))
        for e in engines:
            cell(f"fastensor engine={e}", lambda e=e: cold(
                load, {"FASTENSOR_PROFILE": fresh("c"), "FASTENSOR_ENGINE": e}))
        for t in threads:
            cell(f"fastensor auto threads={t}", lambda t=t: cold(
                load, {"FASTENSOR_PROFILE": fresh("c"), "FASTENSOR_THREADS": t}))
        cell("safetensors", lambda: cold({"op": "load", "tool": "safetensors", "path": path},
                                         {}))
    if "repeat" in sections:
        print(f"== repeat loads (cached, {DEVICE} memory, fresh process)")
        scenarios.drop_caches()
        run({"op": "load", "tool": "fastensor", "path": path}, {"FASTENSOR_PROFILE": fresh("r")})
        for tool in ("fastensor", "safetensors"):
            cell(f"{tool}", lambda tool=tool: run(
                {"op": "load", "tool": tool, "path": path, "profile": a.profile},
                {"FASTENSOR_PROFILE": fresh("r")}))
        for t in threads:
            cell(f"fastensor threads={t}", lambda t=t: run(
                {"op": "load", "tool": "fastensor", "path": path},
                {"FASTENSOR_PROFILE": fresh("r"), "FASTENSOR_THREADS": t}))
        if a.profile:
            for tool in ("fastensor", "safetensors"):
                print(f"-- cProfile of the {tool} repeat load\n{results[tool]['profile']}")
    for k in ("save trace", "cold trace"):
        if results.get(k):
            print(f"-- {k}: " + "; ".join(f"{a_}: {v}" for a_, v in results[k].items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"size": size, "rounds": a.rounds, "results": results}, f, indent=1)
    subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
