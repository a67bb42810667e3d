"""``c128a fuzz``: every property and the serving-loop machine, for a time.

:func:`run_fuzz` runs a :class:`FuzzConfig` (:mod:`.config`): a supervising
parent (:mod:`.supervisor`) and worker processes (:mod:`.worker`) that run
rounds of the same property tests pytest runs. Failures are shrunk by
Hypothesis, remembered in the example database (``--db``: a directory, or
``redis://HOST:PORT/N`` shared across machines) and written as case files
(:mod:`c128a.runners.cases`).
"""

from .config import DEFAULT_DB, FuzzConfig, FuzzOptions, derive_seed, load_config_file, resolve
from .supervisor import REPORT_FORMAT, Supervisor, run_fuzz, summary_table, time_lines

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
