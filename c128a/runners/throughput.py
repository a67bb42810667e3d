"""``c128a bench --throughput``: how fast one property runs, and where the time goes.

It runs the property's own Hypothesis test (:meth:`c128a.checks.Property.test`,
the one pytest and the fuzzer run) under the ``fuzz`` profile without
shrinking, seeded, and charges each example's time to the harness's phases
(:mod:`c128a.phases`): drawing, tensors, buffers, validation, the target,
the oracle, the comparison.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time

import torch
from hypothesis import Phase, settings

from .. import phases
from ..checks import PROPERTIES
from ..checks.profiles import register_profiles
from ..failures import UsageError


class _TimeUp(BaseException):
    """Ends the run after its time; a BaseException, so Hypothesis lets it through."""


def run_throughput(
    target,
    device: torch.device,
    property_name: str = "matches_oracle",
    *,
    seconds: float = 10.0,
    max_tokens: int = 512,
    seed: int = 0,
    examples: int | None = None,
    profile_out: str | None = None,
) -> dict:
    """Run one property for ``seconds`` (or, when ``examples`` is given, for
    that many examples: the same examples on every run, to compare two
    versions of the harness) after one warm-up example, and report examples/s
    and the time per phase.

    Returns a dict with ``examples``, ``seconds``, ``examples_per_s``,
    ``tokens_per_example`` and ``phases`` (phase -> seconds, ``draw`` being
    everything outside the property's check), plus ``profile_top`` when
    ``profile_out`` is given. A failing check ends the run with its
    :class:`~c128a.failures.ContractViolation`.
    """
    if property_name not in PROPERTIES:
        raise UsageError(f"--property={property_name!r} is not one of {', '.join(PROPERTIES)}")
    prop = PROPERTIES[property_name]
    clock = phases.PhaseClock(torch.cuda.synchronize if device.type == "cuda" else None)
    state = {"examples": 0, "tokens": 0, "inside": 0.0, "start": None}
    profiler = cProfile.Profile() if profile_out else None

    def around(batch, run) -> None:
        now = time.perf_counter()
        if state["start"] is None:  # the first example warms up (compiles, caches)
            run()
            clock.reset()
            state["start"] = time.perf_counter()
            if profiler:
                profiler.enable()
            return
        if (examples is None and now - state["start"] >= seconds) or (
            examples is not None and state["examples"] >= examples
        ):
            raise _TimeUp
        run()
        state["examples"] += 1
        state["tokens"] += batch.num_tokens
        state["inside"] += time.perf_counter() - now

    register_profiles()
    run_settings = settings(
        parent=settings.get_profile("fuzz"),
        database=None,
        phases=[Phase.generate, Phase.target],
        report_multiple_bugs=False,
    )
    test = prop.test(
        target, device, settings=run_settings, seed=seed, max_tokens=max_tokens, around=around
    )
    try:
        with clock:
            test()
    except _TimeUp:
        pass
    finally:
        if profiler:
            profiler.disable()
    elapsed = time.perf_counter() - (state["start"] or time.perf_counter())
    done = state["examples"]
    spent = {name: clock.totals.get(name, 0.0) for name in phases.PHASES}
    spent["draw"] = max(elapsed - state["inside"], 0.0)
    spent["other"] = max(state["inside"] - sum(clock.totals.values()), 0.0)
    report = {
        "property": property_name,
        "target": str(target),
        "device": str(device),
        "max_tokens": max_tokens,
        "seed": seed,
        "examples": done,
        "seconds": elapsed,
        "examples_per_s": done / elapsed if elapsed > 0 else 0.0,
        "tokens_per_example": state["tokens"] / done if done else 0.0,
        "phases": spent,
    }
    if profiler:
        profiler.dump_stats(profile_out)
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(15)
        report["profile_top"] = text.getvalue()
    return report


def print_throughput(report: dict) -> None:
    examples, elapsed = report["examples"], report["seconds"]
    print(
        f"throughput: {report['property']} on {report['target']} ({report['device']}), "
        f"batches of up to {report['max_tokens']} tokens, seed {report['seed']}: "
        f"{examples} examples in {elapsed:.1f} s = {report['examples_per_s']:.1f} examples/s "
        f"(mean {report['tokens_per_example']:.0f} tokens)"
    )
    per_example = 1e3 / max(examples, 1)
    for phase in phases.PHASES:
        spent = report["phases"][phase]
        share = 100 * spent / elapsed if elapsed > 0 else 0.0
        print(f"  {phase:<11} {spent:8.2f} s  {share:5.1f} %  {spent * per_example:8.3f} ms/example")
    if "profile_top" in report:
        print(report["profile_top"])
