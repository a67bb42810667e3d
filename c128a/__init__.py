"""c128a: property-based tests and fuzzing for the C128A top-k metadata kernel.

The package reads in one direction (README, "Layout"): ``contract`` (what is
tested) and ``step`` (one engine step) at the bottom, then ``kernels``,
``mutants`` and ``targets`` (what can be tested), ``strategies``, ``checks``
and ``replay`` (how), and the tools on top: ``runners``, ``cli`` and the
pytest ``plugin``. This facade re-exports what imports no Triton kernel:
kernels are decorated when imported, so choose the device first
(:func:`use_device`; Triton's interpreter on the CPU).
"""

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
