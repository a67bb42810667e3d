"""One build of a step into its buffers.

:func:`build` runs a target on a step, wraps whatever the target's code
raises as :class:`~c128a.failures.TargetRaised`, and checks that the build
left its inputs as it found them
(:func:`~c128a.step.inputs.check_inputs_unchanged`: every property, the
serving loop and the replay harness build through here); :func:`oracle_build` runs
the oracle, whose refusal means the suite drew a step outside the contract
(:class:`~c128a.failures.HarnessError`). Both meet the step
(:mod:`.batch`) and its buffers (:mod:`.buffers`) here, above both.
"""

from __future__ import annotations

import torch

from .. import phases
from ..contract import SLOTS, write_metadata
from ..failures import HarnessError, call_target
from .batch import Batch
from .buffers import Buffers, BuildResult, tuple_of_views
from .inputs import check_inputs_unchanged


def build(
    target,
    batch: Batch,
    device: torch.device | str,
    *,
    width: int | None = None,
    buffers: Buffers | None = None,
) -> BuildResult:
    """Run ``target``'s builder on ``batch`` at ``width`` (the batch's own by
    default) into ``buffers`` (fresh, poisoned with :data:`~.buffers.POISON`,
    by default). What the target raises is a :class:`~c128a.failures.TargetRaised`;
    a build that changes its inputs (or the persistent tensors around them)
    fails ``inputs_unchanged`` (:class:`~c128a.failures.InvariantViolation`)."""
    width = batch.width if width is None else width
    if buffers is None:
        buffers = Buffers.for_batch(batch, device)
    tensors = batch.tensors(device)
    args = batch.build_args(tensors, buffers, width)
    with phases.phase("target"):
        views = call_target(
            "target_raised", "build_c128a_topk_metadata", target.build_c128a_topk_metadata, *args
        )
    check_inputs_unchanged(
        tensors.memory, f"W={width}, capacity={batch.capacity}, T={batch.num_tokens}, "
        f"num_decode_tokens={batch.num_decode_tokens}")
    return BuildResult(batch=batch, width=width, views=tuple_of_views(views), buffers=buffers)


def oracle_build(
    batch: Batch, device: torch.device | str, *, width: int | None = None,
    buffers: Buffers | None = None, padding_rows: str = SLOTS,
) -> BuildResult:
    """The oracle's build of ``batch`` (unchecked: steps come from the
    strategies or from a validated case) under the ``padding_rows`` variant.
    A refusal means the suite itself drew a step outside the contract."""
    width = batch.width if width is None else width
    if buffers is None:
        buffers = Buffers.for_batch(batch, device)
    args = batch.build_args(batch.tensors(device), buffers, width)
    with phases.phase("oracle"):
        try:
            views = write_metadata(args, padding_rows)
        except Exception as exc:
            raise HarnessError(
                f"the oracle could not build a step the suite drew ({type(exc).__name__}: {exc}); "
                f"the strategies must draw steps inside the contract"
            ) from exc
    return BuildResult(batch=batch, width=width, views=views, buffers=buffers)
