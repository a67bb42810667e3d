"""The project kernel's GPU code paths, exercised under the interpreter too.

On the CPU the kernel runs with the interpreter's tile: one 1,024-column tile
per row block and one program per block, so the GPU tile's 128-column loop,
its per-tile writes of decode_lens and the persistent grid-stride loop would
otherwise only ever run on a GPU. Here the same kernel is launched with the
GPU tile, with a capped grid (several sweeps per program) and with short
wide runs, one row a program, and every build is checked against the
oracle like any target.
"""

import functools

import pytest
from hypothesis import given, settings

from c128a import strategies
from c128a.checks import check_step
from c128a.targets import Target

# name: launch_tiled keywords. None of these depends on the batch. Row blocks
# are pinned (single_rows_up_to=0) where a tiling names them: on a GPU a batch
# of up to 4 tokens a multiprocessor would otherwise run single rows.
TILINGS = {
    "gpu tile": dict(tile=(4, 128, 1024), max_programs=None, single_rows_up_to=0),
    "gpu tile, two persistent programs": dict(tile=(4, 128, 1024), max_programs=2,
                                              single_rows_up_to=0),
    "one-token blocks, one program": dict(tile=(1, 128, 1024), max_programs=1,
                                          single_rows_up_to=0),
    "256-column runs from W = 256": dict(tile=(4, 128, 256), max_programs=3,
                                         single_rows_up_to=0),
    # A small batch on a GPU: one row a program (every batch here, on the CPU too).
    "single rows": dict(tile=(4, 128, 1024), single_rows_up_to=1 << 20),
    "single rows, two persistent programs": dict(
        tile=(4, 128, 1024), single_rows_up_to=1 << 20, max_programs=2
    ),
    # The interpreter ignores the cap; on a GPU it is a different compile.
    "gpu tile, 32 registers a thread": dict(tile=(4, 128, 1024), max_registers=32,
                                            single_rows_up_to=0),
}


def tiled_target(name: str) -> Target:
    from c128a.kernels import adaptive
    from c128a.kernels.builder import triton_builder

    launch = functools.partial(
        adaptive.launch_tiled, num_warps=4, programs_per_sm=0, **TILINGS[name]
    )
    return Target(
        spec=f"c128a.kernels.adaptive with {name}",
        build_c128a_topk_metadata=triton_builder(launch),
    )


@pytest.mark.parametrize("tiling", sorted(TILINGS))
def test_kernel_tiling_matches_oracle(tiling, c128a_device):
    target = tiled_target(tiling)

    @settings(max_examples=12)
    @given(batch=strategies.batches())
    def check(batch):
        check_step(target, batch, c128a_device)

    check()


@pytest.mark.parametrize("tiling", sorted(TILINGS))
def test_kernel_tiling_keeps_historical_failures_fixed(tiling, c128a_device):
    target = tiled_target(tiling)
    for name, batch in strategies.HISTORICAL_BATCHES.items():
        try:
            check_step(target, batch, c128a_device)
        except AssertionError as exc:
            raise AssertionError(f"historical batch {name!r}: {exc}") from None
