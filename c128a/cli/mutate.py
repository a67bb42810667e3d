"""``c128a mutate``: mutation testing of the project's kernels.

Mutates every Triton kernel function of the subjects (``adaptive``,
``baseline``) one expression at a time, judges each mutant by the
conformance properties (ci profile, derandomised; the first kill ends a
mutant) in a child process with a time limit per property, prints a line
per mutant and writes the report (``mutation-report.txt`` and
``mutation-report.json`` in ``--output``): the mutation score, the
survivors with their source line and mutation, the equivalents, the
timeouts and crashes (:mod:`c128a.runners.mutation`).

Exit status 0 when every mutant ran and each was detected or is listed in
``--known`` as it behaved; 1 when a mutant survived unlisted, a listed one
was detected or is gone, or the run was cut short; 2 for a usage error, a
subject that fails its own control, or a fault of the suite in a mutant's
run; 128 + the signal when a signal stopped it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..failures import UsageError
from ..files import output_file_problem
from ..runners.mutation import (
    DEFAULT_KNOWN,
    KERNEL_SUBJECTS,
    MutationConfig,
    MutationRun,
    json_report,
    text_report,
)
from .common import add_device_argument, choose_device

DEFAULT_OUTPUT = "c128a-mutation"
REPORT_NAMES = ("mutation-report.txt", "mutation-report.json")


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_device_argument(parser)
    parser.add_argument(
        "--subject", action="append", default=None, metavar="NAME|MODULE:ATTR",
        help=f"what to mutate (repeatable): {', '.join(KERNEL_SUBJECTS)} or a "
        "c128a.runners.mutation.Subject; default: all of the project's kernels",
    )
    parser.add_argument(
        "--known", type=Path, default=None, metavar="FILE",
        help="the mutants known to survive, each 'ID equivalent|survives: reason'; default: "
        "the project's list when every subject is the project's, else none",
    )
    parser.add_argument("--workers", type=int, default=0, metavar="N",
                        help="children side by side; default: one per usable core")
    parser.add_argument(
        "--timeout", type=float, default=None, metavar="S",
        help="time limit of one property on one mutant; default: 5 x the unmutated "
        "kernel's time for it (the control), at least 60 s",
    )
    parser.add_argument("--max-examples", type=int, default=None, metavar="N",
                        help="generated examples a property; default: the ci profile's")
    parser.add_argument("--mutant", action="append", default=None, metavar="ID",
                        help="run only this mutant (repeatable)")
    parser.add_argument("--sample", type=int, default=None, metavar="N",
                        help="run N mutants drawn at random (with --seed), not all")
    parser.add_argument("--seed", type=int, default=0, metavar="S",
                        help="the seed of --sample's draw; default: 0")
    parser.add_argument("--list", action="store_true",
                        help="print every mutant's id and change, run nothing")
    parser.add_argument(
        "--output", type=Path, default=Path(DEFAULT_OUTPUT), metavar="DIR",
        help=f"where the report files go ({', '.join(REPORT_NAMES)}); default: {DEFAULT_OUTPUT}",
    )


def run(args: argparse.Namespace) -> int:
    subjects = tuple(args.subject or KERNEL_SUBJECTS)
    for name, value, floor in (("--workers", args.workers, 0), ("--max-examples",
                               args.max_examples, 1), ("--timeout", args.timeout, 0)):
        if value is not None and (value < floor or (name == "--timeout" and value == 0)):
            raise UsageError(f"{name}={value} must be {'> 0' if name == '--timeout' else f'>= {floor}'}")
    known = args.known
    if known is None and all(s in KERNEL_SUBJECTS for s in subjects):
        known = DEFAULT_KNOWN
    device = choose_device(args.device)
    mutation = MutationRun(MutationConfig(
        subjects=subjects, known=known, device=device, workers=args.workers,
        timeout_s=args.timeout, max_examples=args.max_examples,
        mutant_ids=tuple(args.mutant or ()), sample=args.sample, seed=args.seed,
        say=lambda line: print(line, file=sys.stderr, flush=True),
    ))
    if args.list:
        for mutant in mutation.selected:
            print(f"{mutant.id}  {mutant.describe()}")
        return 0
    paths = [args.output / name for name in REPORT_NAMES]
    _check_output(args.output, paths)
    verdict, header = mutation.run()
    text = text_report(verdict, header)
    _write(paths[0], text)
    _write(paths[1], json_report(verdict, header))
    print(text, end="")
    print(f"c128a mutate: report in {paths[0]} and {paths[1]}", file=sys.stderr)
    if mutation.stopping:
        import signal

        return 128 + signal.Signals[mutation.stopping].value
    return verdict.exit_status()


def _check_output(folder: Path, paths: list[Path]) -> None:
    """Before the run, which takes long: the report can be written."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--output {folder}: not a folder; name a folder for the report")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--output {folder}: cannot create it: {exc.strerror or exc}") from None
    for path in paths:
        problem = output_file_problem(path)
        if problem is not None:
            raise UsageError(f"--output {folder}: {path.name}: {problem}")


def _write(path: Path, text: str) -> None:
    """Written aside and renamed over ``path``: a reader never sees half a report."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
