"""What a run checks: the property registry and the serving-loop machine.

Both are named by ``MODULE:ATTR`` (``--properties``, ``--machine``; a fuzz
run's worker and a replay name them again). The defaults,
:data:`~c128a.options.DEFAULT_PROPERTIES` and
:data:`~c128a.options.DEFAULT_MACHINE`, are the project's own and are
imported plainly here, so the layer check sees them; any other name is a
user's and is imported by name (:func:`~c128a.targets.import_object`). Both
import torch: call them once the device is chosen.
"""

from __future__ import annotations

from .options import DEFAULT_MACHINE, DEFAULT_PROPERTIES
from .targets import import_object


def load_properties(spec: str | None = None, what: str = "--properties"):
    """The property registry ``spec`` names (None: the default); a
    :class:`~c128a.failures.UsageError` naming ``what`` where it cannot be
    imported. Its type is the caller's to check."""
    if spec is None or spec == DEFAULT_PROPERTIES:
        from .checks import PROPERTIES

        return PROPERTIES
    return import_object(spec, what)


def load_machine(spec: str | None = None, what: str = "--machine"):
    """The serving-loop machine factory ``spec`` names (None: the default),
    as :func:`load_properties` does."""
    if spec is None or spec == DEFAULT_MACHINE:
        from .replay import serving_loop_machine

        return serving_loop_machine
    return import_object(spec, what)
