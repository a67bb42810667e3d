"""Timing kernels: ``triton.testing.do_bench`` and the empty launch."""

from __future__ import annotations

import triton
import triton.testing


def median_us(fn, warmup_ms: int, rep_ms: int) -> float:
    """The median time of ``fn`` in microseconds (``do_bench``, L2 flushed)."""
    return 1000.0 * triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


@triton.jit
def empty_kernel(scratch_ptr):
    """Does nothing: its time is a launch's, the floor of any small shape."""
    pass


def launch_empty(scratch) -> None:
    empty_kernel[(1,)](scratch)
