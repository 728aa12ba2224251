"""One rank of the DCP tests (tests/python/test_dcp.py), run under torchrun with gloo.

    dcp_worker.py ACTION OUT [options]

save:  train a small FSDP2 transformer one step (seeded), save model and optimizer state
       with FastensorWriter (--path) and, with --default-path, DCP's FileSystemWriter too;
       rank 0 writes the full tensors to OUT (torch.save) as the expected values.
load:  build the model with other values, sharded over this world (FSDP2, or --columns:
       DTensors sharded on dimension 1), load with FastensorReader (--path) or DCP's
       FileSystemReader (--default), write the full tensors (rank 0) to OUT.
--async-save: save with dcp.async_save (the blocking time printed).
--compression MODE: FastensorWriter's (.fst data files).
--kill-rank R --kill-at data|commit: rank R dies in the middle of writing its data file,
       or (R = 0) just before the commit's rename.
coded: plain tensors, the same on every rank (DCP writes each from one rank: a rank writes
       some of its coded streams), saved twice with dcp.async_save and compression "always",
       staged as coded streams (the GPU test stood in for by the host encoder: no GPU here);
       rank 0 writes the last save's tensors to OUT and prints how each save was staged.
"""
import argparse
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import fastensor.dcp as fdcp


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Transformer(d_model=64, nhead=4, num_encoder_layers=2,
                                num_decoder_layers=1, dim_feedforward=96, batch_first=True)


def train_step(m, opt, seed):
    g = torch.Generator().manual_seed(seed)
    out = m(torch.randn(2, 5, 64, generator=g), torch.randn(2, 3, 64, generator=g))
    out.square().mean().backward()
    opt.step()
    opt.zero_grad()


def full(obj, prefix=""):
    """{flattened name: full tensor} of a (nested) state dict."""
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(full(v, f"{prefix}{k}."))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(full(v, f"{prefix}{i}."))
    elif isinstance(obj, DTensor):
        out[prefix[:-1]] = obj.full_tensor().clone()
    elif isinstance(obj, torch.Tensor):
        out[prefix[:-1]] = obj.clone()
    else:
        out[prefix[:-1]] = obj
    return out


def sharded(seed, mesh):
    m = model(seed)
    for layer in m.encoder.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    train_step(m, opt, seed)
    return m, opt


def install_kill(rank, kill_rank, kill_at):
    if rank != kill_rank:
        return
    if kill_at == "data":
        real = fdcp._ckpt.save

        def dying_save(path, entries, *args, **kwargs):
            # die while the library writes this rank's file (its temporary is there)
            t = threading.Thread(target=real, args=(path, entries) + args, kwargs=kwargs,
                                 daemon=True)
            t.start()
            time.sleep(0.002)
            os._exit(9)
        fdcp._ckpt.save = dying_save
    else:
        real_write = fdcp._write_durable

        def dying_write(path, chunks, sync):
            if path.endswith(fdcp.METADATA):
                with open(path + ".fastensor-tmp-999999-0", "wb") as f:
                    f.write(b"half")
                os._exit(9)
            return real_write(path, chunks, sync)
        fdcp._write_durable = dying_write


def coded_saves(a, rank):
    fdcp._codes_on_gpu = lambda tensors, compression: compression not in (None, "none")
    staged, real = [], fdcp.FastensorWriter._stage_coded

    def stage_coded(self, state_dict, sig):
        lent = real(self, state_dict, sig)
        staged.append(lent.where if lent else "copy")
        return lent
    fdcp.FastensorWriter._stage_coded = stage_coded
    g = torch.Generator().manual_seed(a.seed)
    state = {"w": (torch.randn(300, 257, generator=g) * 0.02).to(torch.bfloat16),
             "v": torch.randn(1000, generator=g), "i": torch.arange(7), "step": 4,
             "n": {"x": (torch.randn(64, 33, generator=g) * 0.1).half()}}
    sig = fdcp._signature(state)
    # (the memory an earlier save's background coding leaves; here made empty)
    fdcp._STAGING.give(("fst", sig), fdcp._fst.code(".", [], "always")[0])
    for step in range(2):
        state["step"] = step
        state["v"].add_(1)
        fut = dcp.async_save(state, storage_writer=fdcp.FastensorWriter(
            a.path, compression="always"))
        want = full(state)
        state["v"].add_(100)  # after staging: not in this save
        fut.result()
        state["v"].sub_(100)
    if rank == 0:
        torch.save(want, a.out)
    print(f"rank {rank}: staged {','.join(staged)}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["save", "load", "coded"])
    p.add_argument("out")
    p.add_argument("--path")
    p.add_argument("--default-path")
    p.add_argument("--default", action="store_true")
    p.add_argument("--columns", action="store_true")
    p.add_argument("--async-save", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-at", default="data")
    p.add_argument("--compression", default=None)
    a = p.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    if a.action == "coded":
        coded_saves(a, rank)
    elif a.action == "save":
        m, opt = sharded(a.seed, mesh)
        msd, osd = get_state_dict(m, opt)
        state = {"model": msd, "optim": osd, "step": 3 + a.seed}
        install_kill(rank, a.kill_rank, a.kill_at)
        if a.async_save:
            t0 = time.perf_counter()
            fut = dcp.async_save(state, storage_writer=fdcp.FastensorWriter(a.path))
            blocked = time.perf_counter() - t0
            fut.result()
            print(f"rank {rank}: async_save blocked {blocked * 1e3:.1f} ms", flush=True)
        else:
            dcp.save(state, storage_writer=fdcp.FastensorWriter(a.path,
                                                                compression=a.compression))
        if a.default_path:
            dcp.save(state, storage_writer=dcp.FileSystemWriter(a.default_path))
        expected = full(state)
        if rank == 0:
            torch.save(expected, a.out)
    else:
        if a.columns:  # DTensors sharded on dimension 1 (ranged, non-contiguous reads)
            plain = model(a.seed + 100)
            msd = {k: distribute_tensor(v.detach(), mesh,
                                        [Shard(1)] if v.dim() == 2 else [Replicate()])
                   for k, v in plain.state_dict().items()}
            state = {"model": msd, "step": -1}
            reader = dcp.FileSystemReader(a.path) if a.default else \
                fdcp.FastensorReader(a.path)
            dcp.load(state, storage_reader=reader)
        else:
            m, opt = sharded(a.seed + 100, mesh)
            msd, osd = get_state_dict(m, opt)
            state = {"model": msd, "optim": osd, "step": -1}
            reader = dcp.FileSystemReader(a.path) if a.default else \
                fdcp.FastensorReader(a.path)
            dcp.load(state, storage_reader=reader)
            set_state_dict(m, opt, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
            msd, osd = get_state_dict(m, opt)
            state = {"model": msd, "optim": osd, "step": state["step"]}
        got = full(state)
        if rank == 0:
            torch.save(got, a.out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # torch 2.13's gloo ranks abort now and then at interpreter exit ("terminate called
    # without an active exception", a C++ thread destroyed while joinable; DCP's default
    # writer alone does it too): the results are on disk, so skip the exit-time teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
