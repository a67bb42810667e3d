"""Copies between the host and a GPU leave no pinned memory behind for
large tensors: torch keeps every pinned block it hands out, so engine-scale
steps copied through pinned memory grew each fuzz worker by gigabytes."""

from __future__ import annotations

import pytest
import torch

from c128a.step.buffers import (
    PINNED_COPY_LIMIT_BYTES,
    copy_into,
    through_pinned_memory,
    to_host,
    upload,
)


def test_only_tensors_up_to_the_limit_go_through_pinned_memory():
    at_limit = torch.empty(PINNED_COPY_LIMIT_BYTES // 4, dtype=torch.int32)
    one_past = torch.empty(PINNED_COPY_LIMIT_BYTES // 4 + 1, dtype=torch.int32)
    assert through_pinned_memory(at_limit)
    assert not through_pinned_memory(one_past)


@pytest.mark.cuda
def test_large_copies_of_many_sizes_keep_no_pinned_blocks(c128a_device):
    torch.cuda.synchronize()
    before = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
    for mebibytes in (20, 40, 80, 160):
        host = torch.arange(mebibytes << 18, dtype=torch.int32)
        on_gpu = upload(host, "cuda")
        copy_into(on_gpu, host.flip(0))
        [back] = to_host([on_gpu])
        assert torch.equal(back, host.flip(0))
    grown = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0) - before
    assert grown <= PINNED_COPY_LIMIT_BYTES, (
        f"pinned memory grew by {grown:,} bytes for copies past the "
        f"{PINNED_COPY_LIMIT_BYTES:,}-byte limit")
