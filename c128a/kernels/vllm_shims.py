"""Stand-ins for the few vLLM names an extract of vLLM's C128A builder needs.

An extract (:mod:`c128a.kernels.vllm_extracts`) keeps vLLM's own definitions
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
- the start-up warm-up's vocabulary, so that a launcher's own
  ``get_warmup_keys`` and ``warmup_inputs`` run here unchanged:
  ``WarmupIntRange`` (the integers from a start, each next one given by
  ``advance``, below a stop), ``zip_inputs`` (keyword groups that vary
  together), ``VllmTritonJitKernel._trace_dispatch`` (a dispatch called on
  every combination of its keywords' alternatives, the keys deduplicated in
  order), ``TritonWarmupTensor`` (a placeholder tensor: dtype, shape,
  strides, a 16-byte aligned address unless made unaligned),
  ``TritonPointerInputVariant`` (which pointer arguments are 16-byte
  aligned), ``get_compress_ratios`` (a model's per-layer compress ratios).

:data:`SUPPLIED` lists every name an extract may take from here.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
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
    :func:`kernel_launcher` ``__call__``: the runtime launch, and
    :meth:`_trace_dispatch` for a subclass's ``get_warmup_keys``. What the
    warm-up would compile is read by :mod:`c128a.kernels.launch_keys`; the
    suite never runs a warm-up itself."""

    kernel: Any
    bind_launch_inputs = True

    @staticmethod
    def _trace_dispatch(dispatch: Callable[..., Any]) -> Callable[..., list]:
        """``dispatch`` over every combination of alternatives: each keyword
        whose value is a tuple, list or :class:`WarmupIntRange` contributes
        one of its values (an empty one: no keys at all), any other value
        itself; each positional :func:`zip_inputs` contributes one of its
        keyword groups. A parameter of ``dispatch`` given no value gets None
        (one it never reads: vLLM expands only the inputs a dispatch reads).
        The keys, duplicates dropped, in order."""
        required = [
            p.name for p in inspect.signature(dispatch).parameters.values()
            if p.default is p.empty and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]

        def traced(*groups, **keywords) -> list:
            axes: list[list[dict]] = []
            for group in groups:
                axes.append([dict(choice) for choice in group])
            for name, value in keywords.items():
                if isinstance(value, (tuple, list, WarmupIntRange)):
                    axes.append([{name: choice} for choice in value])
                else:
                    axes.append([{name: value}])
            keys: list = []
            for combination in itertools.product(*axes):
                arguments: dict = dict.fromkeys(required)
                for part in combination:
                    arguments.update(part)
                key = dispatch(**arguments)
                if key not in keys:
                    keys.append(key)
            return keys

        return traced

    def launch(self, launch_spec, inputs: dict[str, Any]):
        grid, given, *outputs = launch_spec
        kernel = given.get("kernel") or self.kernel
        given = {name: value for name, value in given.items() if name != "kernel"}
        if self.bind_launch_inputs:
            given = _bind(_parameters(kernel), inputs, given)
        if grid is not None and report_launch(self, kernel, grid, given):
            kernel[grid](**given)
        return outputs[0] if outputs else None


class LaunchRecord(NamedTuple):
    """One launch through a :class:`VllmTritonJitKernel`: its owner, the
    Triton kernel, the grid, and every argument bound to the kernel's
    parameters and launch options."""

    launcher: Any
    kernel: Any
    grid: Any
    arguments: dict


LAUNCH_OBSERVERS: list[tuple[list, bool]] = []
"""(records, run) of each :func:`observed_launches` in force: empty but
inside one, so a launcher checks it before building a record."""


def report_launch(owner, kernel, grid, arguments: dict) -> bool:
    """Record a launch for every :func:`observed_launches` in force;
    whether to make it (False inside one with ``run=False``)."""
    run = True
    for records, runs in LAUNCH_OBSERVERS:
        records.append(LaunchRecord(owner, kernel, grid, arguments))
        run = run and runs
    return run


@contextlib.contextmanager
def observed_launches(run: bool = True):
    """Record every :class:`VllmTritonJitKernel` launch made inside, as
    :class:`LaunchRecord` entries of the list this yields; with
    ``run=False`` the kernels are not run (only the launch is worked out)."""
    records: list[LaunchRecord] = []
    LAUNCH_OBSERVERS.append((records, run))
    try:
        yield records
    finally:
        for index, (listed, _) in enumerate(LAUNCH_OBSERVERS):
            if listed is records:
                del LAUNCH_OBSERVERS[index]
                break


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


class WarmupIntRange:
    """The integers ``start``, ``advance(start)``, ... below ``stop``
    (``advance`` defaults to adding one)."""

    def __init__(self, start: int, stop: int, advance: Callable[[int], int] | None = None):
        self.start, self.stop = int(start), int(stop)
        self.advance = advance or (lambda value: value + 1)

    def __iter__(self):
        value = self.start
        while value < self.stop:
            yield value
            following = self.advance(value)
            if following <= value:
                raise ValueError(f"WarmupIntRange: advance({value}) = {following} does not grow")
            value = following

    def __repr__(self) -> str:
        return f"WarmupIntRange({list(self)})"


def zip_inputs(*groups: dict) -> tuple[dict, ...]:
    """Keyword groups that vary together (one alternative of a traced dispatch)."""
    return tuple(dict(group) for group in groups)


PLACEHOLDER_ADDRESS = 1 << 20
"""Where a placeholder tensor claims to start: 16-byte aligned."""


class TritonWarmupTensor:
    """A placeholder for a warm-up launch's tensor argument: no storage, only
    what Triton keys a compile on (dtype, a 16-byte aligned address unless
    ``aligned=False``) and what a launch spec reads (shape, strides)."""

    def __init__(self, dtype, shape: tuple = (1,), strides: tuple | None = None,
                 aligned: bool = True):
        self.dtype, self.shape = dtype, tuple(shape)
        if strides is None:
            strides, step = [], 1
            for size in reversed(self.shape):
                strides.insert(0, step)
                step *= max(int(size), 1)
        self._strides = tuple(strides)
        self._address = PLACEHOLDER_ADDRESS + (0 if aligned else 4)

    def stride(self, dim: int | None = None):
        return self._strides if dim is None else self._strides[dim]

    def dim(self) -> int:
        return len(self.shape)

    def data_ptr(self) -> int:
        return self._address

    def __getitem__(self, index):
        return self

    def __repr__(self) -> str:
        return f"TritonWarmupTensor({self.dtype}, shape={self.shape}, strides={self._strides})"


class TritonPointerInputVariant(NamedTuple):
    """Which pointer arguments of a launch are 16-byte aligned (Triton keys a
    compile on each pointer's alignment)."""

    aligned: tuple[tuple[str, bool], ...]

    @classmethod
    def from_alignment(cls, **aligned: bool) -> "TritonPointerInputVariant":
        return cls(tuple(sorted((name, bool(value)) for name, value in aligned.items())))

    def pointer(self, name: str, dtype, shape: tuple = (1,), strides: tuple | None = None):
        """A placeholder for argument ``name``, aligned as this variant says."""
        return TritonWarmupTensor(dtype, shape, strides, aligned=dict(self.aligned).get(name, True))


def get_compress_ratios(hf_config) -> list[int]:
    """The model's per-layer compress ratios (``compress_ratios`` of its config)."""
    return list(getattr(hf_config, "compress_ratios", ()))


def has_cutedsl() -> bool:
    """CuTe DSL kernels are never available here."""
    return False


SUPPLIED: dict[str, str] = {
    "torch": "import torch",
    "triton": "import triton",
    "tl": "import triton.language as tl",
    **{
        name: f"from {__name__} import {name}"
        for name in (
            "DeviceCapability",
            "LaunchSpec",
            "TritonPointerInputVariant",
            "TritonWarmupTensor",
            "VllmTritonJitKernel",
            "WarmupIntRange",
            "cdiv",
            "current_platform",
            "get_compress_ratios",
            "has_cutedsl",
            "kernel_launcher",
            "next_power_of_2",
            "zip_inputs",
        )
    },
}
"""Every name an extract may take from outside vLLM's file, and the import
statement the extract uses for it."""

__all__ = ["LAUNCH_OBSERVERS", "SUPPLIED", "LaunchRecord", "observed_launches", "report_launch",
           *SUPPLIED]
