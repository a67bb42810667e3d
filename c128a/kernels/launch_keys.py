"""Compile keys: what Triton specialises a launch on, and what a warm-up compiled.

A Triton kernel compiles once per *key*: the value of every ``tl.constexpr``
parameter, the type of every other argument (``i32``/``i64``/``i1``, a
pointer's dtype), for an integer or pointer argument not in the kernel's
``do_not_specialize`` whether it is divisible by 16 (an address: 16-byte
aligned), and the launch options (``num_warps``, ...). :func:`launch_key`
computes it from a launch's bound arguments.

A *keyed launcher* is an object in the style of vLLM's JIT-kernel classes
(:class:`~c128a.kernels.vllm_shims.VllmTritonJitKernel`): a ``__call__``
that returns a launch spec, ``get_warmup_keys(vllm_config)`` (the compile
keys its start-up warm-up compiles for an engine configuration) and
``warmup_inputs(key)`` (the arguments of that warm-up launch).
:func:`warmed_keys` runs the launcher's own warm-up logic up to the launch
(placeholders instead of tensors, nothing compiled) and returns the key of
each warm-up launch; :func:`runtime_keys` records the launches a call makes
(:func:`~c128a.kernels.vllm_shims.observed_launches`, kernels not run).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

from . import vllm_shims

LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


@dataclass(frozen=True)
class LaunchKey:
    """One launch's compile key: ``kernel`` (its name) and, per parameter
    or launch option, what Triton specialises on, as text."""

    kernel: str
    parts: tuple[tuple[str, str], ...]

    def as_dict(self) -> dict[str, str]:
        return dict(self.parts)


def constexpr_parameters(kernel) -> set[str]:
    """The ``tl.constexpr`` parameters of a Triton kernel (compiled or interpreted)."""
    fn = getattr(kernel, "fn", kernel)
    return {
        name for name, parameter in inspect.signature(fn).parameters.items()
        if "constexpr" in str(parameter.annotation)
    }


def unspecialised_parameters(kernel) -> set[str]:
    """The parameters a Triton kernel's ``do_not_specialize`` names (the
    interpreter keeps the decorator's arguments in ``kwargs``)."""
    listed = getattr(kernel, "do_not_specialize", None)
    if listed is None:
        listed = getattr(kernel, "kwargs", {}).get("do_not_specialize", ())
    names = list(inspect.signature(getattr(kernel, "fn", kernel)).parameters)
    return {names[p] if isinstance(p, int) else p for p in listed or ()}


def _address(value) -> int | None:
    pointer = getattr(value, "data_ptr", None)
    return pointer() if callable(pointer) else None


def specialisation(value, specialise: bool) -> str:
    """What Triton keys a non-constexpr argument on."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        kind = "i32" if -(2**31) <= value < 2**31 else "i64" if value < 2**63 else "u64"
        return kind + (" %16" if specialise and value % 16 == 0 else "")
    if isinstance(value, float):
        return "fp32"
    address = _address(value)
    if address is not None:
        dtype = str(getattr(value, "dtype", "?")).removeprefix("torch.")
        return f"*{dtype}" + (" %16" if specialise and address % 16 == 0 else "")
    return type(value).__name__


def kernel_name(kernel) -> str:
    return getattr(getattr(kernel, "fn", kernel), "__qualname__", repr(kernel))


def launch_key(kernel, arguments: dict[str, Any]) -> LaunchKey:
    """The compile key of launching ``kernel`` with ``arguments`` (bound
    by parameter name, launch options beside them)."""
    constexpr = constexpr_parameters(kernel)
    unspecialised = unspecialised_parameters(kernel)
    parts = []
    for name in inspect.signature(getattr(kernel, "fn", kernel)).parameters:
        value = arguments.get(name)
        if name in constexpr:
            parts.append((name, f"constexpr {value!r}"))
        else:
            parts.append((name, specialisation(value, name not in unspecialised)))
    for option in LAUNCH_OPTIONS:
        if option in arguments:
            parts.append((option, repr(arguments[option])))
    return LaunchKey(kernel_name(kernel), tuple(parts))


def engine_config(max_model_len: int, block_size: int = 256, compress_ratios=(4, 128),
                  index_topk: int = 512, window_size: int = 128) -> SimpleNamespace:
    """The few fields of an engine configuration (vLLM's ``vllm_config``)
    that the consumers' ``get_warmup_keys`` read: ``max_model_len``, the KV
    page (``cache_config.block_size``, in tokens), the model's compress
    ratios, its indexer's top-k and its sliding window."""
    hf_config = SimpleNamespace(
        model_type="deepseek_v4", compress_ratios=list(compress_ratios), index_topk=index_topk,
        sliding_window=window_size, vision_n_layers=0, vision_max_n_token=0,
    )
    return SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=max_model_len, hf_config=hf_config),
        cache_config=SimpleNamespace(block_size=block_size),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=8192, max_num_seqs=512),
        speculative_config=None,
    )


def _launch_spec(launcher, inputs: dict[str, Any]):
    """(launch spec, inputs as bound) of ``launcher``'s own ``__call__`` for ``inputs``."""
    call = getattr(type(launcher).__call__, "__wrapped__", type(launcher).__call__)
    bound = inspect.signature(call).bind(launcher, **inputs)
    bound.apply_defaults()
    arguments = dict(list(bound.arguments.items())[1:])
    return call(launcher, **arguments), arguments


def warmed_keys(launcher, vllm_config) -> list[LaunchKey]:
    """The compile keys ``launcher``'s warm-up compiles for ``vllm_config``:
    its ``get_warmup_keys``, each through its ``warmup_inputs`` and its own
    launch spec to the kernel's bound arguments."""
    keys = []
    for compile_key in launcher.get_warmup_keys(vllm_config):
        spec, inputs = _launch_spec(launcher, launcher.warmup_inputs(compile_key))
        grid, given, *_ = spec
        kernel = given.get("kernel") or launcher.kernel
        given = {name: value for name, value in given.items() if name != "kernel"}
        if getattr(launcher, "bind_launch_inputs", True):
            given = vllm_shims._bind(vllm_shims._parameters(kernel), inputs, given)
        key = launch_key(kernel, given)
        if key not in keys:
            keys.append(key)
    return keys


def runtime_keys(call: Callable[[], Any]) -> list[tuple[Any, LaunchKey]]:
    """(launcher, key) of every keyed launch ``call()`` makes, kernels not run."""
    with vllm_shims.observed_launches(run=False) as records:
        call()
    return [(r.launcher, launch_key(r.kernel, r.arguments)) for r in records if r.grid is not None]


def _materialised(value, device):
    """A placeholder tensor as a real one on ``device`` (its shape, strides
    and dtype; one element past a 16-byte boundary where it is unaligned)."""
    if not isinstance(value, vllm_shims.TritonWarmupTensor):
        return value
    import torch

    shape, strides = value.shape, value.stride()
    extent = 1 + sum((size - 1) * stride for size, stride in zip(shape, strides))
    unaligned = value.data_ptr() % 16 != 0
    storage = torch.empty(extent + 16, dtype=value.dtype, device=device)
    return storage.as_strided(shape, strides, 1 if unaligned else 0)


def warm_up(launcher, vllm_config, device) -> int:
    """Compile, with Triton's ``warmup`` (nothing runs), the launch of each
    key ``launcher``'s warm-up declares for ``vllm_config``, placeholders
    made real tensors on ``device``; how many launches it compiled."""
    count = 0
    for compile_key in launcher.get_warmup_keys(vllm_config):
        inputs = {name: _materialised(value, device)
                  for name, value in launcher.warmup_inputs(compile_key).items()}
        (grid, given, *_), inputs = _launch_spec(launcher, inputs)
        kernel = given.get("kernel") or launcher.kernel
        given = {name: value for name, value in given.items() if name != "kernel"}
        if getattr(launcher, "bind_launch_inputs", True):
            given = vllm_shims._bind(vllm_shims._parameters(kernel), inputs, given)
        kernel.warmup(grid=grid, **given)
        count += 1
    return count
