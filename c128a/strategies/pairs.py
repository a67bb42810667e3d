"""Reach in combination: the pairs of dimensions where implementations
branch on both, their cells, and where a step falls in each.

One dimension at a time (:mod:`.reach`) misses the faults two values make
together: a launch bucket by T beside a decode/prefill split, a fast path by
B that assumes lists shorter than a block, a division trick exact only for
small positions at a given R, a staging scratch sized by requests x table
width (CONTRACT.md, "Any of these in any combination"). A :class:`Pair`
names two dimensions (those of :mod:`.reach`, or one of the small derived
ones here: prefill tokens, the longest decode list against B, position
magnitude, block-table width) and every cell of their product, each either

- allowed: a correct builder must handle it, and a property whose ``reach``
  leaves neither bucket out must draw it (``tests/test_reach_pairs.py``);
- forbidden by the contract (a step cannot be there: decode rows with mix
  "prefill only", W above C), with the reason; or
- beyond a size budget: the buffers' largest capacity (8,192 columns) or a
  device's elements (:mod:`.budget`), with the reason.

Each example reports one ``event()`` label a pair (``"pair tokens T x
decode/prefill mix: 65-1,024 x decode only"``); ``c128a fuzz`` counts them
(``reach_pairs`` in its JSON report); ``c128a reach`` lists the allowed cells
a property never drew. The strategies draw a cell of :data:`PAIRS` first
(:mod:`.schedule`) so that the ci profile's few examples reach them early.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

from ..contract import MAX_CAPACITY, MAX_MODEL_LEN, MAX_QUERY_TOKENS_PER_DECODE, WIDTH_ALIGNMENT
from ..step import Batch
from .budget import MAX_REQUESTS
from .reach import BY_NAME as BASE_DIMENSIONS
from .reach import ELEMENT_EDGES, Dimension, Exclusions, _cut

PAIR_PREFIX = "pair "
CELL_JOIN = " x "

ALLOWED = "allowed"
FORBIDDEN = "forbidden by the contract"
BEYOND_BUDGET = "beyond the size budget"


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


DERIVED_FROM: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "prefill tokens": ("tokens T", "decode/prefill mix"),
    "longest decode list against B": ("longest list n(t)", "block size B"),
    "position magnitude": ("longest list n(t)",),
    "block-table width M": ("block table",),
})
"""The base dimensions each derived one reads: a property whose ``reach``
leaves one of them out whole leaves the derived one out too."""

ENGINE_ONLY: Mapping[str, frozenset[str]] = MappingProxyType({
    "tokens T": frozenset({"65-1,024", "1,025-8,192", "above 8,192"}),
    "requests": frozenset({"17-256", "257-512"}),
    "decode rows": frozenset({"above 64"}),
    "prefill tokens": frozenset({"65-1,024", "above 1,024"}),
    "elements T x W": frozenset({"1,048,577-8,388,608", "above 8,388,608"}),
})
"""Buckets only an engine-scale step reaches (a small step has at most a few
dozen tokens)."""

ENGINE_CELLS = "pair cells of engine-scale steps"
"""An :data:`~.reach.Exclusions` key: None leaves out every pair cell with
an :data:`ENGINE_ONLY` bucket (a property that draws no engine-scale step
reaches those buckets only through the historical steps, one cell each)."""

SMALL_STEPS: Exclusions = MappingProxyType({ENGINE_CELLS: None})
"""What a property without engine-scale steps leaves out of its pairs."""

POLICY_WIDTHS_ONLY: Exclusions = MappingProxyType({
    "buffer layout x width against need": tuple(
        (layout, against)
        for layout in BASE_DIMENSIONS["buffer layout"].buckets
        for against in ("narrower than the longest list (clamps)",
                        "wider than the policy's, below C")),
})
"""What a property drawing only the policy's widths leaves out of its pairs
(it reaches other widths only through the historical steps)."""

DECODE_ONLY_PAIRS: Exclusions = MappingProxyType({
    "tokens T x decode/prefill mix": (("1", "prefill only"),),
})
"""What a property drawing decode-only steps leaves out of its pairs (a lone
prefill token comes only from a historical step of several)."""

DERIVED: tuple[Dimension, ...] = (
    Dimension("prefill tokens", ("0", "1-64", "65-1,024", "above 1,024"), _prefill_tokens),
    Dimension("longest decode list against B", ("0 entries", "within one block",
                                                "longer than one block"), _list_against_block),
    Dimension("position magnitude", tuple(name for _, name in POSITION_EDGES),
              _position_magnitude),
    Dimension("block-table width M", ("1-16", "17-256", "above 256"), _table_width),
)
"""Small dimensions that only pairs use (not in the reach table)."""

DIMENSIONS: Mapping[str, Dimension] = MappingProxyType(
    {**BASE_DIMENSIONS, **{d.name: d for d in DERIVED}})
"""Every dimension a pair may name, base and derived."""

Rule = Callable[[str, str], "str | None"]
"""(first bucket, second bucket) -> why the cell is left out, None when allowed."""


@dataclass(frozen=True)
class Pair:
    """Two dimensions an implementation branches on at once, why, and the
    cells a step cannot be in (``forbidden``) or that the buffers' largest
    capacity cannot afford (``beyond_capacity``), each with its reason."""

    first: str
    second: str
    why: str
    forbidden: Rule = lambda a, b: None
    beyond_capacity: Rule = lambda a, b: None

    @property
    def name(self) -> str:
        return f"{self.first}{CELL_JOIN}{self.second}"

    def cells(self) -> tuple[tuple[str, str], ...]:
        return tuple((a, b) for a in DIMENSIONS[self.first].buckets
                     for b in DIMENSIONS[self.second].buckets)

    def status(self, cell: tuple[str, str], budget=None) -> tuple[str, str]:
        """(:data:`ALLOWED`, "") or (:data:`FORBIDDEN` or
        :data:`BEYOND_BUDGET`, the reason) of ``cell`` under ``budget``."""
        reason = self.forbidden(*cell)
        if reason:
            return FORBIDDEN, reason
        reason = self.beyond_capacity(*cell) or _beyond_elements(self, cell, budget)
        if reason:
            return BEYOND_BUDGET, reason
        return ALLOWED, ""

    def cell_of(self, batch: Batch) -> tuple[str, str] | None:
        a = DIMENSIONS[self.first].bucket_of(batch)
        b = DIMENSIONS[self.second].bucket_of(batch)
        return None if a is None or b is None else (a, b)

    def label(self, cell: tuple[str, str]) -> str:
        """The ``event()`` text: ``"pair A x B: a x b"``."""
        return f"{PAIR_PREFIX}{self.name}: {cell[0]}{CELL_JOIN}{cell[1]}"


def _beyond_elements(pair: Pair, cell, budget) -> str | None:
    """Cells of the elements dimension a device's budget keeps out of reach."""
    if budget is None:
        return None
    for name, bucket in zip((pair.first, pair.second), cell):
        if name == "elements T x W":
            previous = 0
            for bound, edge in ELEMENT_EDGES:
                if edge == bucket and previous >= budget.max_elements:
                    return (f"builds of more than {previous:,} elements exceed the "
                            f"budget's max_elements={budget.max_elements:,}")
                previous = bound
    return None


def _tokens_mix(tokens: str, mix: str) -> str | None:
    if (tokens == "0") != (mix == "no tokens"):
        return "a step has no tokens exactly when its mix is 'no tokens'"
    if tokens == "1" and mix == "decode + prefill":
        return "one token is either a decode or a prefill token"
    if tokens == "above 8,192" and mix == "decode only":
        return (f"{MAX_REQUESTS} requests of at most {MAX_QUERY_TOKENS_PER_DECODE} decode "
                f"tokens each (and {MAX_QUERY_TOKENS_PER_DECODE} padding tokens) make at most "
                f"{(MAX_REQUESTS + 1) * MAX_QUERY_TOKENS_PER_DECODE:,} decode tokens")
    return None


def _ratio_position(ratio: str, magnitude: str) -> str | None:
    """C <= 8,192 columns holds ceil(L / R) entries: L <= 8,192 x R."""
    if ratio == "1" and magnitude != "below 65,536":
        return f"R = 1 holds at most {MAX_CAPACITY:,} positions in {MAX_CAPACITY:,} columns"
    if ratio == "power of two 2-64" and magnitude == "524,288 and more":
        return (f"R <= 64 holds at most {MAX_CAPACITY * 64:,} positions in "
                f"{MAX_CAPACITY:,} columns (only the few steps past the engine's caps, of "
                "up to 16,384 columns, reach it)")
    return None


def _requests_table(requests: str, width: str) -> str | None:
    if requests == "0":
        return "a step without requests has no decode rows and no block table"
    return None


def _capacity_width(capacity: str, width: str) -> str | None:
    if capacity == "128" and width != "128":
        return f"W <= C, and C = {WIDTH_ALIGNMENT} admits only W = {WIDTH_ALIGNMENT}"
    return None


def _capacity_width_beyond(capacity: str, width: str) -> str | None:
    if capacity == "not a power of two" and width == "8,192 and more":
        return (f"W >= {MAX_CAPACITY:,} in C columns that are not a power of two needs C > "
                f"{MAX_CAPACITY:,}, past the engine's caps ({MAX_MODEL_LEN:,} tokens at "
                "R = 128): only the few steps past them reach it")
    return None


PAIRS: tuple[Pair, ...] = (
    Pair("tokens T", "decode/prefill mix",
         "a launch bucket chosen by T beside the decode/prefill split", forbidden=_tokens_mix),
    Pair("decode rows", "prefill tokens",
         "a grid split between decode rows and prefill rows (a long prefill with a few "
         "decode tokens)"),
    Pair("block size B", "longest decode list against B",
         "a fast path by B that assumes every list fits in one block"),
    Pair("compress ratio R", "position magnitude",
         "a division trick by R exact only for small positions",
         beyond_capacity=_ratio_position),
    Pair("requests", "block-table width M",
         "a staging scratch sized by requests x table width", forbidden=_requests_table),
    Pair("buffer layout", "width against need",
         "address arithmetic of a view beside the width actually written"),
    Pair("padding", "speculative decode",
         "a padding rule applied per request rather than per token"),
    Pair("capacity C", "width W",
         "a kernel variant chosen by W against buffers of capacity C",
         forbidden=_capacity_width, beyond_capacity=_capacity_width_beyond),
)
"""Every pair of dimensions the suite proves it reaches, in report order."""

BY_PAIR_NAME: dict[str, Pair] = {pair.name: pair for pair in PAIRS}


def _left_out_whole(dimension: str, exclusions: Exclusions) -> bool:
    return exclusions.get(dimension, ()) is None or any(
        exclusions.get(base, ()) is None for base in DERIVED_FROM.get(dimension, ()))


def is_engine_cell(pair: Pair, cell: tuple[str, str]) -> bool:
    """Whether ``cell`` has a bucket only an engine-scale step reaches."""
    return any(bucket in ENGINE_ONLY.get(name, ())
               for name, bucket in zip((pair.first, pair.second), cell))


def pairs_of(exclusions: Exclusions) -> tuple[Pair, ...]:
    """The pairs a property reaches: those neither of whose dimensions (nor
    the base dimensions a derived one reads) its ``reach`` leaves out whole,
    and not left out by name (``reach[pair name] = None``)."""
    return tuple(pair for pair in PAIRS
                 if not _left_out_whole(pair.first, exclusions)
                 and not _left_out_whole(pair.second, exclusions)
                 and exclusions.get(pair.name, ()) is not None)


def left_out_by_design(pair: Pair, cell: tuple[str, str], exclusions: Exclusions) -> bool:
    """Whether a property with ``exclusions`` leaves ``cell`` out by design:
    a bucket its ``reach`` leaves out, the cell named under the pair's name,
    or (:data:`ENGINE_CELLS`) an engine-scale bucket."""
    if cell[0] in (exclusions.get(pair.first, ()) or ()):
        return True
    if cell[1] in (exclusions.get(pair.second, ()) or ()):
        return True
    if cell in (exclusions.get(pair.name, ()) or ()):
        return True
    return ENGINE_CELLS in exclusions and is_engine_cell(pair, cell)


def cells_of(batch: Batch, exclusions: Exclusions) -> dict[str, tuple[str, str]]:
    """Pair name -> the cell ``batch`` falls in, for the pairs ``exclusions`` keeps."""
    found = {}
    for pair in pairs_of(exclusions):
        cell = pair.cell_of(batch)
        if cell is not None:
            found[pair.name] = cell
    return found


def pair_labels_of(batch: Batch, exclusions: Exclusions) -> tuple[str, ...]:
    """:func:`cells_of` as ``event()`` texts, one a pair."""
    return tuple(BY_PAIR_NAME[name].label(cell) for name, cell in cells_of(batch, exclusions).items())


def expected_cells(exclusions: Exclusions, budget=None) -> dict[str, tuple[tuple[str, str], ...]]:
    """Pair name -> the allowed cells under ``budget`` a property with
    ``exclusions`` must draw (cells with a bucket it leaves out by design
    are left out)."""
    return {
        pair.name: tuple(cell for cell in pair.cells()
                         if pair.status(cell, budget)[0] == ALLOWED
                         and not left_out_by_design(pair, cell, exclusions))
        for pair in pairs_of(exclusions)
    }


def parse_pair_label(label: str) -> tuple[str, tuple[str, str]] | None:
    """(pair name, cell) of a pair label, None for any other ``event()`` text."""
    if not label.startswith(PAIR_PREFIX):
        return None
    name, separator, cell = label[len(PAIR_PREFIX):].partition(": ")
    pair = BY_PAIR_NAME.get(name)
    if not separator or pair is None:
        return None
    for candidate in pair.cells():
        if f"{candidate[0]}{CELL_JOIN}{candidate[1]}" == cell:
            return name, candidate
    return None


def pair_table(counts: Mapping[str, int], budget=None) -> dict[str, dict]:
    """Label counts as pair name -> {"never drawn": [cells], "cells":
    {"a x b": examples or the reason it is left out}}, every cell of every
    pair listed, in :data:`PAIRS` order; other labels are left out."""
    drawn: dict[tuple[str, tuple[str, str]], int] = {}
    for label, count in counts.items():
        parsed = parse_pair_label(label)
        if parsed is not None:
            drawn[parsed] = drawn.get(parsed, 0) + count
    table = {}
    for pair in PAIRS:
        cells, never = {}, []
        for cell in pair.cells():
            text = f"{cell[0]}{CELL_JOIN}{cell[1]}"
            status, reason = pair.status(cell, budget)
            if status != ALLOWED:
                cells[text] = f"{status}: {reason}"
                continue
            cells[text] = drawn.get((pair.name, cell), 0)
            if not cells[text]:
                never.append(text)
        table[pair.name] = {"never drawn": never, "cells": cells}
    return table
