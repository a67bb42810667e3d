"""The checks read a build back to the host once and compare there; the bad
input check compares the buffers once, after every case; worker processes
share the host's cores."""

from __future__ import annotations

import warnings

import pytest
import torch

from c128a.checks import check_matches_oracle, check_padding, check_untouched_memory
from c128a.checks.bad_input import check_rejects_bad_input
from c128a.contract import check_build_arguments, contract_builder, write_metadata
from c128a.failures import InvariantViolation
from c128a.plugin.pytest_plugin import share_xdist_cores
from c128a.gpu import pinning
from c128a.step import Buffers, build
from c128a.step.buffers import results_on_host, to_host
from c128a.strategies import HISTORICAL_BATCHES
from c128a.targets import Target, load_target

STEP = HISTORICAL_BATCHES["speculative_decode_8_tokens"]


def test_host_tensors_come_back_as_they_are_unless_a_copy_is_asked_for():
    tensor = torch.arange(4)
    meta = torch.empty(3, device="meta")
    same, copied, still_meta, value = to_host([tensor, tensor, meta, 5], copy=False)
    assert same is tensor and copied is tensor and still_meta is meta and value == 5
    (copy,) = to_host([tensor], copy=True)
    assert copy is not tensor and torch.equal(copy, tensor)


def test_a_result_on_the_host_is_itself(c128a_device):
    if c128a_device.type != "cpu":
        pytest.skip("on a GPU the result is copied (test_a_check_reads_a_build_back_once)")
    result = build(load_target("reference"), STEP, c128a_device)
    assert result.on_host() is result
    assert results_on_host(result, result) == [result, result]


@pytest.mark.cuda
def test_a_check_reads_a_build_back_once(c128a_device):
    target = load_target("triton")
    result = build(target, STEP, c128a_device)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # the mode's own notice is caught here too
        torch.cuda.set_sync_debug_mode("warn")
        try:
            check_matches_oracle(target, result)
            check_padding(target, result)
            check_untouched_memory(target, result, Buffers.for_batch(STEP, "cpu"))
        finally:
            torch.cuda.set_sync_debug_mode(0)
    waits = [w for w in caught if "called a synchronizing CUDA operation" in str(w.message)]
    assert len(waits) == 1, [str(w.message) for w in waits]
    host = result.on_host()
    assert host.buffers.global_decode.device.type == "cpu"
    result.buffers.global_decode.fill_(5)  # the copy is the state it was read at
    assert torch.equal(host.buffers.global_decode, result.on_host().buffers.global_decode)
    assert not torch.equal(host.buffers.global_decode, result.buffers.global_decode.cpu())


def _writes_then_refuses(first_call_only: bool) -> Target:
    """A target that writes the decode buffer before checking its arguments
    (on every call, or on the first only)."""
    calls = []

    def build_metadata(args):
        if not first_call_only or not calls:
            args.global_decode_buffer[0, 0] = 7
        calls.append(args)
        check_build_arguments(args)
        return write_metadata(args)

    return Target("writes-then-refuses", contract_builder(build_metadata))


def test_a_write_before_the_refusal_names_the_first_case_that_wrote(c128a_device):
    with pytest.raises(InvariantViolation) as caught:
        check_rejects_bad_input(_writes_then_refuses(False), STEP, c128a_device)
    assert "[rejects_bad_input] width_not_multiple_of_128: raised, but first wrote a buffer" in str(
        caught.value
    )
    assert "changed from -99 to 7" in str(caught.value)


def test_a_write_that_does_not_come_back_on_the_rerun_is_still_a_kill(c128a_device):
    with pytest.raises(InvariantViolation) as caught:
        check_rejects_bad_input(_writes_then_refuses(True), STEP, c128a_device)
    message = str(caught.value)
    assert "changed from -99 to 7" in message and "not reproducible" in message


@pytest.mark.parametrize(("cores", "processes", "threads"), [(16, 16, 1), (16, 4, 4), (2, 8, 1)])
def test_each_process_gets_its_share_of_the_cores(monkeypatch, cores, processes, threads):
    set_to = []
    monkeypatch.setattr(pinning, "usable_cores", lambda: cores)
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    assert pinning.share_cores(processes) == threads
    assert set_to == [threads]


def test_xdist_workers_share_the_cores_and_nothing_changes_outside_xdist(monkeypatch):
    set_to = []
    monkeypatch.setattr(pinning, "usable_cores", lambda: 16)
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    assert share_xdist_cores(None) is None
    assert share_xdist_cores(8) == 2
    assert set_to == [2]
