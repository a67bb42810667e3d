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

from .. import options
from ..options import (
    DEFAULT_CHUNK,
    DEFAULT_DB,
    DEFAULT_EXAMPLE_TIMEOUT_S,
    DEFAULT_FUZZ_PROFILE,
    DEFAULT_MINUTES,
    add_to_argparse,
)
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
    parser.add_argument("--minutes", type=float, metavar="M",
                        help="run for M minutes (fractions allowed); the default without "
                        f"--max-examples is {DEFAULT_MINUTES:g}")
    parser.add_argument("--max-examples", type=int, metavar="N",
                        help="stop after N generated examples in all (shared among the "
                        "workers); the properties' historical steps, run once in each worker, "
                        "and shrinking come on top: the report's totals say how many ran")
    parser.add_argument("--max-tokens", type=int, metavar="N",
                        help="draw engine steps of up to N tokens (more requests, longer "
                        "prefill chunks; default: each property's own size, 32 for most)")
    parser.add_argument("--seed", type=int,
                        help="seed of the whole run (default: random, reported)")
    parser.add_argument(
        "--workers", type=int, metavar="K",
        help="worker processes (default: about one per core, on CUDA shared among the GPUs; "
        "$C128A_WORKERS_PER_GPU sets the share)",
    )
    parser.add_argument("--db", metavar="PATH|redis://HOST:PORT/N",
                        help=f"Hypothesis example database (default {DEFAULT_DB}; 'none' for none)")
    # Their defaults are FuzzConfig's: None here lets the --config file give them.
    add_to_argparse(parser, options.CASES_DIR_OPTION, unset_is_none=True)
    parser.add_argument("--report", metavar="FILE", help="write the JSON report here")
    parser.add_argument("--example-timeout", type=float, metavar="S",
                        help="kill and restart a worker whose example runs longer "
                        f"(default {DEFAULT_EXAMPLE_TIMEOUT_S:g})")
    parser.add_argument("-x", "--exitfirst", action="store_true", default=None,
                        help="stop at the first failure")
    parser.add_argument("--profile",
                        help="Hypothesis profile the rounds derive from "
                        f"(default {DEFAULT_FUZZ_PROFILE})")
    parser.add_argument("--chunk", type=int, metavar="N",
                        help="examples per Hypothesis round before the next property "
                        f"(default {DEFAULT_CHUNK})")
    parser.add_argument("--only", metavar="NAMES", type=_names,
                        help="comma-separated properties to run (serving_loop: the machine)")
    parser.add_argument("--stateful", action=argparse.BooleanOptionalAction, default=None,
                        help="run the serving-loop machine too (default: yes)")
    add_to_argparse(parser, options.PROPERTIES_OPTION, unset_is_none=True)
    add_to_argparse(parser, options.MACHINE_OPTION, unset_is_none=True)
    parser.add_argument("--live", action=argparse.BooleanOptionalAction, default=None,
                        help="live status display (default: when stderr is a terminal)")


def _names(text: str) -> tuple[str, ...]:
    # Empty names are kept: resolve() refuses them, naming the option.
    return tuple(name.strip() for name in text.split(","))


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
