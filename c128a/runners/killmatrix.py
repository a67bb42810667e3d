"""The kill matrix: every property against every mutant.

Each (target, property) pair runs the property's own Hypothesis test
(:meth:`c128a.checks.Property.test`) under the ``ci`` profile's settings
(derandomized, so two runs give the same matrix) with shrinking off: the
matrix asks whether a property can fail, not for the smallest failure
(``c128a fuzz`` and pytest do that). A pair is *killed* only when the target
broke the contract (a :class:`~c128a.failures.ContractViolation`); the matrix
shows the time to that first failure. Anything else (a fault of the suite
itself, a crash of the harness) shows as ``error``: it proves nothing about
the property.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from hypothesis import Phase, settings
from hypothesis.errors import HypothesisWarning
from rich.table import Table

from ..checks import PROPERTIES
from ..checks.profiles import CI_PROFILE, register_profiles
from ..failures import UsageError, is_cuda_fault, is_kill
from ..mutants import MUTANTS
from ..targets import Target
from . import readme

README_START = "<!-- kill-matrix:start -->"
README_END = "<!-- kill-matrix:end -->"
DEFAULT_EXPECT_PASS = ("triton", "reference", "triton-inert", "reference-inert")
MUTANT_PREFIX = "c128a.mutants:"


@dataclass(frozen=True)
class Outcome:
    """One (target, property) cell."""

    killed: bool
    seconds: float  # to the first failure when killed, else the whole run
    examples: int
    message: str = ""
    errored: bool = False  # failed without a contract violation: not a kill
    unsupported: bool = False  # the property cannot be checked on this target
    cuda_fault: bool = False  # errored with a CUDA fault (failures.is_cuda_fault)

    def cell(self) -> str:
        if self.killed:
            return f"killed ({self.seconds:.2f}s)"
        if self.unsupported:
            return "n/a"
        return f"error ({self.message.split(':')[0]})" if self.errored else "survived"


def ci_settings(max_examples: int | None = None):
    """The ``ci`` profile's settings with shrinking off (and fewer examples if asked)."""
    register_profiles()
    changes = {"phases": [Phase.explicit, Phase.generate], "report_multiple_bugs": False}
    if max_examples is not None:
        changes["max_examples"] = max_examples
    return settings(settings.get_profile(CI_PROFILE), **changes)


def run_property(prop, target, device, run_settings) -> Outcome:
    """Run one property against one target, through the property's own test."""
    reason = prop.unsupported(target)
    if reason is not None:
        return Outcome(False, 0.0, 0, reason, unsupported=True)
    state = {"examples": 0, "first_failure": None}
    start = time.perf_counter()

    def around(batch, run) -> None:
        state["examples"] += 1
        try:
            run()
        except BaseException:
            if state["first_failure"] is None:
                state["first_failure"] = time.perf_counter() - start
            raise

    test = prop.test(target, device, settings=run_settings, around=around)
    try:
        with warnings.catch_warnings():
            # A failing 1M-context Batch has a long repr; the matrix prints one line.
            warnings.simplefilter("ignore", HypothesisWarning)
            test()
    except Exception as exc:
        seconds = state["first_failure"]
        if seconds is None:  # failed while drawing (e.g. the target's policy raised)
            seconds = time.perf_counter() - start
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        message = f"{type(exc).__name__}: {first_line}"
        if is_kill(exc):
            return Outcome(True, seconds, state["examples"], message)
        return Outcome(False, seconds, state["examples"], message, errored=True,
                       cuda_fault=is_cuda_fault(exc))
    return Outcome(False, time.perf_counter() - start, state["examples"])


def kill_matrix(targets, device, properties=None, max_examples: int | None = None):
    """{spec: {property name: Outcome}} for every loaded :class:`~c128a.targets.Target`,
    each with ``max_examples`` (the ci profile's by default) or the more a
    project mutant declares (:func:`examples_for`)."""
    properties = PROPERTIES if properties is None else properties
    return {
        str(target.spec): {
            name: run_property(prop, target, device,
                               ci_settings(examples_for(str(target.spec), max_examples)))
            for name, prop in properties.items()
        }
        for target in targets
    }


def examples_for(spec: str, max_examples: int | None) -> int | None:
    """The generated examples a target's row gets: ``max_examples`` (None:
    the ci profile's), or more for a project mutant whose fault lives in a
    cell that takes more draws to reach
    (:attr:`~c128a.mutants.registry.Mutant.examples`)."""
    mutant = MUTANTS.get(_short(spec)) if spec.startswith(MUTANT_PREFIX) else None
    if mutant is None or mutant.examples is None:
        return max_examples
    return max(max_examples or ci_settings().max_examples, mutant.examples)


def first_kill(target, device, properties=None, max_examples: int | None = None):
    """(property name, Outcome) of the first property, in order, that kills
    ``target``; None when it survives them all. Cheaper than a full row."""
    properties = PROPERTIES if properties is None else properties
    run_settings = ci_settings(max_examples)
    for name, prop in properties.items():
        outcome = run_property(prop, target, device, run_settings)
        if outcome.killed:
            return name, outcome
    return None


def default_mutant_specs() -> list[str]:
    return [mutant.spec for mutant in MUTANTS.values()]


def targets_from_mapping(source: str, mapping) -> list[Target]:
    """The targets of a ``name -> target object`` dict (``--mutants-from``)."""
    if not isinstance(mapping, dict):
        raise UsageError(f"--mutants-from {source} is a {type(mapping).__name__}, not a dict")
    return [Target.from_object(f"{source}[{name}]", obj) for name, obj in sorted(mapping.items())]


def _short(spec: str) -> str:
    return spec.removeprefix(MUTANT_PREFIX)


def problems(matrix, expect_pass) -> list[str]:
    """Why the run fails: surviving mutants, killed or erroring correct targets."""
    found = []
    for spec, row in matrix.items():
        killed = [name for name, outcome in row.items() if outcome.killed]
        errored = [name for name, outcome in row.items() if outcome.errored]
        if spec in expect_pass:
            for name in killed + errored:
                found.append(f"correct target {spec} failed {name}: {row[name].message}")
        elif not killed:
            note = f" (errors, not failed checks, in: {', '.join(errored)})" if errored else ""
            found.append(f"mutant {spec} survived every property{note}")
    return found


def _bug_class(spec: str) -> str:
    mutant = MUTANTS.get(_short(spec))
    return mutant.bug_class if mutant else "not a project mutant"


def markdown_table(matrix, expect_pass=()) -> str:
    """The matrix as a GitHub table (mutants x properties)."""
    names = list(next(iter(matrix.values())).keys()) if matrix else []
    header = "| target | bug class | " + " | ".join(f"`{n}`" for n in names) + " |"
    rule = "|---|---|" + "---|" * len(names)
    lines = [header, rule]
    for spec, row in matrix.items():
        kind = "correct (must survive)" if spec in expect_pass else _bug_class(spec)
        cells = [row[name].cell() for name in names]
        lines.append(f"| `{_short(spec)}` | {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rich_table(matrix, expect_pass) -> Table:
    names = list(next(iter(matrix.values())).keys()) if matrix else []
    table = Table(title="C128A kill matrix (ci profile, time to first failure)")
    table.add_column("target", style="bold")
    for name in names:
        table.add_column(name, justify="center")
    for spec, row in matrix.items():
        cells = []
        for name in names:
            outcome = row[name]
            if outcome.killed:
                style = "red" if spec in expect_pass else "green"
            elif outcome.errored:
                style = "yellow"
            else:
                style = "green" if spec in expect_pass else "dim"
            cells.append(f"[{style}]{outcome.cell()}[/]")
        table.add_row(_short(spec), *cells)
    return table


def update_readme(path: Path, table: str, start: str = README_START, end: str = README_END,
                  what: str = "the kill matrix") -> None:
    """Replace the text between the ``start`` and ``end`` markers of ``path``
    with ``table`` (atomically: :func:`c128a.runners.readme.update_readme`)."""
    readme.update_readme(path, table, start, end, what)
