"""What every subcommand shares: the target and device options, resolved in
one place, and one meaning for exit statuses (0 every check held, 1 a target
failed a check, 2 a usage or set-up error)."""

from __future__ import annotations

import argparse
import os

from ..failures import TargetUnavailable, UsageError
from ..targets import DEVICE_ENV, Target, load_target, resolve_spec, use_device
from ..targets.specs import TARGET_ENV


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        metavar="SPEC",
        default=None,
        help=f"triton (default), reference, vllm, MODULE or MODULE:ATTR; falls back to ${TARGET_ENV}",
    )
    add_device_argument(parser)


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default=None,
        help=f"default: ${DEVICE_ENV}, else CUDA when available, else the CPU under "
        "Triton's interpreter",
    )


def choose_device(name: str | None) -> str:
    """The device from ``--device``, else ``$C128A_DEVICE``, else the default;
    prepared (Triton's interpreter on the CPU) before any kernel is imported."""
    return use_device(name or os.environ.get(DEVICE_ENV) or None)


def load(spec: str | None, option: str = "--target") -> tuple[Target, str]:
    """(target, where its spec came from): the option, else ``$C128A_TARGET``,
    else the default; a usage error names the origin."""
    spec, origin = resolve_spec(spec, option)
    try:
        return load_target(spec), origin
    except (UsageError, TargetUnavailable) as exc:
        raise UsageError(f"{exc} (target from {origin})") from exc


def prepare(args: argparse.Namespace) -> tuple[str, Target, str]:
    """Choose the device, then load the target: (device, target, origin)."""
    device = choose_device(args.device)
    target, origin = load(args.target)
    return device, target, origin
