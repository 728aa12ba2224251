"""safetensors' own API on fastensor: its error classes, ``TensorSpec``, ``serialize`` /
``serialize_file`` / ``deserialize``, ``_safe_open_handle``, the ``backend`` names, and the
indexing rules of ``get_slice``. The framework layers (torch, numpy) build their ``save`` /
``load`` of bytes on these, so both give the bytes and the errors safetensors gives."""
from __future__ import annotations

import ctypes
import errno
import json
import math
import os

from . import _C
from ._C import SafetensorError, SafetensorKeyError, SafetensorValueError  # noqa: F401 (re-exported)

# The header's dtype codes, the bits of one element and their rank in safetensors' layout
# order (serialize lays tensors out from the highest rank down, each rank by name, so every
# tensor sits aligned to its element): the library's (ft_dtype_name, _bits, _rank).
BITS = {code: bits for code, bits, _ in _C.DTYPES}
_RANK = {code: rank for code, _, rank in _C.DTYPES}
# TensorSpec's dtype names (numpy's and torch's) and their codes
_CODES = {"bool": "BOOL", "int8": "I8", "uint8": "U8", "int16": "I16", "uint16": "U16",
          "int32": "I32", "uint32": "U32", "int64": "I64", "uint64": "U64",
          "float16": "F16", "float32": "F32", "float64": "F64", "bfloat16": "BF16",
          "float8_e4m3fn": "F8_E4M3", "float8_e4m3fnuz": "F8_E4M3FNUZ",
          "float8_e5m2": "F8_E5M2", "float8_e5m2fnuz": "F8_E5M2FNUZ",
          "float8_e8m0fnu": "F8_E8M0", "float4_e2m1fn_x2": "F4", "complex64": "C64"}
HEADER_MAX = 100_000_000
BACKENDS = ("mmap", "pread")


class SafetensorIndexError(SafetensorError, IndexError):
    """An index past a tensor's bounds in ``get_slice``: a SafetensorError and an
    IndexError."""


class NotFoundError(SafetensorError, FileNotFoundError):
    """A checkpoint path that does not exist: FileNotFoundError (errno ENOENT, ``filename``)
    whose text is safetensors' ("No such file or directory: PATH")."""

    def __str__(self):
        return self.strerror


def not_found(path) -> NotFoundError:
    path = os.fspath(path)
    return NotFoundError(errno.ENOENT, f"No such file or directory: {path}", path)


def check_backend(backend) -> str:
    """safetensors' storage backend names: "mmap" (the default: fastensor's engine auto,
    which maps a shard the page cache holds) or "pread" (always read)."""
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, not {type(backend).__name__}")
    if backend not in BACKENDS:
        raise SafetensorValueError(f'backend "{backend}" is invalid (expected one of: '
                                   '"mmap", "pread")')
    return backend


class TensorSpec:
    """One tensor for :func:`serialize` / :func:`serialize_file`: its dtype (a name such as
    "float32" or "bfloat16"; ``spec.dtype`` is the header's code, "F32"), its shape (for
    float4_e2m1fn_x2, two elements to a byte, the last dimension as the framework stores it;
    ``spec.shape`` counts elements), and ``data_len`` bytes at address ``data_ptr``, which
    must stay valid while a serialization uses them."""

    __slots__ = ("_dtype", "_shape", "_data_ptr", "_data_len")

    def __init__(self, *, dtype, shape, data_ptr, data_len):
        code = _CODES.get(dtype) if isinstance(dtype, str) else None
        if code is None:
            raise SafetensorError(f"Unknown dtype {json.dumps(dtype)}. Supported dtypes: "
                                  f"{', '.join(_CODES)}")
        shape = [_unsigned(s, "shape") for s in shape]
        if code == "F4" and shape:
            shape[-1] *= 2
        self._dtype, self._shape = code, shape
        self._data_ptr, self._data_len = _unsigned(data_ptr, "data_ptr"), \
            _unsigned(data_len, "data_len")

    dtype = property(lambda self: self._dtype, doc="The header's dtype code (\"F32\").")
    shape = property(lambda self: list(self._shape), doc="Elements per dimension.")
    data_ptr = property(lambda self: self._data_ptr, doc="The address of the bytes.")
    data_len = property(lambda self: self._data_len, doc="How many bytes.")

    def __repr__(self):
        return (f"TensorSpec(dtype='{self._dtype}', shape={self._shape}, "
                f"data_ptr={self._data_ptr}, data_len={self._data_len})")


def _unsigned(v, what):
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError(f"{what}: expected an integer, not {type(v).__name__}")
    v = v.__index__()
    if v < 0:
        raise OverflowError("can't convert negative int to unsigned")
    return v


def _check_metadata(metadata):
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise TypeError(f"argument 'metadata': '{type(metadata).__name__}' object cannot be "
                        "converted to 'PyDict'")
    for k, v in metadata.items():
        for x in (k, v):
            if not isinstance(x, str):
                raise TypeError(f"argument 'metadata': '{type(x).__name__}' object cannot be "
                                "converted to 'PyString'")


def _items(tensor_dict):
    """[(name, code, shape, address, nbytes)] of a dict of :class:`TensorSpec`."""
    if not isinstance(tensor_dict, dict):
        raise TypeError(f"argument 'tensor_dict': '{type(tensor_dict).__name__}' object cannot "
                        "be converted to 'PyDict'")
    items = []
    for name, spec in tensor_dict.items():
        if not isinstance(name, str):
            raise TypeError(f"argument 'tensor_dict': '{type(name).__name__}' object cannot be "
                            "converted to 'PyString'")
        if not isinstance(spec, TensorSpec):
            raise TypeError(f"argument 'tensor_dict': '{type(spec).__name__}' object cannot "
                            "be converted to 'TensorSpec'")
        items.append((name, spec.dtype, tuple(spec.shape), spec.data_ptr, spec.data_len))
    return items


def layout(items, metadata=None):
    """``items`` [(name, code, shape, address, nbytes)] in safetensors' layout order, each
    checked (its bytes are what its shape and dtype say), and the metadata's types."""
    _check_metadata(metadata)
    for _, code, shape, _, nbytes in items:
        bits = math.prod(shape) * BITS[code]
        if bits % 8:
            raise SafetensorValueError(
                "Error while serializing: The slice is slicing for subbytes dtypes, and the "
                "slice does not end up at a byte boundary, this is invalid.")
        if bits // 8 != nbytes:
            raise SafetensorValueError("Error while serializing: invalid shape, data type, or "
                                       "offset for tensor")
    return sorted(items, key=lambda it: (-_RANK[it[1]], it[0]))


def header(entries, metadata):
    """The padded header (u64 length + JSON, 8-byte aligned) of ``entries`` [(name, dtype
    code, shape, nbytes)] laid out in that order, and the data section's size."""
    doc, at = {}, 0
    if metadata is not None:
        doc["__metadata__"] = metadata
    for name, code, shape, nbytes in entries:
        doc[name] = {"dtype": code, "shape": list(shape), "data_offsets": [at, at + nbytes]}
        at += nbytes
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    if len(text) > HEADER_MAX:
        raise SafetensorValueError("Error while serializing: header too large")
    return len(text).to_bytes(8, "little") + text, at


def pack(items, metadata=None) -> bytes:
    """The safetensors bytes of ``items`` [(name, code, shape, address, nbytes)] (host
    memory), as safetensors serializes them."""
    order = layout(items, metadata)
    head, size = header([(n, c, sh, nb) for n, c, sh, _, nb in order], metadata)
    out = bytearray(len(head) + size)
    out[:len(head)] = head
    at = len(head)
    for _, _, _, address, nbytes in order:
        if nbytes:
            ctypes.memmove(ctypes.addressof(ctypes.c_char.from_buffer(out, at)), address,
                           nbytes)
        at += nbytes
    return bytes(out)


def serialize(tensor_dict, metadata=None) -> bytes:
    """safetensors' bytes of ``tensor_dict`` (name -> :class:`TensorSpec`), the same bytes
    safetensors writes: tensors by descending alignment then name, the JSON header padded
    with spaces to 8 bytes. ``metadata``: str -> str."""
    return pack(_items(tensor_dict), metadata)


def serialize_file(tensor_dict, filename, metadata=None) -> None:
    """Save ``tensor_dict`` (name -> :class:`TensorSpec`) at ``filename`` as fastensor saves
    every file: atomic and durable, the data section at a 4096-byte boundary, fastensor's
    block checksums in the header; the tensors' layout is :func:`serialize`'s."""
    from . import _ckpt
    _ckpt.save(os.fspath(filename), layout(_items(tensor_dict), metadata), metadata)


def deserialize(data) -> list:
    """[(name, {"shape", "dtype", "data": bytearray})] of safetensors bytes, in file order,
    validated as a file is (SafetensorError naming what is wrong)."""
    view = memoryview(data).cast("B")
    described = in_memory(view, lambda p: _C.ckpt_describe(_C.ckpt_open(_context(), p)))
    tensors, _, shards, _ = described
    start = shards[0][2] if shards else 0
    out = []
    for name, dtype, shape, nbytes, _, off in sorted(tensors, key=lambda t: t[5]):
        at = start + off
        out.append((name, {"shape": list(shape), "dtype": dtype,
                           "data": bytearray(view[at:at + nbytes])}))
    return out


def in_memory(data, opener):
    """``opener(path)`` of the safetensors bytes ``data`` held in an anonymous file (a
    SafetensorError naming what is wrong for invalid bytes)."""
    fd = os.memfd_create("fastensor-load", os.MFD_CLOEXEC)
    try:
        with os.fdopen(os.dup(fd), "wb") as f:
            f.write(memoryview(data).cast("B"))
        try:
            return opener(f"/proc/self/fd/{fd}")
        except ValueError as e:
            raise SafetensorValueError(f"Error while deserializing: {_no_path(e, fd)}") \
                from None
    finally:
        os.close(fd)


def _no_path(e, fd):
    return str(e).replace(f"/proc/self/fd/{fd}: ", "")


def _context():
    from . import context
    return context()


def _safe_open_handle(f, framework, device="cpu", **kwargs):
    """``safe_open`` over an open Python file object (a file, or fsspec's): the file it has
    a descriptor of, else the bytes it reads."""
    from . import safe_open
    try:
        fd = f.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None
    if fd is not None:
        return safe_open(f"/proc/self/fd/{fd}", framework, device, **kwargs)
    data = f.read()
    return in_memory(data, lambda p: safe_open(p, framework, device, **kwargs))


# ---- get_slice's indexing, as safetensors parses it ----

def parse_index(key, shape):
    """safetensors' indexers of ``key`` for a tensor of ``shape``: ("select", i) or
    ("narrow", start | None, stop | None, step) per dimension (SafetensorError for what it
    refuses)."""
    if isinstance(key, tuple):
        items = list(key)
    elif isinstance(key, list):
        if key:
            raise SafetensorValueError("Non empty lists are not implemented")
        return [("narrow", 0, 0, 1)]
    else:
        items = [key]
    ellipses = sum(it is Ellipsis for it in items)
    if ellipses > 1:
        raise SafetensorValueError("Only one ellipsis (...) is allowed in slice index")
    fill = max(len(shape) - (len(items) - ellipses), 0)
    out = []
    for it in items:
        d = len(out)
        if it is Ellipsis:
            out += [("narrow", None, None, 1)] * fill
        elif isinstance(it, slice):
            start = None if it.start is None else _unsigned(it.start, "slice start")
            stop = None if it.stop is None else _unsigned(it.stop, "slice stop")
            step = 1 if it.step is None else it.step.__index__()
            if step <= 0:
                raise SafetensorValueError(f"Slice step must be a positive integer, got {step}")
            out.append(("narrow", start, stop, step))
        elif not isinstance(it, bool) and hasattr(it, "__index__") and \
                -2**31 <= it.__index__() < 2**31:
            i, n = it.__index__(), shape[d] if d < len(shape) else 0
            if i < 0:
                if n + i < 0:
                    raise SafetensorIndexError(f"Invalid index {i} for dimension {d} of size {n}")
                i += n
            out.append(("select", i))
        else:
            raise SafetensorValueError(f"Unsupported slice index at position {d}: expected "
                                       "slice, int, or ellipsis")
    return out


def _show(ix):
    if ix[0] == "select":
        return str(ix[1])
    _, start, stop, step = ix
    s = f"{'' if start is None else start}:{'' if stop is None else stop}"
    return s if step == 1 else f"{s}:{step}"


def resolve_index(indexers, shape):
    """[(start, stop, step, keeps the dimension)] per dimension of ``shape`` for safetensors'
    ``indexers``, with its bounds checks (innermost dimension first) and messages."""
    def fail(msg, cls=SafetensorValueError):
        raise cls(f"Error during slicing [{', '.join(map(_show, indexers))}] "
                                   f"with shape {list(shape)}: {msg}")
    if len(indexers) > len(shape):
        fail("more slicing indexes than dimensions in tensor")
    sel = [(0, n, 1, True) for n in shape]
    for d in reversed(range(len(indexers))):
        ix, n = indexers[d], shape[d]
        if ix[0] == "select":
            start, stop, step = ix[1], ix[1] + 1, 1
        else:
            _, start, stop, step = ix
            start = 0 if start is None else start
            stop = n if stop is None else stop
        if start >= n or stop > n:
            fail(f"index {start if start >= n else max(stop - 1, 0)} out of bounds for tensor "
                 f"dimension #{d} of size {n}", SafetensorIndexError)
        sel[d] = (start, max(stop, start), step, ix[0] != "select")
    return sel
