"""The contract's function around a Triton launcher."""

from __future__ import annotations

from typing import Callable

from ..contract import (
    SLOTS,
    BuildArgs,
    Views,
    check_build_arguments,
    contract_builder,
    returned_views,
)
from ..failures import BadArgument
from . import INTERPRETED

MAX_WIDTH = 1 << 22
"""The project's kernels compute columns exactly below this width."""


def tensor_arguments(args: BuildArgs) -> tuple:
    """The tensors every kernel here takes first, in their kernels' order:
    positions, request indices, block table, slot mapping, the three buffers."""
    return (
        args.positions,
        args.token_to_req_indices,
        args.block_table,
        args.slot_mapping,
        args.global_decode_buffer,
        args.decode_lens_buffer,
        args.prefill_buffer,
    )


def row_strides(args: BuildArgs) -> tuple[int, int, int]:
    """The row strides of the block table, the decode and the prefill buffer."""
    return (
        args.block_table.stride(0),
        args.global_decode_buffer.stride(0),
        args.prefill_buffer.stride(0),
    )


def triton_builder(
    launch: Callable[[BuildArgs], None],
    name: str = "build_c128a_topk_metadata",
    padding_rows: str = SLOTS,
):
    """vLLM's ``build_c128a_topk_metadata`` around ``launch(args)``: every
    argument validated first (under the ``padding_rows`` variant the kernel
    writes; nothing is written on a bad call), then the launch, then the
    buffer views."""

    def build(args: BuildArgs) -> Views:
        check_build_arguments(args, padding_rows)
        if args.max_compressed_tokens >= MAX_WIDTH:
            raise BadArgument(
                f"max_compressed_tokens={args.max_compressed_tokens} must be < {MAX_WIDTH} for "
                "the Triton kernels (their column arithmetic is exact below it)"
            )
        if args.positions.device.type == "cpu" and not INTERPRETED:
            raise BadArgument(
                "positions is on the CPU but Triton's interpreter is off; set TRITON_INTERPRET=1 "
                "before importing Triton kernels (c128a.targets.use_device('cpu') does this)"
            )
        launch(args)
        return returned_views(args)

    return contract_builder(build, name)
