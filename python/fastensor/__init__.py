"""fastensor: fast tensor I/O between files and memory.

- ``fastensor.torch``: ``save_file`` / ``load_file`` (safetensors-compatible, drop-in for
  ``safetensors.torch``), ``save_file_async``, ``save_model`` / ``load_model``.
- ``fastensor.numpy``: the same for ``dict[str, numpy.ndarray]``.
- ``fastensor.torch.offload_activations``: saved activations offloaded to SSD during the
  forward pass and prefetched back for the backward pass.
- ``fastensor.SpillStore``: the spill store under it (put/get/prefetch/drop of tensors).
- ``fastensor.File``: the raw tensor interface: ``write(tensor, offset)``,
  ``read_into(tensor, offset)`` and their ``*_async`` variants, with any engine.

Settings come from ``FASTENSOR_*`` environment variables or :func:`configure`.
"""
from __future__ import annotations

import os
import threading

from . import _C

__version__ = "0.1.0"
ENGINES = _C.ENGINES  # the library's engines (ft_engine_name), "auto" first

_ctx_lock = threading.Lock()
_ctx = None
_ctx_settings: dict = {}


def configure(*, threads: int = 0, chunk_size: int = 0, queue_depth: int = 0,
              bounce_size: int = 0, engine: str | None = None) -> None:
    """Replace the shared context's settings (0 / None: default or FASTENSOR_* variable).

    Takes effect for operations started afterwards.
    """
    global _ctx, _ctx_settings
    with _ctx_lock:
        _ctx_settings = dict(threads=threads, chunk_size=chunk_size, queue_depth=queue_depth,
                             bounce_size=bounce_size,
                             engine=-1 if engine is None else engine_id(engine))
        _ctx = None


def context():
    """The process-wide library context (created on first use)."""
    global _ctx
    with _ctx_lock:
        if _ctx is None:
            s = _ctx_settings
            _ctx = _C.ctx_create(s.get("threads", 0), s.get("chunk_size", 0),
                                 s.get("queue_depth", 0), s.get("bounce_size", 0),
                                 s.get("engine", -1))
        return _ctx


def engine_id(name: str) -> int:
    """The library's number for an engine name; ValueError for an unknown one."""
    if not isinstance(name, str):
        raise TypeError(f"engine must be a str, not {type(name).__name__}")
    return _C.engine_id(name)


def cache_id(name: str) -> int:
    """The library's number for a cache mode: "auto" (decide per call: keep data that fits
    in the page cache there, read larger data around it), "keep" or "bypass"."""
    if not isinstance(name, str):
        raise TypeError(f"cache must be a str, not {type(name).__name__}")
    return _C.cache_id(name)


def _memory(obj, writable: bool):
    """(address, nbytes, keepalive, kind, device, stream) of a contiguous tensor (CPU or
    CUDA: kind 1, the current stream), ndarray or buffer."""
    mod = type(obj).__module__
    if mod.startswith("torch"):
        if not obj.is_contiguous():
            raise ValueError("tensor must be contiguous (call .contiguous() first)")
        n = obj.numel() * obj.element_size()
        if obj.device.type == "cuda":
            import torch
            stream = torch.cuda.current_stream(obj.device).cuda_stream
            return obj.data_ptr(), n, obj, 1, obj.device.index or 0, stream
        if obj.device.type != "cpu":
            raise ValueError(f"tensor on {obj.device}: host or CUDA memory only")
        return obj.data_ptr(), n, obj, 0, 0, 0
    import numpy as np
    arr = obj if isinstance(obj, np.ndarray) else np.frombuffer(obj, dtype=np.uint8)
    if not arr.flags.c_contiguous:
        raise ValueError("array must be C-contiguous")
    if writable and not arr.flags.writeable:
        raise ValueError("array is read-only")
    return arr.ctypes.data, arr.nbytes, (obj, arr), 0, 0, 0


class Request:
    """An asynchronous transfer started by :meth:`File.write_async` / :meth:`File.read_into_async`.

    The memory must not be touched until :meth:`wait` returns.
    """

    def __init__(self, handle, keepalive, file):
        self._handle = handle
        self._keep = keepalive
        self._file = file
        self._result = None

    def done(self) -> bool:
        """True once the transfer has finished (wait() then returns at once)."""
        return self._result is not None or _C.req_poll(self._handle)

    def wait(self) -> int:
        """Wait; return the bytes transferred or raise OSError like the synchronous call."""
        if self._result is None:
            self._result = _C.req_wait(self._handle)
            self._keep = None
        return self._result

    result = wait


class File:
    """A file for raw tensor transfers at chosen offsets (the paper's unified interface).

    ``mode``: "r" (read), "r+" (read/write), "w" (create or truncate, read/write),
    "x" (create, fail if it exists). ``engine``: default engine for this file's calls;
    ``cache``: what engine auto leaves in the page cache ("auto", "keep", "bypass"; see
    :func:`cache_id`), the default for this file's calls.
    """

    _MODES = {"r": _C.OPEN_READ,
              "r+": _C.OPEN_READ | _C.OPEN_WRITE,
              "w": _C.OPEN_READ | _C.OPEN_WRITE | _C.OPEN_CREATE | _C.OPEN_TRUNC,
              "x": _C.OPEN_READ | _C.OPEN_WRITE | _C.OPEN_CREATE | _C.OPEN_EXCL}

    def __init__(self, path, mode: str = "r", *, engine: str = "auto", cache: str = "auto"):
        if mode not in self._MODES:
            raise ValueError(f"mode must be one of {sorted(self._MODES)}, not {mode!r}")
        self.path = os.fspath(path)
        self.mode = mode
        self._engine = engine_id(engine)
        self._cache = cache_id(cache)
        self._handle = _C.file_open(context(), self.path, self._MODES[mode], 0o644)

    def _eng(self, engine):
        return self._engine if engine is None else engine_id(engine)

    def _cac(self, cache):
        return self._cache if cache is None else cache_id(cache)

    @staticmethod
    def _sync_flags(sync):
        """True: durable on return; "later": the caller will call sync() (engine auto then
        weighs each engine with its share of that sync); False: neither."""
        if sync == "later":
            return _C.IO_SYNC_LATER
        if isinstance(sync, bool):
            return _C.IO_SYNC if sync else 0
        raise ValueError(f"sync must be True, False or 'later', not {sync!r}")

    def write(self, tensor, offset: int = 0, *, engine: str | None = None,
              sync: bool | str = False, cache: str | None = None) -> int:
        """Write the tensor's bytes at ``offset``; with ``sync`` they are durable on return
        (``sync="later"``: you will call ``sync()`` before counting them durable)."""
        flags = self._sync_flags(sync)
        addr, n, keep, kind, dev, stream = _memory(tensor, writable=False)
        r = _C.file_io(self._handle, addr, n, offset, self._eng(engine), flags, True, kind, dev,
                       stream, self._cac(cache))
        del keep
        return r

    def read_into(self, tensor, offset: int = 0, *, engine: str | None = None,
                  cache: str | None = None) -> int:
        """Fill the tensor from ``offset``; returns bytes read (fewer at end of file)."""
        addr, n, keep, kind, dev, stream = _memory(tensor, writable=True)
        r = _C.file_io(self._handle, addr, n, offset, self._eng(engine), 0, False, kind, dev,
                       stream, self._cac(cache))
        del keep
        return r

    def write_async(self, tensor, offset: int = 0, *, engine: str | None = None,
                    sync: bool | str = False, cache: str | None = None) -> Request:
        flags = self._sync_flags(sync)
        addr, n, keep, kind, dev, stream = _memory(tensor, writable=False)
        return Request(_C.file_submit(self._handle, addr, n, offset, self._eng(engine), flags,
                                      True, kind, dev, stream, self._cac(cache)), keep, self)

    def read_into_async(self, tensor, offset: int = 0, *, engine: str | None = None,
                        cache: str | None = None) -> Request:
        addr, n, keep, kind, dev, stream = _memory(tensor, writable=True)
        return Request(_C.file_submit(self._handle, addr, n, offset, self._eng(engine), 0,
                                      False, kind, dev, stream, self._cac(cache)), keep, self)

    def write_batch(self, items, *, engine: str | None = None, sync: bool = False) -> list:
        """Write many tensors in one call: ``items`` is a list of (tensor, offset). They run
        in parallel (cuFile's batch API with engine "cufile" under GPUDirect Storage); with
        ``sync`` all are durable on return. If one item is invalid nothing is written.
        Returns the bytes written per item."""
        return self._batch(items, engine, _C.IO_SYNC if sync else 0, True)

    def read_batch(self, items, *, engine: str | None = None) -> list:
        """Fill many tensors in one call: ``items`` is a list of (tensor, offset). Returns
        the bytes read per item (fewer at end of file)."""
        return self._batch(items, engine, 0, False)

    def _batch(self, items, engine, flags, write):
        ops, keep, stream = [], [], 0
        for item in items:
            try:
                tensor, offset = item
            except (TypeError, ValueError):
                raise TypeError("batch items must be (tensor, offset) pairs") from None
            addr, n, k, kind, dev, s = _memory(tensor, writable=not write)
            ops.append((addr, n, offset, kind, dev))
            keep.append(k)
            stream = stream or s
        r = _C.file_batch(self._handle, ops, self._eng(engine), flags, write, stream,
                          self._cache)
        del keep
        return r

    def size(self) -> int:
        return _C.file_size(self._handle)

    def sync(self) -> None:
        """Make written data durable (fdatasync)."""
        _C.file_sync(self._handle)

    def close(self) -> None:
        _C.file_close(self._handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def inspect(path) -> dict:
    """Describe a checkpoint: tensors (dtype, shape, bytes), metadata, shards, checksums (a
    container: stored bytes and ratio per tensor and in all)."""
    ck = _C.ckpt_open(context(), os.fspath(path))
    tensors, meta, shards, has_csum = _C.ckpt_describe(ck)
    if _C.ckpt_format(ck) == _C.FORMAT_FST:  # (the handle opened here, described there)
        from . import _fst
        return _fst.Container(path, opened=(ck, tensors, meta, shards)).describe()
    return {"tensors": {t[0]: {"dtype": t[1], "shape": t[2], "bytes": t[3], "shard": t[4],
                               "data_offset": t[5]} for t in tensors},
            "metadata": meta,
            "shards": [{"path": p, "data_size": s, "data_start": d} for p, s, d in shards],
            "checksums": bool(has_csum)}


def verify(path, *, engine: str = "auto") -> bool:
    """Check a checkpoint: its structure (header, offsets, sizes: ValueError saying what is
    wrong), then every block checksum (ValueError naming the bad block and tensor). Returns
    True when the checksums were checked, False for a checkpoint without fastensor checksums
    (written by another tool), whose structure alone could be. A ``.fst`` container: every
    tensor decoded, every block's checksum checked."""
    ck = _C.ckpt_open(context(), os.fspath(path))
    if not _C.ckpt_describe(ck)[3]:
        return False
    _C.ckpt_verify(ck, engine_id(engine))
    return True


def convert(src, dst, *, compression: str = "auto", engine: str = "auto") -> None:
    """Convert a checkpoint byte-exactly: to a compressed container where ``dst`` ends in
    ``.fst``, else to a safetensors file; ``src`` is either (a file, index or directory).
    Metadata is kept. Holds the tensors in host memory."""
    from . import _fst
    _fst.convert(src, dst, compression=compression, engine=engine)


def safe_open(filename, framework: str, device="cpu", **kwargs):
    """``safetensors.safe_open``: a checkpoint (file, index or directory) held open, tensors
    read one at a time or in slices. ``framework``: "pt" (torch tensors), "np" (numpy), or
    one of "tf", "flax"/"jax", "mlx", "paddle" (numpy arrays handed to that framework);
    ``backend="mmap" | "pread"`` as safetensors'; see :func:`fastensor.torch.safe_open` for
    the rest."""
    if framework in ("pt", "torch", "pytorch"):
        from .torch import safe_open as opener
    elif framework in ("np", "numpy") or framework in _frameworks.CONVERTERS:
        from .numpy import safe_open as opener
    else:
        raise SafetensorValueError(f"framework {framework} is invalid")
    if framework in _frameworks.CONVERTERS:
        return _frameworks.Converted(opener(filename, "np", device, **kwargs), framework)
    return opener(filename, framework, device, **kwargs)


from .store import SpillStore  # noqa: E402  (needs the helpers above)
from ._ckpt import SaveWarning, gc  # noqa: E402
from . import _frameworks  # noqa: E402
from ._st import (SafetensorError, SafetensorKeyError, SafetensorValueError,  # noqa: E402
                  TensorSpec, _safe_open_handle, deserialize, serialize,  # noqa: F401
                  serialize_file)

__all__ = ["File", "Request", "SaveWarning", "SpillStore", "configure", "context", "convert",
           "gc", "safe_open", "inspect", "verify", "ENGINES",
           "SafetensorError", "SafetensorKeyError", "SafetensorValueError", "TensorSpec",
           "serialize", "serialize_file", "deserialize"]
