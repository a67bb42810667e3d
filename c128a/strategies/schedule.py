"""The covering array: rows of buckets that steered steps aim for.

A strength-2 covering array as NIST ACTS and Microsoft PICT build one, with
strength 3 where a kernel branches on three dimensions at once
(:data:`~.pairs.TRIPLES`): every allowed cell of every interaction
(:mod:`.pairs`) lies in some row of :func:`covering_array`, and every row
is one step the constraint model (:mod:`.constraints`) allows, a bucket for
every dimension. The rows are built greedily, as AETG and PICT build them:
a row starts from the interaction with the most cells not yet covered, and
each other dimension takes the bucket that covers the most cells not yet
covered beside the buckets already chosen, among those the rules leave
(:meth:`~.solver.Network.complete`). The array is a pure function of the
model: deterministic, built once per process at first use.

A step whose geometry byte has a steer bit set (about two in three; zeros,
where shrinking ends, never) takes a row
(:func:`~c128a.strategies.engine.schedule_row`); the row becomes a
:class:`Steer`, which each decision of
:func:`~c128a.strategies.engine.batches` consults (the token band, the
decode and prefill request counts, R and B, the model length, the width,
the buffer layout, padding, speculative decoding, the block table, the
width and shape of the step built before); each picks a value inside the
row's bucket where its step allows, and keeps the drawn one where that is
already in it. A bucket a decision cannot reach for the step's scale or
configuration (a given ``max_model_len``, widths of the policy only) is
left to chance: the reach tests count what was drawn, never what was asked
for. Boundary values inside each bucket come from the decisions' own edges
((p + 1) % R in {0, 1}, powers of two and one past, a band's first and last
token count).

Why the row is read from bytes already drawn. The value Hypothesis
generates must stay a pure function of its choice sequence: shrinking,
``@reproduce_failure`` blobs and the example database replay choices, and
a mapping that consulted mutable state ("cells not yet drawn") would turn a
replayed failure into a different step, which Hypothesis reports as Flaky.
And a choice of its own would change every draw after it, so every
derandomised example the suite runs in CI, and with them the kills the
mutants prove, would change with the schedule. So the row is read from bits
of the shape that no decision reads
(:func:`~c128a.strategies.engine.schedule_row`), and a steer never changes
how many bytes are drawn: an unsteered step is the step the bytes gave
before the schedule existed. Steering toward cells not yet drawn lives
where it cannot change the mapping: ``c128a fuzz`` scores each example with
``target()`` by the cells it drew first in that worker
(:mod:`c128a.runners.fuzz.worker`), which guides Hypothesis's search and
never what a choice sequence decodes to.

A step's scale (small or engine-scale, :mod:`.budget`) comes first, at the
budget's rate, and its row is taken among those of its scale: the small
rows cover the cells a small step can be in, the engine-scale rows those
only an engine-scale step can; the schedule never changes how many
engine-scale steps a run builds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..failures import HarnessError
from .constraints import (
    ANY_WIDTH,
    ENGINE_SCALE,
    HIDDEN,
    NOT_APPLICABLE,
    SCALE,
    SMALL,
    WIDTHS,
    model,
    sizes_of,
)
from .pairs import INTERACTIONS, expected_cells
from .solver import Contradiction, bits


@dataclass(frozen=True)
class Steer:
    """The buckets a drawn step aims for: (dimension name, bucket) pairs."""

    wants: tuple[tuple[str, str], ...] = ()

    def get(self, dimension: str) -> str | None:
        for name, bucket in self.wants:
            if name == dimension:
                return bucket
        return None

    def __bool__(self) -> bool:
        return bool(self.wants)


NO_STEER = Steer()


def covering_array(engine: bool, budget=None) -> tuple[dict[str, str], ...]:
    """The rows (dimension -> bucket, :data:`~.constraints.NOT_APPLICABLE`
    where a dimension does not apply) covering every allowed cell of every
    interaction a step of this scale is for under ``budget`` (a small
    step's: the cells a small step can be in; an engine-scale step's: those
    only it can)."""
    return _covering_array(engine, sizes_of(budget))


@functools.lru_cache(maxsize=8)
def _covering_array(engine: bool, budget) -> tuple[dict[str, str], ...]:
    the_model = model(budget)
    targets: dict[tuple[int, ...], set[tuple[int, ...]]] = {}
    for interaction in INTERACTIONS:
        scope = tuple(the_model.index(d) for d in interaction.dimensions)
        cells = expected_cells({}, budget, engine)[interaction.name]
        targets[scope] = {tuple(the_model.values[v].index(b) for v, b in zip(scope, cell))
                          for cell in cells}
    try:
        domains = the_model.restricted({SCALE: (ENGINE_SCALE if engine else SMALL,),
                                        WIDTHS: (ANY_WIDTH,)})
    except Contradiction:
        return ()
    rows = _greedy(the_model.network, domains, targets)
    return tuple({name: values[value] for name, values, value in
                  zip(the_model.names, the_model.values, row)} for row in rows)


COVERAGE = 6
"""Rows each allowed cell lies in, each another combination of the other
dimensions: a row is one step of every bucket it names only as far as the
steering can realise them all at once (a decision that cannot meet one
bucket beside another leaves one to chance), so a cell gets a second row
whose other buckets differ."""


def _greedy(network, domains, targets, coverage: int = COVERAGE) -> list[list[int]]:
    """Rows of one value a variable covering every cell of ``targets``
    (scope -> value tuples) ``coverage`` times, AETG's way: each row seeded
    with the first cell still wanted of the scope with the most left, every
    other variable given the value that covers the most cells still wanted
    beside those already chosen, the rules kept."""
    wanted = {scope: dict.fromkeys(cells, coverage) for scope, cells in targets.items() if cells}
    involving: dict[int, list[tuple[int, ...]]] = {}
    for scope in wanted:
        for v in scope:
            involving.setdefault(v, []).append(scope)
    order = sorted(range(len(domains)),
                   key=lambda v: (-sum(len(wanted[s]) for s in involving.get(v, ())), v))

    def choose(v: int, current: list[int]) -> list[int]:
        def gain(value: int) -> int:
            count = 0
            for scope in involving.get(v, ()):
                left = wanted.get(scope)
                if not left:
                    continue
                cell = []
                for u in scope:
                    if u == v:
                        cell.append(value)
                    elif current[u] & (current[u] - 1) == 0:
                        cell.append(current[u].bit_length() - 1)
                    else:
                        break
                else:
                    count += left.get(tuple(cell), 0)
            return count
        return sorted(bits(current[v]), key=lambda value: (-gain(value), value))

    rows = []
    while wanted:
        seed_scope = max(wanted, key=lambda s: (sum(wanted[s].values()), -s[0]))
        seed = max(wanted[seed_scope], key=lambda cell: (wanted[seed_scope][cell], [-v for v in cell]))
        try:
            start = network.fix(domains, dict(zip(seed_scope, seed)))
            row = network.complete(start, order, choose)
        except Contradiction:
            row = None
        if row is None:
            raise HarnessError(f"the constraint model allows cell {seed} of variables "
                               f"{seed_scope} but no step has it: a rule is missing")
        values = [mask.bit_length() - 1 for mask in row]
        for scope in list(wanted):
            cell = tuple(values[v] for v in scope)
            if cell in wanted[scope]:
                wanted[scope][cell] -= 1
                if not wanted[scope][cell]:
                    del wanted[scope][cell]
            if not wanted[scope]:
                del wanted[scope]
        rows.append(values)
    return rows


def schedule(engine: bool, budget=None) -> tuple[Steer, ...]:
    """The rows of :func:`covering_array` as steers (the dimensions that
    apply, the step's scale left out: it is decided first)."""
    return _schedule(engine, sizes_of(budget))


@functools.lru_cache(maxsize=8)
def _schedule(engine: bool, budget) -> tuple[Steer, ...]:
    return tuple(
        Steer(tuple((name, bucket) for name, bucket in row.items()
                    if name not in HIDDEN and bucket != NOT_APPLICABLE))
        for row in covering_array(engine, budget)
    )
