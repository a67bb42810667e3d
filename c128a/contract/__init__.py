"""The contract under test (CONTRACT.md): its sizes, the kernel-level call,
the width policy, the oracle, the padding-row variants and the argument checks."""

from .call import BUILD_FUNCTION, BuildArgs, Views, contract_builder, returned_views
from .oracle import attended_lengths, write_metadata
from .padding_rows import (
    DEFAULT_PADDING_ROWS,
    INERT,
    PADDING_ROWS,
    SLOTS,
    PaddingRows,
    check_padding_rows,
    padding_rows_of,
)
from .policy import (
    active_topk_width,
    capacity_only,
    capacity_width,
    reachable_widths,
    target_capacity,
    target_reachable_widths,
    target_width,
)
from .sizes import (
    BLOCK_SIZE,
    COMPRESS_RATIO,
    DEFAULT_WIDTH,
    MAX_CAPACITY,
    MAX_MODEL_LEN,
    MAX_QUERY_TOKENS_PER_DECODE,
    PAGE_TOKENS,
    SENTINEL,
    WIDTH_ALIGNMENT,
)
from .validation import check_build_arguments

__all__ = [
    "BLOCK_SIZE",
    "BUILD_FUNCTION",
    "COMPRESS_RATIO",
    "DEFAULT_PADDING_ROWS",
    "DEFAULT_WIDTH",
    "INERT",
    "MAX_CAPACITY",
    "MAX_MODEL_LEN",
    "MAX_QUERY_TOKENS_PER_DECODE",
    "PADDING_ROWS",
    "PAGE_TOKENS",
    "SENTINEL",
    "SLOTS",
    "WIDTH_ALIGNMENT",
    "BuildArgs",
    "PaddingRows",
    "Views",
    "active_topk_width",
    "attended_lengths",
    "capacity_only",
    "capacity_width",
    "check_build_arguments",
    "check_padding_rows",
    "contract_builder",
    "padding_rows_of",
    "reachable_widths",
    "target_capacity",
    "target_reachable_widths",
    "target_width",
    "returned_views",
    "write_metadata",
]
