"""The former home of the compute-sanitizer runs, kept so that code importing
``c128a.runners.sanitizer`` (or running it with ``python -m``) still works:
it is :mod:`c128a.gpu.compute_sanitizer`."""

from __future__ import annotations

import sys

from ..gpu.compute_sanitizer import *  # noqa: F403 - the same module, by its former name
from ..gpu.compute_sanitizer import _child

if __name__ == "__main__":
    sys.exit(_child())
