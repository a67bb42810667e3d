"""Stand-ins for the few vLLM names an extract of vLLM's C128A builder needs.

An extract (:mod:`c128a.kernels.vllm_release`) keeps vLLM's own definitions
verbatim and takes everything else it names from here instead of importing
vLLM: the real ``triton``, ``triton.language`` and ``torch``, and small
utilities written for this project from what they do (nothing here is
vLLM's code):

- ``cdiv``, ``next_power_of_2``: integer helpers;
- ``current_platform`` and ``DeviceCapability``: the platform query a build
  makes (the CUDA capability of GPU 0; ``None`` under Triton's interpreter,
  where the kernels run on the CPU, as vLLM's CPU platform reports);
- ``kernel_launcher``, ``VllmTritonJitKernel``, ``LaunchSpec``: vLLM's
  declarative launch, where a ``__call__`` returns ``(grid, kwargs)`` and its
  own arguments are bound to the kernel's parameters by name (``x`` to ``x``,
  ``x_ptr``, ``X`` or ``X_PTR``; an unbound ``x_stride`` or ``x_stride_D``
  parameter to the stride of the tensor bound to ``x``/``x_ptr``);
- ``TritonWarmupTensor``: a placeholder for vLLM's start-up warm-up inputs,
  which the suite never builds (it refuses to be constructed).

:data:`SUPPLIED` lists every name an extract may take from here.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any, Callable, Generic, NamedTuple, TypeVar

import torch
import triton
import triton.language as tl

from . import INTERPRETED


def cdiv(numerator: int, denominator: int) -> int:
    """Integer division rounding up."""
    return -(numerator // -denominator)


def next_power_of_2(value: int) -> int:
    """The smallest power of two >= ``value`` (1 for ``value`` <= 1)."""
    return 1 if value <= 1 else 1 << (int(value) - 1).bit_length()


class DeviceCapability(NamedTuple):
    major: int
    minor: int

    def to_int(self) -> int:
        return self.major * 10 + self.minor


class _Platform:
    """What a build asks of vLLM's ``current_platform``."""

    def is_cuda(self) -> bool:
        return not INTERPRETED and torch.cuda.is_available()

    def get_device_capability(self, device_id: int = 0) -> DeviceCapability | None:
        if not self.is_cuda():
            return None
        return DeviceCapability(*torch.cuda.get_device_capability(device_id))


current_platform = _Platform()

LaunchSpec = tuple
"""``(grid, kwargs)`` or ``(grid, kwargs, outputs)``."""

CompileKeyT = TypeVar("CompileKeyT")

_STRIDE_PARAMETER = re.compile(r"(?P<base>.+?)(?P<sep>_stride|_STRIDE)(?:_?(?P<dim>\d+))?")


def _parameters(kernel) -> tuple[str, ...]:
    names = getattr(kernel, "arg_names", None)
    if names is None:
        names = tuple(inspect.signature(kernel.fn).parameters)
    return tuple(names)


def _bind(parameters: tuple[str, ...], inputs: dict[str, Any], given: dict[str, Any]) -> dict:
    """``given`` completed from the call's ``inputs`` and their strides."""
    bound = dict(given)
    available = set(parameters)
    for name, value in inputs.items():
        for candidate in (name, f"{name}_ptr", name.upper(), f"{name}_ptr".upper()):
            if candidate in available:
                if candidate not in given:
                    bound[candidate] = value
                break
    for parameter in parameters:
        if parameter in bound:
            continue
        match = _STRIDE_PARAMETER.fullmatch(parameter)
        if match is None:
            continue
        base = match["base"]
        pointer = base + ("_ptr" if match["sep"] == "_stride" else "_PTR")
        source = base if base in bound else pointer
        if source in bound:
            bound[parameter] = bound[source].stride(int(match["dim"] or 0))
    return bound


class VllmTritonJitKernel(Generic[CompileKeyT]):
    """The owner of one Triton kernel (``kernel``) launched through a
    :func:`kernel_launcher` ``__call__``. Only the runtime launch is here:
    vLLM's start-up warm-up and compile-key tracing are not (the suite
    launches at run time only)."""

    kernel: Any
    bind_launch_inputs = True

    def launch(self, launch_spec, inputs: dict[str, Any]):
        grid, given, *outputs = launch_spec
        kernel = given.get("kernel") or self.kernel
        given = {name: value for name, value in given.items() if name != "kernel"}
        if self.bind_launch_inputs:
            given = _bind(_parameters(kernel), inputs, given)
        if grid is not None:
            kernel[grid](**given)
        return outputs[0] if outputs else None


def kernel_launcher(call: Callable[..., Any]) -> Callable[..., Any]:
    """A ``__call__`` returning a launch spec, made to launch it with the
    call's own arguments bound to the kernel's parameters."""
    signature = inspect.signature(call)

    @functools.wraps(call)
    def launching(self, *args, **kwargs):
        launch_spec = call(self, *args, **kwargs)
        arguments = signature.bind(self, *args, **kwargs)
        arguments.apply_defaults()
        inputs = dict(arguments.arguments)
        inputs.pop(next(iter(signature.parameters)))  # self
        return self.launch(launch_spec, inputs)

    return launching


class TritonWarmupTensor:
    """vLLM's warm-up placeholder tensor: not supported here."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            "c128a's vLLM extract launches kernels at run time only; vLLM's start-up "
            "warm-up (TritonWarmupTensor) is not supported"
        )


SUPPLIED: dict[str, str] = {
    "torch": "import torch",
    "triton": "import triton",
    "tl": "import triton.language as tl",
    **{
        name: f"from {__name__} import {name}"
        for name in (
            "DeviceCapability",
            "LaunchSpec",
            "TritonWarmupTensor",
            "VllmTritonJitKernel",
            "cdiv",
            "current_platform",
            "kernel_launcher",
            "next_power_of_2",
        )
    },
}
"""Every name an extract may take from outside vLLM's file, and the import
statement the extract uses for it."""

__all__ = ["SUPPLIED", *SUPPLIED]
