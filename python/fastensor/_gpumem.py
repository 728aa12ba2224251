"""How much CUDA memory the process may still take: the limits that offload, async saves
and DCP staging decide by."""
from __future__ import annotations

import torch

_FRACTIONS: dict = {}  # device index -> fraction set, where torch cannot say (older torch)
if not hasattr(torch.cuda, "get_per_process_memory_fraction"):
    _set_fraction = torch.cuda.set_per_process_memory_fraction

    def _remember_fraction(fraction, device=None):
        _set_fraction(fraction, device)
        index = torch.cuda._utils._get_device_index(device, optional=True)
        _FRACTIONS[index if index is not None else torch.cuda.current_device()] = fraction

    torch.cuda.set_per_process_memory_fraction = _remember_fraction


def _allocated(device) -> int:
    """torch.cuda.memory_allocated, without building the whole statistics dictionary."""
    try:
        return torch._C._cuda_memoryStats(device.index)["allocated_bytes"]["all"]["current"]
    except (AttributeError, KeyError, TypeError):
        return torch.cuda.memory_allocated(device)


def _fraction_limit(device) -> int:
    """The device's memory times the fraction of set_per_process_memory_fraction (cheap:
    no driver call)."""
    total = torch.cuda.get_device_properties(device).total_memory
    get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    fraction = (get_fraction(device) if get_fraction is not None
                else _FRACTIONS.get(device.index, 1.0))
    return int(total * fraction)


def gpu_memory_limit(device) -> int:
    """Bytes the process may allocate on ``device``: the device's memory times the fraction
    of ``torch.cuda.set_per_process_memory_fraction``, and no more than what the allocator
    holds plus what is free on the device."""
    device = torch.device(device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    free, _ = torch.cuda.mem_get_info(device)
    return min(_fraction_limit(device), torch.cuda.memory_reserved(device) + free)


def device_room(device, nbytes):
    """Whether ``nbytes`` more fit on the device with room to spare (5% of it, 1 GiB at
    least): within what the process may allocate there (the driver's free memory plus what
    torch's allocator holds unused, and set_per_process_memory_fraction's cap)."""
    total = torch.cuda.get_device_properties(device).total_memory
    room = gpu_memory_limit(device) - torch.cuda.memory_allocated(device)
    return nbytes + max(total // 20, 1 << 30) <= room
