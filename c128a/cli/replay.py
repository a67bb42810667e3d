"""``c128a replay``: rerun saved failure cases against a target."""

from __future__ import annotations

import argparse
import sys

from ..failures import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CaseError, UsageError
from ..runners.cases import (
    DEFAULT_MACHINE,
    DEFAULT_PROPERTIES,
    FAILS,
    PASSES,
    SERVING_LOOP,
    describe_batch,
    load_case,
    replay_case,
)
from ..targets import import_object
from .common import add_target_arguments, choose_device, load


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="case file(s) to rerun")
    add_target_arguments(parser)
    parser.add_argument("--properties", metavar="MODULE:ATTR", default=DEFAULT_PROPERTIES,
                        help=f"property mapping the cases name (default {DEFAULT_PROPERTIES})")
    parser.add_argument("--machine", metavar="MODULE:ATTR", default=DEFAULT_MACHINE,
                        help=f"serving-loop machine factory (default {DEFAULT_MACHINE})")
    parser.epilog = (
        "Without --target each case runs against the target it names. Exit status: 0 when "
        "every case passes now, 1 when one still fails, 2 when a file is malformed or "
        "cannot be replayed here."
    )


def run(args: argparse.Namespace) -> int:
    device = choose_device(args.device)
    properties = import_object(args.properties, "--properties")
    still_failing = unreplayable = False
    for file in args.files:
        try:
            case = load_case(file)
            origin = "--target" if args.target else "the case"
            target, _ = load(args.target or case.target, origin)
        except (CaseError, UsageError) as exc:
            print(f"error: {file}: {exc}", file=sys.stderr)
            unreplayable = True
            continue
        print(f"case:     {file}")
        print(f"property: {case.property} ({case.kind}), recorded on {case.target}"
              f" ({case.device or '?'}), {case.created or 'undated'}")
        print(f"target:   {target.spec} (from {origin}), device {device}")
        if case.batch is not None:
            print(f"inputs:   {describe_batch(case.batch)}")
        try:
            machine = import_object(args.machine, "--machine") if case.kind == SERVING_LOOP else None
            outcome = replay_case(case, target, device, properties=properties,
                                  machine_factory=machine)
        except (CaseError, UsageError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            unreplayable = True
            continue
        if outcome.verdict == PASSES:
            print("result:   PASSES now\n")
            continue
        if outcome.verdict == FAILS:
            still_failing = True
            print("result:   STILL FAILS")
        else:
            unreplayable = True
            print("result:   CANNOT REPLAY here")
        print("  " + outcome.report.replace("\n", "\n  ") + "\n")
    if still_failing:
        return EXIT_FAILED
    return EXIT_USAGE if unreplayable else EXIT_OK
