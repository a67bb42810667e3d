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
from ..strategies.reach import DIMENSIONS, beyond_budget, buckets_of, expected

README_START = "<!-- reach:start -->"
README_END = "<!-- reach:end -->"

REACH_EXAMPLES = 600
"""Draws each property's strategy gets to reach every bucket: cheap (nothing
is built), and each rare bucket is drawn several times in it."""
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
"""(dimension, bucket) -> examples that drew it."""


def drawn_reach(prop: Property, device, settings, target=None) -> Reach:
    """The buckets ``prop``'s strategy draws under ``settings`` with
    ``device``'s size budget (a name: no device is touched), the
    historical steps included. Nothing is built."""
    counts: Reach = Counter()

    def record(target, batch, device) -> None:
        for name, bucket in buckets_of(batch, prop.reach).items():
            counts[name, bucket] += 1

    dataclasses.replace(prop, check=record).test(target, device, settings=settings)()
    return counts


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
