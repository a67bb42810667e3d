"""No recompiles mid-inference, on the selected target (CUDA only): after
one warm-up at the largest width, no width the policy can produce, token
count, row stride or block-table stride makes Triton compile the target's
kernels again (:func:`c128a.checks.recompiles.compiled_variants_around_sweep`).
The compiles are counted on the JIT functions the target names
(``jit_functions``), through Triton's public compile hooks where it has them,
so that a failure names each new variant's key and the launch that made it.
"""

from __future__ import annotations

import pytest

from c128a.checks.recompiles import CAPACITY, compiled_variants_around_sweep

pytestmark = [pytest.mark.cuda, pytest.mark.slow, pytest.mark.conformance("no_recompiles")]


def _names_jit_functions(target) -> bool:
    return bool(target.jit_functions)


# A target that names no JIT functions has no compiles to count: not applicable.
@pytest.mark.applies_to.with_args(
    _names_jit_functions,
    why="the target names no jit_functions (the Triton functions it launches, whose "
        "compiles are counted)")
def test_selected_target_never_recompiles(c128a_target, c128a_device):
    """The sweep through the selected target's own builder (its validation
    and launch included), counting the JIT functions it names."""
    compiles: list = []
    warmed, after = compiled_variants_around_sweep(
        c128a_target.jit_functions, lambda args: c128a_target.build_c128a_topk_metadata(*args),
        c128a_device, compiles=compiles,
    )
    assert warmed >= 1, f"no compiled variant of {c128a_target}'s jit_functions after warm-up"
    assert after == warmed, (
        f"{c128a_target} compiled {after - warmed} new variant(s) after warm-up at W={CAPACITY}"
        + "".join(f"; {c.describe()} at {c.during}" for c in compiles[:3])
    )
