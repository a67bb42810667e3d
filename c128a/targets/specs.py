"""Targets named by a spec string.

Specs (the same for pytest's ``--c128a-target``, ``C128A_TARGET`` and the CLI's
``--target``):

- ``triton`` (default): the project's kernel, :mod:`c128a.kernels.adaptive`;
- ``reference``: the oracle, :mod:`c128a.contract.oracle`;
- ``triton-inert``, ``reference-inert``: the same two under the ``inert``
  padding-row variant (:mod:`c128a.contract.padding_rows`);
- ``vllm``: vLLM's builder from ``vllm.models.deepseek_v4.sparse_mla``;
- ``vllm-release:VERSION`` or ``vllm-release:PATH``: the builder as a vLLM
  release's wheel ships it, read without installing vLLM
  (:mod:`c128a.targets.vllm_release`);
- ``vllm-source:PATH[@REF]``: the builder and its consumers as a vLLM
  checkout holds them at any git revision (:mod:`c128a.targets.vllm_source`);
- ``MODULE:ATTR`` or ``MODULE``: any importable object with a
  ``build_c128a_topk_metadata`` callable (vLLM's signature) and the optional
  attributes :class:`~c128a.targets.target.Target` reads.

The padding-row variant a target is held to is the one it declares, unless
``--c128a-padding-rows`` / ``--padding-rows`` or ``C128A_PADDING_ROWS`` names
another (:func:`resolve_padding_rows`, applied by :func:`load_target`).

Loading a target may import kernels, so choose the device first
(:func:`c128a.targets.device.use_device`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping

from ..contract import check_padding_rows
from ..failures import TargetSpecError, TargetUnavailable, UsageError, is_runner_stop, one_line
from ..options import DEFAULT_TARGET, PADDING_ROWS_ENV, TARGET_ENV
from .target import Target, held_to
from . import vllm_release, vllm_source

VLLM_MODULE = "vllm.models.deepseek_v4.sparse_mla"
BUILTIN_TARGETS = {
    "triton": "c128a.kernels.adaptive",
    "triton-inert": "c128a.kernels.adaptive:inert",
    "reference": "c128a.contract.oracle",
    "reference-inert": "c128a.contract.oracle:inert",
    "vllm": VLLM_MODULE,
}
PROJECT_TARGETS = frozenset({*BUILTIN_TARGETS, *BUILTIN_TARGETS.values()} - {"vllm", VLLM_MODULE})
"""The project's own builders: they also check what the contract leaves open."""
DECLARED = "declared by the target"


def resolve_spec(option_value: str | None, option: str = "--c128a-target") -> tuple[str, str]:
    """(spec, where it came from): the option wins over the environment. A
    value that is given but empty or blank (``--c128a-target=$SPEC`` with
    ``$SPEC`` unset, ``C128A_TARGET=``) is a :class:`~c128a.failures.TargetSpecError`:
    it names no target, and testing the default in its place would pass for
    the target meant."""
    if option_value is not None:
        return given_spec(option_value, option), option
    env_value = os.environ.get(TARGET_ENV)
    if env_value is not None:
        return given_spec(env_value, f"${TARGET_ENV}"), f"${TARGET_ENV}"
    return DEFAULT_TARGET, "default"


def given_spec(value: str, origin: str) -> str:
    """``value`` stripped; refused when nothing is left, naming ``origin``."""
    spec = value.strip()
    if not spec:
        leave_out = (f"unset {origin[1:]}" if origin.startswith("$")
                     else f"leave {origin} out")
        raise TargetSpecError(
            f"{origin}={value!r} names no target (an unset variable in a command line gives "
            f"this); name one ({', '.join(BUILTIN_TARGETS)}, vllm-release:VERSION, MODULE or "
            f"MODULE:ATTR), or {leave_out} to test the default, {DEFAULT_TARGET}"
        )
    return spec


def resolve_padding_rows(
    option_value: str | None, option: str = "--c128a-padding-rows"
) -> tuple[str | None, str]:
    """(variant, where it came from) the target is held to: the option, else
    ``$C128A_PADDING_ROWS``, else (None, "declared by the target"). A value
    that names no variant is a :class:`~c128a.failures.TargetSpecError`
    naming where it came from."""
    if option_value:
        return check_padding_rows(option_value.strip(), option), f"from {option}"
    env_value = os.environ.get(PADDING_ROWS_ENV, "").strip()
    if env_value:
        return check_padding_rows(env_value, f"${PADDING_ROWS_ENV}"), f"from ${PADDING_ROWS_ENV}"
    return None, DECLARED


def import_object(spec: str, what: str = "spec", error: type[UsageError] = UsageError):
    """``MODULE`` or ``MODULE:ATTR.ATTR`` to the object it names; ``error``
    (naming ``what``) when the module or an attribute is missing, or when
    importing the module or reading an attribute raises: code that breaks
    before the run starts is a bad spec, never a failure of a target."""
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
    except BaseException as exc:  # noqa: BLE001 - the module's own code raised
        # Not only an Exception: SystemExit, pytest's Skipped (importorskip at
        # the top of a kernel repository's module), GeneratorExit, a class of its own.
        if is_runner_stop(exc):
            raise  # Ctrl-C, or a signal to the run: the front end says so in one line
        raise error(
            f"{what} {spec!r}: importing module {module_name!r} raised {one_line(exc)}; "
            "fix the module or name another"
        ) from exc
    for part in filter(None, attr_path.split(".")):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise error(f"{what} {spec!r}: {module_name!r} has no attribute {attr_path!r}") from exc
        except BaseException as exc:  # noqa: BLE001 - a property or __getattr__ raised
            if is_runner_stop(exc):
                raise
            raise error(
                f"{what} {spec!r}: reading attribute {part!r} of {module_name!r} raised "
                f"{one_line(exc)}; fix the module or name another"
            ) from exc
    return obj


def import_mapping(spec: str, what: str, example: str):
    """The mapping ``spec`` names (a ``--properties`` dict); any other object
    is a :class:`~c128a.failures.UsageError` naming ``what`` and ``example``."""
    return check_mapping(import_object(spec, what), spec, what, example)


def check_mapping(obj, spec: str, what: str, example: str):
    """``obj``, which ``spec`` named, when it is a mapping; else a
    :class:`~c128a.failures.UsageError` naming ``what`` and ``example``."""
    if not isinstance(obj, Mapping):
        raise UsageError(
            f"{what} {spec!r} names a {type(obj).__name__}, not a dict of names; "
            f"name a dict such as {example}"
        )
    return obj


def load_target(spec: str, padding_rows: str | None = None) -> Target:
    """Import the target named by ``spec`` and check its shape; held to the
    ``padding_rows`` variant where given (None: the one it declares)."""
    return held_to(_load(spec.strip()), padding_rows)


def _load(spec: str) -> Target:
    prefix = spec.partition(":")[0]
    if prefix in PREFIX_LOADERS:
        return PREFIX_LOADERS[prefix](spec)
    if spec == "vllm":
        return _load_vllm()
    obj = import_object(BUILTIN_TARGETS.get(spec, spec), "target spec", TargetSpecError)
    return Target.from_object(spec, obj)


def _load_vllm() -> Target:
    """vLLM's own builder, from the vLLM installed here."""
    try:
        module = importlib.import_module(VLLM_MODULE)
    except ImportError as exc:
        raise TargetUnavailable(f"vllm target not importable: {exc!r}") from exc
    except BaseException as exc:  # noqa: BLE001 - vLLM's own import raised
        if is_runner_stop(exc):
            raise
        raise TargetUnavailable(
            f"vllm target: importing {VLLM_MODULE} raised {one_line(exc)}"
        ) from exc
    if not callable(getattr(module, "build_c128a_topk_metadata", None)):
        raise TargetUnavailable(
            f"{VLLM_MODULE} has no callable build_c128a_topk_metadata; this vLLM "
            "predates the C128A builder"
        )
    # vLLM checks with assert, which python -O strips.
    return Target.from_object("vllm", module, validates_input=False)


PREFIX_LOADERS = {
    vllm_release.PREFIX: vllm_release.load_vllm_release,
    vllm_source.PREFIX: vllm_source.load_vllm_source,
}
"""The spec forms read by a loader of their own, by prefix (the prefix alone,
or ``PREFIX:ARGUMENT``); a spec with none of them is ``vllm`` or an import
(``MODULE[:ATTR]``, a built-in name first translated)."""


def is_project_target(target) -> bool:
    """The project's own targets also check what the contract does not oblige
    a third-party builder to check (dtypes, devices, counts, table rows)."""
    return str(getattr(target, "spec", "")) in PROJECT_TARGETS
