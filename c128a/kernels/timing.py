"""Timing kernels: ``triton.testing.do_bench``, CUDA-graph replays, and the
empty launch.

Two clocks, for two questions:

- :func:`median_us`: ``do_bench``'s median (L2 flushed before every call,
  CUDA events around each call), so a call's host-side launch cost is in it
  wherever the GPU would otherwise wait for the host (short kernels);
- :func:`graph_us`: the GPU's time alone: ``launches`` calls captured back to
  back into one ``torch.cuda.CUDAGraph``, the replay timed with CUDA events
  and divided by ``launches``, the median over ``replays`` replays. No host
  work is in it, and L2 is not flushed between the captured launches (data
  that fits in L2 stays there from one launch to the next).
"""

from __future__ import annotations

import gc
import statistics

import torch
import triton
import triton.testing

from ..failures import DeviceError

GRAPH_WARMUP_CALLS = 3
"""Calls before capture (on a side stream): compiles and caches everything a
call does once, which a capture must not contain."""


def median_us(fn, warmup_ms: int, rep_ms: int) -> float:
    """The median time of ``fn`` in microseconds (``do_bench``, L2 flushed)."""
    return 1000.0 * triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def graph_us(fn, device, launches: int = 100, replays: int = 10) -> float:
    """The GPU time of one ``fn()`` in microseconds: ``launches`` calls
    captured into one CUDA graph, the replay timed with CUDA events, divided
    by ``launches``; the median over ``replays`` replays (after one untimed
    replay). ``fn`` must only launch work on the current stream (no
    synchronisation, no host reads of device memory), as a capture requires.

    :class:`~c128a.failures.DeviceError` on a device that is not CUDA (CUDA
    graphs do not exist elsewhere; under Triton's interpreter a kernel runs
    on the host), ``ValueError`` for fewer than one launch or replay.
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise DeviceError(
            f"CUDA-graph timing needs a CUDA device, not {device.type!r}: a CUDA graph "
            "captures GPU launches (time on the CPU with do_bench alone, or not at all)"
        )
    if not torch.cuda.is_available():
        raise DeviceError(
            "CUDA-graph timing needs a CUDA device: torch.cuda.is_available() is False"
        )
    if launches < 1 or replays < 1:
        raise ValueError(
            f"graph_us needs launches >= 1 and replays >= 1, not {launches} and {replays}"
        )
    with torch.cuda.device(device):
        # Warm up on a side stream, as torch documents for capture.
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(GRAPH_WARMUP_CALLS):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)

        graph = torch.cuda.CUDAGraph()
        # No garbage collection while capturing: freeing an earlier graph then is
        # an unsafe CUDA call that invalidates the capture (kernels/consumer.py).
        gc.collect()
        gc.disable()
        try:
            with torch.cuda.graph(graph):  # captures on its own side stream
                for _ in range(launches):
                    fn()
        finally:
            gc.enable()
        graph.replay()  # the first replay uploads the graph: not timed
        torch.cuda.synchronize(device)

        starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
        for start, end in zip(starts, ends, strict=True):
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize(device)
        per_launch = [
            1000.0 * start.elapsed_time(end) / launches
            for start, end in zip(starts, ends, strict=True)
        ]
        del graph
    return statistics.median(per_launch)


@triton.jit
def empty_kernel(scratch_ptr):
    """Does nothing: its time is a launch's, the floor of any small shape."""
    pass


def launch_empty(scratch) -> None:
    empty_kernel[(1,)](scratch)
