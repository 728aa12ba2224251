"""Activation offload: the tensors autograd saves for the backward pass go to a spill file
during the forward pass and come back, prefetched, for the backward pass.

    with fastensor.torch.offload_activations("/nvme/spill") as off:
        loss = model(batch).loss
    loss.backward()
    print(off.stats())

Built on ``torch.autograd.graph.saved_tensors_hooks`` and the C spill store: a pack hands a
tensor above ``min_bytes`` to the store (CUDA tensors are copied into a pinned ring on the
store's stream after the producer's queued work; the tensor is marked as in use on that
stream, so the caching allocator reuses its memory once the copy is done, and no reference
is kept); the store writes the ring copy to its unlinked file in the background. An
unpack reads the tensor back, while entries packed before it (the ones backward needs next)
are prefetched into pinned memory up to ``prefetch_bytes`` ahead.

Handled: a tensor saved by several ops is stored once (keyed on storage, offset, shape,
stride and dtype, while the tensor is alive); parameters and views of parameters are never
offloaded; an in-place change of a saved tensor that is still alive is reported at unpack
(version counter) as autograd itself would; non-contiguous tensors come back with their
strides; unpacking twice (``retain_graph=True``) reads twice; unpacks on other threads and
streams are ordered by the consumer stream; nested hooks; an exception leaving the forward
pass closes the store (its file disappears) and later unpacks raise.
"""
from __future__ import annotations

import collections
import threading
import time
import weakref

import torch

from . import _C
from .store import SpillStore

_MiB = 1 << 20


def _is_parameter(t: torch.Tensor) -> bool:
    """Leaves that require grad (parameters, inputs being optimised) and views of them."""
    if t.is_leaf and t.requires_grad:
        return True
    base = t._base
    return base is not None and base.is_leaf and base.requires_grad


def _layout(t: torch.Tensor) -> str:
    """'dense': the elements fill their storage span in some dimension order (contiguous,
    transposed, permuted); 'gaps': no element shared but holes between them (a slice);
    'overlap': elements shared (an expanded tensor)."""
    dims = sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1)
    expect, dense = 1, True
    for st, sz in dims:
        if st < expect:
            return "overlap"
        dense = dense and st == expect
        expect = st * sz
    return "dense" if dense else "gaps"


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


def measure_read_bandwidth(directory=None, nbytes: int = 64 * _MiB) -> float:
    """Bytes per second the spill directory's storage reads at (O_DIRECT when it can)."""
    buf = torch.empty(nbytes, dtype=torch.uint8)
    for engine in ("direct", "auto"):
        try:
            with SpillStore(directory, staging_bytes=4096, engine=engine) as st:
                key = st.put(buf)  # larger than the ring: written straight, never cached
                st.wait(key)
                t0 = time.perf_counter()
                st.get(key, buf)
                st.wait(key)
                return nbytes / max(time.perf_counter() - t0, 1e-6)
        except OSError:
            continue
    return 1e9


class _Sequence:
    """The handles of one forward pass, in pack order, and how far prefetching has got."""
    __slots__ = ("handles", "cursor", "ahead", "unpacking")

    def __init__(self):
        self.handles = []       # weak references, in pack order
        self.cursor = 1 << 62   # next index to prefetch, going down
        self.ahead = 0          # bytes prefetched and not unpacked yet
        self.unpacking = False


class _Packed:
    """What a pack hook returns for an offloaded tensor."""
    __slots__ = ("owner", "key", "shape", "stride", "dtype", "device", "nbytes", "ptr",
                 "version", "ref", "dense", "seq", "index", "prefetched", "unpacked",
                 "copy", "__weakref__")

    def __del__(self):
        owner = self.owner
        if owner is not None:
            owner._forget(self)


class offload_activations(torch.autograd.graph.saved_tensors_hooks):
    """Context manager offloading saved activations to SSD (see the module's text).

    ``directory``: where the spill file lives (None: $FASTENSOR_SPILL_DIR, $TMPDIR,
    /var/tmp); ``min_bytes``: smaller tensors stay in memory; ``host_cache_bytes``: up to this
    many bytes stay in pinned host memory and never reach the disk; ``prefetch_bytes``: how
    far backward reads run ahead (None: a quarter second of the disk's measured read
    bandwidth, 64 MiB to 1 GiB); ``engine``: the store's engine ("auto": through the page
    cache while the spill file is within ``page_cache_bytes``, 0 meaning an eighth of the
    memory available, then O_DIRECT); ``capacity``: a limit on the spill file (0: the
    filesystem's space). Usable for several steps (``with off:`` each time); :meth:`stats`
    accumulates.
    """

    def __init__(self, directory=None, *, min_bytes: int = _MiB, host_cache_bytes: int = 0,
                 prefetch_bytes: int | None = None, engine: str = "auto",
                 capacity: int = 0, page_cache_bytes: int = 0, _check: bool = False):
        if not isinstance(min_bytes, int) or min_bytes < 0:
            raise ValueError(f"min_bytes must be a non-negative int, not {min_bytes!r}")
        if prefetch_bytes is None:
            bw = measure_read_bandwidth(directory)
            prefetch_bytes = int(min(max(bw * 0.25, 64 * _MiB), 1024 * _MiB))
        if not isinstance(prefetch_bytes, int) or prefetch_bytes < 0:
            raise ValueError(f"prefetch_bytes must be a non-negative int, not {prefetch_bytes!r}")
        self.min_bytes = min_bytes
        self.prefetch_bytes = prefetch_bytes
        self._check = _check  # debugging: keep a copy of each tensor, compare at unpack
        # The ring holds puts in flight (the forward pass) and prefetched entries (backward).
        self._store = SpillStore(directory, capacity=capacity,
                                 staging_bytes=prefetch_bytes + 256 * _MiB,
                                 host_cache_bytes=host_cache_bytes, engine=engine,
                                 page_cache_bytes=page_cache_bytes)
        self._h = self._store._h
        self._ring_limit = _C.store_ring_limit(self._h)
        self._copy_streams = {}
        self._lock = threading.RLock()
        self._pending = collections.deque()  # (key, source) of puts still reading the source
        self._dedup = weakref.WeakValueDictionary()
        self._seq = None
        self._closed = False
        self._counts = {"tensors_offloaded": 0, "tensors_kept": 0, "dedup_hits": 0,
                        "alive_hits": 0}
        super().__init__(self._pack, self._unpack)

    # -- hooks -------------------------------------------------------------------------

    def _pack(self, t):
        if (self._closed or t.layout != torch.strided or t.device.type not in ("cpu", "cuda")
                or t.numel() * t.element_size() < self.min_bytes or _is_parameter(t)):
            self._counts["tensors_kept"] += 1
            return t
        layout = _layout(t)
        if layout == "overlap":
            self._counts["tensors_kept"] += 1
            return t
        dkey = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, t.device)
        with self._lock:
            self._reap()
            same = self._dedup.get(dkey)
            alive = same.ref() if same is not None and same.ref is not None else None
            if alive is not None and alive.data_ptr() == dkey[0] and same.version == t._version:
                self._counts["dedup_hits"] += 1
                return same
        src = t if layout == "dense" else t.contiguous()
        h = _Packed()
        h.owner = None
        h.shape, h.stride, h.dtype, h.device = tuple(t.shape), tuple(t.stride()), t.dtype, t.device
        h.nbytes = t.numel() * t.element_size()
        h.ptr, h.version, h.dense = t.data_ptr(), t._version, layout == "dense"
        h.prefetched = h.unpacked = False
        h.copy = None
        if self._check:  # aside in host memory: GPU allocations stay as without the check
            h.copy = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.device.type == "cuda")
            h.copy.copy_(t, non_blocking=True)
        try:
            h.ref = weakref.ref(t)
        except TypeError:
            h.ref = None
        cuda = t.device.type == "cuda"
        h.key = _C.store_put(self._h, src.data_ptr(), h.nbytes, int(cuda),
                             (t.device.index or 0) if cuda else 0, _stream(t.device))
        h.owner = self
        if cuda and -(-h.nbytes // 4096) * 4096 <= self._ring_limit:  # whole blocks
            # Only a copy on the store's stream reads the source: the caching allocator may
            # reuse its memory once that stream is past the copy, so no reference is kept
            # (the host may run far ahead of the GPU without holding activations).
            src.record_stream(self._copy_stream(t.device))
            src = None
        with self._lock:
            if src is not None:
                self._pending.append((h.key, src))
            self._dedup[dkey] = h
            if self._seq is None or self._seq.unpacking:
                self._seq = _Sequence()
            h.seq, h.index = self._seq, len(self._seq.handles)
            self._seq.handles.append(weakref.ref(h))
            self._counts["tensors_offloaded"] += 1
        return h

    def _unpack(self, h):
        if not isinstance(h, _Packed):
            return h
        with self._lock:
            self._reap()  # a tensor only we kept alive must not count as alive
        t = h.ref() if h.ref is not None else None
        if t is not None and t.data_ptr() == h.ptr:  # still alive: no I/O needed
            if t._version != h.version:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified "
                    f"by an inplace operation after fastensor offloaded it: a {h.dtype} "
                    f"tensor of shape {list(h.shape)} is at version {t._version}, expected "
                    f"version {h.version}")
            self._counts["alive_hits"] += 1
            return t
        if self._closed:
            raise RuntimeError("fastensor.offload_activations: the spill store is closed "
                               "(an exception left the forward pass, or close() was called); "
                               "the offloaded activations are gone")
        with self._lock:
            seq = h.seq
            seq.unpacking = True
            if h.prefetched and not h.unpacked:
                seq.ahead -= h.nbytes
            h.unpacked = True
            self._prefetch_before(seq, h.index)
        if h.dense:
            out = torch.empty_strided(h.shape, h.stride, dtype=h.dtype, device=h.device)
        else:
            out = torch.empty(h.shape, dtype=h.dtype, device=h.device)
        cuda = h.device.type == "cuda"
        _C.store_get(self._h, h.key, out.data_ptr(), h.nbytes, int(cuda),
                     (h.device.index or 0) if cuda else 0, _stream(h.device))
        _C.store_wait(self._h, h.key)
        if not h.dense:  # a slice: back to its strides, holes and all
            out = torch.empty_strided(h.shape, h.stride, dtype=h.dtype,
                                      device=h.device).copy_(out)
        if h.copy is not None and not torch.equal(out.cpu(), h.copy):
            raise RuntimeError(f"fastensor offload check: a {h.dtype} tensor of shape "
                               f"{list(h.shape)} came back different")
        return out

    # -- bookkeeping (lock held) -------------------------------------------------------

    def _copy_stream(self, device):
        s = self._copy_streams.get(device)
        if s is None:
            s = torch.cuda.ExternalStream(_C.store_stream(self._h, device.index or 0),
                                          device=device)
            self._copy_streams[device] = s
        return s

    def _reap(self):
        """Let go of sources the store no longer reads, oldest first."""
        while self._pending and self._source_released(self._pending[0][0]):
            self._pending.popleft()

    def _source_released(self, key):
        try:
            return _C.store_released(self._h, key)
        except (OSError, ValueError):
            return True  # dropped, or the put failed: the source is not read any more

    def _prefetch_before(self, seq, index):
        """Prefetch the entries packed before ``index``, nearest first, up to the budget."""
        j = min(seq.cursor, index - 1)
        while j >= 0 and seq.ahead < self.prefetch_bytes:
            hj = seq.handles[j]()
            if hj is not None and not hj.unpacked and not hj.prefetched:
                if _C.store_prefetch(self._h, hj.key) < 0:
                    break  # no ring space now: go on at the next unpack
                hj.prefetched = True
                seq.ahead += hj.nbytes
            j -= 1
        seq.cursor = j

    def _forget(self, h):
        if not self._closed:
            try:
                _C.store_drop(self._h, h.key)
            except (ValueError, OSError):
                pass

    # -- public ------------------------------------------------------------------------

    def __exit__(self, exc_type, exc, tb):
        super().__exit__(exc_type, exc, tb)
        if exc_type is not None:
            self.close()
        return False

    def close(self) -> None:
        """Free the store and its spill file now (waits for transfers in flight)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._store.close()
            self._pending.clear()

    def flush(self) -> None:
        """Wait until every tensor offloaded so far is stored (in the file or the host tier)
        and let go of the sources; OSError for the first store that failed."""
        with self._lock:
            self._store.flush()
            self._reap()

    def stats(self) -> dict:
        """Counters since creation: bytes_offloaded, bytes_prefetched, stall_seconds,
        peak_inflight_bytes, bytes_written, bytes_read, tensors_offloaded/kept, ..."""
        c = dict(self._counts)
        if self._closed:
            return c
        with self._lock:
            self._reap()
        s = self._store.stats()
        c.update(bytes_offloaded=s["bytes_put"], bytes_prefetched=s["bytes_prefetched"],
                 stall_seconds=s["stall_ns"] / 1e9,
                 peak_inflight_bytes=s["peak_inflight_bytes"],
                 bytes_written=s["bytes_written"], writes_skipped=s["writes_skipped"],
                 bytes_read=s["bytes_read"],
                 bytes_reloaded=s["bytes_got"], host_hits=s["host_hits"],
                 entries=s["entries"], spill_file_bytes=s["file_size"], engine=s["engine"])
        return c
