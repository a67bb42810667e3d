"""The adaptive-width Triton kernels.

One launch writes every token's list at the active width W into buffers
whose row stride stays at the capacity C. Work scales with T * W and no lane
runs past W. Two Triton kernels share the work, chosen on the host by W:

- below W = 1,024, :func:`c128a_row_blocks_kernel`: programs write blocks of
  a few whole rows in 128-column tiles (W is a multiple of 128), a small
  batch one row a program;
- from W = 1,024, :func:`c128a_wide_rows_kernel`: one program writes one
  decode row in 1,024-column steps, or one 1,024-column run of a prefill row.

Every scalar that varies from step to step (width, token counts, strides,
block size) is excluded from Triton's specialisation key, so a warmed-up
kernel never recompiles mid-inference: the tile sizes are the only
compile-time constants and do not depend on the batch, and on a GPU the
first launch compiles all three variants (row blocks, single rows, wide
rows). The padding-row variant (``inert_padding``: a padding token's decode
row all -1, target ``triton-inert``) is a runtime flag too, so both
variants share the compiled kernels.

Import this module only after choosing the device: on the CPU, Triton's
interpreter must be switched on (``TRITON_INTERPRET=1``) before the kernel is
decorated. :func:`c128a.targets.use_device` does that.
"""

from __future__ import annotations

import functools
import inspect
import types
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..contract import INERT, BuildArgs, capacity_width
from .builder import row_strides, tensor_arguments, triton_builder
from .compiled import interpreting
from .vllm_shims import LAUNCH_OBSERVERS, report_launch

ROW_BLOCK_SCALARS = (
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
WIDE_ROW_SCALARS = (
    "num_decode_tokens",
    "width",
    "compress_ratio",
    "block_size",
    "block_shift",
    "table_row_stride",
    "decode_row_stride",
    "prefill_row_stride",
    "inert_padding",
)
RUNTIME_SCALARS = {"row blocks": ROW_BLOCK_SCALARS, "wide rows": WIDE_ROW_SCALARS}
"""Each kernel's runtime scalars, all left out of Triton's specialisation key."""
INPUT_POINTERS = ("positions_ptr", "token_to_req_ptr", "block_table_ptr", "slot_mapping_ptr")
"""The inputs' pointers, left out of the key too: an engine hands slices of
its persistent tensors, 16-byte aligned or not, and a key holding their
alignment would compile during inference at the first unaligned one."""


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
def _slot_ids(table_row, columns, active, block_size, block_shift, inverse_block_size):
    # Slot id of each column: block-table entry * B + column % B, the entry
    # read only where active. A power-of-two B (block_shift >= 0; every
    # block size vLLM ships) takes a shift and a mask, faster than the
    # division (docs/measurements.md, "Measurements behind the code's choices"), any other
    # B the float division: a runtime branch, both in the one compiled kernel.
    if block_shift >= 0:
        pages = tl.load(table_row + (columns >> block_shift), mask=active, other=0)
        slots = pages * block_size + (columns & (block_size - 1))
    else:
        page_columns, offsets = _divmod_small(columns, block_size, inverse_block_size)
        pages = tl.load(table_row + page_columns, mask=active, other=0)
        slots = pages * block_size + offsets
    return slots


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
        # No shift (block_shift -1): the float division, as these rows were tuned with.
        slots = _slot_ids(
            block_table_ptr + requests[:, None] * table_row_stride, columns[None, :],
            is_decode[:, None] & decode_active, block_size, -1, inverse_block_size,
        )
        tl.store(
            decode_ptr + tokens.to(tl.int64)[:, None] * decode_row_stride + columns[None, :],
            tl.where(decode_active, slots, -1),
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


@triton.jit(do_not_specialize=ROW_BLOCK_SCALARS + INPUT_POINTERS)
def c128a_row_blocks_kernel(
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
):
    # W < WIDE_W: programs stride over blocks of BLOCK_T tokens and write
    # each row in BLOCK_W-column tiles, so no lane idles (W is a multiple of
    # 128) and the rows in flight stay neighbours in memory.
    inverse_block_size = 1.0 / block_size.to(tl.float32)
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


@triton.jit
def _write_decode_row(
    token, positions_ptr, width, compress_ratio, block_size, block_shift, inverse_block_size,
    token_to_req_ptr, block_table_ptr, slot_mapping_ptr, decode_ptr, decode_lens_ptr,
    table_row_stride, decode_row_stride, inert_padding, WIDE_W: tl.constexpr,
):
    # One whole decode row, WIDE_W columns a step: its position, request and
    # slot are read once, and its block-table gathers follow one another
    # (faster than a program per WIDE_W-column run: docs/measurements.md, "Measurements
    # behind the code's choices").
    position = tl.load(positions_ptr + token)
    length = tl.minimum((position + 1) // compress_ratio, width).to(tl.int32)
    slot_id = tl.load(slot_mapping_ptr + token)
    # An inert padding row has no active column: -1 up to W, no table read.
    active_length = tl.where((slot_id < 0) & (inert_padding != 0), 0, length)
    request = tl.load(token_to_req_ptr + token).to(tl.int64)
    table_row = block_table_ptr + request * table_row_stride
    out_row = decode_ptr + token.to(tl.int64) * decode_row_stride
    for start in range(0, width, WIDE_W):
        columns = start + tl.arange(0, WIDE_W)
        active = columns < active_length
        slots = _slot_ids(table_row, columns, active, block_size, block_shift, inverse_block_size)
        tl.store(out_row + columns, tl.where(active, slots, -1), mask=columns < width)
    tl.store(decode_lens_ptr + token, tl.where(slot_id < 0, 0, length))


@triton.jit(do_not_specialize=WIDE_ROW_SCALARS + INPUT_POINTERS)
def c128a_wide_rows_kernel(
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
    block_shift,
    table_row_stride,
    decode_row_stride,
    prefill_row_stride,
    inert_padding,
    WIDE_W: tl.constexpr,
):
    # W >= WIDE_W. The grid has exactly D + (T - D) x ceil(W / WIDE_W)
    # programs: one per decode row, then one per (prefill row, run of WIDE_W
    # columns), so every program's token is real and long rows are written
    # in long contiguous runs.
    program = tl.program_id(0)
    if program < num_decode_tokens:
        _write_decode_row(
            program, positions_ptr, width, compress_ratio, block_size, block_shift,
            1.0 / block_size.to(tl.float32), token_to_req_ptr, block_table_ptr,
            slot_mapping_ptr, decode_ptr, decode_lens_ptr, table_row_stride,
            decode_row_stride, inert_padding, WIDE_W,
        )
    else:
        chunks = tl.cdiv(width, WIDE_W)
        run = program - num_decode_tokens
        row = run // chunks
        position = tl.load(positions_ptr + num_decode_tokens + row)
        length = tl.minimum((position + 1) // compress_ratio, width).to(tl.int32)
        columns = (run - row * chunks) * WIDE_W + tl.arange(0, WIDE_W)
        tl.store(prefill_ptr + row.to(tl.int64) * prefill_row_stride + columns,
                 tl.where(columns < length, columns, -1), mask=columns < width)


# (BLOCK_T, BLOCK_W, WIDE_W). The interpreter pays per program and per loop
# step, not per element: tall tiles there, 256 columns wide so that a W of
# 128 or an odd multiple of 128 still ends inside a tile. The GPU tile's code
# paths also run under the interpreter in tests/test_kernel_paths.py.
GPU_TILE = (4, 128, 1024)
INTERPRETER_TILE = (256, 256, 1024)
INTERPRETING = interpreting(c128a_row_blocks_kernel)
TILE = INTERPRETER_TILE if INTERPRETING else GPU_TILE
# Warps of the row blocks and of the wide rows: the counts that ran fastest
# on a GPU, two for row blocks and four for long rows (docs/measurements.md, "Measurements
# behind the code's choices").
NUM_WARPS = 2
WIDE_NUM_WARPS = 4
PROGRAMS_PER_SM = 16  # persistent programs per multiprocessor below WIDE_W; 0: one a block
SINGLE_ROW_TOKENS_PER_SM = 4
"""Below WIDE_W, a batch of at most this many tokens per multiprocessor is
written one row a program, one warp each: more programs in flight, faster
than blocks of four rows for small batches and slower for larger ones
(docs/measurements.md, "Measurements behind the code's choices")."""
SINGLE_ROW_NUM_WARPS = 1
MAX_REGISTERS = None  # registers per thread: the compiler's choice

WIDE_ROWS, ROW_BLOCKS, SINGLE_ROWS = "wide rows", "row blocks", "single rows"


def _multiprocessors(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_properties(index).multi_processor_count


@dataclass
class LaunchPlan:
    """What a launch configuration decides once per device: the tile, the
    token count up to which rows go one a program, the cap on persistent
    programs, each variant's compile options, and whether its variants are
    compiled. A launch runs on every engine step; deciding these there took
    a noticeable share of its host time (docs/measurements.md, "Measurements behind the
    code's choices")."""

    block_t: int
    wide_w: int
    single_rows_up_to: int
    max_row_programs: int | None  # None: uncapped
    options: dict[str, dict]
    warmed: bool = False

    @classmethod
    def make(cls, device, tile, num_warps, wide_num_warps, programs_per_sm, max_programs,
             max_registers, single_rows_up_to) -> "LaunchPlan":
        block_t, block_w, wide_w = tile
        on_gpu = device.type == "cuda"
        multiprocessors = _multiprocessors(device) if on_gpu else 0
        if single_rows_up_to is None:
            single_rows_up_to = SINGLE_ROW_TOKENS_PER_SM * multiprocessors
        caps = [programs_per_sm * multiprocessors] if programs_per_sm and on_gpu else []
        caps += [max_programs] if max_programs else []
        # Only when set: a fixed cap is one more compile option, not a variant per batch.
        cap = {"maxnreg": max_registers} if max_registers else {}
        wide_warps = num_warps if wide_num_warps is None else wide_num_warps
        options = {
            WIDE_ROWS: {"WIDE_W": wide_w, "num_warps": wide_warps, **cap},
            ROW_BLOCKS: {"BLOCK_T": block_t, "BLOCK_W": block_w, "num_warps": num_warps, **cap},
            SINGLE_ROWS: {"BLOCK_T": 1, "BLOCK_W": block_w, "num_warps": SINGLE_ROW_NUM_WARPS,
                          **cap},
        }
        return cls(block_t, wide_w, single_rows_up_to, min(caps) if caps else None, options)

    def variants(self) -> tuple[str, ...]:
        """The variants this plan chooses between (single rows only where
        some batch gets them)."""
        return (WIDE_ROWS, ROW_BLOCKS) + ((SINGLE_ROWS,) if self.single_rows_up_to else ())


_plans: dict[tuple, LaunchPlan] = {}


def forget_launch_plans() -> None:
    """Drop every plan, so that the next launch of each configuration compiles
    (warms) all its variants again: for tests that clear Triton's caches."""
    _plans.clear()


def _kernel_arguments(name: str, args: BuildArgs, inert: int) -> tuple:
    """(kernel, positional arguments) of one variant for ``args``."""
    tensors, strides = tensor_arguments(args), row_strides(args)
    block_size = args.block_size
    if name == WIDE_ROWS:
        # log2(B) for a power of two (shifts in the kernel), else -1
        shift = block_size.bit_length() - 1 if block_size & (block_size - 1) == 0 else -1
        return c128a_wide_rows_kernel, (
            *tensors, args.num_decode_tokens, args.max_compressed_tokens, args.compress_ratio,
            block_size, shift, *strides, inert,
        )
    return c128a_row_blocks_kernel, (
        *tensors, args.num_tokens, args.num_decode_tokens, args.max_compressed_tokens,
        args.compress_ratio, block_size, *strides, inert,
    )


def _launch(args: BuildArgs, configuration: tuple, inert_padding: bool) -> None:
    num_tokens = args.num_tokens
    if num_tokens == 0:
        return
    device = args.positions.device
    plan = _plans.get((device, configuration))
    if plan is None:
        plan = _plans[(device, configuration)] = LaunchPlan.make(device, *configuration)
    width = args.max_compressed_tokens
    inert = int(inert_padding)
    # Plain integer ceilings: triton.cdiv (a constexpr function) costs
    # microseconds of host time a call.
    if width >= plan.wide_w:
        chosen = WIDE_ROWS
        num_decode = args.num_decode_tokens
        programs = num_decode + (num_tokens - num_decode) * -(-width // plan.wide_w)
    else:
        single = num_tokens <= plan.single_rows_up_to
        chosen = SINGLE_ROWS if single else ROW_BLOCKS
        programs = num_tokens if single else -(-num_tokens // plan.block_t)
        if plan.max_row_programs is not None:
            programs = min(programs, plan.max_row_programs)
    if not plan.warmed and not INTERPRETING:
        # The first launch compiles the other variants too (without running
        # them), so that a later batch never compiles mid-inference.
        for name in plan.variants():
            if name != chosen:
                kernel, kernel_args = _kernel_arguments(name, args, inert)
                kernel.warmup(*kernel_args, grid=(1,), **plan.options[name])
        plan.warmed = True
    kernel, kernel_args = _kernel_arguments(chosen, args, inert)
    if LAUNCH_OBSERVERS and not report_launch(
        LAUNCHER, kernel, (programs,), _bound(kernel, kernel_args, plan.options[chosen])
    ):
        return
    kernel[(programs,)](*kernel_args, **plan.options[chosen])


def _bound(kernel, kernel_args: tuple, options: dict) -> dict:
    """A launch's arguments by parameter name, its options beside them."""
    names = inspect.signature(getattr(kernel, "fn", kernel)).parameters
    return {**dict(zip(names, kernel_args)), **options}


class AdaptiveLauncher:
    """The project's kernel as a keyed launcher (:mod:`c128a.kernels.launch_keys`).

    Its warm-up is a plan's first launch, which compiles every variant the
    plan chooses between at that launch's arguments (on a GPU); an engine's
    first is its capture build: :meth:`warmed_launch_keys` gives each
    variant's key for one decode and one prefill token at W = C in fresh
    buffers. Every launch reports its own key to the launch observers."""

    jit_functions = (c128a_row_blocks_kernel, c128a_wide_rows_kernel)

    def warmed_launch_keys(self, vllm_config) -> list:
        from .launch_keys import launch_key

        max_model_len = vllm_config.model_config.max_model_len
        capacity = capacity_width(max_model_len)
        pages = -(-max_model_len // vllm_config.cache_config.block_size)
        buffer = lambda: torch.zeros((2, capacity), dtype=torch.int32)  # noqa: E731
        args = BuildArgs(
            torch.zeros(2, dtype=torch.int64), 128, 1, torch.zeros(2, dtype=torch.int32),
            torch.zeros((1, pages), dtype=torch.int32), 2, torch.zeros(2, dtype=torch.int64),
            buffer(), torch.zeros(2, dtype=torch.int32), buffer(), capacity,
        )
        plan = LaunchPlan.make(torch.device(_device_type()), *DEFAULT_CONFIGURATION)
        keys = []
        for name in plan.variants():
            for inert in (0, 1):
                kernel, kernel_args = _kernel_arguments(name, args, inert)
                key = launch_key(kernel, _bound(kernel, kernel_args, plan.options[name]))
                if key not in keys:
                    keys.append(key)
        return keys


def _device_type() -> str:
    return "cpu" if INTERPRETING else "cuda"


LAUNCHER = AdaptiveLauncher()


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
    single_rows_up_to: int | None = None,
) -> None:
    """:func:`launch` with an explicit tile, warp counts and persistence (for
    tuning). None of these depends on the batch. ``num_warps`` is for the
    row blocks (W < WIDE_W), ``wide_num_warps`` (``num_warps`` when None)
    for the wide rows; ``single_rows_up_to`` is the token count up to which
    a batch below WIDE_W is written one row a program
    (:data:`SINGLE_ROW_TOKENS_PER_SM` per multiprocessor on a GPU when None,
    none on the CPU; 0: never). The first launch compiles every variant
    these choose between. ``max_programs`` caps the persistent grid below
    WIDE_W on any device, so that tests can run its grid-stride loop on the
    CPU; ``max_registers`` caps registers per thread (Triton's ``maxnreg``;
    None leaves the choice to the compiler); ``inert_padding`` writes
    padding tokens' decode rows all -1 (the ``inert`` variant)."""
    configuration = (
        tuple(tile), num_warps, wide_num_warps, programs_per_sm, max_programs, max_registers,
        single_rows_up_to,
    )
    _launch(args, configuration, inert_padding)


DEFAULT_CONFIGURATION = (
    TILE, NUM_WARPS, WIDE_NUM_WARPS, PROGRAMS_PER_SM, None, MAX_REGISTERS, None
)
"""The project's launch configuration, in :class:`LaunchPlan.make`'s order."""


def launch(args: BuildArgs, inert_padding: bool = False) -> None:
    """Launch without validation (benchmarks); callers guarantee the contract."""
    _launch(args, DEFAULT_CONFIGURATION, inert_padding)


jit_functions = (c128a_row_blocks_kernel, c128a_wide_rows_kernel)
"""The Triton functions this target launches (the recompile check counts their variants)."""

launchers = (LAUNCHER,)
"""Its keyed launcher, for the compile-key check."""

build_c128a_topk_metadata = triton_builder(launch)
"""The contract's function around a Triton launcher."""

inert = types.SimpleNamespace(
    build_c128a_topk_metadata=triton_builder(
        functools.partial(launch, inert_padding=True), "inert", INERT
    ),
    padding_rows=INERT,
    jit_functions=jit_functions,
    launchers=launchers,
)
"""The same kernel under the ``inert`` padding-row variant (target ``triton-inert``)."""
