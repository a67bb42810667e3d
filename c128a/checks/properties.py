"""The property registry, and the one way a property runs.

A :class:`Property` is one invariant ready to run: its strategy, its check,
the contract's historical failures to try first. :meth:`Property.test`
builds its Hypothesis test: the historical steps as ``@example``, the
chosen settings, ``event()`` for each step's labels and ``target()`` scores
(tokens, width doublings) that the ``fuzz`` profile's target phase climbs.
pytest (``c128a/conformance/test_properties.py``), ``c128a fuzz``, ``c128a mutants`` and
``c128a bench --throughput`` all run properties through it; a runner that
needs to see each example passes ``around``.

A property's input is always a :class:`~c128a.step.Batch`, so a failing input
is saved whole as JSON and replayed without Hypothesis (:meth:`Property.replay`).
``width_policy`` is a Batch property too: it reads only the batch's
``max_model_len`` and sweeps every ``max_seq_len`` the engine can present at
that model length.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Callable

import torch
from hypothesis import event, example, given, seed as use_seed, target as hypothesis_target
from hypothesis.errors import InvalidArgument as HypothesisInvalidArgument
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from ..contract import target_reachable_widths, target_width
from ..hypothesis_private import add_digest
from ..step import Batch, Buffers, build
from ..strategies import HISTORICAL_BATCHES, batches
from ..strategies.budget import SizeBudget, size_budget
from ..strategies.explicit_examples import KERNEL_EXAMPLES, LAYOUT_EXAMPLES
from ..strategies.shape_history import SHAPE_HISTORY_EXAMPLES, with_shape_history
from ..strategies.reach import (
    COMPILE_KEY_REACH,
    CONSUMER_REACH,
    MODEL_LENGTH_ONLY,
    REPLAY_REACH,
    ONE_BUILD,
    Exclusions,
    labels_of,
)
from ..strategies.pairs import DECODE_ONLY_PAIRS, POLICY_WIDTHS_ONLY, SMALL_STEPS
from .bad_input import check_rejects_bad_input
from .compile_keys import check_compile_keys, has_keyed_launchers
from .consumers import check_consumers, check_consumers_replayed
from .differential import check_adaptive_equals_full, check_idempotent, check_independent
from .one_build import (
    check_matches_oracle,
    check_padding,
    check_step,
    check_untouched_memory,
    check_views,
)
from .prior_content import check_history_independent
from .width_policy import check_width_policy

__all__ = ["PROPERTIES", "Property", "as_called"]

Check = Callable[[object, Batch, torch.device], None]
Around = Callable[[Batch, Callable[[], None]], None]
Strategy = Callable[[object, "int | None", "SizeBudget | None"], SearchStrategy[Batch]]


@dataclass(frozen=True)
class Property:
    """One invariant, ready to run: ``strategy(target, max_tokens, budget)``
    draws the batches (engine steps of up to ``max_tokens`` tokens, or the
    property's default size for None, and now and then an engine-scale step
    within ``budget``, :mod:`c128a.strategies.budget`); ``check(target,
    batch, device)`` raises a :class:`~c128a.failures.ContractViolation` when
    ``target`` breaks it on ``batch``; ``examples`` run first;
    ``unsupported(target)`` says why the property cannot be checked on a
    target (None when it can); ``reach`` names the buckets of the input
    space (:mod:`c128a.strategies.reach`) its strategy never draws by design:
    its examples report every other dimension's bucket with ``event()``."""

    name: str
    strategy: Strategy
    check: Check
    doc: str = ""
    examples: tuple[Batch, ...] = ()
    unsupported: Callable[[object], str | None] = lambda target: None
    reach: Exclusions = field(default_factory=lambda: ONE_BUILD)

    def test(
        self,
        target,
        device,
        *,
        settings=None,
        seed: int | None = None,
        max_tokens: int | None = None,
        around: Around | None = None,
        examples: bool = True,
        budget: SizeBudget | None = None,
    ) -> Callable[[], None]:
        """This property on ``target`` as a Hypothesis test: call it to run it.

        ``settings`` (a ``hypothesis.settings``) defaults to the loaded
        profile's; ``seed`` fixes the random choices (reproducible from it
        alone). ``around(batch, run)`` wraps every example: it must call
        ``run()`` (the check) and may do what a runner needs before and after.
        ``examples=False`` leaves out the historical steps (a replay pinned to
        one recorded example). Step sizes follow ``device``'s budget
        (:func:`~c128a.strategies.budget.size_budget`), or ``budget`` when
        given (the pair reach draws engine-scale steps only). The test's database
        key is the property's name, so every run, worker and machine sharing
        a database replays the failures of that property.
        """
        check = self.check
        strategy = self.strategy(target, max_tokens, budget or size_budget(device))
        reach = self.reach
        if not getattr(target, "uses_project_policy", True):
            # Steps as the target's engine calls it (the test's own source,
            # and so its derandomized seed, stays the same for every target).
            strategy = strategy.map(functools.partial(as_called, target))

        def run_property(batch: Batch) -> None:
            observe(batch, reach)
            if around is None:
                check(target, batch, device)
            else:
                around(batch, lambda: check(target, batch, device))

        run_property.__qualname__ = run_property.__name__ = f"c128a_{self.name}"
        add_digest(run_property, f"c128a:{self.name}")
        test = given(batch=strategy)(run_property)
        for batch in reversed(self.examples if examples else ()):
            test = example(batch=as_called(target, batch))(test)
        if seed is not None:
            test = use_seed(seed)(test)  # before settings: @seed alone drops the database
        return settings(test) if settings is not None else test

    def replay(self, target, batch: Batch, device) -> None:
        """Run the check once on a saved ``batch``, without Hypothesis, at
        the widths ``target``'s engine calls it at (:func:`as_called`)."""
        self.check(target, as_called(target, batch), device)


def as_called(target, batch: Batch) -> Batch:
    """``batch`` as ``target``'s engine would call it. Unchanged for a target
    held to the project's policy; for one bringing its own (a fixed-width
    builder's is W = C), a width its policy never returns for this
    capacity becomes the one it returns for the step, and so does an
    earlier step's, and a fixed-width builder's prefill buffer is as wide as
    its decode buffer. The explicit examples and saved cases, written at the
    project's widths, are checked so, and so are drawn steps (whose widths
    already are the policy's, where a strategy draws them)."""
    if getattr(target, "uses_project_policy", True):
        return batch
    reachable = target_reachable_widths(target, batch.capacity, batch.compress_ratio)
    changes = {}
    if batch.width not in reachable:
        changes["width"] = target_width(target, batch.max_seq_len, batch.compress_ratio,
                                        batch.capacity)
    if batch.prior_width and batch.prior_width not in reachable:
        changes["prior_width"] = 0  # the widest the buffers allow
        columns = batch.prior.columns if batch.prior is not None else 0
        if columns:
            # The earlier step's buffers at a reused address hold ``columns``:
            # the widest the policy returns within them, else no reuse.
            fitting = [w for w in reachable if w <= columns]
            if fitting:
                changes["prior_width"] = max(fitting)
            else:
                changes["prior"] = dataclasses.replace(batch.prior, columns=0)
    if getattr(target, "fixed_width", False) and batch.prefill_extra_columns:
        changes["prefill_extra_columns"] = 0
    return dataclasses.replace(batch, **changes) if changes else batch


def observe(batch: Batch, reach: Exclusions = ONE_BUILD) -> None:
    """Report where the step falls in the input space (``event``, one per
    dimension ``reach`` leaves in; the cells of its pairs and triples follow
    from them and are counted by ``c128a fuzz`` and ``c128a reach``,
    :mod:`c128a.strategies.pairs`) and how big it was (``target``)."""
    for label in labels_of(batch, reach):
        event(label)
    for score, label in (
        (batch.num_tokens, "tokens"),
        (max(batch.width, 0).bit_length(), "width doublings"),
    ):
        try:
            hypothesis_target(float(score), label=label)
        except HypothesisInvalidArgument:
            pass  # a label may be observed once per example; a nested draw did


# ---------------------------------------------------------------- strategies


def _token_budget(max_tokens: int | None, budget: SizeBudget | None, default: int = 32) -> dict:
    """Keywords of :func:`~c128a.strategies.batches` for steps of up to
    ``max_tokens`` tokens (the property's ``default`` size for None): enough
    decode requests (8 tokens each at most) and prefill chunk length to reach
    it; engine-scale steps within ``budget``."""
    if max_tokens is None:
        return {"max_tokens": default, "budget": budget}
    return {
        "max_tokens": max_tokens,
        "max_decode_requests": max(6, max_tokens // 8),
        "max_prefill_chunk": max(24, max_tokens // 4),
        "budget": budget,
    }


def engine_steps(target, max_tokens=None, budget=None) -> SearchStrategy[Batch]:
    return batches(target, **_token_budget(max_tokens, budget))


def steps_with_decode(target, max_tokens=None, budget=None) -> SearchStrategy[Batch]:
    # Every bad-input case that needs a decode token applies.
    return batches(target, min_decode_requests=1, **_token_budget(max_tokens, budget))


def views_steps(target, max_tokens=None, budget=None) -> SearchStrategy[Batch]:
    # Half the steps speculative with more decode rows than one 64-row block
    # (vllm#53574: a consumer checks contiguity only above 64 rows); both
    # halves engine-scale at the budget's rate.
    many = max(max_tokens or 0, 96)
    return st.one_of(
        engine_steps(target, max_tokens, budget),
        batches(target, max_tokens=many, min_decode_requests=12, max_decode_requests=16,
                max_prefill_requests=1, max_prefill_chunk=8, budget=budget),
    )


def policy_width_steps(target, max_tokens=None, budget=None) -> SearchStrategy[Batch]:
    # Two builds, one at the full capacity (up to 8,192 columns): fewer tokens.
    return batches(target, widths="policy", **_token_budget(max_tokens, budget, default=16))


def other_geometry_steps(target, max_tokens=None, budget=None) -> SearchStrategy[Batch]:
    return batches(target, geometries=True, **_token_budget(max_tokens, budget))


def history_steps(target, max_tokens=None, budget=None) -> SearchStrategy[Batch]:
    """Engine steps (widths "any": a W below C leaves the earlier, wider step's
    columns [W, C) behind), each recording the width of the earlier step built
    into its buffers before it (``prior_width``: narrower, the same, wider)
    and its shape (``prior``, :func:`~c128a.strategies.shape_history.with_shape_history`:
    more or fewer decode and prefill rows, across 64-row blocks, another R
    and B, its buffers placed otherwise); one in four with up to 72 decode
    rows, often more than one 64-row block. The pair a build is judged on, the step and that
    earlier step, is derived from the one drawn step
    (:func:`~c128a.checks.prior_content.earlier_step`,
    :func:`~c128a.checks.prior_shape.shaped_earlier_step`), and so is the
    random prior content's seed: the saved Batch alone replays all of it.
    Four builds an example: fewer tokens by default."""
    many = max(max_tokens or 0, 72)
    steps = batches(target, prior_widths=True, **_token_budget(max_tokens, budget, default=16))
    many_decode_rows = batches(target, prior_widths=True, max_tokens=many, min_decode_requests=9,
                               max_decode_requests=12, max_prefill_requests=1, max_prefill_chunk=4,
                               budget=budget)
    return with_shape_history(st.one_of(steps, steps, steps, many_decode_rows))


def consumer_steps(target, max_tokens=None, budget=None) -> SearchStrategy[Batch]:
    """Engine steps of up to 32 tokens (consumers are launched per token,
    some over a grid of 256 workers a request: no engine-scale steps under
    the interpreter, none past the engine's caps), the width the policy's
    or any other."""
    return batches(target, beyond_caps=False, **_token_budget(max_tokens, None))


def decode_only_steps(target, max_tokens=None, budget=None) -> SearchStrategy[Batch]:
    """Decode-only steps (what an engine replays through its FULL CUDA
    graphs), as :func:`consumer_steps` otherwise."""
    return batches(target, min_decode_requests=1, max_prefill_requests=0, beyond_caps=False,
                   **_token_budget(max_tokens, None))


def engine_config_steps(target, max_tokens=None, budget=None) -> SearchStrategy[Batch]:
    """Steps of one engine configuration each (a drawn max_model_len, the
    engine's R and B, within the engine's caps), at the policy's width: what
    the warm-up is for. The model length is the step's own draw, so that a
    row of the covering array steers it (a width of 8,192 needs one of
    4,096 R at least)."""
    return batches(target, widths="policy", engine_geometry=True, beyond_caps=False,
                   **_token_budget(max_tokens, None))


def _needs_keyed_launchers(target) -> str | None:
    if has_keyed_launchers(target):
        return None
    return (
        f"target {target} launches nothing through a keyed launcher (a JIT-kernel class "
        "declaring its warm-up keys): no compile keys to check"
    )


def model_lengths(target, max_tokens=None, budget=None) -> SearchStrategy[Batch]:
    # Only max_model_len and R matter; no tokens keeps the draw cheap.
    return batches(target, max_tokens=0, max_buffer_rows=8, geometries=True)


# ---------------------------------------------------------------- checks of one batch


def _matches_oracle(target, batch: Batch, device) -> None:
    check_matches_oracle(target, build(target, batch, device))


def _views(target, batch: Batch, device) -> None:
    check_views(target, build(target, batch, device))


def _untouched_memory(target, batch: Batch, device) -> None:
    buffers = Buffers.for_batch(batch, device)
    before = Buffers.for_batch(batch, "cpu")  # the same poison, known without a read-back
    check_untouched_memory(target, build(target, batch, device, buffers=buffers), before)


def _padding(target, batch: Batch, device) -> None:
    check_padding(target, build(target, batch, device))


def _other_geometries(target, batch: Batch, device) -> None:
    """Invariant: every one-build check (views, oracle equality, padding,
    untouched memory) holds at compress ratios and block sizes other than the
    engine's 128 and 2: the kernel-level function takes both as arguments."""
    check_step(target, batch, device)


def _width_policy(target, batch: Batch, device) -> None:
    check_width_policy(target, batch.max_model_len, batch.compress_ratio)


def _rejects_bad_input(target, batch: Batch, device) -> None:
    check_rejects_bad_input(target, batch, device)


def _needs_validation(target) -> str | None:
    if getattr(target, "validates_input", True):
        return None
    return (
        f"target {target} declares validates_input=False (vLLM checks with assert, which "
        "python -O strips): bad input is not refused with a ValueError"
    )


def _property(name: str, check: Check, strategy=engine_steps, invariant=None, examples=(),
              **options):
    """A property running the historical steps, then its own ``examples``, first."""
    doc = ((invariant or check).__doc__ or "").strip()
    examples = (*HISTORICAL_BATCHES.values(), *examples)
    return Property(name, strategy, check, doc=doc, examples=examples, **options)


PROPERTIES: dict[str, Property] = {
    prop.name: prop
    for prop in (
        _property("matches_oracle", _matches_oracle, invariant=check_matches_oracle,
                  examples=tuple(KERNEL_EXAMPLES.values())),
        _property("adaptive_equals_full", check_adaptive_equals_full, policy_width_steps,
                  reach={**ONE_BUILD, **POLICY_WIDTHS_ONLY, "width against need": (
                      "narrower than the longest list (clamps)",
                      "wider than the policy's, below C")}),
        _property("views", _views, views_steps, invariant=check_views),
        _property("untouched_memory", _untouched_memory, invariant=check_untouched_memory,
                  examples=tuple(LAYOUT_EXAMPLES.values())),
        _property("padding", _padding, invariant=check_padding),
        _property("idempotent", check_idempotent),
        _property("independent", check_independent),
        _property(
            "rejects_bad_input", _rejects_bad_input, steps_with_decode,
            invariant=check_rejects_bad_input, unsupported=_needs_validation,
            reach={**ONE_BUILD, "tokens T": ("0",), "requests": ("0",), "decode rows": ("0",),
                   "decode/prefill mix": ("no tokens", "prefill only")},
        ),
        _property("width_policy", _width_policy, model_lengths, invariant=check_width_policy,
                  reach=MODEL_LENGTH_ONLY),
        _property("other_geometries", _other_geometries, other_geometry_steps),
        _property("history_independent", check_history_independent, history_steps,
                  examples=tuple(SHAPE_HISTORY_EXAMPLES.values()), reach={}),
        _property("consumers", check_consumers, consumer_steps,
                  reach={**CONSUMER_REACH, **SMALL_STEPS}),
        _property("consumers_replay", check_consumers_replayed, decode_only_steps,
                  reach={**REPLAY_REACH, **SMALL_STEPS, **DECODE_ONLY_PAIRS}),
        _property("compile_keys", check_compile_keys, engine_config_steps,
                  unsupported=_needs_keyed_launchers,
                  # The policy's widths: one wider than the real tokens need
                  # only where a padding token's stale position set it.
                  reach={**COMPILE_KEY_REACH, **SMALL_STEPS, **POLICY_WIDTHS_ONLY,
                         "width against need": ("wider than the policy's, below C",)}),
    )
}
"""Property name -> :class:`Property`; names match the kill matrix's columns."""
