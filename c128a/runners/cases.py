"""The former home of failure cases, kept so that code importing
``c128a.runners.cases`` still works: the cases are :mod:`c128a.cases`, the
atomic writes and path checks :mod:`c128a.files`. New code imports those."""

from __future__ import annotations

from ..cases import *  # noqa: F403 - this module is the package under its former name
from ..cases import __all__ as _CASES
from ..files import atomic_write_json, output_file_problem, readable_json, regular_file_problem
from ..options import DEFAULT_CASES_DIR

__all__ = sorted([*_CASES, "DEFAULT_CASES_DIR", "atomic_write_json", "output_file_problem",
                  "readable_json", "regular_file_problem"])
