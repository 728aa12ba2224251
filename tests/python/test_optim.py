"""Optimizer-state and gradient offload (fastensor.torch.OffloadedOptimizer): updates bitwise
those of the plain optimizer (Adam, AdamW, SGD with momentum, RMSprop; states in the file or
the host tier; gradients offloaded or not; fp32 master weights for bf16 parameters), and an
exception inside step() leaving parameters and states consistent."""
import gc
import os
import subprocess
import sys

import pytest
import torch

import fastensor.torch as ft

CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])

OPTIMIZERS = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1, amsgrad=True),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-3, momentum=0.5),
}


def model(device="cpu", dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 384),
        torch.nn.LayerNorm(384), torch.nn.Linear(384, 10)).to(device, dtype)


def batch(step, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(32, 256, generator=g).to(device, dtype)


def backward(m, x):
    m(x).float().square().mean().backward()


def train(runs, steps, batch_of=batch):
    """Each (model, optimizer) of ``runs`` takes the same steps on the same batches."""
    for step in steps:
        for m, o in runs:
            o.zero_grad()
            backward(m, batch_of(step))
            o.step()


def wrap(opt, tmp, **kw):
    kw.setdefault("chunk_bytes", 300_000)  # several chunks, one parameter split from its bias
    kw.setdefault("min_bytes", 4096)
    kw.setdefault("host_cache_bytes", 0)  # the states go to the file
    return ft.OffloadedOptimizer(opt, tmp, **kw)


def same_params(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def same_state(sa, sb):
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    for i, da in sa["state"].items():
        db = sb["state"][i]
        assert da.keys() == db.keys(), i
        for k, va in da.items():
            vb = db[k]
            if isinstance(va, torch.Tensor):
                assert torch.equal(va.cpu(), vb.cpu()), (i, k)
            else:
                assert va == vb, (i, k)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grads", ["kept", "offloaded"])
@pytest.mark.parametrize("tier", ["file", "host"])
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_bitwise(tmp, kind, tier, grads, device):
    a, b = model(device), model(device)
    oa = OPTIMIZERS[kind](a.parameters())
    ob = wrap(OPTIMIZERS[kind](b.parameters()), tmp, offload_grads=grads == "offloaded",
              host_cache_bytes=0 if tier == "file" else 64 << 20)
    for step in range(3):
        x = batch(step, device)
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            backward(m, x)
            o.step()
        assert same_params(a, b), step
        if grads == "offloaded":
            # the large ones left the GPU in backward; step() consumed them
            assert all(p.grad is None for p in b.parameters() if p.nbytes >= 4096)
    ob.flush()
    s = ob.stats()
    assert s["steps"] == 3 and s["chunks"] >= 6 and s["state_bytes"] > 0
    large = sum(1 for p in b.parameters() if p.nbytes >= 4096)
    assert s["grads_offloaded"] == (3 * large if grads == "offloaded" else 0)
    if tier == "host":
        assert s["host_bytes"] >= s["state_bytes"]
    same_state(oa.state_dict(), ob.state_dict())
    # between steps the large states are not in the optimizer's memory
    assert not ob._inner.state
    ob.close()


def test_gradient_accumulation(tmp):
    """Two backward passes per step: the stored gradient gets the second one added."""
    a, b = model(), model()
    oa, ob = OPTIMIZERS["adam"](a.parameters()), wrap(OPTIMIZERS["adam"](b.parameters()), tmp,
                                                      offload_grads=True)
    for step in range(3):
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            backward(m, batch(2 * step))
            backward(m, batch(2 * step + 1))
            o.step()
        assert same_params(a, b), step


def test_master_weights(tmp):
    """bf16 parameters through fp32 masters: the same as Adam on fp32 copies, each parameter
    its master rounded."""
    b = model(dtype=torch.bfloat16)
    ref = model(dtype=torch.bfloat16)
    masters = [p.detach().float().clone() for p in ref.parameters()]
    oref = torch.optim.AdamW(masters, lr=1e-3, weight_decay=0.01)
    ob = wrap(torch.optim.AdamW(b.parameters(), lr=1e-3, weight_decay=0.01), tmp,
              master_weights=True, offload_grads=True)
    for step in range(3):
        x = batch(step, dtype=torch.bfloat16)
        oref.zero_grad()
        ref.zero_grad(set_to_none=True)
        backward(ref, x)
        for m, p in zip(masters, ref.parameters()):
            m.grad = p.grad.float()
        oref.step()
        with torch.no_grad():
            for m, p in zip(masters, ref.parameters()):
                p.copy_(m)
        ob.zero_grad()
        backward(b, x)
        ob.step()
        assert same_params(ref, b), step
    sd = ob.state_dict()
    for i, m in enumerate(masters):
        st = sd["state"][i]
        assert st["master"].dtype == torch.float32 and torch.equal(st["master"], m)
        assert st["exp_avg"].dtype == torch.float32
        assert torch.equal(st["exp_avg"], oref.state[m]["exp_avg"])


class Injected(RuntimeError):
    pass


def fail_after_update(inner):
    """Make ``inner.step`` count its calls and raise Injected, after updating its chunk in
    place, on the call numbered ``calls["fail"]``. Returns ``calls``."""
    real, calls = inner.step, {"n": 0, "fail": None}

    def flaky(*args, **kw):
        calls["n"] += 1
        out = real(*args, **kw)
        if calls["n"] == calls["fail"]:
            raise Injected("injected after the update")
        return out
    inner.step = flaky
    return calls


def test_exception_in_step_resumes(tmp):
    """A failure inside the second chunk's update, after the optimizer changed its parameters
    in place: that chunk is put back, the first stays updated; the next step() finishes the
    step and the result is the uninterrupted one's."""
    a, b = model(), model()
    oa = torch.optim.Adam(a.parameters(), lr=1e-3, foreach=False)
    inner = torch.optim.Adam(b.parameters(), lr=1e-3, foreach=False)
    ob = wrap(inner, tmp, offload_grads=True)
    calls = fail_after_update(inner)
    for step in range(3):
        x = batch(step)
        oa.zero_grad()
        backward(a, x)
        oa.step()
        ob.zero_grad()
        backward(b, x)
        if step == 1:
            before = [p.detach().clone() for p in b.parameters()]
            calls["fail"] = calls["n"] + 2
            with pytest.raises(Injected):
                ob.step()
            changed = [not torch.equal(p, q) for p, q in zip(before, b.parameters())]
            assert any(changed) and not all(changed)  # the first chunk only
        ob.step()
        assert same_params(a, b), step
    same_state(oa.state_dict(), ob.state_dict())
    assert ob.stats()["failed_steps"] == 1


def test_out_of_memory_halves_chunks(tmp):
    b = model()
    inner = torch.optim.SGD(b.parameters(), lr=1e-2, momentum=0.9)
    ob = wrap(inner, tmp)
    real = inner.step

    def oom(*args, **kw):
        inner.step = real
        raise torch.OutOfMemoryError("injected")
    inner.step = oom
    backward(b, batch(0))
    chunk = ob.chunk_bytes
    with pytest.raises(torch.OutOfMemoryError):
        ob.step()
    assert ob.chunk_bytes == chunk // 2
    ob.step()  # the whole step, since the failure came before any update


def test_zero_grad_abandons_failed_step(tmp):
    b = model()
    inner = torch.optim.SGD(b.parameters(), lr=1e-2, momentum=0.9)
    ob = wrap(inner, tmp, offload_grads=True)
    backward(b, batch(0))
    real = inner.step
    inner.step = lambda *a, **k: (_ for _ in ()).throw(Injected("x"))
    with pytest.raises(Injected):
        ob.step()
    inner.step = real
    assert ob.stats()["state_bytes"] > 0  # the gradients, still stored
    ob.zero_grad()
    assert ob.stats()["state_bytes"] == 0
    before = [p.detach().clone() for p in b.parameters()]
    ob.step()  # nothing has a gradient: nothing changes
    assert all(torch.equal(p, q) for p, q in zip(before, b.parameters()))


def test_store_full_leaves_parameters(tmp):
    """A store without room for the states: step() raises OSError and no parameter changed."""
    b = model()
    ob = wrap(torch.optim.Adam(b.parameters(), lr=1e-3), tmp, capacity=4096)
    backward(b, batch(0))
    before = [p.detach().clone() for p in b.parameters()]
    with pytest.raises(OSError):
        ob.step()
    assert all(torch.equal(p, q) for p, q in zip(before, b.parameters()))
    assert ob.stats()["state_bytes"] == 0


@pytest.mark.parametrize("direction", ["plain-to-offloaded", "offloaded-to-plain"])
def test_state_dict_interchange(tmp, direction):
    """A state dict saved (torch.save) from one kind loads into the other, and training
    goes on bitwise as the plain optimizer's."""
    a, b = model(), model()
    oa = OPTIMIZERS["adamw"](a.parameters())
    ob = wrap(OPTIMIZERS["adamw"](b.parameters()), tmp)
    train(((a, oa), (b, ob)), range(2))
    path = os.path.join(tmp, "optim.pt")
    torch.save((oa if direction == "plain-to-offloaded" else ob).state_dict(), path)
    c = model()
    c.load_state_dict(a.state_dict())
    if direction == "plain-to-offloaded":
        oc = wrap(OPTIMIZERS["adamw"](c.parameters()), tmp)
    else:
        oc = OPTIMIZERS["adamw"](c.parameters())
    oc.load_state_dict(torch.load(path))
    train(((a, oa), (c, oc)), range(2, 4))
    assert same_params(a, c)
    same_state(oa.state_dict(), oc.state_dict())


def test_schedulers_and_groups(tmp):
    """Two parameter groups with their own learning rates, a scheduler changing them, a
    group added later: as the plain optimizer."""
    def make(m):
        return torch.optim.Adam([{"params": m[0].parameters(), "lr": 1e-3},
                                 {"params": m[2].parameters(), "lr": 3e-3}], lr=1e-3)
    a, b = model(), model()
    oa, ob = make(a), wrap(make(b), tmp)
    sa = torch.optim.lr_scheduler.StepLR(oa, step_size=1, gamma=0.5)
    sb = torch.optim.lr_scheduler.StepLR(ob, step_size=1, gamma=0.5)
    for step in range(4):
        if step == 2:
            oa.add_param_group({"params": a[3].parameters(), "lr": 2e-3})
            ob.add_param_group({"params": b[3].parameters(), "lr": 2e-3})
        for m, o, s in ((a, oa, sa), (b, ob, sb)):
            o.zero_grad()
            backward(m, batch(step))
            o.step()
            s.step()
        assert same_params(a, b), step
    assert [g["lr"] for g in oa.param_groups] == [g["lr"] for g in ob.param_groups]


def test_state_view_and_dcp_state_dict(tmp):
    """``state`` reads the states back; torch.distributed.checkpoint's optimizer state dict
    functions see a stateful optimizer (no dummy step) and round-trip it."""
    from torch.distributed.checkpoint.state_dict import (get_optimizer_state_dict,
                                                         set_optimizer_state_dict)
    a, b = model(), model()
    oa, ob = OPTIMIZERS["adam"](a.parameters()), wrap(OPTIMIZERS["adam"](b.parameters()), tmp)
    train(((a, oa), (b, ob)), range(2))
    p = b[0].weight
    assert len(ob.state) == len(list(b.parameters()))
    assert torch.equal(ob.state[p]["exp_avg"], oa.state[a[0].weight]["exp_avg"])
    osd = get_optimizer_state_dict(b, ob)
    ref = get_optimizer_state_dict(a, oa)
    assert osd["state"].keys() == ref["state"].keys()
    for k in ref["state"]:
        assert torch.equal(osd["state"][k]["exp_avg_sq"], ref["state"][k]["exp_avg_sq"])
    c = model()
    c.load_state_dict(b.state_dict())
    oc = wrap(OPTIMIZERS["adam"](c.parameters()), tmp)
    set_optimizer_state_dict(c, oc, osd)
    train(((a, oa), (c, oc)), [5])
    assert same_params(a, c)


def test_entries_go_with_the_optimizer(tmp):
    b = model()
    ob = wrap(OPTIMIZERS["adam"](b.parameters()), tmp, offload_grads=True)
    store = ob._shared.store
    entries = store.stats()["entries"]
    backward(b, batch(0))
    ob.step()
    assert store.stats()["entries"] > entries
    del ob
    gc.collect()
    assert store.stats()["entries"] == entries
    backward(b, batch(1))  # the hooks of a collected optimizer do nothing
    assert all(p.grad is not None for p in b.parameters())


def test_rejects():
    with pytest.raises(TypeError):
        ft.OffloadedOptimizer(object())
    m = model()
    with pytest.raises(TypeError):
        ft.OffloadedOptimizer(torch.optim.LBFGS(m.parameters()))
    with pytest.raises(ValueError):
        ft.OffloadedOptimizer(torch.optim.SGD(m.parameters(), lr=1), chunk_bytes=0)


def test_wrap_mid_training(tmp):
    """Wrapping an optimizer that has states already moves them to the store."""
    a, b = model(), model()
    oa, ob = OPTIMIZERS["adamw"](a.parameters()), OPTIMIZERS["adamw"](b.parameters())
    for step in range(4):
        if step == 2:
            ob = wrap(ob, tmp, offload_grads=True)
            assert not ob._inner.state and ob.stats()["state_bytes"] > 0
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            backward(m, batch(step))
            o.step()
    assert same_params(a, b)
    same_state(oa.state_dict(), ob.state_dict())


@pytest.mark.parametrize("how", ["close", "collect"])
def test_end_while_puts_read_host_memory(tmp, how):
    """Closing (or dropping) the optimizer right after a step whose puts still read host
    memory: the puts finish reading before the memory goes (this crashed once)."""
    for _ in range(4):
        big = torch.nn.Linear(2048, 2048)
        opt = wrap(torch.optim.Adam(big.parameters(), lr=1e-3), tmp, chunk_bytes=1 << 30,
                   engine="direct")
        big(torch.randn(4, 2048)).sum().backward()
        opt.step()
        if how == "close":
            opt.close()
        else:
            del opt
            gc.collect()


def test_gradients_reduced_over_a_process_group(tmp):
    """2 ranks (torchrun, gloo): gradients averaged in the hooks before they leave, as a
    hand-reduced Adam's (tests/python/optim_worker.py)."""
    if not torch.distributed.is_available():
        pytest.skip("this torch was built without torch.distributed")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [os.path.join(os.path.dirname(os.path.dirname(here)), "python"),
         os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           os.path.join(here, "optim_worker.py"), tmp]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "OK rank 0" in r.stdout and "OK rank 1" in r.stdout


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
@pytest.mark.parametrize("max_norm", [0.05, 1e6])
def test_clip_grad_norm(tmp, device, norm_type, max_norm):
    """clip_grad_norm_ with offloaded gradients: the total norm and the updates bitwise
    torch.nn.utils.clip_grad_norm_'s on gradients in .grad (clipping, and not)."""
    a, b = model(device), model(device)
    oa = OPTIMIZERS["adamw"](a.parameters())
    ob = wrap(OPTIMIZERS["adamw"](b.parameters()), tmp, offload_grads=True)
    for step in range(3):
        x = batch(step, device)
        norms = []
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            backward(m, x)
            for _ in range(2 if step == 1 else 1):  # twice: the second sees the first's scale
                n = (torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm, norm_type)
                     if o is oa else ob.clip_grad_norm_(max_norm, norm_type))
            norms.append(n)
            o.step()
        na, nb = norms
        assert torch.equal(na, nb), (step, na, nb)
        assert same_params(a, b), step


@pytest.mark.parametrize("device,budget", [(d, b) for d in DEVICES for b in ("auto", 1 << 20)
                                           if d == "cuda" or b != "auto"])
def test_states_kept_on_the_gpu(tmp, device, budget):
    """gpu_budget_bytes: states kept on the GPU (host parameters: in memory) between steps
    within the budget, the rest stored; bitwise the plain optimizer's, and a failure inside
    step() leaves the kept ones as they were."""
    a, b = model(device), model(device)
    oa = torch.optim.Adam(a.parameters(), lr=1e-3, foreach=False)
    inner = torch.optim.Adam(b.parameters(), lr=1e-3, foreach=False)
    ob = wrap(inner, tmp, offload_grads=True, gpu_budget_bytes=budget)
    calls = fail_after_update(inner)
    for step in range(4):
        x = batch(step, device)
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            backward(m, x)
            if o is ob and step == 2:
                calls["fail"] = calls["n"] + 2
                with pytest.raises(Injected):
                    ob.step()
            o.step()
        assert same_params(a, b), step
        if step >= 1:
            kept = ob.stats()["gpu_state_bytes"]
            assert kept > 0 and (budget == "auto" or kept <= budget)
    same_state(oa.state_dict(), ob.state_dict())


def test_gpu_budget_rejects():
    m = model()
    with pytest.raises(ValueError):
        ft.OffloadedOptimizer(torch.optim.SGD(m.parameters(), lr=1), gpu_budget_bytes=-1)
    with pytest.raises(ValueError):
        ft.OffloadedOptimizer(torch.optim.SGD(m.parameters(), lr=1), gpu_budget_bytes="all")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_checkpoint_of_the_states(tmp):
    """The wrapped optimizer's states through a DCP checkpoint written by FastensorWriter
    (one process), loaded into a new wrapped optimizer: training goes on bitwise."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_optimizer_state_dict,
                                                         set_optimizer_state_dict)
    from fastensor.dcp import FastensorReader, FastensorWriter
    a, b = model(), model()
    oa = OPTIMIZERS["adamw"](a.parameters())
    ob = wrap(OPTIMIZERS["adamw"](b.parameters()), tmp, offload_grads=True)
    train(((a, oa), (b, ob)), range(2))
    ck = os.path.join(tmp, "ckpt")
    dcp.save({"model": b.state_dict(), "optim": get_optimizer_state_dict(b, ob)},
             storage_writer=FastensorWriter(ck))
    c = model()
    oc = wrap(OPTIMIZERS["adamw"](c.parameters()), tmp, offload_grads=True)
    state = {"model": c.state_dict(), "optim": get_optimizer_state_dict(c, oc)}
    dcp.load(state, storage_reader=FastensorReader(ck))
    c.load_state_dict(state["model"])
    set_optimizer_state_dict(c, oc, state["optim"])
    train(((a, oa), (c, oc)), range(2, 4))
    assert same_params(a, c)
    same_state(oa.state_dict(), oc.state_dict())


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_kept_on_the_gpu(tmp, device):
    """With room in gpu_budget_bytes beyond the states, offloaded gradients stay on the GPU
    (host parameters: in memory) through backward; accumulation, clipping and a failure
    inside step() give the plain optimizer's results bitwise."""
    a, b = model(device), model(device)
    oa = torch.optim.AdamW(a.parameters(), lr=1e-3, foreach=False)
    inner = torch.optim.AdamW(b.parameters(), lr=1e-3, foreach=False)
    ob = wrap(inner, tmp, offload_grads=True, gpu_budget_bytes=64 << 20)
    calls = fail_after_update(inner)
    for step in range(4):
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            backward(m, batch(2 * step, device))
            backward(m, batch(2 * step + 1, device))
            if o is ob:
                if step >= 1:
                    assert ob.stats()["gpu_grad_bytes"] > 0
                ob.clip_grad_norm_(0.05)
                if step == 2:
                    calls["fail"] = calls["n"] + 2
                    with pytest.raises(Injected):
                        ob.step()
            else:
                torch.nn.utils.clip_grad_norm_(a.parameters(), 0.05)
            o.step()
        assert same_params(a, b), step
    same_state(oa.state_dict(), ob.state_dict())
