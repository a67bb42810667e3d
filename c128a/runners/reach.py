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

from hypothesis import settings as Settings
from rich.table import Table

from ..checks import Property
from ..checks.profiles import CI_PROFILE, register_profiles
from ..strategies.budget import size_budget
from ..strategies.pairs import (
    BY_PAIR_NAME,
    PAIRS,
    cells_of,
    expected_cells,
    is_engine_cell,
    pair_table,
)
from ..strategies.reach import DIMENSIONS, beyond_budget, buckets_of, expected

README_START = "<!-- reach:start -->"
README_END = "<!-- reach:end -->"
README_PAIRS_START = "<!-- reach-pairs:start -->"
README_PAIRS_END = "<!-- reach-pairs:end -->"

REACH_EXAMPLES = 1_000
"""Draws each property's strategy gets to reach every bucket and every
allowed pair cell of small steps: cheap (nothing is built). One step in two
aims for one of the schedule's 59 small rows, each cell lying in one row,
so fewer draws leave a rare cell to chance."""
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
    """The buckets and pair cells ``prop``'s strategy draws under
    ``settings`` with ``device``'s size budget (a name: no device is
    touched; ``budget`` replaces it), the historical steps included.
    Nothing is built."""
    counts: Reach = Counter()

    def record(target, batch, device) -> None:
        for name, bucket in buckets_of(batch, prop.reach).items():
            counts[name, bucket] += 1
        for name, cell in cells_of(batch, prop.reach).items():
            counts[name, cell] += 1

    dataclasses.replace(prop, check=record).test(target, device, settings=settings,
                                                 budget=budget)()
    return counts


ENGINE_PAIR_EXAMPLES = 300
"""Draws of engine-scale steps only in which each property must reach every
engine-scale pair cell. An engine-scale step is one in 8, so the reach
draws hold too few of them for the schedule's 22 engine-scale rows to come
up a few times each; 300 engine-scale draws are enough (200 left a cell of
one property undrawn), and cost no build."""


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
) -> list[tuple[str, tuple[str, str]]]:
    """(pair name, cell) of the allowed cells ``prop`` should reach under
    ``device``'s budget (cells with a bucket its ``reach`` leaves out, and
    those the contract forbids or the budget cannot afford, left out) but
    ``counts`` lacks; with ``engine`` True or False only the engine-scale
    cells (:func:`~c128a.strategies.pairs.is_engine_cell`) or the others."""
    return [
        (name, cell)
        for name, cells in expected_cells(prop.reach, size_budget(device)).items()
        for cell in cells
        if not counts[name, cell]
        and (engine is None or is_engine_cell(BY_PAIR_NAME[name], cell) == engine)
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


def missing_pairs_text(missing: Mapping[tuple[str, str], list], draws: str) -> str:
    """One line per allowed pair cell a property never drew: property, pair, cell."""
    return "\n".join(
        f"{name}: pair {pair}: cell {cell[0]!r} x {cell[1]!r} never drawn in {draws} "
        f"({device} budget)"
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


def markdown_pairs(properties: Mapping[str, Property], devices=BUDGET_DEVICES) -> str:
    """Every pair with its allowed cells drawn by the ci profile's draws of
    all properties (drawn / allowed under each device's budget), the cells
    never drawn, and the cells left out with the reason."""
    drawn = {device: ci_profile_reach(properties, device) for device in devices}
    header = "| pair | " + " | ".join(
        f"cells drawn, ci profile, {device} budget" for device in devices
    ) + " | never drawn (cpu budget) | left out |"
    lines = [header, "|---|" + "---:|" * len(devices) + "---|---|"]
    tables = {device: pair_table({}, size_budget(device)) for device in devices}
    for pair in PAIRS:
        cells, left_out = [], []
        missing = []
        for device in devices:
            table = tables[device][pair.name]["cells"]
            allowed = [cell for cell in pair.cells()
                       if isinstance(table[f"{cell[0]} x {cell[1]}"], int)]
            got = [cell for cell in allowed if drawn[device][pair.name, cell]]
            cells.append(f"{len(got)} / {len(allowed)}")
            if device == devices[0]:
                missing = [f"{a} x {b}" for a, b in allowed if (a, b) not in got]
                left_out = [f"{text} ({reason})" for text, reason in table.items()
                            if not isinstance(reason, int)]
        lines.append(f"| {pair.name} | " + " | ".join(cells) + " | "
                     + ("; ".join(missing) or "-") + " | " + ("; ".join(left_out) or "-") + " |")
    return "\n".join(lines)


def pair_rows(pairs: Mapping[str, Mapping], title: str = "reach in pairs") -> Table:
    """A compact table of the pairs (``pairs`` as
    :func:`~c128a.strategies.pairs.pair_table` gives): first the allowed
    cells no example drew (red), then the counts of those drawn."""
    table = Table(title=title, title_justify="left")
    table.add_column("pair")
    table.add_column("never drawn")
    table.add_column("cell: examples")
    for name, entry in pairs.items():
        counts = [f"{cell}: {n}" for cell, n in entry["cells"].items()
                  if isinstance(n, int) and n]
        never = " · ".join(entry["never drawn"])
        table.add_row(name, f"[red]{never}[/red]" if never else "-", " · ".join(counts))
    return table
