"""c128a: property-based tests and fuzzing for the C128A top-k metadata kernel.

The package reads in one direction (docs/explanation/layout.md): ``contract`` (what is
tested) and ``step`` (one engine step) at the bottom, then ``kernels``,
``mutants`` and ``targets`` (what can be tested), ``strategies``, ``checks``,
``replay`` and ``gpu`` (how), the failure ``cases``, and the tools on top:
``runners``, ``cli`` and the pytest ``plugin``. This facade re-exports what imports no Triton kernel:
kernels are decorated when imported, so choose the device first
(:func:`use_device`; Triton's interpreter on the CPU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# The names of the facade, by the module they live in. They are imported on
# first use (PEP 562), so that ``import c128a.cli`` imports no torch: a Ctrl-C
# while the command line starts up then reaches its handler, not a traceback.
_FROM_CONTRACT = frozenset({
    "COMPRESS_RATIO", "active_topk_width", "attended_lengths", "capacity_width",
    "reachable_widths",
})
_FROM_FAILURES = frozenset({
    "BadArgument", "ContractViolation", "DeviceError", "HarnessError", "TargetSpecError",
    "TargetUnavailable", "UsageError",
})
_FROM_TARGETS = frozenset({"Target", "load_target", "resolve_spec", "use_device"})

if TYPE_CHECKING:
    from .contract import COMPRESS_RATIO, active_topk_width, attended_lengths, capacity_width
    from .contract import reachable_widths
    from .failures import (
        BadArgument,
        ContractViolation,
        DeviceError,
        HarnessError,
        TargetSpecError,
        TargetUnavailable,
        UsageError,
    )
    from .targets import Target, load_target, resolve_spec, use_device


def __getattr__(name: str):
    if name in _FROM_CONTRACT:
        from . import contract as module
    elif name in _FROM_FAILURES:
        from . import failures as module
    elif name in _FROM_TARGETS:
        from . import targets as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | _FROM_CONTRACT | _FROM_FAILURES | _FROM_TARGETS)


__all__ = [
    "COMPRESS_RATIO",
    "BadArgument",
    "ContractViolation",
    "DeviceError",
    "HarnessError",
    "Target",
    "TargetSpecError",
    "TargetUnavailable",
    "UsageError",
    "active_topk_width",
    "attended_lengths",
    "capacity_width",
    "load_target",
    "reachable_widths",
    "resolve_spec",
    "use_device",
]
__version__ = "0.1.0"
