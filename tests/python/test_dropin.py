"""fastensor as a drop-in for the safetensors package: the same calls give the same answers,
files cross-read both ways, and transformers' files load (and ours load into transformers)."""
import json
import os
import struct

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
st = pytest.importorskip("safetensors.torch", reason="the safetensors package is not installed")
import safetensors  # noqa: E402

import fastensor  # noqa: E402
import fastensor.numpy as ftn  # noqa: E402
import fastensor.torch as ft  # noqa: E402

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64]
DTYPES += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu",
                                       "float8_e4m3fnuz", "float8_e5m2fnuz", "float4_e2m1fn_x2",
                                       "uint16", "uint32", "uint64") if hasattr(torch, n)]


def rand(dtype, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = int(np.prod(shape)) if shape else 1
    raw = torch.randint(0, 256, (n * torch.empty((), dtype=dtype).element_size(),),
                        dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        return (raw % 2).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)


def raw_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def same(a, b):
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and raw_bytes(a) == raw_bytes(b)


def sample_tensors():
    t = {}
    for i, dt in enumerate(DTYPES):
        t[f"m{i}"] = rand(dt, (6, 8), i)
        t[f"s{i}"] = rand(dt, (), 50 + i) if dt != getattr(torch, "float4_e2m1fn_x2", 0) \
            else rand(dt, (3,), 50 + i)
        t[f"e{i}"] = torch.empty((0, 4), dtype=dt)
    return t


@pytest.mark.parametrize("writer", ["fastensor", "safetensors"])
def test_every_dtype_cross_reads(tmp, writer):
    t = sample_tensors()
    p = os.path.join(tmp, "x.safetensors")
    (ft.save_file if writer == "fastensor" else st.save_file)(t, p)
    for reader in (ft.load_file, st.load_file):
        back = reader(p)
        assert set(back) == set(t)
        for k in t:
            assert same(back[k], t[k]), (writer, reader.__module__, k)


def test_safe_open_parity(tmp):
    t = {"w": torch.randn(37, 19), "b": torch.arange(11, dtype=torch.int64),
         "h": rand(torch.bfloat16, (5, 4, 6), 3), "z": torch.zeros(()),
         "e": torch.empty(0, 3)}
    for writer in (ft.save_file, st.save_file):
        p = os.path.join(tmp, f"{writer.__module__}.safetensors")
        writer(t, p, metadata={"k": "v", "format": "pt"})
        with safetensors.safe_open(p, framework="pt") as theirs, \
                fastensor.safe_open(p, framework="pt") as ours:
            assert ours.keys() == theirs.keys()
            # the same, less fastensor's checksum keys (reachable as ours.checksums)
            assert ours.metadata() == {k: v for k, v in theirs.metadata().items()
                                       if not k.startswith("fastensor.")}
            assert ours.checksums == (writer is ft.save_file)
            for k in theirs.keys():
                assert same(ours.get_tensor(k), theirs.get_tensor(k)), k
                a, b = ours.get_slice(k), theirs.get_slice(k)
                assert a.get_shape() == b.get_shape() and a.get_dtype() == b.get_dtype()
            indexes = {"w": [5, slice(2, 9), (slice(None), slice(3, 11)), (Ellipsis, 4),
                             (slice(30, 99), slice(0, 19)), (-1, slice(1, 2)),
                             (slice(4, 4),)],
                       "h": [(1, slice(None), slice(2, 5)), (slice(1, 3), 2), Ellipsis],
                       "b": [slice(3, 7), 10]}
            indexes["w"] += [37, (2, 19), -38, [], [1, 2], (slice(None, None, -1),),
                             (slice(1, 30, 7), slice(None, None, 3)), (None,), (0, 0, 0)]
            for k, keys in indexes.items():
                for key in keys:  # the same tensor, or the same error
                    got = [outcome(h.get_slice(k), key) for h in (ours, theirs)]
                    if isinstance(got[1], torch.Tensor):
                        assert same(got[0], got[1]), (k, key)
                    else:
                        assert got[0] == got[1], (k, key)
            with pytest.raises(IndexError, match="out of bounds"):
                ours.get_slice("w")[37]
            with pytest.raises(KeyError):
                ours.get_tensor("nope")
            with pytest.raises(fastensor.SafetensorError,
                               match="^File does not contain tensor nope$"):
                ours.get_tensor("nope")
    # numpy, and the closed handle
    p = os.path.join(tmp, "np.safetensors")
    ftn.save_file({"a": np.arange(24, dtype=np.float32).reshape(4, 6)}, p)
    with fastensor.safe_open(p, framework="np") as f:
        assert np.array_equal(f.get_tensor("a"), np.arange(24, dtype=np.float32).reshape(4, 6))
        assert np.array_equal(f.get_slice("a")[1:3, 2], np.array([8, 14], dtype=np.float32))
        assert f.metadata() == {"format": "pt"} or f.metadata() is None
    with pytest.raises(ValueError, match="closed"):
        f.keys()
    with pytest.raises(fastensor.SafetensorError, match="framework nonsense is invalid"):
        fastensor.safe_open(p, framework="nonsense")


def outcome(view, key):
    """A slice's tensor, or (its error's message) where safetensors-compatible indexing
    refuses the key."""
    try:
        return view[key]
    except Exception as e:  # noqa: BLE001 (the message is what is compared)
        return ("error", str(e))


def test_safe_open_on_an_index_and_a_directory(tmp):
    t = {f"l{i}": torch.randn(64, 32, generator=torch.Generator().manual_seed(i))
         for i in range(8)}
    d = os.path.join(tmp, "sharded")
    os.makedirs(d)
    ft.save_file(t, os.path.join(d, "model.safetensors"), shard_size=20000)
    for path in (os.path.join(d, "model.safetensors.index.json"), d):
        with fastensor.safe_open(path, framework="pt") as f:
            assert f.keys() == sorted(t)
            got = f.get_tensors()
            assert all(same(got[k], t[k]) for k in t)
            assert same(f.get_slice("l5")[7:9], t["l5"][7:9])


class _CountingC:
    """fastensor._C with its read calls counted: (calls, bytes) of each; the bytes of each
    window read in ``windows``."""

    def __init__(self, real):
        self._real, self.reads = real, {"ckpt_read": [0, 0], "ckpt_read_shard": [0, 0]}
        self.windows = []

    def __getattr__(self, name):
        fn = getattr(self._real, name)
        if name not in self.reads:
            return fn

        def counted(*args):
            self.reads[name][0] += 1
            self.reads[name][1] += args[4]
            if name == "ckpt_read_shard":
                self.windows.append(args[4])
            return fn(*args)
        return counted


def _mixed_state(n=90):
    g = torch.Generator().manual_seed(7)
    kinds = [torch.float32, torch.bfloat16, torch.int8, torch.float64, torch.int16]
    return {f"blk.{i}.{'wb'[i % 2]}": (torch.randn(1 + (i * 37) % 300, 13, generator=g) * 50)
            .to(kinds[i % len(kinds)]) for i in range(n)}


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_safe_open_reads_ahead_along_file_order_only(tmp, monkeypatch, device):
    """A get_tensor loop in file order is served by a few large reads (views of them), a loop
    in any other order reads each tensor alone and nothing more; every tensor is byte-exact,
    verified reads included."""
    import fastensor._safe as safe
    t = _mixed_state()
    keys = list(t)
    p = os.path.join(tmp, "ahead.safetensors")
    ft.save_file(dict(reversed(list(t.items()))), p)  # the layout does not follow the dict
    total = sum(x.numel() * x.element_size() for x in t.values())
    orders = ("file", "strided", "reverse")  # only "file" has a tensor follow the one before
    for verify in (False, True):
        for order in orders:
            counter = _CountingC(safe._C)
            monkeypatch.setattr(safe, "_C", counter)
            with fastensor.safe_open(p, framework="pt", device=device, engine="posix",
                                     verify=verify) as f:
                if order == "file":
                    names = f.offset_keys()
                    # safetensors' layout: larger elements first, then by name
                    sizes = [t[k].element_size() for k in names]
                    assert sizes == sorted(sizes, reverse=True)
                elif order == "reverse":
                    names = f.offset_keys()[::-1]
                else:
                    names = f.offset_keys()[::2] + f.offset_keys()[1::2]
                got = {k: f.get_tensor(k) for k in names}
            monkeypatch.setattr(safe, "_C", counter._real)
            for k in keys:
                assert same(got[k].cpu(), t[k]), (order, verify, k)
            single, windows = counter.reads["ckpt_read"], counter.reads["ckpt_read_shard"]
            if order == "file":
                assert single[0] == 1 and windows[0] == 1, counter.reads  # first one alone
                assert windows[1] <= total + 64
            else:
                assert windows[0] == 0 and single[0] == len(keys), (order, counter.reads)
                assert single[1] == total
    # the window's views are tensors of their own to the caller
    with fastensor.safe_open(p, framework="pt", device=device, engine="posix") as f:
        names = f.offset_keys()
        a, b = f.get_tensor(names[0]), f.get_tensor(names[1])
        c = f.get_tensor(names[2])
        c.zero_()
        assert same(b.cpu(), t[names[1]]) and same(f.get_tensor(names[3]).cpu(), t[names[3]])


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_safe_open_reads_the_next_window_ahead(tmp, monkeypatch, device):
    """With windows smaller than the file, a loop in file order is served by several windows,
    read on the open file's threads, the next one in flight while the loop waits for one; a
    jump drops the windows read ahead; an error of a read ahead is the error of the call that
    asks for its tensors, and closing after it raises nothing."""
    import threading
    import time
    import fastensor._safe as safe
    t = _mixed_state()
    p = os.path.join(tmp, "next.safetensors")
    ft.save_file(t, p)
    total = sum(x.numel() * x.element_size() for x in t.values())
    monkeypatch.setattr(safe, "_WINDOW_FIRST", 16 << 10)
    monkeypatch.setattr(safe, "_WINDOW_MOST", 64 << 10)
    real, threads, fail = safe._C, [], []
    # each window buffer by address: a read whose buffer is gone writes into freed memory
    import weakref
    buffers, freed, real_empty = {}, [], ft._Arrays.empty

    def empty(*a):
        out = real_empty(*a)
        buffers[out[1]] = weakref.ref(out[0])
        return out
    monkeypatch.setattr(ft._Arrays, "empty", staticmethod(empty))
    lock, inflight = threading.Lock(), [0, 0]  # reads now, most at once

    class Spy(_CountingC):
        def __getattr__(self, name):
            fn = super().__getattr__(name)
            if name != "ckpt_read_shard":
                return fn

            def spied(*args):
                with lock:
                    threads.append(threading.get_ident())
                    inflight[0] += 1
                    inflight[1] = max(inflight[1], inflight[0])
                    n = len(threads)
                try:
                    time.sleep(0.02)  # long enough for the next read to start meanwhile
                    if args[3] in buffers and buffers[args[3]]() is None:
                        freed.append(args[3])
                    if fail and n == fail[0]:
                        raise OSError(5, "injected")
                    return fn(*args)
                finally:
                    with lock:
                        inflight[0] -= 1
            return spied
    counter = Spy(real)
    monkeypatch.setattr(safe, "_C", counter)
    with fastensor.safe_open(p, framework="pt", device=device, engine="posix") as f:
        names = f.offset_keys()
        got = {k: f.get_tensor(k) for k in names}
    for k in names:
        assert same(got[k].cpu(), t[k]), k
    windows = counter.reads["ckpt_read_shard"]
    assert windows[0] >= 4, counter.reads
    assert total <= windows[1] + counter.reads["ckpt_read"][1] <= total + 64 * windows[0]
    assert threading.get_ident() not in threads, "not read ahead"
    assert inflight[1] == 2, inflight
    # a jump: the window read ahead is dropped, what follows is right
    with fastensor.safe_open(p, framework="pt", device=device, engine="posix") as f:
        order = names[:10] + names[60:] + names[10:60]
        got = {k: f.get_tensor(k) for k in order}
    for k in names:
        assert same(got[k].cpu(), t[k]), k
    # the second window read ahead fails: the call that needs it raises, nothing else does
    threads.clear()
    fail.append(3)
    with fastensor.safe_open(p, framework="pt", device=device, engine="posix") as f:
        with pytest.raises(OSError, match="injected"):
            for k in f.offset_keys():
                f.get_tensor(k)
    assert len(threads) >= 3
    assert not freed, "a window's buffer was freed while its read was in flight"


def _loop_with_small_windows(t, path, monkeypatch):
    """Save ``t`` to ``path``, then get every tensor in file order through safe_open with
    read-ahead windows of 16 KiB first, 1 MiB at most; each byte-exact. (The names in file
    order, the counted reads.)"""
    import fastensor._safe as safe
    ft.save_file(t, path)
    monkeypatch.setattr(safe, "_WINDOW_FIRST", 16 << 10)
    monkeypatch.setattr(safe, "_WINDOW_MOST", 1 << 20)
    counter = _CountingC(safe._C)
    monkeypatch.setattr(safe, "_C", counter)
    with fastensor.safe_open(path, framework="pt", device="cpu", engine="posix") as f:
        names = f.offset_keys()
        got = {k: f.get_tensor(k) for k in names}
    for k in t:
        assert same(got[k], t[k]), k
    return names, counter


def test_safe_open_window_takes_a_tensor_larger_than_its_room(tmp, monkeypatch):
    """A tensor larger than a window's room is read in a window with the ones after it (not
    alone, without read-ahead), within the most a window may take."""
    import fastensor._safe as safe
    g = torch.Generator().manual_seed(3)
    t = {"a0": torch.randn(256, generator=g), "a1": torch.randn(64, 400, generator=g)}
    t.update({f"b{i}": torch.randn(300, generator=g) for i in range(6)})
    p = os.path.join(tmp, "big.safetensors")
    names, counter = _loop_with_small_windows(t, p, monkeypatch)
    assert names.index("a1") == 1  # (the layout: by name)
    assert counter.reads["ckpt_read"][0] == 1, counter.reads  # the first tensor alone
    assert counter.reads["ckpt_read_shard"][0] >= 1
    monkeypatch.setattr(safe, "_WINDOW_MOST", 64 << 10)  # a1 (100 KiB) over the most
    counter = _CountingC(counter._real)
    monkeypatch.setattr(safe, "_C", counter)
    with fastensor.safe_open(p, framework="pt", device="cpu", engine="posix") as f:
        got = {k: f.get_tensor(k) for k in f.offset_keys()}
    for k in t:
        assert same(got[k], t[k]), k
    assert counter.reads["ckpt_read"][0] == 2, counter.reads  # the first, then a1 alone


def test_safe_open_window_room_grows_only_when_read(tmp, monkeypatch):
    """A tensor read alone, because the one after it does not fit its window, leaves the next
    window's room as it was: the room doubles only when a window is read."""
    g = torch.Generator().manual_seed(5)
    t = {"a0": torch.randn(256, generator=g), "a1": torch.randn(3 << 10, generator=g),
         "a2": torch.randn(10 << 10, generator=g)}
    t.update({f"b{i:02d}": torch.randn(300, generator=g) for i in range(20)})
    names, counter = _loop_with_small_windows(t, os.path.join(tmp, "room.safetensors"),
                                              monkeypatch)
    assert names[:3] == ["a0", "a1", "a2"]  # (the layout: by name)
    assert counter.reads["ckpt_read"][0] == 2, counter.reads  # a0, then a1 alone
    # a2 (40 KiB) is read with the 16 KiB room after it, not 32 KiB (all 24 KiB of b*)
    assert (40 << 10) < counter.windows[0] <= (56 << 10) + 4096, counter.windows


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_safe_open_window_serves_other_streams(tmp):
    """Tensors of one read-ahead window used on another stream see the window's bytes."""
    t = {f"l{i:02d}": torch.randn(2048, 256, generator=torch.Generator().manual_seed(i))
         for i in range(12)}
    p = os.path.join(tmp, "streams.safetensors")
    ft.save_file(t, p)
    side = torch.cuda.Stream()
    with fastensor.safe_open(p, framework="pt", device="cuda") as f:
        got = {}
        for i, k in enumerate(f.offset_keys()):
            if i % 2:
                with torch.cuda.stream(side):
                    got[k] = f.get_tensor(k) * 1
            else:
                got[k] = f.get_tensor(k)
    torch.cuda.synchronize()
    assert all(same(got[k].cpu(), t[k]) for k in t)


def _rchar():
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def test_get_slice_reads_only_the_rows_it_needs(tmp):
    """One row of a 1 GiB tensor: the bytes read are that row's (a sparse file by hand)."""
    rows, cols = 1 << 15, 1 << 13  # F32: 32 KiB rows, 1 GiB in all
    header = json.dumps({"w": {"dtype": "F32", "shape": [rows, cols],
                               "data_offsets": [0, rows * cols * 4]}}).encode()
    header += b" " * (-len(header) % 8)
    p = os.path.join(tmp, "big.safetensors")
    start = 8 + len(header)
    row = np.random.default_rng(0).standard_normal(cols).astype(np.float32)
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(start + rows * cols * 4)
        f.seek(start + 1234 * cols * 4)
        f.write(row.tobytes())
    with fastensor.safe_open(p, framework="pt") as f:
        s = f.get_slice("w")
        s[0]  # AUTO's first decisions on this file, outside the count
        before = _rchar()
        got = s[1234]
        read = _rchar() - before
        assert np.array_equal(got.numpy(), row)
        assert read <= cols * 4 + 2 * 4096, read  # the row, and at most its edge blocks
        before = _rchar()
        col = s[:, 7]  # a column needs every row: read as the rows' span, then gathered
        assert col.shape == (rows,) and col[1234] == torch.tensor(row[7])
        assert _rchar() - before <= rows * cols * 4 + 8192


def test_get_slice_of_columns_reads_the_runs_as_one_batch(tmp):
    """Columns of a matrix with 32 KiB rows: runs far apart, read as one batch of ranges
    (not the span), byte-exact, verified or not, on any dimension's slice."""
    g = torch.Generator().manual_seed(3)
    t = {"w": torch.randn(96, 8192, generator=g), "h": torch.randn(5, 7, 2048, generator=g)}
    p = os.path.join(tmp, "cols.safetensors")
    ft.save_file(t, p)
    for verify in (False, True):
        with ft.safe_open(p, framework="pt", verify=verify) as f:
            s = f.get_slice("w")
            s[0]  # AUTO's first decisions on this file, outside the count
            before = _rchar()
            got = s[:, 1000:1010]
            read = _rchar() - before
            assert torch.equal(got, t["w"][:, 1000:1010].contiguous())
            if not verify:  # the 96 runs' pages at most, not the 3 MiB span
                assert read <= 96 * 2 * 4096, read
            for key in ((slice(3, 90, 5), slice(17, 8000, 999)), (..., 4095),
                        (slice(None), slice(8191, None))):
                assert torch.equal(s[key], t["w"][key].contiguous()), key
            h = f.get_slice("h")
            assert torch.equal(h[1:4, ::3, 2047:], t["h"][1:4, ::3, 2047:].contiguous())


def test_shared_and_overlapping_tensors_are_refused_as_safetensors_does(tmp):
    x = torch.randn(4, 5)
    p = os.path.join(tmp, "shared.safetensors")
    for bad in ({"a": x, "b": x}, {"a": x, "b": x[0]}, {"a": x[1:3], "b": x[2:4]}):
        with pytest.raises(RuntimeError) as theirs:
            st.save_file(bad, p)
        with pytest.raises(RuntimeError) as ours:
            ft.save_file(bad, p)
        assert "Some tensors share memory" in str(ours.value) and "save_model" in str(ours.value)
        assert "Some tensors share memory" in str(theirs.value)
        with pytest.raises(RuntimeError):
            ft.save(bad)
        with pytest.raises(RuntimeError):
            ft.save_file_async(bad, p)
        assert not os.path.exists(p)
    ft.save_file({"a": x[0], "b": x[1]}, p)  # parts of one storage that do not overlap
    back = ft.load_file(p)
    assert same(back["a"], x[0]) and same(back["b"], x[1])


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight
        self.norm = torch.nn.BatchNorm1d(4)


def test_save_model_load_model_cross_read(tmp):
    torch.manual_seed(1)
    m = Tied()
    m.norm.running_mean.add_(2)
    for save, load in ((st.save_model, ft.load_model), (ft.save_model, st.load_model),
                       (ft.save_model, ft.load_model)):
        p = os.path.join(tmp, f"{save.__module__}-{load.__module__}.safetensors")
        save(m, p)
        m2 = Tied()
        assert load(m2, p) == ([], []) or tuple(map(list, load(m2, p))) == ([], [])
        for k, v in m.state_dict().items():
            assert torch.equal(m2.state_dict()[k], v), (save.__module__, k)
    # the same answers as safetensors for a model that does not match the file
    p = os.path.join(tmp, "partial.safetensors")
    st.save_file({"emb.weight": m.emb.weight.detach().clone(), "extra": torch.zeros(1)}, p)
    ours = ft.load_model(Tied(), p, strict=False)
    theirs = st.load_model(Tied(), p, strict=False)
    assert sorted(ours[0]) == sorted(theirs[0]) and sorted(ours[1]) == sorted(theirs[1])
    with pytest.raises(RuntimeError, match="Missing key"):
        ft.load_model(Tied(), p)
    # positional arguments as safetensors takes them
    ft.save_model(m, p, {"note": "x"}, True)
    assert ft.load_model(Tied(), p, True, "cpu") == ([], [])


def test_save_and_load_bytes(tmp):
    # safetensors' load() of bytes knows fewer dtypes than its load_file (no F4, F8_E8M0)
    lacks = {getattr(torch, n, None) for n in ("float4_e2m1fn_x2", "float8_e8m0fnu")}
    t = {k: v for k, v in sample_tensors().items() if v.dtype not in lacks}
    assert same(ft.load(ft.save(sample_tensors()))["m5"], sample_tensors()["m5"])
    for data in (ft.save(t, metadata={"a": "b"}), st.save(t)):
        for back in (ft.load(data), st.load(data)):
            assert set(back) == set(t) and all(same(back[k], t[k]) for k in t)
    with pytest.raises(ValueError):
        ft.load(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":")


def test_load_file_names_and_metadata_as_given(tmp):
    t = {"a": torch.randn(3, 3), "b": torch.arange(4), "c": torch.ones(2)}
    p = os.path.join(tmp, "sub.safetensors")
    ft.save_file(t, p)
    got = ft.load_file(p, names=["c", "a"])
    assert set(got) == {"a", "c"} and same(got["a"], t["a"]) and same(got["c"], t["c"])
    with pytest.raises(KeyError, match="'zz'"):
        ft.load_file(p, names=["a", "zz"])
    with fastensor.safe_open(p, framework="pt") as f:
        assert f.metadata() is None  # nothing added to what the caller saved
    with safetensors.safe_open(p, framework="pt") as f:  # (ours are fastensor.* keys)
        assert not [k for k in f.metadata() if not k.startswith("fastensor.")]
    ft.save_file(t, p, metadata={"format": "np"})
    with safetensors.safe_open(p, framework="pt") as f:
        assert f.metadata()["format"] == "np"
    for bad in ({"k": 1}, {1: "v"}, ["k"]):  # str -> str only, as safetensors takes it
        with pytest.raises(TypeError):
            ft.save_file(t, p, metadata=bad)
        with pytest.raises(TypeError):
            st.save_file(t, p, metadata=bad)


def test_packed_float_types(tmp):
    """F4 and F6 tensors (written by hand): shapes and bytes survive; F6 comes as raw bytes."""
    data = bytes(range(24))
    header = {"f4": {"dtype": "F4", "shape": [4, 6], "data_offsets": [0, 12]},
              "f6": {"dtype": "F6_E2M3", "shape": [16], "data_offsets": [12, 24]}}
    text = json.dumps(header).encode()
    p = os.path.join(tmp, "packed.safetensors")
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    info = fastensor.inspect(p)
    assert {k: t["dtype"] for k, t in info["tensors"].items()} == {"f4": "F4", "f6": "F6_E2M3"}
    back = ft.load_file(p)
    assert raw_bytes(back["f6"]) == data[12:] and back["f6"].dtype == torch.uint8
    assert raw_bytes(back["f4"]) == data[:12]
    if hasattr(torch, "float4_e2m1fn_x2"):
        assert back["f4"].dtype == torch.float4_e2m1fn_x2 and tuple(back["f4"].shape) == (4, 3)
        theirs = st.load_file(p) if "F4" in getattr(st, "_TYPES", {"F4": 1}) else None
        if theirs is not None:
            assert raw_bytes(theirs["f4"]) == data[:12]


def test_transformers_files_both_ways(tmp):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    d = os.path.join(tmp, "hf")
    model.save_pretrained(d, max_shard_size="20KB")  # sharded, with an index
    assert os.path.exists(os.path.join(d, "model.safetensors.index.json"))
    state = model.state_dict()
    ours = ft.load_file(d)
    assert ours and all(same(ours[k], state[k]) for k in ours)
    with fastensor.safe_open(os.path.join(d, "model.safetensors.index.json"), "pt") as f:
        assert sorted(ours) == f.keys()
        assert all(same(f.get_tensor(k), state[k]) for k in f.keys())
    # our save of the same tensors, loaded by from_pretrained
    d2 = os.path.join(tmp, "ours")
    os.makedirs(d2)
    cfg.save_pretrained(d2)
    ft.save_file({k: v.detach().clone() for k, v in ours.items()},
                 os.path.join(d2, "model.safetensors"))
    back = transformers.LlamaForCausalLM.from_pretrained(d2)
    for k, v in back.state_dict().items():
        assert same(v, state[k]), k


def test_files_that_are_not_safetensors_say_what_they_are(tmp):
    import pickle
    pt, pk = os.path.join(tmp, "m.pt"), os.path.join(tmp, "m.pkl")
    torch.save({"a": torch.zeros(3)}, pt)
    with open(pk, "wb") as f:
        pickle.dump({"a": 1}, f, protocol=2)
    with pytest.raises(ValueError, match="zip archive: torch.save"):
        ft.load_file(pt)
    with pytest.raises(ValueError, match="Python pickle"):
        fastensor.safe_open(pk, "pt")
    good = os.path.join(tmp, "good.safetensors")
    ft.save_file({"a": torch.randn(50000)}, good)
    with open(good, "rb") as f:
        data = f.read()
    cut = os.path.join(tmp, "cut.safetensors")
    for n, says in ((100, r"truncated: its header needs \d+ bytes, the file holds 100"),
                    (len(data) - 10, r"truncated: .* 200000 bytes of tensor data, .*10 missing")):
        with open(cut, "wb") as f:
            f.write(data[:n])
        with pytest.raises(ValueError, match=says):
            ft.load_file(cut)


def test_verify_without_checksums_checks_structure(tmp):
    import subprocess
    theirs = os.path.join(tmp, "theirs.safetensors")
    st.save_file({"a": torch.randn(10)}, theirs)
    assert fastensor.verify(theirs) is False
    ours = os.path.join(tmp, "ours.safetensors")
    ft.save_file({"a": torch.randn(10)}, ours)
    assert fastensor.verify(ours) is True
    cli = os.path.join(os.path.dirname(__file__), "..", "..", os.environ.get("BUILD", "build"),
                       "fastensor")
    if not os.path.exists(cli):
        pytest.skip(f"the CLI is not built ({cli})")
    r = subprocess.run([cli, "verify", theirs], capture_output=True, text=True)
    assert r.returncode == 0 and "structure valid" in r.stdout and "no fastensor checksums" in r.stdout
    r = subprocess.run([cli, "verify", "--require-checksums", theirs], capture_output=True,
                       text=True)
    assert r.returncode == 1 and r.stdout.startswith("FAIL")


def test_save_file_async_is_a_future_and_reuses_its_snapshot_memory(tmp):
    import concurrent.futures
    t = {"w": torch.randn(1 << 18), "b": torch.arange(7)}
    p = os.path.join(tmp, "a.safetensors")
    seen = []
    fut = ft.save_file_async(t, p, metadata={"step": "1"})
    assert isinstance(fut, concurrent.futures.Future) and fut.blocked_seconds >= 0
    fut.add_done_callback(lambda f: seen.append(f.exception()))
    t["w"].zero_()  # the snapshot was taken when the call returned
    assert fut.result(timeout=60) is None and fut.done() and fut.exception() is None
    assert seen == [None]
    back = ft.load_file(p)
    assert torch.count_nonzero(back["w"]) > 0 and torch.equal(back["b"], torch.arange(7))
    free = list(ft._snapshots._free)
    assert free and free[0][0].numel() >= (1 << 20)  # kept for the next save
    ft.save_file_async(t, p).result()
    assert ft._snapshots._free[0][0].data_ptr() == free[0][0].data_ptr()  # and reused
    ft.release_snapshot_memory()
    assert not ft._snapshots._free
    bad = ft.save_file_async(t, os.path.join(tmp, "missing-dir", "x.safetensors"))
    assert isinstance(bad.exception(timeout=60), FileNotFoundError)
    assert not [f for f in os.listdir(tmp) if "tmp" in f]


def test_save_file_async_snapshot_modes(tmp):
    t = {"w": torch.randn(1000), "e": torch.empty(0, 3)}
    p = os.path.join(tmp, "m.safetensors")
    with pytest.raises(ValueError, match="snapshot must be"):
        ft.save_file_async(t, p, snapshot="gpu")
    assert not os.path.exists(p)
    fut = ft.save_file_async(t, p, snapshot="device")  # host tensors: a host snapshot
    assert fut.snapshot == "host" and fut.result(timeout=60) is None
    back = ft.load_file(p)
    assert torch.equal(back["w"], t["w"]) and back["e"].shape == (0, 3)
    # "none": no snapshot memory taken, the caller's tensors saved as they are
    ft.release_snapshot_memory()
    big = {"w": torch.randn(1 << 20), "i": torch.arange(5)}
    fut = ft.save_file_async(big, p, snapshot="none")
    assert fut.snapshot == "none" and fut.result(timeout=60) is None
    assert not ft._snapshots._free  # no buffer was taken (or given back)
    back = ft.load_file(p)
    assert torch.equal(back["w"], big["w"]) and torch.equal(back["i"], big["i"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", ["auto", "device", "host"])
def test_save_file_async_device_snapshot(tmp, mode):
    ft.release_snapshot_memory()
    g = torch.Generator(device="cuda").manual_seed(5)
    t = {f"l{i}": torch.randn(1000 + i, 17, device="cuda", generator=g) for i in range(9)}
    t["z"] = torch.empty(0, device="cuda")
    t["h"] = torch.arange(11, device="cuda", dtype=torch.int16)
    want = {k: v.cpu() for k, v in t.items()}
    p = os.path.join(tmp, f"d-{mode}.safetensors")
    fut = ft.save_file_async(t, p, snapshot=mode)
    assert fut.snapshot == ("host" if mode == "host" else "device")
    for v in t.values():  # the snapshot was taken when the call returned
        v.zero_()
    assert fut.result(timeout=120) is None
    back = ft.load_file(p)
    assert set(back) == set(want) and all(torch.equal(back[k], want[k]) for k in want)
    assert ft._snapshots.has(sum(v.numel() * v.element_size() for v in want.values()), True)
    fut = ft.save_file_async(t, p)  # a pinned buffer of the size is kept now: host
    assert fut.snapshot == "host" and fut.result(timeout=120) is None
    ft.release_snapshot_memory()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_save_file_async_snapshot_respects_the_memory_fraction(tmp):
    """Under set_per_process_memory_fraction, a state dict the cap leaves no room to copy on
    the device is snapshotted on the host, and saved."""
    ft.release_snapshot_memory()
    total = torch.cuda.get_device_properties(0).total_memory
    before = torch.cuda.get_per_process_memory_fraction(0) \
        if hasattr(torch.cuda, "get_per_process_memory_fraction") else 1.0
    t = {"w": torch.randn(256 << 10, 256, device="cuda")}  # 256 MiB
    torch.cuda.synchronize()
    cap = torch.cuda.memory_reserved(0) + (128 << 20)  # no room for a copy on the device
    try:
        torch.cuda.set_per_process_memory_fraction(min(cap / total, 1.0), 0)
        p = os.path.join(tmp, "capped.safetensors")
        fut = ft.save_file_async(t, p)
        assert fut.snapshot == "host" and fut.result(timeout=120) is None
        assert torch.equal(ft.load_file(p)["w"], t["w"].cpu())
    finally:
        torch.cuda.set_per_process_memory_fraction(before, 0)
        ft.release_snapshot_memory()


def test_async_save_running_at_exit_is_finished(tmp):
    import subprocess
    import sys
    p = os.path.join(tmp, "exit.safetensors")
    code = ("import torch, fastensor.torch as ft\n"
            f"ft.save_file_async({{'w': torch.ones(1 << 26)}}, {p!r})\n")  # 256 MiB, then exit
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, FASTENSOR_QUIET="1"), timeout=300)
    assert r.returncode == 0, r.stderr
    back = ft.load_file(p)
    assert back["w"].numel() == 1 << 26 and bool((back["w"] == 1).all())
    assert not [f for f in os.listdir(tmp) if "tmp" in f]
    if "finishing" not in r.stderr:  # the save ended before the interpreter did
        pytest.skip("the save finished before exit; nothing to finish")
    assert "finishing 1 checkpoint save(s) still running at exit" in r.stderr
