"""What Triton compiles: each compile as it happens, with its key, through
Triton's public hooks; and the variants a kernel already holds.

Triton calls ``triton.knobs.runtime.jit_cache_hook`` with a kernel's compile
key when a launch or a warm-up finds no variant for that key in the process,
before it compiles one, and ``jit_post_compile_hook`` once it is compiled
(both in Triton's ``knobs``: 3.6, the range's floor, and 3.9 have them).
:func:`recorded_compiles` puts a recorder in front of whatever hooks are set
(a team's own, vLLM's JIT monitor), which it keeps calling, and puts them
back afterwards. A compile that starts and never ends (the compile that hung
one tensor-parallel rank) is seen by the first hook alone, so both are read.

What a kernel already holds is Triton's private state:
:mod:`c128a.kernels.triton_private` reads it, re-exported here.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import triton

from ..failures import HarnessError
from .triton_private import compiled_variants, forget_compiled_variants

CACHE_HOOK = "jit_cache_hook"
POST_COMPILE_HOOK = "jit_post_compile_hook"
HOOKS = (CACHE_HOOK, POST_COMPILE_HOOK)
OPTIONS = ("num_warps", "num_stages", "num_ctas")


def interpreting(jit_function) -> bool:
    """Whether ``jit_function`` runs under Triton's interpreter."""
    return type(jit_function).__name__ == "InterpretedFunction"


def compiled_variant_count(jit_function, device: torch.device | str | int) -> int:
    """How many compiled variants ``jit_function`` holds for a CUDA device."""
    return len(compiled_variants(jit_function, device))


def _runtime_knobs():
    return getattr(getattr(triton, "knobs", None), "runtime", None)


def compile_hooks_available() -> bool:
    """Whether the installed Triton has both public compile hooks."""
    runtime = _runtime_knobs()
    return runtime is not None and all(hasattr(runtime, name) for name in HOOKS)


@dataclass(frozen=True)
class Compile:
    """One compile Triton reported: the kernel, its compile key (Triton's
    own text, and per parameter what it specialised on), the launch options,
    whether a compile-only warm-up asked for it, and what the recorder was
    told was going on (:attr:`CompileRecorder.during`)."""

    kernel: str
    key: str
    parameters: tuple[tuple[str, str], ...]
    options: tuple[tuple[str, Any], ...]
    warm_up: bool
    during: str = ""
    jit_function: Any = field(default=None, compare=False, repr=False)

    def describe(self) -> str:
        """``kernel(name: type, ..., WIDTH = 8192; num_warps=4, ...)``."""
        parts = ", ".join(f"{name}{value}" for name, value in self.parameters)
        options = ", ".join(f"{name}={value}" for name, value in self.options)
        return f"{self.kernel}({parts}{'; ' + options if options else ''})"


def _parameters(signature, constants) -> tuple[tuple[str, str], ...]:
    """(name, ": type" or " = value") per parameter: a constexpr's value is
    in ``constants``, keyed by its position path (Triton >= 3.3) or name."""
    if not isinstance(signature, dict):
        return ()
    constants = constants if isinstance(constants, dict) else {}
    parameters = []
    for index, (name, kind) in enumerate(signature.items()):
        if kind == "constexpr":
            value = constants.get((index,), constants.get(name, "?"))
            parameters.append((str(name), f" = {value!r}"))
        else:
            parameters.append((str(name), f": {kind}"))
    return tuple(parameters)


class CompileRecorder:
    """The compiles Triton reports while :func:`recorded_compiles` is in force.

    ``started``: each compile Triton was about to make (the cache hook; a
    compile another hook vetoed is not one); ``compiled``: each it finished
    (the post-compile hook). Set :attr:`during` to say what the code under
    watch is doing; each compile keeps the value current when it started.
    """

    def __init__(self, jit_functions=None):
        self.watched = None if jit_functions is None else {id(f) for f in jit_functions}
        self.started: list[Compile] = []
        self.compiled: list[Compile] = []
        self.during = ""
        self.active = True
        self.faults: list[str] = []

    def watches(self, jit_function) -> bool:
        return self.watched is None or id(jit_function) in self.watched

    def unfinished(self) -> list[Compile]:
        """Compiles that started and never finished (one hung, or raised)."""
        done = {(id(c.jit_function), c.key) for c in self.compiled}
        return [c for c in self.started if (id(c.jit_function), c.key) not in done]

    def record(self, hook: str, arguments: dict) -> None:
        """Record one call of ``hook`` with the keywords Triton's ``JITHook``
        protocol passes (``key``, ``repr``, ``fn``, ``compile``,
        ``is_manual_warmup``, ``already_compiled``)."""
        info = arguments.get("fn")
        jit_function = getattr(info, "jit_function", None)
        if not self.active or not self.watches(jit_function):
            return
        details = arguments.get("compile") or {}
        compiled = Compile(
            kernel=str(getattr(info, "name", None) or getattr(jit_function, "__name__", "?")),
            key=str(arguments.get("key")),
            parameters=_parameters(details.get("signature"), details.get("constants")),
            options=tuple((name, details[name]) for name in OPTIONS if name in details),
            warm_up=bool(arguments.get("is_manual_warmup", details.get("is_warmup", False))),
            during=self.during,
            jit_function=jit_function,
        )
        (self.started if hook == CACHE_HOOK else self.compiled).append(compiled)


@contextlib.contextmanager
def recorded_compiles(jit_functions=None) -> Iterator[CompileRecorder]:
    """Record every compile Triton makes inside (of ``jit_functions`` only,
    where given) with its key: a :class:`CompileRecorder`.

    The recorder is chained in front of the hooks already set, which are
    still called with the same arguments (the cache hook's answer, which can
    veto a compile, is theirs), and they are set back on leaving. Where a
    hook was replaced meanwhile by one that chains ours, ours stays in the
    chain recording nothing. A fault of the recorder itself is raised on
    leaving, as a :class:`~c128a.failures.HarnessError`, never inside
    Triton's compile.
    """
    runtime = _runtime_knobs()
    if not compile_hooks_available():
        raise HarnessError(
            f"triton {triton.__version__} has no triton.knobs.runtime.{POST_COMPILE_HOOK} "
            f"and {CACHE_HOOK} (3.6 and 3.9 have them): compiles cannot be recorded as they "
            "happen; install a Triton inside pyproject.toml's range"
        )
    recorder = CompileRecorder(jit_functions)
    previous = {name: getattr(runtime, name) for name in HOOKS}

    def record(hook: str, arguments: dict) -> None:
        try:
            recorder.record(hook, arguments)
        except Exception as exc:  # never break the compile under watch
            recorder.faults.append(f"{hook}: {type(exc).__name__}: {exc}")

    def cache_hook(**arguments):
        earlier = previous[CACHE_HOOK]
        veto = earlier(**arguments) if earlier is not None else None
        if not veto:
            record(CACHE_HOOK, arguments)
        return veto

    def post_compile_hook(**arguments):
        earlier = previous[POST_COMPILE_HOOK]
        answer = earlier(**arguments) if earlier is not None else None
        record(POST_COMPILE_HOOK, arguments)
        return answer

    installed = {CACHE_HOOK: cache_hook, POST_COMPILE_HOOK: post_compile_hook}
    for name, hook in installed.items():
        setattr(runtime, name, hook)
    try:
        yield recorder
    finally:
        recorder.active = False
        for name, hook in installed.items():
            if getattr(runtime, name) is hook:
                setattr(runtime, name, previous[name])
    if recorder.faults:
        raise HarnessError(
            "the compile recorder failed on Triton's hook arguments "
            f"(triton {triton.__version__}): " + "; ".join(recorder.faults)
        )


__all__ = [
    "Compile",
    "CompileRecorder",
    "compile_hooks_available",
    "compiled_variant_count",
    "compiled_variants",
    "forget_compiled_variants",
    "interpreting",
    "recorded_compiles",
]
