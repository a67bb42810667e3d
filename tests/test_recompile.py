"""No recompiles mid-inference: after one warm-up at the largest width, no
width the policy can produce, token count, row stride or block-table stride
makes Triton compile the kernel again (the bug that hung one tensor-parallel
rank in a compile at >524K context).

On CUDA the compiled-variant cache is counted directly
(:mod:`c128a.checks.recompiles`; the selected target's sweep is
:mod:`c128a.conformance.test_recompiles`); the same sweep
against ``c128a.kernels.mutants:width_specialised`` (width as ``tl.constexpr``)
must grow it. On the CPU, where the interpreter compiles nothing, the kernel's
signature is checked instead, and the mutant is shown to be exact in values,
so compile counting is what catches it.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from c128a.checks.recompiles import (
    BLOCK_SIZE,
    CAPACITY,
    ROWS,
    compiled_variants_around_sweep,
    launch_arguments,
)
from c128a.contract import policy
from c128a.step import Batch, build


def _kernel_and_launch(name: str):
    """(JIT functions, launch) of the project's kernel or the width mutant."""
    if name == "project":
        from c128a.kernels import adaptive

        return adaptive.jit_functions, adaptive.launch
    from c128a.kernels.mutants import width_specialised

    return width_specialised.jit_functions, width_specialised.launch


@pytest.mark.cuda
def test_warmed_kernel_never_recompiles(c128a_device):
    warmed, after = compiled_variants_around_sweep(*_kernel_and_launch("project"), c128a_device)
    assert warmed >= 1, "the compiled-variant count saw no variant after the warm-up launch"
    assert after == warmed, (
        f"the kernel compiled {after - warmed} new variant(s) after warm-up at W={CAPACITY}: "
        "some width, token count or stride is in Triton's specialisation key"
    )


@pytest.mark.cuda
@pytest.mark.parametrize(
    "first", [(128, 4, 4), (128, 24, 1000), (CAPACITY, 4, 4)],
    ids=["single rows first", "row blocks first", "wide rows first"],
)
def test_the_first_launch_compiles_all_three_variants(first, c128a_device):
    """Three variants: row blocks and single rows (below WIDE_W, a large and
    a small batch) and wide rows; whichever comes first, its launch compiles
    all three, and the other two compile nothing more."""
    from c128a.kernels import adaptive
    from c128a.kernels.compiled import compiled_variant_count, forget_compiled_variants

    def compiled() -> dict:
        return {f.__name__: compiled_variant_count(f, c128a_device) for f in adaptive.jit_functions}

    multiprocessors = torch.cuda.get_device_properties(c128a_device).multi_processor_count
    assert 24 + 1000 > adaptive.SINGLE_ROW_TOKENS_PER_SM * multiprocessors, (
        "the large batch would be written in single rows on this GPU: make it larger"
    )
    for jit_function in adaptive.jit_functions:
        forget_compiled_variants(jit_function)
    adaptive.forget_launch_plans()
    pages = CAPACITY // BLOCK_SIZE
    table = torch.arange(64 * pages, dtype=torch.int32, device=c128a_device).view(64, pages)
    dense = torch.zeros(ROWS, CAPACITY, dtype=torch.int32, device=c128a_device)
    prefill = torch.zeros_like(dense)
    batches = [first] + [b for b in [(128, 4, 4), (128, 24, 1000), (CAPACITY, 4, 4)] if b != first]
    for width, num_decode, num_prefill in batches:
        adaptive.launch(launch_arguments(
            c128a_device, width, num_decode, num_prefill, dense, prefill, table
        ))
        torch.cuda.synchronize(c128a_device)
        assert compiled() == {"c128a_row_blocks_kernel": 2, "c128a_wide_rows_kernel": 1}


@pytest.mark.cuda
def test_inert_padding_flag_shares_the_warmed_variant(c128a_device):
    """The inert padding-row variant is a runtime flag: warmed with the slots
    variant alone, a sweep with the flag on (and off) compiles nothing new."""
    from c128a.kernels import adaptive

    def both(args):
        adaptive.launch(args, inert_padding=True)
        adaptive.launch(args)

    warmed, after = compiled_variants_around_sweep(
        adaptive.jit_functions, both, c128a_device, warm_up=adaptive.launch
    )
    assert warmed >= 1 and after == warmed, (
        f"the inert_padding flag compiled {after - warmed} new variant(s): it is in "
        "Triton's specialisation key"
    )


@pytest.mark.cuda
@pytest.mark.slow
def test_width_specialised_mutant_is_caught_by_compile_counting(c128a_device):
    warmed, after = compiled_variants_around_sweep(
        *_kernel_and_launch("width_specialised"), c128a_device
    )
    assert after > warmed, (
        f"a kernel with the width as tl.constexpr compiled no new variant ({warmed} -> {after}); "
        "the compile count cannot see width specialisation"
    )


def _parameter_kinds(jit_kernel) -> tuple[set[str], set[str], set[str]]:
    """(runtime scalars, constexprs, do_not_specialize names) of a kernel,
    compiled (JITFunction) or interpreted (InterpretedFunction)."""
    from c128a.kernels.launch_keys import constexpr_parameters, unspecialised_parameters

    names = list(inspect.signature(jit_kernel.fn).parameters)
    constexprs = constexpr_parameters(jit_kernel)
    scalars = {n for n in names if not n.endswith("_ptr") and n not in constexprs}
    return scalars, constexprs, unspecialised_parameters(jit_kernel)


def specialisation_problems(jit_kernel, tile_constexprs: set[str]) -> list[str]:
    """Why ``jit_kernel`` could compile a new variant for a new batch: a
    runtime scalar left specialisable, or a compile-time constant other than
    the tile sizes."""
    scalars, constexprs, unspecialised = _parameter_kinds(jit_kernel)
    problems = [f"{n} is not in do_not_specialize" for n in sorted(scalars - unspecialised)]
    problems += [f"{n} is a constexpr" for n in sorted(constexprs - tile_constexprs)]
    return problems


def test_every_runtime_scalar_is_unspecialised():
    from c128a.kernels import adaptive as kernel

    tiles = {"row blocks": {"BLOCK_T", "BLOCK_W"}, "wide rows": {"WIDE_W"}}
    kernels = {"row blocks": kernel.c128a_row_blocks_kernel, "wide rows": kernel.c128a_wide_rows_kernel}
    for name, jit_kernel in kernels.items():
        scalars, constexprs, _ = _parameter_kinds(jit_kernel)
        assert scalars == set(kernel.RUNTIME_SCALARS[name]), name
        assert constexprs == tiles[name], name
        assert specialisation_problems(jit_kernel, tiles[name]) == [], name


def test_baseline_kernel_specialises_on_nothing_from_the_batch():
    from c128a.kernels import baseline

    assert specialisation_problems(baseline.baseline_topk_kernel, {"COLUMNS"}) == []


def test_signature_check_flags_the_width_mutant():
    from c128a.kernels.mutants import width_specialised

    (jit_kernel,) = width_specialised.jit_functions
    problems = specialisation_problems(jit_kernel, {"BLOCK_T", "BLOCK_W"})
    assert problems == ["WIDTH is a constexpr"]


@st.composite
def small_batches(draw) -> Batch:
    """Small valid batches at any reachable width of a small capacity, decode
    requests of 1..3 tokens then prefill tokens. Shrinks towards fewer tokens,
    position 0 and the smallest width."""
    capacity = draw(st.sampled_from([128, 256, 384]))
    width = draw(st.sampled_from(policy.reachable_widths(capacity)))
    tokens_per_request = draw(st.lists(st.integers(1, 3), max_size=4))
    num_decode = sum(tokens_per_request)
    num_prefill = draw(st.integers(0, 6))
    max_position = capacity * policy.COMPRESS_RATIO + policy.COMPRESS_RATIO - 1
    positions = draw(
        st.lists(
            st.integers(0, max_position),
            min_size=num_decode + num_prefill,
            max_size=num_decode + num_prefill,
        )
    )
    table_width = capacity // BLOCK_SIZE
    bases = [draw(st.integers(0, 1 << 20)) for _ in tokens_per_request]
    requests = [r for r, n in enumerate(tokens_per_request) for _ in range(n)]
    return Batch(
        positions=tuple(positions),
        num_decode_tokens=num_decode,
        token_to_req_indices=tuple(requests + [len(bases)] * num_prefill),
        block_table=tuple(tuple(base + 3 * j for j in range(table_width)) for base in bases),
        slot_mapping=tuple(draw(st.integers(-1, 50)) for _ in positions),
        max_model_len=capacity * policy.COMPRESS_RATIO,
        capacity=capacity,
        width=width,
        buffer_rows=num_decode + num_prefill + 1,
        block_table_row_stride=table_width + draw(st.integers(0, 3)),
    )


@settings(max_examples=15)
@given(batch=small_batches())
def test_width_specialised_mutant_is_exact_in_values(batch, c128a_device):
    from c128a.contract import oracle
    from c128a.kernels.mutants import width_specialised

    got = build(width_specialised, batch, c128a_device).buffers
    want = build(oracle, batch, c128a_device).buffers
    for name, g, w in zip(("global_decode", "decode_lens", "prefill"), got.as_tuple(), want.as_tuple()):
        assert torch.equal(g, w), f"{name} differs from the oracle at W={batch.width}"


def test_project_kernel_target_names_its_jit_functions():
    """The `triton` target exposes what it launches, so the recompile sweep
    through any target (above) covers it too."""
    from c128a.kernels import adaptive
    from c128a.targets import load_target

    kernels = (adaptive.c128a_row_blocks_kernel, adaptive.c128a_wide_rows_kernel)
    assert load_target("triton").jit_functions == kernels
    assert load_target("triton-inert").jit_functions == kernels


CONSUMER_MODEL_LEN = 262_144  # C = 2048: widths 128 ... 2048


def _steps_at_every_width(target):
    """One engine step (two decode requests, a prefill chunk of three) whose
    longest sequence needs each width the policy reaches for C = 2048."""
    from c128a.contract import capacity_width, target_width
    from c128a.step import StepRequest, assemble_batch

    capacity = capacity_width(CONSUMER_MODEL_LEN)
    for width in policy.reachable_widths(capacity):
        seq_len = min(width * policy.COMPRESS_RATIO, CONSUMER_MODEL_LEN)
        pages = -(-seq_len // 256)
        table = tuple(tuple(range(r * pages, (r + 1) * pages)) for r in range(2))
        yield assemble_batch(
            [StepRequest.last(seq_len, 1), StepRequest.last(seq_len // 2 + 1, 1)],
            [StepRequest.last(seq_len, 3)],
            block_table=table, max_model_len=CONSUMER_MODEL_LEN, capacity=capacity,
            width=target_width(target, seq_len, policy.COMPRESS_RATIO, capacity),
            buffer_rows=16,
        )


@pytest.mark.cuda
@pytest.mark.compile_keys
def test_compiled_variants_agree_with_the_cpu_compile_key_verdict(c128a_target, c128a_device):
    """Every keyed launcher of the target (its builder's, its consumers')
    warmed as its own warm-up declares (compiled, nothing run), then engine
    steps at every policy width built and consumed for real: the compiled
    variants grow by exactly the distinct keys the CPU check finds unwarmed."""
    from c128a.checks.compile_keys import engine_step, has_keyed_launchers, step_launches
    from c128a.checks.consumers import consumers_of
    from c128a.kernels.compiled import compiled_variant_count, forget_compiled_variants
    from c128a.kernels.launch_keys import engine_config, warm_up, warmed_keys
    from c128a.step.consumer_inputs import ConsumerInputs

    if not has_keyed_launchers(c128a_target):
        pytest.skip(f"target {c128a_target} launches nothing through a keyed launcher")
    # Launchers that declare their warm-up (a launcher that warms itself at
    # its first launch, as the project's kernel does, is test_warmed_kernel_never_recompiles').
    launchers = [
        launcher for launcher in (*c128a_target.launchers, *(
            launcher for consumer in consumers_of(c128a_target) for launcher in consumer.launchers))
        if hasattr(launcher, "get_warmup_keys")
    ]
    if not launchers:
        pytest.skip(f"target {c128a_target} has no launcher declaring its warm-up keys")
    config = engine_config(CONSUMER_MODEL_LEN)
    for launcher in launchers:
        forget_compiled_variants(launcher.kernel)
        warm_up(launcher, config, c128a_device)
    torch.cuda.synchronize(c128a_device)

    def variants() -> int:
        return sum(compiled_variant_count(launcher.kernel, c128a_device) for launcher in launchers)

    warmed_count = variants()
    unwarmed = set()
    for batch in _steps_at_every_width(c128a_target):
        batch = engine_step(c128a_target, batch)
        for who, launcher, key in step_launches(c128a_target, batch, c128a_device):
            if launcher in launchers and key not in warmed_keys(launcher, config):
                unwarmed.add((id(launcher), key))
        result = build(c128a_target, batch, c128a_device)
        inputs = ConsumerInputs.from_build(result)
        for consumer in consumers_of(c128a_target):
            consumer(inputs)
    torch.cuda.synchronize(c128a_device)
    grown = variants() - warmed_count
    # Both counts, for the record of a GPU run (pytest -s shows them).
    print(f"{c128a_target}: {grown} variant(s) compiled after the warm-up; "
          f"{len(unwarmed)} unwarmed launch key(s) found by the CPU check")
    assert grown == len(unwarmed), (
        f"the GPU compiled {grown} variant(s) after the warm-up; the CPU compile-key check "
        f"finds {len(unwarmed)} launch key(s) the warm-up does not compile"
    )


# The engine's own warm-up (c128a.checks.engine_warm_up) ------------------------------

WIDEST_UNWARMED = "c128a.kernels.keyed:widest_unwarmed"
KEYED = "c128a.kernels.keyed:target"


def test_serving_trace_crosses_every_width_both_ways():
    from c128a.checks.engine_warm_up import TRACE_MODEL_LEN, serving_trace
    from c128a.contract import capacity_width
    from c128a.targets import load_target

    trace = serving_trace(load_target(KEYED))
    widths = [batch.width for _, batch in trace[::3]]
    reachable = policy.reachable_widths(capacity_width(TRACE_MODEL_LEN))
    assert widths == reachable + reachable[-2::-1]
    assert {batch.num_decode_tokens for _, batch in trace} >= {0, 1, 3, 10}
    assert any(min(batch.slot_mapping) < 0 for _, batch in trace), "no padding token"
    assert all(b.buffer_row_padding == 0 and b.prefill_extra_columns == 0 and not b.buffer_pooled
               for _, b in trace), "not the engine's buffers (rows of C columns)"


def test_engine_warm_up_plan_of_the_keyed_target_holds_every_trace_launch(c128a_device):
    from c128a.checks.engine_warm_up import warm_up_plan_misses
    from c128a.targets import load_target

    assert warm_up_plan_misses(load_target(KEYED), c128a_device) == []


def test_engine_warm_up_plan_of_the_mutant_misses_the_widest_width(c128a_device):
    """The mutant's declared warm-up stops below C: the trace's steps at
    W = C launch a key its warm-up never compiles, so the GPU check (which
    warms up exactly this plan) sees them compile after the warm-up."""
    from c128a.checks.engine_warm_up import TRACE_MODEL_LEN, warm_up_plan_misses
    from c128a.contract import capacity_width
    from c128a.targets import load_target

    capacity = capacity_width(TRACE_MODEL_LEN)
    misses = warm_up_plan_misses(load_target(WIDEST_UNWARMED), c128a_device)
    assert len(misses) == 3, misses  # the decode, mixed and prefill-only steps at W = C
    for miss in misses:
        assert f"parameter WIDTH = constexpr {capacity} at launch" in miss, miss
        assert f"W={capacity}, capacity={capacity}" in miss and "trace step" in miss, miss


def _compile(kernel, width: int, during: str):
    from c128a.kernels.compiled import Compile

    return Compile(kernel="keyed_build_kernel", key=f"key-{width}",
                   parameters=(("WIDTH", f" = {width}"),), options=(("num_warps", 4),),
                   warm_up=during == "warm-up", during=during, jit_function=kernel)


def _engine_run(after=(), unfinished=(), warm_up=True, launches=27, kernel=None):
    from c128a.checks.engine_warm_up import EngineWarmUp

    kernel = kernel or object()
    return kernel, EngineWarmUp(
        warm_up=(_compile(kernel, 128, "warm-up"),) if warm_up else (),
        after=tuple(after), unfinished=tuple(unfinished), warmed_kernels=(kernel,),
        launches=launches)


def test_engine_warm_up_verdict_fails_on_a_compile_after_warm_up():
    from c128a.checks.engine_warm_up import check_no_compile_after_warm_up
    from c128a.failures import InvariantViolation

    kernel = object()
    late = _compile(kernel, 2048, "trace step 13 (decode): W=2048, capacity=2048; decode 0..0")
    _, run = _engine_run(after=[late], unfinished=[late], kernel=kernel)
    with pytest.raises(InvariantViolation) as raised:
        check_no_compile_after_warm_up("keyed", run)
    message = str(raised.value)
    for part in ("[engine_warm_up]", "1 compile(s) after the engine's warm-up",
                 "keyed_build_kernel(WIDTH = 2048; num_warps=4)", "trace step 13",
                 "started, never finished"):
        assert part in message, (part, message)


def test_engine_warm_up_verdict_passes_without_late_compiles_of_warmed_kernels():
    from c128a.checks.engine_warm_up import check_no_compile_after_warm_up

    undeclared = _compile(object(), 128, "trace step 1")  # a kernel no launcher warms up
    kernel, run = _engine_run(after=[undeclared])
    check_no_compile_after_warm_up("keyed", run)
    assert run.not_judged() == [undeclared] and run.judged() == []


@pytest.mark.parametrize("missing", ["warm-up compiles", "launches"])
def test_engine_warm_up_verdict_is_an_error_when_nothing_was_checked(missing):
    from c128a.checks.engine_warm_up import check_no_compile_after_warm_up
    from c128a.failures import HarnessError

    _, run = _engine_run(warm_up=missing != "warm-up compiles",
                         launches=0 if missing == "launches" else 27)
    with pytest.raises(HarnessError, match="nothing was checked"):
        check_no_compile_after_warm_up("keyed", run)


@pytest.mark.cuda
@pytest.mark.parametrize("spec, kills", [(WIDEST_UNWARMED, True), (KEYED, False)],
                         ids=["widest_unwarmed is killed", "keyed survives"])
def test_engine_warm_up_check_on_the_gpu(spec, kills, c128a_device):
    """The check itself on a GPU: the mutant's steps at W = C compile after
    its warm-up; the keyed target's never do."""
    from c128a.checks.engine_warm_up import check_no_compile_after_warm_up, run_engine_warm_up
    from c128a.failures import InvariantViolation
    from c128a.targets import load_target

    run = run_engine_warm_up(load_target(spec), c128a_device)
    if kills:
        with pytest.raises(InvariantViolation, match="WIDTH = 2048"):
            check_no_compile_after_warm_up(spec, run)
    else:
        check_no_compile_after_warm_up(spec, run)


class SimulatedTriton:
    """Triton's in-process cache, simulated on the CPU where nothing
    compiles: a kernel holds a variant per launch key (the model of
    :mod:`c128a.kernels.launch_keys`); a warm-up or a launch of a key it
    does not hold compiles it, calling Triton's hooks with the keywords of
    Triton's hook protocol (the constexprs' values in ``constants``)."""

    def __init__(self):
        self.held: set = set()

    def forget(self, kernel) -> None:
        self.held = {(k, key) for k, key in self.held if k != id(kernel)}

    def compile(self, kernel, arguments: dict, warm_up: bool) -> None:
        import triton

        from c128a.kernels.launch_keys import kernel_name, launch_key

        key = launch_key(kernel, arguments)
        if (id(kernel), key) in self.held:
            return
        self.held.add((id(kernel), key))
        signature = {name: "constexpr" if kind.startswith("constexpr") else kind
                     for name, kind in key.parts}
        constants = {(i,): int(kind.split()[1]) for i, (_, kind) in enumerate(key.parts)
                     if kind.startswith("constexpr") and kind.split()[1].isdigit()}
        hook_arguments = dict(
            key=str(key.parts), repr=kernel_name(kernel),
            fn=SimpleNamespace(module=None, name=kernel_name(kernel), jit_function=kernel),
            compile={"signature": signature, "constants": constants},
            is_manual_warmup=warm_up, already_compiled=False)
        runtime = triton.knobs.runtime
        if not (runtime.jit_cache_hook and runtime.jit_cache_hook(**hook_arguments)):
            if runtime.jit_post_compile_hook:
                runtime.jit_post_compile_hook(**hook_arguments)


@pytest.fixture
def simulated_triton(monkeypatch):
    """The keyed kernel's warm-up and launches go through :class:`SimulatedTriton`
    (launches are recorded, not run: nothing here reads the views)."""
    from c128a.kernels import compiled, vllm_shims
    from c128a.kernels.keyed import keyed_build_kernel

    triton = SimulatedTriton()
    report = vllm_shims.report_launch

    def launched(owner, kernel, grid, arguments):
        report(owner, kernel, grid, arguments)
        triton.compile(kernel, arguments, warm_up=False)
        return False

    monkeypatch.setattr(keyed_build_kernel, "warmup",
                        lambda grid, **given: triton.compile(keyed_build_kernel, given, True),
                        raising=False)
    monkeypatch.setattr(vllm_shims, "report_launch", launched)
    monkeypatch.setattr(compiled, "forget_compiled_variants", triton.forget)
    return triton


@pytest.mark.parametrize("spec, kills", [(WIDEST_UNWARMED, True), (KEYED, False)],
                         ids=["widest_unwarmed is killed", "keyed survives"])
def test_engine_warm_up_check_end_to_end_on_a_simulated_triton(spec, kills, simulated_triton,
                                                                 c128a_device):
    """The whole check (warm-up, trace, hooks, verdict) with Triton's cache
    simulated: what it does on a GPU, where Triton itself decides what compiles."""
    from c128a.checks.engine_warm_up import check_no_compile_after_warm_up, run_engine_warm_up
    from c128a.failures import InvariantViolation
    from c128a.targets import load_target

    run = run_engine_warm_up(load_target(spec), c128a_device)
    assert len(run.warm_up) == (4 if kills else 5) and all(c.warm_up for c in run.warm_up)
    assert run.launches == 27, run.launches
    if not kills:
        check_no_compile_after_warm_up(spec, run)
        return
    with pytest.raises(InvariantViolation) as raised:
        check_no_compile_after_warm_up(spec, run)
    message = str(raised.value)
    assert "1 compile(s) after the engine's warm-up" in message, message
    assert "WIDTH = 2048" in message and "trace step 13 (decode): W=2048" in message, message
