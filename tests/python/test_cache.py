"""The cache modes from Python: what a save or a load leaves in the page cache."""
import os

import numpy as np
import pytest

import fastensor
import fastensor.numpy as fnp
from fastensor import _C, _ckpt


def _arrays(seed, mib=8):
    rng = np.random.default_rng(seed)
    return {"w": rng.integers(0, 255, size=mib << 20, dtype=np.uint8),
            "b": rng.integers(0, 255, size=4099, dtype=np.uint8)}


def _cached(path):
    ck, _, _, _ = _ckpt.open_checkpoint(path)
    return _C.ckpt_shard_cached(ck, 0)


def _evict(path):
    fd = os.open(path, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


@pytest.mark.parametrize("cache, left", [("keep", True), ("bypass", False)])
def test_save_cache_mode(tmp, cache, left):
    p = os.path.join(tmp, f"save-{cache}.safetensors")
    fnp.save_file(_arrays(1), p, cache=cache)
    assert _cached(p) == left


@pytest.mark.parametrize("cache, left", [("keep", True), ("bypass", False), ("auto", True)])
def test_load_cache_mode(tmp, cache, left):
    a = _arrays(2)
    p = os.path.join(tmp, f"load-{cache}.safetensors")
    fnp.save_file(a, p)
    _evict(p)
    back = fnp.load_file(p, cache=cache)
    for k in a:
        assert np.array_equal(back[k], a[k])
    assert _cached(p) == left


@pytest.mark.parametrize("per_call", [False, True])
def test_file_cache_mode(tmp, per_call):
    p = os.path.join(tmp, "raw.safetensors")
    fnp.save_file(_arrays(3, 4), p)
    out = np.empty(os.path.getsize(p), dtype=np.uint8)
    with open(p, "rb") as f:
        want = f.read()
    for cache, left in (("bypass", False), ("keep", True)):
        _evict(p)
        with fastensor.File(p, "r", cache="auto" if per_call else cache) as f:
            n = f.read_into(out, cache=cache) if per_call else f.read_into(out)
        assert n == out.nbytes
        assert _cached(p) == left
        assert out.tobytes() == want


def test_bad_cache_name_changes_nothing(tmp):
    p = os.path.join(tmp, "bad.safetensors")
    fnp.save_file(_arrays(4, 1), p)
    before = open(p, "rb").read()
    with pytest.raises(ValueError, match="cache mode"):
        fnp.save_file(_arrays(5, 1), p, cache="sometimes")
    with pytest.raises(ValueError, match="cache mode"):
        fnp.load_file(p, cache="never")
    with pytest.raises(ValueError, match="cache mode"):
        fastensor.File(p, "r", cache="maybe")
    assert open(p, "rb").read() == before
