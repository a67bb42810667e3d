"""No recompiles mid-inference: the sweep that counts a kernel's compiled
variants before and after every width, token count and stride the engine
can present (the bug that hung one tensor-parallel rank in a compile at
>524K context). CUDA only: the interpreter compiles nothing.
"""

from __future__ import annotations

import contextlib

import torch

from ..contract import BuildArgs, policy

CAPACITY = 8192  # 1M context
BLOCK_SIZE = 2
ROWS = 1024


def launch_arguments(device, width, num_decode, num_prefill, decode_buffer, prefill_buffer, table):
    """Valid arguments for a launch: positions spread over [0, W * R + R)."""
    num_tokens = num_decode + num_prefill
    span = min(width * policy.COMPRESS_RATIO, table.shape[1] * BLOCK_SIZE * policy.COMPRESS_RATIO)
    index = torch.arange(num_tokens, dtype=torch.int64, device=device)
    positions = (index * 7919 + width) % (span + policy.COMPRESS_RATIO - 1)
    requests = (torch.arange(num_tokens, device=device) % max(table.shape[0], 1)).to(torch.int32)
    slot_mapping = torch.where(index % 5 == 4, -1, index)
    lens = torch.empty(ROWS, dtype=torch.int32, device=device)
    return BuildArgs(
        positions, policy.COMPRESS_RATIO, num_decode, requests, table, BLOCK_SIZE,
        slot_mapping, decode_buffer, lens, prefill_buffer, width,
    )


def compiled_variants_around_sweep(
    jit_functions, launch, device: torch.device, warm_up=None, compiles: list | None = None
) -> tuple[int, int]:
    """Warm the kernel once at the largest width (with ``warm_up``, ``launch``
    by default), then ``launch`` it (a :class:`~c128a.contract.BuildArgs`
    callable) at every reachable width with varied token counts, buffer row
    strides and block-table strides: (variants of ``jit_functions`` after
    warm-up, after the sweep). Where Triton has its public compile hooks
    (:func:`~c128a.kernels.compiled.recorded_compiles`), the sweep's
    compiles are counted as they happen and appended, each with its key, to
    ``compiles`` where given; otherwise the variants held are counted again."""
    from ..kernels.compiled import compile_hooks_available, compiled_variant_count, recorded_compiles

    def variants() -> int:
        return sum(compiled_variant_count(f, device) for f in jit_functions)

    pages = CAPACITY // BLOCK_SIZE
    dense = torch.zeros(ROWS, CAPACITY, dtype=torch.int32, device=device)
    padded = torch.zeros(ROWS, CAPACITY + 3, dtype=torch.int32, device=device)[:, :CAPACITY]
    prefill_dense = torch.zeros_like(dense)
    tables = [
        torch.arange(64 * pages, dtype=torch.int32, device=device).view(64, pages),
        torch.zeros(64, pages + 16, dtype=torch.int32, device=device)[:, :pages],
        torch.zeros(64, pages + 1, dtype=torch.int32, device=device)[:, :pages],
        torch.zeros(1, 1, dtype=torch.int32, device=device),  # stride 1: one page
    ]

    (warm_up or launch)(launch_arguments(device, CAPACITY, 4, 4, dense, prefill_dense, tables[0]))
    torch.cuda.synchronize(device)
    warmed = variants()

    # (24, 1000): enough tokens for row blocks below WIDE_W on a GPU of fewer than
    # 256 multiprocessors; the smaller counts are written one row a program
    token_counts = [(1, 0), (0, 1), (1, 1), (3, 5), (17, 200), (64, 0), (0, 300), (31, 33), (24, 1000)]
    hooks = compile_hooks_available()
    with recorded_compiles(jit_functions) if hooks else contextlib.nullcontext() as recorder:
        for width in policy.reachable_widths(CAPACITY):
            for num_decode, num_prefill in token_counts:
                for table in tables:
                    for decode_buffer, prefill_buffer in ((dense, padded), (padded, prefill_dense)):
                        _note_launch(recorder, f"W={width}, decode {num_decode}, "
                                               f"prefill {num_prefill}")
                        launch(launch_arguments(
                            device, width, num_decode, num_prefill, decode_buffer, prefill_buffer,
                            table
                        ))
        torch.cuda.synchronize(device)
    if recorder is None:
        return warmed, variants()
    if compiles is not None:
        compiles.extend(recorder.started)
    return warmed, warmed + len(recorder.compiled)


def _note_launch(recorder, during: str) -> None:
    """Tell ``recorder`` (None: none) what the next launches are."""
    if recorder is not None:
        recorder.during = during
