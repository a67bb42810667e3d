"""Compile-key coverage: every launch of an engine step was warmed up.

For a target whose builder or consumers launch through keyed launchers
(vLLM's JIT-kernel classes, :mod:`c128a.kernels.launch_keys`): the compile
key each launch of a step takes (what Triton specialises on) must be one of
the keys that launcher's own warm-up compiles for the engine's
configuration (max_model_len, the 256-token KV page, compress ratios 4 and
128). A launch outside them compiles during inference (vllm#48809). On the
CPU nothing is compiled or run: the launches are worked out, not made.

A target that declares keyed launchers must launch through them: a step
with tokens whose build launches through none of the builder's declared
launchers (a wrapper that calls the kernel directly, a fallback to torch on
this device), or whose consumers launch through none of theirs, compared
no key, and fails (it is not a pass, and not "not applicable": the target
claims the capability). A target that declares none does not have this
check (:data:`NOT_KEYED`).
"""

from __future__ import annotations

import dataclasses

from ..contract import COMPRESS_RATIO, target_width
from ..failures import HarnessError, InvariantViolation, call_target
from ..step import Batch, Buffers, BuildResult, oracle_build
from ..step.buffers import tuple_of_views
from ..step.consumer_inputs import ConsumerInputs
from .consumers import consumers_of
from .diff import setting

NAME = "compile_keys"
PAGE_TOKENS = 256
NOT_KEYED = "the target declares no keyed launcher (launchers): it has no compile keys"
"""Why the check does not apply to a target without keyed launchers."""


def _keys():
    # The kernels' package imports Triton: imported on first use, after the
    # device is chosen.
    from ..kernels import launch_keys

    return launch_keys


def has_keyed_launchers(target) -> bool:
    return bool(getattr(target, "launchers", ()) or any(
        c.launchers for c in consumers_of(target)))


def engine_step(target, batch: Batch) -> Batch:
    """``batch`` as the engine runs it: the policy's width for its longest
    sequence, the engine's own buffers (fresh, rows of C columns)."""
    width = target_width(target, batch.max_seq_len, batch.compress_ratio, batch.capacity)
    return dataclasses.replace(batch, width=width, prefill_extra_columns=0, buffer_offset=0,
                               buffer_row_padding=0, buffer_pooled=False)


_WARMED: dict = {}


def warmed(launcher, max_model_len: int) -> list:
    """The keys ``launcher``'s warm-up compiles at ``max_model_len`` (cached)."""
    key = (id(launcher), max_model_len)
    if key not in _WARMED:
        keys = _keys()
        config = keys.engine_config(max_model_len, PAGE_TOKENS)
        if hasattr(launcher, "warmed_launch_keys"):  # declares its keys itself
            compiled = call_target(NAME, f"{type(launcher).__name__}.warmed_launch_keys",
                                   launcher.warmed_launch_keys, config)
        else:  # a JIT-kernel class: its get_warmup_keys through its own launch spec
            compiled = call_target(NAME, f"{type(launcher).__name__}.get_warmup_keys",
                                   keys.warmed_keys, launcher, config)
        _WARMED[key] = (launcher, compiled)
    return _WARMED[key][1]


def step_launches(target, batch: Batch, device) -> list[tuple[str, object, object]]:
    """(who launched, launcher, compile key) of every keyed launch of
    ``batch``: the builder's, then each consumer's fed its views."""
    keys = _keys()
    buffers = Buffers.for_batch(batch, device)
    args = batch.build_args(batch.tensors(device), buffers)
    launches = []
    if getattr(target, "launchers", ()):
        found = call_target(NAME, "build_c128a_topk_metadata", keys.runtime_keys,
                            lambda: launches.append(target.build_c128a_topk_metadata(*args)))
        views = tuple_of_views(launches.pop())
        result = BuildResult(batch=batch, width=batch.width, views=views, buffers=buffers)
        launches = [("build_c128a_topk_metadata", launcher, key) for launcher, key in found]
    else:
        result = oracle_build(batch, device, buffers=buffers)
    inputs = ConsumerInputs.from_build(result)
    for consumer in consumers_of(target):
        if consumer.launchers:
            found = call_target(NAME, f"consumer {consumer.name}", keys.runtime_keys,
                                lambda consumer=consumer: consumer(inputs))
            launches += [(f"consumer {consumer.name}", launcher, key) for launcher, key in found]
    return launches


def _names(launchers) -> str:
    return ", ".join(sorted({type(launcher).__name__ for launcher in launchers}))


def unexercised_launchers(target, batch: Batch, launches) -> str | None:
    """Why ``launches`` (of a step with tokens) compared no key of a party
    that declares keyed launchers: the builder launched through none of its
    own, or the consumers through none of theirs (None: each did). A step
    without tokens may launch nothing."""
    if batch.num_tokens == 0:
        return None
    declared = tuple(getattr(target, "launchers", ()))
    if declared and not any(any(launcher is d for d in declared)
                            for who, launcher, _ in launches
                            if who == "build_c128a_topk_metadata"):
        return (f"the target declares keyed launcher(s) {_names(declared)} for its build, but "
                f"building this step (T={batch.num_tokens}) launched through none of them, so "
                "no compile key of it was compared: its launches are hidden from the check (a "
                "builder that calls its kernel directly, or falls back to another path on this "
                "device); launch through the declared launcher, or declare none")
    consumer_launchers = tuple(l for c in consumers_of(target) for l in c.launchers)
    if consumer_launchers and not any(any(launcher is d for d in consumer_launchers)
                                      for who, launcher, _ in launches
                                      if who.startswith("consumer ")):
        return (f"the target's consumers declare keyed launcher(s) {_names(consumer_launchers)}, "
                f"but feeding them this step (T={batch.num_tokens}) launched through none of "
                "them, so no compile key of theirs was compared; launch through the declared "
                "launchers, or declare none")
    return None


def describe_miss(who: str, key, warmed_keys: list) -> str:
    """The parameters in which ``key`` differs from its nearest warmed key:
    each with the values the warm-up compiles for it, or, where it compiles
    the launch's value too, the values it pairs it with."""
    have = key.as_dict()
    if not warmed_keys:
        return f"{who} launches {key.kernel}, whose warm-up compiles no key at all"
    warmed_dicts = [w.as_dict() for w in warmed_keys]
    nearest = min(warmed_dicts, key=lambda w: sum(have.get(p) != v for p, v in w.items()))
    parts = []
    for parameter in [p for p, v in nearest.items() if have.get(p) != v]:
        value = have.get(parameter)
        paired = [w for w in warmed_dicts if w.get(parameter) == value]
        if not paired:
            values = sorted({w.get(parameter) for w in warmed_dicts}, key=str)
            parts.append(f"parameter {parameter} = {value} at launch, warmed: "
                         f"{', '.join(map(str, values))}")
            continue
        others = sorted({p for w in paired for p, v in w.items() if have.get(p) != v})
        with_it = ", ".join(
            f"{p} = {' or '.join(sorted({str(w.get(p)) for w in paired}))} (launch: {have.get(p)})"
            for p in others)
        parts.append(f"parameter {parameter} = {value} is warmed only with {with_it}")
    return (f"{who} launches {key.kernel} with a compile key its warm-up never compiles "
            f"(it compiles during inference): " + "; ".join(parts))


def check_compile_keys(target, batch: Batch, device, step: str = "") -> None:
    """Invariant: every keyed launch of the step, as the engine runs it
    (:func:`engine_step`), takes a compile key its launcher's warm-up
    compiles for the engine's configuration."""
    if batch.compress_ratio != COMPRESS_RATIO:
        raise HarnessError(
            f"compile keys are checked for the engine's configuration (R = {COMPRESS_RATIO}); "
            f"the step has compress_ratio={batch.compress_ratio}: draw engine steps"
        )
    batch = engine_step(target, batch)
    launches = step_launches(target, batch, device)
    unexercised = unexercised_launchers(target, batch, launches)
    if unexercised is not None:
        where = f"; step: {step}" if step else ""
        raise InvariantViolation(NAME, f"{unexercised}; {setting(batch, batch.width)}{where}")
    for who, launcher, key in launches:
        compiled = warmed(launcher, batch.max_model_len)
        if key not in compiled:
            where = f"; step: {step}" if step else ""
            raise InvariantViolation(
                NAME, describe_miss(who, key, compiled) + f" (engine max_model_len="
                f"{batch.max_model_len}, KV page {PAGE_TOKENS} tokens, compress ratios 4 and "
                f"128); {setting(batch, batch.width)}{where}")
