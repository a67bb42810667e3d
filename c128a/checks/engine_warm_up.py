"""No compile after the engine's own warm-up (GPU).

vLLM warms a keyed launcher up from the keys it declares
(``get_warmup_keys``), each compiled through Triton's compile-only warm-up
(``kernel.warmup(..., grid=...)``) with the engine configuration's
arguments, and its JIT monitor flags any compile after that (vllm#40137).
A key that the declaration holds can still compile during inference: the
compile-only warm-up may fill a different entry of Triton's in-process
cache than the first real launch looks up (a report on vllm#50175). The
CPU check (:mod:`c128a.checks.compile_keys`) compares declared keys with
launch keys and cannot see that; a sweep that warms up its own way
(:mod:`c128a.checks.recompiles`) cannot either.

So, on a GPU: empty the in-process cache of every kernel whose launcher
declares its warm-up, warm each one up as the engine does
(:func:`c128a.kernels.launch_keys.warm_up`), then run a serving loop's
steps (:func:`serving_trace`: widths up to C and back, decode with 1 to 8
query tokens, mixed and prefill-only steps, a padding token) through the
target's builder and its consumers, recording every compile with Triton's
public hooks (:func:`c128a.kernels.compiled.recorded_compiles`). Any
compile of those kernels after the warm-up fails the check, naming the
kernel, its key and the step (:func:`check_no_compile_after_warm_up`).
Kernels no launcher declares a warm-up for are listed, not judged: the
engine compiles them in its dummy runs, which this check does not repeat.

On the CPU, :func:`warm_up_plan_misses` works out, compiling nothing, the
trace's launch keys that the declared warm-up does not hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..contract import COMPRESS_RATIO, MAX_QUERY_TOKENS_PER_DECODE, capacity_width, policy
from ..failures import HarnessError, InvariantViolation, call_target
from ..step import Batch, PaddingToken, StepRequest, assemble_batch, build
from ..step.consumer_inputs import ConsumerInputs
from .compile_keys import PAGE_TOKENS, describe_miss, engine_step, step_launches
from .consumers import consumers_of

NAME = "engine_warm_up"
TRACE_MODEL_LEN = 262_144
"""The engine's max_model_len for the trace: C = 2048, widths 128 to 2048."""
TRACE_ROWS = 32


def declared_warm_up_launchers(target) -> tuple:
    """The keyed launchers of ``target``'s builder and of its consumers that
    declare their warm-up (``get_warmup_keys``), each once, in order."""
    found = []
    for launcher in (*getattr(target, "launchers", ()),
                     *(l for consumer in consumers_of(target) for l in consumer.launchers)):
        if hasattr(launcher, "get_warmup_keys") and all(launcher is not f for f in found):
            found.append(launcher)
    return tuple(found)


def serving_trace(target, max_model_len: int = TRACE_MODEL_LEN) -> list[tuple[str, Batch]]:
    """(description, step) of a serving loop as the engine schedules it: the
    longest sequence grows through every width the policy reaches for
    ``max_model_len`` up to C and shrinks back, and at each width a decode
    step (a request of 1 query token, one of 1 to 8 as drafts are accepted,
    one padding token), a mixed step (a decode token and a prefill chunk of
    3) and a prefill-only step (chunks of 5 and 2). Widths are the target's
    own policy's (:func:`~c128a.checks.compile_keys.engine_step` gives the
    engine's buffers)."""
    capacity = capacity_width(max_model_len)
    widths = policy.reachable_widths(capacity)
    steps = []
    for number, width in enumerate(widths + widths[-2::-1]):
        seq_len = min(width * COMPRESS_RATIO, max_model_len)
        short = seq_len // 2 + 1
        drafts = 1 + number % MAX_QUERY_TOKENS_PER_DECODE
        pages = -(-seq_len // PAGE_TOKENS)
        table = tuple(tuple(range(r * pages, (r + 1) * pages)) for r in range(2))
        shapes = {
            "decode": ([StepRequest.last(seq_len, 1), StepRequest.last(short, drafts)], [],
                       table, (PaddingToken(position=seq_len - 1, request=0),)),
            "mixed": ([StepRequest.last(seq_len, 1)], [StepRequest.last(seq_len, 3)],
                      table[:1], ()),
            "prefill": ([], [StepRequest.last(seq_len, 5), StepRequest.last(short, 2)], (), ()),
        }
        for shape, (decode, prefill, rows, padding) in shapes.items():
            batch = assemble_batch(
                decode, prefill, block_table=rows, max_model_len=max_model_len,
                capacity=capacity, width=width, buffer_rows=TRACE_ROWS, tail_padding=padding,
                labels=("serving trace",),
            )
            batch = engine_step(target, batch)
            tokens = ", ".join(f"{'decode' if i < len(decode) else 'prefill'} "
                               f"{r.positions[0]}..{r.positions[-1]}"
                               for i, r in enumerate([*decode, *prefill]))
            steps.append((f"trace step {len(steps) + 1} ({shape}): W={batch.width}, "
                          f"capacity={capacity}; {tokens}", batch))
    return steps


def warm_up_plan_misses(target, device, max_model_len: int = TRACE_MODEL_LEN) -> list[str]:
    """Each launch of :func:`serving_trace` whose compile key the declared
    warm-up of its launcher does not compile, worked out on any device with
    nothing compiled or run: what :func:`run_engine_warm_up` will see
    compile after the warm-up."""
    # The kernels' package imports Triton: imported here, after the device is chosen.
    from ..kernels import launch_keys as keys

    config = keys.engine_config(max_model_len, PAGE_TOKENS)
    plan = {id(launcher): call_target(NAME, f"{type(launcher).__name__}.get_warmup_keys",
                                      keys.warmed_keys, launcher, config)
            for launcher in declared_warm_up_launchers(target)}
    misses = []
    for description, batch in serving_trace(target, max_model_len):
        for who, launcher, key in step_launches(target, batch, device):
            warmed = plan.get(id(launcher))
            if warmed is not None and key not in warmed:
                misses.append(f"{describe_miss(who, key, warmed)}; {description}")
    return misses


@dataclass(frozen=True)
class EngineWarmUp:
    """What one run of the engine's warm-up and the trace compiled.

    ``warm_up``: the compiles the warm-up made; ``after``: every compile that
    started after it (Triton's cache hook), ``unfinished`` those of them that
    never finished; ``warmed_kernels``: the JIT functions of the launchers
    that declare a warm-up, the ones judged; ``launches``: how many launches
    through those launchers the trace made."""

    warm_up: tuple
    after: tuple
    unfinished: tuple
    warmed_kernels: tuple
    launches: int

    def judged(self) -> list:
        return [c for c in self.after if any(c.jit_function is k for k in self.warmed_kernels)]

    def not_judged(self) -> list:
        return [c for c in self.after if all(c.jit_function is not k for k in self.warmed_kernels)]


def _synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def run_engine_warm_up(target, device, max_model_len: int = TRACE_MODEL_LEN) -> EngineWarmUp:
    """Warm ``target``'s declared launchers up as the engine does, then run
    :func:`serving_trace` through its builder and consumers on ``device`` (a
    GPU), recording every compile."""
    # The kernels' package imports Triton: imported here, after the device is chosen.
    from ..kernels import compiled, launch_keys as keys, vllm_shims as shims

    launchers = declared_warm_up_launchers(target)
    config = keys.engine_config(max_model_len, PAGE_TOKENS)
    kernels = []
    for launcher in launchers:
        if all(launcher.kernel is not k for k in kernels):
            kernels.append(launcher.kernel)
    # An earlier launch in this process (another test's) would hide a warm-up
    # that fills the wrong cache entry: every variant is compiled afresh.
    for kernel in kernels:
        compiled.forget_compiled_variants(kernel)
    trace = serving_trace(target, max_model_len)
    with compiled.recorded_compiles() as recorder:
        recorder.during = "the engine's warm-up"
        for launcher in launchers:
            call_target(NAME, f"{type(launcher).__name__} warm-up", keys.warm_up, launcher,
                        config, device)
        _synchronize(device)
        warm_up = tuple(recorder.compiled)
        started = len(recorder.started)
        kernels += [c.jit_function for c in warm_up if all(c.jit_function is not k for k in kernels)]
        with shims.observed_launches(run=True) as launches:
            for description, batch in trace:
                recorder.during = description
                inputs = ConsumerInputs.from_build(build(target, batch, device))
                for consumer in consumers_of(target):
                    call_target(NAME, f"consumer {consumer.name}", consumer, inputs)
            _synchronize(device)
    after = tuple(recorder.started[started:])
    unfinished = tuple(c for c in recorder.unfinished() if c in after)
    declared = [record for record in launches if any(record.launcher is l for l in launchers)]
    # A declared launcher may launch a kernel of its own choosing (a launch
    # spec's "kernel"): judged too, whether or not its warm-up compiled it.
    kernels += [r.kernel for r in declared if all(r.kernel is not k for k in kernels)]
    return EngineWarmUp(warm_up, after, unfinished, tuple(kernels), len(declared))


def check_no_compile_after_warm_up(target_name: str, run: EngineWarmUp) -> None:
    """Invariant: after the engine's warm-up, no kernel of a launcher that
    declares its warm-up compiles again. A run that saw no warm-up compile
    or no launch through those launchers checked nothing: a
    :class:`~c128a.failures.HarnessError`."""
    if not run.warm_up:
        raise HarnessError(
            f"{target_name}: the engine's warm-up compiled nothing after the kernels' "
            "in-process variants were dropped, so Triton's compile hooks saw no compile: "
            "nothing was checked (is the recorder installed? is Triton interpreting?)")
    if not run.launches:
        raise HarnessError(
            f"{target_name}: the serving trace launched nothing through the launchers that "
            "declare a warm-up: nothing was checked")
    late = run.judged()
    if late:
        found = "; ".join(
            f"{c.describe()} during {c.during}"
            + (" (started, never finished)" if c in run.unfinished else "")
            for c in late)
        raise InvariantViolation(
            NAME, f"{target_name}: {len(late)} compile(s) after the engine's warm-up "
            f"({len(run.warm_up)} compiled by the warm-up, each declared key through Triton's "
            f"compile-only warm-up): {found}. A key the serving loop launches is missing from "
            "the launcher's get_warmup_keys, or Triton's warm-up compiled it under another key; "
            "declare it, or make the warm-up's arguments the launch's")
