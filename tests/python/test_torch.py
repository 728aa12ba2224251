import gc
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (apt-get install python3-torch)")

import fastensor.torch as ft  # noqa: E402
import st_reader  # noqa: E402

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64]
DTYPES += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu",
                                       "float8_e4m3fnuz", "float8_e5m2fnuz", "uint16", "uint32",
                                       "uint64") if hasattr(torch, n)]
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device (torch.cuda.is_available() is False)")


def rand(dtype, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = int(np.prod(shape)) if shape else 1
    esize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * esize,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        return (raw % 2).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and \
        a.contiguous().view(-1).view(torch.uint8).tolist() == b.contiguous().view(-1).view(torch.uint8).tolist() \
        if a.numel() else (a.dtype == b.dtype and a.shape == b.shape)


def test_every_dtype_0dim_empty_noncontiguous(tmp):
    tensors = {}
    for i, dt in enumerate(DTYPES):
        tensors[f"m{i}"] = rand(dt, (4, 6), i)
        tensors[f"s{i}"] = rand(dt, (), i + 100)
        tensors[f"e{i}"] = torch.empty((0, 3), dtype=dt)
    p = os.path.join(tmp, "all.safetensors")
    with pytest.raises(ValueError, match="non contiguous tensor: `t`"):  # as safetensors
        ft.save_file({"t": torch.arange(24, dtype=torch.float32).reshape(4, 6).t()}, p)
    assert not os.path.exists(p)
    tensors["t"] = torch.arange(24, dtype=torch.float32).reshape(4, 6).t().contiguous()
    ft.save_file(tensors, p)  # the metadata holds fastensor's checksum keys only
    for verify in (False, True):
        back = ft.load_file(p, verify=verify)
        assert set(back) == set(tensors)
        for k, t in tensors.items():
            assert same(back[k], t), k
    header, start, raw = st_reader.read(p)  # an independent reader
    assert start % 4096 == 0 and "format" not in header["__metadata__"]
    for k, t in tensors.items():
        assert raw[k][1] == tuple(t.shape)
        assert raw[k][2] == bytes(t.contiguous().view(-1).view(torch.uint8).tolist()) if t.numel() else raw[k][2] == b""


def test_reads_foreign_unaligned_files(tmp):
    """Hand-written file: unpadded header, an F16 tensor of odd length before an F32 one."""
    a = torch.tensor([1.5, 2.5, 3.5], dtype=torch.float16)
    b = torch.arange(5, dtype=torch.float32)
    p = os.path.join(tmp, "foreign.safetensors")
    st_reader.write(p, {"a": ("F16", (3,), a.view(torch.uint8).numpy().tobytes()),
                        "b": ("F32", (5,), b.view(torch.uint8).numpy().tobytes())}, pad=3)
    for mmap in (None, True, False):  # (data at an odd offset: never mapped, always read)
        back = ft.load_file(p, mmap=mmap)
        assert torch.equal(back["a"], a) and torch.equal(back["b"], b)


def mapped(path):
    """Whether this process maps the file at path."""
    with open("/proc/self/maps") as f:
        return os.path.realpath(path) in f.read()


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def cache(path):
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass


def test_shards_kept_in_the_cache_are_mapped_copy_on_write(tmp):
    t = {"a": rand(torch.float32, (512, 1024), 1), "b": rand(torch.int16, (3, 5), 2)}
    p = os.path.join(tmp, "m.safetensors")
    ft.save_file(t, p)
    evict(p)
    back = ft.load_file(p, cache="bypass")  # not in the page cache, kept out of it: read
    assert not mapped(p) and all(same(back[k], v) for k, v in t.items())
    del back
    gc.collect()
    back = ft.load_file(p)  # not in the page cache, fits: read into it ahead, mapped
    assert mapped(p) and all(same(back[k], v) for k, v in t.items())
    del back
    gc.collect()
    cache(p)
    back = ft.load_file(p)  # in the page cache: mapped
    assert mapped(p) and all(same(back[k], v) for k, v in t.items())
    back["a"][0, 0] = 12345.0  # copy on write: the file keeps its bytes
    back["b"] += 1
    del back
    gc.collect()
    assert not mapped(p)  # the mapping lives as long as the tensors
    for opts in ({"mmap": False}, {"verify": True}, {"engine": "posix"}, {"mmap": None}):
        back = ft.load_file(p, **opts)
        assert mapped(p) == (opts == {"mmap": None}), opts
        assert all(same(back[k], v) for k, v in t.items()), opts
        del back
        gc.collect()
    evict(p)
    back = ft.load_file(p, mmap=True)  # mapped whether cached or not
    assert mapped(p) and all(same(back[k], v) for k, v in t.items())
    del back
    gc.collect()
    model = torch.nn.Linear(1024, 512)
    ft.save_model(model, p)
    cache(p)
    fresh = torch.nn.Linear(1024, 512)
    ft.load_model(fresh, p)  # copies out of the mapping, keeps none of it
    gc.collect()
    assert not mapped(p)
    assert torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)


def test_async_snapshot(tmp):
    t = {"w": torch.zeros(1 << 20), "b": torch.ones(10)}
    p = os.path.join(tmp, "async.safetensors")
    h = ft.save_file_async(t, p)
    t["w"].add_(5)  # mutate at once: the file must hold the old values
    del t["b"]
    gc.collect()
    h.result()
    assert h.done()
    back = ft.load_file(p)
    assert torch.count_nonzero(back["w"]) == 0 and torch.equal(back["b"], torch.ones(10))


def test_async_errors_surface(tmp):
    h = ft.save_file_async({"w": torch.zeros(4)}, os.path.join(tmp, "no", "dir", "x.safetensors"))
    with pytest.raises(FileNotFoundError):
        h.result()


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)
        self.norm = torch.nn.BatchNorm1d(8)
        self.head = torch.nn.Linear(8, 50, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.register_buffer("mask", torch.ones(8, 4).t())  # non-contiguous buffer


def test_model_tied_weights_and_buffers(tmp):
    torch.manual_seed(0)
    m = Tied()
    m.norm.running_mean.add_(3)
    p = os.path.join(tmp, "model.safetensors")
    ft.save_model(m, p)
    header, _, raw = st_reader.read(p)
    assert "head.weight" not in raw and "emb.weight" in raw  # stored once
    user = {k: v for k, v in header["__metadata__"].items() if not k.startswith("fastensor.")}
    assert user == {"head.weight": "emb.weight"}  # safetensors' way
    m2 = Tied()
    missing, unexpected = ft.load_model(m2, p)
    assert not missing and not unexpected
    for k, v in m.state_dict().items():
        assert torch.equal(m2.state_dict()[k], v), k
    assert m2.head.weight is m2.emb.weight


def test_errors(tmp):
    with pytest.raises(FileNotFoundError):
        ft.load_file(os.path.join(tmp, "missing.safetensors"))
    p = os.path.join(tmp, "corrupt.safetensors")
    with open(p, "wb") as f:
        f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":")
    with pytest.raises(ValueError) as e:
        ft.load_file(p)
    assert "corrupt.safetensors" in str(e.value)
    with pytest.raises(ValueError, match="Key `a` is invalid"):  # safetensors' wording
        ft.save_file({"a": [1, 2]}, p)
    with pytest.raises(ValueError):
        ft.save_file({"a": torch.zeros(2, dtype=torch.complex128)}, p)
    with open(p, "rb") as f:  # bad input destroyed nothing
        assert f.read().startswith(b"\x10\x00")


def test_flipped_bit_detected(tmp):
    p = os.path.join(tmp, "flip.safetensors")
    ft.save_file({"w": torch.randn(1 << 19)}, p)
    _, start, _ = st_reader.read(p)
    with open(p, "r+b") as f:
        f.seek(start + 12345)
        b = f.read(1)
        f.seek(start + 12345)
        f.write(bytes([b[0] ^ 1]))
    ft.load_file(p)  # without verification it loads
    with pytest.raises(ValueError) as e:
        ft.load_file(p, verify=True)
    assert "block 0" in str(e.value) and "'w'" in str(e.value)


def test_sharded(tmp):
    t = {f"l{i}": torch.randn(300, 300) for i in range(10)}
    p = os.path.join(tmp, "big.safetensors")
    ft.save_file(t, p, shard_size=1 << 20)
    for src in (p + ".index.json", tmp):
        back = ft.load_file(src)
        assert all(torch.equal(back[k], v) for k, v in t.items())


@needs_cuda
def test_cuda_round_trip_and_stream_order(tmp):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.zeros(1 << 22, device="cuda")
        x.add_(7)  # queued on s: the save must see it
        p = os.path.join(tmp, "cuda.safetensors")
        ft.save_file({"x": x}, p)
    back = ft.load_file(p, device="cuda")
    assert back["x"].device.type == "cuda" and torch.all(back["x"] == 7)
    h = ft.save_file_async({"x": x}, p)
    x.zero_()
    h.result()
    assert torch.all(ft.load_file(p, device="cuda:0")["x"] == 7)


@needs_cuda
@pytest.mark.parametrize("engine", ["cufile", "direct", "auto"])
def test_cuda_batches_in_stream_order(tmp, engine):
    """File.write_batch/read_batch of CUDA tensors, after work queued on the current stream."""
    import fastensor
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        xs = [torch.full((int(n),), float(i), device="cuda")
              for i, n in enumerate([1, 1000, 4096, 70001, 1 << 18])]
        for x in xs:
            x.mul_(3)  # queued on s: the writes must see it
        offs = [4096 * 300 * i + 5 for i in range(len(xs))]
        p = os.path.join(tmp, "b.bin")
        with fastensor.File(p, "w", engine=engine) as f:
            try:
                done = f.write_batch(list(zip(xs, offs)))
            except OSError as e:
                if engine == "cufile" and "5027" in str(e):
                    pytest.skip(f"cuFile cannot open files here: {e}")
                raise
            assert done == [x.nbytes for x in xs]
            back = [torch.empty_like(x) for x in xs]
            assert f.read_batch(list(zip(back, offs))) == [x.nbytes for x in xs]
    torch.cuda.synchronize()
    for i, b in enumerate(back):
        assert torch.all(b == 3.0 * i)


def test_safetensors_library_reads_our_files_and_we_read_its(tmp):
    st = pytest.importorskip("safetensors.torch",
                             reason="the safetensors package is not installed (not in Debian)")
    t = {"a": torch.randn(33, 7), "b": torch.arange(10, dtype=torch.int64),
         "c": torch.zeros((), dtype=torch.bfloat16), "e": torch.empty(0, 5)}
    ours = os.path.join(tmp, "ours.safetensors")
    ft.save_file(t, ours, metadata={"k": "v"})
    back = st.load_file(ours)
    assert set(back) == set(t) and all(same(back[k], v) for k, v in t.items())
    theirs = os.path.join(tmp, "theirs.safetensors")
    st.save_file(t, theirs)
    back = ft.load_file(theirs)
    assert set(back) == set(t) and all(same(back[k], v) for k, v in t.items())
