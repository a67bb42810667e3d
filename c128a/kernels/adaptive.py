"""The adaptive-width Triton kernel.

One launch writes every token's list at the active width W into buffers
whose row stride stays at the capacity C. Work scales with T * W and no lane
runs past W: below 1,024 columns programs write blocks of a few whole rows in
128-column tiles (W is a multiple of 128), from 1,024 columns one program
writes one 1,024-column run of one row. Every scalar that varies from step to
step (width, token counts, strides) is excluded from Triton's specialisation
key, and the choice between the two shapes is a runtime branch, so a
warmed-up kernel never recompiles mid-inference; the tile sizes are the only
compile-time constants and do not depend on the batch. The padding-row
variant (``inert_padding``: a padding token's decode row all -1, target
``triton-inert``) is a runtime flag too, so both variants share one compiled
kernel.

Import this module only after choosing the device: on the CPU, Triton's
interpreter must be switched on (``TRITON_INTERPRET=1``) before the kernel is
decorated. :func:`c128a.targets.use_device` does that.
"""

from __future__ import annotations

import functools
import types

import torch
import triton
import triton.language as tl

from ..contract import INERT, BuildArgs
from .builder import row_strides, tensor_arguments, triton_builder
from .compiled import interpreting

RUNTIME_SCALARS = (
    "num_tokens",
    "num_decode_tokens",
    "width",
    "compress_ratio",
    "block_size",
    "table_row_stride",
    "decode_row_stride",
    "prefill_row_stride",
    "inert_padding",
)


@triton.jit
def _divmod_small(x, divisor, inverse):
    # x // divisor and x % divisor for 0 <= x < 2**22 through one float
    # multiply and a correction: exact there, and no integer division.
    quotient = (x.to(tl.float32) * inverse).to(tl.int32)
    remainder = x - quotient * divisor
    quotient = tl.where(remainder >= divisor, quotient + 1, quotient)
    remainder = tl.where(remainder >= divisor, remainder - divisor, remainder)
    quotient = tl.where(remainder < 0, quotient - 1, quotient)
    remainder = tl.where(remainder < 0, remainder + divisor, remainder)
    return quotient, remainder


@triton.jit
def _write_tile(
    tokens,
    columns,
    lengths,
    is_token,
    num_decode_tokens,
    width,
    block_size,
    inverse_block_size,
    token_to_req_ptr,
    block_table_ptr,
    slot_mapping_ptr,
    decode_ptr,
    decode_lens_ptr,
    prefill_ptr,
    table_row_stride,
    decode_row_stride,
    prefill_row_stride,
    has_decode,
    has_prefill,
    writes_lens,
    inert_padding,
):
    # One tile: tokens [R] x columns [K]. A tile of decode tokens only skips
    # the prefill code and the other way round.
    active = columns[None, :] < lengths[:, None]
    in_width = columns < width
    if has_decode:
        is_decode = is_token & (tokens < num_decode_tokens)
        decode_active = active
        if inert_padding != 0:
            # An inert padding row has no active column: -1 up to W, no table read.
            slot_ids = tl.load(slot_mapping_ptr + tokens, mask=is_decode, other=0)
            decode_active = active & (slot_ids >= 0)[:, None]
        requests = tl.load(token_to_req_ptr + tokens, mask=is_decode, other=0).to(tl.int64)
        page_columns, offsets = _divmod_small(columns, block_size, inverse_block_size)
        # Block-table entries are read only for active columns.
        pages = tl.load(
            block_table_ptr + requests[:, None] * table_row_stride + page_columns[None, :],
            mask=is_decode[:, None] & decode_active,
            other=0,
        )
        tl.store(
            decode_ptr + tokens.to(tl.int64)[:, None] * decode_row_stride + columns[None, :],
            tl.where(decode_active, pages * block_size + offsets[None, :], -1),
            mask=is_decode[:, None] & in_width[None, :],
        )
        if writes_lens:
            slot_ids = tl.load(slot_mapping_ptr + tokens, mask=is_decode, other=0)
            tl.store(decode_lens_ptr + tokens, tl.where(slot_ids < 0, 0, lengths), mask=is_decode)
    if has_prefill:
        is_prefill = is_token & (tokens >= num_decode_tokens)
        rows = (tokens - num_decode_tokens).to(tl.int64)
        tl.store(
            prefill_ptr + rows[:, None] * prefill_row_stride + columns[None, :],
            tl.where(active, columns[None, :], -1),
            mask=is_prefill[:, None] & in_width[None, :],
        )


@triton.jit
def _write_run(
    token, columns, length, num_decode_tokens, width, block_size, inverse_block_size,
    token_to_req_ptr, block_table_ptr, slot_mapping_ptr, decode_ptr, decode_lens_ptr,
    prefill_ptr, table_row_stride, decode_row_stride, prefill_row_stride, writes_lens,
    inert_padding,
):
    # One run of one row, with scalar token values and one vector of columns:
    # the wide rows' path, lean (fewer registers than a [tokens, columns] tile).
    in_width = columns < width
    if token < num_decode_tokens:
        slot_id = tl.load(slot_mapping_ptr + token)
        # An inert padding row has no active column: -1 up to W, no table read.
        active_length = tl.where((slot_id < 0) & (inert_padding != 0), 0, length)
        active = columns < active_length
        request = tl.load(token_to_req_ptr + token).to(tl.int64)
        page_columns, offsets = _divmod_small(columns, block_size, inverse_block_size)
        # Block-table entries are read only for active columns.
        pages = tl.load(block_table_ptr + request * table_row_stride + page_columns,
                        mask=active, other=0)
        tl.store(decode_ptr + token.to(tl.int64) * decode_row_stride + columns,
                 tl.where(active, pages * block_size + offsets, -1), mask=in_width)
        if writes_lens:
            tl.store(decode_lens_ptr + token, tl.where(slot_id < 0, 0, length))
    else:
        row = (token - num_decode_tokens).to(tl.int64)
        tl.store(prefill_ptr + row * prefill_row_stride + columns,
                 tl.where(columns < length, columns, -1), mask=in_width)


@triton.jit
def _write_runs(
    positions_ptr, token_to_req_ptr, block_table_ptr, slot_mapping_ptr, decode_ptr,
    decode_lens_ptr, prefill_ptr, num_tokens, num_decode_tokens, width, compress_ratio,
    block_size, inverse_block_size, table_row_stride, decode_row_stride,
    prefill_row_stride, inert_padding, WIDE_W: tl.constexpr,
):
    # One program per (token, run of WIDE_W columns): the grid has exactly
    # T x ceil(W / WIDE_W) programs, so every program's token is real.
    chunks = tl.cdiv(width, WIDE_W)
    program = tl.program_id(0)
    token = program // chunks
    chunk = program - token * chunks
    columns = chunk * WIDE_W + tl.arange(0, WIDE_W)
    position = tl.load(positions_ptr + token)
    length = tl.minimum((position + 1) // compress_ratio, width).to(tl.int32)
    _write_run(
        token, columns, length, num_decode_tokens, width, block_size, inverse_block_size,
        token_to_req_ptr, block_table_ptr, slot_mapping_ptr, decode_ptr, decode_lens_ptr,
        prefill_ptr, table_row_stride, decode_row_stride, prefill_row_stride, chunk == 0,
        inert_padding,
    )


@triton.jit
def _write_row_blocks(
    positions_ptr, token_to_req_ptr, block_table_ptr, slot_mapping_ptr, decode_ptr,
    decode_lens_ptr, prefill_ptr, num_tokens, num_decode_tokens, width, compress_ratio,
    block_size, inverse_block_size, table_row_stride, decode_row_stride,
    prefill_row_stride, inert_padding, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr,
):
    # Programs stride over blocks of BLOCK_T tokens, BLOCK_W columns a tile.
    num_blocks = tl.cdiv(num_tokens, BLOCK_T)
    step = tl.num_programs(0)
    block = tl.program_id(0)
    tokens = block * BLOCK_T + tl.arange(0, BLOCK_T)
    positions = tl.load(positions_ptr + tokens, mask=tokens < num_tokens, other=0)
    while block < num_blocks:
        # Fetch the next block's positions before writing this one, so the
        # load's latency hides behind the stores.
        next_tokens = tokens + step * BLOCK_T
        next_positions = tl.load(positions_ptr + next_tokens, mask=next_tokens < num_tokens, other=0)
        # One division per token, not per element; n(t) <= W fits 32 bits.
        lengths = tl.minimum((positions + 1) // compress_ratio, width).to(tl.int32)
        first_token = block * BLOCK_T
        for start in range(0, width, BLOCK_W):
            _write_tile(
                tokens, start + tl.arange(0, BLOCK_W), lengths, tokens < num_tokens,
                num_decode_tokens, width, block_size, inverse_block_size,
                token_to_req_ptr, block_table_ptr, slot_mapping_ptr, decode_ptr,
                decode_lens_ptr, prefill_ptr, table_row_stride, decode_row_stride,
                prefill_row_stride, first_token < num_decode_tokens,
                first_token + BLOCK_T > num_decode_tokens, start == 0, inert_padding,
            )
        block += step
        tokens = next_tokens
        positions = next_positions


@triton.jit(do_not_specialize=RUNTIME_SCALARS)
def c128a_topk_kernel(
    positions_ptr,
    token_to_req_ptr,
    block_table_ptr,
    slot_mapping_ptr,
    decode_ptr,
    decode_lens_ptr,
    prefill_ptr,
    num_tokens,
    num_decode_tokens,
    width,
    compress_ratio,
    block_size,
    table_row_stride,
    decode_row_stride,
    prefill_row_stride,
    inert_padding,
    BLOCK_T: tl.constexpr,
    BLOCK_W: tl.constexpr,
    WIDE_W: tl.constexpr,
):
    # Two shapes of work in one compiled kernel, chosen by a runtime branch on
    # W (a constexpr would compile one variant per width):
    # - W >= WIDE_W: one program per (token, WIDE_W columns), so long rows are
    #   written in long contiguous runs and each block-table gather has many
    #   loads in flight;
    # - W < WIDE_W: programs stride over blocks of BLOCK_T tokens and write
    #   each row in BLOCK_W-column tiles, so no lane idles (W is a multiple of
    #   128) and the rows in flight stay neighbours in memory.
    inverse_block_size = 1.0 / block_size.to(tl.float32)
    if width >= WIDE_W:
        _write_runs(
            positions_ptr, token_to_req_ptr, block_table_ptr, slot_mapping_ptr, decode_ptr,
            decode_lens_ptr, prefill_ptr, num_tokens, num_decode_tokens, width, compress_ratio,
            block_size, inverse_block_size, table_row_stride, decode_row_stride,
            prefill_row_stride, inert_padding, WIDE_W,
        )
    else:
        _write_row_blocks(
            positions_ptr, token_to_req_ptr, block_table_ptr, slot_mapping_ptr, decode_ptr,
            decode_lens_ptr, prefill_ptr, num_tokens, num_decode_tokens, width, compress_ratio,
            block_size, inverse_block_size, table_row_stride, decode_row_stride,
            prefill_row_stride, inert_padding, BLOCK_T, BLOCK_W,
        )


# (BLOCK_T, BLOCK_W, WIDE_W). The interpreter pays per program and per loop
# step, not per element: wide tiles there. The GPU tile's code paths also run
# under the interpreter in tests/test_kernel_paths.py.
GPU_TILE = (4, 128, 1024)
INTERPRETER_TILE = (32, 1024, 1024)
INTERPRETING = interpreting(c128a_topk_kernel)
TILE = INTERPRETER_TILE if INTERPRETING else GPU_TILE
# Warps below and from WIDE_W: two compiled variants, both compiled by the
# first launch (an engine's warm-up), so no width compiles anything later.
# On the H200 (GPU time, one run of each): two warps are faster for row
# blocks (prefill 8,192 at W = 256: 3.60 against 4.10 us), four for long
# rows (decode 4,096 @ 1M at W = 8,192: 61.2 against 69.8 us; decode 512 @
# 128K: 2.56 against 3.08 us).
NUM_WARPS = 2
WIDE_NUM_WARPS = 4
PROGRAMS_PER_SM = 16  # persistent programs per multiprocessor below WIDE_W; 0: one a block
MAX_REGISTERS = None  # registers per thread: the compiler's choice

_sm_counts: dict[int, int] = {}
_both_compiled: set = set()  # launch configurations whose two warp variants are compiled


def _multiprocessors(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _sm_counts:
        _sm_counts[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _sm_counts[index]


def launch_tiled(
    args: BuildArgs,
    *,
    tile: tuple[int, int, int],
    num_warps: int,
    programs_per_sm: int,
    max_programs: int | None = None,
    max_registers: int | None = None,
    inert_padding: bool = False,
    wide_num_warps: int | None = None,
) -> None:
    """:func:`launch` with an explicit tile, warp counts and persistence (for
    tuning). None of these depends on the batch. ``num_warps`` is for
    widths below WIDE_W, ``wide_num_warps`` (``num_warps`` when None) from
    it; when they differ, the first launch compiles both. ``max_programs`` caps the
    persistent grid below WIDE_W on any device, so that tests can run its
    grid-stride loop on the CPU; ``max_registers`` caps registers per thread
    (Triton's ``maxnreg``; None leaves the choice to the compiler);
    ``inert_padding`` writes padding tokens' decode rows all -1 (the
    ``inert`` variant)."""
    num_tokens = args.num_tokens
    width = args.max_compressed_tokens
    if num_tokens == 0:
        return
    block_t, block_w, wide_w = tile
    # Plain integer ceilings: this runs on every step, and triton.cdiv (a
    # constexpr function) costs microseconds of host time a call.
    if width >= wide_w:
        programs = num_tokens * -(-width // wide_w)
    else:
        programs = -(-num_tokens // block_t)
        device = args.positions.device
        if programs_per_sm and device.type == "cuda":
            programs = min(programs, programs_per_sm * _multiprocessors(device))
        if max_programs:
            programs = min(programs, max_programs)
    kernel_args = (
        *tensor_arguments(args),
        num_tokens,
        args.num_decode_tokens,
        width,
        args.compress_ratio,
        args.block_size,
        *row_strides(args),
        int(inert_padding),
    )
    options = {
        "BLOCK_T": block_t,
        "BLOCK_W": block_w,
        "WIDE_W": wide_w,
        # Only when set: a fixed cap is one more compile option, not a variant per batch.
        **({"maxnreg": max_registers} if max_registers else {}),
    }
    wide_num_warps = num_warps if wide_num_warps is None else wide_num_warps
    warps, other = (wide_num_warps, num_warps) if width >= wide_w else (num_warps, wide_num_warps)
    if other != warps and not INTERPRETING:
        key = (args.positions.device, tile, num_warps, wide_num_warps, max_registers)
        if key not in _both_compiled:
            # The first launch compiles the other path's variant too (without
            # running it), so that a later width never compiles mid-inference.
            c128a_topk_kernel.warmup(*kernel_args, grid=(1,), num_warps=other, **options)
            _both_compiled.add(key)
    c128a_topk_kernel[(programs,)](*kernel_args, num_warps=warps, **options)


def launch(args: BuildArgs, inert_padding: bool = False) -> None:
    """Launch without validation (benchmarks); callers guarantee the contract."""
    launch_tiled(
        args,
        tile=TILE,
        num_warps=NUM_WARPS,
        wide_num_warps=WIDE_NUM_WARPS,
        programs_per_sm=PROGRAMS_PER_SM,
        max_registers=MAX_REGISTERS,
        inert_padding=inert_padding,
    )


jit_functions = (c128a_topk_kernel,)
"""The Triton functions this target launches (the recompile check counts their variants)."""

build_c128a_topk_metadata = triton_builder(launch)
"""The contract's function around a Triton launcher."""

inert = types.SimpleNamespace(
    build_c128a_topk_metadata=triton_builder(
        functools.partial(launch, inert_padding=True), "inert", INERT
    ),
    padding_rows=INERT,
    jit_functions=jit_functions,
)
"""The same kernel under the ``inert`` padding-row variant (target ``triton-inert``)."""
