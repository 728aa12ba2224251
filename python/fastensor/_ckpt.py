"""Shared checkpoint plumbing for the torch and numpy layers: the raw save and the
shard-at-a-time load (one allocation and one large read per shard)."""
from __future__ import annotations

import os

from . import _C, context, engine_id


def save(path, items, metadata, *, engine="auto", shard_size=None, checksums=True,
         durable=True):
    """items: [(name, dtype_name, shape_tuple, address, nbytes)]; the caller keeps memory alive."""
    meta = {} if metadata is None else dict(metadata)
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError("metadata must map str to str")
    flags = (0 if checksums else _C.SAVE_NO_CHECKSUM) | (0 if durable else _C.SAVE_NO_SYNC)
    if shard_size is not None and shard_size <= 0:
        raise ValueError("shard_size must be positive")
    _C.ckpt_save(context(), os.fspath(path), items, meta, engine_id(engine),
                 int(shard_size or 0), flags)


def open_checkpoint(path):
    """(handle, tensors, metadata, shards) of a file, index or directory."""
    ck = _C.ckpt_open(context(), os.fspath(path))
    tensors, meta, shards, _ = _C.ckpt_describe(ck)
    return ck, tensors, meta, shards


def load_shard(ck, shard, address, nbytes, *, engine="auto", verify=False, device=None,
               stream=0):
    """Read a shard's data section into host memory, or device memory of CUDA ``device``."""
    kind, dev = (0, 0) if device is None else (1, device)
    return _C.ckpt_load_shard(ck, shard, address, nbytes, engine_id(engine), bool(verify),
                              kind, dev, stream)
