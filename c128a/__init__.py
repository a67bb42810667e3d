"""c128a: property-based tests and fuzzing for the C128A top-k metadata kernel.

This facade re-exports what does not import Triton kernels. The kernel lives
in :mod:`c128a.kernel`; import it after :func:`c128a.device.use_device`.
"""

from .device import DeviceError, use_device
from .policy import COMPRESS_RATIO, active_topk_width, capacity_width, reachable_widths
from .reference import attended_lengths
from .targets import Target, TargetSpecError, TargetUnavailable, load_target, resolve_spec
from .validation import InvalidArgument

__all__ = [
    "COMPRESS_RATIO",
    "DeviceError",
    "InvalidArgument",
    "Target",
    "TargetSpecError",
    "TargetUnavailable",
    "active_topk_width",
    "attended_lengths",
    "capacity_width",
    "load_target",
    "reachable_widths",
    "resolve_spec",
    "use_device",
]
__version__ = "0.1.0"
