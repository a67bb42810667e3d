"""Targets named by a spec string.

Specs (the same for pytest's ``--c128a-target``, ``C128A_TARGET`` and the CLI's
``--target``):

- ``triton`` (default): the project's kernel, :mod:`c128a.kernels.adaptive`;
- ``reference``: the oracle, :mod:`c128a.contract.oracle`;
- ``vllm``: vLLM's builder from ``vllm.models.deepseek_v4.sparse_mla``;
- ``vllm-release:VERSION`` or ``vllm-release:PATH``: the builder as a vLLM
  release's wheel ships it, read without installing vLLM
  (:mod:`c128a.targets.vllm_release`);
- ``MODULE:ATTR`` or ``MODULE``: any importable object with a
  ``build_c128a_topk_metadata`` callable (vLLM's signature) and the optional
  attributes :class:`~c128a.targets.target.Target` reads.

Loading a target may import kernels, so choose the device first
(:func:`c128a.targets.device.use_device`).
"""

from __future__ import annotations

import importlib
import os

from ..failures import TargetSpecError, TargetUnavailable, UsageError
from .target import Target
from .vllm_release import is_vllm_release_spec, load_vllm_release

TARGET_ENV = "C128A_TARGET"
DEFAULT_TARGET = "triton"
VLLM_MODULE = "vllm.models.deepseek_v4.sparse_mla"
BUILTIN_TARGETS = {
    "triton": "c128a.kernels.adaptive",
    "reference": "c128a.contract.oracle",
    "vllm": VLLM_MODULE,
}
PROJECT_TARGETS = frozenset({"triton", "reference", *BUILTIN_TARGETS.values()} - {VLLM_MODULE})
"""The project's own builders: they also check what the contract leaves open."""


def resolve_spec(option_value: str | None, option: str = "--c128a-target") -> tuple[str, str]:
    """(spec, where it came from): the option wins over the environment."""
    if option_value:
        return option_value.strip(), option
    env_value = os.environ.get(TARGET_ENV, "").strip()
    if env_value:
        return env_value, f"${TARGET_ENV}"
    return DEFAULT_TARGET, "default"


def import_object(spec: str, what: str = "spec", error: type[UsageError] = UsageError):
    """``MODULE`` or ``MODULE:ATTR.ATTR`` to the object it names; ``error``
    (naming ``what``) when the module or an attribute is missing."""
    module_name, _, attr_path = spec.partition(":")
    if not module_name:
        raise error(f"{what} {spec!r} has no module; expected MODULE or MODULE:ATTR")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise error(
            f"{what} {spec!r}: cannot import module {module_name!r} ({exc}); "
            "is it on sys.path (PYTHONPATH)?"
        ) from exc
    for part in filter(None, attr_path.split(".")):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise error(f"{what} {spec!r}: {module_name!r} has no attribute {attr_path!r}") from exc
    return obj


def load_target(spec: str) -> Target:
    """Import the target named by ``spec`` and check its shape."""
    spec = spec.strip()
    if is_vllm_release_spec(spec):
        return load_vllm_release(spec)
    if spec == "vllm":
        try:
            module = importlib.import_module(VLLM_MODULE)
        except ImportError as exc:
            raise TargetUnavailable(f"vllm target not importable: {exc!r}") from exc
        if not callable(getattr(module, "build_c128a_topk_metadata", None)):
            raise TargetUnavailable(
                f"{VLLM_MODULE} has no callable build_c128a_topk_metadata; this vLLM "
                "predates the C128A builder"
            )
        # vLLM checks with assert, which python -O strips.
        return Target.from_object("vllm", module, validates_input=False)
    obj = import_object(BUILTIN_TARGETS.get(spec, spec), "target spec", TargetSpecError)
    return Target.from_object(spec, obj)


def is_project_target(target) -> bool:
    """The project's own targets also check what the contract does not oblige
    a third-party builder to check (dtypes, devices, counts, table rows)."""
    return str(getattr(target, "spec", "")) in PROJECT_TARGETS
