"""What Triton has compiled: the variants a JIT function holds per device."""

from __future__ import annotations

import torch

from ..failures import HarnessError


def interpreting(jit_function) -> bool:
    """Whether ``jit_function`` runs under Triton's interpreter."""
    return type(jit_function).__name__ == "InterpretedFunction"


def compiled_variants(jit_function, device: torch.device | str | int) -> list:
    """The compiled variants ``jit_function`` holds for a CUDA device.

    Reads Triton's in-memory compile cache: ``JITFunction.device_caches`` maps
    a device index to a tuple whose first item is the dict of compiled kernels
    (Triton 3.3 to 3.9). The interpreter compiles nothing and has no such
    cache, so this raises ``TypeError`` there.
    """
    caches = getattr(jit_function, "device_caches", None)
    if caches is None:
        raise TypeError(
            f"{jit_function!r} has no device_caches (Triton's interpreter compiles nothing); "
            "count compiled variants on a CUDA device"
        )
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in caches:  # device_caches is a defaultdict: do not create an entry
        return []
    kernel_cache = caches[index][0]
    if not isinstance(kernel_cache, dict):
        raise HarnessError(
            f"Triton's device cache holds a {type(kernel_cache).__name__}, not the dict of "
            "compiled kernels this Triton version was expected to keep"
        )
    return list(kernel_cache.values())


def compiled_variant_count(jit_function, device: torch.device | str | int) -> int:
    """How many compiled variants ``jit_function`` holds for a CUDA device."""
    return len(compiled_variants(jit_function, device))
