"""``c128a fuzz``: every property and the serving-loop machine, for a time.

:func:`run_fuzz` runs a :class:`FuzzConfig` (:mod:`.config`): a supervising
parent (:mod:`.supervisor`) and worker processes (:mod:`.worker`) that run
rounds of the same property tests pytest runs, talking in the messages of
:mod:`.protocol`; the parent keeps the cases in a :class:`~.casebook.CaseBook`
and shows and reports the run with :mod:`.report`. Failures are shrunk by
Hypothesis, remembered in the example database (``--db``: a directory, or
``redis://HOST:PORT/N`` shared across machines) and written as case files
(:mod:`c128a.cases`).
"""

from .config import DEFAULT_DB, FuzzConfig, FuzzOptions, derive_seed, load_config_file, resolve
from .report import REPORT_FORMAT, summary_table, time_lines
from .supervisor import Supervisor, run_fuzz

__all__ = [
    "DEFAULT_DB",
    "REPORT_FORMAT",
    "FuzzConfig",
    "FuzzOptions",
    "Supervisor",
    "derive_seed",
    "load_config_file",
    "resolve",
    "run_fuzz",
    "summary_table",
    "time_lines",
]
