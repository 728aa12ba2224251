"""Parameters streamed block by block (fastensor.torch.stream_parameters): training bitwise
that of the unstreamed model and optimizer, parameters in memory only while their block runs,
state_dict / load_state_dict through the store, failures and refusals."""
import pytest
import torch

import fastensor.torch as ft
from test_optim import Injected, backward, fail_after_update
from test_optim import train as optim_train

CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


class Net(torch.nn.Module):
    """A stem, 4 residual blocks in a ModuleList (what is streamed), a head."""

    def __init__(self, device="cpu", dtype=torch.float32, width=256):
        super().__init__()
        torch.manual_seed(0)
        self.stem = torch.nn.Linear(64, width)
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                                torch.nn.Linear(2 * width, width), torch.nn.LayerNorm(width))
            for _ in range(4))
        self.head = torch.nn.Linear(width, 8)
        self.to(device, dtype)

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


def batch(step, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(32, 64, generator=g).to(device, dtype)


def train(runs, steps):
    """test_optim's, on this file's batches."""
    optim_train(runs, steps, batch_of=batch)


def offloaded(opt, tmp, **kw):
    kw.setdefault("chunk_bytes", 400_000)  # several chunks
    kw.setdefault("min_bytes", 4096)
    kw.setdefault("host_cache_bytes", 0)
    return ft.OffloadedOptimizer(opt, tmp, **kw)


def same_params(a, b):
    """(A streamed model's state_dict holds host copies: compared on the host.)"""
    return all(torch.equal(p.cpu(), q.cpu()) for p, q in zip(a.state_dict().values(),
                                                             b.state_dict().values()))


def block_bytes(net):
    return sum(p.numel() * p.element_size() for p in net.layers[0].parameters())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("setup", ["adam-file", "sgd-host-grads", "adamw-bf16-master"])
def test_bitwise(tmp, setup, device):
    """3 steps streamed against the plain optimizer on the same model: every parameter and
    state bitwise equal after each step, nothing of the blocks left in memory between
    steps, the parameters back in place after close()."""
    kind, *rest = setup.split("-")
    dtype = torch.bfloat16 if "bf16" in rest else torch.float32
    make = {"adam": lambda ps: torch.optim.Adam(ps, lr=1e-3),
            "sgd": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9),
            "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1)}[kind]
    a, b = Net(device, dtype), Net(device, dtype)
    if "master" in rest:
        oa = offloaded(make(a.parameters()), tmp, master_weights=True)
    else:
        oa = make(a.parameters())
    ob = offloaded(make(b.parameters()), tmp, offload_grads="grads" in rest,
                   master_weights="master" in rest,
                   host_cache_bytes=64 << 20 if "host" in rest else 0)
    st = ft.stream_parameters(b, ob)
    assert st.stats()["blocks"] == 4 and st.stats()["resident_bytes"] == 0
    for step in range(3):
        x = batch(step, device, dtype)
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            backward(m, x)
            o.step()
        assert st.stats()["resident_bytes"] == 0, step
        assert same_params(a, b), step
        sa, sb = oa.state_dict(), ob.state_dict()
        for i, da in sa["state"].items():
            for k, v in da.items():
                if isinstance(v, torch.Tensor):
                    assert torch.equal(v.cpu(), sb["state"][i][k].cpu()), (step, i, k)
    st.close()
    assert st.stats()["resident_bytes"] == st.stats()["parameter_bytes"]
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert ob.stats()["param_bytes"] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_one_block_ahead_at_most(tmp, device):
    """While a block runs, at most it and the one read ahead are in memory (without
    read-ahead, it alone): in forward all of it; in backward its parameters go as their
    gradients are accumulated."""
    for prefetch, most in ((True, 2), (False, 1)):
        b = Net(device)
        ob = offloaded(torch.optim.SGD(b.parameters(), lr=1e-2), tmp)
        st = ft.stream_parameters(b, ob, prefetch=prefetch)
        seen = {"forward": [], "backward": []}

        def note(kind, st=st):
            return lambda *_args: seen[kind].append(st.stats()["resident_bytes"])
        for layer in b.layers:
            layer[1].register_forward_hook(note("forward"))  # inside: after its first Linear
            layer[1].register_full_backward_hook(note("backward"))
        for step in range(2):
            ob.zero_grad()
            backward(b, batch(step, device))
            ob.step()
        assert len(seen["forward"]) == len(seen["backward"]) == 8
        for kind, got in seen.items():
            assert max(got) <= most * block_bytes(b), (prefetch, kind, got)
        assert min(seen["forward"]) >= block_bytes(b), (prefetch, seen)
        if prefetch:  # the next block arrives while one runs (not the last one)
            assert max(seen["forward"]) > block_bytes(b), seen
        ob.close()


def test_reads_ahead_from_the_file(tmp, monkeypatch):
    """In forward and backward the block after the next one is asked into host memory
    (store prefetches of its parameters' entries: a no-op for entries already there), the
    next one read into device memory; without read-ahead neither; the results stay the
    plain run's."""
    from fastensor import optim
    real = optim._C.store_prefetch
    for prefetch in (True, False):
        a, b = Net(), Net()
        oa = torch.optim.SGD(a.parameters(), lr=1e-2, momentum=0.9)
        ob = offloaded(torch.optim.SGD(b.parameters(), lr=1e-2, momentum=0.9), tmp)
        ft.stream_parameters(b, ob, prefetch=prefetch)
        block_of = {key: i for i, layer in enumerate(b.layers) for p in layer.parameters()
                    for key, _o, _n in ob._records[p].param.keys}
        for step in range(2):
            asked = []
            monkeypatch.setattr(optim._C, "store_prefetch",
                                lambda h, key: asked.append(key) or real(h, key))
            for m, o in ((a, oa), (b, ob)):
                o.zero_grad()
                backward(m, batch(step))
            monkeypatch.setattr(optim._C, "store_prefetch", real)
            oa.step()
            ob.step()
            blocks = list(dict.fromkeys(block_of[k] for k in asked))  # in order, once each
            # forward: blocks 2 and 3 while 0 and 1 run (not in the first, which learns the
            # order); backward: 1 and 0 while 3 and 2 run
            want = [] if not prefetch else [1, 0] if step == 0 else [2, 3, 1, 0]
            assert blocks == want, (prefetch, step, blocks)
            block_of = {key: i for i, layer in enumerate(b.layers) for p in layer.parameters()
                        for key, _o, _n in ob._records[p].param.keys}
        assert same_params(a, b)
        ob.close()


def test_with_activation_offload_and_accumulation(tmp):
    """Streaming beside offload_activations, two backward passes per step (gradients
    accumulated): the plain run's parameters."""
    a, b = Net(), Net()
    oa = torch.optim.Adam(a.parameters(), lr=1e-3)
    ob = offloaded(torch.optim.Adam(b.parameters(), lr=1e-3), tmp, offload_grads=True)
    ft.stream_parameters(b, ob, blocks=list(b.layers)[1:])  # not the first block
    for step in range(3):
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            for micro in range(2):
                x = batch(10 * step + micro)
                if m is b:
                    with ft.offload_activations(tmp, min_bytes=1024, gpu_budget_bytes=0):
                        backward(m, x)
                else:
                    backward(m, x)
            o.step()
        assert same_params(a, b), step
    ob.close()


class CheckpointedNet(Net):
    def __init__(self, reentrant):
        super().__init__()
        self.reentrant = reentrant

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        x = self.stem(x)
        for layer in self.layers:
            x = x + checkpoint(layer, x, use_reentrant=self.reentrant)
        return self.head(x)


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing(tmp, reentrant):
    """Blocks recomputed in backward (torch.utils.checkpoint, both kinds): brought in for
    the recomputation, the plain run's parameters."""
    a, b = CheckpointedNet(reentrant), CheckpointedNet(reentrant)
    oa = torch.optim.Adam(a.parameters(), lr=1e-3)
    ob = offloaded(torch.optim.Adam(b.parameters(), lr=1e-3), tmp, offload_grads=True)
    st = ft.stream_parameters(b, ob)
    for step in range(3):
        x = batch(step).requires_grad_(reentrant)  # reentrant: an input that needs grad
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            backward(m, x)
            o.step()
        assert same_params(a, b), step
        assert st.stats()["resident_bytes"] == 0
    ob.close()


class Encoder(torch.nn.Module):
    """torchvision's ViT encoder block in small: attention (nn.MultiheadAttention, whose
    packed in_proj_weight is read through views) and an MLP, pre-norm, residual."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln_2 = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d, d))

    def forward(self, x):
        y = self.ln_1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


def vit_like():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64),
                               torch.nn.Sequential(*[Encoder() for _ in range(3)]),
                               torch.nn.Linear(64, 4))


@pytest.mark.parametrize("device", DEVICES)
def test_attention_blocks_with_all_offloads(tmp, device):
    """Encoder blocks of a Sequential (found by default) with activations, states and
    gradients offloaded, SGD with momentum as bench/optim.py's ViT: the plain run's
    parameters and momentum, bitwise."""
    a, b = vit_like().to(device), vit_like().to(device)
    oa = torch.optim.SGD(a.parameters(), lr=1e-2, momentum=0.9)
    ob = ft.OffloadedOptimizer(torch.optim.SGD(b.parameters(), lr=1e-2, momentum=0.9), tmp,
                               offload_grads=True, min_bytes=1024)
    st = ft.stream_parameters(b, ob)
    assert st.stats()["blocks"] == 3
    for step in range(3):
        x = torch.randn(8, 10, 16, generator=torch.Generator().manual_seed(step)).to(device)
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            if m is b:
                with ft.offload_activations(tmp, min_bytes=1024, gpu_budget_bytes=0):
                    loss = m(x).square().mean()
            else:
                loss = m(x).square().mean()
            loss.backward()
            o.step()
    moms = ob.state_dict()["state"]
    ob.close()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    for i, p in enumerate(a.parameters()):
        assert torch.equal(oa.state[p]["momentum_buffer"].cpu(),
                           moms[i]["momentum_buffer"].cpu()), i


def test_transformers_llama(tmp):
    """A Hugging Face Llama built from its configuration (its decoder layers found by
    default, called with keyword arguments, returning what they return): 2 AdamW steps
    with gradients offloaded, the plain run's parameters."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)

    def llama():
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(cfg).train()
    a, b = llama(), llama()
    oa = torch.optim.AdamW(a.parameters(), lr=1e-3)
    ob = offloaded(torch.optim.AdamW(b.parameters(), lr=1e-3), tmp, offload_grads=True)
    st = ft.stream_parameters(b, ob)
    assert st.stats()["blocks"] == 3
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    for _step in range(2):
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            m(input_ids=ids, labels=ids).loss.backward()
            o.step()
    assert same_params(a, b)
    ob.close()


def test_default_blocks_of_a_sequential(tmp):
    """A Sequential of repeated blocks (torchvision's ViT keeps its encoder layers so) is
    found; a Sequential of different modules is not a list of blocks."""
    seq = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(),
                              torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(3)]))
    ob = offloaded(torch.optim.SGD(seq.parameters(), lr=1), tmp)
    st = ft.stream_parameters(seq, ob)
    assert st.stats()["blocks"] == 3 and st.stats()["parameters"] == 6
    st.close()
    ob.close()


def test_eval_forward_and_state_dict(tmp):
    """A forward without grad releases as it goes; state_dict() holds the values (host
    copies), load_state_dict() stores new ones, which the next steps train from."""
    a, b = Net(), Net()
    ob = offloaded(torch.optim.Adam(b.parameters(), lr=1e-3), tmp)
    st = ft.stream_parameters(b, ob)
    with torch.no_grad():
        assert torch.equal(a(batch(0)), b(batch(0)))
    assert st.stats()["resident_bytes"] == 0
    torch.manual_seed(5)
    new = {k: torch.randn_like(v) for k, v in a.state_dict().items()}
    a.load_state_dict(new)
    b.load_state_dict(new)
    assert st.stats()["resident_bytes"] == 0
    assert same_params(a, b)
    oa = torch.optim.Adam(a.parameters(), lr=1e-3)
    train(((a, oa), (b, ob)), range(2))
    assert same_params(a, b)
    # the optimizer's own state dict round trip keeps the streamed values
    ob.load_state_dict(ob.state_dict())
    assert same_params(a, b)
    ob.close()
    assert st.stats()["resident_bytes"] == st.stats()["parameter_bytes"]


@pytest.mark.filterwarnings("ignore:.*torch.distributed is disabled.*")
def test_dcp_checkpoint(tmp):
    """torch.distributed.checkpoint with fastensor's storage layer, through DCP's own
    get/set_model_state_dict and get/set_optimizer_state_dict: a streamed model and its
    offloaded states saved, loaded into another streamed model, trained on: the plain run's
    parameters."""
    import os

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)

    from fastensor.dcp import FastensorReader, FastensorWriter
    a, b, c = Net(), Net(), Net()
    oa = torch.optim.Adam(a.parameters(), lr=1e-3)
    ob, oc = (offloaded(torch.optim.Adam(m.parameters(), lr=1e-3), tmp, offload_grads=True)
              for m in (b, c))
    ft.stream_parameters(b, ob)
    ft.stream_parameters(c, oc)
    train(((a, oa), (b, ob)), range(2))
    path = os.path.join(tmp, "ckpt")
    dcp.save({"model": get_model_state_dict(b), "optim": get_optimizer_state_dict(b, ob)},
             storage_writer=FastensorWriter(path))
    sd = {"model": get_model_state_dict(c), "optim": get_optimizer_state_dict(c, oc)}
    dcp.load(sd, storage_reader=FastensorReader(path))
    set_model_state_dict(c, sd["model"])
    set_optimizer_state_dict(c, oc, sd["optim"])
    assert same_params(a, c)
    train(((a, oa), (c, oc)), range(2, 4))
    assert same_params(a, c)
    ob.close()
    oc.close()


def test_failed_step_resumes(tmp):
    """An exception in the second chunk's update: the streamed parameters of the chunks not
    finished keep their stored values; the next step() finishes the step as the
    uninterrupted one."""
    a, b = Net(), Net()
    oa = torch.optim.Adam(a.parameters(), lr=1e-3, foreach=False)
    inner = torch.optim.Adam(b.parameters(), lr=1e-3, foreach=False)
    ob = offloaded(inner, tmp, offload_grads=True)
    ft.stream_parameters(b, ob)
    calls = fail_after_update(inner)
    calls["fail"] = 2
    for step in range(2):
        x = batch(step)
        oa.zero_grad()
        backward(a, x)
        oa.step()
        ob.zero_grad()
        backward(b, x)
        if step == 0:
            with pytest.raises(Injected):
                ob.step()
        ob.step()
        assert same_params(a, b), step
    ob.close()


def test_failed_read_leaves_the_parameter_out(tmp, monkeypatch):
    """A read of a streamed parameter that fails (an I/O error from the store) fails the
    forward pass; that parameter is not used half read: the pass after it reads it again and
    trains as the plain run."""
    from fastensor import optim
    a, b = Net(), Net()
    oa = torch.optim.Adam(a.parameters(), lr=1e-3)
    ob = offloaded(torch.optim.Adam(b.parameters(), lr=1e-3), tmp)
    st = ft.stream_parameters(b, ob, prefetch=False)
    real, calls = optim._C.store_wait, {"n": 0}

    def failing(h, key):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(5, "injected read error")
        return real(h, key)
    monkeypatch.setattr(optim._C, "store_wait", failing)
    with pytest.raises(OSError, match="injected"):
        backward(b, batch(0))
    assert calls["n"] >= 5  # and the failed read waited for before its memory went
    ob.zero_grad()
    assert st.stats()["resident_bytes"] == 0
    train(((a, oa), (b, ob)), range(2))
    assert same_params(a, b)
    ob.close()


def test_refusals(tmp):
    b = Net()
    with pytest.raises(TypeError, match="OffloadedOptimizer"):
        ft.stream_parameters(b, torch.optim.SGD(b.parameters(), lr=1))
    ob = offloaded(torch.optim.SGD(b.parameters(), lr=1), tmp)
    with pytest.raises(ValueError, match="no torch.nn.ModuleList"):
        ft.stream_parameters(torch.nn.Linear(2, 2), ob)
    shared = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match="shared parameter"):
        ft.stream_parameters(b, ob, blocks=[torch.nn.Sequential(shared),
                                            torch.nn.Sequential(shared)])
    flat = torch.nn.Linear(4, 4)
    buf = torch.zeros(100)
    flat.weight = torch.nn.Parameter(buf[:16].view(4, 4))
    with pytest.raises(ValueError, match="does not own its storage"):
        ft.stream_parameters(b, ob, blocks=[flat])
    st = ft.stream_parameters(b, ob)
    other = offloaded(torch.optim.SGD(b.parameters(), lr=1), tmp)
    for opt in (ob, other):
        with pytest.raises(ValueError, match="streamed already"):
            ft.stream_parameters(b, opt, blocks=[b.layers[0]])
    st.close()
    ft.stream_parameters(b, other).close()  # free again
    assert st.stats()["resident_bytes"] == st.stats()["parameter_bytes"]
    # nothing was left half done by the refusals: training goes on
    backward(b, batch(0))
    ob.step()
    ob.close()
