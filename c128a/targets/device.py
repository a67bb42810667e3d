"""Choosing where kernels run.

On the CPU the Triton kernels run under Triton's interpreter, which must be
switched on before any ``@triton.jit`` function is decorated, that is before
:mod:`c128a.kernels` (the only package that imports Triton) is imported.
``use_device`` is the one place that decides, and it refuses to switch after
the fact.
"""

from __future__ import annotations

import os
import sys

import torch

from ..failures import DeviceError
from ..options import DEVICE_ENV, DEVICES

INTERPRET_ENV = "TRITON_INTERPRET"
KERNELS_PACKAGE = "c128a.kernels"


def cuda_available() -> bool:
    return torch.cuda.is_available()


def default_device() -> str:
    return "cuda" if cuda_available() else "cpu"


def interpreter_on() -> bool:
    return os.environ.get(INTERPRET_ENV, "0") == "1"


def use_device(name: str | None) -> str:
    """Resolve ``name`` ('cuda', 'cpu' or None for the default) and prepare it.

    For 'cpu' this sets ``TRITON_INTERPRET=1``; it must run before the kernels
    are imported, and raises :class:`~c128a.failures.DeviceError` if they
    already were without the interpreter.
    """
    name = default_device() if name is None else name
    if name not in DEVICES:
        raise DeviceError(f"device={name!r} is not one of 'cuda', 'cpu'")
    if name == "cuda":
        if not cuda_available():
            raise DeviceError("device='cuda' but torch.cuda.is_available() is False; use 'cpu'")
        if interpreter_on():
            raise DeviceError(
                f"device='cuda' but {INTERPRET_ENV}=1 is set; unset it to run kernels on the GPU"
            )
        return name
    kernels = sys.modules.get(KERNELS_PACKAGE)
    if kernels is not None and not kernels.INTERPRETED:
        raise DeviceError(
            f"device='cpu' needs {INTERPRET_ENV}=1 before kernels are decorated, but "
            f"{KERNELS_PACKAGE} was already imported without it"
        )
    os.environ[INTERPRET_ENV] = "1"
    return name
