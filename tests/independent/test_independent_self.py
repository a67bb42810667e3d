"""Hand-computed checks of the independent implementation, and proof that each
independent mutant is wrong on the input its description names."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import independent_c128a as impl  # noqa: E402
import independent_mutants  # noqa: E402

R = 128
B = 2
CANARY = -77


def make_buffers(rows: int, capacity: int):
    return (
        torch.full((rows, capacity), CANARY, dtype=torch.int32),
        torch.full((rows,), CANARY, dtype=torch.int32),
        torch.full((rows, capacity), CANARY, dtype=torch.int32),
    )


def run(target, positions, num_decode, requests, table, slots, width, capacity=256, rows=8):
    buffers = make_buffers(rows, capacity)
    views = target.build_c128a_topk_metadata(
        torch.tensor(positions, dtype=torch.int64),
        R,
        num_decode,
        torch.tensor(requests, dtype=torch.int32),
        table,
        B,
        torch.tensor(slots, dtype=torch.int64),
        *buffers,
        max_compressed_tokens=width,
    )
    return buffers, views


def expected_row(prefix, width):
    row = torch.full((width,), -1, dtype=torch.int32)
    row[: len(prefix)] = torch.tensor(prefix, dtype=torch.int32)
    return row


def table_of(*rows, width=8):
    table = torch.zeros((len(rows), width), dtype=torch.int32)
    for index, row in enumerate(rows):
        table[index, : len(row)] = torch.tensor(row, dtype=torch.int32)
    return table


def test_contract_example_decode_and_prefill():
    table = table_of([7, 9, 11])
    (gdb, dlb, pb), (decode, lens, prefill) = run(
        impl, [300, 1000], 1, [0, 0], table, [5, 6], width=128
    )
    assert torch.equal(decode[0], expected_row([14, 15], 128))
    assert lens.tolist() == [2]
    assert torch.equal(prefill[0], expected_row(list(range(7)), 128))
    assert decode.stride(0) == gdb.stride(0) == 256
    assert prefill.stride(0) == pb.stride(0) == 256
    assert decode.data_ptr() == gdb.data_ptr() and prefill.data_ptr() == pb.data_ptr()
    # nothing outside rows < T and columns < W changes
    assert torch.all(gdb[:, 128:] == CANARY) and torch.all(gdb[1:] == CANARY)
    assert torch.all(pb[:, 128:] == CANARY) and torch.all(pb[1:] == CANARY)
    assert torch.all(dlb[1:] == CANARY)


def test_count_boundaries():
    # n = floor((p + 1) / R): p = 126 -> 0, p = 127 -> 1, p = 255 -> 2, p = 256 -> 2
    _, (_, _, prefill) = run(impl, [126, 127, 255, 256], 0, [], table_of([0]), [0] * 4, 128)
    counts = (prefill >= 0).sum(dim=1).tolist()
    assert counts == [0, 1, 2, 2]


def test_count_clamped_to_width_and_padding_lens_zero():
    table = table_of(list(range(100, 164)), width=64)
    _, (decode, lens, _) = run(
        impl, [128 * 200, 128 * 200], 2, [0, 0], table, [3, -1], width=128
    )
    slots = [b * B + k for b in range(100, 164) for k in range(B)]
    assert torch.equal(decode[0], torch.tensor(slots, dtype=torch.int32))
    # the padding token's row keeps real slot ids; only its length is zeroed
    assert torch.equal(decode[1], decode[0])
    assert lens.tolist() == [128, 0]


def test_speculative_tokens_share_request_row_and_sliced_table():
    wide = torch.arange(40, dtype=torch.int32).reshape(2, 20)
    table = wide[:, :5]  # row stride 20, width 5
    _, (decode, lens, _) = run(
        impl, [200, 300, 500], 3, [1, 1, 0], table, [1, 2, 3], width=128
    )
    # request 1's first block id is 20 (row stride 20): slots 40, 41
    assert torch.equal(decode[0], expected_row([40], 128))
    assert torch.equal(decode[1], expected_row([40, 41], 128))
    assert torch.equal(decode[2], expected_row([0, 1, 2], 128))
    assert lens.tolist() == [1, 2, 3]


def test_empty_batch_and_long_slot_mapping():
    (gdb, dlb, pb), views = run(impl, [], 0, [], table_of([1]), [4, 5, 6], 128)
    assert [tuple(v.shape) for v in views] == [(0, 128), (0,), (0, 128)]
    assert torch.all(gdb == CANARY) and torch.all(dlb == CANARY) and torch.all(pb == CANARY)


@pytest.mark.parametrize(
    "width, capacity, rule",
    [(100, 256, "multiple of 128"), (0, 256, "positive"), (384, 256, "exceeds")],
)
def test_width_preconditions(width, capacity, rule):
    with pytest.raises(ValueError, match=rule):
        run(impl, [1], 0, [], table_of([1]), [0], width, capacity=capacity)


def test_buffer_stride_precondition():
    gdb = torch.zeros((256, 4), dtype=torch.int32).t()
    with pytest.raises(ValueError, match="global_decode_buffer.*stride 1"):
        impl.build_c128a_topk_metadata(
            torch.tensor([1]), R, 1, torch.tensor([0], dtype=torch.int32),
            table_of([1]), B, torch.tensor([0]), gdb,
            torch.zeros(4, dtype=torch.int32), torch.zeros((4, 256), dtype=torch.int32),
            max_compressed_tokens=128,
        )


@pytest.mark.parametrize(
    "max_model_len, capacity",
    [(1_048_576, 8192), (81_920, 640), (100_000, 896), (1000, 128)],
)
def test_capacity_width(max_model_len, capacity):
    assert impl.capacity_width(max_model_len, R) == capacity


@pytest.mark.parametrize(
    "max_seq_len, capacity, width",
    [(0, 8192, 128), (1000, 8192, 128), (32_768, 8192, 256), (16_385, 8192, 128),
     (76_800, 640, 640), (1_048_576, 8192, 8192), (1_048_700, 8192, 8192)],
)
def test_active_topk_width(max_seq_len, capacity, width):
    assert impl.active_topk_width(max_seq_len, R, capacity) == width


def test_active_topk_width_refuses_uncovered_length():
    with pytest.raises(ValueError, match="capacity"):
        impl.active_topk_width(1_048_576 + 128, R, 8192)


# -- every mutant is wrong on its named input -----------------------------------

def _kernel_outputs(target, *args, **kwargs):
    try:
        buffers, views = run(target, *args, **kwargs)
    except (ValueError, IndexError, RuntimeError) as error:
        return ("error", type(error).__name__)
    return (
        [b.tolist() for b in buffers],
        [v.tolist() for v in views],
        [v.stride() for v in views],
    )


KERNEL_CASES = {
    "packed_stride": ([300, 400, 1000], 2, [0, 1], table_of([7, 9], [3, 4]), [0, 1, 2], 128),
    "ceil_count": ([0], 0, [], table_of([1]), [0], 128),
    "count_one_ahead": ([126], 0, [], table_of([1]), [0], 128),
    "padding_lens_kept": ([300], 1, [0], table_of([7, 9]), [-1], 128),
    "padding_row_blanked": ([300], 1, [0], table_of([7, 9]), [-1], 128),
    "lens_unclamped": ([128 * 200], 1, [0], table_of(list(range(64)), width=64), [0], 128),
    "table_row_by_token": ([300, 301], 2, [0, 0], table_of([7, 9], [3, 4]), [0, 1], 128),
    "table_stride_assumed": (
        [300], 1, [1], torch.arange(40, dtype=torch.int32).reshape(2, 20)[:, :5], [0], 128
    ),
    "slot_without_block_scale": ([300], 1, [0], table_of([7, 9]), [0], 128),
    "spill_to_buffer_width": ([1000], 0, [], table_of([1]), [0], 128),
    "prefill_sentinel_zero": ([1000], 0, [], table_of([1]), [0], 128),
    "prefill_row_not_rebased": ([300, 1000], 1, [0], table_of([7, 9]), [0, 1], 128),
}

POLICY_CASES = {
    "policy_no_tile_floor": ("active_topk_width", (1000, R, 8192)),
    "policy_power_overshoots": ("active_topk_width", (32_768, R, 8192)),
    "policy_never_refuses": ("active_topk_width", (1_048_576 + 128, R, 8192)),
    "policy_rounded_up_count": ("active_topk_width", (16_385, R, 8192)),
    "capacity_floor": ("capacity_width", (100_000, R)),
}


def _call_policy(target, name, args):
    try:
        return getattr(target, name)(*args)
    except ValueError:
        return "refused"


def test_every_mutant_has_a_case_and_description():
    names = set(independent_mutants.MUTANTS)
    assert names == set(KERNEL_CASES) | set(POLICY_CASES)
    assert names == set(independent_mutants.DESCRIPTIONS)


@pytest.mark.parametrize("name", sorted(KERNEL_CASES))
def test_kernel_mutant_differs_on_its_case(name):
    case = KERNEL_CASES[name]
    mutant = independent_mutants.MUTANTS[name]
    assert _kernel_outputs(impl, *case) != _kernel_outputs(mutant, *case)


@pytest.mark.parametrize("name", sorted(POLICY_CASES))
def test_policy_mutant_differs_on_its_case(name):
    function, args = POLICY_CASES[name]
    mutant = independent_mutants.MUTANTS[name]
    assert _call_policy(impl, function, args) != _call_policy(mutant, function, args)
