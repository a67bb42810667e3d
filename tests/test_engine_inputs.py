"""Inputs as an engine hands them: slices of persistent tensors, left as
they were by every build; engine-shaped values; geometry past the engine's
caps; a freed workspace's addresses reused at another geometry."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from c128a.checks import PROPERTIES
from c128a.checks.prior_content import check_history_independent
from c128a.checks.prior_shape import earlier_buffers
from c128a.contract import BuildArgs, returned_views
from c128a.failures import ContractViolation, InvariantViolation
from c128a.step import Batch, Buffers, InputPlacement, PermutedBlockTable, PriorStep, build
from c128a.step.inputs import INPUT_CANARY
from c128a.strategies import HISTORICAL_BATCHES, engine_batch
from c128a.strategies.engine_inputs import (
    ENGINE_INPUT_BYTES,
    EngineInputs,
    decode_inputs,
    engine_slot,
)
from c128a.strategies.reach import buckets_of
from c128a.targets import load_target
from c128a.contract import contract_builder, write_metadata

TWO_AND_TWO = HISTORICAL_BATCHES["upstream_two_decode_two_prefill"]
PLACED = dataclasses.replace(
    TWO_AND_TWO,
    inputs=InputPlacement(positions=3, token_to_req_indices=4, slot_mapping=2, block_table=5),
)


def _before(tensor: torch.Tensor, count: int) -> torch.Tensor:
    """The ``count`` elements of ``tensor``'s storage right before it."""
    return tensor.as_strided((count,), (1,), tensor.storage_offset() - count)


def test_each_input_is_a_slice_of_its_persistent_tensor_at_its_placement():
    tensors = PLACED.tensors("cpu")
    expected = {"positions": (3, 8, False), "token_to_req_indices": (4, 4, True),
                "slot_mapping": (2, 8, True), "block_table": (5, 4, False)}
    for name, (offset, size, aligned) in expected.items():
        tensor = getattr(tensors, name)
        assert (tensor.data_ptr() % 16 == 0) == aligned, name
        assert PLACED.inputs.aligned(name) == aligned, name
        assert torch.equal(_before(tensor, offset),
                           torch.full((offset,), INPUT_CANARY, dtype=tensor.dtype)), name
    assert tensors.positions.tolist() == list(PLACED.positions)
    assert tensors.slot_mapping.tolist() == list(PLACED.slot_mapping)
    assert [tuple(row) for row in tensors.block_table.tolist()] == list(PLACED.block_table)
    buckets = buckets_of(PLACED)
    assert buckets["positions placement"] == "offset, not 16-byte aligned"
    assert buckets["slot_mapping placement"] == "offset, 16-byte aligned"
    assert buckets_of(TWO_AND_TWO)["block table placement"] == "offset 0"


def test_placement_is_saved_and_a_case_without_it_replays_at_offset_0():
    assert "inputs" not in TWO_AND_TWO.to_json()  # cases and seeds as before
    data = json.loads(json.dumps(PLACED.to_json()))
    assert data["inputs"]["block_table"] == 5
    assert Batch.from_json(data) == PLACED
    del data["inputs"]
    old = Batch.from_json(data)
    assert old.inputs == InputPlacement() and old.tensors("cpu").positions.data_ptr() % 16 == 0


@pytest.mark.parametrize("name, shown", [
    ("writes_positions", "positions[0] changed from 38399 to 300"),
    ("writes_slot_mapping", "slot_mapping["),
    ("writes_token_to_req_indices", "token_to_req_indices[2] changed from 2 to 1; 2 input"),
    ("writes_block_table", "block_table[0, "),
])
def test_a_build_that_writes_an_input_fails_naming_the_input_index_and_values(name, shown):
    batch = HISTORICAL_BATCHES["padding_slot_minus_two"] if name == "writes_slot_mapping" else PLACED
    with pytest.raises(InvariantViolation, match="inputs_unchanged") as raised:
        build(load_target(f"c128a.mutants:{name}"), batch, "cpu")
    assert shown in raised.value.detail and "changed" in raised.value.detail
    # The same build of a correct target leaves the inputs alone.
    build(load_target("reference"), batch, "cpu")


def _writes_before_positions(args: BuildArgs):
    write_metadata(args)
    _before(args.positions, 1).fill_(7)  # the element before its slice
    return returned_views(args)


def test_a_write_around_a_sliced_input_is_named_too():
    target = dataclasses.make_dataclass("T", [])()
    target.build_c128a_topk_metadata = contract_builder(_writes_before_positions)
    with pytest.raises(InvariantViolation) as raised:
        build(target, PLACED, "cpu")
    assert ("element 2 of the persistent positions tensor, before the step's slice (which "
            f"starts at its element 3) changed from {INPUT_CANARY} to 7") in raised.value.detail


def test_the_replay_harness_and_the_serving_loop_check_the_inputs():
    from c128a.replay import ReplayHarness, build_machine

    writer = load_target("c128a.mutants:writes_positions")
    with pytest.raises(InvariantViolation, match="inputs_unchanged"):
        ReplayHarness(writer, "cpu", max_model_len=16_384, kv_slots=4_096, capture_limit=2)
    machine = build_machine(writer, "cpu", max_model_len=16_384)
    with pytest.raises(InvariantViolation, match="inputs_unchanged"):
        run_state_machine_as_test(machine, settings=settings(max_examples=3, database=None,
                                                             deadline=None))


def test_shared_leading_pages_and_the_null_block():
    table = PermutedBlockTable(pages_needed=(3, 2, 4), width=5, shared=2, scale=7, offset=0)
    rows = [tuple(row) for row in table.array().tolist()]
    assert rows == list(table)
    assert rows[0][:2] == rows[1][:2] == rows[2][:2] and rows[0][0] == 0  # page 0 leads
    assert len({p for row, need in zip(rows, (3, 2, 4)) for p in row[:need]}) == 5
    assert table.unique_pages == 5
    assert "shared" not in dataclasses.replace(table, shared=0).to_json()
    batch = dataclasses.replace(TWO_AND_TWO, block_table=PermutedBlockTable(
        pages_needed=(150, 100), width=151, shared=2, offset=0))
    assert buckets_of(batch)["shared pages"] == "the null block 0, shared"
    assert buckets_of(dataclasses.replace(batch, block_table=dataclasses.replace(
        batch.block_table, offset=11)))["shared pages"] == "shared leading pages"
    assert buckets_of(TWO_AND_TWO)["shared pages"] == "unique pages"


def test_engine_slot_ids_are_pages_unrelated_to_positions():
    below = [engine_slot(12345, 1, p, False) for p in (0, 1, 255, 256)]
    assert below[1] == below[0] + 1 and below[2] == below[0] + 255  # one page
    assert below[3] != below[0] + 256 and max(below) < 2**31
    assert min(engine_slot(seed, 3, 70_000, True) for seed in range(50)) >= 2**31
    assert decode_inputs(bytes(ENGINE_INPUT_BYTES), beyond_allowed=True) == EngineInputs()
    past = dataclasses.replace(TWO_AND_TWO, slot_mapping=tuple(
        engine_slot(9, r, p, True) for r, p in zip(TWO_AND_TWO.token_to_req_indices,
                                                    TWO_AND_TWO.positions)))
    assert buckets_of(past)["slot ids"] == "a page's slot, 2^31 and above"
    assert buckets_of(TWO_AND_TWO)["slot ids"] == "the token's position"


def test_a_narrower_prefill_buffer_builds_right():
    narrower = dataclasses.replace(
        HISTORICAL_BATCHES["upstream_rebuilt_at_128"], prefill_extra_columns=-7_936)
    assert buckets_of(narrower)["buffer widths"] == "decode wider" and narrower.widest_width == 256
    for name in ("matches_oracle", "adaptive_equals_full", "untouched_memory"):
        PROPERTIES[name].replay(load_target("reference"), narrower, "cpu")
    with pytest.raises(ContractViolation):  # the mutant that refuses it
        PROPERTIES["matches_oracle"].replay(
            load_target("c128a.mutants:prefill_buffer_at_least_as_wide"), narrower, "cpu")


PAST_THE_CAPS = engine_batch([(2**21, 1), (2**20 + 300, 2)], [(2**21 - 5, 1)],
                             max_model_len=2**21)
"""Capacity 16,384, W = 16,384, positions past 2^20."""


def test_a_step_past_the_engines_caps_builds_right():
    buckets = buckets_of(PAST_THE_CAPS)
    assert PAST_THE_CAPS.capacity == PAST_THE_CAPS.width == 16_384
    assert buckets["capacity past 8,192"] == "above 8,192"
    assert buckets["first scheduled position"] == "1,048,576 and more"
    assert Batch.from_json(json.loads(json.dumps(PAST_THE_CAPS.to_json()))) == PAST_THE_CAPS
    PROPERTIES["matches_oracle"].replay(load_target("reference"), PAST_THE_CAPS, "cpu")
    for name in ("columns_up_to_8192", "first_position_in_20_bits"):
        with pytest.raises(InvariantViolation):
            PROPERTIES["matches_oracle"].replay(load_target(f"c128a.mutants:{name}"),
                                                PAST_THE_CAPS, "cpu")


def test_an_earlier_step_at_the_same_addresses_with_another_row_stride():
    batch = dataclasses.replace(
        HISTORICAL_BATCHES["block_index_past_zero"], buffer_rows=12,
        prior=PriorStep(2, 3, 128, 2, columns=256), prior_width=256)
    buffers = Buffers.for_batch(batch, "cpu")
    earlier = earlier_buffers(buffers, batch.prior)
    assert earlier.global_decode.data_ptr() == buffers.global_decode.data_ptr()
    assert earlier.global_decode.stride() == (256, 1) and buffers.global_decode.stride() == (640, 1)
    assert earlier.global_decode.shape == (12 * 640 // 256, 256)
    assert buckets_of(batch, {})["address reuse"] == "another row stride at the same address"
    assert Batch.from_json(json.loads(json.dumps(batch.to_json()))) == batch
    keeper = load_target("c128a.mutants:row_stride_kept_per_address")
    same_geometry = dataclasses.replace(batch, prior=dataclasses.replace(batch.prior, columns=0))
    check_history_independent(keeper, same_geometry, "cpu")  # as before address reuse
    with pytest.raises(InvariantViolation, match="history_independent"):
        check_history_independent(keeper, batch, "cpu")


def test_a_case_records_placement_and_values_and_replays_them(tmp_path):
    from c128a import cases

    batch = dataclasses.replace(PLACED, slot_mapping=tuple(
        engine_slot(5, r, p, True) for r, p in zip(PLACED.token_to_req_indices, PLACED.positions)),
        block_table=PermutedBlockTable(pages_needed=(150, 100), width=151, shared=3))
    case = cases.new_case(property="matches_oracle", target="c128a.mutants:slot_ids_as_int32",
                          kind="failure", failure="lens 0 for a real slot past 2^31",
                          batch=batch)
    path, _ = cases.write_case(case, tmp_path)
    saved = json.loads(path.read_text())["batch"]
    assert saved["inputs"]["positions"] == 3 and saved["block_table"]["shared"] == 3
    loaded = cases.load_case(path)
    assert loaded.batch == batch and loaded.batch.inputs == batch.inputs
    assert not cases.replay_case(loaded, load_target("c128a.mutants:slot_ids_as_int32"),
                                 "cpu").passed
    assert cases.replay_case(loaded, load_target("reference"), "cpu").passed
