"""How :class:`fastensor.optim.OffloadedOptimizer` moves its tensors: puts into the store in
pieces (CUDA memory reusable once the store's copy has run, host memory held until the store
has read it), reads back into new or given memory, waits, drops, and letting go of the host
sources the store has copied. A mixin: the optimizer keeps the store handle (``_h``), the
piece size, the pending host sources and the counters it uses."""
from __future__ import annotations

import torch

from . import _C
from ._optim_state import _Kept, _Stored


class _StoreIO:
    """The store's side of :class:`fastensor.optim.OffloadedOptimizer`."""

    def _stream(self, device) -> int:
        return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0

    def _put(self, t: torch.Tensor, stream: int | None = None) -> _Stored:
        """Start storing ``t`` (its bytes, in pieces); CUDA memory may be reused once the
        store's copy has run, host memory is held until the store has read it."""
        if not t.is_contiguous():
            t = t.contiguous()
        cuda = t.device.type == "cuda"
        dev = (t.device.index or 0) if cuda else 0
        if stream is None:
            stream = self._stream(t.device)
        s = _Stored()
        s.shape, s.dtype, s.keys = tuple(t.shape), t.dtype, []
        n, base = t.numel() * t.element_size(), t.data_ptr()
        try:
            for off in range(0, n, self._piece):
                part = min(self._piece, n - off)
                s.keys.append((_C.store_put(self._h, base + off, part, int(cuda), dev, stream),
                               off, part))
        except BaseException:
            self._drop(s)
            raise
        if cuda:  # each piece fits the ring: only the store's stream reads the source
            t.record_stream(self._shared.copy_stream(t.device))
        elif s.keys:
            self._pending.append(([k for k, _o, _n in s.keys], t))
        self._counts["bytes_stored"] += n
        return s

    def _get(self, s: _Stored, device, stream: int, keys: list) -> torch.Tensor:
        """Start reading ``s`` into a new tensor on ``device``; its keys go to ``keys``. A
        state kept on the GPU is copied (the update changes its copy in place: the kept one
        stays as it was until the chunk is stored)."""
        if isinstance(s, _Kept):
            return s.tensor.to(device, copy=True)
        out = torch.empty(s.shape, dtype=s.dtype, device=device)
        self._get_into(s, out, stream, keys)
        return out

    def _get_into(self, s: _Stored, out: torch.Tensor, stream: int, keys: list) -> None:
        """Start reading ``s`` into ``out`` (contiguous, as large); its keys go to ``keys``."""
        cuda = out.device.type == "cuda"
        dev = (out.device.index or 0) if cuda else 0
        base = out.data_ptr()
        for key, off, n in s.keys:
            _C.store_get(self._h, key, base + off, n, int(cuda), dev, stream)
            keys.append(key)
        self._counts["bytes_fetched"] += out.numel() * out.element_size()

    def _get_now(self, s: _Stored, device) -> torch.Tensor:
        keys = []
        out = self._get(s, device, self._stream(device), keys)
        self._wait(keys)
        return out

    def _wait(self, keys) -> None:
        for key in keys:
            _C.store_wait(self._h, key)

    def _wait_quietly(self, keys) -> None:
        """Wait for reads whose memory is about to go, whatever became of them."""
        for key in keys:
            try:
                _C.store_wait(self._h, key)
            except (OSError, ValueError):
                pass

    def _drop(self, s: _Stored | None) -> None:
        if s is None:
            return
        if isinstance(s, _Kept):
            s.tensor = None
            return
        mine = {k for k, _o, _n in s.keys}
        for keys, _src in self._pending:  # a put reading host memory: let it finish first
            for key in keys:
                if key in mine:
                    try:
                        _C.store_wait(self._h, key)
                    except (ValueError, OSError):
                        pass
        for key, _off, _n in s.keys:
            try:
                _C.store_drop(self._h, key)
            except (ValueError, OSError):
                pass  # never stored (a put that failed)
        s.keys = []

    def _reap(self) -> None:
        """Let go of host sources the store has copied."""
        def busy(keys):
            for k in keys:
                try:
                    if not _C.store_released(self._h, k):
                        return True
                except (OSError, ValueError):
                    pass
            return False
        self._pending[:] = [p for p in self._pending if busy(p[0])]
