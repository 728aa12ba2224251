"""What :class:`fastensor.optim.OffloadedOptimizer` keeps per parameter: its entries in the
store (or kept on the GPU), what a chunk reads back, the ``state`` view, and the norms its
gradient clipping takes."""
from __future__ import annotations

import collections.abc

import torch

from . import _C


class _Stored:
    """A tensor kept in the store: its pieces' keys, (offset, length) each, and its kind."""
    __slots__ = ("keys", "shape", "dtype")

    def nbytes(self) -> int:
        return sum(n for _key, _off, n in self.keys)


class _Kept:
    """A state kept on the GPU between steps (``gpu_budget_bytes``): not in the store."""
    __slots__ = ("tensor", "keys")

    def __init__(self, tensor):
        self.tensor, self.keys = tensor, []

    @property
    def dtype(self):
        return self.tensor.dtype

    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()


class _Record:
    """What the store holds for one parameter."""
    __slots__ = ("states", "small", "grad", "master", "param", "grad_norm", "grad_scale")

    def __init__(self):
        self.states = {}   # name -> _Stored
        self.small = {}    # name -> value kept as it is (Adam's step, small tensors)
        self.grad = None   # _Stored: the offloaded gradient
        self.master = None  # _Stored: the fp32 master copy
        self.param = None  # _Stored: the parameter itself, streamed (fastensor.stream)
        self.grad_norm = None   # its 2-norm, taken as it left (a tensor on its device)
        self.grad_scale = None  # clip_grad_norm_'s factor, applied when step() reads it


class _Fetched:
    """A chunk parameter's tensors being read back, and the keys to wait for."""
    __slots__ = ("states", "grad", "master", "param", "keys")

    def __init__(self):
        self.states, self.grad, self.master, self.param, self.keys = {}, None, None, None, []


class _StateView(collections.abc.Mapping):
    """``OffloadedOptimizer.state``: each parameter's states as host copies, read from the
    store when asked for (changing them changes nothing)."""

    def __init__(self, records, read):
        self._records, self._read = records, read

    def __getitem__(self, p):
        rec = self._records.get(p)
        if rec is None or not (rec.states or rec.small or rec.master):
            raise KeyError(p)
        return self._read(rec)

    def __iter__(self):
        return (p for p, r in list(self._records.items()) if r.states or r.small or r.master)

    def __len__(self):
        return sum(1 for _ in self)


def _drop_all(h, records, pending) -> None:
    """Drop every entry ``records`` holds (the optimizer is gone, or closed), once the puts
    still reading host memory of ``pending`` have read it (a dropped entry's put goes on
    reading its source)."""
    for keys, _src in pending:
        for key in keys:
            try:
                _C.store_wait(h, key)
            except (ValueError, OSError):
                pass
    pending.clear()
    for rec in records.values():
        for s in list(rec.states.values()) + [rec.grad, rec.master, rec.param]:
            for key, _off, _n in (s.keys if s is not None else ()):
                try:
                    _C.store_drop(h, key)
                except (ValueError, OSError):
                    pass
    records.clear()


def _norms(tensors, norm_type):
    """The norms torch.nn.utils.clip_grad_norm_ takes of tensors of one device and dtype."""
    if not tensors:
        return []
    if tensors[0].device.type in ("cuda", "cpu"):
        return list(torch._foreach_norm(tensors, norm_type))
    return [torch.linalg.vector_norm(t, norm_type) for t in tensors]


def _norm(t, norm_type):
    return _norms([t], norm_type)[0]
