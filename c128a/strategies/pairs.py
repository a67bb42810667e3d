"""Reach in combination: every pair of dimensions, and the triples a kernel
branches on at once, their cells, and where a step falls in each.

One dimension at a time (:mod:`.reach`) misses the faults two values make
together: a launch bucket by T beside a decode/prefill split, a fast path by
B that assumes lists shorter than a block, a staging scratch sized by
requests x table width, or any of the pairs nobody thought of (CONTRACT.md,
"Any of these in any combination"). An :class:`Interaction` is two
dimensions of the constraint model (:mod:`.constraints`: the reach
dimensions, its small derived ones and the history dimensions beside the
step's own) or three where a kernel branches on all three; every pair is
one (:data:`INTERACTIONS`). Each cell of an interaction is

- allowed: a correct builder must handle it, and a property whose ``reach``
  leaves none of its buckets out must draw it;
- forbidden by the contract (a step cannot be there: decode rows with mix
  "prefill only", W above C), with the reasons of the rules that say so; or
- beyond a size budget (the buffers' largest capacity, 8,192 columns; a
  device's elements, :mod:`.budget`), with the reasons.

Nothing is listed cell by cell: :func:`cell_status` asks the model.
``c128a fuzz`` counts the cells each example draws (``reach_pairs`` in its
JSON report), ``c128a reach`` lists the allowed cells a property never
drew, and the strategies aim for rows of a covering array over all of them
(:mod:`.schedule`) so that the ci profile's few examples reach them early.
The pairs a kernel is known to branch on keep their reason
(:data:`DECLARED_PAIRS`).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from ..step import Batch
from .constraints import (
    BUDGET,
    CONTRACT,
    DERIVED_FROM,
    ENGINE_SCALE,
    HIDDEN,
    MODEL_DIMENSIONS,
    ANY_WIDTH,
    SCALE,
    SMALL,
    WIDTHS,
    model,
    sizes_of,
)
from .reach import Dimension, Exclusions
from .solver import Contradiction

PAIR_PREFIX = "pair "
TRIPLE_PREFIX = "triple "
CELL_JOIN = " x "

ALLOWED = "allowed"
FORBIDDEN = CONTRACT
BEYOND_BUDGET = BUDGET

MODEL: Mapping[str, Dimension] = MappingProxyType({d.name: d for d in MODEL_DIMENSIONS})

DIMENSIONS: Mapping[str, Dimension] = MappingProxyType(
    {d.name: d for d in MODEL_DIMENSIONS if d.name not in HIDDEN})
"""Every dimension an interaction may name: the reach dimensions and the
derived ones (:data:`~.constraints.DERIVED`)."""

@dataclass(frozen=True)
class Interaction:
    """Two or three dimensions a step falls in together, and (for those a
    kernel is known to branch on) why they matter."""

    dimensions: tuple[str, ...]
    why: str = ""

    @property
    def name(self) -> str:
        return CELL_JOIN.join(self.dimensions)

    @property
    def first(self) -> str:
        return self.dimensions[0]

    @property
    def second(self) -> str:
        return self.dimensions[1]

    @property
    def prefix(self) -> str:
        return PAIR_PREFIX if len(self.dimensions) == 2 else TRIPLE_PREFIX

    def cells(self) -> tuple[tuple[str, ...], ...]:
        return tuple(itertools.product(*(DIMENSIONS[d].buckets for d in self.dimensions)))

    def cell_in(self, buckets: Mapping[str, str]) -> tuple[str, ...] | None:
        """The cell a step of ``buckets`` (dimension -> bucket) is in, None
        where a dimension says nothing of it."""
        cell = tuple(buckets.get(d) for d in self.dimensions)
        return None if None in cell else cell

    def cell_of(self, batch: Batch) -> tuple[str, ...] | None:
        return self.cell_in({d: DIMENSIONS[d].bucket_of(batch) for d in self.dimensions})

    def status(self, cell: tuple[str, ...], budget=None) -> tuple[str, str]:
        """(:data:`ALLOWED`, "") or (:data:`FORBIDDEN` or
        :data:`BEYOND_BUDGET`, the reasons) of ``cell`` under ``budget``."""
        return cell_status(budget).get((self.name, cell)) or model(budget).status(
            dict(zip(self.dimensions, cell)))

    def text(self, cell: tuple[str, ...]) -> str:
        return CELL_JOIN.join(cell)

    def label(self, cell: tuple[str, ...]) -> str:
        """The label of a cell: ``"pair A x B: a x b"``."""
        return f"{self.prefix}{self.name}: {self.text(cell)}"


DECLARED_PAIRS: tuple[Interaction, ...] = (
    Interaction(("tokens T", "decode/prefill mix"),
                "a launch bucket chosen by T beside the decode/prefill split"),
    Interaction(("decode rows", "prefill tokens"),
                "a grid split between decode rows and prefill rows (a long prefill with a "
                "few decode tokens)"),
    Interaction(("block size B", "longest decode list against B"),
                "a fast path by B that assumes every list fits in one block"),
    Interaction(("compress ratio R", "position magnitude"),
                "a division trick by R exact only for small positions"),
    Interaction(("requests", "block-table width M"),
                "a staging scratch sized by requests x table width"),
    Interaction(("buffer layout", "width against need"),
                "address arithmetic of a view beside the width actually written"),
    Interaction(("padding", "speculative decode"),
                "a padding rule applied per request rather than per token"),
    Interaction(("capacity C", "width W"),
                "a kernel variant chosen by W against buffers of capacity C"),
)
"""Pairs an implementation is known to branch on, with why (named as they
were before every pair was one)."""

TRIPLES: tuple[Interaction, ...] = (
    Interaction(("tokens T", "decode/prefill mix", "padding"),
                "a launch chosen by the token band and the decode/prefill split, whose "
                "masking of padding tokens differs by branch"),
    Interaction(("buffer layout", "buffer row alignment", "width against need"),
                "address arithmetic of a view whose vectorised stores assume aligned rows, "
                "beside the width actually written against C"),
)
"""Three dimensions a kernel branches on at once: every allowed cell of the
three is covered, not only of each two."""


def _all_pairs() -> tuple[Interaction, ...]:
    declared = {frozenset(p.dimensions) for p in DECLARED_PAIRS}
    rest = [Interaction((a, b)) for a, b in itertools.combinations(DIMENSIONS, 2)
            if frozenset((a, b)) not in declared]
    return (*DECLARED_PAIRS, *rest)


PAIRS: tuple[Interaction, ...] = _all_pairs()
"""Every pair of dimensions: the declared ones first, then the others in
the model's order."""

INTERACTIONS: tuple[Interaction, ...] = (*PAIRS, *TRIPLES)
"""Every interaction the suite proves it reaches, in report order."""

BY_PAIR_NAME: dict[str, Interaction] = {i.name: i for i in INTERACTIONS}

# ---------------------------------------------------------------- what a property leaves out

ENGINE_CELLS = "pair cells of engine-scale steps"
"""An :data:`~.reach.Exclusions` key: None leaves out every cell only an
engine-scale step reaches (a property that draws no engine-scale step
reaches those buckets only through the historical steps, one cell each)."""

IN_PAIRS = " (in pairs)"
"""An :data:`~.reach.Exclusions` key suffix: ``"dimension (in pairs)"``
names buckets a property's generated steps never draw although a
historical step does: its bucket is reached, its cells are not required."""


def pairs_leave_out(dimension: str, *buckets: str) -> Exclusions:
    """The exclusion of a property whose generated steps never draw
    ``buckets`` of ``dimension`` (its historical steps may)."""
    return {f"{dimension}{IN_PAIRS}": buckets}


SMALL_STEPS: Exclusions = MappingProxyType({ENGINE_CELLS: None})
"""What a property without engine-scale steps leaves out of its pairs."""

POLICY_WIDTHS_ONLY: Exclusions = MappingProxyType({WIDTHS: (ANY_WIDTH,)})
"""What a property drawing only the policy's widths keeps in its pairs: the
policy's width, C only where the policy gives C (it reaches other widths
only through the historical steps)."""

DECODE_ONLY_PAIRS: Exclusions = MappingProxyType(pairs_leave_out(
    "decode/prefill mix", "prefill only", "decode + prefill"))
"""What a property drawing decode-only steps leaves out of its pairs (a
prefill token comes only from a historical step)."""


def _left_out_whole(dimension: str, exclusions: Exclusions) -> bool:
    return exclusions.get(dimension, ()) is None or any(
        exclusions.get(base, ()) is None for base in DERIVED_FROM.get(dimension, ()))


def interactions_of(exclusions: Exclusions) -> tuple[Interaction, ...]:
    """The interactions a property reaches: those none of whose dimensions
    (nor the base dimensions a derived one reads) its ``reach`` leaves out
    whole, and not left out by name (``reach[name] = None``)."""
    return _interactions_of(_freeze(exclusions))


@functools.lru_cache(maxsize=64)
def _interactions_of(frozen: tuple) -> tuple[Interaction, ...]:
    exclusions = dict(frozen)
    return tuple(i for i in INTERACTIONS
                 if not any(_left_out_whole(d, exclusions) for d in i.dimensions)
                 and exclusions.get(i.name, ()) is not None)


pairs_of = interactions_of


def _kept(exclusions: Exclusions, scale: str | None) -> dict[str, tuple[str, ...]]:
    """Dimension -> the buckets a property's generated steps may draw."""
    kept = {}
    for name, dimension in DIMENSIONS.items():
        left = (exclusions.get(name, ()) or ()) + (exclusions.get(name + IN_PAIRS, ()) or ())
        if left and not _left_out_whole(name, exclusions):
            kept[name] = tuple(b for b in dimension.buckets if b not in left)
    if scale is not None:
        kept[SCALE] = (scale,)
    for name in HIDDEN:
        if exclusions.get(name):
            kept[name] = tuple(b for b in (kept.get(name) or MODEL[name].buckets)
                               if b not in exclusions[name])
    return kept


def _freeze(exclusions: Exclusions) -> tuple:
    return tuple(sorted((k, v) for k, v in exclusions.items()))


@functools.lru_cache(maxsize=128)
def _expected(frozen: tuple, budget, engine: bool) -> dict[str, tuple[tuple[str, ...], ...]]:
    exclusions = dict(frozen)
    found = {}
    if engine and ENGINE_CELLS in exclusions:
        return {i.name: () for i in interactions_of(exclusions)}
    within = _allowed(budget, _kept(exclusions, ENGINE_SCALE if engine else SMALL))
    small = _allowed(budget, _kept(exclusions, SMALL)) if engine else None
    for interaction in interactions_of(exclusions):
        cells = [cell for cell in interaction.cells() if within(interaction, cell)]
        if small is not None:
            cells = [cell for cell in cells if not small(interaction, cell)]
        found[interaction.name] = tuple(cells)
    return found


def expected_cells(exclusions: Exclusions, budget=None, engine: bool = False
                   ) -> dict[str, tuple[tuple[str, ...], ...]]:
    """Interaction name -> the allowed cells under ``budget`` a property with
    ``exclusions`` must draw: with ``engine`` False those a small step can
    be in, with True those only an engine-scale step can (none where the
    property draws no engine-scale step, :data:`ENGINE_CELLS`)."""
    return _expected(_freeze(exclusions), sizes_of(budget), engine)


def _allowed(budget, kept: Mapping[str, tuple[str, ...]]):
    """``allowed(interaction, cell)``: whether a step within ``kept`` can be
    in the cell. Pairs by singleton propagation: the value of one dimension
    fixed, the other's domain what the rules leave (equal to propagating
    from the pair itself for this model, ``tests/test_reach.py``); triples
    by propagating from the cell."""
    the_model = model(budget)
    try:
        domains = the_model.restricted(kept)
    except Contradiction:
        return lambda interaction, cell: False
    single = _singletons(the_model, domains)

    def allowed(interaction, cell) -> bool:
        if len(cell) == 2:
            (i, k), (j, l) = ((the_model.index(d), the_model.values[the_model.index(d)].index(b))
                              for d, b in zip(interaction.dimensions, cell))
            fixed, other = single.get((i, k)), single.get((j, l))
            return (fixed is not None and other is not None
                    and bool(fixed[j] >> l & 1) and bool(other[i] >> k & 1))
        return the_model.allows(dict(zip(interaction.dimensions, cell)), domains)

    return allowed


def _singletons(the_model, domains) -> dict[tuple[int, int], list[int] | None]:
    """(dimension, value) -> the domains propagation leaves with it fixed
    (None: none)."""
    found = {}
    for i, values in enumerate(the_model.values):
        for k in range(len(values)):
            if not domains[i] >> k & 1:
                continue
            try:
                found[i, k] = the_model.network.fix(list(domains), {i: k})
            except Contradiction:
                found[i, k] = None
    return found


def cell_status(budget=None) -> dict[tuple[str, tuple[str, ...]], tuple[str, str]]:
    """(interaction name, cell) -> (status, reasons) of every cell under
    ``budget``: allowed as :func:`expected_cells` finds it for a property
    that leaves nothing out, the others with the model's reasons."""
    return _cell_status(sizes_of(budget))


@functools.lru_cache(maxsize=8)
def _cell_status(budget) -> dict[tuple[str, tuple[str, ...]], tuple[str, str]]:
    allowed = _allowed(budget, {})
    statuses = {}
    the_model = model(budget)
    for interaction in INTERACTIONS:
        for cell in interaction.cells():
            if allowed(interaction, cell):
                statuses[interaction.name, cell] = (ALLOWED, "")
            else:
                statuses[interaction.name, cell] = the_model.status(
                    dict(zip(interaction.dimensions, cell)))
    return statuses


# ---------------------------------------------------------------- where a step falls


def model_buckets(batch: Batch, exclusions: Exclusions) -> dict[str, str]:
    """Dimension name -> bucket of every dimension of the model ``batch``
    says something about (those ``exclusions`` leave out whole left out)."""
    found = {}
    for name, dimension in DIMENSIONS.items():
        if _left_out_whole(name, exclusions):
            continue
        bucket = dimension.bucket_of(batch)
        if bucket is not None:
            found[name] = bucket
    return found


def cells_of(batch: Batch, exclusions: Exclusions) -> dict[str, tuple[str, ...]]:
    """Interaction name -> the cell ``batch`` falls in, for the interactions
    ``exclusions`` keeps."""
    buckets = model_buckets(batch, exclusions)
    found = {}
    for interaction in interactions_of(exclusions):
        cell = interaction.cell_in(buckets)
        if cell is not None:
            found[interaction.name] = cell
    return found


def pair_labels_of(batch: Batch, exclusions: Exclusions) -> tuple[str, ...]:
    """:func:`cells_of` as labels, one an interaction."""
    return tuple(BY_PAIR_NAME[name].label(cell) for name, cell in cells_of(batch, exclusions).items())


@functools.lru_cache(maxsize=1)
def _labels() -> dict[str, tuple[str, tuple[str, ...]]]:
    return {interaction.label(cell): (interaction.name, cell)
            for interaction in INTERACTIONS for cell in interaction.cells()}


def parse_pair_label(label: str) -> tuple[str, tuple[str, ...]] | None:
    """(interaction name, cell) of a pair or triple label, None for any other text."""
    return _labels().get(label)


def pair_table(counts: Mapping[str, int], budget=None) -> dict[str, dict]:
    """Label counts as interaction name -> {"never drawn": [cells],
    "cells": {"a x b": examples or the reason it is left out}}, every cell
    of every interaction listed, in :data:`INTERACTIONS` order; other labels
    are left out."""
    drawn: dict[tuple[str, tuple[str, ...]], int] = {}
    for label, count in counts.items():
        parsed = parse_pair_label(label)
        if parsed is not None:
            drawn[parsed] = drawn.get(parsed, 0) + count
    statuses = cell_status(budget)
    table = {}
    for interaction in INTERACTIONS:
        cells, never = {}, []
        for cell in interaction.cells():
            text = interaction.text(cell)
            status, reason = statuses[interaction.name, cell]
            if status != ALLOWED:
                cells[text] = f"{status}: {reason}"
                continue
            cells[text] = drawn.get((interaction.name, cell), 0)
            if not cells[text]:
                never.append(text)
        table[interaction.name] = {"never drawn": never, "cells": cells}
    return table
