"""What is mutated, and what judges each mutant.

A :class:`Subject` is a module whose kernels are mutated (its file is read,
each mutant written beside the run as a module of the same package, so that
its relative imports resolve) and the :class:`Run`\\ s that judge a mutant:
each a target made of the mutant module and the properties it runs, in
order. A mutant is loaded as any target is, by a spec
(``c128a.kernels._mutant_adaptive_1a2b3c4d:inert``) through
:func:`c128a.targets.load_target`, or by a factory for a launch
configuration the spec machinery has no name for.

The project's subjects (:data:`KERNEL_SUBJECTS`) and why each run holds the
properties it does:

- the primary target (``triton``, ``baseline``) runs every property that
  builds through the kernel, so that a survivor has met them all; the
  four that kill most mutants first (``matches_oracle``,
  ``untouched_memory``, ``padding``, ``other_geometries``), the others
  last, after the runs below (a mutant only those runs reach would
  otherwise pay for all of them first). Four are left out because no change inside a kernel can change
  their verdict: ``views`` (the views are made on the host from the
  buffers), ``rejects_bad_input`` (bad arguments are refused before the
  launch), ``width_policy`` (never builds) and ``compile_keys`` (a launch's
  key is its arguments' specialisation and options, not the kernel's body);
- the GPU's launch configurations, under the interpreter too
  (``tests/test_kernel_paths.py`` runs the same): on the CPU the kernel
  runs with the interpreter's tile (256-column tiles, one program a
  256-token block), so the GPU tile's 128-column loop, its persistent
  grid-stride loop, single rows and short wide runs only run here;
  ``matches_oracle`` each, whose check is every one-build invariant;
- ``triton-inert``: the same kernel with the ``inert`` flag, which changes
  padding rows only: ``matches_oracle`` (against the inert oracle) right
  after the primary target's, since a mutant of the inert code only dies
  there and every run before it costs minutes under the interpreter; then
  ``padding`` with the launch configurations.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable, Union

from ...failures import UsageError
from .mutator import DEFAULT_DECORATORS

PRIMARY_PROPERTIES = (
    "matches_oracle",
    "untouched_memory",
    "padding",
    "other_geometries",
    "history_independent",
    "adaptive_equals_full",
    "independent",
    "idempotent",
    "consumers_replay",
    "consumers",
)
"""The properties a project kernel's mutant meets on its primary target."""
FIRST_PROPERTIES = PRIMARY_PROPERTIES[:4]
"""Those it meets before the other launch configurations and variants:
together they kill most mutants, ``other_geometries`` those of the paths
only a block size or ratio other than the engine's takes (the division
of a block size that is not a power of two)."""

LEFT_OUT = {
    "views": "the views are made on the host from the buffers",
    "rejects_bad_input": "bad arguments are refused before the launch",
    "width_policy": "it never builds",
    "compile_keys": "a launch's key is its arguments' specialisation, not the kernel's body",
}
"""The properties no change inside a kernel can fail, each with why."""

TargetMaker = Union[str, Callable[[ModuleType, str], object]]


@dataclass(frozen=True)
class Run:
    """One target a mutant is judged as, and the properties it meets there,
    in order (a target may come back in a later run with other properties;
    ``label`` and property name one time limit). ``target`` is an attribute path of the mutant module (``""``:
    the module itself, ``"inert"``), loaded through its spec, or a factory
    ``(module, spec) -> Target``."""

    label: str
    target: TargetMaker
    properties: tuple[str, ...]


@dataclass(frozen=True)
class Subject:
    """A module whose kernels (functions with one of ``decorators``) are
    mutated, and the runs that judge each mutant, in order. Mutant ids start
    with ``name``."""

    name: str
    module: str
    runs: tuple[Run, ...]
    decorators: tuple[str, ...] = DEFAULT_DECORATORS

    def path(self) -> Path:
        """The module's file, found without importing it (nor its package's kernels)."""
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            raise UsageError(f"subject {self.name!r}: module {self.module!r} has no Python file")
        return Path(spec.origin)

    @property
    def package(self) -> str:
        return self.module.rpartition(".")[0]

    def properties(self) -> tuple[str, ...]:
        """Every property some run of this subject meets."""
        return tuple(dict.fromkeys(p for run in self.runs for p in run.properties))


def _tiled_target(module: ModuleType, spec: str, **tiling):
    """The mutant module's kernels launched with an explicit launch
    configuration (the GPU's tile, a capped grid), validated as every
    project builder is."""
    from ...kernels.builder import triton_builder
    from ...targets import Target

    launch = functools.partial(module.launch_tiled, num_warps=4, programs_per_sm=0, **tiling)
    return Target(spec=spec, build_c128a_topk_metadata=triton_builder(launch))


TILINGS = {
    "gpu tile, two persistent programs": dict(
        tile=(4, 128, 1024), single_rows_up_to=0, max_programs=2
    ),
    "single rows, two persistent programs": dict(
        tile=(4, 128, 1024), single_rows_up_to=1 << 20, max_programs=2
    ),
    "256-column tiles and wide runs, three programs": dict(tile=(4, 256, 256), max_programs=3),
}
"""The GPU's launch configurations a CPU run reaches only by asking
(as in ``tests/test_kernel_paths.py``), each pinned on every device: the
GPU tile's row blocks never give way to single rows (on a GPU they would
up to 4 tokens a multiprocessor, and the blocks' grid-stride loop would
run only past that), and one tile is wider than W = 128 (the GPU's
128-column tile divides every W, so a tile's columns past W, which the
interpreter's 256-column tile has, would be met nowhere on a GPU)."""

KERNEL_SUBJECTS = {
    "adaptive": Subject(
        "adaptive",
        "c128a.kernels.adaptive",
        (
            Run("triton", "", FIRST_PROPERTIES[:1]),
            Run("triton-inert", "inert", ("matches_oracle",)),
            Run("triton", "", FIRST_PROPERTIES[1:]),
            *(Run(label, functools.partial(_tiled_target, **tiling), ("matches_oracle",))
              for label, tiling in TILINGS.items()),
            Run("triton-inert", "inert", ("padding",)),
            Run("triton", "", PRIMARY_PROPERTIES[len(FIRST_PROPERTIES):]),
        ),
    ),
    "baseline": Subject(
        "baseline", "c128a.kernels.baseline", (Run("baseline", "", PRIMARY_PROPERTIES),)
    ),
}
"""The project's own kernels (``c128a mutate``'s default subjects)."""


def load_subject(spec: str) -> Subject:
    """A name of :data:`KERNEL_SUBJECTS`, or ``MODULE:ATTR`` naming a :class:`Subject`."""
    if spec in KERNEL_SUBJECTS:
        return KERNEL_SUBJECTS[spec]
    if ":" not in spec:
        raise UsageError(
            f"--subject {spec!r} is neither one of {', '.join(KERNEL_SUBJECTS)} nor MODULE:ATTR"
        )
    from ...targets import import_object

    subject = import_object(spec, "--subject")
    if not isinstance(subject, Subject):
        raise UsageError(
            f"--subject {spec!r} names a {type(subject).__name__}, not a "
            "c128a.runners.mutation.Subject"
        )
    return subject


def mutant_module_name(subject: Subject, mutant_id: str | None) -> str:
    """The module name a mutant (None: the unmutated control) is loaded
    under: in the subject's package, so that its relative imports resolve."""
    tail = "control" if mutant_id is None else mutant_id.replace("-", "_")
    return f"{subject.package}._mutant_{subject.name}_{tail}".lstrip(".")


def load_module(name: str, path: Path) -> ModuleType:
    """Import the module at ``path`` under ``name`` and register it, so that
    a target spec naming ``name`` finds it."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def run_target(run: Run, module: ModuleType):
    """The target ``run`` judges: loaded through its spec, or made by its factory."""
    if callable(run.target):
        return run.target(module, f"{module.__name__} ({run.label})")
    from ...targets import load_target

    return load_target(f"{module.__name__}:{run.target}" if run.target else module.__name__)
