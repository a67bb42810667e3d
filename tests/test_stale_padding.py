"""Padding tokens with stale, large positions (left in the engine's position
buffer by a longer request of an earlier step): the strategies reach them
under both padding-row variants, within the table's reach under ``slots``
(whose padding rows read the table) and past it under ``inert`` (whose rows
read nothing), the argument checks follow the variant, the step's
``max_seq_len`` is its requests', and a real token's row never changes."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from c128a.cases import contract_breach
from c128a.checks import PROPERTIES, check_step
from c128a.contract import INERT, SLOTS
from c128a.failures import BadArgument, InvariantViolation, TargetRaised
from c128a.step import build, oracle_build
from c128a.strategies import HISTORICAL_BATCHES, batches
from c128a.strategies.reach import buckets_of
from c128a.targets import PADDING_ROWS_ENV, load_target

STALE = HISTORICAL_BATCHES["stale_padding_past_its_request"]
STALE_BUCKET = ("padding position", "stale, past its request")
DRAWS = settings(max_examples=300, database=None, derandomize=True,
                 suppress_health_check=list(HealthCheck), deadline=None)


@pytest.fixture(autouse=True)
def _no_variant_from_the_environment(monkeypatch):
    monkeypatch.delenv(PADDING_ROWS_ENV, raising=False)


def _past_the_table(batch) -> list[int]:
    """Decode padding tokens whose list needs more table columns than there are."""
    return [
        t for t in range(batch.num_decode_tokens)
        if batch.slot_mapping[t] < 0
        and -(-min((batch.positions[t] + 1) // batch.compress_ratio, batch.capacity)
              // batch.block_size) > batch.table_width
    ]


def _moved_past_the_table(batch):
    """``batch`` with its first padding token's position past its table's reach."""
    positions = list(batch.positions)
    pad = next(t for t in range(batch.num_decode_tokens) if batch.slot_mapping[t] < 0)
    positions[pad] = batch.max_model_len - 1
    return dataclasses.replace(batch, positions=tuple(positions))


@pytest.mark.parametrize("variant", [SLOTS, INERT])
def test_strategies_reach_stale_padding_inside_the_contract_of_each_variant(variant):
    seen = {"stale": 0, "past the table": 0}

    @DRAWS
    @given(batches(load_target("reference", variant)))
    def draw(batch):
        if STALE_BUCKET in buckets_of(batch).items():
            seen["stale"] += 1
        if _past_the_table(batch):
            seen["past the table"] += 1
        assert contract_breach(batch, variant) is None

    draw()
    assert seen["stale"] >= 10, seen
    # Past the table only where the padding row reads none of it.
    assert (seen["past the table"] > 0) == (variant == INERT), seen


def test_the_historical_step_reads_its_requests_junk_columns_under_slots(c128a_device):
    # Padding row 2 attends to 22 entries (pages 0..10); its request owns 2 pages,
    # so pages 2..10 are the row's junk (-7): the slot ids there are -7 * B + j % B.
    assert STALE.slot_mapping[2:4] == (-1, -1)
    expected = oracle_build(STALE, c128a_device).buffers
    row = expected.global_decode[2, :22].tolist()
    assert row[4:22] == [-7 * 2 + j % 2 for j in range(4, 22)]
    assert int(expected.decode_lens[2]) == 0
    assert max(STALE.positions[2:]) // 128 > max(STALE.positions[:2]) // 128


def test_max_seq_len_is_the_requests_not_a_padding_tokens():
    assert STALE.max_seq_len == 20 * 128
    assert max(STALE.positions) + 1 == 22 * 128 + 101


def test_argument_checks_exempt_padding_rows_from_the_table_under_inert_only():
    moved = _moved_past_the_table(STALE)
    moved.validate(INERT)
    with pytest.raises(BadArgument, match=r"decode token 2 \(position 81919\) attends to"):
        moved.validate(SLOTS)
    # A real token past the table is refused under both.
    positions = list(STALE.positions)
    positions[0] = STALE.max_model_len - 1
    real = dataclasses.replace(STALE, positions=tuple(positions))
    for variant in (SLOTS, INERT):
        with pytest.raises(BadArgument, match=r"decode token 0 "):
            real.validate(variant)


@pytest.mark.parametrize("spec", ["reference-inert", "triton-inert"])
def test_inert_targets_take_padding_past_the_table(spec, c128a_device):
    moved = _moved_past_the_table(STALE)
    target = load_target(spec)
    check_step(target, moved, c128a_device)
    result = build(target, moved, c128a_device)
    assert torch.equal(result.buffers.global_decode[2, : moved.width],
                       torch.full((moved.width,), -1, dtype=torch.int32, device=c128a_device))


@pytest.mark.parametrize("spec", ["reference", "triton"])
def test_slots_targets_refuse_padding_past_the_table(spec, c128a_device):
    with pytest.raises(TargetRaised, match="BadArgument: decode token 2 .* block-table columns"):
        build(load_target(spec), _moved_past_the_table(STALE), c128a_device)


def test_negative_pages_mutant_fails_only_on_the_stale_step(c128a_device):
    mutant = load_target("c128a.mutants:negative_pages_as_sentinel")
    with pytest.raises(InvariantViolation, match=r"\[matches_oracle\] global_decode_buffer row 2"):
        PROPERTIES["matches_oracle"].replay(mutant, STALE, c128a_device)
    for name, batch in HISTORICAL_BATCHES.items():
        if name != "stale_padding_past_its_request":
            PROPERTIES["matches_oracle"].replay(mutant, batch, c128a_device)
