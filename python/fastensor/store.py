"""The spill store: tensors parked in one unlinked file on local storage and brought back.

    store = SpillStore("/nvme/spill")
    key = store.put(tensor)              # returns at once; CUDA tensors after the current stream
    store.released(key)                  # True once the tensor itself is no longer read
    store.get(key, out)                  # into a tensor of the same byte size, then
    store.wait(key)                      # ... it is there (CUDA: the current stream waits)
    store.drop(key)

Memory is any contiguous CPU or CUDA tensor, or a numpy array. The file has no name from the
start, so nothing is left behind, even if the process is killed.
"""
from __future__ import annotations

import os

from . import _C, _memory, context, engine_id

HOST_AUTO = (1 << 64) - 1  # FT_STORE_HOST_AUTO: a quarter of the memory available


class SpillStore:
    """A spill store (``ft_store`` of the C library).

    ``directory``: where the spill file lives (None: $FASTENSOR_SPILL_DIR, $TMPDIR, /var/tmp).
    ``capacity``: bytes the file may hold (0: what the filesystem gives; else preallocated).
    ``staging_bytes``: pinned host ring for puts in flight and prefetches (0: 256 MiB).
    ``host_cache_bytes``: a host-memory tier: entries up to this many bytes stay in memory,
    never written; a put that finds it full sends the oldest to the file ("auto": a quarter
    of the memory available; the memory is taken, and pinned where CUDA is in use, as
    entries first reach it, and kept by the store).
    ``engine``: of the file's transfers; "auto": through the page cache while the file is
    within ``page_cache_bytes`` (0: an eighth of the memory available), O_DIRECT for entries
    put after it grew past that; each transfer is AUTO's among the arms of its entry's kind
    (``stats()["cache"]``: "keep" or "bypass", where entries put now go).
    """

    def __init__(self, directory=None, *, capacity: int = 0, staging_bytes: int = 0,
                 host_cache_bytes: int | str = 0, engine: str = "auto",
                 page_cache_bytes: int = 0):
        if host_cache_bytes == "auto":
            host_cache_bytes = HOST_AUTO
        for name, v in (("capacity", capacity), ("staging_bytes", staging_bytes),
                        ("host_cache_bytes", host_cache_bytes),
                        ("page_cache_bytes", page_cache_bytes)):
            if not isinstance(v, int) or not 0 <= v <= HOST_AUTO:
                raise ValueError(f"{name} must be a non-negative int, not {v!r}")
        d = None if directory is None else os.fspath(directory)
        self.directory = d
        self._h = _C.store_create(context(), d, capacity, staging_bytes, host_cache_bytes,
                                  engine_id(engine), page_cache_bytes)

    def put(self, tensor) -> int:
        """Start storing the tensor's bytes; returns its key. The tensor must not change or be
        freed until :meth:`released` says True (or :meth:`wait` returns)."""
        addr, n, _keep, kind, dev, stream = _memory(tensor, writable=False)
        return _C.store_put(self._h, addr, n, kind, dev, stream)

    def released(self, key: int) -> bool:
        """True once the put no longer reads its source tensor."""
        return _C.store_released(self._h, key)

    def get(self, key: int, out) -> None:
        """Start reading the entry into ``out`` (same byte size); :meth:`wait` before use."""
        addr, n, _keep, kind, dev, stream = _memory(out, writable=True)
        _C.store_get(self._h, key, addr, n, kind, dev, stream)

    def prefetch(self, key: int) -> int:
        """Start reading the entry into host memory: 1 started, 0 nothing to do, -1 busy."""
        return _C.store_prefetch(self._h, key)

    def poll(self, key: int) -> bool:
        """True when the entry has no put or get in progress."""
        return _C.store_poll(self._h, key)

    def wait(self, key: int) -> None:
        """Wait for the entry's put and pending get; raises OSError if one failed."""
        _C.store_wait(self._h, key)

    def flush(self) -> None:
        """Wait until every put so far has landed; OSError for the first that failed."""
        _C.store_flush(self._h)

    def drop(self, key: int) -> None:
        """Forget the entry and free its space."""
        _C.store_drop(self._h, key)

    def stats(self) -> dict:
        """The store's counters (bytes put/written/read/got, stall_ns, peak in flight...)."""
        return _C.store_stats(self._h)

    def close(self) -> None:
        """Wait for transfers and free the store and its file (also done when collected)."""
        _C.store_close(self._h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
