import os

import numpy as np
import pytest

import fastensor
import fastensor.numpy as fnp
import st_reader

ALL = [np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.float16, np.uint32, np.int32,
       np.float32, np.uint64, np.int64, np.float64, np.complex64]


def _random(dtype, shape, rng):
    a = rng.integers(0, 255, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    return a.view(dtype).reshape(shape) if dtype != np.bool_ else (a % 2).astype(np.bool_).reshape(shape)


def test_round_trip_every_dtype_and_edge_shapes(tmp):
    rng = np.random.default_rng(1)
    arrays = {}
    for i, dt in enumerate(ALL):
        arrays[f"a{i}"] = _random(dt, (3, 5), rng)
        arrays[f"s{i}"] = _random(dt, (), rng)          # 0-dim
        arrays[f"e{i}"] = np.zeros((0, 4), dtype=dt)     # empty
    arrays["t"] = np.arange(12, dtype=np.float32).reshape(3, 4).T  # non-contiguous
    p = os.path.join(tmp, "np.safetensors")
    fnp.save_file(arrays, p, metadata={"k": "v"})
    back = fnp.load_file(p, verify=True)
    assert set(back) == set(arrays)
    for k, a in arrays.items():
        assert back[k].dtype == a.dtype and back[k].shape == a.shape, k
        assert back[k].tobytes() == np.ascontiguousarray(a).tobytes(), k  # NaNs included
    # an independent reader agrees, byte for byte
    header, start, raw = st_reader.read(p)
    assert start % 4096 == 0
    assert header["__metadata__"]["k"] == "v"
    for k, a in arrays.items():
        assert raw[k][2] == np.ascontiguousarray(a).tobytes(), k


def test_bad_input(tmp):
    p = os.path.join(tmp, "bad.safetensors")
    with pytest.raises(ValueError, match="expected np.ndarray"):  # safetensors' words
        fnp.save_file({"x": [1, 2]}, p)
    with pytest.raises(ValueError):
        fnp.save_file({"x": np.array(["a"])}, p)
    assert not os.path.exists(p)
    with pytest.raises(FileNotFoundError) as e:
        fnp.load_file(os.path.join(tmp, "missing.safetensors"))
    assert "missing.safetensors" in str(e.value)


def test_sharded_round_trip(tmp):
    rng = np.random.default_rng(2)
    arrays = {f"w{i}": rng.standard_normal((256, 300)).astype(np.float32) for i in range(12)}
    p = os.path.join(tmp, "model.safetensors")
    fnp.save_file(arrays, p, shard_size=1 << 20)
    idx = p + ".index.json"
    assert os.path.exists(idx)
    for src in (idx, tmp):
        back = fnp.load_file(src)
        for k, a in arrays.items():
            assert np.array_equal(back[k], a)
    fastensor.verify(idx)


def test_cached_shards_are_mapped_copy_on_write(tmp):
    rng = np.random.default_rng(3)
    arrays = {"a": rng.standard_normal((256, 1000)).astype(np.float32),
              "b": rng.integers(0, 1 << 30, size=17, dtype=np.int64)}
    p = os.path.join(tmp, "m.safetensors")
    fnp.save_file(arrays, p)
    with open(p, "rb") as f:  # into the page cache
        while f.read(1 << 20):
            pass
    back = fnp.load_file(p)
    with open("/proc/self/maps") as f:
        assert os.path.realpath(p) in f.read()
    assert all(np.array_equal(back[k], v) for k, v in arrays.items())
    assert back["a"].flags.writeable
    back["a"][:] = 0  # copy on write: the file keeps its bytes
    again = fnp.load_file(p, mmap=False)
    assert all(np.array_equal(again[k], v) for k, v in arrays.items())
