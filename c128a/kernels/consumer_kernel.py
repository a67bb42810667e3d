"""The replay consumer as a Triton kernel inside a real ``torch.cuda.CUDAGraph``.

A kernel module: import it only after :func:`c128a.targets.use_device` chose
CUDA (:mod:`c128a.replay.consumer` does so lazily). One graph per captured view: the
kernel's pointers and strides are the capture-time view's, baked into the
graph, exactly as the decode attention kernel's are in a FULL CUDA graph.
The semantics match :func:`c128a.replay.consumer.consume` element for element.
"""

from __future__ import annotations

import gc

import torch
import triton
import triton.language as tl

from ..failures import HarnessError

BLOCK_W = 128  # every captured width is a multiple of 128
WARMUP_LAUNCHES = 3


@triton.jit
def replay_consumer_kernel(
    indices_ptr,
    index_row_stride,
    index_column_stride,
    lens_ptr,
    lens_stride,
    kv_ptr,
    kv_size,
    indices_seen_ptr,
    lens_seen_ptr,
    gathered_ptr,
    width,
    OUT_OF_TABLE_VALUE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_width = columns < width

    length = tl.load(lens_ptr + row * lens_stride)
    indices = tl.load(
        indices_ptr + row * index_row_stride + columns.to(tl.int64) * index_column_stride,
        mask=in_width,
        other=-1,
    )
    active = in_width & (columns < length)
    in_table = active & (indices >= 0) & (indices < kv_size)
    values = tl.load(kv_ptr + indices.to(tl.int64), mask=in_table, other=0)
    out_of_table = tl.full(values.shape, OUT_OF_TABLE_VALUE, values.dtype)
    zero = tl.zeros(values.shape, values.dtype)
    gathered = tl.where(in_table, values, tl.where(active, out_of_table, zero))

    tl.store(indices_seen_ptr + row * width + columns, indices, mask=in_width)
    tl.store(gathered_ptr + row * width + columns, gathered, mask=in_width)
    if tl.program_id(1) == 0:
        tl.store(lens_seen_ptr + row, length)


def launch_consumer(
    indices: torch.Tensor,
    lens: torch.Tensor,
    kv: torch.Tensor,
    indices_seen: torch.Tensor,
    lens_seen: torch.Tensor,
    gathered: torch.Tensor,
    out_of_table: int,
) -> None:
    """One eager launch of the consumer (also runs under Triton's interpreter):
    ``out_of_table`` is its output for an index outside the table."""
    rows, width = indices.shape
    if rows == 0:
        return
    grid = (rows, triton.cdiv(width, BLOCK_W))
    replay_consumer_kernel[grid](
        indices,
        indices.stride(0),
        indices.stride(1),
        lens,
        lens.stride(0),
        kv,
        kv.numel(),
        indices_seen,
        lens_seen,
        gathered,
        width,
        OUT_OF_TABLE_VALUE=out_of_table,
        BLOCK=BLOCK_W,
    )


class GraphConsumer:
    """Captures the consumer of ``indices`` [S, Wc] and ``lens`` [S] (tensors
    viewing the persistent buffers with the capture-time geometry) into one
    CUDA graph; :meth:`replay` replays it and returns copies of its outputs
    (the indices and lens it saw, what it gathered)."""

    def __init__(
        self, indices: torch.Tensor, lens: torch.Tensor, kv: torch.Tensor, out_of_table: int
    ):
        if not (indices.is_cuda and lens.is_cuda and kv.is_cuda):
            raise HarnessError("GraphConsumer needs CUDA tensors")
        rows, width = indices.shape
        if width % BLOCK_W:
            raise HarnessError(f"captured width {width} must be a multiple of {BLOCK_W}")
        device = indices.device
        self.indices, self.lens, self.kv = indices, lens, kv
        self.out_of_table = out_of_table
        self.rows, self.width = rows, width
        # Static outputs, allocated before capture so the graph owns no allocation.
        self.indices_seen = torch.empty((rows, width), dtype=torch.int32, device=device)
        self.lens_seen = torch.empty((rows,), dtype=torch.int32, device=device)
        self.gathered = torch.empty((rows, width), dtype=torch.int64, device=device)

        # Warm up (compile) on a side stream before capture, as CUDA graph capture requires.
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_LAUNCHES):
                self._launch()
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)

        self.graph = torch.cuda.CUDAGraph()
        # A garbage collection during capture can destroy an earlier graph (an
        # unsafe CUDA call that invalidates this capture; seen after failing
        # tests left cycles behind): collect now, and not while capturing.
        gc.collect()
        gc.disable()
        try:
            with torch.cuda.graph(self.graph):
                self._launch()
        finally:
            gc.enable()
        torch.cuda.synchronize(device)

    def _launch(self) -> None:
        launch_consumer(
            self.indices, self.lens, self.kv, self.indices_seen, self.lens_seen, self.gathered,
            self.out_of_table,
        )

    def replay(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Replay the graph; copies of its outputs, queued behind it on the
        stream (read them back to wait for it)."""
        self.graph.replay()
        return self.indices_seen.clone(), self.lens_seen.clone(), self.gathered.clone()
