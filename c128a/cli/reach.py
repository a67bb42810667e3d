"""``c128a reach``: where each property's strategy reaches in the input space.

Draws each property's steps (nothing is built, no device is used) under each
device's size budget and lists every bucket of every dimension a property
should reach and did not. Exit status 1 when one is missing, 2 for a usage
error. ``--markdown`` prints the README's reach table (the ci profile's
draws), ``--update-readme`` writes it between the reach markers.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..checks import PROPERTIES
from ..failures import EXIT_FAILED, EXIT_OK, UsageError
from ..runners.readme import check_readme, update_readme
from ..runners.reach import (
    BUDGET_DEVICES,
    MAX_REACH_EXAMPLES,
    README_END,
    README_START,
    REACH_EXAMPLES,
    markdown_reach,
    missing_text,
    property_reach,
)


README_TABLE = "the reach table"  # what --update-readme writes between the markers


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--property", action="append", default=None, metavar="NAME",
        help="only this property (repeatable); default: all of c128a.checks.PROPERTIES",
    )
    parser.add_argument(
        "--examples", type=int, default=REACH_EXAMPLES, metavar="N",
        help=f"derandomised draws per property and budget, 1 to {MAX_REACH_EXAMPLES:,} "
        f"(default {REACH_EXAMPLES})",
    )
    parser.add_argument("--markdown", action="store_true",
                        help="print the README's reach table (the ci profile's draws)")
    parser.add_argument(
        "--update-readme", type=Path, default=None, metavar="README",
        help="replace the text between the reach markers in this file",
    )


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.examples <= MAX_REACH_EXAMPLES:
        raise UsageError(
            f"--examples={args.examples} must be >= 1 and <= {MAX_REACH_EXAMPLES:,} "
            f"(derandomised draws per property and budget); the default {REACH_EXAMPLES} "
            "reaches every bucket, more only takes longer"
        )
    unknown = sorted(set(args.property or ()) - set(PROPERTIES))
    if unknown:
        raise UsageError(
            f"unknown --property {', '.join(unknown)}; choose from {', '.join(PROPERTIES)}"
        )
    if args.update_readme is not None:
        check_readme(args.update_readme, README_START, README_END, README_TABLE)
    properties = {name: PROPERTIES[name] for name in args.property or PROPERTIES}
    if args.markdown or args.update_readme is not None:
        table = markdown_reach(properties)
        if args.markdown:
            print(table)
        if args.update_readme is not None:
            update_readme(args.update_readme, table, README_START, README_END, README_TABLE)
    missing = {key: found for key, found in property_reach(properties, BUDGET_DEVICES,
                                                           args.examples).items() if found}
    if missing:
        print(missing_text(missing, f"{args.examples} derandomised draws"))
        return EXIT_FAILED
    print(f"c128a reach: every property reached every bucket that applies to it in "
          f"{args.examples} draws under the {' and '.join(BUDGET_DEVICES)} budgets")
    return EXIT_OK
