"""fastensor as the storage layer of ``torch.distributed.checkpoint`` (DCP).

    import torch.distributed.checkpoint as dcp
    from fastensor.dcp import FastensorWriter, FastensorReader

    dcp.save(state, storage_writer=FastensorWriter("ckpt/step-100"))
    dcp.load(state, storage_reader=FastensorReader("ckpt/step-100"))
    fut = dcp.async_save(state, storage_writer=FastensorWriter("ckpt/step-200"))

Layout (DCP's, with safetensors data files): each rank writes the items of its plan as one
safetensors file ``__<rank>_<tag>.safetensors`` (fastensor's save: aligned, checksummed,
durable, written in parallel; with ``compression``, a compressed container
``__<rank>_<tag>.fst``, the items' offsets those of its decoded layout), and its non-tensor
items, where it has any, as
``__<rank>_<tag>.distcp``; the coordinator commits the checkpoint by replacing ``.metadata``
(DCP's pickled :class:`~torch.distributed.checkpoint.metadata.Metadata`, the items' file
offsets in ``storage_data``) with one rename, then removes the data files of the checkpoint
it replaced. ``<tag>`` is new for every save, so a save into the directory of an earlier
checkpoint never touches that checkpoint's files before the commit: a crash at any moment
leaves the earlier checkpoint loadable.

The data files carry DCP's own safetensors conventions (tensor names are the items' FQNs,
``DCP_SHARDING_INFO`` in the metadata), so DCP's ``HuggingFaceStorageReader`` reads these
checkpoints too; a checkpoint saved by one process is one safetensors file that
``fastensor.torch.load_file`` loads; :func:`consolidate` (``python -m fastensor.dcp
consolidate DIR OUT``) writes any of them as one safetensors checkpoint. DCP's
``FileSystemReader`` reads ``.metadata`` but not the data (it expects torch.save items).

Loads read only the byte ranges each rank's plan asks for, batched per file, in parallel,
straight into the destination tensors (host or CUDA memory) where the range is contiguous;
resharding works because the plan drives the reads. :class:`FastensorReader` also reads
checkpoints of DCP's default writer (torch.save items).
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import io
import json
import os
import pickle
import re
import sys
import threading
import uuid

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, Metadata,
                                                   StorageMeta, TensorStorageMetadata)
from torch.distributed.checkpoint.planner import SavePlan, WriteItemType
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.distributed.tensor import DTensor
from torch.futures import Future

from . import _async, _ckpt, _fst, cache_id, engine_id
from ._dcp_read import METADATA, FastensorReader, _Directory
from ._gpumem import device_room
from .torch import _TO_ST, _codes_on_gpu, _fst_code, _items, _nbytes, _st_shape

__all__ = ["FastensorWriter", "FastensorReader", "consolidate"]

# DCP's keys in a safetensors file's metadata (torch.distributed.checkpoint._hf_utils)
_SHARDING_KEY = "DCP_SHARDING_INFO"
_VERSION_KEY = "DCP_VERSION"
_DATA_FILE = re.compile(r"^__(\d+)_([0-9a-f]{12})\.(safetensors|distcp|fst)$")


@dataclasses.dataclass(frozen=True)
class _Plan:
    """A rank's storage data in the save plan: its file prefix and the save's tag."""
    prefix: str
    tag: str


def _write_durable(path, chunks, sync):
    """Write the byte strings ``chunks`` to ``path`` through a temporary and a rename (and,
    with ``sync``, durably: the file and its directory synced)."""
    _ckpt.install(path, b"".join(chunks), sync=sync)


# ---- staging for dcp.async_save ----

class _Staging:
    """Host copies of state dicts for async saves (their tensors, in :func:`_locals`' order),
    kept for the next save of the same structure (pinned where CUDA is present), and lent to
    one save at a time; for compressed saves, under ("fst", signature), the library's memory
    of their coded streams (:func:`fastensor._fst.code`)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.free = {}  # signature -> [staged state dicts not in use]

    def take(self, sig):
        with self.lock:
            got = self.free.get(sig)
            return got.pop() if got else None

    def give(self, sig, staged):
        with self.lock:
            self.free.setdefault(sig, []).append(staged)

    def clear(self):
        with self.lock:
            self.free.clear()


_STAGING = _Staging()


def _signature(obj):
    """A hashable description of a state dict's structure: keys, and each tensor's type,
    local shape, dtype and device type."""
    if isinstance(obj, dict):
        return ("d",) + tuple((k, _signature(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__,) + tuple(_signature(v) for v in obj)
    if isinstance(obj, torch.Tensor):
        local = obj.to_local() if hasattr(obj, "to_local") else obj
        return ("t", type(obj).__name__, tuple(local.shape), local.dtype, local.device.type)
    return ("o", type(obj).__name__)


def release_staging_memory() -> None:
    """Free the host copies kept for the next :func:`dcp.async_save` (those of saves in
    progress are freed when their save ends)."""
    _STAGING.clear()


_LEAVES = (int, float, str, bytes, io.BytesIO, type(None))


def _plain(obj) -> bool:
    """Whether a state dict holds only what :func:`_map_state` copies: dicts, lists, tuples,
    tensors, DTensors and the leaves DCP itself passes through."""
    if type(obj) in (dict, collections.OrderedDict):
        return all(_plain(v) for v in obj.values())
    if type(obj) in (list, tuple):
        return all(_plain(v) for v in obj)
    return type(obj) in (torch.Tensor, torch.nn.Parameter, DTensor) or isinstance(obj, _LEAVES)


def _map_state(obj, fn):
    """``obj`` (a plain state dict) with every tensor, a DTensor's local tensor included,
    replaced by ``fn(tensor)``, in one fixed order (that of :func:`_locals`)."""
    if isinstance(obj, dict):
        return type(obj)((k, _map_state(v, fn)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_state(v, fn) for v in obj)
    if isinstance(obj, DTensor):
        return DTensor.from_local(fn(obj._local_tensor.detach()), obj.device_mesh,
                                  obj.placements, run_check=False, shape=obj.shape,
                                  stride=obj.stride())
    if isinstance(obj, torch.Tensor):
        return fn(obj.detach())
    return obj


def _locals(obj, out=None) -> list:
    """The tensors of a plain state dict (DTensors' local tensors), in :func:`_map_state`'s
    order."""
    out = [] if out is None else out
    if isinstance(obj, dict):
        for v in obj.values():
            _locals(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _locals(v, out)
    elif isinstance(obj, DTensor):
        out.append(obj._local_tensor)
    elif isinstance(obj, torch.Tensor):
        out.append(obj)
    return out


def _cuda_devices(obj, plain) -> set:
    """The CUDA devices of a state dict's tensors (for one that is not plain: the current
    device, where CUDA is present)."""
    if plain:
        return {t.device for t in _locals(obj) if t.device.type == "cuda"}
    return {torch.device("cuda", torch.cuda.current_device())} \
        if torch.cuda.is_available() else set()


def _cuda_bytes(obj) -> int:
    return sum(t.numel() * t.element_size() for t in _locals(obj) if t.device.type == "cuda")


def _copy_state(src, kept):
    """``src`` staged into ``kept`` (its tensors, as :func:`_locals` lists them); CUDA
    copies are queued, not waited for."""
    it = iter(kept)
    return _map_state(src, lambda t: next(it).copy_(t, non_blocking=True))


@dataclasses.dataclass
class _Lent:
    """A staged copy lent to one save: its structure's signature, the copy, where it is
    ("kept", "device", "host", "other", or "coded": meta tensors standing for the streams in
    ``coded``, ``places`` giving each one's stream), whether the state had CUDA tensors, and
    whether its saves stage coded streams (:func:`_codes_on_gpu`)."""
    sig: object
    staged: object
    where: str
    cuda: bool
    coded: object = None
    places: dict = None
    codes: bool = False


def _pinned_like(specs):
    """Pinned host tensors of the shapes and dtypes of ``specs``, views of one buffer."""
    sizes = [(t.numel() * t.element_size() + 63) // 64 * 64 for t in specs]
    buf = torch.empty(max(sum(sizes), 1), dtype=torch.uint8, pin_memory=True)
    out, at = [], 0
    for t, n in zip(specs, sizes):
        if t.numel():
            out.append(buf[at:at + t.numel() * t.element_size()].view(t.dtype).view(t.shape))
        else:
            out.append(torch.empty(t.shape, dtype=t.dtype))
        at += n
    return out


# ---- the writer ----

class FastensorWriter(_Directory, StorageWriter, AsyncStager):
    """A DCP ``StorageWriter`` that writes each rank's items with fastensor.

    ``path``: the checkpoint directory (created); ``engine`` and ``cache``: fastensor's
    engine and page-cache mode for the writes (see :func:`fastensor.cache_id`);
    ``sync_files``: make the files durable before the commit (default; without it a crash
    can leave a committed checkpoint whose data is not on the disk); ``overwrite``: False
    raises RuntimeError where the directory already holds a checkpoint.
    ``compression``: None (default) writes each rank's tensors as a safetensors file;
    "auto", "always" or "none" as a compressed container ``__<rank>_<tag>.fst`` coded as
    :func:`fastensor.torch.save_file` codes a ``.fst`` name (CUDA tensors on their GPU where
    its encoder works there, else on the host). :class:`FastensorReader` decodes each saved chunk
    once and reshards as for safetensors files; DCP's own readers cannot read them.

    As an ``AsyncStager`` (``dcp.async_save``), it stages the state dict into memory kept for
    the next async save of the same structure (pinned where CUDA is present), so the
    caller's blocking time is the copy alone; a process's first save of a CUDA state dict
    copies on the GPU where it has room (see :meth:`stage`); with compression, where the
    GPU codes the tensors, the next saves stage their coded streams (the GPU codes them
    while the caller waits; the memory kept is their coded size, and the write codes
    nothing; H100, 2 GiB of bf16: 0.7x the memory, the commit 1.5x sooner, the caller's
    wait about a copy's), unless ``staging="copy"``; see :func:`release_staging_memory`.
    """

    _synchronize_after_execute = False

    def __init__(self, path, *, engine: str = "auto", cache: str = "auto",
                 sync_files: bool = True, overwrite: bool = True, compression: str | None = None,
                 staging: str = "auto"):
        super().__init__()
        engine_id(engine)
        cache_id(cache)
        if compression is not None:
            _fst.compression_id(compression)
        if staging not in ("auto", "copy"):
            raise ValueError(f"staging must be 'auto' or 'copy', not {staging!r}")
        self.compression, self.staging = compression, staging
        self.path = os.fspath(path)
        self.engine, self.cache = engine, cache
        self.sync_files, self.overwrite = bool(sync_files), bool(overwrite)
        self.save_id = uuid.uuid4().hex
        self.rank = None
        self.is_coordinator = False
        self.use_collectives = True
        self._staged = []  # (signature, staged dict, where, had CUDA) lent to saves, oldest first
        self._staged_lock = threading.Lock()
        # SIGTERM finishes this writer's saves in flight first (async_save writes on a
        # thread of its own, where no signal handler can be installed)
        _async._term.arm()

    # -- StorageWriter --
    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id:
            self.path = os.fspath(checkpoint_id)
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        self.is_coordinator = bool(is_coordinator)
        self.rank = kwargs.get("rank")
        self.use_collectives = kwargs.get("use_collectives", True)

    def _metadata_path(self, rank=None):
        return os.path.join(self.path, METADATA if rank is None else f"__{rank}{METADATA}")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        os.makedirs(self.path, exist_ok=True)
        existing = self._metadata_path(None if self.use_collectives else 0)
        if not self.overwrite and os.path.exists(existing):
            raise RuntimeError(f"{self.path}: a checkpoint is already there (overwrite=False)")
        if self.rank is not None and not self.use_collectives:
            plan = dataclasses.replace(plan, storage_data=_Plan(f"__{self.rank}_",
                                                                self.save_id[:12]))
        return plan

    def prepare_global_plan(self, plans: list) -> list:
        tag = self.save_id[:12]
        return [p if isinstance(p.storage_data, _Plan) else
                dataclasses.replace(p, storage_data=_Plan(f"__{i}_", tag))
                for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner) -> Future:
        try:
            with _async.in_flight(self.path):  # (dcp.async_save runs it on a thread of its own)
                results = self._write(plan, planner)
        finally:
            self._unlend()
        fut = Future()
        fut.set_result(results)
        return fut

    def _write(self, plan, planner):
        sd = plan.storage_data
        if not isinstance(sd, _Plan):
            raise RuntimeError("FastensorWriter.write_data: the plan was not prepared by "
                               "FastensorWriter.prepare_global_plan")
        tensors = [it for it in plan.items if it.type != WriteItemType.BYTE_IO]
        blobs = [it for it in plan.items if it.type == WriteItemType.BYTE_IO]
        results = []
        where = f"rank {self.rank if self.rank is not None else 0}"
        if blobs:
            name = f"{sd.prefix}{sd.tag}.distcp"
            chunks, at = [], 0
            for it in blobs:
                data = planner.resolve_data(it)
                buf = data.getbuffer() if isinstance(data, io.BytesIO) else bytes(data)
                chunks.append(buf)
                results.append(WriteResult(index=it.index, size_in_bytes=len(buf),
                                           storage_data=_StorageInfo(name, at, len(buf))))
                at += len(buf)
            try:
                _write_durable(os.path.join(self.path, name), chunks, self.sync_files)
            except OSError as e:
                raise OSError(e.errno, f"{where}: {os.path.join(self.path, name)}: "
                                       f"{e.strerror}") from e
        if tensors:
            results += self._write_tensors(sd, tensors, planner, where)
        return results

    def _write_tensors(self, sd, items, planner, where):
        coded = self.compression is not None
        name = f"{sd.prefix}{sd.tag}{_fst.SUFFIX if coded else '.safetensors'}"
        path = os.path.join(self.path, name)
        names = [it.index.fqn for it in items]
        if len(set(names)) != len(names):  # one rank with two chunks of one tensor
            names = [f"{it.index.fqn}@{','.join(map(str, it.index.offset or ()))}"
                     for it in items]
        tensors, sharding, lent, streams = {}, {}, None, []
        for n, it in zip(names, items):
            t = planner.resolve_data(it)
            if t.device.type == "meta":  # a stand-in for a stream coded by stage()
                lent = lent or self._lent_of(t)
                if id(t) not in lent.places:
                    raise RuntimeError(f"{where}: item {it.index.fqn!r}: no coded stream")
                streams.append(lent.places[id(t)])
            t = t.detach()
            if t.device.type not in ("cpu", "cuda", "meta"):
                t = t.to("cpu")
            if t.dtype not in _TO_ST:
                raise ValueError(f"{where}: item {it.index.fqn!r}: dtype {t.dtype} has no "
                                 "safetensors equivalent")
            tensors[n] = t.contiguous()
            offsets = it.tensor_data.chunk.offsets if it.tensor_data is not None else ()
            sharding[n] = {"saved_offsets": [int(o) for o in offsets]}
        if lent is not None and len(streams) != len(tensors):
            raise RuntimeError(f"{where}: coded and uncoded items in one save")
        # DCP's items may share memory (tied weights): each is written, no safetensors check
        if lent is not None:  # (their data is in the streams)
            entries, keep = [(n, _TO_ST[t.dtype], _st_shape(t), 0, _nbytes(t))
                             for n, t in tensors.items()], None
        else:
            entries, keep = _items(tensors, check=False)
        meta = {"format": "pt", _SHARDING_KEY: json.dumps(sharding), _VERSION_KEY: "1.0"}
        try:
            _ckpt.save(path, entries, meta,
                       engine=self.engine, durable=self.sync_files, cache=self.cache,
                       compression=_fst.compression_id(self.compression) if coded else 0,
                       coded=lent and lent.coded, coded_index=lent and streams)
            ck, described, _, shards = _ckpt.open_checkpoint(path)
        except OSError as e:
            raise OSError(e.errno, f"{where}: {path}: {e.strerror or e}") from e
        except ValueError as e:
            raise ValueError(f"{where}: {path}: {e}") from e
        del ck, keep
        start = 0 if coded else shards[0][2]  # (a container's items: their decoded layout's)
        at = {t[0]: (start + t[5], t[3]) for t in described}
        return [WriteResult(index=it.index, size_in_bytes=at[n][1],
                            storage_data=_StorageInfo(name, at[n][0], at[n][1]))
                for n, it in zip(names, items)]

    def finish(self, metadata: Metadata, results: list) -> None:
        with _async.in_flight(self.path):
            self._finish(metadata, results)

    def _finish(self, metadata, results):
        metadata.version = "1.0.0"
        metadata.storage_data = {wr.index: wr.storage_data for rs in results for wr in rs}
        metadata.storage_meta = self.storage_meta()
        rank = None if self.use_collectives or self.rank is None else self.rank
        final = self._metadata_path(rank)
        _write_durable(final, [pickle.dumps(metadata)], self.sync_files)
        self._remove_replaced(metadata, rank)
        try:  # what saves killed in this directory left (temporaries of dead processes)
            _ckpt.gc(self.path)
        except OSError:
            pass

    def _remove_replaced(self, metadata, rank):
        """Remove the data files of checkpoints this one replaced (ours by their names:
        another tag; of this rank alone for a rank's own metadata)."""
        live = {si.relative_path for si in metadata.storage_data.values()}
        tag = self.save_id[:12]
        for entry in os.listdir(self.path):
            m = _DATA_FILE.match(entry)
            if not m or entry in live or m.group(2) == tag:
                continue
            if rank is not None and int(m.group(1)) != rank:
                continue
            try:  # (freed off this path: a replaced checkpoint's data may be GiBs)
                _ckpt.remove(os.path.join(self.path, entry))
            except FileNotFoundError:
                pass

    def storage_meta(self) -> StorageMeta:
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id,
                           modules=["fastensor.dcp"])

    # -- AsyncStager --
    def stage(self, state_dict):
        """A copy of ``state_dict`` that the save writes while the caller goes on (DCP calls
        this in ``async_save`` before returning).

        Where a pinned copy of this structure is kept from an earlier save, the tensors are
        copied into it. Else, where every CUDA tensor is on one GPU with room to spare, they
        are copied on that GPU (a device-to-device copy: milliseconds, where allocating pinned
        memory first would take the caller a second or more per GiB) and the other tensors
        where they are; without that room, into pageable host memory as DCP's own stager
        does. After such a save's write, its copy is replaced by a pinned one, allocated in
        the background, for the next save. With compression, where the tensors' GPU codes
        them, the copy is replaced by the memory of their coded streams instead, and the
        next saves stage those streams (meta tensors stand for them in the staged dict)."""
        sig = _signature(state_dict)
        plain = _plain(state_dict)
        cuda = _cuda_devices(state_dict, plain)
        codes = plain and self.staging == "auto" and \
            _codes_on_gpu(_locals(state_dict), self.compression)
        lent = self._stage_coded(state_dict, sig) if codes else None
        if lent is not None:
            with self._staged_lock:
                self._staged.append(lent)
            return lent.staged
        kept = _STAGING.take(sig) if plain and not codes else None
        if kept is not None:
            staged, where = _copy_state(state_dict, kept), "kept"
        elif not plain:  # ShardedTensor and other types: torch's own utilities, not kept
            from torch.distributed._state_dict_utils import (_copy_state_dict,
                                                             _create_cpu_state_dict)
            staged = _copy_state_dict(state_dict, _create_cpu_state_dict(state_dict),
                                      non_blocking=True)
            where = "other"
        else:
            staged, where = None, "host"
            if len(cuda) == 1 and device_room(next(iter(cuda)), _cuda_bytes(state_dict)):
                try:
                    staged, where = _map_state(state_dict, lambda t: t.clone()), "device"
                except torch.OutOfMemoryError:  # taken meanwhile: on the host after all
                    staged, where = None, "host"
            if staged is None:
                staged = _map_state(state_dict, lambda t: t.to("cpu", copy=True))
        for d in cuda:
            torch.cuda.current_stream(d).synchronize()
        with self._staged_lock:
            self._staged.append(_Lent(sig, staged, where, bool(cuda), codes=codes))
        return staged

    def _stage_coded(self, state_dict, sig):
        """A compressed save's staging as its coded streams (their GPU codes them), in the
        memory kept from the last save of the structure (made after it: see :meth:`_unlend`):
        meta tensors stand for them in the state dict DCP plans. None where there is no such
        memory (or coding failed: the memory kept, a copy staged)."""
        kept = _STAGING.take(("fst", sig))
        if kept is None:
            return None
        try:
            coded = _fst_code(self.path, _locals(state_dict), self.compression, kept)
        except (OSError, MemoryError):
            _STAGING.give(("fst", sig), kept)
            return None
        staged = _map_state(state_dict, lambda t: torch.empty_like(t, device="meta"))
        places = {id(m): i for i, m in enumerate(_locals(staged))}
        return _Lent(sig, staged, "coded", True, coded, places, codes=True)

    def _lent_of(self, meta):
        """The coded staging that tensor ``meta`` stands for."""
        with self._staged_lock:
            for lent in self._staged:
                if lent.places and id(meta) in lent.places:
                    return lent
        raise RuntimeError("FastensorWriter: a meta tensor that no coded staging made")

    def _unlend(self):
        """The staged copy of the save whose write just ended goes back for the next one: as
        it is where it is memory worth keeping (pinned, the host copy of a state dict without
        CUDA tensors, coded streams); for saves that stage coded streams, their memory is made
        by coding the copy in the background; else a pinned copy of its structure is made in
        the background while the device or pageable copy is freed."""
        with self._staged_lock:
            if not self._staged:
                return
            lent = self._staged.pop(0)
        sig, where, cuda, codes = lent.sig, lent.where, lent.cuda, lent.codes
        if where == "coded":
            _STAGING.give(("fst", sig), lent.coded)
        if where in ("other", "coded"):
            return
        tensors = _locals(lent.staged)
        del lent
        if codes:
            # the next save stages its coded streams: their memory shaped by coding this copy
            # (on its GPU where it is there, in the background) before the copy goes
            directory, compression = self.path, self.compression

            def make():
                try:
                    _STAGING.give(("fst", sig), _fst_code(directory, tensors, compression))
                except (OSError, MemoryError):
                    pass
            threading.Thread(target=make, daemon=True, name="fastensor-dcp-staging").start()
        elif where == "kept" or (where == "host" and not cuda):
            _STAGING.give(sig, tensors)
        elif torch.cuda.is_available():
            specs = [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in tensors]
            del tensors  # the device copy goes now
            threading.Thread(target=lambda: _STAGING.give(sig, _pinned_like(specs)),
                             daemon=True, name="fastensor-dcp-staging").start()

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        pass


# ---- consolidation ----

def consolidate(checkpoint, output, *, shard_size: int | None = None) -> list:
    """Write the tensors of the DCP checkpoint ``checkpoint`` (any world size, written by
    :class:`FastensorWriter` or DCP's default writer) as one safetensors checkpoint
    ``output`` (full tensors, named by their FQNs; sharded above ``shard_size`` bytes) that
    ``fastensor.torch.load_file`` and safetensors load. Holds the whole state in host
    memory. Returns the FQNs of the non-tensor items, which safetensors cannot hold and are
    left out."""
    import torch.distributed.checkpoint as dcp
    from .torch import save_file
    reader = FastensorReader(checkpoint)
    md = reader.read_metadata()
    state, skipped = {}, []
    for fqn, m in md.state_dict_metadata.items():
        if isinstance(m, TensorStorageMetadata):
            state[fqn] = torch.empty(tuple(m.size), dtype=m.properties.dtype)
        elif isinstance(m, BytesStorageMetadata):
            skipped.append(fqn)
    planner = dcp.DefaultLoadPlanner(flatten_state_dict=False, allow_partial_load=True)
    dcp.load(state, storage_reader=reader, planner=planner, no_dist=True)
    save_file(state, output, metadata={"format": "pt"}, shard_size=shard_size)
    return skipped


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fastensor.dcp",
                                description="fastensor's tools for DCP checkpoints")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("consolidate", help="write a DCP checkpoint as one safetensors "
                                           "checkpoint")
    c.add_argument("checkpoint")
    c.add_argument("output")
    c.add_argument("--shard-size", type=int, default=None)
    a = p.parse_args(argv)
    try:
        skipped = consolidate(a.checkpoint, a.output, shard_size=a.shard_size)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"fastensor.dcp: {e}", file=sys.stderr)
        return 1
    if skipped:
        print(f"left out {len(skipped)} non-tensor items: {', '.join(skipped)}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
