"""The contract's input space, cut into buckets, and where a step falls in it.

Every dimension of what a correct builder must handle (CONTRACT.md, "The
whole input space") is a :class:`Dimension` with buckets that matter to an
implementation: token counts past a tile, a block, the engine's usual 8,192;
request indices past 16 and 256; buffers that are views of a pool; block
sizes and ratios that are not powers of two or whose float32 reciprocal
divides wrong; a width narrower or wider than the last build's. A step's
buckets (:func:`buckets_of`) are what the properties report with
``event()`` (``"tokens T: 65-1,024"``), what ``c128a fuzz`` counts in its
reach table and JSON report, and what the reach test (``tests/test_reach.py``)
requires every property's strategy to draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping, TypeVar

import numpy as np

from ..contract import WIDTH_ALIGNMENT, capacity_width, policy
from ..step import Batch, PermutedBlockTable

SEPARATOR = ": "
Answer = TypeVar("Answer")


def kept_for_the_last_step(compute: Callable[[Batch], Answer]) -> Callable[[Batch], Answer]:
    """``compute``, its answer kept for the last step it was asked about: a
    step's dimensions are all asked about it before the next step is drawn.
    The step is held, so its identity cannot be reused."""
    last: list = [None, None]

    def of(batch: Batch) -> Answer:
        if last[0] is not batch:
            last[:] = [batch, compute(batch)]
        return last[1]

    return of


@dataclass(frozen=True)
class Dimension:
    """One dimension of the input space: its buckets, in order, and the
    bucket a step falls in (None where the step says nothing about it)."""

    name: str
    buckets: tuple[str, ...]
    bucket_of: Callable[[Batch], str | None]

    def __post_init__(self) -> None:
        # Each example's buckets are asked for several times (its events, its
        # pair cells, the reach counts).
        object.__setattr__(self, "bucket_of", kept_for_the_last_step(self.bucket_of))

    def label(self, bucket: str) -> str:
        """The ``event()`` text of one bucket: ``"dimension: bucket"``."""
        return f"{self.name}{SEPARATOR}{bucket}"


@dataclass(frozen=True)
class _Tokens:
    """A step's T tokens as arrays, made once for all of its dimensions: an
    engine-scale step has thousands of tokens, and every example reports its
    buckets."""

    positions: np.ndarray
    slots: np.ndarray
    requests: np.ndarray
    real: np.ndarray  # a slot >= 0
    padded: np.ndarray  # indices of the tokens with a negative slot
    request_ids: np.ndarray  # the distinct request indices, sorted
    request_of: np.ndarray  # each token's place in request_ids (any index, even a bad one)

    @classmethod
    def of(cls, batch: Batch) -> "_Tokens":
        t = batch.num_tokens
        slots = np.asarray(batch.slot_mapping[:t], dtype=np.int64)
        requests = np.asarray(batch.token_to_req_indices[:t], dtype=np.int64)
        real = slots >= 0
        return cls(
            np.asarray(batch.positions[:t], dtype=np.int64), slots, requests, real,
            np.flatnonzero(~real), *np.unique(requests, return_inverse=True),
        )

    def per_request(self, values: np.ndarray, reduce: np.ufunc,
                    mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(``reduce`` (np.minimum or np.maximum) of ``values[mask]`` for each
        request, whether the request has such a token), both indexed as
        :attr:`request_ids`."""
        size = self.request_ids.size
        limits = np.iinfo(np.int64)
        out = np.full(size, limits.max if reduce is np.minimum else limits.min, dtype=np.int64)
        reduce.at(out, self.request_of[mask], values[mask])
        present = np.zeros(size, dtype=bool)
        present[self.request_of[mask]] = True
        return out, present


_tokens_of = kept_for_the_last_step(_Tokens.of)  # every dimension reads the same step


def _cut(value: int, edges: tuple[tuple[int, str], ...]) -> str:
    """The name of the first ``(upper bound, name)`` whose bound holds ``value``."""
    for bound, name in edges:
        if value <= bound:
            return name
    raise AssertionError(f"{value} is above every edge")


def _tokens(batch: Batch) -> str:
    return _cut(batch.num_tokens, (
        (0, "0"), (1, "1"), (64, "2-64"), (1_024, "65-1,024"), (8_192, "1,025-8,192"),
        (1 << 62, "above 8,192"),
    ))


def _requests(batch: Batch) -> str:
    """Requests the step's tokens belong to (padding tokens borrow a real one's)."""
    return _cut(len(set(batch.token_to_req_indices[: batch.num_tokens])), (
        (0, "0"), (1, "1"), (16, "2-16"), (256, "17-256"), (1 << 62, "257-512"),
    ))


ELEMENT_EDGES = (
    (1 << 16, "up to 65,536"), (1 << 20, "65,537-1,048,576"),
    (1 << 23, "1,048,577-8,388,608"), (1 << 62, "above 8,388,608"),
)


def _elements(batch: Batch) -> str:
    return _cut(batch.num_tokens * batch.width, ELEMENT_EDGES)


def _mix(batch: Batch) -> str:
    t, d = batch.num_tokens, batch.num_decode_tokens
    if t == 0:
        return "no tokens"
    return "decode only" if d == t else "prefill only" if d == 0 else "decode + prefill"


def _decode_rows(batch: Batch) -> str:
    return _cut(batch.num_decode_tokens, ((0, "0"), (64, "1-64"), (1 << 62, "above 64")))


def _speculative(batch: Batch) -> str | None:
    """Whether a decode request has several real (slotted) tokens."""
    d = batch.num_decode_tokens
    if d == 0:
        return None
    tokens = _tokens_of(batch)
    real = tokens.requests[:d][tokens.real[:d]]
    return "2-8 tokens a request" if real.size > np.unique(real).size else "1 token a request"


def _padding(batch: Batch) -> str | None:
    """Tail padding is a run of padding tokens at the end; inside, any before a real token."""
    if batch.num_tokens == 0:
        return None
    tokens = _tokens_of(batch)
    padded = tokens.padded
    tail = bool(padded.size) and padded[-1] == batch.num_tokens - 1
    inside = bool(padded.size) and bool(tokens.real[padded[0] + 1:].any())
    return {(False, False): "none", (True, False): "tail", (False, True): "inside",
            (True, True): "tail and inside"}[tail, inside]


def _padding_slot(batch: Batch) -> str | None:
    tokens = _tokens_of(batch)
    if not tokens.padded.size:
        return None
    return "below -1" if tokens.slots[tokens.padded].min() < -1 else "-1"


def _padding_position(batch: Batch) -> str | None:
    """A padding token past every real token of its request holds a stale,
    larger position (a longer request of an earlier step left it)."""
    tokens = _tokens_of(batch)
    padded = tokens.padded
    if not padded.size:
        return None
    longest, present = tokens.per_request(tokens.positions, np.maximum, tokens.real)
    requests = tokens.request_of[padded]
    # A request without a real token has no longest position: never past it.
    past = bool((present[requests] & (tokens.positions[padded] > longest[requests])).any())
    return "stale, past its request" if past else "within its request"


def _longest_list(batch: Batch) -> str | None:
    if batch.num_tokens == 0:
        return None
    longest = min((max(batch.positions) + 1) // batch.compress_ratio, batch.width)
    return _cut(longest, (
        (0, "0 (every length 0)"), (127, "1-127"), (1_023, "128-1,023"),
        (1 << 62, "1,024 and more"),
    ))


def layout_bucket(offset: int, row_padding: int, pooled: bool) -> str:
    """The buffer-layout bucket of a placement: a storage offset, row padding
    past C, one pool for all buffers (the strategies steer by it too)."""
    if pooled:
        return "one pool for both buffers"
    if row_padding:
        return "row stride above C"
    return "offset view" if offset else "own allocation"


def _buffer_layout(batch: Batch) -> str:
    layout = batch.buffer_layout
    return layout_bucket(layout.offset, layout.row_padding, layout.pooled)


def _block_table(batch: Batch) -> str | None:
    if batch.num_decode_tokens == 0:
        return None
    if not len(batch.block_table):
        return "no rows"
    wider = batch.block_table_row_stride > batch.table_width
    return "slice of a wider table" if wider else "dense"


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _block_size(batch: Batch) -> str:
    b = batch.block_size
    if b in (1, 2):
        return str(b)
    if b > 128:
        return "above 128"
    return "power of two 4-128" if is_power_of_two(b) else "not a power of two"


def _ratio(batch: Batch) -> str:
    r = batch.compress_ratio
    if r == 128:
        return "128"
    if r == 1:
        return "1"
    if not is_power_of_two(r):
        return "not a power of two"
    return "power of two 2-64" if r < 128 else "power of two above 128"


def floors_wrong(values: np.ndarray, divisor: int) -> bool:
    """Whether any of ``values`` divided by ``divisor`` through a float32
    reciprocal (value times 1/divisor, truncated) differs from the integer
    quotient: the shortcut a kernel takes for an integer division."""
    if is_power_of_two(divisor) or not len(values):
        return False
    reciprocal = np.float32(1.0) / np.float32(divisor)
    quotient = (values.astype(np.float32) * reciprocal).astype(np.int64)
    return bool((quotient != values // divisor).any())


def _division_by_ratio(batch: Batch) -> str | None:
    if batch.num_tokens == 0:
        return None
    lengths = np.asarray(batch.positions, dtype=np.int64) + 1
    wrong = floors_wrong(lengths, batch.compress_ratio)
    return "floors a token's length wrong" if wrong else "exact for every token"


def _division_by_block(batch: Batch) -> str | None:
    """Columns j < n(t) of decode rows: their page j // B."""
    d = batch.num_decode_tokens
    if d == 0:
        return None
    longest = min((max(batch.positions[:d]) + 1) // batch.compress_ratio, batch.width)
    wrong = floors_wrong(np.arange(longest, dtype=np.int64), batch.block_size)
    return "floors a column's page wrong" if wrong else "exact for every column"


def _width_against_need(batch: Batch) -> str:
    if batch.width == batch.capacity:
        return "C"
    needed = batch.max_seq_len // batch.compress_ratio
    if batch.width < needed:
        return "narrower than the longest list (clamps)"
    usual = min(max(policy.next_power_of_2(max(needed, 1)), WIDTH_ALIGNMENT), batch.capacity)
    return "the policy's width" if batch.width == usual else "wider than the policy's, below C"


def _width(batch: Batch) -> str:
    return _cut(batch.width, (
        (128, "128"), (1_023, "256-1,023"), (8_191, "1,024-8,191"), (1 << 62, "8,192 and more"),
    ))


def _capacity(batch: Batch) -> str:
    c = batch.capacity
    if c == WIDTH_ALIGNMENT:
        return "128"
    return "a power of two above 128" if is_power_of_two(c) else "not a power of two"


def _model_length(batch: Batch) -> str:
    """Whether C needs the model length rounded up: ceil(L / R) entries, not
    floor (a builder that rounds down sizes the buffers one tile short)."""
    length, ratio = batch.max_model_len, batch.compress_ratio
    if length % ratio == 0:
        return "a multiple of R"
    floored = max(length // ratio, 1)
    rounded_down = -(-floored // WIDTH_ALIGNMENT) * WIDTH_ALIGNMENT
    if rounded_down != capacity_width(length, ratio):
        return "not a multiple of R, rounding down changes C"
    return "not a multiple of R, C the same either way"


def _width_history(batch: Batch) -> str | None:
    """The step against the one built before it into the same buffers
    (``prior_width``; 0 is the widest the buffers allow)."""
    if batch.num_tokens == 0:
        return None
    prior = batch.earlier_width
    if prior == batch.width:
        return "same W"
    return "narrower than the last build" if batch.width < prior else "wider than the last build"


WIDTH_HISTORY = "width history"


# ---------------------------------------------------------------- inputs as an engine hands them
# The step's inputs as slices of an engine's persistent tensors, and the
# values a real engine puts in them (Batch.inputs, slot_mapping,
# block_table; c128a.step.inputs). Each docstring names the other
# dimensions that constrain it: buckets that cannot occur beside another.

PLACEMENT_BUCKETS = ("offset 0", "offset, 16-byte aligned", "offset, not 16-byte aligned")


def _placement(name: str, read: Callable[[Batch], bool]) -> Callable[[Batch], str | None]:
    """Where input ``name`` starts in its persistent tensor: at its start,
    at a 16-byte aligned storage offset, or off a 16-byte boundary (Triton
    keys a pointer on its alignment: another compiled variant and another
    code path). None where the step reads nothing of it (``read`` false)."""

    def bucket_of(batch: Batch) -> str | None:
        if not read(batch):
            return None
        if not batch.inputs.offset(name):
            return PLACEMENT_BUCKETS[0]
        return PLACEMENT_BUCKETS[1 if batch.inputs.aligned(name) else 2]

    return bucket_of


INPUT_PLACEMENT: tuple[Dimension, ...] = (
    Dimension("positions placement", PLACEMENT_BUCKETS,
              _placement("positions", lambda b: b.num_tokens > 0)),
    Dimension("token_to_req_indices placement", PLACEMENT_BUCKETS,
              _placement("token_to_req_indices", lambda b: b.num_tokens > 0)),
    Dimension("slot_mapping placement", PLACEMENT_BUCKETS,
              _placement("slot_mapping", lambda b: b.num_tokens > 0)),
    Dimension("block table placement", PLACEMENT_BUCKETS,
              _placement("block_table", lambda b: b.num_decode_tokens > 0)),
)
"""Where each input sits in its persistent tensor. Constraints: a step of
no tokens ("tokens T: 0") reads no input, so it has no bucket here; the
block table's placement has none beside "decode rows: 0" (no decode token
reads the table). Every other bucket may occur beside any other."""

INT32_LIMIT = 2**31


def _slot_ids(batch: Batch) -> str | None:
    """What the real tokens' slot ids are: the token's position (the
    strategies' ids before engine-shaped ones), or a KV page's slot, page id
    x page size + offset, unrelated to the position, below 2^31 or at and
    past it (``slot_mapping`` is int64: a large KV cache). Constraints: none
    where no token has a slot (T = 0, or every token a padding token);
    "2^31 and above" needs a real token, so not beside "tokens T: 0"."""
    tokens = _tokens_of(batch)
    slots, positions = tokens.slots[tokens.real], tokens.positions[tokens.real]
    if not slots.size:
        return None
    if (slots >= INT32_LIMIT).any():
        return "a page's slot, 2^31 and above"
    if (slots != positions).any():
        return "a page's slot, below 2^31"
    return "the token's position"


def pages_read(batch: Batch) -> dict[int, int]:
    """Block-table row -> how many of its leading pages the step's decode
    tokens read at its width (ceil(n(t) / B) of the row's longest token)."""
    tokens, d = _tokens_of(batch), batch.num_decode_tokens
    lengths = np.minimum((tokens.positions[:d] + 1) // batch.compress_ratio, batch.width)
    pages = -(-lengths // batch.block_size)
    decode = np.arange(tokens.requests.size) < d
    most, _ = tokens.per_request(np.pad(pages, (0, tokens.requests.size - d)), np.maximum, decode)
    rows = np.unique(tokens.request_of[:d])
    return {int(tokens.request_ids[row]): max(int(most[row]), 0) for row in rows}


def _shared_pages(batch: Batch) -> str | None:
    """Whether two decode requests read one page (prefix caching shares a
    prompt's leading pages), and whether that page is page 0 (vLLM's null
    block). Constraints: none without a decode token ("decode rows: 0");
    sharing needs two decode requests that each read a page, so no shared
    bucket beside "requests: 1" or "longest list n(t): 0 (every length 0)"."""
    if batch.num_decode_tokens == 0:
        return None
    reads = {row: count for row, count in pages_read(batch).items() if count}
    table = batch.block_table
    shared: set[int] = set()
    if isinstance(table, PermutedBlockTable):
        leading = sorted((min(count, table.shared) for count in reads.values()), reverse=True)
        if len(leading) >= 2 and leading[1]:
            # The k whose page is 0 (the permutation's inverse), among those read twice?
            null = -table.offset * pow(table.scale, -1, table.prime) % table.prime
            shared = {0} if null < leading[1] else {-1}
    else:
        owner: dict[int, int] = {}
        for row, count in reads.items():
            for page in table[row][:count]:
                if owner.setdefault(page, row) != row:
                    shared.add(page)
    if not shared:
        return "unique pages"
    return "the null block 0, shared" if 0 in shared else "shared leading pages"


FAR_POSITION = 1 << 20


def _first_position(batch: Batch) -> str | None:
    """The largest first scheduled position among the step's requests: every
    request from position 0 (a new prompt), or one scheduled from far into
    its sequence (a prefix-cache hit, a later chunk of a chunked prefill,
    a decode), up to 2^20 or at and past it (past the engine's 1M context).
    Constraints: none without a real token; "2^20 and more" needs
    max_model_len > 2^20, so C = ceil(L / R) rounded up needs R >= 64 for a
    capacity the strategies afford (16,384 columns): not beside "compress
    ratio R: 1" nor "capacity past 8,192: up to 8,192" at R <= 128."""
    tokens = _tokens_of(batch)
    if not tokens.real.any():
        return None
    first, present = tokens.per_request(tokens.positions, np.minimum, tokens.real)
    latest = int(first[present].max())
    if latest == 0:
        return "0 (every request from its start)"
    return "1-1,048,575" if latest < FAR_POSITION else "1,048,576 and more"


ENGINE_CAPACITY = 8_192


def _capacity_past(batch: Batch) -> str:
    """C against the engine's largest (8,192 at 1M context, R = 128): the
    contract bounds neither max_model_len nor R, so C = 16,384 at R = 64 and
    1M. Constraints: "above 8,192" not beside "capacity C: 128"."""
    return "up to 8,192" if batch.capacity <= ENGINE_CAPACITY else "above 8,192"


def _buffer_widths(batch: Batch) -> str:
    """The decode and prefill buffers' column counts: the same, the prefill
    buffer wider, or the decode buffer wider (the contract asks only
    0 < W <= both). Constraints: none; a step of no tokens still has both
    buffers."""
    extra = batch.prefill_extra_columns
    return "the same" if extra == 0 else "prefill wider" if extra > 0 else "decode wider"


ENGINE_VALUES: tuple[Dimension, ...] = (
    Dimension("slot ids", ("the token's position", "a page's slot, below 2^31",
                           "a page's slot, 2^31 and above"), _slot_ids),
    Dimension("shared pages", ("unique pages", "shared leading pages",
                               "the null block 0, shared"), _shared_pages),
    Dimension("first scheduled position", ("0 (every request from its start)", "1-1,048,575",
                                           "1,048,576 and more"), _first_position),
    Dimension("capacity past 8,192", ("up to 8,192", "above 8,192"), _capacity_past),
    Dimension("buffer widths", ("the same", "prefill wider", "decode wider"), _buffer_widths),
)
"""The values and geometry an engine hands the builder beyond the usual
step: slot ids of KV pages, shared pages, positions and capacities past the
engine's caps, decode and prefill buffers of different widths."""


# ---------------------------------------------------------------- shape history
# The step against the shape of the one built before it into the same
# buffers (Batch.prior, c128a.strategies.shape_history; no prior: the same
# shape). history_independent and the serving loop report these.

ROW_BLOCK = 64
"""Rows a builder may launch or stage together (vllm#53574: a consumer
changes behaviour past 64 rows; Triton kernels tile rows by 64)."""


def blocks(rows: int) -> int:
    """The 64-row blocks ``rows`` rows occupy."""
    return -(-rows // ROW_BLOCK)


ROW_HISTORY_BUCKETS = ("same", "fewer, same 64-row block", "fewer, across a 64-row block",
                       "more, same 64-row block", "more, across a 64-row block")


def _row_history(rows: int, earlier: int) -> str:
    if earlier == rows:
        return "same"
    across = "across a 64-row block" if blocks(earlier) != blocks(rows) else "same 64-row block"
    return f"{'fewer' if earlier < rows else 'more'}, {across}"


def _rows_history(rows: Callable) -> Callable[[Batch], str | None]:
    """The bucket of the step's ``rows(step)`` against the earlier step's
    (the step's own where it has no shape history)."""

    def bucket_of(batch: Batch) -> str | None:
        if batch.num_tokens == 0:
            return None
        earlier = rows(batch) if batch.prior is None else rows(batch.prior)
        return _row_history(rows(batch), earlier)

    return bucket_of


def _tokens_history(batch: Batch) -> str | None:
    if batch.num_tokens == 0:
        return None
    earlier = batch.num_tokens if batch.prior is None else batch.prior.num_tokens
    return "same T" if earlier == batch.num_tokens else (
        "fewer tokens" if earlier < batch.num_tokens else "more tokens")


def _layout_history(batch: Batch) -> str | None:
    if batch.num_tokens == 0:
        return None
    prior = batch.prior
    if prior is not None and prior.swapped:
        return "decode and prefill buffers swapped"
    if prior is not None and prior.row_offset:
        return "buffers from a row offset"
    return "same placement"


def _geometry_history(batch: Batch) -> str | None:
    if batch.num_tokens == 0:
        return None
    prior = batch.prior
    ratio = prior is not None and prior.compress_ratio != batch.compress_ratio
    block = prior is not None and prior.block_size != batch.block_size
    return {(False, False): "same R and B", (True, False): "another R",
            (False, True): "another B", (True, True): "another R and B"}[ratio, block]


def _address_reuse(batch: Batch) -> str | None:
    """Whether the earlier step's buffers sat at this step's addresses with
    another row stride and width (``PriorStep.columns``: a freed workspace
    handed to a step of another capacity). Constraints: none without tokens;
    either bucket beside any other history bucket."""
    if batch.num_tokens == 0:
        return None
    reused = batch.prior is not None and batch.prior.columns
    return "another row stride at the same address" if reused else "same geometry"


SHAPE_HISTORY: tuple[Dimension, ...] = (
    Dimension("decode rows history", ROW_HISTORY_BUCKETS,
              _rows_history(lambda step: step.num_decode_tokens)),
    Dimension("prefill rows history", ROW_HISTORY_BUCKETS,
              _rows_history(lambda step: step.num_prefill_tokens)),
    Dimension("tokens history", ("fewer tokens", "same T", "more tokens"), _tokens_history),
    Dimension("layout history", ("same placement", "decode and prefill buffers swapped",
                                 "buffers from a row offset"), _layout_history),
    Dimension("geometry history", ("same R and B", "another R", "another B",
                                   "another R and B"), _geometry_history),
    Dimension("address reuse", ("same geometry", "another row stride at the same address"),
              _address_reuse),
)
"""The shape-history dimensions, at the end of :data:`DIMENSIONS`."""

HISTORY: tuple[str, ...] = (WIDTH_HISTORY, *(d.name for d in SHAPE_HISTORY))
"""Every dimension only a step built after another into the same buffers has."""

DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("tokens T", ("0", "1", "2-64", "65-1,024", "1,025-8,192", "above 8,192"), _tokens),
    Dimension("requests", ("0", "1", "2-16", "17-256", "257-512"), _requests),
    Dimension("elements T x W", ("up to 65,536", "65,537-1,048,576", "1,048,577-8,388,608",
                                 "above 8,388,608"), _elements),
    Dimension("decode/prefill mix", ("no tokens", "decode only", "prefill only",
                                     "decode + prefill"), _mix),
    Dimension("decode rows", ("0", "1-64", "above 64"), _decode_rows),
    Dimension("speculative decode", ("1 token a request", "2-8 tokens a request"), _speculative),
    Dimension("padding", ("none", "tail", "inside", "tail and inside"), _padding),
    Dimension("padding slot", ("-1", "below -1"), _padding_slot),
    Dimension("padding position", ("within its request", "stale, past its request"),
              _padding_position),
    Dimension("longest list n(t)", ("0 (every length 0)", "1-127", "128-1,023",
                                    "1,024 and more"), _longest_list),
    Dimension("buffer layout", ("own allocation", "offset view", "row stride above C",
                                "one pool for both buffers"), _buffer_layout),
    Dimension("block table", ("dense", "slice of a wider table"), _block_table),
    Dimension("block size B", ("1", "2", "power of two 4-128", "not a power of two",
                               "above 128"), _block_size),
    Dimension("compress ratio R", ("1", "power of two 2-64", "128", "power of two above 128",
                                   "not a power of two"), _ratio),
    Dimension("float32 division by R", ("exact for every token",
                                        "floors a token's length wrong"), _division_by_ratio),
    Dimension("float32 division by B", ("exact for every column",
                                        "floors a column's page wrong"), _division_by_block),
    Dimension("width against need", ("narrower than the longest list (clamps)",
                                     "the policy's width", "wider than the policy's, below C",
                                     "C"), _width_against_need),
    Dimension("width W", ("128", "256-1,023", "1,024-8,191", "8,192 and more"), _width),
    Dimension("capacity C", ("128", "a power of two above 128", "not a power of two"),
              _capacity),
    Dimension("model length", ("a multiple of R", "not a multiple of R, rounding down changes C",
                               "not a multiple of R, C the same either way"), _model_length),
    *INPUT_PLACEMENT,
    *ENGINE_VALUES,
    Dimension(WIDTH_HISTORY, ("same W", "narrower than the last build",
                              "wider than the last build"), _width_history),
    *SHAPE_HISTORY,
)
"""Every dimension, in the order the reach table prints them."""

BY_NAME: dict[str, Dimension] = {d.name: d for d in DIMENSIONS}

Exclusions = Mapping[str, "tuple[str, ...] | None"]
"""Dimension name -> the buckets a property never draws by design (None: the
whole dimension does not apply to it)."""

ONE_BUILD: Exclusions = MappingProxyType({name: None for name in HISTORY})
"""What a property that builds each step into fresh buffers does not reach:
its steps have no history."""

MODEL_LENGTH_ONLY: Exclusions = MappingProxyType({
    d.name: None for d in DIMENSIONS if d.name not in ("compress ratio R", "capacity C",
                                                       "model length")
})
"""What ``width_policy`` does not reach: it reads only R and the model length."""


CONSUMER_REACH: Exclusions = MappingProxyType({
    **ONE_BUILD,
    "tokens T": ("1,025-8,192", "above 8,192"),
    "requests": ("17-256", "257-512"),
    "elements T x W": ("1,048,577-8,388,608", "above 8,388,608"),
    "capacity past 8,192": ("above 8,192",),
    "first scheduled position": ("1,048,576 and more",),
})
"""What the consumer pipeline does not reach: its steps have no history,
no engine-scale step and none past the engine's caps (its consumers launch
per token, over up to 16,384 columns: seconds a step under the interpreter)."""


REPLAY_REACH: Exclusions = MappingProxyType({
    **CONSUMER_REACH,
})
"""What the captured consumer replay does not reach: as the consumer
pipeline, and decode-only steps (those an engine replays in a graph)."""

COMPILE_KEY_REACH: Exclusions = MappingProxyType({
    **CONSUMER_REACH,
    "block size B": ("1", "power of two 4-128", "not a power of two", "above 128"),
    "compress ratio R": ("1", "power of two 2-64", "power of two above 128", "not a power of two"),
    "float32 division by R": ("floors a token's length wrong",),
    "float32 division by B": ("floors a column's page wrong",),
})
"""What the compile-key check does not reach: as the consumer pipeline, and
only the engine's configuration (R = 128, B = 2, the policy's widths)."""


def beyond_budget(budget) -> Exclusions:
    """The buckets a :class:`~c128a.strategies.budget.SizeBudget` keeps out
    of reach: builds of more elements than it allows (the GPU's budget
    reaches every bucket; the interpreter's stops below 8,388,608)."""
    previous, unreachable = 0, []
    for bound, name in ELEMENT_EDGES:
        if previous >= budget.max_elements:
            unreachable.append(name)
        previous = bound
    return {"elements T x W": tuple(unreachable)} if unreachable else {}


def buckets_of(batch: Batch, exclusions: Exclusions = ONE_BUILD) -> dict[str, str]:
    """Dimension name -> the bucket ``batch`` falls in, for every dimension
    the step says something about and ``exclusions`` does not leave out."""
    found = {}
    for dimension in DIMENSIONS:
        if exclusions.get(dimension.name, ()) is None:
            continue
        bucket = dimension.bucket_of(batch)
        if bucket is not None:
            found[dimension.name] = bucket
    return found


def labels_of(batch: Batch, exclusions: Exclusions = ONE_BUILD) -> tuple[str, ...]:
    """:func:`buckets_of` as ``event()`` texts, ``"dimension: bucket"``."""
    return tuple(BY_NAME[name].label(bucket) for name, bucket in buckets_of(batch, exclusions).items())


def expected(exclusions: Exclusions = ONE_BUILD) -> dict[str, tuple[str, ...]]:
    """Dimension name -> the buckets a strategy under ``exclusions`` must draw."""
    found = {}
    for dimension in DIMENSIONS:
        left_out = exclusions.get(dimension.name, ())
        if left_out is None:
            continue
        found[dimension.name] = tuple(b for b in dimension.buckets if b not in left_out)
    return found


def parse_label(label: str) -> tuple[str, str] | None:
    """(dimension, bucket) of a reach label, None for any other ``event()`` text."""
    name, separator, bucket = label.partition(SEPARATOR)
    if separator and name in BY_NAME and bucket in BY_NAME[name].buckets:
        return name, bucket
    return None


def reach_table(counts: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """Label counts (``"dimension: bucket"`` -> examples) as dimension ->
    bucket -> examples, every bucket of every dimension listed (0 where none
    was drawn), in :data:`DIMENSIONS` order; other labels are left out."""
    table = {d.name: {b: 0 for b in d.buckets} for d in DIMENSIONS}
    for label, count in counts.items():
        parsed = parse_label(label)
        if parsed is not None:
            table[parsed[0]][parsed[1]] += count
    return table
