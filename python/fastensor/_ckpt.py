"""Shared checkpoint plumbing for the torch and numpy layers: the raw save and the
shard-at-a-time load (one allocation and one large read per shard)."""
from __future__ import annotations

import ctypes
import mmap as _mmap
import os
import warnings

from . import _C, cache_id, context, engine_id


class SaveWarning(UserWarning):
    """A save installed the new checkpoint, but a step after its commit failed (the directory
    fsync that makes it durable, or removing the previous checkpoint's files)."""



def install(path, data: bytes, *, sync=True):
    """Write ``data`` at ``path`` atomically (``ft_file_install``: a locked temporary that
    :func:`gc` removes after a crash, fdatasync, one rename, the directory fsync'ed; the file
    it replaces freed off the caller's path)."""
    warning = _C.file_install(context(), os.fspath(path), data, bool(sync))
    if warning is not None:
        warnings.warn(f"{os.fspath(path)}: installed, but {warning}", SaveWarning, stacklevel=3)


def remove(path):
    """Unlink ``path`` (FileNotFoundError where it is gone), its blocks freed off the caller's
    path (``ft_file_remove``)."""
    _C.file_remove(context(), os.fspath(path))


def save(path, items, metadata, *, engine="auto", shard_size=None, checksums=True,
         durable=True, cache="auto", compression=0, coded=None, coded_index=None):
    """items: [(name, dtype_name, shape_tuple, address, nbytes)]; the caller keeps memory alive.
    A ``.fst`` path writes a container (``compression``: the library's number of the mode,
    _fst.compression_id); ``coded`` (of _fst.code) holds its streams already, item i's the
    one of ``coded_index[i]`` (None: stream i)."""
    meta = {} if metadata is None else dict(metadata)
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError("metadata must map str to str")
    flags = (0 if checksums else _C.SAVE_NO_CHECKSUM) | (0 if durable else _C.SAVE_NO_SYNC)
    if shard_size is not None and shard_size <= 0:
        raise ValueError("shard_size must be positive")
    warning = _C.ckpt_save(context(), os.fspath(path), items, meta, engine_id(engine),
                           int(shard_size or 0), flags, cache_id(cache), int(compression),
                           coded, None if coded_index is None else list(coded_index))
    if warning is not None:
        warnings.warn(f"{os.fspath(path)}: saved, but {warning}", SaveWarning, stacklevel=3)


def gc(directory) -> list:
    """Remove what dead saves left in ``directory`` (temporaries of processes that are gone,
    shards of generations no index lists); saves in progress and checkpoints are left alone.
    Returns the removed paths."""
    return _C.ckpt_gc(context(), os.fspath(directory))


def open_checkpoint(path):
    """(handle, tensors, metadata, shards) of a file, index or directory (a path that does
    not exist: FileNotFoundError with safetensors' text)."""
    try:
        ck = _C.ckpt_open(context(), os.fspath(path))
    except FileNotFoundError:
        if os.path.lexists(path) or os.path.lexists(f"{os.fspath(path)}.index.json"):
            raise
        from ._st import not_found
        raise not_found(path) from None
    tensors, meta, shards, _ = _C.ckpt_describe(ck)
    return ck, tensors, meta, shards


def is_container(opened) -> bool:
    """Whether the checkpoint ``opened`` (what :func:`open_checkpoint` gave) is a compressed
    ``.fst`` container: the library tells, from the file's magic."""
    return _C.ckpt_format(opened[0]) == _C.FORMAT_FST


def load_shard(ck, shard, address, nbytes, *, engine="auto", verify=False, device=None,
               stream=0, cache="auto"):
    """Read a shard's data section into host memory, or device memory of CUDA ``device``."""
    kind, dev = (0, 0) if device is None else (1, device)
    return _C.ckpt_load_shard(ck, shard, address, nbytes, engine_id(engine), bool(verify),
                              kind, dev, stream, cache_id(cache))


def mapped_shard(ck, shard, info, *, engine="auto", verify=False, mmap=None, cache="auto"):
    """A private mapping of the file of shard ``shard`` (``info``: its (path, data size, data
    start)) for host tensors to view, or None where the shard is to be read instead.

    A mapping serves a shard without a copy and without fresh memory: its pages are the page
    cache's until a tensor writes to one (copy on write; the file never changes), and several
    processes mapping one checkpoint read it from the disk once. ``mmap`` True maps whenever
    it can; False never; None (the default) leaves it to the library
    (``ft_ckpt_shard_mappable``: with engine "auto", a shard the cache mode keeps in the page
    cache is mapped, an uncached one after a parallel readahead of it; ``cache``: "auto"
    keeps a checkpoint that fits, see :func:`fastensor.cache_id`). The library never maps
    for ``verify``, a .fst container, an empty or misaligned data section, or a file shorter
    than its header says (the read reports those)."""
    cache_id(cache)  # a bad name is an error whichever way the shard goes
    path, size, start = info
    if not _C.ckpt_shard_mappable(ck, shard, engine_id(engine), bool(verify),
                                  -1 if mmap is None else int(bool(mmap))):
        return None
    fd = _C.ckpt_shard_fd(ck, shard)
    m = _mmap.mmap(fd, start + size, flags=_mmap.MAP_PRIVATE,
                   prot=_mmap.PROT_READ | _mmap.PROT_WRITE)
    # Map the pages in now, read-only (MAP_POPULATE on a writable private mapping would copy
    # every page up front), in parallel: with mmap=None as each piece of the shard's parallel
    # readahead arrives (where the cache mode keeps it; else it is read instead).
    view = ctypes.c_char.from_buffer(m)
    try:
        if mmap is None:
            kept = _C.ckpt_shard_prefetch(ck, shard, cache_id(cache), ctypes.addressof(view))
        else:
            _C.map_populate(context(), ctypes.addressof(view), start + size)
            kept = True
    finally:
        del view  # (a live export would keep the mapping from closing)
    if not kept:
        m.close()
        return None
    return m
