"""Hypothesis strategies for engine-shaped C128A builder inputs.

Steps are drawn the way an engine schedules them, not as independent random
arrays: a ``max_model_len`` and the capacity the target's policy derives from
it, decode requests first (1..8 query tokens each, speculative decoding), then
prefill chunks; each request's tokens are its last ``query_len`` positions;
block tables hold unique shuffled page numbers with junk past the needed
columns; CUDA-graph padding tokens carry a negative slot. Lengths are biased
towards the edges where implementations break: ``(p + 1) % 128`` in {0, 1},
``max_seq_len // 128`` at and around powers of two (where the width jumps),
and sequences of exactly ``max_model_len``.

Every strategy shrinks towards the smallest engine step it can describe:
fewer requests, shorter sequences, identity page numbers, no padding, at a
model length whose capacity (640) exceeds the smallest width. Strategies
only draw: the property running them reports ``event()`` and ``target()``
observations from the step's labels (:mod:`c128a.checks.properties`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from hypothesis import strategies as st

from ..contract import (
    BLOCK_SIZE,
    COMPRESS_RATIO,
    MAX_CAPACITY,
    MAX_MODEL_LEN,
    MAX_QUERY_TOKENS_PER_DECODE,
    SLOTS,
    WIDTH_ALIGNMENT,
    padding_rows_of,
    policy,
    target_capacity,
    target_width,
)
from ..contract.validation import check, check_positive_int
from ..failures import HarnessError
from ..step import PAGE_PRIME, Batch, PaddingToken, PermutedBlockTable, StepRequest, assemble_batch
from .layout import (
    INDEX_BYTES,
    LAYOUT_BYTES,
    MAX_INSIDE_PADDING,
    MAX_JUNK_SLOTS,
    MODEL_LEN_BYTES,
    PAD_BYTES,
    REQUEST_BYTES,
    SLOT_BYTES,
    TABLE_BYTES,
    Fields,
    signed,
    uint,
)

EDGE_MAX_MODEL_LENS = (
    81_920,  # capacity 640, not a power of two: the shrink target (W = 128 < C)
    1_048_576,  # capacity 8,192: the 1M edge
    2_048,  # capacity 128 = the smallest width
    16_384 + 1,  # capacity 256: one entry past a power of two
    200_000,  # capacity 1,664
    1_000_000,  # capacity 7,936
)
"""Model lengths where capacities and widths have broken before. The first
is what shrinking aims for: a capacity above the smallest width, so a build
at W = 128 leaves columns that must stay untouched."""

PADDING_SLOTS = (-1, -1, -1, -1, -2, -2, -(2**31) - 1, -(2**63))
"""The negative slots padding tokens carry, drawn uniformly: the engine's -1
half the time (and first: what shrinking aims for), else others every
implementation must treat the same (the contract says ``slot_mapping < 0``):
the next one, one past int32's range (a builder that narrows slots to int32
sees a large positive slot) and int64's minimum."""

STALE_LARGE_TAIL_BYTE = 3 * (MAX_QUERY_TOKENS_PER_DECODE + 1) * len(PADDING_SLOTS)
"""Tail-padding count bytes from here (216 of 256: about one in six draws)
give the tail padding stale positions larger than their request's, left in
the engine's position buffer by a longer request of an earlier step. Below
it the byte's count and slot choices repeat, and shrinking aims below it."""

WIDTHS = ("any", "policy")

GEOMETRIES = ((COMPRESS_RATIO, BLOCK_SIZE), (1, 1), (2, 3), (3, 2), (64, 4), (128, 1), (128, 3),
              (256, 2), (1000, 4))
"""(compress_ratio, block_size) pairs the kernel-level function must handle
(it takes both as arguments): the engine's first, the one shrinking aims for."""


@functools.lru_cache(maxsize=64)
def max_model_lens(*, max_value: int = MAX_MODEL_LEN) -> st.SearchStrategy[int]:
    """A ``max_model_len`` in [1, max_value]: one of :data:`EDGE_MAX_MODEL_LENS`
    (81,920 for capacity 640, 1M, capacities that are not powers of two), a
    length of any magnitude from 2**14 (log-uniform, so capacities of every
    size occur), or any length at all. Shrinks towards the first edge, 81,920 (C = 640)."""
    check_positive_int("max_value", max_value)
    return st.binary(min_size=MODEL_LEN_BYTES, max_size=MODEL_LEN_BYTES).map(
        lambda data: _model_len(Fields(data), max_value)
    )


def _model_len(fields: Fields, max_value: int) -> int:
    """:func:`max_model_lens`'s value from the next :data:`MODEL_LEN_BYTES`
    bytes of ``fields``; zeros give the first edge that fits."""
    kind, value = fields.uint(2), fields.uint(3)
    edges = [v for v in EDGE_MAX_MODEL_LENS if v <= max_value]
    # Edges, each magnitude from 2**14 up (below it every capacity is 128),
    # and any length: equally likely, so most lengths are log-uniform.
    top = max_value.bit_length()
    magnitudes = list(range(min(15, top), top + 1))
    kind = kind % ((1 if edges else 0) + len(magnitudes) + 1)
    if edges:
        if kind == 0:
            return edges[value % len(edges)]
        kind -= 1
    if kind < len(magnitudes):
        k = magnitudes[kind]
        low, high = max(1, 1 << (k - 1)), min(max_value, (1 << k) - 1)
        return low + value % (high - low + 1)
    return 1 + value % max_value


def capacities(target=None, *, max_model_len: int | None = None) -> st.SearchStrategy[int]:
    """The capacity C the target's policy (the project's when ``target`` is
    None) gives a drawn ``max_model_len``, or the given one. Shrinks towards
    the capacity of the smallest model length."""
    lens = st.just(max_model_len) if max_model_len is not None else max_model_lens()
    return lens.map(lambda n: target_capacity(target, n))


@functools.lru_cache(maxsize=4096)
def _length_edges(max_len: int, ratio: int = COMPRESS_RATIO) -> tuple[int, ...]:
    """Sequence lengths at the edges: (p + 1) % R in {0, 1} for the last
    position p = L - 1, L // R at and around powers of two, and max_len."""
    edges = {max_len, max_len - 1, ratio - 1, ratio, ratio + 1}
    power = 1
    while power * ratio <= max_len + ratio:
        base = power * ratio
        edges.update((base - 1, base, base + 1, base + ratio - 1, base + ratio))
        power *= 2
    return tuple(sorted(v for v in edges if 1 <= v <= max_len))


@functools.lru_cache(maxsize=4096)
def _edges_from(max_len: int, min_len: int, ratio: int = COMPRESS_RATIO) -> tuple[int, ...]:
    return tuple(v for v in _length_edges(max_len, ratio) if v >= min_len)


def _sequence_length(
    selector: int, value: int, min_len: int, max_len: int, ratio: int = COMPRESS_RATIO
) -> int:
    """A sequence length in [min_len, max_len]: for an odd ``selector`` one of
    the edges (last position p with (p + 1) % 128 in {0, 1}, ``L // 128`` at
    and around powers of two, ``max_len``), else ``value`` spread uniformly;
    zeros give ``min_len``."""
    if selector & 1:
        edges = _edges_from(max_len, min_len, ratio)
        if edges:
            return edges[value % len(edges)]
    return min_len + value % (max_len - min_len + 1)


@dataclass(frozen=True)
class _Request:
    seq_len: int
    query_len: int

    def step(self) -> StepRequest:
        return StepRequest.last(self.seq_len, self.query_len)


def _requests_from_bytes(
    blob: bytes, max_tokens: int, max_query: int, max_len: int, ratio: int = COMPRESS_RATIO
) -> list[_Request]:
    """Requests from :data:`REQUEST_BYTES` bytes each, until ``max_tokens``
    query tokens are spent; half of the sequence lengths sit at an edge."""
    requests = []
    budget = max_tokens
    for start in range(0, len(blob) - REQUEST_BYTES + 1, REQUEST_BYTES):
        if budget < 1:
            break
        record = blob[start : start + REQUEST_BYTES]
        query = 1 + uint(record[0:2]) % max(1, min(max_query, budget, max_len))
        seq = _sequence_length(record[2], uint(record[3:6]), query, max_len, ratio)
        requests.append(_Request(seq_len=seq, query_len=query))
        budget -= query
    return requests


def pages_for(seq_len: int, block_size: int = BLOCK_SIZE, ratio: int = COMPRESS_RATIO) -> int:
    """Block-table pages a sequence of ``seq_len`` tokens needs for its lists."""
    entries = seq_len // ratio
    return -(-entries // block_size)


@st.composite
def block_tables(draw, pages_needed: list[int], *, max_junk_columns: int = 3) -> PermutedBlockTable:
    """Block-table rows for requests needing ``pages_needed[i]`` pages each.

    Page numbers are unique across the table and shuffled (an affine
    permutation of 0..N-1 modulo :data:`~c128a.step.PAGE_PRIME`, held as a
    :class:`~c128a.step.PermutedBlockTable`); every row has the same width,
    at least the largest need plus 0..``max_junk_columns`` extra columns,
    and columns past a row's need hold junk (possibly negative or huge),
    which a correct builder never reads. Shrinks towards pages 0, 1, 2, ...
    in order, no extra columns and junk -7.
    """
    data = draw(st.binary(min_size=TABLE_BYTES, max_size=TABLE_BYTES))
    return _block_table(data, pages_needed, max_junk_columns)


def _block_table(data: bytes, pages_needed: list[int], max_junk_columns: int = 3):
    """The table :func:`block_tables` describes, from :data:`TABLE_BYTES` bytes."""
    if not pages_needed:
        return ()
    width = max(max(pages_needed) + data[0] % (max_junk_columns + 1), 1)
    junk = signed(uint(data[8:12]), 2**31 - 1) if data[7] & 1 else -7
    return PermutedBlockTable(
        pages_needed=tuple(pages_needed),
        width=width,
        scale=1 + uint(data[1:4]) % (PAGE_PRIME - 1),
        offset=uint(data[4:7]) % PAGE_PRIME,
        junk=junk,
    )


def batches(
    target=None,
    *,
    max_model_len: int | None = None,
    max_tokens: int = 32,
    max_buffer_rows: int | None = None,
    max_decode_requests: int = 6,
    max_prefill_requests: int = 4,
    max_prefill_chunk: int = 24,
    min_decode_requests: int = 0,
    min_prefill_requests: int = 0,
    padding: bool = True,
    widths: str = "any",
    width: int | None = None,
    geometries: bool = False,
) -> st.SearchStrategy[Batch]:
    """One engine step as a :class:`~c128a.step.Batch`, the main entry point.

    Draws a ``max_model_len`` (:func:`max_model_lens`, or the given one), the
    capacity from ``target``'s policy (the project's when None), decode
    requests (1..8 query tokens each) then prefill chunks (1..
    ``max_prefill_chunk`` tokens), at most ``max_tokens`` tokens in all,
    buffers of ``T..max_buffer_rows`` rows (by default ``max(64, max_tokens + 8)``:
    room for T tokens and tail padding), a block table of decode rows
    (:func:`block_tables`), sometimes as a slice of a wider table, and a
    ``slot_mapping`` with CUDA-graph padding tokens (negative slots) at the
    tail and sometimes inside, plus junk entries past T. The width is the
    target's policy for the batch's longest sequence unless ``width`` is given;
    with ``widths="any"`` (the default) two thirds of the batches instead
    take a multiple of 128 narrower than the batch needs, or any width the
    policy can reach for C (the kernel-level contract holds at every width;
    n(t) = min(., W) clamps), with ``widths="policy"`` none do. With
    ``geometries=True`` the compress ratio and block size are drawn from
    :data:`GEOMETRIES` instead of being the engine's (model lengths then stay
    within the capacity's reach, 8,192 * R).

    Each step carries labels (width bucket, decode/prefill mix, padding,
    speculative decode) for the property's ``event()`` observations.
    Shrinks towards T = 0 at max_model_len 81,920 (C = 640, so W = 128 < C):
    no requests, short sequences, identity page numbers, no padding.
    """
    check(max_tokens >= 0, f"max_tokens={max_tokens} must be >= 0")
    if max_buffer_rows is None:
        max_buffer_rows = max(64, max_tokens + MAX_QUERY_TOKENS_PER_DECODE)
    check(
        max_buffer_rows >= max_tokens + MAX_QUERY_TOKENS_PER_DECODE,
        f"max_buffer_rows={max_buffer_rows} must be >= max_tokens + 8 "
        f"(= {max_tokens + MAX_QUERY_TOKENS_PER_DECODE}) to hold T tokens and tail padding",
    )
    check(widths in WIDTHS, f"widths={widths!r} must be one of {', '.join(map(repr, WIDTHS))}")
    check(
        0 <= min_decode_requests <= max_decode_requests
        and 0 <= min_prefill_requests <= max_prefill_requests,
        f"request counts must satisfy 0 <= min <= max: decode {min_decode_requests}.."
        f"{max_decode_requests}, prefill {min_prefill_requests}..{max_prefill_requests}",
    )
    return _batches(
        target,
        max_model_len=max_model_len,
        max_tokens=max_tokens,
        max_buffer_rows=max_buffer_rows,
        max_decode_requests=max_decode_requests,
        max_prefill_requests=max_prefill_requests,
        max_prefill_chunk=max_prefill_chunk,
        min_decode_requests=min_decode_requests,
        min_prefill_requests=min_prefill_requests,
        padding=padding,
        widths=widths,
        width=width,
        geometries=geometries,
    )


@st.composite
def _batches(
    draw,
    target,
    *,
    max_model_len,
    max_tokens,
    max_buffer_rows,
    max_decode_requests,
    max_prefill_requests,
    max_prefill_chunk,
    min_decode_requests,
    min_prefill_requests,
    padding,
    widths,
    width,
    geometries,
) -> Batch:
    ratio, block_size = draw(st.sampled_from(GEOMETRIES)) if geometries else GEOMETRIES[0]
    layout = Fields(draw(st.binary(min_size=LAYOUT_BYTES, max_size=LAYOUT_BYTES)))
    model_len = _model_len(layout, min(MAX_MODEL_LEN, MAX_CAPACITY * ratio))
    model_len = max_model_len or model_len
    capacity = target_capacity(target, model_len, ratio)

    decode_count = layout.between(2, min_decode_requests, max_decode_requests)
    prefill_count = layout.between(2, min_prefill_requests, max_prefill_requests)
    size = (decode_count + prefill_count) * REQUEST_BYTES
    records = draw(st.binary(min_size=size, max_size=size))
    decode = _requests_from_bytes(
        records[: decode_count * REQUEST_BYTES],
        max_tokens - min_prefill_requests,
        MAX_QUERY_TOKENS_PER_DECODE,
        model_len,
        ratio,
    )
    used = sum(r.query_len for r in decode)
    prefill = _requests_from_bytes(
        records[decode_count * REQUEST_BYTES :], max_tokens - used, max_prefill_chunk, model_len,
        ratio,
    )
    real_positions = [p for r in decode + prefill for p in r.step().positions]
    real_requests = [i for i, r in enumerate(decode + prefill) for _ in range(r.query_len)]
    real_tokens = len(real_positions)
    max_seq_len = max((r.seq_len for r in decode + prefill), default=0)

    kernel_level = False
    width_kind, width_value = layout.uint(1), layout.uint(2)
    if width is None:
        width = target_width(target, max_seq_len, ratio, capacity)
        aligned = capacity // WIDTH_ALIGNMENT
        choice = width_kind % 3 if widths == "any" and aligned >= 1 else 0
        if choice == 1 and width > WIDTH_ALIGNMENT:
            # Narrower than the batch needs: n(t) = min(., W) clamps.
            narrower = width // WIDTH_ALIGNMENT - 1
            width = (1 + width_value % narrower) * WIDTH_ALIGNMENT
            kernel_level = True
        elif choice >= 1:  # any width the policy can reach, C included
            reachable = policy.reachable_widths(capacity)
            width = reachable[width_value % len(reachable)]
            kernel_level = True

    # CUDA-graph padding at the tail: stale copies of real tokens' requests
    # with their positions or earlier ones, a negative slot. In a
    # decode-only step they are decode tokens. The count's byte also picks
    # the padding slot (PADDING_SLOTS; -1 for small bytes) and, from its
    # top values, positions staler and larger than the request's own
    # (STALE_LARGE_TAIL_BYTE): one byte, so saved byte strings keep their meaning.
    tail_byte = layout.uint(1)
    tail = tail_byte % (MAX_QUERY_TOKENS_PER_DECODE + 1)
    tail_slot = PADDING_SLOTS[tail_byte // (MAX_QUERY_TOKENS_PER_DECODE + 1) % len(PADDING_SLOTS)]
    pads = layout.take(MAX_QUERY_TOKENS_PER_DECODE * PAD_BYTES)
    tail = tail if padding and real_tokens else 0
    tail_draws = [
        (uint(pads[start : start + 2]) % real_tokens, uint(pads[start + 2 : start + PAD_BYTES]))
        for start in range(0, tail * PAD_BYTES, PAD_BYTES)
    ]
    inside_byte = layout.uint(1)
    inside_count = inside_byte % (MAX_INSIDE_PADDING + 1)
    inside_slot = PADDING_SLOTS[inside_byte // (MAX_INSIDE_PADDING + 1) % len(PADDING_SLOTS)]
    picks = layout.take(MAX_INSIDE_PADDING * INDEX_BYTES)
    inside: dict[int, int] = {}
    if padding and real_tokens:
        for start in range(0, inside_count * INDEX_BYTES, INDEX_BYTES):
            inside.setdefault(uint(picks[start : start + INDEX_BYTES]) % real_tokens, inside_slot)
    junk_count = layout.uint(1) % (MAX_JUNK_SLOTS + 1)
    junk_slots = layout.take(MAX_JUNK_SLOTS * SLOT_BYTES)
    extra_slots = [
        signed(uint(junk_slots[start : start + SLOT_BYTES]), 2**20)
        for start in range(0, junk_count * SLOT_BYTES, SLOT_BYTES)
    ]

    # The engine's table covers the whole sequence, whatever the width.
    table = _block_table(
        layout.take(TABLE_BYTES), [pages_for(r.seq_len, block_size, ratio) for r in decode]
    )
    table_width = table.width if table else 0
    stale_bound = (
        _stale_position_bound(target, model_len, capacity, table_width, ratio, block_size,
                              decode_tail=not prefill)
        if tail_byte >= STALE_LARGE_TAIL_BYTE else None
    )
    tail_padding = [
        PaddingToken(_tail_position(real_positions[source], value, stale_bound),
                     real_requests[source], tail_slot)
        for source, value in tail_draws
    ]
    wider_table, extra_stride = layout.uint(1), layout.uint(1)
    row_stride = table_width + 1 + extra_stride % 64 if table and wider_table & 1 else 0

    num_tokens = real_tokens + len(tail_padding)
    buffer_rows = layout.between(2, max(num_tokens, 1), max(max_buffer_rows, num_tokens, 1))
    # Sometimes a wider prefill buffer: its row stride then differs from the
    # decode buffer's, so a builder that mixes the two up writes wrong rows.
    prefill_extra = 128 if layout.uint(1) % 4 == 3 else 0
    if layout.offset != LAYOUT_BYTES:
        raise HarnessError(f"the layout read {layout.offset} bytes, not its {LAYOUT_BYTES}")

    num_decode = num_tokens if not prefill else sum(r.query_len for r in decode)
    labels = _labels(
        num_tokens, num_decode, width, capacity, tail=bool(tail_padding), inside=bool(inside),
        speculative=any(r.query_len > 1 for r in decode), kernel_level=kernel_level,
    )
    every_request = decode + prefill
    if any(pad.position >= every_request[pad.request].seq_len for pad in tail_padding):
        labels += ("stale padding past its request",)
    if geometries:
        labels += (f"R={ratio}, B={block_size}",)
    batch = assemble_batch(
        [r.step() for r in decode],
        [r.step() for r in prefill],
        block_table=table,
        max_model_len=model_len,
        capacity=capacity,
        width=width,
        buffer_rows=buffer_rows,
        tail_padding=tail_padding,
        padded_tokens=inside,
        extra_slots=extra_slots,
        block_table_row_stride=row_stride,
        prefill_extra_columns=prefill_extra,
        compress_ratio=ratio,
        block_size=block_size,
        labels=labels,
    )
    return dataclasses.replace(batch, labels=labels + shape_labels(batch))


def _stale_position_bound(
    target, model_len: int, capacity: int, table_width: int, ratio: int, block_size: int,
    *, decode_tail: bool,
) -> int:
    """The largest position a stale tail padding token may carry: one an
    earlier step's request reached (< ``max_model_len``). A decode padding
    row under ``slots`` is written from the block table, so there it stays
    where the table's rows reach at any width up to C (the contract's table
    precondition); under ``inert`` and in prefill rows no table entry is read."""
    bound = model_len - 1
    if decode_tail and padding_rows_of(target) == SLOTS and table_width * block_size < capacity:
        bound = min(bound, (table_width * block_size + 1) * ratio - 2)
    return bound


def _tail_position(source_position: int, value: int, stale_bound: int | None) -> int:
    """A tail padding token's position from its draw: the source token's own
    or an earlier one, or with ``stale_bound`` a larger one, up to it."""
    if stale_bound is None or stale_bound <= source_position:
        return value % (source_position + 1)
    return source_position + 1 + value % (stale_bound - source_position)


def shape_labels(batch: Batch) -> tuple[str, ...]:
    """Shapes that broke consumers upstream, for ``event()``: padding slots
    other than -1, more than 64 decode rows (vllm#53574: a consumer checks contiguity only above
    64 rows), every length 0 (vllm#51970)."""
    labels = ()
    slots = batch.slot_mapping[: batch.num_tokens]
    if any(s < -1 for s in slots):
        labels += ("padding slot < -1",)
    if batch.num_decode_tokens > 64:
        labels += ("more than 64 decode rows",)
    if batch.num_tokens and max(batch.positions) + 1 < batch.compress_ratio:
        labels += ("every length 0",)
    return labels


def _labels(
    t: int, d: int, width: int, capacity: int, *, tail: bool, inside: bool,
    speculative: bool, kernel_level: bool,
) -> tuple[str, ...]:
    """What kind of step this is, for ``event()`` and the fuzzer's coverage."""
    mix = (
        "no tokens" if t == 0
        else "decode only" if d == t
        else "prefill only" if d == 0
        else "decode + prefill"
    )
    padded = {
        (True, True): "tail and inside padding",
        (True, False): "tail padding",
        (False, True): "inside padding",
        (False, False): "no padding",
    }[tail, inside]
    width_bucket = f"W={width} of C={capacity}" if width == capacity else f"W={width} < C"
    labels = (mix, padded, width_bucket)
    labels += ("speculative decode",) if speculative else ()
    labels += ("kernel-level width",) if kernel_level else ()
    return labels
