"""Activation offload: the tensors autograd saves for the backward pass leave the GPU during
the forward pass (only as many as must) and come back, prefetched, for the backward pass.

    for batch in loader:
        with fastensor.torch.offload_activations() as off:
            loss = model(batch).loss
        loss.backward()
    print(off.stats())

Three tiers, each used before the next: the GPU, while the step's memory is under
``gpu_budget_bytes`` (default: the allocator's limit less what backward was measured to
need beyond the forward pass; when a pack finds it over, the tensors packed first, which
backward needs last, leave first); pinned host memory,
up to ``host_cache_bytes`` (default: a quarter of the memory available); then one unlinked
spill file on local storage. The host tier sends its oldest entries to the file when it
fills. A step no larger than the last one measured on the GPU, where that one kept every
tensor there within the budget, passes through: autograd gets the tensors themselves, no
handle, so the hooks cost next to nothing (checked as it goes: a tensor larger than that
step's largest, or the memory allocated rising past that step's plus half the headroom it
left, and the rest of the step is budgeted as usual).

Built on ``torch.autograd.graph.saved_tensors_hooks`` and the C spill store. The store, its
pinned memory and its measurements belong to the process and are shared by every context
made with the same settings, so entering a new ``offload_activations(...)`` each step costs
nothing. A CUDA tensor that leaves the GPU is copied on the store's stream after the
producer's queued work and marked as in use there, so the caching allocator reuses its
memory once the copy is done and no reference is kept. An unpack brings its tensor back
while the entries packed before it (the ones backward needs next) are prefetched into
pinned memory, as far ahead as the measured rates of backward and of the disk ask for.

Handled: a tensor saved by several ops is stored once (keyed on storage, offset, shape,
stride and dtype, while the tensor is alive); parameters and views of parameters are never
offloaded; an in-place change of a saved tensor that is still alive is reported at unpack
(version counter) as autograd itself would; non-contiguous tensors come back with their
strides; unpacking twice (``retain_graph=True``) reads twice; unpacks on other threads and
streams are ordered by the consumer stream; nested hooks. An exception leaving the forward
pass (out-of-memory errors included) waits for the context's copies in flight, drops its
entries (later unpacks of that graph raise) and leaves the store ready for the next step; an
exception in backward leaves the store consistent the same way.
"""
from __future__ import annotations

import collections
import os
import threading
import time
import weakref

import torch

from . import _C
from ._gpumem import _allocated, _fraction_limit, gpu_memory_limit
from .store import HOST_AUTO, SpillStore

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
    if t.is_contiguous():  # most saved tensors: one cheap call
        return "dense"
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


class _Sequence:
    """The handles of one forward pass, in pack order, and how far prefetching has got."""
    __slots__ = ("handles", "cursor", "ahead", "unpacking", "t_first", "bytes_unpacked",
                 "bytes_read0", "device", "forward_end", "peak0", "largest", "growth",
                 "gpu_unpacks", "stored")

    def __init__(self):
        self.handles = []       # weak references, in pack order
        self.cursor = 1 << 62   # next index to prefetch, going down
        self.ahead = 0          # bytes prefetched and not unpacked yet
        self.unpacking = False
        self.t_first = 0.0      # when backward's first unpack came
        self.bytes_unpacked = 0
        self.bytes_read0 = 0    # the store's bytes_read then
        self.device = None      # the CUDA device of its tensors, if any
        self.forward_end = 0    # bytes allocated there at backward's first unpack
        self.peak0 = 0          # the allocator's peak then
        self.largest = 0        # the largest CUDA tensor packed in its forward pass
        self.growth = 0         # most bytes allocated beyond forward_end, seen at unpacks
        self.gpu_unpacks = 0
        self.stored = 0         # its tensors that left the GPU


class _Through:
    """A step kept on the GPU as it is (see offload_activations._pass_through)."""
    __slots__ = ("device", "index", "largest", "cap", "forward_end", "interval", "packed",
                 "next_check")

    def __init__(self, device, largest, cap, forward_end, interval):
        self.device, self.largest, self.cap = device, largest, cap
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self.forward_end, self.interval = forward_end, interval
        self.packed, self.next_check = 0, interval


class _Packed:
    """What a pack hook returns for a tensor it took: held on the GPU (``gpu``) or stored
    (``key``)."""
    __slots__ = ("owner", "key", "gpu", "shape", "stride", "dtype", "device", "nbytes", "ptr",
                 "version", "ref", "dense", "seq", "index", "prefetched", "unpacked",
                 "copy", "__weakref__")

    def __del__(self):
        owner = self.owner
        if owner is not None:
            owner._forget(self)


class _Shared:
    """A store of the process and what was measured with it (one per set of settings)."""

    def __init__(self, store: SpillStore):
        self.store = store
        self.h = store._h
        self.ring_limit = _C.store_ring_limit(self.h)
        self.lock = threading.RLock()
        self.copy_streams = {}
        self.consume_rate = 0.0  # bytes per second backward unpacked, last sequence
        self.read_rate = 0.0     # bytes per second the store read from its file meanwhile
        # device -> what backward allocated beyond the forward pass's end, over the largest
        # tensor packed in that forward pass (the GPU budget's margin scales with it)
        self.growth_ratio = {}
        self.slack = {}            # device -> bytes of the margin beyond those estimates
        # device -> (largest tensor, bytes allocated at backward's start, the allocator's
        # peak of reserved memory after backward, whether every tensor stayed on the GPU,
        # the memory limit then) of the last step measured: the headroom that step left
        # under the limit, fragments included
        self.last = {}

    def copy_stream(self, device):
        s = self.copy_streams.get(device)
        if s is None:
            s = torch.cuda.ExternalStream(_C.store_stream(self.h, device.index or 0),
                                          device=device)
            self.copy_streams[device] = s
        return s


# Stores live as long as the process: the CUDA caching allocator keeps the store's stream in
# its records of the memory it copied from, so the stream must outlive every such block.
_STORES: dict = {}
_STORES_LOCK = threading.Lock()


def shared_store(directory, *, host_cache_bytes, engine: str = "auto", capacity: int = 0,
                 page_cache_bytes: int = 0, prefetch_bytes: int | None = None) -> _Shared:
    """The process's store for these settings (made on first use): activation offload and
    optimizer offload made with the same settings share it, and its host tier."""
    d = None if directory is None else os.path.realpath(os.fspath(directory))
    host = HOST_AUTO if host_cache_bytes == "auto" else host_cache_bytes
    # The ring holds puts in flight and prefetched entries beside the host tier.
    staging = 256 * _MiB + (prefetch_bytes or 0)
    key = (d, host, engine, capacity, page_cache_bytes, staging)
    with _STORES_LOCK:
        sh = _STORES.get(key)
        if sh is None:
            sh = _STORES[key] = _Shared(SpillStore(
                d, capacity=capacity, staging_bytes=staging, host_cache_bytes=host,
                engine=engine, page_cache_bytes=page_cache_bytes))
        return sh


class offload_activations(torch.autograd.graph.saved_tensors_hooks):
    """Context manager offloading saved activations (see the module's text).

    ``directory``: where the spill file lives (None: $FASTENSOR_SPILL_DIR, $TMPDIR,
    /var/tmp); ``min_bytes``: smaller tensors stay where they are; ``gpu_budget_bytes``: CUDA
    tensors stay on the GPU while the memory allocated on their device is within this (None:
    :func:`gpu_memory_limit` less a margin: what backward allocated beyond the forward
    pass's end in the last measured step, over the largest tensor packed then (4 before a
    measurement), plus a tenth, times the largest tensor packed so far in this step; plus
    twice that tensor (the next forward op's output) and 1/16 of the limit (doubled after
    each out-of-memory error leaving a forward pass); after a step with tensors no larger,
    at least what that step had allocated when backward began plus the headroom its peak
    left under the limit (reserved memory), less 1/32 of it; 0: every tensor leaves);
    ``host_cache_bytes``: the pinned host tier ("auto": a quarter of the memory available;
    0: none, every tensor goes to the file); ``prefetch_bytes``: how far backward
    reads run ahead (None: a quarter second of backward's measured consumption or of the
    disk's measured read rate, whichever is larger, 64 MiB to half the ring; 256 MiB before
    anything is measured); ``engine``: the spill file's engine ("auto": through the page
    cache while the file is within ``page_cache_bytes``, 0 meaning an eighth of the memory
    available, then O_DIRECT); ``capacity``: a limit on the spill file (0: the filesystem's
    space). Contexts made with the same directory, host tier, engine, capacity and page
    cache share one store for the life of the process. Usable for several steps
    (``with off:`` each time); :meth:`stats` counts since this object was made.
    """

    def __init__(self, directory=None, *, min_bytes: int = _MiB,
                 gpu_budget_bytes: int | None = None, host_cache_bytes: int | str = "auto",
                 prefetch_bytes: int | None = None, engine: str = "auto",
                 capacity: int = 0, page_cache_bytes: int = 0, _check: bool = False):
        for name, v in (("min_bytes", min_bytes), ("gpu_budget_bytes", gpu_budget_bytes),
                        ("prefetch_bytes", prefetch_bytes)):
            if v is not None and (not isinstance(v, int) or v < 0):
                raise ValueError(f"{name} must be a non-negative int, not {v!r}")
        if host_cache_bytes != "auto" and (not isinstance(host_cache_bytes, int)
                                           or host_cache_bytes < 0):
            raise ValueError("host_cache_bytes must be a non-negative int or 'auto', not "
                             f"{host_cache_bytes!r}")
        self.min_bytes = min_bytes
        self.gpu_budget_bytes = gpu_budget_bytes
        self._prefetch_fixed = prefetch_bytes
        self._check = _check  # debugging: keep a copy of each tensor, compare at unpack
        self._shared = shared_store(directory, host_cache_bytes=host_cache_bytes,
                                    engine=engine, capacity=capacity,
                                    page_cache_bytes=page_cache_bytes,
                                    prefetch_bytes=prefetch_bytes)
        self._store = self._shared.store
        self._h = self._shared.h
        self._ring_limit = self._shared.ring_limit
        self._lock = self._shared.lock
        self._pending = collections.deque()  # (key, source) of puts still reading the source
        self._held = collections.deque()     # weak refs of handles held on the GPU, pack order
        self._live = weakref.WeakSet()       # this context's handles with a store entry
        self._dedup = weakref.WeakValueDictionary()
        self._seq = None
        self._closed = False
        self._budgets = {}                   # device -> the memory limit, this step
        self._largest = {}                   # device -> largest tensor packed, this step
        self._allocated_seen = {}            # device -> (allocated, bytes kept since)
        self._step = weakref.WeakSet()       # handles packed since the last __enter__
        self._through = None                 # a _Through while this step passes through
        self._counts = {"tensors_offloaded": 0, "tensors_kept": 0, "tensors_on_gpu": 0,
                        "tensors_passed": 0,
                        "bytes_on_gpu": 0, "dedup_hits": 0, "alive_hits": 0}
        self._base = self._store.stats()
        super().__init__(self._pack, self._unpack)

    @property
    def prefetch_bytes(self) -> int:
        """How far backward's reads run ahead now."""
        if self._prefetch_fixed is not None:
            return self._prefetch_fixed
        sh = self._shared
        rate = max(sh.consume_rate, sh.read_rate)
        window = int(rate * 0.25) if rate else 256 * _MiB
        return max(64 * _MiB, min(window, self._ring_limit // 2))

    # -- hooks -------------------------------------------------------------------------

    def _budget(self, device) -> int:
        """The GPU budget now: the limit less the margin of the class's text."""
        if self.gpu_budget_bytes is not None:
            return self.gpu_budget_bytes
        limit = self._budgets.get(device)
        if limit is None:
            limit = self._budgets[device] = gpu_memory_limit(device)
        sh, largest = self._shared, self._largest.get(device, 0)
        ratio = sh.growth_ratio.get(device, 4.0)
        # backward's growth, the next forward op's output and temporaries, and slack for the
        # allocator's fragments and blocks awaiting their copies (doubled at each
        # out-of-memory error that leaves a forward pass)
        margin = int((ratio * 1.1 + 2) * largest) + sh.slack.get(device, limit // 16)
        budget = limit - margin
        last = sh.last.get(device)
        if last is not None and largest <= last[0]:
            # A step like the last one (no larger tensor so far): its forward pass may end
            # as high as the last one's plus the headroom the last one left under the limit
            # (the allocator's peak bounds that step's from above, so this never overshoots)
            budget = max(budget, last[1] + limit - last[2] - limit // 32)
        return max(budget, 0)

    def _pack(self, t):
        tr = self._through
        if (tr is not None and t.is_cuda and t.layout is torch.strided
                and t.nbytes <= tr.largest and t.get_device() == tr.index):
            tr.packed += t.nbytes
            if tr.packed < tr.next_check or self._still_through(tr):
                self._counts["tensors_passed"] += 1
                return t
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
        h = _Packed()
        h.owner = h.key = h.gpu = h.copy = None
        h.shape, h.stride, h.dtype, h.device = tuple(t.shape), tuple(t.stride()), t.dtype, t.device
        h.nbytes = t.numel() * t.element_size()
        h.ptr, h.version, h.dense = t.data_ptr(), t._version, layout == "dense"
        h.prefetched = h.unpacked = False
        try:
            h.ref = weakref.ref(t)
        except TypeError:
            h.ref = None
        cuda = t.device.type == "cuda"
        if cuda and h.nbytes > self._largest.get(t.device, 0):
            self._largest[t.device] = h.nbytes
            if tr is not None and h.nbytes > tr.largest:
                self._through = None  # a larger step than the last one: budgeted from here
        if cuda and self._fits_on_gpu(t.device, h.nbytes):
            h.gpu = t
            self._counts["tensors_on_gpu"] += 1
            self._counts["bytes_on_gpu"] += h.nbytes
        else:
            if self._check:  # aside in host memory: GPU allocations stay as without it
                h.copy = torch.empty(t.shape, dtype=t.dtype, pin_memory=cuda)
                h.copy.copy_(t, non_blocking=True)
            self._store_put(h, t)
        h.owner = self
        with self._lock:
            if h.gpu is not None:
                self._held.append(weakref.ref(h))
            self._step.add(h)
            self._dedup[dkey] = h
            if self._seq is None or self._seq.unpacking:
                self._seq = _Sequence()
            h.seq, h.index = self._seq, len(self._seq.handles)
            if h.gpu is None:
                h.seq.stored += 1
            self._seq.handles.append(weakref.ref(h))
        return h

    def _pass_through(self):
        """Whether this step may keep its CUDA tensors as they are, handing autograd the
        tensors themselves (no handle: the hooks cost next to nothing): where the last step
        measured on the device kept every tensor on the GPU with its reserved peak within
        the budget (``gpu_budget_bytes``, else the limit then, and the limit now that
        ``set_per_process_memory_fraction`` gives). It stays so while the step is no larger:
        no tensor larger than that step's largest, and the memory allocated, asked every
        ``interval`` bytes kept, within that step's at backward's start plus half the
        headroom its peak left. Past either, the rest of the step is budgeted as usual."""
        sh = self._shared
        if self._check or self._closed or len(sh.last) != 1:
            return None
        device, last = next(iter(sh.last.items()))
        largest, forward_end, peak, fitted, limit = last
        if not fitted:
            return None
        if self.gpu_budget_bytes is not None:
            limit = self.gpu_budget_bytes
        else:
            limit = min(limit, _fraction_limit(device))
        if peak > limit:
            return None
        interval = max(64 * _MiB, min(1 << 30, limit // 16))
        return _Through(device, largest, forward_end + (limit - peak) // 2, forward_end,
                        interval)

    def _still_through(self, tr) -> bool:
        if _allocated(tr.device) <= tr.cap:
            tr.next_check = tr.packed + tr.interval
            return True
        self._through = None
        return False

    def _fits_on_gpu(self, device, nbytes) -> bool:
        """Whether a tensor of ``nbytes`` just made on ``device`` may stay there; when the
        memory allocated is over the budget, the tensors held longest leave first, until it
        is not. The allocator is asked only near the budget: far from it, what it said last
        plus the tensors kept since is close enough (asking costs more than a pack). A budget
        fallen to nothing (a larger tensor than any before) sends every held tensor."""
        budget = self._budget(device)
        if budget <= 0 and not self._held:
            return False
        seen, kept = self._allocated_seen.get(device, (None, 0))
        if seen is not None and seen + kept + nbytes < budget - budget // 8 and kept < 1 << 30:
            self._allocated_seen[device] = (seen, kept + nbytes)
            return True
        allocated = _allocated(device)  # the new tensor included
        with self._lock:
            while allocated > budget and self._held:
                old = self._held.popleft()()
                if old is None or old.gpu is None or old.device != device:
                    continue
                tensor, old.gpu = old.gpu, None
                self._store_put(old, tensor)
                old.seq.stored += 1
                self._counts["tensors_on_gpu"] -= 1
                self._counts["bytes_on_gpu"] -= old.nbytes
                allocated -= old.nbytes
        self._allocated_seen[device] = (allocated, 0)
        return allocated <= budget

    def _store_put(self, h, t):
        """Hand the tensor of ``h`` to the store (``h.key``); no reference to it is kept once
        the store no longer reads it."""
        src = t if h.dense else t.contiguous()
        cuda = t.device.type == "cuda"
        h.key = _C.store_put(self._h, src.data_ptr(), h.nbytes, int(cuda),
                             (t.device.index or 0) if cuda else 0, _stream(t.device))
        if cuda and -(-h.nbytes // 4096) * 4096 <= self._ring_limit:  # whole blocks
            # Only a copy on the store's stream reads the source: the caching allocator may
            # reuse its memory once that stream is past the copy, so no reference is kept
            # (the host may run far ahead of the GPU without holding activations).
            src.record_stream(self._shared.copy_stream(t.device))
            src = None
        with self._lock:
            if src is not None:
                self._pending.append((h.key, src))
            self._live.add(h)
            self._counts["tensors_offloaded"] += 1

    def _unpack(self, h):
        if not isinstance(h, _Packed):
            return h
        if h.gpu is not None:  # the GPU tier
            t = h.gpu
            if t._version != h.version:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified "
                    f"by an inplace operation after fastensor saved it: a {h.dtype} tensor "
                    f"of shape {list(h.shape)} is at version {t._version}, expected version "
                    f"{h.version}")
            self._backward_started(h)
            self._sample_growth(h)
            return t
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
        if self._closed or h.key is None:
            raise RuntimeError("fastensor.offload_activations: this graph's offloaded "
                               "activations were dropped (an exception left the forward "
                               "pass, or close() was called)")
        self._backward_started(h)
        self._sample_growth(h)
        with self._lock:
            seq = h.seq
            if h.prefetched and not h.unpacked:
                seq.ahead -= h.nbytes
            h.unpacked = True
            seq.bytes_unpacked += h.nbytes
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

    # -- bookkeeping -------------------------------------------------------------------

    def _backward_started(self, h):
        """At the first unpack of a sequence: note the time, the store's reads and the memory
        allocated on the GPU (to learn what backward needs beyond it)."""
        seq = h.seq
        if seq.unpacking:
            return
        with self._lock:
            if seq.unpacking:
                return
            seq.unpacking = True
            seq.t_first = time.perf_counter()
            seq.bytes_read0 = self._store.stats()["bytes_read"]
            if h.device.type == "cuda":
                seq.device = h.device
                seq.forward_end = _allocated(h.device)
                seq.peak0 = torch.cuda.max_memory_allocated(h.device)
                seq.largest = self._largest.get(h.device, 0)

    def _sample_growth(self, h):
        """Every fourth CUDA unpack: what backward has allocated beyond the forward pass so
        far (a lower bound of its growth, for steps where the allocator's peak cannot say)."""
        seq = h.seq
        if h.device.type == "cuda":
            seq.gpu_unpacks += 1
            if seq.gpu_unpacks % 4 == 1:
                seq.growth = max(seq.growth, _allocated(h.device) - seq.forward_end)

    def _learn(self, seq):
        """After a sequence's backward: what the GPU budget's margin and the prefetch window
        are sized from."""
        sh = self._shared
        if seq.device is not None and seq.largest:
            # Where the allocator's peak rose during backward, that peak less the memory
            # allocated when backward began is what backward allocated beyond the forward
            # pass; elsewhere (a higher peak stands from before) the unpacks' samples say.
            # Never below the largest tensor (its gradient).
            peak = torch.cuda.max_memory_allocated(seq.device)
            growth = peak - seq.forward_end if peak > seq.peak0 else seq.growth
            sh.growth_ratio[seq.device] = max(growth / seq.largest, 1.0)
            limit = self._budgets.get(seq.device, self.gpu_budget_bytes)
            sh.last[seq.device] = (seq.largest, seq.forward_end,
                                   torch.cuda.max_memory_reserved(seq.device),
                                   seq.stored == 0 and limit is not None, limit)
        elapsed = time.perf_counter() - seq.t_first
        if not seq.t_first or elapsed <= 0 or not seq.bytes_unpacked:
            return
        sh.consume_rate = seq.bytes_unpacked / elapsed
        read = self._store.stats()["bytes_read"] - seq.bytes_read0
        if read:
            sh.read_rate = read / elapsed

    def _reap(self):
        """Let go of sources the store no longer reads, oldest first (lock held)."""
        while self._pending and self._source_released(self._pending[0][0]):
            self._pending.popleft()

    def _source_released(self, key):
        try:
            return _C.store_released(self._h, key)
        except (OSError, ValueError):
            return True  # dropped, or the put failed: the source is not read any more

    def _prefetch_before(self, seq, index):
        """Prefetch the stored entries packed before ``index``, nearest first, up to the
        window (lock held)."""
        window = self.prefetch_bytes
        j = min(seq.cursor, index - 1)
        while j >= 0 and seq.ahead < window:
            hj = seq.handles[j]()
            if hj is not None and hj.key is not None and not hj.unpacked and not hj.prefetched:
                try:
                    got = _C.store_prefetch(self._h, hj.key)
                except (OSError, MemoryError):
                    got = -1  # the get itself reads it, or reports the error
                if got < 0:
                    break  # no ring space now: go on at the next unpack
                hj.prefetched = True
                seq.ahead += hj.nbytes
            j -= 1
        seq.cursor = j

    def _forget(self, h):
        if h.key is not None:
            try:
                _C.store_drop(self._h, h.key)
            except (ValueError, OSError):
                pass  # dropped already (close)
        if h.index == 0 and h.seq is not None and h.seq.unpacking:
            self._learn(h.seq)  # the first tensor packed is the last one backward frees

    # -- public ------------------------------------------------------------------------

    def __enter__(self):
        self._budgets = {}  # measured again for each step
        self._largest = {}
        self._allocated_seen = {}
        self._step = weakref.WeakSet()
        self._through = self._pass_through()
        return super().__enter__()

    def __exit__(self, exc_type, exc, tb):
        super().__exit__(exc_type, exc, tb)
        tr, self._through = self._through, None
        if tr is not None and exc_type is None and \
                _allocated(tr.device) > tr.forward_end + tr.interval:
            # this step grew past the last one's: the next one is budgeted, and measured
            last = self._shared.last.get(tr.device)
            if last is not None:
                self._shared.last[tr.device] = last[:3] + (False,) + last[4:]
        if exc_type is not None and issubclass(exc_type, torch.OutOfMemoryError):
            sh = self._shared
            for device, limit in self._budgets.items():  # keep less on the GPU next time
                sh.slack[device] = min(2 * sh.slack.get(device, limit // 16), limit // 2)
                sh.last.pop(device, None)
        if exc_type is not None:
            # The graph of this step will not run backward: its entries go now, so that a
            # retry (a smaller batch after an out-of-memory error) finds the store empty.
            self._drop(list(self._step))
        return False

    def _drop(self, handles) -> None:
        """Drop the entries of ``handles`` (and let go of the tensors held on the GPU) once
        the store no longer reads their sources; unpacking them raises from then on."""
        with self._lock:
            for key, _src in self._pending:  # their sources must outlive the reads
                try:
                    _C.store_wait(self._h, key)
                except (OSError, ValueError):
                    pass
            self._pending.clear()
            for h in handles:
                key, h.key, h.gpu = h.key, None, None
                self._live.discard(h)
                if key is not None:
                    try:
                        _C.store_drop(self._h, key)
                    except (OSError, ValueError):
                        pass
            self._held = collections.deque(r for r in self._held
                                           if r() is not None and r().gpu is not None)

    def close(self) -> None:
        """Drop this context's stored entries now; the graphs they belong to cannot run
        backward any more and later packs keep their tensors. The store stays for the next
        context."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._drop(list(self._live) + [r() for r in self._held if r() is not None])

    def flush(self) -> None:
        """Wait until every tensor offloaded so far is stored (in the file or the host tier)
        and let go of the sources; OSError for the first store that failed."""
        with self._lock:
            self._store.flush()
            self._reap()

    def stats(self) -> dict:
        """Counters since this object was made: tensors_offloaded / kept / on_gpu / passed
        (kept on the GPU as they are, in steps that passed through),
        bytes_offloaded, bytes_on_gpu (kept on the GPU to backward), host_bytes (in the host tier now),
        file_bytes (held by the spill file now), bytes_demoted (host tier to file),
        bytes_prefetched, stall_seconds, bytes_written, bytes_read, host_hits, engine and
        cache (the spill file's: cache "keep" through the page cache, "bypass" O_DIRECT), ..."""
        c = dict(self._counts)
        with self._lock:
            self._reap()
        s, b = self._store.stats(), self._base
        since = {k: s[k] - b[k] for k in ("bytes_put", "bytes_prefetched", "stall_ns",
                                          "bytes_written", "writes_skipped", "bytes_read",
                                          "bytes_got", "host_hits", "bytes_demoted")}
        c.update(bytes_offloaded=since["bytes_put"], bytes_prefetched=since["bytes_prefetched"],
                 stall_seconds=since["stall_ns"] / 1e9,
                 peak_inflight_bytes=s["peak_inflight_bytes"],
                 bytes_written=since["bytes_written"], writes_skipped=since["writes_skipped"],
                 bytes_read=since["bytes_read"], bytes_reloaded=since["bytes_got"],
                 host_hits=since["host_hits"], bytes_demoted=since["bytes_demoted"],
                 entries=len(self._live), host_bytes=s["host_resident"],
                 host_budget=s["host_budget"], host_pinned=s["host_pinned"],
                 file_bytes=s["file_used"], spill_file_bytes=s["file_size"],
                 engine=s["engine"], cache=s["cache"], prefetch_bytes=self.prefetch_bytes)
        return c
