"""Hypothesis strategies for engine-shaped C128A builder inputs.

Batches are drawn the way an engine schedules them, not as independent random
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
model length whose capacity (640) exceeds the smallest width.
:data:`HISTORICAL_BATCHES` holds the contract's historical failures as
concrete batches, for ``@example``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from hypothesis import event, strategies as st, target as hypothesis_target
from hypothesis.control import currently_in_test_context
from hypothesis.errors import InvalidArgument as HypothesisInvalidArgument

from . import policy
from .batch import PAGE_PRIME, Batch, PermutedBlockTable
from .validation import check, check_positive_int

__all__ = [
    "EDGE_MAX_MODEL_LENS",
    "HISTORICAL_BATCHES",
    "MAX_MODEL_LEN",
    "MAX_QUERY_TOKENS_PER_DECODE",
    "PAGE_PRIME",
    "batches",
    "block_tables",
    "capacities",
    "engine_batch",
    "max_model_lens",
]

COMPRESS_RATIO = policy.COMPRESS_RATIO
BLOCK_SIZE = 2  # compressed entries per 256-token KV page

MAX_QUERY_TOKENS_PER_DECODE = 8
"""One decode token plus up to 7 speculative draft tokens."""

MAX_MODEL_LEN = 1_048_576
"""The longest ``max_model_len`` drawn by default (capacity 8,192)."""

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

def _in_test() -> bool:
    return currently_in_test_context()


def _event(label: str) -> None:
    if _in_test():
        event(label)


def _target(value: float, label: str) -> None:
    # target() may only be called once per label per test case; a test that
    # draws several batches (a state machine) keeps the first observation.
    if _in_test():
        try:
            hypothesis_target(value, label=label)
        except HypothesisInvalidArgument:
            pass


@functools.lru_cache(maxsize=64)
def max_model_lens(*, max_value: int = MAX_MODEL_LEN) -> st.SearchStrategy[int]:
    """A ``max_model_len`` in [1, max_value]: one of :data:`EDGE_MAX_MODEL_LENS`
    (81,920 for capacity 640, 1M, capacities that are not powers of two), a
    length of any magnitude from 2**14 (log-uniform, so capacities of every
    size occur), or any length at all. Shrinks towards the first edge, 81,920 (C = 640)."""
    check_positive_int("max_value", max_value)
    return st.binary(min_size=MODEL_LEN_BYTES, max_size=MODEL_LEN_BYTES).map(
        lambda data: _model_len(_Fields(data), max_value)
    )


def _model_len(fields: "_Fields", max_value: int) -> int:
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
    capacity_width = policy.capacity_width if target is None else target.capacity_width
    lens = st.just(max_model_len) if max_model_len is not None else max_model_lens()
    return lens.map(lambda n: capacity_width(n, COMPRESS_RATIO))


@functools.lru_cache(maxsize=4096)
def _length_edges(max_len: int) -> tuple[int, ...]:
    """Sequence lengths at the edges: (p + 1) % 128 in {0, 1} for the last
    position p = L - 1, L // 128 at and around powers of two, and max_len."""
    edges = {max_len, max_len - 1, COMPRESS_RATIO - 1, COMPRESS_RATIO, COMPRESS_RATIO + 1}
    power = 1
    while power * COMPRESS_RATIO <= max_len + COMPRESS_RATIO:
        base = power * COMPRESS_RATIO
        edges.update((base - 1, base, base + 1, base + COMPRESS_RATIO - 1, base + COMPRESS_RATIO))
        power *= 2
    return tuple(sorted(v for v in edges if 1 <= v <= max_len))


@functools.lru_cache(maxsize=4096)
def _edges_from(max_len: int, min_len: int) -> tuple[int, ...]:
    return tuple(v for v in _length_edges(max_len) if v >= min_len)


# A step is decoded from two byte strings, its layout (everything but the
# requests, fixed size) and its requests (REQUEST_BYTES each): two
# Hypothesis choices instead of about twenty, each costing tens of
# microseconds, which at 512 tokens made drawing most of an example's time.
# Zero bytes decode to the simplest value (no requests, one query token, the
# shortest sequence, no padding, identity pages, the policy's width), and
# Hypothesis shrinks bytes towards zeros and the request counts towards
# fewer, so shrinking still ends at the smallest step.
REQUEST_BYTES = 6  # query length (2), edge selector (1), sequence length (3)
PAD_BYTES = 5  # source token (2), position (3)
INDEX_BYTES = 2
SLOT_BYTES = 3
TABLE_BYTES = 12  # junk columns (1), scale (3), offset (3), junk kind (1), junk (4)
MODEL_LEN_BYTES = 5  # kind (2), value (3)
MAX_INSIDE_PADDING = 3
MAX_JUNK_SLOTS = 3
LAYOUT_BYTES = (
    MODEL_LEN_BYTES
    + 2 + 2  # decode and prefill request counts
    + 1 + 2  # width kind and value
    + 1 + MAX_QUERY_TOKENS_PER_DECODE * PAD_BYTES  # tail padding
    + 1 + MAX_INSIDE_PADDING * INDEX_BYTES  # padding inside
    + 1 + MAX_JUNK_SLOTS * SLOT_BYTES  # slot_mapping entries past T
    + TABLE_BYTES
    + 1 + 1  # the table's row stride: wider or not, by how much
    + 2  # buffer rows
    + 1  # prefill buffer wider or not
)


def _uint(data: bytes) -> int:
    return int.from_bytes(data, "big")


class _Fields:
    """Unsigned big-endian fields read off a drawn byte string, in order."""

    def __init__(self, data: bytes):
        self.data = data
        self.offset = 0

    def take(self, size: int) -> bytes:
        chunk = self.data[self.offset : self.offset + size]
        self.offset += size
        return chunk

    def uint(self, size: int) -> int:
        return _uint(self.take(size))

    def between(self, size: int, low: int, high: int) -> int:
        """A value in [low, high] from ``size`` bytes; zeros give ``low``."""
        return low + self.uint(size) % (high - low + 1)


def _sequence_length(selector: int, value: int, min_len: int, max_len: int) -> int:
    """A sequence length in [min_len, max_len]: for an odd ``selector`` one of
    the edges (last position p with (p + 1) % 128 in {0, 1}, ``L // 128`` at
    and around powers of two, ``max_len``), else ``value`` spread uniformly;
    zeros give ``min_len``."""
    if selector & 1:
        edges = _edges_from(max_len, min_len)
        if edges:
            return edges[value % len(edges)]
    return min_len + value % (max_len - min_len + 1)


def _requests_from_bytes(
    blob: bytes, max_tokens: int, max_query: int, max_len: int
) -> list["_Request"]:
    """Requests from :data:`REQUEST_BYTES` bytes each, until ``max_tokens``
    query tokens are spent; half of the sequence lengths sit at an edge."""
    requests = []
    budget = max_tokens
    for start in range(0, len(blob) - REQUEST_BYTES + 1, REQUEST_BYTES):
        if budget < 1:
            break
        record = blob[start : start + REQUEST_BYTES]
        query = 1 + _uint(record[0:2]) % max(1, min(max_query, budget, max_len))
        seq = _sequence_length(record[2], _uint(record[3:6]), query, max_len)
        requests.append(_Request(seq_len=seq, query_len=query))
        budget -= query
    return requests


def _signed(value: int, bound: int) -> int:
    """``value`` folded into [-bound, bound], zero first: 0, -1, 1, -2, 2, ..."""
    value %= 2 * bound + 1
    return -(value + 1) // 2 if value % 2 else value // 2


@st.composite
def block_tables(draw, pages_needed: list[int], *, max_junk_columns: int = 3) -> PermutedBlockTable:
    """Block-table rows for requests needing ``pages_needed[i]`` pages each.

    Page numbers are unique across the table and shuffled (an affine
    permutation of 0..N-1 modulo :data:`PAGE_PRIME`, held as a
    :class:`~c128a.batch.PermutedBlockTable`); every row has the same width,
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
    junk = _signed(_uint(data[8:12]), 2**31 - 1) if data[7] & 1 else -7
    return PermutedBlockTable(
        pages_needed=tuple(pages_needed),
        width=width,
        scale=1 + _uint(data[1:4]) % (PAGE_PRIME - 1),
        offset=_uint(data[4:7]) % PAGE_PRIME,
        junk=junk,
    )


@dataclass(frozen=True)
class _Request:
    seq_len: int
    query_len: int

    def positions(self) -> list[int]:
        return list(range(self.seq_len - self.query_len, self.seq_len))


def _pages_for(seq_len: int, block_size: int) -> int:
    entries = seq_len // COMPRESS_RATIO
    return -(-entries // block_size)


@st.composite
def batches(
    draw,
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
    steer: bool = False,
) -> Batch:
    """One engine step as a :class:`~c128a.batch.Batch`, the main entry point.

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
    policy can reach for C (the
    kernel-level contract holds at every width; n(t) = min(., W) clamps),
    with ``widths="policy"`` none do.

    Labels examples with ``event()`` (width bucket, decode/prefill mix,
    padding). With ``steer=True`` it also reports ``target()`` scores (tokens,
    width doublings) so that long runs' target phase climbs towards bigger
    steps and wider W; off by default, because with a few dozen examples the
    target phase spends them on near-copies of the biggest batch.
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
    capacity_width = policy.capacity_width if target is None else target.capacity_width
    active_topk_width = policy.active_topk_width if target is None else target.active_topk_width

    layout = _Fields(draw(st.binary(min_size=LAYOUT_BYTES, max_size=LAYOUT_BYTES)))
    model_len = _model_len(layout, MAX_MODEL_LEN)
    model_len = max_model_len or model_len
    capacity = capacity_width(model_len, COMPRESS_RATIO)

    decode_count = layout.between(2, min_decode_requests, max_decode_requests)
    prefill_count = layout.between(2, min_prefill_requests, max_prefill_requests)
    size = (decode_count + prefill_count) * REQUEST_BYTES
    records = draw(st.binary(min_size=size, max_size=size))
    decode = _requests_from_bytes(
        records[: decode_count * REQUEST_BYTES],
        max_tokens - min_prefill_requests,
        MAX_QUERY_TOKENS_PER_DECODE,
        model_len,
    )
    used = sum(r.query_len for r in decode)
    prefill = _requests_from_bytes(
        records[decode_count * REQUEST_BYTES :], max_tokens - used, max_prefill_chunk, model_len
    )

    positions: list[int] = []
    requests_of_tokens: list[int] = []
    for index, request in enumerate(decode + prefill):
        tokens = request.positions()
        positions += tokens
        requests_of_tokens += [index] * len(tokens)
    num_decode = sum(r.query_len for r in decode)
    real_tokens = len(positions)
    max_seq_len = max((r.seq_len for r in decode + prefill), default=0)

    check(widths in ("any", "policy"), f"widths={widths!r} must be 'any' or 'policy'")
    kernel_level = False
    width_kind, width_value = layout.uint(1), layout.uint(2)
    if width is None:
        width = active_topk_width(max_seq_len, COMPRESS_RATIO, capacity)
        aligned = capacity // policy.WIDTH_ALIGNMENT
        choice = width_kind % 3 if widths == "any" and aligned >= 1 else 0
        if choice == 1 and width > policy.WIDTH_ALIGNMENT:
            # Narrower than the batch needs: n(t) = min(., W) clamps.
            narrower = width // policy.WIDTH_ALIGNMENT - 1
            width = (1 + width_value % narrower) * policy.WIDTH_ALIGNMENT
            kernel_level = True
        elif choice >= 1:  # any width the policy can reach, C included
            reachable = policy.reachable_widths(capacity)
            width = reachable[width_value % len(reachable)]
            kernel_level = True

    # CUDA-graph padding at the tail: stale copies of real tokens' positions
    # and requests, slot -1. In a decode-only step they are decode tokens.
    tail = layout.uint(1) % (MAX_QUERY_TOKENS_PER_DECODE + 1)
    pads = layout.take(MAX_QUERY_TOKENS_PER_DECODE * PAD_BYTES)
    tail = tail if padding and real_tokens else 0
    for start in range(0, tail * PAD_BYTES, PAD_BYTES):
        source = _uint(pads[start : start + 2]) % real_tokens
        positions.append(_uint(pads[start + 2 : start + PAD_BYTES]) % (positions[source] + 1))
        requests_of_tokens.append(requests_of_tokens[source])
    if not prefill:
        # Tail padding of a decode-only step must reference decode rows.
        num_decode = len(positions)
    slots = [p for p in positions]
    for t in range(real_tokens, len(positions)):
        slots[t] = -1
    inside_count = layout.uint(1) % (MAX_INSIDE_PADDING + 1)
    picks = layout.take(MAX_INSIDE_PADDING * INDEX_BYTES)
    inside = []
    if padding and real_tokens:
        for start in range(0, inside_count * INDEX_BYTES, INDEX_BYTES):
            token = _uint(picks[start : start + INDEX_BYTES]) % real_tokens
            if token not in inside:
                inside.append(token)
    for t in inside:
        slots[t] = -1
    junk_count = layout.uint(1) % (MAX_JUNK_SLOTS + 1)
    junk_slots = layout.take(MAX_JUNK_SLOTS * SLOT_BYTES)
    extra_slots = [
        _signed(_uint(junk_slots[start : start + SLOT_BYTES]), 2**20)
        for start in range(0, junk_count * SLOT_BYTES, SLOT_BYTES)
    ]

    pages_needed = []
    for request in decode:
        # The engine's table covers the whole sequence, whatever the width.
        pages_needed.append(_pages_for(request.seq_len, BLOCK_SIZE))
    table = _block_table(layout.take(TABLE_BYTES), pages_needed)
    table_width = table.width if table else 0
    wider_table, extra_stride = layout.uint(1), layout.uint(1)
    row_stride = 0
    if table and wider_table & 1:
        row_stride = table_width + 1 + extra_stride % 64

    num_tokens = len(positions)
    buffer_rows = layout.between(2, max(num_tokens, 1), max(max_buffer_rows, num_tokens, 1))
    # Sometimes a wider prefill buffer: its row stride then differs from the
    # decode buffer's, so a builder that mixes the two up writes wrong rows.
    prefill_extra = 128 if layout.uint(1) % 4 == 3 else 0
    assert layout.offset == LAYOUT_BYTES, (layout.offset, LAYOUT_BYTES)

    num_prefill = num_tokens - num_decode
    mix = (
        "no tokens"
        if num_tokens == 0
        else "decode only"
        if num_prefill == 0
        else "prefill only"
        if num_decode == 0
        else "decode + prefill"
    )
    padded = (
        ("tail and inside padding" if inside else "tail padding")
        if tail
        else ("inside padding" if inside else "no padding")
    )
    width_bucket = f"W={width} of C={capacity}" if width == capacity else f"W={width} < C"
    speculative = any(r.query_len > 1 for r in decode)
    labels = (mix, padded, width_bucket)
    labels += ("speculative decode",) if speculative else ()
    labels += ("kernel-level width",) if kernel_level else ()
    for label in labels:
        _event(label)
    if steer:
        _target(float(num_tokens), "tokens")
        _target(float(max(width, 0).bit_length()), "width doublings")

    return Batch(
        positions=tuple(positions),
        num_decode_tokens=num_decode,
        token_to_req_indices=tuple(requests_of_tokens),
        block_table=table,
        slot_mapping=tuple(slots) + tuple(extra_slots),
        max_model_len=model_len,
        capacity=capacity,
        width=width,
        buffer_rows=buffer_rows,
        block_table_row_stride=row_stride,
        prefill_extra_columns=prefill_extra,
        compress_ratio=COMPRESS_RATIO,
        block_size=BLOCK_SIZE,
        labels=labels,
    )


def engine_batch(
    decode: list[tuple[int, int]] = (),
    prefill: list[tuple[int, int]] = (),
    *,
    max_model_len: int = 81_920,
    tail_padding: int = 0,
    inside_padding: tuple[int, ...] = (),
    table_row_stride: int = 0,
    buffer_rows: int | None = None,
    width: int | None = None,
    target=None,
    labels: tuple[str, ...] = (),
) -> Batch:
    """A concrete engine step, for ``@example`` and regression cases.

    ``decode`` and ``prefill`` list requests as ``(seq_len, query_len)``;
    tokens are each request's last ``query_len`` positions, decode first.
    Tail padding tokens repeat the last real token's position and request
    with slot -1 (decode tokens when there is no prefill); ``inside_padding``
    gives real tokens slot -1. Page numbers are unique and in reverse order,
    one spare junk column per row. The capacity and width come from
    ``target``'s policy (the project's when None) unless ``width`` is given.
    """
    capacity_width = policy.capacity_width if target is None else target.capacity_width
    active_topk_width = policy.active_topk_width if target is None else target.active_topk_width
    capacity = capacity_width(max_model_len, COMPRESS_RATIO)
    requests = [_Request(s, q) for s, q in list(decode) + list(prefill)]
    positions, owners = [], []
    for index, request in enumerate(requests):
        positions += request.positions()
        owners += [index] * request.query_len
    real = len(positions)
    max_seq_len = max((r.seq_len for r in requests), default=0)
    if width is None:
        width = active_topk_width(max_seq_len, COMPRESS_RATIO, capacity)
    for _ in range(tail_padding if real else 0):
        positions.append(positions[real - 1])
        owners.append(owners[real - 1])
    num_decode = sum(q for _, q in decode)
    if not prefill:
        num_decode = len(positions)
    slots = [p if t < real and t not in inside_padding else -1 for t, p in enumerate(positions)]
    needs = [_pages_for(s, BLOCK_SIZE) for s, _ in decode]
    total = sum(needs)
    table, counter = [], 0
    columns = max(needs, default=0) + 1
    for need in needs:
        row = [total - 1 - (counter + c) for c in range(need)] + [-7] * (columns - need)
        counter += need
        table.append(tuple(row))
    return Batch(
        positions=tuple(positions),
        num_decode_tokens=num_decode,
        token_to_req_indices=tuple(owners),
        block_table=tuple(table),
        slot_mapping=tuple(slots),
        max_model_len=max_model_len,
        capacity=capacity,
        width=width,
        buffer_rows=buffer_rows if buffer_rows is not None else max(len(positions) + 3, 1),
        block_table_row_stride=table_row_stride,
        compress_ratio=COMPRESS_RATIO,
        block_size=BLOCK_SIZE,
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
        "no_tokens": engine_batch(),
        "no_decode": engine_batch(prefill=[(600, 4), (128, 1)]),
        "no_prefill": engine_batch([(600, 1), (1_000, 3)]),
    }


HISTORICAL_BATCHES: dict[str, Batch] = _historical_batches()
"""The contract's historical failures as concrete batches (project policy)."""
