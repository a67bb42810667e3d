"""What can be tested: a target (the builder and its policy) named by a spec,
and the device its kernels run on."""

from .device import DEVICE_ENV, default_device, interpreter_on, use_device
from .specs import (
    BUILTIN_TARGETS,
    DEFAULT_TARGET,
    PADDING_ROWS_ENV,
    TARGET_ENV,
    check_mapping,
    import_mapping,
    import_object,
    is_project_target,
    load_target,
    resolve_padding_rows,
    resolve_spec,
)
from .target import Target, held_to

__all__ = [
    "BUILTIN_TARGETS",
    "DEFAULT_TARGET",
    "DEVICE_ENV",
    "PADDING_ROWS_ENV",
    "TARGET_ENV",
    "Target",
    "check_mapping",
    "default_device",
    "held_to",
    "import_mapping",
    "import_object",
    "interpreter_on",
    "is_project_target",
    "load_target",
    "resolve_padding_rows",
    "resolve_spec",
    "use_device",
]
