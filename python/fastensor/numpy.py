"""NumPy layer: ``save_file`` / ``load_file`` for ``dict[str, numpy.ndarray]``, safetensors
files (the same API as ``safetensors.numpy``)."""
from __future__ import annotations

import numpy as np

from . import _ckpt, _fst, _st

_TO_ST = {np.dtype(np.bool_): "BOOL", np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8",
          np.dtype(np.uint16): "U16", np.dtype(np.int16): "I16", np.dtype(np.float16): "F16",
          np.dtype(np.uint32): "U32", np.dtype(np.int32): "I32", np.dtype(np.float32): "F32",
          np.dtype(np.uint64): "U64", np.dtype(np.int64): "I64", np.dtype(np.float64): "F64",
          np.dtype(np.complex64): "C64"}
_FROM_ST = {v: k for k, v in _TO_ST.items()}


def _prepare(tensors):
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, np.ndarray] but received {type(tensors)}")
    items, keep = [], []
    for name, arr in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, not {type(name).__name__}")
        if not isinstance(arr, np.ndarray):
            raise ValueError(f"Key `{name}` is invalid, expected np.ndarray but received "
                             f"{type(arr)}")
        dt = arr.dtype.newbyteorder("=") if arr.dtype.byteorder not in "=|" else arr.dtype
        if dt not in _TO_ST:
            raise ValueError(f"{name!r}: dtype {arr.dtype} has no safetensors equivalent")
        a = arr.astype(dt.newbyteorder("<"), copy=False)
        if not a.flags.c_contiguous:  # (ascontiguousarray would turn 0-d into 1-d)
            a = a.copy(order="C")
        keep.append(a)
        items.append((name, _TO_ST[dt], tuple(int(s) for s in a.shape), a.ctypes.data,
                      a.nbytes))
    return items, keep


def save_file(tensors: dict, filename, metadata: dict | None = None, *, engine: str = "auto",
              shard_size: int | None = None, cache: str = "auto",
              compression: str = "auto") -> None:
    """Save arrays as a safetensors file (atomic, durable, checksummed; sharded above
    ``shard_size`` bytes; ``cache`` as in :func:`fastensor.torch.save_file`), or as a
    compressed container for a name ending in ``.fst`` (``compression`` "auto", "always" or
    "none", as in :func:`fastensor.torch.save_file`)."""
    _fst.compression_id(compression)
    _st.layout([], metadata)  # (metadata: str -> str, as safetensors takes it)
    items, keep = _prepare(tensors)
    if str(filename).endswith(_fst.SUFFIX):
        if shard_size is not None:
            raise ValueError("a .fst container is one file: shard_size does not apply")
        _fst.save(filename, items, metadata, compression=compression, engine=engine,
                  cache=cache)
    else:
        _ckpt.save(filename, items, metadata, engine=engine, shard_size=shard_size,
                   cache=cache)
    del keep


def save(tensors: dict, metadata: dict | None = None) -> bytes:
    """The safetensors bytes of ``tensors``, the same bytes ``safetensors.numpy.save`` gives
    (big-endian arrays stored little-endian)."""
    items, keep = _prepare(tensors)
    out = _st.pack(items, metadata)
    del keep
    return out


def load(data: bytes) -> dict:
    """Arrays of safetensors bytes (as ``safetensors.numpy.load``), validated as a file is
    (SafetensorError naming what is wrong): they live in memory of their own."""
    return _st.in_memory(data, lambda p: load_file(p, mmap=False))


def load_file(filename, *, backend: str = "mmap", engine: str = "auto", verify: bool = False,
              mmap=None, cache: str = "auto") -> dict:
    """Load a safetensors file, index or directory into numpy arrays (views into one buffer
    per shard; a shard in the page cache is mapped instead of read, as in
    :func:`fastensor.torch.load_file`, whose ``backend``, ``mmap`` and ``cache`` these
    are)."""
    if _st.check_backend(backend) == "pread" and mmap is None:
        mmap = False
    opened = _ckpt.open_checkpoint(filename)
    if _ckpt.is_container(opened):
        c = _fst.Container(filename, engine=engine, cache=cache, opened=opened)
        for x in c.entries:
            if _FROM_ST.get(x.dtype) is None:
                raise ValueError(f"{x.name!r}: dtype {x.dtype} has no numpy equivalent")
        buf = np.empty(max(c.size, 1), dtype=np.uint8)
        c.load(buf.ctypes.data, verify=verify)  # (the decoded layout: views of one buffer)
        return {x.name: np.ndarray(x.shape, dtype=_FROM_ST[x.dtype].newbyteorder("<"),
                                   buffer=buf, offset=x.begin) for x in c.entries}
    ck, tensors, _, shards = opened
    bufs = []
    for k, info in enumerate(shards):
        size = info[1]
        mapped = _ckpt.mapped_shard(ck, k, info, engine=engine, verify=verify, mmap=mmap,
                                    cache=cache)
        if mapped is not None:
            bufs.append(np.frombuffer(mapped, dtype=np.uint8, count=size, offset=info[2]))
            continue
        buf = np.empty(max(size, 1), dtype=np.uint8)
        _ckpt.load_shard(ck, k, buf.ctypes.data, size, engine=engine, verify=verify,
                         cache=cache)
        bufs.append(buf)
    out = {}
    for name, dtype, shape, nbytes, shard, off in tensors:
        dt = _FROM_ST.get(dtype)
        if dt is None:
            raise ValueError(f"{name!r}: dtype {dtype} has no numpy equivalent")
        out[name] = np.ndarray(shape, dtype=dt.newbyteorder("<"), buffer=bufs[shard], offset=off)
    return out


class _Arrays:
    """How :class:`fastensor._safe.SafeOpen` makes numpy arrays (host memory only)."""

    torch_indexing = False  # get_slice takes safetensors' strict indexing

    @staticmethod
    def device(device):
        if str(device) != "cpu":
            raise ValueError(f"device {device!r}: numpy arrays live on the CPU")
        return "cpu"

    @staticmethod
    def is_host(device):
        return True

    @staticmethod
    def frombuffer(mapped, start, size):
        return np.frombuffer(mapped, dtype=np.uint8, count=size, offset=start) if size \
            else np.empty(1, dtype=np.uint8)

    @staticmethod
    def view(buf, dtype_name, shape, nbytes, off):
        if dtype_name in ("F4", "F6_E2M3", "F6_E3M2"):
            return buf[off:off + nbytes]
        dt = _FROM_ST.get(dtype_name)
        if dt is None:
            raise ValueError(f"dtype {dtype_name} has no numpy equivalent")
        if off % dt.itemsize:  # a foreign file's unaligned tensor: a copy of its own
            return buf[off:off + nbytes].copy().view(dt.newbyteorder("<")).reshape(shape)
        return np.ndarray(shape, dtype=dt.newbyteorder("<"), buffer=buf, offset=off)

    @staticmethod
    def empty(dtype_name, shape, nbytes, device):
        buf = np.empty(max(nbytes, 1), dtype=np.uint8)
        return buf, buf.ctypes.data, None, 0

    @staticmethod
    def window_room(device, most):
        return most

    @staticmethod
    def follow(buf, stream, device):
        pass  # host memory: reads are done when they return

    @staticmethod
    def finish(buf, dtype_name, shape):
        n = buf.size if int(np.prod(shape)) else 0
        return _Arrays.view(buf, dtype_name, shape, n, 0)

    @staticmethod
    def gather(out, span, runs):
        for off, n, at in runs:
            out[at:at + n] = span[off:off + n]

    @staticmethod
    def select(part, rel, device):
        return np.ascontiguousarray(part[rel]) if part[rel].ndim else part[rel].copy()


def safe_open(filename, framework: str = "np", device="cpu", *, backend: str = "mmap",
              engine: str = "auto", verify: bool = False, cache: str = "auto"):
    """``safe_open`` for numpy arrays (see :func:`fastensor.torch.safe_open`)."""
    if framework not in ("np", "numpy"):
        raise _st.SafetensorValueError(f"framework {framework!r}: fastensor.numpy.safe_open "
                                       "serves \"np\"")
    _st.check_backend(backend)
    opened = _ckpt.open_checkpoint(filename)
    if _ckpt.is_container(opened):
        return _fst.FstOpen(filename, _Arrays, device, engine=engine, verify=verify,
                            cache=cache, opened=opened)
    from ._safe import SafeOpen
    return SafeOpen(filename, _Arrays, device, engine=engine, verify=verify, cache=cache,
                    backend=backend, opened=opened)


__all__ = ["save_file", "load_file", "safe_open", "save", "load"]
