"""``c128a fuzz``: run every property and the serving-loop machine for a time.

Options come from the command line, else the ``[fuzz]`` table of
``--config FILE``, else their defaults; every option can be set either way
(:class:`c128a.runners.fuzz.FuzzOptions`).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import fields

from ..options import add_to_argparse
from ..runners.fuzz import FuzzOptions, load_config_file, resolve, run_fuzz
from ..runners.fuzz.config import CONFIG_TABLE, check_paths, cli_name
from ..runners.fuzz.signals import RunInterrupted, RunSignals
from ..targets import resolve_spec
from .common import add_target_arguments, choose_device, padding_rows_override


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument(
        "--config", metavar="FILE",
        help="TOML file with a [fuzz] table of these options; the command line wins",
    )
    # Each option as FuzzOptions declares it. Their defaults are FuzzConfig's:
    # None here lets the --config file give them.
    for spec in fields(FuzzOptions):
        if "shared" in spec.metadata:
            add_to_argparse(parser, spec.metadata["shared"], unset_is_none=True)
        elif "fuzz" in spec.metadata:
            spec.metadata["fuzz"].add_to(parser, spec.name)


def options_from_args(args: argparse.Namespace, keys: dict[str, str] | None = None) -> FuzzOptions:
    """Each option from the command line, else the config file (``keys``,
    when given, receives the options the file set: their keys as written)."""
    given = FuzzOptions(**{f.name: getattr(args, f.name, None) for f in fields(FuzzOptions)})
    if getattr(args, "config", None):
        return given.over(load_config_file(args.config, keys))
    return given


def option_names(args: argparse.Namespace, keys: dict[str, str]):
    """``name_of(field)`` for the run's messages: an option the command line
    left to the ``--config`` file is named as the file writes it, where the
    user will look for it (``--config F: fuzz.max-examples``)."""

    def name_of(name: str) -> str:
        if getattr(args, name, None) is None and name in keys:
            return f"--config {args.config}: {CONFIG_TABLE}.{keys[name]}"
        return cli_name(name)

    return name_of


def run(args: argparse.Namespace) -> int:
    # The run's deadline counts from here: --minutes bounds the command.
    started = time.monotonic()
    # SIGINT, SIGTERM and SIGHUP are handled from here to the run's end: one
    # during start-up (the target's import takes seconds) is one line.
    with RunSignals() as signals:
        try:
            keys: dict[str, str] = {}
            options = options_from_args(args, keys)
            name_of = option_names(args, keys)
            device = choose_device(options.device)
            # The target is loaded by run_fuzz, in a child process (a target
            # that ends its process at import must not end this one).
            spec, origin = resolve_spec(options.target, name_of("target"))
            variant, _ = padding_rows_override(options.padding_rows)
            config = resolve(options, target=spec, device=device, padding_rows=variant,
                             name_of=name_of)
            check_paths(config, name_of)  # run_fuzz checks them again, naming the CLI's options
            report = run_fuzz(config, signals=signals, started=started, target_origin=origin)
            return int(report["exit_status"])
        except RunInterrupted as stop:
            signals.only_note()
            print(f"c128a fuzz: interrupted by {stop.name} while starting, before any worker "
                  "ran: nothing was fuzzed, no report", file=sys.stderr)
            return 128 + stop.signum
