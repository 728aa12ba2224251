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

import math
import os

import torch

from . import _ckpt, _fst, _st
from ._async import (AsyncSave, SaveFuture, _snapshots, release_snapshot_memory,  # noqa: F401
                     save_file_async)
from ._gpumem import gpu_memory_limit  # noqa: F401 (fastensor.torch.gpu_memory_limit)
from .offload import offload_activations
from .optim import OffloadedOptimizer
from .stream import ParameterStream, stream_parameters

_TO_ST = {torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16",
          torch.int32: "I32", torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.float32: "F32", torch.float64: "F64", torch.complex64: "C64"}
for _name, _code in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"),
                     ("float8_e8m0fnu", "F8_E8M0"), ("float4_e2m1fn_x2", "F4"),
                     ("float8_e4m3fnuz", "F8_E4M3FNUZ"), ("float8_e5m2fnuz", "F8_E5M2FNUZ"),
                     ("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64")):
    if hasattr(torch, _name):
        _TO_ST[getattr(torch, _name)] = _code
_FROM_ST = {v: k for k, v in _TO_ST.items()}
# torch's float4_e2m1fn_x2 holds two F4 elements per element: its last dimension is half
# the file's
_F4X2 = getattr(torch, "float4_e2m1fn_x2", None)


def storage_ptr(tensor) -> int:
    """The address of the tensor's storage (0 for a tensor without one, such as meta)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def storage_size(tensor) -> int:
    """The bytes of the tensor's storage (its own bytes where it has none to tell)."""
    try:
        return tensor.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        return tensor.nelement() * tensor.element_size()


def _end_ptr(tensor) -> int:
    """The address just past the tensor's last element (its start when it has none)."""
    if not tensor.nelement():
        return tensor.data_ptr()
    last = sum((n - 1) * st for n, st in zip(tensor.shape, tensor.stride()))
    return tensor.data_ptr() + (last + 1) * tensor.element_size()


def _is_complete(tensor) -> bool:
    """Whether the tensor covers its whole storage, from its first byte."""
    return tensor.data_ptr() == storage_ptr(tensor) and \
        tensor.nelement() * tensor.element_size() == storage_size(tensor)


def _filter_shared_not_shared(groups, state_dict):
    """Each group of names of one storage split where its tensors stop overlapping: walking
    them by address, a tensor that starts at or after the end of the one before it starts
    a new group."""
    out = []
    for group in groups:
        if len(group) < 2:
            out.append(group)
            continue
        spans = sorted((state_dict[n].data_ptr(), _end_ptr(state_dict[n]), n) for n in group)
        stop = None
        for start, end, name in spans:
            if stop is None or start >= stop:
                out.append({name})
            else:
                out[-1].add(name)
            stop = end
    return out


def _find_shared_tensors(state_dict) -> list:
    """Sets of names whose tensors share bytes (a tensor alone is a set of its own), as
    safetensors finds them: by device and storage (meta tensors and tensors without storage
    are left out), then split where they do not overlap."""
    by_storage = {}
    for name, t in state_dict.items():
        if t.device.type != "meta" and storage_ptr(t) and storage_size(t):
            by_storage.setdefault((t.device, storage_ptr(t), storage_size(t)), set()).add(name)
    return _filter_shared_not_shared(sorted(by_storage.values()), state_dict)


def _remove_duplicate_names(state_dict, *, preferred_names=None, discard_names=None) -> dict:
    """{kept name: [names to drop for it]} for the tensors of ``state_dict`` that share
    memory: the name kept covers the whole storage (the first such by name; one not in
    ``discard_names`` where there is one; one of ``preferred_names`` where there is one);
    RuntimeError where no name covers it."""
    preferred, discard = set(preferred_names or ()), set(discard_names or ())
    out = {}
    for group in _find_shared_tensors(state_dict):
        complete = sorted(n for n in group if _is_complete(state_dict[n]))
        if not complete:
            raise RuntimeError(
                f"Error while trying to find names to remove to save state dict, but found no "
                f"suitable name to keep for saving amongst: {group}. None is covering the "
                f"entire storage. Refusing to save/load the model since you could be storing "
                f"much more memory than needed. Please refer to "
                f"https://huggingface.co/docs/safetensors/torch_shared_tensors for more "
                f"information. Or open an issue.")
        keep = ([n for n in complete if n in preferred] or
                [n for n in complete if n not in discard] or complete)[0]
        dropped = sorted(n for n in group if n != keep)
        if dropped:
            out[keep] = dropped
    return out


def _check_for_save(tensors):
    """safetensors' rules: a dict of dense tensors, none sharing memory with another."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    sparse = []
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, not {type(name).__name__}")
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"Key `{name}` is invalid, expected torch.Tensor but received "
                             f"{type(t)}")
        if t.layout != torch.strided:
            sparse.append(name)
    if sparse:
        raise ValueError(f"You are trying to save a sparse tensors: `{sparse}` which this "
                         "library does not support. You can make it a dense tensor before "
                         "saving with `.to_dense()` but be aware this might make a much larger "
                         "file than needed.")
    shared = [g for g in _find_shared_tensors(tensors) if len(g) > 1]
    if shared:
        raise RuntimeError(
            f"Some tensors share memory, this will lead to duplicate memory on disk and "
            f"potential differences when loading them again: {shared}. A potential way to "
            f"correctly save your model is to use `save_model`. More information at "
            f"https://huggingface.co/docs/safetensors/torch_shared_tensors")
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: `{name}` which is not "
                "allowed. It either means you are trying to save tensors which are reference "
                "of each other in which case it's recommended to save only the full tensors, "
                "and reslice at load time, or simply call `.contiguous()` on your tensor to "
                "pack it before saving.")
        if t.dtype not in _TO_ST:
            raise ValueError(f"{name!r}: dtype {t.dtype} has no safetensors equivalent")
        if t.device.type == "meta":
            raise RuntimeError(f"{name!r}: Cannot copy out of meta tensor; no data!")


def _st_shape(t):
    """The tensor's shape as the file records it (F4: elements, two per torch element)."""
    shape = tuple(int(s) for s in t.shape)
    if t.dtype is _F4X2 and _F4X2 is not None:
        shape = shape[:-1] + (shape[-1] * 2,) if shape else (2,)
    return shape


def _items(tensors, check=True):
    """(items for the library's save, tensors to keep alive) of ``tensors``, checked by
    safetensors' rules unless the caller has (``check`` False), after the queued work of
    each CUDA tensor's stream."""
    if check:
        _check_for_save(tensors)
    items, keep, devices = [], [], set()
    for name, t in tensors.items():
        h = t.detach()
        if h.device.type not in ("cpu", "cuda"):
            h = h.to("cpu")
        keep.append(h)
        cuda = h.device.type == "cuda"
        if cuda:
            devices.add(h.device)
        items.append((name, _TO_ST[h.dtype], _st_shape(h), h.data_ptr(),
                      h.numel() * h.element_size(), int(cuda), (h.device.index or 0) if cuda else 0))
    for d in devices:  # the data written is the data after the queued work on the stream
        torch.cuda.current_stream(d).synchronize()
    return items, keep


def _with_format(metadata):
    """The caller's metadata with "format": "pt" unless it says otherwise (a .fst
    container's, which transformers' loaders read through fastensor)."""
    meta = {"format": "pt"}
    meta.update(metadata or {})
    return meta


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _codes_on_gpu(tensors, compression) -> bool:
    """Whether a compressed save of ``tensors`` stages their coded streams: plain tensors,
    nearly all their bytes on one GPU whose encoder codes each float size among them (the
    library's check, :func:`fastensor._fst.gpu_codes`)."""
    if compression in (None, "none") or not tensors or \
            any(type(t) not in (torch.Tensor, torch.nn.Parameter) for t in tensors):
        return False
    cuda = [t for t in tensors if t.device.type == "cuda"]
    on, total = sum(map(_nbytes, cuda)), sum(map(_nbytes, tensors))
    if not cuda or len({t.device for t in cuda}) > 1 or on * 16 < total * 15:
        return False
    sizes = {t.element_size() // (2 if t.is_complex() else 1)
             for t in cuda if t.is_floating_point() or t.is_complex()}
    try:
        return all(_fst.gpu_codes(cuda[0].device.index, e)[0] for e in sizes)
    except (OSError, ValueError):  # (a float size the GPU encoder does not take)
        return False


def _fst_code(directory, tensors, compression, coded=None):
    """``tensors`` coded for a compressed save into ``directory`` (in the memory of
    ``coded``, where given): the library's object of their streams."""
    items, keep = _items({str(i): t.contiguous() for i, t in enumerate(tensors)}, check=False)
    while directory and not os.path.isdir(directory):  # (a checkpoint's first save makes it)
        directory = os.path.dirname(directory)
    coded, _ = _fst.code(directory or ".", items, compression, coded)
    del keep
    return coded


def _save(tensors, filename, metadata, engine, shard_size, cache, compression, coded=None):
    """Write checked tensors: a container (compressed) for a ``.fst`` name, else safetensors.
    ``coded`` (of :func:`_fst_code`, the tensors in this order): their streams, written as
    they are (the tensors may be meta tensors standing for them)."""
    _fst.compression_id(compression)
    _st.layout([], metadata)  # (metadata: str -> str, as safetensors takes it)
    if not str(filename).endswith(_fst.SUFFIX):
        items, keep = _items(tensors)
        _ckpt.save(filename, items, metadata, engine=engine, shard_size=shard_size,
                   cache=cache)
        return
    if shard_size is not None:
        raise ValueError("a .fst container is one file: shard_size does not apply")
    # CUDA tensors stay where they are: their GPU codes them (the library copies to the host
    # what it stores, or codes there where the GPU does not)
    if coded is not None:
        items, keep = [(n, _TO_ST[t.dtype], _st_shape(t), 0, _nbytes(t))
                       for n, t in tensors.items()], None
    else:
        items, keep = _items(tensors)
    _fst.save(filename, items, _with_format(metadata), compression=compression,
              engine=engine, cache=cache, coded=coded)


def save_file(tensors: dict, filename, metadata: dict | None = None, *, engine: str = "auto",
              shard_size: int | None = None, cache: str = "auto",
              compression: str = "auto") -> None:
    """Save tensors as a safetensors checkpoint, or as a compressed container for a name
    ending in ``.fst``.

    ``.fst``: not a safetensors file (``load_file``, ``safe_open``, ``fastensor.inspect`` /
    ``verify`` and ``fastensor convert`` read it). ``compression="always"`` codes each float
    tensor by byte planes (about 0.67 of bf16 weights, 0.83 of fp32) where that saves at
    least 5%, integers stored; ``"auto"`` (default) does so for each float size where the
    codec, measured once per process, saves write time worth its encode (bf16 where it
    encodes at about 2.3x the disk's write rate, fp32 at about 4.6x: it saves half as many
    bytes) and decodes at least as fast as the disk reads (``fastensor._fst.coding_pays``),
    else stores; ``"none"`` stores every tensor.
    A ``.safetensors`` name is never compressed.

    Atomic (temporary file, fdatasync, rename, directory fsync) and checksummed. Above
    ``shard_size`` bytes the data is split into ``NAME-0000i-of-0000N.safetensors`` shards
    plus ``NAME.safetensors.index.json``. ``cache="keep"`` leaves the files in the page cache
    for a load soon after (an evaluation); the default writes around it (O_DIRECT).
    As safetensors: tensors that share memory raise RuntimeError (use :func:`save_model`),
    non-contiguous ones ValueError; the metadata (str -> str, TypeError otherwise) is stored as
    given (a ``.fst`` container adds "format": "pt" unless given).
    Raises ValueError/TypeError for bad input (nothing written) and OSError for I/O failures
    (the previous file is left in place).
    """
    _save(tensors, filename, metadata, engine, shard_size, cache, compression)


def _torch_dtype(dtype_name):
    return _FROM_ST.get(dtype_name)


def _tensor_from(buf, dtype_name, shape, nbytes, off):
    """Tensor of the file's ``dtype_name`` and ``shape`` over ``nbytes`` bytes of the uint8
    buffer ``buf`` at ``off``: packed types torch lacks (F6) come as their raw bytes (uint8,
    shape (nbytes,)); F4 as float4_e2m1fn_x2 where torch has it (last dimension halved)."""
    dt = _torch_dtype(dtype_name)
    if dt is _F4X2 and dt is not None:
        if shape and shape[-1] % 2 == 0:
            shape = tuple(shape[:-1]) + (shape[-1] // 2,)
        else:
            dt = None
    if dt is None:
        if dtype_name in ("F4", "F6_E2M3", "F6_E3M2"):  # packed bytes torch has no type for
            return buf[off:off + nbytes]
        raise ValueError(f"dtype {dtype_name} is not available in this torch {torch.__version__}")
    raw = buf[off:off + nbytes]
    esize = torch.empty((), dtype=dt).element_size()
    if off % esize:  # a foreign file's unaligned tensor: give it storage of its own
        raw = raw.clone()
    if nbytes == 0:
        return torch.empty(shape, dtype=dt, device=buf.device)
    return raw.view(dt).reshape(shape)


def _load_fst(filename, device, names, engine, cache, verify=False, opened=None):
    """A container's tensors (``names``, or all) in one buffer that the tensors view, decoded
    by the library: on the GPU straight into device memory where it can (block checksums are
    checked on the host only, so ``verify=True`` decodes there), else on the host."""
    device = _Arrays.device(device)
    c = _fst.Container(filename, engine=engine, cache=cache, opened=opened)
    cuda = device.type == "cuda"
    if cuda and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    where = device if cuda else "cpu"
    stream = torch.cuda.current_stream(device).cuda_stream if cuda else 0
    index = device.index if cuda else None
    if names is None:  # the whole decoded layout, the next streams read while some decode
        sel, offs = c.entries, [x.begin for x in c.entries]
        buf = torch.empty(max(c.size, 1), dtype=torch.uint8, device=where)
        c.load(buf.data_ptr(), device=index, stream=stream, verify=verify)
    else:
        sel, offs, at = [c.entry(n) for n in names], [], 0
        for x in sel:
            offs.append(at)
            at += (x.nbytes + 63) & ~63  # every tensor on a 64-byte boundary
        buf = torch.empty(max(at, 1), dtype=torch.uint8, device=where)
        c.decode_into({x.name: buf.data_ptr() + o for x, o in zip(sel, offs)}, device=index,
                      stream=stream, verify=verify)
    if device.type not in ("cpu", "cuda"):
        buf = buf.to(device)
    return {x.name: _tensor_from(buf, x.dtype, x.shape, x.nbytes, o) for x, o in zip(sel, offs)}


def _load(filename, device, engine, verify, mmap=None, cache="auto", opened=None):
    device = torch.device(device)
    ck, tensors, meta, shards = opened or _ckpt.open_checkpoint(filename)
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


class _Arrays:
    """How :class:`fastensor._safe.SafeOpen` makes torch tensors."""

    torch_indexing = True  # get_slice indexes as torch does (as safetensors' "mmap" backend)

    @staticmethod
    def device(device):
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return device

    @staticmethod
    def is_host(device):
        return device.type == "cpu"

    @staticmethod
    def frombuffer(mapped, start, size):
        return torch.frombuffer(mapped, dtype=torch.uint8, count=size, offset=start) if size \
            else torch.empty(1, dtype=torch.uint8)

    @staticmethod
    def view(buf, dtype_name, shape, nbytes, off):
        return _tensor_from(buf, dtype_name, tuple(shape), nbytes, off)

    @staticmethod
    def empty(dtype_name, shape, nbytes, device):
        """(uint8 buffer of nbytes, its address, CUDA device index or None, stream)."""
        cuda = device is not None and device.type == "cuda"
        buf = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device if cuda else "cpu")
        stream = torch.cuda.current_stream(device).cuda_stream if cuda else 0
        return buf, buf.data_ptr(), device.index if cuda else None, stream

    @staticmethod
    def window_room(device, most):
        """The bytes a read-ahead window may take on ``device`` (an eighth of what is free on
        a GPU, at most ``most``)."""
        if device.type != "cuda":
            return most
        return min(most, torch.cuda.mem_get_info(device)[0] // 8)

    @staticmethod
    def follow(buf, stream, device):
        """Order the current stream after ``stream`` (the handle ``buf`` was written on),
        and keep ``buf``'s memory from reuse until the current stream's work on it is done."""
        if device.type != "cuda":
            return
        cur = torch.cuda.current_stream(device)
        if cur.cuda_stream != stream:
            cur.wait_stream(torch.cuda.ExternalStream(stream, device=device))
            buf.record_stream(cur)

    @staticmethod
    def finish(buf, dtype_name, shape):
        nbytes = buf.numel() if math.prod(shape) else 0
        return _tensor_from(buf, dtype_name, tuple(shape), min(nbytes, buf.numel()), 0)

    @staticmethod
    def gather(out, span, runs):
        if len(runs) > 1 and len({n for _, n, _ in runs}) == 1 and \
                len({b[0] - a[0] for a, b in zip(runs, runs[1:])}) == 1:
            n, step = runs[0][1], runs[1][0] - runs[0][0]  # evenly spaced: one strided copy
            src = span.as_strided((len(runs), n), (step, 1), runs[0][0])
            out[:len(runs) * n].view(len(runs), n).copy_(src)
            return
        for off, n, at in runs:
            out[at:at + n] = span[off:off + n]

    @staticmethod
    def select(part, rel, device):
        t = part[rel].contiguous()
        return t.to(device) if device.type != "cpu" else t


def safe_open(filename, framework: str = "pt", device="cpu", *, backend: str = "mmap",
              engine: str = "auto", verify: bool = False, cache: str = "auto"):
    """Open a checkpoint (file, index or directory) as ``safetensors.safe_open`` does:
    ``keys()``, ``metadata()``, ``get_tensor(name)`` (only that tensor's bytes are read,
    straight into device memory for CUDA), ``get_slice(name)[...]`` (only the bytes the
    slice needs), as a context manager. ``backend``: "mmap" (host tensors of a shard in the
    page cache view a private mapping of it) or "pread" (tensors are always read)."""
    if framework not in ("pt", "torch", "pytorch"):
        raise _st.SafetensorValueError(f"framework {framework!r}: fastensor.torch.safe_open "
                                       "serves \"pt\"")
    _st.check_backend(backend)
    opened = _ckpt.open_checkpoint(filename)
    if _ckpt.is_container(opened):
        return _fst.FstOpen(filename, _Arrays, device, engine=engine, verify=verify,
                            cache=cache, opened=opened)
    from ._safe import SafeOpen
    return SafeOpen(filename, _Arrays, device, engine=engine, verify=verify, cache=cache,
                    backend=backend, opened=opened)


def _load_some(filename, names, device, engine, verify, cache, backend, opened):
    from ._safe import SafeOpen
    with SafeOpen(filename, _Arrays, device, engine=engine, verify=verify, cache=cache,
                  backend=backend, opened=opened) as f:
        missing = [n for n in names if n not in f._info]
        if missing:
            raise KeyError(f"{filename}: no tensor named {', '.join(map(repr, missing))}")
        return f.get_tensors(names)


def load_file(filename, device="cpu", *, backend: str = "mmap", names=None,
              engine: str = "auto", verify: bool = False, mmap=None,
              cache: str = "auto") -> dict:
    """Load a safetensors file, index or directory (or a ``.fst`` container: decoded on the
    GPU straight into device memory for a CUDA device, else on the host with every block's
    checksum checked, as ``verify=True`` also asks for a CUDA device) into tensors on
    ``device``.

    ``names``: load only these tensors (each read alone, only its bytes; KeyError for a
    name the checkpoint lacks); by default every tensor.

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
    ``backend``: safetensors' names, "mmap" (the default: the above) or "pread" (as
    ``mmap=False``).
    """
    if _st.check_backend(backend) == "pread" and mmap is None:
        mmap = False
    opened = _ckpt.open_checkpoint(filename)
    if _ckpt.is_container(opened):
        return _load_fst(filename, device, None if names is None else list(names), engine,
                         cache, verify, opened)
    if names is not None:
        return _load_some(filename, list(names), device, engine, verify, cache, backend,
                          opened)
    return _load(filename, device, engine, verify, mmap, cache, opened)[0]


def save(tensors: dict, metadata: dict | None = None) -> bytes:
    """The safetensors bytes of ``tensors``, the same bytes ``safetensors.torch.save`` gives
    (the same checks as :func:`save_file`; no checksums, no page alignment)."""
    _check_for_save(tensors)
    host = {k: v.detach().to("cpu") for k, v in tensors.items()}
    items, keep = _items(host, check=False)
    return _st.pack([it[:5] for it in items], metadata)


def load(data: bytes) -> dict:
    """Tensors of safetensors bytes (as ``safetensors.torch.load``), validated as a file is
    (SafetensorError naming what is wrong): they live in memory of their own."""
    return _st.in_memory(data, lambda p: _load(p, "cpu", "auto", False, False, "auto")[0])


def save_model(model, filename, metadata: dict | None = None, force_contiguous: bool = True,
               *, engine: str = "auto", shard_size: int | None = None,
               cache: str = "auto") -> None:
    """Save ``model.state_dict()`` as ``safetensors.torch.save_model`` does: of tensors that
    share memory (tied weights) one is stored, the others are named in the metadata
    (dropped name -> kept name) and restored by :func:`load_model` (and by safetensors'),
    through the model's own ties. ``force_contiguous`` packs non-contiguous tensors."""
    state = model.state_dict()
    for kept, dropped in _remove_duplicate_names(state).items():
        for name in dropped:
            metadata = dict(metadata or {})
            metadata.setdefault(name, kept)  # (the caller's own entry stays)
            del state[name]
    if force_contiguous:
        state = {k: v.contiguous() for k, v in state.items()}
    try:
        save_file(state, filename, metadata, engine=engine, shard_size=shard_size, cache=cache)
    except ValueError as e:
        raise ValueError(f"{e} Or use save_model(..., force_contiguous=True), read the docs "
                         "for potential caveats.") from None


def load_model(model, filename, strict: bool = True, device="cpu", *, backend: str = "mmap",
               engine: str = "auto", verify: bool = False, mmap=None, cache: str = "auto"):
    """Load a checkpoint into ``model`` as ``safetensors.torch.load_model`` does (files of
    either library's ``save_model``, or any state dict): tensors the file stores once for
    tied weights fill every tied name. Returns ``(missing, unexpected)``; with ``strict``,
    RuntimeError listing them instead where either is not empty. ``backend``: as for
    :func:`load_file`."""
    state = load_file(filename, device=device, backend=backend, engine=engine, verify=verify,
                      mmap=mmap, cache=cache)
    dups = _remove_duplicate_names(model.state_dict(), preferred_names=state.keys())
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = set(missing)
    for dropped in dups.values():
        for name in dropped:
            if name in missing:
                missing.discard(name)
            else:
                unexpected.append(name)
    missing = sorted(missing)
    if strict and (missing or unexpected):
        msg = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            msg += "\n    Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing)
        if unexpected:
            msg += "\n    Unexpected key(s) in state_dict: " + ", ".join(
                f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(msg)
    return missing, unexpected


__all__ = ["offload_activations", "OffloadedOptimizer", "stream_parameters", "ParameterStream", "save_file", "load_file", "save_file_async", "save_model",
           "load_model", "save", "load", "safe_open", "SaveFuture", "AsyncSave",
           "release_snapshot_memory", "storage_ptr", "storage_size"]
