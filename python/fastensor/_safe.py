"""``safe_open``: one open checkpoint, tensors read one at a time or in slices, reading only
the bytes asked for. The framework layers (torch, numpy) supply how to allocate an array and
view bytes; everything about the file and the byte ranges is here."""
from __future__ import annotations

import collections
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from . import _C, _ckpt, _st, cache_id, engine_id

# Runs of a slice closer than this are read as one span (they share pages anyway).
_MERGE_GAP = 4096
# A loop of get_tensor calls in file order (what loaders do) reads ahead: from the second
# tensor that follows the one before it, the tensors after it in its shard are read with it
# in one read, served as views of that read (as load_file's tensors view their shard),
# instead of one small transfer per tensor. The first read-ahead of a run takes up to
# _WINDOW_FIRST bytes, each next one of the same run twice the last, up to _WINDOW_MOST:
# a short run reads little it does not use, a long one approaches one read of the shard.
# Windows are read on threads of the open file, the next one in flight while the loop waits
# for one: the reads follow each other without a gap, and the disk and the copies to the
# device do not wait for the loop.
_WINDOWS_IN_FLIGHT = 2
_WINDOW_FIRST = 128 << 20
_WINDOW_MOST = 1 << 30
# Window reads start on this alignment of the data section, so the tensors in them keep the
# file's alignment of their elements.
_WINDOW_ALIGN = 64
# the library's dtypes (ft_dtype_name, ft_dtype_bits): bits of the packed sub-byte types,
# bytes of the others
_PACKED_BITS = {name: bits for name, bits, _ in _C.DTYPES if bits % 8}
_BYTES = {name: bits // 8 for name, bits, _ in _C.DTYPES if bits % 8 == 0}


def runs_of(shape, box, esize):
    """The contiguous byte runs [(offset, nbytes, box_offset)] that hold the box
    [(lo, hi)] of a row-major tensor of ``shape`` with ``esize``-byte elements, in order."""
    nd = len(shape)
    k = nd - 1  # the innermost dimension the box does not cover whole
    while k >= 0 and box[k] == (0, shape[k]):
        k -= 1
    inner = esize * math.prod(shape[k + 1:])
    if k < 0:
        return [(0, inner, 0)]
    strides = [esize * math.prod(shape[d + 1:]) for d in range(nd)]
    run = (box[k][1] - box[k][0]) * inner
    outer = [range(lo, hi) for lo, hi in box[:k]]
    runs, at = [], 0
    def walk(d, base):
        nonlocal at
        if d == k:
            runs.append((base + box[k][0] * strides[k], run, at))
            at += run
            return
        for i in outer[d]:
            walk(d + 1, base + i * strides[d])
    walk(0, 0)
    return runs


class Opened:
    """What every ``safe_open`` handle shares: the context manager and lazy slices (the
    handle gives ``_entry(name)``, ``read_box(name, box)``, ``_adapter``, ``_device``, and
    ``_torch_indexing``: whether slices index as torch does, as safetensors' own do for
    torch tensors of its default backend, or by safetensors' strict rules)."""

    _torch_indexing = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def get_slice(self, name):
        """A lazy view of tensor ``name``: ``get_shape()``, ``get_dtype()``, and ``[...]``."""
        self._entry(name)
        return _Slice(self, name)


class SafeOpen(Opened):
    """A checkpoint held open: ``keys()``, ``metadata()``, ``get_tensor(name)``,
    ``get_slice(name)[...]``. ``adapter`` makes arrays for the framework."""

    def __init__(self, filename, adapter, device, *, engine="auto", verify=False,
                 cache="auto", backend="mmap", opened=None):
        self._adapter = adapter
        self._device = adapter.device(device)
        self._engine, self._verify, self._cache = engine_id(engine), bool(verify), cache_id(cache)
        self._filename = os.fspath(filename)
        self._ck, tensors, self._meta, self._shards = opened or _ckpt.open_checkpoint(filename)
        self._checksums = _C.ckpt_describe(self._ck)[3]
        self._info = {t[0]: (i,) + tuple(t[1:]) for i, t in enumerate(tensors)}
        self._order = [t[0] for t in tensors]
        # file order: (shard, data offset, end) per position, and each name's position
        spans = sorted((t[4], t[5], t[5] + t[3], t[0]) for t in tensors)
        self._spans = [sp[:3] for sp in spans]
        self._pos = {sp[3]: k for k, sp in enumerate(spans)}
        self._last = None     # the position of the last tensor read
        self._window = None   # (shard, lo, hi, buffer, stream) of the last read-ahead
        # the next ones of the run, being read: (shard, lo, hi, buffer, stream, future), in
        # file order; and the file position after the last of them
        self._ahead, self._next = collections.deque(), 0
        self._reader = None   # the threads that read them, made on first use
        self._window_next = _WINDOW_FIRST  # the most bytes the next read-ahead takes
        self._window_lock = threading.Lock()
        # host tensors of a shard the cache mode keeps view a private mapping of it, as
        # load_file's do (no copy, no fresh memory); None: read instead
        self._maps = {} if adapter.is_host(self._device) and backend == "mmap" else None
        self._torch_indexing = adapter.torch_indexing and backend == "mmap"
        self._engine_name, self._cache_name = engine, cache

    def close(self):
        with self._window_lock:
            self._settle()
            if self._reader is not None:
                self._reader.shutdown(wait=True)
                self._reader = None
            self._ck = None
            self._maps = None if self._maps is None else {}
            self._window = None

    def _open(self):
        if self._ck is None:
            raise _st.SafetensorValueError(f"{self._filename}: the checkpoint is closed")
        return self._ck

    # ---- what the file says ----
    def keys(self) -> list:
        """The tensor names, sorted (as safetensors' ``safe_open.keys``)."""
        self._open()
        return sorted(self._info)

    def offset_keys(self) -> list:
        """The tensor names in file order."""
        self._open()
        return list(self._order)

    def metadata(self):
        """The user's metadata (str -> str), None when the file has none; fastensor's
        checksum keys are not part of it (see :attr:`checksums`)."""
        self._open()
        return dict(self._meta) if self._meta else None

    @property
    def checksums(self) -> bool:
        """Whether every shard carries fastensor's block checksums."""
        return bool(self._checksums)

    def _entry(self, name):
        self._open()
        try:
            return self._info[name]
        except KeyError:
            raise _st.SafetensorKeyError(f"File does not contain tensor {name}") from None

    # ---- reads ----
    def _read(self, index, offset, address, nbytes, cuda_device=None, stream=0, shard=False):
        """Bytes [offset, offset + nbytes) of tensor ``index`` (of shard ``index``'s data
        section with ``shard``) into memory at ``address``."""
        if nbytes == 0:
            return
        read = _C.ckpt_read_shard if shard else _C.ckpt_read
        read(self._open(), index, offset, address, nbytes, self._engine, self._verify,
             0 if cuda_device is None else 1, cuda_device or 0, stream, self._cache)

    def get_tensor(self, name):
        """Tensor ``name`` on the device, reading only its bytes (straight into device
        memory for a CUDA device)."""
        index, dtype, shape, nbytes, shard, off = self._entry(name)
        mapped = self._mapping(shard)
        if mapped is not None:
            return self._adapter.view(mapped, dtype, shape, nbytes, off)
        window = self._window_for(name, shard, off, nbytes)
        if window is not None:
            _, lo, _, buf, stream = window
            self._adapter.follow(buf, stream, self._device)
            return self._adapter.view(buf, dtype, shape, nbytes, off - lo)
        out, address, cuda_device, stream = self._adapter.empty(dtype, shape, nbytes,
                                                                self._device)
        self._read(index, 0, address, nbytes, cuda_device, stream)
        return self._adapter.finish(out, dtype, shape)

    def _window_for(self, name, shard, off, nbytes):
        """The read-ahead window that holds tensor ``name`` (read now when the tensor follows
        the one read before it), or None: read the tensor alone."""
        with self._window_lock:
            pos, last = self._pos[name], self._last
            self._last = pos
            w = self._window
            if w is not None and w[0] == shard and w[1] <= off and off + nbytes <= w[2]:
                return w
            a = self._ahead[0] if self._ahead else None
            if a is not None and a[0] == shard and a[1] <= off and off + nbytes <= a[2]:
                return self._serve()
            if last is None or pos != last + 1:
                self._window_next = _WINDOW_FIRST
                return None
            plan = self._plan(pos, off)
            if plan is None or plan[3] == pos + 1:  # nothing after it fits: alone
                return None
            self._settle()
            self._ahead.append(self._submit(plan))
            return self._serve()

    def _serve(self):
        """The first window read ahead, once read (its read's error, if any, is this call's),
        made the current one; the next ones are in flight by then."""
        while len(self._ahead) < _WINDOWS_IN_FLIGHT and self._next < len(self._spans):
            plan = self._plan(self._next)
            if plan is None:
                break
            self._ahead.append(self._submit(plan))
        a = self._ahead.popleft()
        a[5].result()
        self._window = a[:5]
        return self._window

    def _plan(self, k, off=None):
        """The next window: file positions k, k + 1, ... of k's shard, from ``off`` (k's
        offset by default) while they fit the room it may take (more where k alone is larger:
        k and as much again as the room); (shard, lo, hi, first position after it), or None
        where even k does not fit the most a window may take."""
        shard, begin, hi = self._spans[k]
        lo = (begin if off is None else off) // _WINDOW_ALIGN * _WINDOW_ALIGN
        room = self._adapter.window_room(self._device, self._window_next)
        if hi - lo > room:
            room = min(hi - lo + room, self._adapter.window_room(self._device, _WINDOW_MOST))
            if hi - lo > room:
                return None
        k += 1
        while k < len(self._spans) and self._spans[k][0] == shard and \
                self._spans[k][2] - lo <= room:
            hi, k = max(hi, self._spans[k][2]), k + 1
        return shard, lo, hi, k

    def _submit(self, plan):
        """Start reading a planned window on the open file's threads; the next window may
        take twice the room (a plan dropped unread leaves the room as it was)."""
        shard, lo, hi, after = plan
        self._window_next = min(2 * self._window_next, _WINDOW_MOST)
        if self._reader is None:
            self._reader = ThreadPoolExecutor(max_workers=_WINDOWS_IN_FLIGHT)
        buf, address, cuda_device, stream = self._adapter.empty("U8", (hi - lo,), hi - lo,
                                                                self._device)
        job = self._reader.submit(self._read, shard, lo, address, hi - lo, cuda_device, stream,
                                  shard=True)
        self._next = after
        return (shard, lo, hi, buf, stream, job)

    def _settle(self):
        """Drop the windows being read ahead, once their reads have ended (their memory is
        the reads' destination until then); their errors, if any, are not the caller's."""
        while self._ahead:
            window = self._ahead[0]  # held (with its buffer) until its read has ended
            try:
                window[5].result()
            except Exception:  # noqa: BLE001 (no one asked for those tensors)
                pass
            self._ahead.popleft()
            del window

    def _mapping(self, shard):
        """The uint8 view of shard ``shard``'s data section in a private mapping, or None."""
        if self._maps is None:
            return None
        if shard not in self._maps:
            m = _ckpt.mapped_shard(self._ck, shard, self._shards[shard],
                                   engine=self._engine_name, verify=self._verify,
                                   cache=self._cache_name)
            self._maps[shard] = None if m is None else \
                self._adapter.frombuffer(m, self._shards[shard][2], self._shards[shard][1])
        return self._maps[shard]

    def get_tensors(self, names=None, threads: int = 8) -> dict:
        """Several tensors (all, by default), read concurrently."""
        names = self.offset_keys() if names is None else list(names)
        for n in names:
            self._entry(n)
        if len(names) <= 1:
            return {n: self.get_tensor(n) for n in names}
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(names)))) as ex:
            return dict(zip(names, ex.map(self.get_tensor, names)))

    def read_box(self, name, box):
        """The bytes of the box [(lo, hi)] of tensor ``name``, dense, in host memory (an
        array of the box's shape)."""
        index, dtype, shape, nbytes, _, _ = self._entry(name)
        if dtype in _PACKED_BITS:
            if any(b != (0, n) for b, n in zip(box, shape)):
                raise ValueError(f"{name!r}: {dtype} elements are packed below a byte; "
                                 "slice it after get_tensor")
        esize = _BYTES.get(dtype, 1)
        dims = tuple(hi - lo for lo, hi in box)
        total = esize * math.prod(dims) if dtype not in _PACKED_BITS else nbytes
        out, address, _, _ = self._adapter.empty(dtype, dims, total, None)
        if total == 0:
            return self._adapter.finish(out, dtype, dims)
        runs = runs_of(shape, box, esize) if dtype not in _PACKED_BITS else [(0, nbytes, 0)]
        gaps = [b[0] - (a[0] + a[1]) for a, b in zip(runs, runs[1:])]
        if gaps and max(gaps) < _MERGE_GAP:
            # close runs: one read of their span, then the runs picked out of it
            first, last = runs[0][0], runs[-1][0] + runs[-1][1]
            span, span_addr, _, _ = self._adapter.empty("U8", (last - first,), last - first,
                                                        None)
            self._read(index, first, span_addr, last - first)
            self._adapter.gather(out, span, [(o - first, n, at) for o, n, at in runs])
        elif len(runs) == 1:
            self._read(index, runs[0][0], address, runs[0][1])
        else:  # runs far apart (a block of columns): one batch, read in parallel
            _C.ckpt_read_ranges(self._open(), index,
                                [(address + at, n, off, 0, 0) for off, n, at in runs],
                                self._engine, self._verify, 0, self._cache)
        return self._adapter.finish(out, dtype, dims)


class _Slice:
    def __init__(self, owner, name):
        self._owner, self._name = owner, name

    def get_shape(self) -> list:
        return list(self._owner._entry(self._name)[2])

    def get_dtype(self) -> str:
        """The safetensors dtype name ("F32", "BF16", ...)."""
        return self._owner._entry(self._name)[1]

    def __len__(self):
        shape = self.get_shape()
        if not shape:
            raise TypeError("len() of a 0-d tensor")
        return shape[0]

    def __getitem__(self, key):
        """torch's indexing for torch tensors of the "mmap" backend (as safetensors gives
        them: ints, slices, ``...``, ``None``, lists, tensors), else safetensors' strict
        rules (ints, slices with a positive step that stay inside the tensor, one ``...``, an
        empty list; SafetensorError for the rest). Only the bytes of the box a basic index
        selects are read; other indexes read the tensor, then index it."""
        owner = self._owner
        shape = owner._entry(self._name)[2]
        if owner._torch_indexing:
            sel = _basic_index(key, shape)
            if sel is None:  # torch's rules and errors, on the whole tensor
                return owner._adapter.select(owner.get_tensor(self._name), key, owner._device)
        else:
            sel = _st.resolve_index(_st.parse_index(key, shape), shape)
        box = [(lo, (lo + ((hi - lo - 1) // st) * st + 1) if hi > lo else lo)
               for lo, hi, st, _ in sel]
        part = owner.read_box(self._name, box)
        rel = tuple(slice(0, hi2 - lo, st) if keep else 0
                    for (lo, hi, st, keep), (_, hi2) in zip(sel, box))
        return owner._adapter.select(part, rel, owner._device)


def _basic_index(key, shape):
    """[(start, stop, step, keeps the dimension)] per dimension for a key torch would index
    the same way as Python sequences (ints in range, slices with a positive step, one
    ``...``), bounds clamped as torch clamps them; None for any other key."""
    items = key if isinstance(key, tuple) else (key,)
    if sum(k is Ellipsis for k in items) > 1:
        return None
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items = items[:at] + (slice(None),) * (len(shape) - len(items) + 1) + items[at + 1:]
    if len(items) > len(shape):
        return None
    out = []
    for k, n in zip(items + (slice(None),) * (len(shape) - len(items)), shape):
        if isinstance(k, slice):
            if k.step is not None and (not hasattr(k.step, "__index__") or k.step <= 0):
                return None
            if any(v is not None and not hasattr(v, "__index__") for v in (k.start, k.stop)):
                return None
            start, stop, step = k.indices(n)
            out.append((start, max(stop, start), step, True))
        elif not isinstance(k, bool) and hasattr(k, "__index__") and \
                not (hasattr(k, "dim") and k.dim() > 0):
            i = k.__index__()
            if not -n <= i < n:
                return None
            out.append((i % n, i % n + 1, 1, False))
        else:
            return None
    return out
