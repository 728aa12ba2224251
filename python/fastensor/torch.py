"""PyTorch layer, mirroring ``safetensors.torch``: change the import, keep the calls.

    from fastensor.torch import save_file, load_file
    save_file(model.state_dict(), "model.safetensors")
    state = load_file("model.safetensors", device="cpu")

Files are safetensors files (any safetensors reader loads them) with a page-aligned data
section and xxh3 block checksums; saves are atomic and durable; loads read each shard with
one large parallel read. CUDA tensors are saved after the current stream's queued work and
read from device memory by the library; GPU loads go straight into device memory (pinned
staging pipeline or cuFile), one transfer per shard.
"""
from __future__ import annotations

import json
import threading

import torch

from . import _ckpt
from .offload import offload_activations

_TO_ST = {torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16",
          torch.int32: "I32", torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.float32: "F32", torch.float64: "F64", torch.complex64: "C64"}
for _name, _st in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"),
                   ("float8_e8m0fnu", "F8_E8M0"), ("uint16", "U16"), ("uint32", "U32"),
                   ("uint64", "U64")):
    if hasattr(torch, _name):
        _TO_ST[getattr(torch, _name)] = _st
_FROM_ST = {v: k for k, v in _TO_ST.items()}
_ALIASES_KEY = "fastensor_aliases"


def _contiguous(name, t):
    """The tensor, contiguous, on the CPU or a CUDA device (read there by the library)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name!r}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _TO_ST:
        raise ValueError(f"{name!r}: dtype {t.dtype} has no safetensors equivalent")
    t = t.detach()
    if t.device.type not in ("cpu", "cuda"):
        t = t.to("cpu")
    return t.contiguous()


def _items(tensors):
    if not isinstance(tensors, dict):
        raise TypeError("tensors must be a dict of name -> torch.Tensor")
    items, keep, devices = [], [], set()
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, not {type(name).__name__}")
        h = _contiguous(name, t)
        keep.append(h)
        cuda = h.device.type == "cuda"
        if cuda:
            devices.add(h.device)
        items.append((name, _TO_ST[h.dtype], tuple(int(s) for s in h.shape), h.data_ptr(),
                      h.numel() * h.element_size(), int(cuda), (h.device.index or 0) if cuda else 0))
    for d in devices:  # the data written is the data after the queued work on the stream
        torch.cuda.current_stream(d).synchronize()
    return items, keep


def save_file(tensors: dict, filename, metadata: dict | None = None, *, engine: str = "auto",
              shard_size: int | None = None, cache: str = "auto") -> None:
    """Save tensors as a safetensors checkpoint.

    Atomic (temporary file, fdatasync, rename, directory fsync) and checksummed. Above
    ``shard_size`` bytes the data is split into ``NAME-0000i-of-0000N.safetensors`` shards
    plus ``NAME.safetensors.index.json``. ``cache="keep"`` leaves the files in the page cache
    for a load soon after (an evaluation); the default writes around it (O_DIRECT). Raises
    ValueError/TypeError for bad input (nothing written) and OSError for I/O failures (the
    previous file is left in place).
    """
    items, keep = _items(tensors)
    _ckpt.save(filename, items, metadata, engine=engine, shard_size=shard_size, cache=cache)
    del keep


def _tensor_from(buf, dtype_name, shape, nbytes, off):
    dt = _FROM_ST.get(dtype_name)
    if dt is None:
        raise ValueError(f"dtype {dtype_name} is not available in this torch {torch.__version__}")
    raw = buf[off:off + nbytes]
    esize = torch.empty((), dtype=dt).element_size()
    if off % esize:  # a foreign file's unaligned tensor: give it storage of its own
        raw = raw.clone()
    if nbytes == 0:
        return torch.empty(shape, dtype=dt, device=buf.device)
    return raw.view(dt).reshape(shape)


def _load(filename, device, engine, verify, mmap=None, cache="auto"):
    device = torch.device(device)
    ck, tensors, meta, shards = _ckpt.open_checkpoint(filename)
    bufs = []
    cuda = device.type == "cuda"
    if cuda and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    for k, info in enumerate(shards):
        size = info[1]
        mapped = None if cuda else _ckpt.mapped_shard(ck, k, info, engine=engine, verify=verify,
                                                      mmap=mmap, cache=cache)
        if mapped is not None:  # the tensors view the page cache (the buffer keeps it mapped)
            buf = torch.frombuffer(mapped, dtype=torch.uint8, count=size, offset=info[2])
            bufs.append(buf if device.type == "cpu" else buf.to(device))
            continue
        buf = torch.empty(max(size, 1), dtype=torch.uint8, device=device if cuda else "cpu")
        # straight into device memory (pinned staging or cuFile), ordered on the current stream
        stream = torch.cuda.current_stream(device).cuda_stream if cuda else 0
        _ckpt.load_shard(ck, k, buf.data_ptr(), size, engine=engine, verify=verify,
                         device=device.index if cuda else None, stream=stream, cache=cache)
        if device.type not in ("cpu", "cuda"):
            buf = buf.to(device)
        bufs.append(buf)
    out = {name: _tensor_from(bufs[shard], dtype, shape, nbytes, off)
           for name, dtype, shape, nbytes, shard, off in tensors}
    return out, meta


def load_file(filename, device="cpu", *, engine: str = "auto", verify: bool = False,
              mmap=None, cache: str = "auto") -> dict:
    """Load a safetensors file, index or directory into tensors on ``device``.

    Each shard is read with one large parallel read into one buffer; tensors are views of it
    (so the buffer lives while any of them does). ``verify`` checks the xxh3 block checksums
    while reading (ValueError naming the block and tensor on a mismatch).
    On the host, a shard already in the page cache is mapped instead (``mmap=None``, with
    engine "auto"): the tensors view a private mapping of the file, no copy is made, and
    writing to a tensor copies only that page (the file never changes). Such tensors see the
    file's bytes as long as they live: a file changed in place by another program changes
    them, and one truncated under them faults; fastensor's own saves replace files, which
    leaves mappings of the old file intact. ``mmap=False`` always reads; ``mmap=True`` maps
    cached and uncached shards alike.
    ``cache``: "auto" (default) reads a checkpoint that fits in about half of what the page
    cache can keep through it, so that the next load (another process, another rank) finds
    it there, and a larger one around it (O_DIRECT); "keep" and "bypass" decide it yourself.
    """
    return _load(filename, device, engine, verify, mmap, cache)[0]


class AsyncSave:
    """Handle of a :func:`save_file_async`: ``done()``, ``result(timeout=None)``."""

    def __init__(self, target, args):
        self._error = None
        self._thread = threading.Thread(target=self._run, args=(target, args), daemon=True,
                                        name="fastensor-save")
        self._thread.start()

    def _run(self, target, args):
        try:
            target(*args)
        except BaseException as e:  # handed to result()
            self._error = e

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float | None = None) -> None:
        """Wait for the save; re-raise its error. TimeoutError if still running."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("save still running")
        if self._error is not None:
            raise self._error


def save_file_async(tensors: dict, filename, metadata: dict | None = None, *,
                    engine: str = "auto", shard_size: int | None = None,
                    cache: str = "auto") -> AsyncSave:
    """Snapshot the tensors now (to pinned host memory for CUDA tensors), then save in the
    background. The caller may modify or free the tensors as soon as this returns."""
    if not isinstance(tensors, dict):
        raise TypeError("tensors must be a dict of name -> torch.Tensor")
    snap = {}
    cuda = False
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name!r}: expected a torch.Tensor, got {type(t).__name__}")
        t = t.detach()
        if t.device.type == "cuda":
            h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            h.copy_(t, non_blocking=True)
            cuda = True
        else:
            h = t.clone(memory_format=torch.contiguous_format)
        snap[name] = h
    if cuda:
        torch.cuda.current_stream().synchronize()
    items, keep = _items(snap)
    return AsyncSave(lambda: (_ckpt.save(filename, items, metadata, engine=engine,
                                         shard_size=shard_size, cache=cache), keep), ())


def _dedupe(state):
    """Store shared tensors (tied weights) once: {name: tensor}, {alias: name}."""
    first, unique, aliases = {}, {}, {}
    for name, t in state.items():
        key = (t.device, t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if t.numel() and key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
            unique[name] = t
    return unique, aliases


def save_model(model, filename, metadata: dict | None = None, *, engine: str = "auto",
               shard_size: int | None = None, cache: str = "auto") -> None:
    """Save ``model.state_dict()`` (parameters and buffers). Tied weights are stored once
    and restored by :func:`load_model`; non-contiguous tensors are made contiguous."""
    unique, aliases = _dedupe(model.state_dict())
    meta = {"format": "pt"}
    meta.update(metadata or {})
    if aliases:
        meta[_ALIASES_KEY] = json.dumps(aliases, sort_keys=True)
    save_file(unique, filename, meta, engine=engine, shard_size=shard_size, cache=cache)


def load_model(model, filename, strict: bool = True, *, device=None, engine: str = "auto",
               verify: bool = False, mmap=None, cache: str = "auto"):
    """Load a checkpoint made by :func:`save_model` (or any safetensors state dict) into
    ``model``; returns ``model.load_state_dict``'s (missing_keys, unexpected_keys)."""
    if device is None:
        p = next(iter(model.parameters()), None)
        device = p.device if p is not None else "cpu"
    state, meta = _load(filename, device, engine, verify, mmap, cache)
    try:
        aliases = json.loads(meta.get(_ALIASES_KEY, "{}"))
    except ValueError as e:
        raise ValueError(f"{filename}: corrupt {_ALIASES_KEY} metadata: {e}") from None
    for alias, name in aliases.items():
        if name not in state:
            raise ValueError(f"{filename}: alias {alias!r} names missing tensor {name!r}")
        state[alias] = state[name]
    return model.load_state_dict(state, strict=strict)


__all__ = ["offload_activations", "save_file", "load_file", "save_file_async", "save_model", "load_model",
           "AsyncSave"]
