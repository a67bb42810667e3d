"""The constraint model: which buckets of the reach dimensions one step can
be in at once, and why not where it cannot.

Declared as PICT and ACTS declare theirs: a rule over a few dimensions
forbids some of their buckets together, with its reason ("mix 'no tokens'
has no requests", "W above C is impossible"); nothing is listed cell by
cell. Every :data:`MODEL_DIMENSIONS` dimension (those of :mod:`.reach`, the
small derived ones below, and the step's scale) takes one of its buckets,
or :data:`NOT_APPLICABLE` where its ``bucket_of`` says nothing (speculative
decoding of a step without decode tokens); :data:`APPLIES` declares when.

A rule is one of two kinds:

- :data:`CONTRACT`: no step can be there (the contract's arithmetic: T =
  decode rows + prefill tokens, W <= C, a power of two's reciprocal is
  exact). A drawn step never breaks one (``tests/test_reach.py`` checks).
- :data:`BUDGET`: the strategies do not go there within a size budget
  (:mod:`.budget`; None: no device's budget, only what holds for every
  device: C <= 8,192, R <= 65,536, a small step's 64 tokens). A step may
  land there; no property must.

Which cells of two or three dimensions are allowed follows from the rules
(:func:`model`, :meth:`Model.status`): a cell is forbidden when
propagating the rules from it empties a dimension (:mod:`.solver`), with
the reasons of the rules that did. Adding a dimension is declaring its
buckets in :mod:`.reach`, when it applies in :data:`APPLIES`, and its rules
here; nothing lists its cells.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable, Mapping

from ..contract import (
    MAX_CAPACITY,
    MAX_MODEL_LEN,
    MAX_QUERY_TOKENS_PER_DECODE,
    WIDTH_ALIGNMENT,
    capacity_width,
)
from ..step import Batch
from .budget import ENGINE_TOKENS, MAX_REQUESTS, SizeBudget
from .reach import DIMENSIONS as REACH_DIMENSIONS
from .reach import Dimension, _cut
from .solver import Contradiction, Network, Table

NOT_APPLICABLE = "not applicable"
CONTRACT = "forbidden by the contract"
BUDGET = "beyond the size budget"
INF = 1 << 62

# ---------------------------------------------------------------- derived dimensions
# Small dimensions the reach table does not show: each reads what a kernel
# branches on beside another dimension (prefill rows beside decode rows, a
# decode list against one block, how large a position is, M).


def _decode_lengths(batch: Batch) -> list[int]:
    """n(t) of the decode tokens."""
    return [min((p + 1) // batch.compress_ratio, batch.width)
            for p in batch.positions[: batch.num_decode_tokens]]


def _prefill_tokens(batch: Batch) -> str:
    return _cut(batch.num_prefill_tokens, (
        (0, "0"), (64, "1-64"), (1_024, "65-1,024"), (1 << 62, "above 1,024"),
    ))


def _list_against_block(batch: Batch) -> str | None:
    """The longest decode list n(t) against one block of B entries: a
    builder's fast path that reads one block-table column a token breaks
    only where a list is longer than a block."""
    lengths = _decode_lengths(batch)
    if not lengths:
        return None
    longest = max(lengths)
    if longest == 0:
        return "0 entries"
    return "within one block" if longest <= batch.block_size else "longer than one block"


POSITION_EDGES = ((65_535, "below 65,536"), (524_287, "65,536-524,287"),
                  (1 << 62, "524,288 and more"))


def _position_magnitude(batch: Batch) -> str | None:
    """The largest position, up to the contract's 1M context: where a
    float32 quotient (p + 1) / R loses its last bits."""
    if batch.num_tokens == 0:
        return None
    return _cut(max(batch.positions), POSITION_EDGES)


def _table_width(batch: Batch) -> str | None:
    """Block-table columns M (decode steps only)."""
    if batch.num_decode_tokens == 0:
        return None
    return _cut(batch.table_width, ((16, "1-16"), (256, "17-256"), (1 << 62, "above 256")))


ROW_ALIGNMENT = ("16-byte aligned rows", "rows off a 16-byte boundary")


def _row_alignment(batch: Batch) -> str:
    """Whether the output buffers' row stride (C plus the prefill buffer's
    extra columns and the row padding, int32) is a multiple of 16 bytes: a
    kernel whose vectorised stores assume aligned rows breaks on the
    others. Offsets are always 16-byte aligned (:mod:`.engine`)."""
    aligned = batch.buffer_row_padding % 4 == 0
    return ROW_ALIGNMENT[0] if aligned else ROW_ALIGNMENT[1]


DERIVED: tuple[Dimension, ...] = (
    Dimension("prefill tokens", ("0", "1-64", "65-1,024", "above 1,024"), _prefill_tokens),
    Dimension("longest decode list against B", ("0 entries", "within one block",
                                                "longer than one block"), _list_against_block),
    Dimension("position magnitude", tuple(name for _, name in POSITION_EDGES),
              _position_magnitude),
    Dimension("block-table width M", ("1-16", "17-256", "above 256"), _table_width),
    Dimension("buffer row alignment", ROW_ALIGNMENT, _row_alignment),
)
"""Small dimensions only the constraint model and its interactions use."""

DERIVED_FROM: Mapping[str, tuple[str, ...]] = {
    "prefill tokens": ("tokens T", "decode/prefill mix"),
    "longest decode list against B": ("longest list n(t)", "block size B"),
    "position magnitude": ("longest list n(t)",),
    "block-table width M": ("block table",),
    "buffer row alignment": ("buffer layout",),
}
"""The reach dimensions each derived one reads: a property whose ``reach``
leaves one of them out whole leaves the derived one out too."""

SCALE = "step scale"
SMALL, ENGINE_SCALE = "small", "engine-scale"
WIDTHS = "widths drawn"
ANY_WIDTH, POLICY_WIDTH = "any", "the policy's only"

MODEL_DIMENSIONS: tuple[Dimension, ...] = (
    *REACH_DIMENSIONS,
    *DERIVED,
    Dimension(SCALE, (SMALL, ENGINE_SCALE), lambda batch: None),
    Dimension(WIDTHS, (ANY_WIDTH, POLICY_WIDTH), lambda batch: None),
)
"""Every dimension of the model, in order: the reach dimensions, the
derived ones, and two no step reports: its scale (small or engine-scale,
:mod:`.budget`), which splits the cells between the draws of each scale,
and whether its strategy draws the policy's width only (``widths="policy"``
of :func:`~c128a.strategies.engine.batches`), which a property's reach
names."""

HIDDEN = (SCALE, WIDTHS)
"""The model's dimensions no step reports and no interaction names."""

BY_NAME: Mapping[str, Dimension] = {d.name: d for d in MODEL_DIMENSIONS}

# ---------------------------------------------------------------- when a dimension applies

NO_TOKENS = ("tokens T", ("0",))
NO_DECODE = ("decode rows", ("0",))
NO_PADDING = ("padding", ("none", NOT_APPLICABLE))

APPLIES: Mapping[str, tuple[tuple[str, tuple[str, ...]], str]] = {
    **{name: (NO_TOKENS, "a step without tokens has none") for name in (
        "padding", "longest list n(t)", "float32 division by R", "position magnitude",
        "width history", "decode rows history", "prefill rows history", "tokens history",
        "layout history", "geometry history")},
    **{name: (NO_DECODE, "only decode tokens have it") for name in (
        "speculative decode", "block table", "float32 division by B",
        "longest decode list against B", "block-table width M")},
    **{name: (NO_PADDING, "only padding tokens have it") for name in (
        "padding slot", "padding position")},
    **{name: (NO_TOKENS, "a step without tokens reads no input and has no request") for name in (
        "positions placement", "token_to_req_indices placement", "slot_mapping placement",
        "slot ids", "first scheduled position", "address reuse")},
    **{name: (NO_DECODE, "only decode tokens read the block table") for name in (
        "block table placement", "shared pages")},
}
"""Dimension -> ((dimension, its buckets where this one does not apply),
why): the dimension takes :data:`NOT_APPLICABLE` exactly there."""

# ---------------------------------------------------------------- numbers behind the buckets

MAX_DECODE_ROWS = (MAX_REQUESTS + 1) * MAX_QUERY_TOKENS_PER_DECODE
"""512 requests of 8 decode tokens, and 8 tail padding tokens."""

INTERVALS: Mapping[str, Mapping[str, tuple[int, int]]] = {
    "tokens T": {"0": (0, 0), "1": (1, 1), "2-64": (2, 64), "65-1,024": (65, 1_024),
                 "1,025-8,192": (1_025, 8_192), "above 8,192": (8_193, INF)},
    "requests": {"0": (0, 0), "1": (1, 1), "2-16": (2, 16), "17-256": (17, 256),
                 "257-512": (257, MAX_REQUESTS)},
    "decode rows": {"0": (0, 0), "1-64": (1, 64), "above 64": (65, MAX_DECODE_ROWS)},
    "prefill tokens": {"0": (0, 0), "1-64": (1, 64), "65-1,024": (65, 1_024),
                       "above 1,024": (1_025, INF)},
    "elements T x W": {"up to 65,536": (0, 65_536), "65,537-1,048,576": (65_537, 1 << 20),
                       "1,048,577-8,388,608": ((1 << 20) + 1, 1 << 23),
                       "above 8,388,608": ((1 << 23) + 1, INF)},
    "width W": {"128": (128, 128), "256-1,023": (256, 896), "1,024-8,191": (1_024, 8_064),
                "8,192 and more": (8_192, INF)},
    "capacity C": {"128": (128, 128), "a power of two above 128": (256, INF),
                   "not a power of two": (384, INF)},
    "longest list n(t)": {"0 (every length 0)": (0, 0), "1-127": (1, 127),
                          "128-1,023": (128, 1_023), "1,024 and more": (1_024, INF)},
    "compress ratio R": {"1": (1, 1), "power of two 2-64": (2, 64), "128": (128, 128),
                         "power of two above 128": (256, INF), "not a power of two": (3, INF)},
    "position magnitude": {"below 65,536": (0, 65_535), "65,536-524,287": (65_536, 524_287),
                           "524,288 and more": (524_288, INF)},
    "block-table width M": {"1-16": (1, 16), "17-256": (17, 256), "above 256": (257, INF)},
    "block size B": {"1": (1, 1), "2": (2, 2), "power of two 4-128": (4, 128),
                     "not a power of two": (3, 127), "above 128": (129, INF)},
}
"""The integers each bucket of a counted dimension holds (W and C in
multiples of 128): the rules compare ranges rather than names."""


def span(dimension: str, bucket: str) -> tuple[int, int]:
    return INTERVALS[dimension][bucket]


def _meets(low: int, high: int, other: tuple[int, int]) -> bool:
    return low <= other[1] and other[0] <= high


# ---------------------------------------------------------------- rules

CONTRACT_RULES: list["Rule"] = []
BUDGET_RULES: list["Rule"] = []


@dataclass(frozen=True)
class Rule:
    """One constraint over ``scope``: ``forbids(*buckets)`` (a budget
    rule's first argument is the :class:`~.budget.SizeBudget`, or None)
    returns why the buckets cannot go together, None where they can."""

    scope: tuple[str, ...]
    forbids: Callable[..., "str | None"]
    kind: str

    @property
    def name(self) -> str:
        return self.forbids.__name__.strip("_")


def contract(*scope: str):
    """Declare a :data:`CONTRACT` rule over ``scope``."""
    def register(forbids):
        CONTRACT_RULES.append(Rule(scope, forbids, CONTRACT))
        return forbids
    return register


def budget_rule(*scope: str):
    """Declare a :data:`BUDGET` rule over ``scope``."""
    def register(forbids):
        BUDGET_RULES.append(Rule(scope, forbids, BUDGET))
        return forbids
    return register


# The step's tokens: T = decode rows + prefill tokens, each token of a request.


@contract("tokens T", "decode/prefill mix")
def _tokens_mix(tokens, mix):
    if (tokens == "0") != (mix == "no tokens"):
        return "a step has no tokens exactly when its mix is 'no tokens'"
    if tokens == "1" and mix == "decode + prefill":
        return "one token is either a decode or a prefill token"
    if tokens == "above 8,192" and mix == "decode only":
        return (f"{MAX_REQUESTS} requests of at most {MAX_QUERY_TOKENS_PER_DECODE} decode "
                f"tokens each (and {MAX_QUERY_TOKENS_PER_DECODE} padding tokens) make at most "
                f"{MAX_DECODE_ROWS:,} decode tokens")
    return None


@contract("decode/prefill mix", "decode rows")
def _mix_decode(mix, rows):
    if (rows == "0") != (mix in ("no tokens", "prefill only")):
        return "a step has decode rows exactly when its mix has decode tokens"
    return None


@contract("decode/prefill mix", "prefill tokens")
def _mix_prefill(mix, prefill):
    if (prefill == "0") != (mix in ("no tokens", "decode only")):
        return "a step has prefill tokens exactly when its mix has prefill tokens"
    return None


@contract("tokens T", "decode rows", "prefill tokens")
def _tokens_add_up(tokens, rows, prefill):
    low = span("decode rows", rows)[0] + span("prefill tokens", prefill)[0]
    high = span("decode rows", rows)[1] + span("prefill tokens", prefill)[1]
    if not _meets(low, high, span("tokens T", tokens)):
        return "T = decode rows + prefill tokens"
    return None


@contract("tokens T", "requests")
def _tokens_requests(tokens, requests):
    if (tokens == "0") != (requests == "0"):
        return "every token belongs to a request: no tokens exactly when no requests"
    if span("requests", requests)[0] > span("tokens T", tokens)[1]:
        return "every request has a token of the step"
    return None


@contract("tokens T", "requests", "prefill tokens")
def _decode_tokens_of_requests(tokens, requests, prefill):
    most = (span("requests", requests)[1] + 1) * MAX_QUERY_TOKENS_PER_DECODE
    if span("tokens T", tokens)[0] > most + span("prefill tokens", prefill)[1]:
        return (f"decode tokens are at most {MAX_QUERY_TOKENS_PER_DECODE} a request and "
                f"{MAX_QUERY_TOKENS_PER_DECODE} padding tokens: T <= 8 x requests + 8 + prefill")
    return None


@contract("requests", "decode rows", "prefill tokens")
def _one_request(requests, rows, prefill):
    if requests != "1":
        return None
    if rows != "0" and prefill != "0":
        return "a decode request and a prefill request are two requests"
    if rows == "above 64":
        return (f"one decode request has at most {MAX_QUERY_TOKENS_PER_DECODE} query tokens "
                f"and {MAX_QUERY_TOKENS_PER_DECODE} padding tokens")
    return None


@contract("tokens T", "speculative decode")
def _lone_token_speculative(tokens, speculative):
    if tokens == "1" and speculative == "2-8 tokens a request":
        return "one token is not several tokens of a request"
    return None


@contract("tokens T", "padding")
def _lone_token_padding(tokens, padding):
    if tokens == "1" and padding in ("inside", "tail and inside"):
        return "padding inside lies before a real token: two tokens at least"
    return None


@contract("tokens T", "padding position")
def _lone_token_stale(tokens, position):
    if tokens == "1" and position == "stale, past its request":
        return "a lone padding token's request has no real token to be past"
    return None


@contract("tokens T", "requests", "compress ratio R", "longest list n(t)")
def _positions_of_requests(tokens, requests, ratio, longest):
    # A request's tokens hold distinct positions (its last ones): T tokens
    # (up to 8 of them tail padding) in Q requests reach position ceil((T - 8) / Q) - 1.
    real = max(span("tokens T", tokens)[0] - MAX_QUERY_TOKENS_PER_DECODE, 0)
    q_low, q_high = span("requests", requests)
    r_low, r_high = span("compress ratio R", ratio)
    n_low, n_high = span("longest list n(t)", longest)
    reached = -(-real // q_high) // r_high if q_high else 0
    if n_high < min(reached, WIDTH_ALIGNMENT):
        return ("a request's tokens hold distinct positions: so many tokens in so few "
                "requests reach a longer list")
    if n_high < WIDTH_ALIGNMENT and real > q_high * min((n_high + 1) * r_high - 1, INF):
        return ("a request's tokens hold distinct positions: lists this short hold fewer "
                "tokens a request")
    return None


# Widths: n(t) = min(floor((p + 1) / R), W) <= W <= C.


@contract("capacity C", "width W")
def _capacity_width(capacity, width):
    if capacity == "128" and width != "128":
        return f"W <= C, and C = {WIDTH_ALIGNMENT} admits only W = {WIDTH_ALIGNMENT}"
    return None


@contract("capacity C", "width against need")
def _capacity_against(capacity, against):
    if capacity == "128" and against != "C":
        return f"C = {WIDTH_ALIGNMENT} admits only W = C"
    return None


@contract("tokens T", "width against need")
def _no_list_to_clamp(tokens, against):
    if tokens == "0" and against == "narrower than the longest list (clamps)":
        return "a step without tokens has no list to clamp"
    return None


@contract("tokens T", "width against need", "width W")
def _policy_width_without_tokens(tokens, against, width):
    if tokens == "0" and against == "the policy's width" and width != "128":
        return "the policy's width of a step without tokens is 128"
    return None


@contract("width W", "width against need")
def _width_against(width, against):
    if width == "128" and against == "wider than the policy's, below C":
        return f"the policy's width is {WIDTH_ALIGNMENT} at least"
    return None


@contract("longest list n(t)", "width W")
def _list_within_width(longest, width):
    if span("longest list n(t)", longest)[0] > span("width W", width)[1]:
        return "n(t) = min(floor((p + 1) / R), W) <= W"
    return None


@contract("width against need", "width W", "longest list n(t)")
def _clamped_list(against, width, longest):
    if against != "narrower than the longest list (clamps)":
        return None
    if not _meets(*span("width W", width), span("longest list n(t)", longest)):
        return "a width narrower than the longest list clamps that list to W"
    return None


@contract(WIDTHS, "width against need")
def _policy_widths(widths, against):
    if widths == POLICY_WIDTH and against not in ("the policy's width", "C"):
        return "a strategy of the policy's widths draws W = the policy's (C where it is C)"
    return None


@contract(WIDTHS, "tokens T", "width W")
def _policy_width_of_no_tokens(widths, tokens, width):
    if widths == POLICY_WIDTH and tokens == "0" and width != "128":
        return "the policy's width of a step without tokens is 128"
    return None


@contract(WIDTHS, "width against need", "width W", "longest list n(t)")
def _policy_list(widths, against, width, longest):
    w_low, w_high = span("width W", width)
    is_policy = against == "the policy's width" or (widths == POLICY_WIDTH and against == "C")
    if not is_policy or w_high <= WIDTH_ALIGNMENT:
        return None
    # The policy's W above 128 is the next power of two of the longest list:
    # that list (a real token's, at most W) is longer than W / 2.
    if span("longest list n(t)", longest)[1] <= w_low // 2:
        return "the policy's width above 128 is the next power of two of the longest list"
    return None


@contract("compress ratio R", "position magnitude", "width W", "longest list n(t)")
def _list_of_positions(ratio, magnitude, width, longest):
    # The longest list is min(floor((p + 1) / R), W) of the largest position
    # p, the one the position magnitude counts.
    r_low, r_high = span("compress ratio R", ratio)
    p_low, p_high = span("position magnitude", magnitude)
    w_low, w_high = span("width W", width)
    low = min((p_low + 1) // r_high, w_low)
    high = min((p_high + 1) // r_low, w_high)
    if not _meets(low, high, span("longest list n(t)", longest)):
        return "the longest list is min(floor((p + 1) / R), W) of the largest position p"
    return None


@contract("width history", "width W")
def _wider_than_before(history, width):
    if history == "wider than the last build" and width == "128":
        return f"no width is narrower than {WIDTH_ALIGNMENT}"
    return None


@contract("width history", "width against need")
def _narrower_than_before(history, against):
    if history == "narrower than the last build" and against == "C":
        return "the last build's width is C at most"
    return None


# Divisions: a power of two divides exactly; a quotient that floors wrong is 1 at least.


@contract("compress ratio R", "float32 division by R")
def _exact_ratio(ratio, division):
    if division == "floors a token's length wrong" and ratio != "not a power of two":
        return "a power of two's float32 reciprocal divides exactly"
    return None


@contract("longest list n(t)", "float32 division by R")
def _wrong_floor_is_one(longest, division):
    if division == "floors a token's length wrong" and longest == "0 (every length 0)":
        return "(p + 1) / R floors wrong only where p + 1 >= R: a list of 1 entry or more"
    return None


@contract("compress ratio R", "longest decode list against B")
def _ratio_one_lists(ratio, against):
    if ratio == "1" and against == "0 entries":
        return "at R = 1 a token at position p attends to p + 1 >= 1 entries"
    return None


@contract("compress ratio R", "model length")
def _every_length_multiple_of_one(ratio, length):
    if ratio == "1" and length != "a multiple of R":
        return "every length is a multiple of R = 1"
    return None


@contract("capacity C", "model length")
def _rounding_at_one_tile(capacity, length):
    if capacity == "128" and length == "not a multiple of R, rounding down changes C":
        return f"rounding ceil(L / R) <= {WIDTH_ALIGNMENT} down leaves one tile"
    return None


@contract("block size B", "float32 division by B")
def _exact_block(block, division):
    if division == "floors a column's page wrong" and block not in ("not a power of two",
                                                                    "above 128"):
        return "a power of two's float32 reciprocal divides exactly"
    return None


@contract("longest decode list against B", "float32 division by B")
def _wrong_page_past_one_block(against, division):
    if division == "floors a column's page wrong" and against != "longer than one block":
        return "j / B floors wrong only at a column j >= B: a list longer than one block"
    return None


@contract("longest decode list against B", "longest list n(t)")
def _decode_list_within_longest(against, longest):
    if against != "0 entries" and longest == "0 (every length 0)":
        return "a decode list of one entry or more makes the longest list one at least"
    return None


@contract("decode/prefill mix", "longest decode list against B", "block size B",
          "longest list n(t)")
def _decode_only_lists(mix, against, block, longest):
    # In a decode-only step every token (tail padding too) is a decode token.
    if mix != "decode only":
        return None
    n_low, n_high = span("longest list n(t)", longest)
    b_low, b_high = span("block size B", block)
    if (against == "0 entries") != (n_high == 0) or (
            against == "within one block" and n_low > b_high) or (
            against == "longer than one block" and n_high <= b_low):
        return "in a decode-only step the longest list is the longest decode list"
    return None


@contract("block size B", "longest decode list against B", "width W")
def _list_past_a_block_within_width(block, against, width):
    if against == "longer than one block" and span("width W", width)[1] <= span(
            "block size B", block)[0]:
        return "a decode list longer than a block of B entries is longer than B: W > B"
    return None


@contract("block size B", "longest decode list against B", "longest list n(t)")
def _list_past_a_block_is_the_longest(block, against, longest):
    if against == "longer than one block" and span("longest list n(t)", longest)[1] <= span(
            "block size B", block)[0]:
        return "a decode list longer than a block of B entries makes the longest list > B"
    return None


# Shape history: rows before against the step's rows.


@contract("tokens T", "decode rows history")
def _lone_token_decode_rows_before(tokens, history):
    if tokens == "1" and history == "fewer, same 64-row block":
        return "one row has no fewer rows in its block but none"
    return None


@contract("tokens T", "prefill rows history")
def _lone_token_prefill_rows_before(tokens, history):
    return _lone_token_decode_rows_before(tokens, history)


@contract("decode rows", "decode rows history")
def _no_decode_rows_before(rows, history):
    if rows == "0" and history not in ("same", "more, across a 64-row block"):
        return "a step of no decode rows had the same or more decode rows before"
    return None


@contract("prefill tokens", "prefill rows history")
def _no_prefill_rows_before(prefill, history):
    if prefill == "0" and history not in ("same", "more, across a 64-row block"):
        return "a step of no prefill rows had the same or more prefill rows before"
    return None


def _direction(history: str) -> int:
    return -1 if history.startswith("fewer") else 1 if history.startswith("more") else 0


@contract("decode rows history", "prefill rows history", "tokens history")
def _tokens_before(decode, prefill, tokens):
    directions = {_direction(decode), _direction(prefill)}
    wanted = {"fewer tokens": -1, "same T": 0, "more tokens": 1}[tokens]
    if directions == {0} and wanted != 0:
        return "the same decode and prefill rows make the same T"
    if directions in ({-1}, {-1, 0}) and wanted != -1:
        return "fewer rows of one kind and no more of the other make fewer tokens"
    if directions in ({1}, {1, 0}) and wanted != 1:
        return "more rows of one kind and no fewer of the other make more tokens"
    return None


# ---------------------------------------------------------------- budget rules


@budget_rule(SCALE, "tokens T", "requests")
def _scale_tokens(budget, scale, tokens, requests):
    low, high = span("tokens T", tokens)
    if scale == SMALL and (low > 64 or span("requests", requests)[0] > 16):
        return "a small step has at most 64 tokens and 16 requests"
    if scale == ENGINE_SCALE and high < 65:
        return "an engine-scale step has 65 tokens or more"
    return None


@budget_rule(SCALE, "decode rows", "prefill tokens")
def _scale_rows(budget, scale, rows, prefill):
    if scale == SMALL and (rows == "above 64" or span("prefill tokens", prefill)[0] > 64):
        return "a small step has at most 64 tokens"
    return None


def widest_capacity(tokens: int, budget: SizeBudget | None) -> int:
    """The widest C a step of ``tokens`` tokens is drawn with: an engine-scale
    step holds T x C (tail padding and a few rows included) within the
    budget's elements."""
    if budget is None or tokens <= 64:
        return MAX_CAPACITY
    room = tokens + 2 * MAX_QUERY_TOKENS_PER_DECODE
    capacity = budget.max_elements // room // WIDTH_ALIGNMENT * WIDTH_ALIGNMENT
    return max(WIDTH_ALIGNMENT, min(MAX_CAPACITY, capacity))


def _most_tokens(budget: SizeBudget | None) -> int:
    return INF if budget is None else budget.max_tokens + MAX_QUERY_TOKENS_PER_DECODE


@budget_rule("tokens T")
def _tokens_within_budget(budget, tokens):
    if span("tokens T", tokens)[0] > _most_tokens(budget):
        return f"an engine-scale step has at most max_tokens={budget.max_tokens:,} tokens"
    return None


@budget_rule("first scheduled position", "padding position", "tokens T", "position magnitude")
def _positions_from_the_start(budget, first, padding, tokens, magnitude):
    # A request scheduled from its start holds positions 0 to its tokens
    # less one; only a stale padding token is drawn past them.
    if first != "0 (every request from its start)" or padding == "stale, past its request":
        return None
    most = min(span("tokens T", tokens)[1], _most_tokens(budget))
    if span("position magnitude", magnitude)[0] >= most:
        return (f"every request from its start holds positions below T <= {most:,}: a "
                "larger one is a stale padding token's")
    return None


@budget_rule("capacity C", "width W")
def _largest_capacity(budget, capacity, width):
    if capacity == "not a power of two" and width == "8,192 and more":
        return (f"W <= C <= {MAX_CAPACITY:,} (the capacity at the largest max_model_len "
                f"drawn, {MAX_MODEL_LEN:,}), and {MAX_CAPACITY:,} is a power of two")
    return None


@budget_rule("width W", "width against need")
def _widest_is_capacity(budget, width, against):
    if width == "8,192 and more" and against != "C":
        return f"W <= C <= {MAX_CAPACITY:,}: W = {MAX_CAPACITY:,} is C"
    return None


@budget_rule("compress ratio R", "capacity C")
def _capacity_of_the_longest_model(budget, ratio, capacity):
    widest = capacity_width(MAX_MODEL_LEN, span("compress ratio R", ratio)[0])
    if span("capacity C", capacity)[0] > widest:
        return (f"max_model_len <= {MAX_MODEL_LEN:,} gives C <= {widest:,} at this R")
    return None


@budget_rule("compress ratio R", "width W")
def _width_of_the_longest_model(budget, ratio, width):
    widest = capacity_width(MAX_MODEL_LEN, span("compress ratio R", ratio)[0])
    if span("width W", width)[0] > widest:
        return (f"max_model_len <= {MAX_MODEL_LEN:,} gives W <= C <= {widest:,} at this R")
    return None


@budget_rule("requests", "width W")
def _width_of_many_requests(budget, requests, width):
    least = span("requests", requests)[0]
    if span("width W", width)[0] > widest_capacity(least, budget):
        return (f"T x C within max_elements={budget.max_elements:,}: {least} requests "
                f"(as many tokens) hold C <= {widest_capacity(least, budget):,}")
    return None


@budget_rule("compress ratio R", "position magnitude")
def _ratio_position(budget, ratio, magnitude):
    most = min(MAX_MODEL_LEN, MAX_CAPACITY * span("compress ratio R", ratio)[1]) - 1
    if span("position magnitude", magnitude)[0] > most:
        r = span("compress ratio R", ratio)[1]
        return f"C <= {MAX_CAPACITY:,} columns hold at most {MAX_CAPACITY * r:,} positions at R <= {r}"
    return None


@contract("compress ratio R", "capacity C", "position magnitude")
def _positions_within_capacity(ratio, capacity, magnitude):
    longest = span("capacity C", capacity)[1] * span("compress ratio R", ratio)[1]
    if span("position magnitude", magnitude)[0] >= longest:
        return "every position is below max_model_len <= C x R"
    return None


@budget_rule("compress ratio R", "position magnitude", "longest list n(t)")
def _largest_ratio(budget, ratio, magnitude, longest):
    if longest == "0 (every length 0)" and magnitude != "below 65,536":
        return "R <= 65,536 (a saved step's bound): a position past 65,535 has a list"
    return None


def _bucket_of(dimension: str, value: int) -> str:
    return next(b for b, (low, high) in INTERVALS[dimension].items() if low <= value <= high)


def _capacity_bucket(capacity: int) -> str:
    if capacity == WIDTH_ALIGNMENT:
        return "128"
    return "a power of two above 128" if capacity & (capacity - 1) == 0 else "not a power of two"


@functools.lru_cache(maxsize=8)
def drawn_sizes(budget: SizeBudget | None) -> frozenset[tuple]:
    """(T, W, C, elements T x W buckets, whether W = C, whether W is a power
    of two) of every size a step is drawn at: C a multiple of 128 up to
    8,192, W one up to C, T up to the budget's tokens with T x C within its
    elements (:func:`widest_capacity`)."""
    found = set()
    most = INF if budget is None else budget.max_tokens
    for capacity in range(WIDTH_ALIGNMENT, MAX_CAPACITY + 1, WIDTH_ALIGNMENT):
        top = INF
        if budget is not None and capacity > WIDTH_ALIGNMENT:
            # T + 2 x 8 rows of room within max_elements / C, tail padding past it.
            top = max(64, budget.max_elements // capacity - 2 * MAX_QUERY_TOKENS_PER_DECODE)
            top += MAX_QUERY_TOKENS_PER_DECODE
        for width in range(WIDTH_ALIGNMENT, capacity + 1, WIDTH_ALIGNMENT):
            for tokens, (low, high) in INTERVALS["tokens T"].items():
                high = min(high, most, top)
                if low > high:
                    continue
                for elements, span_e in INTERVALS["elements T x W"].items():
                    if _meets(low * width, high * width, span_e):
                        found.add((tokens, _bucket_of("width W", width),
                                   _capacity_bucket(capacity), elements, width == capacity,
                                   width & (width - 1) == 0))
    return frozenset(found)


def _size_rule(*scope: str):
    """A budget rule over some of T, W, C, elements and the width against
    need (C: W = C; the policy's width or one above it: W a power of two
    below C; narrower: W below C): met where some drawn size
    (:func:`drawn_sizes`) has those buckets."""
    places = {"tokens T": 0, "width W": 1, "capacity C": 2, "elements T x W": 3}

    def forbids(budget, *buckets):
        wanted = [(places[d], b) for d, b in zip(scope, buckets) if d in places]
        against = dict(zip(scope, buckets)).get("width against need")

        def fits(size) -> bool:
            if against == "C" and not size[4]:
                return False
            if against is not None and against != "C" and size[4]:
                return False
            if against in ("the policy's width", "wider than the policy's, below C"):
                return size[5]
            return True

        if any(all(size[i] == b for i, b in wanted) and fits(size)
               for size in drawn_sizes(budget)):
            return None
        if budget is None:
            return "W <= C <= 8,192, T x W elements"
        return (f"T x W elements, W <= C, T x C within max_elements={budget.max_elements:,} "
                f"and T <= max_tokens={budget.max_tokens:,}")

    forbids.__name__ = "_sizes_" + "_".join(d.split()[0] for d in scope)
    return budget_rule(*scope)(forbids)


_size_rule("tokens T", "width W", "elements T x W")
_size_rule("tokens T", "capacity C", "elements T x W")
_size_rule("tokens T", "width W", "capacity C")
_size_rule("width W", "capacity C", "elements T x W")
_size_rule("tokens T", "elements T x W", "width against need")
_size_rule("tokens T", "width W", "elements T x W", "width against need")


@budget_rule("elements T x W", "tokens T")
def _elements_not_aimed_for(budget, elements, tokens):
    least = span("elements T x W", elements)[0]
    if budget is None or span("tokens T", tokens)[0] > ENGINE_TOKENS:
        return None
    if 2 * least > budget.max_elements:
        return (f"builds above half max_elements={budget.max_elements:,} are aimed for past "
                "8,192 tokens only, at C = 128 (their bucket is reached; a build of a "
                "million elements costs the interpreter seconds)")
    if least > ENGINE_TOKENS * 1_024:
        return ("builds above 8,192 x 1,024 elements are aimed for past 8,192 tokens only "
                "(below, only a width past 1,024 of a step every other bucket also shapes)")
    return None


def _rows_beside_columns(budget, rows, prefill, columns: tuple[int, int]) -> str | None:
    least = span("decode rows", rows)[0] + span("prefill tokens", prefill)[0]
    if budget is None or least <= 64 or columns[0] <= WIDTH_ALIGNMENT:
        return None
    if least > budget.max_elements // columns[0] - 2 * MAX_QUERY_TOKENS_PER_DECODE:
        return (f"T x C within max_elements={budget.max_elements:,}: {least:,} decode and "
                f"prefill tokens hold C <= {budget.max_elements // least:,}")
    return None


@budget_rule("decode rows", "prefill tokens", "width W")
def _rows_beside_width(budget, rows, prefill, width):
    return _rows_beside_columns(budget, rows, prefill, span("width W", width))


@budget_rule("decode rows", "prefill tokens", "capacity C")
def _rows_beside_capacity(budget, rows, prefill, capacity):
    return _rows_beside_columns(budget, rows, prefill, span("capacity C", capacity))


ENGINE_DECODE_TOKENS = (MAX_REQUESTS - 32 + 1) * MAX_QUERY_TOKENS_PER_DECODE
"""An engine-scale step's decode tokens at most: 480 requests of 8 tokens
and 8 padding tokens (the other 32 requests are prefill chunks)."""


@budget_rule("tokens T", "compress ratio R")
def _tokens_within_the_model(budget, tokens, ratio):
    least = span("tokens T", tokens)[0]
    if least <= 64:
        return None
    longest = min(MAX_MODEL_LEN, widest_capacity(least, budget) * span("compress ratio R", ratio)[1])
    if least > ENGINE_DECODE_TOKENS + 32 * longest:
        return (f"{least:,} tokens need prefill chunks longer than max_model_len <= "
                f"C x R = {longest:,} (32 chunks at most beside 480 decode requests)")
    return None


@budget_rule("tokens T", "speculative decode", "prefill tokens")
def _one_token_a_request(budget, tokens, speculative, prefill):
    most = MAX_REQUESTS + MAX_QUERY_TOKENS_PER_DECODE + 3
    if speculative == "1 token a request" and span("tokens T", tokens)[0] > most + span(
            "prefill tokens", prefill)[1]:
        return (f"one real decode token a request: at most {MAX_REQUESTS} decode tokens, "
                "8 tail padding and 3 padded inside")
    return None


@budget_rule("decode/prefill mix", "tokens T", "compress ratio R", "longest list n(t)")
def _prefill_chunks_of_short_lists(budget, mix, tokens, ratio, longest):
    # An engine-scale step has 32 prefill requests at most; each request's
    # tokens hold distinct positions, below (n + 1) R for lists of n entries.
    n_high = span("longest list n(t)", longest)[1]
    if mix != "prefill only" or n_high >= WIDTH_ALIGNMENT:
        return None
    most = 32 * ((n_high + 1) * span("compress ratio R", ratio)[1] - 1)
    if span("tokens T", tokens)[0] > 64 and span("tokens T", tokens)[0] > most + 8:
        return ("an engine-scale step has 32 prefill requests at most, each of positions "
                "below (n + 1) R")
    return None


@budget_rule("requests", "decode rows")
def _many_requests_decode(budget, requests, rows):
    if requests == "257-512" and rows != "above 64":
        return "an engine-scale step has at most 32 prefill requests: the rest decode"
    return None


# Inputs as an engine hands them (.engine_inputs; reach.py's docstrings name
# the buckets each cannot occur beside).

BEYOND_CAPS_TOKENS = 4 + MAX_QUERY_TOKENS_PER_DECODE
"""The most tokens of a step past the engine's caps: 4 real tokens and up
to 8 tail padding tokens (:data:`.engine_inputs.BEYOND_CAPS_TOKENS`)."""

PAST_THE_CAPS = ("capacity past 8,192", "above 8,192")
FAR_FIRST = ("first scheduled position", "1,048,576 and more")


@contract("capacity past 8,192", "capacity C")
def _past_the_caps_capacity(past, capacity):
    if past == "above 8,192" and capacity == "128":
        return "a capacity above 8,192 is not C = 128"
    return None


@contract("first scheduled position", "position magnitude")
def _far_first_position(first, magnitude):
    if first == "1,048,576 and more" and magnitude != "524,288 and more":
        return "a request scheduled from position 2^20 or later has a position past 524,287"
    return None


@contract("shared pages", "requests")
def _sharing_needs_two_requests(shared, requests):
    if shared != "unique pages" and requests == "1":
        return "pages are shared between two requests' rows: one request shares none"
    return None


@contract("shared pages", "longest decode list against B")
def _sharing_needs_a_page_read(shared, against):
    if shared != "unique pages" and against == "0 entries":
        return "a shared page is one two decode tokens read: lists of 0 entries read none"
    return None


@contract("buffer layout", "buffer row alignment")
def _rows_without_padding(layout, alignment):
    if layout in ("own allocation", "offset view") and alignment == ROW_ALIGNMENT[1]:
        return ("rows without padding are C (a multiple of 128) columns apart, 16-byte "
                "aligned")
    return None


@contract("buffer widths", "width against need")
def _narrower_prefill_buffer(widths, against):
    if widths == "decode wider" and against == "C":
        return ("W <= both buffers' columns: a prefill buffer narrower than the decode "
                "buffer's C columns holds W < C only")
    return None


@contract("buffer widths", "capacity C")
def _narrower_than_128(widths, capacity):
    if widths == "decode wider" and capacity == "128":
        return "the prefill buffer holds W >= 128 columns: narrower than C = 128 it cannot be"
    return None


@budget_rule("capacity past 8,192", "first scheduled position", SCALE)
def _past_the_caps_small(budget, past, first, scale):
    if (past == "above 8,192" or first == FAR_FIRST[1]) and scale == ENGINE_SCALE:
        return "only a small step of at most 4 tokens is drawn past the engine's caps"
    return None


@budget_rule("first scheduled position", "compress ratio R")
def _far_first_ratio(budget, first, ratio):
    if first == FAR_FIRST[1] and span("compress ratio R", ratio)[1] <= 64:
        return ("a step past the caps has C <= 16,384 columns: positions past 2^20 need "
                "R > 64")
    return None


@budget_rule("capacity past 8,192", "longest list n(t)")
def _past_the_caps_list(budget, past, longest):
    if past == PAST_THE_CAPS[1] and span("longest list n(t)", longest)[1] < WIDTH_ALIGNMENT:
        return ("a step past the caps has its first request reach the model length, past "
                "8,192 x R positions: n(t) = min(L / R, W) >= 128")
    return None


@budget_rule("capacity past 8,192", "first scheduled position", "longest decode list against B")
def _past_the_caps_decode_list(budget, past, first, against):
    if (past == PAST_THE_CAPS[1] or first == FAR_FIRST[1]) and against == "0 entries":
        return ("a step past the caps has its first request (a decode request where it has "
                "one) reach the model length: a list past 8,192 entries, or past 2^20 / R "
                "at R <= 65,536")
    return None


@budget_rule("capacity past 8,192", "first scheduled position", "block-table width M",
             "block size B")
def _past_the_caps_table(budget, past, first, table, block):
    if (past == PAST_THE_CAPS[1] or first == FAR_FIRST[1]) and table == "1-16" and (
            block != "above 128"):
        return ("a decode request past the caps reads more than 8,192 entries: 16 columns "
                "hold them only in blocks of more than 512")
    return None


def _past_the_caps_rule(dimension: str, fits: Callable[[str], bool], what: str):
    """A budget rule: a step past the engine's caps (capacity above 8,192,
    or a request scheduled from 2^20 on) has at most 4 real tokens, so
    ``dimension`` holds only the buckets ``fits`` keeps."""
    def forbids(budget, past, first, bucket):
        if (past == PAST_THE_CAPS[1] or first == FAR_FIRST[1]) and not fits(bucket):
            return (f"a step past the engine's caps has at most 4 real tokens (and 8 tail "
                    f"padding): {what}")
        return None
    forbids.__name__ = "_past_the_caps_" + dimension.split()[0]
    return budget_rule("capacity past 8,192", "first scheduled position", dimension)(forbids)


_past_the_caps_rule("tokens T", lambda b: span("tokens T", b)[1] <= 64, "T <= 12")
_past_the_caps_rule("requests", lambda b: span("requests", b)[0] <= 4, "at most 4 requests")
_past_the_caps_rule("prefill tokens", lambda b: span("prefill tokens", b)[0] <= 4,
                    "at most 4 prefill tokens")
_past_the_caps_rule("elements T x W",
                    lambda b: span("elements T x W", b)[0] <= BEYOND_CAPS_TOKENS * 2 * MAX_CAPACITY,
                    "T x W <= 12 x 16,384")


# ---------------------------------------------------------------- the model, compiled


@dataclass(frozen=True)
class Model:
    """The rules compiled over :data:`MODEL_DIMENSIONS` for one budget:
    ``values[i]`` are dimension i's buckets (and :data:`NOT_APPLICABLE`
    where it may not apply), ``contract`` the contract's rules alone,
    ``network`` with the budget's, ``domains`` what propagation leaves."""

    names: tuple[str, ...]
    values: tuple[tuple[str, ...], ...]
    contract: Network
    network: Network
    domains: tuple[int, ...]
    contract_domains: tuple[int, ...]

    def index(self, name: str) -> int:
        return self.names.index(name)

    def restricted(self, keep: Mapping[str, tuple[str, ...]]) -> tuple[int, ...]:
        """:attr:`domains` with each named dimension kept to ``keep[name]``
        (and not applicable where it may be), propagated; empty domains
        raise :class:`~.solver.Contradiction`."""
        domains = list(self.domains)
        for name, buckets in keep.items():
            i = self.index(name)
            values = self.values[i]
            mask = sum(1 << values.index(b) for b in (*buckets, NOT_APPLICABLE) if b in values)
            domains[i] &= mask
        return tuple(self.network.propagate(domains, [self.index(n) for n in keep]))

    def allows(self, cell: Mapping[str, str], domains=None) -> bool:
        """Whether some step within ``domains`` (:attr:`domains`) has every
        bucket of ``cell``."""
        try:
            self.network.fix(list(self.domains if domains is None else domains),
                             self._assignment(cell))
        except Contradiction:
            return False
        return True

    def status(self, cell: Mapping[str, str]) -> tuple[str, str]:
        """("allowed", "") or (:data:`CONTRACT` or :data:`BUDGET`, the
        reasons): the contract's rules first, then the budget's."""
        assignment = self._assignment(cell)
        if self.allows(cell):
            return "allowed", ""
        try:
            self.contract.fix(list(self.contract_domains), assignment)
            kind, network = BUDGET, self.network
        except Contradiction:
            kind, network = CONTRACT, self.contract
        try:  # again from nothing ruled out, to tell which rules rule the cell out
            network.fix(network.full, assignment, explain=True)
        except Contradiction as found:
            reasons = [reason for tag, reason in found.reasons if tag == kind]
            reasons += [reason for tag, reason in found.reasons if tag != kind]
            return kind, "; ".join(dict.fromkeys(r for r in reasons if r))
        raise AssertionError(f"{dict(cell)} is ruled out only after propagation")

    def _assignment(self, cell: Mapping[str, str]) -> dict[int, int]:
        return {self.index(name): self.values[self.index(name)].index(bucket)
                for name, bucket in cell.items()}


def _values(dimension: Dimension) -> tuple[str, ...]:
    return (*dimension.buckets, NOT_APPLICABLE) if dimension.name in APPLIES else dimension.buckets


def _applies_table(name: str, names, values, sizes) -> Table:
    (other, where), why = APPLIES[name]
    i, j = names.index(name), names.index(other)
    na = values[i].index(NOT_APPLICABLE)

    def forbids(pair):
        applies = values[j][pair[1]] not in where
        if (pair[0] != na) == applies:
            return None
        return (f"{name} applies exactly where {other} is not {' or '.join(where)}: {why}")

    return Table.of((i, j), sizes, forbids, CONTRACT)


def _rule_table(rule: Rule, budget, names, values, sizes) -> Table:
    """A rule's table: it speaks of buckets, so a tuple where one of its
    dimensions does not apply is left to :data:`APPLIES`."""
    scope = tuple(names.index(name) for name in rule.scope)

    def forbids(indices):
        buckets = [values[v][k] for v, k in zip(scope, indices)]
        if NOT_APPLICABLE in buckets:
            return None
        return rule.forbids(budget, *buckets) if rule.kind == BUDGET else rule.forbids(*buckets)

    return Table.of(scope, sizes, forbids, rule.kind)


def sizes_of(budget: SizeBudget | None) -> SizeBudget | None:
    """``budget`` as the rules read it: its sizes (how often a step is
    engine-scale changes no cell)."""
    return None if budget is None else dataclasses.replace(budget, engine_one_in=1)


def model(budget: SizeBudget | None = None) -> Model:
    """The model of :data:`MODEL_DIMENSIONS` under ``budget`` (None: only
    the budget rules that hold for every device)."""
    return _model(sizes_of(budget))


@functools.lru_cache(maxsize=8)
def _model(budget: SizeBudget | None) -> Model:
    names = tuple(d.name for d in MODEL_DIMENSIONS)
    values = tuple(_values(d) for d in MODEL_DIMENSIONS)
    sizes = tuple(len(v) for v in values)
    applies = [_applies_table(name, names, values, sizes) for name in APPLIES]
    contract_tables = applies + [_rule_table(r, budget, names, values, sizes)
                                 for r in CONTRACT_RULES]
    budget_tables = [_rule_table(r, budget, names, values, sizes) for r in BUDGET_RULES]
    contract_network = Network(sizes, contract_tables)
    network = Network(sizes, contract_tables + budget_tables)
    domains = tuple(network.propagate(network.full))
    return Model(names, values, contract_network, network, domains,
                 tuple(contract_network.propagate(contract_network.full)))
