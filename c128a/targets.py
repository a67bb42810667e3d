"""Targets: the implementation under test, named by a spec string.

Specs (the same for pytest's ``--c128a-target``, ``C128A_TARGET`` and the CLI):

- ``triton`` (default): the project's kernel, :mod:`c128a.kernel`;
- ``reference``: the oracle, :mod:`c128a.reference`;
- ``vllm``: vLLM's builder from ``vllm.models.deepseek_v4.sparse_mla``;
- ``MODULE:ATTR`` or ``MODULE``: any importable object with a
  ``build_c128a_topk_metadata`` callable (vLLM's signature). Optional
  attributes: ``active_topk_width``, ``capacity_width`` (the project's policy
  when absent), ``validates_input`` (default True: bad input raises
  ``ValueError``), ``full_width_decode_views`` (default False: the target
  returns decode views at W = C, contiguous).

Loading a target imports kernels, so choose the device first
(:func:`c128a.device.use_device`).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Callable

from . import policy

TARGET_ENV = "C128A_TARGET"
DEFAULT_TARGET = "triton"
BUILTIN_TARGETS = {
    "triton": "c128a.kernel",
    "reference": "c128a.reference",
    "vllm": "vllm.models.deepseek_v4.sparse_mla",
}
BUILD_FUNCTION = "build_c128a_topk_metadata"


class TargetSpecError(ValueError):
    """The spec does not name a usable target (a usage error)."""


class TargetUnavailable(RuntimeError):
    """The target exists but cannot be imported here (vLLM not installed)."""


@dataclass(frozen=True)
class Target:
    spec: str
    build_c128a_topk_metadata: Callable
    active_topk_width: Callable[[int, int, int], int]
    capacity_width: Callable[[int, int], int]
    validates_input: bool = True
    full_width_decode_views: bool = False
    uses_project_policy: bool = True

    def __str__(self) -> str:
        return self.spec


def resolve_spec(option_value: str | None) -> tuple[str, str]:
    """(spec, where it came from): the option wins over the environment."""
    if option_value:
        return option_value, "--c128a-target"
    env_value = os.environ.get(TARGET_ENV, "").strip()
    if env_value:
        return env_value, f"${TARGET_ENV}"
    return DEFAULT_TARGET, "default"


def _import_object(spec: str):
    module_name, _, attr_path = spec.partition(":")
    if not module_name:
        raise TargetSpecError(f"target spec {spec!r} has no module; expected MODULE or MODULE:ATTR")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        if spec in BUILTIN_TARGETS.values() and module_name.startswith("vllm"):
            raise TargetUnavailable(f"vllm target not importable: {exc!r}") from exc
        raise TargetSpecError(
            f"target spec {spec!r}: cannot import module {module_name!r} ({exc}); "
            "is it on sys.path (PYTHONPATH)?"
        ) from exc
    for part in filter(None, attr_path.split(".")):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise TargetSpecError(
                f"target spec {spec!r}: {module_name!r} has no attribute {attr_path!r}"
            ) from exc
    return obj


def load_target(spec: str) -> Target:
    """Import the target named by ``spec`` and check its shape."""
    spec = spec.strip()
    if spec == "vllm":
        try:
            obj = _import_object(BUILTIN_TARGETS["vllm"])
        except TargetSpecError as exc:
            raise TargetUnavailable(str(exc)) from exc
        build = getattr(obj, BUILD_FUNCTION, None)
        if not callable(build):
            raise TargetUnavailable(
                f"{BUILTIN_TARGETS['vllm']} has no callable {BUILD_FUNCTION}; this vLLM "
                "predates the C128A builder"
            )
        return Target(
            spec="vllm",
            build_c128a_topk_metadata=build,
            active_topk_width=policy.active_topk_width,
            capacity_width=policy.capacity_width,
            validates_input=False,  # vLLM checks with assert, which python -O strips
        )
    obj = _import_object(BUILTIN_TARGETS.get(spec, spec))
    build = getattr(obj, BUILD_FUNCTION, None)
    if build is None:
        raise TargetSpecError(f"target {spec!r} ({obj!r}) has no attribute {BUILD_FUNCTION!r}")
    if not callable(build):
        raise TargetSpecError(f"target {spec!r}: {BUILD_FUNCTION} is not callable ({build!r})")
    width = getattr(obj, "active_topk_width", None)
    capacity = getattr(obj, "capacity_width", None)
    for name, value in (("active_topk_width", width), ("capacity_width", capacity)):
        if value is not None and not callable(value):
            raise TargetSpecError(f"target {spec!r}: {name} is not callable ({value!r})")
    return Target(
        spec=spec,
        build_c128a_topk_metadata=build,
        active_topk_width=width or policy.active_topk_width,
        capacity_width=capacity or policy.capacity_width,
        validates_input=bool(getattr(obj, "validates_input", True)),
        full_width_decode_views=bool(getattr(obj, "full_width_decode_views", False)),
        uses_project_policy=width is None and capacity is None,
    )
