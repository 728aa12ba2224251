"""The compressed checkpoint container (``.fst``, docs/FORMAT.md): a safetensors-style JSON
header over tensors stored as codec streams (``ft_codec_*``: byte planes, Huffman-coded
where that pays, independent checksummed blocks). Not a safetensors file, and it does not
pretend to be one: its own magic, its own extension. Framework-free: the torch and numpy
layers allocate, this module reads, decodes and writes through the library.

    "FASTENSZ", u64 header offset H, u64 header length L (little-endian), zeros to 4096;
    the data section [4096, H): the tensors' streams; the header JSON at H (after the data,
    so that a save writes each stream as soon as it is encoded).

Header: ``__metadata__`` (str -> str), ``fastensor.container`` ({"version": 1, "codec":
"ftz1"}), and per tensor ``{"dtype", "shape", "data_offsets": [b, e]`` (where its bytes
would be in a safetensors data section: the uncompressed layout), ``"stored": [b, e]`` (its
stream in this file's data section), ``"compressed": bool}``.
"""
from __future__ import annotations

import collections
import json
import math
import re
import os
import stat
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import File, _C, _ckpt, _st, context
from ._safe import _BYTES, _PACKED_BITS, Opened

MAGIC = b"FASTENSZ"
SUFFIX = ".fst"
VERSION = 1
_DATA = 4096  # where the data section starts
_HEADER_MAX = 100_000_000
# float types whose byte planes carry structure; the rest (integers, packed types) is stored
_FLOATS = {"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ",
           "F8_E5M2FNUZ", "C64"}
# a stream kept compressed must save at least this share of the tensor's bytes
_MIN_SAVING = 0.05
# codec blocks of a save (the codec's default): large enough that a block's code table, and
# on the GPU its warp's building of it, is a small share of the block's work
_BLOCK = 1 << 20
# a save encodes up to this many tensors at once, up to this many tensors and bytes of
# them ahead of the write in flight (coded ones wait there while a write or sync runs)
_ENCODERS = 4
_QUEUED = 16
_AHEAD = 512 << 20
# a save places each stream at a page boundary of the file, written from page-aligned memory
_PAGE = 4096
# in pieces of at most this many bytes, this many at once, made durable every _SYNC_STEP
# bytes while it encodes the next ones
_PIECE = 16 << 20
_WRITES = 4
_SYNC_STEP = 64 << 20
# reads are grouped into about this many stored bytes, the next group read while one decodes
# (smaller for the GPU: its decode of a group is quick, the copy to it is what overlaps)
_GROUP = 256 << 20
_GROUP_GPU = 64 << 20
_gpu = {}  # device -> None (the GPU decodes) or why not


def gpu_decoder(device: int):
    """None where the library decodes on CUDA ``device``'s GPU, else why not (built without
    nvcc, no driver, a driver that cannot load kernels)."""
    if device not in _gpu:
        try:
            _C.codec_decode_cuda(context(), [], device, 0)
            _gpu[device] = None
        except OSError as e:
            _gpu[device] = str(e)
    return _gpu[device]


def is_container(path) -> bool:
    """Whether ``path`` is a regular file that starts with the container's magic (anything
    else, a FIFO included, is left to the safetensors reader and its messages)."""
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, TypeError, ValueError):
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.pread(fd, len(MAGIC), 0) == MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


def _page(n):
    return -(-n // _PAGE) * _PAGE


def _elem(dtype):
    return 1 if dtype in _PACKED_BITS else _BYTES[dtype]


class Entry:
    __slots__ = ("name", "dtype", "shape", "nbytes", "begin", "stored", "compressed")

    def __init__(self, name, dtype, shape, begin, end, stored, compressed):
        self.name, self.dtype, self.shape = name, dtype, tuple(shape)
        self.begin, self.nbytes = begin, end - begin
        self.stored, self.compressed = stored, compressed


class Container:
    """An open container: its tensors (``entries``, in file order), metadata, and reads that
    decode into memory at addresses the caller provides."""

    def __init__(self, path, *, engine="auto", cache="auto"):
        self.path = os.fspath(path)
        self.engine, self.cache = engine, cache
        with open(self.path, "rb") as f:
            head = f.read(24)
            if len(head) < 8 or head[:8] != MAGIC:
                raise ValueError(f"{self.path}: not a fastensor container (no FASTENSZ magic)")
            size = os.fstat(f.fileno()).st_size
            if len(head) < 24:
                raise ValueError(f"{self.path}: truncated ({size} bytes)")
            hoff, hlen = struct.unpack("<QQ", head[8:])
            if hlen > _HEADER_MAX:
                raise ValueError(f"{self.path}: header length {hlen} is over the limit")
            if hoff < _DATA or hoff + hlen != size:
                raise ValueError(f"{self.path}: the header should be at [{hoff}, "
                                 f"{hoff + hlen}) but the file has {size} bytes (truncated?)")
            f.seek(hoff)
            raw = f.read(hlen)
        try:
            header = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{self.path}: the header is not JSON ({e})") from None
        if not isinstance(header, dict):
            raise ValueError(f"{self.path}: the header is not a JSON object")
        info = header.pop("fastensor.container", None)
        if not isinstance(info, dict) or info.get("version") != VERSION:
            raise ValueError(f"{self.path}: container version {info and info.get('version')}"
                             f" (this fastensor reads {VERSION})")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in meta.items()):
            raise ValueError(f"{self.path}: __metadata__ must map str to str")
        self.metadata = meta
        self.data_start = _DATA
        self.data_size = hoff - _DATA
        entries = []
        for name, e in header.items():
            try:
                dtype, shape = e["dtype"], [int(s) for s in e["shape"]]
                b, end = (int(x) for x in e["data_offsets"])
                sb, se = (int(x) for x in e["stored"])
                compressed = bool(e.get("compressed", True))
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{self.path}: tensor {name!r}: a malformed entry") from None
            if dtype not in _BYTES and dtype not in _PACKED_BITS:
                raise ValueError(f"{self.path}: tensor {name!r}: unknown dtype {dtype}")
            count = math.prod(shape)
            want = count * _BYTES[dtype] if dtype in _BYTES else \
                (count * _PACKED_BITS[dtype] + 7) // 8
            if end - b != want or b < 0 or any(s < 0 for s in shape):
                raise ValueError(f"{self.path}: tensor {name!r}: offsets [{b}, {end}) do not "
                                 f"hold {dtype} {shape}")
            if not 0 <= sb <= se <= self.data_size:
                raise ValueError(f"{self.path}: tensor {name!r}: its stream [{sb}, {se}) is "
                                 f"outside the data section ({self.data_size} bytes: "
                                 "truncated?)")
            entries.append(Entry(name, dtype, shape, b, end, (sb, se), compressed))
        entries.sort(key=lambda x: x.stored[0])
        self.entries = entries
        self.by_name = {x.name: x for x in entries}

    def entry(self, name):
        try:
            return self.by_name[name]
        except KeyError:
            raise _st.SafetensorKeyError(f"File does not contain tensor {name}") from None

    def decode_into(self, targets, device=None, stream=0):
        """Decode tensors into memory: ``targets`` maps a name to the address of room for its
        bytes. Stored bytes are read in groups (the next group's read in flight while one
        decodes). On the host (``device`` None) each block's checksum is checked; with a CUDA
        ``device`` the addresses are its memory and the GPU decodes each group (ordered on
        ``stream``; structure checked, checksums not: :func:`gpu_decoder` says whether it
        can). Errors: ValueError naming the tensor."""
        todo = [x for x in self.entries if x.name in targets]
        limit = _GROUP if device is None else _GROUP_GPU
        groups, cur, size = [], [], 0
        for x in todo:
            n = x.stored[1] - x.stored[0]
            if cur and size + n > limit:
                groups.append(cur)
                cur, size = [], 0
            cur.append(x)
            size += n
        if cur:
            groups.append(cur)
        if not groups:
            return
        ctx = context()
        most = max(g[-1].stored[1] - g[0].stored[0] for g in groups)
        # two buffers, reused: one being read while the other's streams decode
        bufs = [np.empty(max(most, 1), dtype=np.uint8) for _ in range(min(2, len(groups)))]
        with File(self.path, "r", engine=self.engine, cache=self.cache) as f, \
                ThreadPoolExecutor(max_workers=1) as reader, \
                ThreadPoolExecutor(max_workers=_ENCODERS) as decoders:
            def read(k):
                group, buf = groups[k], bufs[k % len(bufs)]
                lo, hi = group[0].stored[0], group[-1].stored[1]
                got = f.read_into(buf[:hi - lo], self.data_start + lo) if hi > lo else 0
                if got != hi - lo:
                    raise ValueError(f"{self.path}: the file ends early ({got} of {hi - lo} "
                                     f"bytes at {self.data_start + lo}: truncated?)")
                return buf, lo
            pending = reader.submit(read, 0)
            for k, group in enumerate(groups):
                buf, lo = pending.result()
                if k + 1 < len(groups):
                    pending = reader.submit(read, k + 1)
                if device is not None:
                    base = buf.ctypes.data - lo
                    jobs = [(base + x.stored[0], x.stored[1] - x.stored[0], targets[x.name],
                             x.nbytes) for x in group]
                    try:
                        _C.codec_decode_cuda(ctx, jobs, device, stream)
                    except ValueError as e:  # "codec: stream <i>: ..." names the job
                        m = re.match(r"codec: stream (\d+): (.*)", str(e), re.S)
                        which = group[int(m.group(1))].name if m else None
                        raise ValueError(f"{self.path}: tensor {which!r}: "
                                         f"{m.group(2) if m else e}") from None
                    continue
                def decode(x, buf=buf, lo=lo):
                    stream_ = buf[x.stored[0] - lo:x.stored[1] - lo]
                    try:
                        _C.codec_decode(ctx, stream_, targets[x.name], x.nbytes)
                    except ValueError as e:
                        raise ValueError(f"{self.path}: tensor {x.name!r}: {e}") from None
                # several tensors at once: one of a few blocks does not keep every thread busy
                list(decoders.map(decode, group))

    def describe(self):
        """What fastensor.inspect says of a container."""
        stored = sum(x.stored[1] - x.stored[0] for x in self.entries)
        raw = sum(x.nbytes for x in self.entries)
        return {"tensors": {x.name: {"dtype": x.dtype, "shape": list(x.shape), "bytes": x.nbytes,
                                     "stored_bytes": x.stored[1] - x.stored[0],
                                     "compressed": x.compressed} for x in self.entries},
                "metadata": dict(self.metadata), "container": "fst", "bytes": raw,
                "stored_bytes": stored, "ratio": stored / raw if raw else 1.0,
                "checksums": True}

    def verify(self):
        """Decode every tensor (checksums checked); ValueError at the first bad block."""
        for x in self.entries:
            scratch = np.empty(max(x.nbytes, 1), dtype=np.uint8)
            self.decode_into({x.name: scratch.ctypes.data})


COMPRESSION = ("auto", "always", "none")
_rates = {}  # st_dev of a directory -> (encode, decode, write, read) GB/s, measured once


def _weights(elem, n):
    """``n`` bytes of normal(0, 0.02) weights (a layer's init) in the float type of ``elem``
    bytes: 2 bf16, 4 fp32, 8 fp64, 1 fp8 e5m2 (fp16's high byte). A million values repeated
    (the codec's blocks are coded apart: as compressible as that many fresh ones)."""
    g = np.random.default_rng(0)
    count = min(n // elem, 1 << 20)
    if elem == 8:
        w = (g.standard_normal(count) * 0.02).view(np.uint8)
    else:
        v = g.standard_normal(count, dtype=np.float32) * 0.02
        w = (v.view(np.uint8) if elem == 4 else
             (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8) if elem == 2 else
             (v.astype(np.float16).view(np.uint16) >> 8).astype(np.uint8))
    return np.resize(w, n)


def _encoded(sample, elem, buf):
    """(encode GB/s, coded size) of ``sample`` through the context's threads, after a first
    call on a quarter of it that warms them and the buffers."""
    ctx, n = context(), sample.size
    _C.codec_encode(ctx, sample.ctypes.data, n // 4 // elem * elem, elem, _BLOCK, 0,
                    buf.ctypes.data, buf.size)
    t0 = time.perf_counter()
    m = _C.codec_encode(ctx, sample.ctypes.data, n, elem, _BLOCK, 0, buf.ctypes.data, buf.size)
    return n / (time.perf_counter() - t0) / 1e9, m


_samples = {}  # element size -> (encode GB/s, coded share) of weights of that size


def _sample(elem):
    """(encode GB/s, coded share) of 32 MiB of weights of ``elem``-byte floats on this
    machine, measured once per process (bf16's by :func:`_measure` where that ran first)."""
    if elem not in _samples:
        n = 32 << 20
        sample = _weights(elem, n)
        buf = np.empty(_C.codec_bound(n, elem, _BLOCK), dtype=np.uint8)
        enc, m = _encoded(sample, elem, buf)
        _samples[elem] = (enc, m / n)
    return _samples[elem]


def _measure(directory):
    """(encode, decode, write, read) GB/s on this machine and the disk of ``directory``: the
    codec on 32 MiB of bf16 weights through the context's threads (after a first call that
    warms them and the buffers), then 64 MiB written with O_DIRECT as a save writes (pieces
    of _PIECE bytes, _WRITES at once) and fdatasync, and read back with O_DIRECT (the device,
    not the page cache). Measured once per filesystem per process (0.3-1 s on two cores)."""
    key = os.stat(directory).st_dev
    if key in _rates:
        return _rates[key]
    ctx, n = context(), 32 << 20
    sample = _weights(2, n)
    buf = np.empty(_C.codec_bound(n, 2, _BLOCK), dtype=np.uint8)
    out = np.empty(n, dtype=np.uint8)
    enc, m = _encoded(sample, 2, buf)
    _samples.setdefault(2, (enc, m / n))
    t1 = time.perf_counter()
    _C.codec_decode(ctx, buf[:m], out.ctypes.data, n)
    t2 = time.perf_counter()
    disk = np.ones(64 << 20, dtype=np.uint8)
    path = os.path.join(directory, f".fst-probe.fastensor-tmp-{os.getpid()}-0")
    try:
        with File(path, "w", engine="direct") as f, \
                ThreadPoolExecutor(max_workers=_WRITES) as writers:
            t3 = time.perf_counter()
            list(writers.map(lambda lo: f.write(disk[lo:lo + _PIECE], lo),
                             range(0, disk.size, _PIECE)))
            f.sync()
            t4 = time.perf_counter()
            back = np.empty_like(disk)
            f.read_into(back, 0, engine="direct")
            t5 = time.perf_counter()
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    gb = 1e9
    _rates[key] = (enc, n / (t2 - t1) / gb, disk.size / (t4 - t3) / gb,
                   disk.size / (t5 - t4) / gb)
    return _rates[key]


# A save codes a float type only where the write time coding saves, (1 - coded share) of the
# bytes at the disk's write rate, is at least this share of the time encoding them takes:
# encode rate x (1 - share) >= _SAVE_GAIN x write rate. Encodes overlap the writes of the
# streams before them, so the saving need not pay for the whole encode. The figure is the
# earlier bf16 rule's, encode >= 2.3 x write at bf16's share 0.67 (2.3 x 0.33), which the H200
# runs in docs/benchmarks/codec-h200.json set (encode / write 1.49 gave 0.64x the
# uncompressed save with one write at a time: 2.3 breaks even; the development machine, 2
# cores: 1.93 gives 0.6x). fp32 codes to about 0.83: it saves half of bf16's bytes for the
# same encode work, and coded fp32 saves ran 0.54x and 0.76x the uncompressed save on the H200
# machine (c1c0383, 8e81ea8) where bf16's ran 0.78x and 1.29x.
_SAVE_GAIN = 0.76


def coding_pays(directory, elem=2) -> bool:
    """Whether coding floats of ``elem`` bytes (2: bf16/fp16, 4: fp32) pays on this machine
    for files in ``directory``: the write time their coded share saves is worth the encode
    (``_SAVE_GAIN``: a save takes no longer), and the codec decodes at least as fast as the
    disk reads (a load then takes about the coded bytes' read time). Measured (:func:`_measure`
    for the disk and bf16, :func:`_sample` for the other sizes); a directory where O_DIRECT
    cannot be used: False."""
    try:
        enc, dec, write, read = _measure(directory)
    except OSError:
        return False
    share = _sample(elem)[1]
    if elem != 2:
        enc = _sample(elem)[0]
    return enc * (1 - share) >= _SAVE_GAIN * write and dec >= read


def _coded_elem(dtype):
    """The element size the codec groups a float type's bytes by (complex64: its floats)."""
    return 4 if dtype == "C64" else _elem(dtype)


def save(path, items, metadata, *, compression="auto", engine="auto", cache="auto"):
    """Write a container. ``items``: [(name, dtype_name, shape, address, nbytes)] of host
    memory the caller keeps alive. ``compression``: "always" codes each float tensor and
    keeps the coded stream where it saves at least 5% of its bytes (else the tensor is
    stored, as integers and packed types always are); "auto" does so where coding pays on
    this machine and disk (:func:`coding_pays`, measured), else stores; "none" stores every
    tensor. Atomic and durable: a temporary, fdatasync, rename, directory fsync."""
    if compression not in COMPRESSION:
        raise ValueError(f"compression must be one of {', '.join(map(repr, COMPRESSION))}, "
                         f"not {compression!r}")
    meta = {} if metadata is None else dict(metadata)
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError("metadata must map str to str")
    names = [it[0] for it in items]
    if len(set(names)) != len(names):
        raise ValueError("tensor names must be unique")
    for n in names:
        if n in ("__metadata__", "fastensor.container"):
            raise ValueError(f"{n!r} is reserved in a container's header")
    path = os.fspath(path)
    ctx = context()
    where = os.path.dirname(os.path.abspath(path)) or "."
    code = {e: compression == "always" or (compression == "auto" and coding_pays(where, e))
            for e in {_coded_elem(it[1]) for it in items if it[1] in _FLOATS}}

    spare, spare_lock = [], threading.Lock()  # stream buffers whose write is done

    def buffer(n):
        """A page-aligned buffer of at least n bytes, a whole number of pages: a spare one
        (its pages already faulted in) or new."""
        n = _page(n)
        with spare_lock:
            fits = [i for i, b in enumerate(spare) if b.size >= n]
            if fits:
                return spare.pop(min(fits, key=lambda i: spare[i].size))
        raw = np.empty(n + _PAGE, dtype=np.uint8)
        skip = -raw.ctypes.data % _PAGE
        return raw[skip:skip + n]

    def encode(item):
        name, dtype, shape, addr, nbytes = item
        compress = dtype in _FLOATS and code[_coded_elem(dtype)]
        e = _coded_elem(dtype) if compress or dtype == "C64" else 1
        flags = 0 if compress else _C.CODEC_STORE
        buf = buffer(max(1, _C.codec_bound(nbytes, e, _BLOCK)))
        n = _C.codec_encode(ctx, addr, nbytes, e, _BLOCK, flags, buf.ctypes.data, buf.size)
        if compress and n > (1 - _MIN_SAVING) * nbytes + 64:
            n = _C.codec_encode(ctx, addr, nbytes, 1, _BLOCK, _C.CODEC_STORE, buf.ctypes.data,
                                buf.size)
            compress = False
        return buf, n, compress and n < nbytes

    header, at, virt = {}, 0, 0
    # streams are written in order of the file, in pieces, several at once, while the next
    # tensors are encoded, several at once (a tensor of a few blocks does not keep every
    # thread busy alone; one write at a time does not keep a disk busy)
    with _ckpt.installing(path) as tmp, File(tmp, "x", engine=engine, cache=cache) as f, \
            ThreadPoolExecutor(max_workers=_WRITES) as writers, \
            ThreadPoolExecutor(max_workers=1) as syncer, \
            ThreadPoolExecutor(max_workers=_ENCODERS) as coders:
        ahead, queued, todo = collections.deque(), 0, iter(items)

        def fill():
            nonlocal queued
            while len(ahead) < _QUEUED and (not ahead or queued < _AHEAD):
                item = next(todo, None)
                if item is None:
                    return
                ahead.append((item, coders.submit(encode, item)))
                queued += item[4]
        fill()
        # pieces being written, in file order: (future, the buffer, once its last piece)
        writing = collections.deque()
        sync_lock = threading.Lock()
        syncing, unsynced = None, 0  # the step's fdatasync; bytes written since it began

        def put(data, offset):
            nonlocal syncing, unsynced
            f.write(data, offset, sync="later")
            with sync_lock:  # made durable in steps, beside the writes that follow
                unsynced += data.size
                if unsynced >= _SYNC_STEP and (syncing is None or syncing.done()):
                    if syncing is not None:
                        syncing.result()  # a step's error is the save's, not dropped
                    unsynced, syncing = 0, syncer.submit(f.sync)

        def retire():
            done, buf = writing.popleft()
            done.result()
            if buf is not None:
                with spare_lock:
                    spare.append(buf)
        while ahead:
            (name, dtype, shape, addr, nbytes), coded = ahead.popleft()
            buf, size, compressed = coded.result()
            queued -= nbytes
            header[name] = {"dtype": dtype, "shape": list(shape),
                            "data_offsets": [virt, virt + nbytes],
                            "stored": [at, at + size], "compressed": compressed}
            while writing and writing[0][0].done():
                retire()
            fill()
            # whole pages from a page boundary (the gap up to the next stream is zeros), the
            # engine free to write them straight to the device (O_DIRECT)
            room = _page(size)
            buf[size:room] = 0
            for lo in range(0, room, _PIECE):
                hi = min(room, lo + _PIECE)
                while len(writing) >= _WRITES:
                    retire()
                writing.append((writers.submit(put, buf[lo:hi], _DATA + at + lo),
                                buf if hi == room else None))
            virt += nbytes
            at += room
        while writing:
            retire()
        if syncing is not None:
            syncing.result()
        body = {"__metadata__": meta, "fastensor.container": {"version": VERSION,
                                                              "codec": "ftz1"}}
        body.update(header)
        raw = json.dumps(body, separators=(",", ":")).encode()
        hoff = _DATA + at
        head = np.frombuffer(MAGIC + struct.pack("<QQ", hoff, len(raw)) + bytes(_DATA - 24),
                             dtype=np.uint8)
        f.write(head, 0)
        f.write(np.frombuffer(raw, dtype=np.uint8), hoff)
        f.sync()
    _ckpt.fsync_dir(path)


def convert(src, dst, *, compression="auto", engine="auto"):
    """``src`` (a safetensors file, index or directory, or a container) to ``dst``: a
    container where ``dst`` ends in ``.fst``, else a safetensors file. Byte-exact; metadata
    kept. Holds the tensors in host memory."""
    src, dst = os.fspath(src), os.fspath(dst)
    if is_container(src):
        c = Container(src, engine=engine)
        total = sum(x.nbytes for x in c.entries)
        buf = np.empty(max(total, 1), dtype=np.uint8)
        base, items, at = buf.ctypes.data, [], 0
        targets = {}
        for x in c.entries:
            targets[x.name] = base + at
            items.append((x.name, x.dtype, x.shape, base + at, x.nbytes))
            at += x.nbytes
        c.decode_into(targets)
        meta = c.metadata
    else:
        from . import _ckpt
        ck, tensors, meta, shards = _ckpt.open_checkpoint(src)
        bufs = []
        for k, info in enumerate(shards):
            b = np.empty(max(info[1], 1), dtype=np.uint8)
            _ckpt.load_shard(ck, k, b.ctypes.data, info[1], engine=engine)
            bufs.append(b)
        items = [(name, dtype, tuple(shape), bufs[shard].ctypes.data + off, nbytes)
                 for name, dtype, shape, nbytes, shard, off in tensors]
        buf = bufs
        meta = dict(meta or {})
    if dst.endswith(SUFFIX):
        save(dst, items, meta, compression=compression, engine=engine)
    else:
        from . import _ckpt
        _ckpt.save(dst, items, meta, engine=engine)
    del buf


class FstOpen(Opened):
    """``safe_open`` on a container: ``keys()``, ``metadata()``, ``get_tensor(name)`` (reads
    and decodes that tensor's stream only), ``get_slice(name)[...]`` (decodes the tensor, then
    slices it: a coded stream is read whole). ``adapter`` makes the framework's arrays."""

    def __init__(self, filename, adapter, device, *, engine="auto", verify=False,
                 cache="auto"):
        self._adapter = adapter
        self._device = adapter.device(device)
        self._verify = verify
        self._c = Container(filename, engine=engine, cache=cache)
        self._filename = self._c.path
        self._open_ = True
        self._torch_indexing = adapter.torch_indexing

    def close(self):
        self._open_ = False

    def _open(self):
        if not self._open_:
            raise _st.SafetensorValueError(f"{self._filename}: the checkpoint is closed")
        return self._c

    def keys(self) -> list:
        return sorted(self._open().by_name)

    def offset_keys(self) -> list:
        return [x.name for x in self._open().entries]

    def metadata(self):
        m = self._open().metadata
        return dict(m) if m else None

    @property
    def checksums(self) -> bool:
        return True

    def _entry(self, name):
        x = self._open().entry(name)
        return (0, x.dtype, x.shape, x.nbytes, 0, 0)

    def _on_gpu(self):
        """Whether tensors decode on the GPU, straight into device memory (a CUDA device,
        the decoder there, no verify: block checksums are checked on the host)."""
        d = self._device
        return not self._adapter.is_host(d) and getattr(d, "type", None) == "cuda" and \
            not self._verify and gpu_decoder(d.index) is None

    def _decoded(self, name):
        x = self._open().entry(name)
        gpu = self._on_gpu()
        buf, address, index, stream = self._adapter.empty("U8", (x.nbytes,), x.nbytes,
                                                          self._device if gpu else None)
        self._c.decode_into({name: address}, device=index if gpu else None, stream=stream)
        return self._adapter.view(buf, x.dtype, x.shape, x.nbytes, 0) if x.nbytes else \
            self._adapter.finish(buf, x.dtype, x.shape)

    def get_tensor(self, name):
        t = self._decoded(name)
        return self._adapter.select(t, (), self._device) if not \
            self._adapter.is_host(self._device) and not self._on_gpu() else t

    def get_tensors(self, names=None, threads: int = 8) -> dict:
        names = self.offset_keys() if names is None else list(names)
        return {n: self.get_tensor(n) for n in names}

    def read_box(self, name, box):
        x = self._open().entry(name)
        if x.dtype in _PACKED_BITS and any(b != (0, n) for b, n in zip(box, x.shape)):
            raise ValueError(f"{name!r}: {x.dtype} elements are packed below a byte; "
                             "slice it after get_tensor")
        t = self._decoded(name)
        if x.dtype in _PACKED_BITS:
            return t
        return t[tuple(slice(lo, hi) for lo, hi in box)]
