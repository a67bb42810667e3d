"""Choosing where kernels run.

On the CPU the Triton kernel runs under Triton's interpreter, which must be
switched on before any ``@triton.jit`` function is decorated. ``use_device``
is the one place that decides, and it refuses to switch after the fact.
"""

from __future__ import annotations

import os
import sys

INTERPRET_ENV = "TRITON_INTERPRET"
# Modules that decorate @triton.jit functions when imported.
KERNEL_MODULES = ("c128a.kernel", "c128a.baseline", "c128a.mutant_kernels", "c128a.graph_cuda")


class DeviceError(RuntimeError):
    """The requested device cannot be used in this process."""


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def default_device() -> str:
    return "cuda" if cuda_available() else "cpu"


def interpreter_on() -> bool:
    return os.environ.get(INTERPRET_ENV, "0") == "1"


def use_device(name: str | None) -> str:
    """Resolve ``name`` ('cuda', 'cpu' or None for the default) and prepare it.

    For 'cpu' this sets ``TRITON_INTERPRET=1``; it must run before kernel
    modules are imported, and raises :class:`DeviceError` if one already was
    without the interpreter.
    """
    name = default_device() if name is None else name
    if name not in ("cuda", "cpu"):
        raise DeviceError(f"device={name!r} is not one of 'cuda', 'cpu'")
    if name == "cuda":
        if not cuda_available():
            raise DeviceError("device='cuda' but torch.cuda.is_available() is False; use 'cpu'")
        if interpreter_on():
            raise DeviceError(
                f"device='cuda' but {INTERPRET_ENV}=1 is set; unset it to run kernels on the GPU"
            )
        return name
    if not interpreter_on():
        imported = [m for m in KERNEL_MODULES if m in sys.modules]
        if imported:
            raise DeviceError(
                f"device='cpu' needs {INTERPRET_ENV}=1 before kernels are decorated, but "
                f"{', '.join(imported)} was already imported without it"
            )
        os.environ[INTERPRET_ENV] = "1"
    return name
