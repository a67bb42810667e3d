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

Most steps aim for a row of the covering array (:mod:`.schedule`): the
decisions of :func:`batches` (scale, geometry, model length, request
counts, requests, width, padding, table, buffers, the width before), one
function each, take the row's bucket of every dimension they decide
(:mod:`.steering`), keeping a drawn value already in it.

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
import threading
import zlib
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
    target_capacity,
    target_reachable_widths,
    target_width,
)
from ..contract.validation import check, check_positive_int
from ..failures import HarnessError
from ..step import (
    MAX_BUFFER_ELEMENTS,
    MAX_BUFFER_ROWS,
    MAX_CASE_MODEL_LEN,
    Batch,
    BufferLayout,
    PaddingToken,
    PermutedBlockTable,
    StepRequest,
    assemble_batch,
    page_modulus,
)
from .budget import ENGINE_TOKENS, MAX_REQUESTS, SizeBudget
from .engine_inputs import (
    BEYOND_CAPS_CAPACITY,
    BEYOND_CAPS_TOKENS,
    ENGINE_INPUT_BYTES,
    EngineInputs,
    applied,
    beyond_caps_length,
    decode_inputs,
)
from .reach import floors_wrong, is_power_of_two, layout_bucket
from . import steering
from .constraints import INTERVALS, ROW_ALIGNMENT
from .schedule import NO_STEER, Steer, schedule
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


ENGINE_BANDS = {"65-1,024": 0, "1,025-8,192": 1, "above 8,192": 2}
"""The :data:`ENGINE_SCALES` band a steered token bucket asks for."""

BAND_EDGE_ONE_IN = 2
"""One steered engine-scale step in this many has its band's fewest or most
tokens (before tail padding)."""


def _token_hint(steer: Steer, budget: SizeBudget | None = None) -> tuple[int, int]:
    """The token counts an engine-scale step's row is easiest to reach at:
    its decode rows and prefill tokens together, few enough for its width
    within the budget (:func:`.steering.token_hint`), many requests a token
    each at least."""
    low, high = steering.token_hint(steer, budget.max_elements if budget else None)
    if steer.get("requests") == "257-512":
        low = max(low, 257)  # a token a request at least
    return low, high


def is_engine_scale(pick: int, budget: SizeBudget | None) -> bool:
    """Whether a step is engine-scale: one ``pick`` byte in ``budget.engine_one_in``."""
    return budget is not None and pick % budget.engine_one_in == budget.engine_one_in - 1


def _scale(pick: int, where: int, budget: SizeBudget | None, small: _Scale,
           steer: Steer = NO_STEER) -> _Scale:
    """The step's scale from the shape's first 3 bytes (``pick``,
    ``where``): ``small`` (the property's own size; zeros give it) or, one
    step in ``budget.engine_one_in``, an engine-scale step of a token count
    drawn log-uniformly in one of :data:`ENGINE_SCALES` (the band
    ``steer``'s token bucket names, when it names one; a steered step takes
    one of the band's edges one time in :data:`BAND_EDGE_ONE_IN`), up to
    512 requests, its capacity held within ``budget.max_elements`` / tokens."""
    engine = is_engine_scale(pick, budget)
    tokens_wanted = steer.get("tokens T")
    if steer.get("decode/prefill mix") == "no tokens":
        tokens_wanted = "0"
    if not engine:
        # A step of one token (one decode token, or one prefill token) now
        # and then: random byte strings seldom stop there on their own.
        if tokens_wanted == "0":
            return dataclasses.replace(small, tokens=0, tail_padding=False)
        single = where % SINGLE_TOKEN_ONE_IN == SINGLE_TOKEN_ONE_IN - 1
        if tokens_wanted == "1" or (single and tokens_wanted is None):
            return dataclasses.replace(small, tokens=min(small.tokens, 1), tail_padding=False)
        return small
    hint_low, hint_high = _token_hint(steer, budget)
    band = ENGINE_BANDS.get(tokens_wanted)
    if band is None:
        # A band the steer's token hint meets, else any.
        bands = [i for i, (low, high) in enumerate(ENGINE_SCALES)
                 if low <= hint_high and (high is None or high >= hint_low)]
        bands = bands or list(range(len(ENGINE_SCALES)))
        band = bands[pick // budget.engine_one_in % len(bands)]
    low, high = ENGINE_SCALES[band]
    high = budget.max_tokens if high is None else min(high, budget.max_tokens)
    if max(low, hint_low) <= min(high, hint_high):
        low, high = max(low, hint_low), min(high, hint_high)
    tokens = round(low * (high / low) ** (where / 0xFFFF))
    if steer and where % BAND_EDGE_ONE_IN == 0:
        # A band's edges (65, 1,024, 1,025, 8,192, ...) are where a launch
        # bound or a loop's last block is off by one; unsteered steps keep
        # main's draws (.schedule says why).
        tokens = (low, high)[where // BAND_EDGE_ONE_IN % 2]
    least = _elements_wanted(steer, budget)
    if least:
        tokens = _tokens_for_elements(tokens, low, high, budget, least, steer)
    return _Scale(
        tokens=tokens,
        max_decode_requests=min(MAX_REQUESTS - ENGINE_PREFILL_REQUESTS, tokens),
        max_prefill_requests=ENGINE_PREFILL_REQUESTS,
        max_prefill_chunk=tokens,
        engine=True,
        max_capacity=_widest_capacity(tokens, budget),
    )


def _widest_capacity(tokens: int, budget: SizeBudget) -> int:
    """The largest C an engine-scale step of ``tokens`` tokens may have:
    T x C within the budget's elements, tail padding (8 tokens) and a few
    rows of room included."""
    room = tokens + 2 * MAX_QUERY_TOKENS_PER_DECODE
    capacity = budget.max_elements // room // WIDTH_ALIGNMENT * WIDTH_ALIGNMENT
    return max(WIDTH_ALIGNMENT, min(MAX_CAPACITY, capacity))


def _elements_wanted(steer: Steer, budget: SizeBudget) -> int | None:
    """The fewest elements T x W the steer's elements bucket asks for, where
    the budget affords twice that: the interpreter's budget (1,179,648)
    barely reaches a million, and aiming engine-scale rows there would
    spend CI's minutes on builds the size buckets already cover."""
    least = ELEMENTS_AT_LEAST.get(steer.get("elements T x W"))
    if least is None or 2 * least > budget.max_elements:
        return None
    return least


def _tokens_for_elements(tokens: int, low: int, high: int, budget: SizeBudget,
                         least: int, steer: Steer = NO_STEER) -> int:
    """The token count in [low, high] nearest ``tokens`` whose widest build
    (T x the widest C, :func:`_widest_capacity`, or the widest W the
    steer's width bucket holds where W is not C) holds at least ``least``
    elements; ``tokens`` when none within 4,096 of it does."""
    width = INTERVALS["width W"].get(steer.get("width W"))
    against = steer.get("width against need")

    def widest(candidate: int) -> int:
        columns = _widest_capacity(candidate, budget)
        if width and against == "narrower than the longest list (clamps)":
            columns = min(columns - WIDTH_ALIGNMENT, width[1])  # any multiple of 128
        elif width and against not in (None, "C"):
            # The policy's widths and those above it are powers of two.
            top = min(columns - WIDTH_ALIGNMENT, width[1], MAX_CAPACITY)
            columns = 1 << (max(top, 1).bit_length() - 1)
        return columns

    for step in range(4_096):
        for candidate in (tokens - step, tokens + step):
            if low <= candidate <= high and candidate * widest(candidate) >= least:
                return candidate
    return tokens


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
    engine_geometry: bool = False,
    budget: SizeBudget | None = None,
    layouts: bool = True,
    prior_widths: bool = False,
    beyond_caps: bool = True,
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
      ``max_model_len`` is given (steps sharing buffers share R) or with
      ``engine_geometry=True`` (one engine configuration, its model length
      drawn and steered with the step);
    - with ``layouts`` (the default) half the steps place their buffers as
      an engine's workspace may: at a storage offset, with a row stride above
      their columns, or all three in one allocation (:class:`~c128a.step.BufferLayout`);
    - with ``prior_widths`` the step records the width of the step built
      into its buffers before it (``prior_width``: narrower, the same, wider
      or the widest), for ``history_independent``;
    - inputs as an engine hands them (:mod:`.engine_inputs`): each input a
      slice of a persistent tensor at a storage offset, 16-byte aligned or
      not; slot ids of KV pages, past 2^31 too; block-table rows sharing
      their leading pages, from page 0 or not; a decode buffer wider than
      the prefill buffer; and, with ``beyond_caps`` (the default), one
      unsteered small step in 16 past the engine's caps (up to 4 tokens,
      positions past 2^20, capacities up to 16,384).

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
    check(not (geometries and engine_geometry),
          "geometries=True draws R and B for every step, engine_geometry=True never: pass one")
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
        engine_geometry=engine_geometry,
        budget=budget,
        layouts=layouts,
        prior_widths=prior_widths,
        beyond_caps=beyond_caps,
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
    engine_geometry,
    budget,
    layouts,
    prior_widths,
    beyond_caps,
) -> Batch:
    # What differs from the engine's usual step comes first, in its own
    # bytes: zeros give the small step, the engine's R and B, fresh buffers.
    shape = draw(st.binary(min_size=SHAPE_BYTES, max_size=SHAPE_BYTES))
    layout_bytes = draw(st.binary(min_size=LAYOUT_BYTES, max_size=LAYOUT_BYTES))
    plan = functools.partial(
        _plan, shape, layout_bytes, target=target, max_model_len=max_model_len, small=small,
        min_decode_requests=min_decode_requests, min_prefill_requests=min_prefill_requests,
        geometries=geometries, engine_geometry=engine_geometry, budget=budget)
    # The records' size is the unsteered step's: a steer never changes what
    # is drawn, only what the bytes decode to (.schedule says why).
    unsteered = plan(NO_STEER)
    records = draw(st.binary(min_size=unsteered.records_size, max_size=unsteered.records_size))
    # Inputs as an engine hands them (.engine_inputs), in bytes drawn last:
    # an earlier choice sequence decodes to the step it did, these at zero.
    engine = is_engine_scale(shape[0], budget)
    row = schedule_row(shape, layout_bytes + records, engine, budget)
    extras = decode_inputs(
        draw(st.binary(min_size=ENGINE_INPUT_BYTES, max_size=ENGINE_INPUT_BYTES)),
        # Past the caps: small steps of a model length of their own, where
        # the bytes say so or the row asks for a bucket only they reach.
        beyond_allowed=beyond_caps and not engine and max_model_len is None,
        steer=row,
    )
    beyond = extras.beyond_value if extras.beyond_caps else None
    decode = functools.partial(
        _decoded, records=records, target=target, width=width,
        widths=widths, padding=padding, max_buffer_rows=max_buffer_rows, layouts=layouts,
        prior_widths=prior_widths, extras=extras)
    batch = decode(plan(row, beyond=beyond))
    _LAST_DRAWN.step = (batch, row)
    return batch


_LAST_DRAWN = threading.local()
"""The step this thread drew last and the row it was steered by."""


def steer_of(batch: Batch) -> Steer:
    """The row ``batch`` was steered by, where it is the step this thread
    drew last (a strategy drawing right after it, as
    :func:`~.shape_history.with_shape_history` does, steers its own part by
    the same row), else :data:`~.schedule.NO_STEER`. The row is a function
    of the step's bytes, so what follows stays one of the choice sequence."""
    drawn, row = getattr(_LAST_DRAWN, "step", (None, NO_STEER))
    return row if drawn is batch else NO_STEER


def _decoded(plan: "_Plan", *, records, target, width, widths, padding, max_buffer_rows,
             layouts, prior_widths, extras: EngineInputs = EngineInputs()) -> Batch:
    """The step ``plan`` and the request ``records`` describe: requests,
    width, padding, block table and buffers read from the layout's bytes,
    the inputs placed and valued as ``extras`` says (:mod:`.engine_inputs`)."""
    steer, scale, ratio, layout = plan.steer, plan.scale, plan.ratio, plan.layout
    if plan.beyond:
        # Columns up to 16,384: rows for the step's tokens and tail padding.
        max_buffer_rows = min(max_buffer_rows, scale.tokens + MAX_QUERY_TOKENS_PER_DECODE)
    model_len, capacity, block_size = plan.model_len, plan.capacity, plan.block_size
    layout_kind, layout_offset, layout_padding, prior_kind, prior_value = plan.shape_rest
    decode, prefill = _requests(_stretched(records, plan.records_size), plan.decode_count,
                                scale, plan.min_prefill, model_len, ratio, block_size, steer,
                                plan.decode_tokens)
    if plan.beyond:
        # Past the caps, the first request reaches the model length: its
        # positions past 2^20 (or its list past 8,192 entries).
        group = decode or prefill
        if group:
            group[0] = _Request(model_len, group[0].query_len)
    first = steer.get("first scheduled position")
    if first == "0 (every request from its start)":
        # New prompts: every request scheduled from position 0.
        decode = [_Request(r.query_len, r.query_len) for r in decode]
        prefill = [_Request(r.query_len, r.query_len) for r in prefill]
    elif first is not None and not plan.beyond:
        group = decode or prefill
        if group and all(r.seq_len == r.query_len for r in decode + prefill):
            if group[0].seq_len < model_len:
                group[0] = _Request(group[0].seq_len + 1, group[0].query_len)
    real_positions = [p for r in decode + prefill for p in r.step().positions]
    real_requests = [i for i, r in enumerate(decode + prefill) for _ in range(r.query_len)]
    real_tokens = len(real_positions)
    max_seq_len = max((r.seq_len for r in decode + prefill), default=0)

    width = _width(layout, target, width, widths, max_seq_len, ratio, capacity, steer)
    tail_byte, tail_draws, inside, extra_slots = _padding_draws(
        layout, padding and scale.tail_padding, padding, real_tokens, steer,
        _last_of_longer_requests(decode + prefill))
    tail_slot = PADDING_SLOTS[tail_byte // (MAX_QUERY_TOKENS_PER_DECODE + 1) % len(PADDING_SLOTS)]

    # The engine's table covers the whole sequence, whatever the width.
    table_bytes = layout.take(TABLE_BYTES)
    table = _block_table(
        table_bytes, [pages_for(r.seq_len, block_size, ratio) for r in decode],
        block_size=block_size,
    )
    table_width = table.width if table else 0
    stale_bound = (
        _stale_position_bound(target, model_len, capacity, table_width, ratio, block_size,
                              decode_tail=not prefill)
        if tail_byte >= STALE_LARGE_TAIL_BYTE else None
    )
    if stale_bound is not None and steer:
        # The row's longest sequence bounds stale positions too.
        stale_bound = min(stale_bound, steering.longest_range(steer, ratio)[1] - 1)
    if table and steer:
        # Junk columns past every row's need, after the stale bound: never read.
        table = dataclasses.replace(table, width=steering.table_width(table.width,
                                                                      table_bytes[0], steer))
        table_width = table.width
    if stale_bound is not None and steer.get("padding position") == "stale, past its request":
        # Copies of a request's last token: a larger position is past the request.
        last = {request: token for token, request in enumerate(real_requests)}
        tail_draws = [(last[real_requests[source]], value) for source, value in tail_draws]
    tail_padding = [
        PaddingToken(_tail_position(real_positions[source], value, stale_bound),
                     real_requests[source], tail_slot)
        for source, value in tail_draws
    ]
    wider_table, extra_stride = layout.uint(1), layout.uint(1)
    if steer:
        wider_table = steering.sliced_table(wider_table, steer)
    row_stride = table_width + 1 + extra_stride % 64 if table and wider_table & 1 else 0

    num_tokens = real_tokens + len(tail_padding)
    buffer_offset, row_padding, pooled, prefill_extra, buffer_rows = _buffers(
        layout, (layout_kind, layout_offset, layout_padding), capacity, num_tokens,
        max_buffer_rows, scale.engine, layouts, steer)

    if getattr(target, "fixed_width", False):
        prefill_extra = 0  # a fixed-width builder's engine sizes both buffers at C
    prior_width = (_prior_width(prior_kind, prior_value, width, capacity, target, ratio)
                   if prior_widths else 0)
    if prior_widths and steer:
        prior_width = steering.prior_width(
            prior_width, prior_value, width, capacity,
            [w for w in target_reachable_widths(target, capacity, ratio)
             if w % WIDTH_ALIGNMENT == 0], steer)
    return applied(assemble_batch(
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
    ), extras)


@dataclass(frozen=True)
class _Plan:
    """What a step's shape and layout bytes decide before its requests are
    read: the scale, R, the model length, C, B and the request counts, for
    one steer (the layout's fields read so far stay in ``layout``)."""

    steer: Steer
    scale: _Scale
    ratio: int
    model_len: int
    capacity: int
    block_size: int
    decode_count: int
    prefill_count: int
    min_prefill: int
    layout: Fields
    shape_rest: tuple[int, int, int, int, int]
    decode_tokens: tuple[int, int] | None = None  # an engine-scale row's decode tokens
    beyond: bool = False

    @property
    def records_size(self) -> int:
        return (self.decode_count + self.prefill_count) * REQUEST_BYTES


def _plan(shape: bytes, layout_bytes: bytes, steer: Steer, *, target, max_model_len, small,
          min_decode_requests, min_prefill_requests, geometries, budget,
          engine_geometry: bool = False, beyond: int | None = None) -> _Plan:
    """The step's :class:`_Plan` from its shape and layout bytes under
    ``steer``; with ``beyond`` (a value to draw it from) a model length past
    the engine's caps, and a few tokens (:mod:`.engine_inputs`)."""
    fields, layout = Fields(shape), Fields(layout_bytes)
    pick, where = fields.uint(1), fields.uint(2)
    scale = _scale(pick, where, budget, small, steer)
    if beyond is not None:
        scale = dataclasses.replace(scale, tokens=min(scale.tokens, BEYOND_CAPS_TOKENS),
                                    max_capacity=BEYOND_CAPS_CAPACITY)
    drawn_geometry = max_model_len is None and not engine_geometry
    ratio, block_pick = _geometry(fields, geometries and drawn_geometry, drawn_geometry, steer,
                                  scale.max_capacity)
    shape_rest = (fields.uint(1), fields.uint(1), fields.uint(2), fields.uint(1), fields.uint(1))
    model_len = _model_length(layout, scale, ratio, steer,
                              block_pick[0] if block_pick else BLOCK_SIZE)
    if beyond is not None:
        # Spread over the range: C above 8,192, or positions past 2^20.
        least, most = beyond_caps_length(beyond, ratio)
        most = min(most, MAX_CASE_MODEL_LEN)
        if steer.get("first scheduled position") == "1,048,576 and more":
            least = max(least, FAR_FIRST_LENGTH)
        if steer.get("capacity past 8,192") == "above 8,192":
            least = max(least, MAX_CAPACITY * ratio + 1)
        least = min(least, most)
        model_len = least + (most - least) * beyond // 0xFFFF
        if steer:
            model_len = steering.model_length(model_len, ratio, beyond, least, most, steer)
    model_len = max_model_len or model_len
    capacity = target_capacity(target, model_len, ratio)
    block_size = _block_size(block_pick[1], block_pick[2], capacity) if block_pick else BLOCK_SIZE
    if block_pick and steer:
        block_size = steering.block_size(block_pick[1] % 5, block_size, block_pick[2], capacity,
                                         steer)
    decode_count, prefill_count, min_prefill, decode_tokens = _request_counts(
        layout, scale, model_len, min_decode_requests, min_prefill_requests, steer)
    return _Plan(steer, scale, ratio, model_len, capacity, block_size, decode_count,
                 prefill_count, min_prefill, layout, shape_rest, decode_tokens,
                 beyond is not None)


FAR_FIRST_LENGTH = (1 << 20) + BEYOND_CAPS_TOKENS + 1
"""The least model length whose longest request, of up to 4 tokens, is
scheduled from position 2^20 on."""


def _stretched(records: bytes, size: int) -> bytes:
    """``records`` cut or lengthened to ``size`` bytes: a steer that asks for
    more requests than were drawn reads the drawn records again, each pass
    shifted by one; with none drawn, zeros (the simplest requests, so that
    a steered step shrinks as an unsteered one does)."""
    if size <= len(records):
        return records[:size]
    if not records:
        return bytes(size)
    extra = bytes((records[i % len(records)] + 1 + i // len(records)) % 256
                  for i in range(size - len(records)))
    return records + extra


GEOMETRY_PICK_AT = 3
"""Where the shape's geometry byte sits (after the scale's 3 bytes): its
lowest bit picks whether R and B are drawn, the bits above it the steer."""


def schedule_row(shape: bytes, layout: bytes, engine: bool, budget: SizeBudget | None = None
                 ) -> Steer:
    """The row of the covering array (:func:`.schedule.schedule`) a step
    aims for, or :data:`~.schedule.NO_STEER`: a step whose geometry byte
    has a bit set above the lowest (which picks whether R and B are drawn;
    no decision reads the others) aims for the row a CRC-32 of its bytes
    (``layout``: the layout's and the requests') picks. No byte is drawn for it: the choice sequence of
    every step is what it was without a schedule, an unsteered step decodes
    to the same value, and zeros (where shrinking ends) steer nothing. The
    checksum spreads the rows evenly although Hypothesis favours zeros and
    repeats values it drew before."""
    if not shape[GEOMETRY_PICK_AT] >> 1:
        return NO_STEER
    rows = schedule(engine, budget)
    return rows[zlib.crc32(shape + layout) % len(rows)] if rows else NO_STEER


RATIO_KINDS = {"128": 0, "1": 1, "power of two 2-64": 2, "power of two above 128": 3,
               "not a power of two": 4}
"""The :func:`_ratio` kind of each compress-ratio bucket."""

BLOCK_KINDS = {"2": 0, "1": 1, "power of two 4-128": 2, "above 128": 3,
               "not a power of two": 4}
"""The :func:`_block_size` kind of each block-size bucket."""


def _geometry(shape: Fields, always: bool, allowed: bool, steer: Steer,
              max_capacity: int = MAX_CAPACITY):
    """The step's R, and (B's kind, its value, ...) to draw B from once C is
    known (None: the engine's B). Drawn one step in :data:`GEOMETRY_ONE_IN`,
    always with ``always``, never unless ``allowed`` (a given model length:
    steps sharing buffers share R and B), and whenever ``steer`` names a
    ratio or block-size bucket."""
    geometry_pick, ratio_kind, ratio_value = shape.uint(1), shape.uint(1), shape.uint(2)
    block_kind, block_value = shape.uint(1), shape.uint(2)
    wanted_ratio, wanted_block = steer.get("compress ratio R"), steer.get("block size B")
    wide_table = steer.get("block-table width M") in ("17-256", "above 256")
    drawn = allowed and (always or geometry_pick % GEOMETRY_ONE_IN == GEOMETRY_ONE_IN - 1)
    if not allowed or not (drawn or wanted_ratio or wanted_block):
        return COMPRESS_RATIO, None
    # Kinds map one to one onto buckets; the engine's R and B are kind 0.
    # A steer changes a kind only where its bucket asks for another.
    ratio_kind, block_kind = (ratio_kind % 5, block_kind % 5) if drawn else (0, 0)
    if wanted_ratio is not None:
        ratio_kind = RATIO_KINDS[wanted_ratio]
    if wanted_block is not None:
        block_kind = BLOCK_KINDS[wanted_block]
    elif wide_table:
        # Hundreds of pages need short blocks and a ratio that leaves
        # entries enough within the budget's capacity: B = 1 or 2, R = 128
        # (a drawn R of thousands, beside B = 1, left a table of a few pages).
        block_kind = block_kind % 2
        ratio_kind = ratio_kind if wanted_ratio is not None else 0
    ratio = _ratio(ratio_kind, ratio_value)
    if steer:
        ratio = steering.ratio(ratio_kind % 5, ratio, ratio_value, steer, max_capacity)
    # The block size needs C; its smallest value bounds the model length's steer.
    least_block = {0: BLOCK_SIZE, 1: 1, 2: 4, 3: WIDTH_ALIGNMENT + 1, 4: 3}[block_kind % 5]
    if block_kind % 5 == 4 and steer.get("float32 division by B") == "floors a column's page wrong":
        least_block = 41  # the first block size below 128 whose reciprocal floors a page wrong
    return ratio, (least_block, block_kind, block_value)


def _length_range(steer: Steer, ratio: int, block_size: int) -> tuple[int, int | None]:
    """(least, most or None) of the model length ``steer`` asks for: room
    for the sequences its buckets ask for (:func:`.steering.model_length_range`)."""
    if not steer:
        return 1, None
    least, most = steering.model_length_range(steer, ratio, block_size)
    return least, most


ELEMENTS_AT_LEAST = {"1,048,577-8,388,608": 1_048_577, "above 8,388,608": 8_388_609}
"""The fewest elements T x W of each engine-scale elements bucket."""


def _model_length(layout: Fields, scale: _Scale, ratio: int, steer: Steer,
                  block_size: int) -> int:
    """The step's ``max_model_len``: :func:`_model_len` within what the
    scale's capacity allows, long enough for an engine-scale step's prefill
    requests, and within the range ``steer`` asks for where it fits."""
    longest = min(MAX_MODEL_LEN, scale.max_capacity * ratio)
    model_len = _model_len(layout, longest, ratio)
    shortest = 1
    if scale.engine:
        # Long enough that the step's prefill requests (as few as the row's
        # request count, where it names one) can hold its tokens.
        requests = scale.max_prefill_requests
        if steer.get("requests") is not None:
            requests = max(1, min(requests, INTERVALS["requests"][steer.get("requests")][1]))
        shortest = min(longest, -(-scale.tokens // requests))
        if model_len < shortest:
            model_len = shortest + model_len % (longest - shortest + 1)
    least, most = _length_range(steer, ratio, block_size)
    least, most = max(least, shortest), min(most or longest, longest)
    elements = ELEMENTS_AT_LEAST.get(steer.get("elements T x W"))
    if elements and scale.tokens:
        # Columns enough that T x C passes the bucket's edge (W = C then),
        # where the rest of the steer and the budget leave room for them.
        columns = -(-elements // scale.tokens)
        least = max(least, min(-(-columns // WIDTH_ALIGNMENT) * WIDTH_ALIGNMENT * ratio, most))
    if least <= most and not least <= model_len <= most:
        model_len = least + model_len % (most - least + 1)
    if steer.get("capacity C") == "a power of two above 128":
        tiles = -(-model_len // ratio // WIDTH_ALIGNMENT)
        for power in (1 << max(1, (tiles - 1).bit_length()), 1 << max(1, tiles.bit_length() - 1)):
            if WIDTH_ALIGNMENT * ratio * power <= longest and (
                    not steer or WIDTH_ALIGNMENT * ratio * power >= least):
                model_len = WIDTH_ALIGNMENT * ratio * power
                break
    elif steer.get("capacity C") == "not a power of two":
        tiles = -(-model_len // ratio // WIDTH_ALIGNMENT)
        if is_power_of_two(tiles) and WIDTH_ALIGNMENT * ratio * (tiles + 1) <= longest:
            model_len = WIDTH_ALIGNMENT * ratio * (tiles + 1)
    if steer:
        model_len = steering.model_length(model_len, ratio, layout.data[0], max(least, shortest),
                                          longest, steer)
    return model_len


def _request_counts(layout: Fields, scale: _Scale, model_len: int, min_decode: int,
                    min_prefill: int, steer: Steer):
    """(decode requests, prefill requests, the least prefill requests, the
    decode tokens an engine-scale step's row asks for or None): drawn in
    the scale's bounds, the bounds narrowed to what ``steer``'s mix, decode
    rows, prefill tokens and request count ask for
    (:func:`.steering.request_ranges`) where the property's own bounds allow."""
    if scale.engine:
        # Enough prefill requests, each within the model length, for the
        # tokens that decode requests (8 tokens each at most) cannot hold.
        beyond_decode = scale.tokens - scale.max_decode_requests * MAX_QUERY_TOKENS_PER_DECODE
        min_prefill = max(min_prefill, min(-(-max(beyond_decode, 0) // model_len),
                                           scale.max_prefill_requests))
    max_prefill = max(min_prefill, scale.max_prefill_requests)
    max_decode = max(min_decode, scale.max_decode_requests)
    low_d, high_d, low_p, high_p = min_decode, max_decode, min_prefill, max_prefill
    decode_tokens = None
    if steer:
        if scale.engine:
            decode_tokens = steering.decode_tokens(scale.tokens, steer, 0)
        (low_d, high_d), (low_p, high_p) = steering.request_ranges(steer, decode_tokens, max_prefill)
    # The property's own bounds win over a steer they cannot meet.
    low_d, high_d = max(low_d, min_decode), min(high_d, max_decode)
    low_p, high_p = max(low_p, min_prefill), min(high_p, max_prefill)
    if low_d > high_d:
        low_d, high_d = min_decode, max_decode
    if low_p > high_p:
        low_p, high_p = min_prefill, max_prefill
    if scale.engine:
        # Prefill requests enough for what the steered decode requests leave.
        left = scale.tokens - high_d * MAX_QUERY_TOKENS_PER_DECODE
        low_p = min(max(low_p, -(-max(left, 0) // model_len)), high_p)
    decode_count = _kept_or_between(layout.uint(2), (min_decode, max_decode), (low_d, high_d),
                                    zero_kept=not scale.engine)
    wanted = steer.get("requests")
    if wanted is not None:
        # Prefill requests enough for the row's request count beside the decode ones.
        least = INTERVALS["requests"][wanted][0] - decode_count
        low_p = min(max(low_p, least), high_p)
    prefill_count = _kept_or_between(layout.uint(2), (min_prefill, max_prefill), (low_p, high_p),
                                     zero_kept=not scale.engine)
    return decode_count, prefill_count, low_p, decode_tokens


def _kept_or_between(value: int, drawn: tuple[int, int], steered: tuple[int, int],
                     zero_kept: bool = False) -> int:
    """The count ``value`` gives in the ``drawn`` range (as without a
    steer), kept when it lies in the ``steered`` one, else the count it
    gives there: a steer moves a count only when it must. With
    ``zero_kept`` (a small step), a zero ``value`` is never moved: the
    steered reading of zero bytes is the unsteered one, so that shrinking
    can drop the steer (a steered step of zero bytes would be a smaller
    failing step than any unsteered one, and shrinking would end there)."""
    count = drawn[0] + value % (drawn[1] - drawn[0] + 1)
    if (zero_kept and value == 0) or steered[0] <= count <= steered[1]:
        return count
    return steered[0] + value % (steered[1] - steered[0] + 1)


def _requests(records: bytes, decode_count: int, scale: _Scale, min_prefill: int,
              model_len: int, ratio: int, block_size: int, steer: Steer,
              decode_tokens: tuple[int, int] | None = None):
    """(decode requests, prefill requests) from their records, within the
    scale's tokens; ``steer`` may ask for speculative decoding (several
    tokens for the first decode request) or not, and bounds the longest
    sequence and the longest decode sequence (:func:`_steer_lengths`)."""
    speculative = steer.get("speculative decode")
    decode_query = 1 if speculative == "1 token a request" else MAX_QUERY_TOKENS_PER_DECODE
    longest = steering.longest_range(steer, ratio) if steer else (1, model_len)
    decode_longest = steering.decode_range(steer, ratio, block_size) if steer else (1, model_len)
    prefill_len = max(1, min(model_len, longest[1]))
    decode_len = max(1, min(prefill_len, decode_longest[1]))
    prefill_wanted = steer.get("prefill tokens")
    decode_budget = scale.tokens - min_prefill
    if decode_tokens is not None:
        # The row's decode rows: as many decode tokens, the rest prefill,
        # and a token at least for each decode request the row's count asks for.
        low, high = decode_tokens
        low = min(max(low, decode_count), high)
        decode_budget = min(decode_budget, low + uint(records[:2]) % (high - low + 1))
    if steer.get("requests") in ("17-256", "257-512") and decode_count:
        # Hundreds of decode requests share the step's decode tokens: each
        # takes no more than its share, so that all of them are drawn.
        decode_query = min(decode_query, max(1, decode_budget // decode_count))
    decode = _requests_from_bytes(
        records[: decode_count * REQUEST_BYTES],
        decode_budget,
        decode_query,
        decode_len,
        ratio,
        fill=scale.engine and (steer.get("decode/prefill mix") == "decode only"
                               or prefill_wanted in ("0", "1-64") or decode_tokens is not None),
    )
    room = scale.tokens - min_prefill - sum(r.query_len for r in decode)
    if (speculative == "2-8 tokens a request" and decode and decode[0].query_len == 1
            and room >= 1 and decode_len >= 2):
        decode[0] = _Request(max(decode[0].seq_len, 2), 2)
    used = sum(r.query_len for r in decode)
    prefill_budget = scale.tokens - used
    if prefill_wanted == "1-64":
        prefill_budget = min(prefill_budget, 64)
    prefill = _requests_from_bytes(
        records[decode_count * REQUEST_BYTES :], prefill_budget, scale.max_prefill_chunk,
        prefill_len, ratio, fill=scale.engine,
    )
    if steer:
        _steer_lengths(decode, prefill, steer, ratio, (longest[0], prefill_len),
                       (decode_longest[0], decode_len))
    return decode, prefill


def _steer_lengths(decode: list, prefill: list, steer: Steer, ratio: int,
                   longest: tuple[int, int], decode_longest: tuple[int, int]) -> None:
    """Lengthen the first requests to the row's longest sequence and longest
    decode sequence (its bounds' lower or upper edge, by the drawn length's
    parity), a lone token to two where the row has 2-64 tokens, and one
    sequence to a length whose float32 quotient by R floors wrong where the
    row asks for that."""

    def reach(group: list, index: int, low: int, high: int) -> bool:
        request = group[index]
        if request.seq_len >= low or max(low, request.query_len) > high:
            return request.seq_len >= low
        target = low if request.seq_len % 2 == 0 else high
        group[index] = _Request(max(target, request.query_len), request.query_len)
        return True

    if decode:
        if steer.get("longest decode list against B") == "within one block":
            decode[0] = _Request(max(decode_longest[1], decode[0].query_len), decode[0].query_len)
        reach(decode, 0, *decode_longest)
    if max((r.seq_len for r in decode + prefill), default=longest[0]) < longest[0]:
        if not (decode and reach(decode, 0, longest[0], decode_longest[1])) and prefill:
            reach(prefill, 0, *longest)
    if steer.get("tokens T") == "2-64" and sum(r.query_len for r in decode + prefill) == 1:
        group = decode or prefill
        group[0] = _Request(max(group[0].seq_len, 2), 2)
    if steering.wide_small_step(steer):
        # Tokens enough that T x W passes 65,536 at W >= 4,096.
        for group, most in ((prefill, steering.WIDE_TOKENS), (decode, MAX_QUERY_TOKENS_PER_DECODE)):
            short = steering.WIDE_TOKENS - sum(r.query_len for r in decode + prefill)
            if group and short > 0:
                query = min(group[0].query_len + short, most)
                group[0] = _Request(max(group[0].seq_len, query), query)
    if steer.get("float32 division by R") == "floors a token's length wrong":
        # The longest request of a group ends where (p + 1) / R floors wrong,
        # still as long as the row's bounds ask.
        for group, (low, high) in ((prefill, longest), (decode, decode_longest)):
            if not group:
                continue
            index = max(range(len(group)), key=lambda i: group[i].seq_len)
            request = group[index]
            length = steering.wrong_multiple(ratio, max(request.query_len, low),
                                             max(high, request.query_len))
            if length is not None:
                group[index] = _Request(length, request.query_len)
                break


WIDTH_CHOICES = {"the policy's width": 0, "narrower than the longest list (clamps)": 1,
                 "wider than the policy's, below C": 2, "C": 2}
"""The width choice of each width-against-need bucket (2: any width the
policy can reach; the bucket then picks among them)."""


def _width(layout: Fields, target, width, widths: str, max_seq_len: int, ratio: int,
           capacity: int, steer: Steer) -> int:
    """W: the given one, the target's policy for the batch's longest sequence,
    or (``widths="any"``, two choices in three) a multiple of 128 narrower
    than that or any width the policy can reach for C, C included; ``steer``
    picks the choice and, among reachable widths, the bucket it names."""
    width_kind, width_value = layout.uint(1), layout.uint(2)
    if width is not None:
        return width
    width = target_width(target, max_seq_len, ratio, capacity)
    aligned = capacity // WIDTH_ALIGNMENT
    choice = width_kind % 3 if widths == "any" and aligned >= 1 else 0
    against, wanted = steer.get("width against need"), steer.get("width W")
    if against is None and steer.get("elements T x W") in ELEMENTS_AT_LEAST:
        against = "C"  # the widest build of the step
    if widths == "any" and aligned >= 1:
        if against is not None:
            choice = WIDTH_CHOICES[against]
        elif wanted is not None:
            choice = 2
    span = INTERVALS["width W"].get(wanted) if wanted else None

    def within(widths: list[int]) -> list[int]:
        """The widths in the row's width bucket, all of them where none is
        (the widest of them for a small step of many elements)."""
        found = [w for w in widths if span[0] <= w <= span[1]] or widths if span else widths
        return found[-1:] if steering.widest_width(steer) else found

    # A target bringing its own policy (a fixed-width builder's is W = C) is
    # drawn only at widths that policy reaches: its engine calls no other.
    reachable = target_reachable_widths(target, capacity, ratio)
    own_policy = not getattr(target, "uses_project_policy", True)
    if choice == 1 and width > WIDTH_ALIGNMENT and own_policy:
        below = [w for w in reachable if w < width]
        choice = 2 if not below else choice
        if below:
            below = within(below) if span else below
            return below[width_value % len(below)]
    if choice == 1 and width > WIDTH_ALIGNMENT:
        # Narrower than the batch needs: n(t) = min(., W) clamps.
        narrower = width // WIDTH_ALIGNMENT - 1
        drawn = (1 + width_value % narrower) * WIDTH_ALIGNMENT
        if span is None or (span[0] <= drawn <= span[1] and not steering.widest_width(steer)):
            return drawn
        options = within(list(range(WIDTH_ALIGNMENT, width, WIDTH_ALIGNMENT)))
        return options[width_value % len(options)]
    if choice >= 1:  # any width the policy can reach, C included
        if against == "C":
            reachable = [capacity] if not own_policy or capacity in reachable else reachable
        elif against == "wider than the policy's, below C":
            reachable = within([w for w in reachable if width < w < capacity] or reachable)
        elif wanted is not None:
            reachable = within(reachable)
        return reachable[width_value % len(reachable)]
    return width


PADDING_WANTS = {"none": (False, False), "tail": (True, False), "inside": (False, True),
                 "tail and inside": (True, True)}
"""(tail padding, padding inside) of each padding bucket."""


def _last_of_longer_requests(requests: list) -> set[int]:
    """The tokens that end a request of two tokens or more: padding there
    holds a position past the request's real ones."""
    found, start = set(), 0
    for request in requests:
        start += request.query_len
        if request.query_len >= 2:
            found.add(start - 1)
    return found


def _padding_draws(layout: Fields, tail_allowed: bool, inside_allowed: bool,
                   real_tokens: int, steer: Steer, request_ends: set[int] = frozenset()):
    """(the tail byte, tail draws (source token, position value), padding
    inside {token: slot}, slot_mapping entries past T). CUDA-graph padding at
    the tail: stale copies of real tokens' requests with their positions or
    earlier ones, a negative slot; in a decode-only step they are decode
    tokens. The count's byte also picks the padding slot (PADDING_SLOTS; -1
    for small bytes) and, from its top values, positions staler and larger
    than the request's own (STALE_LARGE_TAIL_BYTE): one byte, so saved byte
    strings keep their meaning. ``steer``'s padding bucket sets whether
    there is any at the tail and inside, where the step allows it."""
    wanted = PADDING_WANTS.get(steer.get("padding"))
    tail_byte = layout.uint(1)
    if steer:
        tail_byte = steering.tail_byte(tail_byte, MAX_QUERY_TOKENS_PER_DECODE + 1,
                                       STALE_LARGE_TAIL_BYTE, steer)
    tail = tail_byte % (MAX_QUERY_TOKENS_PER_DECODE + 1)
    pads = layout.take(MAX_QUERY_TOKENS_PER_DECODE * PAD_BYTES)
    if wanted is not None:
        tail = max(tail, 1) if wanted[0] else 0
    tail = tail if tail_allowed and real_tokens else 0
    tail_draws = [
        (uint(pads[start : start + 2]) % real_tokens, uint(pads[start + 2 : start + PAD_BYTES]))
        for start in range(0, tail * PAD_BYTES, PAD_BYTES)
    ]
    inside_byte = layout.uint(1)
    if steer:
        kinds = MAX_INSIDE_PADDING + 1
        index = steering.slot_index(inside_byte // kinds % len(PADDING_SLOTS), steer)
        inside_byte = (inside_byte // kinds // len(PADDING_SLOTS) * len(PADDING_SLOTS) + index) \
            * kinds + inside_byte % kinds
    inside_count = inside_byte % (MAX_INSIDE_PADDING + 1)
    if wanted is not None:
        inside_count = max(inside_count, 1) if wanted[1] else 0
    inside_slot = PADDING_SLOTS[inside_byte // (MAX_INSIDE_PADDING + 1) % len(PADDING_SLOTS)]
    picks = layout.take(MAX_INSIDE_PADDING * INDEX_BYTES)
    inside: dict[int, int] = {}
    if wanted == (True, False) and not tail_allowed and inside_allowed and real_tokens == 1:
        # A lone token's padding is the token itself: at the tail.
        inside_count, picks = 1, bytes(INDEX_BYTES)
    if inside_allowed and real_tokens:
        for start in range(0, inside_count * INDEX_BYTES, INDEX_BYTES):
            token = uint(picks[start : start + INDEX_BYTES]) % real_tokens
            if wanted is not None and wanted[1] and token == real_tokens - 1 and real_tokens > 1:
                token -= 1  # inside: a real token comes after it
            token = steering.inside_token(token, real_tokens, request_ends, steer)
            inside.setdefault(token, inside_slot)
    junk_count = layout.uint(1) % (MAX_JUNK_SLOTS + 1)
    junk_slots = layout.take(MAX_JUNK_SLOTS * SLOT_BYTES)
    extra_slots = [
        signed(uint(junk_slots[start : start + SLOT_BYTES]), 2**20)
        for start in range(0, junk_count * SLOT_BYTES, SLOT_BYTES)
    ]
    return tail_byte, tail_draws, inside, extra_slots


LAYOUT_KINDS = {"own allocation": 0, "offset view": 4, "row stride above C": 5,
                "one pool for both buffers": 6}
"""The :func:`_buffer_layout` kind of each buffer-layout bucket."""


def _buffers(layout: Fields, drawn_layout: tuple[int, int, int], capacity: int,
             num_tokens: int, max_buffer_rows: int, engine: bool, layouts: bool,
             steer: Steer):
    """(storage offset, row padding, pooled, prefill buffer's extra columns,
    buffer rows) of the step's buffers, within what a case may hold."""
    rows_drawn = layout.uint(2)
    # Sometimes a wider prefill buffer: its row stride then differs from the
    # decode buffer's, so a builder that mixes the two up writes wrong rows.
    prefill_extra = 128 if layout.uint(1) % 4 == 3 else 0
    if steer.get("buffer widths") is not None:
        prefill_extra = 128 if steer.get("buffer widths") == "prefill wider" else 0
    if layout.offset != LAYOUT_BYTES:
        raise HarnessError(f"the layout read {layout.offset} bytes, not its {LAYOUT_BYTES}")
    kind, offset, padding = drawn_layout
    alignment = steer.get("buffer row alignment")
    if alignment is not None and (padding % 4 == 3) != (alignment == ROW_ALIGNMENT[0]):
        # The row padding (1 + padding % ...) a multiple of 4 elements, or not.
        padding = padding - padding % 4 + (3 if alignment == ROW_ALIGNMENT[0] else 0)
    wanted = steer.get("buffer layout")
    drawn = layout_bucket(*_buffer_layout(kind, offset, padding, capacity, layouts))
    if wanted is not None and layouts and wanted != drawn:
        kind = LAYOUT_KINDS[wanted] + (kind & 1 if wanted == "one pool for both buffers" else 0)
    buffer_offset, row_padding, pooled = _buffer_layout(kind, offset, padding, capacity, layouts)
    least_rows = max(num_tokens, 1)
    # An engine-scale step's wider rows stay within what a case may hold.
    room = MAX_BUFFER_ELEMENTS // least_rows - capacity
    prefill_extra = prefill_extra if prefill_extra <= room else 0
    row_padding = max(min(row_padding, room - prefill_extra), 0)
    row_length = capacity + prefill_extra + row_padding
    most_rows = max(max_buffer_rows, num_tokens + MAX_QUERY_TOKENS_PER_DECODE if engine else 0)
    most_rows = max(min(most_rows, MAX_BUFFER_ELEMENTS // row_length), least_rows)
    buffer_rows = least_rows + rows_drawn % (most_rows - least_rows + 1)
    if buffer_rows * row_length > MAX_BUFFER_ELEMENTS:
        raise HarnessError(
            f"a drawn step's buffers need {buffer_rows} x {row_length} elements, more than a "
            f"case may hold ({MAX_BUFFER_ELEMENTS:,}): the size budget let T x C grow too far"
        )
    return buffer_offset, row_padding, pooled, prefill_extra, buffer_rows


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


def _prior_width(kind: int, value: int, width: int, capacity: int, target=None,
                 ratio: int = COMPRESS_RATIO) -> int:
    """The width of the step built before this one into its buffers
    (``history_independent``): 0 (the widest the buffers allow) for a third
    of the kinds, this step's own W for a third, else any width the
    target's policy can reach for C, narrower or wider than W."""
    kind %= 3
    if kind == 1:
        return width
    reachable = [w for w in target_reachable_widths(target, capacity, ratio)
                 if w % WIDTH_ALIGNMENT == 0]
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


