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

Past the engine's usual step they reach the rest of the contract's input
space: engine-scale steps within a device's size budget (:mod:`.budget`),
compress ratios and block sizes over their whole range, buffers placed
inside larger allocations, an earlier step's width narrower or wider than
the step's (:mod:`.reach` names the buckets).

Every strategy shrinks towards the smallest engine step it can describe:
fewer requests, shorter sequences, identity page numbers, no padding, the
engine's R and B, fresh contiguous buffers, at a model length whose
capacity (640) exceeds the smallest width. Strategies only draw: the
property running them reports ``event()`` and ``target()`` observations
from the step's buckets (:mod:`c128a.checks.properties`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
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
from ..step import (
    MAX_BUFFER_ELEMENTS,
    MAX_BUFFER_ROWS,
    Batch,
    BufferLayout,
    PaddingToken,
    PermutedBlockTable,
    StepRequest,
    assemble_batch,
    page_modulus,
)
from .budget import ENGINE_TOKENS, MAX_REQUESTS, SizeBudget
from .reach import floors_wrong, is_power_of_two
from .layout import (
    INDEX_BYTES,
    LAYOUT_BYTES,
    MAX_INSIDE_PADDING,
    MAX_JUNK_SLOTS,
    MODEL_LEN_BYTES,
    PAD_BYTES,
    REQUEST_BYTES,
    SHAPE_BYTES,
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

GEOMETRY_ONE_IN = 2
"""One step in this many takes a compress ratio and block size other than
the engine's (unless the step's ``max_model_len`` is given: steps that share
an engine's buffers share its R)."""

MAX_RATIO = 1 << 16
"""The largest compress ratio drawn (a Batch field's bound)."""


def _inexact_from(value: int, high: int) -> int:
    """The first divisor in [``value``, ``high``] whose float32 reciprocal
    floors ``divisor / divisor`` to 0 (about one in seven divisors that are
    not powers of two does, from 41 on); ``value`` when none is found in the
    next 512."""
    for candidate in range(value, min(value + 512, high + 1)):
        if floors_wrong(np.array([candidate]), candidate):
            return candidate
    return value


def _ratio(kind: int, value: int) -> int:
    """The compress ratio R of a drawn kind: 0 the engine's 128, 1 one, 2 a power
    of two from 2 to 64, 3 a power of two from 256 to 65,536, 4 any other
    value up to 65,536, for three ``value`` in four one whose float32
    reciprocal floors a multiple of R wrong."""
    kind %= 5
    if kind == 0:
        return COMPRESS_RATIO
    if kind == 1:
        return 1
    if kind == 2:
        return 1 << (1 + value % 6)
    if kind == 3:
        return 1 << (8 + value % 9)
    ratio = 3 + (value >> 2) % (MAX_RATIO - 3)
    ratio += is_power_of_two(ratio)
    return _inexact_from(ratio, MAX_RATIO) if value % 4 else ratio


def _block_size(kind: int, value: int, capacity: int) -> int:
    """The block size B of a drawn kind: 0 the engine's 2, 1 one, 2 a power of
    two from 4 to 128, 3 above 128 up to the capacity (at least 256), 4 a
    value below 128 that is not a power of two, for three ``value`` in four
    one whose float32 reciprocal floors a column's page wrong (41 to 123)."""
    kind %= 5
    if kind == 0:
        return BLOCK_SIZE
    if kind == 1:
        return 1
    if kind == 2:
        return 1 << (2 + value % 6)
    if kind == 3:
        top = max(capacity, 2 * WIDTH_ALIGNMENT)
        return WIDTH_ALIGNMENT + 1 + value % (top - WIDTH_ALIGNMENT)
    if value % 4 == 0:
        size = 3 + (value >> 2) % 124
        return size + is_power_of_two(size)
    # From 41, the first B whose float32 reciprocal floors a page wrong.
    return _inexact_from(41 + (value >> 2) % 80, WIDTH_ALIGNMENT - 1)


ENGINE_PREFILL_REQUESTS = 32
"""The most prefill requests (chunks) of an engine-scale step; the rest of
its 512 requests decode."""

SINGLE_TOKEN_ONE_IN = 16
"""One small step in this many has at most one token."""

ENGINE_SCALES = (
    (65, 1_024),  # hundreds of tokens
    (1_025, ENGINE_TOKENS),  # thousands: the engine's usual budget
    (ENGINE_TOKENS + 1, None),  # past it (up to the budget's max_tokens)
)
"""Token ranges of an engine-scale step, drawn uniformly."""


@dataclass(frozen=True)
class _Scale:
    """The size of one drawn step: its token budget and request counts."""

    tokens: int
    max_decode_requests: int
    max_prefill_requests: int
    max_prefill_chunk: int
    engine: bool = False
    max_capacity: int = MAX_CAPACITY
    tail_padding: bool = True


def _scale(shape: Fields, budget: SizeBudget | None, small: _Scale) -> _Scale:
    """The step's scale from the next 3 bytes of ``shape``: ``small`` (the
    property's own size; zeros give it) or, one step in
    ``budget.engine_one_in``, an engine-scale step of a token count drawn
    log-uniformly in one of :data:`ENGINE_SCALES`, up to 512 requests, its
    capacity held within ``budget.max_elements`` / tokens."""
    pick, where = shape.uint(1), shape.uint(2)
    if budget is None or pick % budget.engine_one_in != budget.engine_one_in - 1:
        # A step of one token (one decode token, or one prefill token) now
        # and then: random byte strings seldom stop there on their own.
        single = where % SINGLE_TOKEN_ONE_IN == SINGLE_TOKEN_ONE_IN - 1
        if single:
            return dataclasses.replace(small, tokens=min(small.tokens, 1), tail_padding=False)
        return small
    low, high = ENGINE_SCALES[pick // budget.engine_one_in % len(ENGINE_SCALES)]
    high = budget.max_tokens if high is None else min(high, budget.max_tokens)
    tokens = round(low * (high / low) ** (where / 0xFFFF))
    # Tail padding adds up to 8 tokens, and the buffers a few rows.
    room = tokens + 2 * MAX_QUERY_TOKENS_PER_DECODE
    capacity = budget.max_elements // room // WIDTH_ALIGNMENT * WIDTH_ALIGNMENT
    return _Scale(
        tokens=tokens,
        max_decode_requests=min(MAX_REQUESTS - ENGINE_PREFILL_REQUESTS, tokens),
        max_prefill_requests=ENGINE_PREFILL_REQUESTS,
        max_prefill_chunk=tokens,
        engine=True,
        max_capacity=max(WIDTH_ALIGNMENT, min(MAX_CAPACITY, capacity)),
    )


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


def _model_len(fields: Fields, max_value: int, ratio: int = COMPRESS_RATIO) -> int:
    """:func:`max_model_lens`'s value from the next :data:`MODEL_LEN_BYTES`
    bytes of ``fields``; zeros give the first edge that fits. One kind of
    length sits one token past a whole number of 128-entry tiles at
    ``ratio`` (128 R 2^k + 1): ceil(L / R) and floor(L / R) then give
    capacities a tile apart."""
    kind, value = fields.uint(2), fields.uint(3)
    edges = [v for v in EDGE_MAX_MODEL_LENS if v <= max_value]
    past_tiles = [
        WIDTH_ALIGNMENT * ratio * (1 << k) + 1
        for k in range(14) if ratio > 1 and WIDTH_ALIGNMENT * ratio * (1 << k) + 1 <= max_value
    ]
    # Edges, lengths past whole tiles, each magnitude from 2**14 up (below it
    # every capacity is 128), and any length: equally likely, so most lengths
    # are log-uniform.
    top = max_value.bit_length()
    magnitudes = list(range(min(15, top), top + 1))
    kind = kind % ((1 if edges else 0) + (1 if past_tiles else 0) + len(magnitudes) + 1)
    if edges:
        if kind == 0:
            return edges[value % len(edges)]
        kind -= 1
    if past_tiles:
        if kind == 0:
            return past_tiles[value % len(past_tiles)]
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
    blob: bytes, max_tokens: int, max_query: int, max_len: int, ratio: int = COMPRESS_RATIO,
    *, fill: bool = False,
) -> list[_Request]:
    """Requests from :data:`REQUEST_BYTES` bytes each, until ``max_tokens``
    query tokens are spent; half of the sequence lengths sit at an edge.
    With ``fill`` each request takes at least an even share of the tokens
    left (the last one all of them, up to ``max_query`` and the model
    length): an engine-scale step's prefill chunks then add up to its token
    count."""
    requests = []
    budget = max_tokens
    records = len(blob) // REQUEST_BYTES
    for index in range(records):
        if budget < 1:
            break
        record = blob[index * REQUEST_BYTES : (index + 1) * REQUEST_BYTES]
        most = max(1, min(max_query, budget, max_len))
        query = 1 + uint(record[0:2]) % most
        if fill:
            query = max(query, min(-(-budget // (records - index)), most))
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


def _block_table(data: bytes, pages_needed: list[int], max_junk_columns: int = 3,
                 *, block_size: int = BLOCK_SIZE):
    """The table :func:`block_tables` describes, from :data:`TABLE_BYTES` bytes:
    page numbers modulo :func:`~c128a.step.page_modulus` of ``block_size``,
    so that every slot id fits int32."""
    if not pages_needed:
        return ()
    prime = page_modulus(block_size, sum(pages_needed))
    width = max(max(pages_needed) + data[0] % (max_junk_columns + 1), 1)
    junk = signed(uint(data[8:12]), 2**31 - 1) if data[7] & 1 else -7
    return PermutedBlockTable(
        pages_needed=tuple(pages_needed),
        width=width,
        scale=1 + uint(data[1:4]) % (prime - 1),
        offset=uint(data[4:7]) % prime,
        junk=junk,
        prime=prime,
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
    budget: SizeBudget | None = None,
    layouts: bool = True,
    prior_widths: bool = False,
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
    n(t) = min(., W) clamps), with ``widths="policy"`` none do.

    The contract's wider input space, each part drawn now and then:

    - ``budget`` (:mod:`.budget`; None: none) makes one step in
      ``budget.engine_one_in`` engine-scale: 65 to 16,384 tokens, up to 512
      requests, within the budget's elements;
    - the compress ratio R and block size B are the engine's 128 and 2 for
      three steps in four, else drawn over their whole range (powers of two
      and not, B above 128 up to C, values whose float32 reciprocal divides
      wrong); always drawn with ``geometries=True``, never when
      ``max_model_len`` is given (steps sharing buffers share R);
    - with ``layouts`` (the default) half the steps place their buffers as
      an engine's workspace may: at a storage offset, with a row stride above
      their columns, or all three in one allocation (:class:`~c128a.step.BufferLayout`);
    - with ``prior_widths`` the step records the width of the step built
      into its buffers before it (``prior_width``: narrower, the same, wider
      or the widest), for ``history_independent``.

    Shrinks towards T = 0 at max_model_len 81,920 (C = 640, so W = 128 < C):
    no requests, short sequences, identity page numbers, no padding, the
    engine's R and B, fresh contiguous buffers.
    """
    check(max_tokens >= 0, f"max_tokens={max_tokens} must be >= 0")
    most_tokens = MAX_BUFFER_ROWS - MAX_QUERY_TOKENS_PER_DECODE
    check(
        max_tokens <= most_tokens,
        f"max_tokens={max_tokens} must be <= {most_tokens}: a step's buffers hold at most "
        f"{MAX_BUFFER_ROWS} rows (T tokens and tail padding), the most a saved case may hold",
    )
    if max_buffer_rows is None:
        max_buffer_rows = max(64, max_tokens + MAX_QUERY_TOKENS_PER_DECODE)
    check(
        max_tokens + MAX_QUERY_TOKENS_PER_DECODE <= max_buffer_rows <= MAX_BUFFER_ROWS,
        f"max_buffer_rows={max_buffer_rows} must be in [max_tokens + 8 "
        f"(= {max_tokens + MAX_QUERY_TOKENS_PER_DECODE}), {MAX_BUFFER_ROWS}] to hold T tokens "
        "and tail padding in a step a case can hold",
    )
    check(widths in WIDTHS, f"widths={widths!r} must be one of {', '.join(map(repr, WIDTHS))}")
    check(
        0 <= min_decode_requests <= max_decode_requests
        and 0 <= min_prefill_requests <= max_prefill_requests,
        f"request counts must satisfy 0 <= min <= max: decode {min_decode_requests}.."
        f"{max_decode_requests}, prefill {min_prefill_requests}..{max_prefill_requests}",
    )
    small = _Scale(
        tokens=max_tokens,
        max_decode_requests=max_decode_requests,
        max_prefill_requests=max_prefill_requests,
        max_prefill_chunk=max_prefill_chunk,
    )
    return _batches(
        target,
        max_model_len=max_model_len,
        small=small,
        max_buffer_rows=max_buffer_rows,
        min_decode_requests=min_decode_requests,
        min_prefill_requests=min_prefill_requests,
        padding=padding,
        widths=widths,
        width=width,
        geometries=geometries,
        budget=budget,
        layouts=layouts,
        prior_widths=prior_widths,
    )


@st.composite
def _batches(
    draw,
    target,
    *,
    max_model_len,
    small,
    max_buffer_rows,
    min_decode_requests,
    min_prefill_requests,
    padding,
    widths,
    width,
    geometries,
    budget,
    layouts,
    prior_widths,
) -> Batch:
    # What differs from the engine's usual step comes first, in its own
    # bytes: zeros give the small step, the engine's R and B, fresh buffers.
    shape = Fields(draw(st.binary(min_size=SHAPE_BYTES, max_size=SHAPE_BYTES)))
    scale = _scale(shape, budget, small)
    geometry_pick, ratio_kind, ratio_value = shape.uint(1), shape.uint(1), shape.uint(2)
    block_kind, block_value = shape.uint(1), shape.uint(2)
    drawn_geometry = max_model_len is None and (
        geometries or geometry_pick % GEOMETRY_ONE_IN == GEOMETRY_ONE_IN - 1
    )
    ratio = _ratio(ratio_kind, ratio_value) if drawn_geometry else COMPRESS_RATIO
    layout_kind, layout_offset, layout_padding = shape.uint(1), shape.uint(1), shape.uint(2)
    prior_kind, prior_value = shape.uint(1), shape.uint(1)

    layout = Fields(draw(st.binary(min_size=LAYOUT_BYTES, max_size=LAYOUT_BYTES)))
    longest = min(MAX_MODEL_LEN, scale.max_capacity * ratio)
    model_len = _model_len(layout, longest, ratio)
    if scale.engine:
        # Long enough that the step's prefill requests can hold its tokens.
        shortest = min(longest, -(-scale.tokens // scale.max_prefill_requests))
        if model_len < shortest:
            model_len = shortest + model_len % (longest - shortest + 1)
    model_len = max_model_len or model_len
    capacity = target_capacity(target, model_len, ratio)
    block_size = _block_size(block_kind, block_value, capacity) if drawn_geometry else BLOCK_SIZE

    min_prefill = min_prefill_requests
    if scale.engine:
        # Enough prefill requests, each within the model length, for the
        # tokens that decode requests (8 tokens each at most) cannot hold.
        beyond_decode = scale.tokens - scale.max_decode_requests * MAX_QUERY_TOKENS_PER_DECODE
        min_prefill = max(min_prefill, min(-(-max(beyond_decode, 0) // model_len),
                                           scale.max_prefill_requests))
    max_prefill = max(min_prefill, scale.max_prefill_requests)
    decode_count = layout.between(2, min_decode_requests,
                                  max(min_decode_requests, scale.max_decode_requests))
    prefill_count = layout.between(2, min_prefill, max_prefill)
    size = (decode_count + prefill_count) * REQUEST_BYTES
    records = draw(st.binary(min_size=size, max_size=size))
    max_tokens = scale.tokens
    decode = _requests_from_bytes(
        records[: decode_count * REQUEST_BYTES],
        max_tokens - min_prefill,
        MAX_QUERY_TOKENS_PER_DECODE,
        model_len,
        ratio,
    )
    used = sum(r.query_len for r in decode)
    prefill = _requests_from_bytes(
        records[decode_count * REQUEST_BYTES :], max_tokens - used, scale.max_prefill_chunk,
        model_len, ratio, fill=scale.engine,
    )
    real_positions = [p for r in decode + prefill for p in r.step().positions]
    real_requests = [i for i, r in enumerate(decode + prefill) for _ in range(r.query_len)]
    real_tokens = len(real_positions)
    max_seq_len = max((r.seq_len for r in decode + prefill), default=0)

    width_kind, width_value = layout.uint(1), layout.uint(2)
    if width is None:
        width = target_width(target, max_seq_len, ratio, capacity)
        aligned = capacity // WIDTH_ALIGNMENT
        choice = width_kind % 3 if widths == "any" and aligned >= 1 else 0
        if choice == 1 and width > WIDTH_ALIGNMENT:
            # Narrower than the batch needs: n(t) = min(., W) clamps.
            narrower = width // WIDTH_ALIGNMENT - 1
            width = (1 + width_value % narrower) * WIDTH_ALIGNMENT
        elif choice >= 1:  # any width the policy can reach, C included
            reachable = policy.reachable_widths(capacity)
            width = reachable[width_value % len(reachable)]
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
    tail = tail if padding and scale.tail_padding and real_tokens else 0
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
        layout.take(TABLE_BYTES), [pages_for(r.seq_len, block_size, ratio) for r in decode],
        block_size=block_size,
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
    rows_drawn = layout.uint(2)
    # Sometimes a wider prefill buffer: its row stride then differs from the
    # decode buffer's, so a builder that mixes the two up writes wrong rows.
    prefill_extra = 128 if layout.uint(1) % 4 == 3 else 0
    if layout.offset != LAYOUT_BYTES:
        raise HarnessError(f"the layout read {layout.offset} bytes, not its {LAYOUT_BYTES}")
    buffer_offset, row_padding, pooled = _buffer_layout(
        layout_kind, layout_offset, layout_padding, capacity, layouts
    )
    least_rows = max(num_tokens, 1)
    # An engine-scale step's wider rows stay within what a case may hold.
    room = MAX_BUFFER_ELEMENTS // least_rows - capacity
    prefill_extra = prefill_extra if prefill_extra <= room else 0
    row_padding = max(min(row_padding, room - prefill_extra), 0)
    row_length = capacity + prefill_extra + row_padding
    most_rows = max(max_buffer_rows, num_tokens + MAX_QUERY_TOKENS_PER_DECODE if scale.engine else 0)
    most_rows = max(min(most_rows, MAX_BUFFER_ELEMENTS // row_length), least_rows)
    buffer_rows = least_rows + rows_drawn % (most_rows - least_rows + 1)
    if buffer_rows * row_length > MAX_BUFFER_ELEMENTS:
        raise HarnessError(
            f"a drawn step's buffers need {buffer_rows} x {row_length} elements, more than a "
            f"case may hold ({MAX_BUFFER_ELEMENTS:,}): the size budget let T x C grow too far"
        )

    prior_width = _prior_width(prior_kind, prior_value, width, capacity) if prior_widths else 0
    return assemble_batch(
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
        buffer_layout=BufferLayout(buffer_offset, row_padding, pooled),
        prior_width=prior_width,
    )


def _buffer_layout(kind: int, offset: int, padding: int, capacity: int, drawn: bool):
    """(offset, row padding, pooled) of the step's buffers: fresh contiguous
    allocations for half the kinds (and whenever not ``drawn``), else a view
    at a storage offset (a multiple of 4 elements: 16-byte aligned, as an
    allocator hands out), rows further apart than their columns (up to 2C),
    one allocation for all three buffers with the decode buffer's last row
    right before the prefill buffer's first (within 16 bytes), or all of
    these at once."""
    kind = kind % 8 if drawn else 0
    offset = 4 * (1 + offset % 64)
    padding = 1 + padding % max(capacity, 2 * WIDTH_ALIGNMENT)
    return {
        4: (offset, 0, False),
        5: (0, padding, False),
        6: (0, 0, True),
        7: (offset, padding, True),
    }.get(kind, (0, 0, False))


def _prior_width(kind: int, value: int, width: int, capacity: int) -> int:
    """The width of the step built before this one into its buffers
    (``history_independent``): 0 (the widest the buffers allow) for a third
    of the kinds, this step's own W for a third, else any width the policy
    can reach for C, narrower or wider than W."""
    kind %= 3
    if kind == 1:
        return width
    reachable = [w for w in policy.reachable_widths(capacity) if w % WIDTH_ALIGNMENT == 0]
    if kind == 0 or not reachable:
        return 0
    return reachable[value % len(reachable)]


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


