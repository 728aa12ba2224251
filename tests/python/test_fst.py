"""The compressed container (.fst): byte-exact round trips through every entry point,
special values, edge sizes, corruption and truncation caught, conversions both ways, the
safetensors names never compressed."""
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fastensor  # noqa: E402
import fastensor.numpy as fnp  # noqa: E402
import fastensor.torch as ft  # noqa: E402
from fastensor import _fst  # noqa: E402

PYDIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "python")


def state(seed=0):
    g = torch.Generator().manual_seed(seed)
    sd = {"bf16": (torch.randn(512, 300, generator=g) * 0.02).to(torch.bfloat16),
          "f16": (torch.randn(4097, generator=g) * 0.1).half(),
          "f32": torch.randn(100, 33, generator=g),
          "f64": torch.randn(1000, generator=g, dtype=torch.float64),
          "f8": torch.randn(3000, generator=g).to(torch.float8_e4m3fn),
          "i64": torch.randint(-5, 5, (999,), generator=g),
          "u8": torch.randint(0, 255, (17,), generator=g, dtype=torch.uint8),
          "bool": torch.rand(31, generator=g) > 0.5,
          "empty": torch.empty(0, 7), "scalar": torch.tensor(-0.0),
          "one": torch.tensor([3.5], dtype=torch.bfloat16)}
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-45, 1e-40,
                            3.4e38], dtype=torch.float32)
    sd["special"] = special.repeat(1000)
    sd["special"].view(torch.int32)[::7] = 0x7fa12345  # a NaN payload
    return sd


def same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k].reshape(-1).view(torch.uint8) if a[k].numel() else a[k],
                           b[k].reshape(-1).view(torch.uint8) if b[k].numel() else b[k]), k


def test_round_trip_every_dtype(tmp):
    sd = state()
    p = os.path.join(tmp, "m.fst")
    ft.save_file(sd, p, {"step": "7"}, compression="always")
    assert open(p, "rb").read(8) == b"FASTENSZ"
    same(ft.load_file(p), sd)
    d = fastensor.inspect(p)
    assert d["container"] == "fst" and d["metadata"] == {"format": "pt", "step": "7"}
    assert d["tensors"]["bf16"]["compressed"] and not d["tensors"]["i64"]["compressed"]
    assert d["tensors"]["bf16"]["stored_bytes"] < 0.75 * d["tensors"]["bf16"]["bytes"]
    assert fastensor.verify(p) is True
    part = ft.load_file(p, names=["f32", "empty"])
    same(part, {"f32": sd["f32"], "empty": sd["empty"]})
    with pytest.raises(KeyError, match="nope"):
        ft.load_file(p, names=["nope"])


def test_streams_lie_on_page_boundaries(tmp):
    """A save writes each stream from a page boundary of the file (so that the engine may
    write it with O_DIRECT), the gaps zeros, the same bytes every time."""
    import json
    import struct
    sd = state()
    p, q = os.path.join(tmp, "a.fst"), os.path.join(tmp, "b.fst")
    ft.save_file(sd, p, compression="always")
    ft.save_file(sd, q, compression="always")
    raw = open(p, "rb").read()
    assert raw == open(q, "rb").read()
    hoff, hlen = struct.unpack("<QQ", raw[8:24])
    assert hoff % 4096 == 0 and hoff + hlen == len(raw)
    header = json.loads(raw[hoff:])
    spans = sorted(tuple(e["stored"]) for k, e in header.items()
                   if k not in ("__metadata__", "fastensor.container"))
    end = 0
    for b, e in spans:
        assert b % 4096 == 0 and b >= end
        assert raw[4096 + end:4096 + b] == bytes(b - end)  # the gap before it: zeros
        end = e
    assert raw[4096 + end:hoff] == bytes(hoff - 4096 - end)


def test_compression_none_and_incompressible(tmp):
    g = torch.Generator().manual_seed(1)
    sd = {"noise": torch.randint(-2**31, 2**31 - 1, (1 << 18,), generator=g,
                                 dtype=torch.int32).view(torch.float32)}
    p = os.path.join(tmp, "n.fst")
    ft.save_file(sd, p, compression="always")
    d = fastensor.inspect(p)
    assert not d["tensors"]["noise"]["compressed"]  # saves < 5%: stored
    assert d["stored_bytes"] < d["bytes"] * 1.001
    same(ft.load_file(p), sd)
    ft.save_file(state(), p, compression="none")
    assert not any(t["compressed"] for t in fastensor.inspect(p)["tensors"].values())
    same(ft.load_file(p), state())


@pytest.fixture
def costs(tmp):
    """The library's measured figures for ``tmp``'s disk and each float size, put back after
    a test that gives it others (``_fst.set_cost``: what "auto" decides by)."""
    measured = {e: _fst.cost(tmp, e) for e in (2, 4)}
    yield measured
    for e, figures in measured.items():
        _fst.set_cost(tmp, e, figures)


def test_auto_codes_where_the_codec_outruns_the_disk(tmp, costs):
    sd = {"w": (torch.randn(1 << 16) * 0.02).to(torch.bfloat16)}
    p = os.path.join(tmp, "auto.fst")
    encode, share, decode, write, read = costs[2]  # the real measurement ran
    assert min(encode, decode, write, read) > 0 and 0 < share < 1
    assert _fst.coding_pays(tmp) == (encode * (1 - share) >= 0.76 * write and decode >= read)
    _fst.set_cost(tmp, 2, (5.0, 0.67, 8.0, 2.0, 2.0))  # a many-core machine
    ft.save_file(sd, p)
    assert fastensor.inspect(p)["tensors"]["w"]["compressed"]
    # encodes faster than the disk writes, but not by the margin a save's pipeline needs
    _fst.set_cost(tmp, 2, (3.0, 0.67, 8.0, 2.0, 2.0))
    ft.save_file(sd, p)
    assert not fastensor.inspect(p)["tensors"]["w"]["compressed"]
    _fst.set_cost(tmp, 2, (0.8, 0.67, 1.6, 2.0, 2.0))  # codec slower than the disk
    ft.save_file(sd, p)
    assert not fastensor.inspect(p)["tensors"]["w"]["compressed"]
    same(ft.load_file(p), sd)
    ft.save_file(sd, p, compression="always")
    assert fastensor.inspect(p)["tensors"]["w"]["compressed"]


def test_auto_weighs_each_float_size_by_what_coding_saves(tmp, costs):
    """fp32 codes to about 0.83 where bf16 codes to 0.67: the same encode rate saves half the
    write time, so auto codes bf16 and stores fp32 in one save until fp32 encodes fast
    enough; each size's sample is measured (coded share as the real weights')."""
    enc4, share4 = costs[4][:2]
    assert enc4 > 0 and 0.78 < share4 < 0.88  # normal(0, 0.02) fp32, as GPT-2's 0.833
    assert 0.6 < costs[2][1] < 0.72  # bf16, as a Llama's 0.670
    assert _fst.cost(None, 4)[:2] == (enc4, share4)  # measured once per process
    sd = {"h": (torch.randn(1 << 16) * 0.02).to(torch.bfloat16),
          "f": torch.randn(1 << 15) * 0.02}
    p = os.path.join(tmp, "sizes.fst")
    _fst.set_cost(tmp, 2, (5.0, 0.67, 8.0, 2.0, 2.0))
    _fst.set_cost(tmp, 4, (5.0, 0.83, 8.0, 2.0, 2.0))  # 5 x 0.17 < 0.76 x 2: stores
    ft.save_file(sd, p)
    t = fastensor.inspect(p)["tensors"]
    assert t["h"]["compressed"] and not t["f"]["compressed"]
    same(ft.load_file(p), sd)
    _fst.set_cost(tmp, 4, (12.0, 0.83, 8.0, 2.0, 2.0))  # 12 x 0.17 >= 0.76 x 2: codes
    ft.save_file(sd, p)
    t = fastensor.inspect(p)["tensors"]
    assert t["h"]["compressed"] and t["f"]["compressed"]
    same(ft.load_file(p), sd)


def test_safe_open_slices_and_numpy(tmp):
    sd = state(2)
    p = os.path.join(tmp, "s.fst")
    ft.save_file(sd, p)
    with fastensor.safe_open(p, framework="pt") as f:
        assert f.keys() == sorted(sd)
        assert f.metadata() == {"format": "pt"}
        assert torch.equal(f.get_slice("f32")[5:9, 1:30:3], sd["f32"][5:9, 1:30:3])
        assert f.get_slice("bf16").get_shape() == [512, 300]
        assert f.get_slice("bf16").get_dtype() == "BF16"
        assert torch.equal(f.get_tensor("i64"), sd["i64"])
    arrays = {"a": np.arange(1000, dtype=np.float32) / 7, "b": np.zeros((3, 4), np.int16)}
    q = os.path.join(tmp, "np.fst")
    fnp.save_file(arrays, q)
    got = fnp.load_file(q)
    assert all(np.array_equal(got[k], arrays[k]) for k in arrays)
    with fastensor.safe_open(q, framework="np") as f:
        assert np.array_equal(f.get_slice("a")[10:20], arrays["a"][10:20])


def test_convert_both_ways_and_cli(tmp):
    sd = state(3)
    st = os.path.join(tmp, "m.safetensors")
    ft.save_file(sd, st, {"x": "y"})
    fst = os.path.join(tmp, "m.fst")
    fastensor.convert(st, fst, compression="always")
    same(ft.load_file(fst), sd)
    assert fastensor.inspect(fst)["metadata"]["x"] == "y"
    back = os.path.join(tmp, "back.safetensors")
    fastensor.convert(fst, back)
    same(ft.load_file(back), sd)
    pytest.importorskip("safetensors")
    from safetensors.torch import load_file as st_load
    same(st_load(back), sd)
    env = dict(os.environ, PYTHONPATH=PYDIR)
    cli = os.path.join(tmp, "cli.fst")
    r = subprocess.run([sys.executable, "-m", "fastensor", "convert", back, cli], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    same(ft.load_file(cli), sd)
    for cmd in ("inspect", "verify"):
        r = subprocess.run([sys.executable, "-m", "fastensor", cmd, cli], env=env,
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    assert "fastensor container" in subprocess.run(
        [sys.executable, "-m", "fastensor", "inspect", cli], env=env, capture_output=True,
        text=True).stdout
    r = subprocess.run([sys.executable, "-m", "fastensor", "convert", os.path.join(tmp, "no"),
                        cli], env=env, capture_output=True, text=True)
    assert r.returncode == 1 and "fastensor convert:" in r.stderr
    same(ft.load_file(cli), sd)  # a failed convert leaves the file there


def test_safetensors_names_are_never_compressed(tmp):
    p = os.path.join(tmp, "plain.safetensors")
    ft.save_file(state(), p, compression="auto")
    assert open(p, "rb").read(8) != b"FASTENSZ"
    pytest.importorskip("safetensors")
    from safetensors.torch import load_file as st_load
    same(st_load(p), state())
    with pytest.raises(ValueError, match="compression"):
        ft.save_file(state(), p, compression="zstd")
    with pytest.raises(ValueError, match="shard_size"):
        ft.save_file(state(), os.path.join(tmp, "x.fst"), shard_size=1 << 20)


def test_corruption_and_truncation(tmp):
    sd = state(4)
    p = os.path.join(tmp, "c.fst")
    ft.save_file(sd, p, compression="always")
    c = _fst.Container(p)
    x = c.entry("bf16")
    good = open(p, "rb").read()
    bad = bytearray(good)
    bad[c.data_start + x.stored[0] + (x.stored[1] - x.stored[0]) // 2] ^= 0x04
    open(p, "wb").write(bad)
    with pytest.raises(ValueError, match="'bf16'.*(checksum|corrupt)"):
        ft.load_file(p)
    with pytest.raises(ValueError, match="bf16"):
        fastensor.verify(p)
    same(ft.load_file(p, names=["f32"]), {"f32": sd["f32"]})  # the others still read
    open(p, "wb").write(good[:len(good) - 10])
    with pytest.raises(ValueError, match="truncated"):
        ft.load_file(p)
    open(p, "wb").write(good[:20])
    with pytest.raises(ValueError, match="truncated"):
        ft.load_file(p)
    open(p, "wb").write(b"FASTENSZ" + (4096).to_bytes(8, "little") + (5).to_bytes(8, "little")
                        + bytes(4072) + b"{oops")
    with pytest.raises(ValueError, match="not JSON"):
        ft.load_file(p)


def test_failed_save_keeps_the_previous_file(tmp):
    p = os.path.join(tmp, "keep.fst")
    ft.save_file(state(), p)
    before = open(p, "rb").read()
    shared = torch.zeros(4)
    with pytest.raises(RuntimeError, match="share memory"):
        ft.save_file({"a": shared, "b": shared[:2]}, p)
    with pytest.raises((ValueError, TypeError)):
        ft.save_file({"a": torch.zeros(4)[::2]}, p)  # non-contiguous: refused
    with pytest.raises(TypeError):
        ft.save_file({"a": torch.zeros(2)}, p, metadata={"k": 3})
    assert open(p, "rb").read() == before
    assert [n for n in os.listdir(tmp) if "tmp" in n] == []


@pytest.mark.parametrize("limit", [4096 + 8192, 4096 + (1 << 20), 6 << 20])
def test_failed_write_keeps_the_previous_file(tmp, limit):
    """A write that fails in the middle of a save (the process's file size limit: EFBIG at
    the first byte past it, in the streams or at the header) is the save's error; the
    previous file stays, no temporary is left. (Every syscall of the writer, its fdatasyncs
    included, fails in turn in the C fault sweep: tests/test_ckpt.c, make check-faults.)"""
    p = os.path.join(tmp, "keep.fst")
    ft.save_file(state(), p, compression="always")
    before = open(p, "rb").read()
    code = f"""
import resource, signal, sys, torch
sys.path.insert(0, {PYDIR!r})
import fastensor.torch as ft
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
g = torch.Generator().manual_seed(9)
sd = {{"w": torch.randn(2048, 1000, generator=g).to(torch.bfloat16),
       "v": torch.randn(2000000, generator=g)}}
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
try:
    ft.save_file(sd, {p!r}, compression="always")
except OSError as e:
    print("refused:", e)
    sys.exit(3)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "refused" in r.stdout
    assert open(p, "rb").read() == before
    assert [n for n in os.listdir(tmp) if "tmp" in n] == []
    same(ft.load_file(p), state())


def test_async_and_models(tmp):
    sd = state(5)
    p = os.path.join(tmp, "a.fst")
    ft.save_file_async(sd, p).result()
    same(ft.load_file(p), sd)
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    q = os.path.join(tmp, "model.fst")
    ft.save_model(m, q)
    m2 = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    ft.load_model(m2, q)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(),
                                                 m2.state_dict().values()))


def test_async_snapshot_of_coded_streams(tmp, monkeypatch):
    """Where the GPU codes the tensors, save_file_async of a .fst name snapshots their coded
    streams (the host encoder stands in for the GPU's here, the kept memory made ahead):
    the caller's changes after it are not in the save, every dtype loads byte-exact, the
    memory goes back for the next save; safetensors names, compression="none" and
    snapshot="host" copy."""
    from fastensor import _async
    monkeypatch.setattr(ft, "_codes_on_gpu", lambda tensors, mode: mode != "none")
    ft.release_snapshot_memory()
    _async._coded.give(_fst.code(tmp, [], "always")[0])
    sd = state(8)
    want = {k: v.clone() for k, v in sd.items()}
    for name, mode, snap in (("a.fst", "always", "coded"), ("b.fst", "auto", "coded"),
                             ("c.fst", "none", "host"), ("d.safetensors", "auto", "host"),
                             ("e.fst", "always", "host!")):
        p = os.path.join(tmp, name)
        fut = ft.save_file_async(sd, p, compression=mode,
                                 snapshot="host" if snap.endswith("!") else "auto")
        snap = snap.rstrip("!")
        assert fut.snapshot == snap
        sd["bf16"].add_(1)  # after the snapshot: not in this save
        fut.result()
        same(ft.load_file(p), want)
        sd["bf16"].copy_(want["bf16"])
        assert len(_async._coded.free) == 1
    ft.release_snapshot_memory()
    assert _async._coded.free == []


def test_codec_blocks_by_element_size(tmp):
    """fp32 tensors are coded in 512 KiB blocks (the GPU decoder's fastest for them), bf16 in
    1 MiB ones; the stream's header says which, and both load back."""
    g = torch.Generator().manual_seed(3)
    sd = {"f32": torch.randn(600_000, generator=g) * 0.02,
          "bf16": (torch.randn(1_200_000, generator=g) * 0.02).to(torch.bfloat16)}
    p = os.path.join(tmp, "blocks.fst")
    ft.save_file(sd, p, compression="always")
    same(ft.load_file(p), sd)
    c = _fst.Container(p)
    data = open(p, "rb").read()
    for name, block in (("f32", 512 << 10), ("bf16", 1 << 20)):
        x = c.entry(name)
        assert x.compressed
        head = data[c.data_start + x.stored[0]:c.data_start + x.stored[0] + 24]
        assert head[:4] == b"FTZ1" and int.from_bytes(head[16:20], "little") == block, name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda)")
def test_cuda_async_snapshots_coded_streams(tmp):
    """On a GPU that codes them: the first async .fst save snapshots on the device and codes
    that copy there (the memory kept), the next ones snapshot coded streams; byte-exact."""
    sd = {k: v.cuda() for k, v in state(9).items() if k not in ("f8", "f64")}
    if not ft._codes_on_gpu(list(sd.values()), "always"):
        pytest.skip("the GPU encoder does not code these tensors here (_fst.gpu_codes)")
    ft.release_snapshot_memory()
    snaps = []
    for step in range(3):
        want = {k: v.clone() for k, v in sd.items()}
        p = os.path.join(tmp, f"s{step}.fst")
        fut = ft.save_file_async(sd, p, compression="always")
        snaps.append(fut.snapshot)
        sd["bf16"].add_(1)
        fut.result()
        got = ft.load_file(p, device="cuda")
        assert all(torch.equal(got[k].cpu().view(torch.uint8) if got[k].dim() else got[k].cpu(),
                               want[k].cpu().view(torch.uint8) if want[k].dim() else
                               want[k].cpu()) for k in want)
    assert snaps == ["device", "coded", "coded"]
    ft.release_snapshot_memory()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda)")
def test_cuda(tmp):
    """Saves from GPU memory (coded on the GPU where it codes) write the bytes a save from
    host memory writes; loads into GPU memory decode on the GPU (where the library has the
    decoder) and match the host decode byte for byte; verify=True decodes on the host; a corrupt stream is a
    ValueError on either path."""
    sd = {k: v.cuda() for k, v in state(6).items()}
    big = (torch.randn(3 << 20, generator=torch.Generator().manual_seed(1)) * 0.02)
    sd["big_bf16"] = big.to(torch.bfloat16).cuda()  # 6 MiB: several blocks, several lanes
    sd["big_f32"] = big[: 1 << 20].cuda()
    p = os.path.join(tmp, "g.fst")
    ft.save_file(sd, p, compression="always")
    host = ft.load_file(p)
    same(host, {k: v.cpu() for k, v in sd.items()})
    # coded on the GPU (where its encoder wrote the CPU encoder's bytes for a sample) or on
    # the host: the same file as a save of the same tensors from host memory
    q = os.path.join(tmp, "h.fst")
    ft.save_file({k: v.cpu() for k, v in sd.items()}, q, compression="always")
    assert open(p, "rb").read() == open(q, "rb").read()
    why = _fst.gpu_decoder(torch.cuda.current_device())
    print("GPU decoder:", why or "yes")
    for verify in (False, True):
        got = ft.load_file(p, device="cuda", verify=verify)
        assert all(v.is_cuda for v in got.values())
        same({k: v.cpu() for k, v in got.items()}, host)
    with fastensor.safe_open(p, framework="pt", device="cuda") as f:
        t = f.get_tensor("big_bf16")
        assert t.is_cuda and torch.equal(t.cpu().view(torch.int16),
                                         host["big_bf16"].view(torch.int16))
        assert torch.equal(f.get_slice("f32")[3:7, 1:].cpu(), host["f32"][3:7, 1:])
    # the first block's end made impossible: the host's checks refuse it before any decode
    c = _fst.Container(p)
    x = c.entry("big_bf16")
    bad = os.path.join(tmp, "bad.fst")
    data = bytearray(open(p, "rb").read())
    data[c.data_start + x.stored[0] + 24 + 7] = 0x7f
    open(bad, "wb").write(bytes(data))
    for verify in (False, True):
        with pytest.raises(ValueError, match="big_bf16"):
            ft.load_file(bad, device="cuda", verify=verify)
