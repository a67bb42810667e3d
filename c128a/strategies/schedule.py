"""The pair schedule: rows of pair cells that steered steps aim for.

A covering schedule in the spirit of combinatorial testing (NIST ACTS,
Microsoft PICT): every allowed cell of every pair (:mod:`.pairs`) lies in a
row of :func:`schedule`, rows packing one cell of each pair where the
constraints allow (:func:`_consistent`). One step in
:data:`~c128a.strategies.engine.STEER_ONE_IN` takes a row; the row's buckets
become a :class:`Steer`, which each decision of
:func:`~c128a.strategies.engine.batches` consults (the token band, the
decode and prefill request counts, R and B, the model length, the width,
the buffer layout, padding, speculative decoding); every other decision is
drawn as before. A row only steers: a bucket a decision cannot reach for
the step's scale or configuration (a given ``max_model_len``, widths of
the policy only) is left to chance, and the reach tests count what was
drawn, never what was asked for.

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
``target()`` by the pair cells it drew first in that worker
(:mod:`c128a.runners.fuzz.worker`), which guides Hypothesis's search and
never what a choice sequence decodes to.

A step's scale (small or engine-scale, :mod:`.budget`) comes first, at the
budget's rate, and its row is taken among those its scale can reach: the
schedule never changes how many engine-scale steps a run builds.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

from .pairs import ALLOWED, ENGINE_ONLY, PAIRS


@dataclass(frozen=True)
class Steer:
    """The buckets a drawn step aims for: (dimension name, bucket) pairs."""

    wants: tuple[tuple[str, str], ...] = ()

    def get(self, dimension: str) -> str | None:
        return dict(self.wants).get(dimension)

    def __bool__(self) -> bool:
        return bool(self.wants)


NO_STEER = Steer()


def _needs_engine_scale(wants: dict[str, str]) -> bool:
    return any(bucket in ENGINE_ONLY.get(name, ()) for name, bucket in wants.items())


def _consistent(wants: dict[str, str]) -> bool:
    """Whether one step can be in every bucket of ``wants`` at once (the
    schedule's constraints, as PICT's): a step without tokens in nothing
    else; one token in one request, without padding or speculation; the mix
    against decode rows, prefill tokens and what needs decode rows; tokens
    against prefill tokens; requests and a block table against decode rows."""
    mix, rows = wants.get("decode/prefill mix"), wants.get("decode rows")
    prefill, tokens = wants.get("prefill tokens"), wants.get("tokens T")
    needs_decode = any(name in wants for name in (
        "requests", "block-table width M", "longest decode list against B", "speculative decode"))
    if tokens == "0" or mix == "no tokens" or (rows == "0" and prefill == "0"):
        return set(wants) <= {"tokens T", "decode/prefill mix"} or (
            set(wants) <= {"decode rows", "prefill tokens"})
    if tokens == "1" and (
            wants.get("requests") not in (None, "1")
            or wants.get("speculative decode") not in (None, "1 token a request")
            or wants.get("padding") not in (None, "none")):
        return False
    if (wants.get("padding") in ("inside", "tail and inside") and wants.get("requests") == "1"
            and wants.get("speculative decode") == "1 token a request"):
        return False  # padding inside needs a real token after it
    if wants.get("requests") == "1" and (
            mix == "decode + prefill" or (rows not in (None, "0") and prefill not in (None, "0"))):
        return False
    if mix == "decode only" and prefill not in (None, "0"):
        return False
    if mix == "prefill only" and (rows not in (None, "0") or needs_decode):
        return False
    if mix == "decode + prefill" and "0" in (rows, prefill):
        return False
    if rows == "0" and (mix not in (None, "prefill only") or needs_decode):
        return False
    if prefill == "0" and mix not in (None, "decode only"):
        return False
    if tokens == "65-1,024" and prefill == "above 1,024":
        return False
    if tokens == "above 8,192" and prefill not in (None, "above 1,024"):
        return False
    if tokens == "1,025-8,192" and prefill in ("0", "1-64", "65-1,024") and rows != "above 64":
        return False
    if wants.get("requests") in ("17-256", "257-512") and rows not in (None, "above 64"):
        return False
    if wants.get("block-table width M") == "above 256" and tokens == "above 8,192":
        return False  # 257 pages need a capacity the budget affords below ~1,800 tokens
    return True


def _conflicts(*names: str) -> frozenset:
    return frozenset(frozenset(pair) for pair in itertools.combinations(names, 2))


TOKENS_MIX, ROWS_PREFILL = "tokens T x decode/prefill mix", "decode rows x prefill tokens"
BLOCK_LIST, RATIO_POSITION = ("block size B x longest decode list against B",
                              "compress ratio R x position magnitude")
REQUESTS_TABLE, LAYOUT_WIDTH = ("requests x block-table width M",
                                "buffer layout x width against need")
CAPACITY_WIDTH = "capacity C x width W"

CONFLICTS = (
    _conflicts(TOKENS_MIX, ROWS_PREFILL, REQUESTS_TABLE)  # the request counts
    | _conflicts(RATIO_POSITION, CAPACITY_WIDTH, BLOCK_LIST, REQUESTS_TABLE)  # the model length
    | _conflicts(CAPACITY_WIDTH, LAYOUT_WIDTH, BLOCK_LIST, RATIO_POSITION)  # W against C
    | _conflicts(BLOCK_LIST, REQUESTS_TABLE, LAYOUT_WIDTH)  # the decode lists' lengths
)
"""Pairs whose cells a row does not combine: both steer one decision (named
beside each group), so one cell's bucket would undo the other's about as
often as not."""


@functools.lru_cache(maxsize=4)
def schedule(engine: bool) -> tuple[Steer, ...]:
    """Rows covering the allowed cells of every pair a step of this scale is
    for (a small step's: the cells without an engine-only bucket; an
    engine-scale step's: those with one), simplest first (by the buckets'
    order within their dimensions, then by pair), packed greedily: a row
    takes one cell of each pair where the constraints (:func:`_consistent`)
    allow and the pairs steer different decisions (:data:`CONFLICTS`), so a
    few steered draws cover many cells."""
    cells = []
    for order, pair in enumerate(PAIRS):
        pair_cells = pair.cells()
        first = {b: i for i, b in enumerate(dict.fromkeys(a for a, _ in pair_cells))}
        second = {b: i for i, b in enumerate(dict.fromkeys(b for _, b in pair_cells))}
        for a, b in pair_cells:
            if pair.status((a, b))[0] != ALLOWED:
                continue
            wants = {pair.first: a, pair.second: b}
            if _needs_engine_scale(wants) == engine:
                cells.append((first[a] + second[b], order, pair.name, wants))
    cells.sort(key=lambda cell: cell[:2])
    ordered = [(name, wants) for _, _, name, wants in cells]
    rows = []
    while ordered:
        name, row = ordered.pop(0)
        row, names = dict(row), {name}
        for name, wants in list(ordered):
            if (set(wants).isdisjoint(row) and _consistent({**row, **wants})
                    and not any(frozenset((name, other)) in CONFLICTS for other in names)):
                row.update(wants)
                names.add(name)
                ordered.remove((name, wants))
        # An engine-scale row without a block-table cell also aims for many elements.
        elements = ENGINE_ELEMENTS[len(rows) % len(ENGINE_ELEMENTS)]
        if engine and "block-table width M" not in row:
            row["elements T x W"] = elements
        rows.append(Steer(tuple(row.items())))
    return tuple(rows)


ENGINE_ELEMENTS = ("above 8,388,608", "1,048,577-8,388,608")
"""The elements T x W engine-scale rows aim for in turn, beside their cells
(a GPU's budget reaches above 8,388,608; the interpreter's stops below)."""
