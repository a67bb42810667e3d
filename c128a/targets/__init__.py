"""What can be tested: a target (the builder and its policy) named by a spec,
and the device its kernels run on."""

from .device import DEVICE_ENV, default_device, interpreter_on, use_device
from .specs import (
    BUILTIN_TARGETS,
    DEFAULT_TARGET,
    TARGET_ENV,
    import_object,
    is_project_target,
    load_target,
    resolve_spec,
)
from .target import Target

__all__ = [
    "BUILTIN_TARGETS",
    "DEFAULT_TARGET",
    "DEVICE_ENV",
    "TARGET_ENV",
    "Target",
    "default_device",
    "import_object",
    "interpreter_on",
    "is_project_target",
    "load_target",
    "resolve_spec",
    "use_device",
]
