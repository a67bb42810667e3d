"""No compile after the engine's own warm-up, on the selected target (CUDA
only): every launcher that declares its warm-up keys is warmed up as vLLM
does (each key through Triton's compile-only warm-up, from the kernels'
in-process caches emptied), then a serving loop's steps run through the
target's builder and consumers while Triton's public compile hooks record
every compile; one of those kernels compiling again fails, naming it, its
key and the step (:mod:`c128a.checks.engine_warm_up`). It applies only to
targets with a launcher that declares its warm-up (``applies_to``): for
one whose launchers declare none, the engine warms nothing up, so there is
nothing to check (the project's kernel warms itself at its first launch,
which ``no_recompiles`` checks); such a target does not have this check,
rather than a check that did not run.
"""

from __future__ import annotations

import pytest

from c128a.checks.engine_warm_up import (
    check_no_compile_after_warm_up,
    declared_warm_up_launchers,
    run_engine_warm_up,
)

pytestmark = [pytest.mark.cuda, pytest.mark.compile_keys, pytest.mark.conformance("engine_warm_up")]


def _declares_its_warm_up(target) -> bool:
    return bool(declared_warm_up_launchers(target))


@pytest.mark.applies_to.with_args(_declares_its_warm_up,
                                  why="no launcher of the target declares a warm-up")
def test_no_compile_after_the_engines_warm_up(c128a_target, c128a_device):
    run = run_engine_warm_up(c128a_target, c128a_device)
    # The record of a GPU run (pytest -s shows it).
    print(f"{c128a_target}: the warm-up compiled {len(run.warm_up)} variant(s); after it, "
          f"{len(run.judged())} compile(s) of warmed kernels and {len(run.not_judged())} of "
          f"kernels no launcher declares a warm-up for, over {run.launches} launch(es)")
    check_no_compile_after_warm_up(str(c128a_target), run)
