"""``c128a mutants``: run every property against every mutant; print the kill matrix.

Exit status 1 when a mutant survives every property, or when a correct
target (``--expect-pass``, default ``triton``, ``reference`` and their
``-inert`` variants) is killed or errors; 2 for a usage error, found before
any row runs (every spec, mapping and property is loaded and checked first).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from rich.console import Console

from ..checks import PROPERTIES
from ..failures import EXIT_FAILED, EXIT_OK, UsageError
from ..runners.killmatrix import (
    DEFAULT_EXPECT_PASS,
    README_END,
    README_START,
    default_mutant_specs,
    kill_matrix,
    markdown_table,
    problems,
    rich_table,
    targets_from_mapping,
)
from ..runners.readme import check_page, update_page
from ..targets import held_to, import_object
from .common import add_target_arguments, choose_device, load, padding_rows_override


PAGE_TABLE = "the kill matrix"  # what --update-docs writes between the markers


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument(
        "--spec", action="append", default=None, metavar="SPEC",
        help="target spec to run (repeatable); default: every mutant in c128a.mutants",
    )
    parser.add_argument(
        "--mutants-from", action="append", default=None, metavar="MODULE:ATTR",
        help="a dict of name -> target object to run as mutants (repeatable), e.g. "
        "independent_mutants:MUTANTS with its folder on PYTHONPATH",
    )
    parser.add_argument(
        "--expect-pass", action="append", default=None, metavar="SPEC",
        help="a correct target that must survive every property (repeatable; default: "
        "triton, reference, triton-inert, reference-inert); also run",
    )
    parser.add_argument(
        "--property", action="append", default=None, metavar="NAME",
        help="run only this property (repeatable); default: all of c128a.checks.PROPERTIES",
    )
    parser.add_argument(
        "--max-examples", type=int, default=None, metavar="N",
        help="examples per (target, property) pair; default: the ci profile's",
    )
    parser.add_argument("--markdown", action="store_true", help="print a GitHub markdown table")
    parser.add_argument(
        "--update-docs", "--update-readme", dest="update_docs", type=Path, default=None,
        metavar="PAGE", help="replace the text between the kill-matrix markers in this docs "
        "page (docs/reference/kill-matrix.md)",
    )


def run(args: argparse.Namespace) -> int:
    device = choose_device(args.device)
    if args.max_examples is not None and args.max_examples < 1:
        raise UsageError(f"--max-examples={args.max_examples} must be >= 1")
    properties = PROPERTIES
    if args.property:
        unknown = sorted(set(args.property) - set(PROPERTIES))
        if unknown:
            raise UsageError(
                f"unknown --property {', '.join(unknown)}; choose from {', '.join(PROPERTIES)}"
            )
        properties = {name: PROPERTIES[name] for name in args.property}
    if args.update_docs is not None:  # before the matrix, which takes minutes
        check_page(args.update_docs, README_START, README_END, PAGE_TABLE)
    expect_pass = tuple(args.expect_pass or DEFAULT_EXPECT_PASS)
    if args.target and args.target not in expect_pass:
        expect_pass += (args.target,)  # --target names one more correct target
    specs = list(args.spec or ([] if args.mutants_from else default_mutant_specs()))
    specs = [s for s in expect_pass if s not in specs] + specs
    # Every target is loaded before any row runs: a bad spec is a usage error now,
    # naming the option that gave it.
    def option(spec: str) -> str:
        if spec in (args.spec or ()):
            return "--spec"
        return "--target" if spec == args.target else "--expect-pass"

    # --padding-rows (or $C128A_PADDING_ROWS) holds every row to one variant.
    variant, _ = padding_rows_override(args.padding_rows)
    targets = [load(spec, option(spec), args.padding_rows)[0] for spec in specs]
    for source in args.mutants_from or ():
        mapped = targets_from_mapping(source, import_object(source, "--mutants-from"))
        targets += [held_to(target, variant) for target in mapped]
    matrix = kill_matrix(targets, torch.device(device), properties, args.max_examples)
    table = markdown_table(matrix, expect_pass)
    if args.markdown:
        print(table)
    else:
        Console().print(rich_table(matrix, expect_pass))
    if args.update_docs is not None:
        update_page(args.update_docs, table, README_START, README_END, PAGE_TABLE)
    found = problems(matrix, expect_pass)
    for line in found:
        print(f"c128a mutants: {line}")
    return EXIT_FAILED if found else EXIT_OK
