"""The baseline kernel the project's kernel is measured against.

The plain design of this builder: one program per token, sweeping the row in
1,024-wide column blocks with the active width W as the loop bound. Below
W = 1,024 most lanes of every block are masked off, and a program writes one
row only, so small widths pay a launch's worth of scheduling per token. It is
exact (the same contract as :mod:`c128a.kernels.adaptive`) and takes the same runtime
scalars out of Triton's specialisation key, so the two are compared on equal
terms: what differs is only the shape of the work.

Import this module only after choosing the device
(:func:`c128a.targets.use_device`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..contract import BuildArgs
from .builder import row_strides, tensor_arguments, triton_builder

COLUMN_BLOCK = 1024

RUNTIME_SCALARS = (
    "num_decode_tokens",
    "width",
    "compress_ratio",
    "block_size",
    "table_row_stride",
    "decode_row_stride",
    "prefill_row_stride",
)


@triton.jit(do_not_specialize=RUNTIME_SCALARS)
def baseline_topk_kernel(
    positions_ptr,
    token_to_req_ptr,
    block_table_ptr,
    slot_mapping_ptr,
    decode_ptr,
    decode_lens_ptr,
    prefill_ptr,
    num_decode_tokens,
    width,
    compress_ratio,
    block_size,
    table_row_stride,
    decode_row_stride,
    prefill_row_stride,
    COLUMNS: tl.constexpr,
):
    token = tl.program_id(0)
    position = tl.load(positions_ptr + token)
    length = tl.minimum((position + 1) // compress_ratio, width)
    lanes = tl.arange(0, COLUMNS)
    if token < num_decode_tokens:
        request = tl.load(token_to_req_ptr + token).to(tl.int64)
        table_row = block_table_ptr + request * table_row_stride
        out_row = decode_ptr + token.to(tl.int64) * decode_row_stride
        for start in range(0, width, COLUMNS):
            columns = start + lanes
            active = columns < length
            pages = tl.load(table_row + columns // block_size, mask=active, other=0)
            slots = pages * block_size + columns % block_size
            tl.store(out_row + columns, tl.where(active, slots, -1), mask=columns < width)
        slot_id = tl.load(slot_mapping_ptr + token)
        tl.store(decode_lens_ptr + token, tl.where(slot_id < 0, 0, length).to(tl.int32))
    else:
        out_row = prefill_ptr + (token - num_decode_tokens).to(tl.int64) * prefill_row_stride
        for start in range(0, width, COLUMNS):
            columns = start + lanes
            tl.store(out_row + columns, tl.where(columns < length, columns, -1), mask=columns < width)


def launch(args: BuildArgs) -> None:
    """Launch without validation (benchmarks); callers guarantee the contract."""
    num_tokens = args.num_tokens
    if num_tokens == 0:
        return
    baseline_topk_kernel[(num_tokens,)](
        *tensor_arguments(args),
        args.num_decode_tokens,
        args.max_compressed_tokens,
        args.compress_ratio,
        args.block_size,
        *row_strides(args),
        COLUMNS=COLUMN_BLOCK,
    )


jit_functions = (baseline_topk_kernel,)
"""The Triton functions this target launches."""

build_c128a_topk_metadata = triton_builder(launch)
