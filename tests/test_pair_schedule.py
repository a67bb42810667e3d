"""The covering array (c128a/strategies/schedule.py): every allowed cell of
every pair and triple lies in rows the constraint model allows, a row
steers a step into its buckets, a steer never changes what is drawn nor an
unsteered step, and the drawn step is a pure function of Hypothesis's
choices."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings

from c128a.checks import PROPERTIES
from c128a.strategies import batches, engine
from c128a.strategies.budget import CPU_BUDGET
from c128a.strategies.layout import LAYOUT_BYTES
from c128a.strategies.budget import GPU_BUDGET
from c128a.strategies.constraints import NOT_APPLICABLE, model
from c128a.strategies.pairs import BY_PAIR_NAME, INTERACTIONS, expected_cells, model_buckets
from c128a.strategies import schedule as _schedule_module
from c128a.strategies.schedule import COVERAGE, NO_STEER, Steer, covering_array, schedule

DRAWS = settings(max_examples=20, derandomize=True, database=None, phases=[Phase.generate],
                 suppress_health_check=list(HealthCheck))


def _drawn(strategy, draws=DRAWS) -> list:
    """The steps ``draws`` gives, less Hypothesis's first: the simplest
    example, all zeros, which no row steers (so that shrinking ends at the
    unsteered simplest step)."""
    seen = []

    @draws
    @given(strategy)
    def draw(batch):
        seen.append(batch)

    draw()
    return seen[1:]


@pytest.mark.parametrize("budget", [CPU_BUDGET, GPU_BUDGET], ids=["cpu", "cuda"])
@pytest.mark.parametrize("engine_scale", [False, True], ids=["small", "engine-scale"])
def test_every_allowed_cell_lies_in_rows_the_model_allows(budget, engine_scale):
    """Each cell a step of this scale must reach lies in COVERAGE rows, and
    each row is one step of every dimension the rules allow: the greedy
    array is a covering array, and the model's singleton propagation
    found no cell that no step has."""
    rows = covering_array(engine_scale, budget)
    the_model = model(budget)
    for row in rows:
        the_model.network.fix(list(the_model.network.full), {
            the_model.index(name): the_model.values[the_model.index(name)].index(bucket)
            for name, bucket in row.items()})
    for interaction in INTERACTIONS:
        for cell in expected_cells({}, budget, engine_scale)[interaction.name]:
            holding = sum(all(row[d] == b for d, b in zip(interaction.dimensions, cell))
                          for row in rows)
            assert holding >= COVERAGE, (interaction.name, cell, holding)


def test_the_array_is_the_same_every_time_and_steers_every_dimension_that_applies():
    rows = covering_array(False, CPU_BUDGET)
    assert covering_array(False, dataclasses.replace(CPU_BUDGET, engine_one_in=1)) is rows
    assert _schedule_module._greedy.__module__ == _schedule_module.__name__
    _schedule_module._covering_array.cache_clear()
    _schedule_module._schedule.cache_clear()
    assert covering_array(False, CPU_BUDGET) == rows
    steer = schedule(False, CPU_BUDGET)[0]
    assert dict(steer.wants) == {name: bucket for name, bucket in rows[0].items()
                                 if bucket != NOT_APPLICABLE and name not in ("step scale", "widths drawn")}


def test_zeros_give_the_engines_usual_step_unsteered():
    smallest = find(batches(budget=CPU_BUDGET), lambda batch: True,
                    settings=settings(database=None))
    assert smallest.num_tokens == 0 and smallest.max_model_len == 81_920
    assert (smallest.compress_ratio, smallest.block_size) == (128, 2)
    shape = bytearray(32)
    assert engine.schedule_row(bytes(shape), bytes(LAYOUT_BYTES), False) == NO_STEER
    shape[engine.GEOMETRY_PICK_AT] = 0b1  # whether R and B are drawn: no steer
    assert engine.schedule_row(bytes(shape), bytes(LAYOUT_BYTES), False) == NO_STEER
    shape[engine.GEOMETRY_PICK_AT] = 0b10  # the lowest steer bit
    assert engine.schedule_row(bytes(shape), bytes(LAYOUT_BYTES), False) in schedule(False)


def test_the_same_choices_give_the_same_steps():
    strategy = batches(budget=CPU_BUDGET)
    assert _drawn(strategy) == _drawn(strategy)


@pytest.mark.parametrize("name", ["matches_oracle", "history_independent", "consumers"])
def test_the_schedule_changes_no_draw_and_no_unsteered_step(monkeypatch, name):
    """With the schedule on and off, a property's derandomised draws are as
    many, and every step the schedule leaves unsteered is the same step:
    what CI ran before the schedule it runs still, beside the steered steps."""
    strategy = PROPERTIES[name].strategy(None, None, CPU_BUDGET)
    draws = settings(DRAWS, max_examples=150)
    choose, aimed = engine.schedule_row, []

    def recording(shape, layout, scale, budget=None):
        row = choose(shape, layout, scale, budget)
        aimed[-1] = aimed[-1] or bool(row)
        return row

    def drawn() -> list:
        seen = []
        aimed.append(False)

        @draws
        @given(strategy)
        def draw(batch):
            seen.append((batch, aimed[-1]))
            aimed.append(False)

        draw()
        return seen

    monkeypatch.setattr(engine, "schedule_row", recording)
    steered = drawn()
    monkeypatch.setattr(engine, "schedule_row", lambda *row_of: NO_STEER)
    unsteered = drawn()
    assert len(steered) == len(unsteered) == 150
    for (step, was_aimed), (before, _) in zip(steered, unsteered):
        assert was_aimed or step == before
    assert sum(was_aimed for _, was_aimed in steered) >= 60


@pytest.mark.parametrize("pair_name, cell, engine_scale", [
    ("capacity C x width W", ("not a power of two", "1,024-8,191"), False),
    ("buffer layout x width against need", ("one pool for both buffers", "C"), False),
    ("tokens T x decode/prefill mix", ("1", "prefill only"), False),
    ("tokens T x decode/prefill mix", ("above 8,192", "prefill only"), True),
    ("requests x block-table width M", ("257-512", "above 256"), True),
])
def test_a_row_steers_the_step_into_its_cell(monkeypatch, pair_name, cell, engine_scale):
    pair = BY_PAIR_NAME[pair_name]
    row = Steer(((pair.first, cell[0]), (pair.second, cell[1])))
    monkeypatch.setattr(engine, "schedule_row", lambda *row_of: row)
    budget = dataclasses.replace(CPU_BUDGET, engine_one_in=1) if engine_scale else None
    drawn = _drawn(batches(budget=budget))
    hits = sum(pair.cell_of(batch) == cell for batch in drawn)
    assert hits >= len(drawn) // 2, (pair_name, cell, hits, len(drawn))


def test_a_step_already_in_the_rows_cell_is_left_as_drawn(monkeypatch):
    pair = BY_PAIR_NAME["tokens T x decode/prefill mix"]
    monkeypatch.setattr(engine, "schedule_row", lambda *row_of: NO_STEER)
    unsteered = _drawn(batches(budget=CPU_BUDGET))
    cells = [pair.cell_of(batch) for batch in unsteered]
    cell = max(set(cells) - {None}, key=cells.count)
    row = Steer(((pair.first, cell[0]), (pair.second, cell[1])))
    monkeypatch.setattr(engine, "schedule_row", lambda *row_of: row)
    steered = _drawn(batches(budget=CPU_BUDGET))
    assert cells.count(cell) >= 3
    for before, after, was in zip(unsteered, steered, cells):
        assert after == before or was != cell
    assert any(after != before for after, before in zip(steered, unsteered))


def test_no_decision_reads_the_bits_the_row_is_read_from(monkeypatch):
    """The steer's bits of the shape's geometry byte change no unsteered
    step: they were free before the schedule, so reading the steer from
    them changed no draw."""
    monkeypatch.setattr(engine, "schedule_row", lambda *row_of: NO_STEER)
    seen = []
    original = engine._plan

    def flipped(shape, layout, steer, **options):
        shape, layout = bytearray(shape), bytearray(layout)
        shape[engine.GEOMETRY_PICK_AT] ^= 0b1111_1110
        return original(bytes(shape), bytes(layout), steer, **options)

    seen.append(_drawn(batches(budget=CPU_BUDGET)))
    monkeypatch.setattr(engine, "_plan", flipped)
    seen.append(_drawn(batches(budget=CPU_BUDGET)))
    assert seen[0] == seen[1]


@pytest.mark.parametrize("band", list(engine.ENGINE_BANDS))
def test_a_steered_engine_step_takes_its_bands_edges_one_time_in_two(band):
    low, high = engine.ENGINE_SCALES[engine.ENGINE_BANDS[band]]
    budget = dataclasses.replace(CPU_BUDGET, engine_one_in=1)
    high = budget.max_tokens if high is None else high
    small = engine._Scale(tokens=8, max_decode_requests=4, max_prefill_requests=4,
                          max_prefill_chunk=8)
    steer = Steer((("tokens T", band),))
    steered = {where: engine._scale(0, where, budget, small, steer).tokens
               for where in range(0, 0x10000, 0x101)}
    assert {steered[w] for w in steered if w % engine.BAND_EDGE_ONE_IN == 0} == {low, high}
    assert all(low <= tokens <= high for tokens in steered.values())
    unsteered = [engine._scale(0, where, budget, small, NO_STEER).tokens for where in steered]
    assert sum(t in (low, high) for t in unsteered) <= 2  # 0 and 0xFFFF give them anyway


def _realised(monkeypatch, strategy, rows, draws: int) -> dict[str, list[int]]:
    """Dimension -> [steps in the row's bucket, steps] of ``draws`` steps
    drawn with each of ``rows`` forced."""
    tally: dict[str, list[int]] = {}
    for row in rows:
        monkeypatch.setattr(engine, "schedule_row", lambda *row_of, row=row: row)
        for batch in _drawn(strategy, settings(DRAWS, max_examples=draws + 1)):
            buckets = model_buckets(batch, {})
            for dimension, bucket in row.wants:
                counts = tally.setdefault(dimension, [0, 0])
                counts[0] += buckets.get(dimension) == bucket
                counts[1] += 1
    return tally


@pytest.mark.parametrize("engine_scale", [False, True], ids=["small", "engine-scale"])
def test_a_steered_step_takes_its_rows_buckets(monkeypatch, engine_scale):
    """Steps drawn under a row fall in its bucket of nearly every dimension,
    the history's included (history_independent's steps, whose shape
    history is steered by the step's row): the steering realises the rows,
    so that their cells are drawn, not left to chance."""
    budget = dataclasses.replace(CPU_BUDGET, engine_one_in=1) if engine_scale else CPU_BUDGET
    strategy = PROPERTIES["history_independent"].strategy(None, None, budget)
    rows = schedule(engine_scale, CPU_BUDGET)[::12]
    tally = _realised(monkeypatch, strategy, rows, draws=4)
    met, asked = map(sum, zip(*tally.values()))
    weakest = sorted(tally.items(), key=lambda item: item[1][0] / item[1][1])[:5]
    assert met >= 0.9 * asked, (met, asked, weakest)
    for dimension in ("decode rows history", "prefill rows history", "layout history",
                      "geometry history", "width history"):
        assert tally[dimension][0] >= 0.75 * tally[dimension][1], (dimension, tally[dimension])
