"""save_file_async: a snapshot of the tensors now, the save in the background
(:mod:`fastensor.torch` exports it)."""
from __future__ import annotations

import atexit
import concurrent.futures
import os
import signal
import sys
import threading
import time

import torch

from . import _fst
from ._gpumem import device_room


class _Snapshots:
    """Buffers that save_file_async copies tensors into, reused across saves: pinned host
    memory where CUDA tensors are copied (DMA speed), plain memory otherwise. At most two
    free buffers are kept (one save writing while the next is snapshotted);
    :func:`release_snapshot_memory` frees them."""

    def __init__(self):
        self._free, self._lock = [], threading.Lock()

    def take(self, nbytes, pinned):
        with self._lock:
            fits = [i for i, b in enumerate(self._free)
                    if b[1] == pinned and b[0].numel() >= nbytes]
            if fits:
                best = min(fits, key=lambda i: self._free[i][0].numel())
                return self._free.pop(best)[0]
        return torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=pinned)

    def has(self, nbytes, pinned):
        """Whether a kept buffer of the kind holds ``nbytes``."""
        with self._lock:
            return any(b[1] == pinned and b[0].numel() >= nbytes for b in self._free)

    def give(self, buf):
        with self._lock:
            self._free.append((buf, buf.is_pinned()))
            self._free.sort(key=lambda b: -b[0].numel())
            del self._free[2:]

    def release(self):
        with self._lock:
            self._free.clear()


_snapshots = _Snapshots()
_pending, _pending_lock = set(), threading.Lock()


class _CodedKept:
    """The library's memory of coded streams (fastensor._fst.code) that save_file_async
    snapshots compressed saves into, kept for the next ones (at most two: one save writing
    while the next is snapshotted)."""

    def __init__(self):
        self.free, self.lock = [], threading.Lock()

    def take(self):
        with self.lock:
            return self.free.pop() if self.free else None

    def give(self, coded):
        with self.lock:
            self.free.append(coded)
            del self.free[:-2]

    def release(self):
        with self.lock:
            self.free.clear()


_coded = _CodedKept()


def release_snapshot_memory() -> None:
    """Free the snapshot buffers :func:`save_file_async` keeps for the next save."""
    _snapshots.release()
    _coded.release()


class _TermGuard:
    """SIGTERM (what a scheduler sends before preemption) while saves are in flight: the
    saves running on other threads are finished first, then the handler that was there
    before is restored and honoured (the default one ends the process by SIGTERM, as it
    would have). Installed by the first save begun on the main thread (Python handlers can
    only be set there); where it finds no save in flight it hands the signal on at once.
    A save running on the main thread itself when the signal comes is finished before the
    signal is honoured. ``FASTENSOR_SIGTERM=default`` leaves SIGTERM alone. SIGKILL and
    ``os._exit`` cannot be caught: a save they stop leaves the previous checkpoint, and
    temporaries that ``fastensor gc`` (or the next save of the name) removes."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ops = {}            # token -> (thread, done event, what)
        self.previous = None     # the handler ours replaced
        self.installed = False
        self.deferred = None     # a signal that came while the main thread was saving

    def begin(self, what, thread=None):
        """A save that ``thread`` (this one by default) runs: SIGTERM waits for it."""
        token = object()
        with self.lock:
            self.ops[token] = (thread or threading.current_thread(), threading.Event(), what)
        self.arm()
        return token

    def arm(self):
        """Install the handler, where this is the main thread (a writer whose saves run on
        other threads arms it when it is made)."""
        if not self.installed and os.environ.get("FASTENSOR_SIGTERM", "finish") != "default" \
                and threading.current_thread() is threading.main_thread():
            try:
                self.previous = signal.getsignal(signal.SIGTERM)
                signal.signal(signal.SIGTERM, self._on_term)
                self.installed = True
            except (ValueError, OSError):  # not the main interpreter
                pass

    def end(self, token):
        with self.lock:
            _, done, _ = self.ops.pop(token)
            done.set()
            honour = None
            if self.deferred is not None and not self._mine_left():
                honour, self.deferred = self.deferred, None
        if honour is not None:
            self._honour(*honour)

    def _mine_left(self):
        """Whether a save of this thread is in flight (the handler runs on the main thread,
        so only the main thread defers a signal, and only it honours one deferred)."""
        me = threading.current_thread()
        return me is not threading.main_thread() or any(t is me for t, _, _ in
                                                         self.ops.values())

    def _on_term(self, signum, frame):
        with self.lock:
            others = [(d, w) for t, d, w in self.ops.values()
                      if t is not threading.current_thread()]
        if others:
            print(f"fastensor: SIGTERM: finishing {len(others)} checkpoint save(s) in flight "
                  f"first: {', '.join(sorted(str(w) for _, w in others))}", file=sys.stderr,
                  flush=True)
            for done, _ in others:
                done.wait()
        with self.lock:
            if self._mine_left():  # this thread is inside a save: honoured when it ends
                self.deferred = (signum, frame)
                return
        self._honour(signum, frame)

    def _honour(self, signum, frame):
        previous, self.previous = self.previous, None
        self.installed = False
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous in (signal.SIG_DFL, None):
            os.kill(os.getpid(), signal.SIGTERM)


_term = _TermGuard()


class in_flight:
    """``with in_flight(what):`` a save that SIGTERM waits for (see :class:`_TermGuard`)."""

    def __init__(self, what):
        self.what = what

    def __enter__(self):
        self.token = _term.begin(self.what)

    def __exit__(self, *exc):
        _term.end(self.token)


def _finish_pending_saves():
    """At interpreter exit: saves still running are finished (their threads are daemons,
    which the interpreter would otherwise stop mid-write); failed saves whose future no one
    asked for their result are reported, and the exit status says so."""
    with _pending_lock:
        running = [f for f in _pending if not f.done()]
    if running:
        names = ", ".join(sorted(str(f.filename) for f in running))
        print(f"fastensor: finishing {len(running)} checkpoint save(s) still running at exit: "
              f"{names}", file=sys.stderr, flush=True)
        for f in running:
            f._thread.join()
    with _pending_lock:
        unseen = sorted(_unchecked, key=lambda f: str(f.filename))
        _unchecked.clear()
    if not unseen:
        return
    for f in unseen:
        print(f"fastensor: the checkpoint save to {f.filename} failed, and its result was "
              f"never checked: {type(f._exc).__name__}: {f._exc}", file=sys.stderr)
    if os.environ.get("FASTENSOR_UNCHECKED_SAVE", "fail") != "warn":
        # no silent success: the process ends with status 1 (after the logs are written)
        if "logging" in sys.modules:
            sys.modules["logging"].shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(1)


_unchecked = set()  # failed SaveFutures whose error no one has asked for
atexit.register(_finish_pending_saves)


class SaveFuture(concurrent.futures.Future):
    """The handle of a :func:`save_file_async`: a ``concurrent.futures.Future``
    (``result()``, ``done()``, ``exception()``, ``add_done_callback()``, ``cancel()`` before
    the save starts). ``blocked_seconds``: how long the call that made it took (the
    snapshot); ``filename``: where it saves; ``snapshot``: where the copy was taken,
    "device" or "host" ("none": the save reads the caller's tensors)."""

    def __init__(self, filename, blocked_seconds=0.0):
        super().__init__()
        self.filename = filename
        self.blocked_seconds = blocked_seconds
        self.snapshot = "host"
        self._thread = None
        self._exc = None

    def _seen(self):
        with _pending_lock:
            _unchecked.discard(self)

    def result(self, timeout=None):
        try:
            return super().result(timeout)
        finally:
            if self.done():
                self._seen()

    def exception(self, timeout=None):
        try:
            return super().exception(timeout)
        finally:
            if self.done():
                self._seen()

    def add_done_callback(self, fn):
        self._seen()  # (the callback is handed the future: its error is the callback's)
        super().add_done_callback(fn)

    def _failed(self, error):
        """Fail the future; its error is reported at exit unless someone asks for it."""
        self._exc = error
        with _pending_lock:
            if not self._done_callbacks:
                _unchecked.add(self)
        self.set_exception(error)


AsyncSave = SaveFuture  # the earlier name


def _layout(tensors):
    """({name: (offset, bytes)}, total bytes) of the tensors packed in one buffer."""
    sizes, total = {}, 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        sizes[name] = (total, n)
        total += (n + 63) // 64 * 64
    return sizes, total


def _copy_into(buf, tensors, sizes):
    """Views of ``buf`` holding copies of the tensors (CUDA copies queued, not waited for)."""
    snap = {}
    for name, t in tensors.items():
        off, n = sizes[name]
        h = buf[off:off + n].view(t.dtype).view(t.shape) if n else \
            torch.empty(t.shape, dtype=t.dtype, device=buf.device)
        if n:
            h.copy_(t.detach(), non_blocking=t.device.type != buf.device.type)
        snap[name] = h
    return snap


def _snapshot(tensors, mode):
    """(copies of the tensors, the buffer holding them, whether it is on the device).

    Host snapshots go into a reused buffer (pinned where CUDA tensors are copied). A state
    dict on one GPU is copied on the device instead (a device-to-device copy: milliseconds)
    with mode "device", and with "auto" where no pinned buffer of the size is kept yet (the
    first save of a process, whose pinned allocation would take a second or more of the
    caller's time) and the device has room; the save then moves it to pinned memory in the
    background. CUDA copies start after the work queued on the tensors' current streams and
    are done when this returns."""
    sizes, total = _layout(tensors)
    devices = {t.device for t in tensors.values()}
    cuda = any(d.type == "cuda" for d in devices) and torch.cuda.is_available()
    one_gpu = cuda and len(devices) == 1
    on_device = one_gpu and (mode == "device" or (
        mode == "auto" and not _snapshots.has(total, True) and
        device_room(next(iter(devices)), total)))
    buf = None
    if on_device:
        try:
            buf = torch.empty(max(total, 1), dtype=torch.uint8, device=next(iter(devices)))
        except torch.OutOfMemoryError:  # taken meanwhile: on the host after all
            if mode == "device":
                raise
            on_device = False
    if buf is None:
        buf = _snapshots.take(total, cuda)
    snap = _copy_into(buf, tensors, sizes)
    for d in devices:
        if d.type == "cuda":
            torch.cuda.current_stream(d).synchronize()
    return snap, buf, on_device


def _to_host(snap, buf):
    """A device snapshot moved into a pinned buffer of the pool: (views, that buffer)."""
    host = _snapshots.take(buf.numel(), True)
    host[:buf.numel()].copy_(buf, non_blocking=True)
    torch.cuda.current_stream(buf.device).synchronize()
    out = {}
    for name, t in snap.items():
        n = t.numel() * t.element_size()
        if n:
            off = t.data_ptr() - buf.data_ptr()
            out[name] = host[off:off + n].view(t.dtype).view(t.shape)
        else:
            out[name] = torch.empty(t.shape, dtype=t.dtype)
    return out, host


def _stand_ins(tensors):
    """Meta tensors of the tensors' shapes and dtypes: a snapshot whose bytes are coded."""
    return {name: torch.empty_like(t, device="meta") for name, t in tensors.items()}


def save_file_async(tensors: dict, filename, metadata: dict | None = None, *,
                    engine: str = "auto", shard_size: int | None = None,
                    cache: str = "auto", snapshot: str = "auto",
                    compression: str = "auto") -> SaveFuture:
    """Snapshot the tensors now, then save in the background; the caller may change or free
    the tensors as soon as this returns. Returns a :class:`SaveFuture`.

    ``snapshot``: where the copy is taken. "host": pinned memory for CUDA tensors (at the
    link's speed, into buffers reused by the next save). "device": for a state dict on one
    GPU, a copy on that GPU (as much device memory again, until the background has moved it
    to pinned memory). "auto" (default): on the device where no pinned buffer of the size
    is kept yet (a process's first save) and the device has room to spare, else on the
    host. "none": no copy (no memory beyond the save's own), the save reads the caller's
    tensors: the caller must not change or free them until the future is done (what was
    queued on their CUDA streams is waited for first). With "auto", a compressed save
    (``.fst``) of tensors on a GPU that codes them snapshots their coded streams, coded there
    (host memory of their coded size, kept for the next save; the first save codes its copy
    to make it): ``future.snapshot`` says "coded"; the caller waits for the encode ("host"
    copies instead: a shorter wait, more memory). A save still running when the
    interpreter exits is finished first (a line on stderr says so); so is one running when
    the process gets SIGTERM, before the signal is honoured (:class:`_TermGuard`; a call from
    the main thread installs the handler; ``FASTENSOR_SIGTERM=default`` leaves SIGTERM alone).
    A failed save leaves the previous checkpoint and no temporary file; one whose future no
    one asks for its result (``result()``, ``exception()``, a done callback) is reported on
    stderr at exit, and the process exits with status 1 (``FASTENSOR_UNCHECKED_SAVE=warn``:
    reported only)."""
    if snapshot not in ("auto", "host", "device", "none"):
        raise ValueError(f"snapshot must be 'auto', 'host', 'device' or 'none', "
                         f"not {snapshot!r}")
    _fst.compression_id(compression)
    from .torch import _check_for_save, _codes_on_gpu, _fst_code, _save  # (they import this)
    _check_for_save(tensors)  # the caller's tensors: sharing is lost in the snapshot
    t0 = time.perf_counter()
    directory = os.path.dirname(os.fspath(filename)) or "."
    # a compressed save of tensors their GPU codes: the snapshot is their coded streams, in
    # memory kept from an earlier save (the first one codes its device copy to make it)
    codes = os.fspath(filename).endswith(_fst.SUFFIX) and snapshot == "auto" and \
        _codes_on_gpu(list(tensors.values()), compression)
    coded = _coded.take() if codes else None
    if coded is not None:
        try:
            coded = _fst_code(directory, list(tensors.values()), compression, coded)
        except (OSError, MemoryError):  # (a copy this time)
            _coded.give(coded)
            coded = None
    if coded is not None:
        snap, buf, on_device = _stand_ins(tensors), None, False
    elif snapshot == "none":
        snap, buf, on_device = dict(tensors), None, False
        for d in {t.device for t in snap.values() if t.device.type == "cuda"}:
            torch.cuda.current_stream(d).synchronize()
    else:
        snap, buf, on_device = _snapshot(tensors, snapshot)
    fut = SaveFuture(filename, time.perf_counter() - t0)
    fut.snapshot = "coded" if coded is not None else "none" if snapshot == "none" else \
        "device" if on_device else "host"

    def run():
        nonlocal snap, buf, coded
        error, ran, host = None, False, None
        try:
            if fut.set_running_or_notify_cancel():
                ran = True
                if on_device and codes:  # coded on its GPU: the memory the next save takes
                    try:
                        coded = _fst_code(directory, list(snap.values()), compression)
                        snap, buf = _stand_ins(snap), None
                    except (OSError, MemoryError):  # (saved from the device copy)
                        pass
                elif on_device:  # into pinned memory, then the device copy is freed
                    snap, host = _to_host(snap, buf)
                    buf = None
                _save(snap, filename, metadata, engine, shard_size, cache, compression,
                      coded=coded)
        except BaseException as e:  # handed to result()
            error = e
        finally:  # the snapshot is free for the next save before this one reports
            snap.clear()
            if coded is not None:
                _coded.give(coded)
            if host is not None:
                _snapshots.give(host)
            elif buf is not None and not on_device:
                _snapshots.give(buf)
            buf = None
            with _pending_lock:
                _pending.discard(fut)
        if ran and error is not None:
            fut._failed(error)
        elif ran:
            fut.set_result(None)
        _term.end(token)  # (a SIGTERM that came meanwhile is honoured from here)

    fut._thread = threading.Thread(target=run, daemon=True, name="fastensor-save")
    token = _term.begin(filename, fut._thread)  # from here SIGTERM finishes the save first
    with _pending_lock:
        _pending.add(fut)
    fut._thread.start()
    return fut
