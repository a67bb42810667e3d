"""Every read of Triton's private state, each behind one small function.

Triton may change what it does not publish in any release, so nothing else
in the package touches a ``JITFunction``'s private attributes: it calls one
of these functions. ``tests/test_triton_private.py`` has a test per touch
that fails naming the attribute and the Triton version; run it first when
widening the Triton range in ``pyproject.toml``.

The touches, and why nothing public does the job (as of Triton 3.9):

- :func:`compiled_variants`: ``JITFunction.device_caches``, which maps a
  device index to a tuple whose first item is the dict of the variants
  compiled in this process. Counting compiles as they happen has a public
  hook (``triton.knobs.runtime.jit_post_compile_hook``,
  :mod:`c128a.kernels.compiled`), but what a kernel already holds, and a
  compiled variant's own attributes (``n_regs``, read by ``c128a bench``),
  are only there.
- :func:`forget_compiled_variants`: emptying that same cache, so that the
  next launch compiles again and the compile hooks see it. A check that
  warms a kernel up must start from a kernel that holds nothing, or an
  earlier launch in the process (another test's) hides a warm-up that
  compiled nothing.
"""

from __future__ import annotations

import torch

from ..failures import HarnessError

DEVICE_CACHES = "device_caches"


def _device_caches(jit_function):
    caches = getattr(jit_function, DEVICE_CACHES, None)
    if caches is None:
        raise TypeError(
            f"{jit_function!r} has no {DEVICE_CACHES} (Triton's interpreter compiles nothing); "
            "count compiled variants on a CUDA device"
        )
    return caches


def compiled_variants(jit_function, device: torch.device | str | int) -> list:
    """The compiled variants ``jit_function`` holds for a CUDA device
    (Triton 3.3 to 3.9). The interpreter compiles nothing and has no such
    cache, so this raises ``TypeError`` there."""
    caches = _device_caches(jit_function)
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


def forget_compiled_variants(jit_function) -> None:
    """Drop every variant ``jit_function`` compiled in this process, on every
    device: its next launch (or warm-up) compiles again. The interpreter
    keeps nothing to drop (``TypeError``, as :func:`compiled_variants`)."""
    _device_caches(jit_function).clear()
