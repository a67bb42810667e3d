"""The ``c128a`` command line.

Each subcommand lives in its own module, which provides
``configure_parser(parser)`` and ``run(args) -> int`` (the exit status).
Those modules must not import kernels at import time: :func:`prepare` chooses
the device first (Triton's interpreter on the CPU), then loads the target.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NoReturn

SUBCOMMANDS = {
    "fuzz": ("c128a.fuzz", "run the property suite and the serving-loop machine for a time"),
    "replay": ("c128a.cases", "rerun one saved failure case and print its diff"),
    "mutants": ("c128a.killmatrix", "run the suite against every mutant; print the kill matrix"),
    "bench": ("c128a.bench", "benchmark the kernel against the baseline (GPU)"),
}


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        metavar="SPEC",
        default=None,
        help="triton (default), reference, vllm, MODULE or MODULE:ATTR; falls back to $C128A_TARGET",
    )
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default=None,
        help="default: CUDA when available, else the CPU under Triton's interpreter",
    )


def prepare(args: argparse.Namespace, spec: str | None = None):
    """Choose the device, then load the target: (device, target, origin)."""
    from .device import DeviceError, use_device
    from .targets import TargetSpecError, TargetUnavailable, load_target, resolve_spec

    try:
        device = use_device(args.device or os.environ.get("C128A_DEVICE") or None)
    except DeviceError as exc:
        usage_error(str(exc))
    spec, origin = resolve_spec(spec if spec is not None else args.target)
    try:
        target = load_target(spec)
    except (TargetSpecError, TargetUnavailable) as exc:
        usage_error(f"{exc} (target from {origin})")
    return device, target, origin


USAGE_ERROR = 2
"""Exit status for bad arguments or set-up; 1 means the target failed a check."""


def usage_error(message: str) -> NoReturn:
    print(f"c128a: {message}", file=sys.stderr)
    raise SystemExit(USAGE_ERROR)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="c128a", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, summary) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        sub = commands.add_parser(name, help=summary, description=summary)
        module.configure_parser(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
