"""Where the properties' strategies reach in the input space: the reach
counterpart of the kill matrix.

:func:`drawn_reach` runs each property's own Hypothesis test
(:meth:`~c128a.checks.Property.test`, so the same draws as pytest and
``c128a fuzz`` make at the same settings) with a check that builds nothing
and only records each step's buckets (:mod:`c128a.strategies.reach`);
:func:`unreached` lists the buckets a property's strategy should draw and did
not; :func:`property_reach` does both for every property (``c128a reach``,
``tests/test_reach.py``). ``c128a fuzz`` shows its own counts as
:func:`reach_rows` and writes them as
:func:`~c128a.strategies.reach.reach_table`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Mapping

import numpy as np
from hypothesis import settings as Settings
from rich.table import Table

from ..checks import Property
from ..checks.profiles import CI_PROFILE, register_profiles
from ..strategies.budget import size_budget
from ..strategies.pairs import (
    ALLOWED,
    BY_PAIR_NAME,
    DECLARED_PAIRS,
    DIMENSIONS as PAIR_DIMENSIONS,
    INTERACTIONS,
    TRIPLES,
    cell_status,
    expected_cells,
    interactions_of,
    model_buckets,
)
from ..strategies.schedule import schedule
from ..strategies.reach import DIMENSIONS, beyond_budget, expected

README_START = "<!-- reach:start -->"
README_END = "<!-- reach:end -->"
README_PAIRS_START = "<!-- reach-pairs:start -->"
README_PAIRS_END = "<!-- reach-pairs:end -->"

REACH_EXAMPLES = 1_000
"""Draws each property's strategy gets to reach every bucket and every
allowed cell of small steps: cheap (nothing is built). About two steps
in three aim for a row of the covering array's small rows; fewer draws
leave a cell that few rows hold to chance."""
MAX_REACH_EXAMPLES = 100_000
"""The most draws ``c128a reach --examples`` takes per property and budget."""

BUDGET_DEVICES = ("cpu", "cuda")
"""The devices whose size budgets the reach is proven for (by name: nothing
runs on them)."""


def ci_settings(max_examples: int | None = None) -> Settings:
    """The ci profile (derandomised: the draws CI makes), with ``max_examples``."""
    register_profiles()
    profile = Settings.get_profile(CI_PROFILE)
    return Settings(profile, max_examples=max_examples or profile.max_examples)

Reach = Counter
"""(dimension, bucket) -> examples that drew it, and (pair name, cell) ->
examples that drew that cell of the pair (:mod:`c128a.strategies.pairs`)."""


def drawn_reach(prop: Property, device, settings, target=None, budget=None) -> Reach:
    """The buckets and the cells of the pairs and triples ``prop``'s strategy
    draws under ``settings`` with ``device``'s size budget (a name: no device
    is touched; ``budget`` replaces it), the historical steps included.
    Nothing is built."""
    drawn: list[dict[str, str]] = []

    def record(target, batch, device) -> None:
        drawn.append(model_buckets(batch, prop.reach))

    dataclasses.replace(prop, check=record).test(target, device, settings=settings,
                                                 budget=budget)()
    return count_reach(drawn, prop.reach)


def count_reach(drawn: list[Mapping[str, str]], exclusions) -> Reach:
    """(dimension, bucket) and (interaction name, cell) -> the steps of
    ``drawn`` (each dimension -> bucket) there: the buckets of the reach
    dimensions ``exclusions`` keeps, the cells of its interactions (counted
    column by column: thousands of cells over a thousand steps)."""
    counts: Reach = Counter()
    reach_names = {d.name for d in DIMENSIONS if exclusions.get(d.name, ()) is not None}
    for buckets in drawn:
        for name, bucket in buckets.items():
            if name in reach_names:
                counts[name, bucket] += 1
    if not drawn:
        return counts
    names = list(PAIR_DIMENSIONS)
    codes = np.full((len(drawn), len(names)), -1, dtype=np.int64)
    for column, name in enumerate(names):
        index = {bucket: i for i, bucket in enumerate(PAIR_DIMENSIONS[name].buckets)}
        codes[:, column] = [index.get(buckets.get(name), -1) for buckets in drawn]
    column_of = {name: i for i, name in enumerate(names)}
    for interaction in interactions_of(exclusions):
        columns = [column_of[d] for d in interaction.dimensions]
        part = codes[:, columns]
        part = part[(part >= 0).all(axis=1)]
        if not len(part):
            continue
        cells, numbers = np.unique(part, axis=0, return_counts=True)
        for cell, number in zip(cells, numbers):
            key = tuple(PAIR_DIMENSIONS[d].buckets[i] for d, i in zip(interaction.dimensions, cell))
            counts[interaction.name, key] += int(number)
    return counts


ENGINE_PAIR_EXAMPLES = 600
"""Draws of engine-scale steps only in which each property must reach every
cell only an engine-scale step can be in. An engine-scale step is one in
8, so the reach draws hold too few of them for the covering array's
engine-scale rows to come up a few times each; these cost no build."""


LEAST_CELL_SHARE = 0.99
"""The share of its allowed cells of every pair and triple each property's
reach draws must draw (1,000 draws, and the engine-scale draws for the
cells only engine-scale steps reach). The buckets, and the cells the
contract forbids (never drawn), are held exactly; the cells are not yet:
0.2 to 0.85% of a property's cells stay undrawn in its reach draws under
either budget, where the steering does not realise a row's every bucket
at once and no other row of the cell's six is drawn (most of them beside
a block size whose float32 reciprocal floors a column's page wrong, or
an engine-scale step past 8,192 tokens). Every such cell is named when
the share falls below this one."""


def engine_budget(device):
    """``device``'s size budget with every step engine-scale."""
    return dataclasses.replace(size_budget(device), engine_one_in=1)


def drawn_engine_reach(prop: Property, device, examples: int = ENGINE_PAIR_EXAMPLES) -> Reach:
    """:func:`drawn_reach` of ``examples`` engine-scale steps only."""
    return drawn_reach(prop, device, ci_settings(examples), budget=engine_budget(device))


def unreached(prop: Property, counts: Reach, device) -> list[tuple[str, str]]:
    """(dimension, bucket) pairs ``prop`` should reach on ``device`` (its
    exclusions and the device's size budget left out) but ``counts`` lacks."""
    left_out = beyond_budget(size_budget(device))
    return [
        (name, bucket)
        for name, buckets in expected(prop.reach).items()
        for bucket in buckets
        if bucket not in left_out.get(name, ()) and not counts[name, bucket]
    ]


def unreached_pairs(
    prop: Property, counts: Reach, device, engine: bool | None = None,
) -> list[tuple[str, tuple[str, ...]]]:
    """(interaction name, cell) of the allowed cells ``prop`` should reach
    under ``device``'s budget (cells with a bucket its ``reach`` leaves out,
    and those the contract forbids or the budget cannot afford, left out)
    but ``counts`` lacks; with ``engine`` True or False only the cells only
    an engine-scale step can be in, or those a small step can."""
    budget = size_budget(device)
    return [
        (name, cell)
        for scale in ((False, True) if engine is None else (engine,))
        for name, cells in expected_cells(prop.reach, budget, scale).items()
        for cell in cells
        if not counts[name, cell]
    ]


def property_pair_reach(
    properties: Mapping[str, Property], devices=BUDGET_DEVICES, examples: int = REACH_EXAMPLES,
) -> dict[tuple[str, str], tuple[list, list]]:
    """(property, device) -> (buckets missed, pair cells missed): the
    buckets and the pair cells of small steps in ``examples`` derandomised
    draws (one draw serves both), the engine-scale pair cells in
    :data:`ENGINE_PAIR_EXAMPLES` draws of engine-scale steps."""
    found = {}
    for name, prop in properties.items():
        for device in devices:
            counts = drawn_reach(prop, device, ci_settings(examples))
            engine = drawn_engine_reach(prop, device)
            found[name, device] = (
                unreached(prop, counts, device),
                unreached_pairs(prop, counts, device, engine=False)
                + unreached_pairs(prop, engine, device, engine=True),
            )
    return found


def property_reach(
    properties: Mapping[str, Property], devices=BUDGET_DEVICES, examples: int = REACH_EXAMPLES,
) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(property, device) -> the buckets its strategy misses in ``examples``
    derandomised draws under ``device``'s budget (empty: it reaches them all)."""
    return {
        (name, device): unreached(prop, drawn_reach(prop, device, ci_settings(examples)), device)
        for name, prop in properties.items()
        for device in devices
    }


def ci_profile_reach(properties: Mapping[str, Property], device) -> Reach:
    """The buckets the ci profile's draws of every property reach together:
    what a CI run of the properties shows (the historical steps included)."""
    drawn: Reach = Counter()
    for prop in properties.values():
        drawn += drawn_reach(prop, device, ci_settings())
    return drawn


def missing_text(missing: Mapping[tuple[str, str], list[tuple[str, str]]], draws: str) -> str:
    """One line per bucket a property never drew: property, dimension, bucket."""
    return "\n".join(
        f"{name}: {dimension}: bucket {bucket!r} never drawn in {draws} ({device} budget)"
        for (name, device), buckets in missing.items()
        for dimension, bucket in buckets
    )


def cell_text(name: str, cell: tuple[str, ...]) -> str:
    """``"pair A x B: cell 'a' x 'b'"`` (or a triple's)."""
    kind = "pair" if len(cell) == 2 else "triple"
    return f"{kind} {name}: cell " + " x ".join(repr(bucket) for bucket in cell)


def missing_pairs_text(missing: Mapping[tuple[str, str], list], draws: str) -> str:
    """One line per allowed cell a property never drew: property, the
    dimensions, the cell."""
    return "\n".join(
        f"{name}: {cell_text(pair, cell)} never drawn in {draws} ({device} budget)"
        for (name, device), cells in missing.items()
        for pair, cell in cells
    )


def markdown_reach(properties: Mapping[str, Property], devices=BUDGET_DEVICES) -> str:
    """Every dimension and bucket with the examples the ci profile's draws of
    all properties put there, under each device's budget ("-" for a bucket
    the budget keeps out of reach)."""
    drawn = {device: ci_profile_reach(properties, device) for device in devices}
    header = "| dimension | bucket | " + " | ".join(
        f"ci profile, {device} budget" for device in devices) + " |"
    lines = [header, "|---|---|" + "---:|" * len(devices)]
    for dimension in DIMENSIONS:
        for bucket in dimension.buckets:
            cells = []
            for device in devices:
                out = bucket in beyond_budget(size_budget(device)).get(dimension.name, ())
                cells.append("-" if out else str(drawn[device][dimension.name, bucket]))
            lines.append(f"| {dimension.name} | {bucket} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def reach_rows(reach: Mapping[str, Mapping[str, int]], title: str = "reach") -> Table:
    """A table of every dimension, its buckets and how many examples drew
    each (``reach``: dimension -> bucket -> examples, as
    :func:`~c128a.strategies.reach.reach_table` gives); a bucket no example
    drew shows 0 in red."""
    table = Table(title=title, title_justify="left")
    table.add_column("dimension")
    table.add_column("bucket: examples")
    for dimension in DIMENSIONS:
        counts = reach.get(dimension.name, {})
        cells = [
            f"[red]{bucket}: 0[/red]" if not count else f"{bucket}: {count}"
            for bucket, count in ((b, counts.get(b, 0)) for b in dimension.buckets)
        ]
        table.add_row(dimension.name, " · ".join(cells))
    return table


def _allowed(device) -> list[tuple[str, tuple[str, ...]]]:
    """(interaction name, cell) of every allowed cell under ``device``'s budget."""
    statuses = cell_status(size_budget(device))
    return [key for key, (status, _) in statuses.items() if status == ALLOWED]


def coverage(drawn: Reach, device) -> tuple[int, int, list[tuple[str, tuple[str, ...]]]]:
    """(cells drawn, cells allowed, those never drawn) of every interaction
    under ``device``'s budget."""
    allowed = _allowed(device)
    missed = [key for key in allowed if not drawn[key]]
    return len(allowed) - len(missed), len(allowed), missed


def markdown_pairs(properties: Mapping[str, Property], devices=BUDGET_DEVICES) -> str:
    """The interactions summed up: how many, their cells allowed, forbidden
    by the contract and beyond each budget, the covering array's rows, and
    what the ci profile's draws of all properties reach (cells drawn /
    allowed), by dimension, the declared pairs and triples named with the
    cells never drawn (``c128a reach --ci`` lists every one)."""
    drawn = {device: ci_profile_reach(properties, device) for device in devices}
    statuses = {device: cell_status(size_budget(device)) for device in devices}
    pairs = [i for i in INTERACTIONS if len(i.dimensions) == 2]
    lines = [
        "| | " + " | ".join(f"{device} budget" for device in devices) + " |",
        "|---|" + "---:|" * len(devices),
        f"| pairs of dimensions, triples | " + " | ".join(
            f"{len(pairs)}, {len(TRIPLES)}" for _ in devices) + " |",
    ]
    for label, status in (("cells allowed", ALLOWED),
                          ("cells forbidden by the contract", "forbidden by the contract"),
                          ("cells beyond the size budget", "beyond the size budget")):
        lines.append(f"| {label} | " + " | ".join(
            f"{sum(s == status for s, _ in statuses[d].values()):,}" for d in devices) + " |")
    lines.append("| covering array rows (small steps, engine-scale steps) | " + " | ".join(
        f"{len(schedule(False, size_budget(d)))}, {len(schedule(True, size_budget(d)))}"
        for d in devices) + " |")
    covered = {device: coverage(drawn[device], device) for device in devices}
    lines.append("| cells the ci profile draws (all properties) | " + " | ".join(
        f"{got:,} / {allowed:,}" for got, allowed, _ in covered.values()) + " |")
    lines += ["", "| dimension | cells drawn, ci profile, " + ", ".join(
        f"{device} budget" for device in devices) + " | never drawn (cpu budget), by the other "
        "dimension |", "|---|---:|---|"]
    missed_cpu = covered[devices[0]][2]
    for dimension in PAIR_DIMENSIONS:
        cells = []
        for device in devices:
            mine = [k for k in _allowed(device) if dimension in BY_PAIR_NAME[k[0]].dimensions]
            got = sum(1 for k in mine if drawn[device][k])
            cells.append(f"{got} / {len(mine)}")
        others: dict[str, int] = {}
        for name, _ in missed_cpu:
            dims = BY_PAIR_NAME[name].dimensions
            if dimension in dims:
                for other in dims:
                    if other != dimension:
                        others[other] = others.get(other, 0) + 1
        shown = "; ".join(f"{other} {n}" for other, n in others.items()) or "-"
        lines.append(f"| {dimension} | {', '.join(cells)} | {shown} |")
    lines += ["", "| declared interaction | cells drawn, ci profile, " + ", ".join(
        f"{device} budget" for device in devices) + " | never drawn (cpu budget) |",
        "|---|---:|---|"]
    for interaction in (*DECLARED_PAIRS, *TRIPLES):
        cells, never = [], []
        for device in devices:
            allowed = [c for c in interaction.cells()
                       if statuses[device][interaction.name, c][0] == ALLOWED]
            got = [c for c in allowed if drawn[device][interaction.name, c]]
            cells.append(f"{len(got)} / {len(allowed)}")
            if device == devices[0]:
                never = [interaction.text(c) for c in allowed if c not in got]
        lines.append(f"| {interaction.name} | {', '.join(cells)} | {'; '.join(never) or '-'} |")
    return "\n".join(lines)


def left_out_lines(device) -> list[str]:
    """Every cell left out under ``device``'s budget, with the reasons."""
    return [f"{name}: {BY_PAIR_NAME[name].text(cell)}: {status} ({device} budget): {reason}"
            for (name, cell), (status, reason) in cell_status(size_budget(device)).items()
            if status != ALLOWED]


def pair_rows(pairs: Mapping[str, Mapping], title: str = "reach in pairs") -> Table:
    """A compact table of the interactions (``pairs`` as
    :func:`~c128a.strategies.pairs.pair_table` gives): per dimension, the
    allowed cells drawn of those with it, then the cells no example drew
    (red; the first few, then how many more)."""
    table = Table(title=title, title_justify="left")
    table.add_column("dimension")
    table.add_column("cells drawn")
    table.add_column("never drawn")
    per: dict[str, list[int]] = {}
    never: dict[str, list[str]] = {}
    for name, entry in pairs.items():
        interaction = BY_PAIR_NAME.get(name)
        if interaction is None:
            continue
        for cell, count in entry["cells"].items():
            if not isinstance(count, int):
                continue
            for dimension in interaction.dimensions:
                tally = per.setdefault(dimension, [0, 0])
                tally[0] += bool(count)
                tally[1] += 1
                if not count:
                    never.setdefault(dimension, []).append(f"{name}: {cell}")
    for dimension, (got, allowed) in per.items():
        missed = never.get(dimension, [])
        shown = " · ".join(missed[:MISSES_SHOWN])
        if len(missed) > MISSES_SHOWN:
            shown += f" · and {len(missed) - MISSES_SHOWN} more"
        table.add_row(dimension, f"{got} / {allowed}", f"[red]{shown}[/red]" if shown else "-")
    return table


MISSES_SHOWN = 3
"""Cells never drawn a dimension's row of :func:`pair_rows` names."""
