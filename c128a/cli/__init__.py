"""The ``c128a`` command line.

Each subcommand lives in its own module, which provides
``configure_parser(parser)`` and ``run(args) -> int`` (the exit status). The
modules import no kernel at import time: ``run`` chooses the device first
(Triton's interpreter on the CPU), then loads the target, then imports what
runs it. Every subcommand exits 0 when every check held, 1 when a target
failed a check, and 2 for a usage or set-up error (:mod:`c128a.failures`),
which is reported on one line before any work starts where it can be.
"""

from __future__ import annotations

import argparse
import signal
import sys

from ..failures import EXIT_USAGE, HarnessError, UsageError
from ..interrupts import HeldSignals
from . import watched

EXIT_INTERRUPTED = 128 + signal.SIGINT

# Subcommands by name, with their summaries. Their modules import torch, so
# they are imported when the parser is built (:func:`subcommand_modules`),
# inside main's handling of Ctrl-C.
SUBCOMMANDS = {
    "fuzz": "run the property suite and the serving-loop machine for a time",
    "replay": "rerun saved failure cases and print their diffs",
    "mutants": "run the suite against every mutant; print the kill matrix",
    "mutate": "mutate the project's kernels; judge each mutant by the suite; print the score",
    "reach": "draw each property's steps; list the input-space buckets none reached",
    "bench": "benchmark the kernel against the baseline (GPU), or a property's throughput",
    "sanitize": "build steps under compute-sanitizer memcheck and initcheck (GPU)",
    "bisect": "find the first commit of a vLLM checkout at which a check fails",
    "history": "check a vLLM checkout's revisions; one table row per revision",
}


def subcommand_modules() -> dict:
    """Each subcommand's module, by name."""
    from . import bench, bisect, fuzz, history, mutants, mutate, reach, replay, sanitize

    modules = {"fuzz": fuzz, "replay": replay, "mutants": mutants, "mutate": mutate,
               "reach": reach, "bench": bench, "sanitize": sanitize, "bisect": bisect,
               "history": history}
    if set(modules) != set(SUBCOMMANDS):  # a subcommand added to one and not the other
        raise HarnessError(f"subcommands {sorted(SUBCOMMANDS)} have the modules "
                           f"{sorted(modules)}: name each in both")
    return modules


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="c128a", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    modules = subcommand_modules()
    for name, summary in SUBCOMMANDS.items():
        module = modules[name]
        sub = commands.add_parser(name, help=summary, description=summary)
        module.configure_parser(sub)
        sub.set_defaults(run=module.run)
    return parser


class _StartupSignal(BaseException):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_startup_signal(signum: int, frame=None) -> None:
    raise _StartupSignal(signum)


def main(argv: list[str] | None = None) -> int:
    """The command: ``argv`` (None: this process's own arguments). Run as
    the process's command, a replay runs in a forked process whose verdict
    this one holds (:mod:`c128a.cli.watched`): a target that ends the
    process it runs in never ends the command with a status of its choosing."""
    if argv is None and watched.watches(sys.argv[1:]):
        return watched.run_watched(lambda: run_command(None), f"c128a {sys.argv[1]}")
    return run_command(argv)


def run_command(argv: list[str] | None) -> int:
    # SIGTERM or SIGHUP while the subcommands import torch (seconds): one
    # line, as for Ctrl-C, not a silent death by the signal.
    held = HeldSignals(_raise_startup_signal, (signal.SIGTERM, signal.SIGHUP))
    try:
        parser = build_parser()
    except KeyboardInterrupt:
        print("c128a: interrupted (Ctrl-C) while starting", file=sys.stderr)
        return EXIT_INTERRUPTED
    except _StartupSignal as stop:
        print(f"c128a: interrupted by {signal.Signals(stop.signum).name} while starting; "
              "nothing ran", file=sys.stderr)
        return 128 + stop.signum
    finally:
        held.restore()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except UsageError as exc:
        print(f"c128a {args.command}: {exc}", file=sys.stderr)
    except HarnessError as exc:
        print(f"c128a {args.command}: the suite itself failed: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        # Ctrl-C before a subcommand handles SIGINT itself (loading the
        # target, starting workers), or a target raising KeyboardInterrupt:
        # one line and the shell's status for SIGINT, never a traceback.
        print(f"c128a {args.command}: interrupted (Ctrl-C, or KeyboardInterrupt raised by the "
              "target)", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_USAGE
