"""``c128a reach``: where each property's strategy reaches in the input space.

Draws each property's steps (nothing is built, no device is used) under each
device's size budget and lists every bucket of every dimension, and every
allowed cell of every pair of dimensions and every declared triple
(:mod:`c128a.strategies.pairs`), a property should reach and did not. Exit
status 1 when one is missing, 2 for a usage error. ``--markdown`` prints
the reach tables (the ci profile's draws), ``--update-docs PAGE`` writes
them between their markers (``docs/reference/reach-tables.md``;
``--update-readme`` is an alias); ``--ci`` lists the allowed cells the ci
profile's draws (a CI run's) never reach, ``--left-out`` every cell the
contract forbids or a budget keeps out, with the reasons.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..checks import PROPERTIES
from ..failures import EXIT_FAILED, EXIT_OK, UsageError
from ..runners.readme import check_readme, update_readme_tables
from ..runners.reach import (
    BUDGET_DEVICES,
    MAX_REACH_EXAMPLES,
    README_END,
    README_PAIRS_END,
    README_PAIRS_START,
    README_START,
    REACH_EXAMPLES,
    cell_text,
    ci_profile_reach,
    coverage,
    left_out_lines,
    markdown_pairs,
    markdown_reach,
    missing_pairs_text,
    missing_text,
    property_pair_reach,
)


README_TABLE = "the reach table"  # what --update-docs writes between the markers
README_PAIRS_TABLE = "the reach table of pairs"


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
                        help="print the reach tables (the ci profile's draws)")
    parser.add_argument(
        "--update-docs", "--update-readme", dest="update_docs", type=Path, default=None,
        metavar="PAGE", help="replace the text between the reach markers in this docs page "
        "(docs/reference/reach-tables.md)",
    )
    parser.add_argument("--ci", action="store_true",
                        help="list the allowed cells the ci profile's draws never reach")
    parser.add_argument("--left-out", action="store_true",
                        help="list every cell left out, forbidden by the contract or beyond a "
                        "size budget, with the reasons")


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
    if args.update_docs is not None:
        check_readme(args.update_docs, README_START, README_END, README_TABLE)
        check_readme(args.update_docs, README_PAIRS_START, README_PAIRS_END, README_PAIRS_TABLE)
    properties = {name: PROPERTIES[name] for name in args.property or PROPERTIES}
    if args.left_out:
        for device in BUDGET_DEVICES:
            print("\n".join(left_out_lines(device)))
    if args.ci:
        for device in BUDGET_DEVICES:
            got, allowed, missed = coverage(ci_profile_reach(properties, device), device)
            print(f"the ci profile's draws reach {got:,} of {allowed:,} allowed cells "
                  f"({device} budget); never drawn:")
            print("\n".join(f"  {cell_text(name, cell)}" for name, cell in missed))
    if args.markdown or args.update_docs is not None:
        table, pairs = markdown_reach(properties), markdown_pairs(properties)
        if args.markdown:
            print(table)
            print()
            print(pairs)
        if args.update_docs is not None:
            update_readme_tables(args.update_docs, [
                (table, README_START, README_END, README_TABLE),
                (pairs, README_PAIRS_START, README_PAIRS_END, README_PAIRS_TABLE),
            ])
    reach = property_pair_reach(properties, BUDGET_DEVICES, args.examples)
    missing = {key: found[0] for key, found in reach.items() if found[0]}
    missing_pairs = {key: found[1] for key, found in reach.items() if found[1]}
    draws = f"{args.examples} derandomised draws"
    if missing:
        print(missing_text(missing, draws))
    if missing_pairs:
        print(missing_pairs_text(missing_pairs, draws))
    if missing or missing_pairs:
        return EXIT_FAILED
    print(f"c128a reach: every property reached every bucket and every allowed cell "
          f"that applies to it in {args.examples} draws under the "
          f"{' and '.join(BUDGET_DEVICES)} budgets")
    return EXIT_OK
