"""``c128a mutants``: run every property against every mutant; print the kill matrix.

Each (target, property) pair runs as a Hypothesis test built in-process
(``given(strategy)(check)`` under the ``ci`` profile's settings: derandomized,
so two runs give the same matrix). A pair is *killed* when the property's
check fails (an ``AssertionError``, such as an ``InvariantViolation``) on some
example; the matrix shows the time to that first failure. Any other exception
(a crash, a refused call) shows as ``error``: it proves nothing about the
property. Shrinking
is off: the matrix asks whether a property can fail, not for the smallest
failure (``c128a fuzz`` and pytest do that).

Exit status 1 when a mutant survives every property, or when a correct
target (``--expect-pass``, default ``triton`` and ``reference``) is killed
or errors.
"""

from __future__ import annotations

import argparse
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from . import cli

README_START = "<!-- kill-matrix:start -->"
README_END = "<!-- kill-matrix:end -->"
DEFAULT_EXPECT_PASS = ("triton", "reference")
MUTANT_PREFIX = "c128a.mutants:"


@dataclass(frozen=True)
class Outcome:
    """One (target, property) cell."""

    killed: bool
    seconds: float  # to the first failure when killed, else the whole run
    examples: int
    message: str = ""
    errored: bool = False  # raised something other than an assertion: not a kill

    def cell(self) -> str:
        if self.killed:
            return f"killed ({self.seconds:.2f}s)"
        return f"error ({self.message.split(':')[0]})" if self.errored else "survived"


def _is_assertion(exc: BaseException) -> bool:
    """Only a failed check counts as a kill, not a crash or a refused call."""
    if isinstance(exc, AssertionError):
        return True
    if isinstance(exc, BaseExceptionGroup):  # Hypothesis reports several distinct failures so
        return any(_is_assertion(inner) for inner in exc.exceptions)
    return False


def ci_settings(max_examples: int | None = None):
    """The ``ci`` profile's settings with shrinking off (and fewer examples if asked)."""
    from hypothesis import Phase, settings

    from .profiles import CI_PROFILE, register_profiles

    register_profiles()
    base = settings.get_profile(CI_PROFILE)
    changes = {"phases": [Phase.explicit, Phase.generate], "report_multiple_bugs": False}
    if max_examples is not None:
        changes["max_examples"] = max_examples
    return settings(base, **changes)


def run_property(prop, target, device, run_settings) -> Outcome:
    """Run one property against one target as a Hypothesis test."""
    from hypothesis import example, given
    from hypothesis.errors import HypothesisWarning

    state = {"examples": 0, "first_failure": None}
    start = time.perf_counter()

    def check(batch):
        state["examples"] += 1
        try:
            prop.check(target, batch, device)
        except BaseException:
            if state["first_failure"] is None:
                state["first_failure"] = time.perf_counter() - start
            raise

    test = given(prop.strategy(target))(check)
    for batch in reversed(getattr(prop, "examples", ())):
        test = example(batch)(test)
    test = run_settings(test)
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
        if _is_assertion(exc):
            return Outcome(True, seconds, state["examples"], message)
        return Outcome(False, seconds, state["examples"], message, errored=True)
    return Outcome(False, time.perf_counter() - start, state["examples"])


def target_from_object(spec: str, obj):
    """A :class:`~c128a.targets.Target` for an object already in hand (a value
    of another module's ``MUTANTS`` dict), read the way ``load_target`` reads
    a spec's object."""
    from . import policy
    from .targets import Target

    width = getattr(obj, "active_topk_width", None)
    capacity = getattr(obj, "capacity_width", None)
    return Target(
        spec=spec,
        build_c128a_topk_metadata=obj.build_c128a_topk_metadata,
        active_topk_width=width or policy.active_topk_width,
        capacity_width=capacity or policy.capacity_width,
        validates_input=bool(getattr(obj, "validates_input", True)),
        full_width_decode_views=bool(getattr(obj, "full_width_decode_views", False)),
        uses_project_policy=width is None and capacity is None,
    )


def kill_matrix(specs, device, properties=None, max_examples: int | None = None):
    """{spec: {property name: Outcome}} for every target (a spec string, or a
    loaded :class:`~c128a.targets.Target`, keyed by its spec)."""
    from .properties import PROPERTIES
    from .targets import load_target

    properties = PROPERTIES if properties is None else properties
    run_settings = ci_settings(max_examples)
    matrix = {}
    for spec in specs:
        target = load_target(spec) if isinstance(spec, str) else spec
        spec = str(target.spec)
        matrix[spec] = {
            name: run_property(prop, target, device, run_settings)
            for name, prop in properties.items()
        }
    return matrix


def first_kill(target, device, properties=None, max_examples: int | None = None):
    """(property name, Outcome) of the first property, in order, that kills
    ``target``; None when it survives them all. Cheaper than a full row."""
    from .properties import PROPERTIES

    properties = PROPERTIES if properties is None else properties
    run_settings = ci_settings(max_examples)
    for name, prop in properties.items():
        outcome = run_property(prop, target, device, run_settings)
        if outcome.killed:
            return name, outcome
    return None


def default_mutant_specs() -> list[str]:
    from . import mutants

    return [MUTANT_PREFIX + name for name in mutants.MUTANTS]


def _short(spec: str) -> str:
    return spec.removeprefix(MUTANT_PREFIX)


def problems(matrix, expect_pass) -> list[str]:
    """Why the run fails: surviving mutants, killed correct targets."""
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
    from . import mutants

    return mutants.BUG_CLASSES.get(_short(spec), "not a project mutant")


def markdown_table(matrix, expect_pass=()) -> str:
    """The matrix as a GitHub table (mutants x properties)."""
    names = list(next(iter(matrix.values())).keys()) if matrix else []
    header = "| target | bug class | " + " | ".join(f"`{n}`" for n in names) + " |"
    rule = "|---|---|" + "---|" * len(names)
    lines = [header, rule]
    for spec, row in matrix.items():
        kind = "correct (must survive)" if spec in expect_pass else _bug_class(spec)
        cells = []
        for name in names:
            cells.append(row[name].cell())
        lines.append(f"| `{_short(spec)}` | {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def print_rich(matrix, expect_pass) -> None:
    from rich.console import Console
    from rich.table import Table

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
                cells.append(f"[{style}]{outcome.cell()}[/]")
            elif outcome.errored:
                cells.append(f"[yellow]{outcome.cell()}[/]")
            else:
                style = "green" if spec in expect_pass else "dim"
                cells.append(f"[{style}]survived[/]")
        table.add_row(_short(spec), *cells)
    Console().print(table)


def update_readme(path: Path, table: str) -> None:
    text = path.read_text()
    pattern = re.compile(re.escape(README_START) + r".*?" + re.escape(README_END), re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(
            f"c128a: {path} has no {README_START} ... {README_END} markers; add them where "
            "the kill matrix belongs"
        )
    replacement = f"{README_START}\n{table}\n{README_END}"
    path.write_text(pattern.sub(lambda _: replacement, text, count=1))


def _mapping(source: str):
    """(name, object) pairs of the dict named by ``MODULE:ATTR``."""
    import importlib

    module_name, _, attr = source.partition(":")
    try:
        mapping = getattr(importlib.import_module(module_name), attr or "MUTANTS")
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"c128a: --mutants-from {source}: {exc}") from exc
    if not isinstance(mapping, dict):
        kind = type(mapping).__name__
        raise SystemExit(f"c128a: --mutants-from {source} is a {kind}, not a dict")
    return sorted(mapping.items())


def configure_parser(parser: argparse.ArgumentParser) -> None:
    cli.add_target_arguments(parser)
    parser.add_argument(
        "--spec",
        action="append",
        default=None,
        metavar="SPEC",
        help="target spec to run (repeatable); default: every mutant in c128a.mutants",
    )
    parser.add_argument(
        "--mutants-from",
        action="append",
        default=None,
        metavar="MODULE:ATTR",
        help="a dict of name -> target object to run as mutants (repeatable), e.g. "
        "independent_mutants:MUTANTS with its folder on PYTHONPATH",
    )
    parser.add_argument(
        "--expect-pass",
        action="append",
        default=None,
        metavar="SPEC",
        help="a correct target that must survive every property (repeatable; default: "
        "triton and reference); also run",
    )
    parser.add_argument(
        "--property",
        action="append",
        default=None,
        metavar="NAME",
        help="run only this property (repeatable); default: all of c128a.properties",
    )
    parser.add_argument(
        "--max-examples",
        type=int,
        default=None,
        metavar="N",
        help="examples per (target, property) pair; default: the ci profile's",
    )
    parser.add_argument("--markdown", action="store_true", help="print a GitHub markdown table")
    parser.add_argument(
        "--update-readme",
        type=Path,
        default=None,
        metavar="README",
        help="replace the text between the kill-matrix markers in this file",
    )


def run(args: argparse.Namespace) -> int:
    device_name, _, _ = cli.prepare(args)
    import torch

    from .properties import PROPERTIES

    expect_pass = tuple(args.expect_pass or DEFAULT_EXPECT_PASS)
    if args.target and args.target not in expect_pass:
        expect_pass += (args.target,)  # --target names one more correct target
    specs: list = list(args.spec or ([] if args.mutants_from else default_mutant_specs()))
    specs = [s for s in expect_pass if s not in specs] + specs
    for source in args.mutants_from or ():
        specs += [target_from_object(f"{source}[{name}]", obj) for name, obj in _mapping(source)]
    properties = PROPERTIES
    if args.property:
        unknown = sorted(set(args.property) - set(PROPERTIES))
        if unknown:
            raise SystemExit(
                f"c128a: unknown --property {', '.join(unknown)}; "
                f"choose from {', '.join(PROPERTIES)}"
            )
        properties = {name: PROPERTIES[name] for name in args.property}
    matrix = kill_matrix(specs, torch.device(device_name), properties, args.max_examples)
    table = markdown_table(matrix, expect_pass)
    if args.markdown:
        print(table)
    else:
        print_rich(matrix, expect_pass)
    if args.update_readme is not None:
        update_readme(args.update_readme, table)
    found = problems(matrix, expect_pass)
    for line in found:
        print(f"c128a mutants: {line}")
    return 1 if found else 0
