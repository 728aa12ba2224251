"""The compressed checkpoint container (``.fst``, docs/FORMAT.md), through the library: the
C checkpoint layer reads, decodes, verifies and writes it (``ft_ckpt_open`` /
``ft_ckpt_save`` of a ``.fst`` path, src/ckpt/fst.c and fst_save.c), as the C CLI does
(``fastensor inspect | verify | convert``). This module describes a container for Python
callers and holds the framework-free helpers the torch and numpy layers share.
"""
from __future__ import annotations

import os

import numpy as np

from . import _C, _ckpt, _st, cache_id, context, engine_id
from ._safe import _PACKED_BITS, Opened

MAGIC = b"FASTENSZ"
SUFFIX = ".fst"
COMPRESSION = ("auto", "always", "none")
_gpu = {}  # device -> None (the GPU decodes) or why not


def gpu_decoder(device: int):
    """None where the library decodes on CUDA ``device``'s GPU, else why not (built without
    nvcc, no driver, a driver that cannot load kernels)."""
    if device not in _gpu:
        try:
            _C.codec_decode_cuda(context(), [], device, 0)
            _gpu[device] = None
        except OSError as e:
            _gpu[device] = str(e)
    return _gpu[device]


def compression_id(compression) -> int:
    """The library's number for a compression mode (ValueError naming the modes)."""
    if compression not in COMPRESSION:
        raise ValueError(f"compression must be one of {', '.join(map(repr, COMPRESSION))}, "
                         f"not {compression!r}")
    return COMPRESSION.index(compression)


class Entry:
    """A tensor of a container: ``begin`` is where its bytes sit in the decoded layout,
    ``stored`` its stream's span in the container's data section."""
    __slots__ = ("index", "name", "dtype", "shape", "nbytes", "begin", "stored", "compressed")

    def __init__(self, index, name, dtype, shape, nbytes, begin, stored, compressed):
        self.index, self.name, self.dtype, self.shape = index, name, dtype, tuple(shape)
        self.nbytes, self.begin, self.stored, self.compressed = nbytes, begin, stored, compressed


class Container:
    """An open container (the library's checkpoint handle): its tensors (``entries``, in
    the decoded layout's order), metadata, and reads that decode into memory at addresses
    the caller provides."""

    def __init__(self, path, *, engine="auto", cache="auto", opened=None):
        self.path = os.fspath(path)
        self.engine, self.cache = engine, cache
        # (opened: what _ckpt.open_checkpoint gave a caller that opened it already)
        ck, tensors, meta, shards = opened or _ckpt.open_checkpoint(self.path)
        fmt, stored = _C.ckpt_stored(ck)
        if fmt != _C.FORMAT_FST:  # (a caller that opened it asked _ckpt.is_container first)
            raise ValueError(f"{self.path}: not a fastensor container (no FASTENSZ magic)")
        self.ck = ck
        self.metadata = meta or {}
        self.data_start = shards[0][2]
        self.size = shards[0][1]  # the decoded layout's bytes
        self.entries = [Entry(i, name, dtype, shape, nbytes, off,
                              (fo - self.data_start, fo - self.data_start + sb), coded)
                        for i, ((name, dtype, shape, nbytes, _, off), (fo, sb, coded))
                        in enumerate(zip(tensors, stored))]
        self.by_name = {x.name: x for x in self.entries}

    def entry(self, name):
        try:
            return self.by_name[name]
        except KeyError:
            raise _st.SafetensorKeyError(f"File does not contain tensor {name}") from None

    def load(self, address, *, device=None, stream=0, verify=False):
        """Decode every tensor into the decoded layout at ``address`` (``size`` bytes: tensor
        x at ``address + x.begin``), host memory or memory of CUDA ``device`` (decoded on its
        GPU where the library can, unless ``verify``: block checksums are checked on the
        host), the next streams read while some decode."""
        _ckpt.load_shard(self.ck, 0, address, self.size, engine=self.engine, verify=verify,
                         device=device, stream=stream, cache=self.cache)

    def decode_into(self, targets, device=None, stream=0, verify=False):
        """Decode tensors into memory: ``targets`` maps a name to the address of room for its
        bytes (host memory, or memory of CUDA ``device``, as :meth:`load`). Errors:
        ValueError naming the tensor."""
        kind, dev = (0, 0) if device is None else (1, device)
        for name, address in targets.items():
            x = self.entry(name)
            _C.ckpt_read(self.ck, x.index, 0, address, x.nbytes, engine_id(self.engine),
                         bool(verify), kind, dev, stream, cache_id(self.cache))

    def describe(self):
        """What fastensor.inspect says of a container."""
        stored = sum(x.stored[1] - x.stored[0] for x in self.entries)
        raw = sum(x.nbytes for x in self.entries)
        return {"tensors": {x.name: {"dtype": x.dtype, "shape": list(x.shape), "bytes": x.nbytes,
                                     "stored_bytes": x.stored[1] - x.stored[0],
                                     "compressed": x.compressed} for x in self.entries},
                "metadata": dict(self.metadata), "container": "fst", "bytes": raw,
                "stored_bytes": stored, "ratio": stored / raw if raw else 1.0,
                "checksums": True}

    def verify(self):
        """Decode every stream (checksums checked); ValueError at the first bad block."""
        _C.ckpt_verify(self.ck, engine_id(self.engine))


def cost(directory, elem=2):
    """(encode, share, decode, write, read) of coding floats of ``elem`` bytes for files in
    ``directory``, GB/s and coded share: measured once per process by the library
    (``ft_fst_measure``: the codec on 32 MiB of weights, the disk with a 64 MiB O_DIRECT
    probe), or what :func:`set_cost` gave it. ``directory`` None: the codec's figures only."""
    return _C.fst_measure(context(), None if directory is None else os.fspath(directory), elem)


def gpu_codes(device, elem=2):
    """(codes, GB/s): whether a save codes floats of ``elem`` bytes held in memory of CUDA
    device ``device`` on that GPU (its encoder wrote the CPU encoder's bytes for 32 MiB of
    weights, faster; measured once per process: ``ft_fst_gpu_codes``) and its encode rate
    (0.0 where not measured: no GPU encoder in this build, no driver)."""
    return _C.fst_gpu_codes(context(), int(device), elem)


def set_cost(directory, elem, figures):
    """Make ``figures`` (encode, share, decode, write, read) what the library knows of floats
    of ``elem`` bytes (and of ``directory``'s disk): a save's "auto" decides by them."""
    _C.fst_cost_set(context(), None if directory is None else os.fspath(directory), elem,
                    tuple(float(x) for x in figures))


def coding_pays(directory, elem=2) -> bool:
    """Whether "auto" codes floats of ``elem`` bytes (2: bf16/fp16, 4: fp32) for files in
    ``directory`` (``ft_fst_coding_pays``: the write time their coded share saves is worth
    the encode, and the codec decodes at least as fast as the disk reads). A directory where
    O_DIRECT cannot be used: False."""
    try:
        return _C.fst_coding_pays(cost(directory, elem))
    except OSError:
        return False


def save(path, items, metadata, *, compression="auto", engine="auto", cache="auto",
         coded=None):
    """Write a container (``ft_ckpt_save`` of a ``.fst`` path). ``items``: [(name, dtype_name,
    shape, address, nbytes[, is_cuda, device])] of memory the caller keeps alive (tensors in
    GPU memory are coded by their GPU where its encoder works there). ``compression``: "always"
    codes each float tensor and keeps the coded stream where it saves at least 5% of its bytes
    (else the tensor is stored, as integers and packed types always are); "auto" does so where
    coding pays on this machine and disk (:func:`coding_pays`), else stores; "none" stores
    every tensor. Atomic and durable: a temporary, fdatasync, rename, directory fsync.
    ``coded`` (of :func:`code`, for these items in this order): their streams, written as they
    are (the items' addresses are not read)."""
    mode = compression_id(compression)
    meta = {} if metadata is None else dict(metadata)
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError("metadata must map str to str")
    _ckpt.save(path, list(items), meta, engine=engine, cache=cache, compression=mode,
               coded=coded)


def code(directory, items, compression="auto", coded=None):
    """(coded, bytes): ``items`` (as :func:`save`'s) coded now as a save into ``directory``
    codes them (``ft_fst_code``), into host memory of ``coded`` (a new object where None; the
    object of an earlier call is reused, grown or trimmed: pinned where CUDA is in use), and
    the streams' bytes. The items' memory is free again on return; :func:`_ckpt.save` with
    ``coded`` then writes these streams."""
    return _C.fst_code(context(), os.fspath(directory), list(items), compression_id(compression),
                       coded)


def coded_memory(coded) -> int:
    """The host memory ``coded`` (of :func:`code`) holds, in bytes."""
    return _C.fst_coded_memory(coded)


def convert(src, dst, *, compression="auto", engine="auto"):
    """``src`` (a safetensors file, index or directory, or a container) to ``dst``: a
    container where ``dst`` ends in ``.fst``, else a safetensors file. Byte-exact; metadata
    kept. Holds the tensors in host memory."""
    src, dst = os.fspath(src), os.fspath(dst)
    mode = compression_id(compression)
    if mode and not dst.endswith(SUFFIX):
        mode = 0  # (a safetensors file stores its tensors as they are)
    ck, tensors, meta, shards = _ckpt.open_checkpoint(src)
    bufs = []
    for k, info in enumerate(shards):
        b = np.empty(max(info[1], 1), dtype=np.uint8)
        _ckpt.load_shard(ck, k, b.ctypes.data, info[1], engine=engine)
        bufs.append(b)
    items = [(name, dtype, tuple(shape), bufs[shard].ctypes.data + off, nbytes)
             for name, dtype, shape, nbytes, shard, off in tensors]
    _ckpt.save(dst, items, dict(meta or {}), engine=engine, compression=mode)
    del bufs


class FstOpen(Opened):
    """``safe_open`` on a container: ``keys()``, ``metadata()``, ``get_tensor(name)`` (reads
    and decodes that tensor's stream only), ``get_slice(name)[...]`` (decodes the tensor, then
    slices it: a coded stream is read whole). ``adapter`` makes the framework's arrays."""

    def __init__(self, filename, adapter, device, *, engine="auto", verify=False,
                 cache="auto", opened=None):
        self._adapter = adapter
        self._device = adapter.device(device)
        self._verify = verify
        self._c = Container(filename, engine=engine, cache=cache, opened=opened)
        self._filename = self._c.path
        self._open_ = True
        self._torch_indexing = adapter.torch_indexing

    def close(self):
        self._open_ = False

    def _open(self):
        if not self._open_:
            raise _st.SafetensorValueError(f"{self._filename}: the checkpoint is closed")
        return self._c

    def keys(self) -> list:
        return sorted(self._open().by_name)

    def offset_keys(self) -> list:
        return [x.name for x in sorted(self._open().entries, key=lambda x: x.stored[0])]

    def metadata(self):
        m = self._open().metadata
        return dict(m) if m else None

    @property
    def checksums(self) -> bool:
        return True

    def _entry(self, name):
        x = self._open().entry(name)
        return (0, x.dtype, x.shape, x.nbytes, 0, 0)

    def _on_gpu(self):
        """Whether tensors decode straight into device memory (a CUDA device: the library
        decodes on its GPU where it can, else on the host and copies)."""
        d = self._device
        return not self._adapter.is_host(d) and getattr(d, "type", None) == "cuda"

    def _decoded(self, name):
        x = self._open().entry(name)
        gpu = self._on_gpu()
        buf, address, index, stream = self._adapter.empty("U8", (x.nbytes,), x.nbytes,
                                                          self._device if gpu else None)
        self._c.decode_into({name: address}, device=index if gpu else None, stream=stream,
                            verify=self._verify)
        return self._adapter.view(buf, x.dtype, x.shape, x.nbytes, 0) if x.nbytes else \
            self._adapter.finish(buf, x.dtype, x.shape)

    def get_tensor(self, name):
        t = self._decoded(name)
        return self._adapter.select(t, (), self._device) if not \
            self._adapter.is_host(self._device) and not self._on_gpu() else t

    def get_tensors(self, names=None, threads: int = 8) -> dict:
        names = self.offset_keys() if names is None else list(names)
        return {n: self.get_tensor(n) for n in names}

    def read_box(self, name, box):
        x = self._open().entry(name)
        if x.dtype in _PACKED_BITS and any(b != (0, n) for b, n in zip(box, x.shape)):
            raise ValueError(f"{name!r}: {x.dtype} elements are packed below a byte; "
                             "slice it after get_tensor")
        t = self._decoded(name)
        if x.dtype in _PACKED_BITS:
            return t
        return t[tuple(slice(lo, hi) for lo, hi in box)]
