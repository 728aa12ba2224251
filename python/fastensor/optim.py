"""Optimizer-state and gradient offload: the states of a torch optimizer (Adam's moments,
SGD's momentum, fp32 master weights) live off the GPU between steps, in the same tiered
store as offloaded activations (pinned host memory, then a spill file on local storage), and
stream through the GPU during ``step()`` in chunks.

    opt = fastensor.torch.OffloadedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-4),
                                             offload_grads=True)
    for batch in loader:
        loss = model(batch).loss
        loss.backward()          # each gradient leaves the GPU once accumulated
        opt.step()               # states and gradients come back chunk by chunk
        opt.zero_grad()

``step()`` takes the parameters in chunks of about ``chunk_bytes``: while the wrapped
optimizer updates chunk i on the GPU, the states (and gradients) of chunk i+1 are read into
GPU memory on a stream of their own and those of chunk i+2 into pinned host memory; the new
states of chunk i are copied back behind the update (the GPU memory is reused as soon as the
copy has run, nothing waits for the disk). The update is the wrapped optimizer's own ``step``
on the chunk's parameters, on the GPU, so the results are bitwise those of the optimizer
without the wrapper (every torch optimizer whose update is per parameter: Adam, AdamW, SGD,
RMSprop, Adagrad...; not LBFGS). The chunks run in the opposite order each step: the store
keeps the entries put last in its host tier, so the chunks a step ends with are the ones the
next step starts with.

``offload_grads``: a hook on each parameter puts its gradient into the store as soon as
backward has accumulated it (after reducing it over ``process_group``, averaged, where one is
given; do not combine with DistributedDataParallel, which reduces ``.grad`` itself), and
sets ``.grad`` to None; a later backward before ``step()`` (gradient accumulation) adds to
the stored one. ``step()`` consumes them (``.grad`` is None afterwards). Clip with
:meth:`OffloadedOptimizer.clip_grad_norm_` (torch's results, bitwise); other code that reads
``.grad`` between backward and step needs ``offload_grads=False``.

``gpu_budget_bytes``: states that fit stay on the GPU between steps, and offloaded gradients
in the room the states leave (fewer bytes to move; "auto" sizes it from the peak memory
measured); the rest is stored.

``master_weights``: bf16 and fp16 parameters are updated through fp32 master copies kept in
the store with the states (mixed-precision training: the wrapped optimizer sees fp32
parameters, gradients and states; each parameter gets its master rounded to its dtype).

An exception inside ``step()`` (out-of-memory included) leaves every parameter and its states
either updated (the chunks before the failure) or as they were (the failing chunk is put
back from a copy); calling ``step()`` again finishes that step for the parameters it did not
reach, so the result is the uninterrupted step's; ``zero_grad()`` instead abandons the rest.
After an out-of-memory error the chunks are half as large.

``state_dict()`` has the wrapped optimizer's format, with the states in host memory (and each
master copy as the state ``"master"``); ``load_state_dict()`` takes that or a plain
optimizer's, and puts the states into the store without taking GPU memory.
"""
from __future__ import annotations

import functools
import time
import weakref

import torch

from . import _C
from ._optim_io import _StoreIO
from ._optim_state import _drop_all, _Fetched, _Kept, _norm, _norms, _Record, _StateView
from .offload import shared_store

_MiB = 1 << 20
_LOW = (torch.float16, torch.bfloat16)


def _grad_hook(ref, p) -> None:
    opt = ref()
    if opt is not None:
        opt._grad_hook(p)


class OffloadedOptimizer(_StoreIO, torch.optim.Optimizer):
    """Wraps ``optimizer`` (see the module's text); its ``param_groups`` are the wrapped
    optimizer's (learning-rate schedulers work on either).

    ``directory``, ``host_cache_bytes`` ("auto": a quarter of the memory available; 0: the
    states go to the file), ``engine``, ``capacity``, ``page_cache_bytes``: the store's, as
    for :class:`fastensor.torch.offload_activations`; with the same settings both share one
    store. ``chunk_bytes``: parameter bytes updated at once; ``min_bytes``: smaller state
    tensors stay where the optimizer made them. ``gpu_budget_bytes``: bytes of states kept on
    the GPU between steps, and of offloaded gradients in what they leave (the rest is
    stored); "auto": what the highest allocator peak seen
    at a step's start leaves under :func:`gpu_memory_limit`, less 1/16 of it (nothing in the
    first step, nothing after an out-of-memory error in ``step()``); 0: none.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, directory=None, *,
                 offload_grads: bool = False, master_weights: bool = False,
                 chunk_bytes: int = 128 * _MiB, min_bytes: int = 256 << 10,
                 host_cache_bytes: int | str = "auto", engine: str = "auto",
                 capacity: int = 0, page_cache_bytes: int = 0, process_group=None,
                 gpu_budget_bytes: int | str = 0):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, not "
                            f"{type(optimizer).__name__}")
        if isinstance(optimizer, (OffloadedOptimizer, torch.optim.LBFGS)):
            raise TypeError(f"{type(optimizer).__name__} cannot be offloaded (its update is "
                            "not one per parameter)")
        for name, v in (("chunk_bytes", chunk_bytes), ("min_bytes", min_bytes)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, not {v!r}")
        if gpu_budget_bytes != "auto" and (not isinstance(gpu_budget_bytes, int)
                                           or gpu_budget_bytes < 0):
            raise ValueError("gpu_budget_bytes must be a non-negative int or 'auto', not "
                             f"{gpu_budget_bytes!r}")
        self._inner = None  # add_param_group below is the base class's while this is None
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self._inner = optimizer
        self.param_groups = optimizer.param_groups
        self.offload_grads, self.master_weights = offload_grads, master_weights
        self.chunk_bytes, self.min_bytes = chunk_bytes, min_bytes
        self._group = process_group
        self.gpu_budget_bytes = gpu_budget_bytes
        self._keep_room = 0    # bytes of states this step may still keep on the GPU
        self._grad_room = 0    # bytes of gradients the next backward may keep there
        self._peak_seen = {}   # device -> the highest allocator peak read at a step's start
        self._shared = shared_store(directory, host_cache_bytes=host_cache_bytes,
                                    engine=engine, capacity=capacity,
                                    page_cache_bytes=page_cache_bytes)
        self._h = self._shared.h
        self._piece = max(_MiB, min(64 * _MiB, self._shared.ring_limit // 4))
        self._records = {}     # parameter -> _Record
        self._pending = []     # (keys, host tensor) of puts still reading their source
        self.state = _StateView(self._records, self._host_states)
        # the entries go with the optimizer (its hooks hold it only weakly)
        self._finalizer = weakref.finalize(self, _drop_all, self._h, self._records,
                                           self._pending)
        self._done = set()     # parameters a failed step() already updated
        self._steps = 0
        self._fetch_streams = {}
        self._hooks = []
        self._streams = []     # the ParameterStreams of this optimizer's parameters
        self._counts = {"steps": 0, "chunks": 0, "bytes_fetched": 0, "bytes_stored": 0,
                        "grads_offloaded": 0, "step_seconds": 0.0, "failed_steps": 0}
        if optimizer.state:  # wrapped mid-training: what it has goes to the store now
            group_of = {p: g for g in self.param_groups for p in g["params"]}
            for p, st in list(optimizer.state.items()):
                self._install(p, group_of.get(p, {}), st)
            optimizer.state.clear()
        if offload_grads:
            for group in self.param_groups:
                self._hook(group["params"])

    def _record(self, p) -> _Record:
        r = self._records.get(p)
        if r is None:
            r = self._records[p] = _Record()
        return r

    def _big(self, v, device) -> bool:
        return (isinstance(v, torch.Tensor) and v.dim() > 0 and v.device == device
                and v.layout is torch.strided and v.numel() * v.element_size() >= self.min_bytes)

    # -- gradients ---------------------------------------------------------------------

    def _hook(self, params) -> None:
        for p in params:
            if p.requires_grad:
                self._hooks.append(p.register_post_accumulate_grad_hook(
                    functools.partial(_grad_hook, weakref.ref(self))))

    def _grad_hook(self, p) -> None:
        g = p.grad
        if g is None or g.is_sparse:
            return
        if self._group is not None:  # every gradient, the ones kept on the GPU too
            import torch.distributed as dist
            dist.all_reduce(g, group=self._group)
            g.div_(dist.get_world_size(self._group))
        if g.numel() * g.element_size() < self.min_bytes:
            return
        rec = self._record(p)
        if rec.grad is not None:  # accumulating over several backward passes
            old = self._get_now(rec.grad, g.device)
            if isinstance(rec.grad, _Kept):
                self._grad_room += rec.grad.nbytes()
            self._drop(rec.grad)
            rec.grad = None
            g = old.add_(g)
        rec.grad_norm = _norm(g, 2.0)  # for clip_grad_norm_, without reading it back
        rec.grad_scale = None
        n = g.numel() * g.element_size()
        if n <= self._grad_room and g.is_contiguous():  # room left by the states kept
            self._grad_room -= n
            rec.grad = _Kept(g)
        else:
            rec.grad = self._put(g)
        p.grad = None
        self._counts["grads_offloaded"] += 1

    # -- step --------------------------------------------------------------------------

    def _chunks(self):
        """(group, parameters) of this step in chunks of about chunk_bytes, each of one
        device; parameters without a gradient, or updated by a failed step, are left out."""
        chunks = []
        for group in self.param_groups:
            cur, size = [], 0
            for p in group["params"]:
                rec = self._records.get(p)
                if p in self._done or (p.grad is None and (rec is None or rec.grad is None)):
                    continue
                if cur and (size >= self.chunk_bytes or p.device != cur[0].device):
                    chunks.append((group, cur))
                    cur, size = [], 0
                cur.append(p)
                size += p.numel() * p.element_size()
            if cur:
                chunks.append((group, cur))
        if self._steps % 2:
            chunks.reverse()
        return chunks

    def _fetch(self, params) -> dict:
        """Start reading the chunk's states, gradients and masters into memory on its
        device (CUDA: on the fetch stream, after the work queued so far)."""
        device = params[0].device
        stream = 0
        if device.type == "cuda":
            fs = self._fetch_streams.get(device)
            if fs is None:
                fs = self._fetch_streams[device] = torch.cuda.Stream(device)
            # the new tensors may reuse memory the current stream's queued work still uses
            fs.wait_stream(torch.cuda.current_stream(device))
            stream = fs.cuda_stream
        fetched = {}
        for p in params:
            f = fetched[p] = _Fetched()
            rec = self._records.get(p)
            if rec is None:
                continue
            for name, s in rec.states.items():
                f.states[name] = self._get(s, device, stream, f.keys)
            if rec.grad is not None:
                f.grad = self._get(rec.grad, device, stream, f.keys)
            if rec.master is not None:
                f.master = self._get(rec.master, device, stream, f.keys)
            if rec.param is not None:
                f.param = self._get(rec.param, device, stream, f.keys)
        return fetched

    def _ready(self, params, fetched) -> None:
        """Wait for the chunk's reads; the current stream waits for its copies."""
        for f in fetched.values():
            self._wait(f.keys)
        device = params[0].device
        if device.type == "cuda":
            torch.cuda.current_stream(device).wait_stream(self._fetch_streams[device])

    def _prefetch(self, params, only_params: bool = False) -> None:
        """Bring the chunk's entries that are in the file into pinned host memory (with
        ``only_params``, the streamed parameters' only)."""
        for p in params:
            rec = self._records.get(p)
            if rec is None:
                continue
            held = [rec.param] if only_params else list(rec.states.values()) + [
                rec.grad, rec.master, rec.param]
            for s in held:
                for key, _off, _n in (s.keys if s is not None else ()):
                    try:
                        if _C.store_prefetch(self._h, key) < 0:
                            return  # no ring space now
                    except (OSError, ValueError, MemoryError):
                        return

    def _update(self, group, params, fetched) -> None:
        """The wrapped optimizer's step on one chunk, then its new states stored; on an
        exception the chunk's parameters and states are as they were."""
        opt, state = self._inner, self._inner.state
        targets, saved, stored = [], [], []
        try:
            for p in params:
                f, rec = fetched[p], self._record(p)
                if f.grad is not None and rec.grad_scale is not None:
                    f.grad.mul_(rec.grad_scale)  # clip_grad_norm_'s, as torch's would have
                grad = f.grad if f.grad is not None else p.grad
                small = {k: v.clone() if isinstance(v, torch.Tensor) else v
                         for k, v in rec.small.items()}
                master = self.master_weights and p.dtype in _LOW
                backup = None  # p changes only once the chunk is stored
                if master:
                    t = (f.master if f.master is not None else
                         f.param.float() if f.param is not None else p.detach().float())
                    t.grad = grad.float() if grad is not None else None
                elif f.param is not None:  # streamed: updated as read, stored again
                    t = f.param
                    t.grad = grad
                else:
                    t = p
                    backup = p.detach().clone()
                    if f.grad is not None:
                        p.grad = f.grad
                saved.append((p, t, backup, small, master))
                st = dict(rec.small)
                st.update(f.states)
                state[t] = st
                targets.append(t)
            groups = opt.param_groups
            opt.param_groups = [dict(group, params=targets)]
            try:
                opt.step()
            finally:
                opt.param_groups = groups
            for p, t, _backup, _small, master in saved:
                new = _Record()
                stored.append(new)
                for name, v in state[t].items():
                    if self._big(v, t.device):
                        new.states[name] = self._keep_or_put(v)
                    else:
                        new.small[name] = v
                if master:
                    new.master = self._keep_or_put(t.detach())
                if self._records[p].param is not None:
                    new.param = self._put(t.detach().to(p.dtype))
        except BaseException:
            for p, t, backup, small, _master in saved:
                state.pop(t, None)
                rec = self._records[p]
                for k, v in small.items():
                    if isinstance(v, torch.Tensor) and isinstance(rec.small.get(k), torch.Tensor):
                        rec.small[k].copy_(v)
                    else:
                        rec.small[k] = v
                if backup is not None:
                    p.detach().copy_(backup)
                if rec.grad is not None:
                    p.grad = None
            for new in stored:
                for s in list(new.states.values()) + [new.master, new.param]:
                    if isinstance(s, _Kept):
                        self._keep_room += s.nbytes()
                    self._drop(s)
            raise
        for (p, t, _backup, _small, master), new in zip(saved, stored):
            state.pop(t, None)
            rec = self._records[p]
            if master and rec.param is None:
                p.detach().copy_(t)
            for s in list(rec.states.values()) + [rec.master, rec.grad, rec.param]:
                self._drop(s)
            if rec.grad is not None:
                p.grad = None
            new.grad = None
            self._records[p] = new
            self._done.add(p)

    @torch.no_grad()
    def _run(self, chunks) -> None:
        fetched = self._fetch(chunks[0][1])
        for i, (group, params) in enumerate(chunks):
            try:
                self._ready(params, fetched)
                following = None
                if i + 1 < len(chunks):
                    following = self._fetch(chunks[i + 1][1])
                    if i + 2 < len(chunks):
                        self._prefetch(chunks[i + 2][1])
                self._update(group, params, fetched)
                self._counts["chunks"] += 1
            except BaseException:
                for f in list(fetched.values()) + list((following or {}).values()):
                    self._wait_quietly(f.keys)  # their reads end before the memory goes
                raise
            fetched = following
            self._reap()

    def step(self, closure=None):
        """Update every parameter with a gradient (see the module's text); returns what
        ``closure`` returned."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        t0 = time.perf_counter()
        for stream in self._streams:  # what a pass left in memory would be stale after this
            stream._release_all()
        chunks = self._chunks()
        try:
            if chunks:
                params = {p for _g, ps in chunks for p in ps}
                total = self._gpu_room(chunks[0][1][0].device)
                # the states of this step's parameters are replaced; the gradients kept stay
                # until their chunk is done
                self._keep_room = max(0, total - self._kept_bytes(exclude=params)
                                      - self._kept_bytes(grads=True))
                self._run(chunks)
                self._grad_room = max(0, total - self._kept_bytes())
        except torch.OutOfMemoryError:
            self.chunk_bytes = max(1, self.chunk_bytes // 2)
            self._counts["failed_steps"] += 1
            self._spill_kept()
            self._grad_room = 0
            if self.gpu_budget_bytes == "auto":
                self.gpu_budget_bytes = 0  # out of memory once: nothing kept from now on
            raise
        except BaseException:
            self._counts["failed_steps"] += 1
            raise
        self._done.clear()
        self._steps += 1
        self._counts["steps"] += 1
        self._counts["step_seconds"] += time.perf_counter() - t0
        return loss

    def _keep_or_put(self, v: torch.Tensor):
        """A new state: kept on the GPU while this step's room lasts, else stored."""
        n = v.numel() * v.element_size()
        if n <= self._keep_room and v.is_contiguous():
            self._keep_room -= n
            return _Kept(v)
        return self._put(v)

    def _gpu_room(self, device) -> int:
        """Bytes of states and gradients kept on ``device``: gpu_budget_bytes, or ("auto")
        what the highest allocator peak seen at a step's start (what was kept then included)
        leaves under the memory limit, less 1/16 of it, plus what is kept now."""
        if not self.gpu_budget_bytes:
            return 0
        if self.gpu_budget_bytes != "auto":
            return self.gpu_budget_bytes  # (host parameters: their states stay in memory)
        if device.type != "cuda":
            return 0
        from ._gpumem import gpu_memory_limit
        peak = max(self._peak_seen.get(device, 0), torch.cuda.max_memory_allocated(device))
        self._peak_seen[device] = peak
        if self._steps == 0:
            return 0  # the first step measures
        limit = gpu_memory_limit(device)
        return max(0, limit - peak - limit // 16 + self._kept_bytes()
                   + self._kept_bytes(grads=True))

    def _kept_bytes(self, exclude=(), grads=False) -> int:
        """Bytes of states (or gradients) kept on the GPU, of parameters not in
        ``exclude``."""
        return sum(s.nbytes() for p, rec in self._records.items() if p not in exclude
                   for s in ([rec.grad] if grads else list(rec.states.values()) + [rec.master])
                   if isinstance(s, _Kept) and s.tensor is not None)

    def _spill_kept(self) -> None:
        """Every state kept on the GPU into the store (out of memory)."""
        for rec in self._records.values():
            for name, s in list(rec.states.items()):
                if isinstance(s, _Kept) and s.tensor is not None:
                    rec.states[name] = self._put(s.tensor)
            if isinstance(rec.master, _Kept) and rec.master.tensor is not None:
                rec.master = self._put(rec.master.tensor)
            if isinstance(rec.grad, _Kept) and rec.grad.tensor is not None:
                rec.grad = self._put(rec.grad.tensor)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimizer's, and the stored gradients dropped; a step that failed is
        not finished."""
        self._inner.zero_grad(set_to_none=set_to_none)
        for stream in self._streams:  # what a failed pass left in memory
            stream._release_all()
        for rec in self._records.values():
            if isinstance(rec.grad, _Kept) and rec.grad.tensor is not None:
                self._grad_room += rec.grad.nbytes()
            self._drop(rec.grad)
            rec.grad = rec.grad_norm = rec.grad_scale = None
        self._done.clear()

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over this optimizer's parameters (in the order
        of its groups), offloaded gradients included, with the same results bitwise: the
        2-norm of an offloaded gradient was taken as it left the GPU (another ``norm_type``
        reads them back), and its scale is applied as step() reads it. Returns the total
        norm."""
        norm_type = float(norm_type)
        for p, rec in self._records.items():  # clipped before: scaled now, stored again
            if rec.grad is not None and rec.grad_scale is not None:
                g = self._get_now(rec.grad, p.device).mul_(rec.grad_scale)
                self._drop(rec.grad)
                rec.grad, rec.grad_norm, rec.grad_scale = self._put(g), _norm(g, 2.0), None
        grads = []  # (device, dtype, gradient in .grad or None, record)
        for group in self.param_groups:
            for p in group["params"]:
                rec = self._records.get(p)
                if p.grad is not None:
                    grads.append((p.grad.device, p.grad.dtype, p.grad, None))
                elif rec is not None and rec.grad is not None:
                    grads.append((p.device, rec.grad.dtype, None, rec))
        if not grads:
            return torch.tensor(0.0)
        buckets = {}  # as torch groups them: by device and dtype, in order of appearance
        for item in grads:
            buckets.setdefault(item[:2], []).append(item)
        norms = []
        for (device, _dtype), items in buckets.items():
            kept = iter(_norms([g for _d, _t, g, _r in items if g is not None], norm_type))
            for _d, _t, g, rec in items:
                if g is not None:
                    norms.append(next(kept))
                elif norm_type == 2.0 and rec.grad_norm is not None:
                    norms.append(rec.grad_norm)
                else:
                    norms.append(_norm(self._get_now(rec.grad, device), norm_type))
        first = grads[0][0]
        total = torch.linalg.vector_norm(torch.stack([n.to(first) for n in norms]), norm_type)
        if error_if_nonfinite and torch.logical_or(total.isnan(), total.isinf()):
            raise RuntimeError(f"The total norm of order {norm_type} for gradients from "
                               "`parameters` is non-finite, so it cannot be clipped. To disable "
                               "this error and scale the gradients by the non-finite norm "
                               "anyway, set `error_if_nonfinite=False`")
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for (device, _dtype), items in buckets.items():
            scale = coef.to(device)
            kept = [g for _d, _t, g, _r in items if g is not None]
            if kept:
                torch._foreach_mul_(kept, scale)
            for _d, _t, g, rec in items:
                if g is None:
                    rec.grad_scale = scale
        return total

    def add_param_group(self, param_group: dict) -> None:
        if self._inner is None:  # the base class's __init__
            return super().add_param_group(param_group)
        self._inner.add_param_group(param_group)
        if self.offload_grads:
            self._hook(self.param_groups[-1]["params"])

    # -- state -------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The wrapped optimizer's state dict, states in host memory."""
        state, filled = self._inner.state, []
        try:
            for p in self.state:
                state[p] = self.state[p]
                filled.append(p)
            return self._inner.state_dict()
        finally:
            for p in filled:
                state.pop(p, None)

    def load_state_dict(self, state_dict: dict) -> None:
        """Take the states of ``state_dict`` (this class's, or the wrapped optimizer's)."""
        saved = state_dict.get("state", {})
        self._inner.load_state_dict({**state_dict, "state": {}})
        self.param_groups = self._inner.param_groups
        for p, rec in list(self._records.items()):
            for s in list(rec.states.values()) + [rec.grad, rec.master]:
                self._drop(s)
            if rec.param is None:
                del self._records[p]
            else:  # a streamed parameter: its value stays
                self._records[p] = _Record()
                self._records[p].param = rec.param
        self._done = set()
        for saved_group, group in zip(state_dict["param_groups"], self.param_groups):
            for pid, p in zip(saved_group["params"], group["params"]):
                if pid in saved:
                    self._install(p, group, saved[pid])
        self._reap()

    def _host_states(self, rec: _Record) -> dict:
        d = dict(rec.small)
        for name, s in rec.states.items():
            d[name] = self._get_now(s, torch.device("cpu"))
        if rec.master is not None:
            d["master"] = self._get_now(rec.master, torch.device("cpu"))
        return d

    def _install(self, p, group, values: dict) -> None:
        """Store one parameter's saved states, cast as torch casts them."""
        rec = self._record(p)
        low = self.master_weights and p.dtype in _LOW
        for k, v in values.items():
            if k == "master" and isinstance(v, torch.Tensor):
                rec.master = self._put(v.detach().to(torch.float32).contiguous())
            elif k == "step" and isinstance(v, torch.Tensor):
                on_device = group.get("capturable") or group.get("fused")
                rec.small[k] = v.to(torch.float32, p.device) if on_device else v.clone()
            elif isinstance(v, torch.Tensor):
                if p.is_floating_point():
                    v = v.to(torch.float32 if low else p.dtype)
                if self._big(v, v.device):  # stored from where it is, host or GPU
                    rec.states[k] = self._put(v.detach().contiguous())
                else:
                    rec.small[k] = v.to(p.device)
            else:
                rec.small[k] = v

    # -- the rest ----------------------------------------------------------------------

    def flush(self) -> None:
        """Wait until every state and gradient stored so far has landed."""
        self._shared.store.flush()
        self._reap()

    def stats(self) -> dict:
        """steps, chunks, bytes_fetched, bytes_stored, grads_offloaded, step_seconds (in
        step(), summed), failed_steps; state_bytes: the states, gradients and masters the
        store holds for this optimizer now; param_bytes: the streamed parameters' values it
        holds; chunk_bytes (halved after each out-of-memory error); and the store's
        host_bytes / file_bytes."""
        c = dict(self._counts)
        held = 0
        for rec in self._records.values():
            for s in list(rec.states.values()) + [rec.grad, rec.master]:
                held += s.nbytes() if s is not None else 0
        st = self._shared.store.stats()
        c.update(state_bytes=held, param_bytes=sum(
                     r.param.nbytes() for r in self._records.values() if r.param is not None),
                 gpu_state_bytes=self._kept_bytes(),
                 gpu_grad_bytes=self._kept_bytes(grads=True),
                 chunk_bytes=self.chunk_bytes,
                 host_bytes=st["host_resident"], file_bytes=st["file_used"])
        return c

    def close(self) -> None:
        """Remove the gradient hooks and drop everything stored (the states are lost; the
        parameters streamed by :func:`fastensor.torch.stream_parameters` come back to
        their devices first, and their streaming ends)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for stream in list(self._streams):
            stream.close()
        _drop_all(self._h, self._records, self._pending)
