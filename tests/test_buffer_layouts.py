"""Persistent buffers placed as an engine's workspace places them: views at
a storage offset, rows further apart than their columns, one pool for all
three. The layout is part of the step (:class:`~c128a.step.BufferLayout`),
so a saved case rebuilds it exactly; the checks watch the whole allocation."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from c128a import cases
from c128a.checks import check_step, check_untouched_memory
from c128a.failures import CaseError, InvariantViolation
from c128a.mutants import MUTANTS
from c128a.step import (
    POISON,
    Batch,
    BufferLayout,
    Buffers,
    PermutedBlockTable,
    build,
    page_modulus,
)
from c128a.strategies import HISTORICAL_BATCHES
from c128a.targets import load_target

STEP = HISTORICAL_BATCHES["block_index_past_zero"]  # decode and prefill rows, W = 128 < C
LAYOUTS = {
    "offset view": BufferLayout(offset=12),
    "row stride above C": BufferLayout(row_padding=37),
    "one pool": BufferLayout(pooled=True),
    "pool, offset and row stride": BufferLayout(offset=8, row_padding=130, pooled=True),
}


def placed(batch: Batch, layout: BufferLayout) -> Batch:
    return dataclasses.replace(batch, buffer_offset=layout.offset,
                               buffer_row_padding=layout.row_padding,
                               buffer_pooled=layout.pooled)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_buffers_are_views_of_their_allocation_as_the_layout_says(name):
    layout = LAYOUTS[name]
    buffers = Buffers.for_batch(placed(STEP, layout), "cpu")
    decode, lens, prefill = buffers.as_tuple()
    assert decode.shape == (STEP.buffer_rows, STEP.capacity)
    assert decode.stride() == (STEP.capacity + layout.row_padding, 1)
    assert prefill.stride() == (STEP.capacity + STEP.prefill_extra_columns + layout.row_padding, 1)
    assert len(buffers.memory) == (1 if layout.pooled else 3)
    if not layout.pooled:
        assert decode.storage_offset() == lens.storage_offset() == layout.offset
    # Disjoint: each element of the memory belongs to at most one buffer.
    owner = [torch.zeros(m.numel(), dtype=torch.int32) for m in buffers.memory]
    for buffer in buffers.as_tuple():
        index = next(i for i, m in enumerate(buffers.memory)
                     if m.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr())
        owner[index].as_strided(buffer.shape, buffer.stride(), buffer.storage_offset()).add_(1)
    assert max(int(o.max()) for o in owner) == 1
    # Gaps hold the poison too: a write there is seen.
    assert all(bool((m == POISON).all()) for m in buffers.memory)


def test_the_default_layout_is_three_contiguous_allocations():
    buffers = Buffers.for_batch(STEP, "cpu")
    assert all(b.is_contiguous() and b.storage_offset() == 0 for b in buffers.as_tuple())
    assert buffers.memory == buffers.as_tuple()


@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.parametrize("spec", ["reference", "triton"])
def test_a_correct_target_passes_every_one_build_check_in_every_layout(spec, name, c128a_device):
    check_step(load_target(spec), placed(STEP, LAYOUTS[name]), c128a_device)


def test_a_write_into_a_row_gap_is_named_as_the_gap():
    target = MUTANTS["fills_row_stride_gap"].target
    batch = placed(STEP, LAYOUTS["row stride above C"])
    result = build(target, batch, "cpu")
    with pytest.raises(InvariantViolation, match=r"\[untouched_memory\] the gap after "
                       r"global_decode_buffer row 0 \(element 640 of its row stride 677"):
        check_untouched_memory(target, result, Buffers.for_batch(batch, "cpu"))


def test_a_write_before_a_buffer_is_named_outside_every_buffer():
    target = MUTANTS["ignores_storage_offset"].target
    batch = placed(STEP, LAYOUTS["offset view"])
    result = build(target, batch, "cpu")
    with pytest.raises(InvariantViolation, match="outside every buffer"):
        check_untouched_memory(target, result, Buffers.for_batch(batch, "cpu"))


def test_a_saved_case_of_a_pooled_step_replays_with_its_layout(tmp_path):
    layout = LAYOUTS["pool, offset and row stride"]
    batch = placed(STEP, layout)
    spec = MUTANTS["ignores_storage_offset"].spec
    case = cases.new_case(property="untouched_memory", target=spec, kind="failure",
                          failure="[untouched_memory] ...", batch=batch, device="cpu", seed=1)
    path, _ = cases.write_case(case, tmp_path)
    loaded = cases.load_case(path)
    assert loaded.batch == batch and loaded.batch.buffer_layout == layout
    data = json.loads(path.read_text())["batch"]
    assert (data["buffer_offset"], data["buffer_row_padding"], data["buffer_pooled"]) == (
        8, 130, True)
    still = cases.replay_case(loaded, load_target(spec), "cpu")
    assert not still.passed and "untouched_memory" in still.report
    assert cases.replay_case(loaded, load_target("reference"), "cpu").passed


def test_a_case_written_before_layouts_reads_as_fresh_buffers(tmp_path):
    data = HISTORICAL_BATCHES["no_prefill"].to_json()
    for name in ("buffer_offset", "buffer_row_padding", "buffer_pooled", "prior_width"):
        del data[name]
    data["block_table"] = [list(row) for row in HISTORICAL_BATCHES["no_prefill"].block_table]
    batch = Batch.from_json(data)
    assert batch.buffer_layout == BufferLayout() and batch.prior_width == 0


def test_a_permuted_table_is_saved_as_its_description_and_read_back():
    table = PermutedBlockTable(pages_needed=(3, 0, 5), width=7, scale=11, offset=4, junk=-9,
                               prime=page_modulus(2))
    batch = dataclasses.replace(HISTORICAL_BATCHES["no_prefill"], block_table=table)
    data = batch.to_json()
    assert data["block_table"]["pages_needed"] == [3, 0, 5]
    assert Batch.from_json(json.loads(json.dumps(data))) == batch
    data["block_table"]["prime"] = 4  # 8 pages cannot be unique modulo 4
    with pytest.raises(CaseError, match="block_table"):
        Batch.from_json(data)


@pytest.mark.parametrize("block_size", [1, 2, 2_147, 2_148, 8_192, 65_536])
def test_page_numbers_keep_every_slot_id_in_int32(block_size):
    prime = page_modulus(block_size, 500)
    assert (prime - 1) * block_size + block_size - 1 <= 2**31 - 1
    assert prime >= 500
