"""The reading half of :mod:`fastensor.dcp`: :class:`FastensorReader` (fastensor.dcp
exports it) and the reads of one data file."""
from __future__ import annotations

import bisect
import errno
import io
import math
import os
import pickle
import uuid
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from . import File, _C, _ckpt, _fst, cache_id, engine_id
from ._safe import runs_of

METADATA = ".metadata"
# A ranged read of a tensor item goes straight into the destination in at most this many
# runs (a box of whole rows is one run); more, smaller runs are read as one span and copied.
_DIRECT_RUNS = 64
# Spans read into temporary memory (destinations that are not dense, other dtypes) are
# read in groups of at most this many bytes.
_SPAN_GROUP = 512 << 20
# A checkpoint of at most this many data files has them all opened as its metadata is read,
# so a save replacing it during the load cannot remove them; larger ones open each file when
# it is read (and a file removed by such a save fails the load, saying so).
_HOLD_MAX = 256
# Starts over on metadata replaced between its reading and the opening of its files.
_OPEN_TRIES = 3


def _same_file(a, b) -> bool:
    return (a.st_dev, a.st_ino, a.st_mtime_ns, a.st_size) == \
        (b.st_dev, b.st_ino, b.st_mtime_ns, b.st_size)


class _Directory:
    """What DCP asks of a storage layer about its checkpoint id: a directory path."""

    @property
    def checkpoint_id(self):
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))


class FastensorReader(_Directory, StorageReader):
    """A DCP ``StorageReader`` for checkpoints of :class:`FastensorWriter` (and of DCP's
    default writer).

    Each rank reads only the byte ranges its load plan asks for: per file one batch of
    reads, files in parallel, straight into the destination tensor (host or CUDA) where the
    range is one run or a few of it. ``verify``: check fastensor's block checksums of every
    block read (ValueError naming the rank, file, item and block on a mismatch);
    ``engine``/``cache``: as for :class:`FastensorWriter`; ``threads``: files read at once.
    """

    def __init__(self, path, *, engine: str = "auto", cache: str = "auto",
                 verify: bool = False, threads: int = 4):
        super().__init__()
        engine_id(engine)
        cache_id(cache)
        self.path = os.fspath(path)
        self.engine, self.cache, self.verify = engine, cache, bool(verify)
        self.threads = max(1, int(threads))
        self.storage_data = {}
        self.chunks = {}
        self.load_id = uuid.uuid4().hex
        self.rank = None
        self._held = {}  # data file (relative path) -> descriptor open since read_metadata
        self._metadata_stat = None  # (path, os.stat_result) of the metadata read

    def _release(self):
        held, self._held = getattr(self, "_held", {}), {}
        for fd in held.values():
            os.close(fd)

    def __del__(self):
        self._release()

    def reset(self, checkpoint_id=None) -> None:
        self._release()
        self.storage_data, self.chunks = {}, {}
        if checkpoint_id:
            self.path = os.fspath(checkpoint_id)
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args, **kwargs) -> Metadata:
        rank = kwargs.get("rank")
        path = os.path.join(self.path, METADATA if rank is None else f"__{rank}{METADATA}")
        for tries in range(1, _OPEN_TRIES + 1):
            metadata, seen = self._unpickle(path)
            try:
                self._hold(metadata, path, seen)
                break
            except FileNotFoundError:  # the metadata was replaced meanwhile
                if tries == _OPEN_TRIES:
                    raise OSError(errno.ESTALE, f"{self.path}: the checkpoint was replaced by "
                                                f"a save while it was being opened ({tries} "
                                                "times): load it again") from None
        self._metadata_stat = (path, seen)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def _unpickle(self, path):
        """The metadata at ``path`` and what the file was when it was read."""
        try:
            with open(path, "rb") as f:
                seen = os.fstat(f.fileno())
                metadata = pickle.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path}: no DCP checkpoint here ({path} is missing)") \
                from None
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as e:
            raise ValueError(f"{path}: not a DCP checkpoint's metadata ({e})") from e
        if not isinstance(metadata, Metadata):
            raise ValueError(f"{path}: not a DCP checkpoint's metadata "
                             f"({type(metadata).__name__})")
        return metadata, seen

    def _hold(self, metadata, path, seen):
        """Open the data files the metadata names (at most _HOLD_MAX of them): from here on
        their descriptors keep this version readable whatever a save does to the names.
        FileNotFoundError where one is gone because the metadata at ``path`` is no longer
        the one read (``seen``); one missing from the start is named by the read that needs
        it (DCP before torch 2.12 turns errors of read_metadata into "metadata is None")."""
        self._release()
        names = {i.relative_path for i in (metadata.storage_data or {}).values()}
        if len(names) > _HOLD_MAX:
            return
        try:
            for n in sorted(names):
                try:
                    self._held[n] = os.open(os.path.join(self.path, n),
                                            os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    if self._replaced(path, seen):
                        raise
        except BaseException:
            self._release()
            raise

    @staticmethod
    def _replaced(path, seen) -> bool:
        try:
            return not _same_file(os.stat(path), seen)
        except FileNotFoundError:
            return True

    def _data_path(self, relative):
        """Where to open a data file: the descriptor held since the metadata was read (the
        same file whatever happened to its name since), else its name."""
        fd = self._held.get(relative)
        return f"/proc/self/fd/{fd}" if fd is not None else os.path.join(self.path, relative)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args,
                              **kwargs) -> None:
        if metadata.storage_data is None:
            raise ValueError(f"{self.path}: the checkpoint's metadata has no storage data")
        self.storage_data = metadata.storage_data
        self.rank = kwargs.get("rank")
        self.chunks = {}
        for fqn, md in metadata.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                for c in md.chunks:
                    self.chunks[(fqn, tuple(c.offsets))] = (tuple(c.sizes),
                                                            md.properties.dtype)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list) -> list:
        return plans

    def _where(self, relative, items):
        names = ", ".join(sorted({repr(r.storage_index.fqn) for r in items})[:4])
        more = "" if len(items) <= 4 else f" and {len(items) - 4} more"
        rank = self.rank if self.rank is not None else 0
        return f"rank {rank}: {os.path.join(self.path, relative)} (items {names}{more})"

    def read_data(self, plan: LoadPlan, planner) -> Future:
        per_file = {}
        for req in plan.items:
            try:
                info = self.storage_data[req.storage_index]
            except KeyError:
                raise KeyError(f"rank {self.rank or 0}: {self.path}: the checkpoint has no "
                               f"item {req.storage_index.fqn!r} at offset "
                               f"{list(req.storage_index.offset or ())}") from None
            per_file.setdefault(info.relative_path, []).append(req)
        files = sorted(per_file.items())
        if len(files) <= 1 or self.threads == 1:
            for relative, reqs in files:
                self._read_file(relative, reqs, planner)
        else:
            with ThreadPoolExecutor(max_workers=min(self.threads, len(files))) as ex:
                for f in [ex.submit(self._read_file, r, q, planner) for r, q in files]:
                    f.result()
        fut = Future()
        fut.set_result(None)
        return fut

    def _chunk(self, req):
        """(storage info, saved chunk's sizes, dtype) of a tensor item (ValueError where the
        metadata does not describe it consistently)."""
        info = self.storage_data[req.storage_index]
        key = (req.storage_index.fqn, tuple(req.storage_index.offset or ()))
        sizes, dtype = self.chunks.get(key, (None, None))
        if sizes is None:
            raise ValueError(f"item {key[0]!r} at {list(key[1])}: no such chunk in the "
                             "metadata")
        if math.prod(sizes) * dtype.itemsize != info.length:
            raise ValueError(f"item {key[0]!r}: the metadata gives {info.length} bytes "
                             f"for a chunk of {list(sizes)} {dtype}")
        return info, sizes, dtype

    def _read_file(self, relative, reqs, planner):
        path = self._data_path(relative)
        try:
            if relative.endswith(_fst.SUFFIX):
                return _FstRead(self, path, planner).run(reqs)
            if not relative.endswith(".safetensors"):
                return self._read_torch_save(path, reqs, planner)
            return _FileRead(self, path, planner).run(reqs)
        except FileNotFoundError as e:
            if self._metadata_stat and self._replaced(*self._metadata_stat):
                raise OSError(errno.ESTALE, f"{self._where(relative, reqs)}: the checkpoint "
                                            "was replaced by a save during this load: load it "
                                            "again") from e
            raise FileNotFoundError(e.errno, f"{self._where(relative, reqs)}: "
                                             f"{e.strerror or e}") from e
        except OSError as e:
            raise OSError(e.errno, f"{self._where(relative, reqs)}: {e.strerror or e}") from e
        except (ValueError, RuntimeError, AssertionError) as e:
            raise type(e)(f"{self._where(relative, reqs)}: {e}") from e

    def _read_torch_save(self, path, reqs, planner):
        """Items of DCP's default writer: raw bytes and torch.save'd tensors."""
        with open(path, "rb") as f:
            for req in sorted(reqs, key=lambda r: self.storage_data[r.storage_index].offset):
                info = self.storage_data[req.storage_index]
                if getattr(info, "transform_descriptors", None):
                    raise ValueError("items written with DCP stream extensions are not "
                                     "supported; read this checkpoint with FileSystemReader")
                f.seek(info.offset)
                data = io.BytesIO(f.read(info.length))
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, data)
                    continue
                t = torch.load(data, map_location="cpu", weights_only=True)
                for d, (o, n) in enumerate(zip(req.storage_offsets, req.lengths)):
                    t = t.narrow(d, o, n)
                target = planner.resolve_tensor(req).detach()
                _check_size(req, target, t.shape)
                target.copy_(t)
                planner.commit_tensor(req, target)


def _check_size(req, target, shape):
    if tuple(target.shape) != tuple(shape):
        raise RuntimeError(f"item {req.storage_index.fqn!r}: the destination has shape "
                           f"{tuple(target.shape)}, the plan reads {tuple(shape)}")


class _FileRead:
    """The reads of one load plan from one safetensors data file."""

    def __init__(self, reader, path, planner):
        self.r, self.path, self.planner = reader, path, planner

    def run(self, reqs):
        tensors = [q for q in reqs if q.type != LoadItemType.BYTE_IO]
        blobs = [q for q in reqs if q.type == LoadItemType.BYTE_IO]
        if blobs:  # (a FastensorWriter checkpoint keeps them in .distcp files)
            raise ValueError("a safetensors data file cannot hold non-tensor items")
        direct, spans = [], []  # spans: (req, target, dtype, sizes, first, last)
        for req in tensors:
            info, sizes, dtype = self.r._chunk(req)
            esize = dtype.itemsize
            target = self.planner.resolve_tensor(req).detach()
            _check_size(req, target, req.lengths)
            box = [(int(o), int(o) + int(n)) for o, n in zip(req.storage_offsets, req.lengths)]
            if math.prod(req.lengths) == 0:
                self.planner.commit_tensor(req, target)
                continue
            runs = runs_of(sizes, box, esize)
            dense = target.dtype == dtype and target.is_contiguous() and \
                target.device.type in ("cpu", "cuda")
            if dense and len(runs) <= _DIRECT_RUNS:
                base = target.data_ptr()
                direct += [(req, target, base + at, n, info.offset + off) for off, n, at in runs]
            else:
                first, last = runs[0][0], runs[-1][0] + runs[-1][1]
                spans.append((req, target, dtype, sizes, info.offset + first, last - first))
        if direct:
            self._batch([(t, addr, n, off) for _, t, addr, n, off in direct])
            done = set()
            for req, target, *_ in direct:
                if id(req) not in done:
                    done.add(id(req))
                    self.planner.commit_tensor(req, target)
        group, size = [], 0
        for s in spans:
            if group and size + s[5] > _SPAN_GROUP:
                self._spans(group)
                group, size = [], 0
            group.append(s)
            size += s[5]
        if group:
            self._spans(group)

    def _spans(self, group):
        bufs = []
        for req, target, dtype, sizes, off, n in group:
            dev = target.device if target.device.type == "cuda" else torch.device("cpu")
            buf = torch.empty(n, dtype=torch.uint8, device=dev)
            bufs.append(buf)
        self._batch([(buf, buf.data_ptr(), g[5], g[4]) for buf, g in zip(bufs, group)])
        for buf, (req, target, dtype, sizes, _, _) in zip(bufs, group):
            strides = [math.prod(sizes[d + 1:]) for d in range(len(sizes))]
            # the span starts at the box's first element
            src = torch.as_strided(buf.view(dtype), tuple(req.lengths), strides, 0)
            target.copy_(src)
            self.planner.commit_tensor(req, target)

    def _batch(self, ops):
        """ops: (tensor, address, nbytes, file offset); CUDA tensors on their current stream."""
        if self.r.verify:
            return self._verified(ops)
        stream, items = 0, []
        for t, addr, n, off in ops:
            cuda = t.device.type == "cuda"
            if cuda and not stream:
                stream = torch.cuda.current_stream(t.device).cuda_stream
            items.append((addr, n, off, int(cuda), (t.device.index or 0) if cuda else 0))
        f = File(self.path, "r", engine=self.r.engine, cache=self.r.cache)
        try:
            got = _C.file_batch(f._handle, items, engine_id(self.r.engine), 0, False, stream,
                                cache_id(self.r.cache))
        finally:
            f.close()
        short = [(i, g) for i, g in enumerate(got) if g != items[i][1]]
        if short:
            i, g = short[0]
            raise ValueError(f"the file ends early: {g} of {items[i][1]} bytes at offset "
                             f"{items[i][2]} (truncated?)")

    def _verified(self, ops):
        """The reads through the checkpoint, checking the block checksums they cover."""
        ck, tensors, _, shards = _ckpt.open_checkpoint(self.path)
        if not _C.ckpt_describe(ck)[3]:
            raise ValueError("verify=True, but the file carries no fastensor checksums")
        start = shards[0][2]
        spans = sorted((start + t[5], start + t[5] + t[3], i) for i, t in enumerate(tensors))
        lows = [s[0] for s in spans]

        def one(op):
            t, addr, n, off = op
            k = bisect.bisect_right(lows, off) - 1
            if k < 0 or off + n > spans[k][1]:
                raise ValueError(f"bytes [{off}, {off + n}) are not inside one tensor of the "
                                 "file")
            cuda = t.device.type == "cuda"
            stream = torch.cuda.current_stream(t.device).cuda_stream if cuda else 0
            _C.ckpt_read(ck, spans[k][2], off - spans[k][0], addr, n, engine_id(self.r.engine),
                         True, int(cuda), (t.device.index or 0) if cuda else 0, stream,
                         cache_id(self.r.cache))

        with ThreadPoolExecutor(max_workers=min(8, max(1, len(ops)))) as ex:
            for f in [ex.submit(one, op) for op in ops]:
                f.result()


class _FstRead:
    """The reads of one load plan from one ``.fst`` data file (FastensorWriter's
    ``compression``): each saved chunk's stream is read and decoded once, straight into the
    destination where the plan reads the whole chunk into dense memory of its dtype, else
    into temporary memory on the destination's device, from which each item's box is
    copied; up to 8 chunks at once (a chunk at a time left the disk idle while each was
    decoded). CUDA destinations decode on the GPU where the library can (unless ``verify``:
    block checksums are checked on the host), on the stream that is current for the load."""

    def __init__(self, reader, path, planner):
        self.r, self.path, self.planner = reader, path, planner

    def run(self, reqs):
        if any(q.type == LoadItemType.BYTE_IO for q in reqs):
            raise ValueError("a .fst data file cannot hold non-tensor items")
        c = _fst.Container(self.path, engine=self.r.engine, cache=self.r.cache)
        at = {(x.begin, x.nbytes): x for x in c.entries}  # (an empty tensor shares a begin)
        chunks = {}  # entry index -> (entry, sizes, dtype, [(req, target)])
        for req in reqs:
            info, sizes, dtype = self.r._chunk(req)
            x = at.get((info.offset, info.length))
            if x is None:
                raise ValueError(f"item {req.storage_index.fqn!r}: the container has no tensor "
                                 f"of {info.length} bytes at {info.offset} of its layout")
            target = self.planner.resolve_tensor(req).detach()
            _check_size(req, target, req.lengths)
            if math.prod(req.lengths) == 0:
                self.planner.commit_tensor(req, target)
                continue
            chunks.setdefault(x.index, (x, sizes, dtype, []))[3].append((req, target))
        streams = {}  # (the load's current streams: the workers' threads have their own)
        for _x, _sizes, _dtype, uses in chunks.values():
            dev = uses[0][1].device
            if dev.type == "cuda" and dev not in streams:
                streams[dev] = torch.cuda.current_stream(dev)
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(chunks)))) as ex:
            for f in [ex.submit(self._decode, c, x, sizes, dtype, uses, streams)
                      for x, sizes, dtype, uses in chunks.values()]:
                f.result()
        for _x, _sizes, _dtype, uses in chunks.values():
            for req, target in uses:
                self.planner.commit_tensor(req, target)

    def _decode(self, c, x, sizes, dtype, uses, streams):
        req, target = uses[0]
        whole = len(uses) == 1 and tuple(req.lengths) == tuple(sizes) and \
            not any(req.storage_offsets) and target.dtype == dtype and \
            target.is_contiguous() and target.device.type in ("cpu", "cuda")
        cuda = target.device.type == "cuda"
        dev = target.device if cuda else torch.device("cpu")
        if not cuda:
            return self._decode_on(c, x, sizes, dtype, uses, whole, dev, None)
        with torch.cuda.stream(streams[target.device]):
            self._decode_on(c, x, sizes, dtype, uses, whole, dev, streams[target.device])

    def _decode_on(self, c, x, sizes, dtype, uses, whole, dev, stream):
        target = uses[0][1]
        into = target if whole else torch.empty(x.nbytes, dtype=torch.uint8, device=dev)
        c.decode_into({x.name: into.data_ptr()},
                      device=None if stream is None else (dev.index or 0),
                      stream=0 if stream is None else stream.cuda_stream, verify=self.r.verify)
        if not whole:
            src = into.view(dtype).view(sizes)
            for req, target in uses:
                box = src
                for d, (o, n) in enumerate(zip(req.storage_offsets, req.lengths)):
                    box = box.narrow(d, int(o), int(n))
                target.copy_(box)
