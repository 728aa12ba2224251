"""One rank of test_optim's process-group case, under torchrun with gloo:

    optim_worker.py SPILL_DIR

Each rank trains the same model on its own batches for 3 steps, once with Adam and its
gradients averaged by hand (all_reduce, then a division), once with OffloadedOptimizer
(offload_grads, process_group): parameters bitwise equal, and equal on every rank. Prints
"OK rank R" on success.

The worker leaves with os._exit once the process group is destroyed: torch 2.13's CPU build
sometimes aborts in interpreter teardown ("terminate called without an active exception",
after every rank printed OK and destroy_process_group returned) once collectives ran inside
post-accumulate-grad hooks. That abort needs no fastensor: plain Adam with all_reduce in
such hooks showed it in 3 of 36 runs here, the same loop without hooks in 0 of 32.
"""
import os
import sys

import torch
import torch.distributed as dist

import fastensor.torch as ft


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                               torch.nn.Linear(512, 10))


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    a, b = model(), model()
    oa = torch.optim.Adam(a.parameters(), lr=1e-3)
    ob = ft.OffloadedOptimizer(torch.optim.Adam(b.parameters(), lr=1e-3), sys.argv[1],
                               offload_grads=True, process_group=dist.group.WORLD,
                               min_bytes=4096, host_cache_bytes=0)
    for step in range(3):
        x = torch.randn(16, 256, generator=torch.Generator().manual_seed(100 * rank + step))
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            m(x).square().mean().backward()
            if o is oa:
                for p in a.parameters():
                    dist.all_reduce(p.grad)
                    p.grad.div_(world)
            o.step()
    same = all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    flat = torch.cat([p.detach().reshape(-1) for p in b.parameters()])
    first = flat.clone()
    dist.broadcast(first, 0)
    if not same or not torch.equal(first, flat):
        raise SystemExit(f"rank {rank}: equal to the hand-reduced run {same}, "
                         f"to rank 0 {torch.equal(first, flat)}")
    print(f"OK rank {rank}", flush=True)
    ob.close()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # see the module's docstring: torch's teardown, not the test's subject


if __name__ == "__main__":
    main()
