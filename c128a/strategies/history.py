"""The contract's historical failures as concrete engine steps, for ``@example``."""

from __future__ import annotations

from ..contract import BLOCK_SIZE, COMPRESS_RATIO, target_capacity, target_width
from ..step import Batch, BufferLayout, PaddingToken, StepRequest, assemble_batch
from .engine import pages_for


def engine_batch(
    decode: list[tuple[int, int]] = (),
    prefill: list[tuple[int, int]] = (),
    *,
    max_model_len: int = 81_920,
    tail_padding: int = 0,
    inside_padding: tuple[int, ...] = (),
    padding_slot: int = -1,
    padding_position: tuple[int, int] | None = None,
    table_row_stride: int = 0,
    buffer_rows: int | None = None,
    prefill_extra_columns: int = 0,
    width: int | None = None,
    block_size: int = BLOCK_SIZE,
    buffer_layout: BufferLayout = BufferLayout(),
    target=None,
    labels: tuple[str, ...] = (),
) -> Batch:
    """A concrete engine step, for ``@example`` and regression cases.

    ``decode`` and ``prefill`` list requests as ``(seq_len, query_len)``;
    tokens are each request's last ``query_len`` positions, decode first.
    Tail padding tokens repeat the last real token's position and request
    (or take ``padding_position``, a stale ``(position, request)``) with
    ``padding_slot`` (decode tokens when there is no prefill);
    ``inside_padding`` gives real tokens that slot. The prefill buffer is ``prefill_extra_columns``
    wider than the decode buffer. Page numbers (of ``block_size`` entries) are
    unique and in reverse order, one spare junk column per row; the buffers
    sit as ``buffer_layout`` places them. The capacity and width come from
    ``target``'s policy (the project's when None) unless ``width`` is given.
    """
    capacity = target_capacity(target, max_model_len, COMPRESS_RATIO)
    requests = [StepRequest.last(s, q) for s, q in [*decode, *prefill]]
    if width is None:
        max_seq_len = max((s for s, _ in [*decode, *prefill]), default=0)
        width = target_width(target, max_seq_len, COMPRESS_RATIO, capacity)
    real = sum(q for _, q in [*decode, *prefill])
    last = (requests[-1].positions[-1], len(requests) - 1) if requests else (0, 0)
    padding = [PaddingToken(*(padding_position or last), padding_slot)] * tail_padding
    needs = [pages_for(s, block_size) for s, _ in decode]
    total, first = sum(needs), 0
    columns = max(needs, default=0) + 1
    table = []
    for need in needs:
        table.append(tuple(total - 1 - (first + c) for c in range(need)) + (-7,) * (columns - need))
        first += need
    return assemble_batch(
        requests[: len(decode)],
        requests[len(decode):],
        block_table=tuple(table),
        max_model_len=max_model_len,
        capacity=capacity,
        width=width,
        buffer_rows=buffer_rows if buffer_rows is not None else max(real + tail_padding + 3, 1),
        tail_padding=padding,
        padded_tokens={t: padding_slot for t in inside_padding},
        block_table_row_stride=table_row_stride,
        prefill_extra_columns=prefill_extra_columns,
        block_size=block_size,
        buffer_layout=buffer_layout,
        labels=labels,
    )


def _historical_batches() -> dict[str, Batch]:
    one_m = 1_048_576
    return {
        # vLLM's own test: 2 decode + 2 prefill tokens, W = 256 < C.
        "upstream_two_decode_two_prefill": engine_batch(
            [(300 * 128, 1), (200 * 128, 1)], [(100, 1), (250 * 128 + 5, 1)], max_model_len=one_m
        ),
        # ... and the same batch rebuilt at W = 128, narrower than it needs:
        # n(t) = min(floor((p + 1) / R), W) clamps.
        "upstream_rebuilt_at_128": engine_batch(
            [(300 * 128, 1), (200 * 128, 1)],
            [(100, 1), (250 * 128 + 5, 1)],
            max_model_len=one_m,
            width=128,
        ),
        # Block index > 0 with block size 2, two decode requests on their own pages.
        "block_index_past_zero": engine_batch(
            [(7 * 128, 2), (9 * 128 + 1, 1)], [(5 * 128, 3)], table_row_stride=11
        ),
        # n(t) past 1,024 columns: a 1,024-column tile boundary is crossed.
        "crosses_1024_columns": engine_batch(
            [(1_030 * 128, 1)], [(1_100 * 128, 2)], max_model_len=one_m
        ),
        # (p + 1) % 128 in {0, 1}: one entry appears between consecutive tokens.
        "entry_boundaries": engine_batch([(128, 2), (257, 3)], [(129, 3), (384, 2)]),
        # max_seq_len // 128 at and just past a power of two: W jumps 128 -> 256.
        "width_jump_at_power_of_two": engine_batch(
            [(128 * 128, 1), (129 * 128, 1)], [(256 * 128 + 127, 1)], max_model_len=200_000
        ),
        # Capacity 8,192 at 1M context, a sequence of exactly max_model_len.
        "capacity_8192_at_1m": engine_batch([(one_m, 1)], [(one_m, 2)], max_model_len=one_m),
        # One token past 128 whole entries (16,385 = 128 * 128 + 1): the
        # capacity needs ceil(L / R) = 129 entries, 256 columns; floor(L / R)
        # would size the buffers one 128-column tile short.
        "model_len_one_past_a_tile": engine_batch(
            [(16_385, 1)], [(300, 2)], max_model_len=16_385
        ),
        # Capacity 640 (81,920 tokens): W = C, not a power of two.
        "capacity_640": engine_batch(
            [(81_920, 2), (81_919, 1)], [(81_920, 1)], max_model_len=81_920
        ),
        # Speculative decoding: 8 query tokens of one decode request.
        "speculative_decode_8_tokens": engine_batch([(3 * 128 + 7, 8), (2 * 128, 1)], [(600, 2)]),
        # CUDA-graph padding at the tail of a decode-only step and inside.
        "padding_tail_and_inside": engine_batch(
            [(5 * 128, 1), (4 * 128 + 1, 2)], tail_padding=3, inside_padding=(1,)
        ),
        "padding_tail_after_prefill": engine_batch([(300, 1)], [(700, 2)], tail_padding=2),
        # A prefill buffer wider than the decode buffer: the two row strides
        # differ, so rows written at the other buffer's stride land wrong.
        "prefill_buffer_wider": engine_batch(
            [(600, 1)], [(5 * 128, 3)], prefill_extra_columns=128
        ),
        # Padding slots other than -1: any negative slot is padding.
        "padding_slot_minus_two": engine_batch(
            [(5 * 128, 1), (3 * 128, 2)], tail_padding=2, inside_padding=(0,), padding_slot=-2
        ),
        "padding_slot_int64_min": engine_batch(
            [(4 * 128, 2)], [(300, 1)], tail_padding=1, inside_padding=(1,),
            padding_slot=-(2**63),
        ),
        # Speculative decoding past 64 decode rows (vllm#53574: a consumer
        # checks contiguity only above 64 rows): 9 requests of 8 tokens.
        "more_than_64_decode_rows": engine_batch(
            [((3 + k) * 128 + k, 8) for k in range(9)], [(400, 2)]
        ),
        # A stale padding position past every real token's (22 entries, the
        # table's reach, against 20 and 3): its slots row reads its
        # request's junk columns; the real tokens' rows must not change.
        "stale_padding_past_its_request": engine_batch(
            [(3 * 128 + 5, 1), (20 * 128, 1)], tail_padding=2,
            padding_position=(22 * 128 + 100, 0),
        ),
        # Every position < 127: every length 0, the rows all -1 (vllm#51970).
        "every_length_zero": engine_batch([(100, 1), (127, 2)], [(50, 3)], tail_padding=1),
        "no_tokens": engine_batch(),
        "no_decode": engine_batch(prefill=[(600, 4), (128, 1)]),
        "no_prefill": engine_batch([(600, 1), (1_000, 3)]),
    }


HISTORICAL_BATCHES: dict[str, Batch] = _historical_batches()
"""The contract's historical failures as concrete batches (project policy)."""
