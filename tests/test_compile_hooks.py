"""Compiles counted through Triton's public hooks
(:func:`c128a.kernels.compiled.recorded_compiles`).

On the CPU, where nothing compiles, the wiring: the recorder is installed in
``triton.knobs.runtime``, chained with the hooks a team had set (which still
see every call and keep their veto), removed afterwards, and a compile
simulated with the keywords of Triton's own hook protocol is recorded with
its key. On a GPU, a real compile is counted once, with its key.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch
import triton

from c128a.failures import HarnessError
from c128a.kernels import compiled
from c128a.kernels.compiled import recorded_compiles

RUNTIME = triton.knobs.runtime
KERNEL = "keyed_build_kernel"


def simulated_compile(jit_function, key: str = "key-1", width: int = 2048,
                      warm_up: bool = False) -> dict:
    """The keywords Triton passes both hooks for one compile of a kernel
    with a pointer and a constexpr ``WIDTH`` (``triton.knobs.JITHook``)."""
    return dict(
        key=key,
        repr=f"{KERNEL}[num_warps=4](x_ptr: *i32, WIDTH: constexpr)",
        fn=SimpleNamespace(module=__name__, name=KERNEL, jit_function=jit_function),
        compile={"key": key, "signature": {"x_ptr": "*i32", "WIDTH": "constexpr"},
                 "constants": {(1,): width}, "num_warps": 4, "num_stages": 3, "num_ctas": 1,
                 "is_warmup": warm_up},
        is_manual_warmup=warm_up,
        already_compiled=False,
    )


@pytest.fixture
def team_hooks():
    """Hooks a team set before c128a runs (a JIT monitor's), put back after."""
    calls: list = []

    def cache_hook(**arguments):
        calls.append(("cache", arguments))

    def post_compile_hook(**arguments):
        calls.append(("post", arguments))

    saved = RUNTIME.jit_cache_hook, RUNTIME.jit_post_compile_hook
    RUNTIME.jit_cache_hook, RUNTIME.jit_post_compile_hook = cache_hook, post_compile_hook
    yield SimpleNamespace(calls=calls, cache=cache_hook, post=post_compile_hook)
    RUNTIME.jit_cache_hook, RUNTIME.jit_post_compile_hook = saved


@pytest.fixture
def no_hooks():
    saved = RUNTIME.jit_cache_hook, RUNTIME.jit_post_compile_hook
    RUNTIME.jit_cache_hook = RUNTIME.jit_post_compile_hook = None
    yield
    RUNTIME.jit_cache_hook, RUNTIME.jit_post_compile_hook = saved


def test_the_simulated_compile_speaks_tritons_hook_protocol():
    protocol = inspect.signature(triton.knobs.JITHook.__call__).parameters
    assert sorted(simulated_compile(None)) == sorted(p for p in protocol if p != "self"), (
        f"triton {triton.__version__} changed its JITHook keywords: adapt "
        "c128a.kernels.compiled.CompileRecorder.record and this simulation")


def test_the_recorder_is_chained_with_a_teams_hooks_and_removed(team_hooks):
    kernel = object()
    arguments = simulated_compile(kernel)
    with recorded_compiles() as recorder:
        assert RUNTIME.jit_cache_hook is not team_hooks.cache
        assert RUNTIME.jit_post_compile_hook is not team_hooks.post
        assert RUNTIME.jit_cache_hook(**arguments) is None, "the chained cache hook vetoed"
        RUNTIME.jit_post_compile_hook(**arguments)
    assert (RUNTIME.jit_cache_hook, RUNTIME.jit_post_compile_hook) == (
        team_hooks.cache, team_hooks.post), "the team's hooks were not put back"
    assert team_hooks.calls == [("cache", arguments), ("post", arguments)]
    (started,), (done,) = recorder.started, recorder.compiled
    assert started == done and done.jit_function is kernel and not done.warm_up
    assert (done.kernel, done.key) == (KERNEL, "key-1")
    assert done.describe() == f"{KERNEL}(x_ptr: *i32, WIDTH = 2048; num_warps=4, num_stages=3, num_ctas=1)"
    assert recorder.unfinished() == []
    RUNTIME.jit_post_compile_hook(**simulated_compile(kernel, key="key-2"))
    assert len(recorder.compiled) == 1, "a compile after leaving was recorded"


def test_the_recorder_leaves_no_hook_behind(no_hooks):
    with recorded_compiles() as recorder:
        RUNTIME.jit_cache_hook(**simulated_compile(object(), warm_up=True))
    assert RUNTIME.jit_cache_hook is None and RUNTIME.jit_post_compile_hook is None
    assert [c.warm_up for c in recorder.started] == [True]
    assert recorder.unfinished() == recorder.started, "a compile that never ended is not unfinished"


def test_a_teams_veto_is_kept_and_no_compile_is_recorded(team_hooks):
    RUNTIME.jit_cache_hook = lambda **arguments: True  # the team skips this compile
    with recorded_compiles() as recorder:
        assert RUNTIME.jit_cache_hook(**simulated_compile(object())) is True
    assert recorder.started == []


def test_only_the_given_kernels_are_recorded(no_hooks):
    watched, other = object(), object()
    with recorded_compiles([watched]) as recorder:
        RUNTIME.jit_post_compile_hook(**simulated_compile(other))
        recorder.during = "step 3"
        RUNTIME.jit_post_compile_hook(**simulated_compile(watched))
    assert [(c.jit_function, c.during) for c in recorder.compiled] == [(watched, "step 3")]


def test_a_recorder_fault_is_a_harness_error_after_the_compile(no_hooks):
    class Unreadable:
        @property
        def name(self):
            raise RuntimeError("no name")

    arguments = {**simulated_compile(None), "fn": Unreadable()}
    with pytest.raises(HarnessError, match="RuntimeError: no name"):
        with recorded_compiles():
            RUNTIME.jit_post_compile_hook(**arguments)  # Triton's compile goes on
    assert RUNTIME.jit_post_compile_hook is None


def test_a_triton_without_the_hooks_is_a_harness_error(monkeypatch):
    monkeypatch.setattr(compiled, "_runtime_knobs", lambda: SimpleNamespace())
    assert not compiled.compile_hooks_available()
    with pytest.raises(HarnessError, match="jit_post_compile_hook"):
        with recorded_compiles():
            pass


def launch_keyed_once(device, width: int = 128) -> None:
    """One build of ``c128a.kernels.keyed:target`` at ``width`` (C = width)
    on ``device``: one launch of its kernel."""
    from c128a.kernels.keyed import target
    from c128a.step import StepRequest, assemble_batch, build

    seq_len = width * 128
    pages = tuple(range(-(-seq_len // 256)))
    batch = assemble_batch([StepRequest.last(seq_len, 1)], [StepRequest.last(seq_len, 2)],
                           block_table=(pages,), max_model_len=seq_len, capacity=width,
                           width=width, buffer_rows=4)
    build(target, batch, device)


@pytest.mark.cuda
def test_the_hook_counts_a_real_compile_with_its_key(c128a_device):
    from c128a.kernels.keyed import keyed_build_kernel

    compiled.forget_compiled_variants(keyed_build_kernel)
    with recorded_compiles([keyed_build_kernel]) as recorder:
        launch_keyed_once(c128a_device)
        launch_keyed_once(c128a_device)  # the same key: no second compile
        torch.cuda.synchronize(c128a_device)
    assert len(recorder.compiled) == 1, [c.describe() for c in recorder.compiled]
    (done,) = recorder.compiled
    assert done.kernel == KERNEL and ("WIDTH", " = 128") in done.parameters, done.describe()
    assert recorder.unfinished() == []
