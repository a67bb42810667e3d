"""Builder faults where two dimensions meet: each is right for either value
alone and wrong only in one cell of a pair (:mod:`c128a.strategies.pairs`),
as a kernel that branches on both at once would be."""

from __future__ import annotations

from ..contract import BuildArgs, Views
from ..contract import check_build_arguments as validated
from .builders import rows_of, write_and_return
from .registry import builder_mutant

STAGED_ROWS = 256
STAGED_COLUMNS = 16


@builder_mutant(
    "stages a block table of at most 16 columns in a scratch of 256 rows x 16 columns "
    "(enough for the engine's usual steps): rows of requests past 256 read page 0",
    "more than 256 requests",
    ("adaptive_equals_full",),
)
def _build_staged_table_of_256_rows(args: BuildArgs) -> Views:
    validated(args)
    table = args.block_table
    if 0 < table.shape[1] <= STAGED_COLUMNS and table.shape[0] > STAGED_ROWS:
        table = table.clone()
        table[STAGED_ROWS:] = 0
    return write_and_return(args, rows_of(args, table=table))
