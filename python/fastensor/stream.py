"""Parameters streamed block by block, for models whose weights do not fit the GPU beside
their activations: each block's parameters live in the store of an
:class:`~fastensor.torch.OffloadedOptimizer` (pinned host memory, then the spill file) and
come to the GPU only while the block runs.

    opt = fastensor.torch.OffloadedOptimizer(torch.optim.AdamW(model.parameters()),
                                             offload_grads=True)
    stream = fastensor.torch.stream_parameters(model, opt)   # the blocks of its ModuleList
    for batch in loader:
        model(batch).loss.backward()   # each block fetched before its forward and backward
        opt.step()                     # streamed parameters updated where they are stored
        opt.zero_grad()

A block's parameters are read into GPU memory before its forward (the next block's are
read meanwhile, in the order the first forward took, and the one after it from the spill
file into pinned host memory), released after it, read again when backward reaches the
block (the block before it meanwhile, the same way) and released once their
gradients have accumulated (whatever is left, when backward ends). Released, a parameter
keeps its shape, dtype and device but no memory (its storage is resized to nothing, so
every view of it, the ones autograd saved included, sees the data again once it is back):
code must not read it between passes. ``opt.step()`` reads each streamed parameter with its
states, updates it and stores it again; the update is the same as without streaming,
bitwise. ``model.state_dict()`` holds host copies of the streamed parameters;
``model.load_state_dict()`` stores the values it loads. ``close()`` (or the optimizer's)
puts the parameters back on their devices.

``blocks``: the modules streamed (default: the children of the model's ModuleList or
Sequential of repeated blocks with the most parameters, a transformer's layers); parameters
outside them stay where they are. Activation checkpointing works (a block recomputed in
backward is brought in for it). A parameter must own its storage (not be a view of a flat
buffer) and belong to one block. The optimizer must hold the parameters that train (the
frozen ones are streamed too, never updated).
"""
from __future__ import annotations

import functools
import weakref

import torch

from .optim import OffloadedOptimizer

_MARK = "_fastensor_stream"  # a streamed parameter's attribute: its ParameterStream (weakly)


def _repeated_blocks(model: torch.nn.Module) -> list:
    """The children of the ModuleList (or Sequential of two or more) of modules of one class
    (a transformer's layers) that holds the most parameters."""
    best, most = None, 0
    for m in model.modules():
        kids = list(m.children())
        if ((isinstance(m, torch.nn.ModuleList) and kids or
             isinstance(m, torch.nn.Sequential) and len(kids) > 1)
                and len({type(k) for k in kids}) == 1):
            n = sum(p.numel() for p in m.parameters())
            if n > most:
                best, most = kids, n
    if best is None:
        raise ValueError("stream_parameters: the model has no torch.nn.ModuleList or "
                         "Sequential of repeated blocks with parameters; pass blocks=[...] "
                         "(the modules to stream)")
    return best


class ParameterStream:
    """See the module's text; made by :func:`stream_parameters`."""

    def __init__(self, model: torch.nn.Module, optimizer: OffloadedOptimizer, blocks=None, *,
                 prefetch: bool = True):
        if not isinstance(optimizer, OffloadedOptimizer):
            raise TypeError("stream_parameters needs a fastensor.torch.OffloadedOptimizer (it "
                            f"updates the parameters where they are stored), not "
                            f"{type(optimizer).__name__}")
        blocks = _repeated_blocks(model) if blocks is None else list(blocks)
        if not blocks:
            raise ValueError("stream_parameters: no blocks to stream")
        self._opt, self.prefetch = optimizer, prefetch
        owner = {}
        self._blocks = []  # per block, its parameters
        self._names = []   # per block, parameter -> its name in the block
        for i, b in enumerate(blocks):
            if not isinstance(b, torch.nn.Module):
                raise TypeError(f"blocks[{i}] is a {type(b).__name__}, not a torch.nn.Module")
            ps, names = [], {}
            for name, p in b.named_parameters():
                if p in owner:
                    if owner[p] != i:
                        raise ValueError(f"parameter {name!r} of blocks[{i}] is also in "
                                         f"blocks[{owner[p]}]: a shared parameter cannot be "
                                         "streamed")
                    continue
                if getattr(p, _MARK, lambda: None)() is not None:
                    raise ValueError(f"parameter {name!r} of blocks[{i}] is streamed already")
                st = p.untyped_storage()
                if (not p.is_contiguous() or p.storage_offset() != 0 or not st.resizable()
                        or st.nbytes() != p.numel() * p.element_size()):
                    raise ValueError(f"parameter {name!r} of blocks[{i}] does not own its "
                                     "storage (a view of another tensor): it cannot be "
                                     "streamed")
                owner[p] = i
                ps.append(p)
                names[p] = name
            self._blocks.append(ps)
            self._names.append(names)
        self._order = []        # blocks in the order the first forward ran them
        self._arriving = {}     # parameter -> store keys of its read in flight
        self._callback = False  # the end-of-backward release is queued
        self._hooks = []
        self._closed = False
        stored = []
        try:
            for ps in self._blocks:
                for p in ps:
                    rec = optimizer._record(p)
                    rec.param = optimizer._put(p.detach())
                    stored.append(p)
            optimizer.flush()  # host parameters: the store has read them before they go
        except BaseException:
            for p in stored:
                optimizer._drop(optimizer._records[p].param)
                optimizer._records[p].param = None
            raise
        for ps in self._blocks:
            for p in ps:
                self._release(p)
        # the hooks hold this object: streaming lasts until close(), whoever keeps it
        for i, b in enumerate(blocks):
            self._hooks += [
                b.register_forward_pre_hook(functools.partial(self._forward_pre, i)),
                b.register_forward_hook(functools.partial(self._forward_post, i)),
                b.register_state_dict_post_hook(functools.partial(self._saving, i)),
                b.register_load_state_dict_pre_hook(functools.partial(self._loading, i)),
                b.register_load_state_dict_post_hook(functools.partial(self._loaded, i))]
            for p in self._blocks[i]:
                if p.requires_grad:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._release))
            for p in self._blocks[i]:
                setattr(p, _MARK, weakref.ref(self))
        optimizer._streams.append(self)

    # -- moving parameters ---------------------------------------------------------------

    @staticmethod
    def _released(p) -> bool:
        return p.untyped_storage().nbytes() == 0

    def _start(self, i: int) -> None:
        """Start reading block i's released parameters into memory on their devices."""
        opt = self._opt
        streams = {}  # device -> the fetch stream, behind the current stream's queued work
        for p in self._blocks[i]:
            if p in self._arriving or not self._released(p):
                continue
            stream = 0
            if p.device.type == "cuda":
                if p.device not in streams:
                    fs = opt._fetch_streams.get(p.device)
                    if fs is None:
                        fs = opt._fetch_streams[p.device] = torch.cuda.Stream(p.device)
                    # the memory comes from the current stream's pool: its work goes first
                    fs.wait_stream(torch.cuda.current_stream(p.device))
                    streams[p.device] = fs.cuda_stream
                stream = streams[p.device]
            p.untyped_storage().resize_(p.numel() * p.element_size())
            keys = []
            try:
                opt._get_into(opt._records[p].param, p, stream, keys)
            except BaseException:
                self._drop_read(p, keys)
                raise
            self._arriving[p] = keys

    def _bring(self, i: int) -> None:
        """Block i's parameters in memory, ready for the current stream."""
        self._start(i)
        devices = set()
        for p in self._blocks[i]:
            keys = self._arriving.pop(p, None)
            if keys is None:
                continue
            devices.add(p.device)
            try:
                self._opt._wait(keys)
            except BaseException:  # a failed read: the parameter stays released
                self._drop_read(p, keys)
                raise
        for d in devices:
            if d.type == "cuda":
                torch.cuda.current_stream(d).wait_stream(self._opt._fetch_streams[d])

    def _drop_read(self, p, keys) -> None:
        """A read of p not to be used: it ends before p's memory goes."""
        self._opt._wait_quietly(keys)
        if p.device.type == "cuda":
            torch.cuda.current_stream(p.device).wait_stream(self._opt._fetch_streams[p.device])
        p.untyped_storage().resize_(0)

    def _release(self, p) -> None:
        """p's memory goes (CUDA: the allocator reuses it after the work queued so far)."""
        if p not in self._arriving and not self._released(p):
            p.untyped_storage().resize_(0)

    def _release_all(self) -> None:
        self._callback = False
        for ps in self._blocks:
            for p in ps:
                keys = self._arriving.pop(p, None)
                if keys is not None:  # read ahead, never used
                    self._drop_read(p, keys)
                self._release(p)

    def _neighbour(self, i: int, step: int):
        if not self.prefetch or i not in self._order:
            return None
        k = self._order.index(i) + step
        return self._order[k] if 0 <= k < len(self._order) else None

    def _ahead(self, i: int, step: int) -> None:
        """Start reading the next block (``step``: +1 forward, -1 backward) into device
        memory, and the one after it from the file into pinned host memory."""
        j = self._neighbour(i, step)
        if j is None:
            return
        self._start(j)
        k = self._neighbour(j, step)
        if k is not None:
            self._opt._prefetch(self._blocks[k], only_params=True)

    # -- hooks ---------------------------------------------------------------------------

    def _forward_pre(self, i, _module, _args):
        if _in_backward():  # recomputed (activation checkpointing): the block only
            self._bring(i)
            return
        if self._order and i == self._order[0]:
            self._release_all()  # a new pass: what a failed one left goes
        if i not in self._order:
            self._order.append(i)
        self._bring(i)
        self._ahead(i, +1)

    def _forward_post(self, i, _module, _args, output):
        if _in_backward():  # recomputed: its backward comes next, the release after it
            return
        if torch.is_grad_enabled():
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(functools.partial(self._backward_pre, i))
        for p in self._blocks[i]:
            self._release(p)

    def _backward_pre(self, i, _grad):
        if not self._callback:
            self._callback = True
            torch.autograd.Variable._execution_engine.queue_callback(self._release_all)
        self._bring(i)
        self._ahead(i, -1)

    def _saving(self, i, _module, state_dict, prefix, _meta):
        for p in self._blocks[i]:
            key = prefix + self._names[i][p]
            if key in state_dict and self._released(p):
                state_dict[key] = self._opt._get_now(self._opt._records[p].param,
                                                     torch.device("cpu"))

    def _loading(self, i, *_args):
        self._bring(i)

    def _loaded(self, i, _module, _incompatible):
        opt = self._opt
        for p in self._blocks[i]:
            rec = opt._records[p]
            new = opt._put(p.detach())
            opt._drop(rec.param)
            rec.param = new
        opt.flush()
        for p in self._blocks[i]:
            self._release(p)

    # -- the rest ------------------------------------------------------------------------

    def close(self) -> None:
        """Every streamed parameter back on its device with its current value; the hooks
        removed; the stored copies dropped."""
        if self._closed:
            return
        self._closed = True
        for h in self._hooks:
            h.remove()
        self._hooks = []
        opt = self._opt
        for i in range(len(self._blocks)):
            self._bring(i)
        for ps in self._blocks:
            for p in ps:
                rec = opt._records.get(p)
                if rec is not None:
                    opt._drop(rec.param)
                    rec.param = None
                if hasattr(p, _MARK):
                    delattr(p, _MARK)
        if self in opt._streams:
            opt._streams.remove(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def stats(self) -> dict:
        """blocks, parameters and parameter_bytes streamed; resident_bytes: of those, in
        device memory now."""
        ps = [p for b in self._blocks for p in b]
        return {"blocks": len(self._blocks), "parameters": len(ps),
                "parameter_bytes": sum(p.numel() * p.element_size() for p in ps),
                "resident_bytes": sum(p.untyped_storage().nbytes() for p in ps)}


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _tensors(v)
    elif hasattr(x, "to_tuple"):  # transformers' ModelOutput
        yield from _tensors(x.to_tuple())


def stream_parameters(model: torch.nn.Module, optimizer: OffloadedOptimizer, blocks=None, *,
                      prefetch: bool = True) -> ParameterStream:
    """Stream the parameters of ``blocks`` of ``model`` (see :mod:`fastensor.stream`)
    through ``optimizer``'s store; returns the :class:`ParameterStream` (``close()`` ends
    it)."""
    return ParameterStream(model, optimizer, blocks, prefetch=prefetch)
