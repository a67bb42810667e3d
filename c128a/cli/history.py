"""``c128a history``: a compatibility table of a vLLM checkout's revisions.

``c128a history --checkout PATH REV...`` checks each revision with the
property suite, each in a child process of its own with a time limit
(:mod:`c128a.runners.revisions`), and prints one markdown row per revision
as it is made (:mod:`c128a.runners.revision_history`): whether its target loads,
the widths its checks drew W from, the checks passed, failed and not
applicable, and the failing ones. ``--output FILE`` writes the table there
too. Nothing of the checkout is written.

Exit status: 0 when every revision loads and passes every check, 1 when
one fails a check or does not load (its row says why), 2 for a usage error,
130 or 143 after SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..failures import EXIT_FAILED, EXIT_OK, UsageError
from ..runners.revision_history import HEADER, RULE, history, markdown_table, resolved
from ..runners.revisions import select_checks
from .bisect import add_revision_arguments, checked_options, interruptible, say
from .common import choose_device


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("revisions", nargs="+", metavar="REV",
                        help="revisions of the checkout, one row each, in this order")
    add_revision_arguments(parser)
    parser.add_argument("--output", type=Path, default=None, metavar="FILE",
                        help="also write the markdown table to FILE")


def run(args: argparse.Namespace) -> int:
    return interruptible("history", lambda: history_command(args))


def history_command(args: argparse.Namespace) -> int:
    checkout = checked_options(args)
    device = choose_device(args.device)
    checks = select_checks(args.keyword)
    if args.output is not None and args.output.is_dir():
        raise UsageError(f"--output {args.output} is a folder; name a file")
    known = resolved(checkout, args.revisions)
    say(HEADER)
    say(RULE)
    rows = history(checkout, known, checks, device=device, max_examples=args.max_examples,
                   time_limit=args.step_timeout, say=say)
    if args.output is not None:
        try:
            args.output.write_text(markdown_table(rows) + "\n", encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--output {args.output} cannot be written ({exc.strerror or exc})") \
                from exc
    return EXIT_OK if all(row.clean for row in rows) else EXIT_FAILED
